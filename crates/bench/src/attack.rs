//! `redoubt bench attack`: throughput and latency of PBFT and Prime, second by second, before
//! and during an attack by faulty replicas or clients (the attack harness, `redoubt-attack`).
//!
//! Each run is a fresh 4-replica cluster (f = 1) on 127.0.0.1 with closed-loop clients, each on
//! its own connections, writing small values. Halfway through, the attack starts: the faulty
//! replica (started from `redoubt-attack replica`, correct until then) begins to misbehave,
//! or faulty clients (`redoubt-attack client`) join.

use super::common::STATUS_TIMEOUT;
use super::measure::{percentile, source_commit, PlotFrame, COLORS};
use anyhow::Context as _;
use clap::{Args, ValueEnum};
use redoubt_client::{Client, ClientSetup};
use redoubt_config::ClusterConfig;
use redoubt_core::OrderProtocol;
use redoubt_localcluster::probe::fetch_all;
use redoubt_localcluster::procs::ReplicaProcs;
use redoubt_node::init::{free_base_port, init_cluster, InitOptions};
use redoubt_services::kv::KvOp;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AttackName {
    /// The leader holds each proposal for --delay-ms (default: 40% of the view-change
    /// timeout, which PBFT's backups do not detect)
    SlowPrimary,
    /// The leader never sends its proposals to one backup
    Withhold,
    /// Faulty clients whose requests verify only at the replica each copy was sent to
    BigMac,
    /// A faulty backup sends peers 20,000 stale authentic frames a second
    Flood,
    /// Big-mac clients and a faulty backup that sends no acknowledgement
    Collude,
    /// A faulty backup holds its acknowledgements for --delay-ms
    SlowAcks,
}

impl AttackName {
    const ALL: [AttackName; 6] = [
        AttackName::SlowPrimary,
        AttackName::Withhold,
        AttackName::BigMac,
        AttackName::Flood,
        AttackName::Collude,
        AttackName::SlowAcks,
    ];

