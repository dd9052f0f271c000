//! Session keys (BFT-PR §4.1): NEW-KEY messages, the key holder, and the key table that
//! authenticates frames with keys each receiver chose.
//!
//! Every principal has long-term public keys in the cluster [`Directory`] (the papers'
//! read-only memory) and a [`KeyHolder`] (the papers' secure co-processor): the only component
//! that holds its private signing and opening keys and a counter that never goes backwards.
//! Session keys are drawn by the key holder, sealed to each recipient's public key, and sent in
//! a NEW-KEY signed by the key holder with its counter. A receiver's own key holder admits a
//! NEW-KEY (checks its signature against the directory, its counter against the last one it
//! admitted from that sender, records the counter in its non-volatile memory and only then
//! opens the key), so a NEW-KEY recorded by an attacker is refused after any restart or
//! recovery of the receiver, however its journal was tampered with.
//!
//! Keys between replicas are directional: replica `i` chooses the key `k(j→i)` each peer `j`
//! uses to send to it, so after `i` sends a NEW-KEY nothing authenticated with the old keys
//! (which an attacker who controlled `i` may know) is accepted by `i` any more. A client
//! chooses one key per replica, used in both directions; replicas discard client keys that are
//! not refreshed within `client_key_lifetime_ms`.
//!
//! The key holder is called synchronously. In the simulator it is in-process ([`LocalHolder`]);
//! in a deployment the node connects it to a separate key-holder process over a local socket.

use crate::auth::{Auth, StaticKeys};
use crate::types::{ClientId, Principal, ReplicaId};
use redoubt_crypto::body::{self, BodyKey, ExecutorSecret, ENC_LEN};
use redoubt_crypto::pk::{self, HolderSecrets, PublicKeys, SealPublicKey, Signature};
use redoubt_crypto::{Digest, DigestBuilder, Mac, MacKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The public keys of every principal of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Directory {
    pub keys: BTreeMap<Principal, PublicKeys>,
    /// The executors' public key that clients seal request bodies to (see
    /// `redoubt_crypto::body`); `None` in a cluster without confidential bodies.
    pub executors: Option<SealPublicKey>,
}

impl Directory {
    pub fn get(&self, p: Principal) -> Option<&PublicKeys> {
        self.keys.get(&p)
    }
}

/// What a key holder signs. The purpose is part of the signed statement, so a signature made
/// for one purpose can never pass as another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Purpose {
    NewKey,
    Recovery,
    /// A client request (see `message::RequestSig`).
    Request,
    /// An execution node's checkpoint vote (see `message::SignedVote`).
    Checkpoint,
}

/// The statement a key holder signs: purpose, principal, counter and a digest of the content.
pub fn holder_statement(
    purpose: Purpose,
    who: Principal,
    counter: u64,
    content: &Digest,
) -> Digest {
    let who = postcard::to_stdvec(&who).expect("principal encodes");
    DigestBuilder::new("redoubt.holder.v1")
        .u64(purpose as u64)
        .bytes(&who)
        .u64(counter)
        .digest(content)
        .finish()
}

/// Why the key holder could not do what was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HolderError {
    #[error("key holder unreachable: {0}")]
    Unreachable(String),
    #[error("key holder refused: {0}")]
    Refused(String),
}

/// What a key holder made of a NEW-KEY (see [`KeyHolder::admit`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Admitted {
    /// Admitted: the key sealed to the holder's principal, released after the counter was
    /// recorded.
    Key(MacKey),
    /// Its counter is not fresh (see [`admits`]): a replay.
    Stale,
    /// Its signature does not verify under the sender's public key.
    BadSignature,
    /// The sender is not in the directory (or is the holder's own principal).
    UnknownSender,
    /// It carries no key for the holder's principal, or that key does not open.
    NoKey,
}

/// The freshness rule a key holder admits NEW-KEYs by, given the last counter it admitted from
/// the sender. A client's counter must exceed it. A replica's may equal it: a replica sends its
/// latest NEW-KEY again to peers that lost their keys (they restarted), and that NEW-KEY carries
/// only keys for sending *to* that replica, which it still accepts; an older one is refused.
pub fn admits(from: Principal, last: Option<u64>, counter: u64) -> bool {
    match (from, last) {
        (_, None) => true,
        (Principal::Client(_), Some(last)) => counter > last,
        (Principal::Replica(_) | Principal::Executor(_), Some(last)) => counter >= last,
        // Filters hold no session keys (their messages authenticate themselves).
        (Principal::Filter(_), Some(_)) => false,
    }
}

