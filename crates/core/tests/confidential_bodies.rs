//! Confidential bodies (`Config::confidential_bodies`): operations and results travel sealed
//! between each client and the executors, so no frame on the network holds a client's value
//! in clear, while every correct replica runs the same operation and seals the same result.

use redoubt_core::bodies::{self, REFUSED};
use redoubt_core::message::*;
use redoubt_core::*;

mod common;
use common::*;

const MARK: &[u8] = b"SECRET-";

fn holds_mark(bytes: &[u8]) -> bool {
    bytes.windows(MARK.len()).any(|w| w == MARK)
}

/// Runs ten operations of each of two live clients carrying a marked value; returns the
/// cluster after every one completed.
fn marked_workload(mode: KeyMode, confidential: bool, read_only_reads: bool) -> Cluster {
    let mut b = Cluster::builder(1)
        .live_client(7)
        .live_client(8)
        .config(|c| {
            c.confidential_bodies = confidential;
            c.checkpoint_interval = 8;
            c.log_size = 16;
        });
    if mode == KeyMode::Session {
        b = b.session_keys();
    }
    let mut c = b.build();
    c.run(50); // session keys exchanged
    for i in 0..10u32 {
        for client in [7, 8] {
            let read = read_only_reads && i % 2 == 1;
            let op = format!("{}SECRET-{client}-{i}", if read { "read:" } else { "" }).into_bytes();
            let ts = c.invoke_as(client, &op, read);
            assert!(
                c.run_until(5_000, |c| c.completed(client, ts)),
                "client {client} op {i} completes ({mode:?}, confidential {confidential})"
            );
            let done = c
                .completions(client)
                .into_iter()
                .find(|d| d.timestamp == ts)
                .expect("completed");
            assert_eq!(done.refused, None);
            assert_eq!(done.result, op, "the client reads its result in clear");
        }
    }
    c
}

#[test]
fn no_frame_holds_a_value_in_clear_and_every_result_comes_back() {
    for mode in [KeyMode::Static, KeyMode::Session] {
        let c = marked_workload(mode, true, false);
        let leaks = c.sent().iter().filter(|e| holds_mark(&e.bytes)).count();
        assert_eq!(leaks, 0, "{mode:?}: frames with a value in clear");
        assert!(c.sent().len() > 100);
        // Every replica opened each client's session once through its key holder.
        for i in 0..4 {
            assert_eq!(c.replica(i).stats.body_sessions_opened, 2, "replica {i}");
        }
    }
}

#[test]
fn the_check_fails_when_bodies_travel_in_clear() {
    // The same workload without sealing: the scan above finds the values (it can fail).
    let c = marked_workload(KeyMode::Static, false, false);
    assert!(c.sent().iter().filter(|e| holds_mark(&e.bytes)).count() > 20);
}

#[test]
fn a_session_renewed_with_the_keys_still_opens_and_old_sessions_stop_working() {
    let mut c = Cluster::builder(1)
        .session_keys()
        .live_client(7)
        .config(|c| {
            c.confidential_bodies = true;
            c.key_refresh_ms = 1_000;
            c.client_key_lifetime_ms = 2_000;
        })
        .build();
    c.run(50);
    for i in 0..6 {
        let ts = c.invoke(7, format!("SECRET-{i}").as_bytes());
        assert!(c.run_until(5_000, |c| c.completed(7, ts)));
        c.run(700); // past a key refresh every other operation
    }
    let client = c.client(7);
    assert!(
        client.stats.body_sessions >= 3,
        "{} sessions",
        client.stats.body_sessions
    );
    assert!(c.completions(7).iter().all(|d| d.refused.is_none()));
    assert_eq!(c.sent().iter().filter(|e| holds_mark(&e.bytes)).count(), 0);
}

#[test]
fn a_batch_waits_for_its_body_session_from_the_key_holder_and_runs_when_it_answers() {
    // Replica 1's key holder holds its answers back: replica 1 opens no session, so it runs
    // nothing of client 7, and the other three answer the client. (Opened inside `handle`,
    // as before, the session would not wait for the held answer.)
    let mut c = Cluster::builder(1)
        .session_keys()
        .live_client(7)
        .config(|c| c.confidential_bodies = true)
        .build();
    c.run(50);
    c.hold_key_holder(1);
    let ts = c.invoke(7, b"SECRET-1");
    assert!(c.run_until(5_000, |c| c.completed(7, ts)));
    let read = c.invoke_as(7, b"read:SECRET-1", true);
    assert!(c.run_until(5_000, |c| c.completed(7, read)));
    c.run(200);
    assert_eq!(c.replica(1).stats.requests_executed, 0);
    assert_eq!(c.replica(1).stats.body_sessions_opened, 0);
    assert!(c.replica(0).stats.requests_executed >= 1);
    // The answer comes: the batches that waited run.
    c.release_key_holder(1);
    c.run(200);
    assert_eq!(c.replica(1).stats.body_sessions_opened, 1);
    assert!(c.replica(1).stats.requests_executed >= 1);
    assert_eq!(
        c.replica(1).last_executed(),
        c.replica(0).last_executed(),
        "replica 1 caught up"
    );
}

