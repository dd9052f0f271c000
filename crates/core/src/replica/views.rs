//! What a replica knows of views (PBFT §4.4, BFT-PR §4.3): the view it is in and whether it
//! is active there, the timer that makes it leave, its own VIEW-CHANGEs, what the others
//! sent and claim, and the NEW-VIEW it entered on or still has to check. The protocol steps
//! that use it are in `view_change.rs`.
//!
//! Bounds: the store, claims and reports bound themselves (see their modules); at most one
//! NEW-VIEW is kept entered and one pending; `decision_missing` holds at most the batches of
//! one NEW-VIEW's decision.

use super::status::ResendGate;
use crate::agreement::claims::Claims;
use crate::agreement::reports::ViewReports;
use crate::agreement::vcstore::ViewChangeStore;
use crate::message::{NewView, ViewChange};
use crate::types::{Config, ReplicaId, View};
use redoubt_crypto::Digest;

/// The view-change timer's length: doubled at every view change that did not lead to
/// execution, back to its base once a request executes in a view (PBFT §4.5.2).
#[derive(Clone, Debug)]
pub(super) struct ViewTimer {
    timeout_ms: u64,
    base_ms: u64,
    max_ms: u64,
    /// Once a NEW-VIEW quorum of VIEW-CHANGEs for our view is in: when we give up on it.
    pub(super) deadline_ms: Option<u64>,
    /// A request executed in the current view (the timeout went back to its base then).
    executed_in_view: bool,
}

impl ViewTimer {
    fn new(cfg: &Config) -> Self {
        ViewTimer {
            timeout_ms: cfg.view_change_timeout_ms,
            base_ms: cfg.view_change_timeout_ms,
            max_ms: cfg.view_change_timeout_max_ms,
            deadline_ms: None,
            executed_in_view: false,
        }
    }

    /// The current timeout (ms).
    pub(super) fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// Doubles the timeout, up to its maximum: a view was left without progress.
    pub(super) fn back_off(&mut self) {
        self.timeout_ms = (self.timeout_ms * 2).min(self.max_ms);
    }

    /// Requests executed: the first time in a view, the timeout is back to its base.
    pub(super) fn executed(&mut self) {
        if !self.executed_in_view {
            self.executed_in_view = true;
            self.timeout_ms = self.base_ms;
        }
    }

    /// A view was left: nothing executed in the next one yet, no deadline running.
    pub(super) fn left_view(&mut self) {
        self.deadline_ms = None;
        self.executed_in_view = false;
    }
}

/// See the module documentation.
pub(super) struct Views {
    pub(super) view: View,
    /// Active in `view` (its NEW-VIEW checked and entered), not changing views.
    pub(super) normal: bool,
    /// The last view this replica entered normal operation in: what it reports to clients
    /// (a replica left behind in a view change no other replica joined reports the view
    /// the others are ordering in, not the one it is trying to change to).
    pub(super) installed: View,
    pub(super) timer: ViewTimer,
    /// Our VIEW-CHANGE for `view` while changing to it or active in it.
    pub(super) mine: Option<(ViewChange, Digest)>,
    /// Our VIEW-CHANGE for the previous view, still needed by replicas checking its NEW-VIEW.
    pub(super) prev: Option<(ViewChange, Digest)>,
    /// Other replicas' VIEW-CHANGEs, claims, relayed copies and acks (see `vcstore.rs`).
    pub(super) store: ViewChangeStore,
    /// P, Q and the doubted slots: what we claim about the views we left (see `claims.rs`).
    pub(super) claims: Claims,
    /// The views other replicas report being active in (see `reports.rs`).
    pub(super) reports: ViewReports,
    /// The NEW-VIEW of `view` once entered.
    pub(super) new_view: Option<NewView>,
    /// While primary: when this view's NEW-VIEW last went to each replica, so that the
    /// status messages of a replica still entering the view do not each fetch it again (see
    /// `help_into_view`); set for every replica when this replica broadcasts the NEW-VIEW of
    /// a view it leads.
    pub(super) new_view_sent: ResendGate,
    /// When our VIEW-CHANGE of the current view last went to each replica behind us, in
    /// answer to its status (see `help_into_view`).
    pub(super) view_change_sent: ResendGate,
    /// The view this replica is active in and the digest of the NEW-VIEW it entered it on
    /// (journaled: reported in STATUS after a restart too).
    pub(super) entered_on: Option<(View, Digest)>,
    /// A NEW-VIEW for `view` received and not yet checked (it waits for VIEW-CHANGEs or
    /// batches it names), and when it arrived (ms).
    pub(super) pending_nv: Option<NewView>,
    pub(super) pending_nv_since_ms: u64,
    /// The batches the pending NEW-VIEW's decision needs and we lack (asked for in STATUS).
    pub(super) decision_missing: Vec<Digest>,
}

impl Views {
    pub(super) fn new(cfg: &Config, id: ReplicaId) -> Self {
        Views {
            view: 0,
            normal: true,
            installed: 0,
            timer: ViewTimer::new(cfg),
            mine: None,
            prev: None,
            store: ViewChangeStore::default(),
            claims: Claims::new(cfg.f, cfg.log_size),
            reports: ViewReports::new(cfg.n(), id),
            new_view: None,
            new_view_sent: ResendGate::default(),
            view_change_sent: ResendGate::default(),
            entered_on: None,
            pending_nv: None,
            pending_nv_since_ms: 0,
            decision_missing: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_doubles_to_its_maximum_and_resets_once_per_view() {
        let cfg = Config {
            view_change_timeout_ms: 100,
            view_change_timeout_max_ms: 350,
            ..Config::new(1)
        };
        let mut t = ViewTimer::new(&cfg);
        t.back_off();
        t.back_off();
        assert_eq!(t.timeout_ms(), 350, "capped");
        t.executed();
        assert_eq!(t.timeout_ms(), 100);
        t.back_off();
        t.executed();
        assert_eq!(
            t.timeout_ms(),
            200,
            "only the first execution of a view resets it"
        );
        t.left_view();
        t.executed();
        assert_eq!(t.timeout_ms(), 100);
    }
}
