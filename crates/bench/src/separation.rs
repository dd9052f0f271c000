//! `redoubt bench separation`: the deployments of Yin et al. 2003 §5 side by side, each against
//! the same unreplicated baseline in one run on one machine: co-located (4 replicas order and
//! execute), separated (4 agreement nodes, 3 execution nodes), threshold (separated, with
//! replies certified by a threshold signature through one filter, h = 0) and firewall (h = 1:
//! four filters in two rows). With `--server-cpu`, also separated with each agreement node and
//! its execution node sharing one capped "machine" (the paper's same-hosts placement; on one
//! machine without caps it is the separated run again).
//!
//! Operations a/b (argument/result bytes, as encoded by the key-value service): 40/40 reads a
//! 40-byte value, 40/4K a 4 KiB value, 4K/0 writes 4 KiB (the result is the store's one-byte
//! acknowledgement where the paper's was 40 bytes). All are ordered. For each: latency with one
//! client (p50, p99), then throughput and median latency as closed-loop clients grow; the
//! replicas batch as load grows.

use super::measure::{
    call, latency, plot, source_commit, throughput, KillOnDrop, Load, Plan, PlanDefaults, Progress,
    Sample, Series,
};
use anyhow::Context as _;
use clap::Args;
use redoubt_client::{Client, Connections};
use redoubt_config::ClusterConfig;
use redoubt_localcluster::cpucap::CpuCaps;
use redoubt_localcluster::probe::{agreement, fetch_all};
use redoubt_localcluster::procs::{log_tail, ReplicaProcs};
use redoubt_node::init::{free_base_port, init_cluster, InitOptions};
use redoubt_services::kv::{KvOp, KvResult};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SeparationArgs {
    /// A smoke run of a few minutes: fewer operations, three client counts, 1 s each
    #[arg(long)]
    quick: bool,
    /// Client counts of the throughput curve [default: 1,10,50,100,200; quick: 1,20,100]
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    clients: Vec<u32>,
    /// Operations timed with one client, per operation [default: 1000; quick: 200]
    #[arg(long, value_name = "N")]
    latency_ops: Option<u32>,
    /// Seconds per point of the throughput curve [default: 3; quick: 1]
    #[arg(long, value_name = "SECS")]
    seconds: Option<f64>,
    /// Deployments to run, of baseline, co-located, separated, same-hosts (needs
    /// --server-cpu), threshold, firewall [default: all]
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    systems: Vec<String>,
    /// Override a setting of every benchmarked cluster, e.g. `--set protocol.exec_inflight_batches_max=4`
    /// (repeatable; see docs/configuration.md)
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// Cap every "machine" at this many CPU cores, each in a control group of its own: each
    /// server process, or in the same-hosts deployment an agreement node with its execution
    /// node; the clients stay uncapped. Needs root and the cgroup cpu controller
    #[arg(long, value_name = "CORES")]
    server_cpu: Option<f64>,
    /// Directory for separation.csv, separation.md and the plots
    #[arg(long, value_name = "DIR", default_value = "bench-separation")]
    out: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum System {
    Baseline,
    CoLocated,
    Separated,
    SameHosts,
    Threshold,
    Firewall,
}

const SYSTEMS: [System; 6] = [
    System::Baseline,
    System::CoLocated,
    System::Separated,
    System::SameHosts,
    System::Threshold,
    System::Firewall,
];

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Baseline => "baseline",
            System::CoLocated => "co-located",
            System::Separated => "separated",
            System::SameHosts => "same-hosts",
            System::Threshold => "threshold",
            System::Firewall => "firewall",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            System::Baseline => "unreplicated: one server, no agreement",
            System::CoLocated => "4 replicas order and execute (MAC replies)",
            System::Separated => "4 agreement nodes, 3 execution nodes (MAC replies)",
            System::SameHosts => {
                "separated, agreement node i and execution node i on one capped machine"
            }
            System::Threshold => {
                "separated, replies threshold-signed by 2 of 3 execution nodes through one filter (h = 0)"
            }
            System::Firewall => "separated behind 2 rows of 2 filters (h = 1), threshold replies",
        }
    }

    fn executors(self) -> u32 {
        match self {
            System::Baseline | System::CoLocated => 0,
            _ => 3,
        }
    }

    /// h of the firewall, if any.
    fn firewall(self) -> Option<u32> {
        match self {
            System::Threshold => Some(0),
            System::Firewall => Some(1),
            _ => None,
        }
    }

    fn filters(self) -> u32 {
        self.firewall().map_or(0, |h| (h + 1) * (h + 1))
    }
}

