//! The replica process: hosts the pure core, and the service it replicates, on tokio.
//!
//! One task owns the [`Replica`]; everything else talks to it through bounded channels. Each
//! turn of the loop takes a batch of inputs (frames from the listener and from peer links, or a
//! tick), hands them to the core, appends the journal records the core asked for, syncs the
//! journal once for the whole batch, and only then performs the sends: a message never leaves
//! before the state it depends on is durable (group commit). The loop is the one every node
//! runs (`host.rs`); what a replica does in it is its [`Hosted`] implementation.

use crate::endpoints::{
    bind_endpoints, inbound_queue, link_config, replica_preopen, send_to_peer, Endpoints,
};
use crate::holder::{call_holder, load_keys, HolderDesk};
use crate::host::{now_ms, serve, tick_period, Depths, Hosted, Inbound, Signals, Stop};
use crate::metrics::Metrics;
use crate::snapshot::Snapshots;
use crate::status::{RecoveryBreakdown, StatusReport};
use crate::storage::{Journal, StorageError};
use crate::tamper::{Hooks, Outgoing};
use prometheus::IntGauge;
use redoubt_config::{ClusterConfig, ConfigError};
use redoubt_core::message::Reject;
use redoubt_core::open_state;
use redoubt_core::seal::verify_request;
use redoubt_core::state::FileStore;
use redoubt_core::{
    Bytes, ClientId, Effect, Env, Event, Input, Keys, Preopened, Principal, Replica, ReplicaId,
    Service,
};
use redoubt_transport::{ByteBudget, ConnId, Link, Listener};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// Frames buffered between the network tasks and the protocol task.
pub(crate) const INBOUND_FRAMES_MAX: usize = 16_384;
/// A journal sync slower than this is reported (at most every 10 s).
const SLOW_SYNC: Duration = Duration::from_millis(100);
/// Inputs handled per turn before syncing and sending (bounds latency under load).
const BATCH_INPUTS_MAX: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot restart from the journal in {home}: {reason}; move the home directory aside to start empty (the replica then fetches state from its peers)")]
    Restore { home: String, reason: String },
    #[error("cannot listen for {what} on {addr}: {source}; is another process (or another node) using that port? Change `{field}` of {role} {id} in {config}")]
    Bind {
        /// "replica" or "executor" (the config entry to change).
        role: &'static str,
        what: &'static str,
        field: &'static str,
        id: ReplicaId,
        addr: SocketAddr,
        config: String,
        source: std::io::Error,
    },
    #[error("signal handling: {0}")]
    Signal(std::io::Error),
}

/// How `redoubt replica` was started: normally, or by the monitor for a proactive recovery.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Recover after restoring (the watchdog restarted this replica).
    pub recover: bool,
    /// When the watchdog fired (Unix ms) and how long the old process took to save its state
    /// and stop (ms); both from the monitor, for the recovery breakdown.
    pub watchdog_at_ms: Option<u64>,
    pub save_ms: u64,
    /// The watchdog period T_w the monitor uses (ms), exported as a metric.
    pub watchdog_period_ms: u64,
}

/// Frame rejections that mean the sender is broken or hostile; its connection is closed.
/// With session keys a MAC under a just-retired key is expected (frames in flight during a
/// key refresh), so bad MACs are only counted.
fn penalised(reason: Reject, session_keys: bool) -> bool {
    match reason {
        Reject::Malformed
        | Reject::Oversized
        | Reject::BadVersion
        | Reject::UnknownSender
        | Reject::WrongTag => true,
        Reject::BadMac => !session_keys,
        _ => false,
    }
}

