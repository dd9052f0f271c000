//! Regression tests for protocol bugs found in review (each scenario reproduced a bug before
//! its fix): forged view changes relayed on the primary's word, NEW-VIEW messages for far
//! views, ack-quota exhaustion, prepared slots lost across restart, arithmetic on hostile
//! values, and a divergence loop.

use redoubt_core::auth::{request_authenticator, seal};
use redoubt_core::message::*;
use redoubt_core::*;
use redoubt_crypto::{Digest, Mac};

mod common;
use common::{fresh_state, Svc};

fn all() -> Vec<Principal> {
    (0..4)
        .map(Principal::Replica)
        .chain([7, 8, 9].map(Principal::Client))
        .collect()
}
fn keys(p: Principal) -> StaticKeys {
    StaticKeys::derive(b"m", p, all())
}
fn rep(id: u32) -> Replica<Svc, StaticKeys> {
    Replica::new(
        Config::new(1),
        id,
        keys(Principal::Replica(id)),
        Svc::default(),
        fresh_state(),
    )
}
/// Replica 3 rebuilt from its journal `records` over a fresh state (pages checked).
fn restore_r3(records: &[Record]) -> Replica<Svc, StaticKeys> {
    Replica::restore(
        Config::new(1),
        3,
        keys(Principal::Replica(3)),
        Svc::default(),
        fresh_state(),
        records,
        true,
    )
    .unwrap()
}
fn frame(from: u32, to: u32, m: &Message) -> Vec<u8> {
    seal(
        &keys(Principal::Replica(from)),
        m,
        Some(Principal::Replica(to)),
        4,
    )
}
/// PREPARE from `replica` for `digest` at `seq` in view 0.
fn prepare(seq: u64, digest: Digest, replica: u32) -> Message {
    Message::Prepare(Prepare {
        view: 0,
        seq,
        digest,
        replica,
        doubts: Vec::new(),
    })
}
fn env(t: u64) -> Env {
    Env {
        now_ms: t,
        entropy: 1,
    }
}
fn msgs(effs: &[Effect]) -> Vec<(Option<Principal>, Message)> {
    effs.iter()
        .filter_map(|e| match e {
            Effect::Send { to, bytes } => Some((Some(*to), bytes)),
            Effect::Broadcast { bytes } => Some((None, bytes)),
            _ => None,
        })
        .map(|(to, b)| {
            let f = decode_frame(b, usize::MAX).unwrap();
            (to, decode_body(&f.body).unwrap())
        })
        .collect()
}
fn events(effs: &[Effect]) -> Vec<Event> {
    effs.iter()
        .filter_map(|e| {
            if let Effect::Event(ev) = e {
                Some(ev.clone())
            } else {
                None
            }
        })
        .collect()
}
fn my_vc(effs: &[Effect]) -> Option<ViewChange> {
    msgs(effs).into_iter().find_map(|(_, m)| {
        if let Message::ViewChange(v) = m {
            Some(v)
        } else {
            None
        }
    })
}
fn empty_vc(view: u64, r: u32, ck0: Digest) -> ViewChange {
    vc_at_checkpoint(view, r, 0, ck0)
}
/// A VIEW-CHANGE of replica `r` for `view` from checkpoint `seq` (`digest`), claiming nothing.
fn vc_at_checkpoint(view: u64, r: u32, seq: u64, digest: Digest) -> ViewChange {
    ViewChange {
        view,
        replica: r,
        ls: seq,
        checkpoints: vec![(seq, digest)],
        p: vec![],
        q: vec![],
    }
}

fn ck0() -> Digest {
    let mut r = rep(0);
    let z = empty_vc(1, 1, Digest::ZERO);
    r.handle(
        env(0),
        Input::Receive(&frame(1, 0, &Message::ViewChange(z.clone()))),
    );
    let mut z2 = z;
    z2.replica = 2;
    let e = r.handle(
        env(0),
        Input::Receive(&frame(2, 0, &Message::ViewChange(z2))),
    );
    my_vc(&e).unwrap().checkpoints[0].1
}

#[test]
fn forged_view_change_is_not_accepted_on_the_primary_ack_alone() {
    let ck = ck0();
    let mut r0 = rep(0);
    let vc1 = empty_vc(1, 1, ck);
    let vc2 = empty_vc(1, 2, ck);
    r0.handle(
        env(0),
        Input::Receive(&frame(1, 0, &Message::ViewChange(vc1.clone()))),
    );
    let e = r0.handle(
        env(0),
        Input::Receive(&frame(2, 0, &Message::ViewChange(vc2))),
    );
    let mine = my_vc(&e).unwrap();
    // Replica 3 never sent anything; faulty primary 1 invents its view change.
    let forged = empty_vc(1, 3, ck);
    let nv = NewView {
        view: 1,
        vcs: vec![(0, mine.digest()), (1, vc1.digest()), (3, forged.digest())],
        checkpoint: (0, ck),
        chosen: vec![],
        batches: vec![],
    };
    r0.handle(env(1), Input::Receive(&frame(1, 0, &Message::NewView(nv))));
    assert!(!r0.is_normal());
    r0.handle(
        env(1),
        Input::Receive(&frame(1, 0, &Message::RelayViewChange(forged.clone()))),
    );
    let ack = ViewChangeAck {
        view: 1,
        acker: 1,
        sender: 3,
        digest: forged.digest(),
    };
    let e = r0.handle(
        env(1),
        Input::Receive(&frame(1, 0, &Message::ViewChangeAck(ack))),
    );
    let _ = events(&e);
    assert!(
        !r0.is_normal(),
        "a relayed view change needs f acks besides the new primary's"
    );
}

#[test]
fn a_new_view_alone_never_moves_a_replica() {
    let ck = ck0();
    let mut r0 = rep(0);
    for v in [u64::MAX, 1_000_003] {
        let nv = NewView {
            view: v,
            vcs: vec![(0, Digest::ZERO), (1, Digest::ZERO), (2, Digest::ZERO)],
            checkpoint: (0, ck),
            chosen: vec![],
            batches: vec![],
        };
        r0.handle(env(0), Input::Receive(&frame(3, 0, &Message::NewView(nv))));
        assert_eq!(r0.view(), 0);
        assert!(r0.is_normal());
    }
    r0.handle(env(100_000), Input::Tick);
}

