//! Restarts from the journal and checkpoints: what a restarted replica must still claim
//! (prepared slots, the watermark a NEW-VIEW moved it to, a checkpoint shown wrong), replaying
//! executions from their pre-prepares, and a state that diverged from a certified checkpoint.
//!
//! Moved from `regressions.rs` (names unchanged); each scenario reproduced a bug before its
//! fix.

use redoubt_core::message::PbftMessage;
use redoubt_core::message::{Message, NewView, Status, ViewChange};
use redoubt_core::*;
use redoubt_crypto::Digest;
use std::sync::Arc;

mod common;
use common::*;

/// Replica 3 live, the others scripted, a checkpoint every `interval`, a log of 4, and
/// tentative execution as given.
fn short_log(interval: Seq, tentative_execution: bool) -> Cluster {
    Cluster::builder(1)
        .live([3])
        .config(|c| {
            c.checkpoint_interval = interval;
            c.log_size = 4;
            c.tentative_execution = tentative_execution;
        })
        .build()
}

#[test]
fn restore_keeps_a_prepared_slot_this_replica_could_not_vouch_for() {
    let mut c = Cluster::builder(1).live([3]).build();
    let ck = (0, c.checkpoint_zero());
    // A bad authenticator entry for replica 3 only.
    let pp = pre_prepare(0, 1, vec![spoil(c.request(7, 1, b"x"), &[3])]);
    c.agree(3, pp, &[1, 2], &[]);
    let records = c.journal(3).to_vec();
    let vcs = || [view_change(1, 1, ck), view_change(1, 2, ck)];
    let before = c.join_view(3, vcs());
    c.restart(3, &records);
    let after = c.join_view(3, vcs());
    assert_eq!(before.p.len(), 1);
    assert_eq!(
        after.p, before.p,
        "a prepared certificate survives a restart"
    );
}

