//! What the benchmarks of redoubt against its unreplicated baseline share: the cluster both
//! run from, starting either, and connecting their clients.
//!
//! The baseline (`redoubt baseline`) is one server hosting the same service as the replicas,
//! with the same transport and client code, and no agreement: the cost of replication is
//! the difference.

use super::measure::KillOnDrop;
use anyhow::Context as _;
use redoubt_client::{Client, ClientSetup, Connections};
use redoubt_config::ClusterConfig;
use redoubt_localcluster::cpucap::CpuCaps;
use redoubt_localcluster::procs::ReplicaProcs;
use redoubt_node::init::{free_base_port, init_cluster, InitOptions};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum System {
    Baseline,
    Redoubt,
    /// redoubt with the replicas of [`Cluster::down`] killed once the cluster is up and never
    /// restarted: a tolerated fault for the whole run.
    Degraded,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Baseline => "baseline",
            System::Redoubt => "redoubt",
            System::Degraded => "redoubt-down",
        }
    }

    /// The system's name in a plot's legend.
    pub fn legend(self) -> &'static str {
        match self {
            System::Baseline => "baseline (1 server)",
            System::Redoubt => "redoubt (n = 4)",
            System::Degraded => "redoubt (n = 4, f down)",
        }
    }

    /// Whether this system runs the replicas (healthy or not).
    pub fn replicated(self) -> bool {
        self != System::Baseline
    }
}

/// The cluster both systems run from, in a temporary directory removed when dropped.
pub(super) struct Cluster {
    /// This program, which the server processes run.
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub config_path: PathBuf,
    pub cfg: ClusterConfig,
    /// The baseline's cluster file: the same as the replicas' unless they run Prime, whose
    /// session keys the baseline server has no key holder for (it then has one of its own,
    /// with static keys).
    baseline_config: Option<(PathBuf, ClusterConfig)>,
    /// The replicas [`System::Degraded`] runs without.
    pub down: Vec<u32>,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    /// The cluster file `system` runs from, and its path.
    pub fn config_of(&self, system: System) -> (&Path, &ClusterConfig) {
        match (&self.baseline_config, system) {
            (Some((path, cfg)), System::Baseline) => (path, cfg),
            _ => (&self.config_path, &self.cfg),
        }
    }

    /// The four replicas' processes, none started.
    pub fn replicas(&self) -> ReplicaProcs {
        ReplicaProcs::new(
            self.exe.clone(),
            self.config_path.clone(),
            self.dir.clone(),
            4,
        )
    }

    /// The systems a benchmark runs: the baseline (unless `redoubt_only`), redoubt, and
    /// redoubt with replicas down when any are.
    pub fn systems(&self, redoubt_only: bool) -> Vec<System> {
        let mut v = Vec::new();
        if !redoubt_only {
            v.push(System::Baseline);
        }
        v.push(System::Redoubt);
        if !self.down.is_empty() {
            v.push(System::Degraded);
        }
        v
    }

    /// What [`System::Degraded`] is, for reports: "replica 3 down".
    pub fn down_label(&self) -> String {
        let ids: Vec<String> = self.down.iter().map(u32::to_string).collect();
        match ids.len() {
            1 => format!("replica {} down", ids[0]),
            _ => format!("replicas {} down", ids.join(", ")),
        }
    }

    /// Empties every replica's home (journal, state, checkpoints), so that the next start
    /// is a new cluster's and not a restart of the last one: each client model of a run
    /// measures a cluster from the same fresh state, in view 0.
    pub fn fresh_homes(&self) -> anyhow::Result<()> {
        for r in &self.cfg.replicas {
            super::common::empty_home(&self.cfg, r.id)?;
        }
        Ok(())
    }
}

/// Checks `--down`: at most f = 1 of the four replicas, each an id below 4, no repeats.
pub(super) fn check_down(down: &[u32]) -> anyhow::Result<()> {
    anyhow::ensure!(
        down.iter().all(|r| *r < 4),
        "--down: replica ids are 0 to 3"
    );
    let mut d = down.to_vec();
    d.sort_unstable();
    d.dedup();
    anyhow::ensure!(
        d.len() == down.len() && d.len() <= 1,
        "--down: at most one replica (f = 1 of 4), named once; with more down the cluster cannot order"
    );
    Ok(())
}

/// Writes a cluster of four replicas on 127.0.0.1 hosting `service` into a new temporary
/// directory, for `max_clients` benchmark clients, with journal fsync as `fsync` and the
/// overrides `sets` (each printed); [`System::Degraded`] runs it without the replicas `down`.
pub(super) fn make_cluster(
    bench: &str,
    service: &str,
    max_clients: u32,
    fsync: bool,
    sets: &[String],
    down: &[u32],
) -> anyhow::Result<Cluster> {
    check_down(down)?;
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!("redoubt-{bench}-"))
        .tempdir()
        .context("cannot create a temporary directory")?;
    let dir = tmp.path().to_path_buf();
    let prime = sets.iter().any(|s| is_prime_set(s));
    let write = |out: PathBuf, prime: bool, sets: &[String]| -> anyhow::Result<PathBuf> {
        let config_path = init_cluster(&InitOptions {
            replicas: 4,
            executors: 0,
            firewall: None,
            clients: max_clients + 1,
            out,
            base_port: free_base_port(4)?,
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            name: format!("bench-{bench}"),
            // The baseline server has no key holder: both sides run on static keys (key
            // refresh costs one NEW-KEY per node every key_refresh_ms, nothing per request),
            // unless the replicas run Prime, which needs session keys (clients sign requests).
            static_keys: !prime,
            ordering: if prime {
                redoubt_core::OrderProtocol::Prime
            } else {
                redoubt_core::OrderProtocol::Pbft
            },
            service: service.into(),
            executable_blake3: None,
            state_geometry: None,
        })?;
        let mut cfg = ClusterConfig::load(&config_path)?;
        cfg.storage.fsync = fsync;
        rewrite_config(&config_path, cfg, max_clients, sets)?;
        Ok(config_path)
    };
    let config_path = write(dir.clone(), prime, sets)?;
    let baseline_config = if prime {
        // The ordering settings are the replicas' alone.
        let common: Vec<String> = sets
            .iter()
            .filter(|s| !is_prime_set(s) && !s.trim_start().starts_with("protocol.tentative"))
            .cloned()
            .collect();
        let path = write(dir.join("baseline"), false, &common)?;
        Some((path.clone(), ClusterConfig::load(&path)?))
    } else {
        None
    };
    for s in sets {
        println!("  setting {s}");
    }
    Ok(Cluster {
        exe,
        dir,
        cfg: ClusterConfig::load(&config_path)?,
        config_path,
        baseline_config,
        down: down.to_vec(),
        _tmp: tmp,
    })
}

