//! The redoubt overlay daemon (`redoubt overlay --config FILE --id N`): the host that runs one
//! [`redoubt_overlay::Node`] over UDP, one daemon per machine.
//!
//! - **Overlay file** ([`config`]): the nodes with their UDP addresses and key files, the
//!   links, the routing mode (ODSBR or link state) and recovery mode (hop by hop or end to
//!   end), tunnels, and test-only faulty relays.
//! - **Key files** ([`keys`]): `redoubt overlay keygen` deals each node a file with only the
//!   keys of the pairs it belongs to (one key per pair, from a master drawn and forgotten).
//! - **WAN emulation** ([`wan`]): what a daemon sends on a link goes through a bandwidth
//!   bottleneck with a bounded queue, a delay line with jitter, and seeded loss, in user
//!   space, because the kernel here has no netem.
//! - **Connection tunnels** ([`tunnel`], `conns`): a daemon listens on local TCP tunnel
//!   ports, each towards one peer node. Every connection accepted there (a replica dialling a
//!   peer replica, a client dialling a replica) gets a number; the peer's daemon opens one TCP
//!   connection of its own to its replica for it, and the two daemons carry the
//!   length-prefixed frames (redoubt's transport) each end writes, both ways, in their
//!   ordered overlay flows. Closing either end closes the other. Replicas and clients in
//!   overlay mode dial tunnel ports instead of the replicas.
//! - **Faulty relay** ([`faulty`], TEST ONLY): drops a fraction of the packets a node forwards
//!   for others, after its links accepted them, so benchmarks and tests can watch ODSBR find it.
//!
//! # What it must never do
//!
//! Panic or allocate without bound on anything from the network or a tunnel connection
//! (datagrams go to the core, which authenticates and bounds them; frames are bounded by
//! `tunnel_frame_bytes_max`, connections by `tunnel_conns_max` per port and
//! `tunnel_conns_total_max`; every queue has a limit and drops with a counted reason);
//! implement cryptography of its own (keys come from `redoubt_crypto::MacKey::derive`);
//! block the event loop on a socket.
//!
//! # Trust
//!
//! A daemon holds the keys of its own pairs only, so a compromised daemon cannot forge what
//! two other nodes say to each other (ODSBR's acks, link-state updates). The test-only
//! `[overlay] secret_file` gives every daemon every key and is refused beside key files; the
//! daemon warns when it starts with one.

pub mod config;
mod conns;
mod daemon;
pub mod faulty;
pub mod keys;
pub mod metrics;
pub mod tunnel;
pub mod wan;

pub use config::{Emulation, OverlayConfigError, OverlayFile};
pub use conns::TunnelCounters;
pub use daemon::{control_channel, run, spawn, Control, Counters, DaemonError, DaemonHandle};