fn ack_spam_then_view_change(spam: bool) -> bool {
    let ck = ck0();
    let mut r1 = rep(1);
    if spam {
        for acker in [0u32, 2] {
            let mut ra = rep(acker);
            let mut acks = vec![];
            for k in 1..=64u64 {
                let v = 1 + 4 * k; // primary 1
                let e = ra.handle(
                    env(0),
                    Input::Receive(&frame(3, acker, &Message::ViewChange(empty_vc(v, 3, ck)))),
                );
                for (to, m) in msgs(&e) {
                    if let (Some(Principal::Replica(1)), Message::ViewChangeAck(a)) = (to, m) {
                        acks.push(a);
                    }
                }
            }
            assert!(acks.is_empty(), "no acks for views more than one ahead");
            for a in acks {
                r1.handle(
                    env(0),
                    Input::Receive(&frame(acker, 1, &Message::ViewChangeAck(a))),
                );
            }
        }
    }
    let vc0 = empty_vc(1, 0, ck);
    let vc2 = empty_vc(1, 2, ck);
    let mut out = vec![];
    out.extend(r1.handle(
        env(1),
        Input::Receive(&frame(0, 1, &Message::ViewChange(vc0.clone()))),
    ));
    out.extend(r1.handle(
        env(1),
        Input::Receive(&frame(2, 1, &Message::ViewChange(vc2.clone()))),
    ));
    out.extend(r1.handle(
        env(1),
        Input::Receive(&frame(
            2,
            1,
            &Message::ViewChangeAck(ViewChangeAck {
                view: 1,
                acker: 2,
                sender: 0,
                digest: vc0.digest(),
            }),
        )),
    ));
    out.extend(r1.handle(
        env(1),
        Input::Receive(&frame(
            0,
            1,
            &Message::ViewChangeAck(ViewChangeAck {
                view: 1,
                acker: 0,
                sender: 2,
                digest: vc2.digest(),
            }),
        )),
    ));
    msgs(&out)
        .iter()
        .any(|(_, m)| matches!(m, Message::NewView(_)))
}

#[test]
fn view_change_spam_cannot_exhaust_the_ack_quota() {
    assert!(ack_spam_then_view_change(false));
    assert!(
        ack_spam_then_view_change(true),
        "view-change spam for far views must not block S"
    );
}

/// A batch of one request of client 7 (timestamp 1), its authenticator entry for replica
/// `bad` spoiled.
fn one_request_batch(op: &[u8], bad: Option<usize>) -> Batch {
    let req = Request {
        client: 7,
        timestamp: 1,
        read_only: false,
        op: op.to_vec().into(),
    };
    let mut auth = request_authenticator(&keys(Principal::Client(7)), &req.digest(), 4);
    if let Some(r) = bad {
        auth[r] = Mac::default();
    }
    Batch {
        nondet: NonDet {
            time_ms: 0,
            seed: 0,
        },
        requests: vec![SignedRequest {
            request: req,
            auth: auth.into(),
            sig: None,
        }],
    }
}

#[test]
fn restore_keeps_a_prepared_slot_this_replica_could_not_vouch_for() {
    let ck = ck0();
    let batch = one_request_batch(b"x", Some(3)); // bad entry for replica 3 only
    let d = batch.digest();
    let mut r3 = rep(3);
    let mut records = vec![];
    let run = |r: &mut Replica<Svc, StaticKeys>, b: Vec<u8>, recs: &mut Vec<Record>| {
        let e = r.handle(env(0), Input::Receive(&b));
        for x in &e {
            if let Effect::Persist(rec) = x {
                recs.push(rec.clone());
            }
        }
        e
    };
    run(
        &mut r3,
        frame(
            0,
            3,
            &Message::PrePrepare(PrePrepare {
                view: 0,
                seq: 1,
                digest: d,
                batch,
                beside: Vec::new(),
            }),
        ),
        &mut records,
    );
    for s in [1u32, 2] {
        run(&mut r3, frame(s, 3, &prepare(1, d, s)), &mut records);
    }
    let trigger = |r: &mut Replica<Svc, StaticKeys>| {
        r.handle(
            env(0),
            Input::Receive(&frame(1, 3, &Message::ViewChange(empty_vc(1, 1, ck)))),
        );
        my_vc(&r.handle(
            env(0),
            Input::Receive(&frame(2, 3, &Message::ViewChange(empty_vc(1, 2, ck)))),
        ))
        .unwrap()
    };
    let before = trigger(&mut r3);
    let mut restored = restore_r3(&records);
    let after = trigger(&mut restored);
    assert_eq!(before.p.len(), 1);
    assert_eq!(
        after.p, before.p,
        "a prepared certificate survives a restart"
    );
}

#[test]
fn hostile_status_values_do_not_panic() {
    let mut r0 = rep(0);
    let st = Status {
        replica: 1,
        view: 0,
        normal: true,
        last_executed: u64::MAX,
        stable: 0,
        ..Default::default()
    };
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        r0.handle(env(0), Input::Receive(&frame(1, 0, &Message::Status(st))));
    }));
    assert!(res.is_ok(), "hostile status must not panic");
}

#[test]
fn hostile_view_change_values_do_not_panic() {
    let mut r0 = rep(0);
    let ls = u64::MAX - (u64::MAX % 128);
    let vc = ViewChange {
        view: 1,
        replica: 1,
        ls,
        checkpoints: vec![],
        p: vec![PEntry {
            seq: u64::MAX,
            digest: Digest::ZERO,
            view: 0,
        }],
        q: vec![],
    };
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        r0.handle(
            env(0),
            Input::Receive(&frame(1, 0, &Message::ViewChange(vc))),
        );
    }));
    assert!(res.is_ok(), "hostile view change must not panic");
}

#[test]
fn diverged_state_stops_execution_instead_of_looping() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut cfg = Config::new(1);
        cfg.checkpoint_interval = 2;
        cfg.log_size = 4;
        let mut r3: Replica<Svc, StaticKeys> = Replica::new(
            cfg,
            3,
            keys(Principal::Replica(3)),
            Svc::default(),
            fresh_state(),
        );
        let x = Digest([9; 32]);
        for s in [1u32, 2] {
            r3.handle(
                env(0),
                Input::Receive(&frame(
                    s,
                    3,
                    &Message::Checkpoint(Checkpoint {
                        seq: 2,
                        digest: x,
                        replica: s,
                    }),
                )),
            );
        }
        let ckeys = keys(Principal::Client(7));
        for n in 1..=2u64 {
            let req = Request {
                client: 7,
                timestamp: n,
                read_only: false,
                op: vec![n as u8].into(),
            };
            let auth = request_authenticator(&ckeys, &req.digest(), 4);
            let batch = Batch {
                nondet: NonDet {
                    time_ms: 0,
                    seed: 0,
                },
                requests: vec![SignedRequest {
                    request: req,
                    auth: auth.into(),
                    sig: None,
                }],
            };
            let d = batch.digest();
            r3.handle(
                env(0),
                Input::Receive(&frame(
                    0,
                    3,
                    &Message::PrePrepare(PrePrepare {
                        view: 0,
                        seq: n,
                        digest: d,
                        batch,
                        beside: Vec::new(),
                    }),
                )),
            );
            for s in [1u32, 2] {
                r3.handle(env(0), Input::Receive(&frame(s, 3, &prepare(n, d, s))));
            }
            for s in [0u32, 1] {
                let _ = tx.send(format!("commit n{n} from {s}"));
                r3.handle(
                    env(0),
                    Input::Receive(&frame(
                        s,
                        3,
                        &Message::Commit(Commit {
                            view: 0,
                            seq: n,
                            digest: d,
                            replica: s,
                        }),
                    )),
                );
            }
        }
        let _ = tx.send("done".to_string());
    });
    let mut last = String::new();
    while let Ok(m) = rx.recv_timeout(std::time::Duration::from_secs(5)) {
        last = m;
        if last == "done" {
            break;
        }
    }
    assert_eq!(
        last, "done",
        "a replica whose state diverged must stop executing, not loop"
    );
}

