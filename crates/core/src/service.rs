//! The service trait: what an application implements to be replicated.
//!
//! A service keeps everything that must survive and be replicated in the state the library
//! gives it ([`StateWrite`]): a byte range laid over pages that the library checkpoints,
//! digests incrementally and transfers page by page. Every write goes through the library, so
//! an undeclared write cannot happen. The service may keep in-memory structures derived from
//! the state (indexes, free lists) and rebuilds them in [`Service::load`].

use crate::types::{ClientId, Seq};
use redoubt_state::{StateRead, StateWrite};

/// Deterministic inputs to one execution. The time and seed come from the primary's proposal
/// (validated deterministically), never from a local clock or RNG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecContext {
    pub seq: Seq,
    pub client: ClientId,
    /// Agreed time in ms: monotone across batches (max of the proposal and previous + 1).
    pub time_ms: u64,
    /// The batch's agreed random seed and the request's position in the batch; see
    /// [`ExecContext::seed`].
    pub batch_seed: u64,
    pub index: u64,
}

impl ExecContext {
    /// Agreed per-request random seed, derived from the batch's seed, the sequence number and
    /// the request's position (computed on demand: most operations need none).
    pub fn seed(&self) -> u64 {
        let d = redoubt_crypto::DigestBuilder::new("redoubt.seed.v1")
            .u64(self.batch_seed)
            .u64(self.seq)
            .u64(self.index)
            .finish();
        u64::from_le_bytes(d.0[..8].try_into().expect("8 bytes"))
    }
}

/// A deterministic replicated state machine.
pub trait Service {
    /// Executes an ordered operation. Must be deterministic given the state, `op` and `ctx`:
    /// the same bytes written, the same result returned, on every replica.
    fn execute(&mut self, state: &mut dyn StateWrite, op: &[u8], ctx: &ExecContext) -> Vec<u8>;
    /// Executes an operation without modifying state, or returns `None` if `op` is not a
    /// read-only operation (replicas must verify that, PBFT §5.1).
    fn execute_read_only(&self, state: &dyn StateRead, op: &[u8]) -> Option<Vec<u8>>;
    /// Rebuilds in-memory structures from the state: at start, after a state transfer and
    /// after a rollback. An all-zero state is the initial state. A state that does not
    /// decode is an error (the replica then treats its state as corrupt).
    fn load(&mut self, state: &dyn StateRead) -> Result<(), String>;
}
