//! `redoubt overlay`: one overlay daemon (Spines-style links, link-state or ODSBR routing,
//! user-space WAN emulation, connection tunnels for replicas and clients;
//! `docs/operations.md`). Runs until SIGTERM or SIGINT; SIGHUP rereads the file's links and
//! faulty entries, SIGUSR1 logs the status line.
//!
//! `redoubt overlay keygen --config FILE` deals the nodes' key files.

use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct OverlayArgs {
    #[command(subcommand)]
    command: Option<OverlayCommand>,
    /// The overlay file (TOML, see docs/configuration.md#overlay-file)
    #[arg(long, value_name = "FILE", required = true)]
    config: Option<PathBuf>,
    /// This daemon's node id
    #[arg(long, value_name = "N", required = true)]
    id: Option<u16>,
}

#[derive(Subcommand)]
enum OverlayCommand {
    /// Deal fresh keys: write each node's key file (its `[[node]] key_file`, mode 0600) with
    /// the key it shares with every other node. The master they derive from is drawn here and
    /// never written. Copy each file to its node's host only.
    Keygen {
        /// The overlay file (TOML, see docs/configuration.md#overlay-file)
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Replace existing key files (every node then needs its new file)
        #[arg(long)]
        force: bool,
    },
}

pub fn run(args: OverlayArgs) -> anyhow::Result<ExitCode> {
    if let Some(OverlayCommand::Keygen { config, force }) = args.command {
        let file = redoubt_overlayd::OverlayFile::load(&config)?;
        let written = redoubt_overlayd::keys::deal(&file, force)?;
        for (i, path) in written.iter().enumerate() {
            println!("node {i}: {}", path.display());
        }
        println!(
            "wrote {} key files (mode 0600); copy each to its node's host only, beside the \
             overlay file as its key_file says, and keep no other copy",
            written.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(config), Some(id)) = (args.config, args.id) else {
        anyhow::bail!("redoubt overlay needs --config FILE and --id N (or `keygen --config FILE`)");
    };
    redoubt_node::logging::init(redoubt_node::logging::LogFormat::Human);
    let file = redoubt_overlayd::OverlayFile::load(&config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let metrics_addr = file.nodes.get(usize::from(id)).and_then(|n| n.metrics_addr);
    rt.block_on(async move {
        let (control, control_rx) = redoubt_overlayd::control_channel();
        if let Some(addr) = metrics_addr {
            serve_metrics(addr, control).await?;
        }
        redoubt_overlayd::run(file, id, control_rx).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// How often the metrics endpoint's figures are read from the daemon.
const METRICS_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves the daemon's `/metrics` (Prometheus), `/status` (its JSON status) and `/healthz` on
/// `addr`, from its status read through `control` every [`METRICS_REFRESH`].
async fn serve_metrics(
    addr: std::net::SocketAddr,
    control: tokio::sync::mpsc::Sender<redoubt_overlayd::Control>,
) -> anyhow::Result<()> {
    use std::sync::{Arc, Mutex};
    let latest = Arc::new(Mutex::new(serde_json::Value::Null));
    let shown = latest.clone();
    redoubt_node::metrics::serve_get(addr, move |path| {
        let status = shown.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match path {
            "/metrics" => Some((
                redoubt_node::metrics::METRICS_TYPE,
                redoubt_overlayd::metrics::prometheus_text(&status),
            )),
            "/status" => Some(("application/json", format!("{status}\n"))),
            "/healthz" => Some(("text/plain", "ok\n".into())),
            _ => None,
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("overlay metrics address {addr}: {e}"))?;
    tokio::spawn(async move {
        loop {
            let (tx, rx) = tokio::sync::oneshot::channel();
            if control
                .send(redoubt_overlayd::Control::Status(tx))
                .await
                .is_err()
            {
                return; // the daemon stopped
            }
            if let Ok(status) = rx.await {
                *latest.lock().unwrap_or_else(|e| e.into_inner()) = status;
            }
            tokio::time::sleep(METRICS_REFRESH).await;
        }
    });
    Ok(())
}
