//! Confidential request and reply bodies: a key shared by one client session and the
//! executors, and the AEAD that seals bodies under it.
//!
//! The executors (the replicas that run the service) share one X25519 key pair, dealt by
//! `redoubt init`; its public half is in the cluster's public directory. A client starts a
//! session by encapsulating to it (HPKE base mode, X25519/HKDF-SHA256, the exported secret is
//! the session's [`BodyKey`]) and sends the 32-byte encapsulation with its requests. Every
//! executor derives the same key from it, so every correct executor opens a body identically
//! (or fails to, identically) and seals the reply to identical bytes: the nonce is a function
//! of the direction and the request's timestamp, never random (Yin et al. 2003 §7.2 trap 8).
//! Agreement nodes, filters and the network see ciphertext only.
//!
//! One request can get two different results under one nonce: replicas at different states
//! answering one read on the read-only fast path, a read answered again later, a tentative
//! execution undone and run again elsewhere. The AEAD is therefore AES-256-GCM-SIV (RFC 8452),
//! which resists nonce reuse: two different bodies sealed under one key and nonce reveal only
//! that they differ, never their XOR or an authentication key (second review, G6; with
//! ChaCha20-Poly1305 they revealed both). Equal bodies under one nonce seal to equal bytes, as
//! executors need.

use aes_gcm_siv::aead::{Aead, KeyInit, Payload};
use aes_gcm_siv::{Aes256GcmSiv, Nonce};
use hpke::aead::ChaCha20Poly1305 as HpkeChaCha;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use rand_chacha::rand_core::SeedableRng;
use std::fmt;

use crate::pk::SealPublicKey;

/// Length of an encapsulation (an X25519 public key).
pub const ENC_LEN: usize = 32;
/// What sealing adds to a body (the Poly1305 tag).
pub const TAG_LEN: usize = 16;

/// Label of the HPKE export that yields a session's body key.
const EXPORT_LABEL: &[u8] = b"redoubt 2026 body key v1";

/// Which way a body travels: part of the nonce, so a request and its reply never share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Request = 1,
    Reply = 2,
    /// Pages and meta-data of a state transfer (executor to executor).
    State = 3,
}

/// The executors' shared secret: opens clients' encapsulations.
#[derive(Clone)]
pub struct ExecutorSecret([u8; 32]);

impl fmt::Debug for ExecutorSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExecutorSecret(..)")
    }
}

impl ExecutorSecret {
    /// The secret derived from 32 bytes of seed material.
    pub fn from_seed(seed: &[u8; 32]) -> ExecutorSecret {
        ExecutorSecret(blake3::derive_key("redoubt 2026 executors x25519 v1", seed))
    }

    /// The public key clients encapsulate to.
    pub fn public(&self) -> SealPublicKey {
        let (_, pk) = X25519HkdfSha256::derive_keypair(&self.0);
        let mut out = [0u8; 32];
        out.copy_from_slice(&pk.to_bytes());
        SealPublicKey(out)
    }

    /// The body key of the session that sent `enc` under the context `info` (which names the
    /// client), or `None` if `enc` is not a valid encapsulation. Deterministic: every holder of
    /// this secret derives the same key, or none.
    pub fn open(&self, info: &[u8], enc: &[u8; ENC_LEN]) -> Option<BodyKey> {
        let (sk, _) = X25519HkdfSha256::derive_keypair(&self.0);
        let encapped = <X25519HkdfSha256 as Kem>::EncappedKey::from_bytes(enc).ok()?;
        let ctx = hpke::setup_receiver::<HpkeChaCha, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            &sk,
            &encapped,
            info,
        )
        .ok()?;
        let mut key = [0u8; 32];
        ctx.export(EXPORT_LABEL, &mut key).ok()?;
        Some(BodyKey::from_bytes(key))
    }
}

/// Starts a session with the executors whose public key is `executors`: returns the
/// encapsulation to send and the session's body key. `ikm` supplies the ephemeral key's
/// randomness (fresh for every session). `None` if `executors` is not a valid public key.
pub fn establish(
    executors: &SealPublicKey,
    info: &[u8],
    ikm: [u8; 32],
) -> Option<([u8; ENC_LEN], BodyKey)> {
    let pk = <X25519HkdfSha256 as Kem>::PublicKey::from_bytes(&executors.0).ok()?;
    let mut rng = rand_chacha::ChaCha20Rng::from_seed(ikm);
    let (encapped, ctx) = hpke::setup_sender_with_rng::<HpkeChaCha, HkdfSha256, X25519HkdfSha256>(
        &OpModeS::Base,
        &pk,
        info,
        &mut rng,
    )
    .ok()?;
    let mut key = [0u8; 32];
    ctx.export(EXPORT_LABEL, &mut key).ok()?;
    let mut enc = [0u8; ENC_LEN];
    enc.copy_from_slice(&encapped.to_bytes());
    Some((enc, BodyKey::from_bytes(key)))
}