/// Admits `nk` for the key holder of `me`: checks the sender, the signature (against
/// `directory`) and the counter (against `admitted`, the holder's non-volatile record of the
/// last counter admitted per principal), opens the key sealed to `me`, then has `persist` make
/// the updated record durable before recording it in `admitted` and releasing the key. Only
/// principals of the directory enter the record, so it never outgrows the directory.
pub fn admit_new_key(
    me: Principal,
    secrets: &HolderSecrets,
    directory: &Directory,
    admitted: &mut BTreeMap<Principal, u64>,
    nk: &NewKey,
    persist: impl FnOnce(&BTreeMap<Principal, u64>) -> Result<(), HolderError>,
) -> Result<Admitted, HolderError> {
    let Some(pubkeys) = directory.get(nk.from) else {
        return Ok(Admitted::UnknownSender);
    };
    if nk.from == me {
        return Ok(Admitted::UnknownSender);
    }
    let content = NewKey::content_digest(nk.from, &nk.keys);
    let st = holder_statement(Purpose::NewKey, nk.from, nk.counter, &content);
    if !pk::verify(&pubkeys.verify, &st.0, &nk.sig) {
        return Ok(Admitted::BadSignature);
    }
    let last = admitted.get(&nk.from).copied();
    if !admits(nk.from, last, nk.counter) {
        return Ok(Admitted::Stale);
    }
    let Some((_, sealed)) = nk.keys.iter().find(|(p, _)| *p == me) else {
        return Ok(Admitted::NoKey);
    };
    let Some(key) = secrets.open_key(&seal_info(nk.from, me), sealed) else {
        return Ok(Admitted::NoKey);
    };
    if last != Some(nk.counter) {
        let mut next = admitted.clone();
        next.insert(nk.from, nk.counter);
        persist(&next)?;
        *admitted = next;
    }
    Ok(Admitted::Key(MacKey(key)))
}

