//! Whole sites end to end: four sites of four servers, each server a `SiteServer` with the
//! erasure-coded (or naive) link, exchanging shares inside sites and frames between them, while
//! one server of site 0 sends bad shares and bad parts and site 3 is wholly faulty and silent.
//! Local ordering is a perfect sequencer per site (every server executes the same events in the
//! same order, at its own pace); the global protocol is a test participant that broadcasts each
//! local update and logs what it receives.

use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::threshold::{deal, GroupKey, KeyShare};
use redoubt_sites::link::erasure::ServerKeys;
use redoubt_sites::link::{Erasure, LinkEvent, LogicalLink, Misbehaviour, Naive, Wan};
use redoubt_sites::machine::{Event, GlobalOut, LogicalMachine, Participant, Submitter};
use redoubt_sites::message::SiteKeys;
use redoubt_sites::server::SiteServer;
use redoubt_sites::sign::{Share, SiteSigner};
use redoubt_sites::{Server, Shape, SiteId};
use std::collections::VecDeque;

const FRAME_MAX: usize = 1 << 20;
const TICK_MS: u64 = 10;

/// Broadcasts each local update to every site; logs updates and messages in execution order.
#[derive(Default)]
struct Log {
    entries: Vec<(u16, Vec<u8>)>,
    ticks: u64,
}

impl Participant for Log {
    fn on_message(&mut self, _now: u64, site: SiteId, body: &[u8]) -> Vec<GlobalOut> {
        self.entries.push((site.0, body.to_vec()));
        Vec::new()
    }
    fn on_tick(&mut self, _now: u64) -> Vec<GlobalOut> {
        self.ticks += 1;
        Vec::new()
    }
    fn on_update(&mut self, _now: u64, client: u64, update: &[u8]) -> Vec<GlobalOut> {
        self.entries.push((u16::MAX, update.to_vec()));
        vec![
            GlobalOut::Broadcast {
                body: update.to_vec(),
            },
            GlobalOut::Reply {
                client,
                body: b"ok".to_vec(),
            },
        ]
    }
}

struct Site<L> {
    servers: Vec<SiteServer<Log, L>>,
    /// The local order: (event, submitter), and how far each server executed it.
    order: Vec<(Vec<u8>, Submitter)>,
    executed: Vec<usize>,
    replies: Vec<Vec<(u64, Vec<u8>)>>,
}

struct World<L> {
    shape: Shape,
    sites: Vec<Site<L>>,
    shares: VecDeque<(usize, usize, Share)>,
    wan: VecDeque<(SiteId, Server, Wan)>,
    /// Site 0's faulty server, and the silent site.
    bad_server: usize,
    silent_site: usize,
    now: u64,
    proofs: Vec<Misbehaviour>,
    bad_shares_seen: usize,
}

fn keys(shape: Shape) -> (Vec<GroupKey>, Vec<Vec<KeyShare>>, Vec<Vec<HolderSecrets>>) {
    let (groups, shares): (Vec<_>, Vec<_>) = (0..shape.sites())
        .map(|s| deal(shape.f(), shape.servers(), [s as u8 + 40; 32]))
        .unzip();
    let secrets = (0..shape.sites())
        .map(|s| {
            (0..shape.servers())
                .map(|i| HolderSecrets::from_seed(&[s as u8 * 16 + i as u8 + 1; 32]))
                .collect()
        })
        .collect();
    (groups, shares, secrets)
}

