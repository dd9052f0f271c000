//! The PBFT replica as a deterministic state machine (Input -> Effects).
//!
//! Normal case (PBFT §4.2), checkpoints and watermarks (§4.3), the MAC-only view change of
//! BFT-PR (§4.3 of the 2000 paper), receiver-driven retransmission with status messages, and the
//! page-level state transfer of BFT-PR §4.6.2 (see [`crate::transfer`]). The replica owns the service and executes committed batches
//! synchronously; everything it sends leaves as [`Effect`]s.
//!
//! Every bound is explicit: the log holds at most L slots, checkpoints and checkpoint votes are
//! limited to the window, the request pool holds at most one request per known client, and
//! view-change bookkeeping holds at most one message per replica.

use crate::agreement::certificates::CheckpointVotes;
use crate::agreement::pool::{RequestPool, Waiting};
use crate::agreement::vcstore::{Stored, ViewChangeStore, ACKS_PER_ACKER_MAX};
use crate::auth::{open, seal, verify_request, Auth};
use crate::effect::{Bytes, Effect, Env, Event};
use crate::execution::{
    Answered, Due, Execution, Finished, LastReply, Refused, ServeLimits, Undone,
};
use crate::journal::Record;
use crate::keys::NewKey;
use crate::message::*;
use crate::quorum;
use crate::service::{ExecContext, Service};
use crate::transfer::checkpoint_digest;
use crate::types::{ClientId, Config, Principal, ReplicaId, Seq, View};
use crate::viewchange::{self, Pending, SlotSummary};
use redoubt_crypto::Digest;
use redoubt_state::{PagedState, StateFootprint};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[path = "recovery.rs"]
mod recovery;
#[path = "restart.rs"]
mod restart;
#[path = "status.rs"]
mod status;
#[path = "suspects.rs"]
mod suspects;
pub use recovery::RecoveryReport;

/// Admin and transport inputs.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// A frame arrived from the network.
    Receive(&'a [u8]),
    /// Time passed; fire due timers. Hosts call this every few milliseconds.
    Tick,
    /// The primary is about to stop (for recovery or shutdown): hand over to the next view.
    StepDown,
    /// Proactive recovery (BFT-PR §4.4): the host restarted this replica from its saved state
    /// with trusted code; discard client keys, refresh keys, estimate, send the recovery
    /// request, check and fetch state. Needs session keys.
    Recover,
}

#[derive(Clone, Debug, Default)]
struct Slot {
    /// Digest of the accepted pre-prepare (or the NEW-VIEW selection) in the current view.
    pp: Option<Digest>,
    /// True if this replica proposed the slot itself as primary in normal operation.
    proposed_here: bool,
    /// The requests its pre-prepare named beside it (set when proposed here, and only if
    /// there were any), so a retransmission is as lean as the original.
    beside: Option<Arc<Vec<Beside>>>,
    prepares: BTreeMap<ReplicaId, Digest>,
    /// Per backup whose PREPARE doubts some of the batch's requests, their positions (ours
    /// included; see `Prepare::doubts`).
    doubts: BTreeMap<ReplicaId, Vec<u16>>,
    commits: BTreeMap<ReplicaId, Digest>,
    sent_prepare: bool,
    sent_commit: bool,
    prepared: bool,
    committed: bool,
}

impl Slot {
    /// Whether replica `me` vouched for every request of the slot's batch in its PREPARE.
    fn vouched_by(&self, me: ReplicaId) -> bool {
        self.sent_prepare && !self.doubts.contains_key(&me)
    }
}

/// A pre-prepare waiting for requests that travel beside it.
#[derive(Clone, Debug)]
struct PendingPp {
    pp: PrePrepare,
    /// How many of its requests beside it, from the first, were present when last looked at:
    /// the next arrival that matters is the one after them.
    present: usize,
}

impl PendingPp {
    fn first_missing(&self) -> Option<&Beside> {
        self.pp.beside.get(self.present)
    }
}

/// Counters a host can export as metrics.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub requests_executed: u64,
    pub batches_executed: u64,
    pub view_changes: u64,
    pub state_transfers: u64,
    pub rejected: u64,
    /// Bytes of state-transfer answers received (META-DATA and DATA frames).
    pub transfer_bytes_in: u64,
    /// Bytes of state-transfer answers served.
    pub transfer_bytes_out: u64,
    /// Pages and meta-data partitions installed by transfers.
    pub transfer_pages: u64,
    pub transfer_metas: u64,
    /// Answers that failed their digests.
    pub transfer_bad_answers: u64,
    /// Pages found corrupt by state checks.
    pub corrupt_pages_found: u64,
    /// NEW-KEYs sent and accepted.
    pub key_refreshes: u64,
    pub new_keys_accepted: u64,
    /// Clients sent our NEW-KEY because we held no key of theirs (they re-key on it).
    pub client_keys_asked: u64,
    /// Recoveries completed here, and recovery requests (of any replica) executed.
    pub recoveries: u64,
    pub recovery_requests_executed: u64,
    /// Batches executed tentatively, and those of them undone by a view change (or a state
    /// transfer) before they committed.
    pub tentative_batches: u64,
    pub tentative_undone: u64,
    /// Log entries retransmitted in answer to peers' statuses, and batch bodies our statuses
    /// asked for.
    pub entries_retransmitted: u64,
    pub bodies_asked: u64,
    /// View changes this replica started as primary because its own proposals did not
    /// execute within the view-change timeout.
    pub primary_stalls: u64,
    /// Requests in accepted pre-prepares this replica could not authenticate (named in its
    /// PREPARE's doubts; see `Prepare::doubts`).
    pub requests_doubted: u64,
    /// Requests beside arriving pre-prepares found among the requests their clients had
    /// since replaced here (see `Replica::replaced`).
    pub beside_from_replaced: u64,
    /// View-change protocol messages dropped because their sender (or this replica) re-keyed
    /// after they arrived (see `Replica::forget_view_changes_of`).
    pub view_changes_forgotten: u64,
    /// Recoveries whose view estimate moved this replica back to a lower view (its journal
    /// named a view the others did not report).
    pub views_estimated: u64,
    /// Recoveries that found the journal's low watermark above the estimate H_M and went
    /// back to the checkpoint the state holds.
    pub watermarks_distrusted: u64,
    /// Restarts whose stored checkpoint did not load (its auxiliary bytes or the service's
    /// pages): the replica fetched a vouched checkpoint instead.
    pub state_unreadable: u64,
    /// Recoveries that found the state's own checkpoint above the estimate H_M (a page store
    /// rewritten while compromised) and fetched the whole state again.
    pub states_distrusted: u64,
    /// Times a client came under suspicion (see `suspects.rs`).
    pub clients_suspected: u64,
    /// Requests arriving with a valid signature of their client.
    pub requests_signed: u64,
}

/// A replica.
pub struct Replica<S: Service, A: Auth> {
    cfg: Config,
    id: ReplicaId,
    auth: A,
    /// The execution component: service, paged state, reply table, what ran where.
    exec: Execution<S>,
    env: Env,
    effects: Vec<Effect>,
    pub stats: Stats,

    // Views.
    view: View,
    normal: bool,
    vc_timeout_ms: u64,
    vc_deadline_ms: Option<u64>,
    my_vc: Option<(ViewChange, Digest)>,
    /// Our VIEW-CHANGE for the previous view, still needed by replicas checking its NEW-VIEW.
    prev_vc: Option<(ViewChange, Digest)>,
    /// Other replicas' VIEW-CHANGEs, claims, relayed copies and acks (see `vcstore.rs`).
    vcstore: ViewChangeStore,
    /// Batches whose body this replica journaled in a `PrePrepared` record since its last
    /// view record, above its last checkpoint record: their `Executed` records omit the body
    /// (journal compaction keeps the pre-prepare record for them). At most one per slot.
    bodies_journaled: BTreeSet<(Seq, Digest)>,
    pset: BTreeMap<Seq, PEntry>,
    qset: BTreeMap<Seq, Vec<(Digest, View)>>,
    /// Slots of views we left that we pre-prepared but did not vouch for in full (a request
    /// we could not authenticate): (view, digest) by sequence number, within the window. Once
    /// the requests verify (the client retransmitted, or its key arrived) the slot joins Q,
    /// so our next VIEW-CHANGE can help decide it (ADR 0002, item 7).
    doubted: BTreeMap<Seq, (View, Digest)>,
    /// Clients under suspicion, and until when (ms; bounded, see `suspects.rs`).
    suspects: BTreeMap<ClientId, u64>,
    new_view: Option<NewView>,
    pending_nv: Option<NewView>,
    decision_missing: Vec<Digest>,
    executed_in_view: bool,

    // Log.
    log: BTreeMap<Seq, Slot>,
    batches: BTreeMap<Digest, Arc<Batch>>,
    next_seq: Seq,
    last_proposed_time_ms: u64,

    // Checkpoints.
    stable_seq: Seq,
    stable_digest: Digest,
    /// CHECKPOINT votes: which checkpoints are known correct or stable.
    ckpt_votes: CheckpointVotes,

    // Requests.
    /// Read-only requests waiting for everything this replica prepared to execute (one per
    /// client, the latest).
    reads: BTreeMap<ClientId, Request>,
    /// Requests waiting to be ordered, in flight, and replaced (see `pool.rs`).
    pool: RequestPool,
    /// Pre-prepares of the current view waiting for requests that travel beside them (at
    /// most one per sequence number in the log window).
    pending_pp: BTreeMap<Seq, PendingPp>,
    req_timer: Option<(u64, ClientId, u64)>,
    /// While primary: the last time it executed a batch or had none in flight. A primary
    /// whose own proposals do not execute within the view-change timeout suspects itself
    /// (see `tick`).
    primary_progress_ms: u64,

    next_status_ms: u64,
    /// True while re-executing journaled batches after a restart: no sends, no records.
    replaying: bool,

    // Session keys and recovery (see recovery.rs).
    rekey_due: bool,
    next_rekey_ms: u64,
    next_key_expiry_ms: u64,
    new_key_resent: BTreeMap<ReplicaId, u64>,
    /// Clients asked for their keys (our NEW-KEY sent to them) and when; bounded.
    client_key_asked: BTreeMap<ClientId, u64>,
    recovery: Option<recovery::Recovery>,
    /// While recovering: nothing with a sequence number above H_M is sent.
    send_cap: Option<Seq>,
    /// Why the stored checkpoint did not load at start-up (reported once restored).
    unreadable: Option<String>,
}

impl<S: Service, A: Auth> Replica<S, A> {
    /// A replica in view 0 whose state is `state` (see [`open_state`]) at its latest
    /// checkpoint. Panics if the state's checkpoint does not decode (use
    /// [`Replica::restore`] for stored state).
    pub fn new(cfg: Config, id: ReplicaId, auth: A, service: S, state: PagedState) -> Self {
        Self::from_state(cfg, id, auth, service, state).expect("state opens")
    }

    fn from_state(
        cfg: Config,
        id: ReplicaId,
        auth: A,
        service: S,
        state: PagedState,
    ) -> Result<Self, String> {
        assert!(
            cfg.validate().is_ok(),
            "invalid config: {:?}",
            cfg.validate()
        );
        assert!(id < cfg.n());
        let ckpt_votes = CheckpointVotes::new(cfg.log_size, cfg.checkpoint_interval);
        let pool = RequestPool::new(&cfg);
        let mut r = Replica {
            vc_timeout_ms: cfg.view_change_timeout_ms,
            cfg,
            id,
            auth,
            exec: Execution::new(service, state),
            env: Env::default(),
            effects: Vec::new(),
            stats: Stats::default(),
            view: 0,
            normal: true,
            vc_deadline_ms: None,
            my_vc: None,
            prev_vc: None,
            vcstore: ViewChangeStore::default(),
            bodies_journaled: BTreeSet::new(),
            pset: BTreeMap::new(),
            qset: BTreeMap::new(),
            doubted: BTreeMap::new(),
            suspects: BTreeMap::new(),
            new_view: None,
            pending_nv: None,
            decision_missing: Vec::new(),
            executed_in_view: false,
            log: BTreeMap::new(),
            batches: BTreeMap::new(),
            next_seq: 1,
            last_proposed_time_ms: 0,
            stable_seq: 0,
            stable_digest: Digest::ZERO,
            ckpt_votes,
            reads: BTreeMap::new(),
            pool,
            pending_pp: BTreeMap::new(),
            req_timer: None,
            primary_progress_ms: 0,
            next_status_ms: 0,
            replaying: false,
            rekey_due: false,
            next_rekey_ms: 0,
            next_key_expiry_ms: 0,
            new_key_resent: BTreeMap::new(),
            client_key_asked: BTreeMap::new(),
            recovery: None,
            send_cap: None,
            unreadable: None,
        };
        let seq = r.exec.state().latest();
        let (root, aux) = r
            .exec
            .state()
            .held(seq)
            .expect("the latest checkpoint is held");
        let digest = checkpoint_digest(seq, &root, &aux);
        if let Err(e) = r.exec.load_aux(seq, &aux) {
            // Corrupt pages (found by the check at start-up) may not load, and a page store
            // rewritten while the replica was compromised may hold auxiliary bytes that do not
            // decode: stay diverged and fetch a vouched checkpoint before executing.
            r.stats.state_unreadable += 1;
            r.unreadable = Some(format!("checkpoint {seq}: {e}"));
            r.exec.set_diverged(true);
            r.exec.stand_at(seq);
        }
        r.stable_seq = seq;
        r.stable_digest = digest;
        r.next_seq = seq + 1;
        r.exec.note_checkpoint(seq, digest);
        Ok(r)
    }

