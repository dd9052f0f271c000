//! Prime's proposals (ADR 0009 step 5; spec prime.md §3): what agreement asks of an ordering
//! protocol, answered by Prime's component. Clients' requests are pre-ordered by the replica
//! they came to, the leader proposes summary matrices (each row signed by its replica with
//! its order key in force), and a committed matrix runs what it made eligible once every
//! PO-REQUEST it needs is held here; executing it forgets its PO-REQUESTs and pushes certified
//! copies to the replicas not known to hold them.

use super::*;
use crate::agreement::proposals::{Eligible, Followup, Host, Proposals};

impl Proposals for PrimeSide {
    fn leader_batches(&self) -> bool {
        false
    }

    /// Prime proposes summary matrices and nothing else: their requests are derived when
    /// they execute.
    fn well_formed(&self, batch: &Batch, beside: usize) -> bool {
        batch.matrix.is_some() && beside == 0 && batch.requests.is_empty()
    }

    fn signed_validly(&self, batch: &Batch, installed: KeyOf<'_>) -> bool {
        batch
            .matrix
            .as_ref()
            .is_none_or(|m| self.matrix_valid(m, installed))
    }

    /// Its matrix answers our summaries. What it answers is read from the matrix as the
    /// ordinal will count it ([`PrimeSide::counted`]): a row of an incarnation a recovery
    /// retired passes unchecked in a proposal, and taken as it stands, a leader's made-up old
    /// rows claiming everything closed every challenge and stopped our summaries for good, in
    /// every later view (second review, G2).
    fn accepted(&mut self, batch: &Batch, host: &Host<'_>) {
        let Some(m) = batch.matrix.as_ref() else {
            return;
        };
        let counted = if self.trusts_retired_rows() {
            (**m).clone()
        } else {
            self.counted(m, host.installed)
        };
        let own = m
            .rows
            .get(self.me as usize)
            .and_then(|r| r.as_ref())
            .map(|r| &r.row);
        self.proposal_accepted(&counted, own, host.now);
    }

    /// What ran here before a restart runs the same again (see
    /// [`Proposals::keep_journaled`]); otherwise what the matrix makes eligible after what
    /// the state executed, or `Err` with the missing PO-REQUESTs asked for (rate-limited).
    fn runs(
        &mut self,
        seq: Seq,
        digest: &Digest,
        batch: &Batch,
        host: &Host<'_>,
    ) -> Result<Option<Eligible>, ()> {
        if let Some(j) = self.journaled(seq, digest, host.executed) {
            return Ok(Some(Eligible::as_journaled(batch, &j.requests, &j.after)));
        }
        let before = padded(host.eligible, self.cfg.n() as usize);
        let Some(m) = batch.matrix.as_ref() else {
            // Cannot be prepared by 2f+1 replicas checking shapes: runs nothing.
            return Ok(Some(Eligible {
                run: derived(batch, Vec::new()),
                after: before,
            }));
        };
        let m = &self.counted(m, host.installed);
        match self.derive(m, &before) {
            Ok(d) => Ok(Some(Eligible {
                run: derived(batch, d.requests),
                after: d.after,
            })),
            Err(holes) => {
                self.ask_for(holes, true, host.now, host.replaying);
                Err(())
            }
        }
    }

    fn fence(&mut self, after: &[Seq]) -> Vec<Seq> {
        PrimeSide::fence(self, after)
    }

    /// Its PO-REQUESTs are forgotten; the designated senders push certified copies to the
    /// replicas not known to hold them (reconciliation), after the leader, whose proposal
    /// slot freed, had its chance to propose.
    fn ran(
        &mut self,
        batch: &Batch,
        before: &[Seq],
        after: &[Seq],
        fenced: &[Seq],
        host: &Host<'_>,
    ) -> Option<Followup> {
        let n = self.cfg.n() as usize;
        let counted = batch
            .matrix
            .as_ref()
            .map(|m| self.counted(m, host.installed));
        let copies = self.executed(counted.as_ref(), &padded(before, n), after, fenced);
        (!host.replaying).then_some(Followup { copies })
    }

