//! Arithmetic on hostile values: numbers near `u64::MAX` in messages from a faulty replica
//! must be rejected or clamped, never panic.
//!
//! Moved from `regressions.rs` (names unchanged).

use redoubt_core::message::*;
use redoubt_crypto::Digest;
use std::panic::{catch_unwind, AssertUnwindSafe};

mod common;
use common::*;

#[test]
fn hostile_status_values_do_not_panic() {
    let mut c = Cluster::builder(1).live([0]).build();
    let st = Status {
        replica: 1,
        view: 0,
        normal: true,
        last_executed: u64::MAX,
        stable: 0,
        ..Default::default()
    };
    let res = catch_unwind(AssertUnwindSafe(|| c.receive(0, 1, st)));
    assert!(res.is_ok(), "hostile status must not panic");
}

#[test]
fn hostile_view_change_values_do_not_panic() {
    let mut c = Cluster::builder(1).live([0]).build();
    let ls = u64::MAX - (u64::MAX % 128);
    let vc = ViewChange {
        view: 1,
        replica: 1,
        ls,
        checkpoints: vec![],
        p: vec![PEntry {
            seq: u64::MAX,
            digest: Digest::ZERO,
            view: 0,
        }],
        q: vec![],
    };
    let res = catch_unwind(AssertUnwindSafe(|| c.receive(0, 1, vc)));
    assert!(res.is_ok(), "hostile view change must not panic");
}
