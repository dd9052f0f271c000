//! Requests: client requests arriving (authenticated, pooled, answered from the reply
//! table or the read-only path), replies, the request timer, and the primary's proposals.

use super::*;

/// The requests a replica holds: waiting to be ordered or in flight, reads waiting for
/// execution, the request timer, and the clients under suspicion.
pub(super) struct Requests {
    /// Requests waiting to be ordered, in flight, and replaced (see `pool.rs`).
    pub(super) pool: RequestPool,
    /// Read-only requests waiting for everything this replica prepared to execute (one per
    /// client, the latest).
    pub(super) reads: BTreeMap<ClientId, Request>,
    /// The request timer: when it fires (ms), for which client's request (timestamp).
    pub(super) timer: Option<(u64, ClientId, u64)>,
    /// Clients under suspicion, and until when (ms; bounded, see `suspects.rs`).
    pub(super) suspects: BTreeMap<ClientId, u64>,
}

impl Requests {
    pub(super) fn new(cfg: &Config) -> Self {
        Requests {
            pool: RequestPool::new(cfg),
            reads: BTreeMap::new(),
            timer: None,
            suspects: BTreeMap::new(),
        }
    }
}

/// What a replica keeps for proposing, as primary: the next sequence number, the time of its
/// last proposal, and how it is keeping pace.
#[derive(Default)]
pub(super) struct Proposing {
    pub(super) next_seq: Seq,
    /// The proposed time of its last batch (ms; batches' times never go back).
    pub(super) last_time_ms: u64,
    /// While primary: the last time it executed a batch or had none in flight. A primary
    /// whose own proposals do not execute within the view-change timeout suspects itself
    /// (see `tick`).
    pub(super) progress_ms: u64,
    /// PBFT with `primary_pace_window_ms`: the windows of the primary's pace check.
    pub(super) pace: Option<pace::PaceWatch>,
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    // ----- requests ---------------------------------------------------------------------------

