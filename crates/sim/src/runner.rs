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
    }
    s
}

/// Runs one scenario. A panic inside the core (a failed internal assertion) is a failure of
/// the run, reported with its message, not a crash of the runner.
pub fn run(s: Scenario, trace: bool) -> Outcome {
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

/// Aggregate of a multi-seed run.
#[derive(Debug, Default)]
pub struct Summary {
    pub passed: u64,
    pub failed: u64,
    /// (seed, first violation) of each failure, in seed order.
    pub failures: Vec<(u64, String)>,
    pub ops: u64,
    pub view_changes: u64,
    pub state_transfers: u64,
    pub tentative_undone: u64,
}

/// Runs `count` seeds from `start` on `jobs` threads. `progress` is called after each seed.
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
                    if summary.lock().expect("lock").failed >= limit {
                        return;
                    }
                }
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= end {
                    return;
                }
                let out = run(scenario_for(seed, mutant, opts), false);
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
                }
            });
        }
    });
    let mut s = Arc::try_unwrap(summary)
        .expect("threads joined")
        .into_inner()
        .expect("lock");
    s.failures.sort();
    s
}
