//! Receiver-driven retransmission (BFT-PR §4.6.1): the STATUS a replica sends
//! periodically, and what a peer's STATUS makes it send back, by job: help into a view, log
//! entries, checkpoint votes, batch bodies and view changes.

use super::*;

/// A replica sends a peer still behind its view (or entering it) the view's NEW-VIEW, and its
/// own VIEW-CHANGE, at most once per this many status intervals (400 ms by default), or half
/// the view-change timeout if that is shorter: long enough for a copy of many megabytes to
/// arrive and be checked by a loaded replica, well inside the view-change timeout.
pub(super) const VIEW_RESEND_STATUSES: u64 = 4;

/// When this replica last sent each peer a copy of one kind of view-change message, and for
/// which view, so that a peer's status messages (a backlog of them after a stop, or one per
/// interval while a large copy travels) are not each answered with a copy. At most one entry
/// per replica.
#[derive(Clone, Debug, Default)]
pub(super) struct ResendGate(BTreeMap<ReplicaId, (View, u64)>);

impl ResendGate {
    /// Whether a copy for `view` may go to `to` at `now` (ms), at least `gap` ms after the
    /// last copy for the same view; records it as sent if so.
    pub(super) fn pass(&mut self, to: ReplicaId, view: View, now: u64, gap: u64) -> bool {
        let due = match self.0.get(&to) {
            Some(&(v, at)) if v == view => now >= at.saturating_add(gap),
            _ => true,
        };
        if due {
            self.0.insert(to, (view, now));
        }
        due
    }