struct Node<S: Service, O: Outgoing> {
    id: ReplicaId,
    /// Bytes of every frame received (peers and clients).
    bytes_received: u64,
    replica: Replica<S, Keys>,
    session_keys: bool,
    opts: RunOptions,
    /// Process start, restore duration and the time spent handling Input::Recover (new key).
    process_started_ms: u64,
    restore_ms: u64,
    new_key_ms: u64,
    alert_after_ms: u64,
    key_refresh_ms: u64,
    last_recovery: Option<RecoveryBreakdown>,
    journal: Journal,
    /// The page store, for the state commits the core hands over (it reads through a clone).
    state_store: FileStore,
    listener: Listener,
    links: Vec<Option<Link>>,
    /// Separated deployment: links to the execution nodes.
    exec_links: Vec<Link>,
    /// Firewall deployment: links to the bottom row of filters (ids `0..h+1`).
    filter_links: Vec<Link>,
    known_clients: std::collections::HashSet<ClientId>,
    client_conns: HashMap<ClientId, ConnId>,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<StatusReport>>,
    started: Instant,
    rate: VecDeque<(Instant, u64)>,
    pending_sends: Vec<(Principal, Bytes)>,
    /// The core's effects of one input (kept for its capacity, see `Replica::handle_into`).
    effects: Vec<Effect>,
    rejected_since_warn: u64,
    last_warn: Instant,
    last_stats: redoubt_core::Stats,
    /// The page cache's (hits, misses) at the last metrics update.
    last_cache: (u64, u64),
    peer_up: Vec<bool>,
    last_slow_sync_warn: Option<Instant>,
    /// The inbound queues' depth gauges.
    listener_queue: QueueGauges,
    link_queue: QueueGauges,
    /// What stands between the core's frames and the links: nothing ([`crate::Direct`]) in a
    /// correct replica, the attack harness's interposer in a faulty one.
    outgoing: O,
    /// The key holder's thread, with session keys (the core's `Effect::Holder`).
    holder: Option<HolderDesk>,
    /// Snapshots written on SIGUSR2, and the stable checkpoints the status reports.
    snapshots: Snapshots,
}

impl<S: Service, O: Outgoing> Node<S, O> {
    fn env(&self) -> Env {
        Env {
            now_ms: now_ms(),
            entropy: rand::random(),
        }
    }

    /// Feeds one input to the core and files its effects.
    fn input(&mut self, input: Input<'_>, conn: Option<ConnId>) {
        let received = match &input {
            Input::Receive(bytes) => Some(bytes.len()),
            Input::Preopened(p) => Some(p.bytes().len()),
            _ => None,
        };
        if let Some(len) = received {
            self.bytes_received += len as u64;
            self.metrics.bytes_received.inc_by(len as u64);
        }
        let env = self.env();
        let mut effects = std::mem::take(&mut self.effects);
        self.replica.handle_into(env, input, &mut effects);
        for e in effects.drain(..) {
            match e {
                Effect::Persist(r) => {
                    if let Err(err) = self.journal.append(r) {
                        // Without durability the replica could contradict itself after a
                        // crash: stop rather than continue unsafely.
                        error!(replica = self.id, error = %err, "journal write failed; stopping");
                        std::process::exit(70);
                    }
                }
                Effect::CommitState(c) => {
                    let t = Instant::now();
                    if let Err(err) = c.apply(&mut self.state_store) {
                        // The base the journal is about to rely on did not reach the disk.
                        error!(replica = self.id, seq = c.seq, error = %err, "page store commit failed; stopping");
                        std::process::exit(70);
                    }
                    self.metrics
                        .state_commit_seconds
                        .observe(t.elapsed().as_secs_f64());
                }
                Effect::Send { to, bytes } => self.pending_sends.push((to, bytes)),
                Effect::Broadcast { bytes } => {
                    for r in 0..self.links.len() as ReplicaId {
                        if r != self.id {
                            self.pending_sends
                                .push((Principal::Replica(r), bytes.clone()));
                        }
                    }
                }
                Effect::Event(ev) => self.event(ev, conn),
                Effect::Holder(call) => {
                    if let Some(conn) = conn {
                        self.note_new_key_sender(conn, &call);
                    }
                    call_holder(&self.holder, Principal::Replica(self.id), call);
                }
            }
        }
        self.effects = effects;
    }

    /// A client's frame on `conn` made the core ask the key holder to admit the client's
    /// NEW-KEY: the core found it signed by the client's key holder and fresher than any
    /// installed, so replies go back on that connection from now on. A new client process
    /// sends its NEW-KEY right before its first request, whose authenticator cannot verify
    /// until the key is in (`note_sender` leaves the route as it was); without this, the
    /// answers to that request went to the connection of the client's previous process, and
    /// the client waited out its retransmission timeout (0.4 s per `redoubt kv put`).
    fn note_new_key_sender(&mut self, conn: ConnId, call: &redoubt_core::HolderCall) {
        if let redoubt_core::holder::HolderRequest::Admit(nk) = &call.request {
            if let Principal::Client(c) = nk.from {
                if self.known_clients.contains(&c) {
                    self.client_conns.insert(c, conn);
                }
            }
        }
    }

