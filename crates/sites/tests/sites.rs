//! The site pieces together, with faulty servers: threshold signing with a server that sends
//! bad shares, and both links carrying signed messages between sites while faulty servers drop,
//! corrupt and forge. Local ordering is modelled as one list of events every server of the
//! receiving site executes in the same order (what local Prime gives them).

use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::threshold::{deal, GroupKey, KeyShare, ThresholdSig};
use redoubt_sites::link::erasure::{bad_parts, ServerKeys};
use redoubt_sites::link::{
    Control, Emit, Erasure, Executed, LinkEvent, LogicalLink, Misbehaviour, Naive, Payload, Wan,
};
use redoubt_sites::message::{Bundle, Refused, SignedMessage, SiteKeys};
use redoubt_sites::sign::{Share, Signing, SiteSigner};
use redoubt_sites::{Server, Shape, SiteId};

const FRAME_MAX: usize = 1 << 20;

struct World {
    shape: Shape,
    groups: Vec<GroupKey>,
    shares: Vec<Vec<KeyShare>>,
    secrets: Vec<Vec<HolderSecrets>>,
}

impl World {
    fn new(sites: usize, servers: usize) -> World {
        let shape = Shape::new(sites, servers).unwrap();
        let (groups, shares) = (0..sites)
            .map(|s| deal(shape.f(), servers, [s as u8 + 1; 32]))
            .unzip();
        let secrets = (0..sites)
            .map(|s| {
                (0..servers)
                    .map(|i| {
                        HolderSecrets::from_seed(
                            &[s as u8, i as u8, 9, 9].repeat(8).try_into().unwrap(),
                        )
                    })
                    .collect()
            })
            .collect();
        World {
            shape,
            groups,
            shares,
            secrets,
        }
    }
    fn site_keys(&self) -> SiteKeys {
        SiteKeys::new(self.groups.clone())
    }
    fn server_keys(&self) -> ServerKeys {
        ServerKeys::new(
            self.secrets
                .iter()
                .map(|site| site.iter().map(|s| s.public().verify).collect())
                .collect(),
        )
    }
    fn signers(&self, site: usize) -> Vec<SiteSigner> {
        self.shares[site]
            .iter()
            .map(|k| {
                SiteSigner::new(
                    SiteId(site as u16),
                    self.shape.servers(),
                    self.groups[site].clone(),
                    k.clone(),
                )
            })
            .collect()
    }
    /// A bundle signed by its site (every server's share, combined).
    fn signed(&self, site: usize, first_seq: u64, bodies: Vec<Vec<u8>>) -> Vec<SignedMessage> {
        let bundle = Bundle::new(SiteId(site as u16), first_seq, bodies);
        let mut signers = self.signers(site);
        let mut shares = Vec::new();
        for s in signers.iter_mut() {
            for o in s.local(bundle.root()) {
                if let Signing::Share(sh) = o {
                    shares.push(sh);
                }
            }
        }
        for sh in shares {
            if sh.signer != Server(0) {
                for o in signers[0].on_share(sh.signer, sh).unwrap() {
                    if let Signing::Signed { sig, .. } = o {
                        return bundle.signed(sig);
                    }
                }
            }
        }
        panic!("no signature");
    }
}

/// Runs every server's share of a bundle past every other server, in order of the senders'
/// indices, with server `bad`'s shares replaced by garbage that is still a curve point.
fn sign_with_a_bad_server(w: &World, bad: usize) -> (Vec<SiteSigner>, Vec<Vec<Signing>>) {
    let bundle = Bundle::new(
        SiteId(0),
        10,
        vec![b"pre-prepare".to_vec(), b"po-ack".to_vec()],
    );
    let mut signers = w.signers(0);
    let mut outs: Vec<Vec<Signing>> = vec![Vec::new(); signers.len()];
    let mut shares: Vec<Share> = Vec::new();
    for (i, s) in signers.iter_mut().enumerate() {
        for o in s.local(bundle.root()) {
            match o {
                Signing::Share(mut sh) => {
                    if i == bad {
                        // A valid share of another message: well formed, wrong.
                        sh.share = w.shares[0][bad].sign(b"something else");
                    }
                    shares.push(sh);
                }
                other => outs[i].push(other),
            }
        }
    }
    // The bad server's share arrives first everywhere, so it goes into the first combination.
    shares.sort_by_key(|sh| sh.signer != Server(bad as u16));
    for sh in &shares {
        for (i, s) in signers.iter_mut().enumerate() {
            if sh.signer.0 as usize != i {
                outs[i].extend(s.on_share(sh.signer, sh.clone()).unwrap_or_default());
            }
        }
    }
    (signers, outs)
}

