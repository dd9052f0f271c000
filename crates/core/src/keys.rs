//! Session keys (BFT-PR §4.1): NEW-KEY messages, the key holder, and the key table that
//! authenticates frames with keys each receiver chose.
//!
//! Every principal has long-term public keys in the cluster [`Directory`] (the papers'
//! read-only memory) and a [`KeyHolder`] (the papers' secure co-processor): the only component
//! that holds its private signing and opening keys and a counter that never goes backwards.
//! Session keys are drawn by the key holder, sealed to each recipient's public key, and sent in
//! a NEW-KEY signed by the key holder with its counter; a receiver accepts a NEW-KEY only if its
//! counter exceeds the last one it accepted from that sender.
//!
//! Keys between replicas are directional: replica `i` chooses the key `k(j→i)` each peer `j`
//! uses to send to it, so after `i` sends a NEW-KEY nothing authenticated with the old keys
//! (which an attacker who controlled `i` may know) is accepted by `i` any more. A client
//! chooses one key per replica, used in both directions; replicas discard client keys that are
//! not refreshed within `client_key_lifetime_ms`.
//!
//! The key holder is called synchronously. In the simulator it is in-process ([`LocalHolder`]);
//! in a deployment the node connects it to a separate key-holder process over a local socket.

use crate::auth::Auth;
use crate::types::{ClientId, Principal, ReplicaId};
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

/// The papers' secure co-processor: holds a principal's private keys and a monotonic counter.
/// It signs NEW-KEY messages and recovery requests (appending the next counter value), draws
/// fresh session keys, seals them to public keys and opens keys sealed to its principal.
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
    /// Opens a key sealed to this principal; `None` if it does not open.
    fn open(&mut self, info: &[u8], sealed: &[u8]) -> Result<Option<MacKey>, HolderError>;
}

/// An in-process key holder: secrets in memory, randomness from a ChaCha generator seeded by
/// the host, and a counter shared with whoever keeps it across restarts (the simulator keeps
/// one per replica, standing in for the co-processor's non-volatile counter).
pub struct LocalHolder {
    who: Principal,
    secrets: HolderSecrets,
    counter: Arc<AtomicU64>,
    rng: blake3::OutputReader,
}

impl LocalHolder {
    pub fn new(
        who: Principal,
        secrets: HolderSecrets,
        counter: Arc<AtomicU64>,
        seed: [u8; 32],
    ) -> Self {
        let mut h = blake3::Hasher::new_derive_key("redoubt 2026 local holder rng v1");
        h.update(&seed);
        LocalHolder {
            who,
            secrets,
            counter,
            rng: h.finalize_xof(),
        }
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
    fn open(&mut self, info: &[u8], sealed: &[u8]) -> Result<Option<MacKey>, HolderError> {
        Ok(self.secrets.open_key(info, sealed).map(MacKey))
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
    /// The counter does not exceed the last accepted one (a replay).
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
    /// Counter of the last NEW-KEY accepted from each principal.
    last_counter: BTreeMap<Principal, u64>,
    /// When each client last refreshed its key (host clock, ms).
    client_refreshed: BTreeMap<ClientId, u64>,
    /// Our latest NEW-KEY, resent to peers that cannot authenticate us.
    latest: Option<NewKey>,
    /// Key refreshes sent.
    pub refreshes: u64,
    /// Changes to the key tables (a cheap way for observers to notice new keys).
    generation: u64,
    /// Mutant `accept-retired-keys`: inbound keys replaced by a refresh keep verifying.
    #[cfg(feature = "mutants")]
    pub accept_retired: bool,
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
            last_counter: BTreeMap::new(),
            client_refreshed: BTreeMap::new(),
            latest: None,
            refreshes: 0,
            generation: 0,
            #[cfg(feature = "mutants")]
            accept_retired: false,
            #[cfg(feature = "mutants")]
            retired: BTreeMap::new(),
        }
    }

