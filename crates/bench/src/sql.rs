//! `redoubt bench sql`: SQL throughput and latency of the replicated SQL service, redoubt
//! (n = 4) against the same engine unreplicated (`redoubt baseline` hosting the same
//! `SqlService`, one server, the same client protocol), in one run on one machine.
//!
//! The workload of the JHU database replication experiments (Amir et al., "Practical
//! wide-area database replication"): tables of tuples of five attributes (two integers, a
//! 50-character string, a float and a date; about 100 bytes), created and loaded first, then
//! closed-loop clients each with one transaction outstanding, every transaction an update of
//! one random tuple (`UPDATE tN SET v = v + 1 WHERE id = $1`, ordered) or a query of one
//! (`SELECT v FROM tN WHERE id = $1`, on the read-only path), in mixes of the two. Every
//! update must change one row and every query return one; at the end the values summed must
//! equal the updates acknowledged.

use super::measure::{
    closed_loop, plot, source_commit, Plan, PlanDefaults, Progress, Sample, Series,
};
use super::versus::{self, System};
use anyhow::Context as _;
use clap::Args;
use redoubt_client::sql::SqlClient;
use redoubt_localcluster::procs::ReplicaProcs;
use redoubt_services::sql::{Statement, Value};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SqlArgs {
    /// A short run: 1 and 4 clients, 1 s a point
    #[arg(long)]
    quick: bool,
    /// Closed-loop client counts [default: 1,2,4,8,16,32,64,128; quick: 1,4]
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    clients: Vec<u32>,
    /// The mixes, as percentages of updates (the rest are queries) [default: 100,50,0]
    #[arg(long, value_delimiter = ',', value_name = "PCT,PCT,...")]
    updates: Vec<u32>,
    /// Seconds per point [default: 3; quick: 1]
    #[arg(long, value_name = "SECS")]
    seconds: Option<f64>,
    /// Tables
    #[arg(long, value_name = "N", default_value_t = 10)]
    tables: u32,
    /// Tuples per table
    #[arg(long, value_name = "N", default_value_t = 1000)]
    rows: u32,
    /// Sync the replicas' journals (the baseline keeps no journal either way)
    #[arg(long)]
    fsync: bool,
    /// Override a setting of the benchmarked cluster (repeatable; see docs/configuration.md)
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// Run redoubt a second time with this replica killed once the cluster is up and never
    /// restarted (at most f = 1), reported beside the healthy cluster, e.g. `--down 3`
    #[arg(long, value_delimiter = ',', value_name = "ID")]
    down: Vec<u32>,
    /// Directory for sql.csv, sql.md and sql.svg
    #[arg(long, value_name = "DIR", default_value = "bench-sql")]
    out: PathBuf,
}

/// INSERTs per ordered operation while loading.
const LOAD_BATCH: u32 = 100;

/// The database and the mixes run on it.
struct Workload {
    tables: u32,
    rows: u32,
    mixes: Vec<u32>,
    clients: Vec<u32>,
    seconds: f64,
}

struct Point {
    system: System,
    /// Percent of updates.
    mix: u32,
    s: Sample,
}

/// What one system did: its points, and the seconds it took to load the database.
struct Run {
    points: Vec<Point>,
    load_s: f64,
    updates: u64,
}

fn mix_label(pct: u32) -> String {
    match pct {
        100 => "updates only".into(),
        0 => "queries only".into(),
        p => format!("{p}% updates"),
    }
}

/// A small generator per client: which tuple, update or query.
struct Pick(u64);

impl Pick {
    fn below(&mut self, n: u32) -> u32 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % u64::from(n)) as u32
    }
}

pub fn run(args: SqlArgs) -> anyhow::Result<ExitCode> {
    redoubt_localcluster::runtime(2)?.block_on(sql(args))
}

