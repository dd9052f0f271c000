//! A replica's effects in the world: messages to the network, events to the checkers, and
//! writes to its disk (journal records, state commits), which a power failure may cut short.

use super::*;

impl World {
    /// Routes the effects of a replica.
    pub(super) fn replica_effects(&mut self, r: ReplicaId, effects: Vec<Effect>) {
        // After every step, each component of the replica's core checks its invariants.
        if let Err(e) = self.replicas[r as usize].check_invariants() {
            self.violation(format!("r{r} broke an invariant of its core: {e}"));
        }
        if self.cut_mid_step.remove(&r) {
            self.power_cut(r, effects);
            return;
        }
        let n = self.sc.core.n();
        for e in effects {
            match e {
                Effect::Send { to, bytes } => self.replica_send(r, to, bytes.to_vec()),
                Effect::Broadcast { bytes } => {
                    for t in 0..n {
                        if t != r {
                            self.replica_send(r, Principal::Replica(t), bytes.to_vec());
                        }
                    }
                }
                Effect::Event(ev) => self.observe(r, ev),
                e @ (Effect::Persist(_) | Effect::CommitState(_)) => self.write(r, e),
                Effect::Holder(call) => self.holder_call(Principal::Replica(r), call),
            }
        }
    }

    /// A write of replica `r` reaches its disk: a journal record, or a move of the state's
    /// durable base.
    fn write(&mut self, r: ReplicaId, e: Effect) {
        match e {
            Effect::Persist(rec) => {
                let checkpoint = redoubt_core::journal::compacts_after(&rec);
                self.disks[r as usize].push(rec);
                if checkpoint {
                    let d = std::mem::take(&mut self.disks[r as usize]);
                    self.disks[r as usize] = redoubt_core::journal::compact(d);
                }
            }
            Effect::CommitState(c) => {
                let mut store = self.stores[r as usize].clone();
                if let Err(e) = c.apply(&mut store) {
                    self.violation(format!("r{r} state commit failed in memory: {e}"));
                }
            }
            _ => unreachable!("not a write"),
        }
    }

    /// The power of replica `r` fails while it performs the effects of a step: the first k of
    /// its writes reach the disk (k drawn, in order, as a host syncing the journal before
    /// sending would leave them); no message leaves. Its events are still observed (what it
    /// did in memory must agree too; see `Checker::restarted`).
    fn power_cut(&mut self, r: ReplicaId, effects: Vec<Effect>) {
        let mut writes = Vec::new();
        for e in effects {
            match e {
                // What it did in memory before the failure is still checked.
                Effect::Event(ev) => self.observe(r, ev),
                Effect::Persist(_) | Effect::CommitState(_) => writes.push(e),
                // Nothing leaves the process: no message, no call to the key holder.
                Effect::Send { .. } | Effect::Broadcast { .. } | Effect::Holder(_) => {}
            }
        }
        let total = writes.len();
        let k = self.rng.random_range(0..=total);
        for e in writes.into_iter().take(k) {
            self.write(r, e);
        }
        self.log(|| format!("r{r} POWER OFF mid-step ({k} of {total} writes reached the disk)"));
        self.stats.power_cuts_mid_step += 1;
        self.cut_before_reboot.insert(r);
        self.up[r as usize] = Up::Crashed;
    }
}
