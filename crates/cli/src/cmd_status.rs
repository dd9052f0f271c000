//! `redoubt status`: asks every replica's `/status` endpoint (concurrently, short timeout) and
//! prints the service and ordering the cluster file names, one table row per replica, then
//! whether the cluster can serve requests. With `-o json`: one object on stdout, the service,
//! every replica's full status (or why it could not be asked) and the verdict; an error (a
//! cluster file that does not load) is one object `{"error": ..., "exit": 1}` too. Exit
//! status 1 when the cluster cannot serve, either way.

use clap::Args;
use redoubt_config::ClusterConfig;
pub use redoubt_localcluster::probe::{agreement, fetch_all, Probe};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct StatusArgs {
    /// The cluster configuration file (written by `redoubt init`)
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// How long to wait for each replica, in milliseconds
    #[arg(long, value_name = "MS", default_value_t = 1500)]
    timeout_ms: u64,
    /// How to print the answer: a table for people, or one JSON object on stdout
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "text")]
    output: crate::Output,
}

impl StatusArgs {
    /// How the answer (or the error) is printed.
    pub fn output(&self) -> crate::Output {
        self.output
    }
}

pub fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let cfg = ClusterConfig::load(&args.config)?;
    let rt = crate::runtime(1)?;
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    let probes = rt.block_on(fetch_all(&cfg, timeout));
    let (serving, verdict) = verdict(&cfg, &probes);
    if args.output == crate::Output::Json {
        println!("{}", json(&cfg, &probes, serving, &verdict));
        return Ok(if serving {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    println!("{}", heading(&cfg));
    print!("{}", table(&cfg, &probes));
    if serving {
        println!("{verdict}");
        Ok(ExitCode::SUCCESS)
    } else {
        anyhow::bail!("{verdict}")
    }
}

/// The JSON answer: per replica its address and full status, or the reason it is down; the
/// view most replicas agree on; whether the cluster serves, and the verdict sentence.
pub fn json(cfg: &ClusterConfig, probes: &[Probe], serving: bool, verdict: &str) -> String {
    let replicas: Vec<serde_json::Value> = cfg
        .replicas
        .iter()
        .zip(probes)
        .map(|(r, p)| match p {
            Ok(s) => serde_json::json!({
                "id": r.id,
                "address": r.addr.to_string(),
                "up": true,
                "status": s,
            }),
            Err(e) => serde_json::json!({
                "id": r.id,
                "address": r.addr.to_string(),
                "up": false,
                "error": e,
            }),
        })
        .collect();
    let agreed = agreement(probes)
        .map(|a| serde_json::json!({"view": a.view, "primary": a.primary, "replicas": a.replicas}));
    serde_json::json!({
        "service": cfg.state.service,
        "ordering": cfg.protocol.ordering.to_string(),
        "replicas": replicas,
        "agreement": agreed,
        "serving": serving,
        "verdict": verdict,
        "executable_pin": cfg.recovery.executable_blake3,
    })
    .to_string()
}

/// The line above the table: the cluster's name, the service its replicas host and the
/// ordering protocol, as the cluster file says.
pub fn heading(cfg: &ClusterConfig) -> String {
    let what = match cfg.state.service.as_str() {
        "kv" => " (key-value store: `redoubt kv`)",
        "sql" => " (SQL database: `redoubt sql-gateway`)",
        "files" => " (file system: `redoubt mount`)",
        _ => "",
    };
    format!(
        "cluster {:?}: service {}{what}, ordering {}, {} replicas (f = {})",
        cfg.cluster.name,
        cfg.state.service,
        cfg.protocol.ordering,
        cfg.replicas.len(),
        cfg.protocol.f
    )
}

/// The table of replicas, then one line per replica that is down saying why.
pub fn table(cfg: &ClusterConfig, probes: &[Probe]) -> String {
    let header = [
        "replica",
        "address",
        "state",
        "view",
        "primary",
        "mode",
        "last exec",
        "stable ckpt",
        "req/s",
        "executable",
    ];
    let pin = cfg.recovery.executable_blake3.to_ascii_lowercase();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (r, p) in cfg.replicas.iter().zip(probes) {
        let mut row = vec![r.id.to_string(), r.addr.to_string()];
        match p {
            Ok(s) => row.extend([
                "up".to_string(),
                s.view.to_string(),
                s.primary.to_string(),
                if s.normal { "normal" } else { "view-change" }.to_string(),
                s.last_executed.to_string(),
                s.stable_checkpoint.to_string(),
                format!("{:.1}", s.requests_per_s),
                executable_cell(&s.executable_blake3, &pin),
            ]),
            Err(_) => {
                row.push("down".to_string());
                row.extend(std::iter::repeat_n("-".to_string(), 7));
            }
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            // Text columns left-aligned, numbers right-aligned.
            if i == 1 || i == 2 || i == 5 || i == 9 {
                let _ = write!(l, "{c:<w$}  ", w = widths[i]);
            } else {
                let _ = write!(l, "{c:>w$}  ", w = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(
        &mut out,
        &header.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
    );
    for row in &rows {
        line(&mut out, row);
    }
    for (r, p) in cfg.replicas.iter().zip(probes) {
        match p {
            Err(e) => {
                let _ = writeln!(
                    out,
                    "replica {} down: http://{}/status: {e}",
                    r.id, r.metrics_addr
                );
            }
            Ok(s) if unpinned(&s.executable_blake3, &pin) => {
                let _ = writeln!(
                    out,
                    "replica {} runs executable {}, not the pinned {pin}: send its monitor SIGHUP to restart it on the pinned one",
                    r.id, s.executable_blake3
                );
            }
            Ok(_) => {}
        }
    }
    out
}

/// Whether a replica reporting executable `hash` runs another one than `pin` (neither empty).
fn unpinned(hash: &str, pin: &str) -> bool {
    !hash.is_empty() && !pin.is_empty() && !hash.eq_ignore_ascii_case(pin)
}

/// The executable column: the hash's first 8 digits, `*` after them when it is not the pin.
fn executable_cell(hash: &str, pin: &str) -> String {
    if hash.is_empty() {
        return "?".into();
    }
    let short = &hash[..hash.len().min(8)];
    if unpinned(hash, pin) {
        format!("{short}*")
    } else {
        short.to_string()
    }
}

/// Whether the cluster can serve requests (2f+1 replicas up, in normal operation, in the same
/// view), and a sentence saying so, with the replicas that lag behind.
pub fn verdict(cfg: &ClusterConfig, probes: &[Probe]) -> (bool, String) {
    let n = cfg.replicas.len();
    let quorum = cfg.protocol.quorum();
    let up = probes.iter().filter(|p| p.is_ok()).count();
    let mut s = String::new();
    let serving = match agreement(probes) {
        Some(a) if a.replicas >= quorum => {
            let _ = write!(
                s,
                "cluster is serving: {up} of {n} replicas up, view {} (primary {}), {} in normal operation in that view (quorum {quorum})",
                a.view, a.primary, a.replicas
            );
            if a.replicas == quorum && n > quorum {
                let _ = write!(
                    s,
                    "\nwarning: no fault margin left: if one more replica stops (or leaves this view), so does the service; bring the others back first"
                );
            }
            true
        }
        Some(a) => {
            let _ = write!(
                s,
                "cluster cannot order requests now: {up} of {n} replicas up, only {} in normal operation in view {} but a quorum of {quorum} is needed; start the replicas that are down (or wait for the view change to finish)",
                a.replicas, a.view
            );
            false
        }
        None => {
            let _ = write!(
                s,
                "cluster cannot order requests now: {up} of {n} replicas up, none in normal operation (a quorum of {quorum} is needed); start the replicas that are down"
            );
            false
        }
    };
    let most = probes
        .iter()
        .flatten()
        .map(|p| p.last_executed)
        .max()
        .unwrap_or(0);
    let k = cfg.protocol.checkpoint_interval;
    for p in probes.iter().flatten() {
        if p.last_executed + k < most {
            let _ = write!(
                s,
                "\nreplica {} lags: executed up to {} while others reached {most} (it catches up by log retransmission or state transfer)",
                p.id, p.last_executed
            );
        }
    }
    (serving, s)
}
