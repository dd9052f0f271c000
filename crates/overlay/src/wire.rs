//! The wire format between overlay neighbours, and the MACs that protect it.
//!
//! A datagram is a postcard-encoded envelope: the sender, the receiver, the signed bytes
//! and the link MAC under the pairwise key of the two neighbours. The MAC is checked before the
//! signed bytes are parsed into a [`Frame`], and every decoded frame is validated against the
//! configured bounds ([`Limits`]) before the node looks at it. Decoding never panics: every
//! failure is a [`WireError`], which the node counts.
//!
//! Inside a frame travel overlay messages ([`OverlayMsg`]): data packets, acks and link-state
//! updates. They carry their own end-to-end authentication:
//! - a data packet carries an end-to-end MAC (source → destination) and, when source-routed,
//!   one MAC per intermediate node (source → that node), each over the whole packet body,
//!   probe list included;
//! - an ack is a list of layers, one per acking node (probes, then the destination), each a MAC
//!   (acker → source) over the layers after it, so a node can wrap the next probe's ack but
//!   cannot strip or change it;
//! - a link-state update carries an authenticator: one MAC per node (origin → that node).

use crate::config::Config;
use crate::keys::Keys;
use crate::stats::DropReason;
use crate::types::{Delivery, NodeId};
use redoubt_crypto::{Digest, DigestBuilder, Mac, MacKey};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Version byte of every envelope.
pub const WIRE_VERSION: u8 = 1;

/// Why a datagram was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    #[error("datagram of {0} bytes exceeds frame_bytes_max")]
    TooLarge(usize),
    #[error("datagram does not decode")]
    Malformed,
    #[error("wire version {0}, expected {WIRE_VERSION}")]
    BadVersion(u8),
    #[error("datagram addressed to {0}")]
    WrongReceiver(NodeId),
    #[error("datagram from {0}, which is not a neighbour")]
    UnknownSender(NodeId),
    #[error("link MAC from {0} does not verify")]
    BadMac(NodeId),
    #[error("frame from {0} breaks a bound: {1}")]
    Invalid(NodeId, &'static str),
}

impl WireError {
    pub fn reason(&self) -> DropReason {
        match self {
            WireError::TooLarge(_) => DropReason::FrameTooLarge,
            WireError::Malformed => DropReason::FrameMalformed,
            WireError::BadVersion(_) => DropReason::FrameBadVersion,
            WireError::WrongReceiver(_) => DropReason::FrameWrongReceiver,
            WireError::UnknownSender(_) => DropReason::FrameUnknownSender,
            WireError::BadMac(_) => DropReason::FrameBadMac,
            WireError::Invalid(..) => DropReason::FrameInvalid,
        }
    }
}

/// The outer layer of a datagram.
#[derive(Serialize, Deserialize)]
struct Envelope {
    version: u8,
    from: NodeId,
    to: NodeId,
    #[serde(with = "serde_bytes")]
    signed: Vec<u8>,
    mac: Mac,
}

/// Per-datagram header: incarnations of both ends and the frame number (replay defence).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FrameHeader {
    /// The sender's incarnation.
    pub epoch: u64,
    /// The receiver's incarnation as the sender knows it (0: unknown, hello only).
    pub peer_epoch: u64,
    /// Strictly increasing per (sender incarnation, receiver), from 1.
    pub frame_no: u64,
}

/// Everything one datagram carries between neighbours.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Frame {
    pub header: FrameHeader,
    /// Hello protocol: a ping to be echoed.
    pub hello: Option<u64>,
    /// Hello protocol: the echo of the neighbour's ping.
    pub hello_echo: Option<u64>,
    /// Acknowledgement of the neighbour's reliable frames, piggybacked.
    pub ack: Option<LinkAck>,
    /// A batch on the reliable channel (selective repeat, no FIFO).
    pub reliable: Option<ReliableBatch>,
    /// Messages on the unreliable channel.
    pub unreliable: Vec<OverlayMsg>,
}