#[test]
fn a_site_signs_its_bundle_once_and_blacklists_a_server_whose_share_is_bad() {
    let w = World::new(4, 4);
    let (signers, outs) = sign_with_a_bad_server(&w, 3);
    let mut sigs: Vec<ThresholdSig> = Vec::new();
    for (i, out) in outs.iter().enumerate().take(3) {
        let signed: Vec<_> = out
            .iter()
            .filter_map(|o| match o {
                Signing::Signed { sig, .. } => Some(*sig),
                _ => None,
            })
            .collect();
        assert_eq!(signed.len(), 1, "server {i} signs the bundle exactly once");
        sigs.push(signed[0]);
        let proofs: Vec<_> = out
            .iter()
            .filter_map(|o| match o {
                Signing::Blacklisted(p) => Some(p.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(proofs.len(), 1, "server {i} blacklists the bad server");
        assert_eq!(proofs[0].server, Server(3));
        assert!(
            proofs[0].holds(&w.groups[0]),
            "the proof convinces a third party"
        );
        assert!(signers[i].blacklist().contains_key(&Server(3)));
    }
    // Whichever shares were combined, the site's signature is one value.
    assert!(sigs.windows(2).all(|p| p[0] == p[1]));
    // The blacklisted server's later shares are refused.
    let mut signers = signers;
    // A junk share in another server's name is refused, whoever sends it.
    let junk = Share {
        site: SiteId(0),
        signer: Server(1),
        root: redoubt_crypto::Digest::of(b"any"),
        share: sigs[0],
    };
    assert_eq!(
        signers[0].on_share(Server(3), junk),
        Err(redoubt_sites::sign::ShareRefused::NotTheSender)
    );
    let refused = signers[0].on_share(
        Server(3),
        Share {
            site: SiteId(0),
            signer: Server(3),
            root: redoubt_crypto::Digest::of(b"any"),
            share: sigs[0],
        },
    );
    assert!(refused.is_err());
}

#[test]
fn a_proof_against_a_correct_server_does_not_hold() {
    let w = World::new(4, 4);
    let (signers, _) = sign_with_a_bad_server(&w, 3);
    let mut proof = signers[0].blacklist()[&Server(3)].clone();
    // The same root with server 3's real share: not a proof of anything.
    proof.share = w.shares[0][3].sign(&redoubt_sites::message::statement(SiteId(0), &proof.root));
    assert!(!proof.holds(&w.groups[0]));
}

#[test]
fn signed_messages_check_and_tampered_ones_do_not() {
    let w = World::new(4, 4);
    let keys = w.site_keys();
    let msgs = w.signed(2, 40, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    for m in &msgs {
        assert_eq!(keys.check(m), Ok(()));
    }
    let mut body = msgs[1].clone();
    body.body = b"z".to_vec();
    assert_eq!(keys.check(&body), Err(Refused::BadSignature(SiteId(2))));
    let mut seq = msgs[1].clone();
    seq.seq = 99;
    assert!(keys.check(&seq).is_err());
    let mut site = msgs[1].clone();
    site.site = SiteId(1); // another site's key does not check it
    assert!(keys.check(&site).is_err());
    let mut path = msgs[1].clone();
    path.path.siblings.clear();
    assert_eq!(keys.check(&path), Err(Refused::BadPath));
}

/// Every server of the receiving site executes `order` (the same list everywhere) on its link;
/// returns, per server, the messages delivered, in order.
fn execute_everywhere<L: LogicalLink>(
    links: &mut [L],
    order: &[LinkEvent],
) -> Vec<Vec<SignedMessage>> {
    links
        .iter_mut()
        .map(|l| order.iter().flat_map(|e| l.executed(e).delivered).collect())
        .collect()
}

#[test]
fn the_naive_link_delivers_once_despite_f_dropping_senders_and_a_forging_receiver() {
    let w = World::new(4, 4);
    let (s, r) = (SiteId(0), SiteId(1));
    let msgs = w.signed(0, 7, vec![b"global prime".to_vec()]);
    let mut senders: Vec<Naive> = w
        .shape
        .server_ids()
        .map(|i| Naive::new(w.shape, s, i, w.site_keys(), FRAME_MAX))
        .collect();
    let mut receivers: Vec<Naive> = w
        .shape
        .server_ids()
        .map(|i| Naive::new(w.shape, r, i, w.site_keys(), FRAME_MAX))
        .collect();
    let carriers: Vec<Server> = Naive::carriers(&w.shape, 7).collect();
    assert_eq!(carriers.len(), 2);
    let mut wan: Vec<(Server, Wan)> = Vec::new();
    for (i, l) in senders.iter_mut().enumerate() {
        let frames = l.send(&msgs[0], r);
        assert_eq!(
            frames.len(),
            if carriers.contains(&Server(i as u16)) {
                2
            } else {
                0
            }
        );
        wan.extend(frames.into_iter().map(|f| (Server(i as u16), f)));
    }
    // The first carrier is faulty and sends nothing; the other's frames arrive.
    let mut order: Vec<LinkEvent> = Vec::new();
    for (from, f) in wan.iter().filter(|(from, _)| *from != carriers[0]) {
        let rcv = &mut receivers[f.to_server.0 as usize];
        if let Some(e) = rcv.receive(s, *from, &f.frame).unwrap() {
            order.push(e);
        }
    }
    assert!(!order.is_empty());
    // A faulty receiver introduces a forgery, and a replay of the real message.
    let mut forged = msgs[0].clone();
    forged.body = b"forged".to_vec();
    order.insert(0, LinkEvent::Message(forged.clone()));
    order.push(LinkEvent::Message(msgs[0].clone()));
    assert!(matches!(
        receivers[0].receive(s, Server(0), &LinkEvent::Message(forged).encode()),
        Err(Refused::BadSignature(_))
    ));
    for delivered in execute_everywhere(&mut receivers, &order) {
        assert_eq!(
            delivered,
            vec![msgs[0].clone()],
            "once, and only the real one"
        );
    }
}

fn erasure_links(w: &World, site: SiteId) -> Vec<Erasure> {
    w.shape
        .server_ids()
        .map(|i| {
            Erasure::new(
                w.shape,
                site,
                i,
                w.site_keys(),
                w.server_keys(),
                w.secrets[site.0 as usize][i.0 as usize].clone(),
                FRAME_MAX,
            )
        })
        .collect()
}

/// Each server of `s` sends its part of `msg` to `r`; `corrupt` servers flip a byte of their
/// part (and sign it); `silent` ones send nothing. Returns the parts as `r`'s peers introduce
/// them.
fn parts_arriving(
    w: &World,
    msg: &SignedMessage,
    s: SiteId,
    r: SiteId,
    corrupt: &[u16],
    silent: &[u16],
) -> Vec<LinkEvent> {
    let mut senders = erasure_links(w, s);
    let mut receivers = erasure_links(w, r);
    let mut arrived = Vec::new();
    for (i, l) in senders.iter_mut().enumerate() {
        let i = i as u16;
        if silent.contains(&i) {
            continue;
        }
        let frames = l.send(msg, r);
        assert_eq!(frames.len(), 1);
        let mut frame = frames[0].clone();
        assert_eq!(frame.to_server, Server(i), "part i goes to peer i");
        if corrupt.contains(&i) {
            let LinkEvent::Part(mut p) = LinkEvent::decode(&frame.frame, FRAME_MAX).unwrap() else {
                unreachable!()
            };
            p.shard[0] ^= 0xff;
            // Re-signed by the faulty server: individually its part looks fine.
            let signer = &w.secrets[s.0 as usize][i as usize];
            let mut unsigned = p.clone();
            unsigned.sig = Default::default();
            p.sig = signer.sign(&unsigned.statement());
            frame.frame = LinkEvent::Part(p).encode();
        }
        let e = receivers[i as usize]
            .receive(s, Server(i), &frame.frame)
            .unwrap()
            .expect("introduced");
        arrived.push(e);
    }
    arrived
}

#[test]
fn the_erasure_link_decodes_after_f_plus_one_executed_parts_despite_f_silent_senders() {
    let w = World::new(4, 7); // f = 2
    let (s, r) = (SiteId(3), SiteId(0));
    let msgs = w.signed(3, 100, vec![vec![7u8; 900]]);
    let order = parts_arriving(&w, &msgs[0], s, r, &[], &[1, 5]);
    assert_eq!(order.len(), 5);
    let mut receivers = erasure_links(&w, r);
    for (i, delivered) in execute_everywhere(&mut receivers, &order)
        .into_iter()
        .enumerate()
    {
        assert_eq!(delivered, vec![msgs[0].clone()], "server {i}");
    }
    // Delivered at the third executed part, the same point everywhere.
    let mut fresh = erasure_links(&w, r);
    for l in fresh.iter_mut() {
        assert!(l.executed(&order[0]).delivered.is_empty());
        assert!(l.executed(&order[1]).delivered.is_empty());
        assert_eq!(l.executed(&order[2]).delivered.len(), 1);
        assert!(l.executed(&order[3]).delivered.is_empty());
    }
}

#[test]
fn a_bad_part_fails_the_same_decoding_everywhere_and_names_its_server() {
    let w = World::new(4, 7);
    let (s, r) = (SiteId(1), SiteId(2));
    let msgs = w.signed(1, 5, vec![b"summary matrix".repeat(20)]);
    let mut order = parts_arriving(&w, &msgs[0], s, r, &[4], &[]);
    // Local ordering put the bad part among the first f+1.
    let bad = order
        .iter()
        .position(|e| matches!(e, LinkEvent::Part(p) if p.index == Server(4)))
        .unwrap();
    let moved = order.remove(bad);
    order.insert(1, moved);
    let mut receivers = erasure_links(&w, r);
    let mut failures = Vec::new();
    for l in receivers.iter_mut() {
        let mut failed = Vec::new();
        for e in &order {
            let out = l.executed(e);
            assert!(
                out.delivered.is_empty(),
                "nothing delivered from a suspended site"
            );
            failed.extend(out.failed);
        }
        assert_eq!(failed.len(), 1);
        assert!(l.suspended(s).is_some());
        failures.push(failed.remove(0));
    }
    assert!(
        failures.windows(2).all(|p| p[0] == p[1]),
        "the same decoding failed everywhere"
    );
    let indices: Vec<Server> = failures[0].parts.iter().map(|p| p.index).collect();
    assert_eq!(indices.len(), 3);
    assert!(indices.contains(&Server(4)));
    // Knowing the message, the parts that were not its parts are named.
    assert_eq!(
        bad_parts(&w.shape, 3, &failures[0], &msgs[0])
            .into_iter()
            .collect::<Vec<_>>(),
        vec![Server(4)]
    );
}

#[test]
fn parts_off_their_virtual_link_or_unsigned_are_refused() {
    let w = World::new(4, 4);
    let (s, r) = (SiteId(0), SiteId(1));
    let msgs = w.signed(0, 1, vec![b"m".to_vec()]);
    let mut sender = erasure_links(&w, s).remove(2);
    let frame = sender.send(&msgs[0], r).remove(0).frame;
    let mut receivers = erasure_links(&w, r);
    assert!(
        receivers[1].receive(s, Server(2), &frame).is_err(),
        "to the wrong peer"
    );
    assert!(
        receivers[2].receive(s, Server(3), &frame).is_err(),
        "from the wrong server"
    );
    assert!(
        receivers[2].receive(SiteId(2), Server(2), &frame).is_err(),
        "from the wrong site"
    );
    let LinkEvent::Part(mut p) = LinkEvent::decode(&frame, FRAME_MAX).unwrap() else {
        unreachable!()
    };
    p.seq += 1; // no longer what server 2 signed
    let e = LinkEvent::Part(p);
    assert!(receivers[2].receive(s, Server(2), &e.encode()).is_err());
    // A faulty peer introduces it anyway: refused at execution by every server.
    for l in receivers.iter_mut() {
        assert!(l.executed(&e).refused.is_some());
    }
    assert!(receivers[2]
        .receive(s, Server(2), &frame)
        .unwrap()
        .is_some());
}

// ---- Figure 3: blacklisting on the erasure-coded link ----

fn global(body: &[u8]) -> Vec<u8> {
    Payload::Global(body.to_vec()).encode()
}

/// Site `from`'s logical machine signs `emit` as message `seq` and its servers send it to
/// `emit.to`, peer to peer; returns the events the receiving peers introduce.
fn carry_control(
    w: &World,
    senders: &mut [Erasure],
    receivers: &mut [Erasure],
    from: SiteId,
    seq: u64,
    emit: &Emit,
) -> Vec<LinkEvent> {
    let msg = w
        .signed(
            from.0 as usize,
            seq,
            vec![Payload::Control(emit.control.clone()).encode()],
        )
        .remove(0);
    let mut events = Vec::new();
    for (i, l) in senders.iter_mut().enumerate() {
        for frame in l.send(&msg, emit.to) {
            assert_eq!(frame.to_server, Server(i as u16), "peer to peer");
            let e = receivers[i]
                .receive(from, Server(i as u16), &frame.frame)
                .unwrap()
                .expect("introduced");
            events.push(e);
        }
    }
    events
}

/// Every link executes `events` in order; returns what each gave, concatenated.
fn execute_all(links: &mut [Erasure], events: &[LinkEvent]) -> Vec<Executed> {
    links
        .iter_mut()
        .map(|l| {
            let mut all = Executed::default();
            for e in events {
                let out = l.executed(e);
                assert_eq!(out.blocked_on, None);
                all.delivered.extend(out.delivered);
                all.failed.extend(out.failed);
                all.emit.extend(out.emit);
                all.misbehaviour.extend(out.misbehaviour);
            }
            all
        })
        .collect()
}

/// S sends `msg` with `corrupt` servers' parts bad (bad parts ordered first at R), returns
/// the links of both sites after R executed the parts and the INQUIRY R emitted.
fn failed_at_r(
    w: &World,
    s: SiteId,
    r: SiteId,
    msg: &SignedMessage,
    corrupt: &[u16],
    s_links: &mut [Erasure],
    r_links: &mut [Erasure],
) -> Emit {
    for l in s_links.iter_mut() {
        l.send(msg, r); // retained at S
    }
    let mut order = parts_arriving(w, msg, s, r, corrupt, &[]);
    order.sort_by_key(|e| match e {
        LinkEvent::Part(p) => !corrupt.contains(&p.index.0),
        _ => true,
    });
    let outs = execute_all(r_links, &order);
    let emit = outs[0].emit[0].clone();
    for o in &outs {
        assert!(o.delivered.is_empty());
        assert_eq!(
            o.emit,
            vec![emit.clone()],
            "every server of R asks the same"
        );
    }
    emit
}

#[test]
fn an_inquiry_blacklists_the_server_that_sent_a_bad_part_at_both_sites_and_recovers_the_message() {
    let w = World::new(4, 4); // f = 1
    let (s, r) = (SiteId(0), SiteId(1));
    let msg = w.signed(0, 3, vec![global(b"po-summary")]).remove(0);
    let (mut s_links, mut r_links) = (erasure_links(&w, s), erasure_links(&w, r));
    let inquiry = failed_at_r(&w, s, r, &msg, &[2], &mut s_links, &mut r_links);
    assert!(matches!(&inquiry.control, Control::Inquiry(i) if i.erasure_seq == 3 && i.seq == 0));
    assert!(r_links.iter().all(|l| l.suspended(s).is_some()));
    // S executes the INQUIRY: server 2 is proven faulty there, and S answers.
    let events = carry_control(&w, &mut r_links, &mut s_links, r, 50, &inquiry);
    let outs = execute_all(&mut s_links, &events);
    let response = outs[0].emit[0].clone();
    for o in &outs {
        assert_eq!(o.emit, vec![response.clone()]);
        assert!(
            matches!(&o.misbehaviour[..], [Misbehaviour::BadParts { site, servers, .. }]
            if *site == s && servers.iter().copied().collect::<Vec<_>>() == vec![Server(2)])
        );
    }
    assert!(s_links
        .iter()
        .all(|l| l.inquiries().server_blacklisted(s, Server(2))));
    // R executes the INQUIRY-RESPONSE: it blacklists server 2 of S, gets the message, resumes.
    let events = carry_control(&w, &mut s_links, &mut r_links, s, 60, &response);
    for o in execute_all(&mut r_links, &events) {
        assert_eq!(o.delivered, vec![msg.clone()]);
    }
    for l in &r_links {
        assert!(l.suspended(s).is_none());
        assert!(l.inquiries().server_blacklisted(s, Server(2)));
        assert!(!l.inquiries().site_blacklisted(s));
    }
    // Server 2 keeps sending bad parts: they are set aside, and the next message decodes
    // from the others without another inquiry.
    let next = w.signed(0, 4, vec![global(b"next")]).remove(0);
    let mut order = parts_arriving(&w, &next, s, r, &[2], &[]);
    order.sort_by_key(|e| !matches!(e, LinkEvent::Part(p) if p.index == Server(2)));
    for o in execute_all(&mut r_links, &order) {
        assert_eq!(o.delivered, vec![next.clone()]);
        assert!(o.emit.is_empty());
    }
}

#[test]
fn a_lost_inquiry_and_a_lost_answer_are_sent_again_until_the_site_resumes() {
    let w = World::new(4, 4);
    let (s, r) = (SiteId(0), SiteId(1));
    let msg = w.signed(0, 3, vec![global(b"po-summary")]).remove(0);
    let (mut s_links, mut r_links) = (erasure_links(&w, s), erasure_links(&w, r));
    for l in s_links.iter_mut().chain(r_links.iter_mut()) {
        l.timer(10_000);
    }
    let inquiry = failed_at_r(&w, s, r, &msg, &[2], &mut s_links, &mut r_links);
    // Every copy of the INQUIRY is lost; a second later each server of R sends it again.
    let signed = w
        .signed(
            1,
            50,
            vec![Payload::Control(inquiry.control.clone()).encode()],
        )
        .remove(0);
    let lost: Vec<Wan> = r_links
        .iter_mut()
        .flat_map(|l| l.send(&signed, s))
        .collect();
    assert!(r_links.iter_mut().all(|l| l.timer(10_500).wan.is_empty()));
    let again: Vec<Wan> = r_links
        .iter_mut()
        .flat_map(|l| l.timer(11_000).wan)
        .collect();
    assert_eq!(again, lost);
    // S executes it and answers; every copy of the answer is lost too.
    let events: Vec<LinkEvent> = again
        .iter()
        .enumerate()
        .map(|(i, f)| {
            s_links[i]
                .receive(r, Server(i as u16), &f.frame)
                .unwrap()
                .unwrap()
        })
        .collect();
    let response = execute_all(&mut s_links, &events)[0].emit[0].clone();
    let answer = w
        .signed(
            0,
            60,
            vec![Payload::Control(response.control.clone()).encode()],
        )
        .remove(0);
    let lost: Vec<Wan> = s_links
        .iter_mut()
        .flat_map(|l| l.send(&answer, r))
        .collect();
    for l in s_links.iter_mut() {
        l.timer(12_000);
    }
    // R, still suspended, asks again; S, having executed that INQUIRY, answers again.
    let again: Vec<Wan> = r_links
        .iter_mut()
        .flat_map(|l| l.timer(12_000).wan)
        .collect();
    for (i, f) in again.iter().enumerate() {
        assert!(s_links[i]
            .receive(r, Server(i as u16), &f.frame)
            .unwrap()
            .is_none());
    }
    let answered: Vec<Wan> = s_links
        .iter_mut()
        .flat_map(|l| l.timer(12_001).wan)
        .collect();
    assert_eq!(answered, lost);
    let events: Vec<LinkEvent> = answered
        .iter()
        .enumerate()
        .map(|(i, f)| {
            r_links[i]
                .receive(s, Server(i as u16), &f.frame)
                .unwrap()
                .unwrap()
        })
        .collect();
    for o in execute_all(&mut r_links, &events) {
        assert_eq!(o.delivered, vec![msg.clone()]);
    }
    // Answered: nothing goes again.
    assert!(r_links.iter_mut().all(|l| l.timer(20_000).wan.is_empty()));
}

#[test]
fn a_spurious_or_repeated_inquiry_blacklists_the_site_that_sent_it() {
    let w = World::new(4, 4);
    let (s, r) = (SiteId(0), SiteId(1));
    let msg = w.signed(0, 3, vec![global(b"po-summary")]).remove(0);
    // Spurious: every part was correct.
    let (mut s_links, mut r_links) = (erasure_links(&w, s), erasure_links(&w, r));
    let real = failed_at_r(&w, s, r, &msg, &[2], &mut s_links, &mut r_links);
    let Control::Inquiry(mut inq) = real.control.clone() else {
        unreachable!()
    };
    let good = parts_arriving(&w, &msg, s, r, &[], &[]);
    inq.parts = good
        .iter()
        .take(2)
        .map(|e| match e {
            LinkEvent::Part(p) => p.clone(),
            _ => unreachable!(),
        })
        .collect();
    let spurious = Emit {
        to: s,
        control: Control::Inquiry(inq),
    };
    let events = carry_control(&w, &mut r_links, &mut s_links, r, 50, &spurious);
    for o in execute_all(&mut s_links, &events) {
        assert!(o.emit.is_empty(), "no answer to a spurious inquiry");
        assert!(
            matches!(&o.misbehaviour[..], [Misbehaviour::SpuriousInquiry { site, .. }] if *site == r)
        );
    }
    assert!(s_links.iter().all(|l| l.inquiries().site_blacklisted(r)));

    // Repeated: R asks again about a server S already found (a faulty R, or one replaying).
    let (mut s_links, mut r_links) = (erasure_links(&w, s), erasure_links(&w, r));
    let first = failed_at_r(&w, s, r, &msg, &[2], &mut s_links, &mut r_links);
    let events = carry_control(&w, &mut r_links, &mut s_links, r, 50, &first);
    execute_all(&mut s_links, &events);
    let Control::Inquiry(mut again) = first.control.clone() else {
        unreachable!()
    };
    again.seq = 1;
    let again = Emit {
        to: s,
        control: Control::Inquiry(again),
    };
    let events = carry_control(&w, &mut r_links, &mut s_links, r, 51, &again);
    for o in execute_all(&mut s_links, &events) {
        assert!(o.emit.is_empty());
        assert!(
            matches!(&o.misbehaviour[..], [Misbehaviour::SpuriousInquiry { why, .. }] if why.contains("already"))
        );
    }
}

#[test]
fn a_site_that_encoded_a_badly_signed_message_is_blacklisted_by_its_own_answer() {
    let w = World::new(4, 4);
    let (s, r) = (SiteId(0), SiteId(1));
    // Every server of S is faulty: they encode a message whose signature is not the site's.
    let mut bad = w.signed(0, 9, vec![global(b"matrix")]).remove(0);
    bad.body = global(b"another matrix");
    let (mut s_links, mut r_links) = (erasure_links(&w, s), erasure_links(&w, r));
    let inquiry = failed_at_r(&w, s, r, &bad, &[], &mut s_links, &mut r_links);
    // S answers with the message it encoded (a faulty site can sign anything).
    let Control::Inquiry(inq) = inquiry.control else {
        unreachable!()
    };
    let response = Emit {
        to: r,
        control: Control::Response(redoubt_sites::link::inquiry::Response {
            seq: inq.seq,
            erasure_seq: 9,
            message: bad.clone(),
            from: s,
            to: r,
        }),
    };
    let events = carry_control(&w, &mut s_links, &mut r_links, s, 70, &response);
    for o in execute_all(&mut r_links, &events) {
        assert!(o.delivered.is_empty());
        assert!(
            matches!(&o.misbehaviour[..], [Misbehaviour::BadEncoding { site, .. }] if *site == s)
        );
    }
    assert!(r_links.iter().all(|l| l.inquiries().site_blacklisted(s)));
}

#[test]
fn more_than_f_faulty_servers_blacklist_their_site() {
    let w = World::new(4, 4); // f = 1: two faulty servers are too many
    let (s, r) = (SiteId(0), SiteId(1));
    let (mut s_links, mut r_links) = (erasure_links(&w, s), erasure_links(&w, r));
    for (round, bad_server) in [(0u64, 1u16), (1, 3)] {
        let msg = w.signed(0, 10 + round, vec![global(b"x")]).remove(0);
        let inquiry = failed_at_r(&w, s, r, &msg, &[bad_server], &mut s_links, &mut r_links);
        let events = carry_control(&w, &mut r_links, &mut s_links, r, 50 + round, &inquiry);
        let response = execute_all(&mut s_links, &events)[0].emit[0].clone();
        let events = carry_control(&w, &mut s_links, &mut r_links, s, 60 + round, &response);
        let outs = execute_all(&mut r_links, &events);
        if round == 1 {
            for o in outs {
                assert!(o
                    .misbehaviour
                    .iter()
                    .any(|m| matches!(m, Misbehaviour::TooManyFaultyServers { servers: 2, .. })));
            }
        }
    }
    assert!(r_links.iter().all(|l| l.inquiries().site_blacklisted(s)));
}
