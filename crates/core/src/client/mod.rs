//! The client side of PBFT as a deterministic state machine.
//!
//! One outstanding request at a time (PBFT's model; run several clients for concurrency).
//! The request goes to the believed primary first; if no certificate of f+1 matching replies
//! arrives within the retransmission timeout it is multicast to every replica, with randomized
//! exponential back-off. The timeout is derived from measured response times.
//!
//! A read-only operation (with `read_only_fast_path`) is sent to the replicas, which
//! answer without ordering it; the client needs 2f+1 matching replies. If they do not arrive
//! within the retransmission timeout (concurrent writes, a replica down), it is reissued as an
//! ordered request under a fresh timestamp, so late read-only answers cannot count towards it.
//! With `read_only_to_quorum` the read goes to 2f+1 replicas first, and to the other f only
//! if their answers are not all in and matching after two smoothed round trips (a replica
//! that was late, or answered something else, is then left out of this client's next reads).

use crate::bodies::{self, Opened};
use crate::effect::{Bytes, Effect, Env};
use crate::keys::KeyTable;
use crate::keys::Purpose;
use crate::message::FrameRef;
use crate::message::{
    decode_frame_ref, designated_replier, designated_replier_except, reply_header, Message,
    ReplyHeader, Request, RequestSig, SignedRequest,
};
use crate::message::{ClientMessage, RecoveryMessage};
use crate::seal::{open, request_authenticator, seal};
use crate::types::{ClientId, Config, Principal, ReplicaId, View};
use redoubt_crypto::body::{BodyKey, ENC_LEN};
use redoubt_crypto::Digest;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod firewall;
mod outstanding;
use outstanding::{Outstanding, Vote};
mod firewall_view;
use firewall_view::FirewallView;

/// Client-side timing knobs (ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTiming {
    /// Lower bound of the retransmission timeout.
    pub retransmit_min_ms: u64,
    /// Upper bound of the retransmission timeout after back-off.
    pub retransmit_max_ms: u64,
    /// Initial estimate of the response time before any measurement.
    pub initial_rtt_ms: u64,
}

impl Default for ClientTiming {
    fn default() -> Self {
        ClientTiming {
            retransmit_min_ms: 50,
            retransmit_max_ms: 4000,
            initial_rtt_ms: 100,
        }
    }
}

/// A completed operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub timestamp: u64,
    pub result: Vec<u8>,
    /// View reported by the certificate (tracks the primary).
    pub view: View,
    pub latency_ms: u64,
    pub retransmissions: u32,
    /// With confidential bodies: why the executors did not run the operation (it did not
    /// open there), or why the certified result did not open here. `result` is then empty.
    pub refused: Option<String>,
}

/// Why an invocation was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvokeError {
    #[error("a request is already outstanding")]
    Busy,
    #[error("operation of {0} bytes exceeds the configured maximum")]
    TooLarge(usize),
    #[error(
        "no body session with the executors (no executors' public key, or the key holder failed)"
    )]
    NoBodySession,
}

/// How many fast reads leave out a replica that was late to answer one.
const READ_SKIP_READS: u32 = 1_000;

/// Shortest interval between NEW-KEYs a client sends because replicas stopped answering (ms).
const KEY_FORCE_MIN_MS: u64 = 1000;
/// Least time between NEW-KEYs forced by retransmissions that go unanswered; in between, the
/// current NEW-KEY is sent again with each retransmission. A fresh key on every
/// retransmission made a lossy link race each new NEW-KEY against the request it preceded.
const KEY_FORCE_STALL_MS: u64 = 4 * KEY_FORCE_MIN_MS;

/// At most this many timestamps are passed over to find one whose designated replier is
/// reachable (each draw misses with probability below 1/2 when at most f are unreachable).
const DESIGNATED_REDRAWS_MAX: u32 = 16;

/// A client.
pub struct Client<A: KeyTable> {
    cfg: Config,
    timing: ClientTiming,
    id: ClientId,
    auth: A,
    view: View,
    /// Prime: the replica our ordered requests go to first, which introduces them. It starts
    /// at our id modulo n and moves to the next replica whenever a request completed only
    /// after its retransmission to every replica: a faulty home that never introduces our
    /// requests costs one retransmission timeout, not one per request.
    home: ReplicaId,
    last_timestamp: u64,
    srtt_ms: f64,
    outstanding: Option<Outstanding>,
    effects: Vec<Effect>,
    /// What it counted (for metrics).
    pub stats: ClientStats,
    /// Which replicas fast reads go to.
    reads: FastReads,
    /// Session keys: NEW-KEYs due and sent.
    rekey: Rekeying,
    /// With confidential bodies: the current body session with the executors (renewed with
    /// every periodic key refresh).
    body: Option<([u8; ENC_LEN], BodyKey)>,
    /// Firewall deployment: the views the replicas passing certified replies on reported.
    firewall: Option<FirewallView>,
    /// Until when new requests go signed: a request of ours completed only after its
    /// retransmission timeout ran out (see [`Client::complete`]).
    wary_until_ms: u64,
}

