//! The MAC-only view change of BFT-PR (Castro & Liskov 2000, §4.3) as pure functions:
//! computing P and Q (their Figure 2), validating a VIEW-CHANGE's claims, and the new
//! primary's decision procedure (their Figure 3), which backups re-run to check a NEW-VIEW.
//!
//! Interpretations (see `docs/adr/0002-view-change.md`):
//! - Figure 2, "d not in D": when the tuple is full (more than f+1 pairs) the lowest-view pair
//!   is dropped first, then the new pair is always added, so each tuple keeps at most f+2.
//! - Figure 3 selects values for `h < n <= max_n`, where `max_n` is the highest sequence number
//!   in any P set of S (clamped to `h + L`). A request committed at `n` is prepared at f+1
//!   correct replicas, any 2f+1 members of S include one, so `max_n >= n`; leaving the empty
//!   tail unselected avoids ordering up to L null requests on every view change.
//! - Among requests satisfying A1 and A2 for one `n` the highest view (then lowest digest)
//!   wins, so the primary and the backups pick the same one. A3 (the primary has the batch)
//!   makes the primary wait and fetch rather than fall through to B.

use crate::message::{PEntry, QEntry, ViewChange, NULL_DIGEST};
use crate::types::{Seq, View};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;

/// PSet: the prepared claim per sequence number.
pub type PSet = BTreeMap<Seq, PEntry>;
/// QSet: the pre-prepared digests (with their latest view) per sequence number.
pub type QSet = BTreeMap<Seq, Vec<(Digest, View)>>;

/// What the log knows about one sequence number in the current view.
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotSummary {
    /// Digest prepared (or committed) in the current view.
    pub prepared: Option<Digest>,
    /// Digest pre-prepared in the current view (this replica sent a pre-prepare or prepare).
    pub preprepared: Option<Digest>,
}

/// Figure 2: P and Q for a VIEW-CHANGE leaving view `v`, from the current log (`slots`, all
/// in view `v`) and the previous PSet/QSet. Covers `h < n <= h + L`.
pub fn compute_pq(
    f: u32,
    h: Seq,
    log_size: Seq,
    v: View,
    slots: &BTreeMap<Seq, SlotSummary>,
    pset: &PSet,
    qset: &QSet,
) -> (PSet, QSet) {
    let mut p = BTreeMap::new();
    let mut q = BTreeMap::new();
    let hi = h.saturating_add(log_size);
    let seqs: std::collections::BTreeSet<Seq> = slots
        .keys()
        .chain(pset.keys())
        .chain(qset.keys())
        .copied()
        .filter(|n| *n > h && *n <= hi)
        .collect();
    for n in seqs {
        let s = slots.get(&n).copied().unwrap_or_default();
        if let Some(d) = s.prepared {
            p.insert(
                n,
                PEntry {
                    seq: n,
                    digest: d,
                    view: v,
                },
            );
        } else if let Some(e) = pset.get(&n) {
            p.insert(n, *e);
        }
        if let Some(d) = s.preprepared.or(s.prepared) {
            let mut pairs = qset.get(&n).cloned().unwrap_or_default();
            add_q(&mut pairs, d, v, f);
            q.insert(n, pairs);
        } else if let Some(pairs) = qset.get(&n) {
            q.insert(n, pairs.clone());
        }
    }
    (p, q)
}

/// Records in one sequence number's Q pairs that this replica pre-prepared `d` in view `v`
/// (and vouched for its requests): the pair's view moves up to `v` if `d` is there, else the
/// pair joins, the lowest-view pair leaving when there are already f+2.
pub fn add_q(pairs: &mut Vec<(Digest, View)>, d: Digest, v: View, f: u32) {
    if let Some(pos) = pairs.iter().position(|(pd, _)| *pd == d) {
        pairs[pos].1 = pairs[pos].1.max(v);
    } else {
        if pairs.len() > f as usize + 1 {
            // A pair older than every pair of a full tuple (a slot of a view left long ago,
            // vouched for late) would evict a later one: it is the one left out.
            if pairs.iter().all(|(_, pv)| *pv > v) {
                return;
            }
            let lowest = pairs
                .iter()
                .enumerate()
                .min_by_key(|(_, (pd, pv))| (*pv, *pd))
                .map(|(i, _)| i)
                .expect("non-empty");
            pairs.remove(lowest);
        }
        pairs.push((d, v));
    }
    pairs.sort();
}

