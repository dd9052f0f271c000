//! Tests of pre-ordering (a child module of `preorder`).

use super::*;
use crate::message::Request;
use redoubt_crypto::pk::Signature;

fn cfg() -> PreOrderConfig {
    PreOrderConfig {
        n: 4,
        f: 1,
        window: 4,
    }
}

fn client_request(c: u64, op: &[u8]) -> SignedRequest {
    SignedRequest {
        request: Request {
            client: c,
            timestamp: 1,
            read_only: false,
            op: bytes::Bytes::copy_from_slice(op),
        },
        auth: Arc::from(Vec::new()),
        sig: None,
    }
}

fn po(originator: ReplicaId, seq: Seq, op: &[u8]) -> Arc<PoRequest> {
    Arc::new(PoRequest {
        originator,
        seq,
        requests: vec![client_request(7, op)],
    })
}

fn sign(row: PoAru) -> SignedPoAru {
    SignedPoAru {
        row,
        sig: Signature::default(),
    }
}

/// Four stores exchanging everything: replica 0 introduces one request.
fn four() -> Vec<PreOrder> {
    (0..4).map(|i| PreOrder::new(cfg(), i)).collect()
}

fn exchange_acks(stores: &mut [PreOrder]) {
    let acks: Vec<(ReplicaId, Vec<AckPart>)> = stores
        .iter_mut()
        .enumerate()
        .map(|(j, s)| (j as ReplicaId, s.take_acks()))
        .collect();
    for (j, parts) in &acks {
        for (k, s) in stores.iter_mut().enumerate() {
            if k as ReplicaId != *j {
                s.receive_acks(*j, parts);
            }
        }
    }
}

#[test]
fn a_request_is_certified_by_2f_plus_1_acknowledgements_and_reported_in_a_row() {
    let mut s = four();
    let r = s[0].introduce(vec![client_request(7, b"x")]).expect("room");
    for store in &mut s[1..] {
        assert_eq!(store.receive_request(r.clone()), Ok(true));
    }
    // Our own acknowledgement and one other are not enough.
    let mine = s[0].take_acks();
    assert_eq!(mine.len(), 1);
    let theirs = s[1].take_acks();
    s[0].receive_acks(1, &theirs);
    assert_eq!(s[0].cum_aru(), &[0, 0, 0, 0]);
    assert_eq!(s[0].new_row(), None, "nothing certified, nothing to report");
    let third = s[2].take_acks();
    s[0].receive_acks(2, &third);
    assert_eq!(s[0].cum_aru(), &[1, 0, 0, 0]);
    let row = s[0].new_row().expect("certificates grew");
    assert_eq!((row.num, row.aru.clone()), (1, vec![1, 0, 0, 0]));
    assert_eq!(s[0].new_row(), None, "not again until they grow");
}

#[test]
fn an_equivocating_originator_gets_at_most_one_version_certified() {
    let mut s = four();
    let a = po(3, 1, b"a");
    let b = po(3, 1, b"b");
    // Replicas 0 and 1 get version a, replica 2 gets b; replica 3 (faulty) acks both.
    s[0].receive_request(a.clone()).unwrap();
    s[1].receive_request(a.clone()).unwrap();
    s[2].receive_request(b.clone()).unwrap();
    assert_eq!(
        s[0].receive_request(b.clone()),
        Err(PoError::Equivocation {
            originator: 3,
            seq: 1
        })
    );
    exchange_acks(&mut s);
    let ack_a = AckPart {
        originator: 3,
        seq: 1,
        digest: a.digest(),
    };
    let ack_b = AckPart {
        digest: b.digest(),
        ..ack_a
    };
    for store in &mut s[..3] {
        store.receive_acks(3, &[ack_a, ack_b]);
    }
    // a: replicas 0, 1 and 3 acknowledged it; b: only 2 and 3.
    assert_eq!(s[0].cum_aru()[3], 1);
    assert_eq!(s[1].cum_aru()[3], 1);
    assert_eq!(s[2].cum_aru()[3], 0, "holding the version that lost");
    assert_eq!(s[2].ready(&[(3, 1)]), Err(vec![(3, 1)]));
    // A copy of the other version does not fill the hole; with the certificate of a
    // seen, one copy of a does.
    assert!(!s[2].offer(1, b.clone(), true), "not the certified version");
    assert!(
        s[2].offer(3, a.clone(), true),
        "the digest 2f+1 acknowledged"
    );
    assert_eq!(s[2].cum_aru()[3], 1);
    assert_eq!(s[2].ready(&[(3, 1)]).map(|v| v[0].digest()), Ok(a.digest()));
}

