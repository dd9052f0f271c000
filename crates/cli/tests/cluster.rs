//! A real cluster: four `redoubt replica` processes on 127.0.0.1, driven by clients of the
//! client library, under process crashes and hostile traffic.

mod common;

use common::{http_get, Cluster};
use rand::RngExt as _;
use redoubt_client::kv::KvClient;
use redoubt_client::{Client, ClientError};
use redoubt_core::message::{
    encode_body, encode_frame, Frame, Prepare, Request, SignedRequest, Tag, TagKind, WIRE_VERSION,
};
use redoubt_core::seal::seal_body;
use redoubt_core::{Message, Principal, StaticKeys};
use redoubt_crypto::{Digest, Mac};
use redoubt_services::kv::{KvOp, KvResult};
use redoubt_sim::linearizability::{self, Operation};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Client deadline in these tests: an operation that takes longer is recorded as incomplete.
const DEADLINE: Duration = Duration::from_secs(8);

fn ms_since(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

/// Three clients do random put/get/cas on four shared keys for ~6 s; the primary is killed
/// with SIGKILL at ~2 s. The history must be linearizable, and operations must keep
/// completing after the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_sigkill_mid_workload_stays_linearizable() {
    let mut cluster = Cluster::start(3).await;
    let t0 = Instant::now();
    let history = Arc::new(Mutex::new(Vec::<Operation>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 1..=3u64 {
        let client = Client::connect(cluster.client_setup(c, DEADLINE))
            .await
            .expect("client");
        let history = history.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                n += 1;
                let op = {
                    let mut rng = rand::rng();
                    let key = format!("k{}", rng.random_range(0..4u32)).into_bytes();
                    let value = format!("c{c}-{n}").into_bytes();
                    match rng.random_range(0..3u32) {
                        0 => KvOp::Put { key, value },
                        1 => KvOp::Get { key },
                        _ => KvOp::Cas {
                            key,
                            // Values this client wrote recently, or absence: some succeed.
                            expected: match rng.random_range(0..3u32) {
                                0 => None,
                                _ => Some(
                                    format!(
                                        "c{}-{}",
                                        rng.random_range(1..=3u32),
                                        n.saturating_sub(rng.random_range(1..4u64))
                                    )
                                    .into_bytes(),
                                ),
                            },
                            new: value,
                        },
                    }
                };
                let invoke_ms = ms_since(t0);
                let reply = if op.is_read_only() {
                    client.invoke_read_only(op.encode()).await
                } else {
                    client.invoke(op.encode()).await
                };
                let (complete_ms, result) = match reply {
                    Ok(bytes) => (
                        Some(ms_since(t0)),
                        Some(KvResult::decode(&bytes).expect("decodable result")),
                    ),
                    Err(ClientError::Unreachable { .. }) => (None, None),
                    Err(e) => panic!("client {c}: {e}"),
                };
                history.lock().unwrap().push(Operation {
                    client: c,
                    invoke_ms,
                    complete_ms,
                    op,
                    result,
                });
            }
        }));
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let primary = cluster.primary().await;
    let kill_ms = ms_since(t0);
    cluster.kill(primary);
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Relaxed);
    for t in tasks {
        tokio::time::timeout(DEADLINE + Duration::from_secs(2), t)
            .await
            .expect("clients finish")
            .expect("client task");
    }

    let history = history.lock().unwrap().clone();
    let before = history
        .iter()
        .filter(|o| o.invoke_ms < kill_ms && o.complete_ms.is_some())
        .count();
    let after = history
        .iter()
        .filter(|o| o.invoke_ms > kill_ms && o.complete_ms.is_some())
        .count();
    assert!(
        before > 10,
        "only {before} operations completed before the kill; {}",
        cluster.logs_hint()
    );
    assert!(
        after > 10,
        "only {after} operations invoked after the kill (of replica {primary}) completed; {}",
        cluster.logs_hint()
    );
    eprintln!(
        "{} operations ({before} completed before the kill of replica {primary}, {after} invoked after it completed)",
        history.len()
    );
    if let Err(v) = linearizability::check(&history) {
        panic!(
            "history of {} operations is not linearizable: key {:?}: {}; {}",
            history.len(),
            String::from_utf8_lossy(&v.key),
            v.explanation,
            cluster.logs_hint()
        );
    }
}

