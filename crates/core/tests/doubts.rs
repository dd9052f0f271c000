//! Partly authenticated requests: a backup's PREPARE names the requests of the batch it could
//! not authenticate (its doubts); a slot prepares only when 2f backups vouch for each of its
//! requests; a doubted slot at a view change, and across a restart.
//!
//! Moved from `regressions.rs` (names unchanged); each scenario reproduced a bug before its
//! fix.

use redoubt_core::message::ClientMessage;
use redoubt_core::message::SignedRequest;
use redoubt_core::*;

mod common;
use common::*;

/// A request of `client` (timestamp 1, operation `op`) whose authenticator entries for the
/// replicas `bad` do not verify.
fn request_bad_for(c: &Cluster, client: u64, op: &[u8], bad: &[ReplicaId]) -> SignedRequest {
    spoil(c.request(client, 1, op), bad)
}

/// Faulty clients whose authenticators verify at some replicas only: client 7's entry for
/// replica 2 and client 8's entry for replica 3 are bad, and replica 1 is silent. Before
/// PREPAREs carried doubts, replicas 2 and 3 each withheld their PREPARE and the batch could
/// never prepare, in any view whose primary held both requests (simulator seeds 7662, 16696
/// and 16802 with --quiet-primary). Now each names the request it doubts, and the batch
/// prepares because the primary and one backup vouch for each request.
#[test]
fn a_batch_prepares_when_each_request_has_f_plus_one_vouchers() {
    let mut c = Cluster::builder(1).live([3]).build();
    let pp = pre_prepare(
        0,
        1,
        vec![
            request_bad_for(&c, 7, b"seven", &[2]),
            request_bad_for(&c, 8, b"eight", &[3]),
        ],
    );
    let d = pp.digest;
    let mine = c.receive(3, 0, pp).prepare();
    assert_eq!(
        mine.expect("a PREPARE, naming what it doubts").doubts,
        vec![1]
    );
    // Replica 2 doubts the other request: each has one backup voucher, and the primary no
    // longer counts (review finding 2).
    let out = c.receive(3, 2, prepare_doubting(0, 1, d, 2, vec![0]));
    assert!(!out.commits(), "one backup voucher per request");
    // Replica 1 vouches for both: two backup vouchers each.
    let out = c.receive(3, 1, prepare(0, 1, d, 1));
    assert!(
        out.commits(),
        "prepared with f+1 backup vouchers per request"
    );

    // Both backups doubting the same request: only the primary vouches for it.
    let mut c = Cluster::builder(1).live([3]).build();
    let pp = pre_prepare(
        0,
        1,
        vec![
            request_bad_for(&c, 7, b"seven", &[]),
            request_bad_for(&c, 8, b"eight", &[3]),
        ],
    );
    let d = pp.digest;
    c.receive(3, 0, pp);
    let out = c.receive(3, 2, prepare_doubting(0, 1, d, 2, vec![1]));
    assert!(!out.commits(), "no backup vouches for request 1");
    // A third PREPARE vouching for it makes one backup voucher: still not enough.
    let out = c.receive(3, 1, prepare(0, 1, d, 1));
    assert!(!out.commits());
    // The client sends the request again, straight to replica 3, which now vouches: two.
    let good = request_bad_for(&c, 8, b"eight", &[]);
    c.advance(1);
    assert!(c.receive_request(3, &good).commits());
}

