//! ODSBR's Byzantine fault detection and link weight management (Awerbuch, Holmer,
//! Nita-Rotaru, Rubens, WiSe 2002; our notes: spec/darpa.md §2.4-2.5).
//!
//! - **Loss.** A packet whose acks did not all verify before the source's timeout is a loss.
//!   It belongs to the interval between probes `P_i` and `P_{i+1}` when the source verified
//!   `P_i`'s ack but not `P_{i+1}`'s (the source is `P_0`, the destination the last probe).
//! - **Fault.** A loss rate of at least τ over the window of recent packets of a path.
//! - **Binary search.** On a fault the source splits the faulty interval at its midpoint by
//!   adding a probe; both halves get the lifetime counter `μ/τ + C` (μ: losses that caused the
//!   fault, `C`: the old interval's counter). Counters drop by one per acknowledged packet; a
//!   probe whose two intervals both reach zero retires. When the faulty interval is a single
//!   link, that link is accused: it is the link between the last node whose ack verified and
//!   the next probe, so (given timeouts above the benign round trip and benign loss below τ) one
//!   of its two ends is faulty. ODSBR never says which: it accuses the link, not a node.
//! - **Weights.** An accusation doubles the link's weight and adds `μ/τ` to its counter; each
//!   acknowledged packet takes `1/m` off the counter of each of the `m` links above weight 1;
//!   a counter that returns to zero halves the weight. The paper's bound counts one halving per
//!   conviction (`w_e = 2^(j_e - a_e)`), so while the weight stays above 1 its counter is
//!   re-armed with the last conviction's quantum.
//!
//! Differences from the paper, and why:
//! - Outcomes count in send order. An ack comes back in a round trip, a loss is declared only
//!   at the route's timeout (hops times the per-hop bound); recorded as they come, the acks of
//!   a fast flow's later packets would retire a freshly added probe before the losses that
//!   justified it were counted, and the search would start over for ever.
//! - Repeat offenders wait longer. The paper's quantum is the last conviction's `μ/τ`, a few
//!   dozen packets, so a relay on the cheapest route that drops a share of what it forwards is
//!   back on the route a fraction of a second after each conviction, and every return costs the
//!   flow the losses that convict it again. Here the quantum grows fourfold with each conviction the
//!   source remembers (at most [`CONVICTIONS_MAX`]), and a conviction is forgotten only after
//!   [`PROBATION_QUANTA`] quanta of packets delivered across the link once its weight is back
//!   to 1 (probation: a link earns back trust by carrying traffic, not by being avoided). This
//!   only slows rehabilitation, so the paper's bound on the losses a faulty link can cause per
//!   delivered packet still holds; the price is that a link accused for benign loss several
//!   times in a row stays avoided longer.
//! - Route discovery: the overlay already floods authenticated link-state updates, so the
//!   source computes the least-weight path over that topology (with its own weight list, as
//!   ODSBR's response flood does) instead of flooding signed requests and responses.
//! - Probe list and acks are authenticated but not encrypted (redoubt-crypto gives us MACs, and
//!   we write no primitive). The source MACs the whole packet, probe list included, for every
//!   intermediate node, and each node checks its MAC before forwarding, so removing or changing
//!   a probe, or modifying or forging a packet, is caught at the next correct node and
//!   localises to a link of the node that did it. Each ack layer MACs everything after it, so a
//!   node can wrap the next probe's ack but not strip it. What the onion also hid, which nodes
//!   are probed, an adversary here can see.

use crate::config::Mutant;
use crate::keys::Keys;
use crate::stats::DropReason;
use crate::types::{LinkId, NodeId};
use crate::wire::{ack_layer_digest, AckLayer, AckPacket};
use redoubt_crypto::MacKey;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// `μ/τ` packets in thousandths of a packet.
fn mu_over_tau_milli(mu: u32, tau_permille: u32) -> u64 {
    mu as u64 * 1_000_000 / tau_permille.max(1) as u64
}