/// What a client counted (for metrics).
#[derive(Clone, Debug, Default)]
pub struct ClientStats {
    /// Frames dropped because they did not verify or did not match.
    pub rejected: u64,
    /// Read-only operations reissued on the ordered path.
    pub fallbacks: u64,
    /// Fast reads sent to 2f+1 replicas that had to ask the others too.
    pub read_widenings: u64,
    /// Replies dropped unverified because they answer no outstanding request (the replies
    /// beyond a certificate, late ones, retransmitted ones).
    pub unwanted: u64,
    /// NEW-KEYs sent, replicas' requests for them, and failures of the key holder.
    pub key_refreshes: u64,
    pub keys_asked: u64,
    pub key_holder_failures: u64,
    /// Requests signed by our key holder (at their first retransmission).
    pub requests_signed: u64,
    /// Retransmissions brought forward because matching digests came without the result.
    pub full_result_asks: u64,
    /// With confidential bodies: body sessions started.
    pub body_sessions: u64,
    /// Requests sent signed while wary (see [`Client::complete`]).
    pub wary_requests: u64,
}

/// Which replicas a client's fast reads go to.
#[derive(Default)]
struct FastReads {
    /// A replica that was late to answer a fast read, left out of the next reads (and how
    /// many more).
    read_skip: Option<(ReplicaId, u32)>,
    /// Replicas the host cannot reach now (no connection, and connecting failed), left out
    /// of fast reads first (see [`Client::set_unreachable`]).
    unreachable: Vec<ReplicaId>,
    /// Fast reads sent to 2f+1 replicas (turns the replicas left out).
    reads_narrowed: u64,
}

/// A client's session keys: when NEW-KEYs are due, and what was sent.
#[derive(Default)]
struct Rekeying {
    /// When the next NEW-KEY is due (host clock, ms), and the last one.
    next_rekey_ms: u64,
    last_rekey_ms: Option<u64>,
    /// The last NEW-KEY sent to every replica (sent again with stalled retransmissions).
    last_new_key: Option<Bytes>,
    /// Replicas that lost our key and get a NEW-KEY of their own, and when each last got one
    /// (both at most n entries).
    rekey_for: BTreeSet<Principal>,
    last_rekey_of: BTreeMap<Principal, u64>,
}

impl<A: KeyTable> Client<A> {
    pub fn new(cfg: Config, timing: ClientTiming, id: ClientId, auth: A) -> Self {
        let srtt_ms = timing.initial_rtt_ms as f64;
        // Behind a firewall a client takes its replies from f+1 replicas passing on matching
        // entries of reply certificates they took in, not from g+1 execution nodes' replies.
        let firewall = cfg.firewall().then(|| FirewallView {
            views: vec![0; cfg.n() as usize],
        });
        let home = (id % cfg.n() as u64) as ReplicaId;
        Client {
            cfg,
            timing,
            id,
            auth,
            view: 0,
            home,
            last_timestamp: 0,
            srtt_ms,
            outstanding: None,
            effects: Vec::new(),
            stats: ClientStats::default(),
            reads: FastReads::default(),
            rekey: Rekeying::default(),
            body: None,
            firewall,
            wary_until_ms: 0,
        }
    }

    /// The replicas the host cannot reach now (its connection to them is down and connecting
    /// failed): fast reads leave them out first, so that a client (a new process above all,
    /// which has not yet seen who answers late) does not wait for a replica that is down
    /// before it asks the others; and no request's timestamp makes one of them the replica
    /// that sends the result in full (digest replies), so the result comes without a
    /// retransmission. Only a hint: what a replica answers is checked as ever.
    pub fn set_unreachable(&mut self, replicas: impl IntoIterator<Item = ReplicaId>) {
        let n = self.cfg.n();
        self.reads.unreachable.clear();
        self.reads
            .unreachable
            .extend(replicas.into_iter().filter(|r| *r < n).take(n as usize));
    }

