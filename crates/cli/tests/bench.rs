//! `redoubt bench state-transfer`, end to end on a small state: the restarted replica catches
//! up by page-level transfer, fetching far less than the whole-state copy does.

mod common;

use std::time::Duration;

#[test]
fn small_state_transfer_bench_runs_and_transfers_little() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("st.csv");
    let mut cmd = common::redoubt();
    cmd.args([
        "bench",
        "state-transfer",
        "--state-mib",
        "16",
        "--dirty-percent",
        "5",
        "--clients",
        "4",
        "--csv",
    ])
    .arg(&csv);
    let stdout = common::stdout_of_success(cmd, Duration::from_secs(180));
    let text = std::fs::read_to_string(&csv).unwrap();
    let ratio = |label: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.split(',').nth(2) == Some(label))
            .unwrap_or_else(|| panic!("no {label} row in {text}"));
        line.split(',').nth(4).unwrap().parse().unwrap()
    };
    let (page, whole) = (ratio("page-level"), ratio("whole-state"));
    // 5% of the pages are rewritten while the replica is down, and the workload that goes on
    // meanwhile dirties more (15.17% was seen once): well under a fifth still shows page-level
    // transfer, against the whole state below.
    assert!(
        page > 0.0 && page < 0.2,
        "page-level ratio {page}: {stdout}"
    );
    assert!(whole > 0.8, "whole-state ratio {whole}: {stdout}");
}

/// `redoubt bench micro` with short throughput points, writing into `dir`, plus `extra`.
fn micro(dir: &tempfile::TempDir, extra: &[&str]) -> std::process::Command {
    let mut cmd = common::redoubt();
    cmd.args(["bench", "micro", "--seconds", "0.3"])
        .args(extra)
        .arg("--out")
        .arg(dir.path());
    cmd
}

#[test]
fn micro_bench_runs_and_writes_its_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = micro(&dir, &["--clients", "1,2", "--latency-ops", "30"]);
    let stdout = common::stdout_of_success(cmd, Duration::from_secs(180));
    let csv = std::fs::read_to_string(dir.path().join("micro.csv")).unwrap();
    // Both client models, both systems, every operation, latency row plus two client counts.
    assert_eq!(csv.lines().count(), 1 + 2 * 2 * 4 * 3, "{csv}");
    for model in ["own", "shared"] {
        assert_eq!(
            csv.lines()
                .filter(|l| l.starts_with(&format!("{model},")))
                .count(),
            2 * 4 * 3,
            "{csv}"
        );
        for op in ["0-0-ordered", "0-0-read-only", "0-4-ordered", "4-0-ordered"] {
            let svg = dir.path().join(format!("micro-{model}-{op}.svg"));
            let svg = std::fs::read_to_string(svg).unwrap();
            assert!(svg.contains("<polyline"), "{model} {op}");
        }
    }
    // The report leads with the clients on their own connections.
    let own = stdout.find("## Every client on its own connections");
    let shared = stdout.find("## The clients multiplexed");
    assert!(own.is_some() && own < shared, "{stdout}");
    assert!(stdout.contains("Peak throughput"), "{stdout}");
}

/// `--server-cpu`: where this machine lets the benchmark create cgroups, a capped run reports
/// the cap and the throttling and removes its groups; elsewhere it fails at once, saying why.
#[test]
fn micro_bench_caps_server_cpu_or_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = micro(
        &dir,
        &[
            "--clients",
            "2",
            "--latency-ops",
            "20",
            "--server-cpu",
            "0.5",
        ],
    );
    let v1 = std::path::Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && v1.exists() {
        let groups = || -> Vec<std::ffi::OsString> {
            std::fs::read_dir("/sys/fs/cgroup/cpu")
                .unwrap()
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .filter(|n| n.to_string_lossy().starts_with("redoubt-bench-"))
                .collect()
        };
        let before = groups();
        let stdout = common::stdout_of_success(cmd, Duration::from_secs(180));
        assert!(stdout.contains("capped at 0.5 cores"), "{stdout}");
        assert!(stdout.contains("used up their quota"), "{stdout}");
        assert_eq!(groups(), before, "control groups left behind");
    } else {
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--server-cpu"), "{err}");
    }
}

/// `redoubt bench recovery` on a small state and a short schedule: every replica recovers
/// under the workload (the benchmark fails on any failed operation), each step of the
/// breakdown is reported, and both CSV files are written.
#[test]
fn recovery_bench_runs_and_reports_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("recovery.csv");
    let mut cmd = common::redoubt();
    cmd.args([
        "bench",
        "recovery",
        "--quick",
        "--state-mib",
        "8",
        "--clients",
        "4",
        "--watchdog-period-s",
        "8",
        "--recoveries",
        "2",
        "--csv",
    ])
    .arg(&csv);
    let stdout = common::stdout_of_success(cmd, Duration::from_secs(240));
    for step in [
        "| save state |",
        "| restart |",
        "| restore state |",
        "| send new-key |",
        "| estimation |",
        "| recovery request |",
        "| check and fetch |",
        "| **total** |",
        "| with recovery | ",
        "throughput cost of recovery:",
        "window of vulnerability: T_v = 2 T_k + T_r",
    ] {
        assert!(stdout.contains(step), "no {step:?} in:\n{stdout}");
    }
    let rows = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(rows.lines().count(), 1 + 4, "a row per recovery: {rows}");
    for line in rows.lines().skip(1) {
        let total: f64 = line.split(',').nth(9).unwrap().parse().unwrap();
        assert!(total > 0.0 && total < 60.0, "{line}");
    }
    let runs = std::fs::read_to_string(dir.path().join("recovery-throughput.csv")).unwrap();
    let recoveries: Vec<&str> = runs
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap())
        .collect();
    assert_eq!(recoveries, ["0", "2"], "{runs}");
}

/// `redoubt bench sql` on two small tables and short points: both systems load them, run
/// every mix (the benchmark fails on any failed update or query, or on a sum of values other
/// than the updates acknowledged) and the three outputs are written.
#[test]
fn sql_bench_runs_and_writes_its_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = common::redoubt();
    cmd.args([
        "bench",
        "sql",
        "--quick",
        "--seconds",
        "0.3",
        "--tables",
        "2",
        "--rows",
        "50",
        "--out",
    ])
    .arg(dir.path());
    let stdout = common::stdout_of_success(cmd, Duration::from_secs(120));
    let csv = std::fs::read_to_string(dir.path().join("sql.csv")).unwrap();
    // Both systems, three mixes, two client counts.
    assert_eq!(csv.lines().count(), 1 + 2 * 3 * 2, "{csv}");
    let svg = std::fs::read_to_string(dir.path().join("sql.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 6, "{svg}");
    let md = std::fs::read_to_string(dir.path().join("sql.md")).unwrap();
    for part in [
        "| updates only | 4 |",
        "| queries only |",
        "updates acknowledged",
    ] {
        assert!(md.contains(part), "no {part:?} in:\n{md}");
    }
    assert!(stdout.contains("redoubt / baseline"), "{stdout}");
}