#[test]
fn an_execution_journaled_without_its_body_replays_from_the_pre_prepare() {
    let batch = one_request_batch(b"hello", None);
    let d = batch.digest();
    let mut r3 = rep(3);
    let mut records = vec![];
    let mut feed = |r: &mut Replica<Svc, StaticKeys>, from: u32, m: Message| {
        for e in r.handle(env(0), Input::Receive(&frame(from, 3, &m))) {
            if let Effect::Persist(rec) = e {
                records.push(rec);
            }
        }
    };
    feed(
        &mut r3,
        0,
        Message::PrePrepare(PrePrepare {
            view: 0,
            seq: 1,
            digest: d,
            batch,
            beside: Vec::new(),
        }),
    );
    for s in [1u32, 2] {
        feed(&mut r3, s, prepare(1, d, s));
    }
    for s in [0u32, 1, 2] {
        let c = Commit {
            view: 0,
            seq: 1,
            digest: d,
            replica: s,
        };
        feed(&mut r3, s, Message::Commit(c));
    }
    assert_eq!(r3.last_executed(), 1);
    let len = |r: &Replica<Svc, StaticKeys>| {
        let mut b = [0u8; 8];
        state::StateRead::read(r.state(), 0, &mut b);
        u64::from_le_bytes(b)
    };
    assert_eq!(len(&r3), 5, "the operation ran");
    // The body is journaled once: in the pre-prepare record, not again in the execution.
    let bodies = |recs: &[Record]| {
        recs.iter()
            .filter(|x| {
                matches!(
                    x,
                    Record::PrePrepared { batch: Some(_), .. }
                        | Record::Executed { batch: Some(_), .. }
                )
            })
            .count()
    };
    assert_eq!(bodies(&records), 1);
    assert!(records.iter().any(|x| matches!(
        x,
        Record::Executed {
            seq: 1,
            batch: None,
            ..
        }
    )));
    // A view change before the next checkpoint: compaction drops view 0's pre-prepares but
    // the one carrying the executed body; a restart replays the execution from it.
    records.push(Record::View {
        view: 1,
        normal: false,
        vc: None,
        pset: vec![],
        qset: vec![],
        batches: vec![],
        doubted: vec![],
    });
    let records = journal::compact(records);
    assert_eq!(bodies(&records), 1);
    let restored = restore_r3(&records);
    assert_eq!(restored.last_executed(), 1);
    assert_eq!(len(&restored), 5, "the execution was replayed");
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
    let mut r0 = rep(0);
    let signed = one_request_batch(b"x", None).requests.remove(0);
    let req = seal(
        &keys(Principal::Client(7)),
        &Message::Request(signed),
        Some(Principal::Replica(0)),
        4,
    );
    let e = r0.handle(env(start), Input::Receive(&req));
    let d = msgs(&e)
        .into_iter()
        .find_map(|(_, m)| match m {
            Message::PrePrepare(p) => Some(p.digest),
            _ => None,
        })
        .expect("the primary proposes");
    for s in [1u32, 3] {
        r0.handle(
            env(start + 10),
            Input::Receive(&frame(s, 0, &prepare(1, d, s))),
        );
    }
    // Prepared and committed locally, but no other replica's commit ever arrives.
    let timeout = Config::new(1).view_change_timeout_ms;
    let mut started_at = None;
    for t in (start + 20..=start + timeout * 3).step_by(10) {
        let e = r0.handle(env(t), Input::Tick);
        if my_vc(&e).is_some_and(|vc| vc.view == 1) {
            started_at = Some(t);
            break;
        }
    }
    let t = started_at.expect("the stalled primary starts a view change");
    assert!(t >= start + timeout, "not before the timeout ({t} ms)");
    assert_eq!(r0.stats.primary_stalls, 1);
}

/// A request of `client` (timestamp 1) with a 2 KiB operation, which travels beside the
/// pre-prepare by default, and its authenticator.
fn large_request(client: u64) -> SignedRequest {
    large_request_at(client, 1)
}

/// Like [`large_request`], at `timestamp`.
fn large_request_at(client: u64, timestamp: u64) -> SignedRequest {
    let request = Request {
        client,
        timestamp,
        read_only: false,
        op: vec![client as u8; 2048].into(),
    };
    let auth = request_authenticator(&keys(Principal::Client(client)), &request.digest(), 4);
    SignedRequest {
        request,
        auth: auth.into(),
        sig: None,
    }
}

/// The frame a client sends a request in (requests carry their own authenticator).
fn request_frame(sr: &SignedRequest, to: u32) -> Vec<u8> {
    seal(
        &keys(Principal::Client(sr.request.client)),
        &Message::Request(sr.clone()),
        Some(Principal::Replica(to)),
        4,
    )
}

/// A status of replica 3, behind at the start of view 0 and asking for `missing` bodies.
fn status_of_r3(missing: Vec<Digest>) -> Message {
    Message::Status(Status {
        replica: 3,
        view: 0,
        normal: true,
        last_executed: 0,
        stable: 0,
        prepared: vec![],
        committed: vec![],
        missing_batches: missing,
        missing_vcs: vec![],
    })
}

/// The lean pre-prepare of a batch of `requests`, all named beside it.
fn lean_pre_prepare(requests: &[SignedRequest]) -> (PrePrepare, Digest) {
    let batch = Batch {
        nondet: NonDet {
            time_ms: 0,
            seed: 0,
        },
        requests: requests.to_vec(),
    };
    let digest = batch.digest();
    let beside = requests
        .iter()
        .enumerate()
        .map(|(i, r)| Beside {
            index: i as u32,
            client: r.request.client,
            digest: r.request.digest(),
        })
        .collect();
    let pp = PrePrepare {
        view: 0,
        seq: 1,
        digest,
        batch: Batch {
            nondet: batch.nondet,
            requests: vec![],
        },
        beside,
    };
    (pp, digest)
}