    fn event(&mut self, ev: Event, conn: Option<ConnId>) {
        match ev {
            Event::Rejected { from, kind, reason } => {
                self.metrics
                    .rejected
                    .with_label_values(&[reason.as_str(), kind])
                    .inc();
                self.rejected_since_warn += 1;
                debug!(replica = self.id, from = %from, kind, reason = %reason, "rejected");
                if kind == "frame" && penalised(reason, self.session_keys) {
                    if let Some(c) = conn {
                        debug!(replica = self.id, conn = %c, reason = %reason, "closing connection that sent a bad frame");
                        self.listener.close_conn(c);
                    }
                }
            }
            Event::ViewChangeStarted { view, cause } => {
                info!(
                    replica = self.id,
                    view,
                    cause = cause.label(),
                    "view change started: {cause}"
                );
                self.metrics
                    .view_change_causes
                    .with_label_values(&[cause.label()])
                    .inc();
            }
            Event::LeaveVoted { view, cause } => {
                info!(
                    replica = self.id,
                    view,
                    cause = cause.label(),
                    "voted to leave the view: {cause}"
                );
            }
            Event::NewViewInstalled { view } => {
                let primary = self.replica.primary();
                info!(replica = self.id, view, primary, "entered view");
            }
            Event::StateTransferred {
                seq,
                digest,
                pages,
                metas,
            } => {
                info!(replica = self.id, seq, digest = %digest, pages, metas, "state transferred from peers");
            }
            Event::StateCorrupt { pages } => {
                error!(
                    replica = self.id,
                    pages,
                    "state pages do not match their digests; fetching them from the other replicas"
                );
            }
            Event::StateDivergence { seq } => {
                error!(
                    replica = self.id,
                    seq,
                    "own state differs from the checkpoint f+1 replicas vouch for; fetching theirs"
                );
            }
            Event::Contradiction {
                seq,
                executed,
                chosen,
            } => {
                error!(replica = self.id, seq, executed = %executed, chosen = %chosen, "NEW-VIEW contradicts an executed batch: more than f replicas are faulty");
            }
            Event::StateUnreadable { seq, reason } => {
                error!(replica = self.id, seq, reason = %reason, "the stored checkpoint does not load; fetching a checkpoint f+1 replicas vouch for before executing");
            }
            Event::StateDistrusted { seq, h_m } => {
                error!(replica = self.id, seq, h_m, "recovery: the state claims a checkpoint above the recovery estimate; fetching the whole state again");
            }
            Event::ClientSuspected { client } => {
                warn!(replica = self.id, client, "client under suspicion: a request of it was doubted in a batch that did not commit before a view change; its requests are ordered only when signed for a while");
            }
            Event::Executed { requests, .. } => {
                self.metrics.batch_size.observe(requests.len() as f64);
            }
            Event::TentativeUndone { seq } => {
                info!(
                    replica = self.id,
                    seq, "undid a tentatively executed batch that did not commit in its view"
                );
            }
            Event::Stable { seq } => {
                if self.replica.stable_checkpoint() == seq {
                    self.snapshots
                        .stable(seq, self.replica.stable_checkpoint_digest());
                }
            }
            Event::CheckpointTaken { .. } => {}
            Event::KeysRefreshed => {
                debug!(replica = self.id, "sent NEW-KEY (fresh session keys)");
            }
            Event::KeyHolderFailed(e) => {
                warn!(replica = self.id, error = %e, "key holder failed; keeping the current keys and retrying");
            }
            Event::RecoveryStarted => {
                info!(replica = self.id, "recovery started: client keys discarded, NEW-KEY sent, estimating the recovery point");
            }
            Event::RecoveryEstimated { h_m } => {
                info!(
                    replica = self.id,
                    h_m, "recovery estimate H_M; sending the signed recovery request"
                );
            }
            Event::RecoveryExecuted { replica, seq } => {
                info!(
                    replica = self.id,
                    recovering = replica,
                    seq,
                    "recovery request executed; session keys refreshed"
                );
            }
            Event::RecoveryRefused => {
                warn!(replica = self.id, "recovery request refused: a recovery of this replica was accepted less than recovery_interval_min_ms ago; asking again after the interval");
            }
            Event::Recovered(r) => self.recovered(r),
        }
    }

