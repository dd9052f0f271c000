//! Threshold BLS signatures (BLS12-381) for the privacy firewall's reply certificates
//! (Yin et al. 2003 §4): each of the 2g+1 execution nodes holds a share of one group key;
//! g+1 signature shares on the same message combine into the one signature of the group key.
//! BLS signatures are unique: whichever g+1 shares are combined, the certificate has exactly
//! one encoding, so the choice of signers cannot carry covert bits.
//!
//! Wraps the maintained `blsttc` crate (on `blst`) for dealing, signing and combining. Key
//! generation is a trusted dealer (`redoubt init`, or the simulator's seed): [`deal`].
//! Verification calls `blst` itself: one multi-pairing with a single final exponentiation on the
//! calling thread (blsttc computes two full pairings and compares them, about twice the work),
//! with the same hash-to-curve suite, so the two accept exactly the same signatures.
//!
//! Verification results are remembered ([`crate::remember`]): a process that checks one
//! certificate several times pays one pairing for it.

use blst::min_pk::{PublicKey as BlstPublicKey, Signature as BlstSignature};
use blst::{blst_p1_affine, blst_p2_affine, Pairing, BLST_ERROR};
use blsttc::{PublicKeySet, SecretKeySet, SecretKeyShare, SignatureShare};
use rand_chacha_bls::rand_core::SeedableRng;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bytes of a signature and of a signature share (a G2 point, compressed).
pub const SIG_LEN: usize = 96;

/// The public half of a threshold key: the group key, from which every share's public key
/// derives. Canonical encoding: `blsttc`'s commitment bytes.
#[derive(Clone)]
pub struct GroupKey {
    set: PublicKeySet,
    /// The group's public key, compressed (the verification cache's key) and decoded.
    key_bytes: [u8; 48],
    key: BlstPublicKey,
}

impl PartialEq for GroupKey {
    fn eq(&self, other: &Self) -> bool {
        self.set == other.set
    }
}

impl Eq for GroupKey {}

/// One node's secret share (node `index`, from 0).
#[derive(Clone)]
pub struct KeyShare {
    index: usize,
    share: SecretKeyShare,
}

/// A signature share, or a combined signature (same encoding).
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThresholdSig(#[serde(with = "serde_bytes")] pub [u8; SIG_LEN]);

impl fmt::Debug for ThresholdSig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex: String = self.0[..4].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "tsig:{hex}")
    }
}

impl fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GroupKey(threshold {})", self.set.threshold())
    }
}

impl fmt::Debug for KeyShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyShare({}, <secret>)", self.index)
    }
}

/// Deals a key that any `threshold + 1` of `nodes` shares sign for, from a 32-byte seed
/// (the dealer's randomness: the operating system's in `redoubt init`).
pub fn deal(threshold: usize, nodes: usize, seed: [u8; 32]) -> (GroupKey, Vec<KeyShare>) {
    let mut rng = rand_chacha_bls::ChaCha20Rng::from_seed(seed);
    let sks = SecretKeySet::random(threshold, &mut rng);
    let shares = (0..nodes)
        .map(|index| KeyShare {
            index,
            share: sks.secret_key_share(index),
        })
        .collect();
    (GroupKey::from_set(sks.public_keys()), shares)
}

/// Hash-to-curve suite of the signatures (blsttc's, the IETF suite for G2 signatures).
const DST: &[u8] = blsttc::DST;

/// Whether `sig` verifies on `msg` under the key `key_id` names (checked once per process;
/// `key` makes the key, only when the answer is not remembered).
fn verify_remembered(
    key_id: &[u8],
    key: impl FnOnce() -> BlstPublicKey,
    msg: &[u8],
    sig: &[u8],
) -> bool {
    crate::remember::check_once("bls12-381 g2", key_id, msg, sig, || {
        pairing_check(&key(), msg, sig)
    })
}

