//! Suspect-Leader (spec prime.md §4): every replica measures round trips to its peers and the
//! turnaround time (TAT) of the leader on the summaries it sends it; the replicas agree on
//! robust order statistics of both, and a leader slower than `K_Lat` times what a correct
//! leader would achieve (plus the proposal period) is suspected.
//!
//! Pure and self-contained: the replica feeds it what arrives and what it sends (with the
//! time), and sends what it returns. Everything resets at a view change.
//!
//! The order statistics (spec §8.2 trap 1), for f faulty replicas out of n = 3f+1:
//! - `TAT_leader` is the (f+1)-th *smallest* reported TAT: it exceeds X only if 2f+1
//!   replicas, so f+1 correct ones, measured more than X (f liars cannot frame a leader);
//! - a replica's `alpha` (the TAT it would give as leader) and `TAT_acceptable` are the
//!   (f+1)-th *largest* of the round trips and of the alphas: f inflated or missing values
//!   cannot loosen the bound beyond what a correct replica measured.

use super::matrix::Matrix;
use crate::types::{ReplicaId, Seq, View};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Suspect-Leader's knobs (ms unless named otherwise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuspectConfig {
    pub n: u32,
    pub f: u32,
    /// `K_Lat` in thousandths (2500: 2.5), the allowed variability of round trips.
    pub k_lat_permille: u64,
    /// `Δpp`, the leader's proposal period.
    pub proposal_period_ms: u64,
    /// The floor of `TAT_acceptable` (`MIN_RTT`): below it, jitter would replace correct
    /// leaders.
    pub min_rtt_ms: u64,
    /// How often pings, `TAT_UB` and (at least) `TAT_MEASURE` go out.
    pub ping_interval_ms: u64,
    /// Pings awaiting their pong (older ones are forgotten).
    pub pings_max: usize,
    /// Open challenges kept (further summaries are not timed until one is answered; the
    /// oldest keeps aging, which is what catches a silent leader).
    pub challenges_max: usize,
}

impl SuspectConfig {
    /// The release's constants (spec §6.4) for `f`.
    pub fn release(f: u32) -> SuspectConfig {
        SuspectConfig {
            n: 3 * f + 1,
            f,
            k_lat_permille: 2500,
            proposal_period_ms: 20,
            min_rtt_ms: 8,
            ping_interval_ms: 500,
            pings_max: 10,
            challenges_max: 64,
        }
    }
}

/// What Suspect-Leader sends, for this view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SuspectMsg {
    /// To all: answer with a pong.
    Ping { view: View, seq: u64 },
    /// To the pinger.
    Pong { view: View, seq: u64 },
    /// To the pingee: the round trip the sender measured to it.
    RttMeasure { view: View, rtt_ms: u64 },
    /// To all: the sender's bound on the TAT it would give as leader.
    TatUb { view: View, alpha_ms: u64 },
    /// To all: the largest TAT the sender measured in this view.
    TatMeasure { view: View, max_tat_ms: u64 },
    /// To all: the sender votes to leave `view` (see [`crate::prime::leave`]).
    Leave { view: View },
}

impl SuspectMsg {
    pub fn view(&self) -> View {
        match self {
            SuspectMsg::Ping { view, .. }
            | SuspectMsg::Pong { view, .. }
            | SuspectMsg::RttMeasure { view, .. }
            | SuspectMsg::TatUb { view, .. }
            | SuspectMsg::TatMeasure { view, .. }
            | SuspectMsg::Leave { view } => *view,
        }
    }
}

/// A message to send: to one replica, or to every other one (`to: None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Out {
    pub to: Option<ReplicaId>,
    pub msg: SuspectMsg,
}

