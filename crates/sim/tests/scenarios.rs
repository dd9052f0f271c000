//! Named scenarios, a CI-sized seed run, the checker self-test with mutants, and the
//! bounded-memory run. Each test prints the seed to replay on failure.

use redoubt_core::Mutant;
use redoubt_sim::runner::{mutant_by_name, run, run_seeds, scenario_for, Optimizations, Summary};
use redoubt_sim::{Outcome, Scenario};

fn assert_passes(out: &Outcome) {
    assert!(
        out.passed(),
        "{} seed {} failed (replay: redoubt-sim --scenario {} --seed {} --trace): {:#?}",
        out.scenario,
        out.seed,
        out.scenario,
        out.seed,
        out.violations
    );
}

fn named(name: &str, seeds: std::ops::Range<u64>) -> Vec<Outcome> {
    seeds
        .map(|seed| {
            let out = run(Scenario::named(name, seed).expect("scenario exists"), false);
            assert_passes(&out);
            out
        })
        .collect()
}

/// Proactive recovery under Prime: replicas compromised in turn (lying about pre-ordering
/// and Suspect-Leader in some seeds, planting rows far ahead signed with the order key they
/// took in others) are rebooted, their recovery requests introduced by the others and
/// ordered, their order keys replaced and their numbering fenced; every recovery completes
/// and no planted row outlives one. Seed 483 stalled before a restarted replica found its
/// drawn order key again; seed 5832 before originators resent certified PO-REQUESTs to a
/// recovered replica that had forgotten them.
#[test]
fn prime_replicas_recover_proactively() {
    for seed in [58, 100, 483, 5832] {
        let s = scenario_for(seed, Mutant::None, Optimizations::Prime);
        assert!(
            s.proactive.is_some(),
            "seed {seed} draws proactive recovery"
        );
        let out = run(s, false);
        assert_passes(&out);
        assert!(
            out.stats.recoveries >= 5,
            "seed {seed}: {} recoveries",
            out.stats.recoveries
        );
    }
}

#[test]
fn calm_cluster_completes_everything() {
    for out in named("calm", 0..5) {
        assert_eq!(out.stats.view_changes, 0, "no view change without faults");
        assert!(out.stats.ops_completed >= 60);
    }
}

#[test]
fn primary_crash_then_view_change_then_progress() {
    for out in named("primary-crash", 0..5) {
        assert!(out.stats.max_view >= 1, "a view change happened");
        assert!(out.stats.ops_completed >= 60, "and service continued");
    }
}

#[test]
fn equivocating_primary_causes_no_divergence() {
    named("equivocating-primary", 0..8);
}

#[test]
fn f_byzantine_plus_partition_then_heal_completes_every_request() {
    named("byzantine-partition-heal", 0..5);
}

#[test]
fn two_view_changes_in_a_row_before_progress() {
    for out in named("two-view-changes", 0..5) {
        assert!(
            out.stats.max_view >= 2,
            "views 0 and 1 both failed: {:?}",
            out.stats
        );
    }
}

#[test]
fn backup_behind_low_watermark_rejoins_by_state_transfer() {
    for out in named("lagging-backup", 0..4) {
        assert!(out.stats.state_transfers >= 1, "{:?}", out.stats);
    }
}

#[test]
fn slow_primary_does_not_break_safety_or_liveness() {
    named("slow-primary", 0..3);
}

/// With the pace check, a primary that turns slow (holding every pre-prepare for 40% of the
/// view-change timeout, so that no request timer fires) is replaced: the workload completes
/// within a budget that, without the check, the same primary makes it miss.
#[test]
fn the_pace_check_replaces_a_sluggish_primary() {
    for out in named("sluggish-primary", 0..3) {
        assert!(out.stats.max_view >= 1, "replaced: {:?}", out.stats);
    }
    // Without the check the same primary stretches the workload past the budget (in at
    // least one of the seeds: how far past depends on the seed's timing).
    let missed: Vec<u64> = (0..3)
        .filter(|seed| {
            let mut s = Scenario::named("sluggish-primary", *seed).expect("scenario exists");
            s.core.primary_pace_window_ms = 0;
            let out = run(s, false);
            out.violations.iter().any(|v| v.contains("liveness"))
        })
        .collect();
    assert!(
        !missed.is_empty(),
        "without the check the sluggish primary stretches the workload past the budget"
    );
}

