//! One simulated run: the unmodified core replicas and clients in a single thread, virtual
//! time, one seeded RNG, a faulty network, the adversary, and the checkers after every step.

use crate::adversary::{random_digest, Adversary};
use crate::checker::Checker;
use crate::linearizability::{self, Operation};
use crate::scenario::CorruptionKind;
use crate::scenario::{Behavior, ClientAttack, Scenario};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_core::keys::{AdmittedCounters, Directory, Forger, LocalHolder, SessionKeys};
use redoubt_core::message::{
    decode_body, decode_frame, encode_frame, Message, Request, SignedRequest,
};
use redoubt_core::open_state;
use redoubt_core::seal::{request_authenticator, seal};
use redoubt_core::state::{Geometry, MemStore};
use redoubt_core::{
    Client, ClientId, ClientTiming, Effect, Env, Event, Input, Principal, Replica, ReplicaId,
};
use redoubt_crypto::pk::HolderSecrets;
use redoubt_services::kv::{KvOp, KvResult, KvService};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

mod checks;
mod clients;
mod delay;
mod effects;
mod events;
mod execs;
mod filters;
mod flaky;
mod frames;
mod holders;
mod join;
mod network;
mod nonces;
mod plant;
mod prime;
mod proactive;
mod replay;
mod secrets;
mod setup;
mod split;
mod stats;
mod tamper;
pub use frames::describe;
use frames::{holder_secrets, is_new_key, new_session_keys, replica_keys};
pub use stats::{Outcome, RunStats};

const TICK_MS: u64 = 10;
const BYZ_CLIENT_BASE: ClientId = 1000;
/// Replay buffer of captured frames.
const CAPTURE_MAX: usize = 512;
/// How often (in processed events) the memory bounds are checked.
const FOOTPRINT_EVERY: u64 = 997;

#[derive(Clone, Debug)]
enum Ev {
    Deliver {
        to: Principal,
        from: Principal,
        bytes: Vec<u8>,
    },
    TickReplica(ReplicaId),
    /// An execution node's tick (separated deployment).
    TickExec(redoubt_core::ExecutorId),
    /// A filter node's tick (firewall deployment).
    TickFilter(redoubt_core::FilterId),
    /// An execution node loses power, and reboots from its page store.
    ExecOff(redoubt_core::ExecutorId),
    ExecOn(redoubt_core::ExecutorId),
    TickClient(usize),
    ClientNext(usize),
    ByzClient(usize),
    Crash(ReplicaId),
    Restart(ReplicaId),
    /// Crash keeping the disk (everything synced survives), to be restarted by `Reboot`.
    PowerOff(ReplicaId),
    Reboot(ReplicaId),
    Corrupt(ReplicaId),
    /// An on-demand state check (scrub) at a replica.
    CheckState(ReplicaId),
    Pause(ReplicaId),
    Resume(ReplicaId),
    StepDown,
    /// The adversary compromises a replica (proactive-recovery runs).
    Compromise(ReplicaId),
    /// The watchdog reboots a replica and starts its recovery.
    Watchdog(ReplicaId),
    /// The adversary has the replica it holds sign and send a recovery request.
    Presign(ReplicaId),
    /// Prime's split attack: the correct replica it waits for recovers proactively.
    SplitRecover,
    /// A correct replica's routine proactive recovery (`Scenario::routine_recoveries`).
    RoutineRecovery(ReplicaId),
    /// The adversary forges a frame with keys it took from a compromised replica.
    Forge,
    /// Delivery of a forged frame made with keys frozen at `stolen_at` (ms).
    DeliverForged {
        to: ReplicaId,
        bytes: Vec<u8>,
        stolen_at: u64,
    },
    /// The adversary plants messages as the replica it holds (`plant`).
    Plant(ReplicaId),
    /// Frames kept back from a compromise of the replica go out (`plant`).
    ReleaseHeld(ReplicaId),
    /// A step of the coordinated planted-view-change attack (`Plant::join`).
    JoinAttack {
        step: u8,
    },
    /// Its follow-up: the attacker's view change again, and acks to the new primary.
    JoinAcks {
        tries: u32,
    },
    /// A replica that recovered (at `recovered_at`, when the correct replicas had executed
    /// up to `target`) must be taking part again.
    RecoveredCheck {
        r: ReplicaId,
        recovered_at: u64,
        target: u64,
    },
    /// The key holder of `to` (in its life `life`) answers a call (`holders.rs`).
    HolderAnswer {
        to: Principal,
        life: u64,
        call: redoubt_core::HolderCall,
    },
}

