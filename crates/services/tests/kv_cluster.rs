//! The key-value store and its client against a real (in-process) cluster over TCP.
//!
//! This file carries a miniature node runtime: each replica is a tokio task that owns a
//! `redoubt_core::Replica`, a `Listener` for everything sent to it, and one `Link` to every
//! other replica. It is written to be read as a sketch of the real runtime (`redoubt-node`).

use redoubt_client::kv::{KvClient, KvClientError};
use redoubt_client::{Client, ClientError, ClientSetup, Connections};
use redoubt_core::message::decode_frame;
use redoubt_core::seal::{open, verify_request};
use redoubt_core::{
    ClientId, Config, Effect, Env, Input, Keys, Message, Principal, Replica, ReplicaId, StaticKeys,
};
use redoubt_services::kv::KvService;
use redoubt_transport::{ConnId, Link, LinkConfig, Listener, ListenerConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

const MASTER: &[u8] = b"test-master";
const F: u32 = 1;
const N: u32 = 3 * F + 1;
/// Client ids the cluster has keys for.
const CLIENTS: [ClientId; 3] = [1, 2, 3];

fn principals() -> Vec<Principal> {
    (0..N)
        .map(Principal::Replica)
        .chain(CLIENTS.iter().map(|c| Principal::Client(*c)))
        .collect()
}

fn keys(p: Principal) -> StaticKeys {
    StaticKeys::derive(MASTER, p, principals())
}

fn client_keys(p: Principal) -> Keys {
    Keys::Static(keys(p))
}

/// Milliseconds since the UNIX epoch: the clock every host feeds its core.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn env() -> Env {
    Env {
        now_ms: now_ms(),
        entropy: rand::random(),
    }
}

/// A free loopback address with nothing listening on it (a replica that is down).
fn dead_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

// ----- the miniature node runtime --------------------------------------------------------------

/// Everything one replica task owns.
struct ReplicaHost {
    replica: Replica<KvService, StaticKeys>,
    /// The host's handle on the replica's (in-memory) page store.
    store: redoubt_core::state::MemStore,
    /// Accepts connections from clients and from the other replicas' links.
    listener: Listener,
    /// One link per replica id (`None` for this replica itself).
    peers: Vec<Option<Link>>,
    /// The connection each client last sent an authentic request on: where its replies go.
    clients: HashMap<ClientId, ConnId>,
}

impl ReplicaHost {
    /// Runs the replica until `stop` fires: every received frame and every 5 ms tick goes into
    /// the core, and every effect it returns is carried out.
    async fn run(
        mut self,
        mut from_listener: mpsc::Receiver<(ConnId, Vec<u8>)>,
        mut from_links: mpsc::Receiver<Vec<u8>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let effects = tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                Some((conn, frame)) = from_listener.recv() => {
                    if !self.note_sender(conn, &frame) {
                        continue;
                    }
                    self.replica.handle(env(), Input::Receive(&frame))
                }
                // Peers answer on their own links, but a peer may also write back on ours.
                Some(frame) = from_links.recv() => self.replica.handle(env(), Input::Receive(&frame)),
                _ = tick.tick() => self.replica.handle(env(), Input::Tick),
            };
            self.carry_out(effects);
        }
    }

    /// Learns where a client's replies go. Returns false (and hangs up) for a frame that does
    /// not even decode. Only a request whose authenticator entry for this replica verifies
    /// moves a client's reply route, so a forger cannot divert another client's replies.
    fn note_sender(&mut self, conn: ConnId, frame: &[u8]) -> bool {
        let max = self.replica.config().message_bytes_max;
        let Ok(decoded) = decode_frame(frame, max) else {
            self.listener.close_conn(conn);
            return false;
        };
        if let Principal::Client(c) = decoded.from {
            let auth = self.replica.auth();
            if let Ok(Message::Request(r)) = open(auth, &decoded.borrowed()) {
                if r.request.client == c
                    && verify_request(auth, decoded.from, &r.request.digest(), &r.auth)
                {
                    self.clients.insert(c, conn);
                }
            }
        }
        true
    }

    fn carry_out(&self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send {
                    to: Principal::Replica(r),
                    bytes,
                } => {
                    if let Some(Some(link)) = self.peers.get(r as usize) {
                        let _ = link.send(bytes); // a full queue drops: the protocol retransmits
                    }
                }
                Effect::Send {
                    to: Principal::Client(c),
                    bytes,
                } => {
                    if let Some(conn) = self.clients.get(&c) {
                        let _ = self.listener.send(*conn, bytes);
                    }
                }
                Effect::Broadcast { bytes } => {
                    for link in self.peers.iter().flatten() {
                        let _ = link.send(bytes.clone());
                    }
                }
                // The state's durable base moves: written to the in-memory store the
                // replica's state reads from.
                Effect::CommitState(c) => c.apply(&mut self.store.clone()).expect("memory store"),
                // A real node makes `Persist` records durable before the sends of the same
                // `handle` call, and exports events as metrics. This cluster lives in memory
                // and never restarts a replica, so it skips both.
                _ => {}
            }
        }
    }
}