#[test]
fn bogus_new_view_is_rejected() {
    for out in named("bogus-new-view", 0..5) {
        assert!(out.stats.max_view >= 2, "{:?}", out.stats);
    }
}

/// A primary forging its NEW-VIEW from made-up view changes is voted out: nobody enters
/// its view on the forgery (the adopt-unchecked-new-view mutant fails here).
#[test]
fn forged_new_view_is_not_entered() {
    for out in named("forged-new-view", 0..5) {
        assert!(out.stats.max_view >= 2, "{:?}", out.stats);
    }
}

#[test]
fn stale_view_change_claims_are_outvoted() {
    named("stale-claims", 0..4);
}

#[test]
fn primary_step_down_hands_over() {
    for out in named("step-down", 0..4) {
        assert!(out.stats.max_view >= 2, "{:?}", out.stats);
    }
}

/// Runs `count` random seeds from `start` on every core and fails the test on any failing
/// seed, naming the `redoubt-sim` flags (`replay`) that replay it. Seeds failing on an open
/// hole of the core (`runner::open_hole`: attacks of the stronger adversary whose core fixes
/// have not landed) are listed but tolerated.
fn seeds_pass(start: u64, count: u64, opts: Optimizations, replay: &str) -> Summary {
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let s = run_seeds(start, count, Mutant::None, opts, jobs, None, |_| {});
    if !s.holes.is_empty() {
        eprintln!(
            "{} seeds fail on open holes of the core (tolerated until fixed): {:?}",
            s.holes.len(),
            s.holes
        );
    }
    let holes: Vec<u64> = s.holes.iter().map(|(seed, _)| *seed).collect();
    let unexplained: Vec<&(u64, String)> = s
        .failures
        .iter()
        .filter(|(seed, _)| !holes.contains(seed))
        .collect();
    assert!(
        unexplained.is_empty(),
        "failing seeds (replay with redoubt-sim{replay} --seed S --trace): {unexplained:#?}"
    );
    s
}

/// The CI-sized random run: 500 seeds mixing every fault kind.
#[test]
fn five_hundred_random_seeds() {
    let s = seeds_pass(1_000_000, 500, Optimizations::PerSeed, "");
    assert!(
        s.view_changes > 0 && s.state_transfers > 0 && s.tentative_undone > 0,
        "the mix exercised view changes, state transfer and undoing tentative batches: {s:?}"
    );
}

/// A quiet primary (committed replies, first replies from the backups only) with a silent
/// backup on a lossy network: every request completes from the two other backups' replies
/// (the liveness checker bounds how long each may take).
#[test]
fn a_quiet_primary_and_a_silent_backup_still_answer_every_request() {
    for out in named("quiet-primary-silent-backup", 0..5) {
        assert!(out.stats.ops_completed >= 60, "{:?}", out.stats);
    }
}

/// The random mix with a quiet primary in every seed (every optimization but tentative
/// execution, which a quiet primary cannot be combined with).
#[test]
fn two_hundred_seeds_with_a_quiet_primary() {
    seeds_pass(
        3_000_000,
        200,
        Optimizations::QuietPrimary,
        " --quiet-primary",
    );
}

/// The random mix with the default's mix of execution in every seed: small batches execute
/// tentatively, larger ones once committed with a quiet primary.
#[test]
fn two_hundred_seeds_with_tentative_execution_for_small_batches() {
    let s = seeds_pass(4_000_000, 200, Optimizations::Hybrid, " --hybrid");
    assert!(s.tentative_undone > 0, "{s:?}");
}

/// The same mix with every optimization switched on in every seed (tentative execution,
/// requests beside the pre-prepare, digest replies, read-only fast path).
#[test]
fn three_hundred_seeds_with_every_optimization() {
    let s = seeds_pass(2_000_000, 300, Optimizations::All, " --all-optimizations");
    assert!(s.tentative_undone > 0, "{s:?}");
}

