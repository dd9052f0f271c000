//! Faulty replicas: the shipped runtime and protocol core, with the frames they send changed by
//! a [`Tamper`] once the attack starts.

use redoubt_core::message::{decode_body, decode_frame_ref};
use redoubt_core::types::Principal;
use redoubt_core::Bytes;
use redoubt_node::{Tamper, Timed};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// What a faulty replica does once its attack starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplicaAttack {
    /// As leader, holds each proposal (PRE-PREPARE) for `--delay-ms` before sending it
    /// (proposals stay in order; none is ever dropped)
    SlowPrimary,
    /// As leader, never sends its proposals (PRE-PREPARE) to replica `--target`
    Withhold,
    /// Holds its acknowledgements (PREPARE and COMMIT; Prime's PO-ACK and PO-ARU) for
    /// `--delay-ms`
    SlowAcks,
    /// Sends `--rate` extra frames a second, spread over its peers: copies of frames it sent
    /// them recently (authentic, stale, each checked and discarded by its receiver)
    Flood,
    /// Sends no acknowledgement at all (PREPARE, COMMIT, PO-ACK): the faulty replica of the
    /// `collude` attack, which leaves the correct replicas to vouch for every request alone
    Mute,
}

/// The kind of message a frame carries ("pre-prepare", ...), read without checking it.
fn kind(bytes: &[u8]) -> Option<&'static str> {
    let frame = decode_frame_ref(bytes, usize::MAX).ok()?;
    decode_body(frame.body).ok().map(|m| m.kind())
}

fn is_ack(kind: &str) -> bool {
    matches!(kind, "prepare" | "commit" | "po-ack" | "po-aru")
}

/// Frames kept per peer for the flood to copy.
const RECENT_MAX: usize = 64;
/// Most flood frames added in one turn of the event loop.
const FLOOD_BURST_MAX: u64 = 4096;

/// When the attack starts.
pub enum Start {
    At(Instant),
    /// When this file exists (checked every 50 ms): the benchmark creates it.
    WhenExists(std::path::PathBuf),
}

pub struct Attack {
    attack: ReplicaAttack,
    start: Start,
    started: bool,
    next_check: Instant,
    delay: Duration,
    target: u32,
    rate: u64,
    /// When the last held frame to each peer goes out (held frames stay in order; the
    /// others are not held behind them).
    last_release: HashMap<Principal, Instant>,
    recent: HashMap<u32, VecDeque<Bytes>>,
    flood_from: Option<Instant>,
    flood_sent: u64,
    flood_turn: usize,
}

impl Attack {
    pub fn new(
        attack: ReplicaAttack,
        start: Start,
        delay: Duration,
        target: u32,
        rate: u64,
    ) -> Attack {
        Attack {
            attack,
            start,
            started: false,
            next_check: Instant::now(),
            delay,
            target,
            rate,
            last_release: HashMap::new(),
            recent: HashMap::new(),
            flood_from: None,
            flood_sent: 0,
            flood_turn: 0,
        }
    }

    fn active(&mut self, now: Instant) -> bool {
        if !self.started {
            self.started = match &self.start {
                Start::At(t) => now >= *t,
                Start::WhenExists(path) if now >= self.next_check => {
                    self.next_check = now + Duration::from_millis(50);
                    let there = path.exists();
                    if there {
                        tracing::warn!(attack = ?self.attack, "attack started");
                    }
                    there
                }
                Start::WhenExists(_) => false,
            };
        }
        self.started
    }

    /// Sends `bytes` to `to` no earlier than `delay` from now, after what it held for `to`.
    fn hold(&mut self, now: Instant, to: Principal, bytes: Bytes, out: &mut Vec<Timed>) {
        let last = self.last_release.get(&to).copied().unwrap_or(now);
        let at = (now + self.delay).max(last);
        self.last_release.insert(to, at);
        out.push(Timed { at, to, bytes });
    }
}

