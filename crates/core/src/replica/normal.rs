//! The normal case (PBFT §4.2): pre-prepares (with requests beside them), prepares with
//! doubts, commits, and when a slot is prepared and committed.

use super::*;

/// The normal-case state of PBFT ordering at this replica: the current view's order, the
/// proposals it makes as primary, the CHECKPOINT votes, which peers were heard lately, and
/// when its next status message is due.
pub(super) struct Ordering {
    /// Slots, batch bodies, waiting pre-prepares, held COMMITs.
    pub(super) order: Order,
    /// The next sequence number, pace and progress of proposals (see `requests.rs`).
    pub(super) proposing: requests::Proposing,
    /// CHECKPOINT votes: which checkpoints are known correct or stable, and the stable one.
    pub(super) ckpt_votes: CheckpointVotes,
    /// Which other replicas were heard lately (see `agreement/heard.rs`).
    pub(super) heard: Heard,
    /// When the next status message is due (ms).
    pub(super) next_status_ms: u64,
}

/// The order of the current view as this replica holds it: its slots, the batch bodies they
/// name, pre-prepares waiting for requests, COMMITs held back, and which bodies the journal
/// already holds.
#[derive(Default)]
pub(super) struct Order {
    /// The slots of the current view (see `log.rs`).
    pub(super) log: SlotLog,
    /// Batch bodies by digest, kept while a slot, a claim or a pending NEW-VIEW names them.
    pub(super) batches: BTreeMap<Digest, Arc<Batch>>,
    /// Pre-prepares of the current view waiting for requests that travel beside them (at
    /// most one per sequence number in the log window).
    pub(super) pending_pp: BTreeMap<Seq, PendingPp>,
    /// COMMITs of batches that execute tentatively, held back until the next broadcast or
    /// tick (`defer_tentative_commits`); at most one per slot of the log window.
    pub(super) deferred_commits: Vec<Commit>,
    /// Batches whose body this replica journaled in a `PrePrepared` record since its last
    /// view record, above its last checkpoint record: their `Executed` records omit the body
    /// (journal compaction keeps the pre-prepare record for them). At most one per slot.
    pub(super) bodies_journaled: BTreeSet<(Seq, Digest)>,
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    // ----- normal case ------------------------------------------------------------------------

    /// Adds to Q the slots of views we left whose every request we can now authenticate;
    /// with `client`, only slots holding a request of that client (the one that just
    /// arrived). Slots at or below the stable checkpoint are forgotten.
    pub(super) fn vouch_after_leaving(&mut self, client: Option<ClientId>) {
        let mut vouched = Vec::new();
        for (n, v, d) in self
            .views
            .claims
            .doubted_above(self.ordering.ckpt_votes.stable_seq())
        {
            let Some(b) = self.ordering.order.batches.get(&d) else {
                continue;
            };
            if client.is_some_and(|c| b.requests.iter().all(|r| r.request.client != c)) {
                continue;
            }
            if b.requests
                .iter()
                .all(|r| self.can_vouch_for(r, &self.request_digest(r)))
            {
                vouched.push((n, v, d));
            }
        }
        for (n, v, d) in vouched {
            self.views.claims.vouch(n, v, d);
        }
    }

    /// Whether a pre-prepared slot in our window holds a request of client `c` and a doubt
    /// of ours (cheap when we doubt nothing, the usual case).
    pub(super) fn doubts_request_of(&self, c: ClientId) -> bool {
        let me = self.id;
        !self.is_primary()
            && self
                .ordering
                .order
                .log
                .from(self.exec.last_executed() + 1)
                .any(|(_, s)| {
                    s.doubts.contains_key(&me)
                        && s.pp
                            .and_then(|d| self.ordering.order.batches.get(&d))
                            .is_some_and(|b| b.requests.iter().any(|r| r.request.client == c))
                })
    }

