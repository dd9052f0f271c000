//! The redoubt node: everything a replica process needs around the pure protocol core.
//!
//! - [`init`]: generating a cluster (`redoubt init`); the cluster file itself is
//!   `redoubt-config`;
//! - [`holder`]: serving a replica's key holder (`redoubt-keyholder`) from this process;
//! - [`storage`]: the durable journal (group-committed before sends);
//! - `host`: the one event loop on tokio that every node process runs;
//! - [`runtime`]: the replica process (`redoubt replica`);
//! - [`executor`]: the execution node process (`redoubt executor`, separated deployment);
//! - [`filter`]: the filter node process (`redoubt filter`, firewall deployment);
//! - [`metrics`] and [`status`]: Prometheus metrics and the JSON status over HTTP;
//! - [`snapshot`]: a stable checkpoint's state in one file (backups, new clusters from it);
//! - [`logging`]: human or JSON logs.
//!
//! The protocol logic itself lives in `redoubt-core`; this crate must never decide anything the
//! protocol decides, only carry bytes, time and durability to and from it.

pub mod baseline;
mod endpoints;
pub mod executor;
pub mod filter;
pub mod holder;
mod host;
pub mod init;
pub mod logging;
pub mod metrics;
pub mod runtime;
pub mod snapshot;
pub mod status;
pub mod storage;
pub mod tamper;

pub use executor::run_executor;
pub use filter::run_filter;
pub use runtime::{run_replica, run_replica_with, NodeError};
pub use tamper::{Direct, Hooks, Interposer, Outgoing, Tamper, Timed};
