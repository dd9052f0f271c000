//! Session keys (BFT-PR §4.1): the key table that authenticates frames with keys each
//! receiver chose, and the NEW-KEYs that refresh it. The key holder (the papers' secure
//! co-processor), the directory of long-term public keys and the NEW-KEY message itself are
//! the `redoubt-keys` crate's, re-exported here.
//!
//! Session keys are drawn by the key holder, sealed to each recipient's public key, and sent in
//! a NEW-KEY signed by the key holder with its counter; the receiver's own key holder admits it
//! (see [`admit_new_key`]) before the key enters the table.
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
use crate::holder::{make_new_key, HolderRequest};
use crate::types::{ClientId, Principal, ReplicaId};
use redoubt_crypto::body::{self, BodyKey, ENC_LEN};
use redoubt_crypto::{Digest, Mac, MacKey};
pub use redoubt_keys::{
    admit_new_key, admits, body_info, epoch_of, holder_statement, next_epoch, open_body_with,
    seal_info, state_info, state_info_of, Admitted, AdmittedCounters, Directory, HolderError,
    KeyHolder, LocalHolder, NewKey, Purpose, EPOCH_SHIFT,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

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

/// What the checks of a NEW-KEY that need no key holder found (see [`SessionKeys::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The NEW-KEY installed from this principal, again: nothing to do.
    Again(Principal),
    /// Genuine and fresh here: the key holder is to admit it.
    Admit,
}

