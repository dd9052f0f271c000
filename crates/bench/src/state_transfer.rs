//! `redoubt bench state-transfer`: a 4-replica cluster whose key-value state fills `--state-mib` MiB; one
//! replica is stopped while `--dirty-percent` of the pages are rewritten (and the others move
//! past its log window), then restarted: it must fetch exactly what changed. Then the same
//! replica is restarted with an empty disk, so it fetches the whole state through the same
//! protocol: the whole-state copy to compare with. The table shows, for both, the bytes of
//! state-transfer answers it received, their ratio to the state size, and the time from the
//! restart until it had caught up.

use super::common::{
    empty_home, kv_cluster, put_all, record_bytes, wait_for, PHASE_TIMEOUT, STATUS_TIMEOUT,
    VALUE_BYTES,
};
use anyhow::Context as _;
use clap::Args;
use redoubt_client::kv::KvClient;
use redoubt_config::ClusterConfig;
use redoubt_localcluster::probe::{agreement, fetch, fetch_all};
use redoubt_localcluster::procs::{log_tail, ReplicaProcs};
use redoubt_node::status::StatusReport;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct StateTransferArgs {
    /// Size of the service state (MiB); the key-value store is filled to about 95% of it
    #[arg(long, value_name = "MIB", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(4..=65536))]
    state_mib: u64,
    /// Percentage of the state's pages rewritten while the replica is stopped
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    dirty_percent: f64,
    /// Concurrent clients used to fill and rewrite the state
    #[arg(long, value_name = "K", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    clients: u32,
    /// Append the results as CSV rows to FILE (a header is written if the file is new)
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Put the cluster in DIR and keep it, instead of a temporary directory
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
}

/// The victim.
const VICTIM: u32 = 3;

/// One row of the result table.
struct Row {
    what: String,
    /// Short label for the CSV.
    label: &'static str,
    bytes: u64,
    /// Every byte the replica received from restart until caught up (transfer, log
    /// retransmission, status, client traffic).
    all_bytes: u64,
    pages: u64,
    metas: u64,
    restart_to_caught_up: Duration,
    up_to_caught_up: Duration,
}

pub(super) fn run(a: StateTransferArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        a.dirty_percent > 0.0 && a.dirty_percent <= 100.0,
        "--dirty-percent {} must be in (0, 100]",
        a.dirty_percent
    );
    redoubt_localcluster::runtime(2)?.block_on(state_transfer(a))
}

