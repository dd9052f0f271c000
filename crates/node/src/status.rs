//! The JSON status a replica serves on `/status`.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub id: u32,
    pub view: u64,
    pub primary: u32,
    /// False while the replica is changing view.
    pub normal: bool,
    pub last_executed: u64,
    pub stable_checkpoint: u64,
    pub requests_executed: u64,
    /// Requests executed per second over the last few seconds.
    pub requests_per_s: f64,
    pub view_changes: u64,
    pub state_transfers: u64,
    /// Bytes of state-transfer answers received and served.
    #[serde(default)]
    pub transfer_bytes_in: u64,
    #[serde(default)]
    pub transfer_bytes_out: u64,
    /// Pages and meta-data partitions installed by state transfers.
    #[serde(default)]
    pub transfer_pages: u64,
    #[serde(default)]
    pub transfer_metas: u64,
    /// Pages found corrupt by state checks.
    #[serde(default)]
    pub corrupt_pages_found: u64,
    /// Checkpoint the page file holds durably.
    #[serde(default)]
    pub state_base: u64,
    /// Bytes of every frame received since the process started (peers and clients).
    #[serde(default)]
    pub bytes_received: u64,
    pub uptime_s: f64,
}
