//! Proactive recovery and the key holder: the recovery request is signed by the key holder
//! as an effect (the replica goes on handling inputs while it waits), and a call the key
//! holder does not answer is given up and asked again.

use redoubt_core::*;

mod common;
use common::*;

fn recoveries_executed(c: &Cluster, r: ReplicaId) -> usize {
    c.events(0)
        .iter()
        .filter(|e| matches!(e, Event::RecoveryExecuted { replica, .. } if *replica == r))
        .count()
}

fn recovered(c: &Cluster, r: ReplicaId) -> bool {
    c.events(r).iter().any(|e| matches!(e, Event::Recovered(_)))
}

/// Replica 3 recovers with its key holder silent on the call signing its recovery request: nothing is requested, and the replica keeps
/// answering its peers. The call is given up after `CALL_TIMEOUT_MS` and asked again; once
/// the key holder answers, the request is ordered and the recovery completes. Before the
/// request was an effect, the replica signed it inside `handle`, blocking on the key holder.
#[test]
fn a_recovery_request_waits_for_the_key_holder_and_is_asked_again_when_it_fails() {
    let mut c = Cluster::builder(1).session_keys().build();
    c.run(2_000);
    c.hold_key_holder_calls(3, |call| {
        matches!(call.request, holder::HolderRequest::SignRecovery { .. })
    });
    c.input(3, Input::Recover);
    assert!(c.run_until(10_000, |c| c
        .events(3)
        .iter()
        .any(|e| matches!(e, Event::RecoveryEstimated { .. }))));
    c.run(5_000);
    assert_eq!(
        recoveries_executed(&c, 3),
        0,
        "nothing signed, nothing ordered"
    );
    assert!(!recovered(&c, 3));
    // Given up after the call timeout: reported, and asked again later.
    c.run(holder::CALL_TIMEOUT_MS);
    assert!(
        c.events(3)
            .iter()
            .any(|e| matches!(e, Event::KeyHolderFailed(_))),
        "{:?}",
        c.events(3)
    );
    // The key holder answers what it held (the given-up call changes nothing) and the
    // calls after it.
    c.release_key_holder(3);
    assert!(c.run_until(30_000, |c| recovered(c, 3)));
    assert_eq!(recoveries_executed(&c, 3), 1, "one request ordered");
}
