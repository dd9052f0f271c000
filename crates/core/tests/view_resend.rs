//! A replica helps a peer that has not entered its view with the NEW-VIEW (if it is the
//! view's primary) and its own VIEW-CHANGE again, in answer to that peer's status messages,
//! but at most once per four status intervals: a NEW-VIEW carries the bodies of the batches
//! it chose, and under load the copies sent in answer to every status kept the links full and
//! the receivers busy rejecting them; a replica resuming after a stop answered the backlog
//! of its peers' statuses with a VIEW-CHANGE each.

mod common;
use common::*;

const CLIENT: u64 = 7;
const STATUS_MS: u64 = 100;

/// A cluster of four with a client, statuses every `STATUS_MS`, that has completed one
/// request in view 0.
fn cluster(view_change_timeout_ms: u64) -> Cluster {
    let mut c = Cluster::builder(1)
        .live([0, 1, 2, 3])
        .clients([])
        .live_client(CLIENT)
        .config(|cfg| {
            cfg.status_interval_ms = STATUS_MS;
            cfg.view_change_timeout_ms = view_change_timeout_ms;
        })
        .build();
    let ts = c.invoke(CLIENT, b"before");
    assert!(c.run_until(2_000, |c| c.completed(CLIENT, ts)));
    c
}

/// Replica 0 (the primary of view 0) is cut off and a request waits, so replicas 1 and 2 move
/// to view 1 with replica 3's VIEW-CHANGE; then nothing reaches replica 3 for `blind_ms`
/// while its status messages, still about the view change, reach the others. Returns the
/// NEW-VIEWs replica 1 sent replica 3 meanwhile and whether replica 3 then entered view 1
/// within a second.
fn new_views_to_a_replica_left_out(blind_ms: u64) -> (usize, bool) {
    let mut c = cluster(500);
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

/// Replica 0 (the primary of view 0) is cut off while the others move to view 1; then its
/// status messages, still of view 0, reach them for `deaf_ms` while nothing reaches it.
/// Returns the VIEW-CHANGEs replica 2 sent replica 0 meanwhile and whether replica 0 then
/// entered view 1 within a second.
fn view_changes_to_a_replica_behind(deaf_ms: u64) -> (usize, bool) {
    // Long enough that the resend gap is four status intervals, not half the timeout.
    let mut c = cluster(1_000);
    let cut = c.isolate(0);
    let ts = c.invoke(CLIENT, b"waits");
    assert!(
        c.run_until(5_000, |c| (1..4)
            .all(|r| c.replica(r).view() == 1 && c.replica(r).is_normal())),
        "replicas 1 to 3 enter view 1"
    );
    assert!(c.run_until(5_000, |c| c.completed(CLIENT, ts)));
    let deaf = c.block(|e| e.to == replica(0));
    c.unblock(cut);
    let from = c.sent().len();
    c.run(deaf_ms);
    let to_0 = c.sent()[from..]
        .iter()
        .filter(|e| e.from == replica(2) && e.to == replica(0) && e.kind() == "view-change")
        .count();
    let statuses = c.sent()[from..]
        .iter()
        .filter(|e| e.from == replica(0) && e.to == replica(2) && e.kind() == "status")
        .count();
    assert!(
        statuses as u64 >= deaf_ms / STATUS_MS - 1,
        "replica 0's statuses reached replica 2: {statuses}"
    );
    assert_eq!(c.replica(0).view(), 0, "replica 0 heard nothing yet");
    c.unblock(deaf);
    let entered = c.run_until(1_000, |c| {
        c.replica(0).is_normal() && c.replica(0).view() == 1
    });
    (to_0, entered)
}

#[test]
fn a_replica_behind_gets_a_view_change_again_but_not_at_every_status() {
    let (sent, entered) = view_changes_to_a_replica_behind(800);
    assert!(
        (1..=1 + 800 / (4 * STATUS_MS) as usize).contains(&sent),
        "one VIEW-CHANGE per 400 ms at most (eight statuses came), and still some: {sent}"
    );
    assert!(
        entered,
        "replica 0 entered view 1 once the copies reached it"
    );
}