    /// Whether this replica vouches for request `r` (digest `d`) in a pre-prepare: within the
    /// size limit, and authentic: its authenticator entry verifies, or it equals a request
    /// this replica holds (waiting, or replaced by its client's next one), which was
    /// authenticated when it arrived (its client may have
    /// refreshed its keys since, so the entry no longer verifies, but the request is no less
    /// the client's; requests beside the pre-prepare are always of this kind). Or superseded:
    /// older than a request of its client that committed, so it executes as nothing and it
    /// matters not whose it is (a correct client's request relayed late, after the client
    /// re-keyed, is not doubted: doubts put a client under suspicion).
    pub(super) fn can_vouch_for(&self, r: &SignedRequest, d: &Digest) -> bool {
        r.request.op.len() <= self.cfg.op_bytes_max()
            && (self
                .requests
                .pool
                .get(r.request.client)
                .is_some_and(|w| w.req.request.same_as(&r.request))
                || self
                    .requests
                    .pool
                    .replaced(r.request.client, d)
                    .is_some_and(|h| h.request.same_as(&r.request))
                || self.signed_request_authentic(r, d)
                || self.superseded(&r.request))
    }

    /// Whether `req` is older than a request of its client that committed here: it executes
    /// as nothing wherever it is ordered (execution runs each client's timestamps in
    /// increasing order only). A tentatively executed request does not count: it may be
    /// undone.
    fn superseded(&self, req: &Request) -> bool {
        let c = req.client;
        let tentative = self
            .exec
            .tentative()
            .is_some_and(|t| t.executed.iter().any(|(x, _)| *x == c));
        !tentative
            && self
                .exec
                .last_reply(c)
                .is_some_and(|l| req.timestamp < l.timestamp)
    }

    /// This replica's own copy of the request named by `b` (beside a pre-prepare): the
    /// client's waiting request, or one it replaced (then `true`).
    pub(super) fn held_beside(&self, b: &Beside) -> Option<(&SignedRequest, bool)> {
        self.requests.pool.held_beside(b)
    }

    /// The digest of `r`: from the copy this replica holds if it is the same request (a
    /// comparison is cheaper than hashing a large operation again), else computed.
    pub(super) fn request_digest(&self, r: &SignedRequest) -> Digest {
        match self.requests.pool.get(r.request.client) {
            Some(w) if w.req.request.same_as(&r.request) => w.digest,
            _ => r.request.digest(),
        }
    }

    /// The pre-prepare this primary sends for `batch` (digest `digest`) at `seq`: large client
    /// requests named beside it, the others copied into it. A request ordered here already
    /// (behind a firewall, one that comes again before its certified reply came down is
    /// ordered again: see `on_request`) is copied in too: the backups executed it as well and
    /// hold it no longer, so named beside it would leave them waiting for the batch body
    /// from status messages (simulator `--firewall` seed 1913: a copy a backup relayed
    /// arriving just after the batch executed stalled the next batch some 200 ms, the pace
    /// check replaced the primary, and its successor, lacking that body, never sent its
    /// NEW-VIEW).
    pub(super) fn lean(
        &self,
        seq: Seq,
        digest: Digest,
        batch: &Batch,
        digests: &[Digest],
    ) -> PrePrepare {
        let n = self.cfg.n();
        let mut pp = PrePrepare {
            view: self.views.view,
            seq,
            digest,
            batch: Batch {
                nondet: batch.nondet,
                requests: Vec::new(),
                matrix: batch.matrix.clone(),
            },
            beside: Vec::new(),
        };
        for (i, r) in batch.requests.iter().enumerate() {
            let ordered_here = self
                .exec
                .last_reply(r.request.client)
                .is_some_and(|l| l.timestamp >= r.request.timestamp);
            if self.cfg.travels_beside(r.request.op.len())
                && recovery::recovery_of(r.request.client, n).is_none()
                && !ordered_here
            {
                pp.beside.push(Beside {
                    index: i as u32,
                    client: r.request.client,
                    digest: digests[i],
                });
            } else {
                pp.batch.requests.push(r.clone());
            }
        }
        pp
    }

