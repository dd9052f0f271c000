//! Agreement certificates as an execution node collects them (Yin et al. §3.1.3, §2.8): per
//! sequence number in its window, each agreement node's [`Order`] piece; f+1 pieces from
//! distinct agreement nodes naming one digest, with a body of that digest, certify a batch.
//!
//! f+1, not the paper's 2f+1: a piece says "I executed this batch at this sequence number",
//! and a correct replica executes only a batch it holds a commit certificate for, in order;
//! PBFT makes the committed batch at a sequence number unique, so one correct piece (among
//! f+1, at most f of them faulty) names it. Asking for 2f+1 would make every batch wait for
//! 2f+1 replicas to *execute* it, where PBFT guarantees only f+1 correct ones do without a
//! state transfer (a lagging replica catches up at a checkpoint, which here waits for the
//! execution nodes: simulator seed 902 of `--separated` sat in view changes forever). Pieces of
//! a replica that re-keyed (it recovered) are forgotten (`forget_from`), so what a replica
//! planted while it was compromised does not add to the f faulty ones of the moment.
//!
//! Bounds: sequence numbers in `(last_executed, last_executed + window]` only; per sequence
//! number one piece per agreement node (a later piece of the same node replaces its earlier
//! one: a correct node never sends two, a faulty one gains nothing by it); each piece keeps
//! its frame, so at most `n * window` frames, each at most `message_bytes_max`.

use crate::effect::Bytes;
use crate::message::{Batch, Order, NULL_DIGEST};
use crate::types::{ReplicaId, Seq, View};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One agreement node's piece for a sequence number.
struct Piece {
    view: View,
    digest: Digest,
    /// The frame it came in (passed on to execution peers that missed it).
    frame: Bytes,
    batch: Option<Arc<Batch>>,
}

/// A certified batch, ready to execute in order.
pub(super) struct CertifiedBatch {
    pub(super) digest: Digest,
    /// `None`: the null request.
    pub(super) batch: Option<Arc<Batch>>,
    /// The view one correct certifier at least names (the lowest among the f+1 highest):
    /// replies carry it so clients learn the primary.
    pub(super) view: View,
    /// The frames of the f+1 matching pieces: the certificate, kept for peers.
    pub(super) frames: Vec<Bytes>,
}

/// Why a piece was not taken.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Outside the window (already executed, or too far ahead).
    OutOfWindow,
    /// The body does not have the digest the piece names.
    BadDigest,
}

pub(super) struct Orders {
    f: u32,
    /// Matching pieces that certify a batch: 2f+1 (1 under the mutant `trust-one-order`).
    quorum: usize,
    window: Seq,
    slots: BTreeMap<Seq, BTreeMap<ReplicaId, Piece>>,
}

impl Orders {
    pub(super) fn new(f: u32, window: Seq) -> Self {
        Orders {
            f,
            quorum: f as usize + 1,
            window,
            slots: BTreeMap::new(),
        }
    }

    /// Mutant `trust-one-order`: one piece certifies.
    #[cfg(feature = "mutants")]
    pub(super) fn trust_one(&mut self) {
        self.quorum = 1;
    }

    /// Takes agreement node `from`'s piece `o`, which arrived in `frame`. The frame's
    /// authenticator entry was checked by the caller.
    pub(super) fn insert(
        &mut self,
        from: ReplicaId,
        o: Order,
        frame: Bytes,
        last_executed: Seq,
    ) -> Result<(), Refused> {
        if o.seq <= last_executed || o.seq > last_executed.saturating_add(self.window) {
            return Err(Refused::OutOfWindow);
        }
        let body_digest = o.batch.as_ref().map_or(NULL_DIGEST, Batch::digest);
        if body_digest != o.digest {
            return Err(Refused::BadDigest);
        }
        self.slots.entry(o.seq).or_default().insert(
            from,
            Piece {
                view: o.view,
                digest: o.digest,
                frame,
                batch: o.batch.map(Arc::new),
            },
        );
        Ok(())
    }

