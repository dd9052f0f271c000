//! The cluster configuration file (TOML): one file describes the whole cluster — its
//! replicas, its clients, the protocol parameters and the node runtime settings.
//!
//! Every option, its default and its unit is documented in `docs/configuration.md`; the file
//! that `redoubt init` writes ([`ClusterConfig::to_toml`]) lists every option with a comment.
//! Unknown keys are errors, so a misspelt option never silently falls back to its default.

use redoubt_core::{ClientId, ClientTiming, Config, Principal, ReplicaId};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Everything that can go wrong loading a configuration or key file, or initialising a
/// cluster. Every message names the file concerned and says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file is missing or unreadable.
    #[error("cannot read config file {path}: {source}; create one with `redoubt init`")]
    Read { path: PathBuf, source: io::Error },

    /// The file is not valid TOML.
    #[error(
        "config file {path}: TOML syntax error at {at}: {message}; fix the syntax at that position"
    )]
    Syntax {
        path: PathBuf,
        at: Location,
        message: String,
    },

    /// The TOML is valid but does not fit the schema: unknown key, wrong type, missing key.
    #[error("config file {path}: {message} at {at}; {hint}")]
    Schema {
        path: PathBuf,
        at: Location,
        message: String,
        /// What to do about it.
        hint: &'static str,
    },

    /// The number of `[[replica]]` entries is not `3f+1`.
    #[error(
        "config file {path}: [protocol] f = {f} requires exactly 3f+1 = {expected} replicas, but {found} [[replica]] entries are listed; {advice}"
    )]
    ReplicaCount {
        path: PathBuf,
        f: u32,
        expected: u32,
        found: usize,
        advice: String,
    },

    /// Replica ids are not exactly `0..n`.
    #[error(
        "config file {path}: replica ids must be exactly 0..={last}, each once, but {problem}; renumber the [[replica]] entries"
    )]
    ReplicaIds {
        path: PathBuf,
        last: u32,
        problem: String,
    },

    /// Two `[[client]]` entries have the same id.
    #[error(
        "config file {path}: client id {id} is listed twice{at}; give every [[client]] a distinct id"
    )]
    DuplicateClient {
        path: PathBuf,
        id: ClientId,
        /// Where, e.g. ` (line 3, column 6 and line 9, column 6)`; empty when unknown.
        at: String,
    },

    /// Two replica endpoints (protocol or metrics) share an address.
    #[error(
        "config file {path}: {first} and {second} are both {addr}; every replica's addr and metrics_addr must be distinct"
    )]
    DuplicateAddress {
        path: PathBuf,
        addr: SocketAddr,
        first: String,
        second: String,
    },

    /// Two replicas share a data directory.
    #[error(
        "config file {path}: replicas {first} and {second} both use home {home}; give every replica its own data directory"
    )]
    DuplicateHome {
        path: PathBuf,
        home: PathBuf,
        first: ReplicaId,
        second: ReplicaId,
    },

    /// The `[protocol]` values are incoherent (`redoubt_core::Config::validate`).
    #[error("config file {path}: invalid [protocol] section: {message}")]
    Protocol { path: PathBuf, message: String },

    /// An option outside `[protocol]` has an invalid value.
    #[error("config file {path}: invalid value for {field}: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },

    /// A replica id that the file does not list was asked for.
    #[error("config file {path} has no replica {id}; valid replica ids are {valid}")]
    UnknownReplica {
        path: PathBuf,
        id: ReplicaId,
        valid: String,
    },

    /// A client id that the file does not list was asked for.
    #[error("config file {path} has no client {id}; {valid}")]
    UnknownClient {
        path: PathBuf,
        id: ClientId,
        valid: String,
    },

    /// A key file is missing or unreadable.
    #[error(
        "cannot read key file {path} of {principal}: {source}; key files are created by `redoubt init`"
    )]
    KeyRead {
        principal: String,
        path: PathBuf,
        source: io::Error,
    },

    /// A key-holder file (session keys) cannot be used.
    #[error("{0}; key-holder files are created by `redoubt init`")]
    HolderFile(#[from] crate::holder::HolderFileError),

    /// The public-key directory is missing, malformed or incomplete.
    #[error("public-key directory {path}: {message}; it is written by `redoubt init` next to redoubt.toml")]
    Directory { path: PathBuf, message: String },

    /// The replica's key holder does not answer.
    #[error("key holder of {principal} at {socket}: {message}; start it with `redoubt monitor --config {config} --id {id}` (which runs the key holder and the replica) or `redoubt keyholder --config {config} --id {id}`")]
    KeyHolder {
        principal: String,
        socket: PathBuf,
        message: String,
        config: PathBuf,
        id: u32,
    },

    /// A key file is not valid TOML or does not fit the key file schema.
    #[error("key file {path}: {message} at {at}; regenerate the keys with `redoubt init`")]
    KeyMalformed {
        path: PathBuf,
        at: Location,
        message: String,
    },

    /// A key file belongs to another principal.
    #[error(
        "key file {path} belongs to {found}, not {expected}; check key_file of {expected} in the config file"
    )]
    KeyOwner {
        path: PathBuf,
        found: String,
        expected: String,
    },

    /// A key file belongs to another cluster.
    #[error(
        "key file {path} belongs to cluster {found}, but config file {config} is cluster {expected}; use the key files that `redoubt init` wrote with this config"
    )]
    KeyCluster {
        path: PathBuf,
        config: PathBuf,
        found: String,
        expected: String,
    },

    /// A key file lacks the keys for a peer of the cluster.
    #[error(
        "key file {path} of {principal} has no keys for {peer}, which is in config file {config}; regenerate the keys with `redoubt init`"
    )]
    KeyMissingPeer {
        path: PathBuf,
        config: PathBuf,
        principal: String,
        peer: String,
    },

    /// A key is not 32 bytes of hex.
    #[error(
        "key file {path}: `{field}` key of peer {peer} at {at} {problem}; a key is 64 hex digits (32 bytes)"
    )]
    KeyBadHex {
        path: PathBuf,
        peer: String,
        field: &'static str,
        at: Location,
        problem: String,
    },

    /// A key file is readable or writable by group or others.
    #[error(
        "key file {path} has mode {mode:04o}: it must not be accessible by group or others; run `chmod 600 {path}`"
    )]
    KeyPermissions { path: PathBuf, mode: u32 },

    /// `write_key_file` found the file already there.
    #[error("key file {path} already exists; refusing to overwrite it (remove it first if you mean to replace the keys)")]
    KeyExists { path: PathBuf },

    /// `redoubt init` was asked for a replica count that is not `3f+1`.
    #[error("cannot initialise a cluster of {replicas} replicas: the count must be 3f+1 with f >= 1 (4, 7, 10, ...); {advice}")]
    InitReplicas { replicas: u32, advice: String },

    /// `redoubt init` was given an invalid option.
    #[error("cannot initialise the cluster: {0}")]
    InitInvalid(String),

    /// `redoubt init` found an existing cluster in the output directory.
    #[error(
        "{path} already exists; refusing to overwrite an existing cluster (choose another output directory or remove it)"
    )]
    InitExists { path: PathBuf },

    /// A file system operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl ConfigError {
    /// Maps an I/O error of `action` on `path` to [`ConfigError::Io`] (for `map_err`).
    pub fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ConfigError {
        let path = path.to_path_buf();
        move |source| ConfigError::Io {
            action,
            path,
            source,
        }
    }
}

