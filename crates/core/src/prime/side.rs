//! Prime's own part of a replica (ADR 0007; spec prime.md), as one component that owns its
//! state and talks in values: pre-ordering (PO-REQUEST, PO-ACK, signed PO-ARU rows), the
//! summary matrices backups send the leader and the leader proposes, what an ordered matrix
//! makes eligible, reconciliation, Suspect-Leader, and the order keys rows are signed with.
//!
//! It sends nothing itself: what it would send or journal collects as [`Out`] values, which
//! its host takes with [`PrimeSide::take_outs`] after each call, in order. What it needs to
//! know of the rest of the replica (the time, the view, who leads, what ran, each replica's
//! order key in force) comes in as arguments. The host (`replica/prime.rs`) authenticates
//! clients' requests, orders the leader's matrices through pre-prepare, prepare and commit,
//! and runs what they make eligible; a test can drive several of these alone
//! (`side/tests.rs`).
//!
//! Bounds: the pre-ordering window per originator (`prime_window`), one row per replica,
//! Suspect-Leader's own bounds, at most `batch_requests_max` requests per PO-REQUEST, at most
//! [`ACK_PARTS_MAX`] parts per PO-ACK and [`FETCH_MAX`] PO-REQUESTs per PO-FETCH.

use crate::journal::Record;
use crate::message::PrimeMessage;
use crate::message::{
    Batch, Message, PoAck, PoCopy, PoFetch, Reject, SignedRequest, Summary, Suspicion,
};
use crate::prime::leave::LeaveVotes;
pub use crate::prime::leave::Verdict;
use crate::prime::matrix::{newly_eligible, Matrix, PoAru, RowOrder, SignedPoAru};
use crate::prime::preorder::{PoError, PoRequest, PreOrder, PreOrderConfig};
use crate::prime::suspect::{Suspect, SuspectConfig, SuspectMsg};
use crate::types::{ClientId, Config, ReplicaId, Seq, View};
use redoubt_crypto::pk::{self, HolderSecrets, VerifyKey};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;
use std::sync::Arc;

mod arrivals;
mod keys;
mod proposals;
#[cfg(test)]
mod tests;

pub use crate::agreement::proposals::{JournaledRun, KeyOf, Out};
pub use arrivals::{Arrivals, ARRIVALS_MAX};
use keys::PrimeKeys;

/// What an ordered matrix makes eligible after what ran: the requests, in order, and the
/// eligibility after them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    pub requests: Vec<SignedRequest>,
    pub after: Vec<Seq>,
}

/// PO-REQUESTs (originator, number) an ordered matrix needs and this replica lacks.
pub type Holes = Vec<(ReplicaId, Seq)>;

/// Sizes of Prime's bounded structures (the replica's footprint reports them beside its
/// own; all zero under PBFT).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrimeFootprint {
    /// PO-REQUEST slots, and the acknowledgements and offered copies in them.
    pub slots: usize,
    pub slot_entries: usize,
    /// Suspect-Leader's open challenges and unanswered pings.
    pub challenges: usize,
    pub pings: usize,
    /// Eligibility vectors kept per checkpoint above the stable one.
    pub checkpoints: usize,
    /// Requests and rows held for the turn's end.
    pub arrivals: usize,
    /// Votes to leave views.
    pub leave_votes: usize,
}

/// When each of Prime's periodic jobs is next due.
#[derive(Default)]
struct Timers {
    preorder_ms: u64,
    proposal_ms: u64,
    resend_ms: u64,
    /// When we may next ask for the holes of an ordered matrix, and for what peers hold that
    /// we lack: separate limits, so the second (which faulty peers can inflate) never delays
    /// the first.
    hole_fetch_ms: u64,
    fetch_ms: u64,
    /// When the leader last proposed (proposals are paced by `Δpp`).
    last_proposal_ms: u64,
    /// When we last signed a row, and whether a row waits for `prime_row_interval_ms` to
    /// pass since.
    last_row_ms: u64,
    row_deferred: bool,
}

