//! Running a committed batch, one request at a time: the per-request rules, once for the
//! co-located replica and the execution node (exactly once per client timestamp, the agreed
//! clock and seed, opening sealed operations, recording the result in the reply table,
//! recovery requests by their rules).
//!
//! Where each result goes (a reply, a firewall bundle, nowhere while replaying) is the
//! caller's: [`Execution::run_batch`] gives back an [`Executed`] value, one [`Step`] per
//! request with its result, and the caller acts on the steps in the batch's order, so
//! replies leave in that order.

use super::recovery::{run_recovery, Recoveries};
use super::{Execution, LastReply};
use crate::message::Batch;
use crate::service::{ExecContext, Service};
use crate::types::{ReplicaId, Seq};

/// What running a batch gave: one step per request, in the batch's order (recovery
/// requests skipped by [`Recoveries::Skip`] have none).
pub(crate) struct Executed {
    pub(crate) steps: Vec<Step>,
}

/// A batch being run.
struct BatchRun {
    seq: Seq,
    time_ms: u64,
    seed: u64,
    next: usize,
    /// Whether the service runs the requests; `false` where this component only keeps the
    /// exactly-once table for batches others execute (the agreement replicas of the
    /// separated deployment), each recorded with an empty result.
    runs_service: bool,
}

/// What became of request `index` of a batch.
pub(crate) enum Step {
    /// It ran (or was only recorded, with an empty result, where the service does not run
    /// here) and gave `result`, now its client's last reply.
    Ran { index: usize, result: Vec<u8> },
    /// It ran before: nothing ran, nothing was recorded. `last` is its result if it is
    /// still its client's last reply (when this step was taken).
    Again { index: usize, last: Option<Vec<u8>> },
    /// It is replica `replica`'s recovery request and ran (see `recovery.rs`), giving
    /// `result` like any other request. If it was `accepted`, the caller acts on what it
    /// means for keys at this place of the batch.
    Recovery {
        index: usize,
        replica: ReplicaId,
        accepted: bool,
        result: Vec<u8>,
    },
}

impl<S: Service> Execution<S> {
    /// Runs `batch` at `seq`, request by request; the agreed clock moves strictly past the
    /// previous batch's. `runs_service` is `false` where this component only keeps the
    /// exactly-once table for batches others execute; `recoveries` says how recovery
    /// requests are treated.
    pub(crate) fn run_batch(
        &mut self,
        seq: Seq,
        batch: &Batch,
        runs_service: bool,
        recoveries: &Recoveries,
    ) -> Executed {
        let time_ms = self.start_batch(batch.nondet.time_ms);
        let mut run = BatchRun {
            seq,
            time_ms,
            seed: batch.nondet.seed,
            next: 0,
            runs_service,
        };
        let mut steps = Vec::with_capacity(batch.requests.len());
        while let Some(step) = self.next_request(&mut run, batch, recoveries) {
            steps.push(step);
        }
        Executed { steps }
    }

    /// Runs the next request of `batch` (the one `run` was begun for); `None` once every
    /// request had its step. Skipped recovery requests have no step.
    fn next_request(
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
                let last = self
                    .last_reply(c)
                    .filter(|l| l.timestamp == req.timestamp)
                    .map(|l| l.result.clone());
                return Some(Step::Again { index, last });
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
            let last = LastReply {
                timestamp,
                result: result.clone(),
            };
            self.record(c, last);
            return Some(Step::Recovery {
                index,
                replica,
                accepted,
                result,
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
        let last = LastReply {
            timestamp: req.timestamp,
            result: result.clone(),
        };
        self.record(c, last);
        Step::Ran { index, result }
    }
}
