//! The execution-node process of a separated deployment (`redoubt executor`): hosts the pure
//! core [`Executor`] and the service on tokio.
//!
//! One task owns the core. Frames from the replicas and the other execution nodes arrive on
//! the listener; what the core sends leaves on links to every replica and every other
//! execution node (clients are reached through the replicas, see `Relay`). The service state
//! lives in the page store under `<home>/state`; its durable base moves at each stable
//! checkpoint, and a restarted node resumes from there, catching up from the replicas (which
//! keep what it has not acknowledged) and its peers.

use crate::endpoints::{bind_endpoints, link_config, send_to_peer, Endpoints};
use crate::holder::{call_holder, load_keys, HolderDesk};
use crate::host::{now_ms, serve, tick_period, Hosted, Inbound, Signals};
use crate::metrics::Metrics;
use crate::runtime::NodeError;
use crate::snapshot::Snapshots;
use crate::status::StatusReport;
use redoubt_config::ClusterConfig;
use redoubt_core::state::FileStore;
use redoubt_core::{
    checkpoint_digest_of, open_state, Effect, Env, Event, Executor, Input, Keys, Principal, Service,
};
use redoubt_transport::{ConnId, Link, Listener};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

struct ExecNode<S: Service> {
    id: u32,
    core: Executor<S, Keys>,
    store: FileStore,
    replicas: Vec<Link>,
    /// Firewall deployment: links to the top row of filters, by filter id.
    filters: Vec<(u32, Link)>,
    /// Links to the other execution nodes (`None` for this one).
    peers: Vec<Option<Link>>,
    listener: Listener,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<StatusReport>>,
    last: redoubt_core::ExecutorStats,
    started: Instant,
    /// Demonstration of a compromised node (`redoubt executor --compromised-leak`): its
    /// share key, and when it last tried to smuggle its state out.
    leak: Option<(redoubt_crypto::threshold::KeyShare, Instant)>,
    /// The key holder's thread, with session keys (the core's `Effect::Holder`).
    holder: Option<HolderDesk>,
    /// Snapshots written on SIGUSR2, and the stable checkpoints the status reports.
    snapshots: Snapshots,
    /// The home's lock, held while the node runs.
    _lock: std::fs::File,
}

impl<S: Service> ExecNode<S> {
    /// The digest of checkpoint `seq`, if the state holds it: the core's record of its own
    /// checkpoints, or else computed from the state (its auxiliary bytes hashed).
    fn checkpoint_digest(&self, seq: u64) -> Option<redoubt_crypto::Digest> {
        if let Some(d) = self.core.checkpoint_digest(seq) {
            return Some(d);
        }
        let (root, aux) = self.core.state().held(seq)?;
        Some(checkpoint_digest_of(seq, &root, &aux))
    }

    /// A compromised execution node's leak attempt (demonstrations and tests only): once a
    /// second it reads its state's pages in clear and sends them to the top row of filters,
    /// as a reply certificate of its own making and as a bundle under its own valid share.
    /// With g = 1 neither passes a correct filter: the certificate's signature does not
    /// verify, and one share is no certificate (`redoubt_firewall_*_rejected_total`).
    fn try_leak(&mut self) {
        use redoubt_core::message::*;
        let Some((share, last)) = &mut self.leak else {
            return;
        };
        if last.elapsed() < Duration::from_secs(1) || self.filters.is_empty() {
            return;
        }
        *last = Instant::now();
        use redoubt_core::state::PageStore as _;
        let geometry = self.store.geometry();
        let mut page = vec![0u8; geometry.page_size()];
        let mut stolen = Vec::new();
        for i in 0..geometry.pages() {
            if self.store.read_page(i, &mut page).is_ok() && page.iter().any(|b| *b != 0) {
                stolen.extend_from_slice(&page);
                if stolen.len() >= 16 << 10 {
                    break;
                }
            }
        }
        let bundle = ReplyBundle {
            seq: self.core.last_executed(),
            entries: vec![ReplyEntry {
                client: 1,
                timestamp: 0,
                result: stolen,
            }],
        };
        let signed = share.sign(&bundle.statement().0);
        let me = Principal::Executor(self.id);
        let forged = Message::from(VouchedCert {
            cert: ReplyCert {
                bundle: bundle.clone(),
                signature: signed,
            },
            vouch: redoubt_crypto::pk::Signature([0; 64]),
        });
        let shared = Message::from(ReplyShare {
            executor: self.id,
            bundle,
            share: signed,
        });
        for msg in [forged, shared] {
            let bytes = std::sync::Arc::new(encode_frame_parts(
                WIRE_VERSION,
                me,
                0,
                &encode_body(&msg),
                &Tag::None,
            ));
            for (_, l) in &self.filters {
                let _ = l.send(bytes.clone());
            }
        }
        warn!(
            executor = self.id,
            "compromised-leak: tried to smuggle the state out"
        );
    }