/// One benchmarked operation.
#[derive(Clone, Copy)]
struct Op {
    name: &'static str,
}

const OPS: [Op; 3] = [
    Op { name: "40/40" },
    Op { name: "40/4K" },
    Op { name: "4K/0" },
];

/// Sizes of the operations' encodings, found once: (key of the 40-byte value, its value, key
/// of the 4 KiB value, its value, bytes of the written value).
struct Sizes {
    small_key: Vec<u8>,
    small_value: Vec<u8>,
    big_key: Vec<u8>,
    big_value: Vec<u8>,
    write_value: usize,
}

impl Sizes {
    fn new() -> Sizes {
        // The shortest padding that makes each encoding reach its size.
        let pad = |target: usize, f: &dyn Fn(usize) -> usize| {
            (0..target).find(|n| f(*n) >= target).unwrap_or(target)
        };
        let key = |n: usize| {
            let mut k = b"k".to_vec();
            k.resize(n.max(1), b'k');
            k
        };
        let get_len = |n: usize| KvOp::Get { key: key(n) }.encode().len();
        let small_key = key(pad(40, &get_len));
        let mut big_key = small_key.clone();
        *big_key.last_mut().expect("non-empty") = b'K';
        let value_len = |n: usize| KvResult::Value(Some(vec![0; n])).encode().len();
        let write_len = |n: usize| {
            KvOp::Set {
                key: b"w99".to_vec(),
                value: vec![0; n],
            }
            .encode()
            .len()
        };
        Sizes {
            small_key,
            small_value: vec![5; pad(40, &value_len)],
            big_key,
            big_value: vec![6; pad(4096, &value_len)],
            write_value: pad(4096, &write_len),
        }
    }

    fn bytes(&self, op: &Op, client: u64) -> Vec<u8> {
        match op.name {
            "40/40" => KvOp::Get {
                key: self.small_key.clone(),
            },
            "40/4K" => KvOp::Get {
                key: self.big_key.clone(),
            },
            _ => KvOp::Set {
                key: format!("w{client:02}").into_bytes(),
                value: vec![7; self.write_value],
            },
        }
        .encode()
    }

    fn result_len(&self, op: &Op) -> usize {
        match op.name {
            "40/40" => KvResult::Value(Some(self.small_value.clone())),
            "40/4K" => KvResult::Value(Some(self.big_value.clone())),
            _ => KvResult::Done,
        }
        .encode()
        .len()
    }
}

struct Point {
    system: System,
    op: Op,
    s: Sample,
}

pub fn run(args: SeparationArgs) -> anyhow::Result<ExitCode> {
    redoubt_localcluster::runtime(2)?.block_on(separation(args))
}

