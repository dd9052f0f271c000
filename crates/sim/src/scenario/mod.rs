//! What a simulated run does: cluster size, workload, network faults, and which replicas and
//! clients the adversary controls. Random scenarios are drawn from the seed; named scenarios
//! are fixed recipes for the cases the issue tracker asks for by name.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_core::{Config, ExecutorId, FilterId, Mutant, ReplicaId};

mod named;
mod prime;

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
    /// Prime: equivocates as an originator (receivers with an odd id get another PO-REQUEST
    /// under the same number: its last request dropped), acknowledges made-up digests, signs
    /// rows claiming certificates far beyond what it holds, and lies to Suspect-Leader (a
    /// turnaround of 60 s to frame the leader, an alpha of 0 to tighten the bound, round
    /// trips of 0 or 60 s, no pongs). Otherwise honest. Not in [`Behavior::ALL`].
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

    /// A random scenario mixing every fault kind, drawn from `seed`.
    pub fn random(seed: u64) -> Scenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5ce1_a810);
        let mut s = Scenario::calm(seed);
        s.name = "random".into();
        // Mostly f = 1; some f = 2 runs (7 replicas) where two faulty replicas can collude.
        let f = if rng.random_bool(0.2) { 2 } else { 1 };
        let n = 3 * f + 1;
        let k = [4u64, 8, 16][rng.random_range(0..3)];
        s.core = Config {
            f,
            checkpoint_interval: k,
            log_size: k * rng.random_range(2..4u64),
            batch_requests_max: [1usize, 4, 16][rng.random_range(0..3)],
            inflight_batches_max: rng.random_range(1..4),
            ..s.core
        };
        s.clients = rng.random_range(2..6);
        s.ops_per_client = rng.random_range(8..30);
        s.keys = rng.random_range(1..5);
        s.think_ms = (0, rng.random_range(1..40));
        s.delay_ms = (1, rng.random_range(2..15));
        s.heal_ms = rng.random_range(500..6000);
        s.net = NetFaults {
            drop: pick(&mut rng, 0.5, 0.0..0.25),
            duplicate: pick(&mut rng, 0.4, 0.0..0.2),
            corrupt: pick(&mut rng, 0.3, 0.0..0.05),
            replay: pick(&mut rng, 0.4, 0.0..0.1),
            forge: pick(&mut rng, 0.3, 0.0..0.05),
            spike: pick(&mut rng, 0.4, 0.0..0.1),
            spike_ms: rng.random_range(50..800),
        };
        // Up to f faulty replicas: Byzantine with a random behaviour, or amnesiac.
        let faulty_count = rng.random_range(0..=f);
        let mut ids: Vec<ReplicaId> = (0..n).collect();
        shuffle(&mut rng, &mut ids);
        let faulty: Vec<ReplicaId> = ids[..faulty_count as usize].to_vec();
        for r in &faulty {
            let roll = rng.random_range(0..10);
            if roll < 7 {
                let b = Behavior::ALL[rng.random_range(0..Behavior::ALL.len())];
                s.byzantine.push((*r, b));
            } else if roll < 8 {
                s.corruptions
                    .push((*r, rng.random_range(50..s.heal_ms.max(100))));
            } else {
                let start = rng.random_range(100..s.heal_ms.max(200));
                s.amnesia.push(Window {
                    replica: *r,
                    start_ms: start,
                    end_ms: start + rng.random_range(100..3000),
                });
            }
        }
        // Partitions and pauses of correct replicas (the network may also isolate faulty ones).
        for _ in 0..rng.random_range(0..3) {
            let start = rng.random_range(0..s.heal_ms);
            let size = rng.random_range(1..=f as usize + 1);
            let mut who = ids.clone();
            shuffle(&mut rng, &mut who);
            s.partitions.push(Partition {
                start_ms: start,
                end_ms: (start + rng.random_range(100..3000)).min(s.heal_ms),
                isolated: who[..size].to_vec(),
            });
        }
        let correct: Vec<ReplicaId> = ids[faulty_count as usize..].to_vec();
        if rng.random_bool(0.3) && faulty_count < f {
            // A paused correct replica (state intact) that falls behind the low watermark.
            let r = correct[rng.random_range(0..correct.len())];
            let start = rng.random_range(0..s.heal_ms);
            s.pauses.push(Window {
                replica: r,
                start_ms: start,
                end_ms: start + rng.random_range(200..4000),
            });
        }
        // A client whose authenticator is bad at some backups stalls its batch when other
        // backups are also missing (faulty, partitioned or paused): with MAC authenticators
        // that costs a view change per attempt (docs/adr/0002, item 7; the signature fallback
        // that removes it is future work). Liveness is only promised for that attack when
        // every replica participates and one such client runs; other seeds swap it for replay.
        if rng.random_bool(0.3) {
            // Power failures: one replica, or (rarely) every replica at once.
            let start = rng.random_range(0..s.heal_ms);
            let end = start + rng.random_range(50..2000);
            if rng.random_bool(0.2) {
                for r in 0..n {
                    s.reboots.push(Window {
                        replica: r,
                        start_ms: start,
                        end_ms: end,
                    });
                }
            } else {
                let r = rng.random_range(0..n);
                s.reboots.push(Window {
                    replica: r,
                    start_ms: start,
                    end_ms: end,
                });
            }
        }
        // Any number of clients with partial authenticators, next to faulty replicas,
        // partitions, pauses and reboots: a batch needs f+1 vouchers per request, not 2f+1
        // replicas vouching for all of it (`Prepare::doubts`).
        for _ in 0..rng.random_range(0..3) {
            let a = ClientAttack::ALL[rng.random_range(0..ClientAttack::ALL.len())];
            s.byz_clients.push(a);
        }
        if rng.random_bool(0.2) {
            s.step_downs.push(rng.random_range(0..s.heal_ms));
        }
        if rng.random_bool(0.3) {
            // Skewed clocks, within the configured bound of accepted batch times.
            let bound = s.core.clock_skew_max_ms as i64 / 4;
            s.clock_offsets_ms = (0..n).map(|_| rng.random_range(-bound..=bound)).collect();
        }
        // Swarm testing: some seeds follow a template that steers the adversary towards
        // schedules known to break broken variants of the protocol.
        match rng.random_range(0..10) {
            0 => {
                // Vote-stuffing next to a partitioned pair of backups: a replica can gather a
                // commit certificate that only a weakened quorum would accept.
                s.core.f = 1;
                s.byzantine = vec![(3, Behavior::VoteEverything)];
                s.amnesia.clear();
                s.reboots.clear();
                s.corruptions.clear();
                s.pauses.clear();
                s.byz_clients
                    .retain(|a| *a != ClientAttack::BadAuthenticator);
                // First one correct backup is cut off while the vote-stuffer helps the other
                // gather certificates; then they swap, so a view change happens without the
                // replica that holds the only (weak) commit.
                let start = rng.random_range(0..s.heal_ms / 2);
                let mid = start + rng.random_range(200..1500);
                let end = mid + rng.random_range(500..3000);
                s.heal_ms = s.heal_ms.max(end);
                let first = rng.random_range(1..3);
                s.partitions = vec![
                    Partition {
                        start_ms: start,
                        end_ms: mid,
                        isolated: vec![first],
                    },
                    Partition {
                        start_ms: mid,
                        end_ms: end,
                        isolated: vec![3 - first],
                    },
                ];
            }
            1 => {
                // Stale claims in view changes under frequent hand-overs.
                s.core.f = 1;
                s.byzantine = vec![(rng.random_range(0..4), Behavior::BogusViewChange)];
                s.amnesia.clear();
                s.reboots.clear();
                s.corruptions.clear();
                s.pauses.clear();
                s.partitions.clear();
                s.byz_clients
                    .retain(|a| *a != ClientAttack::BadAuthenticator);
                let every = rng.random_range(150..600);
                s.step_downs = (1..20).map(|i| i * every).collect();
            }
            _ => {}
        }
        // Reads on the read-only fast path in most seeds, ordered in the others.
        s.core.read_only_fast_path = rng.random_bool(0.75);
        // Long values (results over 32 bytes travel as digest replies) in half of the seeds.
        s.value_pad = if rng.random_bool(0.5) { 48 } else { 0 };
        s.core.digest_replies = rng.random_bool(0.8);
        s.core.tentative_execution = rng.random_bool(0.8);
        // Padded writes (57 bytes) travel beside the pre-prepare in a third of the seeds.
        s.core.large_request_bytes = [0, 32, 1024][rng.random_range(0..3)];
        // Proactive recovery in some seeds without other faulty replicas (a compromised
        // replica counts against f): replicas compromised in turn, each rebooted and recovered.
        if s.faulty().is_empty() && rng.random_bool(0.15) {
            let b = Behavior::ALL[rng.random_range(0..Behavior::ALL.len())];
            proactive_recovery(&mut s, b);
        }
        // A quiet primary in half of the seeds without tentative execution (drawn last, and
        // only there, so that other seeds play as they did before the setting existed).
        s.core.primary_replies = s.core.tentative_execution || rng.random_bool(0.5);
        // In a third of the seeds with tentative execution, only batches of up to 1 to 4
        // requests execute tentatively and the primary keeps quiet about larger ones (the
        // default's mix; drawn last, like the above).
        if s.core.tentative_execution && rng.random_bool(1.0 / 3.0) {
            s.core.tentative_batch_max = rng.random_range(1..=4);
            s.core.primary_replies = false;
        }
        // The stronger adversary (2026-12), drawn after everything above so that a seed that
        // draws none of it plays exactly as before. Compromised replicas plant messages for
        // later (half of the proactive-recovery seeds) and tamper with their disks (a third).
        if s.proactive.is_some() {
            if rng.random_bool(0.5) {
                s.plant = Some(Plant { join: false });
            }
            s.tamper_disk = rng.random_bool(1.0 / 3.0);
        }
        // Old NEW-KEYs replayed to replicas that just rebooted, in a tenth of the seeds with
        // reboots (power losses or watchdogs).
        if (!s.reboots.is_empty() || s.proactive.is_some()) && rng.random_bool(0.1) {
            s.replay_new_keys = true;
        }
        // Template: VIEW-CHANGEs planted for a later view by the first f compromised
        // replicas, joined by the next one (with f as drawn: 1 or 2).
        if rng.random_bool(0.02) {
            planted_join(&mut s);
        }
        // A faulty client colluding with faulty replicas (5% of the seeds without proactive
        // recovery, when there is room for them): requests that verify at the primary only,
        // vouched for to the primary alone by f faulty backups; or requests that verify at the
        // primary and the f replicas after it, in a pre-prepare whose broadcast one faulty
        // primary cuts after the 2f replicas after it.
        let (f, n) = (s.core.f, s.core.n());
        let room = f as usize - s.faulty().len().min(f as usize);
        if s.proactive.is_none() && room > 0 && rng.random_bool(0.05) {
            let mut free: Vec<ReplicaId> = (0..n).filter(|r| !s.faulty().contains(r)).collect();
            shuffle(&mut rng, &mut free);
            if room < f as usize || rng.random_bool(0.5) {
                // The primary of view 0 if it is free (the attack needs it to be primary).
                let r = if free.contains(&0) { 0 } else { free[0] };
                s.byzantine.push((r, Behavior::CutBroadcast));
                s.byz_clients.push(ClientAttack::ColludeCut);
            } else {
                for r in &free[..f as usize] {
                    s.byzantine.push((*r, Behavior::PrepareToPrimary));
                }
                // With f >= 2, three in four of these clients also make their requests verify
                // at one correct backup (from a stream of its own: the other draws stay as
                // they were).
                let mut g4 = ChaCha8Rng::seed_from_u64(s.seed ^ 0x64c0_11de);
                if f >= 2 && g4.random_bool(0.75) {
                    s.byz_clients.push(ClientAttack::ColludeOneCorrect);
                } else {
                    s.byz_clients.push(ClientAttack::ColludePrimary);
                }
            }
        }
        // Lies about numbers and state (7% of the seeds without proactive recovery, when
        // there is room): every faulty replica added shares one of the three behaviours.
        let room = f as usize - s.faulty().len().min(f as usize);
        if s.proactive.is_none() && room > 0 && rng.random_bool(0.07) {
            let b = [
                Behavior::ExtremeNumbers,
                Behavior::LieStatus,
                Behavior::EquivocateViewChange,
            ][rng.random_range(0..3)];
            let mut free: Vec<ReplicaId> = (0..n).filter(|r| !s.faulty().contains(r)).collect();
            shuffle(&mut rng, &mut free);
            for r in &free[..rng.random_range(1..=room)] {
                s.byzantine.push((*r, b));
            }
        }
        // Sealed bodies (confidential_bodies) in half of the seeds, drawn last: a seed that
        // draws clear bodies plays exactly as before the setting existed.
        s.core.confidential_bodies = rng.random_bool(0.5);
        // The primary's pace check in a fifth of the seeds, drawn after everything else for
        // the same reason; windows from 100 ms (a few batches each) to 2 s.
        if rng.random_bool(0.2) {
            s.core.primary_pace_window_ms = rng.random_range(100..2_000);
        }
        // Fast reads to 2f+1 replicas first (the default) in most seeds, to all replicas in
        // the rest; drawn last, like the above, so that every other draw of a seed is as it
        // was before the setting existed (the pinned seeds of the tests keep their scenarios).
        s.core.read_only_to_quorum = rng.random_bool(0.75);
        // A client replaying replicas' latest NEW-KEYs in a tenth of the seeds, from a stream
        // of its own (every other draw stays as it was).
        let mut g3 = ChaCha8Rng::seed_from_u64(s.seed ^ 0x6300_5eed);
        if g3.random_bool(0.1) {
            s.byz_clients.push(ClientAttack::ReplayReplicaNewKeys);
        }
        // Recovery requests signed in advance by the adversary, in half of the seeds with
        // proactive recovery (a stream of their own as well).
        let mut g8 = ChaCha8Rng::seed_from_u64(s.seed ^ 0x6800_5eed);
        s.presign_recovery = s.proactive.is_some() && g8.random_bool(0.5);
        // A patient faulty client in a tenth of the seeds, and the throughput check in a
        // third of the seeds whose faulty parties ought to cost nothing (streams of their
        // own).
        let mut g5 = ChaCha8Rng::seed_from_u64(s.seed ^ 0x6500_5eed);
        if g5.random_bool(0.1) {
            s.byz_clients.push(ClientAttack::Patient);
        }
        if !s.byz_clients.is_empty() && s.costs_nothing() && g5.random_bool(1.0 / 3.0) {
            s.check_throughput(200);
        }
        // Stale reads beside a lagging correct replica in 3% of the seeds without proactive
        // recovery (a stream of its own).
        let mut reads = ChaCha8Rng::seed_from_u64(s.seed ^ 0x57a1_e4ead);
        if s.proactive.is_none() && reads.random_bool(0.03) {
            stale_reads_beside_lagging(&mut s, &mut reads);
        }
        s
    }
}

