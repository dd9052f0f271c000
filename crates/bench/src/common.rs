//! What the benchmarks that run real replica processes share: the records they write, and
//! waiting for the cluster.

use redoubt_client::kv::KvClient;
use redoubt_config::ClusterConfig;
use redoubt_crypto::DigestBuilder;
use redoubt_localcluster::probe::{agreement, fetch_all, Probe};
use redoubt_localcluster::procs::{log_tail, ReplicaProcs};
use redoubt_node::init::{free_base_port, init_cluster, InitOptions};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Writes a four-replica PBFT cluster serving kv on 127.0.0.1 (session keys, `clients`
/// clients, free ports) into `out`, as `redoubt init` would; `monitored` records this
/// program's hash for `redoubt monitor`. Returns the cluster file and its contents.
pub(super) fn kv_cluster(
    name: &str,
    clients: u32,
    out: &Path,
    monitored: bool,
) -> anyhow::Result<(PathBuf, ClusterConfig)> {
    let path = init_cluster(&InitOptions {
        replicas: 4,
        executors: 0,
        firewall: None,
        clients,
        out: out.to_path_buf(),
        base_port: free_base_port(4)?,
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        name: name.into(),
        static_keys: false,
        ordering: redoubt_core::OrderProtocol::Pbft,
        service: "kv".into(),
        executable_blake3: if monitored {
            Some(redoubt_localcluster::executable_blake3()?)
        } else {
            None
        },
        state_geometry: None,
    })?;
    let cfg = ClusterConfig::load(&path)?;
    Ok((path, cfg))
}

/// Value bytes of each record: with its key and header a record spans 15-16 pages.
pub(super) const VALUE_BYTES: usize = 60 << 10;
pub(super) const STATUS_TIMEOUT: Duration = Duration::from_millis(1000);
pub(super) const PHASE_TIMEOUT: Duration = Duration::from_secs(1800);

/// Empties replica `id`'s home (journal, state, checkpoints): its next start is a new
/// replica's, with an empty disk. A home not created yet is left alone.
pub(super) fn empty_home(cfg: &ClusterConfig, id: u32) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let home = cfg.resolve(&cfg.replica(id)?.home);
    if home.exists() {
        std::fs::remove_dir_all(&home)
            .with_context(|| format!("cannot empty {}", home.display()))?;
    }
    Ok(())
}

/// Deterministic filler bytes for record `i`, version `v` (incompressible, distinct).
pub(super) fn value(i: u64, v: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(VALUE_BYTES);
    let mut block = 0u64;
    while out.len() < VALUE_BYTES {
        let d = DigestBuilder::new("redoubt.bench.value")
            .u64(i)
            .u64(v)
            .u64(block)
            .finish();
        out.extend_from_slice(&d.0);
        block += 1;
    }
    out.truncate(VALUE_BYTES);
    out
}

/// Bytes a record takes in the store (key, header and value, 64-byte aligned).
pub(super) fn record_bytes() -> u64 {
    (16 + 9 + VALUE_BYTES as u64).div_ceil(64) * 64
}

pub(super) fn key(i: u64) -> Vec<u8> {
    format!("r{i:08}").into_bytes()
}

/// Puts every `(record, version)` with all clients in parallel.
pub(super) async fn put_all(kvs: &[KvClient], work: Vec<(u64, u64)>) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let k = kvs.len();
    for (c, kv) in kvs.iter().enumerate() {
        let mine: Vec<(u64, u64)> = work.iter().copied().skip(c).step_by(k).collect();
        let kv = kv.clone();
        tasks.spawn(async move {
            for (i, v) in mine {
                kv.put(key(i), value(i, v))
                    .await
                    .map_err(|e| anyhow::anyhow!("put of record {i} failed: {e}"))?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// Waits until the replicas' statuses satisfy `ok`, failing if one exits.
pub(super) async fn wait_for(
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
    what: &str,
    ok: impl Fn(&[Probe]) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        for i in 0..4u32 {
            if let Some(status) = procs.exited(i) {
                anyhow::bail!(
                    "replica {i} exited ({status}) while waiting for {what}; last lines of its log:\n{}",
                    log_tail(&procs.log_path(i), 12)
                );
            }
        }
        if ok(&fetch_all(cfg, STATUS_TIMEOUT).await) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (at most 30 s) until all four replicas agree on a view, failing if one exits.
pub(super) async fn wait_until_up(
    cfg: &ClusterConfig,
    procs: &mut ReplicaProcs,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let probes = fetch_all(cfg, Duration::from_millis(500)).await;
        if agreement(&probes).is_some_and(|a| a.replicas == 4) {
            return Ok(());
        }
        for i in 0..4u32 {
            if let Some(status) = procs.exited(i) {
                anyhow::bail!(
                    "replica {i} exited ({status}):\n{}",
                    log_tail(&procs.log_path(i), 12)
                );
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "the replicas did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
