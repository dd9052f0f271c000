//! PBFT's check of the primary's pace (`primary_pace_window_ms`; Aardvark's required
//! throughput, Clement et al. 2009): every replica counts the requests executed in windows of
//! fixed length; two windows in a row each with fewer than half the requests of the best of
//! the [`PACE_HISTORY`] windows before it, while requests wait unproposed, make it start a
//! view change. A faulty primary that delays each pre-prepare to just under the backups'
//! view-change timeout, so that no request timer ever fires, is then replaced after two
//! windows instead of never.
//!
//! A view change the check starts rebases the reference: the windows remembered are replaced
//! by the last one, the pace the replaced primary kept under the load of the moment, and the
//! next primary is held to half of that. The shortfall that replaced the first primary was
//! either its doing (then a correct successor is far faster than that) or the load's (the
//! work per request rose: the clients moved from 0-byte to 4 KiB writes), and then the
//! windows before it describe a load that is gone and that no primary can keep up with.
//! Judged against them, every successor looked as slow as the first, each view change slowed
//! the next window further, and the view changes went on until those windows aged out
//! (twenty seconds of them in `redoubt bench micro`). Halving the windows instead, the rule
//! before this one, still cost about log2(k) view changes, two windows apart, for a k-fold
//! rise in the work per request: four a second apart in process benchmarks, three in 1.4 s
//! in the simulator's `pace-load-step` (docs/adr/0002, item 13). Now a step costs one.
//!
//! Two slow windows in a row, not one: a step of the load inside a window leaves that window
//! partly at the old pace, and a reference rebased to it would hold the successor, wholly at
//! the new pace, to more than half of what it can do. The second slow window lies wholly
//! after the step. The price: a slow primary keeps its view one window longer.
//!
//! The first full window of a new view is a grace window: counted for later references but
//! never judged (nor the first of two slow ones). It holds the view change's own cost (the
//! new primary re-proposes what was in flight, clients time out and retransmit), so judging
//! it replaced correct primaries in a row after a shift of the workload. The price: a slow
//! primary keeps its view one window more after it takes over.
//!
//! Requests count as waiting only when the oldest one waiting unproposed has been seen so
//! at the ticks for [`PACE_WAIT_MS`]: a lone client's request waits well under a
//! millisecond at a correct primary, and judging a window that ended with one just arrived
//! replaced correct primaries whenever the load fell (the micro-benchmark's step from 200
//! clients to one). A primary holding each pre-prepare for longer than that leaves requests
//! waiting and is judged; one holding each for less costs at most that delay per batch.
//!
//! What it does not catch: a primary slow from the cluster's very start (no window measured
//! a faster one); one that keeps just above half the pace of the windows before it (each
//! slower window lowers the reference for the next ones); after a view change the check
//! started, a successor that keeps half the pace of the primary it replaced (with f >= 2,
//! faulty primaries in a row after a slow one may each be about as slow as it; the request
//! timers still bound them). What it gets wrong: a fall in throughput by more than half that
//! no primary could prevent costs a view change, once per step of the work per request, and
//! again whenever the load falls by half while requests still wait (clients finishing one by
//! one on a network slow enough that every request waits for the batch before it: the tail
//! of `pace-load-step` run to completion).

use super::*;
use crate::types::{PACE_HISTORY, PACE_WAIT_MS};
use std::collections::VecDeque;

/// One replica's windows.
#[derive(Clone, Debug)]
pub(super) struct PaceWatch {
    /// The view the current window belongs to (a view change starts a new window).
    view: View,
    /// When the current window started, and the requests executed by then.
    since_ms: u64,
    base: u64,
    /// Requests executed in the last full windows, newest last.
    history: VecDeque<u64>,
    /// The current window is the first full one of a view entered after this watch began:
    /// counted, not judged (see the module comment).
    grace: bool,
    /// The full windows of this view just before the current one that were slow, in a row.
    slow_run: u32,
    /// The oldest request seen waiting unproposed at the last tick (client, timestamp),
    /// and since when it has been seen waiting.
    waiting: Option<(ClientId, u64, u64)>,
}

/// What a window's end says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pace {
    /// The window is still running, or its count keeps up with the reference.
    Fine,
    /// Fewer than half the reference's requests executed in the window just ended, and in
    /// the one before it.
    Slow { executed: u64, reference: u64 },
}

impl PaceWatch {
    pub(super) fn new(view: View, now_ms: u64, executed: u64) -> PaceWatch {
        PaceWatch {
            view,
            since_ms: now_ms,
            base: executed,
            history: VecDeque::with_capacity(PACE_HISTORY),
            grace: false,
            slow_run: 0,
            waiting: None,
        }
    }

