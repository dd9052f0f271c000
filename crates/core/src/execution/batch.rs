//! Running a committed batch, one request at a time: the per-request rules, once for the
//! co-located replica and the execution node (exactly once per client timestamp, the agreed
//! clock and seed, opening sealed operations, recording the result in the reply table).
//!
//! Where each result goes (a reply, a firewall bundle, nowhere while replaying) is the
//! caller's: it walks the batch with [`Execution::next_request`] and acts on each [`Step`]
//! in the batch's order, so replies leave in that order.

use super::recovery::{run_recovery, Recoveries};
use super::{Execution, LastReply};
use crate::message::Batch;
use crate::service::{ExecContext, Service};
use crate::types::{ReplicaId, Seq};

/// A batch being run (see [`Execution::begin_batch`]).
pub(crate) struct BatchRun {
    seq: Seq,
    time_ms: u64,
    seed: u64,
    next: usize,
    /// Whether the service runs the requests; `false` where this component only keeps the
    /// exactly-once table for batches others execute (the agreement replicas of the
    /// separated deployment), each recorded with an empty result.
    runs_service: bool,
}

/// What became of one request of a batch.
pub(crate) enum Step {
    /// It ran (or was recorded, see [`BatchRun::runs_service`]); its result is the client's
    /// last reply ([`Execution::last_reply`]).
    Ran { index: usize },
    /// It ran before: nothing ran, nothing was recorded.
    Again { index: usize },
    /// It is replica `replica`'s recovery request and ran (see `recovery.rs`); its result
    /// is recorded like any other. If it was `accepted`, the caller acts on what it means
    /// for keys before the next step.
    Recovery {
        index: usize,
        replica: ReplicaId,
        accepted: bool,
    },
}

impl<S: Service> Execution<S> {
    /// Starts running `batch` at `seq`; the agreed clock moves strictly past the previous
    /// batch's.
    pub(crate) fn begin_batch(&mut self, seq: Seq, batch: &Batch, runs_service: bool) -> BatchRun {
        let time_ms = self.start_batch(batch.nondet.time_ms);
        BatchRun {
            seq,
            time_ms,
            seed: batch.nondet.seed,
            next: 0,
            runs_service,
        }
    }

    /// Runs the next request of `batch` (the one `run` was begun for); `None` once every
    /// request had its step. `recoveries` says how recovery requests are treated (skipped
    /// ones have no step).
    pub(crate) fn next_request(
        &mut self,
        run: &mut BatchRun,
        batch: &Batch,
        recoveries: &Recoveries,
    ) -> Option<Step> {
        loop {
            let index = run.next;
            let req = &batch.requests.get(index)?.request;
            run.next += 1;
            let c = req.client;
            if self.ran(c, req.timestamp) {
                return Some(Step::Again { index });
            }
            let Some(replica) = recoveries.replica_of(c) else {
                return Some(self.run_request(run, batch, index));
            };
            let Recoveries::Run(rules) = recoveries else {
                continue; // not run here
            };
            let (result, accepted) = run_recovery(
                rules,
                self.last_reply(c),
                &req.op,
                req.timestamp,
                run.seq,
                run.time_ms,
            );
            let timestamp = req.timestamp;
            self.record(c, LastReply { timestamp, result });
            return Some(Step::Recovery {
                index,
                replica,
                accepted,
            });
        }
    }

    /// Runs (or only records) request `index` of `batch`, an ordinary one not run before.
    fn run_request(&mut self, run: &BatchRun, batch: &Batch, index: usize) -> Step {
        let req = &batch.requests[index].request;
        let c = req.client;
        let ctx = ExecContext {
            seq: run.seq,
            client: c,
            time_ms: run.time_ms,
            batch_seed: run.seed,
            index: index as u64,
        };
        let result = if run.runs_service {
            self.run(req, &ctx)
        } else {
            Vec::new()
        };
        self.record(
            c,
            LastReply {
                timestamp: req.timestamp,
                result,
            },
        );
        Step::Ran { index }
    }
}
