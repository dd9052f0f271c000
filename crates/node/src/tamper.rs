//! The one seam through which a replica process can be made to misbehave: an interposer on
//! the frames it sends, and an adjustment of its own protocol configuration.
//!
//! A correct deployment has neither: `redoubt replica` runs [`crate::run_replica`], which
//! passes [`Hooks::none`]. The attack harness (`redoubt-attack`, its own binary) supplies
//! Byzantine behaviours through it, so that what it runs is the shipped protocol core and
//! runtime with only the faulty replica's traffic changed.

use redoubt_core::types::Principal;
use redoubt_core::Bytes;
use std::collections::BinaryHeap;
use std::time::Instant;

/// A frame to send at a given time.
pub struct Timed {
    pub at: Instant,
    pub to: Principal,
    pub bytes: Bytes,
}

/// Interposes on every frame the replica sends, after the core sealed it and the journal
/// made it safe to send.
pub trait Tamper: Send {
    /// What goes out instead of `bytes` to `to`: any number of frames, each at its time
    /// (now or later). Pushing nothing drops the frame.
    fn outgoing(&mut self, now: Instant, to: Principal, bytes: Bytes, out: &mut Vec<Timed>);
    /// Called on every turn of the event loop: frames to add (a flood, say).
    fn tick(&mut self, _now: Instant, _out: &mut Vec<Timed>) {}
}

/// How a replica process may be altered; [`Hooks::none`] for every correct one. The frames
/// it sends go through `O`: [`Direct`] (nothing in between, nothing stored: the node of a
/// correct replica has no interposer at all) or an [`Interposer`] around a [`Tamper`].
pub struct Hooks<O: Outgoing = Direct> {
    pub outgoing: O,
    /// Applied to the protocol configuration this process's core runs with (not to the
    /// cluster file, nor to what the other replicas run).
    pub adjust: Option<Box<Adjust>>,
}

/// A change to the protocol configuration one process runs with.
pub type Adjust = dyn FnOnce(&mut redoubt_core::types::Config) + Send;

impl Hooks<Direct> {
    pub fn none() -> Hooks<Direct> {
        Hooks {
            outgoing: Direct,
            adjust: None,
        }
    }
}

impl Hooks<Interposer> {
    /// Frames the replica sends pass through `tamper` (the attack harness).
    pub fn tampered(tamper: Box<dyn Tamper>, adjust: Option<Box<Adjust>>) -> Hooks<Interposer> {
        Hooks {
            outgoing: Interposer::new(tamper),
            adjust,
        }
    }
}

/// What stands between the core's sealed frames and the links.
pub trait Outgoing: Send {
    /// Replaces `sends` by what goes out now; returns how many frames were dropped.
    fn route(&mut self, now: Instant, sends: &mut Vec<(Principal, Bytes)>) -> u64;
}

/// Nothing: the frames go out as the core sealed them.
pub struct Direct;

impl Outgoing for Direct {
    #[inline]
    fn route(&mut self, _now: Instant, _sends: &mut Vec<(Principal, Bytes)>) -> u64 {
        0
    }
}

/// Most frames held for later sending; beyond it a frame is dropped.
pub const HELD_FRAMES_MAX: usize = 1 << 16;

/// A [`Tamper`] at work in the runtime, with the frames it holds back.
pub struct Interposer {
    tamper: Box<dyn Tamper>,
    held: Held,
}

impl Interposer {
    fn new(tamper: Box<dyn Tamper>) -> Interposer {
        Interposer {
            tamper,
            held: Held::default(),
        }
    }
}

