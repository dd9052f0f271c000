//! Prime on the replica (ADR 0007; spec prime.md): the replica introduces its clients'
//! requests in PO-REQUESTs, acknowledges what it holds, signs and sends its PO-ARU row, and
//! sends its summary matrix to the leader; the leader proposes a summary matrix every `Δpp`
//! through the ordinary pre-prepare path; what an ordered matrix makes eligible runs when it
//! commits, once every PO-REQUEST it needs is held with its certificate (holes are asked for
//! and filled from f+1 matching copies); Suspect-Leader replaces a leader slower than the bound
//! the replicas measured.
//!
//! The pure parts live in `crate::prime`; this file feeds them what arrives and sends what they
//! return. Bounds: the pre-ordering window per originator (`prime_window`), one row per
//! replica, Suspect-Leader's own bounds, and at most `batch_requests_max` requests per
//! PO-REQUEST.

use super::*;
use crate::prime::matrix::{newly_eligible, RowOrder};
use crate::prime::preorder::{PreOrder, PreOrderConfig};
use crate::prime::suspect::{Out, Suspect, SuspectConfig};
use redoubt_crypto::pk::{HolderSecrets, VerifyKey};

mod keys;
use keys::PrimeKeys;

/// The replica's Prime state.
pub(super) struct PrimeSide {
    keys: Option<PrimeKeys>,
    pub(super) po: PreOrder,
    pub(super) sus: Suspect,
    next_preorder_ms: u64,
    next_proposal_ms: u64,
    next_resend_ms: u64,
    /// When we may next ask for the holes of an ordered matrix, and for what peers hold that
    /// we lack: separate limits, so the second (which faulty peers can inflate) never delays
    /// the first.
    next_hole_fetch_ms: u64,
    next_fetch_ms: u64,
    /// When the leader last proposed (proposals are paced by `Δpp`).
    last_proposal_ms: u64,
    /// What our last summary to the leader, or the last proposal we accepted, made eligible:
    /// a summary goes only when our matrix would make more eligible.
    summarized: Vec<Seq>,
    /// The eligibility at each of our checkpoints above the stable one: certified copies of
    /// what ran are kept until a checkpoint covering them is stable.
    at_checkpoint: BTreeMap<Seq, Vec<Seq>>,
    /// Our latest signed row (resent at every status interval: rows are not retransmitted
    /// otherwise).
    row: Option<SignedPoAru>,
    /// Fresh order keys drawn for our recovery requests (the latest few, from the journal
    /// after a restart): the one our accepted recovery named becomes ours when it executes
    /// here.
    drawn: Vec<HolderSecrets>,
    /// Replicas whose accepted recovery request the ordinal executing now ran: their
    /// pre-ordering numbering is fenced when it completes.
    fences: Vec<ReplicaId>,
}

impl PrimeSide {
    pub(super) fn new(cfg: &Config, me: ReplicaId, view: View) -> PrimeSide {
        let n = cfg.n() as usize;
        #[allow(unused_mut)]
        let mut side = PrimeSide {
            keys: None,
            po: PreOrder::new(
                PreOrderConfig {
                    n: cfg.n(),
                    f: cfg.f,
                    window: cfg.prime_window,
                },
                me,
            ),
            sus: Suspect::new(suspect_config(cfg), me, view, 0),
            next_preorder_ms: 0,
            next_proposal_ms: 0,
            next_resend_ms: 0,
            next_hole_fetch_ms: 0,
            next_fetch_ms: 0,
            last_proposal_ms: 0,
            summarized: vec![0; n],
            at_checkpoint: BTreeMap::new(),
            row: None,
            drawn: Vec::new(),
            fences: Vec::new(),
        };
        #[cfg(feature = "mutants")]
        match cfg.mutant {
            crate::types::Mutant::LeaderNeverSuspected => side.sus.never_suspect(),
            crate::types::Mutant::PoAcksAtF => side.po.certify_at_f(),
            _ => {}
        }
        side
    }

