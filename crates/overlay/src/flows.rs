//! End-to-end flows (Spines' end-to-end reliable session): per source→destination flow,
//! message sequence numbers, a bounded window of messages in flight, retransmission by the
//! source, and at the destination duplicate suppression and (for ordered flows) a bounded
//! reorder buffer that hands messages to the application in submission order.

use crate::stats::DropReason;
use crate::types::Delivery;
use crate::wire::FlowAck;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A message the source sent and the destination has not acknowledged.
#[derive(Clone, Debug)]
pub(crate) struct OutMsg {
    pub payload: Vec<u8>,
    /// When it was last put in a packet (`None`: never yet, or it must go again).
    pub last_sent_ms: Option<u64>,
    pub sends: u32,
}

/// Source side of one flow.
#[derive(Clone, Debug)]
pub(crate) struct SourceFlow {
    pub next_seq: u64,
    /// Accepted from the application, not yet in the window.
    pub backlog: VecDeque<Vec<u8>>,
    /// In the window: sent at least once or about to be, not yet acknowledged.
    pub in_flight: BTreeMap<u64, OutMsg>,
    /// Messages that must be (re)sent as soon as there is a route and room.
    pub to_send: BTreeSet<u64>,
}

impl SourceFlow {
    pub fn new() -> SourceFlow {
        SourceFlow {
            next_seq: 0,
            backlog: VecDeque::new(),
            in_flight: BTreeMap::new(),
            to_send: BTreeSet::new(),
        }
    }

    /// Accepts a payload from the application. Returns its sequence number.
    pub fn submit(&mut self, payload: Vec<u8>, backlog_max: usize) -> Result<u64, DropReason> {
        if self.backlog.len() >= backlog_max {
            return Err(DropReason::SubmitBacklogFull);
        }
        let seq = self.next_seq + self.backlog.len() as u64;
        self.backlog.push_back(payload);
        Ok(seq)
    }

    /// Moves backlog into the window while its span allows.
    pub fn fill_window(&mut self, window_max: u64) {
        while !self.backlog.is_empty() {
            let low = self
                .in_flight
                .keys()
                .next()
                .copied()
                .unwrap_or(self.next_seq);
            if self.next_seq >= low + window_max {
                break;
            }
            let payload = self.backlog.pop_front().expect("checked non-empty");
            self.in_flight.insert(
                self.next_seq,
                OutMsg {
                    payload,
                    last_sent_ms: None,
                    sends: 0,
                },
            );
            self.to_send.insert(self.next_seq);
            self.next_seq += 1;
        }
    }

    /// Applies the destination's flow ack. Returns how many messages it released, and the
    /// gaps below its highest received message (the end-to-end nacks).
    pub fn on_flow_ack(&mut self, ack: &FlowAck) -> (usize, Vec<u64>) {
        let before = self.in_flight.len();
        // A correct destination never acks beyond what was sent; clamp a confused one.
        let cum = ack.cum.min(self.next_seq);
        let acked: Vec<u64> = self.in_flight.range(..cum).map(|(&s, _)| s).collect();
        for s in acked {
            self.in_flight.remove(&s);
            self.to_send.remove(&s);
        }
        let mut highest = None;
        for (j, word) in ack.sack.iter().enumerate() {
            let mut w = *word;
            while w != 0 {
                let i = w.trailing_zeros() as u64;
                w &= w - 1;
                let s = cum + 1 + 64 * j as u64 + i;
                highest = Some(s);
                if self.in_flight.remove(&s).is_some() {
                    self.to_send.remove(&s);
                }
            }
        }
        let nacks = match highest {
            Some(h) => self.in_flight.range(cum..h).map(|(&s, _)| s).collect(),
            None => Vec::new(),
        };
        (before - self.in_flight.len(), nacks)
    }

    pub fn is_idle(&self) -> bool {
        self.backlog.is_empty() && self.in_flight.is_empty()
    }
}

/// Destination side of one flow.
#[derive(Clone, Debug)]
pub(crate) struct DestFlow {
    pub delivery: Delivery,
    pub src_epoch: u64,
    /// Every message below this was delivered.
    pub cum: u64,
    /// Ordered: messages held until their predecessors arrive.
    buffer: BTreeMap<u64, Vec<u8>>,
    /// Unordered: messages above `cum` already delivered.
    seen: BTreeSet<u64>,
}

impl DestFlow {
    /// A flow this node has no state for, whose source says every message below `base` was
    /// acknowledged (by this node's earlier incarnation if it restarted; `0` for a new flow).
    pub fn new(delivery: Delivery, src_epoch: u64, base: u64) -> DestFlow {
        DestFlow {
            delivery,
            src_epoch,
            cum: base,
            buffer: BTreeMap::new(),
            seen: BTreeSet::new(),
        }
    }