    /// The pre-prepare of slot `seq` (digest `digest`) proposed here, as it was sent: the
    /// requests named beside it again named only (its receiver holds them, or asks for the
    /// batch in its status messages), so that helping a slow backup costs digests, not the
    /// bodies of large requests it most likely holds already.
    pub(super) fn lean_again(
        &self,
        seq: Seq,
        digest: Digest,
        batch: &Batch,
        beside: &[Beside],
    ) -> PrePrepare {
        let mut named = beside.iter().map(|b| b.index as usize).peekable();
        let mut inline = Vec::with_capacity(batch.requests.len().saturating_sub(beside.len()));
        for (i, r) in batch.requests.iter().enumerate() {
            if named.peek() == Some(&i) {
                named.next();
            } else {
                inline.push(r.clone());
            }
        }
        PrePrepare {
            view: self.views.view,
            seq,
            digest,
            batch: Batch {
                nondet: batch.nondet,
                requests: inline,
                matrix: batch.matrix.clone(),
            },
            beside: beside.to_vec(),
        }
    }

    /// The pre-prepare with its whole batch, from the requests this replica holds (or the
    /// batch itself, if known); `Err` gives it back when a request beside it is missing.
    pub(super) fn resolve(&self, pp: PrePrepare) -> Result<(PrePrepare, u64), PrePrepare> {
        if pp.beside.is_empty() {
            return Ok((pp, 0));
        }
        let mut from_replaced = 0;
        let whole = match self.ordering.order.batches.get(&pp.digest) {
            Some(b) => Some((**b).clone()),
            None => pp.whole_batch(|b| {
                let (r, replaced) = self.held_beside(b)?;
                from_replaced += u64::from(replaced);
                Some(r.clone())
            }),
        };
        match whole {
            Some(batch) => Ok((
                PrePrepare {
                    batch,
                    beside: Vec::new(),
                    ..pp
                },
                from_replaced,
            )),
            None => Err(pp),
        }
    }

    /// Pre-prepares still waiting for requests beside them get another try (a batch body
    /// arrived, or a tick): each is resolved in full.
    pub(super) fn retry_pending(&mut self) {
        let seqs: Vec<Seq> = self.ordering.order.pending_pp.keys().copied().collect();
        for seq in seqs {
            if let Some(p) = self.ordering.order.pending_pp.get_mut(&seq) {
                p.present = 0;
            }
            self.retry_pending_at(seq);
        }
    }

    /// Request (`c`, `digest`) arrived, or was kept: if some pending pre-prepare lacked it
    /// first, the pending pre-prepares get another try.
    pub(super) fn retry_pending_if_first_missing(&mut self, c: ClientId, digest: Digest) {
        if self.ordering.order.pending_pp.values().any(|p| {
            p.first_missing()
                .is_some_and(|b| b.client == c && b.digest == digest)
        }) {
            self.retry_pending_scan();
        }
    }

    /// After a request arrived that some pending pre-prepare lacked first: each pending
    /// pre-prepare advances over the requests now present, and is resolved once all are.
    /// Requests mostly arrive in the order of their batch, so this costs O(1) per arrival
    /// where resolving every pending pre-prepare at every arrival cost O(batch) (and built
    /// the batch each time: an allocation per request in it).
    pub(super) fn retry_pending_scan(&mut self) {
        let seqs: Vec<Seq> = self.ordering.order.pending_pp.keys().copied().collect();
        for seq in seqs {
            self.retry_pending_at(seq);
        }
    }

    pub(super) fn retry_pending_at(&mut self, seq: Seq) {
        let Some(p) = self.ordering.order.pending_pp.get(&seq) else {
            return;
        };
        let present = self.present_beside(&p.pp, p.present);
        if present < p.pp.beside.len() {
            if let Some(p) = self.ordering.order.pending_pp.get_mut(&seq) {
                p.present = present;
            }
            return;
        }
        let Some(p) = self.ordering.order.pending_pp.remove(&seq) else {
            return;
        };
        // Resolved and checked there; should a request counted present have been replaced
        // or settled meanwhile, it waits again, counted from the start.
        let primary = self.primary();
        let _ = self.on_pre_prepare(primary, p.pp);
    }

