//! The event loop's dispatch: what each scheduled event does to the world.

use super::*;

impl World {
    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { to, from, bytes } => self.deliver(to, from, bytes),
            Ev::TickReplica(r) => {
                if self.up[r as usize] == Up::Running {
                    let env = self.replica_env(r);
                    let eff = self.replicas[r as usize].handle(env, Input::Tick);
                    self.replica_effects(r, eff);
                }
                self.schedule(self.now + TICK_MS, Ev::TickReplica(r));
            }
            Ev::TickExec(e) => self.tick_exec(e),
            Ev::TickFilter(x) => self.tick_filter(x),
            Ev::ExecOff(e) => self.exec_power(e, false),
            Ev::ExecOn(e) => self.exec_power(e, true),
            Ev::TickClient(c) => {
                let env = self.env();
                let eff = self.clients[c].core.tick(env);
                let from = Principal::Client(self.clients[c].core.id());
                for e in eff {
                    if let Effect::Send { to, bytes } = e {
                        self.transmit(from, to, bytes.to_vec(), 0);
                    }
                }
                if self.clients[c].done < self.sc.ops_per_client {
                    self.schedule(self.now + TICK_MS, Ev::TickClient(c));
                }
            }
            Ev::ClientNext(c) => {
                if self.clients[c].done >= self.sc.ops_per_client
                    || self.clients[c].current.is_some()
                {
                    return;
                }
                let op = self.next_op(c);
                let env = self.env();
                let id = self.clients[c].core.id();
                let read_only = op.is_read_only();
                match self.clients[c].core.invoke(env, op.encode(), read_only) {
                    Ok((ts, eff)) => {
                        self.log(|| format!("c{id} invoke t{ts} {op:?}"));
                        self.history.push(Operation {
                            client: id,
                            invoke_ms: self.now,
                            complete_ms: None,
                            op,
                            result: None,
                        });
                        self.clients[c].current = Some(self.history.len() - 1);
                        for e in eff {
                            if let Effect::Send { to, bytes } = e {
                                self.transmit(Principal::Client(id), to, bytes.to_vec(), 0);
                            }
                        }
                    }
                    // The key holder failed to open a body session: an application tries
                    // again (only expected where holders fail).
                    Err(redoubt_core::client::InvokeError::NoBodySession)
                        if self.sc.holder_fail > 0.0 =>
                    {
                        self.schedule(self.now + TICK_MS, Ev::ClientNext(c));
                    }
                    Err(e) => self.violation(format!("client c{id} refused invoke: {e}")),
                }
            }
            Ev::ByzClient(i) => {
                self.byz_client_act(i);
                let next = self.now + self.rng.random_range(20..200);
                let patient = self.byz_clients[i].attack == ClientAttack::Patient;
                if patient || !self.healed() || self.now < self.sc.heal_ms + 5000 {
                    self.schedule(next, Ev::ByzClient(i));
                }
            }
            Ev::Crash(r) => {
                self.log(|| format!("r{r} CRASH (amnesia)"));
                self.up[r as usize] = Up::Crashed;
            }
            Ev::Restart(r) => {
                self.log(|| format!("r{r} RESTART with empty state"));
                let keys = replica_keys(self.session_keys(Principal::Replica(r)), self.sc.mutant);
                // The replica lost its disk: journal and pages.
                self.stores[r as usize].wipe();
                self.disks[r as usize].clear();
                let state = open_state(Box::new(self.stores[r as usize].clone())).expect("memory");
                let rep = Replica::new(self.sc.core.clone(), r, keys, KvService::new(), state);
                self.replicas[r as usize] = self.arm_replica(r, rep);
                self.new_life(r);
                self.up[r as usize] = Up::Running;
            }
            Ev::Corrupt(r) => {
                let kind = match self.sc.corruption_kind {
                    CorruptionKind::Random => match self.rng.random_range(0..3) {
                        0 => CorruptionKind::BadWrite,
                        1 => CorruptionKind::PagesThenScrub,
                        _ => CorruptionKind::PagesThenReboot,
                    },
                    k => k,
                };
                if kind == CorruptionKind::BadWrite {
                    // Execution went wrong: a write the others did not make, digested like
                    // any other. Found when f+1 others vouch for a different checkpoint.
                    self.log(|| format!("r{r} STATE CORRUPTED (bad write)"));
                    let op = KvOp::Put {
                        key: b"corrupted".to_vec(),
                        value: self.rng.random::<u64>().to_le_bytes().to_vec(),
                    };
                    let ctx = redoubt_core::ExecContext {
                        seq: 0,
                        client: 0,
                        time_ms: 0,
                        batch_seed: 0,
                        index: 0,
                    };
                    self.replicas[r as usize].tamper(|svc, st| {
                        redoubt_core::Service::execute(svc, st, &op.encode(), &ctx);
                    });
                } else {
                    // The medium flips bytes of stored pages: no digest changes. Found by a
                    // state check, on demand (a scrub) or at start-up (a reboot).
                    let pages = sim_geometry().pages();
                    let hits = self.rng.random_range(1..=3);
                    for _ in 0..hits {
                        let p = self.rng.random_range(0..pages);
                        let off = self.rng.random_range(0..sim_geometry().page_size());
                        let b = self.rng.random::<u8>() | 1;
                        self.stores[r as usize].corrupt(p, off, &[b]);
                    }
                    self.log(|| format!("r{r} {hits} STORED PAGES CORRUPTED"));
                    self.unscrubbed.insert(r);
                    let later = self.now + self.rng.random_range(50..1000);
                    if kind == CorruptionKind::PagesThenScrub {
                        self.schedule(later, Ev::CheckState(r));
                    } else {
                        self.schedule(self.now + 1, Ev::PowerOff(r));
                        self.schedule(later, Ev::Reboot(r));
                    }
                }
                self.corrupted.push(r);
            }
            Ev::CheckState(r) => {
                if self.up[r as usize] != Up::Running {
                    self.schedule(self.now + 200, Ev::CheckState(r));
                } else {
                    self.unscrubbed.remove(&r);
                    let bad = self.replicas[r as usize].check_state();
                    self.log(|| format!("r{r} STATE CHECK: corrupt pages {bad:?}"));
                }
            }
            Ev::PowerOff(r) => {
                if self.up[r as usize] == Up::Running && self.rng.random_bool(0.5) {
                    // It strikes during the replica's next step.
                    self.cut_mid_step.insert(r);
                } else {
                    self.log(|| format!("r{r} POWER OFF (disk kept)"));
                    self.up[r as usize] = Up::Crashed;
                }
            }
            Ev::Reboot(r) => {
                if self.cut_mid_step.remove(&r) {
                    // It took no step since: the power failed between steps.
                    self.up[r as usize] = Up::Crashed;
                }
                let keys = replica_keys(self.session_keys(Principal::Replica(r)), self.sc.mutant);
                let records = self.disks[r as usize].clone();
                let n = records.len();
                self.log(|| {
                    let kinds: Vec<&str> = records.iter().map(|x| x.kind()).collect();
                    format!("r{r} REBOOT from {n} journal records ({})", kinds.join(" "))
                });
                self.unscrubbed.remove(&r);
                let state = match open_state(Box::new(self.stores[r as usize].clone())) {
                    Ok(s) => s,
                    Err(e) => {
                        self.violation(format!("r{r} cannot open its state: {e}"));
                        return;
                    }
                };
                match Replica::restore(
                    self.sc.core.clone(),
                    r,
                    keys,
                    KvService::new(),
                    state,
                    &records,
                    true,
                ) {
                    Ok(rep) => {
                        let rep = self.arm_replica(r, rep);
                        let cut = self.cut_before_reboot.remove(&r);
                        // A key holder that fails while the journal is replayed (a body
                        // session it does not open) stops the replay short: the replica
                        // comes back behind its journal and executes the rest again later
                        // (the agreement checker still compares every batch it executes).
                        let short = self.sc.holder_fail > 0.0;
                        if let Some(v) =
                            self.checker.restarted(r, rep.last_executed(), cut || short)
                        {
                            self.violation(v);
                        }
                        self.replicas[r as usize] = rep;
                        self.up[r as usize] = Up::Running;
                        self.replay_new_keys_to(r);
                        if self.awaiting_recovery.is_some_and(|(w, _)| w == r) {
                            // Power failed mid-recovery: the recovery monitor starts it again.
                            let env = self.replica_env(r);
                            let eff = self.replicas[r as usize].handle(env, Input::Recover);
                            self.replica_effects(r, eff);
                        }
                    }
                    Err(e) => self.violation(format!("r{r} cannot restart from its journal: {e}")),
                }
            }
            Ev::Pause(r) => {
                self.log(|| format!("r{r} PAUSE"));
                if self.up[r as usize] == Up::Running {
                    self.up[r as usize] = Up::Paused;
                }
            }
            Ev::Resume(r) => {
                self.log(|| format!("r{r} RESUME"));
                if self.up[r as usize] == Up::Paused {
                    self.up[r as usize] = Up::Running;
                }
            }
            Ev::Compromise(r) => self.compromise(r),
            Ev::Watchdog(r) => self.watchdog(r),
            Ev::Presign(r) => self.presign_recovery(r),
            Ev::SplitRecover => self.split_recover(),
            Ev::RoutineRecovery(r) => self.routine_recovery_in_turn(r),
            Ev::Forge => {
                self.forge();
                let next = self.now + self.rng.random_range(20..150);
                self.schedule(next, Ev::Forge);
            }
            Ev::DeliverForged {
                to,
                bytes,
                stolen_at,
            } => self.deliver_forged(to, bytes, stolen_at),
            Ev::Plant(r) => self.plant_tick(r),
            Ev::ReleaseHeld(r) => self.release_held(r),
            Ev::JoinAttack { step } => self.join_attack(step),
            Ev::JoinAcks { tries } => self.join_acks(tries),
            Ev::RecoveredCheck {
                r,
                recovered_at,
                target,
            } => self.recovered_check(r, recovered_at, target),
            Ev::HolderAnswer { to, life, call } => self.holder_answer(to, life, call),
            Ev::StepDown => {
                // The replica that believes it is primary hands over.
                for r in 0..self.sc.core.n() {
                    let rep = &self.replicas[r as usize];
                    if rep.is_primary() && rep.is_normal() && self.up[r as usize] == Up::Running {
                        self.log(|| format!("r{r} STEP DOWN"));
                        let env = self.replica_env(r);
                        let eff = self.replicas[r as usize].handle(env, Input::StepDown);
                        self.replica_effects(r, eff);
                    }
                }
            }
        }
    }
}