/// Cumulative and selective acknowledgement of reliable frames: every sequence number below
/// `cum` was received, and bit `i` of word `j` of `sack` says whether `cum + 1 + 64 j + i` was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LinkAck {
    pub cum: u64,
    pub sack: Vec<u64>,
}

/// One reliable frame's payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReliableBatch {
    pub seq: u64,
    pub msgs: Vec<OverlayMsg>,
}

/// A message between overlay nodes, relayed hop by hop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OverlayMsg {
    Data(DataPacket),
    Ack(AckPacket),
    Lsu(Lsu),
}

impl OverlayMsg {
    /// Rough encoded size, for filling frames without encoding twice.
    pub fn size_hint(&self) -> usize {
        match self {
            OverlayMsg::Data(d) => {
                64 + d.payload.len()
                    + 3 * d.route.len()
                    + 3 * d.probes.len()
                    + 17 * d.hop_macs.len()
            }
            OverlayMsg::Ack(a) => {
                48 + 20 * a.layers.len() + 10 * a.flow_ack.as_ref().map_or(0, |f| f.sack.len() + 2)
            }
            OverlayMsg::Lsu(l) => 40 + 8 * l.links.len() + 17 * l.auth.len(),
        }
    }
}

/// An application message in transit (ODSBR: "data packet").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPacket {
    pub src: NodeId,
    pub dst: NodeId,
    /// The source's incarnation: a destination resets a flow when it grows.
    pub src_epoch: u64,
    pub delivery: Delivery,
    /// Position of the message in its flow `(src, dst, delivery)`, from 0.
    pub msg_seq: u64,
    /// Every message of the flow below this one was acknowledged to the source: a
    /// destination that has no state for the flow (it restarted) starts it here.
    pub flow_base: u64,
    /// Unique per transmission from this source incarnation; acks name it.
    pub packet_id: u64,
    /// Hops left (link-state forwarding only; not authenticated, it changes on the way).
    pub ttl: u8,
    /// The source route, `src` first and `dst` last; empty for link-state forwarding.
    pub route: Vec<NodeId>,
    /// Intermediate nodes of `route` that must ack (ODSBR probe list), in route order.
    pub probes: Vec<NodeId>,
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// One MAC per intermediate node `route[1..len-1]`, by the source.
    pub hop_macs: Vec<Mac>,
    /// End-to-end MAC by the source for the destination.
    pub mac: Mac,
}

impl DataPacket {
    /// Digest of everything the source authenticates (all but `ttl` and the MACs).
    pub fn body_digest(&self) -> Digest {
        let mut b = DigestBuilder::new("redoubt-overlay data");
        b.u64(self.src.0 as u64)
            .u64(self.dst.0 as u64)
            .u64(self.src_epoch)
            .u64(delivery_tag(self.delivery))
            .u64(self.msg_seq)
            .u64(self.flow_base)
            .u64(self.packet_id);
        b.u64(self.route.len() as u64);
        for n in &self.route {
            b.u64(n.0 as u64);
        }
        b.u64(self.probes.len() as u64);
        for n in &self.probes {
            b.u64(n.0 as u64);
        }
        b.long_bytes(&self.payload);
        b.finish()
    }
}

/// Digest a per-hop MAC covers: the body, bound to the node it is for.
pub fn hop_digest(body: &Digest, node: NodeId) -> Digest {
    let mut b = DigestBuilder::new("redoubt-overlay hop");
    b.digest(body).u64(node.0 as u64);
    b.finish()
}

/// An acknowledgement travelling back to the source of a data packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckPacket {
    /// The data packet's source (where the ack goes).
    pub src: NodeId,
    /// The data packet's destination.
    pub dst: NodeId,
    pub src_epoch: u64,
    pub packet_id: u64,
    /// Hops left (link-state forwarding only).
    pub ttl: u8,
    /// One layer per acking node, nearest to the source first; the destination's, if present,
    /// is last and covers `flow_ack`.
    pub layers: Vec<AckLayer>,
    /// The destination's view of the flow (cumulative and selective ack of messages).
    pub flow_ack: Option<FlowAck>,
}

