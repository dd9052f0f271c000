//! What a replica must remember across a crash, as records the host makes durable.
//!
//! The replica emits [`Effect::Persist`](crate::Effect::Persist) records *before* the sends that
//! depend on them (a PREPARE after recording the pre-prepare, a COMMIT after recording that the
//! slot prepared, a REPLY after recording the executed batch, a VIEW-CHANGE after recording the
//! view). Hosts must make every record of one `handle` call durable before performing any send
//! of that call; batching the sync per call (or per several calls) keeps it cheap.
//!
//! With this, a correct replica that crashes and restarts never contradicts what it said before
//! (no equivocation after amnesia), keeps the prepared certificates the view change relies on,
//! and re-executes its committed batches, so restarting every replica at once loses no write a
//! client saw acknowledged.

use crate::message::{
    AckPart, Batch, PEntry, PoRequest, QEntry, SignedRequest, ViewChange, NULL_DIGEST,
};
use crate::types::{Seq, View};
use redoubt_crypto::Digest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// The state's durable base reached checkpoint `seq` (stable, or installed by state
    /// transfer); the pages live in the page store, which always holds this checkpoint or a
    /// later one. Everything about sequence numbers at or below `seq` that precedes it may be
    /// discarded.
    Checkpoint { seq: Seq, digest: Digest },
    /// Entered `view`: sent VIEW-CHANGE (`vc` is what was sent, PSet/QSet as computed), or
    /// installed its NEW-VIEW (`normal`).
    View {
        view: View,
        normal: bool,
        vc: Option<ViewChange>,
        pset: Vec<PEntry>,
        qset: Vec<QEntry>,
        /// Bodies of the batches PSet, QSet and the doubted slots name (the view change may
        /// need them).
        batches: Vec<Batch>,
        /// Slots of views left that this replica pre-prepared without vouching for every
        /// request: (seq, view, digest) (see `Replica::doubted`).
        doubted: Vec<(Seq, View, Digest)>,
    },
    /// Accepted a pre-prepare for `digest` at `seq` in `view`. `vouched`: this replica sent
    /// PRE-PREPARE or PREPARE for it (false when it could not authenticate a request in it).
    PrePrepared {
        view: View,
        seq: Seq,
        digest: Digest,
        batch: Option<Arc<Batch>>,
        vouched: bool,
    },
    /// Prepared `digest` at `seq` in `view` (about to send COMMIT).
    Prepared {
        view: View,
        seq: Seq,
        digest: Digest,
    },
    /// Executed the batch `digest` at `seq`. `batch` is `None` for the null request
    /// (`digest` is [`NULL_DIGEST`](crate::message::NULL_DIGEST)), and also when the replica
    /// had journaled the body in a `PrePrepared` record for the same `seq` and `digest`
    /// since its last view record: the body is then written once, and compaction keeps that
    /// record for as long as it keeps this one.
    Executed {
        seq: Seq,
        digest: Digest,
        batch: Option<Arc<Batch>>,
    },
    /// The low watermark moved to checkpoint `seq` (`digest`) without the state's durable base
    /// moving with it: a NEW-VIEW named a checkpoint this replica does not hold (or not as a
    /// durable copy). From here on it claims nothing at or below `seq` in view changes, so
    /// after a restart it must not fall back to its older checkpoint and claim less than it
    /// did (it reports `seq` again and fetches that checkpoint). Last in the enum, so
    /// journals written before it existed still decode.
    Watermark { seq: Seq, digest: Digest },
    /// Entered `view` (made active) on the NEW-VIEW with digest `new_view` (see
    /// [`crate::message::NewView::digest`]), checked or vouched for: after a restart the
    /// replica still reports it in its STATUS, which lets others enter the view on it. Last in
    /// the enum, so older journals still decode.
    Entered { view: View, new_view: Digest },
    /// Prime: introduced our own PO-REQUEST (before sending it): after a restart it is held
    /// again and our numbering goes on after it, so no number is reused with other content.
    Introduced { request: Arc<PoRequest> },
    /// Prime: the matrix batch at `seq` ran `requests` (what its matrix made eligible),
    /// leaving the eligibility at `eligible` (recorded before its `Executed` record): a
    /// restart runs them again without the PO-REQUESTs.
    Ran {
        seq: Seq,
        eligible: Vec<Seq>,
        requests: Vec<SignedRequest>,
    },
    /// Prime: acknowledged these PO-REQUESTs (before sending the PO-ACK): after a restart we
    /// never acknowledge another version of one.
    Acked { parts: Vec<AckPart> },
    /// Prime: accepted another replica's PO-REQUEST (before acknowledging it): after a
    /// restart we hold it again. Without it, a power failure of every replica could lose the
    /// only copies of a PO-REQUEST that an ordered matrix made eligible (the originator may have
    /// run it and forgotten it), and no replica could run what follows. Last in the enum, so
    /// older journals still decode.
    Held { request: Arc<PoRequest> },
    /// Prime: these PO-REQUESTs got certificates (2f+1 matching acknowledgements) here: after
    /// a restart a copy we hold of one is still the certified version. Last in the enum.
    Certified { parts: Vec<AckPart> },
    /// Prime: drew a fresh order key for a recovery request (before sending the request): if
    /// the request runs, our rows are signed with it, also after a restart. The latest
    /// [`ORDER_KEYS_KEPT`] survive compaction. Last in the enum.
    OrderKey { seed: [u8; 32] },
}

