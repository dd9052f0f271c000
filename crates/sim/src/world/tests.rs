//! Unit tests of the world: frames, keys and the checkers' plumbing.

use super::*;

/// The world fails a run when a correct replica reports a NEW-VIEW contradiction, and not
/// when a faulty one does.
#[test]
fn new_key_frames_are_recognised_without_decoding_them() {
    let sc = Scenario::calm(1);
    let mut w = World::new(sc, false);
    let mut keys = w.session_keys(Principal::Client(1));
    let nk = keys
        .refresh(&[Principal::Replica(0)])
        .expect("local key holder");
    assert!(is_new_key(&seal(&keys, &Message::from(nk), None, 4)));
    let other = Message::from(redoubt_core::message::QueryStable {
        replica: 0,
        nonce: 1,
    });
    assert!(!is_new_key(&seal(&keys, &other, None, 4)));
}

#[test]
fn a_contradiction_fails_the_run() {
    let contradiction = Event::Contradiction {
        seq: 3,
        executed: redoubt_crypto::Digest([7; 32]),
        chosen: redoubt_core::message::NULL_DIGEST,
    };
    let mut sc = Scenario::calm(1);
    sc.byzantine.push((3, Behavior::Silent));
    let mut w = World::new(sc, false);
    w.observe(3, contradiction.clone());
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    w.observe(1, contradiction);
    assert_eq!(w.violations.len(), 1);
    assert!(
        w.violations[0].contains("NEW-VIEW contradiction: r1"),
        "{:?}",
        w.violations
    );
}
