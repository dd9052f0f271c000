//! Running many seeds, in parallel threads, each one independent and reproducible.

use crate::scenario::Scenario;
use crate::world::{Outcome, World};
use redoubt_core::Mutant;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Looks a mutant up by its command-line name.
pub fn mutant_by_name(name: &str) -> Option<Mutant> {
    Mutant::ALL
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, m)| *m)
}

/// Which optimizations the random seeds run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Optimizations {
    /// Drawn per seed.
    #[default]
    PerSeed,
    /// Every one on in every seed ([`Scenario::all_optimizations`]).
    All,
    /// Every one but tentative execution, with a quiet primary ([`Scenario::quiet_primary`]).
    QuietPrimary,
    /// Every one, tentative execution for small batches only and a quiet primary for the
    /// others ([`Scenario::hybrid`], the default's mix).
    Hybrid,
    /// Drawn per seed, in the separated deployment ([`Scenario::separate`]).
    Separated,
    /// Drawn per seed, in the firewall deployment ([`Scenario::firewall`]).
    Firewall,
    /// Drawn per seed, ordered by Prime ([`Scenario::prime`]).
    Prime,
    /// [`Optimizations::Prime`] with the bounded-delay check on.
    PrimeBounded,
    /// Ordered by Prime, in the separated deployment ([`Scenario::prime`], then
    /// [`Scenario::separate`]).
    PrimeSeparated,
    /// Ordered by Prime, in the firewall deployment ([`Scenario::prime`], then
    /// [`Scenario::firewall`]).
    PrimeFirewall,
}

/// The scenario of a seed: random, with the given mutant.
pub fn scenario_for(seed: u64, mutant: Mutant, opts: Optimizations) -> Scenario {
    let mut s = Scenario::random(seed);
    s.mutant = mutant;
    match opts {
        Optimizations::PerSeed => {}
        Optimizations::All => s.all_optimizations(),
        Optimizations::QuietPrimary => s.quiet_primary(),
        Optimizations::Hybrid => s.hybrid(),
        Optimizations::Separated => s.separate(),
        Optimizations::Firewall => s.firewall(),
        Optimizations::Prime => s.prime(),
        Optimizations::PrimeBounded => {
            s.prime();
            s.bounded_delay = true;
            s.fast_holders();
        }
        Optimizations::PrimeSeparated => {
            s.prime();
            s.separate();
        }
        Optimizations::PrimeFirewall => {
            s.prime();
            s.firewall();
        }
    }
    s
}

/// Runs one scenario (and, with the throughput check, its control: see
/// [`crate::throughput`]). A panic inside the core (a failed internal assertion) is a failure of
/// the run, reported with its message, not a crash of the runner.
pub fn run(s: Scenario, trace: bool) -> Outcome {
    if s.throughput_share.is_none() {
        return run_once(s, trace);
    }
    let control = crate::throughput::control(&s);
    let mut out = run_once(s.clone(), trace);
    if out.passed() {
        let calm = run_once(control, false);
        crate::throughput::check(&mut out, &calm, &s);
    }
    out
}

fn run_once(s: Scenario, trace: bool) -> Outcome {
    let (name, seed) = (s.name.clone(), s.seed);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| World::new(s, trace).run())) {
        Ok(out) => out,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Outcome {
                scenario: name,
                seed,
                violations: vec![format!("panic: {msg}")],
                stats: Default::default(),
                trace: Vec::new(),
            }
        }
    }
}

/// The holes of the core (found by the stronger adversary of 2026-12) that a failing seed
/// may be failing on, by the attacks its scenario draws and its first violation; `None` when
/// the failure is none of them. Tests and sweeps tell these failures apart from the others, so
/// that the known holes do not hide new failures. Remove an entry once the core fix for it
/// has landed: failures of that kind then count as any other.
pub fn open_hole(out: &Outcome) -> Option<&'static str> {
    // None is open today. Add an entry here (matching the attack in `out.stats` or the
    // violation) when the adversary finds a hole whose fix is not in yet.
    let _ = out;
    None
}

/// Aggregate of a multi-seed run.
#[derive(Debug, Default)]
pub struct Summary {
    pub passed: u64,
    pub failed: u64,
    /// Failures that are none of the open holes of [`open_hole`].
    pub unexplained: u64,
    /// (seed, first violation) of each failure, in seed order.
    pub failures: Vec<(u64, String)>,
    /// (seed, open hole) of each failure [`open_hole`] attributes to one.
    pub holes: Vec<(u64, &'static str)>,
    pub ops: u64,
    pub view_changes: u64,
    pub state_transfers: u64,
    pub tentative_undone: u64,
}

/// Runs `count` seeds from `start` on `jobs` threads. `progress` is called after each seed.
/// `stop_after_failures` counts the failures no open hole explains.
#[allow(clippy::too_many_arguments)]
pub fn run_seeds(
    start: u64,
    count: u64,
    mutant: Mutant,
    opts: Optimizations,
    jobs: usize,
    stop_after_failures: Option<u64>,
    progress: impl Fn(&Outcome) + Sync,
) -> Summary {
    let next = AtomicU64::new(start);
    let summary = Arc::new(Mutex::new(Summary::default()));
    let end = start + count;
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                if let Some(limit) = stop_after_failures {
                    if summary.lock().expect("lock").unexplained >= limit {
                        return;
                    }
                }
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= end {
                    return;
                }
                let sc = scenario_for(seed, mutant, opts);
                let out = run(sc.clone(), false);
                progress(&out);
                let mut s = summary.lock().expect("lock");
                s.ops += out.stats.ops_completed;
                s.view_changes += out.stats.view_changes;
                s.state_transfers += out.stats.state_transfers;
                s.tentative_undone += out.stats.tentative_undone;
                if out.passed() {
                    s.passed += 1;
                } else {
                    s.failed += 1;
                    s.failures.push((seed, out.violations[0].clone()));
                    match open_hole(&out) {
                        Some(h) => s.holes.push((seed, h)),
                        None => s.unexplained += 1,
                    }
                }
            });
        }
    });
    let mut s = Arc::try_unwrap(summary)
        .expect("threads joined")
        .into_inner()
        .expect("lock");
    s.failures.sort();
    s.holes.sort();
    s
}

/// What the named scenario `colluding-client` measures: the correct clients' completed
/// operations in its 60 s window under the attack and in a fault-free run of the same seed
/// (the faulty replica and the faulty client taken out), their ratio, and the view changes
/// under the attack.
#[derive(Debug)]
pub struct CollusionReport {
    pub attack: Outcome,
    pub control: Outcome,
    pub attack_ops: u64,
    pub control_ops: u64,
    /// `attack_ops / control_ops`.
    pub ratio: f64,
    pub view_changes: u64,
}

/// Runs `colluding-client` with seed `seed`, and its fault-free control.
pub fn colluding_client(seed: u64, trace: bool) -> CollusionReport {
    let sc = Scenario::named("colluding-client", seed).expect("named scenario exists");
    let mut control = sc.clone();
    control.name = "colluding-client (attack off)".into();
    control.byzantine.clear();
    control.byz_clients.clear();
    let attack = run(sc, trace);
    let control = run(control, false);
    let (attack_ops, control_ops) = (attack.stats.ops_completed, control.stats.ops_completed);
    CollusionReport {
        ratio: attack_ops as f64 / control_ops.max(1) as f64,
        view_changes: attack.stats.view_changes,
        attack_ops,
        control_ops,
        attack,
        control,
    }
}
