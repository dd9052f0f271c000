//! A replicated counter: the smallest complete service hosted by redoubt, written as a user of
//! the library would write one (see `docs/writing-a-service.md`).
//!
//! - [`CounterOp`] and [`CounterResult`]: what a client sends and what it gets back, as
//!   canonical postcard bytes;
//! - [`CounterService`]: the deterministic state machine every replica runs
//!   ([`redoubt_core::Service`]), keeping the counter in the replicated, paged state;
//! - [`CounterClient`]: the typed client over [`redoubt_client::Client`];
//! - the `counter` binary (`src/main.rs`): a replica hosting the service, and a command-line
//!   client, both reading an ordinary cluster file written by `redoubt init`.

mod client;

pub use client::{CounterClient, CounterError};

use redoubt_core::state::{StateRead, StateWrite};
use redoubt_core::{ExecContext, Service};
use serde::{Deserialize, Serialize};

/// An operation on the counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CounterOp {
    /// Adds one.
    Increment,
    /// Adds `n`; refused (state unchanged) if the counter would overflow.
    Add(u64),
    /// Reads the counter (read-only: it may be answered without being ordered).
    Get,
}

/// What an operation returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CounterResult {
    /// The counter after the operation.
    Value(Counter),
    /// The operation was refused (undecodable, or an overflow); the state is unchanged.
    Refused(String),
}

/// The counter as the state holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// The count.
    pub value: u64,
    /// Updates applied (increments and adds).
    pub updates: u64,
    /// The agreed time of the last update (ms since the UNIX epoch; 0: never updated).
    pub updated_at_ms: u64,
}

impl CounterOp {
    /// The canonical encoding: the bytes a client sends.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("encoding into a Vec cannot fail")
    }

    /// Decodes an operation; anything but exactly one encoded operation is an error.
    pub fn decode(bytes: &[u8]) -> Result<CounterOp, String> {
        decode_exact(bytes)
    }

    /// Whether the operation leaves the state unchanged.
    pub fn is_read_only(&self) -> bool {
        matches!(self, CounterOp::Get)
    }
}

impl CounterResult {
    /// The canonical encoding: every correct replica returns the same bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("encoding into a Vec cannot fail")
    }

    /// Decodes a result; anything but exactly one encoded result is an error.
    pub fn decode(bytes: &[u8]) -> Result<CounterResult, String> {
        decode_exact(bytes)
    }
}

fn decode_exact<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} trailing bytes", rest.len()));
    }
    Ok(value)
}

/// Where the counter lives in the state: three little-endian `u64`s at the start of the first
/// page (value, updates, agreed time of the last update). An all-zero state is a counter at 0
/// that was never updated, which is what a new replica starts from.
const COUNTER_AT: u64 = 0;
/// Bytes of the counter in the state.
const COUNTER_BYTES: usize = 24;

fn read_counter(state: &dyn StateRead) -> Counter {
    let mut b = [0u8; COUNTER_BYTES];
    state.read(COUNTER_AT, &mut b);
    let word = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    Counter {
        value: word(0),
        updates: word(1),
        updated_at_ms: word(2),
    }
}

fn write_counter(state: &mut dyn StateWrite, c: &Counter) {
    let mut b = [0u8; COUNTER_BYTES];
    for (i, word) in [c.value, c.updates, c.updated_at_ms]
        .into_iter()
        .enumerate()
    {
        b[8 * i..8 * i + 8].copy_from_slice(&word.to_le_bytes());
    }
    state.write(COUNTER_AT, &b);
}

/// The replicated counter. It keeps nothing in memory: the counter is read from the state on
/// every operation, so checkpoints, state transfer and recovery cover all of it.
#[derive(Clone, Debug, Default)]
pub struct CounterService;

impl CounterService {
    pub fn new() -> Self {
        CounterService
    }
}