    /// The batch certified at `seq`, if 2f+1 pieces agree on it.
    pub(super) fn certified(&self, seq: Seq) -> Option<CertifiedBatch> {
        let slot = self.slots.get(&seq)?;
        let quorum = self.quorum;
        let mut count: BTreeMap<Digest, usize> = BTreeMap::new();
        for p in slot.values() {
            *count.entry(p.digest).or_default() += 1;
        }
        let (digest, _) = count.into_iter().find(|(_, c)| *c >= quorum)?;
        let matching: Vec<&Piece> = slot.values().filter(|p| p.digest == digest).collect();
        let mut views: Vec<View> = matching.iter().map(|p| p.view).collect();
        views.sort_unstable_by(|a, b| b.cmp(a));
        Some(CertifiedBatch {
            digest,
            batch: matching.iter().find_map(|p| p.batch.clone()),
            view: views[(self.f as usize).min(views.len() - 1)],
            frames: matching
                .iter()
                .take(quorum)
                .map(|p| p.frame.clone())
                .collect(),
        })
    }

    /// Forgets every piece of agreement node `r` (it re-keyed: what it sent before may have
    /// been sent while it was compromised; a correct one sends its pieces again).
    pub(super) fn forget_from(&mut self, r: ReplicaId) {
        for slot in self.slots.values_mut() {
            slot.remove(&r);
        }
        self.slots.retain(|_, s| !s.is_empty());
    }

    /// Forgets everything at or below `seq` (executed).
    pub(super) fn forget_through(&mut self, seq: Seq) {
        self.slots = self.slots.split_off(&(seq + 1));
    }

    /// Whether some piece above `seq` is held: a later batch is on its way, so `seq + 1`
    /// may have been lost.
    pub(super) fn any_above(&self, seq: Seq) -> bool {
        self.slots.range(seq + 1..).next().is_some()
    }

    pub(super) fn len(&self) -> usize {
        self.slots.values().map(BTreeMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::NonDet;

    fn order(replica: ReplicaId, seq: Seq, batch: Option<Batch>) -> Order {
        Order {
            replica,
            view: replica as View,
            seq,
            digest: batch.as_ref().map_or(NULL_DIGEST, Batch::digest),
            batch,
        }
    }

    fn batch(seed: u64) -> Batch {
        Batch {
            nondet: NonDet { time_ms: 1, seed },
            requests: Vec::new(),
            matrix: None,
        }
    }

    fn frame() -> Bytes {
        Arc::new(vec![0])
    }

    #[test]
    fn f_plus_one_matching_pieces_certify_and_f_do_not() {
        let mut o = Orders::new(1, 8);
        o.insert(0, order(0, 1, Some(batch(7))), frame(), 0)
            .unwrap();
        // A faulty node names another batch: no certificate yet.
        o.insert(2, order(2, 1, Some(batch(8))), frame(), 0)
            .unwrap();
        assert!(o.certified(1).is_none());
        // The same node twice does not count twice.
        o.insert(0, order(0, 1, Some(batch(7))), frame(), 0)
            .unwrap();
        assert!(o.certified(1).is_none());
        o.insert(3, order(3, 1, Some(batch(7))), frame(), 0)
            .unwrap();
        let c = o.certified(1).expect("f+1 match");
        assert_eq!(c.digest, batch(7).digest());
        assert_eq!(c.frames.len(), 2);
        // Views 3 and 0 among the matching pieces: the (f+1)-th highest is 0.
        assert_eq!(c.view, 0);
    }

    #[test]
    fn a_re_keyed_replica_s_pieces_are_forgotten() {
        let mut o = Orders::new(1, 8);
        o.insert(2, order(2, 1, Some(batch(8))), frame(), 0)
            .unwrap();
        o.insert(3, order(3, 1, Some(batch(8))), frame(), 0)
            .unwrap();
        assert!(o.certified(1).is_some());
        o.forget_from(2);
        assert!(o.certified(1).is_none());
        assert_eq!(o.len(), 1);
    }

    #[test]
    fn pieces_outside_the_window_or_with_a_wrong_body_are_refused() {
        let mut o = Orders::new(1, 8);
        assert_eq!(
            o.insert(0, order(0, 5, None), frame(), 5),
            Err(Refused::OutOfWindow)
        );
        assert_eq!(
            o.insert(0, order(0, 14, None), frame(), 5),
            Err(Refused::OutOfWindow)
        );
        let mut lie = order(0, 6, Some(batch(1)));
        lie.digest = batch(2).digest();
        assert_eq!(o.insert(0, lie, frame(), 5), Err(Refused::BadDigest));
        assert_eq!(o.len(), 0);
    }
}
