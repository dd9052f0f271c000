//! Prime's component driven alone: four of them exchanging what they return, with no replica
//! around them (the host's part here is only what `replica/prime.rs` does on each message).

use super::*;
use crate::agreement::proposals::Proposals;
use crate::message::Request;
use crate::types::OrderProtocol;
use std::collections::VecDeque;

const N: usize = 4;

fn config() -> Config {
    let mut cfg = Config::new(1);
    cfg.ordering = OrderProtocol::Prime;
    // Rows at every growth (a test of its own checks the interval).
    cfg.prime_row_interval_ms = 0;
    cfg
}

fn order_key(i: usize) -> HolderSecrets {
    HolderSecrets::from_seed(&[i as u8 + 1; 32])
}

fn request(client: ClientId, op: &[u8]) -> SignedRequest {
    SignedRequest {
        request: Request {
            client,
            timestamp: 1,
            read_only: false,
            op: bytes::Bytes::copy_from_slice(op),
        },
        auth: Arc::from(Vec::new()),
        sig: None,
    }
}

/// No recovery installed a key anywhere: the keys dealt at `init` are in force.
fn dealt(_: ReplicaId) -> Option<(u64, VerifyKey)> {
    None
}

/// Four components and the messages between them.
struct Net {
    sides: Vec<PrimeSide>,
    queue: VecDeque<(ReplicaId, ReplicaId, Message)>,
    /// Links that lose everything (from, to).
    cut: Vec<(ReplicaId, ReplicaId)>,
    journaled: Vec<Vec<Record>>,
}

impl Net {
    fn new() -> Net {
        let cfg = config();
        let orders: Arc<Vec<VerifyKey>> =
            Arc::new((0..N).map(|i| order_key(i).public().verify).collect());
        let sides = (0..N)
            .map(|i| {
                let mut s = PrimeSide::new(&cfg, i as ReplicaId, 0);
                s.set_keys(orders.clone(), order_key(i));
                s
            })
            .collect();
        Net {
            sides,
            queue: VecDeque::new(),
            cut: Vec::new(),
            journaled: vec![Vec::new(); N],
        }
    }

    /// Takes what replica `i` returned.
    fn collect(&mut self, i: ReplicaId) {
        for o in self.sides[i as usize].take_outs() {
            match o {
                Out::Broadcast(m) => {
                    for j in (0..N as ReplicaId).filter(|j| *j != i) {
                        self.queue.push_back((i, j, m.clone()));
                    }
                }
                Out::Send(j, m) => self.queue.push_back((i, j, m)),
                Out::Persist(r) => self.journaled[i as usize].push(r),
            }
        }
    }

    /// Delivers everything until nothing moves; what the host would do on each message.
    fn run(&mut self) {
        while let Some((from, to, msg)) = self.queue.pop_front() {
            if self.cut.contains(&(from, to)) {
                continue;
            }
            let s = &mut self.sides[to as usize];
            let fresh = match msg {
                Message::Prime(PrimeMessage::PoRequest(r)) => {
                    s.po_request_shape(from, r.originator, &r).unwrap();
                    s.on_po_request(r).unwrap()
                }
                Message::Prime(PrimeMessage::PoAck(a)) => {
                    s.on_po_ack(from, &a).unwrap();
                    true
                }
                Message::Prime(PrimeMessage::PoAru(row)) => {
                    s.on_po_aru(row, &dealt).unwrap();
                    false
                }
                Message::Prime(PrimeMessage::PoCopy(c)) => {
                    s.po_request_shape(from, c.replica, &c.request).unwrap();
                    s.on_po_copy(from, c.request, true)
                }
                Message::Prime(PrimeMessage::PoFetch(f)) => {
                    s.on_po_fetch(from, &f, usize::MAX).unwrap();
                    false
                }
                Message::Prime(PrimeMessage::Summary(sum)) => {
                    for row in s.summary_rows(from, sum).unwrap() {
                        s.on_po_aru(row, &dealt).unwrap();
                    }
                    false
                }
                other => panic!("not Prime's: {other:?}"),
            };
            if fresh {
                s.send_acks();
                s.sign_row(0);
            }
            self.collect(to);
        }
    }

