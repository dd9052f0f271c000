//! Session keys at a replica (BFT-PR §4.1, §4.5): periodic refresh by NEW-KEY and the
//! freshness rule, admitting peers' NEW-KEYs, resending our latest one to a peer that cannot
//! authenticate us, asking clients whose keys we lack for theirs. When and to whom is kept
//! by `crate::keying`.

use super::recovery::recovery_of;
use super::*;
use crate::keys::{Accepted, NewKeyError};

impl<S: Service, A: KeyTable> Replica<S, A> {
    // ----- session keys -----------------------------------------------------------------------

    /// Whether this replica uses session keys (NEW-KEY) rather than static keys.
    pub fn uses_session_keys(&self) -> bool {
        self.auth.session_ref().is_some()
    }

    /// Sends a NEW-KEY with fresh keys for every other replica. Applies the freshness rule:
    /// certificates not yet complete are dropped, since their messages were authenticated
    /// with keys now retired (peers retransmit what is still needed).
    pub(super) fn rekey(&mut self) {
        if self.out.replaying {
            self.keying.refresh_soon();
            return;
        }
        // Separated: the execution nodes get our keys too (they send us acknowledgements);
        // behind a firewall they send us nothing but certificates, and are out of reach.
        let executors = if self.cfg.firewall() {
            0
        } else {
            self.cfg.executors
        };
        let peers: Vec<Principal> = (0..self.cfg.n())
            .filter(|r| *r != self.id)
            .map(Principal::Replica)
            .chain((0..executors).map(Principal::Executor))
            .collect();
        let now = self.now();
        let Some(s) = self.auth.session() else {
            return;
        };
        match s.refresh(&peers) {
            Ok(nk) => {
                self.keying.refreshed(now, &self.cfg);
                self.stats.key_refreshes += 1;
                self.drop_incomplete_certificates();
                let nk = Message::NewKey(nk);
                self.broadcast(&nk);
                for e in 0..executors {
                    self.send(Principal::Executor(e), &nk);
                }
                self.event(Event::KeysRefreshed);
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
        if let Some(p) = self.prime.as_mut() {
            p.po.drop_uncertified_votes();
        }
        // Ours were never received under any key: send them again under the new ones.
        if !self.views.normal {
            if let Some((vc, _)) = self.views.mine.clone() {
                self.broadcast(&Message::ViewChange(vc));
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

    pub(super) fn on_new_key(&mut self, from: Principal, nk: NewKey) -> Result<(), Reject> {
        if nk.from != from {
            return Err(Reject::Inconsistent);
        }
        let now = self.now();
        let Some(s) = self.auth.session() else {
            return Err(Reject::Unexpected);
        };
        match s.accept(&nk, now) {
            Ok(Accepted::Replica(r)) => {
                self.stats.new_keys_accepted += 1;
                self.forget_view_changes_of(Some(r));
                Ok(())
            }
            Ok(Accepted::Executor(e)) => {
                self.stats.new_keys_accepted += 1;
                self.executor_rekeyed(e);
                Ok(())
            }
            // A retransmission or a replay of what we installed: nothing to forget.
            Ok(Accepted::Again(_)) => Ok(()),
            Ok(Accepted::Client(_)) => {
                self.stats.new_keys_accepted += 1;
                self.pass_client_key_on(&nk);
                // Requests that arrived before the key may verify now.
                self.vouch_late();
                self.vouch_after_leaving(None);
                Ok(())
            }
            Err(NewKeyError::Stale) => Err(Reject::Stale),
            Err(NewKeyError::BadSignature) => Err(Reject::BadSignature),
            Err(NewKeyError::UnknownSender) => Err(Reject::UnknownSender),
            Err(NewKeyError::NoKey) => Err(Reject::Inconsistent),
            Err(NewKeyError::Holder) => Err(Reject::KeyHolder),
        }
    }

    /// A replica sent us something we cannot authenticate: it may hold an old key of ours, so
    /// it gets our latest NEW-KEY again (rate-limited per peer).
    pub(super) fn resend_new_key(&mut self, to: Principal) {
        let now = self.now();
        if let Some(nk) = self.keying.new_key_for(&self.auth, to, now) {
            self.send(to, &Message::NewKey(nk));
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
        if recovery_of(c, self.cfg.n()).is_some() || !s.knows(client) {
            return;
        }
        let Some(nk) = s.latest().cloned() else {
            return;
        };
        if !self.keying.ask_client(c, now) {
            return;
        }
        self.stats.client_keys_asked += 1;
        self.send(client, &Message::NewKey(nk));
    }

    /// Periodic key work, from `tick`.
    pub(super) fn tick_keys(&mut self) {
        if !self.uses_session_keys() {
            return;
        }
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
