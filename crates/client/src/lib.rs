//! The client library of redoubt: what an application links to invoke operations on a
//! replicated service.
//!
//! [`Client`] drives the pure client state machine of the protocol core
//! ([`redoubt_core::Client`]) over TCP: it keeps a reconnecting [`Link`] to every replica,
//! and each [`invoke`](Client::invoke) runs the state machine in the caller's own task,
//! feeding it a clock and randomness, until f+1 replicas returned the same result (so at
//! least one correct replica vouches for it). Requests go to the primary first and are
//! retransmitted to every replica with back-off until then.
//!
//! PBFT allows one outstanding request per client id, so concurrent `invoke`s on one client
//! (or its clones) are served one after the other; run several clients, with different ids,
//! for parallelism. If no reply certificate arrives within the configured deadline the request
//! is abandoned and [`ClientError::Unreachable`] returned; its outcome is then unknown (it may
//! still execute).
//!
//! A client of a cluster made by `redoubt init` gets everything it needs from the cluster file
//! ([`ClientSetup::from_config`]): the replicas' addresses, the protocol parameters, its timing
//! and its keys.
//!
//! Each client opens its own connections by default ([`Client::connect`]). A process that
//! runs many clients (an application server acting for many users, a load generator) can
//! share one connection per replica among them ([`Connections`], [`Client::connect_over`]):
//! replicas then send the replies of a whole batch to that process in a few writes instead
//! of one per client, and its requests leave in a few writes too.
//!
//! [`Client`] knows no service: operations and results are bytes. The typed clients of the
//! services of `redoubt_services` wrap it: [`kv::KvClient`], [`sql::SqlClient`] and
//! [`files::FileClient`].

pub mod files;
pub mod kv;
pub mod sql;

use redoubt_config::{ClusterConfig, ConfigError};
use redoubt_core::message::{reply_header, ReplyHeader};
use redoubt_core::ClientId as Id;
use redoubt_core::{
    Auth, ClientId, ClientTiming, Completion, Config, Effect, Env, InvokeError, Keys, Principal,
    View,
};
use redoubt_transport::{ByteBudget, Charge, Inbound, Link, LinkConfig, LinkError};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tracing::{debug, trace};

/// How often an invocation ticks the core while its request is outstanding.
const TICK: Duration = Duration::from_millis(5);

/// How long a client's first request waits for its connections to settle (established, or
/// refused at least once), so that it knows the replicas it cannot reach: a fast read leaves
/// them out rather than waiting for their answers before asking the others, and no request
/// leaves its result to one of them (digest replies).
const FIRST_CONNECT_WAIT: Duration = Duration::from_millis(50);
/// An invocation fails with [`ClientError::NoReplicaReachable`] once no replica has been
/// connected for this long (before its deadline, if that is longer).
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(3);
/// Stands for a deadline too far to be a point in time: about thirty years.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);
/// Frames received from all replicas waiting for the client's invocation to take them.
const INBOUND_QUEUE: usize = 1024;
/// Bytes of those frames (raised to one largest frame).
const INBOUND_BYTES: usize = 4 << 20;
/// Frames waiting to be written to one replica. A client has one request outstanding, so a
/// handful suffices; more would only delay fresh retransmissions behind stale ones.
const LINK_QUEUE: usize = 16;

/// Frames waiting to be written to one replica on connections shared by many clients, per
/// client sharing them.
const SHARED_LINK_QUEUE_PER_CLIENT: usize = 8;

/// Bytes of the frames waiting to be written to one replica (raised to one largest frame).
const LINK_QUEUE_BYTES: usize = 64 << 20;

/// Connections to every replica of a cluster, shared by the clients of one process (see
/// [`Client::connect_over`]). Each connection's reader hands a reply to the client it is for
/// (by the client id inside the reply) if that client still waits for it (by the request
/// timestamp inside); a replica's request for a client's key goes to every client on the
/// connection. Cheap to clone; the connections close when the last clone and the last
/// client using them are gone.
#[derive(Clone)]
pub struct Connections {
    links: Vec<Link>,
    routes: Arc<Mutex<HashMap<Id, Route>>>,
    frame_bytes_max: usize,
    unwanted: Arc<AtomicU64>,
}

/// Hands the frames the shared connections receive to their clients, from each connection's
/// reader (no task in between).
#[derive(Clone)]
struct Router {
    routes: std::sync::Weak<Mutex<HashMap<Id, Route>>>,
    unwanted: Arc<AtomicU64>,
    frame_bytes_max: usize,
}

