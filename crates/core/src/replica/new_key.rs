//! Session keys at a replica (BFT-PR §4.1, §4.5): periodic refresh by NEW-KEY and the
//! freshness rule, admitting peers' NEW-KEYs, resending our latest one to a peer that cannot
//! authenticate us, asking clients whose keys we lack for theirs. When and to whom is kept
//! by `crate::keying`.

use super::recovery::recovery_of;
use super::*;
use crate::holder::{reject_of, Answered, HolderResult};
use crate::keys::{Accepted, Admitted, Check, HolderError};
use redoubt_crypto::MacKey;

impl<S: Service, A: KeyTable> Replica<S, A> {
    // ----- session keys -----------------------------------------------------------------------

    /// Whether this replica uses session keys (NEW-KEY) rather than static keys.
    pub fn uses_session_keys(&self) -> bool {
        self.auth.session_ref().is_some()
    }

    /// Asks the key holder for a NEW-KEY with fresh keys for every other replica (sent when
    /// it answers, see `refreshed`); nothing while a refresh is in flight.
    pub(super) fn rekey(&mut self) {
        if self.out.replaying {
            self.keying.refresh_soon();
            return;
        }
        if self.keying.calls.refreshing() {
            return;
        }
        let peers = self.key_peers();
        let Some(s) = self.auth.session_ref() else {
            return;
        };
        let request = s.refresh_request(&peers);
        if let Some(call) = self.keying.calls.refresh(request, self.now()) {
            self.out.effects.push(Effect::Holder(call));
        }
    }

    /// Who our NEW-KEYs go to: every other replica, and in the separated deployment the
    /// execution nodes (they send us acknowledgements); behind a firewall they send us nothing
    /// but certificates, and are out of reach.
    fn key_peers(&self) -> Vec<Principal> {
        let executors = if self.sink.firewall() {
            0
        } else {
            self.cfg.executors
        };
        (0..self.cfg.n())
            .filter(|r| *r != self.id)
            .map(Principal::Replica)
            .chain((0..executors).map(Principal::Executor))
            .collect()
    }

    /// The key holder answered our refresh: the fresh keys are installed and the NEW-KEY goes
    /// out. Applies the freshness rule: certificates not yet complete are dropped, since their
    /// messages were authenticated with keys now retired (peers retransmit what is still
    /// needed). A recovery waiting for its keys goes on.
    fn refreshed(&mut self, made: Result<(NewKey, Vec<(Principal, MacKey)>), HolderError>) {
        let now = self.now();
        let Some(s) = self.auth.session() else {
            return;
        };
        match made {
            Ok((nk, fresh)) => {
                s.install_refresh(nk.clone(), fresh);
                self.keying.refreshed(now, &self.cfg);
                self.stats.key_refreshes += 1;
                self.drop_incomplete_certificates();
                let nk = Message::from(nk);
                let peers = self.key_peers();
                self.broadcast(&nk);
                for p in peers
                    .into_iter()
                    .filter(|p| matches!(p, Principal::Executor(_)))
                {
                    self.send(p, &nk);
                }
                self.event(Event::KeysRefreshed);
                self.keys_refreshed_for_recovery();
            }
            Err(e) => {
                // Try again shortly; the old keys stay in force meanwhile.
                self.keying.refresh_soon();
                self.keying.refresh_failed(now, &self.cfg);
                self.event(Event::KeyHolderFailed(e.to_string()));
            }
        }
    }

