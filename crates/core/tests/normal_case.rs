//! The normal case: who replies to a client and with what (quiet primary, tentative and
//! committed replies, digest replies), and the quorums of agreement at n = 7.
//!
//! The two reply tests come from `regressions.rs` (names unchanged).

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
            (Principal::Replica(r), Message::Client(ClientMessage::Reply(m))) => {
                Some((r, m.clone()))
            }
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

/// n = 7 (f = 2), one backup (6) live, the others scripted: it prepares on the pre-prepare
/// and 2f PREPAREs (its own among them), not one fewer, and executes on 2f+1 COMMITs (its
/// own among them), not one fewer.
#[test]
fn at_n_7_a_backup_prepares_on_2f_prepares_and_commits_on_2f_plus_1_commits() {
    let mut c = Cluster::builder(2)
        .live([6])
        .config(|c| c.tentative_execution = false)
        .build();
    let pp = pre_prepare(0, 1, vec![c.request(7, 1, b"op")]);
    let d = pp.digest;
    let own = c.receive(6, 0, pp).prepare().expect("its own PREPARE");
    assert!(own.doubts.is_empty());
    for s in [1, 2] {
        let out = c.receive(6, s, prepare(0, 1, d, s));
        assert!(!out.commits(), "prepared on {} PREPAREs", s + 1);
    }
    let out = c.receive(6, 3, prepare(0, 1, d, 3));
    assert!(out.commits(), "prepared on 2f PREPAREs");
    for s in [0, 1, 2] {
        c.receive(6, s, commit(0, 1, d, s));
        assert_eq!(
            c.replica(6).last_executed(),
            0,
            "executed on {} COMMITs",
            s + 2
        );
    }
    c.receive(6, 3, commit(0, 1, d, 3));
    assert_eq!(c.replica(6).last_executed(), 1, "committed on 2f+1 COMMITs");
    assert_eq!(appended(c.replica(6).state()), 2);
}

/// n = 7 (f = 2) with replicas 5 and 6 silent: a client's request commits at the five
/// others. With replica 4 cut off as well, the four left (2f) can neither commit it nor
/// change view, however long they run; once replica 4 is back, it commits.
#[test]
fn at_n_7_a_request_commits_at_2f_plus_1_replicas_and_not_at_2f() {
    let mut c = seven_with_two_silent();
    let done = |c: &Cluster| !c.completions(7).is_empty();
    let ts = c.invoke(7, b"op");
    assert!(c.run_until(5_000, done), "five replicas commit");
    assert_eq!(c.completions(7)[0].timestamp, ts);
    assert_eq!(c.completions(7)[0].result, b"op");
    c.run(100);
    for i in 0..5 {
        assert_eq!(c.replica(i).last_executed(), 1, "replica {i}");
        assert_eq!(appended(c.replica(i).state()), 2, "replica {i}");
    }

    let cut = c.isolate(4);
    let ts = c.invoke(7, b"op2");
    let executed = |c: &Cluster| c.live().any(|r| r.last_executed() > 1);
    assert!(!c.run_until(30_000, executed), "executed by 2f replicas");
    assert!(!c.completed(7, ts));
    assert!(
        c.sent()
            .iter()
            .any(|e| matches!(&e.msg, Message::Pbft(PbftMessage::Prepare(p)) if p.seq == 2)),
        "the request was proposed"
    );
    assert!(
        !(0..4).any(|i| c
            .events(i)
            .iter()
            .any(|e| matches!(e, Event::NewViewInstalled { .. }))),
        "a view installed by 2f replicas"
    );
    completes_once_lifted(&mut c, cut, ts, 5);
}

/// n = 7 (f = 2): replicas 5 and 6 silent, client 7 live, no tentative execution.
fn seven_with_two_silent() -> Cluster {
    Cluster::builder(2)
        .scripted([5, 6])
        .live_client(7)
        .config(|c| c.tentative_execution = false)
        .build()
}

/// Once `rule` is lifted, client 7's request at `ts` completes, and replicas 0 to 4 end up
/// holding `bytes` bytes of operations.
fn completes_once_lifted(c: &mut Cluster, rule: Rule, ts: u64, bytes: u64) {
    c.unblock(rule);
    assert!(c.run_until(120_000, |c| c.completed(7, ts)), "2f+1 again");
    c.run(100);
    for i in 0..5 {
        assert_eq!(appended(c.replica(i).state()), bytes, "replica {i}");
    }
}

/// n = 7 (f = 2) with replicas 5 and 6 silent and replica 4's COMMITs lost: the batch
/// prepares at all five, but the four others get 2f COMMITs (their own among them) and do
/// not execute it, whatever view they move to; replica 4 gets 2f+1 and does. Once replica
/// 4's COMMITs flow again, the request completes.
#[test]
fn at_n_7_2f_commits_do_not_commit_a_request() {
    let mut c = seven_with_two_silent();
    let lost = c.block(|e| e.from == replica(4) && e.kind() == "commit");
    let ts = c.invoke(7, b"op");
    assert!(!c.run_until(30_000, |c| c.completed(7, ts)), "completed");
    for i in 0..4 {
        assert_eq!(c.replica(i).last_executed(), 0, "replica {i} executed");
        let committed = c.sent().iter().any(|e| {
            e.from == replica(i)
                && matches!(&e.msg, Message::Pbft(PbftMessage::Commit(m)) if m.seq == 1)
        });
        assert!(committed, "replica {i} prepared and sent its COMMIT");
    }
    assert_eq!(c.replica(4).last_executed(), 1, "replica 4 got 2f+1");
    completes_once_lifted(&mut c, lost, ts, 2);
}

