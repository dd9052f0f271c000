//! A replica that lost a client's session key (it recovered, or the key expired) asks the
//! client for it by sending its own NEW-KEY; the client answers with a NEW-KEY for that
//! replica alone, at most once a second per replica, so the other replicas' keys (and the
//! authenticators of requests in flight) stay as they were. A replica's key holder remembers
//! the client NEW-KEYs it admitted across restarts, so a replayed one is refused.

use redoubt_core::keys::Accepted;
use redoubt_core::message::{ClientMessage, RecoveryMessage};
use redoubt_core::*;
use redoubt_crypto::Digest;

mod common;
use common::*;

const CLIENT: u64 = 9;

/// Session keys everywhere, live client 9, replicas 0 to 3 live (`live`) or scripted.
fn cluster(live: &[ReplicaId]) -> Cluster {
    Cluster::builder(1)
        .session_keys()
        .live(live.iter().copied())
        .clients([])
        .live_client(CLIENT)
        .build()
}

/// The outcomes of the client NEW-KEYs scripted replica `r` was delivered.
fn client_keys_taken(c: &Cluster, r: ReplicaId) -> Vec<Result<Accepted, keys::NewKeyError>> {
    c.accepted(replica(r))
        .into_iter()
        .filter(|(from, _)| *from == client(CLIENT))
        .map(|(_, res)| res)
        .collect()
}

#[test]
fn a_replica_that_lost_a_client_key_gets_a_new_one_for_itself_alone() {
    let mut c = cluster(&[]);
    for i in 0..4 {
        c.rekey(replica(i), &[0, 1, 2, 3]);
    }
    // The first tick sends the client's keys to every replica.
    let first = c.tick_client(CLIENT).new_keys();
    assert_eq!(first.len(), 4);
    c.deliver_all();
    for r in 0..4 {
        assert_eq!(client_keys_taken(&c, r), [Ok(Accepted::Client(CLIENT))]);
    }
    let d = Digest::of(b"request");
    let client_mac = |c: &Cluster, r: u32| {
        let mac = c.client(CLIENT).auth().mac_to(replica(r), &d);
        mac.unwrap()
    };
    let verifies =
        |c: &Cluster, r: u32, mac| c.keys(replica(r)).verify_from(client(CLIENT), 0, &d, &mac);
    let mac0 = client_mac(&c, 0);
    assert!(verifies(&c, 0, mac0));

    // Replica 2 recovers: it forgets the client's key and cannot verify it any more.
    c.session_mut(replica(2)).discard_client_keys();
    assert!(!verifies(&c, 2, client_mac(&c, 2)));
    // It asks with its latest NEW-KEY.
    let ask = c.session_mut(replica(2)).latest().unwrap().clone();
    c.advance_to(5_000);
    c.send(replica(2), client(CLIENT), ask.clone());
    c.deliver_all();
    assert!(c.completions(CLIENT).is_empty());
    assert_eq!(c.client(CLIENT).stats.keys_asked, 1);
    c.advance_to(5_001);
    let answer = c.tick_client(CLIENT).new_keys();
    assert_eq!(answer.len(), 1, "one NEW-KEY, to replica 2 only");
    let (to, nk) = &answer[0];
    assert_eq!(*to, replica(2));
    assert_eq!(nk.keys.len(), 1, "it carries replica 2's key alone");
    c.deliver_all();
    assert_eq!(
        client_keys_taken(&c, 2).last(),
        Some(&Ok(Accepted::Client(CLIENT)))
    );
    assert!(verifies(&c, 2, client_mac(&c, 2)));
    // Replica 0's key did not change: a MAC computed before still verifies there.
    assert_eq!(client_mac(&c, 0), mac0);

    // Asking again within a second gets nothing; after it, another key.
    c.advance_to(5_500);
    c.send(replica(2), client(CLIENT), ask);
    c.deliver_all();
    assert!(c.completions(CLIENT).is_empty());
    c.advance_to(5_600);
    assert!(c.tick_client(CLIENT).new_keys().is_empty());
    c.advance_to(6_100);
    let later = c.tick_client(CLIENT).new_keys();
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].0, replica(2));
}

