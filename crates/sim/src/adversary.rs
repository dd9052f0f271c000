//! The adversary's hands: rewriting what a Byzantine replica sends. The replica runs the
//! unmodified core (so it knows the protocol state); its outgoing frames pass through
//! [`Adversary::outgoing`], which decodes them, lies, and re-authenticates the lies with the
//! replica's own keys, so receivers cannot tell the lies from honest messages by their MACs.

use crate::scenario::Behavior;
use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use redoubt_core::keys::Forger;
use redoubt_core::message::{
    decode_body, decode_frame, Batch, Commit, Message, NewView, PEntry, PrePrepare, Prepare,
    QEntry, Request, SignedRequest, StateItem, ViewChange, NULL_DIGEST,
};
use redoubt_core::message::{
    ClientMessage, FirewallMessage, PbftMessage, RecoveryMessage, SeparatedMessage, TransferMessage,
};
use redoubt_core::seal::seal;
use redoubt_core::viewchange::{self, Broken};
use redoubt_core::{Config, Principal, ReplicaId};
use redoubt_crypto::Digest;
use std::collections::{BTreeMap, BTreeSet};

mod prime;

/// One frame to put on the network: receiver, bytes, extra delay (ms).
pub type Out = (ReplicaOrClient, Vec<u8>, u64);

/// A network destination.
pub type ReplicaOrClient = Principal;

pub struct Adversary {
    cfg: Config,
    /// Keys of every replica the adversary controls (kept current by the world).
    keys: BTreeMap<ReplicaId, Forger>,
    behaviors: BTreeMap<ReplicaId, Behavior>,
    /// Alternative batches already invented per (replica, seq), so equivocation is consistent
    /// per receiver group.
    alternates: BTreeMap<(ReplicaId, u64), Batch>,
    /// A lie told consistently to every receiver, per (replica, view), so that the receivers'
    /// acks agree and the lie can enter the new primary's set S.
    vc_lies: BTreeMap<(ReplicaId, u64), Message>,
    /// The forged pre-prepare sent in place of each honest one, per (replica, seq, honest
    /// digest), so that every receiver gets the same forgery.
    forged: BTreeMap<(ReplicaId, u64, Digest), PrePrepare>,
    /// Read-only requests seen by a stale-reads replica: (client, timestamp) -> operation.
    read_ops: BTreeMap<(u64, u64), Vec<u8>>,
    /// The last view a `HintLiar` replica told each client.
    hints: BTreeMap<u64, u64>,
    /// The first proposal a `RowForger` leader forged in each view it led: (replica, view)
    /// to sequence number.
    first_forged: BTreeMap<(ReplicaId, u64), u64>,
    /// Reads a stale-reads replica already answered with a lagging replica's result:
    /// (replica, client, timestamp).
    stale_copied: BTreeSet<(ReplicaId, u64, u64)>,
    /// Faulty clients the faulty replicas collude with.
    colluders: BTreeSet<u64>,
    /// Firewall deployment: the replicas' order keys (it signs lying pieces with them).
    order_keys: Vec<redoubt_crypto::pk::HolderSecrets>,
    /// Pre-prepares holding a colluding client's request that a `PrepareToPrimary` replica
    /// received: (replica, view, seq, digest).
    colluded: BTreeSet<(ReplicaId, u64, u64, Digest)>,
    /// `CutBroadcast` replicas that cut a pre-prepare's broadcast (its seq and digest) and
    /// stopped sending.
    cut: BTreeMap<ReplicaId, (u64, Digest)>,
    /// The VIEW-CHANGE each `ForgeNewView` replica sent per view, the model of its forgeries.
    own_vcs: BTreeMap<(ReplicaId, u64), ViewChange>,
}

impl Adversary {
    pub fn new(cfg: Config, behaviors: BTreeMap<ReplicaId, Behavior>) -> Self {
        Adversary {
            cfg,
            keys: BTreeMap::new(),
            behaviors,
            alternates: BTreeMap::new(),
            forged: BTreeMap::new(),
            vc_lies: BTreeMap::new(),
            read_ops: BTreeMap::new(),
            stale_copied: BTreeSet::new(),
            hints: BTreeMap::new(),
            first_forged: BTreeMap::new(),
            colluders: BTreeSet::new(),
            order_keys: Vec::new(),
            colluded: BTreeSet::new(),
            cut: BTreeMap::new(),
            own_vcs: BTreeMap::new(),
        }
    }

    /// Replica `r`'s order key, if the adversary holds the replicas' order keys.
    pub fn order_key(&self, r: ReplicaId) -> Option<&redoubt_crypto::pk::HolderSecrets> {
        self.order_keys.get(r as usize)
    }

    /// The replicas' order keys (firewall deployment).
    pub fn set_order_keys(&mut self, keys: Vec<redoubt_crypto::pk::HolderSecrets>) {
        self.order_keys = keys;
    }