/// The separated deployment in every seed: replicas only order, 2g+1 execution nodes (up to
/// g of them silent, lying or dropping half they send) run the service; the random mix of
/// network and replica faults otherwise as drawn.
#[test]
fn two_hundred_seeds_in_the_separated_deployment() {
    let s = seeds_pass(5_000_000, 200, Optimizations::Separated, " --separated");
    assert!(s.view_changes > 0 && s.state_transfers > 0, "{s:?}");
    let faulty = (5_000_000..5_000_200)
        .filter(|seed| {
            !scenario_for(*seed, Mutant::None, Optimizations::Separated)
                .exec_byzantine
                .is_empty()
        })
        .count();
    assert!(
        faulty > 100,
        "{faulty} of 200 seeds drew faulty execution nodes"
    );
}

/// Prime orders, 2g+1 execution nodes run the service (up to g of them faulty): what each
/// ordered matrix made eligible goes down as the batch, which every correct replica derives
/// alike. Seed 137 halted when replicas took clients' reads for the read-only fast path,
/// which only a replica running the service has: under Prime they were pooled for a leader
/// that never batches requests.
#[test]
fn a_hundred_seeds_ordered_by_prime_in_the_separated_deployment() {
    let s = seeds_pass(
        7_000_000,
        100,
        Optimizations::PrimeSeparated,
        " --ordering prime --separated",
    );
    assert!(s.view_changes > 0 && s.state_transfers > 0, "{s:?}");
    let out = run(
        scenario_for(137, Mutant::None, Optimizations::PrimeSeparated),
        false,
    );
    assert_passes(&out);
}

/// Prime orders behind the privacy firewall: the firewall's mix (filters, faulty execution
/// nodes leaking values, the confidentiality check at every delivery) with Prime's.
#[test]
fn twenty_seeds_ordered_by_prime_behind_the_firewall() {
    seeds_pass(
        7_100_000,
        20,
        Optimizations::PrimeFirewall,
        " --ordering prime --firewall",
    );
}

/// The firewall deployment in every seed: the separated deployment with sealed bodies and an
/// (h+1)² array of filters between the clusters (up to h of them silent or leaking
/// everything), faulty execution nodes leaking values through reply contents, extra
/// certificates and bad signature shares; the confidentiality check at every delivery.
#[test]
fn a_hundred_seeds_in_the_firewall_deployment() {
    let s = seeds_pass(6_000_000, 100, Optimizations::Firewall, " --firewall");
    assert!(s.view_changes > 0, "{s:?}");
    let drawn: Vec<Scenario> = (6_000_000..6_000_100)
        .map(|seed| scenario_for(seed, Mutant::None, Optimizations::Firewall))
        .collect();
    let faulty_filters = drawn
        .iter()
        .filter(|s| !s.filter_byzantine.is_empty())
        .count();
    let leaky = drawn
        .iter()
        .filter(|s| {
            s.exec_byzantine
                .iter()
                .any(|(_, b)| *b == redoubt_sim::scenario::ExecBehavior::Liar)
        })
        .count();
    assert!(
        faulty_filters > 50,
        "{faulty_filters} of 100 seeds drew faulty filters"
    );
    assert!(
        leaky > 10,
        "{leaky} of 100 seeds drew leaking execution nodes"
    );
}

/// Behind the firewall, the leak attempts of faulty execution nodes and filters are blocked
/// (counted by the correct filters), not merely absent.
#[test]
fn the_firewall_blocks_leak_attempts() {
    let mut blocked = 0;
    let mut seeds = 0;
    for seed in 6_100_000..6_100_100 {
        let s = scenario_for(seed, Mutant::None, Optimizations::Firewall);
        let liar = s
            .exec_byzantine
            .iter()
            .any(|(_, b)| *b == redoubt_sim::scenario::ExecBehavior::Liar);
        if !liar {
            continue;
        }
        seeds += 1;
        let out = run(s, false);
        assert!(
            out.passed(),
            "seed {seed} (--firewall): {:?}",
            out.violations
        );
        blocked += out.stats.firewall_blocked;
        if seeds == 8 {
            break;
        }
    }
    assert!(
        seeds >= 4 && blocked > 0,
        "{seeds} seeds, {blocked} blocked"
    );
}

