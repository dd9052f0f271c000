//! `redoubt demo`, end to end: a short run must crash the primary, see the view change, and
//! verify every acknowledged write.

mod common;

use std::time::Duration;

#[test]
fn short_demo_passes() {
    let mut cmd = common::redoubt();
    cmd.args(["demo", "--duration", "8", "--clients", "2"]);
    let stdout = common::stdout_of_success(cmd, Duration::from_secs(90));
    for fact in [
        "4 replicas up",
        "killed replica",
        "view change: view",
        "restarted replica",
        "verification   passed",
        "stopped 4 replicas cleanly",
    ] {
        assert!(stdout.contains(fact), "no {fact:?} in:\n{stdout}");
    }
}
