//! The view change of BFT-PR (§4.3): leaving a view, VIEW-CHANGE and acks, the new
//! primary's decision (`crate::viewchange`), checking and installing a NEW-VIEW.

use super::*;

impl<S: Service, A: KeyTable> Replica<S, A> {
    // ----- view change ------------------------------------------------------------------------

    pub(super) fn slot_summaries(&self) -> BTreeMap<Seq, SlotSummary> {
        let primary = self.is_primary();
        self.ordering
            .order
            .log
            .iter()
            .filter(|(_, s)| s.pp.is_some())
            .map(|(n, s)| {
                // Pre-prepared for the view change only if we vouched for every request.
                let pre = s.vouched_by(self.id) || (primary && s.pp.is_some());
                (
                    *n,
                    SlotSummary {
                        prepared: if s.prepared { s.pp } else { None },
                        preprepared: if pre { s.pp } else { None },
                    },
                )
            })
            .collect()
    }

    /// Sends VIEW-CHANGE for `v` and enters it (not yet active).
    pub(super) fn start_view_change(&mut self, v: View, cause: ViewChangeCause) {
        debug_assert!(v > self.views.view || (v == self.views.view && self.views.normal));
        if v <= self.views.view && !self.views.normal {
            return;
        }
        // A batch executed tentatively may not survive into the new view: undo it now; if
        // the new view keeps it, it executes again when it commits there.
        self.undo_tentative();
        // P and Q from the log of the view we leave (only meaningful if we were active in it).
        let slots = if self.views.normal {
            self.slot_summaries()
        } else {
            BTreeMap::new()
        };
        if self.views.normal {
            self.suspect_doubted_clients();
        }
        let mut doubted = Vec::new();
        if self.views.normal && !self.is_primary() {
            let me = self.id;
            for (n, s) in &self.ordering.order.log {
                if let Some(d) = s.pp.filter(|d| *d != NULL_DIGEST) {
                    if s.sent_prepare && s.doubts.contains_key(&me) {
                        doubted.push((*n, d));
                    }
                }
            }
        }
        self.views.claims.leave(
            self.views.view,
            self.ordering.ckpt_votes.stable_seq(),
            &slots,
            doubted,
        );
        self.ordering.order.log.clear();
        let (pw, qw) = self.views.claims.wire();
        let vc = ViewChange {
            view: v,
            replica: self.id,
            ls: self.ordering.ckpt_votes.stable_seq(),
            checkpoints: self
                .exec
                .own_checkpoints_from(self.ordering.ckpt_votes.stable_seq()),
            p: pw,
            q: qw,
        };
        let digest = vc.digest();
        self.views.view = v;
        self.views.normal = false;
        self.stats.view_changes += 1;
        self.views.timer.left_view();
        self.requests.timer = None;
        if self.proposals.leader_batches() {
            // Prime's requests stay in their PO-REQUESTs across views.
            self.requests.pool.clear_inflight();
        }
        self.ordering.order.pending_pp.clear();
        self.views.pending_nv = None;
        self.views.new_view = None;
        self.views.decision_missing.clear();
        // Keep the previous view's messages too: lagging replicas may still need them relayed.
        self.views.store.enter(v);
        self.views.prev = self.views.mine.take();
        self.views.mine = Some((vc.clone(), digest));
        let (pset, qset) = self.views.claims.wire();
        let batches = self.pset_batches();
        self.persist(Record::View {
            view: v,
            normal: false,
            vc: Some(vc.clone()),
            pset,
            qset,
            batches,
            doubted: self.views.claims.doubted_wire(),
        });
        self.event(Event::ViewChangeStarted { view: v, cause });
        self.proposals_view(v, true);
        self.broadcast(&Message::from(vc));
        // Vouch now for the view changes of this view we stored before entering it.
        let p = self.cfg.primary(v);
        if p != self.id {
            let acks: Vec<ViewChangeAck> = self
                .views
                .store
                .for_view(v)
                .filter(|(r, _, _)| *r != p)
                .map(|(r, _, d)| ViewChangeAck {
                    view: v,
                    acker: self.id,
                    sender: r,
                    digest: d,
                })
                .collect();
            for a in acks {
                self.send_replica(p, &Message::from(a));
            }
        }
        self.gc_batches();
        self.after_vc_update();
    }