/// The share of a seed's fault-free throughput its correct clients keep under faulty
/// replicas and clients that ought to cost nothing (the throughput check).
pub const THROUGHPUT_SHARE: f64 = 1.0 / 3.0;

/// The stale-reads template: reads on the fast path to every replica, the f faulty replicas
/// answer them with a lagging correct replica's results ([`Behavior::StaleReads`]), and one
/// correct replica hears its peers 30 to 150 ms late for the whole run, so that it answers
/// reads from a state that misses writes other clients saw complete. Its answer and the f
/// copies are f+1 matching stale results: a client must wait for 2f+1.
pub fn stale_reads_beside_lagging(s: &mut Scenario, rng: &mut ChaCha8Rng) {
    let (f, n) = (s.core.f as usize, s.core.n());
    s.core.read_only_fast_path = true;
    s.core.read_only_to_quorum = false;
    s.byzantine.clear();
    s.amnesia.clear();
    s.corruptions.clear();
    s.pauses.clear();
    // Colluding clients need colluding replicas.
    s.byz_clients.retain(|a| ClientAttack::ALL.contains(a));
    let mut ids: Vec<ReplicaId> = (0..n).collect();
    shuffle(rng, &mut ids);
    for r in &ids[..f] {
        s.byzantine.push((*r, Behavior::StaleReads));
    }
    s.slow_inbound = vec![(ids[f], rng.random_range(30..150))];
    s.throughput_share = None;
    s.keys = 1;
    s.ops_per_client = s.ops_per_client.max(40);
}

