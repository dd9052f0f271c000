//! A daemon restarts with empty state: flows to and from it carry on. The restarted
//! destination learns from each packet where its source's flow stands (everything below
//! `flow_base` was acknowledged), so it neither waits for messages its earlier incarnation
//! already took nor refuses the source's current ones as beyond its reorder window; a
//! restarted source starts a new flow under its new incarnation.

use redoubt_overlay::sim::scenario::{FlowSpec, Scenario, SimLink};
use redoubt_overlay::sim::world::World;
use redoubt_overlay::types::{Delivery, NodeId};
use redoubt_overlay::{Config, Recovery, RoutingMode};
use std::collections::{BTreeMap, BTreeSet};

const RESTART_MS: u64 = 10_000;
const DOWN_MS: u64 = 2_000;

fn run(routing: RoutingMode, seed: u64) -> World {
    let link = |a: u16, b: u16| SimLink {
        a: NodeId(a),
        b: NodeId(b),
        latency_ms: 10,
        jitter_ms: 2,
        loss_permille: 10,
        dup_permille: 5,
    };
    let flow = |src: u16, dst: u16| FlowSpec {
        src: NodeId(src),
        dst: NodeId(dst),
        delivery: Delivery::Ordered,
        count: 1_000,
        start_ms: 3_000,
        interval_ms: 20,
        payload_bytes: 200,
    };
    let sc = Scenario {
        seed,
        topology: "restart",
        cfg: Config::new(4, routing, Recovery::HopByHop),
        links: vec![link(0, 1), link(1, 2), link(0, 3), link(3, 2)],
        faulty: BTreeMap::new(),
        flows: vec![flow(0, 2), flow(2, 0)],
        flood_interval_ms: 10,
        traffic_start_ms: 3_000,
        traffic_end_ms: 23_000,
        end_ms: 40_000,
        check_accusations: false,
        check_localisation: false,
        localise_ms: 0,
    };
    let mut w = World::new(sc);
    w.stop_when_done = false;
    w.restart_at(RESTART_MS, NodeId(2), DOWN_MS);
    w.run(40_000);
    w
}

/// Every message of `src -> dst` accepted once node 2 has been back for a second is
/// delivered, and what is delivered after the restart comes in order without repeats.
fn check(w: &World, src: u16, dst: u16, what: &str) {
    let (src, dst) = (NodeId(src), NodeId(dst));
    let back = RESTART_MS + DOWN_MS;
    let after: Vec<u64> = w
        .obs
        .delivered
        .iter()
        .filter(|d| d.src == src && d.dst == dst && d.at_ms >= back)
        .map(|d| d.seq)
        .collect();
    let got: BTreeSet<u64> = after.iter().copied().collect();
    assert_eq!(got.len(), after.len(), "{what}: a message delivered twice");
    let accepted: Vec<u64> = w
        .obs
        .accepted
        .iter()
        .filter(|((s, d, _, _), (at, _))| *s == src && *d == dst && *at >= back + 1_000)
        .map(|((_, _, _, seq), _)| *seq)
        .collect();
    assert!(accepted.len() > 400, "{what}: {} accepted", accepted.len());
    let missing: Vec<u64> = accepted
        .iter()
        .copied()
        .filter(|s| !got.contains(s))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: {} undelivered, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

#[test]
fn flows_to_and_from_a_restarted_node_carry_on() {
    for routing in [RoutingMode::Odsbr, RoutingMode::LinkState] {
        for seed in 1..=3 {
            let w = run(routing, seed);
            check(
                &w,
                0,
                2,
                &format!("{routing:?} seed {seed}: to the restarted node"),
            );
            check(
                &w,
                2,
                0,
                &format!("{routing:?} seed {seed}: from the restarted node"),
            );
        }
    }
}