/// A backup that doubted a request vouches for it once the request arrives straight from its
/// client: it sends a PREPARE without the doubt at once (until review found it, only on the
/// next copy of the pre-prepare or a client key), and receivers keep what either PREPARE
/// vouched for.
#[test]
fn a_doubting_backup_vouches_once_it_holds_the_request() {
    let mut c = Cluster::builder(1).live([3]).build();
    let pp = pre_prepare(0, 1, vec![request_bad_for(&c, 7, b"seven", &[3])]);
    let d = pp.digest;
    assert_eq!(
        c.receive(3, 0, pp.clone()).prepare().unwrap().doubts,
        vec![0]
    );
    // Another client's request changes nothing.
    c.advance(1);
    let other = request_bad_for(&c, 8, b"eight", &[]);
    assert!(c.receive_request(3, &other).prepare().is_none());
    let good = request_bad_for(&c, 7, b"seven", &[]);
    assert_eq!(
        c.receive_request(3, &good)
            .prepare()
            .expect("a new PREPARE")
            .doubts,
        Vec::<u16>::new()
    );
    // The pre-prepare again: nothing more to say.
    c.advance(1);
    assert!(c.receive(3, 0, pp).prepare().is_none());

    // At a receiver that doubts the request itself, replica 2's second PREPARE (no doubts)
    // lifts its first one's doubt.
    let mut c = Cluster::builder(1).live([1]).build();
    let pp = pre_prepare(0, 1, vec![request_bad_for(&c, 8, b"eight", &[1])]);
    let d2 = pp.digest;
    assert_ne!(d, d2);
    c.receive(1, 0, pp);
    let out = c.receive(1, 2, prepare_doubting(0, 1, d2, 2, vec![0]));
    let out2 = c.receive(1, 3, prepare_doubting(0, 1, d2, 3, vec![0]));
    assert!(
        !out.commits() && !out2.commits(),
        "no backup vouches for request 0"
    );
    let out = c.receive(1, 2, prepare(0, 1, d2, 2));
    assert!(!out.commits(), "replica 2 now vouches: one backup voucher");
    let out = c.receive(1, 3, prepare(0, 1, d2, 3));
    assert!(out.commits(), "replica 3 too: f+1 backup vouchers");
}

/// PREPAREs with malformed doubts (out of order, repeated, or past the batch size limit) are
/// rejected without counting.
#[test]
fn malformed_doubts_are_rejected() {
    let mut c = Cluster::builder(1).live([3]).build();
    let pp = pre_prepare(0, 1, vec![request_bad_for(&c, 7, b"seven", &[])]);
    let d = pp.digest;
    c.receive(3, 0, pp);
    for bad in [vec![1, 0], vec![0, 0], vec![u16::MAX]] {
        let out = c.receive(3, 2, prepare_doubting(0, 1, d, 2, bad.clone()));
        assert!(out.rejected(), "{bad:?} accepted");
    }
}

/// PREPAREs name doubted requests by 16-bit position, so a batch may hold at most 65,536
/// requests; a larger limit wrapped positions (review of the doubts change).
#[test]
fn batch_requests_max_fits_the_doubt_positions() {
    let mut cfg = Config::new(1);
    cfg.batch_requests_max = 1 << 16;
    assert!(cfg.validate().is_ok());
    cfg.batch_requests_max = (1 << 16) + 1;
    assert!(cfg.validate().is_err());
}

