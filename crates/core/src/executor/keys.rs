//! An execution node's session keys: its refreshes and its admissions of peers' NEW-KEYs,
//! asked of the key holder through effects (see `crate::holder`).

use super::*;
use crate::holder::HolderResult;
use crate::keys::HolderError;

impl<S: Service, A: KeyTable> Executor<S, A> {
    /// The key holder answered a call of ours: a NEW-KEY's key is installed, or our own
    /// refresh goes out.
    pub(super) fn on_holder_answer(&mut self, answer: crate::holder::HolderAnswer) {
        let what = self.keying.calls.answered(answer.id, self.env.now_ms);
        self.holder_done(what, Some(answer.result));
    }

    /// A call is done: answered with `result`, or given up (`None`, see
    /// `crate::holder::CALL_TIMEOUT_MS`).
    fn holder_done(&mut self, what: crate::holder::Answered, result: Option<HolderResult>) {
        use crate::holder::Answered;
        match what {
            Answered::Admission(a) => {
                let (nk, next) = *a;
                if let Some(call) = next {
                    self.effects.push(Effect::Holder(call));
                }
                let admitted = HolderResult::admitted(result);
                let Some(s) = self.auth.session() else {
                    return;
                };
                match s.install(&nk, admitted, self.env.now_ms) {
                    Ok(Accepted::Replica(r)) => {
                        // What it sent before may have been sent while it was compromised.
                        self.orders.forget_from(r);
                    }
                    Ok(Accepted::Client(_) | Accepted::Executor(_) | Accepted::Again(_)) => {}
                    Err(e) => self.reject(nk.from, "new-key", crate::holder::reject_of(e)),
                }
                for m in self.keying.calls.release(nk.from) {
                    self.send(nk.from, &m);
                }
            }
            Answered::Refresh => self.refreshed(HolderResult::made(result)),
            Answered::Body { client, enc } => {
                match self
                    .keying
                    .body_session_answered(&mut self.exec, client, enc, result)
                {
                    Ok(()) => {
                        self.stats.body_sessions_opened += 1;
                        self.try_execute();
                    }
                    Err(e) => self.event(Event::KeyHolderFailed(e.to_string())),
                }
            }
            Answered::Vote { seq, digest } => self.vote_signed(seq, digest, result),
            Answered::Fresh => self.state_session_answered(result),
            Answered::State { peer, enc } => self.state_key_answered(peer, enc, result),
            // Execution nodes sign no recovery requests; `Unknown`: not ours.
            Answered::Recovery | Answered::Unknown => {}
        }
    }

    /// With session keys: fresh keys for the replicas and the other execution nodes every
    /// `key_refresh_ms` (BFT-PR §4.1), asked of the key holder (sent when it answers, see
    /// `refreshed`); clients' keys expire when not refreshed.
    pub(super) fn tick_keys(&mut self) {
        let now = self.env.now_ms;
        for what in self.keying.calls.expired(now) {
            self.holder_done(what, None);
        }
        if self.auth.session_ref().is_none() || !self.keying.refresh_due(now) {
            return;
        }
        let peers = self.key_peers();
        let lifetime = self.cfg.client_key_lifetime_ms;
        let Some(s) = self.auth.session() else {
            return;
        };
        s.expire_clients(now, lifetime);
        if self.keying.calls.refreshing() {
            return;
        }
        let request = s.refresh_request(&peers);
        if let Some(call) = self.keying.calls.refresh(request, now) {
            self.effects.push(Effect::Holder(call));
        }
    }

    /// Who our NEW-KEYs go to: the replicas and the other execution nodes; behind a firewall
    /// only the peers (nothing of ours reaches the agreement nodes but signature shares).
    fn key_peers(&self) -> Vec<Principal> {
        let me = self.id;
        let replicas = if self.cfg.firewall() { 0 } else { self.cfg.n() };
        (0..replicas)
            .map(Principal::Replica)
            .chain(
                (0..self.cfg.executors)
                    .filter(|e| *e != me)
                    .map(Principal::Executor),
            )
            .collect()
    }

    /// The key holder answered our refresh: the fresh keys are installed and the NEW-KEY goes
    /// out.
    fn refreshed(
        &mut self,
        made: Result<(NewKey, Vec<(Principal, redoubt_crypto::MacKey)>), HolderError>,
    ) {
        let now = self.env.now_ms;
        let Some(s) = self.auth.session() else {
            return;
        };
        match made {
            Ok((nk, fresh)) => {
                s.install_refresh(nk.clone(), fresh);
                self.keying.refreshed(now, &self.cfg);
                self.stats.key_refreshes += 1;
                let m = Message::from(nk);
                for p in self.key_peers() {
                    self.send(p, &m);
                }
                self.event(Event::KeysRefreshed);
            }
            Err(e) => {
                self.keying.refresh_failed(now, &self.cfg);
                self.event(Event::KeyHolderFailed(e.to_string()));
            }
        }
    }
}