/// COMMITs of (from, seq) sent so far.
fn commits_sent(c: &Cluster) -> Vec<(Principal, u64)> {
    c.sent()
        .iter()
        .filter_map(|e| match &e.msg {
            Message::Pbft(PbftMessage::Commit(m)) => Some((e.from, m.seq)),
            _ => None,
        })
        .collect()
}

/// Four replicas executing one-request batches tentatively and holding their COMMITs back.
fn deferring_commits() -> Cluster {
    Cluster::builder(1)
        .config(|c| {
            c.tentative_execution = true;
            c.tentative_batch_max = 1;
            c.defer_tentative_commits = true;
        })
        .build()
}

#[test]
fn commits_of_tentative_batches_ride_with_the_next_batch_or_leave_on_a_tick() {
    let mut c = deferring_commits();
    c.advance(1);
    let first = c.request(7, 1, b"put");
    c.send(client(7), replica(0), first);
    c.deliver_all();
    // Executed tentatively and answered at every replica; no COMMIT left yet.
    assert!(c.completed(7, 1) || c.sent().iter().any(|e| e.to == client(7)));
    assert!(commits_sent(&c).is_empty(), "{:?}", commits_sent(&c));
    // The next batch: each replica's COMMIT for n1 goes out just before its first message
    // of n2 (the pre-prepare from the primary, the PREPAREs from the backups), in the same
    // turn, and n1 commits everywhere.
    let second = c.request(7, 2, b"put");
    c.send(client(7), replica(0), second);
    c.deliver_all();
    let sent = c.sent().to_vec();
    for r in 0..4u32 {
        let from = replica(r);
        let commit1 = sent.iter().position(|e| {
            e.from == from && matches!(&e.msg, Message::Pbft(PbftMessage::Commit(m)) if m.seq == 1)
        });
        let first_of_2 = sent.iter().position(|e| {
            e.from == from
                && matches!(&e.msg,
                    Message::Pbft(PbftMessage::PrePrepare(m)) if m.seq == 2)
                || matches!(&e.msg, Message::Pbft(PbftMessage::Prepare(m)) if e.from == from && m.seq == 2)
        });
        let (Some(a), Some(b)) = (commit1, first_of_2) else {
            panic!(
                "replica {r}: commit of n1 at {commit1:?}, first message of n2 at {first_of_2:?}"
            );
        };
        assert!(
            a < b,
            "replica {r}: the COMMIT for n1 left after its n2 message"
        );
    }
    assert!(commits_sent(&c).iter().all(|(_, s)| *s == 1));
    // Nothing follows n2: its COMMITs leave on the next tick.
    c.advance(5);
    c.tick_all();
    c.deliver_all();
    let of_2: std::collections::BTreeSet<(Principal, Principal)> = c
        .sent()
        .iter()
        .filter(|e| matches!(&e.msg, Message::Pbft(PbftMessage::Commit(m)) if m.seq == 2))
        .map(|e| (e.from, e.to))
        .collect();
    assert_eq!(
        of_2.len(),
        4 * 3,
        "each replica's COMMIT for n2 to the three others"
    );
}

/// A client that reads right after its write (a file system's stat after a write) waits for
/// the write to commit at the replicas it reads from. Held until the next batch or tick, the
/// COMMITs would make it wait for a tick (1-5 ms in the field); a read that waits for them
/// sends them at once, and is answered as soon as the batch commits.
#[test]
fn a_read_behind_a_tentative_batch_sends_the_held_commits_at_once() {
    let mut c = deferring_commits();
    c.advance(1);
    let write = c.request(7, 1, b"put");
    c.send(client(7), replica(0), write);
    c.deliver_all();
    assert!(commits_sent(&c).is_empty(), "{:?}", commits_sent(&c));
    let read = c.read_request(7, 2, b"read:x");
    for r in 0..4 {
        c.send(client(7), replica(r), read.clone());
    }
    c.deliver_all();
    assert_eq!(
        commits_sent(&c).len(),
        4 * 3,
        "each replica's held COMMIT for n1 left with the read, before any tick"
    );
    let answered: std::collections::BTreeSet<Principal> = c
        .sent()
        .iter()
        .filter(|e| {
            e.to == client(7)
                && matches!(&e.msg, Message::Client(ClientMessage::Reply(r)) if r.timestamp == 2)
        })
        .map(|e| e.from)
        .collect();
    assert_eq!(
        answered.len(),
        4,
        "every replica answered the read: {answered:?}"
    );
}

#[test]
fn commits_of_batches_that_execute_once_committed_are_never_held() {
    for (tentative_batch_max, defer) in [(0, true), (1, false)] {
        let mut c = Cluster::builder(1)
            .config(|c| {
                c.tentative_execution = true;
                c.tentative_batch_max = tentative_batch_max;
                c.defer_tentative_commits = defer;
            })
            .build();
        c.advance(1);
        let sr = c.request(7, 1, b"put");
        c.send(client(7), replica(0), sr);
        c.deliver_all();
        assert_eq!(
            commits_sent(&c).len(),
            4 * 3,
            "tentative_batch_max {tentative_batch_max}, defer {defer}"
        );
    }
}
