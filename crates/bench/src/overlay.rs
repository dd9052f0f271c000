//! `redoubt bench overlay`: the overlay daemon measured against Amir et al.'s 2004 report.
//!
//! - `chain`: the report's chain A-B-C-D-E-F of five 10 ms links, loss on C-D, a 500 kbit/s
//!   and a 1 Mbit/s stream of 1,000-byte messages from A to F, hop-by-hop against end-to-end
//!   recovery: average delay, jitter, share of messages over 60 and 100 ms;
//! - `byzantine`: a relay on the best path starts dropping 30% of what it forwards; delivered
//!   throughput and delay before, during and after ODSBR localises it, and the time it took;
//! - `cluster`: a four-replica cluster whose replica-to-replica traffic, and its clients'
//!   traffic to replicas 1-3, crosses the overlay (20-50 ms links; the clients sit beside
//!   replica 0), with and without a faulty relay, under a closed kv load.
//!
//! The overlay daemons run in this process (the same event loop as `redoubt overlay`), on
//! 127.0.0.1 with the user-space WAN emulation; the replicas are processes. Messages enter
//! through a tunnel port and leave through the destination's replica connection, so every
//! figure includes both TCP hops on loopback.

use super::common::{kv_cluster, wait_until_up};
use anyhow::Context as _;
use clap::Args;
use redoubt_client::kv::KvClient;
use redoubt_config::{ClusterConfig, OverlayTunnel};
use redoubt_localcluster::procs::ReplicaProcs;
use redoubt_overlay::{Event, NodeId};
use redoubt_overlayd::config::{
    Emulation, FaultyEntry, LinkEntry, NodeEntry, OverlaySection, TunnelEntry,
};
use redoubt_overlayd::{Control, DaemonHandle, OverlayFile};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

#[derive(Args)]
pub struct OverlayArgs {
    /// Parts to run, comma-separated: chain, byzantine, cluster
    #[arg(long, value_delimiter = ',', default_value = "chain,byzantine,cluster")]
    parts: Vec<String>,
    /// Seconds each chain stream runs
    #[arg(long, default_value_t = 20)]
    chain_secs: u64,
    /// Seconds of the Byzantine experiment (the relay turns faulty after a third of them)
    #[arg(long, default_value_t = 45)]
    byzantine_secs: u64,
    /// Seconds of kv load per cluster run
    #[arg(long, default_value_t = 15)]
    cluster_secs: u64,
    /// Closed-loop kv clients in the cluster runs
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Directory for the CSV files [default: the current directory]
    #[arg(long, value_name = "DIR", default_value = ".")]
    csv_dir: PathBuf,
}

