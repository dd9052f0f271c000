//! A principal's keys as the cluster file names them ([`load_file_keys`]), and the files they
//! are kept in.
//!
//! With session keys (`[keys] mode = "session"`) every principal has a key-holder file (see
//! `redoubt-keyholder`) and the cluster a public-key directory ([`load_directory`]): a client
//! runs its key holder in its own process, a replica reaches its own over a Unix socket.
//!
//! With static keys, key files: one per principal, mode 0600, holding only that principal's
//! directional MAC keys with each of its peers (a replica with every other principal, a client
//! with every replica).
//!
//! ```toml
//! principal = "replica:0"
//! cluster_id = "5f0c…"
//!
//! [[peer]]
//! principal = "replica:1"
//! send = "<64 hex digits>"   # key replica:0 → replica:1
//! recv = "<64 hex digits>"   # key replica:1 → replica:0
//! ```

use crate::{ClusterConfig, ConfigError, Location};
use redoubt_core::keys::{Directory, Keys, SessionKeys};
use redoubt_core::{Principal, StaticKeys};
use redoubt_crypto::pk::{PublicKeys, SealPublicKey, VerifyKey};
use redoubt_crypto::{MacKey, KEY_LEN};
use redoubt_keyholder::{hex, parse_principal, principal_name, unhex32, HolderFile};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use toml::Spanned;

/// Writes the key file of `me`: for each peer, `(peer, key me→peer, key peer→me)`. The file is
/// created with mode 0600; an existing file is never overwritten.
pub fn write_key_file(
    path: &Path,
    cluster_id: &str,
    me: Principal,
    keys: &[(Principal, MacKey, MacKey)],
) -> Result<(), ConfigError> {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# redoubt key file of {}: secret MAC keys, written by `redoubt init`.",
        principal_name(me)
    );
    let _ = writeln!(
        text,
        "# Keep it mode 0600 and on the host of its principal only; never share it."
    );
    let _ = writeln!(text, "principal = \"{}\"", principal_name(me));
    let _ = writeln!(
        text,
        "cluster_id = {}",
        toml::Value::String(cluster_id.to_string())
    );
    let mut sorted: Vec<&(Principal, MacKey, MacKey)> = keys.iter().collect();
    sorted.sort_by_key(|(p, _, _)| *p);
    for (peer, send, recv) in sorted {
        let _ = writeln!(text);
        let _ = writeln!(text, "[[peer]]");
        let _ = writeln!(text, "principal = \"{}\"", principal_name(*peer));
        let _ = writeln!(text, "send = \"{}\"", hex(&send.0));
        let _ = writeln!(text, "recv = \"{}\"", hex(&recv.0));
    }
    write_new_file(path, &text, 0o600)
}

/// Writes `text` to a new file at `path` with `mode` and syncs it; an existing file is an
/// error (keys are never overwritten).
pub(crate) fn write_new_file(path: &Path, text: &str, mode: u32) -> Result<(), ConfigError> {
    let io = |action: &'static str| {
        move |source: std::io::Error| ConfigError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                ConfigError::KeyExists {
                    path: path.to_path_buf(),
                }
            } else {
                io("create key file")(source)
            }
        })?;
    file.write_all(text.as_bytes())
        .map_err(io("write key file"))?;
    file.sync_all().map_err(io("sync key file"))?;
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeyFile {
    principal: Spanned<String>,
    cluster_id: String,
    #[serde(rename = "peer", default)]
    peers: Vec<RawPeer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    principal: Spanned<String>,
    send: Spanned<String>,
    recv: Spanned<String>,
}

/// Loads the keys of `me` from the files the configuration names, and checks them: its
/// static key file (its mode, that it belongs to `me` and to this cluster, that it has keys
/// for every peer of `me`; keys for principals no longer in the configuration are ignored),
/// or with session keys a client's key-holder file, run in the caller's process. A replica's
/// or an execution node's session keys come from its key-holder process over a Unix socket,
/// which this crate never opens: `redoubt_node::holder::load_keys` connects it and wraps it
/// with [`session_keys`].
pub fn load_file_keys(cfg: &ClusterConfig, me: Principal) -> Result<Keys, ConfigError> {
    if !cfg.keys.session() {
        return load_static_keys(cfg, me).map(Keys::Static);
    }
    match me {
        Principal::Client(_) => {
            let file = redoubt_keyholder::read_holder_file(&cfg.key_file_of(me)?, me)?;
            check_holder_cluster(cfg, &file)?;
            let directory = std::sync::Arc::new(load_directory(cfg)?);
            let holder = redoubt_keyholder::FileHolder::open(file, directory.clone())?;
            Ok(Keys::Session(SessionKeys::new(Box::new(holder), directory)))
        }
        Principal::Filter(_) => Err(ConfigError::Invalid {
            path: cfg.path.clone(),
            field: "[[filter]]".into(),
            message: "filter nodes hold no keys".into(),
        }),
        Principal::Replica(_) | Principal::Executor(_) => Err(ConfigError::Invalid {
            path: cfg.path.clone(),
            field: "[keys] mode".into(),
            message: format!(
                "{}'s session keys are in its key-holder process, reached over its socket, \
                 not in a file",
                principal_name(me)
            ),
        }),
    }
}

