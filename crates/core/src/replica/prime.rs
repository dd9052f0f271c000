//! Prime on the replica (ADR 0007; spec prime.md): the host of Prime's own component
//! ([`crate::prime::side::PrimeSide`]: pre-ordering, summary matrices, Suspect-Leader, order
//! keys). This file feeds it what arrives, once authenticated (clients' requests in
//! PO-REQUESTs must carry their clients' signatures), does what it returns (sends, journal
//! records), and ties it to the rest of the replica: the leader's matrices go through the
//! ordinary pre-prepare path every `Δpp`; what an ordered matrix makes eligible runs when it
//! commits, once every PO-REQUEST it needs is held with its certificate (holes are asked for
//! and filled from f+1 matching copies); a leader Suspect-Leader finds slower than the bound
//! the replicas measured is replaced by a view change once 2f+1 replicas vote to leave its
//! view ([`crate::prime::leave`]).

use super::*;
use crate::prime::side::{padded, PrimeSide, TurnWork, Verdict};

mod keys;
pub(super) use keys::installed_key;

/// A PO-REQUEST came to be held: it is acknowledged, may complete certificates (a row), and
/// may be what an ordered matrix waited for.
const HELD_CHANGED: TurnWork = TurnWork {
    introduce: false,
    acks: true,
    row: true,
    matrix: false,
    execute: true,
};

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Whether Prime orders here and is ready (its keys installed).
    pub(super) fn prime_ready(&self) -> bool {
        self.proposals.prime().is_some_and(|p| p.ready())
    }

    /// Prime's component (only called under Prime).
    fn side(&mut self) -> &mut PrimeSide {
        self.proposals.prime_mut().expect("prime")
    }

    fn side_ref(&self) -> &PrimeSide {
        self.proposals.prime().expect("prime")
    }

    // ----- timers -----------------------------------------------------------------------------

    /// Prime's timers: pre-ordering, the leader's proposals, Suspect-Leader, retransmission.
    pub(super) fn prime_tick(&mut self) {
        if !self.prime_ready() {
            return;
        }
        self.prime_turn_end();
        let now = self.now();
        if self.side().preorder_due(now) {
            self.preorder_round();
        }
        if self.side().proposal_due(now) {
            self.prime_propose();
        }
        if self.side_ref().row_due(now) {
            self.sign_row();
        }
        self.side().suspect_tick(now);
        self.apply_proposals();
        self.check_leader();
        if self.side().resend_due(now) {
            let replaying = self.out.replaying;
            self.side().resend(now, replaying);
            self.apply_proposals();
        }
    }

    /// The end of the host's turn: what its inputs asked for, once for all of them
    /// ([`TurnWork`]).
    pub(super) fn prime_turn_end(&mut self) {
        self.handle_arrivals();
        let Some(p) = self.proposals.prime_mut() else {
            return;
        };
        let w = p.take_deferred();
        if !self.prime_ready() {
            return;
        }
        if w.introduce {
            self.introduce();
        }
        if w.acks {
            self.send_acks();
        }
        if w.row {
            self.sign_row();
        }
        if w.matrix {
            self.matrix_changed();
        }
        if w.execute {
            self.try_execute();
        }
    }

    /// The clients' requests and rows this turn brought: their signatures checked in one
    /// batch each, then each handled as it would have been alone ([`Arrivals`]).
    fn handle_arrivals(&mut self) {
        let Some(p) = self.proposals.prime_mut() else {
            return;
        };
        if p.arrivals_empty() {
            return;
        }
        let a = p.take_arrivals();
        if a.requests.len() > 1 {
            let sigs: Vec<(&Request, Digest, RequestSig)> = a
                .requests
                .iter()
                .filter_map(|(_, sr, d)| sr.sig.map(|s| (&sr.request, *d, s)))
                .collect();
            // The verdicts are remembered; each request's own check reads them.
            let _ = self.request_signatures_valid(&sigs);
        }
        for (from, sr, digest) in a.requests {
            if let Err(e) = self.admit_prime_request(from, sr, digest) {
                self.reject(from, "request", e);
            }
        }
        if a.rows.is_empty() {
            return;
        }
        let exec = &self.exec;
        self.side_ref()
            .check_rows_together(&a.rows, &|j| installed_key(exec, j));
        for row in a.rows {
            let from = Principal::Replica(row.row.replica);
            if let Err(e) = self.take_row(row) {
                self.reject(from, "po-aru", e);
            }
        }
    }

    /// Notes work for the end of the turn.
    fn defer(&mut self, w: TurnWork) {
        if let Some(p) = self.proposals.prime_mut() {
            p.defer(w);
        }
    }

    /// Introduces waiting requests, sends due acknowledgements, signs a new row, and sends
    /// the leader our summary when it would make more eligible. (Acknowledgements and rows
    /// also go out as soon as what they report changes; this round catches the rest.)
    fn preorder_round(&mut self) {
        self.introduce();
        self.send_acks();
        self.sign_row();
        self.send_summary();
    }

    /// Acknowledges what we now hold contiguously.
    fn send_acks(&mut self) {
        self.side().send_acks();
        self.apply_proposals();
    }

    /// A backup sends the leader its summary matrix when it would make more eligible than
    /// the leader last proposed or we last sent.
    fn send_summary(&mut self) {
        if !self.views.normal || self.is_primary() {
            return;
        }
        let (now, leader) = (self.now(), self.primary());
        self.side().send_summary(now, leader);
        self.apply_proposals();
    }

    /// Our matrix changed: a backup tells the leader, the leader proposes.
    fn matrix_changed(&mut self) {
        if self.is_primary() {
            self.leader_may_propose();
        } else {
            self.send_summary();
        }
    }

    /// The leader proposes at once while fewer than `inflight_batches_max` of its proposals
    /// wait to execute, and otherwise at most once per `Δpp` (its periodic proposal comes
    /// from the tick).
    pub(super) fn leader_may_propose(&mut self) {
        if !self.is_primary() {
            return;
        }
        let in_flight = self
            .ordering
            .proposing
            .next_seq
            .saturating_sub(self.exec.last_executed() + 1);
        if self.side_ref().may_propose_now(self.now(), in_flight) {
            self.prime_propose();
        }
    }

    /// Our waiting clients' requests (signed, not yet introduced) go out in our next
    /// PO-REQUEST.
    fn introduce(&mut self) {
        if !self.prime_may_speak() || !self.proposals.prime().is_some_and(|p| p.can_introduce()) {
            return;
        }
        let n = self.cfg.n();
        let (picked, _) = self.requests.pool.next_batch(
            self.cfg.batch_requests_max,
            self.cfg.batch_bytes_max,
            |w| {
                // Clients' requests carry their signatures; a recovering replica's
                // carries its key holder's inside.
                if w.req.sig.is_some() || recovery::recovery_of(w.req.request.client, n).is_some() {
                    Pick::Take
                } else {
                    Pick::Skip
                }
            },
        );
        let requests: Vec<SignedRequest> = picked.iter().map(|w| w.req.clone()).collect();
        if requests.is_empty() {
            return;
        }
        for r in &requests {
            self.requests
                .pool
                .mark_inflight(r.request.client, r.request.timestamp);
        }
        self.side().introduce(requests);
        self.apply_proposals();
        // Our own acknowledgement goes with it: when a peer's acknowledgements are slow (or
        // it lags), the certificate needs ours, which would otherwise wait for the next
        // pre-ordering round (`prime_preorder_period_ms`) unless a peer's PO-REQUEST came in
        // this turn. With every client homed here, that made every request wait for a round.
        self.send_acks();
    }

    /// Signs our row if our certificates grew, keeps it in our own matrix, and sends it.
    fn sign_row(&mut self) {
        if !self.prime_may_speak() {
            return;
        }
        let now = self.now();
        if self.side().sign_row(now) {
            self.apply_proposals();
            self.matrix_changed();
        }
    }

    /// The eligibility the proposals in our log make, on top of what we executed.
    fn proposed_eligibility(&self) -> Vec<Seq> {
        let n = self.cfg.n() as usize;
        let f = self.cfg.f as usize;
        let mut e = padded(self.exec.eligible(), n);
        for (_, s) in self.ordering.order.log.from(self.exec.last_executed() + 1) {
            if let Some(m) =
                s.pp.and_then(|d| self.ordering.order.batches.get(&d))
                    .and_then(|b| b.matrix.as_ref())
            {
                e = m.eligible_after(&e, f);
            }
        }
        e
    }

    /// The leader proposes its summary matrix if it makes something new eligible (or, idle,
    /// to reach a recovery point).
    fn prime_propose(&mut self) {
        if !self.views.normal || !self.is_primary() || self.exec.transfer_target().is_some() {
            return;
        }
        if self.ordering.proposing.next_seq
            > self.ordering.ckpt_votes.stable_seq() + self.cfg.log_size
            || self.ordering.proposing.next_seq <= self.ordering.ckpt_votes.stable_seq()
        {
            return;
        }
        let proposed = self.proposed_eligibility();
        // An idle leader still moves the ordinals on to a recovering replica's recovery
        // point (a matrix that makes nothing new eligible runs nothing), one at a time.
        let idle_progress = self.ordering.proposing.next_seq == self.exec.last_executed() + 1
            && self.recovery_progress_target().is_some();
        if !self.side_ref().would_advance(&proposed) && !idle_progress {
            return;
        }
        let now = self.now();
        let matrix = self.side().proposing(now);
        self.propose(Vec::new(), &[], Some(matrix));
    }

    // ----- Suspect-Leader ---------------------------------------------------------------------

    /// Starts a view change when Suspect-Leader finds the leader too slow.
    fn check_leader(&mut self) {
        if !self.views.normal || self.exec.transfer_target().is_some() {
            return;
        }
        let Some((tat_ms, bound_ms)) = self.proposals.prime().and_then(|p| p.leader_too_slow())
        else {
            return;
        };
        self.stats.leaders_suspected += 1;
        self.vote_to_leave(ViewChangeCause::LeaderSlow { tat_ms, bound_ms });
    }

    /// Our own suspicion of the leader (Suspect-Leader's, or a request that waited too long):
    /// a vote to leave the view, which we leave only with 2f+1 ([`crate::prime::leave`]).
    pub(super) fn vote_to_leave(&mut self, cause: ViewChangeCause) {
        if self.mutant("leave-alone") {
            // The broken variant: leave at once, as PBFT does, and maybe be stranded.
            self.views.timer.back_off();
            self.start_view_change(self.views.view.saturating_add(1), cause);
            return;
        }
        if !self.side_ref().leave_voted() {
            self.event(Event::LeaveVoted {
                view: self.views.view,
                cause,
            });
        }
        let now = self.now();
        self.side().vote_to_leave(now);
        self.act_on_leave_votes();
    }

    /// Joins f+1 votes to leave our view; leaves it with 2f+1.
    fn act_on_leave_votes(&mut self) {
        if !self.views.normal || !self.prime_ready() {
            return;
        }
        if self.side_ref().leave_verdict() == Verdict::Join {
            self.event(Event::LeaveVoted {
                view: self.views.view,
                cause: ViewChangeCause::JoinedOthers,
            });
            let now = self.now();
            self.side().vote_to_leave(now);
        }
        if self.side_ref().leave_verdict() == Verdict::Leave {
            let votes = self.side_ref().leave_votes() as u64;
            self.views.timer.back_off();
            self.start_view_change(
                self.views.view.saturating_add(1),
                ViewChangeCause::VotedOut { votes },
            );
        }
    }

    // ----- receiving --------------------------------------------------------------------------

    /// A client's request (but a read-only one on the fast path): it must carry its client's
    /// valid signature; it waits in the pool until we introduce it.
    pub(super) fn on_prime_request(
        &mut self,
        from: Principal,
        sr: SignedRequest,
        digest: Digest,
    ) -> Result<(), Reject> {
        let req = &sr.request;
        let c = req.client;
        match recovery::recovery_of(c, self.cfg.n()) {
            // A recovering replica's request comes from it, and the others introduce it (its
            // own numbering is fenced when the request runs). Its key holder's signature
            // is inside.
            Some(r) => {
                if from != Principal::Replica(r) || r == self.id {
                    return Err(Reject::Unexpected);
                }
                if !self.recovery_authentic(r, req) {
                    return Err(Reject::BadRequestAuth);
                }
            }
            // Clients send to replicas themselves; their signatures are checked together at
            // the turn's end.
            None if !matches!(from, Principal::Client(_)) => return Err(Reject::Unexpected),
            None if sr.sig.is_none() => return Err(Reject::BadRequestAuth),
            None => {
                let back = self.side().hold_request(from, sr, digest);
                return match back {
                    None => Ok(()),
                    Some((from, sr, digest)) => self.admit_prime_request(from, sr, digest),
                };
            }
        }
        self.admit_request(sr, digest)
    }

    /// A client's request to us as its originator, at the turn's end: its signature, then
    /// into the pool.
    fn admit_prime_request(
        &mut self,
        from: Principal,
        sr: SignedRequest,
        digest: Digest,
    ) -> Result<(), Reject> {
        debug_assert!(matches!(from, Principal::Client(_)));
        let trusted = self.mutant("originator-trusts-macs")
            && self.request_authentic(&sr.request, &digest, &sr.auth);
        if !trusted
            && !sr
                .sig
                .is_some_and(|s| self.request_signature_valid(&sr.request, &digest, &s))
        {
            return Err(Reject::BadRequestAuth);
        }
        self.stats.requests_signed += 1;
        self.admit_request(sr, digest)
    }

    /// An authentic request (a client's, or a recovering replica's) into the pool, to be
    /// introduced at the turn's end.
    fn admit_request(&mut self, sr: SignedRequest, digest: Digest) -> Result<(), Reject> {
        let req = &sr.request;
        let c = req.client;
        if let Some(last) = self.exec.last_reply(c) {
            if req.timestamp < last.timestamp {
                return Err(Reject::Stale);
            }
            if req.timestamp == last.timestamp {
                // Run already: the reply again, from the execution nodes where they run
                // clients' requests (replicas answer their peers' recovery requests).
                if self.sink.here() || recovery::recovery_of(c, self.cfg.n()).is_some() {
                    self.resend_reply(c);
                    return Ok(());
                }
                if self.hint_retry(c, req.timestamp) || !self.sink.firewall() {
                    return Ok(());
                }
                // Behind the firewall with no certified reply here: ordered again (Yin et
                // al. §3.2.1), and the execution nodes answer in that batch's bundle.
            }
        }
        match self.requests.pool.get(c) {
            Some(w) if w.req.request.timestamp > req.timestamp => return Err(Reject::Stale),
            Some(w) if w.req.request.timestamp == req.timestamp => {
                if w.req.request != sr.request {
                    return Err(Reject::Conflict);
                }
                self.arm_request_timer();
                return Ok(()); // introduced already, or about to be
            }
            _ => self.requests.pool.admit(sr, digest, true, true),
        }
        self.defer(TurnWork {
            introduce: true,
            ..TurnWork::default()
        });
        self.arm_request_timer();
        Ok(())
    }

    /// Prime's messages from replica `s` (a PO-ARU row may come from anyone: see `dispatch`).
    pub(super) fn on_prime(&mut self, s: ReplicaId, msg: PrimeMessage) -> Result<(), Reject> {
        match msg {
            PrimeMessage::PoRequest(m) => self.on_po_request(s, m),
            PrimeMessage::PoAck(m) => self.on_po_ack(s, m),
            PrimeMessage::PoAru(m) => self.on_po_aru(m),
            PrimeMessage::Summary(m) => self.on_summary(s, m),
            PrimeMessage::Suspicion(m) => self.on_suspicion(s, m),
            PrimeMessage::PoFetch(m) => self.on_po_fetch(s, m),
            PrimeMessage::PoCopy(m) => self.on_po_copy(s, m),
        }
    }

    fn on_po_request(&mut self, from: ReplicaId, req: Arc<PoRequest>) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        self.side_ref()
            .po_request_shape(from, req.originator, &req)?;
        self.check_po_requests(&req)?;
        let new = self.side().on_po_request(req)?;
        if new {
            self.apply_proposals();
            self.defer(HELD_CHANGED);
        }
        Ok(())
    }

    /// The client requests of a PO-REQUEST from its originator: each within the size limit
    /// and authentic to us, by its client's MAC for us or, failing that, by its client's
    /// signature (those checked in one batch). The originator took each request only with a
    /// valid signature (ZIP 215's rules, whose verdict is the same at every replica), so every
    /// correct replica takes a correct originator's PO-REQUEST whatever the MACs say, and
    /// most pay one MAC per request instead of a signature check (ADR 0007).
    fn check_po_requests(&self, req: &PoRequest) -> Result<(), Reject> {
        let n = self.cfg.n();
        if req
            .requests
            .iter()
            .any(|r| r.request.op.len() > self.cfg.op_bytes_max())
        {
            return Err(Reject::Inconsistent); // before any request's authenticity
        }
        let mut signed = Vec::new();
        for r in &req.requests {
            if let Some(rr) = recovery::recovery_of(r.request.client, n) {
                if !self.recovery_authentic(rr, &r.request) {
                    return Err(Reject::BadRequestAuth);
                }
                continue;
            }
            let digest = r.request.digest();
            if self.request_authentic(&r.request, &digest, &r.auth) {
                continue;
            }
            let Some(sig) = r.sig else {
                return Err(Reject::BadRequestAuth);
            };
            signed.push((&r.request, digest, sig));
        }
        if !signed.is_empty() && !self.request_signatures_valid(&signed) {
            return Err(Reject::BadRequestAuth);
        }
        Ok(())
    }

    /// A copy's shape, and whether its client requests are authentic here (as in a
    /// PO-REQUEST: by MAC or signature). A copy is taken with f+1 matching ones or under the
    /// digest 2f+1 replicas acknowledged whether or not they are (`PreOrder::offer`: a correct
    /// replica among them took the requests as authentic; refusing could leave a hole a faulty
    /// originator made with MACs that verify at other replicas only, for good), but on our own
    /// acknowledgement alone only if they are: after a proactive recovery that acknowledgement
    /// may be one the attacker wrote into our journal.
    /// (`check_po_requests` checks every request's size before any authenticity.)
    fn check_po_copy(&self, req: &PoRequest) -> Result<bool, Reject> {
        match self.check_po_requests(req) {
            Err(Reject::Inconsistent) => Err(Reject::Inconsistent),
            checked => Ok(checked.is_ok()),
        }
    }

    fn on_po_ack(&mut self, from: ReplicaId, ack: PoAck) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        self.side().on_po_ack(from, &ack)?;
        self.apply_proposals();
        self.defer(TurnWork {
            row: true,
            execute: true,
            ..TurnWork::default()
        });
        Ok(())
    }

    /// A signed row (it authenticates itself: any sender may pass it on).
    pub(super) fn on_po_aru(&mut self, row: SignedPoAru) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        match self.side().hold_row(row) {
            None => Ok(()), // checked at the turn's end, with the turn's other rows
            Some(row) => self.take_row(row),
        }
    }

    /// A row, checked alone (its verdict decided already if it was in a turn's batch).
    fn take_row(&mut self, row: SignedPoAru) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        let exec = &self.exec;
        let p = self.proposals.prime_mut().expect("prime");
        if p.on_po_aru(row, &|j| installed_key(exec, j))? {
            self.defer(TurnWork {
                matrix: true,
                ..TurnWork::default()
            });
        }
        Ok(())
    }

    /// A summary matrix sent to us as leader: its rows update our matrix.
    fn on_summary(&mut self, from: ReplicaId, s: Summary) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        for row in self.side_ref().summary_rows(from, s)? {
            let _ = self.on_po_aru(row);
        }
        Ok(())
    }

    fn on_suspicion(&mut self, from: ReplicaId, s: Suspicion) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        let now = self.now();
        self.side().on_suspicion(from, &s, now)?;
        self.apply_proposals();
        self.check_leader();
        self.act_on_leave_votes();
        Ok(())
    }

    fn on_po_fetch(&mut self, from: ReplicaId, f: PoFetch) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        // One answer carries at most what a status answer may (a peer asking for everything
        // at once must not make us send gigabytes); it asks again for the rest.
        let budget = self.status_body_budget();
        self.side().on_po_fetch(from, &f, budget)?;
        self.apply_proposals();
        Ok(())
    }

    fn on_po_copy(&mut self, from: ReplicaId, c: PoCopy) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        self.side_ref()
            .po_request_shape(from, c.replica, &c.request)?;
        let authentic = self.check_po_copy(&c.request)?;
        if self.side().on_po_copy(from, c.request, authentic) {
            self.defer(HELD_CHANGED);
        }
        Ok(())
    }
}
