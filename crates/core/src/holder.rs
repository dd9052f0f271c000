//! Key-holder work as effects: what a replica or an execution node asks its key holder leaves
//! `handle` as an [`Effect::Holder`](crate::Effect::Holder) and its answer comes back as an
//! input, so the protocol thread never waits on the key holder (in a deployment a process
//! behind a Unix socket that syncs its counters to disk before it answers). The host performs a
//! call with [`perform`] off the protocol thread; the simulator delays, reorders and fails
//! answers.
//!
//! Refreshing the node's own keys is asked this way (fresh keys for the recipients, sealed to
//! each, and the NEW-KEY signed: [`HolderRequest::NewKey`]); at most one refresh is in flight,
//! and the keys are installed when the answer comes. Admitting a peer's NEW-KEY is asked this
//! way too. A node first checks what needs no key holder
//! ([`SessionKeys::check`](crate::keys::SessionKeys::check): the sender, the signature, the
//! counter against what it installed), so only genuine NEW-KEYs reach [`Admissions`]: per
//! sender at most one admission in flight and one waiting (the newest), a bound set by the
//! directory. An answer arriving after a newer key of the same sender was installed changes
//! nothing (see [`SessionKeys::install`](crate::keys::SessionKeys::install)).
//!
//! Opening a client's body session (the key its sealed operations open under, from the
//! executors' secret the key holder keeps) is asked this way too, per client at most one call
//! in flight: the batch that needs it waits for the answer, and a read-only request waits
//! among the reads.
//!
//! A recovering replica's recovery request is signed this way ([`HolderRequest::SignRecovery`],
//! with the fresh order key it names under Prime), one call at a time; the request goes out
//! when the answer comes. An execution node's checkpoint votes are signed this way too
//! ([`HolderRequest::SignVote`], one call per checkpoint): the vote goes with its MAC alone
//! until the signature comes, then again with it.
//!
//! State transfers under confidential bodies are sealed under state sessions, and both ends
//! ask the key holder this way too: the fetching node for the fresh randomness of its own
//! session ([`HolderRequest::FreshKey`], one call at a time; its FETCH goes out with the
//! answer), the serving node for the key of the fetcher's session ([`HolderRequest::OpenState`],
//! one call per peer; the FETCH that needed it is answered with the answer).

use crate::keys::{seal_info, Admitted, HolderError, KeyHolder, NewKey, NewKeyError, Purpose};
use crate::message::RecoveryMessage;
use crate::message::{checkpoint_statement, RecoveryOp};
use crate::message::{Message, Reject};
use crate::types::{ClientId, Principal, ReplicaId, Seq};
use redoubt_crypto::body::{BodyKey, ENC_LEN};
use redoubt_crypto::pk::{HolderSecrets, SealPublicKey, Signature, VerifyKey};
use redoubt_crypto::Digest;
use redoubt_crypto::MacKey;
use std::collections::{BTreeMap, VecDeque};

/// A call to the key holder, named by `id` (unique within the node's life).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderCall {
    pub id: u64,
    pub request: HolderRequest,
}

/// What the key holder is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HolderRequest {
    /// Admit a peer's NEW-KEY (see [`KeyHolder::admit`]).
    Admit(NewKey),
    /// Draw a fresh key for each recipient, seal it to the recipient's public key, and sign
    /// the NEW-KEY of `from` carrying them.
    NewKey {
        from: Principal,
        recipients: Vec<(Principal, SealPublicKey)>,
    },
    /// Open `client`'s body session `enc` (see [`KeyHolder::open_body`]).
    OpenBody {
        client: ClientId,
        enc: [u8; ENC_LEN],
    },
    /// Sign `replica`'s recovery request for the estimate `h_m` (BFT-PR §4.4); with
    /// `order_key`, first draw the fresh order key whose public half the request names
    /// (Prime: the old one may be in an attacker's hands). See [`sign_recovery`].
    SignRecovery {
        replica: ReplicaId,
        h_m: Seq,
        order_key: bool,
    },
    /// Sign an execution node's vote for checkpoint `(seq, digest)` (see
    /// [`checkpoint_statement`]).
    SignVote { seq: Seq, digest: Digest },
    /// Fresh randomness for a state session of ours (see [`KeyHolder::fresh_key`]).
    FreshKey,
    /// Open the key of `peer`'s state session `enc` (see [`KeyHolder::open_body`]).
    OpenState { peer: Principal, enc: [u8; ENC_LEN] },
}

/// The key holder's answer to the call `id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderAnswer {
    pub id: u64,
    pub result: HolderResult,
}

