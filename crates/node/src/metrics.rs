//! Prometheus metrics of a replica, and the small HTTP server (hyper, HTTP/1.1) that serves
//! them (`/metrics`) together with a JSON status (`/status`) for `redoubt status` and the
//! demo, and a liveness probe (`/healthz`). Besides redoubt's own metrics the registry holds
//! the process's (CPU, memory, file descriptors: `process_*`) and `redoubt_build_info`.
//!
//! Names follow `redoubt_<area>_<what>_<unit>`. The list is in `docs/operations.md`.

use crate::status::StatusReport;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use redoubt_transport::LinkError;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections the HTTP server serves at once; more wait to be accepted.
const HTTP_CONNECTIONS_MAX: usize = 32;
/// How long a connection may take to send its request headers.
const HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Metrics {
    pub registry: Registry,
    pub requests_executed: IntCounter,
    pub tentative_batches: IntCounter,
    pub tentative_undone: IntCounter,
    pub entries_retransmitted: IntCounter,
    pub bodies_asked: IntCounter,
    pub primary_stalls: IntCounter,
    pub slow_primaries: IntCounter,
    pub leaders_suspected: IntCounter,
    pub execution_stalls: IntCounter,
    pub relayed: IntCounter,
    pub beside_from_replaced: IntCounter,
    pub requests_doubted: IntCounter,
    pub clients_suspected: IntCounter,
    pub requests_signed: IntCounter,
    pub view_changes_forgotten: IntCounter,
    pub new_views_adopted: IntCounter,
    pub body_sessions_opened: IntCounter,
    pub bodies_refused: IntCounter,
    pub views_estimated: IntCounter,
    pub watermarks_distrusted: IntCounter,
    pub states_distrusted: IntCounter,
    pub state_unreadable: IntCounter,
    pub batches_executed: IntCounter,
    pub batch_size: Histogram,
    pub view: IntGauge,
    pub view_changes: IntCounter,
    pub last_executed: IntGauge,
    pub stable_checkpoint: IntGauge,
    pub checkpoint_lag: IntGauge,
    pub state_transfers: IntCounter,
    pub transfer_bytes_received: IntCounter,
    pub transfer_bytes_sent: IntCounter,
    pub transfer_pages: IntCounter,
    pub transfer_bad_answers: IntCounter,
    pub corrupt_pages: IntCounter,
    pub state_overlay_pages: IntGauge,
    pub page_cache_hits: IntCounter,
    pub page_cache_misses: IntCounter,
    pub state_checkpoints: IntGauge,
    pub state_base: IntGauge,
    pub bytes_received: IntCounter,
    pub rejected: IntCounterVec,
    pub queue_depth: IntGaugeVec,
    pub queue_bytes: IntGaugeVec,
    pub frames_dropped: IntCounterVec,
    /// Frames the protocol addressed to a principal it could not be handed to (no connection
    /// or link, closed, too large); see [`Metrics::sent`].
    pub sends_undelivered: IntCounterVec,
    /// View changes this replica started, by cause.
    pub view_change_causes: IntCounterVec,
    pub handle_seconds: Histogram,
    pub journal_sync_seconds: Histogram,
    pub state_commit_seconds: Histogram,
    pub journal_records: IntGauge,
    pub journal_bytes: IntGauge,
    pub peers_connected: IntGauge,
    pub client_connections: IntGauge,
    pub key_refresh_period_seconds: Gauge,
    pub key_refreshes: IntCounter,
    pub keys_accepted: IntCounter,
    pub client_keys_asked: IntCounter,
    pub frames_held_for_keys: IntCounter,
    pub watchdog_period_seconds: Gauge,
    pub recoveries: IntCounter,
    pub recovery_requests_executed: IntCounter,
    pub order_keys_installed: IntCounter,
    pub recovery_in_progress: IntGauge,
    pub recovery_last_seconds: GaugeVec,
    pub recovery_overdue: IntCounter,
    pub window_of_vulnerability_seconds: Gauge,
    /// Firewall filter nodes (zero elsewhere).
    pub fw_requests_forwarded: IntCounter,
    pub fw_replies_forwarded: IntCounter,
    pub fw_replies_held: IntCounter,
    pub fw_replies_combined: IntCounter,
    pub fw_stable_forwarded: IntCounter,
    pub fw_shares_rejected: IntCounter,
    pub fw_certificates_rejected: IntCounter,
    pub fw_pieces_rejected: IntCounter,
    pub fw_vouches_rejected: IntCounter,
    pub fw_replies_vouched: IntCounter,
    pub fw_replies_checked: IntCounter,
}