    /// A request from `from`; `digest`, if given, is its digest (computed by
    /// [`preopen`](crate::preopen::preopen)).
    pub(super) fn on_request(
        &mut self,
        from: Principal,
        sr: SignedRequest,
        digest: Option<Digest>,
    ) -> Result<(), Reject> {
        let req = &sr.request;
        let client = self.requester(req.client);
        if let Principal::Client(c) = from {
            if c != req.client {
                return Err(Reject::Inconsistent);
            }
        }
        if matches!(client, Principal::Client(_)) && !self.auth.knows(client) {
            return Err(Reject::UnknownSender);
        }
        if req.op.len() > self.cfg.op_bytes_max() {
            return Err(Reject::TooLarge);
        }
        let digest = digest.unwrap_or_else(|| req.digest());
        debug_assert_eq!(digest, req.digest());
        // Reads on the fast path are answered from the state this replica executed (where it
        // runs the service); Prime's other requests are ordered first by the replica they
        // came to.
        let fast_read = req.read_only && self.cfg.read_only_fast_path && self.sink.here();
        if !(self.proposals.leader_batches() || fast_read) {
            return self.on_prime_request(from, sr, digest);
        }
        let mac_ok = self.request_authentic(req, &digest, &sr.auth);
        if !mac_ok && matches!(client, Principal::Client(_)) && self.keying.calls.admitting(client)
        {
            // Under the key of the client's NEW-KEY the key holder is admitting, most likely
            // (a new client's first request comes right behind it, and a backup relays it
            // to the primary at once): `receive` holds the frame and reads it again once
            // the key is in. A signed one too (a new client process signs its first
            // requests), like the others.
            return Err(Reject::KeyPending);
        }
        if !mac_ok {
            self.ask_for_client_key(req.client);
        }
        // Signatures are checked only when the MAC does not verify, when the client is under
        // suspicion (its unsigned requests are not ordered), or at a backup (only a signed
        // request runs its view-change timer: see `arm_request_timer`). A correct client
        // signs its retransmissions only, so backups rarely check one.
        let check = !mac_ok || self.suspected(req.client) || !self.is_primary();
        let signed = check
            && sr
                .sig
                .is_some_and(|s| self.request_signature_valid(req, &digest, &s));
        if !mac_ok && !signed {
            return Err(Reject::BadRequestAuth);
        }
        if signed {
            self.stats.requests_signed += 1;
        }
        // A recovery request authenticates itself by its key-holder signature, which every
        // replica checks alike: signed in the sense of the view-change timer.
        let signed = signed || (mac_ok && recovery_replica(req.client).is_some());
        if fast_read {
            if !matches!(from, Principal::Client(_)) {
                return Err(Reject::Unexpected); // read-only requests are never relayed
            }
            match self.learn_session(&sr.request) {
                Some(true) => {}
                // Its session is asked for: answered once it is open.
                Some(false) => {
                    self.requests.reads.insert(req.client, sr.request);
                    return Ok(());
                }
                None => return Ok(()), // the key holder failed: the client retransmits
            }
            let Some(result) = self.exec.read_only(req) else {
                return Err(Reject::Inconsistent); // flagged read-only but it is not
            };
            if self.requests.reads.is_empty() && self.reads_answerable() {
                // Answered from this execution (executing it again costs as much, and twice
                // the body sealing in a deployment that seals bodies).
                let reply = self.reply(req.client, req.timestamp, &result, true);
                self.send(Principal::Client(req.client), &reply);
                return Ok(());
            }
            self.requests.reads.insert(req.client, sr.request);
            // A read waits for what this replica prepared to commit. The COMMITs it holds back
            // for a tentative batch ride with its next broadcast, or leave on a tick: with no
            // request waiting to make a next batch, they go now, or a client reading its own
            // write (a file system's stat after a write) waits for the tick.
            if !self.reads_answerable() && !self.requests.pool.has_unproposed() {
                self.flush_deferred_commits();
            }
            self.answer_reads();
            return Ok(());
        }
        let ordered = self.exec.last_reply(req.client).map(|l| l.timestamp);
        let from_client = matches!(client, Principal::Client(_));
        if ordered == Some(req.timestamp) && !self.sink.here() && from_client {
            // Ordered already: the execution nodes hold the reply (replicas answer their
            // peers' recovery requests themselves). Behind a firewall, the certified reply
            // if one came down; else the request is ordered again, and the execution nodes
            // answer it in that batch's bundle (Yin et al. §3.2.1: a retransmission takes a
            // new sequence number).
            let answered = self.hint_retry(req.client, req.timestamp);
            if answered || !self.sink.firewall() {
                return Ok(());
            }
        }
        if let Some(last) = self.exec.last_reply(req.client) {
            if req.timestamp < last.timestamp {
                return Err(Reject::Stale);
            }
            let order_again = self.sink.firewall() && from_client;
            if req.timestamp == last.timestamp && !order_again {
                // Already executed: resend the cached reply.
                let tentative = self.resend_reply(req.client);
                if !tentative {
                    return Ok(());
                }
                // Executed only tentatively and the client is still asking: its batch may
                // be stuck short of committing. Wait for it like for any request, so the
                // view-change timer runs.
            }
        }
        let c = req.client;
        let ts = req.timestamp;
        match self.requests.pool.get(c) {
            Some(w) if w.req.request.timestamp > ts => {
                // Older than the client's waiting one (reordered, or lost and sent again),
                // yet not executed here: a pre-prepare may still name it beside itself.
                if self.cfg.travels_beside(req.op.len()) {
                    self.requests.pool.keep_replaced(sr.clone(), digest);
                    self.retry_pending_if_first_missing(c, digest);
                }
                return Err(Reject::Stale);
            }
            Some(w) if w.req.request.timestamp == ts => {
                if w.req.request != sr.request {
                    // A client reusing a timestamp for a different operation: keep the first.
                    return Err(Reject::Conflict);
                }
                // The same request straight from its client: keep the client's authenticator,
                // so a copy relayed with damaged entries for other replicas cannot stick; and
                // a signature, once one arrives.
                let own = matches!(from, Principal::Client(_)) && mac_ok;
                self.requests.pool.refresh(c, own, &sr, signed);
            }
            _ => {
                let own = matches!(from, Principal::Client(_)) && mac_ok;
                self.requests.pool.admit(sr.clone(), digest, signed, own)
            }
        }
        self.retry_pending_if_first_missing(c, digest);
        if self.doubts_request_of(c) {
            // The request we could not authenticate in a pre-prepare may be this one.
            self.vouch_late();
        }
        if self.views.claims.any_doubted() {
            self.vouch_after_leaving(Some(c));
        }
        let multicast = self.cfg.travels_beside(sr.request.op.len());
        if self.is_primary() {
            self.try_propose();
        } else if matches!(from, Principal::Client(_))
            && self.views.normal
            && (!multicast || signed)
        {
            // Relay to the primary, which may not have received it. A large request its
            // client multicast went to the primary too, unless the client is faulty: a
            // signed one, which runs our view-change timer, is relayed all the same, so
            // that a client sending to the backups alone costs no view change.
            let p = self.primary();
            self.send_replica(p, &Message::from(sr));
            self.requests.pool.mark_relayed(c, self.views.view);
        }
        self.arm_request_timer();
        Ok(())
    }