/// What the key holder answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HolderResult {
    Admitted(Result<Admitted, HolderError>),
    /// The signed NEW-KEY and the fresh keys it carries, per recipient.
    NewKey(Result<(NewKey, Vec<(Principal, MacKey)>), HolderError>),
    /// The body session's key (`None`: the session does not open, at any key holder; boxed:
    /// a key comes with its cipher's key schedule).
    BodyKey(Box<Result<Option<BodyKey>, HolderError>>),
    /// The signed recovery request's parts.
    Recovery(Result<SignedRecovery, HolderError>),
    /// A signature with the counter it was made under.
    Signed(Result<(u64, Signature), HolderError>),
    /// Fresh randomness.
    Fresh(Result<MacKey, HolderError>),
}

/// A recovery request as the key holder signed it: the order key's seed and public half
/// (Prime), and the counter and signature over [`RecoveryOp::content_digest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedRecovery {
    pub seed: Option<MacKey>,
    pub row_key: Option<VerifyKey>,
    pub counter: u64,
    pub sig: Signature,
}

/// Draws the order key (with `order_key`) and signs `replica`'s recovery request for `h_m`.
pub fn sign_recovery(
    holder: &mut dyn KeyHolder,
    replica: ReplicaId,
    h_m: Seq,
    order_key: bool,
) -> Result<SignedRecovery, HolderError> {
    let seed = if order_key {
        Some(holder.fresh_key()?)
    } else {
        None
    };
    let row_key = seed
        .as_ref()
        .map(|s| HolderSecrets::from_seed(&s.0).public().verify);
    let content = RecoveryOp::content_digest(replica, h_m, row_key.as_ref());
    let (counter, sig) = holder.sign(Purpose::Recovery, &content)?;
    Ok(SignedRecovery {
        seed,
        row_key,
        counter,
        sig,
    })
}

/// Performs `call` with `holder` (hosts do, off the protocol thread).
pub fn perform(holder: &mut dyn KeyHolder, call: &HolderCall) -> HolderAnswer {
    let result = match &call.request {
        HolderRequest::Admit(nk) => HolderResult::Admitted(holder.admit(nk)),
        HolderRequest::NewKey { from, recipients } => {
            HolderResult::NewKey(make_new_key(holder, *from, recipients))
        }
        HolderRequest::OpenBody { client, enc } => HolderResult::BodyKey(Box::new(
            holder.open_body(&crate::keys::body_info(*client), enc),
        )),
        HolderRequest::SignRecovery {
            replica,
            h_m,
            order_key,
        } => HolderResult::Recovery(sign_recovery(holder, *replica, *h_m, *order_key)),
        HolderRequest::SignVote { seq, digest } => HolderResult::Signed(
            holder.sign(Purpose::Checkpoint, &checkpoint_statement(*seq, digest)),
        ),
        HolderRequest::FreshKey => HolderResult::Fresh(holder.fresh_key()),
        HolderRequest::OpenState { peer, enc } => HolderResult::BodyKey(Box::new(
            crate::keys::state_info_for(*peer).and_then(|info| holder.open_body(&info, enc)),
        )),
    };
    HolderAnswer {
        id: call.id,
        result,
    }
}

impl HolderResult {
    /// What a NEW-KEY's admission came to: this answer's, or a failure if the call was given
    /// up (`None`) or answered with something else.
    pub(crate) fn admitted(this: Option<HolderResult>) -> Result<Admitted, HolderError> {
        match this {
            Some(HolderResult::Admitted(a)) => a,
            _ => Err(unanswered()),
        }
    }

    /// What a refresh came to, likewise.
    pub(crate) fn made(
        this: Option<HolderResult>,
    ) -> Result<(NewKey, Vec<(Principal, MacKey)>), HolderError> {
        match this {
            Some(HolderResult::NewKey(m)) => m,
            _ => Err(unanswered()),
        }
    }

    /// What signing a recovery request came to, likewise.
    pub(crate) fn recovery(this: Option<HolderResult>) -> Result<SignedRecovery, HolderError> {
        match this {
            Some(HolderResult::Recovery(r)) => r,
            _ => Err(unanswered()),
        }
    }

    /// What a call for fresh randomness came to, likewise.
    pub(crate) fn fresh(this: Option<HolderResult>) -> Result<MacKey, HolderError> {
        match this {
            Some(HolderResult::Fresh(r)) => r,
            _ => Err(unanswered()),
        }
    }

    /// What a signature came to, likewise.
    pub(crate) fn signed(this: Option<HolderResult>) -> Result<(u64, Signature), HolderError> {
        match this {
            Some(HolderResult::Signed(r)) => r,
            _ => Err(unanswered()),
        }
    }

