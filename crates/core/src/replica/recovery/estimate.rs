//! The recovering replica's estimate (BFT-PR §4.4 step 2): QUERY-STABLE and REPLY-STABLE give
//! H_M, above which nothing of the replica's own log, claims, watermark or state is trusted;
//! the views the replies to its recovery request report may move it back to a view the
//! others reached.

use super::*;

impl<S: Service, A: KeyTable> Replica<S, A> {
    pub(super) fn last_checkpoint_seq(&self) -> Seq {
        self.exec.latest_own_checkpoint().unwrap_or(0)
    }

    pub(super) fn last_prepared_seq(&self) -> Seq {
        self.ordering
            .order
            .log
            .iter()
            .rev()
            .find(|(_, s)| s.prepared)
            .map(|(n, _)| *n)
            .unwrap_or(0)
            .max(self.exec.last_executed())
    }

    pub(in crate::replica) fn on_query_stable(
        &mut self,
        from: ReplicaId,
        q: QueryStable,
    ) -> Result<(), Reject> {
        if q.replica != from || from == self.id {
            return Err(Reject::Inconsistent);
        }
        let r = ReplyStable {
            replica: self.id,
            c: self.last_checkpoint_seq(),
            p: self.last_prepared_seq(),
            nonce: q.nonce,
        };
        self.send_replica(from, &Message::from(r));
        Ok(())
    }

    pub(in crate::replica) fn on_reply_stable(
        &mut self,
        from: ReplicaId,
        r: ReplyStable,
    ) -> Result<(), Reject> {
        if r.replica != from || from == self.id {
            return Err(Reject::Inconsistent);
        }
        let Some(rec) = self.recovery.as_mut() else {
            return Err(Reject::Unexpected);
        };
        if rec.phase != Phase::Estimating || r.nonce != rec.nonce {
            return Err(Reject::Stale);
        }
        let c = rec.c_min.entry(from).or_insert(r.c);
        *c = (*c).min(r.c);
        let p = rec.p_max.entry(from).or_insert(r.p);
        *p = (*p).max(r.p);
        self.drive_recovery();
        Ok(())
    }

    /// c_M: the smallest reported checkpoint c_j such that 2f replicas other than j report a
    /// checkpoint at most c_j and f replicas other than j prepared at least c_j.
    pub(super) fn estimate(&self, rec: &Recovery) -> Option<Seq> {
        let f = self.cfg.f as usize;
        let mut c = rec.c_min.clone();
        let mut p = rec.p_max.clone();
        c.insert(self.id, self.last_checkpoint_seq());
        p.insert(self.id, self.last_prepared_seq());
        let mut candidates: Vec<(ReplicaId, Seq)> = c.iter().map(|(r, s)| (*r, *s)).collect();
        candidates.sort_by_key(|(_, s)| *s);
        if self.mutant("estimate-untested") {
            return candidates.first().map(|(_, c)| *c);
        }
        candidates.into_iter().find_map(|(j, cj)| {
            let le = c.iter().filter(|(k, ck)| **k != j && **ck <= cj).count();
            let ge = p.iter().filter(|(k, pk)| **k != j && **pk >= cj).count();
            (le >= 2 * f && ge >= f).then_some(cj)
        })
    }

    /// Forgets what the log, P, Q and the doubted slots hold above the recovery estimate
    /// H_M (a tampered journal may have put claims there), and rebuilds our VIEW-CHANGE
    /// without them if it had any.
    pub(super) fn drop_above(&mut self, h_m: Seq) {
        self.ordering.order.log.retain(|n, _| *n <= h_m);
        self.views.claims.keep_through(h_m);
        let above =
            |vc: &ViewChange| vc.p.iter().any(|e| e.seq > h_m) || vc.q.iter().any(|e| e.seq > h_m);
        if let Some((vc, _)) = self.views.mine.as_ref().filter(|(vc, _)| above(vc)) {
            let mut vc = vc.clone();
            vc.p.retain(|e| e.seq <= h_m);
            vc.q.retain(|e| e.seq <= h_m);
            let d = vc.digest();
            self.views.mine = Some((vc, d));
        }
    }

