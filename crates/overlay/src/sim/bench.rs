//! The report's worked example (Spines §3.2, §3.5): a chain A-B-C-D-E-F of five 10 ms links,
//! loss on C-D, a constant-rate ordered stream from A to F; how many messages are delayed more
//! than 60 ms and 100 ms with hop-by-hop recovery and with end-to-end recovery. The paper
//! measured over 27% / 18% end-to-end (TCP) against about 3% / 1% hop-by-hop at 1% loss; this
//! model has no congestion control, so only the shape, not the numbers, should match.

use super::scenario::{Behaviour, FlowSpec, Scenario, SimLink};
use super::world::World;
use crate::config::{Config, Recovery, RoutingMode};
use crate::node::Event;
use crate::types::{Delivery, NodeId};
use std::collections::BTreeMap;

/// A scenario with one ordered stream of 1,000-byte messages from `ends.0` to `ends.1`,
/// starting at 3 s once routes settled, and a minute to deliver what is left after it.
#[allow(clippy::too_many_arguments)]
fn one_stream(
    seed: u64,
    topology: &'static str,
    cfg: Config,
    links: Vec<SimLink>,
    faulty: BTreeMap<NodeId, Behaviour>,
    ends: (NodeId, NodeId),
    count: u32,
    interval_ms: u64,
) -> Scenario {
    let start = 3_000;
    let traffic_end = start + count as u64 * interval_ms;
    Scenario {
        seed,
        topology,
        cfg,
        links,
        faulty,
        flows: vec![FlowSpec {
            src: ends.0,
            dst: ends.1,
            delivery: Delivery::Ordered,
            count,
            start_ms: start,
            interval_ms,
            payload_bytes: 1_000,
        }],
        flood_interval_ms: 10,
        traffic_start_ms: start,
        traffic_end_ms: traffic_end,
        end_ms: traffic_end + 60_000,
        check_accusations: false,
        check_localisation: false,
        localise_ms: 0,
    }
}

/// Delay of every delivered message, in delivery order, with its delivery time.
fn delays(w: &World) -> impl Iterator<Item = (u64, u64)> + '_ {
    w.obs.delivered.iter().map(|d| {
        let (sent, _) = w.obs.accepted[&(d.src, d.dst, d.delivery, d.seq)];
        (d.at_ms, d.at_ms - sent)
    })
}

/// Delay distribution of one run.
#[derive(Clone, Debug)]
pub struct DelayStats {
    pub recovery: Recovery,
    pub sent: usize,
    pub delivered: usize,
    pub over_60ms_permille: u32,
    pub over_100ms_permille: u32,
    pub mean_ms: f64,
    pub max_ms: u64,
}

/// Runs the chain with `loss_permille` on C-D (both directions), `count` messages of 1000
/// bytes every `interval_ms` (16 ms is the paper's 500 Kbps).
pub fn chain_delay(
    recovery: Recovery,
    loss_permille: u32,
    interval_ms: u64,
    count: u32,
    seed: u64,
) -> DelayStats {
    let links = (0..5u16)
        .map(|i| SimLink {
            a: NodeId(i),
            b: NodeId(i + 1),
            latency_ms: 10,
            jitter_ms: 0,
            loss_permille: if i == 2 { loss_permille } else { 0 },
            dup_permille: 0,
        })
        .collect();
    let mut cfg = Config::new(6, RoutingMode::LinkState, recovery);
    cfg.flow_window_msgs_max = 64;
    cfg.reorder_msgs_max = 128;
    let sc = one_stream(
        seed,
        "chain",
        cfg,
        links,
        BTreeMap::new(),
        (NodeId(0), NodeId(5)),
        count,
        interval_ms,
    );
    let end = sc.end_ms;
    let mut w = World::new(sc);
    w.run(end);
    let delays: Vec<u64> = delays(&w).map(|(_, d)| d).collect();
    let n = delays.len().max(1) as u64;
    DelayStats {
        recovery,
        sent: w.obs.accepted.len(),
        delivered: delays.len(),
        over_60ms_permille: (delays.iter().filter(|&&d| d > 60).count() as u64 * 1000 / n) as u32,
        over_100ms_permille: (delays.iter().filter(|&&d| d > 100).count() as u64 * 1000 / n) as u32,
        mean_ms: delays.iter().sum::<u64>() as f64 / n as f64,
        max_ms: delays.iter().copied().max().unwrap_or(0),
    }
}

