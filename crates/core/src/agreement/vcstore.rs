//! The view-change messages a replica holds (BFT-PR §4.3.1, §4.5): other replicas'
//! VIEW-CHANGEs, the claims of those too far ahead to keep, copies relayed by others, and
//! VIEW-CHANGE-ACKs. What they mean (the join rule, the set S, checking a NEW-VIEW) is the
//! view change's; this component keeps them within their bounds and forgets them when their
//! senders' keys are retired.
//!
//! Bounds: per sender, VIEW-CHANGEs for at most three views (the holder's view, the one before,
//! and the sender's latest) and one claim; relayed copies only for a NEW-VIEW being checked
//! (cleared at every view change); acks at most `ACKS_PER_ACKER_MAX` per acker.

use crate::message::ViewChange;
use crate::types::{ReplicaId, View};
use redoubt_crypto::Digest;
use std::collections::{BTreeMap, BTreeSet};

/// Acks one replica may have stored here at a time.
pub(crate) const ACKS_PER_ACKER_MAX: usize = 64;

/// What storing a VIEW-CHANGE did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Kept (or the same message again).
    Kept,
    /// The sender already sent a different one for that view: the first stands.
    Conflict,
}

#[derive(Default)]
pub(crate) struct ViewChangeStore {
    /// VIEW-CHANGE messages per (sender, view).
    vcs: BTreeMap<(ReplicaId, View), (ViewChange, Digest)>,
    /// Per sender, the highest view of a VIEW-CHANGE it sent for a view too far ahead to keep.
    beyond: BTreeMap<ReplicaId, View>,
    /// Copies relayed by others, by (sender, digest).
    relayed: BTreeMap<(ReplicaId, Digest), ViewChange>,
    /// Ackers per (view, sender, digest).
    acks: BTreeMap<(View, ReplicaId, Digest), BTreeSet<ReplicaId>>,
    /// The first VIEW-CHANGE stored under a digest not its own (checked once, when stored:
    /// stored messages never change), for `check_invariants`. Test and simulator builds.
    #[cfg(any(test, feature = "mutants"))]
    misfiled: Option<String>,
}

impl ViewChangeStore {
    /// Stores `from`'s VIEW-CHANGE `vc` (digest `digest`) while the holder is in `mine`;
    /// keeps, per sender, the messages for `mine`, the view before it, and the latest.
    pub(crate) fn store(&mut self, vc: ViewChange, digest: Digest, mine: View) -> Stored {
        let from = vc.replica;
        match self.vcs.get(&(from, vc.view)) {
            Some((_, od)) if *od != digest => return Stored::Conflict,
            Some(_) => return Stored::Kept,
            None => {}
        }
        let v = vc.view;
        #[cfg(any(test, feature = "mutants"))]
        if self.misfiled.is_none() && vc.digest() != digest {
            self.misfiled = Some(format!(
                "VIEW-CHANGE of r{from} v{v} stored under a wrong digest"
            ));
        }
        self.vcs.insert((from, v), (vc, digest));
        let prev = mine.saturating_sub(1);
        let latest = self
            .vcs
            .range((from, 0)..=(from, View::MAX))
            .map(|((_, v), _)| *v)
            .max()
            .unwrap_or(v);
        self.vcs
            .retain(|(r, v), _| *r != from || *v == mine || *v == prev || *v == latest);
        Stored::Kept
    }

    /// `from` claims to be at view `v`, too far ahead to keep its message.
    pub(crate) fn claim(&mut self, from: ReplicaId, v: View) {
        let c = self.beyond.entry(from).or_insert(v);
        *c = (*c).max(v);
    }

    /// `r`'s VIEW-CHANGE for view `v`.
    pub(crate) fn get(&self, r: ReplicaId, v: View) -> Option<&(ViewChange, Digest)> {
        self.vcs.get(&(r, v))
    }

    /// `r`'s stored VIEW-CHANGE with digest `d`, for whatever view.
    pub(crate) fn of_sender_with(&self, r: ReplicaId, d: &Digest) -> Option<ViewChange> {
        self.vcs
            .range((r, 0)..=(r, View::MAX))
            .map(|(_, x)| x)
            .find(|(_, md)| md == d)
            .map(|(m, _)| m.clone())
    }