    pub(super) fn on_view_change(&mut self, from: ReplicaId, vc: ViewChange) -> Result<(), Reject> {
        if vc.replica != from || from == self.id {
            return Err(Reject::Inconsistent);
        }
        viewchange::validate(
            &vc,
            self.cfg.f,
            self.cfg.checkpoint_interval,
            self.cfg.log_size,
        )
        .map_err(|_| Reject::Inconsistent)?;
        if vc.view < self.views.view || (vc.view == self.views.view && self.views.normal) {
            return Err(Reject::Stale);
        }
        if vc.view > self.views.view + VC_VIEWS_AHEAD {
            // Too far ahead to keep the message (a faulty replica could plant messages for
            // views we may reach much later): only the sender's claim to be at that view
            // counts, for the f+1 join rule. Once we join, its VIEW-CHANGE comes again.
            self.views.store.claim(from, vc.view);
            self.after_vc_update();
            return Err(Reject::OutOfWindow);
        }
        let digest = vc.digest();
        let view = vc.view;
        if self.views.store.store(vc, digest, self.views.view) == Stored::Conflict {
            return Err(Reject::Conflict); // the first stands
        }
        // Vouch for it to the primary of its view, but only for the next view at most: acks
        // for views we may never enter would only fill the primary's bounded ack store.
        let p = self.cfg.primary(view);
        if p != from && p != self.id && view <= self.views.view.saturating_add(1) {
            let ack = Message::from(ViewChangeAck {
                view,
                acker: self.id,
                sender: from,
                digest,
            });
            self.send_replica(p, &ack);
        }
        // A primary stepping down hands over at once.
        if self.views.normal && from == self.primary() && view == self.views.view.saturating_add(1)
        {
            self.start_view_change(view, ViewChangeCause::PrimarySteppedDown);
            return Ok(());
        }
        self.after_vc_update();
        Ok(())
    }

    /// Re-evaluates the join rule, the view-change timer and pending decisions after the set of
    /// view-change messages changed.
    pub(super) fn after_vc_update(&mut self) {
        let others = self.views.store.highest_views();
        let join_f = if self.mutant("join-at-f") {
            self.cfg.f.saturating_sub(1)
        } else {
            self.cfg.f
        };
        if let Some(v) = quorum::join_view(join_f, self.views.view, &others) {
            if v > self.views.view {
                self.start_view_change(v, ViewChangeCause::JoinedOthers);
                return;
            }
        }
        if !self.views.normal {
            // Replicas that left this view's predecessors: a VIEW-CHANGE for this view, or for
            // a later one (a replica whose timer for this view expired already, and who no
            // longer retransmits its VIEW-CHANGE for it). Counting only this view's left two
            // correct replicas waiting for a third that had moved on (simulator seed 10294
            // with --quiet-primary: a silent replica, one VIEW-CHANGE lost).
            let count = 1 + others.values().filter(|v| **v >= self.views.view).count();
            if count >= self.cfg.quorum() && self.views.timer.deadline_ms.is_none() {
                self.views.timer.deadline_ms = Some(self.now() + self.views.timer.timeout_ms());
            }
            if self.is_primary() {
                self.try_new_view();
            } else {
                self.try_accept_new_view();
            }
        }
    }

    pub(super) fn on_ack(&mut self, from: ReplicaId, ack: ViewChangeAck) -> Result<(), Reject> {
        if ack.acker != from || ack.sender == from {
            return Err(Reject::Inconsistent);
        }
        // Acks may arrive before this replica enters their view; keep them (bounded).
        if ack.view < self.views.view || (ack.view == self.views.view && self.views.normal) {
            return Err(Reject::Stale);
        }
        if ack.view > self.views.view.saturating_add(1) {
            return Err(Reject::OutOfWindow);
        }
        // Acks for our own VIEW-CHANGE are kept only when we hold none (after a recovery's
        // view estimate): then it comes relayed, with them.
        if (ack.sender == self.id && self.views.mine.is_some()) || ack.sender >= self.cfg.n() {
            return Ok(());
        }
        // Each acker may hold a bounded number of entries, so a faulty one cannot crowd out
        // the acks of correct replicas.
        if !self.views.store.ack(ack.view, ack.sender, ack.digest, from) {
            return Err(Reject::TooLarge);
        }
        if ack.view == self.views.view {
            if self.is_primary() {
                self.try_new_view();
            } else {
                self.try_accept_new_view();
            }
        }
        Ok(())
    }