fn fgauge(r: &Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::new(name, help).expect("valid metric");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid");
    r.register(Box::new(h.clone())).expect("unique metric");
    h
}

impl Metrics {
    /// Counts what became of a frame for a principal of kind `to` (`"peer"` or `"client"`):
    /// `None` if there was no connection or link to hand it to. A full queue counts in
    /// `redoubt_frames_dropped_total`, anything else in `redoubt_sends_undelivered_total`.
    pub fn sent(&self, to: &str, result: Option<Result<(), LinkError>>) {
        let reason = match result {
            Some(Ok(())) => return,
            Some(Err(LinkError::Full)) => {
                self.frames_dropped.with_label_values(&[to]).inc();
                return;
            }
            Some(Err(LinkError::TooLarge { .. })) => "too_large",
            Some(Err(LinkError::Closed)) => "closed",
            Some(Err(LinkError::UnknownConn)) | None => "no_connection",
        };
        self.sends_undelivered
            .with_label_values(&[to, reason])
            .inc();
    }

    /// A replica's metrics, labelled `replica="<id>"`.
    pub fn new(replica: u32) -> Metrics {
        Self::labelled("replica", replica)
    }

    /// An execution node's metrics (the same names, where they apply), labelled
    /// `executor="<id>"`.
    pub fn for_executor(executor: u32) -> Metrics {
        Self::labelled("executor", executor)
    }

    /// A filter node's metrics, labelled `filter="<id>"`.
    pub fn for_filter(filter: u32) -> Metrics {
        Self::labelled("filter", filter)
    }

