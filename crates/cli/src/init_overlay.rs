//! `redoubt init --overlay`: an overlay file for the cluster just written, with one daemon
//! beside each replica and one for the clients, the links, every tunnel, the matching
//! `[[overlay_tunnel]]` entries appended to the cluster file, and the daemons' keys dealt.
//!
//! Ports, from the cluster's base port P: daemon `k` binds UDP P+200+k (the clients' daemon
//! is node n); daemon `k`'s tunnel to replica `j` listens on 127.0.0.1:P+300+k·n+j (tunnel
//! ports are local: each replica, and each client host, dials the daemon on its own machine);
//! daemon `k` serves its metrics on P+300+(n+1)·n+k, right after the tunnel ports.

use anyhow::Context;
use redoubt_config::ClusterConfig;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Offsets from the base port of the daemons' UDP ports and of the tunnel ports.
const UDP_OFFSET: u32 = 200;
const TUNNEL_OFFSET: u32 = 300;

/// What was written, for the summary.
pub struct Written {
    pub overlay_file: PathBuf,
    pub key_files: Vec<PathBuf>,
    /// Daemons: replicas' (0..n) and the clients' (n).
    pub daemons: usize,
}

/// Writes `overlay.toml` beside the cluster file `cfg` (whose replicas listen on
/// `base_port + i`), appends the `[[overlay_tunnel]]` entries to the cluster file, and deals
/// the daemons' key files.
pub fn write(cfg: &ClusterConfig, base_port: u16) -> anyhow::Result<Written> {
    let n = cfg.replicas.len() as u32;
    let last = u32::from(base_port) + TUNNEL_OFFSET + (n + 1) * n + n;
    if last > u32::from(u16::MAX) {
        anyhow::bail!(
            "--overlay needs ports up to base port + {} ({last}): choose a lower --base-port",
            TUNNEL_OFFSET + (n + 1) * n + n
        );
    }
    let host = cfg
        .replicas
        .first()
        .map(|r| r.addr.ip())
        .context("the cluster has no replica")?;
    let udp = |k: u32| format!("{host}:{}", u32::from(base_port) + UDP_OFFSET + k);
    let tunnel = |k: u32, j: u32| {
        format!(
            "127.0.0.1:{}",
            u32::from(base_port) + TUNNEL_OFFSET + k * n + j
        )
    };
    let metrics = |k: u32| {
        format!(
            "{host}:{}",
            u32::from(base_port) + TUNNEL_OFFSET + (n + 1) * n + k
        )
    };
    let mut o = String::from(
        "# The overlay of `redoubt overlay --config overlay.toml --id K` (docs/operations.md,\n\
         # \"Running replicas over the overlay\"; every option: docs/configuration.md).\n\
         # Written by `redoubt init --overlay`: one daemon beside each replica (nodes 0 to n-1)\n\
         # and one for the clients (node n), every pair of daemons linked. On several hosts,\n\
         # set each node's addr to its host's address, and keep only the links your network has.\n\
         [overlay]\nrouting = \"odsbr\"\nrecovery = \"hop_by_hop\"\n",
    );
    for (k, r) in cfg.replicas.iter().enumerate() {
        let _ = write!(
            o,
            "\n[[node]]\nid = {k}\naddr = \"{}\"\nkey_file = \"keys/overlay-{k}.key\"\nreplica_addr = \"{}\"\nmetrics_addr = \"{}\"\n",
            udp(k as u32),
            r.addr,
            metrics(k as u32)
        );
    }
    let _ = write!(
        o,
        "\n[[node]]\nid = {n}\naddr = \"{}\"\nkey_file = \"keys/overlay-{n}.key\"\nmetrics_addr = \"{}\"\n",
        udp(n),
        metrics(n)
    );
    for a in 0..=n {
        for b in a + 1..=n {
            let _ = write!(o, "\n[[link]]\na = {a}\nb = {b}\n");
        }
    }
    let mut tunnels = String::from(
        "\n# Replicas and clients reach the other replicas through the overlay daemon beside\n\
         # them (`redoubt init --overlay`; overlay.toml has the daemons).\n",
    );
    for k in 0..=n {
        for j in (0..n).filter(|j| *j != k) {
            let _ = write!(
                o,
                "\n[[tunnel]]\nnode = {k}\npeer = {j}\nlisten = \"{}\"\n",
                tunnel(k, j)
            );
            if k < n {
                let _ = write!(
                    tunnels,
                    "\n[[overlay_tunnel]]\nreplica = {k}\npeer = {j}\naddr = \"{}\"\n",
                    tunnel(k, j)
                );
            }
        }
    }
    for c in &cfg.clients {
        for j in 0..n {
            let _ = write!(
                tunnels,
                "\n[[overlay_tunnel]]\nclient = {}\npeer = {j}\naddr = \"{}\"\n",
                c.id,
                tunnel(n, j)
            );
        }
    }
    let dir = cfg
        .path
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let overlay_file = dir.join("overlay.toml");
    std::fs::write(&overlay_file, o)
        .with_context(|| format!("cannot write {}", overlay_file.display()))?;
    let mut text = std::fs::read_to_string(&cfg.path)
        .with_context(|| format!("cannot read {}", cfg.path.display()))?;
    text.push_str(&tunnels);
    std::fs::write(&cfg.path, text)
        .with_context(|| format!("cannot write {}", cfg.path.display()))?;
    let file = redoubt_overlayd::OverlayFile::load(&overlay_file)?;
    let key_files = redoubt_overlayd::keys::deal(&file, false)?;
    Ok(Written {
        overlay_file,
        key_files,
        daemons: n as usize + 1,
    })
}