    /// Records copies for `view` sent to every replica of `to` at `now` (a broadcast).
    pub(super) fn sent_to_all(
        &mut self,
        to: impl Iterator<Item = ReplicaId>,
        view: View,
        now: u64,
    ) {
        self.0 = to.map(|r| (r, (view, now))).collect();
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    pub(super) fn missing_batches(&self) -> Vec<Digest> {
        let mut m: Vec<Digest> = self
            .ordering
            .order
            .log
            .iter()
            .filter(|(n, s)| **n > self.exec.last_executed() && s.prepared)
            .filter_map(|(_, s)| s.pp)
            .filter(|d| *d != NULL_DIGEST && !self.ordering.order.batches.contains_key(d))
            .collect();
        m.extend(self.views.decision_missing.iter().copied());
        m.extend(self.ordering.order.pending_pp.values().map(|p| p.pp.digest));
        m.truncate(MISSING_MAX);
        m
    }

    pub(super) fn send_status(&mut self) {
        let window = |s: &Slot| s.pp.is_some();
        let prepared: Vec<Seq> = self
            .ordering
            .order
            .log
            .iter()
            .filter(|(n, s)| **n > self.exec.last_executed() && window(s) && s.prepared)
            .map(|(n, _)| *n)
            .collect();
        let committed: Vec<Seq> = self
            .ordering
            .order
            .log
            .iter()
            .filter(|(n, s)| **n > self.exec.last_executed() && s.committed)
            .map(|(n, _)| *n)
            .collect();
        let missing_vcs = match &self.views.pending_nv {
            Some(nv) => self.gather_nv_vcs(nv).err().unwrap_or_default(),
            None => Vec::new(),
        };
        let st = Status {
            replica: self.id,
            view: self.views.view,
            normal: self.views.normal,
            new_view: self
                .views
                .entered_on
                .filter(|(v, _)| self.views.normal && *v == self.views.view)
                .map(|(_, d)| d),
            last_executed: self.exec.last_executed(),
            stable: self.ordering.ckpt_votes.stable_seq(),
            prepared,
            committed,
            missing_batches: self.missing_batches(),
            missing_vcs,
        };
        self.stats.bodies_asked += st.missing_batches.len() as u64;
        self.broadcast(&Message::from(st));
    }

    pub(super) fn on_status(&mut self, from: ReplicaId, st: Status) -> Result<(), Reject> {
        if st.replica != from || from == self.id {
            return Err(Reject::Inconsistent);
        }
        let l = self.cfg.log_size as usize;
        if st.prepared.len() > l
            || st.committed.len() > l
            || st.missing_batches.len() > MISSING_MAX
            || st.missing_vcs.len() > self.cfg.n() as usize
        {
            return Err(Reject::TooLarge);
        }
        self.views
            .reports
            .record(from, st.view, st.new_view.filter(|_| st.normal));
        if st.view < self.views.view || (st.view == self.views.view && !st.normal) {
            self.help_into_view(from, &st);
        }
        if st.view == self.views.view && st.normal && !self.views.normal {
            self.try_adopt_new_view();
        }
        if st.view == self.views.view && st.normal && self.views.normal {
            self.vouch_again();
            self.retransmit_log(from, &st);
        }
        // Also when the peer executed as far as a checkpoint of ours it does not hold stable:
        // it may have lost our vote (refused across a key refresh), and once the load stops
        // nothing else sends it again.
        if st.stable < self.ordering.ckpt_votes.stable_seq()
            || st.last_executed < self.exec.last_executed()
            || self
                .exec
                .latest_own_checkpoint()
                .is_some_and(|c| c > st.stable && c <= st.last_executed)
        {
            self.send_checkpoints(from, &st);
        }
        // Batch bodies, from one replica at a time (see `answers_bodies_to`).
        if self.answers_bodies_to(from) {
            let bodies = self.bodies_within_budget(&st.missing_batches, self.status_body_budget());
            if !bodies.is_empty() {
                self.send_replica(from, &Message::Pbft(PbftMessage::Batches(bodies)));
            }
        }
        self.send_view_changes(from, &st.missing_vcs);
        Ok(())
    }

    /// Helps a replica that is behind in views or stuck in a view change: the NEW-VIEW of this
    /// view (from its primary), our VIEW-CHANGE, and, to a new primary, our acks again.
    ///
    /// Each goes to one replica at most once per [`VIEW_RESEND_STATUSES`] status intervals
    /// (at most half the view-change timeout) for the same view. The NEW-VIEW carries the
    /// bodies of the batches it chose (up to half the largest message), and a replica still
    /// entering the view keeps sending status messages while the first copy travels and is
    /// checked: answering each of them again filled the links with copies that every receiver
    /// decoded and rejected, which under load delayed the backups' entry into the view past
    /// their view-change timers. A replica resuming after a stop finds a backlog of its peers'
    /// status messages and would answer each with its VIEW-CHANGE. A replica that asks for a
    /// view change it lacks (`missing_vcs`) gets it at every status (`send_view_changes`).
    fn help_into_view(&mut self, from: ReplicaId, st: &Status) {
        let now = self.now();
        // Within half the view-change timeout whatever the settings, so that a lost copy is
        // sent again before the replica waiting for it gives up on the view.
        let gap = (self.cfg.status_interval_ms * VIEW_RESEND_STATUSES)
            .min(self.cfg.view_change_timeout_ms / 2);
        if self.views.normal
            && self.is_primary()
            && self.views.new_view.is_some()
            && self
                .views
                .new_view_sent
                .pass(from, self.views.view, now, gap)
        {
            if let Some(mut nv) = self.views.new_view.clone() {
                nv.batches = self.bodies_within_budget(&nv.chosen, self.cfg.message_bytes_max / 2);
                self.send_replica(from, &Message::from(nv));
            }
        }
        if let Some((vc, _)) = self.views.mine.clone() {
            if vc.view == self.views.view
                && self.views.view_change_sent.pass(from, vc.view, now, gap)
            {
                self.send_replica(from, &Message::from(vc));
            }
        }
        if st.view == self.views.view && !self.views.normal && from == self.primary() {
            // The new primary may have lost our acks.
            let acks: Vec<ViewChangeAck> = self
                .views
                .store
                .for_view(self.views.view)
                .filter(|(r, _, _)| *r != from)
                .map(|(r, _, d)| ViewChangeAck {
                    view: self.views.view,
                    acker: self.id,
                    sender: r,
                    digest: d,
                })
                .collect();
            for a in acks {
                self.send_replica(from, &Message::from(a));
            }
        }
    }

    /// Retransmits, to a replica in our view, the log entries it lacks (within the budgets).
    fn retransmit_log(&mut self, from: ReplicaId, st: &Status) {
        let prepared: BTreeSet<Seq> = st.prepared.iter().copied().collect();
        let committed: BTreeSet<Seq> = st.committed.iter().copied().collect();
        let mut budget = self.cfg.retransmit_entries_max;
        // Pre-prepares carry bodies: bound the bytes one status can make us resend.
        let mut body_bytes_left = self.status_body_budget();
        let entries: Vec<(Seq, Slot)> = self
            .ordering
            .order
            .log
            .from(st.last_executed.saturating_add(1))
            .filter(|(_, s)| s.pp.is_some())
            .map(|(n, s)| (*n, s.clone()))
            .collect();
        for (n, s) in entries {
            if budget == 0 {
                break;
            }
            let d = s.pp.expect("filtered");
            let mut sent = false;
            if !prepared.contains(&n) && !committed.contains(&n) {
                if s.proposed_here {
                    let pp = self
                        .ordering
                        .order
                        .batches
                        .get(&d)
                        .map(|b| match &s.beside {
                            Some(beside) => self.lean_again(n, d, b, beside),
                            None => PrePrepare {
                                view: self.views.view,
                                seq: n,
                                digest: d,
                                batch: (**b).clone(),
                                beside: Vec::new(),
                            },
                        });
                    if let Some(pp) = pp.filter(|pp| pp.batch.op_bytes() <= body_bytes_left) {
                        body_bytes_left -= pp.batch.op_bytes();
                        self.send_replica(from, &Message::from(pp));
                        sent = true;
                    }
                }
                if s.sent_prepare {
                    let p = Prepare {
                        view: self.views.view,
                        seq: n,
                        digest: d,
                        replica: self.id,
                        doubts: s.doubts.get(&self.id).cloned().unwrap_or_default(),
                    };
                    self.send_replica(from, &Message::from(p));
                    sent = true;
                }
            }
            if !committed.contains(&n) && s.sent_commit {
                let c = Commit {
                    view: self.views.view,
                    seq: n,
                    digest: d,
                    replica: self.id,
                };
                self.send_replica(from, &Message::from(c));
                sent = true;
            }
            if sent {
                budget -= 1;
                self.stats.entries_retransmitted += 1;
            }
        }
    }

    /// Checkpoint votes for what a lagging replica lacks, so it can advance or fetch state.
    fn send_checkpoints(&mut self, from: ReplicaId, st: &Status) {
        let mine = self.exec.own_checkpoints_from(
            st.stable
                .max(st.last_executed.min(self.ordering.ckpt_votes.stable_seq()))
                .saturating_add(1),
        );
        let own_stable = (
            self.ordering.ckpt_votes.stable_seq(),
            self.ordering.ckpt_votes.stable_digest(),
        );
        let mut send: Vec<(Seq, Digest)> = mine;
        if st.stable < self.ordering.ckpt_votes.stable_seq()
            && !send.iter().any(|(n, _)| *n == own_stable.0)
        {
            send.push(own_stable);
        }
        for (seq, digest) in send {
            if seq == 0 {
                continue;
            }
            let c = Checkpoint {
                seq,
                digest,
                replica: self.id,
            };
            self.send_replica(from, &Message::from(c));
        }
    }

    /// The view changes named by a NEW-VIEW the asker holds: ours, or relayed with our ack.
    fn send_view_changes(&mut self, from: ReplicaId, missing: &[(ReplicaId, Digest)]) {
        for (r, d) in missing.iter().copied() {
            if r == self.id {
                let mine = [self.views.mine.clone(), self.views.prev.clone()];
                if let Some((m, _)) = mine.into_iter().flatten().find(|(_, md)| *md == d) {
                    self.send_replica(from, &Message::from(m));
                }
            } else if let Some(m) = self.views.store.of_sender_with(r, &d) {
                // Relayed with our ack (the asker's own too: a replica whose recovery
                // estimated a lower view holds none).
                let ack = ViewChangeAck {
                    view: m.view,
                    acker: self.id,
                    sender: r,
                    digest: d,
                };
                self.send_replica(from, &Message::Pbft(PbftMessage::RelayViewChange(m)));
                self.send_replica(from, &Message::from(ack));
            }
        }
    }
}