    /// What opening a body session came to, likewise.
    pub(crate) fn body_key(this: Option<HolderResult>) -> Result<Option<BodyKey>, HolderError> {
        match this {
            Some(HolderResult::BodyKey(k)) => *k,
            _ => Err(unanswered()),
        }
    }
}

fn unanswered() -> HolderError {
    HolderError::Unreachable("no answer from the key holder in time".into())
}

/// Fresh keys for `recipients`, sealed to each, in a NEW-KEY of `from` the holder signs.
pub fn make_new_key(
    holder: &mut dyn KeyHolder,
    from: Principal,
    recipients: &[(Principal, SealPublicKey)],
) -> Result<(NewKey, Vec<(Principal, MacKey)>), HolderError> {
    let mut sealed = Vec::with_capacity(recipients.len());
    let mut fresh = Vec::with_capacity(recipients.len());
    for (p, public) in recipients {
        let k = holder.fresh_key()?;
        sealed.push((*p, holder.seal(public, &seal_info(from, *p), &k)?));
        fresh.push((*p, k));
    }
    let content = NewKey::content_digest(from, &sealed);
    let (counter, sig) = holder.sign(Purpose::NewKey, &content)?;
    let nk = NewKey {
        from,
        counter,
        keys: sealed,
        sig,
    };
    Ok((nk, fresh))
}

/// Why a NEW-KEY is refused, as a rejection.
pub(crate) fn reject_of(e: NewKeyError) -> Reject {
    match e {
        NewKeyError::Stale => Reject::Stale,
        NewKeyError::BadSignature => Reject::BadSignature,
        NewKeyError::UnknownSender => Reject::UnknownSender,
        NewKeyError::NoKey => Reject::Inconsistent,
        NewKeyError::Holder => Reject::KeyHolder,
    }
}

/// How long a call may go unanswered before it counts as failed (a host that lost it, a key
/// holder that never answers): the key holder's own socket gives up after 5 s.
pub const CALL_TIMEOUT_MS: u64 = 10_000;

/// A node's calls to its key holder in flight: NEW-KEYs being admitted (per sender one in
/// flight and the newest one waiting behind it) and at most one refresh of its own keys, each
/// with the time it was made.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    next_id: u64,
    in_flight: BTreeMap<u64, (NewKey, u64)>,
    waiting: BTreeMap<Principal, NewKey>,
    refresh: Option<(u64, u64)>,
    /// Body sessions being opened: per call the client and its session (one per client).
    bodies: BTreeMap<u64, (ClientId, [u8; ENC_LEN], u64)>,
    /// Our recovery request being signed: the call and when it was made.
    recovery: Option<(u64, u64)>,
    /// Checkpoint votes being signed: per call the checkpoint and when it was made (one call
    /// per checkpoint).
    votes: BTreeMap<u64, (Seq, Digest, u64)>,
    /// Fresh randomness for our state session being drawn: the call and when it was made.
    fresh: Option<(u64, u64)>,
    /// Peers' state sessions being opened: per call the peer, its session and when it was
    /// made (one call per peer).
    states: BTreeMap<u64, (Principal, [u8; ENC_LEN], u64)>,
    /// Messages for principals whose NEW-KEY is being admitted, sent once it is: sent now
    /// they would go under the key the principal just retired, and be refused.
    held: BTreeMap<Principal, VecDeque<Message>>,
    held_len: usize,
    /// Frames carrying requests of principals whose NEW-KEY is being admitted that do not
    /// verify under the key installed (from the client, or relayed by a replica), read again
    /// once it is: a client's first request comes right behind its NEW-KEY, and refused it
    /// would wait out the client's retransmission timeout.
    held_in: BTreeMap<Principal, VecDeque<Vec<u8>>>,
    held_in_bytes: usize,
}

/// Messages held for one principal while its NEW-KEY is admitted, and for all of them: the
/// oldest go first when full (what still matters is sent again by the protocol).
const HELD_PER_PRINCIPAL: usize = 256;
const HELD_MAX: usize = 4096;

/// Frames held from one principal while its NEW-KEY is admitted, and the bytes held from all
/// of them: the oldest go first when full (the sender retransmits what still matters).
const HELD_IN_PER_PRINCIPAL: usize = 8;
const HELD_IN_BYTES_MAX: usize = 4 << 20;

