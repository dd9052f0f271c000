//! N-way fail-over of virtual IP addresses among a group of servers on one LAN: Wackamole
//! (Amir, Caudy, Munjal, Schlossnagle, Tutu, DSN 2003). Clients reach a service through a set of
//! virtual addresses; the servers agree which of them covers each address, so that every
//! address is covered by exactly one connected server, and move the addresses of a server that
//! crashes, partitions away or leaves to the others.
//!
//! - [`machine`]: the pure core, group membership and the Wackamole algorithm as one
//!   deterministic state machine (`Input -> Vec<Effect>`, time passed in);
//! - [`alloc`]: its two deterministic procedures, conflict resolution and reallocation;
//! - [`wire`]: datagrams, authenticated with a MAC under the group key, bounded decoding;
//! - [`daemon`]: the tokio host: UDP, `ip addr add/del`, gratuitous ARP ([`arp`]);
//! - [`config`]: the group's TOML file; [`run_vip`]: the entry point of `redoubt vip`;
//! - [`lab`]: a group on one machine in network namespaces (`redoubt demo --vip`, tests).
//!
//! What it must never do: panic or allocate without bound on network input (datagrams are
//! refused with a counted reason); acquire an address while gathering states, or hold one it
//! could not account for in its state messages; take an address away from its holder in a
//! connected group before that holder has released it (balancing waits for the release).
//!
//! Its fault model is the paper's: benign crashes and partitions. The group key keeps hosts
//! outside the group from forging membership, but a member that is broken into can take any
//! address or spoof ARP; this is not an intrusion-tolerant component (docs/vip.md).

pub mod addr;
pub mod alloc;
pub mod arp;
pub mod config;
pub mod daemon;
pub mod host;
pub mod lab;
pub mod machine;
mod membership;
pub mod wire;

pub use addr::Cidr;
pub use config::{ConfigError, VipConfig};
pub use machine::{Effect, Input, MachineConfig, Wackamole};
pub use wire::MemberId;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum VipError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: which member is this? pass --id N or set `id` in the file")]
    NoId { path: PathBuf },
    #[error("cannot bind the group socket to {addr}: {source} (is this host's [[member]] addr one of its own addresses, and is another daemon running?)")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Runs one member of the group described by the file at `config_path` until SIGTERM or
/// SIGINT, then leaves the group (releasing its addresses first). `id` overrides the file's
/// `id`.
pub fn run_vip(config_path: &Path, id: Option<MemberId>) -> Result<daemon::Report, VipError> {
    let cfg = VipConfig::load(config_path)?;
    let id = id.or(cfg.id).ok_or_else(|| VipError::NoId {
        path: config_path.to_path_buf(),
    })?;
    cfg.member(id)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(VipError::Runtime)?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(VipError::Signals)?;
        let mut int = signal(SignalKind::interrupt()).map_err(VipError::Signals)?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        };
        daemon::run(&cfg, id, shutdown).await
    })
}