    /// The rank of each column's entry that cuts what an ordered matrix makes eligible:
    /// the (2f+1)-th highest.
    fn cut_rank(cfg: &Config) -> usize {
        #[cfg(feature = "mutants")]
        if cfg.mutant == crate::types::Mutant::CutWithoutQuorum {
            return 0;
        }
        2 * cfg.f as usize
    }

    /// Prime's share of [`Replica::footprint`].
    pub(super) fn footprint(&self) -> PrimeFootprint {
        let (slots, slot_entries) = self.po.footprint();
        let (challenges, pings) = self.sus.footprint();
        PrimeFootprint {
            slots,
            slot_entries,
            challenges,
            pings,
            checkpoints: self.at_checkpoint.len(),
        }
    }
}

/// The bounds of Prime's structures for `cfg`, with `ckpts` checkpoints kept: per originator
/// a window of PO-REQUESTs above what it executed, and those executed since the stable
/// checkpoint (each of up to `log_size` ordinals may make a whole window eligible per
/// originator); each slot records at most one acknowledgement and one offered copy per
/// replica.
pub(super) fn prime_bounds(cfg: &Config, ckpts: usize) -> PrimeFootprint {
    let n = cfg.n() as usize;
    let slots = n * cfg.prime_window as usize * (cfg.log_size as usize + 1);
    let sus = suspect_config(cfg);
    PrimeFootprint {
        slots,
        slot_entries: 2 * n * slots,
        challenges: sus.challenges_max,
        pings: sus.pings_max,
        checkpoints: ckpts,
    }
}

/// Suspect-Leader's knobs from the protocol configuration.
fn suspect_config(cfg: &Config) -> SuspectConfig {
    let release = SuspectConfig::release(cfg.f);
    SuspectConfig {
        k_lat_permille: cfg.prime_k_lat_permille,
        proposal_period_ms: cfg.prime_proposal_period_ms,
        min_rtt_ms: cfg.prime_min_rtt_ms,
        ping_interval_ms: cfg.prime_ping_interval_ms,
        ..release
    }
}

