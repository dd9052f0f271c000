//! The overlay file (TOML): nodes and their UDP addresses and key files, links and their
//! emulated wide-area behaviour, the routing and recovery modes, the tunnels, and the test-only
//! faulty behaviours (and shared secret). Read once at start; `[[link]]` and `[[faulty]]` are
//! read again on SIGHUP.

use redoubt_crypto::MacKey;
use redoubt_overlay::{Config, NodeId, Recovery, RoutingMode};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Why an overlay file was refused.
#[derive(Debug, thiserror::Error)]
pub enum OverlayConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("overlay key file {path}: {message}")]
    Key { path: PathBuf, message: String },
    #[error(
        "overlay key file {path} already exists; keys are never replaced silently: pass \
         --force to deal new keys to every node (then copy each node's file again), or remove it"
    )]
    KeyExists { path: PathBuf },
}

/// Shortest accepted shared secret (`[overlay] secret_file`, TEST ONLY).
pub const SECRET_BYTES_MIN: usize = 32;

fn default_routing() -> String {
    "odsbr".into()
}
fn default_recovery() -> String {
    "hop_by_hop".into()
}
fn default_status_interval_ms() -> u64 {
    10_000
}
fn default_emulation_seed() -> u64 {
    1
}
fn default_link_queue_bytes_max() -> usize {
    1 << 20
}
fn default_tunnel_frame_bytes_max() -> usize {
    32 << 20
}
fn default_tunnel_queue_frames_max() -> usize {
    1_024
}
fn default_tunnel_backlog_bytes_max() -> usize {
    8 << 20
}
fn default_payload_bytes_max() -> usize {
    16_384
}
fn default_tunnel_conns_max() -> usize {
    8
}
fn default_tunnel_conns_total_max() -> usize {
    512
}
fn default_tunnel_conn_queue_bytes_max() -> usize {
    32 << 20
}

/// `[overlay]`: settings shared by every daemon of the overlay.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OverlaySection {
    /// `"odsbr"` (Byzantine-resilient source routing) or `"link_state"` (Spines, benign).
    #[serde(default = "default_routing")]
    pub routing: String,
    /// `"hop_by_hop"` (Spines) or `"end_to_end"` (for comparison).
    #[serde(default = "default_recovery")]
    pub recovery: String,
    /// TEST ONLY: a file holding a secret (at least 32 bytes) every pairwise key derives from,
    /// relative to the overlay file's directory, instead of per-node `key_file`s. Any daemon
    /// holding it can forge the MACs of every pair; the daemon warns at start.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// How often the daemon logs its status line.
    #[serde(default = "default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// Seed of the emulated loss and jitter (each daemon mixes in its id).
    #[serde(default = "default_emulation_seed")]
    pub emulation_seed: u64,
    /// Bytes waiting in one link's emulated bottleneck before datagrams are tail-dropped.
    #[serde(default = "default_link_queue_bytes_max")]
    pub link_queue_bytes_max: usize,
    /// Largest replica frame a tunnel carries (larger frames close the tunnel connection).
    #[serde(default = "default_tunnel_frame_bytes_max")]
    pub tunnel_frame_bytes_max: usize,
    /// Frames queued towards one local tunnel connection before new ones are dropped.
    #[serde(default = "default_tunnel_queue_frames_max")]
    pub tunnel_queue_frames_max: usize,
    /// Bytes queued towards one local tunnel connection before new frames are dropped (a
    /// frame is always taken into an empty queue).
    #[serde(default = "default_tunnel_conn_queue_bytes_max")]
    pub tunnel_conn_queue_bytes_max: usize,
    /// Bytes of tunnel frames waiting for the overlay per destination before new frames are
    /// dropped (the replicas retransmit).
    #[serde(default = "default_tunnel_backlog_bytes_max")]
    pub tunnel_backlog_bytes_max: usize,
    /// Simultaneous connections one tunnel port accepts (and, at the far end, that the
    /// daemon opens to its replica per tunnel port of the source).
    #[serde(default = "default_tunnel_conns_max")]
    pub tunnel_conns_max: usize,
    /// Simultaneous tunnel connections of one daemon, accepted and opened together.
    #[serde(default = "default_tunnel_conns_total_max")]
    pub tunnel_conns_total_max: usize,
    /// Largest overlay message; tunnel frames are cut into chunks of this size.
    #[serde(default = "default_payload_bytes_max")]
    pub payload_bytes_max: usize,
}