/// The planted-VIEW-CHANGE template: proactive recovery with no other faulty replica, each
/// compromised replica running the core unchanged (so that batches commit with it while
/// correct replicas are cut off) while the adversary plants random messages with its keys,
/// and the coordinated attack of [`Plant::join`]. Holds are long enough for the
/// attacker to cut replicas off and send its view change before the watchdog fires.
pub fn planted_join(s: &mut Scenario) {
    s.byzantine.clear();
    s.amnesia.clear();
    s.corruptions.clear();
    proactive_recovery(s, Behavior::Honest);
    if let Some(p) = s.proactive.as_mut() {
        p.hold_ms = (2000, 3000);
    }
    s.plant = Some(Plant { join: true });
}

/// Configures proactive recovery with short periods (virtual time): T_k 1.5 s, 3f+2
/// compromises, a workload long enough to run through all of them.
pub fn proactive_recovery(s: &mut Scenario, behavior: Behavior) {
    let f = s.core.f;
    s.core.key_refresh_ms = 1500;
    s.core.client_key_lifetime_ms = 6000;
    s.core.recovery_interval_min_ms = 2000;
    let compromises = 3 * f + 2;
    s.proactive = Some(Proactive {
        compromises,
        hold_ms: (300, 1500),
        behavior,
        gap_ms: 2 * s.core.key_refresh_ms + 500,
        first_ms: 500,
    });
    // Enough operations to keep clients busy through most compromises (about 5 s each); the
    // run lasts until every recovery completed in any case.
    s.ops_per_client = s.ops_per_client.max(80 * compromises);
    s.think_ms = (10, 40);
    s.liveness_bound_ms = s.liveness_bound_ms.max(20_000 * compromises as u64);
}

fn pick(rng: &mut ChaCha8Rng, p: f64, range: std::ops::Range<f64>) -> f64 {
    if rng.random_bool(p) {
        rng.random_range(range)
    } else {
        0.0
    }
}

fn shuffle<T>(rng: &mut ChaCha8Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
}