    fn recovered(&mut self, r: redoubt_core::RecoveryReport) {
        let o = &self.opts;
        let started = o.watchdog_at_ms.unwrap_or(self.process_started_ms);
        let restart_ms = self
            .process_started_ms
            .saturating_sub(started.saturating_add(o.save_ms));
        let total_ms = now_ms().saturating_sub(started);
        let b = RecoveryBreakdown {
            save_ms: o.save_ms,
            restart_ms,
            restore_ms: self.restore_ms,
            new_key_ms: self.new_key_ms,
            estimation_ms: r.estimation_ms,
            request_ms: r.request_ms,
            check_fetch_ms: r.check_fetch_ms,
            total_ms,
            pages_fetched: r.pages_fetched,
            corrupt_pages: r.corrupt_pages,
            h: r.h,
            h_m: r.h_m,
        };
        let m = &self.metrics;
        for step in b.steps() {
            m.recovery_last_seconds
                .with_label_values(&[step.label])
                .set(step.ms as f64 / 1000.0);
        }
        m.recoveries.inc();
        info!(
            replica = self.id,
            total_ms = b.total_ms,
            save_ms = b.save_ms,
            restart_ms = b.restart_ms,
            restore_ms = b.restore_ms,
            new_key_ms = b.new_key_ms,
            estimation_ms = b.estimation_ms,
            request_ms = b.request_ms,
            check_fetch_ms = b.check_fetch_ms,
            pages_fetched = b.pages_fetched,
            h = b.h,
            "recovered: checkpoint H is stable"
        );
        if b.total_ms > self.alert_after_ms {
            m.recovery_overdue.inc();
            warn!(
                replica = self.id,
                total_ms = b.total_ms,
                bound_ms = self.alert_after_ms,
                "recovery took longer than [recovery] alert_after_s: possible denial-of-service attack on recovery; the window of vulnerability grows with it"
            );
        }
        self.last_recovery = Some(b);
    }

    /// T_v = 2 T_k + T_r, with T_r = T_w + this replica's last recovery (s); 0 when T_w is
    /// unknown (not run by a monitor).
    fn window_of_vulnerability_s(&self) -> f64 {
        if self.opts.watchdog_period_ms == 0 {
            return 0.0;
        }
        let r = self.last_recovery.as_ref().map_or(0, |b| b.total_ms);
        (2 * self.key_refresh_ms + self.opts.watchdog_period_ms + r) as f64 / 1000.0
    }

    fn note_sender(&mut self, conn: ConnId, frame: &Preopened) {
        // Replies go back on the connection a client last sent an authentic request on. The
        // route moves only for a request whose authenticator entry for this replica verifies,
        // so nobody can divert another client's replies. Bounded by the configured clients.
        // The usual case, a client on the connection it already uses, costs a lookup.
        let Some(Principal::Client(c)) = frame.sender() else {
            return;
        };
        if !self.known_clients.contains(&c) || self.client_conns.get(&c) == Some(&conn) {
            return;
        }
        let Some((sr, digest)) = frame.request() else {
            return;
        };
        let from = Principal::Client(c);
        if sr.request.client == c && verify_request(self.replica.auth(), from, &digest, &sr.auth) {
            self.client_conns.insert(c, conn);
        }
    }

