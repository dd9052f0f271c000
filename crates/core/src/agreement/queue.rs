//! The message queue from an agreement replica to the execution cluster (Yin et al. 2003
//! §3.2; the glue that sends and receives is `crate::replica`'s `separated.rs`). It owns
//! what the execution nodes acknowledged, what may have to be sent again, and the checkpoint
//! waiting for their acknowledgement, and it answers in values: what to send again to whom,
//! whether a checkpoint may be taken, whether the pipeline is full, whether execution stalls.
//!
//! Bounds: one acknowledgement and one retransmission schedule per execution node (at most
//! `executors` of each, or one behind a firewall); at most `resend_max` batches kept for
//! sending again.

use crate::message::Batch;
use crate::types::{ExecutorId, Seq};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;

/// The timing and size rules the queue follows (from the replica's configuration).
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueRules {
    /// Execution nodes (each acknowledges on its own; behind a firewall they are one
    /// destination, the filters).
    pub(crate) executors: u32,
    /// Acknowledgements that count as the cluster's (g+1).
    pub(crate) exec_quorum: usize,
    /// The first retransmission's delay and the step of progress checks (ms).
    pub(crate) interval_ms: u64,
    /// The longest retransmission back-off (ms).
    pub(crate) backoff_max_ms: u64,
    /// Most sequence numbers sent again per destination and round.
    pub(crate) entries_max: u64,
    /// Most batches kept for sending again.
    pub(crate) resend_max: Seq,
    /// Behind a firewall: the certificates coming down acknowledge for all execution nodes.
    pub(crate) firewall: bool,
}

/// The message queue towards the execution cluster (see the module documentation).
#[derive(Default)]
pub(crate) struct ExecQueue {
    /// What each execution node last acknowledged: how far it executed, and its stable
    /// checkpoint (either may go down: it restarted from its durable state).
    acks: BTreeMap<ExecutorId, (Seq, Seq)>,
    /// The highest sequence number g+1 execution nodes acknowledged executing, and the
    /// highest that g+1 of them hold as a stable checkpoint.
    acked: Seq,
    stable_acked: Seq,
    /// Per execution node: when what it has not acknowledged is next sent again (ms), and
    /// the current back-off interval (reset when it acknowledges more).
    retransmit: BTreeMap<ExecutorId, (u64, u64)>,
    /// The batches executed here above some execution node's stable checkpoint, for sending
    /// again (at most `resend_max`, the oldest dropped first). Kept apart from the log,
    /// whose garbage collection only waits for g+1 acknowledgements, which faulty execution
    /// nodes can give falsely.
    resend: BTreeMap<Seq, (Digest, Option<Arc<Batch>>)>,
    /// The checkpoint waiting for its acknowledgement; nothing executes past it meanwhile.
    waiting_checkpoint: Option<Seq>,
    /// While replaying the journal: the last sequence number it executed before the restart
    /// (checkpoints below it were acknowledged then, or execution would not have gone on).
    replay_until: Seq,
    /// When g+1 execution nodes last acknowledged more (or had acknowledged everything).
    ack_progress_ms: u64,
    /// Whether a client asked again for a request ordered here since then.
    retried_since_progress: bool,
}

impl ExecQueue {
    /// How far g+1 execution nodes executed.
    pub(crate) fn acked(&self) -> Seq {
        self.acked
    }

    /// The highest checkpoint g+1 execution nodes hold as stable.
    pub(crate) fn stable_acked(&self) -> Seq {
        self.stable_acked
    }

    /// Whether a checkpoint waits for its acknowledgement (nothing executes meanwhile).
    pub(crate) fn waiting(&self) -> bool {
        self.waiting_checkpoint.is_some()
    }

    /// A restart replays the journal up to `seq`, executed before it.
    pub(crate) fn replaying_until(&mut self, seq: Seq) {
        self.replay_until = seq;
    }

    /// Batch `seq` (`digest`, `None`: the null request) went to the execution cluster: kept
    /// for sending again.
    pub(crate) fn forwarded(
        &mut self,
        rules: &QueueRules,
        seq: Seq,
        digest: Digest,
        batch: Option<Arc<Batch>>,
    ) {
        self.resend.insert(seq, (digest, batch));
        while self.resend.len() as u64 > rules.resend_max {
            self.resend.pop_first();
        }
    }

