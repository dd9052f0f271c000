//! The network of the world: every frame a node sends goes through here, under the fault
//! model (drops, corruption, duplicates, delays, replays, forgeries, partitions) and, behind a
//! firewall, the physical links.

use super::*;

impl World {
    /// Puts a frame on the network, applying the fault model.
    pub(super) fn transmit(
        &mut self,
        from: Principal,
        to: Principal,
        mut bytes: Vec<u8>,
        extra_ms: u64,
    ) {
        self.stats.messages += 1;
        self.check_sealed(from, &bytes);
        if !self.may_travel(from, to, &bytes) {
            return;
        }
        self.capture_new_key(from, &bytes);
        self.capture_latest_new_key(from, &bytes);
        if self.partitioned(from, to) || self.split_cut(from, to, &bytes) {
            return;
        }
        // The adversary's cut lets NEW-KEYs through, so that a replica cut off while it
        // re-keyed is heard as soon as the cut ends.
        if self.cut_off(from, to) && !is_new_key(&bytes) {
            return;
        }
        // Behind a firewall the outside network (which replays, forges and captures) reaches
        // clients and agreement nodes only: the filters' links are physical.
        let outside = |p: Principal| matches!(p, Principal::Client(_) | Principal::Replica(_));
        let reachable = !self.sc.core.firewall() || (outside(from) && outside(to));
        let mut faults = if self.healed() {
            crate::scenario::NetFaults::none()
        } else {
            self.sc.net.clone()
        };
        if !reachable {
            faults.replay = 0.0;
            faults.forge = 0.0;
        }
        if faults.drop > 0.0 && self.rng.random_bool(faults.drop) {
            return;
        }
        if faults.corrupt > 0.0 && self.rng.random_bool(faults.corrupt) && !bytes.is_empty() {
            let i = self.rng.random_range(0..bytes.len());
            bytes[i] ^= 1 << self.rng.random_range(0..8);
        }
        if faults.replay > 0.0 && self.rng.random_bool(faults.replay) && !self.captured.is_empty() {
            let i = self.rng.random_range(0..self.captured.len());
            let (ofrom, old) = self.captured[i].clone();
            let target = Principal::Replica(self.rng.random_range(0..self.sc.core.n()));
            let at = self.now + self.rng.random_range(1..50);
            self.schedule(
                at,
                Ev::Deliver {
                    to: target,
                    from: ofrom,
                    bytes: old,
                },
            );
        }
        if faults.forge > 0.0 && self.rng.random_bool(faults.forge) {
            if let Ok(mut f) = decode_frame(&bytes, usize::MAX) {
                f.from = Principal::Replica(self.rng.random_range(0..self.sc.core.n()));
                let forged = encode_frame(&f);
                let target = Principal::Replica(self.rng.random_range(0..self.sc.core.n()));
                self.schedule(
                    self.now + 1,
                    Ev::Deliver {
                        to: target,
                        from,
                        bytes: forged,
                    },
                );
            }
        }
        if !reachable {
            // Not captured for replays either.
        } else if self.captured.len() < CAPTURE_MAX {
            self.captured.push((from, bytes.clone()));
        } else {
            let i = self.rng.random_range(0..CAPTURE_MAX);
            self.captured[i] = (from, bytes.clone());
        }
        let (lo, hi) = match self.sc.delay_step {
            Some((at, range)) if self.now >= at => range,
            _ => self.sc.delay_ms,
        };
        let mut delay = self.rng.random_range(lo..=hi) + extra_ms;
        if let (Principal::Replica(_), Principal::Replica(r)) = (from, to) {
            // A replica slow to hear from its peers (but not from clients).
            delay += self
                .sc
                .slow_inbound
                .iter()
                .find(|(s, _)| *s == r)
                .map_or(0, |(_, ms)| *ms);
        }
        if faults.spike > 0.0 && self.rng.random_bool(faults.spike) {
            delay += self.rng.random_range(0..=faults.spike_ms);
        }
        if faults.duplicate > 0.0 && self.rng.random_bool(faults.duplicate) {
            let d2 = delay + self.rng.random_range(0..100);
            self.schedule(
                self.now + d2,
                Ev::Deliver {
                    to,
                    from,
                    bytes: bytes.clone(),
                },
            );
        }
        self.schedule(self.now + delay, Ev::Deliver { to, from, bytes });
    }
}
