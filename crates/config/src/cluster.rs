//! The cluster file as a whole: [`ClusterConfig`], read and validated.

use crate::error::{ConfigError, Location};
use crate::sections::{
    ClientEntry, ClientSection, ClusterSection, FilterEntry, KeysSection, NodeSection,
    OverlayTunnel, RecoverySection, ReplicaEntry, StateSection, StorageSection, KEY_MODES,
    LOG_FORMATS, SERVICES,
};
use redoubt_core::{ClientId, ClientTiming, Config, Principal, ReplicaId};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplica {
    id: Spanned<ReplicaId>,
    #[serde(deserialize_with = "crate::addr::addr")]
    addr: SocketAddr,
    #[serde(deserialize_with = "crate::addr::metrics_addr")]
    metrics_addr: SocketAddr,
    home: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    holder_socket: Option<PathBuf>,
}

impl RawReplica {
    fn entry(self) -> ReplicaEntry {
        ReplicaEntry {
            id: self.id.into_inner(),
            addr: self.addr,
            metrics_addr: self.metrics_addr,
            home: self.home,
            key_file: self.key_file,
            holder_socket: self.holder_socket,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    id: Spanned<ClientId>,
    key_file: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    cluster: ClusterSection,
    #[serde(rename = "replica")]
    replicas: Vec<RawReplica>,
    #[serde(rename = "executor", default)]
    executors: Vec<RawReplica>,
    #[serde(rename = "filter", default)]
    filters: Vec<FilterEntry>,
    #[serde(rename = "client", default)]
    clients: Vec<RawClient>,
    #[serde(
        default = "crate::protocol::defaults",
        deserialize_with = "crate::protocol::deserialize"
    )]
    protocol: Config,
    #[serde(rename = "client_timing", default)]
    client: ClientSection,
    #[serde(default)]
    node: NodeSection,
    #[serde(default)]
    storage: StorageSection,
    #[serde(default)]
    state: StateSection,
    #[serde(default)]
    keys: KeysSection,
    #[serde(default)]
    recovery: RecoverySection,
    #[serde(rename = "overlay_tunnel", default)]
    overlay_tunnels: Vec<OverlayTunnel>,
}

/// The whole cluster configuration, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The file it was loaded from; relative paths inside resolve against its directory.
    pub path: PathBuf,
    /// `[cluster]`.
    pub cluster: ClusterSection,
    /// `[[replica]]`, sorted by id: `replicas[i].id == i`.
    pub replicas: Vec<ReplicaEntry>,
    /// `[[executor]]` (separated deployment, `[protocol] executors` of them), sorted by id:
    /// `executors[i].id == i`. The same fields as a replica's.
    pub executors: Vec<ReplicaEntry>,
    /// `[[filter]]` (firewall deployment, `(h+1)²` of them for `[protocol] filter_rows` =
    /// h+1), sorted by id: `filters[i].id == i`.
    pub filters: Vec<FilterEntry>,
    /// `[[client]]`, sorted by id.
    pub clients: Vec<ClientEntry>,
    /// `[protocol]`: the core's own configuration; options left out of the file have the
    /// values of [`crate::protocol::defaults`].
    pub protocol: Config,
    /// `[client_timing]`.
    pub client: ClientSection,
    /// `[node]`.
    pub node: NodeSection,
    /// `[storage]`.
    pub storage: StorageSection,
    /// `[state]`.
    pub state: StateSection,
    /// `[keys]`.
    pub keys: KeysSection,
    /// `[recovery]`.
    pub recovery: RecoverySection,
    /// `[[overlay_tunnel]]` (overlay mode): replica pairs that talk through overlay daemons.
    pub overlay_tunnels: Vec<OverlayTunnel>,
}

/// Applies `section.key=value` assignments to configuration text (values parse as TOML:
/// `true`, `64`, `"text"`; a bare word is taken as a string). The result still has to pass
/// [`ClusterConfig::parse`].
pub fn override_toml(src: &str, assignments: &[String]) -> Result<String, String> {
    let mut table: toml::Table = src.parse().map_err(|e| format!("{e}"))?;
    for a in assignments {
        let (path, value) = a
            .split_once('=')
            .ok_or_else(|| format!("`{a}`: expected section.key=value"))?;
        let (section, key) = path
            .trim()
            .split_once('.')
            .ok_or_else(|| format!("`{a}`: expected section.key=value"))?;
        let value = value.trim();
        let parsed: toml::Value = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        let entry = table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(t) = entry else {
            return Err(format!("`{section}` is not a section"));
        };
        t.insert(key.to_string(), parsed);
    }
    toml::to_string(&table).map_err(|e| format!("{e}"))
}