    /// The faulty clients the faulty replicas collude with.
    pub fn set_colluders(&mut self, clients: BTreeSet<u64>) {
        self.colluders = clients;
    }

    /// Whether a pre-prepare holds a request (inline or named beside it) of a colluder.
    fn holds_colluder(&self, pp: &PrePrepare) -> bool {
        pp.batch
            .requests
            .iter()
            .any(|r| self.colluders.contains(&r.request.client))
            || pp.beside.iter().any(|b| self.colluders.contains(&b.client))
    }

    /// The current keys of controlled replica `r` (the adversary reads them from its memory).
    pub fn set_keys(&mut self, r: ReplicaId, keys: Forger) {
        self.keys.insert(r, keys);
    }

    /// Takes control of replica `r` (a compromise), with `behavior` from now on.
    pub fn take(&mut self, r: ReplicaId, behavior: Behavior) {
        self.behaviors.insert(r, behavior);
    }

    /// Loses control of replica `r` (it recovered); its keys stay known to the adversary.
    pub fn release(&mut self, r: ReplicaId) {
        self.behaviors.remove(&r);
    }

    pub fn controls(&self, r: ReplicaId) -> bool {
        self.behaviors.contains_key(&r)
    }

    /// Whether some controlled replica answers reads with lagging replicas' results.
    pub fn copies_stale_reads(&self) -> bool {
        self.behaviors.values().any(|b| *b == Behavior::StaleReads)
    }

    /// A correct replica that lags behind the most advanced correct one sent `bytes` to a
    /// client: if it answers a read that a stale-reads replica saw, each such replica sends
    /// the client the same result under its own name (once per read). What an adversary
    /// that keeps its replicas' old states can compute; with the lagging replica's answer,
    /// f+1 matching stale answers.
    pub fn copy_stale_read(&mut self, to: Principal, bytes: &[u8]) -> Vec<(ReplicaId, Out)> {
        let Ok(frame) = decode_frame(bytes, usize::MAX) else {
            return vec![];
        };
        let Ok(Message::Client(ClientMessage::Reply(reply))) = decode_body(&frame.body) else {
            return vec![];
        };
        let read = (reply.client, reply.timestamp);
        if !self.read_ops.contains_key(&read) {
            return vec![];
        }
        let copiers: Vec<ReplicaId> = self
            .behaviors
            .iter()
            .filter(|(r, b)| **b == Behavior::StaleReads && self.keys.contains_key(r))
            .map(|(r, _)| *r)
            .collect();
        let mut out = Vec::new();
        for x in copiers {
            if !self.stale_copied.insert((x, read.0, read.1)) {
                continue;
            }
            let mut copy = reply.clone();
            copy.replica = x;
            out.push((x, (to, self.seal(x, &Message::from(copy), to), 0)));
        }
        while self.stale_copied.len() > 4096 {
            self.stale_copied.pop_first();
        }
        out
    }

    fn seal(&self, from: ReplicaId, msg: &Message, to: Principal) -> Vec<u8> {
        seal(&self.keys[&from], msg, Some(to), self.cfg.n())
    }

