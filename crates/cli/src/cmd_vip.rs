//! `redoubt vip`: one member of a virtual-address fail-over group (Wackamole; `docs/vip.md`).
//! Runs until SIGTERM or SIGINT, then releases its addresses and leaves the group.

use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct VipArgs {
    /// The group's configuration file (TOML, see docs/vip.md)
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// This server's member id [default: the file's `id`]
    #[arg(long, value_name = "N")]
    id: Option<u32>,
}

pub fn run(args: VipArgs) -> anyhow::Result<ExitCode> {
    redoubt_node::logging::init(redoubt_node::logging::LogFormat::Human);
    redoubt_vip::run_vip(&args.config, args.id)?;
    Ok(ExitCode::SUCCESS)
}