impl ClusterConfig {
    /// Reads, parses and validates the configuration file at `path`.
    pub fn load(path: &Path) -> Result<ClusterConfig, ConfigError> {
        let src = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &src)
    }

    /// Parses and validates configuration text as if it had been read from `path`.
    pub fn parse(path: &Path, src: &str) -> Result<ClusterConfig, ConfigError> {
        // Syntax first, so that syntax errors and schema errors are told apart.
        if let Err(e) = src.parse::<toml::Table>() {
            return Err(ConfigError::Syntax {
                path: path.to_path_buf(),
                at: Location::of(src, e.span()),
                message: e.message().trim().to_string(),
            });
        }
        let raw: RawConfig = toml::from_str(src).map_err(|e| {
            let (message, hint) = schema_message(e.message());
            ConfigError::Schema {
                path: path.to_path_buf(),
                at: Location::of(src, e.span()),
                message,
                hint,
            }
        })?;
        let mut cfg = ClusterConfig {
            path: path.to_path_buf(),
            cluster: raw.cluster,
            replicas: Vec::new(),
            executors: Vec::new(),
            filters: Vec::new(),
            clients: Vec::new(),
            protocol: raw.protocol,
            client: raw.client,
            node: raw.node,
            storage: raw.storage,
            state: raw.state,
            keys: raw.keys,
            recovery: raw.recovery,
            overlay_tunnels: raw.overlay_tunnels,
        };

        cfg.protocol
            .validate()
            .map_err(|message| ConfigError::Protocol {
                path: cfg.path.clone(),
                message,
            })?;

        // Replicas: exactly 3f+1, ids exactly 0..n.
        let f = cfg.protocol.f;
        let expected = cfg.protocol.n();
        let found = raw.replicas.len();
        if found != expected as usize {
            return Err(ConfigError::ReplicaCount {
                path: cfg.path.clone(),
                f,
                expected,
                found,
                advice: replica_count_advice(expected, found),
            });
        }
        let mut seen: BTreeMap<ReplicaId, Location> = BTreeMap::new();
        for r in &raw.replicas {
            let at = Location::of(src, Some(r.id.span()));
            if let Some(first) = seen.get(r.id.get_ref()) {
                return Err(ConfigError::ReplicaIds {
                    path: cfg.path.clone(),
                    last: expected.saturating_sub(1),
                    problem: format!("id {} is listed twice ({first} and {at})", r.id.get_ref()),
                });
            }
            seen.insert(*r.id.get_ref(), at);
        }
        if let Some((&id, at)) = seen.iter().find(|(&id, _)| id >= expected) {
            let missing: Vec<String> = (0..expected)
                .filter(|i| !seen.contains_key(i))
                .map(|i| i.to_string())
                .collect();
            return Err(ConfigError::ReplicaIds {
                path: cfg.path.clone(),
                last: expected.saturating_sub(1),
                problem: format!(
                    "id {id} at {at} is out of range (missing: {})",
                    missing.join(", ")
                ),
            });
        }
        cfg.replicas = raw.replicas.into_iter().map(RawReplica::entry).collect();
        cfg.replicas.sort_by_key(|r| r.id);
        cfg.executors = raw.executors.into_iter().map(RawReplica::entry).collect();
        cfg.executors.sort_by_key(|r| r.id);
        cfg.filters = raw.filters;
        cfg.filters.sort_by_key(|x| x.id);

        // Clients: distinct ids.
        let mut seen: BTreeMap<ClientId, Location> = BTreeMap::new();
        for c in &raw.clients {
            let at = Location::of(src, Some(c.id.span()));
            if let Some(first) = seen.get(c.id.get_ref()) {
                return Err(ConfigError::DuplicateClient {
                    path: cfg.path.clone(),
                    id: *c.id.get_ref(),
                    at: format!(" ({first} and {at})"),
                });
            }
            seen.insert(*c.id.get_ref(), at);
        }
        cfg.clients = raw
            .clients
            .into_iter()
            .map(|c| ClientEntry {
                id: c.id.into_inner(),
                key_file: c.key_file,
            })
            .collect();
        cfg.clients.sort_by_key(|c| c.id);

        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks everything that does not depend on positions in the file: protocol values,
    /// distinct endpoints and homes, runtime settings. `load` calls it; `redoubt init` calls
    /// it on the configuration it is about to write.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let path = || self.path.clone();
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            path: self.path.clone(),
            field: field.to_string(),
            message,
        };
        if self.cluster.id.trim().is_empty() {
            return Err(invalid(
                "[cluster] id",
                "it must not be empty; it ties the key files to this cluster (copy it from the key files, or rerun `redoubt init`)".into(),
            ));
        }
        self.protocol
            .validate()
            .map_err(|message| ConfigError::Protocol {
                path: path(),
                message,
            })?;
        if self.protocol.confidential_bodies && !self.keys.session() {
            return Err(invalid(
                "[protocol] confidential_bodies",
                "it needs [keys] mode = \"session\": the executors' secret lives in each \
                 replica's key holder (set confidential_bodies = false to run with static keys, \
                 bodies in clear)"
                    .into(),
            ));
        }
        if self.protocol.prime() && !self.keys.session() {
            return Err(invalid(
                "[protocol] ordering",
                "ordering = \"prime\" needs [keys] mode = \"session\": replicas sign their \
                 PO-ARU rows and clients their requests with keys their key holders keep"
                    .into(),
            ));
        }
        let n = self.protocol.n() as usize;
        if self.replicas.len() != n {
            return Err(ConfigError::ReplicaCount {
                path: path(),
                f: self.protocol.f,
                expected: n as u32,
                found: self.replicas.len(),
                advice: replica_count_advice(n as u32, self.replicas.len()),
            });
        }
        if let Some((i, r)) = self
            .replicas
            .iter()
            .enumerate()
            .find(|(i, r)| r.id as usize != *i)
        {
            return Err(ConfigError::ReplicaIds {
                path: path(),
                last: n as u32 - 1,
                problem: format!("entry {i} (in id order) has id {}", r.id),
            });
        }
        let e = self.protocol.executors as usize;
        if self.executors.len() != e
            || self
                .executors
                .iter()
                .enumerate()
                .any(|(i, x)| x.id as usize != i)
        {
            return Err(invalid(
                "[[executor]]",
                format!(
                    "[protocol] executors = {e} needs exactly {e} [[executor]] entries with ids \
                     0 to {}, found {} (rerun `redoubt init --agreement N --execution M`)",
                    e.max(1) - 1,
                    self.executors.len()
                ),
            ));
        }
        let x = self.protocol.filters() as usize;
        if self.filters.len() != x
            || self
                .filters
                .iter()
                .enumerate()
                .any(|(i, f)| f.id as usize != i)
        {
            return Err(invalid(
                "[[filter]]",
                format!(
                    "[protocol] filter_rows = {} needs exactly {x} [[filter]] entries with ids \
                     0 to {}, found {} (rerun `redoubt init --agreement N --execution M \
                     --firewall H`)",
                    self.protocol.filter_rows,
                    x.max(1) - 1,
                    self.filters.len()
                ),
            ));
        }
        self.validate_overlay_tunnels()?;
        let mut endpoints: BTreeMap<SocketAddr, String> = BTreeMap::new();
        let nodes = self
            .replicas
            .iter()
            .map(|r| ("replica", r.id, r.addr, r.metrics_addr))
            .chain(
                self.executors
                    .iter()
                    .map(|x| ("executor", x.id, x.addr, x.metrics_addr)),
            )
            .chain(
                self.filters
                    .iter()
                    .map(|x| ("filter", x.id, x.addr, x.metrics_addr)),
            );
        for (role, id, addr, metrics_addr) in nodes {
            for (what, addr) in [("addr", addr), ("metrics_addr", metrics_addr)] {
                let name = format!("{role} {id} {what}");
                if let Some(first) = endpoints.get(&addr) {
                    return Err(ConfigError::DuplicateAddress {
                        path: path(),
                        addr,
                        first: first.clone(),
                        second: name,
                    });
                }
                endpoints.insert(addr, name);
            }
        }
        let mut homes: BTreeMap<PathBuf, ReplicaId> = BTreeMap::new();
        for r in &self.replicas {
            let home = self.resolve(&r.home);
            if let Some(&first) = homes.get(&home) {
                return Err(ConfigError::DuplicateHome {
                    path: path(),
                    home,
                    first,
                    second: r.id,
                });
            }
            homes.insert(home, r.id);
        }
        let mut exec_homes: BTreeSet<PathBuf> = BTreeSet::new();
        for x in &self.executors {
            let home = self.resolve(&x.home);
            if homes.contains_key(&home) || !exec_homes.insert(home.clone()) {
                return Err(invalid(
                    "[[executor]] home",
                    format!(
                        "executor {}'s home {} is another node's home",
                        x.id,
                        home.display()
                    ),
                ));
            }
        }
        let mut ids = BTreeSet::new();
        for c in &self.clients {
            if !ids.insert(c.id) {
                return Err(ConfigError::DuplicateClient {
                    path: path(),
                    id: c.id,
                    at: String::new(),
                });
            }
        }

        let c = &self.client;
        if c.retransmit_min_ms == 0 || c.retransmit_min_ms > c.retransmit_max_ms {
            return Err(invalid(
                "[client_timing] retransmit_min_ms",
                format!(
                    "need 0 < retransmit_min_ms ({}) <= retransmit_max_ms ({})",
                    c.retransmit_min_ms, c.retransmit_max_ms
                ),
            ));
        }
        if c.initial_rtt_ms == 0 {
            return Err(invalid(
                "[client_timing] initial_rtt_ms",
                "it must be positive".into(),
            ));
        }
        if c.deadline_ms == 0 {
            return Err(invalid(
                "[client_timing] deadline_ms",
                "it must be positive".into(),
            ));
        }
        let nd = &self.node;
        if nd.tick_ms == 0 {
            return Err(invalid("[node] tick_ms", "it must be positive".into()));
        }
        if nd.peer_queue_frames_max == 0 {
            return Err(invalid(
                "[node] peer_queue_frames_max",
                "it must be positive".into(),
            ));
        }
        if nd.client_connections_max == 0 {
            return Err(invalid(
                "[node] client_connections_max",
                "it must be positive".into(),
            ));
        }
        if nd.reconnect_backoff_min_ms == 0
            || nd.reconnect_backoff_min_ms > nd.reconnect_backoff_max_ms
        {
            return Err(invalid(
                "[node] reconnect_backoff_min_ms",
                format!(
                    "need 0 < reconnect_backoff_min_ms ({}) <= reconnect_backoff_max_ms ({})",
                    nd.reconnect_backoff_min_ms, nd.reconnect_backoff_max_ms
                ),
            ));
        }
        if !LOG_FORMATS.contains(&nd.log_format.as_str()) {
            return Err(invalid(
                "[node] log_format",
                format!(
                    "\"{}\" is not one of \"human\", \"json\"",
                    nd.log_format.escape_debug()
                ),
            ));
        }
        if let Err(problem) = self.state.geometry() {
            return Err(invalid("[state]", problem));
        }
        if !SERVICES.contains(&self.state.service.as_str()) {
            return Err(invalid(
                "[state] service",
                format!(
                    "\"{}\" is not one of \"kv\", \"sql\", \"files\"",
                    self.state.service.escape_debug()
                ),
            ));
        }
        if !KEY_MODES.contains(&self.keys.mode.as_str()) {
            return Err(invalid(
                "[keys] mode",
                format!(
                    "\"{}\" is not one of \"session\", \"static\"",
                    self.keys.mode.escape_debug()
                ),
            ));
        }
        let rc = &self.recovery;
        if rc.alert_after_s == 0 || rc.watchdog_period_min_s == 0 {
            return Err(invalid(
                "[recovery] alert_after_s",
                "alert_after_s and watchdog_period_min_s must be positive".into(),
            ));
        }
        if rc.enabled && !self.keys.session() {
            return Err(invalid(
                "[recovery] enabled",
                "proactive recovery needs session keys: set [keys] mode = \"session\" or [recovery] enabled = false".into(),
            ));
        }
        if !rc.executable_blake3.is_empty()
            && redoubt_keyholder::unhex32(&rc.executable_blake3).is_err()
        {
            return Err(invalid(
                "[recovery] executable_blake3",
                "it must be 64 hex digits (the BLAKE3 hash of the replica executable) or empty"
                    .into(),
            ));
        }
        if self.storage.page_cache_mib > 1 << 20 {
            return Err(invalid(
                "[storage] page_cache_mib",
                "it must be at most 1048576 (1 TiB)".into(),
            ));
        }
        Ok(())
    }

    /// The entry of replica `id`.
    pub fn replica(&self, id: ReplicaId) -> Result<&ReplicaEntry, ConfigError> {
        self.replicas
            .iter()
            .find(|r| r.id == id)
            .ok_or_else(|| ConfigError::UnknownReplica {
                path: self.path.clone(),
                id,
                valid: match self.replicas.len() {
                    0 => "none".into(),
                    n => format!("0 to {}", n - 1),
                },
            })
    }

    /// The entry of client `id`.
    pub fn client_entry(&self, id: ClientId) -> Result<&ClientEntry, ConfigError> {
        self.clients
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| ConfigError::UnknownClient {
                path: self.path.clone(),
                id,
                valid: if self.clients.is_empty() {
                    "it lists no clients: add a [[client]] entry with its own key file (or rerun `redoubt init --clients N`)".into()
                } else {
                    let ids: Vec<String> = self.clients.iter().map(|c| c.id.to_string()).collect();
                    format!("valid client ids are {}", ids.join(", "))
                },
            })
    }

    /// The address replica `from` dials to reach replica `to`: its overlay tunnel port when
    /// the file has an `[[overlay_tunnel]]` for the pair, else `to`'s own `addr`.
    pub fn peer_addr(&self, from: ReplicaId, to: ReplicaId) -> SocketAddr {
        self.overlay_tunnels
            .iter()
            .find(|t| t.replica == Some(from) && t.peer == to)
            .map_or(self.replicas[to as usize].addr, |t| t.addr)
    }

    /// The address client `client` dials to reach replica `to`: an overlay tunnel port when
    /// the file has an `[[overlay_tunnel]]` with `client` for the pair, else `to`'s `addr`.
    pub fn client_peer_addr(&self, client: ClientId, to: ReplicaId) -> SocketAddr {
        self.overlay_tunnels
            .iter()
            .find(|t| t.client == Some(client) && t.peer == to)
            .map_or(self.replicas[to as usize].addr, |t| t.addr)
    }

    /// `[[overlay_tunnel]]`: exactly one of replica and client, both ends known, each pair
    /// once.
    fn validate_overlay_tunnels(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: self.path.clone(),
            field: "[[overlay_tunnel]]".into(),
            message,
        };
        let n = self.replicas.len();
        let mut tunnels = BTreeSet::new();
        for t in &self.overlay_tunnels {
            let from = match (t.replica, t.client) {
                (Some(r), None) => {
                    if r as usize >= n || r == t.peer {
                        return Err(invalid(format!(
                            "replica {r} -> peer {}: both must be different replica ids below {n}",
                            t.peer
                        )));
                    }
                    format!("replica {r}")
                }
                (None, Some(c)) => {
                    if self.clients.iter().all(|e| e.id != c) {
                        return Err(invalid(format!(
                            "client {c} -> peer {}: client {c} has no [[client]] entry",
                            t.peer
                        )));
                    }
                    format!("client {c}")
                }
                _ => {
                    return Err(invalid(format!(
                        "the entry for peer {} (addr {}) must name exactly one of replica and \
                         client: the one that dials addr",
                        t.peer, t.addr
                    )))
                }
            };
            if t.peer as usize >= n {
                return Err(invalid(format!(
                    "{from} -> peer {}: the peer must be a replica id below {n}",
                    t.peer
                )));
            }
            if !tunnels.insert((from.clone(), t.peer)) {
                return Err(invalid(format!(
                    "{from} -> peer {} is listed twice",
                    t.peer
                )));
            }
        }
        Ok(())
    }

    /// Resolves a path of the file: absolute paths as they are, relative ones against the
    /// directory of the config file.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            return p.to_path_buf();
        }
        match self.path.parent() {
            Some(dir) => dir.join(p),
            None => p.to_path_buf(),
        }
    }

    /// Every principal of the cluster: all replicas (by id), then all clients (by id), then
    /// all execution nodes (by id).
    pub fn principals(&self) -> Vec<Principal> {
        self.replicas
            .iter()
            .map(|r| Principal::Replica(r.id))
            .chain(self.clients.iter().map(|c| Principal::Client(c.id)))
            .chain(self.executors.iter().map(|x| Principal::Executor(x.id)))
            .collect()
    }

    /// The entry of execution node `id`.
    pub fn executor(&self, id: u32) -> Result<&ReplicaEntry, ConfigError> {
        self.executors
            .iter()
            .find(|x| x.id == id)
            .ok_or_else(|| ConfigError::Invalid {
                path: self.path.clone(),
                field: "[[executor]]".into(),
                message: format!(
                    "there is no execution node {id} (the file lists {})",
                    self.executors.len()
                ),
            })
    }

    /// Whether `p` is a replica or client of this cluster.
    pub fn has_principal(&self, p: Principal) -> bool {
        match p {
            Principal::Replica(r) => self.replicas.iter().any(|e| e.id == r),
            Principal::Client(c) => self.clients.iter().any(|e| e.id == c),
            Principal::Executor(x) => self.executors.iter().any(|e| e.id == x),
            Principal::Filter(x) => x < self.protocol.filters(),
        }
    }

    /// The peers `p` shares keys with: a replica or execution node with every other
    /// principal, a client with every replica and execution node.
    pub fn peers_of(&self, p: Principal) -> Vec<Principal> {
        match p {
            Principal::Replica(_) | Principal::Executor(_) => {
                self.principals().into_iter().filter(|q| *q != p).collect()
            }
            Principal::Client(_) => self
                .principals()
                .into_iter()
                .filter(|q| !matches!(q, Principal::Client(_)))
                .collect(),
            // Filters hold no keys: what they pass on authenticates itself.
            Principal::Filter(_) => Vec::new(),
        }
    }

    /// The resolved Unix socket of replica `id`'s key holder.
    pub fn holder_socket_of(&self, id: ReplicaId) -> Result<PathBuf, ConfigError> {
        self.holder_socket_for(Principal::Replica(id))
    }

    /// The resolved Unix socket of the key holder of replica or execution node `p`.
    pub fn holder_socket_for(&self, p: Principal) -> Result<PathBuf, ConfigError> {
        let (r, name) = match p {
            Principal::Replica(id) => (self.replica(id)?, format!("keyholder-{id}.sock")),
            Principal::Executor(id) => {
                (self.executor(id)?, format!("keyholder-executor-{id}.sock"))
            }
            Principal::Client(_) => {
                return Err(ConfigError::Invalid {
                    path: self.path.clone(),
                    field: "holder_socket".into(),
                    message: "clients hold their keys in their key file, not a key holder".into(),
                })
            }
            Principal::Filter(_) => {
                return Err(ConfigError::Invalid {
                    path: self.path.clone(),
                    field: "holder_socket".into(),
                    message: "filter nodes hold no keys, and have no key holder".into(),
                })
            }
        };
        Ok(match &r.holder_socket {
            Some(p) => self.resolve(p),
            // Beside the home directory, not in it: emptying a node's disk must not cut it
            // off from its key holder.
            None => {
                let home = self.resolve(&r.home);
                let dir = home.parent().map(Path::to_path_buf).unwrap_or_default();
                dir.join(name)
            }
        })
    }

    /// The resolved public-key directory file.
    pub fn directory_path(&self) -> PathBuf {
        self.resolve(&self.keys.directory)
    }

    /// The watchdog period T_w (ms) for a longest observed recovery of `recovery_ms` (0 when
    /// none was observed yet).
    pub fn watchdog_period_ms(&self, recovery_ms: u64) -> u64 {
        if self.recovery.watchdog_period_s > 0 {
            return self.recovery.watchdog_period_s * 1000;
        }
        let derived = self.protocol.n() as u64 * 2 * recovery_ms;
        derived.max(self.recovery.watchdog_period_min_s * 1000)
    }

    /// The resolved key file of `p`.
    pub fn key_file_of(&self, p: Principal) -> Result<PathBuf, ConfigError> {
        let rel = match p {
            Principal::Replica(r) => &self.replica(r)?.key_file,
            Principal::Client(c) => &self.client_entry(c)?.key_file,
            Principal::Executor(x) => &self.executor(x)?.key_file,
            Principal::Filter(_) => {
                return Err(ConfigError::Invalid {
                    path: self.path.clone(),
                    field: "key_file".into(),
                    message: "filter nodes hold no keys, and have no key file".into(),
                })
            }
        };
        Ok(self.resolve(rel))
    }

    /// Client timing for `redoubt_core::Client`.
    pub fn client_timing(&self) -> ClientTiming {
        ClientTiming {
            retransmit_min_ms: self.client.retransmit_min_ms,
            retransmit_max_ms: self.client.retransmit_max_ms,
            initial_rtt_ms: self.client.initial_rtt_ms,
        }
    }
}