    fn introduce(&mut self, i: ReplicaId, requests: Vec<SignedRequest>) {
        self.sides[i as usize].introduce(requests);
        self.collect(i);
        self.run();
    }

    /// What each replica runs for the leader's matrix, from nothing executed.
    fn derive_everywhere(&self, m: &Matrix) -> Vec<Result<Derived, Holes>> {
        self.sides
            .iter()
            .map(|s| s.derive(&s.counted(m, &dealt), &[0; N]))
            .collect()
    }
}

#[test]
fn a_request_introduced_anywhere_runs_alike_everywhere() {
    let mut net = Net::new();
    let req = request(7, b"put a 1");
    net.introduce(1, vec![req.clone()]);
    // Introduced, held, acknowledged and signed into rows by all four.
    assert!(net.journaled[1]
        .iter()
        .any(|r| matches!(r, Record::Introduced { .. })));
    for j in [0, 2, 3] {
        assert!(net.journaled[j]
            .iter()
            .any(|r| matches!(r, Record::Held { .. })));
    }
    let leader = &mut net.sides[0];
    assert!(leader.would_advance(&[0; N]));
    let m = leader.proposing(10);
    for d in net.derive_everywhere(&m) {
        let Derived { requests, after } = d.expect("every replica holds the PO-REQUEST");
        assert_eq!(requests, vec![req.clone()]);
        assert_eq!(after, vec![0, 1, 0, 0]);
    }
}

#[test]
fn a_request_too_few_acknowledge_is_not_eligible() {
    let mut net = Net::new();
    // Replica 1's PO-REQUEST reaches only replica 2: two acknowledgements of 2f+1.
    net.cut = vec![(1, 0), (1, 3)];
    net.introduce(1, vec![request(7, b"put a 1")]);
    // No certificate anywhere, so no row reports it.
    for s in &net.sides {
        assert_eq!(s.rows().1[1], 0);
    }
    let leader = &mut net.sides[0];
    assert!(!leader.would_advance(&[0; N]));
    let m = leader.proposing(10);
    for d in net.derive_everywhere(&m) {
        let Derived { requests, after } = d.expect("nothing needed");
        assert!(requests.is_empty());
        assert_eq!(after, vec![0; N]);
    }
}

#[test]
fn an_ordered_matrix_makes_eligible_only_what_2f_plus_1_rows_report() {
    let mut net = Net::new();
    net.introduce(1, vec![request(7, b"put a 1")]);
    let mut m = (*net.sides[0].proposing(10)).clone();
    // Only f+1 rows (replicas 2 and 3) report the certificate.
    m.rows[0] = None;
    m.rows[1] = None;
    for d in net.derive_everywhere(&m) {
        let Derived { requests, after } = d.expect("nothing needed");
        assert!(requests.is_empty());
        assert_eq!(after, vec![0; N]);
    }
}

#[test]
fn a_replica_missing_an_ordered_request_asks_and_fills_it_from_f_plus_one_copies() {
    let mut net = Net::new();
    // Replica 3 never gets replica 1's PO-REQUEST (but the others' rows and acks).
    net.cut = vec![(1, 3)];
    let req = request(7, b"put a 1");
    net.introduce(1, vec![req.clone()]);
    let m = net.sides[0].proposing(10);
    let s3 = &mut net.sides[3];
    let holes = s3
        .derive(&s3.counted(&m, &dealt), &[0; N])
        .expect_err("replica 3 lacks it");
    assert_eq!(holes, vec![(1, 1)]);
    s3.ask_for(holes, true, 10, false);
    // A second ask within the status interval is not sent.
    s3.ask_for(vec![(1, 1)], true, 11, false);
    let fetches = s3
        .take_outs()
        .into_iter()
        .filter(|o| matches!(o, Out::Broadcast(Message::Prime(PrimeMessage::PoFetch(_)))))
        .count();
    assert_eq!(fetches, 1);
    // Every peer answers; replica 1's copy is lost on the cut link, two others' suffice.
    let fetch = Message::from(PoFetch {
        replica: 3,
        wanted: vec![(1, 1)],
    });
    for j in 0..3 {
        net.queue.push_back((3, j, fetch.clone()));
    }
    net.run();
    let s3 = &net.sides[3];
    let Derived { requests, .. } = s3
        .derive(&s3.counted(&m, &dealt), &[0; N])
        .expect("filled from f+1 copies");
    assert_eq!(requests, vec![req]);
}

