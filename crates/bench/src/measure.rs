//! What the latency and throughput benchmarks share: timing one client and a closed loop of
//! many, CPU accounting from /proc, progress on the terminal, and the plots.

use anyhow::Context as _;
use redoubt_client::Client;
use redoubt_services::kv::KvResult;
use std::fmt::Write as _;
use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// One measured point: latency with one client (`clients` 0) or a closed loop of `clients`.
#[derive(Clone, Copy)]
pub(super) struct Sample {
    pub clients: u32,
    pub ops_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU time per operation (µs) of the server processes together and of the benchmark's
    /// clients; 0 for latency points.
    pub server_cpu_us: f64,
    /// The busiest server process's CPU per operation (µs).
    pub busiest_cpu_us: f64,
    /// The most any server process's main thread used per operation (µs): a replica runs
    /// its protocol loop there, and with `[node] worker_threads` above 1 its connections,
    /// frame decoding and hashing on other threads; with one thread, the whole process.
    pub busiest_main_cpu_us: f64,
    pub client_cpu_us: f64,
    /// Requests per batch the replicas ordered meanwhile (NaN: not measured).
    pub requests_per_batch: f64,
    /// Retransmission rounds per completed operation (NaN: not measured).
    pub retransmissions_per_op: f64,
}

impl Sample {
    /// The columns of [`Sample::csv`].
    pub const CSV_HEADER: &'static str = "clients,ops_per_s,p50_ms,p99_ms,server_cpu_us_per_op,busiest_server_cpu_us_per_op,client_cpu_us_per_op,requests_per_batch,retransmissions_per_op,busiest_main_thread_cpu_us_per_op";

    /// This sample as CSV fields (NaN where not measured).
    pub fn csv(&self) -> String {
        format!(
            "{},{:.1},{:.4},{:.4},{:.2},{:.2},{:.2},{:.2},{:.4},{:.2}",
            self.clients,
            self.ops_per_s,
            self.p50_ms,
            self.p99_ms,
            self.server_cpu_us,
            self.busiest_cpu_us,
            self.client_cpu_us,
            self.requests_per_batch,
            self.retransmissions_per_op,
            self.busiest_main_cpu_us
        )
    }
}

/// The measuring plan of a latency-and-throughput benchmark, from its options and defaults.
pub(super) struct Plan {
    pub clients: Vec<u32>,
    pub latency_ops: u32,
    pub seconds: f64,
}

