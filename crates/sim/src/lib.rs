//! The deterministic simulator of redoubt.
//!
//! It hosts the unmodified protocol core (replicas and clients) in one thread with virtual
//! time and one seeded RNG. The network drops, duplicates, delays, reorders, corrupts, replays,
//! forges and partitions; replicas crash, restart with no memory, or pause; an adversary
//! controls up to f replicas (lying with their real keys) and any number of clients. After every
//! step the checkers look for divergence; at the end the history of correct clients is checked
//! for linearizability and every correct client must have finished (liveness after heal).
//!
//! It must never depend on wall-clock time or thread scheduling: one seed, one run.

pub mod adversary;
pub mod checker;
pub mod linearizability;
pub mod runner;
pub mod scenario;
pub mod sites;
pub mod throughput;
pub mod world;

pub use scenario::{Behavior, ClientAttack, Scenario};
pub use world::{Outcome, World};
