//! One overlay link, seen from one end (Spines §4: hello protocol, reliable data link,
//! unreliable data link, control traffic).
//!
//! - **Hello protocol.** A ping every `hello_interval_ms`, echoed at once; echoes give the round
//!   trip time and, over the last [`HELLO_HISTORY`] pings, the loss rate. A neighbour that
//!   echoed our incarnation is up; one not heard from for `link_dead_ms` is down.
//! - **Reliable channel** (selective repeat, no FIFO): frames carry a sequence number; the
//!   receiver passes each new frame up at once, in or out of order, and acks cumulatively plus a
//!   selective bitmap (its gaps are the nacks). The sender retransmits a frame when a frame sent
//!   after it was acked and a reordering allowance passed (a nack), or on timeout. At most
//!   `window_frames_max` sequence numbers are in flight; the rest waits in a fair queue.
//! - **Unreliable channel**: messages sent at once, never retransmitted.
//! - **Incarnations and replay**: every frame carries the incarnations of both ends and a frame
//!   number; frames from an older incarnation, to an older incarnation of us, or replayed, are
//!   refused. A neighbour's new incarnation resets the link's sequence state.

use crate::config::{Config, REPLAY_WINDOW_FRAMES};
use crate::queue::{FairQueue, Pushed};
use crate::stats::{DropReason, Stats};
use crate::types::NodeId;
use crate::wire::{Frame, FrameHeader, LinkAck, OverlayMsg, ReliableBatch};
use std::collections::{BTreeMap, VecDeque};

/// Pings remembered for the loss estimate.
pub const HELLO_HISTORY: usize = 16;

/// Bytes kept free in a frame for the header, acks and hellos when filling it with messages.
const FRAME_HEADROOM_BYTES: usize = 1_024;

#[derive(Clone, Debug)]
struct InFlight {
    msgs: Vec<OverlayMsg>,
    last_sent_ms: u64,
    /// Order of the last transmission among all transmissions on this link.
    tx_no: u64,
    sends: u32,
    retransmit_due: bool,
}

#[derive(Clone, Copy, Debug)]
struct HelloRecord {
    seq: u64,
    sent_ms: u64,
    echoed: bool,
}

/// What a link reports to its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkChange {
    Up,
    Down,
    /// The neighbour restarted: its routing state is gone.
    Reset,
}

#[derive(Debug)]
pub(crate) struct OverlayLink {
    pub peer: NodeId,
    my_epoch: u64,
    peer_epoch: u64,
    last_heard_ms: Option<u64>,
    up: bool,
    down_since_ms: u64,
    flushed: bool,

    replay_top: u64,
    replay_seen: [u64; (REPLAY_WINDOW_FRAMES / 64) as usize],
    next_frame_no: u64,

    next_hello_ms: u64,
    hello_seq: u64,
    hellos: VecDeque<HelloRecord>,
    echo_due: Option<u64>,
    srtt_ms: Option<u64>,
    rttvar_ms: u64,

    next_seq: u64,
    window: BTreeMap<u64, InFlight>,
    tx_counter: u64,
    backoff: u32,
    data_queue: FairQueue<OverlayMsg>,
    lsu_queue: VecDeque<OverlayMsg>,
    lsu_queue_max: usize,
    unreliable_out: Vec<OverlayMsg>,

    recv_cum: u64,
    /// `recv_seen[i]`: whether sequence number `recv_cum + i` arrived (index 0 is always false).
    recv_seen: VecDeque<bool>,
    ack_due: bool,
}