/// Convictions of one link a source remembers; the rehabilitation quantum stops doubling here.
const CONVICTIONS_MAX: u32 = 16;
/// A conviction is forgotten after this many rehabilitation quanta of packets delivered across
/// the link once its weight is back to 1.
const PROBATION_QUANTA: u64 = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
struct WeightEntry {
    weight: u32,
    /// Weight above 1: packets (thousandths) until the next halving. Weight 1 (probation):
    /// packets across the link until one conviction is forgotten.
    counter_milli: u64,
    /// Packets per halving: the last conviction's `μ/τ`, times four for each earlier
    /// conviction still remembered.
    quantum_milli: u64,
    convictions: u32,
}

/// A source's weight list (ODSBR `weight_list`): unlisted links weigh 1.
#[derive(Clone, Debug, Default)]
pub(crate) struct WeightList {
    entries: BTreeMap<LinkId, WeightEntry>,
    version: u64,
}

impl WeightList {
    pub fn weight(&self, link: LinkId) -> u32 {
        self.entries.get(&link).map_or(1, |e| e.weight)
    }

    /// Grows whenever a weight changes.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Conviction of `link` after `mu` losses: the weight doubles. Returns the new weight.
    pub fn accuse(&mut self, link: LinkId, mu: u32, tau_permille: u32, weight_max: u32) -> u32 {
        let e = self.entries.entry(link).or_insert(WeightEntry {
            weight: 1,
            counter_milli: 0,
            quantum_milli: 0,
            convictions: 0,
        });
        e.convictions = (e.convictions + 1).min(CONVICTIONS_MAX);
        e.quantum_milli = mu_over_tau_milli(mu.max(1), tau_permille)
            .saturating_mul(1 << (2 * (e.convictions - 1)));
        if e.weight == 1 {
            // New, or on probation: the probation counter is not rehabilitation credit.
            e.counter_milli = 0;
        }
        e.weight = e.weight.saturating_mul(2).min(weight_max);
        e.counter_milli = e.counter_milli.saturating_add(e.quantum_milli);
        self.version += 1;
        e.weight
    }

    /// One packet was delivered over `route`: rehabilitation progresses. The packet is shared
    /// among the `m` links above weight 1 (`1/m` each, as ODSBR); a link on probation counts
    /// it whole if the packet crossed it (a link earns back trust by carrying traffic).
    pub fn on_delivered(&mut self, route: &[NodeId]) {
        let m = self.entries.values().filter(|e| e.weight > 1).count() as u64;
        let step = (1_000 / m.max(1)).max(1);
        let mut changed = false;
        for (link, e) in self.entries.iter_mut() {
            let heavy = e.weight > 1;
            let credit = if heavy {
                step
            } else if route.windows(2).any(|w| LinkId::new(w[0], w[1]) == *link) {
                1_000
            } else {
                continue;
            };
            e.counter_milli = e.counter_milli.saturating_sub(credit);
            if e.counter_milli > 0 {
                continue;
            }
            if heavy {
                e.weight /= 2;
                changed = true;
                e.counter_milli = if e.weight > 1 {
                    e.quantum_milli
                } else {
                    e.quantum_milli.saturating_mul(PROBATION_QUANTA)
                };
            } else {
                e.convictions -= 1;
                e.quantum_milli /= 2;
                e.counter_milli = e.quantum_milli.saturating_mul(PROBATION_QUANTA);
            }
        }
        self.entries
            .retain(|_, e| e.weight > 1 || (e.convictions > 0 && e.counter_milli > 0));
        if changed {
            self.version += 1;
        }
    }

    /// Links with a weight above 1.
    pub fn heavy(&self) -> impl Iterator<Item = (LinkId, u32)> + '_ {
        self.entries
            .iter()
            .filter(|(_, e)| e.weight > 1)
            .map(|(&l, e)| (l, e.weight))
    }
}

/// What the fault detector decided after an outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Nothing,
    /// A fault in an interval of several links: a probe was added at `probe`.
    Split {
        probe: NodeId,
    },
    /// A fault in a single-link interval: the link is accused.
    Accuse {
        link: LinkId,
        mu: u32,
    },
    /// Probes retired after their intervals' counters reached zero.
    Retired {
        count: usize,
    },
}