/// The id of a new call for `slot`, a kind of call made one at a time (noted in it with
/// `now_ms`); `None` while one is in flight.
fn one_at_a_time(next_id: &mut u64, slot: &mut Option<(u64, u64)>, now_ms: u64) -> Option<u64> {
    if slot.is_some() {
        return None;
    }
    *next_id += 1;
    *slot = Some((*next_id, now_ms));
    Some(*next_id)
}

/// What an answer was about (see [`Calls::answered`]).
pub(crate) enum Answered {
    /// The admission of this NEW-KEY; the call for its sender's waiting one, if any (boxed:
    /// the other answers are small).
    Admission(Box<(NewKey, Option<HolderCall>)>),
    /// Our refresh.
    Refresh,
    /// Opening `client`'s body session `enc`.
    Body {
        client: ClientId,
        enc: [u8; ENC_LEN],
    },
    /// Signing our recovery request.
    Recovery,
    /// Signing our vote for checkpoint `(seq, digest)`.
    Vote { seq: Seq, digest: Digest },
    /// Drawing fresh randomness for our state session.
    Fresh,
    /// Opening `peer`'s state session `enc`.
    State { peer: Principal, enc: [u8; ENC_LEN] },
    /// Not a call of ours (of an earlier life), or answered twice.
    Unknown,
}

impl Calls {
    /// `nk` (checked: genuine, and newer than what is installed) is to be admitted: returns
    /// the call to make now, or `None` when one of its sender is in flight (it waits, unless
    /// an equal or newer one already does) or this very NEW-KEY is.
    pub(crate) fn admit(&mut self, nk: NewKey, now_ms: u64) -> Option<HolderCall> {
        let from = nk.from;
        if let Some((flying, _)) = self.in_flight.values().find(|(f, _)| f.from == from) {
            if flying.counter < nk.counter
                && self
                    .waiting
                    .get(&from)
                    .is_none_or(|w| w.counter < nk.counter)
            {
                self.waiting.insert(from, nk);
            }
            return None;
        }
        Some(self.call_admit(nk, now_ms))
    }