/// A session's body key (AES-256-GCM-SIV, see the module's documentation).
#[derive(Clone)]
pub struct BodyKey {
    bytes: [u8; 32],
    key: Aes256GcmSiv,
}

impl PartialEq for BodyKey {
    fn eq(&self, other: &Self) -> bool {
        use subtle::ConstantTimeEq;
        self.bytes.ct_eq(&other.bytes).into()
    }
}

impl Eq for BodyKey {}

impl fmt::Debug for BodyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BodyKey(..)")
    }
}

fn nonce_bytes(dir: Direction, counter: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[0] = dir as u8;
    n[4..].copy_from_slice(&counter.to_le_bytes());
    n
}

fn nonce(dir: Direction, counter: u64) -> Nonce {
    Nonce::from(nonce_bytes(dir, counter))
}

/// The simulator's audit of body sealing (feature `audit`, switched on per run and per
/// thread): every seal is recorded as (key, direction, the IV its keystream came from, the
/// plaintext's digest), so a checker can fail a run in which one key and IV sealed two
/// different bodies (second review, G6). `start(true)` also restores, for the run, the
/// stream AEAD whose IV is the nonce itself (ChaCha20-Poly1305, as bodies were sealed
/// before): the mutant that reopens the hole.
#[cfg(feature = "audit")]
pub mod audit {
    use super::Direction;
    use std::cell::{Cell, RefCell};

    /// One seal, as recorded.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Sealed {
        /// BLAKE3 of the key's bytes.
        pub key: [u8; 32],
        pub dir: u8,
        /// The IV the keystream was drawn from: AES-GCM-SIV's tag, or the stream AEAD's
        /// nonce (zero-padded).
        pub iv: [u8; 16],
        /// BLAKE3 of the plaintext.
        pub plain: [u8; 32],
    }

    thread_local! {
        static ON: Cell<bool> = const { Cell::new(false) };
        static STREAM: Cell<bool> = const { Cell::new(false) };
        static LOG: RefCell<Vec<Sealed>> = const { RefCell::new(Vec::new()) };
    }

    /// Starts recording the seals of this thread (`stream`: with the stream AEAD).
    pub fn start(stream: bool) {
        ON.with(|o| o.set(true));
        STREAM.with(|s| s.set(stream));
        LOG.with(|l| l.borrow_mut().clear());
    }

    /// Stops recording and restores AES-GCM-SIV on this thread.
    pub fn stop() {
        ON.with(|o| o.set(false));
        STREAM.with(|s| s.set(false));
        LOG.with(|l| l.borrow_mut().clear());
    }

    /// The seals recorded since the last call.
    pub fn take() -> Vec<Sealed> {
        LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }

    pub(super) fn stream() -> bool {
        STREAM.with(Cell::get)
    }

    pub(super) fn record(key: &[u8; 32], dir: Direction, iv: [u8; 16], plain: &[u8]) {
        if ON.with(Cell::get) {
            let s = Sealed {
                key: *blake3::hash(key).as_bytes(),
                dir: dir as u8,
                iv,
                plain: *blake3::hash(plain).as_bytes(),
            };
            LOG.with(|l| l.borrow_mut().push(s));
        }
    }

    fn key(bytes: &[u8; 32]) -> ring::aead::LessSafeKey {
        let unbound = ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, bytes)
            .expect("a 32-byte key");
        ring::aead::LessSafeKey::new(unbound)
    }

    pub(super) fn stream_seal(k: &[u8; 32], n: [u8; 12], aad: &[u8], plain: &[u8]) -> Vec<u8> {
        let mut out = plain.to_vec();
        key(k)
            .seal_in_place_append_tag(
                ring::aead::Nonce::assume_unique_for_key(n),
                ring::aead::Aad::from(aad),
                &mut out,
            )
            .expect("seals any length");
        out
    }

    pub(super) fn stream_open(
        k: &[u8; 32],
        n: [u8; 12],
        aad: &[u8],
        sealed: &[u8],
    ) -> Option<Vec<u8>> {
        let mut buf = sealed.to_vec();
        let len = key(k)
            .open_in_place(
                ring::aead::Nonce::assume_unique_for_key(n),
                ring::aead::Aad::from(aad),
                &mut buf,
            )
            .ok()?
            .len();
        buf.truncate(len);
        Some(buf)
    }
}

impl BodyKey {
    pub fn from_bytes(bytes: [u8; 32]) -> BodyKey {
        BodyKey {
            bytes,
            key: Aes256GcmSiv::new(&bytes.into()),
        }
    }

    /// The key's bytes (to hand it from the key holder's process to the replica's).
    pub fn bytes(&self) -> [u8; 32] {
        self.bytes
    }

