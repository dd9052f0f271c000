//! Regression tests for the holes an outside protocol review found in the view change and
//! proactive recovery (each failed before its fix): view-change messages that outlive their
//! sender's re-keying, views that wedge the view change, a request only the primary can
//! authenticate halting the service, and recovery trusting a tampered journal's view.

use redoubt_core::auth::seal;
use redoubt_core::keys;
use redoubt_core::message::*;
use redoubt_core::*;
use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::Digest;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

mod common;
use common::{fresh_state, Svc};

const N: u32 = 4;
const CLIENT: u64 = 9;

fn principals() -> Vec<Principal> {
    (0..N).map(Principal::Replica).collect()
}

fn secrets(p: Principal) -> HolderSecrets {
    match p {
        Principal::Replica(i) => HolderSecrets::from_seed(&[i as u8 + 1; 32]),
        Principal::Client(c) => HolderSecrets::from_seed(&[c as u8 + 100; 32]),
    }
}

fn directory() -> Arc<Directory> {
    Arc::new(Directory {
        keys: principals()
            .into_iter()
            .chain([Principal::Client(CLIENT)])
            .map(|p| (p, secrets(p).public()))
            .collect(),
    })
}

fn session(dir: &Arc<Directory>, p: Principal, seed: u8) -> SessionKeys {
    let holder = LocalHolder::new(
        p,
        secrets(p),
        dir.clone(),
        Arc::new(AtomicU64::new(0)),
        Default::default(),
        [seed; 32],
    );
    SessionKeys::new(Box::new(holder), dir.clone())
}

fn env(t: u64) -> Env {
    Env {
        now_ms: t,
        entropy: t,
    }
}

fn msgs(effs: &[Effect]) -> Vec<Message> {
    effs.iter()
        .filter_map(|e| match e {
            Effect::Send { bytes, .. } | Effect::Broadcast { bytes } => Some(bytes),
            _ => None,
        })
        .map(|b| {
            let f = decode_frame(b, usize::MAX).unwrap();
            decode_body(&f.body).unwrap()
        })
        .collect()
}

/// Replica 0 (under test, session keys) and the key tables of replicas 1..3, with keys
/// exchanged both ways.
struct Bench {
    r0: Replica<Svc, Keys>,
    peers: Vec<SessionKeys>,
    client: SessionKeys,
    now: u64,
}

impl Bench {
    fn new() -> Bench {
        Bench::new_plain()
    }

    fn new_plain() -> Bench {
        let dir = directory();
        let r0 = Replica::new(
            Config::new(1),
            0,
            Keys::Session(session(&dir, Principal::Replica(0), 100)),
            Svc::default(),
            fresh_state(),
        );
        let peers = (0..N)
            .map(|i| session(&dir, Principal::Replica(i), 100 + i as u8))
            .collect();
        let client = session(&dir, Principal::Client(CLIENT), 50);
        let mut b = Bench {
            r0,
            peers,
            client,
            now: 0,
        };
        // Replica 0 sends its NEW-KEY on its first tick.
        let effs = b.r0.handle(env(1), Input::Tick);
        for m in msgs(&effs) {
            if let Message::NewKey(nk) = m {
                for j in 1..N as usize {
                    b.peers[j].accept(&nk, 0).unwrap();
                }
            }
        }
        for j in 1..N {
            b.rekey(j);
        }
        // The client's keys, for replica 0 only.
        let nk = b.client.refresh(&[Principal::Replica(0)]).unwrap();
        b.client_sends(&Message::NewKey(nk));
        b
    }

    fn client_sends(&mut self, m: &Message) -> Vec<Effect> {
        self.now += 1;
        let bytes = seal(&self.client, m, Some(Principal::Replica(0)), N);
        self.r0.handle(env(self.now), Input::Receive(&bytes))
    }

