//! Scenarios: a seed decides the topology, the links' behaviour, the modes, which nodes are
//! faulty and how, and the traffic between correct nodes.

use crate::config::{Config, Mutant, Recovery, RoutingMode};
use crate::types::{Delivery, NodeId};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One simulated overlay link (both directions behave alike).
#[derive(Clone, Debug)]
pub struct SimLink {
    pub a: NodeId,
    pub b: NodeId,
    pub latency_ms: u64,
    /// Extra delay drawn per datagram in `0..=jitter_ms` (reorders datagrams).
    pub jitter_ms: u64,
    pub loss_permille: u32,
    pub dup_permille: u32,
}

/// What a faulty node does to the traffic it relays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Drops every data packet it relays (and, if `acks`, every ack).
    DropAll { acks: bool },
    /// Drops each relayed data packet and ack with this probability (per mille).
    DropFraction(u32),
    /// Changes a byte of relayed data packets.
    Modify(u32),
    /// Sends relayed data packets to another neighbour than the route says.
    Misroute(u32),
    /// Drops relayed data packets and sends back forged acks (probe layers and destination
    /// ack with made-up MACs, claiming delivery).
    ForgeAcks(u32),
    /// Holds relayed data packets for `ms` before passing them on.
    Delay { ms: u64, permille: u32 },
    /// Injects forged data claiming other sources, garbage and replayed datagrams, and floods
    /// the overlay with its own traffic.
    Inject,
    /// Member of a colluding pair joined by a private low-latency link (a wormhole both
    /// advertise, which attracts routes); drops packets crossing to the partner.
    Collude { partner: NodeId, permille: u32 },
    /// Stops at `at_ms` (a benign crash).
    Crash { at_ms: u64 },
}

impl Behaviour {
    pub fn name(&self) -> &'static str {
        match self {
            Behaviour::DropAll { .. } => "drop-all",
            Behaviour::DropFraction(_) => "drop-fraction",
            Behaviour::Modify(_) => "modify",
            Behaviour::Misroute(_) => "misroute",
            Behaviour::ForgeAcks(_) => "forge-acks",
            Behaviour::Delay { .. } => "delay",
            Behaviour::Inject => "inject",
            Behaviour::Collude { .. } => "collude",
            Behaviour::Crash { .. } => "crash",
        }
    }
}

/// Traffic of one correct flow: `count` messages, one every `interval_ms` from `start_ms`.
#[derive(Clone, Debug)]
pub struct FlowSpec {
    pub src: NodeId,
    pub dst: NodeId,
    pub delivery: Delivery,
    pub count: u32,
    pub start_ms: u64,
    pub interval_ms: u64,
    pub payload_bytes: usize,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub topology: &'static str,
    pub cfg: Config,
    pub links: Vec<SimLink>,
    pub faulty: BTreeMap<NodeId, Behaviour>,
    pub flows: Vec<FlowSpec>,
    /// Extra traffic submitted by faulty `Inject` nodes (a flood of their own).
    pub flood_interval_ms: u64,
    pub traffic_start_ms: u64,
    pub traffic_end_ms: u64,
    /// The run stops here at the latest; every message between correct nodes joined by a
    /// correct path must be delivered by then.
    pub end_ms: u64,
    /// Whether every accusation must name a link with a faulty end (ODSBR with benign loss
    /// recovered by the links, so that benign loss stays below τ).
    pub check_accusations: bool,
    /// Whether a source that keeps losing packets to faulty nodes must accuse a link within
    /// `localise_ms`.
    pub check_localisation: bool,
    pub localise_ms: u64,
}

impl Scenario {
    pub fn nodes(&self) -> u16 {
        self.cfg.nodes_count
    }

    pub fn is_faulty(&self, n: NodeId) -> bool {
        self.faulty.contains_key(&n)
    }

