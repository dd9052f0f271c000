//! `redoubt bench micro`: the papers' micro-benchmark, redoubt (n = 4) against an unreplicated
//! baseline (the same service, transport and client code, one server, no agreement), in one
//! run on one machine.
//!
//! Operations a/b (argument/result KiB): 0/0 is a get of an absent key, 0/4 a get of a 4 KiB
//! value, 4/0 a blind write of 4 KiB. Gets run ordered and on the read-only path. For each:
//! latency with one client (p50, p99), then throughput and median latency as the number of
//! closed-loop clients grows.

use super::measure::{
    latency, plot, source_commit, throughput, Load, Plan, PlanDefaults, Progress, Sample, Series,
};
use super::versus::{self, System};
use crate::cpucap::{CpuCaps, PERIOD_US};
use crate::procs::ReplicaProcs;
use anyhow::Context as _;
use clap::Args;
use redoubt_services::kv::{KvOp, KvResult};
use std::fmt::Write as _;
use std::path::PathBuf;
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
    s: Sample,
}

/// The point of highest throughput of `system` for `op` over the client counts.
fn peak<'a>(points: &'a [Point], system: System, op: &Op) -> Option<&'a Point> {
    points
        .iter()
        .filter(|p| p.system == system && p.op.label() == op.label() && p.s.clients > 0)
        .max_by(|a, b| a.s.ops_per_s.total_cmp(&b.s.ops_per_s))
}

pub fn run(args: MicroArgs) -> anyhow::Result<ExitCode> {
    crate::runtime(2)?.block_on(micro(args))
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
            full: (&[1, 2, 5, 10, 20, 50, 100, 200], 3000),
            quick: (&[1, 10, 50], 400),
        },
    )?;
    let max_clients = *clients.iter().max().expect("non-empty");
    // Checked before anything starts: a machine without the controller fails at once.
    let server_cpu = match args.server_cpu {
        Some(cores) => Some(CpuCaps::new(cores)?.cores()),
        None => None,
    };
    let cluster = versus::make_cluster("micro", "kv", max_clients, args.fsync, &args.sets)?;
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

    let mut progress =
        Progress::new(if args.redoubt_only { 1 } else { 2 } * OPS.len() * (1 + clients.len()));
    let mut points = Vec::new();
    let systems: &[System] = if args.redoubt_only {
        &[System::Redoubt]
    } else {
        &[System::Baseline, System::Redoubt]
    };
    let mut throttled = Vec::new();
    for &system in systems {
        let mut procs = cluster.replicas();
        let mut caps = server_cpu.map(CpuCaps::new).transpose()?;
        let result = run_system(
            system,
            &cluster,
            &mut procs,
            caps.as_mut(),
            args.baseline_threads,
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
                p.s.clients,
                p.s.ops_per_s,
                p.s.p50_ms,
                p.s.p99_ms,
                p.s.server_cpu_us,
                p.s.busiest_cpu_us,
                p.s.client_cpu_us
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
    for op in OPS {
        if let (Some(b), Some(r)) = (
            peak(&points, System::Baseline, &op),
            peak(&points, System::Redoubt, &op),
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
    for op in OPS {
        for c in &clients {
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
        "\nCPU time per operation (µs) at each system's peak: the servers (redoubt: the four replicas together, on average, and the busiest one, usually the primary, with the cores it used) and the benchmark's clients, which share the same cores:\n\n| operation | baseline server | baseline clients | redoubt replicas | redoubt per replica | redoubt busiest replica | its cores | redoubt clients | total ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for op in OPS {
        if let (Some(b), Some(r)) = (
            peak(&points, System::Baseline, &op),
            peak(&points, System::Redoubt, &op),
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
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {ratio} |",
                op.label(),
                b.s.server_cpu_us,
                b.s.client_cpu_us,
                r.s.server_cpu_us,
                r.s.server_cpu_us / 4.0,
                r.s.busiest_cpu_us,
                r.s.busiest_cpu_us * r.s.ops_per_s / 1e6,
                r.s.client_cpu_us,
            );
        }
    }
    print!("{report}");

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv = args.out.join("micro.csv");
    let mut text = format!("system,operation,mode,{}\n", Sample::CSV_HEADER);
    for p in &points {
        let _ = writeln!(
            text,
            "{},{},{},{}",
            p.system.name(),
            p.op.name,
            p.op.mode(),
            p.s.csv()
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
        let series: Vec<Series> = [System::Baseline, System::Redoubt]
            .into_iter()
            .map(|system| {
                let mut pts: Vec<&Point> = points
                    .iter()
                    .filter(|p| p.system == system && p.op.label() == op.label() && p.s.clients > 0)
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
        plot(&path, &op.label(), &series)?;
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
    drop(cluster);
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::too_many_arguments)]
async fn run_system(
    system: System,
    cluster: &versus::Cluster,
    procs: &mut ReplicaProcs,
    caps: Option<&mut CpuCaps>,
    baseline_threads: Option<usize>,
    clients: &[u32],
    latency_ops: u32,
    seconds: f64,
    own_connections: bool,
    progress: &mut Progress,
) -> anyhow::Result<Vec<Point>> {
    let max_clients = *clients.iter().max().expect("non-empty");
    let baseline_child = versus::start(system, cluster, procs, caps, baseline_threads).await?;
    let pool = versus::connect(&cluster.cfg, system, max_clients, own_connections).await?;
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
    for op in OPS {
        let label = op.label();
        let bytes = |c: u64| op.bytes(c);
        let load = Load {
            label: &label,
            read_only: op.read_only,
            bytes: &bytes,
        };
        let s = latency(&pool[0], &load, latency_ops).await?;
        points.push(Point { system, op, s });
        progress.step(&format!("{} {label} latency", system.name()));
        for &n in clients {
            let s = throughput(&pool, n, &load, seconds, &server_pids, None).await?;
            points.push(Point { system, op, s });
            progress.step(&format!("{} {label} {n} clients", system.name()));
        }
    }
    drop(baseline_child);
    Ok(points)
}
