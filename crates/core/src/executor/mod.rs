//! An execution node of a separated deployment (Yin et al. 2003, "Separating agreement from
//! execution"): one of `2g+1` nodes that run the service on batches the agreement cluster
//! (3f+1 replicas, which then only order) certified, and answer clients.
//!
//! - An agreement node that executes (orders) a committed batch sends each execution node its
//!   piece of the agreement certificate, an [`Order`] under an authenticator over the
//!   execution nodes. f+1 pieces naming one digest certify the batch (`orders.rs` says why
//!   f+1 and not the paper's 2f+1).
//! - Certified batches run in sequence order through the execution component
//!   (`crate::execution`: service, paged state, exactly-once table, sealed bodies); each
//!   reply goes straight to its client, which needs g+1 matching ones.
//! - After running batches the node tells every agreement node how far it executed
//!   ([`ExecAck`]): agreement nodes retransmit what g+1 execution nodes have not
//!   acknowledged, and take their own checkpoints only once it is acknowledged, so their
//!   garbage collection never drops a batch no correct execution node has.
//! - Every K sequence numbers the node takes a checkpoint and sends its digest to its peers;
//!   g+1 matching make it stable, and what lies below it is forgotten.
//! - A node that holds later certificates than the one it needs next asks its peers
//!   ([`Missing`]); they pass on the agreement nodes' frames of the certificates they keep
//!   ([`Certified`]), which the asker checks against its own authenticator entries.
//!
//! Not here yet: state transfer between execution nodes. A node whose checkpoint differs from
//! one g+1 peers vouch for reports [`Event::StateDivergence`] and stops; a node that fell
//! behind its peers' stable checkpoint keeps asking and waits. Execution nodes do not
//! recover proactively. See docs/operations.md, "Separated deployment".
//!
//! Bounds: certificate pieces within `log_size` sequence numbers above the last executed
//! (`orders.rs`); execution at most `log_size` sequence numbers past the stable checkpoint,
//! so at most that many certificates of executed batches kept; checkpoint votes per executor
//! per checkpoint within the same window; one Retry answer time per client with an
//! exactly-once entry.

mod firewall;
mod keys;
mod orders;
mod signed_votes;
mod transfer;

use crate::effect::{Bytes, Effect, Env, Event};
use crate::execution::{Execution, Recoveries, Step};
use crate::keying::Session;
use crate::keys::{Accepted, KeyTable, NewKey};
use crate::message::*;
use crate::replica::Input;
use crate::seal::{open, seal};
use crate::service::Service;
use crate::types::{ClientId, Config, ExecutorId, FilterId, Principal, ReplicaId, Seq};
use orders::{CertifiedBatch, Orders, Refused};
use redoubt_crypto::Digest;
use redoubt_state::PagedState;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most certificates one [`Certified`] answer carries.
const CERTIFIED_PER_ANSWER_MAX: usize = 16;
/// A client's reply is sent again on a [`Retry`] at most this often (ms).
const RETRY_ANSWER_MIN_MS: u64 = 20;

/// Counters a host can export as metrics.
#[derive(Clone, Debug, Default)]
pub struct ExecutorStats {
    pub batches_executed: u64,
    pub requests_executed: u64,
    /// Frames and messages rejected (bad MAC, malformed, unexpected).
    pub rejected: u64,
    /// Certificate pieces refused (outside the window, body not matching its digest).
    pub orders_refused: u64,
    /// Replies sent again on an agreement node's [`Retry`].
    pub retries_answered: u64,
    /// [`Missing`] requests sent, and certificates passed on to peers that sent one.
    pub missing_sent: u64,
    pub certificates_forwarded: u64,
    /// Checkpoints that became stable here.
    pub checkpoints_stable: u64,
    /// Clients' body sessions opened by the key holder, and operations refused because they
    /// did not open (confidential bodies).
    pub body_sessions_opened: u64,
    pub bodies_refused: u64,
    /// NEW-KEYs sent (session keys).
    pub key_refreshes: u64,
    /// Firewall deployment: reply shares sent again (the agreement cluster still asked).
    pub shares_resent: u64,
    /// Checkpoints fetched from peers, and state-transfer bytes served to them.
    pub state_transfers: u64,
    pub transfer_bytes_out: u64,
}

