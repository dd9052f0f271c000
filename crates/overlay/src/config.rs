//! Configuration of one overlay node: modes, limits and timeouts. Every limit is explicit
//! (TigerBeetle's "put a limit on everything"); units are last in names.

use thiserror::Error;

/// Upper bound on `Config::nodes_count` (node ids are `u16`, authenticators carry one MAC per
/// node, so this also bounds the size of a link-state update).
pub const NODES_MAX: u16 = 1024;

/// Width in frames of the window of recently seen frame numbers per neighbour (replay defence).
pub const REPLAY_WINDOW_FRAMES: u64 = 256;

/// How a source picks the path of its packets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RoutingMode {
    /// Spines: every node forwards to the next hop of its own shortest-path tree. Trusts every
    /// node (benign faults only).
    LinkState,
    /// ODSBR on top of the link-state topology: the source picks the least-weight path, routes
    /// its packets along it, collects authenticated acknowledgements and localises faulty links
    /// by adaptive probing. Tolerates Byzantine intermediate nodes.
    Odsbr,
}

/// Where losses are recovered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Recovery {
    /// Spines: each overlay link retransmits its own losses (selective repeat); the source
    /// retransmits only what the links could not recover (crash, reroute, Byzantine drop).
    HopByHop,
    /// Data travels unreliably on the links; only the source retransmits, on an end-to-end nack
    /// or timeout. Exists to measure what hop-by-hop recovery buys (Spines §3).
    EndToEnd,
}

/// Deliberately broken variants, used only by the simulator's self-test to show that its
/// checkers can fail. A deployment leaves this at [`Mutant::None`]; the daemon must not expose it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Mutant {
    #[default]
    None,
    /// The source accepts probe and destination acks without checking their MACs.
    UnauthenticatedProbeAcks,
    /// The source never declares a fault, so it never probes nor accuses.
    IgnoreLossThreshold,
    /// Route selection ignores link weights, so accused links stay on the route.
    KeepAccusedRoute,
}

impl Mutant {
    pub const ALL: [Mutant; 3] = [
        Mutant::UnauthenticatedProbeAcks,
        Mutant::IgnoreLossThreshold,
        Mutant::KeepAccusedRoute,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mutant::None => "none",
            Mutant::UnauthenticatedProbeAcks => "unauthenticated-probe-acks",
            Mutant::IgnoreLossThreshold => "ignore-loss-threshold",
            Mutant::KeepAccusedRoute => "keep-accused-route",
        }
    }

    pub fn from_name(name: &str) -> Option<Mutant> {
        std::iter::once(Mutant::None)
            .chain(Mutant::ALL)
            .find(|m| m.name() == name)
    }
}

/// Configuration shared by every node of one overlay (all nodes must agree on it, except
/// `mutant`).
#[derive(Clone, Debug)]
pub struct Config {
    pub routing: RoutingMode,
    pub recovery: Recovery,
    /// Node ids are `0..nodes_count`.
    pub nodes_count: u16,

    // ---- wire ----
    /// Largest datagram accepted or produced.
    pub frame_bytes_max: usize,
    /// Largest application payload.
    pub payload_bytes_max: usize,
    /// Most overlay messages carried by one frame (reliable batch, and unreliable list).
    pub batch_msgs_max: usize,

    // ---- links (Spines hello protocol and reliable data link) ----
    pub hello_interval_ms: u64,
    /// A neighbour not heard from for this long is down.
    pub link_dead_ms: u64,
    /// A link down for this long gives up on its queued and unacknowledged frames.
    pub link_flush_ms: u64,
    /// Unacknowledged reliable frames per link (span of sequence numbers in flight).
    pub window_frames_max: u64,
    /// Span of sequence numbers a receiver tracks above its cumulative ack (multiple of 64,
    /// at least `window_frames_max`).
    pub reorder_frames_max: u64,
    pub rto_initial_ms: u64,
    pub rto_min_ms: u64,
    pub rto_max_ms: u64,
    /// Messages queued for one link from one source (fair queueing unit).
    pub queue_msgs_per_source_max: usize,
    /// Messages queued for one link in total.
    pub queue_msgs_per_link_max: usize,
    /// Link-state updates queued for one link.
    pub queue_lsus_per_link_max: usize,