/// A position in a file: 1-based line and column, with the line's text when short.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// 1-based line; 0 when unknown.
    pub line: u32,
    /// 1-based column (characters); 0 when unknown.
    pub column: u32,
    /// The text of that line, trimmed (empty when unknown or too long to quote).
    pub text: String,
}

impl Location {
    /// Locates byte offset range `span` of `src`.
    pub fn of(src: &str, span: Option<Range<usize>>) -> Location {
        let Some(span) = span else {
            return Location {
                line: 0,
                column: 0,
                text: String::new(),
            };
        };
        let start = floor_char_boundary(src, span.start.min(src.len()));
        let before = &src[..start];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = src[line_start..start].chars().count() + 1;
        let line_end = src[start..].find('\n').map_or(src.len(), |i| start + i);
        let text = src[line_start..line_end].trim();
        Location {
            line: u32::try_from(line).unwrap_or(u32::MAX),
            column: u32::try_from(column).unwrap_or(u32::MAX),
            text: if text.chars().count() <= 80 {
                text.to_string()
            } else {
                String::new()
            },
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            return write!(f, "an unknown position");
        }
        write!(f, "line {}, column {}", self.line, self.column)?;
        if !self.text.is_empty() {
            write!(f, " (`{}`)", self.text)?;
        }
        Ok(())
    }
}

/// Formats a principal as it appears in key files and messages: `replica:0`, `client:3`.
pub fn principal_name(p: Principal) -> String {
    match p {
        Principal::Replica(r) => format!("replica:{r}"),
        Principal::Client(c) => format!("client:{c}"),
    }
}

/// Parses `replica:N` or `client:N`.
pub fn parse_principal(s: &str) -> Option<Principal> {
    let (kind, id) = s.split_once(':')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match kind {
        "replica" => id.parse().ok().map(Principal::Replica),
        "client" => id.parse().ok().map(Principal::Client),
        _ => None,
    }
}

/// `[cluster]`: identity of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Human-readable name (logs, metrics labels).
    pub name: String,
    /// Random hex identifier generated by `redoubt init`; every key file carries it.
    pub id: String,
}

/// One `[[replica]]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaEntry {
    pub id: ReplicaId,
    /// Protocol and client traffic.
    pub addr: SocketAddr,
    /// Prometheus `/metrics` and `/status` HTTP endpoint.
    pub metrics_addr: SocketAddr,
    /// Data directory (relative paths resolve against the config file's directory).
    pub home: PathBuf,
    /// This replica's key file (relative paths resolve against the config file's directory):
    /// its key-holder file with session keys, its MAC key file with static keys.
    pub key_file: PathBuf,
    /// Unix socket of the replica's key holder (session keys); default `keyholder-<id>.sock` beside `home`.
    pub holder_socket: Option<PathBuf>,
}

/// One `[[client]]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientEntry {
    pub id: ClientId,
    /// This client's key file (relative paths resolve against the config file's directory).
    pub key_file: PathBuf,
}

/// `[client_timing]`: client retransmission and deadline.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientSection {
    /// Lower bound of the retransmission timeout (ms).
    pub retransmit_min_ms: u64,
    /// Upper bound of the retransmission timeout after back-off (ms).
    pub retransmit_max_ms: u64,
    /// Initial response-time estimate before any measurement (ms).
    pub initial_rtt_ms: u64,
    /// An invocation gives up after this long without a reply certificate (ms).
    pub deadline_ms: u64,
}

