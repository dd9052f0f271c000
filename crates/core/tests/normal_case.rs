//! The normal case: who replies to a client and with what (quiet primary, tentative and
//! committed replies, digest replies).
//!
//! Moved from `regressions.rs` (names unchanged).

use redoubt_core::message::*;
use redoubt_core::*;

mod common;
use common::*;

/// Runs one request of client 7 through four replicas configured by `tune`, delivering
/// every message between them until none is left, and returns which replicas answered the
/// client, and with what.
fn replies_to_one_request(op: &[u8], tune: impl FnOnce(&mut Config)) -> Vec<(u32, Reply)> {
    let mut c = Cluster::builder(1).config(tune).build();
    c.advance(1);
    let sr = c.request(7, 1, op);
    c.send(client(7), replica(0), sr);
    c.deliver_all();
    let mut replies: Vec<(u32, Reply)> = c
        .sent()
        .iter()
        .filter(|e| e.to == client(7))
        .filter_map(|e| match (e.from, &e.msg) {
            (Principal::Replica(r), Message::Reply(m)) => Some((r, m.clone())),
            _ => None,
        })
        .collect();
    replies.sort_by_key(|(r, _)| *r);
    replies
}

#[test]
fn a_quiet_primary_leaves_first_replies_to_the_backups_only_for_committed_replies() {
    let who = |rs: &[(u32, Reply)]| rs.iter().map(|(r, _)| *r).collect::<Vec<_>>();
    // Committed replies (f+1 needed), quiet primary: the three backups answer, nobody else.
    let quiet = replies_to_one_request(b"put", |c| {
        c.tentative_execution = false;
        c.primary_replies = false;
    });
    assert_eq!(who(&quiet), vec![1, 2, 3]);
    assert!(quiet
        .iter()
        .all(|(_, m)| !m.tentative && m.result == b"put"));
    // The same with the primary replying: all four.
    let all = replies_to_one_request(b"put", |c| {
        c.tentative_execution = false;
        c.primary_replies = true;
    });
    assert_eq!(who(&all), vec![0, 1, 2, 3]);
    // A batch that executes tentatively (2f+1 needed): all four answer, quiet or not.
    let tentative = replies_to_one_request(b"put", |c| {
        c.tentative_execution = true;
        c.tentative_batch_max = 1;
        c.primary_replies = false;
    });
    assert_eq!(who(&tentative), vec![0, 1, 2, 3]);
    // (how many execute it tentatively depends on the order votes arrive in: some commit
    // first)
    assert!(tentative.iter().any(|(_, m)| m.tentative));
    // A batch over `tentative_batch_max` executes once committed, and the primary keeps
    // quiet: the three backups answer with committed replies.
    let larger = replies_to_one_request(b"put", |c| {
        c.tentative_execution = true;
        c.tentative_batch_max = 0;
        c.primary_replies = false;
    });
    assert_eq!(who(&larger), vec![1, 2, 3]);
    assert!(larger.iter().all(|(_, m)| !m.tentative));
}

#[test]
fn with_a_quiet_primary_a_backup_sends_the_full_result() {
    // Results of 32 bytes or more go as digests from all but one designated replica; with a
    // quiet primary that replica is a backup, whatever the request.
    for ts in 0..64 {
        let d = designated_replier_except(7, ts, 4, 0);
        assert!((1..4).contains(&d), "{d}");
        assert_ne!(designated_replier_except(7, ts, 4, 2), 2);
    }
    // `Svc` answers with the operation itself: 40 bytes here.
    let long = [b'x'; 40];
    let replies = replies_to_one_request(&long, |c| {
        c.tentative_execution = false;
        c.primary_replies = false;
    });
    let full: Vec<u32> = replies
        .iter()
        .filter(|(_, m)| !m.digest_only)
        .map(|(r, _)| *r)
        .collect();
    // Client 7's request at timestamp 1 hashes to replica 0 among all four: a quiet primary
    // chosen as the full replier would leave no full result at all.
    assert_eq!(designated_replier(7, 1, 4), 0);
    assert_eq!(full.len(), 1, "one full result, from a backup: {full:?}");
    assert_eq!(replies.len(), 3);
    assert!(replies
        .iter()
        .all(|(_, m)| m.digest_only || m.result == long));
}