/// Keys the adversary took from a compromised replica: current while it holds the replica,
/// frozen when the watchdog takes the replica back.
struct Stolen {
    replica: ReplicaId,
    keys: redoubt_core::keys::StolenKeys,
    frozen_at: Option<u64>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Key(u64, u64);

struct SimClient {
    core: Client<SessionKeys>,
    done: u32,
    current: Option<usize>, // index into history
    counter: u64,
}

struct ByzClient {
    id: ClientId,
    attack: ClientAttack,
    keys: SessionKeys,
    next_rekey_ms: u64,
    timestamp: u64,
    sent: Vec<Vec<u8>>,
    /// A patient client sends nothing before this time (ms).
    quiet_until_ms: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Up {
    Running,
    Paused,
    Crashed,
}

/// The simulated replicas' state: 128 pages of 128 bytes under a 4-ary tree (depth 4), small
/// enough to simulate quickly, deep enough that transfers recurse.
pub fn sim_geometry() -> Geometry {
    Geometry::new(128, 128, 4).expect("valid geometry")
}

pub struct World {
    sc: Scenario,
    rng: ChaCha8Rng,
    now: u64,
    next_id: u64,
    queue: BinaryHeap<Reverse<(Key, usize)>>,
    events: Vec<Option<Ev>>,
    free: Vec<usize>,
    master: Vec<u8>,
    /// Every principal's public keys (the papers' read-only memory).
    directory: Arc<Directory>,
    /// Each principal's key-holder counter, which survives restarts.
    holder_counters: BTreeMap<Principal, Arc<AtomicU64>>,
    /// Key holders that fail now and then, until the faults are over (`Scenario::holder_fail`).
    holder_faults: Option<flaky::HolderFaults>,
    /// The NEW-KEY counters each principal's key holder admitted, which survive restarts.
    holder_admitted: BTreeMap<Principal, AdmittedCounters>,
    /// How many key holders were built per principal (seeds each one's generator).
    incarnations: BTreeMap<Principal, u64>,
    /// Key-table generation of each controlled replica the adversary last copied.
    adversary_key_gen: BTreeMap<ReplicaId, u64>,
    replicas: Vec<Replica<KvService, SessionKeys>>,
    /// Separated deployment: the execution nodes, and the checker of their events.
    execs: Vec<execs::SimExec>,
    exec_checker: Checker,
    /// Firewall deployment: the filter nodes, and the keys the dealer made.
    filters: Vec<filters::SimFilter>,
    dealt: Option<filters::Dealt>,
    /// Prime: the replicas' order keys.
    prime: Option<prime::PrimeDeal>,
    /// Each replica's durable journal (compacted at checkpoints, as the node does).
    disks: Vec<Vec<redoubt_core::Record>>,
    /// Each replica's durable page store.
    stores: Vec<MemStore>,
    up: Vec<Up>,
    adversary: Adversary,
    faulty: Vec<ReplicaId>,
    clients: Vec<SimClient>,
    byz_clients: Vec<ByzClient>,
    history: Vec<Operation>,
    captured: Vec<(Principal, Vec<u8>)>,
    checker: Checker,
    trace_on: bool,
    trace: Vec<String>,
    stats: RunStats,
    processed: u64,
    /// Frames delivered to replicas so far: every other one goes through `preopen` (the
    /// node's path), the rest as received bytes, so sweeps exercise both (without drawing on
    /// the random generator, which would change every seed's run).
    replica_deliveries: u64,
    violations: Vec<String>,
    /// The nonce check of sealed bodies (`nonces`).
    nonces: nonces::NonceCheck,
    /// Replicas whose state was corrupted (they must repair themselves).
    corrupted: Vec<ReplicaId>,
    /// Replicas with silently corrupted pages not yet checked (by a scrub or a reboot).
    unscrubbed: BTreeSet<ReplicaId>,
    /// Replicas whose power fails in the middle of their next step: a prefix of that step's
    /// writes (journal records, state commits, in order) reaches the disk, nothing else.
    cut_mid_step: BTreeSet<ReplicaId>,
    /// Replicas whose power failed mid-step and that have not rebooted since.
    cut_before_reboot: BTreeSet<ReplicaId>,
    /// When each replica last reported corrupt pages.
    corrupt_found: BTreeMap<ReplicaId, u64>,
    /// Last checkpoint digest each replica reported, by replica.
    last_checkpoint: BTreeMap<ReplicaId, (u64, redoubt_crypto::Digest, u64)>,
    /// Proactive recovery: the replica the adversary holds, the keys it took, when each
    /// replica last sent a NEW-KEY, and the recoveries awaited.
    compromised: Option<ReplicaId>,
    stolen: Vec<Stolen>,
    last_rekey: BTreeMap<ReplicaId, u64>,
    awaiting_recovery: Option<(ReplicaId, u64)>,
    /// When the last proactive recovery completed (Prime's bounded delay is promised after it).
    last_recovered_ms: u64,
    /// What the adversary planted and keeps (`plant`).
    planting: plant::Planting,
    /// Replicas already reported for a fabricated low watermark.
    watermark_reported: BTreeSet<ReplicaId>,
    /// NEW-KEY frames captured for replays, and the counters replicas accepted.
    new_keys: replay::NewKeys,
    /// Prime's bounded delay (`--bounded-delay`): when correct replicas received and executed
    /// each update.
    delay: delay::DelayProbe,
    /// The join-rule check (`join.rs`).
    join: join::JoinCheck,
    /// Prime's split attack (`Scenario::split`).
    split: split::SplitState,
}

impl World {
    fn schedule(&mut self, at: u64, ev: Ev) {
        let id = self.next_id;
        self.next_id += 1;
        let slot = match self.free.pop() {
            Some(i) => {
                self.events[i] = Some(ev);
                i
            }
            None => {
                self.events.push(Some(ev));
                self.events.len() - 1
            }
        };
        self.queue.push(Reverse((Key(at, id), slot)));
    }