pub fn run(args: OverlayArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        std::fs::create_dir_all(&args.csv_dir)?;
        for p in &args.parts {
            match p.as_str() {
                "chain" => chain(&args).await?,
                "byzantine" => byzantine(&args).await?,
                "cluster" => cluster(&args).await?,
                other => anyhow::bail!("unknown part {other:?}: chain, byzantine or cluster"),
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn free_udp() -> anyhow::Result<SocketAddr> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?)
}

fn free_tcp() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// An overlay of `n` nodes on fresh ports, written to `dir`.
fn overlay_file(
    dir: &Path,
    n: u16,
    recovery: &str,
    links: &[(u16, u16, Emulation)],
    replicas: &[(u16, SocketAddr)],
    tunnels: &[(u16, u16, SocketAddr)],
    faulty: &[(u16, f64)],
) -> anyhow::Result<OverlayFile> {
    std::fs::write(
        dir.join("overlay.secret"),
        blake3::hash(b"bench").as_bytes(),
    )?;
    let path = dir.join("overlay.toml");
    let mut nodes = Vec::new();
    for id in 0..n {
        nodes.push(NodeEntry {
            id,
            addr: free_udp()?,
            replica_addr: replicas.iter().find(|r| r.0 == id).map(|r| r.1),
            key_file: None,
            metrics_addr: None,
        });
    }
    let file = OverlayFile {
        path,
        overlay: OverlaySection {
            routing: "odsbr".into(),
            recovery: recovery.into(),
            // TEST ONLY (one secret for every daemon): fine in one benchmark process.
            secret_file: Some("overlay.secret".into()),
            status_interval_ms: 600_000,
            emulation_seed: 7,
            link_queue_bytes_max: 1 << 20,
            tunnel_frame_bytes_max: 32 << 20,
            tunnel_queue_frames_max: 4_096,
            tunnel_backlog_bytes_max: 8 << 20,
            tunnel_conns_max: 8,
            tunnel_conns_total_max: 512,
            tunnel_conn_queue_bytes_max: 32 << 20,
            payload_bytes_max: 16_384,
        },
        nodes,
        links: links
            .iter()
            .map(|&(a, b, emulation)| LinkEntry { a, b, emulation })
            .collect(),
        tunnels: tunnels
            .iter()
            .map(|&(node, peer, listen)| TunnelEntry { node, peer, listen })
            .collect(),
        faulty: faulty
            .iter()
            .map(|&(node, drop_forwarded)| FaultyEntry {
                node,
                drop_forwarded,
            })
            .collect(),
    };
    file.protocol_config()?;
    Ok(file)
}

async fn spawn_all(file: &OverlayFile) -> anyhow::Result<Vec<DaemonHandle>> {
    let mut out = Vec::new();
    for id in 0..file.nodes.len() as u16 {
        out.push(redoubt_overlayd::spawn(file.clone(), id).await?);
    }
    Ok(out)
}

async fn stop_all(daemons: Vec<DaemonHandle>) {
    for d in daemons {
        let _ = d.control.send(Control::Shutdown).await;
        let _ = d.join.await;
    }
}

/// A timestamped stream from a tunnel port to a listener standing in for the replica.
struct Probe {
    tunnel: TcpStream,
    t0: Instant,
    seq: u64,
    /// (seq, sent µs, received µs) per frame that arrived.
    rx: mpsc::UnboundedReceiver<(u64, u64, u64)>,
}

impl Probe {
    async fn open(tunnel: SocketAddr, sink: TcpListener) -> anyhow::Result<Probe> {
        let t0 = Instant::now();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = sink.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Ok(f) = redoubt_transport::read_frame(&mut conn, 1 << 20).await {
                        let now = t0.elapsed().as_micros() as u64;
                        if f.len() >= 16 {
                            let seq = u64::from_be_bytes(f[..8].try_into().unwrap_or([0; 8]));
                            let sent = u64::from_be_bytes(f[8..16].try_into().unwrap_or([0; 8]));
                            let _ = tx.send((seq, sent, now));
                        }
                    }
                });
            }
        });
        let tunnel = TcpStream::connect(tunnel).await?;
        tunnel.set_nodelay(true)?;
        Ok(Probe {
            tunnel,
            t0,
            seq: 0,
            rx,
        })
    }

    async fn send(&mut self, len: usize) -> anyhow::Result<()> {
        let mut f = vec![0x5a; len.max(16)];
        f[..8].copy_from_slice(&self.seq.to_be_bytes());
        f[8..16].copy_from_slice(&(self.t0.elapsed().as_micros() as u64).to_be_bytes());
        self.seq += 1;
        redoubt_transport::write_frame(&mut self.tunnel, &f).await?;
        Ok(())
    }

    /// Sends until one frame comes back (links up, routes known), then drains.
    async fn warm_up(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.send(100).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            if self.rx.try_recv().is_ok() {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "the overlay did not come up");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        while self.rx.try_recv().is_ok() {}
        Ok(())
    }

    /// Sends `len`-byte frames every `every` for `secs`, and collects arrivals until `grace`
    /// after the last. Returns (sent, arrivals as (seq, sent µs, delay µs)).
    async fn stream(
        &mut self,
        len: usize,
        every: Duration,
        secs: u64,
        grace: Duration,
        mut at: impl FnMut(Duration),
    ) -> anyhow::Result<(u64, Vec<(u64, u64, u64)>)> {
        let first = self.seq;
        let start = Instant::now();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut got = Vec::new();
        while start.elapsed() < Duration::from_secs(secs) {
            tick.tick().await;
            self.send(len).await?;
            at(start.elapsed());
            while let Ok((seq, sent, now)) = self.rx.try_recv() {
                got.push((seq, sent, now - sent));
            }
        }
        let end = Instant::now() + grace;
        while (got.iter().filter(|g| g.0 >= first).count() as u64) < self.seq - first {
            match tokio::time::timeout_at(end.into(), self.rx.recv()).await {
                Ok(Some((seq, sent, now))) => got.push((seq, sent, now - sent)),
                _ => break,
            }
        }
        got.retain(|g| g.0 >= first);
        Ok((self.seq - first, got))
    }
}