/// Suspect-Leader's state for one view.
pub struct Suspect {
    cfg: SuspectConfig,
    me: ReplicaId,
    view: View,
    /// A view change is in progress: the challenge is the NEW-VIEW, without the `Δpp`
    /// allowance.
    changing: bool,
    next_ping_ms: u64,
    ping_seq: u64,
    /// Pings awaiting their pong: (sequence number, sent at).
    pings: VecDeque<(u64, u64)>,
    /// Per replica: the smallest round trip it reported to us (what it would see of us as
    /// leader); ours is 0.
    tat_if_leader: Vec<Option<u64>>,
    /// Our alpha as last announced.
    alpha_sent: Option<u64>,
    /// Per replica: the smallest alpha it announced.
    ub: Vec<Option<u64>>,
    /// Per replica: the largest TAT it reported in this view (ours included).
    reported: Vec<u64>,
    /// Summaries sent to the leader and not yet answered: (opened at, what each made
    /// eligible per originator).
    challenges: VecDeque<(u64, Vec<Seq>)>,
    /// What the leader's proposals accepted in this view made eligible, per originator.
    answered: Vec<Seq>,
    /// The view change's challenge: opened at.
    vc_challenge: Option<u64>,
    max_tat_ms: u64,
    max_tat_sent: Option<u64>,
    next_report_ms: u64,
    /// The simulator's mutant `leader-never-suspected`.
    #[cfg(feature = "mutants")]
    never: bool,
}

impl Suspect {
    pub fn new(cfg: SuspectConfig, me: ReplicaId, view: View, now_ms: u64) -> Suspect {
        let n = cfg.n as usize;
        let mut s = Suspect {
            cfg,
            me,
            view,
            changing: false,
            next_ping_ms: now_ms,
            ping_seq: 0,
            pings: VecDeque::new(),
            tat_if_leader: vec![None; n],
            alpha_sent: None,
            ub: vec![None; n],
            reported: vec![0; n],
            challenges: VecDeque::new(),
            answered: vec![0; n],
            vc_challenge: None,
            max_tat_ms: 0,
            max_tat_sent: None,
            next_report_ms: now_ms,
            #[cfg(feature = "mutants")]
            never: false,
        };
        s.reset(view, false, now_ms);
        s
    }

    /// The simulator's mutant `leader-never-suspected`: the bound never fires.
    #[cfg(feature = "mutants")]
    pub fn never_suspect(&mut self) {
        self.never = true;
    }

    /// A new view: everything measured about the old leader and its view goes. `changing`:
    /// the view change to `view` is still in progress.
    pub fn reset(&mut self, view: View, changing: bool, now_ms: u64) {
        let n = self.cfg.n as usize;
        self.view = view;
        self.changing = changing;
        self.pings.clear();
        self.tat_if_leader = vec![None; n];
        self.tat_if_leader[self.me as usize] = Some(0);
        self.alpha_sent = None;
        self.ub = vec![None; n];
        self.reported = vec![0; n];
        self.challenges.clear();
        self.answered = vec![0; n];
        self.vc_challenge = None;
        self.max_tat_ms = 0;
        self.max_tat_sent = None;
        // Round trips are measured again at once: a fresh leader cannot be suspected before
        // the bound is known.
        self.next_ping_ms = now_ms;
        self.next_report_ms = now_ms;
    }

    /// The view change finished (the NEW-VIEW came and was accepted).
    pub fn view_installed(&mut self, now_ms: u64) {
        self.vc_challenge_closed(now_ms);
        self.changing = false;
    }

    pub fn view(&self) -> View {
        self.view
    }