impl Service for CounterService {
    fn execute(&mut self, state: &mut dyn StateWrite, op: &[u8], ctx: &ExecContext) -> Vec<u8> {
        let op = match CounterOp::decode(op) {
            Ok(op) => op,
            // A Byzantine client may send any bytes: refuse them with a result, never panic.
            Err(e) => {
                return CounterResult::Refused(format!("undecodable operation: {e}")).encode()
            }
        };
        let mut c = read_counter(state);
        let by = match op {
            CounterOp::Increment => 1,
            CounterOp::Add(n) => n,
            // An ordered read (the client's fallback when the read-only path did not agree).
            CounterOp::Get => return CounterResult::Value(c).encode(),
        };
        let Some(value) = c.value.checked_add(by) else {
            return CounterResult::Refused(format!("adding {by} to {} overflows", c.value))
                .encode();
        };
        c = Counter {
            value,
            updates: c.updates.wrapping_add(1),
            // The agreed time of the batch, identical on every replica: never the local clock.
            updated_at_ms: ctx.time_ms,
        };
        write_counter(state, &c);
        CounterResult::Value(c).encode()
    }

    fn execute_read_only(&self, state: &dyn StateRead, op: &[u8]) -> Option<Vec<u8>> {
        match CounterOp::decode(op) {
            Ok(CounterOp::Get) => Some(CounterResult::Value(read_counter(state)).encode()),
            // Not a read-only operation: the replica refuses to answer it unordered.
            _ => None,
        }
    }

    fn load(&mut self, state: &dyn StateRead) -> Result<(), String> {
        // Nothing to rebuild (a service with in-memory indexes rebuilds them here), but a state
        // too small for the counter cannot be used.
        if state.size() < COUNTER_AT + COUNTER_BYTES as u64 {
            return Err(format!(
                "the state has {} bytes; the counter needs {COUNTER_BYTES}",
                state.size()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_core::state::FlatState;

    fn ctx(seq: u64, time_ms: u64) -> ExecContext {
        ExecContext {
            seq,
            client: 1,
            time_ms,
            batch_seed: seq,
            index: 0,
        }
    }

    fn run(svc: &mut CounterService, st: &mut FlatState, op: CounterOp, t: u64) -> CounterResult {
        CounterResult::decode(&svc.execute(st, &op.encode(), &ctx(t, t))).unwrap()
    }

    #[test]
    fn counts_in_the_state() {
        let mut st = FlatState::new(4096);
        let mut svc = CounterService::new();
        svc.load(&st).unwrap();
        assert_eq!(
            run(&mut svc, &mut st, CounterOp::Get, 1),
            CounterResult::Value(Counter::default())
        );
        run(&mut svc, &mut st, CounterOp::Increment, 2);
        let after = run(&mut svc, &mut st, CounterOp::Add(41), 3);
        let expected = Counter {
            value: 42,
            updates: 2,
            updated_at_ms: 3,
        };
        assert_eq!(after, CounterResult::Value(expected));
        // The state alone holds the counter: a fresh service over it reads the same.
        let read = CounterService::new().execute_read_only(&st, &CounterOp::Get.encode());
        assert_eq!(read, Some(CounterResult::Value(expected).encode()));
        assert_eq!(&st.bytes()[..8], &42u64.to_le_bytes());
    }

    #[test]
    fn refusals_leave_the_state_alone() {
        let mut st = FlatState::new(4096);
        let mut svc = CounterService::new();
        run(&mut svc, &mut st, CounterOp::Add(u64::MAX), 1);
        let before = st.clone();
        assert!(matches!(
            run(&mut svc, &mut st, CounterOp::Increment, 2),
            CounterResult::Refused(m) if m.contains("overflows")
        ));
        for garbage in [&[][..], &[7, 7, 7], &[0, 0]] {
            let r = CounterResult::decode(&svc.execute(&mut st, garbage, &ctx(3, 3))).unwrap();
            assert!(matches!(r, CounterResult::Refused(_)), "{garbage:?}");
        }
        assert_eq!(st, before);
        // Only Get may go the read-only way.
        assert_eq!(
            svc.execute_read_only(&st, &CounterOp::Increment.encode()),
            None
        );
        assert_eq!(svc.execute_read_only(&st, &[9]), None);
        assert!(svc.load(&FlatState::new(16)).is_err());
    }
}
