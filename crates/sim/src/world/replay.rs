//! NEW-KEY replays timed to a restart (scenario field `replay_new_keys`), and the check that a
//! restarted replica never goes back to a client key older than one it had accepted.
//!
//! NEW-KEY frames of clients and replicas are captured as they pass (a few per sender, the
//! oldest kept); right after a replica reboots (power loss, or the watchdog before a recovery)
//! old ones are replayed to it. Whatever the scenario, every NEW-KEY a correct replica accepts
//! is recorded (with its counter, per replica and sender, across restarts): a correct replica
//! that accepts a client's NEW-KEY with a counter lower than one it accepted before (in this
//! life or an earlier one) went back to a retired key, which an attacker who compromised the
//! client, or a replica that held it, may know. (The same NEW-KEY again, counter equal, is the
//! client's own retransmission of its current key, and allowed.)

use super::*;
use redoubt_core::NewKey;
use std::collections::VecDeque;

/// Distinct NEW-KEY frames kept per sender.
const KEPT_PER_SENDER: usize = 6;
/// Old NEW-KEYs replayed to a replica after one reboot, at most.
const REPLAYS_PER_REBOOT: usize = 8;

/// Captured NEW-KEY frames and accepted counters.
#[derive(Default)]
pub(super) struct NewKeys {
    /// Per sender, distinct NEW-KEY frames in the order seen (the oldest always kept).
    captured: BTreeMap<Principal, VecDeque<Vec<u8>>>,
    /// The highest counter each replica accepted from each sender, over all its lives.
    accepted: BTreeMap<(ReplicaId, Principal), u64>,
    /// Each replica's latest NEW-KEY frame seen on the network (for the replaying client).
    latest: BTreeMap<ReplicaId, Vec<u8>>,
    /// Per replica, the NEW-KEYs it installed in its current life (fingerprints).
    delivered: BTreeMap<ReplicaId, BTreeSet<[u8; 32]>>,
}

impl World {
    /// Keeps a NEW-KEY frame that passes on the network (`replay_new_keys`).
    pub(super) fn capture_new_key(&mut self, from: Principal, bytes: &[u8]) {
        if !self.sc.replay_new_keys || !is_new_key(bytes) {
            return;
        }
        let kept = self.new_keys.captured.entry(from).or_default();
        if kept.iter().any(|b| b.as_slice() == bytes) {
            return;
        }
        if kept.len() >= KEPT_PER_SENDER {
            kept.remove(1);
        }
        kept.push_back(bytes.to_vec());
    }

    /// Keeps a replica's latest NEW-KEY frame as it passes, when a client replays them.
    pub(super) fn capture_latest_new_key(&mut self, from: Principal, bytes: &[u8]) {
        let Principal::Replica(r) = from else {
            return;
        };
        if is_new_key(bytes)
            && self
                .sc
                .byz_clients
                .contains(&ClientAttack::ReplayReplicaNewKeys)
        {
            self.new_keys.latest.insert(r, bytes.to_vec());
        }
    }

    /// The replaying client's act: every replica's latest NEW-KEY to every other replica,
    /// spread over the next 100 ms.
    pub(super) fn replay_latest_new_keys(&mut self, from: Principal) {
        let frames: Vec<(ReplicaId, Vec<u8>)> = self
            .new_keys
            .latest
            .iter()
            .map(|(r, b)| (*r, b.clone()))
            .collect();
        for (r, bytes) in frames {
            for t in (0..self.sc.core.n()).filter(|t| *t != r) {
                let extra = self.rng.random_range(0..100);
                self.transmit(from, Principal::Replica(t), bytes.clone(), extra);
                self.stats.new_keys_replayed += 1;
            }
        }
    }

    /// The check of replays (second review, G3): a NEW-KEY replica `r` accepted before in
    /// this life, admitted again, must not make it forget anything (`forgotten`: how many
    /// view-change messages installing it made it drop; `accepted`: whether it was installed
    /// as a new key).
    pub(super) fn check_new_key_replay(
        &mut self,
        r: ReplicaId,
        nk: &NewKey,
        accepted: bool,
        forgotten: u64,
    ) {
        let print = nk.fingerprint().0;
        let seen = self.new_keys.delivered.entry(r).or_default();
        let again = seen.contains(&print);
        if accepted {
            seen.insert(print);
        }
        let correct = !self.faulty.contains(&r) && !self.adversary.controls(r);
        if again && correct && forgotten > 0 {
            self.violation(format!(
                "r{r} forgot {forgotten} view-change messages on a NEW-KEY it had installed \
                 before (a replay)"
            ));
        }
    }

    /// Replica `r` starts a new life (a reboot): what was delivered to it before is new again.
    pub(super) fn new_life(&mut self, r: ReplicaId) {
        self.new_keys.delivered.remove(&r);
    }

    /// Replica `r` just rebooted: old NEW-KEYs of other principals are replayed to it.
    pub(super) fn replay_new_keys_to(&mut self, r: ReplicaId) {
        self.new_life(r);
        if !self.sc.replay_new_keys {
            return;
        }
        let me = Principal::Replica(r);
        let mut frames: Vec<(Principal, Vec<u8>)> = self
            .new_keys
            .captured
            .iter()
            .filter(|(p, kept)| **p != me && kept.len() > 1)
            .flat_map(|(p, kept)| {
                // Any but the sender's latest.
                kept.iter().take(kept.len() - 1).map(|b| (*p, b.clone()))
            })
            .collect();
        let mut sent = 0;
        while !frames.is_empty() && sent < REPLAYS_PER_REBOOT {
            let i = self.rng.random_range(0..frames.len());
            let (from, bytes) = frames.swap_remove(i);
            let at = self.now + self.rng.random_range(1..40);
            self.schedule(
                at,
                Ev::Deliver {
                    to: me,
                    from,
                    bytes,
                },
            );
            self.stats.new_keys_replayed += 1;
            sent += 1;
        }
        if sent > 0 {
            self.log(|| format!("r{r} gets {sent} old NEW-KEYs replayed after its reboot"));
        }
    }

    /// Replica `r` installed `nk` as a new key.
    pub(super) fn new_key_accepted(&mut self, r: ReplicaId, nk: &NewKey) {
        let prev = self.new_keys.accepted.get(&(r, nk.from)).copied();
        let correct = !self.faulty.contains(&r) && !self.adversary.controls(r);
        if let (Some(m), Principal::Client(c), true) = (prev, nk.from, correct) {
            if nk.counter < m {
                self.violation(format!(
                    "r{r} accepted a NEW-KEY of c{c} with counter {} after it had accepted \
                     counter {m} (before a restart): a retired client key is back",
                    nk.counter
                ));
            }
        }
        let e = self.new_keys.accepted.entry((r, nk.from)).or_insert(0);
        *e = (*e).max(nk.counter);
    }
}
