//! The pure core under a simulated LAN: members crash, restart, leave, join, partition and
//! merge while datagrams are delayed, reordered and lost, all driven by a seeded RNG so every
//! failure replays. Checkers look only at what the hosts hold (the Acquire/Release effects):
//!
//! - at no time is an address held twice within one connected component for longer than the
//!   settle time (duplicates across partitions are the algorithm's intended behaviour);
//! - once quiet, every component has one view, every address is held by exactly one of its
//!   members, and the members' counts differ by at most one.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_crypto::MacKey;
use redoubt_vip::machine::Phase;
use redoubt_vip::{Cidr, Effect, Input, MachineConfig, Wackamole};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

const TICK_MS: u64 = 10;
const HEARTBEAT_MS: u64 = 100;
const SUSPECT_MS: u64 = 400;
const MATURE_MS: u64 = 600;

#[derive(Clone, Debug)]
enum Ev {
    Crash(usize),
    Start(usize),
    Leave(usize),
    /// A partition label per member; members with equal labels reach each other.
    Partition(Vec<u8>),
    Heal,
    /// The member receives nothing (its sends still arrive): one-way connectivity.
    Deaf(usize),
    Hear(usize),
    Loss(f64),
    CheckStable,
}

struct Node {
    id: u32,
    machine: Option<Wackamole>,
    /// What the host has configured, from the effects.
    held: BTreeSet<usize>,
    tick_offset: u64,
}

struct Sim {
    rng: ChaCha8Rng,
    now: u64,
    nodes: Vec<Node>,
    addresses: Vec<Cidr>,
    key: MacKey,
    labels: Vec<u8>,
    deaf: Vec<bool>,
    loss: f64,
    delay_ms_max: u64,
    in_flight: BTreeMap<(u64, u64), (usize, usize, Vec<u8>)>,
    sent: u64,
    settle_ms: u64,
    /// Fail an acquisition of an address that a member with the same view installed still
    /// holds: balancing must wait for the old holders' release. (Acquiring what a member in
    /// another view holds is a merge in progress, which conflict resolution removes.)
    strict_acquire: bool,
    dup_since: HashMap<usize, u64>,
    /// (time, node, address) of every acquisition.
    acquired: Vec<(u64, usize, usize)>,
    trace: Vec<String>,
}

