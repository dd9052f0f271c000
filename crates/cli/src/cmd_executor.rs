//! `redoubt executor`: runs one execution node of a separated deployment (hosting the service
//! its cluster file names: kv, sql or files) until SIGTERM or SIGINT. With session keys its key holder runs in this process.
//! `redoubt filter`: runs one filter node of a firewall deployment (no keys, no state).

use crate::EXIT_FAILURE;
use clap::Args;
use redoubt_config::ClusterConfig;
use redoubt_core::Principal;
use redoubt_node::logging::LogFormat;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ExecutorArgs {
    /// The cluster configuration file (written by `redoubt init --execution M`)
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// Which execution node of the configuration to run
    #[arg(long, value_name = "I")]
    id: u32,
    /// Demonstrations and tests only: behave as a compromised execution node of a firewall
    /// deployment that tries to smuggle its state out through the filters
    #[arg(long, hide = true)]
    compromised_leak: bool,
}

pub fn run(args: ExecutorArgs) -> ExitCode {
    let cfg = match ClusterConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: execution node {}: {e}", args.id);
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    redoubt_node::logging::init(cfg.node.log_format.parse().unwrap_or(LogFormat::Human));
    if let Err(e) = cfg.executor(args.id) {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_FAILURE);
    }
    // Its key holder, in this process (an execution node does not recover proactively, so
    // no monitor restarts it).
    let socket = if cfg.keys.session() {
        match redoubt_node::holder::serve_for(&cfg, Principal::Executor(args.id)) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("error: execution node {}: {e}", args.id);
                return ExitCode::from(EXIT_FAILURE);
            }
        }
    } else {
        None
    };
    let rt = match crate::runtime_with(cfg.node.worker_threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: execution node {}: {}", args.id, crate::report(&e));
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let service = match crate::cmd_replica::hosted_service(&args.config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: execution node {}: {e}", args.id);
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let out = rt.block_on(redoubt_node::run_executor(
        &args.config,
        args.id,
        service,
        args.compromised_leak,
    ));
    if let Some(s) = socket {
        let _ = std::fs::remove_file(s);
    }
    match out {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: execution node {}: {e}", args.id);
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

#[derive(Args)]
pub struct FilterArgs {
    /// The cluster configuration file (written by `redoubt init --firewall H`)
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// Which filter node of the configuration to run
    #[arg(long, value_name = "I")]
    id: u32,
}

pub fn run_filter(args: FilterArgs) -> ExitCode {
    let cfg = match ClusterConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: filter node {}: {e}", args.id);
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    redoubt_node::logging::init(cfg.node.log_format.parse().unwrap_or(LogFormat::Human));
    let rt = match crate::runtime_with(cfg.node.worker_threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: filter node {}: {}", args.id, crate::report(&e));
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match rt.block_on(redoubt_node::run_filter(&args.config, args.id)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: filter node {}: {e}", args.id);
            ExitCode::from(EXIT_FAILURE)
        }
    }
}