/// The papers' secure co-processor: holds a principal's private keys, a monotonic counter and
/// the last NEW-KEY counter it admitted from each principal. It signs NEW-KEY messages and
/// recovery requests (appending the next counter value), draws fresh session keys, seals them
/// to public keys and admits NEW-KEYs (the only way a key sealed to its principal is opened).
pub trait KeyHolder: Send {
    fn principal(&self) -> Principal;
    /// Signs `content` for `purpose` with the next counter value, returned with the signature.
    fn sign(&mut self, purpose: Purpose, content: &Digest)
        -> Result<(u64, Signature), HolderError>;
    /// A fresh random session key.
    fn fresh_key(&mut self) -> Result<MacKey, HolderError>;
    /// Seals `key` to `to` under the context `info`.
    fn seal(
        &mut self,
        to: &SealPublicKey,
        info: &[u8],
        key: &MacKey,
    ) -> Result<Vec<u8>, HolderError>;
    /// Admits a NEW-KEY (see [`admit_new_key`]): verifies its signature against the sender's
    /// public key in the holder's directory and its counter against the last one admitted from
    /// the sender ([`admits`]), records the counter durably, then opens the key sealed to this
    /// principal.
    fn admit(&mut self, nk: &NewKey) -> Result<Admitted, HolderError>;
    /// Opens a client session's body key from its encapsulation `enc` with the executors'
    /// secret (`info` names the client, see [`body_info`]). `Ok(None)`: `enc` does not open,
    /// which every holder of the secret agrees on. An error: this holder has no executors'
    /// secret, or could not be reached.
    fn open_body(
        &mut self,
        info: &[u8],
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError>;
}

/// The HPKE context of a body session of `client` (binds the session to the client).
pub fn body_info(client: ClientId) -> Vec<u8> {
    let mut v = b"redoubt body session v1 client ".to_vec();
    v.extend_from_slice(&client.to_le_bytes());
    v
}

/// The HPKE context of a state session of replica `r` (binds the session to the replica).
pub fn state_info(r: ReplicaId) -> Vec<u8> {
    let mut v = b"redoubt state session v1 replica ".to_vec();
    v.extend_from_slice(&r.to_le_bytes());
    v
}

/// The HPKE context of a state session of `p`, a replica or an execution node; `None` for a
/// client (clients fetch no state).
pub fn state_info_of(p: Principal) -> Option<Vec<u8>> {
    match p {
        Principal::Replica(r) => Some(state_info(r)),
        Principal::Executor(e) => {
            let mut v = b"redoubt state session v1 executor ".to_vec();
            v.extend_from_slice(&e.to_le_bytes());
            Some(v)
        }
        Principal::Client(_) | Principal::Filter(_) => None,
    }
}

/// Opens `enc` with an optional executors' secret (the shared part of every key holder).
pub fn open_body_with(
    secret: Option<&ExecutorSecret>,
    info: &[u8],
    enc: &[u8; ENC_LEN],
) -> Result<Option<BodyKey>, HolderError> {
    match secret {
        Some(s) => Ok(s.open(info, enc)),
        None => Err(HolderError::Refused(
            "this key holder holds no executors' secret (confidential bodies need one on \
             every replica)"
                .into(),
        )),
    }
}

/// The last NEW-KEY counter a key holder admitted from each principal: part of the
/// co-processor's non-volatile memory, shared with whoever keeps it across restarts.
pub type AdmittedCounters = Arc<Mutex<BTreeMap<Principal, u64>>>;

/// An in-process key holder: secrets in memory, randomness from a ChaCha generator seeded by
/// the host, and a counter and admitted NEW-KEY counters shared with whoever keeps them across
/// restarts (the simulator keeps one of each per principal, standing in for the co-processor's
/// non-volatile memory).
/// A key holder's counter is split in epochs: the high 32 bits count the holder's epochs, the
/// low 32 the signatures within one. A new epoch starts when the holder starts and whenever
/// the trusted monitor restarts its replica (a proactive recovery's reboot, or a crash): what
/// a replica had signed while an attacker held it is then of an earlier epoch than anything
/// signed after the reboot. The recovery rule uses it (second review, G8): a recovery request
/// of a later epoch than the replica's last accepted one is executed even within
/// `recovery_interval_min_ms`, so a request signed in advance by an attacker cannot veto the
/// re-keying of the real recovery.
pub const EPOCH_SHIFT: u32 = 32;

/// The epoch a key-holder counter value belongs to.
pub fn epoch_of(counter: u64) -> u64 {
    counter >> EPOCH_SHIFT
}

/// The counter value a new epoch starts from, after `counter`: its first signature gets the
/// next value.
pub fn next_epoch(counter: u64) -> u64 {
    (epoch_of(counter) + 1) << EPOCH_SHIFT
}

pub struct LocalHolder {
    who: Principal,
    secrets: HolderSecrets,
    directory: Arc<Directory>,
    counter: Arc<AtomicU64>,
    admitted: AdmittedCounters,
    rng: blake3::OutputReader,
    /// The executors' secret, on replicas of a cluster with confidential bodies.
    executor: Option<ExecutorSecret>,
    /// Mutant `no-freshness`: the admitted counters live only as long as this holder.
    #[cfg(feature = "mutants")]
    pub forgetful: bool,
    #[cfg(feature = "mutants")]
    own: BTreeMap<Principal, u64>,
}

impl LocalHolder {
    pub fn new(
        who: Principal,
        secrets: HolderSecrets,
        directory: Arc<Directory>,
        counter: Arc<AtomicU64>,
        admitted: AdmittedCounters,
        seed: [u8; 32],
    ) -> Self {
        let mut h = blake3::Hasher::new_derive_key("redoubt 2026 local holder rng v1");
        h.update(&seed);
        // A new holder is a restart: a new epoch of the counter.
        let c = counter.load(Ordering::SeqCst);
        counter.store(next_epoch(c), Ordering::SeqCst);
        LocalHolder {
            who,
            secrets,
            directory,
            counter,
            admitted,
            rng: h.finalize_xof(),
            executor: None,
            #[cfg(feature = "mutants")]
            forgetful: false,
            #[cfg(feature = "mutants")]
            own: BTreeMap::new(),
        }
    }