/// Every put acknowledged before all four replicas are SIGKILLed at once is readable with its
/// value after they restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_replicas_sigkilled_and_restarted_lose_no_acknowledged_write() {
    let mut cluster = Cluster::start(1).await;
    let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    // Last acknowledged value per key, and the value of a put still in flight.
    let mut acked: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_secs(3) {
        let key = format!("key-{}", i % 40);
        let value = format!("value-{i}").into_bytes();
        kv.put(key.clone(), value.clone())
            .await
            .expect("put before the crash");
        acked.insert(key, value);
        i += 1;
    }
    // One more put in flight while everything dies: it may or may not survive.
    let in_flight_key = format!("key-{}", i % 40);
    let in_flight_value = format!("value-{i}").into_bytes();
    let kv2 = kv.clone();
    let (k2, v2) = (in_flight_key.clone(), in_flight_value.clone());
    let in_flight = tokio::spawn(async move { kv2.put(k2, v2).await });
    tokio::time::sleep(Duration::from_millis(2)).await;
    cluster.kill_all();
    in_flight.abort();
    drop(kv);
    assert!(acked.len() >= 10, "only {} puts acknowledged", acked.len());

    for r in 0..4 {
        cluster.spawn(r);
    }
    cluster.wait_up().await;
    let kv = KvClient::connect(cluster.client_setup(1, Duration::from_secs(15)))
        .await
        .expect("client");
    eprintln!("{} keys acknowledged before the crash", acked.len());
    for (key, value) in &acked {
        let got = kv.get(key.clone()).await.expect("get after the restart");
        let ok = got.as_ref() == Some(value)
            || (*key == in_flight_key && got.as_ref() == Some(&in_flight_value));
        assert!(
            ok,
            "{key}: acknowledged {:?} before the crash, read {:?} after the restart; {}",
            String::from_utf8_lossy(value),
            got.as_deref().map(String::from_utf8_lossy),
            cluster.logs_hint()
        );
    }
}

/// What a hostile client sends.
#[derive(Clone, Copy)]
enum Garbage {
    /// Random bytes with a valid length prefix.
    RandomBytes,
    /// A length prefix far over the frame limit.
    OversizedPrefix,
    /// A well-formed PREPARE claiming to come from replica 1, with an authenticator made of
    /// keys the attacker guessed.
    ForgedReplica,
    /// A well-formed request claiming to come from client 2, with a forged authenticator.
    ForgedClient,
    /// A real-looking frame with bytes flipped.
    Flipped,
}

