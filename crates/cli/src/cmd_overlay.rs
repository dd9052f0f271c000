//! `redoubt overlay`: one overlay daemon (Spines-style links, link-state or ODSBR routing,
//! user-space WAN emulation, frame tunnels for replicas; `docs/operations.md`). Runs until
//! SIGTERM or SIGINT; SIGHUP rereads the file's links and faulty entries, SIGUSR1 logs the
//! status line.

use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct OverlayArgs {
    /// The overlay file (TOML, see docs/configuration.md#overlay-file)
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// This daemon's node id
    #[arg(long, value_name = "N")]
    id: u16,
}

pub fn run(args: OverlayArgs) -> anyhow::Result<ExitCode> {
    redoubt_node::logging::init(redoubt_node::logging::LogFormat::Human);
    let file = redoubt_overlayd::OverlayFile::load(&args.config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(redoubt_overlayd::run(file, args.id))?;
    Ok(ExitCode::SUCCESS)
}
