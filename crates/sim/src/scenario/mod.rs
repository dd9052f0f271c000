//! What a simulated run does: cluster size, workload, network faults, and which replicas and
//! clients the adversary controls. Random scenarios are drawn from the seed; named scenarios
//! are fixed recipes for the cases the issue tracker asks for by name.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_core::{Config, ExecutorId, FilterId, Mutant, ReplicaId};

mod named;
mod prime;
mod random;

use random::shuffle;
pub use random::{planted_join, proactive_recovery, stale_reads_beside_lagging};

/// How a faulty execution node of a separated deployment misbehaves (at most g of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecBehavior {
    /// Sends nothing.
    Silent,
    /// Runs the core but lies in what it sends: wrong results in its replies, acknowledgements
    /// of batches it never executed, random checkpoint digests, certificates of garbage for
    /// peers that ask, and (with sealed bodies) the operations it opened, in clear, in its
    /// replies.
    Liar,
    /// Drops half of what it sends.
    Flaky,
}

impl ExecBehavior {
    pub const ALL: [ExecBehavior; 3] = [
        ExecBehavior::Silent,
        ExecBehavior::Liar,
        ExecBehavior::Flaky,
    ];
}

/// How a faulty filter node of a privacy firewall misbehaves (at most h of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterBehavior {
    /// Passes nothing on.
    Silent,
    /// Passes everything it gets on, unchecked, up and down (to every node it has a link
    /// to), and wraps whatever it got from above into reply certificates of its own making:
    /// what a compromised filter does to smuggle data out.
    Leaky,
}

impl FilterBehavior {
    pub const ALL: [FilterBehavior; 2] = [FilterBehavior::Silent, FilterBehavior::Leaky];
}

