//! What this replica claims about the views it left (BFT-PR §4.3, Figure 2): the set P (per
//! sequence number, the latest batch it prepared and in which view), the set Q (per sequence
//! number, the batches it pre-prepared, with the latest view of each, at most f+2), and the
//! doubted slots: slots of a view it left whose pre-prepare it accepted without being able to
//! authenticate every request (its PREPARE named doubts). A doubted slot joins Q once its
//! requests verify (ADR 0002, item 7), so the next VIEW-CHANGE can help decide it.
//!
//! The claims change when the replica leaves a view ([`Claims::leave`]), when a checkpoint
//! becomes stable ([`Claims::forget_through`]), when a late request lets it vouch for a doubted
//! slot ([`Claims::vouch`]), and when a recovery distrusts what its journal says
//! ([`Claims::keep_through`], [`Claims::forget_from_view`]).
//!
//! Bounds: P and Q cover at most one log window, (h, h + L] of the checkpoint h the replica
//! left a view at, so at most L slots each; a Q tuple holds at most f+2 pairs; the doubted
//! slots lie in the window of the last view change, at most L.

use crate::message::{PEntry, QEntry};
use crate::types::{Seq, View};
use crate::viewchange::{self, PSet, QSet, SlotSummary};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;

pub(crate) struct Claims {
    f: u32,
    log_size: Seq,
    p: PSet,
    q: QSet,
    /// (view left, digest) by sequence number.
    doubted: BTreeMap<Seq, (View, Digest)>,
}

impl Claims {
    pub(crate) fn new(f: u32, log_size: Seq) -> Self {
        Claims {
            f,
            log_size,
            p: PSet::new(),
            q: QSet::new(),
            doubted: BTreeMap::new(),
        }
    }

    /// Leaves view `view` with the checkpoint `stable`: the slots of its log (`slots`, empty
    /// if this replica was not active in it) update P and Q (Figure 2), and `doubted` (slots
    /// it pre-prepared with a doubt of its own) join the doubted slots. Doubted slots outside
    /// the window (stable, stable + L] are forgotten.
    pub(crate) fn leave(
        &mut self,
        view: View,
        stable: Seq,
        slots: &BTreeMap<Seq, SlotSummary>,
        doubted: impl IntoIterator<Item = (Seq, Digest)>,
    ) {
        for (n, d) in doubted {
            self.doubted.insert(n, (view, d));
        }
        let hi = stable.saturating_add(self.log_size);
        self.doubted.retain(|n, _| *n > stable && *n <= hi);
        let (p, q) =
            viewchange::compute_pq(self.f, stable, self.log_size, view, slots, &self.p, &self.q);
        self.p = p;
        self.q = q;
    }

    /// P and Q as a VIEW-CHANGE (and the journal) carry them.
    pub(crate) fn wire(&self) -> (Vec<PEntry>, Vec<QEntry>) {
        viewchange::to_wire(&self.p, &self.q)
    }

    /// The doubted slots as the journal carries them: (seq, view, digest).
    pub(crate) fn doubted_wire(&self) -> Vec<(Seq, View, Digest)> {
        self.doubted
            .iter()
            .map(|(n, (v, d))| (*n, *v, *d))
            .collect()
    }

    /// Takes the claims a journal recorded, above checkpoint `h`. A journal rewritten while the
    /// replica was compromised cannot overfill them: each set keeps its lowest L slots (a
    /// journal written here never holds more) and a Q tuple is rebuilt pair by pair, so it
    /// holds at most f+2.
    pub(crate) fn restore(
        &mut self,
        p: &[PEntry],
        q: &[QEntry],
        doubted: &[(Seq, View, Digest)],
        h: Seq,
    ) {
        let l = self.log_size as usize;
        self.p = p
            .iter()
            .filter(|e| e.seq > h)
            .map(|e| (e.seq, *e))
            .collect();
        self.q = q
            .iter()
            .filter(|e| e.seq > h && !e.pairs.is_empty())
            .map(|e| {
                let mut pairs = Vec::new();
                for (d, v) in &e.pairs {
                    viewchange::add_q(&mut pairs, *d, *v, self.f);
                }
                (e.seq, pairs)
            })
            .collect();
        self.doubted = doubted
            .iter()
            .filter(|(n, _, _)| *n > h)
            .map(|(n, v, d)| (*n, (*v, *d)))
            .collect();
        keep_lowest(&mut self.p, l);
        keep_lowest(&mut self.q, l);
        keep_lowest(&mut self.doubted, l);
    }

