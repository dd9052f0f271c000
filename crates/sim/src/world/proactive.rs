//! Proactive recovery under attack: compromising a replica, the watchdog taking it back, and
//! frames forged with the keys the adversary stole.

use super::*;
use redoubt_core::message::PbftMessage;
use redoubt_core::message::{recovery_client, RecoveryOp};

impl World {
    /// The adversary takes replica `r`: it learns its keys (and keeps learning while it holds
    /// it), runs its behaviour, and flips bytes of its stored pages.
    pub(super) fn compromise(&mut self, r: ReplicaId) {
        let Some(p) = self.sc.proactive.clone() else {
            return;
        };
        if self.up[r as usize] != Up::Running || self.compromised.is_some() {
            self.schedule(self.now + 200, Ev::Compromise(r));
            return;
        }
        self.stats.compromises += 1;
        let k = self.stats.compromises;
        self.log(|| format!("r{r} COMPROMISED (#{k})"));
        self.compromised = Some(r);
        self.adversary.take(r, p.behavior);
        self.checker.set_faulty(r, true, 0);
        self.adversary_key_gen.remove(&r);
        self.stolen.push(Stolen {
            replica: r,
            keys: self.replicas[r as usize].auth().steal(),
            frozen_at: None,
        });
        let pages = sim_geometry().pages();
        for _ in 0..self.rng.random_range(1..=3) {
            let page = self.rng.random_range(0..pages);
            let off = self.rng.random_range(0..sim_geometry().page_size());
            let b = self.rng.random::<u8>() | 1;
            self.stores[r as usize].corrupt(page, off, &[b]);
        }
        if !self.corrupted.contains(&r) {
            self.corrupted.push(r);
        }
        self.unscrubbed.insert(r);
        let hold = self.rng.random_range(p.hold_ms.0..=p.hold_ms.1);
        self.schedule(self.now + hold, Ev::Watchdog(r));
        if self.sc.presign_recovery {
            self.schedule(self.now + hold / 2, Ev::Presign(r));
        }
        self.plant_on_compromise(r);
    }

    /// The adversary, holding replica `r`, has its key holder sign a recovery request (as
    /// the replica's own recovery would, with H_M 0 and no order key) and sends it to every
    /// replica, so that it executes before the watchdog reboots `r` (second review, G8).
    pub(super) fn presign_recovery(&mut self, r: ReplicaId) {
        if self.compromised != Some(r) {
            return;
        }
        let n = self.sc.core.n();
        let keys = self.replicas[r as usize].auth().clone();
        let content = RecoveryOp::content_digest(r, 0, None);
        let Ok((counter, sig)) =
            keys.with_holder(|h| h.sign(redoubt_core::keys::Purpose::Recovery, &content))
        else {
            return;
        };
        let op = RecoveryOp {
            replica: r,
            h_m: 0,
            row_key: None,
            sig,
        };
        let request = Request {
            client: recovery_client(r),
            timestamp: counter,
            read_only: false,
            op: postcard::to_stdvec(&op).expect("encodes").into(),
        };
        let auth = request_authenticator(&keys, &request.digest(), n);
        let sr = SignedRequest {
            request,
            auth: auth.into(),
            sig: None,
        };
        let bytes = seal(&keys, &Message::from(sr), None, n);
        self.log(|| format!("r{r} (held) sends a recovery request signed in advance"));
        for t in (0..n).filter(|t| *t != r) {
            self.transmit(
                Principal::Replica(r),
                Principal::Replica(t),
                bytes.clone(),
                0,
            );
        }
    }

    /// The watchdog: the replica is rebooted from its disk with trusted code and recovers.
    /// The adversary loses it but keeps the keys it took.
    pub(super) fn watchdog(&mut self, r: ReplicaId) {
        let keys = self.replicas[r as usize].auth().steal();
        for s in self.stolen.iter_mut() {
            if s.replica == r && s.frozen_at.is_none() {
                s.keys = keys.clone();
                s.frozen_at = Some(self.now);
            }
        }
        self.adversary.release(r);
        self.compromised = None;
        self.tamper_disk(r);
        self.log(|| format!("r{r} WATCHDOG: reboot and recover"));
        self.plant_on_watchdog(r);
        if !self.watchdog_reboot(r) {
            return;
        }
        self.unscrubbed.remove(&r);
        self.awaiting_recovery = Some((r, self.now));
        self.start_recovery(r);
    }

