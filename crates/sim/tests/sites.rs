//! `redoubt-sim --sites` in CI: a handful of seeds pass, and each mutant of the sites is caught
//! at the first seed the sweep found it (docs/simulator.md, "Wide-area sites").

use redoubt_sim::sites::{run, SitesScenario};
use redoubt_sites::Mutant;

#[test]
fn sites_seeds_pass() {
    for seed in 0..6 {
        let out = run(SitesScenario::draw(seed, Mutant::None));
        assert!(
            out.passed(),
            "seed {seed} failed (replay: redoubt-sim --sites --seed {seed}): {} {:#?}",
            out.summary,
            out.violations
        );
    }
}

#[test]
fn every_sites_mutant_is_caught() {
    for (name, mutant, seed) in [
        ("server-clock", Mutant::ServerClock, 0),
        ("share-unverified", Mutant::ShareUnverified, 20),
        ("no-blacklisting", Mutant::NoBlacklisting, 4),
        ("decode-on-receipt", Mutant::DecodeOnReceipt, 1),
        ("leave-alone", Mutant::LeaveAlone, 227),
    ] {
        // The same seed passes with correct sites.
        assert!(
            run(SitesScenario::draw(seed, Mutant::None)).passed(),
            "seed {seed}"
        );
        let out = run(SitesScenario::draw(seed, mutant));
        assert!(
            !out.passed(),
            "mutant {name} not caught at seed {seed} (redoubt-sim --sites --mutant {name} --seed {seed})"
        );
    }
}