impl Inbound for Router {
    fn deliver(&self, frame: Vec<u8>) -> bool {
        let Some(table) = self.routes.upgrade() else {
            return false; // the connections are being closed
        };
        // The sends do not wait, so the table's lock is held only briefly. A full client
        // queue drops the frame, as a full link would.
        let t = table.lock().unwrap_or_else(|p| p.into_inner());
        match demux_target(&frame, self.frame_bytes_max) {
            Some(h) => match t.get(&h.client) {
                Some(route) if route.wanted.load(Acquire) == h.timestamp => {
                    route.offer(Arc::new(frame), Some(h))
                }
                Some(_) => {
                    // Beyond the certificate, or late: not worth waking the client (it would
                    // drop it too).
                    self.unwanted.fetch_add(1, Relaxed);
                    true
                }
                None => true, // for no client of ours
            },
            None => {
                // One copy shared by every client's queue (each charges its own budget), so a
                // faulty replica's frame costs its size once, not once per client.
                let frame = Arc::new(frame);
                for route in t.values() {
                    let _ = route.offer(frame.clone(), None);
                }
                true
            }
        }
    }
}

/// A frame queued for one client: its reply header as the router read it (`None`: not a
/// reply), and the charge on the client's byte budget it holds until taken.
struct Arrived {
    frame: Arc<Vec<u8>>,
    header: Option<ReplyHeader>,
    charge: Charge,
}

/// Where the replies for one client go.
struct Route {
    tx: mpsc::Sender<Arrived>,
    /// The timestamp of the client's outstanding request (0: none), published by its invocations.
    wanted: Arc<AtomicU64>,
    /// The bytes `tx`'s queue may hold: frames wait there between invocations, and a faulty
    /// replica may send large ones. Each queued frame carries its charge.
    budget: Arc<ByteBudget>,
}

impl Route {
    /// Queues `frame` for the client unless the queue is full in frames or in bytes.
    fn offer(&self, frame: Arc<Vec<u8>>, header: Option<ReplyHeader>) -> bool {
        match self.budget.charge(frame.len()) {
            Some(charge) => self
                .tx
                .try_send(Arrived {
                    frame,
                    header,
                    charge,
                })
                .is_ok(),
            None => false,
        }
    }
}

impl Connections {
    /// Opens reconnecting connections to `replicas` (index = replica id) for up to
    /// `clients_max` clients (it sizes the outgoing queues). Must be called inside a tokio
    /// runtime.
    pub fn open(replicas: &[SocketAddr], clients_max: usize, frame_bytes_max: usize) -> Self {
        let routes: Arc<Mutex<HashMap<Id, Route>>> = Arc::default();
        let unwanted = Arc::new(AtomicU64::new(0));
        let router = Router {
            routes: Arc::downgrade(&routes),
            unwanted: unwanted.clone(),
            frame_bytes_max,
        };
        let link_cfg = LinkConfig {
            frames_queued_max: (SHARED_LINK_QUEUE_PER_CLIENT * clients_max).max(LINK_QUEUE),
            bytes_queued_max: LINK_QUEUE_BYTES.max(frame_bytes_max),
            frame_bytes_max,
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        };
        let links: Vec<Link> = replicas
            .iter()
            .map(|addr| Link::spawn(*addr, link_cfg.clone(), router.clone()))
            .collect();
        Connections {
            links,
            routes,
            frame_bytes_max,
            unwanted,
        }
    }

    /// Replies dropped on arrival because their client no longer waited for them (the
    /// replies beyond each request's certificate, mostly).
    pub fn unwanted_replies(&self) -> u64 {
        self.unwanted.load(Relaxed)
    }

    /// Registers client `id`, whose invocations publish the timestamp it waits for in `wanted`;
    /// `None` if a client with that id already uses the connections.
    fn attach(&self, id: Id, wanted: Arc<AtomicU64>) -> Option<Received> {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        match routes.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(e) => {
                let (tx, frames) = mpsc::channel(INBOUND_QUEUE);
                e.insert(Route {
                    tx,
                    wanted,
                    budget: ByteBudget::new(INBOUND_BYTES.max(self.frame_bytes_max)),
                });
                Some(frames)
            }
        }
    }

    fn detach(&self, id: Id) {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
}

/// A client's end of its route: each frame with its charge of the route's byte budget, returned
/// when the frame is taken.
type Received = mpsc::Receiver<Arrived>;

