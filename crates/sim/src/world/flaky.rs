//! A key holder that fails now and then, as a real one behind its socket does: it does not
//! answer (the call times out before the holder acted), or it acts and its answer is lost
//! (the counter advanced, a NEW-KEY's counter was recorded, and the caller saw an error). The
//! failures are drawn from a generator of its own, seeded per holder incarnation, so runs
//! stay reproducible. Like the network's faults they end when the scenario's faults are
//! over (`settle_ms`), from which the liveness and throughput checks hold the service to
//! its promises.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_core::keys::{Admitted, HolderError, KeyHolder, LocalHolder, NewKey, Purpose};
use redoubt_core::Principal;
use redoubt_crypto::body::{BodyKey, ENC_LEN};
use redoubt_crypto::pk::{SealPublicKey, Signature};
use redoubt_crypto::{Digest, MacKey};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Which key holders fail, how often, and until when.
#[derive(Clone)]
pub(super) struct HolderFaults {
    /// The probability that a call fails.
    pub(super) fail: f64,
    /// Calls fail only before this time (simulated ms)...
    pub(super) until_ms: u64,
    /// ...read from the world's clock.
    pub(super) clock: Arc<AtomicU64>,
}

pub(super) struct Flaky {
    inner: LocalHolder,
    rng: ChaCha8Rng,
    faults: HolderFaults,
}

impl Flaky {
    pub(super) fn new(inner: LocalHolder, faults: HolderFaults, seed: [u8; 32]) -> Flaky {
        Flaky {
            inner,
            rng: ChaCha8Rng::from_seed(seed),
            faults,
        }
    }

    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut LocalHolder) -> Result<T, HolderError>,
    ) -> Result<T, HolderError> {
        let over = self.faults.clock.load(Relaxed) >= self.faults.until_ms;
        if over || !self.rng.random_bool(self.faults.fail) {
            return f(&mut self.inner);
        }
        if self.rng.random_bool(0.5) {
            return Err(HolderError::Unreachable("simulated: no answer".into()));
        }
        let _ = f(&mut self.inner);
        Err(HolderError::Unreachable(
            "simulated: answered after the caller gave up".into(),
        ))
    }
}

impl KeyHolder for Flaky {
    fn principal(&self) -> Principal {
        self.inner.principal()
    }
    fn sign(
        &mut self,
        purpose: Purpose,
        content: &Digest,
    ) -> Result<(u64, Signature), HolderError> {
        self.call(|h| h.sign(purpose, content))
    }
    fn fresh_key(&mut self) -> Result<MacKey, HolderError> {
        self.call(|h| h.fresh_key())
    }
    fn seal(
        &mut self,
        to: &SealPublicKey,
        info: &[u8],
        key: &MacKey,
    ) -> Result<Vec<u8>, HolderError> {
        self.call(|h| h.seal(to, info, key))
    }
    fn admit(&mut self, nk: &NewKey) -> Result<Admitted, HolderError> {
        self.call(|h| h.admit(nk))
    }
    fn open_body(
        &mut self,
        info: &[u8],
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        self.call(|h| h.open_body(info, enc))
    }
}
