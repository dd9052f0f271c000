//! Length-prefixed frames over TCP: how redoubt replicas talk to each other and how clients
//! talk to replicas.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes ([`read_frame`],
//! [`write_frame`]). On top of that:
//!
//! - [`Link`] dials one address and keeps a connection to it forever, reconnecting with
//!   exponential jittered back-off. Senders queue frames without ever blocking.
//! - [`Listener`] accepts connections, delivers each received frame tagged with its
//!   [`ConnId`], and lets the owner answer on (or close) a given connection.
//!
//! The transport knows nothing about the protocol: it moves opaque frames, and the protocol
//! core authenticates them. Two rules hold throughout, because every byte that arrives may come
//! from an attacker:
//!
//! - **It never panics on network input.** A length prefix is checked against the configured
//!   maximum before anything is allocated; an oversized frame closes that connection (counted,
//!   and logged at `warn` with the reason); broken connections are simply closed.
//! - **Every queue is bounded.** Outgoing queues, bounded in frames and in bytes, drop new
//!   frames when full (the protocol retransmits, so a drop costs latency, never safety);
//!   inbound channels drop and count when the consumer falls behind; a listener refuses
//!   connections beyond its maximum.
//!
//! Everything here must run inside a tokio runtime.

mod budget;
mod frame;
mod link;
mod listener;
mod outbox;

pub use budget::{ByteBudget, Charge};
pub use frame::{read_buffered_frame, read_frame, write_frame, FrameError, LEN_PREFIX_BYTES};
pub use link::{Inbound, Link, LinkConfig, LinkStats};
pub use listener::{ConnId, ConnInbound, ConnSender, Listener, ListenerConfig, ListenerStats};

use std::time::Duration;

/// The bytes of one frame, shared by the queues that carry it (a broadcast queues one frame
/// for every peer without copying it). The transport depends on no other crate of redoubt;
/// this is the same type as `redoubt_core::Bytes`, so the protocol core's frames go to links
/// and listeners as they are.
pub type Bytes = std::sync::Arc<Vec<u8>>;

/// Why a frame was not queued. The frame is dropped in every case.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The outgoing queue is full (the peer is slow or unreachable).
    #[error("outgoing queue full; frame dropped")]
    Full,
    /// The frame is larger than the configured maximum (the peer would refuse it).
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// The link or listener was closed.
    #[error("closed")]
    Closed,
    /// The listener has no open connection with that id.
    #[error("no such connection")]
    UnknownConn,
}

/// A delay drawn uniformly from `[d/2, d]`, so that peers that lost a connection at the same
/// moment do not all come back at the same moment.
fn jittered(d: Duration) -> Duration {
    let half = d / 2;
    let span = (d - half).as_micros() as u64;
    half + Duration::from_micros(rand::random::<u64>() % (span + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        for ms in [0u64, 1, 50, 2000] {
            let d = Duration::from_millis(ms);
            for _ in 0..100 {
                let j = jittered(d);
                assert!(j >= d / 2 && j <= d, "{j:?} for {d:?}");
            }
        }
    }
}
