//! The key table a node authenticates with, behind a trait ([`Auth`]), with an implementation
//! over static pairwise keys; session keys refreshed by NEW-KEY are [`crate::keys`], frames
//! sealed and opened with either are [`crate::seal`].
//!
//! Keys are directional: `k(i→j)` authenticates what `i` sends to `j`. The key epoch in each
//! frame lets an implementation reject MACs from stale epochs.

use crate::types::Principal;
use redoubt_crypto::body::ExecutorSecret;
use redoubt_crypto::pk::SealPublicKey;
use redoubt_crypto::{Digest, Mac, MacKey};
use std::collections::BTreeMap;

/// What a node uses to authenticate what it sends and verify what it receives.
pub trait Auth {
    /// The principal this key table belongs to.
    fn me(&self) -> Principal;
    /// Current epoch of the keys this node sends with.
    fn send_epoch(&self) -> u32 {
        0
    }
    /// MAC for a message to `to`, or `None` when `to` is unknown.
    fn mac_to(&self, to: Principal, digest: &Digest) -> Option<Mac>;
    /// Verifies a MAC received from `from` under the sender's key epoch `epoch`.
    fn verify_from(&self, from: Principal, epoch: u32, digest: &Digest, mac: &Mac) -> bool;
    /// Whether `from` is a principal this node has keys for.
    fn knows(&self, from: Principal) -> bool;
}

/// Static directional pairwise keys.
#[derive(Clone, Debug)]
pub struct StaticKeys {
    me: Principal,
    /// peer -> (key for me→peer, key for peer→me)
    keys: BTreeMap<Principal, (MacKey, MacKey)>,
    /// Confidential bodies: the executors' public key, their secret (on an executor), and
    /// secret material a client draws its sessions' randomness from.
    body: Option<StaticBody>,
}

#[derive(Clone, Debug)]
struct StaticBody {
    public: SealPublicKey,
    secret: Option<ExecutorSecret>,
    material: MacKey,
    sessions: u64,
}

const PAIRWISE_CONTEXT: &str = "redoubt 2026 static pairwise mac key v1";

/// Derives the key `from → to` from a cluster master secret. Used by tests, the simulator, and
/// `redoubt init` (which keeps the master secret out of every replica's key file).
pub fn pairwise_key(master: &[u8], from: Principal, to: Principal) -> MacKey {
    let mut material = master.to_vec();
    material.extend_from_slice(&postcard::to_stdvec(&(from, to)).expect("encodes"));
    MacKey::derive(PAIRWISE_CONTEXT, &material)
}

impl StaticKeys {
    /// Keys of `me` with every peer, derived from a master secret.
    pub fn derive(
        master: &[u8],
        me: Principal,
        peers: impl IntoIterator<Item = Principal>,
    ) -> Self {
        let keys = peers
            .into_iter()
            .filter(|p| *p != me)
            .map(|p| {
                (
                    p,
                    (pairwise_key(master, me, p), pairwise_key(master, p, me)),
                )
            })
            .collect();
        StaticKeys {
            me,
            keys,
            body: None,
        }
    }

    /// Keys given explicitly: for each peer, `(key me→peer, key peer→me)`.
    pub fn from_table(me: Principal, keys: BTreeMap<Principal, (MacKey, MacKey)>) -> Self {
        StaticKeys {
            me,
            keys,
            body: None,
        }
    }

    /// Confidential bodies: the executors' public key, and their secret if this principal is
    /// an executor. A client draws its sessions' randomness from `material` (secret, its own).
    pub fn with_executors(
        mut self,
        public: SealPublicKey,
        secret: Option<ExecutorSecret>,
        material: MacKey,
    ) -> Self {
        self.body = Some(StaticBody {
            public,
            secret,
            material,
            sessions: 0,
        });
        self
    }

    /// The executors' public key and fresh session randomness (a function of this
    /// principal's secret material, a session counter and the host's `entropy`).
    pub(crate) fn body_session_material(
        &mut self,
        entropy: u64,
    ) -> Option<(SealPublicKey, [u8; 32])> {
        let b = self.body.as_mut()?;
        b.sessions += 1;
        let mut m = b.material.0.to_vec();
        m.extend_from_slice(&b.sessions.to_le_bytes());
        m.extend_from_slice(&entropy.to_le_bytes());
        Some((
            b.public,
            MacKey::derive("redoubt 2026 static body session v1", &m).0,
        ))
    }

    /// The executors' secret, if this principal holds it.
    pub(crate) fn executor_secret(&self) -> Option<&ExecutorSecret> {
        self.body.as_ref()?.secret.as_ref()
    }

    pub fn peers(&self) -> impl Iterator<Item = &Principal> {
        self.keys.keys()
    }
}

impl Auth for StaticKeys {
    fn me(&self) -> Principal {
        self.me
    }
    fn mac_to(&self, to: Principal, digest: &Digest) -> Option<Mac> {
        self.keys.get(&to).map(|(send, _)| send.mac(digest))
    }
    fn verify_from(&self, from: Principal, epoch: u32, digest: &Digest, mac: &Mac) -> bool {
        epoch == 0
            && self
                .keys
                .get(&from)
                .is_some_and(|(_, recv)| recv.verify(digest, mac))
    }
    fn knows(&self, from: Principal) -> bool {
        self.keys.contains_key(&from)
    }
}
