//! Identifiers and the protocol configuration.

use serde::{Deserialize, Serialize};
use std::fmt;

/// View number. The primary of view `v` is replica `v mod n`.
pub type View = u64;
/// The highest view any message may name. Views grow by one per view change, so no correct
/// replica gets near it; a message above it is malformed (and arithmetic on views never
/// saturates).
pub const VIEW_LIMIT: View = 1 << 48;
/// Sequence number assigned by the primary.
pub type Seq = u64;
pub use redoubt_keys::{ClientId, ExecutorId, FilterId, Principal, ReplicaId};

/// The protocol that orders requests (`[protocol] ordering`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderProtocol {
    /// PBFT (Castro & Liskov): the primary batches requests into pre-prepares.
    #[default]
    Pbft,
    /// Prime (Amir et al.; ADR 0007): every replica introduces its clients' requests, the
    /// leader orders summary matrices, and Suspect-Leader replaces a leader slower than the
    /// bound computed from measured round trips.
    Prime,
}

impl fmt::Display for OrderProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OrderProtocol::Pbft => "pbft",
            OrderProtocol::Prime => "prime",
        })
    }
}

impl std::str::FromStr for OrderProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<OrderProtocol, String> {
        match s {
            "pbft" => Ok(OrderProtocol::Pbft),
            "prime" => Ok(OrderProtocol::Prime),
            _ => Err(format!("unknown ordering `{s}` (pbft or prime)")),
        }
    }
}

