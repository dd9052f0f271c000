//! Proactive recovery with real processes: four `redoubt monitor`s (each running its replica's
//! key holder and the replica) recover their replicas in turn while clients keep working; no
//! operation fails and every acknowledged write is read back.

mod common;

use common::Cluster;
use redoubt_client::kv::KvClient;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Completed recoveries reported in replica `id`'s monitor log.
fn recoveries_logged(cluster: &Cluster, id: u32) -> usize {
    std::fs::read_to_string(cluster.log_path(id))
        .unwrap_or_default()
        .matches("recovery complete")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proactive_recovery_cycles_through_all_replicas_under_load() {
    recoveries_under_load(&[]).await;
}

/// The same under Prime: recovery requests are introduced by the other replicas, and each
/// recovery installs a fresh order key for the recovered replica's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prime_recovers_every_replica_under_load() {
    recoveries_under_load(&["--ordering", "prime"]).await;
}

/// Four monitors recover their replicas in turn under two clients' load (`redoubt init`
/// arguments `init_extra`); checks that every replica recovered and every acknowledged write
/// is read back.
async fn recoveries_under_load(init_extra: &[&str]) {
    // T_w = 12 s: replica i recovers in the i-th 3-second slot of every period.
    let edit = |t: String| {
        t.replace(
            "\nrecovery_interval_min_ms = 30000\n",
            "\nrecovery_interval_min_ms = 4000\n",
        )
        .replace("\nkey_refresh_ms = 15000\n", "\nkey_refresh_ms = 3000\n")
        .replace(
            "\nclient_key_lifetime_ms = 60000\n",
            "\nclient_key_lifetime_ms = 12000\n",
        )
    };
    let mut cluster = Cluster::start_monitored_init(init_extra, 2, 12, edit, &[], |_| {}).await;
    let deadline = Duration::from_secs(20);
    let mut workers = Vec::new();
    for c in 1..=2u64 {
        let kv = KvClient::connect(cluster.client_setup(c, deadline))
            .await
            .expect("client");
        let stop = Instant::now() + Duration::from_secs(60);
        let logs: Vec<std::path::PathBuf> = (0..4).map(|i| cluster.log_path(i)).collect();
        workers.push(tokio::spawn(async move {
            let mut acked: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            let mut ops = 0u64;
            let mut i = 0u64;
            loop {
                // Run until every replica recovered at least once (or 60 s passed).
                let all = logs.iter().all(|l| {
                    std::fs::read_to_string(l)
                        .unwrap_or_default()
                        .contains("recovery complete")
                });
                if all || Instant::now() >= stop {
                    break;
                }
                let key = format!("c{c}-{}", i % 32);
                let value = format!("v{i}").into_bytes();
                kv.put(key.clone(), value.clone())
                    .await
                    .unwrap_or_else(|e| panic!("client {c}: put {key} failed: {e}"));
                acked.insert(key.clone(), value.clone());
                let got = kv
                    .get(key.clone())
                    .await
                    .unwrap_or_else(|e| panic!("client {c}: get {key} failed: {e}"));
                assert_eq!(got.as_ref(), Some(&value), "client {c}: read {key} back");
                ops += 2;
                i += 1;
            }
            (kv, acked, ops)
        }));
    }
    let mut results = Vec::new();
    for w in workers {
        results.push(w.await.expect("worker"));
    }
    for id in 0..4 {
        assert!(
            recoveries_logged(&cluster, id) >= 1,
            "replica {id} did not complete a recovery; {}",
            cluster.logs_hint()
        );
    }
    // Every acknowledged write is there after the recoveries.
    for (kv, acked, ops) in &results {
        eprintln!("{ops} operations, {} keys", acked.len());
        assert!(*ops > 100, "the workload ran throughout");
        for (key, value) in acked {
            let got = kv.get(key.clone()).await.expect("final read");
            assert_eq!(got.as_ref(), Some(value), "{key}; {}", cluster.logs_hint());
        }
    }
    // Recoveries show in the status: the recovered replicas report their breakdown.
    let statuses = cluster.statuses().await;
    let reported = statuses
        .iter()
        .flatten()
        .filter(|s| s["last_recovery"]["total_ms"].as_u64().is_some())
        .count();
    assert!(reported >= 1, "statuses: {statuses:?}");
    cluster.stop_all();
}

/// The uid of the `redoubt replica` process of replica `id` under `config`, from /proc.
fn replica_uid(config: &std::path::Path, id: u32) -> Option<u32> {
    let want = [
        "replica".to_string(),
        "--config".to_string(),
        config.display().to_string(),
        "--id".to_string(),
        id.to_string(),
    ];
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        if args.len() > want.len() && args[1..=want.len()] == want {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            return line.split_whitespace().nth(1)?.parse().ok();
        }
    }
    None
}

/// `redoubt monitor --replica-user nobody`: run as root, the monitor keeps the key-holder file
/// and starts the replica as `nobody`, which reaches the key holder only through the socket
/// handed to it; the cluster serves and a recovery completes. Not as root, the monitor refuses
/// the option with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_runs_the_replica_as_an_unprivileged_user() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let dir = tempfile::tempdir().unwrap();
        let config = common::init(dir.path(), 4, 1);
        let mut cmd = common::redoubt();
        cmd.arg("monitor").arg("--config").arg(&config).args([
            "--id",
            "0",
            "--replica-user",
            "nobody",
        ]);
        let out = common::output_within(cmd, Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("needs the monitor to run as root"));
        return;
    }
    const NOBODY: u32 = 65534;
    let mut cluster = Cluster::start_monitored_with(
        1,
        3600,
        |t| t,
        &["--replica-user", "nobody", "--manual"],
        |dir| {
            use std::os::unix::fs::PermissionsExt;
            // nobody must reach the config, the public keys and its home, and nothing else.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            for i in 0..4 {
                let home = dir.join(format!("replica-{i}"));
                std::fs::create_dir_all(&home).unwrap();
                std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
            }
        },
    )
    .await;
    for id in 0..4 {
        assert_eq!(
            replica_uid(cluster.config_path(), id),
            Some(NOBODY),
            "replica {id} runs as nobody; {}",
            cluster.logs_hint()
        );
    }
    let kv = KvClient::connect(cluster.client_setup(1, Duration::from_secs(20)))
        .await
        .expect("client");
    kv.put("k", "v").await.expect("put");
    // A recovery of replica 2 (SIGUSR1 to its monitor) completes: its restarted process gets
    // signatures and keys from the key holder through the socket.
    // SAFETY: kill(2) on a child of this test.
    unsafe {
        libc::kill(cluster.pid(2).unwrap() as libc::pid_t, libc::SIGUSR1);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while recoveries_logged(&cluster, 2) == 0 {
        assert!(
            Instant::now() < deadline,
            "no recovery; {}",
            cluster.logs_hint()
        );
        kv.put("k", "w").await.expect("put during the recovery");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(replica_uid(cluster.config_path(), 2), Some(NOBODY));
    assert_eq!(kv.get("k").await.expect("get").as_deref(), Some(&b"w"[..]));
    cluster.stop_all();
}
