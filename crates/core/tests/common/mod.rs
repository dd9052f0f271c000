//! The in-memory test harness shared by the core's integration tests.
//!
//! - [`Cluster`] (`cluster.rs`): n = 3f+1 replicas, each either live (a [`Replica`] driven
//!   through `handle`) or scripted (only its keys: the test speaks for it, as a Byzantine or a
//!   silent replica), and clients, live ([`Client`]) or scripted, with static or session keys.
//!   An explicit network: every frame sent is logged and queued; the test delivers one, some
//!   or all of them, drops them by predicate, blocks links, and advances virtual time.
//! - [`Keyring`] (`keyring.rs`): every principal's key material, kept across restarts.
//! - [`Out`] (`out.rs`): the effects of one step, decoded for assertions.
//! - Message builders (`build.rs`): requests, pre-prepares, votes, view changes, acks...
//! - [`Svc`], [`fresh_state`] and [`fresh_store`]: a small deterministic service over a fresh
//!   in-memory state.
//!
//! Each test file compiles its own copy, and none uses all of it.
#![allow(dead_code, unused_imports)]

mod build;
mod cluster;
mod keyring;
mod out;

pub use build::*;
pub use cluster::*;
pub use keyring::*;
pub use out::*;

use redoubt_core::*;

/// Executions after which [`Svc`] panics: far more than any test performs, so a replica that
/// re-executes in a loop inside one `handle` call fails its test instead of hanging it.
pub const EXECUTIONS_MAX: u64 = 100_000;

/// Appends every operation to the state (8-byte length, then the bytes, wrapping around) and
/// answers with the operation itself. Counts its executions.
#[derive(Default)]
pub struct Svc {
    pub executions: u64,
}

impl Service for Svc {
    fn execute(&mut self, st: &mut dyn state::StateWrite, op: &[u8], _c: &ExecContext) -> Vec<u8> {
        self.executions += 1;
        assert!(
            self.executions <= EXECUTIONS_MAX,
            "{} executions: a replica loops",
            self.executions
        );
        let at = appended(&*st);
        for (i, b) in op.iter().enumerate() {
            st.write(8 + (at + i as u64) % (st.size() - 8), &[*b]);
        }
        st.write(0, &(at + op.len() as u64).to_le_bytes());
        op.to_vec()
    }
    /// Only operations starting with `read:` are read-only; they answer themselves.
    fn execute_read_only(&self, _st: &dyn state::StateRead, op: &[u8]) -> Option<Vec<u8>> {
        op.starts_with(b"read:").then(|| op.to_vec())
    }
    fn load(&mut self, _st: &dyn state::StateRead) -> Result<(), String> {
        Ok(())
    }
}

/// How many operation bytes [`Svc`] appended to `st`.
pub fn appended(st: &dyn state::StateRead) -> u64 {
    let mut len = [0u8; 8];
    st.read(0, &mut len);
    u64::from_le_bytes(len)
}

pub fn fresh_state() -> state::PagedState {
    fresh_store().1
}

/// A fresh in-memory page store and the state over it (the store is the host's handle, to
/// which it writes the replica's `Effect::CommitState`).
pub fn fresh_store() -> (state::MemStore, state::PagedState) {
    let store = state::MemStore::new(state::Geometry::new(256, 16, 4).unwrap());
    let st = open_state(Box::new(store.clone())).unwrap();
    (store, st)
}
