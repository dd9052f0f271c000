//! Cryptographic building blocks for redoubt: message digests and MACs.
//!
//! Everything here wraps maintained primitives (BLAKE3); this crate implements no primitive
//! of its own. It knows nothing about protocol messages or principals: callers hand it bytes
//! and keys. It must never read a clock, draw randomness, or do I/O, so that the pure protocol
//! core and the deterministic simulator can use it.
//!
//! MACs follow the PBFT design: the message is hashed once into a [`Digest`] and each MAC is a
//! keyed hash of that digest, so an authenticator for `n` receivers costs one pass over the
//! message plus `n` tiny keyed hashes.

pub mod body;
pub mod pk;
mod remember;
pub mod threshold;

use serde::{Deserialize, Serialize};
use std::fmt;
use subtle::ConstantTimeEq;

/// Length of a [`Digest`] in bytes.
pub const DIGEST_LEN: usize = 32;
/// Length of a [`Mac`] in bytes (BLAKE3 keyed output truncated to 128 bits).
pub const MAC_LEN: usize = 16;
/// Length of a [`MacKey`] in bytes.
pub const KEY_LEN: usize = 32;

/// A BLAKE3 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Digest(pub [u8; DIGEST_LEN]);

impl Digest {
    /// The all-zero digest. Never produced by hashing; protocols use it as a sentinel
    /// (for example the digest of the null request).
    pub const ZERO: Digest = Digest([0; DIGEST_LEN]);

    /// Digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    /// Digest of several byte strings, each framed by its length so that the split points are
    /// part of what is hashed (`["ab","c"]` and `["a","bc"]` differ).
    pub fn of_parts(domain: &str, parts: &[&[u8]]) -> Digest {
        let mut h = DigestBuilder::new(domain);
        for p in parts {
            h.bytes(p);
        }
        h.finish()
    }

    /// Short hex prefix for logs and traces.
    pub fn short(&self) -> String {
        self.0[..4].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Full lowercase hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Digest::ZERO {
            write!(f, "null")
        } else {
            write!(f, "{}", self.short())
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// From this length on [`DigestBuilder::long_bytes`] hashes a byte string on its own (two
/// BLAKE3 chunks: below that there is nothing to hash in parallel).
pub const LONG_BYTES: usize = 2048;

/// Incremental, domain-separated digest construction with length framing.
pub struct DigestBuilder(blake3::Hasher);

impl DigestBuilder {
    pub fn new(domain: &str) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(&(domain.len() as u64).to_le_bytes());
        h.update(domain.as_bytes());
        DigestBuilder(h)
    }
    /// Adds a length-framed byte string.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.update(&(b.len() as u64).to_le_bytes());
        self.0.update(b);
        self
    }
    /// Adds a length-framed byte string like [`DigestBuilder::bytes`], except that a string of
    /// [`LONG_BYTES`] or more is hashed on its own and only its digest added: BLAKE3 hashes the
    /// chunks of one long input in parallel, which it cannot do for bytes fed to a hasher
    /// mid-chunk. The length decides which, so the encoding stays unambiguous.
    pub fn long_bytes(&mut self, b: &[u8]) -> &mut Self {
        if b.len() < LONG_BYTES {
            return self.bytes(b);
        }
        self.0.update(&(b.len() as u64).to_le_bytes());
        self.0.update(blake3::hash(b).as_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.update(&v.to_le_bytes());
        self
    }
    pub fn digest(&mut self, d: &Digest) -> &mut Self {
        self.0.update(&d.0);
        self
    }
    pub fn finish(&self) -> Digest {
        let d = Digest(*self.0.finalize().as_bytes());
        debug_assert_ne!(d, Digest::ZERO);
        d
    }
}

/// A message authentication code: BLAKE3 in keyed mode over a message digest, truncated.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Mac(pub [u8; MAC_LEN]);

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex: String = self.0[..3].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "mac:{hex}")
    }
}

/// A symmetric MAC key shared by one ordered pair of principals.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacKey(pub [u8; KEY_LEN]);

impl fmt::Debug for MacKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        write!(f, "MacKey(..)")
    }
}

impl MacKey {
    /// Derives a key from a master secret and a context string. Used to build the static
    /// pairwise key tables of tests and of `redoubt init`; session keys (a later layer) are
    /// drawn from a real RNG instead.
    pub fn derive(context: &str, material: &[u8]) -> MacKey {
        MacKey(blake3::derive_key(context, material))
    }

    /// MAC over a digest.
    pub fn mac(&self, digest: &Digest) -> Mac {
        let out = blake3::keyed_hash(&self.0, &digest.0);
        let mut m = [0u8; MAC_LEN];
        m.copy_from_slice(&out.as_bytes()[..MAC_LEN]);
        Mac(m)
    }

    /// Constant-time verification of a MAC over a digest.
    pub fn verify(&self, digest: &Digest, mac: &Mac) -> bool {
        let expect = self.mac(digest);
        expect.0.ct_eq(&mac.0).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Below the threshold `long_bytes` is `bytes`; from it on it differs, and any change of a
    /// long string (a byte, its length) changes the digest.
    #[test]
    fn long_bytes_hashes_long_strings_on_their_own() {
        let d = |f: &dyn Fn(&mut DigestBuilder)| {
            let mut b = DigestBuilder::new("t");
            f(&mut b);
            b.finish()
        };
        let short = vec![7u8; LONG_BYTES - 1];
        assert_eq!(
            d(&|b| {
                b.long_bytes(&short);
            }),
            d(&|b| {
                b.bytes(&short);
            })
        );
        let long = vec![7u8; LONG_BYTES * 2];
        let base = d(&|b| {
            b.long_bytes(&long);
        });
        assert_ne!(
            base,
            d(&|b| {
                b.bytes(&long);
            })
        );
        let mut flipped = long.clone();
        flipped[LONG_BYTES + 5] ^= 1;
        assert_ne!(
            base,
            d(&|b| {
                b.long_bytes(&flipped);
            })
        );
        assert_ne!(
            base,
            d(&|b| {
                b.long_bytes(&long[1..]);
            })
        );
        assert_eq!(
            base,
            d(&|b| {
                b.long_bytes(&long.clone());
            })
        );
    }

    #[test]
    fn mac_roundtrip_and_rejection() {
        let k = MacKey::derive("test", b"k1");
        let k2 = MacKey::derive("test", b"k2");
        let d = Digest::of(b"hello");
        let m = k.mac(&d);
        assert!(k.verify(&d, &m));
        assert!(!k2.verify(&d, &m));
        assert!(!k.verify(&Digest::of(b"hellp"), &m));
        let mut bad = m;
        bad.0[0] ^= 1;
        assert!(!k.verify(&d, &bad));
    }

    #[test]
    fn framing_separates_parts() {
        assert_ne!(
            Digest::of_parts("t", &[b"ab", b"c"]),
            Digest::of_parts("t", &[b"a", b"bc"])
        );
        assert_ne!(
            Digest::of_parts("t", &[b"a"]),
            Digest::of_parts("u", &[b"a"])
        );
    }
}
