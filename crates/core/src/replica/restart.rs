//! Restart from the journal: a replica rebuilt from the records its host made durable (see
//! [`crate::journal`]) never contradicts what it said before the crash.

use super::execute::Committed;
use super::*;
use crate::agreement::proposals::Eligible;
use crate::prime::side::JournaledRun;

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Rebuilds a replica after a crash from the records its host made durable (see
    /// [`crate::journal`]): the last checkpoint, the batches executed after it (re-executed
    /// silently), the last view entered with its PSet/QSet and view change, and the log of
    /// that view. The result never contradicts what the replica said before the crash.
    ///
    /// The service state comes from `state` (its durable base, at or after the journal's last
    /// checkpoint record). With `check`, every page is first checked against its digest;
    /// corrupt pages make the replica skip re-execution, stop executing and fetch them.
    pub fn restore(
        cfg: Config,
        id: ReplicaId,
        auth: A,
        service: S,
        mut state: PagedState,
        records: &[Record],
        check: bool,
    ) -> Result<Self, String> {
        let corrupt = if check {
            state.check().corrupt.len() as u64
        } else {
            0
        };
        let mut r = Self::from_state(cfg, id, auth, service, state)?;
        if corrupt > 0 {
            r.stats.corrupt_pages_found += corrupt;
            r.exec.set_diverged(true);
        }
        if let Some(Record::Checkpoint { seq, digest }) = records
            .iter()
            .rev()
            .find(|x| matches!(x, Record::Checkpoint { .. }))
        {
            if *seq > r.ordering.ckpt_votes.stable_seq() && !r.exec.diverged() {
                // The state's base is behind a checkpoint the journal recorded: a crash
                // between a recovery relabelling a distrusted state as checkpoint 0 (a state
                // commit) and its journal record, or a journal rewritten while compromised.
                // Execute nothing on this state; fetch a vouched checkpoint.
                r.stats.state_unreadable += 1;
                r.unreadable.get_or_insert_with(|| {
                    format!(
                        "the journal names checkpoint {seq} but the state's base is {}",
                        r.ordering.ckpt_votes.stable_seq()
                    )
                });
                r.exec.set_diverged(true);
            }
            if *seq == r.ordering.ckpt_votes.stable_seq()
                && *digest != r.ordering.ckpt_votes.stable_digest()
                && !r.exec.diverged()
            {
                // The tree file does not describe the checkpoint the journal recorded.
                r.exec.set_diverged(true);
            }
        }
        let h = r.ordering.ckpt_votes.stable_seq();
        r.out.replaying = true;
        r.replay_executed(records, h);
        r.out.replaying = false;
        // Prime: our own PO-REQUESTs that had not run are held again (and sent again by
        // the retransmission), and our numbering continues after the last.
        r.proposals.restore(records);
        r.refresh_incarnations();
        r.out.effects.clear();
        // Checkpoints the replay made stable move the base here, at start-up, not by effects.
        r.exec
            .state_mut()
            .write_commits()
            .map_err(|e| format!("page store commit failed: {e}"))?;
        if let Some(reason) = r.unreadable.take() {
            let seq = r.exec.state().base_seq();
            r.event(Event::StateUnreadable { seq, reason });
        }
        if corrupt > 0 {
            r.event(Event::StateCorrupt { pages: corrupt });
        }
        r.restore_view(records, h);
        // Prime: Suspect-Leader measures the leader of the view the journal gave back, not
        // of view 0 (its messages for another view count nowhere, and with a faulty replica
        // a slow leader was then never replaced by 2f+1 suspicions).
        r.proposals_view(r.views.view, !r.views.normal);
        r.restore_log(records, h);
        // A watermark above the checkpoint the state holds: report it, and fetch it, again.
        if let Some(Record::Watermark { seq, digest }) = records
            .iter()
            .rev()
            .find(|x| matches!(x, Record::Watermark { .. }))
        {
            if *seq > r.ordering.ckpt_votes.stable_seq() {
                r.adopt_watermark(*seq, *digest);
            }
        }
        r.gc_batches();
        Ok(r)
    }

    /// Re-executes, silently, the batches the journal says were executed after checkpoint `h`.
    fn replay_executed(&mut self, records: &[Record], h: Seq) {
        // Re-execute what was executed after the checkpoint, in order, without side effects;
        // a body not in the execution record is in a pre-prepare record.
        let bodies: BTreeMap<(Seq, Digest), &Arc<Batch>> = records
            .iter()
            .filter_map(|x| match x {
                Record::PrePrepared {
                    seq,
                    digest,
                    batch: Some(b),
                    ..
                } if *seq > h => Some(((*seq, *digest), b)),
                _ => None,
            })
            .collect();
        let mut executed: BTreeMap<Seq, Option<Arc<Batch>>> = BTreeMap::new();
        for x in records {
            if let Record::Executed { seq, digest, batch } = x {
                if *seq > h {
                    let body = batch
                        .clone()
                        .or_else(|| bodies.get(&(*seq, *digest)).map(|b| (*b).clone()));
                    if body.is_none() && *digest != NULL_DIGEST {
                        // Cannot happen with a journal compacted by `journal::compact`:
                        // stop here, the state transfer fetches the rest.
                        break;
                    }
                    executed.insert(*seq, body);
                }
            }
        }
        let ran: BTreeMap<Seq, (Vec<Seq>, Vec<SignedRequest>)> = records
            .iter()
            .filter_map(|x| match x {
                Record::Ran {
                    seq,
                    eligible,
                    requests,
                } if *seq > h => Some((*seq, (eligible.clone(), requests.clone()))),
                _ => None,
            })
            .collect();
        let until = executed.keys().next_back().copied().unwrap_or(0);
        if let Some(q) = self.sink.queue_mut() {
            q.replaying_until(until);
        }
        for (&seq, batch) in &executed {
            if self.exec.diverged() || self.sink.waiting() {
                // Diverged: fetched instead. Waiting (separated deployment): the rest runs
                // once the execution cluster acknowledged the checkpoint, from the log.
                break;
            }
            if seq != self.exec.last_executed() + 1 {
                break;
            }
            // The digest is recomputed: the journal's checksums catch torn writes, not lies.
            let batch = batch.clone();
            let digest = batch.as_ref().map_or(NULL_DIGEST, |b| b.digest());
            let eligible = match batch.as_ref().filter(|b| b.matrix.is_some()) {
                // Prime: what the matrix made eligible, as recorded when it ran.
                Some(b) => {
                    let Some((after, requests)) = ran.get(&seq) else {
                        break;
                    };
                    Some(Eligible::as_journaled(b, requests, after))
                }
                None => None,
            };
            let c = Committed {
                seq,
                digest,
                batch,
                eligible,
            };
            if c.runs().is_some_and(|b| !self.learn_sessions(b)) {
                break; // the key holder failed: the rest is fetched
            }
            self.execute_committed(c);
        }
        // Prime: what the replay did not reach runs the same once the key holder answers.
        let last = self.exec.last_executed();
        for (&seq, batch) in executed.range(last + 1..) {
            let (Some(b), Some((after, requests))) = (batch, ran.get(&seq)) else {
                continue;
            };
            if b.matrix.is_some() {
                let run = JournaledRun {
                    digest: b.digest(),
                    requests: requests.clone(),
                    after: after.clone(),
                };
                self.proposals.keep_journaled(seq, run);
            }
        }
    }

    /// The last view entered, with its PSet, QSet, doubted slots and our VIEW-CHANGE.
    fn restore_view(&mut self, records: &[Record], h: Seq) {
        if let Some(Record::View {
            view,
            normal,
            vc,
            pset,
            qset,
            batches,
            doubted,
        }) = records
            .iter()
            .rev()
            .find(|x| matches!(x, Record::View { .. }))
        {
            // A journal is not trusted beyond the view limit; a recovery's view estimate
            // corrects any other view a tampered journal names.
            self.views.view = (*view).min(crate::types::VIEW_LIMIT);
            self.views.normal = *normal;
            if *normal {
                self.views.installed = self.views.view;
            }
            // The NEW-VIEW it entered this view on (recorded after the view record).
            let view = self.views.view;
            self.views.entered_on = records
                .iter()
                .rev()
                .take_while(|x| !matches!(x, Record::View { .. }))
                .find_map(|x| match x {
                    Record::Entered { view: v, new_view } if *v == view && *normal => {
                        Some((*v, *new_view))
                    }
                    _ => None,
                });
            for b in batches {
                self.ordering
                    .order
                    .batches
                    .insert(b.digest(), Arc::new(b.clone()));
            }
            self.views.claims.restore(pset, qset, doubted, h);
            self.views.mine = vc.as_ref().map(|m| (m.clone(), m.digest()));
        }
    }

    /// The log of the view entered last: pre-prepares, prepared slots, what committed.
    fn restore_log(&mut self, records: &[Record], h: Seq) {
        let primary = self.is_primary();
        // Only the log window above the stable checkpoint: records beyond it
        // come from a journal ahead of the state (relabelled by a recovery, or rewritten
        // while compromised), and such a replica fetches a vouched checkpoint before it takes
        // part again (simulator seed 8891: a slot 29 in a window (0, 8]).
        let top = self
            .ordering
            .ckpt_votes
            .stable_seq()
            .saturating_add(self.cfg.log_size);
        let window = |seq: Seq| seq > h && seq <= top;
        for x in records {
            match x {
                Record::PrePrepared {
                    view,
                    seq,
                    digest,
                    batch,
                    vouched,
                } if *view == self.views.view && window(*seq) => {
                    if let Some(b) = batch {
                        self.ordering.order.batches.insert(*digest, b.clone());
                        // Kept by compaction until the next view or checkpoint record.
                        self.ordering.order.bodies_journaled.insert((*seq, *digest));
                    }
                    let slot = self.ordering.order.log.slot(*seq);
                    slot.pp = Some(*digest);
                    if primary {
                        slot.proposed_here = batch.is_some();
                    } else if *vouched {
                        slot.sent_prepare = true;
                        slot.prepares.insert(self.id, *digest);
                    }
                }
                Record::Prepared { view, seq, digest }
                    if *view == self.views.view && window(*seq) =>
                {
                    let slot = self.ordering.order.log.slot(*seq);
                    if slot.pp == Some(*digest) {
                        slot.prepared = true;
                        slot.sent_commit = true;
                        slot.commits.insert(self.id, *digest);
                    }
                }
                _ => {}
            }
        }
        for (n, slot) in self.ordering.order.log.iter_mut() {
            if *n <= self.exec.last_executed() && slot.prepared {
                slot.committed = true;
            }
        }
        if let Some(last) = self.ordering.order.log.keys().next_back() {
            self.ordering.proposing.next_seq = self.ordering.proposing.next_seq.max(last + 1);
        }
        self.ordering.proposing.next_seq = self
            .ordering
            .proposing
            .next_seq
            .max(self.exec.last_executed() + 1);
    }
}
