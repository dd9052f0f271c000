//! `redoubt pin`: pins an executable in the cluster file (`[recovery] executable_blake3`), the
//! first step of a rolling upgrade: install the new executable at the monitors' path, pin it,
//! then send each monitor SIGHUP in turn (see docs/operations.md, "Upgrading").

use anyhow::Context as _;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct PinArgs {
    /// The cluster configuration file to update (each host's copy needs the same pin)
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// The executable to pin [default: the one running this command]
    #[arg(long, value_name = "PATH")]
    executable: Option<PathBuf>,
}

pub fn run(args: PinArgs) -> anyhow::Result<ExitCode> {
    let exe = match args.executable {
        Some(p) => p,
        None => std::env::current_exe().context("cannot locate this executable")?,
    };
    let hash = redoubt_localcluster::file_blake3(&exe)
        .with_context(|| format!("cannot read {}", exe.display()))?;
    let old = redoubt_config::pin_executable(&args.config, &hash)?;
    let config = args.config.display();
    if old == hash {
        println!("{config} already pins {hash} ({})", exe.display());
    } else {
        println!(
            "{config} now pins {hash} ({}){}",
            exe.display(),
            if old.is_empty() {
                String::new()
            } else {
                format!(", not {old}")
            }
        );
        println!(
            "Next: copy the file to every replica host, then send each monitor SIGHUP in turn \
             (kill -HUP <monitor pid>) and wait until `redoubt status --config {config}` shows \
             that replica on the pinned executable before the next."
        );
    }
    Ok(ExitCode::SUCCESS)
}