/// A source's fault-detection state for its current route to one destination.
#[derive(Clone, Debug)]
pub(crate) struct PathState {
    pub route: Vec<NodeId>,
    /// Route positions of the intermediate probes, ascending.
    probes: Vec<usize>,
    /// Lifetime counter of each interval, in thousandths of a packet.
    counters_milli: Vec<u64>,
    /// Identifies the route and probe set; packets sent under another epoch do not count.
    pub epoch: u64,
    /// Outcomes of recent packets of this epoch: `None` acked, `Some(i)` lost in interval `i`.
    window: VecDeque<Option<usize>>,
    /// Packets sent under this epoch whose outcome is not known yet (ids grow in send order).
    unresolved: BTreeSet<u64>,
    /// Known outcomes waiting for those of earlier packets: outcomes are recorded in send
    /// order, so that the acks of later packets, which come back long before an earlier
    /// packet's loss is declared at its timeout, cannot retire a probe (or hide a fault)
    /// before that loss is counted.
    resolved: BTreeMap<u64, Option<usize>>,
}

impl PathState {
    pub fn new(route: Vec<NodeId>, epoch: u64) -> PathState {
        assert!(route.len() >= 2, "a route joins two nodes");
        PathState {
            route,
            probes: Vec::new(),
            counters_milli: vec![0],
            epoch,
            window: VecDeque::new(),
            unresolved: BTreeSet::new(),
            resolved: BTreeMap::new(),
        }
    }

    /// Interval end points as route positions: the source, the probes, the destination.
    fn points(&self) -> Vec<usize> {
        let mut p = Vec::with_capacity(self.probes.len() + 2);
        p.push(0);
        p.extend_from_slice(&self.probes);
        p.push(self.route.len() - 1);
        p
    }

    pub fn probe_nodes(&self) -> Vec<NodeId> {
        self.probes.iter().map(|&i| self.route[i]).collect()
    }

    /// Nodes whose ack layers the source expects, in order: the probes, then the destination.
    pub fn ackers(&self) -> Vec<NodeId> {
        let mut a = self.probe_nodes();
        a.push(*self.route.last().expect("routes are not empty"));
        a
    }

    /// Records the outcome of a packet sent under the current epoch. `lost_in`: `None` if
    /// every ack verified, else the interval the loss belongs to. `fresh_epoch` numbers a new
    /// configuration if this one changes.
    pub fn record(
        &mut self,
        lost_in: Option<usize>,
        tau_permille: u32,
        window_packets: u32,
        mutant: Mutant,
        fresh_epoch: &mut u64,
    ) -> Verdict {
        debug_assert!(lost_in.is_none_or(|i| i < self.counters_milli.len()));
        if self.window.len() >= window_packets as usize {
            self.window.pop_front();
        }
        self.window.push_back(lost_in);
        let Some(_) = lost_in else {
            for c in &mut self.counters_milli {
                *c = c.saturating_sub(1_000);
            }
            let mut retired = 0;
            while let Some(k) = (0..self.probes.len())
                .find(|&k| self.counters_milli[k] == 0 && self.counters_milli[k + 1] == 0)
            {
                self.probes.remove(k);
                self.counters_milli.remove(k + 1);
                retired += 1;
            }
            if retired == 0 {
                return Verdict::Nothing;
            }
            self.renew(fresh_epoch);
            return Verdict::Retired { count: retired };
        };
        if mutant == Mutant::IgnoreLossThreshold {
            return Verdict::Nothing;
        }
        let losses = self.window.iter().filter(|o| o.is_some()).count() as u64;
        if losses * 1_000 < tau_permille as u64 * window_packets as u64 {
            return Verdict::Nothing;
        }
        // The faulty interval: most losses in the window, the latest loss breaking ties.
        let mut per_interval = vec![(0u32, 0usize); self.counters_milli.len()];
        for (age, o) in self.window.iter().enumerate() {
            if let Some(i) = o {
                per_interval[*i].0 += 1;
                per_interval[*i].1 = age;
            }
        }
        let faulty = (0..per_interval.len())
            .max_by_key(|&i| per_interval[i])
            .expect("at least one interval");
        let mu = losses as u32;
        let points = self.points();
        let (a, b) = (points[faulty], points[faulty + 1]);
        self.renew(fresh_epoch);
        if b - a == 1 {
            return Verdict::Accuse {
                link: LinkId::new(self.route[a], self.route[b]),
                mu,
            };
        }
        let mid = (a + b) / 2;
        let c = self.counters_milli[faulty] + mu_over_tau_milli(mu, tau_permille);
        self.probes.insert(faulty, mid);
        self.counters_milli[faulty] = c;
        self.counters_milli.insert(faulty + 1, c);
        debug_assert!(self.probes.windows(2).all(|w| w[0] < w[1]));
        debug_assert_eq!(self.counters_milli.len(), self.probes.len() + 1);
        Verdict::Split {
            probe: self.route[mid],
        }
    }