    /// Time passed in `view`, with `executed` requests executed so far; `window_ms` long
    /// windows. A window cut by a view change is not counted; the first full window of a
    /// new view is counted and not judged; a window is slow only after a slow one.
    pub(super) fn tick(&mut self, view: View, now_ms: u64, executed: u64, window_ms: u64) -> Pace {
        if view != self.view {
            self.view = view;
            self.since_ms = now_ms;
            self.base = executed;
            self.grace = true;
            self.slow_run = 0;
            return Pace::Fine;
        }
        if now_ms < self.since_ms.saturating_add(window_ms) {
            return Pace::Fine;
        }
        let count = executed.saturating_sub(self.base);
        let reference = self.history.iter().copied().max().unwrap_or(0);
        if self.history.len() == PACE_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(count);
        self.since_ms = now_ms;
        self.base = executed;
        if std::mem::take(&mut self.grace) {
            return Pace::Fine;
        }
        if count.saturating_mul(2) >= reference {
            self.slow_run = 0;
            return Pace::Fine;
        }
        self.slow_run = self.slow_run.saturating_add(1);
        if self.slow_run < 2 {
            return Pace::Fine;
        }
        Pace::Slow {
            executed: count,
            reference,
        }
    }

    /// The oldest request waiting unproposed now is `oldest`: whether a request has waited
    /// unproposed for at least [`PACE_WAIT_MS`], as far as the ticks saw.
    pub(super) fn note_waiting(&mut self, now_ms: u64, oldest: Option<(ClientId, u64)>) -> bool {
        self.waiting = match (oldest, self.waiting) {
            (None, _) => None,
            (Some((c, ts)), Some((pc, pts, since))) if (c, ts) == (pc, pts) => Some((c, ts, since)),
            (Some((c, ts)), _) => Some((c, ts, now_ms)),
        };
        self.waiting
            .is_some_and(|(_, _, since)| now_ms >= since.saturating_add(PACE_WAIT_MS))
    }

