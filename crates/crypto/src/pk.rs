//! Public-key operations of the key holder: Ed25519 signatures and HPKE sealing of session
//! keys (X25519, HKDF-SHA256, ChaCha20-Poly1305).
//!
//! Both wrap maintained crates (`ed25519-dalek`, `hpke`). Randomness is an explicit input
//! (a 32-byte seed for the sealing's ephemeral key), so the deterministic simulator can drive
//! them from its seeded generator and a deployment from the operating system's.

use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use rand_chacha::rand_core::SeedableRng;
use serde::{Deserialize, Serialize};
use std::fmt;

mod zip215;
pub use zip215::{verify_all_zip215, verify_zip215, Item};

/// An Ed25519 signature.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature(#[serde(with = "serde_bytes")] pub [u8; 64]);

impl Default for Signature {
    fn default() -> Self {
        Signature([0; 64])
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex: String = self.0[..4].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "sig:{hex}")
    }
}

/// An Ed25519 public (verifying) key.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, Debug)]
pub struct VerifyKey(pub [u8; 32]);

/// An X25519 public key that session keys are sealed to.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, Debug)]
pub struct SealPublicKey(pub [u8; 32]);

/// A principal's long-term secrets: the Ed25519 signing key and the X25519 opening key. Only
/// the key holder holds one.
#[derive(Clone, Serialize, Deserialize)]
pub struct HolderSecrets {
    sign: [u8; 32],
    open: [u8; 32],
    /// `sign` expanded, made at the first signature (expanding costs a fifth of one).
    #[serde(skip)]
    signer: std::sync::OnceLock<ed25519_dalek::SigningKey>,
}

impl fmt::Debug for HolderSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderSecrets(..)")
    }
}

/// The public half of [`HolderSecrets`].
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, Debug)]
pub struct PublicKeys {
    pub verify: VerifyKey,
    pub seal: SealPublicKey,
}

/// Length of a sealed session key: the encapsulated X25519 key, 32 key bytes, the AEAD tag.
pub const SEALED_LEN: usize = 32 + 32 + 16;

impl HolderSecrets {
    /// Secrets derived from 32 bytes of seed material (from the operating system's generator
    /// in `redoubt init`, from the seeded generator in the simulator).
    pub fn from_seed(seed: &[u8; 32]) -> HolderSecrets {
        HolderSecrets {
            sign: blake3::derive_key("redoubt 2026 holder ed25519 v1", seed),
            open: blake3::derive_key("redoubt 2026 holder x25519 v1", seed),
            signer: std::sync::OnceLock::new(),
        }
    }

    pub fn public(&self) -> PublicKeys {
        let sk = ed25519_dalek::SigningKey::from_bytes(&self.sign);
        let (_, pk) = X25519HkdfSha256::derive_keypair(&self.open);
        let mut seal = [0u8; 32];
        seal.copy_from_slice(&pk.to_bytes());
        PublicKeys {
            verify: VerifyKey(sk.verifying_key().to_bytes()),
            seal: SealPublicKey(seal),
        }
    }

    /// Signs `msg` (deterministic Ed25519).
    pub fn sign(&self, msg: &[u8]) -> Signature {
        use ed25519_dalek::Signer;
        let sk = self
            .signer
            .get_or_init(|| ed25519_dalek::SigningKey::from_bytes(&self.sign));
        Signature(sk.sign(msg).to_bytes())
    }

    /// Opens a session key sealed to this principal with [`seal_key`] under the same `info`.
    pub fn open_key(&self, info: &[u8], sealed: &[u8]) -> Option<[u8; 32]> {
        if sealed.len() != SEALED_LEN {
            return None;
        }
        let (sk, _) = X25519HkdfSha256::derive_keypair(&self.open);
        let encapped = <X25519HkdfSha256 as Kem>::EncappedKey::from_bytes(&sealed[..32]).ok()?;
        let plain = hpke::single_shot_open::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            &sk,
            &encapped,
            info,
            &sealed[32..],
            b"",
        )
        .ok()?;
        plain.try_into().ok()
    }
}

