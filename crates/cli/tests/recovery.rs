//! Proactive recovery with real processes: four `redoubt monitor`s (each running its replica's
//! key holder and the replica) recover their replicas in turn while clients keep working; no
//! operation fails and every acknowledged write is read back.

mod common;

use common::Cluster;
use redoubt_client::KvClient;
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
    // T_w = 12 s: replica i recovers in the i-th 3-second slot of every period.
    let mut cluster = Cluster::start_monitored(2, 12, |t| {
        t.replace(
            "\nrecovery_interval_min_ms = 30000\n",
            "\nrecovery_interval_min_ms = 4000\n",
        )
        .replace("\nkey_refresh_ms = 15000\n", "\nkey_refresh_ms = 3000\n")
        .replace(
            "\nclient_key_lifetime_ms = 60000\n",
            "\nclient_key_lifetime_ms = 12000\n",
        )
    })
    .await;
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
