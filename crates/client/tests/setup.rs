//! A client's setup (from a cluster file, with the client crate alone, or given in code) and
//! a client that no replica answers. The client against a running cluster is tested with a
//! service: `crates/client/tests/kv_cluster.rs`, `examples/counter/tests/cluster.rs`.

use redoubt_client::{Client, ClientError, ClientSetup};
use redoubt_core::auth::pairwise_key;
use redoubt_core::{Auth, ClientId, ClientTiming, Config, Keys, Principal, StaticKeys};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const F: u32 = 1;
const N: u32 = 3 * F + 1;

/// Static keys of `client` with every replica.
fn client_keys(client: ClientId) -> Keys {
    let me = Principal::Client(client);
    Keys::Static(StaticKeys::derive(b"m", me, (0..N).map(Principal::Replica)))
}

/// A free loopback address with nothing listening on it (a replica that is down).
fn dead_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A cluster file for four replicas and clients 7 and 8 with static keys, and client 7's key
/// file; nothing else (no node crate, no `redoubt init`).
fn write_cluster(dir: &Path) -> std::path::PathBuf {
    let mut text = String::from(
        "[cluster]\nname = \"t\"\nid = \"c0ffee\"\n\n\
         [keys]\nmode = \"static\"\n\n[recovery]\nenabled = false\n\n\
         [protocol]\nrequest_bytes_max = 4096\n\n\
         [client_timing]\ninitial_rtt_ms = 7\ndeadline_ms = 1500\n\n",
    );
    for i in 0..4 {
        text += &format!(
            "[[replica]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nmetrics_addr = \"127.0.0.1:{}\"\n\
             home = \"r{i}\"\nkey_file = \"r{i}.key\"\n\n",
            7400 + i,
            7500 + i
        );
    }
    text +=
        "[[client]]\nid = 7\nkey_file = \"c7.key\"\n\n[[client]]\nid = 8\nkey_file = \"c8.key\"\n";
    let path = dir.join("redoubt.toml");
    std::fs::write(&path, text).unwrap();
    let me = Principal::Client(7);
    let keys: Vec<_> = (0..4)
        .map(|r| {
            let peer = Principal::Replica(r);
            (
                peer,
                pairwise_key(b"m", me, peer),
                pairwise_key(b"m", peer, me),
            )
        })
        .collect();
    redoubt_config::keys::write_key_file(&dir.join("c7.key"), "c0ffee", me, &keys).unwrap();
    path
}

#[tokio::test]
async fn a_setup_from_the_cluster_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_cluster(dir.path());
    let setup = ClientSetup::from_config(&path, 7).unwrap();
    assert_eq!(setup.id, 7);
    let addrs: Vec<String> = setup.replicas.iter().map(|a| a.to_string()).collect();
    assert_eq!(
        addrs,
        [
            "127.0.0.1:7400",
            "127.0.0.1:7401",
            "127.0.0.1:7402",
            "127.0.0.1:7403"
        ]
    );
    let mut core = Config::new(1);
    core.request_bytes_max = 4096;
    assert_eq!(setup.core, core);
    assert_eq!(setup.frame_bytes_max, core.message_bytes_max);
    assert_eq!(
        setup.timing,
        ClientTiming {
            initial_rtt_ms: 7,
            ..ClientTiming::default()
        }
    );
    assert_eq!(setup.deadline, Duration::from_millis(1500));
    assert_eq!(setup.keys.me(), Principal::Client(7));
    // The setup is complete: a client starts from it (no replica needs to be up).
    let client = Client::connect(setup).await.unwrap();
    assert_eq!(client.id(), 7);

    // Errors name the file and what to do.
    let msg = ClientSetup::from_config(&path, 9).unwrap_err().to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("valid client ids are 7, 8"),
        "{msg}"
    );
    let msg = ClientSetup::from_config(&path, 8).unwrap_err().to_string();
    assert!(
        msg.contains("c8.key") && msg.contains("redoubt init"),
        "{msg}"
    );
    let msg = ClientSetup::from_config(&dir.path().join("nope.toml"), 7)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("cannot read config file"), "{msg}");
}

/// A client of N addresses where nothing listens.
async fn client_of_dead_replicas(deadline: Duration) -> Client {
    let addrs: Vec<SocketAddr> = (0..N).map(|_| dead_addr()).collect();
    let setup = ClientSetup {
        deadline,
        timing: ClientTiming::default(),
        ..ClientSetup::new(1, addrs, Config::new(F), client_keys(1))
    };
    Client::connect(setup).await.unwrap()
}