impl Sim {
    fn new(seed: u64, members: usize, addresses: usize, settle_ms: u64) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let nodes = (0..members)
            .map(|i| Node {
                id: 3 * i as u32 + 1, // ids need not be contiguous
                machine: None,
                held: BTreeSet::new(),
                tick_offset: rng.random_range(0..TICK_MS),
            })
            .collect();
        Sim {
            rng,
            now: 0,
            nodes,
            addresses: (0..addresses)
                .map(|i| Cidr::new(Ipv4Addr::new(10, 213, 0, 100 + i as u8), 24))
                .collect(),
            key: MacKey::derive("sim", b"group key material"),
            labels: vec![0; members],
            deaf: vec![false; members],
            loss: 0.0,
            delay_ms_max: 2,
            in_flight: BTreeMap::new(),
            sent: 0,
            settle_ms,
            strict_acquire: true,
            dup_since: HashMap::new(),
            acquired: Vec::new(),
            trace: Vec::new(),
        }
    }

    fn index_of_id(&self, id: u32) -> usize {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .expect("known id")
    }

    /// The component a member is in: its partition label, or one of its own when deaf.
    fn component(&self, i: usize) -> u16 {
        if self.deaf[i] {
            1000 + i as u16
        } else {
            u16::from(self.labels[i])
        }
    }

    fn addr_index(&self, a: &Cidr) -> usize {
        self.addresses
            .iter()
            .position(|x| x == a)
            .expect("known address")
    }

    fn note(&mut self, s: String) {
        if self.trace.len() >= 400 {
            self.trace.remove(0);
        }
        self.trace.push(format!("{:>6} {s}", self.now));
    }

    fn fail(&self, msg: String) -> ! {
        panic!(
            "at {} ms: {msg}\nlast events:\n{}",
            self.now,
            self.trace.join("\n")
        );
    }

    fn event(&mut self, ev: Ev) {
        self.note(format!("EVENT {ev:?}"));
        match ev {
            Ev::Crash(i) => {
                self.nodes[i].machine = None;
                self.nodes[i].held.clear(); // the host is gone, and its addresses with it
            }
            Ev::Start(i) => {
                assert!(self.nodes[i].machine.is_none(), "start of a running member");
                let members: Vec<u32> = self.nodes.iter().map(|n| n.id).collect();
                let cfg = MachineConfig {
                    me: self.nodes[i].id,
                    incarnation: self.now + 1,
                    members,
                    addresses: self.addresses.clone(),
                    heartbeat_ms: HEARTBEAT_MS,
                    suspect_ms: SUSPECT_MS,
                    mature_ms: MATURE_MS,
                    key: self.key.clone(),
                };
                self.nodes[i].machine = Some(Wackamole::new(cfg));
                self.nodes[i].held.clear();
            }
            Ev::Leave(i) => {
                let Some(m) = self.nodes[i].machine.as_mut() else {
                    return;
                };
                let effects = m.handle(self.now, Input::Leave);
                self.apply(i, effects);
                if !self.nodes[i].held.is_empty() {
                    self.fail(format!("member {i} left still holding addresses"));
                }
                self.nodes[i].machine = None;
            }
            Ev::Partition(labels) => self.labels = labels,
            Ev::Heal => self.labels = vec![0; self.nodes.len()],
            Ev::Deaf(i) => self.deaf[i] = true,
            Ev::Hear(i) => self.deaf[i] = false,
            Ev::Loss(p) => self.loss = p,
            Ev::CheckStable => self.check_stable(),
        }
    }

    fn apply(&mut self, i: usize, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Send { to, bytes } => {
                    let j = self.index_of_id(to);
                    if self.labels[i] != self.labels[j] || self.rng.random_bool(self.loss) {
                        continue;
                    }
                    let at = self.now + self.rng.random_range(0..=self.delay_ms_max);
                    self.sent += 1;
                    self.in_flight.insert((at, self.sent), (i, j, bytes));
                }
                Effect::Acquire { addr } => {
                    let a = self.addr_index(&addr);
                    self.note(format!("node {i} acquires {a}"));
                    let view_of = |k: usize| {
                        self.nodes[k]
                            .machine
                            .as_ref()
                            .and_then(|m| m.view())
                            .map(|v| v.id)
                    };
                    let other = (0..self.nodes.len()).find(|j| {
                        *j != i
                            && self.component(*j) == self.component(i)
                            && self.nodes[*j].held.contains(&a)
                            && view_of(*j).is_some()
                            && view_of(*j) == view_of(i)
                    });
                    if let (true, Some(j)) = (self.strict_acquire, other) {
                        self.fail(format!(
                            "node {i} acquired {a}, which node {j} in the same view holds"
                        ));
                    }
                    if !self.nodes[i].held.insert(a) {
                        self.fail(format!("node {i} acquired {addr} twice"));
                    }
                    self.acquired.push((self.now, i, a));
                }
                Effect::Release { addr } => {
                    let a = self.addr_index(&addr);
                    self.note(format!("node {i} releases {a}"));
                    if !self.nodes[i].held.remove(&a) {
                        self.fail(format!("node {i} released {addr} it did not hold"));
                    }
                }
                Effect::AnnounceArp { addr } => {
                    let a = self.addr_index(&addr);
                    if !self.nodes[i].held.contains(&a) {
                        self.fail(format!("node {i} announced {addr} it does not hold"));
                    }
                }
                Effect::ViewInstalled {
                    view,
                    members,
                    proposed,
                } => self.note(format!(
                    "node {i} installs view {view} {members:?}{}",
                    if proposed { " (proposed)" } else { "" }
                )),
                Effect::Allocated { view, held, mature } => self.note(format!(
                    "node {i} allocated in {view}: {} addresses, mature {mature}",
                    held.len()
                )),
            }
        }
    }

    fn step(&mut self) {
        self.now += 1;
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (from, to, bytes) = entry.remove();
            if self.labels[from] != self.labels[to] || self.deaf[to] {
                continue;
            }
            if let Some(m) = self.nodes[to].machine.as_mut() {
                let effects = m.handle(self.now, Input::Datagram(&bytes));
                self.apply(to, effects);
            }
        }
        for i in 0..self.nodes.len() {
            if !(self.now + self.nodes[i].tick_offset).is_multiple_of(TICK_MS) {
                continue;
            }
            if let Some(m) = self.nodes[i].machine.as_mut() {
                let effects = m.handle(self.now, Input::Tick);
                self.apply(i, effects);
            }
        }
        self.check_safety();
    }

    /// No address held by two members of one connected component for longer than settle_ms.
    fn check_safety(&mut self) {
        for a in 0..self.addresses.len() {
            let mut per_label: HashMap<u16, usize> = HashMap::new();
            for (i, n) in self.nodes.iter().enumerate() {
                if n.machine.is_some() && n.held.contains(&a) {
                    *per_label.entry(self.component(i)).or_default() += 1;
                }
            }
            if per_label.values().any(|c| *c > 1) {
                let since = *self.dup_since.entry(a).or_insert(self.now);
                if self.now - since > self.settle_ms {
                    self.fail(format!(
                        "address {a} held twice in one component for {} ms (settle {} ms)",
                        self.now - since,
                        self.settle_ms
                    ));
                }
            } else {
                self.dup_since.remove(&a);
            }
        }
    }

    /// Every component: one view of exactly its running members, every address held once,
    /// balanced.
    fn check_stable(&self) {
        let labels: BTreeSet<u16> = (0..self.nodes.len()).map(|i| self.component(i)).collect();
        for label in labels {
            let up: Vec<usize> = (0..self.nodes.len())
                .filter(|i| self.component(*i) == label && self.nodes[*i].machine.is_some())
                .collect();
            if up.is_empty() {
                continue;
            }
            let ids: Vec<u32> = up.iter().map(|i| self.nodes[*i].id).collect();
            let mut views = BTreeSet::new();
            for i in &up {
                let m = self.nodes[*i].machine.as_ref().expect("up");
                let v = m
                    .view()
                    .unwrap_or_else(|| self.fail(format!("node {i} has no view")));
                let vm: Vec<u32> = v.members.iter().map(|x| x.id).collect();
                if vm != ids {
                    self.fail(format!("node {i}: view {vm:?}, component {ids:?}"));
                }
                if m.phase() != Phase::Run || !m.is_mature() {
                    self.fail(format!("node {i} not running and mature"));
                }
                let core: BTreeSet<usize> = m
                    .held_addresses()
                    .iter()
                    .map(|a| self.addr_index(a))
                    .collect();
                if core != self.nodes[*i].held {
                    self.fail(format!("node {i}: core and host disagree"));
                }
                views.insert(v.id);
            }
            if views.len() != 1 {
                self.fail(format!("component {ids:?} in several views: {views:?}"));
            }
            for a in 0..self.addresses.len() {
                let holders: Vec<usize> = up
                    .iter()
                    .copied()
                    .filter(|i| self.nodes[*i].held.contains(&a))
                    .collect();
                if holders.len() != 1 {
                    self.fail(format!(
                        "component {ids:?}: address {a} held by {holders:?}"
                    ));
                }
            }
            let counts: Vec<usize> = up.iter().map(|i| self.nodes[*i].held.len()).collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            if hi - lo > 1 {
                self.fail(format!("component {ids:?} unbalanced: {counts:?}"));
            }
        }
    }

    fn run(&mut self, events: &[(u64, Ev)], until_ms: u64) {
        let mut events: Vec<(u64, Ev)> = events.to_vec();
        events.sort_by_key(|(t, _)| *t);
        let mut next = 0;
        while self.now < until_ms {
            while next < events.len() && events[next].0 <= self.now {
                let ev = events[next].1.clone();
                self.event(ev);
                next += 1;
            }
            self.step();
        }
    }

    fn run_until(&mut self, until_ms: u64) {
        self.run(&[], until_ms);
    }

    /// How long after `t` the last of `addrs` was acquired by a member other than `by`.
    fn takeover_ms(&self, t: u64, by: usize, addrs: &BTreeSet<usize>) -> u64 {
        addrs
            .iter()
            .map(|a| {
                self.acquired
                    .iter()
                    .find(|(at, i, x)| *at >= t && *i != by && x == a)
                    .map(|(at, _, _)| at - t)
                    .unwrap_or_else(|| self.fail(format!("address {a} never taken over")))
            })
            .max()
            .unwrap_or(0)
    }
}