    fn name(self) -> &'static str {
        match self {
            AttackName::SlowPrimary => "slow-primary",
            AttackName::Withhold => "withhold",
            AttackName::BigMac => "big-mac",
            AttackName::Flood => "flood",
            AttackName::Collude => "collude",
            AttackName::SlowAcks => "slow-acks",
        }
    }

    /// The faulty replica and its `redoubt-attack replica --attack` behaviour, if any.
    fn replica(self) -> Option<(u32, &'static str)> {
        match self {
            AttackName::SlowPrimary => Some((0, "slow-primary")),
            AttackName::Withhold => Some((0, "withhold")),
            AttackName::BigMac => None,
            AttackName::Flood => Some((3, "flood")),
            AttackName::Collude => Some((1, "mute")),
            AttackName::SlowAcks => Some((1, "slow-acks")),
        }
    }

    fn faulty_clients(self) -> u32 {
        match self {
            AttackName::BigMac | AttackName::Collude => FAULTY_CLIENTS,
            _ => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Ordering {
    Pbft,
    Prime,
    Both,
}

#[derive(Args)]
pub struct AttackArgs {
    /// The ordering protocol(s) to attack
    #[arg(long, value_enum, default_value_t = Ordering::Both)]
    ordering: Ordering,
    /// The attacks to run, comma-separated [default: all six]
    #[arg(long, value_enum, value_delimiter = ',', value_name = "NAME,...")]
    attack: Vec<AttackName>,
    /// Seconds each run lasts; the attack starts halfway
    #[arg(long, value_name = "S", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(4..=3600))]
    duration: u64,
    /// Correct closed-loop clients
    #[arg(long, value_name = "K", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=200))]
    clients: u32,
    /// Delay of slow-primary and slow-acks (ms) [default: 40% of view_change_timeout_ms]
    #[arg(long, value_name = "MS")]
    delay_ms: Option<u64>,
    /// PBFT: the window of the primary's pace check (`[protocol] primary_pace_window_ms`;
    /// 0: off) of the clusters attacked, instead of the default
    #[arg(long, value_name = "MS")]
    primary_pace_window_ms: Option<u64>,
    /// Override a setting of every attacked cluster, e.g. `--set protocol.prime_row_interval_ms=5`
    /// (repeatable; see docs/configuration.md)
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// Write the tables, CSV and plots to DIR
    #[arg(long, value_name = "DIR", default_value = ".")]
    out: PathBuf,
    /// Put the clusters in DIR and keep them, instead of a temporary directory
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
}

/// Faulty clients of big-mac and collude.
const FAULTY_CLIENTS: u32 = 4;
/// Bytes of each value written.
const VALUE_BYTES: usize = 64;

/// One second of one run.
#[derive(Clone, Copy)]
struct Second {
    ops: u64,
    p50_ms: f64,
    p99_ms: f64,
}

/// One run: an attack against one ordering protocol.
struct Run {
    ordering: OrderProtocol,
    attack: AttackName,
    seconds: Vec<Second>,
    before: Phase,
    during: Phase,
    /// The highest view any replica was in at the end, and view changes it counted.
    final_view: u64,
}

/// Aggregates of the seconds before or during the attack.
#[derive(Clone, Copy)]
struct Phase {
    ops_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The lowest throughput of any one second.
    worst_second: f64,
}

pub fn run(args: AttackArgs) -> anyhow::Result<ExitCode> {
    redoubt_localcluster::runtime(2)?.block_on(bench(args))
}

fn protocol_name(o: OrderProtocol) -> &'static str {
    match o {
        OrderProtocol::Pbft => "pbft",
        OrderProtocol::Prime => "prime",
    }
}

async fn bench(args: AttackArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let harness = exe.with_file_name("redoubt-attack");
    anyhow::ensure!(
        harness.exists(),
        "the attack harness {} is missing: build it with `cargo build --release -p redoubt-attack` (it is never part of a deployment)",
        harness.display()
    );
    let attacks = if args.attack.is_empty() {
        AttackName::ALL.to_vec()
    } else {
        args.attack.clone()
    };
    let orderings = match args.ordering {
        Ordering::Pbft => vec![OrderProtocol::Pbft],
        Ordering::Prime => vec![OrderProtocol::Prime],
        Ordering::Both => vec![OrderProtocol::Pbft, OrderProtocol::Prime],
    };
    for s in &args.sets {
        println!("  setting {s}");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let (tempdir, root) =
        redoubt_localcluster::procs::work_dir(args.keep.as_deref(), "redoubt-bench-attack-")?;
    println!(
        "redoubt bench attack: 4 replicas (f = 1), {} clients, {} s per run, attack from {} s",
        args.clients,
        args.duration,
        args.duration / 2
    );
    println!("  directory  {}", root.display());
    let mut runs = Vec::new();
    for attack in &attacks {
        for ordering in &orderings {
            let dir = root.join(format!("{}-{}", attack.name(), protocol_name(*ordering)));
            print!("  {:<13} {:<6} ", attack.name(), protocol_name(*ordering));
            let _ = std::io::Write::flush(&mut std::io::stdout());
            let r = match one_run(&args, &exe, &harness, &dir, *attack, *ordering).await {
                Ok(r) => r,
                Err(e) => {
                    if let Some(t) = tempdir {
                        eprintln!("kept the cluster directories: {}", t.keep().display());
                    }
                    return Err(e.context(format!(
                        "{} against {}",
                        attack.name(),
                        protocol_name(*ordering)
                    )));
                }
            };
            println!(
                "before {:>7.0} ops/s p50 {:>6.1} ms | during {:>7.0} ops/s p50 {:>7.1} ms ({:.0}%)",
                r.before.ops_per_s,
                r.before.p50_ms,
                r.during.ops_per_s,
                r.during.p50_ms,
                100.0 * r.during.ops_per_s / r.before.ops_per_s.max(1e-9)
            );
            runs.push(r);
        }
    }
    drop(tempdir);
    report(&args, &runs)?;
    Ok(ExitCode::SUCCESS)
}

async fn one_run(
    args: &AttackArgs,
    exe: &Path,
    harness: &Path,
    dir: &Path,
    attack: AttackName,
    ordering: OrderProtocol,
) -> anyhow::Result<Run> {
    let base = free_base_port(4)?;
    let config_path = init_cluster(&InitOptions {
        replicas: 4,
        clients: args.clients + FAULTY_CLIENTS,
        out: dir.to_path_buf(),
        base_port: base,
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        name: format!("attack-{}", attack.name()),
        static_keys: false,
        ordering,
        ..InitOptions::default()
    })?;
    let mut cfg = ClusterConfig::load(&config_path)?;
    cfg.storage.fsync = false;
    cfg.recovery.enabled = false;
    if let Some(w) = args.primary_pace_window_ms {
        cfg.protocol.primary_pace_window_ms = w;
        cfg.protocol
            .validate()
            .map_err(|e| anyhow::anyhow!("--primary-pace-window-ms: {e}"))?;
    }
    let text = redoubt_config::override_toml(&cfg.to_toml()?, &args.sets)
        .map_err(|e| anyhow::anyhow!("--set: {e}"))?;
    ClusterConfig::parse(&config_path, &text).map_err(|e| anyhow::anyhow!("--set: {e}"))?;
    std::fs::write(&config_path, text)?;
    let start_file = dir.join("attack-started");
    let mut procs = ReplicaProcs::new(exe.to_path_buf(), config_path.clone(), dir.to_path_buf(), 4);
    if let Some((id, behaviour)) = attack.replica() {
        let mut command = vec![
            "replica".to_string(),
            "--attack".into(),
            behaviour.into(),
            "--start-when-exists".into(),
            start_file.display().to_string(),
        ];
        if let Some(d) = args.delay_ms {
            command.extend(["--delay-ms".into(), d.to_string()]);
        }
        procs.set_program(id, harness.to_path_buf(), command);
    }
    for i in 0..4 {
        procs.start(i)?;
    }
    super::common::wait_until_up(&cfg, &mut procs).await?;
    let mut clients = Vec::new();
    for c in 1..=args.clients as u64 {
        clients.push(Client::connect(ClientSetup::from_cluster(&cfg, c)?).await?);
    }
    // Warm up (connections, session keys) before the clock starts.
    for c in &clients {
        write(c, 0).await?;
    }
    let t0 = Instant::now();
    let half = Duration::from_secs(args.duration / 2);
    let stop = t0 + Duration::from_secs(args.duration);
    let mut tasks = tokio::task::JoinSet::new();
    for c in clients.clone() {
        tasks.spawn(async move {
            let mut done: Vec<(f64, f64)> = Vec::new();
            let mut i = 1;
            while Instant::now() < stop {
                let t = Instant::now();
                // An operation that fails (its deadline passed under attack) is not counted;
                // the client goes on with the next.
                if write(&c, i).await.is_ok() {
                    done.push((
                        t0.elapsed().as_secs_f64(),
                        t.elapsed().as_secs_f64() * 1000.0,
                    ));
                }
                i += 1;
            }
            done
        });
    }
    tokio::time::sleep_until((t0 + half).into()).await;
    std::fs::write(&start_file, b"")?;
    let mut faulty = Vec::new();
    for k in 0..attack.faulty_clients() {
        let log = std::fs::File::create(dir.join(format!("faulty-client-{k}.log")))?;
        let mut cmd = std::process::Command::new(harness);
        cmd.arg("client")
            .arg("--config")
            .arg(&config_path)
            .arg("--client")
            .arg((args.clients + 1 + k).to_string())
            .arg("--duration-s")
            .arg((args.duration - args.duration / 2).to_string())
            .stdout(log.try_clone()?)
            .stderr(log);
        redoubt_localcluster::procs::die_with_parent(&mut cmd);
        faulty.push(super::measure::KillOnDrop(
            cmd.spawn().context("cannot start a faulty client")?,
        ));
    }
    let mut done = Vec::new();
    while let Some(r) = tasks.join_next().await {
        done.extend(r?);
    }
    drop(faulty);
    let probes = fetch_all(&cfg, STATUS_TIMEOUT).await;
    let final_view = probes.iter().flatten().map(|s| s.view).max().unwrap_or(0);
    procs.stop_all(Duration::from_secs(2));
    let seconds = per_second(&done, args.duration as usize);
    let h = (args.duration / 2) as f64;
    let phase = |from: f64, to: f64| -> Phase {
        let mut lat: Vec<f64> = done
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, l)| *l)
            .collect();
        lat.sort_by(f64::total_cmp);
        let worst = seconds[from as usize..(to as usize).min(seconds.len())]
            .iter()
            .map(|s| s.ops as f64)
            .fold(f64::INFINITY, f64::min);
        Phase {
            ops_per_s: lat.len() as f64 / (to - from),
            p50_ms: percentile(&lat, 0.5),
            p99_ms: percentile(&lat, 0.99),
            worst_second: worst,
        }
    };
    Ok(Run {
        ordering,
        attack,
        before: phase(1.0, h),
        during: phase(h, args.duration as f64),
        seconds,
        final_view,
    })
}