    /// The check is starting a view change: the last window, the pace the replaced primary
    /// kept under the demand of the moment, is the reference from now on (see the module
    /// comment).
    pub(super) fn rebase_reference(&mut self) {
        let last = self.history.back().copied();
        self.history.clear();
        self.history.extend(last);
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// The pace check, from the tick in normal operation (see the module comment).
    pub(super) fn check_primary_pace(&mut self, now: u64) {
        let window = self.cfg.primary_pace_window_ms;
        if window == 0 || !self.proposals.leader_batches() {
            return;
        }
        let executed = self.stats.requests_executed;
        let view = self.views.view;
        let oldest = self.oldest_waiting_unproposed();
        let (pace, waited) = match self.ordering.proposing.pace.as_mut() {
            Some(w) => (
                w.tick(view, now, executed, window),
                w.note_waiting(now, oldest),
            ),
            None => {
                self.ordering.proposing.pace = Some(PaceWatch::new(view, now, executed));
                return;
            }
        };
        if pace == Pace::Fine
            || self.recovery.is_some()
            || self.exec.transfer_target().is_some()
            || !waited
        {
            return;
        }
        self.stats.slow_primaries += 1;
        if let Some(w) = self.ordering.proposing.pace.as_mut() {
            w.rebase_reference();
        }
        self.start_view_change(
            self.views.view.saturating_add(1),
            ViewChangeCause::PrimaryPace,
        );
    }

    /// The oldest request waiting here that no batch proposed to us holds and that blames
    /// the primary: an unsigned one may carry a MAC that fails at the primary alone (a
    /// faulty client), and counting it would let that client have correct primaries
    /// replaced whenever the load falls (second review, G5).
    fn oldest_waiting_unproposed(&self) -> Option<(ClientId, u64)> {
        self.requests
            .pool
            .in_order()
            .find(|(c, w)| {
                self.blames_primary(w)
                    && !self
                        .requests
                        .pool
                        .inflight_covers(*c, w.req.request.timestamp)
            })
            .map(|(c, w)| (c, w.req.request.timestamp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow(executed: u64, reference: u64) -> Pace {
        Pace::Slow {
            executed,
            reference,
        }
    }

    #[test]
    fn two_windows_in_a_row_with_less_than_half_the_best_recent_one_are_slow() {
        let mut w = PaceWatch::new(0, 0, 0);
        assert_eq!(
            w.tick(0, 500, 400, 1_000),
            Pace::Fine,
            "window still running"
        );
        assert_eq!(
            w.tick(0, 1_000, 1_000, 1_000),
            Pace::Fine,
            "no reference yet"
        );
        assert_eq!(w.tick(0, 2_000, 1_900, 1_000), Pace::Fine, "900 of 1,000");
        assert_eq!(
            w.tick(0, 3_000, 2_400, 1_000),
            Pace::Fine,
            "500 of 1,000: half"
        );
        assert_eq!(
            w.tick(0, 4_000, 2_799, 1_000),
            Pace::Fine,
            "399 of 1,000: the first slow window"
        );
        assert_eq!(
            w.tick(0, 5_000, 2_799 + 600, 1_000),
            Pace::Fine,
            "600 of 1,000: a fine window ends the run"
        );
        assert_eq!(
            w.tick(0, 6_000, 3_399 + 200, 1_000),
            Pace::Fine,
            "200 of 900: the first again"
        );
        assert_eq!(
            w.tick(0, 7_000, 3_599 + 250, 1_000),
            slow(250, 600),
            "the second in a row (the 1,000 and the 900 are gone)"
        );
        assert_eq!(
            w.tick(0, 8_000, 3_849 + 100, 1_000),
            slow(100, 600),
            "and the third"
        );
    }

    #[test]
    fn after_a_slow_verdict_the_next_primary_is_held_to_half_the_replaced_ones_pace() {
        // 22,000 requests a window, then the work per request rises sixteenfold in the middle
        // of a window: 1,375 a window after it.
        let mut w = PaceWatch::new(0, 0, 0);
        let mut executed = 0;
        for t in 1..=4 {
            executed += 22_000;
            assert_eq!(w.tick(0, t * 1_000, executed, 1_000), Pace::Fine);
        }
        executed += 8_000;
        assert_eq!(
            w.tick(0, 5_000, executed, 1_000),
            Pace::Fine,
            "the window of the step"
        );
        executed += 1_375;
        assert_eq!(w.tick(0, 6_000, executed, 1_000), slow(1_375, 22_000));
        w.rebase_reference();
        // View 1 from 6,200 ms (the cut window dropped); its first window is a grace window
        // (the view change's cost), then the new pace is fine against the 1,375 the replaced
        // primary kept, where halving the old windows would have replaced this primary too,
        // and then the next, and the next.
        executed += 300;
        assert_eq!(w.tick(1, 6_200, executed, 1_000), Pace::Fine);
        executed += 400;
        assert_eq!(
            w.tick(1, 7_200, executed, 1_000),
            Pace::Fine,
            "grace: 400 of 1,375"
        );
        for t in 1..4 {
            executed += 1_300;
            assert_eq!(
                w.tick(1, 7_200 + t * 1_000, executed, 1_000),
                Pace::Fine,
                "window {t} of view 1"
            );
        }
        // A primary that falls to under half of that pace is still replaced.
        executed += 600;
        assert_eq!(w.tick(1, 11_200, executed, 1_000), Pace::Fine);
        executed += 600;
        assert_eq!(w.tick(1, 12_200, executed, 1_000), slow(600, 1_300));
    }

    #[test]
    fn only_a_request_seen_waiting_for_a_while_counts_as_waiting() {
        let mut w = PaceWatch::new(0, 0, 0);
        assert!(!w.note_waiting(0, None));
        // A lone client's requests, each proposed before the next tick: never demand.
        for t in 1..10 {
            assert!(!w.note_waiting(t * 5, Some((1, t))), "request {t}");
        }
        // One request seen at ticks 50 to 60 ms: waiting from the tick it has waited 10 ms.
        assert!(!w.note_waiting(50, Some((2, 7))));
        assert!(!w.note_waiting(55, Some((2, 7))));
        assert!(w.note_waiting(60, Some((2, 7))));
        // Proposed: the next oldest starts over.
        assert!(!w.note_waiting(65, Some((3, 1))));
        assert!(!w.note_waiting(70, None));
        assert!(!w.note_waiting(75, Some((3, 1))), "seen again after a gap");
    }

    #[test]
    fn a_view_change_starts_a_new_window_and_keeps_the_reference() {
        let mut w = PaceWatch::new(0, 0, 0);
        w.tick(0, 1_000, 1_000, 1_000);
        // A slow window, then a view change (not the check's): the run of slow windows ends.
        assert_eq!(w.tick(0, 2_000, 1_100, 1_000), Pace::Fine, "the first slow");
        // View 1 from 2,300 ms: the cut window is dropped.
        assert_eq!(w.tick(1, 2_300, 1_150, 1_000), Pace::Fine);
        assert_eq!(
            w.tick(1, 3_000, 1_200, 1_000),
            Pace::Fine,
            "window from 2,300 ms"
        );
        assert_eq!(
            w.tick(1, 3_300, 1_200, 1_000),
            Pace::Fine,
            "50 of 1,000 in the grace window"
        );
        assert_eq!(
            w.tick(1, 4_300, 1_300, 1_000),
            Pace::Fine,
            "100 of 1,000: the first slow window of view 1"
        );
        assert_eq!(w.tick(1, 5_300, 1_400, 1_000), slow(100, 1_000));
    }
}
