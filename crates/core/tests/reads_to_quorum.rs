//! Reads to a quorum first (`Config::read_only_to_quorum`): a fast read goes to 2f+1
//! replicas, spread over all of them, and to the others only when those answers are late or
//! do not match; a replica that was late, or answered something else, is left out of the
//! client's next reads.

use redoubt_core::message::*;
use redoubt_core::*;

mod common;
use common::*;

/// The replicas client 7's request `ts` went to.
fn asked(c: &Cluster, ts: u64) -> Vec<ReplicaId> {
    let mut to: Vec<ReplicaId> = c
        .sent()
        .iter()
        .filter_map(|e| match (&e.msg, e.from, e.to) {
            (
                Message::Client(ClientMessage::Request(sr)),
                Principal::Client(7),
                Principal::Replica(r),
            ) if sr.request.timestamp == ts => Some(r),
            _ => None,
        })
        .collect();
    to.sort_unstable();
    to.dedup();
    to
}

fn cluster(to_quorum: bool) -> Cluster {
    let mut c = Cluster::builder(1)
        .live_client(7)
        .config(|c| c.read_only_to_quorum = to_quorum)
        .build();
    c.run(50);
    c
}

/// Client 7 reads `op`; returns its timestamp once it completed on the fast path.
fn read(c: &mut Cluster, op: &[u8]) -> u64 {
    let ts = c.invoke_as(7, op, true);
    assert!(
        c.run_until(5_000, |c| c.completed(7, ts)),
        "the read {ts} completes"
    );
    let done = c
        .completions(7)
        .into_iter()
        .find(|d| d.timestamp == ts)
        .expect("completed");
    assert_eq!(done.result, op, "the read's result");
    ts
}

#[test]
fn a_read_goes_to_a_quorum_and_the_reads_spread_over_every_replica() {
    let mut c = cluster(true);
    let mut left_out = [0u32; 4];
    for i in 0..12 {
        let ts = read(&mut c, format!("read:k{i}").as_bytes());
        let to = asked(&c, ts);
        assert_eq!(to.len(), 3, "read {i} went to 2f+1 replicas: {to:?}");
        for r in (0..4).filter(|r| !to.contains(r)) {
            left_out[r as usize] += 1;
        }
    }
    assert!(
        left_out.iter().all(|&k| k > 0),
        "every replica is left out of some reads: {left_out:?}"
    );
    assert_eq!(c.client(7).stats.read_widenings, 0);
    assert_eq!(c.client(7).stats.fallbacks, 0);
}

#[test]
fn without_the_setting_a_read_goes_to_every_replica() {
    let mut c = cluster(false);
    for i in 0..4 {
        let ts = read(&mut c, format!("read:k{i}").as_bytes());
        assert_eq!(asked(&c, ts), vec![0, 1, 2, 3]);
    }
}

#[test]
fn long_results_come_in_full_from_an_asked_replica() {
    // Over 32 bytes: one replica sends the result, the others its digest. The client never
    // leaves that replica out, so no read needs the others.
    let mut c = cluster(true);
    for i in 0..12 {
        let op = format!("read:{i:-<60}");
        let ts = read(&mut c, op.as_bytes());
        assert_eq!(asked(&c, ts).len(), 3);
    }
    assert_eq!(c.client(7).stats.read_widenings, 0);
    assert_eq!(c.client(7).stats.fallbacks, 0);
}

#[test]
fn a_silent_replica_costs_one_widening_then_is_left_out() {
    let mut c = cluster(true);
    let silent = 2;
    c.block(move |e| e.to == Principal::Replica(silent) || e.from == Principal::Replica(silent));
    let mut widened_at = None;
    for i in 0..12 {
        let ts = read(&mut c, format!("read:k{i}").as_bytes());
        let to = asked(&c, ts);
        if c.client(7).stats.read_widenings == 1 && widened_at.is_none() {
            widened_at = Some(i);
            assert_eq!(
                to,
                vec![0, 1, 2, 3],
                "the widened read went to every replica"
            );
        } else if widened_at.is_some() {
            assert!(
                !to.contains(&silent),
                "read {i} after the widening leaves the silent replica out: {to:?}"
            );
        }
    }
    assert!(widened_at.is_some(), "some read asked the silent replica");
    assert_eq!(c.client(7).stats.read_widenings, 1);
    assert_eq!(
        c.client(7).stats.fallbacks,
        0,
        "no read fell back to ordering"
    );
}

