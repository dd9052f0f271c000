//! `redoubt demo`: a real cluster of replica processes on 127.0.0.1, a key-value workload from
//! several clients, the primary killed with SIGKILL halfway and restarted at three quarters,
//! then a check that every acknowledged write is still there.
//!
//! Narrative lines go to stdout, the live progress line to stderr (redrawn in place on a
//! terminal), replica logs to files in the cluster directory.

use crate::show_bytes;
use anyhow::Context as _;
use clap::Args;
use redoubt_client::kv::{KvClient, KvClientError};
use redoubt_client::sql::SqlClient;
use redoubt_config::ClusterConfig;
use redoubt_localcluster::probe::{agreement, fetch, fetch_all, Agreement, Probe};
use redoubt_localcluster::procs::{log_tail, ReplicaProcs, Stopped};
use redoubt_node::init::free_base_port;
use redoubt_node::init::{init_cluster, InitOptions, METRICS_PORT_OFFSET};
use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keys each client writes: `c{client}-k{0..KEYS_PER_CLIENT}`.
const KEYS_PER_CLIENT: u64 = 16;
/// Interval of status polls and progress updates.
const TICK: Duration = Duration::from_millis(500);
/// Time limit of one status poll of one replica.
const POLL_TIMEOUT: Duration = Duration::from_millis(400);
/// How long the replicas may take to come up.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the clients may take to finish their last operation once told to stop.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Time limit of each read of the final verification.
const VERIFY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Grace period between SIGTERM and SIGKILL at the end.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Args)]
pub struct DemoArgs {
    /// How long the workload runs, in seconds: the primary is killed halfway through and
    /// restarted at three quarters
    #[arg(long, value_name = "SECS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(8..=3600))]
    duration: u64,
    /// Number of replicas: 3f+1 (4, 7, 10, ...)
    #[arg(long, value_name = "N", default_value_t = 4)]
    replicas: u32,
    /// Number of concurrent clients
    #[arg(long, value_name = "K", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    clients: u32,
    /// Put the cluster (config, keys, journals, logs) in DIR and keep it, instead of a
    /// temporary directory removed at the end
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Override a setting of the demo cluster, e.g. `--set protocol.confidential_bodies=false`
    /// (repeatable; see docs/configuration.md)
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// The separated deployment: the replicas only order, three execution nodes run the
    /// store (one of them is also killed at a quarter and restarted at three eighths)
    #[arg(long)]
    separated: bool,
    /// The firewall deployment: the separated deployment with a 2 x 2 array of filter nodes
    /// between the replicas and the execution nodes (h = 1), one of which is also killed; a
    /// compromised execution node tries to leak every value it executes
    #[arg(long, conflicts_with = "separated")]
    firewall: bool,
    /// The ordering protocol: pbft, or prime (bounded delay under attack), in any of the
    /// deployments
    #[arg(long, default_value = "pbft", value_name = "PROTOCOL")]
    ordering: redoubt_core::OrderProtocol,
    /// The service: kv (clients put and read back keys) or sql (a bank: serializable
    /// transfers between accounts and audits of the total, checked at the end)
    #[arg(long, default_value = "kv", value_name = "SERVICE", value_parser = ["kv", "sql"])]
    service: String,
    /// Virtual-address fail-over instead of a cluster (`redoubt vip`): three members and a
    /// client in network namespaces on one bridge; a member's host crashes and comes back,
    /// another member leaves. Needs root
    #[arg(long, conflicts_with_all = ["separated", "firewall", "ordering", "service", "sets",
                                      "replicas", "clients", "duration"])]
    vip: bool,
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    if args.vip {
        return vip::run(args.keep.as_deref());
    }
    let rt = crate::runtime(2)?;
    rt.block_on(demo(args))
}

/// Output: events on stdout, the progress line on stderr.
struct Ui {
    tty: bool,
    start: Mutex<Option<Instant>>,
    progress_shown: AtomicBool,
    progress_count: AtomicU64,
}

impl Ui {
    fn new() -> Ui {
        Ui {
            tty: std::io::stderr().is_terminal(),
            start: Mutex::new(None),
            progress_shown: AtomicBool::new(false),
            progress_count: AtomicU64::new(0),
        }
    }