    pub fn neighbours(&self, n: NodeId) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self
            .links
            .iter()
            .filter_map(|l| {
                if l.a == n {
                    Some(l.b)
                } else if l.b == n {
                    Some(l.a)
                } else {
                    None
                }
            })
            .collect();
        v.sort();
        v
    }

    /// Whether `a` and `b` are joined by a path of correct nodes.
    pub fn correct_path_exists(&self, a: NodeId, b: NodeId) -> bool {
        if self.is_faulty(a) || self.is_faulty(b) {
            return false;
        }
        let mut seen = BTreeSet::from([a]);
        let mut todo = VecDeque::from([a]);
        while let Some(x) = todo.pop_front() {
            if x == b {
                return true;
            }
            for y in self.neighbours(x) {
                if !self.is_faulty(y) && seen.insert(y) {
                    todo.push_back(y);
                }
            }
        }
        false
    }

    pub fn describe(&self) -> String {
        let faulty: Vec<String> = self
            .faulty
            .iter()
            .map(|(n, b)| format!("{n}:{}", b.name()))
            .collect();
        format!(
            "{} n={} links={} {:?}/{:?} faulty=[{}] flows={}",
            self.topology,
            self.nodes(),
            self.links.len(),
            self.cfg.routing,
            self.cfg.recovery,
            faulty.join(","),
            self.flows.len()
        )
    }

    /// The scenario of `seed`.
    pub fn generate(seed: u64, mutant: Mutant) -> Scenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0e7e_41a7_5eed);
        let kind = rng.random_range(0..100u32);
        let (routing, recovery, byzantine) = match kind {
            0..55 => (RoutingMode::Odsbr, Recovery::HopByHop, true),
            55..65 => (RoutingMode::Odsbr, Recovery::HopByHop, false),
            65..70 => (RoutingMode::Odsbr, Recovery::EndToEnd, false),
            70..85 => (RoutingMode::LinkState, Recovery::HopByHop, false),
            _ => (RoutingMode::LinkState, Recovery::EndToEnd, false),
        };
        let (topology, edges) = topology(&mut rng);
        let n = 1 + edges.iter().map(|&(a, b)| a.max(b)).max().expect("edges") as u16;
        let lossless = routing == RoutingMode::Odsbr && recovery == Recovery::EndToEnd;
        let mut links: Vec<SimLink> = edges
            .iter()
            .map(|&(a, b)| SimLink {
                a: NodeId(a as u16),
                b: NodeId(b as u16),
                latency_ms: rng.random_range(2..=20),
                jitter_ms: rng.random_range(0..=5),
                loss_permille: match (lossless, routing) {
                    (true, _) => 0,
                    (false, RoutingMode::Odsbr) => rng.random_range(0..=10),
                    (false, RoutingMode::LinkState) => rng.random_range(0..=40),
                },
                dup_permille: rng.random_range(0..=10),
            })
            .collect();
        let mut cfg = Config::new(n, routing, recovery);
        cfg.mutant = mutant;
        let traffic_start_ms = 4_000;
        let mut sc = Scenario {
            seed,
            topology,
            cfg,
            links: Vec::new(),
            faulty: BTreeMap::new(),
            flows: Vec::new(),
            flood_interval_ms: rng.random_range(2..=10),
            traffic_start_ms,
            traffic_end_ms: traffic_start_ms,
            end_ms: 0,
            check_accusations: routing == RoutingMode::Odsbr,
            check_localisation: routing == RoutingMode::Odsbr && recovery == Recovery::HopByHop,
            localise_ms: 30_000,
        };
        sc.links = links.clone();
        // Faulty nodes.
        if byzantine {
            let f = if rng.random_bool(0.4) && n >= 6 { 2 } else { 1 };
            let chosen = pick_faulty(&sc, f, &mut rng);
            let collude = chosen.len() == 2 && rng.random_bool(0.3);
            for (i, &x) in chosen.iter().enumerate() {
                let b = if collude {
                    Behaviour::Collude {
                        partner: chosen[1 - i],
                        permille: rng.random_range(500..=1000),
                    }
                } else {
                    random_behaviour(&mut rng)
                };
                sc.faulty.insert(x, b);
            }
            if collude {
                let (a, b) = (chosen[0], chosen[1]);
                if !sc.neighbours(a).contains(&b) {
                    links.push(SimLink {
                        a,
                        b,
                        latency_ms: 1,
                        jitter_ms: 0,
                        loss_permille: 0,
                        dup_permille: 0,
                    });
                }
            }
        } else if rng.random_bool(0.4) {
            let x = pick_faulty(&sc, 1, &mut rng)[0];
            sc.faulty.insert(
                x,
                Behaviour::Crash {
                    at_ms: traffic_start_ms + rng.random_range(0..3_000),
                },
            );
        }
        sc.links = links;
        // Traffic between correct nodes; half of the flows cross a faulty node if they can.
        let correct: Vec<NodeId> = (0..n).map(NodeId).filter(|x| !sc.is_faulty(*x)).collect();
        let flows = rng.random_range(3..=6);
        for i in 0..flows {
            let want_crossing = i % 2 == 0 && !sc.faulty.is_empty();
            let mut pair = None;
            for _ in 0..30 {
                let s = correct[rng.random_range(0..correct.len())];
                let d = correct[rng.random_range(0..correct.len())];
                if s == d {
                    continue;
                }
                pair = Some((s, d));
                if !want_crossing || crosses_faulty(&sc, s, d) {
                    break;
                }
            }
            let Some((src, dst)) = pair else { continue };
            let count = rng.random_range(20..=70);
            let interval_ms = rng.random_range(15..=80);
            let start_ms = traffic_start_ms + rng.random_range(0..1_000);
            sc.traffic_end_ms = sc.traffic_end_ms.max(start_ms + count as u64 * interval_ms);
            sc.flows.push(FlowSpec {
                src,
                dst,
                delivery: if rng.random_bool(0.7) {
                    Delivery::Ordered
                } else {
                    Delivery::Unordered
                },
                count,
                start_ms,
                interval_ms,
                payload_bytes: rng.random_range(1..=300),
            });
        }
        sc.end_ms = sc.traffic_end_ms + if byzantine { 75_000 } else { 30_000 };
        sc
    }
}

