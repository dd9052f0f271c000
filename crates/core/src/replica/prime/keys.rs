//! Prime's order keys and incarnations (ADR 0007, "Proactive recovery replaces the order
//! key"): the key each replica's rows are verified with, as the executed state says; the
//! fresh key a recovering replica draws and adopts once its recovery request ran; the
//! masking of rows of retired incarnations; and the fence of a recovered replica's
//! pre-ordering numbering.

use super::*;
use crate::message::{recovery_client, RecoveryResult};
use crate::prime::matrix::PoAru;
use redoubt_crypto::pk;

/// Signing and checking PO-ARU rows: this replica's order keys and every replica's public
/// one as dealt at `init` (incarnation 0; a recovery installs a fresh one, named in the
/// replicated result of its recovery request).
pub(super) struct PrimeKeys {
    /// The key dealt at `init`.
    pub(super) dealt: HolderSecrets,
    /// The key our rows are signed with, and its incarnation.
    pub(super) signing: (u64, HolderSecrets),
    pub(super) orders: Arc<Vec<VerifyKey>>,
}

/// Fresh order keys kept per replica (a refused recovery request draws another), as many as
/// the journal keeps.
const DRAWN_KEYS_MAX: usize = crate::journal::ORDER_KEYS_KEPT;

impl PrimeSide {
    /// Keeps a fresh order key drawn for a recovery request of ours (the latest few).
    pub(super) fn remember_drawn(&mut self, key: HolderSecrets) {
        self.drawn.push(key);
        if self.drawn.len() > DRAWN_KEYS_MAX {
            self.drawn.remove(0);
        }
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Gives a Prime replica its keys: every replica's public order key, and its own order
    /// key (it signs its PO-ARU rows with it). A replica of a Prime cluster does nothing
    /// until it has them.
    pub fn with_prime(mut self, orders: Arc<Vec<VerifyKey>>, order_key: HolderSecrets) -> Self {
        assert_eq!(
            orders.len(),
            self.cfg.n() as usize,
            "one order key per replica"
        );
        if let Some(p) = self.prime.as_mut() {
            p.keys = Some(PrimeKeys {
                signing: (0, order_key.clone()),
                dealt: order_key,
                orders,
            });
        }
        // After a restart: the state may name an order key of ours drawn before it.
        self.prime_refresh_incarnations();
        self
    }

    /// Replica `j`'s order key in force and its incarnation, as the state we executed says:
    /// the key its latest accepted recovery installed, else the one dealt at `init`.
    pub(super) fn row_key_of(&self, j: ReplicaId) -> Option<(u64, VerifyKey)> {
        let installed = self
            .exec
            .last_reply(recovery_client(j))
            .and_then(|l| postcard::from_bytes::<RecoveryResult>(&l.result).ok())
            .and_then(|r| r.row_key);
        if installed.is_some() {
            return installed;
        }
        let p = self.prime.as_ref()?;
        p.keys.as_ref()?.orders.get(j as usize).map(|k| (0, *k))
    }

    /// The incarnation of replica `j`'s order key in force (see [`Replica::row_key_of`]).
    pub fn incarnation_of(&self, j: ReplicaId) -> u64 {
        self.row_key_of(j).map_or(0, |(inc, _)| inc)
    }

    /// Prime: the order key this replica signs its rows with, and its incarnation: what an
    /// attacker who took the process over holds (the simulator's adversary steals it).
    pub fn order_key(&self) -> Option<(u64, HolderSecrets)> {
        let keys = self.prime.as_ref()?.keys.as_ref()?;
        Some((keys.signing.0, keys.signing.1.clone()))
    }

    /// Prime: the rows of our summary matrix, and how far we hold certificates per
    /// originator (for the simulator's checks).
    pub fn prime_rows(&self) -> Option<(Vec<Option<PoAru>>, Vec<Seq>)> {
        let p = self.prime.as_ref()?;
        let rows =
            p.po.matrix()
                .rows
                .into_iter()
                .map(|r| r.map(|r| r.row))
                .collect();
        Some((rows, p.po.cum_aru().to_vec()))
    }

    /// An order key drawn for our next recovery request (journaled first, so that a restart
    /// before the request runs can still sign with it).
    pub(in crate::replica) fn draw_order_key(&mut self, seed: [u8; 32]) -> Option<VerifyKey> {
        let p = self.prime.as_mut()?;
        let key = HolderSecrets::from_seed(&seed);
        let public = key.public().verify;
        p.remember_drawn(key);
        self.persist(Record::OrderKey { seed });
        Some(public)
    }

    /// Some replica's order key may have changed (a recovery request ran here, a state was
    /// fetched, or the journal replayed): rows signed with retired keys leave our matrix, and
    /// our own rows are signed with the key now in force if we hold it.
    pub(in crate::replica) fn prime_refresh_incarnations(&mut self) {
        let n = self.cfg.n();
        let Some(incs) = (0..n)
            .map(|j| self.row_key_of(j))
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        let me = self.id as usize;
        let Some(p) = self.prime.as_mut() else {
            return;
        };
        for (j, (inc, _)) in incs.iter().enumerate() {
            p.po.retire_rows(j as ReplicaId, *inc);
        }
        let (inc, key) = incs[me];
        let Some(keys) = p.keys.as_mut() else {
            return;
        };
        if keys.signing.0 == inc {
            return;
        }
        let found = if inc == 0 {
            Some(keys.dealt.clone())
        } else {
            p.drawn.iter().find(|k| k.public().verify == key).cloned()
        };
        if let Some(k) = found {
            keys.signing = (inc, k);
            p.po.set_incarnation(inc);
            p.row = None;
            self.stats.order_keys_installed += 1;
        }
    }

    /// Whether we may introduce PO-REQUESTs and sign rows: our rows' key is the one in force,
    /// and a recovery of ours has had its request executed here (before that, our numbering
    /// is about to be fenced, and the key in force is the one an attacker may hold).
    pub(super) fn prime_may_speak(&self) -> bool {
        let Some(inc) = self
            .prime
            .as_ref()
            .and_then(|p| p.keys.as_ref())
            .map(|k| k.signing.0)
        else {
            return false;
        };
        inc == self.incarnation_of(self.id) && self.recovery_incarnated(inc)
    }

    /// Ordinal execution fenced the numbering of the replicas whose recovery request it ran:
    /// every number up to the window above what it had made eligible counts as executed. The
    /// old incarnation's PO-REQUESTs in that range (which an attacker may have introduced
    /// with the replica's keys) never run, and the recovered replica numbers from above it,
    /// so it never contradicts them. Every correct replica accepted its PO-REQUESTs only
    /// within the window above what it had executed, which the fence covers.
    pub(in crate::replica) fn prime_fence(&mut self, after: &[Seq]) -> Vec<Seq> {
        let mut fenced = after.to_vec();
        let window = self.cfg.prime_window;
        if let Some(p) = self.prime.as_mut() {
            for r in std::mem::take(&mut p.fences) {
                if let Some(e) = fenced.get_mut(r as usize) {
                    *e += window;
                }
            }
        }
        fenced
    }

    /// Replica `r`'s recovery request was accepted in the ordinal executing now.
    pub(in crate::replica) fn prime_recovered(&mut self, r: ReplicaId) {
        if let Some(p) = self.prime.as_mut() {
            p.fences.push(r);
        }
    }

    /// A recovery starts here: what the journal gave back of pre-ordering is not trusted.
    pub(in crate::replica) fn prime_forget(&mut self) {
        let forget_own = self.mutant("forget-own-acks");
        if let Some(p) = self.prime.as_mut() {
            p.po.forget_all();
            #[cfg(feature = "mutants")]
            if forget_own {
                p.po.forget_own_acks();
            }
            let _ = forget_own;
            p.row = None;
        }
    }

    /// Whether the row's replica signed `statement` with its order key in force. A row we
    /// already hold is not checked again: every proposal repeats the rows its backups
    /// received themselves (an Ed25519 verification each, on the ordering path). In a
    /// proposal (`in_proposal`), a row of an incarnation a recovery retired passes unchecked:
    /// it counts for nothing where the ordinal runs ([`Matrix::masked`]), and a leader that
    /// has not run the recovery yet may still hold it. Of a later incarnation than we know,
    /// a row cannot be checked until we run the recovery that installed its key.
    pub(super) fn row_signature_valid(
        &self,
        row: &PoAru,
        statement: &Digest,
        sig: &pk::Signature,
        in_proposal: bool,
    ) -> bool {
        let Some(p) = self.prime.as_ref() else {
            return false;
        };
        let Some((inc, key)) = self.row_key_of(row.replica) else {
            return false;
        };
        if row.inc < inc && in_proposal {
            return true;
        }
        if row.inc != inc {
            return false;
        }
        p.po.holds_row(row.replica, statement, sig) || pk::verify(&key, &statement.0, sig)
    }

    /// Checks a proposed matrix: shape, and every row's signature.
    pub(in crate::replica) fn matrix_valid(&self, m: &Matrix) -> bool {
        m.check(self.cfg.n() as usize, |r, st, sig| {
            self.row_signature_valid(r, st, sig, true)
        })
        .is_ok()
    }

    /// The matrix `m` as the next ordinal counts it: rows of retired incarnations emptied.
    pub(super) fn counted(&self, m: &Matrix) -> Matrix {
        let incs: Vec<u64> = (0..self.cfg.n()).map(|j| self.incarnation_of(j)).collect();
        m.masked(|j| incs.get(j as usize).copied().unwrap_or(0))
    }
}
