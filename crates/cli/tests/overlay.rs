//! Process-level tests of the overlay daemon (`redoubt overlay`, keys dealt by `redoubt overlay
//! keygen`): daemons on 127.0.0.1 carry replica frames through their tunnels in order, heal
//! around a link that starts losing everything, route around a relay that drops 30% of what
//! it forwards (ODSBR), and carry a four-replica cluster's traffic, its client's included,
//! while the client runs `redoubt kv`.

mod common;

use common::{http_get, redoubt, stdout_of_success, Cluster};
use std::fmt::Write as _;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// `n` distinct free UDP addresses: every socket is held until all are picked, so the kernel
/// cannot hand the same port out twice.
fn free_udp(n: usize) -> Vec<SocketAddr> {
    let held: Vec<std::net::UdpSocket> = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("free UDP port"))
        .collect();
    held.iter().map(|s| s.local_addr().unwrap()).collect()
}

/// `n` distinct free TCP addresses, picked as `free_udp` picks.
fn free_tcp(n: usize) -> Vec<SocketAddr> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("free TCP port"))
        .collect();
    held.iter().map(|s| s.local_addr().unwrap()).collect()
}

/// One `[[link]]`: ends, delay, loss.
type LinkSpec = (u16, u16, u64, f64);

/// Writes an overlay file; `tunnels` are (node, peer, listen), `replicas` the nodes'
/// replica addresses, `faulty` (node, fraction). Deals the nodes' key files with `redoubt
/// overlay keygen` the first time.
fn write_overlay(
    dir: &Path,
    udp: &[SocketAddr],
    replicas: &[Option<SocketAddr>],
    links: &[LinkSpec],
    tunnels: &[(u16, u16, SocketAddr)],
    faulty: &[(u16, f64)],
) -> PathBuf {
    let mut s = String::from(
        "[overlay]\nrouting = \"odsbr\"\nrecovery = \"hop_by_hop\"\nstatus_interval_ms = 2000\n",
    );
    for (i, a) in udp.iter().enumerate() {
        let _ = write!(
            s,
            "\n[[node]]\nid = {i}\naddr = \"{a}\"\nkey_file = \"keys/overlay-{i}.key\"\n"
        );
        if let Some(r) = replicas[i] {
            let _ = writeln!(s, "replica_addr = \"{r}\"");
        }
    }
    for (a, b, delay, loss) in links {
        let _ = write!(
            s,
            "\n[[link]]\na = {a}\nb = {b}\ndelay_ms = {delay}\nloss = {loss:?}\n"
        );
    }
    for (node, peer, listen) in tunnels {
        let _ = write!(
            s,
            "\n[[tunnel]]\nnode = {node}\npeer = {peer}\nlisten = \"{listen}\"\n"
        );
    }
    for (node, f) in faulty {
        let _ = write!(s, "\n[[faulty]]\nnode = {node}\ndrop_forwarded = {f:?}\n");
    }
    let path = dir.join("overlay.toml");
    std::fs::write(&path, s).expect("overlay file");
    if !dir.join("keys/overlay-0.key").exists() {
        let mut keygen = redoubt();
        keygen.args(["overlay", "keygen", "--config"]).arg(&path);
        let out = stdout_of_success(keygen, Duration::from_secs(20));
        assert!(
            out.contains(&format!("wrote {} key files", udp.len())),
            "{out}"
        );
        // Dealt once: a second run must not replace them.
        let again = redoubt()
            .args(["overlay", "keygen", "--config"])
            .arg(&path)
            .output()
            .expect("run keygen");
        assert!(!again.status.success());
        let err = String::from_utf8_lossy(&again.stderr);
        assert!(err.contains("already exists"), "{err}");
    }
    path
}

/// The last value of the daemon counter `name` in `log`'s status lines (0 if none).
fn counter(log: &str, name: &str) -> u64 {
    log.lines()
        .rev()
        .find_map(|l| l.split(&format!("\"{name}\":")).nth(1))
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0)
}

/// `redoubt kv --client 1 ARGS` against the cluster file `config`: its output.
fn kv_as_client_1(config: &Path, args: &[&str]) -> String {
    let mut c = redoubt();
    c.arg("kv")
        .arg("--config")
        .arg(config)
        .args(["--client", "1"])
        .args(args);
    stdout_of_success(c, Duration::from_secs(20))
}

/// Overlay daemons, killed on drop.
struct Daemons {
    children: Vec<Option<Child>>,
    logs: Vec<PathBuf>,
}