    // ---- link-state routing ----
    pub lsu_refresh_ms: u64,
    pub lsu_max_age_ms: u64,
    /// Minimum spacing of a node's own updates; updates from one origin arriving faster than
    /// half of this are refused.
    pub lsu_min_interval_ms: u64,
    pub lsu_links_max: usize,
    pub link_cost_max: u32,
    /// Longest route (in hops) a packet may take; also the initial TTL in link-state mode.
    pub route_hops_max: usize,

    // ---- end-to-end flows ----
    /// Messages in flight per flow (span of message sequence numbers).
    pub flow_window_msgs_max: u64,
    /// Messages accepted from the application but not yet sent, per flow.
    pub flow_backlog_msgs_max: usize,
    /// Span of message sequence numbers a destination buffers above the next in order.
    pub reorder_msgs_max: u64,
    /// Packets a source has outstanding (awaiting an ack) in total.
    pub packets_in_flight_max: usize,
    pub e2e_rto_initial_ms: u64,
    pub e2e_rto_min_ms: u64,
    pub e2e_rto_max_ms: u64,
    /// How often a source with messages but no route looks for one again.
    pub route_retry_ms: u64,

    // ---- ODSBR ----
    /// Upper bound on the round trip of one overlay hop, queueing and link retransmissions
    /// included. A probe `k` hops from the destination waits `k` times this for the next ack
    /// (ODSBR: "the upper bound of the round trip from that probe to the destination").
    pub odsbr_hop_rtt_bound_ms: u64,
    /// τ, in per mille: a path whose loss rate over the window reaches τ has a fault.
    pub odsbr_loss_threshold_permille: u32,
    /// Size of the window of recent packets over which the loss rate is measured.
    pub odsbr_window_packets: u32,
    pub link_weight_max: u32,
    /// A source keeps its route while its cost is at most this percentage of the best route's.
    pub route_switch_hysteresis_percent: u64,

    /// Test-only: see [`Mutant`].
    pub mutant: Mutant,
}

impl Config {
    /// Defaults for an overlay of `nodes_count` nodes.
    pub fn new(nodes_count: u16, routing: RoutingMode, recovery: Recovery) -> Config {
        Config {
            routing,
            recovery,
            nodes_count,
            frame_bytes_max: 65_000,
            payload_bytes_max: 8_192,
            batch_msgs_max: 16,
            hello_interval_ms: 500,
            link_dead_ms: 2_500,
            link_flush_ms: 10_000,
            window_frames_max: 64,
            reorder_frames_max: 256,
            rto_initial_ms: 300,
            rto_min_ms: 30,
            rto_max_ms: 400,
            queue_msgs_per_source_max: 128,
            queue_msgs_per_link_max: 1024,
            queue_lsus_per_link_max: 2 * nodes_count as usize + 8,
            lsu_refresh_ms: 10_000,
            lsu_max_age_ms: 35_000,
            lsu_min_interval_ms: 200,
            lsu_links_max: 64,
            link_cost_max: 60_000,
            route_hops_max: 16,
            flow_window_msgs_max: 32,
            flow_backlog_msgs_max: 1024,
            reorder_msgs_max: 64,
            packets_in_flight_max: 512,
            e2e_rto_initial_ms: 1_000,
            e2e_rto_min_ms: 150,
            e2e_rto_max_ms: 4_000,
            route_retry_ms: 200,
            odsbr_hop_rtt_bound_ms: 500,
            odsbr_loss_threshold_permille: 100,
            odsbr_window_packets: 20,
            link_weight_max: 1 << 20,
            route_switch_hysteresis_percent: 125,
            mutant: Mutant::None,
        }
    }

