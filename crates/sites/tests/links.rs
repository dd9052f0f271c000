//! The hub-based logical link piece by piece (Amir et al. 2009 §4.2): the (2f+1, 3f+1) code,
//! the first set sending at once, the second set waiting its local timeout unless it overhears
//! 2f+1 parts of the message, f+1 introducers per received part, and Hub-Immediate; and the
//! dependable-forwarder link (§4.3) from server to forwarder to forwarder to server.

mod common;

use common::{keys, FRAME_MAX};
use redoubt_crypto::threshold::ThresholdSig;
use redoubt_sites::forwarder::{Forwarder, ForwarderConfig, Take};
use redoubt_sites::link::erasure::ServerKeys;
use redoubt_sites::link::hub::{first_set, introduces};
use redoubt_sites::link::{df, Df, Erasure, HubConfig, LinkEvent, LogicalLink, Naive, FORWARDER};
use redoubt_sites::machine::{Event, GlobalOut, LogicalMachine, Submitter};
use redoubt_sites::message::{statement, Bundle, SignedMessage, SiteKeys};
use redoubt_sites::{Server, Shape, SiteId};

struct Hubs {
    shape: Shape,
    site_keys: SiteKeys,
    server_keys: ServerKeys,
    keys: (
        Vec<redoubt_crypto::threshold::GroupKey>,
        Vec<Vec<redoubt_crypto::threshold::KeyShare>>,
        Vec<Vec<redoubt_crypto::pk::HolderSecrets>>,
    ),
}

impl Hubs {
    fn new(servers: usize) -> Hubs {
        let shape = Shape::new(4, servers).unwrap();
        let keys = keys(shape);
        Hubs {
            shape,
            site_keys: SiteKeys::new(keys.0.clone()),
            server_keys: ServerKeys::new(
                keys.2
                    .iter()
                    .map(|s| s.iter().map(|k| k.public().verify).collect())
                    .collect(),
            ),
            keys,
        }
    }

    fn links(&self, site: SiteId, cfg: HubConfig) -> Vec<Erasure> {
        self.shape
            .server_ids()
            .map(|i| {
                Erasure::new(
                    self.shape,
                    site,
                    i,
                    self.site_keys.clone(),
                    self.server_keys.clone(),
                    self.keys.2[site.0 as usize][i.0 as usize].clone(),
                    FRAME_MAX,
                )
                .over_hub(cfg)
            })
            .collect()
    }

    fn signed(&self, site: SiteId, seq: u64, body: Vec<u8>) -> SignedMessage {
        self.signed_for(site, seq, body, None)
    }

    fn signed_for(
        &self,
        site: SiteId,
        seq: u64,
        body: Vec<u8>,
        to: Option<SiteId>,
    ) -> SignedMessage {
        let bundle = Bundle::addressed(site, seq, vec![(body, to)]);
        let st = statement(site, &bundle.root());
        let shares: Vec<(usize, ThresholdSig)> = (0..=self.shape.f())
            .map(|k| (k, self.keys.1[site.0 as usize][k].sign(&st)))
            .collect();
        let sig = self.keys.0[site.0 as usize].combine(&shares).unwrap();
        bundle.signed(sig).remove(0)
    }
}

/// Global frames are carried as payloads; the link sends any validly signed message.
fn body(n: usize) -> Vec<u8> {
    redoubt_sites::link::Payload::Global(vec![9u8; n]).encode()
}

