//! The firewall deployment as real processes (Yin et al. 2003 §4): four replicas that only
//! order, a 2 × 2 array of filter nodes (`redoubt filter`), three execution nodes. A filter
//! killed does not stop the service; an execution node killed and restarted catches up; a
//! compromised execution node's leak attempts are refused by the filters (counted in their
//! metrics); no value reaches a replica's disk in clear.

mod common;

use common::{http_get, Cluster};
use redoubt_client::kv::KvClient;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

async fn status_seq(addr: std::net::SocketAddr) -> u64 {
    let body = http_get(addr, "/status").await.unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|s| s["last_executed"].as_u64())
        .unwrap_or(0)
}

/// The value of `name` summed over the metrics text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_and_an_execution_node_die_and_no_value_leaks() {
    let mut cluster = Cluster::start_firewall(1, 3, 1).await;
    let p = &cluster.cfg.protocol;
    assert!(p.firewall() && p.filters() == 4 && p.confidential_bodies);
    let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    let secret = |i: u64| format!("SECRET-{i:04}-9c1e");
    for i in 0..20u64 {
        kv.put(format!("k{i}"), secret(i).into_bytes())
            .await
            .expect("put with every node up");
    }
    // A filter of the bottom row dies for good: the other one of its row carries on.
    cluster.kill_filter(1);
    for i in 20..60u64 {
        kv.put(format!("k{}", i % 30), secret(i).into_bytes())
            .await
            .expect("put with filter 1 down");
    }
    // An execution node dies (g = 1: two still sign every bundle) while the others move on by
    // more than the certificates they keep (L = 256) and past stable checkpoints, then comes
    // back: it must fetch state from them.
    cluster.kill_executor(2);
    for i in 60..700u64 {
        kv.put(format!("k{}", i % 30), secret(i).into_bytes())
            .await
            .expect("put with filter 1 and execution node 2 down");
    }
    cluster.spawn_executor(2);
    for i in 700..710u64 {
        kv.put(format!("k{}", i % 30), secret(i).into_bytes())
            .await
            .expect("put after the restart");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = status_seq(cluster.cfg.executors[0].metrics_addr).await;
        let b = status_seq(cluster.cfg.executors[2].metrics_addr).await;
        if a >= 700 && b >= a {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "execution node 2 at {b}, node 0 at {a}; logs in {}",
            cluster.dir.path().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in [699u64, 705, 709] {
        let v = kv.get(format!("k{}", i % 30)).await.expect("get");
        assert_eq!(v, Some(secret(i).into_bytes()));
    }
    let log = std::fs::read_to_string(cluster.executor_log_path(2)).expect("log");
    assert!(
        log.contains("state transferred from the other execution nodes"),
        "execution node 2 caught up without fetching state:\n{log}"
    );
    // What passed the firewall: certificates up and down, through filter 0 of the bottom row.
    let text = http_get(cluster.cfg.filters[0].metrics_addr, "/metrics")
        .await
        .expect("filter metrics");
    assert!(metric(&text, "redoubt_firewall_replies_forwarded_total") >= 700.0);
    assert!(metric(&text, "redoubt_firewall_requests_forwarded_total") >= 700.0);
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

/// A compromised execution node (`redoubt executor --compromised-leak`) sends the top row its
/// state in clear, as a forged reply certificate and under its own share: the top-row filters
/// refuse both, and the service goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compromised_execution_node_cannot_leak_through_the_filters() {
    let mut cluster = Cluster::start_firewall(1, 3, 1).await;
    cluster.kill_executor(2);
    cluster.spawn_executor_with(2, &["--compromised-leak"]);
    let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    for i in 0..30u64 {
        kv.put(format!("k{i}"), format!("SECRET-{i}").into_bytes())
            .await
            .expect("put next to a compromised execution node");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut refused = 0.0;
        for x in [2usize, 3] {
            let text = http_get(cluster.cfg.filters[x].metrics_addr, "/metrics")
                .await
                .unwrap_or_default();
            refused += metric(&text, "redoubt_firewall_certificates_rejected_total");
        }
        if refused >= 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the top row refused {refused} leak attempts; logs in {}",
            cluster.dir.path().display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = std::fs::read_to_string(cluster.executor_log_path(2)).expect("log");
    assert!(log.contains("compromised-leak"), "{log}");
    assert_eq!(kv.get("k7").await.expect("get"), Some(b"SECRET-7".to_vec()));
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