/// Writes `i` under the client's own key (an ordered operation).
async fn write(c: &Client, i: u64) -> anyhow::Result<()> {
    let mut value = vec![b'.'; VALUE_BYTES];
    value[..8].copy_from_slice(&i.to_le_bytes());
    let op = KvOp::Set {
        key: format!("c{}", c.id()).into_bytes(),
        value,
    };
    c.invoke(op.encode()).await?;
    Ok(())
}

fn per_second(done: &[(f64, f64)], seconds: usize) -> Vec<Second> {
    let mut buckets: Vec<Vec<f64>> = vec![Vec::new(); seconds];
    for (t, l) in done {
        if let Some(b) = buckets.get_mut(*t as usize) {
            b.push(*l);
        }
    }
    buckets
        .into_iter()
        .map(|mut b| {
            b.sort_by(f64::total_cmp);
            Second {
                ops: b.len() as u64,
                p50_ms: percentile(&b, 0.5),
                p99_ms: percentile(&b, 0.99),
            }
        })
        .collect()
}

fn report(args: &AttackArgs, runs: &[Run]) -> anyhow::Result<()> {
    let commit = source_commit();
    let mut csv = String::from("ordering,attack,second,phase,ops,p50_ms,p99_ms\n");
    let h = (args.duration / 2) as usize;
    for r in runs {
        for (i, s) in r.seconds.iter().enumerate() {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{:.3},{:.3}",
                protocol_name(r.ordering),
                r.attack.name(),
                i,
                if i < h { "before" } else { "during" },
                s.ops,
                s.p50_ms,
                s.p99_ms
            );
        }
    }
    let csv_path = args.out.join("attack.csv");
    std::fs::write(&csv_path, csv)
        .with_context(|| format!("cannot write {}", csv_path.display()))?;
    let term = match args.primary_pace_window_ms {
        Some(w) => format!(", PBFT pace window {w} ms"),
        None => String::new(),
    };
    let mut t = format!(
        "redoubt bench attack at {commit}: 4 replicas (f = 1), {} clients, {} s per run, attack from {} s{term}\n\n",
        args.clients, args.duration, h
    );
    let _ = writeln!(
        t,
        "| attack | ordering | before ops/s | before p50 / p99 ms | during ops/s | during p50 / p99 ms | during / before | worst second during | final view |"
    );
    let _ = writeln!(t, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let _ = writeln!(
            t,
            "| {} | {} | {:.0} | {:.1} / {:.1} | {:.0} | {:.1} / {:.1} | {:.0}% | {:.0} | {} |",
            r.attack.name(),
            protocol_name(r.ordering),
            r.before.ops_per_s,
            r.before.p50_ms,
            r.before.p99_ms,
            r.during.ops_per_s,
            r.during.p50_ms,
            r.during.p99_ms,
            100.0 * r.during.ops_per_s / r.before.ops_per_s.max(1e-9),
            r.during.worst_second,
            r.final_view
        );
    }
    let table = args.out.join("attack.txt");
    std::fs::write(&table, &t).with_context(|| format!("cannot write {}", table.display()))?;
    println!("\n{t}");
    let mut attacks: Vec<AttackName> = runs.iter().map(|r| r.attack).collect();
    attacks.dedup();
    for a in attacks {
        let series: Vec<(&str, Vec<f64>)> = runs
            .iter()
            .filter(|r| r.attack == a)
            .map(|r| {
                (
                    protocol_name(r.ordering),
                    r.seconds.iter().map(|s| s.ops as f64).collect(),
                )
            })
            .collect();
        let path = args.out.join(format!("attack-{}.svg", a.name()));
        plot_over_time(&path, a.name(), h as f64, &series)?;
    }
    println!(
        "wrote {}, {} and attack-NAME.svg in {}",
        csv_path.display(),
        table.display(),
        args.out.display()
    );
    Ok(())
}