    /// Acks for `sender`'s VIEW-CHANGE with `digest` in our view, from replicas other than
    /// ourselves, the sender, and `also_excluded`.
    pub(super) fn ack_count(
        &self,
        sender: ReplicaId,
        digest: &Digest,
        also_excluded: Option<ReplicaId>,
    ) -> usize {
        self.views
            .store
            .ackers(self.views.view, sender, digest)
            .into_iter()
            .filter(|a| *a != self.id && *a != sender && Some(*a) != also_excluded)
            .count()
    }

    /// The new primary: S, then the decision procedure, then NEW-VIEW.
    pub(super) fn try_new_view(&mut self) {
        if self.views.normal || !self.is_primary() {
            return;
        }
        let Some((mine, my_digest)) = self.views.mine.clone() else {
            return;
        };
        let need_acks = if self.mutant("acks-at-zero") {
            0
        } else {
            2 * self.cfg.f as usize - 1
        };
        let mut s: Vec<(ReplicaId, Digest, ViewChange)> = vec![(self.id, my_digest, mine)];
        for (r, m, d) in self.views.store.for_view(self.views.view) {
            if self.ack_count(r, &d, None) >= need_acks {
                s.push((r, d, m.clone()));
            }
        }
        if s.len() < self.cfg.quorum() {
            return;
        }
        let refs: Vec<&ViewChange> = s.iter().map(|(_, _, m)| m).collect();
        let batches = &self.ordering.order.batches;
        let outcome = viewchange::decide(
            self.cfg.f,
            self.cfg.log_size,
            &refs,
            |d| batches.contains_key(d),
            self.broken_decision(),
        );
        match outcome {
            Ok(dec) => {
                let bodies = self.bodies_within_budget(&dec.chosen, self.cfg.message_bytes_max / 2);
                let nv = NewView {
                    view: self.views.view,
                    vcs: s.iter().map(|(r, d, _)| (*r, *d)).collect(),
                    checkpoint: dec.checkpoint,
                    chosen: dec.chosen,
                    batches: bodies,
                };
                self.broadcast(&Message::from(nv.clone()));
                let now = self.now();
                let others = (0..self.cfg.n()).filter(|r| *r != self.id);
                self.views
                    .new_view_sent
                    .sent_to_all(others, self.views.view, now);
                self.install_new_view(nv);
            }
            Err(Pending::NeedBatches(ds)) => self.views.decision_missing = ds,
            Err(_) => {}
        }
    }

    /// The decision procedure's deliberately broken variants, under the simulator's mutants.
    pub(super) fn broken_decision(&self) -> viewchange::Broken {
        #[cfg(feature = "mutants")]
        {
            use crate::types::Mutant;
            let m = self.cfg.mutant;
            viewchange::Broken {
                any_prepared: m == Mutant::ViewChangeAnyPrepared,
                no_a2: m == Mutant::NoA2,
                null_at_2f: m == Mutant::NullAt2f,
                checkpoint_at_f: m == Mutant::CheckpointAtF,
            }
        }
        #[cfg(not(feature = "mutants"))]
        viewchange::Broken::default()
    }

    /// Whether the simulator's mutant `m` is on.
    #[allow(unused_variables)]
    pub(super) fn mutant(&self, m: &str) -> bool {
        #[cfg(feature = "mutants")]
        return crate::types::Mutant::ALL
            .iter()
            .any(|(name, x)| *name == m && *x == self.cfg.mutant);
        #[cfg(not(feature = "mutants"))]
        false
    }