    /// Rewrites one outgoing frame of Byzantine replica `from` addressed to `to` (one frame per
    /// receiver; broadcasts are expanded by the caller).
    pub fn outgoing(
        &mut self,
        rng: &mut ChaCha8Rng,
        from: ReplicaId,
        to: Principal,
        bytes: &[u8],
    ) -> Vec<Out> {
        let Some(mut behavior) = self.behaviors.get(&from).copied() else {
            return vec![(to, bytes.to_vec(), 0)];
        };
        if behavior == Behavior::Mixed {
            behavior = Behavior::ALL[rng.random_range(0..Behavior::ALL.len() - 1)];
            if behavior == Behavior::Silent {
                behavior = Behavior::Withhold;
            }
        }
        let Ok(frame) = decode_frame(bytes, usize::MAX) else {
            return vec![];
        };
        let Ok(msg) = decode_body(&frame.body) else {
            return vec![];
        };
        let honest = vec![(to, bytes.to_vec(), 0)];
        if let Message::Firewall(FirewallMessage::SignedOrder(so)) = &msg {
            // Firewall deployment: the same lie, signed with the replica's order key.
            if behavior == Behavior::Silent {
                return vec![];
            }
            let Some(key) = self.order_keys.get(from as usize) else {
                return honest;
            };
            if rng.random_bool(0.5) {
                let lie = order_lie(&so.order);
                let signature = key.sign(&redoubt_core::message::SignedOrder::statement(&lie).0);
                let m = Message::from(redoubt_core::message::SignedOrder {
                    order: lie,
                    signature,
                });
                return vec![(to, seal(&self.keys[&from], &m, None, self.cfg.n()), 0)];
            }
            return honest;
        }
        if let Message::Separated(SeparatedMessage::Order(o)) = &msg {
            // Separated deployment: its piece of the agreement certificate names another
            // batch (well formed, its digest right) for half the execution nodes.
            if behavior == Behavior::Silent {
                return vec![];
            }
            if rng.random_bool(0.5) {
                let bytes = redoubt_core::seal::seal_to_executors(
                    &self.keys[&from],
                    &Message::from(order_lie(o)),
                    self.cfg.executors,
                );
                return vec![(to, bytes, 0)];
            }
            return honest;
        }
        if behavior == Behavior::PrimeLiar {
            return self.prime_lie(rng, from, to, msg).unwrap_or(honest);
        }
        match behavior {
            Behavior::Silent => vec![],
            Behavior::Withhold => {
                if rng.random_bool(0.5) {
                    vec![]
                } else {
                    honest
                }
            }
            Behavior::Equivocate | Behavior::SameDigestEquivocate => match msg {
                Message::Pbft(PbftMessage::PrePrepare(mut pp)) => {
                    // Receivers with odd id (relative to a per-seq coin) get the alternative.
                    let Principal::Replica(r) = to else {
                        return honest;
                    };
                    let coin = (pp.seq % 2) as u32;
                    if (r + coin).is_multiple_of(2) {
                        return honest;
                    }
                    let alt = self
                        .alternates
                        .entry((from, pp.seq))
                        .or_insert_with(|| {
                            let mut b = pp.batch.clone();
                            b.nondet.seed = b.nondet.seed.wrapping_add(0x9e37_79b9);
                            if b.requests.len() > 1 {
                                b.requests.reverse();
                            }
                            b
                        })
                        .clone();
                    if behavior == Behavior::Equivocate {
                        pp.digest = alt.digest();
                    }
                    pp.batch = alt;
                    vec![(to, self.seal(from, &Message::from(pp), to), 0)]
                }
                // Behind a firewall: a result of its own making in the client's entry (the
                // execution cluster's signature no longer covers it).
                Message::Client(ClientMessage::CertifiedReply(mut cert))
                    if !cert.entry.result.is_empty() =>
                {
                    for b in cert.entry.result.iter_mut() {
                        *b ^= 0x5a;
                    }
                    if let Some(leaf) = cert.leaves.get_mut(cert.index as usize) {
                        *leaf = cert.entry.leaf();
                    }
                    vec![(to, self.seal(from, &Message::from(cert), to), 0)]
                }
                _ => honest,
            },
            Behavior::LieVotes => {
                if !rng.random_bool(0.5) {
                    return honest;
                }
                let lie = match msg {
                    Message::Pbft(PbftMessage::Prepare(mut p)) => {
                        p.digest = random_digest(rng);
                        Message::Pbft(PbftMessage::Prepare(p))
                    }
                    Message::Pbft(PbftMessage::Commit(mut c)) => {
                        c.digest = random_digest(rng);
                        Message::Pbft(PbftMessage::Commit(c))
                    }
                    Message::Pbft(PbftMessage::Checkpoint(mut c)) => {
                        c.digest = random_digest(rng);
                        Message::Pbft(PbftMessage::Checkpoint(c))
                    }
                    _ => return honest,
                };
                vec![(to, self.seal(from, &lie, to), 0)]
            }
            Behavior::VoteEverything
                if matches!(
                    msg,
                    Message::Pbft(PbftMessage::Prepare(_)) | Message::Pbft(PbftMessage::Commit(_))
                ) =>
            {
                // Its honest votes are replaced by the selective ones of `on_delivery`.
                vec![]
            }
            Behavior::BogusViewChange | Behavior::VoteEverything => match msg {
                Message::Pbft(PbftMessage::ViewChange(mut vc)) => {
                    let key = (from, vc.view);
                    if let Some(lie) = self.vc_lies.get(&key) {
                        return vec![(to, self.seal(from, lie, to), 0)];
                    }
                    // A vote-stuffer denies everything it voted for; other liars vary. Stale
                    // claims and denials are told consistently, so they can enter S.
                    let branch = if behavior == Behavior::VoteEverything {
                        2
                    } else {
                        rng.random_range(0..6)
                    };
                    let consistent = branch == 5 || branch == 2 || rng.random_bool(0.5);
                    let k = self.cfg.checkpoint_interval;
                    let l = self.cfg.log_size;
                    match branch {
                        5 => {
                            // Claim that the null request was prepared at a sequence number
                            // long ago (view 0), where a real request was prepared recently:
                            // a stale, lower-view claim that only a decision procedure
                            // ignoring views would pick.
                            if !vc.p.is_empty() {
                                let a = rng.random_range(0..vc.p.len());
                                let seq = vc.p[a].seq;
                                vc.p[a] = PEntry {
                                    seq,
                                    digest: Digest::ZERO,
                                    view: 0,
                                };
                                if let Some(q) = vc.q.iter_mut().find(|q| q.seq == seq) {
                                    if q.pairs.len() > self.cfg.f as usize + 1 {
                                        q.pairs.remove(0);
                                    }
                                    q.pairs.push((Digest::ZERO, 0));
                                    q.pairs.sort();
                                }
                            }
                        }
                        0 => {
                            // Claim a request prepared in the latest possible view.
                            let seq = vc.ls + rng.random_range(1..=l);
                            let d = random_digest(rng);
                            vc.p.retain(|e| e.seq != seq);
                            vc.p.push(PEntry {
                                seq,
                                digest: d,
                                view: vc.view - 1,
                            });
                            vc.p.sort();
                            vc.q.retain(|e| e.seq != seq);
                            vc.q.push(QEntry {
                                seq,
                                pairs: vec![(d, vc.view - 1)],
                            });
                            vc.q.sort();
                        }
                        1 => {
                            // Claim a checkpoint nobody has.
                            let seq = vc.ls + k;
                            vc.checkpoints.retain(|(n, _)| *n != seq);
                            vc.checkpoints.push((seq, random_digest(rng)));
                            vc.checkpoints.sort();
                        }
                        2 => {
                            // Hide everything.
                            vc.p.clear();
                            vc.q.clear();
                        }
                        3 => {
                            // Claim a higher stable checkpoint.
                            vc.ls += k;
                            vc.p.retain(|e| e.seq > vc.ls && e.seq <= vc.ls + l);
                            vc.q.retain(|e| e.seq > vc.ls && e.seq <= vc.ls + l);
                            vc.checkpoints.retain(|(n, _)| *n >= vc.ls);
                            if !vc.checkpoints.iter().any(|(n, _)| *n == vc.ls) {
                                vc.checkpoints.insert(0, (vc.ls, random_digest(rng)));
                            }
                        }
                        _ => {
                            // Downgrade the views of prepared claims.
                            for e in vc.p.iter_mut() {
                                e.view = e.view.saturating_sub(1);
                            }
                        }
                    }
                    let lie = Message::from(vc);
                    if consistent {
                        self.vc_lies.insert(key, lie.clone());
                        while self.vc_lies.len() > 64 {
                            self.vc_lies.pop_first();
                        }
                    }
                    vec![(to, self.seal(from, &lie, to), 0)]
                }
                _ => honest,
            },
            Behavior::BogusNewView => match msg {
                Message::Pbft(PbftMessage::NewView(mut nv)) => {
                    match rng.random_range(0..4) {
                        0 if !nv.chosen.is_empty() => {
                            let i = rng.random_range(0..nv.chosen.len());
                            nv.chosen[i] = random_digest(rng);
                        }
                        1 => nv.chosen.push(Digest::ZERO),
                        2 => {
                            nv.checkpoint.0 += self.cfg.checkpoint_interval;
                        }
                        _ => {
                            if let Some(e) = nv.vcs.last_mut() {
                                e.1 = random_digest(rng);
                            }
                        }
                    }
                    vec![(to, self.seal(from, &Message::from(nv), to), 0)]
                }
                _ => honest,
            },
            Behavior::Slow => match msg {
                Message::Pbft(PbftMessage::PrePrepare(_)) => {
                    let hold = self.cfg.view_change_timeout_ms * 8 / 10;
                    vec![(to, bytes.to_vec(), hold)]
                }
                _ => honest,
            },
            Behavior::RowForger => match msg {
                // The first forged proposal of a view at once, the later ones held back as a
                // slow leader's: once a backup stopped summarizing, Suspect-Leader no longer
                // measures the leader.
                Message::Pbft(PbftMessage::PrePrepare(pp)) => {
                    let (view, seq) = (pp.view, pp.seq);
                    match self.forge_retired_rows(from, pp) {
                        Some(lie) => {
                            let first = *self.first_forged.entry((from, view)).or_insert(seq);
                            while self.first_forged.len() > 64 {
                                self.first_forged.pop_first();
                            }
                            let hold = if seq == first {
                                0
                            } else {
                                self.cfg.view_change_timeout_ms * 4 / 10
                            };
                            vec![(to, self.seal(from, &lie, to), hold)]
                        }
                        None => honest,
                    }
                }
                _ => honest,
            },
            Behavior::HintLiar => match msg {
                // A view whose primary is this replica, above every lie told this client
                // before: a client that trusted it would send its requests here.
                Message::Client(ClientMessage::CertifiedReply(mut cert)) => {
                    let n = u64::from(self.cfg.n());
                    let last = self.hints.get(&cert.entry.client).copied().unwrap_or(0);
                    let base = last.max(cert.view) + 1;
                    let lie = base + (u64::from(from) + n - base % n) % n;
                    self.hints.insert(cert.entry.client, lie);
                    while self.hints.len() > 1024 {
                        self.hints.pop_first();
                    }
                    cert.view = lie;
                    vec![(to, self.seal(from, &Message::from(cert), to), 0)]
                }
                // What clients send it stays here.
                Message::Client(ClientMessage::Request(_)) => vec![],
                _ => honest,
            },
            Behavior::Sluggish => match msg {
                Message::Pbft(PbftMessage::PrePrepare(pp))
                    if pp.seq >= crate::scenario::SLUGGISH_FROM =>
                {
                    let hold = self.cfg.view_change_timeout_ms * 4 / 10;
                    vec![(to, bytes.to_vec(), hold)]
                }
                _ => honest,
            },
            Behavior::LieState => match msg {
                Message::Transfer(TransferMessage::StateData(mut d)) => {
                    // Honest often enough to stay the designated replier until it lies
                    // about pages, where a fetcher that skipped its checks would be fooled.
                    let has_pages = d.items.iter().any(|i| matches!(i, StateItem::Page { .. }));
                    let kind = if has_pages && rng.random_bool(0.7) {
                        0
                    } else if rng.random_bool(0.1) {
                        rng.random_range(1..5)
                    } else {
                        return honest;
                    };
                    match kind {
                        0 => {
                            // A wrong page.
                            for it in d.items.iter_mut() {
                                if let StateItem::Page { bytes, .. } = it {
                                    if let Some(b) = bytes.first_mut() {
                                        *b ^= 0x5a;
                                    }
                                }
                            }
                        }
                        1 => {
                            // Wrong meta-data: a child's digest or lm.
                            for it in d.items.iter_mut() {
                                if let StateItem::Meta { children, .. } = it {
                                    if let Some(c) = children.last_mut() {
                                        if rng.random_bool(0.5) {
                                            c.digest = random_digest(rng);
                                        } else {
                                            c.lm += 1;
                                        }
                                    }
                                }
                            }
                        }
                        2 => {
                            // A stale checkpoint: an older seq's claim.
                            d.seq = d.seq.saturating_sub(self.cfg.checkpoint_interval);
                        }
                        3 => {
                            // Claims not to hold the checkpoint.
                            d.items.clear();
                            d.aux = None;
                        }
                        _ => {
                            // Wrong auxiliary bytes (the reply table).
                            if let Some(a) = d.aux.as_mut() {
                                a.push(0);
                            }
                        }
                    }
                    vec![(to, self.seal(from, &Message::from(d), to), 0)]
                }
                _ => honest,
            },
            Behavior::ForgeRequest => match msg {
                Message::Pbft(PbftMessage::PrePrepare(mut pp)) => {
                    let n = self.cfg.n() as usize;
                    let forged = self
                        .forged
                        .entry((from, pp.seq, pp.digest))
                        .or_insert_with(|| forge_into(rng, &mut pp, n))
                        .clone();
                    vec![(to, self.seal(from, &Message::from(forged), to), 0)]
                }
                _ => honest,
            },
            Behavior::StaleReads => match msg {
                // Its own answers to reads are withheld: it answers a read only with what a
                // lagging correct replica answered (`copy_stale_read`).
                Message::Client(ClientMessage::Reply(r))
                    if self.read_ops.contains_key(&(r.client, r.timestamp)) =>
                {
                    vec![]
                }
                _ => honest,
            },
            Behavior::Mixed | Behavior::Honest | Behavior::PrimeLiar => honest,
            Behavior::ExtremeNumbers => {
                if !rng.random_bool(1.0 / 3.0) {
                    return honest;
                }
                let mut big = || u64::MAX - rng.random_range(0..3u64);
                let lie = match msg {
                    Message::Pbft(PbftMessage::PrePrepare(mut m)) => {
                        m.seq = big();
                        Message::Pbft(PbftMessage::PrePrepare(m))
                    }
                    Message::Pbft(PbftMessage::Prepare(mut m)) => {
                        m.view = big();
                        m.seq = big();
                        Message::Pbft(PbftMessage::Prepare(m))
                    }
                    Message::Pbft(PbftMessage::Commit(mut m)) => {
                        m.seq = big();
                        Message::Pbft(PbftMessage::Commit(m))
                    }
                    Message::Pbft(PbftMessage::Checkpoint(mut m)) => {
                        m.seq = (u64::MAX / self.cfg.checkpoint_interval)
                            * self.cfg.checkpoint_interval;
                        Message::Pbft(PbftMessage::Checkpoint(m))
                    }
                    Message::Pbft(PbftMessage::ViewChange(mut m)) => {
                        m.view = big();
                        Message::Pbft(PbftMessage::ViewChange(m))
                    }
                    Message::Pbft(PbftMessage::ViewChangeAck(mut m)) => {
                        m.view = big();
                        Message::Pbft(PbftMessage::ViewChangeAck(m))
                    }
                    Message::Pbft(PbftMessage::NewView(mut m)) => {
                        m.view = big();
                        m.checkpoint.0 = (u64::MAX / self.cfg.checkpoint_interval)
                            * self.cfg.checkpoint_interval;
                        Message::Pbft(PbftMessage::NewView(m))
                    }
                    Message::Pbft(PbftMessage::Status(mut m)) => {
                        m.view = big();
                        m.last_executed = big();
                        m.stable = big();
                        m.prepared = vec![big()];
                        m.committed = vec![big()];
                        Message::Pbft(PbftMessage::Status(m))
                    }
                    Message::Transfer(TransferMessage::Fetch(mut m)) => {
                        m.seq = big();
                        Message::Transfer(TransferMessage::Fetch(m))
                    }
                    Message::Transfer(TransferMessage::StateData(mut m)) => {
                        m.seq = big();
                        m.stable = big();
                        Message::Transfer(TransferMessage::StateData(m))
                    }
                    Message::Client(ClientMessage::Reply(mut m)) => {
                        m.view = big();
                        m.timestamp = big();
                        Message::Client(ClientMessage::Reply(m))
                    }
                    Message::Recovery(RecoveryMessage::ReplyStable(mut m)) => {
                        m.c = big();
                        m.p = big();
                        Message::Recovery(RecoveryMessage::ReplyStable(m))
                    }
                    Message::Pbft(PbftMessage::RelayViewChange(mut m)) => {
                        m.view = big();
                        m.ls = 0;
                        Message::Pbft(PbftMessage::RelayViewChange(m))
                    }
                    _ => return honest,
                };
                vec![(to, self.seal(from, &lie, to), 0)]
            }
            Behavior::LieStatus => {
                let k = self.cfg.checkpoint_interval;
                let lie = match msg {
                    Message::Pbft(PbftMessage::Status(mut m)) => {
                        match rng.random_range(0..4) {
                            0 => {
                                m.view = m.view.saturating_add(1);
                                m.normal = true;
                            }
                            1 => {
                                m.last_executed = m.last_executed.saturating_add(1000);
                                m.stable = m.stable.saturating_add(10 * k);
                            }
                            2 => {
                                m.prepared = (1..=self.cfg.log_size.min(8))
                                    .map(|i| m.last_executed.saturating_add(i))
                                    .collect();
                                m.committed = m.prepared.clone();
                            }
                            _ => {
                                m.missing_batches = vec![random_digest(rng)];
                                m.missing_vcs =
                                    vec![(rng.random_range(0..self.cfg.n()), random_digest(rng))];
                            }
                        }
                        Message::Pbft(PbftMessage::Status(m))
                    }
                    Message::Recovery(RecoveryMessage::ReplyStable(mut m)) => {
                        match rng.random_range(0..3) {
                            0 => {
                                m.c = m.c.saturating_add(1000 * k);
                                m.p = m.p.saturating_add(1000 * k);
                            }
                            1 => {
                                m.c = 0;
                                m.p = 0;
                            }
                            _ => m.p = m.p.saturating_add(10 * k),
                        }
                        Message::Recovery(RecoveryMessage::ReplyStable(m))
                    }
                    _ => return honest,
                };
                vec![(to, self.seal(from, &lie, to), 0)]
            }
            Behavior::PushView => match msg {
                Message::Pbft(PbftMessage::Status(st)) => {
                    let vc =
                        Message::Pbft(PbftMessage::ViewChange(redoubt_core::message::ViewChange {
                            view: st.view.saturating_add(1),
                            replica: from,
                            ls: st.stable,
                            checkpoints: Vec::new(),
                            p: Vec::new(),
                            q: Vec::new(),
                        }));
                    vec![(to, bytes.to_vec(), 0), (to, self.seal(from, &vc, to), 0)]
                }
                _ => honest,
            },
            Behavior::EquivocateViewChange => {
                let Principal::Replica(r) = to else {
                    return honest;
                };
                if r % 2 == 0 {
                    return honest;
                }
                match msg {
                    Message::Pbft(PbftMessage::ViewChange(mut vc)) => {
                        vc.p.clear();
                        vc.q.clear();
                        vec![(to, self.seal(from, &Message::from(vc), to), 0)]
                    }
                    Message::Pbft(PbftMessage::NewView(_)) => vec![],
                    _ => honest,
                }
            }
            Behavior::LaterNull => match msg {
                Message::Pbft(PbftMessage::ViewChange(vc)) => {
                    let lie = Message::from(null_claims(vc, false));
                    vec![(to, self.seal(from, &lie, to), 0)]
                }
                Message::Pbft(PbftMessage::NewView(_)) => vec![],
                _ => honest,
            },
            Behavior::ForgeNewView => match msg {
                Message::Pbft(PbftMessage::ViewChange(vc)) => {
                    self.own_vcs.insert((from, vc.view), vc);
                    while self.own_vcs.len() > 64 {
                        self.own_vcs.pop_first();
                    }
                    honest
                }
                Message::Pbft(PbftMessage::NewView(nv)) => {
                    let Principal::Replica(r) = to else {
                        return honest;
                    };
                    match self.own_vcs.get(&(from, nv.view)) {
                        Some(own) => self.forge_new_view(from, r, own.clone()),
                        None => honest,
                    }
                }
                _ => honest,
            },
            Behavior::PrepareToPrimary => match msg {
                Message::Pbft(PbftMessage::Prepare(mut p))
                    if self.colluded.contains(&(from, p.view, p.seq, p.digest)) =>
                {
                    if to != Principal::Replica(self.cfg.primary(p.view)) {
                        return vec![];
                    }
                    p.doubts.clear();
                    vec![(to, self.seal(from, &Message::from(p), to), 0)]
                }
                Message::Pbft(PbftMessage::ViewChange(_)) => vec![],
                _ => honest,
            },
            Behavior::CutBroadcast => {
                let n = self.cfg.n();
                let receivers: Vec<Principal> = (1..=2 * self.cfg.f)
                    .map(|i| Principal::Replica((from + i) % n))
                    .collect();
                match (self.cut.get(&from).copied(), msg) {
                    (Some((seq, d)), Message::Pbft(PbftMessage::PrePrepare(pp)))
                        if pp.seq == seq && pp.digest == d =>
                    {
                        if receivers.contains(&to) {
                            honest
                        } else {
                            vec![]
                        }
                    }
                    (Some(_), _) => vec![],
                    (None, Message::Pbft(PbftMessage::PrePrepare(pp)))
                        if self.holds_colluder(&pp) =>
                    {
                        self.cut.insert(from, (pp.seq, pp.digest));
                        if receivers.contains(&to) {
                            honest
                        } else {
                            vec![]
                        }
                    }
                    (None, _) => honest,
                }
            }
        }
    }

