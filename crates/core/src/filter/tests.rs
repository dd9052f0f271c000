//! The filter's forwarding rules (Yin et al. 2003 §4.1): certificates up only when f+1
//! agreement nodes vouch, replies down only as a valid threshold signature (or one every
//! filter of the row above vouched for) and only in answer to a request from below, at most
//! one reply per request, and g shares never enough.

use super::*;
use crate::message::{Batch, NonDet};
use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::threshold::{deal, KeyShare};

struct Setup {
    cfg: Config,
    keys: Arc<FirewallKeys>,
    orders: Vec<HolderSecrets>,
    shares: Vec<KeyShare>,
    /// The filters' filter keys.
    vouching: Vec<HolderSecrets>,
}

fn setup() -> Setup {
    let mut cfg = Config::new(1);
    cfg.executors = 3;
    cfg.filter_rows = 2;
    cfg.confidential_bodies = true;
    cfg.checkpoint_interval = 8;
    cfg.log_size = 16;
    let orders: Vec<HolderSecrets> = (0..4u8)
        .map(|r| HolderSecrets::from_seed(&[r + 1; 32]))
        .collect();
    let (group, shares) = deal(1, 3, [42; 32]);
    let vouching: Vec<HolderSecrets> = (0..4u8)
        .map(|x| HolderSecrets::from_seed(&[x + 100; 32]))
        .collect();
    let keys = Arc::new(FirewallKeys {
        orders: orders.iter().map(|k| k.public().verify).collect(),
        group,
        filters: vouching.iter().map(|k| k.public().verify).collect(),
    });
    Setup {
        cfg,
        keys,
        orders,
        shares,
        vouching,
    }
}

fn filter(s: &Setup, x: FilterId) -> Filter {
    Filter::new(
        s.cfg.clone(),
        x,
        s.keys.clone(),
        s.vouching[x as usize].clone(),
    )
    .unwrap()
}

/// `cert` as filter `x` passes it down, vouched for with `by`'s filter key.
fn vouched(s: &Setup, x: FilterId, by: FilterId, cert: &ReplyCert) -> Vec<u8> {
    let key = VouchedCert::statement(cert.bundle.seq, &cert.bundle.statement(), &cert.signature);
    let m = Message::from(VouchedCert {
        cert: cert.clone(),
        vouch: s.vouching[by as usize].sign(&key.0),
    });
    frame(Principal::Filter(x), &m)
}

fn tick(f: &mut Filter) -> Vec<Effect> {
    f.handle(Env::default(), Input::Tick)
}

fn frame(from: Principal, msg: &Message) -> Vec<u8> {
    encode_frame_parts(WIRE_VERSION, from, 0, &encode_body(msg), &Tag::None)
}

fn batch(seed: u64) -> Batch {
    Batch {
        nondet: NonDet { time_ms: 0, seed },
        requests: Vec::new(),
        matrix: None,
    }
}

/// Replica `r`'s signed piece for `seq`, as `via` passes it on.
fn piece(s: &Setup, r: ReplicaId, seq: Seq, b: &Batch, via: Principal) -> Vec<u8> {
    let order = Order {
        replica: r,
        view: 0,
        seq,
        digest: b.digest(),
        batch: Some(b.clone()),
    };
    let signature = s.orders[r as usize].sign(&SignedOrder::statement(&order).0);
    frame(via, &Message::from(SignedOrder { order, signature }))
}

fn bundle(seq: Seq) -> ReplyBundle {
    ReplyBundle {
        seq,
        entries: vec![ReplyEntry {
            client: 7,
            timestamp: 70,
            result: b"sealed result".to_vec(),
        }],
    }
}

fn share(s: &Setup, e: ExecutorId, b: &ReplyBundle) -> Vec<u8> {
    let m = Message::from(ReplyShare {
        executor: e,
        bundle: b.clone(),
        share: s.shares[e as usize].sign(&b.statement().0),
    });
    frame(Principal::Executor(e), &m)
}