/// A key holder shared between a node's protocol state and the host thread that calls it.
pub type SharedHolder = Arc<Mutex<Box<dyn KeyHolder>>>;

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
    holder: SharedHolder,
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
        let ikm = self.with_holder(|h| h.fresh_key()).ok()?;
        self.establish(info, ikm, entropy)
    }

    /// A session with the executors under the context `info` from the key holder's fresh
    /// randomness `ikm` mixed with `entropy`.
    fn establish(
        &self,
        info: &[u8],
        ikm: MacKey,
        entropy: u64,
    ) -> Option<([u8; ENC_LEN], BodyKey)> {
        let public = self.directory.executors?;
        let mut ikm = ikm.0;
        for (b, e) in ikm.iter_mut().zip(entropy.to_le_bytes()) {
            *b ^= e;
        }
        body::establish(&public, info, ikm)
    }

    /// Our state session with the executors from the key holder's fresh randomness `ikm`
    /// (asked as an effect, see `crate::holder`) mixed with `entropy`.
    pub(crate) fn establish_state(
        &self,
        ikm: MacKey,
        entropy: u64,
    ) -> Option<([u8; ENC_LEN], BodyKey)> {
        self.establish(&state_info_of(self.me)?, ikm, entropy)
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

    /// Draws fresh keys for `recipients`, installs them, and returns the signed NEW-KEY,
    /// asking the key holder in the caller's thread (clients; replicas and execution nodes
    /// ask it through an effect, see `crate::holder`).
    pub fn refresh(&mut self, recipients: &[Principal]) -> Result<NewKey, HolderError> {
        let (me, recipients) = (self.me, self.sealing_keys(recipients));
        let (nk, fresh) = self.with_holder(|h| make_new_key(h, me, &recipients))?;
        self.install_refresh(nk.clone(), fresh);
        Ok(nk)
    }

    /// What to ask the key holder for a refresh of our keys for `recipients` (those of the
    /// directory).
    pub fn refresh_request(&self, recipients: &[Principal]) -> HolderRequest {
        HolderRequest::NewKey {
            from: self.me,
            recipients: self.sealing_keys(recipients),
        }
    }

    /// The public keys `recipients` (those of the directory) get their keys sealed to.
    fn sealing_keys(
        &self,
        recipients: &[Principal],
    ) -> Vec<(Principal, redoubt_crypto::pk::SealPublicKey)> {
        recipients
            .iter()
            .filter_map(|p| self.directory.get(*p).map(|k| (*p, k.seal)))
            .collect()
    }

    /// Installs the fresh keys of our NEW-KEY `nk` (the key holder's answer to a refresh):
    /// keys for replicas become our inbound keys; a client's keys serve both directions.
    pub fn install_refresh(&mut self, nk: NewKey, fresh: Vec<(Principal, MacKey)>) {
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
        self.latest = Some(nk);
        self.refreshes += 1;
        self.generation += 1;
    }

    /// Checks and installs a NEW-KEY, asking the key holder in the caller's thread (clients,
    /// whose key holder is in their process; replicas and execution nodes ask it through an
    /// effect, see `crate::holder`). `now_ms` dates a client's refresh.
    pub fn accept(&mut self, nk: &NewKey, now_ms: u64) -> Result<Accepted, NewKeyError> {
        match self.check(nk)? {
            Check::Again(p) => Ok(Accepted::Again(p)),
            Check::Admit => {
                let admitted = self.with_holder(|h| h.admit(nk));
                self.install(nk, admitted, now_ms)
            }
        }
    }

    /// The checks of a NEW-KEY that need no key holder: its sender is in the directory, its
    /// signature verifies, its counter is fresh against the last one this incarnation
    /// installed from the sender (see [`admits`]), and it is not the very NEW-KEY installed
    /// (whose key is still held). The key holder checks the signature and the counter again
    /// against its record, which survives restarts and recoveries.
    pub fn check(&self, nk: &NewKey) -> Result<Check, NewKeyError> {
        let Some(pubkeys) = self.directory.get(nk.from) else {
            return Err(NewKeyError::UnknownSender);
        };
        if let Some((last, _)) = self.accepted_counters.get(&nk.from).copied() {
            if !admits(nk.from, Some(last), nk.counter) {
                return Err(NewKeyError::Stale);
            }
            if self.installed_again(nk, &nk.fingerprint()) {
                return Ok(Check::Again(nk.from));
            }
        }
        let content = NewKey::content_digest(nk.from, &nk.keys);
        let st = holder_statement(Purpose::NewKey, nk.from, nk.counter, &content);
        if !redoubt_crypto::pk::verify(&pubkeys.verify, &st.0, &nk.sig) {
            return Err(NewKeyError::BadSignature);
        }
        Ok(Check::Admit)
    }

    /// Installs the key of `nk` as the key holder `admitted` it. An answer about a NEW-KEY
    /// older than one installed since it was asked (answers may come out of order) is stale
    /// and changes nothing. `now_ms` dates a client's refresh.
    pub fn install(
        &mut self,
        nk: &NewKey,
        admitted: Result<Admitted, HolderError>,
        now_ms: u64,
    ) -> Result<Accepted, NewKeyError> {
        let key = match admitted {
            Ok(Admitted::Key(k)) => k,
            Ok(Admitted::Stale) => return Err(NewKeyError::Stale),
            Ok(Admitted::BadSignature) => return Err(NewKeyError::BadSignature),
            Ok(Admitted::UnknownSender) => return Err(NewKeyError::UnknownSender),
            Ok(Admitted::NoKey) => return Err(NewKeyError::NoKey),
            Err(_) => return Err(NewKeyError::Holder),
        };
        let print = nk.fingerprint();
        if let Some((last, _)) = self.accepted_counters.get(&nk.from).copied() {
            if last > nk.counter {
                return Err(NewKeyError::Stale);
            }
            if self.installed_again(nk, &print) {
                return Ok(Accepted::Again(nk.from));
            }
        }
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

    /// Whether `nk` (fingerprint `print`) is the very NEW-KEY installed from its sender, whose
    /// key is still held.
    fn installed_again(&self, nk: &NewKey, print: &Digest) -> bool {
        #[cfg(feature = "mutants")]
        if self.forget_on_replay {
            return false;
        }
        self.accepted_counters
            .get(&nk.from)
            .is_some_and(|(_, last)| last == print)
            && self.outbound.contains_key(&nk.from)
    }

    /// The key holder, for a host to perform [`crate::holder::HolderCall`]s with off the
    /// protocol thread.
    pub fn holder(&self) -> SharedHolder {
        self.holder.clone()
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
    /// The principals' public keys that clients' request signatures (and recovery requests)
    /// are checked against: the session table's directory, where keys are refreshed by
    /// NEW-KEY; a table may also hold one without sessions (a wide-area site's global core,
    /// whose peers authenticate by site signature).
    fn directory(&self) -> Option<&redoubt_keys::Directory> {
        self.session_ref().map(|s| s.directory())
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

/// The HPKE context of `p`'s state session (see [`state_info_of`]); refused for principals
/// that fetch no state.
pub(crate) fn state_info_for(p: Principal) -> Result<Vec<u8>, HolderError> {
    state_info_of(p).ok_or_else(|| HolderError::Refused("clients fetch no state".into()))
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
        let info = state_info_for(p)?;
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
        let info = state_info_for(p)?;
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
