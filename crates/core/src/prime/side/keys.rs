//! Prime's order keys and incarnations (ADR 0007, "Proactive recovery replaces the order
//! key"): the key each replica's rows are verified with; the fresh key a recovering replica
//! draws and adopts once its recovery request ran; the masking of rows of retired
//! incarnations; and the fence of a recovered replica's pre-ordering numbering.
//!
//! Which key a recovery installed is part of the replicated state (the result of its
//! recovery request): the host passes it in as a [`KeyOf`].

use super::*;

/// Fresh order keys kept per replica (a refused recovery request draws another), as many as
/// the journal keeps.
const DRAWN_KEYS_MAX: usize = crate::journal::ORDER_KEYS_KEPT;

/// Signing and checking PO-ARU rows.
#[derive(Default)]
pub(super) struct PrimeKeys {
    /// This replica's order keys and every replica's public one as dealt at `init`; none
    /// until the host gives them (a replica of a Prime cluster does nothing before).
    dealt: Option<Dealt>,
    /// Fresh order keys drawn for our recovery requests (the latest few, from the journal
    /// after a restart): the one our accepted recovery named becomes ours when it executes
    /// here.
    drawn: Vec<HolderSecrets>,
    /// Replicas whose accepted recovery request the ordinal executing now ran: their
    /// pre-ordering numbering is fenced when it completes.
    fences: Vec<ReplicaId>,
}

struct Dealt {
    /// The key dealt at `init`.
    own: HolderSecrets,
    /// The key our rows are signed with, and its incarnation.
    signing: (u64, HolderSecrets),
    orders: Arc<Vec<VerifyKey>>,
}

impl PrimeKeys {
    pub(super) fn remember_drawn(&mut self, key: HolderSecrets) {
        self.drawn.push(key);
        if self.drawn.len() > DRAWN_KEYS_MAX {
            self.drawn.remove(0);
        }
    }

    pub(super) fn signing_key(&self) -> Option<&HolderSecrets> {
        self.dealt.as_ref().map(|d| &d.signing.1)
    }
}

impl PrimeSide {
    /// Gives Prime its keys: every replica's public order key, and our own order key (we
    /// sign our PO-ARU rows with it).
    pub fn set_keys(&mut self, orders: Arc<Vec<VerifyKey>>, order_key: HolderSecrets) {
        assert_eq!(
            orders.len(),
            self.cfg.n() as usize,
            "one order key per replica"
        );
        self.keys.dealt = Some(Dealt {
            signing: (0, order_key.clone()),
            own: order_key,
            orders,
        });
    }

    /// Whether Prime has its keys (it does nothing before).
    pub fn ready(&self) -> bool {
        self.keys.dealt.is_some()
    }

    /// Replica `j`'s order key in force and its incarnation: the key its latest accepted
    /// recovery installed (`installed`), else the one dealt at `init`.
    pub fn key_of(&self, j: ReplicaId, installed: KeyOf<'_>) -> Option<(u64, VerifyKey)> {
        if let Some(k) = installed(j) {
            return Some(k);
        }
        let d = self.keys.dealt.as_ref()?;
        d.orders.get(j as usize).map(|k| (0, *k))
    }

    /// The order key we sign our rows with, and its incarnation.
    pub fn order_key(&self) -> Option<(u64, HolderSecrets)> {
        let d = self.keys.dealt.as_ref()?;
        Some((d.signing.0, d.signing.1.clone()))
    }

    /// The incarnation of the key we sign with.
    pub fn signing_incarnation(&self) -> Option<u64> {
        self.keys.dealt.as_ref().map(|d| d.signing.0)
    }

    /// An order key drawn for our next recovery request (journaled first, so that a restart
    /// before the request runs can still sign with it); returns its public half.
    pub fn draw_order_key(&mut self, seed: [u8; 32]) -> VerifyKey {
        let key = HolderSecrets::from_seed(&seed);
        let public = key.public().verify;
        self.keys.remember_drawn(key);
        self.persist(Record::OrderKey { seed });
        public
    }

