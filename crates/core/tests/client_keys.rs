//! A replica that lost a client's session key (it recovered, or the key expired) asks the
//! client for it by sending its own NEW-KEY; the client answers with a NEW-KEY for that
//! replica alone, at most once a second per replica, so the other replicas' keys (and the
//! authenticators of requests in flight) stay as they were. A replica's key holder remembers
//! the client NEW-KEYs it admitted across restarts, so a replayed one is refused.

use redoubt_core::auth::seal;
use redoubt_core::keys::Accepted;
use redoubt_core::keys::{AdmittedCounters, LocalHolder};
use redoubt_core::message::{decode_body, decode_frame};
use redoubt_core::*;
use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::Digest;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

mod common;
use common::{fresh_state, Svc};

const CLIENT: u64 = 9;

fn principals() -> Vec<Principal> {
    (0..4)
        .map(Principal::Replica)
        .chain([Principal::Client(CLIENT)])
        .collect()
}

/// A key holder's non-volatile memory (its counter and the NEW-KEY counters it admitted),
/// which survives restarts of its principal.
#[derive(Clone, Default)]
struct HolderMemory {
    counter: Arc<AtomicU64>,
    admitted: AdmittedCounters,
}

/// Session keys of principal `i` over the key holder memory `nv`, the `incarnation`-th time.
fn session_over(
    dir: &Arc<Directory>,
    i: usize,
    p: Principal,
    nv: &HolderMemory,
    incarnation: u8,
) -> SessionKeys {
    let holder = LocalHolder::new(
        p,
        HolderSecrets::from_seed(&[i as u8 + 1; 32]),
        dir.clone(),
        nv.counter.clone(),
        nv.admitted.clone(),
        [i as u8 + 100 + incarnation; 32],
    );
    SessionKeys::new(Box::new(holder), dir.clone())
}

fn session(dir: &Arc<Directory>, i: usize, p: Principal) -> SessionKeys {
    session_over(dir, i, p, &HolderMemory::default(), 0)
}

/// Every principal's public key, as the deployment's key directory.
fn directory(ps: &[Principal]) -> Arc<Directory> {
    Arc::new(Directory {
        keys: ps
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, HolderSecrets::from_seed(&[i as u8 + 1; 32]).public()))
            .collect(),
    })
}

/// The client (principal 4) with session keys.
fn session_client(dir: &Arc<Directory>, me: Principal) -> Client<Keys> {
    Client::new(
        Config::new(1),
        ClientTiming::default(),
        CLIENT,
        Keys::Session(session(dir, 4, me)),
    )
}

fn env(t: u64) -> Env {
    Env {
        now_ms: t,
        entropy: t,
    }
}

/// The NEW-KEYs among `effects`: (receiver, message).
fn new_keys(effects: &[Effect]) -> Vec<(Principal, NewKey)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send { to, bytes } => {
                let f = decode_frame(bytes, usize::MAX).ok()?;
                match decode_body(&f.body).ok()? {
                    Message::NewKey(nk) => Some((*to, nk)),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_replica_that_lost_a_client_key_gets_a_new_one_for_itself_alone() {
    let ps = principals();
    let dir = directory(&ps);
    let mut replicas: Vec<SessionKeys> = (0..4).map(|i| session(&dir, i, ps[i])).collect();
    for i in 0..4 {
        let nk = replicas[i].refresh(&ps[..4]).unwrap();
        for (j, r) in replicas.iter_mut().enumerate() {
            if j != i {
                r.accept(&nk, 0).unwrap();
            }
        }
    }
    let mut client = session_client(&dir, ps[4]);
    // The first tick sends the client's keys to every replica.
    let first = new_keys(&client.tick(env(0)));
    assert_eq!(first.len(), 4);
    for (to, nk) in &first {
        let Principal::Replica(r) = to else { panic!() };
        assert_eq!(
            replicas[*r as usize].accept(nk, 0),
            Ok(Accepted::Client(CLIENT))
        );
    }
    let d = Digest::of(b"request");
    let client_mac = |c: &Client<Keys>, r: u32| c.auth().mac_to(Principal::Replica(r), &d).unwrap();
    let mac0 = client_mac(&client, 0);
    assert!(replicas[0].verify_from(ps[4], 0, &d, &mac0));

    // Replica 2 recovers: it forgets the client's key and cannot verify it any more.
    replicas[2].discard_client_keys();
    assert!(!replicas[2].verify_from(ps[4], 0, &d, &client_mac(&client, 2)));
    // It asks with its latest NEW-KEY.
    let ask = seal(
        &replicas[2],
        &Message::NewKey(replicas[2].latest().unwrap().clone()),
        Some(ps[4]),
        4,
    );
    assert_eq!(client.receive(env(5_000), &ask), None);
    assert_eq!(client.keys_asked, 1);
    let answer = new_keys(&client.tick(env(5_001)));
    assert_eq!(answer.len(), 1, "one NEW-KEY, to replica 2 only");
    let (to, nk) = &answer[0];
    assert_eq!(*to, Principal::Replica(2));
    assert_eq!(nk.keys.len(), 1, "it carries replica 2's key alone");
    assert_eq!(replicas[2].accept(nk, 5_001), Ok(Accepted::Client(CLIENT)));
    assert!(replicas[2].verify_from(ps[4], 0, &d, &client_mac(&client, 2)));
    // Replica 0's key did not change: a MAC computed before still verifies there.
    assert_eq!(client_mac(&client, 0), mac0);

    // Asking again within a second gets nothing; after it, another key.
    assert_eq!(client.receive(env(5_500), &ask), None);
    assert!(new_keys(&client.tick(env(5_600))).is_empty());
    let later = new_keys(&client.tick(env(6_100)));
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].0, Principal::Replica(2));
}