/// Deliberately broken protocol variants, compiled only with the `mutants` feature (the
/// simulator's checker self-test).
#[cfg(feature = "mutants")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mutant {
    #[default]
    None,
    /// Commit with 2f matching COMMITs instead of 2f+1.
    CommitQuorum,
    /// A backup accepts a pre-prepare without checking that the digest matches the batch.
    SkipDigestCheck,
    /// The new primary picks any prepared request for a sequence number, ignoring views.
    ViewChangeAnyPrepared,
    /// A fetching replica installs DATA pages without checking them against their digests
    /// (and skips the re-check of installed pages before adopting them).
    TrustReplier,
    /// Clients accept f+1 matching read-only answers instead of 2f+1.
    ReadOnlyWeakQuorum,
    /// Replicas keep accepting MACs under the keys their last NEW-KEY retired (no freshness):
    /// an attacker who stole a replica's keys can still forge after it recovered.
    AcceptRetiredKeys,
    /// Clients accept f+1 matching tentative replies (2f+1 are needed).
    TentativeWeakQuorum,
    /// A slot prepares on 2f matching PREPAREs whatever requests they doubt: a faulty primary
    /// can order a request no client sent.
    IgnoreDoubts,
    /// The decision procedure selects a prepared request without condition A2 (f+1 Q claims).
    NoA2,
    /// Rule B selects null with 2f messages without a P entry (2f+1 are needed).
    NullAt2f,
    /// The decision's checkpoint needs f reports instead of f+1.
    CheckpointAtF,
    /// No acks needed: the new primary puts any VIEW-CHANGE in S, backups take any relayed one.
    AcksAtZero,
    /// The join rule moves a replica to a later view on f VIEW-CHANGEs instead of f+1.
    JoinAtF,
    /// Key holders forget the NEW-KEY counters they admitted (no freshness across restarts).
    NoFreshness,
    /// Recovery's estimate takes the lowest reported checkpoint, without the 2f/f test.
    EstimateUntested,
    /// View-change messages are kept when their sender or the receiver re-keys.
    KeepViewChangesAcrossRekey,
    /// A NEW-VIEW the replica cannot check is entered at once, without f+1 reports of
    /// replicas active in its view.
    AdoptUncheckedNewView,
    /// With confidential bodies, operations and results travel in clear (clients send them
    /// unsealed, executors take and answer them so): the service works, the bodies leak.
    ClearBodies,
    /// With confidential bodies, state-transfer answers travel unsealed (and are taken so).
    ClearState,
    /// Separated deployment: an execution node runs a batch on one agreement node's piece
    /// (f+1 matching are needed).
    TrustOneOrder,
    /// Separated deployment: clients accept g matching execution nodes' replies (g+1 are
    /// needed).
    ExecReplyAtG,
    /// Firewall: filters pass reply certificates down without checking their signature or
    /// waiting for a request from below.
    FilterUnvouched,
    /// Firewall: filters and agreement nodes take a reply certificate one filter of the row
    /// above vouched for, unchecked (h+1 are needed).
    OneFilterVouches,
    /// Firewall: the execution cluster's threshold key is dealt so that g shares sign, and
    /// the top row of filters combines g (g+1 are needed).
    ThresholdAtG,
    /// Prime: Suspect-Leader never suspects the leader (the bound never fires).
    LeaderNeverSuspected,
    /// Prime: f+1 matching PO-ACKs make a PO certificate (2f+1 are needed).
    PoAcksAtF,
    /// Prime: what an ordered matrix makes eligible is cut at the highest entry of each
    /// column, without 2f+1 rows supporting it (the (2f+1)-th highest is the cut).
    CutWithoutQuorum,
    /// Prime: a recovering replica draws no fresh order key: rows an attacker signed with the
    /// key it took keep counting after the replica recovered.
    KeepOrderKeys,
    /// The exactly-once table keeps a replaced entry's old result digest, so the incremental
    /// checkpoint digest drifts from the digest of the checkpoint's bytes (which a replica
    /// restoring or fetching the checkpoint computes).
    StaleReplyDigest,
    /// Bodies are sealed with a stream AEAD whose IV is the nonce (direction, timestamp), as
    /// before the second review's G6: two results of one request go out under one keystream.
    StreamBodies,
    /// A request needs f+1 backup vouchers in a prepared certificate (2f are needed), as
    /// before the second review's G4.
    VouchersAtFPlusOne,
    /// A replica's NEW-KEY seen again is admitted again and counts as a re-key: the
    /// receiver forgets the sender's view-change messages at every replay (second review,
    /// G3).
    ForgetOnReplay,
    /// A recovery request within `recovery_interval_min_ms` of the last accepted one is
    /// refused whatever its key-holder epoch (before the second review's G8): one signed in
    /// advance by an attacker vetoes the real recovery.
    RecoveryIntervalOnly,
    /// Backups run the view-change timer for unsigned requests too, as before the second
    /// review's G5: a faulty client whose MAC fails at the primary alone costs a view change
    /// per request.
    TimerForUnsigned,
    /// Behind the firewall a client takes the view of the last certified reply it got as
    /// its view hint, whoever passed it on, as before the second review's G7: one faulty
    /// replica sends the client's requests to a replica that is not the primary.
    TrustViewHint,
    /// Prime: a recovering replica forgets its own PO-ACKs with the rest of pre-ordering, as
    /// before the second review's G1: it acknowledges a second version of a number it
    /// acknowledged before its recovery.
    ForgetOwnAcks,
    /// Prime: an originator takes its client's request on its MAC alone, without the
    /// signature the other replicas may need.
    OriginatorTrustsMacs,
    /// Prime: a backup reads what a proposal answered from its matrix as it stands, rows of
    /// retired incarnations included, as before the second review's G2: a leader's made-up
    /// old rows stop its summaries for good.
    TrustRetiredRows,
    /// Behind the firewall a client takes the first certified reply a replica passes on,
    /// without f+1 matching ones or a check of its certificate: a faulty replica's made-up
    /// result completes the request.
    TrustOneCertifiedCopy,
    /// Prime: a replica leaves its view on its own suspicion, as PBFT does, instead of voting
    /// and leaving with 2f+1: one whose timer fired alone is stranded in the later view.
    LeaveAlone,
}

