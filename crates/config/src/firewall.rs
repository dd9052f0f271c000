//! The order keys of the privacy firewall (`[protocol] filter_rows > 0`) and of Prime
//! (`ordering = "prime"`): one public file (`[keys] firewall`, default `keys/firewall.toml`)
//! with each replica's order key and, with a firewall, the execution nodes' threshold group
//! key and each filter's filter key, read by every node and client; and beside it one secret
//! file per node, mode 0600: `order-replica-<id>.key` (the replica signs its pieces of
//! agreement certificates, or its Prime PO-ARU rows, with it), `share-executor-<id>.key` (the
//! execution node's share of the threshold key) and `vouch-filter-<id>.key` (the filter signs
//! its vouches for the reply certificates it passes down with it). `redoubt init` is the
//! dealer ([`write_firewall_keys`]).

use crate::error::ConfigError;
use crate::ClusterConfig;
use redoubt_core::filter::FirewallKeys;
use redoubt_crypto::pk::{HolderSecrets, VerifyKey};
use redoubt_crypto::threshold::{self, GroupKey, KeyShare};
use redoubt_keyholder::{hex, unhex32};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublicFile {
    cluster: String,
    /// Each replica's order verification key, by id (hex).
    orders: Vec<String>,
    /// The threshold group key (hex); none without a firewall (Prime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    /// Each filter's filter key, by id (hex); none without a firewall.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    filters: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretFile {
    cluster: String,
    principal: String,
    secret: String,
}

fn invalid(cfg: &ClusterConfig, path: &Path, message: String) -> ConfigError {
    ConfigError::Invalid {
        path: cfg.path.clone(),
        field: format!("[keys] firewall ({})", path.display()),
        message,
    }
}

impl ClusterConfig {
    /// The resolved public firewall key file.
    pub fn firewall_path(&self) -> PathBuf {
        self.resolve(&self.keys.firewall)
    }

    /// The secret firewall key file of replica, execution node or filter `name`
    /// (`replica-0`).
    fn firewall_secret_path(&self, name: &str) -> PathBuf {
        let public = self.firewall_path();
        let dir = public.parent().map(Path::to_path_buf).unwrap_or_default();
        let prefix = if name.starts_with("replica") {
            "order"
        } else if name.starts_with("filter") {
            "vouch"
        } else {
            "share"
        };
        dir.join(format!("{prefix}-{name}.key"))
    }
}

/// Deals the order keys: an order key per replica and, with a firewall, a (g+1)-of-(2g+1)
/// threshold key for the execution nodes and a filter key per filter, from the dealer's
/// randomness `rng`. Writes the public file and the secret files (refusing to overwrite any).
pub fn write_firewall_keys(
    cfg: &ClusterConfig,
    rng: &mut impl FnMut() -> [u8; 32],
) -> Result<(), ConfigError> {
    let public_path = cfg.firewall_path();
    let mut orders = Vec::new();
    for r in &cfg.replicas {
        let seed = rng();
        let key = HolderSecrets::from_seed(&seed);
        orders.push(hex(&key.public().verify.0));
        let name = format!("replica-{}", r.id);
        write_secret(cfg, &cfg.firewall_secret_path(&name), &name, &seed)?;
    }
    let group = if cfg.protocol.firewall() {
        let (group, shares) = threshold::deal(
            cfg.protocol.g() as usize,
            cfg.protocol.executors as usize,
            rng(),
        );
        for s in &shares {
            let name = format!("executor-{}", s.index());
            write_secret(cfg, &cfg.firewall_secret_path(&name), &name, &s.to_bytes())?;
        }
        Some(hex(&group.to_bytes()))
    } else {
        None
    };
    let mut filters = Vec::new();
    if cfg.protocol.firewall() {
        for x in 0..cfg.protocol.filters() {
            let seed = rng();
            filters.push(hex(&HolderSecrets::from_seed(&seed).public().verify.0));
            let name = format!("filter-{x}");
            write_secret(cfg, &cfg.firewall_secret_path(&name), &name, &seed)?;
        }
    }
    let file = PublicFile {
        cluster: cfg.cluster.id.clone(),
        orders,
        group,
        filters,
    };
    let text = format!(
        "# The privacy firewall's public keys (written by `redoubt init`, read by every node\n\
         # and client): each replica's order key, the execution nodes' threshold key and each\n\
         # filter's filter key.\n{}",
        toml::to_string(&file).map_err(|e| invalid(cfg, &public_path, e.to_string()))?
    );
    crate::keys::write_new_file(&public_path, &text, 0o644)
}

fn write_secret(
    cfg: &ClusterConfig,
    path: &Path,
    name: &str,
    secret: &[u8; 32],
) -> Result<(), ConfigError> {
    let file = SecretFile {
        cluster: cfg.cluster.id.clone(),
        principal: name.into(),
        secret: hex(secret),
    };
    let text = toml::to_string(&file).map_err(|e| invalid(cfg, path, e.to_string()))?;
    crate::keys::write_new_file(path, &text, 0o600)
}