    /// Replica `r` lost our key (it asked for it, or it restarted): a NEW-KEY with a fresh key
    /// for `r` alone goes out with the next invocation or tick, no sooner than
    /// `KEY_FORCE_MIN_MS` after the last one sent to `r`. Only `r`'s key changes, so requests
    /// in flight stay verifiable at the others, and a replica that asks for nothing but
    /// trouble (or a forged ask) can only make us re-key with that one replica.
    pub fn refresh_keys_soon(&mut self, r: ReplicaId) {
        self.refresh_keys_soon_for(Principal::Replica(r));
    }

    /// Like [`Client::refresh_keys_soon`] for a replica or an execution node.
    pub fn refresh_keys_soon_for(&mut self, p: Principal) {
        let known = match p {
            Principal::Replica(r) => r < self.cfg.n(),
            Principal::Executor(e) => e < self.cfg.executors,
            Principal::Client(_) | Principal::Filter(_) => false,
        };
        if self.auth.session_ref().is_none() || !known {
            return;
        }
        self.rekey.rekey_for.insert(p);
    }

    /// The principals that hold this client's keys: the replicas, and the execution nodes
    /// of a separated deployment (which answer it).
    fn key_peers(&self) -> Vec<Principal> {
        (0..self.cfg.n())
            .map(Principal::Replica)
            .chain((0..self.cfg.executors).map(Principal::Executor))
            .collect()
    }

    /// With session keys: sends a NEW-KEY to every replica when one is due (at the start,
    /// every `key_refresh_ms`, or `force`d because replicas stopped answering: they may have
    /// discarded our key after a recovery or restart), or to the replicas that lost our key.
    fn refresh_keys(&mut self, env: Env, force: bool) {
        if self.auth.session_ref().is_none() {
            return;
        }
        // A periodic refresh waits (at most KEY_FORCE_STALL_MS) for the request in flight to
        // complete: replies already sent under the keys it replaces no longer verify here.
        let periodic = env.now_ms >= self.rekey.next_rekey_ms
            && (self.outstanding.is_none()
                || env.now_ms >= self.rekey.next_rekey_ms + KEY_FORCE_STALL_MS);
        let due = periodic
            || (force
                && self
                    .rekey
                    .last_rekey_ms
                    .is_none_or(|t| env.now_ms >= t + KEY_FORCE_STALL_MS));
        let targets: Vec<Principal> = if due {
            self.key_peers()
        } else {
            let now = env.now_ms;
            let last = &self.rekey.last_rekey_of;
            self.rekey
                .rekey_for
                .iter()
                .copied()
                .filter(|r| last.get(r).is_none_or(|t| now >= t + KEY_FORCE_MIN_MS))
                .collect()
        };
        if targets.is_empty() {
            return;
        }
        // Execution nodes get our keys from the replicas, which pass on a NEW-KEY of ours
        // they accept (clients talk to the replicas only): an execution node that lost our
        // key gets a NEW-KEY for everyone.
        let targets = if targets.iter().any(|p| matches!(p, Principal::Executor(_))) {
            self.key_peers()
        } else {
            targets
        };
        let replicas = targets.clone();
        let Some(s) = self.auth.session() else {
            return;
        };
        match s.refresh(&replicas) {
            Ok(nk) => {
                self.stats.key_refreshes += 1;
                // Answers to the request in flight under the replaced keys are lost: hear it
                // again after one round trip, by when the replicas hold the new keys.
                if let Some(o) = self.outstanding.as_mut() {
                    o.retransmit_within(env.now_ms, self.srtt_ms);
                }
                for r in &targets {
                    self.rekey.rekey_for.remove(r);
                    self.rekey.last_rekey_of.insert(*r, env.now_ms);
                }
                if due {
                    self.rekey.last_rekey_ms = Some(env.now_ms);
                    self.rekey.next_rekey_ms = env.now_ms + self.cfg.key_refresh_ms;
                    // A new body session with the next request: a key stolen from a
                    // replica opens no body sealed after it recovered.
                    self.body = None;
                }
                let bytes = Arc::new(seal(&self.auth, &Message::from(nk), None, self.cfg.n()));
                if due {
                    self.rekey.last_new_key = Some(bytes.clone());
                }
                for to in replicas
                    .into_iter()
                    .filter(|p| matches!(p, Principal::Replica(_)))
                {
                    self.effects.push(Effect::Send {
                        to,
                        bytes: bytes.clone(),
                    });
                }
            }
            Err(_) => {
                self.stats.key_holder_failures += 1;
                self.rekey.next_rekey_ms = env.now_ms + KEY_FORCE_MIN_MS;
            }
        }
    }

