//! The redoubt overlay daemon (`redoubt overlay --config FILE --id N`): the host that runs one
//! [`redoubt_overlay::Node`] over UDP, one daemon per machine.
//!
//! - **Overlay file** ([`config`]): the nodes and their UDP addresses, the links, the routing
//!   mode (ODSBR or link state) and recovery mode (hop by hop or end to end), a shared secret
//!   from which each pair of nodes derives its key, replica tunnels, and test-only faulty
//!   relays.
//! - **WAN emulation** ([`wan`]): what a daemon sends on a link goes through a bandwidth
//!   bottleneck with a bounded queue, a delay line with jitter, and seeded loss, in user
//!   space, because the kernel here has no netem.
//! - **Frame tunnels** ([`tunnel`]): for each remote replica the daemon offers a local TCP
//!   port that takes length-prefixed frames (redoubt's replica-to-replica transport) and
//!   carries them in the ordered overlay flow to that replica's daemon, which writes them to
//!   its replica over one TCP connection per source. A replica in overlay mode dials the
//!   tunnel port instead of the peer.
//! - **Faulty relay** ([`faulty`], TEST ONLY): drops a fraction of the packets a node forwards
//!   for others, after its links accepted them, so benchmarks and tests can watch ODSBR find it.
//!
//! # What it must never do
//!
//! Panic or allocate without bound on anything from the network or a tunnel connection
//! (datagrams go to the core, which authenticates and bounds them; frames are bounded by
//! `tunnel_frame_bytes_max`; every queue has a limit and drops with a counted reason);
//! implement cryptography of its own (keys come from `redoubt_crypto::MacKey::derive`);
//! block the event loop on a socket.
//!
//! # Trust
//!
//! One shared secret file makes every pairwise key, so a daemon that holds it can derive the
//! keys of pairs it is not part of: it protects the overlay against outsiders, not against a
//! compromised daemon forging another node's acks. Distributing one key per pair is left to
//! do (docs/configuration.md says so).

pub mod config;
mod daemon;
pub mod faulty;
pub mod tunnel;
pub mod wan;

pub use config::{Emulation, OverlayConfigError, OverlayFile};
pub use daemon::{run, spawn, Control, Counters, DaemonError, DaemonHandle};
