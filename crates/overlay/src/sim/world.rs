//! The simulated world: nodes, the network between them, virtual time and one seeded RNG.
//! Everything happens in one thread in event order, so a seed replays exactly.

use super::adversary::Adversary;
use super::scenario::{Behaviour, Scenario, SimLink};
use crate::keys::{key_map_for_tests, Keys};
use crate::node::{Effect, Event, Input, Node};
use crate::types::{Delivery, NodeId};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// A message handed to a correct node's application.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub at_ms: u64,
    pub src: NodeId,
    pub dst: NodeId,
    pub delivery: Delivery,
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// Key of one message: source, destination, delivery class, sequence number.
pub type MsgKey = (NodeId, NodeId, Delivery, u64);

/// What the checkers look at.
#[derive(Default)]
pub struct Observed {
    /// Accepted submissions: time and payload.
    pub accepted: BTreeMap<MsgKey, (u64, Vec<u8>)>,
    pub delivered: Vec<Delivered>,
    pub events: Vec<(u64, NodeId, Event)>,
    /// A problem of the run itself (runaway, busy loop).
    pub run_failure: Option<String>,
    pub end_ms: u64,
}

enum Kind {
    Datagram {
        to: NodeId,
        bytes: Vec<u8>,
    },
    Wake(NodeId),
    FlowSend {
        flow: usize,
        i: u32,
    },
    Flood(NodeId),
    Crash(NodeId),
    /// A crashed node comes back as a new incarnation with empty state.
    Restart(NodeId),
    Submit {
        node: NodeId,
        dst: NodeId,
        delivery: Delivery,
        payload: Vec<u8>,
    },
}

struct Ev {
    at: u64,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Ev) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Ev) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    fn cmp(&self, o: &Ev) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Events a run may take at most (a protocol that floods itself is a failure, not a hang).
const EVENTS_MAX: u64 = 20_000_000;
/// Wake-ups of one node at one instant (a deadline that never advances is a bug).
const SAME_INSTANT_WAKES_MAX: u32 = 1_000;

pub struct World {
    pub sc: Scenario,
    pub now_ms: u64,
    pub nodes: Vec<Option<Node>>,
    pub adversaries: BTreeMap<NodeId, Adversary>,
    net: BTreeMap<(NodeId, NodeId), SimLink>,
    heap: BinaryHeap<Reverse<Ev>>,
    seq: u64,
    wake: Vec<Option<u64>>,
    last_wake: Vec<(u64, u32)>,
    rng: ChaCha8Rng,
    pub obs: Observed,
    /// Accepted messages between correct nodes joined by a correct path, not yet delivered.
    outstanding: BTreeSet<MsgKey>,
    events: u64,
    /// Stop once traffic ended and nothing checkable is outstanding.
    pub stop_when_done: bool,
}

impl World {
    pub fn new(sc: Scenario) -> World {
        let n = sc.nodes();
        let master = sc.seed.to_le_bytes();
        let mut nodes = Vec::new();
        let mut adversaries = BTreeMap::new();
        for i in 0..n {
            let me = NodeId(i);
            let keys = key_map_for_tests(&master, me, n);
            let neighbours = sc.neighbours(me);
            let node = Node::new(sc.cfg.clone(), me, &neighbours, &keys, 1, 0)
                .expect("scenarios build valid nodes");
            nodes.push(Some(node));
            if let Some(b) = sc.faulty.get(&me) {
                if !matches!(b, Behaviour::Crash { .. }) {
                    let derived = Keys::new(me, n, &keys).expect("valid keys");
                    let link_keys = neighbours
                        .iter()
                        .map(|&x| (x, derived.with(x).expect("keyed").link.clone()))
                        .collect();
                    adversaries.insert(me, Adversary::new(me, b.clone(), link_keys, &sc.cfg));
                }
            }
        }
        let mut net = BTreeMap::new();
        for l in &sc.links {
            net.insert((l.a, l.b), l.clone());
            net.insert((l.b, l.a), l.clone());
        }
        let mut w = World {
            rng: ChaCha8Rng::seed_from_u64(sc.seed ^ 0x5171_0b5e_7a11),
            now_ms: 0,
            nodes,
            adversaries,
            net,
            heap: BinaryHeap::new(),
            seq: 0,
            wake: vec![None; n as usize],
            last_wake: vec![(u64::MAX, 0); n as usize],
            obs: Observed::default(),
            outstanding: BTreeSet::new(),
            events: 0,
            stop_when_done: true,
            sc,
        };
        for i in 0..n {
            w.schedule_wake(NodeId(i), 0);
        }
        for (i, f) in w.sc.flows.clone().iter().enumerate() {
            w.push(f.start_ms, Kind::FlowSend { flow: i, i: 0 });
        }
        for (&x, b) in &w.sc.faulty.clone() {
            match b {
                Behaviour::Crash { at_ms } => w.push(*at_ms, Kind::Crash(x)),
                Behaviour::Inject => w.push(w.sc.traffic_start_ms, Kind::Flood(x)),
                _ => {}
            }
        }
        w
    }