    pub fn directory(&self) -> &Directory {
        &self.directory
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

    /// Checks and installs a NEW-KEY. `now_ms` dates a client's refresh.
    pub fn accept(&mut self, nk: &NewKey, now_ms: u64) -> Result<Accepted, NewKeyError> {
        let Some(pubkeys) = self.directory.get(nk.from).copied() else {
            return Err(NewKeyError::UnknownSender);
        };
        if nk.from == self.me {
            return Err(NewKeyError::UnknownSender);
        }
        let content = NewKey::content_digest(nk.from, &nk.keys);
        let st = holder_statement(Purpose::NewKey, nk.from, nk.counter, &content);
        if !pk::verify(&pubkeys.verify, &st.0, &nk.sig) {
            return Err(NewKeyError::BadSignature);
        }
        if nk.counter <= self.last_counter.get(&nk.from).copied().unwrap_or(0) {
            return Err(NewKeyError::Stale);
        }
        let Some((_, sealed)) = nk.keys.iter().find(|(p, _)| *p == self.me) else {
            return Err(NewKeyError::NoKey);
        };
        let info = seal_info(nk.from, self.me);
        let key = match self.with_holder(|h| h.open(&info, sealed)) {
            Ok(Some(k)) => k,
            Ok(None) => return Err(NewKeyError::NoKey),
            Err(_) => return Err(NewKeyError::Holder),
        };
        self.last_counter.insert(nk.from, nk.counter);
        self.generation += 1;
        match nk.from {
            Principal::Replica(r) => {
                self.outbound.insert(nk.from, key);
                Ok(Accepted::Replica(r))
            }
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
    fn session(&mut self) -> Option<&mut SessionKeys> {
        Some(self)
    }
    fn session_ref(&self) -> Option<&SessionKeys> {
        Some(self)
    }
}

/// The keys a node authenticates with: static pairwise keys (tests, benchmarks without key
/// refresh) or session keys refreshed by NEW-KEY.
// One value per node, never moved on a hot path: the size difference costs nothing, a box
// would cost an indirection on every MAC.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Keys {
    Static(crate::auth::StaticKeys),
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
mod tests {
    use super::*;

    fn setup(ps: &[Principal]) -> (Arc<Directory>, Vec<SessionKeys>) {
        let secrets: Vec<HolderSecrets> = ps
            .iter()
            .enumerate()
            .map(|(i, _)| HolderSecrets::from_seed(&[i as u8 + 1; 32]))
            .collect();
        let dir = Arc::new(Directory {
            keys: ps
                .iter()
                .zip(&secrets)
                .map(|(p, s)| (*p, s.public()))
                .collect(),
        });
        let keys = ps
            .iter()
            .zip(secrets)
            .enumerate()
            .map(|(i, (p, s))| {
                SessionKeys::new(
                    Box::new(LocalHolder::new(
                        *p,
                        s,
                        Arc::new(AtomicU64::new(0)),
                        [i as u8; 32],
                    )),
                    dir.clone(),
                )
            })
            .collect();
        (dir, keys)
    }

    #[test]
    fn new_key_installs_directional_keys_and_rejects_replays_and_forgeries() {
        let ps = [
            Principal::Replica(0),
            Principal::Replica(1),
            Principal::Client(5),
        ];
        let (_, mut ks) = setup(&ps);
        let nk0 = ks[0].refresh(&ps[1..2]).unwrap();
        assert_eq!(ks[1].accept(&nk0, 0), Ok(Accepted::Replica(0)));
        // 1 can now send to 0 and 0 verifies it.
        let d = Digest::of(b"m");
        let mac = ks[1].mac_to(ps[0], &d).unwrap();
        assert!(ks[0].verify_from(ps[1], 0, &d, &mac));
        // Replay refused.
        assert_eq!(ks[1].accept(&nk0, 0), Err(NewKeyError::Stale));
        // A tampered key list fails the signature.
        let mut bad = nk0.clone();
        bad.keys[0].1[5] ^= 1;
        assert_eq!(ks[1].accept(&bad, 0), Err(NewKeyError::BadSignature));
        // After 0 refreshes, 1's old key no longer verifies at 0 (freshness) until 1 accepts.
        let stolen = ks[1].steal();
        let nk0b = ks[0].refresh(&ps[1..2]).unwrap();
        let forger = Forger {
            me: ps[1],
            keys: stolen,
        };
        let old_mac = forger.mac_to(ps[0], &d).unwrap();
        assert!(!ks[0].verify_from(ps[1], 0, &d, &old_mac));
        ks[1].accept(&nk0b, 0).unwrap();
        let mac = ks[1].mac_to(ps[0], &d).unwrap();
        assert!(ks[0].verify_from(ps[1], 0, &d, &mac));
        // A client's key serves both directions and expires.
        let nkc = ks[2].refresh(&ps[..2]).unwrap();
        assert_eq!(ks[0].accept(&nkc, 100), Ok(Accepted::Client(5)));
        let mac = ks[2].mac_to(ps[0], &d).unwrap();
        assert!(ks[0].verify_from(ps[2], 0, &d, &mac));
        let back = ks[0].mac_to(ps[2], &d).unwrap();
        assert!(ks[2].verify_from(ps[0], 0, &d, &back));
        assert_eq!(ks[0].expire_clients(200, 1000), 0);
        assert_eq!(ks[0].expire_clients(2000, 1000), 1);
        assert!(!ks[0].verify_from(ps[2], 0, &d, &mac));
        // A NEW-KEY claiming another sender fails the signature.
        let mut spoof = nkc.clone();
        spoof.from = ps[1];
        assert_eq!(ks[0].accept(&spoof, 0), Err(NewKeyError::BadSignature));
    }
}
