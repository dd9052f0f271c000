//! `redoubt bench recovery`: the cost of proactive recovery on a real 4-process cluster, in the
//! shape of the 2000 paper's tables 4 and 5.
//!
//! For each state size a fresh cluster runs every replica under `redoubt monitor --manual`
//! (its key holder, the replica, recovery on SIGUSR1), fills the key-value store, and then,
//! under a client workload, recovers each replica in turn. The replicas report the breakdown
//! of each recovery (save state, restart, restore, new key, estimation, recovery request,
//! check and fetch); the table shows the slowest, like the paper's "maximum time to recover a
//! replica".
//!
//! On the last cluster the same workload then runs twice for the same time: once without
//! recoveries and once with recoveries at the watchdog schedule (one replica every T_w / n, in
//! turn, T_w derived from the measured recovery time as `redoubt monitor` derives it unless
//! given). The throughput ratio is the cost of recovery at that schedule. The window of
//! vulnerability is T_v = 2 T_k + T_r with T_r = T_w + the longest recovery measured.

use super::common::{kv_cluster, put_all, record_bytes, wait_for, STATUS_TIMEOUT};
use anyhow::Context as _;
use clap::Args;
use redoubt_client::kv::KvClient;
use redoubt_config::ClusterConfig;
use redoubt_localcluster::probe::{agreement, fetch};
use redoubt_localcluster::procs::{log_tail, ReplicaProcs};
use redoubt_node::status::RecoveryBreakdown;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct RecoveryArgs {
    /// State sizes (MiB) whose recovery is broken down, comma-separated; the key-value store
    /// is filled to about 80% of each [default: 64,512; --quick: 8,32]
    #[arg(long, value_name = "MIB,...", value_delimiter = ',',
          value_parser = clap::value_parser!(u64).range(4..=65536))]
    state_mib: Vec<u64>,
    /// Concurrent clients of the workload (each alternates a put and a get of small values)
    #[arg(long, value_name = "K", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    clients: u32,
    /// Watchdog period T_w (s) of the throughput run [default: as `redoubt monitor` derives
    /// it from the slowest recovery measured: n x 2 x that, at least `[recovery]
    /// watchdog_period_min_s` (600 s); --quick: 20 s]
    #[arg(long, value_name = "S")]
    watchdog_period_s: Option<u64>,
    /// Recoveries in the throughput run with recovery: it lasts this many T_w / n slots, with
    /// one recovery in each [default: n, one full watchdog period]
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(1..=64))]
    recoveries: Option<u32>,
    /// Small states and a 20 s watchdog period: about two minutes, for a smoke test
    #[arg(long)]
    quick: bool,
    /// Write the recoveries as CSV to FILE and the throughput runs to FILE-throughput.csv
    /// (replacing both)
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Put the clusters in DIR and keep them, instead of a temporary directory
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
}

const N: u32 = 4;
/// Longest wait for one recovery to complete.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(600);

pub fn run(args: RecoveryArgs) -> anyhow::Result<ExitCode> {
    redoubt_localcluster::runtime(2)?.block_on(bench(args))
}

/// The breakdown of each recovery measured on one cluster.
struct SizeResult {
    state_mib: u64,
    recoveries: Vec<(u32, RecoveryBreakdown)>,
}

impl SizeResult {
    fn slowest(&self) -> &(u32, RecoveryBreakdown) {
        self.recoveries
            .iter()
            .max_by_key(|(_, b)| b.total_ms)
            .expect("at least one recovery")
    }
    fn mean_total_ms(&self) -> f64 {
        self.recoveries
            .iter()
            .map(|(_, b)| b.total_ms as f64)
            .sum::<f64>()
            / self.recoveries.len() as f64
    }
}