    fn update_status(&mut self) {
        let r = &self.replica;
        let s = r.stats.clone();
        let m = &self.metrics;
        m.requests_executed
            .inc_by(s.requests_executed - self.last_stats.requests_executed);
        m.batches_executed
            .inc_by(s.batches_executed - self.last_stats.batches_executed);
        m.tentative_batches
            .inc_by(s.tentative_batches - self.last_stats.tentative_batches);
        m.tentative_undone
            .inc_by(s.tentative_undone - self.last_stats.tentative_undone);
        m.entries_retransmitted
            .inc_by(s.entries_retransmitted - self.last_stats.entries_retransmitted);
        m.bodies_asked
            .inc_by(s.bodies_asked - self.last_stats.bodies_asked);
        m.primary_stalls
            .inc_by(s.primary_stalls - self.last_stats.primary_stalls);
        m.slow_primaries
            .inc_by(s.slow_primaries - self.last_stats.slow_primaries);
        m.leaders_suspected
            .inc_by(s.leaders_suspected - self.last_stats.leaders_suspected);
        m.execution_stalls
            .inc_by(s.execution_stalls - self.last_stats.execution_stalls);
        m.relayed.inc_by(s.relayed - self.last_stats.relayed);
        m.requests_doubted
            .inc_by(s.requests_doubted - self.last_stats.requests_doubted);
        m.beside_from_replaced
            .inc_by(s.beside_from_replaced - self.last_stats.beside_from_replaced);
        m.clients_suspected
            .inc_by(s.clients_suspected - self.last_stats.clients_suspected);
        m.requests_signed
            .inc_by(s.requests_signed - self.last_stats.requests_signed);
        m.view_changes_forgotten
            .inc_by(s.view_changes_forgotten - self.last_stats.view_changes_forgotten);
        m.new_views_adopted
            .inc_by(s.new_views_adopted - self.last_stats.new_views_adopted);
        m.views_estimated
            .inc_by(s.views_estimated - self.last_stats.views_estimated);
        m.body_sessions_opened
            .inc_by(s.body_sessions_opened - self.last_stats.body_sessions_opened);
        m.bodies_refused
            .inc_by(s.bodies_refused - self.last_stats.bodies_refused);
        m.watermarks_distrusted
            .inc_by(s.watermarks_distrusted - self.last_stats.watermarks_distrusted);
        m.states_distrusted
            .inc_by(s.states_distrusted - self.last_stats.states_distrusted);
        m.state_unreadable
            .inc_by(s.state_unreadable - self.last_stats.state_unreadable);
        m.view_changes
            .inc_by(s.view_changes - self.last_stats.view_changes);
        m.state_transfers
            .inc_by(s.state_transfers - self.last_stats.state_transfers);
        m.transfer_bytes_received
            .inc_by(s.transfer_bytes_in - self.last_stats.transfer_bytes_in);
        m.transfer_bytes_sent
            .inc_by(s.transfer_bytes_out - self.last_stats.transfer_bytes_out);
        m.transfer_pages
            .inc_by(s.transfer_pages - self.last_stats.transfer_pages);
        m.transfer_bad_answers
            .inc_by(s.transfer_bad_answers - self.last_stats.transfer_bad_answers);
        m.corrupt_pages
            .inc_by(s.corrupt_pages_found - self.last_stats.corrupt_pages_found);
        m.key_refreshes
            .inc_by(s.key_refreshes - self.last_stats.key_refreshes);
        m.keys_accepted
            .inc_by(s.new_keys_accepted - self.last_stats.new_keys_accepted);
        m.client_keys_asked
            .inc_by(s.client_keys_asked - self.last_stats.client_keys_asked);
        m.frames_held_for_keys
            .inc_by(s.frames_held_for_keys - self.last_stats.frames_held_for_keys);
        m.recovery_requests_executed
            .inc_by(s.recovery_requests_executed - self.last_stats.recovery_requests_executed);
        m.order_keys_installed
            .inc_by(s.order_keys_installed - self.last_stats.order_keys_installed);
        m.recovery_in_progress.set(r.recovering() as i64);
        let tv = self.window_of_vulnerability_s();
        m.window_of_vulnerability_seconds.set(tv);
        let fp = r.state().footprint();
        m.state_overlay_pages.set(fp.overlay_pages as i64);
        let cache = r.state().page_cache_stats();
        m.page_cache_hits
            .inc_by(cache.0.saturating_sub(self.last_cache.0));
        m.page_cache_misses
            .inc_by(cache.1.saturating_sub(self.last_cache.1));
        self.last_cache = cache;
        m.state_checkpoints.set(fp.checkpoints as i64);
        m.state_base.set(r.state().base_seq() as i64);
        m.view.set(r.view() as i64);
        m.last_executed.set(r.last_executed() as i64);
        m.stable_checkpoint.set(r.stable_checkpoint() as i64);
        m.checkpoint_lag
            .set(r.last_executed().saturating_sub(r.stable_checkpoint()) as i64);
        m.journal_records.set(self.journal.len() as i64);
        m.journal_bytes.set(self.journal.file_bytes() as i64);
        let now = Instant::now();
        if self
            .rate
            .back()
            .is_none_or(|(t, _)| now.duration_since(*t) >= Duration::from_millis(500))
        {
            self.rate.push_back((now, s.requests_executed));
            while self.rate.len() > 10 {
                self.rate.pop_front();
            }
        }
        let rps = match (self.rate.front(), self.rate.back()) {
            (Some((t0, n0)), Some((t1, n1))) if t1 > t0 => {
                (n1 - n0) as f64 / t1.duration_since(*t0).as_secs_f64()
            }
            _ => 0.0,
        };
        *self.status.lock().expect("status lock") = StatusReport {
            id: self.id,
            view: r.view(),
            primary: r.primary(),
            normal: r.is_normal(),
            last_executed: r.last_executed(),
            stable_checkpoint: r.stable_checkpoint(),
            requests_executed: s.requests_executed,
            requests_per_s: rps,
            view_changes: s.view_changes,
            state_transfers: s.state_transfers,
            transfer_bytes_in: s.transfer_bytes_in,
            transfer_bytes_out: s.transfer_bytes_out,
            transfer_pages: s.transfer_pages,
            transfer_metas: s.transfer_metas,
            corrupt_pages_found: s.corrupt_pages_found,
            state_base: r.state().base_seq(),
            bytes_received: self.bytes_received,
            uptime_s: self.started.elapsed().as_secs_f64(),
            key_refreshes: s.key_refreshes,
            recovering: r.recovering(),
            recoveries: s.recoveries,
            last_recovery: self.last_recovery.clone(),
            window_of_vulnerability_s: tv,
            executable_blake3: crate::status::own_executable_blake3().to_string(),
            stable_checkpoints: self.snapshots.stable_seen(),
            last_snapshot: self.snapshots.last(),
        };
        self.last_stats = s;
        let lstats = self.listener.stats();
        m.client_connections.set(lstats.connections_open as i64);
        let mut connected = 0;
        for (r, link) in self.links.iter().enumerate() {
            let Some(link) = link else { continue };
            let up = link.stats().connected;
            connected += up as i64;
            if up != self.peer_up[r] {
                if up {
                    info!(replica = self.id, peer = r, "peer connected");
                } else {
                    warn!(
                        replica = self.id,
                        peer = r,
                        "peer unreachable; reconnecting in the background"
                    );
                }
                self.peer_up[r] = up;
            }
        }
        m.peers_connected.set(connected);
        if self.rejected_since_warn > 0 && self.last_warn.elapsed() >= Duration::from_secs(10) {
            warn!(
                replica = self.id,
                rejected = self.rejected_since_warn,
                "rejected messages in the last 10 s (see redoubt_messages_rejected_total by reason)"
            );
            self.rejected_since_warn = 0;
            self.last_warn = Instant::now();
        }
    }
}

