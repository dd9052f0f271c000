//! Checkpoint certificates of the order (PBFT §4.3): the CHECKPOINT votes of every replica,
//! from which a checkpoint is known correct (f+1 matching votes: a correct replica computed
//! it) or stable (2f+1: it can be the low watermark).
//!
//! Bounds: per replica, votes for at most `L / K + 2` sequence numbers (the window's
//! checkpoints and two beyond it); the lowest are dropped first.

use crate::types::{ReplicaId, Seq};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;

pub(crate) struct CheckpointVotes {
    votes: BTreeMap<ReplicaId, BTreeMap<Seq, Digest>>,
    /// Sequence numbers kept per replica.
    cap: usize,
    /// The stable checkpoint (the low water mark) and its digest.
    stable: (Seq, Digest),
}

impl CheckpointVotes {
    /// Votes for a window of `log_size` sequence numbers with a checkpoint every
    /// `interval`.
    pub(crate) fn new(log_size: Seq, interval: Seq) -> Self {
        CheckpointVotes {
            votes: BTreeMap::new(),
            cap: (log_size / interval) as usize + 2,
            stable: (0, Digest::ZERO),
        }
    }

    /// The stable checkpoint's sequence number: the low water mark.
    pub(crate) fn stable_seq(&self) -> Seq {
        self.stable.0
    }

    /// The stable checkpoint's digest.
    pub(crate) fn stable_digest(&self) -> Digest {
        self.stable.1
    }

    /// Checkpoint `seq` (`digest`) is stable here now (or is where this replica stands
    /// after a restart or a recovery).
    pub(crate) fn set_stable(&mut self, seq: Seq, digest: Digest) {
        self.stable = (seq, digest);
    }

    /// Records `from`'s vote for `digest` at `seq` (a later vote for `seq` replaces it).
    pub(crate) fn record(&mut self, from: ReplicaId, seq: Seq, digest: Digest) {
        let votes = self.votes.entry(from).or_default();
        votes.insert(seq, digest);
        while votes.len() > self.cap {
            votes.pop_first();
        }
    }

    /// The replicas that voted for `digest` at `seq`.
    pub(crate) fn voters(&self, seq: Seq, digest: &Digest) -> Vec<ReplicaId> {
        self.votes
            .iter()
            .filter(|(_, v)| v.get(&seq) == Some(digest))
            .map(|(r, _)| *r)
            .collect()
    }

    /// The digest with the most votes at `seq` and their number (of equally voted digests,
    /// the greatest).
    pub(crate) fn leading(&self, seq: Seq) -> Option<(Digest, usize)> {
        let mut tally: BTreeMap<Digest, usize> = BTreeMap::new();
        for v in self.votes.values() {
            if let Some(d) = v.get(&seq) {
                *tally.entry(*d).or_default() += 1;
            }
        }
        tally.into_iter().max_by_key(|(_, c)| *c)
    }

    /// Forgets every vote at or below `seq` (a checkpoint there is the low watermark).
    pub(crate) fn forget_through(&mut self, seq: Seq) {
        for v in self.votes.values_mut() {
            *v = v.split_off(&(seq + 1));
        }
    }

    /// Forgets the votes of every replica but `keep` above `seq` (they came under keys that
    /// were just retired).
    pub(crate) fn forget_others_above(&mut self, keep: ReplicaId, seq: Seq) {
        for (r, votes) in self.votes.iter_mut() {
            if *r != keep {
                votes.retain(|s, _| *s <= seq);
            }
        }
    }

    /// Votes held in all.
    pub(crate) fn len(&self) -> usize {
        self.votes.values().map(|m| m.len()).sum()
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        match self.votes.iter().find(|(_, v)| v.len() > self.cap) {
            Some((r, v)) => Err(format!(
                "{} checkpoint votes of r{r} kept, above the bound {}",
                v.len(),
                self.cap
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(b: u8) -> Digest {
        Digest([b; 32])
    }

    #[test]
    fn the_leading_digest_and_its_voters() {
        let mut v = CheckpointVotes::new(64, 16);
        assert_eq!(v.leading(16), None);
        v.record(0, 16, d(1));
        v.record(1, 16, d(1));
        v.record(2, 16, d(2));
        assert_eq!(v.leading(16), Some((d(1), 2)));
        assert_eq!(v.voters(16, &d(1)), vec![0, 1]);
        // A later vote of the same replica replaces its earlier one.
        v.record(1, 16, d(2));
        assert_eq!(v.leading(16), Some((d(2), 2)));
        assert_eq!(v.voters(16, &d(1)), vec![0]);
    }

    #[test]
    fn votes_stay_within_the_window_and_are_forgotten_below_it() {
        let mut v = CheckpointVotes::new(64, 16);
        for k in 1..=20 {
            v.record(3, 16 * k, d(k as u8));
        }
        assert_eq!(v.len(), 6, "L/K + 2 per replica, the lowest dropped");
        assert_eq!(v.leading(16 * 15), Some((d(15), 1)));
        assert_eq!(v.leading(16 * 14), None);
        assert_eq!(v.check_invariants(), Ok(()));
        v.forget_through(16 * 17);
        assert_eq!(v.len(), 3);
        v.record(0, 16 * 19, d(9));
        v.forget_others_above(0, 16 * 18);
        assert_eq!(v.voters(16 * 19, &d(9)), vec![0]);
        assert_eq!(v.leading(16 * 20), None);
        assert_eq!(v.leading(16 * 18), Some((d(18), 1)));
    }
}
