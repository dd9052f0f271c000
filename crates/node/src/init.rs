//! `redoubt init`: writes a cluster configuration and one key file per principal.
//!
//! ```text
//! out/redoubt.toml
//! out/keys/            (0700)
//! out/keys/replica-<i>.key, out/keys/client-<c>.key   (0600)
//! ```
//!
//! With session keys (the default) each principal gets a key-holder file (`*.holder`, the seed
//! of its long-term signing and sealing keys, read only by its key holder) and
//! `public-keys.toml` lists every principal's public keys. With `--static-keys`, MAC keys are
//! derived from a random master secret that exists only in memory during `init`: each
//! principal's file receives only its own directional keys, so a compromised replica learns
//! nothing about the keys between other principals.

use rand::Rng as _;
use redoubt_config::keys::{write_directory, write_key_file};
use redoubt_config::{
    ClientEntry, ClientSection, ClusterConfig, ClusterSection, ConfigError, FilterEntry,
    KeysSection, NodeSection, RecoverySection, ReplicaEntry, StateSection, StorageSection,
};
use redoubt_core::auth::pairwise_key;
use redoubt_core::{Config, OrderProtocol, Principal};
use redoubt_crypto::body::ExecutorSecret;
use std::fs::DirBuilder;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

/// Default first protocol port: replica `i` listens on `base_port + i`, its metrics endpoint on
/// `base_port + 100 + i`.
pub const DEFAULT_BASE_PORT: u16 = 7400;
/// Offset between a replica's protocol port and its metrics port.
pub const METRICS_PORT_OFFSET: u16 = 100;
/// Name of the configuration file `init` writes in its output directory.
pub const CONFIG_FILE_NAME: &str = "redoubt.toml";

/// What `redoubt init` builds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitOptions {
    /// Number of replicas: 3f+1 with f >= 1.
    pub replicas: u32,
    /// Execution nodes of a separated deployment (2g+1), or 0: the replicas execute. They
    /// take the ports after the replicas' (`base_port + replicas + i`).
    pub executors: u32,
    /// Faulty filters a privacy firewall tolerates, h (it has (h+1)² filter nodes, taking
    /// the ports after the execution nodes'), or `None`: no firewall. Needs execution nodes
    /// and session keys.
    pub firewall: Option<u32>,
    /// Number of clients; their ids are `1..=clients`.
    pub clients: u32,
    /// Output directory (created if missing).
    pub out: PathBuf,
    /// Replica `i` gets protocol port `base_port + i` and metrics port `base_port + 100 + i`.
    pub base_port: u16,
    /// Address every replica listens on (default 127.0.0.1).
    pub host: IpAddr,
    /// Cluster name.
    pub name: String,
    /// Fixed pairwise MAC keys instead of session keys (no key refresh, no recovery).
    pub static_keys: bool,
    /// The ordering protocol. Prime needs session keys; `init`
    /// deals the replicas' order keys for it (a proactive recovery replaces a replica's).
    pub ordering: OrderProtocol,
    /// The service the replicas host (`[state] service`: "kv", "sql" or "files").
    pub service: String,
    /// BLAKE3 of the replica executable the monitor may start (`[recovery]
    /// executable_blake3`); `None` leaves the check off.
    pub executable_blake3: Option<String>,
    /// The state's geometry (`[state] size_mib`, `page_bytes`, `fanout`); `None` for the
    /// defaults. A cluster started from a snapshot takes the snapshot's.
    pub state_geometry: Option<(u64, u32, u32)>,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            replicas: 4,
            executors: 0,
            firewall: None,
            clients: 1,
            out: PathBuf::from("redoubt-cluster"),
            base_port: DEFAULT_BASE_PORT,
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            name: "redoubt".into(),
            static_keys: false,
            ordering: OrderProtocol::Pbft,
            service: "kv".into(),
            executable_blake3: None,
            state_geometry: None,
        }
    }
}