#[test]
fn the_window_bounds_what_is_kept_and_what_we_introduce() {
    let mut s = PreOrder::new(cfg(), 0);
    for _ in 0..4 {
        assert!(s.introduce(vec![client_request(1, b"x")]).is_some());
    }
    assert!(!s.can_introduce());
    assert!(s.introduce(vec![client_request(1, b"y")]).is_none());
    assert_eq!(
        s.receive_request(po(2, 5, b"far")),
        Err(PoError::OutsideWindow {
            originator: 2,
            seq: 5
        })
    );
    assert_eq!(
        s.receive_request(po(9, 1, b"who")),
        Err(PoError::NoSuchOriginator(9))
    );
    s.receive_acks(
        1,
        &[AckPart {
            originator: 2,
            seq: 1_000,
            digest: Digest::ZERO,
        }],
    );
    assert_eq!(
        s.slots(),
        4,
        "acknowledgements beyond the window keep nothing"
    );
    s.executed_through(&[2, 0, 0, 0]);
    s.forget_through(&[2, 0, 0, 0]);
    assert_eq!(s.slots(), 2);
    assert!(s.can_introduce());
    assert_eq!(
        s.receive_request(po(0, 2, b"old")),
        Err(PoError::OutsideWindow {
            originator: 0,
            seq: 2
        })
    );
}

#[test]
fn rows_replace_older_ones_and_feed_the_summary_matrix() {
    let mut s = PreOrder::new(cfg(), 0);
    let r1 = sign(PoAru {
        replica: 2,
        inc: 0,
        num: 1,
        aru: vec![1, 0, 0, 0],
    });
    assert_eq!(s.receive_row(r1.clone()), RowOrder::Newer);
    assert_eq!(s.receive_row(r1.clone()), RowOrder::NotNewer);
    assert!(!s.would_advance(&[0, 0, 0, 0]), "one row is not 2f+1");
    for j in [1, 3] {
        s.receive_row(sign(PoAru {
            replica: j,
            inc: 0,
            num: 1,
            aru: vec![1, 0, 0, 0],
        }));
    }
    assert!(s.would_advance(&[0, 0, 0, 0]));
    assert!(!s.would_advance(&[1, 0, 0, 0]));
    assert_eq!(s.matrix().proof_aru(0, 1), 1);
    let shrink = sign(PoAru {
        replica: 2,
        inc: 0,
        num: 2,
        aru: vec![0, 1, 0, 0],
    });
    assert_eq!(s.receive_row(shrink), RowOrder::Inconsistent);
    assert_eq!(
        s.matrix().rows[2],
        Some(r1.clone()),
        "the inconsistent row is not taken"
    );
    // The row held is known by its statement and signature; any other is checked again.
    let st = r1.row.statement();
    assert!(s.holds_row(2, &st, &r1.sig));
    assert!(!s.holds_row(1, &st, &r1.sig), "another replica's place");
    assert!(
        !s.holds_row(2, &shrink_statement(), &r1.sig),
        "another statement"
    );
    let mut other = r1.sig;
    other.0[0] ^= 1;
    assert!(!s.holds_row(2, &st, &other), "another signature");
}

fn shrink_statement() -> redoubt_crypto::Digest {
    PoAru {
        replica: 2,
        inc: 0,
        num: 2,
        aru: vec![0, 1, 0, 0],
    }
    .statement()
}

#[test]
fn reconciliation_goes_from_designated_senders_to_those_not_known_to_hold_it() {
    let mut s = four();
    let r = po(0, 1, b"x");
    // Replica 3 never got it; 0, 1, 2 certify it.
    for store in &mut s[..3] {
        store.receive_request(r.clone()).unwrap();
    }
    let acks: Vec<_> = (0..3).map(|k| s[k].take_acks()).collect();
    for (k, store) in s[..3].iter_mut().enumerate() {
        for (j, parts) in acks.iter().enumerate() {
            if j != k {
                store.receive_acks(j as ReplicaId, parts);
            }
        }
    }
    let rows: Vec<SignedPoAru> = (0..3).map(|k| sign(s[k].new_row().unwrap())).collect();
    for store in &mut s {
        for row in &rows {
            store.receive_row(row.clone());
        }
    }
    let m = s[1].matrix();
    assert_eq!(m.proof_aru(0, 1), 1);
    // Designated: the first 2f+1 replicas whose row claims it: 0, 1, 2. Destination: 3
    // (the originator is skipped, and 1 and 2 are known to hold it).
    assert_eq!(s[1].reconcile(&m, 0, 1), vec![3]);
    assert_eq!(
        s[3].reconcile(&m, 0, 1),
        Vec::<ReplicaId>::new(),
        "holds nothing"
    );
    // Replica 3 fills its hole from f+1 copies.
    assert!(!s[3].offer(1, r.clone(), true));
    assert!(s[3].offer(2, r.clone(), true));
    assert!(s[3].ready(&[(0, 1)]).is_ok());
}

