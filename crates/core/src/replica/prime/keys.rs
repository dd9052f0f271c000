//! Prime's order keys on the replica: which key a recovery installed is read from the
//! executed state (the replicated result of its recovery request); Prime's component
//! (`crate::prime::side`) keeps the rest.

use super::*;
use crate::message::{recovery_client, RecoveryResult};
use crate::prime::matrix::PoAru;
use redoubt_crypto::pk::{HolderSecrets, VerifyKey};

/// Replica `j`'s order key its latest accepted recovery installed, as the state `exec`
/// executed says.
pub(in crate::replica) fn installed_key<S: Service>(
    exec: &Execution<S>,
    j: ReplicaId,
) -> Option<(u64, VerifyKey)> {
    exec.last_reply(recovery_client(j))
        .and_then(|l| postcard::from_bytes::<RecoveryResult>(&l.result).ok())
        .and_then(|r| r.row_key)
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Gives a Prime replica its keys: every replica's public order key, and its own order
    /// key (it signs its PO-ARU rows with it). A replica of a Prime cluster does nothing
    /// until it has them.
    pub fn with_prime(mut self, orders: Arc<Vec<VerifyKey>>, order_key: HolderSecrets) -> Self {
        if let Some(p) = self.prime.as_mut() {
            p.set_keys(orders, order_key);
        }
        // After a restart: the state may name an order key of ours drawn before it.
        self.prime_refresh_incarnations();
        self
    }

    /// Replica `j`'s order key in force and its incarnation, as the state we executed says:
    /// the key its latest accepted recovery installed, else the one dealt at `init`.
    fn row_key_of(&self, j: ReplicaId) -> Option<(u64, VerifyKey)> {
        let exec = &self.exec;
        match self.prime.as_ref() {
            Some(p) => p.key_of(j, &|j| installed_key(exec, j)),
            None => installed_key(exec, j),
        }
    }

    /// The incarnation of replica `j`'s order key in force (see [`Replica::row_key_of`]).
    pub fn incarnation_of(&self, j: ReplicaId) -> u64 {
        self.row_key_of(j).map_or(0, |(inc, _)| inc)
    }

    /// Prime: the order key this replica signs its rows with, and its incarnation: what an
    /// attacker who took the process over holds (the simulator's adversary steals it).
    pub fn order_key(&self) -> Option<(u64, HolderSecrets)> {
        self.prime.as_ref()?.order_key()
    }

    /// Prime: the rows of our summary matrix, and how far we hold certificates per
    /// originator (for the simulator's checks).
    pub fn prime_rows(&self) -> Option<(Vec<Option<PoAru>>, Vec<Seq>)> {
        Some(self.prime.as_ref()?.rows())
    }

    /// An order key drawn for our next recovery request (journaled first, so that a restart
    /// before the request runs can still sign with it).
    pub(in crate::replica) fn draw_order_key(&mut self, seed: [u8; 32]) -> Option<VerifyKey> {
        let public = self.prime.as_mut()?.draw_order_key(seed);
        self.prime_apply();
        Some(public)
    }

    /// Some replica's order key may have changed (a recovery request ran here, a state was
    /// fetched, or the journal replayed): see [`PrimeSide::refresh_incarnations`].
    pub(in crate::replica) fn prime_refresh_incarnations(&mut self) {
        let exec = &self.exec;
        let Some(p) = self.prime.as_mut() else {
            return;
        };
        if p.refresh_incarnations(&|j| installed_key(exec, j)) {
            self.stats.order_keys_installed += 1;
        }
    }

    /// Whether we may introduce PO-REQUESTs and sign rows: our rows' key is the one in force,
    /// and a recovery of ours has had its request executed here (before that, our numbering
    /// is about to be fenced, and the key in force is the one an attacker may hold).
    pub(super) fn prime_may_speak(&self) -> bool {
        let Some(inc) = self.prime.as_ref().and_then(|p| p.signing_incarnation()) else {
            return false;
        };
        inc == self.incarnation_of(self.id) && self.recovery_incarnated(inc)
    }

    /// The numbering of replicas whose recovery request ran in this ordinal is fenced (see
    /// [`PrimeSide::fence`]).
    pub(in crate::replica) fn prime_fence(&mut self, after: &[Seq]) -> Vec<Seq> {
        match self.prime.as_mut() {
            Some(p) => p.fence(after),
            None => after.to_vec(),
        }
    }

    /// Replica `r`'s recovery request was accepted in the ordinal executing now.
    pub(in crate::replica) fn prime_recovered(&mut self, r: ReplicaId) {
        if let Some(p) = self.prime.as_mut() {
            p.recovered(r);
        }
    }

    /// A recovery starts here: what the journal gave back of pre-ordering is not trusted.
    pub(in crate::replica) fn prime_forget(&mut self) {
        let forget_own = self.mutant("forget-own-acks");
        if let Some(p) = self.prime.as_mut() {
            p.forget(forget_own);
        }
    }

    /// Checks a proposed matrix: shape, and every row's signature.
    pub(in crate::replica) fn matrix_valid(&self, m: &Matrix) -> bool {
        let exec = &self.exec;
        self.prime
            .as_ref()
            .is_some_and(|p| p.matrix_valid(m, &|j| installed_key(exec, j)))
    }

    /// The matrix `m` as the next ordinal counts it: rows of retired incarnations emptied.
    pub(super) fn counted(&self, m: &Matrix) -> Matrix {
        let exec = &self.exec;
        match self.prime.as_ref() {
            Some(p) => p.counted(m, &|j| installed_key(exec, j)),
            None => m.masked(|j| installed_key(exec, j).map_or(0, |(inc, _)| inc)),
        }
    }
}
