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
        if let Some(p) = self.proposals.prime_mut() {
            p.set_keys(orders, order_key);
        }
        // After a restart: the state may name an order key of ours drawn before it.
        self.refresh_incarnations();
        self
    }

    /// Replica `j`'s order key in force and its incarnation, as the state we executed says:
    /// the key its latest accepted recovery installed, else the one dealt at `init`.
    fn row_key_of(&self, j: ReplicaId) -> Option<(u64, VerifyKey)> {
        let exec = &self.exec;
        match self.proposals.prime() {
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
        self.proposals.prime()?.order_key()
    }

    /// Prime: the rows of our summary matrix, and how far we hold certificates per
    /// originator (for the simulator's checks).
    pub fn prime_rows(&self) -> Option<(Vec<Option<PoAru>>, Vec<Seq>)> {
        Some(self.proposals.prime()?.rows())
    }

    /// An order key drawn for our next recovery request (journaled first, so that a restart
    /// before the request runs can still sign with it).
    pub(in crate::replica) fn draw_order_key(&mut self, seed: [u8; 32]) -> Option<VerifyKey> {
        let public = self.proposals.prime_mut()?.draw_order_key(seed);
        self.apply_proposals();
        Some(public)
    }

    /// Whether we may introduce PO-REQUESTs and sign rows: our rows' key is the one in force,
    /// and a recovery of ours has had its request executed here (before that, our numbering
    /// is about to be fenced, and the key in force is the one an attacker may hold).
    pub(super) fn prime_may_speak(&self) -> bool {
        let Some(inc) = self.proposals.prime().and_then(|p| p.signing_incarnation()) else {
            return false;
        };
        inc == self.incarnation_of(self.id) && self.recovery_incarnated(inc)
    }
}
