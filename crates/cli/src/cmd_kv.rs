//! `redoubt kv`: one key-value operation through the cluster.
//!
//! Output is meant for scripts as well as people: `get` writes the value alone (raw bytes and a
//! newline) on stdout, `scan` one `key<TAB>value` line per pair; everything else goes to
//! stderr. A negative answer (absent key, failed compare-and-swap) exits with status 3.

use crate::{show_bytes, EXIT_NEGATIVE};
use anyhow::Context as _;
use clap::{Args, Subcommand};
use redoubt_client::ClientSetup;
use redoubt_config::ClusterConfig;
use redoubt_core::ClientId;
use redoubt_services::kv::{KvClient, KvClientError};
use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct KvArgs {
    /// The cluster configuration file (written by `redoubt init`)
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Client id to act as; its key file is read from the configuration. Run at most one
    /// process per client id at a time.
    #[arg(long, value_name = "C")]
    client: ClientId,
    /// Give up after this many seconds without an answer [default: `[client_timing]
    /// deadline_ms` of the config]
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    #[command(subcommand)]
    op: KvCommand,
}

#[derive(Subcommand)]
enum KvCommand {
    /// Print the value of KEY (exit status 3 if it is absent)
    Get { key: OsString },
    /// Set KEY to VALUE
    Put { key: OsString, value: OsString },
    /// Remove KEY (exit status 3 if it was absent)
    Delete { key: OsString },
    /// Set KEY to NEW if its value is --expected V (or it is --absent); exit status 3 if not
    Cas {
        key: OsString,
        /// The value KEY must hold
        #[arg(
            long,
            value_name = "V",
            required_unless_present = "absent",
            conflicts_with = "absent"
        )]
        expected: Option<OsString>,
        /// KEY must be absent
        #[arg(long)]
        absent: bool,
        new: OsString,
    },
    /// Print the pairs with START <= key < END, one `key<TAB>value` line each, in key order
    Scan {
        /// First key (inclusive) [default: the smallest]
        #[arg(long, value_name = "S", default_value = "")]
        start: OsString,
        /// End key (exclusive) [default: none]
        #[arg(long, value_name = "E")]
        end: Option<OsString>,
        /// At most this many pairs (the store allows at most 1000)
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: u32,
    },
}

pub fn run(args: KvArgs) -> anyhow::Result<ExitCode> {
    let cfg = ClusterConfig::load(&args.config)?;
    let mut setup = ClientSetup::from_cluster(&cfg, args.client)?;
    if let Some(secs) = args.timeout {
        anyhow::ensure!(
            secs.is_finite() && secs > 0.0,
            "--timeout {secs} is not a positive number of seconds"
        );
        setup.deadline = Duration::from_secs_f64(secs);
    }
    let rt = crate::runtime(1)?;
    rt.block_on(operate(&args.config, setup, args.op))
}

async fn operate(config: &Path, setup: ClientSetup, op: KvCommand) -> anyhow::Result<ExitCode> {
    let kv = KvClient::connect(setup).await.with_context(|| {
        format!(
            "cannot start a client of the cluster in {}",
            config.display()
        )
    })?;
    let failed = |what: &str| {
        let what = what.to_string();
        let config = config.display().to_string();
        move |e: KvClientError| match e {
            KvClientError::Client(_) => anyhow::anyhow!(
                "{what}: {e}; check the replicas with `redoubt status --config {config}`"
            ),
            _ => anyhow::anyhow!("{what}: {e}"),
        }
    };
    let mut out = std::io::stdout().lock();
    match op {
        KvCommand::Get { key } => {
            let key = key.into_vec();
            match kv.get(key.clone()).await.map_err(failed("get"))? {
                Some(value) => {
                    out.write_all(&value)?;
                    out.write_all(b"\n")?;
                }
                None => {
                    eprintln!("(not found) {}", show_bytes(&key));
                    return Ok(ExitCode::from(EXIT_NEGATIVE));
                }
            }
        }
        KvCommand::Put { key, value } => {
            let previous = kv
                .put(key.into_vec(), value.into_vec())
                .await
                .map_err(failed("put"))?;
            match previous {
                Some(p) => eprintln!("ok (previous value {})", show_bytes(&p)),
                None => eprintln!("ok (new key)"),
            }
        }
        KvCommand::Delete { key } => {
            let key = key.into_vec();
            match kv.delete(key.clone()).await.map_err(failed("delete"))? {
                Some(p) => eprintln!("deleted (value was {})", show_bytes(&p)),
                None => {
                    eprintln!("(not found) {}: nothing deleted", show_bytes(&key));
                    return Ok(ExitCode::from(EXIT_NEGATIVE));
                }
            }
        }
        KvCommand::Cas {
            key,
            expected,
            absent: _,
            new,
        } => {
            let (ok, current) = kv
                .cas(
                    key.into_vec(),
                    expected.map(OsStringExt::into_vec),
                    new.into_vec(),
                )
                .await
                .map_err(failed("cas"))?;
            if ok {
                eprintln!("ok (swapped)");
            } else {
                match current {
                    Some(v) => eprintln!("not swapped: the current value is {}", show_bytes(&v)),
                    None => eprintln!("not swapped: the key is absent"),
                }
                return Ok(ExitCode::from(EXIT_NEGATIVE));
            }
        }
        KvCommand::Scan { start, end, limit } => {
            let pairs = kv
                .scan(start.into_vec(), end.map(OsStringExt::into_vec), limit)
                .await
                .map_err(failed("scan"))?;
            for (k, v) in &pairs {
                out.write_all(k)?;
                out.write_all(b"\t")?;
                out.write_all(v)?;
                out.write_all(b"\n")?;
            }
            if pairs.len() as u64 >= u64::from(limit) && limit > 0 {
                if let Some((last, _)) = pairs.last() {
                    eprintln!(
                        "(limit of {limit} pairs reached: more may follow the key {})",
                        show_bytes(last)
                    );
                }
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