/// One acking node's contribution: its id and its MAC (for the source) over the packet's
/// identity and everything after this layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckLayer {
    pub node: NodeId,
    pub mac: Mac,
}

/// The destination's acknowledgement of a flow's messages: every `msg_seq` below `cum` was
/// delivered, and bit `i` of word `j` of `sack` says whether `cum + 1 + 64 j + i` was received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowAck {
    pub delivery: Delivery,
    pub cum: u64,
    pub sack: Vec<u64>,
}

/// Digest an ack layer of `node` covers, given the layers after it and the flow ack.
pub fn ack_layer_digest(
    ack: &AckPacket,
    node: NodeId,
    rest: &[AckLayer],
    flow_ack: Option<&FlowAck>,
) -> Digest {
    let mut b = DigestBuilder::new("redoubt-overlay ack layer");
    b.u64(ack.src.0 as u64)
        .u64(ack.dst.0 as u64)
        .u64(ack.src_epoch)
        .u64(ack.packet_id)
        .u64(node.0 as u64);
    b.u64(rest.len() as u64);
    for l in rest {
        b.u64(l.node.0 as u64).bytes(&l.mac.0);
    }
    match flow_ack {
        None => {
            b.u64(0);
        }
        Some(f) => {
            b.u64(1).u64(delivery_tag(f.delivery)).u64(f.cum);
            b.u64(f.sack.len() as u64);
            for w in &f.sack {
                b.u64(*w);
            }
        }
    }
    b.finish()
}

/// A link-state update: the links an origin has up, with their costs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lsu {
    pub origin: NodeId,
    pub seq: LsuSeq,
    pub links: Vec<LsuLink>,
    /// Authenticator: entry `i` is the origin's MAC for node `i` (zero for the origin itself).
    pub auth: Vec<Mac>,
}

/// Sequence number of a link-state update: incarnation first, then a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LsuSeq {
    pub epoch: u64,
    pub counter: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LsuLink {
    pub neighbour: NodeId,
    /// Cost the origin measured (latency and loss), `1..=link_cost_max`.
    pub cost: u32,
}

impl Lsu {
    pub fn digest(&self) -> Digest {
        let mut b = DigestBuilder::new("redoubt-overlay lsu");
        b.u64(self.origin.0 as u64)
            .u64(self.seq.epoch)
            .u64(self.seq.counter);
        b.u64(self.links.len() as u64);
        for l in &self.links {
            b.u64(l.neighbour.0 as u64).u64(l.cost as u64);
        }
        b.finish()
    }
}

fn delivery_tag(d: Delivery) -> u64 {
    match d {
        Delivery::Ordered => 1,
        Delivery::Unordered => 2,
    }
}

fn frame_digest(from: NodeId, to: NodeId, signed: &[u8]) -> Digest {
    let mut b = DigestBuilder::new("redoubt-overlay frame");
    b.u64(from.0 as u64).u64(to.0 as u64).long_bytes(signed);
    b.finish()
}

/// Encodes and MACs a frame from `from` to `to` under their link key.
pub fn seal(from: NodeId, to: NodeId, frame: &Frame, link_key: &MacKey) -> Vec<u8> {
    let signed = postcard::to_stdvec(frame).expect("encoding to a Vec cannot fail");
    let mac = link_key.mac(&frame_digest(from, to, &signed));
    postcard::to_stdvec(&Envelope {
        version: WIRE_VERSION,
        from,
        to,
        signed,
        mac,
    })
    .expect("encoding to a Vec cannot fail")
}

/// Reads the sender of a datagram without authenticating anything (for hosts and the
/// simulator's adversary, which must pick a key before calling [`open`]).
pub fn peek_sender(bytes: &[u8]) -> Result<(NodeId, NodeId), WireError> {
    let (env, _) =
        postcard::take_from_bytes::<Envelope>(bytes).map_err(|_| WireError::Malformed)?;
    Ok((env.from, env.to))
}

