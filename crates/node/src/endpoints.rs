//! A node's endpoints: its protocol listener and metrics endpoint, its links' settings, and
//! how the frames they read are opened before they reach the protocol task.

use crate::metrics::{self, Metrics};
use crate::runtime::{NodeError, INBOUND_FRAMES_MAX};
use crate::status::StatusReport;
use prometheus::IntCounter;
use redoubt_config::ClusterConfig;
use redoubt_core::{preopen_from, ClientId, Preopened, Principal};
use redoubt_transport::{
    ByteBudget, Bytes, Charge, ConnId, ConnInbound, Inbound, Link, LinkConfig, LinkError, Listener,
    ListenerConfig,
};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// A node's endpoints: the protocol listener with its inbound frames, and the HTTP endpoint
/// of its metrics and status (stopped when dropped).
pub(crate) struct Endpoints<M> {
    pub listener: Listener,
    pub inbound: mpsc::Receiver<(ConnId, Charged<M>)>,
    /// The inbound queue's byte budget (its bytes queued are a metric).
    pub inbound_budget: Arc<ByteBudget>,
    pub status: Arc<Mutex<StatusReport>>,
    pub http: AbortOnDrop,
}

/// Frames a node receives, each turned into an `M` by `open` on the task (and thread) that
/// read it, then queued for the node's protocol task: the listener's (with the connection)
/// or the links'.
///
/// A queue is bounded twice: by its channel's frames and by a [`ByteBudget`] of the frames'
/// bytes. A frame is opened only once both have room for it: otherwise it is dropped unread
/// and counted in `dropped`.
pub(crate) struct Opening<T, M> {
    tx: mpsc::Sender<T>,
    open: OpenFn<M>,
    budget: Arc<ByteBudget>,
    dropped: IntCounter,
}

/// How a node turns a received frame into what its protocol task takes.
pub(crate) type OpenFn<M> = Arc<dyn Fn(Vec<u8>) -> M + Send + Sync>;

impl<T, M> Clone for Opening<T, M> {
    fn clone(&self) -> Self {
        Opening {
            tx: self.tx.clone(),
            open: self.open.clone(),
            budget: self.budget.clone(),
            dropped: self.dropped.clone(),
        }
    }
}

impl<T, M> Opening<T, M> {
    pub(crate) fn new(
        tx: mpsc::Sender<T>,
        open: OpenFn<M>,
        budget: Arc<ByteBudget>,
        dropped: IntCounter,
    ) -> Self {
        Opening {
            tx,
            open,
            budget,
            dropped,
        }
    }

    /// Opens `frame` into a free slot of the queue, charged to the budget, or drops it.
    fn admit(&self, frame: Vec<u8>, wrap: impl FnOnce(Charged<M>) -> T) -> bool {
        let admitted = self.tx.try_reserve().ok().and_then(|slot| {
            let charge = self.budget.charge(frame.len())?;
            let item = (self.open)(frame);
            slot.send(wrap(Charged { item, charge }));
            Some(())
        });
        if admitted.is_none() {
            self.dropped.inc();
        }
        admitted.is_some()
    }
}

impl<M: Send + 'static> ConnInbound for Opening<(ConnId, Charged<M>), M> {
    fn deliver(&self, conn: ConnId, frame: Vec<u8>) -> bool {
        self.admit(frame, |c| (conn, c))
    }
}

impl<M: Send + 'static> Inbound for Opening<Charged<M>, M> {
    fn deliver(&self, frame: Vec<u8>) -> bool {
        self.admit(frame, |c| c)
    }
}

/// A queued frame (opened into an `M`) with its charge to its queue's budget.
pub(crate) struct Charged<M> {
    item: M,
    charge: Charge,
}

impl<M> Charged<M> {
    /// The frame, its bytes returned to the budget: the protocol task takes it now.
    pub(crate) fn take(self) -> M {
        drop(self.charge);
        self.item
    }
}