/// Replica 3 executes two batches (checkpoint interval 2) whose checkpoint 2 differs from the
/// one f+1 replicas vouch for. Before the fix it rolled back to 1 and executed 2 again, inside
/// one `handle` call, forever (the test ran it on a thread under a wall-clock timeout; now
/// [`Svc`] panics past [`EXECUTIONS_MAX`], and the executions are counted: each batch once,
/// the service once per request). Batch 2 executes once committed, or tentatively when
/// prepared and then commits: both paths are checked.
#[test]
fn diverged_state_stops_execution_instead_of_looping() {
    for tentative in [true, false] {
        let mut c = short_log(2, tentative);
        let x = Digest([9; 32]);
        for s in [1u32, 2] {
            c.receive(3, s, checkpoint(2, x, s));
        }
        for n in 1..=2u64 {
            let pp = pre_prepare(0, n, vec![c.request(7, n, &[n as u8])]);
            c.agree(3, pp, &[1, 2], &[0, 1]);
        }
        assert!(
            c.events(3).contains(&Event::StateDivergence { seq: 2 }),
            "tentative execution {tentative}"
        );
        let executed: Vec<Seq> = c
            .events(3)
            .iter()
            .filter_map(|e| match e {
                Event::Executed { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(
            (executed, c.replica(3).service().executions),
            (vec![1, 2], 2),
            "a replica whose state diverged must stop executing, not loop (tentative \
             execution {tentative})"
        );
    }
}

#[test]
fn an_execution_journaled_without_its_body_replays_from_the_pre_prepare() {
    let mut c = Cluster::builder(1).live([3]).build();
    let pp = pre_prepare(0, 1, vec![c.request(7, 1, b"hello")]);
    c.agree(3, pp, &[1, 2], &[0, 1, 2]);
    assert_eq!(c.replica(3).last_executed(), 1);
    assert_eq!(appended(c.replica(3).state()), 5, "the operation ran");
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
    let mut records = c.journal(3).to_vec();
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
    c.restart(3, &records);
    assert_eq!(c.replica(3).last_executed(), 1);
    assert_eq!(
        appended(c.replica(3).state()),
        5,
        "the execution was replayed"
    );
}

/// A NEW-VIEW for view 1 (from its primary, replica 1) on the VIEW-CHANGEs of replicas 0 and
/// 2 from checkpoint `ck`, claiming nothing, and replica 3's own `mine`.
fn new_view_at_checkpoint(ck: (Seq, Digest), mine: &ViewChange) -> NewView {
    let named = [
        (0, view_change(1, 0, ck).digest()),
        (2, view_change(1, 2, ck).digest()),
        (3, mine.digest()),
    ];
    new_view(1, &named, ck)
}

/// A NEW-VIEW that moves a replica to a checkpoint it does not hold makes it claim nothing
/// below that checkpoint from then on; after a restart it must say the same (and fetch the
/// checkpoint), not fall back to its own older checkpoint and claim less. Without the
/// watermark record it reported its old checkpoint and no prepared requests, and with the
/// others restarted alike a NEW-VIEW re-decided committed sequence numbers (simulator seed
/// 7994 with --quiet-primary: an agreement violation).
#[test]
fn a_restart_keeps_the_checkpoint_a_new_view_moved_the_watermark_to() {
    let mut c = Cluster::builder(1).live([3]).build();
    let ck = (0, c.checkpoint_zero());
    // Checkpoint 128, the first of the default interval.
    let far = (128, Digest([128; 32]));
    for r in [0u32, 2] {
        c.receive(3, r, view_change(1, r, far));
    }
    assert_eq!(c.replica(3).view(), 1, "joined view 1 on f+1 view changes");
    let mine = view_change(1, 3, ck);
    c.advance(1);
    c.receive(3, 1, new_view_at_checkpoint(far, &mine));
    assert!(c.replica(3).is_normal(), "the NEW-VIEW was installed");
    assert!(c
        .journal(3)
        .iter()
        .any(|r| matches!(r, Record::Watermark { seq: 128, .. })));

    let journal = c.journal(3).to_vec();
    c.restart(3, &journal);
    c.advance(1);
    let vc = c.join_view(3, [0, 2].map(|r| view_change(2, r, far)));
    assert_eq!(
        vc.ls, 128,
        "the restarted replica still reports the new view's checkpoint"
    );
}

/// A replica whose checkpoint a NEW-VIEW showed wrong journals the new view's watermark and
/// fetches; restarted before the fetch completes, it re-executes up to the same wrong
/// checkpoint and must find the disagreement again, not keep reporting its own checkpoint
/// (review of the watermark change: restore adopted the watermark without comparing).
#[test]
fn a_restart_finds_again_that_its_checkpoint_differs_from_the_new_views() {
    let mut c = short_log(1, true);
    let pp = pre_prepare(0, 1, vec![c.request(7, 1, b"seven")]);
    c.agree(3, pp, &[1, 2], &[0, 1, 2]);
    assert_eq!(c.replica(3).last_executed(), 1);
    // Replicas 0 and 2 report another checkpoint at 1 (ours is wrong, say).
    let theirs = (1, Digest([77; 32]));
    c.advance(1);
    let mine = c.join_view(3, [0, 2].map(|r| view_change(1, r, theirs)));
    c.advance(1);
    let out = c.receive(3, 1, new_view_at_checkpoint(theirs, &mine));
    assert!(out.events().contains(&Event::StateDivergence { seq: 1 }));

    let journal = c.journal(3).to_vec();
    c.restart(3, &journal);
    c.advance(1);
    let vc = c.join_view(3, [0, 2].map(|r| view_change(2, r, theirs)));
    assert_eq!(vc.ls, 1);
    assert!(
        vc.checkpoints.iter().all(|(_, dg)| *dg == theirs.1),
        "the restarted replica no longer claims its own checkpoint at 1: {:?}",
        vc.checkpoints
    );
}

/// The journal names a checkpoint above the base of the state the replica restarts over: a
/// crash after a recovery relabelled a distrusted state as checkpoint 0 (a state commit) and
/// before its journal record was durable leaves exactly this (found by review). Before the
/// fix `Replica::restore` failed and the replica could not start again; now it starts,
/// executes nothing on that state and fetches a vouched checkpoint.
#[test]
fn a_journal_ahead_of_the_state_means_fetch_not_a_failed_start() {
    let mut c = short_log(2, false);
    for n in 1..=2u64 {
        let pp = pre_prepare(0, n, vec![c.request(7, n, &[n as u8])]);
        c.agree(3, pp, &[1, 2], &[0, 1]);
    }
    let mut records = c.journal(3).to_vec();
    records.push(Record::Checkpoint {
        seq: 2,
        digest: Digest([5; 32]),
    });
    c.restart(3, &records);
    assert_eq!(c.replica(3).stats.state_unreadable, 1);
    assert_eq!(c.replica(3).last_executed(), 0, "replayed onto that state");
    let pp = pre_prepare(0, 3, vec![c.request(7, 3, b"z")]);
    c.agree(3, pp, &[1, 2], &[0, 1]);
    assert_eq!(c.replica(3).last_executed(), 0, "executed on that state");
}

/// Replica 3 is active in view 1 but has no NEW-VIEW to report for it (here: a restart from a
/// journal without the record of the one it entered on; in the field, a proactive recovery
/// since it entered the view). It reports one again once f+1 others report being active in
/// the view on it, and not on f. Found by the simulator (seed 12819 with --quiet-primary):
/// every replica of a long-lived view had recovered, nobody vouched for the view any more,
/// and a replica that could not check its NEW-VIEW lagged until the next view change.
#[test]
fn a_replica_that_lost_its_voucher_vouches_again_on_f_plus_1_reports() {
    let mut c = Cluster::builder(1).live([3]).build();
    let ck = (0, c.checkpoint_zero());
    let mine = c.join_view(3, [view_change(1, 0, ck), view_change(1, 2, ck)]);
    c.advance(1);
    let nv = new_view_at_checkpoint(ck, &mine);
    c.receive(3, 1, nv.clone());
    assert!(c.replica(3).is_normal(), "the NEW-VIEW was installed");
    let journal: Vec<Record> = c
        .journal(3)
        .iter()
        .filter(|x| !matches!(x, Record::Entered { .. }))
        .cloned()
        .collect();
    c.restart(3, &journal);
    assert!(c.replica(3).is_normal() && c.replica(3).view() == 1);
    let reported = |c: &mut Cluster| {
        c.advance(c.cfg.status_interval_ms);
        c.tick(3)
            .find(|m| match m {
                Message::Pbft(PbftMessage::Status(s)) => Some(s.new_view),
                _ => None,
            })
            .expect("a status")
    };
    let active = |r: ReplicaId| Status {
        replica: r,
        view: 1,
        normal: true,
        new_view: Some(nv.digest()),
        ..Status::default()
    };
    assert_eq!(
        reported(&mut c),
        None,
        "nothing to report after the restart"
    );
    assert!(!c.receive(3, 0, active(0)).rejected());
    assert_eq!(reported(&mut c), None, "reports again on f reports");
    assert!(!c.receive(3, 2, active(2)).rejected());
    assert_eq!(reported(&mut c), Some(nv.digest()), "did not report again");
}

/// The journal holds pre-prepare and prepare records above the log window of the checkpoint
/// the replica restarts at: its state's base is behind the journal's checkpoint (the state
/// was relabelled by a recovery, or the journal rewritten while the replica was compromised).
/// Those slots are left out of the log: it holds only the window above the stable checkpoint,
/// and the replica fetches a vouched checkpoint before it takes part again. Found by the
/// simulator (seed 8891: a slot 29 in a log whose window was (0, 8] after a reboot from a
/// tampered journal).
#[test]
fn journal_records_beyond_the_window_stay_out_of_the_log() {
    let mut c = short_log(2, false);
    for n in 1..=2u64 {
        let pp = pre_prepare(0, n, vec![c.request(7, n, &[n as u8])]);
        c.agree(3, pp, &[1, 2], &[0, 1]);
    }
    let mut records = c.journal(3).to_vec();
    let far = pre_prepare(0, 9, vec![c.request(7, 9, b"far")]);
    records.push(Record::Checkpoint {
        seq: 8,
        digest: Digest([5; 32]),
    });
    records.push(Record::PrePrepared {
        view: 0,
        seq: 9,
        digest: far.digest,
        batch: Some(Arc::new(far.batch.clone())),
        vouched: true,
    });
    records.push(Record::Prepared {
        view: 0,
        seq: 9,
        digest: far.digest,
    });
    c.restart(3, &records);
    assert_eq!(c.replica(3).check_invariants(), Ok(()));
    assert_eq!(c.replica(3).stats.state_unreadable, 1);
}

/// A peer reports having executed as far as our newest checkpoint without holding it stable:
/// it lost our vote (refused across a key refresh, or dropped), and nothing else will make
/// us send it again once the workload stops. We send our vote again on its STATUS. Found by
/// the simulator (default seed 52990: checkpoint 1408 never became stable at 4 of 7
/// replicas after a key refresh, and a proactive recovery waited for it forever).
#[test]
fn a_peer_at_our_checkpoint_without_it_stable_gets_our_vote_again() {
    let mut c = short_log(2, false);
    for n in 1..=2u64 {
        let pp = pre_prepare(0, n, vec![c.request(7, n, &[n as u8])]);
        c.agree(3, pp, &[1, 2], &[0, 1]);
    }
    let ours = c
        .events(3)
        .iter()
        .find_map(|e| match e {
            Event::Executed { seq: 2, .. } => Some(()),
            _ => None,
        })
        .is_some();
    assert!(ours, "replica 3 executed slot 2");
    let status = |executed: Seq| Status {
        replica: 1,
        view: 0,
        normal: true,
        stable: 0,
        last_executed: executed,
        ..Status::default()
    };
    let vote_in = |out: &Out| {
        out.find(|m| match m {
            Message::Pbft(PbftMessage::Checkpoint(k)) if k.seq == 2 && k.replica == 3 => Some(()),
            _ => None,
        })
        .is_some()
    };
    let behind = c.receive(3, 1, status(1));
    assert!(vote_in(&behind), "a peer behind us gets our vote");
    let level = c.receive(3, 1, status(2));
    assert!(
        vote_in(&level),
        "a peer that executed slot 2 but holds only checkpoint 0 stable must get our vote"
    );
}