/// Operations per second (y) against time (x), one line per series, the attack's start
/// marked, as SVG.
fn plot_over_time(
    path: &Path,
    attack: &str,
    start: f64,
    series: &[(&str, Vec<f64>)],
) -> anyhow::Result<()> {
    let (w, h, m) = (640.0, 400.0, 60.0);
    let max_x = series.iter().map(|s| s.1.len()).max().unwrap_or(1).max(1) as f64;
    let max_y = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let frame = PlotFrame {
        w,
        h,
        m,
        max_x,
        max_y,
    };
    let (x, y) = (|v| frame.x(v), |v| frame.y(v));
    let mut svg = frame.start(
        &format!("{attack}: throughput over time (attack from {start:.0} s)"),
        "seconds",
        "operations/s",
        0,
    );
    let _ = writeln!(
        svg,
        "<line x1=\"{sx:.1}\" y1=\"{m}\" x2=\"{sx:.1}\" y2=\"{b}\" stroke=\"#999\" stroke-dasharray=\"4 4\"/>",
        b = h - m,
        sx = x(start)
    );
    for (i, (name, ys)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = ys
            .iter()
            .enumerate()
            .map(|(s, v)| format!("{:.1},{:.1}", x(s as f64 + 0.5), y(*v)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{name}</text>",
            pts.join(" "),
            w - m - 90.0,
            m + i as f64 * 18.0,
            w - m - 72.0,
            m + 10.0 + i as f64 * 18.0
        );
    }
    svg.push_str("</svg>\n");
    std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