/// Bodies sent in clear (mutant `clear-bodies`) are caught behind the firewall too.
#[test]
fn clear_bodies_are_caught_behind_the_firewall() {
    let s = run_seeds(
        7_000_000,
        20,
        Mutant::ClearBodies,
        Optimizations::Firewall,
        2,
        Some(1),
        |_| {},
    );
    assert!(s.unexplained > 0, "clear-bodies survived 20 firewall seeds");
}

/// An execution node that rebooted and fell behind what certificates reach fetches a
/// checkpoint from the others (state transfer between execution nodes), and the run passes.
#[test]
fn rebooted_execution_nodes_catch_up_by_state_transfer() {
    let mut transfers = 0;
    let mut rebooted = 0;
    for seed in 5_000_000..5_000_200 {
        let s = scenario_for(seed, Mutant::None, Optimizations::Separated);
        if s.exec_reboots.is_empty() {
            continue;
        }
        rebooted += 1;
        let out = run(s, false);
        assert!(
            out.passed(),
            "seed {seed} (--separated): {:?}",
            out.violations
        );
        transfers += out.stats.exec_state_transfers;
    }
    assert!(rebooted > 50, "{rebooted} seeds rebooted an execution node");
    assert!(
        transfers > 0,
        "no execution node fetched state in {rebooted} seeds"
    );
}

/// Random seeds that once found a bug, each replayed in the mode that found it.
#[test]
fn seeds_that_once_failed() {
    // (seed, mode, what it found)
    let seeds = [
        // An idle primary never proposed the recovery point of a replica recovering behind
        // an unsigned request of a suspected client.
        (1983, Optimizations::All, " --all-optimizations"),
        // A recovering replica fetching state timed out on a request it had committed but
        // not executed, and sat alone in a view change until the others moved.
        (10998, Optimizations::Hybrid, " --hybrid"),
        // A recovered replica could not check the NEW-VIEW of the view the others were in
        // (it named a view change sent under keys since retired) and lagged until the next
        // view change; in 8169 one of the others had itself recovered and could not vouch
        // for the view it was in, so 2f+1 vouchers were too many to ask for.
        (43460, Optimizations::PerSeed, ""),
        (47710, Optimizations::PerSeed, ""),
        (8169, Optimizations::All, " --all-optimizations"),
        // The same, in a view that had outlasted a round of proactive recoveries: every
        // replica active in it had recovered since entering it, so none vouched for it.
        (12819, Optimizations::QuietPrimary, " --quiet-primary"),
        // A fetched checkpoint the service did not load from (a kept page corrupt where its
        // digest entry did not show it) left the state one checkpoint ahead of execution
        // while the replica fetched the pages again: the core's invariant said it could not be.
        (66029, Optimizations::PerSeed, " --bodies clear"),
        (98930, Optimizations::PerSeed, " --bodies clear"),
    ];
    for (seed, opts, replay) in seeds {
        // As they ran when they failed: bodies in clear (sealed bodies were drawn later).
        let mut s = scenario_for(seed, Mutant::None, opts);
        s.core.confidential_bodies = false;
        let out = run(s, false);
        assert!(
            out.passed(),
            "seed {seed} (replay with redoubt-sim{replay} --seed {seed} --trace): {:?}",
            out.violations
        );
        // And with sealed bodies.
        let mut s = scenario_for(seed, Mutant::None, opts);
        s.core.confidential_bodies = true;
        assert!(run(s, false).passed(), "seed {seed} with sealed bodies");
    }
}