    /// Gives this holder the executors' secret (it opens clients' body sessions).
    pub fn with_executor(mut self, secret: ExecutorSecret) -> Self {
        self.executor = Some(secret);
        self
    }

    fn random(&mut self) -> [u8; 32] {
        let mut out = [0; 32];
        self.rng.fill(&mut out);
        out
    }
}

impl KeyHolder for LocalHolder {
    fn principal(&self) -> Principal {
        self.who
    }
    fn sign(
        &mut self,
        purpose: Purpose,
        content: &Digest,
    ) -> Result<(u64, Signature), HolderError> {
        let counter = self.counter.fetch_add(1, Ordering::SeqCst) + 1;
        let st = holder_statement(purpose, self.who, counter, content);
        Ok((counter, self.secrets.sign(&st.0)))
    }
    fn fresh_key(&mut self) -> Result<MacKey, HolderError> {
        Ok(MacKey(self.random()))
    }
    fn seal(
        &mut self,
        to: &SealPublicKey,
        info: &[u8],
        key: &MacKey,
    ) -> Result<Vec<u8>, HolderError> {
        let seed = self.random();
        Ok(pk::seal_key(to, info, &key.0, seed))
    }
    fn admit(&mut self, nk: &NewKey) -> Result<Admitted, HolderError> {
        // The shared map is the non-volatile memory itself: nothing more to persist.
        let mut admitted = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(feature = "mutants")]
        if self.forgetful {
            // Mutant no-freshness: only this incarnation's counters count.
            let mut own = self.own.clone();
            let r = admit_new_key(
                self.who,
                &self.secrets,
                &self.directory,
                &mut own,
                nk,
                |_| Ok(()),
            );
            self.own = own;
            return r;
        }
        admit_new_key(
            self.who,
            &self.secrets,
            &self.directory,
            &mut admitted,
            nk,
            |_| Ok(()),
        )
    }
    fn open_body(
        &mut self,
        info: &[u8],
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        open_body_with(self.executor.as_ref(), info, enc)
    }
}

/// NEW-KEY: fresh keys for each recipient, sealed to it, signed by the sender's key holder
/// with its counter.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewKey {
    pub from: Principal,
    pub counter: u64,
    pub keys: Vec<(Principal, Vec<u8>)>,
    pub sig: Signature,
}

impl std::fmt::Debug for NewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NewKey({} t{} {} keys)",
            self.from,
            self.counter,
            self.keys.len()
        )
    }
}

impl NewKey {
    /// Digest of the content the signature covers (sender and sealed keys; the counter is in
    /// the holder statement).
    /// What identifies this NEW-KEY: its sender, counter, content and signature.
    pub fn fingerprint(&self) -> Digest {
        let mut b = DigestBuilder::new("redoubt.new-key.fingerprint.v1");
        b.digest(&Self::content_digest(self.from, &self.keys))
            .u64(self.counter)
            .bytes(&self.sig.0);
        b.finish()
    }

    pub fn content_digest(from: Principal, keys: &[(Principal, Vec<u8>)]) -> Digest {
        let mut b = DigestBuilder::new("redoubt.new-key.v1");
        b.bytes(&postcard::to_stdvec(&from).expect("encodes"));
        b.u64(keys.len() as u64);
        for (p, sealed) in keys {
            b.bytes(&postcard::to_stdvec(p).expect("encodes"));
            b.bytes(sealed);
        }
        b.finish()
    }
}

/// The sealing context of a key from `from` to `to`.
fn seal_info(from: Principal, to: Principal) -> Vec<u8> {
    let mut v = b"redoubt new-key v1".to_vec();
    v.extend_from_slice(&postcard::to_stdvec(&(from, to)).expect("encodes"));
    v
}

/// Why a NEW-KEY was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewKeyError {
    UnknownSender,
    BadSignature,
    /// The counter is not fresh for our key holder (a replay; see [`admits`]).
    Stale,
    /// No key for us in it, or ours does not open.
    NoKey,
    /// The key holder could not be reached.
    Holder,
}

