//! The workload: the operations correct clients issue, and what Byzantine clients do.

use super::*;

impl World {
    /// Faulty client `i`'s key-holder signature of a request (Prime), corrupted in one
    /// request of two under [`ClientAttack::BadAuthenticator`]: with MACs that verify at some
    /// replicas only, a correct originator must still refuse it (mutant
    /// `originator-trusts-macs`).
    fn byz_sign(
        &mut self,
        i: usize,
        digest: &redoubt_crypto::Digest,
        attack: ClientAttack,
    ) -> Option<redoubt_core::message::RequestSig> {
        let (counter, mut sig) = self.byz_clients[i]
            .keys
            .with_holder(|h| h.sign(redoubt_core::keys::Purpose::Request, digest))
            .ok()?;
        if attack == ClientAttack::BadAuthenticator && self.rng.random_bool(0.5) {
            sig.0[0] ^= 0xff;
        }
        Some(redoubt_core::message::RequestSig { counter, sig })
    }

    pub(super) fn byz_client_act(&mut self, i: usize) {
        let n = self.sc.core.n();
        let f = self.sc.core.f;
        let id = self.byz_clients[i].id;
        let attack = self.byz_clients[i].attack;
        let from = Principal::Client(id);
        let make = |w: &mut World, op: KvOp, ts: u64| -> SignedRequest {
            let request = Request {
                client: id,
                timestamp: ts,
                read_only: false,
                op: op.encode().into(),
            };
            let digest = request.digest();
            let auth = request_authenticator(&w.byz_clients[i].keys, &digest, n);
            // Under Prime a client's request needs its signature at its originator: a
            // faulty client signs too (its key holder's signature, or, with bad
            // authenticators, one in two corrupted).
            let sig =
                w.sc.core
                    .prime()
                    .then(|| w.byz_sign(i, &digest, attack))
                    .flatten();
            SignedRequest {
                request,
                auth: auth.into(),
                sig,
            }
        };
        if self.now >= self.byz_clients[i].next_rekey_ms {
            // A faulty client still has to hand replicas its keys for them to listen.
            let replicas: Vec<Principal> = (0..n).map(Principal::Replica).collect();
            if let Ok(nk) = self.byz_clients[i].keys.refresh(&replicas) {
                let bytes = seal(&self.byz_clients[i].keys, &Message::from(nk), None, n);
                for to in replicas {
                    self.transmit(from, to, bytes.clone(), 0);
                }
            }
            self.byz_clients[i].next_rekey_ms = self.now + self.sc.core.key_refresh_ms;
        }
        let key = format!("b{}", self.rng.random_range(0..3)).into_bytes();
        let value = format!("evil{}", self.rng.random::<u16>()).into_bytes();
        self.byz_clients[i].timestamp += 1;
        let ts = self.byz_clients[i].timestamp;
        match attack {
            ClientAttack::ReuseTimestamp => {
                let a = make(
                    self,
                    KvOp::Put {
                        key: key.clone(),
                        value,
                    },
                    ts,
                );
                let b = make(self, KvOp::Delete { key }, ts);
                for r in 0..n {
                    let sr = if r % 2 == 0 { a.clone() } else { b.clone() };
                    let bytes = seal(&self.byz_clients[i].keys, &Message::from(sr), None, n);
                    self.transmit(from, Principal::Replica(r), bytes, 0);
                }
            }
            ClientAttack::SubsetOnly => {
                let sr = make(self, KvOp::Put { key, value }, ts);
                let bytes = seal(&self.byz_clients[i].keys, &Message::from(sr), None, n);
                let r = self.rng.random_range(0..n);
                self.transmit(from, Principal::Replica(r), bytes, 0);
            }
            ClientAttack::BadAuthenticator => {
                let mut sr = make(self, KvOp::Put { key, value }, ts);
                let bad = self.rng.random_range(1..=f);
                for _ in 0..bad {
                    let j = self.rng.random_range(0..n as usize);
                    std::sync::Arc::make_mut(&mut sr.auth)[j].0[0] ^= 0xff;
                }
                let bytes = seal(&self.byz_clients[i].keys, &Message::from(sr), None, n);
                for r in 0..n {
                    self.transmit(from, Principal::Replica(r), bytes.clone(), 0);
                }
            }
            ClientAttack::ReplayReplicaNewKeys => self.replay_latest_new_keys(from),
            ClientAttack::Garbage => {
                let len = self.rng.random_range(0..300);
                let junk: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
                let r = self.rng.random_range(0..n);
                self.transmit(from, Principal::Replica(r), junk, 0);
                // A well-formed frame claiming to come from a replica, with a random MAC.
                let fake = Message::from(redoubt_core::message::Commit {
                    view: 0,
                    seq: 1,
                    digest: random_digest(&mut self.rng),
                    replica: self.rng.random_range(0..n),
                });
                let bytes = seal(&self.byz_clients[i].keys, &fake, None, n);
                if let Ok(mut fr) = decode_frame(&bytes, usize::MAX) {
                    fr.from = Principal::Replica(self.rng.random_range(0..n));
                    let r = self.rng.random_range(0..n);
                    self.transmit(from, Principal::Replica(r), encode_frame(&fr), 0);
                }
            }
            ClientAttack::Patient => {
                if self.now < self.byz_clients[i].quiet_until_ms {
                    return;
                }
                self.byz_clients[i].quiet_until_ms =
                    self.now + 3 * self.sc.core.view_change_timeout_ms;
                let p = self.sc.core.primary(self.correct_view());
                let mut sr = make(self, KvOp::Put { key, value }, ts);
                std::sync::Arc::make_mut(&mut sr.auth)[p as usize].0[0] ^= 0xff;
                let bytes = seal(&self.byz_clients[i].keys, &Message::from(sr), None, n);
                for r in 0..n {
                    self.transmit(from, Principal::Replica(r), bytes.clone(), 0);
                }
            }
            ClientAttack::ColludePrimary
            | ClientAttack::ColludeCut
            | ClientAttack::ColludeOneCorrect => {
                let p = self.sc.core.primary(self.correct_view());
                let mut sr = make(self, KvOp::Put { key, value }, ts);
                let auth = std::sync::Arc::make_mut(&mut sr.auth);
                // Valid at the primary, and for ColludeCut at the f replicas after it.
                let vouchers = if attack == ClientAttack::ColludeCut {
                    f
                } else {
                    0
                };
                // ColludeOneCorrect: at the faulty replicas and the first correct backup too.
                let one_correct = (attack == ClientAttack::ColludeOneCorrect)
                    .then(|| {
                        (1..n)
                            .map(|i| (p + i) % n)
                            .find(|r| !self.faulty.contains(r))
                    })
                    .flatten();
                for (j, mac) in auth.iter_mut().enumerate() {
                    let j = j as ReplicaId;
                    let after = (j + n - p) % n;
                    let valid = after <= vouchers
                        || (attack == ClientAttack::ColludeOneCorrect
                            && (self.faulty.contains(&j) || one_correct == Some(j)));
                    if !valid {
                        mac.0[0] ^= 0xff;
                    }
                }
                let bytes = seal(&self.byz_clients[i].keys, &Message::from(sr), None, n);
                for r in 0..n {
                    self.transmit(from, Principal::Replica(r), bytes.clone(), 0);
                }
            }
            ClientAttack::Replay => {
                let sr = make(self, KvOp::Put { key, value }, ts);
                let bytes = seal(&self.byz_clients[i].keys, &Message::from(sr), None, n);
                self.byz_clients[i].sent.push(bytes.clone());
                if self.byz_clients[i].sent.len() > 16 {
                    self.byz_clients[i].sent.remove(0);
                }
                let k = self.rng.random_range(0..self.byz_clients[i].sent.len());
                let old = self.byz_clients[i].sent[k].clone();
                for r in 0..n {
                    self.transmit(from, Principal::Replica(r), old.clone(), 0);
                }
            }
        }
    }