    fn labelled(label: &str, id: u32) -> Metrics {
        let registry =
            Registry::new_custom(None, Some([(label.to_string(), id.to_string())].into()))
                .expect("registry");
        let r = &registry;
        // The process's own figures (Linux: /proc/self), and what is running.
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("unique");
        let build = IntGaugeVec::new(
            Opts::new(
                "redoubt_build_info",
                "Always 1; the labels say which redoubt is running",
            ),
            &["version"],
        )
        .expect("valid");
        r.register(Box::new(build.clone())).expect("unique");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let secs = prometheus::exponential_buckets(0.000_01, 2.0, 20).expect("buckets");
        let rejected = IntCounterVec::new(
            Opts::new(
                "redoubt_messages_rejected_total",
                "Frames and messages rejected, by reason",
            ),
            &["reason", "kind"],
        )
        .expect("valid");
        r.register(Box::new(rejected.clone())).expect("unique");
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "redoubt_queue_depth_frames",
                "Frames waiting in a bounded queue",
            ),
            &["queue"],
        )
        .expect("valid");
        r.register(Box::new(queue_depth.clone())).expect("unique");
        let queue_bytes = IntGaugeVec::new(
            Opts::new(
                "redoubt_queue_depth_bytes",
                "Bytes of received frames waiting in an inbound queue",
            ),
            &["queue"],
        )
        .expect("valid");
        r.register(Box::new(queue_bytes.clone())).expect("unique");
        let frames_dropped = IntCounterVec::new(
            Opts::new(
                "redoubt_frames_dropped_total",
                "Frames dropped because a bounded queue was full",
            ),
            &["queue"],
        )
        .expect("valid");
        r.register(Box::new(frames_dropped.clone()))
            .expect("unique");
        let sends_undelivered = IntCounterVec::new(
            Opts::new(
                "redoubt_sends_undelivered_total",
                "Frames not handed to a connection: none to the principal, closed, or too large",
            ),
            &["to", "reason"],
        )
        .expect("valid");
        r.register(Box::new(sends_undelivered.clone()))
            .expect("unique");
        let view_change_causes = IntCounterVec::new(
            Opts::new(
                "redoubt_view_change_causes_total",
                "View changes this replica started, by cause",
            ),
            &["cause"],
        )
        .expect("valid");
        r.register(Box::new(view_change_causes.clone()))
            .expect("unique");
        Metrics {
            view_change_causes,
            fw_requests_forwarded: counter(
                r,
                "redoubt_firewall_requests_forwarded_total",
                "Filter: agreement certificates passed up (f+1 matching signed pieces)",
            ),
            fw_replies_forwarded: counter(
                r,
                "redoubt_firewall_replies_forwarded_total",
                "Filter: reply certificates passed down in answer to a request from below",
            ),
            fw_replies_held: counter(
                r,
                "redoubt_firewall_replies_held_total",
                "Filter: reply certificates held because no request for them came from below yet",
            ),
            fw_replies_combined: counter(
                r,
                "redoubt_firewall_replies_combined_total",
                "Top-row filter: reply certificates combined from g+1 signature shares",
            ),
            fw_stable_forwarded: counter(
                r,
                "redoubt_firewall_stable_forwarded_total",
                "Filter: execution checkpoint certificates passed down",
            ),
            fw_shares_rejected: counter(
                r,
                "redoubt_firewall_shares_rejected_total",
                "Top-row filter: signature shares that did not verify (a faulty execution node's)",
            ),
            fw_certificates_rejected: counter(
                r,
                "redoubt_firewall_certificates_rejected_total",
                "Filter: certificates from above whose threshold signature did not verify, or \
                 made by an execution node (leak attempts blocked)",
            ),
            fw_pieces_rejected: counter(
                r,
                "redoubt_firewall_pieces_rejected_total",
                "Filter: agreement pieces whose signature or body did not check",
            ),
            fw_vouches_rejected: counter(
                r,
                "redoubt_firewall_vouches_rejected_total",
                "Filter: vouches from the row above that did not verify under their sender's \
                 filter key",
            ),
            fw_replies_vouched: counter(
                r,
                "redoubt_firewall_replies_vouched_total",
                "Filter: reply certificates taken on the vouches of every filter of the row above",
            ),
            fw_replies_checked: counter(
                r,
                "redoubt_firewall_replies_checked_total",
                "Filter: reply certificates from above whose threshold signature was checked \
                 here (fewer filters vouched for them within a tick)",
            ),
            requests_executed: counter(
                r,
                "redoubt_requests_executed_total",
                "Client requests executed",
            ),
            batches_executed: counter(
                r,
                "redoubt_batches_executed_total",
                "Batches (sequence numbers) executed, null ones included",
            ),
            batch_size: histogram(
                r,
                "redoubt_batch_size_requests",
                "Requests per executed batch",
                vec![0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
            ),
            view: gauge(r, "redoubt_view", "Current view number"),
            view_changes: counter(
                r,
                "redoubt_view_changes_total",
                "View changes this replica started",
            ),
            last_executed: gauge(
                r,
                "redoubt_last_executed_seq",
                "Last executed sequence number",
            ),
            stable_checkpoint: gauge(
                r,
                "redoubt_stable_checkpoint_seq",
                "Sequence number of the last stable checkpoint",
            ),
            checkpoint_lag: gauge(
                r,
                "redoubt_checkpoint_lag_seqs",
                "Last executed minus last stable checkpoint",
            ),
            state_transfers: counter(
                r,
                "redoubt_state_transfers_total",
                "Checkpoints fetched from other replicas",
            ),
            transfer_bytes_received: counter(
                r,
                "redoubt_state_transfer_bytes_received_total",
                "Bytes of state-transfer answers (META-DATA and DATA) received",
            ),
            transfer_bytes_sent: counter(
                r,
                "redoubt_state_transfer_bytes_sent_total",
                "Bytes of state-transfer answers served to other replicas",
            ),
            transfer_pages: counter(
                r,
                "redoubt_state_transfer_pages_total",
                "Pages fetched and installed by state transfers",
            ),
            transfer_bad_answers: counter(
                r,
                "redoubt_state_transfer_bad_answers_total",
                "State-transfer answers that failed their digests (the sender is avoided)",
            ),
            corrupt_pages: counter(
                r,
                "redoubt_state_corrupt_pages_total",
                "Pages found not to match their digests by state checks",
            ),
            state_overlay_pages: gauge(
                r,
                "redoubt_state_overlay_pages",
                "Pages held in memory because they changed since the durable base",
            ),
            page_cache_hits: counter(
                r,
                "redoubt_state_page_cache_hits_total",
                "Reads of state pages served by the page cache",
            ),
            page_cache_misses: counter(
                r,
                "redoubt_state_page_cache_misses_total",
                "Reads of state pages that went to the page file",
            ),
            state_checkpoints: gauge(
                r,
                "redoubt_state_checkpoints",
                "Checkpoint copies of the partition tree held",
            ),
            state_base: gauge(
                r,
                "redoubt_state_base_seq",
                "Checkpoint the page file holds durably",
            ),
            bytes_received: counter(
                r,
                "redoubt_bytes_received_total",
                "Bytes of every frame received (peers and clients)",
            ),
            rejected,
            queue_depth,
            queue_bytes,
            frames_dropped,
            sends_undelivered,
            handle_seconds: histogram(
                r,
                "redoubt_handle_seconds",
                "Time the protocol core spent on one batch of inputs",
                secs.clone(),
            ),
            journal_sync_seconds: histogram(
                r,
                "redoubt_journal_sync_seconds",
                "Time to make journal records durable (fsync)",
                secs.clone(),
            ),
            state_commit_seconds: histogram(
                r,
                "redoubt_state_commit_seconds",
                "Time to write one move of the state's durable base to the page store (redo log, pages, sync), once per stable checkpoint",
                secs,
            ),
            journal_records: gauge(
                r,
                "redoubt_journal_records",
                "Records in the journal after compaction",
            ),
            journal_bytes: gauge(
                r,
                "redoubt_journal_bytes",
                "Bytes in the journal file, records compaction dropped but not yet rewritten away included",
            ),
            peers_connected: gauge(
                r,
                "redoubt_peers_connected",
                "Other replicas with an open outgoing connection",
            ),
            client_connections: gauge(
                r,
                "redoubt_client_connections",
                "Open inbound connections (clients and replicas)",
            ),
            key_refresh_period_seconds: fgauge(
                r,
                "redoubt_keys_refresh_period_seconds",
                "Session-key refresh period T_k",
            ),
            key_refreshes: counter(
                r,
                "redoubt_keys_refreshes_total",
                "NEW-KEY messages this replica sent",
            ),
            keys_accepted: counter(
                r,
                "redoubt_keys_accepted_total",
                "NEW-KEY messages accepted from replicas and clients",
            ),
            client_keys_asked: counter(
                r,
                "redoubt_keys_client_asked_total",
                "Clients sent this replica's NEW-KEY because it held no key of theirs (after a recovery or a key expiry)",
            ),
            frames_held_for_keys: counter(
                r,
                "redoubt_frames_held_for_keys_total",
                "Client requests held while the client's NEW-KEY was being admitted by the key holder, and read again once it was",
            ),
            watchdog_period_seconds: fgauge(
                r,
                "redoubt_recovery_watchdog_period_seconds",
                "Watchdog period T_w given by the monitor (0 when not run by a monitor)",
            ),
            tentative_batches: counter(
                r,
                "redoubt_tentative_batches_total",
                "Batches executed tentatively (prepared, before they committed)",
            ),
            tentative_undone: counter(
                r,
                "redoubt_tentative_undone_total",
                "Tentatively executed batches undone because they did not commit in their view",
            ),
            entries_retransmitted: counter(
                r,
                "redoubt_status_retransmitted_entries_total",
                "Log entries retransmitted to peers whose status messages lacked them",
            ),
            bodies_asked: counter(
                r,
                "redoubt_status_bodies_asked_total",
                "Batch bodies this replica's status messages asked for",
            ),
            beside_from_replaced: counter(
                r,
                "redoubt_beside_requests_from_replaced_total",
                "Requests beside arriving pre-prepares that this replica resolved from requests their clients had since replaced (a lagging backup; without them it would fetch the batch)",
            ),
            primary_stalls: counter(
                r,
                "redoubt_primary_stall_view_changes_total",
                "View changes this replica started as primary because its own proposals did not execute within the view-change timeout",
            ),
            slow_primaries: counter(
                r,
                "redoubt_slow_primary_view_changes_total",
                "View changes this replica started because the primary's pace fell below half its recent best (primary_pace_window_ms)",
            ),
            leaders_suspected: counter(
                r,
                "redoubt_prime_leader_suspected_total",
                "Prime: view changes this replica started because Suspect-Leader found the leader slower than the bound",
            ),
            execution_stalls: counter(
                r,
                "redoubt_execution_stall_view_changes_total",
                "Separated deployment: view changes this replica started because the execution nodes acknowledged nothing within the view-change timeout while clients asked again for requests it had ordered",
            ),
            relayed: counter(
                r,
                "redoubt_relayed_frames_total",
                "Separated deployment: execution nodes' frames (replies, NEW-KEYs) this replica passed on to clients",
            ),
            requests_doubted: counter(
                r,
                "redoubt_requests_doubted_total",
                "Requests in accepted pre-prepares whose client authenticator this replica could not verify (named in its PREPARE's doubts)",
            ),
            clients_suspected: counter(
                r,
                "redoubt_clients_suspected_total",
                "Times a client came under suspicion (a request of it doubted in a batch that did not commit before a view change): its requests are then ordered only when signed",
            ),
            requests_signed: counter(
                r,
                "redoubt_requests_signed_total",
                "Requests that arrived with a valid signature of their client (clients sign retransmissions)",
            ),
            view_changes_forgotten: counter(
                r,
                "redoubt_view_changes_forgotten_total",
                "View-change protocol messages dropped because their sender or this replica re-keyed after they arrived",
            ),
            new_views_adopted: counter(
                r,
                "redoubt_new_views_adopted_total",
                "Views entered on a NEW-VIEW this replica could not check (a view change it names was sent under keys since retired) because f+1 other replicas reported being active in the view on that same NEW-VIEW",
            ),
            body_sessions_opened: counter(
                r,
                "redoubt_body_sessions_opened_total",
                "Clients' body sessions (confidential bodies) whose key this replica's key holder derived: about one per client per key refresh",
            ),
            bodies_refused: counter(
                r,
                "redoubt_bodies_refused_total",
                "Operations not run because they did not open under their body session (a faulty client's, or unsealed where bodies are sealed); answered with a refusal",
            ),
            views_estimated: counter(
                r,
                "redoubt_recovery_views_estimated_total",
                "Recoveries whose view estimate moved this replica back to the view the others reported (its journal named another)",
            ),
            watermarks_distrusted: counter(
                r,
                "redoubt_recovery_watermarks_distrusted_total",
                "Recoveries that found a journaled low watermark above the recovery estimate H_M and went back to the checkpoint the state holds",
            ),
            states_distrusted: counter(
                r,
                "redoubt_recovery_states_distrusted_total",
                "Recoveries that found the state's own checkpoint above the recovery estimate H_M and fetched the whole state again",
            ),
            state_unreadable: counter(
                r,
                "redoubt_state_unreadable_total",
                "Restarts whose stored checkpoint did not load, or lay behind the checkpoint the journal names; the replica fetched a vouched checkpoint before executing",
            ),
            recoveries: counter(
                r,
                "redoubt_recovery_recoveries_total",
                "Proactive recoveries this replica completed",
            ),
            recovery_requests_executed: counter(
                r,
                "redoubt_recovery_requests_executed_total",
                "Recovery requests (of any replica) executed here; each one refreshes keys",
            ),
            order_keys_installed: counter(
                r,
                "redoubt_order_keys_installed_total",
                "Prime: fresh order keys this replica's recoveries installed (its rows are signed with the latest)",
            ),
            recovery_in_progress: gauge(
                r,
                "redoubt_recovery_in_progress",
                "1 while this replica is recovering",
            ),
            recovery_last_seconds: {
                let g = GaugeVec::new(
                    Opts::new(
                        "redoubt_recovery_last_seconds",
                        "Duration of each step of the last recovery",
                    ),
                    &["step"],
                )
                .expect("valid");
                r.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            recovery_overdue: counter(
                r,
                "redoubt_recovery_overdue_total",
                "Recoveries that took longer than [recovery] alert_after_s (possible attack)",
            ),
            window_of_vulnerability_seconds: fgauge(
                r,
                "redoubt_recovery_window_of_vulnerability_seconds",
                "T_v = 2 T_k + T_r with T_r = T_w + the longest recovery seen",
            ),
            registry,
        }
    }

    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).expect("utf-8 metrics")
    }
}