/// Sealed bodies in every seed of a sweep: no correct principal's frame holds a value in
/// clear (the checker of `world/secrets.rs`), and every operation completes.
#[test]
fn two_hundred_seeds_with_sealed_bodies() {
    let mut sealed = 0;
    for seed in 2_000_000..2_000_200 {
        let s = scenario_for(seed, Mutant::None, Optimizations::PerSeed);
        if !s.core.confidential_bodies {
            continue;
        }
        sealed += 1;
        let out = run(s, false);
        assert!(out.passed(), "seed {seed}: {:?}", out.violations);
    }
    assert!(sealed > 60, "{sealed} of 200 seeds drew sealed bodies");
}

/// Every mutant is caught by the random sweep of its deployment's mode within the default
/// seed budget (no named scenario helps): the checkers can fail, and the random mix draws
/// the behaviours that find each hole.
#[test]
fn every_mutant_is_caught() {
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, m) in Mutant::ALL {
        assert_eq!(mutant_by_name(name), Some(m), "{name}");
        // Stranding a replica costs flat clients nothing (they send to every replica): the
        // sites' sweep catches it (crates/sim/tests/sites.rs).
        if m == Mutant::LeaveAlone {
            continue;
        }
        // The mutants of the separated deployment break it only: its random mix.
        let opts = match m {
            Mutant::TrustOneOrder | Mutant::ExecReplyAtG => Optimizations::Separated,
            Mutant::FilterUnvouched
            | Mutant::ThresholdAtG
            | Mutant::TrustViewHint
            | Mutant::TrustOneCertifiedCopy
            | Mutant::OneFilterVouches => Optimizations::Firewall,
            Mutant::PoAcksAtF
            | Mutant::CutWithoutQuorum
            | Mutant::KeepOrderKeys
            | Mutant::ForgetOwnAcks
            | Mutant::OriginatorTrustsMacs => Optimizations::Prime,
            Mutant::LeaderNeverSuspected | Mutant::TrustRetiredRows => Optimizations::PrimeBounded,
            _ => Optimizations::PerSeed,
        };
        // Within 2000 seeds from seed 0 (issue 51's budget); failures on an
        // open hole of the core do not count as catching the mutant. The bounded-delay check
        // fails seed 12 with the correct core too (docs/simulator.md): its mutant is sought
        // from seed 13 on (the correct core passes seeds 13 to 199 with the check).
        let start = if matches!(m, Mutant::LeaderNeverSuspected | Mutant::TrustRetiredRows) {
            13
        } else {
            0
        };
        let s = run_seeds(start, 2000, m, opts, jobs, Some(1), |_| {});
        assert!(s.unexplained > 0, "mutant {name} survived 2000 seeds");
    }
}

/// 100,000 requests through the simulator; every bounded structure stays within its bound
/// (the world checks footprints every ~1000 events and fails the run otherwise).
#[test]
fn bounded_memory_over_100k_requests() {
    let mut s = Scenario::calm(7);
    s.name = "bounded-memory".into();
    s.clients = 50;
    s.ops_per_client = 2000;
    s.think_ms = (0, 2);
    s.core.batch_requests_max = 32;
    s.liveness_bound_ms = 600_000;
    let out = run(s, false);
    assert_passes(&out);
    assert!(out.stats.ops_completed >= 100_000, "{:?}", out.stats);
}

/// Every replica loses power at once mid-workload and reboots from its journal: no
/// acknowledged write is lost (linearizability holds across the restart) and service resumes,
/// also when the primary had started handing over.
#[test]
fn all_replicas_rebooting_at_once_lose_nothing() {
    for out in named("restart-all", 0..5) {
        assert!(out.stats.ops_completed >= 120, "{:?}", out.stats);
    }
    // The same after the primary handed over as it was stopped: it reboots in a view change
    // that the backups, which rebooted in its view, must join.
    for out in named("restart-after-hand-over", 0..5) {
        assert!(out.stats.ops_completed >= 120, "{:?}", out.stats);
    }
}

/// A replica whose state is silently corrupted notices at its next checkpoint (f+1 replicas
/// vouch for another digest) and repairs itself by state transfer.
#[test]
fn corrupted_replica_repairs_itself() {
    for out in named("corrupted-replica", 0..4) {
        assert!(out.stats.state_transfers >= 1, "{:?}", out.stats);
        assert_eq!(out.stats.unrepaired_at_end, 0, "{:?}", out.stats);
    }
}