impl Outgoing for Interposer {
    /// Replaces `sends` by what goes out now: the tamper's answer to each frame and its own
    /// additions, due ones at once, later ones held, and held ones that fell due. Returns the
    /// frames dropped because [`HELD_FRAMES_MAX`] were held.
    fn route(&mut self, now: Instant, sends: &mut Vec<(Principal, Bytes)>) -> u64 {
        let mut timed = Vec::new();
        for (to, bytes) in sends.drain(..) {
            self.tamper.outgoing(now, to, bytes, &mut timed);
        }
        self.tamper.tick(now, &mut timed);
        let mut dropped = 0;
        for x in timed {
            if x.at <= now {
                sends.push((x.to, x.bytes));
            } else if !self.held.hold(x) {
                dropped += 1;
            }
        }
        self.held.due(now, sends);
        dropped
    }
}

/// Frames held until their time, earliest first (ties in arrival order).
#[derive(Default)]
pub(crate) struct Held {
    heap: BinaryHeap<Entry>,
    next: u64,
}

struct Entry {
    at: Instant,
    order: u64,
    to: Principal,
    bytes: Bytes,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // BinaryHeap is a max-heap: the earliest entry must compare greatest.
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

impl Held {
    /// Holds `t`; false (and the frame dropped) when [`HELD_FRAMES_MAX`] are held already.
    pub(crate) fn hold(&mut self, t: Timed) -> bool {
        if self.heap.len() >= HELD_FRAMES_MAX {
            return false;
        }
        self.next += 1;
        self.heap.push(Entry {
            at: t.at,
            order: self.next,
            to: t.to,
            bytes: t.bytes,
        });
        true
    }

    /// The frames due at `now`, in order.
    pub(crate) fn due(&mut self, now: Instant, out: &mut Vec<(Principal, Bytes)>) {
        while self.heap.peek().is_some_and(|e| e.at <= now) {
            let e = self.heap.pop().expect("peeked");
            out.push((e.to, e.bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn held_frames_come_out_when_due_earliest_first_ties_in_order() {
        let mut h = Held::default();
        let t0 = Instant::now();
        let f = |b: u8| Arc::new(vec![b]);
        for (ms, b) in [(30, 1u8), (10, 2), (10, 3), (20, 4)] {
            assert!(h.hold(Timed {
                at: t0 + Duration::from_millis(ms),
                to: Principal::Replica(1),
                bytes: f(b),
            }));
        }
        let mut out = Vec::new();
        h.due(t0 + Duration::from_millis(5), &mut out);
        assert!(out.is_empty());
        h.due(t0 + Duration::from_millis(20), &mut out);
        let got: Vec<u8> = out.iter().map(|(_, b)| b[0]).collect();
        assert_eq!(got, vec![2, 3, 4]);
        out.clear();
        h.due(t0 + Duration::from_millis(30), &mut out);
        assert_eq!(out.len(), 1);
        out.clear();
        h.due(t0 + Duration::from_secs(60), &mut out);
        assert!(out.is_empty(), "each frame comes out once");
    }

    /// Holds every frame 10 ms and adds one of its own per turn.
    struct Later;
    impl Tamper for Later {
        fn outgoing(&mut self, now: Instant, to: Principal, bytes: Bytes, out: &mut Vec<Timed>) {
            out.push(Timed {
                at: now + Duration::from_millis(10),
                to,
                bytes,
            });
        }
        fn tick(&mut self, now: Instant, out: &mut Vec<Timed>) {
            out.push(Timed {
                at: now,
                to: Principal::Replica(9),
                bytes: Arc::new(vec![9]),
            });
        }
    }

    #[test]
    fn the_interposer_sends_what_is_due_and_holds_the_rest() {
        let mut x = Interposer::new(Box::new(Later));
        let t0 = Instant::now();
        let mut sends = vec![(Principal::Replica(1), Arc::new(vec![1]))];
        assert_eq!(x.route(t0, &mut sends), 0);
        assert_eq!(sends, vec![(Principal::Replica(9), Arc::new(vec![9]))]);
        sends.clear();
        x.route(t0 + Duration::from_millis(10), &mut sends);
        assert_eq!(
            sends,
            vec![
                (Principal::Replica(9), Arc::new(vec![9])),
                (Principal::Replica(1), Arc::new(vec![1]))
            ]
        );
    }
}
