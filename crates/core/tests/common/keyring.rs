//! Key material for every principal of a test cluster: static pairwise keys derived from one
//! master secret, or session keys over per-principal key holders whose non-volatile memory
//! (counter, admitted NEW-KEY counters) survives restarts.

use redoubt_core::keys::{Admitted, HolderError, KeyHolder, NewKey, Purpose};
use redoubt_core::keys::{AdmittedCounters, LocalHolder};
use redoubt_core::*;
use redoubt_crypto::body::ExecutorSecret;
use redoubt_crypto::body::{BodyKey, ENC_LEN};
use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::pk::{SealPublicKey, Signature};
use redoubt_crypto::Digest;
use redoubt_crypto::MacKey;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The master secret static keys derive from.
pub const MASTER: &[u8] = b"m";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyMode {
    /// Static pairwise keys (no NEW-KEY).
    Static,
    /// Session keys: nodes exchange NEW-KEYs before they can talk.
    Session,
}

/// A key holder's non-volatile memory, which survives restarts of its principal.
#[derive(Clone, Default)]
pub struct HolderMemory {
    pub counter: Arc<AtomicU64>,
    pub admitted: AdmittedCounters,
}

pub struct Keyring {
    pub mode: KeyMode,
    /// Every principal: replicas `0..n`, then the clients.
    pub principals: Vec<Principal>,
    pub directory: Arc<Directory>,
    memory: BTreeMap<Principal, HolderMemory>,
    incarnations: BTreeMap<Principal, u32>,
}

/// The executors' secret (every replica holds it; clients know its public key).
pub fn executors() -> ExecutorSecret {
    ExecutorSecret::from_seed(&[0xE5; 32])
}

/// The long-term secrets of `p`'s key holder.
pub fn secrets(p: Principal) -> HolderSecrets {
    HolderSecrets::from_seed(&Digest::of(format!("secrets of {p:?}").as_bytes()).0)
}

impl Keyring {
    pub fn new(mode: KeyMode, n: u32, clients: impl IntoIterator<Item = ClientId>) -> Keyring {
        let principals: Vec<Principal> = (0..n)
            .map(Principal::Replica)
            .chain(clients.into_iter().map(Principal::Client))
            .collect();
        let directory = Arc::new(Directory {
            keys: principals
                .iter()
                .map(|p| (*p, secrets(*p).public()))
                .collect(),
            executors: Some(executors().public()),
        });
        Keyring {
            mode,
            principals,
            directory,
            memory: BTreeMap::new(),
            incarnations: BTreeMap::new(),
        }
    }

    /// The replicas, as principals.
    pub fn replicas(&self) -> Vec<Principal> {
        self.principals
            .iter()
            .copied()
            .filter(|p| matches!(p, Principal::Replica(_)))
            .collect()
    }

    /// The key holder memory of `p`.
    pub fn memory(&mut self, p: Principal) -> HolderMemory {
        self.memory.entry(p).or_default().clone()
    }

    /// A fresh key table for `p`: its static keys, or session keys (none exchanged yet) of a
    /// new incarnation of its key holder over the same memory.
    pub fn keys(&mut self, p: Principal) -> Keys {
        match self.mode {
            KeyMode::Static => Keys::Static(
                StaticKeys::derive(MASTER, p, self.principals.iter().copied()).with_executors(
                    executors().public(),
                    matches!(p, Principal::Replica(_)).then(executors),
                    MacKey::derive("test body sessions", format!("{p:?}").as_bytes()),
                ),
            ),
            KeyMode::Session => Keys::Session(self.session(p)),
        }
    }

    /// Session keys of a new incarnation of `p`'s key holder that fails every call opening a
    /// body session while `failing` is set.
    pub fn session_failing_bodies(
        &mut self,
        p: Principal,
        failing: Arc<AtomicBool>,
    ) -> SessionKeys {
        let inner = self.holder(p);
        SessionKeys::new(
            Box::new(FailingBodies { inner, failing }),
            self.directory.clone(),
        )
    }

    /// Session keys of a new incarnation of `p`'s key holder (whatever the mode).
    pub fn session(&mut self, p: Principal) -> SessionKeys {
        let holder = self.holder(p);
        SessionKeys::new(holder, self.directory.clone())
    }

    /// A new incarnation of `p`'s key holder over its memory.
    fn holder(&mut self, p: Principal) -> Box<dyn KeyHolder> {
        let incarnation = self.incarnations.entry(p).or_insert(0);
        *incarnation += 1;
        let seed = Digest::of(format!("holder of {p:?}, incarnation {incarnation}").as_bytes());
        let nv = self.memory(p);
        let mut holder = LocalHolder::new(
            p,
            secrets(p),
            self.directory.clone(),
            nv.counter,
            nv.admitted,
            seed.0,
        );
        if matches!(p, Principal::Replica(_)) {
            holder = holder.with_executor(executors());
        }
        Box::new(holder)
    }
}

/// A key holder whose calls opening body sessions fail while `failing` is set (unreachable),
/// the rest answered by `inner`.
struct FailingBodies {
    inner: Box<dyn KeyHolder>,
    failing: Arc<AtomicBool>,
}

impl KeyHolder for FailingBodies {
    fn principal(&self) -> Principal {
        self.inner.principal()
    }
    fn sign(
        &mut self,
        purpose: Purpose,
        content: &Digest,
    ) -> Result<(u64, Signature), HolderError> {
        self.inner.sign(purpose, content)
    }
    fn fresh_key(&mut self) -> Result<MacKey, HolderError> {
        self.inner.fresh_key()
    }
    fn seal(
        &mut self,
        to: &SealPublicKey,
        info: &[u8],
        key: &MacKey,
    ) -> Result<Vec<u8>, HolderError> {
        self.inner.seal(to, info, key)
    }
    fn admit(&mut self, nk: &NewKey) -> Result<Admitted, HolderError> {
        self.inner.admit(nk)
    }
    fn open_body(
        &mut self,
        info: &[u8],
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(HolderError::Unreachable("failing (test)".into()));
        }
        self.inner.open_body(info, enc)
    }
}
