//! Network faults scripted with the harness against the core's receiver-driven
//! retransmission: a lost frame, frames delivered one at a time, a partition that heals.

mod common;
use common::*;
use redoubt_core::message::ClientMessage;
use redoubt_core::message::Message;

/// The pre-prepare for backup 3 is lost: the others complete the request without it, and
/// backup 3's status messages get it (and the request) sent again.
#[test]
fn a_backup_that_lost_a_pre_prepare_catches_up_from_its_status_messages() {
    let mut c = Cluster::builder(1).live_client(7).build();
    let ts = c.invoke(7, b"op");
    let request = c.deliver_next().expect("the request is on the network");
    assert_eq!((request.from, request.to), (client(7), replica(0)));
    assert_eq!(request.kind(), "request");
    let lost = c.drop_where(|e| e.kind() == "pre-prepare" && e.to == replica(3));
    assert_eq!(lost, 1, "the primary sent its pre-prepare to replica 3");
    c.deliver_all();
    assert!(c.completed(7, ts), "2f+1 replicas are enough");
    assert_eq!(c.replica(3).last_executed(), 0, "without the pre-prepare");
    assert!(c.run_until(1_000, |c| c.replica(3).last_executed() == 1));
    assert_eq!(appended(c.replica(3).state()), 2);
}

/// The primary is cut off from everyone (clients too): the others time out, change view and
/// execute the request; once the partition heals, the old primary learns the new view and
/// catches up.
#[test]
fn a_partitioned_primary_is_replaced_and_catches_up_once_the_partition_heals() {
    let mut c = Cluster::builder(1).live_client(7).build();
    c.partition(&[0]);
    let ts = c.invoke(7, b"op");
    assert!(
        c.run_until(30_000, |c| c.completed(7, ts)),
        "the others commit"
    );
    assert!((1..4).all(|i| c.replica(i).view() > 0 && c.replica(i).is_normal()));
    assert_eq!((c.replica(0).view(), c.replica(0).last_executed()), (0, 0));
    assert!(c.dropped().iter().any(|e| e.between(0, 1)));
    c.heal();
    let caught_up = |c: &Cluster| {
        let (r0, r1) = (c.replica(0), c.replica(1));
        r0.view() == r1.view() && r0.is_normal() && r0.last_executed() == r1.last_executed()
    };
    assert!(c.run_until(30_000, caught_up), "the old primary catches up");
    assert_eq!(appended(c.replica(0).state()), 2);
}

/// With digest replies only one replica sends the result in full; its frame is lost. The
/// client, holding f+1 matching digests, asks again after one more round trip rather than
/// waiting out its retransmission timeout.
#[test]
fn a_lost_full_reply_is_asked_for_again_after_a_round_trip() {
    let mut c = Cluster::builder(1)
        .live_client(7)
        .config(|cfg| cfg.digest_replies = true)
        .build();
    // A result long enough to be sent as a digest.
    let ts = c.invoke(7, &[b'x'; 100]);
    let t0 = c.env().now_ms;
    c.block(move |e| {
        e.at == t0 && matches!(&e.msg, Message::Client(ClientMessage::Reply(r)) if !r.digest_only)
    });
    let rto = c.client(7).rto_ms();
    assert!(
        c.run_until(rto / 2, |c| c.completed(7, ts)),
        "completed within half the retransmission timeout"
    );
    assert!(c
        .dropped()
        .iter()
        .any(|e| matches!(&e.msg, Message::Client(ClientMessage::Reply(r)) if !r.digest_only)));
    assert_eq!(c.client(7).stats.full_result_asks, 1);
}

/// A request that went unanswered until its retransmission timeout, sent unsigned to the
/// primary (here the primary dropped it; every replica may also suspect the client, after f+1
/// of them could not authenticate a request of its, and order only what it signs), makes the
/// client sign its next requests for `suspect_client_ms`: under suspicion they complete
/// without a timeout each (firewall sweep seed 2174). They still go to the primary alone.
/// After that, unsigned again.
#[test]
fn after_a_timeout_a_client_signs_its_requests_for_a_while() {
    let mut c = Cluster::builder(1)
        .session_keys()
        .clients([])
        .live_client(7)
        .config(|cfg| cfg.suspect_client_ms = 5_000)
        .build();
    c.run(50);
    // Replica 0, the primary, drops what the client sends it, for the first request.
    let drops = c.block(|e| {
        e.from == client(7)
            && e.to == replica(0)
            && matches!(e.msg, Message::Client(ClientMessage::Request(_)))
    });
    let first_sends = |c: &Cluster, ts: u64| {
        let sends: Vec<_> = c
            .sent()
            .iter()
            .filter(|e| {
                matches!(&e.msg, Message::Client(ClientMessage::Request(sr)) if sr.request.timestamp == ts
                    && e.from == client(7))
            })
            .collect();
        let at = sends.first().map(|e| e.at);
        sends
            .into_iter()
            .filter(|e| Some(e.at) == at)
            .map(|e| match &e.msg {
                Message::Client(ClientMessage::Request(sr)) => (e.to, sr.sig.is_some()),
                _ => unreachable!(),
            })
            .collect::<Vec<_>>()
    };
    let ts = c.invoke(7, b"first");
    assert!(c.run_until(3_000, |c| c.completed(7, ts)));
    assert!(c.completions(7)[0].retransmissions >= 1, "it timed out");
    assert_eq!(first_sends(&c, ts), [(replica(0), false)]);
    c.unblock(drops);

    let ts = c.invoke(7, b"second");
    assert!(c.run_until(3_000, |c| c.completed(7, ts)));
    assert_eq!(c.completions(7)[1].retransmissions, 0, "no timeout");
    assert_eq!(
        first_sends(&c, ts),
        [(replica(0), true)],
        "signed, to the primary"
    );
    assert_eq!(c.client(7).stats.wary_requests, 1);

    // Past the window, unsigned again.
    c.run(5_100);
    let ts = c.invoke(7, b"third");
    assert!(c.run_until(3_000, |c| c.completed(7, ts)));
    assert_eq!(first_sends(&c, ts), [(replica(0), false)]);
}