/// `[[node]]`: one daemon.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub id: u16,
    /// UDP address the daemon binds and its neighbours send to.
    pub addr: SocketAddr,
    /// The local replica's protocol address: for each connection a tunnel carries to this
    /// node, the daemon opens one TCP connection there. Absent: this node carries no replica.
    #[serde(default)]
    pub replica_addr: Option<SocketAddr>,
    /// This node's key file (`redoubt overlay keygen` writes it), relative to the overlay
    /// file's directory: the key it shares with each other node, and no other.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Where `redoubt overlay` serves this daemon's Prometheus `/metrics`, `/status` (JSON)
    /// and `/healthz` over HTTP. Absent: not served.
    #[serde(default)]
    pub metrics_addr: Option<SocketAddr>,
}

/// Emulated wide-area behaviour of one link, applied by each end to what it sends.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Emulation {
    /// One-way propagation delay.
    #[serde(default)]
    pub delay_ms: u64,
    /// Extra delay drawn uniformly in `0..=jitter_ms` per datagram (reorders).
    #[serde(default)]
    pub jitter_ms: u64,
    /// Fraction of datagrams lost, 0.0 to 1.0.
    #[serde(default)]
    pub loss: f64,
    /// Bottleneck rate; 0 means unlimited.
    #[serde(default)]
    pub bandwidth_kbps: u64,
}

/// `[[link]]`: an overlay link between two nodes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkEntry {
    pub a: u16,
    pub b: u16,
    #[serde(flatten)]
    pub emulation: Emulation,
}

/// `[[tunnel]]`: node `node` accepts TCP connections on `listen` and carries each, both ways,
/// to a connection that `peer`'s daemon opens to its replica. A pair may have several
/// tunnels (e.g. one for the replica, one for clients), each with its own `listen`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TunnelEntry {
    pub node: u16,
    pub peer: u16,
    pub listen: SocketAddr,
}

/// `[[faulty]]`: TEST ONLY. Node `node` drops this fraction of the data packets and acks it
/// forwards for others, after accepting them on its links (a Byzantine relay).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultyEntry {
    pub node: u16,
    pub drop_forwarded: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    overlay: OverlaySection,
    #[serde(rename = "node")]
    nodes: Vec<NodeEntry>,
    #[serde(rename = "link", default)]
    links: Vec<LinkEntry>,
    #[serde(rename = "tunnel", default)]
    tunnels: Vec<TunnelEntry>,
    #[serde(rename = "faulty", default)]
    faulty: Vec<FaultyEntry>,
}

/// The overlay file, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct OverlayFile {
    pub path: PathBuf,
    pub overlay: OverlaySection,
    /// Sorted by id, `nodes[i].id == i`.
    pub nodes: Vec<NodeEntry>,
    pub links: Vec<LinkEntry>,
    pub tunnels: Vec<TunnelEntry>,
    pub faulty: Vec<FaultyEntry>,
}

impl OverlayFile {
    pub fn load(path: &Path) -> Result<OverlayFile, OverlayConfigError> {
        let src = std::fs::read_to_string(path).map_err(|source| OverlayConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &src)
    }