    /// Every stored VIEW-CHANGE for view `v`, by sender.
    pub(crate) fn for_view(
        &self,
        v: View,
    ) -> impl Iterator<Item = (ReplicaId, &ViewChange, Digest)> {
        self.vcs
            .iter()
            .filter(move |((_, view), _)| *view == v)
            .map(|((r, _), (m, d))| (*r, m, *d))
    }

    /// Per other replica, the highest view it sent a VIEW-CHANGE (or a claim) for.
    pub(crate) fn highest_views(&self) -> BTreeMap<ReplicaId, View> {
        let mut out: BTreeMap<ReplicaId, View> = BTreeMap::new();
        for (r, v) in self
            .vcs
            .keys()
            .copied()
            .chain(self.beyond.iter().map(|(r, v)| (*r, *v)))
        {
            let e = out.entry(r).or_insert(v);
            *e = (*e).max(v);
        }
        out
    }

    /// A copy of a VIEW-CHANGE relayed by another replica.
    pub(crate) fn relay(&mut self, vc: ViewChange, digest: Digest) {
        self.relayed.insert((vc.replica, digest), vc);
    }

    pub(crate) fn relayed(&self, r: ReplicaId, d: &Digest) -> Option<&ViewChange> {
        self.relayed.get(&(r, *d))
    }

    /// `acker` vouches for `sender`'s VIEW-CHANGE `digest` for view `v`; refused (false)
    /// once the acker holds `ACKS_PER_ACKER_MAX` entries.
    pub(crate) fn ack(
        &mut self,
        v: View,
        sender: ReplicaId,
        digest: Digest,
        acker: ReplicaId,
    ) -> bool {
        let held = self.acks.values().filter(|s| s.contains(&acker)).count();
        if held >= ACKS_PER_ACKER_MAX {
            return false;
        }
        self.acks
            .entry((v, sender, digest))
            .or_default()
            .insert(acker);
        true
    }

