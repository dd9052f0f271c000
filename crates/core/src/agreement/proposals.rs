//! What a proposal is and what becomes of it: the part of ordering that differs between
//! PBFT and Prime (ADR 0009 step 5). Agreement (the log, pre-prepare/prepare/commit, the
//! checkpoints' votes, the view change) is the same for both; it asks a [`Proposals`]
//! whether a proposal is well formed, tells it what was accepted, committed, executed,
//! checkpointed and which view is in force, and asks it what a committed proposal runs.
//!
//! - [`Batches`] is PBFT's: the primary batches clients' requests, a committed batch runs
//!   itself, and nothing else follows.
//! - Prime's is [`crate::prime::side::PrimeSide`] (`prime/side/proposals.rs`): clients'
//!   requests are pre-ordered by their originators, the leader proposes summary matrices,
//!   and a committed matrix runs what it made eligible.
//!
//! An implementation answers in values and keeps what it would send or journal for its host
//! ([`Proposals::take_outs`]), which does it in order; what it needs of the replica around
//! it comes in a [`Host`].

use crate::journal::Record;
use crate::message::{Batch, Message, SignedRequest};
use crate::prime::side::PrimeSide;
use crate::types::{ReplicaId, Seq, View};
use redoubt_crypto::pk::VerifyKey;
use redoubt_crypto::Digest;
use std::sync::Arc;

/// What a [`Proposals`] would send or journal; its host does it, in order.
#[derive(Clone, Debug)]
pub enum Out {
    /// To every other replica.
    Broadcast(Message),
    /// To one replica.
    Send(ReplicaId, Message),
    /// To the journal, before anything sent after it.
    Persist(Record),
}

/// Replica `j`'s order key a recovery installed, and its incarnation, as the state executed
/// here says (`None`: the key dealt at `init` is in force, incarnation 0).
pub type KeyOf<'a> = &'a dyn Fn(ReplicaId) -> Option<(u64, VerifyKey)>;

/// An ordinal as the journal recorded it ran here (its `Executed` and `Ran` records).
#[derive(Clone, Debug)]
pub struct JournaledRun {
    /// The digest of the proposal agreement committed.
    pub digest: Digest,
    /// The requests that ran, in order.
    pub requests: Vec<SignedRequest>,
    /// The eligibility after them.
    pub after: Vec<Seq>,
}

/// What a [`Proposals`] reads of the replica around it.
pub struct Host<'a> {
    /// The replica's clock (ms).
    pub now: u64,
    /// True while the journal's batches are executed again after a restart (nothing goes
    /// out).
    pub replaying: bool,
    /// The last sequence number executed.
    pub executed: Seq,
    /// The eligibility the executed state holds (Prime; empty under PBFT).
    pub eligible: &'a [Seq],
    /// Replica `j`'s order key its latest accepted recovery installed, as the executed state
    /// says.
    pub installed: KeyOf<'a>,
}

/// The requests a committed proposal made eligible, in execution order, and the
/// eligibility after them (Prime).
pub struct Eligible {
    pub run: Batch,
    pub after: Vec<Seq>,
}

impl Eligible {
    /// What the committed `proposal` ran here before, as the journal recorded it: the
    /// `requests` with the proposal's agreed clock and seed, and the eligibility `after`.
    pub fn as_journaled(proposal: &Batch, requests: &[SignedRequest], after: &[Seq]) -> Self {
        Eligible {
            run: Batch {
                nondet: proposal.nondet,
                requests: requests.to_vec(),
                matrix: None,
            },
            after: after.to_vec(),
        }
    }
}

/// What follows a proposal's execution once the leader has had its chance to propose again
/// (Prime: reconciliation's certified copies to the replicas not known to hold them).
pub struct Followup {
    pub(crate) copies: Vec<(Vec<ReplicaId>, Arc<crate::prime::preorder::PoRequest>)>,
}

/// The rules of one ordering protocol's proposals (see the module comment).
pub trait Proposals: Send {
    // ----- requests and proposals ----------------------------------------------------------

