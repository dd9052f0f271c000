//! Partitioned service state (PBFT §6.3-6.4, BFT-PR §4.6.2).
//!
//! The state is a sequence of fixed-size pages under a tree of meta-data partitions. Services
//! see a flat byte range ([`StateRead`], [`StateWrite`]); the library tracks which pages each
//! write touches, keeps one copy-on-write logical copy of the tree per checkpoint, updates
//! digests in time proportional to the pages modified, and serves and installs pages and
//! meta-data for state transfer.

mod access;

pub use access::{FlatState, StateRead, StateWrite};
