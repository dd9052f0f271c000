//! What a replica and an execution node keep about their session keys besides the key table
//! (BFT-PR §4.1): when their next NEW-KEY is due, to whom their latest one went again, which
//! clients were asked for keys, and the state sessions that seal state transfers under
//! confidential bodies (ours while fetching, each peer's we serve). The key table and the key
//! holder do the cryptography; this component decides when and remembers what.
//!
//! Bounds: one resend time per principal that reached us, at most [`CLIENT_KEY_ASKED_MAX`]
//! clients asked, one served state session and one FETCH waiting for it per peer.

use crate::effect::{Effect, Event};
use crate::execution::Execution;
use crate::holder::{HolderCall, HolderResult};
use crate::keys::{HolderError, KeyTable, NewKey};
use crate::message::{Fetch, Reject, Request, StateData};
use crate::service::Service;
use crate::types::{ClientId, Config, Principal};
use redoubt_crypto::body::{BodyKey, ENC_LEN};
use std::collections::BTreeMap;

/// How often a peer that cannot authenticate us gets our latest NEW-KEY again (ms).
const NEW_KEY_RESEND_MS: u64 = 500;
/// How often a client whose key we lack is asked for it again (ms), and for how many clients
/// at most the time of the last ask is remembered.
const CLIENT_KEY_ASK_MS: u64 = 500;
const CLIENT_KEY_ASKED_MAX: usize = 4096;

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Keying {
    /// A refresh is due now (it failed, or something changed the keys' users).
    rekey_due: bool,
    next_rekey_ms: u64,
    next_key_expiry_ms: u64,
    new_key_resent: BTreeMap<Principal, u64>,
    client_key_asked: BTreeMap<ClientId, u64>,
    /// Our state session for the transfer under way.
    ours: Option<([u8; ENC_LEN], BodyKey)>,
    /// The state session of each peer we serve.
    served: BTreeMap<Principal, ([u8; ENC_LEN], Option<BodyKey>)>,
    /// Per peer, the FETCH that waits for the key holder to open the peer's state session
    /// (answered once it did; at most one per peer, the latest).
    fetch_waiting: BTreeMap<Principal, Fetch>,
    /// The key holder failed to open a body session: execution waits, retried on the next
    /// tick.
    sessions_retry: bool,
    /// Calls to the key holder in flight: peers' NEW-KEYs, our refresh (`crate::holder`).
    pub(crate) calls: crate::holder::Calls,
}

/// Where a request's body session stands (see [`Keying::body_session`]).
pub(crate) enum Session {
    /// Its key is known: the request may run (`opened`: learnt just now).
    Ready { opened: bool },
    /// Asked of the key holder (the call to hand the host, unless one for this client is in
    /// flight already): the request waits for the answer.
    Asked(Option<HolderCall>),
    /// The key holder failed: retried on the next tick.
    Failed(HolderError),
}

impl Keying {
    // ----- refreshing our keys ----------------------------------------------------------------

    /// Whether our keys are due for a refresh at `now`.
    pub(crate) fn refresh_due(&self, now: u64) -> bool {
        self.rekey_due || now >= self.next_rekey_ms
    }

    /// A refresh is due at the next opportunity.
    pub(crate) fn refresh_soon(&mut self) {
        self.rekey_due = true;
    }

    /// Our keys were refreshed at `now`: the next refresh is a refresh period away.
    pub(crate) fn refreshed(&mut self, now: u64, cfg: &Config) {
        self.rekey_due = false;
        self.next_rekey_ms = now + cfg.key_refresh_ms;
    }

    /// The key holder could not refresh our keys: tried again shortly (the old keys stay in
    /// force meanwhile).
    pub(crate) fn refresh_failed(&mut self, now: u64, cfg: &Config) {
        self.next_rekey_ms = now + cfg.status_interval_ms * 10;
    }

    /// Whether clients' keys are due to be checked for expiry at `now` (every ten status
    /// intervals); the next check is scheduled if so.
    pub(crate) fn expiry_due(&mut self, now: u64, cfg: &Config) -> bool {
        if now < self.next_key_expiry_ms {
            return false;
        }
        self.next_key_expiry_ms = now + cfg.status_interval_ms * 10;
        true
    }

    /// Our latest NEW-KEY, to send again to `to` (which could not authenticate us), unless
    /// it went there less than [`NEW_KEY_RESEND_MS`] ago.
    pub(crate) fn new_key_for(
        &mut self,
        auth: &impl KeyTable,
        to: Principal,
        now: u64,
    ) -> Option<NewKey> {
        if self
            .new_key_resent
            .get(&to)
            .is_some_and(|t| now < t + NEW_KEY_RESEND_MS)
        {
            return None;
        }
        let nk = auth.session_ref().and_then(|s| s.latest()).cloned()?;
        self.new_key_resent.insert(to, now);
        Some(nk)
    }