async fn separation(args: SeparationArgs) -> anyhow::Result<ExitCode> {
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
            full: (&[1, 10, 50, 100, 200], 1000),
            quick: (&[1, 20, 100], 200),
        },
    )?;
    let systems: Vec<System> = if args.systems.is_empty() {
        SYSTEMS
            .into_iter()
            .filter(|s| *s != System::SameHosts || args.server_cpu.is_some())
            .collect()
    } else {
        let mut out = Vec::new();
        for name in &args.systems {
            let s = SYSTEMS
                .into_iter()
                .find(|s| s.name() == name)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--systems: no deployment {name:?} (baseline, co-located, separated, same-hosts, threshold, firewall)"
                    )
                })?;
            anyhow::ensure!(
                s != System::SameHosts || args.server_cpu.is_some(),
                "--systems same-hosts needs --server-cpu (on one uncapped machine it is the separated run)"
            );
            out.push(s);
        }
        out
    };
    let server_cpu = match args.server_cpu {
        Some(cores) => Some(CpuCaps::new(cores)?.cores()),
        None => None,
    };
    let max_clients = *clients.iter().max().expect("non-empty");
    let sizes = Sizes::new();
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let tmp = tempfile::Builder::new()
        .prefix("redoubt-separation-")
        .tempdir()
        .context("cannot create a temporary directory")?;

    println!(
        "redoubt bench separation: the deployments of Yin et al. 2003 against an unreplicated baseline, on {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    for s in &args.sets {
        println!("  setting {s}");
    }
    if let Some(cores) = server_cpu {
        println!("  every machine capped at {cores} cores; the clients uncapped");
    }
    for s in &systems {
        println!("  {:<11} {}", s.name(), s.describe());
    }
    println!(
        "  operations a/b, all ordered: 40/40 reads a small value ({} B argument, {} B result), 40/4K a large one ({} B, {} B), 4K/0 writes {} B ({} B, {} B)",
        sizes.bytes(&OPS[0], 1).len(),
        sizes.result_len(&OPS[0]),
        sizes.bytes(&OPS[1], 1).len(),
        sizes.result_len(&OPS[1]),
        sizes.write_value,
        sizes.bytes(&OPS[2], 1).len(),
        sizes.result_len(&OPS[2]),
    );
    println!(
        "  latency: {latency_ops} operations from one client after a warm-up; throughput: closed-loop clients {clients:?}, {seconds} s each"
    );

    let mut progress = Progress::new(systems.len() * OPS.len() * (1 + clients.len()));
    let mut points = Vec::new();
    for &system in &systems {
        let dir = tmp.path().join(system.name());
        std::fs::create_dir_all(&dir)?;
        let config_path = make_cluster(system, &dir, max_clients, &args.sets)?;
        let cfg = ClusterConfig::load(&config_path)?;
        let mut caps = args.server_cpu.map(CpuCaps::new).transpose()?;
        let mut running = Running::new(system, &exe, &config_path, &dir);
        let result = async {
            running.start(&cfg, caps.as_mut()).await?;
            measure(
                system,
                &cfg,
                &running.server_pids(),
                &sizes,
                &clients,
                latency_ops,
                seconds,
                &mut progress,
            )
            .await
        }
        .await;
        running.stop();
        drop(caps);
        points.extend(result.with_context(|| format!("the {} deployment", system.name()))?);
    }
    progress.finish();

    let report = report(&systems, &clients, &points, server_cpu);
    print!("{report}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv = args.out.join("separation.csv");
    let mut text = format!("system,operation,{}\n", Sample::CSV_HEADER);
    for p in &points {
        let _ = writeln!(text, "{},{},{}", p.system.name(), p.op.name, p.s.csv());
    }
    std::fs::write(&csv, text)?;
    std::fs::write(args.out.join("separation.md"), &report)?;
    let mut plots = Vec::new();
    for op in OPS {
        let path = args
            .out
            .join(format!("separation-{}.svg", op.name.replace('/', "-")));
        let series: Vec<Series> = systems
            .iter()
            .map(|&system| Series {
                name: system.name().into(),
                points: points
                    .iter()
                    .filter(|p| p.system == system && p.op.name == op.name && p.s.clients > 0)
                    .map(|p| (p.s.ops_per_s, p.s.p50_ms, p.s.clients))
                    .collect(),
            })
            .collect();
        plot(&path, op.name, &series)?;
        plots.push(path.display().to_string());
    }
    println!(
        "\nwrote {}, {} and the plots {}",
        csv.display(),
        args.out.join("separation.md").display(),
        plots.join(", ")
    );
    drop(tmp);
    Ok(ExitCode::SUCCESS)
}