/// What an accepted NEW-KEY changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// A replica's new key for us to send to it.
    Replica(ReplicaId),
    /// A client's new key (both directions).
    Client(ClientId),
    /// An execution node's new key for us to send to it.
    Executor(crate::types::ExecutorId),
    /// A replica's or execution node's NEW-KEY with the counter we last accepted from it,
    /// whose key we still hold: a retransmission or a replay. Nothing changed, so nothing
    /// received from it under that key is to be forgotten (review G3: replays of a replica's
    /// latest NEW-KEY erased its view-change messages), and the key holder was not asked.
    Again(Principal),
}

/// Session keys of one principal, with its key holder. Clones share the key holder.
#[derive(Clone)]
pub struct SessionKeys {
    me: Principal,
    holder: Arc<Mutex<Box<dyn KeyHolder>>>,
    directory: Arc<Directory>,
    /// Key `peer → me` (chosen by me; for clients, chosen by the client).
    inbound: BTreeMap<Principal, MacKey>,
    /// Key `me → peer` (chosen by the peer).
    outbound: BTreeMap<Principal, MacKey>,
    /// When each client last refreshed its key (host clock, ms).
    client_refreshed: BTreeMap<ClientId, u64>,
    /// Our latest NEW-KEY, resent to peers that cannot authenticate us.
    latest: Option<NewKey>,
    /// The counter and fingerprint of the last NEW-KEY we accepted from each principal (in
    /// this life; the key holder's record, which survives restarts, is never below it):
    /// older and repeated ones are answered without a key-holder call. Bounded by the
    /// directory.
    accepted_counters: BTreeMap<Principal, (u64, Digest)>,
    /// Key refreshes sent.
    pub refreshes: u64,
    /// Changes to the key tables (a cheap way for observers to notice new keys).
    generation: u64,
    /// Mutant `accept-retired-keys`: inbound keys replaced by a refresh keep verifying.
    #[cfg(feature = "mutants")]
    pub accept_retired: bool,
    /// Mutant `forget-on-replay`: a NEW-KEY seen again goes to the key holder and counts as
    /// a re-key (as before the second review's G3).
    #[cfg(feature = "mutants")]
    pub forget_on_replay: bool,
    #[cfg(feature = "mutants")]
    retired: BTreeMap<Principal, MacKey>,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKeys({}, {} peers)", self.me, self.inbound.len())
    }
}

/// A copy of a principal's key tables, as an attacker who controlled it would have them.
#[derive(Clone, Debug, Default)]
pub struct StolenKeys {
    pub inbound: BTreeMap<Principal, MacKey>,
    pub outbound: BTreeMap<Principal, MacKey>,
}

impl SessionKeys {
    pub fn new(holder: Box<dyn KeyHolder>, directory: Arc<Directory>) -> Self {
        SessionKeys {
            me: holder.principal(),
            holder: Arc::new(Mutex::new(holder)),
            directory,
            inbound: BTreeMap::new(),
            outbound: BTreeMap::new(),
            client_refreshed: BTreeMap::new(),
            latest: None,
            accepted_counters: BTreeMap::new(),
            refreshes: 0,
            generation: 0,
            #[cfg(feature = "mutants")]
            accept_retired: false,
            #[cfg(feature = "mutants")]
            forget_on_replay: false,
            #[cfg(feature = "mutants")]
            retired: BTreeMap::new(),
        }
    }

    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// A session with the executors under the context `info`: an encapsulation of fresh
    /// randomness from the key holder (mixed with `entropy`) to the executors' public key.
    fn start_session(&self, info: &[u8], entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        let public = self.directory.executors?;
        let mut ikm = self.with_holder(|h| h.fresh_key()).ok()?.0;
        for (b, e) in ikm.iter_mut().zip(entropy.to_le_bytes()) {
            *b ^= e;
        }
        body::establish(&public, info, ikm)
    }

    /// Runs `f` with the key holder.
    pub fn with_holder<T>(&self, f: impl FnOnce(&mut dyn KeyHolder) -> T) -> T {
        let mut h = self.holder.lock().unwrap_or_else(|e| e.into_inner());
        f(h.as_mut())
    }