/// The known gap's trace (below): a faulty primary (0) pre-prepares, to replicas 1 and 2, a
/// request whose authenticator verifies at replicas 0 and 1 only; replica 1 vouches, replica
/// 2 doubts; with `prepared_at_1`, replica 2's PREPARE reaches replica 1, which prepares on
/// {1, 2} (vouchers 0 and 1). Then the primary falls silent, a correct client's request
/// waits at every other replica, and the network holds every message but status messages
/// until the view-change timers fire. With `client_resends`, the client of the doubted request is correct (its key
/// had not reached replicas 2 and 3) and sends it again, now verifiable everywhere, once the
/// view change has begun. Returns the replicas' (view, normal, last executed) after two
/// simulated minutes, or `None` if two of them installed a new view.
fn partly_authenticated_trace(
    prepared_at_1: bool,
    client_resends: bool,
) -> Option<Vec<(u64, bool, u64)>> {
    // Replica 0 is the faulty primary; the network moves every 50 ms of simulated time.
    let mut c = Cluster::builder(1).scripted([0]).step_ms(50).build();
    // The authenticator's entries for replicas 2 and 3 spoiled (the batch digest does not
    // cover authenticators).
    let pp = pre_prepare(0, 1, vec![request_bad_for(&c, 7, b"seven", &[2, 3])]);
    let mut prepare_of_2 = None;
    for to in [1u32, 2] {
        let p = c.receive(to, 0, pp.clone()).prepare().expect("a PREPARE");
        assert_eq!(p.doubts.is_empty(), to == 1);
        if to == 2 {
            prepare_of_2 = Some(p);
        }
    }
    if prepared_at_1 {
        let out = c.receive(1, 2, prepare_of_2.unwrap());
        // Until review finding 2 the primary counted as a voucher, replica 1 prepared on
        // {1, 2} (vouchers 0 and 1), and no view change could decide the slot.
        assert!(
            !out.commits(),
            "one backup (replica 1) vouches: not prepared, the primary does not count"
        );
    }
    let other = request_bad_for(&c, 8, b"eight", &[]);
    for to in [1u32, 2, 3] {
        c.receive_request(to, &other);
    }
    let states = |c: &Cluster| {
        c.live()
            .map(|r| (r.view(), r.is_normal(), r.last_executed()))
            .collect()
    };
    // The network holds every message until some replica's view-change timer fires, but for
    // status messages: a replica that hears from fewer than 2f others starts no view change
    // (docs/adr/0002, item 14), and what a status asks for is held too.
    let hold = c.block(|e| e.kind() != "status");
    if !c.run_until(120_000, |c| c.live().any(|r| r.view() > 0)) {
        return Some(states(&c));
    }
    c.unblock(hold);
    if client_resends {
        let good = request_bad_for(&c, 7, b"seven", &[]);
        for to in [1u32, 2, 3] {
            c.receive_request(to, &good);
        }
    }
    let installed = |c: &Cluster| c.live().filter(|r| r.view() > 0 && r.is_normal()).count() >= 2;
    if c.run_until(120_000 - c.now, installed) {
        return None;
    }
    Some(states(&c))
}

/// The control for the known gap below: with no replica prepared, the view change decides
/// (null for the doubted batch) and service resumes.
#[test]
fn a_doubted_batch_prepared_nowhere_is_replaced_at_the_view_change() {
    assert_eq!(partly_authenticated_trace(false, false), None);
}

/// The former liveness gap of ADR 0002, item 7 (review finding 2): replica 1 prepared the
/// batch with the primary counted as its second voucher, nobody committed it, and the
/// primary fell silent. The VIEW-CHANGEs of 1, 2 and 3 held one P entry (blocking the null
/// rule B) and one Q claim (A2 needs f+1), so no view was ever installed (at d38d06b: view 10
/// after two minutes, nothing executed). Now a slot prepares only with f+1 backup vouchers,
/// replica 1 does not prepare, and the view change decides null.
#[test]
fn a_partly_authenticated_request_vouched_by_one_backup_no_longer_blocks_the_view_change() {
    assert_eq!(partly_authenticated_trace(true, false), None);
}

/// The known gap's trace with a correct client whose key had not reached replicas 2 and 3:
/// its request, sent again once the view change has begun, lets replica 2 vouch for the
/// slot it doubted in view 0, its next VIEW-CHANGE claims it in Q, and the view change
/// decides (before, a replica in a view change ignored the arrival: its doubt stayed, and so
/// did the halt).
#[test]
fn a_doubted_slot_joins_q_when_its_request_arrives_during_the_view_change() {
    assert_eq!(partly_authenticated_trace(true, true), None);
}