    /// `ForgeNewView`: a NEW-VIEW for receiver `r` whose set S is made of view changes in the
    /// names of the new primary `from` and the first 2f other replicas but `r` (so `r`'s own,
    /// which it would check, is not among them), each a copy of `own` claiming null where
    /// `own` claims anything, followed by the made-up messages relayed.
    fn forge_new_view(&self, from: ReplicaId, r: ReplicaId, own: ViewChange) -> Vec<Out> {
        let to = Principal::Replica(r);
        let own = null_claims(own, true);
        let names = std::iter::once(from).chain(
            (0..self.cfg.n())
                .filter(|x| *x != from && *x != r)
                .take(2 * self.cfg.f as usize),
        );
        let made_up: Vec<ViewChange> = names
            .map(|x| ViewChange {
                replica: x,
                ..own.clone()
            })
            .collect();
        let refs: Vec<&ViewChange> = made_up.iter().collect();
        let Ok(dec) = viewchange::decide(
            self.cfg.f,
            self.cfg.log_size,
            &refs,
            |_| true,
            Broken::default(),
        ) else {
            return vec![];
        };
        let nv = Message::from(NewView {
            view: own.view,
            vcs: made_up.iter().map(|m| (m.replica, m.digest())).collect(),
            checkpoint: dec.checkpoint,
            chosen: dec.chosen,
            batches: Vec::new(),
        });
        let mut out = vec![(to, self.seal(from, &nv, to), 0)];
        for m in made_up {
            let relay = Message::Pbft(PbftMessage::RelayViewChange(m));
            // Relayed just after the NEW-VIEW (a relayed message is kept only for a NEW-VIEW
            // that names it), and again later in case the first copy was lost.
            out.push((to, self.seal(from, &relay, to), 1));
            out.push((to, self.seal(from, &relay, to), 40));
        }
        out
    }