    /// Ends replica `r`'s turn (`Input::Idle`), after the effects of its last input were
    /// done: the core takes the state commits it handed over as written when it is called.
    /// `env` is the last input's (no fresh entropy is drawn: a run without Prime, where the
    /// end of a turn does nothing, draws what it drew before turns ended).
    fn end_turn(&mut self, r: ReplicaId, env: Env) {
        let eff = self.replicas[r as usize].handle(env, Input::Idle);
        self.replica_effects(r, eff);
    }

    /// Whether replica `r`'s turn ends after the delivery being handled: unless the next
    /// event is another delivery to it at the same millisecond, which the same turn takes
    /// (the node runtime handles what already waits in one turn, then `Input::Idle`).
    fn turn_ends(&self, r: ReplicaId) -> bool {
        let Some(Reverse((Key(at, _), slot))) = self.queue.peek() else {
            return true;
        };
        let next_to_r = matches!(
            &self.events[*slot],
            Some(Ev::Deliver { to: Principal::Replica(to), .. }) if *to == r
        );
        !(*at == self.now && next_to_r)
    }

    fn schedule_initial(&mut self) {
        let n = self.sc.core.n();
        for r in 0..n {
            let jitter = self.rng.random_range(0..TICK_MS);
            self.schedule(jitter, Ev::TickReplica(r));
        }
        for e in 0..self.execs.len() as u32 {
            let jitter = self.rng.random_range(0..TICK_MS);
            self.schedule(jitter, Ev::TickExec(e));
        }
        for x in 0..self.filters.len() as u32 {
            let jitter = self.rng.random_range(0..TICK_MS);
            self.schedule(jitter, Ev::TickFilter(x));
        }
        for (e, start, end) in self.sc.exec_reboots.clone() {
            self.schedule(start, Ev::ExecOff(e));
            self.schedule(end, Ev::ExecOn(e));
        }
        for c in 0..self.clients.len() {
            let start = self.rng.random_range(0..50);
            self.schedule(start, Ev::ClientNext(c));
            self.schedule(start + 1, Ev::TickClient(c));
        }
        for c in 0..self.byz_clients.len() {
            let start = self.rng.random_range(0..100);
            self.schedule(start, Ev::ByzClient(c));
        }
        for w in self.sc.amnesia.clone() {
            self.schedule(w.start_ms, Ev::Crash(w.replica));
            self.schedule(w.end_ms, Ev::Restart(w.replica));
        }
        for w in self.sc.pauses.clone() {
            self.schedule(w.start_ms, Ev::Pause(w.replica));
            self.schedule(w.end_ms, Ev::Resume(w.replica));
        }
        for (r, t) in self.sc.corruptions.clone() {
            self.schedule(t, Ev::Corrupt(r));
        }
        for w in self.sc.reboots.clone() {
            self.schedule(w.start_ms, Ev::PowerOff(w.replica));
            self.schedule(w.end_ms, Ev::Reboot(w.replica));
        }
        for t in self.sc.step_downs.clone() {
            self.schedule(t, Ev::StepDown);
        }
        for (r, t) in self.sc.routine_recoveries.clone() {
            self.schedule(t, Ev::RoutineRecovery(r));
        }
        if let Some(p) = self.sc.proactive.clone() {
            let first = self.rng.random_range(0..self.sc.core.n());
            self.schedule(p.first_ms, Ev::Compromise(first));
            self.schedule(p.first_ms + 100, Ev::Forge);
        }
    }