impl Daemons {
    fn start(dir: &Path, file: &Path, n: u16) -> Daemons {
        let mut d = Daemons {
            children: Vec::new(),
            logs: Vec::new(),
        };
        for i in 0..n {
            let log = dir.join(format!("overlay-{i}.log"));
            let child = redoubt()
                .args(["overlay", "--config"])
                .arg(file)
                .args(["--id", &i.to_string()])
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(&log).expect("log"))
                .spawn()
                .expect("spawn redoubt overlay");
            d.children.push(Some(child));
            d.logs.push(log);
        }
        d
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.logs[i]).unwrap_or_default()
    }

    fn all_logs(&self) -> String {
        (0..self.logs.len())
            .map(|i| format!("--- overlay {i} ---\n{}", self.log(i)))
            .collect()
    }

    fn signal(&self, i: usize, sig: i32) {
        if let Some(c) = &self.children[i] {
            // SAFETY: kill(2) on the id of a child we started and have not reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

/// Sends numbered frames into a tunnel and reads them from the destination's replica
/// address; returns how many arrived, asserting they arrive in order without duplicates.
struct Stream {
    tunnel: TcpStream,
    rx: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    next_sent: u64,
    next_expected: u64,
}

impl Stream {
    async fn open(tunnel: SocketAddr, replica: TcpListener) -> Stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = replica.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Ok(f) = redoubt_transport::read_frame(&mut conn, 1 << 20).await {
                        if tx.send(f).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let tunnel = loop {
            match TcpStream::connect(tunnel).await {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("tunnel {tunnel} never opened: {e}"),
            }
        };
        Stream {
            tunnel,
            rx,
            next_sent: 0,
            next_expected: 0,
        }
    }

    /// A frame of `len` bytes carrying its number.
    async fn send(&mut self, len: usize) {
        let mut f = vec![0xab; len.max(8)];
        f[..8].copy_from_slice(&self.next_sent.to_be_bytes());
        self.next_sent += 1;
        redoubt_transport::write_frame(&mut self.tunnel, &f)
            .await
            .expect("write to the tunnel");
        self.tunnel.flush().await.expect("flush");
    }

    /// Waits until every frame sent so far arrived (in order) or `limit` passes.
    async fn drain(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.next_expected < self.next_sent {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(f)) => {
                    let n = u64::from_be_bytes(f[..8].try_into().expect("8 bytes"));
                    assert_eq!(n, self.next_expected, "frames out of order or duplicated");
                    self.next_expected += 1;
                }
                _ => return false,
            }
        }
        true
    }
}

/// A square 0-1-3 / 0-2-3 with the path through 1 shorter; a tunnel from 0 to 3.
struct Square {
    dir: tempfile::TempDir,
    udp: Vec<SocketAddr>,
    replica3: SocketAddr,
    tunnel: SocketAddr,
    links: Vec<LinkSpec>,
}

impl Square {
    fn new() -> Square {
        let tcp = free_tcp(2);
        Square {
            dir: tempfile::tempdir().expect("tempdir"),
            udp: free_udp(4),
            replica3: tcp[0],
            tunnel: tcp[1],
            links: vec![
                (0, 1, 2, 0.0),
                (1, 3, 2, 0.0),
                (0, 2, 15, 0.0),
                (2, 3, 15, 0.0),
            ],
        }
    }