fn start_all(n: usize) -> Vec<(u64, Ev)> {
    (0..n).map(|i| (0, Ev::Start(i))).collect()
}

/// (name, members, addresses, loss, events, end).
type Scenario = (&'static str, usize, usize, f64, Vec<(u64, Ev)>, u64);

#[test]
fn scenarios() {
    let settle = SUSPECT_MS + 3 * HEARTBEAT_MS;
    let table: Vec<Scenario> = vec![
        ("steady", 3, 7, 0.0, vec![(2000, Ev::CheckStable)], 2500),
        (
            "crash",
            3,
            7,
            0.0,
            vec![(2000, Ev::Crash(1)), (4000, Ev::CheckStable)],
            4500,
        ),
        (
            "coordinator leaves",
            4,
            9,
            0.0,
            vec![(2000, Ev::Leave(0)), (2500, Ev::CheckStable)],
            3000,
        ),
        (
            "join",
            3,
            8,
            0.0,
            vec![(3000, Ev::Start(2)), (5000, Ev::CheckStable)],
            5500,
        ),
        (
            "partition and merge",
            3,
            6,
            0.0,
            vec![
                (2000, Ev::Partition(vec![0, 0, 1])),
                (4000, Ev::CheckStable),
                (5000, Ev::Heal),
                (7000, Ev::CheckStable),
            ],
            7500,
        ),
        (
            "restart inside the suspicion window",
            3,
            6,
            0.0,
            vec![
                (2000, Ev::Crash(1)),
                (2100, Ev::Start(1)),
                (4500, Ev::CheckStable),
            ],
            5000,
        ),
        (
            "lossy crash and merge",
            5,
            12,
            0.1,
            vec![
                (3000, Ev::CheckStable),
                (3100, Ev::Crash(4)),
                (6000, Ev::CheckStable),
                (6100, Ev::Partition(vec![0, 1, 0, 1, 0])),
                (9000, Ev::CheckStable),
                (9100, Ev::Heal),
                (12000, Ev::CheckStable),
            ],
            12500,
        ),
        ("one member", 1, 3, 0.0, vec![(1500, Ev::CheckStable)], 2000),
        (
            "deaf member",
            4,
            8,
            0.0,
            vec![
                (2000, Ev::Deaf(3)),
                (4000, Ev::CheckStable),
                (4100, Ev::Hear(3)),
                (6000, Ev::CheckStable),
            ],
            6500,
        ),
        (
            "deaf coordinator",
            3,
            5,
            0.0,
            vec![
                (2000, Ev::Deaf(0)),
                (4000, Ev::CheckStable),
                (4100, Ev::Hear(0)),
                (6000, Ev::CheckStable),
            ],
            6500,
        ),
    ];
    for (name, members, addresses, loss, events, end) in table {
        let mut sim = Sim::new(7, members, addresses, settle);
        sim.loss = loss;
        let mut all = start_all(members);
        if name == "join" {
            all.retain(|(_, e)| !matches!(e, Ev::Start(2)));
        }
        all.extend(events);
        sim.run(&all, end);
        println!("{name}: ok ({} datagrams)", sim.sent);
    }
}

#[test]
fn crash_fail_over_takes_about_the_suspicion_timeout() {
    let mut sim = Sim::new(1, 3, 6, SUSPECT_MS);
    sim.run(&start_all(3), 2000);
    sim.check_stable();
    let victim = 1;
    let held = sim.nodes[victim].held.clone();
    assert_eq!(held.len(), 2);
    sim.event(Ev::Crash(victim));
    sim.run_until(4000);
    let t = sim.takeover_ms(2000, victim, &held);
    println!("crash fail-over: {t} ms (heartbeat {HEARTBEAT_MS} ms, suspect {SUSPECT_MS} ms)");
    assert!(
        t >= SUSPECT_MS - HEARTBEAT_MS,
        "{t} ms: faster than suspicion allows"
    );
    assert!(t <= SUSPECT_MS + 2 * TICK_MS + 10, "{t} ms");
    sim.check_stable();
}

#[test]
fn voluntary_leave_fails_over_in_milliseconds() {
    for leaver in 0..3 {
        let mut sim = Sim::new(2 + leaver as u64, 3, 6, SUSPECT_MS);
        sim.run(&start_all(3), 2000);
        let held = sim.nodes[leaver].held.clone();
        sim.event(Ev::Leave(leaver));
        sim.run_until(3000);
        let t = sim.takeover_ms(2000, leaver, &held);
        println!("leave of member {leaver}: taken over in {t} ms");
        // Two datagram delays (at most 2 ms each here) and no timeout at all.
        assert!(t <= 10, "{t} ms");
        sim.check_stable();
    }
}

#[test]
fn a_merge_settles_within_a_few_heartbeats() {
    // Tight settle time: duplicates after a heal must go within 3 heartbeats.
    let mut sim = Sim::new(3, 4, 8, 3 * HEARTBEAT_MS);
    let mut events = start_all(4);
    events.push((2000, Ev::Partition(vec![0, 1, 0, 1])));
    sim.run(&events, 4000);
    sim.check_stable();
    // Both halves cover everything: 8 duplicates once healed.
    sim.event(Ev::Heal);
    sim.run_until(6000);
    sim.check_stable();
}

#[test]
fn an_immature_cluster_allocates_nothing_until_mature() {
    let mut sim = Sim::new(4, 3, 5, SUSPECT_MS);
    sim.run(&start_all(3), MATURE_MS - 50);
    for n in &sim.nodes {
        assert!(n.held.is_empty(), "nothing held before mature_ms");
        assert_eq!(n.machine.as_ref().unwrap().view().unwrap().members.len(), 3);
    }
    sim.run_until(MATURE_MS + 200);
    sim.check_stable();
    // A restarted member joins a mature group and is mature at once.
    sim.event(Ev::Crash(2));
    sim.run_until(MATURE_MS + 1000);
    sim.event(Ev::Start(2));
    sim.run_until(MATURE_MS + 1200);
    assert!(sim.nodes[2].machine.as_ref().unwrap().is_mature());
    sim.run_until(MATURE_MS + 1500);
    sim.check_stable();
}

/// Random schedules of crashes, restarts, leaves, partitions, heals and loss; at the end
/// everything heals and restarts, and the group must be stable.
#[test]
fn seeded_random_schedules() {
    let seeds: u64 = std::env::var("VIP_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    for seed in 0..seeds {
        let mut rng = ChaCha8Rng::seed_from_u64(1000 + seed);
        let members = rng.random_range(2..=5usize);
        let addresses = rng.random_range(1..=12usize);
        let settle = 2 * SUSPECT_MS + 3 * HEARTBEAT_MS;
        let mut sim = Sim::new(seed, members, addresses, settle);
        sim.delay_ms_max = rng.random_range(0..=5);
        let mut events = start_all(members);
        let mut t = 1000;
        let mut up = vec![true; members];
        for _ in 0..rng.random_range(5..=20) {
            t += rng.random_range(50..=1500u64);
            let i = rng.random_range(0..members);
            let ev = match rng.random_range(0..6) {
                0 if up[i] => {
                    up[i] = false;
                    Ev::Crash(i)
                }
                1 if up[i] => {
                    up[i] = false;
                    Ev::Leave(i)
                }
                0..=2 if !up[i] => {
                    up[i] = true;
                    Ev::Start(i)
                }
                3 => Ev::Partition((0..members).map(|_| rng.random_range(0..3u8)).collect()),
                4 => Ev::Heal,
                _ => Ev::Loss([0.0, 0.05, 0.2][rng.random_range(0..3)]),
            };
            events.push((t, ev));
        }
        t += 100;
        events.push((t, Ev::Heal));
        events.push((t, Ev::Loss(0.0)));
        for (i, u) in up.iter().enumerate() {
            if !u {
                events.push((t, Ev::Start(i)));
            }
        }
        let quiet = t + 2 * SUSPECT_MS + MATURE_MS + 500;
        events.push((quiet, Ev::CheckStable));
        sim.run(&events, quiet + 1);
        println!(
            "seed {seed}: {members} members, {addresses} addresses, {} events, {} datagrams",
            events.len(),
            sim.sent
        );
    }
}

/// Datagrams that are forged, damaged, replayed or garbage are refused and counted, and the
/// member keeps working.
#[test]
fn hostile_datagrams_are_counted_not_obeyed() {
    use redoubt_vip::wire::Reject;
    let mut sim = Sim::new(5, 3, 4, SUSPECT_MS);
    // Capture a real beat from member 0 to member 1 on the wire.
    sim.run(&start_all(3), 1500);
    sim.check_stable();
    let mut captured = None;
    for _ in 0..200 {
        sim.step();
        captured = sim
            .in_flight
            .values()
            .find(|(from, to, _)| *from == 0 && *to == 1)
            .map(|(_, _, bytes)| bytes.clone());
        if captured.is_some() {
            break;
        }
    }
    let beat = captured.expect("member 0 beats");
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let ids: Vec<u32> = sim.nodes.iter().map(|n| n.id).collect();
    let addresses = sim.addresses.clone();
    let target = sim.nodes[1].machine.as_mut().unwrap();
    let before = target.stats().rejected;
    // Replay: delivered once already (or just now), so refused.
    target.handle(sim.now, Input::Datagram(&beat));
    target.handle(sim.now, Input::Datagram(&beat));
    assert!(target.stats().rejected.get(Reject::Replayed) > before.get(Reject::Replayed));
    // Every single-bit corruption is refused.
    let rejected_before = target.stats().rejected.total();
    for i in 0..beat.len() {
        let mut b = beat.clone();
        b[i] ^= 1 << rng.random_range(0..8);
        let effects = target.handle(sim.now, Input::Datagram(&b));
        assert!(
            !effects.iter().any(|e| matches!(
                e,
                Effect::Acquire { .. } | Effect::Release { .. } | Effect::ViewInstalled { .. }
            )),
            "a corrupted datagram changed the allocation"
        );
    }
    assert_eq!(
        target.stats().rejected.total(),
        rejected_before + beat.len() as u64
    );
    // Random garbage of every length up to past the limit.
    for len in 0..2100 {
        let g: Vec<u8> = (0..len).map(|_| rng.random_range(0..=255u8)).collect();
        target.handle(sim.now, Input::Datagram(&g));
    }
    let r = target.stats().rejected;
    for reason in [
        Reject::BadMac,
        Reject::TooShort,
        Reject::TooLong,
        Reject::BadMagic,
    ] {
        assert!(r.get(reason) > 0, "{reason:?}: {:?}", r.nonzero());
    }
    // A member with another key is a stranger.
    let mut stranger = Wackamole::new(MachineConfig {
        me: ids[2],
        incarnation: 1,
        members: ids,
        addresses,
        heartbeat_ms: HEARTBEAT_MS,
        suspect_ms: SUSPECT_MS,
        mature_ms: MATURE_MS,
        key: MacKey::derive("sim", b"another key"),
    });
    let forged: Vec<Vec<u8>> = stranger
        .handle(sim.now, Input::Tick)
        .into_iter()
        .chain(stranger.handle(sim.now + 1000, Input::Leave))
        .filter_map(|e| match e {
            Effect::Send { bytes, .. } => Some(bytes),
            _ => None,
        })
        .collect();
    assert!(!forged.is_empty());
    let bad_mac = target.stats().rejected.get(Reject::BadMac);
    for f in &forged {
        target.handle(sim.now, Input::Datagram(f));
    }
    assert_eq!(
        target.stats().rejected.get(Reject::BadMac),
        bad_mac + forged.len() as u64
    );
    // Still part of a healthy group.
    let end = sim.now + 1000;
    sim.run_until(end);
    sim.check_stable();
}