    fn env(&mut self) -> Env {
        Env {
            now_ms: self.now,
            entropy: self.rng.random(),
        }
    }

    /// A replica's view of the clock: virtual time plus its offset (never below zero).
    fn replica_env(&mut self, r: ReplicaId) -> Env {
        const CLOCK_BASE_MS: i64 = 1_000_000;
        let offset = self
            .sc
            .clock_offsets_ms
            .get(r as usize)
            .copied()
            .unwrap_or(0);
        Env {
            // Every clock starts well after the epoch, so a negative offset shifts it rather
            // than freezing it at zero until the simulated time catches up.
            now_ms: (self.now as i64 + offset + CLOCK_BASE_MS).max(0) as u64,
            entropy: self.rng.random(),
        }
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.trace_on {
            let l = line();
            self.trace.push(format!("{:>8}ms {}", self.now, l));
        }
    }

    fn healed(&self) -> bool {
        self.now >= self.sc.heal_ms
    }

    fn partitioned(&self, a: Principal, b: Principal) -> bool {
        if self.healed() {
            return false;
        }
        let client_side = matches!(a, Principal::Client(_)) || matches!(b, Principal::Client(_));
        if client_side && self.sc.partitions_spare_clients {
            return false;
        }
        let iso = |p: Principal, part: &crate::scenario::Partition| match p {
            Principal::Replica(r) => part.isolated.contains(&r),
            Principal::Client(_) | Principal::Executor(_) | Principal::Filter(_) => false,
        };
        self.sc.partitions.iter().any(|part| {
            self.now >= part.start_ms && self.now < part.end_ms && iso(a, part) != iso(b, part)
        })
    }

    /// Gives the adversary the current keys of a replica it controls.
    fn adversary_copy_keys(&mut self, r: ReplicaId) {
        let keys = self.replicas[r as usize].auth();
        if self.adversary_key_gen.get(&r) != Some(&keys.generation()) {
            self.adversary_key_gen.insert(r, keys.generation());
            let forger = Forger {
                me: Principal::Replica(r),
                keys: keys.steal(),
            };
            self.adversary.set_keys(r, forger);
        }
    }