    /// Our latest NEW-KEY, if we sent one.
    pub fn latest(&self) -> Option<&NewKey> {
        self.latest.as_ref()
    }

    /// Draws fresh keys for `recipients`, installs them, and returns the signed NEW-KEY.
    /// Keys for replicas become our inbound keys; a client's keys serve both directions.
    pub fn refresh(&mut self, recipients: &[Principal]) -> Result<NewKey, HolderError> {
        let mut sealed = Vec::with_capacity(recipients.len());
        let mut fresh = Vec::with_capacity(recipients.len());
        let me = self.me;
        let directory = self.directory.clone();
        let (counter, sig) = self.with_holder(|h| {
            for &p in recipients {
                let Some(pubkeys) = directory.get(p).copied() else {
                    continue;
                };
                let k = h.fresh_key()?;
                let s = h.seal(&pubkeys.seal, &seal_info(me, p), &k)?;
                sealed.push((p, s));
                fresh.push((p, k));
            }
            let content = NewKey::content_digest(me, &sealed);
            h.sign(Purpose::NewKey, &content)
        })?;
        let client_side = matches!(self.me, Principal::Client(_));
        for (p, k) in fresh {
            if client_side {
                self.outbound.insert(p, k.clone());
            }
            #[cfg_attr(not(feature = "mutants"), allow(unused_variables))]
            if let Some(old) = self.inbound.insert(p, k) {
                #[cfg(feature = "mutants")]
                if self.accept_retired {
                    self.retired.entry(p).or_insert(old);
                }
            }
        }
        let nk = NewKey {
            from: self.me,
            counter,
            keys: sealed,
            sig,
        };
        self.latest = Some(nk.clone());
        self.refreshes += 1;
        self.generation += 1;
        Ok(nk)
    }

    /// Checks and installs a NEW-KEY. `now_ms` dates a client's refresh. The checks are the
    /// key holder's ([`KeyHolder::admit`]): its record of admitted counters survives restarts
    /// and recoveries, so a NEW-KEY recorded earlier (by an attacker) is refused here even
    /// when this incarnation never saw a newer one.
    pub fn accept(&mut self, nk: &NewKey, now_ms: u64) -> Result<Accepted, NewKeyError> {
        if self.directory.get(nk.from).is_none() {
            return Err(NewKeyError::UnknownSender);
        }
        let print = nk.fingerprint();
        if let Some((last, last_print)) = self.accepted_counters.get(&nk.from).copied() {
            if !admits(nk.from, Some(last), nk.counter) {
                return Err(NewKeyError::Stale);
            }
            // The very NEW-KEY we installed, again.
            #[cfg(feature = "mutants")]
            let again = print == last_print && !self.forget_on_replay;
            #[cfg(not(feature = "mutants"))]
            let again = print == last_print;
            if again && self.outbound.contains_key(&nk.from) {
                return Ok(Accepted::Again(nk.from));
            }
        }
        let key = match self.with_holder(|h| h.admit(nk)) {
            Ok(Admitted::Key(k)) => k,
            Ok(Admitted::Stale) => return Err(NewKeyError::Stale),
            Ok(Admitted::BadSignature) => return Err(NewKeyError::BadSignature),
            Ok(Admitted::UnknownSender) => return Err(NewKeyError::UnknownSender),
            Ok(Admitted::NoKey) => return Err(NewKeyError::NoKey),
            Err(_) => return Err(NewKeyError::Holder),
        };
        self.generation += 1;
        self.accepted_counters.insert(nk.from, (nk.counter, print));
        match nk.from {
            Principal::Replica(r) => {
                self.outbound.insert(nk.from, key);
                Ok(Accepted::Replica(r))
            }
            Principal::Executor(e) => {
                self.outbound.insert(nk.from, key);
                Ok(Accepted::Executor(e))
            }
            Principal::Filter(_) => Err(NewKeyError::UnknownSender),
            Principal::Client(c) => {
                self.outbound.insert(nk.from, key.clone());
                self.inbound.insert(nk.from, key);
                self.client_refreshed.insert(c, now_ms);
                Ok(Accepted::Client(c))
            }
        }
    }