/// The client a frame from a replica is for, and the request it answers: the client and
/// timestamp named in a reply; `None` (every client) for anything else a replica sends
/// clients (its NEW-KEY asking for their keys) or for a frame that does not decode (each
/// client counts it as rejected).
fn demux_target(frame: &[u8], max: usize) -> Option<ReplyHeader> {
    if frame.len() > max {
        return None;
    }
    reply_header(frame)
}

/// Everything a client needs to reach a cluster.
#[derive(Clone, Debug)]
pub struct ClientSetup {
    /// This client's id; `keys` must be the keys of `Principal::Client(id)`.
    pub id: ClientId,
    /// Address of every replica; the index is the replica id.
    pub replicas: Vec<SocketAddr>,
    /// The cluster's protocol configuration (the client uses `f`, `n` and the size limits).
    pub core: Config,
    /// Retransmission timing.
    pub timing: ClientTiming,
    /// This client's keys shared with each replica.
    pub keys: Keys,
    /// How long one invocation may take before it is abandoned.
    pub deadline: Duration,
    /// Largest frame sent or accepted on a connection (bytes).
    pub frame_bytes_max: usize,
    /// Rewrites every frame before it is sent to a replica (the attack harness's faulty
    /// clients; `None` for every correct client).
    pub rewrite: Option<Rewrite>,
}

/// A rewrite of the frames a client sends: `(replica, frame) -> frame to send instead`.
#[derive(Clone)]
pub struct Rewrite(pub Arc<RewriteFn>);

/// The function of a [`Rewrite`].
pub type RewriteFn = dyn Fn(u32, &[u8]) -> Vec<u8> + Send + Sync;

impl std::fmt::Debug for Rewrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rewrite(..)")
    }
}

impl ClientSetup {
    /// A setup with default timing, a 5 s deadline (the cluster file's default) and the core's message size limit.
    pub fn new(id: ClientId, replicas: Vec<SocketAddr>, core: Config, keys: Keys) -> Self {
        let frame_bytes_max = core.message_bytes_max;
        ClientSetup {
            id,
            replicas,
            core,
            timing: ClientTiming::default(),
            keys,
            deadline: Duration::from_secs(5),
            frame_bytes_max,
            rewrite: None,
        }
    }

    /// The setup of client `id` of the cluster file at `path` (written by `redoubt init`):
    /// every replica's address, the protocol, `[client_timing]` (retransmissions and the
    /// deadline) and the client's own keys, from the key file the cluster file names.
    pub fn from_config(path: &Path, id: ClientId) -> Result<Self, ConfigError> {
        Self::from_cluster(&ClusterConfig::load(path)?, id)
    }

    /// Like [`ClientSetup::from_config`], for a cluster file already loaded. A replica the file
    /// gives this client an `[[overlay_tunnel]]` to is reached through that tunnel port.
    pub fn from_cluster(cfg: &ClusterConfig, id: ClientId) -> Result<Self, ConfigError> {
        cfg.client_entry(id)?;
        let keys = redoubt_config::load_file_keys(cfg, Principal::Client(id))?;
        Ok(ClientSetup {
            timing: cfg.client_timing(),
            deadline: Duration::from_millis(cfg.client.deadline_ms),
            ..ClientSetup::new(
                id,
                cfg.replicas
                    .iter()
                    .map(|r| cfg.client_peer_addr(id, r.id))
                    .collect(),
                cfg.protocol.clone(),
                keys,
            )
        })
    }

    fn check(&self) -> Result<(), String> {
        self.core.validate_for_client()?;
        if self.replicas.len() != self.core.n() as usize {
            return Err(format!(
                "{} replica addresses given for a cluster of n = 3f+1 = {}",
                self.replicas.len(),
                self.core.n()
            ));
        }
        if self.keys.me() != Principal::Client(self.id) {
            return Err(format!(
                "the keys belong to {}, not to client {}",
                self.keys.me(),
                self.id
            ));
        }
        if let Some(r) = (0..self.core.n()).find(|r| !self.keys.knows(Principal::Replica(*r))) {
            return Err(format!("the keys have no key shared with replica {r}"));
        }
        if self.deadline.is_zero() {
            return Err("the deadline must be positive".into());
        }
        Ok(())
    }
}

