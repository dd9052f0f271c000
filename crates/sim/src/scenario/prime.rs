//! Prime's draws (a child module of [`crate::scenario`]): a seed's other draws kept, Prime
//! orders requests, and the attacks of the second review on Prime (G1, G2) come on top.

use super::*;

impl Scenario {
    /// Prime orders requests (ADR 0007), with every other draw of the seed kept: tentative
    /// execution is off (Prime has none). Proactive recovery stays where the seed drew it;
    /// compromised replicas then lie about pre-ordering in half of those seeds.
    pub fn prime(&mut self) {
        self.core.ordering = redoubt_core::OrderProtocol::Prime;
        self.core.tentative_execution = false;
        self.core.primary_replies = false;
        // Suspect-Leader replaces slow leaders; the view-change timer is the backstop, long
        // enough that a leader holding proposals just under it costs far more than the
        // bounded-delay check allows.
        self.core.view_change_timeout_ms = 1600;
        self.core.view_change_timeout_max_ms = 6400;
        // The floor of the acceptable turnaround covers the network's jitter: simulated
        // delays are drawn anew for every message, so the smallest round trip measured
        // says little about the next one.
        self.core.prime_min_rtt_ms = 2 * self.delay_ms.1;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x9e1_3e00);
        // Faulty replicas attack pre-ordering in half of the seeds, or hold their proposals
        // back as leader in a quarter.
        for (_, b) in self.byzantine.iter_mut() {
            let roll = rng.random_range(0..4);
            if roll < 2 {
                *b = Behavior::PrimeLiar;
            } else if roll == 2 {
                *b = Behavior::Slow;
            }
        }
        if let Some(p) = self.proactive.as_mut() {
            if rng.random_bool(0.5) {
                p.behavior = Behavior::PrimeLiar;
            }
        }
        // In 40% of the seeds the clients keep working long after the network healed and
        // every crash, reboot and pause is over, so that the bounded-delay check has
        // operations to measure: 600 ms each for the liveness check (a cluster with a faulty
        // leader, a replica alone in a later view and one slow link runs at 450-650 ms an
        // operation: seed 8,956).
        if rng.random_bool(0.4) {
            self.ops_per_client += 150;
            self.think_ms = (0, self.think_ms.1.min(10));
            self.liveness_bound_ms += 90_000;
        }
        // The split attack across a proactive recovery in a tenth of the seeds without
        // proactive recovery (a stream of its own).
        let mut g1 = ChaCha8Rng::seed_from_u64(self.seed ^ 0x6100_5eed);
        if g1.random_bool(0.1) && self.proactive.is_none() {
            self.split_across_recovery(&mut g1);
        }
        // A leader forging rows of retired incarnations (a stream of its own).
        let mut g2 = ChaCha8Rng::seed_from_u64(self.seed ^ 0x6200_5eed);
        if g2.random_bool(0.2) {
            self.forge_across_recoveries(&mut g2);
        }
    }

    /// Prime's split attack ([`Split`]) in seeds with f = 1 and no faulty replica: the
    /// originator is the faulty one, with a faulty client; the network heals after the
    /// attack had time to play out.
    fn split_across_recovery(&mut self, rng: &mut ChaCha8Rng) {
        // With f = 1 the spare and the recovered replica make 2f+1 with the originator.
        if self.core.f != 1 || !self.faulty().is_empty() {
            return;
        }
        let mut free: Vec<ReplicaId> = (0..self.core.n()).collect();
        shuffle(rng, &mut free);
        let (originator, spare, recovering) = (free[0], free[1], free[2]);
        self.byzantine.push((originator, Behavior::Honest));
        // The faulty client whose two writes the originator puts under one number.
        self.byz_clients.push(ClientAttack::Replay);
        let start_ms = rng.random_range(200..1500);
        self.split = Some(Split {
            originator,
            spare,
            recovering,
            start_ms,
            recover_after_ms: rng.random_range(50..500),
        });
        // No partition, pause or reboot of the three in the attack's way.
        self.partitions.clear();
        self.pauses.clear();
        self.reboots.clear();
        self.heal_ms = self.heal_ms.max(start_ms + 6000);
        self.ops_per_client = self.ops_per_client.max(60);
    }

    /// In seeds with one faulty replica (f = 1), it forges rows of retired incarnations as
    /// leader ([`Behavior::RowForger`]), and two correct replicas recover proactively, one
    /// after the other, so that there are 2f of them (second review, G2). Otherwise honest: a
    /// recovering replica counts against f like a faulty one, and with another faulty
    /// replica that lies in pre-ordering nothing is promised until the recovery completes.
    fn forge_across_recoveries(&mut self, rng: &mut ChaCha8Rng) {
        let one = self.byzantine.len() == 1 && self.core.f == 1;
        if !one || self.split.is_some() || self.proactive.is_some() {
            return;
        }
        self.byzantine[0].1 = Behavior::RowForger;
        let busy: Vec<ReplicaId> = self
            .faulty()
            .into_iter()
            .chain(self.reboots.iter().map(|w| w.replica))
            .chain(self.pauses.iter().map(|w| w.replica))
            .chain(self.amnesia.iter().map(|w| w.replica))
            .collect();
        let mut free: Vec<ReplicaId> = (0..self.core.n()).filter(|r| !busy.contains(r)).collect();
        shuffle(rng, &mut free);
        let mut at = rng.random_range(300..2000);
        for r in free.into_iter().take(2 * self.core.f as usize) {
            self.routine_recoveries.push((r, at));
            at += rng.random_range(2000..4000);
        }
        // Clients busy long after the second recovery: the forger leads some view then,
        // and the bounded-delay check (`--bounded-delay`) has updates to measure.
        self.ops_per_client = self.ops_per_client.max(200);
        self.think_ms = (0, self.think_ms.1.min(10));
        self.liveness_bound_ms = self.liveness_bound_ms.max(at + 120_000);
    }
}