/// e(key, H(msg)) = e(g1, sig), as one multi-pairing; the signature is checked to be in G2.
fn pairing_check(key: &BlstPublicKey, msg: &[u8], sig: &[u8]) -> bool {
    let Ok(sig) = BlstSignature::from_bytes(sig) else {
        return false;
    };
    let key: &blst_p1_affine = key.into();
    let sig: &blst_p2_affine = (&sig).into();
    let mut pairing = Pairing::new(true, DST);
    if pairing.aggregate(key, true, sig, true, msg, &[]) != BLST_ERROR::BLST_SUCCESS {
        return false;
    }
    pairing.commit();
    pairing.finalverify(None)
}

/// A G1 public key of blsttc (compressed bytes) as blst's.
fn to_blst(bytes: &[u8; 48]) -> BlstPublicKey {
    BlstPublicKey::from_bytes(bytes).expect("blsttc encodes valid G1 points")
}

impl GroupKey {
    fn from_set(set: PublicKeySet) -> GroupKey {
        let key_bytes = set.public_key().to_bytes();
        let key = to_blst(&key_bytes);
        GroupKey {
            set,
            key_bytes,
            key,
        }
    }
    pub fn to_bytes(&self) -> Vec<u8> {
        self.set.to_bytes()
    }
    pub fn from_bytes(bytes: &[u8]) -> Result<GroupKey, String> {
        // One compressed G1 point per coefficient.
        if bytes.is_empty() || !bytes.len().is_multiple_of(48) {
            return Err(format!(
                "a threshold group key has 48·k bytes, not {}",
                bytes.len()
            ));
        }
        PublicKeySet::from_bytes(bytes.to_vec())
            .map(GroupKey::from_set)
            .map_err(|e| format!("not a threshold group key: {e}"))
    }
    /// How many shares beyond one a signature needs (g: g+1 sign).
    pub fn threshold(&self) -> usize {
        self.set.threshold()
    }
    /// Whether `share` is node `index`'s share on `msg`.
    pub fn verify_share(&self, index: usize, msg: &[u8], share: &ThresholdSig) -> bool {
        // Named by the group key and the index: the share's key is derived only if needed.
        let mut key_id = self.key_bytes.to_vec();
        key_id.extend_from_slice(&(index as u64).to_le_bytes());
        let key = || to_blst(&self.set.public_key_share(index).to_bytes());
        verify_remembered(&key_id, key, msg, &share.0)
    }
    /// Combines `threshold + 1` shares (node index, share) into the group's signature,
    /// without checking them: verify the result with [`GroupKey::verify`], and the shares
    /// one by one when it fails. `None`: too few shares, or one does not decode.
    pub fn combine(&self, shares: &[(usize, ThresholdSig)]) -> Option<ThresholdSig> {
        let mut decoded = Vec::with_capacity(shares.len());
        for (i, s) in shares {
            decoded.push((*i, SignatureShare::from_bytes(s.0).ok()?));
        }
        if decoded.len() <= self.set.threshold() {
            return None;
        }
        let sig = self
            .set
            .combine_signatures(decoded.iter().map(|(i, s)| (*i, s)))
            .ok()?;
        Some(ThresholdSig(sig.to_bytes()))
    }
    /// Whether `sig` is the group's signature on `msg`.
    pub fn verify(&self, msg: &[u8], sig: &ThresholdSig) -> bool {
        verify_remembered(&self.key_bytes, || self.key, msg, &sig.0)
    }
}