/// A replica's Prime state.
pub struct PrimeSide {
    cfg: Config,
    me: ReplicaId,
    keys: PrimeKeys,
    po: PreOrder,
    sus: Suspect,
    leave: LeaveVotes,
    timers: Timers,
    /// What our last summary to the leader, or the last proposal we accepted, made eligible:
    /// a summary goes only when our matrix would make more eligible.
    summarized: Vec<Seq>,
    /// The eligibility at each of our checkpoints above the stable one: certified copies of
    /// what ran are kept until a checkpoint covering them is stable.
    at_checkpoint: BTreeMap<Seq, Vec<Seq>>,
    /// Our latest signed row (resent at every status interval: rows are not retransmitted
    /// otherwise).
    row: Option<SignedPoAru>,
    /// Ordinals the journal says ran here that the restart's replay did not reach (the key
    /// holder failed it): see [`PrimeSide::keep_journaled`].
    journaled: BTreeMap<Seq, JournaledRun>,
    /// What this turn's inputs asked of the host, done once at the turn's end.
    deferred: TurnWork,
    /// Clients' requests and rows this turn brought, checked together at its end.
    arrivals: Arrivals,
    outs: Vec<Out>,
}

/// Work Prime's inputs ask for that serves every input of a turn at once: done at the end of
/// the host's turn ([`crate::replica::Input::Idle`], or the next tick), so that the requests,
/// PO-REQUESTs and acknowledgements a busy replica reads in one turn cost one PO-REQUEST, one
/// PO-ACK, at most one row and one summary, not one of each per input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnWork {
    /// Waiting clients' requests to introduce.
    pub introduce: bool,
    /// Acknowledgements to send.
    pub acks: bool,
    /// A row to sign (our certificates may have grown).
    pub row: bool,
    /// Our matrix changed: tell the leader, or propose.
    pub matrix: bool,
    /// Held PO-REQUESTs or certificates changed: ordered matrices may run now.
    pub execute: bool,
}

impl TurnWork {
    fn merge(&mut self, o: TurnWork) {
        self.introduce |= o.introduce;
        self.acks |= o.acks;
        self.row |= o.row;
        self.matrix |= o.matrix;
        self.execute |= o.execute;
    }
}

impl PrimeSide {
    pub fn new(cfg: &Config, me: ReplicaId, view: View) -> PrimeSide {
        let n = cfg.n() as usize;
        #[allow(unused_mut)]
        let mut side = PrimeSide {
            cfg: cfg.clone(),
            me,
            keys: PrimeKeys::default(),
            po: PreOrder::new(
                PreOrderConfig {
                    n: cfg.n(),
                    f: cfg.f,
                    window: cfg.prime_window,
                },
                me,
            ),
            sus: Suspect::new(suspect_config(cfg), me, view, 0),
            leave: LeaveVotes::new(cfg.f as usize, n, me, view),
            timers: Timers::default(),
            summarized: vec![0; n],
            at_checkpoint: BTreeMap::new(),
            row: None,
            journaled: BTreeMap::new(),
            deferred: TurnWork::default(),
            arrivals: Arrivals::default(),
            outs: Vec::new(),
        };
        #[cfg(feature = "mutants")]
        match cfg.mutant {
            crate::types::Mutant::LeaderNeverSuspected => side.sus.never_suspect(),
            crate::types::Mutant::PoAcksAtF => side.po.certify_at_f(),
            _ => {}
        }
        side
    }

    fn broadcast(&mut self, msg: Message) {
        self.outs.push(Out::Broadcast(msg));
    }

    fn send(&mut self, to: ReplicaId, msg: Message) {
        self.outs.push(Out::Send(to, msg));
    }

    fn persist(&mut self, r: Record) {
        self.outs.push(Out::Persist(r));
    }

    /// The rank of each column's entry that cuts what an ordered matrix makes eligible:
    /// the (2f+1)-th highest.
    fn cut_rank(&self) -> usize {
        #[cfg(feature = "mutants")]
        if self.cfg.mutant == crate::types::Mutant::CutWithoutQuorum {
            return 0;
        }
        2 * self.cfg.f as usize
    }