    // ----- accessors -------------------------------------------------------------------

    pub fn id(&self) -> ReplicaId {
        self.id
    }
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn view(&self) -> View {
        self.view
    }
    pub fn is_normal(&self) -> bool {
        self.normal
    }
    pub fn primary(&self) -> ReplicaId {
        self.cfg.primary(self.view)
    }
    pub fn is_primary(&self) -> bool {
        self.primary() == self.id
    }
    pub fn last_executed(&self) -> Seq {
        self.exec.last_executed()
    }
    pub fn stable_checkpoint(&self) -> Seq {
        self.stable_seq
    }
    pub fn service(&self) -> &S {
        self.exec.service()
    }
    /// Mutable access for hosts and fault injection (the simulator corrupts state with it).
    /// The service state (pages, tree, checkpoints).
    pub fn state(&self) -> &PagedState {
        self.exec.state()
    }

    /// Checks every page against the digests of the latest checkpoint (on demand, e.g. from
    /// an admin command). Corrupt pages are marked; the replica stops executing and fetches
    /// them at the next checkpoint f+1 replicas vouch for. Returns the corrupt page indices.
    pub fn check_state(&mut self) -> Vec<u64> {
        let report = self.exec.state_mut().check();
        if !report.corrupt.is_empty() {
            self.stats.corrupt_pages_found += report.corrupt.len() as u64;
            self.exec.set_diverged(true);
            // Reported with the effects of the next input.
            self.event(Event::StateCorrupt {
                pages: report.corrupt.len() as u64,
            });
        }
        report.corrupt
    }

    /// Lets a test change the service state behind the protocol's back (a replica whose
    /// execution went wrong). Simulator only.
    #[cfg(feature = "mutants")]
    pub fn tamper(&mut self, f: impl FnOnce(&mut S, &mut PagedState)) {
        self.exec.tamper(f)
    }

    pub fn service_mut(&mut self) -> &mut S {
        self.exec.service_mut()
    }
    pub fn auth(&self) -> &A {
        &self.auth
    }

