//! Prime clusters in the simulator: every replica's order key (it signs its PO-ARU rows), as
//! `redoubt init --ordering prime` deals them in a deployment.

use super::*;
use redoubt_crypto::pk::{HolderSecrets, VerifyKey};

/// The replicas' order keys.
pub(super) struct PrimeDeal {
    pub(super) orders: Arc<Vec<VerifyKey>>,
    pub(super) order_keys: Vec<HolderSecrets>,
}

impl World {
    /// Deals the replicas' order keys from the run's master secret (none without Prime).
    pub(super) fn deal_prime(sc: &Scenario, master: &[u8]) -> Option<PrimeDeal> {
        if !sc.core.prime() {
            return None;
        }
        let order_keys: Vec<HolderSecrets> = (0..sc.core.n())
            .map(|r| {
                let what = format!("prime order key r{r}");
                HolderSecrets::from_seed(
                    blake3::keyed_hash(&super::filters::master_key(master), what.as_bytes())
                        .as_bytes(),
                )
            })
            .collect();
        Some(PrimeDeal {
            orders: Arc::new(order_keys.iter().map(|k| k.public().verify).collect()),
            order_keys,
        })
    }
}

/// A replica with the keys its deployment gives it: the firewall's, Prime's, or none.
pub(super) fn arm(
    dealt: &Option<super::filters::Dealt>,
    prime: &Option<PrimeDeal>,
    r: ReplicaId,
    rep: Replica<KvService, SessionKeys>,
) -> Replica<KvService, SessionKeys> {
    let rep = match dealt {
        Some(d) => rep.with_firewall(d.keys.clone(), d.order_keys[r as usize].clone()),
        None => rep,
    };
    match prime {
        Some(p) => rep.with_prime(p.orders.clone(), p.order_keys[r as usize].clone()),
        None => rep,
    }
}
