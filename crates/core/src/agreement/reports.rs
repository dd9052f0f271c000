//! What peers' STATUS messages say about their views: for each other replica, the view it
//! last reported being active in (normal status) and the NEW-VIEW it entered it on, if any.
//!
//! A replica stuck changing into view v with a NEW-VIEW it cannot check (a view change it
//! names was sent under keys since retired, so no correct replica can supply it any more)
//! enters v on it anyway once f+1 other replicas report being active in v on that same
//! NEW-VIEW (by digest): at least one of them is correct, and the first correct replica to
//! enter v on it checked it, so it is a NEW-VIEW a correct replica accepted (ADR 0003,
//! "Entering a view others checked"). A replica recovered since it entered its view reports
//! none until f+1 others report being active in it on one NEW-VIEW (see
//! `Replica::vouch_again`): otherwise a view outlasting a round of proactive recoveries
//! would lose every voucher.
//!
//! Bounds: one entry per other replica. Reports sent under keys since retired are dropped
//! with the sender's other view-change messages.

use crate::types::{ReplicaId, View};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;

pub(crate) struct ViewReports {
    n: u32,
    me: ReplicaId,
    active_in: BTreeMap<ReplicaId, (View, Digest)>,
}

impl ViewReports {
    pub(crate) fn new(n: u32, me: ReplicaId) -> Self {
        ViewReports {
            n,
            me,
            active_in: BTreeMap::new(),
        }
    }

    /// Replica `from` reports being in `view`, active on the NEW-VIEW `new_view` or changing
    /// into it (`None`); the latest report replaces the earlier ones.
    pub(crate) fn record(&mut self, from: ReplicaId, view: View, new_view: Option<Digest>) {
        if from == self.me || from >= self.n {
            return;
        }
        match new_view {
            Some(d) => {
                self.active_in.insert(from, (view, d));
            }
            None => {
                self.active_in.remove(&from);
            }
        }
    }

    /// How many other replicas last reported being active in `view` on the NEW-VIEW `nv`.
    pub(crate) fn active_in(&self, view: View, nv: &Digest) -> usize {
        self.active_in
            .values()
            .filter(|(v, d)| *v == view && d == nv)
            .count()
    }

    /// A NEW-VIEW for `view` that at least `need` other replicas last reported being active
    /// on (the most reported, then the lowest digest), if any.
    pub(crate) fn vouched(&self, view: View, need: usize) -> Option<Digest> {
        let mut counts: BTreeMap<Digest, usize> = BTreeMap::new();
        for (v, d) in self.active_in.values() {
            if *v == view {
                *counts.entry(*d).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .filter(|(_, c)| *c >= need)
            .max_by_key(|(d, c)| (*c, std::cmp::Reverse(*d)))
            .map(|(d, _)| d)
    }

    /// Drops the reports of the replicas `gone` selects (their keys were retired).
    pub(crate) fn forget(&mut self, gone: impl Fn(ReplicaId) -> bool) {
        self.active_in.retain(|r, _| !gone(*r));
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        if let Some(r) = self
            .active_in
            .keys()
            .find(|r| **r == self.me || **r >= self.n)
        {
            return Err(format!("a report of replica {r} (self or out of range)"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_latest_matching_report_of_each_other_replica() {
        let (a, b) = (Some(Digest([1; 32])), Some(Digest([2; 32])));
        let mut r = ViewReports::new(4, 0);
        r.record(1, 3, a);
        r.record(2, 3, a);
        r.record(2, 3, a);
        r.record(3, 3, b); // another NEW-VIEW for view 3
        r.record(0, 3, a); // our own never counts
        r.record(9, 3, a); // out of range
        assert_eq!(r.active_in(3, &a.unwrap()), 2);
        assert_eq!(r.active_in(3, &b.unwrap()), 1);
        r.record(2, 4, None); // replica 2 moved on to change view
        assert_eq!(r.active_in(3, &a.unwrap()), 1);
        r.record(3, 4, a);
        assert_eq!(r.active_in(4, &a.unwrap()), 1);
        assert_eq!(r.vouched(3, 1), a);
        assert_eq!(r.vouched(3, 2), None);
        r.record(2, 4, b);
        assert_eq!(r.vouched(4, 1), a, "one each: the lowest digest");
        r.record(1, 4, b);
        assert_eq!(r.vouched(4, 2), b);
        r.record(1, 3, a);
        r.forget(|x| x == 1);
        assert_eq!(r.active_in(3, &a.unwrap()), 0);
        assert!(r.check_invariants().is_ok());
    }
}