    /// Checks the invariants of every component (the simulator calls it after every step);
    /// `Err` names the first that fails.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.exec
            .check_invariants()
            .map_err(|e| format!("execution: {e}"))?;
        self.pool
            .check_invariants()
            .map_err(|e| format!("request pool: {e}"))?;
        self.vcstore
            .check_invariants()
            .map_err(|e| format!("view-change messages: {e}"))?;
        self.ckpt_votes
            .check_invariants()
            .map_err(|e| format!("checkpoint votes: {e}"))?;
        let (lo, hi) = (self.stable_seq, self.stable_seq + self.cfg.log_size);
        if let Some((n, _)) = self.log.iter().find(|(n, _)| **n <= lo || **n > hi) {
            return Err(format!(
                "agreement: log slot n{n} outside the window ({lo}, {hi}]"
            ));
        }
        Ok(())
    }

    /// Sizes of every bounded structure, for tests and metrics.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            log_slots: self.log.len(),
            pending_pre_prepares: self.pending_pp.len(),
            executed: self.exec.executed_len(),
            batches: self.batches.len(),
            checkpoints: self.exec.checkpoints_len(),
            checkpoint_votes: self.ckpt_votes.len(),
            pset: self.pset.len(),
            qset_pairs: self.qset.values().map(|v| v.len()).sum(),
            clients: self.exec.clients_len(),
            waiting: self.pool.len(),
            replaced: self.pool.replaced_len(),
            replaced_bytes: self.pool.replaced_bytes(),
            arrivals: self.pool.arrivals_len(),
            reads: self.reads.len(),
            view_changes: self.vcstore.messages(),
            acks: self.vcstore.acks_len(),
            bodies_journaled: self.bodies_journaled.len(),
            state: self.exec.state().footprint(),
        }
    }

    /// The bounds [`Replica::footprint`] must stay within, given the number of known clients.
    pub fn footprint_bounds(&self, clients: usize) -> Footprint {
        let n = self.cfg.n() as usize;
        let l = self.cfg.log_size as usize;
        let f = self.cfg.f as usize;
        let ckpts = (self.cfg.log_size / self.cfg.checkpoint_interval) as usize + 2;
        Footprint {
            log_slots: l,
            pending_pre_prepares: l,
            executed: l,
            batches: l * (f + 4),
            checkpoints: ckpts,
            checkpoint_votes: n * ckpts,
            pset: l,
            qset_pairs: l * (f + 2),
            clients,
            waiting: clients,
            replaced: RequestPool::replaced_bounds(&self.cfg).0,
            replaced_bytes: RequestPool::replaced_bounds(&self.cfg).1,
            arrivals: clients,
            reads: clients,
            view_changes: 5 * n,
            acks: n * ACKS_PER_ACKER_MAX,
            bodies_journaled: l,
            state: StateFootprint {
                // Pages modified since the stable checkpoint are bounded by what the log's
                // requests can write; the simulator's small states make this the page count.
                overlay_pages: self.exec.state().geometry().pages() as usize,
                checkpoints: ckpts + 1,
                copied_pages: self.exec.state().geometry().pages() as usize * (ckpts + 1),
                copied_nodes: 2 * self.exec.state().geometry().pages() as usize * (ckpts + 1),
                dirty_pages: self.exec.state().geometry().pages() as usize,
                invalid_pages: self.exec.state().geometry().pages() as usize,
            },
        }
    }

    // ----- entry point ----------------------------------------------------------------------

    /// Processes one input and returns the effects it produced.
    pub fn handle(&mut self, env: Env, input: Input<'_>) -> Vec<Effect> {
        let mut out = Vec::new();
        self.handle_into(env, input, &mut out);
        out
    }

    /// Like [`handle`](Self::handle), appending the effects to `out`. A caller that drains
    /// `out` and passes it again keeps both vectors' capacity: on a busy replica one input
    /// produces dozens of effects (a batch's replies), which would otherwise grow a fresh
    /// vector at every input.
    pub fn handle_into(&mut self, env: Env, input: Input<'_>, out: &mut Vec<Effect>) {
        self.env = env;
        match input {
            Input::Receive(bytes) => self.receive(bytes),
            Input::Tick => self.tick(),
            Input::StepDown => {
                if self.normal && self.is_primary() {
                    self.start_view_change(self.view.saturating_add(1));
                }
            }
            Input::Recover => self.start_recovery(),
        }
        if out.is_empty() {
            std::mem::swap(&mut self.effects, out);
        } else {
            out.append(&mut self.effects);
        }
    }

    fn now(&self) -> u64 {
        self.env.now_ms
    }

    // ----- sending --------------------------------------------------------------------------

    fn seal(&self, msg: &Message, to: Option<Principal>) -> Bytes {
        Arc::new(seal(&self.auth, msg, to, self.cfg.n()))
    }

    fn send(&mut self, to: Principal, msg: &Message) {
        if self.above_cap(msg) {
            return;
        }
        let bytes = self.seal(msg, Some(to));
        self.effects.push(Effect::Send { to, bytes });
    }

    fn send_replica(&mut self, to: ReplicaId, msg: &Message) {
        if to != self.id {
            self.send(Principal::Replica(to), msg);
        }
    }

    fn broadcast(&mut self, msg: &Message) {
        if self.above_cap(msg) {
            return;
        }
        let bytes = self.seal(msg, None);
        self.effects.push(Effect::Broadcast { bytes });
    }

    fn persist(&mut self, r: Record) {
        if self.replaying {
            return;
        }
        // Which bodies the journal holds in pre-prepare records that compaction keeps (see
        // `bodies_journaled`): a view record may drop those of earlier views, a checkpoint
        // record those at or below it.
        match &r {
            Record::View { .. } => self.bodies_journaled.clear(),
            Record::Checkpoint { seq, .. } => {
                self.bodies_journaled =
                    self.bodies_journaled.split_off(&(seq + 1, Digest([0; 32])));
            }
            Record::PrePrepared {
                seq,
                digest,
                batch: Some(_),
                ..
            } => {
                self.bodies_journaled.insert((*seq, *digest));
            }
            _ => {}
        }
        self.effects.push(Effect::Persist(r));
    }

    /// Records the execution of batch `digest` at `seq`, with its body unless the journal
    /// holds it already.
    fn persist_executed(&mut self, seq: Seq, digest: Digest, batch: Option<&Arc<Batch>>) {
        let batch = batch.filter(|_| !self.bodies_journaled.contains(&(seq, digest)));
        self.persist(Record::Executed {
            seq,
            digest,
            batch: batch.cloned(),
        });
    }

    fn event(&mut self, e: Event) {
        self.effects.push(Effect::Event(e));
    }

    fn reject(&mut self, from: Principal, kind: &'static str, reason: Reject) {
        self.stats.rejected += 1;
        self.event(Event::Rejected { from, kind, reason });
    }

    /// The doubted slots as journaled.
    fn doubted_wire(&self) -> Vec<(Seq, View, Digest)> {
        self.doubted
            .iter()
            .map(|(n, (v, d))| (*n, *v, *d))
            .collect()
    }

    // ----- receive --------------------------------------------------------------------------

    fn receive(&mut self, bytes: &[u8]) {
        let frame = match decode_frame_ref(bytes, self.cfg.message_bytes_max) {
            Ok(f) => f,
            Err(r) => {
                // The claimed sender is unknown when the frame does not decode.
                self.reject(Principal::Client(u64::MAX), "frame", r);
                return;
            }
        };
        let from = frame.from;
        let msg = match open(&self.auth, &frame) {
            Ok(m) => m,
            Err(r) => {
                if let (Reject::BadMac, Principal::Replica(peer)) = (r, from) {
                    if peer < self.cfg.n() && peer != self.id {
                        self.resend_new_key(peer);
                    }
                }
                self.reject(from, "frame", r);
                return;
            }
        };
        let kind = msg.kind();
        if let Err(r) = self.dispatch(from, msg, bytes.len()) {
            self.reject(from, kind, r);
        }
    }

    fn dispatch(&mut self, from: Principal, msg: Message, len: usize) -> Result<(), Reject> {
        let sender = match from {
            Principal::Replica(r) => Some(r),
            Principal::Client(_) => None,
        };
        match (msg, sender) {
            (Message::Request(r), _) => self.on_request(from, r),
            (Message::PrePrepare(m), Some(s)) => self.on_pre_prepare(s, m),
            (Message::Prepare(m), Some(s)) => self.on_prepare(s, m),
            (Message::Commit(m), Some(s)) => self.on_commit(s, m),
            (Message::Checkpoint(m), Some(s)) => self.on_checkpoint(s, m),
            (Message::ViewChange(m), Some(s)) => self.on_view_change(s, m),
            (Message::ViewChangeAck(m), Some(s)) => self.on_ack(s, m),
            (Message::NewView(m), Some(s)) => self.on_new_view(s, m),
            (Message::Status(m), Some(s)) => self.on_status(s, m),
            (Message::Fetch(m), Some(s)) => self.on_fetch(s, m),
            (Message::StateData(m), Some(s)) => self.on_state_data(s, m, len),
            (Message::Batches(m), Some(_)) => self.on_batches(m),
            (Message::RelayViewChange(m), Some(s)) => self.on_relayed_vc(s, m),
            (Message::NewKey(m), _) => self.on_new_key(from, m),
            (Message::QueryStable(m), Some(s)) => self.on_query_stable(s, m),
            (Message::ReplyStable(m), Some(s)) => self.on_reply_stable(s, m),
            (Message::Reply(m), Some(s)) => self.on_recovery_reply(s, m),
            _ => Err(Reject::Unexpected),
        }
    }

    fn in_window(&self, n: Seq) -> bool {
        n > self.stable_seq && n <= self.stable_seq + self.cfg.log_size
    }

    // ----- requests ---------------------------------------------------------------------------

    fn on_request(&mut self, from: Principal, sr: SignedRequest) -> Result<(), Reject> {
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
        if req.op.len() > self.cfg.request_bytes_max {
            return Err(Reject::TooLarge);
        }
        let digest = req.digest();
        let mac_ok = self.request_authentic(req, &digest, &sr.auth);
        if !mac_ok {
            self.ask_for_client_key(req.client);
        }
        // Signatures are checked only when the MAC does not verify, or when the client is
        // under suspicion (its unsigned requests are not ordered).
        let signed = (!mac_ok || self.suspected(req.client))
            && sr
                .sig
                .is_some_and(|s| self.request_signature_valid(req, &digest, &s));
        if !mac_ok && !signed {
            return Err(Reject::BadRequestAuth);
        }
        if signed {
            self.stats.requests_signed += 1;
        }
        if req.read_only && self.cfg.read_only_fast_path {
            if !matches!(from, Principal::Client(_)) {
                return Err(Reject::Unexpected); // read-only requests are never relayed
            }
            if self.exec.read_only(&req.op).is_none() {
                return Err(Reject::Inconsistent); // flagged read-only but it is not
            }
            self.reads.insert(req.client, sr.request);
            self.answer_reads();
            return Ok(());
        }
        if let Some(last) = self.exec.last_reply(req.client) {
            if req.timestamp < last.timestamp {
                return Err(Reject::Stale);
            }
            if req.timestamp == last.timestamp {
                // Already executed: resend the cached reply.
                let tentative = self
                    .exec
                    .tentative()
                    .is_some_and(|t| t.executed.iter().any(|(c, _)| *c == req.client));
                let reply = Message::Reply(Reply {
                    view: self.view,
                    timestamp: last.timestamp,
                    client: req.client,
                    replica: self.id,
                    digest_only: false,
                    tentative,
                    result: last.result.clone(),
                });
                self.send(client, &reply);
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
        match self.pool.get(c) {
            Some(w) if w.req.request.timestamp > ts => {
                // Older than the client's waiting one (reordered, or lost and sent again),
                // yet not executed here: a pre-prepare may still name it beside itself.
                if self.cfg.travels_beside(req.op.len()) {
                    self.pool.keep_replaced(sr.clone(), digest);
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
                let from_client = matches!(from, Principal::Client(_));
                self.pool.refresh(c, from_client, &sr, signed);
            }
            _ => self.pool.admit(sr.clone(), digest, signed),
        }
        self.retry_pending_if_first_missing(c, digest);
        if self.doubts_request_of(c) {
            // The request we could not authenticate in a pre-prepare may be this one.
            self.vouch_late();
        }
        if !self.doubted.is_empty() {
            self.vouch_after_leaving(Some(c));
        }
        let multicast = self.cfg.travels_beside(sr.request.op.len());
        if self.is_primary() {
            self.try_propose();
        } else if matches!(from, Principal::Client(_)) && self.normal && !multicast {
            // Relay to the primary, which may not have received it (a large request its
            // client multicast went to the primary too).
            let p = self.primary();
            self.send_replica(p, &Message::Request(sr));
        }
        self.arm_request_timer();
        Ok(())
    }

    /// Answers the waiting read-only requests from the executed state, once this replica has
    /// executed and committed everything it prepared: a write whose client saw it complete
    /// was prepared by f+1 correct replicas, so 2f+1 matching answers cannot all predate it.
    /// "Everything it prepared" includes what it prepared in earlier views (its P set) and
    /// what a NEW-VIEW carried over (pre-prepared slots): a view change clears the prepared
    /// marks of the log, and undoes a tentative batch, without the write being any less
    /// complete.
    fn answer_reads(&mut self) {
        if self.reads.is_empty()
            || !self.normal
            || self.exec.diverged()
            || self.exec.tentative().is_some()
            || self.exec.walking()
            || self
                .log
                .range(self.exec.last_executed() + 1..)
                .any(|(_, s)| s.prepared || s.pp.is_some_and(|d| d != NULL_DIGEST))
            || self
                .pset
                .range(self.exec.last_executed() + 1..)
                .next()
                .is_some()
        {
            return;
        }
        let reads = std::mem::take(&mut self.reads);
        for (c, req) in reads {
            let Some(result) = self.exec.read_only(&req.op) else {
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
    fn quiet_for(&self, requests: usize) -> bool {
        self.is_primary() && self.cfg.quiet_primary_for(requests)
    }

    /// The first reply to a request: in full from its designated replier (or for short
    /// results, or without digest replies), as a digest from the others. With a quiet
    /// primary the designated replier is a backup.
    fn reply(&self, client: ClientId, timestamp: u64, result: &[u8], tentative: bool) -> Message {
        let digest_only = self.cfg.digest_replies
            && result.len() >= DIGEST_REPLY_MIN_BYTES
            && self.designated(client, timestamp) != self.id;
        let result = if digest_only {
            Digest::of(result).0.to_vec()
        } else {
            result.to_vec()
        };
        Message::Reply(Reply {
            view: self.view,
            timestamp,
            client,
            replica: self.id,
            digest_only,
            tentative,
            result,
        })
    }

    /// The replica that sends the full result of a long reply (digest replies).
    fn designated(&self, client: ClientId, timestamp: u64) -> ReplicaId {
        if !self.cfg.primary_replies {
            designated_replier_except(client, timestamp, self.cfg.n(), self.primary())
        } else {
            designated_replier(client, timestamp, self.cfg.n())
        }
    }

    /// Starts the view-change timer for the oldest waiting request if none is running.
    fn arm_request_timer(&mut self) {
        if self.req_timer.is_some() || !self.normal || self.is_primary() {
            return;
        }
        // Not for an unsigned request of a client under suspicion: the primary holds those
        // back until they come signed.
        let oldest = self
            .pool
            .in_order()
            .find(|(_, w)| self.orderable(w))
            .map(|(c, w)| (c, w.req.request.timestamp));
        if let Some((c, ts)) = oldest {
            self.req_timer = Some((self.now() + self.vc_timeout_ms, c, ts));
        }
    }

    /// Whether client `c`'s request `ts` (or a later one) waits on this replica alone: it is
    /// in a batch committed here and nothing the primary owes us stands before it (every slot
    /// between what we executed and it is committed too, or a state transfer we run will
    /// jump past them). A request behind a slot that does not commit still blames the primary.
    fn committed_here(&self, c: ClientId, ts: u64) -> bool {
        let skip_to = self
            .exec
            .transfer_target()
            .map_or(self.exec.last_executed(), |(seq, _)| seq);
        let holds = |s: &Slot| {
            s.pp.and_then(|d| self.batches.get(&d)).is_some_and(|b| {
                b.requests
                    .iter()
                    .any(|r| r.request.client == c && r.request.timestamp >= ts)
            })
        };
        for n in self.exec.last_executed() + 1.. {
            let Some(s) = self.log.get(&n) else {
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

    fn request_done(&mut self, c: ClientId, ts: u64) {
        self.pool.done(c, ts);
        if let Some((_, tc, tts)) = self.req_timer {
            if tc == c && tts <= ts {
                self.req_timer = None;
            }
        }
    }

    // ----- primary: proposing -----------------------------------------------------------

    fn try_propose(&mut self) {
        if !self.normal || !self.is_primary() || self.exec.transfer_target().is_some() {
            return;
        }
        loop {
            let in_flight = self.next_seq.saturating_sub(self.exec.last_executed() + 1);
            if in_flight == 0 {
                // Nothing of ours waits to execute: a stall is measured from here (the
                // first tick may come after the first proposal).
                self.primary_progress_ms = self.now();
            }
            if in_flight >= self.cfg.inflight_batches_max
                || self.next_seq > self.stable_seq + self.cfg.log_size
                || self.next_seq <= self.stable_seq
            {
                return;
            }
            let most = self.pool.arrivals_len().min(self.cfg.batch_requests_max);
            let mut requests = Vec::with_capacity(most);
            let mut digests = Vec::with_capacity(most);
            let mut bytes = 0usize;
            // With session keys a pooled request's authenticator goes stale when its client
            // refreshes its keys; backups could not vouch for it. Drop it: the client
            // retransmits under its new keys.
            let recheck = self.uses_session_keys();
            let mut stale = Vec::new();
            for (c, w) in self.pool.in_order() {
                if requests.len() >= self.cfg.batch_requests_max {
                    break;
                }
                let ts = w.req.request.timestamp;
                if self.pool.inflight_covers(c, ts) || !self.orderable(w) {
                    continue;
                }
                if recheck
                    && !w.signed
                    && !self.request_authentic(&w.req.request, &w.digest, &w.req.auth)
                {
                    stale.push(c);
                    continue;
                }
                let len = w.req.request.op.len();
                if !requests.is_empty() && bytes + len > self.cfg.batch_bytes_max {
                    break;
                }
                bytes += len;
                requests.push(w.req.clone());
                digests.push(w.digest);
            }
            for c in stale {
                self.pool.remove(c);
            }
            if requests.is_empty()
                && self
                    .recovery_progress_target()
                    .is_none_or(|t| self.next_seq > t)
            {
                return;
            }
            for r in &requests {
                self.pool
                    .mark_inflight(r.request.client, r.request.timestamp);
            }
            let time_ms = self.now().max(self.last_proposed_time_ms);
            self.last_proposed_time_ms = time_ms;
            let batch = Batch {
                nondet: NonDet {
                    time_ms,
                    seed: self.env.entropy ^ self.next_seq.rotate_left(32),
                },
                requests,
            };
            // The requests were hashed when they arrived.
            let digest = batch.digest_with(&digests);
            let seq = self.next_seq;
            self.next_seq += 1;
            let batch = Arc::new(batch);
            let pp = self.lean(seq, digest, &batch, &digests);
            self.batches.insert(digest, batch.clone());
            let slot = self.log.entry(seq).or_default();
            // A correct primary never assigns a sequence number twice in a view.
            assert!(
                slot.pp.is_none(),
                "r{} proposing n{seq} twice in v{}",
                self.id,
                self.view
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
                batch: Some(batch),
                vouched: true,
            });
            self.broadcast(&Message::PrePrepare(pp));
            self.check_slot(seq);
        }
    }

    // ----- normal case ------------------------------------------------------------------------

    /// Adds to Q the slots of views we left whose every request we can now authenticate;
    /// with `client`, only slots holding a request of that client (the one that just
    /// arrived). Slots at or below the stable checkpoint are forgotten.
    pub(super) fn vouch_after_leaving(&mut self, client: Option<ClientId>) {
        let stable = self.stable_seq;
        self.doubted.retain(|n, _| *n > stable);
        let mut vouched = Vec::new();
        for (n, (v, d)) in &self.doubted {
            let Some(b) = self.batches.get(d) else {
                continue;
            };
            if client.is_some_and(|c| b.requests.iter().all(|r| r.request.client != c)) {
                continue;
            }
            if b.requests
                .iter()
                .all(|r| self.can_vouch_for(r, &self.request_digest(r)))
            {
                vouched.push((*n, *v, *d));
            }
        }
        for (n, v, d) in vouched {
            self.doubted.remove(&n);
            viewchange::add_q(self.qset.entry(n).or_default(), d, v, self.cfg.f);
        }
    }

    /// Whether a pre-prepared slot in our window holds a request of client `c` and a doubt
    /// of ours (cheap when we doubt nothing, the usual case).
    fn doubts_request_of(&self, c: ClientId) -> bool {
        let me = self.id;
        !self.is_primary()
            && self
                .log
                .range(self.exec.last_executed() + 1..)
                .any(|(_, s)| {
                    s.doubts.contains_key(&me)
                        && s.pp
                            .and_then(|d| self.batches.get(&d))
                            .is_some_and(|b| b.requests.iter().any(|r| r.request.client == c))
                })
    }

    /// Whether this replica vouches for request `r` (digest `d`) in a pre-prepare: within the
    /// size limit, and authentic: its authenticator entry verifies, or it equals a request
    /// this replica holds (waiting, or replaced by its client's next one), which was
    /// authenticated when it arrived (its client may have
    /// refreshed its keys since, so the entry no longer verifies, but the request is no less
    /// the client's; requests beside the pre-prepare are always of this kind).
    fn can_vouch_for(&self, r: &SignedRequest, d: &Digest) -> bool {
        r.request.op.len() <= self.cfg.request_bytes_max
            && (self
                .pool
                .get(r.request.client)
                .is_some_and(|w| w.req.request == r.request)
                || self
                    .pool
                    .replaced(r.request.client, d)
                    .is_some_and(|h| h.request == r.request)
                || self.signed_request_authentic(r, d))
    }

    /// This replica's own copy of the request named by `b` (beside a pre-prepare): the
    /// client's waiting request, or one it replaced (then `true`).
    fn held_beside(&self, b: &Beside) -> Option<(&SignedRequest, bool)> {
        self.pool.held_beside(b)
    }

    /// The digest of `r`: from the copy this replica holds if it is the same request (a
    /// comparison is cheaper than hashing a large operation again), else computed.
    fn request_digest(&self, r: &SignedRequest) -> Digest {
        match self.pool.get(r.request.client) {
            Some(w) if w.req.request == r.request => w.digest,
            _ => r.request.digest(),
        }
    }

    /// The pre-prepare this primary sends for `batch` (digest `digest`) at `seq`: large client
    /// requests named beside it, the others copied into it.
    fn lean(&self, seq: Seq, digest: Digest, batch: &Batch, digests: &[Digest]) -> PrePrepare {
        let n = self.cfg.n();
        let mut pp = PrePrepare {
            view: self.view,
            seq,
            digest,
            batch: Batch {
                nondet: batch.nondet,
                requests: Vec::new(),
            },
            beside: Vec::new(),
        };
        for (i, r) in batch.requests.iter().enumerate() {
            if self.cfg.travels_beside(r.request.op.len())
                && recovery::recovery_of(r.request.client, n).is_none()
            {
                pp.beside.push(Beside {
                    index: i as u32,
                    client: r.request.client,
                    digest: digests[i],
                });
            } else {
                pp.batch.requests.push(r.clone());
            }
        }
        pp
    }

    /// The pre-prepare of slot `seq` (digest `digest`) proposed here, as it was sent: the
    /// requests named beside it again named only (its receiver holds them, or asks for the
    /// batch in its status messages), so that helping a slow backup costs digests, not the
    /// bodies of large requests it most likely holds already.
    fn lean_again(&self, seq: Seq, digest: Digest, batch: &Batch, beside: &[Beside]) -> PrePrepare {
        let mut named = beside.iter().map(|b| b.index as usize).peekable();
        let mut inline = Vec::with_capacity(batch.requests.len().saturating_sub(beside.len()));
        for (i, r) in batch.requests.iter().enumerate() {
            if named.peek() == Some(&i) {
                named.next();
            } else {
                inline.push(r.clone());
            }
        }
        PrePrepare {
            view: self.view,
            seq,
            digest,
            batch: Batch {
                nondet: batch.nondet,
                requests: inline,
            },
            beside: beside.to_vec(),
        }
    }

    /// The pre-prepare with its whole batch, from the requests this replica holds (or the
    /// batch itself, if known); `Err` gives it back when a request beside it is missing.
    fn resolve(&self, pp: PrePrepare) -> Result<(PrePrepare, u64), PrePrepare> {
        if pp.beside.is_empty() {
            return Ok((pp, 0));
        }
        let mut from_replaced = 0;
        let whole = match self.batches.get(&pp.digest) {
            Some(b) => Some((**b).clone()),
            None => pp.whole_batch(|b| {
                let (r, replaced) = self.held_beside(b)?;
                from_replaced += u64::from(replaced);
                Some(r.clone())
            }),
        };
        match whole {
            Some(batch) => Ok((
                PrePrepare {
                    batch,
                    beside: Vec::new(),
                    ..pp
                },
                from_replaced,
            )),
            None => Err(pp),
        }
    }

    /// Pre-prepares still waiting for requests beside them get another try (a batch body
    /// arrived, or a tick): each is resolved in full.
    fn retry_pending(&mut self) {
        let seqs: Vec<Seq> = self.pending_pp.keys().copied().collect();
        for seq in seqs {
            if let Some(p) = self.pending_pp.get_mut(&seq) {
                p.present = 0;
            }
            self.retry_pending_at(seq);
        }
    }

    /// Request (`c`, `digest`) arrived, or was kept: if some pending pre-prepare lacked it
    /// first, the pending pre-prepares get another try.
    fn retry_pending_if_first_missing(&mut self, c: ClientId, digest: Digest) {
        if self.pending_pp.values().any(|p| {
            p.first_missing()
                .is_some_and(|b| b.client == c && b.digest == digest)
        }) {
            self.retry_pending_scan();
        }
    }

    /// After a request arrived that some pending pre-prepare lacked first: each pending
    /// pre-prepare advances over the requests now present, and is resolved once all are.
    /// Requests mostly arrive in the order of their batch, so this costs O(1) per arrival
    /// where resolving every pending pre-prepare at every arrival cost O(batch) (and built
    /// the batch each time: an allocation per request in it).
    fn retry_pending_scan(&mut self) {
        let seqs: Vec<Seq> = self.pending_pp.keys().copied().collect();
        for seq in seqs {
            self.retry_pending_at(seq);
        }
    }

    fn retry_pending_at(&mut self, seq: Seq) {
        let Some(p) = self.pending_pp.get(&seq) else {
            return;
        };
        let present = self.present_beside(&p.pp, p.present);
        if present < p.pp.beside.len() {
            if let Some(p) = self.pending_pp.get_mut(&seq) {
                p.present = present;
            }
            return;
        }
        let Some(p) = self.pending_pp.remove(&seq) else {
            return;
        };
        // Resolved and checked there; should a request counted present have been replaced
        // or settled meanwhile, it waits again, counted from the start.
        let primary = self.primary();
        let _ = self.on_pre_prepare(primary, p.pp);
    }

    /// How many of `pp`'s requests beside it, from the first, this replica holds (counting
    /// from `from`, the ones before known present).
    fn present_beside(&self, pp: &PrePrepare, from: usize) -> usize {
        from + pp.beside[from.min(pp.beside.len())..]
            .iter()
            .take_while(|b| self.held_beside(b).is_some())
            .count()
    }

    fn on_pre_prepare(&mut self, from: ReplicaId, pp: PrePrepare) -> Result<(), Reject> {
        if pp.view != self.view || !self.normal {
            return Err(Reject::OutOfWindow);
        }
        if from != self.primary() || self.is_primary() {
            return Err(Reject::Inconsistent);
        }
        if !self.in_window(pp.seq) {
            return Err(Reject::OutOfWindow);
        }
        if pp.beside.len() > self.cfg.batch_requests_max {
            return Err(Reject::TooLarge);
        }
        let (pp, from_replaced) = match self.resolve(pp) {
            Ok(resolved) => resolved,
            Err(pp) => {
                // Wait for the requests (their clients multicast them); status messages ask
                // the other replicas for the whole batch meanwhile. The first pre-prepare
                // for a sequence number stands.
                if let Some(d) = self.log.get(&pp.seq).and_then(|s| s.pp) {
                    return if d == pp.digest {
                        Ok(())
                    } else {
                        Err(Reject::Conflict)
                    };
                }
                return match self.pending_pp.get(&pp.seq) {
                    Some(p) if p.pp.digest != pp.digest => Err(Reject::Conflict),
                    Some(_) => Ok(()),
                    None => {
                        let present = self.present_beside(&pp, 0);
                        self.pending_pp.insert(pp.seq, PendingPp { pp, present });
                        Ok(())
                    }
                };
            }
        };
        if self
            .pending_pp
            .get(&pp.seq)
            .is_some_and(|p| p.pp.digest != pp.digest)
        {
            return Err(Reject::Conflict);
        }
        self.pending_pp.remove(&pp.seq);
        #[cfg(feature = "mutants")]
        let check_digest = !matches!(self.cfg.mutant, crate::types::Mutant::SkipDigestCheck);
        #[cfg(not(feature = "mutants"))]
        let check_digest = true;
        let request_digests: Vec<Digest> = pp
            .batch
            .requests
            .iter()
            .map(|r| self.request_digest(r))
            .collect();
        if pp.digest == NULL_DIGEST
            || (check_digest && pp.batch.digest_with(&request_digests) != pp.digest)
        {
            return Err(Reject::BadDigest);
        }
        // Empty batches move an idle system to a recovering replica's recovery point.
        if pp.batch.requests.len() > self.cfg.batch_requests_max
            || pp.batch.op_bytes() > self.cfg.batch_bytes_max
        {
            return Err(Reject::TooLarge);
        }
        if let Some(slot) = self.log.get(&pp.seq) {
            if let Some(d) = slot.pp {
                let vouched = slot.vouched_by(self.id);
                return if d == pp.digest {
                    if let std::collections::btree_map::Entry::Vacant(e) = self.batches.entry(d) {
                        e.insert(Arc::new(pp.batch));
                        self.try_execute();
                    }
                    if !vouched {
                        self.vouch_late();
                    }
                    Ok(())
                } else {
                    Err(Reject::Conflict)
                };
            }
        }
        if self.now().abs_diff(pp.batch.nondet.time_ms) > self.cfg.clock_skew_max_ms {
            return Err(Reject::BadNonDet);
        }
        // Client authentication of every request. A request this replica cannot authenticate
        // (a faulty client's authenticator may verify at some replicas only, or its key here
        // may be older or newer than the one it used) is named in our PREPARE's doubts: the
        // vote still counts for the order, and the slot prepares only if f+1 replicas of the
        // certificate vouch for each request, so that a correct one authenticated it.
        let mut doubts = Vec::new();
        for (i, (r, d)) in pp.batch.requests.iter().zip(&request_digests).enumerate() {
            if !self.can_vouch_for(r, d) {
                doubts.push(i as u16);
                self.ask_for_client_key(r.request.client);
            }
        }
        self.stats.requests_doubted += doubts.len() as u64;
        self.stats.beside_from_replaced += from_replaced;
        let (view, seq, digest) = (pp.view, pp.seq, pp.digest);
        let batch = Arc::new(pp.batch);
        self.persist(Record::PrePrepared {
            view,
            seq,
            digest,
            batch: Some(batch.clone()),
            vouched: doubts.is_empty(),
        });
        self.batches.insert(digest, batch);
        let slot = self.log.entry(seq).or_default();
        slot.pp = Some(digest);
        slot.sent_prepare = true;
        slot.prepares.insert(self.id, digest);
        if !doubts.is_empty() {
            slot.doubts.insert(self.id, doubts.clone());
        }
        let id = self.id;
        self.broadcast(&Message::Prepare(Prepare {
            view,
            seq,
            digest,
            replica: id,
            doubts,
        }));
        self.check_slot(seq);
        Ok(())
    }

    fn on_prepare(&mut self, from: ReplicaId, p: Prepare) -> Result<(), Reject> {
        // The primary's pre-prepare is its vote; a PREPARE from it is never counted.
        if p.replica != from || from == self.cfg.primary(p.view) {
            return Err(Reject::Inconsistent);
        }
        if !doubts_well_formed(&p.doubts, self.cfg.batch_requests_max) {
            return Err(Reject::Inconsistent);
        }
        if p.view != self.view || !self.normal || !self.in_window(p.seq) {
            return Err(Reject::OutOfWindow);
        }
        let slot = self.log.entry(p.seq).or_default();
        match slot.prepares.get(&from) {
            Some(d) if *d != p.digest => return Err(Reject::Conflict),
            Some(_) => {
                // Again for the same batch: it vouches for what either PREPARE vouched for
                // (a replica doubts less once it holds the request or the client's key).
                let Some(old) = slot.doubts.get_mut(&from) else {
                    return Ok(());
                };
                let before = old.len();
                old.retain(|i| p.doubts.binary_search(i).is_ok());
                if old.len() == before {
                    return Ok(());
                }
                if old.is_empty() {
                    slot.doubts.remove(&from);
                }
            }
            None => {
                slot.prepares.insert(from, p.digest);
                if !p.doubts.is_empty() {
                    slot.doubts.insert(from, p.doubts);
                }
            }
        }
        self.check_slot(p.seq);
        Ok(())
    }

    fn on_commit(&mut self, from: ReplicaId, c: Commit) -> Result<(), Reject> {
        if c.replica != from {
            return Err(Reject::Inconsistent);
        }
        self.on_vote(from, c.view, c.seq, c.digest, |s| &mut s.commits)
    }

    /// Records one PREPARE or COMMIT vote (the first per sender and slot stands; votes are
    /// keyed by view through the log, which holds only the current view) and advances the slot.
    fn on_vote(
        &mut self,
        from: ReplicaId,
        view: View,
        seq: Seq,
        digest: Digest,
        votes: impl FnOnce(&mut Slot) -> &mut BTreeMap<ReplicaId, Digest>,
    ) -> Result<(), Reject> {
        if view != self.view || !self.normal || !self.in_window(seq) {
            return Err(Reject::OutOfWindow);
        }
        let votes = votes(self.log.entry(seq).or_default());
        match votes.get(&from) {
            Some(d) if *d != digest => return Err(Reject::Conflict),
            Some(_) => return Ok(()),
            None => {
                votes.insert(from, digest);
            }
        }
        self.check_slot(seq);
        Ok(())
    }

    fn commit_quorum(&self) -> usize {
        #[cfg(feature = "mutants")]
        if self.cfg.mutant == crate::types::Mutant::CommitQuorum {
            return 2 * self.cfg.f as usize;
        }
        self.cfg.quorum()
    }

    /// Advances a slot through prepared and committed, sending COMMIT when it prepares.
    fn check_slot(&mut self, seq: Seq) {
        let primary = self.primary();
        let quorum = self.commit_quorum();
        let f = self.cfg.f;
        let Some(slot) = self.log.get_mut(&seq) else {
            return;
        };
        #[cfg(feature = "mutants")]
        let no_doubts = BTreeMap::new();
        #[cfg(feature = "mutants")]
        let doubts = if self.cfg.mutant == crate::types::Mutant::IgnoreDoubts {
            &no_doubts
        } else {
            &slot.doubts
        };
        #[cfg(not(feature = "mutants"))]
        let doubts = &slot.doubts;
        if !slot.prepared && quorum::prepared(f, primary, slot.pp.as_ref(), &slot.prepares, doubts)
        {
            slot.prepared = true;
        }
        let mut send_commit = None;
        if slot.prepared && !slot.sent_commit {
            slot.sent_commit = true;
            let d = slot.pp.expect("prepared implies pre-prepared");
            slot.commits.insert(self.id, d);
            send_commit = Some(d);
        }
        if !slot.committed
            && quorum::committed_local(quorum, slot.prepared, slot.pp.as_ref(), &slot.commits)
        {
            slot.committed = true;
        }
        let committed = slot.committed;
        let prepared = slot.prepared;
        if let Some(digest) = send_commit {
            self.persist(Record::Prepared {
                view: self.view,
                seq,
                digest,
            });
            let c = Commit {
                view: self.view,
                seq,
                digest,
                replica: self.id,
            };
            self.broadcast(&Message::Commit(c));
        }
        if committed || (prepared && self.cfg.tentative_execution) {
            self.try_execute();
        }
    }

    // ----- execution --------------------------------------------------------------------------

    fn try_execute(&mut self) {
        if self.exec.diverged() || self.exec.walking() {
            return;
        }
        if self
            .exec
            .transfer_target()
            .is_some_and(|(seq, _)| seq > self.exec.last_executed())
            && !self.log.contains_key(&(self.exec.last_executed() + 1))
        {
            return;
        }
        if let Some(t) = self.exec.tentative() {
            // Within a view the slot keeps its digest (a view change undoes the batch first);
            // should it ever differ, the batch is undone rather than kept or waited for.
            match self.log.get(&t.seq) {
                Some(s) if s.pp != Some(t.digest) => self.undo_tentative(),
                Some(s) if s.committed => self.keep_tentative(),
                _ => {}
            }
        }
        if self.exec.tentative().is_none() {
            loop {
                let n = self.exec.last_executed() + 1;
                let Some(slot) = self.log.get(&n) else { break };
                if !slot.committed {
                    break;
                }
                let d = slot.pp.expect("committed implies pre-prepared");
                if d == NULL_DIGEST {
                    self.execute(n, NULL_DIGEST, None);
                } else if let Some(b) = self.batches.get(&d).cloned() {
                    self.execute(n, d, Some(b));
                } else {
                    break; // the body is fetched through status messages
                }
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
    fn try_tentative(&mut self) {
        if !self.cfg.tentative_execution
            || self.exec.tentative().is_some()
            || self.replaying
            || !self.normal
            || self.recovery.is_some()
            || self.exec.transfer_target().is_some()
        {
            return;
        }
        let n = self.exec.last_executed() + 1;
        let Some(slot) = self.log.get(&n) else {
            return;
        };
        if !slot.prepared || slot.committed {
            return;
        }
        let Some(d) = slot.pp.filter(|d| *d != NULL_DIGEST) else {
            return;
        };
        let Some(batch) = self.batches.get(&d).cloned() else {
            return;
        };
        if !self.cfg.tentative_for(batch.requests.len()) {
            return;
        }
        let nn = self.cfg.n();
        if batch
            .requests
            .iter()
            .any(|r| recovery::recovery_of(r.request.client, nn).is_some())
        {
            return;
        }
        self.exec.begin_tentative();
        let executed = self.apply(n, &batch, true);
        self.stats.tentative_batches += 1;
        self.exec.hold_tentative(n, d, batch, executed);
    }

    /// The tentative batch committed: its effects stay, and it completes like any batch.
    fn keep_tentative(&mut self) {
        let Some(t) = self.exec.keep_tentative() else {
            return;
        };
        self.persist_executed(t.seq, t.digest, Some(&t.batch));
        self.finish_execution(t.seq, t.digest, Some(&*t.batch), t.executed);
    }

    /// Undoes the tentative batch, if any (a view change, or state about to be replaced).
    /// Its clients learn the outcome from the batch's re-execution in a later view, or
    /// retransmit.
    fn undo_tentative(&mut self) {
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

    /// Executes batch `digest` (`None`: the null request) at `seq`, the next in order.
    fn execute(&mut self, seq: Seq, digest: Digest, batch: Option<Arc<Batch>>) {
        debug_assert_eq!(seq, self.exec.last_executed() + 1);
        debug_assert_eq!(digest, batch.as_ref().map_or(NULL_DIGEST, |b| b.digest()));
        self.persist_executed(seq, digest, batch.as_ref());
        let executed = match &batch {
            Some(b) => self.apply(seq, b, false),
            None => Vec::new(),
        };
        self.finish_execution(seq, digest, batch.as_deref(), executed);
    }

    /// Runs a batch's requests against the service (exactly once per client timestamp) and
    /// replies to their clients. Returns the requests executed.
    fn apply(&mut self, seq: Seq, b: &Batch, tentative: bool) -> Vec<(ClientId, u64)> {
        let mut executed = Vec::new();
        let quiet = self.quiet_for(b.requests.len());
        let time_ms = self.exec.start_batch(b.nondet.time_ms);
        for (i, r) in b.requests.iter().enumerate() {
            let req = &r.request;
            let c = req.client;
            if self.exec.ran(c, req.timestamp) {
                continue; // exactly once
            }
            let ctx = ExecContext {
                seq,
                client: c,
                time_ms,
                batch_seed: b.nondet.seed,
                index: i as u64,
            };
            let result = match recovery::recovery_of(req.client, self.cfg.n()) {
                Some(r) => {
                    let h_m = postcard::from_bytes::<RecoveryOp>(&req.op).map_or(0, |op| op.h_m);
                    self.execute_recovery(r, h_m, seq, time_ms)
                }
                None => self.exec.run(&req.op, &ctx),
            };
            executed.push((c, req.timestamp));
            let last = LastReply {
                timestamp: req.timestamp,
                result,
            };
            if self.replaying {
                self.exec.record(c, last);
                continue;
            }
            let to = self.requester(c);
            let reply = (!(quiet && matches!(to, Principal::Client(_))))
                .then(|| self.reply(c, req.timestamp, &last.result, tentative));
            self.exec.record(c, last);
            match (to, reply) {
                (_, None) => {} // a quiet primary: the backups answer
                (Principal::Replica(r), Some(Message::Reply(m))) if r == self.id => {
                    let _ = self.on_recovery_reply(r, m);
                }
                (to, Some(reply)) => self.send(to, &reply),
            }
        }
        executed
    }

    /// Completes the execution of batch `seq` (its requests ran, committed): it settles its
    /// requests, advances `last_executed`, and takes a checkpoint when one is due.
    fn finish_execution(
        &mut self,
        seq: Seq,
        digest: Digest,
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
        self.primary_progress_ms = self.now();
        self.stats.batches_executed += 1;
        self.stats.requests_executed += executed.len() as u64;
        if !executed.is_empty() && !self.executed_in_view {
            self.executed_in_view = true;
            self.vc_timeout_ms = self.cfg.view_change_timeout_ms;
        }
        self.event(Event::Executed {
            seq,
            view: self.view,
            digest,
            requests: executed,
        });
        self.arm_request_timer();
        if seq.is_multiple_of(self.cfg.checkpoint_interval) {
            self.take_checkpoint(seq);
        }
    }

    // ----- checkpoints ------------------------------------------------------------------------

    fn take_checkpoint(&mut self, seq: Seq) {
        debug_assert!(seq > self.exec.state().latest(), "checkpoints advance");
        let Some(digest) = self.exec.checkpoint(seq) else {
            return;
        };
        self.exec.note_checkpoint(seq, digest);
        self.event(Event::CheckpointTaken { seq, digest });
        let id = self.id;
        self.broadcast(&Message::Checkpoint(Checkpoint {
            seq,
            digest,
            replica: id,
        }));
        self.ckpt_votes.record(self.id, seq, digest);
        self.check_checkpoint(seq);
    }

    fn on_checkpoint(&mut self, from: ReplicaId, c: Checkpoint) -> Result<(), Reject> {
        if c.replica != from || !c.seq.is_multiple_of(self.cfg.checkpoint_interval) {
            return Err(Reject::Inconsistent);
        }
        let repairing = self.exec.repairing();
        if c.seq < self.stable_seq || (c.seq == self.stable_seq && !repairing) {
            return Ok(()); // old news
        }
        self.ckpt_votes.record(from, c.seq, c.digest);
        self.check_checkpoint(c.seq);
        // A new stable checkpoint may open the window for more proposals.
        self.try_propose();
        Ok(())
    }

    fn check_checkpoint(&mut self, seq: Seq) {
        let repairing = self.exec.repairing();
        if seq < self.stable_seq || (seq == self.stable_seq && !repairing) {
            return;
        }
        // Which digest, if any, is vouched for by f+1 (known correct) or 2f+1 (stable)?
        let Some((digest, count)) = self.ckpt_votes.leading(seq) else {
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
                let urgent = seq > self.stable_seq.saturating_add(self.cfg.log_size)
                    || seq >= self.exec.last_executed().saturating_add(self.cfg.log_size);
                self.start_transfer(seq, digest, urgent);
            }
            None => {}
        }
    }

    fn make_stable(&mut self, seq: Seq, digest: Digest) {
        self.release_send_cap_after(seq);
        if seq <= self.stable_seq {
            return;
        }
        if self.exec.own_checkpoint(seq).is_some() && self.exec.state().held(seq).is_some() {
            // The state's durable base moves first; the journal may then forget older records.
            self.exec.state_mut().commit_base(seq);
            self.persist(Record::Checkpoint { seq, digest });
        } else {
            self.persist(Record::Watermark { seq, digest });
        }
        self.stable_seq = seq;
        self.stable_digest = digest;
        self.log = self.log.split_off(&(seq + 1));
        self.pending_pp = self.pending_pp.split_off(&(seq + 1));
        self.exec.forget_executed_through(seq);
        self.exec.forget_checkpoints_below(seq);
        self.ckpt_votes.forget_through(seq);
        self.pset = self.pset.split_off(&(seq + 1));
        self.qset = self.qset.split_off(&(seq + 1));
        if self.next_seq <= seq {
            self.next_seq = seq + 1;
        }
        self.gc_batches();
        self.event(Event::Stable { seq });
    }

    /// Bodies of the batches PSet and QSet name, for the journal.
    fn pset_batches(&self) -> Vec<Batch> {
        if self.replaying {
            return Vec::new();
        }
        let mut ds: BTreeSet<Digest> = self.pset.values().map(|e| e.digest).collect();
        ds.extend(self.qset.values().flat_map(|v| v.iter().map(|(d, _)| *d)));
        // And those of the doubted slots, which join Q once their requests verify.
        ds.extend(self.doubted.values().map(|(_, d)| *d));
        ds.iter()
            .filter_map(|d| self.batches.get(d).map(|b| (**b).clone()))
            .collect()
    }

    /// The bodies we hold of `digests`, in order, up to half the message size limit: a message
    /// carrying them always fits; receivers ask for the rest through status messages.
    fn bodies_within_budget(&self, digests: &[Digest], budget: usize) -> Vec<Batch> {
        let per_request = 64 + 16 * self.cfg.n() as usize;
        let mut used = 0usize;
        let mut out = Vec::new();
        for d in digests.iter().filter(|d| **d != NULL_DIGEST) {
            let Some(b) = self.batches.get(d) else {
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
    fn status_body_budget(&self) -> usize {
        (2 * self.cfg.batch_bytes_max).min(self.cfg.message_bytes_max / 2)
    }

    /// Whether this replica sends batch bodies asked for in `from`'s status messages now. One
    /// replica at a time does, in turns of one status interval by its own clock over the
    /// replicas other than `from`: every status asks everyone, and n-1 copies of each body
    /// were all but one wasted. A faulty replica's turn answers nothing; the asker asks
    /// again at its next status and a correct replica's turn comes within f+1 turns. Clocks
    /// out of step only make two replicas answer, or none, for part of a turn.
    fn answers_bodies_to(&self, from: ReplicaId) -> bool {
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
    fn gc_batches(&mut self) {
        let mut keep: BTreeSet<Digest> = BTreeSet::new();
        keep.extend(self.log.values().filter_map(|s| s.pp));
        keep.extend(self.pset.values().map(|e| e.digest));
        keep.extend(self.qset.values().flat_map(|v| v.iter().map(|(d, _)| *d)));
        keep.extend(self.doubted.values().map(|(_, d)| *d));
        for nv in self.pending_nv.iter() {
            keep.extend(nv.chosen.iter().copied());
        }
        self.batches.retain(|d, _| keep.contains(d));
    }

    // ----- state transfer ---------------------------------------------------------------------

    /// Our state disagrees with what f+1 replicas vouch for: stop executing, check every page
    /// (corrupt ones are marked and counted) and fetch a vouched checkpoint.
    fn on_divergence(&mut self) {
        self.exec.set_diverged(true);
        self.exec.drop_unbegun_transfer();
        let report = self.exec.state_mut().check();
        if !report.corrupt.is_empty() {
            self.stats.corrupt_pages_found += report.corrupt.len() as u64;
            self.event(Event::StateCorrupt {
                pages: report.corrupt.len() as u64,
            });
        }
    }

    fn start_transfer(&mut self, seq: Seq, digest: Digest, urgent: bool) {
        let delay = if urgent {
            0
        } else {
            self.cfg.state_transfer_delay_ms
        };
        let first = self.env.entropy % self.cfg.n() as u64;
        self.exec
            .start_transfer(seq, digest, self.now(), delay, first);
    }

    fn drive_transfer(&mut self) {
        if self.exec.transfer_target().is_none() {
            self.probe_for_checkpoint();
            return;
        }
        match self.exec.transfer_due(self.now()) {
            Due::Nothing => return,
            Due::Begin => {
                // Fetching begins: undo the writes since our latest checkpoint so every page
                // we keep is described by our tree, and stop executing until the transfer
                // ends. A tentative batch is undone first (its entries in the exactly-once
                // table too).
                self.undo_tentative();
                self.exec.begin_walk();
            }
            Due::Ask => {}
        }
        // First ask, or a retry: whatever was asked and not answered is asked again, of
        // another replier.
        let voters = self
            .exec
            .transfer_target()
            .map(|(seq, digest)| self.ckpt_votes.voters(seq, &digest))
            .unwrap_or_default();
        self.exec
            .retry_with_next_replier(voters, self.id, self.cfg.n());
        self.send_fetch();
    }

    /// Asks the designated replier for the next partitions and arms the retry timer.
    fn send_fetch(&mut self) {
        let (max, retry) = (
            self.cfg.transfer_items_max,
            self.cfg.state_transfer_retry_ms,
        );
        if let Some((to, fetch)) = self.exec.next_fetch(self.now(), max, retry) {
            self.send_replica(to, &Message::Fetch(fetch));
        }
    }

    /// With a known-bad state and no checkpoint to fetch, ask every replica for the root of
    /// its latest stable checkpoint; f+1 matching answers give a digest to fetch.
    fn probe_for_checkpoint(&mut self) {
        let retry = self.cfg.state_transfer_retry_ms;
        if let Some(fetch) = self.exec.probe_due(self.now(), retry) {
            let msg = Message::Fetch(fetch);
            for r in 0..self.cfg.n() {
                self.send_replica(r, &msg);
            }
        }
    }

    fn on_fetch(&mut self, from: ReplicaId, f: Fetch) -> Result<(), Reject> {
        let limits = ServeLimits {
            items_max: self.cfg.transfer_items_max,
            reply_bytes_max: self.cfg.transfer_reply_bytes_max,
            rate_bytes_per_sec: self.cfg.transfer_rate_bytes_per_sec,
        };
        let served_before = self.exec.served_bytes();
        match self
            .exec
            .serve(from, &f, self.stable_seq, self.now(), limits)
        {
            Ok(data) => {
                self.stats.transfer_bytes_out += self.exec.served_bytes() - served_before;
                self.send_replica(from, &Message::StateData(data));
                Ok(())
            }
            Err(Refused::Rejected(r)) => Err(r),
            Err(Refused::CorruptPage) => {
                // Our own page is corrupt: stop serving and repair ourselves.
                self.stats.corrupt_pages_found += 1;
                self.event(Event::StateCorrupt { pages: 1 });
                self.exec.set_diverged(true);
                Err(Reject::Stale)
            }
        }
    }

    fn on_state_data(&mut self, from: ReplicaId, d: StateData, len: usize) -> Result<(), Reject> {
        self.stats.transfer_bytes_in += len as u64;
        if !self.exec.walking() {
            return self.on_probe_answer(from, d);
        }
        #[cfg(feature = "mutants")]
        let check_pages = self.cfg.mutant != crate::types::Mutant::TrustReplier;
        #[cfg(not(feature = "mutants"))]
        let check_pages = true;
        match self.exec.answer(from, &d, check_pages) {
            Err(e) => {
                if e == Reject::BadState {
                    self.stats.transfer_bad_answers += 1;
                }
                Err(e)
            }
            Ok(Answered::Nothing) => Ok(()),
            Ok(Answered::Dirty) => {
                // Only a test's tampering writes during a walk. The rollback may undo
                // installed pages too, so the walk starts again from the root.
                self.undo_tentative();
                self.exec.restart_walk();
                Ok(())
            }
            Ok(Answered::Complete) => {
                self.finish_transfer();
                Ok(())
            }
            Ok(Answered::Ask) => {
                // Keep the designated replier busy: ask for the next partitions right away.
                self.send_fetch();
                Ok(())
            }
        }
    }

    /// An answer to a probe (`Fetch` for seq 0): the root of the sender's stable checkpoint.
    /// It counts as that replica's CHECKPOINT vote; f+1 matching ones start a transfer.
    fn on_probe_answer(&mut self, from: ReplicaId, d: StateData) -> Result<(), Reject> {
        let (seq, digest) = self.exec.probe_answer(&d, self.cfg.checkpoint_interval)?;
        self.ckpt_votes.record(from, seq, digest);
        self.check_checkpoint(seq);
        Ok(())
    }

    /// The walk installed everything that differed: check the whole state against the
    /// checkpoint digest and adopt it.
    fn finish_transfer(&mut self) {
        #[cfg(feature = "mutants")]
        let recheck = self.cfg.mutant != crate::types::Mutant::TrustReplier;
        #[cfg(not(feature = "mutants"))]
        let recheck = true;
        let Finished::Adopted {
            seq,
            digest,
            aux,
            pages,
            metas,
        } = self.exec.finish_walk(recheck)
        else {
            // Cannot happen when every answer checked out, unless our own pages changed
            // under us: the walk starts again from the root asking for everything.
            return;
        };
        let recoveries_before = self.recovery_timestamps();
        if self.exec.load_aux(seq, &aux).is_err() {
            // f+1 replicas vouch for this state, so a page we kept must be corrupt in a way our
            // entries did not show. Check every page, stay diverged, fetch again.
            self.exec.set_diverged(true);
            let report = self.exec.state_mut().check();
            self.stats.corrupt_pages_found += report.corrupt.len() as u64;
            self.event(Event::StateCorrupt {
                pages: report.corrupt.len() as u64,
            });
            return;
        }
        self.exec.set_diverged(false);
        self.rekey_if_recoveries_changed(&recoveries_before);
        self.stats.state_transfers += 1;
        self.stats.transfer_pages += pages;
        self.stats.transfer_metas += metas;
        let stable = self.stable_seq;
        self.exec.forget_checkpoints_but(stable, seq);
        self.exec.note_checkpoint(seq, digest);
        // Our state now is that checkpoint, every page checked against its digest: vouch for
        // it like for one we took. Without our vote a checkpoint that only the replicas which
        // executed up to it vouch for may never become stable when another replica is silent,
        // and a recovering replica waits for exactly that (seed 1224 of --all-optimizations).
        let id = self.id;
        self.ckpt_votes.record(id, seq, digest);
        self.broadcast(&Message::Checkpoint(Checkpoint {
            seq,
            digest,
            replica: id,
        }));
        // Requests settled by the transferred state are no longer waited for.
        let settled: Vec<(ClientId, u64)> = self
            .exec
            .replies()
            .map(|(c, l)| (*c, l.timestamp))
            .collect();
        for (c, ts) in settled {
            self.request_done(c, ts);
        }
        self.persist(Record::Checkpoint { seq, digest });
        self.event(Event::StateTransferred {
            seq,
            digest,
            pages,
            metas,
        });
        if self.next_seq <= seq {
            self.next_seq = seq + 1;
        }
        if self.stable_seq < seq && self.ckpt_votes.voters(seq, &digest).len() >= self.cfg.quorum()
        {
            self.make_stable(seq, digest);
        }
        self.arm_request_timer();
        self.try_execute();
    }

    // ----- view change ------------------------------------------------------------------------

    fn slot_summaries(&self) -> BTreeMap<Seq, SlotSummary> {
        let primary = self.is_primary();
        self.log
            .iter()
            .filter(|(_, s)| s.pp.is_some())
            .map(|(n, s)| {
                // Pre-prepared for the view change only if we vouched for every request.
                let pre = s.vouched_by(self.id) || (primary && s.pp.is_some());
                (
                    *n,
                    SlotSummary {
                        prepared: if s.prepared { s.pp } else { None },
                        preprepared: if pre { s.pp } else { None },
                    },
                )
            })
            .collect()
    }

    /// Sends VIEW-CHANGE for `v` and enters it (not yet active).
    fn start_view_change(&mut self, v: View) {
        debug_assert!(v > self.view || (v == self.view && self.normal));
        if v <= self.view && !self.normal {
            return;
        }
        // A batch executed tentatively may not survive into the new view: undo it now; if
        // the new view keeps it, it executes again when it commits there.
        self.undo_tentative();
        // P and Q from the log of the view we leave (only meaningful if we were active in it).
        let slots = if self.normal {
            self.slot_summaries()
        } else {
            BTreeMap::new()
        };
        if self.normal {
            self.suspect_doubted_clients();
        }
        if self.normal && !self.is_primary() {
            let me = self.id;
            let left = self.view;
            for (n, s) in &self.log {
                if let Some(d) = s.pp.filter(|d| *d != NULL_DIGEST) {
                    if s.sent_prepare && s.doubts.contains_key(&me) {
                        self.doubted.insert(*n, (left, d));
                    }
                }
            }
        }
        let (lo, hi) = (self.stable_seq, self.stable_seq + self.cfg.log_size);
        self.doubted.retain(|n, _| *n > lo && *n <= hi);
        let (p, q) = viewchange::compute_pq(
            self.cfg.f,
            self.stable_seq,
            self.cfg.log_size,
            self.view,
            &slots,
            &self.pset,
            &self.qset,
        );
        self.pset = p;
        self.qset = q;
        self.log.clear();
        let (pw, qw) = viewchange::to_wire(&self.pset, &self.qset);
        let vc = ViewChange {
            view: v,
            replica: self.id,
            ls: self.stable_seq,
            checkpoints: self.exec.own_checkpoints_from(self.stable_seq),
            p: pw,
            q: qw,
        };
        let digest = vc.digest();
        self.view = v;
        self.normal = false;
        self.stats.view_changes += 1;
        self.vc_deadline_ms = None;
        self.req_timer = None;
        self.pool.clear_inflight();
        self.pending_pp.clear();
        self.pending_nv = None;
        self.new_view = None;
        self.decision_missing.clear();
        self.executed_in_view = false;
        // Keep the previous view's messages too: lagging replicas may still need them relayed.
        self.vcstore.enter(v);
        self.prev_vc = self.my_vc.take();
        self.my_vc = Some((vc.clone(), digest));
        let (pset, qset) = viewchange::to_wire(&self.pset, &self.qset);
        let batches = self.pset_batches();
        self.persist(Record::View {
            view: v,
            normal: false,
            vc: Some(vc.clone()),
            pset,
            qset,
            batches,
            doubted: self.doubted_wire(),
        });
        self.event(Event::ViewChangeStarted { view: v });
        self.broadcast(&Message::ViewChange(vc));
        // Vouch now for the view changes of this view we stored before entering it.
        let p = self.cfg.primary(v);
        if p != self.id {
            let acks: Vec<ViewChangeAck> = self
                .vcstore
                .for_view(v)
                .filter(|(r, _, _)| *r != p)
                .map(|(r, _, d)| ViewChangeAck {
                    view: v,
                    acker: self.id,
                    sender: r,
                    digest: d,
                })
                .collect();
            for a in acks {
                self.send_replica(p, &Message::ViewChangeAck(a));
            }
        }
        self.gc_batches();
        self.after_vc_update();
    }

    fn on_view_change(&mut self, from: ReplicaId, vc: ViewChange) -> Result<(), Reject> {
        if vc.replica != from || from == self.id {
            return Err(Reject::Inconsistent);
        }
        viewchange::validate(
            &vc,
            self.cfg.f,
            self.cfg.checkpoint_interval,
            self.cfg.log_size,
        )
        .map_err(|_| Reject::Inconsistent)?;
        if vc.view < self.view || (vc.view == self.view && self.normal) {
            return Err(Reject::Stale);
        }
        if vc.view > self.view + VC_VIEWS_AHEAD {
            // Too far ahead to keep the message (a faulty replica could plant messages for
            // views we may reach much later): only the sender's claim to be at that view
            // counts, for the f+1 join rule. Once we join, its VIEW-CHANGE comes again.
            self.vcstore.claim(from, vc.view);
            self.after_vc_update();
            return Err(Reject::OutOfWindow);
        }
        let digest = vc.digest();
        let view = vc.view;
        if self.vcstore.store(vc, digest, self.view) == Stored::Conflict {
            return Err(Reject::Conflict); // the first stands
        }
        // Vouch for it to the primary of its view, but only for the next view at most: acks
        // for views we may never enter would only fill the primary's bounded ack store.
        let p = self.cfg.primary(view);
        if p != from && p != self.id && view <= self.view.saturating_add(1) {
            let ack = Message::ViewChangeAck(ViewChangeAck {
                view,
                acker: self.id,
                sender: from,
                digest,
            });
            self.send_replica(p, &ack);
        }
        // A primary stepping down hands over at once.
        if self.normal && from == self.primary() && view == self.view.saturating_add(1) {
            self.start_view_change(view);
            return Ok(());
        }
        self.after_vc_update();
        Ok(())
    }

    /// Re-evaluates the join rule, the view-change timer and pending decisions after the set of
    /// view-change messages changed.
    fn after_vc_update(&mut self) {
        let others = self.vcstore.highest_views();
        let join_f = if self.mutant("join-at-f") {
            self.cfg.f.saturating_sub(1)
        } else {
            self.cfg.f
        };
        if let Some(v) = quorum::join_view(join_f, self.view, &others) {
            if v > self.view {
                self.start_view_change(v);
                return;
            }
        }
        if !self.normal {
            // Replicas that left this view's predecessors: a VIEW-CHANGE for this view, or for
            // a later one (a replica whose timer for this view expired already, and who no
            // longer retransmits its VIEW-CHANGE for it). Counting only this view's left two
            // correct replicas waiting for a third that had moved on (simulator seed 10294
            // with --quiet-primary: a silent replica, one VIEW-CHANGE lost).
            let count = 1 + others.values().filter(|v| **v >= self.view).count();
            if count >= self.cfg.quorum() && self.vc_deadline_ms.is_none() {
                self.vc_deadline_ms = Some(self.now() + self.vc_timeout_ms);
            }
            if self.is_primary() {
                self.try_new_view();
            } else {
                self.try_accept_new_view();
            }
        }
    }

    fn on_ack(&mut self, from: ReplicaId, ack: ViewChangeAck) -> Result<(), Reject> {
        if ack.acker != from || ack.sender == from {
            return Err(Reject::Inconsistent);
        }
        // Acks may arrive before this replica enters their view; keep them (bounded).
        if ack.view < self.view || (ack.view == self.view && self.normal) {
            return Err(Reject::Stale);
        }
        if ack.view > self.view.saturating_add(1) {
            return Err(Reject::OutOfWindow);
        }
        // Acks for our own VIEW-CHANGE are kept only when we hold none (after a recovery's
        // view estimate): then it comes relayed, with them.
        if (ack.sender == self.id && self.my_vc.is_some()) || ack.sender >= self.cfg.n() {
            return Ok(());
        }
        // Each acker may hold a bounded number of entries, so a faulty one cannot crowd out
        // the acks of correct replicas.
        if !self.vcstore.ack(ack.view, ack.sender, ack.digest, from) {
            return Err(Reject::TooLarge);
        }
        if ack.view == self.view {
            if self.is_primary() {
                self.try_new_view();
            } else {
                self.try_accept_new_view();
            }
        }
        Ok(())
    }

    /// Acks for `sender`'s VIEW-CHANGE with `digest` in our view, from replicas other than
    /// ourselves, the sender, and `also_excluded`.
    fn ack_count(
        &self,
        sender: ReplicaId,
        digest: &Digest,
        also_excluded: Option<ReplicaId>,
    ) -> usize {
        self.vcstore
            .ackers(self.view, sender, digest)
            .into_iter()
            .filter(|a| *a != self.id && *a != sender && Some(*a) != also_excluded)
            .count()
    }

    /// The new primary: S, then the decision procedure, then NEW-VIEW.
    fn try_new_view(&mut self) {
        if self.normal || !self.is_primary() {
            return;
        }
        let Some((mine, my_digest)) = self.my_vc.clone() else {
            return;
        };
        let need_acks = if self.mutant("acks-at-zero") {
            0
        } else {
            2 * self.cfg.f as usize - 1
        };
        let mut s: Vec<(ReplicaId, Digest, ViewChange)> = vec![(self.id, my_digest, mine)];
        for (r, m, d) in self.vcstore.for_view(self.view) {
            if self.ack_count(r, &d, None) >= need_acks {
                s.push((r, d, m.clone()));
            }
        }
        if s.len() < self.cfg.quorum() {
            return;
        }
        let refs: Vec<&ViewChange> = s.iter().map(|(_, _, m)| m).collect();
        let batches = &self.batches;
        let outcome = viewchange::decide(
            self.cfg.f,
            self.cfg.log_size,
            &refs,
            |d| batches.contains_key(d),
            self.broken_decision(),
        );
        match outcome {
            Ok(dec) => {
                let bodies = self.bodies_within_budget(&dec.chosen, self.cfg.message_bytes_max / 2);
                let nv = NewView {
                    view: self.view,
                    vcs: s.iter().map(|(r, d, _)| (*r, *d)).collect(),
                    checkpoint: dec.checkpoint,
                    chosen: dec.chosen,
                    batches: bodies,
                };
                self.broadcast(&Message::NewView(nv.clone()));
                self.install_new_view(nv);
            }
            Err(Pending::NeedBatches(ds)) => self.decision_missing = ds,
            Err(_) => {}
        }
    }

    /// The decision procedure's deliberately broken variants, under the simulator's mutants.
    fn broken_decision(&self) -> viewchange::Broken {
        #[cfg(feature = "mutants")]
        {
            use crate::types::Mutant;
            let m = self.cfg.mutant;
            viewchange::Broken {
                any_prepared: m == Mutant::ViewChangeAnyPrepared,
                no_a2: m == Mutant::NoA2,
                null_at_2f: m == Mutant::NullAt2f,
                checkpoint_at_f: m == Mutant::CheckpointAtF,
            }
        }
        #[cfg(not(feature = "mutants"))]
        viewchange::Broken::default()
    }

    /// Whether the simulator's mutant `m` is on.
    #[allow(unused_variables)]
    pub(super) fn mutant(&self, m: &str) -> bool {
        #[cfg(feature = "mutants")]
        return crate::types::Mutant::ALL
            .iter()
            .any(|(name, x)| *name == m && *x == self.cfg.mutant);
        #[cfg(not(feature = "mutants"))]
        false
    }

    fn on_new_view(&mut self, from: ReplicaId, nv: NewView) -> Result<(), Reject> {
        if from != self.cfg.primary(nv.view) || from == self.id {
            return Err(Reject::Inconsistent);
        }
        if nv.view < self.view || (nv.view == self.view && self.normal) {
            return Err(Reject::Stale);
        }
        let mut ids: Vec<ReplicaId> = nv.vcs.iter().map(|(r, _)| *r).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != nv.vcs.len()
            || nv.vcs.len() < self.cfg.quorum()
            || ids.iter().any(|r| *r >= self.cfg.n())
            || nv.chosen.len() as u64 > self.cfg.log_size
            || !nv.checkpoint.0.is_multiple_of(self.cfg.checkpoint_interval)
            || nv.batches.len() > nv.chosen.len()
        {
            return Err(Reject::Inconsistent);
        }
        if nv.view > self.view {
            // A NEW-VIEW alone never moves us: a faulty primary of any future view could send
            // one. We enter a view by our timer or the f+1 rule; its primary then retransmits
            // the NEW-VIEW in answer to our status.
            return Err(Reject::OutOfWindow);
        }
        if self.pending_nv.is_some() {
            return Ok(()); // the first NEW-VIEW for a view is the one we check
        }
        let chosen: BTreeSet<Digest> = nv.chosen.iter().copied().collect();
        for b in &nv.batches {
            let d = b.digest();
            if chosen.contains(&d) {
                self.batches.insert(d, Arc::new(b.clone()));
            }
        }
        let mut nv = nv;
        nv.batches.clear();
        self.pending_nv = Some(nv);
        self.try_accept_new_view();
        Ok(())
    }

    /// The view-change messages a pending NEW-VIEW names, or the pairs still missing.
    fn gather_nv_vcs(&self, nv: &NewView) -> Result<Vec<ViewChange>, Vec<(ReplicaId, Digest)>> {
        let mut found = Vec::new();
        let mut missing = Vec::new();
        for (r, d) in &nv.vcs {
            if *r == self.id && self.my_vc.is_some() {
                match &self.my_vc {
                    Some((m, md)) if md == d => found.push(m.clone()),
                    _ => missing.push((*r, *d)),
                }
                continue;
            }
            match self.vcstore.get(*r, nv.view) {
                Some((m, md)) if md == d => found.push(m.clone()),
                _ => match self.vcstore.relayed(*r, d) {
                    // f acks from replicas other than the sender and the new primary (whose
                    // NEW-VIEW is already its vouch): with the primary's, f+1 vouchers.
                    Some(m)
                        if self.mutant("acks-at-zero")
                            || self.ack_count(*r, d, Some(self.cfg.primary(nv.view)))
                                >= self.cfg.f as usize =>
                    {
                        found.push(m.clone())
                    }
                    _ => missing.push((*r, *d)),
                },
            }
        }
        if missing.is_empty() {
            Ok(found)
        } else {
            Err(missing)
        }
    }

    fn try_accept_new_view(&mut self) {
        let Some(nv) = self.pending_nv.clone() else {
            return;
        };
        if self.normal || nv.view != self.view {
            return;
        }
        // Our own view change must be named with its true digest if it is named at all
        // (after a recovery's view estimate we hold none: it comes relayed like the others).
        if let Some((_, d)) = nv.vcs.iter().find(|(r, _)| *r == self.id) {
            if self.my_vc.as_ref().is_some_and(|(_, md)| md != d) {
                self.bad_new_view();
                return;
            }
        }
        let vcs = match self.gather_nv_vcs(&nv) {
            Ok(v) => v,
            Err(_) => return, // fetched through status messages
        };
        for m in &vcs {
            if m.view != nv.view
                || viewchange::validate(
                    m,
                    self.cfg.f,
                    self.cfg.checkpoint_interval,
                    self.cfg.log_size,
                )
                .is_err()
            {
                self.bad_new_view();
                return;
            }
        }
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        let outcome = viewchange::decide(
            self.cfg.f,
            self.cfg.log_size,
            &refs,
            |_| true,
            self.broken_decision(),
        );
        match outcome {
            Ok(dec) if dec.checkpoint == nv.checkpoint && dec.chosen == nv.chosen => {
                self.install_new_view(nv);
            }
            _ => self.bad_new_view(),
        }
    }

    /// The NEW-VIEW does not follow from its view changes: the primary is faulty.
    fn bad_new_view(&mut self) {
        self.pending_nv = None;
        self.event(Event::Rejected {
            from: Principal::Replica(self.primary()),
            kind: "new-view",
            reason: Reject::Inconsistent,
        });
        self.vc_timeout_ms = (self.vc_timeout_ms * 2).min(self.cfg.view_change_timeout_max_ms);
        self.start_view_change(self.view.saturating_add(1));
    }

    /// Moves the low watermark to checkpoint `h` (`hd`), which this replica does not hold:
    /// what lies at or below it is forgotten, and the checkpoint is fetched if our state is
    /// behind it (or diverged).
    fn adopt_watermark(&mut self, h: Seq, hd: Digest) {
        if self.exec.own_checkpoint(h).is_some_and(|d| d != hd) {
            // Our checkpoint at h differs from the one f+1 replicas reported (found by a
            // NEW-VIEW, or again after a restart that re-executed up to it).
            self.event(Event::StateDivergence { seq: h });
            self.exec.forget_checkpoint(h);
            self.on_divergence();
        }
        self.stable_seq = h;
        self.stable_digest = hd;
        self.exec.forget_executed_through(h);
        self.exec.forget_checkpoints_below(h);
        self.ckpt_votes.forget_through(h);
        self.log = self.log.split_off(&(h + 1));
        self.pset = self.pset.split_off(&(h + 1));
        self.qset = self.qset.split_off(&(h + 1));
        if self.next_seq <= h {
            self.next_seq = h + 1;
        }
        if self.exec.last_executed() < h || self.exec.diverged() {
            self.start_transfer(h, hd, true);
        }
    }

    fn install_new_view(&mut self, nv: NewView) {
        let (h, hd) = nv.checkpoint;
        self.normal = true;
        self.primary_progress_ms = self.now();
        self.vc_deadline_ms = None;
        self.pending_nv = None;
        self.decision_missing.clear();
        if h > self.stable_seq {
            match self.exec.own_checkpoint(h) {
                Some(d) if d == hd => self.make_stable(h, hd),
                _ => {
                    self.persist(Record::Watermark { seq: h, digest: hd });
                    self.adopt_watermark(h, hd);
                }
            }
        }
        // A correct NEW-VIEW never contradicts what this replica executed: that would mean
        // more than f faults (or a protocol bug). Report it loudly; the simulator fails on it.
        for (i, d) in nv.chosen.iter().enumerate() {
            let n = h + 1 + i as u64;
            if let Some(done) = self.exec.executed_at(n) {
                if done != *d {
                    self.event(Event::Contradiction {
                        seq: n,
                        executed: done,
                        chosen: *d,
                    });
                }
            }
        }
        self.log.clear();
        let primary = self.is_primary();
        let mut prepares = Vec::new();
        for (i, d) in nv.chosen.iter().enumerate() {
            let n = h + 1 + i as u64;
            if n <= self.stable_seq {
                continue; // already below our low watermark (we fetched a later checkpoint)
            }
            let slot = self.log.entry(n).or_default();
            slot.pp = Some(*d);
            if !primary {
                slot.sent_prepare = true;
                slot.prepares.insert(self.id, *d);
                prepares.push((n, *d));
            }
        }
        let (pset, qset) = viewchange::to_wire(&self.pset, &self.qset);
        let batches = self.pset_batches();
        self.persist(Record::View {
            view: self.view,
            normal: true,
            vc: self.my_vc.as_ref().map(|(m, _)| m.clone()),
            pset,
            qset,
            batches,
            doubted: self.doubted_wire(),
        });
        let installed: Vec<(Seq, Digest)> = self
            .log
            .iter()
            .filter_map(|(n, slot)| slot.pp.map(|d| (*n, d)))
            .collect();
        for (n, d) in installed {
            let batch = self.batches.get(&d).cloned();
            self.persist(Record::PrePrepared {
                view: self.view,
                seq: n,
                digest: d,
                batch,
                vouched: true,
            });
        }
        let last = h + nv.chosen.len() as u64;
        self.next_seq = (last + 1).max(self.exec.last_executed() + 1).max(h + 1);
        self.new_view = Some(nv);
        self.gc_batches();
        self.event(Event::NewViewInstalled { view: self.view });
        for (n, d) in prepares {
            let id = self.id;
            let view = self.view;
            self.broadcast(&Message::Prepare(Prepare {
                view,
                seq: n,
                digest: d,
                replica: id,
                doubts: Vec::new(),
            }));
        }
        let seqs: Vec<Seq> = self.log.keys().copied().collect();
        for n in seqs {
            self.check_slot(n);
        }
        // Requests still waiting go to the new primary; the timer restarts for them.
        if primary {
            self.try_propose();
        } else {
            let p = self.primary();
            let reqs: Vec<SignedRequest> = self
                .pool
                .in_order()
                .take(self.cfg.batch_requests_max)
                .map(|(_, w)| w.req.clone())
                .collect();
            for r in reqs {
                self.send_replica(p, &Message::Request(r));
            }
            self.arm_request_timer();
        }
    }

    fn on_relayed_vc(&mut self, _from: ReplicaId, vc: ViewChange) -> Result<(), Reject> {
        let digest = vc.digest();
        let wanted = self
            .pending_nv
            .as_ref()
            .is_some_and(|nv| nv.vcs.contains(&(vc.replica, digest)));
        if !wanted {
            return Err(Reject::Unexpected);
        }
        self.vcstore.relay(vc, digest);
        self.try_accept_new_view();
        Ok(())
    }

    fn on_batches(&mut self, bodies: Vec<Batch>) -> Result<(), Reject> {
        let mut wanted: BTreeSet<Digest> = self.log.values().filter_map(|s| s.pp).collect();
        wanted.extend(self.decision_missing.iter().copied());
        wanted.extend(self.pending_pp.values().map(|p| p.pp.digest));
        wanted.extend(self.pset.values().map(|e| e.digest));
        let mut useful = false;
        for b in bodies {
            let d = b.digest();
            if wanted.contains(&d) && !self.batches.contains_key(&d) {
                self.batches.insert(d, Arc::new(b));
                useful = true;
            }
        }
        if !useful {
            return Err(Reject::Unexpected);
        }
        if !self.pending_pp.is_empty() {
            self.retry_pending();
        }
        self.try_execute();
        if !self.normal && self.is_primary() {
            self.try_new_view();
        }
        Ok(())
    }

    // ----- timers -------------------------------------------------------------------------

    fn tick(&mut self) {
        let now = self.now();
        if self.normal {
            if let Some((deadline, c, ts)) = self.req_timer {
                if now >= deadline {
                    let still = self
                        .pool
                        .get(c)
                        .is_some_and(|w| w.req.request.timestamp == ts);
                    self.req_timer = None;
                    // A request committed here but not yet executed, with nothing the
                    // primary owes us before it, waits on us (a state transfer, a missing
                    // batch body) and not on the primary: a lone view change would only
                    // leave us behind in a view the others never join (simulator seed 10998
                    // with --hybrid: a replica fetching state after its recovery sat 5 s in
                    // such a view while the others went on without it).
                    if still && self.committed_here(c, ts) {
                        self.req_timer = Some((now + self.vc_timeout_ms, c, ts));
                    } else if still && !self.is_primary() {
                        self.vc_timeout_ms =
                            (self.vc_timeout_ms * 2).min(self.cfg.view_change_timeout_max_ms);
                        self.start_view_change(self.view.saturating_add(1));
                    } else {
                        self.arm_request_timer();
                    }
                }
            }
            // Backups suspect a primary whose requests do not execute; a primary suspects
            // itself when its own proposals do not: the replicas that would commit them may
            // have left the view (their timers fired while messages were lost), and with
            // them gone nobody else may ever time out (every request already executed
            // somewhere, or none waiting). A view change is always safe.
            if self.is_primary() && self.exec.transfer_target().is_none() && self.recovery.is_none()
            {
                if self.next_seq <= self.exec.last_executed().saturating_add(1) {
                    self.primary_progress_ms = now;
                } else if now >= self.primary_progress_ms.saturating_add(self.vc_timeout_ms) {
                    self.stats.primary_stalls += 1;
                    self.vc_timeout_ms =
                        (self.vc_timeout_ms * 2).min(self.cfg.view_change_timeout_max_ms);
                    self.start_view_change(self.view.saturating_add(1));
                }
            }
        } else if let Some(deadline) = self.vc_deadline_ms {
            if now >= deadline {
                self.vc_timeout_ms =
                    (self.vc_timeout_ms * 2).min(self.cfg.view_change_timeout_max_ms);
                self.start_view_change(self.view.saturating_add(1));
            }
        }
        self.drive_transfer();
        self.tick_keys();
        self.drive_recovery();
        // An idle primary still drives a recovering replica to its recovery point; "idle"
        // includes holding only unsigned requests of suspected clients, which it does not
        // order (until the fix the recovery of simulator seed 1983 with --all-optimizations
        // waited forever behind one).
        if self.is_primary() && (self.pool.is_empty() || self.recovery_progress_target().is_some())
        {
            self.try_propose();
        }
        if now >= self.next_status_ms {
            self.next_status_ms = now + self.cfg.status_interval_ms;
            self.send_status();
        }
    }
}

/// VIEW-CHANGE messages are kept only for views up to this far beyond ours.
pub const VC_VIEWS_AHEAD: View = 4;
/// Bound on digests named as missing in one status message.
const MISSING_MAX: usize = 32;

/// Sizes of a replica's bounded structures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub log_slots: usize,
    pub pending_pre_prepares: usize,
    pub executed: usize,
    pub batches: usize,
    pub checkpoints: usize,
    pub checkpoint_votes: usize,
    pub pset: usize,
    pub qset_pairs: usize,
    pub clients: usize,
    pub waiting: usize,
    pub replaced: usize,
    pub replaced_bytes: usize,
    pub arrivals: usize,
    pub reads: usize,
    pub view_changes: usize,
    pub acks: usize,
    pub bodies_journaled: usize,
    pub state: StateFootprint,
}

impl Footprint {
    /// Names of the fields of `self` that exceed `bound`.
    pub fn exceeds(&self, bound: &Footprint) -> Vec<&'static str> {
        let pairs = [
            ("log_slots", self.log_slots, bound.log_slots),
            (
                "pending_pre_prepares",
                self.pending_pre_prepares,
                bound.pending_pre_prepares,
            ),
            ("executed", self.executed, bound.executed),
            ("batches", self.batches, bound.batches),
            ("checkpoints", self.checkpoints, bound.checkpoints),
            (
                "checkpoint_votes",
                self.checkpoint_votes,
                bound.checkpoint_votes,
            ),
            ("pset", self.pset, bound.pset),
            ("qset_pairs", self.qset_pairs, bound.qset_pairs),
            ("clients", self.clients, bound.clients),
            ("waiting", self.waiting, bound.waiting),
            ("replaced", self.replaced, bound.replaced),
            ("replaced_bytes", self.replaced_bytes, bound.replaced_bytes),
            ("arrivals", self.arrivals, bound.arrivals),
            ("reads", self.reads, bound.reads),
            ("view_changes", self.view_changes, bound.view_changes),
            ("acks", self.acks, bound.acks),
            (
                "bodies_journaled",
                self.bodies_journaled,
                bound.bodies_journaled,
            ),
            (
                "state_checkpoints",
                self.state.checkpoints,
                bound.state.checkpoints,
            ),
            (
                "state_copied_pages",
                self.state.copied_pages,
                bound.state.copied_pages,
            ),
            (
                "state_copied_nodes",
                self.state.copied_nodes,
                bound.state.copied_nodes,
            ),
        ];
        pairs
            .iter()
            .filter(|(_, v, b)| v > b)
            .map(|(n, _, _)| *n)
            .collect()
    }
}