fn world<L: LogicalLink>(
    make: impl Fn(SiteId, Server, SiteKeys, ServerKeys, HolderSecrets) -> L,
) -> World<L> {
    let shape = Shape::new(4, 4).unwrap();
    let (groups, shares, secrets) = keys(shape);
    let site_keys = SiteKeys::new(groups.clone());
    let server_keys = ServerKeys::new(
        secrets
            .iter()
            .map(|s| s.iter().map(|k| k.public().verify).collect())
            .collect(),
    );
    let sites = (0..shape.sites())
        .map(|s| {
            let site = SiteId(s as u16);
            let servers = (0..shape.servers())
                .map(|i| {
                    let me = Server(i as u16);
                    let link = make(
                        site,
                        me,
                        site_keys.clone(),
                        server_keys.clone(),
                        secrets[s][i].clone(),
                    );
                    let machine = LogicalMachine::new(shape, site, Log::default(), link);
                    let signer = SiteSigner::new(
                        site,
                        shape.servers(),
                        groups[s].clone(),
                        shares[s][i].clone(),
                    );
                    SiteServer::new(me, machine, signer, TICK_MS)
                })
                .collect();
            Site {
                servers,
                order: Vec::new(),
                executed: vec![0; shape.servers()],
                replies: vec![Vec::new(); shape.servers()],
            }
        })
        .collect();
    World {
        shape,
        sites,
        shares: VecDeque::new(),
        wan: VecDeque::new(),
        bad_server: 3,
        silent_site: 3,
        now: 0,
        proofs: Vec::new(),
        bad_shares_seen: 0,
    }
}

impl<L: LogicalLink> World<L> {
    fn faulty(&self, site: usize, server: usize) -> bool {
        site == self.silent_site || (site == 0 && server == self.bad_server)
    }

    /// One round: every server executes up to its pace of the local order, proposes ticks,
    /// then shares and WAN frames are delivered.
    fn round(&mut self, r: u64, clocks: bool) {
        self.now += 1;
        for s in 0..self.sites.len() {
            for i in 0..self.shape.servers() {
                // Servers run at different paces: server i executes i+1 events a round.
                for _ in 0..=i {
                    let site = &mut self.sites[s];
                    let at = site.executed[i];
                    let Some((op, by)) = site.order.get(at).cloned() else {
                        break;
                    };
                    let work = site.servers[i].executed(&op, by, self.now, self.now);
                    if work.blocked_on.is_some() {
                        break; // executed again next round
                    }
                    site.executed[i] += 1;
                    site.replies[i].extend(work.replies);
                    if !self.faulty(s, i) {
                        self.proofs.extend(work.misbehaviour);
                        self.bad_shares_seen += work.bad_shares.len();
                    }
                    self.emit(s, i, work.shares, work.wan);
                }
                if !clocks {
                    continue;
                }
                if let Some(tick) = self.sites[s].servers[i].clock(self.now) {
                    if s != self.silent_site {
                        self.sites[s]
                            .order
                            .push((tick, Submitter::Server(Server(i as u16))));
                    }
                }
            }
        }
        // Deliver in an order that varies with the round.
        if r % 2 == 1 {
            self.shares.make_contiguous().reverse();
        }
        while let Some((s, to, share)) = self.shares.pop_front() {
            if let Ok(work) = self.sites[s].servers[to].on_share(share) {
                if !self.faulty(s, to) {
                    self.bad_shares_seen += work.bad_shares.len();
                }
                self.emit(s, to, work.shares, work.wan);
            }
        }
        while let Some((from_site, from, wan)) = self.wan.pop_front() {
            let (r, i) = (wan.to_site.0 as usize, wan.to_server.0 as usize);
            if r == self.silent_site {
                continue;
            }
            if let Ok(Some(event)) = self.sites[r].servers[i].on_wan(from_site, from, &wan.frame) {
                self.sites[r]
                    .order
                    .push((event, Submitter::Server(Server(i as u16))));
            }
        }
    }

    fn emit(&mut self, s: usize, i: usize, shares: Vec<Share>, wan: Vec<Wan>) {
        if s == self.silent_site {
            return;
        }
        let bad = self.faulty(s, i);
        for mut share in shares {
            if bad {
                share.share = redoubt_crypto::threshold::ThresholdSig([7; 96]);
            }
            for to in 0..self.shape.servers() {
                if to != i {
                    self.shares.push_back((s, to, share.clone()));
                }
            }
        }
        for mut w in wan {
            if bad {
                w.frame = corrupt_part(&w.frame, &self.bad_key());
            }
            self.wan.push_back((SiteId(s as u16), Server(i as u16), w));
        }
    }

