//! Leaving a view takes 2f+1 replicas (Prime's NEW-LEADER step; ADR 0007, "Leaving a view").
//!
//! Under PBFT a replica whose timer fires leaves its view at once: it sends VIEW-CHANGE and
//! stops taking part in the view. Its clients lose nothing, because they send to every replica.
//! Under Prime, and above all between sites, a client talks to one replica (its site), and a
//! replica whose timer fired alone was stranded in the later view while the others went on
//! ordering without it: it answered nobody until the others changed view too (simulator
//! seeds: `--ordering prime` 8,956, `--sites` 227 and 253).
//!
//! So a replica's own suspicion (a request that waited past the timeout, Suspect-Leader's
//! verdict) is a *vote* to leave its view, broadcast and resent while it holds, and the
//! replica stays in the view. It joins the others' vote once f+1 replicas voted (one of them
//! correct), and leaves, with PBFT's VIEW-CHANGE, once 2f+1 did: then f+1 correct replicas
//! voted, every correct replica joins, and all of them leave. Faulty replicas alone (f votes)
//! move nobody; a replica alone moves nobody either, and keeps answering in its view.
//!
//! Votes are kept for the replica's view and the next [`VIEWS_AHEAD`] views (a replica that
//! lags receives the votes of its peers ahead of it): bounded by n per view.

use crate::types::{ReplicaId, View};
use std::collections::{BTreeMap, BTreeSet};

/// Votes for views this far beyond ours are kept; later ones dropped.
pub const VIEWS_AHEAD: View = 2;
/// A vote is sent again at most this often while the suspicion holds (votes are lost like
/// any message).
pub const RESEND_MS: u64 = 500;

/// What the votes counted for our view say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Stay,
    /// f+1 voted and we have not: vote too.
    Join,
    /// 2f+1 voted: leave the view.
    Leave,
}

/// The votes to leave views, as one replica counts them.
#[derive(Clone, Debug)]
pub struct LeaveVotes {
    f: usize,
    n: usize,
    me: ReplicaId,
    view: View,
    votes: BTreeMap<View, BTreeSet<ReplicaId>>,
    /// When we last sent our vote for our view.
    sent_ms: Option<u64>,
}

impl LeaveVotes {
    pub fn new(f: usize, n: usize, me: ReplicaId, view: View) -> LeaveVotes {
        LeaveVotes {
            f,
            n,
            me,
            view,
            votes: BTreeMap::new(),
            sent_ms: None,
        }
    }

    /// We are in `view` now (a view change started or a view was installed).
    pub fn entered(&mut self, view: View) {
        if view != self.view {
            self.sent_ms = None;
        }
        self.view = view;
        self.votes = self.votes.split_off(&view);
    }

    /// We suspect our view's leader: our vote, and the view to send it for if it is due.
    pub fn suspect(&mut self, now_ms: u64) -> Option<View> {
        self.votes.entry(self.view).or_default().insert(self.me);
        if self
            .sent_ms
            .is_some_and(|t| now_ms < t.saturating_add(RESEND_MS))
        {
            return None;
        }
        self.sent_ms = Some(now_ms);
        Some(self.view)
    }

    /// Replica `from` voted to leave `view`.
    pub fn receive(&mut self, from: ReplicaId, view: View) {
        if (from as usize) >= self.n
            || view < self.view
            || view > self.view.saturating_add(VIEWS_AHEAD)
        {
            return;
        }
        self.votes.entry(view).or_default().insert(from);
    }

    /// Whether we voted to leave our view.
    pub fn voted(&self) -> bool {
        self.votes
            .get(&self.view)
            .is_some_and(|v| v.contains(&self.me))
    }

    pub fn votes(&self) -> usize {
        self.votes.get(&self.view).map_or(0, |v| v.len())
    }

    pub fn verdict(&self) -> Verdict {
        let votes = self.votes();
        if votes > 2 * self.f {
            Verdict::Leave
        } else if votes > self.f && !self.voted() {
            Verdict::Join
        } else {
            Verdict::Stay
        }
    }

    /// Entries held, for the footprint checks.
    pub fn footprint(&self) -> usize {
        self.votes.values().map(|v| v.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_vote_moves_nobody_f_plus_one_are_joined_and_2f_plus_one_leave() {
        let mut l = LeaveVotes::new(1, 4, 0, 3);
        assert_eq!(l.suspect(1000), Some(3));
        assert_eq!(l.verdict(), Verdict::Stay, "a replica alone stays");
        assert_eq!(l.suspect(1200), None, "resent only after RESEND_MS");
        assert_eq!(l.suspect(1500), Some(3));
        l.receive(1, 3);
        assert_eq!(
            l.verdict(),
            Verdict::Stay,
            "2 = f+1 with ours: we voted already"
        );
        l.receive(2, 3);
        assert_eq!(l.verdict(), Verdict::Leave);

        // A replica that did not suspect joins f+1 others.
        let mut k = LeaveVotes::new(1, 4, 3, 3);
        k.receive(1, 3);
        assert_eq!(k.verdict(), Verdict::Stay, "f faulty votes move nobody");
        k.receive(1, 3);
        assert_eq!(k.verdict(), Verdict::Stay, "a vote counts once");
        k.receive(2, 3);
        assert_eq!(k.verdict(), Verdict::Join);
        k.suspect(0);
        k.receive(0, 3);
        assert_eq!(k.verdict(), Verdict::Leave);
    }

    #[test]
    fn votes_for_other_views_wait_or_go_and_memory_is_bounded() {
        let mut l = LeaveVotes::new(1, 4, 0, 5);
        l.receive(1, 4); // old
        l.receive(1, 6);
        l.receive(2, 6);
        l.receive(3, 8); // too far ahead
        l.receive(9, 6); // no such replica
        assert_eq!(l.votes(), 0);
        assert_eq!(l.footprint(), 2);
        l.entered(6);
        assert_eq!(l.votes(), 2);
        assert_eq!(l.verdict(), Verdict::Join);
        l.entered(7);
        assert_eq!(l.footprint(), 0);
    }
}