/// Creates the cluster described by `opts`; returns the path of the written `redoubt.toml`.
pub fn init_cluster(opts: &InitOptions) -> Result<PathBuf, ConfigError> {
    let n = opts.replicas;
    if n < 4 || !(n - 1).is_multiple_of(3) {
        let lower = if n < 4 { 4 } else { n - (n - 1) % 3 };
        let upper = if n < 4 { 4 } else { lower + 3 };
        let advice = if lower == upper {
            "use 4 (f = 1)".to_string()
        } else {
            format!(
                "use {lower} (f = {}) or {upper} (f = {})",
                (lower - 1) / 3,
                (upper - 1) / 3
            )
        };
        return Err(ConfigError::InitReplicas {
            replicas: n,
            advice,
        });
    }
    let f = (n - 1) / 3;
    let e = opts.executors;
    if e > 0 && e.is_multiple_of(2) {
        return Err(ConfigError::InitInvalid(format!(
            "{e} execution nodes: use an odd number, 2g+1 (3 tolerates g = 1 faulty, 5 g = 2)"
        )));
    }
    let rows = opts.firewall.map_or(0, |h| h + 1);
    if rows > 0 && (e == 0 || opts.static_keys) {
        return Err(ConfigError::InitInvalid(
            "a privacy firewall stands between replicas and execution nodes: it needs \
             --execution 2g+1 and session keys (no --static-keys)"
                .into(),
        ));
    }
    if rows > 8 {
        return Err(ConfigError::InitInvalid(format!(
            "--firewall {} asks for {} filter nodes; at most h = 7",
            rows - 1,
            rows * rows
        )));
    }
    let filters = rows * rows;
    let n = n + e + filters; // nodes that take ports
    if n > u32::from(METRICS_PORT_OFFSET) {
        return Err(ConfigError::InitInvalid(format!(
            "{n} replicas would give protocol ports that collide with metrics ports (base_port + {METRICS_PORT_OFFSET} + i); use at most {METRICS_PORT_OFFSET} replicas"
        )));
    }
    if opts.base_port == 0 {
        return Err(ConfigError::InitInvalid(
            "base port 0 is not a fixed port; choose a base port such as 7400".into(),
        ));
    }
    let last_port = u32::from(opts.base_port) + u32::from(METRICS_PORT_OFFSET) + n - 1;
    if last_port > u32::from(u16::MAX) {
        return Err(ConfigError::InitInvalid(format!(
            "base port {} is too high: the metrics port of node {} (replicas, then execution nodes, then filters) would be {last_port}; choose a base port of at most {}",
            opts.base_port,
            n - 1,
            u32::from(u16::MAX) + 1 - u32::from(METRICS_PORT_OFFSET) - n
        )));
    }
    if opts.host.is_unspecified() {
        return Err(ConfigError::InitInvalid(format!(
            "host {} is not an address peers and clients can connect to; give the address of this host (e.g. 127.0.0.1)",
            opts.host
        )));
    }

    let io = ConfigError::io;

    let config_path = opts.out.join(CONFIG_FILE_NAME);
    if config_path.exists() {
        return Err(ConfigError::InitExists { path: config_path });
    }
    std::fs::create_dir_all(&opts.out).map_err(io("create directory", &opts.out))?;
    let keys_dir = opts.out.join("keys");
    if keys_dir.exists() {
        let mut entries = std::fs::read_dir(&keys_dir).map_err(io("read directory", &keys_dir))?;
        if entries.next().is_some() {
            return Err(ConfigError::InitExists { path: keys_dir });
        }
    } else {
        DirBuilder::new()
            .mode(0o700)
            .create(&keys_dir)
            .map_err(io("create directory", &keys_dir))?;
    }
    std::fs::set_permissions(&keys_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("set permissions of", &keys_dir))?;

    let mut rng = rand::rng();
    let mut id_bytes = [0u8; 16];
    rng.fill_bytes(&mut id_bytes);
    let cluster_id: String = id_bytes.iter().map(|b| format!("{b:02x}")).collect();

    let cfg = ClusterConfig {
        path: config_path.clone(),
        cluster: ClusterSection {
            name: opts.name.clone(),
            id: cluster_id.clone(),
        },
        executors: (0..e)
            .map(|i| {
                let port =
                    |offset: u32| (u32::from(opts.base_port) + offset + opts.replicas + i) as u16;
                ReplicaEntry {
                    id: i,
                    addr: SocketAddr::new(opts.host, port(0)),
                    metrics_addr: SocketAddr::new(opts.host, port(u32::from(METRICS_PORT_OFFSET))),
                    home: PathBuf::from(format!("executor-{i}")),
                    key_file: PathBuf::from(format!(
                        "keys/executor-{i}.{}",
                        if opts.static_keys { "key" } else { "holder" }
                    )),
                    holder_socket: None,
                }
            })
            .collect(),
        filters: (0..filters)
            .map(|i| {
                let port = |offset: u32| {
                    (u32::from(opts.base_port) + offset + opts.replicas + e + i) as u16
                };
                FilterEntry {
                    id: i,
                    addr: SocketAddr::new(opts.host, port(0)),
                    metrics_addr: SocketAddr::new(opts.host, port(u32::from(METRICS_PORT_OFFSET))),
                }
            })
            .collect(),
        replicas: (0..opts.replicas)
            .map(|i| {
                let port = |offset: u32| (u32::from(opts.base_port) + offset + i) as u16;
                ReplicaEntry {
                    id: i,
                    addr: SocketAddr::new(opts.host, port(0)),
                    metrics_addr: SocketAddr::new(opts.host, port(u32::from(METRICS_PORT_OFFSET))),
                    home: PathBuf::from(format!("replica-{i}")),
                    key_file: PathBuf::from(format!(
                        "keys/replica-{i}.{}",
                        if opts.static_keys { "key" } else { "holder" }
                    )),
                    holder_socket: None,
                }
            })
            .collect(),
        clients: (1..=u64::from(opts.clients))
            .map(|c| ClientEntry {
                id: c,
                key_file: PathBuf::from(format!(
                    "keys/client-{c}.{}",
                    if opts.static_keys { "key" } else { "holder" }
                )),
            })
            .collect(),
        protocol: Config {
            // Bodies sealed to the executors, whose secret each executing node's key holder
            // holds (the replicas', or the execution nodes' when separated).
            confidential_bodies: !opts.static_keys,
            executors: e,
            filter_rows: rows,
            ordering: opts.ordering,
            // Prime has no tentative execution.
            tentative_execution: opts.ordering == OrderProtocol::Pbft,
            ..Config::new(f)
        },
        client: ClientSection::default(),
        node: NodeSection::default(),
        storage: StorageSection::default(),
        state: match opts.state_geometry {
            Some((size_mib, page_bytes, fanout)) => StateSection {
                service: opts.service.clone(),
                size_mib,
                page_bytes,
                fanout,
                ..StateSection::default()
            },
            None => StateSection {
                service: opts.service.clone(),
                ..StateSection::default()
            },
        },
        keys: KeysSection {
            mode: if opts.static_keys {
                "static"
            } else {
                "session"
            }
            .into(),
            ..KeysSection::default()
        },
        recovery: RecoverySection {
            enabled: !opts.static_keys,
            executable_blake3: opts.executable_blake3.clone().unwrap_or_default(),
            ..RecoverySection::default()
        },
        overlay_tunnels: Vec::new(),
    };
    cfg.validate()?;
    let text = cfg.to_toml()?;
    // Check the template before writing anything: what init writes must load.
    ClusterConfig::parse(&config_path, &text)?;

    let mut master = [0u8; 32];
    rng.fill_bytes(&mut master);
    let result = if opts.static_keys {
        write_all_keys(&cfg, &master)
    } else {
        write_holder_files(&cfg, &mut rng)
    };
    // The firewall's keys: the dealer's randomness from the operating system.
    let result = result.and_then(|()| {
        if !cfg.protocol.firewall() && !cfg.protocol.prime() {
            return Ok(());
        }
        redoubt_config::write_firewall_keys(&cfg, &mut || {
            let mut seed = [0u8; 32];
            rng.fill_bytes(&mut seed);
            seed
        })
    });
    // Forget the master secret: it is never written anywhere.
    master.fill(0);
    std::hint::black_box(&master);
    result?;

    // The config is written last: a directory holding redoubt.toml is a complete cluster.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&config_path)
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                ConfigError::InitExists {
                    path: config_path.clone(),
                }
            } else {
                io("create", &config_path)(source)
            }
        })?;
    file.write_all(text.as_bytes())
        .map_err(io("write", &config_path))?;
    file.sync_all().map_err(io("sync", &config_path))?;
    Ok(config_path)
}