fn random_behaviour(rng: &mut ChaCha8Rng) -> Behaviour {
    match rng.random_range(0..8u32) {
        0 | 1 => Behaviour::DropAll {
            acks: rng.random_bool(0.5),
        },
        2 => Behaviour::DropFraction(rng.random_range(300..=900)),
        3 => Behaviour::Modify(rng.random_range(300..=1000)),
        4 => Behaviour::Misroute(rng.random_range(300..=1000)),
        5 => Behaviour::ForgeAcks(rng.random_range(500..=1000)),
        6 => Behaviour::Delay {
            ms: rng.random_range(100..=4_000),
            permille: rng.random_range(300..=1000),
        },
        _ => Behaviour::Inject,
    }
}

/// Picks `f` nodes, favouring well-connected ones (they sit on many routes), keeping the
/// correct nodes connected when possible.
fn pick_faulty(sc: &Scenario, f: usize, rng: &mut ChaCha8Rng) -> Vec<NodeId> {
    let n = sc.nodes();
    let mut best = Vec::new();
    for attempt in 0..30 {
        let mut chosen: Vec<NodeId> = Vec::new();
        while chosen.len() < f {
            let x = NodeId(rng.random_range(0..n));
            let degree = sc.neighbours(x).len();
            if chosen.contains(&x) || (degree < 2 && attempt < 20 && rng.random_bool(0.8)) {
                continue;
            }
            chosen.push(x);
        }
        chosen.sort();
        let mut probe = sc.clone();
        for &c in &chosen {
            probe.faulty.insert(c, Behaviour::Inject);
        }
        let correct: Vec<NodeId> = (0..n)
            .map(NodeId)
            .filter(|x| !probe.is_faulty(*x))
            .collect();
        let connected = correct
            .iter()
            .all(|&x| probe.correct_path_exists(correct[0], x));
        best = chosen;
        if connected {
            break;
        }
    }
    best
}

/// Whether the lowest-latency path from `s` to `d` (ignoring faults) passes a faulty node.
fn crosses_faulty(sc: &Scenario, s: NodeId, d: NodeId) -> bool {
    let n = sc.nodes() as usize;
    let mut dist = vec![u64::MAX; n];
    let mut prev = vec![None; n];
    let mut done = vec![false; n];
    dist[s.index()] = 0;
    for _ in 0..n {
        let Some(u) = (0..n)
            .filter(|&i| !done[i] && dist[i] < u64::MAX)
            .min_by_key(|&i| dist[i])
        else {
            break;
        };
        done[u] = true;
        for l in &sc.links {
            let (x, y) = (l.a.index(), l.b.index());
            let v = if x == u {
                y
            } else if y == u {
                x
            } else {
                continue;
            };
            if dist[u] + l.latency_ms < dist[v] {
                dist[v] = dist[u] + l.latency_ms;
                prev[v] = Some(u);
            }
        }
    }
    let mut at = d.index();
    while let Some(p) = prev[at] {
        if p != s.index() && sc.is_faulty(NodeId(p as u16)) {
            return true;
        }
        at = p;
    }
    false
}

/// Edges of a random topology, named.
fn topology(rng: &mut ChaCha8Rng) -> (&'static str, Vec<(usize, usize)>) {
    match rng.random_range(0..5u32) {
        // The report's chain A-B-C-D-E-F (Spines Fig. 1), with a bypass half of the time.
        0 => {
            let mut e: Vec<(usize, usize)> = (0..5).map(|i| (i, i + 1)).collect();
            if rng.random_bool(0.5) {
                e.extend([(0, 6), (6, 7), (7, 5)]);
                ("chain-bypass", e)
            } else {
                ("chain", e)
            }
        }
        1 => {
            let n = rng.random_range(5..=10);
            let mut e: Vec<(usize, usize)> = (0..n).map(|i| (i, (i + 1) % n)).collect();
            for _ in 0..rng.random_range(1..=3) {
                let a = rng.random_range(0..n);
                let b = rng.random_range(0..n);
                if a != b && !e.contains(&(a, b)) && !e.contains(&(b, a)) {
                    e.push((a, b));
                }
            }
            ("ring-chords", e)
        }
        2 => {
            let k = rng.random_range(3..=5);
            let mut e = Vec::new();
            for i in 0..k {
                e.push((i, k + i));
                if i + 1 < k {
                    e.push((i, i + 1));
                    e.push((k + i, k + i + 1));
                }
            }
            ("ladder", e)
        }
        3 => {
            let mut e = Vec::new();
            for r in 0..3 {
                for c in 0..3 {
                    let i = 3 * r + c;
                    if c < 2 {
                        e.push((i, i + 1));
                    }
                    if r < 2 {
                        e.push((i, i + 3));
                    }
                }
            }
            ("grid", e)
        }
        _ => {
            let n = rng.random_range(5..=10);
            let mut e = Vec::new();
            for i in 1..n {
                e.push((rng.random_range(0..i), i));
            }
            let extra = rng.random_range(1..=n / 2 + 1);
            for _ in 0..extra {
                let a = rng.random_range(0..n);
                let b = rng.random_range(0..n);
                if a != b && !e.contains(&(a, b)) && !e.contains(&(b, a)) {
                    e.push((a, b));
                }
            }
            ("random", e)
        }
    }
}