/// An inbound queue's depth gauges (frames and bytes queued), looked up once, with the
/// queue's byte budget.
struct QueueGauges {
    frames: IntGauge,
    bytes: IntGauge,
    budget: Arc<ByteBudget>,
}

impl QueueGauges {
    fn new(metrics: &Metrics, queue: &str, budget: Arc<ByteBudget>) -> QueueGauges {
        QueueGauges {
            frames: metrics.queue_depth.with_label_values(&[queue]),
            bytes: metrics.queue_bytes.with_label_values(&[queue]),
            budget,
        }
    }

    fn set(&self, frames: usize) {
        self.frames.set(frames as i64);
        self.bytes.set(self.budget.queued() as i64);
    }
}

impl<S: Service, O: Outgoing> Hosted for Node<S, O> {
    type Frame = Preopened;
    /// Group commit: a turn woken by a frame handles what else already waits, the other
    /// replicas' frames and the clients' in turn, up to [`BATCH_INPUTS_MAX`] of them, so that
    /// one journal write and one send per peer serve them all.
    const BATCH_MORE: usize = BATCH_INPUTS_MAX;
    const REFRESH_AT_ONCE: bool = true;

    fn tick(&mut self) {
        self.input(Input::Tick, None);
    }

    fn listener_frame(&mut self, conn: ConnId, frame: Preopened) {
        self.note_sender(conn, &frame);
        self.input(Input::Preopened(frame), Some(conn));
    }

    fn link_frame(&mut self, frame: Preopened) {
        self.input(Input::Preopened(frame), None);
    }

    fn holder_answer(&mut self, answer: redoubt_core::HolderAnswer) {
        self.input(Input::Holder(answer), None);
    }

    fn refresh(&mut self) {
        self.update_status();
    }

    /// A primary asked to stop hands over first (a recovery must not cost a view-change
    /// timeout): it sends VIEW-CHANGE and keeps running until the next view is installed or
    /// a second has passed.
    fn stop(&mut self) -> Stop {
        if !self.replica.is_primary() {
            return Stop::Now;
        }
        info!(
            replica = self.id,
            view = self.replica.view(),
            "stopping: handing over as primary first"
        );
        self.input(Input::StepDown, None);
        Stop::HandOver(Duration::from_secs(1))
    }

    fn handed_over(&self) -> bool {
        self.replica.is_normal() && !self.replica.is_primary()
    }

    /// SIGUSR1: checks every page of the state against its digest now (a scrub on demand).
    fn check_state(&mut self) {
        info!(
            replica = self.id,
            "checking every page of the state (SIGUSR1)"
        );
        let started = Instant::now();
        let corrupt = self.replica.check_state();
        info!(
            replica = self.id,
            corrupt = corrupt.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "state check done"
        );
        self.input(Input::Tick, None);
    }

    /// SIGUSR2: writes a snapshot of the stable checkpoint into `home/snapshots`.
    fn snapshot(&mut self) {
        let seq = self.replica.stable_checkpoint();
        let digest = self.replica.stable_checkpoint_digest();
        self.snapshots.write_logged(
            &format!("replica {}", self.id),
            self.replica.state(),
            seq,
            digest,
            now_ms(),
        );
        self.update_status();
        self.input(Input::Tick, None);
    }

    fn idle(&mut self) {
        self.input(Input::Idle, None);
    }

    fn turn_done(&mut self, took: Duration, depths: Depths) {
        self.metrics.handle_seconds.observe(took.as_secs_f64());
        self.listener_queue.set(depths.listener);
        self.link_queue.set(depths.links);
    }