    fn clear_progress(&self) {
        if self.progress_shown.swap(false, Relaxed) {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
        }
    }

    /// A line of the story, stamped with the time since the workload started.
    fn event(&self, msg: impl AsRef<str>) {
        self.clear_progress();
        match *self.start.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(t) => println!("[{:>5.1}s] {}", t.elapsed().as_secs_f64(), msg.as_ref()),
            None => println!("{}", msg.as_ref()),
        }
    }

    /// The live progress line: redrawn in place on a terminal, else one line every 2 s.
    fn progress(&self, line: &str) {
        if self.tty {
            eprint!("\r\x1b[K{line}");
            let _ = std::io::stderr().flush();
            self.progress_shown.store(true, Relaxed);
        } else if self.progress_count.fetch_add(1, Relaxed).is_multiple_of(4) {
            eprintln!("{line}");
        }
    }
}

/// Everything the client tasks record.
struct Workload {
    stop: AtomicBool,
    completed: AtomicU64,
    failed: AtomicU64,
    /// When the primary was killed.
    kill_at: Mutex<Option<Instant>>,
    /// From the kill to the completion of the first operation invoked after it.
    recovered: Mutex<Option<Duration>>,
    clients: Vec<Mutex<ClientRecord>>,
    /// The SQL workload's transfers, per client (`--service sql`).
    bank: Vec<Mutex<bank::BankRecord>>,
}

#[derive(Default)]
struct ClientRecord {
    /// Each completed operation: when it completed, and its latency (µs).
    done: Vec<(Instant, u64)>,
    puts: u64,
    reads: u64,
    keys: BTreeMap<String, KeyHistory>,
    /// Read-backs that contradict an acknowledged write: must never happen.
    anomalies: Vec<String>,
    last_error: Option<String>,
}

/// What a key may hold: the value of the last acknowledged put, or the value of a later put
/// whose acknowledgement never came (it may or may not have taken effect).
#[derive(Clone, Default)]
struct KeyHistory {
    acked: Option<Vec<u8>>,
    unacked: Vec<Vec<u8>>,
}

impl ClientRecord {
    /// An operation invoked at `t0` completed now.
    fn record(&mut self, t0: Instant) {
        self.done
            .push((Instant::now(), t0.elapsed().as_micros() as u64));
    }
}

