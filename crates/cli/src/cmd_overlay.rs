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
    rt.block_on(redoubt_overlayd::run(file, id))?;
    Ok(ExitCode::SUCCESS)
}