/// A cluster of `N` replicas on loopback, some of which may be down.
struct TestCluster {
    addrs: Vec<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl TestCluster {
    /// Starts the replicas whose id is in `up`; the others have an address nobody listens on.
    async fn start(up: &[ReplicaId]) -> TestCluster {
        let cfg = Config::new(F);
        let listener_cfg = ListenerConfig {
            frame_bytes_max: cfg.message_bytes_max,
            per_conn_queue_max: 1024,
            per_conn_queue_bytes_max: 64 << 20,
            connections_max: 64,
        };
        let link_cfg = LinkConfig {
            frames_queued_max: 1024,
            bytes_queued_max: 64 << 20,
            frame_bytes_max: cfg.message_bytes_max,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(1),
        };
        // Bind every listener first, so that all addresses are known before any link dials.
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for r in 0..N {
            if up.contains(&r) {
                let (tx, rx) = mpsc::channel(4096);
                let l = Listener::bind("127.0.0.1:0".parse().unwrap(), listener_cfg.clone(), tx)
                    .await
                    .expect("bind");
                addrs.push(l.local_addr());
                listeners.push(Some((l, rx)));
            } else {
                addrs.push(dead_addr());
                listeners.push(None);
            }
        }
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for (r, slot) in listeners.into_iter().enumerate() {
            let Some((listener, from_listener)) = slot else {
                continue;
            };
            let r = r as ReplicaId;
            let (links_tx, from_links) = mpsc::channel(4096);
            let peers = (0..N)
                .map(|p| {
                    (p != r)
                        .then(|| Link::spawn(addrs[p as usize], link_cfg.clone(), links_tx.clone()))
                })
                .collect();
            let store = redoubt_core::state::MemStore::new(
                redoubt_core::state::Geometry::new(4096, 64, 16).expect("geometry"),
            );
            let host = ReplicaHost {
                replica: Replica::new(
                    cfg.clone(),
                    r,
                    keys(Principal::Replica(r)),
                    KvService::new(),
                    redoubt_core::open_state(Box::new(store.clone())).expect("memory store"),
                ),
                store,
                listener,
                peers,
                clients: HashMap::new(),
            };
            tasks.push(tokio::spawn(host.run(
                from_listener,
                from_links,
                stop_rx.clone(),
            )));
        }
        TestCluster { addrs, stop, tasks }
    }

    fn setup(&self, client: ClientId, deadline: Duration) -> ClientSetup {
        ClientSetup {
            deadline,
            ..ClientSetup::new(
                client,
                self.addrs.clone(),
                Config::new(F),
                client_keys(Principal::Client(client)),
            )
        }
    }

    async fn shutdown(self) {
        self.stop.send_replace(true);
        for t in self.tasks {
            t.await.expect("replica task did not panic");
        }
    }
}

// ----- tests ----------------------------------------------------------------------------------

#[tokio::test]
async fn kv_operations_through_a_cluster() {
    let cluster = TestCluster::start(&[0, 1, 2, 3]).await;
    let kv = KvClient::connect(cluster.setup(1, Duration::from_secs(20)))
        .await
        .unwrap();

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

    // Operations above the request limit never leave the client.
    let huge = vec![0u8; Config::new(F).request_bytes_max + 1];
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

#[tokio::test]
async fn clients_sharing_connections() {
    let cluster = TestCluster::start(&[0, 1, 2, 3]).await;
    let frame_max = Config::new(F).message_bytes_max;
    let shared = Connections::open(&cluster.addrs, CLIENTS.len(), frame_max);
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

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
async fn reads_leave_out_a_replica_that_is_down() {
    // Replica 2 never starts. Reads go to 2f+1 replicas in turn: the first one that asks
    // replica 2 has to ask the fourth too; later ones leave replica 2 out.
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
    assert_eq!(s.reads_widened, 1, "{s:?}");
    assert_eq!(s.reads_ordered, 0, "{s:?}");
    cluster.shutdown().await;
}