impl KeyHistory {
    fn admits(&self, v: &Option<Vec<u8>>) -> bool {
        *v == self.acked || v.as_ref().is_some_and(|v| self.unacked.contains(v))
    }
    fn touched(&self) -> bool {
        self.acked.is_some() || !self.unacked.is_empty()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Workload {
    fn completed(&self, invoked: Instant) {
        self.completed.fetch_add(1, Relaxed);
        if let Some(kill) = *lock(&self.kill_at) {
            if invoked >= kill {
                let mut r = lock(&self.recovered);
                if r.is_none() {
                    *r = Some(kill.elapsed());
                }
            }
        }
    }
}

/// One client: puts a fresh value to each of its keys in turn and reads it back.
async fn client_loop(w: Arc<Workload>, idx: usize, kv: KvClient) {
    let c = idx + 1;
    let record = &w.clients[idx];
    let mut seq: u64 = 0;
    while !w.stop.load(Relaxed) {
        let key = format!("c{c}-k{}", seq % KEYS_PER_CLIENT);
        let value = format!("c{c}-v{seq}").into_bytes();
        seq += 1;
        lock(record)
            .keys
            .entry(key.clone())
            .or_default()
            .unacked
            .push(value.clone());
        let t0 = Instant::now();
        match kv.put(key.clone(), value.clone()).await {
            Ok(_) => {
                w.completed(t0);
                let mut r = lock(record);
                r.record(t0);
                r.puts += 1;
                let h = r.keys.entry(key.clone()).or_default();
                h.acked = Some(value);
                h.unacked.clear();
            }
            Err(e) => {
                fail(&w, record, e);
                continue;
            }
        }
        if w.stop.load(Relaxed) {
            break;
        }
        let t0 = Instant::now();
        match kv.get(key.clone()).await {
            Ok(v) => {
                w.completed(t0);
                let mut r = lock(record);
                r.record(t0);
                r.reads += 1;
                let h = r.keys.get(&key).cloned().unwrap_or_default();
                if !h.admits(&v) {
                    r.anomalies.push(format!(
                        "read of {key} returned {} right after the put of {} was acknowledged",
                        v.as_deref().map_or("nothing".into(), show_bytes),
                        h.acked.as_deref().map_or("nothing".into(), show_bytes),
                    ));
                }
            }
            Err(e) => fail(&w, record, e),
        }
    }
}

fn fail(w: &Workload, record: &Mutex<ClientRecord>, e: KvClientError) {
    w.failed.fetch_add(1, Relaxed);
    let mut r = lock(record);
    if !matches!(e, KvClientError::Client(_)) {
        r.anomalies.push(format!("unexpected answer: {e}"));
    }
    r.last_error = Some(e.to_string());
}

async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let n = args.replicas;
    anyhow::ensure!(
        n >= 4 && (n - 1).is_multiple_of(3) && n <= 40,
        "--replicas {n}: the demo needs 3f+1 replicas (4, 7, 10, ... up to 40)"
    );
    let (tempdir, dir) =
        redoubt_localcluster::procs::work_dir(args.keep.as_deref(), "redoubt-demo-")?;
    let executors: u32 = if args.separated || args.firewall {
        3
    } else {
        0
    };
    let firewall = args.firewall.then_some(1);
    let filters = if args.firewall { 4 } else { 0 };
    let base = free_base_port((n + executors + filters) as u16)?;
    let config_path = init_cluster(&InitOptions {
        replicas: n,
        executors,
        firewall,
        clients: args.clients,
        out: dir.clone(),
        base_port: base,
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        name: "demo".into(),
        static_keys: false,
        ordering: args.ordering,
        service: args.service.clone(),
        executable_blake3: None,
        state_geometry: None,
    })
    .with_context(|| format!("cannot create the demo cluster in {}", dir.display()))?;
    if !args.sets.is_empty() {
        let text = std::fs::read_to_string(&config_path)?;
        let text = redoubt_config::override_toml(&text, &args.sets)
            .map_err(|e| anyhow::anyhow!("--set: {e}"))?;
        std::fs::write(&config_path, text)?;
    }
    let cfg = ClusterConfig::load(&config_path)?;
    let ui = Ui::new();
    let f = cfg.protocol.f;
    ui.event(format!(
        "redoubt demo: {n} replicas (tolerating f = {f} faulty) and {} clients on 127.0.0.1, for {} s",
        args.clients, args.duration
    ));
    ui.event(format!(
        "  directory  {}{}",
        dir.display(),
        if tempdir.is_some() {
            " (removed at the end; --keep DIR keeps it)"
        } else {
            ""
        }
    ));
    ui.event(format!(
        "  replicas   ports {base}-{}, status at http://127.0.0.1:{}-{}/status",
        base + n as u16 - 1,
        base + METRICS_PORT_OFFSET,
        base + METRICS_PORT_OFFSET + n as u16 - 1
    ));
    ui.event(format!(
        "  logs       {}",
        dir.join(format!("replica-{{0..{}}}.log", n - 1)).display()
    ));

    if executors > 0 {
        ui.event(format!(
            "  separated  {executors} execution nodes run the store (ports {}-{}); the replicas only order",
            base + n as u16,
            base + (n + executors) as u16 - 1
        ));
    }
    let mut exec_procs = ReplicaProcs::executors(
        exe.clone(),
        config_path.clone(),
        dir.clone(),
        executors as usize,
    );
    let mut filter_procs = ReplicaProcs::filters(
        exe.clone(),
        config_path.clone(),
        dir.clone(),
        filters as usize,
    );
    if args.firewall {
        // Execution node 2 is compromised: it tries to smuggle its state out.
        exec_procs.set_extra_args(FW_LEAKER, vec!["--compromised-leak".into()]);
        ui.event(format!(
            "  firewall   4 filter nodes in 2 rows (h = 1, ports {}-{}); execution node {FW_LEAKER} is compromised and tries to leak",
            base + (n + executors) as u16,
            base + (n + executors + filters) as u16 - 1
        ));
    }
    let mut procs = ReplicaProcs::new(exe, config_path.clone(), dir.clone(), n as usize);
    let outcome = tokio::select! {
        r = scenario(&args, &cfg, &mut procs, &mut exec_procs, &mut filter_procs, &ui) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    ui.clear_progress();
    let interrupted = matches!(&outcome, Err(e) if e.to_string() == "interrupted");
    if interrupted {
        ui.event("interrupted: stopping the replicas");
    }

    // Stop every replica: SIGTERM, then SIGKILL after the grace period.
    let stopped = procs.stop_all(STOP_GRACE);
    exec_procs.stop_all(STOP_GRACE);
    filter_procs.stop_all(STOP_GRACE);
    let mut unclean = Vec::new();
    for (id, how) in &stopped {
        match how {
            Stopped::Exited(s) if s.success() => {}
            Stopped::Exited(s) => unclean.push(format!(
                "replica {id} exited with {s} (log: {})",
                procs.log_path(*id).display()
            )),
            Stopped::Killed => unclean.push(format!(
                "replica {id} ignored SIGTERM for {} s and was killed (log: {})",
                STOP_GRACE.as_secs(),
                procs.log_path(*id).display()
            )),
        }
    }
    if !stopped.is_empty() {
        ui.event(format!(
            "stopped {} replica{}{}",
            stopped.len(),
            if stopped.len() == 1 { "" } else { "s" },
            if unclean.is_empty() {
                " cleanly (SIGTERM)".to_string()
            } else {
                format!(": {}", unclean.join("; "))
            }
        ));
    }

    let passed = matches!(outcome, Ok(true));
    match tempdir {
        Some(t) if !passed && !interrupted => {
            let kept = t.keep();
            ui.event(format!(
                "kept the cluster directory for inspection: {}",
                kept.display()
            ));
        }
        Some(t) => drop(t),
        None => ui.event(format!(
            "cluster kept in {}: restart it with `redoubt replica --config {} --id I` for each replica",
            dir.display(),
            config_path.display()
        )),
    }
    if interrupted {
        return Ok(ExitCode::from(130));
    }
    match outcome? {
        true => Ok(ExitCode::SUCCESS),
        false => Ok(ExitCode::from(crate::EXIT_FAILURE)),
    }
}

/// Starts the replicas, runs the workload with the crash and restart, verifies. `Ok(passed)`.
async fn scenario(
    args: &DemoArgs,
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
    exec_procs: &mut ReplicaProcs,
    filter_procs: &mut ReplicaProcs,
    ui: &Ui,
) -> anyhow::Result<bool> {
    let n = cfg.replicas.len();
    let quorum = cfg.protocol.quorum();
    let started = Instant::now();
    for x in 0..cfg.filters.len() as u32 {
        filter_procs.start(x)?;
    }
    for e in 0..cfg.executors.len() as u32 {
        exec_procs.start(e)?;
    }
    for i in 0..n as u32 {
        procs.start(i)?;
    }
    let first = wait_until_up(cfg, procs).await?;
    ui.event(format!(
        "{n} replicas up in {:.1} s: view {}, primary is replica {}",
        started.elapsed().as_secs_f64(),
        first.view,
        first.primary
    ));

    // The clients.
    let workload = Arc::new(Workload {
        stop: AtomicBool::new(false),
        completed: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        kill_at: Mutex::new(None),
        recovered: Mutex::new(None),
        clients: (0..args.clients)
            .map(|_| Mutex::new(ClientRecord::default()))
            .collect(),
        bank: (0..args.clients)
            .map(|_| Mutex::new(bank::BankRecord::default()))
            .collect(),
    });
    let sql = cfg.state.service == "sql";
    let mut clients = Vec::new();
    for c in 1..=u64::from(args.clients) {
        let setup = redoubt_client::ClientSetup::from_cluster(cfg, c)?;
        clients.push(
            redoubt_client::Client::connect(setup)
                .await
                .with_context(|| format!("cannot start client {c}"))?,
        );
    }
    let kvs: Vec<KvClient> = clients.iter().cloned().map(KvClient::new).collect();
    let sqls: Vec<SqlClient> = clients.into_iter().map(SqlClient::new).collect();
    // SQL: every second client goes through the PostgreSQL gateway with a Postgres driver.
    let mut conns: Vec<Option<bank::Conn>> = Vec::new();
    if sql {
        bank::setup(&sqls[0])
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        let (pg, addr) = bank::gateway(cfg, args.clients).await?;
        ui.event(format!(
            "  gateway    PostgreSQL wire protocol on {addr} for clients {}",
            pg.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for (idx, s) in sqls.iter().enumerate() {
            let id = idx as u64 + 1;
            conns.push(Some(if pg.contains(&id) {
                bank::Conn::Pg(bank::pg_connect(addr).await?)
            } else {
                bank::Conn::Direct(s.clone())
            }));
        }
    }
    let d = Duration::from_secs(args.duration);
    let (kill_time, restart_time) = (d / 2, d * 3 / 4);
    ui.event(if sql {
        format!(
            "workload: {} clients moving money between {} accounts in serializable transactions, auditing the total every fourth operation",
            args.clients,
            bank::ACCOUNTS
        )
    } else {
        format!(
            "workload: {} clients, each putting fresh values to its own {KEYS_PER_CLIENT} keys and reading every write back",
            args.clients
        )
    });
    ui.event(format!(
        "  the primary is killed at {:.0} s and restarted at {:.0} s",
        kill_time.as_secs_f64(),
        restart_time.as_secs_f64()
    ));
    let start = Instant::now();
    *lock(&ui.start) = Some(start);
    let mut tasks = tokio::task::JoinSet::new();
    for (idx, kv) in kvs.iter().enumerate() {
        if let Some(conn) = conns.get_mut(idx).and_then(Option::take) {
            tasks.spawn(bank::client_loop(workload.clone(), idx, conn));
        } else {
            tasks.spawn(client_loop(workload.clone(), idx, kv.clone()));
        }
    }

    let k = cfg.protocol.checkpoint_interval;
    // Separated: execution node 1 killed at a quarter, restarted at three eighths.
    let mut exec_story = ExecStory::default();
    let mut filter_killed = false;
    let mut victim: Option<(u32, u64, Instant)> = None;
    let mut view_change: Option<(u64, u32, Duration)> = None;
    let mut recovery_shown = false;
    let mut restarted: Option<Instant> = None;
    let mut caught_up: Option<Duration> = None;
    let mut final_agreement = Some(first);
    let mut rate_mark = (Instant::now(), 0u64);
    let mut rate = 0.0;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let elapsed = start.elapsed();
        let probes = fetch_all(cfg, POLL_TIMEOUT).await;
        let agreed = agreement(&probes);
        if agreed.is_some() {
            final_agreement = agreed;
        }
        for i in 0..n as u32 {
            if let Some(status) = procs.exited(i) {
                ui.event(format!(
                    "replica {i} exited unexpectedly ({status}); last lines of {}:\n{}",
                    procs.log_path(i).display(),
                    log_tail(&procs.log_path(i), 5)
                ));
            }
        }

        if !cfg.executors.is_empty() {
            exec_story.step(cfg, exec_procs, ui, elapsed, d).await?;
        }
        if !cfg.filters.is_empty() && !filter_killed && elapsed >= d * 5 / 8 {
            filter_procs.kill(FW_VICTIM)?;
            filter_killed = true;
            ui.event(format!(
                "killed filter node {FW_VICTIM} (bottom row) with SIGKILL for good: the other filter of its row carries every request and reply"
            ));
        }

        // Halfway: kill the primary.
        if victim.is_none() && elapsed >= kill_time {
            if let Some(a) = agreed {
                procs.kill(a.primary)?;
                let now = Instant::now();
                *lock(&workload.kill_at) = Some(now);
                victim = Some((a.primary, a.view, now));
                ui.event(format!(
                    "killed replica {}, the primary of view {}, with SIGKILL",
                    a.primary, a.view
                ));
            }
        }
        if let Some((_, v0, t_kill)) = victim {
            if !recovery_shown {
                if let Some(r) = *lock(&workload.recovered) {
                    recovery_shown = true;
                    ui.event(format!(
                        "service recovered: the first operation invoked after the kill completed {:.1} s after it",
                        r.as_secs_f64()
                    ));
                }
            }
            if view_change.is_none() {
                if let Some(a) = agreed.filter(|a| a.view > v0 && a.replicas >= quorum) {
                    let after = t_kill.elapsed();
                    view_change = Some((a.view, a.primary, after));
                    ui.event(format!(
                        "view change: view {} is active, primary is replica {} (seen {:.1} s after the kill)",
                        a.view,
                        a.primary,
                        after.as_secs_f64()
                    ));
                }
            }
        }

        // Three quarters: restart it.
        if let Some((p, _, _)) = victim {
            if restarted.is_none() && elapsed >= restart_time {
                procs.start(p)?;
                restarted = Some(Instant::now());
                ui.event(format!("restarted replica {p} (same command, same home)"));
            }
            if let (Some(t_restart), None) = (restarted, caught_up) {
                if let Some(msg) = catch_up(&probes, p, agreed, k) {
                    let after = t_restart.elapsed();
                    caught_up = Some(after);
                    ui.event(format!(
                        "replica {p} caught up: {msg}, {:.1} s after its restart",
                        after.as_secs_f64()
                    ));
                }
            }
        }

        // Progress.
        let ops = workload.completed.load(Relaxed);
        let now = Instant::now();
        let dt = now.duration_since(rate_mark.0).as_secs_f64();
        if dt >= 0.9 {
            rate = (ops - rate_mark.1) as f64 / dt;
            rate_mark = (now, ops);
        }
        let up = probes.iter().filter(|p| p.is_ok()).count();
        ui.progress(&format!(
            "  {:>5.1}s  {ops:>7} ops  {rate:>6.0} ops/s  view {}  replicas up {up}/{n}",
            elapsed.as_secs_f64(),
            agreed.map_or("?".to_string(), |a| a.view.to_string()),
        ));
        if elapsed >= d {
            break;
        }
    }

    // Stop the workload; clients stuck in an operation get DRAIN_TIMEOUT to finish it.
    workload.stop.store(true, Relaxed);
    let stopped_at = start.elapsed();
    let drain_deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    while let Ok(Some(_)) = tokio::time::timeout_at(drain_deadline, tasks.join_next()).await {}
    let stuck = tasks.len();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    ui.event(if stuck == 0 {
        "workload stopped".to_string()
    } else {
        format!("workload stopped ({stuck} clients abandoned an unfinished operation)")
    });
    if victim.is_some() && caught_up.is_none() {
        if let Some((p, _, _)) = victim {
            ui.event(format!(
                "note: replica {p} had not caught up by the end: {} (log: {})",
                describe_progress(&fetch_all(cfg, POLL_TIMEOUT).await, p),
                procs.log_path(p).display()
            ));
        }
    }

    // Verification: every key through the cluster.
    let verification = if sql {
        ui.event("verifying: auditing the accounts against the transfer log through the cluster");
        bank::verify(&workload, &sqls[0]).await
    } else {
        ui.event("verifying: reading every written key back through the cluster");
        verify(&workload, &kvs).await
    };

    // Summary.
    let mut done: Vec<(Instant, u64)> = Vec::new();
    let (mut puts, mut reads) = (0, 0);
    for r in &workload.clients {
        let r = lock(r);
        done.extend_from_slice(&r.done);
        puts += r.puts;
        reads += r.reads;
    }
    let mut latencies: Vec<u64> = done.iter().map(|(_, l)| *l).collect();
    latencies.sort_unstable();
    let pct = |q: f64| percentile_ms(&latencies, q);
    let end = start + stopped_at;
    let phases: Vec<Phase> = match (victim, restarted) {
        (Some((p, _, kill)), restart) => {
            let back = restart.unwrap_or(end).min(end);
            let mut v = vec![
                Phase::of("before kill".into(), &done, start, kill),
                Phase::of(format!("replica {p} down"), &done, kill, back),
            ];
            if back < end {
                v.push(Phase::of("after restart".into(), &done, back, end));
            }
            v
        }
        (None, _) => Vec::new(),
    };
    let ops = puts + reads;
    let failed = workload.failed.load(Relaxed);
    println!();
    println!("summary");
    println!(
        "  operations     {ops} completed ({puts} {}, {reads} {}){}",
        if sql { "transfers" } else { "puts" },
        if sql { "audits" } else { "reads" },
        if failed > 0 {
            format!(", {failed} gave up at the client deadline (their effect is unknown; verification allows for it)")
        } else {
            String::new()
        }
    );
    println!(
        "  throughput     {:.0} ops/s over {:.1} s",
        ops as f64 / stopped_at.as_secs_f64().max(0.001),
        stopped_at.as_secs_f64()
    );
    println!(
        "  latency        p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    for ph in &phases {
        println!(
            "  {:<15}{:.0} ops/s, p50 {:.1} ms, p99 {:.1} ms{}",
            ph.name,
            ph.ops_per_s,
            ph.p50_ms,
            ph.p99_ms,
            if ph.name.ends_with("down") {
                " (the view change included)"
            } else {
                ""
            }
        );
    }
    match (victim, view_change, final_agreement) {
        (Some((p, v0, _)), Some((v1, p1, after)), _) => println!(
            "  view change    view {v0} (primary {p}) -> view {v1} (primary {p1}), seen {:.1} s after the kill",
            after.as_secs_f64()
        ),
        (Some((_, v0, _)), None, a) => println!(
            "  view change    none observed after the kill (view {v0}; now {})",
            a.map_or("unknown".into(), |a| format!("view {}", a.view))
        ),
        (None, _, _) => println!("  view change    no primary was killed"),
    }
    match *lock(&workload.recovered) {
        Some(r) => println!(
            "  recovery       {:.1} s from the kill to the first completed operation invoked after it",
            r.as_secs_f64()
        ),
        None => println!("  recovery       no operation invoked after the kill completed"),
    }
    if let Some((p, _, _)) = victim {
        match caught_up {
            Some(t) => println!(
                "  catch-up       replica {p} caught up {:.1} s after its restart",
                t.as_secs_f64()
            ),
            None => println!("  catch-up       replica {p} had not caught up by the end"),
        }
    }
    if !cfg.executors.is_empty() {
        println!("  execution      {}", exec_story.summary());
    }
    let verification = if cfg.filters.is_empty() {
        verification
    } else {
        let fw = firewall_check(cfg).await;
        match &fw {
            Ok(msg) => println!("  firewall       {msg}"),
            Err(msg) => println!("  firewall       FAILED: {msg}"),
        }
        match (verification, fw) {
            (Ok(v), Ok(_)) => Ok(v),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        }
    };
    match &verification {
        Ok(msg) => println!("  verification   passed: {msg}"),
        Err(msg) => println!("  verification   FAILED: {msg}"),
    }
    Ok(verification.is_ok())
}

/// Waits until every replica answers on `/status` and all agree on a view.
async fn wait_until_up(cfg: &ClusterConfig, procs: &mut ReplicaProcs) -> anyhow::Result<Agreement> {
    let n = cfg.replicas.len();
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        for i in 0..n as u32 {
            if let Some(status) = procs.exited(i) {
                anyhow::bail!(
                    "replica {i} exited during startup ({status}); last lines of its log {}:\n{}",
                    procs.log_path(i).display(),
                    log_tail(&procs.log_path(i), 8)
                );
            }
        }
        let probes = fetch_all(cfg, POLL_TIMEOUT).await;
        if let Some(a) = agreement(&probes).filter(|a| a.replicas == n) {
            return Ok(a);
        }
        if Instant::now() >= deadline {
            let down: Vec<String> = probes
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_err())
                .map(|(i, _)| i.to_string())
                .collect();
            anyhow::bail!(
                "the replicas did not all come up within {} s (not answering: {}); see their logs in {}",
                STARTUP_TIMEOUT.as_secs(),
                if down.is_empty() { "none, but they do not agree on a view".into() } else { down.join(", ") },
                procs.log_path(0).parent().map_or(String::new(), |p| p.display().to_string())
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the restarted replica `p` has caught up: up, in the agreed view and in normal
/// operation, with its last executed sequence number within one checkpoint interval of the
/// most advanced other replica. Says how far each got.
fn catch_up(probes: &[Probe], p: u32, agreed: Option<Agreement>, k: u64) -> Option<String> {
    let a = agreed?;
    let me = probes.get(p as usize)?.as_ref().ok()?;
    if !me.normal || me.view != a.view {
        return None;
    }
    let others = probes
        .iter()
        .flatten()
        .filter(|s| s.id != p)
        .map(|s| s.last_executed)
        .max()?;
    (me.last_executed + k >= others).then(|| {
        format!(
            "executed up to {} (the others {others}), {} state transfer{}",
            me.last_executed,
            me.state_transfers,
            if me.state_transfers == 1 { "" } else { "s" }
        )
    })
}

fn describe_progress(probes: &[Probe], p: u32) -> String {
    let others = probes
        .iter()
        .flatten()
        .filter(|s| s.id != p)
        .map(|s| s.last_executed)
        .max()
        .map_or("unknown".to_string(), |m| m.to_string());
    let agreed = agreement(probes).map_or("unknown".to_string(), |a| a.view.to_string());
    match probes.get(p as usize) {
        Some(Ok(s)) => format!(
            "it executed up to {} and is {} view {}; the others executed up to {others} in view {agreed}",
            s.last_executed,
            if s.normal { "in" } else { "changing to" },
            s.view
        ),
        Some(Err(e)) => format!("its status is unavailable: {e}"),
        None => "unknown".into(),
    }
}

/// Reads every key the workload wrote and checks it holds its last acknowledged value (or
/// the value of a later write whose acknowledgement was lost). Read-back anomalies seen during
/// the workload fail it too.
async fn verify(w: &Workload, kvs: &[KvClient]) -> Result<String, String> {
    let mut problems: Vec<String> = Vec::new();
    for r in &w.clients {
        problems.extend(lock(r).anomalies.iter().cloned());
    }
    let mut reads = tokio::task::JoinSet::new();
    for (idx, kv) in kvs.iter().enumerate() {
        let keys: Vec<(String, KeyHistory)> = lock(&w.clients[idx])
            .keys
            .iter()
            .filter(|(_, h)| h.touched())
            .map(|(k, h)| (k.clone(), h.clone()))
            .collect();
        let kv = kv.clone();
        reads.spawn(async move {
            let mut out = Vec::new();
            for (key, h) in keys {
                let got = match tokio::time::timeout(VERIFY_READ_TIMEOUT, kv.get(key.clone())).await
                {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!(
                        "no answer within {} s",
                        VERIFY_READ_TIMEOUT.as_secs()
                    )),
                };
                let failed = got.is_err();
                out.push((key, h, got));
                if failed {
                    break; // the cluster is not answering: no point waiting for every key
                }
            }
            out
        });
    }
    let (mut checked, mut late) = (0, 0);
    while let Some(res) = reads.join_next().await {
        let Ok(results) = res else {
            problems.push("a verification reader failed".into());
            continue;
        };
        for (key, h, got) in results {
            checked += 1;
            match got {
                Err(e) => problems.push(format!("cannot read {key}: {e}")),
                Ok(v) if v == h.acked => {}
                Ok(v) if h.admits(&v) => late += 1,
                Ok(v) => problems.push(format!(
                    "{key} holds {} but its last acknowledged write was {}",
                    v.as_deref().map_or("nothing".into(), show_bytes),
                    h.acked.as_deref().map_or("nothing".into(), show_bytes)
                )),
            }
        }
    }
    outcome(problems, || {
        format!(
            "all {checked} keys hold their last acknowledged value{}",
            if late > 0 {
                format!(" ({late} hold a later write whose acknowledgement the client gave up on)")
            } else {
                String::new()
            }
        )
    })
}

/// The verification's verdict: `passed()` if there are no problems, else the first five.
fn outcome(mut problems: Vec<String>, passed: impl FnOnce() -> String) -> Result<String, String> {
    if problems.is_empty() {
        return Ok(passed());
    }
    let total = problems.len();
    problems.truncate(5);
    Err(format!(
        "{total} problem{}: {}",
        if total == 1 { "" } else { "s" },
        problems.join("; ")
    ))
}

mod bank;
mod phase;
use phase::{percentile_ms, Phase};
mod deployments;
use deployments::{firewall_check, ExecStory, FW_LEAKER, FW_VICTIM};
mod vip;
