//! A rolling upgrade with real processes: four `redoubt monitor`s run a copy of the binary;
//! a new executable is installed over it and pinned (`redoubt pin`), and each monitor, sent
//! SIGHUP in turn, restarts its replica on it while two clients keep writing. Then a wrong pin
//! holds a replica down: its monitor says why on the replica's metrics address, takes the
//! right pin on SIGHUP, and honours SIGTERM while holding the replica down.

mod common;

use common::Cluster;
use redoubt_client::kv::KvClient;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child process of this test.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// `redoubt pin` run from `program`, pinning `executable` (its own file when `None`).
fn pin(program: &Path, config: &Path, executable: Option<&Path>) -> String {
    let mut cmd = Command::new(program);
    cmd.args(["pin", "--config"]).arg(config);
    if let Some(e) = executable {
        cmd.arg("--executable").arg(e);
    }
    common::stdout_of_success(cmd, Duration::from_secs(20))
}

/// Waits until replica `id` answers `/status` in normal operation, not recovering, running
/// the executable `hash`.
async fn wait_on(cluster: &Cluster, id: u32, hash: &str, limit: Duration) {
    let addr = cluster.cfg.replicas[id as usize].metrics_addr;
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(s) = common::status(addr).await {
            if s["executable_blake3"] == hash && s["normal"] == true && s["recovering"] == false {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "replica {id} not up on {hash} within {limit:?}; {}",
            cluster.logs_hint()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `redoubt status` (text), exit status ignored.
fn status_text(program: &Path, config: &Path) -> String {
    let out = Command::new(program)
        .args(["status", "--config"])
        .arg(config)
        .output()
        .expect("redoubt status");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_under_load_loses_nothing_and_never_stops() {
    let edit = |t: String| {
        t.replace(
            "\nrecovery_interval_min_ms = 30000\n",
            "\nrecovery_interval_min_ms = 4000\n",
        )
    };
    // The monitors run `<dir>/bin/redoubt`, which the test replaces.
    let prepare = |dir: &Path| {
        std::fs::create_dir_all(dir.join("bin")).expect("bin");
        std::fs::copy(env!("CARGO_BIN_EXE_redoubt"), dir.join("bin/redoubt")).expect("copy");
    };
    let mut cluster =
        Cluster::start_monitored_init(&[], 2, 600, edit, &["--manual"], prepare).await;
    let program = cluster.dir.path().join("bin/redoubt");
    let config = cluster.config.clone();
    let old = redoubt_localcluster::file_blake3(&program).expect("hash");
    assert_eq!(cluster.cfg.recovery.executable_blake3, old, "init pins it");

    // Two clients write and read back throughout; every completed put is counted in the
    // second it completed.
    let started = Instant::now();
    let per_second = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for c in 1..=2u64 {
        let kv = KvClient::connect(cluster.client_setup(c, Duration::from_secs(20)))
            .await
            .expect("client");
        let (per_second, stop) = (per_second.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut acked: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("c{c}-{}", i % 32);
                let value = format!("v{i}").into_bytes();
                kv.put(key.clone(), value.clone())
                    .await
                    .unwrap_or_else(|e| panic!("client {c}: put {key} failed: {e}"));
                acked.insert(key, value);
                *per_second
                    .lock()
                    .unwrap()
                    .entry(started.elapsed().as_secs())
                    .or_default() += 1;
                i += 1;
            }
            (kv, acked)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A new executable (the same program with bytes appended: another hash) installed over
    // the running one, as a package manager would: a new file renamed into place.
    let upgrade_from = started.elapsed().as_secs();
    let staged = cluster.dir.path().join("bin/redoubt.new");
    std::fs::copy(&program, &staged).expect("stage");
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&staged)
            .expect("open");
        f.write_all(b"\nredoubt upgrade test\n").expect("append");
    }
    std::fs::rename(&staged, &program).expect("install");
    let new = redoubt_localcluster::file_blake3(&program).expect("hash");
    assert_ne!(new, old);
    let said = pin(&program, &config, None);
    assert!(said.contains(&format!("now pins {new}")), "{said}");
    // Before the monitors hear of it, status shows every replica on an unpinned executable.
    let before = status_text(&program, &config);
    assert_eq!(before.matches("not the pinned").count(), 4, "{before}");

    // Replica by replica: SIGHUP, then wait for it on the new executable.
    for id in 0..4u32 {
        let t = Instant::now();
        signal(cluster.pid(id).expect("monitor"), libc::SIGHUP);
        wait_on(&cluster, id, &new, Duration::from_secs(60)).await;
        eprintln!("replica {id} upgraded in {:?}", t.elapsed());
    }
    let after = status_text(&program, &config);
    assert!(!after.contains("not the pinned"), "{after}");
    assert!(after.contains("cluster is serving"), "{after}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let upgrade_to = started.elapsed().as_secs();
    stop.store(true, Ordering::Relaxed);
    let mut results = Vec::new();
    for w in workers {
        results.push(w.await.expect("worker"));
    }
    // No second without a completed write, from the upgrade's start to its end.
    let counts = per_second.lock().unwrap().clone();
    eprintln!("writes per second: {counts:?}");
    for second in upgrade_from..upgrade_to {
        assert!(
            counts.get(&second).copied().unwrap_or(0) > 0,
            "no write completed in second {second} of the upgrade: {counts:?}; {}",
            cluster.logs_hint()
        );
    }
    // Every acknowledged write reads back.
    for (kv, acked) in &results {
        for (key, value) in acked {
            let got = kv.get(key.clone()).await.expect("final read");
            assert_eq!(got.as_ref(), Some(value), "{key}; {}", cluster.logs_hint());
        }
    }

    // A wrong pin (another file's hash): SIGHUP makes monitor 3 restart its replica, which
    // it then holds down, saying why where the replica's status was.
    let wrong = cluster.dir.path().join("redoubt.toml.copy");
    std::fs::copy(&config, &wrong).expect("copy");
    pin(&program, &config, Some(&wrong));
    let monitor3 = cluster.pid(3).expect("monitor");
    signal(monitor3, libc::SIGHUP);
    let metrics3 = cluster.cfg.replicas[3].metrics_addr;
    let deadline = Instant::now() + Duration::from_secs(30);
    let held = loop {
        let text = status_text(&program, &config);
        if text.contains("held down by its monitor") {
            break text;
        }
        assert!(Instant::now() < deadline, "{text}; {}", cluster.logs_hint());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(held.contains("replica 3 down"), "{held}");
    assert!(held.contains("not the pinned"), "{held}");
    assert!(held.contains("cluster is serving"), "{held}");
    let metrics = common::http_get(metrics3, "/metrics")
        .await
        .expect("metrics");
    assert!(
        metrics.contains(
            "redoubt_replica_held_down{replica=\"3\",reason=\"executable_not_pinned\"} 1"
        ),
        "{metrics}"
    );
    // The right pin again: SIGHUP starts it at once.
    pin(&program, &config, None);
    signal(monitor3, libc::SIGHUP);
    wait_on(&cluster, 3, &new, Duration::from_secs(60)).await;

    // Held down again, SIGTERM still stops the monitor, and its key-holder socket goes.
    pin(&program, &config, Some(&wrong));
    signal(monitor3, libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(30);
    while common::http_get(metrics3, "/metrics")
        .await
        .map_or(true, |m| !m.contains("redoubt_replica_held_down"))
    {
        assert!(Instant::now() < deadline, "{}", cluster.logs_hint());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let socket = cluster.cfg.holder_socket_of(3).expect("socket");
    assert!(socket.exists());
    let t = Instant::now();
    signal(monitor3, libc::SIGTERM);
    // Until it exits (a zombie until the cluster reaps it).
    while std::fs::read_to_string(format!("/proc/{monitor3}/stat"))
        .is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the monitor ignored SIGTERM while holding its replica down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!socket.exists(), "the key-holder socket was left behind");
    pin(&program, &config, None);
    cluster.stop_all();
}
