//! Which other replicas this one hears from: when an authenticated message last came from
//! each, since when 2f of them have been heard without a gap, and whether the primary is heard
//! (the replica's timers and relays depend on it; see `Replica::tick`).
//!
//! Bounds: one entry per other replica id below n.

use crate::types::ReplicaId;
use std::collections::BTreeMap;

/// A replica counts as heard for this many status intervals after its last message (every
/// replica sends a STATUS each interval).
pub(crate) const HEARD_STATUSES: u64 = 4;

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Heard {
    at_ms: BTreeMap<ReplicaId, u64>,
    quorum_since_ms: Option<u64>,
    primary_heard: bool,
}

impl Heard {
    /// An authenticated message came from replica `r` at `now` (ms).
    pub(crate) fn note(&mut self, r: ReplicaId, now: u64) {
        self.at_ms.insert(r, now);
    }

    /// Forgets replicas not heard within the last [`HEARD_STATUSES`] status intervals, and
    /// keeps since when `quorum` (2f) others have been heard without a gap. Returns whether
    /// `primary` is heard again after a silence.
    pub(crate) fn tick(
        &mut self,
        now: u64,
        status_interval_ms: u64,
        quorum: usize,
        primary: ReplicaId,
    ) -> bool {
        let recent = now.saturating_sub(status_interval_ms * HEARD_STATUSES);
        self.at_ms.retain(|_, at| *at >= recent);
        if self.at_ms.len() >= quorum {
            self.quorum_since_ms.get_or_insert(now);
        } else {
            self.quorum_since_ms = None;
        }
        let heard = self.at_ms.contains_key(&primary);
        !std::mem::replace(&mut self.primary_heard, heard) && heard
    }

    /// Since when the quorum has been heard without a gap (ms), if it is.
    pub(crate) fn quorum_since_ms(&self) -> Option<u64> {
        self.quorum_since_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorum_is_heard_without_a_gap_and_a_returning_primary_is_noticed() {
        let mut h = Heard::default();
        h.note(1, 0);
        h.note(2, 0);
        assert!(
            h.tick(10, 100, 2, 1),
            "the primary heard for the first time"
        );
        assert_eq!(h.quorum_since_ms(), Some(10));
        assert!(!h.tick(20, 100, 2, 1), "still heard: nothing new");
        assert_eq!(h.quorum_since_ms(), Some(10), "no gap: the start stays");
        // Silence beyond four status intervals: both forgotten.
        assert!(!h.tick(401, 100, 2, 1));
        assert_eq!(h.quorum_since_ms(), None);
        assert!(h.at_ms.is_empty());
        h.note(1, 450);
        h.note(2, 450);
        assert!(h.tick(460, 100, 2, 1), "heard again after the silence");
        assert_eq!(h.quorum_since_ms(), Some(460));
    }
}