async fn sql(args: SqlArgs) -> anyhow::Result<ExitCode> {
    // No latency run of its own: the one-client points give the unloaded latency.
    let Plan {
        clients, seconds, ..
    } = Plan::new(
        args.quick,
        &args.clients,
        None,
        args.seconds,
        PlanDefaults {
            full: (&[1, 2, 4, 8, 16, 32, 64, 128], 1),
            quick: (&[1, 4], 1),
        },
    )?;
    let mixes = if args.updates.is_empty() {
        vec![100, 50, 0]
    } else {
        args.updates.clone()
    };
    anyhow::ensure!(
        mixes.iter().all(|p| *p <= 100),
        "--updates: each mix is a percentage, 0 to 100"
    );
    anyhow::ensure!(
        (1..=1000).contains(&args.tables) && args.rows >= 1,
        "--tables must be 1 to 1000 and --rows positive"
    );
    let w = Workload {
        tables: args.tables,
        rows: args.rows,
        mixes,
        clients,
        seconds,
    };
    let max_clients = *w.clients.iter().max().expect("non-empty");
    let cluster = versus::make_cluster(
        "sql",
        "sql",
        max_clients,
        args.fsync,
        &args.sets,
        &args.down,
    )?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "redoubt bench sql: redoubt (n = 4, f = 1, journal fsync {}) against the same SQL engine unreplicated, on {cores} cores, everything on 127.0.0.1",
        if args.fsync { "on" } else { "off" },
    );
    println!(
        "  {} tables of {} tuples; mixes {}; closed-loop clients {:?}, {} s each",
        w.tables,
        w.rows,
        w.mixes
            .iter()
            .map(|m| mix_label(*m))
            .collect::<Vec<_>>()
            .join(", "),
        w.clients,
        w.seconds
    );

    if !cluster.down.is_empty() {
        println!(
            "  then redoubt again with {} (killed once the cluster is up, never restarted)",
            cluster.down_label()
        );
    }
    let systems = cluster.systems(false);
    let mut progress = Progress::new(systems.len() * (1 + w.mixes.len() * w.clients.len()));
    let mut runs = Vec::new();
    for system in systems {
        if system.replicated() {
            cluster.fresh_homes()?;
        }
        let mut procs = cluster.replicas();
        let result = run_system(system, &cluster, &mut procs, &w, &mut progress).await;
        procs.stop_all(Duration::from_secs(5));
        runs.push((system, result?));
    }
    progress.finish();

    let report = report(&w, &runs, cores, &cluster);
    print!("{report}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv = args.out.join("sql.csv");
    let mut text = format!("system,updates_pct,{}\n", Sample::CSV_HEADER);
    for (_, run) in &runs {
        for p in &run.points {
            let _ = writeln!(text, "{},{},{}", p.system.name(), p.mix, p.s.csv());
        }
    }
    std::fs::write(&csv, text)?;
    let md = args.out.join("sql.md");
    std::fs::write(&md, &report)?;
    let svg = args.out.join("sql.svg");
    let mut series = Vec::new();
    for (system, run) in &runs {
        for &mix in &w.mixes {
            let mut pts: Vec<&Point> = run.points.iter().filter(|p| p.mix == mix).collect();
            pts.sort_by_key(|p| p.s.clients);
            series.push(Series {
                name: format!("{}, {}", system.name(), mix_label(mix)),
                points: pts
                    .iter()
                    .map(|p| (p.s.ops_per_s, p.s.p50_ms, p.s.clients))
                    .collect(),
            });
        }
    }
    plot(
        &svg,
        &format!("SQL, {} tables of {} tuples", w.tables, w.rows),
        &series,
    )?;
    println!(
        "\nwrote {}, {} and {}",
        csv.display(),
        md.display(),
        svg.display()
    );
    drop(cluster);
    Ok(ExitCode::SUCCESS)
}