#[tokio::test]
async fn unreachable_when_no_replica_runs() {
    let deadline = Duration::from_millis(400);
    let client = client_of_dead_replicas(deadline).await;
    let start = Instant::now();
    let err = client.invoke(b"op".to_vec()).await.unwrap_err();
    let took = start.elapsed();
    match err {
        ClientError::Unreachable {
            deadline: d,
            connected,
            replicas,
        } => assert_eq!((d, connected, replicas), (deadline, 0, N as usize)),
        other => panic!("{other}"),
    }
    assert!(took >= deadline, "gave up early: {took:?}");
    assert!(
        took < deadline + Duration::from_secs(1),
        "gave up late: {took:?}"
    );
    // The client is still usable (and still fails the same way).
    let err = client.invoke(b"op".to_vec()).await.unwrap_err();
    assert!(matches!(err, ClientError::Unreachable { .. }));
    assert_eq!(client.stats().unreachable, 2);
    assert!(
        err.to_string().contains("0 of 4 replicas connected"),
        "{err}"
    );
}

#[tokio::test]
async fn setup_is_checked() {
    let addrs: Vec<SocketAddr> = (0..N).map(|_| dead_addr()).collect();
    let wrong_keys = ClientSetup::new(1, addrs.clone(), Config::new(F), client_keys(2));
    assert!(matches!(
        Client::connect(wrong_keys).await,
        Err(ClientError::InvalidSetup(_))
    ));
    let too_few = ClientSetup::new(1, addrs[..3].to_vec(), Config::new(F), client_keys(1));
    assert!(matches!(
        Client::connect(too_few).await,
        Err(ClientError::InvalidSetup(_))
    ));
}

#[tokio::test]
async fn fails_fast_when_no_replica_is_reachable() {
    let client = client_of_dead_replicas(Duration::from_secs(30)).await;
    let start = Instant::now();
    let err = client.invoke(b"op".to_vec()).await.unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(err, ClientError::NoReplicaReachable { replicas, .. } if replicas == N as usize),
        "{err}"
    );
    assert!(
        err.to_string().contains("are the replicas running"),
        "{err}"
    );
    assert!(
        took >= redoubt_client::UNREACHABLE_AFTER,
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_secs(6), "gave up late: {took:?}");
    assert_eq!(client.stats().unreachable, 1);
}

#[tokio::test]
async fn a_call_may_bring_its_own_deadline() {
    let client = client_of_dead_replicas(Duration::from_secs(30)).await;
    let start = Instant::now();
    let err = client
        .invoke_within(b"op".to_vec(), Duration::from_millis(300))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(err, ClientError::Unreachable { deadline, .. } if deadline == Duration::from_millis(300)),
        "{err}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    let err = client
        .invoke_read_only_within(b"op".to_vec(), Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::InvalidSetup(_)), "{err}");
}

/// A deadline too far to be a point in time ("wait as long as it takes") is no error and no
/// panic: the call waits, and here fails because no replica is reachable.
#[tokio::test]
async fn an_unbounded_deadline_waits_without_overflow() {
    let client = client_of_dead_replicas(Duration::MAX).await;
    let err = client.invoke(b"op".to_vec()).await.unwrap_err();
    assert!(
        matches!(err, ClientError::NoReplicaReachable { .. }),
        "{err}"
    );
    let err = client
        .invoke_within(b"op".to_vec(), Duration::MAX)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::NoReplicaReachable { .. }),
        "{err}"
    );
}

/// A client's own connections close when the client is dropped: a replica sees end of file.
#[tokio::test]
async fn dropping_a_client_closes_its_own_connections() {
    use tokio::io::AsyncReadExt;
    let listeners: Vec<tokio::net::TcpListener> = {
        let mut v = Vec::new();
        for _ in 0..N {
            v.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        v
    };
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let client = Client::connect(ClientSetup::new(1, addrs, Config::new(F), client_keys(1)))
        .await
        .unwrap();
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(5), listeners[0].accept())
        .await
        .expect("the client connects")
        .unwrap();
    drop(client);
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
        .await
        .expect("the connection closes after the client is dropped")
        .unwrap_or(0);
    assert_eq!(n, 0, "end of file, nothing sent");
}
