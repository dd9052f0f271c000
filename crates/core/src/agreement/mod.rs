//! Agreement's components (PBFT §4.2–4.4, BFT-PR §4.3): the log of slots, the request pool,
//! the checkpoint certificates of the order, the claims (P, Q, doubted slots) about views left,
//! the view-change messages held, and what peers report of their views. Each owns its state,
//! its bounds and its invariants; the replica (`crate::replica`) composes them with the
//! normal case and the view change. The decision procedure of the view change is
//! [`crate::viewchange`], the quorum predicates [`crate::quorum`].

pub(crate) mod certificates;
pub(crate) mod claims;
pub(crate) mod heard;
pub(crate) mod log;
pub(crate) mod pool;
pub(crate) mod proposals;
pub(crate) mod queue;
pub(crate) mod reports;
pub(crate) mod vcstore;
