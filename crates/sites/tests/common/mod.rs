//! The harness of the end-to-end site tests: sites of `SiteServer`s, a perfect local order
//! per site (every server executes the same events in the same order, each at its own pace),
//! shares delivered inside sites and frames between them, one server of site 0 sending bad
//! shares and bad parts, and one site wholly faulty and silent. With `hub` set, every site has
//! a broadcast hub: a frame to a site reaches all its servers, and the sender's site overhears
//! it.

#![allow(dead_code)]

use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::threshold::{deal, GroupKey, KeyShare};
use redoubt_sites::link::erasure::ServerKeys;
use redoubt_sites::link::{
    BLink, Erasure, HubConfig, LinkEvent, LogicalLink, Misbehaviour, Naive, Wan,
};
use redoubt_sites::machine::{LogicalMachine, Participant, Submitter};
use redoubt_sites::message::SiteKeys;
use redoubt_sites::server::SiteServer;
use redoubt_sites::sign::{Share, SiteSigner};
use redoubt_sites::{Server, Shape, SiteId};
use std::collections::VecDeque;

pub const FRAME_MAX: usize = 1 << 20;
pub const TICK_MS: u64 = 10;

pub struct Site<P, L> {
    pub servers: Vec<SiteServer<P, L>>,
    /// The local order: (event, submitter, agreed time), and how far each server executed
    /// it.
    pub order: Vec<(Vec<u8>, Submitter, u64)>,
    pub executed: Vec<usize>,
    pub replies: Vec<Vec<(u64, Vec<u8>)>>,
}

pub struct World<P, L> {
    pub shape: Shape,
    pub sites: Vec<Site<P, L>>,
    shares: VecDeque<(usize, usize, Share)>,
    wan: VecDeque<(SiteId, Server, Wan)>,
    /// Site 0's faulty server, and the silent site.
    pub bad_server: usize,
    pub silent_site: usize,
    pub now: u64,
    pub proofs: Vec<Misbehaviour>,
    pub bad_shares_seen: usize,
    /// A deliberately broken logical machine: each server takes its own clock for the time
    /// of an event instead of the time local ordering agreed (trap 1).
    pub server_clocks: bool,
    /// Sites talk through broadcast hubs.
    pub hub: bool,
}

pub fn keys(shape: Shape) -> (Vec<GroupKey>, Vec<Vec<KeyShare>>, Vec<Vec<HolderSecrets>>) {
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

/// The erasure-coded link of server `me` of `site` in the 4 x 4 world.
pub fn erasure(
    site: SiteId,
    me: Server,
    keys: SiteKeys,
    servers: ServerKeys,
    secret: HolderSecrets,
) -> Erasure {
    Erasure::new(
        Shape::new(4, 4).unwrap(),
        site,
        me,
        keys,
        servers,
        secret,
        FRAME_MAX,
    )
}

/// The erasure-coded link over a hub, Hub-Optimistic with the paper's 25 ms timeout.
pub fn hub(
    site: SiteId,
    me: Server,
    keys: SiteKeys,
    servers: ServerKeys,
    secret: HolderSecrets,
) -> Erasure {
    erasure(site, me, keys, servers, secret).over_hub(HubConfig::default())
}

/// BLink with a 40 ms timeout.
pub fn blink(site: SiteId, me: Server, keys: SiteKeys, _: ServerKeys, _: HolderSecrets) -> BLink {
    BLink::new(Shape::new(4, 4).unwrap(), site, me, keys, FRAME_MAX, 40)
}

/// The naive link of server `me` of `site` in the 4 x 4 world.
pub fn naive(site: SiteId, me: Server, keys: SiteKeys, _: ServerKeys, _: HolderSecrets) -> Naive {
    Naive::new(Shape::new(4, 4).unwrap(), site, me, keys, FRAME_MAX)
}

pub fn world<P: Participant, L: LogicalLink>(
    participant: impl Fn(SiteId, Server) -> P,
    make: impl Fn(SiteId, Server, SiteKeys, ServerKeys, HolderSecrets) -> L,
) -> World<P, L> {
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
                    let machine = LogicalMachine::new(shape, site, participant(site, me), link);
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
        server_clocks: false,
        hub: false,
    }
}

impl<P: Participant, L: LogicalLink> World<P, L> {
    pub fn faulty(&self, site: usize, server: usize) -> bool {
        site == self.silent_site || (site == 0 && server == self.bad_server)
    }

    /// One round: every server executes up to its pace of the local order, proposes ticks,
    /// then shares and WAN frames are delivered.
    pub fn round(&mut self, r: u64, clocks: bool) {
        self.now += 1;
        for s in 0..self.sites.len() {
            for i in 0..self.shape.servers() {
                // Servers run at different paces: server i executes i+1 events a round.
                for _ in 0..=i {
                    let site = &mut self.sites[s];
                    let at = site.executed[i];
                    let Some((op, by, agreed)) = site.order.get(at).cloned() else {
                        break;
                    };
                    let agreed = if self.server_clocks { self.now } else { agreed };
                    let work = site.servers[i].executed(&op, by, agreed, self.now);
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
                let clocked = self.sites[s].servers[i].clock(self.now);
                if s != self.silent_site {
                    let now = self.now;
                    for event in clocked.introduce {
                        self.sites[s]
                            .order
                            .push((event, Submitter::Server(Server(i as u16)), now));
                    }
                }
                self.emit(s, i, Vec::new(), clocked.wan);
            }
        }
        // Deliver in an order that varies with the round.
        if r % 2 == 1 {
            self.shares.make_contiguous().reverse();
        }
        while let Some((s, to, share)) = self.shares.pop_front() {
            if let Ok(work) = self.sites[s].servers[to].on_share(share.signer, share) {
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
            let to: Vec<usize> = if self.hub {
                // Overheard by the sender's site, received by every server of the other.
                for k in 0..self.shape.servers() {
                    self.sites[from_site.0 as usize].servers[k].on_overheard(from, &wan.frame);
                }
                (0..self.shape.servers()).collect()
            } else {
                vec![i]
            };
            for i in to {
                if let Ok(Some(event)) =
                    self.sites[r].servers[i].on_wan(from_site, from, &wan.frame)
                {
                    let now = self.now;
                    self.sites[r]
                        .order
                        .push((event, Submitter::Server(Server(i as u16)), now));
                }
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

    /// A local client submits `event` to its site's local ordering.
    pub fn submit(&mut self, site: usize, client: u64, event: Vec<u8>) {
        let now = self.now;
        self.sites[site]
            .order
            .push((event, Submitter::Client(client), now));
    }

    /// Rounds with the servers' clocks running, then rounds without; whether every server
    /// then executed its site's whole order.
    pub fn settle(&mut self, rounds: u64) -> bool {
        for r in 0..rounds {
            self.round(r, true);
        }
        for r in rounds..2 * rounds {
            self.round(r, false);
        }
        self.sites
            .iter()
            .all(|site| site.executed.iter().all(|&e| e == site.order.len()))
    }
}

/// A faulty server's part: one byte flipped and signed again with its own key (valid on its
/// own, wrong for the message). Whole messages pass unchanged.
pub fn corrupt_part(frame: &[u8], key: &HolderSecrets) -> Vec<u8> {
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