/// A backup that holds a pre-prepare waiting for the requests beside it accepts it when
/// the last of them arrives, whatever their order (it now keeps how many, from the first,
/// it holds, instead of rebuilding the whole batch at every arrival).
#[test]
fn a_pending_pre_prepare_resolves_when_its_last_request_arrives_in_any_order() {
    let requests: Vec<SignedRequest> = [7, 8, 9].map(large_request).to_vec();
    let (pp, d) = lean_pre_prepare(&requests);
    for order in [[2usize, 0, 1], [0, 1, 2], [2, 1, 0], [1, 2, 0]] {
        let mut r1 = rep(1);
        let e = r1.handle(
            env(0),
            Input::Receive(&frame(0, 1, &Message::PrePrepare(pp.clone()))),
        );
        assert!(msgs(&e).is_empty(), "no request yet: nothing to vouch for");
        for (k, i) in order.iter().enumerate() {
            let e = r1.handle(env(1), Input::Receive(&request_frame(&requests[*i], 1)));
            let prepared = msgs(&e).iter().any(|(_, m)| {
                matches!(m, Message::Prepare(p) if p.seq == 1 && p.digest == d && p.replica == 1)
            });
            assert_eq!(prepared, k == 2, "order {order:?}, arrival {k}");
        }
    }
}

/// Whether `e` holds replica `from`'s PREPARE for slot 1 with digest `d`.
fn prepares(e: &[Effect], from: u32, d: Digest) -> bool {
    msgs(e).iter().any(|(_, m)| {
        matches!(m, Message::Prepare(p) if p.seq == 1 && p.digest == d && p.replica == from)
    })
}

/// A lagging backup that receives a client's next request before the pre-prepare naming
/// the one before (the client completed on the other replicas' replies and moved on)
/// resolves that pre-prepare from the request it kept, and prepares at once. Before, the
/// newer request replaced the older one, the pre-prepare waited, and the backup asked the
/// others for the whole batch in its status messages: under a 4/0 load with a quarter core
/// per replica, hundreds of batch bodies and several state transfers in ten seconds.
#[test]
fn a_backup_resolves_a_pre_prepare_from_a_request_its_client_has_since_replaced() {
    let (first, second, pp, d, mut r1) = client_7_moves_on();
    r1.handle(env(0), Input::Receive(&request_frame(&first, 1)));
    r1.handle(env(1), Input::Receive(&request_frame(&second, 1)));
    let e = r1.handle(env(2), Input::Receive(&pp));
    assert!(prepares(&e, 1, d), "the backup vouches from its kept copy");
    assert_eq!(r1.stats.beside_from_replaced, 1);
    // The same pre-prepare again (a retransmission) is not counted again.
    r1.handle(env(3), Input::Receive(&pp));
    assert_eq!(r1.stats.beside_from_replaced, 1);
}

/// Client 7's requests at timestamps 1 and 2 (large, beside pre-prepares), the frame of the
/// primary's lean pre-prepare of the first (to replica 1), its digest, and replica 1.
fn client_7_moves_on() -> (
    SignedRequest,
    SignedRequest,
    Vec<u8>,
    Digest,
    Replica<Svc, StaticKeys>,
) {
    let (first, second) = (large_request_at(7, 1), large_request_at(7, 2));
    let (pp, d) = lean_pre_prepare(std::slice::from_ref(&first));
    let pp = frame(0, 1, &Message::PrePrepare(pp));
    (first, second, pp, d, rep(1))
}

/// The same when the older request arrives after the newer one (reordered, or lost and sent
/// again), and after the pre-prepare that waits for it: it is kept although it is older than
/// the client's waiting request, and the pending pre-prepare resolves (and is counted).
#[test]
fn a_request_older_than_its_clients_waiting_one_still_resolves_a_pending_pre_prepare() {
    let (first, second, pp, d, mut r1) = client_7_moves_on();
    r1.handle(env(0), Input::Receive(&request_frame(&second, 1)));
    let e = r1.handle(env(1), Input::Receive(&pp));
    assert!(!prepares(&e, 1, d), "the request is missing");
    let e = r1.handle(env(2), Input::Receive(&request_frame(&first, 1)));
    assert!(
        prepares(&e, 1, d),
        "the late request resolves the pre-prepare"
    );
    assert_eq!(r1.stats.beside_from_replaced, 1);
}

/// The replaced requests a replica keeps are bounded (four batches' worth by default), the
/// oldest dropped first.
#[test]
fn replaced_requests_are_bounded_and_the_oldest_go_first() {
    // By bytes: with batches of at most 8 KiB, 16 KiB of operations (eight requests).
    let mut cfg = Config::new(1);
    cfg.batch_bytes_max = 8192;
    cfg.request_bytes_max = 4096;
    let mut r1 = Replica::new(
        cfg,
        1,
        keys(Principal::Replica(1)),
        Svc::default(),
        fresh_state(),
    );
    let bound = r1.footprint_bounds(1);
    assert!(bound.replaced > 8, "the count is not what binds here");
    for t in 1..=20 {
        r1.handle(
            env(t),
            Input::Receive(&request_frame(&large_request_at(7, t), 1)),
        );
        let fp = r1.footprint();
        assert!(
            fp.replaced_bytes <= bound.replaced_bytes,
            "at timestamp {t}"
        );
    }
    assert_eq!(r1.footprint().replaced, 8);
    // By count (the default sizes):
    let most = rep(1).footprint_bounds(1).replaced;
    let last = most as u64 + 10;
    let kept = last - most as u64;
    // The oldest kept one still resolves a pre-prepare; one older than that does not.
    for (ts, resolves) in [(kept, true), (kept - 1, false)] {
        let mut r1 = rep(1);
        for t in 1..=last {
            r1.handle(
                env(t),
                Input::Receive(&request_frame(&large_request_at(7, t), 1)),
            );
            assert!(r1.footprint().replaced <= most, "at timestamp {t}");
        }
        assert_eq!(r1.footprint().replaced, most);
        let (pp, d) = lean_pre_prepare(&[large_request_at(7, ts)]);
        let e = r1.handle(
            env(last + 1),
            Input::Receive(&frame(0, 1, &Message::PrePrepare(pp))),
        );
        assert_eq!(prepares(&e, 1, d), resolves, "timestamp {ts}");
    }
}