    /// How many of `pp`'s requests beside it, from the first, this replica holds (counting
    /// from `from`, the ones before known present).
    pub(super) fn present_beside(&self, pp: &PrePrepare, from: usize) -> usize {
        from + pp.beside[from.min(pp.beside.len())..]
            .iter()
            .take_while(|b| self.held_beside(b).is_some())
            .count()
    }

    pub(super) fn on_pre_prepare(&mut self, from: ReplicaId, pp: PrePrepare) -> Result<(), Reject> {
        if pp.view != self.views.view || !self.views.normal {
            return Err(Reject::OutOfWindow);
        }
        if from != self.primary() || self.is_primary() {
            return Err(Reject::Inconsistent);
        }
        if !self.in_window(pp.seq) {
            return Err(Reject::OutOfWindow);
        }
        if pp.beside.len() > self.cfg.batch_requests_max {
            return Err(Reject::TooLarge);
        }
        // PBFT's are batches of requests; Prime proposes summary matrices and nothing else.
        if !self.proposals.well_formed(&pp.batch, pp.beside.len()) {
            return Err(Reject::Inconsistent);
        }
        let (pp, from_replaced) = match self.resolve(pp) {
            Ok(resolved) => resolved,
            Err(pp) => {
                // Wait for the requests (their clients multicast them); status messages ask
                // the other replicas for the whole batch meanwhile. The first pre-prepare
                // for a sequence number stands.
                if let Some(d) = self.ordering.order.log.get(&pp.seq).and_then(|s| s.pp) {
                    return if d == pp.digest {
                        Ok(())
                    } else {
                        Err(Reject::Conflict)
                    };
                }
                return match self.ordering.order.pending_pp.get(&pp.seq) {
                    Some(p) if p.pp.digest != pp.digest => Err(Reject::Conflict),
                    Some(_) => Ok(()),
                    None => {
                        let present = self.present_beside(&pp, 0);
                        self.ordering
                            .order
                            .pending_pp
                            .insert(pp.seq, PendingPp { pp, present });
                        Ok(())
                    }
                };
            }
        };
        if self
            .ordering
            .order
            .pending_pp
            .get(&pp.seq)
            .is_some_and(|p| p.pp.digest != pp.digest)
        {
            return Err(Reject::Conflict);
        }
        self.ordering.order.pending_pp.remove(&pp.seq);
        #[cfg(feature = "mutants")]
        let check_digest = !matches!(self.cfg.mutant, crate::types::Mutant::SkipDigestCheck);
        #[cfg(not(feature = "mutants"))]
        let check_digest = true;
        let request_digests: Vec<Digest> = pp
            .batch
            .requests
            .iter()
            .map(|r| self.request_digest(r))
            .collect();
        if pp.digest == NULL_DIGEST
            || (check_digest && pp.batch.digest_with(&request_digests) != pp.digest)
        {
            return Err(Reject::BadDigest);
        }
        // Empty batches move an idle system to a recovering replica's recovery point.
        if pp.batch.requests.len() > self.cfg.batch_requests_max
            || pp.batch.op_bytes() > self.cfg.batch_bytes_max
        {
            return Err(Reject::TooLarge);
        }
        if let Some(slot) = self.ordering.order.log.get(&pp.seq) {
            if let Some(d) = slot.pp {
                let vouched = slot.vouched_by(self.id);
                return if d == pp.digest {
                    if let std::collections::btree_map::Entry::Vacant(e) =
                        self.ordering.order.batches.entry(d)
                    {
                        e.insert(Arc::new(pp.batch));
                        self.try_execute();
                    }
                    if !vouched {
                        self.vouch_late();
                    }
                    Ok(())
                } else {
                    Err(Reject::Conflict)
                };
            }
        }
        if self.now().abs_diff(pp.batch.nondet.time_ms) > self.cfg.clock_skew_max_ms {
            return Err(Reject::BadNonDet);
        }
        let exec = &self.exec;
        if !self
            .proposals
            .signed_validly(&pp.batch, &|j| installed_key(exec, j))
        {
            return Err(Reject::BadSignature);
        }
        // Client authentication of every request. A request this replica cannot authenticate
        // (a faulty client's authenticator may verify at some replicas only, or its key here
        // may be older or newer than the one it used) is named in our PREPARE's doubts: the
        // vote still counts for the order, and the slot prepares only if f+1 replicas of the
        // certificate vouch for each request, so that a correct one authenticated it.
        let mut doubts = Vec::new();
        for (i, (r, d)) in pp.batch.requests.iter().zip(&request_digests).enumerate() {
            if !self.can_vouch_for(r, d) {
                doubts.push(i as u16);
                self.ask_for_client_key(r.request.client);
            }
        }
        self.stats.requests_doubted += doubts.len() as u64;
        self.stats.beside_from_replaced += from_replaced;
        let (view, seq, digest) = (pp.view, pp.seq, pp.digest);
        let batch = Arc::new(pp.batch);
        self.persist(Record::PrePrepared {
            view,
            seq,
            digest,
            batch: Some(batch.clone()),
            vouched: doubts.is_empty(),
        });
        self.proposal_accepted(&batch);
        self.ordering.order.batches.insert(digest, batch);
        let slot = self.ordering.order.log.slot(seq);
        slot.pp = Some(digest);
        slot.sent_prepare = true;
        slot.prepares.insert(self.id, digest);
        if !doubts.is_empty() {
            slot.doubts.insert(self.id, doubts.clone());
        }
        let id = self.id;
        self.broadcast(&Message::from(Prepare {
            view,
            seq,
            digest,
            replica: id,
            doubts,
        }));
        self.check_slot(seq);
        Ok(())
    }