async fn state_transfer(args: StateTransferArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let (tempdir, dir) =
        redoubt_localcluster::procs::work_dir(args.keep.as_deref(), "redoubt-bench-")?;
    let (config_path, mut cfg) = kv_cluster("bench-state-transfer", args.clients, &dir, false)?;
    cfg.state.size_mib = args.state_mib;
    // A short log, so the rewrite moves the others past the stopped replica's window.
    cfg.protocol.checkpoint_interval = 32;
    cfg.protocol.log_size = 64;
    // Peers queue frames for an unreachable replica and deliver them when it comes back; with
    // the default queue (8192 frames) the restarted replica would replay the rewrite batches
    // from those queued protocol messages instead of fetching state. A short queue keeps only
    // the latest frames, so the benchmark measures the transfer.
    cfg.node.peer_queue_frames_max = 64;
    std::fs::write(&config_path, cfg.to_toml()?)?;
    let cfg = ClusterConfig::load(&config_path)?;
    let geo = cfg.state.geometry().map_err(anyhow::Error::msg)?;
    let state_bytes = geo.size();
    println!(
        "redoubt bench state-transfer: 4 replicas, {} MiB of state ({} pages of {} B, fan-out {}, depth {}), {}% of pages rewritten",
        args.state_mib,
        geo.pages(),
        geo.page_size(),
        geo.fanout(),
        geo.depth(),
        args.dirty_percent
    );
    println!("  directory  {}", dir.display());

    let mut procs = ReplicaProcs::new(exe, config_path.clone(), dir.clone(), 4);
    let result = bench_body(&args, &cfg, &mut procs, state_bytes).await;
    procs.stop_all(Duration::from_secs(5));
    let rows = match result {
        Ok(r) => r,
        Err(e) => {
            if let Some(t) = tempdir {
                let kept = t.keep();
                eprintln!(
                    "kept the cluster directory for inspection: {}",
                    kept.display()
                );
            }
            return Err(e);
        }
    };
    drop(tempdir);

    println!();
    println!(
        "| transfer | state-transfer bytes | of the state | all bytes received | of the state | pages | meta-data | restart to caught up | status up to caught up |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.1} MiB | {:.2}% | {:.1} MiB | {:.2}% | {} | {} | {:.1} s | {:.1} s |",
            r.what,
            r.bytes as f64 / (1 << 20) as f64,
            100.0 * r.bytes as f64 / state_bytes as f64,
            r.all_bytes as f64 / (1 << 20) as f64,
            100.0 * r.all_bytes as f64 / state_bytes as f64,
            r.pages,
            r.metas,
            r.restart_to_caught_up.as_secs_f64(),
            r.up_to_caught_up.as_secs_f64()
        );
    }
    if let Some(path) = &args.csv {
        let new = !path.exists();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        if new {
            writeln!(
                f,
                "state_mib,dirty_percent,transfer,bytes_received,ratio_to_state,all_bytes_received,all_ratio_to_state,pages,metas,restart_to_caught_up_s,status_up_to_caught_up_s"
            )?;
        }
        for r in &rows {
            writeln!(
                f,
                "{},{},{},{},{:.6},{},{:.6},{},{},{:.3},{:.3}",
                args.state_mib,
                args.dirty_percent,
                r.label,
                r.bytes,
                r.bytes as f64 / state_bytes as f64,
                r.all_bytes,
                r.all_bytes as f64 / state_bytes as f64,
                r.pages,
                r.metas,
                r.restart_to_caught_up.as_secs_f64(),
                r.up_to_caught_up.as_secs_f64()
            )?;
        }
        println!("\nappended to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

async fn bench_body(
    args: &StateTransferArgs,
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
    state_bytes: u64,
) -> anyhow::Result<Vec<Row>> {
    for i in 0..4 {
        procs.start(i)?;
    }
    wait_for(cfg, procs, "the replicas to come up", |p| {
        agreement(p).is_some_and(|a| a.replicas == 4)
    })
    .await?;
    let mut kvs = Vec::new();
    for c in 1..=u64::from(args.clients) {
        kvs.push(KvClient::connect(redoubt_client::ClientSetup::from_cluster(cfg, c)?).await?);
    }

    // Fill.
    let record_bytes = record_bytes();
    let records = state_bytes * 95 / 100 / record_bytes;
    let t = Instant::now();
    put_all(&kvs, (0..records).map(|i| (i, 0)).collect()).await?;
    let fill = t.elapsed();
    println!(
        "filled {records} records of {} KiB ({:.0} MiB) in {:.1} s ({:.1} MiB/s)",
        VALUE_BYTES >> 10,
        (records * record_bytes) as f64 / (1 << 20) as f64,
        fill.as_secs_f64(),
        (records * record_bytes) as f64 / (1 << 20) as f64 / fill.as_secs_f64()
    );
    settle(cfg, procs).await?;

    // Incremental: stop, rewrite, restart.
    let mut rows = Vec::new();
    let pages = state_bytes / 4096;
    let dirty_pages = ((pages as f64) * args.dirty_percent / 100.0).ceil() as u64;
    let pages_per_record = record_bytes.div_ceil(4096).max(1);
    let rewrites = dirty_pages.div_ceil(pages_per_record).min(records);
    let stride = (records / rewrites.max(1)).max(1);
    let chosen: Vec<(u64, u64)> = (0..rewrites).map(|j| ((j * stride) % records, 1)).collect();
    let before = max_executed(cfg).await;
    procs.kill(VICTIM)?;
    println!(
        "replica {VICTIM} stopped at sequence number {before}; rewriting {rewrites} records (~{dirty_pages} pages, {}%)",
        args.dirty_percent
    );
    put_all(&kvs, chosen).await?;
    let rewritten = max_executed(cfg).await;
    advance_past_window(cfg, &kvs[0]).await?;
    println!(
        "the others executed the rewrites up to {rewritten} and moved on to {}",
        max_executed(cfg).await
    );
    rows.push(
        restart_and_measure(
            cfg,
            procs,
            format!("page-level, {}% dirty", args.dirty_percent),
            "page-level",
        )
        .await?,
    );

    // Whole-state copy: the same replica restarted with an empty disk.
    settle(cfg, procs).await?;
    procs.kill(VICTIM)?;
    empty_home(cfg, VICTIM)?;
    println!("replica {VICTIM} stopped and its disk emptied");
    advance_past_window(cfg, &kvs[0]).await?;
    rows.push(
        restart_and_measure(cfg, procs, "whole state (empty disk)".into(), "whole-state").await?,
    );
    Ok(rows)
}

/// Small sequential writes until the cluster has executed three log windows more, so the
/// stopped replica cannot catch up from the others' logs alone.
async fn advance_past_window(cfg: &ClusterConfig, kv: &KvClient) -> anyhow::Result<()> {
    let target = max_executed(cfg).await + 3 * cfg.protocol.log_size;
    let mut n = 0u64;
    while max_executed(cfg).await < target {
        for _ in 0..16 {
            kv.put(b"filler".to_vec(), n.to_le_bytes().to_vec())
                .await
                .map_err(|e| anyhow::anyhow!("filler put failed: {e}"))?;
            n += 1;
        }
    }
    Ok(())
}

async fn max_executed(cfg: &ClusterConfig) -> u64 {
    fetch_all(cfg, STATUS_TIMEOUT)
        .await
        .iter()
        .flatten()
        .map(|s| s.last_executed)
        .max()
        .unwrap_or(0)
}

/// Waits until the running replicas agree on the last executed batch and it is checkpointed.
async fn settle(cfg: &ClusterConfig, procs: &mut ReplicaProcs) -> anyhow::Result<()> {
    wait_for(cfg, procs, "the replicas to settle", |p| {
        let up: Vec<&StatusReport> = p.iter().flatten().collect();
        up.len() == 4
            && up
                .windows(2)
                .all(|w| w[0].last_executed == w[1].last_executed)
            && up.iter().all(|s| s.normal)
    })
    .await
}

async fn restart_and_measure(
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
    what: String,
    label: &'static str,
) -> anyhow::Result<Row> {
    let target = max_executed(cfg).await;
    let victim = cfg.replica(VICTIM)?.metrics_addr;
    let started = Instant::now();
    procs.start(VICTIM)?;
    let mut up_at = None;
    let deadline = started + PHASE_TIMEOUT;
    loop {
        if let Some(status) = procs.exited(VICTIM) {
            anyhow::bail!(
                "replica {VICTIM} exited ({status}); last lines of its log:\n{}",
                log_tail(&procs.log_path(VICTIM), 12)
            );
        }
        if let Ok(s) = fetch(victim, STATUS_TIMEOUT).await {
            let up = *up_at.get_or_insert_with(Instant::now);
            if s.state_transfers >= 1 && s.last_executed >= target {
                let row = Row {
                    what,
                    label,
                    bytes: s.transfer_bytes_in,
                    all_bytes: s.bytes_received,
                    pages: s.transfer_pages,
                    metas: s.transfer_metas,
                    restart_to_caught_up: started.elapsed(),
                    up_to_caught_up: up.elapsed(),
                };
                println!(
                    "replica {VICTIM} caught up to {} in {:.1} s, receiving {:.1} MiB of state transfer, {:.1} MiB in all ({:.2}% of the state)",
                    s.last_executed,
                    row.restart_to_caught_up.as_secs_f64(),
                    row.bytes as f64 / (1 << 20) as f64,
                    row.all_bytes as f64 / (1 << 20) as f64,
                    100.0 * row.bytes as f64 / cfg.state.geometry().map_err(anyhow::Error::msg)?.size() as f64
                );
                return Ok(row);
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "replica {VICTIM} did not catch up within {} s (log: {})",
            PHASE_TIMEOUT.as_secs(),
            procs.log_path(VICTIM).display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
