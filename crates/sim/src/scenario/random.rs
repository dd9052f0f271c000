//! The random scenario of a seed: every draw, in the order the seed's generator makes them
//! (a change of order changes every seed's scenario), and the templates some draws apply.

use super::*;

/// Key holders of most seeds answer within this many ms (a sync to disk).
const HOLDER_FAST_MS: u64 = 20;
/// The share of seeds whose key holders answer up to half a second late
/// ([`Scenario::holder_delay_ms`]).
const HOLDER_SLOW_SEEDS: f64 = 0.2;
/// The share of seeds whose key holders fail now and then ([`Scenario::holder_fail`]).
const HOLDER_FAIL_SEEDS: f64 = 0.1;

impl Scenario {
    /// A random scenario mixing every fault kind, drawn from `seed`.
    pub fn random(seed: u64) -> Scenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5ce1_a810);
        let mut s = Scenario::calm(seed);
        s.name = "random".into();
        // Mostly f = 1; some f = 2 runs (7 replicas) where two faulty replicas can collude.
        let f = if rng.random_bool(0.2) { 2 } else { 1 };
        let n = 3 * f + 1;
        let k = [4u64, 8, 16][rng.random_range(0..3)];
        s.core = Config {
            f,
            checkpoint_interval: k,
            log_size: k * rng.random_range(2..4u64),
            batch_requests_max: [1usize, 4, 16][rng.random_range(0..3)],
            inflight_batches_max: rng.random_range(1..4),
            ..s.core
        };
        s.clients = rng.random_range(2..6);
        s.ops_per_client = rng.random_range(8..30);
        s.keys = rng.random_range(1..5);
        s.think_ms = (0, rng.random_range(1..40));
        s.delay_ms = (1, rng.random_range(2..15));
        s.heal_ms = rng.random_range(500..6000);
        s.net = NetFaults {
            drop: pick(&mut rng, 0.5, 0.0..0.25),
            duplicate: pick(&mut rng, 0.4, 0.0..0.2),
            corrupt: pick(&mut rng, 0.3, 0.0..0.05),
            replay: pick(&mut rng, 0.4, 0.0..0.1),
            forge: pick(&mut rng, 0.3, 0.0..0.05),
            spike: pick(&mut rng, 0.4, 0.0..0.1),
            spike_ms: rng.random_range(50..800),
        };
        // Up to f faulty replicas: Byzantine with a random behaviour, or amnesiac.
        let faulty_count = rng.random_range(0..=f);
        let mut ids: Vec<ReplicaId> = (0..n).collect();
        shuffle(&mut rng, &mut ids);
        let faulty: Vec<ReplicaId> = ids[..faulty_count as usize].to_vec();
        for r in &faulty {
            let roll = rng.random_range(0..10);
            if roll < 7 {
                let b = Behavior::ALL[rng.random_range(0..Behavior::ALL.len())];
                s.byzantine.push((*r, b));
            } else if roll < 8 {
                s.corruptions
                    .push((*r, rng.random_range(50..s.heal_ms.max(100))));
            } else {
                let start = rng.random_range(100..s.heal_ms.max(200));
                s.amnesia.push(Window {
                    replica: *r,
                    start_ms: start,
                    end_ms: start + rng.random_range(100..3000),
                });
            }
        }
        // Partitions and pauses of correct replicas (the network may also isolate faulty ones).
        for _ in 0..rng.random_range(0..3) {
            let start = rng.random_range(0..s.heal_ms);
            let size = rng.random_range(1..=f as usize + 1);
            let mut who = ids.clone();
            shuffle(&mut rng, &mut who);
            s.partitions.push(Partition {
                start_ms: start,
                end_ms: (start + rng.random_range(100..3000)).min(s.heal_ms),
                isolated: who[..size].to_vec(),
            });
        }
        let correct: Vec<ReplicaId> = ids[faulty_count as usize..].to_vec();
        if rng.random_bool(0.3) && faulty_count < f {
            // A paused correct replica (state intact) that falls behind the low watermark.
            let r = correct[rng.random_range(0..correct.len())];
            let start = rng.random_range(0..s.heal_ms);
            s.pauses.push(Window {
                replica: r,
                start_ms: start,
                end_ms: start + rng.random_range(200..4000),
            });
        }
        // A client whose authenticator is bad at some backups stalls its batch when other
        // backups are also missing (faulty, partitioned or paused): with MAC authenticators
        // that costs a view change per attempt (docs/adr/0002, item 7; the signature fallback
        // that removes it is future work). Liveness is only promised for that attack when
        // every replica participates and one such client runs; other seeds swap it for replay.
        if rng.random_bool(0.3) {
            // Power failures: one replica, or (rarely) every replica at once.
            let start = rng.random_range(0..s.heal_ms);
            let end = start + rng.random_range(50..2000);
            if rng.random_bool(0.2) {
                for r in 0..n {
                    s.reboots.push(Window {
                        replica: r,
                        start_ms: start,
                        end_ms: end,
                    });
                }
            } else {
                let r = rng.random_range(0..n);
                s.reboots.push(Window {
                    replica: r,
                    start_ms: start,
                    end_ms: end,
                });
            }
        }
        // Any number of clients with partial authenticators, next to faulty replicas,
        // partitions, pauses and reboots: a batch needs f+1 vouchers per request, not 2f+1
        // replicas vouching for all of it (`Prepare::doubts`).
        for _ in 0..rng.random_range(0..3) {
            let a = ClientAttack::ALL[rng.random_range(0..ClientAttack::ALL.len())];
            s.byz_clients.push(a);
        }
        if rng.random_bool(0.2) {
            s.step_downs.push(rng.random_range(0..s.heal_ms));
        }
        if rng.random_bool(0.3) {
            // Skewed clocks, within the configured bound of accepted batch times.
            let bound = s.core.clock_skew_max_ms as i64 / 4;
            s.clock_offsets_ms = (0..n).map(|_| rng.random_range(-bound..=bound)).collect();
        }
        // Swarm testing: some seeds follow a template that steers the adversary towards
        // schedules known to break broken variants of the protocol.
        match rng.random_range(0..10) {
            0 => {
                // Vote-stuffing next to a partitioned pair of backups: a replica can gather a
                // commit certificate that only a weakened quorum would accept.
                s.core.f = 1;
                s.byzantine = vec![(3, Behavior::VoteEverything)];
                s.amnesia.clear();
                s.reboots.clear();
                s.corruptions.clear();
                s.pauses.clear();
                s.byz_clients
                    .retain(|a| *a != ClientAttack::BadAuthenticator);
                // First one correct backup is cut off while the vote-stuffer helps the other
                // gather certificates; then they swap, so a view change happens without the
                // replica that holds the only (weak) commit.
                let start = rng.random_range(0..s.heal_ms / 2);
                let mid = start + rng.random_range(200..1500);
                let end = mid + rng.random_range(500..3000);
                s.heal_ms = s.heal_ms.max(end);
                let first = rng.random_range(1..3);
                s.partitions = vec![
                    Partition {
                        start_ms: start,
                        end_ms: mid,
                        isolated: vec![first],
                    },
                    Partition {
                        start_ms: mid,
                        end_ms: end,
                        isolated: vec![3 - first],
                    },
                ];
            }
            1 => {
                // Stale claims in view changes under frequent hand-overs.
                s.core.f = 1;
                s.byzantine = vec![(rng.random_range(0..4), Behavior::BogusViewChange)];
                s.amnesia.clear();
                s.reboots.clear();
                s.corruptions.clear();
                s.pauses.clear();
                s.partitions.clear();
                s.byz_clients
                    .retain(|a| *a != ClientAttack::BadAuthenticator);
                let every = rng.random_range(150..600);
                s.step_downs = (1..20).map(|i| i * every).collect();
            }
            _ => {}
        }
        // Reads on the read-only fast path in most seeds, ordered in the others.
        s.core.read_only_fast_path = rng.random_bool(0.75);
        // Long values (results over 32 bytes travel as digest replies) in half of the seeds.
        s.value_pad = if rng.random_bool(0.5) { 48 } else { 0 };
        s.core.digest_replies = rng.random_bool(0.8);
        s.core.tentative_execution = rng.random_bool(0.8);
        // Padded writes (57 bytes) travel beside the pre-prepare in a third of the seeds.
        s.core.large_request_bytes = [0, 32, 1024][rng.random_range(0..3)];
        // Proactive recovery in some seeds without other faulty replicas (a compromised
        // replica counts against f): replicas compromised in turn, each rebooted and recovered.
        if s.faulty().is_empty() && rng.random_bool(0.15) {
            let b = Behavior::ALL[rng.random_range(0..Behavior::ALL.len())];
            proactive_recovery(&mut s, b);
        }
        // A quiet primary in half of the seeds without tentative execution (drawn last, and
        // only there, so that other seeds play as they did before the setting existed).
        s.core.primary_replies = s.core.tentative_execution || rng.random_bool(0.5);
        // In a third of the seeds with tentative execution, only batches of up to 1 to 4
        // requests execute tentatively and the primary keeps quiet about larger ones (the
        // default's mix; drawn last, like the above).
        if s.core.tentative_execution && rng.random_bool(1.0 / 3.0) {
            s.core.tentative_batch_max = rng.random_range(1..=4);
            s.core.primary_replies = false;
        }
        // The stronger adversary (2026-12), drawn after everything above so that a seed that
        // draws none of it plays exactly as before. Compromised replicas plant messages for
        // later (half of the proactive-recovery seeds) and tamper with their disks (a third).
        if s.proactive.is_some() {
            if rng.random_bool(0.5) {
                s.plant = Some(Plant { join: false });
            }
            s.tamper_disk = rng.random_bool(1.0 / 3.0);
        }
        // Old NEW-KEYs replayed to replicas that just rebooted, in a tenth of the seeds with
        // reboots (power losses or watchdogs).
        if (!s.reboots.is_empty() || s.proactive.is_some()) && rng.random_bool(0.1) {
            s.replay_new_keys = true;
        }
        // Template: VIEW-CHANGEs planted for a later view by the first f compromised
        // replicas, joined by the next one (with f as drawn: 1 or 2).
        if rng.random_bool(0.02) {
            planted_join(&mut s);
        }
        // A faulty client colluding with faulty replicas (5% of the seeds without proactive
        // recovery, when there is room for them): requests that verify at the primary only,
        // vouched for to the primary alone by f faulty backups; or requests that verify at the
        // primary and the f replicas after it, in a pre-prepare whose broadcast one faulty
        // primary cuts after the 2f replicas after it.
        let (f, n) = (s.core.f, s.core.n());
        let room = f as usize - s.faulty().len().min(f as usize);
        if s.proactive.is_none() && room > 0 && rng.random_bool(0.05) {
            let mut free: Vec<ReplicaId> = (0..n).filter(|r| !s.faulty().contains(r)).collect();
            shuffle(&mut rng, &mut free);
            if room < f as usize || rng.random_bool(0.5) {
                // The primary of view 0 if it is free (the attack needs it to be primary).
                let r = if free.contains(&0) { 0 } else { free[0] };
                s.byzantine.push((r, Behavior::CutBroadcast));
                s.byz_clients.push(ClientAttack::ColludeCut);
            } else {
                for r in &free[..f as usize] {
                    s.byzantine.push((*r, Behavior::PrepareToPrimary));
                }
                // With f >= 2, three in four of these clients also make their requests verify
                // at one correct backup (from a stream of its own: the other draws stay as
                // they were).
                let mut g4 = ChaCha8Rng::seed_from_u64(s.seed ^ 0x64c0_11de);
                if f >= 2 && g4.random_bool(0.75) {
                    s.byz_clients.push(ClientAttack::ColludeOneCorrect);
                } else {
                    s.byz_clients.push(ClientAttack::ColludePrimary);
                }
            }
        }
        // Lies about numbers and state (7% of the seeds without proactive recovery, when
        // there is room): every faulty replica added shares one of the three behaviours.
        let room = f as usize - s.faulty().len().min(f as usize);
        if s.proactive.is_none() && room > 0 && rng.random_bool(0.07) {
            let b = [
                Behavior::ExtremeNumbers,
                Behavior::LieStatus,
                Behavior::EquivocateViewChange,
            ][rng.random_range(0..3)];
            let mut free: Vec<ReplicaId> = (0..n).filter(|r| !s.faulty().contains(r)).collect();
            shuffle(&mut rng, &mut free);
            for r in &free[..rng.random_range(1..=room)] {
                s.byzantine.push((*r, b));
            }
        }
        // Sealed bodies (confidential_bodies) in half of the seeds, drawn last: a seed that
        // draws clear bodies plays exactly as before the setting existed.
        s.core.confidential_bodies = rng.random_bool(0.5);
        // The primary's pace check in a fifth of the seeds, drawn after everything else for
        // the same reason; windows from 100 ms (a few batches each) to 2 s.
        if rng.random_bool(0.2) {
            s.core.primary_pace_window_ms = rng.random_range(100..2_000);
        }
        // Fast reads to 2f+1 replicas first (the default) in most seeds, to all replicas in
        // the rest; drawn last, like the above, so that every other draw of a seed is as it
        // was before the setting existed (the pinned seeds of the tests keep their scenarios).
        s.core.read_only_to_quorum = rng.random_bool(0.75);
        // A client replaying replicas' latest NEW-KEYs in a tenth of the seeds, from a stream
        // of its own (every other draw stays as it was).
        let mut g3 = ChaCha8Rng::seed_from_u64(s.seed ^ 0x6300_5eed);
        if g3.random_bool(0.1) {
            s.byz_clients.push(ClientAttack::ReplayReplicaNewKeys);
        }
        // Recovery requests signed in advance by the adversary, in half of the seeds with
        // proactive recovery (a stream of their own as well).
        let mut g8 = ChaCha8Rng::seed_from_u64(s.seed ^ 0x6800_5eed);
        s.presign_recovery = s.proactive.is_some() && g8.random_bool(0.5);
        // A patient faulty client in a tenth of the seeds, and the throughput check in a
        // third of the seeds whose faulty parties ought to cost nothing (streams of their
        // own).
        let mut g5 = ChaCha8Rng::seed_from_u64(s.seed ^ 0x6500_5eed);
        if g5.random_bool(0.1) {
            s.byz_clients.push(ClientAttack::Patient);
        }
        if !s.byz_clients.is_empty() && s.costs_nothing() && g5.random_bool(1.0 / 3.0) {
            s.check_throughput(200);
        }
        // Stale reads beside a lagging correct replica in 3% of the seeds without proactive
        // recovery (a stream of its own).
        let mut reads = ChaCha8Rng::seed_from_u64(s.seed ^ 0x57a1_e4ead);
        if s.proactive.is_none() && reads.random_bool(0.03) {
            stale_reads_beside_lagging(&mut s, &mut reads);
        }
        // Key holders that fail now and then (a drawing of its own, so that the other draws
        // of every seed stay as they were).
        let mut holders = ChaCha8Rng::seed_from_u64(s.seed ^ 0x401d_e4fa);
        if holders.random_bool(HOLDER_FAIL_SEEDS) {
            s.holder_fail = holders.random_range(0.01..0.2);
        }
        // Key holders answer within 20 ms (a sync to disk), and in a fifth of the seeds
        // within half a second (an overloaded machine).
        s.holder_delay_ms = if holders.random_bool(HOLDER_SLOW_SEEDS) {
            holders.random_range(50..=500)
        } else {
            holders.random_range(0..=HOLDER_FAST_MS)
        };
        // A slow key holder holds up the keys of whoever refreshes while it is slow, and the
        // seed run without its faulty clients (the throughput check's control) is slow at
        // other moments: one late admission there or here outweighs what the check measures.
        // Where the check runs, holders answer as a machine that is not overloaded does.
        // A key holder slower than a tenth of the refresh period leaves each replica
        // refusing its peers' messages (under the keys it just retired) for much of every
        // period: no deployment runs so (T_k is 15 s by default, a holder answers in
        // milliseconds), and the liveness bound is not made for it (T_k is 1.5 s in the
        // proactive-recovery seeds).
        s.holder_delay_ms = s.holder_delay_ms.min(s.core.key_refresh_ms / 10);
        if s.throughput_share.is_some() {
            s.fast_holders();
        }
        s
    }

    /// Key holders that answer within [`HOLDER_FAST_MS`], as on a machine that is not
    /// overloaded: where a check compares the run with a model or a control that slow key
    /// holders are not part of (the throughput check; Prime's bounded delay, whose bound
    /// counts network delays and takes processing to be fast).
    pub fn fast_holders(&mut self) {
        self.holder_delay_ms = self.holder_delay_ms.min(HOLDER_FAST_MS);
    }
}