    fn write(&self, faulty: &[(u16, f64)]) -> PathBuf {
        let mut replicas = vec![None; 4];
        replicas[3] = Some(self.replica3);
        write_overlay(
            self.dir.path(),
            &self.udp,
            &replicas,
            &self.links,
            &[(0, 3, self.tunnel)],
            faulty,
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_arrive_in_order_and_heal_around_a_dead_link() {
    let mut sq = Square::new();
    let file = sq.write(&[]);
    let replica = TcpListener::bind(sq.replica3).await.expect("replica addr");
    let daemons = Daemons::start(sq.dir.path(), &file, 4);
    let mut s = Stream::open(sq.tunnel, replica).await;
    // Frames of every size class, including one cut into several overlay messages.
    for i in 0..200 {
        s.send(if i % 50 == 7 { 40_000 } else { 100 + i }).await;
    }
    assert!(
        s.drain(Duration::from_secs(20)).await,
        "only {} of {} frames arrived\n{}",
        s.next_expected,
        s.next_sent,
        daemons.all_logs()
    );
    // Link 1-3 starts losing everything (both ends reread the file).
    sq.links[1].3 = 1.0;
    sq.write(&[]);
    daemons.signal(1, libc::SIGHUP);
    daemons.signal(3, libc::SIGHUP);
    let t0 = Instant::now();
    for _ in 0..300 {
        s.send(500).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        s.drain(Duration::from_secs(30)).await,
        "after the link died only {} of {} frames arrived\n{}",
        s.next_expected,
        s.next_sent,
        daemons.all_logs()
    );
    let log1 = daemons.log(1);
    assert!(log1.contains("link emulation changed"), "{log1}");
    eprintln!(
        "healed: 300 frames after the link died in {:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_drops_30_percent_is_accused_and_avoided() {
    let sq = Square::new();
    let file = sq.write(&[(1, 0.3)]);
    let replica = TcpListener::bind(sq.replica3).await.expect("replica addr");
    let daemons = Daemons::start(sq.dir.path(), &file, 4);
    let mut s = Stream::open(sq.tunnel, replica).await;
    let t0 = Instant::now();
    let mut accused = false;
    while t0.elapsed() < Duration::from_secs(50) {
        for _ in 0..20 {
            s.send(1_000).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if daemons.log(0).contains("accused link") {
            accused = true;
            break;
        }
    }
    let log0 = daemons.log(0);
    assert!(accused, "no accusation in 50 s\n{}", daemons.all_logs());
    // ODSBR accuses a link with a faulty end: here 0-1 or 1-3.
    let accusation = log0
        .lines()
        .find(|l| l.contains("accused link"))
        .expect("accusation line");
    assert!(
        accusation.contains("n0-n1") || accusation.contains("n1-n3"),
        "{accusation}"
    );
    // Every frame sent after the accusation arrives, in order (the stream checks the order):
    // the frames the relay drops are sent again by the source, and the route leaves node 1
    // once its links weigh enough (the path through 1 is 7.5 times cheaper, so that takes
    // several convictions, each ban four times the last).
    let before = s.next_expected;
    for _ in 0..200 {
        s.send(1_000).await;
    }
    let all = s.drain(Duration::from_secs(30)).await;
    assert!(
        all,
        "only {} of {} frames arrived ({} after the accusation)\n{}",
        s.next_expected,
        s.next_sent,
        s.next_expected - before,
        daemons.all_logs()
    );
    eprintln!(
        "after the accusation: {} more frames delivered in order, all {}: {all}",
        s.next_expected - before,
        s.next_sent
    );
    eprintln!("accused after {:?}: {accusation}", t0.elapsed());
}

/// Four replicas, each beside an overlay daemon on a ring with a diagonal (0-1-2-3-0, 0-2),
/// every replica-to-replica frame through the overlay; the client runs `redoubt kv` beside a
/// fifth daemon (linked to 1 and 3) and reaches every replica through its tunnels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_kv_over_the_overlay() {
    let udp = free_udp(5);
    // Twelve tunnels between the replicas' daemons, four from the clients' daemon.
    let mut tcp = free_tcp(12 + 4).into_iter();
    let replica_tunnels: Vec<(u16, u16, SocketAddr)> = (0..4u16)
        .flat_map(|i| (0..4u16).filter(move |&j| j != i).map(move |j| (i, j)))
        .map(|(i, j)| (i, j, tcp.next().unwrap()))
        .collect();
    let client_tunnels: Vec<(u16, u16, SocketAddr)> =
        (0..4u16).map(|j| (4, j, tcp.next().unwrap())).collect();
    let tunnels: Vec<(u16, u16, SocketAddr)> = replica_tunnels
        .iter()
        .chain(&client_tunnels)
        .copied()
        .collect();
    let links: Vec<LinkSpec> = vec![
        (0, 1, 5, 0.0),
        (1, 2, 5, 0.0),
        (2, 3, 5, 0.0),
        (3, 0, 5, 0.0),
        (0, 2, 5, 0.0),
        (4, 1, 5, 0.0),
        (4, 3, 5, 0.0),
    ];
    let mut daemons = None;
    let tunnel_text: String = replica_tunnels
        .iter()
        .map(|(i, j, a)| {
            format!("\n[[overlay_tunnel]]\nreplica = {i}\npeer = {j}\naddr = \"{a}\"\n")
        })
        .chain(client_tunnels.iter().map(|(_, j, a)| {
            format!("\n[[overlay_tunnel]]\nclient = 1\npeer = {j}\naddr = \"{a}\"\n")
        }))
        .collect();
    let mut cluster = Cluster::start_monitored_with(
        1,
        0,
        |text| format!("{text}{tunnel_text}"),
        &[],
        |dir| {
            let cfg = redoubt_config::ClusterConfig::load(&dir.join("redoubt.toml"))
                .expect("cluster file");
            let mut replicas: Vec<Option<SocketAddr>> =
                cfg.replicas.iter().map(|r| Some(r.addr)).collect();
            replicas.push(None);
            let file = write_overlay(dir, &udp, &replicas, &links, &tunnels, &[]);
            daemons = Some(Daemons::start(dir, &file, 5));
        },
    )
    .await;
    let daemons = daemons.expect("daemons started");
    assert_eq!(cluster.cfg.overlay_tunnels.len(), 16);
    // The client dials only tunnel ports of node 4, never a replica.
    let setup = redoubt_client::ClientSetup::from_cluster(&cluster.cfg, 1).expect("client setup");
    let ports: Vec<SocketAddr> = client_tunnels.iter().map(|t| t.2).collect();
    assert_eq!(setup.replicas, ports);
    let kv = |args: &[&str]| kv_as_client_1(cluster.config_path(), args);
    for i in 0..20 {
        kv(&["put", &format!("k{i}"), &format!("v{i}")]);
    }
    for i in (0..20).step_by(7) {
        let out = kv(&["get", &format!("k{i}")]);
        assert!(out.contains(&format!("v{i}")), "get k{i}: {out}");
    }
    for i in 0..5 {
        daemons.signal(i, libc::SIGUSR1);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The replicas' frames went through the tunnels: the replicas' daemons delivered frames.
    let delivered = (0..4)
        .filter(|&i| counter(&daemons.log(i), "tunnel_frames_out") > 0)
        .count();
    assert!(delivered >= 3, "{}", daemons.all_logs());
    // The client's requests went in at node 4 and the replies came back out of it.
    let log4 = daemons.log(4);
    assert!(
        counter(&log4, "tunnel_conns_accepted") >= 4
            && counter(&log4, "tunnel_frames_in") > 0
            && counter(&log4, "tunnel_frames_out") > 0
            && counter(&log4, "tunnel_conns_opened") == 0,
        "{}",
        daemons.all_logs()
    );
    // And the replicas' daemons opened connections to their replicas for node 4's.
    let opened: u64 = (0..4)
        .map(|i| counter(&daemons.log(i), "tunnel_conns_opened"))
        .sum();
    assert!(opened >= 4, "{}", daemons.all_logs());
    cluster.stop_all();
}

/// `redoubt init --overlay` writes everything a cluster over the overlay needs: the overlay
/// file, its keys, and the tunnels in the cluster file. Started as its summary says (daemons,
/// then replicas), the cluster serves a client whose traffic goes through the overlay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_overlay_writes_a_cluster_that_runs_over_the_overlay() {
    let mut daemons = None;
    let cluster = Cluster::start_monitored_init(
        &["--overlay"],
        1,
        0,
        |text| text,
        &[],
        |dir| {
            let file = dir.join("overlay.toml");
            assert!(dir.join("keys/overlay-4.key").exists());
            daemons = Some(Daemons::start(dir, &file, 5));
        },
    )
    .await;
    let daemons = daemons.expect("daemons started");
    // 12 replica-to-replica tunnels and 4 for the client.
    assert_eq!(cluster.cfg.overlay_tunnels.len(), 16);
    let setup = redoubt_client::ClientSetup::from_cluster(&cluster.cfg, 1).expect("client setup");
    let replicas: Vec<SocketAddr> = cluster.cfg.replicas.iter().map(|r| r.addr).collect();
    assert!(
        setup.replicas.iter().all(|a| !replicas.contains(a)),
        "the client dials the overlay's tunnels, never a replica: {:?}",
        setup.replicas
    );
    let kv = |args: &[&str]| kv_as_client_1(cluster.config_path(), args);
    for i in 0..5 {
        kv(&["put", &format!("k{i}"), &format!("v{i}")]);
    }
    let out = kv(&["get", "k3"]);
    assert!(out.contains("v3"), "{out}");
    daemons.signal(4, libc::SIGUSR1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log4 = daemons.log(4);
    assert!(
        counter(&log4, "tunnel_conns_accepted") >= 1 && counter(&log4, "tunnel_frames_out") > 0,
        "{}",
        daemons.all_logs()
    );
    // Every daemon serves its metrics where the overlay file says (`init` wrote the
    // addresses); the clients' daemon carried the client's frames.
    let file = redoubt_overlayd::OverlayFile::load(&cluster.dir.path().join("overlay.toml"))
        .expect("overlay file");
    let addr = |k: usize| {
        file.nodes[k]
            .metrics_addr
            .expect("init writes metrics_addr")
    };
    let value = |text: &str, name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    // The figures are read from the daemon every second: up to ten seconds for ones that
    // include the client's traffic.
    let out = "redoubt_overlay_tunnel_frames_out_total{node=\"4\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = http_get(addr(4), "/metrics")
            .await
            .expect("node 4's metrics");
        if value(&text, out).is_some_and(|v| v > 0) || Instant::now() >= deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let value = |text: &str, name: &str| -> u64 {
        value(text, name).unwrap_or_else(|| panic!("{name} missing from\n{text}"))
    };
    assert!(
        value(&text, "redoubt_overlay_tunnel_frames_out_total{node=\"4\"}") > 0,
        "{text}"
    );
    assert!(value(&text, "redoubt_overlay_frames_sent_total{node=\"4\"}") > 0);
    assert!(
        text.contains("redoubt_overlay_link_up{node=\"4\",neighbour=\"0\"} 1"),
        "{text}"
    );
    for k in 0..4 {
        let status = http_get(addr(k), "/status").await.expect("status");
        assert!(status.contains(&format!("\"node\":{k}")), "{status}");
    }
}