/// How a Byzantine replica misbehaves. Every behaviour sends well-authenticated messages (the
/// adversary holds the replica's keys) unless it is about forging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Sends nothing (a crash that never restarts).
    Silent,
    /// Drops each outgoing message to each receiver with probability 1/2.
    Withhold,
    /// As primary, sends different batches (different digests) to different backups.
    Equivocate,
    /// As primary, sends different batch bodies under the same digest.
    SameDigestEquivocate,
    /// Prepares, commits and checkpoints carry random digests for some receivers.
    LieVotes,
    /// View changes carry fabricated P, Q and checkpoint claims, differently per receiver.
    BogusViewChange,
    /// As new primary, sends NEW-VIEW messages that do not follow from their view changes.
    BogusNewView,
    /// As primary, holds every pre-prepare back just under the view-change timeout.
    Slow,
    /// Sends PREPARE and COMMIT for every pre-prepare it sees, to everyone, and lies in view
    /// changes: the most aggressive vote-stuffing.
    VoteEverything,
    /// As a state-transfer replier, sends wrong pages, wrong meta-data, stale checkpoints
    /// or nothing.
    LieState,
    /// Answers a read-only request only with the result a lagging correct replica gave for
    /// it (the adversary keeps its replicas' old states and knows who lags), never with its
    /// own: with the lagging answer, f+1 matching stale results.
    StaleReads,
    /// As primary, adds to every batch a write no client sent, in the name of a correct
    /// client, under an authenticator of random MACs.
    ForgeRequest,
    /// Rewrites history in its VIEW-CHANGEs: every request it reports prepared in a view
    /// before the one being left it claims (P and Q alike, the same to every receiver) as the
    /// null request prepared in the view being left, a claim that passes A1 and that only A2
    /// (f+1 replicas vouching in Q) stops; as a new primary it sends no NEW-VIEW, so the next
    /// view change finds such older entries.
    LaterNull,
    /// As a new primary, sends each backup a NEW-VIEW built on view changes it made up in the
    /// names of 2f others and itself (all claiming null where it had requests prepared),
    /// relaying the made-up messages itself: only the acks of the replicas that received the
    /// real ones stop it.
    ForgeNewView,
    /// Picks one of the above per message.
    Mixed,
    /// Sends what the core sends: the adversary acts through the world instead (planting
    /// and the coordinated attacks of proactive-recovery runs). Not in [`Behavior::ALL`],
    /// which random draws index.
    Honest,
    /// Colludes with the faulty clients of [`ClientAttack::ColludePrimary`]: for a
    /// pre-prepare holding one of their requests (which verify at the primary only), its
    /// PREPARE goes without doubts to the primary only, nothing to the others; it sends no
    /// VIEW-CHANGE. Not in [`Behavior::ALL`].
    PrepareToPrimary,
    /// As primary, colludes with the faulty clients of [`ClientAttack::ColludeCut`]: the
    /// first pre-prepare holding one of their requests (which verify at this primary and the
    /// f replicas after it only) reaches the 2f replicas after it only, then it stops sending
    /// for good (a crash in the middle of a broadcast). Not in [`Behavior::ALL`].
    CutBroadcast,
    /// Rewrites views and sequence numbers of every message kind (pre-prepares, votes,
    /// checkpoints, view changes, acks, NEW-VIEWs, STATUS, FETCH, state data, replies,
    /// REPLY-STABLE, relayed view changes) to values near `u64::MAX`, in a third of its
    /// messages. Not in [`Behavior::ALL`].
    ExtremeNumbers,
    /// Lies in STATUS (a later view, far more executed, stable and prepared than it has,
    /// batches and view changes it does not miss) and in REPLY-STABLE (checkpoints and
    /// prepared sequence numbers far ahead, or 0). Not in [`Behavior::ALL`].
    LieStatus,
    /// Equivocates with valid alternatives: its VIEW-CHANGE is honest for receivers with an
    /// even id and, for the others, a well-formed one that claims nothing prepared (each
    /// consistent on its own); as new primary, its NEW-VIEW goes to the even receivers only.
    /// Faulty replicas that share it split the receivers alike (f = 2: coordinated). Not in
    /// [`Behavior::ALL`].
    EquivocateViewChange,
    /// With each STATUS it sends, also sends a well-formed VIEW-CHANGE for the view after the
    /// one it reports: one replica alone trying to drag the others into view changes (the f+1
    /// join rule ignores it). Not in [`Behavior::ALL`].
    PushView,
    /// Prime: equivocates as an originator under odd numbers (receivers with an odd id get
    /// another PO-REQUEST: its last request dropped), sends its PO-REQUESTs of even numbers
    /// with their client signatures corrupted and their MACs for one other replica too,
    /// acknowledges made-up digests, signs rows claiming certificates far beyond what it
    /// holds, and lies to Suspect-Leader (a turnaround of 60 s to frame the leader, an alpha
    /// of 0 to tighten the bound, round trips of 0 or 60 s, no pongs). Otherwise honest. Not
    /// in [`Behavior::ALL`].
    PrimeLiar,
    /// Firewall deployment: rewrites the view of every certified reply it passes down to a
    /// later view whose primary it is (the view lies outside the certificate's signature),
    /// and keeps what clients send it: a client that believed it would send every request
    /// to a replica that drops it (second review, G7). Otherwise honest. Not in
    /// [`Behavior::ALL`].
    HintLiar,
    /// Prime: as leader, puts rows of retired incarnations (of replicas that recovered),
    /// made up to claim everything, into its proposals, which pass unchecked there (second
    /// review, G2), and holds such proposals back like [`Behavior::Slow`]: a backup that
    /// took the forged rows at their word stops summarizing and Suspect-Leader no longer
    /// measures the leader. Otherwise honest. Not in [`Behavior::ALL`].
    RowForger,
    /// As primary, from sequence number [`SLUGGISH_FROM`] on (once clients are under way),
    /// holds every pre-prepare back for 40% of the view-change timeout: slow by orders of
    /// magnitude, yet every request executes well within the backups' timers, so the timers
    /// never replace it (the attack harness's `slow-primary`). Not in [`Behavior::ALL`].
    Sluggish,
}

/// Where a [`Behavior::Sluggish`] primary turns slow.
pub const SLUGGISH_FROM: u64 = 40;

impl Behavior {
    pub const ALL: [Behavior; 15] = [
        Behavior::Silent,
        Behavior::Withhold,
        Behavior::Equivocate,
        Behavior::SameDigestEquivocate,
        Behavior::LieVotes,
        Behavior::BogusViewChange,
        Behavior::BogusNewView,
        Behavior::Slow,
        Behavior::VoteEverything,
        Behavior::LieState,
        Behavior::StaleReads,
        Behavior::ForgeRequest,
        Behavior::LaterNull,
        Behavior::ForgeNewView,
        Behavior::Mixed,
    ];
}