    pub fn parse(path: &Path, src: &str) -> Result<OverlayFile, OverlayConfigError> {
        let raw: RawFile = toml::from_str(src).map_err(|e| OverlayConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut f = OverlayFile {
            path: path.to_path_buf(),
            overlay: raw.overlay,
            nodes: raw.nodes,
            links: raw.links,
            tunnels: raw.tunnels,
            faulty: raw.faulty,
        };
        f.nodes.sort_by_key(|n| n.id);
        f.validate()?;
        Ok(f)
    }

    fn invalid(&self, message: String) -> OverlayConfigError {
        OverlayConfigError::Invalid {
            path: self.path.clone(),
            message,
        }
    }

    fn validate(&self) -> Result<(), OverlayConfigError> {
        if let Some((i, n)) = self
            .nodes
            .iter()
            .enumerate()
            .find(|(i, n)| n.id as usize != *i)
        {
            return Err(self.invalid(format!(
                "[[node]] ids must be 0..{} without gaps or repeats; entry {i} has id {}",
                self.nodes.len(),
                n.id
            )));
        }
        self.protocol_config()?;
        let n = self.nodes.len() as u16;
        let mut pairs = BTreeSet::new();
        for l in &self.links {
            if l.a >= n || l.b >= n || l.a == l.b {
                return Err(self.invalid(format!(
                    "[[link]] {}-{}: ends must be two different node ids below {n}",
                    l.a, l.b
                )));
            }
            if !pairs.insert((l.a.min(l.b), l.a.max(l.b))) {
                return Err(self.invalid(format!("[[link]] {}-{} is listed twice", l.a, l.b)));
            }
            let e = &l.emulation;
            if !(0.0..=1.0).contains(&e.loss) {
                return Err(self.invalid(format!(
                    "[[link]] {}-{}: loss must be a fraction in 0.0..=1.0",
                    l.a, l.b
                )));
            }
            if e.delay_ms > 60_000 || e.jitter_ms > 60_000 {
                return Err(self.invalid(format!(
                    "[[link]] {}-{}: delay_ms and jitter_ms must be at most 60000",
                    l.a, l.b
                )));
            }
        }
        let mut seen = BTreeSet::new();
        for t in &self.tunnels {
            if t.node >= n || t.peer >= n || t.node == t.peer {
                return Err(self.invalid(format!(
                    "[[tunnel]] {}->{}: node and peer must be two different node ids below {n}",
                    t.node, t.peer
                )));
            }
            if !seen.insert((t.node, t.listen)) {
                return Err(self.invalid(format!(
                    "[[tunnel]] {}->{}: node {} listens on {} twice",
                    t.node, t.peer, t.node, t.listen
                )));
            }
            if self.nodes[t.peer as usize].replica_addr.is_none() {
                return Err(self.invalid(format!(
                    "[[tunnel]] {}->{}: node {} has no replica_addr to deliver to",
                    t.node, t.peer, t.peer
                )));
            }
        }
        self.validate_keys()?;
        for x in &self.faulty {
            if x.node >= n || !(0.0..=1.0).contains(&x.drop_forwarded) {
                return Err(self.invalid(format!(
                    "[[faulty]] node {}: node must exist and drop_forwarded be in 0.0..=1.0",
                    x.node
                )));
            }
        }
        let o = &self.overlay;
        if o.status_interval_ms == 0
            || o.link_queue_bytes_max == 0
            || o.tunnel_frame_bytes_max == 0
            || o.tunnel_queue_frames_max == 0
            || o.tunnel_backlog_bytes_max == 0
            || o.tunnel_conns_max == 0
            || o.tunnel_conns_total_max == 0
            || o.tunnel_conn_queue_bytes_max == 0
        {
            return Err(self.invalid(
                "[overlay] status_interval_ms, link_queue_bytes_max and the tunnel_* limits must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Either every node has its own key file, or (TEST ONLY) the file names a shared secret.
    fn validate_keys(&self) -> Result<(), OverlayConfigError> {
        let with_key: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.key_file.is_some())
            .map(|n| n.id)
            .collect();
        if self.overlay.secret_file.is_some() {
            if let Some(i) = with_key.first() {
                return Err(self.invalid(format!(
                    "[overlay] secret_file (TEST ONLY) and [[node]] {i} key_file are both set: \
                     use per-node key files (and remove secret_file), or the test-only secret alone"
                )));
            }
            return Ok(());
        }
        if let Some(n) = self.nodes.iter().find(|n| n.key_file.is_none()) {
            return Err(self.invalid(format!(
                "[[node]] {} has no key_file: give every node its own, e.g. key_file = \
                 \"keys/overlay-{}.key\", and deal them with `redoubt overlay keygen --config \
                 FILE`",
                n.id, n.id
            )));
        }
        let mut paths = BTreeMap::new();
        for n in &self.nodes {
            if let Some(other) = self.key_file_of(n.id).and_then(|p| paths.insert(p, n.id)) {
                return Err(self.invalid(format!(
                    "[[node]] {} and {other} name the same key_file: each node needs its own",
                    n.id
                )));
            }
        }
        Ok(())
    }

    /// Resolves a path of the file: relative ones against the overlay file's directory.
    pub fn resolve(&self, rel: &Path) -> PathBuf {
        if rel.is_absolute() {
            rel.to_path_buf()
        } else {
            self.path
                .parent()
                .unwrap_or_else(|| Path::new("."))
                .join(rel)
        }
    }

    /// Node `id`'s key file, resolved; `None` when it has none (or is not in the file).
    pub fn key_file_of(&self, id: u16) -> Option<PathBuf> {
        let rel = self.nodes.get(id as usize)?.key_file.as_ref()?;
        Some(self.resolve(rel))
    }

    /// Whether the daemons take their keys from the test-only shared secret.
    pub fn uses_shared_secret(&self) -> bool {
        self.overlay.secret_file.is_some()
    }

    /// The core's configuration for this overlay.
    pub fn protocol_config(&self) -> Result<Config, OverlayConfigError> {
        let routing = match self.overlay.routing.as_str() {
            "odsbr" => RoutingMode::Odsbr,
            "link_state" => RoutingMode::LinkState,
            other => {
                return Err(self.invalid(format!(
                    "[overlay] routing = {other:?}: expected \"odsbr\" or \"link_state\""
                )))
            }
        };
        let recovery = match self.overlay.recovery.as_str() {
            "hop_by_hop" => Recovery::HopByHop,
            "end_to_end" => Recovery::EndToEnd,
            other => {
                return Err(self.invalid(format!(
                    "[overlay] recovery = {other:?}: expected \"hop_by_hop\" or \"end_to_end\""
                )))
            }
        };
        let mut cfg = Config::new(self.nodes.len() as u16, routing, recovery);
        cfg.payload_bytes_max = self.overlay.payload_bytes_max;
        cfg.validate()
            .map_err(|e| self.invalid(format!("[overlay]: {e}")))?;
        Ok(cfg)
    }

    /// Neighbours of `me` and the emulation of each link as `me` sends on it.
    pub fn neighbours(&self, me: u16) -> BTreeMap<NodeId, Emulation> {
        self.links
            .iter()
            .filter_map(|l| {
                if l.a == me {
                    Some((NodeId(l.b), l.emulation))
                } else if l.b == me {
                    Some((NodeId(l.a), l.emulation))
                } else {
                    None
                }
            })
            .collect()
    }

    /// The test-only drop fraction of node `me` (0 for a correct node).
    pub fn faulty_drop(&self, me: u16) -> f64 {
        self.faulty
            .iter()
            .find(|x| x.node == me)
            .map_or(0.0, |x| x.drop_forwarded)
    }

    /// `me`'s pairwise key with every other node: from its key file, or (TEST ONLY) derived
    /// from the shared secret.
    pub fn pairwise_keys(&self, me: u16) -> Result<BTreeMap<NodeId, MacKey>, OverlayConfigError> {
        let n = self.nodes.len() as u16;
        if let Some(path) = self.key_file_of(me) {
            return crate::keys::load_node_keys(&path, me, n);
        }
        let Some(rel) = &self.overlay.secret_file else {
            return Err(self.invalid(format!("[[node]] {me} has no key_file")));
        };
        let path = self.resolve(rel);
        let secret = std::fs::read(&path).map_err(|source| OverlayConfigError::Read {
            path: path.clone(),
            source,
        })?;
        if secret.len() < SECRET_BYTES_MIN {
            return Err(self.invalid(format!(
                "secret_file {} holds {} bytes; at least {SECRET_BYTES_MIN} are needed",
                path.display(),
                secret.len()
            )));
        }
        Ok((0..n)
            .filter(|&j| j != me)
            .map(|j| (NodeId(j), pairwise_key(&secret, me, j)))
            .collect())
    }

    /// How many tunnels `src` has to `dst`: `dst` opens at most this many times
    /// `tunnel_conns_max` connections to its replica for `src`.
    pub fn tunnels_between(&self, src: u16, dst: u16) -> usize {
        self.tunnels
            .iter()
            .filter(|t| t.node == src && t.peer == dst)
            .count()
    }
}

/// The key nodes `a` and `b` share: derived from a secret (the master `redoubt overlay
/// keygen` draws and forgets, or the test-only shared secret) and the unordered pair.
pub fn pairwise_key(secret: &[u8], a: u16, b: u16) -> MacKey {
    let (lo, hi) = (a.min(b), a.max(b));
    let mut material = secret.to_vec();
    material.extend_from_slice(&lo.to_le_bytes());
    material.extend_from_slice(&hi.to_le_bytes());
    MacKey::derive("redoubt-overlayd v1 pairwise key", &material)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
[overlay]
routing = "link_state"

[[node]]
id = 1
addr = "127.0.0.1:9001"
replica_addr = "127.0.0.1:7001"
key_file = "keys/overlay-1.key"

[[node]]
id = 0
addr = "127.0.0.1:9000"
key_file = "/etc/overlay-0.key"

[[link]]
a = 0
b = 1
delay_ms = 10
loss = 0.01
bandwidth_kbps = 1000

[[tunnel]]
node = 0
peer = 1
listen = "127.0.0.1:17001"
"#;

    #[test]
    fn parses_and_sorts() {
        let f = OverlayFile::parse(Path::new("/x/o.toml"), SAMPLE).unwrap();
        assert_eq!(f.nodes[0].id, 0);
        assert_eq!(f.neighbours(0)[&NodeId(1)].delay_ms, 10);
        assert_eq!(f.neighbours(1)[&NodeId(0)].bandwidth_kbps, 1000);
        assert_eq!(f.protocol_config().unwrap().routing, RoutingMode::LinkState);
        assert_eq!(f.faulty_drop(0), 0.0);
        assert_eq!(
            f.key_file_of(1).unwrap(),
            PathBuf::from("/x/keys/overlay-1.key")
        );
        assert_eq!(
            f.key_file_of(0).unwrap(),
            PathBuf::from("/etc/overlay-0.key")
        );
        assert!(!f.uses_shared_secret());
    }

    #[test]
    fn key_files_or_the_test_secret_not_both() {
        let parse = |t: &str| OverlayFile::parse(Path::new("o.toml"), t);
        // A node without a key file.
        let e = parse(&SAMPLE.replace("key_file = \"/etc/overlay-0.key\"", ""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[[node]] 0 has no key_file") && e.contains("keygen"),
            "{e}"
        );
        // Two nodes sharing one file.
        let e = parse(&SAMPLE.replace("/etc/overlay-0.key", "keys/overlay-1.key"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("same key_file"), "{e}");
        // The test-only secret beside key files.
        let both = SAMPLE.replace("[overlay]\n", "[overlay]\nsecret_file = \"s\"\n");
        let e = parse(&both).unwrap_err().to_string();
        assert!(e.contains("both set"), "{e}");
        // The test-only secret alone.
        let secret = both
            .replace("key_file = \"/etc/overlay-0.key\"", "")
            .replace("key_file = \"keys/overlay-1.key\"", "");
        assert!(parse(&secret).unwrap().uses_shared_secret());
    }

    #[test]
    fn a_pair_may_have_several_tunnels_on_distinct_ports() {
        let more =
            format!("{SAMPLE}\n[[tunnel]]\nnode = 0\npeer = 1\nlisten = \"127.0.0.1:17002\"\n");
        let f = OverlayFile::parse(Path::new("o.toml"), &more).unwrap();
        assert_eq!(f.tunnels_between(0, 1), 2);
        assert_eq!(f.tunnels_between(1, 0), 0);
        let same = more.replace("17002", "17001");
        let e = OverlayFile::parse(Path::new("o.toml"), &same)
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn refuses_bad_values() {
        let bad = SAMPLE.replace("loss = 0.01", "loss = 1.5");
        assert!(OverlayFile::parse(Path::new("o.toml"), &bad).is_err());
        let bad = SAMPLE.replace("peer = 1", "peer = 0");
        assert!(OverlayFile::parse(Path::new("o.toml"), &bad).is_err());
        let bad = SAMPLE.replace("id = 1", "id = 2");
        assert!(OverlayFile::parse(Path::new("o.toml"), &bad).is_err());
        let bad = SAMPLE.replace("link_state", "flooding");
        assert!(OverlayFile::parse(Path::new("o.toml"), &bad).is_err());
        // A tunnel to a node without a replica cannot deliver.
        let bad = SAMPLE.replace("replica_addr = \"127.0.0.1:7001\"", "");
        assert!(OverlayFile::parse(Path::new("o.toml"), &bad).is_err());
    }

    #[test]
    fn pairwise_keys_agree_at_both_ends() {
        let k01 = pairwise_key(&[7; 32], 0, 1);
        let k10 = pairwise_key(&[7; 32], 1, 0);
        assert_eq!(k01.0, k10.0);
        assert_ne!(pairwise_key(&[7; 32], 0, 2).0, k01.0);
    }
}
