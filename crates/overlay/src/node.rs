//! The overlay node: the pure state machine a host drives. It owns the links to its
//! neighbours, the link-state database, the ODSBR state and the end-to-end flows, and turns
//! each [`Input`] into a list of [`Effect`]s. The data path (sending, forwarding, delivering,
//! acks) is in `datapath.rs`.

use crate::config::{Config, ConfigError, RoutingMode};
use crate::flows::{DestFlow, SourceFlow};
use crate::keys::Keys;
use crate::link::{LinkChange, OverlayLink};
use crate::odsbr::{ForwardTable, PathState, WeightList};
use crate::routing::{cost_changed_significantly, link_cost, LinkStateDb, Tree};
use crate::stats::{DropReason, Stats};
use crate::types::{Delivery, LinkId, NodeId};
use crate::wire::{self, authenticate_lsu, Limits, Lsu, LsuSeq, OverlayMsg};
use redoubt_crypto::MacKey;
use std::collections::{BTreeMap, BTreeSet};

/// What the host hands the node. Every input carries the current time in milliseconds from
/// any fixed origin; time never goes backwards (an earlier value is treated as the latest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// One datagram received from the network, as received (the node authenticates it).
    Receive { now_ms: u64, bytes: Vec<u8> },
    /// Time passed. The host calls this at or soon after [`Node::next_deadline_ms`].
    Tick { now_ms: u64 },
    /// The local application asks to send `payload` to `dst`.
    Submit {
        now_ms: u64,
        dst: NodeId,
        delivery: Delivery,
        payload: Vec<u8>,
    },
}

impl Input {
    pub fn now_ms(&self) -> u64 {
        match self {
            Input::Receive { now_ms, .. }
            | Input::Tick { now_ms }
            | Input::Submit { now_ms, .. } => *now_ms,
        }
    }
}

/// What the node asks its host to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Send one datagram to neighbour `to` (best effort: the node recovers losses).
    Send { to: NodeId, bytes: Vec<u8> },
    /// Hand a message to the local application. Within one `(src, delivery)` flow, `seq` counts
    /// from 0 per incarnation of the source; ordered flows deliver it without gaps.
    Deliver {
        src: NodeId,
        delivery: Delivery,
        seq: u64,
        payload: Vec<u8>,
    },
    /// A submitted payload was accepted as message `seq` of flow `(dst, delivery)`.
    Accepted {
        dst: NodeId,
        delivery: Delivery,
        seq: u64,
    },
    /// A submitted payload was refused.
    Rejected {
        dst: NodeId,
        delivery: Delivery,
        reason: SubmitError,
    },
    /// Something worth logging or exporting happened.
    Event(Event),
}

/// Why a submission was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("destination is this node or not in the overlay")]
    BadDestination,
    #[error("payload larger than payload_bytes_max")]
    PayloadTooLarge,
    #[error("the flow's backlog is full; retry after some messages are delivered")]
    BacklogFull,
}

/// Observable protocol events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    LinkUp {
        neighbour: NodeId,
    },
    LinkDown {
        neighbour: NodeId,
    },
    /// ODSBR: the source's route to `dst` changed.
    RouteChanged {
        dst: NodeId,
        route: Vec<NodeId>,
    },
    /// ODSBR: a fault on the route to `dst`; `probe` now acks its packets.
    ProbeAdded {
        dst: NodeId,
        probe: NodeId,
    },
    /// ODSBR: the binary search ended on `link`, whose weight is now `weight`.
    Accused {
        dst: NodeId,
        link: LinkId,
        weight: u32,
    },
}

/// One configured link as its node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkStatus {
    pub neighbour: NodeId,
    pub up: bool,
    pub srtt_ms: Option<u64>,
    /// Hellos not echoed, of the last 16.
    pub loss_permille: u32,
    /// Messages waiting for the reliable channel.
    pub queued_msgs: usize,
    /// Reliable frames sent and not acknowledged.
    pub in_flight_frames: usize,
}

