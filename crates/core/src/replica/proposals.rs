//! The replica's side of the ordering interface ([`crate::agreement::proposals`]): what it
//! tells its [`Proposals`] and asks of it, with what the replica around it knows (a
//! [`Host`]), and what it does with the answers: their sends and records, in order.

use super::*;
use crate::agreement::proposals::{Eligible, KeyOf, Out};

/// What the proposals' rules read of the replica: the execution state `exec` and the
/// replica's clock and replay flag.
fn host<'a, S: Service>(
    exec: &'a Execution<S>,
    now: u64,
    replaying: bool,
    installed: KeyOf<'a>,
) -> Host<'a> {
    Host {
        now,
        replaying,
        executed: exec.last_executed(),
        eligible: exec.eligible(),
        installed,
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Does what the proposals' rules returned, in order.
    pub(super) fn apply_proposals(&mut self) {
        for o in self.proposals.take_outs() {
            match o {
                Out::Broadcast(m) => self.broadcast(&m),
                Out::Send(to, m) => self.send_replica(to, &m),
                Out::Persist(r) => self.persist(r),
            }
        }
    }

    /// A proposal of the current view was accepted here (pre-prepared, or proposed by us).
    pub(super) fn proposal_accepted(&mut self, batch: &Batch) {
        let (now, replaying, exec) = (self.now(), self.out.replaying, &self.exec);
        let installed = |j| installed_key(exec, j);
        self.proposals
            .accepted(batch, &host(exec, now, replaying, &installed));
    }

    /// What the committed proposal `batch` at `seq` runs: `Some(None)` itself, `Some(Some)`
    /// what it made eligible, `None` not yet (asked for what is missing).
    pub(super) fn proposal_runs(
        &mut self,
        seq: Seq,
        digest: &Digest,
        batch: &Batch,
    ) -> Option<Option<Eligible>> {
        let (now, replaying, exec) = (self.now(), self.out.replaying, &self.exec);
        let installed = |j| installed_key(exec, j);
        let runs = self
            .proposals
            .runs(seq, digest, batch, &host(exec, now, replaying, &installed));
        match runs {
            Ok(e) => Some(e),
            Err(()) => {
                self.apply_proposals();
                None
            }
        }
    }

    /// The committed proposal `batch` ran (eligibility `before` to `after`, `fenced` with
    /// recovered replicas' fences): the leader may propose again, then what follows goes.
    pub(super) fn proposal_ran(
        &mut self,
        batch: &Batch,
        before: &[Seq],
        after: &[Seq],
        fenced: &[Seq],
    ) {
        let (now, replaying, exec) = (self.now(), self.out.replaying, &self.exec);
        let installed = |j| installed_key(exec, j);
        let followup = self.proposals.ran(
            batch,
            before,
            after,
            fenced,
            &host(exec, now, replaying, &installed),
        );
        if let Some(f) = followup {
            // A proposal slot freed: the leader orders what waits.
            self.leader_may_propose();
            self.proposals.follow_up(f);
            self.apply_proposals();
        }
    }

    /// A view change to `v` began (`changing`), or view `v` was installed.
    pub(super) fn proposals_view(&mut self, v: View, changing: bool) {
        let now = self.now();
        self.proposals.view(v, changing, now);
    }

    /// The state jumped (a fetched checkpoint, or a restart): the proposals' rules learn the
    /// eligibility it holds, and order keys its recoveries installed. True if the journal
    /// must learn the eligibility.
    pub(super) fn sync_proposals(&mut self) -> bool {
        let journal = self.proposals.sync(self.exec.eligible());
        // The state may have run recoveries we did not.
        self.refresh_incarnations();
        journal
    }

    /// Some replica's order key may have changed (a recovery request ran here, a state was
    /// fetched, or the journal replayed).
    pub(super) fn refresh_incarnations(&mut self) {
        let exec = &self.exec;
        if self
            .proposals
            .refresh_incarnations(&|j| installed_key(exec, j))
        {
            self.stats.order_keys_installed += 1;
        }
    }
}
