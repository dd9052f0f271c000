//! The key holder's side of redoubt's session keys (BFT-PR §4.1), on its own: principals, the
//! cluster [`Directory`] of long-term public keys, NEW-KEY messages, the statements a key
//! holder signs, its freshness rule for NEW-KEYs, and [`LocalHolder`], the in-process key
//! holder. The key-holder process links this crate and the crypto crate only, not the
//! protocol core; the core's session-key table (`redoubt_core::keys`) builds on it.
//!
//! Every principal has long-term public keys in the directory (the papers' read-only memory)
//! and a [`KeyHolder`] (the papers' secure co-processor): the only component that holds its
//! private signing and opening keys and a counter that never goes backwards. A receiver's own
//! key holder admits a NEW-KEY ([`admit_new_key`]: signature against the directory, counter
//! against the last one it admitted from that sender, the counter recorded durably before the
//! key is opened), so a NEW-KEY recorded by an attacker is refused after any restart or
//! recovery of the receiver, however its journal was tampered with.

use redoubt_crypto::body::{BodyKey, ExecutorSecret, ENC_LEN};
use redoubt_crypto::pk::{self, HolderSecrets, PublicKeys, SealPublicKey, Signature};
use redoubt_crypto::{Digest, DigestBuilder, MacKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Replica identifier in `0..n`.
pub type ReplicaId = u32;
/// Client identifier.
pub type ClientId = u64;
/// Execution node identifier in `0..executors` (separated deployment).
pub type ExecutorId = u32;
/// Filter node identifier of a privacy firewall: `row * (h+1) + column`, row 0 next to the
/// agreement nodes, row h next to the execution nodes.
pub type FilterId = u32;

/// A principal that can send authenticated messages.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Principal {
    Replica(ReplicaId),
    Client(ClientId),
    /// An execution node of a separated deployment.
    Executor(ExecutorId),
    /// A filter node of a privacy firewall.
    Filter(FilterId),
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Replica(r) => write!(f, "r{r}"),
            Principal::Client(c) => write!(f, "c{c}"),
            Principal::Executor(e) => write!(f, "e{e}"),
            Principal::Filter(x) => write!(f, "x{x}"),
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

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
pub fn seal_info(from: Principal, to: Principal) -> Vec<u8> {
    let mut v = b"redoubt new-key v1".to_vec();
    v.extend_from_slice(&postcard::to_stdvec(&(from, to)).expect("encodes"));
    v
}