    /// Makes journal records durable, then sends.
    fn flush(&mut self) {
        let t = Instant::now();
        if let Err(err) = self.journal.sync() {
            error!(replica = self.id, error = %err, "journal sync failed; stopping");
            std::process::exit(70);
        }
        let took = t.elapsed();
        self.metrics
            .journal_sync_seconds
            .observe(took.as_secs_f64());
        if took >= SLOW_SYNC
            && self
                .last_slow_sync_warn
                .is_none_or(|w| w.elapsed() >= Duration::from_secs(10))
        {
            warn!(
                replica = self.id,
                ms = took.as_millis() as u64,
                "journal sync slow: every request waits for it; check the disk"
            );
            self.last_slow_sync_warn = Some(Instant::now());
        }
        let mut sends = std::mem::take(&mut self.pending_sends);
        let dropped = self.outgoing.route(Instant::now(), &mut sends);
        if dropped > 0 {
            self.metrics
                .frames_dropped
                .with_label_values(&["peer"])
                .inc_by(dropped);
        }
        for (to, bytes) in sends.drain(..) {
            let result = match to {
                Principal::Replica(r) => send_to_peer(&self.links, r, bytes),
                Principal::Client(c) => self
                    .client_conns
                    .get(&c)
                    .map(|conn| self.listener.send(*conn, bytes)),
                Principal::Executor(e) => self.exec_links.get(e as usize).map(|l| l.send(bytes)),
                Principal::Filter(x) => self.filter_links.get(x as usize).map(|l| l.send(bytes)),
            };
            let kind = match to {
                Principal::Client(_) => "client",
                _ => "peer",
            };
            self.metrics.sent(kind, result);
        }
        self.pending_sends = sends;
    }

    fn stopped(&mut self) {
        info!(replica = self.id, "shut down cleanly");
    }
}

/// Runs replica `id` of the cluster described by `config_path`, hosting `service`, until
/// SIGTERM or SIGINT. Every replica of a cluster must host the same service (the same code,
/// with the same parameters): the replicas' states and replies must agree byte for byte.
///
/// `service` is fresh: the runtime restores the replica from its journal and page store (or
/// starts it empty) and has the service [`load`](Service::load) that state.
pub async fn run_replica<S: Service + Send + 'static>(
    config_path: &Path,
    id: ReplicaId,
    opts: RunOptions,
    service: S,
) -> Result<(), NodeError> {
    run_replica_with(config_path, id, opts, service, Hooks::none()).await
}