/// A client whose requests go unanswered re-keys at most once every four seconds, and sends
/// its current NEW-KEY again with the retransmissions in between: a replica that lost it, or
/// got it after the request it preceded, can then check the next retransmission. (A fresh
/// key with every retransmission kept a lossy link racing each new key against its request.)
#[test]
fn a_stalled_client_resends_its_current_key_between_rekeys() {
    let mut c = cluster(&[]);
    let first = c.tick_client(CLIENT).new_keys();
    assert_eq!(first.len(), 4);
    let counter0 = first[0].1.counter;
    c.advance_to(10);
    c.invoke(CLIENT, b"op");
    // No replica answers for 20 s.
    let mut sent: Vec<(u64, u64)> = Vec::new(); // (time, counter) of each NEW-KEY to replica 0
    for t in (20..20_000).step_by(10) {
        c.advance_to(t);
        for (to, nk) in c.tick_client(CLIENT).new_keys() {
            if to == replica(0) {
                sent.push((t, nk.counter));
            }
        }
    }
    let resent = sent.iter().filter(|(_, c)| *c == counter0).count();
    assert!(resent >= 1, "the first key is sent again: {sent:?}");
    let mut counters: Vec<u64> = sent.iter().map(|(_, c)| *c).collect();
    counters.dedup();
    assert!(counters.len() >= 2, "and replaced in time: {sent:?}");
    // New keys at least four seconds apart.
    let mut firsts: Vec<u64> = Vec::new();
    let mut last = counter0;
    for (t, c) in &sent {
        if *c != last {
            firsts.push(*t);
            last = *c;
        }
    }
    for w in firsts.windows(2) {
        assert!(
            w[1] - w[0] >= 4_000,
            "re-keyed {} ms apart: {sent:?}",
            w[1] - w[0]
        );
    }
}

/// No live replica; the client's periodic re-key is due every second.
fn rekeying_every_second() -> Cluster {
    Cluster::builder(1)
        .session_keys()
        .live([])
        .clients([])
        .live_client(CLIENT)
        .config(|cfg| cfg.key_refresh_ms = 1_000)
        .build()
}

/// A periodic re-key waits for the request in flight (answers sent under the keys it would
/// replace no longer verify at the client), and a re-key that does go out with a
/// retransmission brings the next retransmission within one round trip instead of after the
/// backed-off timeout: the bounded-delay sweep found clients waiting out a full back-off for
/// answers they had dropped.
#[test]
fn a_client_re_keys_between_requests_and_listens_again_soon_after_a_re_key() {
    let mut c = rekeying_every_second();
    let first = c.tick_client(CLIENT).new_keys();
    let counter0 = first[0].1.counter;
    c.advance_to(10);
    c.invoke(CLIENT, b"op");
    // No replica answers. Record each fresh NEW-KEY and each request to replica 0.
    let mut rekeys: Vec<u64> = Vec::new();
    let mut requests: Vec<u64> = Vec::new();
    let mut last = counter0;
    for t in (20..12_000).step_by(5) {
        c.advance_to(t);
        let out = c.tick_client(CLIENT);
        for (to, nk) in out.new_keys() {
            if to == replica(0) && nk.counter != last {
                last = nk.counter;
                rekeys.push(t);
            }
        }
        let to_r0 = out
            .messages()
            .into_iter()
            .filter(|(to, m)| {
                *to == Some(replica(0)) && matches!(m, Message::Client(ClientMessage::Request(_)))
            })
            .count();
        if to_r0 > 0 {
            requests.push(t);
        }
    }
    assert!(!rekeys.is_empty(), "re-keyed while stalled: {requests:?}");
    assert!(
        rekeys[0] >= 4_000,
        "the periodic re-key (due at 1 s) waited for the request in flight, to the stall \
         limit: {rekeys:?}"
    );
    let rtt = ClientTiming::default().initial_rtt_ms;
    for t in &rekeys {
        let next = requests.iter().find(|r| *r > t).copied();
        assert!(
            next.is_some_and(|n| n <= t + rtt + 5),
            "after the re-key at {t} ms the request went again at {next:?}, not within one \
             round trip ({rtt} ms): {requests:?}"
        );
    }

    // Between requests the periodic re-key goes out on time.
    let mut idle = rekeying_every_second();
    let counter0 = idle.tick_client(CLIENT).new_keys()[0].1.counter;
    idle.advance_to(1_000);
    let due = idle.tick_client(CLIENT).new_keys();
    assert!(
        due.iter().any(|(_, nk)| nk.counter != counter0),
        "an idle client re-keys when due"
    );
}

