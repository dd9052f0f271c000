//! Quorum predicates of PBFT as small pure functions, each with table-driven tests.
//!
//! "Matching" always means the same view, sequence number and digest: callers keep votes per
//! slot and view, and these functions compare digests.

use crate::types::{ReplicaId, View};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;

/// prepared(m, v, n, i): a pre-prepare with digest `pp` and 2f PREPAREs from distinct backups
/// (never the primary) with the same digest. The replica's own PREPARE counts.
///
/// `doubts` holds, per backup, the positions of the batch's requests it could not
/// authenticate (backups that vouch for everything have no entry). Every request must be
/// vouched for by 2f *backups* of the certificate, so that at least one correct backup
/// authenticated it and, whatever the view change, f+1 correct replicas claim it: with `m`
/// matching PREPAREs, at most `m - 2f` of them may doubt any one request. Without vouchers a
/// faulty primary could order a request no client sent. The primary does not count as a
/// voucher: with a request that verifies at the primary only (a faulty client) and a faulty
/// backup vouching towards the primary alone, the primary would prepare with no other correct
/// replica able to vouch, and no view change could then decide the sequence number (A2 lacks
/// f+1 Q claims, rule B lacks 2f+1 messages without a P entry). f+1 backup vouchers are not
/// enough beyond f = 1 (second review, G4): f of them may be faulty and never claim it, which
/// leaves one correct claim, plus the primary's, short of f+1 for f >= 2. With 2f vouchers
/// at least f are correct, and either the primary is correct too or at most f-1 of the
/// vouchers are faulty: f+1 correct replicas make a Q claim in their next VIEW-CHANGE.
pub fn prepared(
    f: u32,
    primary: ReplicaId,
    pp: Option<&Digest>,
    prepares: &BTreeMap<ReplicaId, Digest>,
    doubts: &BTreeMap<ReplicaId, Vec<u16>>,
) -> bool {
    prepared_vouched(f, 2 * f as usize, primary, pp, prepares, doubts)
}

/// [`prepared`] with `vouchers` backup vouchers needed per request (2f; the simulator's
/// mutant `vouchers-at-f-plus-1` needs f+1, as before the second review's G4).
pub fn prepared_vouched(
    f: u32,
    vouchers: usize,
    primary: ReplicaId,
    pp: Option<&Digest>,
    prepares: &BTreeMap<ReplicaId, Digest>,
    doubts: &BTreeMap<ReplicaId, Vec<u16>>,
) -> bool {
    let Some(d) = pp else { return false };
    let matching = |r: &ReplicaId| *r != primary && prepares.get(r) == Some(d);
    let m = prepares.keys().filter(|r| matching(r)).count();
    if m < 2 * f as usize {
        return false;
    }
    if doubts.is_empty() {
        return true;
    }
    let mut doubted: BTreeMap<u16, usize> = BTreeMap::new();
    for (_, positions) in doubts.iter().filter(|(r, _)| matching(r)) {
        for i in positions {
            *doubted.entry(*i).or_default() += 1;
        }
    }
    // Backup vouchers m - c must be at least 2f.
    doubted.values().all(|c| m - c >= vouchers)
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
            assert_eq!(
                prepared(*f, *p, pp.as_ref(), &votes(pr), &BTreeMap::new()),
                *want,
                "case {i}"
            );
        }
    }

    #[test]
    fn prepared_needs_2f_backup_vouchers_per_request() {
        // (f, primary, prepares, doubts per backup, expected)
        type Doubts<'a> = &'a [(ReplicaId, &'a [u16])];
        let cases: &[(u32, ReplicaId, &[ReplicaId], Doubts, bool)] = &[
            // two backups, each doubting a different request: one backup vouches for each
            (1, 0, &[1, 2], &[(1, &[0]), (2, &[1])], false),
            // both doubt the same request: no backup vouches for it
            (1, 0, &[1, 2], &[(1, &[0]), (2, &[0])], false),
            // one of two doubts it: a single backup voucher (the primary does not count)
            (1, 0, &[1, 2], &[(1, &[0])], false),
            // three matching PREPAREs, one doubting: two backups vouch
            (1, 0, &[1, 2, 3], &[(1, &[0])], true),
            // three, two doubting the same request: one backup vouches
            (1, 0, &[1, 2, 3], &[(1, &[0]), (2, &[0])], false),
            // three, each doubting a different request: two backups vouch for each
            (1, 0, &[1, 2, 3], &[(1, &[0]), (2, &[1]), (3, &[2])], true),
            // every backup doubts it (a request the primary made up)
            (1, 0, &[1, 2, 3], &[(1, &[2]), (2, &[2]), (3, &[2])], false),
            // doubts of a replica whose PREPARE does not match count for nothing
            (1, 0, &[1, 2], &[(3, &[0])], true),
            // f = 2: 2f = 4 backups must vouch (second review, G4: with four matching
            // PREPAREs and one doubt, two faulty vouchers left one correct Q claim besides
            // the primary's, and no view change could decide the slot)
            (2, 0, &[1, 2, 3, 4], &[(4, &[0])], false),
            (2, 0, &[1, 2, 3, 4], &[(1, &[5]), (2, &[5])], false),
            (2, 0, &[1, 2, 3, 4, 5], &[(1, &[5])], true),
            (2, 0, &[1, 2, 3, 4, 5, 6], &[(1, &[5]), (2, &[5])], true),
            (
                2,
                0,
                &[1, 2, 3, 4, 5, 6],
                &[(1, &[5]), (2, &[5]), (3, &[5])],
                false,
            ),
            // f = 3: six vouchers
            (3, 0, &[1, 2, 3, 4, 5, 6, 7], &[(7, &[0])], true),
            (3, 0, &[1, 2, 3, 4, 5, 6, 7], &[(6, &[0]), (7, &[0])], false),
        ];
        for (i, (f, p, pr, ds, want)) in cases.iter().enumerate() {
            let prepares: BTreeMap<ReplicaId, Digest> = pr.iter().map(|r| (*r, d(1))).collect();
            let doubts: BTreeMap<ReplicaId, Vec<u16>> =
                ds.iter().map(|(r, x)| (*r, x.to_vec())).collect();
            assert_eq!(
                prepared(*f, *p, Some(&d(1)), &prepares, &doubts),
                *want,
                "case {i}"
            );
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