#[cfg(feature = "mutants")]
impl Mutant {
    pub const ALL: [(&'static str, Mutant); 40] = [
        ("commit-quorum", Mutant::CommitQuorum),
        ("skip-digest-check", Mutant::SkipDigestCheck),
        ("view-change-any-prepared", Mutant::ViewChangeAnyPrepared),
        ("trust-replier", Mutant::TrustReplier),
        ("read-only-weak-quorum", Mutant::ReadOnlyWeakQuorum),
        ("accept-retired-keys", Mutant::AcceptRetiredKeys),
        ("tentative-weak-quorum", Mutant::TentativeWeakQuorum),
        ("ignore-doubts", Mutant::IgnoreDoubts),
        ("no-a2", Mutant::NoA2),
        ("null-at-2f", Mutant::NullAt2f),
        ("checkpoint-at-f", Mutant::CheckpointAtF),
        ("acks-at-zero", Mutant::AcksAtZero),
        ("join-at-f", Mutant::JoinAtF),
        ("no-freshness", Mutant::NoFreshness),
        ("estimate-untested", Mutant::EstimateUntested),
        (
            "keep-view-changes-across-rekey",
            Mutant::KeepViewChangesAcrossRekey,
        ),
        ("adopt-unchecked-new-view", Mutant::AdoptUncheckedNewView),
        ("clear-bodies", Mutant::ClearBodies),
        ("clear-state", Mutant::ClearState),
        ("trust-one-order", Mutant::TrustOneOrder),
        ("exec-reply-at-g", Mutant::ExecReplyAtG),
        ("filter-unvouched", Mutant::FilterUnvouched),
        ("one-filter-vouches", Mutant::OneFilterVouches),
        ("threshold-at-g", Mutant::ThresholdAtG),
        ("leader-never-suspected", Mutant::LeaderNeverSuspected),
        ("po-acks-at-f", Mutant::PoAcksAtF),
        ("cut-without-quorum", Mutant::CutWithoutQuorum),
        ("keep-order-keys", Mutant::KeepOrderKeys),
        ("stale-reply-digest", Mutant::StaleReplyDigest),
        ("stream-bodies", Mutant::StreamBodies),
        ("vouchers-at-f-plus-1", Mutant::VouchersAtFPlusOne),
        ("forget-on-replay", Mutant::ForgetOnReplay),
        ("recovery-interval-only", Mutant::RecoveryIntervalOnly),
        ("timer-for-unsigned", Mutant::TimerForUnsigned),
        ("trust-view-hint", Mutant::TrustViewHint),
        ("forget-own-acks", Mutant::ForgetOwnAcks),
        ("originator-trusts-macs", Mutant::OriginatorTrustsMacs),
        ("trust-retired-rows", Mutant::TrustRetiredRows),
        ("trust-one-certified-copy", Mutant::TrustOneCertifiedCopy),
        ("leave-alone", Mutant::LeaveAlone),
    ];
}

/// The shortest window of the primary's pace check (ms): shorter ones count too few
/// requests to compare.
pub const PACE_WINDOW_MIN_MS: u64 = 100;
/// How many windows of the primary's pace check make its reference.
pub const PACE_HISTORY: usize = 4;
/// How long (ms) a request must have waited unproposed, seen at the ticks, before the pace
/// check counts requests as waiting: a correct primary proposes a lone client's request
/// within a message delay, so a window that ends with one just arrived is not demand.
pub const PACE_WAIT_MS: u64 = 10;

/// Protocol parameters shared by every replica and client of a cluster. Every field has a
/// unit in its name or documentation; see `docs/configuration.md`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Maximum number of faulty replicas; the cluster has `n = 3f+1` replicas.
    pub f: u32,
    /// Checkpoint interval K (sequence numbers).
    pub checkpoint_interval: Seq,
    /// Log size L (sequence numbers): messages are accepted for `h < n <= h + L`.
    /// Must be a multiple of the checkpoint interval, at least twice it.
    pub log_size: Seq,
    /// Maximum number of requests the primary packs into one pre-prepare.
    pub batch_requests_max: usize,
    /// Maximum total operation bytes in one batch.
    pub batch_bytes_max: usize,
    /// Maximum number of batches the primary keeps in flight (proposed, not yet executed).
    /// Requests arriving while this many are in flight queue and go out together.
    pub inflight_batches_max: u64,
    /// In a separated deployment: the most batches the primary keeps ordered and not yet
    /// acknowledged by g+1 execution nodes (the execution pipeline). Requests arriving while
    /// this many wait queue and go out together, so batches grow with the load instead of the
    /// execution cluster's per-batch work (a threshold signature behind the firewall).
    pub exec_inflight_batches_max: u64,
    /// Base view-change timeout (ms); doubled on each view change that fails to make progress.
    pub view_change_timeout_ms: u64,
    /// Cap on the doubled view-change timeout (ms).
    pub view_change_timeout_max_ms: u64,
    /// Interval between status messages (ms), the receiver-driven retransmission heartbeat.
    pub status_interval_ms: u64,
    /// Maximum number of log entries retransmitted in answer to one status message.
    pub retransmit_entries_max: usize,
    /// How long a replica that knows of a newer checkpoint waits for the log to catch it up
    /// before fetching the checkpoint state (ms).
    pub state_transfer_delay_ms: u64,
    /// Retry interval for a state fetch; each retry asks another replica (ms).
    pub state_transfer_retry_ms: u64,
    /// Read-only operations (PBFT §5.1): clients multicast them, replicas answer from their
    /// executed state without ordering them (once everything they prepared has executed),
    /// and clients accept 2f+1 matching answers, falling back to the ordered path otherwise.
    /// Clients and replicas must agree on it.
    pub read_only_fast_path: bool,
    /// With the read-only fast path: a client sends each read to 2f+1 replicas (rotating
    /// which f it leaves out, and leaving out one that lately failed to answer), and to the
    /// others only if the answers are not all in and matching after two smoothed round trips.
    /// The certificate is the same 2f+1 matching answers; a client-side choice.
    #[serde(default = "defaults::read_only_to_quorum")]
    pub read_only_to_quorum: bool,
    /// Digest replies (PBFT §5.1): for results longer than 32 bytes only one replica, chosen
    /// per request, sends the result; the others send its digest. A client that gets matching
    /// digests but no result retransmits, and replicas answer retransmissions in full. On by
    /// default: with a batch's replies sharing connections it lifted 0/4 throughput by about
    /// 60% (docs/benchmarks.md, "Settings behind the defaults").
    pub digest_replies: bool,
    /// Tentative execution (PBFT §5.1): a replica executes a batch as soon as it is prepared
    /// and every batch before it committed, and replies at once marking the reply tentative;
    /// a client accepts 2f+1 matching replies (tentative or not) or f+1 committed ones. A
    /// tentative batch that a view change does not carry over is undone. Saves one message
    /// delay. Only batches of at most `tentative_batch_max` requests execute tentatively.
    pub tentative_execution: bool,
    /// With tentative execution, the largest batch (requests) that executes tentatively;
    /// larger batches execute once committed, and without `primary_replies` their primary
    /// keeps quiet. A batch's size is the same at every replica, so they all decide alike.
    /// Small batches mean a lightly loaded service, where the saved message delay is what a
    /// client waits for; large ones a loaded one, where the busiest replica's CPU per request
    /// sets the throughput and a quiet primary saves it a reply per request. Default 1: a
    /// lone request executes tentatively, batches of two or more commit first (capped
    /// micro-benchmark, docs/benchmarks.md).
    pub tentative_batch_max: usize,
    /// Whether the primary sends the first reply to each request of a batch it ordered that
    /// executes once committed (not tentatively), as every other replica does. A client then
    /// needs only f+1 matching committed replies, which the 3f backups (at least 2f of them
    /// correct) supply, so a primary that keeps quiet costs no liveness and saves the busiest
    /// replica the sealing and sending of every reply (it still answers retransmissions, and
    /// read-only requests). Around a view change replicas may disagree on who is primary, so
    /// the old and the new one may both keep quiet about a request: its client then completes
    /// on a retransmission. The primary always replies to batches that execute tentatively: a
    /// client needs 2f+1 matching replies there, and the primary's silence would let one
    /// faulty backup stall every request. With it off, the replica that sends a long result
    /// in full (digest replies) is always a backup.
    pub primary_replies: bool,
    /// Whether a replica holds back its COMMIT for a batch that executes tentatively until
    /// its next broadcast (the PREPARE or PRE-PREPARE of the following batch, which then
    /// carries it in the same write) or its next tick, whichever comes first. The commit of
    /// such a batch is off the client's path (the tentative replies already went out), so
    /// holding it costs no latency, and under a closed loop of light load the 3f+1 x 3f
    /// COMMITs of each operation ride with the next batch's messages instead of costing
    /// writes and wake-ups of their own. Batches that execute once committed never hold their COMMIT.
    #[serde(default = "defaults::defer_tentative_commits")]
    pub defer_tentative_commits: bool,
    /// Requests whose operation has at least this many bytes travel beside the pre-prepare
    /// (PBFT §4.2): the client multicasts them to every replica and the pre-prepare names
    /// them by digest instead of carrying them, so the primary does not send them again.
    /// 0: every request travels inside the pre-prepare. Clients and replicas must agree.
    pub large_request_bytes: usize,
    /// Largest state-transfer answer a replica sends (bytes); a FETCH asking for more is
    /// answered in part and the asker asks again for the rest.
    pub transfer_reply_bytes_max: usize,
    /// State-transfer bytes a replica serves to one asking replica per second; FETCHes above
    /// the rate are dropped (counted), so a restarted replica cannot flood its peers.
    pub transfer_rate_bytes_per_sec: u64,
    /// Partitions asked for in one FETCH.
    pub transfer_items_max: usize,
    /// Session-key refresh period T_k (ms): with session keys, every node sends a NEW-KEY this
    /// often (BFT-PR §4.1). Part of the window of vulnerability T_v = 2 T_k + T_r.
    pub key_refresh_ms: u64,
    /// Replicas discard a client's key when the client has not refreshed it for this long (ms).
    pub client_key_lifetime_ms: u64,
    /// How long a client stays under suspicion after a request of it was doubted in a batch
    /// that did not commit before a view change (ms): meanwhile the primary orders its
    /// requests only when they carry its signature (clients sign retransmissions).
    pub suspect_client_ms: u64,
    /// Also suspect a client (for `suspect_client_ms`) as soon as f+1 replicas doubt one of
    /// its requests in a pre-prepare: at least one correct replica could not authenticate it,
    /// so its client (or its key) is bad. Without it a faulty client whose MACs verify at the
    /// primary only stalls every batch holding its request until its retransmission reaches
    /// the backups, without ever causing the view change that would suspect it.
    pub suspect_on_doubts: bool,
    /// PBFT: how often each replica checks the primary's pace (ms; 0: never). At the end of
    /// each window a replica compares the requests executed in it with the most executed in
    /// any of the last `PACE_HISTORY` windows; fewer than half of that in two windows in a
    /// row, with requests waiting unproposed, and it starts a view change (Aardvark's required
    /// throughput): a faulty primary slow just enough to stay under the view-change timeout
    /// is replaced after two windows instead of never. Not used under Prime, whose
    /// Suspect-Leader does this job.
    #[serde(default = "defaults::primary_pace_window_ms")]
    pub primary_pace_window_ms: u64,
    /// A recovery request from a replica is refused when the same replica's previous recovery
    /// was accepted less than this long before, in agreed time (ms): repeated recoveries
    /// cannot be used to deny service.
    pub recovery_interval_min_ms: u64,
    /// Largest difference accepted between the primary's proposed batch time and a backup's
    /// own clock (ms). Larger skews make the backup refuse the pre-prepare (a liveness check;
    /// safety never depends on clocks).
    pub clock_skew_max_ms: u64,
    /// Largest operation accepted in a request (bytes), before sealing.
    pub request_bytes_max: usize,
    /// Request and reply bodies are sealed between each client and the executors (see
    /// `crate::bodies`): the network and anyone without the executors' secret see only
    /// ciphertext. Needs the executors' key pair (`redoubt init` deals it).
    pub confidential_bodies: bool,
    /// Largest encoded message accepted (bytes); bigger frames are rejected before decoding.
    pub message_bytes_max: usize,
    /// Execution nodes of a separated deployment (Yin et al. 2003): 0 runs the service on
    /// the replicas (co-located); otherwise `2g+1` execution nodes run it and the replicas
    /// only order (see `crate::executor`). Replicas, executors and clients must agree.
    #[serde(default)]
    pub executors: u32,
    /// Rows of the privacy firewall between the clusters (Yin et al. 2003 §4): 0 for none;
    /// otherwise h+1 rows of h+1 filter nodes tolerating h faulty filters, and the
    /// execution nodes reachable only through them (needs `executors > 0` and confidential
    /// bodies; see `crate::filter`).
    #[serde(default)]
    pub filter_rows: u32,
    /// The ordering protocol: `pbft` or `prime` (ADR 0007). Prime needs session keys (its
    /// replicas sign their PO-ARU rows with their order keys and clients sign every request)
    /// and the co-located deployment, without tentative execution. Replicas and clients must
    /// agree.
    #[serde(default)]
    pub ordering: OrderProtocol,
    /// Prime: how many PO-REQUESTs above the last it executed from an originator a replica
    /// accepts (the pre-ordering window, per originator).
    #[serde(default = "defaults::prime_window")]
    pub prime_window: u64,
    /// Prime: how often a replica introduces its waiting clients' requests in one PO-REQUEST
    /// and sends its acknowledgements and PO-ARU row (ms).
    #[serde(default = "defaults::prime_preorder_period_ms")]
    pub prime_preorder_period_ms: u64,
    /// Prime: the leader's proposal period Δpp (ms): it proposes a summary matrix this often
    /// when the matrix makes something new eligible.
    #[serde(default = "defaults::prime_proposal_period_ms")]
    pub prime_proposal_period_ms: u64,
    /// Prime: K_Lat in thousandths: a leader whose turnaround time exceeds K_Lat times the
    /// acceptable one plus Δpp is replaced.
    #[serde(default = "defaults::prime_k_lat_permille")]
    pub prime_k_lat_permille: u64,
    /// Prime: the floor of the acceptable turnaround time (ms), so that jitter on a fast
    /// network does not replace correct leaders.
    #[serde(default = "defaults::prime_min_rtt_ms")]
    pub prime_min_rtt_ms: u64,
    /// Prime: the period of round-trip pings and of turnaround bound reports (ms).
    #[serde(default = "defaults::prime_ping_interval_ms")]
    pub prime_ping_interval_ms: u64,
    /// Prime: under load, a replica signs a new PO-ARU row at most once per this many ms (a
    /// row that covers everything it holds goes at once; 0: a row at every growth).
    #[serde(default = "defaults::prime_row_interval_ms")]
    pub prime_row_interval_ms: u64,
    /// Mutant to run (simulator only).
    #[cfg(feature = "mutants")]
    #[serde(skip)]
    pub mutant: Mutant,
}