    /// What went to the execution cluster at `seq`, if still kept.
    pub(crate) fn kept(&self, seq: Seq) -> Option<&(Digest, Option<Arc<Batch>>)> {
        self.resend.get(&seq)
    }

    /// Whether the checkpoint at `seq`, just executed, waits for the execution cluster's
    /// acknowledgement (it then holds execution back). A replaying replica waits too, beyond
    /// what it executed before the restart: a checkpoint taken before the execution cluster
    /// has the batches would let the replicas' garbage collection drop what no execution node
    /// may have.
    pub(crate) fn checkpoint_waits(&mut self, seq: Seq, replaying: bool) -> bool {
        let acknowledged_before = replaying && seq < self.replay_until;
        if self.stable_acked >= seq || acknowledged_before {
            return false;
        }
        self.waiting_checkpoint = Some(seq);
        true
    }

    /// Execution node `from` acknowledged executing through `seq` with a stable checkpoint at
    /// `stable`: returns how far g+1 of them executed and hold a stable checkpoint, or `None`
    /// if it told us nothing new.
    pub(crate) fn acknowledged(
        &mut self,
        rules: &QueueRules,
        from: ExecutorId,
        seq: Seq,
        stable: Seq,
        now: u64,
    ) -> Option<(Seq, Seq)> {
        let before = self.acks.insert(from, (seq, stable));
        if before == Some((seq, stable)) {
            return None;
        }
        // What every execution node holds durably need not be sent again.
        let all = (0..rules.executors)
            .map(|e| self.acks.get(&e).map_or(0, |(_, s)| *s))
            .min()
            .unwrap_or(0);
        self.resend = self.resend.split_off(&(all + 1));
        if before.is_none_or(|(s, _)| seq != s) {
            // It moved (or went back: it restarted): what it lacks goes out at once.
            let base = rules.interval_ms;
            let due = if before.is_some_and(|(s, _)| seq < s) {
                now
            } else {
                now + base
            };
            self.retransmit.insert(from, (due, base));
        }
        // What g+1 execution nodes executed (progress), and what g+1 hold as a stable
        // checkpoint: our checkpoint waits for the latter, so our garbage collection never
        // drops what a lagging correct execution node may still need from us and cannot get
        // from its peers (they vouch for no checkpoint it could fetch until it votes too).
        let quorum_of = |mut xs: Vec<Seq>| {
            xs.sort_unstable_by(|x, y| y.cmp(x));
            xs.get(rules.exec_quorum - 1).copied().unwrap_or(0)
        };
        let acked = quorum_of(self.acks.values().map(|(s, _)| *s).collect());
        let stable = quorum_of(self.acks.values().map(|(_, s)| *s).collect());
        Some((acked, stable))
    }

    /// Whether the pipeline is full: `ordered` (the replica proposed, or handed down) is
    /// `inflight_max` or more beyond what g+1 execution nodes acknowledged, and they
    /// acknowledged more within the last interval. A batching aid, not a gate: when
    /// acknowledgements stall for a heartbeat (lost, or the execution nodes slow), ordering
    /// goes on up to the log window (simulator seeds 9205 of `--separated` and 605 of
    /// `--firewall`, with a quarter of the messages lost, ran out of their liveness budget
    /// otherwise).
    pub(crate) fn pipeline_full(
        &self,
        rules: &QueueRules,
        ordered: Seq,
        inflight_max: Seq,
        now: u64,
    ) -> bool {
        ordered.saturating_sub(self.acked) >= inflight_max
            && now < self.ack_progress_ms.saturating_add(rules.interval_ms)
    }

    /// g+1 execution nodes executed through `acked` (from their acknowledgements, or from the
    /// firewall's certificates): whether that is more than before (room in the pipeline).
    pub(crate) fn executed(&mut self, rules: &QueueRules, acked: Seq, now: u64) -> bool {
        if acked <= self.acked {
            return false;
        }
        self.acked = acked;
        self.ack_progress_ms = now;
        self.retried_since_progress = false;
        if rules.firewall {
            // The execution cluster moved: what it lacks next goes out again after one
            // interval, not after the back-off an earlier outage grew. The separated
            // deployment does the same per execution node on its acknowledgements.
            // Simulator seed 1121 of `--firewall`: a piece lost after an execution node's
            // reboot waited 3 s, through two view changes.
            let base = rules.interval_ms;
            self.retransmit.insert(0, (now + base, base));
        }
        true
    }