    /// The simulator's mutant `trust-retired-rows`: a proposal's matrix answers our summaries
    /// as it stands, rows of retired incarnations included.
    fn trusts_retired_rows(&self) -> bool {
        #[cfg(feature = "mutants")]
        return self.cfg.mutant == crate::types::Mutant::TrustRetiredRows;
        #[cfg(not(feature = "mutants"))]
        false
    }

    /// The sizes of its structures now.
    pub fn footprint(&self) -> PrimeFootprint {
        let (slots, slot_entries) = self.po.footprint();
        let (challenges, pings) = self.sus.footprint();
        PrimeFootprint {
            slots,
            slot_entries,
            challenges,
            pings,
            checkpoints: self.at_checkpoint.len(),
            arrivals: self.arrivals.len(),
            leave_votes: self.leave.footprint(),
        }
    }

    /// The rows of our summary matrix, and how far we hold certificates per originator.
    pub fn rows(&self) -> (Vec<Option<PoAru>>, Vec<Seq>) {
        let rows = self
            .po
            .matrix()
            .rows
            .into_iter()
            .map(|r| r.map(|r| r.row))
            .collect();
        (rows, self.po.cum_aru().to_vec())
    }

    // ----- timers -----------------------------------------------------------------------------

    /// Whether the pre-ordering round is due (and when the next one is, if so).
    pub fn preorder_due(&mut self, now: u64) -> bool {
        due(
            &mut self.timers.preorder_ms,
            now,
            self.cfg.prime_preorder_period_ms,
        )
    }

    /// Whether the leader's periodic proposal is due.
    pub fn proposal_due(&mut self, now: u64) -> bool {
        due(
            &mut self.timers.proposal_ms,
            now,
            self.cfg.prime_proposal_period_ms,
        )
    }

    /// Whether retransmission is due.
    pub fn resend_due(&mut self, now: u64) -> bool {
        due(&mut self.timers.resend_ms, now, self.cfg.status_interval_ms)
    }

    /// Suspect-Leader's timers (pings, challenges).
    pub fn suspect_tick(&mut self, now: u64) {
        let outs = self.sus.tick(now);
        self.send_suspicion(outs);
    }

    // ----- pre-ordering -----------------------------------------------------------------------

    /// Journals the certificates that formed since the last call.
    fn persist_certified(&mut self) {
        let certified = self.po.take_certified();
        if !certified.is_empty() {
            self.persist(Record::Certified { parts: certified });
        }
    }

    /// Acknowledges what we now hold contiguously.
    pub fn send_acks(&mut self) {
        let acks = self.po.take_acks();
        self.persist_certified();
        if acks.is_empty() {
            return;
        }
        self.persist(Record::Acked {
            parts: acks.clone(),
        });
        self.broadcast(Message::from(PoAck {
            replica: self.me,
            parts: acks,
        }));
    }

    /// A backup in view `normal` operation sends `leader` its summary matrix when it would
    /// make more eligible than the leader last proposed or we last sent (the leader's answer
    /// is timed).
    pub fn send_summary(&mut self, now: u64, leader: ReplicaId) {
        let f = self.cfg.f as usize;
        if !self.po.would_advance(&self.summarized) {
            return;
        }
        let matrix = self.po.matrix();
        self.summarized = matrix.eligible_after(&self.summarized, f);
        self.sus.summary_sent(&matrix, now);
        self.send(
            leader,
            Message::Prime(PrimeMessage::Summary(Summary {
                replica: self.me,
                matrix,
            })),
        );
    }

    /// Whether the leader proposes now: while fewer than `inflight_batches_max` of its
    /// proposals (`in_flight`) wait to execute (an idle cluster orders a request without
    /// waiting for `Δpp`), and otherwise at most once per `Δpp`.
    pub fn may_propose_now(&self, now: u64, in_flight: Seq) -> bool {
        in_flight < self.cfg.inflight_batches_max
            || now >= self.timers.last_proposal_ms + self.cfg.prime_proposal_period_ms
    }

    /// Notes work for the end of the turn.
    pub fn defer(&mut self, w: TurnWork) {
        self.deferred.merge(w);
    }

