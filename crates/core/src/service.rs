//! The service trait: what an application implements to be replicated.

use crate::types::{ClientId, Seq};

/// Deterministic inputs to one execution. The time and seed come from the primary's proposal
/// (validated deterministically), never from a local clock or RNG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecContext {
    pub seq: Seq,
    pub client: ClientId,
    /// Agreed time in ms: monotone across batches (max of the proposal and previous + 1).
    pub time_ms: u64,
    /// Agreed per-request random seed.
    pub seed: u64,
}

/// A deterministic replicated state machine.
pub trait Service {
    /// Executes an ordered operation. Must be deterministic given the state, `op` and `ctx`.
    fn execute(&mut self, op: &[u8], ctx: &ExecContext) -> Vec<u8>;
    /// Executes an operation without modifying state, or returns `None` if `op` is not a
    /// read-only operation (replicas must verify that, PBFT §5.1).
    fn execute_read_only(&self, op: &[u8]) -> Option<Vec<u8>>;
    /// Deterministic encoding of the whole state (checkpoints and state transfer).
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state by a snapshot produced by [`Service::snapshot`].
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
}
