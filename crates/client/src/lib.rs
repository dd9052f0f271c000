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

mod connections;
pub mod files;
pub mod kv;
pub mod sql;

pub use connections::Connections;
use connections::{Arrived, Received};

use redoubt_config::{ClusterConfig, ConfigError};
use redoubt_core::{
    Auth, ClientId, ClientTiming, Completion, Config, Effect, Env, InvokeError, Keys, Principal,
    View,
};
use redoubt_transport::{Link, LinkError};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Relaxed, Release},
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
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
        let unwanted = self.core.stats.unwanted;
        let (widened, ordered) = (self.core.stats.read_widenings, self.core.stats.fallbacks);
        let asked_again = self.core.stats.full_result_asks;
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
        let rejected = self.core.stats.rejected;
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
