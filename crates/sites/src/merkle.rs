//! Merkle trees for batch signing (Amir et al. 2009, §3.2 and Figure 5): one signature covers
//! every message of a batch, and each message carries the log-size path from its leaf to the
//! signed root.
//!
//! The tree is a function of the leaves alone (pairs hashed left to right, an odd last node
//! carried up unhashed), so servers that batch the same messages in the same order compute the
//! same root and the same paths, byte for byte: what threshold signing needs (trap 2).

use redoubt_crypto::{Digest, DigestBuilder};
use serde::{Deserialize, Serialize};

/// The most leaves one tree holds (a path then has at most 16 siblings).
pub const LEAVES_MAX: usize = 1 << 16;

const NODE_DOMAIN: &str = "redoubt.merkle.node.v1";

/// Where a leaf sits in its tree and the siblings that lead from it to the root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Path {
    pub index: u32,
    pub leaves: u32,
    pub siblings: Vec<Digest>,
}

fn node(left: &Digest, right: &Digest) -> Digest {
    DigestBuilder::new(NODE_DOMAIN)
        .digest(left)
        .digest(right)
        .finish()
}

fn level_up(level: &[Digest]) -> Vec<Digest> {
    level
        .chunks(2)
        .map(|pair| match pair {
            [l, r] => node(l, r),
            [single] => *single,
            _ => unreachable!("chunks of two"),
        })
        .collect()
}

/// The root over `leaves` (1 to [`LEAVES_MAX`] of them); a single leaf is its own root.
pub fn root(leaves: &[Digest]) -> Digest {
    assert!(!leaves.is_empty() && leaves.len() <= LEAVES_MAX);
    let mut level = leaves.to_vec();
    while level.len() > 1 {
        level = level_up(&level);
    }
    level[0]
}

/// The root and every leaf's path, computed in one pass over the tree.
pub fn paths(leaves: &[Digest]) -> (Digest, Vec<Path>) {
    assert!(!leaves.is_empty() && leaves.len() <= LEAVES_MAX);
    let n = leaves.len();
    let mut paths: Vec<Path> = (0..n)
        .map(|i| Path {
            index: i as u32,
            leaves: n as u32,
            siblings: Vec::new(),
        })
        .collect();
    let mut level = leaves.to_vec();
    // Which node of the current level each leaf descends from.
    let mut at: Vec<usize> = (0..n).collect();
    while level.len() > 1 {
        for (path, pos) in paths.iter_mut().zip(at.iter_mut()) {
            let sibling = *pos ^ 1;
            if sibling < level.len() {
                path.siblings.push(level[sibling]);
            }
            *pos /= 2;
        }
        level = level_up(&level);
    }
    (level[0], paths)
}

impl Path {
    /// The root that `leaf` at this path leads to, or `None` if the path is malformed (index
    /// out of range, too many or too few siblings).
    pub fn root_of(&self, leaf: &Digest) -> Option<Digest> {
        let (mut i, mut n) = (self.index as usize, self.leaves as usize);
        if n == 0 || n > LEAVES_MAX || i >= n {
            return None;
        }
        let mut siblings = self.siblings.iter();
        let mut h = *leaf;
        while n > 1 {
            if i % 2 == 1 {
                h = node(siblings.next()?, &h);
            } else if i + 1 < n {
                h = node(&h, siblings.next()?);
            }
            i /= 2;
            n = n.div_ceil(2);
        }
        siblings.next().is_none().then_some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: usize) -> Vec<Digest> {
        (0..n)
            .map(|i| Digest::of(&(i as u64).to_le_bytes()))
            .collect()
    }

    #[test]
    fn every_path_leads_its_leaf_to_the_root() {
        for n in [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 100] {
            let l = leaves(n);
            let (r, ps) = paths(&l);
            assert_eq!(r, root(&l), "{n} leaves");
            for (leaf, p) in l.iter().zip(&ps) {
                assert_eq!(p.root_of(leaf), Some(r), "{n} leaves, index {}", p.index);
                assert!(p.siblings.len() <= 7, "log-size path");
            }
        }
    }

    #[test]
    fn a_path_leads_nowhere_else() {
        let l = leaves(9);
        let (r, ps) = paths(&l);
        // Another leaf at this path, or this leaf at another index, does not reach the root.
        assert_ne!(ps[3].root_of(&l[4]), Some(r));
        let mut moved = ps[3].clone();
        moved.index = 2;
        assert_ne!(moved.root_of(&l[3]), Some(r));
        // Malformed paths lead nowhere.
        let mut short = ps[3].clone();
        short.siblings.pop();
        assert_eq!(short.root_of(&l[3]), None);
        let mut long = ps[3].clone();
        long.siblings.push(r);
        assert_eq!(long.root_of(&l[3]), None);
        let mut out = ps[3].clone();
        out.index = 9;
        assert_eq!(out.root_of(&l[3]), None);
    }

    #[test]
    fn the_root_depends_on_the_order_of_the_leaves() {
        let mut l = leaves(4);
        let r = root(&l);
        l.swap(1, 2);
        assert_ne!(root(&l), r);
    }
}
