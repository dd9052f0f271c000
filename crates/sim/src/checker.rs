//! Safety checks run after every step of a simulation:
//! - agreement: no two correct replicas execute different batches at one sequence number
//!   (digests recomputed from what was actually executed, not what was claimed);
//! - state agreement: correct replicas have the same state digest at every checkpoint;
//! - order: each correct replica executes sequence numbers one by one, without gaps, except
//!   across a state transfer;
//! - NEW-VIEW contradiction: a correct replica reports ([`Event::Contradiction`]) that it
//!   accepted a NEW-VIEW selecting, at a sequence number it executed, a different batch.
//!
//! Linearizability of the clients' history and liveness are checked by the world at the end.

use redoubt_core::{Event, ReplicaId, Seq};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;

pub struct Checker {
    /// How members are named in violations: "r" (replicas), "e" (execution nodes).
    label: &'static str,
    faulty: Vec<ReplicaId>,
    executed: BTreeMap<Seq, (Digest, ReplicaId)>,
    checkpoints: BTreeMap<Seq, (Digest, ReplicaId)>,
    last: Vec<Seq>,
}

impl Checker {
    pub fn new(n: u32, faulty: Vec<ReplicaId>) -> Checker {
        Checker {
            label: "r",
            faulty,
            executed: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            last: vec![0; n as usize],
        }
    }

    /// The same checker naming its members `label` (execution nodes: "e").
    pub fn labelled(mut self, label: &'static str) -> Checker {
        self.label = label;
        self
    }

    /// The batch correct members executed at `seq`, if one did.
    pub fn executed_digest(&self, seq: Seq) -> Option<Digest> {
        self.executed.get(&seq).map(|(d, _)| *d)
    }

    /// A replica the adversary took (its events are ignored from now on), or one that
    /// recovered from it, having executed up to `last_executed` (checked again from now on).
    pub fn set_faulty(&mut self, r: ReplicaId, faulty: bool, last_executed: Seq) {
        if faulty {
            if !self.faulty.contains(&r) {
                self.faulty.push(r);
            }
        } else {
            self.faulty.retain(|x| *x != r);
            self.last[r as usize] = last_executed;
        }
    }

    /// Replica `r` restarted from its disk and has executed up to `last_executed`. If its
    /// power failed mid-step (`cut`), what it executed in memory and never journaled runs
    /// again; otherwise it must have lost nothing it executed.
    pub fn restarted(&mut self, r: ReplicaId, last_executed: Seq, cut: bool) -> Option<String> {
        let last = &mut self.last[r as usize];
        let lost = (!cut && last_executed < *last && !self.faulty.contains(&r)).then(|| {
            format!("r{r} restarted having executed n{last_executed}, but it had executed n{last}")
        });
        *last = last_executed;
        lost
    }

    /// Whether `r` is faulty (or held by the adversary) now.
    pub fn is_faulty(&self, r: ReplicaId) -> bool {
        self.faulty.contains(&r)
    }

    /// The highest checkpoint a correct replica took or fetched (0 before any).
    pub fn max_checkpoint(&self) -> Seq {
        self.checkpoints.keys().next_back().copied().unwrap_or(0)
    }

    /// The highest sequence number a correct member executed or took a checkpoint at (0
    /// before any).
    pub fn max_executed(&self) -> Seq {
        let executed = self.executed.keys().next_back().copied().unwrap_or(0);
        executed.max(self.max_checkpoint())
    }

    /// The digest correct replicas agree on at checkpoint `seq`, if one was seen.
    pub fn checkpoint_digest(&self, seq: Seq) -> Option<Digest> {
        self.checkpoints.get(&seq).map(|(d, _)| *d)
    }

    /// Returns a description of the violation `ev` reveals, if any.
    pub fn observe(&mut self, r: ReplicaId, ev: &Event) -> Option<String> {
        if self.faulty.contains(&r) {
            return None;
        }
        match ev {
            Event::Executed { seq, digest, .. } => {
                let last = &mut self.last[r as usize];
                if *seq != *last + 1 {
                    return Some(format!(
                        "{l}{r} executed n{seq} after n{last}",
                        l = self.label
                    ));
                }
                *last = *seq;
                match self.executed.get(seq) {
                    Some((d, other)) if d != digest => Some(format!(
                        "agreement: {l}{r} executed {digest:?} at n{seq} but {l}{other} executed {d:?}",
                        l = self.label
                    )),
                    Some(_) => None,
                    None => {
                        self.executed.insert(*seq, (*digest, r));
                        None
                    }
                }
            }
            Event::CheckpointTaken { seq, digest } => self.checkpoint(r, *seq, *digest),
            Event::StateTransferred { seq, digest, .. } => {
                self.last[r as usize] = *seq;
                self.checkpoint(r, *seq, *digest)
            }
            Event::StateDivergence { seq } => Some(format!(
                "{l}{r} found its own state diverged at checkpoint n{seq}",
                l = self.label
            )),
            Event::Contradiction {
                seq,
                executed,
                chosen,
            } => Some(format!(
                "NEW-VIEW contradiction: r{r} executed {executed:?} at n{seq} but accepted a \
                 NEW-VIEW that chose {chosen:?} there"
            )),
            _ => None,
        }
    }

    fn checkpoint(&mut self, r: ReplicaId, seq: Seq, digest: Digest) -> Option<String> {
        match self.checkpoints.get(&seq) {
            Some((d, other)) if *d != digest => Some(format!(
                "state: {l}{r} has checkpoint digest {digest:?} at n{seq} but {l}{other} has {d:?}",
                l = self.label
            )),
            Some(_) => None,
            None => {
                self.checkpoints.insert(seq, (digest, r));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_divergent_execution_and_state() {
        let mut c = Checker::new(4, vec![3]);
        let ex = |seq, x: u8| Event::Executed {
            seq,
            view: 0,
            digest: Digest([x; 32]),
            requests: vec![],
        };
        assert!(c.observe(0, &ex(1, 1)).is_none());
        assert!(c.observe(1, &ex(1, 1)).is_none());
        assert!(
            c.observe(3, &ex(1, 9)).is_none(),
            "faulty replicas are ignored"
        );
        assert!(c.observe(2, &ex(1, 2)).unwrap().contains("agreement"));
        assert!(c.observe(0, &ex(3, 1)).unwrap().contains("after"));
        let ck = |seq, x: u8| Event::CheckpointTaken {
            seq,
            digest: Digest([x; 32]),
        };
        assert!(c.observe(0, &ck(8, 1)).is_none());
        assert!(c.observe(1, &ck(8, 2)).unwrap().contains("state"));
    }

    #[test]
    fn a_contradiction_at_a_correct_replica_is_a_violation() {
        let mut c = Checker::new(4, vec![3]);
        let ev = Event::Contradiction {
            seq: 5,
            executed: Digest([1; 32]),
            chosen: Digest::ZERO,
        };
        assert!(c
            .observe(0, &ev)
            .unwrap()
            .contains("NEW-VIEW contradiction: r0"));
        assert!(c.observe(3, &ev).is_none(), "faulty replicas are ignored");
        // A compromised replica is faulty until it recovered, then checked again.
        c.set_faulty(1, true, 0);
        assert!(c.observe(1, &ev).is_none());
        c.set_faulty(1, false, 0);
        assert!(c.observe(1, &ev).is_some());
    }
}
