//! Proactive recovery at a replica (BFT-PR §4.4, §4.6); session keys are in `new_key.rs`,
//! request authentication in `authenticate.rs`.
//!
//! A child module of [`crate::replica`]: it extends the replica with the execution of
//! recovery requests and with the recovery protocol a host starts with [`Input::Recover`] after
//! restarting the replica from its saved state:
//!
//! 1. discard client keys and send a NEW-KEY;
//! 2. estimation: QUERY-STABLE until REPLY-STABLEs give H_M = c_M + L, with c_M a reported
//!    checkpoint that 2f other replicas report at or above and f others have prepared up to;
//!    log entries above H_M are discarded and nothing above H_M is sent until a stable
//!    checkpoint reaches it;
//! 3. the recovery request, signed by the key holder, ordered like a client request; every
//!    replica that executes it sends a NEW-KEY; 2f+1 matching replies give n_R;
//! 4. H = max(H_M, ⌊n_R/K⌋·K + L); the state is checked and corrupt or out-of-date pages fetched;
//! 5. recovered when checkpoint H is stable here.
//!
//! The replica keeps taking part in the protocol throughout.

use super::*;
use crate::execution::initial_aux;
use crate::keys::{epoch_of, Purpose};
use crate::message::{
    recovery_client, recovery_replica, QueryStable, RecoveryOp, RecoveryResult, ReplyStable,
};
use redoubt_crypto::pk::HolderSecrets;

/// The replica whose recovery request client id `c` is (for `n` replicas).
pub(super) fn recovery_of(c: ClientId, n: u32) -> Option<ReplicaId> {
    recovery_replica(c).filter(|r| *r < n)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for the key holder's fresh keys: nothing received under the old ones (an
    /// attacker who held this replica knows them) may count towards the estimate.
    Keying,
    Estimating,
    Requesting,
    Fetching,
}

/// A recovery in progress.
#[derive(Clone, Debug)]
pub(super) struct Recovery {
    pub(super) phase: Phase,
    started_ms: u64,
    nonce: u64,
    c_min: BTreeMap<ReplicaId, Seq>,
    p_max: BTreeMap<ReplicaId, Seq>,
    h_m: Seq,
    request: Option<SignedRequest>,
    replies: BTreeMap<ReplicaId, Vec<u8>>,
    /// The view each reply to the recovery request reported (for the view estimate).
    reply_views: BTreeMap<ReplicaId, View>,
    h: Seq,
    n_r: Seq,
    next_retry_ms: u64,
    estimated_ms: u64,
    replied_ms: u64,
    pages_before: u64,
    corrupt_pages: u64,
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Executes replica `r`'s recovery request (operation `op`, key-holder counter
    /// `counter`) at `seq` (agreed time `time_ms`): refused if `r`'s previous accepted
    /// recovery is more recent than `recovery_interval_min_ms`; otherwise every replica but
    /// `r` refreshes its keys, so the keys an attacker may have taken from `r` stop working,
    /// and under Prime the order key the request names replaces `r`'s (incarnation
    /// `counter`) and `r`'s pre-ordering numbering is fenced.
    pub(super) fn execute_recovery(
        &mut self,
        r: ReplicaId,
        op: Option<RecoveryOp>,
        counter: u64,
        seq: Seq,
        time_ms: u64,
    ) -> Vec<u8> {
        let op_h_m = op.map_or(0, |op| op.h_m);
        let before = self
            .exec
            .last_reply(recovery_client(r))
            .and_then(|l| postcard::from_bytes::<RecoveryResult>(&l.result).ok());
        let previous = before.as_ref().and_then(|p| p.last_accepted_ms);
        let previous_counter = before.as_ref().and_then(|p| p.last_accepted_counter);
        let previous_key = before.and_then(|p| p.row_key);
        // Within the interval only a request of a later key-holder epoch (signed after a
        // reboot by the monitor) is accepted: one signed in advance while the replica was
        // held cannot veto its real recovery (second review, G8).
        let new_epoch = previous_counter.is_some_and(|c| epoch_of(counter) > epoch_of(c))
            && !self.mutant("recovery-interval-only");
        let accepted = new_epoch
            || previous
                .is_none_or(|t| time_ms.saturating_sub(t) >= self.cfg.recovery_interval_min_ms);
        let (k, l) = (self.cfg.checkpoint_interval, self.cfg.log_size);
        let h_r = seq / k * k + l;
        let target = if accepted {
            op_h_m.max(h_r).min(h_r + l).div_ceil(k) * k
        } else {
            0
        };
        let fresh_key = op
            .and_then(|op| op.row_key)
            .filter(|_| accepted && self.cfg.prime());
        let result = RecoveryResult {
            seq,
            accepted,
            last_accepted_ms: if accepted { Some(time_ms) } else { previous },
            last_accepted_counter: if accepted {
                Some(counter)
            } else {
                previous_counter
            },
            target,
            row_key: fresh_key.map(|k| (counter, k)).or(previous_key),
        };
        if accepted && self.cfg.prime() {
            self.prime_recovered(r);
        }
        if accepted {
            self.stats.recovery_requests_executed += 1;
            if !self.out.replaying {
                self.event(Event::RecoveryExecuted { replica: r, seq });
            }
            if r != self.id {
                self.rekey();
            }
        }
        postcard::to_stdvec(&result).expect("encodes")
    }