impl Default for ClientSection {
    fn default() -> Self {
        let t = ClientTiming::default();
        ClientSection {
            retransmit_min_ms: t.retransmit_min_ms,
            retransmit_max_ms: t.retransmit_max_ms,
            initial_rtt_ms: t.initial_rtt_ms,
            deadline_ms: 30_000,
        }
    }
}

/// `[node]`: the node runtime.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSection {
    /// Interval between ticks delivered to the protocol core (ms).
    pub tick_ms: u64,
    /// Frames queued for one peer before the oldest are dropped.
    pub peer_queue_frames_max: usize,
    /// Simultaneous client connections accepted by one replica.
    pub client_connections_max: usize,
    /// First delay before reconnecting to a peer (ms); doubled on each failure.
    pub reconnect_backoff_min_ms: u64,
    /// Cap on the reconnection delay (ms).
    pub reconnect_backoff_max_ms: u64,
    /// `human` or `json`.
    pub log_format: String,
    /// Threads of the replica process's async runtime; 0 = one per core.
    pub worker_threads: usize,
}

impl Default for NodeSection {
    fn default() -> Self {
        NodeSection {
            tick_ms: 5,
            peer_queue_frames_max: 8192,
            client_connections_max: 1024,
            reconnect_backoff_min_ms: 50,
            reconnect_backoff_max_ms: 500,
            log_format: "human".into(),
            worker_threads: 1,
        }
    }
}

/// `[keys]`: how principals authenticate.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeysSection {
    /// `session`: keys refreshed by NEW-KEY, each principal's long-term secrets in a key holder
    /// (needed for proactive recovery); `static`: fixed pairwise MAC keys from `redoubt init`.
    pub mode: String,
    /// Public keys of every principal (session mode), written by `redoubt init`.
    pub directory: PathBuf,
}

impl Default for KeysSection {
    fn default() -> Self {
        KeysSection {
            mode: "session".into(),
            directory: PathBuf::from("public-keys.toml"),
        }
    }
}

impl KeysSection {
    pub fn session(&self) -> bool {
        self.mode == "session"
    }
}

/// Accepted values of `[keys] mode`.
pub const KEY_MODES: [&str; 2] = ["session", "static"];

/// `[recovery]`: proactive recovery driven by `redoubt monitor`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecoverySection {
    /// The monitor restarts and recovers its replica periodically (needs session keys).
    pub enabled: bool,
    /// Watchdog period T_w (s): every replica recovers once per period, in turn. 0 = derived
    /// from the measured recovery time (n × 2 × the longest recovery seen, at least
    /// `watchdog_period_min_s`).
    pub watchdog_period_s: u64,
    /// Lower bound of a derived watchdog period (s).
    pub watchdog_period_min_s: u64,
    /// A recovery taking longer than this is reported as a possible attack (s).
    pub alert_after_s: u64,
    /// BLAKE3 of the replica executable (hex); the monitor refuses to start an executable
    /// with another hash. Empty: not checked.
    pub executable_blake3: String,
    /// Longest a monitor waits, at its turn, for f replicas already recovering to finish (s).
    pub stagger_wait_max_s: u64,
}

impl Default for RecoverySection {
    fn default() -> Self {
        RecoverySection {
            enabled: true,
            watchdog_period_s: 0,
            watchdog_period_min_s: 600,
            alert_after_s: 60,
            executable_blake3: String::new(),
            stagger_wait_max_s: 120,
        }
    }
}

/// Accepted values of `[node] log_format`.
pub const LOG_FORMATS: [&str; 2] = ["human", "json"];

/// `[storage]`: the replica's journal and page store.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSection {
    /// Sync the journal to disk before sending messages that depend on it.
    pub fsync: bool,
    /// Accepted for compatibility with configurations written by earlier versions, and
    /// ignored: the journal is one file, compacted at every checkpoint.
    pub journal_segment_bytes_max: u64,
    /// Memory for copies of state pages read from the page file (MiB; 0: none).
    pub page_cache_mib: u64,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection {
            fsync: true,
            journal_segment_bytes_max: 64 << 20,
            page_cache_mib: (redoubt_core::state::DEFAULT_PAGE_CACHE_BYTES >> 20) as u64,
        }
    }
}

/// `[state]`: the replicated service state (identical on every replica: digests depend on
/// it).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateSection {
    /// Size of the service state (MiB); the page file is this large (sparse on disk).
    pub size_mib: u64,
    /// Page size (bytes): a power of two between 64 and 1 MiB.
    pub page_bytes: u32,
    /// Sub-partitions per meta-data partition of the partition tree.
    pub fanout: u32,
    /// Check every page against its digest when the replica starts (reads the whole state).
    pub check_on_start: bool,
}

impl Default for StateSection {
    fn default() -> Self {
        StateSection {
            size_mib: 64,
            page_bytes: redoubt_core::state::DEFAULT_PAGE_SIZE,
            fanout: redoubt_core::state::DEFAULT_FANOUT,
            check_on_start: true,
        }
    }
}