/// Review finding 6: the slots of a view left that a backup pre-prepared with doubts are
/// journaled, so the rescue for a correct client's request (the slot joins Q once the request
/// verifies) survives a reboot. Before, `doubted` was volatile: after a restart the request's
/// arrival added nothing to Q.
#[test]
fn doubted_slots_survive_a_restart() {
    let mut c = Cluster::builder(1).live([3]).build();
    let ck = (0, c.checkpoint_zero());
    let pp = pre_prepare(0, 1, vec![request_bad_for(&c, 7, b"seven", &[3])]);
    let d = pp.digest;
    assert_eq!(c.receive(3, 0, pp).prepare().unwrap().doubts, vec![0]);
    // The view changes before anything prepares: the slot is doubted in view 0.
    c.advance(1);
    let mine = c.join_view(3, [view_change(1, 1, ck), view_change(1, 2, ck)]);
    assert!(mine.q.is_empty());
    // Power loss; replica 3 restarts from its journal.
    let journal = c.journal(3).to_vec();
    c.restart(3, &journal);
    // The client sends its request again, now verifiable at replica 3.
    c.advance(1);
    let good = request_bad_for(&c, 7, b"seven", &[]);
    c.receive_request(3, &good);
    c.advance(1);
    let mine = c.join_view(3, [view_change(2, 1, ck), view_change(2, 2, ck)]);
    assert!(
        mine.q
            .iter()
            .any(|e| e.seq == 1 && e.pairs.contains(&(d, 0))),
        "the slot of view 0 claimed in Q after the restart: {:?}",
        mine.q
    );
}

/// `suspect_on_doubts`: once f+1 replicas doubt a request of a pre-prepare (one of them is
/// correct and could not authenticate it), its client is suspected at once: the "big MAC"
/// client whose MACs verify at the primary only would otherwise stall each batch holding its
/// request until its retransmission reached the backups, and never be suspected (no view
/// change). One doubt is not enough (it may be a faulty replica's); with the option off,
/// nothing changes.
#[test]
fn f_plus_one_doubts_put_the_client_under_suspicion_at_once() {
    for (on, doubters, suspected) in [(true, 1, false), (true, 2, true), (false, 2, false)] {
        let mut c = Cluster::builder(1)
            .live([3])
            .config(|cfg| cfg.suspect_on_doubts = on)
            .build();
        // Bad for replicas 1 and 2; replica 3 (the one observed) vouches for it.
        let pp = pre_prepare(0, 1, vec![request_bad_for(&c, 7, b"seven", &[1, 2])]);
        let d = pp.digest;
        c.receive(3, 0, pp);
        for r in [1, 2].into_iter().take(doubters) {
            c.receive(3, r, prepare_doubting(0, 1, d, r, vec![0]));
        }
        let events = c.events(3);
        let got = events
            .iter()
            .any(|e| matches!(e, Event::ClientSuspected { client: 7 }));
        assert_eq!(got, suspected, "on {on}, {doubters} doubting PREPAREs");
    }
}

/// A request older than one of its client's that committed executes as nothing, so a backup
/// does not doubt it even when its authenticator no longer verifies (the client re-keyed
/// since, or the request was relayed late by a replica that had been away): f+1 such doubts
/// put a correct client under suspicion for `suspect_client_ms` (firewall sweep seed 2174,
/// after a partition). A request of the same age the replica has no newer one of is doubted
/// as before.
#[test]
fn a_request_older_than_a_committed_one_of_its_client_is_not_doubted() {
    let mut c = Cluster::builder(1).live([3]).build();
    let newer = c.request(7, 20, b"newer");
    let out = c.agree(3, pre_prepare(0, 1, vec![newer]), &[1, 2], &[0, 1, 2]);
    assert!(
        out.any(|m| matches!(m, Message::Client(ClientMessage::Reply(r)) if r.timestamp == 20)),
        "the newer request committed and executed"
    );
    let older = spoil(c.request(7, 10, b"older"), &[3]);
    let mine = c.receive(3, 0, pre_prepare(0, 2, vec![older])).prepare();
    assert_eq!(
        mine.expect("a PREPARE").doubts,
        Vec::<u16>::new(),
        "superseded: not doubted"
    );

    // Another client's request, bad for replica 3 and with nothing newer: doubted.
    let stranger = spoil(c.request(8, 10, b"stranger"), &[3]);
    let mine = c.receive(3, 0, pre_prepare(0, 3, vec![stranger])).prepare();
    assert_eq!(mine.expect("a PREPARE").doubts, vec![0]);
}