    /// Whether the primary batches clients' requests itself (PBFT). Otherwise each request is
    /// ordered first by the replica it came to, is neither relayed to the leader nor pooled
    /// by it, and the leader proposes something else (Prime: matrices).
    fn leader_batches(&self) -> bool;

    /// Whether a proposal has this protocol's shape (`beside`: how many requests travel
    /// beside its batch).
    fn well_formed(&self, batch: &Batch, beside: usize) -> bool;

    /// Whether what the proposal carries signed by replicas is valid (Prime: its matrix's
    /// rows, each under its replica's order key in force).
    fn signed_validly(&self, batch: &Batch, installed: KeyOf<'_>) -> bool;

    /// A proposal of the current view was accepted here (pre-prepared, or proposed by us).
    fn accepted(&mut self, batch: &Batch, host: &Host<'_>);

    // ----- execution ------------------------------------------------------------------------

    /// What the committed proposal `batch` (digest `digest`) at `seq` runs: `Ok(None)`
    /// itself, `Ok(Some)` what it made eligible, `Err` not yet (what it needs is missing
    /// here and was asked for).
    fn runs(
        &mut self,
        seq: Seq,
        digest: &Digest,
        batch: &Batch,
        host: &Host<'_>,
    ) -> Result<Option<Eligible>, ()>;

    /// The eligibility `after` an ordinal, with the numbering of replicas whose recovery ran
    /// in it fenced.
    fn fence(&mut self, after: &[Seq]) -> Vec<Seq>;

    /// The proposal `batch` ran, taking eligibility from `before` to `after` (`fenced`
    /// with the fences): what follows once the leader had its chance to propose, `None` if
    /// nothing does (or while replaying).
    fn ran(
        &mut self,
        batch: &Batch,
        before: &[Seq],
        after: &[Seq],
        fenced: &[Seq],
        host: &Host<'_>,
    ) -> Option<Followup>;

    /// Does what a [`Followup`] says (into [`Proposals::take_outs`]).
    fn follow_up(&mut self, f: Followup);

    /// Replica `r`'s recovery request was accepted in the ordinal executing now.
    fn recovered(&mut self, r: ReplicaId);

    /// Whether replicas sign with order keys that their recoveries replace (Prime's rows).
    fn order_keys(&self) -> bool;

    /// Some replica's order key may have changed: true if one we use did.
    fn refresh_incarnations(&mut self, installed: KeyOf<'_>) -> bool;

    // ----- checkpoints and state -----------------------------------------------------------

    /// We took checkpoint `seq`, whose state holds eligibility `eligible`.
    fn checkpoint(&mut self, seq: Seq, eligible: &[Seq]);

    /// Checkpoint `seq` is stable.
    fn stable(&mut self, seq: Seq);

    /// The state jumped to one holding eligibility `eligible` (a fetched checkpoint, a
    /// restart). True if the journal must learn it (a `Ran` record).
    fn sync(&mut self, eligible: &[Seq]) -> bool;

    /// What the journal says ordinal `seq` ran, for when the restart's replay stopped
    /// short of it.
    fn keep_journaled(&mut self, seq: Seq, run: JournaledRun);

    /// This protocol's records from the journal, after the replay.
    fn restore(&mut self, records: &[Record]);

    // ----- views, keys, recovery -----------------------------------------------------------

    /// A view change to `v` began (`changing`), or view `v` was installed.
    fn view(&mut self, v: View, changing: bool, now: u64);

    /// Our peers' session keys changed (we re-keyed): votes received under the old ones
    /// that count towards nothing yet go.
    fn keys_changed(&mut self);

    /// A recovery starts here: what the journal gave back is not trusted. (`own`: the
    /// simulator's mutant that forgets our own votes too.)
    fn forget(&mut self, own: bool);

    // ----- the host ------------------------------------------------------------------------

    /// What it would send or journal since the last call, in order.
    fn take_outs(&mut self) -> Vec<Out>;

    /// Prime's own component, for Prime's messages and timers (`replica/prime.rs`).
    fn prime(&self) -> Option<&PrimeSide> {
        None
    }

    /// See [`Proposals::prime`].
    fn prime_mut(&mut self) -> Option<&mut PrimeSide> {
        None
    }
}

/// PBFT's proposals: batches of clients' requests, each running itself.
pub struct Batches;

impl Proposals for Batches {
    fn leader_batches(&self) -> bool {
        true
    }

    fn well_formed(&self, batch: &Batch, _beside: usize) -> bool {
        batch.matrix.is_none()
    }

    fn signed_validly(&self, _batch: &Batch, _installed: KeyOf<'_>) -> bool {
        true
    }

    fn accepted(&mut self, _batch: &Batch, _host: &Host<'_>) {}

    fn runs(
        &mut self,
        _seq: Seq,
        _digest: &Digest,
        _batch: &Batch,
        _host: &Host<'_>,
    ) -> Result<Option<Eligible>, ()> {
        Ok(None)
    }

    fn fence(&mut self, after: &[Seq]) -> Vec<Seq> {
        after.to_vec()
    }

    fn ran(
        &mut self,
        _batch: &Batch,
        _before: &[Seq],
        _after: &[Seq],
        _fenced: &[Seq],
        _host: &Host<'_>,
    ) -> Option<Followup> {
        None
    }

    fn follow_up(&mut self, _f: Followup) {}

    fn recovered(&mut self, _r: ReplicaId) {}

    fn order_keys(&self) -> bool {
        false
    }

    fn refresh_incarnations(&mut self, _installed: KeyOf<'_>) -> bool {
        false
    }

    fn checkpoint(&mut self, _seq: Seq, _eligible: &[Seq]) {}

    fn stable(&mut self, _seq: Seq) {}

    fn sync(&mut self, _eligible: &[Seq]) -> bool {
        false
    }

    fn keep_journaled(&mut self, _seq: Seq, _run: JournaledRun) {}

    fn restore(&mut self, _records: &[Record]) {}

    fn view(&mut self, _v: View, _changing: bool, _now: u64) {}

    fn keys_changed(&mut self) {}

    fn forget(&mut self, _own: bool) {}

    fn take_outs(&mut self) -> Vec<Out> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{NonDet, Request};

    /// No recovery installed an order key anywhere.
    fn none_installed(_j: ReplicaId) -> Option<(u64, VerifyKey)> {
        None
    }

    fn host(eligible: &[Seq]) -> Host<'_> {
        Host {
            now: 5,
            replaying: false,
            executed: 3,
            eligible,
            installed: &none_installed,
        }
    }

    fn batch() -> Batch {
        let request = Request {
            client: 7,
            timestamp: 1,
            op: bytes::Bytes::from_static(b"put k v"),
            read_only: false,
        };
        Batch {
            nondet: NonDet {
                time_ms: 5,
                seed: 9,
            },
            requests: vec![SignedRequest {
                request,
                auth: Vec::new().into(),
                sig: None,
            }],
            matrix: None,
        }
    }

    /// PBFT's batches run themselves, are well formed without a matrix only, and leave
    /// nothing behind: agreement driven through the interface alone.
    #[test]
    fn pbft_batches_run_themselves() {
        let mut p = Batches;
        let b = batch();
        assert!(p.leader_batches());
        assert!(p.well_formed(&b, 3));
        assert!(p.signed_validly(&b, &none_installed));
        p.accepted(&b, &host(&[]));
        assert!(matches!(p.runs(4, &b.digest(), &b, &host(&[])), Ok(None)));
        assert_eq!(p.fence(&[1, 2]), vec![1, 2]);
        assert!(p.ran(&b, &[], &[], &[], &host(&[])).is_none());
        p.recovered(1);
        assert!(!p.order_keys());
        p.checkpoint(4, &[]);
        p.stable(4);
        assert!(!p.sync(&[]));
        p.view(1, true, 5);
        p.keys_changed();
        p.forget(false);
        assert!(p.take_outs().is_empty());
        assert!(p.prime().is_none());
    }
}