/// Whether `--set` `s` makes the replicas run Prime.
fn is_prime_set(s: &str) -> bool {
    s.split_once('=').is_some_and(|(k, v)| {
        k.trim() == "protocol.ordering" && v.trim().trim_matches('"') == "prime"
    })
}

/// Writes `cfg` to `config_path` with room for `max_clients` connections and the overrides
/// `sets` applied.
pub(super) fn rewrite_config(
    config_path: &Path,
    mut cfg: ClusterConfig,
    max_clients: u32,
    sets: &[String],
) -> anyhow::Result<()> {
    cfg.node.client_connections_max = cfg
        .node
        .client_connections_max
        .max(max_clients as usize * 2 + 64);
    let text = redoubt_config::override_toml(&cfg.to_toml()?, sets)
        .map_err(|e| anyhow::anyhow!("--set: {e}"))?;
    std::fs::write(config_path, text)?;
    Ok(())
}

/// Starts `system`: the four replicas of `procs` (returning once they agree on a view; for
/// [`System::Degraded`] then kills the replicas of [`Cluster::down`] with SIGKILL), or the
/// baseline server with `baseline_threads` runtime threads (the replicas' when `None`),
/// which the caller then holds. `caps` puts each server process in a control group of its
/// own.
pub(super) async fn start(
    system: System,
    cluster: &Cluster,
    procs: &mut ReplicaProcs,
    mut caps: Option<&mut CpuCaps>,
    baseline_threads: Option<usize>,
) -> anyhow::Result<Option<KillOnDrop>> {
    let exe = &cluster.exe;
    let (config_path, cfg) = cluster.config_of(system);
    match system {
        System::Redoubt | System::Degraded => {
            for i in 0..4 {
                procs.start(i)?;
                if let (Some(caps), Some(pid)) = (caps.as_deref_mut(), procs.pid(i)) {
                    caps.cap(&format!("replica-{i}"), pid)?;
                }
            }
            super::common::wait_until_up(cfg, procs).await?;
            if system == System::Degraded {
                for &r in &cluster.down {
                    procs.kill(r)?;
                }
            }
            Ok(None)
        }
        System::Baseline => {
            let log = std::fs::File::create(config_path.with_file_name("baseline.log"))?;
            let child = std::process::Command::new(exe)
                .arg("baseline")
                .arg("--config")
                .arg(config_path)
                .args(
                    baseline_threads
                        .map(|n| vec!["--worker-threads".to_string(), n.to_string()])
                        .unwrap_or_default(),
                )
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("cannot start the baseline server")?;
            let child = KillOnDrop(child);
            if let Some(caps) = caps {
                caps.cap("baseline", child.0.id())?;
            }
            Ok(Some(child))
        }
    }
}

/// The server processes of the running system (the baseline's, or the replicas of `procs`).
pub(super) fn server_pids(baseline: Option<&KillOnDrop>, procs: &ReplicaProcs) -> Vec<u32> {
    match baseline {
        Some(c) => vec![c.0.id()],
        None => (0..4).filter_map(|i| procs.pid(i)).collect(),
    }
}

/// Benchmark clients 1 to `n` of `system` (the baseline: its one server, f = 0), each call
/// with a 30 s deadline, sharing one connection per server unless `own_connections`. They
/// connect whether or not the servers answer yet.
pub(super) async fn connect(
    cfg: &ClusterConfig,
    system: System,
    n: u32,
    own_connections: bool,
) -> anyhow::Result<Vec<Client>> {
    let setup = |c: u64| client_setup(cfg, c, system == System::Baseline);
    let shared = (!own_connections).then(|| {
        let s = setup(1).expect("client 1 is configured");
        Connections::open(&s.replicas, n as usize, s.frame_bytes_max)
    });
    let mut pool = Vec::with_capacity(n as usize);
    for c in 1..=u64::from(n) {
        pool.push(match &shared {
            Some(conns) => Client::connect_over(setup(c)?, conns).await?,
            None => Client::connect(setup(c)?).await?,
        });
    }
    Ok(pool)
}

/// The setup of benchmark client `c`, each call with a 30 s deadline; `unreplicated`: of the
/// baseline (its one server, at replica 0's address, f = 0).
pub(super) fn client_setup(
    cfg: &ClusterConfig,
    c: u64,
    unreplicated: bool,
) -> anyhow::Result<ClientSetup> {
    let mut s = ClientSetup::from_cluster(cfg, c)?;
    s.deadline = Duration::from_secs(30);
    if unreplicated {
        s.core.f = 0;
        s.replicas.truncate(1);
    }
    Ok(s)
}