impl StateSection {
    /// The partition tree's geometry.
    pub fn geometry(&self) -> Result<redoubt_core::state::Geometry, String> {
        let bytes = self
            .size_mib
            .checked_mul(1 << 20)
            .ok_or("[state] size_mib is too large")?;
        if bytes == 0 {
            return Err("[state] size_mib must be at least 1".into());
        }
        redoubt_core::state::Geometry::new(
            self.page_bytes,
            bytes.div_ceil(self.page_bytes as u64),
            self.fanout,
        )
        .map_err(|e| format!("[state]: {e}"))
    }
}

/// `[protocol]` as read from the file: every field of [`redoubt_core::Config`], each
/// defaulting to `Config::new(1)`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ProtocolSection {
    f: u32,
    checkpoint_interval: u64,
    log_size: u64,
    batch_requests_max: usize,
    batch_bytes_max: usize,
    inflight_batches_max: u64,
    view_change_timeout_ms: u64,
    view_change_timeout_max_ms: u64,
    status_interval_ms: u64,
    retransmit_entries_max: usize,
    state_transfer_delay_ms: u64,
    state_transfer_retry_ms: u64,
    read_only_fast_path: bool,
    digest_replies: bool,
    tentative_execution: bool,
    tentative_batch_max: usize,
    primary_replies: bool,
    large_request_bytes: usize,
    transfer_reply_bytes_max: usize,
    transfer_rate_bytes_per_sec: u64,
    transfer_items_max: usize,
    key_refresh_ms: u64,
    client_key_lifetime_ms: u64,
    suspect_client_ms: u64,
    recovery_interval_min_ms: u64,
    clock_skew_max_ms: u64,
    request_bytes_max: usize,
    message_bytes_max: usize,
}

impl Default for ProtocolSection {
    fn default() -> Self {
        let c = Config::new(1);
        ProtocolSection {
            f: c.f,
            checkpoint_interval: c.checkpoint_interval,
            log_size: c.log_size,
            batch_requests_max: c.batch_requests_max,
            batch_bytes_max: c.batch_bytes_max,
            inflight_batches_max: c.inflight_batches_max,
            view_change_timeout_ms: c.view_change_timeout_ms,
            view_change_timeout_max_ms: c.view_change_timeout_max_ms,
            status_interval_ms: c.status_interval_ms,
            retransmit_entries_max: c.retransmit_entries_max,
            state_transfer_delay_ms: c.state_transfer_delay_ms,
            state_transfer_retry_ms: c.state_transfer_retry_ms,
            read_only_fast_path: c.read_only_fast_path,
            digest_replies: c.digest_replies,
            tentative_execution: c.tentative_execution,
            tentative_batch_max: c.tentative_batch_max,
            primary_replies: c.primary_replies,
            large_request_bytes: c.large_request_bytes,
            transfer_reply_bytes_max: c.transfer_reply_bytes_max,
            transfer_rate_bytes_per_sec: c.transfer_rate_bytes_per_sec,
            transfer_items_max: c.transfer_items_max,
            key_refresh_ms: c.key_refresh_ms,
            client_key_lifetime_ms: c.client_key_lifetime_ms,
            suspect_client_ms: c.suspect_client_ms,
            recovery_interval_min_ms: c.recovery_interval_min_ms,
            clock_skew_max_ms: c.clock_skew_max_ms,
            request_bytes_max: c.request_bytes_max,
            message_bytes_max: c.message_bytes_max,
        }
    }
}