    /// Checks the relations between limits that the protocol relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |what: &'static str| Err(ConfigError::Invalid(what));
        if self.nodes_count < 2 || self.nodes_count > NODES_MAX {
            return bad("nodes_count must be in 2..=1024");
        }
        if self.reorder_frames_max == 0 || !self.reorder_frames_max.is_multiple_of(64) {
            return bad("reorder_frames_max must be a positive multiple of 64");
        }
        if self.window_frames_max == 0 || self.window_frames_max > self.reorder_frames_max {
            return bad("window_frames_max must be in 1..=reorder_frames_max");
        }
        if self.flow_window_msgs_max == 0 || self.flow_window_msgs_max > self.reorder_msgs_max {
            return bad("flow_window_msgs_max must be in 1..=reorder_msgs_max");
        }
        if !self.reorder_msgs_max.is_multiple_of(64) {
            return bad("reorder_msgs_max must be a multiple of 64");
        }
        if self.batch_msgs_max == 0 || self.batch_msgs_max > 256 {
            return bad("batch_msgs_max must be in 1..=256");
        }
        if self.route_hops_max < 1 || self.route_hops_max > 64 {
            return bad("route_hops_max must be in 1..=64");
        }
        if self.payload_bytes_max + 2_048 > self.frame_bytes_max {
            return bad("frame_bytes_max must exceed payload_bytes_max by 2048");
        }
        if self.rto_min_ms == 0 || self.rto_min_ms > self.rto_max_ms {
            return bad("rto_min_ms must be in 1..=rto_max_ms");
        }
        if self.e2e_rto_min_ms == 0 || self.e2e_rto_min_ms > self.e2e_rto_max_ms {
            return bad("e2e_rto_min_ms must be in 1..=e2e_rto_max_ms");
        }
        if self.hello_interval_ms == 0 || self.link_dead_ms <= self.hello_interval_ms {
            return bad("link_dead_ms must exceed hello_interval_ms > 0");
        }
        if self.odsbr_loss_threshold_permille == 0 || self.odsbr_loss_threshold_permille > 1000 {
            return bad("odsbr_loss_threshold_permille must be in 1..=1000");
        }
        if self.odsbr_window_packets == 0 || self.odsbr_window_packets > 1024 {
            return bad("odsbr_window_packets must be in 1..=1024");
        }
        if self.odsbr_hop_rtt_bound_ms == 0 || self.link_weight_max < 2 {
            return bad("odsbr_hop_rtt_bound_ms and link_weight_max must be positive");
        }
        if self.queue_msgs_per_source_max == 0
            || self.queue_msgs_per_link_max < self.queue_msgs_per_source_max
        {
            return bad("queue_msgs_per_link_max must be >= queue_msgs_per_source_max > 0");
        }
        if self.packets_in_flight_max == 0 || self.flow_backlog_msgs_max == 0 {
            return bad("packets_in_flight_max and flow_backlog_msgs_max must be positive");
        }
        if self.lsu_links_max == 0 || self.link_cost_max == 0 || self.lsu_min_interval_ms == 0 {
            return bad("lsu_links_max, link_cost_max and lsu_min_interval_ms must be positive");
        }
        if 1_024 + 40 + 8 * self.lsu_links_max + 17 * self.nodes_count as usize
            > self.frame_bytes_max
        {
            return bad("a full link-state update must fit in frame_bytes_max");
        }
        if self.lsu_max_age_ms <= self.lsu_refresh_ms {
            return bad("lsu_max_age_ms must exceed lsu_refresh_ms");
        }
        if self.route_switch_hysteresis_percent < 100 {
            return bad("route_switch_hysteresis_percent must be at least 100");
        }
        Ok(())
    }

    /// Words of a selective-ack bitmap for link frames.
    pub(crate) fn link_sack_words_max(&self) -> usize {
        (self.reorder_frames_max / 64) as usize
    }

    /// Words of a selective-ack bitmap for flow acks.
    pub(crate) fn flow_sack_words_max(&self) -> usize {
        (self.reorder_msgs_max / 64) as usize
    }
}

/// Why a node could not be built.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid overlay configuration: {0}")]
    Invalid(&'static str),
    #[error("node {0} is outside 0..nodes_count")]
    NodeOutOfRange(u16),
    #[error("no pairwise key for node {0}: every other node needs one (ODSBR probes any node)")]
    MissingKey(u16),
    #[error("node {0} is listed as its own neighbour or twice")]
    BadNeighbour(u16),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_relations_are_checked() {
        let c = Config::new(8, RoutingMode::Odsbr, Recovery::HopByHop);
        assert_eq!(c.validate(), Ok(()));
        let mut bad = c.clone();
        bad.window_frames_max = bad.reorder_frames_max + 1;
        assert!(bad.validate().is_err());
        let mut bad = c.clone();
        bad.nodes_count = 1;
        assert!(bad.validate().is_err());
        let mut bad = c;
        bad.flow_window_msgs_max = bad.reorder_msgs_max * 2;
        assert!(bad.validate().is_err());
    }

    #[test]
    fn mutant_names_round_trip() {
        for m in Mutant::ALL {
            assert_eq!(Mutant::from_name(m.name()), Some(m));
        }
        assert_eq!(Mutant::from_name("none"), Some(Mutant::None));
        assert_eq!(Mutant::from_name("nonsense"), None);
    }
}
