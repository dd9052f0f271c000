//! Large requests that travel beside the pre-prepare (clients multicast them, the pre-prepare
//! names them by digest): resolving a pending pre-prepare whatever the arrival order, from a
//! request its client has since replaced, the bound on replaced requests, and what a replica
//! sends again when a status asks (lean pre-prepares, batch bodies one replica at a time).
//!
//! Moved from `regressions.rs` (names unchanged).

use redoubt_core::message::*;
use redoubt_core::*;
use redoubt_crypto::Digest;

mod common;
use common::*;

/// A request of `client` at `timestamp` with a 2 KiB operation, which travels beside the
/// pre-prepare by default, and its authenticator.
fn large_request(c: &Cluster, client: u64, timestamp: u64) -> SignedRequest {
    c.request(client, timestamp, &[client as u8; 2048])
}

/// Whether `out` holds replica `from`'s PREPARE for slot 1 with digest `d`.
fn prepares(out: &Out, from: u32, d: Digest) -> bool {
    out.any(
        |m| matches!(m, Message::Pbft(PbftMessage::Prepare(p)) if p.seq == 1 && p.digest == d && p.replica == from),
    )
}

/// A status of replica 3, behind at the start of view 0 and asking for `missing` bodies.
fn status_of_r3(missing: Vec<Digest>) -> Status {
    Status {
        replica: 3,
        view: 0,
        normal: true,
        new_view: None,
        last_executed: 0,
        stable: 0,
        prepared: vec![],
        committed: vec![],
        missing_batches: missing,
        missing_vcs: vec![],
    }
}

/// A backup that holds a pre-prepare waiting for the requests beside it accepts it when
/// the last of them arrives, whatever their order (it now keeps how many, from the first,
/// it holds, instead of rebuilding the whole batch at every arrival).
#[test]
fn a_pending_pre_prepare_resolves_when_its_last_request_arrives_in_any_order() {
    for order in [[2usize, 0, 1], [0, 1, 2], [2, 1, 0], [1, 2, 0]] {
        let mut c = Cluster::builder(1).live([1]).build();
        let requests = [7, 8, 9].map(|client| large_request(&c, client, 1));
        let pp = lean_pre_prepare(0, 1, &requests);
        let d = pp.digest;
        let out = c.receive(1, 0, pp);
        assert!(
            out.messages().is_empty(),
            "no request yet: nothing to vouch for"
        );
        c.advance(1);
        for (k, i) in order.iter().enumerate() {
            let out = c.receive_request(1, &requests[*i]);
            assert_eq!(prepares(&out, 1, d), k == 2, "order {order:?}, arrival {k}");
        }
    }
}

/// What reaches replica 1 of client 7's large requests at timestamps 1 (`First`) and 2
/// (`Second`), and of the primary's lean pre-prepare of the first.
#[derive(Clone, Copy)]
enum Arrival {
    First,
    Second,
    PrePrepare,
}

/// Replica 1 gets `arrivals`, one per ms from time 0; returns the cluster, what replica 1 did
/// at each arrival, and the pre-prepare.
fn client_7_moves_on(arrivals: [Arrival; 3]) -> (Cluster, Vec<Out>, PrePrepare) {
    let mut c = Cluster::builder(1).live([1]).build();
    let (first, second) = (large_request(&c, 7, 1), large_request(&c, 7, 2));
    let pp = lean_pre_prepare(0, 1, std::slice::from_ref(&first));
    let mut outs = vec![];
    for (t, arrival) in arrivals.into_iter().enumerate() {
        c.advance_to(t as u64);
        outs.push(match arrival {
            Arrival::First => c.receive_request(1, &first),
            Arrival::Second => c.receive_request(1, &second),
            Arrival::PrePrepare => c.receive(1, 0, pp.clone()),
        });
    }
    (c, outs, pp)
}

/// A lagging backup that receives a client's next request before the pre-prepare naming
/// the one before (the client completed on the other replicas' replies and moved on)
/// resolves that pre-prepare from the request it kept, and prepares at once. Before, the
/// newer request replaced the older one, the pre-prepare waited, and the backup asked the
/// others for the whole batch in its status messages: under a 4/0 load with a quarter core
/// per replica, hundreds of batch bodies and several state transfers in ten seconds.
#[test]
fn a_backup_resolves_a_pre_prepare_from_a_request_its_client_has_since_replaced() {
    use Arrival::*;
    let (mut c, outs, pp) = client_7_moves_on([First, Second, PrePrepare]);
    assert!(
        prepares(&outs[2], 1, pp.digest),
        "the backup vouches from its kept copy"
    );
    assert_eq!(c.replica(1).stats.beside_from_replaced, 1);
    // The same pre-prepare again (a retransmission) is not counted again.
    c.advance_to(3);
    c.receive(1, 0, pp);
    assert_eq!(c.replica(1).stats.beside_from_replaced, 1);
}