/// Serves `GET /metrics`, `GET /status` and `GET /healthz` until the task is dropped, at most
/// [`HTTP_CONNECTIONS_MAX`] connections at once. Binding errors are returned so the caller can
/// report a port in use.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<StatusReport>>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    serve_with(addr, move |method, path| {
        route(method, path, &metrics, &status)
    })
    .await
}

/// What a monitor serves on its replica's metrics address while it holds the replica down
/// (its executable is not the pinned one, say): `/status` and `/healthz` answer 503 with
/// `reason`, `/metrics` has `redoubt_replica_held_down{replica,reason}` = 1. `cause` is a
/// short label for the metric.
pub async fn serve_held_down(
    addr: SocketAddr,
    replica: u32,
    cause: &'static str,
    reason: String,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let text = format!("held down by its monitor: {reason}\n");
    let metric = format!(
        "# HELP redoubt_replica_held_down The monitor holds this replica down (label: why).\n\
         # TYPE redoubt_replica_held_down gauge\n\
         redoubt_replica_held_down{{replica=\"{replica}\",reason=\"{cause}\"}} 1\n"
    );
    serve_with(addr, move |method, path| match (method, path) {
        (&Method::GET, "/metrics") => (StatusCode::OK, METRICS_TYPE, metric.clone()),
        (&Method::GET, "/status" | "/healthz") => {
            (StatusCode::SERVICE_UNAVAILABLE, "text/plain", text.clone())
        }
        _ => not_here(method),
    })
    .await
}