    fn bad_key(&self) -> HolderSecrets {
        keys(self.shape).2[0][self.bad_server].clone()
    }

    fn update(&mut self, site: usize, client: u64, body: &[u8]) {
        self.sites[site].order.push((
            Event::Update(body.to_vec()).encode(),
            Submitter::Client(client),
        ));
    }
}

/// A faulty server's part: one byte flipped and signed again with its own key (valid on its
/// own, wrong for the message). Whole messages pass unchanged.
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

fn run<L: LogicalLink>(mut w: World<L>) -> World<L> {
    for k in 0..6u64 {
        for s in 0..3 {
            w.update(s, 100 + s as u64, format!("site {s} update {k}").as_bytes());
        }
    }
    // Clocks run, then stop so that every server catches up with its site's order.
    for r in 0..150 {
        w.round(r, true);
    }
    for r in 150..300 {
        w.round(r, false);
    }
    for site in &w.sites {
        assert!(
            site.executed.iter().all(|&e| e == site.order.len()),
            "drained"
        );
    }
    w
}

fn check<L: LogicalLink>(w: &World<L>) {
    let correct_sites = [0usize, 1, 2];
    for &s in &correct_sites {
        let site = &w.sites[s];
        let correct: Vec<usize> = (0..w.shape.servers())
            .filter(|&i| !w.faulty(s, i))
            .collect();
        let first = site.servers[correct[0]].machine().participant();
        for &i in &correct {
            let log = site.servers[i].machine().participant();
            assert_eq!(log.entries, first.entries, "site {s}: server {i} diverged");
            assert_eq!(
                log.ticks, first.ticks,
                "site {s}: server {i} ticked differently"
            );
            assert_eq!(
                site.replies[i].len(),
                6,
                "site {s}: server {i} answered every update"
            );
        }
        assert!(first.ticks > 5, "ticks fire from the servers' proposals");
        // Every update of every correct site reached this one, once.
        for &o in &correct_sites {
            let from: Vec<&Vec<u8>> = first
                .entries
                .iter()
                .filter(|(site, _)| *site == if o == s { u16::MAX } else { o as u16 })
                .map(|(_, b)| b)
                .collect();
            assert_eq!(
                from.len(),
                6,
                "site {s} got {} updates of site {o}",
                from.len()
            );
        }
    }
}

#[test]
fn sites_agree_over_the_erasure_link_with_a_faulty_server_and_a_silent_site() {
    let w = run(world(|site, me, keys, servers, secret| {
        Erasure::new(
            Shape::new(4, 4).unwrap(),
            site,
            me,
            keys,
            servers,
            secret,
            FRAME_MAX,
        )
    }));
    check(&w);
    // The faulty server's bad share got it blacklisted in its site; its bad parts got it
    // blacklisted by the receiving sites, through INQUIRY and INQUIRY-RESPONSE.
    // A share is checked only when a combination fails, so the servers that combined
    // without it never looked at it; the others blacklisted its server.
    assert!(w.bad_shares_seen > 0);
    assert!((0..3).any(|i| w.sites[0].servers[i]
        .signer()
        .blacklist()
        .contains_key(&Server(3))));
    assert!(w
        .proofs
        .iter()
        .any(|m| matches!(m, Misbehaviour::BadParts { site, servers, .. } if site.0 == 0 && servers.contains(&Server(3)))));
    for s in 1..3 {
        for i in 0..4 {
            let link = w.sites[s].servers[i].machine().link();
            assert!(
                link.inquiries().server_blacklisted(SiteId(0), Server(3)),
                "site {s} server {i}"
            );
        }
    }
}

#[test]
fn sites_agree_over_the_naive_link_with_a_faulty_server_and_a_silent_site() {
    let w = run(world(|site, me, keys, _, _| {
        Naive::new(Shape::new(4, 4).unwrap(), site, me, keys, FRAME_MAX)
    }));
    check(&w);
}
