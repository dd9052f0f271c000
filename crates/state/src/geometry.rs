//! The shape of the partition tree.

use serde::{Deserialize, Serialize};

/// Default page size in bytes (PBFT §6.3: 4 KB pages).
pub const DEFAULT_PAGE_SIZE: u32 = 4096;
/// Default number of sub-partitions of each meta-data partition (BFT-PR §6: s = 256).
pub const DEFAULT_FANOUT: u32 = 256;

/// Page size, page count and fan-out. The depth follows from the page count: the smallest
/// `d >= 1` with `fanout^d >= pages`. Level 0 is the root; level `depth` holds the pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    page_size: u32,
    pages: u64,
    fanout: u32,
    depth: u8,
}

impl Geometry {
    /// Checks and builds a geometry. The page size must be a power of two between 64 bytes
    /// and 1 MiB, the fan-out between 2 and 4096, and the page count between 1 and 2^40.
    pub fn new(page_size: u32, pages: u64, fanout: u32) -> Result<Geometry, String> {
        if !page_size.is_power_of_two() || !(64..=1 << 20).contains(&page_size) {
            return Err(format!(
                "page size {page_size} must be a power of two between 64 and 1048576 bytes"
            ));
        }
        if !(2..=4096).contains(&fanout) {
            return Err(format!("fan-out {fanout} must be between 2 and 4096"));
        }
        if !(1..=1 << 40).contains(&pages) {
            return Err(format!("page count {pages} must be between 1 and 2^40"));
        }
        let mut depth = 1u8;
        let mut span = fanout as u64;
        while span < pages {
            span = span.saturating_mul(fanout as u64);
            depth += 1;
        }
        Ok(Geometry {
            page_size,
            pages,
            fanout,
            depth,
        })
    }

    /// The geometry for a state of at least `bytes` bytes with the default page size and
    /// fan-out.
    pub fn for_size(bytes: u64) -> Result<Geometry, String> {
        let ps = DEFAULT_PAGE_SIZE as u64;
        Geometry::new(DEFAULT_PAGE_SIZE, bytes.div_ceil(ps).max(1), DEFAULT_FANOUT)
    }

    pub fn page_size(&self) -> usize {
        self.page_size as usize
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    pub fn fanout(&self) -> u64 {
        self.fanout as u64
    }

    /// The level of the pages (the root is level 0).
    pub fn depth(&self) -> u8 {
        self.depth
    }

    /// State size in bytes.
    pub fn size(&self) -> u64 {
        self.pages * self.page_size as u64
    }

    /// Number of partitions at `level`.
    pub fn nodes_at(&self, level: u8) -> u64 {
        let mut n = self.pages;
        for _ in level..self.depth {
            n = n.div_ceil(self.fanout as u64);
        }
        n
    }

    /// Index range, at `level + 1`, of the children of partition `index` at `level`.
    pub fn children(&self, level: u8, index: u64) -> std::ops::Range<u64> {
        let f = self.fanout as u64;
        let below = self.nodes_at(level + 1);
        let start = (index * f).min(below);
        start..(start + f).min(below)
    }

    /// Whether (`level`, `index`) names a partition of this tree.
    pub fn contains(&self, level: u8, index: u64) -> bool {
        level <= self.depth && index < self.nodes_at(level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_and_counts() {
        let g = Geometry::new(4096, 262_144, 256).unwrap();
        assert_eq!(g.depth(), 3);
        assert_eq!(g.nodes_at(3), 262_144);
        assert_eq!(g.nodes_at(2), 1024);
        assert_eq!(g.nodes_at(1), 4);
        assert_eq!(g.nodes_at(0), 1);
        assert_eq!(g.children(0, 0), 0..4);
        assert_eq!(g.children(1, 3), 768..1024);
        let g = Geometry::new(64, 1, 2).unwrap();
        assert_eq!(g.depth(), 1);
        assert_eq!(g.children(0, 0), 0..1);
        let g = Geometry::new(64, 10, 3).unwrap();
        assert_eq!(g.depth(), 3);
        assert_eq!(g.nodes_at(2), 4);
        assert_eq!(g.children(2, 3), 9..10);
        assert!(Geometry::new(100, 1, 2).is_err());
        assert!(Geometry::new(64, 0, 2).is_err());
        assert!(Geometry::new(64, 1, 1).is_err());
    }
}