impl Config {
    /// Defaults for a cluster tolerating `f` faults.
    pub fn new(f: u32) -> Config {
        Config {
            f,
            checkpoint_interval: 128,
            log_size: 256,
            batch_requests_max: 64,
            batch_bytes_max: 1 << 20,
            inflight_batches_max: 1,
            exec_inflight_batches_max: 2,
            view_change_timeout_ms: 1000,
            view_change_timeout_max_ms: 16_000,
            status_interval_ms: 100,
            retransmit_entries_max: 64,
            state_transfer_delay_ms: 300,
            state_transfer_retry_ms: 500,
            read_only_fast_path: true,
            read_only_to_quorum: true,
            digest_replies: true,
            tentative_execution: true,
            tentative_batch_max: 1,
            primary_replies: false,
            defer_tentative_commits: true,
            large_request_bytes: 1024,
            transfer_reply_bytes_max: 1 << 20,
            transfer_rate_bytes_per_sec: 256 << 20,
            transfer_items_max: 256,
            key_refresh_ms: 15_000,
            client_key_lifetime_ms: 60_000,
            suspect_client_ms: 30_000,
            suspect_on_doubts: true,
            primary_pace_window_ms: defaults::primary_pace_window_ms(),
            recovery_interval_min_ms: 30_000,
            clock_skew_max_ms: 60_000,
            request_bytes_max: 64 << 10,
            confidential_bodies: false,
            message_bytes_max: 32 << 20,
            executors: 0,
            filter_rows: 0,
            ordering: OrderProtocol::Pbft,
            prime_window: defaults::prime_window(),
            prime_preorder_period_ms: defaults::prime_preorder_period_ms(),
            prime_proposal_period_ms: defaults::prime_proposal_period_ms(),
            prime_k_lat_permille: defaults::prime_k_lat_permille(),
            prime_min_rtt_ms: defaults::prime_min_rtt_ms(),
            prime_ping_interval_ms: defaults::prime_ping_interval_ms(),
            prime_row_interval_ms: defaults::prime_row_interval_ms(),
            #[cfg(feature = "mutants")]
            mutant: Mutant::None,
        }
    }