    /// The work this turn's inputs asked for (nothing is left deferred).
    pub fn take_deferred(&mut self) -> TurnWork {
        std::mem::take(&mut self.deferred)
    }

    /// Whether we could introduce a PO-REQUEST now (the window allows one).
    pub fn can_introduce(&self) -> bool {
        self.po.can_introduce()
    }

    /// Introduces `requests` (signed, picked by the host) in our next PO-REQUEST.
    pub fn introduce(&mut self, requests: Vec<SignedRequest>) {
        let Some(po) = self.po.introduce(requests) else {
            return;
        };
        self.persist(Record::Introduced {
            request: po.clone(),
        });
        self.broadcast(Message::from(po));
    }

    /// Signs our row if our certificates grew, keeps it in our own matrix, and sends it;
    /// true if it did (our matrix changed). Under load a row waits: one signed within the
    /// last `prime_row_interval_ms` while PO-REQUESTs we hold are still being certified
    /// defers the next until the interval has passed ([`Self::row_due`]): each row costs a
    /// signature here and a verification at every peer, and one row then covers the
    /// certificates of many. A row that covers everything we hold goes at once (a lone
    /// client's request waits for no interval).
    pub fn sign_row(&mut self, now: u64) -> bool {
        let interval = self.cfg.prime_row_interval_ms;
        if interval > 0
            && now < self.timers.last_row_ms.saturating_add(interval)
            && self.po.certifying()
        {
            self.timers.row_deferred = true;
            return false;
        }
        self.timers.row_deferred = false;
        // The key first: a row taken from pre-ordering counts as signed.
        let Some(key) = self.keys.signing_key() else {
            return false;
        };
        let Some(row) = self.po.new_row() else {
            return false;
        };
        let sig = key.sign(&row.statement().0);
        let signed = SignedPoAru { row, sig };
        self.po.receive_row(signed.clone());
        self.row = Some(signed.clone());
        self.timers.last_row_ms = now;
        self.broadcast(Message::from(signed));
        true
    }

    /// Whether a deferred row is due now (see [`Self::sign_row`]).
    pub fn row_due(&self, now: u64) -> bool {
        self.timers.row_deferred
            && now
                >= self
                    .timers
                    .last_row_ms
                    .saturating_add(self.cfg.prime_row_interval_ms)
    }

    /// Whether our matrix makes more eligible than `eligible`.
    pub fn would_advance(&self, eligible: &[Seq]) -> bool {
        self.po.would_advance(eligible)
    }

    /// The leader proposes our matrix now (paces the next proposal).
    pub fn proposing(&mut self, now: u64) -> Arc<Matrix> {
        self.timers.last_proposal_ms = now;
        Arc::new(self.po.matrix())
    }

    /// Retransmission: our own PO-REQUESTs not yet executed (to everyone while not certified,
    /// then to the peers not known to hold them), acknowledgements of what is not yet
    /// certified, and our latest row. A certified PO-REQUEST still goes to a peer that lacks
    /// it: a replica that recovered forgot what it held, and with it gone and a faulty
    /// acknowledger silent, the others' certificates may wait for its acknowledgement, which
    /// it can give only once it holds the PO-REQUEST from us (one copy from a peer is not
    /// enough to take it; simulator seed 5832).
    pub fn resend(&mut self, now: u64, replaying: bool) {
        let me = self.me;
        let n = self.cfg.n();
        let (own, acks) = self.po.unsettled();
        for r in own {
            if self.po.certified_copy(r.originator, r.seq).is_none() {
                self.broadcast(Message::from(r));
                continue;
            }
            let lacking: Vec<ReplicaId> = (0..n)
                .filter(|j| *j != me && self.po.known(*j, me) < r.seq)
                .collect();
            for j in lacking {
                self.send(j, Message::from(r.clone()));
            }
        }
        if !acks.is_empty() {
            self.broadcast(Message::from(PoAck {
                replica: me,
                parts: acks,
            }));
        }
        if let Some(row) = self.row.clone() {
            self.broadcast(Message::from(row));
        }
        // Peers whose rows lag ours get our acknowledgements again.
        for j in (0..n).filter(|j| *j != me) {
            let parts = self.po.acks_for(j, ACK_PARTS_MAX);
            if !parts.is_empty() {
                self.send(
                    j,
                    Message::Prime(PrimeMessage::PoAck(PoAck { replica: me, parts })),
                );
            }
        }
        let missing = self.po.missing(FETCH_MAX);
        if !missing.is_empty() {
            self.ask_for(missing, false, now, replaying);
        }
    }

