//! The key-value client against a real cluster: `redoubt init` (`init_cluster`) writes the
//! cluster file and keys, and each replica that is up is a `redoubt_node::run_replica` task of
//! this process hosting `KvService`, with its journal, page store and key holder, on loopback.
//! A replica that is down is one whose task is never started: nothing listens on its address.

use redoubt_client::kv::{KvClient, KvClientError};
use redoubt_client::{Client, ClientError, ClientSetup, Connections};
use redoubt_config::ClusterConfig;
use redoubt_core::{ClientId, ReplicaId};
use redoubt_node::init::{init_cluster, InitOptions};
use redoubt_services::kv::{KvOp, KvResult, KvService};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

const N: u32 = 4;
/// Client ids the cluster has keys for (`init` numbers them from 1).
const CLIENTS: [ClientId; 3] = [1, 2, 3];

/// A cluster of `N` replicas made by `init_cluster` (session keys, the defaults of
/// `redoubt init`), some of which may be down.
struct TestCluster {
    /// Holds the cluster file, the keys and every replica's home; removed on drop.
    _dir: tempfile::TempDir,
    path: PathBuf,
    tasks: Vec<(ReplicaId, JoinHandle<()>)>,
}

impl TestCluster {
    /// Starts the replicas whose id is in `up`; the others' addresses have nobody listening.
    async fn start(up: &[ReplicaId]) -> TestCluster {
        let dir = tempfile::tempdir().unwrap();
        let path = init_cluster(&InitOptions {
            replicas: N,
            clients: CLIENTS.len() as u32,
            out: dir.path().join("cluster"),
            base_port: redoubt_node::init::free_base_port(N as u16).unwrap(),
            ..InitOptions::default()
        })
        .unwrap();
        let cfg = ClusterConfig::load(&path).unwrap();
        // The `[protocol]` `init` writes is `Config::new(1)` with confidential bodies (session
        // keys seal bodies to the replicas, which execute). No assertion here depends on
        // sealed or plain bodies, or on session or static keys; the ones about reads and
        // certificates depend on options `init` leaves at their defaults, checked here so
        // that a change of those defaults shows up as what it is: reads take the read-only
        // fast path and go to 2f+1 replicas first (`reads_leave_out_a_replica_that_is_down`,
        // and the reads of `clients_sharing_connections` answered by three replicas), and a
        // lone write executes tentatively, so 2f+1 of the four replies make its certificate
        // and the fourth is unwanted (`clients_sharing_connections`).
        let p = &cfg.protocol;
        assert!(p.read_only_fast_path && p.read_only_to_quorum, "{p:?}");
        assert!(p.tentative_for(1), "{p:?}");
        assert_eq!(p.n(), N);
        let tasks = up
            .iter()
            .map(|&id| {
                // Session keys: the replica's key holder, served from this process.
                redoubt_node::holder::serve_for_replica(&cfg, id).unwrap();
                let p = path.clone();
                let task = tokio::spawn(async move {
                    let opts = Default::default();
                    if let Err(e) = redoubt_node::run_replica(&p, id, opts, KvService::new()).await
                    {
                        panic!("replica {id}: {e}");
                    }
                });
                (id, task)
            })
            .collect();
        // `run_replica` binds its listener some time after it is spawned. A client's link that
        // finds nobody listening backs off (up to a second) before it tries again, so a
        // client started now could still lack a connection to a live replica when a short
        // test asserts `replicas_connected`. Wait until every live replica listens, as a
        // cluster that is up before its clients start would.
        for &id in up {
            let addr = cfg.replica(id).unwrap().addr;
            let deadline = Instant::now() + Duration::from_secs(30);
            while tokio::net::TcpStream::connect(addr).await.is_err() {
                assert!(
                    Instant::now() < deadline,
                    "replica {id} does not listen on {addr}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        TestCluster {
            _dir: dir,
            path,
            tasks,
        }
    }

    /// Client `client`'s setup from the cluster file, with a generous `deadline` (the
    /// machine may be busy: the deadline bounds a hang, it is no timing assertion).
    fn setup(&self, client: ClientId, deadline: Duration) -> ClientSetup {
        let mut setup = ClientSetup::from_config(&self.path, client).unwrap();
        setup.deadline = deadline;
        setup
    }

    /// Stops the replicas, after checking that every one of them was still running (a replica
    /// whose runtime returned an error, or panicked, has finished).
    async fn shutdown(self) {
        for (id, t) in &self.tasks {
            assert!(!t.is_finished(), "replica {id} stopped");
        }
        for (_, t) in &self.tasks {
            t.abort();
        }
        for (id, t) in self.tasks {
            let e = t.await.expect_err("aborted");
            assert!(e.is_cancelled(), "replica {id} failed: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_operations_through_a_cluster() {
    let cluster = TestCluster::start(&[0, 1, 2, 3]).await;
    let setup = cluster.setup(1, Duration::from_secs(20));
    let request_bytes_max = setup.core.request_bytes_max;
    let kv = KvClient::connect(setup).await.unwrap();

    assert_eq!(kv.get("a").await.unwrap(), None);
    assert_eq!(kv.put("a", "1").await.unwrap(), None);
    assert_eq!(kv.get("a").await.unwrap(), Some(b"1".to_vec()));
    assert_eq!(kv.put("a", "2").await.unwrap(), Some(b"1".to_vec()));

    // Compare-and-swap: a stale expectation fails and reports the current value.
    assert_eq!(
        kv.cas("a", Some(b"1".to_vec()), "3").await.unwrap(),
        (false, Some(b"2".to_vec()))
    );
    assert_eq!(
        kv.cas("a", Some(b"2".to_vec()), "3").await.unwrap(),
        (true, Some(b"3".to_vec()))
    );
    assert_eq!(
        kv.cas("new", None, "x").await.unwrap(),
        (true, Some(b"x".to_vec()))
    );
    assert_eq!(kv.get("a").await.unwrap(), Some(b"3".to_vec()));

    kv.put("b", "B").await.unwrap();
    assert_eq!(
        kv.scan("a", Some(b"c".to_vec()), 10).await.unwrap(),
        vec![
            (b"a".to_vec(), b"3".to_vec()),
            (b"b".to_vec(), b"B".to_vec())
        ]
    );
    assert_eq!(kv.delete("b").await.unwrap(), Some(b"B".to_vec()));
    assert_eq!(kv.get("b").await.unwrap(), None);

    // The store's own refusals come back typed.
    let too_long_key = vec![b'k'; 2000];
    assert!(matches!(
        kv.put(too_long_key, "v").await,
        Err(KvClientError::Refused(_))
    ));

    // Operations above the cluster's request limit never leave the client.
    let huge = vec![0u8; request_bytes_max + 1];
    assert!(matches!(
        kv.client().invoke(huge).await,
        Err(ClientError::TooLarge(_))
    ));

    let s = kv.client().stats();
    assert_eq!(s.completed, 13, "the refused put completed too");
    assert_eq!(s.unreachable, 0);
    assert_eq!(s.replicas_connected, N as usize);
    assert_eq!(kv.client().view(), 0, "no view change in a healthy cluster");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_sharing_connections() {
    let cluster = TestCluster::start(&[0, 1, 2, 3]).await;
    let first = cluster.setup(CLIENTS[0], Duration::from_secs(20));
    let shared = Connections::open(&first.replicas, CLIENTS.len(), first.frame_bytes_max);
    let mut kvs = Vec::new();
    for c in CLIENTS {
        let client = Client::connect_over(cluster.setup(c, Duration::from_secs(20)), &shared)
            .await
            .unwrap();
        kvs.push(KvClient::new(client));
    }
    // A second client with a taken id is refused.
    assert!(matches!(
        Client::connect_over(cluster.setup(CLIENTS[0], Duration::from_secs(20)), &shared).await,
        Err(ClientError::InvalidSetup(_))
    ));
    // Every client writes and reads its own keys, concurrently; each gets its own replies.
    async fn work(kv: KvClient, id: usize) {
        for i in 0..10u32 {
            let key = format!("c{id}-{i}");
            assert_eq!(kv.put(key.clone(), i.to_be_bytes()).await.unwrap(), None);
            assert_eq!(kv.get(key).await.unwrap(), Some(i.to_be_bytes().to_vec()));
        }
    }
    tokio::join!(
        work(kvs[0].clone(), 0),
        work(kvs[1].clone(), 1),
        work(kvs[2].clone(), 2)
    );
    let mut unwanted = 0;
    for kv in &kvs {
        let s = kv.client().stats();
        assert_eq!((s.completed, s.unreachable), (20, 0));
        assert_eq!(s.frames_rejected, 0, "only replies to a client reach it");
        unwanted += s.replies_unwanted;
    }
    // Four replicas answer every write and three tentative replies make its certificate: the
    // fourth arrives after the write completed and is dropped unverified, by the router or
    // (if it came in the same burst) by the client. (Reads go to three replicas.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while unwanted + shared.unwanted_replies() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(unwanted + shared.unwanted_replies() > 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_and_shared_handles() {
    let cluster = TestCluster::start(&[0, 1, 2, 3]).await;
    let a = KvClient::connect(cluster.setup(1, Duration::from_secs(20)))
        .await
        .unwrap();
    let b = KvClient::connect(cluster.setup(2, Duration::from_secs(20)))
        .await
        .unwrap();
    // Two clients increment one counter with compare-and-swap; `a` also runs through two
    // clones of one handle, whose invocations take turns.
    async fn increment(kv: KvClient, times: usize) {
        let mut done = 0;
        while done < times {
            let cur = kv.get("n").await.unwrap();
            let next = cur
                .as_ref()
                .map_or(0, |v| u64::from_be_bytes(v[..].try_into().unwrap()))
                + 1;
            if kv.cas("n", cur, next.to_be_bytes()).await.unwrap().0 {
                done += 1;
            }
        }
    }
    tokio::join!(
        increment(a.clone(), 5),
        increment(a.clone(), 5),
        increment(b.clone(), 5)
    );
    let n = a.get("n").await.unwrap().unwrap();
    assert_eq!(u64::from_be_bytes(n[..].try_into().unwrap()), 15);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_crashed_primary() {
    // Replica 0, the primary of view 0, never starts: the others must change view.
    let cluster = TestCluster::start(&[1, 2, 3]).await;
    let kv = KvClient::connect(cluster.setup(3, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(kv.put("k", "v").await.unwrap(), None);
    assert!(kv.client().view() >= 1, "the client learned the new view");
    assert_eq!(kv.get("k").await.unwrap(), Some(b"v".to_vec()));
    let s = kv.client().stats();
    assert!(s.retransmissions >= 1, "{s:?}");
    assert_eq!(s.replicas_connected, 3);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_leave_out_a_replica_that_is_down() {
    // Replica 2 never starts. Reads go to 2f+1 replicas in turn, and connecting to replica
    // 2 is refused: every read leaves it out, none has to ask the fourth replica too.
    let cluster = TestCluster::start(&[0, 1, 3]).await;
    let kv = KvClient::connect(cluster.setup(1, Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(kv.put("k", "v").await.unwrap(), None);
    for _ in 0..20 {
        assert_eq!(kv.get("k").await.unwrap(), Some(b"v".to_vec()));
    }
    let s = kv.client().stats();
    assert_eq!(s.completed, 21);
    assert_eq!(s.reads_widened, 0, "{s:?}");
    assert_eq!(s.reads_ordered, 0, "{s:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_result_waits_for_a_replica_that_is_down() {
    // Replica 2 never starts. An ordered get of a long value is answered in full by one
    // replica (picked by the request's timestamp) and as a digest by the others: the client
    // never leaves the result to replica 2, so none is asked for again (one in three was).
    let cluster = TestCluster::start(&[0, 1, 3]).await;
    let kv = KvClient::connect(cluster.setup(1, Duration::from_secs(20)))
        .await
        .unwrap();
    let value = vec![b'x'; 200];
    assert_eq!(kv.put("long", value.clone()).await.unwrap(), None);
    let get = KvOp::Get {
        key: b"long".to_vec(),
    }
    .encode();
    for _ in 0..30 {
        let r = kv.client().invoke(get.clone()).await.unwrap();
        assert_eq!(
            KvResult::decode(&r).unwrap(),
            KvResult::Value(Some(value.clone()))
        );
    }
    let s = kv.client().stats();
    assert_eq!(s.completed, 31);
    assert_eq!(s.results_asked_again, 0, "{s:?}");
    cluster.shutdown().await;
}