    /// Seals `plain` travelling in `dir` for the message numbered `counter` (a request's
    /// timestamp); `aad` is authenticated, not encrypted. Deterministic.
    pub fn seal(&self, dir: Direction, counter: u64, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        #[cfg(feature = "audit")]
        if audit::stream() {
            let out = audit::stream_seal(&self.bytes, nonce_bytes(dir, counter), aad, plain);
            let mut iv = [0u8; 16];
            iv[..12].copy_from_slice(&nonce_bytes(dir, counter));
            audit::record(&self.bytes, dir, iv, plain);
            return out;
        }
        let out = self
            .key
            .encrypt(&nonce(dir, counter), Payload { msg: plain, aad })
            .expect("AES-GCM-SIV seals any length a frame can hold");
        #[cfg(feature = "audit")]
        {
            // The synthetic IV the keystream is drawn from is the tag.
            let mut iv = [0u8; 16];
            iv.copy_from_slice(&out[out.len() - TAG_LEN..]);
            audit::record(&self.bytes, dir, iv, plain);
        }
        out
    }

    /// Opens what [`BodyKey::seal`] sealed with the same direction, counter and `aad`.
    pub fn open(&self, dir: Direction, counter: u64, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        #[cfg(feature = "audit")]
        if audit::stream() {
            return audit::stream_open(&self.bytes, nonce_bytes(dir, counter), aad, sealed);
        }
        self.key
            .decrypt(&nonce(dir, counter), Payload { msg: sealed, aad })
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_executor_derives_the_clients_key_and_bodies_open_only_as_sealed() {
        let exec = ExecutorSecret::from_seed(&[3; 32]);
        let (enc, key) = establish(&exec.public(), b"client:7", [9; 32]).unwrap();
        // Another copy of the secret (another executor) derives the same key.
        let again = ExecutorSecret::from_seed(&[3; 32])
            .open(b"client:7", &enc)
            .unwrap();
        assert_eq!(again, key);
        // The context binds the client: the same encapsulation under another name differs.
        assert_ne!(exec.open(b"client:8", &enc).unwrap(), key);
        // Another executor secret derives something else.
        assert_ne!(
            ExecutorSecret::from_seed(&[4; 32])
                .open(b"client:7", &enc)
                .unwrap(),
            key
        );

        let sealed = key.seal(Direction::Request, 42, b"aad", b"put k v");
        assert_eq!(sealed.len(), 7 + TAG_LEN);
        assert!(!sealed.windows(3).any(|w| w == b"put"));
        // Deterministic: the same inputs give the same bytes (replies match across executors).
        assert_eq!(key.seal(Direction::Request, 42, b"aad", b"put k v"), sealed);
        assert_eq!(
            again
                .open(Direction::Request, 42, b"aad", &sealed)
                .as_deref(),
            Some(&b"put k v"[..])
        );
        assert_eq!(again.open(Direction::Reply, 42, b"aad", &sealed), None);
        assert_eq!(again.open(Direction::Request, 43, b"aad", &sealed), None);
        assert_eq!(again.open(Direction::Request, 42, b"other", &sealed), None);
        let mut bad = sealed.clone();
        bad[0] ^= 1;
        assert_eq!(again.open(Direction::Request, 42, b"aad", &bad), None);
        assert_eq!(
            again.open(Direction::Request, 42, b"aad", &sealed[..3]),
            None
        );
    }

    #[test]
    fn sessions_differ_and_garbage_encapsulations_are_refused() {
        let exec = ExecutorSecret::from_seed(&[3; 32]);
        let (e1, k1) = establish(&exec.public(), b"c", [1; 32]).unwrap();
        let (e2, k2) = establish(&exec.public(), b"c", [2; 32]).unwrap();
        assert_ne!(e1, e2);
        assert_ne!(k1, k2);
        // The all-zero point is refused by X25519 (a low-order point).
        assert_eq!(exec.open(b"c", &[0; 32]), None);
    }

    /// Second review, G6: two different bodies sealed under one key and nonce (two results of
    /// one request) must not give away their XOR, as a stream cipher's ciphertexts do.
    #[test]
    fn two_bodies_under_one_nonce_do_not_reveal_their_xor() {
        let key = BodyKey::from_bytes([7; 32]);
        let p1 = b"balance: 1000000 for alice......";
        let p2 = b"balance: 0000005 for alice......";
        let c1 = key.seal(Direction::Reply, 9, b"aad", p1);
        let c2 = key.seal(Direction::Reply, 9, b"aad", p2);
        assert_eq!(c1.len(), p1.len() + TAG_LEN);
        let xor_c: Vec<u8> = c1.iter().zip(&c2).map(|(a, b)| a ^ b).collect();
        let xor_p: Vec<u8> = p1.iter().zip(p2).map(|(a, b)| a ^ b).collect();
        assert_ne!(
            &xor_c[..p1.len()],
            &xor_p[..],
            "the XOR of the plaintexts leaked"
        );
        // Where the plaintexts agree (their tail), the ciphertexts do not.
        assert_ne!(&c1[20..p1.len()], &c2[20..p1.len()]);
        // Equal bodies still seal alike (every executor seals a reply to the same bytes).
        assert_eq!(c1, key.seal(Direction::Reply, 9, b"aad", p1));
        assert_eq!(key.open(Direction::Reply, 9, b"aad", &c2).unwrap(), p2);
    }
}