    /// Largest operation as it travels in a request: `request_bytes_max`, plus what sealing
    /// adds when bodies are sealed.
    pub fn op_bytes_max(&self) -> usize {
        if self.confidential_bodies {
            self.request_bytes_max + crate::bodies::OP_OVERHEAD
        } else {
            self.request_bytes_max
        }
    }

    /// Number of replicas, `3f+1`.
    pub fn n(&self) -> u32 {
        3 * self.f + 1
    }

    /// The primary of view `v`.
    pub fn primary(&self, v: View) -> ReplicaId {
        (v % self.n() as u64) as ReplicaId
    }

    /// Whether a request whose operation has `op_len` bytes travels beside the pre-prepare
    /// (its client sends it to every replica; see `large_request_bytes`).
    pub fn travels_beside(&self, op_len: usize) -> bool {
        self.large_request_bytes > 0 && op_len >= self.large_request_bytes
    }

    /// Whether a batch of `requests` requests executes tentatively (when prepared, before it
    /// commits).
    pub fn tentative_for(&self, requests: usize) -> bool {
        self.tentative_execution && requests <= self.tentative_batch_max
    }

    /// Whether the primary leaves the first replies to a batch of `requests` requests to the
    /// backups: `primary_replies` off, and the batch executes once committed.
    pub fn quiet_primary_for(&self, requests: usize) -> bool {
        !self.primary_replies && !self.tentative_for(requests)
    }

