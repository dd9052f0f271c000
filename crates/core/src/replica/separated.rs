//! The agreement side of a separated deployment (Yin et al. 2003 §3.2): with
//! `Config::executors > 0` a replica only orders. Its execution component holds no service
//! state, only which request of each client was ordered (the exactly-once table with empty
//! results, and the agreed clock), and "executing" a committed batch means handing it to the
//! execution cluster: the message queue of the paper.
//!
//! - Each batch the replica executes in order goes to every execution node as its piece of
//!   the agreement certificate ([`Order`], authenticated for all execution nodes at once).
//! - Execution nodes acknowledge how far they executed ([`ExecAck`]). Each one gets what it
//!   has not acknowledged again, with exponential back-off, while the log holds it: a faulty
//!   execution node acknowledging what it never ran (so that g+1 acknowledgements come early)
//!   leaves no correct one behind.
//! - The replica takes its checkpoint at sequence number K·i only once g+1 execution nodes
//!   acknowledged it (the paper's `sync()`), and executes nothing past it meanwhile: a
//!   checkpoint of the agreement cluster is stable only when at least f+1 correct replicas
//!   saw g+1 acknowledgements (so at least one correct execution node has every batch its
//!   garbage collection drops), and the log window L bounds the pipeline.
//! - Replies come from the execution nodes. A client retransmitting a request that was
//!   ordered already makes the replica send a [`Retry`] hint instead of its cached (empty)
//!   reply; tentative execution and the read-only fast path are off.
//!
//! Bounds: one acknowledgement per execution node; at most `retransmit_entries_max`
//! certificates retransmitted per round.

use super::*;
use crate::seal::seal_to_executors;
use crate::types::ExecutorId;

/// Where execution goes when this replica does not execute: the message queue towards the
/// execution nodes (separated deployment), and behind a firewall its keys and what came down.
#[derive(Default)]
pub(super) struct Remote {
    pub(super) queue: Queue,
    /// Firewall deployment: keys, and what came down (see `firewall.rs`).
    pub(super) firewall: Option<super::firewall::FirewallSide>,
}

/// The message queue towards the execution cluster.
#[derive(Default)]
pub(super) struct Queue {
    /// What each execution node last acknowledged: how far it executed, and its stable
    /// checkpoint (either may go down: it restarted from its durable state).
    acks: BTreeMap<ExecutorId, (Seq, Seq)>,
    /// The highest sequence number g+1 execution nodes acknowledged executing, and the
    /// highest that g+1 of them hold as a stable checkpoint.
    pub(super) acked: Seq,
    pub(super) stable_acked: Seq,
    /// Per execution node: when what it has not acknowledged is next sent again (ms), and
    /// the current back-off interval (reset when it acknowledges more).
    retransmit: BTreeMap<ExecutorId, (u64, u64)>,
    /// The batches executed here above some execution node's stable checkpoint, for sending
    /// again (at most [`resend_max`], the oldest dropped first). Kept apart from the log,
    /// whose garbage collection only waits for g+1 acknowledgements, which faulty execution
    /// nodes can give falsely.
    resend: BTreeMap<Seq, (Digest, Option<Arc<Batch>>)>,
    /// The checkpoint waiting for its acknowledgement; nothing executes past it meanwhile.
    waiting_checkpoint: Option<Seq>,
    /// While replaying the journal: the last sequence number it executed before the restart
    /// (checkpoints below it were acknowledged then, or execution would not have gone on).
    pub(super) replay_until: Seq,
    /// When g+1 execution nodes last acknowledged more (or had acknowledged everything).
    ack_progress_ms: u64,
    /// Whether a client asked again for a request ordered here since then.
    retried_since_progress: bool,
}

/// How many unacknowledged batches a replica keeps for sending again: 2L + K. With g faulty
/// execution nodes no correct one lags further behind this replica: the replica executes at
/// most L past its stable checkpoint, which lies at most at what g+1 execution nodes
/// acknowledged, one of them correct; a correct execution node runs at most L past its own
/// stable checkpoint, which needs g+1 matching votes, so every correct node's; and a
/// checkpoint is at most K behind what a node executed. With fewer faulty ones a correct
/// node may lag further (it was cut off, or restarted): it then catches up from its peers'
/// certificates while they hold them (see `crate::executor`).
pub(super) fn resend_max(cfg: &Config) -> Seq {
    2 * cfg.log_size + cfg.checkpoint_interval
}

