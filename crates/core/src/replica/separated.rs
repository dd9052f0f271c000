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

use super::firewall::FirewallSide;
use super::*;
use crate::agreement::queue::{ExecQueue, QueueRules};
use crate::seal::seal_to_executors;
use crate::types::ExecutorId;

/// Where this replica's committed batches go, chosen when it is made from its configuration
/// (ADR 0009): the replica asks it, not the configuration, what to do with a batch, and it
/// holds what going elsewhere needs.
pub(super) enum Sink {
    /// It runs them and answers the clients (co-located): it opens clients' bodies, executes
    /// tentatively, answers reads on the fast path and seals its state for transfer.
    Here,
    /// The execution nodes run them and answer the clients (separated deployment): the
    /// replica only records which request of each client was ordered, and hands the batches
    /// down through the message queue.
    ExecutionNodes { queue: ExecQueue },
    /// The execution nodes behind the privacy firewall: only certificates come back, and a
    /// client asking again has its request ordered again. `side` holds the firewall's keys
    /// and what came down (see `firewall.rs`), from [`Replica::with_firewall`].
    Firewall {
        queue: ExecQueue,
        side: Option<Box<FirewallSide>>,
    },
}

impl Sink {
    pub(super) fn of(cfg: &Config) -> Sink {
        match (cfg.executors, cfg.filter_rows) {
            (0, _) => Sink::Here,
            (_, 0) => Sink::ExecutionNodes {
                queue: ExecQueue::default(),
            },
            _ => Sink::Firewall {
                queue: ExecQueue::default(),
                side: None,
            },
        }
    }

    /// Whether the service runs here (see [`Sink::Here`]).
    pub(super) fn here(&self) -> bool {
        matches!(self, Sink::Here)
    }

    /// Whether the execution nodes stand behind the privacy firewall.
    pub(super) fn firewall(&self) -> bool {
        matches!(self, Sink::Firewall { .. })
    }

    /// The queue towards the execution cluster, unless the service runs here.
    pub(super) fn queue(&self) -> Option<&ExecQueue> {
        match self {
            Sink::Here => None,
            Sink::ExecutionNodes { queue } | Sink::Firewall { queue, .. } => Some(queue),
        }
    }

    pub(super) fn queue_mut(&mut self) -> Option<&mut ExecQueue> {
        match self {
            Sink::Here => None,
            Sink::ExecutionNodes { queue } | Sink::Firewall { queue, .. } => Some(queue),
        }
    }

    /// The firewall's keys and what came down, behind a firewall once it has its keys.
    pub(super) fn side(&self) -> Option<&FirewallSide> {
        match self {
            Sink::Firewall { side, .. } => side.as_deref(),
            _ => None,
        }
    }

    pub(super) fn side_mut(&mut self) -> Option<&mut FirewallSide> {
        match self {
            Sink::Firewall { side, .. } => side.as_deref_mut(),
            _ => None,
        }
    }

    /// Whether a checkpoint waits for the execution cluster (nothing executes meanwhile).
    pub(super) fn waiting(&self) -> bool {
        self.queue().is_some_and(|q| q.waiting())
    }

    /// How far g+1 execution nodes executed (0 where the service runs here).
    pub(super) fn acked(&self) -> Seq {
        self.queue().map_or(0, |q| q.acked())
    }