/// [`run_replica`] with `hooks` altering what the process does: only the attack harness
/// (`redoubt-attack`) passes any.
pub async fn run_replica_with<S: Service + Send + 'static, O: Outgoing + 'static>(
    config_path: &Path,
    id: ReplicaId,
    opts: RunOptions,
    service: S,
    hooks: Hooks<O>,
) -> Result<(), NodeError> {
    let process_started_ms = now_ms();
    let cfg = ClusterConfig::load(config_path)?;
    let mut protocol = cfg.protocol.clone();
    if let Some(adjust) = hooks.adjust {
        adjust(&mut protocol);
    }
    let entry = cfg.replica(id)?.clone();
    let keys = load_keys(&cfg, Principal::Replica(id))?;
    let home = cfg.resolve(&entry.home);
    let (journal, records) = Journal::open(&home, cfg.storage.fsync)?;
    if journal.truncated_tail_bytes > 0 {
        warn!(
            replica = id,
            bytes = journal.truncated_tail_bytes,
            "dropped a torn record at the end of the journal (a write interrupted by a crash)"
        );
    }
    let restored = !records.is_empty();
    let restore_err = |reason: String| NodeError::Restore {
        home: home.display().to_string(),
        reason,
    };
    let geometry = cfg.state.geometry().map_err(restore_err)?;
    let state_dir = home.join("state");
    let started = Instant::now();
    let mut store = FileStore::open(&state_dir, geometry)
        .map_err(|e| restore_err(format!("page store in {}: {e}", state_dir.display())))?;
    store.set_sync(cfg.storage.fsync);
    let state_store = store.clone();
    let mut state = open_state(Box::new(store))
        .map_err(|e| restore_err(format!("page store in {}: {e}", state_dir.display())))?;
    state.set_page_cache_bytes((cfg.storage.page_cache_mib as usize).saturating_mul(1 << 20));
    let replica = Replica::restore(
        protocol,
        id,
        keys,
        service,
        state,
        &records,
        cfg.state.check_on_start,
    )
    .map_err(restore_err)?;
    let replica = match redoubt_config::load_firewall(&cfg)? {
        Some(keys) => replica.with_firewall(keys, redoubt_config::load_order_key(&cfg, id)?),
        None => replica,
    };
    let replica = match redoubt_config::load_prime_orders(&cfg)? {
        Some(orders) => replica.with_prime(orders, redoubt_config::load_order_key(&cfg, id)?),
        None => replica,
    };
    info!(
        replica = id,
        base = replica.state().base_seq(),
        state_mib = cfg.state.size_mib,
        checked = cfg.state.check_on_start,
        took_ms = started.elapsed().as_millis() as u64,
        "opened the service state"
    );
    let metrics = Arc::new(Metrics::new(id));
    let Endpoints {
        listener,
        inbound: in_rx,
        inbound_budget: listener_budget,
        status,
        http: _http,
    } = bind_endpoints(
        &cfg,
        (entry.addr, entry.metrics_addr),
        Principal::Replica(id),
        metrics.clone(),
        replica_preopen(&cfg),
    )
    .await?;
    let (link_tx, link_rx, link_budget) =
        inbound_queue(&cfg, &metrics, "link_inbound", replica_preopen(&cfg));
    let link_cfg = link_config(&cfg);
    let links = cfg
        .replicas
        .iter()
        .map(|r| {
            (r.id != id)
                .then(|| Link::spawn(cfg.peer_addr(id, r.id), link_cfg.clone(), link_tx.clone()))
        })
        .collect();
    // Behind a firewall the replicas reach the bottom row of filters, never an execution
    // node.
    let exec_links = cfg
        .executors
        .iter()
        .filter(|_| !cfg.protocol.firewall())
        .map(|x| Link::spawn(x.addr, link_cfg.clone(), link_tx.clone()))
        .collect();
    let filter_links = cfg
        .protocol
        .filter_row(0)
        .filter_map(|x| cfg.filters.get(x as usize))
        .map(|x| Link::spawn(x.addr, link_cfg.clone(), link_tx.clone()))
        .collect();
    // SIGUSR1: check every page of the state against its digest now (a scrub on demand);
    // SIGUSR2: write a snapshot of the stable checkpoint.
    let signals = Signals::new(true, true)?;
    info!(
        replica = id,
        addr = %entry.addr,
        metrics = %entry.metrics_addr,
        home = %home.display(),
        view = replica.view(),
        last_executed = replica.last_executed(),
        restored,
        "replica started"
    );
    let listener_queue = QueueGauges::new(&metrics, "listener_inbound", listener_budget);
    let link_queue = QueueGauges::new(&metrics, "link_inbound", link_budget);
    let (holder, holder_answers) = HolderDesk::for_keys(replica.auth(), Principal::Replica(id));
    let mut node = Node {
        id,
        replica,
        session_keys: cfg.keys.session(),
        process_started_ms,
        restore_ms: started.elapsed().as_millis() as u64,
        new_key_ms: 0,
        alert_after_ms: cfg.recovery.alert_after_s * 1000,
        key_refresh_ms: cfg.protocol.key_refresh_ms,
        last_recovery: None,
        opts: opts.clone(),
        journal,
        state_store,
        listener,
        links,
        exec_links,
        filter_links,
        known_clients: cfg.clients.iter().map(|c| c.id).collect(),
        client_conns: HashMap::new(),
        metrics,
        status,
        started: Instant::now(),
        rate: VecDeque::new(),
        pending_sends: Vec::new(),
        effects: Vec::new(),
        rejected_since_warn: 0,
        last_warn: Instant::now(),
        last_stats: Default::default(),
        last_cache: (0, 0),
        peer_up: vec![false; cfg.replicas.len()],
        last_slow_sync_warn: None,
        listener_queue,
        link_queue,
        bytes_received: 0,
        outgoing: hooks.outgoing,
        holder,
        snapshots: Snapshots::new(&home, &cfg.cluster.name, &cfg.state.service),
    };
    node.snapshots.stable(
        node.replica.stable_checkpoint(),
        node.replica.stable_checkpoint_digest(),
    );
    node.metrics
        .key_refresh_period_seconds
        .set(cfg.protocol.key_refresh_ms as f64 / 1000.0);
    node.metrics
        .watchdog_period_seconds
        .set(opts.watchdog_period_ms as f64 / 1000.0);
    if opts.recover {
        if !cfg.keys.session() {
            warn!(
                replica = id,
                "--recover needs session keys ([keys] mode = \"session\"); starting normally"
            );
        } else {
            let t = Instant::now();
            node.input(Input::Recover, None);
            node.new_key_ms = t.elapsed().as_millis() as u64;
            node.flush();
        }
    }
    let inbound = Inbound {
        listener: in_rx,
        links: link_rx,
        holder: holder_answers,
    };
    serve(node, signals, inbound, tick_period(&cfg)).await;
    Ok(())
}