struct DelaySummary {
    sent: u64,
    delivered: usize,
    mean_ms: f64,
    jitter_ms: f64,
    over_60_pct: f64,
    over_100_pct: f64,
    max_ms: f64,
    /// The fastest message: the path's delay without losses, on this host.
    min_ms: f64,
    /// Shares over the fastest + 10 ms and + 50 ms: the report's 60 and 100 ms on its 50 ms
    /// path, with this host's per-hop overhead taken out.
    over_min10_pct: f64,
    over_min50_pct: f64,
}

impl DelaySummary {
    /// The figures in the order of the table and the CSV, with their decimals.
    fn columns(&self) -> [(f64, usize); 10] {
        [
            (self.sent as f64, 0),
            (self.delivered as f64, 0),
            (self.mean_ms, 1),
            (self.jitter_ms, 2),
            (self.over_60_pct, 1),
            (self.over_100_pct, 1),
            (self.max_ms, 0),
            (self.min_ms, 1),
            (self.over_min10_pct, 1),
            (self.over_min50_pct, 1),
        ]
    }
}

fn summarise(sent: u64, mut got: Vec<(u64, u64, u64)>) -> DelaySummary {
    got.sort_by_key(|g| g.0);
    let d: Vec<f64> = got.iter().map(|g| g.2 as f64 / 1_000.0).collect();
    let n = d.len().max(1) as f64;
    let min_ms = d.iter().copied().fold(f64::INFINITY, f64::min);
    let min_ms = if min_ms.is_finite() { min_ms } else { 0.0 };
    let jitter = d.windows(2).map(|w| (w[1] - w[0]).abs()).sum::<f64>() / (n - 1.0).max(1.0);
    DelaySummary {
        sent,
        delivered: d.len(),
        mean_ms: d.iter().sum::<f64>() / n,
        jitter_ms: jitter,
        over_60_pct: 100.0 * d.iter().filter(|&&x| x > 60.0).count() as f64 / n,
        over_100_pct: 100.0 * d.iter().filter(|&&x| x > 100.0).count() as f64 / n,
        max_ms: d.iter().copied().fold(0.0, f64::max),
        min_ms,
        over_min10_pct: 100.0 * d.iter().filter(|&&x| x > min_ms + 10.0).count() as f64 / n,
        over_min50_pct: 100.0 * d.iter().filter(|&&x| x > min_ms + 50.0).count() as f64 / n,
    }
}

async fn chain(args: &OverlayArgs) -> anyhow::Result<()> {
    println!("== chain A-B-C-D-E-F, five 10 ms links, loss on C-D, 1,000-byte messages ==");
    let names = [
        "sent",
        "delivered",
        "mean_ms",
        "jitter_ms",
        ">60ms%",
        ">100ms%",
        "max_ms",
        "min_ms",
        ">min+10%",
        ">min+50%",
    ];
    let head: String = names.iter().map(|n| format!("  {n:>9}")).collect();
    println!("recovery    loss  kbit/s{head}");
    let mut csv = String::from(
        "recovery,loss,kbit_per_s,sent,delivered,mean_ms,jitter_ms,over_60ms_pct,over_100ms_pct,max_ms,min_ms,over_min_plus_10ms_pct,over_min_plus_50ms_pct\n",
    );
    for loss in [0.01, 0.05] {
        for kbps in [500u64, 1_000] {
            for recovery in ["hop_by_hop", "end_to_end"] {
                let dir = tempfile::tempdir()?;
                let links: Vec<(u16, u16, Emulation)> = (0..5u16)
                    .map(|i| {
                        let e = Emulation {
                            delay_ms: 10,
                            jitter_ms: 0,
                            loss: if i == 2 { loss } else { 0.0 },
                            bandwidth_kbps: 100_000,
                        };
                        (i, i + 1, e)
                    })
                    .collect();
                let sink_addr = free_tcp()?;
                let tunnel = free_tcp()?;
                let file = overlay_file(
                    dir.path(),
                    6,
                    recovery,
                    &links,
                    &[(5, sink_addr)],
                    &[(0, 5, tunnel)],
                    &[],
                )?;
                let sink = TcpListener::bind(sink_addr).await?;
                let daemons = spawn_all(&file).await?;
                let mut p = Probe::open(tunnel, sink).await?;
                p.warm_up().await?;
                // 1,000 bytes every 16 ms is 500 kbit/s, every 8 ms 1 Mbit/s.
                let every = Duration::from_micros(8_000_000 / kbps);
                let (sent, got) = p
                    .stream(
                        1_000,
                        every,
                        args.chain_secs,
                        Duration::from_secs(10),
                        |_| {},
                    )
                    .await?;
                stop_all(daemons).await;
                let s = summarise(sent, got);
                let cols = s.columns();
                let table: String = cols.iter().map(|(v, p)| format!("  {v:>9.p$}")).collect();
                println!("{recovery:<10} {:>4.0}%  {kbps:>6}{table}", loss * 100.0);
                let row: String = cols.iter().map(|(v, p)| format!(",{v:.p$}")).collect();
                let _ = writeln!(csv, "{recovery},{loss},{kbps}{row}");
            }
        }
    }
    let path = args.csv_dir.join("overlay-chain.csv");
    std::fs::write(&path, csv)?;
    println!("wrote {}", path.display());
    Ok(())
}

