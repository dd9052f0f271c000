//! `redoubt bench micro`: the papers' micro-benchmark, redoubt (n = 4) against an unreplicated
//! baseline (the same service, transport and client code, one server, no agreement), in one
//! run on one machine.
//!
//! Operations a/b (argument/result KiB): 0/0 is a get of an absent key, 0/4 a get of a 4 KiB
//! value, 4/0 a blind write of 4 KiB. Gets run ordered and on the read-only path. For each:
//! latency with one client (p50, p99), then throughput and median latency as the number of
//! closed-loop clients grows.

use super::flame;
use super::measure::{
    latency, plot, source_commit, throughput, Load, Plan, PlanDefaults, Progress, Sample, Series,
};
use super::versus::{self, System};
use anyhow::Context as _;
use clap::Args;
use redoubt_localcluster::cpucap::{CpuCaps, PERIOD_US};
use redoubt_localcluster::procs::ReplicaProcs;
use redoubt_services::kv::{KvOp, KvResult};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct MicroArgs {
    /// A smoke run under two minutes: fewer operations, three client counts, 1 s each
    #[arg(long)]
    quick: bool,
    /// Client counts of the throughput curve [default: 1,2,5,10,20,50,100,200,500,1000; quick:
    /// 1,10,50]
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
    /// How the benchmark clients connect, both systems alike: `own` (every client its own
    /// connections to each server, as independent applications connect), `shared` (all of
    /// them multiplexed on one connection per server), or `both`, own first
    #[arg(long, value_enum, default_value = "both")]
    connections: Connections,
    /// Only these operations, e.g. `0/0-ordered,0/0-read-only` [default: 0/0-ordered,
    /// 0/0-read-only, 0/4-ordered, 4/0-ordered]
    #[arg(long, value_delimiter = ',', value_name = "OP,OP,...")]
    ops: Vec<String>,
    /// Profile the replicas during one more point at the peak of each operation (own
    /// connections) and draw the busiest replica's flame graph (`flame-*.svg`); needs `perf`,
    /// and a binary built with `--profile profiling` for inlined frames and lines
    #[arg(long)]
    flamegraph: bool,
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
    /// Run redoubt a second time with this replica killed once the cluster is up and never
    /// restarted (a tolerated fault for the whole run; at most f = 1), and report it beside the
    /// healthy cluster, e.g. `--down 3` (a backup) or `--down 0` (the first primary)
    #[arg(long, value_delimiter = ',', value_name = "ID")]
    down: Vec<u32>,
    /// Directory for micro.csv and the plots
    #[arg(long, value_name = "DIR", default_value = "bench-micro")]
    out: PathBuf,
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

/// How the benchmark clients connect to the servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Connections {
    Own,
    Shared,
    Both,
}

impl Connections {
    /// The client models this choice runs, in the order of the report.
    fn models(self) -> &'static [Connections] {
        match self {
            Connections::Own => &[Connections::Own],
            Connections::Shared => &[Connections::Shared],
            Connections::Both => &[Connections::Own, Connections::Shared],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Connections::Own => "own",
            Connections::Shared => "shared",
            Connections::Both => "both",
        }
    }

    fn heading(self) -> &'static str {
        match self {
            Connections::Own => "Every client on its own connections",
            Connections::Shared => "The clients multiplexed on one connection per server",
            Connections::Both => "",
        }
    }
}

#[derive(Clone, Copy)]
struct Point {
    conn: Connections,
    system: System,
    op: Op,
    s: Sample,
}

/// The point of highest throughput of `system` for `op` over the client counts.
fn peak<'a>(points: &'a [Point], system: System, op: &Op) -> Option<&'a Point> {
    points
        .iter()
        .filter(|p| p.system == system && p.op.label() == op.label() && p.s.clients > 0)
        .max_by(|a, b| a.s.ops_per_s.total_cmp(&b.s.ops_per_s))
}

/// The operations `--ops` names (all of them when empty).
fn selected_ops(names: &[String]) -> anyhow::Result<Vec<Op>> {
    if names.is_empty() {
        return Ok(OPS.to_vec());
    }
    names
        .iter()
        .map(|n| {
            OPS.iter()
                .find(|op| op.label().replace(' ', "-") == *n)
                .copied()
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown operation `{n}` in --ops; known: 0/0-ordered, 0/0-read-only, 0/4-ordered, 4/0-ordered"
                    )
                })
        })
        .collect()
}