/// A primary answering a status resends its pre-prepare as it sent it: requests that
/// travel beside it are named by digest (the backup holds them, or asks for the batch), not
/// copied in; helping a slow backup used to cost every large request's bytes again.
#[test]
fn a_retransmitted_pre_prepare_names_large_requests_beside_it() {
    let mut r0 = rep(0);
    let sr = large_request(7);
    let e = r0.handle(env(0), Input::Receive(&request_frame(&sr, 0)));
    let sent = msgs(&e)
        .into_iter()
        .find_map(|(_, m)| match m {
            Message::PrePrepare(pp) => Some(pp),
            _ => None,
        })
        .expect("the primary proposes at once");
    assert_eq!((sent.batch.requests.len(), sent.beside.len()), (0, 1));
    let e = r0.handle(env(10), Input::Receive(&frame(3, 0, &status_of_r3(vec![]))));
    let again: Vec<PrePrepare> = msgs(&e)
        .into_iter()
        .filter_map(|(to, m)| match m {
            Message::PrePrepare(pp) if to == Some(Principal::Replica(3)) => Some(pp),
            _ => None,
        })
        .collect();
    assert_eq!(again, vec![sent]);
}

/// Batch bodies asked for in a status are sent by one replica at a time, in turns of one
/// status interval over the replicas other than the asker (each used to send every body
/// asked for, so a backup that fell behind cost every other replica its bodies again at
/// each status).
#[test]
fn batch_bodies_a_status_asks_for_come_from_one_replica_per_turn() {
    let requests = vec![large_request(7)];
    let (pp, d) = lean_pre_prepare(&requests);
    let mut holders: Vec<Replica<Svc, StaticKeys>> = [1, 2].map(rep).into_iter().collect();
    for r in &mut holders {
        let to = r.id();
        r.handle(env(0), Input::Receive(&request_frame(&requests[0], to)));
        r.handle(
            env(0),
            Input::Receive(&frame(0, to, &Message::PrePrepare(pp.clone()))),
        );
    }
    let interval = Config::new(1).status_interval_ms;
    let mut answered = vec![];
    for turn in 0..6u64 {
        for r in &mut holders {
            let to = r.id();
            let e = r.handle(
                env(turn * interval + 1),
                Input::Receive(&frame(3, to, &status_of_r3(vec![d]))),
            );
            if msgs(&e).iter().any(|(dest, m)| {
                *dest == Some(Principal::Replica(3))
                    && matches!(m, Message::Batches(b) if b.iter().any(|b| b.digest() == d))
            }) {
                answered.push((turn, to));
            }
        }
    }
    // Turns go to replicas 0, 1, 2, 0, 1, 2 (all but the asker, 3); 0 holds nothing here.
    assert_eq!(answered, vec![(1, 1), (2, 2), (4, 1), (5, 2)]);
}

/// Runs one request of client 7 through four replicas configured by `tune`, delivering
/// every message between them until none is left, and returns which replicas answered the
/// client, and with what.
fn replies_to_one_request(op: &[u8], tune: impl Fn(&mut Config)) -> Vec<(u32, Reply)> {
    let mut cfg = Config::new(1);
    tune(&mut cfg);
    let mut rs: Vec<Replica<Svc, StaticKeys>> = (0..4)
        .map(|id| {
            Replica::new(
                cfg.clone(),
                id,
                keys(Principal::Replica(id)),
                Svc::default(),
                fresh_state(),
            )
        })
        .collect();
    let req = Request {
        client: 7,
        timestamp: 1,
        read_only: false,
        op: op.to_vec().into(),
    };
    let auth = request_authenticator(&keys(Principal::Client(7)), &req.digest(), 4);
    let sr = SignedRequest {
        request: req,
        auth: auth.into(),
        sig: None,
    };
    let mut queue: Vec<(u32, Vec<u8>)> = vec![(0, request_frame(&sr, 0))];
    let mut replies = Vec::new();
    while let Some((to, bytes)) = queue.pop() {
        let effs = rs[to as usize].handle(env(1), Input::Receive(&bytes));
        for e in effs {
            match e {
                Effect::Send {
                    to: Principal::Replica(r),
                    bytes,
                } => queue.push((r, bytes.to_vec())),
                Effect::Broadcast { bytes } => {
                    queue.extend((0..4).filter(|r| *r != to).map(|r| (r, bytes.to_vec())))
                }
                Effect::Send {
                    to: Principal::Client(7),
                    bytes,
                } => {
                    let f = decode_frame(&bytes, usize::MAX).unwrap();
                    if let Message::Reply(m) = decode_body(&f.body).unwrap() {
                        replies.push((to, m));
                    }
                }
                _ => {}
            }
        }
    }
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

/// A request of client `client` (timestamp 1, operation `op`) whose authenticator entry for
/// replica `bad` (if any) does not verify.
fn request_bad_for(client: u64, op: &[u8], bad: Option<usize>) -> SignedRequest {
    let request = Request {
        client,
        timestamp: 1,
        read_only: false,
        op: op.to_vec().into(),
    };
    let mut auth = request_authenticator(&keys(Principal::Client(client)), &request.digest(), 4);
    if let Some(r) = bad {
        auth[r] = Mac::default();
    }
    SignedRequest {
        request,
        auth: auth.into(),
        sig: None,
    }
}

fn pre_prepare_of(requests: Vec<SignedRequest>) -> (PrePrepare, Digest) {
    let batch = Batch {
        nondet: NonDet {
            time_ms: 0,
            seed: 0,
        },
        requests,
    };
    let digest = batch.digest();
    let pp = PrePrepare {
        view: 0,
        seq: 1,
        digest,
        batch,
        beside: Vec::new(),
    };
    (pp, digest)
}

fn prepare_doubting(digest: Digest, replica: u32, doubts: Vec<u16>) -> Message {
    Message::Prepare(Prepare {
        view: 0,
        seq: 1,
        digest,
        replica,
        doubts,
    })
}

fn sent_commit(effs: &[Effect]) -> bool {
    msgs(effs)
        .iter()
        .any(|(_, m)| matches!(m, Message::Commit(_)))
}

fn sent_prepare(effs: &[Effect]) -> Option<Prepare> {
    msgs(effs).into_iter().find_map(|(_, m)| match m {
        Message::Prepare(p) => Some(p),
        _ => None,
    })
}

/// Faulty clients whose authenticators verify at some replicas only: client 7's entry for
/// replica 2 and client 8's entry for replica 3 are bad, and replica 1 is silent. Before
/// PREPAREs carried doubts, replicas 2 and 3 each withheld their PREPARE and the batch could
/// never prepare, in any view whose primary held both requests (simulator seeds 7662, 16696
/// and 16802 with --quiet-primary). Now each names the request it doubts, and the batch
/// prepares because the primary and one backup vouch for each request.
#[test]
fn a_batch_prepares_when_each_request_has_f_plus_one_vouchers() {
    let (pp, d) = pre_prepare_of(vec![
        request_bad_for(7, b"seven", Some(2)),
        request_bad_for(8, b"eight", Some(3)),
    ]);
    let mut r3 = rep(3);
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(0, 3, &Message::PrePrepare(pp))),
    );
    let mine = sent_prepare(&e).expect("a PREPARE, naming what it doubts");
    assert_eq!(mine.doubts, vec![1]);
    // Replica 2 doubts the other request: each has one backup voucher, and the primary no
    // longer counts (review finding 2).
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(2, 3, &prepare_doubting(d, 2, vec![0]))),
    );
    assert!(!sent_commit(&e), "one backup voucher per request");
    // Replica 1 vouches for both: two backup vouchers each.
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(1, 3, &prepare_doubting(d, 1, vec![]))),
    );
    assert!(
        sent_commit(&e),
        "prepared with f+1 backup vouchers per request"
    );

    // Both backups doubting the same request: only the primary vouches for it.
    let (pp, d) = pre_prepare_of(vec![
        request_bad_for(7, b"seven", None),
        request_bad_for(8, b"eight", Some(3)),
    ]);
    let mut r3 = rep(3);
    r3.handle(
        env(0),
        Input::Receive(&frame(0, 3, &Message::PrePrepare(pp))),
    );
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(2, 3, &prepare_doubting(d, 2, vec![1]))),
    );
    assert!(!sent_commit(&e), "no backup vouches for request 1");
    // A third PREPARE vouching for it makes one backup voucher: still not enough.
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(1, 3, &prepare_doubting(d, 1, vec![]))),
    );
    assert!(!sent_commit(&e));
    // The client sends the request again, straight to replica 3, which now vouches: two.
    let good = request_bad_for(8, b"eight", None);
    let e = r3.handle(env(1), Input::Receive(&request_frame(&good, 3)));
    assert!(sent_commit(&e));
}