    /// Forgets every client key (at recovery: an attacker may know them).
    pub fn discard_client_keys(&mut self) {
        self.inbound
            .retain(|p, _| matches!(p, Principal::Replica(_)));
        self.outbound
            .retain(|p, _| matches!(p, Principal::Replica(_)));
        self.client_refreshed.clear();
        self.generation += 1;
    }

    /// Forgets the keys of clients that did not refresh within `lifetime_ms`; returns how many.
    pub fn expire_clients(&mut self, now_ms: u64, lifetime_ms: u64) -> usize {
        let old: Vec<ClientId> = self
            .client_refreshed
            .iter()
            .filter(|(_, t)| now_ms.saturating_sub(**t) > lifetime_ms)
            .map(|(c, _)| *c)
            .collect();
        if !old.is_empty() {
            self.generation += 1;
        }
        for c in &old {
            self.client_refreshed.remove(c);
            self.inbound.remove(&Principal::Client(*c));
            self.outbound.remove(&Principal::Client(*c));
        }
        old.len()
    }

    /// Increases whenever the key tables change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether we can send to `p` (we have a key it chose).
    pub fn can_send(&self, p: Principal) -> bool {
        self.outbound.contains_key(&p)
    }

    /// A copy of the key tables (the simulator's attacker takes one when it compromises a node).
    pub fn steal(&self) -> StolenKeys {
        StolenKeys {
            inbound: self.inbound.clone(),
            outbound: self.outbound.clone(),
        }
    }
}

impl Auth for SessionKeys {
    fn me(&self) -> Principal {
        self.me
    }
    fn mac_to(&self, to: Principal, digest: &Digest) -> Option<Mac> {
        self.outbound.get(&to).map(|k| k.mac(digest))
    }
    fn verify_from(&self, from: Principal, _epoch: u32, digest: &Digest, mac: &Mac) -> bool {
        #[cfg(feature = "mutants")]
        if self
            .retired
            .get(&from)
            .is_some_and(|k| k.verify(digest, mac))
        {
            return true;
        }
        self.inbound
            .get(&from)
            .is_some_and(|k| k.verify(digest, mac))
    }
    fn knows(&self, from: Principal) -> bool {
        self.directory.keys.contains_key(&from)
    }
}

