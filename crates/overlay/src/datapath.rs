//! The data path of a node: the source (flows, packets, route choice, ODSBR fault detection),
//! the relays (link-state or source-routed forwarding, probe acks) and the destination
//! (verification, ordering, acks).

use crate::config::{Mutant, Recovery, RoutingMode};
use crate::flows::{DestFlow, SourceFlow};
use crate::node::{Effect, Event, Node, Pending, SubmitError};
use crate::odsbr::{verified_prefix, wrap_ack, Forwarded, PathState, Verdict};
use crate::routing::{route_cost, shortest_paths};
use crate::stats::DropReason;
use crate::types::{Delivery, LinkId, NodeId};
use crate::wire::{hop_digest, AckPacket, DataPacket, OverlayMsg};

impl Node {
    pub(crate) fn on_submit(&mut self, dst: NodeId, delivery: Delivery, payload: Vec<u8>) {
        let reject = |reason| Effect::Rejected {
            dst,
            delivery,
            reason,
        };
        if dst == self.me || dst.0 >= self.cfg.nodes_count {
            self.out.push(reject(SubmitError::BadDestination));
            return;
        }
        if payload.len() > self.cfg.payload_bytes_max {
            self.out.push(reject(SubmitError::PayloadTooLarge));
            return;
        }
        let flow = self
            .out_flows
            .entry((dst, delivery))
            .or_insert_with(SourceFlow::new);
        match flow.submit(payload, self.cfg.flow_backlog_msgs_max) {
            Ok(seq) => {
                self.stats.messages_submitted += 1;
                self.out.push(Effect::Accepted { dst, delivery, seq });
            }
            Err(r) => {
                self.stats.count(r);
                self.out.push(reject(SubmitError::BacklogFull));
            }
        }
    }

    /// Sends every message that must go, while routes and the in-flight bound allow.
    pub(crate) fn pump_flows(&mut self) {
        let keys: Vec<(NodeId, Delivery)> = self.out_flows.keys().copied().collect();
        for (dst, delivery) in keys {
            let flow = self.out_flows.get_mut(&(dst, delivery)).expect("listed");
            flow.fill_window(self.cfg.flow_window_msgs_max);
            let due: Vec<u64> = flow.to_send.iter().copied().collect();
            for seq in due {
                if self.pending.len() >= self.cfg.packets_in_flight_max {
                    return;
                }
                if !self.send_packet(dst, delivery, seq) {
                    self.retry_at_ms = Some(self.now_ms + self.cfg.route_retry_ms);
                    break;
                }
            }
        }
    }

    fn e2e_rto_ms(&self, dst: NodeId) -> u64 {
        let c = &self.cfg;
        match self.e2e_rtt.get(&dst) {
            None => c.e2e_rto_initial_ms,
            Some(&(srtt, var, backoff)) => ((srtt + (4 * var).max(10))
                .clamp(c.e2e_rto_min_ms, c.e2e_rto_max_ms)
                << backoff.min(5))
            .min(c.e2e_rto_max_ms),
        }
    }