#[test]
fn corrupt_pages_found_by_a_scrub_are_fetched() {
    for out in named("page-corruption-scrub", 0..6) {
        assert!(out.stats.corrupt_pages_found >= 1, "{:?}", out.stats);
        assert!(out.stats.state_transfers >= 1, "{:?}", out.stats);
        assert_eq!(out.stats.unrepaired_at_end, 0, "{:?}", out.stats);
    }
}

#[test]
fn corrupt_pages_found_at_start_up_are_fetched() {
    for out in named("page-corruption-reboot", 0..6) {
        assert!(out.stats.corrupt_pages_found >= 1, "{:?}", out.stats);
        assert!(out.stats.state_transfers >= 1, "{:?}", out.stats);
        assert_eq!(out.stats.unrepaired_at_end, 0, "{:?}", out.stats);
    }
}

#[test]
fn page_transfer_while_the_others_execute_and_collect_checkpoints() {
    for out in named("transfer-under-load", 0..6) {
        assert!(out.stats.state_transfers >= 1, "{:?}", out.stats);
        assert!(out.stats.pages_fetched >= 1, "{:?}", out.stats);
    }
}

#[test]
fn a_lying_replier_is_detected_and_avoided() {
    for out in named("lying-replier", 0..8) {
        assert!(out.stats.state_transfers >= 1, "{:?}", out.stats);
    }
}

#[test]
fn fast_path_reads_stay_linearizable_against_stale_answers() {
    named("stale-reads", 0..10);
}

/// A primary that adds a write no client sent to its batches never gets it ordered: every
/// correct backup doubts it. Faulty clients whose authenticators verify at some replicas only
/// get their requests ordered without stalling anyone, the correct replicas vouching for
/// different requests of one batch.
#[test]
fn forged_requests_never_prepare_and_partial_authenticators_do_not_stall() {
    for out in named("forging-primary", 0..6) {
        assert!(out.stats.requests_doubted > 0, "{:?}", out.stats);
    }
    for out in named("partial-authenticators", 0..6) {
        assert!(out.stats.requests_doubted > 0, "{:?}", out.stats);
    }
}

#[test]
fn a_replica_restarting_mid_transfer_fetches_again() {
    for out in named("restart-mid-transfer", 0..6) {
        assert!(out.stats.state_transfers >= 1, "{:?}", out.stats);
    }
}

/// The acceptance run of proactive recovery: more than 3f+1 compromises in turn (state
/// corrupted, keys stolen, the replica lying while held), each ended by a watchdog reboot and
/// a recovery, under a workload on a lossy network; safety and linearizability hold, every
/// recovery completes, and every frame forged with stolen keys after its receiver re-keyed is
/// rejected.
#[test]
fn proactive_recovery_survives_more_than_3f_plus_1_compromises() {
    for out in named("proactive-recovery", 0..3) {
        assert_passes(&out);
        let st = &out.stats;
        assert!(st.compromises >= 5, "3f+2 compromises: {st:?}");
        assert_eq!(
            st.recoveries, st.compromises,
            "every recovery completed: {st:?}"
        );
        assert!(
            st.forged_after_rekey > 0,
            "forgeries were tried after re-keying: {st:?}"
        );
        assert!(
            st.corrupt_pages_found > 0,
            "corrupted pages were found: {st:?}"
        );
    }
}

/// The NEW-VIEW contradiction check fails a run: with the decision procedure broken on
/// purpose (`view-change-any-prepared`), a correct replica accepts a NEW-VIEW that replaces a
/// batch it executed by null (seed 4 at the time of writing).
#[test]
fn a_new_view_contradiction_fails_the_run() {
    let found = (0..40).any(|seed| {
        let mut s = redoubt_sim::runner::scenario_for(seed, Mutant::None, Optimizations::PerSeed);
        s.mutant = Mutant::ViewChangeAnyPrepared;
        run(s, false)
            .violations
            .iter()
            .any(|v| v.contains("NEW-VIEW contradiction"))
    });
    assert!(found, "no contradiction reported within 40 seeds");
}