/// Why an invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No certificate of f+1 matching replies arrived in time. The request was abandoned; it
    /// may or may not have been executed.
    #[error(
        "no reply certificate from the cluster within {deadline:?} ({connected} of {replicas} \
         replicas connected); the operation may or may not have taken effect"
    )]
    Unreachable {
        deadline: Duration,
        connected: usize,
        replicas: usize,
    },
    /// No connection to any replica could be kept open for [`UNREACHABLE_AFTER`] during the
    /// invocation: the replicas are down, or the addresses are wrong. The request was
    /// abandoned; if a replica comes up soon, frames still queued for it may reach it.
    #[error(
        "no replica reachable for {waited:?} (0 of {replicas} connected): are the replicas \
         running, and do the cluster file's addresses match them? The operation was not \
         acknowledged (it may still take effect if a replica comes up now)"
    )]
    NoReplicaReachable { waited: Duration, replicas: usize },
    /// The operation is larger than the cluster accepts in one request.
    #[error("operation of {0} bytes exceeds the cluster's request size limit")]
    TooLarge(usize),
    /// The client's connections are gone.
    #[error("the client is shut down")]
    Closed,
    /// Confidential bodies: no body session with the executors could be started (the key
    /// holder failed, or the directory has no executors' public key).
    #[error("cannot seal the operation: {0}")]
    NoBodySession(String),
    /// Confidential bodies: the cluster answered, but the executors did not run the
    /// operation (it did not open there), or the certified result did not open here.
    #[error("the executors refused the operation: {0}")]
    Refused(String),
    /// [`Client::connect`] was given an inconsistent setup.
    #[error("invalid client setup: {0}")]
    InvalidSetup(String),
}

/// Counters of a [`Client`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Invocations that completed with a reply certificate.
    pub completed: u64,
    /// Invocations abandoned at the deadline.
    pub unreachable: u64,
    /// Retransmission rounds, summed over completed invocations.
    pub retransmissions: u64,
    /// Latency of the last completed invocation.
    pub last_latency: Option<Duration>,
    /// Frames from replicas that did not verify or did not match.
    pub frames_rejected: u64,
    /// Replies dropped unverified because they answered no outstanding request (mostly the
    /// replies beyond each request's certificate), as of the last completed invocation. Most
    /// are dropped before reaching the client, by the connections' router (on shared
    /// connections, counted in [`Connections::unwanted_replies`]).
    pub replies_unwanted: u64,
    /// Frames not sent because a replica's outgoing queue was full.
    pub frames_dropped: u64,
    /// Fast reads sent to 2f+1 replicas that had to ask the others too (answers late or
    /// different), and fast reads reissued on the ordered path, as of the last completed
    /// invocation.
    pub reads_widened: u64,
    pub reads_ordered: u64,
    /// Results asked for again because matching digests came without the result in full
    /// (its designated replier is down or slow), as of the last completed invocation.
    pub results_asked_again: u64,
    /// Replicas with an established connection right now.
    pub replicas_connected: usize,
    /// The view the client believes current (its primary is `view mod n`).
    pub view: View,
}

/// A handle to a client connected to a cluster. Cheap to clone; clones share the client id,
/// and so take turns. The connections close when the last clone is dropped.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Handle>,
}

struct Handle {
    id: ClientId,
    /// The state machine and the frames the replicas sent it. One outstanding request per
    /// client id: an invocation holds it from start to end, and the others queue here.
    driver: tokio::sync::Mutex<Driver>,
    request_bytes_max: usize,
    state: Arc<State>,
    /// The connections (if shared with other clients, they stay open when this one stops).
    connections: Connections,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.connections.detach(self.id);
        debug!(client = self.id, "client stopped");
    }
}

/// What the driver reports to the handles.
#[derive(Default)]
struct State {
    view: AtomicU64,
    stats: Mutex<ClientStats>,
}