/// How many of the latest [`Record::OrderKey`] records compaction keeps.
pub const ORDER_KEYS_KEPT: usize = 4;

/// Whether the host compacts the journal after appending `r` (checkpoint and view records,
/// and Prime's executions, which let it drop what ran).
pub fn compacts_after(r: &Record) -> bool {
    matches!(
        r,
        Record::Checkpoint { .. } | Record::View { .. } | Record::Ran { .. }
    )
}

impl Record {
    /// The sequence number a record is about, if any.
    pub fn seq(&self) -> Option<Seq> {
        match self {
            Record::Checkpoint { seq, .. }
            | Record::PrePrepared { seq, .. }
            | Record::Prepared { seq, .. }
            | Record::Executed { seq, .. }
            | Record::Ran { seq, .. }
            | Record::Watermark { seq, .. } => Some(*seq),
            Record::View { .. }
            | Record::Entered { .. }
            | Record::Introduced { .. }
            | Record::Held { .. }
            | Record::Certified { .. }
            | Record::OrderKey { .. }
            | Record::Acked { .. } => None,
        }
    }

    /// The record's kind, for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Checkpoint { .. } => "checkpoint",
            Record::View { .. } => "view",
            Record::PrePrepared { .. } => "pre-prepared",
            Record::Prepared { .. } => "prepared",
            Record::Executed { .. } => "executed",
            Record::Watermark { .. } => "watermark",
            Record::Entered { .. } => "entered",
            Record::Introduced { .. } => "introduced",
            Record::Held { .. } => "held",
            Record::Certified { .. } => "certified",
            Record::Ran { .. } => "ran",
            Record::Acked { .. } => "acked",
            Record::OrderKey { .. } => "order-key",
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("records encode")
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, postcard::Error> {
        postcard::from_bytes(bytes)
    }
}

/// Compacts a journal to what a restart needs: the last checkpoint, the last view record, the
/// last watermark if above the checkpoint, the executions after the checkpoint, the pre-prepares and prepares of the last view after
/// the checkpoint (older views live on in the view record's PSet and QSet), and, for an
/// execution recorded without its body, the last pre-prepare that carries it. Order is kept.
/// Hosts call it after appending a checkpoint or a view record, which bounds a journal by
/// about 5L + 3 records.
pub fn compact(records: Vec<Record>) -> Vec<Record> {
    let keep = kept(&records.iter().collect::<Vec<_>>());
    records
        .into_iter()
        .zip(keep)
        .filter_map(|(r, k)| k.then_some(r))
        .collect()
}