    /// The request with an authenticator under the current keys, sealed in a frame.
    fn seal_request(&self, request: &Request, sig: Option<RequestSig>) -> Bytes {
        let auth = request_authenticator(&self.auth, &request.digest(), self.cfg.n());
        let msg = Message::from(SignedRequest {
            request: request.clone(),
            auth: auth.into(),
            sig,
        });
        Arc::new(seal(&self.auth, &msg, None, self.cfg.n()))
    }

    /// Our key holder's signature of `request` (none without session keys, or if the key
    /// holder fails: the request then goes with its MACs alone).
    fn sign_request(&mut self, request: &Request) -> Option<RequestSig> {
        let digest = request.digest();
        let signed = self
            .auth
            .session_ref()?
            .with_holder(|h| h.sign(Purpose::Request, &digest));
        match signed {
            Ok((counter, sig)) => {
                self.stats.requests_signed += 1;
                Some(RequestSig { counter, sig })
            }
            Err(_) => {
                self.stats.key_holder_failures += 1;
                None
            }
        }
    }

    pub fn id(&self) -> ClientId {
        self.id
    }
    /// The client's keys (tests, the simulator's attacker).
    pub fn auth(&self) -> &A {
        &self.auth
    }
    pub fn view(&self) -> View {
        self.view
    }
    pub fn is_busy(&self) -> bool {
        self.outstanding.is_some()
    }
    /// Current retransmission timeout before back-off (ms).
    pub fn rto_ms(&self) -> u64 {
        ((self.srtt_ms * 4.0) as u64)
            .clamp(self.timing.retransmit_min_ms, self.timing.retransmit_max_ms)
    }
    /// Timestamp of the outstanding request, if any.
    pub fn outstanding_timestamp(&self) -> Option<u64> {
        self.outstanding.as_ref().map(|o| o.request.timestamp)
    }

    /// Starts an operation. Returns its timestamp; the effects send it.
    pub fn invoke(
        &mut self,
        env: Env,
        op: Vec<u8>,
        read_only: bool,
    ) -> Result<(u64, Vec<Effect>), InvokeError> {
        if self.outstanding.is_some() {
            return Err(InvokeError::Busy);
        }
        if op.len() > self.cfg.request_bytes_max {
            return Err(InvokeError::TooLarge(op.len()));
        }
        // Separated: every request is ordered (the replicas hold no service state to answer
        // from).
        let fast_read = read_only && self.cfg.read_only_fast_path && !self.cfg.separated();
        let Some((timestamp, _)) = self.issue(env, op.into(), read_only, fast_read, env.now_ms)
        else {
            return Err(InvokeError::NoBodySession);
        };
        Ok((timestamp, std::mem::take(&mut self.effects)))
    }

    /// Starts a body session with the executors if there is none (confidential bodies).
    fn ensure_body_session(&mut self, env: Env) -> bool {
        if self.body.is_none() {
            self.body = self.auth.start_body_session(env.entropy);
            if self.body.is_some() {
                self.stats.body_sessions += 1;
            } else {
                self.stats.key_holder_failures += 1;
            }
        }
        self.body.is_some()
    }