/// Review finding 3: a replica restarted from its journal accepted again a client NEW-KEY
/// recorded before the restart (its record of accepted counters was volatile), reinstating a
/// key an attacker may know and no longer asking the client for a fresh one.
#[test]
fn a_restarted_replica_refuses_a_client_new_key_recorded_before_the_restart() {
    let mut c = cluster(&[0]);
    let holds_key = |c: &Cluster| {
        let keys = c.replica(0).auth().session_ref().unwrap();
        keys.can_send(client(CLIENT))
    };
    let recorded = c.tick_client(CLIENT).frames_to(replica(0));
    assert_eq!(recorded.len(), 1);
    c.advance_to(1);
    c.receive_frame(0, &recorded[0]);
    assert!(holds_key(&c));
    assert_eq!(c.replica(0).stats.new_keys_accepted, 1);

    // The replica restarts from its journal with a new key holder over the same memory.
    let journal = c.journal(0).to_vec();
    c.restart(0, &journal);
    assert!(!holds_key(&c));
    c.advance_to(2_000);
    let out = c.receive_frame(0, &recorded[0]);
    assert!(
        out.events().iter().any(|e| matches!(
            e,
            Event::Rejected {
                reason: Reject::Stale,
                ..
            }
        )),
        "the replay is refused as stale: {:?}",
        out.effects
    );
    assert!(!holds_key(&c), "the recorded key is not reinstated");
    assert_eq!(c.replica(0).stats.new_keys_accepted, 0);

    // The client's next key for it is accepted.
    c.client_mut(CLIENT).refresh_keys_soon(0);
    c.advance_to(3_000);
    let fresh = c.tick_client(CLIENT).frames_to(replica(0));
    assert_eq!(fresh.len(), 1);
    c.advance_to(3_001);
    c.receive_frame(0, &fresh[0]);
    assert!(holds_key(&c));
    assert_eq!(c.replica(0).stats.new_keys_accepted, 1);
}

/// A replica holding an older key of a client than the one the client's request was
/// authenticated with (the client's NEW-KEY to it was lost, or came while it was paused)
/// asks for the client's keys as one that holds none does. Before, it could not vouch for
/// the client's requests until the client's next periodic re-key, and as the primary left
/// every one of them to the backups' relays (simulator seed 35375, for 15 s after a pause).
#[test]
fn a_replica_holding_an_older_client_key_asks_for_the_new_one() {
    let mut c = refreshing_every_5_s_after_one_operation();
    // The periodic NEW-KEY at 5 s never reaches the primary.
    let lost = c.block(|e| {
        e.from == client(CLIENT)
            && e.to == replica(0)
            && matches!(e.msg, Message::Recovery(RecoveryMessage::NewKey(_)))
    });
    c.advance_to(5_100);
    c.run(100);
    c.unblock(lost);
    assert!(
        c.dropped().iter().any(|e| e.to == replica(0)),
        "the re-key happened and its NEW-KEY to replica 0 was lost"
    );
    let d = Digest::of(b"request");
    let stale = |c: &Cluster| {
        let mac = c.client(CLIENT).auth().mac_to(replica(0), &d).unwrap();
        !c.keys(replica(0)).verify_from(client(CLIENT), 0, &d, &mac)
    };
    assert!(stale(&c));
    let asked = c.replica(0).stats.client_keys_asked;
    let ts = c.invoke(CLIENT, b"second");
    assert!(c.run_until(3_000, |c| c.completed(CLIENT, ts)));
    c.run(1_500);
    assert!(
        c.replica(0).stats.client_keys_asked > asked,
        "replica 0 asked"
    );
    assert!(
        !stale(&c),
        "replica 0 holds the client's current key before its next periodic re-key (10 s)"
    );
}

