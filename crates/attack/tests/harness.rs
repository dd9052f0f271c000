//! The harness in a real runtime: four replicas in this process (`run_replica`, and
//! `run_replica_with` for the faulty one), a client on loopback. A slow leader holds back every
//! update under PBFT, and Prime's Suspect-Leader replaces it.

use redoubt_attack::replica::{Attack, ReplicaAttack, Start};
use redoubt_client::kv::KvClient;
use redoubt_client::ClientSetup;
use redoubt_core::OrderProtocol;
use redoubt_node::init::{init_cluster, InitOptions};
use redoubt_node::Hooks;
use redoubt_services::kv::KvService;
use std::path::Path;
use std::time::{Duration, Instant};

const DELAY: Duration = Duration::from_millis(300);

/// A cluster whose replica 0 (the first leader) holds each proposal for `DELAY`.
fn start(
    dir: &Path,
    ordering: OrderProtocol,
) -> (std::path::PathBuf, Vec<tokio::task::JoinHandle<()>>) {
    let path = init_cluster(&InitOptions {
        replicas: 4,
        clients: 1,
        out: dir.join("c"),
        base_port: redoubt_node::init::free_base_port(4).unwrap(),
        ordering,
        ..InitOptions::default()
    })
    .unwrap();
    let cfg = redoubt_config::ClusterConfig::load(&path).unwrap();
    for i in 0..4 {
        redoubt_node::holder::serve_for_replica(&cfg, i).unwrap();
    }
    let tasks = (0..4)
        .map(|i| {
            let p = path.clone();
            tokio::spawn(async move {
                let r = if i == 0 {
                    let hooks = Hooks::tampered(
                        Box::new(Attack::new(
                            ReplicaAttack::SlowPrimary,
                            Start::At(Instant::now()),
                            DELAY,
                            3,
                            0,
                        )),
                        Some(Box::new(|p: &mut redoubt_core::types::Config| {
                            p.view_change_timeout_ms = 1 << 40;
                            p.view_change_timeout_max_ms = 1 << 40;
                        })),
                    );
                    redoubt_node::run_replica_with(
                        &p,
                        i,
                        Default::default(),
                        KvService::new(),
                        hooks,
                    )
                    .await
                } else {
                    redoubt_node::run_replica(&p, i, Default::default(), KvService::new()).await
                };
                panic!("replica {i} stopped: {r:?}");
            })
        })
        .collect();
    (path, tasks)
}

async fn client(path: &Path) -> KvClient {
    let mut setup = ClientSetup::from_config(path, 1).unwrap();
    setup.deadline = Duration::from_secs(30);
    KvClient::connect(setup).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_primary_holds_back_every_pbft_update() {
    let dir = tempfile::tempdir().unwrap();
    let (path, tasks) = start(dir.path(), OrderProtocol::Pbft);
    let kv = client(&path).await;
    for i in 0..4 {
        let t = Instant::now();
        kv.put(format!("k{i}"), format!("v{i}")).await.unwrap();
        assert!(
            t.elapsed() >= DELAY,
            "update {i} took {:?}: the proposal was not held",
            t.elapsed()
        );
    }
    assert_eq!(kv.get("k3").await.unwrap(), Some(b"v3".to_vec()));
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prime_replaces_a_slow_leader() {
    let dir = tempfile::tempdir().unwrap();
    let (path, tasks) = start(dir.path(), OrderProtocol::Prime);
    let kv = client(&path).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    while kv.client().view() == 0 {
        assert!(
            Instant::now() < deadline,
            "still in view 0 after {i} updates"
        );
        kv.put(format!("k{i}"), format!("v{i}")).await.unwrap();
        i += 1;
    }
    kv.put("last", "v").await.unwrap();
    assert_eq!(kv.get("last").await.unwrap(), Some(b"v".to_vec()));
    assert_eq!(kv.get("k0").await.unwrap(), Some(b"v0".to_vec()));
    for t in tasks {
        t.abort();
    }
}