    fn session_keys(&mut self, p: Principal) -> SessionKeys {
        new_session_keys(
            &self.master,
            &self.directory,
            &mut self.holder_counters,
            &mut self.holder_admitted,
            &mut self.incarnations,
            self.sc.mutant == redoubt_core::Mutant::NoFreshness,
            self.sc.core.separated(),
            self.holder_faults.as_ref(),
            p,
        )
    }

    fn replica_send(&mut self, r: ReplicaId, to: Principal, bytes: Vec<u8>) {
        if self.sc.split.is_some() && self.split_outgoing(r, to, &bytes) {
            return;
        }
        if self.sc.plant.is_some() && self.join_drops(r, &bytes) {
            return;
        }
        if self.adversary.controls(r) {
            self.adversary_copy_keys(r);
            for (t, b, extra) in self.adversary.outgoing(&mut self.rng, r, to, &bytes) {
                self.transmit(Principal::Replica(r), t, b, extra);
            }
        } else {
            if matches!(to, Principal::Client(_))
                && self.adversary.copies_stale_reads()
                && self.lags(r)
            {
                for (x, (t, b, extra)) in self.adversary.copy_stale_read(to, &bytes) {
                    self.transmit(Principal::Replica(x), t, b, extra);
                }
            }
            self.transmit(Principal::Replica(r), to, bytes, 0);
        }
    }

    /// Whether correct replica `r` executed less than the most advanced running correct one.
    fn lags(&self, r: ReplicaId) -> bool {
        let mine = self.replicas[r as usize].last_executed();
        (0..self.sc.core.n()).any(|o| {
            !self.faulty.contains(&o)
                && !self.adversary.controls(o)
                && self.up[o as usize] == Up::Running
                && self.replicas[o as usize].last_executed() > mine
        })
    }