/// Serves `GET`s of the paths `answer` knows (`Some((content type, body))`: 200; `None`:
/// 404) until the task is dropped, like [`serve`] (the overlay daemon's endpoint).
pub async fn serve_get(
    addr: SocketAddr,
    answer: impl Fn(&str) -> Option<(&'static str, String)> + Send + Sync + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    serve_with(addr, move |method, path| match (method, answer(path)) {
        (&Method::GET, Some((kind, body))) => (StatusCode::OK, kind, body),
        _ => not_here(method),
    })
    .await
}

/// Serves HTTP/1.1 `GET`s with `answer(method, path)` until the task is dropped, at most
/// [`HTTP_CONNECTIONS_MAX`] connections at once.
async fn serve_with(
    addr: SocketAddr,
    answer: impl Fn(&Method, &str) -> (StatusCode, &'static str, String) + Send + Sync + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    let slots = Arc::new(Semaphore::new(HTTP_CONNECTIONS_MAX));
    let answer = Arc::new(answer);
    Ok(tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<_>| {
                    let reply = response(answer(req.method(), req.uri().path()));
                    async move { Ok::<_, std::convert::Infallible>(reply) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HTTP_HEADER_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(sock), service)
                    .await;
                drop(permit);
            });
        }
    }))
}

/// Prometheus' text format.
pub const METRICS_TYPE: &str = "text/plain; version=0.0.4";