/// A packet a source sent and waits to hear about.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub delivery: Delivery,
    pub msg_seq: u64,
    pub sent_ms: u64,
    pub deadline_ms: u64,
    /// ODSBR: the path epoch it was sent under.
    pub path_epoch: Option<u64>,
    /// Nodes expected to ack, in order (probes then destination).
    pub ackers: Vec<NodeId>,
    /// Neighbour it went to (ODSBR: its ack must come back from there).
    pub first_hop: NodeId,
    /// ODSBR: the source route (empty in link-state mode).
    pub route: Vec<NodeId>,
}

/// One overlay node. See the crate documentation for how a host drives it.
pub struct Node {
    pub(crate) cfg: Config,
    pub(crate) me: NodeId,
    pub(crate) epoch: u64,
    pub(crate) keys: Keys,
    pub(crate) limits: Limits,
    pub(crate) now_ms: u64,
    pub(crate) links: BTreeMap<NodeId, OverlayLink>,

    pub(crate) db: LinkStateDb,
    own_counter: u64,
    advertised: BTreeMap<NodeId, u32>,
    own_flood_due: bool,
    last_flood_ms: Option<u64>,
    next_refresh_ms: u64,
    /// Shortest-path tree cache: (database version, weights version, tree).
    pub(crate) tree_cache: Option<(u64, u64, Tree)>,
    pub(crate) ls_cache: Option<(u64, Vec<Option<NodeId>>)>,

    pub(crate) weights: WeightList,
    pub(crate) paths: BTreeMap<NodeId, PathState>,
    pub(crate) path_versions: BTreeMap<NodeId, (u64, u64)>,
    pub(crate) fresh_epoch: u64,
    pub(crate) forward: ForwardTable,

    pub(crate) out_flows: BTreeMap<(NodeId, Delivery), SourceFlow>,
    pub(crate) in_flows: BTreeMap<(NodeId, Delivery), DestFlow>,
    pub(crate) pending: BTreeMap<(NodeId, u64), Pending>,
    pub(crate) pending_deadlines: BTreeSet<(u64, NodeId, u64)>,
    pub(crate) next_packet_id: u64,
    /// Per destination: smoothed end-to-end round trip, its variation, timeout backoff.
    pub(crate) e2e_rtt: BTreeMap<NodeId, (u64, u64, u32)>,
    pub(crate) retry_at_ms: Option<u64>,

    pub(crate) stats: Stats,
    pub(crate) out: Vec<Effect>,
}

impl Node {
    /// Builds node `me`.
    ///
    /// - `neighbours`: the overlay links configured at this node (both ends must list each
    ///   other; a link is up once hellos pass both ways);
    /// - `pairwise`: one key per other node of the overlay, shared with that node;
    /// - `epoch`: this incarnation, larger than any earlier incarnation of `me` (e.g. a counter
    ///   persisted across restarts, or the wall clock in ms at start), at least 1;
    /// - `now_ms`: the current time.
    pub fn new(
        cfg: Config,
        me: NodeId,
        neighbours: &[NodeId],
        pairwise: &BTreeMap<NodeId, MacKey>,
        epoch: u64,
        now_ms: u64,
    ) -> Result<Node, ConfigError> {
        cfg.validate()?;
        if me.0 >= cfg.nodes_count {
            return Err(ConfigError::NodeOutOfRange(me.0));
        }
        if epoch == 0 {
            return Err(ConfigError::Invalid("epoch starts at 1"));
        }
        if neighbours.len() > cfg.lsu_links_max {
            return Err(ConfigError::Invalid("more neighbours than lsu_links_max"));
        }
        let keys = Keys::new(me, cfg.nodes_count, pairwise)?;
        let mut links = BTreeMap::new();
        for &n in neighbours {
            if n.0 >= cfg.nodes_count {
                return Err(ConfigError::NodeOutOfRange(n.0));
            }
            if n == me || links.contains_key(&n) {
                return Err(ConfigError::BadNeighbour(n.0));
            }
            links.insert(n, OverlayLink::new(n, epoch, now_ms, &cfg));
        }
        let mut node = Node {
            limits: Limits::from_config(&cfg),
            db: LinkStateDb::new(me, cfg.nodes_count),
            // A relay may still hold a source's old packets (their acks can arrive until the
            // relay's own deadline) when the source has already sent their retransmissions.
            forward: ForwardTable::new(2 * cfg.packets_in_flight_max),
            cfg,
            me,
            epoch,
            keys,
            now_ms,
            links,
            own_counter: 0,
            advertised: BTreeMap::new(),
            own_flood_due: false,
            last_flood_ms: None,
            next_refresh_ms: now_ms,
            tree_cache: None,
            ls_cache: None,
            weights: WeightList::default(),
            paths: BTreeMap::new(),
            path_versions: BTreeMap::new(),
            fresh_epoch: 0,
            out_flows: BTreeMap::new(),
            in_flows: BTreeMap::new(),
            pending: BTreeMap::new(),
            pending_deadlines: BTreeSet::new(),
            next_packet_id: 0,
            e2e_rtt: BTreeMap::new(),
            retry_at_ms: None,
            stats: Stats::default(),
            out: Vec::new(),
        };
        node.originate();
        Ok(node)
    }