/// Verifies an Ed25519 signature (strict verification: no malleable encodings), once per
/// process for the same bytes ([`crate::remember`]).
pub fn verify(key: &VerifyKey, msg: &[u8], sig: &Signature) -> bool {
    crate::remember::check_once("ed25519", &key.0, msg, &sig.0, || {
        let Some(vk) = verifying_key(key) else {
            return false;
        };
        let sig = ed25519_dalek::Signature::from_bytes(&sig.0);
        vk.verify_strict(msg, &sig).is_ok()
    })
}

/// Most decompressed public keys kept (a cluster has a few per principal).
const VERIFYING_KEYS_MAX: usize = 4096;

/// `key` decompressed, from a process-wide table (decompressing costs about a fifth of a
/// verification; the same few keys verify everything).
fn verifying_key(key: &VerifyKey) -> Option<ed25519_dalek::VerifyingKey> {
    static KEYS: KeyTable<ed25519_dalek::VerifyingKey> = std::sync::Mutex::new(None);
    decompressed(&KEYS, key, || {
        ed25519_dalek::VerifyingKey::from_bytes(&key.0).ok()
    })
}

/// A process-wide table of decompressed public keys, by their bytes.
type KeyTable<K> = std::sync::Mutex<Option<std::collections::HashMap<[u8; 32], K>>>;

/// `key` from `table`, or made by `decompress` and kept (at most [`VERIFYING_KEYS_MAX`]).
fn decompressed<K: Copy>(
    table: &KeyTable<K>,
    key: &VerifyKey,
    decompress: impl FnOnce() -> Option<K>,
) -> Option<K> {
    if let Some(k) = table
        .lock()
        .expect("key table")
        .as_ref()
        .and_then(|m| m.get(&key.0))
    {
        return Some(*k);
    }
    let k = decompress()?;
    let mut table = table.lock().expect("key table");
    let map = table.get_or_insert_with(Default::default);
    if map.len() >= VERIFYING_KEYS_MAX {
        map.clear();
    }
    map.insert(key.0, k);
    Some(k)
}

/// Seals a 32-byte session key to `to` (HPKE base mode). `info` binds the context (sender,
/// receiver, counter); `rng_seed` supplies the ephemeral key's randomness.
pub fn seal_key(to: &SealPublicKey, info: &[u8], key: &[u8; 32], rng_seed: [u8; 32]) -> Vec<u8> {
    let mut rng = rand_chacha::ChaCha20Rng::from_seed(rng_seed);
    let Ok(pk) = <X25519HkdfSha256 as Kem>::PublicKey::from_bytes(&to.0) else {
        // Not a valid point: produce something that will not open.
        return vec![0; SEALED_LEN];
    };
    match hpke::single_shot_seal_with_rng::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(
        &OpModeS::Base,
        &pk,
        info,
        key,
        b"",
        &mut rng,
    ) {
        Ok((encapped, ct)) => {
            let mut out = encapped.to_bytes().to_vec();
            out.extend_from_slice(&ct);
            out
        }
        Err(_) => vec![0; SEALED_LEN],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_seal_open() {
        let a = HolderSecrets::from_seed(&[1; 32]);
        let b = HolderSecrets::from_seed(&[2; 32]);
        let sig = a.sign(b"hello");
        assert!(verify(&a.public().verify, b"hello", &sig));
        assert!(!verify(&a.public().verify, b"hellp", &sig));
        assert!(!verify(&b.public().verify, b"hello", &sig));

        let sealed = seal_key(&b.public().seal, b"ctx", &[7; 32], [9; 32]);
        assert_eq!(sealed.len(), SEALED_LEN);
        assert_eq!(b.open_key(b"ctx", &sealed), Some([7; 32]));
        assert_eq!(b.open_key(b"other", &sealed), None);
        assert_eq!(a.open_key(b"ctx", &sealed), None);
        let mut bad = sealed.clone();
        bad[40] ^= 1;
        assert_eq!(b.open_key(b"ctx", &bad), None);
        assert_eq!(b.open_key(b"ctx", &sealed[..10]), None);
    }
}