fn step(f: &mut Filter, now_ms: u64, bytes: &[u8]) -> Vec<(Principal, Message)> {
    let env = Env {
        now_ms,
        ..Env::default()
    };
    f.handle(env, Input::Receive(bytes))
        .into_iter()
        .filter_map(|e| match e {
            Effect::Send { to, bytes } => {
                let fr = decode_frame_ref(&bytes, usize::MAX).expect("frame");
                assert_eq!(
                    fr.from,
                    Principal::Filter(f.id()),
                    "sent under its own name"
                );
                Some((to, decode_body(fr.body).expect("body")))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_batch_goes_up_once_f_plus_one_agreement_nodes_vouch_for_it() {
    let s = setup();
    let mut x0 = filter(&s, 0);
    let b = batch(1);
    let out = step(&mut x0, 0, &piece(&s, 0, 1, &b, Principal::Replica(0)));
    assert!(out.is_empty(), "one piece certifies nothing");
    let out = step(&mut x0, 1, &piece(&s, 1, 1, &b, Principal::Replica(1)));
    // Both pieces to both filters of the row above.
    assert_eq!(out.len(), 4);
    assert!(out
        .iter()
        .all(|(to, m)| matches!(to, Principal::Filter(2 | 3))
            && matches!(m, Message::Firewall(FirewallMessage::SignedOrder(_)))));
    // A third piece within the status interval: nothing more goes up.
    assert!(step(&mut x0, 2, &piece(&s, 2, 1, &b, Principal::Replica(2))).is_empty());
    // A piece under another replica's name, or for another body, does not count.
    let forged = {
        let mut bytes = piece(&s, 3, 2, &b, Principal::Replica(3));
        let n = bytes.len();
        bytes[n - 10] ^= 1;
        bytes
    };
    assert!(step(&mut x0, 3, &forged).is_empty());
    assert!(x0.stats.pieces_rejected + x0.stats.rejected >= 1);
}

#[test]
fn a_reply_goes_down_only_when_asked_for_and_once_per_request() {
    let s = setup();
    let mut top = filter(&s, 2);
    let b = bundle(1);
    // Shares arrive before any request came from below: the reply is held.
    assert!(step(&mut top, 0, &share(&s, 0, &b)).is_empty());
    assert!(step(&mut top, 1, &share(&s, 1, &b)).is_empty());
    assert_eq!(top.stats.replies_held, 1);
    assert_eq!(top.stats.replies_combined, 1);
    // A third share: the certificate is known, nothing happens.
    assert!(step(&mut top, 2, &share(&s, 2, &b)).is_empty());
    // A request from below: the reply goes down (to both filters below), and nothing up.
    let batch1 = batch(1);
    let below = Principal::Filter(0);
    assert!(step(&mut top, 3, &piece(&s, 0, 1, &batch1, below)).is_empty());
    let out = step(&mut top, 4, &piece(&s, 1, 1, &batch1, below));
    assert_eq!(out.len(), 2);
    let Message::Firewall(FirewallMessage::VouchedCert(v)) = &out[0].1 else {
        panic!("a reply certificate goes down, not {:?}", out[0].1);
    };
    assert!(s.keys.check_reply(&v.cert));
    let key = VouchedCert::statement(1, &b.statement(), &v.cert.signature);
    assert!(
        s.keys.check_vouch(2, &key, &v.vouch),
        "with the filter's vouch"
    );
    assert!(out
        .iter()
        .all(|(to, _)| matches!(to, Principal::Filter(0 | 1))));
    // Each further request from below releases it once more; nothing goes up for it.
    let out = step(&mut top, 500, &piece(&s, 2, 1, &batch1, below));
    assert_eq!(out.len(), 2);
    assert!(out
        .iter()
        .all(|(_, m)| matches!(m, Message::Firewall(FirewallMessage::VouchedCert(_)))));
}

#[test]
fn a_bad_share_does_not_stall_the_certificate_and_g_shares_make_none() {
    let s = setup();
    let mut top = filter(&s, 3);
    let b = bundle(1);
    let below = Principal::Filter(1);
    let batch1 = batch(1);
    step(&mut top, 0, &piece(&s, 0, 1, &batch1, below));
    step(&mut top, 0, &piece(&s, 1, 1, &batch1, below));
    // Execution node 0 signs with node 1's share: its share does not verify as its own.
    let bad = frame(
        Principal::Executor(0),
        &Message::from(ReplyShare {
            executor: 0,
            bundle: b.clone(),
            share: s.shares[1].sign(&b.statement().0),
        }),
    );
    assert!(step(&mut top, 1, &bad).is_empty());
    assert!(
        step(&mut top, 2, &share(&s, 1, &b)).is_empty(),
        "one good share and one bad one are no certificate"
    );
    assert_eq!(top.stats.shares_rejected, 1);
    let out = step(&mut top, 3, &share(&s, 2, &b));
    assert_eq!(out.len(), 2, "the second good share completes it");
    // A lone share on another bundle (a leak attempt) never completes.
    let mut leak = bundle(2);
    leak.entries[0].result = b"~secret~".to_vec();
    assert!(step(&mut top, 4, &share(&s, 0, &leak)).is_empty());
}

/// A certificate on bundle(1) with the execution cluster's signature.
fn good_cert(s: &Setup) -> ReplyCert {
    let b = bundle(1);
    ReplyCert {
        signature: s
            .keys
            .group
            .combine(&[
                (0, s.shares[0].sign(&b.statement().0)),
                (2, s.shares[2].sign(&b.statement().0)),
            ])
            .unwrap(),
        bundle: b,
    }
}

/// Asks filter 0 for sequence number 1 (f+1 agreement nodes' pieces): what goes down.
fn ask(s: &Setup, x0: &mut Filter) -> Vec<(Principal, Message)> {
    let batch1 = batch(1);
    step(x0, 2, &piece(s, 0, 1, &batch1, Principal::Replica(0)));
    step(x0, 3, &piece(s, 1, 1, &batch1, Principal::Replica(1)))
}

#[test]
fn a_certificate_every_filter_above_vouched_for_is_taken_unchecked_and_held_until_asked_for() {
    let s = setup();
    let mut x0 = filter(&s, 0);
    let good = good_cert(&s);
    assert!(step(&mut x0, 0, &vouched(&s, 2, 2, &good)).is_empty());
    assert_eq!(x0.stats.replies_held, 0, "one vouch of two waits");
    assert!(step(&mut x0, 1, &vouched(&s, 3, 3, &good)).is_empty());
    assert_eq!(x0.stats.replies_held, 1);
    assert_eq!((x0.stats.replies_vouched, x0.stats.replies_checked), (1, 0));
    // Down to every agreement node with filter 0's own vouch, nothing up.
    let out = ask(&s, &mut x0);
    assert_eq!(out.len(), 4);
    let key = VouchedCert::statement(1, &good.bundle.statement(), &good.signature);
    assert!(out.iter().all(|(to, m)| matches!(to, Principal::Replica(_))
        && matches!(m, Message::Firewall(FirewallMessage::VouchedCert(v)) if v.cert == good && s.keys.check_vouch(0, &key, &v.vouch))));
}

#[test]
fn a_certificate_one_filter_vouched_for_is_checked_at_the_second_tick() {
    let s = setup();
    let mut x0 = filter(&s, 0);
    let good = good_cert(&s);
    let mut forged = good.clone();
    forged.bundle.entries[0].result = b"~secret~ smuggled".to_vec();
    // A faulty filter 2 vouches for a forged certificate: it waits, then fails its check.
    assert!(step(&mut x0, 0, &vouched(&s, 2, 2, &forged)).is_empty());
    tick(&mut x0);
    assert_eq!(
        x0.stats.certificates_rejected, 0,
        "a tick has not passed yet"
    );
    let rejected = tick(&mut x0);
    assert!(rejected.iter().any(|e| matches!(
        e,
        Effect::Event(Event::Rejected {
            from: Principal::Filter(2),
            ..
        })
    )));
    assert_eq!(x0.stats.certificates_rejected, 1);
    // The good one through filter 3 alone (filter 2 silent): checked, held, passed down.
    assert!(step(&mut x0, 1, &vouched(&s, 3, 3, &good)).is_empty());
    tick(&mut x0);
    tick(&mut x0);
    assert_eq!((x0.stats.replies_vouched, x0.stats.replies_checked), (0, 1));
    assert_eq!(ask(&s, &mut x0).len(), 4);
}

#[test]
fn a_vouch_in_another_filters_name_or_from_below_counts_for_nothing() {
    let s = setup();
    let mut x0 = filter(&s, 0);
    let good = good_cert(&s);
    // Filter 3 sends filter 2's vouch under its own name, then a vouch with filter 2's key
    // under filter 2's name comes from below: neither counts.
    assert!(step(&mut x0, 0, &vouched(&s, 3, 2, &good)).is_empty());
    assert_eq!(x0.stats.vouches_rejected, 1);
    let from_below = {
        let key = VouchedCert::statement(1, &good.bundle.statement(), &good.signature);
        let m = Message::from(VouchedCert {
            cert: good.clone(),
            vouch: s.vouching[2].sign(&key.0),
        });
        frame(Principal::Replica(0), &m)
    };
    assert!(step(&mut x0, 0, &from_below).is_empty());
    // Filter 2's true vouch alone is one of two: nothing is taken before the check.
    assert!(step(&mut x0, 1, &vouched(&s, 2, 2, &good)).is_empty());
    assert_eq!(x0.stats.replies_held, 0);
    assert_eq!(x0.stats.rejected, 2);
}

#[test]
fn a_filter_refuses_a_key_that_is_not_its_own() {
    let s = setup();
    let err = Filter::new(s.cfg.clone(), 1, s.keys.clone(), s.vouching[0].clone())
        .err()
        .unwrap();
    assert!(err.contains("not filter 1's"), "{err}");
}

#[test]
fn execution_checkpoint_certificates_go_down_once_and_again_on_request() {
    let s = setup();
    let mut top = filter(&s, 2);
    let st = stable_statement(8);
    let stable = |e: ExecutorId| {
        frame(
            Principal::Executor(e),
            &Message::from(StableShare {
                executor: e,
                seq: 8,
                share: s.shares[e as usize].sign(&st.0),
            }),
        )
    };
    assert!(step(&mut top, 0, &stable(0)).is_empty());
    let out = step(&mut top, 1, &stable(1));
    assert_eq!(out.len(), 2);
    assert!(matches!(
        out[0].1,
        Message::Firewall(FirewallMessage::StableCert(StableCert { seq: 8, .. }))
    ));
    assert!(step(&mut top, 2, &stable(2)).is_empty(), "once each");
}

#[test]
fn a_restarted_filter_joins_in_at_the_agreement_nodes_sequence_numbers() {
    let s = setup();
    // A fresh filter (maxN = 0, window 16) while the cluster orders at 100.
    let mut x0 = filter(&s, 0);
    let b = batch(100);
    assert!(step(&mut x0, 0, &piece(&s, 0, 100, &b, Principal::Replica(0))).is_empty());
    // A faulty replica alone cannot move the window: its piece elsewhere changes nothing.
    assert!(step(
        &mut x0,
        0,
        &piece(&s, 3, 5000, &batch(9), Principal::Replica(3))
    )
    .is_empty());
    assert_eq!(x0.max_certified(), 0);
    let out = step(&mut x0, 1, &piece(&s, 1, 100, &b, Principal::Replica(1)));
    assert_eq!(
        out.len(),
        4,
        "f+1 matching pieces beyond the window: up it goes"
    );
    assert_eq!(x0.max_certified(), 100);
    x0.check_invariants().unwrap();
}