    /// Asks every peer for the PO-REQUESTs we lack: the holes of an ordered matrix
    /// (`ordered`), or what peers hold; each at most once per status interval.
    pub fn ask_for(
        &mut self,
        mut holes: Vec<(ReplicaId, Seq)>,
        ordered: bool,
        now: u64,
        replaying: bool,
    ) {
        let next = if ordered {
            &mut self.timers.hole_fetch_ms
        } else {
            &mut self.timers.fetch_ms
        };
        if now < *next || replaying {
            return;
        }
        *next = now + self.cfg.status_interval_ms;
        holes.truncate(FETCH_MAX);
        self.broadcast(Message::from(PoFetch {
            replica: self.me,
            wanted: holes,
        }));
    }

    // ----- Suspect-Leader ---------------------------------------------------------------------

    fn send_suspicion(&mut self, outs: Vec<crate::prime::suspect::Out>) {
        for o in outs {
            let msg = Message::from(Suspicion {
                replica: self.me,
                msg: o.msg,
            });
            match o.to {
                Some(r) => self.send(r, msg),
                None => self.broadcast(msg),
            }
        }
    }

    /// Whether Suspect-Leader finds the leader too slow: its turnaround and the bound.
    pub fn leader_too_slow(&self) -> Option<(u64, u64)> {
        self.sus
            .suspects()
            .then(|| (self.sus.tat_leader(), self.sus.bound().unwrap_or(0)))
    }

    // ----- receiving --------------------------------------------------------------------------

    /// Whether a PO-REQUEST (or a copy of one) from `from` is shaped as one from
    /// `originator` may be: checked before its clients' requests are.
    pub fn po_request_shape(
        &self,
        from: ReplicaId,
        originator: ReplicaId,
        req: &PoRequest,
    ) -> Result<(), Reject> {
        if originator != from || req.requests.len() > self.cfg.batch_requests_max {
            return Err(Reject::Inconsistent);
        }
        Ok(())
    }