    /// Whether execution is separated from agreement (`executors > 0`).
    pub fn separated(&self) -> bool {
        self.executors > 0
    }

    /// Whether Prime orders requests.
    pub fn prime(&self) -> bool {
        self.ordering == OrderProtocol::Prime
    }

    /// Whether a privacy firewall stands between the clusters.
    pub fn firewall(&self) -> bool {
        self.filter_rows > 0
    }

    /// Filter nodes of the firewall: (h+1)².
    pub fn filters(&self) -> u32 {
        self.filter_rows * self.filter_rows
    }

    /// Faulty filter nodes tolerated, h.
    pub fn h(&self) -> u32 {
        self.filter_rows.saturating_sub(1)
    }

    /// The filters of `row` (0: next to the agreement nodes).
    pub fn filter_row(&self, row: u32) -> impl Iterator<Item = FilterId> {
        let w = self.filter_rows;
        (row * w..(row + 1) * w).filter(move |_| row < w)
    }

    /// Faulty execution nodes tolerated, g, with `executors = 2g+1`.
    pub fn g(&self) -> u32 {
        self.executors.saturating_sub(1) / 2
    }

    /// Matching execution nodes that vouch for a reply or a checkpoint: g+1 (one correct).
    pub fn exec_quorum(&self) -> usize {
        self.g() as usize + 1
    }