    fn follow_up(&mut self, f: Followup) {
        self.push(f.copies);
    }

    fn recovered(&mut self, r: ReplicaId) {
        PrimeSide::recovered(self, r)
    }

    fn order_keys(&self) -> bool {
        true
    }

    fn refresh_incarnations(&mut self, installed: KeyOf<'_>) -> bool {
        PrimeSide::refresh_incarnations(self, installed)
    }

    /// Certified copies of what ran are kept until a checkpoint covering them is stable.
    fn checkpoint(&mut self, seq: Seq, eligible: &[Seq]) {
        self.at_checkpoint.insert(seq, eligible.to_vec());
    }

    /// The certified copies of what checkpoint `seq` covers go.
    fn stable(&mut self, seq: Seq) {
        let n = self.cfg.n() as usize;
        if let Some(e) = self.at_checkpoint.remove(&seq) {
            self.po.forget_through(&padded(&e, n));
        }
        self.at_checkpoint = self.at_checkpoint.split_off(&seq);
    }

    /// Pre-ordering forgets what the state executed; the journal learns the eligibility.
    fn sync(&mut self, eligible: &[Seq]) -> bool {
        let e = padded(eligible, self.cfg.n() as usize);
        self.po.executed_through(&e);
        self.po.forget_through(&e);
        for (s, x) in self.summarized.iter_mut().zip(&e) {
            *s = (*s).max(*x);
        }
        true
    }

    /// Executing an ordinal again needs the PO-REQUESTs its matrix names, and after a
    /// restart we may hold none of them (the copies of others' requests are not journaled)
    /// while no peer can send them: a peer answers only with certified copies it holds, and
    /// those it had were restarted away too (simulator seed 8,121 of `--ordering prime`: a
    /// whole-cluster restart, two replicas' replays stopped by a key holder that failed, the
    /// cluster halted). So the journal's record of it is kept and runs instead.
    fn keep_journaled(&mut self, seq: Seq, run: JournaledRun) {
        self.journaled.insert(seq, run);
    }

    /// Our own PO-REQUESTs not yet run (held again, and resent by the retransmission), the
    /// others' we accepted, our acknowledgements, and the order keys we drew.
    fn restore(&mut self, records: &[Record]) {
        for x in records {
            match x {
                Record::OrderKey { seed } => {
                    self.keys.remember_drawn(HolderSecrets::from_seed(seed))
                }
                Record::Introduced { request } => self.po.restore_own(request.clone()),
                Record::Held { request } => self.po.restore_held(request.clone()),
                Record::Acked { parts } => self.po.restore_acks(parts),
                Record::Certified { parts } => self.po.restore_certified(parts),
                _ => {}
            }
        }
    }

    /// Suspect-Leader measures the leader of the view in force from now.
    fn view(&mut self, v: View, changing: bool, now: u64) {
        self.leave.entered(v);
        if changing {
            self.sus.reset(v, true, now);
        } else {
            if self.sus.view() != v {
                self.sus.reset(v, false, now);
            }
            self.sus.view_installed(now);
        }
        self.timers.proposal_ms = now;
    }

    /// Acknowledgements and offered copies towards PO certificates not yet formed go.
    fn keys_changed(&mut self) {
        self.po.drop_uncertified_votes();
    }

    /// Pre-ordering as the journal gave it back is not trusted, nor our last row.
    fn forget(&mut self, own: bool) {
        self.po.forget_all();
        #[cfg(feature = "mutants")]
        if own {
            self.po.forget_own_acks();
        }
        let _ = own;
        self.row = None;
    }

    fn take_outs(&mut self) -> Vec<Out> {
        std::mem::take(&mut self.outs)
    }

    fn prime(&self) -> Option<&PrimeSide> {
        Some(self)
    }

    fn prime_mut(&mut self) -> Option<&mut PrimeSide> {
        Some(self)
    }
}