    fn input(&mut self, input: Input<'_>, conn: Option<ConnId>) {
        if let Input::Receive(bytes) = input {
            self.metrics.bytes_received.inc_by(bytes.len() as u64);
        }
        let env = Env {
            now_ms: now_ms(),
            entropy: rand::random(),
        };
        for e in self.core.handle(env, input) {
            match e {
                Effect::CommitState(c) => {
                    if let Err(err) = c.apply(&mut self.store) {
                        error!(executor = self.id, seq = c.seq, error = %err, "page store commit failed; stopping");
                        std::process::exit(70);
                    }
                }
                Effect::Send { to, bytes } => {
                    let result = match to {
                        Principal::Replica(r) => {
                            self.replicas.get(r as usize).map(|l| l.send(bytes))
                        }
                        Principal::Executor(p) => send_to_peer(&self.peers, p, bytes),
                        Principal::Filter(x) => self
                            .filters
                            .iter()
                            .find(|(id, _)| *id == x)
                            .map(|(_, l)| l.send(bytes)),
                        // Clients are reached through the replicas (the core relays).
                        Principal::Client(_) => None,
                    };
                    self.metrics.sent("peer", result);
                }
                Effect::Broadcast { .. } | Effect::Persist(_) => {}
                Effect::Event(ev) => self.event(ev, conn),
                Effect::Holder(call) => {
                    call_holder(&self.holder, Principal::Executor(self.id), call);
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
                debug!(executor = self.id, from = %from, kind, reason = %reason, "rejected");
                let hostile = matches!(
                    reason,
                    redoubt_core::Reject::Malformed
                        | redoubt_core::Reject::Oversized
                        | redoubt_core::Reject::BadVersion
                        | redoubt_core::Reject::UnknownSender
                        | redoubt_core::Reject::WrongTag
                );
                if kind == "frame" && hostile {
                    if let Some(c) = conn {
                        self.listener.close_conn(c);
                    }
                }
            }
            Event::StateDivergence { seq } => {
                error!(executor = self.id, seq, "own checkpoint differs from the one g+1 execution nodes vouch for; fetching theirs");
            }
            Event::StateTransferred { seq, .. } => {
                info!(
                    executor = self.id,
                    seq, "state transferred from the other execution nodes"
                );
            }
            Event::Stable { seq } => {
                debug!(executor = self.id, seq, "checkpoint stable");
                if let Some(digest) = self.checkpoint_digest(seq) {
                    self.snapshots.stable(seq, digest);
                }
            }
            Event::KeyHolderFailed(e) => {
                warn!(executor = self.id, error = %e, "key holder failed; retrying");
            }
            Event::Executed { requests, .. } => {
                self.metrics.batch_size.observe(requests.len() as f64);
            }
            _ => {}
        }
    }

    fn update_status(&mut self) {
        let s = self.core.stats.clone();
        let m = &self.metrics;
        m.requests_executed
            .inc_by(s.requests_executed - self.last.requests_executed);
        m.batches_executed
            .inc_by(s.batches_executed - self.last.batches_executed);
        m.body_sessions_opened
            .inc_by(s.body_sessions_opened - self.last.body_sessions_opened);
        m.bodies_refused
            .inc_by(s.bodies_refused - self.last.bodies_refused);
        m.key_refreshes
            .inc_by(s.key_refreshes - self.last.key_refreshes);
        m.last_executed.set(self.core.last_executed() as i64);
        m.stable_checkpoint
            .set(self.core.stable_checkpoint() as i64);
        m.state_base.set(self.core.state().base_seq() as i64);
        m.peers_connected.set(
            self.replicas
                .iter()
                .map(|l| l.stats().connected as i64)
                .chain(
                    self.peers
                        .iter()
                        .flatten()
                        .map(|l| l.stats().connected as i64),
                )
                .sum(),
        );
        *self.status.lock().expect("status lock") = StatusReport {
            id: self.id,
            normal: !self.core.fetching(),
            last_executed: self.core.last_executed(),
            stable_checkpoint: self.core.stable_checkpoint(),
            requests_executed: s.requests_executed,
            state_base: self.core.state().base_seq(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            key_refreshes: s.key_refreshes,
            executable_blake3: crate::status::own_executable_blake3().to_string(),
            stable_checkpoints: self.snapshots.stable_seen(),
            last_snapshot: self.snapshots.last(),
            ..StatusReport::default()
        };
        self.last = s;
    }
}

impl<S: Service> Hosted for ExecNode<S> {
    type Frame = Vec<u8>;

    fn tick(&mut self) {
        self.input(Input::Tick, None);
    }

    fn listener_frame(&mut self, conn: ConnId, frame: Vec<u8>) {
        self.input(Input::Receive(&frame), Some(conn));
    }

    fn link_frame(&mut self, frame: Vec<u8>) {
        self.input(Input::Receive(&frame), None);
    }

    fn holder_answer(&mut self, answer: redoubt_core::HolderAnswer) {
        self.input(Input::Holder(answer), None);
    }

    fn refresh(&mut self) {
        self.try_leak();
        self.update_status();
    }

    /// SIGUSR2: writes a snapshot of the stable checkpoint into `home/snapshots`.
    fn snapshot(&mut self) {
        let seq = self.core.stable_checkpoint();
        let Some(digest) = self.checkpoint_digest(seq) else {
            warn!(
                executor = self.id,
                seq, "snapshot not written: the stable checkpoint is not held"
            );
            return;
        };
        self.snapshots.write_logged(
            &format!("execution node {}", self.id),
            self.core.state(),
            seq,
            digest,
            now_ms(),
        );
        self.update_status();
    }

    fn stopped(&mut self) {
        info!(executor = self.id, "shut down cleanly");
    }
}

/// Runs execution node `id` of the cluster described by `config_path`, hosting `service`,
/// until SIGTERM or SIGINT. Every execution node must host the same service.
pub async fn run_executor<S: Service + Send + 'static>(
    config_path: &Path,
    id: u32,
    service: S,
    compromised_leak: bool,
) -> Result<(), NodeError> {
    let cfg = ClusterConfig::load(config_path)?;
    let entry = cfg.executor(id)?.clone();
    let keys = load_keys(&cfg, Principal::Executor(id))?;
    let home = cfg.resolve(&entry.home);
    let restore_err = |reason: String| NodeError::Restore {
        home: home.display().to_string(),
        reason,
    };
    let geometry = cfg.state.geometry().map_err(restore_err)?;
    let lock = crate::storage::lock_home(&home)?;
    let state_dir = home.join("state");
    std::fs::create_dir_all(&state_dir)
        .map_err(|e| restore_err(format!("cannot create {}: {e}", state_dir.display())))?;
    let mut store = FileStore::open(&state_dir, geometry)
        .map_err(|e| restore_err(format!("page store in {}: {e}", state_dir.display())))?;
    store.set_sync(cfg.storage.fsync);
    let mut state = open_state(Box::new(store.clone()))
        .map_err(|e| restore_err(format!("page store in {}: {e}", state_dir.display())))?;
    state.set_page_cache_bytes((cfg.storage.page_cache_mib as usize).saturating_mul(1 << 20));
    let core =
        Executor::new(cfg.protocol.clone(), id, keys, service, state).map_err(restore_err)?;
    let core = match redoubt_config::load_firewall(&cfg)? {
        Some(keys) => core
            .with_firewall(keys, redoubt_config::load_reply_share(&cfg, id)?)
            .map_err(restore_err)?,
        None => core,
    };
    let metrics = Arc::new(Metrics::for_executor(id));
    let Endpoints {
        listener,
        inbound: in_rx,
        status,
        http: _http,
        ..
    } = bind_endpoints(
        &cfg,
        (entry.addr, entry.metrics_addr),
        Principal::Executor(id),
        metrics.clone(),
        crate::endpoints::as_received(),
    )
    .await?;
    // Peers answer on their own links; what does come back on these is handled all the same.
    let (link_tx, link_rx, _) = crate::endpoints::inbound_queue(
        &cfg,
        &metrics,
        "link_inbound",
        crate::endpoints::as_received(),
    );
    let link_cfg = link_config(&cfg);
    // Behind a firewall: no link to any replica, links to the top row of filters.
    let replicas = cfg
        .replicas
        .iter()
        .filter(|_| !cfg.protocol.firewall())
        .map(|r| Link::spawn(r.addr, link_cfg.clone(), link_tx.clone()))
        .collect();
    let top = cfg.protocol.filter_rows.saturating_sub(1);
    let filters = cfg
        .protocol
        .filter_row(top)
        .filter_map(|x| cfg.filters.get(x as usize))
        .map(|x| (x.id, Link::spawn(x.addr, link_cfg.clone(), link_tx.clone())))
        .collect();
    let peers = cfg
        .executors
        .iter()
        .map(|x| (x.id != id).then(|| Link::spawn(x.addr, link_cfg.clone(), link_tx.clone())))
        .collect();
    // SIGUSR2: write a snapshot of the stable checkpoint.
    let signals = Signals::new(false, true)?;
    info!(
        executor = id,
        addr = %entry.addr,
        metrics = %entry.metrics_addr,
        home = %home.display(),
        last_executed = core.last_executed(),
        "execution node started"
    );
    let (holder, holder_answers) = HolderDesk::for_keys(core.auth(), Principal::Executor(id));
    let mut node = ExecNode {
        id,
        core,
        store,
        replicas,
        filters,
        peers,
        listener,
        metrics,
        status,
        last: Default::default(),
        started: Instant::now(),
        leak: None,
        holder,
        snapshots: Snapshots::new(&home, &cfg.cluster.name, &cfg.state.service),
        _lock: lock,
    };
    let stable = node.core.stable_checkpoint();
    if let Some(digest) = node.checkpoint_digest(stable) {
        node.snapshots.stable(stable, digest);
    }
    if compromised_leak && cfg.protocol.firewall() {
        warn!(
            executor = id,
            "running as a COMPROMISED execution node (--compromised-leak): it tries to leak its \
             state through the firewall (demonstrations and tests only)"
        );
        node.leak = Some((redoubt_config::load_reply_share(&cfg, id)?, Instant::now()));
    }
    let inbound = Inbound {
        listener: in_rx,
        links: link_rx,
        holder: holder_answers,
    };
    serve(node, signals, inbound, tick_period(&cfg)).await;
    Ok(())
}