    fn renew(&mut self, fresh_epoch: &mut u64) {
        *fresh_epoch += 1;
        self.epoch = *fresh_epoch;
        self.window.clear();
        self.unresolved.clear();
        self.resolved.clear();
    }

    /// Packet `packet_id` was sent under the current epoch.
    pub fn sent(&mut self, packet_id: u64) {
        self.unresolved.insert(packet_id);
    }

    /// The outcome of packet `packet_id` of the current epoch is known; records, in send
    /// order, every outcome no longer waiting for an earlier packet's, and returns the
    /// verdicts (the first one that changes the epoch ends the run).
    pub fn resolve(
        &mut self,
        packet_id: u64,
        lost_in: Option<usize>,
        tau_permille: u32,
        window_packets: u32,
        mutant: Mutant,
        fresh_epoch: &mut u64,
    ) -> Vec<Verdict> {
        if !self.unresolved.remove(&packet_id) {
            return Vec::new();
        }
        self.resolved.insert(packet_id, lost_in);
        let mut verdicts = Vec::new();
        while let Some((&id, _)) = self.resolved.first_key_value() {
            if self.unresolved.first().is_some_and(|&u| u < id) {
                break;
            }
            let outcome = self.resolved.remove(&id).expect("just seen");
            let epoch = self.epoch;
            let v = self.record(outcome, tau_permille, window_packets, mutant, fresh_epoch);
            if v != Verdict::Nothing {
                verdicts.push(v);
            }
            if self.epoch != epoch {
                break;
            }
        }
        verdicts
    }
}

/// A data packet this node forwarded on a source route, kept until its ack passes back (or the
/// ack can no longer be legitimate). Only acks for such packets are relayed, so ack traffic is
/// bounded by authenticated data traffic.
#[derive(Clone, Debug)]
pub(crate) struct Forwarded {
    pub route: Vec<NodeId>,
    /// Our position in `route`.
    pub pos: usize,
    pub src_epoch: u64,
    /// Whether we are a probe for this packet (we owe the source an ack layer).
    pub probe: bool,
    pub deadline_ms: u64,
}

/// Packets forwarded and awaiting their ack, bounded per source.
#[derive(Clone, Debug)]
pub(crate) struct ForwardTable {
    entries: BTreeMap<(NodeId, u64), Forwarded>,
    deadlines: BTreeSet<(u64, NodeId, u64)>,
    per_source: BTreeMap<NodeId, usize>,
    per_source_max: usize,
}

impl ForwardTable {
    pub fn new(per_source_max: usize) -> ForwardTable {
        ForwardTable {
            entries: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            per_source: BTreeMap::new(),
            per_source_max,
        }
    }

    /// Remembers a forwarded packet. `Ok(false)`: already known (a replay), nothing changed.
    pub fn insert(
        &mut self,
        src: NodeId,
        packet_id: u64,
        f: Forwarded,
    ) -> Result<bool, DropReason> {
        if self.entries.contains_key(&(src, packet_id)) {
            return Ok(false);
        }
        let n = self.per_source.entry(src).or_insert(0);
        if *n >= self.per_source_max {
            return Err(DropReason::ForwardTableFull);
        }
        *n += 1;
        self.deadlines.insert((f.deadline_ms, src, packet_id));
        self.entries.insert((src, packet_id), f);
        Ok(true)
    }

    pub fn get(&self, src: NodeId, packet_id: u64) -> Option<&Forwarded> {
        self.entries.get(&(src, packet_id))
    }

    pub fn take(&mut self, src: NodeId, packet_id: u64) -> Option<Forwarded> {
        let f = self.entries.remove(&(src, packet_id))?;
        self.deadlines.remove(&(f.deadline_ms, src, packet_id));
        let n = self.per_source.get_mut(&src).expect("counted on insert");
        *n -= 1;
        if *n == 0 {
            self.per_source.remove(&src);
        }
        Some(f)
    }