/// An inbound queue of a node: its channel, its byte budget, and the counter of the frames
/// it dropped.
pub(crate) fn inbound_queue<T, M>(
    cfg: &ClusterConfig,
    metrics: &Metrics,
    label: &str,
    open: OpenFn<M>,
) -> (Opening<T, M>, mpsc::Receiver<T>, Arc<ByteBudget>) {
    let (tx, rx) = mpsc::channel::<T>(INBOUND_FRAMES_MAX);
    // Raised to one largest frame, as the transport raises its outgoing bounds.
    let budget = ByteBudget::new(
        cfg.node
            .inbound_queue_bytes()
            .max(cfg.protocol.message_bytes_max),
    );
    let dropped = metrics.frames_dropped.with_label_values(&[label]);
    (Opening::new(tx, open, budget.clone(), dropped), rx, budget)
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
    let (in_tx, inbound, inbound_budget) = inbound_queue(cfg, &metrics, "listener_inbound", open);
    let listener = Listener::bind(addr, listener_config(cfg), in_tx)
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
        inbound_budget,
        status,
        http,
    })
}

/// The listener of a node (replica or execution node) as the configuration sets it.
pub(crate) fn listener_config(cfg: &ClusterConfig) -> ListenerConfig {
    ListenerConfig {
        frame_bytes_max: cfg.protocol.message_bytes_max,
        per_conn_queue_max: cfg.node.peer_queue_frames_max,
        per_conn_queue_bytes_max: cfg.node.client_queue_bytes(),
        connections_max: cfg.node.client_connections_max,
    }
}

/// The links of a node to its peers as the configuration sets them.
pub(crate) fn link_config(cfg: &ClusterConfig) -> LinkConfig {
    LinkConfig {
        frames_queued_max: cfg.node.peer_queue_frames_max,
        bytes_queued_max: cfg.node.peer_queue_bytes(),
        frame_bytes_max: cfg.protocol.message_bytes_max,
        backoff_min: Duration::from_millis(cfg.node.reconnect_backoff_min_ms),
        backoff_max: Duration::from_millis(cfg.node.reconnect_backoff_max_ms),
        connect_timeout: Duration::from_secs(2),
    }
}

/// Sends `frame` on the link to peer `i` of `peers`, where this node's own entry (`None`)
/// counts as sent (the core never sends to its own id); `None` for a peer there is not.
pub(crate) fn send_to_peer(
    peers: &[Option<Link>],
    i: u32,
    frame: Bytes,
) -> Option<Result<(), LinkError>> {
    match peers.get(i as usize) {
        Some(Some(link)) => Some(link.send(frame)),
        Some(None) => Some(Ok(())),
        None => None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[tokio::test]
    async fn inbound_queue_is_bounded_in_bytes_and_counts_drops() {
        let (tx, mut rx) = mpsc::channel::<Charged<Vec<u8>>>(100);
        let budget = ByteBudget::new(1000);
        let dropped = IntCounter::new("dropped", "frames dropped").unwrap();
        let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = opened.clone();
        let open: OpenFn<Vec<u8>> = Arc::new(move |f| {
            count.fetch_add(1, Relaxed);
            f
        });
        let inbound = Opening::new(tx, open, budget.clone(), dropped.clone());
        assert!(Inbound::deliver(&inbound, vec![1; 600]));
        // 100 frames would fit the channel; 600 + 500 bytes do not fit the budget.
        assert!(!Inbound::deliver(&inbound, vec![2; 500]));
        assert!(Inbound::deliver(&inbound, vec![3; 400]));
        assert!(!Inbound::deliver(&inbound, vec![4; 1]));
        assert_eq!((budget.queued(), dropped.get()), (1000, 2));
        // Dropped frames were never opened.
        assert_eq!(opened.load(Relaxed), 2);
        // Taking a frame returns its bytes.
        let first = rx.recv().await.unwrap().take();
        assert_eq!(first, vec![1; 600]);
        assert_eq!(budget.queued(), 400);
        assert!(Inbound::deliver(&inbound, vec![5; 600]));
        // A frame dropped without being taken (the queue closing) returns its bytes too.
        drop(rx);
        assert_eq!(budget.queued(), 0);
    }
}
