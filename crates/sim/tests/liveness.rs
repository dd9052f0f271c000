//! Liveness with no fault to blame (issue 51, item 11): the pace check does not replace one
//! correct primary after another at a step in load, and a cluster restarted replica by
//! replica agrees on one view.

use redoubt_sim::runner::run;
use redoubt_sim::{Outcome, Scenario};

/// Runs the named scenario on each seed; fails naming every seed that failed, with the
/// command that replays it.
fn run_named(name: &str, seeds: &[u64]) -> Vec<Outcome> {
    let outs: Vec<Outcome> = seeds
        .iter()
        .map(|seed| {
            run(
                Scenario::named(name, *seed).expect("scenario exists"),
                false,
            )
        })
        .collect();
    let failed: Vec<String> = outs
        .iter()
        .filter(|o| !o.passed())
        .map(|o| {
            format!(
                "redoubt-sim --scenario {name} --seed {}: {:?}",
                o.seed, o.violations
            )
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    outs
}

/// Every message costs about sixteen times as long from 2 s on (a rise in the work per
/// request, to a saturated cluster with the pace check on): one view change at most. Before
/// the pace check rebased its reference and asked for two slow windows in a row, every seed
/// cascaded (views 2 to 4 by 10 s; the run's view bound fails).
#[test]
fn a_load_step_costs_at_most_one_view_change() {
    for out in run_named("pace-load-step", &[0, 1, 2, 3]) {
        assert!(out.stats.max_view <= 1, "{:?}", out.stats);
        assert!(out.stats.ops_completed > 1_000, "{:?}", out.stats);
    }
}

/// A backup reboots a second before the rest of the cluster: it must not start a view change
/// on its own (nobody else is up to join it), and once the primary is back it gets the
/// requests relayed to it while it was down. These seeds left the backup alone in a view
/// change before the fix.
#[test]
fn a_replica_rebooted_before_the_others_agrees_on_their_view() {
    run_named("restart-staggered", &[0, 11, 12, 17, 22, 24, 25, 26]);
}
