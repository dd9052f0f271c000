//! User-space wide-area emulation of one direction of an overlay link (the kernel here has no
//! netem): a bottleneck of `bandwidth_kbps` with a bounded queue (tail drop), then a delay line
//! of `delay_ms` plus uniform jitter, and seeded random loss. Pure: the caller passes the time
//! in microseconds and sends what [`WanLink::pop_due`] returns.

use crate::config::Emulation;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Why the emulator discarded a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WanDrop {
    /// Emulated random loss.
    Loss,
    /// The link's queue held `link_queue_bytes_max` already.
    QueueFull,
}

struct Held {
    due_us: u64,
    order: u64,
    bytes: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due_us, self.order) == (o.due_us, o.order)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due_us, self.order).cmp(&(o.due_us, o.order))
    }
}

/// One emulated direction of a link.
pub struct WanLink {
    emu: Emulation,
    rng: ChaCha8Rng,
    /// When the bottleneck finishes sending what it holds.
    free_at_us: u64,
    held: BinaryHeap<Reverse<Held>>,
    held_bytes: usize,
    queue_bytes_max: usize,
    order: u64,
}

impl WanLink {
    pub fn new(emu: Emulation, seed: u64, queue_bytes_max: usize) -> WanLink {
        WanLink {
            emu,
            rng: ChaCha8Rng::seed_from_u64(seed),
            free_at_us: 0,
            held: BinaryHeap::new(),
            held_bytes: 0,
            queue_bytes_max,
            order: 0,
        }
    }

    pub fn emulation(&self) -> Emulation {
        self.emu
    }

    /// Changes the link's behaviour from now on (datagrams already held keep their times).
    pub fn set(&mut self, emu: Emulation) {
        self.emu = emu;
    }

    /// Bytes held (in the bottleneck or the delay line).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Takes one datagram to send at `now_us`.
    pub fn offer(&mut self, now_us: u64, bytes: Vec<u8>) -> Result<(), WanDrop> {
        if self.held_bytes + bytes.len() > self.queue_bytes_max {
            return Err(WanDrop::QueueFull);
        }
        let start_us = self.free_at_us.max(now_us);
        let tx_us = if self.emu.bandwidth_kbps == 0 {
            0
        } else {
            // kbit/s = bits per ms: bytes * 8 / kbps ms = bytes * 8000 / kbps µs.
            (bytes.len() as u64 * 8_000).div_ceil(self.emu.bandwidth_kbps)
        };
        self.free_at_us = start_us + tx_us;
        // The datagram used the bottleneck either way; the loss happens on the wire.
        if self.emu.loss > 0.0 && self.rng.random_bool(self.emu.loss.min(1.0)) {
            return Err(WanDrop::Loss);
        }
        let jitter_us = if self.emu.jitter_ms == 0 {
            0
        } else {
            self.rng.random_range(0..=self.emu.jitter_ms * 1_000)
        };
        let due_us = self.free_at_us + self.emu.delay_ms * 1_000 + jitter_us;
        self.order += 1;
        self.held_bytes += bytes.len();
        self.held.push(Reverse(Held {
            due_us,
            order: self.order,
            bytes,
        }));
        Ok(())
    }

    /// When the next held datagram is due.
    pub fn next_due_us(&self) -> Option<u64> {
        self.held.peek().map(|Reverse(h)| h.due_us)
    }

    /// The next datagram due at `now_us`, if any.
    pub fn pop_due(&mut self, now_us: u64) -> Option<Vec<u8>> {
        if self.next_due_us()? > now_us {
            return None;
        }
        let Reverse(h) = self.held.pop()?;
        self.held_bytes -= h.bytes.len();
        Some(h.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(l: &mut WanLink, until_us: u64) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        while let Some(due) = l.next_due_us() {
            if due > until_us {
                break;
            }
            let b = l.pop_due(due).unwrap();
            out.push((due, b.len()));
        }
        out
    }

    #[test]
    fn delay_and_bandwidth_add_up() {
        let emu = Emulation {
            delay_ms: 10,
            bandwidth_kbps: 1_000,
            ..Emulation::default()
        };
        let mut l = WanLink::new(emu, 1, 1 << 20);
        // 1,000 bytes at 1 Mbit/s take 8 ms on the wire.
        l.offer(0, vec![0; 1_000]).unwrap();
        l.offer(0, vec![0; 1_000]).unwrap();
        assert_eq!(l.pop_due(17_999), None);
        let got = drain(&mut l, u64::MAX);
        assert_eq!(got, vec![(18_000, 1_000), (26_000, 1_000)]);
        assert_eq!(l.held_bytes(), 0);
    }

    #[test]
    fn loss_is_seeded_and_close_to_the_fraction() {
        let emu = Emulation {
            loss: 0.1,
            ..Emulation::default()
        };
        let run = |seed| {
            let mut l = WanLink::new(emu, seed, 1 << 30);
            (0..10_000)
                .filter(|&i| l.offer(i, vec![1]).is_err())
                .count()
        };
        let lost = run(5);
        assert_eq!(lost, run(5));
        assert!((800..1_200).contains(&lost), "lost {lost}");
        let all = Emulation {
            loss: 1.0,
            ..Emulation::default()
        };
        let mut l = WanLink::new(all, 1, 1 << 20);
        assert_eq!(l.offer(0, vec![1]), Err(WanDrop::Loss));
    }

    #[test]
    fn queue_is_bounded() {
        let emu = Emulation {
            bandwidth_kbps: 8,
            ..Emulation::default()
        };
        let mut l = WanLink::new(emu, 1, 2_500);
        assert!(l.offer(0, vec![0; 1_000]).is_ok());
        assert!(l.offer(0, vec![0; 1_000]).is_ok());
        assert_eq!(l.offer(0, vec![0; 1_000]), Err(WanDrop::QueueFull));
    }
}
