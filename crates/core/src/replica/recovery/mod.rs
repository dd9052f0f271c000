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
//!
//! This file holds the recovery in progress and drives it through its phases; `estimate.rs`
//! makes the estimate (step 2), `request.rs` the recovery request and its replies (step 3),
//! and `executing.rs` is what every replica does when a recovery request executes.

use super::*;

mod estimate;
mod executing;
mod request;
use crate::execution::initial_aux;
use crate::holder::{HolderRequest, HolderResult};
use crate::message::{
    recovery_client, recovery_replica, QueryStable, RecoveryOp, RecoveryResult, ReplyStable,
};

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
        let own = self.mutant("forget-own-acks");
        self.proposals.forget(own);
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
                    self.broadcast(&Message::from(q));
                }
            }
            Phase::Requesting => {
                if rec.request.is_none() && now >= rec.next_retry_ms {
                    // The key holder signs it (one call at a time); it goes out with the answer.
                    let request = HolderRequest::SignRecovery {
                        replica: self.id,
                        h_m: rec.h_m,
                        // The mutant draws none: the replica keeps the key an attacker may hold.
                        order_key: self.proposals.order_keys() && !self.mutant("keep-order-keys"),
                    };
                    if let Some(call) = self.keying.calls.sign_recovery(request, now) {
                        self.out.effects.push(Effect::Holder(call));
                    }
                }
                if let Some(sr) = rec.request.clone() {
                    if now >= rec.next_retry_ms {
                        rec.next_retry_ms = now + self.cfg.status_interval_ms * 5;
                        self.broadcast(&Message::from(sr.clone()));
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

    fn release_send_cap(&mut self) {
        if self
            .out
            .send_cap
            .is_some_and(|cap| self.ordering.ckpt_votes.stable_seq() >= cap)
        {
            self.out.send_cap = None;
        }
    }

    /// Whether `msg` carries a sequence number above the recovery cap H_M (not to be sent).
    pub(super) fn above_cap(&self, msg: &Message) -> bool {
        let Some(cap) = self.out.send_cap else {
            return false;
        };
        let seq = match msg {
            Message::Pbft(PbftMessage::PrePrepare(m)) => m.seq,
            Message::Pbft(PbftMessage::Prepare(m)) => m.seq,
            Message::Pbft(PbftMessage::Commit(m)) => m.seq,
            Message::Pbft(PbftMessage::Checkpoint(m)) => m.seq,
            Message::Separated(SeparatedMessage::Order(m)) => m.seq,
            _ => return false,
        };
        seq > cap
    }
}