pub fn run(args: MicroArgs) -> anyhow::Result<ExitCode> {
    redoubt_localcluster::runtime(2)?.block_on(micro(args))
}

/// Raises this process's soft limit on open files to `needed` (within the hard limit), or
/// says why the run cannot go ahead.
fn raise_open_files_limit(needed: u64) -> anyhow::Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        anyhow::bail!(
            "getrlimit(RLIMIT_NOFILE): {}",
            std::io::Error::last_os_error()
        );
    }
    if lim.rlim_cur >= needed {
        return Ok(());
    }
    if lim.rlim_max < needed {
        anyhow::bail!(
            "this many clients need about {needed} open files, but the hard limit is {}: \
             raise it (`ulimit -Hn`, or LimitNOFILE in a unit file) or run fewer clients",
            lim.rlim_max
        );
    }
    lim.rlim_cur = needed;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        anyhow::bail!(
            "setrlimit(RLIMIT_NOFILE, {needed}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

async fn micro(args: MicroArgs) -> anyhow::Result<ExitCode> {
    let Plan {
        clients,
        latency_ops,
        seconds,
    } = Plan::new(
        args.quick,
        &args.clients,
        args.latency_ops,
        args.seconds,
        PlanDefaults {
            full: (&[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], 3000),
            quick: (&[1, 10, 50], 400),
        },
    )?;
    let max_clients = *clients.iter().max().expect("non-empty");
    // Each client with its own connections holds one socket per replica (and the baseline's
    // one), all in this process: 1,000 clients need about 5,000 descriptors.
    raise_open_files_limit(max_clients as u64 * 5 + 256)?;
    let ops = selected_ops(&args.ops)?;
    // Checked before anything starts: a machine without the controller fails at once.
    let server_cpu = match args.server_cpu {
        Some(cores) => Some(CpuCaps::new(cores)?.cores()),
        None => None,
    };
    let cluster = versus::make_cluster(
        "micro",
        "kv",
        max_clients,
        args.fsync,
        &args.sets,
        &args.down,
    )?;
    let models = args.connections.models();
    println!(
        "redoubt bench micro: redoubt (n = 4, f = 1, journal fsync {}) against an unreplicated baseline, on {} cores; clients on {}",
        if args.fsync { "on" } else { "off" },
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        models
            .iter()
            .map(|m| match m {
                Connections::Own => "their own connections",
                _ => "one shared connection per server",
            })
            .collect::<Vec<_>>()
            .join(", then ")
    );
    if !cluster.down.is_empty() {
        println!(
            "  then redoubt again with {} (killed once the cluster is up, never restarted)",
            cluster.down_label()
        );
    }
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

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let systems = cluster.systems(args.redoubt_only);
    let profiles_per_model = if args.flamegraph { ops.len() } else { 0 };
    let mut progress = Progress::new(
        models.len() * (systems.len() * ops.len() * (1 + clients.len()) + profiles_per_model),
    );
    let mut points = Vec::new();
    let mut throttled = Vec::new();
    let mut flames = Vec::new();
    for &conn in models {
        for &system in &systems {
            if system.replicated() {
                cluster.fresh_homes()?;
            }
            let mut procs = cluster.replicas();
            let mut caps = server_cpu.map(CpuCaps::new).transpose()?;
            let plan = SystemPlan {
                system,
                conn,
                ops: &ops,
                clients: &clients,
                latency_ops,
                seconds,
                flamegraph: (args.flamegraph && conn == Connections::Own)
                    .then_some(args.out.as_path()),
            };
            let result = run_system(
                &plan,
                &cluster,
                &mut procs,
                caps.as_mut(),
                args.baseline_threads,
                &mut progress,
            )
            .await;
            procs.stop_all(Duration::from_secs(5));
            if let Some(caps) = &caps {
                throttled.push((conn, system, caps.throttled_periods()));
            }
            drop(caps);
            let (pts, fl) = result?;
            points.extend(pts);
            flames.extend(fl);
        }
    }
    progress.finish();
    if args.redoubt_only {
        for p in &points {
            println!(
                "{} {} {} clients: {:.0} ops/s, p50 {:.3} ms, p99 {:.3} ms; CPU per op: replicas {:.1} µs, busiest {:.1} µs (main thread {:.1} µs), clients {:.1} µs",
                p.conn.name(),
                p.op.label(),
                p.s.clients,
                p.s.ops_per_s,
                p.s.p50_ms,
                p.s.p99_ms,
                p.s.server_cpu_us,
                p.s.busiest_cpu_us,
                p.s.busiest_main_cpu_us,
                p.s.client_cpu_us
            );
        }
        for f in &flames {
            println!("{f}");
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
                .map(|(c, s, n)| format!("{} ({} connections) {n}", s.name(), c.name()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for &conn in models {
        let pts: Vec<Point> = points.iter().filter(|p| p.conn == conn).copied().collect();
        if models.len() > 1 {
            let _ = writeln!(report, "\n## {}", conn.heading());
        }
        tables(&mut report, &pts, &ops, &clients);
        if !cluster.down.is_empty() {
            degraded_tables(&mut report, &pts, &ops, &clients, &cluster.down_label());
        }
    }
    if !flames.is_empty() {
        let _ = writeln!(
            report,
            "\nFlame graphs of the busiest replica at each operation's peak (own connections; one more point, profiled, after the measured ones):\n"
        );
        for f in &flames {
            let _ = writeln!(report, "- {f}");
        }
    }
    print!("{report}");

    let csv = args.out.join("micro.csv");
    let mut text = format!("connections,system,operation,mode,{}\n", Sample::CSV_HEADER);
    for p in &points {
        let _ = writeln!(
            text,
            "{},{},{},{},{}",
            p.conn.name(),
            p.system.name(),
            p.op.name,
            p.op.mode(),
            p.s.csv()
        );
    }
    std::fs::write(&csv, text)?;
    std::fs::write(args.out.join("micro.md"), &report)?;
    let mut plots = Vec::new();
    for &conn in models {
        for op in &ops {
            let path = args.out.join(format!(
                "micro-{}-{}-{}.svg",
                conn.name(),
                op.name.replace('/', "-"),
                op.mode()
            ));
            let series: Vec<Series> = systems
                .iter()
                .copied()
                .map(|system| {
                    let mut pts: Vec<&Point> = points
                        .iter()
                        .filter(|p| {
                            p.conn == conn
                                && p.system == system
                                && p.op.label() == op.label()
                                && p.s.clients > 0
                        })
                        .collect();
                    pts.sort_by_key(|p| p.s.clients);
                    Series {
                        name: system.legend().into(),
                        points: pts
                            .iter()
                            .map(|p| (p.s.ops_per_s, p.s.p50_ms, p.s.clients))
                            .collect(),
                    }
                })
                .collect();
            let title = format!("{}, {} connections", op.label(), conn.name());
            plot(&path, &title, &series)?;
            plots.push(path);
        }
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
    drop(cluster);
    Ok(ExitCode::SUCCESS)
}

/// The tables of one client model: one-client latency, peaks, every point, CPU per operation.
fn tables(report: &mut String, points: &[Point], ops: &[Op], clients: &[u32]) {
    let _ = writeln!(
        report,
        "\nLatency with one client (ms):\n\n| operation | baseline p50 | baseline p99 | redoubt p50 | redoubt p99 | p50 ratio |\n|---|---:|---:|---:|---:|---:|"
    );
    for op in ops {
        let find = |s: System| {
            points
                .iter()
                .find(|p| p.system == s && p.op.label() == op.label() && p.s.clients == 0)
        };
        if let (Some(b), Some(r)) = (find(System::Baseline), find(System::Redoubt)) {
            let _ = writeln!(
                report,
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2}x |",
                op.label(),
                b.s.p50_ms,
                b.s.p99_ms,
                r.s.p50_ms,
                r.s.p99_ms,
                r.s.p50_ms / b.s.p50_ms
            );
        }
    }
    let _ = writeln!(
        report,
        "\nPeak throughput over the client counts (operations/s):\n\n| operation | baseline | at clients | redoubt | at clients | ratio |\n|---|---:|---:|---:|---:|---:|"
    );
    for op in ops {
        if let (Some(b), Some(r)) = (
            peak(points, System::Baseline, op),
            peak(points, System::Redoubt, op),
        ) {
            let _ = writeln!(
                report,
                "| {} | {:.0} | {} | {:.0} | {} | {:.0}% |",
                op.label(),
                b.s.ops_per_s,
                b.s.clients,
                r.s.ops_per_s,
                r.s.clients,
                100.0 * r.s.ops_per_s / b.s.ops_per_s
            );
        }
    }
    let _ = writeln!(
        report,
        "\nThroughput (operations/s) and median latency (ms) by clients:\n\n| operation | clients | baseline ops/s | baseline p50 | redoubt ops/s | redoubt p50 |\n|---|---:|---:|---:|---:|---:|"
    );
    for op in ops {
        for c in clients {
            let find = |s: System| {
                points
                    .iter()
                    .find(|p| p.system == s && p.op.label() == op.label() && p.s.clients == *c)
            };
            if let (Some(b), Some(r)) = (find(System::Baseline), find(System::Redoubt)) {
                let _ = writeln!(
                    report,
                    "| {} | {c} | {:.0} | {:.2} | {:.0} | {:.2} |",
                    op.label(),
                    b.s.ops_per_s,
                    b.s.p50_ms,
                    r.s.ops_per_s,
                    r.s.p50_ms
                );
            }
        }
    }
    let _ = writeln!(
        report,
        "\nCPU time per operation (µs) at each system's peak: the servers (redoubt: the four replicas together, on average, and the busiest one, usually the primary, with the cores it used; the busiest main thread, which runs a replica's protocol loop, and with `[node] worker_threads` above 1 only that) and the benchmark's clients, which share the same cores:\n\n| operation | baseline server | baseline clients | redoubt replicas | redoubt per replica | redoubt busiest replica | its cores | busiest main thread | redoubt clients | total ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for op in ops {
        if let (Some(b), Some(r)) = (
            peak(points, System::Baseline, op),
            peak(points, System::Redoubt, op),
        ) {
            let base = b.s.server_cpu_us + b.s.client_cpu_us;
            // No CPU accounting without /proc: say so rather than print a ratio of zeros.
            let ratio = if base > 0.0 {
                format!("{:.2}x", (r.s.server_cpu_us + r.s.client_cpu_us) / base)
            } else {
                "n/a".to_string()
            };
            let _ = writeln!(
                report,
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {ratio} |",
                op.label(),
                b.s.server_cpu_us,
                b.s.client_cpu_us,
                r.s.server_cpu_us,
                r.s.server_cpu_us / 4.0,
                r.s.busiest_cpu_us,
                r.s.busiest_cpu_us * r.s.ops_per_s / 1e6,
                r.s.busiest_main_cpu_us,
                r.s.client_cpu_us,
            );
        }
    }
}

/// The tables of one client model's degraded run: redoubt with `down` (e.g. "replica 3
/// down") against the healthy cluster of the same run.
fn degraded_tables(report: &mut String, points: &[Point], ops: &[Op], clients: &[u32], down: &str) {
    let _ = writeln!(
        report,
        "\nWith {down} (killed once the cluster was up, never restarted), against the healthy cluster of this run:\n\n| operation | healthy p50 (1 client) | down p50 | healthy p99 | down p99 | healthy peak ops/s | down peak ops/s | down / healthy peak |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for op in ops {
        let latency = |s: System| {
            points
                .iter()
                .find(|p| p.system == s && p.op.label() == op.label() && p.s.clients == 0)
        };
        if let (Some(h), Some(d), Some(hp), Some(dp)) = (
            latency(System::Redoubt),
            latency(System::Degraded),
            peak(points, System::Redoubt, op),
            peak(points, System::Degraded, op),
        ) {
            let _ = writeln!(
                report,
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:.0}% |",
                op.label(),
                h.s.p50_ms,
                d.s.p50_ms,
                h.s.p99_ms,
                d.s.p99_ms,
                hp.s.ops_per_s,
                dp.s.ops_per_s,
                100.0 * dp.s.ops_per_s / hp.s.ops_per_s
            );
        }
    }
    let _ = writeln!(
        report,
        "\nBy clients, healthy and with {down}:\n\n| operation | clients | healthy ops/s | healthy p50 | healthy p99 | down ops/s | down p50 | down p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for op in ops {
        for c in clients {
            let find = |s: System| {
                points
                    .iter()
                    .find(|p| p.system == s && p.op.label() == op.label() && p.s.clients == *c)
            };
            if let (Some(h), Some(d)) = (find(System::Redoubt), find(System::Degraded)) {
                let _ = writeln!(
                    report,
                    "| {} | {c} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} |",
                    op.label(),
                    h.s.ops_per_s,
                    h.s.p50_ms,
                    h.s.p99_ms,
                    d.s.ops_per_s,
                    d.s.p50_ms,
                    d.s.p99_ms
                );
            }
        }
    }
}

/// What one system runs in one client model.
struct SystemPlan<'a> {
    system: System,
    conn: Connections,
    ops: &'a [Op],
    clients: &'a [u32],
    latency_ops: u32,
    seconds: f64,
    /// Where to draw flame graphs of the replicas at each operation's peak (redoubt only).
    flamegraph: Option<&'a Path>,
}

async fn run_system(
    plan: &SystemPlan<'_>,
    cluster: &versus::Cluster,
    procs: &mut ReplicaProcs,
    caps: Option<&mut CpuCaps>,
    baseline_threads: Option<usize>,
    progress: &mut Progress,
) -> anyhow::Result<(Vec<Point>, Vec<String>)> {
    let SystemPlan {
        system,
        conn,
        ops,
        clients,
        latency_ops,
        seconds,
        flamegraph,
    } = *plan;
    let max_clients = *clients.iter().max().expect("non-empty");
    let baseline_child = versus::start(system, cluster, procs, caps, baseline_threads).await?;
    let pool = versus::connect(
        cluster.config_of(system).1,
        system,
        max_clients,
        conn == Connections::Own,
    )
    .await?;
    // Preload the 4 KiB value, retrying while the baseline starts.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let op = KvOp::Set {
            key: b"big".to_vec(),
            value: vec![9; 4096],
        };
        match tokio::time::timeout(Duration::from_secs(2), pool[0].invoke(op.encode())).await {
            Ok(Ok(r)) if KvResult::decode(&r).is_ok_and(|r| r == KvResult::Done) => break,
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
    let server_pids = versus::server_pids(baseline_child.as_ref(), procs);
    let mut points = Vec::new();
    let mut flames = Vec::new();
    for op in ops {
        let op = *op;
        let label = op.label();
        let bytes = |c: u64| op.bytes(c);
        let load = Load {
            label: &label,
            read_only: op.read_only,
            bytes: &bytes,
        };
        let s = latency(&pool[0], &load, latency_ops).await?;
        points.push(Point {
            conn,
            system,
            op,
            s,
        });
        progress.step(&format!("{} {label} latency", system.name()));
        for &n in clients {
            let s = throughput(&pool, n, &load, seconds, &server_pids, None).await?;
            points.push(Point {
                conn,
                system,
                op,
                s,
            });
            progress.step(&format!("{} {label} {n} clients", system.name()));
        }
        let Some(dir) = flamegraph.filter(|_| system == System::Redoubt) else {
            continue;
        };
        let at = points
            .iter()
            .filter(|p| p.op.label() == label && p.s.clients > 0)
            .max_by(|a, b| a.s.ops_per_s.total_cmp(&b.s.ops_per_s))
            .map_or(1, |p| p.s.clients);
        let replicas: Vec<(u32, u32)> = (0..4)
            .filter_map(|i| procs.pid(i).map(|p| (i, p)))
            .collect();
        let stem = format!("flame-{}-{}", op.name.replace('/', "-"), op.mode());
        let data = dir.join(format!("{stem}.perf.data"));
        let drawn = match flame::start(&replicas, seconds, &data) {
            Ok(rec) => {
                throughput(&pool, at, &load, seconds, &server_pids, None).await?;
                rec.finish(&format!("{label} at {at} clients"), |r| {
                    dir.join(format!("{stem}-replica-{r}.svg"))
                })
            }
            Err(e) => Err(e),
        };
        flames.push(match drawn {
            Ok(d) => format!(
                "{label} at {at} clients: replica {} ({} samples): [{}]({})",
                d.replica,
                d.samples,
                d.svg
                    .file_name()
                    .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
                d.svg
                    .file_name()
                    .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
            ),
            Err(e) => format!("{label}: no flame graph: {e:#}"),
        });
        progress.step(&format!("{} {label} profiled", system.name()));
    }
    drop(baseline_child);
    Ok((points, flames))
}

#[cfg(test)]
mod tests {
    use super::raise_open_files_limit;

    #[test]
    fn open_files_limit_is_raised_within_the_hard_limit_or_refused_with_the_reason() {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct passed by pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        raise_open_files_limit(64).expect("below the current limit: nothing to do");
        if lim.rlim_max < u64::MAX {
            let e = raise_open_files_limit(lim.rlim_max + 1).expect_err("beyond the hard limit");
            assert!(e.to_string().contains("hard limit"), "{e}");
        }
        raise_open_files_limit(lim.rlim_max.min(lim.rlim_cur + 16)).expect("within the hard limit");
    }
}
