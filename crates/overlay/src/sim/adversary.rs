//! The adversary's hands. A faulty node runs the unmodified core (so it knows routes, probes
//! and keys like a correct node); its outgoing datagrams pass through [`Adversary::outgoing`],
//! which opens them with the node's own link keys, lies, and seals the lies again, so that
//! neighbours cannot tell them from honest datagrams by their MACs.

use super::scenario::Behaviour;
use crate::config::Config;
use crate::types::NodeId;
use crate::wire::{self, AckLayer, AckPacket, DataPacket, FlowAck, Frame, Limits, OverlayMsg};
use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use redoubt_crypto::{Mac, MacKey};
use std::collections::BTreeMap;

pub struct Adversary {
    me: NodeId,
    pub behaviour: Behaviour,
    link_keys: BTreeMap<NodeId, MacKey>,
    limits: Limits,
    nodes_count: u16,
    /// Messages to slip into the next datagram to a neighbour, with their release time.
    slipped: BTreeMap<NodeId, Vec<(u64, OverlayMsg)>>,
    /// Old datagrams, for replay.
    recorded: Vec<(NodeId, Vec<u8>)>,
    /// Per correct source: times at which this node destroyed one of its packets or acks.
    pub damage: BTreeMap<NodeId, Vec<u64>>,
    /// The node behaves correctly before this time (benchmarks: a fault that starts mid-run).
    pub active_from_ms: u64,
}

/// Most messages waiting to be slipped to one neighbour.
const SLIPPED_MAX: usize = 4_096;

impl Adversary {
    pub fn new(
        me: NodeId,
        behaviour: Behaviour,
        link_keys: BTreeMap<NodeId, MacKey>,
        cfg: &Config,
    ) -> Adversary {
        Adversary {
            me,
            behaviour,
            link_keys,
            limits: Limits::from_config(cfg),
            nodes_count: cfg.nodes_count,
            slipped: BTreeMap::new(),
            recorded: Vec::new(),
            damage: BTreeMap::new(),
            active_from_ms: 0,
        }
    }

    fn hit(&mut self, src: NodeId, now_ms: u64) {
        self.damage.entry(src).or_default().push(now_ms);
    }

    fn slip(&mut self, to: NodeId, release_ms: u64, m: OverlayMsg) {
        let q = self.slipped.entry(to).or_default();
        if q.len() < SLIPPED_MAX {
            q.push((release_ms, m));
        }
    }

    /// Rewrites one datagram the node sends to `to`. Returns the datagrams to put on the wire.
    pub fn outgoing(
        &mut self,
        now_ms: u64,
        to: NodeId,
        bytes: Vec<u8>,
        rng: &mut ChaCha8Rng,
    ) -> Vec<(NodeId, Vec<u8>)> {
        let key = self
            .link_keys
            .get(&to)
            .expect("the node only sends to neighbours")
            .clone();
        if now_ms < self.active_from_ms {
            return vec![(to, bytes)];
        }
        let (_, mut frame) =
            wire::open(&bytes, to, &self.limits, |n| (n == self.me).then_some(&key))
                .expect("the node's own datagrams open");
        let mut out = Vec::new();
        if let Some(batch) = frame.reliable.as_mut() {
            let msgs = std::mem::take(&mut batch.msgs);
            batch.msgs = self.rewrite(now_ms, to, msgs, rng);
        }
        let msgs = std::mem::take(&mut frame.unreliable);
        frame.unreliable = self.rewrite(now_ms, to, msgs, rng);
        if self.behaviour == Behaviour::Inject {
            self.inject(now_ms, to, &mut frame, rng, &mut out);
        }
        // Slip in what is due for this neighbour, within the frame's bounds.
        if let Some(q) = self.slipped.get_mut(&to) {
            let room = self
                .limits
                .batch_msgs_max
                .saturating_sub(frame.unreliable.len());
            let mut taken = 0;
            q.retain(|(release, m)| {
                if *release <= now_ms && taken < room && m.size_hint() < 16_000 {
                    frame.unreliable.push(m.clone());
                    taken += 1;
                    false
                } else {
                    true
                }
            });
        }
        let sealed = wire::seal(self.me, to, &frame, &key);
        if self.recorded.len() < 64 && rng.random_bool(0.05) {
            self.recorded.push((to, sealed.clone()));
        }
        out.push((to, sealed));
        out
    }