    /// Sends client `c` its cached last reply in full; returns whether it executed only
    /// tentatively.
    pub(super) fn resend_reply(&mut self, c: ClientId) -> bool {
        let Some(last) = self.exec.last_reply(c) else {
            return false;
        };
        let tentative = self
            .exec
            .tentative()
            .is_some_and(|t| t.executed.iter().any(|(x, _)| *x == c));
        let reply = Message::from(Reply {
            view: self.views.view,
            timestamp: last.timestamp,
            client: c,
            replica: self.id,
            digest_only: false,
            tentative,
            result: last.result.clone(),
        });
        let to = self.requester(c);
        self.send(to, &reply);
        tentative
    }

    /// Whether a read-only request can be answered from the executed state now: in a view
    /// in normal operation, nothing tentative, and no request ordered (pre-prepared,
    /// prepared, or claimed prepared by a NEW-VIEW) beyond the last executed one.
    fn reads_answerable(&self) -> bool {
        self.views.normal
            && !self.exec.diverged()
            && self.exec.tentative().is_none()
            && !self.exec.walking()
            && !self
                .ordering
                .order
                .log
                .from(self.exec.last_executed() + 1)
                .any(|(_, s)| s.prepared || s.pp.is_some_and(|d| d != NULL_DIGEST))
            && !self
                .views
                .claims
                .prepared_from(self.exec.last_executed() + 1)
    }

    /// Answers the waiting read-only requests from the executed state, once this replica has
    /// executed and committed everything it prepared: a write whose client saw it complete
    /// was prepared by f+1 correct replicas, so 2f+1 matching answers cannot all predate it.
    /// "Everything it prepared" includes what it prepared in earlier views (its P set) and
    /// what a NEW-VIEW carried over (pre-prepared slots): a view change clears the prepared
    /// marks of the log, and undoes a tentative batch, without the write being any less
    /// complete.
    pub(super) fn answer_reads(&mut self) {
        if self.requests.reads.is_empty() || !self.reads_answerable() {
            return;
        }
        let reads = std::mem::take(&mut self.requests.reads);
        for (c, req) in reads {
            match self.learn_session(&req) {
                Some(true) => {}
                // Its session is asked for: it waits for the answer.
                Some(false) => {
                    self.requests.reads.insert(c, req);
                    continue;
                }
                None => continue,
            }
            let Some(result) = self.exec.read_only(&req) else {
                continue;
            };
            // Marked tentative: an answer from one replica's executed state is never a
            // committed reply, so even a client that took it for an ordered request (its
            // read-only fast path off) needs 2f+1 matching answers.
            let reply = self.reply(c, req.timestamp, &result, true);
            self.send(Principal::Client(c), &reply);
        }
    }

    /// Whether this replica leaves the first replies to the requests of a batch of
    /// `requests` requests to the backups (see `Config::quiet_primary_for`).
    pub(super) fn quiet_for(&self, requests: usize) -> bool {
        self.is_primary() && self.cfg.quiet_primary_for(requests)
    }

    /// The first reply to a request: in full from its designated replier (or for short
    /// results, or without digest replies), as a digest from the others. With a quiet
    /// primary the designated replier is a backup.
    pub(super) fn reply(
        &self,
        client: ClientId,
        timestamp: u64,
        result: &[u8],
        tentative: bool,
    ) -> Message {
        let digest_only = self.cfg.digest_replies
            && result.len() >= DIGEST_REPLY_MIN_BYTES
            && self.designated(client, timestamp) != self.id;
        let result = if digest_only {
            Digest::of(result).0.to_vec()
        } else {
            result.to_vec()
        };
        Message::Client(ClientMessage::Reply(Reply {
            view: self.views.view,
            timestamp,
            client,
            replica: self.id,
            digest_only,
            tentative,
            result,
        }))
    }

