//! The report's worked example (Spines §3.2, §3.5): a chain A-B-C-D-E-F of five 10 ms links,
//! loss on C-D, a constant-rate ordered stream from A to F; how many messages are delayed more
//! than 60 ms and 100 ms with hop-by-hop recovery and with end-to-end recovery. The paper
//! measured over 27% / 18% end-to-end (TCP) against about 3% / 1% hop-by-hop at 1% loss; this
//! model has no congestion control, so only the shape, not the numbers, should match.

use super::scenario::{FlowSpec, Scenario, SimLink};
use super::world::World;
use crate::config::{Config, Recovery, RoutingMode};
use crate::types::{Delivery, NodeId};
use std::collections::BTreeMap;

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
    let start = 3_000;
    let sc = Scenario {
        seed,
        topology: "chain",
        cfg,
        links,
        faulty: BTreeMap::new(),
        flows: vec![FlowSpec {
            src: NodeId(0),
            dst: NodeId(5),
            delivery: Delivery::Ordered,
            count,
            start_ms: start,
            interval_ms,
            payload_bytes: 1_000,
        }],
        flood_interval_ms: 10,
        traffic_start_ms: start,
        traffic_end_ms: start + count as u64 * interval_ms,
        end_ms: start + count as u64 * interval_ms + 60_000,
        check_accusations: false,
        check_localisation: false,
        localise_ms: 0,
    };
    let end = sc.end_ms;
    let mut w = World::new(sc);
    w.run(end);
    let delays: Vec<u64> = w
        .obs
        .delivered
        .iter()
        .map(|d| {
            let (sent, _) = w.obs.accepted[&(d.src, d.dst, d.delivery, d.seq)];
            d.at_ms - sent
        })
        .collect();
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