/// A backup that doubted a request vouches for it once the request arrives straight from its
/// client: it sends a PREPARE without the doubt at once (until review found it, only on the
/// next copy of the pre-prepare or a client key), and receivers keep what either PREPARE
/// vouched for.
#[test]
fn a_doubting_backup_vouches_once_it_holds_the_request() {
    let bad = request_bad_for(7, b"seven", Some(3));
    let (pp, d) = pre_prepare_of(vec![bad]);
    let mut r3 = rep(3);
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(0, 3, &Message::PrePrepare(pp.clone()))),
    );
    assert_eq!(sent_prepare(&e).unwrap().doubts, vec![0]);
    // Another client's request changes nothing.
    let other = request_bad_for(8, b"eight", None);
    let e = r3.handle(env(1), Input::Receive(&request_frame(&other, 3)));
    assert!(sent_prepare(&e).is_none());
    let good = request_bad_for(7, b"seven", None);
    let e = r3.handle(env(1), Input::Receive(&request_frame(&good, 3)));
    assert_eq!(
        sent_prepare(&e).expect("a new PREPARE").doubts,
        Vec::<u16>::new()
    );
    // The pre-prepare again: nothing more to say.
    let e = r3.handle(
        env(2),
        Input::Receive(&frame(0, 3, &Message::PrePrepare(pp))),
    );
    assert!(sent_prepare(&e).is_none());

    // At a receiver that doubts the request itself, replica 2's second PREPARE (no doubts)
    // lifts its first one's doubt.
    let (pp, d2) = pre_prepare_of(vec![request_bad_for(8, b"eight", Some(1))]);
    assert_ne!(d, d2);
    let mut r1 = rep(1);
    r1.handle(
        env(0),
        Input::Receive(&frame(0, 1, &Message::PrePrepare(pp))),
    );
    let e = r1.handle(
        env(0),
        Input::Receive(&frame(2, 1, &prepare_doubting(d2, 2, vec![0]))),
    );
    let e2 = r1.handle(
        env(0),
        Input::Receive(&frame(3, 1, &prepare_doubting(d2, 3, vec![0]))),
    );
    assert!(
        !sent_commit(&e) && !sent_commit(&e2),
        "no backup vouches for request 0"
    );
    let e = r1.handle(
        env(0),
        Input::Receive(&frame(2, 1, &prepare_doubting(d2, 2, vec![]))),
    );
    assert!(
        !sent_commit(&e),
        "replica 2 now vouches: one backup voucher"
    );
    let e = r1.handle(
        env(0),
        Input::Receive(&frame(3, 1, &prepare_doubting(d2, 3, vec![]))),
    );
    assert!(sent_commit(&e), "replica 3 too: f+1 backup vouchers");
}

/// PREPAREs with malformed doubts (out of order, repeated, or past the batch size limit) are
/// rejected without counting.
#[test]
fn malformed_doubts_are_rejected() {
    let (pp, d) = pre_prepare_of(vec![request_bad_for(7, b"seven", None)]);
    let mut r3 = rep(3);
    r3.handle(
        env(0),
        Input::Receive(&frame(0, 3, &Message::PrePrepare(pp))),
    );
    for bad in [vec![1, 0], vec![0, 0], vec![u16::MAX]] {
        let e = r3.handle(
            env(0),
            Input::Receive(&frame(2, 3, &prepare_doubting(d, 2, bad.clone()))),
        );
        assert!(
            events(&e)
                .iter()
                .any(|ev| matches!(ev, Event::Rejected { .. })),
            "{bad:?} accepted"
        );
    }
}

/// The effects' records, appended to `journal`.
fn journal_of(effs: &[Effect], journal: &mut Vec<Record>) {
    for e in effs {
        if let Effect::Persist(r) = e {
            journal.push(r.clone());
        }
    }
}

/// Replica 3 receives the VIEW-CHANGEs `vcs` (sender, message) at time `t`, journaling what
/// it records into `journal`, and joins: its own VIEW-CHANGE.
fn r3_joins(
    r3: &mut Replica<Svc, StaticKeys>,
    t: u64,
    vcs: [(u32, ViewChange); 2],
    journal: &mut Vec<Record>,
) -> ViewChange {
    let mut mine = None;
    for (r, vc) in vcs {
        let e = r3.handle(
            env(t),
            Input::Receive(&frame(r, 3, &Message::ViewChange(vc))),
        );
        journal_of(&e, journal);
        mine = mine.or(my_vc(&e));
    }
    mine.expect("replica 3 joined the view")
}

/// A NEW-VIEW for view 1 (from its primary, replica 1) on the VIEW-CHANGEs of replicas 0 and
/// 2 from checkpoint `seq` (`digest`), claiming nothing, and replica 3's own `mine`.
fn new_view_at_checkpoint(seq: u64, digest: Digest, mine: &ViewChange) -> NewView {
    NewView {
        view: 1,
        vcs: vec![
            (0, vc_at_checkpoint(1, 0, seq, digest).digest()),
            (2, vc_at_checkpoint(1, 2, seq, digest).digest()),
            (3, mine.digest()),
        ],
        checkpoint: (seq, digest),
        chosen: vec![],
        batches: vec![],
    }
}