    /// A request of the client whose authenticator verifies at replica 0 only (`mac_ok`) or
    /// nowhere, optionally signed by the client's key holder.
    fn request(&self, ts: u64, mac_ok: bool, signed: bool) -> SignedRequest {
        let request = Request {
            client: CLIENT,
            timestamp: ts,
            read_only: false,
            op: b"op".to_vec().into(),
        };
        let d = request.digest();
        let mut auth = redoubt_core::auth::request_authenticator(&self.client, &d, N);
        for (i, m) in auth.iter_mut().enumerate() {
            if i != 0 || !mac_ok {
                *m = redoubt_crypto::Mac::default();
            }
        }
        let sig = signed.then(|| {
            let (counter, sig) = self
                .client
                .with_holder(|h| h.sign(redoubt_core::keys::Purpose::Request, &d))
                .unwrap();
            RequestSig { counter, sig }
        });
        SignedRequest {
            request,
            auth: auth.into(),
            sig,
        }
    }

    /// Replica `j` draws new keys and replica 0 accepts its NEW-KEY.
    fn rekey(&mut self, j: u32) -> Vec<Effect> {
        let nk = self.peers[j as usize].refresh(&principals()).unwrap();
        self.deliver(j, &Message::NewKey(nk))
    }

    fn deliver(&mut self, from: u32, m: &Message) -> Vec<Effect> {
        self.now += 1;
        let bytes = seal(
            &self.peers[from as usize],
            m,
            Some(Principal::Replica(0)),
            N,
        );
        self.r0.handle(env(self.now), Input::Receive(&bytes))
    }

    /// The checkpoint digest every replica reports for sequence number 0 (read from a
    /// throwaway replica's own VIEW-CHANGE).
    fn ck0(&self) -> Digest {
        let mut t = Bench::new_plain();
        t.deliver(1, &lying_vc(1, 1, Digest::ZERO));
        let effs = t.deliver(2, &lying_vc(1, 2, Digest::ZERO));
        msgs(&effs)
            .into_iter()
            .find_map(|m| match m {
                Message::ViewChange(vc) if vc.replica == 0 => Some(vc.checkpoints[0].1),
                _ => None,
            })
            .expect("replica 0 joined view 1")
    }
}

fn lying_vc(view: u64, r: u32, ck0: Digest) -> Message {
    Message::ViewChange(ViewChange {
        view,
        replica: r,
        ls: 0,
        checkpoints: vec![(0, ck0)],
        p: vec![],
        q: vec![],
    })
}

#[test]
fn a_view_change_planted_before_its_sender_re_keyed_no_longer_counts() {
    let mut b = Bench::new();
    let ck = b.ck0();
    // Replica 1, compromised, plants a VIEW-CHANGE for view 2.
    b.deliver(1, &lying_vc(2, 1, ck));
    assert_eq!(b.r0.view(), 0);
    // It recovers: its NEW-KEY retires the keys the planted message was authenticated with.
    b.rekey(1);
    // Long after, another faulty replica sends its own VIEW-CHANGE for view 2. With the
    // planted one still counted, replica 0 joined view 2 on the f+1 rule (and would vouch
    // for the planted lie to view 2's primary).
    let effs = b.deliver(2, &lying_vc(2, 2, ck));
    assert_eq!(
        b.r0.view(),
        0,
        "joined a view on a message from before a re-key"
    );
    assert!(!msgs(&effs)
        .iter()
        .any(|m| matches!(m, Message::ViewChangeAck(a) if a.sender == 1)));
    assert!(b.r0.stats.view_changes_forgotten >= 1);
    // A fresh VIEW-CHANGE of replica 1 (under its new keys) counts again.
    b.deliver(1, &lying_vc(2, 1, ck));
    assert_eq!(b.r0.view(), 2);
}