/// Compromised replicas plant messages sealed with their keys of the moment; what the
/// adversary kept back goes out after they recovered and must be rejected by every receiver
/// that re-keyed since (the forged-frame check). The coordinated attack is carried out.
#[test]
fn planted_frames_released_after_recovery_are_rejected() {
    for seed in [0, 1] {
        let out = run(
            Scenario::named("planted-view-change", seed).expect("scenario exists"),
            false,
        );
        let st = &out.stats;
        assert!(
            st.planted_sent > 0 && st.planted_released > 0 && st.join_attacks > 0,
            "{st:?}"
        );
        assert!(
            !out.violations.iter().any(|v| v.contains("forged")),
            "seed {seed}: {:?}",
            out.violations
        );
    }
}

/// The review's planted-view-change attack (f = 1 and f = 2): VIEW-CHANGEs planted for a later
/// view by replicas long recovered, joined by the replica compromised now, put f+1 lies in the
/// new primary's S. On the core of 2026-12 this breaks safety (NEW-VIEW contradiction: rule B
/// picks null where a batch committed; seeds 9 and 18 of `planted-view-change`, 0, 3, 6, 9 and
/// 11 of `planted-view-change-f2`) or liveness (a
/// fabricated checkpoint reported by f+1 becomes the NEW-VIEW's and correct replicas wait
/// forever to fetch it: seeds 2, 4, 5, 7, 8, ...) at d38d06b; fixed by dropping view-change
/// messages across re-keys (review finding 1).
#[test]
fn planted_view_changes_do_not_break_the_view_change() {
    named("planted-view-change", 0..20);
    named("planted-view-change-f2", 0..10);
}

/// The adversary rewrites each compromised replica's journal or page store before the
/// watchdog reboots it from them; the recovered replica must take part again. On the core of
/// 2026-12 a journaled view near 2^60 is adopted unchecked (the replica reports recovered and
/// stays in that view: seed 0 of `tampered-disk` with that tampering), and a journaled
/// watermark far ahead or a page store whose base was moved far ahead keep the recovery from
/// ever completing. Fixed since (review finding 4): the view estimate and the watermark
/// checked against H_M. Still open: a page store whose base was moved far ahead or made
/// unreadable (`runner::open_hole`); seeds failing that way are tolerated and printed, any
/// other failure fails the test.
#[test]
fn a_tampered_disk_does_not_keep_a_recovered_replica_out() {
    let mut open = Vec::new();
    for seed in 0..10 {
        let out = run(
            Scenario::named("tampered-disk", seed).expect("scenario exists"),
            false,
        );
        assert!(out.stats.disk_tampered > 0, "{:?}", out.stats);
        match redoubt_sim::runner::open_hole(&out) {
            Some(h) if !out.passed() => open.push((seed, h)),
            _ => assert_passes(&out),
        }
    }
    eprintln!("tampered-disk seeds failing on an open hole: {open:?}");
    assert!(open.len() < 10, "every seed hit the open hole: {open:?}");
}

/// Old NEW-KEYs replayed to a replica right after it rebooted must not bring a retired client
/// key back. On the core of 2026-12 a rebooted replica has forgotten the counters it accepted
/// and takes them (every seed of `new-key-replay`; the random network replays of older seeds
/// find it too, e.g. seed 133 after a watchdog reboot) at d38d06b; fixed by the key holder
/// keeping admitted counters (review finding 3).
#[test]
fn replayed_new_keys_after_a_restart_are_refused() {
    for out in named("new-key-replay", 0..5) {
        assert!(out.stats.new_keys_replayed > 0, "{:?}", out.stats);
    }
}

