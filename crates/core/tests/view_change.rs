//! The view change: forged and relayed VIEW-CHANGEs, NEW-VIEWs for far views, ack spam, the
//! timers that start a view change, and a view change at n = 7 that needs its 2f+1.
//!
//! The first five tests come from `regressions.rs` (names unchanged): each scenario
//! reproduced a bug found in review before its fix.

use redoubt_core::message::*;
use redoubt_core::*;
use redoubt_crypto::Digest;

mod common;
use common::*;

#[test]
fn forged_view_change_is_not_accepted_on_the_primary_ack_alone() {
    let mut c = Cluster::builder(1).live([0]).build();
    let ck = (0, c.checkpoint_zero());
    let vc1 = view_change(1, 1, ck);
    let mine = c.join_view(0, [vc1.clone(), view_change(1, 2, ck)]);
    // Replica 3 never sent anything; faulty primary 1 invents its view change.
    let forged = view_change(1, 3, ck);
    let named = [(0, mine.digest()), (1, vc1.digest()), (3, forged.digest())];
    c.advance(1);
    c.receive(0, 1, new_view(1, &named, ck));
    assert!(!c.replica(0).is_normal());
    c.receive(
        0,
        1,
        Message::Pbft(PbftMessage::RelayViewChange(forged.clone())),
    );
    c.receive(0, 1, ack(1, 1, &forged));
    assert!(
        !c.replica(0).is_normal(),
        "a relayed view change needs f acks besides the new primary's"
    );
}

#[test]
fn a_new_view_alone_never_moves_a_replica() {
    let mut c = Cluster::builder(1).live([0]).build();
    let ck = (0, c.checkpoint_zero());
    let named = [(0, Digest::ZERO), (1, Digest::ZERO), (2, Digest::ZERO)];
    for v in [u64::MAX, 1_000_003] {
        c.receive(0, 3, new_view(v, &named, ck));
        assert_eq!(c.replica(0).view(), 0);
        assert!(c.replica(0).is_normal());
    }
    c.advance(100_000);
    c.tick(0);
}

/// The view a replica reports in certified replies behind the firewall is the last one it
/// entered normal operation in, not one it is still trying to change to (a replica left
/// behind in a view change nobody else joined would send clients after a view nobody orders
/// in; seeds of the throughput check, `seeds_the_throughput_check_once_failed`).
#[test]
fn the_installed_view_is_the_last_one_entered_not_the_one_tried() {
    let mut c = Cluster::builder(1).live([0]).build();
    let ck = (0, c.checkpoint_zero());
    let (vc1, vc2) = (view_change(1, 1, ck), view_change(1, 2, ck));
    let mine = c.join_view(0, [vc1.clone(), vc2.clone()]);
    let seen = |c: &Cluster| {
        let r = c.replica(0);
        (r.view(), r.is_normal(), r.installed_view())
    };
    assert_eq!(
        seen(&c),
        (1, false, 0),
        "changing to view 1: still reports 0"
    );
    let named = [(0, mine.digest()), (1, vc1.digest()), (2, vc2.digest())];
    c.advance(1);
    c.receive(0, 1, new_view(1, &named, ck));
    assert_eq!(seen(&c), (1, true, 1), "view 1 entered");
    // Two others ask for view 2; nobody sends its NEW-VIEW.
    c.join_view(0, [view_change(2, 1, ck), view_change(2, 2, ck)]);
    assert_eq!(
        seen(&c),
        (2, false, 1),
        "changing to view 2: still reports 1"
    );
}

/// Replica 1 (the primary of view 1) gets the VIEW-CHANGEs of replicas 0 and 2 and their
/// acks of each other's; first, with `spam`, replicas 0 and 2 get 64 VIEW-CHANGEs of replica
/// 3 for views far ahead that replica 1 leads. Returns whether replica 1 sent its NEW-VIEW.
fn ack_spam_then_view_change(spam: bool) -> bool {
    let mut c = Cluster::builder(1).live([0, 1, 2]).build();
    let ck = (0, c.checkpoint_zero());
    if spam {
        for acker in [0u32, 2] {
            let mut acks = vec![];
            for k in 1..=64u64 {
                let v = 1 + 4 * k; // primary 1
                let out = c.receive(acker, 3, view_change(v, 3, ck));
                acks.extend(
                    out.messages()
                        .into_iter()
                        .filter_map(|(to, m)| match (to, m) {
                            (
                                Some(Principal::Replica(1)),
                                Message::Pbft(PbftMessage::ViewChangeAck(a)),
                            ) => Some(a),
                            _ => None,
                        }),
                );
            }
            assert!(acks.is_empty(), "no acks for views more than one ahead");
            for a in acks {
                c.receive(1, acker, a);
            }
        }
    }
    let vc0 = view_change(1, 0, ck);
    let vc2 = view_change(1, 2, ck);
    c.advance(1);
    let mut out = c.receive(1, 0, vc0.clone());
    out.extend(c.receive(1, 2, vc2.clone()));
    out.extend(c.receive(1, 2, ack(1, 2, &vc0)));
    out.extend(c.receive(1, 0, ack(1, 0, &vc2)));
    out.new_view()
}