    fn drop_incomplete_certificates(&mut self) {
        // Our own votes stay: they were never received under any key, and the slot's
        // sent_prepare/sent_commit marks say we cast them (peers that dropped them get them
        // again, under the new keys, through status-driven retransmission). Dropping them too
        // left a replica that re-keyed with a batch in flight unable to prepare it: it never
        // votes again, and with another replica away no quorum forms (simulator seed 801
        // under one schedule).
        let (stable, me) = (self.ordering.ckpt_votes.stable_seq(), self.id);
        for slot in self.ordering.order.log.values_mut() {
            if !slot.prepared {
                slot.prepares.retain(|r, _| *r == me);
                slot.doubts.retain(|r, _| *r == me);
            }
            if !slot.committed {
                slot.commits.retain(|r, _| *r == me);
            }
        }
        self.ordering.ckpt_votes.forget_others_above(me, stable);
        self.forget_view_changes_of(None);
        // Prime: acknowledgements and offered copies towards PO certificates not yet formed.
        self.proposals.keys_changed();
        // Ours were never received under any key: send them again under the new ones.
        if !self.views.normal {
            if let Some((vc, _)) = self.views.mine.clone() {
                self.broadcast(&Message::from(vc));
            }
        }
    }

    /// Drops the view-change protocol messages received from replica `r` (or from every
    /// other replica, with `None`) under keys now retired: its VIEW-CHANGEs (and the claims of
    /// views too far ahead to store), the acks it sent and those for its VIEW-CHANGEs, the
    /// copies of its VIEW-CHANGEs relayed by others, and a NEW-VIEW it sent that is still
    /// being checked (BFT-PR §4.5). A replica compromised once could otherwise have planted
    /// messages for a later view that outlive its recovery and, with a second compromised
    /// replica's, put more than f lies into a NEW-VIEW's set. What is still needed comes
    /// again under the new keys (status-driven retransmission).
    pub(super) fn forget_view_changes_of(&mut self, r: Option<ReplicaId>) {
        if self.mutant("keep-view-changes-across-rekey") {
            return;
        }
        let me = self.id;
        let gone = |x: ReplicaId| x != me && r.is_none_or(|r| r == x);
        let dropped = self.views.store.forget(gone);
        self.stats.view_changes_forgotten += dropped as u64;
        self.views.reports.forget(gone);
        if self
            .views
            .pending_nv
            .as_ref()
            .is_some_and(|nv| gone(self.cfg.primary(nv.view)))
        {
            self.views.pending_nv = None;
        }
    }

    /// A NEW-KEY arrived: what needs no key holder is checked here, and a genuine, fresh one
    /// goes to the key holder for admission (its key is installed when the answer comes, see
    /// `on_holder_answer`).
    pub(super) fn on_new_key(&mut self, from: Principal, nk: NewKey) -> Result<(), Reject> {
        if nk.from != from {
            return Err(Reject::Inconsistent);
        }
        let Some(s) = self.auth.session_ref() else {
            return Err(Reject::Unexpected);
        };
        match s.check(&nk).map_err(reject_of)? {
            // A retransmission or a replay of what we installed: nothing to forget.
            Check::Again(_) => Ok(()),
            Check::Admit => {
                if let Some(call) = self.keying.calls.admit(nk, self.now()) {
                    self.out.effects.push(Effect::Holder(call));
                }
                Ok(())
            }
        }
    }

    /// The key holder answered a call of ours.
    pub(super) fn on_holder_answer(&mut self, answer: crate::holder::HolderAnswer) {
        let what = self.keying.calls.answered(answer.id, self.now());
        self.holder_done(what, Some(answer.result));
    }

    /// Gives up the calls the key holder left unanswered too long (see
    /// `crate::holder::CALL_TIMEOUT_MS`), as if they had failed.
    fn expire_holder_calls(&mut self) {
        for what in self.keying.calls.expired(self.now()) {
            self.holder_done(what, None);
        }
    }

