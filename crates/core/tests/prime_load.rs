//! Prime under load. Work per turn (`Input::Idle`): the requests, PO-REQUESTs and
//! acknowledgements a busy replica reads in one turn of its host cost one PO-REQUEST and one
//! PO-ACK, not one per frame read; a host that never ends a turn still gets them out at the
//! next tick. The clients' signatures in a PO-REQUEST are checked in one batch, and one bad
//! signature among them refuses it.

use redoubt_core::message::{ClientMessage, PrimeMessage};
use redoubt_core::message::{Message, PoRequest, SignedRequest};
use redoubt_core::*;
use std::sync::Arc;

mod common;
use common::*;

const CLIENTS: [ClientId; 3] = [1, 2, 3];

/// A Prime cluster whose replicas have exchanged their session keys.
fn cluster() -> Cluster {
    let mut c = Cluster::builder(1).prime().clients(CLIENTS).build();
    c.run(1_000);
    c
}

/// Client `cl`'s signed request at timestamp 1.
fn signed(c: &Cluster, cl: ClientId) -> SignedRequest {
    c.sign(c.request(cl, 1, format!("put k{cl} v").as_bytes()))
}

/// Each client's request, as it sends it.
fn requests(c: &Cluster) -> Vec<(Principal, Message)> {
    CLIENTS
        .iter()
        .map(|&cl| {
            (
                Principal::Client(cl),
                Message::Client(ClientMessage::Request(signed(c, cl))),
            )
        })
        .collect()
}

/// The first PO-REQUEST of each of replicas 0, 2 and 3, each introducing one client's request.
fn po_requests(c: &Cluster) -> Vec<(Principal, Message)> {
    [0u32, 2, 3]
        .iter()
        .zip(CLIENTS)
        .map(|(&r, cl)| {
            let po = PoRequest {
                originator: r,
                seq: 1,
                requests: vec![signed(c, cl)],
            };
            (
                Principal::Replica(r),
                Message::Prime(PrimeMessage::PoRequest(Arc::new(po))),
            )
        })
        .collect()
}

/// The PO-REQUESTs sent, each once (a tick also retransmits those not yet certified).
fn po_requests_sent(out: &Out) -> Vec<Arc<PoRequest>> {
    let mut sent: Vec<Arc<PoRequest>> = Vec::new();
    for (_, m) in out.messages() {
        if let Message::Prime(PrimeMessage::PoRequest(p)) = m {
            if !sent.contains(&p) {
                sent.push(p);
            }
        }
    }
    sent
}

fn po_acks_sent(out: &Out) -> usize {
    out.messages()
        .iter()
        .filter(|(_, m)| matches!(m, Message::Prime(PrimeMessage::PoAck(_))))
        .count()
}

#[test]
fn requests_read_in_one_turn_go_out_in_one_po_request() {
    let mut c = cluster();
    let msgs = requests(&c);
    let out = c.receive_turn(1, msgs, true);
    let sent = po_requests_sent(&out);
    assert_eq!(sent.len(), 1, "one PO-REQUEST: {sent:?}");
    assert_eq!(sent[0].requests.len(), CLIENTS.len());

    // Read in turns of their own, each goes out alone (what the assertion above rules out).
    let mut c = cluster();
    let mut sent = Vec::new();
    for m in requests(&c) {
        sent.extend(po_requests_sent(&c.receive_turn(1, vec![m], true)));
    }
    assert_eq!(sent.len(), CLIENTS.len());
}

#[test]
fn po_requests_read_in_one_turn_are_acknowledged_in_one_po_ack() {
    let mut c = cluster();
    let msgs = po_requests(&c);
    let out = c.receive_turn(1, msgs, true);
    assert!(!out.rejected(), "{:?}", out.events());
    assert_eq!(po_acks_sent(&out), 1, "{:?}", out.messages());
    let parts = out
        .find(|m| match m {
            Message::Prime(PrimeMessage::PoAck(a)) => Some(a.parts),
            _ => None,
        })
        .expect("a PO-ACK");
    assert_eq!(parts.len(), 3, "{parts:?}");

    let mut c = cluster();
    let mut acks = 0;
    for m in po_requests(&c) {
        acks += po_acks_sent(&c.receive_turn(1, vec![m], true));
    }
    assert_eq!(acks, 3);
}

#[test]
fn a_turn_that_never_ends_goes_out_at_the_next_tick() {
    let mut c = cluster();
    let msgs = requests(&c);
    let out = c.receive_turn(1, msgs, false);
    assert!(po_requests_sent(&out).is_empty(), "{:?}", out.messages());
    c.advance(1);
    let out = c.tick(1);
    let sent = po_requests_sent(&out);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].requests.len(), CLIENTS.len());
}

/// Replica 0's PO-REQUEST 1 introducing every client's request, the one at `bad` (if any)
/// under a signature of another request.
fn po_request_signed(c: &Cluster, bad: Option<usize>) -> Message {
    let mut requests: Vec<SignedRequest> = CLIENTS.iter().map(|&cl| signed(c, cl)).collect();
    if let Some(i) = bad {
        let other = c.sign(c.request(CLIENTS[i], 1, b"put elsewhere v"));
        requests[i].sig = other.sig;
    }
    Message::Prime(PrimeMessage::PoRequest(Arc::new(PoRequest {
        originator: 0,
        seq: 1,
        requests,
    })))
}

#[test]
fn one_bad_client_signature_refuses_the_po_request_wherever_it_is() {
    for bad in 0..CLIENTS.len() {
        let mut c = cluster();
        let m = po_request_signed(&c, Some(bad));
        let out = c.receive_turn(1, vec![(Principal::Replica(0), m)], true);
        assert!(
            out.events().iter().any(|e| matches!(
                e,
                Event::Rejected {
                    reason: Reject::BadRequestAuth,
                    ..
                }
            )),
            "bad at {bad}: {:?}",
            out.events()
        );
        assert_eq!(po_acks_sent(&out), 0, "bad at {bad}");
    }
    let mut c = cluster();
    let m = po_request_signed(&c, None);
    let out = c.receive_turn(1, vec![(Principal::Replica(0), m)], true);
    assert!(!out.rejected(), "{:?}", out.events());
    assert_eq!(po_acks_sent(&out), 1);
}
