//! Small value types shared by every part of the overlay.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identity of an overlay node (a daemon). Node ids are dense: `0..Config::nodes_count`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct NodeId(pub u16);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// An undirected overlay link, the unit ODSBR accuses and weighs. Endpoints are stored in
/// ascending order so that `LinkId::new(a, b) == LinkId::new(b, a)`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LinkId {
    pub lo: NodeId,
    pub hi: NodeId,
}

impl LinkId {
    pub fn new(a: NodeId, b: NodeId) -> LinkId {
        assert_ne!(a, b, "a link joins two different nodes");
        if a < b {
            LinkId { lo: a, hi: b }
        } else {
            LinkId { lo: b, hi: a }
        }
    }

    pub fn touches(&self, n: NodeId) -> bool {
        self.lo == n || self.hi == n
    }
}

impl fmt::Debug for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.lo, self.hi)
    }
}

/// How the destination hands a flow's messages to its application.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Debug)]
pub enum Delivery {
    /// In the order the source submitted them, each exactly once (FIFO per source→destination).
    Ordered,
    /// As they arrive, each exactly once.
    Unordered,
}

impl Delivery {
    pub const ALL: [Delivery; 2] = [Delivery::Ordered, Delivery::Unordered];
}