/// Client 9 (scripted, faulty) sends `op` to every replica; returns the results of the
/// replies it got, per replica.
fn results_for(op: Vec<u8>) -> Vec<Vec<u8>> {
    let mut c = Cluster::builder(1)
        .config(|c| c.confidential_bodies = true)
        .build();
    c.advance(1);
    let sr = c.request(9, 1, &op);
    for r in 0..4 {
        c.send(client(9), replica(r), sr.clone());
    }
    c.deliver_all();
    let results: Vec<Vec<u8>> = c
        .sent()
        .iter()
        .filter(|e| e.to == client(9))
        .filter_map(|e| match &e.msg {
            Message::Client(ClientMessage::Reply(m)) if !m.digest_only => Some(m.result.clone()),
            _ => None,
        })
        .collect();
    // The request ran (in order) at every replica, without touching the service.
    for i in 0..4 {
        assert_eq!(c.replica(i).stats.requests_executed, 1);
        assert_eq!(c.replica(i).stats.bodies_refused, 1);
        assert_eq!(appended(c.replica(i).state()), 0);
    }
    results
}

#[test]
fn an_operation_that_does_not_open_is_refused_alike_by_every_replica() {
    // Not sealed at all, a session that is no X25519 point, a ciphertext under a session
    // that opens but with a forged tag.
    let (enc, _) =
        redoubt_crypto::body::establish(&executors().public(), &keys::body_info(9), [1; 32])
            .unwrap();
    let mut forged = vec![bodies::SEALED];
    forged.extend_from_slice(&enc);
    forged.extend_from_slice(&[7; 40]);
    let mut not_a_point = vec![bodies::SEALED];
    not_a_point.extend_from_slice(&[0; 32]);
    not_a_point.extend_from_slice(&[7; 40]);
    for op in [b"SECRET-clear".to_vec(), not_a_point, forged] {
        let results = results_for(op);
        assert!(!results.is_empty());
        assert!(results.iter().all(|r| r == &results[0]), "{results:?}");
        assert_eq!(results[0][0], REFUSED);
    }
}

#[test]
fn read_only_answers_are_sealed_too() {
    let c = marked_workload(KeyMode::Session, true, true);
    // Answered on the fast path, not ordered.
    assert!(c.completions(7).iter().all(|d| d.latency_ms < 20));
    assert_eq!(c.client(7).stats.fallbacks, 0);
    assert_eq!(c.sent().iter().filter(|e| holds_mark(&e.bytes)).count(), 0);
}

/// A cluster (checkpoints every 4, windows of 8) in which replica 3 was cut off while client
/// 7 ran 30 marked operations: two log windows behind, it must fetch state once let back in
/// (through the returned cut).
fn replica_3_left_behind(confidential: bool, mode: KeyMode) -> (Cluster, Rule) {
    let mut b = Cluster::builder(1).live_client(7).config(|c| {
        c.confidential_bodies = confidential;
        c.checkpoint_interval = 4;
        c.log_size = 8;
    });
    if mode == KeyMode::Session {
        b = b.session_keys();
    }
    let mut c = b.build();
    c.run(50);
    let cut = c.isolate(3);
    for i in 0..30 {
        let ts = c.invoke(7, format!("SECRET-{i}").as_bytes());
        assert!(c.run_until(5_000, |c| c.completed(7, ts)));
    }
    (c, cut)
}

/// A replica cut off while the others move two log windows on fetches their state: the pages
/// and the reply table come back sealed under its state session, and it catches up.
#[test]
fn state_transfer_answers_are_sealed() {
    for confidential in [true, false] {
        let (mut c, cut) = replica_3_left_behind(confidential, KeyMode::Static);
        c.unblock(cut);
        let caught_up = c.run_until(20_000, |c| c.replica(3).stats.state_transfers > 0);
        assert!(
            caught_up,
            "replica 3 fetched state (confidential {confidential})"
        );
        let clear = c
            .sent()
            .iter()
            .filter(|e| e.kind() == "state-data" && holds_mark(&e.bytes))
            .count();
        if confidential {
            assert_eq!(clear, 0, "state answers with a value in clear");
            assert_eq!(c.sent().iter().filter(|e| holds_mark(&e.bytes)).count(), 0);
        } else {
            assert!(
                clear > 0,
                "the scan finds pages in clear when bodies are not sealed"
            );
        }
    }
}

/// With session keys both ends of a sealed state transfer ask their key holders as effects:
/// the fetching replica for its session's randomness, the serving replicas for the key of
/// that session. While the key holders keep those answers back nothing is fetched and the
/// replicas go on handling inputs; once the fetcher's answers, its FETCH goes out and waits
/// at the servers; once theirs answer, it is answered and the replica catches up.
#[test]
fn a_sealed_state_transfer_waits_for_the_key_holders_at_both_ends() {
    use redoubt_core::holder::HolderRequest;
    let (mut c, cut) = replica_3_left_behind(true, KeyMode::Session);
    c.hold_key_holder_calls(3, |call| matches!(call.request, HolderRequest::FreshKey));
    for r in 0..3 {
        c.hold_key_holder_calls(r, |call| {
            matches!(call.request, HolderRequest::OpenState { .. })
        });
    }
    let from = c.sent().len();
    c.unblock(cut);
    let fetches = |c: &Cluster| {
        c.sent()[from..]
            .iter()
            .filter(|e| e.from == Principal::Replica(3) && e.kind() == "fetch")
            .count()
    };
    c.run(3_000);
    assert_eq!(fetches(&c), 0, "no FETCH without a state session");
    assert_eq!(c.replica(3).stats.state_transfers, 0);
    c.release_key_holder(3);
    c.run(2_000);
    assert!(fetches(&c) > 0, "the FETCH went out with the answer");
    assert_eq!(
        c.replica(3).stats.state_transfers,
        0,
        "the servers wait for their key holders"
    );
    for r in 0..3 {
        c.release_key_holder(r);
    }
    assert!(c.run_until(20_000, |c| c.replica(3).stats.state_transfers > 0));
    assert_eq!(c.sent().iter().filter(|e| holds_mark(&e.bytes)).count(), 0);
}