    fn push(&mut self, at: u64, kind: Kind) {
        self.seq += 1;
        self.heap.push(Reverse(Ev {
            at,
            seq: self.seq,
            kind,
        }));
    }

    fn schedule_wake(&mut self, n: NodeId, at: u64) {
        if self.wake[n.index()].is_none_or(|w| at < w) {
            self.wake[n.index()] = Some(at);
            self.push(at, Kind::Wake(n));
        }
    }

    /// Crashes correct node `node` at `at` and brings it back `down_ms` later with empty state
    /// (tests: a daemon restarted). The run's checks are the test's business then: messages
    /// to or from the node around the restart may be lost or delivered again.
    pub fn restart_at(&mut self, at: u64, node: NodeId, down_ms: u64) {
        self.push(at, Kind::Crash(node));
        self.push(at + down_ms, Kind::Restart(node));
    }

    /// Lets a host outside the scenario submit (tests).
    pub fn submit_at(
        &mut self,
        at: u64,
        node: NodeId,
        dst: NodeId,
        delivery: Delivery,
        payload: Vec<u8>,
    ) {
        self.push(
            at,
            Kind::Submit {
                node,
                dst,
                delivery,
                payload,
            },
        );
    }

    /// Runs until `until_ms`, or until done if `stop_when_done`.
    pub fn run(&mut self, until_ms: u64) {
        while let Some(Reverse(ev)) = self.heap.peek() {
            if ev.at > until_ms {
                break;
            }
            let Reverse(ev) = self.heap.pop().expect("peeked");
            self.now_ms = ev.at;
            self.events += 1;
            if self.events > EVENTS_MAX {
                self.obs.run_failure = Some(format!(
                    "runaway: {EVENTS_MAX} events by {} ms",
                    self.now_ms
                ));
                break;
            }
            self.handle(ev.kind);
            if self.obs.run_failure.is_some() {
                break;
            }
            if self.stop_when_done
                && self.now_ms >= self.sc.traffic_end_ms
                && self.outstanding.is_empty()
            {
                break;
            }
        }
        self.obs.end_ms = self.now_ms;
    }