#[test]
fn rows_not_signed_with_the_key_in_force_are_refused() {
    let mut net = Net::new();
    net.introduce(1, vec![request(7, b"put a 1")]);
    let (rows, _) = net.sides[0].rows();
    let row = rows[1].clone().expect("replica 1's row");
    let s0 = &mut net.sides[0];
    // Signed with another replica's key.
    let forged = SignedPoAru {
        sig: order_key(2).sign(&row.statement().0),
        row: row.clone(),
    };
    assert_eq!(s0.on_po_aru(forged, &dealt), Err(Reject::BadSignature));
    // Signed with the right key, but named for an incarnation a recovery retired: where a
    // recovery installed incarnation 1, a row of incarnation 0 counts for nothing.
    let installed = |j: ReplicaId| (j == 1).then(|| (1, order_key(9).public().verify));
    let m = s0.proposing(10);
    let counted = s0.counted(&m, &installed);
    assert!(counted.rows[1].is_none());
    assert!(counted.rows[2].is_some());
}

#[test]
fn a_recovered_replicas_numbering_is_fenced_a_window_above() {
    let mut net = Net::new();
    let s = &mut net.sides[0];
    s.recovered(2);
    let w = config().prime_window;
    assert_eq!(s.fence(&[3, 4, 5, 6]), vec![3, 4, 5 + w, 6]);
    // Once: the next ordinal fences nothing.
    assert_eq!(s.fence(&[3, 4, 5, 6]), vec![3, 4, 5, 6]);
}

#[test]
fn a_restart_gives_back_what_the_journal_holds() {
    let mut net = Net::new();
    let req = request(7, b"put a 1");
    net.introduce(1, vec![req.clone()]);
    let m = net.sides[0].proposing(10);
    // Replica 2 restarts from its journal: it still holds the PO-REQUEST and its certificate.
    let mut fresh = PrimeSide::new(&config(), 2, 0);
    fresh.set_keys(
        Arc::new((0..N).map(|i| order_key(i).public().verify).collect()),
        order_key(2),
    );
    fresh.restore(&net.journaled[2]);
    let Derived { requests, .. } = fresh
        .derive(&fresh.counted(&m, &dealt), &[0; N])
        .expect("restored from the journal");
    assert_eq!(requests, vec![req]);
}

#[test]
fn rows_under_load_wait_for_the_interval_and_one_covering_everything_goes_at_once() {
    let mut cfg = config();
    cfg.prime_row_interval_ms = 5;
    let orders: Arc<Vec<VerifyKey>> =
        Arc::new((0..N).map(|i| order_key(i).public().verify).collect());
    let mut s = PrimeSide::new(&cfg, 0, 0);
    s.set_keys(orders, order_key(0));
    let po = |originator: ReplicaId, op: &[u8]| {
        Arc::new(PoRequest {
            originator,
            seq: 1,
            requests: vec![request(originator as ClientId + 10, op)],
        })
    };
    let ack = |from: ReplicaId, r: &PoRequest| PoAck {
        replica: from,
        parts: vec![crate::prime::preorder::AckPart {
            originator: r.originator,
            seq: r.seq,
            digest: r.digest(),
        }],
    };
    let (a, b) = (po(1, b"a"), po(3, b"b"));
    assert!(s.on_po_request(a.clone()).unwrap());
    assert!(s.on_po_request(b.clone()).unwrap());
    s.send_acks();
    for j in [1, 2] {
        s.on_po_ack(j, &ack(j, &a)).unwrap();
    }
    // A is certified here, B not yet: the row waits for the interval.
    assert_eq!(s.rows().1, vec![0, 1, 0, 0]);
    assert!(!s.sign_row(1));
    assert!(!s.row_due(4));
    assert!(s.row_due(5));
    assert!(s.sign_row(5));
    assert!(!s.row_due(6));
    // B certified: a row covering everything held goes at once, within the interval.
    for j in [1, 2] {
        s.on_po_ack(j, &ack(j, &b)).unwrap();
    }
    assert!(s.sign_row(6));
    let rows = s
        .take_outs()
        .into_iter()
        .filter(|o| matches!(o, Out::Broadcast(Message::Prime(PrimeMessage::PoAru(_)))))
        .count();
    assert_eq!(rows, 2);
}

