//! Whole sites end to end: four sites of four servers, each server a `SiteServer` with the
//! erasure-coded (or naive) link, exchanging shares inside sites and frames between them, while
//! one server of site 0 sends bad shares and bad parts and site 3 is wholly faulty and silent.
//! Local ordering is a perfect sequencer per site (every server executes the same events in the
//! same order, at its own pace); the global protocol is a test participant that broadcasts each
//! local update and logs what it receives.

mod common;

use common::{world, World};
use redoubt_sites::link::{LogicalLink, Misbehaviour};
use redoubt_sites::machine::{Event, GlobalOut, Participant};
use redoubt_sites::{Server, SiteId};

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

fn run<L: LogicalLink>(mut w: World<Log, L>) -> World<Log, L> {
    for k in 0..6u64 {
        for s in 0..3 {
            let update = format!("site {s} update {k}").into_bytes();
            w.submit(s, 100 + s as u64, Event::Update(update).encode());
        }
    }
    assert!(
        w.settle(150),
        "every server executed its site's whole order"
    );
    w
}

fn check<L: LogicalLink>(w: &World<Log, L>) {
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
    let w = run(world(|_, _| Log::default(), common::erasure));
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
fn a_server_its_own_site_found_faulty_is_not_heard_any_more() {
    let w = run(world(|_, _| Log::default(), common::erasure));
    check(&w);
    // Site 0 answered an INQUIRY naming its server 3: from then on the tick proposals and
    // parts server 3 introduces are refused at execution, at every correct server alike.
    let refused: Vec<u64> = (0..3)
        .map(|i| {
            let server = &w.sites[0].servers[i];
            assert!(server.machine().link().own_blacklisted(Server(3)));
            server.machine().stats().refused
        })
        .collect();
    assert!(refused[0] > 0, "{refused:?}");
    assert!(refused.windows(2).all(|p| p[0] == p[1]), "{refused:?}");
}

#[test]
fn sites_agree_over_the_naive_link_with_a_faulty_server_and_a_silent_site() {
    let w = run(world(|_, _| Log::default(), common::naive));
    check(&w);
}

#[test]
fn sites_agree_over_hubs_with_a_faulty_server_and_a_silent_site() {
    let mut w = world(|_, _| Log::default(), common::hub);
    w.hub = true;
    let w = run(w);
    check(&w);
    // The faulty server's bad parts were overheard and counted, and failed decodings at the
    // receiving sites, whose INQUIRYs blacklisted it there.
    for s in 1..3 {
        for i in 0..4 {
            let link = w.sites[s].servers[i].machine().link();
            assert!(
                link.inquiries().server_blacklisted(SiteId(0), Server(3)),
                "site {s} server {i}"
            );
        }
    }
    // Hub-Optimistic: the second set's parts were mostly cancelled by overhearing, and each
    // received part was introduced by f+1 = 2 servers, not all four.
    let mut scheduled = 0;
    let mut cancelled = 0;
    let mut not_ours = 0;
    for s in 0..3 {
        for i in 0..4 {
            let h = w.sites[s].servers[i].machine().link().hub_stats().unwrap();
            scheduled += h.scheduled;
            cancelled += h.cancelled;
            not_ours += h.not_ours;
        }
    }
    assert!(scheduled > 0 && cancelled > 0, "{scheduled} {cancelled}");
    assert!(not_ours > 0);
}

#[test]
fn sites_agree_over_blink_with_a_faulty_server_and_a_silent_site() {
    let w = run(world(|_, _| Log::default(), common::blink));
    check(&w);
    // The silent site acknowledges nothing: the pairs towards it keep being replaced, by
    // every correct server at the same point, while the links between correct sites stay.
    for s in 0..3 {
        let first = w.sites[s].servers[0].machine().link();
        for i in 1..3 {
            let link = w.sites[s].servers[i].machine().link();
            for to in 0..4u16 {
                if to as usize != s {
                    assert_eq!(link.epoch(SiteId(to)), first.epoch(SiteId(to)), "site {s}");
                }
            }
        }
        assert!(
            first.epoch(SiteId(3)) > 0,
            "site {s}: the silent site's pair moved"
        );
    }
}