    /// Puts message `seq` of a flow in a new packet. `false`: no route now.
    fn send_packet(&mut self, dst: NodeId, delivery: Delivery, seq: u64) -> bool {
        let (route, probes, ackers, path_epoch, first_hop) = match self.cfg.routing {
            RoutingMode::Odsbr => {
                let Some(path) = self.current_path(dst) else {
                    return false;
                };
                let route = path.route.clone();
                let first = route[1];
                (
                    route,
                    path.probe_nodes(),
                    path.ackers(),
                    Some(path.epoch),
                    first,
                )
            }
            RoutingMode::LinkState => {
                let Some(next) = self.ls_next_hop(dst) else {
                    return false;
                };
                (Vec::new(), Vec::new(), vec![dst], None, next)
            }
        };
        // Unique per source incarnation (not per destination): relays key their forwarding
        // state by (source, packet id).
        self.next_packet_id += 1;
        let packet_id = self.next_packet_id;
        let flow = self
            .out_flows
            .get_mut(&(dst, delivery))
            .expect("caller's flow");
        let flow_base = *flow.in_flight.keys().next().expect("seq is in flight");
        let msg = flow.in_flight.get_mut(&seq).expect("to_send is in flight");
        msg.sends += 1;
        msg.last_sent_ms = Some(self.now_ms);
        if msg.sends > 1 {
            self.stats.e2e_retransmits += 1;
        }
        flow.to_send.remove(&seq);
        let mut d = DataPacket {
            src: self.me,
            dst,
            src_epoch: self.epoch,
            delivery,
            msg_seq: seq,
            flow_base,
            packet_id,
            ttl: self.cfg.route_hops_max as u8,
            route: route.clone(),
            probes,
            payload: msg.payload.clone(),
            hop_macs: Vec::new(),
            mac: Default::default(),
        };
        let body = d.body_digest();
        if d.route.len() > 2 {
            d.hop_macs = d.route[1..d.route.len() - 1]
                .iter()
                .map(|&n| {
                    self.keys
                        .with(n)
                        .expect("keyed")
                        .hop
                        .mac(&hop_digest(&body, n))
                })
                .collect();
        }
        d.mac = self.keys.with(dst).expect("keyed").data.mac(&body);
        let timeout = match self.cfg.routing {
            // The source's ack timer: the round-trip bound of the whole route.
            RoutingMode::Odsbr => (d.route.len() as u64 - 1) * self.cfg.odsbr_hop_rtt_bound_ms,
            RoutingMode::LinkState => self.e2e_rto_ms(dst),
        };
        let deadline = self.now_ms + timeout;
        self.pending.insert(
            (dst, packet_id),
            Pending {
                delivery,
                msg_seq: seq,
                sent_ms: self.now_ms,
                deadline_ms: deadline,
                path_epoch,
                ackers,
                first_hop,
                route,
            },
        );
        self.pending_deadlines.insert((deadline, dst, packet_id));
        if let Some(path) = self
            .paths
            .get_mut(&dst)
            .filter(|p| Some(p.epoch) == path_epoch)
        {
            path.sent(packet_id);
        }
        self.stats.packets_sent += 1;
        self.send_to_neighbour(first_hop, self.me, OverlayMsg::Data(d));
        true
    }

    /// Link-state forwarding table entry.
    pub(crate) fn ls_next_hop(&mut self, dst: NodeId) -> Option<NodeId> {
        let v = self.db.version();
        if self.ls_cache.as_ref().is_none_or(|(cv, _)| *cv != v) {
            let g = self.db.graph();
            let t = shortest_paths(g, self.me, self.cfg.route_hops_max, |_, c| c as u64);
            self.ls_cache = Some((v, t.first_hops()));
        }
        self.ls_cache.as_ref().expect("just built").1[dst.index()]
    }