impl OverlayLink {
    pub fn new(peer: NodeId, my_epoch: u64, now_ms: u64, cfg: &Config) -> OverlayLink {
        assert!(my_epoch > 0, "incarnations start at 1");
        OverlayLink {
            peer,
            my_epoch,
            peer_epoch: 0,
            last_heard_ms: None,
            up: false,
            down_since_ms: now_ms,
            flushed: true,
            replay_top: 0,
            replay_seen: [0; (REPLAY_WINDOW_FRAMES / 64) as usize],
            next_frame_no: 1,
            next_hello_ms: now_ms,
            hello_seq: 0,
            hellos: VecDeque::with_capacity(HELLO_HISTORY),
            echo_due: None,
            srtt_ms: None,
            rttvar_ms: 0,
            next_seq: 0,
            window: BTreeMap::new(),
            tx_counter: 0,
            backoff: 0,
            data_queue: FairQueue::new(cfg.queue_msgs_per_source_max, cfg.queue_msgs_per_link_max),
            lsu_queue: VecDeque::new(),
            lsu_queue_max: cfg.queue_lsus_per_link_max,
            unreliable_out: Vec::new(),
            recv_cum: 0,
            recv_seen: std::iter::repeat_n(false, cfg.reorder_frames_max as usize).collect(),
            ack_due: false,
        }
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Smoothed round trip, if measured.
    pub fn srtt_ms(&self) -> Option<u64> {
        self.srtt_ms
    }

    /// Fraction of recent pings not echoed, per mille (pings younger than a retransmission
    /// timeout are not judged yet).
    pub fn loss_permille(&self, now_ms: u64, cfg: &Config) -> u32 {
        let patience = self.rto_ms(cfg);
        let (mut judged, mut lost) = (0u32, 0u32);
        for h in &self.hellos {
            if h.echoed {
                judged += 1;
            } else if h.sent_ms + patience <= now_ms {
                judged += 1;
                lost += 1;
            }
        }
        (lost * 1000).checked_div(judged).unwrap_or(0)
    }

    /// Messages waiting for the reliable channel.
    pub fn queued(&self) -> usize {
        self.data_queue.len() + self.lsu_queue.len()
    }

    pub fn in_flight(&self) -> usize {
        self.window.len()
    }

    fn rto_ms(&self, cfg: &Config) -> u64 {
        let base = match self.srtt_ms {
            Some(s) => s + (4 * self.rttvar_ms).max(10),
            None => cfg.rto_initial_ms,
        };
        (base.clamp(cfg.rto_min_ms, cfg.rto_max_ms) << self.backoff.min(4)).min(cfg.rto_max_ms)
    }

    fn rtt_sample(&mut self, r: u64) {
        match self.srtt_ms {
            None => {
                self.srtt_ms = Some(r);
                self.rttvar_ms = r / 2;
            }
            Some(s) => {
                self.rttvar_ms = (3 * self.rttvar_ms + s.abs_diff(r)) / 4;
                self.srtt_ms = Some((7 * s + r) / 8);
            }
        }
    }

    /// Queues a message for the reliable channel. `source` is the fairness class (the
    /// originator of the message). Returns what was dropped, if anything.
    pub fn enqueue_reliable(
        &mut self,
        source: NodeId,
        msg: OverlayMsg,
        stats: &mut Stats,
    ) -> Option<OverlayMsg> {
        if matches!(msg, OverlayMsg::Lsu(_)) {
            if self.lsu_queue.len() >= self.lsu_queue_max {
                stats.count(DropReason::QueueLsuFull);
                self.lsu_queue.pop_front();
            }
            self.lsu_queue.push_back(msg);
            return None;
        }
        match self.data_queue.push(source, msg) {
            Pushed::Queued => None,
            Pushed::QueuedEvicting { evicted, .. } => {
                stats.count(DropReason::QueueLinkFull);
                Some(evicted)
            }
            Pushed::Refused(reason, msg) => {
                stats.count(reason);
                Some(msg)
            }
        }
    }

    /// Sends a message on the unreliable channel with the next frames.
    pub fn send_unreliable(&mut self, msg: OverlayMsg, stats: &mut Stats) {
        if !self.up {
            stats.count(DropReason::LinkNotUp);
            return;
        }
        self.unreliable_out.push(msg);
    }

    /// Takes back the queued (not yet sent) data messages, e.g. to route them elsewhere.
    pub fn take_queued_data(&mut self) -> Vec<OverlayMsg> {
        self.data_queue
            .drain()
            .into_iter()
            .map(|(_, m)| m)
            .collect()
    }

    /// Handles an authenticated, bounds-checked frame from the neighbour. Returns the overlay
    /// messages it carried and any change of the link's state.
    pub fn on_frame(
        &mut self,
        now_ms: u64,
        frame: Frame,
        stats: &mut Stats,
    ) -> (Vec<OverlayMsg>, Option<LinkChange>) {
        let h = &frame.header;
        let mut change = None;
        if h.epoch < self.peer_epoch {
            stats.count(DropReason::FrameStaleEpoch);
            return (Vec::new(), None);
        }
        if h.epoch > self.peer_epoch {
            if self.peer_epoch != 0 {
                self.reset_for_new_peer_incarnation(stats);
                change = Some(LinkChange::Reset);
            }
            self.peer_epoch = h.epoch;
            self.replay_top = 0;
            self.replay_seen = [0; (REPLAY_WINDOW_FRAMES / 64) as usize];
        }
        if !self.replay_check(h.frame_no) {
            stats.count(DropReason::FrameReplay);
            return (Vec::new(), change);
        }
        self.last_heard_ms = Some(now_ms);
        if let Some(seq) = frame.hello {
            self.echo_due = Some(seq);
        }
        if let Some(seq) = frame.hello_echo {
            if let Some(rec) = self.hellos.iter_mut().find(|r| r.seq == seq && !r.echoed) {
                rec.echoed = true;
                let sample = now_ms.saturating_sub(rec.sent_ms).max(1);
                self.rtt_sample(sample);
            }
        }
        if h.peer_epoch != self.my_epoch {
            // The neighbour does not know this incarnation yet: only the hello part counts.
            if frame.ack.is_some() || frame.reliable.is_some() || !frame.unreliable.is_empty() {
                stats.count(DropReason::FrameStaleEpoch);
            }
            return (Vec::new(), change);
        }
        if !self.up {
            self.up = true;
            self.flushed = false;
            change = Some(change.unwrap_or(LinkChange::Up));
        }
        if let Some(ack) = &frame.ack {
            self.on_ack(now_ms, ack);
        }
        let mut msgs = Vec::new();
        if let Some(batch) = frame.reliable {
            self.ack_due = true;
            if self.accept_seq(batch.seq, stats) {
                msgs.extend(batch.msgs);
            }
        }
        msgs.extend(frame.unreliable);
        (msgs, change)
    }

    fn reset_for_new_peer_incarnation(&mut self, stats: &mut Stats) {
        let lost: usize = self.window.values().map(|f| f.msgs.len()).sum();
        stats.count_n(DropReason::LinkReset, lost as u64);
        self.window.clear();
        self.next_seq = 0;
        self.backoff = 0;
        self.recv_cum = 0;
        self.recv_seen.iter_mut().for_each(|b| *b = false);
        self.ack_due = false;
        self.echo_due = None;
    }

    /// Sliding window over frame numbers: accepts each number once, refuses numbers older than
    /// the window.
    fn replay_check(&mut self, n: u64) -> bool {
        let w = REPLAY_WINDOW_FRAMES;
        let slot = |k: u64| {
            let k = (k % w) as usize;
            (k / 64, 1u64 << (k % 64))
        };
        if n > self.replay_top {
            // The numbers skipped over become fresh slots.
            let advance = (n - self.replay_top).min(w);
            for k in 0..advance {
                let (word, mask) = slot(n - k);
                self.replay_seen[word] &= !mask;
            }
            self.replay_top = n;
            let (word, mask) = slot(n);
            self.replay_seen[word] |= mask;
            return true;
        }
        if n.saturating_add(w) <= self.replay_top {
            return false;
        }
        let (word, mask) = slot(n);
        if self.replay_seen[word] & mask != 0 {
            return false;
        }
        self.replay_seen[word] |= mask;
        true
    }

    /// Receiver side of the reliable channel: whether `seq` is new and within the window.
    fn accept_seq(&mut self, seq: u64, stats: &mut Stats) -> bool {
        if seq < self.recv_cum {
            stats.count(DropReason::LinkDuplicate);
            return false;
        }
        let off = (seq - self.recv_cum) as usize;
        if off >= self.recv_seen.len() {
            stats.count(DropReason::LinkReorderWindow);
            return false;
        }
        if self.recv_seen[off] {
            stats.count(DropReason::LinkDuplicate);
            return false;
        }
        self.recv_seen[off] = true;
        while self.recv_seen[0] {
            self.recv_seen.pop_front();
            self.recv_seen.push_back(false);
            self.recv_cum += 1;
        }
        true
    }

    fn current_ack(&self) -> LinkAck {
        let highest = self.recv_seen.iter().rposition(|&b| b);
        let mut sack = Vec::new();
        if let Some(hi) = highest {
            // recv_seen[1 + i] <-> bit i.
            let bits = hi; // indices 1..=hi
            sack = vec![0u64; bits.div_ceil(64)];
            for i in 0..bits {
                if self.recv_seen[1 + i] {
                    sack[i / 64] |= 1 << (i % 64);
                }
            }
        }
        LinkAck {
            cum: self.recv_cum,
            sack,
        }
    }

    fn on_ack(&mut self, now_ms: u64, ack: &LinkAck) {
        if ack.cum > self.next_seq {
            return; // Acks what was never sent: nonsense from the neighbour, ignored.
        }
        let mut acked: Vec<u64> = self.window.range(..ack.cum).map(|(&s, _)| s).collect();
        for (j, word) in ack.sack.iter().enumerate() {
            let mut w = *word;
            while w != 0 {
                let i = w.trailing_zeros() as u64;
                w &= w - 1;
                let seq = ack.cum + 1 + 64 * j as u64 + i;
                if self.window.contains_key(&seq) {
                    acked.push(seq);
                }
            }
        }
        if acked.is_empty() {
            return;
        }
        let mut max_tx = 0;
        let mut sample = None;
        for seq in acked {
            let f = self
                .window
                .remove(&seq)
                .expect("acked frames are in the window");
            max_tx = max_tx.max(f.tx_no);
            if f.sends == 1 {
                sample = Some(now_ms.saturating_sub(f.last_sent_ms).max(1));
            }
        }
        if let Some(r) = sample {
            self.rtt_sample(r);
        }
        self.backoff = 0;
        // A frame sent before one that arrived is presumed lost once the reordering allowance
        // passed (a nack: it is a gap below the receiver's highest frame).
        let reo_wnd = self.srtt_ms.map_or(5, |s| (s / 4).max(2));
        for f in self.window.values_mut() {
            if f.tx_no < max_tx && now_ms >= f.last_sent_ms + reo_wnd {
                f.retransmit_due = true;
            }
        }
    }

    /// Time passes: liveness, flush of a long-dead link, retransmission timeouts.
    pub fn tick(&mut self, now_ms: u64, cfg: &Config, stats: &mut Stats) -> Option<LinkChange> {
        let mut change = None;
        if self.up {
            let heard = self.last_heard_ms.unwrap_or(0);
            if now_ms >= heard + cfg.link_dead_ms {
                self.up = false;
                self.down_since_ms = now_ms;
                change = Some(LinkChange::Down);
            }
        }
        if !self.up && !self.flushed && now_ms >= self.down_since_ms + cfg.link_flush_ms {
            self.flushed = true;
            let lost: usize =
                self.window.values().map(|f| f.msgs.len()).sum::<usize>() + self.data_queue.len();
            stats.count_n(DropReason::LinkDown, lost as u64);
            // Sequence numbers stay: the neighbour's receiver still expects them.
            for f in self.window.values_mut() {
                f.msgs.clear();
            }
            self.data_queue.drain();
            self.lsu_queue.clear();
        }
        let rto = self.rto_ms(cfg);
        let mut timed_out = false;
        for f in self.window.values_mut() {
            if now_ms >= f.last_sent_ms + rto {
                f.retransmit_due = true;
                timed_out = true;
            }
        }
        if timed_out {
            self.backoff = (self.backoff + 1).min(4);
        }
        change
    }

    /// Earliest time at which [`OverlayLink::tick`] or [`OverlayLink::poll`] has work.
    pub fn next_deadline_ms(&self, cfg: &Config) -> u64 {
        let mut d = self.next_hello_ms;
        if self.up {
            d = d.min(self.last_heard_ms.unwrap_or(0) + cfg.link_dead_ms);
        } else if !self.flushed {
            d = d.min(self.down_since_ms + cfg.link_flush_ms);
        }
        let rto = self.rto_ms(cfg);
        if let Some(t) = self
            .window
            .values()
            .filter(|f| !f.retransmit_due)
            .map(|f| f.last_sent_ms + rto)
            .min()
        {
            d = d.min(t);
        }
        d
    }

    fn window_has_room(&self, cfg: &Config) -> bool {
        let low = self.window.keys().next().copied().unwrap_or(self.next_seq);
        self.next_seq < low + cfg.window_frames_max
    }

    fn next_header(&mut self) -> FrameHeader {
        let h = FrameHeader {
            epoch: self.my_epoch,
            peer_epoch: self.peer_epoch,
            frame_no: self.next_frame_no,
        };
        self.next_frame_no += 1;
        h
    }

    /// Produces the frames to send now: retransmissions, new reliable batches, unreliable
    /// messages, hello traffic and acks. The caller seals them.
    pub fn poll(&mut self, now_ms: u64, cfg: &Config, stats: &mut Stats) -> Vec<Frame> {
        let mut frames: Vec<Frame> = Vec::new();
        let known = self.peer_epoch != 0;
        if known {
            // Retransmissions.
            let due: Vec<u64> = self
                .window
                .iter()
                .filter(|(_, f)| f.retransmit_due)
                .map(|(&s, _)| s)
                .collect();
            for seq in due {
                self.tx_counter += 1;
                let f = self
                    .window
                    .get_mut(&seq)
                    .expect("due frames are in the window");
                f.retransmit_due = false;
                f.last_sent_ms = now_ms;
                f.tx_no = self.tx_counter;
                f.sends += 1;
                stats.link_retransmits += 1;
                frames.push(Frame {
                    reliable: Some(ReliableBatch {
                        seq,
                        msgs: f.msgs.clone(),
                    }),
                    ..Frame::default()
                });
            }
            // New reliable batches.
            while self.up
                && self.window_has_room(cfg)
                && (!self.lsu_queue.is_empty() || !self.data_queue.is_empty())
            {
                let mut msgs = Vec::new();
                let mut bytes = 0;
                let budget = cfg.frame_bytes_max - FRAME_HEADROOM_BYTES;
                while msgs.len() < cfg.batch_msgs_max {
                    let from_lsu = !self.lsu_queue.is_empty();
                    let next_size = match self.lsu_queue.front().or(self.data_queue.peek()) {
                        Some(m) => m.size_hint(),
                        None => break,
                    };
                    if !msgs.is_empty() && bytes + next_size > budget {
                        break;
                    }
                    let m = if from_lsu {
                        self.lsu_queue.pop_front().expect("checked non-empty")
                    } else {
                        self.data_queue.pop().expect("checked non-empty").1
                    };
                    bytes += next_size;
                    msgs.push(m);
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                self.tx_counter += 1;
                self.window.insert(
                    seq,
                    InFlight {
                        msgs: msgs.clone(),
                        last_sent_ms: now_ms,
                        tx_no: self.tx_counter,
                        sends: 1,
                        retransmit_due: false,
                    },
                );
                frames.push(Frame {
                    reliable: Some(ReliableBatch { seq, msgs }),
                    ..Frame::default()
                });
            }
            // Unreliable messages.
            let mut pending = std::mem::take(&mut self.unreliable_out)
                .into_iter()
                .peekable();
            while pending.peek().is_some() {
                let mut msgs = Vec::new();
                let mut bytes = 0;
                while let Some(m) = pending.peek() {
                    let sz = m.size_hint();
                    if msgs.len() >= cfg.batch_msgs_max
                        || (!msgs.is_empty()
                            && bytes + sz > cfg.frame_bytes_max - FRAME_HEADROOM_BYTES)
                    {
                        break;
                    }
                    bytes += sz;
                    msgs.push(pending.next().expect("peeked"));
                }
                frames.push(Frame {
                    unreliable: msgs,
                    ..Frame::default()
                });
            }
        }
        if now_ms >= self.next_hello_ms {
            self.hello_seq += 1;
            if self.hellos.len() == HELLO_HISTORY {
                self.hellos.pop_front();
            }
            self.hellos.push_back(HelloRecord {
                seq: self.hello_seq,
                sent_ms: now_ms,
                echoed: false,
            });
            self.next_hello_ms = now_ms + cfg.hello_interval_ms;
            match frames.first_mut() {
                Some(f) => f.hello = Some(self.hello_seq),
                None => frames.push(Frame {
                    hello: Some(self.hello_seq),
                    ..Frame::default()
                }),
            }
        }
        if let Some(seq) = self.echo_due.take() {
            match frames.first_mut() {
                Some(f) => f.hello_echo = Some(seq),
                None => frames.push(Frame {
                    hello_echo: Some(seq),
                    ..Frame::default()
                }),
            }
        }
        if known && self.ack_due && frames.is_empty() {
            frames.push(Frame::default());
        }
        if known {
            self.ack_due = false;
            let ack = self.current_ack();
            for f in &mut frames {
                f.ack = Some(ack.clone());
            }
        }
        for f in &mut frames {
            f.header = self.next_header();
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Recovery, RoutingMode};
    use crate::types::Delivery;
    use crate::wire::DataPacket;
    use redoubt_crypto::Mac;

    fn cfg() -> Config {
        let mut c = Config::new(4, RoutingMode::LinkState, Recovery::HopByHop);
        c.queue_msgs_per_source_max = 1_000;
        c.queue_msgs_per_link_max = 1_000;
        c
    }

    fn msg(i: u64) -> OverlayMsg {
        OverlayMsg::Data(DataPacket {
            src: NodeId(0),
            dst: NodeId(1),
            src_epoch: 1,
            delivery: Delivery::Ordered,
            msg_seq: i,
            flow_base: 0,
            packet_id: i,
            ttl: 8,
            route: vec![],
            probes: vec![],
            payload: vec![i as u8],
            hop_macs: vec![],
            mac: Mac::default(),
        })
    }

    /// Two ends joined by a lossy, duplicating, reordering pipe driven by a tiny PRNG.
    struct Pair {
        a: OverlayLink,
        b: OverlayLink,
        now: u64,
        in_flight: Vec<(u64, bool, Frame)>, // (arrival, to_b, frame)
        rng: u64,
        loss_permille: u64,
        dup_permille: u64,
        jitter_ms: u64,
        got_at_b: Vec<u64>,
        stats: Stats,
    }

    impl Pair {
        fn new(loss_permille: u64, dup_permille: u64, jitter_ms: u64) -> Pair {
            let c = cfg();
            Pair {
                a: OverlayLink::new(NodeId(1), 11, 0, &c),
                b: OverlayLink::new(NodeId(0), 22, 0, &c),
                now: 0,
                in_flight: vec![],
                rng: 0x1234_5678_9abc_def1,
                loss_permille,
                dup_permille,
                jitter_ms,
                got_at_b: vec![],
                stats: Stats::default(),
            }
        }

        fn rand(&mut self, n: u64) -> u64 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            self.rng % n
        }

        fn transmit(&mut self, frames: Vec<Frame>, to_b: bool) {
            for f in frames {
                if self.rand(1000) < self.loss_permille {
                    continue;
                }
                let copies = if self.rand(1000) < self.dup_permille {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let at = self.now + 10 + self.rand(self.jitter_ms + 1);
                    self.in_flight.push((at, to_b, f.clone()));
                }
            }
        }

        fn run_until(&mut self, end: u64) {
            let c = cfg();
            while self.now < end {
                self.now += 1;
                let now = self.now;
                let (arrived, rest): (Vec<_>, Vec<_>) =
                    self.in_flight.drain(..).partition(|(at, _, _)| *at <= now);
                self.in_flight = rest;
                for (_, to_b, f) in arrived {
                    if to_b {
                        let (msgs, _) = self.b.on_frame(now, f, &mut self.stats);
                        for m in msgs {
                            if let OverlayMsg::Data(d) = m {
                                self.got_at_b.push(d.msg_seq);
                            }
                        }
                    } else {
                        let _ = self.a.on_frame(now, f, &mut self.stats);
                    }
                }
                self.a.tick(now, &c, &mut self.stats);
                self.b.tick(now, &c, &mut self.stats);
                let fa = self.a.poll(now, &c, &mut self.stats);
                let fb = self.b.poll(now, &c, &mut self.stats);
                self.transmit(fa, true);
                self.transmit(fb, false);
            }
        }
    }

    fn deliver_all(loss: u64, dup: u64, jitter: u64) -> Pair {
        let mut p = Pair::new(loss, dup, jitter);
        p.run_until(2_000);
        assert!(p.a.is_up() && p.b.is_up(), "hellos bring the link up");
        let mut st = Stats::default();
        for i in 0..500 {
            assert!(p.a.enqueue_reliable(NodeId(0), msg(i), &mut st).is_none());
        }
        p.run_until(30_000);
        let mut got = p.got_at_b.clone();
        got.sort();
        assert_eq!(
            got,
            (0..500).collect::<Vec<_>>(),
            "each message exactly once"
        );
        assert_eq!(p.a.in_flight(), 0);
        assert_eq!(p.a.queued(), 0);
        p
    }

    #[test]
    fn reliable_channel_over_a_clean_link() {
        let p = deliver_all(0, 0, 0);
        assert_eq!(p.stats.link_retransmits, 0);
        assert_eq!(
            p.got_at_b,
            (0..500).collect::<Vec<_>>(),
            "in order on a FIFO pipe"
        );
    }

    #[test]
    fn reliable_channel_recovers_loss() {
        let p = deliver_all(100, 0, 0);
        assert!(p.stats.link_retransmits > 0);
    }

    #[test]
    fn reliable_channel_survives_duplication_and_reordering() {
        let p = deliver_all(20, 100, 15);
        assert!(
            p.stats.drops(DropReason::FrameReplay) > 0,
            "duplicates are refused"
        );
        assert_ne!(
            p.got_at_b,
            (0..500).collect::<Vec<_>>(),
            "reordering passes frames up"
        );
    }

    #[test]
    fn rtt_and_loss_are_measured_and_silence_brings_the_link_down() {
        let mut p = Pair::new(0, 0, 0);
        p.run_until(3_000);
        let c = cfg();
        let srtt = p.a.srtt_ms().unwrap();
        assert!((19..=23).contains(&srtt), "srtt {srtt}");
        assert_eq!(p.a.loss_permille(p.now, &c), 0);
        // Cut the pipe from b to a.
        p.loss_permille = 1000;
        p.run_until(3_000 + c.link_dead_ms + 10);
        assert!(!p.a.is_up());
        assert!(p.a.loss_permille(p.now, &c) > 200);
        p.run_until(12_000);
        assert_eq!(p.a.loss_permille(p.now, &c), 1_000);
    }

    #[test]
    fn replay_window_accepts_each_number_once() {
        let mut l = OverlayLink::new(NodeId(1), 1, 0, &cfg());
        assert!(l.replay_check(5));
        assert!(!l.replay_check(5));
        assert!(l.replay_check(3));
        assert!(l.replay_check(300));
        assert!(!l.replay_check(3), "older than the window");
        assert!(l.replay_check(299));
        assert!(!l.replay_check(299));
        assert!(l.replay_check(1000));
        assert!(l.replay_check(999));
    }

    #[test]
    fn neighbour_restart_resets_sequence_state() {
        let mut p = Pair::new(0, 0, 0);
        p.run_until(2_000);
        let mut st = Stats::default();
        for i in 0..10 {
            p.a.enqueue_reliable(NodeId(0), msg(i), &mut st);
        }
        p.run_until(3_000);
        assert_eq!(p.got_at_b.len(), 10);
        // b restarts with a larger incarnation and empty state.
        p.b = OverlayLink::new(NodeId(0), 23, p.now, &cfg());
        p.got_at_b.clear();
        p.run_until(5_000);
        for i in 10..20 {
            p.a.enqueue_reliable(NodeId(0), msg(i), &mut st);
        }
        p.run_until(8_000);
        assert_eq!(p.got_at_b, (10..20).collect::<Vec<_>>());
    }
}