    /// A call is done: answered with `result`, or given up (`None`).
    fn holder_done(&mut self, what: Answered, result: Option<HolderResult>) {
        match what {
            Answered::Admission(a) => {
                let (nk, next) = *a;
                if let Some(call) = next {
                    self.out.effects.push(Effect::Holder(call));
                }
                let admitted = HolderResult::admitted(result);
                if let Err(reason) = self.admitted(&nk, admitted) {
                    self.reject(nk.from, "new-key", reason);
                }
                for m in self.keying.calls.release(nk.from) {
                    self.send(nk.from, &m);
                }
                for frame in self.keying.calls.release_in(nk.from) {
                    self.receive_again(&frame);
                }
            }
            Answered::Refresh => self.refreshed(HolderResult::made(result)),
            Answered::Body { client, enc } => self.body_session_answered(client, enc, result),
            Answered::Recovery => self.recovery_signed(result),
            Answered::Fresh => self.state_session_answered(result),
            Answered::State { peer, enc } => self.state_key_answered(peer, enc, result),
            // Replicas sign no checkpoint votes.
            Answered::Vote { .. } => {}
            // Not ours (a call of an earlier life, or given up before the answer came).
            Answered::Unknown => {}
        }
    }

    /// Installs the key of `nk` as the key holder admitted it, and forgets what its sender's
    /// old keys authenticated.
    fn admitted(
        &mut self,
        nk: &NewKey,
        admitted: Result<Admitted, HolderError>,
    ) -> Result<(), Reject> {
        let now = self.now();
        let Some(s) = self.auth.session() else {
            return Err(Reject::Unexpected);
        };
        match s.install(nk, admitted, now).map_err(reject_of)? {
            Accepted::Replica(r) => {
                self.stats.new_keys_accepted += 1;
                self.forget_view_changes_of(Some(r));
            }
            Accepted::Executor(e) => {
                self.stats.new_keys_accepted += 1;
                self.executor_rekeyed(e);
            }
            Accepted::Again(_) => {}
            Accepted::Client(_) => {
                self.stats.new_keys_accepted += 1;
                self.pass_client_key_on(nk);
                // Requests that arrived before the key may verify now.
                self.vouch_late();
                self.vouch_after_leaving(None);
            }
        }
        Ok(())
    }

    /// A replica sent us something we cannot authenticate: it may hold an old key of ours, so
    /// it gets our latest NEW-KEY again (rate-limited per peer).
    pub(super) fn resend_new_key(&mut self, to: Principal) {
        let now = self.now();
        if let Some(nk) = self.keying.new_key_for(&self.auth, to, now) {
            self.send(to, &Message::from(nk));
        }
    }

    /// A request from client `c` did not authenticate: we hold no key of `c` (discarded at a
    /// recovery, or expired), or an older one than it used (its NEW-KEY was lost, or arrived
    /// while this replica was paused). `c` gets our latest NEW-KEY, which tells it to send its
    /// keys again, instead of waiting for its next periodic refresh while this replica cannot
    /// vouch for its requests (a primary that cannot leaves every request to the backups'
    /// relays). Rate-limited per client; the table is bounded. A faulty client or a forger
    /// gets at most one NEW-KEY per client per `CLIENT_KEY_ASK_MS` out of it.
    pub(super) fn ask_for_client_key(&mut self, c: ClientId) {
        let now = self.now();
        let Some(s) = self.auth.session_ref() else {
            return;
        };
        let client = Principal::Client(c);
        if recovery_of(c, self.cfg.n()).is_some()
            || !s.knows(client)
            || self.keying.calls.admitting(client)
        {
            return; // its NEW-KEY is being admitted: the request is vouched for once it is
        }
        let Some(nk) = s.latest().cloned() else {
            return;
        };
        if !self.keying.ask_client(c, now) {
            return;
        }
        self.stats.client_keys_asked += 1;
        self.send(client, &Message::from(nk));
    }

    /// Periodic key work, from `tick`.
    pub(super) fn tick_keys(&mut self) {
        if !self.uses_session_keys() {
            return;
        }
        self.expire_holder_calls();
        let now = self.now();
        if self.keying.refresh_due(now) {
            self.rekey();
        }
        if self.keying.expiry_due(now, &self.cfg) {
            let lifetime = self.cfg.client_key_lifetime_ms;
            if let Some(s) = self.auth.session() {
                s.expire_clients(now, lifetime);
            }
        }
    }
}
