//! `redoubt-sim --sites`: wide-area sites as logical machines (ADR 0010), one seed at a time.
//!
//! Each seed draws 3F+1 = 4 sites of 3f+1 servers (4, or 7 in a quarter of the seeds), the
//! logical link (erasure-coded, over broadcast hubs (Optimistic or Immediate), naive, BLink,
//! or through dependable forwarders), a wholly faulty site (silent, or noisy: it signs junk
//! global messages and spurious INQUIRYs with its own key) in half of the seeds, up to f faulty
//! servers in every other site (bad shares, bad erasure parts, silence, tick proposals every
//! round, forged events introduced into local ordering, bogus answers to clients), wide-area
//! delays, reordering and loss, and each server's pace of execution. Every server runs the real
//! `SiteServer` with global Prime (the core's replica) as its participant; local ordering is a
//! perfect sequencer per site (local Prime is simulated on its own by the other modes).
//! Closed-loop clients at the correct sites sign their updates and take an answer when f+1
//! servers of their site gave the same one.
//!
//! Checkers: agreement (what every correct server of every correct site executed is a prefix of
//! one order), every update runs at most once and every acknowledged update ran with the
//! answer it got, every client finishes (liveness), no correct server or site is blacklisted
//! by a correct one, and correct servers of a site that executed as far emitted as much.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_core::state::{Geometry, MemStore, StateRead, StateWrite};
use redoubt_core::types::Principal;
use redoubt_core::{open_state, Directory, ExecContext, Service};
use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::threshold::{deal, GroupKey, KeyShare, ThresholdSig};
use redoubt_sites::forwarder::{Forwarder, ForwarderConfig, Header};
use redoubt_sites::global::{reply_of, update_frame, GlobalPrime};
use redoubt_sites::link::erasure::ServerKeys;
use redoubt_sites::link::inquiry::Inquiry;
use redoubt_sites::link::{
    df, BLink, Control, Df, Erasure, HubConfig, LinkEvent, LogicalLink, Naive, Payload, Wan,
    FORWARDER,
};
use redoubt_sites::machine::{Event, LogicalMachine, Submitter};
use redoubt_sites::message::{Bundle, SiteKeys};
use redoubt_sites::server::SiteServer;
use redoubt_sites::sign::{Share, SiteSigner};
use redoubt_sites::{Mutant, Server, Shape, SiteId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod costs;
mod scenario;

pub use costs::{link_costs, LinkCost};
pub use scenario::{LinkKind, ServerFault, SiteFault, SitesScenario};
use scenario::{BLINK_TIMEOUT_MS, HUB_TIMEOUT_MS};

const FRAME_MAX: usize = 1 << 20;
const TICK_MS: u64 = 10;
const ROUNDS_MAX: u64 = 12_000;
const SETTLE_ROUNDS: u64 = 300;
/// Events one server may have waiting in its site's local ordering.
const WINDOW: usize = 256;
/// A server's frames its forwarder told it to hand again later, in order.
type Blocked = std::collections::VecDeque<(Header, Vec<u8>)>;

/// Appends each update to a log and answers with its position.
#[derive(Default)]
struct Ledger {
    ops: Vec<Vec<u8>>,
}

impl Service for Ledger {
    fn execute(&mut self, state: &mut dyn StateWrite, op: &[u8], _ctx: &ExecContext) -> Vec<u8> {
        let mut n = [0u8; 8];
        state.read(0, &mut n);
        let n = u64::from_le_bytes(n) + 1;
        state.write(0, &n.to_le_bytes());
        self.ops.push(op.to_vec());
        n.to_le_bytes().to_vec()
    }
    fn execute_read_only(&self, _state: &dyn StateRead, _op: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn load(&mut self, _state: &dyn StateRead) -> Result<(), String> {
        Ok(())
    }
}

type Server_ = SiteServer<GlobalPrime<Ledger>, Box<dyn LogicalLink>>;

struct Client {
    site: usize,
    id: u64,
    key: HolderSecrets,
    sent: u64,
    /// Acknowledged updates: timestamp -> the answer f+1 servers gave.
    acked: BTreeMap<u64, Vec<u8>>,
}

/// What one seed gave.
#[derive(Debug)]
pub struct SitesOutcome {
    pub seed: u64,
    pub violations: Vec<String>,
    pub rounds: u64,
    pub updates_acked: u64,
    pub events: u64,
    pub wan_frames: u64,
    /// Bytes of every frame between sites, and of one copy of each message the correct sites
    /// signed per destination (a correct server's count, the highest in its site).
    pub wan_bytes: u64,
    pub message_bytes: u64,
    pub blacklisted: u64,
    pub summary: String,
    /// Where each server stood at the end (filled for a failing seed).
    pub state: Vec<String>,
}

impl SitesOutcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

struct Site {
    servers: Vec<Server_>,
    order: Vec<(Vec<u8>, Submitter, u64)>,
    executed: Vec<usize>,
    /// Where each server's events stand in the order, for local ordering's window.
    introduced: BTreeMap<Server, std::collections::VecDeque<usize>>,
    /// Answers each server sent to clients: (client, timestamp, answer).
    answers: Vec<Vec<(u64, u64, Vec<u8>)>>,
}

struct World {
    sc: SitesScenario,
    shape: Shape,
    rng: ChaCha8Rng,
    sites: Vec<Site>,
    /// Shares in flight inside sites: (due, site, from, to, share).
    shares: Vec<(u64, usize, usize, usize, Share)>,
    wan: Vec<(u64, SiteId, Server, Wan)>,
    /// Frames overheard on the sending site's hub: (due, site, from, frame).
    overheard: Vec<(u64, usize, Server, Vec<u8>)>,
    /// Each site's dependable forwarder, and the frames it told each server to hand again
    /// later (that server's session is not read meanwhile).
    forwarders: Vec<Forwarder>,
    blocked: Vec<Vec<Blocked>>,
    groups: Vec<GroupKey>,
    shares_keys: Vec<Vec<KeyShare>>,
    secrets: Vec<Vec<HolderSecrets>>,
    clients: Vec<Client>,
    now: u64,
    wan_frames: u64,
    wan_bytes: u64,
}

fn ledger_core(
    site: SiteId,
    directory: &Directory,
    orders: &Arc<Vec<redoubt_crypto::pk::VerifyKey>>,
    order_key: HolderSecrets,
    mutant: Mutant,
) -> GlobalPrime<Ledger> {
    let store = MemStore::new(Geometry::new(256, 16, 4).expect("geometry"));
    let state = open_state(Box::new(store)).expect("in-memory state");
    let mut cfg = redoubt_sites::global::config(1);
    if mutant == Mutant::LeaveAlone {
        cfg.mutant = redoubt_core::Mutant::LeaveAlone;
    }
    GlobalPrime::new(
        cfg,
        site,
        directory.clone(),
        Ledger::default(),
        state,
        orders.clone(),
        order_key,
    )
    .expect("a valid global configuration")
}

impl World {
    fn new(sc: SitesScenario) -> World {
        let shape = Shape::new(4, sc.servers).expect("4 sites of 3f+1");
        let seed = sc.seed;
        let material = |tag: u8, a: usize, b: usize| -> [u8; 32] {
            let d = redoubt_crypto::DigestBuilder::new("redoubt.sim.sites.v1")
                .u64(seed)
                .u64(tag as u64)
                .u64(a as u64)
                .u64(b as u64)
                .finish();
            d.0
        };
        let (groups, shares_keys): (Vec<GroupKey>, Vec<Vec<KeyShare>>) = (0..4)
            .map(|s| deal(shape.f(), shape.servers(), material(1, s, 0)))
            .unzip();
        let secrets: Vec<Vec<HolderSecrets>> = (0..4)
            .map(|s| {
                (0..shape.servers())
                    .map(|i| HolderSecrets::from_seed(&material(2, s, i)))
                    .collect()
            })
            .collect();
        let order_keys: Vec<HolderSecrets> = (0..4)
            .map(|s| HolderSecrets::from_seed(&material(3, s, 0)))
            .collect();
        let orders = Arc::new(order_keys.iter().map(|k| k.public().verify).collect());
        let clients: Vec<Client> = (0..4)
            .filter(|s| !sc.site_faulty(*s))
            .map(|s| Client {
                site: s,
                id: 100 + s as u64,
                key: HolderSecrets::from_seed(&material(4, s, 0)),
                sent: 0,
                acked: BTreeMap::new(),
            })
            .collect();
        let mut directory = Directory::default();
        for c in &clients {
            directory
                .keys
                .insert(Principal::Client(c.id), c.key.public());
        }
        let site_keys = SiteKeys::new(groups.clone());
        let server_keys = ServerKeys::new(
            secrets
                .iter()
                .map(|s| s.iter().map(|k| k.public().verify).collect())
                .collect(),
        );
        let sites = (0..4)
            .map(|s| {
                let site = SiteId(s as u16);
                let servers = (0..shape.servers())
                    .map(|i| {
                        let me = Server(i as u16);
                        let erasure = || {
                            Erasure::new(
                                shape,
                                site,
                                me,
                                site_keys.clone(),
                                server_keys.clone(),
                                secrets[s][i].clone(),
                                FRAME_MAX,
                            )
                        };
                        let link: Box<dyn LogicalLink> = match sc.link {
                            LinkKind::Naive => {
                                Box::new(Naive::new(shape, site, me, site_keys.clone(), FRAME_MAX))
                            }
                            LinkKind::Erasure => Box::new(erasure()),
                            LinkKind::Df => {
                                Box::new(Df::new(shape, site, me, site_keys.clone(), FRAME_MAX))
                            }
                            LinkKind::BLink => Box::new(BLink::new(
                                shape,
                                site,
                                me,
                                site_keys.clone(),
                                FRAME_MAX,
                                BLINK_TIMEOUT_MS,
                            )),
                            LinkKind::Hub { immediate } => {
                                Box::new(erasure().over_hub(HubConfig {
                                    immediate,
                                    timeout_ms: HUB_TIMEOUT_MS,
                                }))
                            }
                        };
                        let core = ledger_core(
                            site,
                            &directory,
                            &orders,
                            order_keys[s].clone(),
                            sc.mutant,
                        );
                        let machine = LogicalMachine::new(shape, site, core, link);
                        let signer = SiteSigner::new(
                            site,
                            shape.servers(),
                            groups[s].clone(),
                            shares_keys[s][i].clone(),
                        );
                        let mut server = SiteServer::new(me, machine, signer, TICK_MS);
                        if sc.correct(s, i) {
                            server.set_mutant(sc.mutant);
                        }
                        server
                    })
                    .collect();
                Site {
                    servers,
                    order: Vec::new(),
                    executed: vec![0; shape.servers()],
                    introduced: BTreeMap::new(),
                    answers: vec![Vec::new(); shape.servers()],
                }
            })
            .collect();
        World {
            rng: ChaCha8Rng::seed_from_u64(seed),
            sc,
            shape,
            sites,
            shares: Vec::new(),
            wan: Vec::new(),
            overheard: Vec::new(),
            forwarders: (0..4)
                .map(|s| {
                    Forwarder::new(shape, SiteId(s), ForwarderConfig::for_shape(&shape))
                        .expect("the paper's settings")
                })
                .collect(),
            blocked: vec![vec![Default::default(); shape.servers()]; 4],
            groups,
            shares_keys,
            secrets,
            clients,
            now: 0,
            wan_frames: 0,
            wan_bytes: 0,
        }
    }

    /// Local ordering takes `event`; from a server, only while fewer than [`WINDOW`] of its
    /// events wait for 2f+1 servers to execute them (local Prime's bound on what one server
    /// has in flight: a flooding server slows only itself).
    fn introduce(&mut self, s: usize, event: Vec<u8>, by: Submitter) {
        let now = self.now;
        let quorum = 2 * self.shape.f() + 1;
        let site = &mut self.sites[s];
        if let Submitter::Server(server) = by {
            let mut executed = site.executed.clone();
            executed.sort_unstable_by(|a, b| b.cmp(a));
            let frontier = executed[quorum - 1];
            let waiting = site.introduced.entry(server).or_default();
            while waiting.front().is_some_and(|&at| at < frontier) {
                waiting.pop_front();
            }
            if waiting.len() >= WINDOW {
                return;
            }
            waiting.push_back(site.order.len());
        }
        site.order.push((event, by, now));
    }

    fn clients_act(&mut self) {
        let f = self.shape.f();
        for k in 0..self.clients.len() {
            let (s, c, ts) = {
                let cl = &self.clients[k];
                (cl.site, cl.id, cl.sent)
            };
            if ts > 0 && !self.clients[k].acked.contains_key(&ts) {
                // f+1 servers of the site with the same answer to `ts`.
                let mut votes: BTreeMap<&Vec<u8>, BTreeSet<usize>> = BTreeMap::new();
                for (i, answers) in self.sites[s].answers.iter().enumerate() {
                    for (cl, t, a) in answers {
                        if *cl == c && *t == ts {
                            votes.entry(a).or_default().insert(i);
                        }
                    }
                }
                if let Some((a, _)) = votes.into_iter().find(|(_, v)| v.len() > f) {
                    let a = a.clone();
                    self.clients[k].acked.insert(ts, a);
                }
            }
            let cl = &self.clients[k];
            if (ts == 0 || cl.acked.contains_key(&ts)) && ts < self.sc.updates {
                let next = ts + 1;
                let op = format!("client {c} update {next}").into_bytes();
                let frame = update_frame(c, next, op, &cl.key, next, 4);
                self.clients[k].sent = next;
                self.introduce(s, Event::Update(frame).encode(), Submitter::Client(c));
            }
        }
    }

    fn round(&mut self, clocks: bool) {
        self.now += 1;
        for s in 0..4 {
            for i in 0..self.shape.servers() {
                self.server_turn(s, i, clocks);
            }
        }
        self.deliver();
    }

    fn server_turn(&mut self, s: usize, i: usize, clocks: bool) {
        let fault = self.sc.fault(s, i);
        let silent = self.sc.faulty_site == Some((s, SiteFault::Silent));
        // On a hub each part is introduced f+1 times and the copies are dropped at execution
        // for the cost of a lookup: local ordering carries f+1 times the events (and all
        // 3f+1 parts, where 2f+1 decode) for the same work.
        let pace = if self.sc.link.hub() {
            (self.sc.paces[s][i] + 1) * (self.shape.f() + 1)
        } else {
            self.sc.paces[s][i]
        };
        for _ in 0..pace {
            let site = &mut self.sites[s];
            let Some((op, by, agreed)) = site.order.get(site.executed[i]).cloned() else {
                break;
            };
            let work = site.servers[i].executed(&op, by, agreed, self.now);
            if work.blocked_on.is_some() {
                break;
            }
            site.executed[i] += 1;
            for (c, frame) in work.replies {
                if let Some((_, t, a)) = reply_of(&frame) {
                    let a = if fault == Some(ServerFault::BogusAnswers) {
                        b"bogus".to_vec()
                    } else {
                        a
                    };
                    site.answers[i].push((c, t, a));
                }
            }
            if !silent && fault != Some(ServerFault::Silent) {
                self.emit(s, i, work.shares, work.wan);
            }
        }
        if silent || fault == Some(ServerFault::Silent) {
            return;
        }
        // The link's timers run on every server's clock; tick proposals only while clocks do.
        let clocked =
            self.sites[s].servers[i].clock(if clocks { self.now } else { self.now.min(1) });
        if clocks {
            for event in clocked.introduce {
                self.introduce(s, event, Submitter::Server(Server(i as u16)));
            }
        }
        self.emit(s, i, Vec::new(), clocked.wan);
        let me = Submitter::Server(Server(i as u16));
        match fault {
            Some(ServerFault::TickSpam) => {
                let round = self.sites[s].servers[i].machine().tick_round();
                self.introduce(s, Event::Tick { round }.encode(), me);
            }
            Some(ServerFault::ForgedEvents) if self.rng.random_bool(0.05) => {
                let junk: Vec<u8> = (0..self.rng.random_range(0..64))
                    .map(|_| self.rng.random())
                    .collect();
                self.introduce(s, junk.clone(), me);
                self.introduce(s, Event::Update(junk).encode(), me);
            }
            _ => {}
        }
        if self.sc.faulty_site == Some((s, SiteFault::Noisy)) && self.rng.random_bool(0.02) {
            self.noise(s, i);
        }
    }

    /// A faulty site's server sends a message its site signed with junk in it, or a spurious
    /// INQUIRY, to a random server of a random other site.
    fn noise(&mut self, s: usize, i: usize) {
        let to_site = (s + self.rng.random_range(1..4)) % 4;
        let to_server = Server(self.rng.random_range(0..self.shape.servers()) as u16);
        let seq = self.rng.random_range(0..1_000_000);
        let payload = if self.sc.link.coded() && self.rng.random_bool(0.5) {
            Payload::Control(Control::Inquiry(Inquiry {
                seq: self.rng.random_range(0..3),
                parts: Vec::new(),
                erasure_seq: seq,
                from: SiteId(s as u16),
                about: SiteId(to_site as u16),
            }))
        } else {
            let junk: Vec<u8> = (0..self.rng.random_range(0..200))
                .map(|_| self.rng.random())
                .collect();
            Payload::Global(junk)
        };
        let bundle = Bundle::new(SiteId(s as u16), seq, vec![payload.encode()]);
        let statement = redoubt_sites::message::statement(SiteId(s as u16), &bundle.root());
        let shares: Vec<(usize, ThresholdSig)> = (0..=self.shape.f())
            .map(|k| (k, self.shares_keys[s][k].sign(&statement)))
            .collect();
        let group_sig = self.groups[s].combine(&shares);
        let Some(sig) = group_sig else { return };
        let msg = bundle.signed(sig).remove(0);
        let frame = LinkEvent::Message(msg).encode();
        // Through forwarders the faulty site's own forwarder sends it on.
        let (from, to_server) = if self.sc.link == LinkKind::Df {
            (FORWARDER, FORWARDER)
        } else {
            (Server(i as u16), to_server)
        };
        self.push_wan(
            SiteId(s as u16),
            from,
            Wan {
                to_site: SiteId(to_site as u16),
                to_server,
                frame,
            },
        );
    }

    fn withholds(&self, s: usize) -> bool {
        matches!(self.sc.faulty_site, Some((fs, SiteFault::ForwarderWithholds { from_ms }))
            if fs == s && self.now >= from_ms)
    }

    /// Server `i` of site `s` hands a frame to its forwarder (in order: behind any it was
    /// told to hand again later).
    fn hand_to_forwarder(&mut self, s: usize, i: usize, frame: &[u8]) {
        let Ok((header, msg)) = df::unframe(frame) else {
            return;
        };
        if self.blocked[s][i].is_empty() && self.offer(s, i, header, &msg) {
            return;
        }
        self.blocked[s][i].push_back((header, msg));
    }

    /// Whether site `s`'s forwarder took the frame (or refused it for good).
    fn offer(&mut self, s: usize, i: usize, header: Header, msg: &[u8]) -> bool {
        match self.forwarders[s].from_server(Server(i as u16), header, msg) {
            redoubt_sites::forwarder::Take::Later => false,
            redoubt_sites::forwarder::Take::Refused(_) => true,
            redoubt_sites::forwarder::Take::Now(out) => {
                if !self.withholds(s) {
                    for (to, bytes) in out {
                        let w = Wan {
                            to_site: to,
                            to_server: FORWARDER,
                            frame: bytes,
                        };
                        self.push_wan(SiteId(s as u16), FORWARDER, w);
                    }
                }
                true
            }
        }
    }

    /// Frames forwarders told servers to hand again, in order, as far as they are taken now.
    fn retry_blocked(&mut self) {
        for s in 0..4 {
            for i in 0..self.shape.servers() {
                while let Some((header, msg)) = self.blocked[s][i].pop_front() {
                    if !self.offer(s, i, header, &msg) {
                        self.blocked[s][i].push_front((header, msg));
                        break;
                    }
                }
            }
        }
    }

    fn emit(&mut self, s: usize, i: usize, shares: Vec<Share>, wan: Vec<Wan>) {
        let fault = self.sc.fault(s, i);
        for mut share in shares {
            if fault == Some(ServerFault::BadShares) {
                share.share = self.shares_keys[s][i].sign(b"not the bundle");
            }
            for to in 0..self.shape.servers() {
                if to != i {
                    let at = self.now + self.rng.random_range(0..2);
                    self.shares.push((at, s, i, to, share.clone()));
                }
            }
        }
        for mut w in wan {
            if w.to_server == FORWARDER {
                self.hand_to_forwarder(s, i, &w.frame);
                continue;
            }
            if fault == Some(ServerFault::BadParts) {
                w.frame = corrupt_part(&w.frame, &self.secrets[s][i]);
            }
            self.push_wan(SiteId(s as u16), Server(i as u16), w);
        }
    }

    fn push_wan(&mut self, from_site: SiteId, from: Server, w: Wan) {
        if self.sc.wan_loss_permille > 0
            && self.rng.random_range(0..1000) < self.sc.wan_loss_permille
        {
            return;
        }
        let (lo, hi) = self.sc.wan_delay;
        let held = if self.sc.fault(from_site.0 as usize, from.0 as usize)
            == Some(ServerFault::SlowFrames)
        {
            self.sc.link.slow_ms()
        } else {
            0
        };
        if self.sc.link.hub() {
            // The sender's site overhears the frame on its hub as it goes out.
            let at = self.now + held + self.rng.random_range(0..2);
            self.overheard
                .push((at, from_site.0 as usize, from, w.frame.clone()));
        }
        let at = self.now + held + self.rng.random_range(lo..=hi);
        self.wan_frames += 1;
        self.wan_bytes += w.frame.len() as u64;
        self.wan.push((at, from_site, from, w));
    }

    fn deliver(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.shares)
            .into_iter()
            .partition(|(at, ..)| *at <= now);
        self.shares = later;
        for (_, s, from, to, share) in due {
            if let Ok(work) = self.sites[s].servers[to].on_share(Server(from as u16), share) {
                let silent = self.sc.faulty_site == Some((s, SiteFault::Silent))
                    || self.sc.fault(s, to) == Some(ServerFault::Silent);
                if !silent {
                    self.emit(s, to, work.shares, work.wan);
                }
            }
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.wan)
            .into_iter()
            .partition(|(at, ..)| *at <= now);
        self.wan = later;
        let (heard, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.overheard)
            .into_iter()
            .partition(|(at, ..)| *at <= now);
        self.overheard = later;
        for (_, s, from, frame) in heard {
            for server in self.sites[s].servers.iter_mut() {
                server.on_overheard(from, &frame);
            }
        }
        self.retry_blocked();
        for (_, from_site, from, w) in due {
            let r = w.to_site.0 as usize;
            if w.to_server == FORWARDER {
                // A forwarder hands what it receives to every server of its site; a faulty
                // site's forwarder to none, a withholding one once it started withholding.
                let withholding = matches!(
                    self.sc.faulty_site,
                    Some((fs, SiteFault::ForwarderWithholds { .. })) if fs == r
                );
                let receives = if withholding {
                    !self.withholds(r)
                } else {
                    !self.sc.site_faulty(r)
                };
                if receives {
                    let out = self.forwarders[r].from_wan(from_site, &w.frame);
                    for (i, frame) in out {
                        let i = i.0 as usize;
                        if self.sc.fault(r, i) == Some(ServerFault::Silent) {
                            continue;
                        }
                        if let Ok(Some(event)) =
                            self.sites[r].servers[i].on_wan(from_site, FORWARDER, &frame)
                        {
                            self.introduce(r, event, Submitter::Server(Server(i as u16)));
                        }
                    }
                }
                continue;
            }
            // A hub hands a frame to every server of its site (uniform reception).
            let to: Vec<usize> = if self.sc.link.hub() {
                (0..self.shape.servers()).collect()
            } else {
                vec![w.to_server.0 as usize]
            };
            for i in to {
                if self.sc.site_faulty(r) || self.sc.fault(r, i) == Some(ServerFault::Silent) {
                    continue;
                }
                if let Ok(Some(event)) = self.sites[r].servers[i].on_wan(from_site, from, &w.frame)
                {
                    self.introduce(r, event, Submitter::Server(Server(i as u16)));
                }
            }
        }
    }

    /// Where each site stands, for a failing seed's report.
    fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (s, site) in self.sites.iter().enumerate() {
            let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
            for (op, ..) in &site.order {
                let kind = match Event::decode(op) {
                    Ok(Event::Link(LinkEvent::Part(_))) => "parts",
                    Ok(Event::Link(LinkEvent::Message(_))) => "messages",
                    Ok(Event::Link(LinkEvent::Suspect { .. })) => "suspicions",
                    Ok(Event::Tick { .. }) => "ticks",
                    Ok(Event::Update(_)) => "updates",
                    Err(_) => "junk",
                };
                *kinds.entry(kind).or_default() += 1;
            }
            lines.push(format!(
                "site {s} local order: {kinds:?}, paces {:?}",
                self.sc.paces[s]
            ));
            for (i, server) in site.servers.iter().enumerate() {
                let core = server.machine().participant().core();
                let link = server.machine().link();
                let blacklisted: Vec<u16> = link
                    .blacklists()
                    .map(|b| b.sites.iter().map(|s| s.0).collect())
                    .unwrap_or_default();
                lines.push(format!(
                    "site {s} server {i}{}: executed {}/{} events, view {}, last executed {}, ops {}, next message {}, ticks {}, blacklisted sites {:?}, {:?}",
                    if self.sc.correct(s, i) { "" } else { " (faulty)" },
                    site.executed[i],
                    site.order.len(),
                    core.view(),
                    core.last_executed(),
                    core.service().ops.len(),
                    server.machine().next_seq(),
                    server.machine().stats().ticks,
                    blacklisted,
                    server.machine().stats(),
                ));
            }
        }
        lines
    }

    fn done(&self) -> bool {
        self.clients
            .iter()
            .all(|c| c.acked.contains_key(&self.sc.updates))
    }

    fn check(&self) -> Vec<String> {
        let mut v = Vec::new();
        let correct: Vec<(usize, usize)> = (0..4)
            .flat_map(|s| (0..self.shape.servers()).map(move |i| (s, i)))
            .filter(|&(s, i)| self.sc.correct(s, i))
            .collect();
        let ops = |s: usize, i: usize| {
            &self.sites[s].servers[i]
                .machine()
                .participant()
                .core()
                .service()
                .ops
        };
        let Some(&(rs, ri)) = correct.iter().max_by_key(|&&(s, i)| ops(s, i).len()) else {
            return v;
        };
        let reference = ops(rs, ri);
        for &(s, i) in &correct {
            let mine = ops(s, i);
            if reference[..mine.len()] != mine[..] {
                v.push(format!(
                    "agreement: site {s} server {i} executed a different order than site {rs} server {ri}"
                ));
            }
        }
        let mut seen = BTreeSet::new();
        for op in reference {
            if !seen.insert(op) {
                v.push(format!(
                    "an update ran twice: {}",
                    String::from_utf8_lossy(op)
                ));
            }
        }
        for c in &self.clients {
            for (ts, answer) in &c.acked {
                let op = format!("client {} update {ts}", c.id).into_bytes();
                let position = reference.iter().position(|o| *o == op);
                let expected = position.map(|p| (p as u64 + 1).to_le_bytes().to_vec());
                if expected.as_ref() != Some(answer) {
                    v.push(format!(
                        "client {} took an answer to update {ts} that is not its place in the order",
                        c.id
                    ));
                }
            }
            if !c.acked.contains_key(&self.sc.updates) {
                v.push(format!(
                    "liveness: client {} finished {} of {} updates",
                    c.id,
                    c.acked.len(),
                    self.sc.updates
                ));
            }
        }
        for &(s, i) in &correct {
            let server = &self.sites[s].servers[i];
            for bad in server.signer().blacklist().keys() {
                if self.sc.correct(s, bad.0 as usize) {
                    v.push(format!(
                        "site {s} server {i} blacklisted correct server {}",
                        bad.0
                    ));
                }
            }
            if let Some(blacklists) = server.machine().link().blacklists() {
                for site in &blacklists.sites {
                    if !self.sc.site_faulty(site.0 as usize) {
                        v.push(format!(
                            "site {s} server {i} blacklisted correct site {}",
                            site.0
                        ));
                    }
                }
                for (site, servers) in &blacklists.servers {
                    for b in servers {
                        if self.sc.correct(site.0 as usize, b.0 as usize) {
                            v.push(format!(
                                "site {s} server {i} blacklisted correct server {} of site {}",
                                b.0, site.0
                            ));
                        }
                    }
                }
            }
        }
        // Correct servers of a site that executed as far emitted as many messages.
        for s in 0..4 {
            let mut by_executed: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
            for i in (0..self.shape.servers()).filter(|&i| self.sc.correct(s, i)) {
                by_executed
                    .entry(self.sites[s].executed[i])
                    .or_default()
                    .insert(self.sites[s].servers[i].machine().next_seq());
            }
            if by_executed.values().any(|seqs| seqs.len() > 1) {
                v.push(format!(
                    "site {s}: servers that executed as far emitted different numbers of messages"
                ));
            }
        }
        v
    }
}

