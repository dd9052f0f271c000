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
        "  before kill    ",
        " ops/s, p50 ",
        "(the view change included)",
        "  after restart  ",
        "verification   passed",
        "stopped 4 replicas cleanly",
    ] {
        assert!(stdout.contains(fact), "no {fact:?} in:\n{stdout}");
    }
}

/// The SQL bank (`--service sql`), Jepsen-style: concurrent serializable transfers while the
/// primary is killed and restarted; the total is conserved, every acknowledged transfer is in
/// the log and every balance matches the log. (With the service's conflict check disabled,
/// lost updates make this fail: the total drifts.)
#[test]
fn sql_bank_conserves_money_across_a_primary_crash() {
    let mut cmd = common::redoubt();
    cmd.args([
        "demo",
        "--service",
        "sql",
        "--duration",
        "12",
        "--clients",
        "4",
    ]);
    let stdout = common::stdout_of_success(cmd, Duration::from_secs(120));
    for fact in [
        "serializable transactions",
        "killed replica",
        "view change: view",
        "restarted replica",
        "gateway    PostgreSQL wire protocol on 127.0.0.1:",
        "verification   passed: total conserved (16000 in 16 accounts), all ",
        "through the PostgreSQL gateway) in the log",
        "stopped 4 replicas cleanly",
    ] {
        assert!(stdout.contains(fact), "no {fact:?} in:\n{stdout}");
    }
}