    /// Called when a frame is delivered to Byzantine replica `at`: vote-stuffing replicas
    /// answer every pre-prepare with PREPARE and COMMIT to everyone, whatever the protocol says.
    pub fn on_delivery(&mut self, rng: &mut ChaCha8Rng, at: ReplicaId, bytes: &[u8]) -> Vec<Out> {
        if self.behaviors.get(&at) == Some(&Behavior::PrepareToPrimary) {
            // Remember the pre-prepares holding a colluder's request.
            if let Ok(frame) = decode_frame(bytes, usize::MAX) {
                if let Ok(Message::Pbft(PbftMessage::PrePrepare(pp))) = decode_body(&frame.body) {
                    if self.holds_colluder(&pp) {
                        self.colluded.insert((at, pp.view, pp.seq, pp.digest));
                        while self.colluded.len() > 1024 {
                            self.colluded.pop_first();
                        }
                    }
                }
            }
            return vec![];
        }
        if self.behaviors.get(&at) == Some(&Behavior::StaleReads) {
            // Remember which operation each read-only request asked for.
            if let Ok(frame) = decode_frame(bytes, usize::MAX) {
                if let Ok(Message::Client(ClientMessage::Request(sr))) = decode_body(&frame.body) {
                    if sr.request.read_only {
                        let r = &sr.request;
                        self.read_ops.insert((r.client, r.timestamp), r.op.to_vec());
                        while self.read_ops.len() > 1024 {
                            self.read_ops.pop_first();
                        }
                    }
                }
            }
            return vec![];
        }
        if self.behaviors.get(&at) != Some(&Behavior::VoteEverything) {
            return vec![];
        }
        let Ok(frame) = decode_frame(bytes, usize::MAX) else {
            return vec![];
        };
        let Ok(Message::Pbft(PbftMessage::PrePrepare(pp))) = decode_body(&frame.body) else {
            return vec![];
        };
        let mut out = Vec::new();
        // Votes go to one random backup only (never the primary), so correct replicas disagree
        // on what they have seen as much as possible.
        let primary = self.cfg.primary(pp.view);
        let target = rng.random_range(0..self.cfg.n());
        for r in 0..self.cfg.n() {
            if r == at || r == primary || r != target {
                continue;
            }
            let to = Principal::Replica(r);
            let p = Message::from(Prepare {
                view: pp.view,
                seq: pp.seq,
                digest: pp.digest,
                replica: at,
                doubts: Vec::new(),
            });
            let c = Message::from(Commit {
                view: pp.view,
                seq: pp.seq,
                digest: pp.digest,
                replica: at,
            });
            out.push((to, self.seal(at, &p, to), 0));
            out.push((to, self.seal(at, &c, to), 0));
        }
        out
    }
}