/// Starts `system`, loads the database and measures every mix at every client count, then
/// checks the values against the updates acknowledged.
async fn run_system(
    system: System,
    cluster: &versus::Cluster,
    procs: &mut ReplicaProcs,
    w: &Workload,
    progress: &mut Progress,
) -> anyhow::Result<Run> {
    let max_clients = *w.clients.iter().max().expect("non-empty");
    let cfg = cluster.config_of(system).1;
    let baseline = versus::start(system, cluster, procs, None, None).await?;
    let pool = versus::connect(cfg, system, max_clients, false).await?;
    let sqls: Vec<SqlClient> = pool.iter().cloned().map(SqlClient::new).collect();
    // The baseline may still be starting: wait until it answers.
    let deadline = Instant::now() + Duration::from_secs(20);
    let probe = sqls[0].with_deadline(Duration::from_secs(2));
    while let Err(e) = probe.query(Statement::new("SELECT 1")).await {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} does not answer: {e}",
            system.name()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let started = Instant::now();
    load(&sqls[0], w.tables, w.rows)
        .await
        .with_context(|| format!("loading the database into {}", system.name()))?;
    let load_s = started.elapsed().as_secs_f64();
    progress.step(&format!("{} load", system.name()));

    let server_pids = versus::server_pids(baseline.as_ref(), procs);
    // The primary orders every batch: its counters give the batch sizes (replica 0's, or
    // with replica 0 down the first that runs: a backup's log holds the same batches).
    let metrics = system
        .replicated()
        .then(|| {
            cfg.replicas
                .iter()
                .find(|r| system == System::Redoubt || !cluster.down.contains(&r.id))
                .map(|r| r.metrics_addr)
        })
        .flatten();
    let updates_sql: Arc<Vec<String>> = Arc::new(
        (0..w.tables)
            .map(|t| format!("UPDATE t{t} SET v = v + 1 WHERE id = $1"))
            .collect(),
    );
    let queries_sql: Arc<Vec<String>> = Arc::new(
        (0..w.tables)
            .map(|t| format!("SELECT v FROM t{t} WHERE id = $1"))
            .collect(),
    );
    let updates = Arc::new(AtomicU64::new(0));
    let mut points = Vec::new();
    for &mix in &w.mixes {
        for &n in &w.clients {
            let steps: Vec<_> = sqls
                .iter()
                .take(n as usize)
                .enumerate()
                .map(|(i, c)| {
                    let (c, updates) = (c.clone(), updates.clone());
                    let (updates_sql, queries_sql) = (updates_sql.clone(), queries_sql.clone());
                    let mut pick = Pick((u64::from(mix) << 40) ^ (u64::from(n) << 20) ^ i as u64);
                    let (tables, rows) = (w.tables, w.rows);
                    move || {
                        let update = pick.below(100) < mix;
                        let t = pick.below(tables) as usize;
                        let id = Value::Integer(i64::from(pick.below(rows)));
                        let (c, updates) = (c.clone(), updates.clone());
                        let sql = (if update { &updates_sql } else { &queries_sql })[t].clone();
                        async move {
                            let stmt = Statement::with_params(sql, vec![id]);
                            if update {
                                let r = c.write(vec![stmt], Vec::new()).await?;
                                anyhow::ensure!(
                                    r.first().is_some_and(|r| r.changes == 1),
                                    "an update changed no row: {r:?}"
                                );
                                updates.fetch_add(1, Ordering::Relaxed);
                            } else {
                                let r = c.query(stmt).await?;
                                anyhow::ensure!(r.rows.len() == 1, "a query returned {r:?}");
                            }
                            Ok(())
                        }
                    }
                })
                .collect();
            let s = closed_loop(&pool[..n as usize], steps, w.seconds, &server_pids, metrics)
                .await
                .with_context(|| format!("{}, {}, {n} clients", system.name(), mix_label(mix)))?;
            points.push(Point { system, mix, s });
            progress.step(&format!("{} {} {n} clients", system.name(), mix_label(mix)));
        }
    }

    // Every acknowledged update added one, and nothing else did.
    let sum = (0..w.tables)
        .map(|t| format!("(SELECT total(v) FROM t{t})"))
        .collect::<Vec<_>>()
        .join(" + ");
    let r = sqls[0]
        .query(Statement::new(format!("SELECT CAST({sum} AS INTEGER)")))
        .await?;
    let updates = updates.load(Ordering::Relaxed);
    let found = match r.rows.first().and_then(|row| row.first()) {
        Some(Value::Integer(v)) => *v,
        other => anyhow::bail!("the check query returned {other:?}"),
    };
    anyhow::ensure!(
        found == updates as i64,
        "{}: the values sum to {found}, but {updates} updates were acknowledged",
        system.name()
    );
    drop(baseline);
    Ok(Run {
        points,
        load_s,
        updates,
    })
}

/// Creates the tables and loads their tuples, `LOAD_BATCH` INSERTs per ordered operation.
async fn load(sql: &SqlClient, tables: u32, rows: u32) -> anyhow::Result<()> {
    let create = (0..tables)
        .map(|t| {
            Statement::new(format!(
                "CREATE TABLE t{t} (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, name TEXT NOT NULL, f REAL NOT NULL, d TEXT NOT NULL)"
            ))
        })
        .collect();
    sql.write(create, Vec::new()).await?;
    for t in 0..tables {
        let insert = format!("INSERT INTO t{t} VALUES ($1, 0, $2, $3, $4)");
        for first in (0..rows).step_by(LOAD_BATCH as usize) {
            let batch = (first..(first + LOAD_BATCH).min(rows))
                .map(|i| {
                    Statement::with_params(
                        insert.clone(),
                        vec![
                            Value::Integer(i64::from(i)),
                            Value::Text(format!("{:<50}", format!("table {t} tuple {i}"))),
                            Value::Real(f64::from(i) / 8.0),
                            Value::Text(format!("2004-{:02}-{:02}", 1 + i % 12, 1 + i % 28)),
                        ],
                    )
                })
                .collect();
            sql.write(batch, Vec::new()).await?;
        }
    }
    Ok(())
}