/// Writes the cluster of `system` (the baseline's: the co-located one) into `dir`.
fn make_cluster(
    system: System,
    dir: &Path,
    max_clients: u32,
    sets: &[String],
) -> anyhow::Result<PathBuf> {
    let base = free_base_port((4 + system.executors() + system.filters()) as u16)?;
    let config_path = init_cluster(&InitOptions {
        replicas: 4,
        executors: system.executors(),
        firewall: system.firewall(),
        clients: max_clients + 1,
        out: dir.to_path_buf(),
        base_port: base,
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        name: format!("bench-{}", system.name()),
        // The replicated deployments as `redoubt init` makes them (session keys from key
        // holders, bodies sealed); the baseline server has no key holder and runs on static
        // keys with bodies in clear.
        static_keys: system == System::Baseline,
        ordering: redoubt_core::OrderProtocol::Pbft,
        service: "kv".into(),
        executable_blake3: None,
        state_geometry: None,
    })?;
    let mut cfg = ClusterConfig::load(&config_path)?;
    cfg.storage.fsync = false;
    // Nodes are not restarted for proactive recovery while they are measured.
    cfg.recovery.enabled = false;
    super::versus::rewrite_config(&config_path, cfg, max_clients, sets)?;
    Ok(config_path)
}

/// The processes of one deployment.
struct Running {
    system: System,
    replicas: ReplicaProcs,
    executors: ReplicaProcs,
    filters: ReplicaProcs,
    baseline: Option<KillOnDrop>,
    exe: PathBuf,
    config_path: PathBuf,
}

impl Running {
    fn new(system: System, exe: &Path, config_path: &Path, dir: &Path) -> Running {
        let (exe, config) = (exe.to_path_buf(), config_path.to_path_buf());
        Running {
            system,
            replicas: ReplicaProcs::new(exe.clone(), config.clone(), dir.to_path_buf(), 4),
            executors: ReplicaProcs::executors(
                exe.clone(),
                config.clone(),
                dir.to_path_buf(),
                system.executors() as usize,
            ),
            filters: ReplicaProcs::filters(
                exe.clone(),
                config.clone(),
                dir.to_path_buf(),
                system.filters() as usize,
            ),
            baseline: None,
            exe,
            config_path: config,
        }
    }