    /// Signs and sends a request under a fresh timestamp: a fast read or a large request to
    /// every replica, anything else to the believed primary. With confidential bodies the
    /// operation is sealed in the current body session; `None` if none could be started.
    fn issue(
        &mut self,
        env: Env,
        plain: bytes::Bytes,
        read_only: bool,
        fast_read: bool,
        started_ms: u64,
    ) -> Option<(u64, Bytes)> {
        self.refresh_keys(env, false);
        if self.cfg.confidential_bodies && !self.ensure_body_session(env) {
            return None;
        }
        // Timestamps stay increasing across restarts as long as the clock does.
        let mut timestamp = (self.last_timestamp + 1).max(env.now_ms.saturating_mul(1000));
        // The timestamp picks the replica that sends the result in full (digest replies):
        // never one the host cannot reach, or the result would come only after a
        // retransmission. Timestamps need only increase, so skipping some costs nothing.
        if self.cfg.digest_replies && !self.cfg.separated() && !self.cfg.firewall() {
            for _ in 0..DESIGNATED_REDRAWS_MAX {
                if !self.reads.unreachable.contains(&self.designated(timestamp)) {
                    break;
                }
                timestamp += 1;
            }
        }
        self.last_timestamp = timestamp;
        let session = self.body.clone().filter(|_| self.cfg.confidential_bodies);
        // Mutant clear-bodies: the operation goes unsealed.
        #[cfg(feature = "mutants")]
        let session = session.filter(|_| self.cfg.mutant != crate::types::Mutant::ClearBodies);
        let op = match &session {
            Some((enc, key)) => {
                bodies::seal_op(key, enc, self.id, timestamp, read_only, &plain).into()
            }
            None => plain.clone(),
        };
        let request = Request {
            client: self.id,
            timestamp,
            read_only,
            op,
        };
        // Prime: every ordered request is signed (it travels inside other replicas'
        // PO-REQUESTs) and goes to our home replica, which introduces it.
        let prime = self.cfg.prime() && !fast_read;
        let wary = !prime && !fast_read && env.now_ms < self.wary_until_ms;
        let sig = if prime || wary {
            self.sign_request(&request)
        } else {
            None
        };
        if wary {
            self.stats.wary_requests += 1;
        }
        let bytes = self.seal_request(&request, sig);
        let mut unasked = Vec::new();
        if prime {
            self.effects.push(Effect::Send {
                to: Principal::Replica(self.home),
                bytes: bytes.clone(),
            });
        } else if fast_read || self.cfg.travels_beside(request.op.len()) {
            unasked = if fast_read {
                self.read_skips(timestamp)
            } else {
                Vec::new()
            };
            for r in (0..self.cfg.n()).filter(|r| !unasked.contains(r)) {
                self.effects.push(Effect::Send {
                    to: Principal::Replica(r),
                    bytes: bytes.clone(),
                });
            }
        } else {
            let primary = self.cfg.primary(self.view);
            self.effects.push(Effect::Send {
                to: Principal::Replica(primary),
                bytes: bytes.clone(),
            });
        }
        self.outstanding = Some(Outstanding {
            request,
            plain,
            session: session.map(|(_, key)| key),
            fast_read,
            unasked,
            widen_ms: env.now_ms + self.read_widen_ms(),
            widened: false,
            bytes: bytes.clone(),
            started_ms,
            deadline_ms: env.now_ms + self.rto_ms(),
            backoff: 0,
            sig,
            replies: BTreeMap::new(),
            asked_full: false,
            early: false,
            timed_out: false,
        });
        Some((timestamp, bytes))
    }

    /// The f replicas a fast read under `timestamp` leaves out at first (none without
    /// `read_only_to_quorum`): the replica lately late to answer, if any, the replicas the
    /// host cannot reach, then the others in
    /// turn from one that moves on with every read, so reads spread over every replica,
    /// passing over the replica that sends the full result (digest replies) as this client
    /// knows the primary.
    fn read_skips(&mut self, timestamp: u64) -> Vec<ReplicaId> {
        let n = self.cfg.n();
        let leave = n as usize - self.cfg.quorum();
        if !self.cfg.read_only_to_quorum || leave == 0 {
            return Vec::new();
        }
        let designated = self.designated(timestamp);
        let mut skips = Vec::with_capacity(leave);
        if let Some((r, left)) = self.reads.read_skip {
            skips.push(r);
            self.reads.read_skip = left.checked_sub(1).map(|l| (r, l)).filter(|(_, l)| *l > 0);
        }
        for r in &self.reads.unreachable {
            if skips.len() < leave && !skips.contains(r) {
                skips.push(*r);
            }
        }
        self.reads.reads_narrowed = self.reads.reads_narrowed.wrapping_add(1);
        let start = (self.id.wrapping_add(self.reads.reads_narrowed) % n as u64) as ReplicaId;
        for r in (0..n).map(|i| (start + i) % n) {
            if skips.len() == leave {
                break;
            }
            if r != designated && !skips.contains(&r) {
                skips.push(r);
            }
        }
        skips
    }

    /// The replica that sends the result of the request under `timestamp` in full (digest
    /// replies), as this client knows the primary; the replicas choose it the same way.
    fn designated(&self, timestamp: u64) -> ReplicaId {
        let n = self.cfg.n();
        if n == 1 {
            return 0; // an unreplicated server (f = 0, the benchmarks' baseline)
        }
        if self.cfg.primary_replies {
            designated_replier(self.id, timestamp, n)
        } else {
            designated_replier_except(self.id, timestamp, n, self.cfg.primary(self.view))
        }
    }