    fn call_admit(&mut self, nk: NewKey, now_ms: u64) -> HolderCall {
        let id = self.id();
        self.in_flight.insert(id, (nk.clone(), now_ms));
        HolderCall {
            id,
            request: HolderRequest::Admit(nk),
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A refresh of our keys (`request`, a [`HolderRequest::NewKey`]): the call to make, or
    /// `None` while one is in flight.
    pub(crate) fn refresh(&mut self, request: HolderRequest, now_ms: u64) -> Option<HolderCall> {
        let id = one_at_a_time(&mut self.next_id, &mut self.refresh, now_ms)?;
        Some(HolderCall { id, request })
    }

    /// Our recovery request is to be signed (`request`, a [`HolderRequest::SignRecovery`]):
    /// the call to make, or `None` while one is in flight.
    pub(crate) fn sign_recovery(
        &mut self,
        request: HolderRequest,
        now_ms: u64,
    ) -> Option<HolderCall> {
        let id = one_at_a_time(&mut self.next_id, &mut self.recovery, now_ms)?;
        Some(HolderCall { id, request })
    }

    /// Our vote for checkpoint `(seq, digest)` is to be signed: the call to make, or `None`
    /// while one for `seq` is in flight.
    pub(crate) fn sign_vote(
        &mut self,
        seq: Seq,
        digest: Digest,
        now_ms: u64,
    ) -> Option<HolderCall> {
        if self.votes.values().any(|(s, _, _)| *s == seq) {
            return None;
        }
        let id = self.id();
        self.votes.insert(id, (seq, digest, now_ms));
        Some(HolderCall {
            id,
            request: HolderRequest::SignVote { seq, digest },
        })
    }

    /// Fresh randomness for our state session is to be drawn: the call to make, or `None`
    /// while one is in flight.
    pub(crate) fn draw_fresh(&mut self, now_ms: u64) -> Option<HolderCall> {
        let id = one_at_a_time(&mut self.next_id, &mut self.fresh, now_ms)?;
        Some(HolderCall {
            id,
            request: HolderRequest::FreshKey,
        })
    }

    /// `peer`'s state session `enc` is to be opened: the call to make, or `None` while one
    /// for `peer` is in flight.
    pub(crate) fn open_state(
        &mut self,
        peer: Principal,
        enc: [u8; ENC_LEN],
        now_ms: u64,
    ) -> Option<HolderCall> {
        if self.states.values().any(|(p, _, _)| *p == peer) {
            return None;
        }
        let id = self.id();
        self.states.insert(id, (peer, enc, now_ms));
        Some(HolderCall {
            id,
            request: HolderRequest::OpenState { peer, enc },
        })
    }

    /// `client`'s body session `enc` is to be opened: the call to make now, or `None` while
    /// one for this client is in flight (asked again, if still needed, once it is answered).
    pub(crate) fn open_body(
        &mut self,
        client: ClientId,
        enc: [u8; ENC_LEN],
        now_ms: u64,
    ) -> Option<HolderCall> {
        if self.bodies.values().any(|(c, _, _)| *c == client) {
            return None;
        }
        let id = self.id();
        self.bodies.insert(id, (client, enc, now_ms));
        Some(HolderCall {
            id,
            request: HolderRequest::OpenBody { client, enc },
        })
    }

    /// Keeps `msg` for `to` if a NEW-KEY of `to` is being admitted (true), to be sent once it
    /// is ([`Calls::release`]). NEW-KEYs themselves go at once: their signature is their
    /// authentication.
    pub(crate) fn hold(&mut self, to: Principal, msg: &Message) -> bool {
        if matches!(msg, Message::Recovery(RecoveryMessage::NewKey(_))) || !self.admitting(to) {
            return false;
        }
        let q = self.held.entry(to).or_default();
        if q.len() >= HELD_PER_PRINCIPAL || self.held_len >= HELD_MAX {
            if q.pop_front().is_none() {
                return false; // full with other principals' messages: sent now, refused
            }
            self.held_len -= 1;
        }
        q.push_back(msg.clone());
        self.held_len += 1;
        true
    }

    /// The messages held for `to`, once no NEW-KEY of `to` is being admitted any more.
    pub(crate) fn release(&mut self, to: Principal) -> Vec<Message> {
        if self.admitting(to) {
            return Vec::new();
        }
        let out: Vec<Message> = self.held.remove(&to).map(Vec::from).unwrap_or_default();
        self.held_len -= out.len();
        out
    }

    /// Keeps the frame `bytes` (a request of `from`, sent by it or relayed) if a NEW-KEY of
    /// `from` is being admitted (true), to be read again once it is ([`Calls::release_in`]).
    pub(crate) fn hold_in(&mut self, from: Principal, bytes: &[u8]) -> bool {
        if !self.admitting(from) || bytes.len() > HELD_IN_BYTES_MAX {
            return false;
        }
        let q = self.held_in.entry(from).or_default();
        while q.len() >= HELD_IN_PER_PRINCIPAL
            || self.held_in_bytes + bytes.len() > HELD_IN_BYTES_MAX
        {
            let Some(old) = q.pop_front() else {
                break;
            };
            self.held_in_bytes -= old.len();
        }
        if self.held_in_bytes + bytes.len() > HELD_IN_BYTES_MAX {
            if q.is_empty() {
                self.held_in.remove(&from);
            }
            return false; // full with other principals' frames: refused now
        }
        q.push_back(bytes.to_vec());
        self.held_in_bytes += bytes.len();
        true
    }

    /// The frames held from `from`, once no NEW-KEY of `from` is being admitted any more.
    pub(crate) fn release_in(&mut self, from: Principal) -> Vec<Vec<u8>> {
        if self.admitting(from) {
            return Vec::new();
        }
        let out: Vec<Vec<u8>> = self
            .held_in
            .remove(&from)
            .map(Vec::from)
            .unwrap_or_default();
        self.held_in_bytes -= out.iter().map(Vec::len).sum::<usize>();
        out
    }

    /// Whether a NEW-KEY of `p` is being admitted.
    pub(crate) fn admitting(&self, p: Principal) -> bool {
        self.in_flight.values().any(|(nk, _)| nk.from == p)
    }

    /// Whether a call opening a state session of `peer` is in flight.
    pub(crate) fn opening_state(&self, peer: Principal) -> bool {
        self.states.values().any(|(p, _, _)| *p == peer)
    }

    /// Whether a refresh of our keys is in flight.
    pub(crate) fn refreshing(&self) -> bool {
        self.refresh.is_some()
    }

    /// The answer to call `id` arrived at `now_ms`: what it was about.
    pub(crate) fn answered(&mut self, id: u64, now_ms: u64) -> Answered {
        if self.refresh.is_some_and(|(r, _)| r == id) {
            self.refresh = None;
            return Answered::Refresh;
        }
        if self.recovery.is_some_and(|(r, _)| r == id) {
            self.recovery = None;
            return Answered::Recovery;
        }
        if self.fresh.is_some_and(|(r, _)| r == id) {
            self.fresh = None;
            return Answered::Fresh;
        }
        if let Some((peer, enc, _)) = self.states.remove(&id) {
            return Answered::State { peer, enc };
        }
        if let Some((client, enc, _)) = self.bodies.remove(&id) {
            return Answered::Body { client, enc };
        }
        if let Some((seq, digest, _)) = self.votes.remove(&id) {
            return Answered::Vote { seq, digest };
        }
        let Some((nk, _)) = self.in_flight.remove(&id) else {
            return Answered::Unknown;
        };
        let next = self
            .waiting
            .remove(&nk.from)
            .map(|w| self.call_admit(w, now_ms));
        Answered::Admission(Box::new((nk, next)))
    }

    /// The calls unanswered for [`CALL_TIMEOUT_MS`] at `now_ms`, given up (a late answer is
    /// then ignored): what each was about, as if it had failed.
    pub(crate) fn expired(&mut self, now_ms: u64) -> Vec<Answered> {
        let late = |sent: u64| now_ms.saturating_sub(sent) >= CALL_TIMEOUT_MS;
        let mut ids: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, (_, sent))| late(*sent))
            .map(|(id, _)| *id)
            .collect();
        ids.extend(
            [self.refresh, self.recovery, self.fresh]
                .into_iter()
                .flatten()
                .filter(|(_, sent)| late(*sent))
                .map(|(id, _)| id),
        );
        ids.extend(
            self.bodies
                .iter()
                .filter(|(_, (_, _, sent))| late(*sent))
                .map(|(id, _)| *id),
        );
        ids.extend(
            self.votes
                .iter()
                .filter(|(_, (_, _, sent))| late(*sent))
                .map(|(id, _)| *id),
        );
        ids.extend(
            self.states
                .iter()
                .filter(|(_, (_, _, sent))| late(*sent))
                .map(|(id, _)| *id),
        );
        ids.into_iter()
            .map(|id| self.answered(id, now_ms))
            .collect()
    }