    /// Filters of one row whose vouches make a filter below or an agreement node take a reply
    /// certificate without checking its threshold signature: h+1, the whole row (one correct;
    /// `crate::filter::vouch`).
    pub fn vouchers(&self) -> usize {
        #[cfg(feature = "mutants")]
        if self.mutant == Mutant::OneFilterVouches {
            return 1;
        }
        self.filter_rows as usize
    }

    /// Weak certificate size: at least one correct member.
    pub fn weak_quorum(&self) -> usize {
        self.f as usize + 1
    }

    /// Strong certificate size.
    pub fn quorum(&self) -> usize {
        2 * self.f as usize + 1
    }

    /// Checks the parameters are coherent; returns a description of the first problem.
    pub fn validate(&self) -> Result<(), String> {
        if self.f == 0 {
            return Err("f must be at least 1 (n = 3f+1 >= 4)".into());
        }
        self.validate_parameters()
    }

    /// What a client needs: [`Config::validate`], except that f = 0 (one unreplicated server,
    /// the benchmarks' baseline) is accepted.
    pub fn validate_for_client(&self) -> Result<(), String> {
        self.validate_parameters()
    }

    fn validate_parameters(&self) -> Result<(), String> {
        if self.filter_rows > 0 && (self.executors == 0 || !self.confidential_bodies) {
            return Err(
                "a privacy firewall (filter_rows > 0) needs execution nodes (executors > 0) \
                 and confidential bodies"
                    .into(),
            );
        }
        if self.prime() {
            if self.tentative_execution {
                return Err("ordering = \"prime\" needs tentative_execution = false".into());
            }
            if self.prime_window == 0
                || self.prime_preorder_period_ms == 0
                || self.prime_proposal_period_ms == 0
                || self.prime_ping_interval_ms == 0
                || self.prime_k_lat_permille < 1000
            {
                return Err("prime_window and the prime periods must be positive, and \
                     prime_k_lat_permille at least 1000"
                    .into());
            }
        }
        if self.primary_pace_window_ms != 0 && self.primary_pace_window_ms < PACE_WINDOW_MIN_MS {
            return Err(format!(
                "primary_pace_window_ms ({}) is 0 (no check) or at least {PACE_WINDOW_MIN_MS}",
                self.primary_pace_window_ms
            ));
        }
        if self.filter_rows > 8 {
            return Err(format!("filter_rows ({}) is at most 8", self.filter_rows));
        }
        if self.executors > 0 && self.executors.is_multiple_of(2) {
            return Err(format!(
                "executors ({}) must be odd (2g+1), or 0 for the co-located deployment",
                self.executors
            ));
        }
        if self.checkpoint_interval == 0 {
            return Err("checkpoint_interval must be positive".into());
        }
        if self.log_size < 2 * self.checkpoint_interval
            || !self.log_size.is_multiple_of(self.checkpoint_interval)
        {
            return Err(format!(
                "log_size ({}) must be a multiple of checkpoint_interval ({}) and at least twice it",
                self.log_size, self.checkpoint_interval
            ));
        }
        if self.batch_requests_max == 0
            || self.inflight_batches_max == 0
            || self.exec_inflight_batches_max == 0
        {
            return Err(
                "batch_requests_max, inflight_batches_max and exec_inflight_batches_max must be positive"
                    .into(),
            );
        }
        if self.batch_requests_max > 1 << 16 {
            // A PREPARE names the requests its sender doubts by 16-bit position.
            return Err("batch_requests_max must be at most 65536".into());
        }
        if self.inflight_batches_max > self.log_size
            || self.exec_inflight_batches_max > self.log_size
        {
            return Err(
                "inflight_batches_max and exec_inflight_batches_max must not exceed log_size"
                    .into(),
            );
        }
        if self.view_change_timeout_ms == 0
            || self.view_change_timeout_max_ms < self.view_change_timeout_ms
        {
            return Err(
                "view_change_timeout_ms must be positive and at most view_change_timeout_max_ms"
                    .into(),
            );
        }
        if self.key_refresh_ms == 0 || self.client_key_lifetime_ms < 2 * self.key_refresh_ms {
            return Err(
                "key_refresh_ms must be positive and client_key_lifetime_ms at least twice it"
                    .into(),
            );
        }
        if self.status_interval_ms == 0 {
            return Err("status_interval_ms must be positive".into());
        }
        if self.transfer_reply_bytes_max < 64 << 10
            || self.transfer_reply_bytes_max > self.message_bytes_max / 2
        {
            return Err("need 64 KiB <= transfer_reply_bytes_max <= message_bytes_max / 2".into());
        }
        if self.transfer_items_max == 0 || self.transfer_rate_bytes_per_sec == 0 {
            return Err(
                "transfer_items_max and transfer_rate_bytes_per_sec must be positive".into(),
            );
        }
        if self.op_bytes_max() > self.batch_bytes_max
            || self.batch_bytes_max > self.message_bytes_max / 2
        {
            return Err(
                "need request_bytes_max <= batch_bytes_max <= message_bytes_max / 2".into(),
            );
        }
        Ok(())
    }
}