    /// A correct client's operation completed: counted for the throughput check once the
    /// faults are over and no correct replica suspects a correct client. Only the part of its
    /// latency after the faults counts: an operation invoked during a partition waited for
    /// the partition, not for the faulty clients and replicas the check is about.
    pub(super) fn count_settled_op(&mut self, latency_ms: u64) {
        if self.now < self.stats.settle_ms {
            return;
        }
        if self.stats.measured_from_ms.is_none() {
            let n = self.sc.core.n();
            let suspected = (0..n)
                .filter(|r| !self.faulty.contains(r) && !self.adversary.controls(*r))
                .filter(|r| self.up[*r as usize] == Up::Running)
                .any(|r| {
                    self.clients
                        .iter()
                        .any(|c| self.replicas[r as usize].suspects(c.core.id()))
                });
            if suspected {
                return;
            }
            self.stats.measured_from_ms = Some(self.now);
        }
        self.stats.ops_after_settle += 1;
        self.stats.last_op_ms = self.now;
        self.stats.latency_after_settle_ms += latency_ms.min(self.now - self.stats.settle_ms);
    }

    /// The view the running correct replicas are in (the highest among them): whose
    /// primary colluding and patient clients aim at.
    fn correct_view(&self) -> u64 {
        (0..self.sc.core.n())
            .filter(|r| !self.faulty.contains(r) && self.up[*r as usize] == Up::Running)
            .map(|r| self.replicas[r as usize].view())
            .max()
            .unwrap_or(0)
    }

    pub(super) fn next_op(&mut self, c: usize) -> KvOp {
        let key = self.key_name();
        let id = self.clients[c].core.id();
        self.clients[c].counter += 1;
        // Long values make results long enough for digest replies.
        let value = self.value_of(id, self.clients[c].counter);
        match self.rng.random_range(0..10) {
            0..=2 => KvOp::Put { key, value },
            3 => KvOp::Set { key, value },
            4..=6 => KvOp::Get { key },
            7 => KvOp::Delete { key },
            _ => {
                let expected = if self.rng.random_bool(0.5) {
                    None
                } else {
                    // Expect the value some client may have written.
                    let other = self.rng.random_range(1..=self.sc.clients);
                    // Drawn as i32, as it always was: the seeds play as before.
                    let cnt: i32 = self.rng.random_range(1..4);
                    Some(self.value_of(other as ClientId, cnt as u64))
                };
                KvOp::Cas {
                    key,
                    expected,
                    new: value,
                }
            }
        }
    }
}