    pub(super) fn on_new_view(&mut self, from: ReplicaId, nv: NewView) -> Result<(), Reject> {
        if from != self.cfg.primary(nv.view) || from == self.id {
            return Err(Reject::Inconsistent);
        }
        if nv.view < self.views.view || (nv.view == self.views.view && self.views.normal) {
            return Err(Reject::Stale);
        }
        let mut ids: Vec<ReplicaId> = nv.vcs.iter().map(|(r, _)| *r).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != nv.vcs.len()
            || nv.vcs.len() < self.cfg.quorum()
            || ids.iter().any(|r| *r >= self.cfg.n())
            || nv.chosen.len() as u64 > self.cfg.log_size
            || !nv.checkpoint.0.is_multiple_of(self.cfg.checkpoint_interval)
            || nv.batches.len() > nv.chosen.len()
        {
            return Err(Reject::Inconsistent);
        }
        if nv.view > self.views.view {
            // A NEW-VIEW alone never moves us: a faulty primary of any future view could send
            // one. We enter a view by our timer or the f+1 rule; its primary then retransmits
            // the NEW-VIEW in answer to our status.
            return Err(Reject::OutOfWindow);
        }
        if self.views.pending_nv.is_some() {
            return Ok(()); // the first NEW-VIEW for a view is the one we check
        }
        let chosen: BTreeSet<Digest> = nv.chosen.iter().copied().collect();
        for b in &nv.batches {
            let d = b.digest();
            if chosen.contains(&d) {
                self.ordering.order.batches.insert(d, Arc::new(b.clone()));
            }
        }
        let mut nv = nv;
        nv.batches.clear();
        self.views.pending_nv = Some(nv);
        self.views.pending_nv_since_ms = self.now();
        self.try_accept_new_view();
        self.try_adopt_new_view();
        Ok(())
    }

    /// The view-change messages a pending NEW-VIEW names, or the pairs still missing.
    pub(super) fn gather_nv_vcs(
        &self,
        nv: &NewView,
    ) -> Result<Vec<ViewChange>, Vec<(ReplicaId, Digest)>> {
        let mut found = Vec::new();
        let mut missing = Vec::new();
        for (r, d) in &nv.vcs {
            if *r == self.id && self.views.mine.is_some() {
                match &self.views.mine {
                    Some((m, md)) if md == d => found.push(m.clone()),
                    _ => missing.push((*r, *d)),
                }
                continue;
            }
            match self.views.store.get(*r, nv.view) {
                Some((m, md)) if md == d => found.push(m.clone()),
                _ => match self.views.store.relayed(*r, d) {
                    // f acks from replicas other than the sender and the new primary (whose
                    // NEW-VIEW is already its vouch): with the primary's, f+1 vouchers.
                    Some(m)
                        if self.mutant("acks-at-zero")
                            || self.ack_count(*r, d, Some(self.cfg.primary(nv.view)))
                                >= self.cfg.f as usize =>
                    {
                        found.push(m.clone())
                    }
                    _ => missing.push((*r, *d)),
                },
            }
        }
        if missing.is_empty() {
            Ok(found)
        } else {
            Err(missing)
        }
    }

    pub(super) fn try_accept_new_view(&mut self) {
        let Some(nv) = self.views.pending_nv.clone() else {
            return;
        };
        if self.views.normal || nv.view != self.views.view {
            return;
        }
        // Our own view change must be named with its true digest if it is named at all
        // (after a recovery's view estimate we hold none: it comes relayed like the others).
        if let Some((_, d)) = nv.vcs.iter().find(|(r, _)| *r == self.id) {
            if self.views.mine.as_ref().is_some_and(|(_, md)| md != d) {
                self.bad_new_view();
                return;
            }
        }
        let vcs = match self.gather_nv_vcs(&nv) {
            Ok(v) => v,
            Err(_) => return, // fetched through status messages
        };
        for m in &vcs {
            if m.view != nv.view
                || viewchange::validate(
                    m,
                    self.cfg.f,
                    self.cfg.checkpoint_interval,
                    self.cfg.log_size,
                )
                .is_err()
            {
                self.bad_new_view();
                return;
            }
        }
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        let outcome = viewchange::decide(
            self.cfg.f,
            self.cfg.log_size,
            &refs,
            |_| true,
            self.broken_decision(),
        );
        match outcome {
            Ok(dec) if dec.checkpoint == nv.checkpoint && dec.chosen == nv.chosen => {
                self.install_new_view(nv);
            }
            _ => self.bad_new_view(),
        }
    }

    /// Enters the view of a pending NEW-VIEW this replica has not been able to check for two
    /// status intervals (a view change it names is gone: sent under keys since retired, or
    /// our own, forgotten in a recovery) once f+1 other replicas report being active in the
    /// view on this very NEW-VIEW (by digest): one of them is correct, and the first correct
    /// replica to enter the view on it checked it (see `reports.rs`). It is then installed
    /// as if checked here.
    pub(super) fn try_adopt_new_view(&mut self) {
        let Some(nv) = self.views.pending_nv.clone() else {
            return;
        };
        if self.views.normal || nv.view != self.views.view {
            return;
        }
        let unchecked = self.mutant("adopt-unchecked-new-view");
        let waited = self.now() >= self.views.pending_nv_since_ms + 2 * self.cfg.status_interval_ms;
        let vouched = self.views.reports.active_in(nv.view, &nv.digest()) >= self.cfg.weak_quorum();
        if !(unchecked || (waited && vouched)) {
            return;
        }
        self.stats.new_views_adopted += 1;
        self.install_new_view(nv);
    }