/// Decodes, authenticates and bounds-checks a datagram addressed to `me`. `link_key` returns
/// the link key of a neighbour, `None` for any other node.
pub fn open<'k>(
    bytes: &[u8],
    me: NodeId,
    limits: &Limits,
    link_key: impl Fn(NodeId) -> Option<&'k MacKey>,
) -> Result<(NodeId, Frame), WireError> {
    if bytes.len() > limits.frame_bytes_max {
        return Err(WireError::TooLarge(bytes.len()));
    }
    let env: Envelope = decode_exact(bytes)?;
    if env.version != WIRE_VERSION {
        return Err(WireError::BadVersion(env.version));
    }
    if env.to != me {
        return Err(WireError::WrongReceiver(env.to));
    }
    let key = link_key(env.from).ok_or(WireError::UnknownSender(env.from))?;
    if !key.verify(&frame_digest(env.from, env.to, &env.signed), &env.mac) {
        return Err(WireError::BadMac(env.from));
    }
    let frame: Frame = decode_exact(&env.signed)?;
    limits
        .check_frame(&frame)
        .map_err(|what| WireError::Invalid(env.from, what))?;
    Ok((env.from, frame))
}

fn decode_exact<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, WireError> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((v, [])) => Ok(v),
        _ => Err(WireError::Malformed),
    }
}

/// The bounds a decoded frame must respect.
#[derive(Clone, Debug)]
pub struct Limits {
    pub frame_bytes_max: usize,
    pub nodes_count: u16,
    pub batch_msgs_max: usize,
    pub payload_bytes_max: usize,
    pub route_hops_max: usize,
    pub link_sack_words_max: usize,
    pub flow_sack_words_max: usize,
    pub lsu_links_max: usize,
    pub link_cost_max: u32,
}

impl Limits {
    pub fn from_config(c: &Config) -> Limits {
        Limits {
            frame_bytes_max: c.frame_bytes_max,
            nodes_count: c.nodes_count,
            batch_msgs_max: c.batch_msgs_max,
            payload_bytes_max: c.payload_bytes_max,
            route_hops_max: c.route_hops_max,
            link_sack_words_max: c.link_sack_words_max(),
            flow_sack_words_max: c.flow_sack_words_max(),
            lsu_links_max: c.lsu_links_max,
            link_cost_max: c.link_cost_max,
        }
    }

