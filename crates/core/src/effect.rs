//! What the core asks its host to do, and what it reports.

use crate::message::Reject;
use crate::types::{ClientId, Principal, ReplicaId, Seq, View};
use redoubt_crypto::Digest;
use std::sync::Arc;

/// An encoded, authenticated frame shared between the receivers of a multicast.
pub type Bytes = Arc<Vec<u8>>;

/// Inputs from the host that are not messages: the clock and a source of unpredictability.
/// The core has neither of its own, which keeps it deterministic under the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Env {
    /// The host's clock (ms). Only used for timers and for proposing/validating batch times.
    pub now_ms: u64,
    /// Fresh random bits from the host (used for proposed seeds and client back-off jitter).
    pub entropy: u64,
}

/// Something the host must do or may observe.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Send to one principal.
    Send { to: Principal, bytes: Bytes },
    /// Send to every replica except this one.
    Broadcast { bytes: Bytes },
    /// Make this record durable before performing any send of the same `handle` call.
    Persist(crate::journal::Record),
    /// Write this move of the state's durable base to the page store (and sync it) before
    /// any later effect of the same `handle` call, and before the next call: later journal
    /// records may rely on it (see [`crate::state::PagedState::take_commits`]).
    CommitState(Arc<crate::state::StateCommit>),
    /// An observation for metrics, logs and the simulator's checkers.
    Event(Event),
    /// Ask the key holder, off the protocol thread: the host performs the call (see
    /// [`crate::holder::perform`]) and hands the answer back as an input.
    Holder(crate::holder::HolderCall),
}

/// Observable protocol events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A batch was executed at `seq`. `digest` is recomputed from the executed requests
    /// (under Prime, the requests the ordinal's matrix made eligible, not the proposal).
    Executed {
        seq: Seq,
        view: View,
        digest: Digest,
        requests: Vec<(ClientId, u64)>,
    },
    /// The batch at `seq`, executed tentatively, was undone before it committed (a view
    /// change, or a state transfer replacing the state).
    TentativeUndone { seq: Seq },
    /// This replica took a checkpoint of its state after executing `seq`.
    CheckpointTaken { seq: Seq, digest: Digest },
    /// A checkpoint became stable (low watermark advanced).
    Stable { seq: Seq },
    /// This replica sent VIEW-CHANGE for `view`, for `cause`.
    ViewChangeStarted { view: View, cause: ViewChangeCause },
    /// Prime: this replica voted to leave `view`, for `cause`; it leaves once 2f+1 did.
    LeaveVoted { view: View, cause: ViewChangeCause },
    /// This replica entered `view` (NEW-VIEW accepted or sent).
    NewViewInstalled { view: View },
    /// This replica replaced its state by a fetched checkpoint, fetching `pages` pages and
    /// `metas` meta-data partitions.
    StateTransferred {
        seq: Seq,
        digest: Digest,
        pages: u64,
        metas: u64,
    },
    /// A state check found `pages` corrupt pages (0: the state would not load); the replica
    /// stops executing until it has fetched them.
    StateCorrupt { pages: u64 },
    /// A message was rejected.
    Rejected {
        from: Principal,
        kind: &'static str,
        reason: Reject,
    },
    /// This node sent a NEW-KEY (fresh session keys).
    KeysRefreshed,
    /// The key holder could not sign or draw keys; retried.
    KeyHolderFailed(String),
    /// This replica began a proactive recovery.
    RecoveryStarted,
    /// The estimation step ended with H_M.
    RecoveryEstimated { h_m: Seq },
    /// This replica completed a recovery.
    Recovered(RecoveryReport),
    /// The recovery request was refused (a recovery of this replica was accepted less than
    /// `recovery_interval_min_ms` before, e.g. before a restart mid-recovery): a new request
    /// goes out once the interval has passed.
    RecoveryRefused,
    /// A recovery request of `replica` executed at `seq` (every replica reports it).
    RecoveryExecuted { replica: ReplicaId, seq: Seq },
    /// Our own state disagrees with a certified checkpoint digest.
    StateDivergence { seq: Seq },
    /// A NEW-VIEW selected, at a sequence number this replica already executed, a different
    /// batch than the one it executed. Impossible with at most f faulty replicas.
    Contradiction {
        seq: Seq,
        executed: Digest,
        chosen: Digest,
    },
    /// A client came under suspicion: a request of it was doubted in a batch that did not
    /// commit before a view change; its unsigned requests are not ordered for a while.
    ClientSuspected { client: ClientId },
    /// The stored checkpoint `seq` did not load at start-up (`reason`): the replica stays
    /// diverged and fetches a checkpoint f+1 replicas vouch for.
    StateUnreadable { seq: Seq, reason: String },
    /// During a recovery, the state's own checkpoint `seq` lay above the estimate `h_m`, so no
    /// correct replica can have it: the state is relabelled as checkpoint 0 and fetched anew.
    StateDistrusted { seq: Seq, h_m: Seq },
}