    /// Admissions in flight and NEW-KEYs waiting (bounded by twice the directory).
    pub(crate) fn len(&self) -> usize {
        self.in_flight.len() + self.waiting.len()
    }

    /// [`Calls::check_invariants`] for a node whose session keys are `keys`.
    pub(crate) fn check_with(&self, keys: Option<&crate::keys::SessionKeys>) -> Result<(), String> {
        let senders = keys.map_or(0, |s| s.directory().keys.len());
        self.check_invariants(senders)
            .map_err(|e| format!("key-holder calls: {e}"))
    }

    /// Checks the bounds: per sender one admission in flight and one waiting, `senders` (the
    /// directory's principals) at most; per client one body session being opened.
    pub(crate) fn check_invariants(&self, senders: usize) -> Result<(), String> {
        let mut seqs = std::collections::BTreeSet::new();
        for (seq, _, _) in self.votes.values() {
            if !seqs.insert(*seq) {
                return Err(format!("two votes for checkpoint {seq} being signed"));
            }
        }
        let mut peers = std::collections::BTreeSet::new();
        for (p, _, _) in self.states.values() {
            if !peers.insert(*p) {
                return Err(format!("two state sessions of {p} being opened"));
            }
        }
        let mut clients = std::collections::BTreeSet::new();
        for (c, _, _) in self.bodies.values() {
            if !clients.insert(*c) {
                return Err(format!("two body sessions of client {c} being opened"));
            }
        }
        if self.bodies.len() > senders {
            return Err(format!(
                "{} body sessions being opened for {senders} principals",
                self.bodies.len()
            ));
        }
        if self.len() > 2 * senders {
            return Err(format!(
                "{} admissions for {senders} principals",
                self.len()
            ));
        }
        let mut senders = std::collections::BTreeSet::new();
        for (nk, _) in self.in_flight.values() {
            if !senders.insert(nk.from) {
                return Err(format!("two admissions of {} in flight", nk.from));
            }
        }
        for p in self.waiting.keys() {
            if !senders.contains(p) {
                return Err(format!("a NEW-KEY of {p} waits with none in flight"));
            }
        }
        let held: usize = self.held.values().map(|q| q.len()).sum();
        if held != self.held_len || held > HELD_MAX {
            return Err(format!("{held} messages held, {} counted", self.held_len));
        }
        if let Some(p) = self.held.keys().find(|p| !senders.contains(p)) {
            return Err(format!("messages held for {p} with no admission in flight"));
        }
        let held_in: usize = self.held_in.values().flatten().map(Vec::len).sum();
        if held_in != self.held_in_bytes || held_in > HELD_IN_BYTES_MAX {
            return Err(format!(
                "{held_in} bytes of frames held, {} counted",
                self.held_in_bytes
            ));
        }
        if let Some((p, q)) = self
            .held_in
            .iter()
            .find(|(p, q)| !senders.contains(p) || q.is_empty() || q.len() > HELD_IN_PER_PRINCIPAL)
        {
            return Err(format!(
                "{} frames held from {p}, with {} admission in flight",
                q.len(),
                if senders.contains(p) { "an" } else { "no" }
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::PbftMessage;
    use redoubt_crypto::pk::Signature;

    fn nk(from: Principal, counter: u64) -> NewKey {
        NewKey {
            from,
            counter,
            keys: Vec::new(),
            sig: Signature([0; 64]),
        }
    }

    #[test]
    fn one_admission_per_sender_in_flight_and_the_newest_waits() {
        let r1 = Principal::Replica(1);
        let mut a = Calls::default();
        let first = a.admit(nk(r1, 5), 0).expect("nothing in flight");
        assert!(a.admit(nk(r1, 5), 0).is_none(), "the same one again");
        assert!(a.admit(nk(r1, 7), 0).is_none());
        assert!(
            a.admit(nk(r1, 6), 0).is_none(),
            "older than the waiting one"
        );
        let other = a
            .admit(nk(Principal::Client(3), 1), 0)
            .expect("another sender");
        assert_eq!(a.len(), 3);
        assert_eq!(a.check_invariants(2), Ok(()));
        assert!(a.check_invariants(1).is_err());
        let Answered::Admission(done) = a.answered(first.id, 1) else {
            panic!("the first admission");
        };
        let (done, Some(next)) = *done else {
            panic!("the waiting one next");
        };
        assert_eq!(done.counter, 5);
        assert_eq!(next.request, HolderRequest::Admit(nk(r1, 7)));
        assert!(
            matches!(a.answered(first.id, 1), Answered::Unknown),
            "answered twice"
        );
        a.answered(other.id, 1);
        a.answered(next.id, 1);
        assert_eq!(a.len(), 0);
    }

    #[test]
    fn frames_are_held_from_a_sender_being_admitted_within_bounds() {
        let (c1, c2) = (Principal::Client(1), Principal::Client(2));
        let mut a = Calls::default();
        assert!(!a.hold_in(c1, b"early"), "no admission in flight");
        let call = a.admit(nk(c1, 5), 0).unwrap();
        for i in 0..HELD_IN_PER_PRINCIPAL + 2 {
            assert!(a.hold_in(c1, &[i as u8; 10]));
        }
        assert!(!a.hold_in(c1, &vec![0; HELD_IN_BYTES_MAX + 1]), "too large");
        assert!(!a.hold_in(c2, b"x"), "c2 is not being admitted");
        assert_eq!(a.check_invariants(2), Ok(()));
        assert!(a.release_in(c1).is_empty(), "still being admitted");
        a.answered(call.id, 1);
        let out = a.release_in(c1);
        assert_eq!(out.len(), HELD_IN_PER_PRINCIPAL, "the oldest went first");
        assert_eq!(out[0], [2u8; 10]);
        assert_eq!(a.check_invariants(2), Ok(()));
        assert!(a.release_in(c1).is_empty());
        // One sender fills the byte budget: another sender's frame is refused, not
        // pushed out of the first's queue.
        let first = a.admit(nk(c1, 6), 2).unwrap();
        a.admit(nk(c2, 1), 2).unwrap();
        let big = vec![0; HELD_IN_BYTES_MAX / 2];
        assert!(a.hold_in(c1, &big) && a.hold_in(c1, &big));
        assert!(!a.hold_in(c2, b"x"));
        assert_eq!(a.check_invariants(2), Ok(()));
        a.answered(first.id, 3);
        assert_eq!(a.release_in(c1).len(), 2);
        assert!(a.hold_in(c2, b"x"));
        assert_eq!(a.check_invariants(2), Ok(()));
    }

    #[test]
    fn one_refresh_at_a_time() {
        let mut a = Calls::default();
        let request = HolderRequest::NewKey {
            from: Principal::Replica(0),
            recipients: Vec::new(),
        };
        let call = a.refresh(request.clone(), 0).expect("none in flight");
        assert!(a.refresh(request.clone(), 0).is_none());
        assert!(a.refreshing());
        assert!(matches!(a.answered(call.id, 1), Answered::Refresh));
        assert!(a.refresh(request, 1).is_some());
    }

    #[test]
    fn calls_unanswered_for_the_timeout_are_given_up() {
        let r1 = Principal::Replica(1);
        let mut a = Calls::default();
        let request = HolderRequest::NewKey {
            from: Principal::Replica(0),
            recipients: Vec::new(),
        };
        let refresh = a.refresh(request, 0).unwrap();
        let admit = a.admit(nk(r1, 5), 100).unwrap();
        a.admit(nk(r1, 6), 200);
        assert!(a.expired(CALL_TIMEOUT_MS - 1).is_empty());
        let gone = a.expired(CALL_TIMEOUT_MS + 100);
        assert_eq!(gone.len(), 2, "the refresh and the first admission");
        assert!(!a.refreshing());
        let next = gone.into_iter().find_map(|g| match g {
            Answered::Admission(a) => Some((a.0.counter, a.1)),
            _ => None,
        });
        let (5, Some(next)) = next.expect("the admission") else {
            panic!("the waiting NEW-KEY goes next");
        };
        assert!(
            matches!(a.answered(refresh.id, 0), Answered::Unknown),
            "late answers"
        );
        assert!(matches!(a.answered(admit.id, 0), Answered::Unknown));
        assert!(matches!(a.answered(next.id, 0), Answered::Admission(..)));
    }

    #[test]
    fn one_body_session_per_client_is_opened_at_a_time() {
        let mut a = Calls::default();
        let first = a.open_body(7, [1; ENC_LEN], 0).expect("none in flight");
        assert!(
            a.open_body(7, [2; ENC_LEN], 0).is_none(),
            "client 7's in flight"
        );
        let other = a.open_body(8, [1; ENC_LEN], 0).expect("another client");
        assert_eq!(a.check_invariants(2), Ok(()));
        assert!(a.check_invariants(1).is_err(), "more calls than principals");
        assert!(matches!(
            a.answered(first.id, 1),
            Answered::Body { client: 7, enc } if enc == [1; ENC_LEN]
        ));
        assert!(
            a.open_body(7, [2; ENC_LEN], 1).is_some(),
            "answered: asked again"
        );
        let gone = a.expired(CALL_TIMEOUT_MS + 1);
        assert_eq!(gone.len(), 2, "both given up");
        assert!(matches!(a.answered(other.id, 0), Answered::Unknown));
    }

    #[test]
    fn one_call_signs_a_recovery_request_and_one_per_checkpoint_signs_a_vote() {
        let mut a = Calls::default();
        let req = || HolderRequest::SignRecovery {
            replica: 3,
            h_m: 256,
            order_key: true,
        };
        let rec = a.sign_recovery(req(), 0).expect("none in flight");
        assert!(a.sign_recovery(req(), 0).is_none(), "one at a time");
        let d = Digest::of(b"state");
        let v8 = a.sign_vote(8, d, 0).expect("none for 8");
        assert!(a.sign_vote(8, d, 5).is_none(), "8's in flight");
        let v16 = a.sign_vote(16, d, 5).expect("another checkpoint");
        assert_eq!(a.check_invariants(1), Ok(()));
        assert!(matches!(a.answered(rec.id, 1), Answered::Recovery));
        assert!(matches!(
            a.answered(v8.id, 1),
            Answered::Vote { seq: 8, digest } if digest == d
        ));
        assert!(a.sign_recovery(req(), 1).is_some(), "answered: asked again");
        // Given up after the timeout, each as what it was about.
        let gone = a.expired(CALL_TIMEOUT_MS + 5);
        assert_eq!(gone.len(), 2);
        assert!(gone.iter().any(|g| matches!(g, Answered::Recovery)));
        assert!(gone
            .iter()
            .any(|g| matches!(g, Answered::Vote { seq: 16, .. })));
        assert!(matches!(a.answered(v16.id, 0), Answered::Unknown));
    }

    #[test]
    fn messages_for_a_principal_wait_while_its_new_key_is_admitted() {
        let r1 = Principal::Replica(1);
        let mut a = Calls::default();
        let status = Message::Pbft(PbftMessage::Batches(Vec::new()));
        assert!(!a.hold(r1, &status), "no admission: sent at once");
        let call = a.admit(nk(r1, 5), 0).unwrap();
        assert!(a.hold(r1, &status));
        assert!(!a.hold(r1, &Message::from(nk(Principal::Replica(0), 1))));
        assert!(!a.hold(Principal::Replica(2), &status));
        for _ in 0..HELD_PER_PRINCIPAL + 10 {
            a.hold(r1, &status);
        }
        assert_eq!(a.check_invariants(4), Ok(()));
        assert!(a.release(r1).is_empty(), "still admitting");
        a.answered(call.id, 1);
        assert_eq!(
            a.release(r1).len(),
            HELD_PER_PRINCIPAL,
            "the newest, bounded"
        );
        assert!(a.release(r1).is_empty());
        assert_eq!(a.check_invariants(4), Ok(()));
    }
}