/// A key table a replica or client runs on: an [`Auth`] that may hold session keys refreshed
/// by NEW-KEY (static keys hold none).
pub trait KeyTable: Auth {
    /// The session-key table, when keys are refreshed by NEW-KEY.
    fn session(&mut self) -> Option<&mut SessionKeys> {
        None
    }
    fn session_ref(&self) -> Option<&SessionKeys> {
        None
    }
    /// Client side: starts a body session with the executors (see `redoubt_crypto::body`):
    /// the encapsulation to send and the session's key. `entropy` is mixed into the key
    /// holder's randomness. `None`: no executors' public key is known, or the key holder
    /// failed.
    fn start_body_session(&mut self, entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)>;
    /// Executor side: the body key of `client`'s session `enc` (see
    /// [`KeyHolder::open_body`]).
    fn open_body_key(
        &mut self,
        client: ClientId,
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError>;
    /// Replica side: starts a state session with the executors (the key state-transfer
    /// answers to this replica are sealed under), like [`KeyTable::start_body_session`].
    fn start_state_session(&mut self, entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)>;
    /// The key of `p`'s state session `enc`, `p` a replica or an execution node (see
    /// [`KeyHolder::open_body`]).
    fn open_state_key(
        &mut self,
        p: Principal,
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError>;
}

impl KeyTable for StaticKeys {
    fn start_body_session(&mut self, entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        let Principal::Client(c) = self.me() else {
            return None;
        };
        let (public, ikm) = self.body_session_material(entropy)?;
        body::establish(&public, &body_info(c), ikm)
    }
    fn open_body_key(
        &mut self,
        client: ClientId,
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        open_body_with(self.executor_secret(), &body_info(client), enc)
    }
    fn start_state_session(&mut self, entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        let info = state_info_of(self.me())?;
        let (public, ikm) = self.body_session_material(entropy)?;
        body::establish(&public, &info, ikm)
    }
    fn open_state_key(
        &mut self,
        p: Principal,
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        let info = state_info_of(p)
            .ok_or_else(|| HolderError::Refused("clients fetch no state".into()))?;
        open_body_with(self.executor_secret(), &info, enc)
    }
}

impl KeyTable for SessionKeys {
    fn session(&mut self) -> Option<&mut SessionKeys> {
        Some(self)
    }
    fn session_ref(&self) -> Option<&SessionKeys> {
        Some(self)
    }
    fn start_body_session(&mut self, entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        let Principal::Client(c) = self.me else {
            return None;
        };
        self.start_session(&body_info(c), entropy)
    }
    fn open_body_key(
        &mut self,
        client: ClientId,
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        self.with_holder(|h| h.open_body(&body_info(client), enc))
    }
    fn start_state_session(&mut self, entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        let info = state_info_of(self.me)?;
        self.start_session(&info, entropy)
    }
    fn open_state_key(
        &mut self,
        p: Principal,
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        let info = state_info_of(p)
            .ok_or_else(|| HolderError::Refused("clients fetch no state".into()))?;
        self.with_holder(|h| h.open_body(&info, enc))
    }
}

/// The keys a node authenticates with: static pairwise keys (tests, benchmarks without key
/// refresh) or session keys refreshed by NEW-KEY.
// One value per node, never moved on a hot path: the size difference costs nothing, a box
// would cost an indirection on every MAC.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Keys {
    Static(StaticKeys),
    Session(SessionKeys),
}

impl Auth for Keys {
    fn me(&self) -> Principal {
        match self {
            Keys::Static(k) => k.me(),
            Keys::Session(k) => k.me(),
        }
    }
    fn mac_to(&self, to: Principal, digest: &Digest) -> Option<Mac> {
        match self {
            Keys::Static(k) => k.mac_to(to, digest),
            Keys::Session(k) => k.mac_to(to, digest),
        }
    }
    fn verify_from(&self, from: Principal, epoch: u32, digest: &Digest, mac: &Mac) -> bool {
        match self {
            Keys::Static(k) => k.verify_from(from, epoch, digest, mac),
            Keys::Session(k) => k.verify_from(from, epoch, digest, mac),
        }
    }
    fn knows(&self, from: Principal) -> bool {
        match self {
            Keys::Static(k) => k.knows(from),
            Keys::Session(k) => k.knows(from),
        }
    }
}

impl KeyTable for Keys {
    fn session(&mut self) -> Option<&mut SessionKeys> {
        match self {
            Keys::Static(_) => None,
            Keys::Session(k) => Some(k),
        }
    }
    fn session_ref(&self) -> Option<&SessionKeys> {
        match self {
            Keys::Static(_) => None,
            Keys::Session(k) => Some(k),
        }
    }
    fn start_body_session(&mut self, entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        match self {
            Keys::Static(k) => k.start_body_session(entropy),
            Keys::Session(k) => k.start_body_session(entropy),
        }
    }
    fn open_body_key(
        &mut self,
        client: ClientId,
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        match self {
            Keys::Static(k) => k.open_body_key(client, enc),
            Keys::Session(k) => k.open_body_key(client, enc),
        }
    }
    fn start_state_session(&mut self, entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        match self {
            Keys::Static(k) => k.start_state_session(entropy),
            Keys::Session(k) => k.start_state_session(entropy),
        }
    }
    fn open_state_key(
        &mut self,
        p: Principal,
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        match self {
            Keys::Static(k) => k.open_state_key(p, enc),
            Keys::Session(k) => k.open_state_key(p, enc),
        }
    }
}

/// Stolen keys used as an [`Auth`]: what the simulator's attacker forges with.
pub struct Forger {
    pub me: Principal,
    pub keys: StolenKeys,
}

impl Auth for Forger {
    fn me(&self) -> Principal {
        self.me
    }
    fn mac_to(&self, to: Principal, digest: &Digest) -> Option<Mac> {
        self.keys.outbound.get(&to).map(|k| k.mac(digest))
    }
    fn verify_from(&self, from: Principal, _epoch: u32, digest: &Digest, mac: &Mac) -> bool {
        self.keys
            .inbound
            .get(&from)
            .is_some_and(|k| k.verify(digest, mac))
    }
    fn knows(&self, _from: Principal) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