/// What a state corruption does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CorruptionKind {
    /// One of the others, chosen per corruption.
    Random,
    /// A write the other replicas did not make, digested like any other: found when f+1
    /// others vouch for a different checkpoint.
    BadWrite,
    /// Bytes of stored pages flip without any digest changing: found by an on-demand check.
    PagesThenScrub,
    /// As above, found by the check at start-up after a reboot.
    PagesThenReboot,
}

/// How a Byzantine client misbehaves (on its own keys, disjoint from correct clients' keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAttack {
    /// Sends two different operations under one timestamp to different replicas.
    ReuseTimestamp,
    /// Sends each request to one random replica only, never retransmitting.
    SubsetOnly,
    /// Corrupts the authenticator entries of up to f replicas.
    BadAuthenticator,
    /// Sends random bytes and frames with forged senders.
    Garbage,
    /// Re-sends old requests.
    Replay,
    /// Colludes with a [`Behavior::PrepareToPrimary`] replica: its requests' authenticators
    /// verify at the current primary only. Not in [`ClientAttack::ALL`].
    ColludePrimary,
    /// Colludes with a [`Behavior::CutBroadcast`] replica: its requests' authenticators verify
    /// at the current primary and the f replicas after it only. Not in [`ClientAttack::ALL`].
    ColludeCut,
    /// Colludes with f [`Behavior::PrepareToPrimary`] replicas: its requests' authenticators
    /// verify at the current primary, at the faulty replicas and at one correct backup (the
    /// first after the primary). With f >= 2 a prepared certificate with f+1 backup vouchers
    /// could then stand at the primary alone, and no view change decide it (second review,
    /// G4). Not in [`ClientAttack::ALL`].
    ColludeOneCorrect,
    /// Sends a request whose MAC fails at the current primary alone (it verifies at every
    /// backup), unsigned, and waits three view-change timeouts before its next one instead
    /// of replacing or signing it: backups that ran the view-change timer for it would
    /// change views once per request (second review, G5). Keeps acting until the run ends.
    /// Not in [`ClientAttack::ALL`].
    Patient,
    /// Replays every replica's latest NEW-KEY (captured as it passes) to the other replicas,
    /// in bursts, as any client can (a replica hands its latest NEW-KEY to a client whose
    /// request it cannot authenticate). A replay must change nothing (second review, G3).
    /// Not in [`ClientAttack::ALL`].
    ReplayReplicaNewKeys,
}

impl ClientAttack {
    pub const ALL: [ClientAttack; 5] = [
        ClientAttack::ReuseTimestamp,
        ClientAttack::SubsetOnly,
        ClientAttack::BadAuthenticator,
        ClientAttack::Garbage,
        ClientAttack::Replay,
    ];
}

/// Network misbehaviour before the heal time.
#[derive(Clone, Debug)]
pub struct NetFaults {
    pub drop: f64,
    pub duplicate: f64,
    pub corrupt: f64,
    /// Probability per send of also replaying an old captured frame somewhere.
    pub replay: f64,
    /// Probability per send of injecting a frame with a forged sender.
    pub forge: f64,
    /// Probability that a message is delayed by a long spike (reordering).
    pub spike: f64,
    pub spike_ms: u64,
}

impl NetFaults {
    pub fn none() -> Self {
        NetFaults {
            drop: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            replay: 0.0,
            forge: 0.0,
            spike: 0.0,
            spike_ms: 0,
        }
    }
}

/// A set of replicas cut off from everyone else during `[start_ms, end_ms)`.
#[derive(Clone, Debug)]
pub struct Partition {
    pub start_ms: u64,
    pub end_ms: u64,
    pub isolated: Vec<ReplicaId>,
}

/// Proactive recovery under an adversary that compromises replicas in turn: it takes a
/// replica (its keys, its behaviour, its stored pages) for a while; the watchdog then reboots
/// it and it recovers; the adversary keeps the keys it took and forges with them forever
/// after. One replica at a time, the next only `gap_ms` after the previous one recovered.
#[derive(Clone, Debug)]
pub struct Proactive {
    /// Compromises over the run (more than 3f+1 for the acceptance run).
    pub compromises: u32,
    /// How long the adversary holds a replica before the watchdog fires (ms).
    pub hold_ms: (u64, u64),
    /// What a compromised replica does meanwhile.
    pub behavior: Behavior,
    /// Time between a recovery and the next compromise (ms): at least 2 T_k, the part of the
    /// window of vulnerability T_v = 2 T_k + T_r during which old keys may still work.
    pub gap_ms: u64,
    /// Time of the first compromise (ms).
    pub first_ms: u64,
}

