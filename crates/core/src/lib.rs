//! The pure protocol core of redoubt: PBFT with the MAC-only view change of BFT-PR.
//!
//! This crate is a set of deterministic state machines: [`Replica`] and [`Client`] take an
//! input (a received frame, a tick, an admin command) together with an [`Env`] (the host's
//! clock reading and fresh random bits) and return [`Effect`]s (frames to send, events to
//! observe). It must never do I/O, read a clock, spawn threads or draw randomness itself: the
//! same code runs in the node runtime and in the seeded simulator, which is what lets us test
//! Byzantine behaviour exhaustively.

mod agreement;
pub mod auth;
pub mod bodies;
pub mod client;
pub mod effect;
mod execution;
pub mod executor;
pub mod filter;
pub mod holder;
pub mod journal;
mod keying;
pub mod keys;
pub mod message;
pub mod preopen;
pub mod prime;
pub mod quorum;
pub mod replica;
pub mod seal;
pub mod service;
pub mod transfer;
pub mod types;
pub mod viewchange;

pub use auth::{Auth, StaticKeys};
pub use client::{Client, ClientTiming, Completion, InvokeError};
pub use effect::{Bytes, Effect, Env, Event, RecoveryReport, ViewChangeCause};
pub use execution::open_state;
pub use executor::{Executor, ExecutorStats};
pub use filter::{Filter, FilterStats, FirewallKeys};
pub use holder::{HolderAnswer, HolderCall};
pub use journal::Record;
pub use keys::{Admitted, Directory, KeyHolder, KeyTable, Keys, LocalHolder, NewKey, SessionKeys};
pub use message::{Message, Reject};
pub use preopen::{preopen, preopen_from, Preopened};
pub use redoubt_state as state;
pub use replica::{Footprint, Input, PrimeFootprint, Replica, Stats, VC_VIEWS_AHEAD};
pub use service::{ExecContext, Service};
pub use transfer::checkpoint_digest_of;
#[cfg(feature = "mutants")]
pub use types::Mutant;
pub use types::{
    ClientId, Config, ExecutorId, FilterId, OrderProtocol, Principal, ReplicaId, Seq, View,
    VIEW_LIMIT,
};
