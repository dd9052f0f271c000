//! The log of slots (PBFT §4.2): for each sequence number of the current view inside the
//! window (h, h + L], the pre-prepare this replica accepted, the PREPAREs and COMMITs it
//! received, and what it sent. A slot is prepared once it holds the primary's pre-prepare and
//! 2f matching PREPAREs of backups that together vouch for every request
//! ([`crate::quorum::prepared`]), committed once prepared with 2f+1 matching COMMITs.
//!
//! Bounds: the replica creates a slot only for a sequence number inside its window (checked
//! by `check_invariants`), and each slot holds at most one vote per replica and kind.

use crate::message::Beside;
use crate::quorum;
use crate::types::{ReplicaId, Seq};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Debug, Default)]
pub(crate) struct Slot {
    /// Digest of the accepted pre-prepare (or the NEW-VIEW selection) in the current view.
    pub(crate) pp: Option<Digest>,
    /// True if this replica proposed the slot itself as primary in normal operation.
    pub(crate) proposed_here: bool,
    /// The requests its pre-prepare named beside it (set when proposed here, and only if
    /// there were any), so a retransmission is as lean as the original.
    pub(crate) beside: Option<Arc<Vec<Beside>>>,
    pub(crate) prepares: BTreeMap<ReplicaId, Digest>,
    /// Per backup whose PREPARE doubts some of the batch's requests, their positions (ours
    /// included; see `Prepare::doubts`).
    pub(crate) doubts: BTreeMap<ReplicaId, Vec<u16>>,
    pub(crate) commits: BTreeMap<ReplicaId, Digest>,
    pub(crate) sent_prepare: bool,
    pub(crate) sent_commit: bool,
    pub(crate) prepared: bool,
    pub(crate) committed: bool,
}

impl Slot {
    /// Whether replica `me` vouched for every request of the slot's batch in its PREPARE.
    pub(crate) fn vouched_by(&self, me: ReplicaId) -> bool {
        self.sent_prepare && !self.doubts.contains_key(&me)
    }

    /// Moves the slot through prepared and committed on the votes it holds, at replica `me`
    /// in a view led by `primary`. When it prepares, `me`'s COMMIT is recorded and its digest
    /// returned, once, for the caller to send. Each request needs `vouchers` backup vouchers
    /// (2f; see [`quorum::prepared`]); `ignore_doubts` is the mutant that counts doubting
    /// PREPAREs as vouching.
    pub(crate) fn advance(
        &mut self,
        me: ReplicaId,
        f: u32,
        primary: ReplicaId,
        commit_quorum: usize,
        (vouchers, ignore_doubts): (usize, bool),
    ) -> Option<Digest> {
        let none = BTreeMap::new();
        let doubts = if ignore_doubts { &none } else { &self.doubts };
        if !self.prepared
            && quorum::prepared_vouched(
                f,
                vouchers,
                primary,
                self.pp.as_ref(),
                &self.prepares,
                doubts,
            )
        {
            self.prepared = true;
        }
        let mut send_commit = None;
        if self.prepared && !self.sent_commit {
            self.sent_commit = true;
            let d = self.pp.expect("prepared implies pre-prepared");
            self.commits.insert(me, d);
            send_commit = Some(d);
        }
        if !self.committed
            && quorum::committed_local(
                commit_quorum,
                self.prepared,
                self.pp.as_ref(),
                &self.commits,
            )
        {
            self.committed = true;
        }
        send_commit
    }
}

/// The slots of the current view, by sequence number.
#[derive(Clone, Debug, Default)]
pub(crate) struct SlotLog {
    slots: BTreeMap<Seq, Slot>,
}

impl SlotLog {
    pub(crate) fn get(&self, n: &Seq) -> Option<&Slot> {
        self.slots.get(n)
    }

    pub(crate) fn get_mut(&mut self, n: &Seq) -> Option<&mut Slot> {
        self.slots.get_mut(n)
    }

    pub(crate) fn contains_key(&self, n: &Seq) -> bool {
        self.slots.contains_key(n)
    }

    /// Slot `n`, empty if new (the caller checked `n` against the window).
    pub(crate) fn slot(&mut self, n: Seq) -> &mut Slot {
        self.slots.entry(n).or_default()
    }