    /// ODSBR route choice: the least-weight path over the topology, weighted by this source's
    /// weight list; the current route is kept while it is within the hysteresis of the best
    /// (so that measurement jitter does not reset fault detection) and crosses no accused link.
    pub(crate) fn current_path(&mut self, dst: NodeId) -> Option<&PathState> {
        let versions = (self.db.version(), self.weights.version());
        if self.paths.contains_key(&dst) && self.path_versions.get(&dst) == Some(&versions) {
            return self.paths.get(&dst);
        }
        let ignore_weights = self.cfg.mutant == Mutant::KeepAccusedRoute;
        let weights = &self.weights;
        let cost = |l: LinkId, c: u32| {
            if ignore_weights {
                c as u64
            } else {
                c as u64 * weights.weight(l) as u64
            }
        };
        if self
            .tree_cache
            .as_ref()
            .is_none_or(|(dv, wv, _)| (*dv, *wv) != versions)
        {
            let g = self.db.graph();
            let t = shortest_paths(g, self.me, self.cfg.route_hops_max, cost);
            self.tree_cache = Some((versions.0, versions.1, t));
        }
        let tree = &self.tree_cache.as_ref().expect("just built").2;
        self.path_versions.insert(dst, versions);
        let Some(best) = tree.path_to(dst) else {
            self.paths.remove(&dst);
            return None;
        };
        let best_cost = tree.dist[dst.index()].expect("reached");
        // Hysteresis never shelters a route through an accused link: a source that keeps the
        // route it just convicted (because the accusation left it within the margin of the
        // best) would convict it again and again while its flows pay the losses.
        let accused_on = |route: &[NodeId]| {
            !ignore_weights
                && route
                    .windows(2)
                    .any(|w| weights.weight(LinkId::new(w[0], w[1])) > 1)
        };
        let keep = self.paths.get(&dst).is_some_and(|p| {
            p.route == best
                || (!accused_on(&p.route)
                    && route_cost(self.db.graph(), &p.route, cost).is_some_and(|c| {
                        c as u128 * 100
                            <= best_cost as u128 * self.cfg.route_switch_hysteresis_percent as u128
                    }))
        });
        if !keep {
            // Messages in flight on the old route go again on the new one: after an
            // accusation the old route is the one that lost them, and the destination's gap
            // reports would only arrive once new messages fill the window, which the holes
            // block (duplicates are discarded at the destination).
            if self.paths.contains_key(&dst) {
                self.resend_in_flight(dst);
            }
            self.fresh_epoch += 1;
            self.stats.route_changes += 1;
            self.out.push(Effect::Event(Event::RouteChanged {
                dst,
                route: best.clone(),
            }));
            self.paths
                .insert(dst, PathState::new(best, self.fresh_epoch));
        }
        self.paths.get(&dst)
    }

    fn resend_in_flight(&mut self, dst: NodeId) {
        for (_, flow) in self.out_flows.iter_mut().filter(|((d, _), _)| *d == dst) {
            let sent = flow
                .in_flight
                .iter()
                .filter(|(_, m)| m.last_sent_ms.is_some());
            let seqs: Vec<u64> = sent.map(|(&s, _)| s).collect();
            flow.to_send.extend(seqs);
        }
    }

    pub(crate) fn on_data(&mut self, from: NodeId, mut d: DataPacket) {
        if d.dst == self.me {
            self.on_data_for_me(from, d);
            return;
        }
        match self.cfg.routing {
            RoutingMode::LinkState => {
                if d.ttl <= 1 {
                    self.stats.count(DropReason::TtlExpired);
                    return;
                }
                d.ttl -= 1;
                let Some(next) = self.ls_next_hop(d.dst) else {
                    self.stats.count(DropReason::NoRoute);
                    return;
                };
                self.stats.packets_forwarded += 1;
                let src = d.src;
                self.send_to_neighbour(next, src, OverlayMsg::Data(d));
            }
            RoutingMode::Odsbr => {
                let Some(pos) = d.route.iter().position(|&n| n == self.me) else {
                    self.stats.count(DropReason::RouteMismatch);
                    return;
                };
                if pos == 0 || pos + 1 >= d.route.len() || d.route[pos - 1] != from {
                    self.stats.count(DropReason::RouteMismatch);
                    return;
                }
                let k = self.keys.with(d.src).expect("every other node has a key");
                if !k
                    .hop
                    .verify(&hop_digest(&d.body_digest(), self.me), &d.hop_macs[pos - 1])
                {
                    self.stats.count(DropReason::HopBadMac);
                    return;
                }
                let next = d.route[pos + 1];
                if !self.links.contains_key(&next) {
                    self.stats.count(DropReason::RouteNotNeighbour);
                    return;
                }
                let hops_left = (d.route.len() - 1 - pos) as u64;
                let f = Forwarded {
                    route: d.route.clone(),
                    pos,
                    src_epoch: d.src_epoch,
                    probe: d.probes.contains(&self.me),
                    deadline_ms: self.now_ms + hops_left * self.cfg.odsbr_hop_rtt_bound_ms,
                };
                match self.forward.insert(d.src, d.packet_id, f) {
                    Err(r) => self.stats.count(r),
                    Ok(false) => self.stats.count(DropReason::DataReplay),
                    Ok(true) => {
                        self.stats.packets_forwarded += 1;
                        let src = d.src;
                        self.send_to_neighbour(next, src, OverlayMsg::Data(d));
                    }
                }
            }
        }
    }