/// What an execution node keeps above its stable checkpoint: the certificates of the batches
/// it executed (for peers that missed them), the checkpoint votes, the stable checkpoint
/// itself, and peers' votes beyond the window (see `transfer.rs`).
#[derive(Default)]
struct Window {
    /// Certificates (the agreement nodes' frames) of executed batches above the stable
    /// checkpoint, for peers that missed them.
    done: BTreeMap<Seq, Vec<Bytes>>,
    /// Execution checkpoint votes above the stable checkpoint.
    votes: BTreeMap<Seq, BTreeMap<ExecutorId, Digest>>,
    stable: Seq,
    /// The latest checkpoint vote of each peer beyond our window (see `transfer.rs`).
    far: BTreeMap<ExecutorId, (Seq, Digest)>,
}

/// When an execution node's periodic and on-demand work last happened or is next due (ms),
/// so that a faulty peer or client cannot make it repeat any of it faster.
#[derive(Default)]
struct Pacing {
    /// When the next periodic acknowledgement and checkpoint vote go out.
    next_heartbeat_ms: u64,
    /// When a gap may next be asked for.
    next_missing_ms: u64,
    /// When each client's reply was last sent again on a Retry.
    retried: BTreeMap<ClientId, u64>,
    /// When each peer's vote for a checkpoint already stable here, and its MISSING, were
    /// last answered (at most one entry per peer).
    vote_answered: BTreeMap<ExecutorId, u64>,
    missing_answered: BTreeMap<ExecutorId, u64>,
}

/// An execution node (see the module documentation).
pub struct Executor<S: Service, A: KeyTable> {
    cfg: Config,
    id: ExecutorId,
    auth: A,
    exec: Execution<S>,
    env: Env,
    effects: Vec<Effect>,
    pub stats: ExecutorStats,
    orders: Orders,
    /// What this node keeps above its stable checkpoint (see [`Window`]).
    window: Window,
    /// When things were last done or answered, so that none is done too often (see
    /// [`Pacing`]).
    pacing: Pacing,
    /// The view of the last batch executed (replies sent again carry it).
    last_view: u64,
    /// Session keys: refreshes, NEW-KEYs sent again, state sessions (see `keying.rs`).
    keying: crate::keying::Keying,
    /// Firewall deployment: the threshold key share and the shares sent (`firewall.rs`).
    firewall: Option<firewall::ExecFirewall>,
    /// Separated deployment with session keys: signed checkpoint votes (`signed_votes.rs`).
    signed: signed_votes::SignedVotes,
}

impl<S: Service, A: KeyTable> Executor<S, A> {
    /// Execution node `id` whose state is `state` (see [`crate::open_state`]) at its durable
    /// checkpoint: a fresh state starts at 0, a stored one where it was last made stable.
    pub fn new(
        cfg: Config,
        id: ExecutorId,
        auth: A,
        service: S,
        state: PagedState,
    ) -> Result<Self, String> {
        cfg.validate()?;
        if !cfg.separated() || id >= cfg.executors {
            return Err(format!(
                "executor {id} is not one of the {} execution nodes",
                cfg.executors
            ));
        }
        let base = state.base_seq();
        let aux = state
            .held(base)
            .map(|(_, aux)| aux)
            .ok_or_else(|| format!("the state does not hold its base checkpoint {base}"))?;
        let mut exec = Execution::new(service, state, cfg.confidential_bodies);
        #[cfg(feature = "mutants")]
        if cfg.mutant == crate::types::Mutant::StaleReplyDigest {
            exec.stale_reply_digests();
        }
        #[allow(unused_mut)]
        let mut orders = Orders::new(cfg.f, cfg.log_size);
        #[cfg(feature = "mutants")]
        if cfg.mutant == crate::types::Mutant::TrustOneOrder {
            orders.trust_one();
        }
        exec.load_aux(base, &aux)?;
        if let Some((root, aux)) = exec.state().held(base) {
            exec.note_checkpoint(
                base,
                crate::transfer::checkpoint_digest_of(base, &root, &aux),
            );
        }
        Ok(Executor {
            orders,
            cfg,
            id,
            auth,
            exec,
            env: Env::default(),
            effects: Vec::new(),
            stats: ExecutorStats::default(),
            window: Window {
                stable: base,
                ..Default::default()
            },
            pacing: Pacing::default(),
            last_view: 0,
            keying: Default::default(),
            firewall: None,
            signed: signed_votes::SignedVotes::default(),
        })
    }

