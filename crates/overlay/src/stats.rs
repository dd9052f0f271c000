//! Counters: every datagram or message a node refuses or discards is counted with its reason.

use std::fmt;

macro_rules! drop_reasons {
    ($($(#[$doc:meta])* $name:ident => $text:literal,)*) => {
        /// Why a node discarded a datagram, a message or an application payload.
        #[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord, Hash)]
        pub enum DropReason { $($(#[$doc])* $name,)* }

        impl DropReason {
            pub const ALL: &'static [DropReason] = &[$(DropReason::$name,)*];

            /// Stable snake-case name, for metrics (`redoubt_overlay_drops_total{reason=..}`).
            pub fn name(self) -> &'static str {
                match self { $(DropReason::$name => $text,)* }
            }
        }
    };
}

drop_reasons! {
    /// Datagram longer than `frame_bytes_max`.
    FrameTooLarge => "frame_too_large",
    /// Datagram that does not decode.
    FrameMalformed => "frame_malformed",
    /// Datagram of another wire version.
    FrameBadVersion => "frame_bad_version",
    /// Datagram addressed to another node.
    FrameWrongReceiver => "frame_wrong_receiver",
    /// Datagram from a node that is not a configured neighbour.
    FrameUnknownSender => "frame_unknown_sender",
    /// Datagram whose link MAC does not verify.
    FrameBadMac => "frame_bad_mac",
    /// Authenticated datagram whose contents break a bound or a structural rule.
    FrameInvalid => "frame_invalid",
    /// Frame number already seen or older than the replay window.
    FrameReplay => "frame_replay",
    /// Frame from an older incarnation of the neighbour, or addressed to an older one of us.
    FrameStaleEpoch => "frame_stale_epoch",
    /// Reliable frame already received.
    LinkDuplicate => "link_duplicate",
    /// Reliable frame beyond the receiver's reorder window.
    LinkReorderWindow => "link_reorder_window",
    /// Unacknowledged or queued message given up when the neighbour restarted.
    LinkReset => "link_reset",
    /// Unacknowledged or queued message given up after the link stayed down `link_flush_ms`.
    LinkDown => "link_down",
    /// Unreliable message for a link that is down.
    LinkNotUp => "link_not_up",
    /// Per-source queue of a link full.
    QueueSourceFull => "queue_source_full",
    /// Link queue full; the longest source queue lost its newest message.
    QueueLinkFull => "queue_link_full",
    /// Link-state update queue of a link full.
    QueueLsuFull => "queue_lsu_full",
    /// No route to the destination (link-state forwarding).
    NoRoute => "no_route",
    /// Link-state packet whose hop budget ran out (a transient loop).
    TtlExpired => "ttl_expired",
    /// Source-routed packet that does not name us where it arrived, or arrived from the wrong
    /// neighbour (misrouted).
    RouteMismatch => "route_mismatch",
    /// Source-routed packet whose next hop is not our neighbour.
    RouteNotNeighbour => "route_not_neighbour",
    /// Source-routed packet whose per-hop MAC for us does not verify (forged or modified).
    HopBadMac => "hop_bad_mac",
    /// Source-routed packet this node already forwarded (a replay).
    DataReplay => "data_replay",
    /// Source has too many packets awaiting acks at this node.
    ForwardTableFull => "forward_table_full",
    /// Data whose end-to-end MAC does not verify at the destination.
    E2eBadMac => "e2e_bad_mac",
    /// Message already delivered.
    E2eDuplicate => "e2e_duplicate",
    /// Message beyond the destination's reorder window.
    E2eReorderWindow => "e2e_reorder_window",
    /// Message from an older incarnation of its source.
    E2eStaleEpoch => "e2e_stale_epoch",
    /// Ack for a packet this node did not forward, or after it stopped waiting.
    AckUnexpected => "ack_unexpected",
    /// Ack at the source for a packet it no longer waits for.
    AckLate => "ack_late",
    /// Ack at the source that did not come from the first hop of the packet's route.
    AckWrongNeighbour => "ack_wrong_neighbour",
    /// Link-state update whose authenticator entry for us does not verify.
    LsuBadAuth => "lsu_bad_auth",
    /// Link-state update not newer than the one held.
    LsuStale => "lsu_stale",
    /// Link-state update arriving faster than its origin may send them (held back, the newest
    /// installed when the spacing passes; counted, not lost).
    LsuRateLimited => "lsu_rate_limited",
    /// Application payload refused: flow backlog full.
    SubmitBacklogFull => "submit_backlog_full",
}

/// What a node counted since it started. Plain counters; the host exports them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Stats {
    drops: Vec<u64>,
    pub frames_received: u64,
    pub frames_sent: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// Reliable link frames sent again (timeout or gap).
    pub link_retransmits: u64,
    /// Packets a source sent again (end-to-end loss).
    pub e2e_retransmits: u64,
    pub messages_submitted: u64,
    pub messages_delivered: u64,
    pub packets_sent: u64,
    pub packets_forwarded: u64,
    /// Packets whose every expected ack verified.
    pub packets_acked: u64,
    /// Packets a source counted as lost (ODSBR: attributed to an interval).
    pub packets_lost: u64,
    pub probes_inserted: u64,
    pub probes_retired: u64,
    pub accusations: u64,
    pub lsus_originated: u64,
    pub lsus_accepted: u64,
    pub route_changes: u64,
}

impl Stats {
    pub(crate) fn count(&mut self, reason: DropReason) {
        self.count_n(reason, 1);
    }

    pub(crate) fn count_n(&mut self, reason: DropReason, n: u64) {
        if self.drops.is_empty() {
            self.drops = vec![0; DropReason::ALL.len()];
        }
        self.drops[reason as usize] += n;
    }

    /// Times `reason` was counted.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops.get(reason as usize).copied().unwrap_or(0)
    }

    /// Every reason counted at least once, with its count.
    pub fn drops_nonzero(&self) -> Vec<(DropReason, u64)> {
        DropReason::ALL
            .iter()
            .map(|&r| (r, self.drops(r)))
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// Adds another node's counters (for summaries).
    pub fn add(&mut self, other: &Stats) {
        for (r, n) in other.drops_nonzero() {
            self.count_n(r, n);
        }
        self.frames_received += other.frames_received;
        self.frames_sent += other.frames_sent;
        self.bytes_received += other.bytes_received;
        self.bytes_sent += other.bytes_sent;
        self.link_retransmits += other.link_retransmits;
        self.e2e_retransmits += other.e2e_retransmits;
        self.messages_submitted += other.messages_submitted;
        self.messages_delivered += other.messages_delivered;
        self.packets_sent += other.packets_sent;
        self.packets_forwarded += other.packets_forwarded;
        self.packets_acked += other.packets_acked;
        self.packets_lost += other.packets_lost;
        self.probes_inserted += other.probes_inserted;
        self.probes_retired += other.probes_retired;
        self.accusations += other.accusations;
        self.lsus_originated += other.lsus_originated;
        self.lsus_accepted += other.lsus_accepted;
        self.route_changes += other.route_changes;
    }
}

impl fmt::Debug for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "frames in/out {}/{}, link retx {}, e2e retx {}, submitted {}, delivered {}, \
             packets sent/acked/lost {}/{}/{}, probes +{}/-{}, accusations {}, lsus {}/{}, \
             route changes {}",
            self.frames_received,
            self.frames_sent,
            self.link_retransmits,
            self.e2e_retransmits,
            self.messages_submitted,
            self.messages_delivered,
            self.packets_sent,
            self.packets_acked,
            self.packets_lost,
            self.probes_inserted,
            self.probes_retired,
            self.accusations,
            self.lsus_originated,
            self.lsus_accepted,
            self.route_changes
        )?;
        for (r, n) in self.drops_nonzero() {
            write!(f, ", {}={}", r.name(), n)?;
        }
        Ok(())
    }
}
