//! Key holders answer late and out of order: a call a replica or an execution node makes
//! (`Effect::Holder`) is answered `0..=Scenario::holder_delay_ms` later, each call delayed on
//! its own, so answers overtake each other; the holder acts when it answers (a flaky one may
//! fail then, see `flaky.rs`). An answer for a node that crashed, or lives again since it
//! asked, is lost, as the socket of a process that died would lose it.
//!
//! A NEW-KEY's key is installed when its admission is answered, so the checks on accepted
//! NEW-KEYs (`replay.rs`) run here.

use super::*;
use redoubt_core::holder::{perform, HolderCall, HolderRequest};

impl World {
    /// Node `to` asks its key holder.
    pub(super) fn holder_call(&mut self, to: Principal, call: HolderCall) {
        let life = self.incarnations.get(&to).copied().unwrap_or(0);
        // No draw when holders answer at once: the run's other draws stay as they were.
        let delay = match self.sc.holder_delay_ms {
            0 => 0,
            most => self.rng.random_range(0..=most),
        };
        self.stats.holder_calls += 1;
        self.schedule(self.now + delay, Ev::HolderAnswer { to, life, call });
    }

    /// The key holder of `to` (in its life `life`) answers `call`.
    pub(super) fn holder_answer(&mut self, to: Principal, life: u64, call: HolderCall) {
        if self.incarnations.get(&to).copied().unwrap_or(0) != life {
            // The node restarted since: the answer went to a process that is gone.
            self.stats.holder_answers_lost += 1;
            return;
        }
        match to {
            Principal::Replica(r) => match self.up[r as usize] {
                Up::Crashed => self.stats.holder_answers_lost += 1,
                // A paused process reads the answer when it runs again.
                Up::Paused => {
                    self.schedule(self.now + TICK_MS, Ev::HolderAnswer { to, life, call });
                }
                Up::Running => self.replica_holder_answer(r, call),
            },
            Principal::Executor(e) => self.exec_holder_answer(e, call),
            Principal::Client(_) | Principal::Filter(_) => {}
        }
    }

    fn replica_holder_answer(&mut self, r: ReplicaId, call: HolderCall) {
        let rep = &self.replicas[r as usize];
        let holder = rep.auth().holder();
        let answer = perform(holder.lock().expect("key holder").as_mut(), &call);
        let (keys_before, forgotten_before) = (
            rep.stats.new_keys_accepted,
            rep.stats.view_changes_forgotten,
        );
        let env = self.replica_env(r);
        let eff = self.replicas[r as usize].handle(env, Input::Holder(answer));
        if let HolderRequest::Admit(nk) = &call.request {
            let stats = &self.replicas[r as usize].stats;
            let accepted = stats.new_keys_accepted > keys_before;
            let forgotten = stats.view_changes_forgotten - forgotten_before;
            if accepted {
                self.new_key_accepted(r, nk);
            }
            self.check_new_key_replay(r, nk, accepted, forgotten);
        }
        self.replica_effects(r, eff);
        self.end_turn(r, env);
    }
}