/// A NEW-VIEW that moves a replica to a checkpoint it does not hold makes it claim nothing
/// below that checkpoint from then on; after a restart it must say the same (and fetch the
/// checkpoint), not fall back to its own older checkpoint and claim less. Without the
/// watermark record it reported its old checkpoint and no prepared requests, and with the
/// others restarted alike a NEW-VIEW re-decided committed sequence numbers (simulator seed
/// 7994 with --quiet-primary: an agreement violation).
#[test]
fn a_restart_keeps_the_checkpoint_a_new_view_moved_the_watermark_to() {
    let ck = ck0();
    let far = Digest([128; 32]); // checkpoint 128, the first of the default interval
    let vc_at = |view: u64, r: u32| vc_at_checkpoint(view, r, 128, far);
    let mut r3 = rep(3);
    let mut journal = Vec::new();
    for r in [0u32, 2] {
        let e = r3.handle(
            env(0),
            Input::Receive(&frame(r, 3, &Message::ViewChange(vc_at(1, r)))),
        );
        journal_of(&e, &mut journal);
    }
    assert_eq!(r3.view(), 1, "joined view 1 on f+1 view changes");
    let mine = empty_vc(1, 3, ck);
    let nv = new_view_at_checkpoint(128, far, &mine);
    let e = r3.handle(env(1), Input::Receive(&frame(1, 3, &Message::NewView(nv))));
    journal_of(&e, &mut journal);
    assert!(r3.is_normal(), "the NEW-VIEW was installed");
    assert!(journal
        .iter()
        .any(|r| matches!(r, Record::Watermark { seq: 128, .. })));

    let mut restored = restore_r3(&journal);
    let vc = r3_joins(
        &mut restored,
        2,
        [0, 2].map(|r| (r, vc_at(2, r))),
        &mut vec![],
    );
    assert_eq!(
        vc.ls, 128,
        "the restarted replica still reports the new view's checkpoint"
    );
}

/// Two replicas waiting in a view for a third VIEW-CHANGE that will not come (its sender's
/// timer for that view expired and it moved on; its VIEW-CHANGE for it was lost) start their
/// own timer on its VIEW-CHANGE for the later view, and follow it (simulator seed 10294 with
/// --quiet-primary: replica 1 silent).
#[test]
fn a_view_change_for_a_later_view_counts_toward_the_view_change_timer() {
    let ck = ck0();
    let mut r3 = rep(3);
    // Replica 2 asks for view 1 and so do we (our own timer); replica 0 went on to view 2.
    r3.handle(
        env(0),
        Input::Receive(&frame(2, 3, &Message::ViewChange(empty_vc(1, 2, ck)))),
    );
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(0, 3, &Message::ViewChange(empty_vc(1, 0, ck)))),
    );
    assert_eq!(my_vc(&e).map(|v| v.view), Some(1));
    // (replica 0's VIEW-CHANGE for view 1 is what a lossy network may drop: start over with
    // a replica that never got it)
    let mut r3 = rep(3);
    r3.handle(
        env(0),
        Input::Receive(&frame(2, 3, &Message::ViewChange(empty_vc(1, 2, ck)))),
    );
    r3.handle(
        env(0),
        Input::Receive(&frame(0, 3, &Message::ViewChange(empty_vc(2, 0, ck)))),
    );
    assert_eq!(
        r3.view(),
        1,
        "f+1 view changes for view 1 or later: joined view 1"
    );
    // Nobody sends a NEW-VIEW for view 1 (its primary, replica 1, is silent).
    let mut t = 0;
    while r3.view() < 2 && t < 60_000 {
        t += 50;
        r3.handle(env(t), Input::Tick);
    }
    assert_eq!(
        r3.view(),
        2,
        "the timer ran and the replica moved on to view 2"
    );
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

/// A replica whose checkpoint a NEW-VIEW showed wrong journals the new view's watermark and
/// fetches; restarted before the fetch completes, it re-executes up to the same wrong
/// checkpoint and must find the disagreement again, not keep reporting its own checkpoint
/// (review of the watermark change: restore adopted the watermark without comparing).
#[test]
fn a_restart_finds_again_that_its_checkpoint_differs_from_the_new_views() {
    let cfg = || {
        let mut c = Config::new(1);
        c.checkpoint_interval = 1;
        c.log_size = 4;
        c
    };
    let mk = |records: Option<&[Record]>| match records {
        None => Replica::new(
            cfg(),
            3,
            keys(Principal::Replica(3)),
            Svc::default(),
            fresh_state(),
        ),
        Some(recs) => Replica::restore(
            cfg(),
            3,
            keys(Principal::Replica(3)),
            Svc::default(),
            fresh_state(),
            recs,
            true,
        )
        .unwrap(),
    };
    let mut r3 = mk(None);
    let mut journal = Vec::new();
    let (pp, d) = pre_prepare_of(vec![request_bad_for(7, b"seven", None)]);
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(0, 3, &Message::PrePrepare(pp))),
    );
    journal_of(&e, &mut journal);
    for s in [1u32, 2] {
        let e = r3.handle(env(0), Input::Receive(&frame(s, 3, &prepare(1, d, s))));
        journal_of(&e, &mut journal);
    }
    for s in [0u32, 1, 2] {
        let c = Message::Commit(Commit {
            view: 0,
            seq: 1,
            digest: d,
            replica: s,
        });
        let e = r3.handle(env(0), Input::Receive(&frame(s, 3, &c)));
        journal_of(&e, &mut journal);
    }
    assert_eq!(r3.last_executed(), 1);
    // Replicas 0 and 2 report another checkpoint at 1 (ours is wrong, say).
    let theirs = Digest([77; 32]);
    let vc_at = |view: u64, r: u32| vc_at_checkpoint(view, r, 1, theirs);
    let mine = r3_joins(&mut r3, 1, [0, 2].map(|r| (r, vc_at(1, r))), &mut journal);
    let nv = new_view_at_checkpoint(1, theirs, &mine);
    let e = r3.handle(env(2), Input::Receive(&frame(1, 3, &Message::NewView(nv))));
    journal_of(&e, &mut journal);
    assert!(events(&e).contains(&Event::StateDivergence { seq: 1 }));

    let mut restored = mk(Some(&journal));
    let vc = r3_joins(
        &mut restored,
        3,
        [0, 2].map(|r| (r, vc_at(2, r))),
        &mut vec![],
    );
    assert_eq!(vc.ls, 1);
    assert!(
        vc.checkpoints.iter().all(|(_, dg)| *dg == theirs),
        "the restarted replica no longer claims its own checkpoint at 1: {:?}",
        vc.checkpoints
    );
}

