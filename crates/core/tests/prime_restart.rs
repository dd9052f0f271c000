//! A Prime replica that restarts replays what its journal says it executed. Its key holder
//! may fail the calls opening clients' body sessions during that replay; the replay then stops,
//! and what it did not reach must still run once the key holder answers, from the journal's
//! records of what ran, even though after a restart the replica holds none of the PO-REQUESTs
//! those ordinals' matrices name and no peer may be able to send them (simulator seed 8,121 of
//! `--ordering prime`: a whole-cluster restart, two replicas' replays stopped by a failing key
//! holder, the cluster halted for good).

use redoubt_core::message::*;
use redoubt_core::Event;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod common;
use common::*;

#[test]
fn a_replay_the_key_holder_stopped_finishes_from_the_journal_without_po_requests() {
    let mut c = Cluster::builder(1)
        .prime()
        .live_client(7)
        .config(|c| {
            c.confidential_bodies = true;
            c.checkpoint_interval = 64;
            c.log_size = 128;
        })
        .build();
    c.run(100);
    for i in 0..4u8 {
        let ts = c.invoke(7, &[b'p', b'u', b't', b' ', b'k', b' ', b'0' + i]);
        assert!(c.run_until(10_000, |c| c.completed(7, ts)), "request {i}");
    }
    c.run(200);
    let before = c.replica(1).last_executed();
    assert!(before >= 2, "ordinals executed: {before}");

    let failing = Arc::new(AtomicBool::new(true));
    // Compacted as hosts compact it after each execution: PO-REQUESTs that ran are dropped.
    let records = redoubt_core::journal::compact(c.journal(1).to_vec());
    c.restart_failing_bodies(1, &records, failing.clone());
    assert!(
        c.replica(1).last_executed() < before,
        "the replay stopped at the first request it could not open"
    );
    // From now on no PO-REQUEST reaches replica 1, copied or not.
    c.block(|e| {
        e.to == replica(1)
            && matches!(
                e.msg,
                Message::Prime(PrimeMessage::PoRequest(_) | PrimeMessage::PoCopy(_))
            )
    });
    failing.store(false, Ordering::SeqCst);
    assert!(
        c.run_until(10_000, |c| c.replica(1).last_executed() >= before),
        "replica 1 runs again what it ran before the restart (at {} of {before})",
        c.replica(1).last_executed()
    );
    // What it ran again is what its peers ran at those ordinals.
    let ran = |i| -> Vec<(u64, redoubt_crypto::Digest)> {
        c.events(i)
            .into_iter()
            .filter_map(|e| match e {
                Event::Executed { seq, digest, .. } => Some((seq, digest)),
                _ => None,
            })
            .collect()
    };
    let again = ran(1);
    assert!(!again.is_empty());
    for x in &again {
        assert!(ran(0).contains(x), "{x:?} ran at replica 0 too");
    }
}