    fn handle(&mut self, kind: Kind) {
        match kind {
            Kind::Datagram { to, bytes } => self.step(
                to,
                Input::Receive {
                    now_ms: self.now_ms,
                    bytes,
                },
            ),
            Kind::Wake(n) => {
                if self.wake[n.index()] != Some(self.now_ms) {
                    return; // superseded by an earlier wake-up
                }
                self.wake[n.index()] = None;
                let lw = &mut self.last_wake[n.index()];
                if lw.0 == self.now_ms {
                    lw.1 += 1;
                    if lw.1 > SAME_INSTANT_WAKES_MAX {
                        self.obs.run_failure =
                            Some(format!("{n} woken {} times at {} ms", lw.1, self.now_ms));
                        return;
                    }
                } else {
                    *lw = (self.now_ms, 1);
                }
                self.step(
                    n,
                    Input::Tick {
                        now_ms: self.now_ms,
                    },
                );
            }
            Kind::FlowSend { flow, i } => {
                let f = self.sc.flows[flow].clone();
                let mut payload = format!("{}:{flow}:{i}:", self.sc.seed).into_bytes();
                payload.resize(payload.len().max(f.payload_bytes), b'.');
                self.step(
                    f.src,
                    Input::Submit {
                        now_ms: self.now_ms,
                        dst: f.dst,
                        delivery: f.delivery,
                        payload,
                    },
                );
                if i + 1 < f.count {
                    self.push(
                        self.now_ms + f.interval_ms,
                        Kind::FlowSend { flow, i: i + 1 },
                    );
                }
            }
            Kind::Flood(x) => {
                let n = self.sc.nodes();
                let dst = NodeId(self.rng.random_range(0..n));
                if dst != x {
                    self.step(
                        x,
                        Input::Submit {
                            now_ms: self.now_ms,
                            dst,
                            delivery: Delivery::Unordered,
                            payload: vec![0xf1; 200],
                        },
                    );
                }
                if self.now_ms < self.sc.traffic_end_ms {
                    self.push(self.now_ms + self.sc.flood_interval_ms, Kind::Flood(x));
                }
            }
            Kind::Crash(x) => {
                self.nodes[x.index()] = None;
            }
            Kind::Restart(x) => {
                let n = self.sc.nodes();
                let keys = key_map_for_tests(&self.sc.seed.to_le_bytes(), x, n);
                let neighbours = self.sc.neighbours(x);
                // Incarnations grow with time, as the daemon's wall-clock ones do.
                let node = Node::new(
                    self.sc.cfg.clone(),
                    x,
                    &neighbours,
                    &keys,
                    2 + self.now_ms,
                    self.now_ms,
                )
                .expect("scenarios build valid nodes");
                self.nodes[x.index()] = Some(node);
                self.schedule_wake(x, self.now_ms);
            }
            Kind::Submit {
                node,
                dst,
                delivery,
                payload,
            } => self.step(
                node,
                Input::Submit {
                    now_ms: self.now_ms,
                    dst,
                    delivery,
                    payload,
                },
            ),
        }
    }

    fn step(&mut self, n: NodeId, input: Input) {
        let submitted = match &input {
            Input::Submit { payload, .. } => Some(payload.clone()),
            _ => None,
        };
        let Some(node) = self.nodes[n.index()].as_mut() else {
            return; // crashed
        };
        let effects = node.step(input);
        let deadline = node.next_deadline_ms();
        self.schedule_wake(n, deadline);
        for e in effects {
            match e {
                Effect::Send { to, bytes } => {
                    let outs = match self.adversaries.get_mut(&n) {
                        Some(adv) => adv.outgoing(self.now_ms, to, bytes, &mut self.rng),
                        None => vec![(to, bytes)],
                    };
                    for (to, b) in outs {
                        self.transmit(n, to, b);
                    }
                }
                Effect::Deliver {
                    src,
                    delivery,
                    seq,
                    payload,
                } => {
                    if !self.sc.is_faulty(n) {
                        self.outstanding.remove(&(src, n, delivery, seq));
                        self.obs.delivered.push(Delivered {
                            at_ms: self.now_ms,
                            src,
                            dst: n,
                            delivery,
                            seq,
                            payload,
                        });
                    }
                }
                Effect::Accepted { dst, delivery, seq } => {
                    let payload = submitted.clone().expect("accepted answers a submission");
                    let key = (n, dst, delivery, seq);
                    if !self.sc.is_faulty(n) && self.sc.correct_path_exists(n, dst) {
                        self.outstanding.insert(key);
                    }
                    self.obs.accepted.insert(key, (self.now_ms, payload));
                }
                Effect::Rejected { .. } => {}
                Effect::Event(ev) => self.obs.events.push((self.now_ms, n, ev)),
            }
        }
    }

    fn transmit(&mut self, from: NodeId, to: NodeId, bytes: Vec<u8>) {
        let Some(l) = self.net.get(&(from, to)) else {
            return;
        };
        let (latency, jitter, loss, dup) =
            (l.latency_ms, l.jitter_ms, l.loss_permille, l.dup_permille);
        if self.rng.random_range(0..1000) < loss {
            return;
        }
        let copies = if self.rng.random_range(0..1000) < dup {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let at = self.now_ms + latency + self.rng.random_range(0..=jitter);
            self.push(
                at,
                Kind::Datagram {
                    to,
                    bytes: bytes.clone(),
                },
            );
        }
    }

    /// Messages accepted between correct nodes joined by a correct path, not yet delivered.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }
}