fn garbage_frame(kind: Garbage, n: u32, forged: &StaticKeys) -> Vec<u8> {
    let mut rng = rand::rng();
    let body = match kind {
        Garbage::RandomBytes => {
            let len = rng.random_range(1..300usize);
            (0..len).map(|_| rng.random::<u8>()).collect()
        }
        Garbage::OversizedPrefix => return u32::MAX.to_be_bytes().to_vec(),
        Garbage::ForgedReplica => {
            let msg = Message::from(Prepare {
                view: 0,
                seq: rng.random_range(1..100),
                digest: Digest::of(&rng.random::<[u8; 8]>()),
                replica: 1,
                doubts: Vec::new(),
            });
            seal_body(forged, encode_body(&msg), TagKind::Authenticator, None, n)
        }
        Garbage::ForgedClient => {
            let request = Request {
                client: 2,
                timestamp: rng.random(),
                read_only: false,
                op: KvOp::Put {
                    key: b"k".to_vec(),
                    value: b"forged".to_vec(),
                }
                .encode()
                .into(),
            };
            encode_frame(&Frame {
                version: WIRE_VERSION,
                from: Principal::Client(2),
                epoch: 0,
                body: encode_body(&Message::from(SignedRequest {
                    request,
                    auth: (0..n).map(|_| Mac(rng.random())).collect(),
                    sig: None,
                })),
                tag: Tag::None,
            })
        }
        Garbage::Flipped => {
            let msg = Message::from(Prepare {
                view: 0,
                seq: 1,
                digest: Digest::ZERO,
                replica: 1,
                doubts: Vec::new(),
            });
            let mut f = seal_body(forged, encode_body(&msg), TagKind::Authenticator, None, n);
            let i = rng.random_range(0..f.len());
            f[i] ^= 1 << rng.random_range(0..8u32);
            f
        }
    };
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Sends garbage to `addr` until `stop`, reconnecting whenever the replica closes the
/// connection (it closes it on most bad frames). About 200 frames per second.
async fn hostile(addr: SocketAddr, n: u32, stop: Arc<AtomicBool>) -> u64 {
    let forged = StaticKeys::derive(
        b"the attacker does not know the master secret",
        Principal::Replica(1),
        (0..n).map(Principal::Replica),
    );
    let kinds = [
        Garbage::RandomBytes,
        Garbage::ForgedReplica,
        Garbage::ForgedClient,
        Garbage::Flipped,
        Garbage::OversizedPrefix,
    ];
    let mut sent = 0u64;
    let mut i = 0usize;
    while !stop.load(Relaxed) {
        let Ok(Ok(mut sock)) =
            tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
                .await
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        while !stop.load(Relaxed) {
            let frame = garbage_frame(kinds[i % kinds.len()], n, &forged);
            i += 1;
            if sock.write_all(&frame).await.is_err() {
                break;
            }
            sent += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    sent
}

/// `redoubt_messages_rejected_total` summed by reason.
fn rejected_by_reason(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("redoubt_messages_rejected_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let reason = labels
            .split(',')
            .find_map(|l| l.strip_prefix("reason=\""))
            .map(|r| r.trim_end_matches('"').to_string())
            .unwrap_or_default();
        *out.entry(reason).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    out
}

/// Garbage frames to every replica for the whole test do not disturb a correct client, and
/// the replicas count what they rejected, by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_frames_do_not_disturb_a_correct_client() {
    let cluster = Cluster::start(2).await;
    let n = cluster.cfg.replicas.len() as u32;
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = cluster
        .cfg
        .replicas
        .iter()
        .map(|r| tokio::spawn(hostile(r.addr, n, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    let mut latencies = Vec::new();
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_secs(6) {
        let key = format!("key-{}", i % 8);
        let value = format!("value-{i}").into_bytes();
        let t = Instant::now();
        kv.put(key.clone(), value.clone())
            .await
            .unwrap_or_else(|e| panic!("put {i} under attack: {e}; {}", cluster.logs_hint()));
        latencies.push(t.elapsed());
        let t = Instant::now();
        let got = kv
            .get(key.clone())
            .await
            .unwrap_or_else(|e| panic!("get {i} under attack: {e}; {}", cluster.logs_hint()));
        latencies.push(t.elapsed());
        assert_eq!(got, Some(value), "read-back of {key}");
        i += 1;
    }
    stop.store(true, Relaxed);
    let mut sent = 0;
    for a in attackers {
        sent += a.await.expect("attacker task");
    }
    latencies.sort();
    let p99 = latencies[(latencies.len() - 1) * 99 / 100];
    assert!(
        latencies.len() >= 50,
        "only {} operations in 6 s under attack",
        latencies.len()
    );
    assert!(
        p99 < Duration::from_secs(1),
        "p99 latency under attack is {p99:?}; {}",
        cluster.logs_hint()
    );
    assert!(sent > 100, "the attackers sent only {sent} frames");

    let mut total: BTreeMap<String, f64> = BTreeMap::new();
    for r in &cluster.cfg.replicas {
        let metrics = http_get(r.metrics_addr, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("/metrics of replica {}: {e}", r.id));
        let by_reason = rejected_by_reason(&metrics);
        assert!(
            by_reason.values().sum::<f64>() > 0.0,
            "replica {} counted no rejected frames:\n{metrics}",
            r.id
        );
        for (reason, v) in by_reason {
            *total.entry(reason).or_default() += v;
        }
    }
    eprintln!(
        "{} operations under attack, p99 {p99:?}; {sent} garbage frames sent; rejected by reason: {total:?}",
        latencies.len()
    );
    for reason in ["malformed", "bad_mac"] {
        assert!(
            total.get(reason).copied().unwrap_or(0.0) > 0.0,
            "no frame rejected as {reason}; counted: {total:?}"
        );
    }
    assert!(
        total.get("bad_request_auth").copied().unwrap_or(0.0)
            + total.get("unknown_sender").copied().unwrap_or(0.0)
            > 0.0,
        "no forged client request rejected; counted: {total:?}"
    );
}

/// Runs `redoubt` with `args` against the cluster's config; (exit code, stdout, stderr).
fn cli(cluster: &Cluster, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = common::redoubt();
    cmd.arg(args[0]).arg("--config").arg(&cluster.config);
    cmd.args(&args[1..]);
    let out = common::output_within(cmd, Duration::from_secs(30));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `redoubt kv --client 1 ARGS...` against the cluster.
fn kv(cluster: &Cluster, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["kv", "--client", "1"];
    all.extend_from_slice(args);
    cli(cluster, &all)
}

/// `redoubt kv` and `redoubt status` against a live cluster: outputs and exit statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_and_status_commands() {
    let mut cluster = Cluster::start(1).await;
    let (code, _, err) = kv(&cluster, &["put", "greeting", "hello world"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = kv(&cluster, &["get", "greeting"]);
    assert_eq!((code, out.as_str()), (Some(0), "hello world\n"), "{err}");
    let (code, out, err) = kv(&cluster, &["get", "nothing"]);
    assert_eq!((code, out.as_str()), (Some(3), ""), "{err}");
    assert!(err.contains("not found"), "{err}");
    let (code, _, err) = kv(&cluster, &["cas", "greeting", "--expected", "bye", "x"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("hello world"), "{err}");
    let (code, _, err) = kv(
        &cluster,
        &["cas", "greeting", "--expected", "hello world", "bye"],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = kv(&cluster, &["cas", "fresh", "--absent", "1"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = kv(&cluster, &["scan"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "fresh\t1\ngreeting\tbye\n"),
        "{err}"
    );
    let (code, _, err) = kv(&cluster, &["delete", "fresh"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = kv(&cluster, &["delete", "fresh"]);
    assert_eq!(code, Some(3), "{err}");
    let (code, _, err) = cli(&cluster, &["kv", "--client", "7", "get", "x"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no client 7"), "{err}");

    let (code, out, err) = cli(&cluster, &["status"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.matches(" up ").count(), 4, "{out}");
    assert!(out.contains("cluster is serving"), "{out}");

    // For programs: one JSON object per answer, the same exit statuses; the cluster file and
    // the client id may come from the environment.
    let mut cmd = common::redoubt();
    cmd.env("REDOUBT_CONFIG", &cluster.config)
        .env("REDOUBT_CLIENT", "1")
        .args(["kv", "-o", "json", "get", "greeting"]);
    let out = common::output_within(cmd, Duration::from_secs(30));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(answer["found"], true, "{answer}");
    assert_eq!(answer["value"], "bye", "{answer}");
    let (code, out, err) = kv(&cluster, &["-o", "json", "get", "nothing"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(out.contains("\"found\":false"), "{out}");
    let (code, out, err) = kv(&cluster, &["-o", "json", "scan"]);
    assert_eq!(code, Some(0), "{err}");
    let answer: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(answer["pairs"][0]["key"], "greeting", "{answer}");
    let (code, out, err) = cli(&cluster, &["status", "-o", "json"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let answer: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(answer["serving"], true, "{answer}");
    assert_eq!(
        answer["replicas"].as_array().map(Vec::len),
        Some(4),
        "{answer}"
    );
    assert_eq!(answer["replicas"][0]["status"]["normal"], true, "{answer}");
    // Each replica says which executable it runs (what a rolling upgrade follows).
    let exe = answer["replicas"][0]["status"]["executable_blake3"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(exe.len(), 64, "{answer}");

    // One replica down: still serving (3 = 2f+1 left), the table says `down`.
    cluster.kill(3);
    let (code, out, err) = cli(&cluster, &["status"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.matches(" down ").count(), 1, "{out}");
    assert!(out.contains("replica 3 down"), "{out}");
    assert!(out.contains("warning: no fault margin left"), "{out}");
    // Two down: no quorum; exit status 1 with the reason.
    cluster.kill(2);
    let (code, out, err) = cli(&cluster, &["status"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("cannot order requests"), "{err}");
    // A kv operation then gives up at its timeout with advice.
    let (code, _, err) = kv(&cluster, &["--timeout", "1", "put", "k", "v"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("redoubt status"), "{err}");
    // While one process acts as client 1, a second one fails at once and says why.
    let mut waiting = common::redoubt();
    waiting
        .args(["kv", "--config"])
        .arg(&cluster.config)
        .args(["--client", "1", "--timeout", "4", "put", "k", "v"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut waiting = waiting.spawn().expect("spawn");
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let (code, _, err) = kv(&cluster, &["get", "k"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("in use by another process"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "it waited {:?}",
        t0.elapsed()
    );
    let _ = waiting.wait();
}

/// Sealed bodies between real processes: a value written and read back through the cluster
/// never reaches a replica's journal in clear, and the replicas opened the client's session
/// through their key holders (metrics).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_reach_no_journal_in_clear() {
    let mut cluster = Cluster::start(1).await;
    assert!(
        cluster.cfg.protocol.confidential_bodies,
        "init seals bodies"
    );
    let secret = "SECRET-value-7f3a";
    let (code, _, err) = kv(&cluster, &["put", "greeting", secret]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = kv(&cluster, &["get", "greeting"]);
    assert_eq!((code, out.trim()), (Some(0), secret), "{err}");
    // The client is answered by three replicas; the fourth may still be executing the write
    // (waiting for its key holder to open the session, an effect): it gets ten seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (opened, executed) = loop {
        let (mut opened, mut executed) = (0.0, f64::MAX);
        for r in &cluster.cfg.replicas {
            let metrics = http_get(r.metrics_addr, "/metrics").await.expect("metrics");
            opened += metric(&metrics, "redoubt_body_sessions_opened_total");
            executed = executed.min(metric(&metrics, "redoubt_last_executed_seq"));
        }
        if (opened >= 4.0 && executed >= 1.0) || std::time::Instant::now() >= deadline {
            break (opened, executed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        opened >= 4.0 && executed >= 1.0,
        "every replica opened a body session ({opened}) and ran the write ({executed})"
    );
    for i in 0..4 {
        cluster.kill(i);
    }
    for r in &cluster.cfg.replicas {
        let journal = cluster.cfg.resolve(&r.home).join("journal.log");
        let bytes = std::fs::read(&journal).expect("journal");
        assert!(bytes.len() > 100, "{} is written", journal.display());
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{} holds the value in clear",
            journal.display()
        );
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Bytes of a replica's page file flipped while it is down: the check at start-up finds the
/// corrupt pages, the replica reports them, fetches them from the others and catches up; the
/// cluster's data is intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_page_file_is_found_at_start_and_repaired() {
    let mut cluster = Cluster::start(1).await;
    let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    // Enough batches for two stable checkpoints, so the pages are in every page file.
    for i in 0..300u64 {
        kv.put(format!("key-{}", i % 50), vec![i as u8; 2000])
            .await
            .expect("put");
    }
    let victim = (cluster.primary().await + 1) % 4;
    cluster.kill(victim);
    let pages = cluster
        .cfg
        .resolve(&cluster.cfg.replica(victim).unwrap().home)
        .join("state/pages.dat");
    {
        use std::os::unix::fs::FileExt as _;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&pages)
            .expect("page file");
        for at in [100u64, 4096 * 3 + 7, 4096 * 20 + 1] {
            f.write_all_at(b"\xde\xad", at).expect("corrupt");
        }
        f.sync_all().unwrap();
    }
    cluster.spawn(victim);
    cluster.wait_up().await;
    let addr = cluster.cfg.replica(victim).unwrap().metrics_addr;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st: serde_json::Value =
            serde_json::from_str(&http_get(addr, "/status").await.unwrap_or_default())
                .unwrap_or_default();
        let found = st["corrupt_pages_found"].as_u64().unwrap_or(0);
        let transfers = st["state_transfers"].as_u64().unwrap_or(0);
        if found >= 3 && transfers >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica {victim} did not report and repair its corrupt pages: {st}; {}",
            cluster.logs_hint()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(cluster.log_path(victim)).unwrap();
    assert!(
        log.contains("state pages do not match their digests"),
        "{log}"
    );
    // Everything written is readable, and the repaired replica keeps executing.
    for i in 250..300u64 {
        let got = kv.get(format!("key-{}", i % 50)).await.expect("get");
        assert_eq!(got, Some(vec![i as u8; 2000]));
    }
}

/// Every new client process's first ordered request is answered without a retransmission:
/// its NEW-KEY goes right before the request, and the replicas hold the request until the
/// key is admitted and send the answers back on the connection the NEW-KEY came on (the
/// issue's "0.4 s per `redoubt kv put`" was one retransmission timeout per new process).
/// Four processes of one client in a row. The replicas held the first requests (their
/// metric), and at most one process retransmitted (a key holder slow to sync on a loaded
/// machine; and more than three processes of one client within a few seconds still often
/// wait out the timeout, not understood yet): before the replicas held such requests every
/// process retransmitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_process_is_answered_without_a_retransmission() {
    let cluster = Cluster::start(4).await;
    let mut retransmitted = Vec::new();
    for i in 0..4 {
        // A new Client is what a new process is: a new session, a new NEW-KEY. Each with an
        // id of its own: a view change early in a loaded run may put a client whose request
        // was doubted under suspicion (its later requests then go signed, after a
        // retransmission), which is not what this test is about.
        let kv = KvClient::connect(cluster.client_setup(i + 1, DEADLINE))
            .await
            .expect("client");
        kv.put(format!("k{i}"), b"v".to_vec()).await.expect("put");
        let stats = kv.client().stats();
        assert_eq!(stats.completed, 1, "{stats:?}");
        if stats.retransmissions > 0 {
            retransmitted.push((i, stats));
        }
    }
    // Metrics are refreshed now and then: up to five seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let held = loop {
        let mut held = 0.0;
        for r in &cluster.cfg.replicas {
            let metrics = http_get(r.metrics_addr, "/metrics").await.expect("metrics");
            held += metric(&metrics, "redoubt_frames_held_for_keys_total");
        }
        if held >= 1.0 || std::time::Instant::now() >= deadline {
            break held;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Held where it came before its key (a request after the admission needs no holding).
    assert!(held >= 1.0, "first requests held for their keys: {held}");
    assert!(retransmitted.len() <= 1, "{retransmitted:?}");
}

/// With a replica down, a new client process's fast reads leave it out from its first read
/// (connecting to it was refused), instead of waiting for its answer before asking the
/// others (0.2 s on three reads in four).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_new_clients_leave_a_replica_that_is_down_out() {
    let mut cluster = Cluster::start(1).await;
    let writer = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    writer.put("k", b"v".to_vec()).await.expect("put");
    drop(writer);
    cluster.kill(3);
    for i in 0..4 {
        let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
            .await
            .expect("client");
        // An ordered write first: the replicas then hold this process's keys.
        kv.put(format!("w{i}"), b"w".to_vec()).await.expect("put");
        let got = kv.get("k").await.expect("get");
        assert_eq!(got.as_deref(), Some(&b"v"[..]));
        let stats = kv.client().stats();
        assert_eq!(
            (stats.reads_widened, stats.reads_ordered),
            (0, 0),
            "client {i}: {stats:?}"
        );
    }
}