    /// The ackers of `sender`'s VIEW-CHANGE `digest` for view `v`.
    pub(crate) fn ackers(&self, v: View, sender: ReplicaId, digest: &Digest) -> Vec<ReplicaId> {
        self.acks
            .get(&(v, sender, *digest))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Entering view `v`: relayed copies go, acks for earlier views go, VIEW-CHANGEs for views
    /// before `v - 1` go (lagging replicas may still need the previous view's relayed), and
    /// claims at or below `v`.
    pub(crate) fn enter(&mut self, v: View) {
        self.relayed.clear();
        self.acks.retain(|(view, _, _), _| *view >= v);
        self.vcs.retain(|(_, view), _| *view + 1 >= v);
        self.beyond.retain(|_, view| *view > v);
    }

    /// Forgets everything (a recovery's view estimate).
    pub(crate) fn clear(&mut self) {
        *self = ViewChangeStore {
            #[cfg(any(test, feature = "mutants"))]
            misfiled: self.misfiled.take(),
            ..ViewChangeStore::default()
        };
    }

    /// Forgets what the replicas `gone` selects sent, and acks for their messages; returns
    /// how many messages (VIEW-CHANGEs, claims, relayed copies) went.
    pub(crate) fn forget(&mut self, gone: impl Fn(ReplicaId) -> bool) -> usize {
        let before = self.messages();
        self.vcs.retain(|(s, _), _| !gone(*s));
        self.relayed.retain(|(s, _), _| !gone(*s));
        self.beyond.retain(|s, _| !gone(*s));
        self.acks.retain(|(_, s, _), ackers| {
            ackers.retain(|a| !gone(*a));
            !gone(*s) && !ackers.is_empty()
        });
        before - self.messages()
    }

    /// VIEW-CHANGEs, claims and relayed copies held.
    pub(crate) fn messages(&self) -> usize {
        self.vcs.len() + self.relayed.len() + self.beyond.len()
    }

    pub(crate) fn acks_len(&self) -> usize {
        self.acks.len()
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut per_sender: BTreeMap<ReplicaId, usize> = BTreeMap::new();
        #[cfg(any(test, feature = "mutants"))]
        if let Some(e) = &self.misfiled {
            return Err(e.clone());
        }
        for ((r, v), (m, _)) in &self.vcs {
            if m.replica != *r || m.view != *v {
                return Err(format!(
                    "VIEW-CHANGE of r{} v{} stored as r{r} v{v}",
                    m.replica, m.view
                ));
            }
            *per_sender.entry(*r).or_default() += 1;
        }
        if let Some((r, k)) = per_sender.iter().find(|(_, k)| **k > 3) {
            return Err(format!("{k} VIEW-CHANGEs of r{r} stored"));
        }
        let mut per_acker: BTreeMap<ReplicaId, usize> = BTreeMap::new();
        for ackers in self.acks.values() {
            if ackers.is_empty() {
                return Err("an ack entry without ackers".into());
            }
            for a in ackers {
                *per_acker.entry(*a).or_default() += 1;
            }
        }
        if let Some((a, k)) = per_acker.iter().find(|(_, k)| **k > ACKS_PER_ACKER_MAX) {
            return Err(format!("{k} acks of r{a} stored"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vc(replica: ReplicaId, view: View, ls: u64) -> (ViewChange, Digest) {
        let m = ViewChange {
            view,
            replica,
            ls,
            checkpoints: Vec::new(),
            p: Vec::new(),
            q: Vec::new(),
        };
        let d = m.digest();
        (m, d)
    }

    #[test]
    fn the_first_view_change_stands_and_few_are_kept_per_sender() {
        let mut s = ViewChangeStore::default();
        let (a, da) = vc(1, 5, 0);
        let (b, db) = vc(1, 5, 16);
        assert_eq!(s.store(a, da, 4), Stored::Kept);
        assert_eq!(s.store(b, db, 4), Stored::Conflict);
        assert_eq!(s.get(1, 5).map(|(_, d)| *d), Some(da));
        // Ours is view 4: the sender's messages for 4, 3 and its latest are kept.
        for v in [3, 4, 6, 7, 8] {
            let (m, d) = vc(1, v, 0);
            s.store(m, d, 4);
        }
        let kept: Vec<View> = (0..10).filter(|v| s.get(1, *v).is_some()).collect();
        assert_eq!(kept, vec![3, 4, 8]);
        s.claim(2, 40);
        s.claim(2, 30);
        assert_eq!(s.highest_views(), BTreeMap::from([(1, 8), (2, 40)]));
        assert_eq!(s.check_invariants(), Ok(()));
    }

    #[test]
    fn acks_are_bounded_per_acker_and_forgotten_with_their_sender() {
        let mut s = ViewChangeStore::default();
        let (m, d) = vc(1, 2, 0);
        s.store(m.clone(), d, 1);
        s.relay(m, d);
        for sender in 0..ACKS_PER_ACKER_MAX as u32 {
            assert!(s.ack(2, sender, d, 3));
        }
        assert!(!s.ack(2, 999, d, 3), "the acker's store is full");
        assert!(s.ack(2, 1, d, 2));
        assert_eq!(s.ackers(2, 1, &d), vec![2, 3]);
        // Replica 1 re-keyed: its messages, the acks for them, and its relayed copies go.
        let gone = s.forget(|r| r == 1);
        assert_eq!(gone, 2);
        assert!(s.get(1, 2).is_none() && s.relayed(1, &d).is_none());
        assert!(s.ackers(2, 1, &d).is_empty());
        // Replica 3 re-keyed: every ack it sent goes.
        s.forget(|r| r == 3);
        assert_eq!(s.acks_len(), 0);
        assert_eq!(s.check_invariants(), Ok(()));
    }

    #[test]
    fn a_view_change_filed_under_another_digest_fails_the_invariants_even_once_cleared() {
        let mut s = ViewChangeStore::default();
        let (m, _) = vc(1, 2, 0);
        let (_, other) = vc(1, 2, 16);
        s.store(m, other, 1);
        assert!(s.check_invariants().unwrap_err().contains("wrong digest"));
        s.clear();
        assert!(s.check_invariants().is_err());
    }
}