impl Queue {
    pub(super) fn waiting(&self) -> bool {
        self.waiting_checkpoint.is_some()
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Sends our piece of the agreement certificate for batch `digest` (`None`: the null
    /// request) at `seq` to every execution node.
    pub(super) fn forward(&mut self, seq: Seq, digest: Digest, batch: Option<&Batch>) {
        let msg = Message::from(Order {
            replica: self.id,
            view: self.views.view,
            seq,
            digest,
            batch: batch.cloned(),
        });
        self.remote
            .queue
            .resend
            .insert(seq, (digest, batch.map(|b| Arc::new(b.clone()))));
        while self.remote.queue.resend.len() as u64 > resend_max(&self.cfg) {
            self.remote.queue.resend.pop_first();
        }
        if self.out.replaying || self.above_cap(&msg) {
            return;
        }
        if self.cfg.firewall() {
            let Message::Separated(SeparatedMessage::Order(o)) = msg else {
                unreachable!("built above")
            };
            return self.send_signed_order(o);
        }
        let bytes: Bytes = Arc::new(seal_to_executors(&self.auth, &msg, self.cfg.executors));
        for e in 0..self.cfg.executors {
            self.out.effects.push(Effect::Send {
                to: Principal::Executor(e),
                bytes: bytes.clone(),
            });
        }
    }

    /// Sends our piece for `seq` again, to execution node `to` only.
    fn forward_again(&mut self, to: ExecutorId, seq: Seq) -> bool {
        let Some((d, batch)) = self.remote.queue.resend.get(&seq).cloned() else {
            return false;
        };
        let batch = batch.map(|b| (*b).clone());
        let msg = Message::from(Order {
            replica: self.id,
            view: self.views.view,
            seq,
            digest: d,
            batch,
        });
        if self.above_cap(&msg) {
            return false;
        }
        if self.cfg.firewall() {
            let Message::Separated(SeparatedMessage::Order(o)) = msg else {
                unreachable!("built above")
            };
            self.send_signed_order(o);
            return true;
        }
        let bytes = Arc::new(seal_to_executors(&self.auth, &msg, self.cfg.executors));
        self.out.effects.push(Effect::Send {
            to: Principal::Executor(to),
            bytes,
        });
        true
    }

    /// Whether the checkpoint at `seq`, just executed, must wait for the execution
    /// cluster's acknowledgement (and nothing execute past it meanwhile).
    pub(super) fn checkpoint_waits(&mut self, seq: Seq) -> bool {
        // A replaying replica waits too (its replay stops there): a checkpoint taken before
        // the execution cluster has the batches would let the replicas' garbage collection
        // drop what no execution node may have.
        let acknowledged_before = self.out.replaying && seq < self.remote.queue.replay_until;
        if !self.cfg.separated() || self.remote.queue.stable_acked >= seq || acknowledged_before {
            return false;
        }
        self.remote.queue.waiting_checkpoint = Some(seq);
        true
    }

    pub(super) fn on_exec_ack(&mut self, from: ExecutorId, a: ExecAck) -> Result<(), Reject> {
        if !self.cfg.separated()
            || self.cfg.firewall()
            || from >= self.cfg.executors
            || a.executor != from
        {
            return Err(Reject::Unexpected);
        }
        if a.stable > a.seq {
            return Err(Reject::Inconsistent);
        }
        let before = self.remote.queue.acks.insert(from, (a.seq, a.stable));
        if before == Some((a.seq, a.stable)) {
            return Ok(());
        }
        // What every execution node holds durably need not be sent again.
        let all = (0..self.cfg.executors)
            .map(|e| self.remote.queue.acks.get(&e).map_or(0, |(_, s)| *s))
            .min()
            .unwrap_or(0);
        self.remote.queue.resend = self.remote.queue.resend.split_off(&(all + 1));
        if before.is_none_or(|(seq, _)| a.seq != seq) {
            // It moved (or went back: it restarted): what it lacks goes out at once.
            let base = self.cfg.status_interval_ms;
            let due = if before.is_some_and(|(seq, _)| a.seq < seq) {
                self.now()
            } else {
                self.now() + base
            };
            self.remote.queue.retransmit.insert(from, (due, base));
        }
        // What g+1 execution nodes executed (progress), and what g+1 hold as a stable
        // checkpoint: our checkpoint waits for the latter, so our garbage collection never
        // drops what a lagging correct execution node may still need from us and cannot get
        // from its peers (they vouch for no checkpoint it could fetch until it votes too).
        let quorum_of = |xs: Vec<Seq>| {
            let mut xs = xs;
            xs.sort_unstable_by(|x, y| y.cmp(x));
            xs.get(self.cfg.exec_quorum() - 1).copied().unwrap_or(0)
        };
        let acked = quorum_of(
            self.remote
                .queue
                .acks
                .values()
                .map(|(seq, _)| *seq)
                .collect(),
        );
        let stable = quorum_of(self.remote.queue.acks.values().map(|(_, s)| *s).collect());
        self.exec_progress(acked, stable);
        Ok(())
    }

    /// Whether the execution pipeline is full: this replica ordered (as primary: proposed;
    /// as a backup: handed to the execution cluster) `exec_inflight_batches_max` batches
    /// beyond what g+1 execution nodes acknowledged. The primary then holds new requests back
    /// (they go out together when the execution cluster catches up), and a backup does not
    /// blame it for that.
    pub(super) fn exec_pipeline_full(&self) -> bool {
        if !self.cfg.separated() {
            return false;
        }
        let ordered = if self.is_primary() {
            self.ordering.proposing.next_seq.saturating_sub(1)
        } else {
            self.exec.last_executed()
        };
        if ordered.saturating_sub(self.remote.queue.acked) < self.cfg.exec_inflight_batches_max {
            return false;
        }
        // A batching aid, not a gate: when acknowledgements stall for a heartbeat (lost, or
        // the execution nodes slow), the primary orders on up to the log window as it would
        // without the bound (simulator seeds 9205 of `--separated` and 605 of `--firewall`,
        // with a quarter of the messages lost, ran out of their liveness budget otherwise).
        self.now()
            < self
                .remote
                .queue
                .ack_progress_ms
                .saturating_add(self.cfg.status_interval_ms)
    }

    /// g+1 execution nodes executed through `acked` and hold a stable checkpoint at
    /// `stable` (from their acknowledgements, or from the firewall's certificates).
    pub(super) fn exec_progress(&mut self, acked: Seq, stable: Seq) {
        if acked > self.remote.queue.acked {
            self.remote.queue.acked = acked;
            self.remote.queue.ack_progress_ms = self.now();
            self.remote.queue.retried_since_progress = false;
            if self.cfg.firewall() {
                // The execution cluster moved: what it lacks next goes out again after one
                // status interval, not after the back-off an earlier outage grew (up to
                // `view_change_timeout_max_ms`). The separated deployment does the same per
                // execution node on its acknowledgements (`on_exec_ack`). Simulator seed 1121
                // of `--firewall`: a piece lost after an execution node's reboot waited 3 s,
                // through two view changes.
                let base = self.cfg.status_interval_ms;
                let due = self.now() + base;
                self.remote.queue.retransmit.insert(0, (due, base));
            }
            // Room in the execution pipeline: what queued goes out.
            self.try_propose();
        }
        if stable <= self.remote.queue.stable_acked {
            return;
        }
        self.remote.queue.stable_acked = stable;
        if self.cfg.firewall() {
            // No per-node acknowledgements behind the firewall: g+1 stable checkpoints (one
            // correct node's) are what the execution nodes fetch state from.
            self.remote.queue.resend = self.remote.queue.resend.split_off(&(stable + 1));
        }
        if let Some(seq) = self
            .remote
            .queue
            .waiting_checkpoint
            .filter(|s| *s <= stable)
        {
            self.remote.queue.waiting_checkpoint = None;
            if seq == self.exec.last_executed() && seq > self.exec.state().latest() {
                self.take_checkpoint(seq);
            }
            self.try_execute();
        }
    }

    /// Execution node `e` sent fresh keys (it refreshes them, or it restarted): what it has
    /// not acknowledged goes out again at once, under keys it can check.
    pub(super) fn executor_rekeyed(&mut self, e: ExecutorId) {
        let base = self.cfg.status_interval_ms;
        self.remote.queue.retransmit.insert(e, (self.now(), base));
    }

    /// Passes an execution node's frame on to its client, unread: only frames of that
    /// execution node itself (its reply or NEW-KEY, which the client authenticates), to a
    /// client of the cluster.
    pub(super) fn on_relay(&mut self, from: ExecutorId, m: Relay) -> Result<(), Reject> {
        if !self.cfg.separated() || self.cfg.firewall() || from >= self.cfg.executors {
            return Err(Reject::Unexpected);
        }
        let to = Principal::Client(m.client);
        if frame_sender(&m.frame) != Some(Principal::Executor(from)) {
            return Err(Reject::Inconsistent);
        }
        if !self.auth.knows(to) && self.auth.session_ref().is_none() {
            return Err(Reject::UnknownSender);
        }
        self.stats.relayed += 1;
        self.out.effects.push(Effect::Send {
            to,
            bytes: Arc::new(m.frame.into_vec()),
        });
        Ok(())
    }

    /// A client's NEW-KEY we accepted carries keys for the execution nodes too: it goes on
    /// to them (clients talk to the agreement nodes only).
    pub(super) fn pass_client_key_on(&mut self, nk: &NewKey) {
        if !self.cfg.separated() || self.cfg.firewall() || self.out.replaying {
            return;
        }
        let bytes: Bytes = Arc::new(seal(
            &self.auth,
            &Message::from(nk.clone()),
            None,
            self.cfg.n(),
        ));
        for e in 0..self.cfg.executors {
            self.out.effects.push(Effect::Send {
                to: Principal::Executor(e),
                bytes: bytes.clone(),
            });
        }
    }

    /// A client asked again for request `ts`, ordered here already: the execution nodes
    /// answer it again (their reply may have been lost).
    /// Behind a firewall: `true` if the certified reply went out again.
    pub(super) fn hint_retry(&mut self, client: ClientId, timestamp: u64) -> bool {
        self.remote.queue.retried_since_progress = true;
        if self.cfg.firewall() {
            // Nothing goes up but agreement certificates: the certified reply, if it came.
            return self.answer_from_certificates(client, timestamp);
        }
        let m = Message::from(Retry {
            replica: self.id,
            client,
            timestamp,
        });
        for e in 0..self.cfg.executors {
            self.send(Principal::Executor(e), &m);
        }
        true
    }

    /// Batches ordered here that the execution cluster does not acknowledge within the
    /// view-change timeout while clients ask for them again: fewer than f+1 replicas may be
    /// sending the execution nodes their pieces (the others lag, or sit in a view nobody
    /// joined), and no request waits in the pool to time out on. A view change brings the
    /// replicas together again; its timeout doubles as for any view change that does not
    /// help (the execution nodes may be down).
    fn check_execution_stall(&mut self, now: u64, last: Seq) {
        if self.remote.queue.acked >= last || !self.views.normal {
            self.remote.queue.ack_progress_ms = now;
            self.remote.queue.retried_since_progress = false;
            return;
        }
        if self.remote.queue.retried_since_progress
            && now
                >= self
                    .remote
                    .queue
                    .ack_progress_ms
                    .saturating_add(self.views.timer.timeout_ms())
        {
            self.stats.execution_stalls += 1;
            self.remote.queue.ack_progress_ms = now;
            self.remote.queue.retried_since_progress = false;
            self.views.timer.back_off();
            self.start_view_change(
                self.views.view.saturating_add(1),
                ViewChangeCause::ExecutionStalled,
            );
        }
    }

    /// Sends each execution node what it has not acknowledged (what the log still holds,
    /// at most `retransmit_entries_max` sequence numbers per round), with back-off.
    pub(super) fn tick_queue(&mut self) {
        if !self.cfg.separated() {
            return;
        }
        let now = self.now();
        let last = self.exec.last_executed();
        self.check_execution_stall(now, last);
        let base = self.cfg.status_interval_ms;
        // Behind a firewall the filters are one destination, and the certificates coming
        // down the acknowledgement of all execution nodes at once.
        let targets = if self.cfg.firewall() {
            1
        } else {
            self.cfg.executors
        };
        for e in 0..targets {
            let acked = if self.cfg.firewall() {
                // A checkpoint waiting for the execution checkpoint certificate asks again
                // with the last piece (its answer brings the certificate down again).
                let stuck = self
                    .remote
                    .queue
                    .waiting_checkpoint
                    .is_some_and(|s| s > self.remote.queue.stable_acked);
                if stuck && self.remote.queue.acked >= last {
                    last.saturating_sub(1)
                } else {
                    self.remote.queue.acked
                }
            } else {
                self.remote.queue.acks.get(&e).map_or(0, |(seq, _)| *seq)
            };
            if acked >= last {
                continue;
            }
            let (due, backoff) = *self
                .remote
                .queue
                .retransmit
                .entry(e)
                .or_insert((now + base, base));
            if now < due {
                continue;
            }
            let backoff2 = (backoff * 2).min(self.cfg.view_change_timeout_max_ms);
            self.remote
                .queue
                .retransmit
                .insert(e, (now + backoff2, backoff2));
            let oldest = self
                .remote
                .queue
                .resend
                .keys()
                .next()
                .copied()
                .unwrap_or(last);
            let from = (acked + 1).max(oldest);
            let to = last.min(from + self.cfg.retransmit_entries_max as Seq - 1);
            for seq in from..=to {
                self.forward_again(e, seq);
            }
        }
    }
}
