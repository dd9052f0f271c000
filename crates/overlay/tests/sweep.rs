//! The simulator sweep as a test: a few hundred seeds must pass, and each deliberately broken
//! variant of the protocol must be caught by some seed among the first 200 (which pass without
//! the mutant: they are part of the 300 below). The 10,000-seed sweep is run by hand, see the
//! crate documentation.

use redoubt_overlay::sim::run_seed_catching;
use redoubt_overlay::Mutant;

#[test]
fn three_hundred_seeds_pass() {
    let mut failed = Vec::new();
    for seed in 0..300 {
        let r = run_seed_catching(seed, Mutant::None);
        if !r.failures.is_empty() {
            failed.push(format!("seed {seed} ({}): {:?}", r.description, r.failures));
        }
    }
    assert!(
        failed.is_empty(),
        "{} seeds failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn every_mutant_is_caught_within_200_seeds() {
    for mutant in Mutant::ALL {
        let caught = (0..200).find_map(|seed| {
            let r = run_seed_catching(seed, mutant);
            (!r.failures.is_empty()).then_some((seed, r.failures))
        });
        let (seed, failures) = caught.unwrap_or_else(|| panic!("{} not caught", mutant.name()));
        eprintln!("{} caught by seed {seed}: {}", mutant.name(), failures[0]);
        // Without the mutant the same seed passes: the failure is the mutant's doing.
        let clean = run_seed_catching(seed, Mutant::None);
        assert!(
            clean.failures.is_empty(),
            "seed {seed} fails without the mutant: {:?}",
            clean.failures
        );
    }
}