/// One workload run.
struct Run {
    secs: f64,
    ops: u64,
    recoveries: u32,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Run {
    fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

async fn bench(args: RecoveryArgs) -> anyhow::Result<ExitCode> {
    let sizes = if !args.state_mib.is_empty() {
        args.state_mib.clone()
    } else if args.quick {
        vec![8, 32]
    } else {
        vec![64, 512]
    };
    let (tempdir, root) =
        redoubt_localcluster::procs::work_dir(args.keep.as_deref(), "redoubt-bench-recovery-")?;
    println!(
        "redoubt bench recovery: {N} replicas under redoubt monitor, {} clients, state sizes {} MiB",
        args.clients,
        sizes
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  directory  {}", root.display());
    let mut results = Vec::new();
    let mut throughput = None;
    let mut failed = None;
    for (i, &mib) in sizes.iter().enumerate() {
        let last = i + 1 == sizes.len();
        match one_size(
            &args,
            &root.join(format!("state-{mib}")),
            mib,
            last,
            &results,
        )
        .await
        {
            Ok((r, t)) => {
                results.push(r);
                if t.is_some() {
                    throughput = t;
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    if let Some(e) = failed {
        if let Some(t) = tempdir {
            eprintln!(
                "kept the cluster directories for inspection: {}",
                t.keep().display()
            );
        }
        return Err(e);
    }
    drop(tempdir);
    let (window, base, rec) = throughput.expect("the last size runs the throughput phase");
    report(&args, &results, &window, &base, &rec)?;
    Ok(ExitCode::SUCCESS)
}

/// T_k, T_w and what follows from them.
struct Window {
    key_refresh_ms: u64,
    watchdog_ms: u64,
    slowest_ms: u64,
}

impl Window {
    fn t_r_s(&self) -> f64 {
        (self.watchdog_ms + self.slowest_ms) as f64 / 1000.0
    }
    fn t_v_s(&self) -> f64 {
        2.0 * self.key_refresh_ms as f64 / 1000.0 + self.t_r_s()
    }
}

async fn one_size(
    args: &RecoveryArgs,
    dir: &Path,
    mib: u64,
    throughput: bool,
    earlier: &[SizeResult],
) -> anyhow::Result<(SizeResult, Option<(Window, Run, Run)>)> {
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let (config_path, mut cfg) = kv_cluster("bench-recovery", args.clients, dir, true)?;
    cfg.state.size_mib = mib;
    if args.quick {
        // Recoveries come every 5 s: the rate limit must let each replica's through.
        cfg.protocol.recovery_interval_min_ms = 2_000;
    }
    std::fs::write(&config_path, cfg.to_toml()?)?;
    let cfg = ClusterConfig::load(&config_path)?;
    println!();
    println!("[{mib} MiB] starting 4 monitors (key holder + replica each)");
    let mut procs = ReplicaProcs::new(exe, config_path.clone(), dir.to_path_buf(), N as usize);
    let mut extra = vec!["--manual".to_string()];
    if let Some(s) = args.watchdog_period_s.or(args.quick.then_some(20)) {
        extra.extend(["--watchdog-period-s".into(), s.to_string()]);
    }
    for i in 0..N {
        procs.start_monitor(i, &extra)?;
    }
    let result = size_body(args, &cfg, &mut procs, mib, throughput, earlier).await;
    procs.stop_all(Duration::from_secs(15));
    result
}

async fn size_body(
    args: &RecoveryArgs,
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
    mib: u64,
    throughput: bool,
    earlier: &[SizeResult],
) -> anyhow::Result<(SizeResult, Option<(Window, Run, Run)>)> {
    wait_for(cfg, procs, "the replicas to come up", |p| {
        agreement(p).is_some_and(|a| a.replicas == N as usize)
    })
    .await?;
    let mut kvs = Vec::new();
    for c in 1..=u64::from(args.clients) {
        kvs.push(KvClient::connect(redoubt_client::ClientSetup::from_cluster(cfg, c)?).await?);
    }
    let state_bytes = cfg.state.geometry().map_err(anyhow::Error::msg)?.size();
    let records = state_bytes * 80 / 100 / record_bytes();
    let t = Instant::now();
    put_all(&kvs, (0..records).map(|i| (i, 0)).collect()).await?;
    println!(
        "[{mib} MiB] filled {records} records ({:.0} MiB) in {:.1} s",
        (records * record_bytes()) as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );

    // Each replica recovers once, under the workload; the primary (replica 0) last, so the
    // others' recoveries run in a steady view.
    let load = Workload::start(&kvs);
    let mut recoveries = Vec::new();
    for r in [1, 2, 3, 0] {
        let b = recover(cfg, procs, r).await?;
        let parts: Vec<String> = b.steps()[..7]
            .iter()
            .map(|st| format!("{} {:.3}", st.name, s(st.ms)))
            .collect();
        println!(
            "[{mib} MiB] replica {r} recovered in {:.2} s ({}; {} pages fetched, recovery point {})",
            s(b.total_ms),
            parts.join(", "),
            b.pages_fetched,
            b.h
        );
        recoveries.push((r, b));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    load.finish().await?;
    let result = SizeResult {
        state_mib: mib,
        recoveries,
    };
    if !throughput {
        return Ok((result, None));
    }

    let slowest_ms = earlier
        .iter()
        .chain(std::iter::once(&result))
        .map(|r| r.slowest().1.total_ms)
        .max()
        .unwrap_or(0);
    let watchdog_ms = match args.watchdog_period_s.or(args.quick.then_some(20)) {
        Some(s) => s * 1000,
        None => cfg.watchdog_period_ms(slowest_ms),
    };
    let window = Window {
        key_refresh_ms: cfg.protocol.key_refresh_ms,
        watchdog_ms,
        slowest_ms,
    };
    let slot = Duration::from_millis(watchdog_ms / u64::from(N));
    let count = args.recoveries.unwrap_or(N);
    let length = slot * count;
    println!(
        "[{mib} MiB] throughput: T_w = {:.0} s, one recovery every T_w/n = {:.1} s; two runs of {:.0} s, without and with {count} recoveries",
        watchdog_ms as f64 / 1000.0,
        slot.as_secs_f64(),
        length.as_secs_f64()
    );
    let base = timed_run(cfg, procs, &kvs, length, slot, 0, "without recovery").await?;
    let rec = timed_run(cfg, procs, &kvs, length, slot, count, "with recovery").await?;
    Ok((result, Some((window, base, rec))))
}

fn s(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Signals replica `r`'s monitor to recover it and waits for the new process to report the
/// recovery complete.
async fn recover(
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
    r: u32,
) -> anyhow::Result<RecoveryBreakdown> {
    let addr = cfg.replica(r)?.metrics_addr;
    let asked = Instant::now();
    procs.signal(r, libc::SIGUSR1)?;
    loop {
        if let Some(status) = procs.exited(r) {
            anyhow::bail!(
                "the monitor of replica {r} exited ({status}); last lines of its log:\n{}",
                log_tail(&procs.log_path(r), 12)
            );
        }
        if let Ok(st) = fetch(addr, STATUS_TIMEOUT).await {
            let fresh = st.uptime_s < asked.elapsed().as_secs_f64();
            if let (true, false, Some(b)) = (fresh, st.recovering, st.last_recovery) {
                return Ok(b);
            }
        }
        anyhow::ensure!(
            asked.elapsed() < RECOVERY_TIMEOUT,
            "replica {r} did not recover within {} s (log: {})",
            RECOVERY_TIMEOUT.as_secs(),
            procs.log_path(r).display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The workload: every client alternates a put and a get of a small value under its own keys,
/// checking each get returns its last put. Any failed operation fails the benchmark.
struct Workload {
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    tasks: tokio::task::JoinSet<anyhow::Result<Vec<f64>>>,
}

impl Workload {
    fn start(kvs: &[KvClient]) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for (c, kv) in kvs.iter().enumerate() {
            let (kv, stop, ops) = (kv.clone(), stop.clone(), ops.clone());
            tasks.spawn(async move {
                let mut lat = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("w{c}-{}", i % 64).into_bytes();
                    let value = format!("{c}:{i}:{:0>48}", i).into_bytes();
                    let t = Instant::now();
                    kv.put(key.clone(), value.clone())
                        .await
                        .map_err(|e| anyhow::anyhow!("client {c}: put failed: {e}"))?;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    let t = Instant::now();
                    let got = kv
                        .get(key)
                        .await
                        .map_err(|e| anyhow::anyhow!("client {c}: get failed: {e}"))?;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    anyhow::ensure!(
                        got.as_deref() == Some(&value[..]),
                        "client {c}: a get did not return the value just put"
                    );
                    ops.fetch_add(2, Ordering::Relaxed);
                    i += 1;
                }
                Ok(lat)
            });
        }
        Workload { stop, ops, tasks }
    }

    fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    /// Stops the clients; returns the latencies (ms) of every operation.
    async fn finish(mut self) -> anyhow::Result<Vec<f64>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        while let Some(r) = self.tasks.join_next().await {
            all.extend(r??);
        }
        Ok(all)
    }
}

/// Runs the workload for `length`, recovering `count` replicas in turn, one at the start of
/// each `slot` (after a 2 s lead-in), starting with the primary.
async fn timed_run(
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
    kvs: &[KvClient],
    length: Duration,
    slot: Duration,
    count: u32,
    what: &str,
) -> anyhow::Result<Run> {
    let primary = agreement(&redoubt_localcluster::probe::fetch_all(cfg, STATUS_TIMEOUT).await)
        .map_or(0, |a| a.primary);
    let load = Workload::start(kvs);
    let started = Instant::now();
    let mut done = 0u32;
    let mut last_print = Instant::now();
    let lead_in = Duration::from_secs(2).min(slot / 4);
    let tty = std::io::stdout().is_terminal();
    while started.elapsed() < length {
        if done < count && started.elapsed() >= lead_in + slot * done {
            let r = (primary + done) % N;
            let at = started.elapsed().as_secs_f64();
            let b = recover(cfg, procs, r).await?;
            done += 1;
            println!(
                "{}  {what}: recovery {done} of {count} at {at:.0} s: replica {r}, {:.2} s",
                if tty { "\n" } else { "" },
                s(b.total_ms)
            );
            continue;
        }
        if tty && last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            let el = started.elapsed().as_secs_f64();
            print!(
                "\r  {what}: {el:>5.0} / {:.0} s, {} ops ({:.0} ops/s), {done} recoveries   ",
                length.as_secs_f64(),
                load.ops(),
                load.ops() as f64 / el
            );
            let _ = std::io::stdout().flush();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let ops = load.ops();
    let mut lat = load.finish().await?;
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| super::measure::percentile(&lat, p);
    let run = Run {
        secs,
        ops,
        recoveries: done,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: lat.last().copied().unwrap_or(0.0),
    };
    println!(
        "{}  {what}: {:.0} s, {} ops, {:.0} ops/s, {} recoveries, latency p50 {:.2} ms, p99 {:.2} ms, max {:.0} ms",
        if tty { "\r" } else { "" },
        run.secs,
        run.ops,
        run.ops_per_s(),
        run.recoveries,
        run.p50_ms,
        run.p99_ms,
        run.max_ms
    );
    Ok(run)
}

fn report(
    args: &RecoveryArgs,
    sizes: &[SizeResult],
    w: &Window,
    base: &Run,
    rec: &Run,
) -> anyhow::Result<()> {
    println!();
    println!("Time to recover a replica (s; the slowest of the four recoveries per state size, under load):");
    println!();
    let mut header = String::from("| step |");
    let mut rule = String::from("|---|");
    for r in sizes {
        header.push_str(&format!(" {} MiB |", r.state_mib));
        rule.push_str("---:|");
    }
    println!("{header}");
    println!("{rule}");
    for (i, step) in RecoveryBreakdown::default().steps().iter().enumerate() {
        let name = if step.label == "total" {
            "**total**"
        } else {
            step.name
        };
        let mut line = format!("| {name} |");
        for r in sizes {
            line.push_str(&format!(" {:.2} |", s(r.slowest().1.steps()[i].ms)));
        }
        println!("{line}");
    }
    let mut line = String::from("| (replica; mean total of 4) |");
    for r in sizes {
        let (id, _) = r.slowest();
        line.push_str(&format!(" r{id}; {:.2} |", r.mean_total_ms() / 1000.0));
    }
    println!("{line}");
    let cost = 100.0 * (1.0 - rec.ops_per_s() / base.ops_per_s());
    println!();
    println!(
        "Throughput with and without proactive recovery ({} MiB, {} clients, T_w = {:.0} s: one recovery every {:.1} s):",
        sizes.last().map_or(0, |r| r.state_mib),
        args.clients,
        w.watchdog_ms as f64 / 1000.0,
        w.watchdog_ms as f64 / 1000.0 / f64::from(N)
    );
    println!();
    println!("| run | length | recoveries | ops/s | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, r) in [("without recovery", base), ("with recovery", rec)] {
        println!(
            "| {name} | {:.0} s | {} | {:.0} | {:.2} ms | {:.2} ms | {:.0} ms |",
            r.secs,
            r.recoveries,
            r.ops_per_s(),
            r.p50_ms,
            r.p99_ms,
            r.max_ms
        );
    }
    println!();
    println!("throughput cost of recovery: {cost:.1}%");
    println!(
        "window of vulnerability: T_v = 2 T_k + T_r = 2 x {:.0} s + ({:.0} s + {:.1} s) = {:.1} s ({:.1} min)",
        w.key_refresh_ms as f64 / 1000.0,
        w.watchdog_ms as f64 / 1000.0,
        w.slowest_ms as f64 / 1000.0,
        w.t_v_s(),
        w.t_v_s() / 60.0
    );
    if let Some(path) = &args.csv {
        write_csv(path, sizes, w, base, rec)?;
        println!(
            "\nwrote {} and {}",
            path.display(),
            throughput_csv(path).display()
        );
    }
    Ok(())
}

fn write_csv(
    path: &Path,
    sizes: &[SizeResult],
    w: &Window,
    base: &Run,
    rec: &Run,
) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    writeln!(
        f,
        "state_mib,replica,save_s,restart_s,restore_s,new_key_s,estimation_s,request_s,check_fetch_s,total_s,pages_fetched"
    )?;
    for r in sizes {
        for (id, b) in &r.recoveries {
            let cols: Vec<String> = b
                .steps()
                .iter()
                .map(|st| format!("{:.3}", s(st.ms)))
                .collect();
            writeln!(
                f,
                "{},{id},{},{}",
                r.state_mib,
                cols.join(","),
                b.pages_fetched
            )?;
        }
    }
    let tpath = throughput_csv(path);
    let mut f = std::fs::File::create(&tpath)
        .with_context(|| format!("cannot create {}", tpath.display()))?;
    writeln!(
        f,
        "run,seconds,recoveries,ops,ops_per_s,p50_ms,p99_ms,max_ms,watchdog_s,key_refresh_s,window_s"
    )?;
    for (name, r) in [("without", base), ("with", rec)] {
        writeln!(
            f,
            "{name},{:.1},{},{},{:.1},{:.3},{:.3},{:.1},{:.1},{:.1},{:.1}",
            r.secs,
            r.recoveries,
            r.ops,
            r.ops_per_s(),
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            w.watchdog_ms as f64 / 1000.0,
            w.key_refresh_ms as f64 / 1000.0,
            w.t_v_s()
        )?;
    }
    Ok(())
}

/// `dir/name.csv` -> `dir/name-throughput.csv`.
fn throughput_csv(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(|| "recovery".into(), |s| s.to_string_lossy().to_string());
    path.with_file_name(format!("{stem}-throughput.csv"))
}