    /// How long a fast read sent to 2f+1 replicas waits for their answers before it asks the
    /// others too: two smoothed round trips, at least 1 ms.
    fn read_widen_ms(&self) -> u64 {
        ((self.srtt_ms * 2.0).ceil() as u64).max(1)
    }

    /// Forgets the outstanding request (the caller gave up on it). Its outcome is unknown.
    pub fn abandon(&mut self) {
        self.outstanding = None;
    }

    /// Whether a reply for `timestamp` could still count: it answers the outstanding request.
    fn wants(&self, timestamp: u64) -> bool {
        self.outstanding_timestamp() == Some(timestamp)
    }

    /// Handles a frame; returns the completion if this reply finished the request.
    pub fn receive(&mut self, env: Env, bytes: &[u8]) -> Option<Completion> {
        self.receive_routed(env, bytes, reply_header(bytes))
    }

    /// Like [`receive`](Self::receive), for a frame whose [`reply_header`] its host already
    /// read to route it (`None`: not a reply); the header is not read again.
    pub fn receive_routed(
        &mut self,
        env: Env,
        bytes: &[u8],
        header: Option<ReplyHeader>,
    ) -> Option<Completion> {
        // Replies to anything but the outstanding request are dropped before they are decoded
        // or verified: with n replicas answering and 2f+1 (or f+1) enough, the rest of every
        // request's replies arrive after it completed.
        if let Some(h) = header {
            if !self.wants(h.timestamp) {
                self.stats.unwanted += 1;
                return None;
            }
        }
        let frame = match decode_frame_ref(bytes, self.cfg.message_bytes_max) {
            Ok(f) => f,
            Err(_) => {
                self.stats.rejected += 1;
                return None;
            }
        };
        if self.cfg.firewall() {
            return self.receive_certified(env, &frame);
        }
        // Replies come from the replicas, or in a separated deployment from the execution
        // nodes (which number `executors` and need g+1 matching).
        let separated = self.cfg.separated();
        let (from, repliers) = match frame.from {
            Principal::Replica(r) => (r, if separated { 0 } else { self.cfg.n() }),
            Principal::Executor(e) if separated => (e, self.cfg.executors),
            _ => {
                self.stats.rejected += 1;
                return None;
            }
        };
        let reply = match open(&self.auth, &frame) {
            Ok(Message::Client(ClientMessage::Reply(r))) => r,
            Ok(Message::Recovery(RecoveryMessage::NewKey(nk))) if nk.from == frame.from => {
                self.asked_for_keys(frame.from);
                return None;
            }
            _ => {
                self.stats.rejected += 1;
                return None;
            }
        };
        if reply.replica != from || reply.client != self.id || from >= repliers {
            self.stats.rejected += 1;
            return None;
        }
        let o = self.outstanding.as_mut()?;
        if reply.timestamp != o.request.timestamp {
            return None; // a late reply to an earlier request
        }
        let Some(d) = reply.result_digest() else {
            self.stats.rejected += 1;
            return None;
        };
        o.vote(
            from,
            Vote {
                view: reply.view,
                digest: d,
                result: (!reply.digest_only).then_some(reply.result),
                tentative: reply.tentative,
            },
        );
        // A certificate: f+1 matching committed replies (one from a correct replica), or
        // 2f+1 matching replies of any kind. Read-only answers always need 2f+1: they come
        // from states that may not include the latest writes.
        #[cfg(feature = "mutants")]
        let (weak_reads, weak_tentative) = (
            self.cfg.mutant == crate::types::Mutant::ReadOnlyWeakQuorum,
            self.cfg.mutant == crate::types::Mutant::TentativeWeakQuorum,
        );
        #[cfg(not(feature = "mutants"))]
        let (weak_reads, weak_tentative) = (false, false);
        #[cfg(feature = "mutants")]
        let exec_quorum = if self.cfg.mutant == crate::types::Mutant::ExecReplyAtG {
            self.cfg.g() as usize
        } else {
            self.cfg.exec_quorum()
        };
        #[cfg(not(feature = "mutants"))]
        let exec_quorum = self.cfg.exec_quorum();
        let weak = if separated {
            exec_quorum
        } else {
            self.cfg.weak_quorum()
        };
        // Execution nodes reply only to what committed (separated): g+1 always suffice.
        let strong = if separated || (o.fast_read && weak_reads) {
            weak
        } else {
            self.cfg.quorum()
        };
        let matching = || o.replies.values().filter(|v| v.digest == d);
        let committed = matching()
            .filter(|v| !v.tentative || weak_tentative)
            .count();
        let certified = matching().count() >= strong || (!o.fast_read && committed >= weak);
        let all_asked_answered =
            || (0..repliers).all(|r| o.unasked.contains(&r) || o.replies.contains_key(&r));
        if !certified {
            if !o.unasked.is_empty() && all_asked_answered() {
                o.widen_ms = env.now_ms; // they do not match: ask the others at once
            }
            return None;
        }
        // Enough matching digests, and the result itself from one of them. Without it, the
        // one replier that was to send it in full is faulty or its frame was lost: rather
        // than wait out the retransmission timeout (doubled by now, if the request itself
        // needed retransmitting), ask again after one more round trip, when every replier
        // answers in full.
        if !matching().any(|v| v.result.is_some()) {
            if !o.unasked.is_empty() {
                // The replica sending the result in full is one not asked yet (this client's
                // view is stale): ask the others at the next tick.
                o.widen_ms = env.now_ms;
                return None;
            }
            if o.ask_for_full_result(env.now_ms, self.srtt_ms) {
                self.stats.full_result_asks += 1;
            }
            return None;
        }
        // The view vouched for by f+1 replicas: the (f+1)-th highest.
        let mut views: Vec<View> = matching().map(|v| v.view).collect();
        views.sort_unstable_by(|a, b| b.cmp(a));
        let view = views[weak - 1];
        let o = self.outstanding.take().expect("checked");
        if o.widened {
            // A replica that answered something else made this read ask the others (it may
            // lie, or have read before or after a concurrent write): leave it out next.
            if let Some((&r, _)) = o.replies.iter().find(|(_, v)| v.digest != d) {
                self.reads.read_skip = Some((r, READ_SKIP_READS));
            }
        }
        let result = o
            .replies
            .values()
            .find_map(|v| {
                if v.digest == d {
                    v.result.clone()
                } else {
                    None
                }
            })
            .expect("a full matching reply is present");
        Some(self.complete(env, o, result, view))
    }