/// A faulty server's part: one byte flipped and signed again with its own key.
fn corrupt_part(frame: &[u8], key: &HolderSecrets) -> Vec<u8> {
    match LinkEvent::decode(frame, FRAME_MAX) {
        Ok(LinkEvent::Part(mut p)) => {
            let last = p.shard.len() - 1;
            p.shard[last] ^= 1;
            p.sig = key.sign(&p.statement());
            LinkEvent::Part(p).encode()
        }
        _ => frame.to_vec(),
    }
}

/// Runs one seed.
pub fn run(sc: SitesScenario) -> SitesOutcome {
    let summary = format!(
        "{} servers per site, {:?} link, faulty site {:?}, faulty servers {:?}, wan {}-{} ms loss {}‰",
        sc.servers,
        sc.link,
        sc.faulty_site,
        sc.faulty_servers,
        sc.wan_delay.0,
        sc.wan_delay.1,
        sc.wan_loss_permille
    );
    let seed = sc.seed;
    let mut w = World::new(sc);
    let mut rounds = 0;
    while rounds < ROUNDS_MAX && !w.done() {
        w.clients_act();
        w.round(true);
        rounds += 1;
    }
    for _ in 0..SETTLE_ROUNDS {
        w.round(false);
    }
    let violations = w.check();
    let state = if violations.is_empty() {
        Vec::new()
    } else {
        w.describe()
    };
    let blacklisted = w
        .sites
        .iter()
        .flat_map(|s| s.servers.iter())
        .map(|s| s.signer().blacklist().len() as u64)
        .sum();
    SitesOutcome {
        seed,
        violations,
        rounds,
        updates_acked: w.clients.iter().map(|c| c.acked.len() as u64).sum(),
        events: w.sites.iter().map(|s| s.order.len() as u64).sum(),
        wan_frames: w.wan_frames,
        wan_bytes: w.wan_bytes,
        message_bytes: (0..4)
            .filter(|&s| !w.sc.site_faulty(s))
            .map(|s| {
                (0..w.shape.servers())
                    .filter(|&i| w.sc.correct(s, i))
                    .map(|i| w.sites[s].servers[i].sent().bytes)
                    .max()
                    .unwrap_or(0)
            })
            .sum(),
        blacklisted,
        summary,
        state,
    }
}
