//! A replica's key holder served from a process of the node (`redoubt keyholder`, `redoubt
//! monitor`, tests): the key holder itself is `redoubt-keyholder`.

use redoubt_config::keys::{check_holder_cluster, load_directory};
use redoubt_config::{ClusterConfig, ConfigError};
use redoubt_core::Principal;
use redoubt_keyholder::{read_holder_file, serve, FileHolder};
use std::path::PathBuf;
use std::sync::Arc;

/// Opens replica `id`'s key-holder file (checked against the cluster) and serves it on the
/// replica's `holder_socket`, in threads of this process. Returns the socket path.
pub fn serve_for_replica(cfg: &ClusterConfig, id: u32) -> Result<PathBuf, ConfigError> {
    serve_for(cfg, Principal::Replica(id))
}

/// Like [`serve_for_replica`] for a replica or an execution node.
pub fn serve_for(cfg: &ClusterConfig, me: Principal) -> Result<PathBuf, ConfigError> {
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
    serve(&socket, holder).map_err(io("serve the key holder on", &socket))?;
    Ok(socket)
}