    fn node(&self, n: NodeId) -> Result<(), &'static str> {
        if n.0 < self.nodes_count {
            Ok(())
        } else {
            Err("node id out of range")
        }
    }

    pub fn check_frame(&self, f: &Frame) -> Result<(), &'static str> {
        if let Some(a) = &f.ack {
            if a.sack.len() > self.link_sack_words_max {
                return Err("link sack too long");
            }
        }
        if f.unreliable.len() > self.batch_msgs_max {
            return Err("too many unreliable messages");
        }
        if f.header.frame_no == 0 || f.header.epoch == 0 {
            return Err("frame number and epoch start at 1");
        }
        let reliable = f.reliable.as_ref().map_or(&[][..], |r| &r.msgs[..]);
        if reliable.len() > self.batch_msgs_max {
            return Err("too many reliable messages");
        }
        reliable
            .iter()
            .chain(f.unreliable.iter())
            .try_for_each(|m| self.check_msg(m))
    }

    pub fn check_msg(&self, m: &OverlayMsg) -> Result<(), &'static str> {
        match m {
            OverlayMsg::Data(d) => self.check_data(d),
            OverlayMsg::Ack(a) => self.check_ack(a),
            OverlayMsg::Lsu(l) => self.check_lsu(l),
        }
    }

    fn check_data(&self, d: &DataPacket) -> Result<(), &'static str> {
        self.node(d.src)?;
        self.node(d.dst)?;
        if d.src == d.dst {
            return Err("data to itself");
        }
        if d.payload.len() > self.payload_bytes_max {
            return Err("payload too large");
        }
        if d.route.is_empty() {
            if !d.probes.is_empty() || !d.hop_macs.is_empty() {
                return Err("probes without a route");
            }
            return Ok(());
        }
        if d.route.len() < 2 || d.route.len() > self.route_hops_max + 1 {
            return Err("route length");
        }
        if d.route[0] != d.src || d.route[d.route.len() - 1] != d.dst {
            return Err("route does not join source to destination");
        }
        for (i, n) in d.route.iter().enumerate() {
            self.node(*n)?;
            if d.route[..i].contains(n) {
                return Err("route repeats a node");
            }
        }
        if d.hop_macs.len() != d.route.len() - 2 {
            return Err("one hop MAC per intermediate node");
        }
        // Probes are intermediate nodes of the route, in route order, each once.
        let mut last = 0;
        for p in &d.probes {
            match d.route[1..d.route.len() - 1].iter().position(|n| n == p) {
                Some(i) if i + 1 > last => last = i + 1,
                _ => return Err("probe list not a subsequence of the route's interior"),
            }
        }
        Ok(())
    }

    fn check_ack(&self, a: &AckPacket) -> Result<(), &'static str> {
        self.node(a.src)?;
        self.node(a.dst)?;
        if a.src == a.dst {
            return Err("ack to itself");
        }
        if a.layers.is_empty() || a.layers.len() > self.route_hops_max {
            return Err("ack layer count");
        }
        for l in &a.layers {
            self.node(l.node)?;
        }
        if let Some(f) = &a.flow_ack {
            if f.sack.len() > self.flow_sack_words_max {
                return Err("flow sack too long");
            }
        }
        Ok(())
    }

    fn check_lsu(&self, l: &Lsu) -> Result<(), &'static str> {
        self.node(l.origin)?;
        if l.links.len() > self.lsu_links_max {
            return Err("too many links in an update");
        }
        if l.auth.len() != self.nodes_count as usize {
            return Err("authenticator has one MAC per node");
        }
        for (i, link) in l.links.iter().enumerate() {
            self.node(link.neighbour)?;
            if link.neighbour == l.origin {
                return Err("link to itself");
            }
            if link.cost == 0 || link.cost > self.link_cost_max {
                return Err("link cost out of range");
            }
            if l.links[..i].iter().any(|o| o.neighbour == link.neighbour) {
                return Err("link listed twice");
            }
        }
        Ok(())
    }
}