    /// Forges a frame with stolen keys: as the compromised replica to another, or as another
    /// replica to it. Keys still held are refreshed first (the adversary reads new ones).
    pub(super) fn forge(&mut self) {
        if self.stolen.is_empty() {
            return;
        }
        if let Some(c) = self.compromised {
            let keys = self.replicas[c as usize].auth().steal();
            for s in self.stolen.iter_mut() {
                if s.replica == c && s.frozen_at.is_none() {
                    s.keys = keys.clone();
                }
            }
        }
        let n = self.sc.core.n();
        let i = self.rng.random_range(0..self.stolen.len());
        let (c, frozen) = (self.stolen[i].replica, self.stolen[i].frozen_at);
        let Some(stolen_at) = frozen else {
            return; // the adversary holds c: it sends through c itself
        };
        let other = (c + self.rng.random_range(1..n)) % n;
        let msg = match self.rng.random_range(0..3) {
            0 => Message::Pbft(PbftMessage::Commit(redoubt_core::message::Commit {
                view: self.replicas[other as usize].view(),
                seq: self.replicas[other as usize].last_executed() + 1,
                digest: random_digest(&mut self.rng),
                replica: 0,
            })),
            1 => Message::Pbft(PbftMessage::Prepare(redoubt_core::message::Prepare {
                view: self.replicas[other as usize].view(),
                seq: self.replicas[other as usize].last_executed() + 1,
                digest: random_digest(&mut self.rng),
                replica: 0,
                doubts: Vec::new(),
            })),
            _ => Message::Pbft(PbftMessage::Checkpoint(redoubt_core::message::Checkpoint {
                seq: self.replicas[other as usize].stable_checkpoint()
                    + self.sc.core.checkpoint_interval,
                digest: random_digest(&mut self.rng),
                replica: 0,
            })),
        };
        let keys = &self.stolen[i].keys;
        let (from, to, forger) = if self.rng.random_bool(0.5) {
            // As c to another replica, with the key that replica chose for c.
            let forger = Forger {
                me: Principal::Replica(c),
                keys: keys.clone(),
            };
            (c, other, forger)
        } else {
            // As another replica to c, with the key c chose for it.
            let mut k = redoubt_core::keys::StolenKeys::default();
            if let Some(key) = keys.inbound.get(&Principal::Replica(other)) {
                k.outbound.insert(Principal::Replica(c), key.clone());
            }
            let forger = Forger {
                me: Principal::Replica(other),
                keys: k,
            };
            (other, c, forger)
        };
        let msg = match msg {
            Message::Pbft(PbftMessage::Commit(mut m)) => {
                m.replica = from;
                Message::Pbft(PbftMessage::Commit(m))
            }
            Message::Pbft(PbftMessage::Prepare(mut m)) => {
                m.replica = from;
                Message::Pbft(PbftMessage::Prepare(m))
            }
            Message::Pbft(PbftMessage::Checkpoint(mut m)) => {
                m.replica = from;
                Message::Pbft(PbftMessage::Checkpoint(m))
            }
            m => m,
        };
        let bytes = seal(&forger, &msg, Some(Principal::Replica(to)), n);
        let delay = self.rng.random_range(1..20);
        self.schedule(
            self.now + delay,
            Ev::DeliverForged {
                to,
                bytes,
                stolen_at,
            },
        );
    }

    /// Delivers a forged frame; once its receiver has sent a NEW-KEY after the keys were
    /// frozen, the frame must fail authentication.
    pub(super) fn deliver_forged(&mut self, to: ReplicaId, bytes: Vec<u8>, stolen_at: u64) {
        if self.up[to as usize] != Up::Running {
            return;
        }
        if self.trace_on {
            let d = describe(&bytes);
            self.log(|| format!("FORGED -> r{to} {d} (keys stolen at {stolen_at}ms)"));
        }
        // A frame whose message authenticates itself (a signed PO-ARU row) carries no MAC to
        // fail: what retires the row is the recovery's fresh order key (`check_planted_rows`).
        let signed = redoubt_core::message::decode_frame(&bytes, usize::MAX)
            .and_then(|f| redoubt_core::message::decode_body(&f.body))
            .is_ok_and(|m| m.required_tag() == redoubt_core::message::TagKind::None);
        let rekeyed = !signed && self.last_rekey.get(&to).is_some_and(|t| *t > stolen_at);
        let env = self.replica_env(to);
        let eff = self.replicas[to as usize].handle(env, Input::Receive(&bytes));
        let rejected = eff.iter().any(|e| {
            matches!(
                e,
                Effect::Event(Event::Rejected {
                    reason: redoubt_core::Reject::BadMac,
                    ..
                })
            )
        });
        if rekeyed {
            self.stats.forged_after_rekey += 1;
            if !rejected {
                self.violation(format!(
                    "r{to} accepted a frame forged with keys stolen at {stolen_at}ms after it \
                     re-keyed at {:?}ms",
                    self.last_rekey.get(&to)
                ));
            }
        } else {
            self.stats.forged_before_rekey += 1;
        }
        self.replica_effects(to, eff);
        self.end_turn(to, env);
    }

    /// A correct replica's routine proactive recovery (`Scenario::routine_recoveries`), one
    /// at a time as a watchdog staggers them (a recovering replica counts against f like a
    /// faulty one): while another replica recovers, it waits.
    pub(super) fn routine_recovery_in_turn(&mut self, r: ReplicaId) {
        let n = self.sc.core.n();
        if (0..n).any(|x| x != r && self.replicas[x as usize].recovering()) {
            self.schedule(self.now + 500, Ev::RoutineRecovery(r));
            return;
        }
        if self.up[r as usize] == Up::Running {
            self.log(|| format!("r{r} routine proactive recovery"));
            self.reboot_and_recover(r);
        }
    }

    /// The watchdog reboots replica `r` and it recovers (a new incarnation: its old order
    /// key retires).
    pub(super) fn reboot_and_recover(&mut self, r: ReplicaId) {
        if self.watchdog_reboot(r) {
            self.start_recovery(r);
        }
    }

    /// The watchdog reboots replica `r`: whether it is running after the reboot.
    fn watchdog_reboot(&mut self, r: ReplicaId) -> bool {
        self.handle(Ev::Reboot(r));
        self.up[r as usize] == Up::Running
    }

    /// Replica `r` starts its recovery.
    fn start_recovery(&mut self, r: ReplicaId) {
        let env = self.replica_env(r);
        let eff = self.replicas[r as usize].handle(env, Input::Recover);
        self.replica_effects(r, eff);
    }
}
