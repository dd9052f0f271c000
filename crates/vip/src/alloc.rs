//! The Wackamole paper's two deterministic procedures, as pure functions over the table of
//! state messages of one view. Members are given by their position in the view's ordered
//! membership list, addresses by their index in the configured list; every member that feeds
//! the same table gets the same answer, which is what makes the allocation agreed.

use crate::wire::VipSet;

/// `ResolveConflicts()`: of two members of a view that both hold an address, the one earlier
/// in the membership list releases it (the proof of the paper's Lemma 1). Whether `me` must
/// release an address it shares with `other`.
pub fn loses_conflict(me: usize, other: usize) -> bool {
    me < other
}

/// The holder of every address once all conflicts are resolved: the last member (in view
/// order) whose state lists it, `None` for a hole.
pub fn resolve_conflicts(states: &[VipSet], addresses: usize) -> Vec<Option<usize>> {
    (0..addresses)
        .map(|a| states.iter().rposition(|s| s.contains(a)))
        .collect()
}

/// `Reallocate_IPs()` with the balancing folded in: the new holder of every address.
///
/// Each member's quota is `n / k` addresses, and `n % k` members get one more: those holding
/// the most now, ties to the earlier in the list, so that as few addresses as possible move.
/// A member keeps its lowest-indexed addresses up to its quota and gives up the rest; holes and
/// given-up addresses, in index order, go to the members below quota in list order. Afterwards
/// every address has exactly one holder and counts differ by at most one.
pub fn reallocate(holders: &[Option<usize>], members: usize) -> Vec<usize> {
    assert!(members > 0, "a view always holds at least its own member");
    assert!(holders.iter().flatten().all(|h| *h < members));
    let n = holders.len();
    let mut counts = vec![0usize; members];
    for h in holders.iter().flatten() {
        counts[*h] += 1;
    }
    let mut order: Vec<usize> = (0..members).collect();
    order.sort_by_key(|m| (std::cmp::Reverse(counts[*m]), *m));
    let mut quota = vec![n / members; members];
    for m in order.iter().take(n % members) {
        quota[*m] += 1;
    }

    let mut target: Vec<Option<usize>> = vec![None; n];
    let mut kept = vec![0usize; members];
    let mut free = Vec::new();
    for (a, h) in holders.iter().enumerate() {
        match h {
            Some(m) if kept[*m] < quota[*m] => {
                kept[*m] += 1;
                target[a] = Some(*m);
            }
            _ => free.push(a),
        }
    }
    let mut free = free.into_iter();
    for m in 0..members {
        while kept[m] < quota[m] {
            let a = free.next().expect("quotas sum to the number of addresses");
            target[a] = Some(m);
            kept[m] += 1;
        }
    }
    assert!(free.next().is_none(), "every address placed");
    let target: Vec<usize> = target
        .into_iter()
        .map(|t| t.expect("every address placed"))
        .collect();
    debug_assert_eq!(kept, quota);
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ix: &[usize]) -> VipSet {
        let mut s = VipSet::default();
        for i in ix {
            s.insert(*i);
        }
        s
    }

    #[test]
    fn conflicts_go_to_the_last_listed_holder() {
        // (states per member, addresses, expected holders)
        let table: Vec<(Vec<VipSet>, usize, Vec<Option<usize>>)> = vec![
            (
                vec![set(&[0, 1]), set(&[2])],
                4,
                vec![Some(0), Some(0), Some(1), None],
            ),
            // A merge: both halves covered everything.
            (
                vec![set(&[0, 1, 2]), set(&[0, 1, 2])],
                3,
                vec![Some(1), Some(1), Some(1)],
            ),
            (
                vec![set(&[0]), set(&[0, 1]), set(&[1]), set(&[])],
                2,
                vec![Some(1), Some(2)],
            ),
            (vec![set(&[]); 3], 2, vec![None, None]),
        ];
        for (states, n, want) in table {
            assert_eq!(resolve_conflicts(&states, n), want, "{states:?}");
        }
        assert!(loses_conflict(0, 1) && !loses_conflict(2, 1));
    }

    #[test]
    fn reallocation_table() {
        // (holders, members, expected targets)
        let table: Vec<(Vec<Option<usize>>, usize, Vec<usize>)> = vec![
            // Everything held and balanced: nothing moves.
            (vec![Some(0), Some(1), Some(2)], 3, vec![0, 1, 2]),
            // Holes after a crash go to members in list order.
            (vec![Some(0), Some(0), None, None], 2, vec![0, 0, 1, 1]),
            (
                vec![Some(1), None, Some(0), None, None],
                2,
                vec![1, 0, 0, 0, 1],
            ),
            // A joiner takes the highest-indexed addresses of the fullest members.
            (
                vec![Some(0), Some(0), Some(0), Some(1), Some(1), Some(1)],
                3,
                vec![0, 0, 2, 1, 1, 2],
            ),
            // The extra address stays with whoever holds the most.
            (vec![Some(1), Some(1), Some(0)], 2, vec![1, 1, 0]),
            // Nothing held at all (first mature view).
            (vec![None; 5], 3, vec![0, 0, 1, 1, 2]),
            // More members than addresses.
            (vec![None, Some(3)], 4, vec![0, 3]),
            (vec![], 3, vec![]),
        ];
        for (holders, k, want) in table {
            assert_eq!(reallocate(&holders, k), want, "{holders:?} over {k}");
        }
    }

    /// Exhaustive over small tables: one holder each, balanced, current holders kept up to
    /// their quota, and moves only from members above quota.
    #[test]
    fn reallocation_properties_exhaustively() {
        for members in 1..=4usize {
            for n in 0..=6usize {
                let choices = members + 1; // a holder or a hole
                let total = choices.pow(n as u32);
                for code in 0..total {
                    let mut c = code;
                    let holders: Vec<Option<usize>> = (0..n)
                        .map(|_| {
                            let v = c % choices;
                            c /= choices;
                            (v < members).then_some(v)
                        })
                        .collect();
                    let target = reallocate(&holders, members);
                    assert_eq!(target.len(), n);
                    let mut counts = vec![0usize; members];
                    for t in &target {
                        counts[*t] += 1;
                    }
                    let (lo, hi) = (counts.iter().min(), counts.iter().max());
                    assert!(hi.unwrap() - lo.unwrap() <= 1, "{holders:?} -> {target:?}");
                    let mut held = vec![0usize; members];
                    for h in holders.iter().flatten() {
                        held[*h] += 1;
                    }
                    let moved = holders
                        .iter()
                        .zip(&target)
                        .filter(|(h, t)| matches!(h, Some(h) if h != *t))
                        .count();
                    let excess: usize = (0..members)
                        .map(|m| held[m].saturating_sub(counts[m]))
                        .sum();
                    assert_eq!(moved, excess, "{holders:?} -> {target:?}");
                }
            }
        }
    }
}