/// Prime's proposals driven through agreement's interface alone, as agreement drives them: a
/// matrix proposal is well formed (a batch of requests is not), is accepted, and when
/// committed runs what it made eligible; a replica missing an ordered PO-REQUEST is told to
/// wait and asks for it; the ordinal's execution is followed by reconciliation's copies, not
/// while replaying; checkpoints, stability and a state jump keep pre-ordering in step.
#[test]
fn prime_proposals_through_the_ordering_interface() {
    use crate::agreement::proposals::Host;
    let mut net = Net::new();
    net.cut = vec![(1, 3)];
    let req = request(7, b"put a 1");
    net.introduce(1, vec![req.clone()]);
    let m = net.sides[0].proposing(10);
    let proposal = Batch {
        nondet: crate::message::NonDet {
            time_ms: 10,
            seed: 1,
        },
        requests: Vec::new(),
        matrix: Some(m),
    };
    let host = |eligible: &'static [Seq], replaying| Host {
        now: 10,
        replaying,
        executed: 0,
        eligible,
        installed: &dealt,
    };
    let digest = proposal.digest();
    for (i, s) in net.sides.iter_mut().enumerate() {
        let p: &mut dyn Proposals = s;
        assert!(!p.leader_batches());
        assert!(p.well_formed(&proposal, 0));
        assert!(
            !p.well_formed(&proposal, 1),
            "nothing travels beside a matrix"
        );
        assert!(
            !p.well_formed(&request_batch(&req), 0),
            "Prime proposes matrices"
        );
        assert!(p.signed_validly(&proposal, &dealt));
        p.accepted(&proposal, &host(&[], false));
        let runs = p.runs(1, &digest, &proposal, &host(&[], false));
        if i == 3 {
            // Replica 3 never received the PO-REQUEST: not yet, and it asks.
            assert!(runs.is_err());
            assert!(p
                .take_outs()
                .iter()
                .any(|o| matches!(o, Out::Broadcast(Message::Prime(PrimeMessage::PoFetch(_))))));
            continue;
        }
        let e = runs
            .expect("held")
            .expect("a matrix runs what it made eligible");
        assert_eq!(e.run.requests, vec![req.clone()]);
        assert_eq!(e.after, vec![0, 1, 0, 0]);
        let fenced = p.fence(&e.after);
        assert_eq!(fenced, e.after);
        assert!(p
            .ran(&proposal, &[], &e.after, &fenced, &host(&[], true))
            .is_none());
    }
    // A live ordinal is followed up: replica 1's copy goes to replica 3, which lacks it.
    let s1: &mut dyn Proposals = &mut net.sides[1];
    let _ = s1.take_outs();
    let f = s1.ran(
        &proposal,
        &[],
        &[0, 1, 0, 0],
        &[0, 1, 0, 0],
        &host(&[], false),
    );
    s1.follow_up(f.expect("a live ordinal is followed up"));
    let copies: Vec<ReplicaId> = s1
        .take_outs()
        .into_iter()
        .filter_map(|o| match o {
            Out::Send(to, Message::Prime(PrimeMessage::PoCopy(_))) => Some(to),
            _ => None,
        })
        .collect();
    assert!(
        copies.contains(&3),
        "reconciliation reaches the replica without it"
    );
    // Checkpoint 1 holds the eligibility; once stable, its certified copies go, and a
    // state jump is journaled.
    let s0: &mut dyn Proposals = &mut net.sides[0];
    s0.checkpoint(1, &[0, 1, 0, 0]);
    s0.stable(1);
    assert!(s0.sync(&[0, 1, 0, 0]));
    assert!(s0.order_keys());
    assert!(s0.prime().is_some());
}

fn request_batch(req: &SignedRequest) -> Batch {
    Batch {
        nondet: crate::message::NonDet {
            time_ms: 10,
            seed: 1,
        },
        requests: vec![req.clone()],
        matrix: None,
    }
}