/// A benchmark's defaults: (client counts, latency operations) for a full and a `--quick` run.
pub(super) struct PlanDefaults {
    pub full: (&'static [u32], u32),
    pub quick: (&'static [u32], u32),
}

impl Plan {
    /// The plan from `--clients`, `--latency-ops`, `--seconds` and `--quick` (3 s per point,
    /// 1 s quick), checked.
    pub fn new(
        quick: bool,
        clients: &[u32],
        latency_ops: Option<u32>,
        seconds: Option<f64>,
        defaults: PlanDefaults,
    ) -> anyhow::Result<Plan> {
        let (default_clients, default_ops) = if quick { defaults.quick } else { defaults.full };
        let clients = if clients.is_empty() {
            default_clients.to_vec()
        } else {
            clients.to_vec()
        };
        anyhow::ensure!(
            clients.iter().all(|c| (1..=1000).contains(c)),
            "--clients: each count must be between 1 and 1000"
        );
        let latency_ops = latency_ops.unwrap_or(default_ops);
        anyhow::ensure!(latency_ops > 0, "--latency-ops must be positive");
        let seconds = seconds.unwrap_or(if quick { 1.0 } else { 3.0 });
        anyhow::ensure!(
            seconds.is_finite() && seconds > 0.0,
            "--seconds must be positive"
        );
        Ok(Plan {
            clients,
            latency_ops,
            seconds,
        })
    }
}

/// One kind of operation: its bytes for client `c`, on the ordered or the read-only path.
pub(super) struct Load<'a> {
    pub label: &'a str,
    pub read_only: bool,
    pub bytes: &'a (dyn Fn(u64) -> Vec<u8> + Sync),
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs one operation and checks the service did not answer with an error.
pub(super) async fn call(
    c: &Client,
    label: &str,
    read_only: bool,
    bytes: Vec<u8>,
) -> anyhow::Result<()> {
    let r = if read_only {
        c.invoke_read_only(bytes).await
    } else {
        c.invoke(bytes).await
    };
    let r = r.map_err(|e| anyhow::anyhow!("{label} failed: {e}"))?;
    match KvResult::decode(&r) {
        Ok(KvResult::Error(e)) => anyhow::bail!("{label} failed: {e}"),
        Ok(_) => Ok(()),
        Err(e) => anyhow::bail!("{label} returned an undecodable result: {e}"),
    }
}

/// Latency of `ops` operations from client `c` (client number 1), after an untimed warm-up
/// of a tenth as many (at least 100): connections, session keys, caches, a first checkpoint.
pub(super) async fn latency(c: &Client, load: &Load<'_>, ops: u32) -> anyhow::Result<Sample> {
    let bytes = (load.bytes)(1);
    for _ in 0..(ops / 10).max(100) {
        call(c, load.label, load.read_only, bytes.clone()).await?;
    }
    let mut lat = Vec::with_capacity(ops as usize);
    for _ in 0..ops {
        let t = Instant::now();
        call(c, load.label, load.read_only, bytes.clone()).await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    Ok(Sample {
        clients: 0,
        ops_per_s: lat.len() as f64 / (lat.iter().sum::<f64>() / 1000.0),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        server_cpu_us: 0.0,
        busiest_cpu_us: 0.0,
        busiest_main_cpu_us: 0.0,
        client_cpu_us: 0.0,
        requests_per_batch: f64::NAN,
        retransmissions_per_op: f64::NAN,
    })
}

/// Throughput of `n` closed-loop clients (the first `n` of `pool`) for `seconds`, with the
/// CPU the server processes `server_pids` and this process used per operation, and the
/// requests per batch a replica serving metrics at `replica_metrics` ordered.
pub(super) async fn throughput(
    pool: &[Client],
    n: u32,
    load: &Load<'_>,
    seconds: f64,
    server_pids: &[u32],
    replica_metrics: Option<SocketAddr>,
) -> anyhow::Result<Sample> {
    let pool = &pool[..(n as usize).min(pool.len())];
    let steps = pool
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = c.clone();
            let bytes = (load.bytes)(i as u64 + 1);
            let (label, read_only) = (load.label.to_string(), load.read_only);
            move || {
                let (c, label, bytes) = (c.clone(), label.clone(), bytes.clone());
                async move { call(&c, &label, read_only, bytes).await }
            }
        })
        .collect();
    closed_loop(pool, steps, seconds, server_pids, replica_metrics).await
}

/// Runs one closed-loop client per element of `steps` for `seconds`: each call of a step
/// makes that client's next operation, which must succeed. `pool` holds the clients the steps
/// use (their retransmissions are counted); the rest as in [`throughput`].
pub(super) async fn closed_loop<S, F>(
    pool: &[Client],
    steps: Vec<S>,
    seconds: f64,
    server_pids: &[u32],
    replica_metrics: Option<SocketAddr>,
) -> anyhow::Result<Sample>
where
    S: FnMut() -> F + Send + 'static,
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let n = steps.len() as u32;
    let batches0 = batch_counters(replica_metrics).await;
    let retransmissions = || -> u64 { pool.iter().map(|c| c.stats().retransmissions).sum() };
    let retransmissions0 = retransmissions();
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for mut step in steps {
        tasks.spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < stop {
                let t = Instant::now();
                step().await?;
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
    let mains = || -> Vec<f64> {
        server_pids
            .iter()
            .map(|p| main_thread_cpu_seconds(*p).unwrap_or(0.0))
            .collect()
    };
    let (server0, main0, client0) = (each(), mains(), cpu_seconds(None).unwrap_or(0.0));
    let mut all = Vec::new();
    while let Some(r) = tasks.join_next().await {
        all.extend(r??);
    }
    let took = started.elapsed().as_secs_f64();
    let (server1, main1, client1) = (each(), mains(), cpu_seconds(None).unwrap_or(0.0));
    let used: Vec<f64> = server1.iter().zip(&server0).map(|(b, a)| b - a).collect();
    let main_used = main1.iter().zip(&main0).map(|(b, a)| b - a);
    let requests_per_batch = match (batches0, batch_counters(replica_metrics).await) {
        (Some((r0, b0)), Some((r1, b1))) if b1 > b0 => (r1 - r0) / (b1 - b0),
        _ => f64::NAN,
    };
    let count = all.len().max(1) as f64;
    let retransmissions_per_op = (retransmissions() - retransmissions0) as f64 / count;
    let per_op = |d: f64| 1e6 * d / count;
    all.sort_by(f64::total_cmp);
    Ok(Sample {
        clients: n,
        ops_per_s: all.len() as f64 / took,
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
        server_cpu_us: per_op(used.iter().sum()),
        busiest_cpu_us: per_op(used.iter().copied().fold(0.0, f64::max)),
        busiest_main_cpu_us: per_op(main_used.fold(0.0, f64::max)),
        client_cpu_us: per_op(client1 - client0),
        requests_per_batch,
        retransmissions_per_op,
    })
}

/// A replica's (requests, batches) executed so far, from its metrics.
async fn batch_counters(addr: Option<SocketAddr>) -> Option<(f64, f64)> {
    let text = redoubt_localcluster::http::get(addr?, "/metrics", Duration::from_secs(1))
        .await
        .ok()?;
    let (mut requests, mut batches) = (None, None);
    for line in String::from_utf8_lossy(&text).lines() {
        // The name, then labels or the value.
        let is = |name: &str| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        };
        let value = || line.split_whitespace().last()?.parse::<f64>().ok();
        if is("redoubt_requests_executed_total") {
            requests = value();
        } else if is("redoubt_batches_executed_total") {
            batches = value();
        }
    }
    Some((requests?, batches?))
}

/// CPU time (user + system) a process used so far, in seconds, from `/proc/PID/stat`
/// (`None` where there is no such file).
pub(super) fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    stat_cpu_seconds(&match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    })
}