/// The client a forging primary speaks for (the first correct client of every scenario).
pub const FORGED_CLIENT: u64 = 1;
/// The value a forged write stores: no correct client writes it.
pub const FORGED_VALUE: &[u8] = b"forged";

/// `pp` with a write appended to its batch that client `FORGED_CLIENT` never sent (a put of
/// `FORGED_VALUE` under a timestamp far ahead of the client's, so that executing it would
/// also shut the client out), its authenticator random MACs, and the digest recomputed over
/// the whole batch (requests named beside the pre-prepare included).
fn forge_into(rng: &mut ChaCha8Rng, pp: &mut PrePrepare, n: usize) -> PrePrepare {
    let op = redoubt_services::kv::KvOp::Put {
        key: b"k0".to_vec(),
        value: FORGED_VALUE.to_vec(),
    };
    let request = Request {
        client: FORGED_CLIENT,
        timestamp: u64::MAX / 2 + pp.seq,
        read_only: false,
        op: op.encode().into(),
    };
    let auth: Vec<redoubt_crypto::Mac> = (0..n)
        .map(|_| redoubt_crypto::Mac(std::array::from_fn(|_| rng.random())))
        .collect();
    // Request digests in whole-batch order: inline requests and those named beside.
    let total = pp.batch.requests.len() + pp.beside.len();
    let mut inline = pp.batch.requests.iter();
    let mut beside = pp.beside.iter().peekable();
    let mut digests = Vec::with_capacity(total + 1);
    for i in 0..total {
        match beside.peek() {
            Some(b) if b.index as usize == i => {
                digests.push(b.digest);
                beside.next();
            }
            _ => match inline.next() {
                Some(r) => digests.push(r.request.digest()),
                None => return pp.clone(), // malformed: send it as it was
            },
        }
    }
    digests.push(request.digest());
    pp.batch.requests.push(SignedRequest {
        request,
        auth: auth.into(),
        sig: None,
    });
    pp.digest = Batch::digest_of(&pp.batch.nondet, &digests);
    pp.clone()
}