/// The stale-reads template: reads on the fast path to every replica, the f faulty replicas
/// answer them with a lagging correct replica's results ([`Behavior::StaleReads`]), and one
/// correct replica hears its peers 30 to 150 ms late for the whole run, so that it answers
/// reads from a state that misses writes other clients saw complete. Its answer and the f
/// copies are f+1 matching stale results: a client must wait for 2f+1.
pub fn stale_reads_beside_lagging(s: &mut Scenario, rng: &mut ChaCha8Rng) {
    let (f, n) = (s.core.f as usize, s.core.n());
    s.core.read_only_fast_path = true;
    s.core.read_only_to_quorum = false;
    s.byzantine.clear();
    s.amnesia.clear();
    s.corruptions.clear();
    s.pauses.clear();
    // Colluding clients need colluding replicas.
    s.byz_clients.retain(|a| ClientAttack::ALL.contains(a));
    let mut ids: Vec<ReplicaId> = (0..n).collect();
    shuffle(rng, &mut ids);
    for r in &ids[..f] {
        s.byzantine.push((*r, Behavior::StaleReads));
    }
    s.slow_inbound = vec![(ids[f], rng.random_range(30..150))];
    s.throughput_share = None;
    s.keys = 1;
    s.ops_per_client = s.ops_per_client.max(40);
}