    /// Timers: pings and announcements, and the aging of the oldest open challenge.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Out> {
        let mut out = Vec::new();
        if now_ms >= self.next_ping_ms {
            self.next_ping_ms = now_ms + self.cfg.ping_interval_ms;
            self.ping_seq += 1;
            self.pings.push_back((self.ping_seq, now_ms));
            while self.pings.len() > self.cfg.pings_max {
                self.pings.pop_front();
            }
            out.push(Out {
                to: None,
                msg: SuspectMsg::Ping {
                    view: self.view,
                    seq: self.ping_seq,
                },
            });
        }
        // A leader that never answers is measured by how long it has not.
        let oldest = self
            .challenges
            .front()
            .map(|(t, _)| *t)
            .into_iter()
            .chain(self.vc_challenge)
            .min();
        if let Some(t) = oldest {
            self.fold_tat(now_ms.saturating_sub(t));
        }
        let periodic = now_ms >= self.next_report_ms;
        if periodic {
            self.next_report_ms = now_ms + self.cfg.ping_interval_ms;
        }
        if let Some(alpha) = self.alpha() {
            if periodic || self.alpha_sent.is_none() {
                self.alpha_sent = Some(alpha);
                self.ub[self.me as usize] = Some(self.ub_min(self.me, alpha));
                out.push(Out {
                    to: None,
                    msg: SuspectMsg::TatUb {
                        view: self.view,
                        alpha_ms: alpha,
                    },
                });
            }
        }
        if periodic || self.max_tat_sent.is_some_and(|s| self.max_tat_ms > s) {
            self.max_tat_sent = Some(self.max_tat_ms);
            out.push(Out {
                to: None,
                msg: SuspectMsg::TatMeasure {
                    view: self.view,
                    max_tat_ms: self.max_tat_ms,
                },
            });
        }
        out
    }

    fn ub_min(&self, j: ReplicaId, alpha: u64) -> u64 {
        self.ub[j as usize].map_or(alpha, |u| u.min(alpha))
    }

    fn fold_tat(&mut self, tat: u64) {
        if tat > self.max_tat_ms {
            self.max_tat_ms = tat;
            self.reported[self.me as usize] = tat;
        }
    }

    /// A Suspect-Leader message from replica `from`; what to send back, if anything.
    /// Messages of another view are ignored (monotone values belong to one view).
    pub fn receive(&mut self, from: ReplicaId, msg: &SuspectMsg, now_ms: u64) -> Option<Out> {
        if msg.view() != self.view || from == self.me || from >= self.cfg.n {
            return None;
        }
        let j = from as usize;
        match *msg {
            SuspectMsg::Ping { view, seq } => Some(Out {
                to: Some(from),
                msg: SuspectMsg::Pong { view, seq },
            }),
            SuspectMsg::Pong { view, seq } => {
                let &(_, sent) = self.pings.iter().find(|(s, _)| *s == seq)?;
                Some(Out {
                    to: Some(from),
                    msg: SuspectMsg::RttMeasure {
                        view,
                        rtt_ms: now_ms.saturating_sub(sent),
                    },
                })
            }
            SuspectMsg::RttMeasure { rtt_ms, .. } => {
                let t = &mut self.tat_if_leader[j];
                *t = Some(t.map_or(rtt_ms, |x| x.min(rtt_ms)));
                None
            }
            SuspectMsg::TatUb { alpha_ms, .. } => {
                self.ub[j] = Some(self.ub_min(from, alpha_ms));
                None
            }
            SuspectMsg::TatMeasure { max_tat_ms, .. } => {
                self.reported[j] = self.reported[j].max(max_tat_ms);
                None
            }
            // Counted by the leave votes, not here.
            SuspectMsg::Leave { .. } => None,
        }
    }

    /// We sent the leader a summary: its answer is timed.
    pub fn summary_sent(&mut self, summary: &Matrix, now_ms: u64) {
        if self.challenges.len() < self.cfg.challenges_max {
            let f = self.cfg.f as usize;
            let wanted = summary.eligible_after(&vec![0; self.cfg.n as usize], f);
            self.challenges.push_back((now_ms, wanted));
        }
    }

    /// The leader's proposal we accepted next in order: the challenges it answers close, in
    /// the order they opened. A summary is answered once the proposals make eligible what it
    /// proved for every originator (replicas send one only when it would make more eligible
    /// than what they sent or saw proposed). The release asks more: every row of the
    /// proposal at least the row sent; its leader proposes whenever any row is newer, ours
    /// only when a proposal would make more eligible, and a row-wise answer then waited for
    /// the next update (simulator seed 414 with --bounded-delay: a correct leader was
    /// replaced after stabilisation for a 66 ms turnaround against a 65 ms bound).
    pub fn proposal_accepted(&mut self, matrix: &Matrix, now_ms: u64) {
        let f = self.cfg.f as usize;
        self.answered = matrix.eligible_after(&self.answered, f);
        while let Some((t, wanted)) = self.challenges.front() {
            if wanted.iter().zip(&self.answered).any(|(w, a)| w > a) {
                break;
            }
            let tat = now_ms.saturating_sub(*t);
            self.challenges.pop_front();
            self.fold_tat(tat);
        }
    }

    /// We hold what the new leader needs for its NEW-VIEW: its turnaround is timed.
    pub fn vc_challenge_opened(&mut self, now_ms: u64) {
        self.vc_challenge.get_or_insert(now_ms);
    }

    fn vc_challenge_closed(&mut self, now_ms: u64) {
        if let Some(t) = self.vc_challenge.take() {
            self.fold_tat(now_ms.saturating_sub(t));
        }
    }

    /// This replica's `alpha`: the (f+1)-th largest round trip its peers reported to it
    /// (its own counts as 0, unknown ones as infinite); `None` while infinite.
    pub fn alpha(&self) -> Option<u64> {
        kth_largest(&self.tat_if_leader, self.cfg.f as usize + 1)
    }

    /// `TAT_acceptable`: the (f+1)-th largest announced alpha, at least `min_rtt_ms`; `None`
    /// (infinite) until 2f+1 replicas announced one.
    pub fn tat_acceptable(&self) -> Option<u64> {
        kth_largest(&self.ub, self.cfg.f as usize + 1).map(|a| a.max(self.cfg.min_rtt_ms))
    }

    /// `TAT_leader`: the (f+1)-th smallest reported TAT (silent replicas count as 0).
    pub fn tat_leader(&self) -> u64 {
        let mut r = self.reported.clone();
        r.sort_unstable();
        r[self.cfg.f as usize]
    }

    /// Open challenges and pings awaiting their pong (bounded by `challenges_max` and
    /// `pings_max`).
    pub fn footprint(&self) -> (usize, usize) {
        (self.challenges.len(), self.pings.len())
    }

    /// The largest TAT we measured in this view.
    pub fn max_tat(&self) -> u64 {
        self.max_tat_ms
    }

    /// The bound a leader must meet: `K_Lat · TAT_acceptable + Δpp` (`Δpp` left out while
    /// the view change is in progress); `None` while `TAT_acceptable` is unknown.
    pub fn bound(&self) -> Option<u64> {
        let acc = self.tat_acceptable()?;
        let allowance = if self.changing {
            0
        } else {
            self.cfg.proposal_period_ms
        };
        Some(acc.saturating_mul(self.cfg.k_lat_permille) / 1000 + allowance)
    }

    /// Whether the leader of this view is too slow: `TAT_leader` above the bound.
    pub fn suspects(&self) -> bool {
        #[cfg(feature = "mutants")]
        if self.never {
            return false;
        }
        self.bound().is_some_and(|b| self.tat_leader() > b)
    }
}