    pub(crate) fn iter(&self) -> std::collections::btree_map::Iter<'_, Seq, Slot> {
        self.slots.iter()
    }

    pub(crate) fn iter_mut(&mut self) -> std::collections::btree_map::IterMut<'_, Seq, Slot> {
        self.slots.iter_mut()
    }

    /// The slots from sequence number `from` up.
    pub(crate) fn from(&self, from: Seq) -> std::collections::btree_map::Range<'_, Seq, Slot> {
        self.slots.range(from..)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Slot> {
        self.slots.values()
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut Slot> {
        self.slots.values_mut()
    }

    pub(crate) fn keys(&self) -> impl DoubleEndedIterator<Item = &Seq> {
        self.slots.keys()
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Forgets every slot (a view change, a recovery).
    pub(crate) fn clear(&mut self) {
        self.slots.clear();
    }

    pub(crate) fn retain(&mut self, keep: impl FnMut(&Seq, &mut Slot) -> bool) {
        self.slots.retain(keep);
    }

    /// Forgets the slots at or below `h` (the low watermark moved to `h`).
    pub(crate) fn forget_through(&mut self, h: Seq) {
        self.slots = self.slots.split_off(&(h + 1));
    }

    /// Slots only in the window (`lo`, `hi`], votes only from the `n` replicas, and a slot
    /// committed only if prepared, prepared only with a pre-prepare.
    pub(crate) fn check_invariants(&self, lo: Seq, hi: Seq, n: u32) -> Result<(), String> {
        for (s, slot) in &self.slots {
            if *s <= lo || *s > hi {
                return Err(format!("slot n{s} outside the window ({lo}, {hi}]"));
            }
            if slot.committed && !slot.prepared {
                return Err(format!("slot n{s} committed without being prepared"));
            }
            if slot.prepared && slot.pp.is_none() {
                return Err(format!("slot n{s} prepared without a pre-prepare"));
            }
            let voters = slot
                .prepares
                .keys()
                .chain(slot.commits.keys())
                .chain(slot.doubts.keys());
            if let Some(r) = voters.into_iter().find(|r| **r >= n) {
                return Err(format!("slot n{s} holds a vote of replica {r} (n = {n})"));
            }
        }
        Ok(())
    }
}

impl<'a> IntoIterator for &'a SlotLog {
    type Item = (&'a Seq, &'a Slot);
    type IntoIter = std::collections::btree_map::Iter<'a, Seq, Slot>;

    fn into_iter(self) -> Self::IntoIter {
        self.slots.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(b: u8) -> Digest {
        Digest([b; 32])
    }

    /// f = 1, primary 0, this replica 1, commit quorum 3.
    fn advance(s: &mut Slot) -> Option<Digest> {
        s.advance(1, 1, 0, 3, (2, false))
    }

    #[test]
    fn prepares_on_2f_matching_backups_then_commits_on_2f_plus_1() {
        let mut s = Slot {
            pp: Some(d(7)),
            ..Slot::default()
        };
        s.prepares.insert(0, d(7)); // the primary's never counts
        s.prepares.insert(1, d(7));
        assert_eq!(advance(&mut s), None);
        assert!(!s.prepared);
        s.prepares.insert(2, d(7));
        assert_eq!(advance(&mut s), Some(d(7)), "our COMMIT goes out once");
        assert!(s.prepared && !s.committed);
        assert_eq!(advance(&mut s), None);
        s.commits.insert(2, d(7));
        s.commits.insert(3, d(9)); // does not match
        advance(&mut s);
        assert!(!s.committed);
        s.commits.insert(0, d(7));
        advance(&mut s);
        assert!(s.committed);
    }

    #[test]
    fn doubts_hold_a_slot_back_unless_the_mutant_ignores_them() {
        let mut s = Slot {
            pp: Some(d(7)),
            ..Slot::default()
        };
        s.prepares.insert(1, d(7));
        s.prepares.insert(2, d(7));
        s.doubts.insert(1, vec![0]);
        s.doubts.insert(2, vec![0]);
        assert_eq!(advance(&mut s), None, "nobody vouched for request 0");
        assert_eq!(s.advance(1, 1, 0, 3, (2, true)), Some(d(7)));
    }

    #[test]
    fn the_window_and_the_certificates_are_checked() {
        let mut log = SlotLog::default();
        log.slot(5).pp = Some(d(1));
        assert!(log.check_invariants(0, 10, 4).is_ok());
        assert!(
            log.check_invariants(5, 15, 4).is_err(),
            "at the low watermark"
        );
        log.slot(6).committed = true;
        assert!(
            log.check_invariants(0, 10, 4).is_err(),
            "committed, not prepared"
        );
        log.forget_through(6);
        assert_eq!(log.len(), 0);
        log.slot(7).prepares.insert(4, d(1));
        assert!(
            log.check_invariants(0, 10, 4).is_err(),
            "a vote of replica 4 of 4"
        );
    }
}