    /// g+1 execution nodes hold a stable checkpoint at `stable`: the checkpoint that waited
    /// for it, if any, may be taken now.
    pub(crate) fn stable(&mut self, rules: &QueueRules, stable: Seq) -> Option<Seq> {
        if stable <= self.stable_acked {
            return None;
        }
        self.stable_acked = stable;
        if rules.firewall {
            // No per-node acknowledgements behind the firewall: g+1 stable checkpoints (one
            // correct node's) are what the execution nodes fetch state from.
            self.resend = self.resend.split_off(&(stable + 1));
        }
        let released = self.waiting_checkpoint.filter(|s| *s <= stable);
        if released.is_some() {
            self.waiting_checkpoint = None;
        }
        released
    }

    /// Execution node `e` sent fresh keys (it refreshes them, or it restarted): what it has
    /// not acknowledged goes out again at once, under keys it can check.
    pub(crate) fn rekeyed(&mut self, rules: &QueueRules, e: ExecutorId, now: u64) {
        self.retransmit.insert(e, (now, rules.interval_ms));
    }

    /// A client asked again for a request ordered here.
    pub(crate) fn retried(&mut self) {
        self.retried_since_progress = true;
    }

    /// Whether execution stalls: what this replica executed through `last` is not
    /// acknowledged within `timeout_ms` while clients ask again (fewer than f+1 replicas may
    /// be sending the execution nodes their pieces). Out of the normal case, or with
    /// everything acknowledged, the wait starts again.
    pub(crate) fn stalled(&mut self, now: u64, last: Seq, normal: bool, timeout_ms: u64) -> bool {
        if self.acked >= last || !normal {
            self.ack_progress_ms = now;
            self.retried_since_progress = false;
            return false;
        }
        if self.retried_since_progress && now >= self.ack_progress_ms.saturating_add(timeout_ms) {
            self.ack_progress_ms = now;
            self.retried_since_progress = false;
            return true;
        }
        false
    }

