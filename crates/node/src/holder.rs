//! A replica's key holder served from a process of the node (`redoubt keyholder`, `redoubt
//! monitor`, tests): the key holder itself is `redoubt-keyholder`.

use redoubt_config::keys::{check_holder_cluster, load_directory};
use redoubt_config::{load_file_keys, session_keys};
use redoubt_config::{ClusterConfig, ConfigError};
use redoubt_core::holder::{perform, HolderAnswer, HolderCall};
use redoubt_core::keys::{KeyTable, Keys};
use redoubt_core::Principal;
use redoubt_keyholder::{principal_name, read_holder_file, serve_shared, FileHolder, SocketHolder};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tracing::{error, warn};

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

/// A node's calls to its key holder (the core's `Effect::Holder`), made on a thread of their
/// own so the protocol thread never waits on the key holder's socket (each answer follows a
/// sync to disk). Answers come back to the host loop in the order the holder gave them.
/// Both queues are bounded: a call that finds its queue full is dropped with a warning, and
/// the core gives it up after `redoubt_core::holder::CALL_TIMEOUT_MS`.
pub(crate) struct HolderDesk {
    calls: std::sync::mpsc::SyncSender<HolderCall>,
    who: Principal,
}

/// Calls (and answers) that may wait at once: the core keeps at most two admissions per
/// principal of the directory and one refresh in flight.
const HOLDER_QUEUE: usize = 4096;

impl HolderDesk {
    /// The desk of a node whose keys are `keys`, and the queue its answers arrive on; `None`
    /// without session keys (nothing is asked of a key holder then).
    pub(crate) fn for_keys(
        keys: &Keys,
        who: Principal,
    ) -> (
        Option<HolderDesk>,
        Option<tokio::sync::mpsc::Receiver<HolderAnswer>>,
    ) {
        let Some(holder) = keys.session_ref().map(|s| s.holder()) else {
            return (None, None);
        };
        let (calls, incoming) = std::sync::mpsc::sync_channel::<HolderCall>(HOLDER_QUEUE);
        let (answers, received) = tokio::sync::mpsc::channel(HOLDER_QUEUE);
        let spawned = std::thread::Builder::new()
            .name(format!("{who}-keyholder"))
            .spawn(move || {
                for call in incoming {
                    let answer = {
                        let mut h = holder.lock().unwrap_or_else(|e| e.into_inner());
                        perform(h.as_mut(), &call)
                    };
                    if answers.blocking_send(answer).is_err() {
                        break; // the node is gone
                    }
                }
            });
        if let Err(e) = spawned {
            error!(node = %who, error = %e, "cannot start the key-holder thread");
            return (None, Some(received));
        }
        (Some(HolderDesk { calls, who }), Some(received))
    }

    /// Hands `call` to the key-holder thread.
    pub(crate) fn call(&self, call: HolderCall) {
        if let Err(e) = self.calls.try_send(call) {
            warn!(node = %self.who, error = %e, "key-holder call dropped (the core gives it up)");
        }
    }
}

/// Hands `call` to `desk`, or reports that this node has no key holder to ask.
pub(crate) fn call_holder(desk: &Option<HolderDesk>, who: Principal, call: HolderCall) {
    match desk {
        Some(d) => d.call(call),
        None => error!(node = %who, "the core asked a key holder this node does not have"),
    }
}