/// A faulty client whose requests verify at the primary only and a faulty backup that vouches
/// for them to the primary alone (ADR 0002, item 7): the primary prepares such a batch, no
/// other replica can, and no view change decides its sequence number. Over 60 simulated
/// seconds the three correct clients must still complete more than half the operations they
/// complete without the attack. On the core of 2026-12 they complete almost none: seed 0
/// prints 3 operations under attack against 6029 without it (ratio 0.000) and 52 view
/// changes, at d38d06b. Since the fix of review finding 2 (f+1 backup vouchers, signed
/// retransmissions, suspected clients) seed 0 completes 5935 against 6070 (ratio 0.978), with
/// 12 view changes.
#[test]
fn colluding_client_and_replica_do_not_halt_the_service() {
    let report = redoubt_sim::runner::colluding_client(0, false);
    assert_passes(&report.attack);
    eprintln!(
        "colluding-client seed 0: {} operations under attack, {} without, ratio {:.3}, {} view \
         changes",
        report.attack_ops, report.control_ops, report.ratio, report.view_changes
    );
    assert!(report.ratio > 0.5, "{report:?}");
}

/// One faulty replica sends a VIEW-CHANGE for the next view with every status: the f+1 join
/// rule keeps every correct replica in view 0 (the scenario's view bound; the mutant
/// `join-at-f` reaches view 133 in seed 0).
#[test]
fn a_lone_faulty_replica_cannot_drag_the_others_into_view_changes() {
    named("view-pusher", 0..4);
}

/// f = 2 faulty replicas equivocate in view changes with valid alternatives (each receiver
/// group gets a well-formed, self-consistent VIEW-CHANGE) under frequent hand-overs.
#[test]
fn valid_equivocation_in_view_changes_is_survived() {
    for out in named("valid-equivocation", 0..4) {
        assert!(out.stats.max_view >= 2, "{:?}", out.stats);
    }
}

/// Numbers near u64::MAX in every message kind, and lies in STATUS and REPLY-STABLE. With
/// overflow checks (a build without --release) the core of d38d06b panicked on them
/// (`*view + 1 >= v` in `start_view_change`, once a VIEW-CHANGE for view u64::MAX was
/// stored); since VIEW_LIMIT and the view window it passes in both builds.
#[test]
fn numbers_near_u64_max_and_status_lies_are_survived() {
    named("extreme-numbers", 0..4);
}

/// Random seeds the throughput check failed (correct clients below a third of their
/// fault-free rate, or view changes the control did not have, once the faults were over),
/// each in the mode that found it; replay with `redoubt-sim [--firewall] --seed S --trace`.
#[test]
fn seeds_the_throughput_check_once_failed() {
    let seeds = [
        // A replica holding an older key of a client than its request used never asked for
        // the new one (35375, after a pause); a request older than a committed one of its
        // client, relayed late, was doubted and its correct client suspected; an operation
        // invoked during a partition counted its whole wait.
        (24461, Optimizations::PerSeed),
        (35375, Optimizations::PerSeed),
        (44822, Optimizations::PerSeed),
        (53961, Optimizations::PerSeed),
        (56867, Optimizations::PerSeed),
        (76631, Optimizations::PerSeed),
        (77605, Optimizations::PerSeed),
        (90677, Optimizations::PerSeed),
        (95621, Optimizations::PerSeed),
        // A suspected correct client paid a timeout per request until it signed them
        // (2174); a replica left alone in a view change reported that view to clients
        // (3802, 5445).
        // A request ordered again behind the firewall, named beside its pre-prepare, left
        // the backups (which had executed it) waiting for its body (1913).
        (1913, Optimizations::Firewall),
        (2017, Optimizations::Firewall),
        (2174, Optimizations::Firewall),
        (3485, Optimizations::Firewall),
        (3802, Optimizations::Firewall),
        (5445, Optimizations::Firewall),
        (6303, Optimizations::Firewall),
        // Wary clients' signed requests sent to every replica made backups' pace checks
        // replace correct primaries.
        (8927, Optimizations::PerSeed),
        (90, Optimizations::Firewall),
        // Behind a firewall, the retransmission back-off of agreement pieces grown while an
        // execution node rebooted outlived the outage: a piece lost afterwards waited 3 s.
        (1121, Optimizations::Firewall),
    ];
    for (seed, opts) in seeds {
        let out = run(scenario_for(seed, Mutant::None, opts), false);
        assert!(out.passed(), "seed {seed}: {:?}", out.violations);
    }
}
