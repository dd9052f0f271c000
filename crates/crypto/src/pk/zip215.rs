//! Ed25519 verification under ZIP 215's rules (the cofactored equation; `ed25519-zebra`),
//! alone and in batches.
//!
//! Under these rules a signature's verdict is the same whether it is checked alone or in any
//! batch: replicas that meet the same signatures in different groupings (a client's request
//! alone, then inside a PO-REQUEST with others) still agree on each. The strict rules of
//! [`super::verify`] do not have that property for batches (a batch of `ed25519-dalek` checks
//! the cofactorless equation with random weights, and a signature whose R has a small-order
//! part passes some groupings and not others), so a signature checked in batches is checked
//! alone under these rules too, never under the strict ones.
//!
//! A batch of k signatures costs one multi-scalar multiplication of about 2k + 1 points instead
//! of k double-base ones. Its random weights come from a generator seeded with a digest of the
//! whole batch: the verdict is a function of the signatures (an invalid one passes with
//! probability about 2^-128 over the weights, which the signer cannot choose).

use super::{Signature, VerifyKey};
use ed25519_zebra::{batch, VerificationKey, VerificationKeyBytes};
use rand_chacha::rand_core::SeedableRng;

/// The scheme's name in the table of checks made ([`crate::remember`]).
const SCHEME: &str = "ed25519-zip215";

/// One signature to check: key, message, signature.
pub type Item<'a> = (&'a VerifyKey, &'a [u8], &'a Signature);

/// Verifies one signature under ZIP 215's rules, once per process for the same bytes.
pub fn verify_zip215(key: &VerifyKey, msg: &[u8], sig: &Signature) -> bool {
    crate::remember::check_once(SCHEME, &key.0, msg, &sig.0, || single(key, msg, sig))
}

/// Whether every signature of `items` verifies under ZIP 215's rules: those not checked
/// before in one batch, and one by one only if the batch fails. Each verdict is remembered.
pub fn verify_all_zip215(items: &[Item<'_>]) -> bool {
    use crate::remember;
    let mut fresh = Vec::with_capacity(items.len());
    for &(key, msg, sig) in items {
        let id = remember::id(SCHEME, &key.0, msg, &sig.0);
        match remember::lookup(&id) {
            Some(true) => {}
            Some(false) => return false,
            None => fresh.push((id, (key, msg, sig))),
        }
    }
    let batch: Vec<Item<'_>> = fresh.iter().map(|(_, item)| *item).collect();
    if batch.len() > 1 && in_batch(&batch) {
        for (id, _) in fresh {
            remember::note(id, true);
        }
        return true;
    }
    fresh.into_iter().all(|(id, (key, msg, sig))| {
        let ok = single(key, msg, sig);
        remember::note(id, ok);
        ok
    })
}

fn single(key: &VerifyKey, msg: &[u8], sig: &Signature) -> bool {
    let Some(vk) = verification_key(key) else {
        return false;
    };
    vk.verify(&ed25519_zebra::Signature::from_bytes(&sig.0), msg)
        .is_ok()
}

fn in_batch(items: &[Item<'_>]) -> bool {
    let mut seed = blake3::Hasher::new_derive_key("redoubt zip215 batch weights v1");
    let mut v = batch::Verifier::new();
    for &(key, msg, sig) in items {
        for part in [&key.0[..], msg, &sig.0[..]] {
            seed.update(&(part.len() as u64).to_le_bytes());
            seed.update(part);
        }
        v.queue((
            VerificationKeyBytes::from(key.0),
            ed25519_zebra::Signature::from_bytes(&sig.0),
            msg,
        ));
    }
    let rng = rand_chacha::ChaCha20Rng::from_seed(seed.finalize().into());
    v.verify(rng).is_ok()
}

/// `key` decompressed, from a process-wide table.
fn verification_key(key: &VerifyKey) -> Option<VerificationKey> {
    static KEYS: super::KeyTable<VerificationKey> = std::sync::Mutex::new(None);
    super::decompressed(&KEYS, key, || VerificationKey::try_from(key.0).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pk::HolderSecrets;

    fn signed(i: u8, msg: &[u8]) -> (VerifyKey, Vec<u8>, Signature) {
        let k = HolderSecrets::from_seed(&[i; 32]);
        (k.public().verify, msg.to_vec(), k.sign(msg))
    }

    fn items(v: &[(VerifyKey, Vec<u8>, Signature)]) -> Vec<Item<'_>> {
        v.iter().map(|(k, m, s)| (k, &m[..], s)).collect()
    }

    #[test]
    fn a_batch_of_good_signatures_verifies_and_one_bad_fails_it() {
        let good: Vec<_> = (1..=6).map(|i| signed(i, &[i, 7, 7])).collect();
        assert!(verify_all_zip215(&items(&good)));
        for k in &good {
            assert!(verify_zip215(&k.0, &k.1, &k.2));
            assert!(super::super::verify(&k.0, &k.1, &k.2), "strict agrees");
        }
        // Another message under one of the signatures: the batch fails, whatever the order.
        for bad_at in [0, 3, 5] {
            let mut v: Vec<_> = (11..=16).map(|i| signed(i, &[i])).collect();
            v[bad_at].1.push(0);
            assert!(!verify_all_zip215(&items(&v)), "bad at {bad_at}");
            assert!(!verify_zip215(&v[bad_at].0, &v[bad_at].1, &v[bad_at].2));
        }
        // A signature by another key.
        let mut v: Vec<_> = (21..=23).map(|i| signed(i, b"m")).collect();
        v[1].0 = signed(99, b"m").0;
        assert!(!verify_all_zip215(&items(&v)));
    }

    #[test]
    fn a_verdict_remembered_from_a_batch_is_the_one_given_alone() {
        let v: Vec<_> = (31..=34).map(|i| signed(i, &[i, 1])).collect();
        assert!(verify_all_zip215(&items(&v)));
        assert!(verify_all_zip215(&items(&v[1..3])));
        // A signature known bad fails every batch it is in, without a batch check.
        let mut bad = signed(41, b"x");
        bad.2 .0[0] ^= 1;
        assert!(!verify_zip215(&bad.0, &bad.1, &bad.2));
        let mut w = v.clone();
        w.push(bad);
        assert!(!verify_all_zip215(&items(&w)));
        assert!(verify_all_zip215(&[]));
    }

    #[test]
    fn a_non_canonical_s_fails_alone_and_in_a_batch() {
        let (k, m, mut s) = signed(51, b"s");
        // s + l: the same scalar, not in canonical form.
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut carry = 0u16;
        for (b, l) in s.0[32..].iter_mut().zip(L) {
            let t = *b as u16 + l as u16 + carry;
            *b = t as u8;
            carry = t >> 8;
        }
        assert!(!verify_zip215(&k, &m, &s));
        let other = signed(52, b"t");
        assert!(!verify_all_zip215(&[
            (&k, &m, &s),
            (&other.0, &other.1, &other.2)
        ]));
    }
}