/// Which records [`compact`] keeps, by position (hosts that track something per record, such
/// as its size on disk, filter it alike).
pub fn kept(records: &[&Record]) -> Vec<bool> {
    let ck = records
        .iter()
        .rposition(|r| matches!(r, Record::Checkpoint { .. }));
    let h = ck.map_or(0, |i| records[i].seq().expect("checkpoint has a seq"));
    let last_view = records
        .iter()
        .rposition(|r| matches!(r, Record::View { .. }));
    let watermark = records
        .iter()
        .rposition(|r| matches!(r, Record::Watermark { .. }));
    let view = last_view.map(|i| match records[i] {
        Record::View { view, .. } => *view,
        _ => unreachable!("position of a view record"),
    });
    // Executions kept whose body lives in a pre-prepare record, and the last such record of
    // each.
    let mut bodies_needed: BTreeSet<(Seq, Digest)> = records
        .iter()
        .filter_map(|r| match *r {
            Record::Executed {
                seq,
                digest,
                batch: None,
            } if *seq > h && *digest != NULL_DIGEST => Some((*seq, *digest)),
            _ => None,
        })
        .collect();
    // Prime: PO-REQUESTs at or below what some completed execution made eligible have run
    // (a PO-REQUEST only becomes eligible once its predecessors are). An execution is complete
    // when its `Executed` record follows its `Ran` record, or a checkpoint covers it: a `Ran`
    // whose `Executed` a power failure cut off runs again after the restart, and needs the
    // PO-REQUESTs it names.
    let mut ran: Vec<Seq> = Vec::new();
    let mut executed_after = BTreeSet::new();
    for r in records.iter().rev() {
        match *r {
            Record::Executed { seq, .. } => {
                executed_after.insert(*seq);
            }
            Record::Ran { seq, eligible, .. } if *seq <= h || executed_after.contains(seq) => {
                ran.resize(ran.len().max(eligible.len()), 0);
                for (x, e) in ran.iter_mut().zip(eligible) {
                    *x = (*x).max(*e);
                }
            }
            _ => {}
        }
    }
    let last_ran = records
        .iter()
        .rposition(|r| matches!(r, Record::Ran { .. }));
    let order_keys: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Record::OrderKey { .. }))
        .map(|(i, _)| i)
        .collect();
    let order_keys = &order_keys[order_keys.len().saturating_sub(ORDER_KEYS_KEPT)..];
    let mut body_records = BTreeSet::new();
    for (i, r) in records.iter().enumerate().rev() {
        if let Record::PrePrepared {
            seq,
            digest,
            batch: Some(_),
            ..
        } = *r
        {
            if bodies_needed.remove(&(*seq, *digest)) {
                body_records.insert(i);
            }
        }
    }
    records
        .iter()
        .enumerate()
        .map(|(i, r)| match *r {
            Record::Checkpoint { .. } => Some(i) == ck,
            Record::View { .. } => Some(i) == last_view,
            Record::Watermark { seq, .. } => Some(i) == watermark && *seq > h,
            // The entry into the current view, recorded after its view record.
            Record::Entered { view: v, .. } => last_view.is_some_and(|l| i > l) && view == Some(*v),
            Record::Executed { seq, .. } => *seq > h,
            // The last execution stays even below the checkpoint: its eligibility tells
            // later compactions which of our PO-REQUESTs and acknowledgements ran.
            Record::Ran { seq, .. } => *seq > h || Some(i) == last_ran,
            Record::Introduced { request } | Record::Held { request } => {
                request.seq > ran.get(request.originator as usize).copied().unwrap_or(0)
            }
            Record::Acked { parts } | Record::Certified { parts } => parts
                .iter()
                .any(|p| p.seq > ran.get(p.originator as usize).copied().unwrap_or(0)),
            Record::PrePrepared { view: v, seq, .. } => {
                (*seq > h && view.is_none_or(|cur| *v >= cur)) || body_records.contains(&i)
            }
            Record::Prepared { view: v, seq, .. } => *seq > h && view.is_none_or(|cur| *v >= cur),
            Record::OrderKey { .. } => order_keys.contains(&i),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(x: u8) -> Digest {
        Digest([x; 32])
    }

    fn view(v: View) -> Record {
        Record::View {
            view: v,
            normal: true,
            vc: None,
            pset: vec![],
            qset: vec![],
            batches: vec![],
            doubted: vec![],
        }
    }

    #[test]
    fn compaction_keeps_what_restart_needs() {
        let pp = |v, n| Record::PrePrepared {
            view: v,
            seq: n,
            digest: d(n as u8),
            batch: None,
            vouched: true,
        };
        let ex = |n| Record::Executed {
            seq: n,
            digest: d(n as u8),
            batch: None,
        };
        let ck = |n| Record::Checkpoint {
            seq: n,
            digest: d(0),
        };
        let records = vec![
            view(0),
            pp(0, 1),
            ex(1),
            pp(0, 2),
            ck(1),
            view(1),
            pp(1, 2),
            pp(1, 3),
            ex(2),
            ex(3),
        ];
        let kept = compact(records);
        assert_eq!(
            kept,
            vec![ck(1), view(1), pp(1, 2), pp(1, 3), ex(2), ex(3)],
            "old views, old checkpoints and entries at or below the checkpoint are dropped"
        );
        assert_eq!(compact(kept.clone()), kept, "compaction is idempotent");
    }

    /// Prime: a PO-REQUEST we accepted (or introduced) goes once an execution that made it
    /// eligible is complete, not on its `Ran` record alone: a power failure between `Ran` and
    /// `Executed` runs the batch again after the restart, which needs the PO-REQUEST
    /// (simulator seed 1705 of `--ordering prime`).
    #[test]
    fn prime_requests_go_once_their_execution_is_complete() {
        let req = |o: crate::types::ReplicaId, s: Seq| {
            Arc::new(PoRequest {
                originator: o,
                seq: s,
                requests: vec![],
            })
        };
        let held = Record::Held { request: req(1, 8) };
        let own = Record::Introduced { request: req(0, 3) };
        let ran = Record::Ran {
            seq: 18,
            eligible: vec![3, 8],
            requests: vec![],
        };
        let ex = Record::Executed {
            seq: 18,
            digest: d(18),
            batch: None,
        };
        let cut_off = vec![view(0), held.clone(), own.clone(), ran.clone()];
        assert_eq!(
            compact(cut_off.clone()),
            cut_off,
            "the execution may run again"
        );
        let done = vec![view(0), held, own, ran.clone(), ex.clone()];
        assert_eq!(compact(done), vec![view(0), ran, ex]);
    }

    #[test]
    fn compaction_keeps_the_last_watermark_above_the_checkpoint() {
        let ck = |n| Record::Checkpoint {
            seq: n,
            digest: d(0),
        };
        let wm = |n| Record::Watermark {
            seq: n,
            digest: d(n as u8),
        };
        let records = vec![ck(1), wm(8), view(1), wm(16)];
        assert_eq!(compact(records), vec![ck(1), view(1), wm(16)]);
        // A checkpoint at or above the watermark makes it moot.
        let records = vec![ck(1), wm(16), ck(16), view(2)];
        assert_eq!(compact(records), vec![ck(16), view(2)]);
    }

    #[test]
    fn compaction_keeps_the_body_of_an_execution_recorded_without_it() {
        let batch = Arc::new(Batch {
            nondet: crate::message::NonDet {
                time_ms: 1,
                seed: 2,
            },
            requests: vec![],
            matrix: None,
        });
        let pp = |v, n, body: bool| Record::PrePrepared {
            view: v,
            seq: n,
            digest: d(n as u8),
            batch: body.then(|| batch.clone()),
            vouched: true,
        };
        let ex = |n, body: bool| Record::Executed {
            seq: n,
            digest: d(n as u8),
            batch: body.then(|| batch.clone()),
        };
        let records = vec![
            view(0),
            pp(0, 1, true),
            pp(0, 2, true),
            pp(0, 3, true),
            ex(1, false),
            ex(2, true),
            view(1),
            pp(1, 1, true),
            view(2),
            pp(2, 3, false),
        ];
        let kept = compact(records);
        assert_eq!(
            kept,
            vec![
                ex(1, false),
                ex(2, true),
                pp(1, 1, true),
                view(2),
                pp(2, 3, false)
            ],
            "one body per execution recorded without it (the last), nothing for the others"
        );
        assert_eq!(compact(kept.clone()), kept, "compaction is idempotent");
    }
}
