//! `redoubt snapshot`: a backup of the service state that f+1 replicas vouch for.
//!
//! Run on the machine of a node that holds the state (it signals that node's process, found
//! through the `LOCK` file of its home): a replica, or an execution node of a separated or
//! firewall deployment. The node writes its stable checkpoint into `home/snapshots`; the
//! command checks that the file makes the checkpoint digest it names, waits until f+1
//! replicas (g+1 execution nodes) report that digest for that checkpoint among their stable
//! ones, and copies the file to `--out`. `--verify FILE` checks a snapshot file on its own (its pages against its
//! digest; who vouched for the digest is not in the file). `redoubt init --from-snapshot`
//! starts a new cluster from one.

use anyhow::{bail, Context as _};
use clap::Args;
use redoubt_config::ClusterConfig;
use redoubt_localcluster::probe::{fetch, fetch_nodes};
use redoubt_node::snapshot::Snapshot;
use redoubt_node::status::{SnapshotSeen, StatusReport};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SnapshotArgs {
    /// The cluster configuration file (written by `redoubt init`)
    #[arg(
        long,
        value_name = "FILE",
        env = "REDOUBT_CONFIG",
        required_unless_present = "verify"
    )]
    config: Option<PathBuf>,
    /// The replica that writes the snapshot: one running on this machine [default: 0]
    #[arg(long, value_name = "ID", conflicts_with = "executor")]
    replica: Option<u32>,
    /// Separated and firewall deployments: the execution node that writes it (they hold the
    /// state), one running on this machine
    #[arg(long, value_name = "ID")]
    executor: Option<u32>,
    /// Where to write the snapshot
    #[arg(long, value_name = "FILE", required_unless_present = "verify")]
    out: Option<PathBuf>,
    /// How long to wait for the replica's file and for f+1 replicas to vouch for it (seconds)
    #[arg(long, value_name = "S", default_value_t = 60)]
    timeout_s: u64,
    /// Check a snapshot file instead: its pages against the checkpoint digest it names
    #[arg(long, value_name = "FILE", conflicts_with_all = ["config", "out"])]
    verify: Option<PathBuf>,
}

