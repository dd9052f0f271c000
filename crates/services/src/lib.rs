//! Replicated application services for redoubt.
//!
//! [`hosted::Hosted`] is the one `redoubt replica` runs, chosen by the cluster file.
//!
//! Each service here implements [`redoubt_core::Service`]: a state machine that every correct
//! replica executes on the same agreed sequence of operations. Replicas only stay consistent if
//! execution is a pure function of the current state, the operation bytes and the agreed
//! [`redoubt_core::ExecContext`]. Code in this crate must therefore never do I/O, read a clock,
//! draw randomness, spawn threads, depend on hash-map iteration order or on anything else that
//! may differ between replicas; and it must never panic on malformed input (a Byzantine client
//! can submit arbitrary bytes): malformed operations yield an error *result*, malformed
//! snapshots an `Err`. Encodings (results and snapshots) are canonical, so correct replicas
//! produce byte-identical replies and checkpoint digests.
//!
//! Each service's typed client (the operations an application calls) is in the client library,
//! `redoubt_client::{kv, sql, files}`, so that this crate links no network code.

pub mod files;
pub mod hosted;
pub mod kv;
pub mod pagedkv;
pub mod sql;
