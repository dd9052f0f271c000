//! The filter-node process of a firewall deployment (`redoubt filter`): hosts the pure core
//! [`Filter`] on tokio. A filter holds no keys and no state; frames arrive on its listener
//! from the rows next to it, and what the core sends leaves on links to the row above (the
//! execution nodes from the top row) and the row below (the replicas from the bottom row).
//! Nothing else is linked: the deployment's security argument needs every path between the
//! execution nodes and the outside to cross a correct row of filters.

use crate::endpoints::{bind_endpoints, link_config, Endpoints};
use crate::host::{now_ms, serve, Hosted, Inbound, Signals, STATUS_REFRESH};
use crate::metrics::Metrics;
use crate::runtime::NodeError;
use crate::status::StatusReport;
use redoubt_config::ClusterConfig;
use redoubt_core::{Effect, Env, Event, Filter, FilterStats, Input, Principal};
use redoubt_transport::{ConnId, Link};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

struct FilterNode {
    id: u32,
    core: Filter,
    links: BTreeMap<Principal, Link>,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<StatusReport>>,
    last: FilterStats,
    started: Instant,
    last_warn: Instant,
    rejected_since_warn: u64,
}

impl FilterNode {
    fn receive(&mut self, bytes: &[u8]) {
        self.metrics.bytes_received.inc_by(bytes.len() as u64);
        self.input(Input::Receive(bytes));
    }

    fn input(&mut self, input: Input<'_>) {
        let env = Env {
            now_ms: now_ms(),
            entropy: 0,
        };
        for e in self.core.handle(env, input) {
            match e {
                Effect::Send { to, bytes } => {
                    let result = self.links.get(&to).map(|l| l.send(bytes));
                    self.metrics.sent("peer", result);
                }
                Effect::Event(Event::Rejected { from, kind, reason }) => {
                    self.metrics
                        .rejected
                        .with_label_values(&[reason.as_str(), kind])
                        .inc();
                    debug!(filter = self.id, ?from, kind, %reason, "rejected");
                    self.rejected_since_warn += 1;
                }
                _ => {}
            }
        }
    }

    fn update_status(&mut self) {
        let s = self.core.stats.clone();
        let m = &self.metrics;
        m.fw_requests_forwarded
            .inc_by(s.requests_forwarded - self.last.requests_forwarded);
        m.fw_replies_forwarded
            .inc_by(s.replies_forwarded - self.last.replies_forwarded);
        m.fw_replies_held
            .inc_by(s.replies_held - self.last.replies_held);
        m.fw_replies_combined
            .inc_by(s.replies_combined - self.last.replies_combined);
        m.fw_stable_forwarded
            .inc_by(s.stable_forwarded - self.last.stable_forwarded);
        m.fw_shares_rejected
            .inc_by(s.shares_rejected - self.last.shares_rejected);
        m.fw_certificates_rejected
            .inc_by(s.certificates_rejected - self.last.certificates_rejected);
        m.fw_pieces_rejected
            .inc_by(s.pieces_rejected - self.last.pieces_rejected);
        m.fw_vouches_rejected
            .inc_by(s.vouches_rejected - self.last.vouches_rejected);
        m.fw_replies_vouched
            .inc_by(s.replies_vouched - self.last.replies_vouched);
        m.fw_replies_checked
            .inc_by(s.replies_checked - self.last.replies_checked);
        m.peers_connected.set(
            self.links
                .values()
                .map(|l| l.stats().connected as i64)
                .sum(),
        );
        m.last_executed.set(self.core.max_certified() as i64);
        if s.certificates_rejected + s.shares_rejected
            > self.last.certificates_rejected + self.last.shares_rejected
        {
            warn!(
                filter = self.id,
                certificates = s.certificates_rejected - self.last.certificates_rejected,
                shares = s.shares_rejected - self.last.shares_rejected,
                "refused what the execution cluster did not vouch for (a faulty node above)"
            );
        }
        if s.vouches_rejected > self.last.vouches_rejected {
            warn!(
                filter = self.id,
                vouches = s.vouches_rejected - self.last.vouches_rejected,
                "refused vouches that did not verify under their sender's filter key (a faulty \
                 filter above, or a filter's key file that does not match the public key file)"
            );
        }
        if self.rejected_since_warn > 0 && self.last_warn.elapsed() >= Duration::from_secs(10) {
            warn!(
                filter = self.id,
                frames = self.rejected_since_warn,
                "frames rejected in the last 10 s (see redoubt_messages_rejected_total)"
            );
            self.rejected_since_warn = 0;
            self.last_warn = Instant::now();
        }
        *self.status.lock().expect("status lock") = StatusReport {
            id: self.id,
            normal: true,
            last_executed: self.core.max_certified(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            executable_blake3: crate::status::own_executable_blake3().to_string(),
            ..StatusReport::default()
        };
        self.last = s;
    }
}

/// A filter node's tick checks the certificates fewer filters above vouched for in time, and
/// wakes the loop for the status refresh; what comes back on its links is dropped (peers
/// answer on their own links).
impl Hosted for FilterNode {
    type Frame = Vec<u8>;

