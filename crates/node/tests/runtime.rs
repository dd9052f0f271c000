//! The replica runtime end to end inside one process: four `run_replica` tasks on loopback, a
//! client doing key-value work, one replica's journal surviving a restart.

use redoubt_client::kv::KvClient;
use redoubt_client::ClientSetup;
use redoubt_config::ClusterConfig;
use redoubt_node::init::{init_cluster, InitOptions};
use redoubt_services::kv::KvService;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_serve_kv_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let opts = InitOptions {
        replicas: 4,
        executors: 0,
        clients: 1,
        out: dir.path().join("c"),
        base_port: redoubt_node::init::free_base_port(4).unwrap(),
        ..InitOptions::default()
    };
    let path = init_cluster(&opts).unwrap();
    let cfg = ClusterConfig::load(&path).unwrap();
    // Session keys: each replica's key holder, served from this process.
    for i in 0..4 {
        redoubt_node::holder::serve_for_replica(&cfg, i).unwrap();
    }
    let mut tasks: Vec<_> = (0..4)
        .map(|i| {
            let p = path.clone();
            Some(tokio::spawn(async move {
                redoubt_node::run_replica(&p, i, Default::default(), KvService::new()).await
            }))
        })
        .collect();
    let mut setup = ClientSetup::from_config(&path, 1).unwrap();
    setup.deadline = Duration::from_secs(20);
    let kv = KvClient::connect(setup).await.unwrap();
    for i in 0..50 {
        kv.put(format!("k{i}"), format!("v{i}")).await.unwrap();
    }
    assert_eq!(kv.get("k7").await.unwrap(), Some(b"v7".to_vec()));
    // Restart replica 3 from its journal while the others keep serving.
    tasks[3].take().unwrap().abort();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 50..80 {
        kv.put(format!("k{i}"), format!("v{i}")).await.unwrap();
    }
    let p = path.clone();
    tasks[3] = Some(tokio::spawn(async move {
        redoubt_node::run_replica(&p, 3, Default::default(), KvService::new()).await
    }));
    for i in 80..100 {
        kv.put(format!("k{i}"), format!("v{i}")).await.unwrap();
    }
    assert_eq!(kv.get("k99").await.unwrap(), Some(b"v99".to_vec()));
    assert_eq!(kv.get("k55").await.unwrap(), Some(b"v55".to_vec()));
    // Every replica is still running, the restarted one included (one that could not bind its
    // addresses, for instance, would have returned an error).
    for (i, t) in tasks.iter().enumerate() {
        assert!(!t.as_ref().unwrap().is_finished(), "replica {i} stopped");
    }
    for t in tasks.into_iter().flatten() {
        t.abort();
    }
}
