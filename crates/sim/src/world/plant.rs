//! Messages that outlive a compromise (scenario field `plant`).
//!
//! While the adversary holds a replica it seals, with that replica's keys of the moment,
//! VIEW-CHANGEs for future views (lies: a zero or low stable checkpoint, fabricated
//! checkpoints, nothing prepared), VIEW-CHANGE-ACKs, NEW-VIEWs for the views the replica is
//! primary of, and CHECKPOINTs for future sequence numbers. Views are the next few, far ahead,
//! or near `u64::MAX`. Some frames go out at once (receivers accept and may store them: they
//! are planted); others are kept and released after the replica recovered, through the
//! forged-frame path (a receiver that re-keyed since they were sealed must reject them).
//! Under Prime the adversary also plants PO-ARU rows far ahead of what the replica holds,
//! signed with the order key it took (see `check_planted_rows`).
//!
//! With `Plant::join`, the coordinated attack of the review on top: the first f compromised
//! replicas plant a VIEW-CHANGE for one later view V at every replica (no prepared claims,
//! stable checkpoint 0); once they all recovered, compromise f+1 cuts f correct replicas (the
//! primary of V among them) off the others for a while (batches commit without them), then
//! sends its own VIEW-CHANGE for V, so correct replicas join V on f+1 and the primary of V
//! may decide from a set S holding f+1 lies. The adversary acks the planted messages to the
//! primary of V as soon as it is in V.

use super::*;
use redoubt_core::message::{Checkpoint, NewView, ViewChange, ViewChangeAck};
use redoubt_core::message::{PbftMessage, PrimeMessage};
use redoubt_core::prime::matrix::{PoAru, SignedPoAru};
use redoubt_core::{Seq, View, VC_VIEWS_AHEAD};
use redoubt_crypto::Digest;

/// Frames kept back for after a recovery, at most.
const HELD_MAX: usize = 256;
/// Planted VIEW-CHANGE lies remembered (one per replica and view), at most.
const LIES_MAX: usize = 256;

/// The adversary's planting state.
#[derive(Default)]
pub(super) struct Planting {
    /// The VIEW-CHANGE lie of each (replica, view), told the same to every receiver.
    vcs: BTreeMap<(ReplicaId, View), ViewChange>,
    /// One fabricated checkpoint digest per sequence number, shared by every compromise (so
    /// that lies of successive compromised replicas add up).
    fake_checkpoints: BTreeMap<Seq, Digest>,
    /// Frames kept to release after their sender recovered.
    held: Vec<Held>,
    /// The coordinated attack, once its target is chosen.
    join: Option<Join>,
    /// Replicas the adversary cuts off from the other replicas (not from clients) until
    /// `cut_until`.
    pub(super) cut: Vec<ReplicaId>,
    pub(super) cut_until: u64,
}

struct Held {
    from: ReplicaId,
    to: ReplicaId,
    bytes: Vec<u8>,
    sealed_at: u64,
}

struct Join {
    view: View,
    /// A checkpoint nobody will have, named (with a fabricated digest) in the planted
    /// VIEW-CHANGEs and, in half of the attacks, in the attacker's.
    fake_seq: Seq,
    /// The attacker's VIEW-CHANGE names the fabricated checkpoint too (then f+1 report it and
    /// it becomes the NEW-VIEW's checkpoint); otherwise it names the true stable checkpoint of
    /// the primary of `view`, and the NEW-VIEW starts there with nothing prepared above.
    fake_checkpoint: bool,
    planters: Vec<ReplicaId>,
    attacker: ReplicaId,
    /// Cut off before the attacker's VIEW-CHANGE; the first is the primary of `view`.
    victims: Vec<ReplicaId>,
    /// The attacker sent its VIEW-CHANGE (or the target view was passed before it could).
    done: bool,
    /// Acks sent to the primary of `view` once it entered it.
    acked: u32,
    /// The highest sequence number executed anywhere when the cut began.
    cut_exec: Seq,
    /// When the attacker sent its VIEW-CHANGE.
    sent_at: u64,
}