    /// Every batch digest P, Q and the doubted slots name (with repeats): their bodies are
    /// kept and journaled.
    pub(crate) fn digests(&self) -> impl Iterator<Item = Digest> + '_ {
        self.p
            .values()
            .map(|e| e.digest)
            .chain(self.q.values().flat_map(|v| v.iter().map(|(d, _)| *d)))
            .chain(self.doubted.values().map(|(_, d)| *d))
    }

    /// The digests P names.
    pub(crate) fn prepared_digests(&self) -> impl Iterator<Item = Digest> + '_ {
        self.p.values().map(|e| e.digest)
    }

    /// Whether P holds a slot at or above `n`.
    pub(crate) fn prepared_from(&self, n: Seq) -> bool {
        self.p.range(n..).next().is_some()
    }

    /// Checkpoint `h` became stable: P and Q forget what lies at or below it (doubted slots
    /// are forgotten by [`Claims::doubted_above`]).
    pub(crate) fn forget_through(&mut self, h: Seq) {
        self.p = self.p.split_off(&(h + 1));
        self.q = self.q.split_off(&(h + 1));
    }

    /// Forgets everything above `h_m` (a recovery's estimate: a tampered journal may have put
    /// claims there).
    pub(crate) fn keep_through(&mut self, h_m: Seq) {
        self.p.retain(|n, _| *n <= h_m);
        self.q.retain(|n, _| *n <= h_m);
        self.doubted.retain(|n, _| *n <= h_m);
    }

    /// Forgets the claims about view `v` and later ones (a recovery's view estimate moved this
    /// replica back below views its journal named).
    pub(crate) fn forget_from_view(&mut self, v: View) {
        self.p.retain(|_, e| e.view < v);
        for pairs in self.q.values_mut() {
            pairs.retain(|(_, pv)| *pv < v);
        }
        self.q.retain(|_, pairs| !pairs.is_empty());
    }

    /// Whether any slot is doubted.
    pub(crate) fn any_doubted(&self) -> bool {
        !self.doubted.is_empty()
    }

    /// Forgets the doubted slots at or below `stable` and returns the rest: (seq, view,
    /// digest).
    pub(crate) fn doubted_above(&mut self, stable: Seq) -> Vec<(Seq, View, Digest)> {
        self.doubted.retain(|n, _| *n > stable);
        self.doubted_wire()
    }

    /// This replica can now authenticate every request of doubted slot `n` (batch `d`,
    /// pre-prepared in view `v`): the slot joins Q.
    pub(crate) fn vouch(&mut self, n: Seq, v: View, d: Digest) {
        self.doubted.remove(&n);
        viewchange::add_q(self.q.entry(n).or_default(), d, v, self.f);
    }

    /// Slots in P.
    pub(crate) fn prepared_len(&self) -> usize {
        self.p.len()
    }

    /// Pairs in all Q tuples.
    pub(crate) fn q_pairs(&self) -> usize {
        self.q.values().map(|v| v.len()).sum()
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let l = self.log_size as usize;
        if self.p.len() > l || self.q.len() > l || self.doubted.len() > l {
            return Err(format!(
                "{} prepared, {} pre-prepared, {} doubted slots: more than L = {l}",
                self.p.len(),
                self.q.len(),
                self.doubted.len()
            ));
        }
        if let Some((n, e)) = self.p.iter().find(|(n, e)| e.seq != **n) {
            return Err(format!("P entry for n{} filed under n{n}", e.seq));
        }
        for (n, pairs) in &self.q {
            if pairs.is_empty() || pairs.len() > self.f as usize + 2 {
                return Err(format!("Q tuple of n{n} holds {} pairs", pairs.len()));
            }
            if pairs.windows(2).any(|w| w[0].0 >= w[1].0) {
                return Err(format!("Q tuple of n{n} unsorted or with a digest twice"));
            }
        }
        Ok(())
    }
}

