//! `redoubt sql-dump`: the SQL database in a snapshot (`redoubt snapshot`) as SQL text that
//! `psql -f` through `redoubt sql-gateway` restores into an empty cluster.

use anyhow::{bail, Context as _};
use clap::Args;
use redoubt_core::state::{FlatState, StateWrite};
use redoubt_node::snapshot::Snapshot;
use std::io::Write as _;
use std::path::PathBuf;

/// Largest state `sql-dump` reads into memory (bytes).
const STATE_BYTES_MAX: u64 = 16 << 30;

#[derive(Args)]
pub struct SqlDumpArgs {
    /// A snapshot of a cluster of the sql service (`redoubt snapshot`)
    #[arg(value_name = "SNAPSHOT")]
    snapshot: PathBuf,
    /// Where to write the SQL [default: stdout]
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub fn run(args: SqlDumpArgs) -> anyhow::Result<()> {
    let path = &args.snapshot;
    let snap = Snapshot::read(path)?;
    snap.verify()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if snap.header.service != "sql" {
        bail!(
            "{} holds a {} state, not an SQL database",
            path.display(),
            snap.header.service
        );
    }
    let page = u64::from(snap.header.page_bytes);
    let bytes = snap.header.pages.saturating_mul(page);
    if bytes > STATE_BYTES_MAX {
        bail!(
            "{} holds a state of {bytes} bytes; sql-dump reads at most {STATE_BYTES_MAX} into memory",
            path.display()
        );
    }
    let mut state = FlatState::new(bytes);
    for (index, bytes) in &snap.pages {
        state.write(index * page, bytes);
    }
    let text = redoubt_services::sql::dump(&state)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    match &args.out {
        Some(out) => {
            std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    Ok(())
}