/// Builds the wire form of P and Q.
pub fn to_wire(p: &PSet, q: &QSet) -> (Vec<PEntry>, Vec<QEntry>) {
    (
        p.values().copied().collect(),
        q.iter()
            .map(|(n, pairs)| QEntry {
                seq: *n,
                pairs: pairs.clone(),
            })
            .collect(),
    )
}

/// Structural checks on a received VIEW-CHANGE: every bound that keeps its processing
/// bounded and its claims well formed. Its truth is established by the group (acks and the
/// decision procedure), not here.
pub fn validate(vc: &ViewChange, f: u32, k: Seq, log_size: Seq) -> Result<(), &'static str> {
    if vc.view > crate::types::VIEW_LIMIT {
        return Err("view above the limit");
    }
    if !vc.ls.is_multiple_of(k) {
        return Err("stable checkpoint not a multiple of the interval");
    }
    if vc.checkpoints.len() as u64 > log_size / k + 2 {
        return Err("too many checkpoints");
    }
    let mut last = None;
    for (n, _) in &vc.checkpoints {
        if !n.is_multiple_of(k) || *n < vc.ls || last.is_some_and(|l| l >= *n) {
            return Err("checkpoint list malformed");
        }
        last = Some(*n);
    }
    let in_window = |n: Seq| n > vc.ls && n <= vc.ls.saturating_add(log_size);
    let mut last = None;
    for e in &vc.p {
        if !in_window(e.seq) || last.is_some_and(|l| l >= e.seq) || e.view >= vc.view {
            return Err("P entry malformed");
        }
        last = Some(e.seq);
    }
    let mut last = None;
    for e in &vc.q {
        if !in_window(e.seq) || last.is_some_and(|l| l >= e.seq) {
            return Err("Q entry malformed");
        }
        if e.pairs.is_empty() || e.pairs.len() > f as usize + 2 {
            return Err("Q tuple size out of bounds");
        }
        for (i, (d, v)) in e.pairs.iter().enumerate() {
            if *v >= vc.view || e.pairs[..i].iter().any(|(d2, _)| d2 == d) {
                return Err("Q pair malformed");
            }
        }
        last = Some(e.seq);
    }
    Ok(())
}

/// Deliberately broken variants of the decision procedure (the simulator's mutants); all
/// false in a correct replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Broken {
    /// The lowest-view prepared claim wins, A1 and A2 ignored.
    pub any_prepared: bool,
    /// A2 ignored.
    pub no_a2: bool,
    /// Rule B with 2f messages.
    pub null_at_2f: bool,
    /// The checkpoint with f reports.
    pub checkpoint_at_f: bool,
}

/// The outcome of a complete decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub checkpoint: (Seq, Digest),
    /// `chosen[i]` is the digest selected for `checkpoint.0 + 1 + i` ([`NULL_DIGEST`] for null).
    pub chosen: Vec<Digest>,
}

/// Why the decision procedure cannot finish yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    /// No checkpoint is both known correct and low enough (need more view-change messages).
    NoCheckpoint,
    /// Neither a request nor null can be selected for this sequence number yet.
    Undecided(Seq),
    /// Selected requests whose batches the primary does not have (condition A3).
    NeedBatches(Vec<Digest>),
}

