//! `redoubt keyholder`: runs a replica's key holder on its Unix socket until SIGTERM or
//! SIGINT (`redoubt monitor` runs one itself; this command is for deployments that supervise
//! replicas some other way).

use clap::Args;
use redoubt_config::ClusterConfig;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct KeyholderArgs {
    /// The cluster configuration file
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// The replica whose key holder to run (with --executor: the execution node)
    #[arg(long, value_name = "I")]
    id: u32,
    /// Run the key holder of execution node I (separated deployment) instead of replica I
    #[arg(long)]
    executor: bool,
}

/// Opens replica `id`'s key-holder file and serves it on its socket; returns the socket path
/// and a handle on the holder.
pub fn start_key_holder(
    cfg: &ClusterConfig,
    id: u32,
) -> anyhow::Result<redoubt_node::holder::Served> {
    Ok(redoubt_node::holder::serve_kept(
        cfg,
        redoubt_core::Principal::Replica(id),
    )?)
}

pub fn run(args: KeyholderArgs) -> anyhow::Result<ExitCode> {
    redoubt_node::logging::init(redoubt_node::logging::LogFormat::Human);
    let cfg = ClusterConfig::load(&args.config)?;
    let socket = if args.executor {
        cfg.executor(args.id)?;
        redoubt_node::holder::serve_for(&cfg, redoubt_core::Principal::Executor(args.id))?
    } else {
        cfg.replica(args.id)?;
        start_key_holder(&cfg, args.id)?.socket
    };
    tracing::info!(replica = args.id, socket = %socket.display(), "key holder serving");
    let rt = crate::runtime_with(1)?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        anyhow::Ok(())
    })?;
    let _ = std::fs::remove_file(&socket);
    tracing::info!(replica = args.id, "key holder stopped");
    Ok(ExitCode::SUCCESS)
}