#[test]
fn executing_past_a_gap_counts_what_was_held_beyond_it() {
    let mut s = PreOrder::new(cfg(), 0);
    s.receive_request(po(2, 3, b"c")).unwrap();
    s.receive_request(po(2, 4, b"d")).unwrap();
    assert!(
        s.take_acks().is_empty(),
        "1 and 2 are missing: nothing contiguous"
    );
    s.executed_through(&[0, 0, 2, 0]);
    let acks = s.take_acks();
    assert_eq!(
        acks.iter()
            .map(|a| (a.originator, a.seq))
            .collect::<Vec<_>>(),
        vec![(2, 3), (2, 4)]
    );
}

#[test]
fn unsettled_lists_own_unexecuted_requests_and_uncertified_acknowledgements() {
    let mut s = four();
    let r = s[0].introduce(vec![client_request(1, b"x")]).unwrap();
    s[0].take_acks();
    let (own, acks) = s[0].unsettled();
    assert_eq!(own, vec![r.clone()]);
    assert_eq!(acks.len(), 1);
    s[0].executed_through(&[1, 0, 0, 0]);
    assert_eq!(s[0].unsettled(), (vec![], vec![]));
}

#[test]
fn a_hole_without_a_certificate_seen_needs_f_plus_1_matching_copies() {
    let mut s = PreOrder::new(cfg(), 0);
    let a = po(2, 1, b"a");
    let forged = po(2, 1, b"forged");
    assert!(
        !s.offer(1, forged.clone(), true),
        "one copy may be a faulty replica's"
    );
    assert!(!s.offer(3, a.clone(), true));
    assert!(
        !s.offer(1, a.clone(), true),
        "a second offer from 1 does not count"
    );
    assert!(s.offer(2, a.clone(), true), "f+1 = 2 replicas offered a");
    assert_eq!(s.ready(&[(2, 1)]).map(|v| v[0].digest()), Ok(a.digest()));
}

#[test]
fn what_peers_hold_and_we_lack_is_fetched_and_lagging_peers_get_our_acks() {
    let mut s = four();
    let r = s[0].introduce(vec![client_request(1, b"x")]).unwrap();
    for store in &mut s[1..3] {
        store.receive_request(r.clone()).unwrap();
    }
    exchange_acks(&mut s);
    // Replica 3 missed the PO-REQUEST; the others' acknowledgements say they hold it.
    assert_eq!(s[3].missing(10), vec![(0, 1)]);
    assert!(s[1].missing(10).is_empty());
    // One peer (perhaps faulty) acknowledging what no one else holds sends no one
    // fetching: f+1 must vouch.
    let made_up = AckPart {
        originator: 2,
        seq: 1,
        digest: Digest([7; 32]),
    };
    s[3].receive_acks(1, std::slice::from_ref(&made_up));
    assert_eq!(s[3].missing(10), vec![(0, 1)]);
    s[3].receive_acks(2, &[made_up]);
    assert_eq!(s[3].missing(10), vec![(0, 1), (2, 1)]);
    // Replica 1 holds a certificate; replica 3's row (none yet) says it does not.
    let parts = s[1].acks_for(3, 10);
    assert_eq!(parts.len(), 1);
    assert_eq!(
        (parts[0].originator, parts[0].seq, parts[0].digest),
        (0, 1, r.digest())
    );
}