    fn rewrite(
        &mut self,
        now_ms: u64,
        to: NodeId,
        msgs: Vec<OverlayMsg>,
        rng: &mut ChaCha8Rng,
    ) -> Vec<OverlayMsg> {
        let mut kept = Vec::with_capacity(msgs.len());
        for m in msgs {
            let transit = match &m {
                OverlayMsg::Data(d) => d.src != self.me && d.dst != self.me,
                OverlayMsg::Ack(a) => a.src != self.me && a.dst != self.me,
                OverlayMsg::Lsu(_) => false,
            };
            if !transit {
                kept.push(m);
                continue;
            }
            let p = |permille: u32, rng: &mut ChaCha8Rng| rng.random_range(0..1000) < permille;
            match (&self.behaviour, m) {
                (Behaviour::DropAll { .. }, OverlayMsg::Data(d)) => self.hit(d.src, now_ms),
                (Behaviour::DropAll { acks: true }, OverlayMsg::Ack(a)) => self.hit(a.src, now_ms),
                (Behaviour::DropFraction(f), m) if p(*f, rng) => {
                    let src = match &m {
                        OverlayMsg::Data(d) => d.src,
                        OverlayMsg::Ack(a) => a.src,
                        OverlayMsg::Lsu(_) => unreachable!("not transit"),
                    };
                    self.hit(src, now_ms);
                }
                (Behaviour::Modify(f), OverlayMsg::Data(mut d)) if p(*f, rng) => {
                    self.hit(d.src, now_ms);
                    match d.payload.first_mut() {
                        Some(b) => *b ^= 0x5a,
                        None => d.msg_seq += 1,
                    }
                    kept.push(OverlayMsg::Data(d));
                }
                (Behaviour::Misroute(f), OverlayMsg::Data(d)) if p(*f, rng) => {
                    let others: Vec<NodeId> = self
                        .link_keys
                        .keys()
                        .copied()
                        .filter(|&n| n != to)
                        .collect();
                    self.hit(d.src, now_ms);
                    if !others.is_empty() {
                        let wrong = others[rng.random_range(0..others.len())];
                        self.slip(wrong, now_ms, OverlayMsg::Data(d));
                    }
                }
                (Behaviour::ForgeAcks(f), OverlayMsg::Data(d)) if p(*f, rng) => {
                    self.hit(d.src, now_ms);
                    self.forge_ack(now_ms, &d, rng);
                }
                (Behaviour::Delay { ms, permille }, OverlayMsg::Data(d)) if p(*permille, rng) => {
                    let release = now_ms + *ms;
                    self.slip(to, release, OverlayMsg::Data(d));
                }
                (Behaviour::Collude { partner, permille }, OverlayMsg::Data(d))
                    if to == *partner && p(*permille, rng) =>
                {
                    self.hit(d.src, now_ms);
                }
                (_, m) => kept.push(m),
            }
        }
        kept
    }

    /// Drops `d` and answers it with an ack claiming every later probe and the destination
    /// received it, up to the next message of the flow.
    fn forge_ack(&mut self, now_ms: u64, d: &DataPacket, rng: &mut ChaCha8Rng) {
        let Some(pos) = d.route.iter().position(|&n| n == self.me) else {
            return;
        };
        if pos == 0 {
            return;
        }
        let mut layers: Vec<AckLayer> = d
            .probes
            .iter()
            .filter(|p| {
                d.route
                    .iter()
                    .position(|n| n == *p)
                    .is_some_and(|i| i >= pos)
            })
            .map(|&node| AckLayer {
                node,
                mac: Mac(rng.random()),
            })
            .collect();
        layers.push(AckLayer {
            node: d.dst,
            mac: Mac(rng.random()),
        });
        let ack = AckPacket {
            src: d.src,
            dst: d.dst,
            src_epoch: d.src_epoch,
            packet_id: d.packet_id,
            ttl: 16,
            layers,
            flow_ack: Some(FlowAck {
                delivery: d.delivery,
                cum: d.msg_seq + 1,
                sack: vec![],
            }),
        };
        self.slip(d.route[pos - 1], now_ms, OverlayMsg::Ack(ack));
    }

    /// Forged data claiming another source, garbage datagrams, replays.
    fn inject(
        &mut self,
        now_ms: u64,
        to: NodeId,
        frame: &mut Frame,
        rng: &mut ChaCha8Rng,
        out: &mut Vec<(NodeId, Vec<u8>)>,
    ) {
        let n = self.nodes_count;
        if rng.random_bool(0.3) && frame.unreliable.len() < self.limits.batch_msgs_max {
            let src = NodeId(rng.random_range(0..n));
            let dst = NodeId(rng.random_range(0..n));
            if src != dst && src != self.me && src != to && dst != self.me {
                let mut route = vec![src, self.me, to];
                if dst != to {
                    route.push(dst);
                }
                let hops = route.len() - 2;
                frame.unreliable.push(OverlayMsg::Data(DataPacket {
                    src,
                    dst,
                    src_epoch: rng.random_range(1..3),
                    delivery: crate::types::Delivery::Ordered,
                    msg_seq: rng.random_range(0..40),
                    flow_base: 0,
                    packet_id: rng.random(),
                    ttl: 16,
                    route,
                    probes: vec![],
                    payload: b"forged".to_vec(),
                    hop_macs: (0..hops).map(|_| Mac(rng.random())).collect(),
                    mac: Mac(rng.random()),
                }));
            }
        }
        if rng.random_bool(0.05) {
            let len = rng.random_range(0..200);
            out.push((to, (0..len).map(|_| rng.random()).collect()));
        }
        if rng.random_bool(0.05) && !self.recorded.is_empty() {
            let (t, b) = self.recorded[rng.random_range(0..self.recorded.len())].clone();
            out.push((t, b));
        }
        let _ = now_ms;
    }
}