/// `vc` with every request it claims prepared in a view before the one it leaves (`all`: in
/// any view) claimed instead as the null request prepared in the view it leaves (P and Q
/// alike).
fn null_claims(mut vc: ViewChange, all: bool) -> ViewChange {
    let Some(left) = vc.view.checked_sub(1) else {
        return vc;
    };
    for e in vc.p.iter_mut() {
        if e.view < left || all {
            *e = PEntry {
                seq: e.seq,
                digest: NULL_DIGEST,
                view: left,
            };
            match vc.q.iter_mut().find(|q| q.seq == e.seq) {
                Some(q) => q.pairs = vec![(NULL_DIGEST, left)],
                None => vc.q.push(QEntry {
                    seq: e.seq,
                    pairs: vec![(NULL_DIGEST, left)],
                }),
            }
        }
    }
    vc.q.sort();
    vc
}

pub fn random_digest(rng: &mut ChaCha8Rng) -> Digest {
    let mut d = [0u8; 32];
    for b in d.iter_mut() {
        *b = rng.random();
    }
    Digest(d)
}

/// A faulty replica's piece of an agreement certificate naming another batch than `o`'s (well
/// formed, its digest right).
fn order_lie(o: &redoubt_core::message::Order) -> redoubt_core::message::Order {
    let mut lie = o.clone();
    let mut b = lie.batch.clone().unwrap_or(redoubt_core::message::Batch {
        nondet: redoubt_core::message::NonDet {
            time_ms: 0,
            seed: 0,
        },
        requests: Vec::new(),
        matrix: None,
    });
    b.nondet.seed = b.nondet.seed.wrapping_add(0x9e37_79b9);
    b.requests.reverse();
    lie.digest = b.digest();
    lie.batch = Some(b);
    lie
}