impl World {
    /// Whether the adversary's cut separates `a` from `b` now.
    pub(super) fn cut_off(&self, a: Principal, b: Principal) -> bool {
        let p = &self.planting;
        if p.cut.is_empty() || self.now >= p.cut_until {
            return false;
        }
        match (a, b) {
            (Principal::Replica(x), Principal::Replica(y)) => {
                p.cut.contains(&x) != p.cut.contains(&y)
            }
            _ => false,
        }
    }

    /// The highest view any replica is in.
    fn max_view(&self, except: Option<ReplicaId>) -> View {
        (0..self.sc.core.n())
            .filter(|r| Some(*r) != except)
            .map(|r| self.replicas[r as usize].view())
            .max()
            .unwrap_or(0)
    }

    /// Keys the adversary can seal with as `r`: current if it holds `r`, else the last ones
    /// it took from `r`.
    fn keys_of(&self, r: ReplicaId) -> Option<Forger> {
        let keys = if self.compromised == Some(r) {
            self.replicas[r as usize].auth().steal()
        } else {
            self.stolen
                .iter()
                .rev()
                .find(|s| s.replica == r)?
                .keys
                .clone()
        };
        Some(Forger {
            me: Principal::Replica(r),
            keys,
        })
    }

    /// Called when replica `r` is compromised: plants from now on, and chooses or plays its
    /// part in the coordinated attack.
    pub(super) fn plant_on_compromise(&mut self, r: ReplicaId) {
        let Some(plant) = self.sc.plant.clone() else {
            return;
        };
        if plant.join && self.planting.join.is_none() {
            self.choose_join_target(r);
        }
        let at = self.now + self.rng.random_range(20..200);
        self.schedule(at, Ev::Plant(r));
        if self
            .planting
            .join
            .as_ref()
            .is_some_and(|j| j.attacker == r && !j.done)
        {
            let at = self.now + self.rng.random_range(100..300);
            self.schedule(at, Ev::JoinAttack { step: 0 });
        }
    }

    /// Compromises go round from the first one: the first f plant and the next attacks. The
    /// target is a view close enough that correct replicas store VIEW-CHANGEs for it
    /// (`VC_VIEWS_AHEAD`; farther ones count only as claims and never enter S), led by a
    /// replica that is neither; the f cut off are its primary first, then the next others.
    fn choose_join_target(&mut self, first: ReplicaId) {
        let (n, f) = (self.sc.core.n(), self.sc.core.f);
        let planters: Vec<ReplicaId> = (0..f).map(|i| (first + i) % n).collect();
        let attacker = (first + f) % n;
        let cur = self.max_view(None);
        let bystander = |r: ReplicaId| !planters.contains(&r) && r != attacker;
        let views: Vec<View> = (cur + 1..=cur + VC_VIEWS_AHEAD)
            .filter(|v| bystander(self.sc.core.primary(*v)))
            .collect();
        let view = views[self.rng.random_range(0..views.len())];
        let lead = self.sc.core.primary(view);
        let victims: Vec<ReplicaId> = std::iter::once(lead)
            .chain(
                (1..n)
                    .map(|i| (lead + i) % n)
                    .filter(|r| bystander(*r))
                    .take(f as usize - 1),
            )
            .collect();
        let k = self.sc.core.checkpoint_interval;
        let stable = (0..n)
            .map(|r| self.replicas[r as usize].stable_checkpoint())
            .max()
            .unwrap_or(0);
        let fake_seq = (stable / k + 1000) * k;
        self.log(|| {
            format!(
                "PLANT target view {view}: planters {planters:?}, attacker r{attacker}, cut {victims:?}"
            )
        });
        self.planting.join = Some(Join {
            view,
            fake_seq,
            fake_checkpoint: false,
            planters,
            attacker,
            victims,
            done: false,
            acked: 0,
            cut_exec: 0,
            sent_at: 0,
        });
    }

