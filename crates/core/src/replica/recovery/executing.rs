//! Recovery requests as every replica executes them (BFT-PR §4.4; their results are computed
//! by execution, `execution/recovery.rs`): each accepted one re-keys every other replica and,
//! under Prime, installs the recovering replica's fresh order key; their replicated results
//! say which checkpoint a recovery waits for.

use super::*;
use crate::execution::{Recoveries, RecoveryRules};

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// How this replica's execution runs recovery requests (see `execution/recovery.rs`).
    pub(in crate::replica) fn recoveries(&self) -> Recoveries {
        Recoveries::Run(RecoveryRules {
            n: self.cfg.n(),
            interval_min_ms: self.cfg.recovery_interval_min_ms,
            checkpoint_interval: self.cfg.checkpoint_interval,
            log_size: self.cfg.log_size,
            prime: self.proposals.order_keys(),
            interval_only: self.mutant("recovery-interval-only"),
        })
    }

    /// Replica `r`'s recovery request was accepted at `seq`: every replica but `r` refreshes
    /// its keys, so the keys an attacker may have taken from `r` stop working, and under
    /// Prime `r`'s pre-ordering numbering is fenced.
    pub(in crate::replica) fn recovery_executed(&mut self, r: ReplicaId, seq: Seq) {
        self.proposals.recovered(r);
        self.stats.recovery_requests_executed += 1;
        if !self.out.replaying {
            self.event(Event::RecoveryExecuted { replica: r, seq });
        }
        if r != self.id {
            self.rekey();
        }
    }

    /// After a state transfer: if the fetched state executed a recovery request we did not,
    /// refresh our keys as if we had executed it.
    pub(in crate::replica) fn rekey_if_recoveries_changed(
        &mut self,
        before: &BTreeMap<ClientId, u64>,
    ) {
        let changed = self.exec.replies().any(|(c, l)| {
            recovery_replica(*c).is_some_and(|r| r != self.id)
                && before.get(c).is_none_or(|t| *t < l.timestamp)
        });
        if changed {
            self.keying.refresh_soon();
        }
    }

    pub(in crate::replica) fn recovery_timestamps(&self) -> BTreeMap<ClientId, u64> {
        self.exec
            .replies()
            .filter(|(c, _)| recovery_replica(**c).is_some())
            .map(|(c, l)| (*c, l.timestamp))
            .collect()
    }

    /// Whether a replica's recovery waits for a checkpoint beyond the stable one (read from
    /// the replicated results of recovery requests, so every replica agrees): an idle primary
    /// then proposes empty batches.
    pub(in crate::replica) fn recovery_progress_target(&self) -> Option<Seq> {
        self.exec
            .replies()
            .filter(|(c, _)| recovery_replica(**c).is_some())
            .filter_map(|(_, l)| postcard::from_bytes::<RecoveryResult>(&l.result).ok())
            .map(|res| res.target)
            .filter(|t| *t > self.ordering.ckpt_votes.stable_seq())
            .max()
    }
}