    /// Whether client `c` may be asked for its keys at `now` (rate-limited per client; the
    /// table bounded); recorded as asked if so.
    pub(crate) fn ask_client(&mut self, c: ClientId, now: u64) -> bool {
        if self
            .client_key_asked
            .get(&c)
            .is_some_and(|t| now < t + CLIENT_KEY_ASK_MS)
        {
            return false;
        }
        if self.client_key_asked.len() >= CLIENT_KEY_ASKED_MAX {
            self.client_key_asked
                .retain(|_, t| now < *t + CLIENT_KEY_ASK_MS);
            if self.client_key_asked.len() >= CLIENT_KEY_ASKED_MAX {
                return false;
            }
        }
        self.client_key_asked.insert(c, now);
        true
    }

    // ----- body sessions ----------------------------------------------------------------------

    /// The key holder failed to open a body session: execution is retried on the next tick.
    pub(crate) fn retry_sessions(&mut self) {
        self.sessions_retry = true;
    }

    /// Whether execution waits for a retry (cleared).
    pub(crate) fn take_sessions_retry(&mut self) -> bool {
        std::mem::take(&mut self.sessions_retry)
    }

    /// Where the body session `req` was sealed in stands for `exec`: known (or bodies in
    /// clear), opened now, or asked of the key holder. It is opened at once (`at_once`, while
    /// replaying the journal) or where no key holder is behind `auth` (static keys: the
    /// executors' secret is at hand); otherwise the call leaves as an effect and the request
    /// waits for its answer ([`Keying::body_session_answered`]).
    pub(crate) fn body_session<S: Service>(
        &mut self,
        exec: &mut Execution<S>,
        auth: &mut impl KeyTable,
        req: &Request,
        now: u64,
        at_once: bool,
    ) -> Session {
        let Some(enc) = exec.session_wanted(req) else {
            return Session::Ready { opened: false };
        };
        if at_once || auth.session_ref().is_none() {
            return match auth.open_body_key(req.client, &enc) {
                Ok(key) => {
                    exec.learn_session(req.client, enc, key);
                    Session::Ready { opened: true }
                }
                Err(e) => {
                    self.retry_sessions();
                    Session::Failed(e)
                }
            };
        }
        Session::Asked(self.calls.open_body(req.client, enc, now))
    }

    /// The key holder answered (or, `None`, did not in time) the call opening `client`'s body
    /// session `enc`: the key is learnt by `exec`; an error is retried on the next tick.
    pub(crate) fn body_session_answered<S: Service>(
        &mut self,
        exec: &mut Execution<S>,
        client: ClientId,
        enc: [u8; ENC_LEN],
        result: Option<HolderResult>,
    ) -> Result<(), HolderError> {
        match HolderResult::body_key(result) {
            Ok(key) => {
                exec.learn_session(client, enc, key);
                Ok(())
            }
            Err(e) => {
                self.retry_sessions();
                Err(e)
            }
        }
    }

    // ----- state sessions ---------------------------------------------------------------------

    /// A transfer begins: it gets a new state session.
    pub(crate) fn new_transfer(&mut self) {
        self.ours = None;
    }

    /// Our state session for the transfer under way, started on first use: at once where no
    /// key holder is behind `auth` (static keys), otherwise with fresh randomness asked of the
    /// key holder (the call goes into `out`; [`Keying::state_session_answered`]). Its
    /// encapsulation, or `None` while asked or if the key holder failed (reported in `out`).
    pub(crate) fn state_session(
        &mut self,
        auth: &mut impl KeyTable,
        entropy: u64,
        now: u64,
        out: &mut Vec<Effect>,
    ) -> Option<[u8; ENC_LEN]> {
        if self.ours.is_none() {
            if auth.session_ref().is_some() {
                out.extend(self.calls.draw_fresh(now).map(Effect::Holder));
                return None;
            }
            self.ours = auth.start_state_session(entropy);
            if self.ours.is_none() {
                out.push(Effect::Event(Event::KeyHolderFailed(
                    "cannot start a state session with the executors".into(),
                )));
            }
        }
        self.ours.as_ref().map(|(enc, _)| *enc)
    }

    /// The key holder answered (or, `None`, did not in time) the call for our state
    /// session's randomness: whether the session is made (the FETCH waiting for it may go
    /// out); a failure is reported in `out`.
    pub(crate) fn state_session_answered(
        &mut self,
        auth: &impl KeyTable,
        entropy: u64,
        result: Option<HolderResult>,
        out: &mut Vec<Effect>,
    ) -> bool {
        let made = HolderResult::fresh(result).map(|ikm| {
            if self.ours.is_none() {
                self.ours = auth
                    .session_ref()
                    .and_then(|s| s.establish_state(ikm, entropy));
            }
        });
        match (made, &self.ours) {
            (Ok(()), Some(_)) => true,
            (Err(e), _) => {
                out.push(Effect::Event(Event::KeyHolderFailed(e.to_string())));
                false
            }
            (Ok(()), None) => {
                out.push(Effect::Event(Event::KeyHolderFailed(
                    "no executors' public key to seal a state session to".into(),
                )));
                false
            }
        }
    }