    /// Some replica's order key may have changed (a recovery request ran here, a state was
    /// fetched, or the journal replayed): rows signed with retired keys leave our matrix, and
    /// our own rows are signed with the key now in force if we hold it. True if we took a
    /// new key.
    pub fn refresh_incarnations(&mut self, installed: KeyOf<'_>) -> bool {
        let n = self.cfg.n();
        let Some(incs) = (0..n)
            .map(|j| self.key_of(j, installed))
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        for (j, (inc, _)) in incs.iter().enumerate() {
            self.po.retire_rows(j as ReplicaId, *inc);
        }
        let (inc, key) = incs[self.me as usize];
        let Some(d) = self.keys.dealt.as_mut() else {
            return false;
        };
        if d.signing.0 == inc {
            return false;
        }
        let found = if inc == 0 {
            Some(d.own.clone())
        } else {
            self.keys
                .drawn
                .iter()
                .find(|k| k.public().verify == key)
                .cloned()
        };
        let Some(k) = found else {
            return false;
        };
        d.signing = (inc, k);
        self.po.set_incarnation(inc);
        self.row = None;
        true
    }

    /// Ordinal execution fenced the numbering of the replicas whose recovery request it ran:
    /// every number up to the window above what it had made eligible counts as executed. The
    /// old incarnation's PO-REQUESTs in that range (which an attacker may have introduced
    /// with the replica's keys) never run, and the recovered replica numbers from above it,
    /// so it never contradicts them. Every correct replica accepted its PO-REQUESTs only
    /// within the window above what it had executed, which the fence covers.
    pub fn fence(&mut self, after: &[Seq]) -> Vec<Seq> {
        let mut fenced = after.to_vec();
        let window = self.cfg.prime_window;
        for r in std::mem::take(&mut self.keys.fences) {
            if let Some(e) = fenced.get_mut(r as usize) {
                *e += window;
            }
        }
        fenced
    }

    /// Replica `r`'s recovery request was accepted in the ordinal executing now.
    pub fn recovered(&mut self, r: ReplicaId) {
        self.keys.fences.push(r);
    }

    /// Whether the row's replica signed `statement` with its order key in force. A row we
    /// already hold is not checked again: every proposal repeats the rows its backups
    /// received themselves (an Ed25519 verification each, on the ordering path, under ZIP
    /// 215's rules as in the batches of [`PrimeSide::check_rows_together`]). In a
    /// proposal (`in_proposal`), a row of an incarnation a recovery retired passes unchecked:
    /// it counts for nothing where the ordinal runs ([`Matrix::masked`]), and a leader that
    /// has not run the recovery yet may still hold it. Of a later incarnation than we know,
    /// a row cannot be checked until we run the recovery that installed its key.
    pub fn row_signature_valid(
        &self,
        row: &PoAru,
        statement: &Digest,
        sig: &pk::Signature,
        in_proposal: bool,
        installed: KeyOf<'_>,
    ) -> bool {
        let Some((inc, key)) = self.key_of(row.replica, installed) else {
            return false;
        };
        if row.inc < inc && in_proposal {
            return true;
        }
        if row.inc != inc {
            return false;
        }
        self.po.holds_row(row.replica, statement, sig) || pk::verify_zip215(&key, &statement.0, sig)
    }

    /// Checks a proposed matrix: shape, and every row's signature.
    pub fn matrix_valid(&self, m: &Matrix, installed: KeyOf<'_>) -> bool {
        m.check(self.cfg.n() as usize, |r, st, sig| {
            self.row_signature_valid(r, st, sig, true, installed)
        })
        .is_ok()
    }

    /// The matrix `m` as the next ordinal counts it: rows of retired incarnations emptied.
    pub fn counted(&self, m: &Matrix, installed: KeyOf<'_>) -> Matrix {
        let incs: Vec<u64> = (0..self.cfg.n())
            .map(|j| self.key_of(j, installed).map_or(0, |(inc, _)| inc))
            .collect();
        m.masked(|j| incs.get(j as usize).copied().unwrap_or(0))
    }
}
