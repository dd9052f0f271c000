//! Quorum predicates of PBFT as small pure functions, each with table-driven tests.
//!
//! "Matching" always means the same view, sequence number and digest: callers keep votes per
//! slot and view, and these functions compare digests.

use crate::types::{ReplicaId, View};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;

/// prepared(m, v, n, i): a pre-prepare with digest `pp` and 2f PREPAREs from distinct backups
/// (never the primary) with the same digest. The replica's own PREPARE counts.
pub fn prepared(
    f: u32,
    primary: ReplicaId,
    pp: Option<&Digest>,
    prepares: &BTreeMap<ReplicaId, Digest>,
) -> bool {
    let Some(d) = pp else { return false };
    let n = prepares
        .iter()
        .filter(|(r, pd)| **r != primary && *pd == d)
        .count();
    n >= 2 * f as usize
}

/// committed-local(m, v, n, i): prepared and 2f+1 matching COMMITs from distinct replicas
/// (own included). `quorum` is 2f+1 except in the deliberately broken simulator variant.
pub fn committed_local(
    quorum: usize,
    is_prepared: bool,
    pp: Option<&Digest>,
    commits: &BTreeMap<ReplicaId, Digest>,
) -> bool {
    let Some(d) = pp else { return false };
    is_prepared && commits.values().filter(|cd| *cd == d).count() >= quorum
}

/// Number of distinct replicas that vouch for `digest`.
pub fn count_matching<'a>(votes: impl IntoIterator<Item = &'a Digest>, digest: &Digest) -> usize {
    votes.into_iter().filter(|d| *d == digest).count()
}

/// The f+1 join rule: given the latest view-change view of every *other* replica, if at least
/// f+1 of them are above `my_view`, the smallest view such that f+1 replicas are at it or
/// above (the view to join); otherwise `None`.
pub fn join_view(f: u32, my_view: View, others: &BTreeMap<ReplicaId, View>) -> Option<View> {
    let mut higher: Vec<View> = others.values().copied().filter(|v| *v > my_view).collect();
    if higher.len() < f as usize + 1 {
        return None;
    }
    higher.sort_unstable_by(|a, b| b.cmp(a));
    Some(higher[f as usize])
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // table-driven cases read best inline
mod tests {
    use super::*;

    fn d(x: u8) -> Digest {
        Digest([x; 32])
    }

    fn votes(v: &[(ReplicaId, u8)]) -> BTreeMap<ReplicaId, Digest> {
        v.iter().map(|(r, x)| (*r, d(*x))).collect()
    }

    #[test]
    fn prepared_table() {
        // (f, primary, pre-prepare digest, prepares, expected)
        let cases: &[(u32, ReplicaId, Option<u8>, &[(ReplicaId, u8)], bool)] = &[
            (1, 0, Some(1), &[(1, 1), (2, 1)], true),
            (1, 0, Some(1), &[(1, 1)], false),
            // the primary's PREPARE never counts
            (1, 0, Some(1), &[(0, 1), (1, 1)], false),
            // digests must match the pre-prepare
            (1, 0, Some(1), &[(1, 1), (2, 2)], false),
            (1, 0, Some(1), &[(1, 2), (2, 2), (3, 2)], false),
            // no pre-prepare, no prepared
            (1, 0, None, &[(1, 1), (2, 1), (3, 1)], false),
            (1, 1, Some(1), &[(0, 1), (2, 1)], true),
            (2, 0, Some(1), &[(1, 1), (2, 1), (3, 1)], false),
            (2, 0, Some(1), &[(1, 1), (2, 1), (3, 1), (4, 1)], true),
            (2, 3, Some(1), &[(1, 1), (2, 1), (3, 1), (4, 1)], false),
        ];
        for (i, (f, p, pp, pr, want)) in cases.iter().enumerate() {
            let pp = pp.map(d);
            assert_eq!(prepared(*f, *p, pp.as_ref(), &votes(pr)), *want, "case {i}");
        }
    }

    #[test]
    fn committed_table() {
        let cases: &[(u32, bool, Option<u8>, &[(ReplicaId, u8)], bool)] = &[
            (1, true, Some(1), &[(0, 1), (1, 1), (2, 1)], true),
            (1, true, Some(1), &[(0, 1), (1, 1)], false),
            (1, false, Some(1), &[(0, 1), (1, 1), (2, 1)], false),
            (1, true, Some(1), &[(0, 1), (1, 1), (2, 2)], false),
            (1, true, None, &[(0, 1), (1, 1), (2, 1)], false),
            (2, true, Some(1), &[(0, 1), (1, 1), (2, 1), (3, 1)], false),
            (
                2,
                true,
                Some(1),
                &[(0, 1), (1, 1), (2, 1), (3, 1), (6, 1)],
                true,
            ),
        ];
        for (i, (f, prep, pp, c, want)) in cases.iter().enumerate() {
            let pp = pp.map(d);
            let q = 2 * *f as usize + 1;
            assert_eq!(
                committed_local(q, *prep, pp.as_ref(), &votes(c)),
                *want,
                "case {i}"
            );
        }
    }

    #[test]
    fn join_view_table() {
        let cases: &[(u32, View, &[(ReplicaId, View)], Option<View>)] = &[
            (1, 0, &[(1, 1), (2, 1)], Some(1)),
            (1, 0, &[(1, 1)], None),
            (1, 0, &[(1, 5), (2, 3), (3, 0)], Some(3)),
            (1, 3, &[(1, 5), (2, 3), (3, 9)], Some(5)),
            (1, 3, &[(1, 3), (2, 3), (3, 3)], None),
            (2, 0, &[(1, 7), (2, 6), (3, 2), (4, 1)], Some(2)),
            (2, 0, &[(1, 7), (2, 6)], None),
        ];
        for (i, (f, mine, others, want)) in cases.iter().enumerate() {
            let m: BTreeMap<ReplicaId, View> = others.iter().copied().collect();
            assert_eq!(join_view(*f, *mine, &m), *want, "case {i}");
        }
    }
}
