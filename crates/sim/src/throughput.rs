//! The throughput check (Aardvark's promise): faulty replicas and clients that ought to cost
//! nothing must not slow correct clients down. A seed drawn for it runs twice, as drawn and
//! without its faulty replicas and clients (the control); correct clients' operations per
//! simulated second after the other faults are over must keep the scenario's share of the
//! control's.

use crate::scenario::Scenario;
use crate::world::{Outcome, RunStats};

/// How many more view changes than the control, once the faults are over, a run may see
/// (one started by a timer that ran since before).
const LATE_VIEW_CHANGES_MORE: u64 = 1;

/// Below this many operations after the faults are over, in either run, the rates say too
/// little to compare and the check passes.
const MIN_OPS: u64 = 20;

/// Operations per simulated second of one correct client, from when the faults were over
/// (`measured_from_ms`): a closed loop of the mean latency measured and the mean think time
/// drawn (the same in both runs). Per client, so that the end of a finite workload, when
/// fewer clients still run, weighs nothing. `None` with fewer than [`MIN_OPS`] operations.
pub fn rate(stats: &RunStats, think_ms: (u64, u64)) -> Option<f64> {
    stats.measured_from_ms?;
    if stats.ops_after_settle < MIN_OPS {
        return None;
    }
    let ops = stats.ops_after_settle as f64;
    let think = (think_ms.0 + think_ms.1) as f64 / 2.0;
    Some(1000.0 * ops / (stats.latency_after_settle_ms as f64 + ops * think))
}

/// The control of `s`: the same seed without its faulty replicas and clients.
pub fn control(s: &Scenario) -> Scenario {
    let mut c = s.clone();
    c.name = format!("{} (control)", s.name);
    c.byzantine.clear();
    c.byz_clients.clear();
    c.throughput_share = None;
    c
}

/// Adds a violation to `out` if its correct clients fell below `share` of the control's
/// rate.
pub fn check(out: &mut Outcome, control: &Outcome, s: &Scenario) {
    let share = s.throughput_share.unwrap_or(0.0);
    let (late, calm_late) = (out.stats.late_view_changes, control.stats.late_view_changes);
    if late > calm_late + LATE_VIEW_CHANGES_MORE {
        out.violations.push(format!(
            "throughput: correct replicas changed views {late} times once the faults were over \
             (from {}ms), {calm_late} times in the same seed without its faulty replicas and \
             clients: faulty clients or replicas that ought to cost nothing cost view changes",
            out.stats.settle_ms + 4 * s.core.view_change_timeout_ms
        ));
        return;
    }
    let (Some(attack), Some(calm)) = (
        rate(&out.stats, s.think_ms),
        rate(&control.stats, s.think_ms),
    ) else {
        return;
    };
    if attack < share * calm {
        out.violations.push(format!(
            "throughput: a correct client completed {attack:.1} ops/s from {}ms, when the \
             faults were over ({} ops), {:.0}% of the {calm:.1} ops/s of the same seed without its \
             faulty replicas and clients (at least {:.0}% is promised)",
            out.stats.measured_from_ms.unwrap_or(0),
            out.stats.ops_after_settle,
            100.0 * attack / calm,
            100.0 * share
        ));
    }
}