    fn observe(&mut self, r: ReplicaId, ev: Event) {
        self.join_observe(r, &ev);
        match &ev {
            Event::CheckpointTaken { seq, digest }
            | Event::StateTransferred { seq, digest, .. } => {
                self.last_checkpoint.insert(r, (*seq, *digest, self.now));
            }
            Event::StateCorrupt { pages } => {
                self.corrupt_found.insert(r, self.now);
                // Only the simulated medium corrupts pages, and only at replicas it was told
                // to: anywhere else, corrupt pages were installed without being checked.
                if !self.corrupted.contains(&r) && !self.adversary.controls(r) {
                    let pages = *pages;
                    self.violation(format!(
                        "r{r} found {pages} corrupt pages though its medium was never corrupted"
                    ));
                }
            }
            _ => {}
        }
        match &ev {
            Event::KeysRefreshed => {
                self.last_rekey.insert(r, self.now);
            }
            Event::RecoveryRefused if self.awaiting_recovery.is_some_and(|(w, _)| w == r) => {
                // The recovery the watchdog started was refused: nobody re-keys after the
                // adversary lost the replica.
                self.violation(format!(
                    "r{r}'s recovery after the watchdog's reboot was refused (a recovery \
                     request of the same replica was accepted less than \
                     recovery_interval_min_ms before)"
                ));
            }
            Event::Recovered(report) => {
                self.stats.recoveries += 1;
                self.split_recovered(r);
                if let Some((w, at)) = self.awaiting_recovery {
                    if w == r {
                        self.awaiting_recovery = None;
                        self.last_recovered_ms = self.now;
                        let last = self.replicas[r as usize].last_executed();
                        self.checker.set_faulty(r, false, last);
                        self.stats.recovery_max_ms = self.stats.recovery_max_ms.max(self.now - at);
                        if report.h < report.h_m {
                            self.violation(format!("r{r} recovery point below H_M: {report:?}"));
                        }
                        self.schedule_recovered_check(r);
                        if let Some(p) = self.sc.proactive.clone() {
                            if self.stats.compromises < p.compromises as u64 {
                                let next = (r + 1) % self.sc.core.n();
                                self.schedule(self.now + p.gap_ms, Ev::Compromise(next));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        match &ev {
            Event::ViewChangeStarted { view, .. } => {
                self.stats.view_changes += 1;
                let grace = self.stats.settle_ms + 4 * self.sc.core.view_change_timeout_ms;
                if self.now >= grace && !self.faulty.contains(&r) && *view > self.stats.late_view {
                    self.stats.late_view = *view;
                    self.stats.late_view_changes += 1;
                }
            }
            Event::StateTransferred { pages, .. } => {
                self.stats.state_transfers += 1;
                self.stats.pages_fetched += pages;
            }
            Event::StateCorrupt { pages } => self.stats.corrupt_pages_found += pages,
            Event::Rejected { .. } => self.stats.rejected += 1,
            Event::TentativeUndone { .. } => self.stats.tentative_undone += 1,
            Event::Executed { seq, requests, .. } => {
                self.stats.max_executed = self.stats.max_executed.max(*seq);
                if self.probing_delay() && !self.faulty.contains(&r) && !self.adversary.controls(r)
                {
                    let weak = self.sc.core.f + 1;
                    self.delay.executed(self.now, requests, weak);
                }
            }
            _ => {}
        }
        if self.trace_on && !matches!(ev, Event::Rejected { .. } | Event::Executed { .. }) {
            self.log(|| format!("r{r} event {ev:?}"));
        }
        if self.trace_on {
            if let Event::Rejected { from, kind, reason } = &ev {
                let (from, kind, reason) = (*from, *kind, *reason);
                self.log(|| format!("r{r} rejected {kind} from {from:?}: {reason}"));
            }
            if let Event::Executed {
                seq,
                view,
                digest,
                requests,
            } = &ev
            {
                let s = format!("r{r} executed n{seq} v{view} {digest:?} {requests:?}");
                self.log(|| s);
            }
        }
        // Safety checks on the event (agreement, state, order, NEW-VIEW contradiction); the
        // checker skips replicas that are faulty or held by the adversary.
        if let Some(v) = self.checker.observe(r, &ev) {
            self.violation(v);
        }
    }

    fn violation(&mut self, v: String) {
        let line = format!("t={}ms {v}", self.now);
        self.log(|| format!("VIOLATION {v}"));
        if self.violations.len() < 20 {
            self.violations.push(line);
        }
    }

    fn key_name(&mut self) -> Vec<u8> {
        format!("k{}", self.rng.random_range(0..self.sc.keys.max(1))).into_bytes()
    }

    fn deliver(&mut self, to: Principal, from: Principal, bytes: Vec<u8>) {
        if self.trace_on {
            let d = describe(&bytes);
            self.log(|| format!("{from:?} -> {to:?} {d}"));
        }
        self.check_leak(to, from, &bytes);
        match to {
            Principal::Replica(r) => {
                if self.up[r as usize] != Up::Running {
                    return;
                }
                // The adversary sees what its replicas receive before they act on it.
                if self.adversary.controls(r) {
                    self.adversary_copy_keys(r);
                }
                if let Principal::Client(c) = from {
                    if c < BYZ_CLIENT_BASE
                        && self.probing_delay()
                        && !self.faulty.contains(&r)
                        && !self.adversary.controls(r)
                    {
                        self.delay.received(self.now, c, &bytes);
                    }
                }
                let extra = self.adversary.on_delivery(&mut self.rng, r, &bytes);
                if self.sc.plant.is_some() {
                    self.join_on_delivery(r, &bytes);
                }
                let env = self.replica_env(r);
                let suspected_before = self.replicas[r as usize].stats.leaders_suspected;
                self.join_before(r, from);
                self.replica_deliveries += 1;
                let eff = if self.replica_deliveries.is_multiple_of(2) {
                    let p = redoubt_core::preopen(bytes.clone());
                    self.replicas[r as usize].handle(env, Input::Preopened(p))
                } else {
                    self.replicas[r as usize].handle(env, Input::Receive(&bytes))
                };
                self.join_handled(r, suspected_before);
                self.replica_effects(r, eff);
                if self.turn_ends(r) {
                    self.end_turn(r, env);
                }
                self.join_after();
                for (t, b, d) in extra {
                    self.transmit(Principal::Replica(r), t, b, d);
                }
            }
            Principal::Executor(e) => {
                if (e as usize) < self.execs.len() {
                    self.deliver_exec(e, &bytes);
                }
            }
            Principal::Filter(x) => self.deliver_filter(x, from, &bytes),
            Principal::Client(id) => {
                let Some(c) = self.clients.iter().position(|c| c.core.id() == id) else {
                    return; // Byzantine clients ignore replies
                };
                let env = self.env();
                if let Some(done) = self.clients[c].core.receive(env, &bytes) {
                    let Some(h) = self.clients[c].current.take() else {
                        self.violation(format!("c{id} completed with nothing outstanding"));
                        return;
                    };
                    if let Some(why) = &done.refused {
                        self.violation(format!("c{id}'s operation was refused: {why}"));
                        return;
                    }
                    let result = match KvResult::decode(&done.result) {
                        Ok(r) => r,
                        Err(e) => {
                            self.violation(format!("c{id} got an undecodable result: {e}"));
                            return;
                        }
                    };
                    self.log(|| {
                        format!(
                            "c{id} complete t{} {result:?} ({}ms)",
                            done.timestamp, done.latency_ms
                        )
                    });
                    self.history[h].complete_ms = Some(self.now);
                    self.history[h].result = Some(result);
                    self.clients[c].done += 1;
                    self.stats.ops_completed += 1;
                    self.count_settled_op(self.now - self.history[h].invoke_ms);
                    let (lo, hi) = self.sc.think_ms;
                    let think = self.rng.random_range(lo..=hi.max(lo));
                    self.schedule(self.now + think, Ev::ClientNext(c));
                }
            }
        }
    }

    /// Every planned compromise happened and its recovery completed.
    fn proactive_done(&self) -> bool {
        self.sc.proactive.as_ref().is_none_or(|p| {
            self.stats.compromises >= p.compromises as u64
                && self.awaiting_recovery.is_none()
                && self.compromised.is_none()
        })
    }

    fn all_clients_done(&self) -> bool {
        self.clients
            .iter()
            .all(|c| c.done >= self.sc.ops_per_client)
    }

    /// Runs to completion: all correct clients finished, or the liveness deadline passed.
    pub fn run(self) -> Outcome {
        redoubt_crypto::body::audit::start(self.sc.mutant == redoubt_core::Mutant::StreamBodies);
        let outcome = self.run_audited();
        redoubt_crypto::body::audit::stop();
        outcome
    }

    fn run_audited(mut self) -> Outcome {
        let deadline = self.sc.heal_ms + self.sc.liveness_bound_ms;
        let mut finished_at = None;
        let mut stopped = false;
        while let Some(Reverse((Key(at, _), slot))) = self.queue.pop() {
            let ev = self.events[slot].take().expect("scheduled event present");
            self.free.push(slot);
            self.now = at;
            if let Some(h) = &self.holder_faults {
                h.clock.store(at, std::sync::atomic::Ordering::Relaxed);
            }
            if self.sc.stop_ms.is_some_and(|t| self.now > t) {
                stopped = true;
                break;
            }
            if self.now > deadline {
                break;
            }
            self.handle(ev);
            self.processed += 1;
            if let Some(v) = self.nonces.check() {
                self.violation(v);
            }
            if self.processed.is_multiple_of(FOOTPRINT_EVERY) {
                self.check_footprints();
                self.check_watermarks();
                self.check_execution_acked();
            }
            if !self.violations.is_empty() && !self.trace_on {
                break;
            }
            if finished_at.is_none() && self.all_clients_done() && self.proactive_done() {
                finished_at = Some(self.now);
            }
            // Let the cluster settle briefly after the last operation so checkpoints compare.
            if finished_at.is_some_and(|t| self.now > t + 1000) {
                break;
            }
        }
        self.end_of_run_checks(stopped);
        let (down, refused, bad_shares) = self.filter_totals();
        self.stats.firewall_replies = down;
        self.stats.firewall_blocked = refused + bad_shares;
        Outcome {
            scenario: self.sc.name.clone(),
            seed: self.sc.seed,
            violations: self.violations,
            stats: self.stats,
            trace: self.trace,
        }
    }
}

#[cfg(test)]
mod tests;