/// Figure 3. `s` holds at most one VIEW-CHANGE per replica, all for the same view.
/// `has_batch` is condition A3; backups checking a NEW-VIEW pass `|_| true`.
/// `any_prepared` is the deliberately broken variant used to test the simulator's checkers.
pub fn decide(
    f: u32,
    log_size: Seq,
    s: &[&ViewChange],
    has_batch: impl Fn(&Digest) -> bool,
    broken: Broken,
) -> Result<Decision, Pending> {
    let any_prepared = broken.any_prepared;
    let weak = f as usize + 1;
    let strong = 2 * f as usize + 1;
    let ckpt_weak = if broken.checkpoint_at_f {
        weak - 1
    } else {
        weak
    };
    let null_strong = if broken.null_at_2f {
        strong - 1
    } else {
        strong
    };
    // The checkpoint: highest (n, d) reported in C by f+1 and at or above the stable
    // checkpoint of 2f+1.
    let mut best: Option<(Seq, Digest)> = None;
    let mut reported: BTreeMap<(Seq, Digest), usize> = BTreeMap::new();
    for m in s {
        for c in &m.checkpoints {
            *reported.entry(*c).or_default() += 1;
        }
    }
    for ((n, d), count) in &reported {
        if *count >= ckpt_weak && s.iter().filter(|m| m.ls <= *n).count() >= strong {
            match best {
                Some((bn, _)) if bn >= *n => {}
                _ => best = Some((*n, *d)),
            }
        }
    }
    let Some((h, hd)) = best else {
        return Err(Pending::NoCheckpoint);
    };
    let hi = h.saturating_add(log_size);
    let max_n = s
        .iter()
        .flat_map(|m| m.p.iter().map(|e| e.seq))
        .filter(|n| *n > h && *n <= hi)
        .max()
        .unwrap_or(h);

    let p_of = |m: &ViewChange, n: Seq| m.p.iter().find(|e| e.seq == n).copied();
    let mut chosen = Vec::with_capacity((max_n - h) as usize);
    let mut missing = Vec::new();
    for n in h + 1..=max_n {
        let mut candidates: Vec<PEntry> = s.iter().filter_map(|m| p_of(m, n)).collect();
        candidates.sort_by(|a, b| b.view.cmp(&a.view).then(a.digest.cmp(&b.digest)));
        candidates.dedup();
        if any_prepared {
            // Broken on purpose: the lowest view wins and A1/A2 are ignored.
            candidates.reverse();
        }
        let a1 = |e: &PEntry| {
            s.iter()
                .filter(|m| {
                    m.ls < n
                        && match p_of(m, n) {
                            None => true,
                            Some(o) => {
                                o.view < e.view || (o.view == e.view && o.digest == e.digest)
                            }
                        }
                })
                .count()
                >= strong
        };
        let a2 = |e: &PEntry| {
            s.iter()
                .filter(|m| {
                    m.q.iter().any(|qe| {
                        qe.seq == n && qe.pairs.iter().any(|(d, v)| *v >= e.view && *d == e.digest)
                    })
                })
                .count()
                >= weak
        };
        let selected = candidates
            .iter()
            .find(|e| any_prepared || (a1(e) && (broken.no_a2 || a2(e))))
            .copied();
        if let Some(e) = selected {
            if e.digest != NULL_DIGEST && !has_batch(&e.digest) {
                missing.push(e.digest);
            }
            chosen.push(e.digest);
        } else if s
            .iter()
            .filter(|m| m.ls < n && p_of(m, n).is_none())
            .count()
            >= null_strong
        {
            chosen.push(NULL_DIGEST);
        } else {
            return Err(Pending::Undecided(n));
        }
    }
    if !missing.is_empty() {
        return Err(Pending::NeedBatches(missing));
    }
    Ok(Decision {
        checkpoint: (h, hd),
        chosen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review finding 6: vouching late for a slot of an old view must not evict a pair of a
    /// later view from a full tuple (it did: the lowest-view pair left, the older one came).
    #[test]
    fn a_late_old_pair_never_evicts_a_later_one() {
        let f = 1;
        let mut pairs = vec![(d(1), 5), (d(2), 6), (d(3), 7)];
        add_q(&mut pairs, d(4), 2, f);
        assert_eq!(pairs, vec![(d(1), 5), (d(2), 6), (d(3), 7)]);
        // A pair of the current view still replaces the lowest.
        add_q(&mut pairs, d(4), 8, f);
        assert_eq!(pairs, vec![(d(2), 6), (d(3), 7), (d(4), 8)]);
    }

    fn d(x: u8) -> Digest {
        Digest([x; 32])
    }

    fn vc(
        replica: u32,
        ls: Seq,
        ckpts: &[Seq],
        p: &[(Seq, u8, View)],
        q: &[(Seq, &[(u8, View)])],
    ) -> ViewChange {
        ViewChange {
            view: 5,
            replica,
            ls,
            checkpoints: ckpts
                .iter()
                .map(|n| (*n, d(200 + (*n / 128) as u8)))
                .collect(),
            p: p.iter()
                .map(|(n, x, v)| PEntry {
                    seq: *n,
                    digest: d(*x),
                    view: *v,
                })
                .collect(),
            q: q.iter()
                .map(|(n, pairs)| QEntry {
                    seq: *n,
                    pairs: pairs.iter().map(|(x, v)| (d(*x), *v)).collect(),
                })
                .collect(),
        }
    }

    fn run(s: &[ViewChange]) -> Result<Decision, Pending> {
        let refs: Vec<&ViewChange> = s.iter().collect();
        decide(1, 256, &refs, |_| true, Broken::default())
    }

    #[test]
    fn decision_table() {
        let ck0 = d(200);
        // (name, view changes, expected)
        let cases: Vec<(&str, Vec<ViewChange>, Result<Decision, Pending>)> =
            vec![
            (
                "empty logs: checkpoint 0, nothing to order",
                vec![vc(0, 0, &[0], &[], &[]), vc(1, 0, &[0], &[], &[]), vc(2, 0, &[0], &[], &[])],
                Ok(Decision { checkpoint: (0, ck0), chosen: vec![] }),
            ),
            (
                "request prepared at two, pre-prepared at three: selected",
                vec![
                    vc(0, 0, &[0], &[(1, 7, 4)], &[(1, &[(7, 4)])]),
                    vc(1, 0, &[0], &[(1, 7, 4)], &[(1, &[(7, 4)])]),
                    vc(2, 0, &[0], &[], &[(1, &[(7, 4)])]),
                ],
                Ok(Decision { checkpoint: (0, ck0), chosen: vec![d(7)] }),
            ),
            (
                "gap below a prepared request becomes null",
                vec![
                    vc(0, 0, &[0], &[(2, 7, 4)], &[(2, &[(7, 4)])]),
                    vc(1, 0, &[0], &[(2, 7, 4)], &[(2, &[(7, 4)])]),
                    vc(2, 0, &[0], &[], &[]),
                ],
                Ok(Decision { checkpoint: (0, ck0), chosen: vec![Digest::ZERO, d(7)] }),
            ),
            (
                "higher view wins over a lower-view prepared request",
                vec![
                    vc(0, 0, &[0], &[(1, 7, 2)], &[(1, &[(7, 2), (8, 3)])]),
                    vc(1, 0, &[0], &[(1, 8, 3)], &[(1, &[(8, 3)])]),
                    vc(2, 0, &[0], &[(1, 8, 3)], &[(1, &[(8, 3)])]),
                ],
                Ok(Decision { checkpoint: (0, ck0), chosen: vec![d(8)] }),
            ),
            (
                "prepared claim by one replica without f+1 pre-prepare support: A2 fails, B fails",
                vec![
                    vc(0, 0, &[0], &[(1, 9, 4)], &[(1, &[(9, 4)])]),
                    vc(1, 0, &[0], &[], &[]),
                    vc(2, 0, &[0], &[], &[]),
                ],
                Err(Pending::Undecided(1)),
            ),
            (
                "one bogus high-view claim cannot block when 2f+1 others agree",
                vec![
                    vc(0, 0, &[0], &[(1, 7, 4)], &[(1, &[(7, 4)])]),
                    vc(1, 0, &[0], &[(1, 7, 4)], &[(1, &[(7, 4)])]),
                    vc(2, 0, &[0], &[(1, 7, 4)], &[(1, &[(7, 4)])]),
                    vc(3, 0, &[0], &[(1, 66, 4)], &[(1, &[(66, 4)])]),
                ],
                Ok(Decision { checkpoint: (0, ck0), chosen: vec![d(7)] }),
            ),
            (
                "checkpoint 128 known by f+1 and above 2f+1 stable marks",
                vec![
                    vc(0, 128, &[128], &[(130, 7, 4)], &[(130, &[(7, 4)])]),
                    vc(1, 0, &[0, 128], &[(130, 7, 4)], &[(130, &[(7, 4)])]),
                    vc(2, 0, &[0], &[(1, 5, 4)], &[(1, &[(5, 4)])]),
                ],
                Ok(Decision {
                    checkpoint: (128, d(201)),
                    chosen: vec![Digest::ZERO, d(7)],
                }),
            ),
            (
                "checkpoint reported by one replica only is not chosen",
                vec![
                    vc(0, 0, &[0, 128], &[], &[]),
                    vc(1, 0, &[0], &[], &[]),
                    vc(2, 0, &[0], &[], &[]),
                ],
                Ok(Decision { checkpoint: (0, ck0), chosen: vec![] }),
            ),
            (
                "a checkpoint two replicas already made stable is chosen",
                vec![
                    vc(0, 128, &[128], &[], &[]),
                    vc(1, 128, &[128], &[], &[]),
                    vc(2, 0, &[0], &[], &[]),
                ],
                Ok(Decision { checkpoint: (128, d(201)), chosen: vec![] }),
            ),
            (
                "only two messages: nothing is known",
                vec![vc(0, 0, &[0], &[], &[]), vc(1, 0, &[0], &[], &[])],
                Err(Pending::NoCheckpoint),
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(run(&s), want, "{name}");
        }
    }

    #[test]
    fn a3_makes_the_primary_wait() {
        let s = [
            vc(0, 0, &[0], &[(1, 7, 4)], &[(1, &[(7, 4)])]),
            vc(1, 0, &[0], &[(1, 7, 4)], &[(1, &[(7, 4)])]),
            vc(2, 0, &[0], &[], &[(1, &[(7, 4)])]),
        ];
        let refs: Vec<&ViewChange> = s.iter().collect();
        assert_eq!(
            decide(1, 256, &refs, |_| false, Broken::default()),
            Err(Pending::NeedBatches(vec![d(7)]))
        );
    }

    #[test]
    fn broken_variant_picks_the_stale_request() {
        let s = [
            vc(0, 0, &[0], &[(1, 7, 2)], &[(1, &[(7, 2), (8, 3)])]),
            vc(1, 0, &[0], &[(1, 8, 3)], &[(1, &[(8, 3)])]),
            vc(2, 0, &[0], &[(1, 8, 3)], &[(1, &[(8, 3)])]),
        ];
        let refs: Vec<&ViewChange> = s.iter().collect();
        assert_eq!(
            decide(
                1,
                256,
                &refs,
                |_| true,
                Broken {
                    any_prepared: true,
                    ..Broken::default()
                }
            )
            .unwrap()
            .chosen,
            vec![d(7)]
        );
    }

    #[test]
    fn pq_table() {
        let mut slots = BTreeMap::new();
        slots.insert(
            1,
            SlotSummary {
                prepared: Some(d(1)),
                preprepared: Some(d(1)),
            },
        );
        slots.insert(
            2,
            SlotSummary {
                prepared: None,
                preprepared: Some(d(2)),
            },
        );
        let mut pset = BTreeMap::new();
        pset.insert(
            2,
            PEntry {
                seq: 2,
                digest: d(9),
                view: 1,
            },
        );
        pset.insert(
            3,
            PEntry {
                seq: 3,
                digest: d(3),
                view: 1,
            },
        );
        let mut qset = BTreeMap::new();
        qset.insert(2, vec![(d(9), 1)]);
        qset.insert(3, vec![(d(3), 1)]);
        // Q tuple for 4 is full (f+2 = 3 pairs) and gains a new digest: lowest view drops.
        qset.insert(4, vec![(d(40), 0), (d(41), 1), (d(42), 2)]);
        slots.insert(
            4,
            SlotSummary {
                prepared: None,
                preprepared: Some(d(43)),
            },
        );
        let (p, q) = compute_pq(1, 0, 256, 3, &slots, &pset, &qset);
        assert_eq!(
            p[&1],
            PEntry {
                seq: 1,
                digest: d(1),
                view: 3
            }
        );
        assert_eq!(
            p[&2],
            PEntry {
                seq: 2,
                digest: d(9),
                view: 1
            },
            "older PSet kept"
        );
        assert_eq!(p[&3].view, 1);
        assert!(!p.contains_key(&4));
        assert_eq!(q[&1], vec![(d(1), 3)]);
        assert_eq!(q[&2], vec![(d(2), 3), (d(9), 1)]);
        assert_eq!(q[&3], vec![(d(3), 1)]);
        assert_eq!(q[&4], vec![(d(41), 1), (d(42), 2), (d(43), 3)]);
        // Re-pre-preparing a known digest updates its view instead of adding a pair.
        let mut slots2 = BTreeMap::new();
        slots2.insert(
            4,
            SlotSummary {
                prepared: None,
                preprepared: Some(d(41)),
            },
        );
        let (_, q2) = compute_pq(1, 0, 256, 5, &slots2, &pset, &q);
        assert_eq!(q2[&4], vec![(d(41), 5), (d(42), 2), (d(43), 3)]);
    }

    #[test]
    fn validate_rejects_malformed() {
        let good = vc(0, 128, &[128, 256], &[(130, 1, 2)], &[(130, &[(1, 2)])]);
        assert!(validate(&good, 1, 128, 256).is_ok());
        let mut bad = good.clone();
        bad.p[0].seq = 128;
        assert!(validate(&bad, 1, 128, 256).is_err());
        let mut bad = good.clone();
        bad.p[0].view = 5;
        assert!(validate(&bad, 1, 128, 256).is_err());
        let mut bad = good.clone();
        bad.q[0].pairs = vec![(d(1), 1), (d(2), 1), (d(3), 1), (d(4), 1)];
        assert!(validate(&bad, 1, 128, 256).is_err());
        let mut bad = good.clone();
        bad.q[0].pairs = vec![(d(1), 1), (d(1), 2)];
        assert!(validate(&bad, 1, 128, 256).is_err());
        let mut bad = good.clone();
        bad.ls = 3;
        assert!(validate(&bad, 1, 128, 256).is_err());
        let mut bad = good;
        bad.p.push(PEntry {
            seq: 999,
            digest: d(1),
            view: 1,
        });
        assert!(validate(&bad, 1, 128, 256).is_err());
    }
}
