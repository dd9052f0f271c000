//! PBFT's check of the primary's pace (`primary_pace_window_ms`): a primary whose windows
//! fall below half the pace of the windows before, while requests wait, is replaced long
//! before any request timer fires; a steady primary keeps its view.

mod common;
use common::*;

const CLIENT: u64 = 7;
const TIMEOUT_MS: u64 = 10_000;

fn cluster(window_ms: u64) -> Cluster {
    Cluster::builder(1)
        .live([0, 1, 2, 3])
        .clients([])
        .live_client(CLIENT)
        .config(|cfg| {
            cfg.primary_pace_window_ms = window_ms;
            cfg.view_change_timeout_ms = TIMEOUT_MS;
            cfg.view_change_timeout_max_ms = 4 * TIMEOUT_MS;
        })
        .build()
}

/// Runs operations back to back until `until_ms`.
fn busy_until(c: &mut Cluster, until_ms: u64) {
    let mut i = 0u32;
    while c.now < until_ms {
        let ts = c.invoke(CLIENT, format!("op{i}").as_bytes());
        assert!(
            c.run_until(2_000, |c| c.completed(CLIENT, ts)),
            "operation {ts} completes"
        );
        i += 1;
    }
}

/// The primary of view 0 turns slow at 1.5 s: its pre-prepares stop reaching the backups
/// (a primary holding them back looks the same from the backups until it sends them).
/// Returns when the backups left view 0, if they did within 5 s.
fn slow_primary_replaced_at(window_ms: u64) -> Option<u64> {
    let mut c = cluster(window_ms);
    busy_until(&mut c, 1_500);
    assert_eq!(c.replica(1).view(), 0);
    c.block(|e| e.from == replica(0) && e.kind() == "pre-prepare");
    let ts = c.invoke(CLIENT, b"held");
    let left = c.run_until(5_000, |c| (1..4).all(|r| c.replica(r).view() >= 1));
    let at = c.now;
    // Whatever happened, the operation completes in the end.
    assert!(c.run_until(4 * TIMEOUT_MS, |c| c.completed(CLIENT, ts)));
    left.then_some(at)
}

#[test]
fn a_primary_that_slows_down_is_replaced_after_a_window() {
    let at = slow_primary_replaced_at(200).expect("replaced within 5 s");
    assert!(
        at <= 1_500 + 2 * 200 + 100,
        "within two windows of the slowdown (and a view change): {at} ms"
    );
}

#[test]
fn without_the_check_only_the_request_timer_replaces_it() {
    assert_eq!(
        slow_primary_replaced_at(0),
        None,
        "the {TIMEOUT_MS} ms timer had not fired in 5 s"
    );
}

#[test]
fn a_steady_primary_keeps_its_view() {
    let mut c = cluster(200);
    busy_until(&mut c, 3_000);
    for r in 0..4 {
        assert_eq!(c.replica(r).view(), 0, "replica {r}");
        assert_eq!(c.replica(r).stats.slow_primaries, 0);
    }
    // An idle cluster: nothing waits, nothing is checked against.
    c.run(3_000);
    assert_eq!(c.replica(0).view(), 0);
}
