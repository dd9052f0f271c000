//! Prime's bounded delay, observed (`--bounded-delay`; spec prime.md §1, BOUNDED-DELAY):
//! "the latency of any update introduced by a stable server is bounded". The probe notes when
//! a correct replica first receives each update of a correct client (the earliest it can
//! introduce it) and when f+1 correct replicas have executed it (enough for the client's
//! reply certificate). The client's own legs are outside the promise: a request lost on its
//! way to the one server it was sent to, or the replies lost on their way back, cost the
//! client a retransmission timeout whatever the ordering protocol does. Read-only requests
//! are not updates (an ordered read after a failed fast read is, under its new timestamp).

use super::*;
use redoubt_core::message::ClientMessage;

/// One update's way through the replicas.
#[derive(Clone, Copy, Debug)]
struct Update {
    /// When a correct replica first received it from its client.
    received_ms: u64,
    /// Correct replicas that executed it so far.
    executed_by: u32,
    /// When the (f+1)-th did.
    executed_ms: Option<u64>,
}

/// Updates of correct clients, by (client, timestamp).
#[derive(Default)]
pub(super) struct DelayProbe {
    updates: BTreeMap<(ClientId, u64), Update>,
}

impl DelayProbe {
    /// A correct replica was delivered `bytes` from client `c`.
    pub(super) fn received(&mut self, now: u64, c: ClientId, bytes: &[u8]) {
        let Ok(f) = decode_frame(bytes, usize::MAX) else {
            return;
        };
        let Ok(Message::Client(ClientMessage::Request(sr))) = decode_body(&f.body) else {
            return;
        };
        let r = &sr.request;
        if r.client != c || r.read_only {
            return;
        }
        self.updates.entry((c, r.timestamp)).or_insert(Update {
            received_ms: now,
            executed_by: 0,
            executed_ms: None,
        });
    }

    /// A correct replica executed `requests`; `weak` is f+1.
    pub(super) fn executed(&mut self, now: u64, requests: &[(ClientId, u64)], weak: u32) {
        for key in requests {
            if let Some(u) = self.updates.get_mut(key) {
                u.executed_by += 1;
                if u.executed_by == weak {
                    u.executed_ms = Some(now);
                }
            }
        }
    }

    /// The slowest update first received at or after `stable`: (latency, client, received).
    pub(super) fn slowest_since(&self, stable: u64) -> Option<(u64, ClientId, u64)> {
        self.updates
            .iter()
            .filter(|(_, u)| u.received_ms >= stable)
            .filter_map(|((c, _), u)| {
                u.executed_ms
                    .map(|e| (e.saturating_sub(u.received_ms), *c, u.received_ms))
            })
            .max()
    }
}