    /// The replica that sends the full result of a long reply (digest replies).
    pub(super) fn designated(&self, client: ClientId, timestamp: u64) -> ReplicaId {
        if !self.cfg.primary_replies {
            designated_replier_except(client, timestamp, self.cfg.n(), self.primary())
        } else {
            designated_replier(client, timestamp, self.cfg.n())
        }
    }

    /// Starts the view-change timer for the oldest waiting request if none is running. In
    /// Prime it is the backstop behind Suspect-Leader: a replica left alone in a later view
    /// (it timed out a view change the others finished) takes no part in measuring the
    /// leader, and with f faulty ones the others' measurements then cannot convict it.
    pub(super) fn arm_request_timer(&mut self) {
        if self.requests.timer.is_some() || !self.views.normal || self.is_primary() {
            return;
        }
        // With session keys, only for a signed request (second review, G5): an unsigned one
        // may carry an authenticator that fails at the primary alone (a faulty client),
        // which a correct primary refuses while the backups accept it, and a view change per
        // such request would then be the price of one faulty client. Every replica checks a
        // signature alike, and a backup relays a signed request to the primary. A correct
        // client signs its retransmissions, so a primary that ignores a correct client's
        // request is timed out one client retransmission later. With static keys clients
        // cannot sign, and every request runs the timer. (A suspected client's unsigned
        // requests are not ordered at all.)
        let oldest = self
            .requests
            .pool
            .in_order()
            .find(|(_, w)| self.blames_primary(w))
            .map(|(c, w)| (c, w.req.request.timestamp));
        if let Some((c, ts)) = oldest {
            self.requests.timer = Some((self.now() + self.views.timer.timeout_ms(), c, ts));
            self.relay_timed(c);
        }
    }

    /// The view-change timer now runs for client `c`'s waiting request: the primary gets it
    /// unless we relayed it in this view already. A request that reached us while the view
    /// was changing, or that a view entry's relay (one batch's worth) did not carry, would
    /// otherwise time out at the primary that never had it, and the view change would be
    /// ours alone (simulator `--firewall` seed 1082: a backup holding a retransmission
    /// received during the view change left the view by itself 1.7 s later and stayed out
    /// for the rest of the run). A large request its client multicast is relayed only when
    /// signed, as on arrival.
    fn relay_timed(&mut self, c: ClientId) {
        if !self.proposals.leader_batches() {
            return;
        }
        let Some(w) = self.requests.pool.get(c) else {
            return;
        };
        if w.relayed_in == Some(self.views.view)
            || (self.cfg.travels_beside(w.req.request.op.len()) && !w.signed)
        {
            return;
        }
        let sr = w.req.clone();
        let p = self.primary();
        self.send_replica(p, &Message::from(sr));
        self.requests.pool.mark_relayed(c, self.views.view);
    }

    /// Whether a waiting request left unordered blames the primary (runs the view-change
    /// timer, counts as waiting for the pace check): it may be ordered, and where clients
    /// sign (their keys are in a directory) it is signed (see [`Self::arm_request_timer`]).
    pub(super) fn blames_primary(&self, w: &Waiting) -> bool {
        let clients_sign = self.auth.directory().is_some() && !self.mutant("timer-for-unsigned");
        (w.signed || !clients_sign) && self.orderable(w)
    }

    /// Whether client `c`'s request `ts` (or a later one) waits on this replica alone: it is
    /// in a batch committed here and nothing the primary owes us stands before it (every slot
    /// between what we executed and it is committed too, or a state transfer we run will
    /// jump past them). A request behind a slot that does not commit still blames the primary.
    pub(super) fn committed_here(&self, c: ClientId, ts: u64) -> bool {
        let skip_to = self
            .exec
            .transfer_target()
            .map_or(self.exec.last_executed(), |(seq, _)| seq);
        let holds = |s: &Slot| {
            s.pp.and_then(|d| self.ordering.order.batches.get(&d))
                .is_some_and(|b| {
                    b.requests
                        .iter()
                        .any(|r| r.request.client == c && r.request.timestamp >= ts)
                })
        };
        for n in self.exec.last_executed() + 1.. {
            let Some(s) = self.ordering.order.log.get(&n) else {
                return false;
            };
            if !s.committed && n > skip_to {
                return false;
            }
            if s.committed && holds(s) {
                return true;
            }
        }
        false
    }

    pub(super) fn request_done(&mut self, c: ClientId, ts: u64) {
        self.requests.pool.done(c, ts);
        if let Some((_, tc, tts)) = self.requests.timer {
            if tc == c && tts <= ts {
                self.requests.timer = None;
            }
        }
    }