    /// A verified message arrived. Returns the messages to hand to the application now.
    pub fn receive(
        &mut self,
        seq: u64,
        payload: Vec<u8>,
        reorder_max: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>, DropReason> {
        if seq < self.cum || self.buffer.contains_key(&seq) || self.seen.contains(&seq) {
            return Err(DropReason::E2eDuplicate);
        }
        if seq >= self.cum + reorder_max {
            return Err(DropReason::E2eReorderWindow);
        }
        let mut out = Vec::new();
        match self.delivery {
            Delivery::Ordered => {
                self.buffer.insert(seq, payload);
                while let Some(p) = self.buffer.remove(&self.cum) {
                    out.push((self.cum, p));
                    self.cum += 1;
                }
            }
            Delivery::Unordered => {
                out.push((seq, payload));
                self.seen.insert(seq);
                while self.seen.remove(&self.cum) {
                    self.cum += 1;
                }
            }
        }
        debug_assert!(self
            .buffer
            .keys()
            .chain(self.seen.iter())
            .all(|&s| s > self.cum));
        Ok(out)
    }

    /// The flow ack describing what arrived.
    pub fn flow_ack(&self, sack_words_max: usize) -> FlowAck {
        let mut sack = Vec::new();
        for &s in self.buffer.keys().chain(self.seen.iter()) {
            let i = (s - self.cum - 1) as usize;
            if i / 64 >= sack_words_max {
                break;
            }
            if sack.len() <= i / 64 {
                sack.resize(i / 64 + 1, 0);
            }
            sack[i / 64] |= 1u64 << (i % 64);
        }
        FlowAck {
            delivery: self.delivery,
            cum: self.cum,
            sack,
        }
    }

    #[cfg(test)]
    pub fn buffered(&self) -> usize {
        self.buffer.len() + self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_flow_reorders_and_suppresses_duplicates() {
        let mut d = DestFlow::new(Delivery::Ordered, 1, 0);
        assert_eq!(d.receive(1, vec![1], 64).unwrap(), vec![]);
        assert_eq!(d.receive(2, vec![2], 64).unwrap(), vec![]);
        assert_eq!(d.receive(2, vec![2], 64), Err(DropReason::E2eDuplicate));
        let ack = d.flow_ack(1);
        assert_eq!((ack.cum, ack.sack.clone()), (0, vec![0b11]));
        assert_eq!(
            d.receive(0, vec![0], 64).unwrap(),
            vec![(0, vec![0]), (1, vec![1]), (2, vec![2])]
        );
        assert_eq!(d.receive(1, vec![1], 64), Err(DropReason::E2eDuplicate));
        assert_eq!(
            d.receive(3 + 64, vec![], 64),
            Err(DropReason::E2eReorderWindow)
        );
    }

    #[test]
    fn unordered_flow_delivers_at_once_exactly_once() {
        let mut d = DestFlow::new(Delivery::Unordered, 1, 0);
        assert_eq!(d.receive(2, vec![2], 64).unwrap(), vec![(2, vec![2])]);
        assert_eq!(d.receive(2, vec![2], 64), Err(DropReason::E2eDuplicate));
        assert_eq!(d.receive(0, vec![0], 64).unwrap(), vec![(0, vec![0])]);
        assert_eq!(d.cum, 1);
        assert_eq!(d.receive(1, vec![1], 64).unwrap(), vec![(1, vec![1])]);
        assert_eq!(d.cum, 3);
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn source_window_acks_and_nacks() {
        let mut s = SourceFlow::new();
        for i in 0..10u8 {
            assert_eq!(s.submit(vec![i], 100), Ok(i as u64));
        }
        s.fill_window(4);
        assert_eq!(s.in_flight.len(), 4);
        assert_eq!(s.backlog.len(), 6);
        // Destination got 0, 2 and 3: cum 1, sack bits for 2 and 3.
        let (released, nacks) = s.on_flow_ack(&FlowAck {
            delivery: Delivery::Ordered,
            cum: 1,
            sack: vec![0b11],
        });
        assert_eq!(released, 3);
        assert_eq!(nacks, vec![1]);
        s.fill_window(4);
        assert_eq!(s.in_flight.keys().copied().collect::<Vec<_>>(), vec![1, 4]);
        assert_eq!(s.backlog.len(), 5);
        assert_eq!(s.submit(vec![], 5), Err(DropReason::SubmitBacklogFull));
    }
}