    /// The VIEW-CHANGE lie of `r` for view `v` (the same every time it is asked for). With
    /// `fake`, the coordinated attack's: stable checkpoint 0, only the fabricated checkpoint
    /// `fake`, nothing prepared.
    fn planted_vc(&mut self, r: ReplicaId, v: View, fake: Option<Seq>) -> ViewChange {
        if let Some(vc) = self.planting.vcs.get(&(r, v)) {
            return vc.clone();
        }
        let k = self.sc.core.checkpoint_interval;
        let stable = self.replicas[r as usize].stable_checkpoint();
        let (ls, checkpoints) = if let Some(seq) = fake {
            (0, vec![(seq, self.fake_checkpoint(seq))])
        } else {
            match self.rng.random_range(0..3) {
                0 => (0, vec![]),
                1 => {
                    // A low (older) stable checkpoint, with its true digest if known.
                    let ls = stable.saturating_sub(k * self.rng.random_range(0..=2)) / k * k;
                    let d = match self.checker.checkpoint_digest(ls) {
                        Some(d) => d,
                        None => random_digest(&mut self.rng),
                    };
                    (ls, vec![(ls, d)])
                }
                _ => {
                    // Fabricated checkpoints above the real one.
                    let ls = (stable / k + self.rng.random_range(1..=2)) * k;
                    let a = self.fake_checkpoint(ls);
                    let b = self.fake_checkpoint(ls + k);
                    (ls, vec![(ls, a), (ls + k, b)])
                }
            }
        };
        let vc = ViewChange {
            view: v,
            replica: r,
            ls,
            checkpoints,
            p: vec![],
            q: vec![],
        };
        self.planting.vcs.insert((r, v), vc.clone());
        while self.planting.vcs.len() > LIES_MAX {
            self.planting.vcs.pop_first();
        }
        vc
    }

    fn fake_checkpoint(&mut self, seq: Seq) -> Digest {
        if let Some(d) = self.planting.fake_checkpoints.get(&seq) {
            return *d;
        }
        let d = random_digest(&mut self.rng);
        self.planting.fake_checkpoints.insert(seq, d);
        while self.planting.fake_checkpoints.len() > LIES_MAX {
            self.planting.fake_checkpoints.pop_first();
        }
        d
    }

    /// A view for a planted message: one of the next few, far ahead, or near `u64::MAX`.
    fn plant_view(&mut self, cur: View) -> View {
        match self.rng.random_range(0..10) {
            0..=6 => cur.saturating_add(self.rng.random_range(1..=3)),
            7 | 8 => cur.saturating_add(self.rng.random_range(4..100_000)),
            _ => View::MAX - self.rng.random_range(0..3),
        }
    }

