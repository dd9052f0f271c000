//! Asking replicas how they are: `GET /status` from each replica's metrics endpoint, and the
//! view most of them agree on.

use crate::http;
use redoubt_config::{ClusterConfig, ReplicaEntry};
pub use redoubt_node::status::StatusReport;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// What one replica's `/status` said, or why it could not be asked.
pub type Probe = Result<StatusReport, String>;

/// `GET /status` from one replica's metrics endpoint.
pub async fn fetch(addr: SocketAddr, timeout: Duration) -> Probe {
    let body = http::get(addr, "/status", timeout).await?;
    serde_json::from_slice(&body).map_err(|e| format!("unreadable status ({e})"))
}

/// Every replica's status, concurrently; index = replica id.
pub async fn fetch_all(cfg: &ClusterConfig, timeout: Duration) -> Vec<Probe> {
    fetch_nodes(&cfg.replicas, timeout).await
}

/// Every node's status (replicas or execution nodes), concurrently; index = position.
pub async fn fetch_nodes(nodes: &[ReplicaEntry], timeout: Duration) -> Vec<Probe> {
    let tasks: Vec<_> = nodes
        .iter()
        .map(|r| tokio::spawn(fetch(r.metrics_addr, timeout)))
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(
            t.await
                .unwrap_or_else(|e| Err(format!("query failed: {e}"))),
        );
    }
    out
}

/// The view most replicas that are up and in normal operation agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreement {
    pub view: u64,
    pub primary: u32,
    /// Replicas up, in normal operation, in this view.
    pub replicas: usize,
}

/// The (view, primary) reported by the most replicas in normal operation; ties go to the
/// higher view. `None` if no replica is up and in normal operation.
pub fn agreement(probes: &[Probe]) -> Option<Agreement> {
    let mut votes: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    for s in probes.iter().flatten().filter(|s| s.normal) {
        *votes.entry((s.view, s.primary)).or_default() += 1;
    }
    votes
        .into_iter()
        .max_by_key(|((view, _), count)| (*count, *view))
        .map(|((view, primary), replicas)| Agreement {
            view,
            primary,
            replicas,
        })
}