/// The planted-VIEW-CHANGE template: proactive recovery with no other faulty replica, each
/// compromised replica running the core unchanged (so that batches commit with it while
/// correct replicas are cut off) while the adversary plants random messages with its keys,
/// and the coordinated attack of [`Plant::join`]. Holds are long enough for the
/// attacker to cut replicas off and send its view change before the watchdog fires.
pub fn planted_join(s: &mut Scenario) {
    s.byzantine.clear();
    s.amnesia.clear();
    s.corruptions.clear();
    proactive_recovery(s, Behavior::Honest);
    if let Some(p) = s.proactive.as_mut() {
        p.hold_ms = (2000, 3000);
    }
    s.plant = Some(Plant { join: true });
}

/// Configures proactive recovery with short periods (virtual time): T_k 1.5 s, 3f+2
/// compromises, a workload long enough to run through all of them.
pub fn proactive_recovery(s: &mut Scenario, behavior: Behavior) {
    let f = s.core.f;
    s.core.key_refresh_ms = 1500;
    s.core.client_key_lifetime_ms = 6000;
    s.core.recovery_interval_min_ms = 2000;
    let compromises = 3 * f + 2;
    s.proactive = Some(Proactive {
        compromises,
        hold_ms: (300, 1500),
        behavior,
        gap_ms: 2 * s.core.key_refresh_ms + 500,
        first_ms: 500,
    });
    // Enough operations to keep clients busy through most compromises (about 5 s each); the
    // run lasts until every recovery completed in any case.
    s.ops_per_client = s.ops_per_client.max(80 * compromises);
    s.think_ms = (10, 40);
    s.liveness_bound_ms = s.liveness_bound_ms.max(20_000 * compromises as u64);
}

fn pick(rng: &mut ChaCha8Rng, p: f64, range: std::ops::Range<f64>) -> f64 {
    if rng.random_bool(p) {
        rng.random_range(range)
    } else {
        0.0
    }
}

pub(super) fn shuffle<T>(rng: &mut ChaCha8Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
}