#[test]
fn view_change_spam_cannot_exhaust_the_ack_quota() {
    assert!(ack_spam_then_view_change(false));
    assert!(
        ack_spam_then_view_change(true),
        "view-change spam for far views must not block S"
    );
}

/// Seen in the simulator (seed 9195 of a variant): replica 2 silent, replica 3 timed out and
/// waited alone in the next view, and the primary held prepared batches that could never
/// commit in its view; every request was executed at replica 1, so no backup ever timed out
/// again. A primary whose own proposals do not execute within the view-change timeout now
/// starts a view change itself.
#[test]
fn a_primary_whose_proposals_do_not_execute_suspects_itself() {
    // The request arrives long after the replica started and before any tick of it.
    let start = 50_000;
    let mut c = Cluster::builder(1).live([0]).build();
    c.advance_to(start);
    let sr = c.request(7, 1, b"x");
    let pp = c.receive_request(0, &sr).pre_prepare();
    let d = pp.expect("the primary proposes").digest;
    c.advance(10);
    for s in [1u32, 3] {
        c.receive(0, s, prepare(0, 1, d, s));
    }
    // Prepared and committed locally, but no other replica's commit ever arrives.
    let timeout = c.cfg.view_change_timeout_ms;
    let mut started_at = None;
    while c.now < start + timeout * 3 {
        c.advance(10);
        if c.tick(0).view_change().is_some_and(|vc| vc.view == 1) {
            started_at = Some(c.now);
            break;
        }
    }
    let t = started_at.expect("the stalled primary starts a view change");
    assert!(t >= start + timeout, "not before the timeout ({t} ms)");
    assert_eq!(c.replica(0).stats.primary_stalls, 1);
}

/// Two replicas waiting in a view for a third VIEW-CHANGE that will not come (its sender's
/// timer for that view expired and it moved on; its VIEW-CHANGE for it was lost) start their
/// own timer on its VIEW-CHANGE for the later view, and follow it (simulator seed 10294 with
/// --quiet-primary: replica 1 silent).
#[test]
fn a_view_change_for_a_later_view_counts_toward_the_view_change_timer() {
    let mut c = Cluster::builder(1).live([3]).build();
    let ck = (0, c.checkpoint_zero());
    // Replica 2 asks for view 1 and so do we (our own timer); replica 0 went on to view 2.
    c.receive(3, 2, view_change(1, 2, ck));
    let out = c.receive(3, 0, view_change(1, 0, ck));
    assert_eq!(out.view_change().map(|v| v.view), Some(1));
    // (replica 0's VIEW-CHANGE for view 1 is what a lossy network may drop: start over with
    // a replica that never got it)
    let mut c = Cluster::builder(1).live([3]).build();
    c.receive(3, 2, view_change(1, 2, ck));
    c.receive(3, 0, view_change(2, 0, ck));
    assert_eq!(
        c.replica(3).view(),
        1,
        "f+1 view changes for view 1 or later: joined view 1"
    );
    // Nobody sends a NEW-VIEW for view 1 (its primary, replica 1, is silent).
    while c.replica(3).view() < 2 && c.now < 60_000 {
        c.advance(50);
        c.tick(3);
    }
    assert_eq!(
        c.replica(3).view(),
        2,
        "the timer ran and the replica moved on to view 2"
    );
    // Each view change says why it started (the node logs it and counts it by cause).
    let causes: Vec<(u64, ViewChangeCause)> = c
        .events(3)
        .iter()
        .filter_map(|e| match e {
            Event::ViewChangeStarted { view, cause } => Some((*view, *cause)),
            _ => None,
        })
        .collect();
    assert_eq!(
        causes,
        [
            (1, ViewChangeCause::JoinedOthers),
            (2, ViewChangeCause::ViewChangeTimer)
        ]
    );
}