impl State {
    fn update(&self, f: impl FnOnce(&mut ClientStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

impl Client {
    /// Starts the client: one reconnecting link per replica. Does not wait for any replica to
    /// be up. Must be called inside a tokio runtime.
    pub async fn connect(setup: ClientSetup) -> Result<Client, ClientError> {
        setup.check().map_err(ClientError::InvalidSetup)?;
        // Connections of its own are connections shared by one client: the same router drops
        // the replies it no longer waits for before they are queued, between invocations too.
        let connections = Connections::open(&setup.replicas, 1, setup.frame_bytes_max);
        Self::connect_over(setup, &connections).await
    }

    /// Starts a client over connections shared with other clients of this process (see
    /// [`Connections`]); `setup.replicas` must name the addresses `connections` were opened
    /// to. Two clients with the same id cannot share connections.
    pub async fn connect_over(
        setup: ClientSetup,
        connections: &Connections,
    ) -> Result<Client, ClientError> {
        setup.check().map_err(ClientError::InvalidSetup)?;
        if connections.links.len() != setup.replicas.len()
            || connections
                .links
                .iter()
                .zip(&setup.replicas)
                .any(|(l, a)| l.addr() != *a)
        {
            return Err(ClientError::InvalidSetup(
                "the shared connections lead to other replica addresses".into(),
            ));
        }
        if connections.frame_bytes_max < setup.frame_bytes_max {
            return Err(ClientError::InvalidSetup(
                "the shared connections accept smaller frames than this client's setup".into(),
            ));
        }
        let wanted = Arc::new(AtomicU64::new(0));
        let Some(inbound) = connections.attach(setup.id, wanted.clone()) else {
            return Err(ClientError::InvalidSetup(format!(
                "client {} already uses these connections",
                setup.id
            )));
        };
        Ok(Self::start(setup, connections.clone(), inbound, wanted))
    }

    fn start(
        setup: ClientSetup,
        connections: Connections,
        inbound: Received,
        wanted: Arc<AtomicU64>,
    ) -> Client {
        let state = Arc::new(State::default());
        let core = redoubt_core::Client::new(
            setup.core.clone(),
            setup.timing.clone(),
            setup.id,
            setup.keys.clone(),
        );
        let driver = Driver {
            core,
            inbound,
            reconnects: vec![0; connections.links.len()],
            links_settled: false,
            links: connections.links.clone(),
            state: state.clone(),
            deadline: setup.deadline,
            clock: Clock::start(),
            wanted,
            rejected_seen: 0,
            rewrite: setup.rewrite.clone(),
        };
        debug!(client = setup.id, replicas = ?setup.replicas, "client started");
        Client {
            inner: Arc::new(Handle {
                id: setup.id,
                driver: tokio::sync::Mutex::new(driver),
                request_bytes_max: setup.core.request_bytes_max,
                state,
                connections,
            }),
        }
    }

    /// This client's id.
    pub fn id(&self) -> ClientId {
        self.inner.id
    }

    /// Executes `op` on the replicated service and returns its result, once f+1 replicas
    /// agree on it.
    pub async fn invoke(&self, op: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        self.call(op, false, None).await
    }

    /// [`Client::invoke`] with its own deadline instead of the setup's (time waiting for an
    /// earlier invocation of this client to finish does not count).
    pub async fn invoke_within(
        &self,
        op: Vec<u8>,
        deadline: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        self.call(op, false, Some(deadline)).await
    }

    /// [`Client::invoke_read_only`] with its own deadline instead of the setup's.
    pub async fn invoke_read_only_within(
        &self,
        op: Vec<u8>,
        deadline: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        self.call(op, true, Some(deadline)).await
    }

    /// [`Client::invoke`] (`read_only` false) or [`Client::invoke_read_only`] (true), with
    /// `deadline` instead of the setup's when given: for typed clients that choose per call.
    pub async fn invoke_as(
        &self,
        op: Vec<u8>,
        read_only: bool,
        deadline: Option<Duration>,
    ) -> Result<Vec<u8>, ClientError> {
        self.call(op, read_only, deadline).await
    }

    /// Like [`Client::invoke`] for an operation that does not modify the state. With
    /// `read_only_fast_path` it goes to 2f+1 replicas (to the others too when their answers are
    /// late or differ) and completes with 2f+1 matching answers
    /// (one round trip, unordered), falling back to the ordered path when they do not agree in
    /// time; the result is linearizable either way.
    pub async fn invoke_read_only(&self, op: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        self.call(op, true, None).await
    }

    /// Runs one invocation in the caller's task (no hand-over to another task and back). A caller that stops waiting (drops the future)
    /// leaves its request outstanding; the next invocation abandons it.
    async fn call(
        &self,
        op: Vec<u8>,
        read_only: bool,
        deadline: Option<Duration>,
    ) -> Result<Vec<u8>, ClientError> {
        if op.len() > self.inner.request_bytes_max {
            return Err(ClientError::TooLarge(op.len()));
        }
        if deadline.is_some_and(|d| d.is_zero()) {
            return Err(ClientError::InvalidSetup(
                "the deadline must be positive".into(),
            ));
        }
        let mut driver = self.inner.driver.lock().await;
        let completion = driver.invoke(op, read_only, deadline).await?;
        Ok(completion.result)
    }

    /// The view the client believes current, learned from reply certificates; requests go
    /// first to its primary (`view mod n`).
    pub fn view(&self) -> View {
        self.inner.state.view.load(Relaxed)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ClientStats {
        let mut s = self
            .inner
            .state
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        s.replicas_connected = connected(&self.inner.connections.links);
        s.view = self.view();
        s
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.inner.id)
            .field("stats", &self.stats())
            .finish()
    }
}

fn connected(links: &[Link]) -> usize {
    links.iter().filter(|l| l.stats().connected).count()
}

/// The clock fed to the core: milliseconds since the UNIX epoch, read once at start and then
/// advanced by a monotonic clock. The core derives request timestamps from it (×1000), so they
/// keep increasing across restarts of the process, and wall-clock steps while running cannot
/// make them go backwards.
struct Clock {
    base_ms: u64,
    start: Instant,
}

impl Clock {
    fn start() -> Clock {
        let base_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Clock {
            base_ms,
            start: Instant::now(),
        }
    }

    fn env(&self) -> Env {
        Env {
            now_ms: self.base_ms + self.start.elapsed().as_millis() as u64,
            entropy: rand::random(),
        }
    }
}

/// The invocation in progress.
struct Pending {
    deadline: tokio::time::Instant,
    /// The time it was given.
    allowed: Duration,
    /// Since the first tick that found no replica connected, if none has been since.
    unreachable_since: Option<tokio::time::Instant>,
}

/// The owner of the core state machine, driven by the invoking caller's task.
struct Driver {
    core: redoubt_core::Client<Keys>,
    /// Frames from the replicas. Between invocations they wait here (late replies, a
    /// replica's NEW-KEY asking for this client's keys; a full queue drops the newest) and are
    /// taken at the start of the next invocation.
    inbound: Received,
    links: Vec<Link>,
    /// Reconnections of each link seen so far: a replica that restarted (a recovery) lost our
    /// session key, so a reconnection gets it a NEW-KEY at once.
    reconnects: Vec<u64>,
    state: Arc<State>,
    deadline: Duration,
    clock: Clock,
    /// Where this client publishes the timestamp it waits for, for the connections' router.
    wanted: Arc<AtomicU64>,
    /// The core's count of rejected frames last reported.
    rejected_seen: u64,
    rewrite: Option<Rewrite>,
    /// Whether a fast read already waited for the connections to settle.
    links_settled: bool,
}

impl Driver {
    /// Sends `op` and waits for its reply certificate, retransmitting at the core's ticks.
    async fn invoke(
        &mut self,
        op: Vec<u8>,
        read_only: bool,
        deadline: Option<Duration>,
    ) -> Result<Completion, ClientError> {
        // What arrived since the last invocation: a NEW-KEY from a replica must be seen
        // before this request goes out (the core answers it with this client's keys).
        // At most what is queued now: frames arriving meanwhile wait for the loop below.
        for _ in 0..self.inbound.len() {
            let Ok(arrived) = self.inbound.try_recv() else {
                break;
            };
            let _ = self.receive(arrived);
        }
        if self.core.is_busy() {
            // The caller of the previous invocation stopped waiting before it completed.
            self.core.abandon();
            self.publish();
        }
        self.note_reconnects();
        self.settle_links().await;
        self.note_unreachable();
        let effects = match self.core.invoke(self.clock.env(), op, read_only) {
            Ok((timestamp, effects)) => {
                trace!(client = self.core.id(), timestamp, read_only, "invoke");
                effects
            }
            Err(InvokeError::TooLarge(n)) => return Err(ClientError::TooLarge(n)),
            Err(e @ InvokeError::NoBodySession) => {
                return Err(ClientError::NoBodySession(e.to_string()))
            }
            Err(InvokeError::Busy) => {
                // Cannot happen: the core was made idle above. Fail this call.
                self.core.abandon();
                self.publish();
                return Err(ClientError::Closed);
            }
        };
        self.publish();
        self.route(effects);
        let allowed = deadline.unwrap_or(self.deadline);
        let now = tokio::time::Instant::now();
        // Unreachability is judged at the ticks only: a caller (or a runtime) that did not run
        // for a while saw nothing, and the links may not have run either.
        let mut pending = Pending {
            // A deadline beyond any point in time (`Duration::MAX`: wait as long as it
            // takes) is one no invocation reaches.
            deadline: now.checked_add(allowed).unwrap_or(now + FAR_FUTURE),
            allowed,
            unreachable_since: None,
        };
        let mut tick = tokio::time::interval_at(now + TICK, TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                frame = self.inbound.recv() => {
                    let Some(arrived) = frame else {
                        // Every link is gone: nothing more can arrive.
                        self.core.abandon();
                        self.publish();
                        return Err(ClientError::Closed);
                    };
                    if let Some(c) = self.receive(arrived) {
                        return self.complete(c);
                    }
                }
                _ = tick.tick() => self.on_tick(&mut pending)?,
            }
        }
    }

    /// Feeds one frame to the core (its byte charge is given back once it is read); its
    /// completion, if it completed the outstanding request.
    fn receive(&mut self, arrived: Arrived) -> Option<Completion> {
        let Arrived {
            frame,
            header,
            charge,
        } = arrived;
        drop(charge);
        let completion = self.core.receive_routed(self.clock.env(), &frame, header);
        self.note_rejected();
        if completion.is_some() {
            self.publish();
        }
        completion
    }

    /// Abandons the request (with the error to return) when no replica has been reachable for
    /// too long or its deadline passed; otherwise retransmits as the core decides.
    fn on_tick(&mut self, p: &mut Pending) -> Result<(), ClientError> {
        let now = tokio::time::Instant::now();
        if connected(&self.links) > 0 {
            p.unreachable_since = None;
        } else {
            let since = *p.unreachable_since.get_or_insert(now);
            if now.duration_since(since) >= UNREACHABLE_AFTER && now < p.deadline {
                self.core.abandon();
                self.publish();
                self.state.update(|s| s.unreachable += 1);
                debug!(
                    client = self.core.id(),
                    "no replica reachable: request abandoned"
                );
                return Err(ClientError::NoReplicaReachable {
                    waited: now.duration_since(since),
                    replicas: self.links.len(),
                });
            }
        }
        if now >= p.deadline {
            self.core.abandon();
            self.publish();
            let connected = connected(&self.links);
            self.state.update(|s| s.unreachable += 1);
            debug!(
                client = self.core.id(),
                connected, "request abandoned at the deadline"
            );
            return Err(ClientError::Unreachable {
                deadline: p.allowed,
                connected,
                replicas: self.links.len(),
            });
        }
        self.note_reconnects();
        let effects = self.core.tick(self.clock.env());
        // Before the sends: a read-only operation reissued on the ordered path has a new
        // timestamp, and its replies may come back at once.
        self.publish();
        self.route(effects);
        Ok(())
    }

    /// Waits, once, up to [`FIRST_CONNECT_WAIT`] until every connection is established or
    /// has failed at least once (a new process's first request: connecting to a replica that
    /// is down is refused within a round trip), so that the first read leaves out a replica
    /// that is down, and the first request does not leave its result to one.
    async fn settle_links(&mut self) {
        if self.links_settled {
            return;
        }
        self.links_settled = true;
        let start = tokio::time::Instant::now();
        while start.elapsed() < FIRST_CONNECT_WAIT
            && !self.links.iter().all(|l| {
                let s = l.stats();
                s.connected || s.connect_failures > 0
            })
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Tells the core which replicas cannot be reached now: no connection, and connecting
    /// failed (fast reads leave them out).
    fn note_unreachable(&mut self) {
        let down = self.links.iter().enumerate().filter_map(|(r, l)| {
            let s = l.stats();
            (!s.connected && s.connect_failures > 0).then_some(r as u32)
        });
        self.core.set_unreachable(down);
    }

    fn note_reconnects(&mut self) {
        for (r, (link, seen)) in self.links.iter().zip(&mut self.reconnects).enumerate() {
            let now = link.reconnects();
            if now > *seen {
                *seen = now;
                self.core.refresh_keys_soon(r as u32);
            }
        }
    }

    fn complete(&mut self, c: Completion) -> Result<Completion, ClientError> {
        trace!(
            client = self.core.id(),
            timestamp = c.timestamp,
            view = c.view,
            "completed"
        );
        self.state.view.fetch_max(self.core.view(), Relaxed);
        let unwanted = self.core.unwanted;
        let (widened, ordered) = (self.core.read_widenings, self.core.fallbacks);
        let asked_again = self.core.full_result_asks;
        self.state.update(|s| {
            s.completed += 1;
            s.replies_unwanted = unwanted;
            s.reads_widened = widened;
            s.reads_ordered = ordered;
            s.results_asked_again = asked_again;
            s.retransmissions += c.retransmissions as u64;
            s.last_latency = Some(Duration::from_millis(c.latency_ms));
        });
        match c.refused.clone() {
            Some(why) => Err(ClientError::Refused(why)),
            None => Ok(c),
        }
    }

    /// Publishes the timestamp of the outstanding request (0: none) for the shared
    /// connections' router, which drops other replies for this client on arrival.
    fn publish(&self) {
        // Release, paired with the router's Acquire: a reply to the request sent after this
        // store finds the timestamp published, whichever connection it comes back on.
        self.wanted
            .store(self.core.outstanding_timestamp().unwrap_or(0), Release);
    }

    fn note_rejected(&mut self) {
        let rejected = self.core.rejected;
        if rejected != self.rejected_seen {
            self.rejected_seen = rejected;
            self.state.update(|s| s.frames_rejected = rejected);
        }
    }

    /// Hands the core's frames to the links. A full queue drops the frame: the core
    /// retransmits.
    fn route(&self, effects: Vec<Effect>) {
        for effect in effects {
            let (targets, bytes): (Vec<usize>, _) = match effect {
                Effect::Send {
                    to: Principal::Replica(r),
                    bytes,
                } => (vec![r as usize], bytes),
                Effect::Broadcast { bytes } => ((0..self.links.len()).collect(), bytes),
                // Sends to other principals, events (and anything a newer core adds) do not
                // concern a client's host.
                _ => continue,
            };
            for r in targets {
                let Some(link) = self.links.get(r) else {
                    continue;
                };
                let bytes = match &self.rewrite {
                    Some(w) => Arc::new((w.0)(r as u32, &bytes)),
                    None => bytes.clone(),
                };
                match link.send(bytes) {
                    Ok(()) => {}
                    Err(LinkError::Full) => self.state.update(|s| s.frames_dropped += 1),
                    Err(e) => trace!(replica = r, error = %e, "frame not sent"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_bounded_in_bytes_and_frames_and_gives_bytes_back() {
        let (tx, mut received) = mpsc::channel(4);
        let budget = ByteBudget::new(100);
        let route = Route {
            tx,
            wanted: Arc::new(AtomicU64::new(0)),
            budget: budget.clone(),
        };
        assert!(route.offer(Arc::new(vec![0; 60]), None));
        // 60 + 50 > 100: refused, and the refusal leaves the count as it was.
        assert!(!route.offer(Arc::new(vec![0; 50]), None));
        assert_eq!(budget.queued(), 60);
        assert!(route.offer(Arc::new(vec![0; 40]), None));
        assert!(route.offer(Arc::default(), None));
        assert!(route.offer(Arc::default(), None));
        // Four frames: the channel's bound refuses a fifth, even an empty one, and gives its
        // bytes back.
        assert!(!route.offer(Arc::default(), None));
        assert_eq!(budget.queued(), 100);
        let taken = received.try_recv().unwrap();
        drop(taken);
        assert_eq!(budget.queued(), 40);
        // Room for 60 bytes again, and one frame.
        assert!(route.offer(Arc::new(vec![0; 60]), None));
        assert!(!route.offer(Arc::new(vec![0; 1]), None));
    }

    #[test]
    fn a_frame_for_every_client_is_queued_once_and_shared() {
        let routes: Arc<Mutex<HashMap<Id, Route>>> = Arc::default();
        let mut queues = Vec::new();
        for id in 1..=3 {
            let (tx, rx) = mpsc::channel(4);
            routes.lock().unwrap().insert(
                id,
                Route {
                    tx,
                    wanted: Arc::new(AtomicU64::new(0)),
                    budget: ByteBudget::new(1 << 20),
                },
            );
            queues.push(rx);
        }
        let router = Router {
            routes: Arc::downgrade(&routes),
            unwanted: Arc::default(),
            frame_bytes_max: 1 << 20,
        };
        // Not a reply (a faulty replica's garbage): every client gets it, to count it.
        assert!(router.deliver(vec![0xee; 100_000]));
        let frames: Vec<_> = queues
            .iter_mut()
            .map(|q| q.try_recv().unwrap().frame)
            .collect();
        assert!(frames.iter().all(|f| Arc::ptr_eq(f, &frames[0])));
        assert_eq!(frames[0].len(), 100_000);
    }
}