    /// One random message to plant as `r`.
    fn plant_message(&mut self, r: ReplicaId) -> Message {
        let cfg = self.sc.core.clone();
        // Prime: a PO-ARU row far ahead of what `r` holds, signed with the order key taken
        // from it, meant to stay in every matrix after `r` recovered (a row is replaced only
        // by a newer one; the recovery's fresh order key retires it).
        if cfg.prime() && self.rng.random_bool(0.3) {
            if let Some(row) = self.planted_row(r) {
                return Message::Prime(PrimeMessage::PoAru(row));
            }
        }
        let (n, k, l) = (cfg.n(), cfg.checkpoint_interval, cfg.log_size);
        let cur = self.max_view(None);
        let other = (r + self.rng.random_range(1..n)) % n;
        // With the coordinated attack on, random view changes stay below its target view (a
        // later one would replace the planted one at its receivers, who keep one per sender
        // beyond their own view).
        let below = self.planting.join.as_ref().map(|j| j.view);
        match self.rng.random_range(0..10) {
            0..=4 => {
                let v = match below {
                    Some(t) => cur.saturating_add(self.rng.random_range(1..=3)).min(t - 1),
                    None => self.plant_view(cur),
                };
                Message::Pbft(PbftMessage::ViewChange(self.planted_vc(r, v, None)))
            }
            5 | 6 => {
                // An ack for another replica's view change: one the adversary planted as
                // that replica earlier if there is one (it then has f+1 vouchers), else a
                // random digest.
                let view = if self.rng.random_bool(0.7) {
                    cur.saturating_add(1)
                } else {
                    self.plant_view(cur)
                };
                let digest = match self.planting.vcs.get(&(other, view)) {
                    Some(vc) => vc.digest(),
                    None => random_digest(&mut self.rng),
                };
                Message::Pbft(PbftMessage::ViewChangeAck(ViewChangeAck {
                    view,
                    acker: r,
                    sender: other,
                    digest,
                }))
            }
            7 => {
                // A NEW-VIEW for the next view `r` is primary of, naming its planted view
                // change and others' (planted ones where there are some).
                let mut view = cur.saturating_add(1);
                while cfg.primary(view) != r && view < View::MAX {
                    view += 1;
                }
                let mine = self.planted_vc(r, view, None);
                let mut vcs = vec![(r, mine.digest())];
                for i in 1..cfg.quorum() as u32 {
                    let o = (r + i) % n;
                    let d = match self.planting.vcs.get(&(o, view)) {
                        Some(vc) => vc.digest(),
                        None => random_digest(&mut self.rng),
                    };
                    vcs.push((o, d));
                }
                let checkpoint = match mine.checkpoints.first() {
                    Some(c) => *c,
                    None => (0, random_digest(&mut self.rng)),
                };
                let chosen = (0..self.rng.random_range(0..3))
                    .map(|_| {
                        if self.rng.random_bool(0.5) {
                            redoubt_core::message::NULL_DIGEST
                        } else {
                            random_digest(&mut self.rng)
                        }
                    })
                    .collect();
                Message::Pbft(PbftMessage::NewView(NewView {
                    view,
                    vcs,
                    checkpoint,
                    chosen,
                    batches: vec![],
                }))
            }
            _ => {
                // A vote for a future checkpoint: within the next windows, far ahead or near
                // u64::MAX; mostly with the digest every compromise uses for that seq.
                let stable = self.replicas[r as usize].stable_checkpoint();
                let seq = match self.rng.random_range(0..10) {
                    0..=6 => (stable / k + self.rng.random_range(1..=l / k + 2)) * k,
                    7 | 8 => (stable / k + self.rng.random_range(100..100_000)) * k,
                    _ => (Seq::MAX / k - self.rng.random_range(0..4)) * k,
                };
                let digest = if self.rng.random_bool(0.8) {
                    self.fake_checkpoint(seq)
                } else {
                    random_digest(&mut self.rng)
                };
                Message::Pbft(PbftMessage::Checkpoint(Checkpoint {
                    seq,
                    digest,
                    replica: r,
                }))
            }
        }
    }

    /// A PO-ARU row of `r` claiming certificates far beyond anything it holds, signed with
    /// the order key the adversary takes from it.
    fn planted_row(&mut self, r: ReplicaId) -> Option<SignedPoAru> {
        let rep = &self.replicas[r as usize];
        let (inc, key) = rep.order_key()?;
        let (_, cum) = rep.prime_rows()?;
        let ahead = 1000 * self.sc.core.prime_window;
        let aru: Vec<Seq> = cum.iter().map(|s| s + ahead).collect();
        let row = PoAru {
            replica: r,
            inc,
            num: aru.iter().sum(),
            aru,
        };
        let sig = key.sign(&row.statement().0);
        self.stats.rows_planted += 1;
        Some(SignedPoAru { row, sig })
    }

