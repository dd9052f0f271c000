//! `redoubt kv`: one key-value operation through the cluster.
//!
//! Output is meant for scripts as well as people: `get` writes the value alone (raw bytes and a
//! newline) on stdout, `scan` one `key<TAB>value` line per pair; everything else goes to
//! stderr. With `-o json` every answer is one JSON object on stdout instead (bytes as a string
//! if they are UTF-8, else `{"hex": ...}`). A negative answer (absent key, failed
//! compare-and-swap) exits with status 3 either way.

use crate::{json_bytes, show_bytes, Output, EXIT_NEGATIVE};
use anyhow::Context as _;
use clap::{Args, Subcommand};
use redoubt_client::kv::{KvClient, KvClientError};
use redoubt_client::{ClientError, ClientSetup};
use redoubt_config::ClusterConfig;
use redoubt_core::ClientId;
use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct KvArgs {
    /// The cluster configuration file (written by `redoubt init`)
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// Client id to act as; its key file is read from the configuration. Run at most one
    /// process per client id at a time.
    #[arg(long, value_name = "C", env = "REDOUBT_CLIENT")]
    client: ClientId,
    /// How to print the answer: text for people, or one JSON object on stdout
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "text")]
    output: Output,
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

/// Holds client id `c` of the cluster file `config` for this process: a second process acting
/// as the same client at the same time would make both fail (the protocol allows one
/// outstanding request per client id), and the failure would look like the replicas' fault.
/// The lock is an advisory lock on a file in the temporary directory, named after the cluster
/// file and the id; it goes with the process.
pub fn lock_client(config: &Path, c: ClientId) -> anyhow::Result<std::fs::File> {
    let canonical = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf());
    let tag = blake3::hash(canonical.as_os_str().as_encoded_bytes()).to_hex();
    let path = std::env::temp_dir().join(format!("redoubt-client-{}-{c}.lock", &tag[..16]));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open the client lock {}", path.display()))?;
    if file.try_lock().is_err() {
        anyhow::bail!(
            "client {c} of {} is in use by another process on this machine (lock {}): one \
             process per client id at a time; wait for it, or use another client id",
            config.display(),
            path.display()
        );
    }
    Ok(file)
}

impl KvArgs {
    /// How the answer (or the error) is printed.
    pub fn output(&self) -> Output {
        self.output
    }
}

pub fn run(args: KvArgs) -> anyhow::Result<ExitCode> {
    let cfg = ClusterConfig::load(&args.config)?;
    crate::require_service(&cfg, "kv")?;
    let _lock = lock_client(&args.config, args.client)?;
    let mut setup = ClientSetup::from_cluster(&cfg, args.client)?;
    if let Some(secs) = args.timeout {
        anyhow::ensure!(
            secs.is_finite() && secs > 0.0,
            "--timeout {secs} is not a positive number of seconds"
        );
        setup.deadline = Duration::from_secs_f64(secs);
    }
    let rt = crate::runtime(1)?;
    let json = args.output == Output::Json;
    rt.block_on(operate(&args.config, setup, args.op, json))
}

/// Why a read (`get`, `scan`) failed, without the write's warning that it may or may not
/// have taken effect: a read changes nothing, and can be retried as it is.
fn read_failure(e: &ClientError) -> String {
    match e {
        ClientError::Unreachable {
            deadline,
            connected,
            replicas,
        } => format!(
            "no reply certificate from the cluster within {deadline:?} ({connected} of \
             {replicas} replicas connected); nothing was read (a read changes nothing: retry it \
             when the cluster serves again)"
        ),
        ClientError::NoReplicaReachable { waited, replicas } => format!(
            "no replica reachable for {waited:?} (0 of {replicas} connected): are the replicas \
             running, and do the cluster file's addresses match them? Nothing was read"
        ),
        other => other.to_string(),
    }
}

/// Prints a JSON answer (one object and a newline); the exit status is 0, or 3 when the
/// answer is negative.
fn emit(
    out: &mut impl std::io::Write,
    v: serde_json::Value,
    positive: bool,
) -> anyhow::Result<ExitCode> {
    writeln!(out, "{v}")?;
    out.flush()?;
    Ok(if positive {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_NEGATIVE)
    })
}

async fn operate(
    config: &Path,
    setup: ClientSetup,
    op: KvCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let kv = KvClient::connect(setup).await.with_context(|| {
        format!(
            "cannot start a client of the cluster in {}",
            config.display()
        )
    })?;
    let failed = |what: &str| {
        let what = what.to_string();
        let config = config.display().to_string();
        // `get` and `scan` change nothing: whether they "took effect" means nothing.
        let read = what == "get" || what == "scan";
        move |e: KvClientError| match e {
            KvClientError::Client(c) => {
                let e = if read {
                    read_failure(&c)
                } else {
                    c.to_string()
                };
                anyhow::anyhow!(
                    "{what}: {e}; check the replicas with `redoubt status --config {config}`"
                )
            }
            _ => anyhow::anyhow!("{what}: {e}"),
        }
    };
    let mut out = std::io::stdout().lock();
    match op {
        KvCommand::Get { key } => {
            let key = key.into_vec();
            let got = kv.get(key.clone()).await.map_err(failed("get"))?;
            if json {
                let v = serde_json::json!({
                    "op": "get",
                    "key": json_bytes(&key),
                    "found": got.is_some(),
                    "value": got.as_deref().map(json_bytes),
                });
                return emit(&mut out, v, got.is_some());
            }
            match got {
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
            let key = key.into_vec();
            let previous = kv
                .put(key.clone(), value.into_vec())
                .await
                .map_err(failed("put"))?;
            if json {
                let v = serde_json::json!({
                    "op": "put",
                    "key": json_bytes(&key),
                    "previous": previous.as_deref().map(json_bytes),
                });
                return emit(&mut out, v, true);
            }
            match previous {
                Some(p) => eprintln!("ok (previous value {})", show_bytes(&p)),
                None => eprintln!("ok (new key)"),
            }
        }
        KvCommand::Delete { key } => {
            let key = key.into_vec();
            let was = kv.delete(key.clone()).await.map_err(failed("delete"))?;
            if json {
                let v = serde_json::json!({
                    "op": "delete",
                    "key": json_bytes(&key),
                    "deleted": was.is_some(),
                    "previous": was.as_deref().map(json_bytes),
                });
                return emit(&mut out, v, was.is_some());
            }
            match was {
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
            let key = key.into_vec();
            let (ok, current) = kv
                .cas(
                    key.clone(),
                    expected.map(OsStringExt::into_vec),
                    new.into_vec(),
                )
                .await
                .map_err(failed("cas"))?;
            if json {
                let v = serde_json::json!({
                    "op": "cas",
                    "key": json_bytes(&key),
                    "swapped": ok,
                    "current": current.as_deref().map(json_bytes),
                });
                return emit(&mut out, v, ok);
            }
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
            let more = pairs.len() as u64 >= u64::from(limit) && limit > 0;
            if json {
                let list: Vec<serde_json::Value> = pairs
                    .iter()
                    .map(|(k, v)| serde_json::json!({"key": json_bytes(k), "value": json_bytes(v)}))
                    .collect();
                let v = serde_json::json!({
                    "op": "scan",
                    "pairs": list,
                    "limit_reached": more,
                });
                return emit(&mut out, v, true);
            }
            for (k, v) in &pairs {
                out.write_all(k)?;
                out.write_all(b"\t")?;
                out.write_all(v)?;
                out.write_all(b"\n")?;
            }
            if more {
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