/// Defaults of the options a file may leave out (serde needs functions).
mod defaults {
    pub fn read_only_to_quorum() -> bool {
        true
    }
    pub fn defer_tentative_commits() -> bool {
        true
    }
    pub fn primary_pace_window_ms() -> u64 {
        1_000
    }
    pub fn prime_window() -> u64 {
        20
    }
    pub fn prime_preorder_period_ms() -> u64 {
        6
    }
    pub fn prime_proposal_period_ms() -> u64 {
        20
    }
    pub fn prime_k_lat_permille() -> u64 {
        2500
    }
    pub fn prime_min_rtt_ms() -> u64 {
        8
    }
    pub fn prime_ping_interval_ms() -> u64 {
        500
    }
    pub fn prime_row_interval_ms() -> u64 {
        5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prime runs in every deployment, without tentative execution.
    #[test]
    fn prime_runs_in_every_deployment() {
        let mut cfg = Config::new(1);
        cfg.ordering = OrderProtocol::Prime;
        let e = cfg.validate().unwrap_err();
        assert!(e.contains("tentative_execution"), "{e}");
        cfg.tentative_execution = false;
        assert_eq!(cfg.validate(), Ok(()));
        cfg.executors = 3;
        assert_eq!(cfg.validate(), Ok(()));
        cfg.filter_rows = 2;
        cfg.confidential_bodies = true;
        assert_eq!(cfg.validate(), Ok(()));
    }
}
