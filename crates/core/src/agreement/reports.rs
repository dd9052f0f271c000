//! What peers' STATUS messages say about their views: for each other replica, the view it
//! last reported being active in (normal status), if any.
//!
//! A replica stuck changing into view v with a NEW-VIEW it cannot check (a view change it
//! names was sent under keys since retired, so no correct replica can supply it any more)
//! enters v anyway once 2f+1 other replicas report being active in v: at least f+1 of them
//! are correct and checked a NEW-VIEW for v, so at most f correct replicas ever enter v
//! unchecked, too few with the f faulty ones to complete a certificate the checked NEW-VIEW
//! does not allow (ADR 0003, "Entering a view others checked").
//!
//! Bounds: one entry per other replica. Reports sent under keys since retired are dropped
//! with the sender's other view-change messages.

use crate::types::{ReplicaId, View};
use std::collections::BTreeMap;

pub(crate) struct ViewReports {
    n: u32,
    me: ReplicaId,
    active_in: BTreeMap<ReplicaId, View>,
}

impl ViewReports {
    pub(crate) fn new(n: u32, me: ReplicaId) -> Self {
        ViewReports {
            n,
            me,
            active_in: BTreeMap::new(),
        }
    }

    /// Replica `from` reports being in `view`, active (`normal`) or changing into it; the
    /// latest report replaces the earlier ones.
    pub(crate) fn record(&mut self, from: ReplicaId, view: View, normal: bool) {
        if from == self.me || from >= self.n {
            return;
        }
        if normal {
            self.active_in.insert(from, view);
        } else {
            self.active_in.remove(&from);
        }
    }

    /// How many other replicas last reported being active in `view`.
    pub(crate) fn active_in(&self, view: View) -> usize {
        self.active_in.values().filter(|v| **v == view).count()
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
    fn counts_the_latest_report_of_each_other_replica() {
        let mut r = ViewReports::new(4, 0);
        r.record(1, 3, true);
        r.record(2, 3, true);
        r.record(2, 3, true);
        r.record(0, 3, true); // our own never counts
        r.record(9, 3, true); // out of range
        assert_eq!(r.active_in(3), 2);
        r.record(2, 4, false); // replica 2 moved on to change view
        assert_eq!(r.active_in(3), 1);
        r.record(3, 4, true);
        assert_eq!(r.active_in(4), 1);
        r.forget(|x| x == 1);
        assert_eq!(r.active_in(3), 0);
        assert!(r.check_invariants().is_ok());
    }
}
