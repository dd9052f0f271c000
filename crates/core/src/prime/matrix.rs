//! Prime's summaries (spec prime.md §3.3): a PO-ARU row says how far its sender holds PO
//! certificates from every originator; the leader proposes a matrix of n signed rows, and an
//! order statistic of each column fixes what becomes eligible for execution.
//!
//! Rows are signed (they travel inside other replicas' messages and must be checkable out of
//! context); this module only builds the statements and takes the check as a closure, so it
//! stays free of keys.

use crate::types::{ReplicaId, Seq};
use redoubt_crypto::pk::Signature;
use redoubt_crypto::{Digest, DigestBuilder};
use serde::{Deserialize, Serialize};

/// `<PO-ARU, replica, inc, num, aru>`: `replica` holds PO certificates from originator `i`
/// contiguously up to `aru[i]` (one entry per replica). `num` grows with every row a replica
/// sends, so a newer row replaces an older one. `inc` is the incarnation of the order key that
/// signed it: 0 for the key dealt at `init`, and the key holder's counter of the recovery
/// request that installed a fresh one (a proactive recovery gives the replica a new order
/// key, so rows an attacker signed with a key it took stop counting; see
/// [`Matrix::masked`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoAru {
    pub replica: ReplicaId,
    pub inc: u64,
    pub num: u64,
    pub aru: Vec<Seq>,
}

impl PoAru {
    /// What the row's signature covers.
    pub fn statement(&self) -> Digest {
        let mut b = DigestBuilder::new("redoubt.prime.po-aru.v2");
        b.u64(self.replica as u64)
            .u64(self.inc)
            .u64(self.num)
            .u64(self.aru.len() as u64);
        for s in &self.aru {
            b.u64(*s);
        }
        b.finish()
    }

    /// How this row relates to `older`, an earlier row of the same replica. A row of a later
    /// incarnation replaces any of an earlier one (the recovered replica starts afresh), and
    /// one of an earlier incarnation never replaces a later one.
    pub fn compare(&self, older: &PoAru) -> RowOrder {
        if self.inc != older.inc {
            return if self.inc > older.inc {
                RowOrder::Newer
            } else {
                RowOrder::NotNewer
            };
        }
        if self.num <= older.num {
            return RowOrder::NotNewer;
        }
        let mut higher = false;
        for (new, old) in self.aru.iter().zip(&older.aru) {
            if new < old {
                return RowOrder::Inconsistent;
            }
            higher |= new > old;
        }
        if higher {
            RowOrder::Newer
        } else {
            RowOrder::NotNewer
        }
    }
}

/// How a row relates to the one held before from the same replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    /// Higher in some entry and lower in none, with a higher number: it replaces the old one.
    Newer,
    /// No higher entry, or not a higher number: nothing new (a replay, or reordered).
    NotNewer,
    /// Lower in some entry than a row its sender signed before: the sender is faulty (a correct
    /// replica's certificates only accumulate).
    Inconsistent,
}

/// A row with its sender's signature over [`PoAru::statement`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedPoAru {
    pub row: PoAru,
    pub sig: Signature,
}

/// Why a row or a matrix was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MatrixError {
    #[error("a row has {got} entries, not one per replica ({n})")]
    RowLength { got: usize, n: usize },
    #[error("the matrix has {got} rows, not one per replica ({n})")]
    Rows { got: usize, n: usize },
    #[error("row {slot} carries the row of replica {replica}")]
    Misplaced { slot: usize, replica: ReplicaId },
    #[error("the signature of replica {0}'s row does not verify")]
    BadSignature(ReplicaId),
}

impl SignedPoAru {
    /// Checks the row's shape for `n` replicas and its signature (`verify(row, statement,
    /// signature)`: the row names its replica and the incarnation of the key that signed it).
    pub fn check(
        &self,
        n: usize,
        verify: &mut impl FnMut(&PoAru, &Digest, &Signature) -> bool,
    ) -> Result<(), MatrixError> {
        if self.row.aru.len() != n {
            return Err(MatrixError::RowLength {
                got: self.row.aru.len(),
                n,
            });
        }
        if (self.row.replica as usize) >= n {
            return Err(MatrixError::Misplaced {
                slot: self.row.replica as usize,
                replica: self.row.replica,
            });
        }
        if !verify(&self.row, &self.row.statement(), &self.sig) {
            return Err(MatrixError::BadSignature(self.row.replica));
        }
        Ok(())
    }
}

/// A summary matrix: row `j` is replica `j`'s latest PO-ARU the sender holds (none yet: all
/// zeros).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matrix {
    pub rows: Vec<Option<SignedPoAru>>,
}

impl Matrix {
    /// A matrix of `n` empty rows.
    pub fn empty(n: usize) -> Matrix {
        Matrix {
            rows: vec![None; n],
        }
    }