    fn tick(&mut self) {
        self.input(Input::Tick);
    }

    fn listener_frame(&mut self, _conn: ConnId, frame: Vec<u8>) {
        self.receive(&frame);
    }

    fn link_frame(&mut self, _frame: Vec<u8>) {}

    fn refresh(&mut self) {
        self.update_status();
    }

    fn stopped(&mut self) {
        info!(filter = self.id, "shut down cleanly");
    }
}

/// Runs filter node `id` of the firewall deployment described by `config_path` until
/// SIGTERM or SIGINT.
pub async fn run_filter(config_path: &Path, id: u32) -> Result<(), NodeError> {
    let cfg = ClusterConfig::load(config_path)?;
    let entry = cfg.filters.get(id as usize).cloned().ok_or_else(|| {
        NodeError::Config(redoubt_config::ConfigError::Invalid {
            path: cfg.path.clone(),
            field: "[[filter]]".into(),
            message: format!(
                "there is no filter node {id} (the file lists {})",
                cfg.filters.len()
            ),
        })
    })?;
    let keys = redoubt_config::load_firewall(&cfg)?.ok_or_else(|| {
        NodeError::Config(redoubt_config::ConfigError::Invalid {
            path: cfg.path.clone(),
            field: "[protocol] filter_rows".into(),
            message: "the cluster has no firewall (filter_rows = 0)".into(),
        })
    })?;
    let vouch_key = redoubt_config::load_filter_key(&cfg, id)?;
    let core = Filter::new(cfg.protocol.clone(), id, keys, vouch_key).map_err(|message| {
        NodeError::Config(redoubt_config::ConfigError::Invalid {
            path: cfg.path.clone(),
            field: "[protocol]".into(),
            message,
        })
    })?;
    let metrics = Arc::new(Metrics::for_filter(id));
    let Endpoints {
        listener: _listener,
        inbound: in_rx,
        status,
        http: _http,
        ..
    } = bind_endpoints(
        &cfg,
        (entry.addr, entry.metrics_addr),
        Principal::Filter(id),
        metrics.clone(),
        crate::endpoints::as_received(),
    )
    .await?;
    // Links to the rows next to this one only (what comes back on them is dropped: peers
    // answer on their own links).
    let (link_tx, link_rx, _) = crate::endpoints::inbound_queue(
        &cfg,
        &metrics,
        "link_inbound",
        crate::endpoints::as_received(),
    );
    let link_cfg = link_config(&cfg);
    let rows = cfg.protocol.filter_rows;
    let row = id / rows;
    let mut peers: Vec<(Principal, std::net::SocketAddr)> = Vec::new();
    if row == 0 {
        peers.extend(
            cfg.replicas
                .iter()
                .map(|r| (Principal::Replica(r.id), r.addr)),
        );
    } else {
        peers.extend(
            cfg.protocol
                .filter_row(row - 1)
                .filter_map(|x| cfg.filters.get(x as usize))
                .map(|x| (Principal::Filter(x.id), x.addr)),
        );
    }
    if row + 1 == rows {
        peers.extend(
            cfg.executors
                .iter()
                .map(|x| (Principal::Executor(x.id), x.addr)),
        );
    } else {
        peers.extend(
            cfg.protocol
                .filter_row(row + 1)
                .filter_map(|x| cfg.filters.get(x as usize))
                .map(|x| (Principal::Filter(x.id), x.addr)),
        );
    }
    let links = peers
        .into_iter()
        .map(|(p, addr)| (p, Link::spawn(addr, link_cfg.clone(), link_tx.clone())))
        .collect();
    let signals = Signals::new(false, false)?;
    info!(
        filter = id,
        row,
        addr = %entry.addr,
        metrics = %entry.metrics_addr,
        "filter node started"
    );
    let node = FilterNode {
        id,
        core,
        links,
        metrics,
        status,
        last: FilterStats::default(),
        started: Instant::now(),
        last_warn: Instant::now(),
        rejected_since_warn: 0,
    };
    let inbound = Inbound {
        listener: in_rx,
        links: link_rx,
        holder: None,
    };
    serve(node, signals, inbound, STATUS_REFRESH).await;
    Ok(())
}
