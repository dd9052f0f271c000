//! `redoubt replica`: runs one replica, hosting the service its cluster file names ([state]
//! service: kv, sql or files), until SIGTERM or SIGINT.

use crate::EXIT_FAILURE;
use clap::{Args, ValueEnum};
use redoubt_config::ClusterConfig;
use redoubt_node::logging::LogFormat;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ReplicaArgs {
    /// The cluster configuration file (written by `redoubt init`)
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// Which replica of the configuration to run
    #[arg(long, value_name = "I")]
    id: u32,
    /// Log format on stderr [default: `[node] log_format` of the config file, else human]
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<Format>,
    /// Recover after restoring (proactive recovery; `redoubt monitor` passes it)
    #[arg(long)]
    recover: bool,
    /// When the watchdog fired (Unix ms), for the recovery breakdown (set by the monitor)
    #[arg(long, value_name = "MS", requires = "recover")]
    watchdog_at_ms: Option<u64>,
    /// How long the previous process took to save its state and stop (ms; set by the monitor)
    #[arg(long, value_name = "MS", default_value_t = 0)]
    save_ms: u64,
    /// The monitor's watchdog period T_w (ms), exported as a metric
    #[arg(long, value_name = "MS", default_value_t = 0)]
    watchdog_period_ms: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// Readable lines
    Human,
    /// One JSON object per line
    Json,
}

pub fn run(args: ReplicaArgs) -> ExitCode {
    let format = match args.log_format {
        Some(Format::Human) => LogFormat::Human,
        Some(Format::Json) => LogFormat::Json,
        // A config that does not load is reported by the replica itself, below.
        None => ClusterConfig::load(&args.config)
            .ok()
            .and_then(|c| c.node.log_format.parse().ok())
            .unwrap_or(LogFormat::Human),
    };
    redoubt_node::logging::init(format);
    let threads = ClusterConfig::load(&args.config)
        .map(|c| c.node.worker_threads)
        .unwrap_or(1);
    let rt = match crate::runtime_with(threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: replica {}: {}", args.id, crate::report(&e));
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let opts = redoubt_node::runtime::RunOptions {
        recover: args.recover,
        watchdog_at_ms: args.watchdog_at_ms,
        save_ms: args.save_ms,
        watchdog_period_ms: args.watchdog_period_ms,
    };
    // `redoubt replica` hosts the built-in service the cluster file names ([state] service);
    // another service is hosted by its own binary calling `redoubt_node::run_replica` (see
    // examples/counter).
    let service = match hosted_service(&args.config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: replica {}: {e}", args.id);
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match rt.block_on(redoubt_node::run_replica(
        &args.config,
        args.id,
        opts,
        service,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: replica {}: {e}", args.id);
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// The built-in service the cluster file at `config` names. A file that does not load is
/// reported by the node itself, with its reasons: the default service stands in until then.
pub fn hosted_service(
    config: &std::path::Path,
) -> Result<redoubt_services::hosted::Hosted, String> {
    let kind = ClusterConfig::load(config)
        .map(|c| c.state.service)
        .unwrap_or_else(|_| "kv".into());
    redoubt_services::hosted::Hosted::named(&kind)
}