    /// A low watermark above the recovery estimate H_M came from a journal record no correct
    /// replica could have written (H_M bounds every stable checkpoint): go back to the
    /// checkpoint the state itself holds, and stop fetching the made-up one.
    pub(super) fn distrust_watermark_above(&mut self, h_m: Seq) {
        let base = self.exec.state().base_seq();
        if self.ordering.ckpt_votes.stable_seq() <= h_m || base > h_m {
            return;
        }
        let Some((root, aux)) = self.exec.state().held(base) else {
            return;
        };
        self.stats.watermarks_distrusted += 1;
        self.ordering.ckpt_votes.set_stable(
            base,
            crate::transfer::checkpoint_digest_of(base, &root, &aux),
        );
        if self.exec.own_checkpoint(base).is_none() {
            self.exec
                .note_checkpoint(base, self.ordering.ckpt_votes.stable_digest());
        }
        self.exec.drop_transfer_above(h_m);
        self.persist(Record::Watermark {
            seq: base,
            digest: self.ordering.ckpt_votes.stable_digest(),
        });
    }

    /// The state itself claims a checkpoint above H_M (its page store's base was rewritten):
    /// no correct replica can have executed that far, so its label is a lie. The live pages
    /// become checkpoint 0 (with the initial execution variables), execution stops, and the
    /// replica fetches a checkpoint f+1 replicas vouch for, like one that lost its disk.
    pub(super) fn distrust_state_above(&mut self, h_m: Seq) {
        let claimed = self.exec.last_executed().max(self.exec.state().latest());
        if claimed <= h_m {
            return;
        }
        self.stats.states_distrusted += 1;
        self.event(Event::StateDistrusted { seq: claimed, h_m });
        self.undo_tentative();
        let aux = initial_aux();
        let root = self.exec.state_mut().relabel(0, aux.clone());
        let digest = crate::transfer::checkpoint_digest_of(0, &root, &aux);
        // The initial auxiliary bytes always decode; the service may not load over pages
        // that are not genesis pages, which is why execution stops until the fetch.
        self.exec.restart_at_genesis();
        self.ordering.ckpt_votes.set_stable(0, digest);
        self.exec.forget_checkpoints();
        self.exec.note_checkpoint(0, digest);
        self.ordering.order.log.clear();
        self.ordering.order.pending_pp.clear();
        self.exec.drop_transfer();
        self.ordering.proposing.next_seq = 1;
        self.exec.set_diverged(true);
        self.persist(Record::Checkpoint { seq: 0, digest });
    }

    /// BFT-PR's view estimate, from the views reported by the 2f+1 matching replies to our
    /// recovery request: keep the current view if f+1 of them are at it or above, otherwise
    /// adopt their median (at least f+1 correct replicas report a view at or above it, and f+1
    /// at or below). A journal tampered with while the replica was compromised may hold a
    /// view no correct replica will reach; without this the replica reported itself recovered
    /// and never took part again.
    pub(super) fn estimate_view(&mut self, mut views: Vec<View>) {
        let f = self.cfg.f as usize;
        if views.is_empty() || views.iter().filter(|v| **v >= self.views.view).count() > f {
            return;
        }
        views.sort_unstable();
        let median = views[views.len() / 2];
        if median >= self.views.view {
            return;
        }
        self.stats.views_estimated += 1;
        self.reset_to_view(median);
    }

    /// Moves back to view `v` (not yet active, unless it is view 0) with nothing of later views: no VIEW-CHANGE of
    /// our own (peers relay it to us if a NEW-VIEW names it), and no P or Q claims from views
    /// at or above `v`.
    pub(super) fn reset_to_view(&mut self, v: View) {
        self.undo_tentative();
        self.views.view = v;
        // View 0 needs no NEW-VIEW; a later one comes from its primary, in answer to our
        // status.
        self.views.normal = v == 0;
        self.views.mine = None;
        self.views.prev = None;
        self.views.store.clear();
        self.views.pending_nv = None;
        self.views.new_view = None;
        self.views.decision_missing.clear();
        self.ordering.order.log.clear();
        self.ordering.order.pending_pp.clear();
        self.requests.pool.clear_inflight();
        self.requests.timer = None;
        self.views.timer.deadline_ms = None;
        self.views.claims.forget_from_view(v);
        let (pset, qset) = self.views.claims.wire();
        let batches = self.pset_batches();
        self.persist(Record::View {
            view: v,
            normal: v == 0,
            vc: None,
            pset,
            qset,
            batches,
            doubted: self.views.claims.doubted_wire(),
        });
        self.event(Event::ViewChangeStarted {
            view: v,
            cause: ViewChangeCause::Recovery,
        });
        self.proposals_view(v, v != 0);
    }
}