    /// Removes and returns the entries whose deadline passed.
    pub fn expire(&mut self, now_ms: u64) -> Vec<(NodeId, u64, Forwarded)> {
        let mut out = Vec::new();
        while let Some(&(d, src, id)) = self.deadlines.first() {
            if d > now_ms {
                break;
            }
            let f = self.take(src, id).expect("deadlines name entries");
            out.push((src, id, f));
        }
        out
    }

    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.deadlines.first().map(|&(d, _, _)| d)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Number of leading ack layers that name the expected ackers in order and (unless the mutant
/// says otherwise) carry a valid MAC from them. The source (`P_0`) is implicit.
pub(crate) fn verified_prefix(
    ack: &AckPacket,
    expected: &[NodeId],
    keys: &Keys,
    mutant: Mutant,
) -> usize {
    let mut n = 0;
    for (i, layer) in ack.layers.iter().enumerate() {
        if i >= expected.len() || layer.node != expected[i] {
            break;
        }
        if mutant != Mutant::UnauthenticatedProbeAcks {
            let Some(k) = keys.with(layer.node) else {
                break;
            };
            let d = ack_layer_digest(ack, layer.node, &ack.layers[i + 1..], ack.flow_ack.as_ref());
            if !k.ack.verify(&d, &layer.mac) {
                break;
            }
        }
        n += 1;
    }
    n
}

/// Prepends this node's layer to an ack (a probe combining the next probe's ack with its own,
/// or the first layer of a fresh ack).
pub(crate) fn wrap_ack(ack: &mut AckPacket, me: NodeId, ack_key: &MacKey) {
    let d = ack_layer_digest(ack, me, &ack.layers, ack.flow_ack.as_ref());
    ack.layers.insert(
        0,
        AckLayer {
            node: me,
            mac: ack_key.mac(&d),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::key_map_for_tests;
    use crate::types::Delivery;
    use crate::wire::FlowAck;

    const TAU: u32 = 100;
    const W: u32 = 20;

    fn route(n: u16) -> Vec<NodeId> {
        (0..n).map(NodeId).collect()
    }

    /// Drives the detector on a chain with one node dropping everything: the loss is always
    /// seen in the interval whose far end is at or beyond the dropper. Returns the accused link
    /// and the number of packets lost before it.
    fn localise(len: u16, dropper: usize) -> (LinkId, u32) {
        let mut p = PathState::new(route(len), 1);
        let mut epoch = 1;
        let mut lost = 0;
        for _ in 0..10_000 {
            // The first probe point at or after the dropper does not ack.
            let points = p.points();
            let interval = (0..points.len() - 1)
                .find(|&i| points[i + 1] >= dropper)
                .expect("dropper is on the route");
            lost += 1;
            match p.record(Some(interval), TAU, W, Mutant::None, &mut epoch) {
                Verdict::Accuse { link, .. } => return (link, lost),
                Verdict::Split { probe } => assert!(p.probe_nodes().contains(&probe)),
                Verdict::Nothing => {}
                Verdict::Retired { .. } => panic!("no retirement without acked packets"),
            }
        }
        panic!("never localised");
    }

    /// Binary search on a chain with the faulty node at each position: the accused link always
    /// has the faulty node as an end, after about log2(n) faults of two losses each.
    #[test]
    fn binary_search_accuses_a_link_of_the_faulty_node_at_every_position() {
        for len in [3u16, 6, 9, 17] {
            for dropper in 1..(len as usize - 1) {
                let (link, lost) = localise(len, dropper);
                assert!(
                    link.touches(NodeId(dropper as u16)),
                    "len {len} dropper {dropper} accused {link:?}"
                );
                // The dropper swallows data, so the accused link is the one into it.
                assert_eq!(
                    link,
                    LinkId::new(NodeId(dropper as u16 - 1), NodeId(dropper as u16))
                );
                let faults = (len as f64 - 1.0).log2().ceil() as u32 + 1;
                assert!(lost <= 2 * faults, "len {len}: {lost} losses");
            }
        }
    }

    #[test]
    fn probes_retire_after_enough_acked_packets() {
        let mut p = PathState::new(route(8), 1);
        let mut epoch = 1;
        p.record(Some(0), TAU, W, Mutant::None, &mut epoch);
        assert!(matches!(
            p.record(Some(0), TAU, W, Mutant::None, &mut epoch),
            Verdict::Split { .. }
        ));
        assert_eq!(p.probes, vec![3]);
        // μ = 2 → counters 20 packets each.
        for i in 0..19 {
            assert_eq!(
                p.record(None, TAU, W, Mutant::None, &mut epoch),
                Verdict::Nothing,
                "{i}"
            );
        }
        assert_eq!(
            p.record(None, TAU, W, Mutant::None, &mut epoch),
            Verdict::Retired { count: 1 }
        );
        assert!(p.probes.is_empty());
    }

    #[test]
    fn loss_below_threshold_is_tolerated_and_mutant_never_probes() {
        let mut p = PathState::new(route(5), 1);
        let mut epoch = 1;
        for i in 0..200 {
            let o = if i % 20 == 0 { Some(0) } else { None };
            assert_eq!(
                p.record(o, TAU, W, Mutant::None, &mut epoch),
                Verdict::Nothing
            );
        }
        let mut q = PathState::new(route(5), 1);
        for _ in 0..200 {
            assert_eq!(
                q.record(Some(0), TAU, W, Mutant::IgnoreLossThreshold, &mut epoch),
                Verdict::Nothing
            );
        }
    }

    /// Delivers packets over the route 1-2-5 (across link 1-2 of the tests).
    fn deliver(w: &mut WeightList, packets: u32) {
        for _ in 0..packets {
            w.on_delivered(&[NodeId(1), NodeId(2), NodeId(5)]);
        }
    }

    #[test]
    fn weights_double_on_conviction_and_halve_on_rehabilitation() {
        let mut w = WeightList::default();
        let l = LinkId::new(NodeId(1), NodeId(2));
        assert_eq!(w.weight(l), 1);
        assert_eq!(w.accuse(l, 2, TAU, 1 << 20), 2);
        // Second conviction: the quantum grows fourfold (2 / 0.1 = 20, then 80): 20 + 80.
        assert_eq!(w.accuse(l, 2, TAU, 1 << 20), 4);
        deliver(&mut w, 99);
        assert_eq!(w.weight(l), 4);
        deliver(&mut w, 1);
        assert_eq!(w.weight(l), 2);
        // Re-armed with the quantum, 80.
        deliver(&mut w, 79);
        assert_eq!(w.weight(l), 2);
        deliver(&mut w, 1);
        assert_eq!(w.weight(l), 1);
        assert_eq!(w.heavy().count(), 0);
        // Two links share the rehabilitation: each loses 1/2 per packet.
        let mut w = WeightList::default();
        let l2 = LinkId::new(NodeId(3), NodeId(4));
        w.accuse(l, 1, TAU, 1 << 20);
        w.accuse(l2, 1, TAU, 1 << 20);
        deliver(&mut w, 19);
        assert_eq!((w.weight(l), w.weight(l2)), (2, 2));
        deliver(&mut w, 1);
        assert_eq!((w.weight(l), w.weight(l2)), (1, 1));
    }

    #[test]
    fn repeat_offenders_wait_longer_until_probation_forgets_them() {
        let mut w = WeightList::default();
        let l = LinkId::new(NodeId(1), NodeId(2));
        // Convicted, rehabilitated, convicted again: each ban four times the last.
        let mut bans = Vec::new();
        for _ in 0..4 {
            assert_eq!(w.accuse(l, 2, TAU, 1 << 20), 2);
            let mut packets = 0;
            while w.weight(l) > 1 {
                // Bans are served whatever route carries the traffic.
                w.on_delivered(&[NodeId(0), NodeId(3)]);
                packets += 1;
            }
            bans.push(packets);
        }
        assert_eq!(bans, [20, 80, 320, 1280]);
        // On probation, only traffic across the link counts.
        for _ in 0..100_000 {
            w.on_delivered(&[NodeId(0), NodeId(3)]);
        }
        assert_eq!(w.entries[&l].convictions, 4);
        // A conviction is forgotten per PROBATION_QUANTA quanta of packets across the link
        // (160 * Q, then 80 * Q, ...); once all four are, the next ban is the first's again.
        deliver(&mut w, (160 + 80 + 40 + 20) * PROBATION_QUANTA as u32 - 1);
        assert_eq!(w.accuse(l, 2, TAU, 1 << 20), 2);
        let mut w2 = w.clone();
        deliver(&mut w2, 39);
        assert_eq!(
            w2.weight(l),
            2,
            "one conviction still remembered: a 40-packet ban"
        );
        let mut w = WeightList::default();
        w.accuse(l, 2, TAU, 1 << 20);
        deliver(&mut w, 20 + 20 * PROBATION_QUANTA as u32);
        assert_eq!(w.entries.len(), 0, "forgotten entries are dropped");
        assert_eq!(w.accuse(l, 2, TAU, 1 << 20), 2);
        deliver(&mut w, 20);
        assert_eq!(w.weight(l), 1, "a forgotten offender starts over");
    }

    #[test]
    fn ack_chain_verifies_layer_by_layer() {
        let n = 5;
        let keys: Vec<Keys> = (0..n)
            .map(|i| Keys::new(NodeId(i), n, &key_map_for_tests(b"k", NodeId(i), n)).unwrap())
            .collect();
        let mut ack = AckPacket {
            src: NodeId(0),
            dst: NodeId(4),
            src_epoch: 1,
            packet_id: 7,
            ttl: 0,
            layers: vec![],
            flow_ack: Some(FlowAck {
                delivery: Delivery::Ordered,
                cum: 3,
                sack: vec![],
            }),
        };
        let expected = [NodeId(2), NodeId(3), NodeId(4)];
        for &n in expected.iter().rev() {
            let k = &keys[n.index()].with(NodeId(0)).unwrap().ack;
            wrap_ack(&mut ack, n, k);
        }
        assert_eq!(verified_prefix(&ack, &expected, &keys[0], Mutant::None), 3);
        // Changing the flow ack breaks every layer.
        let mut forged = ack.clone();
        forged.flow_ack.as_mut().unwrap().cum = 99;
        assert_eq!(
            verified_prefix(&forged, &expected, &keys[0], Mutant::None),
            0
        );
        // Stripping the middle layer: the first still names 2, its MAC covered the stripped one.
        let mut stripped = ack.clone();
        stripped.layers.remove(1);
        assert_eq!(
            verified_prefix(&stripped, &expected, &keys[0], Mutant::None),
            0
        );
        // A garbage innermost layer: the outer two verify (they wrapped it as received).
        let mut g = AckPacket {
            layers: vec![AckLayer {
                node: NodeId(4),
                mac: redoubt_crypto::Mac([7; 16]),
            }],
            ..ack.clone()
        };
        for &n in expected[..2].iter().rev() {
            wrap_ack(&mut g, n, &keys[n.index()].with(NodeId(0)).unwrap().ack);
        }
        assert_eq!(verified_prefix(&g, &expected, &keys[0], Mutant::None), 2);
        assert_eq!(
            verified_prefix(&g, &expected, &keys[0], Mutant::UnauthenticatedProbeAcks),
            3
        );
    }

    #[test]
    fn forward_table_is_bounded_per_source_and_expires() {
        let mut t = ForwardTable::new(2);
        let f = |d| Forwarded {
            route: route(3),
            pos: 1,
            src_epoch: 1,
            probe: true,
            deadline_ms: d,
        };
        assert_eq!(t.insert(NodeId(0), 1, f(10)), Ok(true));
        assert_eq!(t.insert(NodeId(0), 1, f(99)), Ok(false));
        assert_eq!(t.insert(NodeId(0), 2, f(20)), Ok(true));
        assert_eq!(
            t.insert(NodeId(0), 3, f(30)),
            Err(DropReason::ForwardTableFull)
        );
        assert_eq!(t.insert(NodeId(2), 3, f(30)), Ok(true));
        assert_eq!(t.next_deadline_ms(), Some(10));
        let gone = t.expire(20);
        assert_eq!(gone.iter().map(|g| g.1).collect::<Vec<_>>(), vec![1, 2]);
        assert!(t.take(NodeId(2), 3).is_some());
        assert_eq!(t.len(), 0);
    }
}