    pub(super) fn on_prepare(&mut self, from: ReplicaId, p: Prepare) -> Result<(), Reject> {
        // The primary's pre-prepare is its vote; a PREPARE from it is never counted.
        if p.replica != from || from == self.cfg.primary(p.view) {
            return Err(Reject::Inconsistent);
        }
        if !doubts_well_formed(&p.doubts, self.cfg.batch_requests_max) {
            return Err(Reject::Inconsistent);
        }
        if p.view != self.views.view || !self.views.normal || !self.in_window(p.seq) {
            return Err(Reject::OutOfWindow);
        }
        let slot = self.ordering.order.log.slot(p.seq);
        match slot.prepares.get(&from) {
            Some(d) if *d != p.digest => return Err(Reject::Conflict),
            Some(_) => {
                // Again for the same batch: it vouches for what either PREPARE vouched for
                // (a replica doubts less once it holds the request or the client's key).
                let Some(old) = slot.doubts.get_mut(&from) else {
                    return Ok(());
                };
                let before = old.len();
                old.retain(|i| p.doubts.binary_search(i).is_ok());
                if old.len() == before {
                    return Ok(());
                }
                if old.is_empty() {
                    slot.doubts.remove(&from);
                }
            }
            None => {
                slot.prepares.insert(from, p.digest);
                if !p.doubts.is_empty() {
                    let doubted = p.doubts.clone();
                    slot.doubts.insert(from, p.doubts);
                    if slot.pp == Some(p.digest) {
                        for i in doubted {
                            self.suspect_if_doubted(p.seq, i);
                        }
                    }
                }
            }
        }
        self.check_slot(p.seq);
        Ok(())
    }

    pub(super) fn on_commit(&mut self, from: ReplicaId, c: Commit) -> Result<(), Reject> {
        if c.replica != from {
            return Err(Reject::Inconsistent);
        }
        self.on_vote(from, c.view, c.seq, c.digest, |s| &mut s.commits)
    }