    /// A replica active in its view that has no NEW-VIEW to report for it (it recovered since
    /// it entered the view, and what its journal said may have been rewritten) reports one
    /// again once f+1 other replicas report being active in the view on it: one of them is
    /// correct, so it is a NEW-VIEW a correct replica accepted, as `try_adopt_new_view`
    /// requires. Without this, a view that outlasts a round of proactive recoveries loses
    /// every voucher, and a replica that cannot check the view's NEW-VIEW lags until the next
    /// view change (simulator seed 12819 with --quiet-primary).
    pub(super) fn vouch_again(&mut self) {
        if !self.views.normal
            || self
                .views
                .entered_on
                .is_some_and(|(v, _)| v == self.views.view)
        {
            return;
        }
        let Some(d) = self
            .views
            .reports
            .vouched(self.views.view, self.cfg.weak_quorum())
        else {
            return;
        };
        self.views.entered_on = Some((self.views.view, d));
        self.persist(Record::Entered {
            view: self.views.view,
            new_view: d,
        });
    }

    /// The NEW-VIEW does not follow from its view changes: the primary is faulty.
    pub(super) fn bad_new_view(&mut self) {
        self.views.pending_nv = None;
        self.event(Event::Rejected {
            from: Principal::Replica(self.primary()),
            kind: "new-view",
            reason: Reject::Inconsistent,
        });
        self.views.timer.back_off();
        self.start_view_change(
            self.views.view.saturating_add(1),
            ViewChangeCause::BadNewView,
        );
    }

    /// Moves the low watermark to checkpoint `h` (`hd`), which this replica does not hold:
    /// what lies at or below it is forgotten, and the checkpoint is fetched if our state is
    /// behind it (or diverged).
    pub(super) fn adopt_watermark(&mut self, h: Seq, hd: Digest) {
        if self.exec.own_checkpoint(h).is_some_and(|d| d != hd) {
            // Our checkpoint at h differs from the one f+1 replicas reported (found by a
            // NEW-VIEW, or again after a restart that re-executed up to it).
            self.event(Event::StateDivergence { seq: h });
            self.exec.forget_checkpoint(h);
            self.on_divergence();
        }
        self.ordering.ckpt_votes.set_stable(h, hd);
        self.exec.forget_executed_through(h);
        self.exec.forget_checkpoints_below(h);
        self.ordering.ckpt_votes.forget_through(h);
        self.ordering.order.log.forget_through(h);
        self.views.claims.forget_through(h);
        if self.ordering.proposing.next_seq <= h {
            self.ordering.proposing.next_seq = h + 1;
        }
        if self.exec.last_executed() < h || self.exec.diverged() {
            self.start_transfer(h, hd, true);
        }
    }