#[test]
fn the_first_set_sends_at_once_and_the_second_waits_unless_it_overhears_enough() {
    let h = Hubs::new(7); // f = 2: 5 parts decode, 5 send at once, 2 wait
    let (s, r) = (SiteId(0), SiteId(1));
    let cfg = HubConfig {
        immediate: false,
        timeout_ms: 25,
    };
    let mut senders = h.links(s, cfg);
    for l in senders.iter_mut() {
        l.timer(1000);
    }
    let msg = h.signed(s, 40, body(700));
    let mut sent = Vec::new();
    for (i, l) in senders.iter_mut().enumerate() {
        let frames = l.send(&msg, r);
        let first = first_set(&h.shape, r, 40, Server(i as u16));
        assert_eq!(frames.len(), first as usize, "server {i}");
        sent.extend(frames.into_iter().map(|w| (i, w)));
    }
    assert_eq!(sent.len(), 5);
    let second: Vec<usize> = (0..7)
        .filter(|&i| !first_set(&h.shape, r, 40, Server(i as u16)))
        .collect();
    assert_eq!(second.len(), 2);
    // The first second-set server overhears four parts only, the other all five.
    for (k, (i, w)) in sent.iter().enumerate() {
        if k < 4 {
            senders[second[0]].overhear(Server(*i as u16), &w.frame);
        }
        senders[second[1]].overhear(Server(*i as u16), &w.frame);
    }
    // Its own part does not count, nor a part twice, nor a part its sender did not sign.
    let (i, w) = &sent[0];
    senders[second[0]].overhear(Server(*i as u16), &w.frame);
    senders[second[0]].overhear(Server(((*i + 1) % 7) as u16), &w.frame);
    assert!(senders[second[0]].timer(1024).wan.is_empty(), "not yet");
    let late = senders[second[0]].timer(1025).wan;
    assert_eq!(
        late.len(),
        1,
        "the timeout expired with four parts overheard"
    );
    assert!(senders[second[1]].timer(1100).wan.is_empty(), "cancelled");
    assert_eq!(senders[second[1]].hub_stats().unwrap().cancelled, 1);

    // Every server of r receives every part; f+1 of them introduce each.
    let mut receivers = h.links(r, cfg);
    let mut order = Vec::new();
    for (i, w) in sent.iter().chain([(second[0], late[0].clone())].iter()) {
        let mut introduced = 0;
        for (j, l) in receivers.iter_mut().enumerate() {
            if let Some(e) = l.receive(s, Server(*i as u16), &w.frame).unwrap() {
                assert!(introduces(
                    &h.shape,
                    Server(*i as u16),
                    40,
                    Server(j as u16)
                ));
                introduced += 1;
                order.push(e);
            }
        }
        assert_eq!(introduced, 3, "f+1 introducers of part {i}");
    }
    // Duplicates go at execution; the message is handed over at the fifth distinct part.
    for l in receivers.iter_mut() {
        let mut delivered = Vec::new();
        let mut distinct = std::collections::BTreeSet::new();
        for e in &order {
            let out = l.executed(e);
            if let LinkEvent::Part(p) = e {
                distinct.insert(p.index);
            }
            if !out.delivered.is_empty() {
                assert_eq!(distinct.len(), 5, "decoded at 2f+1 distinct parts");
            }
            delivered.extend(out.delivered);
        }
        assert_eq!(delivered, vec![msg.clone()]);
    }
}

#[test]
fn hub_immediate_sends_every_part_at_once_and_parts_are_smaller_than_on_the_erasure_link() {
    let h = Hubs::new(4);
    let (s, r) = (SiteId(2), SiteId(3));
    let msg = h.signed(s, 7, body(3000));
    let mut immediate = h.links(
        s,
        HubConfig {
            immediate: true,
            timeout_ms: 25,
        },
    );
    let mut hub_bytes = 0;
    for l in immediate.iter_mut() {
        let frames = l.send(&msg, r);
        assert_eq!(frames.len(), 1);
        hub_bytes += frames[0].frame.len();
    }
    let mut peer = Erasure::new(
        h.shape,
        s,
        Server(0),
        h.site_keys.clone(),
        h.server_keys.clone(),
        h.keys.2[2][0].clone(),
        FRAME_MAX,
    );
    let ec_part = peer.send(&msg, r).remove(0).frame.len();
    // (3f+1)/(2f+1) = 4/3 of the message in all on the hub, against 4/2 peer to peer.
    assert!(
        hub_bytes < 4 * ec_part * 3 / 4,
        "{hub_bytes} vs 4 x {ec_part}"
    );
    assert!(hub_bytes > msg.encode().len());
}

#[test]
fn through_forwarders_one_copy_crosses_and_f_plus_one_servers_introduce_it() {
    let h = Hubs::new(7); // f = 2
    let (s, r) = (SiteId(1), SiteId(2));
    let msg = h.signed(s, 12, body(300));
    let links = |site| -> Vec<Df> {
        h.shape
            .server_ids()
            .map(|i| Df::new(h.shape, site, i, h.site_keys.clone(), FRAME_MAX))
            .collect()
    };
    let mut senders = links(s);
    let mut fwd = Forwarder::new(h.shape, s, ForwarderConfig::for_shape(&h.shape)).unwrap();
    let mut crossed = Vec::new();
    for (i, l) in senders.iter_mut().enumerate() {
        let frames = l.send(&msg, r);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].to_server, FORWARDER);
        let (header, whole) = df::unframe(&frames[0].frame).unwrap();
        // Two faulty servers hand over a forged copy first: not enough to send.
        if i < 2 {
            let mut junk = whole.clone();
            *junk.last_mut().unwrap() ^= 1;
            assert_eq!(
                fwd.from_server(Server(i as u16 + 5), header, &junk),
                Take::Now(vec![])
            );
        }
        if let Take::Now(out) = fwd.from_server(Server(i as u16), header, &whole) {
            crossed.extend(out);
        }
    }
    assert_eq!(crossed.len(), 1, "one copy, at the third matching one");
    assert_eq!(crossed[0].0, r);
    let mut receivers = links(r);
    let mut introduced = Vec::new();
    for (i, l) in receivers.iter_mut().enumerate() {
        assert!(
            l.receive(s, Server(3), &crossed[0].1).is_err(),
            "only the forwarder hands messages to servers"
        );
        if let Some(e) = l.receive(s, FORWARDER, &crossed[0].1).unwrap() {
            introduced.push((i, e));
        }
    }
    assert_eq!(introduced.len(), 3, "f+1 introducers");
    for l in receivers.iter_mut() {
        let delivered: Vec<_> = introduced
            .iter()
            .flat_map(|(_, e)| l.executed(e).delivered)
            .collect();
        assert_eq!(delivered, vec![msg.clone()], "once, at every server");
    }
}