    fn on_data_for_me(&mut self, from: NodeId, d: DataPacket) {
        let routed = match self.cfg.routing {
            RoutingMode::Odsbr => {
                let n = d.route.len();
                n >= 2 && d.route[n - 2] == from
            }
            RoutingMode::LinkState => d.route.is_empty(),
        };
        if !routed {
            self.stats.count(DropReason::RouteMismatch);
            return;
        }
        let body = d.body_digest();
        let k = self.keys.with(d.src).expect("every other node has a key");
        if !k.data.verify(&body, &d.mac) {
            self.stats.count(DropReason::E2eBadMac);
            return;
        }
        let flow = self
            .in_flows
            .entry((d.src, d.delivery))
            .or_insert_with(|| DestFlow::new(d.delivery, d.src_epoch, d.flow_base));
        if d.src_epoch < flow.src_epoch {
            self.stats.count(DropReason::E2eStaleEpoch);
            return;
        }
        if d.src_epoch > flow.src_epoch {
            *flow = DestFlow::new(d.delivery, d.src_epoch, d.flow_base);
        }
        match flow.receive(d.msg_seq, d.payload, self.cfg.reorder_msgs_max) {
            Ok(msgs) => {
                for (seq, payload) in msgs {
                    self.stats.messages_delivered += 1;
                    self.out.push(Effect::Deliver {
                        src: d.src,
                        delivery: d.delivery,
                        seq,
                        payload,
                    });
                }
            }
            Err(r) => self.stats.count(r),
        }
        let flow_ack = flow.flow_ack(self.cfg.flow_sack_words_max());
        let mut ack = AckPacket {
            src: d.src,
            dst: self.me,
            src_epoch: d.src_epoch,
            packet_id: d.packet_id,
            ttl: self.cfg.route_hops_max as u8,
            layers: Vec::new(),
            flow_ack: Some(flow_ack),
        };
        wrap_ack(&mut ack, self.me, &k.ack);
        let back = match self.cfg.routing {
            RoutingMode::Odsbr => Some(from),
            RoutingMode::LinkState => self.ls_next_hop(d.src),
        };
        match back {
            Some(n) => self.send_to_neighbour(n, d.src, OverlayMsg::Ack(ack)),
            None => self.stats.count(DropReason::NoRoute),
        }
    }

    pub(crate) fn on_ack(&mut self, from: NodeId, mut a: AckPacket) {
        if a.src == self.me {
            self.on_ack_for_me(from, a);
            return;
        }
        match self.cfg.routing {
            RoutingMode::LinkState => {
                if a.ttl <= 1 {
                    self.stats.count(DropReason::TtlExpired);
                    return;
                }
                a.ttl -= 1;
                match self.ls_next_hop(a.src) {
                    Some(n) => {
                        let src = a.src;
                        self.send_to_neighbour(n, src, OverlayMsg::Ack(a))
                    }
                    None => self.stats.count(DropReason::NoRoute),
                }
            }
            RoutingMode::Odsbr => {
                let Some(f) = self.forward.get(a.src, a.packet_id) else {
                    self.stats.count(DropReason::AckUnexpected);
                    return;
                };
                if f.route[f.pos + 1] != from
                    || f.src_epoch != a.src_epoch
                    || f.route.last() != Some(&a.dst)
                {
                    self.stats.count(DropReason::RouteMismatch);
                    return;
                }
                let f = self.forward.take(a.src, a.packet_id).expect("just found");
                if f.probe {
                    let k = &self.keys.with(a.src).expect("keyed").ack;
                    if a.layers.len() >= self.cfg.route_hops_max {
                        // More layers than any route has ackers: garbage from downstream.
                        // Send our own layer alone, which puts the loss after us.
                        a.layers.clear();
                        a.flow_ack = None;
                    }
                    wrap_ack(&mut a, self.me, k);
                }
                self.stats.packets_forwarded += 1;
                let src = a.src;
                self.send_to_neighbour(f.route[f.pos - 1], src, OverlayMsg::Ack(a));
            }
        }
    }