/// Delivers every replica-to-replica frame among `reps` (replica i at index i; `None` is a
/// faulty replica that receives nothing and sends nothing), ticking every 50 ms of simulated
/// time until `until` holds or `ms` pass; frames sent before any replica left view 0 are
/// lost, and the frames of `late` (to replica, frame) arrive once one has.
fn route(
    reps: &mut [Option<Replica<Svc, StaticKeys>>],
    mut pending: Vec<(u32, Effect)>,
    mut late: Vec<(u32, Vec<u8>)>,
    start: u64,
    ms: u64,
    until: impl Fn(&[Option<Replica<Svc, StaticKeys>>]) -> bool,
) {
    let mut t = start;
    while t < start + ms && !until(reps) {
        // The network holds every message until some replica's view-change timer fires.
        if !reps.iter().flatten().any(|r| r.view() > 0) {
            pending.clear();
        } else {
            for (to, bytes) in late.drain(..) {
                if let Some(r) = reps[to as usize].as_mut() {
                    for out in r.handle(env(t), Input::Receive(&bytes)) {
                        pending.push((to, out));
                    }
                }
            }
        }
        while let Some((from, e)) = pending.pop() {
            let targets: Vec<u32> = match &e {
                Effect::Send {
                    to: Principal::Replica(r),
                    ..
                } => vec![*r],
                Effect::Broadcast { .. } => (0..4).filter(|r| *r != from).collect(),
                _ => vec![],
            };
            let bytes = match &e {
                Effect::Send { bytes, .. } | Effect::Broadcast { bytes } => bytes.clone(),
                _ => continue,
            };
            for to in targets {
                if let Some(r) = reps[to as usize].as_mut() {
                    for out in r.handle(env(t), Input::Receive(&bytes)) {
                        pending.push((to, out));
                    }
                }
            }
        }
        t += 50;
        for (i, r) in reps.iter_mut().enumerate() {
            if let Some(r) = r.as_mut() {
                for out in r.handle(env(t), Input::Tick) {
                    pending.push((i as u32, out));
                }
            }
        }
    }
}

/// The known gap's trace (below): a faulty primary (0) pre-prepares, to replicas 1 and 2, a
/// request whose authenticator verifies at replicas 0 and 1 only; replica 1 vouches, replica
/// 2 doubts; with `prepared_at_1`, replica 2's PREPARE reaches replica 1, which prepares on
/// {1, 2} (vouchers 0 and 1). Then the primary falls silent, a correct client's request
/// waits at every other replica, and the network holds every message until the view-change
/// timers fire. With `client_resends`, the client of the doubted request is correct (its key
/// had not reached replicas 2 and 3) and sends it again, now verifiable everywhere, once the
/// view change has begun. Returns the replicas' (view, normal, last executed) after two
/// simulated minutes, or `None` if two of them installed a new view.
fn partly_authenticated_trace(
    prepared_at_1: bool,
    client_resends: bool,
) -> Option<Vec<(u64, bool, u64)>> {
    // The authenticator's entries for replicas 2 and 3 spoiled (the batch digest does not
    // cover authenticators).
    let (mut pp, _) = pre_prepare_of(vec![request_bad_for(7, b"seven", Some(2))]);
    let mut auth = pp.batch.requests[0].auth.to_vec();
    auth[3] = Mac::default();
    pp.batch.requests[0].auth = auth.into();
    let mut reps: Vec<Option<Replica<Svc, StaticKeys>>> =
        vec![None, Some(rep(1)), Some(rep(2)), Some(rep(3))];
    let mut prepare_of_2 = None;
    for to in [1u32, 2] {
        let e = reps[to as usize].as_mut().unwrap().handle(
            env(0),
            Input::Receive(&frame(0, to, &Message::PrePrepare(pp.clone()))),
        );
        let p = sent_prepare(&e).expect("a PREPARE");
        assert_eq!(p.doubts.is_empty(), to == 1);
        if to == 2 {
            prepare_of_2 = Some(p);
        }
    }
    if prepared_at_1 {
        let e = reps[1].as_mut().unwrap().handle(
            env(0),
            Input::Receive(&frame(2, 1, &Message::Prepare(prepare_of_2.unwrap()))),
        );
        // Until review finding 2 the primary counted as a voucher, replica 1 prepared on
        // {1, 2} (vouchers 0 and 1), and no view change could decide the slot.
        assert!(
            !sent_commit(&e),
            "one backup (replica 1) vouches: not prepared, the primary does not count"
        );
    }
    let other = request_bad_for(8, b"eight", None);
    let mut pending = Vec::new();
    for to in [1u32, 2, 3] {
        let e = reps[to as usize]
            .as_mut()
            .unwrap()
            .handle(env(0), Input::Receive(&request_frame(&other, to)));
        pending.extend(e.into_iter().map(|x| (to, x)));
    }
    let installed = |reps: &[Option<Replica<Svc, StaticKeys>>]| {
        reps.iter()
            .flatten()
            .filter(|r| r.view() > 0 && r.is_normal())
            .count()
            >= 2
    };
    let late = if client_resends {
        let good = request_bad_for(7, b"seven", None);
        (1u32..4).map(|to| (to, request_frame(&good, to))).collect()
    } else {
        Vec::new()
    };
    route(&mut reps, pending, late, 0, 120_000, installed);
    if installed(&reps) {
        return None;
    }
    Some(
        reps.iter()
            .flatten()
            .map(|r| (r.view(), r.is_normal(), r.last_executed()))
            .collect(),
    )
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
    let ck = ck0();
    let (pp, d) = pre_prepare_of(vec![request_bad_for(7, b"seven", Some(3))]);
    let mut r3 = rep(3);
    let mut journal = Vec::new();
    let e = r3.handle(
        env(0),
        Input::Receive(&frame(0, 3, &Message::PrePrepare(pp))),
    );
    journal_of(&e, &mut journal);
    assert_eq!(sent_prepare(&e).unwrap().doubts, vec![0]);
    // The view changes before anything prepares: the slot is doubted in view 0.
    let mine = r3_joins(
        &mut r3,
        1,
        [(1, empty_vc(1, 1, ck)), (2, empty_vc(1, 2, ck))],
        &mut journal,
    );
    assert!(mine.q.is_empty());
    // Power loss; replica 3 restarts from its journal.
    let mut r3 = restore_r3(&journal);
    // The client sends its request again, now verifiable at replica 3.
    let good = request_bad_for(7, b"seven", None);
    r3.handle(env(2), Input::Receive(&request_frame(&good, 3)));
    let mine = r3_joins(
        &mut r3,
        3,
        [(1, empty_vc(2, 1, ck)), (2, empty_vc(2, 2, ck))],
        &mut journal,
    );
    assert!(
        mine.q
            .iter()
            .any(|e| e.seq == 1 && e.pairs.contains(&(d, 0))),
        "the slot of view 0 claimed in Q after the restart: {:?}",
        mine.q
    );
}
