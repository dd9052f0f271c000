//! What a run reports: its figures ([`RunStats`]) and its verdict ([`Outcome`]).

/// Summary of a run.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub ops_completed: u64,
    /// When every fault but the faulty replicas and clients is over: the heal, and the end
    /// of every pause, reboot and crash (ms).
    pub settle_ms: u64,
    /// From when correct clients' operations count for the throughput check: the first
    /// completion from `settle_ms` on at which no correct replica suspects a correct client
    /// (a suspicion a lossy spell left lasts `suspect_client_ms`).
    pub measured_from_ms: Option<u64>,
    /// Correct clients' operations completed from `measured_from_ms` on, and the time of the
    /// last.
    pub ops_after_settle: u64,
    pub last_op_ms: u64,
    /// The sum of their latencies from `settle_ms` on (invocation, or the settle if later,
    /// to completion, ms).
    pub latency_after_settle_ms: u64,
    /// Views correct replicas started to change to once the faults other than faulty
    /// replicas and clients had been over for four view-change timeouts, and the highest of
    /// them.
    pub late_view_changes: u64,
    pub late_view: u64,
    pub messages: u64,
    pub sim_time_ms: u64,
    pub max_executed: u64,
    pub view_changes: u64,
    pub max_view: u64,
    pub state_transfers: u64,
    /// Tentatively executed batches undone (a view change dropped them, or a transfer).
    pub tentative_undone: u64,
    /// Requests replicas could not authenticate in pre-prepares they accepted (named in their
    /// PREPAREs' doubts), summed over the replicas' lives since their last reboot.
    pub requests_doubted: u64,
    pub rejected: u64,
    /// Pages fetched by state transfers.
    pub pages_fetched: u64,
    /// Corrupt pages found by state checks.
    pub corrupt_pages_found: u64,
    /// Proactive recovery: compromises, completed recoveries, forged frames delivered after
    /// their receiver re-keyed (all must be rejected) and before.
    pub compromises: u64,
    pub recoveries: u64,
    pub forged_after_rekey: u64,
    pub forged_before_rekey: u64,
    /// Longest recovery (ms, virtual time).
    pub recovery_max_ms: u64,
    /// Running correct replicas still holding known-corrupt pages at the end.
    pub unrepaired_at_end: u64,
    /// Planting: frames sealed by compromised replicas sent at once, kept back, and released
    /// after their sender recovered; coordinated planted-view-change attacks carried out.
    pub planted_sent: u64,
    /// Prime: PO-ARU rows planted with an order key taken from a compromised replica.
    pub rows_planted: u64,
    pub planted_held: u64,
    pub planted_released: u64,
    pub join_attacks: u64,
    /// Journals or page stores the adversary rewrote before a watchdog reboot.
    pub disk_tampered: u64,
    /// Of those, page stores whose base checkpoint was moved ahead or given unreadable
    /// auxiliary bytes (an open hole of the core, see `runner::open_hole`).
    pub store_base_tampered: u64,
    /// Old NEW-KEY frames replayed to replicas right after they rebooted.
    pub new_keys_replayed: u64,
    /// Calls replicas and execution nodes made to their key holders, and answers lost
    /// because the caller restarted or crashed before they came (`holders.rs`).
    pub holder_calls: u64,
    pub holder_answers_lost: u64,
    /// Power failures in the middle of a replica's step (part of its writes lost).
    pub power_cuts_mid_step: u64,
    /// Separated deployment: checkpoints correct execution nodes fetched from their peers.
    pub exec_state_transfers: u64,
    /// Firewall deployment: reply certificates correct filters passed down, and
    /// certificates and signature shares they refused (leak attempts blocked).
    pub firewall_replies: u64,
    pub firewall_blocked: u64,
}

/// The result of a run.
#[derive(Debug)]
pub struct Outcome {
    pub scenario: String,
    pub seed: u64,
    pub violations: Vec<String>,
    pub stats: RunStats,
    pub trace: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}