    /// Checks every row (shape, place and signature) for `n` replicas.
    pub fn check(
        &self,
        n: usize,
        mut verify: impl FnMut(&PoAru, &Digest, &Signature) -> bool,
    ) -> Result<(), MatrixError> {
        if self.rows.len() != n {
            return Err(MatrixError::Rows {
                got: self.rows.len(),
                n,
            });
        }
        for (slot, row) in self.rows.iter().enumerate() {
            let Some(r) = row else { continue };
            if r.row.replica as usize != slot {
                return Err(MatrixError::Misplaced {
                    slot,
                    replica: r.row.replica,
                });
            }
            r.check(n, &mut verify)?;
        }
        Ok(())
    }

    /// The canonical digest: every row in place, empty ones included, each by its statement
    /// and signature (the encoding of a row is fixed by its fields).
    pub fn digest(&self) -> Digest {
        let mut b = DigestBuilder::new("redoubt.prime.matrix.v1");
        b.u64(self.rows.len() as u64);
        for row in &self.rows {
            match row {
                None => {
                    b.u64(0);
                }
                Some(r) => {
                    b.u64(1).digest(&r.row.statement()).bytes(&r.sig.0);
                }
            }
        }
        b.finish()
    }

    /// The matrix with every row whose incarnation is not `current(replica)` emptied: what
    /// an ordinal counts, with `current` read from the state it executes on (every replica
    /// executing it agrees), so rows signed with an order key a recovery retired count for
    /// nothing, whoever proposes them.
    pub fn masked(&self, current: impl Fn(ReplicaId) -> u64) -> Matrix {
        Matrix {
            rows: self
                .rows
                .iter()
                .map(|r| {
                    r.as_ref()
                        .filter(|r| r.row.inc == current(r.row.replica))
                        .cloned()
                })
                .collect(),
        }
    }

    /// Entry `(j, i)`: how far replica `j` claims certificates from originator `i` (0 for an
    /// empty row).
    pub fn entry(&self, j: usize, i: usize) -> Seq {
        self.rows
            .get(j)
            .and_then(|r| r.as_ref())
            .and_then(|r| r.row.aru.get(i).copied())
            .unwrap_or(0)
    }

    /// `ProofARU(i)`: the (2f+1)-th highest entry of column `i`. At least 2f+1 replicas, so
    /// at least f+1 correct ones, hold certificates for originator `i` that far: what they
    /// certify cannot be lost, and no other version of it can be certified.
    pub fn proof_aru(&self, i: usize, f: usize) -> Seq {
        self.ranked(i, 2 * f)
    }

    /// Column `i`'s entry of rank `rank` (0: the highest).
    fn ranked(&self, i: usize, rank: usize) -> Seq {
        let mut column: Vec<Seq> = (0..self.rows.len()).map(|j| self.entry(j, i)).collect();
        column.sort_unstable_by(|a, b| b.cmp(a));
        column.get(rank).copied().unwrap_or(0)
    }

    /// What is eligible after this matrix, given what was eligible before it: per originator
    /// the larger of the two (eligibility never moves backwards, whatever a leader proposes).
    pub fn eligible_after(&self, before: &[Seq], f: usize) -> Vec<Seq> {
        self.eligible_at_rank(before, 2 * f)
    }

    /// [`Matrix::eligible_after`] with the cut taken at the entry of rank `rank` of each
    /// column (the protocol's is 2f; the simulator's mutant takes the highest).
    pub fn eligible_at_rank(&self, before: &[Seq], rank: usize) -> Vec<Seq> {
        before
            .iter()
            .enumerate()
            .map(|(i, b)| (*b).max(self.ranked(i, rank)))
            .collect()
    }
}