/// While a replica's key holder admits a client's NEW-KEY, a request of the client under the
/// new key does not authenticate yet: the replica does not ask the client for its keys again
/// (each ask makes the client re-key, which starts another admission: under load the asks and
/// re-keys chased each other), and the request is vouched for once the key is installed.
#[test]
fn a_replica_admitting_a_client_key_does_not_ask_for_it_again() {
    let mut c = refreshing_every_5_s_after_one_operation();
    // The periodic re-key at 5 s: replica 0's key holder is slow to admit it.
    c.hold_key_holder(0);
    c.advance_to(5_100);
    c.run(100);
    let asked = c.replica(0).stats.client_keys_asked;
    let ts = c.invoke(CLIENT, b"second");
    c.run(300);
    assert_eq!(
        c.replica(0).stats.client_keys_asked,
        asked,
        "no ask while the admission is under way"
    );
    c.release_key_holder(0);
    assert!(c.run_until(3_000, |c| c.completed(CLIENT, ts)));
    assert_eq!(c.replica(0).stats.client_keys_asked, asked);
}

/// Session keys refreshed every 5 s, one live client whose first operation completed.
fn refreshing_every_5_s_after_one_operation() -> Cluster {
    let mut c = Cluster::builder(1)
        .session_keys()
        .clients([])
        .live_client(CLIENT)
        .config(|cfg| cfg.key_refresh_ms = 5_000)
        .build();
    c.run(50);
    let ts = c.invoke(CLIENT, b"first");
    assert!(c.run_until(1_000, |c| c.completed(CLIENT, ts)));
    c
}

/// A new client's first request comes right behind its NEW-KEY, while the replicas' key
/// holders still admit it: the replicas hold the request, read it again once the key is in,
/// and it completes with no retransmission (before, it was refused and the client waited
/// out its first retransmission timeout, 0.4 s per `redoubt kv put`).
#[test]
fn a_new_clients_first_request_waits_for_its_key_not_for_a_timeout() {
    let mut c = Cluster::builder(1)
        .session_keys()
        .clients([])
        .live_client(CLIENT)
        .build();
    for r in 0..4 {
        c.hold_key_holder(r);
    }
    c.run(50);
    let ts = c.invoke(CLIENT, b"first");
    c.run(20);
    assert!(!c.completed(CLIENT, ts), "no key is in yet");
    for r in 0..4 {
        c.release_key_holder(r);
    }
    assert!(c.run_until(50, |c| c.completed(CLIENT, ts)));
    let done = c.completions(CLIENT);
    assert_eq!(done[0].retransmissions, 0, "{:?}", done[0]);
    let held: u64 = (0..4)
        .map(|r| c.replica(r).stats.frames_held_for_keys)
        .sum();
    assert!(held >= 1, "the primary held the request");
    for r in 0..4 {
        assert_eq!(c.replica(r).stats.client_keys_asked, 0);
    }
}

/// The same when the client's request reaches a backup (the client believes an earlier
/// view) and the backup relays it to the primary before the primary's key holder admitted
/// the client's NEW-KEY: the primary holds the relayed request too.
#[test]
fn a_relayed_request_waits_for_its_clients_key_not_for_a_timeout() {
    let mut c = Cluster::builder(1)
        .session_keys()
        .clients([])
        .live_client(CLIENT)
        .build();
    c.run(50);
    c.input(0, Input::StepDown);
    assert!(c.run_until(2_000, |c| (0..4).all(|r| c.replica(r).view() == 1)));
    // The client (in view 0 still) re-keys with every replica before its next request.
    c.advance_to(5_000);
    for r in 0..4 {
        c.client_mut(CLIENT).refresh_keys_soon(r);
    }
    // The backup it sends to admits at once; the primary's key holder is slow.
    c.hold_key_holder(1);
    let ts = c.invoke(CLIENT, b"after the re-key");
    c.run(20);
    assert!(!c.completed(CLIENT, ts));
    c.release_key_holder(1);
    assert!(c.run_until(50, |c| c.completed(CLIENT, ts)));
    let done = c.completions(CLIENT);
    assert_eq!(done.last().unwrap().retransmissions, 0, "{done:?}");
    assert!(
        c.replica(1).stats.frames_held_for_keys >= 1,
        "the relayed request waited"
    );
}
