//! The redoubt overlay network: the pure protocol core of an intrusion-tolerant overlay, and a
//! seeded simulator that attacks it.
//!
//! It implements two papers of Amir's 2004 DARPA report (our notes: `spec/darpa.md` §2, §3):
//! - **Spines** (Amir, Danilov, DSN 2003): overlay links with hop-by-hop reliability (selective
//!   repeat, out-of-order forwarding, reordering only at the destination), a hello protocol
//!   measuring round trip and loss, link-state routing, end-to-end flows with ordered or
//!   unordered delivery, and for comparison an end-to-end-recovery mode;
//! - **ODSBR** (Awerbuch, Holmer, Nita-Rotaru, Rubens, WiSe 2002): source routing with
//!   authenticated destination acks, a per-path loss threshold, adaptive probing whose binary
//!   search localises a fault to one link, and link weights that double on accusation and
//!   recover with good traffic, so routes avoid links that lose packets (a link convicted
//!   again waits four times longer than the last time; see the `odsbr` module's differences
//!   from the paper).
//!
//! # How a host drives a node
//!
//! A [`Node`] is a deterministic state machine: [`Node::step`] takes an [`Input`] and returns
//! [`Effect`]s. The host (the daemon, or [`sim`]) does all I/O:
//! - build it with [`Node::new`]: the shared [`Config`], its id, its configured neighbours,
//!   one pairwise [`redoubt_crypto::MacKey`] per other node (the node derives purpose keys from
//!   each: link MACs, end-to-end MACs, per-hop MACs, ack MACs, link-state authenticators), its
//!   incarnation number and the time;
//! - give it every datagram received from a neighbour as [`Input::Receive`], and send every
//!   [`Effect::Send`] to the named neighbour (one datagram each, e.g. UDP);
//! - time is an input: every input carries `now_ms`; the host delivers [`Input::Tick`] at or
//!   after [`Node::next_deadline_ms`] (the node has no timers of its own);
//! - the local application submits with [`Input::Submit`] (answered by [`Effect::Accepted`]
//!   with the message's sequence number, or [`Effect::Rejected`]) and receives
//!   [`Effect::Deliver`];
//! - [`Effect::Event`] reports links going up or down, route changes, probes and accusations;
//!   [`Node::stats`] counts everything, every discard with its [`DropReason`].
//!
//! Emulating wide-area links (delay, loss, bandwidth) is the host's business, not the core's.
//!
//! # What it must never do
//!
//! Perform I/O, read a clock, spawn threads or draw randomness; panic, or allocate without
//! bound, on anything that arrives from the network (every datagram is size-checked,
//! authenticated, then bounds-checked, and refused with a counted reason); deliver a message
//! its source did not send, deliver one twice, or deliver an ordered flow out of order.
//!
//! # Fault model
//!
//! Link-state mode is Spines': benign faults (loss, crashes), every node trusted. ODSBR mode
//! tolerates Byzantine intermediate nodes, alone or colluding: as long as a fault-free path
//! joins two correct nodes they communicate, and when τ is above the benign loss rate and the
//! per-hop bound above the benign round trip, every accused link has a faulty end (ODSBR
//! accuses links, never nodes).
//!
//! # Simulation
//!
//! [`sim`] runs seeded networks of nodes with lossy, duplicating, reordering links and faulty
//! nodes, and checks integrity, no duplicates, per-flow order, eventual delivery and the
//! accusation guarantees. The hand-run sweep:
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-ovl cargo run --release -p redoubt-overlay \
//!     --bin redoubt-overlay-sim -- --seeds 10000 --jobs 1
//! ```
//!
//! `--start-seed S` picks the first seed, `--seed S --verbose --trace` replays one with its
//! protocol events, `--mutant NAME` runs a deliberately broken variant ([`Mutant`]) to show the
//! checkers catch it, `--chain-bench` compares hop-by-hop with end-to-end recovery on the
//! report's A-F chain, and `--byzantine-bench [--alt-latency-ms M]` runs the routing
//! experiment of `redoubt bench overlay` (a relay that starts dropping 30% of what it
//! forwards) with `--verbose` listing the source's probes, accusations and route changes.
//!
//! # Simplifications (deliberate, documented where they live)
//!
//! No congestion control: a link's window is a fixed bound and the daemon may pace. The
//! destination acks every packet (ODSBR needs per-packet acks; Spines' "four per window" is an
//! optimisation). ODSBR routes over the link-state topology instead of flooding signed
//! requests, and authenticates probe lists and acks with MACs instead of onion encryption
//! (see the `odsbr` module).

pub mod config;
mod datapath;
mod flows;
mod keys;
mod link;
mod node;
mod odsbr;
mod queue;
mod routing;
pub mod sim;
pub mod stats;
pub mod types;
pub mod wire;

pub use config::{Config, ConfigError, Mutant, Recovery, RoutingMode};
pub use keys::{key_map_for_tests, link_key, pairwise_key_for_tests};
pub use node::{Effect, Event, Input, LinkStatus, Node, SubmitError};
pub use stats::{DropReason, Stats};
pub use types::{Delivery, LinkId, NodeId};