    /// Planting while the adversary holds `r` (repeats until the watchdog takes it back).
    pub(super) fn plant_tick(&mut self, r: ReplicaId) {
        if self.compromised != Some(r) {
            return;
        }
        let n = self.sc.core.n();
        let Some(keys) = self.keys_of(r) else {
            return;
        };
        // The coordinated attack's planters: their VIEW-CHANGE for the target view, to all.
        let target = self
            .planting
            .join
            .as_ref()
            .filter(|j| j.planters.contains(&r) && !j.done)
            .map(|j| (j.view, j.fake_seq));
        if let Some((v, fake)) = target {
            if self.max_view(Some(r)) < v {
                let vc = Message::from(self.planted_vc(r, v, Some(fake)));
                for t in (0..n).filter(|t| *t != r) {
                    let bytes = seal(&keys, &vc, Some(Principal::Replica(t)), n);
                    self.stats.planted_sent += 1;
                    self.transmit(Principal::Replica(r), Principal::Replica(t), bytes, 0);
                }
            }
        }
        // The coordinated attack's attacker keeps quiet until it attacked: its own planted
        // view changes would make the others join a view early (see `quorum::join_view`).
        let quiet = self
            .planting
            .join
            .as_ref()
            .is_some_and(|j| j.attacker == r && !j.done);
        for _ in 0..if quiet {
            0
        } else {
            self.rng.random_range(1..=3)
        } {
            let msg = self.plant_message(r);
            let hold = self.rng.random_bool(0.4);
            let targets: Vec<ReplicaId> = if self.rng.random_bool(0.5) {
                (0..n).filter(|t| *t != r).collect()
            } else {
                vec![(r + self.rng.random_range(1..n)) % n]
            };
            if self.trace_on {
                let to = Some(Principal::Replica(targets[0]));
                let d = describe(&seal(&keys, &msg, to, n));
                let what = if hold { "HOLD" } else { "PLANT" };
                self.log(|| format!("r{r} {what} {d} for {targets:?}"));
            }
            for t in targets {
                let bytes = seal(&keys, &msg, Some(Principal::Replica(t)), n);
                if hold {
                    let h = Held {
                        from: r,
                        to: t,
                        bytes,
                        sealed_at: self.now,
                    };
                    self.stats.planted_held += 1;
                    if self.planting.held.len() < HELD_MAX {
                        self.planting.held.push(h);
                    } else {
                        let i = self.rng.random_range(0..HELD_MAX);
                        self.planting.held[i] = h;
                    }
                } else {
                    self.stats.planted_sent += 1;
                    self.transmit(Principal::Replica(r), Principal::Replica(t), bytes, 0);
                }
            }
        }
        let at = self.now + self.rng.random_range(100..400);
        self.schedule(at, Ev::Plant(r));
    }

    /// The watchdog took `r` back: what was kept of its frames goes out later, as forgeries
    /// (receivers that re-keyed since must reject them).
    pub(super) fn plant_on_watchdog(&mut self, r: ReplicaId) {
        if self.sc.plant.is_none() || !self.planting.held.iter().any(|h| h.from == r) {
            return;
        }
        let at = self.now + self.rng.random_range(1_000..8_000);
        self.schedule(at, Ev::ReleaseHeld(r));
    }