/// One phase of [`byzantine_reroute`].
#[derive(Clone, Debug)]
pub struct Phase {
    pub name: &'static str,
    pub from_ms: u64,
    pub to_ms: u64,
    /// Messages delivered to the destination during the phase, per second.
    pub delivered_per_s: f64,
    /// Mean delay of the messages delivered during the phase.
    pub mean_delay_ms: f64,
}

/// Outcome of [`byzantine_reroute`].
#[derive(Clone, Debug)]
pub struct ByzantineStats {
    pub sent: usize,
    pub delivered: usize,
    /// From the fault's start to the source's first accusation.
    pub localise_ms: Option<u64>,
    pub accusations: usize,
    pub route_changes: usize,
    pub phases: Vec<Phase>,
    pub max_delay_ms: u64,
    /// The source's events after the fault (route changes, probes, accusations), timed.
    pub source_events: Vec<(u64, Event)>,
}

/// The routing experiment of `redoubt bench overlay` in the simulator: four nodes, 0-1-3 over
/// 10 ms links and 0-2-3 over `alt_latency_ms` links (the benchmark's 11), an ordered stream of 1,000-byte messages every
/// `interval_ms` from 0 to 3 for `secs` seconds; node 1 drops `drop_permille` of the data
/// packets and acks it forwards from `fault_at_s` on.
pub fn byzantine_reroute(
    drop_permille: u32,
    interval_ms: u64,
    secs: u64,
    fault_at_s: u64,
    alt_latency_ms: u64,
    seed: u64,
) -> ByzantineStats {
    let link = |a: u16, b: u16, latency_ms: u64| SimLink {
        a: NodeId(a),
        b: NodeId(b),
        latency_ms,
        jitter_ms: 0,
        loss_permille: 0,
        dup_permille: 0,
    };
    let links = vec![
        link(0, 1, 10),
        link(1, 3, 10),
        link(0, 2, alt_latency_ms),
        link(2, 3, alt_latency_ms),
    ];
    let cfg = Config::new(4, RoutingMode::Odsbr, Recovery::HopByHop);
    let count = (secs * 1_000 / interval_ms) as u32;
    let sc = one_stream(
        seed,
        "byzantine-bench",
        cfg,
        links,
        BTreeMap::from([(NodeId(1), Behaviour::DropFraction(drop_permille))]),
        (NodeId(0), NodeId(3)),
        count,
        interval_ms,
    );
    let (start, traffic_end) = (sc.traffic_start_ms, sc.traffic_end_ms);
    let fault_at = start + fault_at_s * 1_000;
    let end = sc.end_ms;
    let mut w = World::new(sc);
    w.adversaries
        .get_mut(&NodeId(1))
        .expect("node 1 is faulty")
        .active_from_ms = fault_at;
    w.run(end);
    let source_events = || {
        w.obs
            .events
            .iter()
            .filter(|(_, n, _)| *n == NodeId(0))
            .map(|(t, _, e)| (*t, e))
    };
    let accused_at: Vec<u64> = source_events()
        .filter(|(_, e)| matches!(e, Event::Accused { .. }))
        .map(|(t, _)| t)
        .collect();
    let route_changes = source_events()
        .filter(|(t, e)| *t >= fault_at && matches!(e, Event::RouteChanged { .. }))
        .count();
    let first_accusation = accused_at.iter().copied().find(|&t| t >= fault_at);
    let settle = first_accusation.unwrap_or(traffic_end).min(traffic_end);
    let mut phases = vec![
        ("before", start, fault_at),
        ("fault to accusation", fault_at, settle),
        ("after the accusation", settle, traffic_end),
    ];
    phases.retain(|p| p.2 > p.1);
    let phases = phases
        .into_iter()
        .map(|(name, from_ms, to_ms)| {
            let delays: Vec<u64> = delays(&w)
                .filter(|(at, _)| (from_ms..to_ms).contains(at))
                .map(|(_, d)| d)
                .collect();
            let n = delays.len();
            Phase {
                name,
                from_ms,
                to_ms,
                delivered_per_s: n as f64 * 1_000.0 / (to_ms - from_ms) as f64,
                mean_delay_ms: delays.iter().sum::<u64>() as f64 / n.max(1) as f64,
            }
        })
        .collect();
    ByzantineStats {
        sent: w.obs.accepted.len(),
        delivered: w.obs.delivered.len(),
        localise_ms: first_accusation.map(|t| t - fault_at),
        accusations: accused_at.len(),
        route_changes,
        phases,
        source_events: source_events()
            .filter(|(t, _)| *t >= fault_at)
            .map(|(t, e)| (t, e.clone()))
            .collect(),
        max_delay_ms: delays(&w).map(|(_, d)| d).max().unwrap_or(0),
    }
}