    /// A PO-REQUEST whose shape and clients' requests the host checked; true if it is new
    /// here (journaled: the host acknowledges it, signs a row, tries to execute).
    pub fn on_po_request(&mut self, req: Arc<PoRequest>) -> Result<bool, Reject> {
        match self.po.receive_request(req.clone()) {
            Ok(true) => {
                // Durable before we acknowledge it (the journal is synced before sends).
                self.persist(Record::Held { request: req });
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(PoError::OutsideWindow { .. }) => Err(Reject::OutOfWindow),
            Err(_) => Err(Reject::Conflict),
        }
    }

    pub fn on_po_ack(&mut self, from: ReplicaId, ack: &PoAck) -> Result<(), Reject> {
        if ack.replica != from || ack.parts.len() > ACK_PARTS_MAX {
            return Err(Reject::Inconsistent);
        }
        self.po.receive_acks(from, &ack.parts);
        self.persist_certified();
        Ok(())
    }

    /// A signed row (it authenticates itself: any sender may pass it on); true if it is newer
    /// than the one we hold (our matrix changed).
    pub fn on_po_aru(&mut self, row: SignedPoAru, key_of: KeyOf<'_>) -> Result<bool, Reject> {
        let n = self.cfg.n() as usize;
        if row
            .check(n, &mut |r, st, sig| {
                self.row_signature_valid(r, st, sig, false, key_of)
            })
            .is_err()
        {
            return Err(Reject::BadSignature);
        }
        match self.po.receive_row(row) {
            RowOrder::Newer => Ok(true),
            RowOrder::NotNewer => Ok(false),
            RowOrder::Inconsistent => Err(Reject::Conflict),
        }
    }

    /// A summary matrix sent to us as leader: its rows, each taken as a PO-ARU.
    pub fn summary_rows(&self, from: ReplicaId, s: Summary) -> Result<Vec<SignedPoAru>, Reject> {
        if s.replica != from || s.matrix.rows.len() != self.cfg.n() as usize {
            return Err(Reject::Inconsistent);
        }
        Ok(s.matrix.rows.into_iter().flatten().collect())
    }

    pub fn on_suspicion(&mut self, from: ReplicaId, s: &Suspicion, now: u64) -> Result<(), Reject> {
        if s.replica != from {
            return Err(Reject::Inconsistent);
        }
        if let SuspectMsg::Leave { view } = s.msg {
            self.leave.receive(from, view);
        } else if let Some(out) = self.sus.receive(from, &s.msg, now) {
            self.send_suspicion(vec![out]);
        }
        Ok(())
    }

    /// We suspect the leader of our view: our vote to leave it (sent again while the
    /// suspicion holds), and what the votes now say.
    pub fn vote_to_leave(&mut self, now: u64) -> Verdict {
        if let Some(view) = self.leave.suspect(now) {
            self.send_suspicion(vec![crate::prime::suspect::Out {
                to: None,
                msg: SuspectMsg::Leave { view },
            }]);
        }
        self.leave.verdict()
    }

    /// What the votes to leave our view say.
    pub fn leave_verdict(&self) -> Verdict {
        self.leave.verdict()
    }

    /// Votes to leave our view, ours included.
    pub fn leave_votes(&self) -> usize {
        self.leave.votes()
    }

    /// Whether we voted to leave our view.
    pub fn leave_voted(&self) -> bool {
        self.leave.voted()
    }

    /// A PO-FETCH: the certified copies we hold of what it asks for, at most `budget` bytes
    /// of operations (but at least one copy); the peer asks again for the rest.
    pub fn on_po_fetch(
        &mut self,
        from: ReplicaId,
        f: &PoFetch,
        mut budget: usize,
    ) -> Result<(), Reject> {
        if f.replica != from || f.wanted.len() > FETCH_MAX {
            return Err(Reject::Inconsistent);
        }
        let mut copies: Vec<Arc<PoRequest>> = Vec::new();
        for c in f
            .wanted
            .iter()
            .filter_map(|(i, s)| self.po.certified_copy(*i, *s))
        {
            let bytes: usize = c.requests.iter().map(|r| r.request.op.len()).sum();
            if !copies.is_empty() && bytes > budget {
                break;
            }
            budget = budget.saturating_sub(bytes);
            copies.push(c);
        }
        for c in copies {
            self.send(
                from,
                Message::Prime(PrimeMessage::PoCopy(PoCopy {
                    replica: self.me,
                    request: (*c).clone(),
                })),
            );
        }
        Ok(())
    }

    /// A copy of a certified PO-REQUEST from `from` whose shape the host checked, `authentic`
    /// if its clients' requests authenticate here; true if it filled a hole (the host
    /// acknowledges, signs a row, tries to execute).
    pub fn on_po_copy(&mut self, from: ReplicaId, request: PoRequest, authentic: bool) -> bool {
        self.po.offer(from, Arc::new(request), authentic)
    }

    /// A proposal of the current view was accepted here, whose matrix the next ordinal
    /// counts as `counted` (`own` is our own row in it, as we signed it): it answers our
    /// summaries.
    pub fn proposal_accepted(&mut self, counted: &Matrix, own: Option<&PoAru>, now: u64) {
        let f = self.cfg.f as usize;
        self.sus.proposal_accepted(counted, now);
        self.summarized = counted.eligible_after(&self.summarized, f);
        if let Some(own) = own {
            // Our own row as we signed it (before a restart, perhaps): none of ours goes
            // below it.
            self.po.restore_row(own);
        }
    }

    // ----- execution --------------------------------------------------------------------------

    /// What the ordered matrix `counted` makes eligible after `before` (what ran): the
    /// requests, and the eligibility after them; `Err` with the PO-REQUESTs missing here.
    pub fn derive(&self, counted: &Matrix, before: &[Seq]) -> Result<Derived, Holes> {
        let after = counted.eligible_at_rank(before, self.cut_rank());
        let pairs = newly_eligible(before, &after);
        let reqs = self.po.ready(&pairs)?;
        let requests = reqs
            .iter()
            .flat_map(|r| r.requests.iter().cloned())
            .collect();
        Ok(Derived { requests, after })
    }

    /// A matrix ordinal ran, taking eligibility from `before` to `after` (`fenced`: with the
    /// fences of recovered replicas' numbering): its PO-REQUESTs are forgotten; returns the
    /// certified copies the designated senders push to the replicas not known to hold them
    /// (reconciliation), to be sent unless replaying.
    pub fn executed(
        &mut self,
        counted: Option<&Matrix>,
        before: &[Seq],
        after: &[Seq],
        fenced: &[Seq],
    ) -> Vec<(Vec<ReplicaId>, Arc<PoRequest>)> {
        let mut pushes = Vec::new();
        if let Some(m) = counted {
            for (i, s) in newly_eligible(before, after) {
                let to = self.po.reconcile(m, i, s);
                if !to.is_empty() {
                    if let Some(c) = self.po.certified_copy(i, s) {
                        pushes.push((to, c));
                    }
                }
            }
        }
        self.po.executed_through(fenced);
        pushes
    }

    /// Sends reconciliation's copies (see [`Self::executed`]).
    pub fn push(&mut self, pushes: Vec<(Vec<ReplicaId>, Arc<PoRequest>)>) {
        for (to, c) in pushes {
            let msg = Message::from(PoCopy {
                replica: self.me,
                request: (*c).clone(),
            });
            for r in to {
                self.send(r, msg.clone());
            }
        }
    }

    /// What the journal says ordinal `seq` ran, if it ran the matrix batch `digest`;
    /// ordinals through `executed` are forgotten first.
    pub fn journaled(&mut self, seq: Seq, digest: &Digest, executed: Seq) -> Option<&JournaledRun> {
        self.journaled = self.journaled.split_off(&(executed + 1));
        self.journaled.get(&seq).filter(|r| r.digest == *digest)
    }
}

/// Whether a periodic job whose next time is `*next` is due at `now`; if so, its next time is
/// `period` later.
fn due(next: &mut u64, now: u64, period: u64) -> bool {
    if now < *next {
        return false;
    }
    *next = now + period;
    true
}

/// The bounds of Prime's structures for `cfg`, with `ckpts` checkpoints kept: per originator
/// a window of PO-REQUESTs above what it executed, and those executed since the stable
/// checkpoint (each of up to `log_size` ordinals may make a whole window eligible per
/// originator); each slot records at most one acknowledgement and one offered copy per
/// replica.
pub fn prime_bounds(cfg: &Config, ckpts: usize) -> PrimeFootprint {
    let n = cfg.n() as usize;
    let slots = n * cfg.prime_window as usize * (cfg.log_size as usize + 1);
    let sus = suspect_config(cfg);
    PrimeFootprint {
        slots,
        slot_entries: 2 * n * slots,
        challenges: sus.challenges_max,
        pings: sus.pings_max,
        checkpoints: ckpts,
        arrivals: 2 * ARRIVALS_MAX,
        leave_votes: n * (crate::prime::leave::VIEWS_AHEAD as usize + 1),
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
pub fn padded(eligible: &[Seq], n: usize) -> Vec<Seq> {
    let mut v = eligible.to_vec();
    v.resize(n, 0);
    v
}

/// The batch that runs: the proposal's choices with the requests its matrix made eligible,
/// each client's latest only. A client has one request outstanding, so an older one beside
/// a newer one ran before (or was abandoned), and it would be refused anyway; and a batch
/// runs with one body session per client, learnt before it runs.
pub fn derived(b: &Batch, requests: Vec<SignedRequest>) -> Batch {
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
pub const ACK_PARTS_MAX: usize = 4096;
/// Most PO-REQUESTs asked for in one PO-FETCH.
pub const FETCH_MAX: usize = 256;