#[test]
fn a_restored_certificate_marks_the_copy_held_or_replaces_another_version() {
    let a = po(2, 1, b"a");
    let b = po(2, 1, b"b");
    let cert = |r: &Arc<PoRequest>| AckPart {
        originator: 2,
        seq: 1,
        digest: r.digest(),
    };
    // The copy we held is the certified one: ready at once, as before the restart.
    let mut s = PreOrder::new(cfg(), 0);
    s.restore_held(a.clone());
    s.restore_certified(&[cert(&a)]);
    assert_eq!(s.ready(&[(2, 1)]).map(|v| v[0].digest()), Ok(a.digest()));
    assert_eq!(s.certified_copy(2, 1).map(|c| c.digest()), Some(a.digest()));
    // We held the other version: it goes, and one copy of the certified one fills the hole.
    let mut s = PreOrder::new(cfg(), 0);
    s.restore_held(b.clone());
    s.restore_certified(&[cert(&a)]);
    assert_eq!(s.ready(&[(2, 1)]), Err(vec![(2, 1)]));
    assert_eq!(s.cum_aru()[2], 0);
    // It is a hole like any other: fetched once f+1 peers say they hold it.
    s.receive_acks(1, &[cert(&a)]);
    s.receive_acks(3, &[cert(&a)]);
    assert_eq!(s.missing(10), vec![(2, 1)]);
    assert!(s.offer(3, a.clone(), true));
    assert_eq!(s.ready(&[(2, 1)]).map(|v| v[0].digest()), Ok(a.digest()));
}

/// Review G1: a proactive recovery (`forget_all`) must not make a replica acknowledge a
/// second version of a number it acknowledged before, or an equivocating originator gets two
/// PO certificates for one number and correct replicas execute different requests.
#[test]
fn a_recovered_replica_never_acknowledges_a_second_version() {
    let mut s = four();
    let v1 = po(3, 1, b"v1");
    let v2 = po(3, 1, b"v2");
    // 3 sends v1 to 0 and 1 only; 0, 1 and 3 acknowledge it: 0 holds a certificate.
    assert_eq!(s[0].receive_request(v1.clone()), Ok(true));
    assert_eq!(s[1].receive_request(v1.clone()), Ok(true));
    let a0 = s[0].take_acks();
    let a1 = s[1].take_acks();
    s[0].receive_acks(1, &a1);
    s[1].receive_acks(0, &a0);
    s[0].receive_acks(
        3,
        &[AckPart {
            originator: 3,
            seq: 1,
            digest: v1.digest(),
        }],
    );
    assert_eq!(
        s[0].certified_copy(3, 1).map(|r| r.digest()),
        Some(v1.digest())
    );
    // Replica 1 recovers proactively; then 3 sends v2 to 1 and 2.
    s[1].forget_all();
    assert_eq!(
        s[1].receive_request(v2.clone()),
        Err(PoError::Equivocation {
            originator: 3,
            seq: 1
        }),
        "a recovered replica took a second version of what it acknowledged"
    );
    assert!(
        s[1].take_acks().iter().all(|p| p.digest != v2.digest()),
        "a recovered replica acknowledged a second version"
    );
    // What 1 acknowledged it still vouches for: a peer asking gets the same acknowledgement.
    let (_, unsettled) = s[1].unsettled();
    assert!(unsettled.iter().any(|p| p.digest == v1.digest()));
    // 2 takes v2 and gets acknowledgements from 3 only (and not 1): no certificate for v2.
    assert_eq!(s[2].receive_request(v2.clone()), Ok(true));
    let _ = s[2].take_acks();
    s[2].receive_acks(
        3,
        &[AckPart {
            originator: 3,
            seq: 1,
            digest: v2.digest(),
        }],
    );
    assert_eq!(s[2].certified_copy(3, 1), None);
}

/// Our own acknowledgement of a digest lets one copy fill the hole only if the copy's
/// requests authenticate here: after a proactive recovery the acknowledgement may be one the
/// attacker wrote into the journal (review of 8f08114), and one faulty replica's copy would
/// then bring in requests no client sent. f+1 matching copies still do without.
#[test]
fn our_own_acknowledgement_vouches_only_for_an_authentic_copy() {
    let forged = po(2, 1, b"forged");
    let ours = AckPart {
        originator: 2,
        seq: 1,
        digest: forged.digest(),
    };
    let mut s = PreOrder::new(cfg(), 0);
    s.restore_acks(&[ours]);
    assert!(!s.offer(2, forged.clone(), false), "one unauthentic copy");
    assert_eq!(s.ready(&[(2, 1)]), Err(vec![(2, 1)]));
    assert!(s.offer(3, forged.clone(), false), "f+1 = 2 matching copies");
    let mut s = PreOrder::new(cfg(), 0);
    s.restore_acks(&[ours]);
    assert!(s.offer(2, forged.clone(), true), "one authentic copy");
}