    /// Gives an execution node of a firewall deployment its keys: the firewall's public
    /// keys and its share of the execution cluster's threshold key.
    pub fn with_firewall(
        mut self,
        keys: Arc<crate::filter::FirewallKeys>,
        share: redoubt_crypto::threshold::KeyShare,
    ) -> Result<Self, String> {
        if !self.cfg.firewall() {
            return Err("the configuration has no firewall (filter_rows = 0)".into());
        }
        if share.index() != self.id as usize {
            return Err(format!(
                "key share {} given to execution node {}",
                share.index(),
                self.id
            ));
        }
        self.firewall = Some(firewall::ExecFirewall::new(keys, share));
        Ok(self)
    }

    pub fn id(&self) -> ExecutorId {
        self.id
    }
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn last_executed(&self) -> Seq {
        self.exec.last_executed()
    }
    pub fn stable_checkpoint(&self) -> Seq {
        self.window.stable
    }
    /// The digest of our checkpoint `seq` (taken, fetched or restored; kept from the stable
    /// one on), without hashing the state again; `None` if we hold no such checkpoint.
    pub fn checkpoint_digest(&self, seq: Seq) -> Option<Digest> {
        self.exec.own_checkpoint(seq)
    }
    pub fn service(&self) -> &S {
        self.exec.service()
    }
    pub fn state(&self) -> &PagedState {
        self.exec.state()
    }
    pub fn auth(&self) -> &A {
        &self.auth
    }
    /// Whether execution waits for a state transfer: our state differs from a checkpoint
    /// g+1 peers vouch for, or the fetch of one is under way.
    pub fn fetching(&self) -> bool {
        self.exec.diverged() || self.exec.walking()
    }
    /// The result last recorded for `client` (exactly-once table): timestamp and result.
    pub fn last_result(&self, client: ClientId) -> Option<(u64, &[u8])> {
        self.exec
            .last_reply(client)
            .map(|l| (l.timestamp, l.result.as_slice()))
    }

    /// Handles one input; returns what the host must do.
    pub fn handle(&mut self, env: Env, input: Input<'_>) -> Vec<Effect> {
        self.env = env;
        self.exec.state_mut().commits_written();
        match input {
            Input::Receive(bytes) => self.receive(bytes),
            // Opened here as it arrived (execution nodes do not split the work).
            Input::Preopened(p) => self.receive(p.bytes()),
            Input::Tick => self.tick(),
            Input::Idle => {}
            // Execution nodes have no view to step down from, and do not recover
            // proactively (module documentation).
            Input::StepDown | Input::Recover => {}
            Input::Holder(answer) => self.on_holder_answer(answer),
        }
        for c in self.exec.state_mut().take_commits() {
            self.effects.push(Effect::CommitState(c));
        }
        std::mem::take(&mut self.effects)
    }