    /// Processes one input and returns what the host must do.
    pub fn step(&mut self, input: Input) -> Vec<Effect> {
        let now = input.now_ms().max(self.now_ms);
        self.now_ms = now;
        match input {
            Input::Receive { bytes, .. } => self.on_datagram(&bytes),
            Input::Tick { .. } => self.on_tick(),
            Input::Submit {
                dst,
                delivery,
                payload,
                ..
            } => self.on_submit(dst, delivery, payload),
        }
        self.flush();
        std::mem::take(&mut self.out)
    }

    /// When the node next has timed work: the host must deliver [`Input::Tick`] at or after
    /// this time (earlier ticks are harmless).
    pub fn next_deadline_ms(&self) -> u64 {
        let mut d = self.next_refresh_ms;
        for l in self.links.values() {
            d = d.min(l.next_deadline_ms(&self.cfg));
        }
        if let Some(t) = self.db.next_expiry_ms(self.cfg.lsu_max_age_ms) {
            d = d.min(t);
        }
        if let Some(t) = self.db.next_deferred_ms(self.cfg.lsu_min_interval_ms) {
            d = d.min(t);
        }
        if self.own_flood_due {
            d = d.min(
                self.last_flood_ms
                    .map_or(0, |t| t + self.cfg.lsu_min_interval_ms),
            );
        }
        if let Some(t) = self.forward.next_deadline_ms() {
            d = d.min(t);
        }
        if let Some(&(t, _, _)) = self.pending_deadlines.first() {
            d = d.min(t);
        }
        if let Some(t) = self.retry_at_ms {
            d = d.min(t);
        }
        d.max(self.now_ms)
    }