    /// After a state transfer: if the fetched state executed a recovery request we did not,
    /// refresh our keys as if we had executed it.
    pub(super) fn rekey_if_recoveries_changed(&mut self, before: &BTreeMap<ClientId, u64>) {
        let changed = self.exec.replies().any(|(c, l)| {
            recovery_replica(*c).is_some_and(|r| r != self.id)
                && before.get(c).is_none_or(|t| *t < l.timestamp)
        });
        if changed {
            self.keying.refresh_soon();
        }
    }

    pub(super) fn recovery_timestamps(&self) -> BTreeMap<ClientId, u64> {
        self.exec
            .replies()
            .filter(|(c, _)| recovery_replica(**c).is_some())
            .map(|(c, l)| (*c, l.timestamp))
            .collect()
    }

    // ----- the recovering replica ---------------------------------------------------------------

    /// Starts a recovery (the host restarted us from our saved state and asks us to recover).
    pub(super) fn start_recovery(&mut self) {
        if self.recovery.is_some() || !self.uses_session_keys() {
            return;
        }
        if self.views.normal && self.is_primary() {
            // Hand over first; the recovery proceeds meanwhile.
            self.start_view_change(self.views.view.saturating_add(1), ViewChangeCause::HandOver);
        }
        if let Some(s) = self.auth.session() {
            s.discard_client_keys();
        }
        self.prime_forget();
        // Which NEW-VIEW it entered its view on came from a journal the attacker may have
        // rewritten: it vouches for none (see `reports.rs`) until it enters a view again.
        self.views.entered_on = None;
        self.rekey();
        let now = self.now();
        self.recovery = Some(Recovery {
            phase: Phase::Keying,
            started_ms: now,
            nonce: self.env.entropy,
            c_min: BTreeMap::new(),
            p_max: BTreeMap::new(),
            h_m: 0,
            request: None,
            replies: BTreeMap::new(),
            reply_views: BTreeMap::new(),
            h: 0,
            n_r: 0,
            next_retry_ms: now,
            estimated_ms: 0,
            replied_ms: 0,
            pages_before: self.stats.transfer_pages,
            corrupt_pages: 0,
        });
        self.event(Event::RecoveryStarted);
        self.drive_recovery();
    }

    /// Our keys were refreshed: a recovery waiting for them starts its estimate.
    pub(super) fn keys_refreshed_for_recovery(&mut self) {
        let now = self.now();
        if let Some(rec) = self.recovery.as_mut().filter(|r| r.phase == Phase::Keying) {
            rec.phase = Phase::Estimating;
            rec.next_retry_ms = now;
            self.drive_recovery();
        }
    }

    /// Whether a recovery is in progress.
    pub fn recovering(&self) -> bool {
        self.recovery.is_some()
    }

    /// Prime: whether our rows and PO-REQUESTs may go out with the order key of incarnation
    /// `inc` as far as a recovery is concerned: none in progress, or its request ran here
    /// and installed that key.
    pub(super) fn recovery_incarnated(&self, inc: u64) -> bool {
        match &self.recovery {
            None => true,
            Some(rec) => {
                rec.phase == Phase::Fetching
                    && rec
                        .request
                        .as_ref()
                        .is_some_and(|sr| sr.request.timestamp == inc)
            }
        }
    }

    fn last_checkpoint_seq(&self) -> Seq {
        self.exec.latest_own_checkpoint().unwrap_or(0)
    }

