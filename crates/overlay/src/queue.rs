//! A bounded fair queue: one FIFO per source, served round-robin, so that a source that floods
//! a link gets its turn like every other source and no more.
//!
//! Bounds: each source may hold `per_source_max` entries and the queue `total_max`. When the
//! queue is full, an arriving entry from a source holding less than the longest queue pushes
//! out the newest entry of the longest queue ("drop from the hog"); otherwise it is refused.
//! So a flooding source fills at most its own share and cannot starve the others.

use crate::stats::DropReason;
use crate::types::NodeId;
use std::collections::{BTreeMap, VecDeque};

#[derive(Clone, Debug)]
pub(crate) struct FairQueue<T> {
    per_source_max: usize,
    total_max: usize,
    queues: BTreeMap<NodeId, VecDeque<T>>,
    /// Sources with a non-empty queue, in service order.
    ring: VecDeque<NodeId>,
    len: usize,
}

/// What became of a push.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed<T> {
    Queued,
    /// Queued, and the newest entry of `victim`'s queue was pushed out.
    QueuedEvicting {
        victim: NodeId,
        evicted: T,
    },
    Refused(DropReason, T),
}

impl<T> FairQueue<T> {
    pub fn new(per_source_max: usize, total_max: usize) -> FairQueue<T> {
        assert!(per_source_max > 0 && total_max >= per_source_max);
        FairQueue {
            per_source_max,
            total_max,
            queues: BTreeMap::new(),
            ring: VecDeque::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, source: NodeId, item: T) -> Pushed<T> {
        let mine = self.queues.get(&source).map_or(0, |q| q.len());
        if mine >= self.per_source_max {
            return Pushed::Refused(DropReason::QueueSourceFull, item);
        }
        let mut result = Pushed::Queued;
        if self.len >= self.total_max {
            let (&hog, hog_len) = self
                .queues
                .iter()
                .map(|(s, q)| (s, q.len()))
                .max_by_key(|&(s, n)| (n, std::cmp::Reverse(*s)))
                .expect("a full queue has a longest source");
            if hog_len <= mine + 1 {
                return Pushed::Refused(DropReason::QueueLinkFull, item);
            }
            let q = self.queues.get_mut(&hog).expect("hog exists");
            let evicted = q.pop_back().expect("hog queue is not empty");
            debug_assert!(!q.is_empty(), "a hog keeps at least one entry");
            self.len -= 1;
            result = Pushed::QueuedEvicting {
                victim: hog,
                evicted,
            };
        }
        let q = self.queues.entry(source).or_default();
        if q.is_empty() {
            self.ring.push_back(source);
        }
        q.push_back(item);
        self.len += 1;
        self.check();
        result
    }

    /// The entry [`FairQueue::pop`] would return.
    pub fn peek(&self) -> Option<&T> {
        let source = self.ring.front()?;
        self.queues.get(source).and_then(|q| q.front())
    }

    /// The next entry in round-robin order over sources.
    pub fn pop(&mut self) -> Option<(NodeId, T)> {
        let source = self.ring.pop_front()?;
        let q = self
            .queues
            .get_mut(&source)
            .expect("ring names queued sources");
        let item = q.pop_front().expect("ring names non-empty queues");
        if q.is_empty() {
            self.queues.remove(&source);
        } else {
            self.ring.push_back(source);
        }
        self.len -= 1;
        self.check();
        Some((source, item))
    }

    /// Removes everything, in round-robin order.
    pub fn drain(&mut self) -> Vec<(NodeId, T)> {
        let mut out = Vec::with_capacity(self.len);
        while let Some(x) = self.pop() {
            out.push(x);
        }
        out
    }

    fn check(&self) {
        debug_assert_eq!(self.ring.len(), self.queues.len());
        debug_assert_eq!(
            self.len,
            self.queues.values().map(|q| q.len()).sum::<usize>()
        );
        debug_assert!(self.len <= self.total_max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_between_sources() {
        let mut q = FairQueue::new(100, 1000);
        for i in 0..10 {
            q.push(NodeId(1), i);
        }
        q.push(NodeId(2), 100);
        q.push(NodeId(3), 200);
        let order: Vec<_> = (0..4).map(|_| q.pop().unwrap()).collect();
        assert_eq!(
            order,
            vec![
                (NodeId(1), 0),
                (NodeId(2), 100),
                (NodeId(3), 200),
                (NodeId(1), 1)
            ]
        );
    }

    /// A flooding source fills its own share; a light source still gets every message through
    /// and is served within one round.
    #[test]
    fn flooding_source_cannot_starve_others() {
        let mut q = FairQueue::new(8, 12);
        let mut refused_flood = 0;
        for i in 0..1000 {
            if let Pushed::Refused(r, _) = q.push(NodeId(9), i) {
                assert_eq!(r, DropReason::QueueSourceFull);
                refused_flood += 1;
            }
        }
        assert_eq!(refused_flood, 992);
        for s in 1..=4 {
            let p = q.push(NodeId(s), 1000 + s as i32);
            assert!(matches!(
                p,
                Pushed::Queued
                    | Pushed::QueuedEvicting {
                        victim: NodeId(9),
                        ..
                    }
            ));
        }
        assert_eq!(q.len(), 12);
        // Every light source is served within the first round.
        let first: Vec<_> = (0..5).map(|_| q.pop().unwrap().0).collect();
        for s in 1..=4 {
            assert!(first.contains(&NodeId(s)));
        }
    }

    #[test]
    fn full_queue_refuses_when_sender_is_the_hog() {
        let mut q = FairQueue::new(4, 4);
        for i in 0..4 {
            assert_eq!(q.push(NodeId(1), i), Pushed::Queued);
        }
        assert_eq!(
            q.push(NodeId(2), 9),
            Pushed::QueuedEvicting {
                victim: NodeId(1),
                evicted: 3
            }
        );
        assert_eq!(
            q.push(NodeId(2), 10),
            Pushed::QueuedEvicting {
                victim: NodeId(1),
                evicted: 2
            }
        );
        // Now 2 and 2: neither is longer, so the newcomer is refused.
        assert_eq!(
            q.push(NodeId(2), 11),
            Pushed::Refused(DropReason::QueueLinkFull, 11)
        );
        assert_eq!(q.drain().len(), 4);
        assert!(q.is_empty());
    }
}