    /// What to send again now, per destination (execution node, or 0 for the filters behind
    /// a firewall), with back-off: the sequence numbers it has not acknowledged of those this
    /// replica executed through `last`, at most `entries_max` per round.
    pub(crate) fn due(
        &mut self,
        rules: &QueueRules,
        now: u64,
        last: Seq,
    ) -> Vec<(ExecutorId, RangeInclusive<Seq>)> {
        let base = rules.interval_ms;
        // Behind a firewall the filters are one destination, and the certificates coming
        // down the acknowledgement of all execution nodes at once.
        let targets = if rules.firewall { 1 } else { rules.executors };
        let mut out = Vec::new();
        for e in 0..targets {
            let acked = if rules.firewall {
                // A checkpoint waiting for the execution checkpoint certificate asks again
                // with the last piece (its answer brings the certificate down again).
                let stuck = self
                    .waiting_checkpoint
                    .is_some_and(|s| s > self.stable_acked);
                if stuck && self.acked >= last {
                    last.saturating_sub(1)
                } else {
                    self.acked
                }
            } else {
                self.acks.get(&e).map_or(0, |(seq, _)| *seq)
            };
            if acked >= last {
                continue;
            }
            let (due, backoff) = *self.retransmit.entry(e).or_insert((now + base, base));
            if now < due {
                continue;
            }
            let backoff2 = (backoff * 2).min(rules.backoff_max_ms);
            self.retransmit.insert(e, (now + backoff2, backoff2));
            let oldest = self.resend.keys().next().copied().unwrap_or(last);
            let from = (acked + 1).max(oldest);
            let to = last.min(from + rules.entries_max - 1);
            out.push((e, from..=to));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(firewall: bool) -> QueueRules {
        QueueRules {
            executors: 3,
            exec_quorum: 2,
            interval_ms: 50,
            backoff_max_ms: 400,
            entries_max: 4,
            resend_max: 6,
            firewall,
        }
    }

    fn queue_with(r: &QueueRules, through: Seq) -> ExecQueue {
        let mut q = ExecQueue::default();
        for seq in 1..=through {
            q.forwarded(r, seq, Digest::ZERO, None);
        }
        q
    }

    #[test]
    fn g_plus_one_acknowledgements_move_the_queue_and_release_the_checkpoint() {
        let r = rules(false);
        let mut q = queue_with(&r, 8);
        assert!(
            q.kept(1).is_none() && q.kept(3).is_some(),
            "at most resend_max kept"
        );
        assert!(q.checkpoint_waits(8, false));
        assert!(q.waiting());
        assert_eq!(
            q.acknowledged(&r, 0, 8, 8, 100),
            Some((0, 0)),
            "one is not g+1"
        );
        assert_eq!(q.acknowledged(&r, 0, 8, 8, 100), None, "nothing new");
        assert_eq!(q.acknowledged(&r, 1, 8, 8, 100), Some((8, 8)));
        assert!(q.executed(&r, 8, 100));
        assert!(!q.executed(&r, 8, 100), "not more");
        assert_eq!(q.stable(&r, 8), Some(8));
        assert!(!q.waiting());
        assert!(!q.checkpoint_waits(8, false), "acknowledged already");
        // Every execution node but one holds 8 durably: what it lacks is still kept.
        assert!(q.kept(8).is_some());
        q.acknowledged(&r, 2, 8, 8, 100);
        assert!(
            q.kept(8).is_none(),
            "everyone holds it: nothing to send again"
        );
    }

    #[test]
    fn what_is_not_acknowledged_goes_out_again_with_back_off() {
        let r = rules(false);
        let mut q = queue_with(&r, 5);
        q.acknowledged(&r, 0, 2, 0, 0);
        assert!(
            q.due(&r, 10, 5).is_empty(),
            "the first round waits one interval"
        );
        let due = q.due(&r, 60, 5);
        assert_eq!(due, vec![(0, 3..=5), (1, 1..=4), (2, 1..=4)]);
        assert!(q.due(&r, 100, 5).is_empty(), "backed off to 100 ms");
        assert_eq!(q.due(&r, 160, 5).len(), 3);
        // A restarted execution node (its acknowledgement went back) is served at once.
        q.acknowledged(&r, 0, 1, 0, 170);
        assert_eq!(q.due(&r, 170, 5), vec![(0, 2..=5)]);
        // Rekeyed: at once too.
        q.rekeyed(&r, 1, 175);
        assert_eq!(q.due(&r, 175, 5), vec![(1, 1..=4)]);
    }

    #[test]
    fn behind_a_firewall_the_filters_are_one_destination_and_a_stuck_checkpoint_asks_again() {
        let r = rules(true);
        let mut q = queue_with(&r, 4);
        assert!(q.checkpoint_waits(4, false));
        q.executed(&r, 4, 10);
        // Everything executed is acknowledged, but the checkpoint certificate did not come:
        // the last piece goes again, to bring it down.
        assert_eq!(q.due(&r, 60, 4), vec![(0, 4..=4)]);
        assert_eq!(q.stable(&r, 4), Some(4));
        assert!(q.due(&r, 200, 4).is_empty());
    }

    #[test]
    fn the_pipeline_is_full_only_while_acknowledgements_keep_coming_and_stalls_need_retries() {
        let r = rules(false);
        let mut q = queue_with(&r, 6);
        q.executed(&r, 2, 100);
        assert!(q.pipeline_full(&r, 4, 2, 120));
        assert!(!q.pipeline_full(&r, 3, 2, 120), "one in flight");
        assert!(
            !q.pipeline_full(&r, 4, 2, 150),
            "no progress for an interval: go on"
        );
        assert!(!q.stalled(200, 6, true, 1_000), "nobody asked again");
        q.retried();
        assert!(!q.stalled(1_099, 6, true, 1_000));
        assert!(q.stalled(1_100, 6, true, 1_000));
        assert!(!q.stalled(1_101, 6, true, 1_000), "the wait starts again");
        q.retried();
        assert!(!q.stalled(5_000, 2, true, 1_000), "all acknowledged");
    }

    #[test]
    fn a_replay_does_not_wait_for_checkpoints_acknowledged_before_the_restart() {
        let r = rules(false);
        let mut q = queue_with(&r, 16);
        q.replaying_until(12);
        assert!(!q.checkpoint_waits(8, true));
        assert!(q.checkpoint_waits(16, true));
        let mut fresh = queue_with(&r, 16);
        assert!(fresh.checkpoint_waits(8, false), "not replaying: it waits");
    }
}