    fn last_prepared_seq(&self) -> Seq {
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

    pub(super) fn on_query_stable(
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
        self.send_replica(from, &Message::ReplyStable(r));
        Ok(())
    }

    pub(super) fn on_reply_stable(
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
    fn estimate(&self, rec: &Recovery) -> Option<Seq> {
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
    fn drop_above(&mut self, h_m: Seq) {
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
    fn distrust_watermark_above(&mut self, h_m: Seq) {
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
    fn distrust_state_above(&mut self, h_m: Seq) {
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
    fn estimate_view(&mut self, mut views: Vec<View>) {
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
    fn reset_to_view(&mut self, v: View) {
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
        self.prime_view(v, v != 0);
    }

    /// Advances the recovery: retransmissions, phase changes, completion.
    pub(super) fn drive_recovery(&mut self) {
        let Some(mut rec) = self.recovery.take() else {
            return;
        };
        let now = self.now();
        match rec.phase {
            // `keys_refreshed_for_recovery` moves on; a failed refresh is retried by the tick.
            Phase::Keying => {}
            Phase::Estimating => {
                if let Some(c_m) = self.estimate(&rec) {
                    rec.h_m = c_m + self.cfg.log_size;
                    rec.estimated_ms = now;
                    // Nothing above H_M survives from before; nothing above it is sent until a
                    // stable checkpoint reaches it.
                    let keep = rec.h_m;
                    self.drop_above(keep);
                    self.distrust_watermark_above(keep);
                    self.distrust_state_above(keep);
                    self.out.send_cap = Some(rec.h_m);
                    self.event(Event::RecoveryEstimated { h_m: rec.h_m });
                    rec.phase = Phase::Requesting;
                    rec.next_retry_ms = now;
                } else if now >= rec.next_retry_ms {
                    // Right after the restart the links are still connecting: the first
                    // queries may be lost, so they go out again every status interval.
                    rec.next_retry_ms = now + self.cfg.status_interval_ms;
                    let q = QueryStable {
                        replica: self.id,
                        nonce: rec.nonce,
                    };
                    self.broadcast(&Message::QueryStable(q));
                }
            }
            Phase::Requesting => {
                if rec.request.is_none() && now >= rec.next_retry_ms {
                    match self.make_recovery_request(rec.h_m) {
                        Ok(sr) => rec.request = Some(sr),
                        Err(e) => {
                            self.event(Event::KeyHolderFailed(e));
                            rec.next_retry_ms = now + self.cfg.status_interval_ms * 10;
                        }
                    }
                }
                if let Some(sr) = rec.request.clone() {
                    if now >= rec.next_retry_ms {
                        rec.next_retry_ms = now + self.cfg.status_interval_ms * 5;
                        self.broadcast(&Message::Request(sr.clone()));
                        self.recovery = Some(rec);
                        let me = Principal::Replica(self.id);
                        let _ = self.on_request(me, sr, None);
                        rec = match self.recovery.take() {
                            Some(r) => r,
                            None => return,
                        };
                    }
                }
            }
            Phase::Fetching => {
                let settled = self.ordering.ckpt_votes.stable_seq() >= rec.h
                    && self.exec.transfer_target().is_none()
                    && !self.exec.diverged()
                    && !self.exec.state().needs_repair()
                    && self.exec.last_executed() >= rec.h;
                if settled {
                    let report = RecoveryReport {
                        h_m: rec.h_m,
                        h: rec.h,
                        n_r: rec.n_r,
                        estimation_ms: rec.estimated_ms - rec.started_ms,
                        request_ms: rec.replied_ms - rec.estimated_ms,
                        check_fetch_ms: now - rec.replied_ms,
                        total_ms: now - rec.started_ms,
                        corrupt_pages: rec.corrupt_pages,
                        pages_fetched: self.stats.transfer_pages - rec.pages_before,
                    };
                    self.stats.recoveries += 1;
                    self.out.send_cap = None;
                    self.event(Event::Recovered(report));
                    return;
                }
            }
        }
        self.recovery = Some(rec);
        self.release_send_cap();
    }

    /// A checkpoint at `seq` is becoming stable: the recovery cap lifts once it reaches H_M.
    pub(super) fn release_send_cap_after(&mut self, seq: Seq) {
        if self.out.send_cap.is_some_and(|cap| seq >= cap) {
            self.out.send_cap = None;
        }
    }

    pub(super) fn release_send_cap(&mut self) {
        if self
            .out
            .send_cap
            .is_some_and(|cap| self.ordering.ckpt_votes.stable_seq() >= cap)
        {
            self.out.send_cap = None;
        }
    }

    fn make_recovery_request(&mut self, h_m: Seq) -> Result<SignedRequest, String> {
        let me = self.id;
        // The mutant draws none: the replica keeps the key an attacker may hold.
        let prime = self.cfg.prime() && !self.mutant("keep-order-keys");
        let Some(s) = self.auth.session() else {
            return Err("static keys: no key holder".into());
        };
        // Prime: a fresh order key, named in the request (the old one may be an attacker's).
        let (seed, row_key, (counter, sig)) = s
            .with_holder(|h| {
                let seed = if prime { Some(h.fresh_key()?.0) } else { None };
                let row_key = seed.map(|s| HolderSecrets::from_seed(&s).public().verify);
                let content = RecoveryOp::content_digest(me, h_m, row_key.as_ref());
                h.sign(Purpose::Recovery, &content)
                    .map(|signed| (seed, row_key, signed))
            })
            .map_err(|e| e.to_string())?;
        if let Some(seed) = seed {
            self.draw_order_key(seed);
        }
        let op = RecoveryOp {
            replica: me,
            h_m,
            row_key,
            sig,
        };
        Ok(SignedRequest {
            request: Request {
                client: recovery_client(me),
                timestamp: counter,
                read_only: false,
                op: postcard::to_stdvec(&op).expect("encodes").into(),
            },
            auth: Vec::new().into(),
            sig: None,
        })
    }

    /// A reply to our recovery request (from a peer, or from our own execution).
    pub(super) fn on_recovery_reply(&mut self, from: ReplicaId, r: Reply) -> Result<(), Reject> {
        if r.replica != from
            || r.client != recovery_client(self.id)
            || r.digest_only
            || r.view > crate::types::VIEW_LIMIT
        {
            return Err(Reject::Inconsistent);
        }
        let Some(mut rec) = self.recovery.take() else {
            return Err(Reject::Unexpected);
        };
        let ours = rec
            .request
            .as_ref()
            .is_some_and(|sr| sr.request.timestamp == r.timestamp);
        if rec.phase != Phase::Requesting || !ours {
            self.recovery = Some(rec);
            return Err(Reject::Stale);
        }
        rec.replies.insert(from, r.result.clone());
        rec.reply_views.insert(from, r.view);
        let matching = rec.replies.values().filter(|v| **v == r.result).count();
        if matching >= self.cfg.quorum() {
            let Ok(result) = postcard::from_bytes::<RecoveryResult>(&r.result) else {
                self.recovery = Some(rec);
                return Err(Reject::Malformed);
            };
            if !result.accepted {
                // A recovery of ours was accepted recently (a restart mid-recovery): ask again
                // with a new request once the interval has passed.
                self.event(Event::RecoveryRefused);
                rec.request = None;
                rec.replies.clear();
                rec.reply_views.clear();
                rec.next_retry_ms = self.now() + self.cfg.recovery_interval_min_ms;
                self.recovery = Some(rec);
                return Ok(());
            }
            let k = self.cfg.checkpoint_interval;
            let h_r = result.seq / k * k + self.cfg.log_size;
            rec.h = rec.h_m.max(h_r);
            rec.n_r = result.seq;
            rec.replied_ms = self.now();
            let views: Vec<View> = rec
                .replies
                .iter()
                .filter(|(_, v)| **v == r.result)
                .filter_map(|(j, _)| rec.reply_views.get(j).copied())
                .collect();
            self.estimate_view(views);
            rec.phase = Phase::Fetching;
            // Check every page; corrupt ones are fetched at the next vouched checkpoint.
            rec.corrupt_pages = self.check_state().len() as u64;
        }
        self.recovery = Some(rec);
        self.drive_recovery();
        Ok(())
    }

    /// Whether a replica's recovery waits for a checkpoint beyond the stable one (read from
    /// the replicated results of recovery requests, so every replica agrees): an idle primary
    /// then proposes empty batches.
    pub(super) fn recovery_progress_target(&self) -> Option<Seq> {
        self.exec
            .replies()
            .filter(|(c, _)| recovery_replica(**c).is_some())
            .filter_map(|(_, l)| postcard::from_bytes::<RecoveryResult>(&l.result).ok())
            .map(|res| res.target)
            .filter(|t| *t > self.ordering.ckpt_votes.stable_seq())
            .max()
    }

    /// Whether `msg` carries a sequence number above the recovery cap H_M (not to be sent).
    pub(super) fn above_cap(&self, msg: &Message) -> bool {
        let Some(cap) = self.out.send_cap else {
            return false;
        };
        let seq = match msg {
            Message::PrePrepare(m) => m.seq,
            Message::Prepare(m) => m.seq,
            Message::Commit(m) => m.seq,
            Message::Checkpoint(m) => m.seq,
            Message::Order(m) => m.seq,
            _ => return false,
        };
        seq > cap
    }
}