#[test]
fn a_replica_re_keying_forgets_the_view_changes_it_received_under_its_old_keys() {
    let mut b = Bench::new();
    let ck = b.ck0();
    b.deliver(1, &lying_vc(2, 1, ck));
    // Replica 0's own periodic re-key: whatever it received under its old inbound keys (which
    // an attacker who controlled it would know) is dropped.
    let later = b.now + Config::new(1).key_refresh_ms + 1;
    b.now = later;
    let effs = b.r0.handle(env(later), Input::Tick);
    let nk = msgs(&effs)
        .into_iter()
        .find_map(|m| match m {
            Message::NewKey(nk) => Some(nk),
            _ => None,
        })
        .expect("replica 0 re-keyed");
    for j in 1..N as usize {
        b.peers[j].accept(&nk, later).unwrap();
    }
    b.deliver(2, &lying_vc(2, 2, ck));
    assert_eq!(b.r0.view(), 0);
}

fn ack(view: u64, acker: u32, sender: u32, vc: &Message) -> Message {
    let Message::ViewChange(m) = vc else {
        unreachable!("a view change")
    };
    Message::ViewChangeAck(ViewChangeAck {
        view,
        acker,
        sender,
        digest: m.digest(),
    })
}

fn sends_new_view(effs: &[Effect]) -> bool {
    msgs(effs).iter().any(|m| matches!(m, Message::NewView(_)))
}

#[test]
fn view_changes_far_ahead_count_for_the_join_rule_but_are_not_stored() {
    let mut b = Bench::new();
    let ck = b.ck0();
    // Replica 1 claims view 8 (replica 0 leads it) while replica 0 is in view 0: beyond
    // VC_VIEWS_AHEAD, so only the claim is kept.
    let far = lying_vc(8, 1, ck);
    b.deliver(1, &far);
    assert_eq!(b.r0.footprint().view_changes, 1);
    assert_eq!(b.r0.view(), 0);
    // With replica 2's, f+1 replicas are at view 8 or beyond: replica 0 joins it.
    let v2 = lying_vc(8, 2, ck);
    b.deliver(2, &v2);
    assert_eq!(b.r0.view(), 8);
    // As the primary of view 8 it now has its own VIEW-CHANGE, replica 3's (acked by 2) and
    // an ack for replica 1's: had it stored replica 1's message from before, S would be
    // complete and the NEW-VIEW would go out here.
    let v3 = lying_vc(8, 3, ck);
    b.deliver(3, &v3);
    b.deliver(2, &ack(8, 2, 3, &v3));
    let effs = b.deliver(2, &ack(8, 2, 1, &far));
    assert!(
        !sends_new_view(&effs),
        "a VIEW-CHANGE received far ahead of the view entered S"
    );
    // Sent again now that replica 0 is in view 8, it is stored and completes S.
    let effs = b.deliver(1, &far);
    assert!(
        sends_new_view(&effs),
        "S complete once replica 1's message came again"
    );
}

#[test]
fn views_at_the_top_of_the_range_are_rejected_and_never_wedge_the_view_change() {
    let mut b = Bench::new();
    let ck = b.ck0();
    for v in [u64::MAX, u64::MAX - 1, VIEW_LIMIT + 1] {
        b.deliver(1, &lying_vc(v, 1, ck));
        b.deliver(2, &lying_vc(v, 2, ck));
        assert_eq!(b.r0.view(), 0, "view {v}");
    }
    assert_eq!(b.r0.footprint().view_changes, 0);
    // The view change still works afterwards.
    b.deliver(1, &lying_vc(1, 1, ck));
    b.deliver(2, &lying_vc(1, 2, ck));
    assert_eq!(b.r0.view(), 1);
}

fn pre_prepare(effs: &[Effect]) -> Option<PrePrepare> {
    msgs(effs).into_iter().find_map(|m| match m {
        Message::PrePrepare(pp) => Some(pp),
        _ => None,
    })
}

fn commits(effs: &[Effect]) -> bool {
    msgs(effs).iter().any(|m| matches!(m, Message::Commit(_)))
}

