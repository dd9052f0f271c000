//! The seeded simulator: whole overlays of [`crate::Node`]s in one thread, in virtual time,
//! over a network that delays, loses, duplicates and reorders datagrams, with faulty nodes
//! that drop, delay, modify, misroute, forge acks, inject or collude, and checkers
//! ([`check`]) run at the end. A seed decides everything, so a failing seed replays exactly.

pub mod adversary;
pub mod bench;
pub mod check;
pub mod scenario;
pub mod world;

use crate::config::Mutant;
use crate::stats::Stats;
use scenario::Scenario;
use world::World;

/// Outcome of one seed.
#[derive(Debug)]
pub struct SeedReport {
    pub seed: u64,
    pub description: String,
    pub failures: Vec<String>,
    /// Counters of all nodes added up.
    pub stats: Stats,
    pub delivered: usize,
    pub accusations: usize,
    pub end_ms: u64,
    /// Protocol events of every node, in time order, for replaying a seed by eye.
    pub trace: Vec<String>,
}

/// Runs the scenario of `seed` (with `mutant` compiled into every node) and checks it.
pub fn run_seed(seed: u64, mutant: Mutant) -> SeedReport {
    let sc = Scenario::generate(seed, mutant);
    run_scenario(sc)
}

/// Runs and checks a given scenario.
pub fn run_scenario(sc: Scenario) -> SeedReport {
    let description = sc.describe();
    let end = sc.end_ms;
    let mut w = World::new(sc);
    w.run(end);
    let failures = check::check(&w.sc, &w.obs, &w.adversaries);
    let mut stats = Stats::default();
    for n in w.nodes.iter().flatten() {
        stats.add(n.stats());
    }
    SeedReport {
        seed: w.sc.seed,
        description,
        failures,
        stats,
        delivered: w.obs.delivered.len(),
        accusations: w
            .obs
            .events
            .iter()
            .filter(|(_, _, e)| matches!(e, crate::node::Event::Accused { .. }))
            .count(),
        end_ms: w.obs.end_ms,
        trace: w
            .obs
            .events
            .iter()
            .map(|(t, n, e)| format!("{t:>7} ms {n}: {e:?}"))
            .collect(),
    }
}

/// Runs a seed, turning a panic into a failure that names the seed.
pub fn run_seed_catching(seed: u64, mutant: Mutant) -> SeedReport {
    match std::panic::catch_unwind(|| run_seed(seed, mutant)) {
        Ok(r) => r,
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            SeedReport {
                seed,
                description: Scenario::generate(seed, mutant).describe(),
                failures: vec![format!("panic: {msg}")],
                stats: Stats::default(),
                delivered: 0,
                accusations: 0,
                end_ms: 0,
                trace: Vec::new(),
            }
        }
    }
}