/// Builds the authenticator of an update originated by `me`.
pub(crate) fn authenticate_lsu(lsu: &mut Lsu, me: NodeId, keys: &Keys, nodes_count: u16) {
    let d = lsu.digest();
    lsu.auth = (0..nodes_count)
        .map(|i| match keys.with(NodeId(i)) {
            Some(k) => k.lsu.mac(&d),
            None => {
                debug_assert_eq!(NodeId(i), me);
                Mac::default()
            }
        })
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Recovery, RoutingMode};
    use crate::keys::pairwise_key_for_tests;

    fn limits() -> Limits {
        Limits::from_config(&Config::new(4, RoutingMode::Odsbr, Recovery::HopByHop))
    }

    fn data() -> DataPacket {
        DataPacket {
            src: NodeId(0),
            dst: NodeId(3),
            src_epoch: 1,
            delivery: Delivery::Ordered,
            msg_seq: 7,
            flow_base: 3,
            packet_id: 9,
            ttl: 16,
            route: vec![NodeId(0), NodeId(1), NodeId(2), NodeId(3)],
            probes: vec![NodeId(2)],
            payload: b"hello".to_vec(),
            hop_macs: vec![Mac::default(); 2],
            mac: Mac::default(),
        }
    }

    fn frame() -> Frame {
        Frame {
            header: FrameHeader {
                epoch: 5,
                peer_epoch: 6,
                frame_no: 1,
            },
            hello: Some(3),
            hello_echo: None,
            ack: Some(LinkAck {
                cum: 4,
                sack: vec![0b101],
            }),
            reliable: Some(ReliableBatch {
                seq: 4,
                msgs: vec![OverlayMsg::Data(data())],
            }),
            unreliable: vec![],
        }
    }

    #[test]
    fn seal_open_round_trip() {
        let k = pairwise_key_for_tests(b"t", NodeId(0), NodeId(1));
        let bytes = seal(NodeId(0), NodeId(1), &frame(), &k);
        let (from, f) = open(&bytes, NodeId(1), &limits(), |n| {
            (n == NodeId(0)).then_some(&k)
        })
        .unwrap();
        assert_eq!(from, NodeId(0));
        assert_eq!(f, frame());
    }

    #[test]
    fn tampering_truncation_and_garbage_are_errors_not_panics() {
        let k = pairwise_key_for_tests(b"t", NodeId(0), NodeId(1));
        let key = |n: NodeId| (n == NodeId(0)).then_some(&k);
        let bytes = seal(NodeId(0), NodeId(1), &frame(), &k);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x41;
            assert!(open(&b, NodeId(1), &limits(), key).is_err(), "flip at {i}");
            assert!(open(&bytes[..i], NodeId(1), &limits(), key).is_err());
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            open(&long, NodeId(1), &limits(), key),
            Err(WireError::Malformed)
        );
        assert_eq!(
            open(&bytes, NodeId(2), &limits(), key),
            Err(WireError::WrongReceiver(NodeId(1)))
        );
        let other = pairwise_key_for_tests(b"x", NodeId(0), NodeId(1));
        assert_eq!(
            open(&bytes, NodeId(1), &limits(), |_| Some(&other)),
            Err(WireError::BadMac(NodeId(0)))
        );
        let huge = vec![0u8; 70_000];
        assert_eq!(
            open(&huge, NodeId(1), &limits(), key),
            Err(WireError::TooLarge(70_000))
        );
        // Pseudo-random garbage of many lengths.
        let mut x: u64 = 0x9e37_79b9;
        for len in 0..300 {
            let g: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert!(open(&g, NodeId(1), &limits(), key).is_err());
        }
    }

    #[test]
    fn authenticated_frames_are_still_bounds_checked() {
        let k = pairwise_key_for_tests(b"t", NodeId(0), NodeId(1));
        let key = |n: NodeId| (n == NodeId(0)).then_some(&k);
        type Mutation = Box<dyn Fn(&mut DataPacket)>;
        let cases: Vec<Mutation> = vec![
            Box::new(|d| d.route = vec![NodeId(0), NodeId(1), NodeId(1), NodeId(3)]),
            Box::new(|d| d.route[3] = NodeId(2)),
            Box::new(|d| d.hop_macs.pop().map(|_| ()).unwrap_or(())),
            Box::new(|d| d.probes = vec![NodeId(3)]),
            Box::new(|d| d.probes = vec![NodeId(2), NodeId(1)]),
            Box::new(|d| d.dst = NodeId(9)),
            Box::new(|d| d.payload = vec![0; 9_000]),
            Box::new(|d| {
                d.route.clear();
            }),
        ];
        for (i, c) in cases.iter().enumerate() {
            let mut f = frame();
            let mut d = data();
            c(&mut d);
            f.reliable = Some(ReliableBatch {
                seq: 1,
                msgs: vec![OverlayMsg::Data(d)],
            });
            let bytes = seal(NodeId(0), NodeId(1), &f, &k);
            assert!(
                matches!(
                    open(&bytes, NodeId(1), &limits(), key),
                    Err(WireError::Invalid(..))
                ),
                "case {i}"
            );
        }
    }

    #[test]
    fn body_digest_covers_probes_and_payload_but_not_ttl() {
        let d = data();
        let mut e = d.clone();
        e.ttl = 3;
        assert_eq!(d.body_digest(), e.body_digest());
        e.probes.clear();
        assert_ne!(d.body_digest(), e.body_digest());
        let mut e = d.clone();
        e.payload[0] ^= 1;
        assert_ne!(d.body_digest(), e.body_digest());
    }
}