    /// `p` (a replica, or an execution node) holds no key of ours (it recovered, or our key
    /// expired there) and sent its NEW-KEY: refresh at the next opportunity. Unverified on
    /// purpose: a forged one costs at most one NEW-KEY per KEY_FORCE_MIN_MS.
    fn asked_for_keys(&mut self, p: Principal) {
        self.stats.keys_asked += 1;
        self.refresh_keys_soon_for(p);
    }

    /// The request `o` completed with `result` (sealed when bodies are) in `view`.
    fn complete(&mut self, env: Env, o: Outstanding, result: Vec<u8>, view: View) -> Completion {
        let (result, refused) = match &o.session {
            None => (result, None),
            Some(key) => match bodies::open_result(key, self.id, o.request.timestamp, &result) {
                Opened::Result(r) => (r, None),
                Opened::Refused(why) => (Vec::new(), Some(why)),
                Opened::Malformed => (
                    Vec::new(),
                    Some("the certified result does not open".into()),
                ),
            },
        };
        let latency_ms = env.now_ms.saturating_sub(o.started_ms);
        if o.backoff == 0 && !o.widened {
            // Only unambiguous samples (no retransmission) update the estimate. Not a read
            // that waited to ask the others: its wait is derived from the estimate, and on a
            // lossy network the estimate would feed on itself.
            self.srtt_ms = 0.875 * self.srtt_ms + 0.125 * latency_ms as f64;
        }
        if view > self.view {
            self.view = view;
        }
        if o.timed_out && !o.fast_read && self.cfg.prime() {
            // Our home did not have the request ordered before the timeout: it may be faulty
            // (or the network lost the request); the next requests go to the next replica.
            self.home = (self.home + 1) % self.cfg.n();
        }
        if o.timed_out && !o.fast_read && !self.cfg.prime() {
            // Sent to the primary unsigned, it went unanswered until the timeout: every
            // replica may suspect us (f+1 of them could not authenticate a request of ours,
            // their keys stale after a partition) and order only what we sign, for
            // `suspect_client_ms`. For as long, requests go signed, as retransmissions do: a
            // timeout a request at a time otherwise. (Still to the primary alone: sent to
            // every replica, signed requests would run the backups' timers and count as
            // waiting in their pace checks, and a load that fell while they waited cost
            // correct primaries their views.)
            self.wary_until_ms = env.now_ms + self.cfg.suspect_client_ms;
        }
        Completion {
            timestamp: o.request.timestamp,
            result,
            view,
            latency_ms,
            retransmissions: o.backoff,
            refused,
        }
    }

