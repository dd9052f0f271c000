//! What a turn's inputs bring that carries an Ed25519 signature to check (clients' requests
//! at their originator, PO-ARU rows): held until the turn's end and checked there in one
//! batch (`ed25519-zebra`: one multi-scalar multiplication instead of one double-base
//! multiplication each), then handled one by one, in the order they came, by the code that
//! handles them alone. Verdicts are remembered per process, so that code finds each
//! signature checked already; a batch that fails is checked one signature at a time. Rows are
//! checked under ZIP 215's rules everywhere (alone too), so that the batch and a lone check
//! give every row the same verdict at every replica.

use super::{KeyOf, PrimeSide};
use crate::message::SignedRequest;
use crate::prime::matrix::SignedPoAru;
use crate::types::Principal;
use redoubt_crypto::pk;
use redoubt_crypto::Digest;

/// Inputs held per kind at most; one more is handled at once (checked alone).
pub const ARRIVALS_MAX: usize = 256;

/// The inputs held for the turn's end.
#[derive(Default)]
pub struct Arrivals {
    /// Clients' requests sent to us as their originator: sender, request, its digest.
    pub requests: Vec<(Principal, SignedRequest, Digest)>,
    pub rows: Vec<SignedPoAru>,
}

impl Arrivals {
    pub fn len(&self) -> usize {
        self.requests.len() + self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.rows.is_empty()
    }
}

impl PrimeSide {
    /// Holds a client's request for the turn's end; gives it back when [`ARRIVALS_MAX`]
    /// wait already (the caller handles it now).
    pub fn hold_request(
        &mut self,
        from: Principal,
        sr: SignedRequest,
        digest: Digest,
    ) -> Option<(Principal, SignedRequest, Digest)> {
        if self.arrivals.requests.len() >= ARRIVALS_MAX {
            return Some((from, sr, digest));
        }
        self.arrivals.requests.push((from, sr, digest));
        None
    }

    /// Holds a PO-ARU row for the turn's end; gives it back when [`ARRIVALS_MAX`] wait
    /// already.
    pub fn hold_row(&mut self, row: SignedPoAru) -> Option<SignedPoAru> {
        if self.arrivals.rows.len() >= ARRIVALS_MAX {
            return Some(row);
        }
        self.arrivals.rows.push(row);
        None
    }

    /// Whether nothing waits for the turn's end.
    pub fn arrivals_empty(&self) -> bool {
        self.arrivals.is_empty()
    }

    /// What waits for the turn's end (nothing is left held).
    pub fn take_arrivals(&mut self) -> Arrivals {
        std::mem::take(&mut self.arrivals)
    }

    /// Checks the signatures of `rows` that a lone check would verify (of the incarnation in
    /// force, not held already) in one batch, so that the checks of the rows one by one find
    /// them decided.
    pub fn check_rows_together(&self, rows: &[SignedPoAru], installed: KeyOf<'_>) {
        let mut keys = Vec::with_capacity(rows.len());
        for r in rows {
            let st = r.row.statement();
            match self.key_of(r.row.replica, installed) {
                Some((inc, key))
                    if inc == r.row.inc && !self.po.holds_row(r.row.replica, &st, &r.sig) =>
                {
                    keys.push((key, st, r.sig));
                }
                _ => {}
            }
        }
        if keys.len() > 1 {
            let items: Vec<pk::Item<'_>> = keys
                .iter()
                .map(|(key, st, sig)| (key, &st.0[..], sig))
                .collect();
            // The verdicts are remembered; the rows' own checks read them.
            let _ = pk::verify_all_zip215(&items);
        }
    }
}