pub fn run(args: SnapshotArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.verify {
        let snap = read_verified(path)?;
        println!("{}", describe(&snap));
        println!(
            "{}: the pages make the checkpoint digest it names",
            path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(config), Some(out)) = (&args.config, &args.out) else {
        bail!("--config and --out are needed (or --verify FILE)");
    };
    let cfg = ClusterConfig::load(config)?;
    let (who, entry, holders, needed) = match (args.replica, args.executor) {
        (_, Some(x)) => {
            if cfg.executors.is_empty() {
                bail!(
                    "this cluster has no execution nodes: its replicas hold the state (--replica)"
                );
            }
            let needed = cfg.protocol.g() as usize + 1;
            (
                format!("execution node {x}"),
                cfg.executor(x)?,
                &cfg.executors,
                needed,
            )
        }
        (r, None) => {
            if !cfg.executors.is_empty() {
                bail!(
                    "this cluster's state is on its execution nodes (separated deployment): \
                     name one with --executor ID"
                );
            }
            let r = r.unwrap_or(0);
            let needed = cfg.protocol.f as usize + 1;
            (
                format!("replica {r}"),
                cfg.replica(r)?,
                &cfg.replicas,
                needed,
            )
        }
    };
    let home = cfg.resolve(&entry.home);
    let pid = node_pid(&home)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s.max(1));
    let rt = crate::runtime(1)?;
    let ask = Duration::from_millis(1500);
    let before = rt
        .block_on(fetch(entry.metrics_addr, ask))
        .map_err(|e| {
            anyhow::anyhow!(
                "{who} does not answer on its status endpoint {}: {e}",
                entry.metrics_addr
            )
        })?
        .last_snapshot;
    // SAFETY: kill(2) with a pid read from the node's lock file; no memory is involved.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR2) } != 0 {
        bail!(
            "cannot signal {who} (pid {pid} from {}): {}; run this as its user",
            home.join("LOCK").display(),
            std::io::Error::last_os_error()
        );
    }
    let seen = loop {
        if let Ok(StatusReport {
            last_snapshot: Some(s),
            ..
        }) = rt.block_on(fetch(entry.metrics_addr, ask))
        {
            if before.as_ref() != Some(&s) {
                break s;
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "{who} reported no snapshot within {} s; see its log",
                args.timeout_s
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Some(e) = &seen.error {
        bail!("{who} could not write its snapshot: {e}");
    }
    let snap = read_verified(Path::new(&seen.path))?;
    if snap.header.seq != seen.seq || snap.header.digest.to_hex() != seen.digest {
        bail!(
            "{} holds checkpoint {} but {who} reported writing {}",
            seen.path,
            snap.header.seq,
            seen.seq
        );
    }
    let vouchers = loop {
        let probes = rt.block_on(fetch_nodes(holders, ask));
        let v = vouchers(&probes, &seen);
        if v.agree.len() >= needed {
            break v;
        }
        if Instant::now() >= deadline {
            bail!(
                "only {} of the {needed} nodes needed vouch for checkpoint {} (digest {}): \
                 {}; the snapshot is not trusted",
                v.agree.len(),
                seen.seq,
                &seen.digest[..16],
                v.others.join("; ")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for other in &vouchers.others {
        eprintln!("note: {other}");
    }
    copy_synced(Path::new(&seen.path), out)?;
    println!("{}", describe(&snap));
    let kind = if args.executor.is_some() {
        "execution nodes"
    } else {
        "replicas"
    };
    println!(
        "vouched for by {kind} {:?}; written to {}",
        vouchers.agree,
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The nodes that report checkpoint `seen.seq` stable with `seen.digest`, and what the
/// others said.
struct Vouchers {
    agree: Vec<u32>,
    others: Vec<String>,
}

fn vouchers(probes: &[Result<StatusReport, String>], seen: &SnapshotSeen) -> Vouchers {
    let mut v = Vouchers {
        agree: Vec::new(),
        others: Vec::new(),
    };
    for (id, p) in probes.iter().enumerate() {
        match p {
            Err(e) => v.others.push(format!("node {id}: {e}")),
            Ok(s) => match s.stable_checkpoints.iter().find(|c| c.seq == seen.seq) {
                Some(c) if c.digest == seen.digest => v.agree.push(id as u32),
                Some(c) => v.others.push(format!(
                    "node {id} reports digest {} for checkpoint {}",
                    &c.digest[..16.min(c.digest.len())],
                    seen.seq
                )),
                None => v.others.push(format!(
                    "node {id} has not reported checkpoint {} stable (its stable: {})",
                    seen.seq, s.stable_checkpoint
                )),
            },
        }
    }
    v
}

/// Reads a snapshot file and checks its pages against its digest.
fn read_verified(path: &Path) -> anyhow::Result<Snapshot> {
    let snap = Snapshot::read(path)?;
    snap.verify()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(snap)
}

fn describe(s: &Snapshot) -> String {
    let h = &s.header;
    format!(
        "snapshot of cluster {:?} ({} service): checkpoint {}, digest {}, {} pages of {} bytes, \
         {} not all zero",
        h.cluster,
        h.service,
        h.seq,
        h.digest.to_hex(),
        h.pages,
        h.page_bytes,
        h.present.len()
    )
}

/// The process id in the home's `LOCK` file, if that process is running.
fn node_pid(home: &Path) -> anyhow::Result<u32> {
    let lock = home.join("LOCK");
    let text = std::fs::read_to_string(&lock).with_context(|| {
        format!(
            "cannot read {} (is this the node's machine, and has it started?)",
            lock.display()
        )
    })?;
    let pid: u32 = text.trim().parse().with_context(|| {
        format!(
            "{} names no process id (a node of an older version?)",
            lock.display()
        )
    })?;
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid as libc::pid_t, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        bail!(
            "the node that used {} (pid {pid}) is not running",
            home.display()
        );
    }
    Ok(pid)
}

/// Copies `from` to `to` and syncs it.
fn copy_synced(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_node::status::CheckpointSeen;

    fn status(id: u32, stable: &[(u64, &str)]) -> Result<StatusReport, String> {
        Ok(StatusReport {
            id,
            stable_checkpoint: stable.last().map_or(0, |s| s.0),
            stable_checkpoints: stable
                .iter()
                .map(|(seq, d)| CheckpointSeen {
                    seq: *seq,
                    digest: d.to_string(),
                })
                .collect(),
            ..Default::default()
        })
    }

    #[test]
    fn only_replicas_reporting_the_same_digest_for_the_checkpoint_vouch() {
        let seen = SnapshotSeen {
            seq: 256,
            digest: "aa".repeat(32),
            ..Default::default()
        };
        let good = "aa".repeat(32);
        let bad = "bb".repeat(32);
        let probes = vec![
            status(0, &[(128, &bad), (256, &good)]),
            status(1, &[(256, &bad)]),
            status(2, &[(128, &good)]),
            Err("connection refused".into()),
            status(4, &[(256, &good), (384, &bad)]),
        ];
        let v = vouchers(&probes, &seen);
        assert_eq!(v.agree, vec![0, 4]);
        assert_eq!(v.others.len(), 3);
        assert!(
            v.others[0].contains("node 1 reports digest bbbb"),
            "{:?}",
            v.others
        );
        assert!(v.others[1].contains("node 2 has not reported checkpoint 256"));
        assert!(v.others[2].contains("node 3: connection refused"));
    }
}