    pub fn id(&self) -> NodeId {
        self.me
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// State of every configured link.
    pub fn links(&self) -> Vec<LinkStatus> {
        self.links
            .values()
            .map(|l| LinkStatus {
                neighbour: l.peer,
                up: l.is_up(),
                srtt_ms: l.srtt_ms(),
                loss_permille: l.loss_permille(self.now_ms, &self.cfg),
                queued_msgs: l.queued(),
                in_flight_frames: l.in_flight(),
            })
            .collect()
    }

    /// Source-routed packets forwarded and awaiting their ack (ODSBR relay state).
    pub fn forwarding_entries(&self) -> usize {
        self.forward.len()
    }

    /// ODSBR: the current route to `dst`, if one was chosen.
    pub fn route_to(&self, dst: NodeId) -> Option<&[NodeId]> {
        self.paths.get(&dst).map(|p| &p.route[..])
    }

    /// ODSBR: links this node weighs above 1 (accused and not yet rehabilitated).
    pub fn heavy_links(&self) -> Vec<(LinkId, u32)> {
        self.weights.heavy().collect()
    }

    /// Whether every message submitted here was acknowledged by its destination.
    pub fn all_acknowledged(&self) -> bool {
        self.out_flows.values().all(|f| f.is_idle())
    }

    fn on_datagram(&mut self, bytes: &[u8]) {
        self.stats.frames_received += 1;
        self.stats.bytes_received += bytes.len() as u64;
        let (links, keys) = (&self.links, &self.keys);
        let opened = wire::open(bytes, self.me, &self.limits, |n| {
            if links.contains_key(&n) {
                keys.with(n).map(|k| &k.link)
            } else {
                None
            }
        });
        let (from, frame) = match opened {
            Ok(x) => x,
            Err(e) => {
                self.stats.count(e.reason());
                return;
            }
        };
        let link = self
            .links
            .get_mut(&from)
            .expect("open() only accepts neighbours");
        let (msgs, change) = link.on_frame(self.now_ms, frame, &mut self.stats);
        if let Some(c) = change {
            self.on_link_change(from, c);
        }
        for m in msgs {
            self.on_msg(from, m);
        }
    }

    fn on_msg(&mut self, from: NodeId, m: OverlayMsg) {
        match m {
            OverlayMsg::Lsu(l) => self.on_lsu(from, l),
            OverlayMsg::Data(d) => self.on_data(from, d),
            OverlayMsg::Ack(a) => self.on_ack(from, a),
        }
    }

    fn on_link_change(&mut self, n: NodeId, c: LinkChange) {
        match c {
            LinkChange::Up | LinkChange::Reset => {
                if c == LinkChange::Up {
                    self.out.push(Effect::Event(Event::LinkUp { neighbour: n }));
                }
                // Database exchange: the neighbour may have missed any update.
                let all: Vec<Lsu> = self.db.all().cloned().collect();
                let link = self.links.get_mut(&n).expect("changes come from links");
                for l in all {
                    link.enqueue_reliable(l.origin, OverlayMsg::Lsu(l), &mut self.stats);
                }
            }
            LinkChange::Down => {
                self.out
                    .push(Effect::Event(Event::LinkDown { neighbour: n }));
                self.originate();
                if self.cfg.routing == RoutingMode::LinkState {
                    // Hop-by-hop routing: what waited for this link can go another way.
                    let queued = self
                        .links
                        .get_mut(&n)
                        .expect("changes come from links")
                        .take_queued_data();
                    for m in queued {
                        self.on_msg(self.me, m);
                    }
                }
            }
        }
    }

    fn on_lsu(&mut self, from: NodeId, l: Lsu) {
        if l.origin == self.me {
            self.stats.count(DropReason::LsuStale);
            return;
        }
        let k = self
            .keys
            .with(l.origin)
            .expect("every other node has a key");
        if !k.lsu.verify(&l.digest(), &l.auth[self.me.index()]) {
            self.stats.count(DropReason::LsuBadAuth);
            return;
        }
        match self
            .db
            .accept(l.clone(), self.now_ms, self.cfg.lsu_min_interval_ms)
        {
            Err(r) => self.stats.count(r),
            Ok(false) => self.stats.count(DropReason::LsuRateLimited),
            Ok(true) => self.flood_lsu(Some(from), l),
        }
    }

    fn flood_lsu(&mut self, except: Option<NodeId>, l: Lsu) {
        self.stats.lsus_accepted += 1;
        for (n, link) in self.links.iter_mut() {
            if Some(*n) != except && link.is_up() {
                link.enqueue_reliable(l.origin, OverlayMsg::Lsu(l.clone()), &mut self.stats);
            }
        }
    }

    /// Installs a new update of our own links at once (our routes use it) and schedules its
    /// flood (spaced by `lsu_min_interval_ms`).
    fn originate(&mut self) {
        let now = self.now_ms;
        let cfg = &self.cfg;
        self.advertised = self
            .links
            .values()
            .filter(|l| l.is_up())
            .map(|l| {
                let cost = link_cost(l.srtt_ms(), l.loss_permille(now, cfg), cfg.link_cost_max);
                (l.peer, cost)
            })
            .collect();
        self.own_counter += 1;
        let mut lsu = Lsu {
            origin: self.me,
            seq: LsuSeq {
                epoch: self.epoch,
                counter: self.own_counter,
            },
            links: self
                .advertised
                .iter()
                .map(|(&neighbour, &cost)| wire::LsuLink { neighbour, cost })
                .collect(),
            auth: Vec::new(),
        };
        authenticate_lsu(&mut lsu, self.me, &self.keys, self.cfg.nodes_count);
        self.db.install_own(lsu, now);
        self.stats.lsus_originated += 1;
        self.own_flood_due = true;
        self.next_refresh_ms = now + self.cfg.lsu_refresh_ms;
    }

    fn flood_own_if_due(&mut self) {
        if !self.own_flood_due
            || self
                .last_flood_ms
                .is_some_and(|t| self.now_ms < t + self.cfg.lsu_min_interval_ms)
        {
            return;
        }
        let own = self
            .db
            .all()
            .find(|l| l.origin == self.me)
            .expect("own update installed at construction")
            .clone();
        for link in self.links.values_mut().filter(|l| l.is_up()) {
            link.enqueue_reliable(self.me, OverlayMsg::Lsu(own.clone()), &mut self.stats);
        }
        self.own_flood_due = false;
        self.last_flood_ms = Some(self.now_ms);
    }

    /// Re-originates when a link came up or went down, or its cost moved by more than 25%.
    fn check_costs(&mut self) {
        let now = self.now_ms;
        let cfg = &self.cfg;
        let changed =
            self.links
                .values()
                .any(|l| match (l.is_up(), self.advertised.get(&l.peer)) {
                    (true, None) | (false, Some(_)) => true,
                    (false, None) => false,
                    (true, Some(&adv)) => {
                        let c =
                            link_cost(l.srtt_ms(), l.loss_permille(now, cfg), cfg.link_cost_max);
                        cost_changed_significantly(adv, c)
                    }
                });
        if changed {
            self.originate();
        }
    }

    fn on_tick(&mut self) {
        let now = self.now_ms;
        let peers: Vec<NodeId> = self.links.keys().copied().collect();
        for n in peers {
            let link = self.links.get_mut(&n).expect("listed");
            if let Some(c) = link.tick(now, &self.cfg, &mut self.stats) {
                self.on_link_change(n, c);
            }
        }
        self.db.expire(now, self.cfg.lsu_max_age_ms);
        for l in self.db.install_deferred(now, self.cfg.lsu_min_interval_ms) {
            self.flood_lsu(None, l);
        }
        if now >= self.next_refresh_ms {
            self.originate();
        }
        for (src, packet_id, f) in self.forward.expire(now) {
            if f.probe {
                self.send_own_ack_layer(src, packet_id, &f);
            }
        }
        self.expire_pending();
        if self.retry_at_ms.is_some_and(|t| now >= t) {
            self.retry_at_ms = None;
        }
    }

    /// Sends what became sendable and turns the links' frames into datagrams.
    fn flush(&mut self) {
        self.check_costs();
        self.flood_own_if_due();
        self.pump_flows();
        let now = self.now_ms;
        for (n, link) in self.links.iter_mut() {
            let frames = link.poll(now, &self.cfg, &mut self.stats);
            if frames.is_empty() {
                continue;
            }
            let key = &self.keys.with(*n).expect("neighbours have keys").link;
            for f in frames {
                let bytes = wire::seal(self.me, *n, &f, key);
                debug_assert!(
                    bytes.len() <= self.cfg.frame_bytes_max,
                    "frames respect the bound"
                );
                self.stats.frames_sent += 1;
                self.stats.bytes_sent += bytes.len() as u64;
                self.out.push(Effect::Send { to: *n, bytes });
            }
        }
    }

    /// Puts a message on the link to neighbour `n`: reliable channel in hop-by-hop mode (and
    /// always for link-state updates), unreliable otherwise.
    pub(crate) fn send_to_neighbour(&mut self, n: NodeId, source: NodeId, msg: OverlayMsg) {
        let hop_by_hop = self.cfg.recovery == crate::config::Recovery::HopByHop;
        let Some(link) = self.links.get_mut(&n) else {
            self.stats.count(DropReason::RouteNotNeighbour);
            return;
        };
        if hop_by_hop || matches!(msg, OverlayMsg::Lsu(_)) {
            link.enqueue_reliable(source, msg, &mut self.stats);
        } else {
            link.send_unreliable(msg, &mut self.stats);
        }
    }
}

#[cfg(test)]
mod tests;