    /// Retransmits when the timeout expired: to every replica, with back-off and jitter.
    pub fn tick(&mut self, env: Env) -> Vec<Effect> {
        let refreshes = self.stats.key_refreshes;
        self.refresh_keys(env, false);
        let rto = self.rto_ms();
        let max = self.timing.retransmit_max_ms;
        if let Some(o) = self
            .outstanding
            .as_mut()
            .filter(|o| !o.unasked.is_empty() && env.now_ms >= o.widen_ms.min(o.deadline_ms))
        {
            // The 2f+1 replicas a fast read went to did not all answer alike in time: ask the
            // others, and leave the first late one out of the next reads.
            let late =
                (0..self.cfg.n()).find(|r| !o.unasked.contains(r) && !o.replies.contains_key(r));
            if let Some(r) = late {
                self.reads.read_skip = Some((r, READ_SKIP_READS));
            }
            for r in o.unasked.drain(..) {
                self.effects.push(Effect::Send {
                    to: Principal::Replica(r),
                    bytes: o.bytes.clone(),
                });
            }
            o.deadline_ms = o.deadline_ms.max(env.now_ms + rto);
            o.widened = true;
            self.stats.read_widenings += 1;
            return std::mem::take(&mut self.effects);
        }
        if self
            .outstanding
            .as_ref()
            .is_some_and(|o| o.fast_read && env.now_ms >= o.deadline_ms)
        {
            // No 2f+1 matching read-only answers in time: order it instead.
            let mut o = self.outstanding.take().expect("checked");
            if self
                .issue(env, o.plain.clone(), false, false, o.started_ms)
                .is_none()
            {
                // No body session (the key holder failed): keep waiting, try again later.
                o.deadline_ms = env.now_ms + rto;
                self.outstanding = Some(o);
                return std::mem::take(&mut self.effects);
            }
            if let Some(n) = self.outstanding.as_mut() {
                n.backoff = 1;
            }
            self.stats.fallbacks += 1;
            return std::mem::take(&mut self.effects);
        }
        let stalled = self
            .outstanding
            .as_ref()
            .is_some_and(|o| env.now_ms >= o.deadline_ms && o.backoff >= 1);
        if stalled {
            let before = self.stats.key_refreshes;
            self.refresh_keys(env, true);
            if self.stats.key_refreshes == before {
                // Not re-keyed now: the current NEW-KEY again, for a replica that lost it or
                // got it after the request it preceded (it ignores one it already holds).
                if let Some(b) = self.rekey.last_new_key.clone() {
                    for r in 0..self.cfg.n() {
                        self.effects.push(Effect::Send {
                            to: Principal::Replica(r),
                            bytes: b.clone(),
                        });
                    }
                }
            }
        }
        if self.auth.session_ref().is_some() {
            // Retransmissions carry MACs under the latest keys, and our signature: a replica
            // that cannot verify its MAC entry (its key for us is older or newer, or it
            // suspects us) can still vouch for the request.
            if let Some((req, fast_read, sig)) = self
                .outstanding
                .as_ref()
                .filter(|o| env.now_ms >= o.deadline_ms)
                .map(|o| (o.request.clone(), o.fast_read, o.sig))
            {
                let sig = match sig {
                    Some(s) => Some(s),
                    None if !fast_read => self.sign_request(&req),
                    None => None,
                };
                let bytes = self.seal_request(&req, sig);
                if let Some(o) = self.outstanding.as_mut() {
                    o.bytes = bytes;
                    o.sig = sig;
                }
            }
        }
        if let Some(o) = self.outstanding.as_mut() {
            if env.now_ms >= o.deadline_ms {
                o.timed_out |= !o.early;
                o.early = false;
                o.backoff += 1;
                let base = rto.saturating_mul(1 << o.backoff.min(16)).min(max);
                // Jitter in [0.5, 1.5) of the base spreads retransmissions of many clients.
                let jitter = base / 2 + env.entropy % base.max(1);
                o.deadline_ms = env.now_ms + jitter.max(1);
                for r in 0..self.cfg.n() {
                    self.effects.push(Effect::Send {
                        to: Principal::Replica(r),
                        bytes: o.bytes.clone(),
                    });
                }
                // Re-keyed with this retransmission: the answers to it may come under the
                // keys just replaced (a NEW-KEY can arrive after the request it preceded).
                if self.stats.key_refreshes != refreshes {
                    o.retransmit_within(env.now_ms, self.srtt_ms);
                }
            }
        }
        std::mem::take(&mut self.effects)
    }
}