    /// The key of `peer`'s state session named in `fetch`, for sealing what we serve it
    /// (`peer` is authenticated: one entry per peer): known, opened at once where no key
    /// holder is behind `auth`, or asked of the key holder (`None`: the call goes into `out`
    /// and `fetch` waits for the answer, [`Keying::state_key_answered`]). A failure of the
    /// key holder is reported in `out`.
    pub(crate) fn state_key(
        &mut self,
        auth: &mut impl KeyTable,
        peer: Principal,
        fetch: &Fetch,
        now: u64,
        out: &mut Vec<Effect>,
    ) -> Result<Option<BodyKey>, Reject> {
        let enc = fetch.session.ok_or(Reject::BadState)?;
        let key = match self.served.get(&peer) {
            Some((known, key)) if *known == enc => key.clone(),
            _ if auth.session_ref().is_some() => {
                self.fetch_waiting.insert(peer, fetch.clone());
                out.extend(self.calls.open_state(peer, enc, now).map(Effect::Holder));
                return Ok(None);
            }
            _ => match auth.open_state_key(peer, &enc) {
                Ok(key) => {
                    self.served.insert(peer, (enc, key.clone()));
                    key
                }
                Err(e) => {
                    out.push(Effect::Event(Event::KeyHolderFailed(e.to_string())));
                    return Err(Reject::KeyHolder);
                }
            },
        };
        key.map(Some).ok_or(Reject::BadState)
    }

    /// The key holder answered (or, `None`, did not in time) the call opening `peer`'s state
    /// session `enc`: the key is kept, and the FETCH that waited for it is handed back to be
    /// answered (a failure, reported in `out`, drops it: the peer asks again).
    pub(crate) fn state_key_answered(
        &mut self,
        peer: Principal,
        enc: [u8; ENC_LEN],
        result: Option<HolderResult>,
        out: &mut Vec<Effect>,
    ) -> Option<Fetch> {
        let waiting = self.fetch_waiting.remove(&peer);
        match HolderResult::body_key(result) {
            Ok(key) => {
                self.served.insert(peer, (enc, key));
                waiting
            }
            Err(e) => {
                out.push(Effect::Event(Event::KeyHolderFailed(e.to_string())));
                None
            }
        }
    }

    /// Checks the calls in flight (for a node whose session keys are `keys`) and that every
    /// FETCH waiting for a peer's state session has its call in flight (answers and expiries
    /// take both away): one per peer.
    pub(crate) fn check_invariants(
        &self,
        keys: Option<&crate::keys::SessionKeys>,
    ) -> Result<(), String> {
        self.calls.check_with(keys)?;
        match self
            .fetch_waiting
            .keys()
            .find(|p| !self.calls.opening_state(**p))
        {
            Some(p) => Err(format!(
                "a FETCH of {p} waits for a state session nobody opens"
            )),
            None => Ok(()),
        }
    }

    /// Opens a sealed answer to our FETCH in place (an unsealed one is refused; none is
    /// expected without a session of ours).
    pub(crate) fn open_state(&self, d: &mut StateData) -> Result<(), Reject> {
        let key = self
            .ours
            .as_ref()
            .map(|(_, key)| key)
            .ok_or(Reject::Unexpected)?;
        crate::transfer::open_answer(key, d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_asked_at_most_once_per_interval_and_the_table_stays_bounded() {
        let mut k = Keying::default();
        assert!(k.ask_client(7, 1_000));
        assert!(!k.ask_client(7, 1_000 + CLIENT_KEY_ASK_MS - 1));
        assert!(k.ask_client(7, 1_000 + CLIENT_KEY_ASK_MS));
        for c in 0..CLIENT_KEY_ASKED_MAX as u64 {
            k.ask_client(1_000_000 + c, 5_000);
        }
        assert!(k.client_key_asked.len() <= CLIENT_KEY_ASKED_MAX);
        assert!(!k.ask_client(99, 5_000), "full of recent asks: refused");
        assert!(
            k.ask_client(99, 5_000 + CLIENT_KEY_ASK_MS),
            "old asks make room"
        );
        assert!(k.client_key_asked.len() <= CLIENT_KEY_ASKED_MAX);
    }

    #[test]
    fn refreshes_are_due_on_time_or_when_asked_for() {
        let cfg = Config::new(1);
        let mut k = Keying::default();
        assert!(k.refresh_due(0));
        k.refreshed(10, &cfg);
        assert!(!k.refresh_due(10 + cfg.key_refresh_ms - 1));
        assert!(k.refresh_due(10 + cfg.key_refresh_ms));
        k.refresh_soon();
        assert!(k.refresh_due(11), "a refresh asked for is due at once");
        k.refresh_failed(11, &cfg);
        assert!(k.refresh_due(12), "still due after a failure");
        assert!(k.expiry_due(0, &cfg) && !k.expiry_due(1, &cfg));
    }
}
