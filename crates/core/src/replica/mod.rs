//! The PBFT replica as a deterministic state machine (Input -> Effects).
//!
//! A replica composes the execution component (`crate::execution`: service, paged state,
//! reply table, tentative execution, its own checkpoints, state transfer fetch and serve) with
//! agreement's components (`crate::agreement`: request pool, checkpoint certificates,
//! view-change messages) and the protocol that ties them together, one file per job:
//!
//! - `mod.rs`: the struct, accessors, the entry point `handle`, sending, receiving, timers;
//! - `requests.rs`: client requests, replies, the request timer, the primary's proposals;
//! - `normal.rs`: pre-prepare, prepare (with doubts), commit (PBFT §4.2);
//! - `execute.rs`: batches down to execution in order, checkpoints and watermarks (§4.3);
//! - `state_transfer.rs`: when to fetch and adopting a fetched checkpoint (BFT-PR §4.6.2);
//! - `view_change.rs`: the MAC-only view change (BFT-PR §4.3);
//! - `status.rs`: receiver-driven retransmission (BFT-PR §4.6.1);
//! - `restart.rs`: restart from the journal; `recovery/`: proactive recovery (BFT-PR
//!   §4.4–4.5: the recovery in progress, its estimate, its request, and recovery requests
//!   as every replica executes them); `new_key.rs`: session keys; `suspects.rs`: clients
//!   under suspicion;
//! - `pace.rs`: the primary's pace check; `firewall.rs`, `separated.rs`: the deployments
//!   with execution apart; `prime.rs` (with `prime/keys.rs`, order keys and incarnations):
//!   Prime's ordering (ADR 0007).
//!
//! Everything it sends leaves as [`Effect`]s. Every bound is explicit: the log holds at most L
//! slots, checkpoints and checkpoint votes are limited to the window, the request pool holds at
//! most one request per known client, and view-change bookkeeping is bounded per replica.

use crate::agreement::certificates::CheckpointVotes;
use crate::agreement::heard::Heard;
use crate::agreement::log::{Slot, SlotLog};
use crate::agreement::pool::{Pick, RequestPool, Waiting};
use crate::agreement::proposals::{Batches, Host, Proposals};
use crate::agreement::vcstore::{Stored, ACKS_PER_ACKER_MAX};
use crate::auth::Auth;
use crate::effect::{Bytes, Effect, Env, Event, RecoveryReport, ViewChangeCause};
use crate::execution::{Answered, Due, Execution, Finished, Refused, ServeLimits, Step, Undone};
use crate::journal::Record;
use crate::keys::KeyTable;
use crate::keys::NewKey;
use crate::message::*;
use crate::preopen::{Head, Preopened};
use crate::quorum;
use crate::seal::{seal, verify_request};
use crate::service::Service;
use crate::transfer::checkpoint_digest_of;
use crate::types::{ClientId, Config, FilterId, Principal, ReplicaId, Seq, View};
use crate::viewchange::{self, Pending, SlotSummary};
use redoubt_crypto::Digest;
use redoubt_state::{PagedState, StateFootprint};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod authenticate;
mod execute;
mod firewall;
mod footprint;
mod new_key;
mod normal;
mod pace;
mod prime;
mod proposals;
use prime::installed_key;
mod recovery;
mod requests;
mod restart;
mod separated;
mod state_transfer;
mod status;
mod suspects;
mod view_change;
mod views;

pub use crate::prime::side::PrimeFootprint;
pub use footprint::Footprint;