/// Prime's split attack (second review, G1; `world/split.rs`): the faulty `originator`
/// keeps its PO-REQUEST of one number from `spare` (and the network keeps pre-ordering from
/// the others from it), the correct `recovering` replica recovers proactively, and the
/// originator then sends it and the spare a second version.
#[derive(Clone, Debug)]
pub struct Split {
    pub originator: ReplicaId,
    pub spare: ReplicaId,
    pub recovering: ReplicaId,
    /// The first PO-REQUEST the originator sends from then on is the attacked number (ms).
    pub start_ms: u64,
    /// The recovery starts this long after the first version went out (ms).
    pub recover_after_ms: u64,
}

/// Messages the adversary makes while it holds a replica, sealed with that replica's keys
/// of the moment, that are meant to outlive the compromise (proactive-recovery runs).
#[derive(Clone, Debug)]
pub struct Plant {
    /// The coordinated attack on top of the random planting: the first f compromises plant
    /// VIEW-CHANGEs for one later view V at every replica; compromise f+1 cuts f correct
    /// replicas (the primary of V among them) off the others for a while, then sends its own
    /// VIEW-CHANGE for V, so that the correct replicas join V on f+1 and the new primary's
    /// set S can hold f+1 lies.
    pub join: bool,
}

/// A timed event against one replica.
#[derive(Clone, Debug)]
pub struct Window {
    pub replica: ReplicaId,
    pub start_ms: u64,
    pub end_ms: u64,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub seed: u64,
    pub core: Config,
    /// Correct clients.
    pub clients: u32,
    pub ops_per_client: u32,
    /// Distinct keys the correct clients use (few keys, many conflicts).
    pub keys: u32,
    pub think_ms: (u64, u64),
    /// One-way network delay range when nothing goes wrong.
    pub delay_ms: (u64, u64),
    /// From a time on (ms), this delay range instead of `delay_ms`: a step in what every
    /// message costs (the simulator models no CPU or bandwidth), as a rise in load or in the
    /// work per request makes it.
    pub delay_step: Option<(u64, (u64, u64))>,
    pub net: NetFaults,
    /// From this time on the network is clean: no drops, duplicates, corruption, replays or
    /// partitions. Byzantine replicas and clients keep misbehaving.
    pub heal_ms: u64,
    pub partitions: Vec<Partition>,
    /// Partitions cut replicas from replicas only; clients reach every replica.
    pub partitions_spare_clients: bool,
    /// Extra delay (ms) of every frame from a replica to the given replica.
    pub slow_inbound: Vec<(ReplicaId, u64)>,
    /// Bytes appended to every value clients write (long results exercise digest replies).
    pub value_pad: usize,
    pub byzantine: Vec<(ReplicaId, Behavior)>,
    /// Faulty replicas that crash and restart with no memory (counted against f).
    pub amnesia: Vec<Window>,
    /// Correct replicas that stop and resume with their state intact (a paused process or
    /// a long partition of one node).
    pub pauses: Vec<Window>,
    /// Replicas (correct ones included) that lose power and reboot from their journal: only
    /// what they made durable survives. They stay correct.
    pub reboots: Vec<Window>,
    /// Replicas whose service state is silently corrupted at a time (a disk or memory fault, or
    /// an intruder). Counted against f; they must detect it and repair themselves by state
    /// transfer (their later checkpoints must agree with the correct replicas').
    pub corruptions: Vec<(ReplicaId, u64)>,
    /// What a corruption does.
    pub corruption_kind: CorruptionKind,
    pub byz_clients: Vec<ClientAttack>,
    /// Times at which the current primary hands over (the step-down admin command).
    pub step_downs: Vec<u64>,
    /// Offset of each replica's clock from virtual time (ms); missing entries are 0. The core
    /// only uses clocks for timers and to bound the primary's proposed batch time.
    pub clock_offsets_ms: Vec<i64>,
    /// Every correct client's operations must complete within this long after `heal_ms`.
    pub liveness_bound_ms: u64,
    /// The highest view a correct replica may reach in the run (named scenarios in which
    /// nothing but a lone faulty replica asks for view changes).
    pub view_bound: Option<u64>,
    /// By this time (ms) every correct running replica is active in one view, checked at
    /// the end of the run (which must last that long).
    pub views_settled_ms: Option<u64>,
    /// Compromises in turn with proactive recovery (off when `None`).
    pub proactive: Option<Proactive>,
    /// Planting by compromised replicas (proactive-recovery runs only).
    pub plant: Option<Plant>,
    /// Prime: the split attack across a proactive recovery (off when `None`).
    pub split: Option<Split>,
    /// Correct replicas' routine proactive recoveries: (replica, time in ms).
    pub routine_recoveries: Vec<(ReplicaId, u64)>,
    /// At each compromise the adversary also tampers with the replica's journal and page
    /// store, which the watchdog reboots it from (proactive-recovery runs only).
    pub tamper_disk: bool,
    /// NEW-KEY frames are captured as they pass and old ones replayed to each replica right
    /// after it reboots (power loss or watchdog).
    pub replay_new_keys: bool,
    /// Proactive recovery: while the adversary holds a replica it has the replica's key
    /// holder sign a recovery request and gets it ordered before the watchdog reboots the
    /// replica, so that the real recovery falls within `recovery_interval_min_ms` of it
    /// (second review, G8).
    pub presign_recovery: bool,
    /// The run stops here (ms), with no liveness check: a measurement window (the named
    /// scenario `colluding-client`).
    pub stop_ms: Option<u64>,
    /// Separated deployment (`core.executors > 0`): the faulty execution nodes (at most g).
    pub exec_byzantine: Vec<(ExecutorId, ExecBehavior)>,
    /// Correct execution nodes that lose power at a time and reboot from their page store
    /// at another (ms): they catch up from certificates or by state transfer.
    pub exec_reboots: Vec<(ExecutorId, u64, u64)>,
    /// Firewall deployment (`core.filter_rows > 0`): the faulty filter nodes (at most h).
    pub filter_byzantine: Vec<(FilterId, FilterBehavior)>,
    pub mutant: Mutant,
    /// The throughput check: correct clients' operations per simulated second after the
    /// faults other than the faulty replicas and clients are over ([`Scenario::settle_ms`])
    /// must stay at or above this share of the same seed run without its faulty replicas and
    /// clients (Aardvark's promise). Drawn only for seeds whose faulty replicas and clients
    /// ought to cost nothing ([`Scenario::costs_nothing`]).
    pub throughput_share: Option<f64>,
    /// Prime: check that correct clients' updates after stabilisation execute within the
    /// bound (see `world/checks.rs` and `world/delay.rs`). Off in the plain sweep, on with
    /// `--bounded-delay`.
    pub bounded_delay: bool,
    /// With session keys: the probability that a call to a key holder (any principal's)
    /// fails, before the holder acted or after (its answer lost). 0 in most seeds.
    pub holder_fail: f64,
    /// Key holders answer each call up to this many ms late (drawn per call), so answers
    /// come out of order (see `world/holders.rs`).
    pub holder_delay_ms: u64,
}

