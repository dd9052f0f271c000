//! `redoubt bench micro`: the papers' micro-benchmark, redoubt (n = 4) against an unreplicated
//! baseline (the same service, transport and client code, one server, no agreement), in one
//! run on one machine.
//!
//! Operations a/b (argument/result KiB): 0/0 is a get of an absent key, 0/4 a get of a 4 KiB
//! value, 4/0 a blind write of 4 KiB. Gets run ordered and on the read-only path. For each:
//! latency with one client (p50, p99), then throughput and median latency as the number of
//! closed-loop clients grows.

use crate::cmd_status::{agreement, fetch_all};
use crate::cpucap::{CpuCaps, PERIOD_US};
use crate::procs::{log_tail, ReplicaProcs};
use anyhow::Context as _;
use clap::Args;
use redoubt_client::{Client, Connections};
use redoubt_config::ClusterConfig;
use redoubt_node::init::free_base_port;
use redoubt_node::init::{init_cluster, InitOptions};
use redoubt_services::kv::{KvOp, KvResult};
use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct MicroArgs {
    /// A smoke run under two minutes: fewer operations, three client counts, 1 s each
    #[arg(long)]
    quick: bool,
    /// Client counts of the throughput curve [default: 1,2,5,10,20,50,100,200; quick: 1,10,50]
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    clients: Vec<u32>,
    /// Operations timed with one client, per operation [default: 3000; quick: 400]
    #[arg(long, value_name = "N")]
    latency_ops: Option<u32>,
    /// Seconds per point of the throughput curve [default: 3; quick: 1]
    #[arg(long, value_name = "SECS")]
    seconds: Option<f64>,
    /// Sync the replicas' journals (the baseline keeps no journal either way)
    #[arg(long)]
    fsync: bool,
    /// Override a setting of the benchmarked cluster, e.g. `--set protocol.tentative_execution=false`
    /// (repeatable; see docs/configuration.md)
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// Give every benchmark client its own connections to the servers instead of sharing one
    /// connection per server among all of them (both systems alike)
    #[arg(long)]
    own_connections: bool,
    /// Cap every server process (the baseline's server and each replica alike) at this many CPU
    /// cores, each in a control group of its own, as if each ran on a machine of its own; the
    /// clients stay uncapped. Needs root and the cgroup cpu controller (e.g. 0.25)
    #[arg(long, value_name = "CORES")]
    server_cpu: Option<f64>,
    /// Runtime threads of the baseline server [default: the replicas' [node] worker_threads]
    #[arg(long, value_name = "N")]
    baseline_threads: Option<usize>,
    /// Run only redoubt (for profiling); no ratios are printed
    #[arg(long)]
    redoubt_only: bool,
    /// Directory for micro.csv and the plots
    #[arg(long, value_name = "DIR", default_value = "bench-micro")]
    out: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum System {
    Baseline,
    Redoubt,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Baseline => "baseline",
            System::Redoubt => "redoubt",
        }
    }
}

/// One benchmarked operation.
#[derive(Clone, Copy)]
struct Op {
    name: &'static str,
    read_only: bool,
}

const OPS: [Op; 4] = [
    Op {
        name: "0/0",
        read_only: false,
    },
    Op {
        name: "0/0",
        read_only: true,
    },
    Op {
        name: "0/4",
        read_only: false,
    },
    Op {
        name: "4/0",
        read_only: false,
    },
];

impl Op {
    fn mode(&self) -> &'static str {
        if self.read_only {
            "read-only"
        } else {
            "ordered"
        }
    }

    fn label(&self) -> String {
        format!("{} {}", self.name, self.mode())
    }

    fn bytes(&self, client: u64) -> Vec<u8> {
        match self.name {
            "0/0" => KvOp::Get {
                key: b"absent".to_vec(),
            },
            "0/4" => KvOp::Get {
                key: b"big".to_vec(),
            },
            _ => KvOp::Set {
                key: format!("w{client}").into_bytes(),
                value: vec![7; 4096],
            },
        }
        .encode()
    }
}

struct Point {
    system: System,
    op: Op,
    clients: u32,
    ops_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU time per operation (µs) of the server processes (all replicas together) and of
    /// the benchmark's clients; 0 for latency points.
    server_cpu_us: f64,
    /// The busiest server process's CPU per operation (µs): for redoubt, usually the primary.
    busiest_cpu_us: f64,
    client_cpu_us: f64,
}