/// `eligible` padded with zeros to one entry per replica (the execution component's vector is
/// empty until a matrix first made something eligible).
pub(super) fn padded(eligible: &[Seq], n: usize) -> Vec<Seq> {
    let mut v = eligible.to_vec();
    v.resize(n, 0);
    v
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    fn prime_ready(&self) -> bool {
        self.prime.as_ref().is_some_and(|p| p.keys.is_some())
    }

    // ----- timers -----------------------------------------------------------------------------

    /// Prime's timers: pre-ordering, the leader's proposals, Suspect-Leader, retransmission.
    pub(super) fn prime_tick(&mut self) {
        if !self.prime_ready() {
            return;
        }
        let now = self.now();
        let p = self.prime.as_mut().expect("prime");
        if now >= p.next_preorder_ms {
            p.next_preorder_ms = now + self.cfg.prime_preorder_period_ms;
            self.preorder_round();
        }
        let p = self.prime.as_mut().expect("prime");
        if now >= p.next_proposal_ms {
            p.next_proposal_ms = now + self.cfg.prime_proposal_period_ms;
            self.prime_propose();
        }
        let p = self.prime.as_mut().expect("prime");
        let outs = p.sus.tick(now);
        self.send_suspicion(outs);
        self.check_leader();
        let p = self.prime.as_mut().expect("prime");
        if now >= p.next_resend_ms {
            p.next_resend_ms = now + self.cfg.status_interval_ms;
            self.prime_resend();
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

    /// Journals the certificates that formed since the last call.
    fn persist_certified(&mut self) {
        let p = self.prime.as_mut().expect("prime");
        let certified = p.po.take_certified();
        if !certified.is_empty() {
            self.persist(Record::Certified { parts: certified });
        }
    }

    /// Acknowledges what we now hold contiguously.
    fn send_acks(&mut self) {
        let p = self.prime.as_mut().expect("prime");
        let acks = p.po.take_acks();
        self.persist_certified();
        if acks.is_empty() {
            return;
        }
        self.persist(Record::Acked {
            parts: acks.clone(),
        });
        let msg = Message::PoAck(PoAck {
            replica: self.id,
            parts: acks,
        });
        self.broadcast(&msg);
    }

    /// A backup sends the leader its summary matrix when it would make more eligible than
    /// the leader last proposed or we last sent (the leader's answer is timed).
    fn send_summary(&mut self) {
        if !self.views.normal || self.is_primary() {
            return;
        }
        let now = self.now();
        let f = self.cfg.f as usize;
        let p = self.prime.as_mut().expect("prime");
        if !p.po.would_advance(&p.summarized) {
            return;
        }
        let matrix = p.po.matrix();
        p.summarized = matrix.eligible_after(&p.summarized, f);
        p.sus.summary_sent(&matrix, now);
        let leader = self.primary();
        let msg = Message::Summary(Summary {
            replica: self.id,
            matrix,
        });
        self.send_replica(leader, &msg);
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
    /// wait to execute (an idle cluster orders a request without waiting for `Δpp`), and
    /// otherwise at most once per `Δpp` (its periodic proposal comes from the tick).
    fn leader_may_propose(&mut self) {
        if !self.is_primary() {
            return;
        }
        let now = self.now();
        let in_flight = self
            .ordering
            .proposing
            .next_seq
            .saturating_sub(self.exec.last_executed() + 1);
        let p = self.prime.as_ref().expect("prime");
        if in_flight < self.cfg.inflight_batches_max
            || now >= p.last_proposal_ms + self.cfg.prime_proposal_period_ms
        {
            self.prime_propose();
        }
    }

    /// Our waiting clients' requests (signed, not yet introduced) go out in our next
    /// PO-REQUEST.
    fn introduce(&mut self) {
        if !self.prime_may_speak() || !self.prime.as_ref().is_some_and(|p| p.po.can_introduce()) {
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
        let p = self.prime.as_mut().expect("prime");
        let Some(po) = p.po.introduce(requests) else {
            return;
        };
        self.persist(Record::Introduced {
            request: po.clone(),
        });
        self.broadcast(&Message::PoRequest(po));
    }

    /// Signs our row if our certificates grew, keeps it in our own matrix, and sends it.
    fn sign_row(&mut self) {
        if !self.prime_may_speak() {
            return;
        }
        let p = self.prime.as_mut().expect("prime");
        let Some(row) = p.po.new_row() else {
            return;
        };
        let keys = p.keys.as_ref().expect("checked by prime_ready");
        let sig = keys.signing.1.sign(&row.statement().0);
        let signed = SignedPoAru { row, sig };
        p.po.receive_row(signed.clone());
        p.row = Some(signed.clone());
        self.broadcast(&Message::PoAru(signed));
        self.matrix_changed();
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
        let p = self.prime.as_ref().expect("prime");
        // An idle leader still moves the ordinals on to a recovering replica's recovery
        // point (a matrix that makes nothing new eligible runs nothing), one at a time.
        let idle_progress = self.ordering.proposing.next_seq == self.exec.last_executed() + 1
            && self.recovery_progress_target().is_some();
        if !p.po.would_advance(&proposed) && !idle_progress {
            return;
        }
        let matrix = Arc::new(p.po.matrix());
        let now = self.now();
        self.prime.as_mut().expect("prime").last_proposal_ms = now;
        self.propose(Vec::new(), &[], Some(matrix));
    }

    /// Retransmission: our own PO-REQUESTs not yet executed (to everyone while not certified,
    /// then to the peers not known to hold them), acknowledgements of what is not yet
    /// certified, and our latest row. A certified PO-REQUEST still goes to a peer that lacks
    /// it: a replica that recovered forgot what it held, and with it gone and a faulty
    /// acknowledger silent, the others' certificates may wait for its acknowledgement, which
    /// it can give only once it holds the PO-REQUEST from us (one copy from a peer is not
    /// enough to take it; simulator seed 5832).
    fn prime_resend(&mut self) {
        let me = self.id;
        let n = self.cfg.n();
        let p = self.prime.as_ref().expect("prime");
        let (own, acks) = p.po.unsettled();
        let row = p.row.clone();
        let mut sends: Vec<(Option<ReplicaId>, Arc<PoRequest>)> = Vec::new();
        for r in own {
            if p.po.certified_copy(r.originator, r.seq).is_none() {
                sends.push((None, r));
                continue;
            }
            for j in (0..n).filter(|j| *j != me && p.po.known(*j, me) < r.seq) {
                sends.push((Some(j), r.clone()));
            }
        }
        for (to, r) in sends {
            let msg = Message::PoRequest(r);
            match to {
                None => self.broadcast(&msg),
                Some(j) => self.send_replica(j, &msg),
            }
        }
        if !acks.is_empty() {
            let msg = Message::PoAck(PoAck {
                replica: self.id,
                parts: acks,
            });
            self.broadcast(&msg);
        }
        if let Some(row) = row {
            self.broadcast(&Message::PoAru(row));
        }
        // Peers whose rows lag ours get our acknowledgements again.
        for j in 0..self.cfg.n() {
            if j == self.id {
                continue;
            }
            let parts = self
                .prime
                .as_ref()
                .expect("prime")
                .po
                .acks_for(j, ACK_PARTS_MAX);
            if !parts.is_empty() {
                let msg = Message::PoAck(PoAck {
                    replica: self.id,
                    parts,
                });
                self.send_replica(j, &msg);
            }
        }
        let missing = self.prime.as_ref().expect("prime").po.missing(FETCH_MAX);
        if !missing.is_empty() {
            self.ask_for(missing, false);
        }
    }

    // ----- Suspect-Leader ---------------------------------------------------------------------

    fn send_suspicion(&mut self, outs: Vec<Out>) {
        for o in outs {
            let msg = Message::Suspicion(Suspicion {
                replica: self.id,
                msg: o.msg,
            });
            match o.to {
                Some(r) => self.send_replica(r, &msg),
                None => self.broadcast(&msg),
            }
        }
    }

    /// Starts a view change when Suspect-Leader finds the leader too slow.
    fn check_leader(&mut self) {
        if !self.views.normal || self.exec.transfer_target().is_some() {
            return;
        }
        let Some(sus) = self.prime.as_ref().map(|p| &p.sus) else {
            return;
        };
        if sus.suspects() {
            let cause = ViewChangeCause::LeaderSlow {
                tat_ms: sus.tat_leader(),
                bound_ms: sus.bound().unwrap_or(0),
            };
            self.stats.leaders_suspected += 1;
            self.start_view_change(self.views.view.saturating_add(1), cause);
        }
    }

    /// A view change to `v` began (`changing`) or view `v` was installed.
    pub(super) fn prime_view(&mut self, v: View, changing: bool) {
        let now = self.now();
        let Some(p) = self.prime.as_mut() else {
            return;
        };
        if changing {
            p.sus.reset(v, true, now);
        } else {
            if p.sus.view() != v {
                p.sus.reset(v, false, now);
            }
            p.sus.view_installed(now);
        }
        p.next_proposal_ms = now;
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
            // Clients send to replicas themselves.
            None if !matches!(from, Principal::Client(_)) => return Err(Reject::Unexpected),
            None => {
                if !sr
                    .sig
                    .is_some_and(|s| self.request_signature_valid(req, &digest, &s))
                {
                    return Err(Reject::BadRequestAuth);
                }
                self.stats.requests_signed += 1;
            }
        }
        if let Some(last) = self.exec.last_reply(c) {
            if req.timestamp < last.timestamp {
                return Err(Reject::Stale);
            }
            if req.timestamp == last.timestamp {
                self.resend_reply(c);
                return Ok(());
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
        if self.prime_ready() {
            self.introduce();
        }
        self.arm_request_timer();
        Ok(())
    }

    pub(super) fn on_po_request(
        &mut self,
        from: ReplicaId,
        req: Arc<PoRequest>,
    ) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        if req.originator != from || req.requests.len() > self.cfg.batch_requests_max {
            return Err(Reject::Inconsistent);
        }
        self.check_po_requests(&req)?;
        let p = self.prime.as_mut().expect("prime");
        match p.po.receive_request(req.clone()) {
            Ok(true) => {
                // Durable before we acknowledge it (the journal is synced before sends).
                self.persist(Record::Held { request: req });
                self.send_acks();
                self.sign_row();
                self.try_execute();
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(crate::prime::preorder::PoError::OutsideWindow { .. }) => Err(Reject::OutOfWindow),
            Err(_) => Err(Reject::Conflict),
        }
    }

    /// Every client request in a PO-REQUEST must carry its client's valid signature (MACs
    /// would verify at some replicas only; ADR 0007) and be within the size limit.
    fn check_po_requests(&self, req: &PoRequest) -> Result<(), Reject> {
        let n = self.cfg.n();
        for r in &req.requests {
            if r.request.op.len() > self.cfg.op_bytes_max() {
                return Err(Reject::Inconsistent);
            }
            if let Some(rr) = recovery::recovery_of(r.request.client, n) {
                if !self.recovery_authentic(rr, &r.request) {
                    return Err(Reject::BadRequestAuth);
                }
                continue;
            }
            let d = r.request.digest();
            if !r
                .sig
                .is_some_and(|s| self.request_signature_valid(&r.request, &d, &s))
            {
                return Err(Reject::BadRequestAuth);
            }
        }
        Ok(())
    }

    pub(super) fn on_po_ack(&mut self, from: ReplicaId, ack: PoAck) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        if ack.replica != from || ack.parts.len() > ACK_PARTS_MAX {
            return Err(Reject::Inconsistent);
        }
        let p = self.prime.as_mut().expect("prime");
        p.po.receive_acks(from, &ack.parts);
        self.persist_certified();
        self.sign_row();
        self.try_execute();
        Ok(())
    }

    /// A signed row (it authenticates itself: any sender may pass it on).
    pub(super) fn on_po_aru(&mut self, row: SignedPoAru) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        let n = self.cfg.n() as usize;
        if row
            .check(n, &mut |r, st, sig| {
                self.row_signature_valid(r, st, sig, false)
            })
            .is_err()
        {
            return Err(Reject::BadSignature);
        }
        let p = self.prime.as_mut().expect("prime");
        match p.po.receive_row(row) {
            RowOrder::Newer => {
                self.matrix_changed();
                Ok(())
            }
            RowOrder::NotNewer => Ok(()),
            RowOrder::Inconsistent => Err(Reject::Conflict),
        }
    }

    /// A summary matrix sent to us as leader: its rows update our matrix.
    pub(super) fn on_summary(&mut self, from: ReplicaId, s: Summary) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        if s.replica != from || s.matrix.rows.len() != self.cfg.n() as usize {
            return Err(Reject::Inconsistent);
        }
        for row in s.matrix.rows.into_iter().flatten() {
            let _ = self.on_po_aru(row);
        }
        Ok(())
    }

    pub(super) fn on_suspicion(&mut self, from: ReplicaId, s: Suspicion) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        if s.replica != from {
            return Err(Reject::Inconsistent);
        }
        let now = self.now();
        let p = self.prime.as_mut().expect("prime");
        if let Some(out) = p.sus.receive(from, &s.msg, now) {
            self.send_suspicion(vec![out]);
        }
        self.check_leader();
        Ok(())
    }

    pub(super) fn on_po_fetch(&mut self, from: ReplicaId, f: PoFetch) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        if f.replica != from || f.wanted.len() > FETCH_MAX {
            return Err(Reject::Inconsistent);
        }
        // One answer carries at most what a status answer may (a peer asking for everything
        // at once must not make us send gigabytes); it asks again for the rest.
        let mut budget = self.status_body_budget();
        let p = self.prime.as_ref().expect("prime");
        let mut copies: Vec<Arc<PoRequest>> = Vec::new();
        for c in f
            .wanted
            .iter()
            .filter_map(|(i, s)| p.po.certified_copy(*i, *s))
        {
            let bytes: usize = c.requests.iter().map(|r| r.request.op.len()).sum();
            if !copies.is_empty() && bytes > budget {
                break;
            }
            budget = budget.saturating_sub(bytes);
            copies.push(c);
        }
        for c in copies {
            let msg = Message::PoCopy(PoCopy {
                replica: self.id,
                request: (*c).clone(),
            });
            self.send_replica(from, &msg);
        }
        Ok(())
    }

    pub(super) fn on_po_copy(&mut self, from: ReplicaId, c: PoCopy) -> Result<(), Reject> {
        if !self.prime_ready() {
            return Err(Reject::Unexpected);
        }
        if c.replica != from || c.request.requests.len() > self.cfg.batch_requests_max {
            return Err(Reject::Inconsistent);
        }
        self.check_po_requests(&c.request)?;
        let p = self.prime.as_mut().expect("prime");
        if p.po.offer(from, Arc::new(c.request)) {
            self.send_acks();
            self.sign_row();
            self.try_execute();
        }
        Ok(())
    }

    /// A proposal of the current view accepted here: its matrix answers our summaries. What
    /// it answers is read from the matrix as the ordinal will count it ([`Self::counted`]):
    /// a row of an incarnation a recovery retired passes unchecked in a proposal, and taken
    /// as it stands, a leader's made-up old rows claiming everything closed every challenge
    /// and stopped our summaries for good, in every later view (second review, G2).
    pub(super) fn prime_proposal_accepted(&mut self, batch: &Batch) {
        let now = self.now();
        let f = self.cfg.f as usize;
        let Some(m) = batch.matrix.as_ref() else {
            return;
        };
        let counted = if self.mutant("trust-retired-rows") {
            (**m).clone()
        } else {
            self.counted(m)
        };
        let Some(p) = self.prime.as_mut() else {
            return;
        };
        p.sus.proposal_accepted(&counted, now);
        p.summarized = counted.eligible_after(&p.summarized, f);
        if let Some(Some(own)) = m.rows.get(self.id as usize) {
            // Our own row as we signed it (before a restart, perhaps): none of ours goes
            // below it.
            p.po.restore_row(&own.row);
        }
    }

    // ----- execution --------------------------------------------------------------------------

    /// The requests the matrix batch `b` makes eligible after what we executed, and the
    /// eligibility after it; `Err` with the holes (asked for, rate-limited) if a PO-REQUEST is
    /// missing.
    pub(super) fn prime_derive(&mut self, b: &Batch) -> Result<(Batch, Vec<Seq>), ()> {
        let n = self.cfg.n() as usize;
        let before = padded(self.exec.eligible(), n);
        let Some(m) = b.matrix.as_ref() else {
            // Cannot be prepared by 2f+1 replicas checking shapes: runs nothing.
            return Ok((derived(b, Vec::new()), before));
        };
        let m = &self.counted(m);
        let after = m.eligible_at_rank(&before, PrimeSide::cut_rank(&self.cfg));
        let pairs = newly_eligible(&before, &after);
        let Some(p) = self.prime.as_ref() else {
            return Err(());
        };
        match p.po.ready(&pairs) {
            Ok(reqs) => {
                let requests = reqs
                    .iter()
                    .flat_map(|r| r.requests.iter().cloned())
                    .collect();
                Ok((derived(b, requests), after))
            }
            Err(holes) => {
                self.ask_for(holes, true);
                Err(())
            }
        }
    }

    /// Asks every peer for the PO-REQUESTs we lack: the holes of an ordered matrix
    /// (`ordered`), or what peers hold; each at most once per status interval.
    fn ask_for(&mut self, mut holes: Vec<(ReplicaId, Seq)>, ordered: bool) {
        let now = self.now();
        let Some(p) = self.prime.as_mut() else {
            return;
        };
        let next = if ordered {
            &mut p.next_hole_fetch_ms
        } else {
            &mut p.next_fetch_ms
        };
        if now < *next || self.out.replaying {
            return;
        }
        *next = now + self.cfg.status_interval_ms;
        holes.truncate(FETCH_MAX);
        let msg = Message::PoFetch(PoFetch {
            replica: self.id,
            wanted: holes,
        });
        self.broadcast(&msg);
    }

    /// A matrix batch ran: its PO-REQUESTs are forgotten, and the designated senders push
    /// them to the replicas not known to hold them (reconciliation).
    pub(super) fn prime_executed(
        &mut self,
        b: &Batch,
        before: &[Seq],
        after: &[Seq],
        fenced: &[Seq],
    ) {
        let counted = b.matrix.as_ref().map(|m| self.counted(m));
        let Some(p) = self.prime.as_mut() else {
            return;
        };
        let mut pushes = Vec::new();
        if let Some(m) = counted.as_ref() {
            for (i, s) in newly_eligible(before, after) {
                let to = p.po.reconcile(m, i, s);
                if !to.is_empty() {
                    if let Some(c) = p.po.certified_copy(i, s) {
                        pushes.push((to, c));
                    }
                }
            }
        }
        p.po.executed_through(fenced);
        if self.out.replaying {
            return;
        }
        // A proposal slot freed: the leader orders what waits.
        self.leader_may_propose();
        for (to, c) in pushes {
            let msg = Message::PoCopy(PoCopy {
                replica: self.id,
                request: (*c).clone(),
            });
            for r in to {
                self.send_replica(r, &msg);
            }
        }
    }

    /// We took checkpoint `seq`: remember the eligibility it holds.
    pub(super) fn prime_checkpoint(&mut self, seq: Seq) {
        let e = self.exec.eligible().to_vec();
        if let Some(p) = self.prime.as_mut() {
            p.at_checkpoint.insert(seq, e);
        }
    }

    /// Checkpoint `seq` is stable: the certified copies of what it covers go.
    pub(super) fn prime_stable(&mut self, seq: Seq) {
        let n = self.cfg.n() as usize;
        let Some(p) = self.prime.as_mut() else {
            return;
        };
        if let Some(e) = p.at_checkpoint.remove(&seq) {
            p.po.forget_through(&padded(&e, n));
        }
        p.at_checkpoint = p.at_checkpoint.split_off(&seq);
    }

    /// The state jumped (a fetched checkpoint, or a restart): pre-ordering forgets what the
    /// state executed.
    pub(super) fn prime_sync(&mut self) {
        let n = self.cfg.n() as usize;
        let e = padded(self.exec.eligible(), n);
        if let Some(p) = self.prime.as_mut() {
            p.po.executed_through(&e);
            p.po.forget_through(&e);
            for (s, x) in p.summarized.iter_mut().zip(&e) {
                *s = (*s).max(*x);
            }
        }
        // The state may have run recoveries we did not.
        self.prime_refresh_incarnations();
    }

    /// Prime's records from the journal, after the replay: our own PO-REQUESTs not yet run
    /// (held again, and resent by the retransmission), the others' we accepted, and our
    /// acknowledgements.
    pub(super) fn prime_restore(&mut self, records: &[Record]) {
        let Some(p) = self.prime.as_mut() else {
            return;
        };
        for x in records {
            match x {
                Record::OrderKey { seed } => p.remember_drawn(HolderSecrets::from_seed(seed)),
                Record::Introduced { request } => p.po.restore_own(request.clone()),
                Record::Held { request } => p.po.restore_held(request.clone()),
                Record::Acked { parts } => p.po.restore_acks(parts),
                Record::Certified { parts } => p.po.restore_certified(parts),
                _ => {}
            }
        }
        self.prime_refresh_incarnations();
    }
}

/// The batch that runs: the proposal's choices with the requests its matrix made eligible,
/// each client's latest only. A client has one request outstanding, so an older one beside
/// a newer one ran before (or was abandoned), and it would be refused anyway; and a batch
/// runs with one body session per client, learnt before it runs.
fn derived(b: &Batch, requests: Vec<SignedRequest>) -> Batch {
    let mut latest: BTreeMap<ClientId, u64> = BTreeMap::new();
    for r in &requests {
        let t = latest.entry(r.request.client).or_default();
        *t = (*t).max(r.request.timestamp);
    }
    let mut kept = Vec::with_capacity(latest.len());
    for r in requests {
        if latest.get(&r.request.client) == Some(&r.request.timestamp) {
            latest.remove(&r.request.client);
            kept.push(r);
        }
    }
    Batch {
        nondet: b.nondet,
        requests: kept,
        matrix: None,
    }
}

/// Most acknowledgement parts in one PO-ACK: a window's worth from every originator.
const ACK_PARTS_MAX: usize = 4096;
/// Most PO-REQUESTs asked for in one PO-FETCH.
const FETCH_MAX: usize = 256;