impl ProtocolSection {
    fn into_config(self) -> Config {
        let mut c = Config::new(self.f);
        c.checkpoint_interval = self.checkpoint_interval;
        c.log_size = self.log_size;
        c.batch_requests_max = self.batch_requests_max;
        c.batch_bytes_max = self.batch_bytes_max;
        c.inflight_batches_max = self.inflight_batches_max;
        c.view_change_timeout_ms = self.view_change_timeout_ms;
        c.view_change_timeout_max_ms = self.view_change_timeout_max_ms;
        c.status_interval_ms = self.status_interval_ms;
        c.retransmit_entries_max = self.retransmit_entries_max;
        c.state_transfer_delay_ms = self.state_transfer_delay_ms;
        c.state_transfer_retry_ms = self.state_transfer_retry_ms;
        c.read_only_fast_path = self.read_only_fast_path;
        c.digest_replies = self.digest_replies;
        c.tentative_execution = self.tentative_execution;
        c.tentative_batch_max = self.tentative_batch_max;
        c.primary_replies = self.primary_replies;
        c.large_request_bytes = self.large_request_bytes;
        c.transfer_reply_bytes_max = self.transfer_reply_bytes_max;
        c.transfer_rate_bytes_per_sec = self.transfer_rate_bytes_per_sec;
        c.transfer_items_max = self.transfer_items_max;
        c.key_refresh_ms = self.key_refresh_ms;
        c.client_key_lifetime_ms = self.client_key_lifetime_ms;
        c.suspect_client_ms = self.suspect_client_ms;
        c.recovery_interval_min_ms = self.recovery_interval_min_ms;
        c.clock_skew_max_ms = self.clock_skew_max_ms;
        c.request_bytes_max = self.request_bytes_max;
        c.message_bytes_max = self.message_bytes_max;
        c
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplica {
    id: Spanned<ReplicaId>,
    addr: SocketAddr,
    metrics_addr: SocketAddr,
    home: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    holder_socket: Option<PathBuf>,
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
    #[serde(rename = "client", default)]
    clients: Vec<RawClient>,
    #[serde(default)]
    protocol: ProtocolSection,
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
    /// `[[client]]`, sorted by id.
    pub clients: Vec<ClientEntry>,
    /// `[protocol]`.
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
            clients: Vec::new(),
            protocol: raw.protocol.into_config(),
            client: raw.client,
            node: raw.node,
            storage: raw.storage,
            state: raw.state,
            keys: raw.keys,
            recovery: raw.recovery,
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
        cfg.replicas = raw
            .replicas
            .into_iter()
            .map(|r| ReplicaEntry {
                id: r.id.into_inner(),
                addr: r.addr,
                metrics_addr: r.metrics_addr,
                home: r.home,
                key_file: r.key_file,
                holder_socket: r.holder_socket,
            })
            .collect();
        cfg.replicas.sort_by_key(|r| r.id);

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
        let mut endpoints: BTreeMap<SocketAddr, String> = BTreeMap::new();
        for r in &self.replicas {
            for (what, addr) in [("addr", r.addr), ("metrics_addr", r.metrics_addr)] {
                let name = format!("replica {} {what}", r.id);
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
            && crate::holder::unhex32(&rc.executable_blake3).is_err()
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

    /// Every principal of the cluster: all replicas (by id), then all clients (by id).
    pub fn principals(&self) -> Vec<Principal> {
        self.replicas
            .iter()
            .map(|r| Principal::Replica(r.id))
            .chain(self.clients.iter().map(|c| Principal::Client(c.id)))
            .collect()
    }

    /// Whether `p` is a replica or client of this cluster.
    pub fn has_principal(&self, p: Principal) -> bool {
        match p {
            Principal::Replica(r) => self.replicas.iter().any(|e| e.id == r),
            Principal::Client(c) => self.clients.iter().any(|e| e.id == c),
        }
    }

    /// The peers `p` shares keys with: a replica with every other principal, a client with
    /// every replica.
    pub fn peers_of(&self, p: Principal) -> Vec<Principal> {
        match p {
            Principal::Replica(_) => self.principals().into_iter().filter(|q| *q != p).collect(),
            Principal::Client(_) => self
                .replicas
                .iter()
                .map(|r| Principal::Replica(r.id))
                .collect(),
        }
    }

    /// The resolved Unix socket of replica `id`'s key holder.
    pub fn holder_socket_of(&self, id: ReplicaId) -> Result<PathBuf, ConfigError> {
        let r = self.replica(id)?;
        Ok(match &r.holder_socket {
            Some(p) => self.resolve(p),
            // Beside the home directory, not in it: emptying a replica's disk must not cut it
            // off from its key holder.
            None => {
                let home = self.resolve(&r.home);
                let dir = home.parent().map(Path::to_path_buf).unwrap_or_default();
                dir.join(format!("keyholder-{id}.sock"))
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

    /// The configuration as a TOML file: every option present, each with a comment giving
    /// its meaning, unit and default. This is what `redoubt init` writes.
    pub fn to_toml(&self) -> String {
        let mut replicas = String::new();
        for r in &self.replicas {
            let _ = write!(
                replicas,
                "[[replica]]\nid = {}\naddr = {}\nmetrics_addr = {}\nhome = {}\nkey_file = {}\n",
                r.id,
                quote(&r.addr.to_string()),
                quote(&r.metrics_addr.to_string()),
                quote(&r.home.to_string_lossy()),
                quote(&r.key_file.to_string_lossy()),
            );
            if let Some(sock) = &r.holder_socket {
                let _ = writeln!(
                    replicas,
                    "holder_socket = {}",
                    quote(&sock.to_string_lossy())
                );
            }
            replicas.push('\n');
        }
        let mut clients = String::new();
        for c in &self.clients {
            let _ = write!(
                clients,
                "[[client]]\nid = {}\nkey_file = {}\n\n",
                c.id,
                quote(&c.key_file.to_string_lossy()),
            );
        }
        let p = &self.protocol;
        let d = Config::new(p.f);
        let (c, dc) = (&self.client, ClientSection::default());
        let (nd, dn) = (&self.node, NodeSection::default());
        let (st, ds) = (&self.storage, StorageSection::default());
        let (sv, dsv) = (&self.state, StateSection::default());
        format!(
            r#"# redoubt cluster configuration: one file for the whole cluster.
# Every option is documented in docs/configuration.md. Unknown keys are errors.
# Relative paths are resolved against the directory of this file.
# Sections other than [cluster] and [[replica]] may be omitted (defaults apply).

[cluster]
# Human-readable name of the cluster (logs, metrics).
name = {name}
# Random identifier written by `redoubt init`; every key file carries it, so that keys of
# another cluster are refused. Do not change it.
id = {id}

# One [[replica]] per replica: exactly 3f+1 of them, with ids 0 to 3f.
#   addr          protocol and client traffic (TCP host:port)
#   metrics_addr  HTTP endpoint serving Prometheus /metrics and /status (host:port)
#   home          data directory of the replica (journal, checkpoints)
#   key_file      the replica's key-holder file (session keys) or secret MAC keys (static
#                 keys); must be mode 0600. With session keys only the key holder reads it.
#   holder_socket (optional) Unix socket of the replica's key holder; default
#                 keyholder-<id>.sock in the directory that holds <home>
{replicas}# One [[client]] per client allowed to submit requests; ids are distinct.
#   key_file      the client's key-holder file or secret MAC keys (must be mode 0600)
{clients}# Protocol parameters: identical on every replica and client.
[protocol]
# Maximum number of faulty replicas tolerated; the cluster has n = 3f+1 replicas.
# Default: 1.
f = {f}
# Checkpoint interval K (sequence numbers): a checkpoint every K batches. Default: {d_ci}.
checkpoint_interval = {ci}
# Log size L (sequence numbers): messages are accepted for h < n <= h + L; a multiple of
# checkpoint_interval, at least twice it. Default: {d_ls}.
log_size = {ls}
# Maximum number of requests the primary packs into one pre-prepare (requests). Default: {d_brm}.
batch_requests_max = {brm}
# Maximum total operation bytes in one batch (bytes). Default: {d_bbm} (1 MiB).
batch_bytes_max = {bbm}
# Maximum number of batches the primary keeps in flight, proposed but not yet executed
# (batches); requests arriving meanwhile queue and go out together. Default: {d_ibm}.
inflight_batches_max = {ibm}
# Base view-change timeout (ms); doubled on each view change that makes no progress.
# Default: {d_vct}.
view_change_timeout_ms = {vct}
# Cap on the doubled view-change timeout (ms). Default: {d_vctm}.
view_change_timeout_max_ms = {vctm}
# Interval between status messages, the retransmission heartbeat (ms). Default: {d_si}.
status_interval_ms = {si}
# Maximum number of log entries retransmitted in answer to one status message (entries).
# Default: {d_rem}.
retransmit_entries_max = {rem}
# How long a replica that knows of a newer checkpoint waits for the log to catch up before
# fetching the checkpoint state (ms). Default: {d_std}.
state_transfer_delay_ms = {std}
# Retry interval of a state fetch; each retry asks another replica (ms). Default: {d_str}.
state_transfer_retry_ms = {str}
# Read-only operations (gets, scans) go to every replica and are answered without being
# ordered; the client needs 2f+1 matching answers and falls back to the ordered path
# (true/false). Default: {d_rofp}.
read_only_fast_path = {rofp}
# Digest replies: for results over 32 bytes, one replica per request (chosen by a hash of the
# client and timestamp) sends the result and the others its digest (true/false).
# Default: {d_dr}.
digest_replies = {dr}
# Tentative execution: a replica executes a batch once it is prepared (everything before it
# committed) and replies at once; the client needs 2f+1 matching replies. Saves one message
# delay; a batch that a view change drops is undone (true/false). Default: {d_te}.
tentative_execution = {te}
# With tentative execution, the largest batch that executes tentatively; larger batches (a
# loaded service) execute once committed (requests). Default: {d_tbm}.
tentative_batch_max = {tbm}
# Whether the primary sends first replies like every replica to batches that execute once
# committed. A client needs only f+1 matching committed replies, which the backups supply,
# and a quiet primary saves the busiest replica a reply per request; the primary always
# replies to batches that execute tentatively (true/false). Default: {d_pr}.
primary_replies = {pr}
# Requests with operations of at least this many bytes travel beside the pre-prepare: the
# client sends them to every replica and the primary names them by digest (bytes; 0: all
# requests travel inside the pre-prepare). Default: {d_lrb}.
large_request_bytes = {lrb}
# Largest state-transfer answer a replica sends (bytes); at least 64 KiB and at most half
# of message_bytes_max. Default: {d_trb} (1 MiB).
transfer_reply_bytes_max = {trb}
# State-transfer bytes served to one asking replica per second (bytes/s); FETCHes above
# the rate are dropped, so a restarted replica cannot flood its peers. Default: {d_trr}.
transfer_rate_bytes_per_sec = {trr}
# Partitions asked for in one FETCH (partitions). Default: {d_tim}.
transfer_items_max = {tim}
# Session-key refresh period T_k (ms): every replica and client sends a NEW-KEY this often.
# The window of vulnerability is 2 T_k + T_r. Default: {d_krm}.
key_refresh_ms = {krm}
# Replicas discard a client's key when it was not refreshed for this long (ms); at least
# twice key_refresh_ms. Default: {d_cklm}.
client_key_lifetime_ms = {cklm}
# A client stays under suspicion this long (ms) after a request of it was doubted in a batch
# that did not commit before a view change: its requests are then ordered only when signed
# (clients sign retransmissions). Default: {d_scm}.
suspect_client_ms = {scm}
# A replica's recovery request is refused when its previous recovery was accepted less than
# this long before (ms, agreed time): repeated recoveries cannot deny service. Keep it at
# most half the watchdog period. Default: {d_rimm}.
recovery_interval_min_ms = {rimm}
# Largest accepted difference between the primary's batch time and a backup's clock (ms);
# larger skews make backups refuse the pre-prepare (liveness only, never safety).
# Default: {d_csm}.
clock_skew_max_ms = {csm}
# Largest operation accepted in a request (bytes); at most batch_bytes_max.
# Default: {d_rbm} (64 KiB).
request_bytes_max = {rbm}
# Largest encoded message accepted; bigger frames are rejected before decoding (bytes).
# batch_bytes_max must be at most half of it. Default: {d_mbm} (32 MiB).
message_bytes_max = {mbm}

# Client retransmission and deadline.
[client_timing]
# Lower bound of the retransmission timeout (ms). Default: {d_rmin}.
retransmit_min_ms = {rmin}
# Upper bound of the retransmission timeout after back-off (ms). Default: {d_rmax}.
retransmit_max_ms = {rmax}
# Initial response-time estimate, before any measurement (ms). Default: {d_rtt}.
initial_rtt_ms = {rtt}
# An invocation gives up after this long without a reply certificate (ms). Default: {d_dl}.
deadline_ms = {dl}

# The replica process.
[node]
# Interval between ticks delivered to the protocol core, the resolution of every protocol
# timer (ms). Default: {d_tick}.
tick_ms = {tick}
# Frames queued for one peer before the oldest are dropped (frames); the protocol
# retransmits what is lost. Default: {d_pq}.
peer_queue_frames_max = {pq}
# Simultaneous client connections one replica accepts (connections). Default: {d_cc}.
client_connections_max = {cc}
# First delay before reconnecting to a peer (ms); doubled on each failed attempt.
# Default: {d_rbmin}.
reconnect_backoff_min_ms = {rbmin}
# Cap on the reconnection delay (ms). Default: {d_rbmax}.
reconnect_backoff_max_ms = {rbmax}
# Threads of the replica process's async runtime (threads); 0 = one per core. One thread
# keeps network I/O and the protocol on one core without cross-thread wake-ups, which was
# fastest in `redoubt bench micro` on 2 cores with 4 replicas. Default: {d_wt}.
worker_threads = {wt}
# Log output: "human" (readable lines) or "json" (one JSON object per line).
# Default: {d_lf}.
log_format = {lf}

# The replica's journal.
[storage]
# Sync the journal to disk before sending messages that depend on it (true/false); false
# trades durability across power loss for latency. Default: {d_fs}.
fsync = {fs}
# Memory for copies of state pages read from the page file (MiB; 0: none).
# Default: {d_pc}.
page_cache_mib = {pc}

# The replicated service state: pages under a partition tree. Identical on every replica.
[state]
# Size of the service state (MiB); the page file is this large (sparse on disk).
# Default: {d_ssz}.
size_mib = {ssz}
# Page size (bytes): a power of two between 64 and 1048576. Default: {d_spb}.
page_bytes = {spb}
# Sub-partitions per meta-data partition (2 to 4096). Default: {d_sfo}.
fanout = {sfo}
# Check every page against its digest at start-up (true/false); corrupt pages are fetched
# from the other replicas. Reads the whole state. Default: {d_sck}.
check_on_start = {sck}

# How principals authenticate.
[keys]
# "session": MAC keys refreshed by NEW-KEY every key_refresh_ms, long-term secrets in a key
# holder (the replica reaches it over holder_socket); required for proactive recovery.
# "static": fixed pairwise MAC keys (no refresh, no recovery). Default: {d_km}.
mode = {km}
# Public keys (signing and sealing) of every principal, written by `redoubt init`.
# Default: {d_kd}.
directory = {kd}

# Proactive recovery, driven by `redoubt monitor` (one per replica host).
[recovery]
# Restart and recover each replica periodically, in turn (true/false). Default: {d_re}.
enabled = {re}
# Watchdog period T_w (s): each replica recovers once per period; 0 = derived from the
# measured recovery time (n x 2 x the longest recovery seen, at least
# watchdog_period_min_s). Default: {d_rwp}.
watchdog_period_s = {rwp}
# Lower bound of a derived watchdog period (s). Default: {d_rwpm}.
watchdog_period_min_s = {rwpm}
# A recovery longer than this (s) is logged at warn level and counted as a possible attack.
# Default: {d_raa}.
alert_after_s = {raa}
# BLAKE3 of the replica executable (64 hex digits); the monitor refuses to start any other
# executable. Empty: not checked. `redoubt init` writes the hash of the binary that ran it.
executable_blake3 = {reb}
# Longest a monitor waits, at its turn, while f other replicas are still recovering (s).
# Default: {d_rsw}.
stagger_wait_max_s = {rsw}
"#,
            krm = p.key_refresh_ms,
            d_krm = d.key_refresh_ms,
            cklm = p.client_key_lifetime_ms,
            d_cklm = d.client_key_lifetime_ms,
            scm = p.suspect_client_ms,
            d_scm = d.suspect_client_ms,
            rimm = p.recovery_interval_min_ms,
            d_rimm = d.recovery_interval_min_ms,
            km = quote(&self.keys.mode),
            d_km = quote(&KeysSection::default().mode),
            kd = quote(&self.keys.directory.to_string_lossy()),
            d_kd = quote(&KeysSection::default().directory.to_string_lossy()),
            re = self.recovery.enabled,
            d_re = RecoverySection::default().enabled,
            rwp = self.recovery.watchdog_period_s,
            d_rwp = RecoverySection::default().watchdog_period_s,
            rwpm = self.recovery.watchdog_period_min_s,
            d_rwpm = RecoverySection::default().watchdog_period_min_s,
            raa = self.recovery.alert_after_s,
            d_raa = RecoverySection::default().alert_after_s,
            reb = quote(&self.recovery.executable_blake3),
            rsw = self.recovery.stagger_wait_max_s,
            d_rsw = RecoverySection::default().stagger_wait_max_s,
            name = quote(&self.cluster.name),
            id = quote(&self.cluster.id),
            f = p.f,
            ci = p.checkpoint_interval,
            d_ci = d.checkpoint_interval,
            ls = p.log_size,
            d_ls = d.log_size,
            brm = p.batch_requests_max,
            d_brm = d.batch_requests_max,
            bbm = p.batch_bytes_max,
            d_bbm = d.batch_bytes_max,
            ibm = p.inflight_batches_max,
            d_ibm = d.inflight_batches_max,
            vct = p.view_change_timeout_ms,
            d_vct = d.view_change_timeout_ms,
            vctm = p.view_change_timeout_max_ms,
            d_vctm = d.view_change_timeout_max_ms,
            si = p.status_interval_ms,
            d_si = d.status_interval_ms,
            rem = p.retransmit_entries_max,
            d_rem = d.retransmit_entries_max,
            std = p.state_transfer_delay_ms,
            d_std = d.state_transfer_delay_ms,
            str = p.state_transfer_retry_ms,
            d_str = d.state_transfer_retry_ms,
            csm = p.clock_skew_max_ms,
            d_csm = d.clock_skew_max_ms,
            rbm = p.request_bytes_max,
            d_rbm = d.request_bytes_max,
            mbm = p.message_bytes_max,
            d_mbm = d.message_bytes_max,
            rmin = c.retransmit_min_ms,
            d_rmin = dc.retransmit_min_ms,
            rmax = c.retransmit_max_ms,
            d_rmax = dc.retransmit_max_ms,
            rtt = c.initial_rtt_ms,
            d_rtt = dc.initial_rtt_ms,
            dl = c.deadline_ms,
            d_dl = dc.deadline_ms,
            wt = nd.worker_threads,
            d_wt = dn.worker_threads,
            tick = nd.tick_ms,
            d_tick = dn.tick_ms,
            pq = nd.peer_queue_frames_max,
            d_pq = dn.peer_queue_frames_max,
            cc = nd.client_connections_max,
            d_cc = dn.client_connections_max,
            rbmin = nd.reconnect_backoff_min_ms,
            d_rbmin = dn.reconnect_backoff_min_ms,
            rbmax = nd.reconnect_backoff_max_ms,
            d_rbmax = dn.reconnect_backoff_max_ms,
            lf = quote(&nd.log_format),
            d_lf = quote(&dn.log_format),
            fs = st.fsync,
            d_fs = ds.fsync,
            pc = st.page_cache_mib,
            d_pc = ds.page_cache_mib,
            rofp = p.read_only_fast_path,
            dr = p.digest_replies,
            te = p.tentative_execution,
            tbm = p.tentative_batch_max,
            d_tbm = d.tentative_batch_max,
            pr = p.primary_replies,
            d_pr = d.primary_replies,
            lrb = p.large_request_bytes,
            d_lrb = d.large_request_bytes,
            d_te = d.tentative_execution,
            d_dr = d.digest_replies,
            d_rofp = d.read_only_fast_path,
            trb = p.transfer_reply_bytes_max,
            d_trb = d.transfer_reply_bytes_max,
            trr = p.transfer_rate_bytes_per_sec,
            d_trr = d.transfer_rate_bytes_per_sec,
            tim = p.transfer_items_max,
            d_tim = d.transfer_items_max,
            ssz = sv.size_mib,
            d_ssz = dsv.size_mib,
            spb = sv.page_bytes,
            d_spb = dsv.page_bytes,
            sfo = sv.fanout,
            d_sfo = dsv.fanout,
            sck = sv.check_on_start,
            d_sck = dsv.check_on_start,
        )
    }
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
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
mod tests {
    use super::*;

    /// Fails when redoubt-core grows a `Config` field that `[protocol]` does not mirror.
    #[test]
    fn protocol_section_mirrors_every_core_field() {
        let core = toml::to_string(&Config::new(2)).unwrap();
        let mirrored: ProtocolSection = toml::from_str(&core).expect("every core field mirrored");
        assert_eq!(mirrored.into_config(), Config::new(2));
        let table: toml::Table = core.parse().unwrap();
        let cfg = sample();
        let text = cfg.to_toml();
        for key in table.keys() {
            assert!(text.contains(&format!("\n{key} = ")), "{key} missing");
        }
    }

    fn sample() -> ClusterConfig {
        ClusterConfig {
            path: PathBuf::from("/etc/redoubt/redoubt.toml"),
            cluster: ClusterSection {
                name: "t \"quoted\"".into(),
                id: "00ff".into(),
            },
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
        }
    }

    #[test]
    fn to_toml_round_trips() {
        let mut cfg = sample();
        cfg.storage.fsync = false;
        cfg.node.log_format = "json".into();
        cfg.protocol.log_size = 512;
        let back = ClusterConfig::parse(&cfg.path, &cfg.to_toml()).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(
            back.resolve(Path::new("replica-1")),
            PathBuf::from("/etc/redoubt/replica-1")
        );
        assert_eq!(back.resolve(Path::new("/abs/x")), PathBuf::from("/abs/x"));
    }

    #[test]
    fn principal_names() {
        for p in [Principal::Replica(0), Principal::Client(17)] {
            assert_eq!(parse_principal(&principal_name(p)), Some(p));
        }
        assert_eq!(parse_principal("replica:"), None);
        assert_eq!(parse_principal("replica:+1"), None);
        assert_eq!(parse_principal("node:1"), None);
    }

    #[test]
    fn location_counts_lines_and_chars() {
        let src = "a = 1\nbé = 2\n";
        let at = Location::of(src, Some(10..11));
        assert_eq!((at.line, at.column), (2, 4));
        assert_eq!(at.text, "bé = 2");
    }
}