/// The k-th largest (1-based) of values where `None` stands for infinity; `None` if it is
/// infinite.
fn kth_largest(values: &[Option<u64>], k: usize) -> Option<u64> {
    let mut v: Vec<u64> = values.iter().map(|x| x.unwrap_or(u64::MAX)).collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    let x = *v.get(k - 1)?;
    (x != u64::MAX).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prime::matrix::{PoAru, SignedPoAru};
    use redoubt_crypto::pk::Signature;

    fn cfg() -> SuspectConfig {
        SuspectConfig::release(1)
    }

    fn fresh(view: View) -> Suspect {
        Suspect::new(cfg(), 0, view, 0)
    }

    /// Replica `j` announces `alpha_ms` (TAT_UB) in `view`.
    fn ub(s: &mut Suspect, j: ReplicaId, view: View, alpha_ms: u64) {
        s.receive(j, &SuspectMsg::TatUb { view, alpha_ms }, 0);
    }

    /// Replica `j` reports `max_tat_ms` (TAT_MEASURE) in `view`.
    fn tat(s: &mut Suspect, j: ReplicaId, view: View, max_tat_ms: u64) {
        s.receive(j, &SuspectMsg::TatMeasure { view, max_tat_ms }, 0);
    }

    /// Replica `j` tells us the round trip it measured to us.
    fn rtt(s: &mut Suspect, j: ReplicaId, rtt_ms: u64) {
        s.receive(
            j,
            &SuspectMsg::RttMeasure {
                view: s.view(),
                rtt_ms,
            },
            0,
        );
    }

    /// A summary in which 2f+1 rows hold originator 0's requests through `aru` (so it makes
    /// them eligible), and the fourth row is at `other`.
    fn summary_with(aru: u64, other: u64) -> Matrix {
        let mut m = Matrix::empty(4);
        for j in 0..4u32 {
            let x = if j == 3 { other } else { aru };
            m.rows[j as usize] = Some(SignedPoAru {
                row: PoAru {
                    replica: j,
                    inc: 0,
                    num: x,
                    aru: vec![x, 0, 0, 0],
                },
                sig: Signature::default(),
            });
        }
        m
    }

    fn summary(aru: u64) -> Matrix {
        summary_with(aru, aru)
    }

    #[test]
    fn a_pong_gives_the_pingee_its_round_trip() {
        let mut s = fresh(0);
        let pings = s.tick(0);
        let SuspectMsg::Ping { seq, .. } = pings[0].msg else {
            panic!("a ping first")
        };
        let out = s.receive(2, &SuspectMsg::Pong { view: 0, seq }, 12);
        let measure = SuspectMsg::RttMeasure {
            view: 0,
            rtt_ms: 12,
        };
        assert_eq!(
            out,
            Some(Out {
                to: Some(2),
                msg: measure
            })
        );
    }

    #[test]
    fn alpha_ignores_f_inflated_or_missing_round_trips() {
        let mut s = fresh(0);
        for (j, ms) in [(1, 10), (2, 12), (3, 900)] {
            rtt(&mut s, j, ms);
        }
        // Own 0, peers 10, 12, 900: the 2nd largest is 12.
        assert_eq!(s.alpha(), Some(12));
        let mut t = fresh(0);
        rtt(&mut t, 1, 5);
        assert_eq!(t.alpha(), None, "two unknown round trips: infinite");
        rtt(&mut t, 2, 7);
        assert_eq!(t.alpha(), Some(7));
        rtt(&mut t, 2, 9);
        assert_eq!(
            t.alpha(),
            Some(7),
            "the smallest report of a replica counts"
        );
    }

    #[test]
    fn f_liars_can_neither_frame_a_correct_leader_nor_shield_a_slow_one() {
        let mut s = fresh(0);
        for j in 1..4 {
            ub(&mut s, j, 0, 10);
        }
        // 3 of 4 announced (ours is missing): the (f+1)-th largest is still finite.
        assert_eq!(s.tat_acceptable(), Some(10));
        assert_eq!(s.bound(), Some(25 + 20));
        // One liar reports a huge TAT: not a suspicion.
        tat(&mut s, 3, 0, 10_000);
        assert!(!s.suspects());
        // A second replica agrees: not yet 2f+1 (we measured nothing).
        tat(&mut s, 2, 0, 46);
        assert!(!s.suspects());
        // A third: 2f+1 reports above the bound, f+1 of them from correct replicas.
        tat(&mut s, 1, 0, 46);
        assert_eq!(s.tat_leader(), 46);
        assert!(s.suspects());
        // A liar that shrinks its alpha to 0 cannot tighten the bound below the honest ones.
        let mut t = fresh(0);
        for (j, a) in [(1, 0), (2, 30), (3, 30)] {
            ub(&mut t, j, 0, a);
        }
        assert_eq!(t.tat_acceptable(), Some(30));
        // Nor can one that inflates it loosen the bound (once our own alpha is known: an
        // unknown one counts as infinite, and f+1 unknown or inflated ones would win).
        let mut u = fresh(0);
        for j in 1..4 {
            rtt(&mut u, j, 30);
        }
        u.tick(0);
        for (j, a) in [(1, 10_000), (2, 30), (3, 30)] {
            ub(&mut u, j, 0, a);
        }
        assert_eq!(u.tat_acceptable(), Some(30));
    }

    #[test]
    fn the_floor_keeps_lan_jitter_from_replacing_leaders() {
        let mut s = fresh(0);
        for j in 1..4 {
            ub(&mut s, j, 0, 0);
        }
        assert_eq!(s.tat_acceptable(), Some(8));
        assert_eq!(s.bound(), Some(20 + 20));
    }

    #[test]
    fn a_leader_that_never_answers_is_measured_by_aging() {
        let mut s = fresh(0);
        for j in 1..4 {
            ub(&mut s, j, 0, 10);
        }
        for j in 1..3 {
            tat(&mut s, j, 0, 100);
        }
        s.summary_sent(&summary(1), 1_000);
        s.tick(1_010);
        assert_eq!(s.max_tat(), 10);
        assert!(!s.suspects(), "two slow reports are not 2f+1");
        let out = s.tick(1_200);
        assert_eq!(s.max_tat(), 200);
        let grown = SuspectMsg::TatMeasure {
            view: 0,
            max_tat_ms: 200,
        };
        assert!(
            out.iter().any(|o| o.msg == grown),
            "a grown TAT is reported at once"
        );
        assert!(s.suspects());
    }

    #[test]
    fn challenges_close_in_order_when_a_proposal_covers_them() {
        let mut s = fresh(0);
        s.summary_sent(&summary(1), 100);
        s.summary_sent(&summary(2), 110);
        s.proposal_accepted(&summary(1), 130);
        assert_eq!(s.max_tat(), 30, "the first answered, the second still open");
        s.proposal_accepted(&summary(2), 135);
        assert_eq!(s.max_tat(), 30);
        s.tick(500);
        assert_eq!(s.max_tat(), 30, "nothing left open to age");
    }

    /// A row newer than the proposal's does not keep a summary open when the proposal makes
    /// eligible everything the summary proved; a proposal short of that does.
    #[test]
    fn a_summary_is_answered_by_what_a_proposal_makes_eligible() {
        let mut s = fresh(0);
        s.summary_sent(&summary_with(2, 5), 100);
        s.proposal_accepted(&summary_with(1, 1), 110);
        s.tick(120);
        assert_eq!(s.max_tat(), 20, "still open, aging");
        s.proposal_accepted(&summary_with(2, 2), 130);
        assert_eq!(
            s.max_tat(),
            30,
            "answered, though row 3 is behind the one sent"
        );
        s.tick(400);
        assert_eq!(s.max_tat(), 30, "nothing left open to age");
    }

    #[test]
    fn a_view_change_resets_everything_and_times_the_new_view_without_allowance() {
        let mut s = fresh(0);
        for j in 1..4 {
            ub(&mut s, j, 0, 10);
            tat(&mut s, j, 0, 100);
        }
        assert!(s.suspects());
        s.reset(1, true, 1_000);
        assert!(!s.suspects());
        assert_eq!(s.tat_acceptable(), None, "unknown until measured again");
        // Messages of the old view no longer count.
        ub(&mut s, 1, 0, 10);
        assert_eq!(s.tat_acceptable(), None);
        for j in 1..4 {
            ub(&mut s, j, 1, 10);
        }
        assert_eq!(
            s.bound(),
            Some(25),
            "no proposal period while changing views"
        );
        s.vc_challenge_opened(1_000);
        s.view_installed(1_030);
        assert_eq!(s.max_tat(), 30);
        assert_eq!(s.bound(), Some(45));
    }

    #[test]
    fn pongs_answer_only_outstanding_pings_and_other_views_are_ignored() {
        let mut s = fresh(3);
        assert_eq!(
            s.receive(1, &SuspectMsg::Pong { view: 3, seq: 99 }, 5),
            None
        );
        assert_eq!(s.receive(1, &SuspectMsg::Ping { view: 2, seq: 1 }, 5), None);
        let pong = SuspectMsg::Pong { view: 3, seq: 1 };
        assert_eq!(
            s.receive(1, &SuspectMsg::Ping { view: 3, seq: 1 }, 5),
            Some(Out {
                to: Some(1),
                msg: pong
            })
        );
        assert_eq!(s.receive(0, &SuspectMsg::Ping { view: 3, seq: 1 }, 5), None);
    }
}