/// serde's message, worded for a config file, and what to do about it.
fn schema_message(m: &str) -> (String, &'static str) {
    let m = m.trim();
    if let Some(rest) = m.strip_prefix("unknown field") {
        (
            format!("unknown option{rest}"),
            "fix or remove it (every option is listed in docs/configuration.md)",
        )
    } else if m.starts_with("missing field") {
        (
            m.to_string(),
            "add it (docs/configuration.md lists the required keys)",
        )
    } else {
        (
            m.to_string(),
            "fix the value (docs/configuration.md gives each option's type and unit)",
        )
    }
}

fn replica_count_advice(expected: u32, found: usize) -> String {
    if found >= 4 && (found - 1).is_multiple_of(3) {
        format!(
            "list {expected} replicas, or set f = {} in [protocol]",
            (found - 1) / 3
        )
    } else {
        format!(
            "list {expected} replicas (the count must be 3f+1: 4, 7, 10, ...), or change f in [protocol]"
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A configuration with a value of every kind: quotes in a string, IPv6, absolute and
    /// relative paths, an optional field set on one replica only.
    pub(crate) fn sample() -> ClusterConfig {
        ClusterConfig {
            path: PathBuf::from("/etc/redoubt/redoubt.toml"),
            cluster: ClusterSection {
                name: "t \"quoted\"".into(),
                id: "00ff".into(),
            },
            executors: Vec::new(),
            filters: Vec::new(),
            replicas: (0..4)
                .map(|i| ReplicaEntry {
                    id: i,
                    addr: format!("127.0.0.1:{}", 7400 + i).parse().unwrap(),
                    metrics_addr: format!("[::1]:{}", 7500 + i).parse().unwrap(),
                    home: PathBuf::from(format!("replica-{i}")),
                    key_file: PathBuf::from(format!("/abs/keys/replica-{i}.key")),
                    holder_socket: (i == 2).then(|| PathBuf::from("/run/redoubt/r2.sock")),
                })
                .collect(),
            clients: vec![ClientEntry {
                id: 9,
                key_file: "keys/client-9.key".into(),
            }],
            protocol: Config::new(1),
            client: ClientSection::default(),
            node: NodeSection::default(),
            storage: StorageSection::default(),
            state: StateSection::default(),
            keys: KeysSection::default(),
            recovery: RecoverySection {
                watchdog_period_s: 90,
                ..RecoverySection::default()
            },
            overlay_tunnels: vec![
                OverlayTunnel {
                    replica: Some(0),
                    client: None,
                    peer: 1,
                    addr: "127.0.0.1:7601".parse().unwrap(),
                },
                OverlayTunnel {
                    replica: None,
                    client: Some(9),
                    peer: 2,
                    addr: "127.0.0.1:7602".parse().unwrap(),
                },
            ],
        }
    }

    #[test]
    fn to_toml_round_trips() {
        let mut cfg = sample();
        cfg.storage.fsync = false;
        cfg.node.log_format = "json".into();
        cfg.protocol.log_size = 512;
        cfg.protocol.primary_replies = true;
        let back = ClusterConfig::parse(&cfg.path, &cfg.to_toml().unwrap()).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(
            back.resolve(Path::new("replica-1")),
            PathBuf::from("/etc/redoubt/replica-1")
        );
        assert_eq!(back.resolve(Path::new("/abs/x")), PathBuf::from("/abs/x"));
    }

    #[test]
    fn overlay_tunnels_route_only_their_pair_and_are_checked() {
        let cfg = sample();
        // Replica 0 reaches 1 through its tunnel; every other pair (1 -> 0 included) directly.
        assert_eq!(cfg.peer_addr(0, 1), "127.0.0.1:7601".parse().unwrap());
        assert_eq!(cfg.peer_addr(1, 0), cfg.replicas[0].addr);
        assert_eq!(cfg.peer_addr(0, 2), cfg.replicas[2].addr);
        let text = cfg.to_toml().unwrap();
        let bad = |entry: &str| {
            let t = format!("{text}\n[[overlay_tunnel]]\n{entry}\n");
            ClusterConfig::parse(&cfg.path, &t).unwrap_err().to_string()
        };
        let e = bad("replica = 0\npeer = 1\naddr = \"127.0.0.1:7602\"");
        assert!(e.contains("listed twice"), "{e}");
        let e = bad("replica = 2\npeer = 2\naddr = \"127.0.0.1:7602\"");
        assert!(e.contains("different replica ids"), "{e}");
        let e = bad("replica = 1\npeer = 4\naddr = \"127.0.0.1:7602\"");
        assert!(e.contains("below 4"), "{e}");
    }

    #[test]
    fn client_overlay_tunnels_route_only_their_client_and_are_checked() {
        let cfg = sample();
        // Client 9 reaches replica 2 through the tunnel, the others directly; replica 0's
        // tunnel to 1 is not the client's.
        assert_eq!(
            cfg.client_peer_addr(9, 2),
            "127.0.0.1:7602".parse().unwrap()
        );
        assert_eq!(cfg.client_peer_addr(9, 1), cfg.replicas[1].addr);
        assert_eq!(cfg.client_peer_addr(8, 2), cfg.replicas[2].addr);
        assert_eq!(cfg.peer_addr(0, 2), cfg.replicas[2].addr);
        let text = cfg.to_toml().unwrap();
        let bad = |entry: &str| {
            let t = format!("{text}\n[[overlay_tunnel]]\n{entry}\n");
            ClusterConfig::parse(&cfg.path, &t).unwrap_err().to_string()
        };
        let e = bad("client = 9\npeer = 2\naddr = \"127.0.0.1:7603\"");
        assert!(e.contains("client 9 -> peer 2 is listed twice"), "{e}");
        let e = bad("client = 7\npeer = 2\naddr = \"127.0.0.1:7603\"");
        assert!(e.contains("no [[client]] entry"), "{e}");
        let e = bad("client = 9\npeer = 4\naddr = \"127.0.0.1:7603\"");
        assert!(e.contains("below 4"), "{e}");
        let e = bad("replica = 1\nclient = 9\npeer = 3\naddr = \"127.0.0.1:7603\"");
        assert!(e.contains("exactly one of replica and client"), "{e}");
        let e = bad("peer = 3\naddr = \"127.0.0.1:7603\"");
        assert!(e.contains("exactly one of replica and client"), "{e}");
        // One client may reach every replica through tunnels, another replica's too.
        let ok = format!(
            "{text}\n[[overlay_tunnel]]\nclient = 9\npeer = 0\naddr = \"127.0.0.1:7601\"\n"
        );
        let back = ClusterConfig::parse(&cfg.path, &ok).unwrap();
        assert_eq!(
            back.client_peer_addr(9, 0),
            "127.0.0.1:7601".parse().unwrap()
        );
    }

    #[test]
    fn override_toml_sets_options() {
        let text = sample().to_toml().unwrap();
        let changed = override_toml(
            &text,
            &["protocol.f=2".into(), "node.log_format = json".into()],
        )
        .unwrap();
        let table: toml::Table = changed.parse().unwrap();
        assert_eq!(table["protocol"]["f"].as_integer(), Some(2));
        assert_eq!(table["node"]["log_format"].as_str(), Some("json"));
        assert!(override_toml(&text, &["protocol".into()]).is_err());
        assert!(override_toml(&text, &["replica.id=1".into()]).is_err());
    }
}