impl Scenario {
    /// Every optimization on: read-only fast path, digest replies, tentative execution, and
    /// requests beside the pre-prepare from 32 bytes, with values padded so that writes
    /// travel beside the pre-prepare and results as digests.
    pub fn all_optimizations(&mut self) {
        self.value_pad = 48;
        self.core.read_only_fast_path = true;
        self.core.digest_replies = true;
        self.core.tentative_execution = true;
        self.core.tentative_batch_max = usize::MAX;
        self.core.large_request_bytes = 32;
    }

    /// Every optimization of [`Scenario::all_optimizations`], with tentative execution for
    /// batches of at most `tentative_batch_max` (drawn from 1 to 4) requests only and a
    /// primary that leaves first replies to larger batches to the backups, as by default.
    pub fn hybrid(&mut self) {
        self.all_optimizations();
        self.core.tentative_batch_max = 1 + (self.seed % 4) as usize;
        self.core.primary_replies = false;
    }

    /// Every optimization of [`Scenario::all_optimizations`] but tentative execution, and a
    /// primary that leaves first replies to the backups (`primary_replies` off).
    pub fn quiet_primary(&mut self) {
        self.all_optimizations();
        self.core.tentative_execution = false;
        self.core.primary_replies = false;
    }

    /// The separated deployment (Yin et al. 2003): the replicas only order, `2g+1` execution
    /// nodes (g = 1, or 2 in a fifth of the seeds) run the service, up to g of them faulty
    /// (in 70% of the seeds). Drawn from its own stream, after everything else: the rest of
    /// the seed plays as drawn.
    pub fn separate(&mut self) {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x5e9a_7a7e_d0e5);
        let g = if rng.random_bool(0.2) { 2 } else { 1 };
        self.core.executors = 2 * g + 1;
        if rng.random_bool(0.7) {
            let mut ids: Vec<ExecutorId> = (0..self.core.executors).collect();
            shuffle(&mut rng, &mut ids);
            let k = rng.random_range(1..=g) as usize;
            for e in &ids[..k] {
                let b = ExecBehavior::ALL[rng.random_range(0..ExecBehavior::ALL.len())];
                self.exec_byzantine.push((*e, b));
            }
        }
        // A correct execution node reboots in 40% of the seeds, sometimes for long enough to
        // fall behind what certificates reach (it must then fetch state).
        if rng.random_bool(0.4) {
            let correct: Vec<ExecutorId> = (0..self.core.executors)
                .filter(|e| !self.exec_byzantine.iter().any(|(x, _)| x == e))
                .collect();
            let e = correct[rng.random_range(0..correct.len())];
            let start = rng.random_range(100..2000);
            let end = start + rng.random_range(100..4000);
            self.exec_reboots.push((e, start, end));
        }
        self.core.exec_inflight_batches_max = rng.random_range(1..4u64).min(self.core.log_size);
        // Every operation also crosses the hops to and from the execution nodes, each as
        // lossy as the rest of the network: a quarter as much time again to finish.
        self.liveness_bound_ms += self.liveness_bound_ms / 4;
    }

    /// The firewall deployment (Yin et al. 2003 §4): [`Scenario::separate`], with sealed
    /// bodies and an (h+1) × (h+1) array of filters between the clusters (h = 1, or 2 in a
    /// fifth of the seeds), up to h of them faulty (in 70% of the seeds). Drawn from a
    /// stream of its own.
    pub fn firewall(&mut self) {
        self.separate();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0xf17e_2a11);
        let h = if rng.random_bool(0.2) { 2 } else { 1 };
        self.core.filter_rows = h + 1;
        self.core.confidential_bodies = true;
        if rng.random_bool(0.7) {
            let mut ids: Vec<FilterId> = (0..self.core.filters()).collect();
            shuffle(&mut rng, &mut ids);
            let k = rng.random_range(1..=h) as usize;
            for x in &ids[..k] {
                let b = FilterBehavior::ALL[rng.random_range(0..FilterBehavior::ALL.len())];
                self.filter_byzantine.push((*x, b));
            }
        }
        // A view-hint liar in a quarter of the seeds whose faulty parties ought to cost
        // nothing, with room for a faulty replica; the throughput check then always runs.
        let room = self.faulty().len() < self.core.f as usize;
        let bad_macs = self.byz_clients.contains(&ClientAttack::BadAuthenticator);
        if room && self.costs_nothing() && !bad_macs && rng.random_bool(0.25) {
            let free: Vec<ReplicaId> = (0..self.core.n())
                .filter(|r| !self.faulty().contains(r))
                .collect();
            let r = free[rng.random_range(0..free.len())];
            self.byzantine.push((r, Behavior::HintLiar));
            self.check_throughput(100);
        }
        // Every request and every reply also crosses the h+1 filter rows: a quarter as much
        // time again on top of the separated deployment's.
        self.liveness_bound_ms += self.liveness_bound_ms / 4;
    }

    /// A fault-free baseline with f = 1.
    pub fn calm(seed: u64) -> Scenario {
        let mut core = Config::new(1);
        core.checkpoint_interval = 8;
        core.log_size = 16;
        core.view_change_timeout_ms = 400;
        core.view_change_timeout_max_ms = 6400;
        core.status_interval_ms = 50;
        core.state_transfer_delay_ms = 150;
        core.state_transfer_retry_ms = 200;
        core.batch_requests_max = 8;
        // Without the primary's pace check unless a seed draws it (drawn last, see `random`):
        // seeds play as they did before it existed.
        core.primary_pace_window_ms = 0;
        // The named scenarios were tuned with every replica replying and every batch
        // executing tentatively; random seeds draw both, `quiet_primary` and
        // `quiet-primary-silent-backup` run a quiet primary, `hybrid` the default's mix.
        core.tentative_execution = true;
        core.tentative_batch_max = usize::MAX;
        core.primary_replies = true;
        Scenario {
            name: "calm".into(),
            seed,
            core,
            clients: 3,
            ops_per_client: 20,
            keys: 3,
            think_ms: (0, 20),
            delay_ms: (1, 8),
            delay_step: None,
            net: NetFaults::none(),
            heal_ms: 0,
            partitions: vec![],
            partitions_spare_clients: false,
            slow_inbound: vec![],
            value_pad: 0,
            byzantine: vec![],
            amnesia: vec![],
            pauses: vec![],
            reboots: vec![],
            corruptions: vec![],
            corruption_kind: CorruptionKind::Random,
            byz_clients: vec![],
            step_downs: vec![],
            clock_offsets_ms: vec![],
            liveness_bound_ms: 60_000,
            view_bound: None,
            views_settled_ms: None,
            proactive: None,
            plant: None,
            split: None,
            routine_recoveries: Vec::new(),
            tamper_disk: false,
            replay_new_keys: false,
            presign_recovery: false,
            stop_ms: None,
            exec_byzantine: vec![],
            exec_reboots: vec![],
            filter_byzantine: vec![],
            mutant: Mutant::None,
            throughput_share: None,
            bounded_delay: false,
            holder_fail: 0.0,
            holder_delay_ms: 0,
        }
    }

    /// When every fault but the faulty replicas and clients is over (ms): the heal, and
    /// the end of every pause, reboot and crash.
    pub fn settle_ms(&self) -> u64 {
        let windows = self.pauses.iter().chain(&self.reboots).chain(&self.amnesia);
        let exec = self.exec_reboots.iter().map(|(_, _, end)| *end);
        windows
            .map(|w| w.end_ms)
            .chain(exec)
            .fold(self.heal_ms, u64::max)
    }

    /// Whether the faulty replicas and clients of this scenario ought to cost correct
    /// clients nothing once the network healed: no replica faulty but view-hint liars, no
    /// proactive recovery, and clients that attack alone (the colluding attacks need faulty
    /// replicas that cost time by design). A client whose MACs fail at some replicas costs
    /// view changes next to a faulty replica that does not relay (ADR 0002): not with a
    /// liar.
    pub fn costs_nothing(&self) -> bool {
        let bad_macs = self.byz_clients.contains(&ClientAttack::BadAuthenticator);
        self.byzantine.iter().all(|(_, b)| *b == Behavior::HintLiar)
            && (self.byzantine.is_empty() || !bad_macs)
            && self.amnesia.is_empty()
            && self.corruptions.is_empty()
            && self.proactive.is_none()
            && self.byz_clients.iter().all(|a| {
                ClientAttack::ALL.contains(a)
                    || matches!(
                        a,
                        ClientAttack::Patient | ClientAttack::ReplayReplicaNewKeys
                    )
            })
    }

    /// Turns the throughput check on, with `ops` more operations per client issued quickly,
    /// so that there is work to measure once the faults are over.
    pub fn check_throughput(&mut self, ops: u32) {
        self.throughput_share = Some(THROUGHPUT_SHARE);
        self.ops_per_client += ops;
        self.think_ms = (0, self.think_ms.1.min(10));
        self.liveness_bound_ms += 60_000;
    }

    /// Ids of the replicas the adversary controls (Byzantine or amnesiac).
    pub fn faulty(&self) -> Vec<ReplicaId> {
        let mut v: Vec<ReplicaId> = self
            .byzantine
            .iter()
            .map(|(r, _)| *r)
            .chain(self.amnesia.iter().map(|w| w.replica))
            .chain(self.corruptions.iter().map(|(r, _)| *r))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The share of a seed's fault-free throughput its correct clients keep under faulty
/// replicas and clients that ought to cost nothing (the throughput check).
pub const THROUGHPUT_SHARE: f64 = 1.0 / 3.0;