    /// The highest checkpoint g+1 execution nodes hold as stable.
    pub(super) fn stable_acked(&self) -> Seq {
        self.queue().map_or(0, |q| q.stable_acked())
    }
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
        let rules = self.queue_rules();
        if let Some(q) = self.sink.queue_mut() {
            q.forwarded(&rules, seq, digest, batch.map(|b| Arc::new(b.clone())));
        }
        if self.out.replaying || self.above_cap(&msg) {
            return;
        }
        if self.sink.firewall() {
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
        let Some((d, batch)) = self.sink.queue().and_then(|q| q.kept(seq)).cloned() else {
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
        if self.sink.firewall() {
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
        let replaying = self.out.replaying;
        self.sink
            .queue_mut()
            .is_some_and(|q| q.checkpoint_waits(seq, replaying))
    }

    pub(super) fn on_exec_ack(&mut self, from: ExecutorId, a: ExecAck) -> Result<(), Reject> {
        if !matches!(self.sink, Sink::ExecutionNodes { .. })
            || from >= self.cfg.executors
            || a.executor != from
        {
            return Err(Reject::Unexpected);
        }
        if a.stable > a.seq {
            return Err(Reject::Inconsistent);
        }
        let (rules, now) = (self.queue_rules(), self.now());
        if let Some((acked, stable)) = self
            .sink
            .queue_mut()
            .and_then(|q| q.acknowledged(&rules, from, a.seq, a.stable, now))
        {
            self.exec_progress(acked, stable);
        }
        Ok(())
    }

    /// Whether the execution pipeline is full: this replica ordered (as primary: proposed;
    /// as a backup: handed to the execution cluster) `exec_inflight_batches_max` batches
    /// beyond what g+1 execution nodes acknowledged. The primary then holds new requests back
    /// (they go out together when the execution cluster catches up), and a backup does not
    /// blame it for that.
    pub(super) fn exec_pipeline_full(&self) -> bool {
        if self.sink.here() {
            return false;
        }
        let ordered = if self.is_primary() {
            self.ordering.proposing.next_seq.saturating_sub(1)
        } else {
            self.exec.last_executed()
        };
        let max = self.cfg.exec_inflight_batches_max;
        let (rules, now) = (self.queue_rules(), self.now());
        self.sink
            .queue()
            .is_some_and(|q| q.pipeline_full(&rules, ordered, max, now))
    }

    /// g+1 execution nodes executed through `acked` and hold a stable checkpoint at
    /// `stable` (from their acknowledgements, or from the firewall's certificates).
    pub(super) fn exec_progress(&mut self, acked: Seq, stable: Seq) {
        let (rules, now) = (self.queue_rules(), self.now());
        if self
            .sink
            .queue_mut()
            .is_some_and(|q| q.executed(&rules, acked, now))
        {
            // Room in the execution pipeline: what queued goes out.
            self.try_propose();
        }
        if let Some(seq) = self.sink.queue_mut().and_then(|q| q.stable(&rules, stable)) {
            if seq == self.exec.last_executed() && seq > self.exec.state().latest() {
                self.take_checkpoint(seq);
            }
            self.try_execute();
        }
    }

    /// Execution node `e` sent fresh keys (it refreshes them, or it restarted): what it has
    /// not acknowledged goes out again at once, under keys it can check.
    pub(super) fn executor_rekeyed(&mut self, e: ExecutorId) {
        let (rules, now) = (self.queue_rules(), self.now());
        if let Some(q) = self.sink.queue_mut() {
            q.rekeyed(&rules, e, now);
        }
    }

    /// Passes an execution node's frame on to its client, unread: only frames of that
    /// execution node itself (its reply or NEW-KEY, which the client authenticates), to a
    /// client of the cluster.
    pub(super) fn on_relay(&mut self, from: ExecutorId, m: Relay) -> Result<(), Reject> {
        if !matches!(self.sink, Sink::ExecutionNodes { .. }) || from >= self.cfg.executors {
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
        if !matches!(self.sink, Sink::ExecutionNodes { .. }) || self.out.replaying {
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
        if let Some(q) = self.sink.queue_mut() {
            q.retried();
        }
        if self.sink.firewall() {
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
        let (normal, timeout) = (self.views.normal, self.views.timer.timeout_ms());
        if self
            .sink
            .queue_mut()
            .is_some_and(|q| q.stalled(now, last, normal, timeout))
        {
            self.stats.execution_stalls += 1;
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
        if self.sink.here() {
            return;
        }
        let now = self.now();
        let last = self.exec.last_executed();
        self.check_execution_stall(now, last);
        let rules = self.queue_rules();
        let due = self
            .sink
            .queue_mut()
            .map(|q| q.due(&rules, now, last))
            .unwrap_or_default();
        for (e, seqs) in due {
            for seq in seqs {
                self.forward_again(e, seq);
            }
        }
    }

    /// The rules of the queue towards the execution cluster, from our configuration.
    fn queue_rules(&self) -> QueueRules {
        QueueRules {
            executors: self.cfg.executors,
            exec_quorum: self.cfg.exec_quorum(),
            interval_ms: self.cfg.status_interval_ms,
            backoff_max_ms: self.cfg.view_change_timeout_max_ms,
            entries_max: self.cfg.retransmit_entries_max as Seq,
            resend_max: resend_max(&self.cfg),
            firewall: self.sink.firewall(),
        }
    }
}