/// CPU time (user + system) the main thread of process `pid` used so far, in seconds.
pub(super) fn main_thread_cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&format!("/proc/{pid}/task/{pid}/stat"))
}

/// The CPU time in a `/proc` `stat` file (a process's or a thread's).
fn stat_cpu_seconds(path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / if hz > 0 { hz as f64 } else { 100.0 })
}

pub(super) struct Progress {
    pub tty: bool,
    pub total: usize,
    pub done: usize,
    pub started: Instant,
}

impl Progress {
    pub fn new(total: usize) -> Progress {
        use std::io::IsTerminal as _;
        Progress {
            tty: std::io::stderr().is_terminal(),
            total,
            done: 0,
            started: Instant::now(),
        }
    }

    pub fn step(&mut self, what: &str) {
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

    pub fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// Kills and reaps a child process when dropped.
pub(super) struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One line of a plot: its legend and (operations/s, median ms, clients) points.
pub(super) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64, u32)>,
}

pub(super) const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// The frame of an SVG plot: its size, margin and scales.
pub(super) struct PlotFrame {
    pub w: f64,
    pub h: f64,
    pub m: f64,
    pub max_x: f64,
    pub max_y: f64,
}

impl PlotFrame {
    pub fn x(&self, v: f64) -> f64 {
        self.m + (self.w - 2.0 * self.m) * v / self.max_x
    }

    pub fn y(&self, v: f64) -> f64 {
        self.h - self.m - (self.h - 2.0 * self.m) * v / self.max_y
    }

    /// The opening of the SVG: background, title, both axes with six ticks each (y values
    /// with `y_decimals` decimals) and their labels.
    pub fn start(&self, title: &str, x_label: &str, y_label: &str, y_decimals: usize) -> String {
        let (w, h, m) = (self.w, self.h, self.m);
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\n",
            w / 2.0,
        );
        let _ = writeln!(
            svg,
            "<line x1=\"{m}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/><line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{b}\" stroke=\"black\"/>",
            b = h - m,
            r = w - m,
        );
        for i in 0..=5 {
            let vx = self.max_x * i as f64 / 5.0;
            let vy = self.max_y * i as f64 / 5.0;
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{:.0}</text><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.*}</text>",
                self.x(vx),
                h - m + 18.0,
                vx,
                m - 6.0,
                self.y(vy) + 4.0,
                y_decimals,
                vy
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{x_label}</text><text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">{y_label}</text>",
            w / 2.0,
            h - 16.0,
            h / 2.0,
            h / 2.0
        );
        svg
    }
}

/// Throughput (x) against median latency (y), one line per series, as SVG.
pub(super) fn plot(path: &Path, title: &str, series: &[Series]) -> anyhow::Result<()> {
    let (w, h, m) = (640.0, 400.0, 60.0);
    let finite = |s: &Series| -> Vec<(f64, f64, u32)> {
        s.points
            .iter()
            .copied()
            .filter(|(x, y, _)| x.is_finite() && y.is_finite())
            .collect()
    };
    let max_x = series
        .iter()
        .flat_map(|s| finite(s).into_iter().map(|p| p.0))
        .fold(1.0, f64::max)
        * 1.05;
    let max_y = series
        .iter()
        .flat_map(|s| finite(s).into_iter().map(|p| p.1))
        .fold(0.01, f64::max)
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
        &format!("{title} : throughput vs median latency"),
        "operations/s",
        "median latency (ms)",
        2,
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = finite(s);
        let line: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            line.join(" ")
        );
        for p in &pts {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"><title>{} clients</title></circle>",
                x(p.0),
                y(p.1),
                p.2
            );
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            w - m - 170.0,
            m + i as f64 * 18.0,
            w - m - 152.0,
            m + 10.0 + i as f64 * 18.0,
            s.name
        );
    }
    svg.push_str("</svg>\n");
    std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The commit of the working tree the benchmark runs in (`git describe --always --dirty`), or
/// "unknown" outside a git checkout. It names the checkout, not the build: run the benchmark
/// from the checkout its binary was built from.
pub(super) fn source_commit() -> String {
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
