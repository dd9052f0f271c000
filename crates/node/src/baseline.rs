//! The unreplicated baseline of the benchmarks: one server, no agreement.
//!
//! It is the replica's stack minus the protocol: the same transport (listener, frames), the
//! same authentication (client authenticators checked, replies MAC'd), the same service on the
//! same paged state (in memory, no journal), the same per-client exactly-once table. Clients
//! talk to it with the ordinary client library configured with f = 0.

use crate::holder::load_keys;
use crate::runtime::NodeError;
use redoubt_config::ClusterConfig;
use redoubt_core::message::ClientMessage;
use redoubt_core::message::{decode_frame_ref, Message, Reply};
use redoubt_core::seal::{open, seal, verify_request};
use redoubt_core::state::MemStore;
use redoubt_core::{open_state, ExecContext, Principal, Service};
use redoubt_transport::{ConnId, Listener, ListenerConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Runs the baseline server of `service` on `addr` with the keys of replica 0 of the cluster
/// in `config_path`, until SIGTERM or SIGINT.
pub async fn run_baseline<S: Service>(
    config_path: &Path,
    addr: SocketAddr,
    mut service: S,
) -> Result<(), NodeError> {
    let cfg = ClusterConfig::load(config_path)?;
    let keys = load_keys(&cfg, Principal::Replica(0))?;
    let geometry = cfg.state.geometry().map_err(|reason| NodeError::Restore {
        home: "(baseline, in memory)".into(),
        reason,
    })?;
    let mut state =
        open_state(Box::new(MemStore::new(geometry))).map_err(|e| NodeError::Restore {
            home: "(baseline, in memory)".into(),
            reason: e.to_string(),
        })?;
    service.load(&state).map_err(|reason| NodeError::Restore {
        home: "(baseline, in memory)".into(),
        reason,
    })?;
    let (in_tx, mut in_rx) = mpsc::channel::<(ConnId, Vec<u8>)>(16_384);
    let max = cfg.protocol.message_bytes_max;
    let listener = Listener::bind(
        addr,
        ListenerConfig {
            frame_bytes_max: max,
            per_conn_queue_max: cfg.node.peer_queue_frames_max,
            per_conn_queue_bytes_max: cfg.node.client_queue_bytes(),
            connections_max: cfg.node.client_connections_max,
        },
        in_tx,
    )
    .await
    .map_err(|source| NodeError::Bind {
        role: "replica",
        what: "baseline traffic",
        field: "addr",
        id: 0,
        addr,
        config: cfg.path.display().to_string(),
        source,
    })?;
    info!(%addr, "baseline server listening (one server, no agreement)");
    let mut sigterm = signal(SignalKind::terminate()).map_err(NodeError::Signal)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(NodeError::Signal)?;
    // Per client: last timestamp and its result (exactly once, like the replicas).
    let mut last: HashMap<u64, (u64, Vec<u8>)> = HashMap::new();
    let mut last_time_ms = 0u64;
    let mut rejected = 0u64;
    loop {
        let (conn, bytes) = tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            Some(x) = in_rx.recv() => x,
        };
        let Ok(frame) = decode_frame_ref(&bytes, max) else {
            rejected += 1;
            continue;
        };
        let Principal::Client(c) = frame.from else {
            rejected += 1;
            continue;
        };
        let Ok(Message::Client(ClientMessage::Request(sr))) = open(&keys, &frame) else {
            rejected += 1;
            continue;
        };
        let req = &sr.request;
        if req.client != c || !verify_request(&keys, frame.from, &req.digest(), &sr.auth) {
            rejected += 1;
            continue;
        }
        let result = match last.get(&c) {
            Some((ts, _)) if *ts > req.timestamp => continue,
            Some((ts, r)) if *ts == req.timestamp => r.clone(),
            _ if req.read_only && cfg.protocol.read_only_fast_path => {
                match service.execute_read_only(&state, &req.op) {
                    Some(r) => r,
                    None => {
                        rejected += 1;
                        continue;
                    }
                }
            }
            _ => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                last_time_ms = now.max(last_time_ms + 1);
                let ctx = ExecContext {
                    seq: 0,
                    client: c,
                    time_ms: last_time_ms,
                    batch_seed: req.timestamp,
                    index: 0,
                };
                let r = service.execute(&mut state, &req.op, &ctx);
                last.insert(c, (req.timestamp, r.clone()));
                r
            }
        };
        let reply = Message::from(Reply {
            tentative: false,
            view: 0,
            timestamp: req.timestamp,
            client: c,
            replica: 0,
            digest_only: false,
            result,
        });
        let out = seal(&keys, &reply, Some(frame.from), 1);
        let _ = listener.send(conn, Arc::new(out));
    }
    if rejected > 0 {
        warn!(rejected, "baseline server rejected frames");
    }
    info!("baseline server stopped");
    Ok(())
}