/// Admin and transport inputs.
// An input is made and moved once per frame; boxing the decoded one would cost an
// allocation per frame to save copying a few hundred bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input<'a> {
    /// A frame arrived from the network.
    Receive(&'a [u8]),
    /// A frame arrived from the network and was decoded and hashed by
    /// [`preopen`](crate::preopen::preopen) on the host's thread: handled exactly as
    /// `Receive` of the same bytes.
    Preopened(Preopened),
    /// Time passed; fire due timers. Hosts call this every few milliseconds.
    Tick,
    /// The host handled every frame that was waiting (the end of its turn): work the turn's
    /// inputs asked for that serves them all at once goes out now (Prime's PO-REQUEST,
    /// PO-ACK, row and summary). A host that batches inputs calls it after each batch, one
    /// that does not after each input; work still deferred goes at the next `Tick`.
    Idle,
    /// The primary is about to stop (for recovery or shutdown): hand over to the next view.
    StepDown,
    /// The key holder's answer to a call this node made (an [`Effect::Holder`]).
    Holder(crate::holder::HolderAnswer),
    /// Proactive recovery (BFT-PR §4.4): the host restarted this replica from its saved state
    /// with trusted code; discard client keys, refresh keys, estimate, send the recovery
    /// request, check and fetch state. Needs session keys.
    Recover,
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
    /// Frames (a client's requests) held while their sender's NEW-KEY was being admitted,
    /// and read again once it was.
    pub frames_held_for_keys: u64,
    /// Recoveries completed here, and recovery requests (of any replica) executed.
    pub recoveries: u64,
    pub recovery_requests_executed: u64,
    /// Prime: order keys a recovery of ours installed (our rows are signed with them).
    pub order_keys_installed: u64,
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
    /// pages) or lay behind the checkpoint the journal names: the replica fetched a vouched
    /// checkpoint instead.
    pub state_unreadable: u64,
    /// Recoveries that found the state's own checkpoint above the estimate H_M (a page store
    /// rewritten while compromised) and fetched the whole state again.
    pub states_distrusted: u64,
    /// Times a client came under suspicion (see `suspects.rs`).
    pub clients_suspected: u64,
    /// Requests arriving with a valid signature of their client.
    pub requests_signed: u64,
    /// Views entered on a NEW-VIEW this replica could not check, because f+1 other
    /// replicas reported being active in the view (see `reports.rs`).
    pub new_views_adopted: u64,
    /// Separated deployment: execution nodes' frames passed on to clients, and view changes
    /// started because the execution cluster acknowledged nothing while clients waited.
    pub relayed: u64,
    pub execution_stalls: u64,
    /// Firewall deployment: reply certificates checked here (the clients' replies).
    pub certified_replies: u64,
    /// Clients' body sessions opened by the key holder (confidential bodies).
    pub body_sessions_opened: u64,
    /// Operations not run because they did not open under their body session (a faulty
    /// client's, or an unsealed one where bodies are sealed); answered with a refusal.
    pub bodies_refused: u64,
    /// Prime: view changes this replica started because Suspect-Leader found the leader
    /// slower than the bound.
    pub leaders_suspected: u64,
    /// PBFT: view changes this replica started because the primary's pace fell below half
    /// of its recent best, two windows in a row (`primary_pace_window_ms`).
    pub slow_primaries: u64,
    /// Request timers that fired while fewer than 2f other replicas had been heard for a
    /// whole view-change timeout: run again instead of starting a view change alone.
    pub view_changes_deferred: u64,
}

/// A replica.
pub struct Replica<S: Service, A: KeyTable> {
    cfg: Config,
    id: ReplicaId,
    auth: A,
    /// The execution component: service, paged state, reply table, what ran where.
    exec: Execution<S>,
    env: Env,
    /// What this step sends, records and reports, and the rules on it (see [`Outbox`]).
    out: Outbox,
    pub stats: Stats,

    /// Views: the current one, the view-change timer, VIEW-CHANGEs and NEW-VIEWs (see
    /// `views.rs`).
    views: views::Views,
    /// The normal case: slots, proposals, checkpoints, who was heard, status messages (see
    /// `normal.rs`).
    ordering: normal::Ordering,
    /// Requests pooled, reads waiting, the request timer, suspected clients (see
    /// `requests.rs`).
    requests: requests::Requests,
    /// Session keys: refreshes, NEW-KEYs sent again, clients asked for keys, state
    /// sessions (see `keying.rs`).
    keying: crate::keying::Keying,

