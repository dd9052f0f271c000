//! A node's endpoints: its protocol listener and metrics endpoint, its links' settings, and
//! how the frames they read are opened before they reach the protocol task.

use crate::metrics::{self, Metrics};
use crate::runtime::{NodeError, INBOUND_FRAMES_MAX};
use crate::status::StatusReport;
use redoubt_config::ClusterConfig;
use redoubt_core::{preopen_from, ClientId, Preopened, Principal};
use redoubt_transport::{ConnId, ConnInbound, Inbound, LinkConfig, Listener, ListenerConfig};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// A node's endpoints: the protocol listener with its inbound frames, and the HTTP endpoint
/// of its metrics and status (stopped when dropped).
pub(crate) struct Endpoints<M> {
    pub listener: Listener,
    pub inbound: mpsc::Receiver<(ConnId, M)>,
    pub status: Arc<Mutex<StatusReport>>,
    pub http: AbortOnDrop,
}

/// Frames a node receives, each turned into an `M` by `open` on the task (and thread) that
/// read it, then queued for the node's protocol task: the listener's (with the connection)
/// or the links'.
///
/// A frame is opened only once the queue has room for it: a full queue drops it unread.
pub(crate) struct Opening<T, M> {
    tx: mpsc::Sender<T>,
    open: OpenFn<M>,
}

/// How a node turns a received frame into what its protocol task takes.
pub(crate) type OpenFn<M> = Arc<dyn Fn(Vec<u8>) -> M + Send + Sync>;

impl<T, M> Clone for Opening<T, M> {
    fn clone(&self) -> Self {
        Opening {
            tx: self.tx.clone(),
            open: self.open.clone(),
        }
    }
}

impl<T, M> Opening<T, M> {
    pub(crate) fn new(tx: mpsc::Sender<T>, open: OpenFn<M>) -> Self {
        Opening { tx, open }
    }
}

impl<M: Send + 'static> ConnInbound for Opening<(ConnId, M), M> {
    fn deliver(&self, conn: ConnId, frame: Vec<u8>) -> bool {
        match self.tx.try_reserve() {
            Ok(slot) => {
                slot.send((conn, (self.open)(frame)));
                true
            }
            Err(_) => false,
        }
    }
}

impl<M: Send + 'static> Inbound for Opening<M, M> {
    fn deliver(&self, frame: Vec<u8>) -> bool {
        match self.tx.try_reserve() {
            Ok(slot) => {
                slot.send((self.open)(frame));
                true
            }
            Err(_) => false,
        }
    }
}

/// Frames as they arrived, for nodes that open them in their protocol task.
pub(crate) fn as_received() -> OpenFn<Vec<u8>> {
    Arc::new(|frame| frame)
}

/// Binds node `entry_role`'s protocol listener (`addr`) and metrics endpoint
/// (`metrics_addr`); each frame the listener reads is turned into an `M` by `open` on the
/// connection's task.
pub(crate) async fn bind_endpoints<M: Send + 'static>(
    cfg: &ClusterConfig,
    (addr, metrics_addr): (SocketAddr, SocketAddr),
    entry_role: Principal,
    metrics: Arc<Metrics>,
    open: OpenFn<M>,
) -> Result<Endpoints<M>, NodeError> {
    let id = match entry_role {
        Principal::Replica(i) | Principal::Executor(i) | Principal::Filter(i) => i,
        Principal::Client(_) => 0,
    };
    let role = match entry_role {
        Principal::Executor(_) => "executor",
        Principal::Filter(_) => "filter",
        _ => "replica",
    };
    let bind_err = |what, field, addr, source| NodeError::Bind {
        role,
        what,
        field,
        id,
        addr,
        config: cfg.path.display().to_string(),
        source,
    };
    let (in_tx, inbound) = mpsc::channel::<(ConnId, M)>(INBOUND_FRAMES_MAX);
    let listener = Listener::bind(addr, listener_config(cfg), Opening::new(in_tx, open))
        .await
        .map_err(|e| bind_err("protocol traffic", "addr", addr, e))?;
    let status = Arc::new(Mutex::new(StatusReport::default()));
    let http = metrics::serve(metrics_addr, metrics, status.clone())
        .await
        .map(AbortOnDrop)
        .map_err(|e| bind_err("metrics", "metrics_addr", metrics_addr, e))?;
    Ok(Endpoints {
        listener,
        inbound,
        status,
        http,
    })
}

/// The listener of a node (replica or execution node) as the configuration sets it.
pub(crate) fn listener_config(cfg: &ClusterConfig) -> ListenerConfig {
    ListenerConfig {
        frame_bytes_max: cfg.protocol.message_bytes_max,
        per_conn_queue_max: cfg.node.peer_queue_frames_max,
        connections_max: cfg.node.client_connections_max,
    }
}

/// The links of a node to its peers as the configuration sets them.
pub(crate) fn link_config(cfg: &ClusterConfig) -> LinkConfig {
    LinkConfig {
        frames_queued_max: cfg.node.peer_queue_frames_max,
        frame_bytes_max: cfg.protocol.message_bytes_max,
        backoff_min: Duration::from_millis(cfg.node.reconnect_backoff_min_ms),
        backoff_max: Duration::from_millis(cfg.node.reconnect_backoff_max_ms),
        connect_timeout: Duration::from_secs(2),
    }
}

/// Stops a spawned task when dropped: the metrics endpoint stops with its replica, whether
/// `run_replica` returns or its task is aborted (a replica restarted inside one process, as
/// tests do, must be able to bind the endpoint again).
pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a replica's connection and link tasks open the frames they read: decoded and hashed
/// there (`preopen`), off the protocol thread when the runtime has more than one. A frame
/// whose claimed sender the configuration does not name is left unread (the core rejects it
/// after its header; were the configuration to differ from the core's keys, the core would
/// decode it itself).
pub(crate) fn replica_preopen(cfg: &ClusterConfig) -> OpenFn<Preopened> {
    let (replicas, executors) = (cfg.replicas.len() as u64, cfg.executors.len() as u64);
    let clients: std::collections::HashSet<ClientId> = cfg.clients.iter().map(|c| c.id).collect();
    // Behind a firewall, the bottom row of filters passes certificates down.
    let filters: Vec<u32> = if cfg.protocol.firewall() {
        cfg.protocol.filter_row(0).collect()
    } else {
        Vec::new()
    };
    Arc::new(move |frame| {
        preopen_from(frame, |p| match p {
            Principal::Replica(r) => u64::from(r) < replicas,
            Principal::Executor(e) => u64::from(e) < executors,
            Principal::Client(c) => clients.contains(&c),
            Principal::Filter(x) => filters.contains(&x),
        })
    })
}