async fn byzantine(args: &OverlayArgs) -> anyhow::Result<()> {
    println!("== Byzantine relay: 0-1-3 (10 ms links) and 0-2-3 (14 ms links); node 1 starts");
    println!("   dropping 30% of what it forwards; 1,000-byte messages at 1 Mbit/s from 0 to 3 ==");
    let dir = tempfile::tempdir()?;
    let e = |delay_ms| Emulation {
        delay_ms,
        bandwidth_kbps: 10_000,
        ..Emulation::default()
    };
    // The path through 1 is the cheaper by 40%, beyond the route hysteresis (25%), so the
    // stream always starts on it whatever order the links came up in; one accusation (a
    // doubled weight) is enough to prefer the other, and each time the weight falls back the
    // source tries node 1 again (ODSBR's rehabilitation) until its bans grow long.
    let links = [(0, 1, e(10)), (1, 3, e(10)), (0, 2, e(14)), (2, 3, e(14))];
    let sink_addr = free_tcp()?;
    let tunnel = free_tcp()?;
    let file = overlay_file(
        dir.path(),
        4,
        "hop_by_hop",
        &links,
        &[(3, sink_addr)],
        &[(0, 3, tunnel)],
        &[],
    )?;
    let sink = TcpListener::bind(sink_addr).await?;
    let mut daemons = spawn_all(&file).await?;
    let mut p = Probe::open(tunnel, sink).await?;
    p.warm_up().await?;
    let fault_at = Duration::from_secs(args.byzantine_secs / 3);
    let relay = daemons[1].control.clone();
    let mut armed = false;
    // Seen from the stream's start: the first accusation by the source, and its route.
    let mut accused: Option<(Duration, String)> = None;
    let mut route_after = None;
    let mut route_at_fault = None;
    let mut rerouted: Option<Duration> = None;
    let (mut accusations, mut route_changes) = (0u32, 0u32);
    let events = &mut daemons[0].events;
    let (sent, got) = p
        .stream(
            1_000,
            Duration::from_millis(8),
            args.byzantine_secs,
            Duration::from_secs(5),
            |t| {
                if !armed && t >= fault_at {
                    armed = true;
                    route_at_fault = route_after.clone();
                    let _ = relay.try_send(Control::SetFaulty(0.3));
                }
                while let Ok((_, ev)) = events.try_recv() {
                    match ev {
                        Event::Accused { link, .. } if armed => {
                            accusations += 1;
                            if accused.is_none() {
                                accused = Some((t, format!("{link:?}")));
                            }
                        }
                        Event::RouteChanged {
                            dst: NodeId(3),
                            route,
                        } => {
                            if armed && rerouted.is_none() && !route.contains(&NodeId(1)) {
                                rerouted = Some(t);
                            }
                            route_changes += u32::from(armed);
                            route_after = Some(route);
                        }
                        _ => {}
                    }
                }
            },
        )
        .await?;
    stop_all(daemons).await;
    // Arrival times on the probe's clock; the stream started with the first frame sent.
    let stream_start_us = got.iter().map(|g| g.1).min().unwrap_or(0);
    let fault_us = stream_start_us + fault_at.as_micros() as u64;
    let mut got_sorted = got;
    got_sorted.sort_by_key(|x| x.1);
    println!("sent {sent}, delivered {}", got_sorted.len());
    let mut csv = String::from("second_since_start,delivered_kbit_per_s,mean_delay_ms\n");
    let secs = args.byzantine_secs;
    let mut steady_from = 0;
    for s in 0..secs {
        let lo = stream_start_us + s * 1_000_000;
        let hi = lo + 1_000_000;
        let bin: Vec<&(u64, u64, u64)> = got_sorted
            .iter()
            .filter(|g| g.1 + g.2 >= lo && g.1 + g.2 < hi)
            .collect();
        let kbps = bin.len() as f64 * 8.0;
        let mean = bin.iter().map(|g| g.2 as f64 / 1e3).sum::<f64>() / bin.len().max(1) as f64;
        let _ = writeln!(csv, "{s},{kbps:.0},{mean:.2}");
        // Steady: the full rate at under 100 ms, every second from here on.
        if kbps < 900.0 || mean >= 100.0 {
            steady_from = s + 1;
        }
    }
    let phase = |lo: u64, hi: u64| {
        let bin: Vec<&(u64, u64, u64)> = got_sorted
            .iter()
            .filter(|g| g.1 + g.2 >= lo && g.1 + g.2 < hi)
            .collect();
        let secs = (hi.saturating_sub(lo)) as f64 / 1e6;
        (
            bin.len() as f64 * 8.0 / secs.max(1e-3),
            bin.iter().map(|g| g.2 as f64 / 1e3).sum::<f64>() / bin.len().max(1) as f64,
            100.0 * bin.iter().filter(|g| g.2 > 100_000).count() as f64 / bin.len().max(1) as f64,
        )
    };
    let end_us = stream_start_us + secs * 1_000_000;
    match &accused {
        Some((at, link)) => {
            let accused_us = stream_start_us + at.as_micros() as u64;
            let localise_ms = accused_us.saturating_sub(fault_us) as f64 / 1e3;
            let before = phase(stream_start_us, fault_us);
            let during = phase(fault_us, accused_us.max(fault_us + 1));
            let after = phase(accused_us, end_us);
            println!("accused link {link} {localise_ms:.0} ms after the relay turned faulty");
            if let Some(r) = rerouted {
                let ms = r.saturating_sub(fault_at).as_millis();
                println!("route to 3 avoided node 1 {ms} ms after the relay turned faulty");
                let _ = writeln!(csv, "# rerouted_ms={ms}");
            }
            println!(
                "route to 3 when the fault began: {route_at_fault:?}, at the end: {route_after:?}"
            );
            println!(
                "after the fault: {accusations} accusations by node 0, {route_changes} route changes"
            );
            let _ = writeln!(
                csv,
                "# accusations={accusations} route_changes={route_changes}"
            );
            let fault_s = fault_at.as_secs();
            if steady_from < secs {
                let after_fault = steady_from.saturating_sub(fault_s);
                println!(
                    "steady again (1 Mbit/s, mean delay under 100 ms, every second to the end) \
                     {after_fault} s after the relay turned faulty"
                );
                let _ = writeln!(csv, "# steady_after_fault_s={after_fault}");
            } else {
                println!("not steady again by the end of the stream");
            }
            println!("phase     kbit/s  mean_delay_ms  >100ms%");
            for (name, (k, d, o)) in [("before", before), ("during", during), ("after", after)] {
                println!("{name:<8} {k:>7.0}  {d:>13.1}  {o:>7.1}");
            }
            let _ = writeln!(
                csv,
                "# localise_ms={localise_ms:.0} link={link} before_kbps={:.0} during_kbps={:.0} after_kbps={:.0} before_ms={:.1} during_ms={:.1} after_ms={:.1}",
                before.0, during.0, after.0, before.1, during.1, after.1
            );
        }
        None => println!("no accusation within {secs} s"),
    }
    let path = args.csv_dir.join("overlay-byzantine.csv");
    std::fs::write(&path, csv)?;
    println!("wrote {}", path.display());
    Ok(())
}