    /// A probe's timer expired without the next probe's ack: it acks alone (ODSBR Fig. 4,
    /// line 24), which tells the source the loss is after it.
    pub(crate) fn send_own_ack_layer(&mut self, src: NodeId, packet_id: u64, f: &Forwarded) {
        let mut a = AckPacket {
            src,
            dst: *f.route.last().expect("routes are not empty"),
            src_epoch: f.src_epoch,
            packet_id,
            ttl: self.cfg.route_hops_max as u8,
            layers: Vec::new(),
            flow_ack: None,
        };
        wrap_ack(&mut a, self.me, &self.keys.with(src).expect("keyed").ack);
        self.send_to_neighbour(f.route[f.pos - 1], src, OverlayMsg::Ack(a));
    }

    fn on_ack_for_me(&mut self, from: NodeId, a: AckPacket) {
        let key = (a.dst, a.packet_id);
        let Some(p) = self.pending.get(&key) else {
            self.stats.count(DropReason::AckLate);
            return;
        };
        if a.src_epoch != self.epoch {
            self.stats.count(DropReason::AckLate);
            return;
        }
        if self.cfg.routing == RoutingMode::Odsbr && from != p.first_hop {
            self.stats.count(DropReason::AckWrongNeighbour);
            return;
        }
        let verified = verified_prefix(&a, &p.ackers, &self.keys, self.cfg.mutant);
        let complete = verified == p.ackers.len() && a.layers.len() == p.ackers.len();
        let p = self.take_pending(a.dst, a.packet_id);
        if complete {
            self.stats.packets_acked += 1;
            self.e2e_rtt_sample(a.dst, self.now_ms.saturating_sub(p.sent_ms));
            if let Some(fa) = a.flow_ack.as_ref().filter(|f| f.delivery == p.delivery) {
                let now = self.now_ms;
                let srtt = self.e2e_rtt.get(&a.dst).map_or(0, |r| r.0);
                // Fast retransmission of the gaps the destination reports, once the message
                // had time to arrive: a round trip end to end; two in ODSBR with hop-by-hop
                // recovery, where a gap is usually a link retransmission in progress but may
                // be a faulty relay's drop that only the source can repair (without this,
                // each such drop stalls the ordered flow for the route's whole ack timeout).
                // Link-state hop-by-hop leaves gaps to the links.
                let resend_after = match (self.cfg.routing, self.cfg.recovery) {
                    (_, Recovery::EndToEnd) => Some(srtt),
                    (RoutingMode::Odsbr, Recovery::HopByHop) => Some(2 * srtt),
                    (RoutingMode::LinkState, Recovery::HopByHop) => None,
                };
                if let Some(flow) = self.out_flows.get_mut(&(a.dst, p.delivery)) {
                    let (_, nacks) = flow.on_flow_ack(fa);
                    if let Some(after) = resend_after {
                        for s in nacks {
                            let m = flow.in_flight.get(&s).expect("nacks are in flight");
                            if m.last_sent_ms.is_some_and(|t| now >= t + after) {
                                flow.to_send.insert(s);
                            }
                        }
                    }
                }
            }
            if self.cfg.routing == RoutingMode::Odsbr {
                self.weights.on_delivered(&p.route);
                self.record_outcome(a.dst, a.packet_id, &p, None);
            }
            // Acked packet whose message the destination did not keep (beyond its window):
            // send it again.
            self.resend_if_unacked(a.dst, &p);
        } else {
            self.stats.packets_lost += 1;
            if self.cfg.routing == RoutingMode::Odsbr {
                self.record_outcome(a.dst, a.packet_id, &p, Some(verified));
            }
            self.resend_if_unacked(a.dst, &p);
        }
    }