fn keep_lowest<T>(m: &mut BTreeMap<Seq, T>, l: usize) {
    if let Some(cut) = m.keys().nth(l).copied() {
        m.split_off(&cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(x: u8) -> Digest {
        Digest([x; 32])
    }

    fn prepared(at: &[(Seq, u8)]) -> BTreeMap<Seq, SlotSummary> {
        at.iter()
            .map(|(n, x)| {
                (
                    *n,
                    SlotSummary {
                        prepared: Some(d(*x)),
                        preprepared: Some(d(*x)),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn leaving_a_view_claims_its_prepared_slots_within_the_window() {
        let mut c = Claims::new(1, 4);
        c.leave(0, 0, &prepared(&[(1, 1), (2, 2), (5, 5)]), []);
        let (p, q) = c.wire();
        assert_eq!(p.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(q.len(), 2);
        // A later view keeps the earlier claims where its log says nothing.
        c.leave(1, 0, &prepared(&[(2, 7)]), []);
        let (p, q) = c.wire();
        assert_eq!((p[0].digest, p[0].view), (d(1), 0));
        assert_eq!((p[1].digest, p[1].view), (d(7), 1));
        assert_eq!(q[1].pairs, vec![(d(2), 0), (d(7), 1)]);
        assert!(c.check_invariants().is_ok());
        c.forget_through(1);
        assert_eq!(c.prepared_len(), 1);
        assert!(c.prepared_from(2) && !c.prepared_from(3));
    }

    #[test]
    fn a_doubted_slot_joins_q_once_vouched_for() {
        let mut c = Claims::new(1, 4);
        c.leave(3, 0, &BTreeMap::new(), [(2, d(9)), (9, d(8))]);
        // Outside the window (0, 4]: forgotten at once.
        assert_eq!(c.doubted_wire(), vec![(2, 3, d(9))]);
        assert_eq!(c.q_pairs(), 0);
        c.vouch(2, 3, d(9));
        assert!(!c.any_doubted());
        assert_eq!(c.wire().1[0].pairs, vec![(d(9), 3)]);
        assert_eq!(c.digests().collect::<Vec<_>>(), vec![d(9)]);
    }

    #[test]
    fn a_tampered_journal_cannot_make_a_q_tuple_too_long() {
        let mut c = Claims::new(1, 8);
        let long = QEntry {
            seq: 3,
            pairs: (0..6).map(|v| (d(v as u8), v)).collect(),
        };
        let many: Vec<PEntry> = (2..20)
            .map(|seq| PEntry {
                seq,
                digest: d(1),
                view: 0,
            })
            .collect();
        c.restore(&many, &[long], &[(1, 0, d(1))], 1);
        assert_eq!(c.q_pairs(), 3, "f+2 pairs, the latest views");
        assert_eq!(c.prepared_len(), 8, "L slots, the lowest");
        assert!(c.prepared_from(9) && !c.prepared_from(10));
        assert!(!c.any_doubted(), "at or below the checkpoint");
        assert!(c.check_invariants().is_ok());
    }

    #[test]
    fn recovery_forgets_claims_above_its_estimates() {
        let mut c = Claims::new(1, 8);
        c.leave(0, 0, &prepared(&[(1, 1), (2, 2)]), []);
        c.leave(1, 0, &prepared(&[(3, 3)]), [(4, d(4))]);
        c.forget_from_view(1);
        assert_eq!(c.prepared_len(), 2);
        c.keep_through(1);
        assert_eq!(c.prepared_len(), 1);
        assert!(!c.any_doubted());
    }

    #[test]
    fn the_checker_can_fail() {
        let mut c = Claims::new(1, 2);
        c.q.insert(1, vec![(d(2), 0), (d(1), 1)]);
        assert!(c.check_invariants().is_err(), "unsorted tuple");
        c.q.clear();
        for n in 1..4 {
            c.doubted.insert(n, (0, d(1)));
        }
        assert!(c.check_invariants().is_err(), "more than L doubted");
    }
}