    /// Checks the node's invariants; `Err` names the first that fails.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.exec.check_invariants()?;
        self.keying.check_invariants(self.auth.session_ref())?;
        let window = self.cfg.log_size;
        if self.orders.len() > self.cfg.n() as usize * window as usize {
            return Err(format!("{} certificate pieces held", self.orders.len()));
        }
        if self.window.done.len() as u64 > window {
            return Err(format!(
                "{} executed certificates held",
                self.window.done.len()
            ));
        }
        if self.window.stable > self.exec.last_executed() {
            return Err("stable checkpoint above the last executed batch".into());
        }
        self.firewall_bounds()?;
        self.signed_votes_bounds()
    }

    // ----- receiving ------------------------------------------------------------------------

    fn receive(&mut self, bytes: &[u8]) {
        let frame = match decode_frame_ref(bytes, self.cfg.message_bytes_max) {
            Ok(f) => f,
            Err(r) => return self.reject(Principal::Client(u64::MAX), "frame", r),
        };
        let from = frame.from;
        if let Principal::Filter(x) = from {
            // Filters hold no keys: what they pass up authenticates itself.
            if let Err(r) = self.on_filter_frame(x, frame.body) {
                self.reject(from, "filter", r);
            }
            return;
        }
        let msg = match open(&self.auth, &frame) {
            Ok(m) => m,
            Err(r) => {
                let known = match from {
                    Principal::Replica(p) => p < self.cfg.n(),
                    Principal::Executor(p) => p < self.cfg.executors && p != self.id,
                    Principal::Client(_) | Principal::Filter(_) => false,
                };
                if r == Reject::BadMac && known {
                    // It may hold an old key of ours (it restarted): our latest NEW-KEY.
                    self.resend_new_key(from, 0);
                }
                return self.reject(from, "frame", r);
            }
        };
        let kind = msg.kind();
        if let Err(r) = self.dispatch(from, msg, bytes) {
            self.reject(from, kind, r);
        }
    }

    fn dispatch(&mut self, from: Principal, msg: Message, bytes: &[u8]) -> Result<(), Reject> {
        let n = self.cfg.n();
        let e = self.cfg.executors;
        match (msg, from) {
            (Message::Separated(SeparatedMessage::Order(o)), Principal::Replica(r))
                if r < n && o.replica == r =>
            {
                self.on_order(r, o, Arc::new(bytes.to_vec()))?;
                self.try_execute();
                Ok(())
            }
            (Message::Separated(SeparatedMessage::Retry(m)), Principal::Replica(r))
                if r < n && m.replica == r =>
            {
                self.on_retry(m);
                Ok(())
            }
            (Message::Separated(SeparatedMessage::ExecCheckpoint(c)), Principal::Executor(p))
                if p < e && p != self.id && c.executor == p =>
            {
                self.on_checkpoint(c)
            }
            (Message::Separated(SeparatedMessage::Missing(m)), Principal::Executor(p))
                if p < e && p != self.id && m.executor == p =>
            {
                self.on_missing(m);
                Ok(())
            }
            (Message::Separated(SeparatedMessage::Certified(c)), Principal::Executor(p))
                if p < e && p != self.id && c.executor == p =>
            {
                self.on_certified(c);
                Ok(())
            }
            (Message::Transfer(TransferMessage::Fetch(f)), Principal::Executor(p))
                if p < e && p != self.id =>
            {
                self.on_fetch(p, f)
            }
            (Message::Transfer(TransferMessage::StateData(d)), Principal::Executor(p))
                if p < e && p != self.id =>
            {
                self.on_state_data(p, d)
            }
            (Message::Recovery(RecoveryMessage::NewKey(nk)), _) => self.on_new_key(from, nk),
            _ => Err(Reject::Unexpected),
        }
    }

    fn on_order(&mut self, from: ReplicaId, o: Order, frame: Bytes) -> Result<(), Reject> {
        match self
            .orders
            .insert(from, o, frame, self.exec.last_executed())
        {
            Ok(()) => Ok(()),
            // Old news (a retransmission of what ran) is no fault of the sender.
            Err(Refused::OutOfWindow) => {
                self.stats.orders_refused += 1;
                Ok(())
            }
            Err(Refused::BadDigest) => {
                self.stats.orders_refused += 1;
                Err(Reject::BadDigest)
            }
        }
    }

    fn on_new_key(&mut self, from: Principal, nk: NewKey) -> Result<(), Reject> {
        // A client's NEW-KEY comes through a replica (clients talk to the replicas only);
        // its key holder's signature, checked on admission, is what makes it the client's.
        let relayed = matches!(
            (from, nk.from),
            (Principal::Replica(_), Principal::Client(_))
        );
        if nk.from != from && !relayed {
            return Err(Reject::Inconsistent);
        }
        let Some(s) = self.auth.session_ref() else {
            return Err(Reject::Unexpected);
        };
        match s.check(&nk).map_err(crate::holder::reject_of)? {
            crate::keys::Check::Again(_) => {}
            crate::keys::Check::Admit => {
                if let Some(call) = self.keying.calls.admit(nk, self.env.now_ms) {
                    self.effects.push(Effect::Holder(call));
                }
            }
        }
        Ok(())
    }

    /// An agreement node saw `client` retransmit a request it already ordered: our reply to
    /// it may have been lost, so it goes out again (in full), if we ran it.
    fn on_retry(&mut self, m: Retry) {
        let Some(last) = self.exec.last_reply(m.client) else {
            return;
        };
        if last.timestamp != m.timestamp {
            return; // not run here yet, or the client moved on
        }
        let now = self.env.now_ms;
        if self
            .pacing
            .retried
            .get(&m.client)
            .is_some_and(|t| now < t + RETRY_ANSWER_MIN_MS)
        {
            return;
        }
        self.pacing.retried.insert(m.client, now);
        let reply = Reply {
            view: self.last_view,
            timestamp: last.timestamp,
            client: m.client,
            replica: self.id,
            digest_only: false,
            tentative: false,
            result: last.result.clone(),
        };
        self.stats.retries_answered += 1;
        // Through the agreement node that saw the retransmission: it reaches the client.
        self.send_reply(m.client, &Message::from(reply), m.replica);
    }

    fn on_checkpoint(&mut self, c: ExecCheckpoint) -> Result<(), Reject> {
        if !c.seq.is_multiple_of(self.cfg.checkpoint_interval) {
            return Err(Reject::Inconsistent);
        }
        if c.seq <= self.window.stable {
            if c.seq == self.window.stable {
                // Its signature may come only now (votes go with their MAC alone until their
                // key holder signs them): it completes our proof of the stable checkpoint.
                self.note_signed_vote(&c);
                if self.signed.proof.first().is_none_or(|v| v.seq != c.seq) {
                    self.prove_stable_signed(c.seq);
                }
            }
            // Old news to us, but the peer lacks votes for it: ours again, to it, if we
            // still hold that checkpoint (our stable one), so that it can move on. At most
            // once per status interval per peer (two peers at one stable checkpoint would
            // otherwise answer each other forever).
            let now = self.env.now_ms;
            let due = self
                .pacing
                .vote_answered
                .get(&c.executor)
                .is_none_or(|t| now >= t + self.cfg.status_interval_ms);
            if let Some(d) = self.exec.own_checkpoint(c.seq).filter(|_| due) {
                self.pacing.vote_answered.insert(c.executor, now);
                let m = Message::from(ExecCheckpoint {
                    executor: self.id,
                    seq: c.seq,
                    digest: d,
                    share: self.checkpoint_share(c.seq, &d),
                    signed: self.vote_signature(c.seq, &d),
                });
                self.send(Principal::Executor(c.executor), &m);
            }
            return Ok(());
        }
        if c.seq > self.exec.last_executed() + self.cfg.log_size + self.cfg.checkpoint_interval {
            self.far_vote(c.executor, c.seq, c.digest);
            return Ok(());
        }
        self.window
            .votes
            .entry(c.seq)
            .or_default()
            .insert(c.executor, c.digest);
        self.note_checkpoint_share(&c);
        self.note_signed_vote(&c);
        self.check_checkpoint(c.seq);
        Ok(())
    }

    /// A peer asks for the certificates from `m.seq` on: the frames we keep, up to a budget,
    /// at most once per status interval per peer (an answer can be large: a faulty peer
    /// asking with every message must not make us send one each time).
    fn on_missing(&mut self, m: Missing) {
        let now = self.env.now_ms;
        if self
            .pacing
            .missing_answered
            .get(&m.executor)
            .is_some_and(|t| now < t + self.cfg.status_interval_ms)
        {
            return;
        }
        self.pacing.missing_answered.insert(m.executor, now);
        let budget = self.cfg.message_bytes_max / 2;
        let mut used = 0usize;
        let mut frames = Vec::new();
        for (_, fs) in self
            .window
            .done
            .range(m.seq..)
            .take(CERTIFIED_PER_ANSWER_MAX)
        {
            let size: usize = fs.iter().map(|f| f.len() + 8).sum();
            if used + size > budget {
                break;
            }
            used += size;
            frames.extend(fs.iter().map(|f| serde_bytes::ByteBuf::from(f.to_vec())));
            self.stats.certificates_forwarded += 1;
        }
        let c = Certified {
            executor: self.id,
            stable: self.window.stable,
            frames,
            proof: self.checkpoint_proof(),
            votes: self.signed_proof(),
        };
        self.send(Principal::Executor(m.executor), &Message::from(c));
    }

    /// A peer's answer: each frame is an agreement node's piece, checked on its own.
    fn on_certified(&mut self, c: Certified) {
        if let Some(p) = c.proof {
            self.on_checkpoint_proof(c.executor, p);
        }
        self.on_signed_proof(c.executor, &c.votes);
        for f in c.frames {
            let Ok(frame) = decode_frame_ref(&f, self.cfg.message_bytes_max) else {
                self.stats.orders_refused += 1;
                continue;
            };
            if self.cfg.firewall() {
                // Signed pieces, each checked on its own.
                let Ok(Message::Firewall(FirewallMessage::SignedOrder(so))) =
                    decode_body(frame.body)
                else {
                    self.stats.orders_refused += 1;
                    continue;
                };
                let bytes = Arc::new(f.into_vec());
                let _ = self.on_signed_order(so, bytes);
                continue;
            }
            let (Principal::Replica(r), Ok(Message::Separated(SeparatedMessage::Order(o)))) =
                (frame.from, open(&self.auth, &frame))
            else {
                self.stats.orders_refused += 1;
                continue;
            };
            if r >= self.cfg.n() || o.replica != r {
                self.stats.orders_refused += 1;
                continue;
            }
            let _ = self.on_order(r, o, Arc::new(f.into_vec()));
        }
        self.try_execute();
    }

    // ----- execution ------------------------------------------------------------------------

    fn try_execute(&mut self) {
        if self.fetching() {
            return;
        }
        let before = self.exec.last_executed();
        loop {
            let seq = self.exec.last_executed() + 1;
            if seq > self.window.stable + self.cfg.log_size {
                // Our checkpoints must become stable before we run further ahead (what the
                // peers that lag need from us is kept until then): we stop acknowledging,
                // and the agreement cluster waits for us.
                break;
            }
            let Some(cert) = self.orders.certified(seq) else {
                break;
            };
            if let Some(b) = &cert.batch {
                if !self.learn_sessions(b) {
                    break; // retried on the next tick
                }
            } else if cert.digest != NULL_DIGEST {
                break; // no piece carried the body (a faulty node's): wait for one that does
            }
            self.execute(seq, cert);
        }
        if self.exec.last_executed() > before {
            self.acknowledge();
        }
    }

    /// Whether the body sessions `batch`'s requests were sealed in are known here; those that
    /// are not are asked of the key holder and the batch waits for the answers (retried on
    /// the next tick if the key holder failed): every execution node must run it alike.
    fn learn_sessions(&mut self, batch: &Batch) -> bool {
        let now = self.env.now_ms;
        let mut ready = true;
        for r in &batch.requests {
            match self
                .keying
                .body_session(&mut self.exec, &mut self.auth, &r.request, now, false)
            {
                Session::Ready { opened } => self.stats.body_sessions_opened += opened as u64,
                Session::Asked(call) => {
                    if let Some(call) = call {
                        self.effects.push(Effect::Holder(call));
                    }
                    ready = false;
                }
                Session::Failed(e) => {
                    self.event(Event::KeyHolderFailed(e.to_string()));
                    return false;
                }
            }
        }
        ready
    }

    fn execute(&mut self, seq: Seq, cert: CertifiedBatch) {
        let mut executed = Vec::new();
        let mut bundle = Vec::new();
        if let Some(b) = &cert.batch {
            // Recovery requests concern the agreement nodes' keys only: they do not run here.
            let done = self.exec.run_batch(seq, b, true, &Recoveries::Skip);
            for step in done.steps {
                let (index, fresh, result) = match step {
                    Step::Recovery { .. } => continue, // none: skipped here
                    Step::Again { index, last } => (index, false, last),
                    Step::Ran { index, result } => (index, true, Some(result)),
                };
                let req = &b.requests[index].request;
                let (c, ts) = (req.client, req.timestamp);
                if fresh {
                    executed.push((c, ts));
                }
                match result {
                    // Behind a firewall a reply goes into this batch's bundle, the only way
                    // back; one that ran before (its client asked again) goes in again (Yin
                    // et al. §3.2.1: a fresh reply with the new sequence number).
                    Some(result) if self.firewall.is_some() => {
                        bundle.push(ReplyEntry {
                            client: c,
                            timestamp: ts,
                            result,
                        });
                    }
                    Some(result) if fresh => {
                        let reply = self.reply(c, ts, &result, cert.view);
                        let via = designated_replier(c, ts, self.cfg.n());
                        self.send_reply(c, &reply, via);
                    }
                    _ => {}
                }
            }
            self.stats.bodies_refused = self.exec.bodies_refused();
        }
        self.last_view = cert.view;
        if self.firewall.is_some() {
            self.send_bundle(ReplyBundle {
                seq,
                entries: bundle,
            });
        }
        self.exec.complete(seq, cert.digest);
        self.orders.forget_through(seq);
        self.window.done.insert(seq, cert.frames);
        self.stats.batches_executed += 1;
        self.stats.requests_executed += executed.len() as u64;
        self.event(Event::Executed {
            seq,
            view: cert.view,
            digest: cert.digest,
            requests: executed,
        });
        if seq.is_multiple_of(self.cfg.checkpoint_interval) {
            self.take_checkpoint(seq);
        }
    }

    fn reply(&self, client: ClientId, timestamp: u64, result: &[u8], view: u64) -> Message {
        let digest_only = self.cfg.digest_replies
            && result.len() >= DIGEST_REPLY_MIN_BYTES
            && designated_replier(client, timestamp, self.cfg.executors) != self.id;
        Message::Client(ClientMessage::Reply(Reply {
            view,
            timestamp,
            client,
            replica: self.id,
            digest_only,
            tentative: false,
            result: if digest_only {
                Digest::of(result).0.to_vec()
            } else {
                result.to_vec()
            },
        }))
    }

    /// Tells every agreement node how far we executed.
    fn acknowledge(&mut self) {
        if self.firewall.is_some() {
            // Behind a firewall the reply certificates acknowledge, and stable checkpoints
            // go down as certificates too (`firewall.rs`).
            return;
        }
        let ack = Message::from(ExecAck {
            executor: self.id,
            seq: self.exec.last_executed(),
            stable: self.window.stable,
        });
        for r in 0..self.cfg.n() {
            self.send(Principal::Replica(r), &ack);
        }
    }

    // ----- checkpoints ----------------------------------------------------------------------

    fn take_checkpoint(&mut self, seq: Seq) {
        let Some(digest) = self.exec.checkpoint(seq) else {
            return;
        };
        self.exec.note_checkpoint(seq, digest);
        self.event(Event::CheckpointTaken { seq, digest });
        self.window
            .votes
            .entry(seq)
            .or_default()
            .insert(self.id, digest);
        self.send_vote(seq, digest);
        self.check_checkpoint(seq);
    }

    fn send_vote(&mut self, seq: Seq, digest: Digest) {
        let m = Message::from(ExecCheckpoint {
            executor: self.id,
            seq,
            digest,
            share: self.checkpoint_share(seq, &digest),
            signed: self.vote_signature(seq, &digest),
        });
        self.send_peers(&m);
    }

    fn check_checkpoint(&mut self, seq: Seq) {
        let Some(votes) = self.window.votes.get(&seq) else {
            return;
        };
        let quorum = self.cfg.exec_quorum();
        let mut count: BTreeMap<Digest, usize> = BTreeMap::new();
        for d in votes.values() {
            *count.entry(*d).or_default() += 1;
        }
        let Some((vouched, _)) = count.into_iter().find(|(_, c)| *c >= quorum) else {
            return;
        };
        match self.exec.own_checkpoint(seq) {
            Some(own) if own == vouched => self.make_stable(seq),
            Some(_) => {
                // g+1 peers (one of them correct) computed another state: ours is wrong.
                self.event(Event::StateDivergence { seq });
                self.exec.forget_checkpoint(seq);
                self.exec.set_diverged(true);
                self.fetch_checkpoint(seq, vouched, true);
            }
            None if seq > self.exec.last_executed() => {
                // Ahead of us: certificates may bring us there; if not, fetch it.
                let urgent = seq > self.exec.last_executed() + self.cfg.log_size;
                self.fetch_checkpoint(seq, vouched, urgent);
            }
            None => {}
        }
    }

    fn make_stable(&mut self, seq: Seq) {
        if seq <= self.window.stable {
            return;
        }
        if self.exec.state().held(seq).is_some() {
            self.exec.state_mut().commit_base(seq);
        }
        self.window.stable = seq;
        self.prove_stable(seq);
        self.prove_stable_signed(seq);
        self.window.done = self.window.done.split_off(&(seq + 1));
        self.window.votes = self.window.votes.split_off(&(seq + 1));
        self.exec.forget_executed_through(seq);
        self.exec.forget_checkpoints_below(seq);
        self.stats.checkpoints_stable += 1;
        self.event(Event::Stable { seq });
        // The replicas wait for g+1 stable checkpoints before ordering past theirs: tell them
        // now rather than at the next heartbeat.
        self.acknowledge();
        self.send_stable_share();
    }

    // ----- session keys ---------------------------------------------------------------------

    /// Sends a reply; with session keys and no key of the client's (we restarted, or it
    /// expired), the client gets our NEW-KEY instead, which makes it send its keys again.
    /// Clients talk to the agreement nodes only: the frame goes to one of them (`via`) to
    /// pass on. A faulty one may drop it; the client's retransmission then reaches a correct
    /// one, whose [`Retry`] brings the reply again through it.
    fn send_reply(&mut self, c: ClientId, reply: &Message, via: ReplicaId) {
        let to = Principal::Client(c);
        if self.auth.session_ref().is_some_and(|s| !s.can_send(to)) {
            self.resend_new_key(to, via);
            return;
        }
        self.relay(c, reply, via);
    }

    /// Seals `msg` for client `c` and hands it to agreement node `via` to pass on.
    fn relay(&mut self, c: ClientId, msg: &Message, via: ReplicaId) {
        let frame = seal(&self.auth, msg, Some(Principal::Client(c)), self.cfg.n());
        let m = Message::from(Relay {
            client: c,
            frame: serde_bytes::ByteBuf::from(frame),
        });
        self.send(Principal::Replica(via), &m);
    }

    /// Our latest NEW-KEY again to `to`, rate-limited per principal (to a client through
    /// agreement node `via`).
    fn resend_new_key(&mut self, to: Principal, via: ReplicaId) {
        let now = self.env.now_ms;
        let Some(nk) = self.keying.new_key_for(&self.auth, to, now) else {
            return;
        };
        match to {
            Principal::Client(c) => self.relay(c, &Message::from(nk), via),
            _ => self.send(to, &Message::from(nk)),
        }
    }

    // ----- timers ---------------------------------------------------------------------------

    fn tick(&mut self) {
        self.tick_keys();
        self.drive_transfer();
        let now = self.env.now_ms;
        if self.keying.take_sessions_retry() {
            self.try_execute();
        }
        if now >= self.pacing.next_heartbeat_ms {
            self.pacing.next_heartbeat_ms = now + self.cfg.status_interval_ms;
            // Acknowledgements and votes may be lost: repeat them (one of each).
            self.acknowledge();
            self.send_stable_share();
            // Every checkpoint of ours from the stable one on (at most L/K + 1 of them): a
            // peer far behind learns what to fetch from the stable one.
            for (seq, d) in self.exec.own_checkpoints_from(self.window.stable.max(1)) {
                self.send_vote(seq, d);
            }
        }
        // A gap: later certificates (or a peer's later checkpoint) but not the next one.
        let next = self.exec.last_executed() + 1;
        let behind = self.orders.any_above(next)
            || self
                .window
                .votes
                .keys()
                .next_back()
                .is_some_and(|s| *s >= next);
        // Behind a firewall nothing tells a node that caught up to its peers' last checkpoint
        // (a restart, a state transfer) that they executed further: the agreement nodes resend
        // only what g+1 execution nodes have not executed. It asks now and then anyway.
        let probe = self.firewall.is_some()
            && now
                >= self
                    .pacing
                    .next_missing_ms
                    .saturating_add(4 * self.cfg.status_interval_ms);
        if (behind || probe)
            && self.orders.certified(next).is_none()
            && now >= self.pacing.next_missing_ms
        {
            self.pacing.next_missing_ms = now + self.cfg.status_interval_ms;
            self.stats.missing_sent += 1;
            let m = Message::from(Missing {
                executor: self.id,
                seq: next,
            });
            self.send_peers(&m);
        }
    }

    // ----- sending --------------------------------------------------------------------------

    fn send(&mut self, to: Principal, msg: &Message) {
        if self.keying.calls.hold(to, msg) {
            return; // its NEW-KEY is being admitted: sent under the new key once it is
        }
        let bytes = Arc::new(seal(&self.auth, msg, Some(to), self.cfg.n()));
        self.effects.push(Effect::Send { to, bytes });
    }

    /// Sends to every other execution node.
    fn send_peers(&mut self, msg: &Message) {
        let me = self.id;
        for p in (0..self.cfg.executors).filter(|p| *p != me) {
            self.send(Principal::Executor(p), msg);
        }
    }

    fn event(&mut self, e: Event) {
        self.effects.push(Effect::Event(e));
    }

    fn reject(&mut self, from: Principal, kind: &'static str, reason: Reject) {
        self.stats.rejected += 1;
        self.event(Event::Rejected { from, kind, reason });
    }
}

impl<S: Service, A: KeyTable> Executor<S, A> {
    /// The principal of this node.
    pub fn principal(&self) -> Principal {
        self.auth.me()
    }
}
