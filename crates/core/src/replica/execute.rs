//! Execution glue and checkpoints: committed (or prepared, tentatively) batches go down to
//! the execution component in order, replies go out, and checkpoints become stable (PBFT
//! §4.3).

use super::*;
use crate::agreement::proposals::Eligible;
use crate::holder::HolderResult;
use crate::keying::Session;

/// A batch agreement committed, next in order, as execution takes it: what the ordering
/// protocol hands down (the sequence number, the digest it agreed on, the batch) and what
/// runs.
pub(super) struct Committed {
    pub(super) seq: Seq,
    /// The digest agreement committed (under Prime, of the leader's matrix proposal).
    pub(super) digest: Digest,
    /// The committed batch; `None` for the null request.
    pub(super) batch: Option<Arc<Batch>>,
    /// Prime: what the batch's matrix made eligible; `None` under PBFT, where the batch
    /// itself runs.
    pub(super) eligible: Option<Eligible>,
}

impl Committed {
    /// The requests that run (`None`: none, the null request).
    pub(super) fn runs(&self) -> Option<&Batch> {
        match &self.eligible {
            Some(e) => Some(&e.run),
            None => self.batch.as_deref(),
        }
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    // ----- execution --------------------------------------------------------------------------

    pub(super) fn try_execute(&mut self) {
        if self.exec.diverged() || self.exec.walking() {
            return;
        }
        if self
            .exec
            .transfer_target()
            .is_some_and(|(seq, _)| seq > self.exec.last_executed())
            && !self
                .ordering
                .order
                .log
                .contains_key(&(self.exec.last_executed() + 1))
        {
            return;
        }
        if let Some(t) = self.exec.tentative() {
            // Within a view the slot keeps its digest (a view change undoes the batch first);
            // should it ever differ, the batch is undone rather than kept or waited for.
            match self.ordering.order.log.get(&t.seq) {
                Some(s) if s.pp != Some(t.digest) => self.undo_tentative(),
                Some(s) if s.committed => self.keep_tentative(),
                _ => {}
            }
        }
        if self.exec.tentative().is_none() {
            loop {
                if self.sink.waiting() {
                    break; // separated: the checkpoint waits for the execution cluster
                }
                let Some(c) = self.next_committed() else {
                    break;
                };
                if c.runs().is_some_and(|b| !self.learn_sessions(b)) {
                    break; // the key holder failed: retried on the next tick
                }
                self.execute_committed(c);
            }
            self.try_tentative();
        }
        self.answer_reads();
        if self.is_primary() {
            self.try_propose();
        }
    }

    /// Executes the next batch tentatively if it is prepared (everything before it executed
    /// and committed). Never a recovery request (its effects on keys are not undone), never
    /// while replaying, recovering or off the normal case.
    pub(super) fn try_tentative(&mut self) {
        if !self.cfg.tentative_execution
            || !self.sink.here()
            || self.exec.tentative().is_some()
            || self.out.replaying
            || !self.views.normal
            || self.recovery.is_some()
            || self.exec.transfer_target().is_some()
        {
            return;
        }
        let n = self.exec.last_executed() + 1;
        let Some(slot) = self.ordering.order.log.get(&n) else {
            return;
        };
        if !slot.prepared || slot.committed {
            return;
        }
        let Some(d) = slot.pp.filter(|d| *d != NULL_DIGEST) else {
            return;
        };
        let Some(batch) = self.ordering.order.batches.get(&d).cloned() else {
            return;
        };
        if !self.executes_tentatively(&batch) || !self.learn_sessions(&batch) {
            return;
        }
        self.exec.begin_tentative();
        let executed = self.apply(n, &batch, true);
        self.stats.tentative_batches += 1;
        self.exec.hold_tentative(n, d, batch, executed);
    }

    /// Whether `batch` is of the kind that executes tentatively once prepared: small enough
    /// (`tentative_batch_max`), in the co-located deployment, and holding no recovery request
    /// (its effects on keys are not undone). The same at every replica.
    pub(super) fn executes_tentatively(&self, batch: &Batch) -> bool {
        let nn = self.cfg.n();
        self.cfg.tentative_for(batch.requests.len())
            && self.sink.here()
            && !batch
                .requests
                .iter()
                .any(|r| recovery::recovery_of(r.request.client, nn).is_some())
    }

    /// The tentative batch committed: its effects stay, and it completes like any batch.
    pub(super) fn keep_tentative(&mut self) {
        let Some(t) = self.exec.keep_tentative() else {
            return;
        };
        self.persist_executed(t.seq, t.digest, Some(&t.batch));
        self.finish_execution(t.seq, t.digest, t.digest, Some(&*t.batch), t.executed);
    }

    /// Undoes the tentative batch, if any (a view change, or state about to be replaced).
    /// Its clients learn the outcome from the batch's re-execution in a later view, or
    /// retransmit.
    pub(super) fn undo_tentative(&mut self) {
        let seq = match self.exec.undo_tentative() {
            None => return,
            Some(Undone::Clean { seq }) => seq,
            Some(Undone::Corrupt { seq }) => {
                // The pages were consistent before the batch: our state must be corrupt.
                self.event(Event::StateCorrupt { pages: 0 });
                self.on_divergence();
                seq
            }
        };
        self.stats.tentative_undone += 1;
        self.event(Event::TentativeUndone { seq });
    }

    /// Whether the body sessions `batch`'s requests were sealed in are known here (see
    /// `execution/sessions.rs`); those that are not are asked of the key holder, and the
    /// batch waits for the answers (retried on the next tick if the key holder failed),
    /// since every executor must run it alike.
    pub(super) fn learn_sessions(&mut self, batch: &Batch) -> bool {
        let n = self.cfg.n();
        let mut ready = true;
        for r in &batch.requests {
            if recovery::recovery_of(r.request.client, n).is_some() {
                continue;
            }
            match self.learn_session(&r.request) {
                Some(true) => {}
                // Every session missing is asked for at once.
                Some(false) => ready = false,
                None => return false,
            }
        }
        ready
    }

    /// Like [`Replica::learn_sessions`] for one request: `Some(true)` if it may run,
    /// `Some(false)` while its session is asked for, `None` if the key holder failed.
    pub(super) fn learn_session(&mut self, req: &Request) -> Option<bool> {
        if !self.sink.here() {
            return Some(true); // the execution nodes open bodies, not the replicas
        }
        let now = self.now();
        let at_once = self.out.replaying;
        match self
            .keying
            .body_session(&mut self.exec, &mut self.auth, req, now, at_once)
        {
            Session::Ready { opened } => {
                self.stats.body_sessions_opened += opened as u64;
                Some(true)
            }
            Session::Asked(call) => {
                if let Some(call) = call {
                    self.out.effects.push(Effect::Holder(call));
                }
                Some(false)
            }
            Session::Failed(e) => {
                self.event(Event::KeyHolderFailed(e.to_string()));
                None
            }
        }
    }

    /// The key holder answered the call opening `client`'s body session `enc` (`None`: it
    /// was given up): what waited for it runs.
    pub(super) fn body_session_answered(
        &mut self,
        client: ClientId,
        enc: [u8; redoubt_crypto::body::ENC_LEN],
        result: Option<HolderResult>,
    ) {
        match self
            .keying
            .body_session_answered(&mut self.exec, client, enc, result)
        {
            Ok(()) => {
                self.stats.body_sessions_opened += 1;
                self.try_execute();
                self.answer_reads();
            }
            Err(e) => self.event(Event::KeyHolderFailed(e.to_string())),
        }
    }

    /// The next batch in order, if agreement committed it and execution can take it: `None`
    /// while its slot has not committed, while its body is fetched (through status messages),
    /// or under Prime while a PO-REQUEST its matrix needs is missing (asked for meanwhile).
    fn next_committed(&mut self) -> Option<Committed> {
        let seq = self.exec.last_executed() + 1;
        let slot = self.ordering.order.log.get(&seq)?;
        if !slot.committed {
            return None;
        }
        let digest = slot.pp.expect("committed implies pre-prepared");
        if digest == NULL_DIGEST {
            return Some(Committed {
                seq,
                digest,
                batch: None,
                eligible: None,
            });
        }
        let batch = self.ordering.order.batches.get(&digest).cloned()?;
        let eligible = self.proposal_runs(seq, &digest, &batch)?;
        Some(Committed {
            seq,
            digest,
            batch: Some(batch),
            eligible,
        })
    }

    /// Executes `c`, the next batch in order.
    pub(super) fn execute_committed(&mut self, c: Committed) {
        let Committed {
            seq,
            digest,
            batch,
            eligible,
        } = c;
        debug_assert_eq!(seq, self.exec.last_executed() + 1);
        let Some(Eligible { run, after }) = eligible else {
            debug_assert_eq!(digest, batch.as_ref().map_or(NULL_DIGEST, |b| b.digest()));
            self.persist_executed(seq, digest, batch.as_ref());
            let executed = match &batch {
                Some(b) => self.apply(seq, b, false),
                None => Vec::new(),
            };
            self.finish_execution(seq, digest, digest, batch.as_deref(), executed);
            return;
        };
        // Prime: the matrix batch is what was agreed and journaled; what it made eligible
        // runs, and the eligibility it leaves is recorded first.
        let proposal = batch.expect("a matrix batch");
        let before = self.exec.eligible().to_vec();
        self.persist(Record::Ran {
            seq,
            eligible: after.clone(),
            requests: run.requests.clone(),
        });
        self.persist_executed(seq, digest, Some(&proposal));
        let executed = self.apply(seq, &run, false);
        let fenced = self.proposals.fence(&after);
        self.exec.set_eligible(fenced.clone());
        self.proposal_ran(&proposal, &before, &after, &fenced);
        if fenced != after {
            // A recovery ran: keys and numbering changed.
            self.refresh_incarnations();
        }
        self.finish_execution(seq, digest, run.digest(), Some(&run), executed);
    }

    /// Runs a batch's requests against the service (exactly once per client timestamp) and
    /// replies to their clients. Returns the requests executed.
    pub(super) fn apply(&mut self, seq: Seq, b: &Batch, tentative: bool) -> Vec<(ClientId, u64)> {
        let mut executed = Vec::new();
        let quiet = self.quiet_for(b.requests.len());
        // Unless the service runs here, the execution nodes run the requests and answer the
        // clients; here they are only ordered (and recorded, exactly once).
        let here = self.sink.here();
        let recoveries = self.recoveries();
        let done = self.exec.run_batch(seq, b, here, &recoveries);
        self.stats.bodies_refused = self.exec.bodies_refused();
        for step in done.steps {
            let (index, result) = match step {
                Step::Again { .. } => continue, // exactly once
                Step::Ran { index, result } => (index, result),
                Step::Recovery {
                    index,
                    replica,
                    accepted,
                    result,
                } => {
                    if accepted {
                        self.recovery_executed(replica, seq);
                    }
                    (index, result)
                }
            };
            let req = &b.requests[index].request;
            let (c, ts) = (req.client, req.timestamp);
            executed.push((c, ts));
            if self.out.replaying {
                continue;
            }
            let to = self.requester(c);
            if !here && matches!(to, Principal::Client(_)) {
                continue;
            }
            let reply = (!(quiet && matches!(to, Principal::Client(_))))
                .then(|| self.reply(c, ts, &result, tentative));
            match (to, reply) {
                (_, None) => {} // a quiet primary: the backups answer
                (Principal::Replica(r), Some(Message::Client(ClientMessage::Reply(m))))
                    if r == self.id =>
                {
                    let _ = self.on_recovery_reply(r, m);
                }
                (to, Some(reply)) => self.send(to, &reply),
            }
        }
        executed
    }

    /// Completes the execution of batch `seq` (its requests ran, committed): it settles its
    /// requests, advances `last_executed`, and takes a checkpoint when one is due. `ran` is
    /// the digest of what ran: under Prime the proposal's digest names a matrix, and the
    /// event names the requests its ordinal ran, so that two replicas running different
    /// versions of one PO-REQUEST differ in it (the simulator's agreement check, second
    /// review G1).
    pub(super) fn finish_execution(
        &mut self,
        seq: Seq,
        digest: Digest,
        ran: Digest,
        batch: Option<&Batch>,
        executed: Vec<(ClientId, u64)>,
    ) {
        if let Some(b) = batch {
            // Every request of the batch is settled (executed now or before).
            for r in &b.requests {
                let (c, ts) = (r.request.client, r.request.timestamp);
                let done = self.exec.settled(c, ts);
                self.request_done(c, done);
            }
        }
        self.exec.complete(seq, digest);
        self.ordering.proposing.progress_ms = self.now();
        self.stats.batches_executed += 1;
        self.stats.requests_executed += executed.len() as u64;
        if !executed.is_empty() {
            self.views.timer.executed();
        }
        self.event(Event::Executed {
            seq,
            view: self.views.view,
            digest: ran,
            requests: executed,
        });
        self.arm_request_timer();
        if !self.sink.here() {
            // What ran goes down (under Prime, the requests the matrix made eligible, which
            // every correct replica derives alike).
            self.forward(seq, ran, batch);
        }
        if seq.is_multiple_of(self.cfg.checkpoint_interval) && !self.checkpoint_waits(seq) {
            self.take_checkpoint(seq);
        }
    }

    // ----- checkpoints ------------------------------------------------------------------------

    pub(super) fn take_checkpoint(&mut self, seq: Seq) {
        debug_assert!(seq > self.exec.state().latest(), "checkpoints advance");
        let Some(digest) = self.exec.checkpoint(seq) else {
            return;
        };
        self.exec.note_checkpoint(seq, digest);
        self.proposals.checkpoint(seq, self.exec.eligible());
        self.event(Event::CheckpointTaken { seq, digest });
        let id = self.id;
        self.broadcast(&Message::from(Checkpoint {
            seq,
            digest,
            replica: id,
        }));
        self.ordering.ckpt_votes.record(self.id, seq, digest);
        self.check_checkpoint(seq);
    }

    pub(super) fn on_checkpoint(&mut self, from: ReplicaId, c: Checkpoint) -> Result<(), Reject> {
        if c.replica != from || !c.seq.is_multiple_of(self.cfg.checkpoint_interval) {
            return Err(Reject::Inconsistent);
        }
        let repairing = self.exec.repairing();
        if c.seq < self.ordering.ckpt_votes.stable_seq()
            || (c.seq == self.ordering.ckpt_votes.stable_seq() && !repairing)
        {
            return Ok(()); // old news
        }
        self.ordering.ckpt_votes.record(from, c.seq, c.digest);
        self.check_checkpoint(c.seq);
        // A new stable checkpoint may open the window for more proposals.
        self.try_propose();
        Ok(())
    }

    pub(super) fn check_checkpoint(&mut self, seq: Seq) {
        let repairing = self.exec.repairing();
        if seq < self.ordering.ckpt_votes.stable_seq()
            || (seq == self.ordering.ckpt_votes.stable_seq() && !repairing)
        {
            return;
        }
        // Which digest, if any, is vouched for by f+1 (known correct) or 2f+1 (stable)?
        let Some((digest, count)) = self.ordering.ckpt_votes.leading(seq) else {
            return;
        };
        if count < self.cfg.weak_quorum() {
            return;
        }
        if self.exec.repairing() && seq >= self.exec.state().latest() {
            // Our state is known bad: fetch the vouched checkpoint, even our own seq.
            self.start_transfer(seq, digest, true);
            return;
        }
        match self.exec.own_checkpoint(seq) {
            Some(own) if own == digest && count >= self.cfg.quorum() => {
                self.make_stable(seq, digest);
            }
            Some(own) if own == digest => {}
            Some(_) => {
                // f+1 replicas vouch for another digest: our state is wrong. Fetch theirs.
                self.event(Event::StateDivergence { seq });
                self.exec.forget_checkpoint(seq);
                self.on_divergence();
                self.start_transfer(seq, digest, true);
            }
            None if seq > self.exec.last_executed() => {
                let urgent = seq
                    > self
                        .ordering
                        .ckpt_votes
                        .stable_seq()
                        .saturating_add(self.cfg.log_size)
                    || seq >= self.exec.last_executed().saturating_add(self.cfg.log_size);
                self.start_transfer(seq, digest, urgent);
            }
            None => {}
        }
    }

    pub(super) fn make_stable(&mut self, seq: Seq, digest: Digest) {
        self.release_send_cap_after(seq);
        if seq <= self.ordering.ckpt_votes.stable_seq() {
            return;
        }
        if self.exec.own_checkpoint(seq).is_some() && self.exec.state().held(seq).is_some() {
            // The state's durable base moves first; the journal may then forget older records.
            self.exec.state_mut().commit_base(seq);
            self.persist(Record::Checkpoint { seq, digest });
        } else {
            self.persist(Record::Watermark { seq, digest });
        }
        self.ordering.ckpt_votes.set_stable(seq, digest);
        self.ordering.order.log.forget_through(seq);
        self.ordering.order.pending_pp = self.ordering.order.pending_pp.split_off(&(seq + 1));
        self.exec.forget_executed_through(seq);
        self.exec.forget_checkpoints_below(seq);
        self.ordering.ckpt_votes.forget_through(seq);
        self.views.claims.forget_through(seq);
        if self.ordering.proposing.next_seq <= seq {
            self.ordering.proposing.next_seq = seq + 1;
        }
        self.gc_batches();
        self.proposals.stable(seq);
        self.event(Event::Stable { seq });
    }

    /// Bodies of the batches PSet and QSet name, for the journal.
    pub(super) fn pset_batches(&self) -> Vec<Batch> {
        if self.out.replaying {
            return Vec::new();
        }
        // And those of the doubted slots, which join Q once their requests verify.
        let ds: BTreeSet<Digest> = self.views.claims.digests().collect();
        ds.iter()
            .filter_map(|d| self.ordering.order.batches.get(d).map(|b| (**b).clone()))
            .collect()
    }

    /// The bodies we hold of `digests`, in order, up to half the message size limit: a message
    /// carrying them always fits; receivers ask for the rest through status messages.
    pub(super) fn bodies_within_budget(&self, digests: &[Digest], budget: usize) -> Vec<Batch> {
        let per_request = 64 + 16 * self.cfg.n() as usize;
        let mut used = 0usize;
        let mut out = Vec::new();
        for d in digests.iter().filter(|d| **d != NULL_DIGEST) {
            let Some(b) = self.ordering.order.batches.get(d) else {
                continue;
            };
            let size = b.op_bytes() + per_request * b.requests.len() + 64;
            if used + size > budget {
                break;
            }
            used += size;
            out.push((**b).clone());
        }
        out
    }

    /// Most bytes of request operations one answer to a status message carries, in
    /// retransmitted pre-prepares and in batch bodies each: two full batches. A replica that
    /// fell behind under load asks at every status interval; answering each status with up to
    /// half the largest message (16 MiB by default) from every replica kept the others
    /// busy sending it what it could not process in time (4 KiB writes on capped replicas:
    /// about 40% of every replica's CPU), so it fell further behind.
    pub(super) fn status_body_budget(&self) -> usize {
        (2 * self.cfg.batch_bytes_max).min(self.cfg.message_bytes_max / 2)
    }

    /// Whether this replica sends batch bodies asked for in `from`'s status messages now. One
    /// replica at a time does, in turns of one status interval by its own clock over the
    /// replicas other than `from`: every status asks everyone, and n-1 copies of each body
    /// were all but one wasted. A faulty replica's turn answers nothing; the asker asks
    /// again at its next status and a correct replica's turn comes within f+1 turns. Clocks
    /// out of step only make two replicas answer, or none, for part of a turn.
    pub(super) fn answers_bodies_to(&self, from: ReplicaId) -> bool {
        let n = self.cfg.n() as u64;
        if n < 2 {
            return true;
        }
        let turn = (self.now() / self.cfg.status_interval_ms.max(1)) % (n - 1);
        // The replicas other than `from`, in id order; the turn picks one of them.
        let pick = if turn < from as u64 { turn } else { turn + 1 };
        pick == self.id as u64
    }

    /// Keeps only batch bodies something still refers to.
    pub(super) fn gc_batches(&mut self) {
        let mut keep: BTreeSet<Digest> = BTreeSet::new();
        keep.extend(self.ordering.order.log.values().filter_map(|s| s.pp));
        keep.extend(self.views.claims.digests());
        for nv in self.views.pending_nv.iter() {
            keep.extend(nv.chosen.iter().copied());
        }
        self.ordering.order.batches.retain(|d, _| keep.contains(d));
    }
}