/// The report: what was measured, on what, how to run it again, and the figures.
fn report(w: &Workload, runs: &[(System, Run)], cores: usize, cluster: &versus::Cluster) -> String {
    let args: String = std::env::args().skip(3).map(|a| format!(" {a}")).collect();
    let mut r = format!(
        "Run in a checkout at commit {} with `redoubt bench sql{args}`, on {cores} cores.\n\n",
        source_commit()
    );
    let _ = writeln!(
        r,
        "The workload of the JHU database replication experiments: {} tables of {} tuples (two integers, a 50-character string, a float and a date), loaded {LOAD_BATCH} INSERTs per ordered operation, then closed-loop clients with one transaction outstanding each, every transaction one update (`UPDATE tN SET v = v + 1 WHERE id = $1`, ordered) or one query (`SELECT v FROM tN WHERE id = $1`, read-only path) of a random tuple; {} s per point. redoubt: 4 replicas (f = 1) in separate processes; baseline: the same SQL service in one server process (`redoubt baseline`), no agreement, the same client library and protocol. Every process, the clients included, runs on this one machine and talks over 127.0.0.1: the servers and the clients share the {cores} cores.",
        w.tables, w.rows, w.seconds
    );
    let find = |system: System, mix: u32, n: u32| {
        runs.iter()
            .find(|(s, _)| *s == system)
            .and_then(|(_, run)| run.points.iter().find(|p| p.mix == mix && p.s.clients == n))
    };
    let _ = writeln!(
        r,
        "\nThroughput (transactions/s) and latency (ms) by clients:\n\n| mix | clients | baseline ops/s | p50 | p99 | redoubt ops/s | p50 | p99 | redoubt / baseline |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for &mix in &w.mixes {
        for &n in &w.clients {
            if let (Some(b), Some(x)) = (
                find(System::Baseline, mix, n),
                find(System::Redoubt, mix, n),
            ) {
                let _ = writeln!(
                    r,
                    "| {} | {n} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} |",
                    mix_label(mix),
                    b.s.ops_per_s,
                    b.s.p50_ms,
                    b.s.p99_ms,
                    x.s.ops_per_s,
                    x.s.p50_ms,
                    x.s.p99_ms,
                    x.s.ops_per_s / b.s.ops_per_s
                );
            }
        }
    }
    let peak = |system: System, mix: u32| {
        runs.iter()
            .filter(|(s, _)| *s == system)
            .flat_map(|(_, run)| run.points.iter().filter(|p| p.mix == mix))
            .max_by(|a, b| a.s.ops_per_s.total_cmp(&b.s.ops_per_s))
    };
    let _ = writeln!(
        r,
        "\nPeak throughput over the client counts (transactions/s), and CPU time per transaction there (µs: the server processes together, and the benchmark's clients, which share the same cores):\n\n| mix | baseline | at clients | redoubt | at clients | redoubt / baseline | baseline server CPU | redoubt replicas CPU | baseline clients CPU | redoubt clients CPU |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for &mix in &w.mixes {
        if let (Some(b), Some(x)) = (peak(System::Baseline, mix), peak(System::Redoubt, mix)) {
            let _ = writeln!(
                r,
                "| {} | {:.0} | {} | {:.0} | {} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
                mix_label(mix),
                b.s.ops_per_s,
                b.s.clients,
                x.s.ops_per_s,
                x.s.clients,
                x.s.ops_per_s / b.s.ops_per_s,
                b.s.server_cpu_us,
                x.s.server_cpu_us,
                b.s.client_cpu_us,
                x.s.client_cpu_us
            );
        }
    }
    if !cluster.down.is_empty() {
        let down = cluster.down_label();
        let _ = writeln!(
            r,
            "\nWith {down} (killed once the cluster was up, never restarted), against the healthy cluster of this run:\n\n| mix | clients | healthy ops/s | p50 | p99 | down ops/s | p50 | p99 | down / healthy |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for &mix in &w.mixes {
            for &n in &w.clients {
                if let (Some(h), Some(d)) = (
                    find(System::Redoubt, mix, n),
                    find(System::Degraded, mix, n),
                ) {
                    let _ = writeln!(
                        r,
                        "| {} | {n} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} |",
                        mix_label(mix),
                        h.s.ops_per_s,
                        h.s.p50_ms,
                        h.s.p99_ms,
                        d.s.ops_per_s,
                        d.s.p50_ms,
                        d.s.p99_ms,
                        d.s.ops_per_s / h.s.ops_per_s
                    );
                }
            }
        }
    }
    let _ = writeln!(r);
    for (system, run) in runs {
        let tuples = w.tables * w.rows;
        let _ = writeln!(
            r,
            "{}: loaded {tuples} tuples in {:.2} s ({:.0} tuples/s); after the mixes the values summed to the {} updates acknowledged.",
            system.name(),
            run.load_s,
            f64::from(tuples) / run.load_s,
            run.updates
        );
    }
    r
}