#[test]
fn a_server_flooding_lone_parts_crowds_out_only_itself() {
    let h = Hubs::new(4); // f = 1: 2 parts decode, a quota of 256 waiting parts per server
    let (s, r) = (SiteId(0), SiteId(1));
    let msg = h.signed(s, 5_000, body(100));
    let mut senders: Vec<Erasure> = h
        .shape
        .server_ids()
        .map(|i| {
            Erasure::new(
                h.shape,
                s,
                i,
                h.site_keys.clone(),
                h.server_keys.clone(),
                h.keys.2[0][i.0 as usize].clone(),
                FRAME_MAX,
            )
        })
        .collect();
    let part_of = |l: &mut Erasure| match LinkEvent::decode(&l.send(&msg, r)[0].frame, FRAME_MAX) {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    };
    let first = part_of(&mut senders[0]);
    let second = part_of(&mut senders[1]);
    let mut receiver = Erasure::new(
        h.shape,
        r,
        Server(0),
        h.site_keys.clone(),
        h.server_keys.clone(),
        h.keys.2[1][0].clone(),
        FRAME_MAX,
    );
    assert!(receiver.executed(&first).delivered.is_empty());
    // Faulty server 3 of s: 2,000 validly signed lone parts of numbers far ahead.
    let faulty = &h.keys.2[0][3];
    for seq in 10_000..12_000u64 {
        let mut p = redoubt_sites::link::Part {
            site: s,
            to: r,
            seq,
            index: Server(3),
            len: 2,
            shard: vec![7],
            sig: Default::default(),
        };
        p.sig = faulty.sign(&p.statement());
        let out = receiver.executed(&LinkEvent::Part(p));
        assert!(out.refused.is_none());
    }
    assert!(receiver.stats().collecting_dropped >= 2000 - 256);
    assert_eq!(receiver.executed(&second).delivered, vec![msg.clone()]);
}

/// Records the messages the logical machine hands it.
#[derive(Default)]
struct Heard(Vec<(SiteId, Vec<u8>)>);

impl redoubt_sites::machine::Participant for Heard {
    fn on_message(&mut self, _: u64, site: SiteId, body: &[u8]) -> Vec<GlobalOut> {
        self.0.push((site, body.to_vec()));
        Vec::new()
    }
    fn on_tick(&mut self, _: u64) -> Vec<GlobalOut> {
        Vec::new()
    }
    fn on_update(&mut self, _: u64, _: u64, _: &[u8]) -> Vec<GlobalOut> {
        Vec::new()
    }
}

#[test]
fn a_message_signed_for_one_site_is_refused_by_another() {
    let h = Hubs::new(4);
    let (s, r, other) = (SiteId(0), SiteId(1), SiteId(2));
    let for_other = h.signed_for(s, 7, body(40), Some(other));
    let for_r = h.signed_for(s, 8, body(41), Some(r));
    let link = Naive::new(h.shape, r, Server(0), h.site_keys.clone(), FRAME_MAX);
    let mut machine = LogicalMachine::new(h.shape, r, Heard::default(), link);
    for (msg, handed) in [(for_other, false), (for_r, true)] {
        // A faulty server of the sending site hands the message to the wrong site: it
        // verifies (the site signed it), and the logical machine still drops it.
        assert!(h.site_keys.check(&msg).is_ok());
        let event = Event::Link(LinkEvent::Message(msg)).encode();
        let step = machine.execute(&event, Submitter::Server(Server(1)), 0);
        assert!(step.refused.is_none());
        assert_eq!(machine.participant().0.len(), handed as usize);
    }
    // Changing the address breaks the signature.
    let mut moved = h.signed_for(s, 9, body(42), Some(other));
    moved.to = Some(r);
    assert!(h.site_keys.check(&moved).is_err());
}