/// Review finding 2: a correct primary (replica 0), a faulty client whose authenticator
/// verifies at the primary only, and a faulty backup (1) that sends its PREPARE, without
/// doubts, to the primary alone. Replicas 2 and 3 doubt the request. Until the fix the
/// primary prepared (itself and replica 1 as the f+1 vouchers), nobody committed, and in the
/// view change its P entry blocked rule B while A2 lacked a second Q claim: no view change
/// could ever decide the sequence number. Now the primary does not count as a voucher, it
/// does not prepare, and its VIEW-CHANGE claims nothing there (so rule B picks null); the
/// client comes under suspicion.
#[test]
fn a_request_only_the_primary_can_authenticate_cannot_halt_the_service() {
    let mut b = Bench::new();
    let ck = b.ck0();
    let effs = b.client_sends(&Message::Request(b.request(1, true, false)));
    let pp = pre_prepare(&effs).expect("the primary orders it");
    let prepare = |r: u32, doubts: Vec<u16>| {
        Message::Prepare(Prepare {
            view: 0,
            seq: pp.seq,
            digest: pp.digest,
            replica: r,
            doubts,
        })
    };
    let e1 = b.deliver(1, &prepare(1, vec![]));
    let e2 = b.deliver(2, &prepare(2, vec![0]));
    let e3 = b.deliver(3, &prepare(3, vec![0]));
    assert!(
        !commits(&e1) && !commits(&e2) && !commits(&e3),
        "prepared on one faulty backup's vouch"
    );
    // The view change: replica 0's VIEW-CHANGE has no P entry for the slot.
    b.deliver(2, &lying_vc(1, 2, ck));
    let effs = b.deliver(3, &lying_vc(1, 3, ck));
    let mine = msgs(&effs)
        .into_iter()
        .find_map(|m| match m {
            Message::ViewChange(vc) if vc.replica == 0 => Some(vc),
            _ => None,
        })
        .expect("replica 0 joined view 1");
    assert!(mine.p.is_empty(), "P entry {:?}", mine.p);
    assert_eq!(b.r0.stats.clients_suspected, 1);
}

/// The client-signature fallback: a request whose authenticator entry does not verify is
/// accepted with a valid signature of its client, and refused with a forged one.
#[test]
fn a_signed_request_is_accepted_where_its_mac_does_not_verify() {
    let mut b = Bench::new();
    let effs = b.client_sends(&Message::Request(b.request(1, false, false)));
    assert!(pre_prepare(&effs).is_none());
    let mut forged = b.request(2, false, true);
    forged.request.op = b"other".to_vec().into();
    let effs = b.client_sends(&Message::Request(forged));
    assert!(
        pre_prepare(&effs).is_none(),
        "a signature of another request"
    );
    let effs = b.client_sends(&Message::Request(b.request(3, false, true)));
    assert!(pre_prepare(&effs).is_some(), "the signature verifies");
    assert_eq!(b.r0.stats.requests_signed, 1);
}

/// Four replicas with session keys, exchanging every message (no faults), replica 3 restored
/// from a journal and recovering. Holder counters and admitted counters survive restarts.
struct Cluster {
    reps: Vec<Replica<Svc, Keys>>,
    journals: Vec<Vec<Record>>,
    holders: Vec<(Arc<AtomicU64>, keys::AdmittedCounters)>,
    dir: Arc<Directory>,
    now: u64,
    recovered: bool,
    incarnation: u8,
}

impl Cluster {
    fn keys(&mut self, i: u32) -> Keys {
        self.incarnation += 1;
        let p = Principal::Replica(i);
        let (counter, admitted) = self.holders[i as usize].clone();
        let holder = LocalHolder::new(
            p,
            secrets(p),
            self.dir.clone(),
            counter,
            admitted,
            [self.incarnation; 32],
        );
        Keys::Session(SessionKeys::new(Box::new(holder), self.dir.clone()))
    }

    fn new() -> Cluster {
        let dir = directory();
        let mut c = Cluster {
            reps: Vec::new(),
            journals: vec![Vec::new(); N as usize],
            holders: (0..N)
                .map(|_| (Arc::new(AtomicU64::new(0)), Default::default()))
                .collect(),
            dir,
            now: 0,
            recovered: false,
            incarnation: 0,
        };
        for i in 0..N {
            let k = c.keys(i);
            c.reps.push(Replica::new(
                Config::new(1),
                i,
                k,
                Svc::default(),
                fresh_state(),
            ));
        }
        c
    }

