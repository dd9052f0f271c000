//! A Prime client sends its ordered requests to one replica, its home, which introduces them
//! in its PO-REQUESTs. A faulty home that never introduces them must cost the client one
//! retransmission timeout, not one per request (simulator seed 3,238 of `--ordering prime`:
//! a correct client whose home was the faulty replica completed 22% of its fault-free pace).

mod common;
use common::*;

/// Client 6's home is replica 2 (6 mod 4), which never hears from it: its first request
/// completes through the retransmission to every replica, and the next ones go elsewhere and
/// complete without one.
#[test]
fn a_prime_client_leaves_a_home_that_never_introduces_its_requests() {
    let mut c = Cluster::builder(1).prime().live_client(6).build();
    c.run(1_000);
    c.block(|e| e.from == client(6) && e.to == replica(2));
    for i in 0..4u8 {
        let ts = c.invoke(6, &[b'p', b'u', b't', b' ', b'k', b' ', b'0' + i]);
        assert!(
            c.run_until(30_000, |c| c.completed(6, ts)),
            "request {i} completes"
        );
    }
    let retransmitted: Vec<u32> = c
        .completions(6)
        .iter()
        .map(|done| done.retransmissions)
        .collect();
    assert!(
        retransmitted[0] > 0,
        "the first request waits for its retransmission: {retransmitted:?}"
    );
    assert_eq!(
        retransmitted[1..],
        [0, 0, 0],
        "the next ones go to another home"
    );
}