impl Tamper for Attack {
    fn outgoing(&mut self, now: Instant, to: Principal, bytes: Bytes, out: &mut Vec<Timed>) {
        if !self.active(now) {
            out.push(Timed { at: now, to, bytes });
            return;
        }
        let k = kind(&bytes).unwrap_or("");
        match self.attack {
            ReplicaAttack::SlowPrimary if k == "pre-prepare" => self.hold(now, to, bytes, out),
            ReplicaAttack::SlowAcks if is_ack(k) => self.hold(now, to, bytes, out),
            ReplicaAttack::Withhold
                if k == "pre-prepare" && to == Principal::Replica(self.target) => {}
            ReplicaAttack::Mute if matches!(k, "prepare" | "commit" | "po-ack") => {}
            ReplicaAttack::Flood => {
                if let Principal::Replica(r) = to {
                    let q = self.recent.entry(r).or_default();
                    if q.len() == RECENT_MAX {
                        q.pop_front();
                    }
                    q.push_back(bytes.clone());
                }
                out.push(Timed { at: now, to, bytes });
            }
            _ => out.push(Timed { at: now, to, bytes }),
        }
    }

    fn tick(&mut self, now: Instant, out: &mut Vec<Timed>) {
        if self.attack != ReplicaAttack::Flood || !self.active(now) || self.recent.is_empty() {
            return;
        }
        let from = *self.flood_from.get_or_insert(now);
        let owed = (now.duration_since(from).as_secs_f64() * self.rate as f64) as u64;
        let burst = owed.saturating_sub(self.flood_sent).min(FLOOD_BURST_MAX);
        let peers: Vec<u32> = self.recent.keys().copied().collect();
        for _ in 0..burst {
            self.flood_turn += 1;
            let r = peers[self.flood_turn % peers.len()];
            let q = &self.recent[&r];
            let bytes = q[(self.flood_turn / peers.len()) % q.len()].clone();
            out.push(Timed {
                at: now,
                to: Principal::Replica(r),
                bytes,
            });
        }
        // What a burst could not carry is skipped, not owed.
        self.flood_sent = owed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_core::auth::StaticKeys;
    use redoubt_core::message::{Batch, Commit, Message, PrePrepare, Status};
    use redoubt_core::seal::seal;
    use redoubt_crypto::Digest;
    use std::sync::Arc;

    fn frame(m: &Message) -> Bytes {
        let all: Vec<Principal> = (0..4).map(Principal::Replica).collect();
        let keys = StaticKeys::derive(b"master", Principal::Replica(0), all);
        Arc::new(seal(&keys, m, None, 4))
    }

    fn pre_prepare(seq: u64) -> Bytes {
        frame(&Message::from(PrePrepare {
            view: 0,
            seq,
            digest: Digest::of(b"b"),
            batch: Batch {
                nondet: Default::default(),
                requests: Vec::new(),
                matrix: None,
            },
            beside: Vec::new(),
        }))
    }

    fn commit() -> Bytes {
        frame(&Message::from(Commit {
            view: 0,
            seq: 1,
            digest: Digest::of(b"b"),
            replica: 0,
        }))
    }

    fn status() -> Bytes {
        frame(&Message::from(Status::default()))
    }

    const MS: Duration = Duration::from_millis(1);

    fn send(a: &mut Attack, now: Instant, to: u32, b: Bytes) -> Vec<(Duration, u32)> {
        let mut out = Vec::new();
        a.outgoing(now, Principal::Replica(to), b, &mut out);
        out.into_iter()
            .map(|t| {
                let Principal::Replica(r) = t.to else {
                    panic!("to a replica")
                };
                (t.at.duration_since(now), r)
            })
            .collect()
    }

    #[test]
    fn a_slow_primary_holds_its_proposals_in_order_and_nothing_else() {
        let t0 = Instant::now();
        let start = Start::At(t0 + 10 * MS);
        let mut a = Attack::new(ReplicaAttack::SlowPrimary, start, 100 * MS, 3, 0);
        assert_eq!(
            send(&mut a, t0, 1, pre_prepare(1)),
            vec![(Duration::ZERO, 1)]
        );
        let t1 = t0 + 20 * MS;
        assert_eq!(send(&mut a, t1, 1, pre_prepare(2)), vec![(100 * MS, 1)]);
        // The next one waits for the delay after the one before it, or its own, whichever
        // is later.
        assert_eq!(
            send(&mut a, t1 + 50 * MS, 1, pre_prepare(3)),
            vec![(100 * MS, 1)]
        );
        assert_eq!(send(&mut a, t1, 1, commit()), vec![(Duration::ZERO, 1)]);
        assert_eq!(send(&mut a, t1, 2, status()), vec![(Duration::ZERO, 2)]);
    }

    #[test]
    fn withhold_drops_proposals_to_the_target_only() {
        let t0 = Instant::now();
        let mut a = Attack::new(ReplicaAttack::Withhold, Start::At(t0), MS, 3, 0);
        assert!(send(&mut a, t0, 3, pre_prepare(1)).is_empty());
        assert_eq!(send(&mut a, t0, 2, pre_prepare(1)).len(), 1);
        assert_eq!(send(&mut a, t0, 3, commit()).len(), 1);
    }

    #[test]
    fn slow_acks_hold_acknowledgements_and_mute_drops_them() {
        let t0 = Instant::now();
        let mut slow = Attack::new(ReplicaAttack::SlowAcks, Start::At(t0), 40 * MS, 3, 0);
        assert_eq!(send(&mut slow, t0, 1, commit()), vec![(40 * MS, 1)]);
        assert_eq!(
            send(&mut slow, t0, 1, pre_prepare(1)),
            vec![(Duration::ZERO, 1)]
        );
        let mut mute = Attack::new(ReplicaAttack::Mute, Start::At(t0), MS, 3, 0);
        assert!(send(&mut mute, t0, 1, commit()).is_empty());
        assert_eq!(send(&mut mute, t0, 1, status()).len(), 1);
    }

    #[test]
    fn the_start_file_switches_the_attack_on() {
        let dir = std::env::temp_dir().join(format!("redoubt-attack-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let t0 = Instant::now();
        let mut a = Attack::new(
            ReplicaAttack::Mute,
            Start::WhenExists(dir.clone()),
            MS,
            3,
            0,
        );
        assert_eq!(send(&mut a, t0, 1, commit()).len(), 1, "not yet");
        std::fs::write(&dir, b"").unwrap();
        assert!(send(&mut a, t0 + 60 * MS, 1, commit()).is_empty());
        std::fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn a_flood_sends_copies_of_recent_frames_at_its_rate() {
        let t0 = Instant::now();
        let mut a = Attack::new(ReplicaAttack::Flood, Start::At(t0), MS, 3, 10_000);
        let s = status();
        assert_eq!(send(&mut a, t0, 1, s.clone()).len(), 1);
        assert_eq!(send(&mut a, t0, 2, commit()).len(), 1);
        let mut out = Vec::new();
        a.tick(t0, &mut out);
        a.tick(t0 + 100 * MS, &mut out);
        // 10,000 a second for 100 ms, spread over both peers, each a frame sent before.
        assert_eq!(out.len(), 1000);
        let to_1 = out.iter().filter(|t| t.to == Principal::Replica(1)).count();
        assert_eq!(to_1, 500);
        assert!(out
            .iter()
            .filter(|t| t.to == Principal::Replica(1))
            .all(|t| t.bytes == s));
        out.clear();
        // A long pause is not made up for in one burst.
        a.tick(t0 + Duration::from_secs(10), &mut out);
        assert_eq!(out.len() as u64, FLOOD_BURST_MAX);
    }
}