/// A path we do not serve, or a method other than GET.
fn not_here(method: &Method) -> (StatusCode, &'static str, String) {
    if method == Method::GET {
        (
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics, /status or /healthz\n".into(),
        )
    } else {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        )
    }
}

fn response((code, ctype, body): (StatusCode, &'static str, String)) -> Response<Full<Bytes>> {
    let mut answer = Response::new(Full::new(Bytes::from(body)));
    *answer.status_mut() = code;
    answer.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    answer
}

/// The answer to one request.
fn route(
    method: &Method,
    path: &str,
    metrics: &Metrics,
    status: &Mutex<StatusReport>,
) -> (StatusCode, &'static str, String) {
    match (method, path) {
        (&Method::GET, "/metrics") => (StatusCode::OK, METRICS_TYPE, metrics.encode()),
        (&Method::GET, "/status") => {
            let s = status.lock().expect("status lock").clone();
            (
                StatusCode::OK,
                "application/json",
                serde_json::to_string(&s).expect("status encodes"),
            )
        }
        // The process is up and answering; `/status` says whether the replica is in normal
        // operation.
        (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".into()),
        _ => not_here(method),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn only_a_full_queue_counts_as_a_dropped_frame() {
        let m = Metrics::new(0);
        m.sent("client", Some(Ok(())));
        m.sent("client", Some(Err(LinkError::Full)));
        m.sent("client", None);
        m.sent("peer", Some(Err(LinkError::Closed)));
        m.sent("peer", Some(Err(LinkError::TooLarge { len: 9, max: 8 })));
        m.sent("peer", Some(Err(LinkError::UnknownConn)));
        let dropped = |q: &str| m.frames_dropped.with_label_values(&[q]).get();
        let undelivered =
            |to: &str, why: &str| m.sends_undelivered.with_label_values(&[to, why]).get();
        assert_eq!((dropped("client"), dropped("peer")), (1, 0));
        assert_eq!(undelivered("client", "no_connection"), 1);
        assert_eq!(undelivered("peer", "closed"), 1);
        assert_eq!(undelivered("peer", "too_large"), 1);
        assert_eq!(undelivered("peer", "no_connection"), 1);
    }

    async fn ask(addr: SocketAddr, request: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn serves_metrics_status_and_health_and_refuses_the_rest() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let metrics = Arc::new(Metrics::new(3));
        let status = Arc::new(Mutex::new(StatusReport::default()));
        let _server = serve(port, metrics, status).await.expect("bind");
        let health = ask(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        assert!(health.ends_with("ok\n"), "{health}");
        let text = ask(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(text.contains("redoubt_build_info{version=\""), "{text}");
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
        let status = ask(port, "GET /status HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(status.contains("application/json"), "{status}");
        let missing = ask(port, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = ask(
            port,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        // Garbage gets an error answer or a closed connection, and the server stays up.
        let _ = ask(port, "\x00\x01 not http\r\n\r\n").await;
        let again = ask(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    }

    #[tokio::test]
    async fn a_held_down_replica_says_why_and_is_not_healthy() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let _server = serve_held_down(port, 2, "executable_not_pinned", "not pinned".into())
            .await
            .expect("bind");
        for path in ["/status", "/healthz"] {
            let answer = ask(port, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")).await;
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(
                answer.ends_with("held down by its monitor: not pinned\n"),
                "{answer}"
            );
        }
        let text = ask(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(
            text.contains(
                "redoubt_replica_held_down{replica=\"2\",reason=\"executable_not_pinned\"} 1"
            ),
            "{text}"
        );
    }
}