/// The point of highest throughput of `system` for `op` over the client counts.
fn peak<'a>(points: &'a [Point], system: System, op: &Op) -> Option<&'a Point> {
    points
        .iter()
        .filter(|p| p.system == system && p.op.label() == op.label() && p.clients > 0)
        .max_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s))
}

/// CPU time (user + system) a process used so far, in seconds, from `/proc/PID/stat`
/// (`None` where there is no such file).
fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / if hz > 0 { hz as f64 } else { 100.0 })
}

struct Progress {
    tty: bool,
    total: usize,
    done: usize,
    started: Instant,
}

impl Progress {
    fn step(&mut self, what: &str) {
        self.done += 1;
        let width = 30;
        let filled = width * self.done / self.total.max(1);
        let line = format!(
            "[{}{}] {}/{} {:.0}s  {what}",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.done,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        if self.tty {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
        let _ = std::io::stderr().flush();
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

pub fn run(args: MicroArgs) -> anyhow::Result<ExitCode> {
    crate::runtime(2)?.block_on(micro(args))
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn micro(args: MicroArgs) -> anyhow::Result<ExitCode> {
    let clients: Vec<u32> = if !args.clients.is_empty() {
        args.clients.clone()
    } else if args.quick {
        vec![1, 10, 50]
    } else {
        vec![1, 2, 5, 10, 20, 50, 100, 200]
    };
    anyhow::ensure!(
        clients.iter().all(|c| (1..=1000).contains(c)),
        "--clients: each count must be between 1 and 1000"
    );
    let latency_ops = args
        .latency_ops
        .unwrap_or(if args.quick { 400 } else { 3000 });
    let seconds = args.seconds.unwrap_or(if args.quick { 1.0 } else { 3.0 });
    anyhow::ensure!(
        seconds.is_finite() && seconds > 0.0,
        "--seconds must be positive"
    );
    let max_clients = *clients.iter().max().expect("non-empty");
    // Checked before anything starts: a machine without the controller fails at once.
    let server_cpu = match args.server_cpu {
        Some(cores) => Some(CpuCaps::new(cores)?.cores()),
        None => None,
    };
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let tmp = tempfile::Builder::new()
        .prefix("redoubt-micro-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let dir = tmp.path().to_path_buf();
    let base = free_base_port(4)?;
    let config_path = init_cluster(&InitOptions {
        replicas: 4,
        executors: 0,
        firewall: None,
        clients: max_clients + 1,
        out: dir.clone(),
        base_port: base,
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        name: "bench-micro".into(),
        // The baseline server has no key holder: both sides run on static keys (key refresh
        // costs one NEW-KEY per node every key_refresh_ms, nothing per request).
        static_keys: true,
        executable_blake3: None,
    })?;
    let mut cfg = ClusterConfig::load(&config_path)?;
    cfg.storage.fsync = args.fsync;
    cfg.node.client_connections_max = cfg
        .node
        .client_connections_max
        .max(max_clients as usize * 2 + 64);
    let text = redoubt_config::override_toml(&cfg.to_toml()?, &args.sets)
        .map_err(|e| anyhow::anyhow!("--set: {e}"))?;
    std::fs::write(&config_path, text)?;
    let cfg = ClusterConfig::load(&config_path)?;
    for s in &args.sets {
        println!("  setting {s}");
    }
    println!(
        "redoubt bench micro: redoubt (n = 4, f = 1, journal fsync {}) against an unreplicated baseline, on {} cores; {}",
        if args.fsync { "on" } else { "off" },
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        if args.own_connections {
            "each benchmark client on its own connections"
        } else {
            "the benchmark clients share one connection per server"
        }
    );
    if let Some(cores) = server_cpu {
        println!(
            "  every server process (the baseline's server, each replica) capped at {cores} cores in a control group of its own; the clients uncapped"
        );
    }
    println!(
        "  operations a/b (argument/result KiB): 0/0 get of an absent key, 0/4 get of a 4 KiB value, 4/0 blind write of 4 KiB"
    );
    println!(
        "  latency: {latency_ops} operations from one client after a warm-up; throughput: closed-loop clients {clients:?}, {seconds} s each"
    );

    let mut progress = Progress {
        tty: std::io::stderr().is_terminal(),
        total: if args.redoubt_only { 1 } else { 2 } * OPS.len() * (1 + clients.len()),
        done: 0,
        started: Instant::now(),
    };
    let mut points = Vec::new();
    let systems: &[System] = if args.redoubt_only {
        &[System::Redoubt]
    } else {
        &[System::Baseline, System::Redoubt]
    };
    let mut throttled = Vec::new();
    for &system in systems {
        let mut procs = ReplicaProcs::new(exe.clone(), config_path.clone(), dir.clone(), 4);
        let mut caps = server_cpu.map(CpuCaps::new).transpose()?;
        let result = run_system(
            system,
            &cfg,
            &mut procs,
            caps.as_mut(),
            args.baseline_threads,
            &exe,
            &config_path,
            &clients,
            latency_ops,
            seconds,
            args.own_connections,
            &mut progress,
        )
        .await;
        procs.stop_all(Duration::from_secs(5));
        if let Some(caps) = &caps {
            throttled.push((system, caps.throttled_periods()));
        }
        drop(caps);
        points.extend(result?);
    }
    progress.finish();
    if args.redoubt_only {
        for p in &points {
            println!(
                "{} {} clients: {:.0} ops/s, p50 {:.3} ms, p99 {:.3} ms; CPU per op: replicas {:.1} µs, busiest {:.1} µs, clients {:.1} µs",
                p.op.label(),
                p.clients,
                p.ops_per_s,
                p.p50_ms,
                p.p99_ms,
                p.server_cpu_us,
                p.busiest_cpu_us,
                p.client_cpu_us
            );
        }
        return Ok(ExitCode::SUCCESS);
    }

    // Tables, after what was measured: the build and the settings that differ from the
    // defaults, so that a committed report names them.
    let mut report = format!(
        "Run in a checkout at commit {} with `redoubt bench micro{}`.\n",
        source_commit(),
        std::env::args()
            .skip(3)
            .map(|a| format!(" {a}"))
            .collect::<String>()
    );
    if let Some(cores) = server_cpu {
        let _ = writeln!(
            report,
            "\nEvery server process capped at {cores} cores (CFS quota, {} ms periods); periods in which the servers used up their quota: {}.",
            PERIOD_US / 1000,
            throttled
                .iter()
                .map(|(s, n)| format!("{} {n}", s.name()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        report,
        "\nLatency with one client (ms):\n\n| operation | baseline p50 | baseline p99 | redoubt p50 | redoubt p99 | p50 ratio |\n|---|---:|---:|---:|---:|---:|"
    );
    for op in OPS {
        let find = |s: System| {
            points
                .iter()
                .find(|p| p.system == s && p.op.label() == op.label() && p.clients == 0)
        };
        if let (Some(b), Some(r)) = (find(System::Baseline), find(System::Redoubt)) {
            let _ = writeln!(
                report,
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2}x |",
                op.label(),
                b.p50_ms,
                b.p99_ms,
                r.p50_ms,
                r.p99_ms,
                r.p50_ms / b.p50_ms
            );
        }
    }
    let _ = writeln!(
        report,
        "\nPeak throughput over the client counts (operations/s):\n\n| operation | baseline | at clients | redoubt | at clients | ratio |\n|---|---:|---:|---:|---:|---:|"
    );
    for op in OPS {
        if let (Some(b), Some(r)) = (
            peak(&points, System::Baseline, &op),
            peak(&points, System::Redoubt, &op),
        ) {
            let _ = writeln!(
                report,
                "| {} | {:.0} | {} | {:.0} | {} | {:.0}% |",
                op.label(),
                b.ops_per_s,
                b.clients,
                r.ops_per_s,
                r.clients,
                100.0 * r.ops_per_s / b.ops_per_s
            );
        }
    }
    let _ = writeln!(
        report,
        "\nThroughput (operations/s) and median latency (ms) by clients:\n\n| operation | clients | baseline ops/s | baseline p50 | redoubt ops/s | redoubt p50 |\n|---|---:|---:|---:|---:|---:|"
    );
    for op in OPS {
        for c in &clients {
            let find = |s: System| {
                points
                    .iter()
                    .find(|p| p.system == s && p.op.label() == op.label() && p.clients == *c)
            };
            if let (Some(b), Some(r)) = (find(System::Baseline), find(System::Redoubt)) {
                let _ = writeln!(
                    report,
                    "| {} | {c} | {:.0} | {:.2} | {:.0} | {:.2} |",
                    op.label(),
                    b.ops_per_s,
                    b.p50_ms,
                    r.ops_per_s,
                    r.p50_ms
                );
            }
        }
    }
    let _ = writeln!(
        report,
        "\nCPU time per operation (µs) at each system's peak: the servers (redoubt: the four replicas together, on average, and the busiest one, usually the primary, with the cores it used) and the benchmark's clients, which share the same cores:\n\n| operation | baseline server | baseline clients | redoubt replicas | redoubt per replica | redoubt busiest replica | its cores | redoubt clients | total ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for op in OPS {
        if let (Some(b), Some(r)) = (
            peak(&points, System::Baseline, &op),
            peak(&points, System::Redoubt, &op),
        ) {
            let base = b.server_cpu_us + b.client_cpu_us;
            // No CPU accounting without /proc: say so rather than print a ratio of zeros.
            let ratio = if base > 0.0 {
                format!("{:.2}x", (r.server_cpu_us + r.client_cpu_us) / base)
            } else {
                "n/a".to_string()
            };
            let _ = writeln!(
                report,
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {ratio} |",
                op.label(),
                b.server_cpu_us,
                b.client_cpu_us,
                r.server_cpu_us,
                r.server_cpu_us / 4.0,
                r.busiest_cpu_us,
                r.busiest_cpu_us * r.ops_per_s / 1e6,
                r.client_cpu_us,
            );
        }
    }
    print!("{report}");

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv = args.out.join("micro.csv");
    let mut text = String::from(
        "system,operation,mode,clients,ops_per_s,p50_ms,p99_ms,server_cpu_us_per_op,client_cpu_us_per_op,busiest_server_cpu_us_per_op\n",
    );
    for p in &points {
        let _ = writeln!(
            text,
            "{},{},{},{},{:.1},{:.4},{:.4},{:.2},{:.2},{:.2}",
            p.system.name(),
            p.op.name,
            p.op.mode(),
            p.clients,
            p.ops_per_s,
            p.p50_ms,
            p.p99_ms,
            p.server_cpu_us,
            p.client_cpu_us,
            p.busiest_cpu_us
        );
    }
    std::fs::write(&csv, text)?;
    std::fs::write(args.out.join("micro.md"), &report)?;
    let mut plots = Vec::new();
    for op in OPS {
        let path = args.out.join(format!(
            "micro-{}-{}.svg",
            op.name.replace('/', "-"),
            op.mode()
        ));
        plot(&path, &op, &points)?;
        plots.push(path);
    }
    println!(
        "\nwrote {}, {} and {} plots ({})",
        csv.display(),
        args.out.join("micro.md").display(),
        plots.len(),
        plots
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    drop(tmp);
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::too_many_arguments)]
async fn run_system(
    system: System,
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
    mut caps: Option<&mut CpuCaps>,
    baseline_threads: Option<usize>,
    exe: &Path,
    config_path: &Path,
    clients: &[u32],
    latency_ops: u32,
    seconds: f64,
    own_connections: bool,
    progress: &mut Progress,
) -> anyhow::Result<Vec<Point>> {
    let max_clients = *clients.iter().max().expect("non-empty");
    let mut baseline_child = None;
    match system {
        System::Redoubt => {
            for i in 0..4 {
                procs.start(i)?;
                if let (Some(caps), Some(pid)) = (caps.as_deref_mut(), procs.pid(i)) {
                    caps.cap(&format!("replica-{i}"), pid)?;
                }
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let probes = fetch_all(cfg, Duration::from_millis(500)).await;
                if agreement(&probes).is_some_and(|a| a.replicas == 4) {
                    break;
                }
                for i in 0..4u32 {
                    if let Some(status) = procs.exited(i) {
                        anyhow::bail!(
                            "replica {i} exited ({status}):\n{}",
                            log_tail(&procs.log_path(i), 12)
                        );
                    }
                }
                anyhow::ensure!(Instant::now() < deadline, "the replicas did not come up");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        System::Baseline => {
            let log = std::fs::File::create(config_path.with_file_name("baseline.log"))?;
            let child = std::process::Command::new(exe)
                .arg("baseline")
                .arg("--config")
                .arg(config_path)
                .args(
                    baseline_threads
                        .map(|n| vec!["--worker-threads".to_string(), n.to_string()])
                        .unwrap_or_default(),
                )
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("cannot start the baseline server")?;
            let child = KillOnDrop(child);
            if let Some(caps) = caps {
                caps.cap("baseline", child.0.id())?;
            }
            baseline_child = Some(child);
        }
    }
    let setup = |c: u64| -> anyhow::Result<redoubt_client::ClientSetup> {
        let mut s = redoubt_client::ClientSetup::from_cluster(cfg, c)?;
        s.deadline = Duration::from_secs(30);
        if system == System::Baseline {
            s.core.f = 0;
            s.replicas.truncate(1);
        }
        Ok(s)
    };
    let shared = (!own_connections).then(|| {
        let s = setup(1).expect("client 1 is configured");
        Connections::open(&s.replicas, max_clients as usize, s.frame_bytes_max)
    });
    let connect = |s: redoubt_client::ClientSetup| {
        let shared = shared.clone();
        async move {
            match &shared {
                Some(conns) => Client::connect_over(s, conns).await,
                None => Client::connect(s).await,
            }
        }
    };
    // Connect (retrying while the baseline starts) and preload the 4 KiB value.
    let first = {
        let deadline = Instant::now() + Duration::from_secs(20);
        let c = connect(setup(1)?).await?;
        loop {
            let op = KvOp::Set {
                key: b"big".to_vec(),
                value: vec![9; 4096],
            };
            match tokio::time::timeout(Duration::from_secs(2), c.invoke(op.encode())).await {
                Ok(Ok(r)) if KvResult::decode(&r).is_ok_and(|r| r == KvResult::Done) => {
                    break c.clone()
                }
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => anyhow::bail!(
                    "{} does not answer: {:?}",
                    system.name(),
                    other.map(|r| r.map(|_| ()))
                ),
            }
        }
    };
    let server_pids: Vec<u32> = match &baseline_child {
        Some(c) => vec![c.0.id()],
        None => (0..4).filter_map(|i| procs.pid(i)).collect(),
    };
    let mut pool: Vec<Client> = vec![first];
    for c in 2..=u64::from(max_clients) {
        pool.push(connect(setup(c)?).await?);
    }
    let mut points = Vec::new();
    for op in OPS {
        // Latency with one client.
        let c = pool[0].clone();
        let mut lat = Vec::with_capacity(latency_ops as usize);
        let bytes = op.bytes(1);
        // Warm-up, not measured: connections, session keys, caches, the first checkpoint.
        for _ in 0..(latency_ops / 10).max(100) {
            call(&c, &op, bytes.clone()).await?;
        }
        for _ in 0..latency_ops {
            let t = Instant::now();
            call(&c, &op, bytes.clone()).await?;
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        lat.sort_by(f64::total_cmp);
        points.push(Point {
            system,
            op,
            clients: 0,
            ops_per_s: lat.len() as f64 / (lat.iter().sum::<f64>() / 1000.0),
            p50_ms: percentile(&lat, 0.5),
            p99_ms: percentile(&lat, 0.99),
            server_cpu_us: 0.0,
            busiest_cpu_us: 0.0,
            client_cpu_us: 0.0,
        });
        progress.step(&format!("{} {} latency", system.name(), op.label()));
        // Throughput.
        for &n in clients {
            let stop = Instant::now() + Duration::from_secs_f64(seconds);
            let mut tasks = tokio::task::JoinSet::new();
            for (i, c) in pool.iter().take(n as usize).enumerate() {
                let c = c.clone();
                let bytes = op.bytes(i as u64 + 1);
                tasks.spawn(async move {
                    let mut lat = Vec::new();
                    while Instant::now() < stop {
                        let t = Instant::now();
                        call(&c, &op, bytes.clone()).await?;
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                    anyhow::Ok(lat)
                });
            }
            let started = Instant::now();
            let each = || -> Vec<f64> {
                server_pids
                    .iter()
                    .map(|p| cpu_seconds(Some(*p)).unwrap_or(0.0))
                    .collect()
            };
            let (server0, client0) = (each(), cpu_seconds(None).unwrap_or(0.0));
            let mut all = Vec::new();
            while let Some(r) = tasks.join_next().await {
                all.extend(r??);
            }
            let took = started.elapsed().as_secs_f64();
            let (server1, client1) = (each(), cpu_seconds(None).unwrap_or(0.0));
            let used: Vec<f64> = server1.iter().zip(&server0).map(|(b, a)| b - a).collect();
            let count = all.len().max(1) as f64;
            let per_op = |d: f64| 1e6 * d / count;
            all.sort_by(f64::total_cmp);
            points.push(Point {
                system,
                op,
                clients: n,
                ops_per_s: all.len() as f64 / took,
                p50_ms: percentile(&all, 0.5),
                p99_ms: percentile(&all, 0.99),
                server_cpu_us: per_op(used.iter().sum()),
                busiest_cpu_us: per_op(used.iter().copied().fold(0.0, f64::max)),
                client_cpu_us: per_op(client1 - client0),
            });
            progress.step(&format!("{} {} {n} clients", system.name(), op.label()));
        }
    }
    drop(baseline_child);
    Ok(points)
}

async fn call(c: &Client, op: &Op, bytes: Vec<u8>) -> anyhow::Result<()> {
    let r = if op.read_only {
        c.invoke_read_only(bytes).await
    } else {
        c.invoke(bytes).await
    };
    let r = r.map_err(|e| anyhow::anyhow!("{} failed: {e}", op.label()))?;
    match KvResult::decode(&r) {
        Ok(KvResult::Error(e)) => anyhow::bail!("{} failed: {e}", op.label()),
        Ok(_) => Ok(()),
        Err(e) => anyhow::bail!("{} returned an undecodable result: {e}", op.label()),
    }
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Throughput (x) against median latency (y), one line per system.
fn plot(path: &Path, op: &Op, points: &[Point]) -> anyhow::Result<()> {
    let (w, h, m) = (640.0, 400.0, 60.0);
    let series: Vec<(System, Vec<&Point>)> = [System::Baseline, System::Redoubt]
        .into_iter()
        .map(|s| {
            let mut v: Vec<&Point> = points
                .iter()
                .filter(|p| p.system == s && p.op.label() == op.label() && p.clients > 0)
                .collect();
            v.sort_by_key(|p| p.clients);
            (s, v)
        })
        .collect();
    let max_x = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.ops_per_s))
        .fold(1.0, f64::max)
        * 1.05;
    let max_y = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.p50_ms))
        .filter(|y| y.is_finite())
        .fold(0.01, f64::max)
        * 1.1;
    let x = |v: f64| m + (w - 2.0 * m) * v / max_x;
    let y = |v: f64| h - m - (h - 2.0 * m) * v / max_y;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{} : throughput vs median latency</text>\n",
        w / 2.0,
        op.label()
    );
    let _ = writeln!(
        svg,
        "<line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>",
        h - m,
        w - m,
        h - m,
        h - m
    );
    for i in 0..=5 {
        let vx = max_x * i as f64 / 5.0;
        let vy = max_y * i as f64 / 5.0;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{:.0}</text><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.2}</text>",
            x(vx),
            h - m + 18.0,
            vx,
            m - 6.0,
            y(vy) + 4.0,
            vy
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">operations/s</text><text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">median latency (ms)</text>",
        w / 2.0,
        h - 16.0,
        h / 2.0,
        h / 2.0
    );
    for (i, (s, v)) in series.iter().enumerate() {
        let color = if *s == System::Baseline {
            "#1f77b4"
        } else {
            "#d62728"
        };
        let pts: Vec<String> = v
            .iter()
            .filter(|p| p.p50_ms.is_finite())
            .map(|p| format!("{:.1},{:.1}", x(p.ops_per_s), y(p.p50_ms)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        for p in v.iter().filter(|p| p.p50_ms.is_finite()) {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"><title>{} clients</title></circle>",
                x(p.ops_per_s),
                y(p.p50_ms),
                p.clients
            );
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            w - m - 110.0,
            m + i as f64 * 18.0,
            w - m - 92.0,
            m + 10.0 + i as f64 * 18.0,
            if *s == System::Baseline { "baseline (1 server)" } else { "redoubt (n = 4)" }
        );
    }
    svg.push_str("</svg>\n");
    std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The commit of the working tree the benchmark runs in (`git describe --always --dirty`), or
/// "unknown" outside a git checkout. It names the checkout, not the build: run the benchmark
/// from the checkout its binary was built from.
fn source_commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