/// A base port for a local cluster of `n` replicas (`InitOptions::base_port`): one whose `n`
/// protocol ports and `n` metrics ports are all free on 127.0.0.1 now. Candidates are drawn at
/// random below the kernel's ephemeral range (which outgoing connections take their local
/// ports from), so that concurrent clusters, and the connections of this one, are unlikely to
/// collide.
pub fn free_base_port(n: u16) -> Result<u16, ConfigError> {
    use rand::RngExt as _;
    let (ephemeral_low, _) = ephemeral_range();
    let lowest: u32 = 10_000;
    let span = u32::from(METRICS_PORT_OFFSET) + u32::from(n);
    let highest = u32::from(ephemeral_low)
        .saturating_sub(span + 1)
        .max(lowest + 1000);
    let mut rng = rand::rng();
    for _ in 0..200 {
        let base = rng.random_range(lowest..highest) as u16;
        let all_free = (0..n)
            .flat_map(|i| [base + i, base + METRICS_PORT_OFFSET + i])
            .all(|p| std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok());
        if all_free {
            return Ok(base);
        }
    }
    Err(ConfigError::InitInvalid(format!(
        "cannot find {} free ports on 127.0.0.1 (tried 200 ranges between {lowest} and \
         {highest}); is this machine out of ports?",
        2 * u32::from(n)
    )))
}