    pub(super) fn release_held(&mut self, r: ReplicaId) {
        let (mine, rest): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.planting.held)
            .into_iter()
            .partition(|h| h.from == r);
        self.planting.held = rest;
        for h in mine {
            self.stats.planted_released += 1;
            let at = self.now + self.rng.random_range(1..200);
            self.schedule(
                at,
                Ev::DeliverForged {
                    to: h.to,
                    bytes: h.bytes,
                    stolen_at: h.sealed_at,
                },
            );
        }
    }

    /// The attacker's part: once every other replica is in one view, normally, cut the
    /// victims off (step 0; retried every 50 ms until then).
    /// Then (step 1, polled every 10 ms) as soon as a replica that is not cut off executed a
    /// batch the victims never saw, while its stable checkpoint is still the victims' (or
    /// when the cut's time is up), end the cut and send its VIEW-CHANGE for the target view:
    /// to the planters last, so that they (correct again) do not enter the view, and vouch
    /// for other view changes, before the primary of the view decided.
    pub(super) fn join_attack(&mut self, step: u8) {
        let Some(j) = self.planting.join.as_ref() else {
            return;
        };
        let (view, attacker, victims, planters) =
            (j.view, j.attacker, j.victims.clone(), j.planters.clone());
        if j.done || self.compromised != Some(attacker) {
            return;
        }
        if self.max_view(Some(attacker)) >= view {
            self.log(|| format!("PLANT target view {view} passed before the attack"));
            self.planting.cut.clear();
            if let Some(j) = self.planting.join.as_mut() {
                j.done = true;
            }
            return;
        }
        let n = self.sc.core.n();
        let p = victims[0];
        if step == 0 {
            let others: Vec<ReplicaId> = (0..n).filter(|r| *r != attacker).collect();
            let w = self.replicas[others[0] as usize].view();
            let calm = others.iter().all(|r| {
                let rep = &self.replicas[*r as usize];
                rep.view() == w && rep.is_normal() && self.up[*r as usize] == Up::Running
            });
            if !calm {
                self.schedule(self.now + 50, Ev::JoinAttack { step: 0 });
                return;
            }
            // With a victim as primary the others change view before they commit anything.
            let ms = if victims.contains(&self.sc.core.primary(w)) {
                self.rng.random_range(1200..1600)
            } else {
                self.rng.random_range(400..900)
            };
            let exec = (0..n)
                .map(|r| self.replicas[r as usize].last_executed())
                .max()
                .unwrap_or(0);
            if let Some(j) = self.planting.join.as_mut() {
                j.cut_exec = exec;
            }
            self.planting.cut = victims.clone();
            self.planting.cut_until = self.now + ms;
            self.log(|| format!("PLANT r{attacker} cuts {victims:?} off for up to {ms}ms"));
            self.schedule(self.now + 10, Ev::JoinAttack { step: 1 });
            return;
        }
        let cut_exec = self.planting.join.as_ref().map_or(0, |j| j.cut_exec);
        let stable = self.replicas[p as usize].stable_checkpoint();
        let bystanders: Vec<ReplicaId> = (0..n)
            .filter(|r| *r != attacker && !victims.contains(r))
            .collect();
        let ripe = bystanders
            .iter()
            .any(|r| self.replicas[*r as usize].last_executed() > cut_exec)
            || bystanders
                .iter()
                .any(|r| self.replicas[*r as usize].stable_checkpoint() > stable);
        if !ripe && self.now + 10 < self.planting.cut_until {
            self.schedule(self.now + 10, Ev::JoinAttack { step: 1 });
            return;
        }
        self.planting.cut.clear();
        let ls = stable;
        let mut checkpoints = match self.checker.checkpoint_digest(ls) {
            Some(d) => vec![(ls, d)],
            None => vec![],
        };
        let fake = self.rng.random_bool(0.5);
        if fake {
            let seq = self.planting.join.as_ref().map_or(0, |j| j.fake_seq);
            checkpoints.push((seq, self.fake_checkpoint(seq)));
        }
        let vc = ViewChange {
            view,
            replica: attacker,
            ls,
            checkpoints,
            p: vec![],
            q: vec![],
        };
        self.planting.vcs.insert((attacker, view), vc);
        if let Some(j) = self.planting.join.as_mut() {
            j.done = true;
            j.fake_checkpoint = fake;
            j.sent_at = self.now;
        }
        self.stats.join_attacks += 1;
        self.log(|| {
            format!(
                "PLANT r{attacker} joins view {view} (fabricated checkpoint: {fake}; planters \
                 {planters:?} hear of it last)"
            )
        });
        self.join_acks(0);
    }

    /// Whether the attacker's own core is about to send a VIEW-CHANGE or a VIEW-CHANGE-ACK for
    /// the target view: the adversary drops them (receivers are to keep its forged view
    /// change, and the primary is to hear its acks only).
    pub(super) fn join_drops(&self, from: ReplicaId, bytes: &[u8]) -> bool {
        let Some(j) = self.planting.join.as_ref() else {
            return false;
        };
        if j.attacker != from || self.compromised != Some(from) {
            return false;
        }
        let Ok(frame) = decode_frame(bytes, usize::MAX) else {
            return false;
        };
        match decode_body(&frame.body) {
            Ok(Message::Pbft(PbftMessage::ViewChange(vc))) => vc.view == j.view,
            Ok(Message::Pbft(PbftMessage::ViewChangeAck(a))) => a.view == j.view,
            _ => false,
        }
    }

    /// After the attack, the attacker votes (PREPARE and COMMIT, to every replica) for what
    /// the primary of the target view proposes there, whatever its own core thinks (it
    /// rejects that NEW-VIEW, which names a VIEW-CHANGE it did not send itself).
    pub(super) fn join_on_delivery(&mut self, at: ReplicaId, bytes: &[u8]) {
        let Some(j) = self.planting.join.as_ref() else {
            return;
        };
        if !j.done || j.attacker != at || self.compromised != Some(at) {
            return;
        }
        let view = j.view;
        let Ok(frame) = decode_frame(bytes, usize::MAX) else {
            return;
        };
        let victims = j.victims.clone();
        let slots: Vec<(u64, redoubt_crypto::Digest)> = match decode_body(&frame.body) {
            Ok(Message::Pbft(PbftMessage::ViewChange(vc)))
                if vc.view == view && victims[1..].contains(&vc.replica) =>
            {
                // A cut-off replica's view change: the attacker vouches for it to the
                // primary of the view, so that it enters S with the lies.
                if let Some(keys) = self.keys_of(at) {
                    let ack = Message::from(ViewChangeAck {
                        view,
                        acker: at,
                        sender: vc.replica,
                        digest: vc.digest(),
                    });
                    let n = self.sc.core.n();
                    let to = Principal::Replica(victims[0]);
                    let b = seal(&keys, &ack, Some(to), n);
                    self.transmit(Principal::Replica(at), to, b, 0);
                }
                return;
            }
            Ok(Message::Pbft(PbftMessage::PrePrepare(pp))) if pp.view == view => {
                vec![(pp.seq, pp.digest)]
            }
            Ok(Message::Pbft(PbftMessage::NewView(nv))) if nv.view == view => nv
                .chosen
                .iter()
                .enumerate()
                .map(|(i, d)| (nv.checkpoint.0 + 1 + i as u64, *d))
                .collect(),
            _ => return,
        };
        let Some(keys) = self.keys_of(at) else {
            return;
        };
        let n = self.sc.core.n();
        for (seq, digest) in slots {
            let prepare = Message::from(redoubt_core::message::Prepare {
                view,
                seq,
                digest,
                replica: at,
                doubts: vec![],
            });
            let commit = Message::from(redoubt_core::message::Commit {
                view,
                seq,
                digest,
                replica: at,
            });
            for t in (0..n).filter(|t| *t != at) {
                for m in [&prepare, &commit] {
                    let b = seal(&keys, m, Some(Principal::Replica(t)), n);
                    self.transmit(Principal::Replica(at), Principal::Replica(t), b, 0);
                }
            }
        }
    }

    /// Until the primary of the target view has installed it (polled every 5 ms, for 3 s at
    /// most): the attacker's VIEW-CHANGE again to the replicas not in the view yet (every
    /// 100 ms), and, once the primary is in the view, acks for the planted VIEW-CHANGEs to it
    /// (twice).
    pub(super) fn join_acks(&mut self, tries: u32) {
        let Some(j) = self.planting.join.as_ref() else {
            return;
        };
        let (view, attacker, planters, p) = (j.view, j.attacker, j.planters.clone(), j.victims[0]);
        let acked = j.acked;
        let n = self.sc.core.n();
        let Some(keys) = self.keys_of(attacker) else {
            return;
        };
        let Some(vc) = self.planting.vcs.get(&(attacker, view)).cloned() else {
            return;
        };
        let (pview, pnormal) = (
            self.replicas[p as usize].view(),
            self.replicas[p as usize].is_normal(),
        );
        if pview > view || (pview == view && pnormal) {
            return;
        }
        let early = self.now < self.planting.join.as_ref().map_or(0, |j| j.sent_at) + 300;
        if tries.is_multiple_of(20) {
            let msg = Message::from(vc);
            for t in (0..n).filter(|t| *t != attacker && !(early && planters.contains(t))) {
                if self.replicas[t as usize].view() < view {
                    let bytes = seal(&keys, &msg, Some(Principal::Replica(t)), n);
                    self.transmit(
                        Principal::Replica(attacker),
                        Principal::Replica(t),
                        bytes,
                        0,
                    );
                }
            }
        }
        if pview == view && acked < 2 {
            for s in planters {
                let Some(pv) = self.planting.vcs.get(&(s, view)) else {
                    continue;
                };
                let ack = Message::from(ViewChangeAck {
                    view,
                    acker: attacker,
                    sender: s,
                    digest: pv.digest(),
                });
                let bytes = seal(&keys, &ack, Some(Principal::Replica(p)), n);
                self.transmit(
                    Principal::Replica(attacker),
                    Principal::Replica(p),
                    bytes,
                    0,
                );
            }
            if let Some(j) = self.planting.join.as_mut() {
                j.acked += 1;
            }
        }
        if tries < 600 {
            self.schedule(self.now + 5, Ev::JoinAcks { tries: tries + 1 });
        }
    }
}
