//! The join-rule check: faulty replicas alone never move a correct replica to a later view.
//!
//! PBFT (Castro & Liskov, §4.5.2): a replica that holds f+1 VIEW-CHANGEs for views above its
//! own joins the smallest of them, so that "a faulty replica cannot cause a view change by
//! sending a VIEW-CHANGE message" (only as primary, by stepping down or failing). The world
//! sees every replica's reasons, so it checks exactly that: whenever a correct replica starts
//! a view change to view v while handling a frame, either some other correct replica started
//! a view change to v or later before (the f+1 senders hold at least one correct replica), or
//! the replica judged on its own and moved one view on: the NEW-VIEW it got does not follow
//! from its view changes, Suspect-Leader convicted the leader (Prime), or the frame is the
//! VIEW-CHANGE of the primary of its view handing over (a faulty primary may step down).
//! Starts on a timer, an operator's step-down, a reboot or a recovery (the view it estimates
//! from its peers' answers, while it recovers) are the replica's own.
//!
//! Off under proactive recovery: there the adversary forges frames with keys it took from
//! replicas that are correct again, so "the correct replicas' view changes" are not the
//! world's to tell apart.

use super::*;

/// What the world knows of the step a correct replica is taking on a delivered frame.
#[derive(Clone, Copy, Debug)]
pub(super) struct JoinStep {
    pub(super) replica: ReplicaId,
    pub(super) from: Principal,
    /// The replica's view, and whether it was in normal operation, before the step.
    pub(super) view: u64,
    pub(super) normal: bool,
    /// The replica judged the leader or the new primary faulty during the step.
    pub(super) own_judgement: bool,
    /// The replica was recovering: the view it moves to is its estimate of the others'.
    pub(super) recovering: bool,
}

/// The join-rule check's memory.
#[derive(Default)]
pub(super) struct JoinCheck {
    /// The highest view each replica ever started a view change to (correct ones are those
    /// the check counts).
    pub(super) asked: BTreeMap<ReplicaId, u64>,
    /// The step under way, when a correct replica handles a delivered frame.
    pub(super) step: Option<JoinStep>,
    /// Violations reported (one per run is enough).
    pub(super) reported: bool,
}

impl World {
    /// Whether the join-rule check applies to this run.
    fn join_checked(&self) -> bool {
        self.sc.proactive.is_none()
    }

    fn join_correct(&self, r: ReplicaId) -> bool {
        !self.faulty.contains(&r) && !self.adversary.controls(r)
    }

    /// Before correct replica `r` handles a frame from `from`.
    pub(super) fn join_before(&mut self, r: ReplicaId, from: Principal) {
        if !self.join_checked() || !self.join_correct(r) {
            return;
        }
        let rep = &self.replicas[r as usize];
        self.join.step = Some(JoinStep {
            replica: r,
            from,
            view: rep.view(),
            normal: rep.is_normal(),
            own_judgement: false,
            recovering: rep.recovering(),
        });
    }

    /// After the handling, before its effects: Suspect-Leader's verdicts show in the stats.
    pub(super) fn join_handled(&mut self, r: ReplicaId, suspected_before: u64) {
        if let Some(s) = self.join.step.as_mut() {
            if s.replica == r
                && self.replicas[r as usize].stats.leaders_suspected > suspected_before
            {
                s.own_judgement = true;
            }
        }
    }

    pub(super) fn join_after(&mut self) {
        self.join.step = None;
    }

    /// An event of replica `r` (called for every event, in order).
    pub(super) fn join_observe(&mut self, r: ReplicaId, ev: &Event) {
        match ev {
            Event::Rejected {
                kind: "new-view", ..
            } => {
                if let Some(s) = self.join.step.as_mut() {
                    if s.replica == r {
                        s.own_judgement = true;
                    }
                }
            }
            // Under Prime a vote to leave view v asks for view v+1 as a view change does.
            Event::ViewChangeStarted { .. } | Event::LeaveVoted { .. } => {
                let v = match ev {
                    Event::LeaveVoted { view, .. } => view.saturating_add(1),
                    Event::ViewChangeStarted { view, .. } => *view,
                    _ => unreachable!(),
                };
                if let Some(s) = self.join.step.filter(|s| s.replica == r) {
                    self.join_check(s, v);
                }
                let e = self.join.asked.entry(r).or_insert(0);
                *e = (*e).max(v);
            }
            _ => {}
        }
    }

    fn join_check(&mut self, s: JoinStep, v: u64) {
        if self.join.reported {
            return;
        }
        let next = v == s.view.saturating_add(1);
        let own = next && s.own_judgement;
        let primary = Principal::Replica(self.sc.core.primary(s.view));
        let step_down = next && s.normal && s.from == primary;
        let asked = self
            .join
            .asked
            .iter()
            .any(|(c, w)| *c != s.replica && *w >= v && self.join_correct(*c));
        if own || step_down || asked || s.recovering {
            return;
        }
        self.join.reported = true;
        let r = s.replica;
        let from = s.from;
        let highest: Vec<String> = self
            .join
            .asked
            .iter()
            .filter(|(c, _)| self.join_correct(**c))
            .map(|(c, w)| format!("r{c}: v{w}"))
            .collect();
        self.violation(format!(
            "join rule: r{r} (in view {} {}) started a view change to view {v} on a frame from \
             {from:?}, though no other correct replica asked for view {v} or later (highest \
             views correct replicas asked for: {}): faulty replicas moved it",
            s.view,
            if s.normal { "normal" } else { "changing" },
            if highest.is_empty() {
                "none".to_string()
            } else {
                highest.join(", ")
            }
        ));
    }
}