/// The firewall's public keys; `None` without a firewall.
pub fn load_firewall(cfg: &ClusterConfig) -> Result<Option<Arc<FirewallKeys>>, ConfigError> {
    if !cfg.protocol.firewall() {
        return Ok(None);
    }
    let (path, raw, orders) = load_public(cfg)?;
    let Some(group) = raw.group else {
        return Err(invalid(
            cfg,
            &path,
            "holds no threshold group key (rerun `redoubt init`)".into(),
        ));
    };
    let group_bytes = unhex(&group).map_err(|e| invalid(cfg, &path, e))?;
    let group = GroupKey::from_bytes(&group_bytes).map_err(|e| invalid(cfg, &path, e))?;
    if group.threshold() != cfg.protocol.g() as usize {
        return Err(invalid(
            cfg,
            &path,
            format!(
                "the group key needs {} shares, the cluster's execution nodes g+1 = {}",
                group.threshold() + 1,
                cfg.protocol.g() + 1
            ),
        ));
    }
    let filters = public_keys(
        cfg,
        &path,
        &raw.filters,
        cfg.protocol.filters() as usize,
        ("filter", "filters"),
    )?;
    Ok(Some(Arc::new(FirewallKeys {
        orders,
        group,
        filters,
    })))
}

/// Every replica's public order key, for Prime (they check each other's PO-ARU rows with
/// them); `None` when PBFT orders.
pub fn load_prime_orders(cfg: &ClusterConfig) -> Result<Option<Arc<Vec<VerifyKey>>>, ConfigError> {
    if !cfg.protocol.prime() {
        return Ok(None);
    }
    let (_, _, orders) = load_public(cfg)?;
    Ok(Some(Arc::new(orders)))
}

/// The public file, checked against the cluster, and its order keys.
fn load_public(cfg: &ClusterConfig) -> Result<(PathBuf, PublicFile, Vec<VerifyKey>), ConfigError> {
    let path = cfg.firewall_path();
    let src = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io {
        action: "read the firewall key file",
        path: path.clone(),
        source,
    })?;
    let raw: PublicFile = toml::from_str(&src)
        .map_err(|e| invalid(cfg, &path, format!("does not parse: {}", e.message())))?;
    if raw.cluster != cfg.cluster.id {
        return Err(invalid(
            cfg,
            &path,
            format!(
                "belongs to cluster {}, not {} (keys of another cluster)",
                raw.cluster, cfg.cluster.id
            ),
        ));
    }
    let orders = public_keys(
        cfg,
        &path,
        &raw.orders,
        cfg.replicas.len(),
        ("order", "replicas"),
    )?;
    Ok((path, raw, orders))
}

/// The `count` public keys in `hexes`, by id; `(kind, owners)` name them in errors ("order",
/// "replicas").
fn public_keys(
    cfg: &ClusterConfig,
    path: &Path,
    hexes: &[String],
    count: usize,
    (kind, owners): (&str, &str),
) -> Result<Vec<VerifyKey>, ConfigError> {
    if hexes.len() != count {
        return Err(invalid(
            cfg,
            path,
            format!(
                "{} {kind} keys for {count} {owners} (rerun `redoubt init`)",
                hexes.len()
            ),
        ));
    }
    hexes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            unhex32(h)
                .map(VerifyKey)
                .map_err(|e| invalid(cfg, path, format!("{kind} key {i}: {e}")))
        })
        .collect()
}

fn load_secret(cfg: &ClusterConfig, name: &str) -> Result<[u8; 32], ConfigError> {
    let path = cfg.firewall_secret_path(name);
    let meta = std::fs::metadata(&path).map_err(|source| ConfigError::Io {
        action: "read a firewall secret key file",
        path: path.clone(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::KeyPermissions { path, mode });
    }
    let src = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io {
        action: "read a firewall secret key file",
        path: path.clone(),
        source,
    })?;
    let raw: SecretFile = toml::from_str(&src)
        .map_err(|e| invalid(cfg, &path, format!("does not parse: {}", e.message())))?;
    if raw.cluster != cfg.cluster.id || raw.principal != name {
        return Err(invalid(
            cfg,
            &path,
            format!(
                "holds {}'s key of cluster {}, not {name}'s of {}",
                raw.principal, raw.cluster, cfg.cluster.id
            ),
        ));
    }
    unhex32(&raw.secret).map_err(|e| invalid(cfg, &path, e))
}

/// Replica `id`'s order key.
pub fn load_order_key(cfg: &ClusterConfig, id: u32) -> Result<HolderSecrets, ConfigError> {
    load_secret(cfg, &format!("replica-{id}")).map(|s| HolderSecrets::from_seed(&s))
}

/// Filter `id`'s filter key (it signs its vouches with it).
pub fn load_filter_key(cfg: &ClusterConfig, id: u32) -> Result<HolderSecrets, ConfigError> {
    load_secret(cfg, &format!("filter-{id}")).map(|s| HolderSecrets::from_seed(&s))
}

/// Execution node `id`'s share of the threshold key.
pub fn load_reply_share(cfg: &ClusterConfig, id: u32) -> Result<KeyShare, ConfigError> {
    let name = format!("executor-{id}");
    let secret = load_secret(cfg, &name)?;
    let path = cfg.firewall_secret_path(&name);
    KeyShare::from_bytes(id as usize, secret).map_err(|e| invalid(cfg, &path, e))
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err("odd number of hex digits".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| format!("not hex: {e}")))
        .collect()
}