    /// Installs `nv`, checked against its view changes (or vouched for by f+1 replicas active
    /// on it, see `try_adopt_new_view`).
    pub(super) fn install_new_view(&mut self, nv: NewView) {
        let (h, hd) = nv.checkpoint;
        self.views.normal = true;
        self.views.installed = self.views.view;
        self.ordering.proposing.progress_ms = self.now();
        self.views.timer.deadline_ms = None;
        self.views.pending_nv = None;
        self.views.decision_missing.clear();
        if h > self.ordering.ckpt_votes.stable_seq() {
            match self.exec.own_checkpoint(h) {
                Some(d) if d == hd => self.make_stable(h, hd),
                _ => {
                    self.persist(Record::Watermark { seq: h, digest: hd });
                    self.adopt_watermark(h, hd);
                }
            }
        }
        // A correct NEW-VIEW never contradicts what this replica executed: that would mean
        // more than f faults (or a protocol bug). Report it loudly; the simulator fails on it.
        for (i, d) in nv.chosen.iter().enumerate() {
            let n = h + 1 + i as u64;
            if let Some(done) = self.exec.executed_at(n) {
                if done != *d {
                    self.event(Event::Contradiction {
                        seq: n,
                        executed: done,
                        chosen: *d,
                    });
                }
            }
        }
        self.ordering.order.log.clear();
        let primary = self.is_primary();
        let mut prepares = Vec::new();
        for (i, d) in nv.chosen.iter().enumerate() {
            let n = h + 1 + i as u64;
            if n <= self.ordering.ckpt_votes.stable_seq() {
                continue; // already below our low watermark (we fetched a later checkpoint)
            }
            let slot = self.ordering.order.log.slot(n);
            slot.pp = Some(*d);
            if !primary {
                slot.sent_prepare = true;
                slot.prepares.insert(self.id, *d);
                prepares.push((n, *d));
            }
        }
        let (pset, qset) = self.views.claims.wire();
        let batches = self.pset_batches();
        self.persist(Record::View {
            view: self.views.view,
            normal: true,
            vc: self.views.mine.as_ref().map(|(m, _)| m.clone()),
            pset,
            qset,
            batches,
            doubted: self.views.claims.doubted_wire(),
        });
        let installed: Vec<(Seq, Digest)> = self
            .ordering
            .order
            .log
            .iter()
            .filter_map(|(n, slot)| slot.pp.map(|d| (*n, d)))
            .collect();
        for (n, d) in installed {
            let batch = self.ordering.order.batches.get(&d).cloned();
            self.persist(Record::PrePrepared {
                view: self.views.view,
                seq: n,
                digest: d,
                batch,
                vouched: true,
            });
        }
        let last = h + nv.chosen.len() as u64;
        self.ordering.proposing.next_seq = (last + 1).max(self.exec.last_executed() + 1).max(h + 1);
        let entered = nv.digest();
        self.views.entered_on = Some((self.views.view, entered));
        self.persist(Record::Entered {
            view: self.views.view,
            new_view: entered,
        });
        self.views.new_view = Some(nv);
        self.gc_batches();
        self.event(Event::NewViewInstalled {
            view: self.views.view,
        });
        self.proposals_view(self.views.view, false);
        for (n, d) in prepares {
            let id = self.id;
            let view = self.views.view;
            self.broadcast(&Message::from(Prepare {
                view,
                seq: n,
                digest: d,
                replica: id,
                doubts: Vec::new(),
            }));
        }
        let seqs: Vec<Seq> = self.ordering.order.log.keys().copied().collect();
        for n in seqs {
            self.check_slot(n);
        }
        // Requests still waiting go to the new primary; the timer restarts for them.
        if primary {
            self.try_propose();
        } else if !self.proposals.leader_batches() {
            // Prime's requests travel in PO-REQUESTs, not through the leader.
            self.arm_request_timer();
        } else {
            self.relay_waiting();
            self.arm_request_timer();
        }
    }

    pub(super) fn on_relayed_vc(&mut self, _from: ReplicaId, vc: ViewChange) -> Result<(), Reject> {
        let digest = vc.digest();
        let wanted = self
            .views
            .pending_nv
            .as_ref()
            .is_some_and(|nv| nv.vcs.contains(&(vc.replica, digest)));
        if !wanted {
            return Err(Reject::Unexpected);
        }
        self.views.store.relay(vc, digest);
        self.try_accept_new_view();
        Ok(())
    }

    pub(super) fn on_batches(&mut self, bodies: Vec<Batch>) -> Result<(), Reject> {
        let mut wanted: BTreeSet<Digest> = self
            .ordering
            .order
            .log
            .values()
            .filter_map(|s| s.pp)
            .collect();
        wanted.extend(self.views.decision_missing.iter().copied());
        wanted.extend(self.ordering.order.pending_pp.values().map(|p| p.pp.digest));
        wanted.extend(self.views.claims.prepared_digests());
        let mut useful = false;
        for b in bodies {
            let d = b.digest();
            if wanted.contains(&d) && !self.ordering.order.batches.contains_key(&d) {
                self.ordering.order.batches.insert(d, Arc::new(b));
                useful = true;
            }
        }
        if !useful {
            return Err(Reject::Unexpected);
        }
        if !self.ordering.order.pending_pp.is_empty() {
            self.retry_pending();
        }
        self.try_execute();
        if !self.views.normal && self.is_primary() {
            self.try_new_view();
        }
        Ok(())
    }
}
