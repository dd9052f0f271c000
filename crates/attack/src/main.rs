//! `redoubt-attack`: faulty replicas and clients for the attack benchmark
//! (`redoubt bench attack`) and tests. Not part of a deployment: a correct cluster never runs
//! this binary, and `redoubt` itself contains none of these behaviours.
//!
//! A faulty replica is the shipped runtime and protocol core with its outgoing frames changed
//! (delayed, dropped or multiplied) from `--start-after-ms` on; it never suspects itself or
//! anyone else (its own view-change timers are switched off). A faulty client is the shipped
//! client library with each request's authenticator rewritten.

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use redoubt_attack::client;
use redoubt_attack::replica::{self, ReplicaAttack};
use redoubt_config::ClusterConfig;
use redoubt_node::logging::LogFormat;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "redoubt-attack", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs replica I of a cluster as a faulty replica (until SIGTERM or SIGINT)
    Replica(ReplicaArgs),
    /// Runs client C as a faulty client whose requests verify at one replica each
    Client(ClientArgs),
}

#[derive(Args)]
struct ReplicaArgs {
    /// The cluster configuration file
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Which replica of the configuration to run
    #[arg(long, value_name = "I")]
    id: u32,
    /// The behaviour
    #[arg(long, value_enum)]
    attack: ReplicaAttack,
    /// Behave correctly for this long first (ms)
    #[arg(long, value_name = "MS", default_value_t = 0)]
    start_after_ms: u64,
    /// Start when this file exists instead (checked every 50 ms)
    #[arg(long, value_name = "FILE", conflicts_with = "start_after_ms")]
    start_when_exists: Option<PathBuf>,
    /// Delay of slow-primary and slow-acks (ms) [default: 40% of the cluster's
    /// view_change_timeout_ms: a request may wait for two proposals, and a PBFT backup
    /// suspects the primary when one waits the whole timeout]
    #[arg(long, value_name = "MS")]
    delay_ms: Option<u64>,
    /// The replica withhold starves [default: the last replica, or the one before it for the
    /// last]
    #[arg(long, value_name = "R")]
    target: Option<u32>,
    /// Extra frames a second of flood
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    rate: u64,
}

#[derive(Args)]
struct ClientArgs {
    /// The cluster configuration file
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Which client of the configuration to be
    #[arg(long, value_name = "C")]
    client: u64,
    /// Wait this long before the first request (ms)
    #[arg(long, value_name = "MS", default_value_t = 0)]
    start_after_ms: u64,
    /// Stop after this long (s; 0: until killed)
    #[arg(long, value_name = "S", default_value_t = 0)]
    duration_s: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    redoubt_node::logging::init(LogFormat::Json);
    let result = match cli.command {
        Command::Replica(a) => run_replica(a),
        Command::Client(a) => run_client(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run_replica(a: ReplicaArgs) -> anyhow::Result<()> {
    let cfg = ClusterConfig::load(&a.config)?;
    let n = cfg.protocol.n();
    let delay = Duration::from_millis(
        a.delay_ms
            .unwrap_or(cfg.protocol.view_change_timeout_ms * 2 / 5),
    );
    let target = a
        .target
        .unwrap_or(if a.id == n - 1 { n - 2 } else { n - 1 });
    anyhow::ensure!(
        target < n && target != a.id,
        "--target must be another replica"
    );
    let start = match a.start_when_exists.clone() {
        Some(path) => replica::Start::WhenExists(path),
        None => replica::Start::At(Instant::now() + Duration::from_millis(a.start_after_ms)),
    };
    tracing::info!(replica = a.id, attack = ?a.attack, delay_ms = delay.as_millis() as u64, target, rate = a.rate, start_after_ms = a.start_after_ms, "faulty replica");
    let hooks = redoubt_node::Hooks::tampered(
        Box::new(replica::Attack::new(a.attack, start, delay, target, a.rate)),
        // A faulty replica never volunteers a view change, least of all against itself.
        Some(Box::new(|p: &mut redoubt_core::types::Config| {
            p.view_change_timeout_ms = 1 << 40;
            p.view_change_timeout_max_ms = 1 << 40;
        })),
    );
    runtime()?.block_on(redoubt_node::run_replica_with(
        &a.config,
        a.id,
        redoubt_node::runtime::RunOptions::default(),
        redoubt_services::kv::KvService::new(),
        hooks,
    ))?;
    Ok(())
}

fn run_client(a: ClientArgs) -> anyhow::Result<()> {
    let mut setup = redoubt_client::ClientSetup::from_config(&a.config, a.client)?;
    setup.rewrite = Some(client::big_mac_rewrite());
    runtime()?.block_on(async move {
        tokio::time::sleep(Duration::from_millis(a.start_after_ms)).await;
        let kv = redoubt_client::kv::KvClient::connect(setup).await?;
        let stop = (a.duration_s > 0).then(|| Instant::now() + Duration::from_secs(a.duration_s));
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut i = 0u64;
        while stop.is_none_or(|s| Instant::now() < s) {
            i += 1;
            match kv
                .set(format!("attack-{}", a.client), i.to_le_bytes().to_vec())
                .await
            {
                Ok(()) => ok += 1,
                Err(_) => failed += 1,
            }
        }
        tracing::info!(client = a.client, ok, failed, "faulty client done");
        anyhow::Ok(())
    })
}