impl KeyShare {
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn sign(&self, msg: &[u8]) -> ThresholdSig {
        ThresholdSig(self.share.sign(msg).to_bytes())
    }
    /// The secret bytes, for a key file (hex there).
    pub fn to_bytes(&self) -> [u8; 32] {
        self.share.to_bytes()
    }
    pub fn from_bytes(index: usize, bytes: [u8; 32]) -> Result<KeyShare, String> {
        SecretKeyShare::from_bytes(bytes)
            .map(|share| KeyShare { index, share })
            .map_err(|e| format!("not a threshold key share: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_g_plus_one_shares_make_the_same_signature_and_g_do_not() {
        let (group, shares) = deal(1, 3, [7; 32]);
        let msg = b"reply bundle";
        let sig: Vec<(usize, ThresholdSig)> =
            shares.iter().map(|s| (s.index(), s.sign(msg))).collect();
        for (i, s) in &sig {
            assert!(group.verify_share(*i, msg, s));
            assert!(!group.verify_share((*i + 1) % 3, msg, s));
        }
        let a = group.combine(&sig[0..2]).unwrap();
        let b = group.combine(&sig[1..3]).unwrap();
        let c = group.combine(&[sig[0], sig[2]]).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert!(group.verify(msg, &a));
        assert!(!group.verify(b"another", &a));
        assert!(
            group.combine(&sig[0..1]).is_none(),
            "g shares are not a certificate"
        );
        // One share is the node's own signature under its share, not the group's.
        assert!(!group.verify(msg, &sig[0].1));
    }

    #[test]
    fn a_bad_share_spoils_the_combination_and_is_found_on_its_own() {
        let (group, shares) = deal(1, 3, [8; 32]);
        let msg = b"m";
        let good = (0, shares[0].sign(msg));
        let bad = (1, shares[1].sign(b"other"));
        let combined = group.combine(&[good, bad]).unwrap();
        assert!(!group.verify(msg, &combined));
        assert!(!group.verify_share(1, msg, &bad.1));
        assert!(group.verify_share(0, msg, &good.1));
        let garbage = ThresholdSig([0xab; SIG_LEN]);
        assert!(!group.verify_share(0, msg, &garbage));
        assert!(group.combine(&[good, (1, garbage)]).is_none());
    }

    #[test]
    fn blst_verification_agrees_with_blsttc_and_the_table_does_not_change_answers() {
        let (group, shares) = deal(1, 3, [11; 32]);
        let reference = |msg: &[u8], sig: &ThresholdSig| {
            blsttc::Signature::from_bytes(sig.0)
                .is_ok_and(|s| group.set.public_key().verify(&s, msg))
        };
        let sig = group
            .combine(&[(0, shares[0].sign(b"a")), (2, shares[2].sign(b"a"))])
            .unwrap();
        let mut flipped = sig;
        flipped.0[40] ^= 1;
        let cases = [
            (&b"a"[..], sig),
            (&b"b"[..], sig),
            (&b"a"[..], flipped),
            (&b"a"[..], shares[1].sign(b"a")),
            (&b"a"[..], ThresholdSig([0; SIG_LEN])),
        ];
        // Twice: the second round answers from the table.
        for _ in 0..2 {
            for (msg, s) in &cases {
                assert_eq!(group.verify(msg, s), reference(msg, s), "{msg:?} {s:?}");
            }
        }
        assert!(group.verify(b"a", &sig));
        assert!(!group.verify(b"a", &flipped));
        // The same share checked against another node's key is refused, remembered or not.
        for _ in 0..2 {
            assert!(group.verify_share(1, b"a", &cases[3].1));
            assert!(!group.verify_share(0, b"a", &cases[3].1));
        }
    }

    #[test]
    fn keys_round_trip_and_dealing_is_seeded() {
        let (group, shares) = deal(2, 5, [9; 32]);
        let again = GroupKey::from_bytes(&group.to_bytes()).unwrap();
        assert_eq!(again, group);
        assert_eq!(group.threshold(), 2);
        let s = KeyShare::from_bytes(3, shares[3].to_bytes()).unwrap();
        assert!(group.verify_share(3, b"x", &s.sign(b"x")));
        assert_eq!(deal(2, 5, [9; 32]).0, group);
        assert_ne!(deal(2, 5, [10; 32]).0, group);
        assert!(GroupKey::from_bytes(&[1, 2, 3]).is_err());
    }
}
