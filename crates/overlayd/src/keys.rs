//! Per-node overlay key files: each daemon holds the keys of the pairs it belongs to, and no
//! other, so a compromised daemon cannot forge the MACs of a pair it is not part of.
//!
//! `redoubt overlay keygen --config FILE` ([`deal`]) draws a fresh random master secret in
//! memory, derives from it one key per unordered pair of nodes ([`crate::config::pairwise_key`]),
//! writes each node's keys with every other node to that node's `[[node]] key_file` (mode
//! 0600), and forgets the master: it is never written. Both files of a pair hold the same key.
//!
//! ```toml
//! # redoubt overlay key file of node 2 ...
//! node = 2
//!
//! [[peer]]
//! node = 0
//! key = "<64 hex digits>"   # the key nodes 0 and 2 share
//! ```

use crate::config::{pairwise_key, OverlayConfigError, OverlayFile};
use rand::Rng as _;
use redoubt_crypto::{MacKey, KEY_LEN};
use redoubt_overlay::NodeId;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Largest key file read (a file of 65,535 peers is about 6 MB).
const KEY_FILE_BYTES_MAX: u64 = 16 << 20;

fn key_error(path: &Path, message: impl Into<String>) -> OverlayConfigError {
    OverlayConfigError::Key {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Deals fresh keys to every node of `file`: one key per pair, derived from a master secret
/// drawn here and never stored. Without `force`, refuses (and writes nothing) when any node's
/// key file exists; with it, replaces them. Returns the files written, by node id.
pub fn deal(file: &OverlayFile, force: bool) -> Result<Vec<PathBuf>, OverlayConfigError> {
    let mut master = [0u8; 32];
    rand::rng().fill_bytes(&mut master);
    let written = deal_from(file, &master, force);
    master.fill(0);
    std::hint::black_box(&master);
    written
}

/// [`deal`] with a given master secret.
fn deal_from(
    file: &OverlayFile,
    master: &[u8],
    force: bool,
) -> Result<Vec<PathBuf>, OverlayConfigError> {
    let n = file.nodes.len() as u16;
    let paths = (0..n)
        .map(|i| {
            file.key_file_of(i)
                .ok_or_else(|| OverlayConfigError::Invalid {
                    path: file.path.clone(),
                    message: format!(
                        "[[node]] {i} has no key_file: give every node one (e.g. key_file = \
                     \"keys/overlay-{i}.key\") before dealing keys"
                    ),
                })
        })
        .collect::<Result<Vec<PathBuf>, _>>()?;
    if !force {
        if let Some(p) = paths.iter().find(|p| p.exists()) {
            return Err(OverlayConfigError::KeyExists { path: p.clone() });
        }
    }
    for (i, path) in paths.iter().enumerate() {
        let me = i as u16;
        let keys: BTreeMap<NodeId, MacKey> = (0..n)
            .filter(|&j| j != me)
            .map(|j| (NodeId(j), pairwise_key(master, me, j)))
            .collect();
        write_node_keys(path, me, &keys, force)?;
    }
    Ok(paths)
}

/// Writes node `me`'s key file: for each other node, the key of the pair. The file is created
/// with mode 0600 (and its directory, when missing, with 0700); an existing file is replaced
/// only with `force`.
pub fn write_node_keys(
    path: &Path,
    me: u16,
    keys: &BTreeMap<NodeId, MacKey>,
    force: bool,
) -> Result<(), OverlayConfigError> {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# redoubt overlay key file of node {me}: the secret key it shares with each other node,"
    );
    let _ = writeln!(
        text,
        "# written by `redoubt overlay keygen`. Keep it mode 0600, on node {me}'s host only."
    );
    let _ = writeln!(text, "node = {me}");
    for (peer, key) in keys {
        let _ = writeln!(text);
        let _ = writeln!(text, "[[peer]]");
        let _ = writeln!(text, "node = {}", peer.0);
        let _ = writeln!(text, "key = \"{}\"", hex(&key.0));
    }
    let io = |action: &str, e: std::io::Error| key_error(path, format!("cannot {action}: {e}"));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io("create its directory", e))?;
    }
    // Replacing goes through a new file renamed over the old one, so that a reader never
    // sees half a file and the new one is 0600 from its first byte.
    let target = if force {
        let name = path
            .file_name()
            .map_or_else(|| "key".into(), |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        tmp
    } else {
        path.to_path_buf()
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&target)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                OverlayConfigError::KeyExists {
                    path: path.to_path_buf(),
                }
            } else {
                io("create it", e)
            }
        })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io("write it", e))?;
    if target != path {
        std::fs::rename(&target, path).map_err(|e| io("replace it", e))?;
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeyFile {
    node: u16,
    #[serde(rename = "peer", default)]
    peers: Vec<RawPeer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    node: u16,
    key: String,
}

/// Loads node `me`'s key file and checks it: present, mode 0600 (no access for group or
/// others), parseable, written for node `me`, one well-formed key for every other node of an
/// overlay of `nodes` nodes. Keys for node ids at or above `nodes` are ignored (an overlay
/// that shrank).
pub fn load_node_keys(
    path: &Path,
    me: u16,
    nodes: u16,
) -> Result<BTreeMap<NodeId, MacKey>, OverlayConfigError> {
    let err = |m: String| key_error(path, m);
    let meta = std::fs::metadata(path).map_err(|e| {
        err(format!(
            "cannot read it: {e} (deal the keys with `redoubt overlay keygen` and copy node \
             {me}'s file to this host)"
        ))
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(err(format!(
            "its mode is {mode:04o}: a key file must be readable by its owner only (chmod 600)"
        )));
    }
    if meta.len() > KEY_FILE_BYTES_MAX {
        return Err(err(format!(
            "it holds {} bytes, more than a key file ever needs ({KEY_FILE_BYTES_MAX})",
            meta.len()
        )));
    }
    let src = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read it: {e}")))?;
    let raw: RawKeyFile = toml::from_str(&src).map_err(|e| {
        // The message only: toml's own rendering quotes the line, which may hold a key.
        let line = e
            .span()
            .map_or(0, |s| src[..s.start.min(src.len())].lines().count().max(1));
        err(format!("line {line}: {}", e.message().trim()))
    })?;
    if raw.node != me {
        return Err(err(format!(
            "it belongs to node {}, not to node {me} (each node needs its own file)",
            raw.node
        )));
    }
    let mut keys = BTreeMap::new();
    for p in raw.peers {
        if p.node == me {
            return Err(err(format!("node {me} lists itself as a peer")));
        }
        let key =
            decode_key(&p.key).map_err(|m| err(format!("the key for node {}: {m}", p.node)))?;
        if keys.insert(NodeId(p.node), key).is_some() {
            return Err(err(format!("node {} is listed twice", p.node)));
        }
    }
    keys.retain(|n, _| n.0 < nodes);
    if let Some(missing) = (0..nodes).find(|&j| j != me && !keys.contains_key(&NodeId(j))) {
        return Err(err(format!(
            "it has no key for node {missing}, and the overlay has {nodes} nodes (deal the \
             keys again with `redoubt overlay keygen --force` after adding nodes)"
        )));
    }
    Ok(keys)
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn decode_key(s: &str) -> Result<MacKey, String> {
    if let Some(c) = s.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("contains {c:?}, which is not a hex digit"));
    }
    if s.len() != 2 * KEY_LEN {
        return Err(format!("has {} hex digits, not {}", s.len(), 2 * KEY_LEN));
    }
    let mut key = [0u8; KEY_LEN];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|e| format!("bad hex digits at {}: {e}", 2 * i))?;
    }
    Ok(MacKey(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(dir: &Path, nodes: u16) -> OverlayFile {
        let mut s = String::from("[overlay]\n");
        for i in 0..nodes {
            let _ = write!(
                s,
                "\n[[node]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nkey_file = \"keys/overlay-{i}.key\"\n",
                9000 + i
            );
        }
        let path = dir.join("overlay.toml");
        std::fs::write(&path, &s).unwrap();
        OverlayFile::load(&path).unwrap()
    }

    fn all_keys(f: &OverlayFile) -> Vec<BTreeMap<NodeId, MacKey>> {
        (0..f.nodes.len() as u16)
            .map(|i| f.pairwise_keys(i).unwrap())
            .collect()
    }

    #[test]
    fn both_ends_of_every_pair_hold_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let f = overlay(dir.path(), 4);
        let written = deal(&f, false).unwrap();
        assert_eq!(written.len(), 4);
        let keys = all_keys(&f);
        for a in 0..4u16 {
            assert_eq!(keys[a as usize].len(), 3);
            for b in (0..4u16).filter(|&b| b != a) {
                assert_eq!(
                    keys[a as usize][&NodeId(b)].0,
                    keys[b as usize][&NodeId(a)].0,
                    "pair {a}-{b}"
                );
            }
        }
        // Distinct pairs, distinct keys.
        assert_ne!(keys[0][&NodeId(1)].0, keys[0][&NodeId(2)].0);
        let mode = std::fs::metadata(&written[2]).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = std::fs::metadata(dir.path().join("keys"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
    }

    #[test]
    fn a_node_file_holds_no_key_of_a_pair_it_is_not_in() {
        let dir = tempfile::tempdir().unwrap();
        let f = overlay(dir.path(), 4);
        deal(&f, false).unwrap();
        let keys = all_keys(&f);
        for c in 0..4u16 {
            let text = std::fs::read_to_string(f.key_file_of(c).unwrap()).unwrap();
            for a in (0..4u16).filter(|&a| a != c) {
                for b in (0..4u16).filter(|&b| b != c && b != a) {
                    let k = hex(&keys[a as usize][&NodeId(b)].0);
                    assert!(
                        !text.contains(&k),
                        "node {c}'s file holds the key of {a}-{b}"
                    );
                }
            }
        }
    }

    #[test]
    fn keys_are_never_replaced_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let f = overlay(dir.path(), 3);
        deal(&f, false).unwrap();
        let before = all_keys(&f);
        let e = deal(&f, false).unwrap_err().to_string();
        assert!(e.contains("already exists") && e.contains("--force"), "{e}");
        assert_eq!(all_keys(&f)[1][&NodeId(2)].0, before[1][&NodeId(2)].0);
        deal(&f, true).unwrap();
        let after = all_keys(&f);
        assert_ne!(after[1][&NodeId(2)].0, before[1][&NodeId(2)].0);
        assert_eq!(after[1][&NodeId(2)].0, after[2][&NodeId(1)].0);
        let mode = std::fs::metadata(f.key_file_of(1).unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn missing_foreign_short_and_open_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = overlay(dir.path(), 3);
        let missing = f.pairwise_keys(0).unwrap_err().to_string();
        assert!(
            missing.contains("overlay-0.key") && missing.contains("keygen"),
            "{missing}"
        );
        deal(&f, false).unwrap();
        let p0 = f.key_file_of(0).unwrap();
        let p1 = f.key_file_of(1).unwrap();
        // Node 1's file copied where node 0's should be.
        std::fs::copy(&p1, &p0).unwrap();
        let e = f.pairwise_keys(0).unwrap_err().to_string();
        assert!(
            e.contains("overlay-0.key") && e.contains("belongs to node 1"),
            "{e}"
        );
        // A file without the key for node 2.
        let short =
            "node = 0\n\n[[peer]]\nnode = 1\nkey = \"".to_string() + &"ab".repeat(32) + "\"\n";
        std::fs::write(&p0, &short).unwrap();
        let e = f.pairwise_keys(0).unwrap_err().to_string();
        assert!(e.contains("no key for node 2"), "{e}");
        // A truncated key, reported without quoting the key.
        std::fs::write(&p0, short.replace(&"ab".repeat(32), &"ab".repeat(20))).unwrap();
        let e = f.pairwise_keys(0).unwrap_err().to_string();
        assert!(
            e.contains("40 hex digits") && !e.contains(&"ab".repeat(20)),
            "{e}"
        );
        // Garbage.
        std::fs::write(&p0, "node = \"zero\"\n").unwrap();
        let e = f.pairwise_keys(0).unwrap_err().to_string();
        assert!(e.contains("overlay-0.key") && e.contains("line 1"), "{e}");
        // Readable by others.
        std::fs::set_permissions(&p1, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = f.pairwise_keys(1).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }
}
