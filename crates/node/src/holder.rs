//! A replica's key holder served from a process of the node (`redoubt keyholder`, `redoubt
//! monitor`, tests): the key holder itself is `redoubt-keyholder`.

use redoubt_config::keys::{check_holder_cluster, load_directory};
use redoubt_config::{load_file_keys, session_keys};
use redoubt_config::{ClusterConfig, ConfigError};
use redoubt_core::keys::Keys;
use redoubt_core::Principal;
use redoubt_keyholder::{principal_name, read_holder_file, serve_shared, FileHolder, SocketHolder};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The keys of node `me`: with session keys, a replica's or execution node's key holder
/// connected over its Unix socket (the holder runs in its own process: `redoubt monitor` or
/// `redoubt keyholder`); otherwise what the files hold ([`load_file_keys`]).
pub fn load_keys(cfg: &ClusterConfig, me: Principal) -> Result<Keys, ConfigError> {
    let id = match me {
        Principal::Replica(id) | Principal::Executor(id) if cfg.keys.session() => id,
        _ => return load_file_keys(cfg, me),
    };
    let socket = cfg.holder_socket_for(me)?;
    let holder = SocketHolder::connect(&socket, me).map_err(|e| ConfigError::KeyHolder {
        principal: principal_name(me),
        socket: socket.clone(),
        message: e.to_string(),
        config: cfg.path.clone(),
        id,
    })?;
    session_keys(cfg, Box::new(holder))
}

/// A key holder served by this process, kept by its monitor: [`Served::begin_epoch`] when it
/// starts the replica again.
pub struct Served {
    pub socket: PathBuf,
    holder: Arc<Mutex<FileHolder>>,
}

impl Served {
    /// Starts a new epoch of the holder's counter (see [`FileHolder::begin_epoch`]).
    pub fn begin_epoch(&self) {
        self.holder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .begin_epoch();
    }
}

/// Opens replica `id`'s key-holder file (checked against the cluster) and serves it on the
/// replica's `holder_socket`, in threads of this process. Returns the socket path.
pub fn serve_for_replica(cfg: &ClusterConfig, id: u32) -> Result<PathBuf, ConfigError> {
    serve_for(cfg, Principal::Replica(id))
}

/// Like [`serve_for_replica`] for a replica or an execution node.
pub fn serve_for(cfg: &ClusterConfig, me: Principal) -> Result<PathBuf, ConfigError> {
    Ok(serve_kept(cfg, me)?.socket)
}

/// Like [`serve_for`], keeping a handle on the holder (for its monitor).
pub fn serve_kept(cfg: &ClusterConfig, me: Principal) -> Result<Served, ConfigError> {
    if !cfg.keys.session() {
        return Err(ConfigError::Invalid {
            path: cfg.path.clone(),
            field: "[keys] mode".into(),
            message: "it is \"static\": there is no key holder to run".into(),
        });
    }
    let file = read_holder_file(&cfg.key_file_of(me)?, me)?;
    check_holder_cluster(cfg, &file)?;
    let directory = Arc::new(load_directory(cfg)?);
    let holder = FileHolder::open(file, directory)?;
    let socket = cfg.holder_socket_for(me)?;
    let io = ConfigError::io;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
    }
    let holder = Arc::new(Mutex::new(holder));
    serve_shared(&socket, holder.clone()).map_err(io("serve the key holder on", &socket))?;
    Ok(Served { socket, holder })
}
