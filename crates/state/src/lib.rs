//! Partitioned service state (PBFT §6.3-6.4, BFT-PR §4.6.2).
//!
//! The state is a sequence of fixed-size pages under a tree of meta-data partitions. Services
//! see a flat byte range ([`StateRead`], [`StateWrite`]); the library tracks which pages each
//! write touches, keeps one copy-on-write logical copy of the tree per checkpoint, updates
//! digests in time proportional to the pages modified, and serves and installs pages and
//! meta-data for state transfer.

mod access;
mod cache;

pub use access::{FlatState, StateRead, StateWrite};
pub use cache::DEFAULT_PAGE_CACHE_BYTES;
mod file;
mod geometry;
mod store;
mod tree;

pub use file::FileStore;
pub use geometry::{Geometry, DEFAULT_FANOUT, DEFAULT_PAGE_SIZE};
pub use store::{Base, CommitPage, Entry, MemStore, PageStore, StateCommit};
pub use tree::{
    meta_digest, page_digest, root_of, CheckReport, NodeId, PagedState, StateFootprint, INVALID,
};
