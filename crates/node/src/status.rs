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
    /// Session keys: NEW-KEYs sent by this replica.
    #[serde(default)]
    pub key_refreshes: u64,
    /// True while this replica is recovering.
    #[serde(default)]
    pub recovering: bool,
    /// Recoveries completed by this replica since it started (the monitor restarts it for each
    /// one, so this is 0 or 1; the monitor keeps the history).
    #[serde(default)]
    pub recoveries: u64,
    /// The breakdown of its last recovery.
    #[serde(default)]
    pub last_recovery: Option<RecoveryBreakdown>,
    /// Window of vulnerability T_v = 2 T_k + T_r (s), 0 when unknown.
    #[serde(default)]
    pub window_of_vulnerability_s: f64,
    /// BLAKE3 (hex) of the executable this process runs: what `[recovery]
    /// executable_blake3` pins; empty when it could not be read.
    #[serde(default)]
    pub executable_blake3: String,
    /// The latest stable checkpoints seen here, oldest first (at most
    /// [`crate::snapshot::STABLE_SEEN_MAX`]): what `redoubt snapshot` counts vouchers in.
    #[serde(default)]
    pub stable_checkpoints: Vec<CheckpointSeen>,
    /// The last snapshot this replica wrote (SIGUSR2), if any since it started.
    #[serde(default)]
    pub last_snapshot: Option<SnapshotSeen>,
}

/// A stable checkpoint and its digest (hex).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSeen {
    pub seq: u64,
    pub digest: String,
}

/// A snapshot a replica wrote: its checkpoint, the file, or why it failed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSeen {
    /// Unix time (ms) the snapshot was asked for.
    pub asked_at_ms: u64,
    pub seq: u64,
    pub digest: String,
    pub path: String,
    pub bytes: u64,
    pub took_ms: u64,
    /// Why no file was written (then `path` is empty).
    pub error: Option<String>,
}

/// BLAKE3 (hex) of the executable this process runs, hashed once (from `/proc/self/exe`,
/// which still names the running file after a new one was installed at its path); empty if
/// it cannot be read. Call it at start-up: the first call reads the whole file.
pub fn own_executable_blake3() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| {
        file_blake3(std::path::Path::new("/proc/self/exe"))
            .or_else(|_| file_blake3(&std::env::current_exe()?))
            .unwrap_or_default()
    })
}

/// BLAKE3 (hex) of the file at `path`.
pub fn file_blake3(path: &std::path::Path) -> std::io::Result<String> {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(path)?)?;
    Ok(h.finalize().to_hex().to_string())
}

/// What one recovery took (ms), step by step (BFT-PR Table 4).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecoveryBreakdown {
    pub save_ms: u64,
    pub restart_ms: u64,
    pub restore_ms: u64,
    pub new_key_ms: u64,
    pub estimation_ms: u64,
    pub request_ms: u64,
    pub check_fetch_ms: u64,
    pub total_ms: u64,
    pub pages_fetched: u64,
    pub corrupt_pages: u64,
    /// Recovery point H and the estimate H_M.
    pub h: u64,
    pub h_m: u64,
}

/// One step of a recovery: its metric label, its name in the paper's table 4, its duration.
pub struct RecoveryStep {
    pub label: &'static str,
    pub name: &'static str,
    pub ms: u64,
}

impl RecoveryBreakdown {
    /// The steps in the order of BFT-PR's table 4, the total last.
    pub fn steps(&self) -> [RecoveryStep; 8] {
        let step = |label, name, ms| RecoveryStep { label, name, ms };
        [
            step("save_state", "save state", self.save_ms),
            step("restart", "restart", self.restart_ms),
            step("restore_state", "restore state", self.restore_ms),
            step("new_key", "send new-key", self.new_key_ms),
            step("estimation", "estimation", self.estimation_ms),
            step("recovery_request", "recovery request", self.request_ms),
            step("check_and_fetch", "check and fetch", self.check_fetch_ms),
            step("total", "total", self.total_ms),
        ]
    }
}
