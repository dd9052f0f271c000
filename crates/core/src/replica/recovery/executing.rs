//! Recovery requests as every replica executes them (BFT-PR §4.4): accepted at most once per
//! `recovery_interval_min_ms` within a key-holder epoch, each re-keys every other replica and,
//! under Prime, installs the recovering replica's fresh order key; their replicated results
//! say which checkpoint a recovery waits for.

use super::*;

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Executes replica `r`'s recovery request (operation `op`, key-holder counter
    /// `counter`) at `seq` (agreed time `time_ms`): refused if `r`'s previous accepted
    /// recovery is more recent than `recovery_interval_min_ms`; otherwise every replica but
    /// `r` refreshes its keys, so the keys an attacker may have taken from `r` stop working,
    /// and under Prime the order key the request names replaces `r`'s (incarnation
    /// `counter`) and `r`'s pre-ordering numbering is fenced.
    pub(in crate::replica) fn execute_recovery(
        &mut self,
        r: ReplicaId,
        op: Option<RecoveryOp>,
        counter: u64,
        seq: Seq,
        time_ms: u64,
    ) -> Vec<u8> {
        let op_h_m = op.map_or(0, |op| op.h_m);
        let before = self
            .exec
            .last_reply(recovery_client(r))
            .and_then(|l| postcard::from_bytes::<RecoveryResult>(&l.result).ok());
        let previous = before.as_ref().and_then(|p| p.last_accepted_ms);
        let previous_counter = before.as_ref().and_then(|p| p.last_accepted_counter);
        let previous_key = before.and_then(|p| p.row_key);
        // Within the interval only a request of a later key-holder epoch (signed after a
        // reboot by the monitor) is accepted: one signed in advance while the replica was
        // held cannot veto its real recovery (second review, G8).
        let new_epoch = previous_counter.is_some_and(|c| epoch_of(counter) > epoch_of(c))
            && !self.mutant("recovery-interval-only");
        let accepted = new_epoch
            || previous
                .is_none_or(|t| time_ms.saturating_sub(t) >= self.cfg.recovery_interval_min_ms);
        let (k, l) = (self.cfg.checkpoint_interval, self.cfg.log_size);
        let h_r = seq / k * k + l;
        let target = if accepted {
            op_h_m.max(h_r).min(h_r + l).div_ceil(k) * k
        } else {
            0
        };
        let fresh_key = op
            .and_then(|op| op.row_key)
            .filter(|_| accepted && self.cfg.prime());
        let result = RecoveryResult {
            seq,
            accepted,
            last_accepted_ms: if accepted { Some(time_ms) } else { previous },
            last_accepted_counter: if accepted {
                Some(counter)
            } else {
                previous_counter
            },
            target,
            row_key: fresh_key.map(|k| (counter, k)).or(previous_key),
        };
        if accepted && self.cfg.prime() {
            self.prime_recovered(r);
        }
        if accepted {
            self.stats.recovery_requests_executed += 1;
            if !self.out.replaying {
                self.event(Event::RecoveryExecuted { replica: r, seq });
            }
            if r != self.id {
                self.rekey();
            }
        }
        postcard::to_stdvec(&result).expect("encodes")
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