    /// Runs `ms` of time in 10 ms ticks, delivering every message at once.
    fn run(&mut self, ms: u64) {
        let end = self.now + ms;
        while self.now < end {
            self.now += 10;
            let mut pending: Vec<(u32, Effect)> = Vec::new();
            for i in 0..N {
                let effs = self.reps[i as usize].handle(env(self.now), Input::Tick);
                pending.extend(effs.into_iter().map(|e| (i, e)));
            }
            let mut steps = 0;
            while let Some((from, e)) = pending.pop() {
                steps += 1;
                assert!(steps < 1_000_000, "message storm");
                let (targets, bytes): (Vec<u32>, _) = match e {
                    Effect::Send {
                        to: Principal::Replica(r),
                        bytes,
                    } => (vec![r], bytes),
                    Effect::Broadcast { bytes } => ((0..N).filter(|r| *r != from).collect(), bytes),
                    Effect::Persist(r) => {
                        self.journals[from as usize].push(r);
                        continue;
                    }
                    Effect::Event(Event::Recovered(_)) if from == 3 => {
                        self.recovered = true;
                        continue;
                    }
                    _ => continue,
                };
                for to in targets {
                    let effs = self.reps[to as usize].handle(env(self.now), Input::Receive(&bytes));
                    pending.extend(effs.into_iter().map(|e| (to, e)));
                }
            }
        }
    }
}

/// Review finding 4: a journal tampered with while replica 3 was compromised names view
/// 2^40. Until the fix the restarted replica adopted it unchecked, ignored the views the
/// replies to its recovery request reported, finished its recovery, and never took part
/// again (stuck in a view no correct replica would reach). Now the 2f+1 replies' median
/// view brings it back and it enters the others' view.
#[test]
fn a_recovering_replica_estimates_its_view_instead_of_trusting_its_journal() {
    for hand_overs in [0u64, 2] {
        recover_from_a_tampered_view(hand_overs);
    }
}

fn recover_from_a_tampered_view(hand_overs: u64) {
    let mut c = Cluster::new();
    c.run(2_000);
    for _ in 0..hand_overs {
        let p = c.reps[0].primary();
        let now = c.now;
        let effs = c.reps[p as usize].handle(env(now), Input::StepDown);
        for e in effs {
            if let Effect::Broadcast { bytes } = e {
                for to in (0..N).filter(|r| *r != p) {
                    c.reps[to as usize].handle(env(now), Input::Receive(&bytes));
                }
            }
        }
        c.run(3_000);
    }
    assert!(c
        .reps
        .iter()
        .all(|r| r.view() == hand_overs && r.is_normal()));
    // The attacker rewrites replica 3's journal: a view far ahead, entered and normal.
    let mut journal = c.journals[3].clone();
    journal.push(Record::View {
        view: 1 << 40,
        normal: true,
        vc: None,
        pset: vec![],
        qset: vec![],
        batches: vec![],
        doubted: vec![],
    });
    let k = c.keys(3);
    c.reps[3] = Replica::restore(
        Config::new(1),
        3,
        k,
        Svc::default(),
        fresh_state(),
        &journal,
        true,
    )
    .expect("restores");
    let now = c.now;
    let effs = c.reps[3].handle(env(now), Input::Recover);
    for e in effs {
        if let Effect::Persist(r) = e {
            c.journals[3].push(r);
        }
    }
    c.run(30_000);
    assert!(c.recovered, "replica 3 completed its recovery");
    let v3 = c.reps[3].view();
    let v0 = c.reps[0].view();
    assert!(v3 < 1 << 40, "replica 3 still in view {v3}");
    assert_eq!(v3, v0, "replica 3 in view {v3}, replica 0 in {v0}");
    assert!(c.reps[3].is_normal());
    assert_eq!(c.reps[3].stats.views_estimated, 1);
}