    /// Records one PREPARE or COMMIT vote (the first per sender and slot stands; votes are
    /// keyed by view through the log, which holds only the current view) and advances the slot.
    pub(super) fn on_vote(
        &mut self,
        from: ReplicaId,
        view: View,
        seq: Seq,
        digest: Digest,
        votes: impl FnOnce(&mut Slot) -> &mut BTreeMap<ReplicaId, Digest>,
    ) -> Result<(), Reject> {
        if view != self.views.view || !self.views.normal || !self.in_window(seq) {
            return Err(Reject::OutOfWindow);
        }
        let votes = votes(self.ordering.order.log.slot(seq));
        match votes.get(&from) {
            Some(d) if *d != digest => return Err(Reject::Conflict),
            Some(_) => return Ok(()),
            None => {
                votes.insert(from, digest);
            }
        }
        self.check_slot(seq);
        Ok(())
    }

    /// Sends the COMMITs held back for tentative batches.
    pub(super) fn flush_deferred_commits(&mut self) {
        for c in std::mem::take(&mut self.ordering.order.deferred_commits) {
            let bytes = self.seal(&Message::from(c), None);
            self.out.effects.push(Effect::Broadcast { bytes });
        }
    }

    /// Whether this replica holds back its COMMIT for the batch `digest` prepared here: only
    /// batches that execute tentatively (their replies do not wait for the commit), and only
    /// with `defer_tentative_commits`.
    fn defers_commit(&self, digest: &Digest) -> bool {
        self.cfg.defer_tentative_commits
            && self
                .ordering
                .order
                .batches
                .get(digest)
                .is_some_and(|b| self.executes_tentatively(b))
    }

    /// The `ignore-doubts` mutant: doubting PREPAREs count as vouching.
    fn ignores_doubts(&self) -> bool {
        #[cfg(feature = "mutants")]
        if self.cfg.mutant == crate::types::Mutant::IgnoreDoubts {
            return true;
        }
        false
    }

    /// Backup vouchers a request needs: 2f (the mutant `vouchers-at-f-plus-1`: f+1).
    fn vouchers(&self) -> usize {
        #[cfg(feature = "mutants")]
        if self.cfg.mutant == crate::types::Mutant::VouchersAtFPlusOne {
            return self.cfg.f as usize + 1;
        }
        2 * self.cfg.f as usize
    }

    pub(super) fn commit_quorum(&self) -> usize {
        #[cfg(feature = "mutants")]
        if self.cfg.mutant == crate::types::Mutant::CommitQuorum {
            return 2 * self.cfg.f as usize;
        }
        self.cfg.quorum()
    }

    /// Advances a slot through prepared and committed, sending COMMIT when it prepares.
    pub(super) fn check_slot(&mut self, seq: Seq) {
        let (me, f, primary) = (self.id, self.cfg.f, self.primary());
        let quorum = self.commit_quorum();
        let vouching = (self.vouchers(), self.ignores_doubts());
        let Some(slot) = self.ordering.order.log.get_mut(&seq) else {
            return;
        };
        let send_commit = slot.advance(me, f, primary, quorum, vouching);
        let committed = slot.committed;
        let prepared = slot.prepared;
        if let Some(digest) = send_commit {
            self.persist(Record::Prepared {
                view: self.views.view,
                seq,
                digest,
            });
            let c = Commit {
                view: self.views.view,
                seq,
                digest,
                replica: self.id,
            };
            if self.defers_commit(&digest) {
                debug_assert!(
                    self.ordering.order.deferred_commits.len() < self.cfg.log_size as usize
                );
                self.ordering.order.deferred_commits.push(c);
            } else {
                self.broadcast(&Message::from(c));
            }
        }
        if committed || (prepared && self.cfg.tentative_execution) {
            self.try_execute();
        }
    }
}
