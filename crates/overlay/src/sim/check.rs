//! Checkers: what must hold at the end of every run.
//!
//! - **Integrity**: a correct node delivers a message from a correct source only if that
//!   source submitted it, with that payload, to that node.
//! - **No duplicates**: each message is delivered at most once.
//! - **Order**: an ordered flow is delivered in submission order without gaps.
//! - **Liveness**: every message between correct nodes joined by a path of correct nodes is
//!   delivered before the run's end (a bounded time after traffic stops).
//! - **Accusations are sound** (ODSBR, benign loss below τ): every link a correct source
//!   accuses has at least one faulty end. This is ODSBR's guarantee: it narrows a fault to
//!   two adjacent nodes, one of which is faulty, and never says which.
//! - **Faults are localised** (ODSBR with hop-by-hop links): a correct source whose packets
//!   faulty nodes keep destroying accuses some link within `localise_ms` of the first loss
//!   since its last accusation.

use super::adversary::Adversary;
use super::scenario::Scenario;
use super::world::{MsgKey, Observed};
use crate::node::Event;
use crate::types::{Delivery, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// Failures of a run, each a readable sentence (empty: the run passed).
pub fn check(
    sc: &Scenario,
    obs: &Observed,
    adversaries: &BTreeMap<NodeId, Adversary>,
) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(f) = &obs.run_failure {
        failures.push(f.clone());
    }
    let mut seen: BTreeSet<MsgKey> = BTreeSet::new();
    let mut next_ordered: BTreeMap<(NodeId, NodeId), u64> = BTreeMap::new();
    for d in &obs.delivered {
        if sc.is_faulty(d.src) {
            continue;
        }
        let key = (d.src, d.dst, d.delivery, d.seq);
        match obs.accepted.get(&key) {
            None => failures.push(format!(
                "integrity: {} delivered {}/{:?}/{} at {} ms, never submitted",
                d.dst, d.src, d.delivery, d.seq, d.at_ms
            )),
            Some((_, p)) if *p != d.payload => failures.push(format!(
                "integrity: {} delivered {}/{:?}/{} with another payload",
                d.dst, d.src, d.delivery, d.seq
            )),
            Some(_) => {}
        }
        if !seen.insert(key) {
            failures.push(format!(
                "duplicate: {} delivered {}/{:?}/{} twice",
                d.dst, d.src, d.delivery, d.seq
            ));
        }
        if d.delivery == Delivery::Ordered {
            let next = next_ordered.entry((d.src, d.dst)).or_insert(0);
            if d.seq != *next {
                failures.push(format!(
                    "order: {} delivered {}/{} when {} was next",
                    d.dst, d.src, d.seq, next
                ));
            }
            *next = d.seq + 1;
        }
    }
    let missing: Vec<&MsgKey> = obs
        .accepted
        .keys()
        .filter(|(s, d, _, _)| !sc.is_faulty(*s) && sc.correct_path_exists(*s, *d))
        .filter(|k| !seen.contains(*k))
        .collect();
    if let Some((s, d, c, q)) = missing.first() {
        failures.push(format!(
            "liveness: {} messages between correct nodes joined by a correct path not delivered \
             by {} ms (first {s}->{d} {c:?} #{q})",
            missing.len(),
            obs.end_ms
        ));
    }
    if sc.check_accusations {
        for (t, n, e) in &obs.events {
            if let Event::Accused { link, dst, .. } = e {
                if !sc.is_faulty(*n) && !sc.is_faulty(link.lo) && !sc.is_faulty(link.hi) {
                    failures.push(format!(
                        "accusation: {n} (route to {dst}) accused {link:?} between correct nodes at {t} ms"
                    ));
                }
            }
        }
    }
    if sc.check_localisation {
        let mut damage: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        for a in adversaries.values() {
            for (src, times) in &a.damage {
                damage.entry(*src).or_default().extend(times);
            }
        }
        for (src, mut times) in damage {
            if sc.is_faulty(src) {
                continue;
            }
            times.sort();
            let accusations: Vec<u64> = obs
                .events
                .iter()
                .filter(|(_, n, e)| *n == src && matches!(e, Event::Accused { .. }))
                .map(|(t, _, _)| *t)
                .collect();
            let mut anchor: Option<u64> = None;
            let mut ai = 0;
            for t in times {
                while ai < accusations.len() && accusations[ai] <= t {
                    if anchor.is_some_and(|a| accusations[ai] >= a) {
                        anchor = None;
                    }
                    ai += 1;
                }
                match anchor {
                    None => anchor = Some(t),
                    Some(a) if t >= a + sc.localise_ms => {
                        failures.push(format!(
                            "localisation: faulty nodes destroyed {src}'s packets from {a} ms to \
                             {t} ms and it accused no link"
                        ));
                        break;
                    }
                    Some(_) => {}
                }
            }
        }
    }
    failures
}
