//! The separated deployment as real processes (Yin et al. 2003): four replicas that only
//! order, three execution nodes (`redoubt executor`) that run the key-value store. An
//! execution node killed does not stop the service; restarted after the others moved on by
//! more than the certificates kept for it (2L + K batches), it catches up by state transfer
//! from them; no value reaches a replica's disk in clear (the replicas hold no executors'
//! secret).

mod common;

use common::{http_get, Cluster};
use redoubt_client::kv::KvClient;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

async fn executed(cluster: &Cluster, e: u32) -> u64 {
    let addr = cluster.cfg.executors[e as usize].metrics_addr;
    let body = http_get(addr, "/status").await.unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|s| s["last_executed"].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_node_killed_and_restarted_catches_up_and_replicas_see_no_value() {
    let mut cluster = Cluster::start_separated(1, 3).await;
    assert!(cluster.cfg.protocol.separated() && cluster.cfg.protocol.confidential_bodies);
    let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    let secret = |i: u64| format!("SECRET-{i:04}-7f3a");
    for i in 0..20u64 {
        kv.put(format!("k{i}"), secret(i).into_bytes())
            .await
            .expect("put with every execution node up");
    }
    // One execution node down (g = 1): g+1 = 2 still answer.
    cluster.kill_executor(1);
    // More batches than the replicas keep for it (2L + K = 640 with the defaults), and
    // several stable checkpoints: it must fetch state.
    for i in 20..720u64 {
        kv.put(format!("k{}", i % 100), secret(i).into_bytes())
            .await
            .expect("put with execution node 1 down");
    }
    cluster.spawn_executor(1);
    for i in 720..730u64 {
        kv.put(format!("k{}", i % 100), secret(i).into_bytes())
            .await
            .expect("put after the restart");
    }
    // The restarted node catches up with the others (from the replicas, which keep what it
    // did not acknowledge).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (a, b) = (executed(&cluster, 0).await, executed(&cluster, 1).await);
        if a >= 730 && b >= a {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "execution node 1 at {b}, node 0 at {a}; logs in {}",
            cluster.dir.path().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in [633u64, 650, 729] {
        let v = kv.get(format!("k{}", i % 100)).await.expect("get");
        assert_eq!(v, Some(secret(i).into_bytes()));
    }
    let log = std::fs::read_to_string(cluster.executor_log_path(1)).expect("log");
    assert!(
        log.contains("state transferred from the other execution nodes"),
        "execution node 1 caught up without fetching state:\n{log}"
    );
    let metrics = http_get(cluster.cfg.executors[1].metrics_addr, "/metrics")
        .await
        .expect("executor metrics");
    assert!(metrics.contains("redoubt_requests_executed_total{executor=\"1\"}"));
    // Nothing of a value on any replica's disk: journal, page store.
    cluster.kill_all();
    for r in &cluster.cfg.replicas {
        let home = cluster.cfg.resolve(&r.home);
        for entry in walk(&home) {
            let bytes = std::fs::read(&entry).expect("read");
            assert!(
                !bytes.windows(7).any(|w| w == b"SECRET-"),
                "{} holds a value in clear",
                entry.display()
            );
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