    fn take_pending(&mut self, dst: NodeId, packet_id: u64) -> Pending {
        let p = self
            .pending
            .remove(&(dst, packet_id))
            .expect("caller checked");
        self.pending_deadlines
            .remove(&(p.deadline_ms, dst, packet_id));
        p
    }

    fn resend_if_unacked(&mut self, dst: NodeId, p: &Pending) {
        if let Some(flow) = self.out_flows.get_mut(&(dst, p.delivery)) {
            if flow.in_flight.contains_key(&p.msg_seq) {
                flow.to_send.insert(p.msg_seq);
            }
        }
    }

    fn e2e_rtt_sample(&mut self, dst: NodeId, r: u64) {
        let r = r.max(1);
        let e = self.e2e_rtt.entry(dst).or_insert((r, r / 2, 0));
        e.1 = (3 * e.1 + e.0.abs_diff(r)) / 4;
        e.0 = (7 * e.0 + r) / 8;
        e.2 = 0;
    }

    pub(crate) fn expire_pending(&mut self) {
        while let Some(&(d, dst, id)) = self.pending_deadlines.first() {
            if d > self.now_ms {
                break;
            }
            let p = self.take_pending(dst, id);
            self.stats.packets_lost += 1;
            match self.cfg.routing {
                // No ack at all: the loss is in the interval before the first probe.
                RoutingMode::Odsbr => self.record_outcome(dst, id, &p, Some(0)),
                RoutingMode::LinkState => {
                    let e = self
                        .e2e_rtt
                        .entry(dst)
                        .or_insert((self.cfg.e2e_rto_initial_ms, 0, 0));
                    e.2 = (e.2 + 1).min(5);
                }
            }
            self.resend_if_unacked(dst, &p);
        }
    }

    /// Feeds a packet's outcome to the fault detector of its path, if the path and probe set
    /// it was sent under are still current, and acts on the verdicts.
    fn record_outcome(&mut self, dst: NodeId, packet_id: u64, p: &Pending, lost_in: Option<usize>) {
        let cfg = &self.cfg;
        let Some(path) = self.paths.get_mut(&dst) else {
            return;
        };
        if Some(path.epoch) != p.path_epoch {
            return;
        }
        let verdicts = path.resolve(
            packet_id,
            lost_in,
            cfg.odsbr_loss_threshold_permille,
            cfg.odsbr_window_packets,
            cfg.mutant,
            &mut self.fresh_epoch,
        );
        for verdict in verdicts {
            self.act_on(dst, verdict);
        }
    }

    fn act_on(&mut self, dst: NodeId, verdict: Verdict) {
        let cfg = &self.cfg;
        match verdict {
            Verdict::Nothing => {}
            Verdict::Split { probe } => {
                self.stats.probes_inserted += 1;
                self.out
                    .push(Effect::Event(Event::ProbeAdded { dst, probe }));
            }
            Verdict::Retired { count } => self.stats.probes_retired += count as u64,
            Verdict::Accuse { link, mu } => {
                let weight = self.weights.accuse(
                    link,
                    mu,
                    cfg.odsbr_loss_threshold_permille,
                    cfg.link_weight_max,
                );
                self.stats.accusations += 1;
                self.out
                    .push(Effect::Event(Event::Accused { dst, link, weight }));
            }
        }
    }
}