#[test]
fn a_replica_answering_wrong_costs_one_widening_then_is_left_out() {
    let mut c = Cluster::builder(1).live_client(7).scripted([2]).build();
    c.run(50);
    let mut asked_liar = 0;
    for i in 0..12 {
        let op = format!("read:k{i}");
        let ts = c.invoke_as(7, op.as_bytes(), true);
        if asked(&c, ts).contains(&2) {
            asked_liar += 1;
            // Replica 2 (the test speaks for it) answers at once, and wrongly.
            c.send(
                Principal::Replica(2),
                Principal::Client(7),
                Message::Client(ClientMessage::Reply(Reply {
                    view: 0,
                    timestamp: ts,
                    client: 7,
                    replica: 2,
                    digest_only: false,
                    tentative: false,
                    result: b"read:wrong".to_vec(),
                })),
            );
        }
        assert!(
            c.run_until(5_000, |c| c.completed(7, ts)),
            "read {i} completes"
        );
        let done = c.completions(7).into_iter().find(|d| d.timestamp == ts);
        assert_eq!(done.expect("completed").result, op.as_bytes());
    }
    assert!(asked_liar >= 1, "some read asked the lying replica");
    assert_eq!(
        c.client(7).stats.read_widenings,
        1,
        "only the first read it answered wrongly needed the others"
    );
    assert_eq!(c.client(7).stats.fallbacks, 0);
}

/// A replica the host reports unreachable (its connection is down and connecting failed) is
/// left out of every fast read from the first, without the widening a silent replica costs;
/// once reachable again, reads spread over it too.
#[test]
fn a_replica_the_host_cannot_reach_is_left_out_from_the_first_read() {
    let mut c = cluster(true);
    let down = 1;
    let rule =
        c.block(move |e| e.to == Principal::Replica(down) || e.from == Principal::Replica(down));
    c.client_mut(7).set_unreachable([down]);
    for i in 0..12 {
        let ts = read(&mut c, format!("read:k{i}").as_bytes());
        let to = asked(&c, ts);
        assert!(!to.contains(&down), "read {i}: {to:?}");
    }
    assert_eq!(c.client(7).stats.read_widenings, 0);
    c.unblock(rule);
    c.client_mut(7).set_unreachable([]);
    let mut asked_down = false;
    for i in 0..12 {
        let ts = read(&mut c, format!("read:again{i}").as_bytes());
        asked_down |= asked(&c, ts).contains(&down);
    }
    assert!(asked_down, "reads go to the replica again");
}

/// Ordered requests of client 7 with long results (sent as digests by all but one replica),
/// one backup cut off; returns how many of `requests` needed their result asked for again.
fn full_result_asks_with_a_backup_down(report_unreachable: bool, requests: usize) -> u64 {
    let mut c = cluster(true);
    let down = 2;
    c.block(move |e| e.to == Principal::Replica(down) || e.from == Principal::Replica(down));
    if report_unreachable {
        c.client_mut(7).set_unreachable([down]);
    }
    for i in 0..requests {
        let op = format!("write {i}: a result longer than a digest, sent in full by one replica");
        let ts = c.invoke_as(7, op.as_bytes(), false);
        assert!(
            c.run_until(5_000, |c| c.completed(7, ts)),
            "request {i} completes"
        );
    }
    c.client(7).stats.full_result_asks
}

/// The request's timestamp picks the replica that sends the result in full (digest replies):
/// a client never lets it pick one the host cannot reach, so no result waits for a
/// retransmission; without the hint some do (the check can fail).
#[test]
fn no_result_is_left_to_a_replica_the_host_cannot_reach() {
    assert_eq!(full_result_asks_with_a_backup_down(true, 24), 0);
    assert!(
        full_result_asks_with_a_backup_down(false, 24) > 0,
        "without the hint, the unreachable backup is some request's designated replier"
    );
}

/// A client of an unreplicated server (f = 0: the benchmarks' baseline) that the host reports
/// unreachable, as before the server accepts connections, still sends it its requests: there
/// is no other replica to pick.
#[test]
fn a_client_of_a_lone_server_reported_unreachable_still_sends_to_it() {
    let mut cfg = Config::new(1);
    cfg.f = 0;
    let mut ring = Keyring::new(KeyMode::Static, 1, [7]);
    let keys = ring.keys(Principal::Client(7));
    let mut client = Client::new(cfg, ClientTiming::default(), 7, keys);
    client.set_unreachable([0]);
    for read_only in [false, true] {
        let env = Env {
            now_ms: 1,
            ..Env::default()
        };
        let (_, effects) = client
            .invoke(env, b"read: longer than a digest".to_vec(), read_only)
            .expect("invoked");
        assert!(
            effects.iter().any(|e| matches!(
                e,
                Effect::Send {
                    to: Principal::Replica(0),
                    ..
                }
            )),
            "{effects:?}"
        );
        client.abandon();
    }
}