    async fn start(
        &mut self,
        cfg: &ClusterConfig,
        mut caps: Option<&mut CpuCaps>,
    ) -> anyhow::Result<()> {
        if self.system == System::Baseline {
            let log = std::fs::File::create(self.config_path.with_file_name("baseline.log"))?;
            let child = std::process::Command::new(&self.exe)
                .arg("baseline")
                .arg("--config")
                .arg(&self.config_path)
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("cannot start the baseline server")?;
            if let Some(caps) = caps {
                caps.cap("baseline", child.id())?;
            }
            self.baseline = Some(KillOnDrop(child));
            return Ok(());
        }
        for i in 0..4 {
            self.replicas.start(i)?;
            if let (Some(caps), Some(pid)) = (caps.as_deref_mut(), self.replicas.pid(i)) {
                caps.cap(&format!("host-{i}"), pid)?;
            }
        }
        for i in 0..self.system.executors() {
            self.executors.start(i)?;
            if let (Some(caps), Some(pid)) = (caps.as_deref_mut(), self.executors.pid(i)) {
                if self.system == System::SameHosts {
                    caps.join(&format!("host-{i}"), pid)?;
                } else {
                    caps.cap(&format!("exec-{i}"), pid)?;
                }
            }
        }
        for i in 0..self.system.filters() {
            self.filters.start(i)?;
            if let (Some(caps), Some(pid)) = (caps.as_deref_mut(), self.filters.pid(i)) {
                caps.cap(&format!("filter-{i}"), pid)?;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let probes = fetch_all(cfg, Duration::from_millis(500)).await;
            if agreement(&probes).is_some_and(|a| a.replicas == 4) {
                return Ok(());
            }
            for (procs, n) in [
                (&mut self.replicas, 4),
                (&mut self.executors, self.system.executors()),
                (&mut self.filters, self.system.filters()),
            ] {
                for i in 0..n {
                    if let Some(status) = procs.exited(i) {
                        anyhow::bail!(
                            "node {i} exited ({status}):\n{}",
                            log_tail(&procs.log_path(i), 12)
                        );
                    }
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "the replicas did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn server_pids(&self) -> Vec<u32> {
        if let Some(b) = &self.baseline {
            return vec![b.0.id()];
        }
        let mut pids: Vec<u32> = (0..4).filter_map(|i| self.replicas.pid(i)).collect();
        pids.extend((0..self.system.executors()).filter_map(|i| self.executors.pid(i)));
        pids.extend((0..self.system.filters()).filter_map(|i| self.filters.pid(i)));
        pids
    }

    fn stop(&mut self) {
        let grace = Duration::from_secs(5);
        self.replicas.stop_all(grace);
        self.executors.stop_all(grace);
        self.filters.stop_all(grace);
        self.baseline = None;
    }
}

/// Latency and the throughput curve of every operation on the running `system`.
#[allow(clippy::too_many_arguments)]
async fn measure(
    system: System,
    cfg: &ClusterConfig,
    server_pids: &[u32],
    sizes: &Sizes,
    clients: &[u32],
    latency_ops: u32,
    seconds: f64,
    progress: &mut Progress,
) -> anyhow::Result<Vec<Point>> {
    let max_clients = *clients.iter().max().expect("non-empty");
    let setup = |c: u64| super::versus::client_setup(cfg, c, system == System::Baseline);
    let first = setup(1)?;
    let conns = Connections::open(&first.replicas, max_clients as usize, first.frame_bytes_max);
    // Connect (retrying while the servers start) and preload the two values read.
    let c1 = Client::connect_over(first, &conns).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    for (key, value) in [
        (&sizes.small_key, &sizes.small_value),
        (&sizes.big_key, &sizes.big_value),
    ] {
        let op = KvOp::Set {
            key: key.clone(),
            value: value.clone(),
        };
        loop {
            match tokio::time::timeout(
                Duration::from_secs(5),
                call(&c1, "preload", false, op.encode()),
            )
            .await
            {
                Ok(Ok(())) => break,
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => anyhow::bail!("{} does not answer", system.name()),
            }
        }
    }
    let mut pool = vec![c1];
    for c in 2..=u64::from(max_clients) {
        pool.push(Client::connect_over(setup(c)?, &conns).await?);
    }
    // Replica 0 orders every batch: its counters give the batch sizes.
    let metrics = (system != System::Baseline)
        .then(|| cfg.replicas.first().map(|r| r.metrics_addr))
        .flatten();
    let mut points = Vec::new();
    for op in OPS {
        let bytes = |c: u64| sizes.bytes(&op, c);
        let load = Load {
            label: op.name,
            read_only: false,
            bytes: &bytes,
        };
        let s = latency(&pool[0], &load, latency_ops).await?;
        points.push(Point { system, op, s });
        progress.step(&format!("{} {} latency", system.name(), op.name));
        for &n in clients {
            let s = throughput(&pool, n, &load, seconds, server_pids, metrics).await?;
            points.push(Point { system, op, s });
            progress.step(&format!("{} {} {n} clients", system.name(), op.name));
        }
    }
    Ok(points)
}

/// The head of a table with one column per operation.
fn ops_header() -> String {
    format!(
        "| deployment |{}\n|---|{}\n",
        OPS.iter()
            .map(|o| format!(" {} |", o.name))
            .collect::<String>(),
        "---:|".repeat(OPS.len())
    )
}

/// The report's tables.
fn report(
    systems: &[System],
    clients: &[u32],
    points: &[Point],
    server_cpu: Option<f64>,
) -> String {
    let find = |s: System, op: &Op, c: u32| {
        points
            .iter()
            .find(|p| p.system == s && p.op.name == op.name && p.s.clients == c)
    };
    let peak = |s: System, op: &Op| {
        points
            .iter()
            .filter(|p| p.system == s && p.op.name == op.name && p.s.clients > 0)
            .max_by(|a, b| a.s.ops_per_s.total_cmp(&b.s.ops_per_s))
    };
    let mut r = format!(
        "Run in a checkout at commit {} with `redoubt bench separation{}` on {} cores.\n",
        source_commit(),
        std::env::args()
            .skip(3)
            .map(|a| format!(" {a}"))
            .collect::<String>(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    if let Some(cores) = server_cpu {
        let _ = writeln!(r, "\nEvery machine capped at {cores} cores.");
    }
    let _ = writeln!(r, "\nDeployments:\n");
    for s in systems {
        let _ = writeln!(r, "- {}: {}", s.name(), s.describe());
    }
    let _ = write!(
        r,
        "\nLatency with one client, p50 / p99 (ms):\n\n{}",
        ops_header()
    );
    for &s in systems {
        let _ = write!(r, "| {} |", s.name());
        for op in &OPS {
            match find(s, op, 0) {
                Some(p) => {
                    let _ = write!(r, " {:.2} / {:.2} |", p.s.p50_ms, p.s.p99_ms);
                }
                None => r.push_str(" - |"),
            }
        }
        r.push('\n');
    }
    if systems.contains(&System::CoLocated) {
        let _ = write!(
            r,
            "\nOne-client median latency relative to co-located:\n\n{}",
            ops_header()
        );
        for &s in systems.iter().filter(|s| **s != System::CoLocated) {
            let _ = write!(r, "| {} |", s.name());
            for op in &OPS {
                match (find(s, op, 0), find(System::CoLocated, op, 0)) {
                    (Some(p), Some(c)) => {
                        let _ = write!(r, " {:.2}x |", p.s.p50_ms / c.s.p50_ms);
                    }
                    _ => r.push_str(" - |"),
                }
            }
            r.push('\n');
        }
    }
    let _ = write!(
        r,
        "\nPeak throughput over the client counts, operations/s (at clients){}:\n\n{}",
        if systems.contains(&System::Baseline) {
            ", and as a share of the baseline's"
        } else {
            ""
        },
        ops_header()
    );
    for &s in systems {
        let _ = write!(r, "| {} |", s.name());
        for op in &OPS {
            match peak(s, op) {
                Some(p) => {
                    let share = match peak(System::Baseline, op) {
                        Some(b) if s != System::Baseline => {
                            format!(", {:.0}%", 100.0 * p.s.ops_per_s / b.s.ops_per_s)
                        }
                        _ => String::new(),
                    };
                    let _ = write!(r, " {:.0} ({}{share}) |", p.s.ops_per_s, p.s.clients);
                }
                None => r.push_str(" - |"),
            }
        }
        r.push('\n');
    }
    let _ = writeln!(
        r,
        "\nCPU time per operation at each deployment's peak (µs): all server processes together, the busiest one, and the benchmark's clients (which share the same cores):\n\n| deployment | operation | servers | busiest server | clients |\n|---|---|---:|---:|---:|"
    );
    for &s in systems {
        for op in &OPS {
            if let Some(p) = peak(s, op) {
                let _ = writeln!(
                    r,
                    "| {} | {} | {:.1} | {:.1} | {:.1} |",
                    s.name(),
                    op.name,
                    p.s.server_cpu_us,
                    p.s.busiest_cpu_us,
                    p.s.client_cpu_us
                );
            }
        }
    }
    let _ = writeln!(
        r,
        "\nThroughput (operations/s), median and 99th percentile latency (ms) by clients, the requests per batch replica 0 ordered, and the clients' retransmission rounds per operation:\n\n| deployment | operation | clients | ops/s | p50 | p99 | requests/batch | retransmissions/op |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    for &s in systems {
        for op in &OPS {
            for &c in clients {
                if let Some(p) = find(s, op, c) {
                    let _ = writeln!(
                        r,
                        "| {} | {} | {c} | {:.0} | {:.2} | {:.2} | {} | {:.3} |",
                        s.name(),
                        op.name,
                        p.s.ops_per_s,
                        p.s.p50_ms,
                        p.s.p99_ms,
                        if p.s.requests_per_batch.is_finite() {
                            format!("{:.1}", p.s.requests_per_batch)
                        } else {
                            "-".into()
                        },
                        p.s.retransmissions_per_op
                    );
                }
            }
        }
    }
    r
}