/// A client whose requests go unanswered re-keys at most once every four seconds, and sends
/// its current NEW-KEY again with the retransmissions in between: a replica that lost it, or
/// got it after the request it preceded, can then check the next retransmission. (A fresh
/// key with every retransmission kept a lossy link racing each new key against its request.)
#[test]
fn a_stalled_client_resends_its_current_key_between_rekeys() {
    let ps = principals();
    let dir = directory(&ps);
    let mut client = session_client(&dir, ps[4]);
    let first = new_keys(&client.tick(env(0)));
    assert_eq!(first.len(), 4);
    let counter0 = first[0].1.counter;
    client.invoke(env(10), b"op".to_vec(), false).unwrap();
    // No replica answers for 20 s.
    let mut sent: Vec<(u64, u64)> = Vec::new(); // (time, counter) of each NEW-KEY to replica 0
    for t in (20..20_000).step_by(10) {
        for (to, nk) in new_keys(&client.tick(env(t))) {
            if to == Principal::Replica(0) {
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

/// The frames `effects` send to `to`.
fn frames_to(effects: &[Effect], to: Principal) -> Vec<Vec<u8>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send { to: t, bytes } if *t == to => Some(bytes.to_vec()),
            _ => None,
        })
        .collect()
}

/// Review finding 3: a replica restarted from its journal accepted again a client NEW-KEY
/// recorded before the restart (its record of accepted counters was volatile), reinstating a
/// key an attacker may know and no longer asking the client for a fresh one.
#[test]
fn a_restarted_replica_refuses_a_client_new_key_recorded_before_the_restart() {
    let ps = principals();
    let dir = directory(&ps);
    let r0 = Principal::Replica(0);
    let nv = HolderMemory::default();
    let mut replica = Replica::new(
        Config::new(1),
        0,
        Keys::Session(session_over(&dir, 0, r0, &nv, 0)),
        Svc::default(),
        fresh_state(),
    );
    let mut journal: Vec<Record> = Vec::new();
    let mut run = |replica: &mut Replica<Svc, Keys>, t: u64, input: Input<'_>| {
        let effects = replica.handle(env(t), input);
        journal.extend(effects.iter().filter_map(|e| match e {
            Effect::Persist(r) => Some(r.clone()),
            _ => None,
        }));
        effects
    };
    let holds_key = |r: &Replica<Svc, Keys>| r.auth().session_ref().unwrap().can_send(ps[4]);

    let mut client = session_client(&dir, ps[4]);
    let recorded = frames_to(&client.tick(env(0)), r0);
    assert_eq!(recorded.len(), 1);
    run(&mut replica, 1, Input::Receive(&recorded[0]));
    assert!(holds_key(&replica));
    assert_eq!(replica.stats.new_keys_accepted, 1);
    let journal = std::mem::take(&mut journal);

    // The replica restarts from its journal with a new key holder over the same memory.
    let mut replica = Replica::restore(
        Config::new(1),
        0,
        Keys::Session(session_over(&dir, 0, r0, &nv, 1)),
        Svc::default(),
        fresh_state(),
        &journal,
        true,
    )
    .unwrap();
    assert!(!holds_key(&replica));
    let effects = replica.handle(env(2_000), Input::Receive(&recorded[0]));
    assert!(
        effects.iter().any(|e| matches!(
            e,
            Effect::Event(Event::Rejected {
                reason: Reject::Stale,
                ..
            })
        )),
        "the replay is refused as stale: {effects:?}"
    );
    assert!(!holds_key(&replica), "the recorded key is not reinstated");
    assert_eq!(replica.stats.new_keys_accepted, 0);

    // The client's next key for it is accepted.
    client.refresh_keys_soon(0);
    let fresh = frames_to(&client.tick(env(3_000)), r0);
    assert_eq!(fresh.len(), 1);
    replica.handle(env(3_001), Input::Receive(&fresh[0]));
    assert!(holds_key(&replica));
    assert_eq!(replica.stats.new_keys_accepted, 1);
}
