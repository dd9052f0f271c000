//! A new primary helps a replica that has not entered its view with the NEW-VIEW again, in
//! answer to that replica's status messages, but at most once per four status intervals: a
//! NEW-VIEW carries the bodies of the batches it chose, and under load the copies sent in
//! answer to every status kept the links full and the receivers busy rejecting them.

mod common;
use common::*;

const CLIENT: u64 = 7;
const STATUS_MS: u64 = 100;

/// Replica 0 (the primary of view 0) is cut off and a request waits, so replicas 1 and 2 move
/// to view 1 with replica 3's VIEW-CHANGE; then nothing reaches replica 3 for `blind_ms`
/// while its status messages, still about the view change, reach the others. Returns the
/// NEW-VIEWs replica 1 sent replica 3 meanwhile and whether replica 3 then entered view 1
/// within a second.
fn new_views_to_a_replica_left_out(blind_ms: u64) -> (usize, bool) {
    let mut c = Cluster::builder(1)
        .live([0, 1, 2, 3])
        .clients([])
        .live_client(CLIENT)
        .config(|cfg| {
            cfg.status_interval_ms = STATUS_MS;
            cfg.view_change_timeout_ms = 500;
        })
        .build();
    let ts = c.invoke(CLIENT, b"before");
    assert!(c.run_until(2_000, |c| c.completed(CLIENT, ts)));
    c.isolate(0);
    let blind = c.block(|e| e.to == replica(3) && e.kind() == "new-view");
    let ts = c.invoke(CLIENT, b"waits");
    assert!(
        c.run_until(5_000, |c| c.replica(1).view() == 1
            && c.replica(1).is_normal()),
        "replica 1 becomes the primary of view 1"
    );
    let deaf = c.block(|e| e.to == replica(3));
    let from = c.sent().len();
    c.run(blind_ms);
    let to_3 = c.sent()[from..]
        .iter()
        .filter(|e| e.from == replica(1) && e.to == replica(3) && e.kind() == "new-view")
        .count();
    assert!(
        c.replica(3).view() == 1 && !c.replica(3).is_normal(),
        "replica 3 is still in the view change: view {}",
        c.replica(3).view()
    );
    c.unblock(deaf);
    c.unblock(blind);
    let entered = c.run_until(1_000, |c| {
        c.replica(3).is_normal() && c.replica(3).view() == 1
    });
    assert!(c.run_until(5_000, |c| c.completed(CLIENT, ts)));
    (to_3, entered)
}

#[test]
fn a_replica_entering_the_view_gets_the_new_view_again_but_not_at_every_status() {
    // Within replica 3's doubled view-change timeout (1 s), so it still waits for view 1.
    let (sent, entered) = new_views_to_a_replica_left_out(800);
    // Its statuses came every 100 ms: eight of them, and a copy for each before.
    assert!(
        (1..=800 / (4 * STATUS_MS) as usize).contains(&sent),
        "one NEW-VIEW per 400 ms at most, and still some: {sent}"
    );
    assert!(
        entered,
        "replica 3 entered view 1 once NEW-VIEWs reached it"
    );
}