async fn cluster(args: &OverlayArgs) -> anyhow::Result<()> {
    println!("== 4 replicas over the overlay: links 0-1, 1-2, 2-3 of 20 ms, 3-0, 0-2, 1-3 of");
    println!(
        "   50 ms; {} kv clients beside replica 0, through its daemon; {} s per run ==",
        args.clients, args.cluster_secs
    );
    println!("run             ops/s  p50_ms  p99_ms");
    let mut csv = String::from("run,ops_per_s,p50_ms,p99_ms\n");
    for (name, faulty) in [
        ("direct", None),
        ("overlay", Some(0.0)),
        ("overlay+faulty", Some(0.3)),
    ] {
        let (ops, p50, p99) = cluster_run(args, faulty).await?;
        println!("{name:<14} {ops:>6.0}  {p50:>6.1}  {p99:>6.1}");
        let _ = writeln!(csv, "{name},{ops:.1},{p50:.2},{p99:.2}");
    }
    let path = args.csv_dir.join("overlay-cluster.csv");
    std::fs::write(&path, csv)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// One cluster run: `None` talks directly, `Some(f)` over the overlay with node 1 dropping
/// `f` of what it forwards. Returns (ops/s, p50 ms, p99 ms).
async fn cluster_run(args: &OverlayArgs, faulty: Option<f64>) -> anyhow::Result<(f64, f64, f64)> {
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let (config_path, mut cfg) = kv_cluster("bench-overlay", args.clients, dir.path(), true)?;
    let mut daemons = Vec::new();
    if let Some(f) = faulty {
        let e = |delay_ms| Emulation {
            delay_ms,
            bandwidth_kbps: 100_000,
            ..Emulation::default()
        };
        let links = [
            (0, 1, e(20)),
            (1, 2, e(20)),
            (2, 3, e(20)),
            (3, 0, e(50)),
            (0, 2, e(50)),
            (1, 3, e(50)),
        ];
        let mut tunnels = Vec::new();
        for i in 0..4u16 {
            for j in (0..4u16).filter(|&j| j != i) {
                tunnels.push((i, j, free_tcp()?));
            }
        }
        // The clients sit beside replica 0: one more port of its daemon towards each other
        // replica, shared by all of them (replica 0 itself they reach directly).
        let replica_tunnels = tunnels.len();
        for j in 1..4u16 {
            tunnels.push((0, j, free_tcp()?));
        }
        let replicas: Vec<(u16, SocketAddr)> =
            cfg.replicas.iter().map(|r| (r.id as u16, r.addr)).collect();
        let faulty_nodes: Vec<(u16, f64)> = if f > 0.0 { vec![(1, f)] } else { vec![] };
        let mut file = overlay_file(
            dir.path(),
            4,
            "hop_by_hop",
            &links,
            &replicas,
            &tunnels,
            &faulty_nodes,
        )?;
        file.overlay.tunnel_conns_max = file.overlay.tunnel_conns_max.max(args.clients as usize);
        cfg.overlay_tunnels = tunnels[..replica_tunnels]
            .iter()
            .map(|&(i, j, addr)| OverlayTunnel {
                replica: Some(i.into()),
                client: None,
                peer: j.into(),
                addr,
            })
            .collect();
        for c in 1..=u64::from(args.clients) {
            for &(_, j, addr) in &tunnels[replica_tunnels..] {
                cfg.overlay_tunnels.push(OverlayTunnel {
                    replica: None,
                    client: Some(c),
                    peer: j.into(),
                    addr,
                });
            }
        }
        std::fs::write(&config_path, cfg.to_toml()?)?;
        cfg = ClusterConfig::load(&config_path)?;
        daemons = spawn_all(&file).await?;
    }
    let mut procs = ReplicaProcs::new(exe, config_path.clone(), dir.path().to_path_buf(), 4);
    for i in 0..4 {
        procs.start_monitor(i, &["--manual".to_string()])?;
    }
    let result = async {
        wait_until_up(&cfg, &mut procs).await?;
        let mut kvs = Vec::new();
        for c in 1..=u64::from(args.clients) {
            kvs.push(KvClient::connect(redoubt_client::ClientSetup::from_cluster(&cfg, c)?).await?);
        }
        let stop = Instant::now() + Duration::from_secs(args.cluster_secs);
        let lat = Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
        let mut tasks = tokio::task::JoinSet::new();
        for (c, kv) in kvs.into_iter().enumerate() {
            let lat = lat.clone();
            tasks.spawn(async move {
                let mut n = 0u64;
                while Instant::now() < stop {
                    let t = Instant::now();
                    let key = format!("c{c}-k{}", n % 64).into_bytes();
                    if n.is_multiple_of(2) {
                        kv.put(key, format!("v{n}").into_bytes()).await?;
                    } else {
                        kv.get(key).await?;
                    }
                    n += 1;
                    if let Ok(mut l) = lat.lock() {
                        l.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                anyhow::Ok(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        let mut l = lat.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
        l.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                .copied()
                .unwrap_or(f64::NAN)
        };
        anyhow::Ok((
            l.len() as f64 / args.cluster_secs as f64,
            pct(0.5),
            pct(0.99),
        ))
    }
    .await;
    procs.stop_all(Duration::from_secs(10));
    stop_all(daemons).await;
    result
}