    // Recovery (see recovery/mod.rs).
    recovery: Option<recovery::Recovery>,
    /// Why the stored checkpoint did not load at start-up (reported once restored).
    unreadable: Option<String>,
    /// Separated and firewall deployments: where execution goes (see `separated.rs`).
    sink: separated::Sink,
    /// What a proposal is and what becomes of it: PBFT's batches, or Prime's matrices with
    /// pre-ordering, Suspect-Leader and order keys (see `agreement/proposals.rs`, `prime.rs`).
    proposals: Box<dyn Proposals>,
}

/// What a step sends, records and reports (the effects handed to the host at its end), and
/// the two rules on them: nothing goes out while journaled batches are re-executed after a
/// restart, and nothing with a sequence number above H_M while recovering.
#[derive(Default)]
struct Outbox {
    effects: Vec<Effect>,
    /// True while re-executing journaled batches after a restart: no sends, no records.
    replaying: bool,
    /// While recovering: nothing with a sequence number above H_M is sent.
    send_cap: Option<Seq>,
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// A replica in view 0 whose state is `state` (see [`crate::open_state`]) at its latest
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
        let requests = requests::Requests::new(&cfg);
        let confidential = cfg.confidential_bodies;
        let sink = separated::Sink::of(&cfg);
        let views = views::Views::new(&cfg, id);
        let mut r = Replica {
            cfg,
            id,
            auth,
            exec: Execution::new(service, state, confidential),
            env: Env::default(),
            out: Outbox::default(),
            stats: Stats::default(),
            views,
            ordering: normal::Ordering {
                order: Default::default(),
                proposing: requests::Proposing {
                    next_seq: 1,
                    ..Default::default()
                },
                ckpt_votes,
                heard: Heard::default(),
                next_status_ms: 0,
            },
            requests,
            keying: Default::default(),
            recovery: None,
            unreadable: None,
            sink,
            proposals: Box::new(Batches),
        };
        if r.cfg.prime() {
            r.proposals = Box::new(crate::prime::side::PrimeSide::new(&r.cfg, id, 0));
        }
        #[cfg(feature = "mutants")]
        if r.cfg.mutant == crate::types::Mutant::ClearBodies {
            r.exec.clear_bodies();
        }
        #[cfg(feature = "mutants")]
        if r.cfg.mutant == crate::types::Mutant::StaleReplyDigest {
            r.exec.stale_reply_digests();
        }
        let seq = r.exec.state().latest();
        let (root, aux) = r
            .exec
            .state()
            .held(seq)
            .expect("the latest checkpoint is held");
        let digest = checkpoint_digest_of(seq, &root, &aux);
        if let Err(e) = r.exec.load_aux(seq, &aux) {
            // Corrupt pages (found by the check at start-up) may not load, and a page store
            // rewritten while the replica was compromised may hold auxiliary bytes that do not
            // decode: stay diverged and fetch a vouched checkpoint before executing.
            r.stats.state_unreadable += 1;
            r.unreadable = Some(format!("checkpoint {seq}: {e}"));
            r.exec.set_diverged(true);
            r.exec.stand_at(seq);
        }
        r.ordering.ckpt_votes.set_stable(seq, digest);
        r.ordering.proposing.next_seq = seq + 1;
        r.exec.note_checkpoint(seq, digest);
        r.sync_proposals();
        Ok(r)
    }

    // ----- accessors -------------------------------------------------------------------

    /// Gives a replica of a firewall deployment its keys: the firewall's public keys and
    /// its own order key (it signs its pieces of agreement certificates with it).
    pub fn with_firewall(
        mut self,
        keys: Arc<crate::filter::FirewallKeys>,
        order_key: redoubt_crypto::pk::HolderSecrets,
    ) -> Self {
        let vouchers = self.cfg.vouchers();
        if let separated::Sink::Firewall { side, .. } = &mut self.sink {
            *side = Some(Box::new(firewall::FirewallSide::new(
                keys, order_key, vouchers,
            )));
        }
        self
    }

    pub fn id(&self) -> ReplicaId {
        self.id
    }
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn view(&self) -> View {
        self.views.view
    }
    pub fn is_normal(&self) -> bool {
        self.views.normal
    }
    /// The last view this replica entered normal operation in (what it tells clients behind
    /// a firewall; `view()` may be one it is still trying to change to).
    pub fn installed_view(&self) -> View {
        self.views.installed
    }
    pub fn primary(&self) -> ReplicaId {
        self.cfg.primary(self.views.view)
    }
    pub fn is_primary(&self) -> bool {
        self.primary() == self.id
    }
    pub fn last_executed(&self) -> Seq {
        self.exec.last_executed()
    }
    /// Separated deployment: the sequence number the execution cluster acknowledged
    /// executing through, as this replica learnt it.
    pub fn execution_acked(&self) -> Seq {
        self.sink.acked()
    }
    pub fn stable_checkpoint(&self) -> Seq {
        self.ordering.ckpt_votes.stable_seq()
    }
    /// The digest of the stable checkpoint (the one 2f+1 replicas agreed on).
    pub fn stable_checkpoint_digest(&self) -> Digest {
        self.ordering.ckpt_votes.stable_digest()
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
        self.requests
            .pool
            .check_invariants()
            .map_err(|e| format!("request pool: {e}"))?;
        self.views
            .store
            .check_invariants()
            .map_err(|e| format!("view-change messages: {e}"))?;
        self.keying.check_invariants(self.auth.session_ref())?;
        self.ordering
            .ckpt_votes
            .check_invariants()
            .map_err(|e| format!("checkpoint votes: {e}"))?;
        self.views
            .reports
            .check_invariants()
            .map_err(|e| format!("view reports: {e}"))?;
        self.views
            .claims
            .check_invariants()
            .map_err(|e| format!("view-change claims: {e}"))?;
        let (lo, hi) = (
            self.ordering.ckpt_votes.stable_seq(),
            self.ordering.ckpt_votes.stable_seq() + self.cfg.log_size,
        );
        self.ordering
            .order
            .log
            .check_invariants(lo, hi, self.cfg.n())
            .map_err(|e| format!("agreement log: {e}"))?;
        Ok(())
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
        // The host wrote the state commits of the previous call before making this one.
        self.exec.state_mut().commits_written();
        match input {
            Input::Receive(bytes) => {
                if self.fits(bytes) {
                    // A stranger's message is rejected unread; a filter's is read only once
                    // its row is checked (`on_filter_frame`).
                    let head = Head::of(bytes, |p| self.auth.knows(p));
                    self.receive(bytes, head);
                }
            }
            Input::Preopened(p) => {
                let (bytes, head) = p.into_parts();
                if self.fits(&bytes) {
                    self.receive(&bytes, head);
                }
            }
            Input::Tick => self.tick(),
            Input::Idle => self.turn_end(),
            Input::StepDown => {
                if self.views.normal && self.is_primary() {
                    self.start_view_change(
                        self.views.view.saturating_add(1),
                        ViewChangeCause::HandOver,
                    );
                }
            }
            Input::Recover => self.start_recovery(),
            Input::Holder(answer) => self.on_holder_answer(answer),
        }
        self.hand_over_state_commits();
        if out.is_empty() {
            std::mem::swap(&mut self.out.effects, out);
        } else {
            out.append(&mut self.out.effects);
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
        if self.above_cap(msg) || self.keying.calls.hold(to, msg) {
            return;
        }
        let bytes = self.seal(msg, Some(to));
        self.out.effects.push(Effect::Send { to, bytes });
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
        // Held-back COMMITs go first, in the same turn: the host writes them to each peer
        // together with this message, so they cost no write or wake-up of their own.
        self.flush_deferred_commits();
        let bytes = self.seal(msg, None);
        self.out.effects.push(Effect::Broadcast { bytes });
        // A replica whose NEW-KEY is being admitted refuses this copy: it gets its own later.
        for r in (0..self.cfg.n()).filter(|r| *r != self.id) {
            self.keying.calls.hold(Principal::Replica(r), msg);
        }
    }

    /// Hands the state's new moves of its durable base to the host, ahead of whatever the
    /// host does next: a journal record that follows may rely on them.
    fn hand_over_state_commits(&mut self) {
        if self.out.replaying {
            return; // written by `restore` itself
        }
        for c in self.exec.state_mut().take_commits() {
            self.out.effects.push(Effect::CommitState(c));
        }
    }

    fn persist(&mut self, r: Record) {
        if self.out.replaying {
            return;
        }
        self.hand_over_state_commits();
        // Which bodies the journal holds in pre-prepare records that compaction keeps (see
        // `bodies_journaled`): a view record may drop those of earlier views, a checkpoint
        // record those at or below it.
        match &r {
            Record::View { .. } => self.ordering.order.bodies_journaled.clear(),
            Record::Checkpoint { seq, .. } => {
                self.ordering.order.bodies_journaled = self
                    .ordering
                    .order
                    .bodies_journaled
                    .split_off(&(seq + 1, Digest([0; 32])));
            }
            Record::PrePrepared {
                seq,
                digest,
                batch: Some(_),
                ..
            } => {
                self.ordering.order.bodies_journaled.insert((*seq, *digest));
            }
            _ => {}
        }
        self.out.effects.push(Effect::Persist(r));
    }

    /// Records the execution of batch `digest` at `seq`, with its body unless the journal
    /// holds it already.
    fn persist_executed(&mut self, seq: Seq, digest: Digest, batch: Option<&Arc<Batch>>) {
        let batch = batch.filter(|_| {
            !self
                .ordering
                .order
                .bodies_journaled
                .contains(&(seq, digest))
        });
        self.persist(Record::Executed {
            seq,
            digest,
            batch: batch.cloned(),
        });
    }

    fn event(&mut self, e: Event) {
        self.out.effects.push(Effect::Event(e));
    }

    fn reject(&mut self, from: Principal, kind: &'static str, reason: Reject) {
        self.stats.rejected += 1;
        self.event(Event::Rejected { from, kind, reason });
    }

    // ----- receive --------------------------------------------------------------------------

    /// Whether a received frame is within the configured bound (rejected if not, before
    /// anything else is done with it).
    fn fits(&mut self, bytes: &[u8]) -> bool {
        let fits = bytes.len() <= self.cfg.message_bytes_max;
        if !fits {
            // The claimed sender is unknown: the frame is not decoded.
            self.reject(Principal::Client(u64::MAX), "frame", Reject::Oversized);
        }
        fits
    }

    fn receive(&mut self, bytes: &[u8], head: Result<Head, Reject>) {
        let mut head = match head {
            Ok(h) => h,
            Err(r) => {
                // The claimed sender is unknown when the frame does not decode.
                self.reject(Principal::Client(u64::MAX), "frame", r);
                return;
            }
        };
        let from = head.from;
        if let Principal::Filter(x) = from {
            // Filters hold no keys: what they pass down authenticates itself.
            if let Err(r) = self.on_filter_frame(x, || head.take_opened(bytes).msg) {
                self.reject(from, "filter", r);
            }
            return;
        }
        let (msg, request_digest) = match head.open(&self.auth, bytes) {
            Ok(m) => m,
            Err(r) => {
                match (r, from) {
                    (Reject::BadMac, Principal::Replica(peer))
                        if peer < self.cfg.n() && peer != self.id =>
                    {
                        self.resend_new_key(Principal::Replica(peer));
                    }
                    (Reject::BadMac, Principal::Executor(e)) if e < self.cfg.executors => {
                        self.resend_new_key(from);
                    }
                    _ => {}
                }
                self.reject(from, "frame", r);
                return;
            }
        };
        let kind = msg.kind();
        // A request is held for its client's key (see `on_request`), whoever sent it.
        let client = match &msg {
            Message::Client(ClientMessage::Request(sr)) => {
                Some(Principal::Client(sr.request.client))
            }
            _ => None,
        };
        match self.dispatch(from, msg, bytes.len(), request_digest) {
            Err(Reject::KeyPending)
                if client.is_some_and(|c| self.keying.calls.hold_in(c, bytes)) =>
            {
                self.stats.frames_held_for_keys += 1;
            }
            Err(r) => self.reject(from, kind, r),
            Ok(()) => {}
        }
    }

    /// Reads again a frame held while its sender's NEW-KEY was admitted.
    pub(super) fn receive_again(&mut self, bytes: &[u8]) {
        let head = Head::of(bytes, |p| self.auth.knows(p));
        self.receive(bytes, head);
    }

    /// Acts on an authenticated message of `len` bytes; `request_digest` is the digest of the
    /// request it carries, if any, when already computed.
    fn dispatch(
        &mut self,
        from: Principal,
        msg: Message,
        len: usize,
        request_digest: Option<Digest>,
    ) -> Result<(), Reject> {
        let sender = match from {
            Principal::Replica(r) => {
                if r < self.cfg.n() && r != self.id {
                    let now = self.now();
                    self.ordering.heard.note(r, now);
                }
                Some(r)
            }
            Principal::Executor(e) => {
                return match msg {
                    Message::Separated(SeparatedMessage::ExecAck(a)) => self.on_exec_ack(e, a),
                    Message::Separated(SeparatedMessage::Relay(m)) => self.on_relay(e, m),
                    Message::Recovery(RecoveryMessage::NewKey(m)) => self.on_new_key(from, m),
                    _ => Err(Reject::Unexpected),
                };
            }
            Principal::Client(_) | Principal::Filter(_) => None,
        };
        match (msg, sender) {
            (Message::Client(ClientMessage::Request(r)), _) => {
                self.on_request(from, r, request_digest)
            }
            // A recovering replica's own recovery request, answered by the others.
            (Message::Client(ClientMessage::Reply(m)), Some(s)) => self.on_recovery_reply(s, m),
            (Message::Recovery(RecoveryMessage::NewKey(m)), _) => self.on_new_key(from, m),
            (Message::Recovery(m), Some(s)) => self.on_recovery_message(s, m),
            (Message::Pbft(m), Some(s)) => self.on_pbft(s, m),
            (Message::Transfer(m), Some(s)) => self.on_transfer(s, m, len),
            // A PO-ARU row is signed: it may come from anyone who passes it on.
            (Message::Prime(PrimeMessage::PoAru(m)), _) => self.on_po_aru(m),
            (Message::Prime(m), Some(s)) => self.on_prime(s, m),
            _ => Err(Reject::Unexpected),
        }
    }

    /// PBFT's agreement messages from replica `s`.
    fn on_pbft(&mut self, s: ReplicaId, msg: PbftMessage) -> Result<(), Reject> {
        match msg {
            PbftMessage::PrePrepare(m) => self.on_pre_prepare(s, m),
            PbftMessage::Prepare(m) => self.on_prepare(s, m),
            PbftMessage::Commit(m) => self.on_commit(s, m),
            PbftMessage::Checkpoint(m) => self.on_checkpoint(s, m),
            PbftMessage::ViewChange(m) => self.on_view_change(s, m),
            PbftMessage::ViewChangeAck(m) => self.on_ack(s, m),
            PbftMessage::NewView(m) => self.on_new_view(s, m),
            PbftMessage::Status(m) => self.on_status(s, m),
            PbftMessage::Batches(m) => self.on_batches(m),
            PbftMessage::RelayViewChange(m) => self.on_relayed_vc(s, m),
        }
    }

    /// State-transfer messages from replica `s` (`len`: the frame's length).
    fn on_transfer(
        &mut self,
        s: ReplicaId,
        msg: TransferMessage,
        len: usize,
    ) -> Result<(), Reject> {
        match msg {
            TransferMessage::Fetch(m) => self.on_fetch(s, m),
            TransferMessage::StateData(m) => self.on_state_data(s, m, len),
        }
    }

    /// A recovery's estimation messages from replica `s` (NEW-KEY is anyone's).
    fn on_recovery_message(&mut self, s: ReplicaId, msg: RecoveryMessage) -> Result<(), Reject> {
        match msg {
            RecoveryMessage::NewKey(m) => self.on_new_key(Principal::Replica(s), m),
            RecoveryMessage::QueryStable(m) => self.on_query_stable(s, m),
            RecoveryMessage::ReplyStable(m) => self.on_reply_stable(s, m),
        }
    }

    fn in_window(&self, n: Seq) -> bool {
        n > self.ordering.ckpt_votes.stable_seq()
            && n <= self.ordering.ckpt_votes.stable_seq() + self.cfg.log_size
    }

    // ----- timers -------------------------------------------------------------------------

    /// The end of the host's turn ([`Input::Idle`]).
    fn turn_end(&mut self) {
        self.prime_turn_end();
    }

    fn tick(&mut self) {
        let now = self.now();
        self.flush_deferred_commits();
        self.note_quorum_heard(now);
        if self.views.normal {
            if let Some((deadline, c, ts)) = self.requests.timer {
                if now >= deadline {
                    let still = self
                        .requests
                        .pool
                        .get(c)
                        .is_some_and(|w| w.req.request.timestamp == ts);
                    self.requests.timer = None;
                    // A request committed here but not yet executed, with nothing the
                    // primary owes us before it, waits on us (a state transfer, a missing
                    // batch body) and not on the primary: a lone view change would only
                    // leave us behind in a view the others never join (simulator seed 10998
                    // with --hybrid: a replica fetching state after its recovery sat 5 s in
                    // such a view while the others went on without it).
                    // Nor does one the primary holds back while the execution cluster works
                    // through the batches ordered before it.
                    // Nor while fewer than 2f other replicas have been heard for a whole
                    // timeout: a view change needs 2f+1 replicas, and one started without
                    // them only leaves us alone in a view the others, once they are heard
                    // again in the view we left, never join (the join rule pulls replicas
                    // behind forward, never one ahead back). A replica that rebooted before
                    // the rest of its cluster did so: simulator `restart-staggered`,
                    // docs/adr/0002, item 14. The timer runs again until they have been heard
                    // for a whole timeout, and the request goes to the primary again each
                    // time (it may have been down, with the others, when we relayed it).
                    let heard_for = self
                        .ordering
                        .heard
                        .quorum_since_ms()
                        .map(|since| since.saturating_add(self.views.timer.timeout_ms()));
                    if still && (self.committed_here(c, ts) || self.exec_pipeline_full()) {
                        self.requests.timer = Some((now + self.views.timer.timeout_ms(), c, ts));
                    } else if still && !self.is_primary() && heard_for.is_none_or(|t| now < t) {
                        self.stats.view_changes_deferred += 1;
                        let at = heard_for.unwrap_or(now + self.views.timer.timeout_ms());
                        self.requests.timer =
                            Some((at.min(now + self.views.timer.timeout_ms()), c, ts));
                        self.relay_waiting();
                    } else if still && !self.is_primary() && self.prime_ready() {
                        // Prime: a vote to leave, resent while the request waits.
                        self.requests.timer = Some((now + self.views.timer.timeout_ms(), c, ts));
                        self.vote_to_leave(ViewChangeCause::RequestTimer);
                    } else if still && !self.is_primary() {
                        self.views.timer.back_off();
                        self.start_view_change(
                            self.views.view.saturating_add(1),
                            ViewChangeCause::RequestTimer,
                        );
                    } else {
                        self.arm_request_timer();
                    }
                }
            }
            self.check_primary_pace(now);
            // Backups suspect a primary whose requests do not execute; a primary suspects
            // itself when its own proposals do not: the replicas that would commit them may
            // have left the view (their timers fired while messages were lost), and with
            // them gone nobody else may ever time out (every request already executed
            // somewhere, or none waiting). A view change is always safe.
            if self.is_primary() && self.exec.transfer_target().is_none() && self.recovery.is_none()
            {
                if self.ordering.proposing.next_seq <= self.exec.last_executed().saturating_add(1) {
                    self.ordering.proposing.progress_ms = now;
                } else if now
                    >= self
                        .ordering
                        .proposing
                        .progress_ms
                        .saturating_add(self.views.timer.timeout_ms())
                {
                    self.stats.primary_stalls += 1;
                    self.views.timer.back_off();
                    self.start_view_change(
                        self.views.view.saturating_add(1),
                        ViewChangeCause::PrimaryStalled,
                    );
                }
            }
        } else if let Some(deadline) = self.views.timer.deadline_ms {
            if now >= deadline {
                self.views.timer.back_off();
                self.start_view_change(
                    self.views.view.saturating_add(1),
                    ViewChangeCause::ViewChangeTimer,
                );
            }
        }
        if self.keying.take_sessions_retry() {
            self.try_execute();
            self.answer_reads();
        }
        self.prime_tick();
        self.check_reply_certs();
        self.drive_transfer();
        self.tick_queue();
        self.tick_keys();
        self.drive_recovery();
        // An idle primary still drives a recovering replica to its recovery point; "idle"
        // includes holding only unsigned requests of suspected clients, which it does not
        // order (until the fix the recovery of simulator seed 1983 with --all-optimizations
        // waited forever behind one).
        // In a separated deployment the execution pipeline's bound lapses after a heartbeat
        // without acknowledgements: what waits for it goes out then.
        if self.is_primary()
            && (self.requests.pool.is_empty()
                || self.recovery_progress_target().is_some()
                || !self.sink.here())
        {
            self.try_propose();
        }
        if now >= self.ordering.next_status_ms {
            self.ordering.next_status_ms = now + self.cfg.status_interval_ms;
            self.send_status();
        }
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Whether 2f other replicas were heard within the last few status
    /// intervals; keeps since when that holds without a gap. A primary heard again after a
    /// silence (it rebooted, or was cut off) gets the requests waiting here again: what we
    /// relayed meanwhile was lost, and our timers would replace it for requests it never had.
    fn note_quorum_heard(&mut self, now: u64) {
        let quorum = 2 * self.cfg.f as usize;
        let primary = self.primary();
        if self
            .ordering
            .heard
            .tick(now, self.cfg.status_interval_ms, quorum, primary)
        {
            self.relay_waiting();
        }
    }

    /// A backup in normal operation sends the primary the requests waiting here, oldest
    /// first, as many as one batch holds (as on entering a view).
    pub(super) fn relay_waiting(&mut self) {
        if !self.views.normal || self.is_primary() || !self.proposals.leader_batches() {
            return;
        }
        let p = self.primary();
        let reqs: Vec<SignedRequest> = self
            .requests
            .pool
            .in_order()
            .take(self.cfg.batch_requests_max)
            .map(|(_, w)| w.req.clone())
            .collect();
        for r in reqs {
            let c = r.request.client;
            self.send_replica(p, &Message::from(r));
            self.requests.pool.mark_relayed(c, self.views.view);
        }
    }
}

/// VIEW-CHANGE messages are kept only for views up to this far beyond ours.
pub const VC_VIEWS_AHEAD: View = 4;
/// Bound on digests named as missing in one status message.
const MISSING_MAX: usize = 32;