/// The same when the older request arrives after the newer one (reordered, or lost and sent
/// again), and after the pre-prepare that waits for it: it is kept although it is older than
/// the client's waiting request, and the pending pre-prepare resolves (and is counted).
#[test]
fn a_request_older_than_its_clients_waiting_one_still_resolves_a_pending_pre_prepare() {
    use Arrival::*;
    let (c, outs, pp) = client_7_moves_on([Second, PrePrepare, First]);
    assert!(!prepares(&outs[1], 1, pp.digest), "the request is missing");
    assert!(
        prepares(&outs[2], 1, pp.digest),
        "the late request resolves the pre-prepare"
    );
    assert_eq!(c.replica(1).stats.beside_from_replaced, 1);
}

/// Replica 1 gets client 7's large requests at timestamps 1 to `last` (one per ms), checking
/// after each that what it keeps of the replaced ones stays within `fits`.
fn requests_up_to(c: &mut Cluster, last: u64, fits: impl Fn(&Footprint) -> bool) {
    for t in 1..=last {
        c.advance_to(t);
        let sr = large_request(c, 7, t);
        c.receive_request(1, &sr);
        assert!(fits(&c.replica(1).footprint()), "at timestamp {t}");
    }
}

/// The replaced requests a replica keeps are bounded (four batches' worth by default), the
/// oldest dropped first.
#[test]
fn replaced_requests_are_bounded_and_the_oldest_go_first() {
    // By bytes: with batches of at most 8 KiB, 16 KiB of operations (eight requests).
    let mut c = Cluster::builder(1)
        .live([1])
        .config(|c| {
            c.batch_bytes_max = 8192;
            c.request_bytes_max = 4096;
        })
        .build();
    let bound = c.replica(1).footprint_bounds(1);
    assert!(bound.replaced > 8, "the count is not what binds here");
    requests_up_to(&mut c, 20, |fp| fp.replaced_bytes <= bound.replaced_bytes);
    assert_eq!(c.replica(1).footprint().replaced, 8);
    // By count (the default sizes):
    let most = Cluster::builder(1)
        .live([1])
        .build()
        .replica(1)
        .footprint_bounds(1)
        .replaced;
    let last = most as u64 + 10;
    let kept = last - most as u64;
    // The oldest kept one still resolves a pre-prepare; one older than that does not.
    for (ts, resolves) in [(kept, true), (kept - 1, false)] {
        let mut c = Cluster::builder(1).live([1]).build();
        requests_up_to(&mut c, last, |fp| fp.replaced <= most);
        assert_eq!(c.replica(1).footprint().replaced, most);
        let pp = lean_pre_prepare(0, 1, &[large_request(&c, 7, ts)]);
        let d = pp.digest;
        c.advance(1);
        let out = c.receive(1, 0, pp);
        assert_eq!(prepares(&out, 1, d), resolves, "timestamp {ts}");
    }
}

/// A primary answering a status resends its pre-prepare as it sent it: requests that
/// travel beside it are named by digest (the backup holds them, or asks for the batch), not
/// copied in; helping a slow backup used to cost every large request's bytes again.
#[test]
fn a_retransmitted_pre_prepare_names_large_requests_beside_it() {
    let mut c = Cluster::builder(1).live([0]).build();
    let sr = large_request(&c, 7, 1);
    let sent = c.receive_request(0, &sr).pre_prepare();
    let sent = sent.expect("the primary proposes at once");
    assert_eq!((sent.batch.requests.len(), sent.beside.len()), (0, 1));
    c.advance_to(10);
    let again: Vec<PrePrepare> = c
        .receive(0, 3, status_of_r3(vec![]))
        .messages()
        .into_iter()
        .filter_map(|(to, m)| match m {
            Message::Pbft(PbftMessage::PrePrepare(pp)) if to == Some(replica(3)) => Some(pp),
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
    let mut c = Cluster::builder(1).live([1, 2]).build();
    let sr = large_request(&c, 7, 1);
    let pp = lean_pre_prepare(0, 1, std::slice::from_ref(&sr));
    let d = pp.digest;
    for to in [1, 2] {
        c.receive_request(to, &sr);
        c.receive(to, 0, pp.clone());
    }
    let interval = c.cfg.status_interval_ms;
    let mut answered = vec![];
    for turn in 0..6u64 {
        c.advance_to(turn * interval + 1);
        for to in [1, 2] {
            let out = c.receive(to, 3, status_of_r3(vec![d]));
            if out.messages().iter().any(|(dest, m)| {
                *dest == Some(replica(3))
                    && matches!(m, Message::Pbft(PbftMessage::Batches(b)) if b.iter().any(|b| b.digest() == d))
            }) {
                answered.push((turn, to));
            }
        }
    }
    // Turns go to replicas 0, 1, 2, 0, 1, 2 (all but the asker, 3); 0 holds nothing here.
    assert_eq!(answered, vec![(1, 1), (2, 2), (4, 1), (5, 2)]);
}