    // ----- primary: proposing -----------------------------------------------------------

    pub(super) fn try_propose(&mut self) {
        if !self.views.normal
            || !self.is_primary()
            || self.exec.transfer_target().is_some()
            || !self.proposals.leader_batches()
        {
            return;
        }
        loop {
            // A batch executed tentatively here no longer counts as in flight: its replies
            // went out, and the next pre-prepare carries the COMMIT held back for it
            // (`defer_tentative_commits`), which the backups answer with theirs.
            let executed = self
                .exec
                .tentative()
                .map_or(self.exec.last_executed(), |t| t.seq);
            let in_flight = self
                .ordering
                .proposing
                .next_seq
                .saturating_sub(executed + 1);
            if in_flight == 0 {
                // Nothing of ours waits to execute: a stall is measured from here (the
                // first tick may come after the first proposal).
                self.ordering.proposing.progress_ms = self.now();
            }
            if in_flight >= self.cfg.inflight_batches_max
                || self.exec_pipeline_full()
                || self.ordering.proposing.next_seq
                    > self.ordering.ckpt_votes.stable_seq() + self.cfg.log_size
                || self.ordering.proposing.next_seq <= self.ordering.ckpt_votes.stable_seq()
            {
                return;
            }
            // With session keys a pooled request's authenticator goes stale when its client
            // refreshes its keys; backups could not vouch for it. Drop it: the client
            // retransmits under its new keys.
            let recheck = self.uses_session_keys();
            let (picked, stale) = self.requests.pool.next_batch(
                self.cfg.batch_requests_max,
                self.cfg.batch_bytes_max,
                |w| {
                    if !self.orderable(w) {
                        Pick::Skip
                    } else if recheck
                        && !w.signed
                        && !self.request_authentic(&w.req.request, &w.digest, &w.req.auth)
                    {
                        Pick::Stale
                    } else {
                        Pick::Take
                    }
                },
            );
            let requests: Vec<SignedRequest> = picked.iter().map(|w| w.req.clone()).collect();
            let digests: Vec<Digest> = picked.iter().map(|w| w.digest).collect();
            for c in stale {
                self.requests.pool.remove(c);
            }
            if requests.is_empty()
                && self
                    .recovery_progress_target()
                    .is_none_or(|t| self.ordering.proposing.next_seq > t)
            {
                return;
            }
            for r in &requests {
                self.requests
                    .pool
                    .mark_inflight(r.request.client, r.request.timestamp);
            }
            self.propose(requests, &digests, None);
        }
    }

    /// Proposes a batch of `requests` (digests `digests`; Prime: no requests and the summary
    /// `matrix`) at the next sequence number: records and sends the pre-prepare.
    pub(super) fn propose(
        &mut self,
        requests: Vec<SignedRequest>,
        digests: &[Digest],
        matrix: Option<Arc<Matrix>>,
    ) {
        let time_ms = self.now().max(self.ordering.proposing.last_time_ms);
        self.ordering.proposing.last_time_ms = time_ms;
        let batch = Batch {
            nondet: NonDet {
                time_ms,
                seed: self.env.entropy ^ self.ordering.proposing.next_seq.rotate_left(32),
            },
            requests,
            matrix,
        };
        // The requests were hashed when they arrived.
        let digest = batch.digest_with(digests);
        let seq = self.ordering.proposing.next_seq;
        self.ordering.proposing.next_seq += 1;
        let batch = Arc::new(batch);
        let pp = self.lean(seq, digest, &batch, digests);
        self.ordering.order.batches.insert(digest, batch.clone());
        let slot = self.ordering.order.log.slot(seq);
        // A correct primary never assigns a sequence number twice in a view.
        assert!(
            slot.pp.is_none(),
            "r{} proposing n{seq} twice in v{}",
            self.id,
            self.views.view
        );
        slot.pp = Some(digest);
        slot.proposed_here = true;
        if !pp.beside.is_empty() {
            slot.beside = Some(Arc::new(pp.beside.clone()));
        }
        self.persist(Record::PrePrepared {
            view: pp.view,
            seq,
            digest,
            batch: Some(batch.clone()),
            vouched: true,
        });
        self.broadcast(&Message::from(pp));
        self.proposal_accepted(&batch);
        self.check_slot(seq);
    }
}