/// What one recovery took, reported by [`Event::Recovered`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// The estimate H_M and the recovery point H.
    pub h_m: Seq,
    pub h: Seq,
    /// The sequence number the recovery request executed at (n_R).
    pub n_r: Seq,
    /// Time from the start to the estimate (ms).
    pub estimation_ms: u64,
    /// Time from the estimate to 2f+1 replies to the recovery request (ms).
    pub request_ms: u64,
    /// Time from the replies to a stable checkpoint H with a verified state (ms).
    pub check_fetch_ms: u64,
    pub total_ms: u64,
    /// Corrupt pages found by the check and pages fetched during the recovery.
    pub corrupt_pages: u64,
    pub pages_fetched: u64,
}

/// Why a replica started a view change (what an operator reads in the log and the metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewChangeCause {
    /// A client request waited here past the view-change timeout.
    RequestTimer,
    /// As primary it made no progress within the timeout: it steps down.
    PrimaryStalled,
    /// The view change before this one did not complete within its timeout.
    ViewChangeTimer,
    /// f+1 replicas are in later views: it joins them.
    JoinedOthers,
    /// The primary stepped down (its VIEW-CHANGE for the next view arrived).
    PrimarySteppedDown,
    /// As primary it hands over (asked to stop, or recovering).
    HandOver,
    /// The primary's NEW-VIEW contradicted the VIEW-CHANGEs it names.
    BadNewView,
    /// The execution nodes stopped acknowledging within the timeout (separated deployment).
    ExecutionStalled,
    /// The primary's pace fell below half its recent best while requests waited.
    PrimaryPace,
    /// Suspect-Leader (Prime): the leader's turnaround time exceeded the bound (ms).
    LeaderSlow { tat_ms: u64, bound_ms: u64 },
    /// A recovering replica resumes at the view it estimated.
    Recovery,
    /// Prime: 2f+1 replicas voted to leave the view (their own suspicions, or joining f+1).
    VotedOut { votes: u64 },
}

impl ViewChangeCause {
    /// A short label (the metric's `cause`).
    pub fn label(&self) -> &'static str {
        match self {
            ViewChangeCause::RequestTimer => "request_timer",
            ViewChangeCause::PrimaryStalled => "primary_stalled",
            ViewChangeCause::ViewChangeTimer => "view_change_timer",
            ViewChangeCause::JoinedOthers => "joined_others",
            ViewChangeCause::PrimarySteppedDown => "primary_stepped_down",
            ViewChangeCause::HandOver => "hand_over",
            ViewChangeCause::BadNewView => "bad_new_view",
            ViewChangeCause::ExecutionStalled => "execution_stalled",
            ViewChangeCause::PrimaryPace => "primary_pace",
            ViewChangeCause::LeaderSlow { .. } => "leader_slow",
            ViewChangeCause::Recovery => "recovery",
            ViewChangeCause::VotedOut { .. } => "voted_out",
        }
    }
}

impl std::fmt::Display for ViewChangeCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ViewChangeCause::RequestTimer => {
                write!(f, "a client request waited past the view-change timeout")
            }
            ViewChangeCause::PrimaryStalled => {
                write!(f, "as primary it made no progress within the timeout")
            }
            ViewChangeCause::ViewChangeTimer => {
                write!(f, "the previous view change did not complete in time")
            }
            ViewChangeCause::JoinedOthers => write!(f, "f+1 replicas are in later views"),
            ViewChangeCause::PrimarySteppedDown => write!(f, "the primary stepped down"),
            ViewChangeCause::HandOver => write!(f, "as primary it hands over"),
            ViewChangeCause::BadNewView => write!(f, "the primary's NEW-VIEW was inconsistent"),
            ViewChangeCause::ExecutionStalled => {
                write!(f, "the execution nodes stopped acknowledging")
            }
            ViewChangeCause::PrimaryPace => {
                write!(f, "the primary's pace fell below half its recent best")
            }
            ViewChangeCause::LeaderSlow { tat_ms, bound_ms } => write!(
                f,
                "Suspect-Leader: the leader's turnaround {tat_ms} ms exceeds the bound {bound_ms} ms"
            ),
            ViewChangeCause::Recovery => write!(f, "recovering at the estimated view"),
            ViewChangeCause::VotedOut { votes } => {
                write!(f, "{votes} replicas voted to leave the view")
            }
        }
    }
}