/// n = 7 (f = 2). The primary (0) is faulty: it pre-prepares a client's request at backups 1
/// and 2 only, then falls silent. Backups 5 and 6 lag (cut off from everyone). The other four
/// time out, but four are 2f: each hears only 2f-1 others, asks for no new view (it could not
/// complete; docs/adr/0002, item 14) and nothing executes. Once backup 5 is back, 2f+1
/// replicas change view and the request executes; once backup 6 is back, it catches up with
/// the view and the execution.
#[test]
fn at_n_7_a_faulty_primary_is_replaced_once_2f_plus_1_replicas_change_view() {
    let mut c = Cluster::builder(2).scripted([0]).live_client(7).build();
    let lagging_5 = c.isolate(5);
    let lagging_6 = c.isolate(6);
    c.invoke(7, b"op");
    c.deliver_all();
    let sr = c
        .sent()
        .iter()
        .find_map(|e| match &e.msg {
            Message::Client(ClientMessage::Request(sr)) if e.to == replica(0) => Some(sr.clone()),
            _ => None,
        })
        .expect("the client sends its request to the primary");
    let pp = pre_prepare(0, 1, vec![sr]);
    for to in [1, 2] {
        c.send(replica(0), replica(to), pp.clone());
    }
    let changed = |c: &Cluster, who: &[ReplicaId]| {
        who.iter()
            .all(|i| c.replica(*i).view() > 0 && c.replica(*i).is_normal())
    };
    let four = [1, 2, 3, 4];
    assert!(
        !c.run_until(30_000, |c| four.iter().any(|i| changed(c, &[*i]))),
        "a view installed on 2f VIEW-CHANGEs"
    );
    assert!(
        four.iter()
            .all(|i| c.replica(*i).view() == 0 && c.replica(*i).stats.view_changes_deferred > 0),
        "their timers fired, and they waited for 2f others to be heard"
    );
    assert!(c.live().all(|r| r.last_executed() == 0));
    assert!(c.completions(7).is_empty());

    c.unblock(lagging_5);
    let five = [1, 2, 3, 4, 5];
    assert!(
        c.run_until(120_000, |c| !c.completions(7).is_empty()),
        "2f+1 replicas replace the primary"
    );
    assert_eq!(c.completions(7)[0].result, b"op");
    c.run(1_000);
    assert!(changed(&c, &five));
    let view = c.replica(1).view();
    let executed = c.replica(1).last_executed();
    for i in five {
        assert_eq!(c.replica(i).view(), view, "replica {i}");
        assert_eq!(c.replica(i).last_executed(), executed, "replica {i}");
        assert_eq!(appended(c.replica(i).state()), 2, "replica {i} ran it once");
    }
    assert_eq!(c.replica(6).last_executed(), 0);

    c.unblock(lagging_6);
    let caught_up = |c: &Cluster| {
        let r6 = c.replica(6);
        r6.view() == view && r6.is_normal() && r6.last_executed() == executed
    };
    assert!(
        c.run_until(30_000, caught_up),
        "the lagging backup catches up"
    );
    assert_eq!(appended(c.replica(6).state()), 2);
}

/// A backup that received signed requests while the view was changing relays one batch's
/// worth of them to the new primary on entering the view. The rest used to reach the primary
/// only if their clients retransmitted: the view-change timer then ran out at that backup
/// alone, which left the view by itself (simulator `--firewall` seed 1082, where it stayed out
/// for the rest of the run). A backup now relays the request its timer runs for, once per view.
#[test]
fn a_request_received_during_a_view_change_reaches_the_new_primary() {
    const A: ClientId = 11;
    const B: ClientId = 12;
    let mut c = Cluster::builder(1)
        .session_keys()
        .clients([A, B])
        .config(|cfg| cfg.batch_requests_max = 1)
        .build();
    c.run(1_000);
    c.rekey(client(A), &[0, 1, 2, 3]);
    c.rekey(client(B), &[0, 1, 2, 3]);
    c.deliver_all();
    // The primary steps down; replica 2 learns it first and leaves view 0.
    c.input(0, Input::StepDown);
    c.deliver_all_where(|e| e.from == replica(0) && e.to == replica(2));
    assert!(!c.replica(2).is_normal());
    // Two clients' signed retransmissions reach replica 2 alone meanwhile.
    for (cl, ts) in [(A, 1), (B, 1)] {
        let sr = c.sign(c.request(cl, ts, b"op"));
        c.send(client(cl), replica(2), sr);
    }
    c.deliver_all_where(|e| e.to == replica(2) && e.kind() == "request");
    c.run(5_000);
    let views: Vec<_> = c.live().map(|r| (r.view(), r.is_normal())).collect();
    assert!(views.iter().all(|v| *v == (1, true)), "views {views:?}");
    assert!(
        c.live().all(|r| r.last_executed() >= 2),
        "executed {:?}",
        c.live().map(|r| r.last_executed()).collect::<Vec<_>>()
    );
}