/// The PO-REQUESTs an ordinal runs, in execution order: for originators in ascending id,
/// sequence numbers `before[i]+1 ..= after[i]` ascending.
pub fn newly_eligible(before: &[Seq], after: &[Seq]) -> Vec<(ReplicaId, Seq)> {
    let mut out = Vec::new();
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        for s in (*b + 1)..=*a {
            out.push((i as ReplicaId, s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(replica: ReplicaId, num: u64, aru: &[Seq]) -> Option<SignedPoAru> {
        Some(SignedPoAru {
            row: PoAru {
                replica,
                inc: 0,
                num,
                aru: aru.to_vec(),
            },
            sig: Signature::default(),
        })
    }

    fn matrix(rows: &[&[Seq]]) -> Matrix {
        Matrix {
            rows: rows
                .iter()
                .enumerate()
                .map(|(j, r)| row(j as ReplicaId, 1, r))
                .collect(),
        }
    }

    #[test]
    fn proof_aru_is_the_2f_plus_1_th_highest_entry_of_the_column() {
        // f = 1, n = 4: column 0 holds 9, 7, 5, 1; the third highest is 5.
        let m = matrix(&[&[9, 0, 0, 0], &[7, 0, 0, 0], &[1, 0, 0, 0], &[5, 0, 0, 0]]);
        assert_eq!(m.proof_aru(0, 1), 5);
        // One faulty replica claiming far ahead moves nothing.
        let m = matrix(&[&[100, 0, 0, 0], &[3, 0, 0, 0], &[3, 0, 0, 0], &[2, 0, 0, 0]]);
        assert_eq!(m.proof_aru(0, 1), 3);
        // Empty rows count as zero: two rows are not 2f+1.
        let mut m = matrix(&[&[4, 0, 0, 0], &[4, 0, 0, 0], &[0, 0, 0, 0], &[0, 0, 0, 0]]);
        m.rows[2] = None;
        m.rows[3] = None;
        assert_eq!(m.proof_aru(0, 1), 0);
    }

    #[test]
    fn eligibility_never_moves_backwards_and_runs_in_originator_order() {
        let m = matrix(&[&[2, 3, 0, 1], &[2, 3, 0, 1], &[2, 3, 0, 1], &[0, 0, 0, 0]]);
        let after = m.eligible_after(&[1, 5, 0, 0], 1);
        assert_eq!(after, vec![2, 5, 0, 1]);
        assert_eq!(newly_eligible(&[1, 5, 0, 0], &after), vec![(0, 2), (3, 1)]);
    }

    #[test]
    fn a_row_replaces_an_older_one_only_if_it_grows() {
        let old = PoAru {
            replica: 1,
            inc: 0,
            num: 4,
            aru: vec![3, 3, 3, 3],
        };
        let grow = PoAru {
            num: 5,
            aru: vec![3, 4, 3, 3],
            ..old.clone()
        };
        assert_eq!(grow.compare(&old), RowOrder::Newer);
        let replay = PoAru {
            num: 4,
            aru: vec![9, 9, 9, 9],
            ..old.clone()
        };
        assert_eq!(replay.compare(&old), RowOrder::NotNewer);
        let same = PoAru {
            num: 6,
            ..old.clone()
        };
        assert_eq!(same.compare(&old), RowOrder::NotNewer);
        let shrink = PoAru {
            num: 6,
            aru: vec![4, 2, 3, 3],
            ..old.clone()
        };
        assert_eq!(shrink.compare(&old), RowOrder::Inconsistent);
        // A recovered replica's first row under its new key replaces whatever the old key
        // signed (an attacker's row far ahead included); rows of the old key never come back.
        let fresh = PoAru {
            inc: 7,
            num: 1,
            aru: vec![1, 0, 0, 0],
            ..old.clone()
        };
        assert_eq!(fresh.compare(&replay), RowOrder::Newer);
        assert_eq!(replay.compare(&fresh), RowOrder::NotNewer);
    }

    #[test]
    fn rows_of_a_retired_incarnation_count_for_nothing() {
        let mut m = matrix(&[&[9, 0, 0, 0], &[9, 0, 0, 0], &[2, 0, 0, 0], &[2, 0, 0, 0]]);
        assert_eq!(m.proof_aru(0, 1), 2);
        // Replica 1 recovered (incarnation 5): its old row goes, and the cut follows the
        // replicas that remain.
        let current = |r: ReplicaId| if r == 1 { 5 } else { 0 };
        assert_eq!(m.masked(current).proof_aru(0, 1), 2);
        assert!(m.masked(current).rows[1].is_none());
        if let Some(r) = m.rows[1].as_mut() {
            r.row.inc = 5;
        }
        assert_eq!(m.masked(current), m);
    }

    #[test]
    fn matrix_checks_refuse_misplaced_short_and_unsigned_rows() {
        let ok = matrix(&[&[0; 4], &[0; 4], &[0; 4], &[0; 4]]);
        assert_eq!(ok.check(4, |_, _, _| true), Ok(()));
        assert_eq!(
            ok.check(4, |r, _, _| r.replica != 2),
            Err(MatrixError::BadSignature(2))
        );
        assert_eq!(
            ok.check(5, |_, _, _| true),
            Err(MatrixError::Rows { got: 4, n: 5 })
        );
        let mut swapped = ok.clone();
        swapped.rows.swap(0, 1);
        assert_eq!(
            swapped.check(4, |_, _, _| true),
            Err(MatrixError::Misplaced {
                slot: 0,
                replica: 1
            })
        );
        let mut short = ok.clone();
        short.rows[3] = row(3, 1, &[0, 0, 0]);
        assert_eq!(
            short.check(4, |_, _, _| true),
            Err(MatrixError::RowLength { got: 3, n: 4 })
        );
        let mut empty = ok.clone();
        empty.rows[2] = None;
        assert_eq!(
            empty.check(4, |_, _, _| false),
            Err(MatrixError::BadSignature(0))
        );
    }

    #[test]
    fn the_digest_covers_every_row_and_its_place() {
        let a = matrix(&[&[1, 0, 0, 0], &[0; 4], &[0; 4], &[0; 4]]);
        let mut b = a.clone();
        b.rows[1] = None;
        assert_ne!(a.digest(), b.digest());
        let mut c = a.clone();
        c.rows[0].as_mut().unwrap().sig = Signature([1; 64]);
        assert_ne!(a.digest(), c.digest());
        assert_eq!(a.digest(), a.clone().digest());
    }
}