/// Session keys over `holder` (a key holder connected by the caller) and the cluster's
/// public-key directory.
pub fn session_keys(
    cfg: &ClusterConfig,
    holder: Box<dyn redoubt_core::KeyHolder>,
) -> Result<Keys, ConfigError> {
    let directory = std::sync::Arc::new(load_directory(cfg)?);
    Ok(Keys::Session(SessionKeys::new(holder, directory)))
}

/// Refuses a key-holder file of another cluster.
pub fn check_holder_cluster(cfg: &ClusterConfig, file: &HolderFile) -> Result<(), ConfigError> {
    if file.cluster_id != cfg.cluster.id {
        return Err(ConfigError::KeyCluster {
            path: file.path.clone(),
            config: cfg.path.clone(),
            found: file.cluster_id.clone(),
            expected: cfg.cluster.id.clone(),
        });
    }
    Ok(())
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDirectory {
    cluster_id: String,
    #[serde(default)]
    executors: Option<String>,
    #[serde(rename = "principal", default)]
    principals: Vec<RawDirectoryEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDirectoryEntry {
    name: String,
    verify: String,
    seal: String,
}

/// Writes the public-key directory (mode 0644; never overwriting).
pub fn write_directory(
    path: &Path,
    cluster_id: &str,
    keys: &[(Principal, PublicKeys)],
    executors: Option<&SealPublicKey>,
) -> Result<(), ConfigError> {
    let mut text = String::from(
        "# redoubt public-key directory, written by `redoubt init`: every principal's signing\n\
         # (verify) and sealing public keys. Not secret; identical on every host.\n",
    );
    let _ = writeln!(text, "cluster_id = \"{cluster_id}\"");
    if let Some(e) = executors {
        let _ = writeln!(
            text,
            "# The executors' public key: clients seal request bodies to it.\nexecutors = \"{}\"",
            hex(&e.0)
        );
    }
    for (p, k) in keys {
        let _ = writeln!(
            text,
            "\n[[principal]]\nname = \"{}\"\nverify = \"{}\"\nseal = \"{}\"",
            principal_name(*p),
            hex(&k.verify.0),
            hex(&k.seal.0)
        );
    }
    let io = |action: &'static str| {
        move |source: std::io::Error| ConfigError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(io("create"))?;
    f.write_all(text.as_bytes()).map_err(io("write"))?;
    f.sync_all().map_err(io("sync"))
}

/// Loads the public-key directory: this cluster's, with every principal of the config.
pub fn load_directory(cfg: &ClusterConfig) -> Result<Directory, ConfigError> {
    let path = cfg.directory_path();
    let err = |message: String| ConfigError::Directory {
        path: path.clone(),
        message,
    };
    let src = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
    let raw: RawDirectory =
        toml::from_str(&src).map_err(|e| err(e.message().trim().to_string()))?;
    if raw.cluster_id != cfg.cluster.id {
        return Err(err(format!(
            "it belongs to cluster {}, not {}",
            raw.cluster_id, cfg.cluster.id
        )));
    }
    let mut keys = BTreeMap::new();
    for e in raw.principals {
        let p = parse_principal(&e.name).ok_or_else(|| {
            err(format!(
                "principal {:?} is not replica:N or client:N",
                e.name
            ))
        })?;
        let verify = unhex32(&e.verify).map_err(|m| err(format!("{}: verify key {m}", e.name)))?;
        let seal = unhex32(&e.seal).map_err(|m| err(format!("{}: seal key {m}", e.name)))?;
        if keys
            .insert(
                p,
                PublicKeys {
                    verify: VerifyKey(verify),
                    seal: SealPublicKey(seal),
                },
            )
            .is_some()
        {
            return Err(err(format!("{} is listed twice", e.name)));
        }
    }
    for p in cfg.principals() {
        if !keys.contains_key(&p) {
            return Err(err(format!(
                "it has no public keys for {}",
                principal_name(p)
            )));
        }
    }
    let executors = match &raw.executors {
        Some(h) => Some(SealPublicKey(
            unhex32(h).map_err(|m| err(format!("executors key {m}")))?,
        )),
        None => None,
    };
    if cfg.protocol.confidential_bodies && executors.is_none() {
        return Err(err(
            "it has no executors' public key, which confidential_bodies needs (a cluster \
             initialised before confidential bodies: set confidential_bodies = false, or run \
             `redoubt init` again)"
                .into(),
        ));
    }
    Ok(Directory { keys, executors })
}

/// Loads static pairwise MAC keys (`[keys] mode = "static"`).
pub fn load_static_keys(cfg: &ClusterConfig, me: Principal) -> Result<StaticKeys, ConfigError> {
    let path = cfg.key_file_of(me)?;
    let read_err = |source| ConfigError::KeyRead {
        principal: principal_name(me),
        path: path.clone(),
        source,
    };
    let meta = std::fs::metadata(&path).map_err(read_err)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::KeyPermissions { path, mode });
    }
    let src = std::fs::read_to_string(&path).map_err(read_err)?;
    let malformed = |at: Location, message: String| ConfigError::KeyMalformed {
        path: path.clone(),
        at,
        message,
    };
    if let Err(e) = src.parse::<toml::Table>() {
        return Err(malformed(
            locate(&src, e.span()),
            format!("TOML syntax error: {}", e.message().trim()),
        ));
    }
    let raw: RawKeyFile = toml::from_str(&src)
        .map_err(|e| malformed(locate(&src, e.span()), e.message().trim().to_string()))?;

    let owner = parse_principal(raw.principal.get_ref()).ok_or_else(|| {
        malformed(
            locate(&src, Some(raw.principal.span())),
            format!(
                "principal \"{}\" is not of the form replica:N or client:N",
                raw.principal.get_ref().escape_debug()
            ),
        )
    })?;
    if owner != me {
        return Err(ConfigError::KeyOwner {
            path,
            found: principal_name(owner),
            expected: principal_name(me),
        });
    }
    if raw.cluster_id != cfg.cluster.id {
        return Err(ConfigError::KeyCluster {
            path,
            config: cfg.path.clone(),
            found: raw.cluster_id,
            expected: cfg.cluster.id.clone(),
        });
    }

    let mut table: BTreeMap<Principal, (MacKey, MacKey)> = BTreeMap::new();
    for peer in &raw.peers {
        let at = locate(&src, Some(peer.principal.span()));
        let p = parse_principal(peer.principal.get_ref()).ok_or_else(|| {
            malformed(
                at.clone(),
                format!(
                    "peer principal \"{}\" is not of the form replica:N or client:N",
                    peer.principal.get_ref().escape_debug()
                ),
            )
        })?;
        if p == me {
            return Err(malformed(
                at,
                format!("{} lists itself as a peer", principal_name(me)),
            ));
        }
        let key = |field: &'static str, value: &Spanned<String>| {
            decode_key(value.get_ref()).map_err(|problem| ConfigError::KeyBadHex {
                path: path.clone(),
                peer: principal_name(p),
                field,
                at: locate(&src, Some(value.span())),
                problem,
            })
        };
        let send = key("send", &peer.send)?;
        let recv = key("recv", &peer.recv)?;
        if table.insert(p, (send, recv)).is_some() {
            return Err(malformed(
                at,
                format!("peer {} is listed twice", principal_name(p)),
            ));
        }
    }

    let mut keys = BTreeMap::new();
    for peer in cfg.peers_of(me) {
        let Some(pair) = table.remove(&peer) else {
            return Err(ConfigError::KeyMissingPeer {
                path,
                config: cfg.path.clone(),
                principal: principal_name(me),
                peer: principal_name(peer),
            });
        };
        keys.insert(peer, pair);
    }
    Ok(StaticKeys::from_table(me, keys))
}

/// Locates a span of a key file without ever quoting a line that holds key material.
fn locate(src: &str, span: Option<std::ops::Range<usize>>) -> Location {
    let mut at = Location::of(src, span);
    let mut run = 0;
    for c in at.text.chars() {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 16 {
            at.text.clear();
            break;
        }
    }
    at
}

fn decode_key(s: &str) -> Result<MacKey, String> {
    if let Some(c) = s.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("contains {c:?}, which is not a hex digit"));
    }
    if s.len() != 2 * KEY_LEN {
        return Err(format!(
            "has {} hex digits ({} bytes), not {}",
            s.len(),
            s.len() / 2,
            2 * KEY_LEN
        ));
    }
    let mut key = [0u8; KEY_LEN];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("checked hex digits");
    }
    Ok(MacKey(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let k = MacKey([0xa5; KEY_LEN]);
        assert_eq!(decode_key(&hex(&k.0)).unwrap(), k);
        assert!(decode_key("zz").unwrap_err().contains("not a hex digit"));
        assert!(decode_key("abc").unwrap_err().contains("not 64"));
    }
}