/// The kernel's ephemeral port range (Linux), or the IANA one.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((49152, 65535))
}

fn write_all_keys(cfg: &ClusterConfig, master: &[u8]) -> Result<(), ConfigError> {
    for me in cfg.principals() {
        let keys: Vec<_> = cfg
            .peers_of(me)
            .into_iter()
            .map(|peer| {
                (
                    peer,
                    pairwise_key(master, me, peer),
                    pairwise_key(master, peer, me),
                )
            })
            .collect();
        let path = cfg.key_file_of(me)?;
        write_key_file(&path, &cfg.cluster.id, me, &keys)?;
    }
    Ok(())
}

/// Session keys: a key-holder file per principal (a fresh seed from the operating system's
/// generator) and the public-key directory.
fn write_holder_files(cfg: &ClusterConfig, rng: &mut impl rand::Rng) -> Result<(), ConfigError> {
    // The executors' secret, dealt to the key holder of every node that executes: every
    // replica, or in a separated deployment every execution node (and no replica).
    let mut executor_seed = [0u8; 32];
    rng.fill_bytes(&mut executor_seed);
    let executors = ExecutorSecret::from_seed(&executor_seed).public();
    let mut public = Vec::new();
    for me in cfg.principals() {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let path = cfg.key_file_of(me)?;
        let executes = match me {
            Principal::Replica(_) => !cfg.protocol.separated(),
            Principal::Executor(_) => true,
            Principal::Client(_) | Principal::Filter(_) => false,
        };
        let dealt = executes.then_some(&executor_seed);
        let keys = redoubt_keyholder::write_holder_file(&path, &cfg.cluster.id, me, &seed, dealt)
            .map_err(|e| ConfigError::InitInvalid(e.to_string()))?;
        seed.fill(0);
        public.push((me, keys));
    }
    executor_seed.fill(0);
    std::hint::black_box(&executor_seed);
    write_directory(
        &cfg.directory_path(),
        &cfg.cluster.id,
        &public,
        Some(&executors),
    )
}
