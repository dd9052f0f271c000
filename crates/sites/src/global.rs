//! Global Prime: the core's replica, run by a logical machine as its participant among the
//! sites (ADR 0010, decisions 1, 4 and 6).
//!
//! Each site is one replica of a Prime cluster of N = 3F+1 sites (site j is replica j). The
//! replica is the same pure core every other deployment runs; what changes is how it
//! authenticates and where its time comes from:
//!
//! - **Peers by site signature.** A frame from site j reaches the core only inside a message
//!   site j threshold-signed (checked by the link at local execution), and only if the frame
//!   names replica j as its sender. The core's key table ([`SiteTable`]) therefore accepts
//!   the MACs of replicas and makes none worth checking: the site signature is what
//!   authenticates, and every correct server of a site computes the same (empty) MACs, so
//!   its frames are byte-identical (trap 2).
//! - **Clients by signature.** Clients sign every update; every site checks the signature
//!   against the directory of clients' public keys (no client MAC verifies here), so a faulty
//!   site cannot introduce a correct client's update that the client did not sign.
//! - **Time from local ordering.** The core's clock is the agreed time of the local batch that
//!   ran the event, and its timers are looked at only on a tick the logical machine fired
//!   ([`crate::machine`]); its entropy is drawn from the site and the event count.
//!
//! Limits of this step (ADR 0010 lists them): a site's rows are signed with the site's order
//! key, which every server of the site holds, so one compromised server of a correct site
//! could sign rows for a faulty leader site's matrix; rows proved by the site's threshold
//! signature close that. The core's journal and state live in memory: a server that falls
//! behind its site cannot yet catch up by local state transfer.

use crate::machine::{GlobalOut, Participant};
use crate::SiteId;
use redoubt_core::keys::HolderError;
use redoubt_core::message::Request;
use redoubt_core::message::{frame_sender, RequestSig, SignedRequest};
use redoubt_core::state::PagedState;
use redoubt_core::types::{ClientId, Principal};
use redoubt_core::{
    Auth, Config, Directory, Effect, Env, Event, Input, KeyTable, Message, Replica, Service,
};
use redoubt_crypto::body::{BodyKey, ENC_LEN};
use redoubt_crypto::pk::{HolderSecrets, VerifyKey};
use redoubt_crypto::{Digest, DigestBuilder, Mac, MAC_LEN};
use std::collections::VecDeque;
use std::sync::Arc;

/// Observations kept for the host (executed batches, views); older ones are dropped.
pub const EVENTS_MAX: usize = 4096;

/// The global core's key table: sites authenticate by site signature, clients by signature
/// against the directory.
#[derive(Clone, Debug)]
pub struct SiteTable {
    me: Principal,
    sites: u32,
    directory: Directory,
}

impl SiteTable {
    pub fn new(site: SiteId, sites: usize, directory: Directory) -> SiteTable {
        SiteTable {
            me: Principal::Replica(site.0 as u32),
            sites: sites as u32,
            directory,
        }
    }
}

impl Auth for SiteTable {
    fn me(&self) -> Principal {
        self.me
    }
    fn mac_to(&self, to: Principal, _digest: &Digest) -> Option<Mac> {
        self.knows(to).then_some(Mac([0; MAC_LEN]))
    }
    fn verify_from(&self, from: Principal, _epoch: u32, _digest: &Digest, _mac: &Mac) -> bool {
        // A site's frame arrives only under its site's signature (checked before); a client's
        // MAC is never taken: its signature is checked instead.
        matches!(from, Principal::Replica(r) if r < self.sites)
    }
    fn knows(&self, p: Principal) -> bool {
        match p {
            Principal::Replica(r) => r < self.sites,
            Principal::Client(_) => self.directory.get(p).is_some(),
            _ => false,
        }
    }
}

impl KeyTable for SiteTable {
    fn directory(&self) -> Option<&Directory> {
        Some(&self.directory)
    }
    fn start_body_session(&mut self, _entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        None
    }
    fn open_body_key(
        &mut self,
        _client: ClientId,
        _enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        Ok(None)
    }
    fn start_state_session(&mut self, _entropy: u64) -> Option<([u8; ENC_LEN], BodyKey)> {
        None
    }
    fn open_state_key(
        &mut self,
        _p: Principal,
        _enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        Ok(None)
    }
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GlobalStats {
    /// Frames refused before the core saw them: their sender was not the site that signed
    /// them, or an update's client was not the local client that submitted it.
    pub impostors: u64,
    /// Effects the logical machine has no use for (key-holder calls: the table asks none).
    pub effects_ignored: u64,
}

/// The core's configuration for global Prime among 3F+1 sites, with what sites need of it:
/// Prime ordering, no tentative execution, and every site answering in full (a client hears
/// only its own site: the leader site answers too, and no site leaves the result to another).
pub fn config(big_f: u32) -> Config {
    let mut cfg = Config::new(big_f);
    cfg.ordering = redoubt_core::OrderProtocol::Prime;
    cfg.tentative_execution = false;
    cfg.primary_replies = true;
    cfg.digest_replies = false;
    // The view-change timer is Prime's backstop behind Suspect-Leader. Among sites a request
    // waits for local ordering at both ends, the wide area and, under attack, an INQUIRY's
    // round trip: a site whose timer fires while the others see the leader keep pace is left
    // alone in a later view, and its clients, who talk to it only, go unanswered.
    cfg.view_change_timeout_ms = 5000;
    cfg.view_change_timeout_max_ms = 20000;
    cfg
}

/// Global Prime as a logical machine's participant.
pub struct GlobalPrime<S: Service> {
    site: SiteId,
    core: Replica<S, SiteTable>,
    events: u64,
    observed: VecDeque<Event>,
    stats: GlobalStats,
}

impl<S: Service> GlobalPrime<S> {
    /// Site `site`'s replica of the global Prime cluster `cfg` (n = the number of sites,
    /// ordering Prime), running `service` on `state`. `orders` are the sites' public order
    /// keys, `order_key` this site's.
    pub fn new(
        cfg: Config,
        site: SiteId,
        directory: Directory,
        service: S,
        state: PagedState,
        orders: Arc<Vec<VerifyKey>>,
        order_key: HolderSecrets,
    ) -> Result<Self, String> {
        cfg.validate()?;
        if !cfg.prime() || !cfg.primary_replies || cfg.digest_replies {
            return Err(
                "the global protocol among sites is Prime, and every site answers in \
                 full (see `global::config`)"
                    .into(),
            );
        }
        if site.0 as u32 >= cfg.n() || orders.len() != cfg.n() as usize {
            return Err(format!(
                "{site} and {} order keys do not fit {} sites",
                orders.len(),
                cfg.n()
            ));
        }
        let table = SiteTable::new(site, cfg.n() as usize, directory);
        let core =
            Replica::new(cfg, site.0 as u32, table, service, state).with_prime(orders, order_key);
        Ok(GlobalPrime {
            site,
            core,
            events: 0,
            observed: VecDeque::new(),
            stats: GlobalStats::default(),
        })
    }

    pub fn core(&self) -> &Replica<S, SiteTable> {
        &self.core
    }
    pub fn stats(&self) -> &GlobalStats {
        &self.stats
    }
    /// What the core reported since the last call (executed batches, views entered ...).
    pub fn take_observed(&mut self) -> Vec<Event> {
        self.observed.drain(..).collect()
    }

    fn env(&mut self, now_ms: u64) -> Env {
        self.events += 1;
        let d = DigestBuilder::new("redoubt.site.entropy.v1")
            .u64(self.site.0 as u64)
            .u64(self.events)
            .finish();
        Env {
            now_ms,
            entropy: u64::from_le_bytes(d.0[..8].try_into().expect("8 bytes")),
        }
    }

    /// One input, then the end of the turn (Prime sends what the turn asked for at its end).
    fn run(&mut self, now_ms: u64, input: Input<'_>) -> Vec<GlobalOut> {
        let env = self.env(now_ms);
        let mut effects = self.core.handle(env, input);
        self.core.handle_into(env, Input::Idle, &mut effects);
        let mut outs = Vec::new();
        for e in effects {
            match e {
                Effect::Send {
                    to: Principal::Replica(j),
                    bytes,
                } => outs.push(GlobalOut::Send {
                    to: SiteId(j as u16),
                    body: bytes.to_vec(),
                }),
                Effect::Send {
                    to: Principal::Client(c),
                    bytes,
                } => outs.push(GlobalOut::Reply {
                    client: c,
                    body: bytes.to_vec(),
                }),
                Effect::Broadcast { bytes } => outs.push(GlobalOut::Broadcast {
                    body: bytes.to_vec(),
                }),
                Effect::Event(ev) => {
                    if self.observed.len() >= EVENTS_MAX {
                        self.observed.pop_front();
                    }
                    self.observed.push_back(ev);
                }
                // The logical machine's durability is its local ordering's; the core's
                // records and state commits have nowhere else to go (see the module's
                // limits).
                Effect::Persist(_) | Effect::CommitState(_) => {}
                Effect::Send { .. } | Effect::Holder(_) => self.stats.effects_ignored += 1,
            }
        }
        outs
    }
}

impl<S: Service> Participant for GlobalPrime<S> {
    fn on_message(&mut self, now_ms: u64, site: SiteId, body: &[u8]) -> Vec<GlobalOut> {
        if frame_sender(body) != Some(Principal::Replica(site.0 as u32)) {
            self.stats.impostors += 1;
            return Vec::new();
        }
        self.run(now_ms, Input::Receive(body))
    }
    fn on_tick(&mut self, now_ms: u64) -> Vec<GlobalOut> {
        self.run(now_ms, Input::Tick)
    }
    fn on_update(&mut self, now_ms: u64, client: u64, update: &[u8]) -> Vec<GlobalOut> {
        if frame_sender(update) != Some(Principal::Client(client as ClientId)) {
            self.stats.impostors += 1;
            return Vec::new();
        }
        self.run(now_ms, Input::Receive(update))
    }
}

/// A client's update for global Prime: its request signed with its key (`counter` counts its
/// signatures), in the frame its site's servers order locally and the logical machine hands
/// to the core.
pub fn update_frame(
    client: ClientId,
    timestamp: u64,
    op: Vec<u8>,
    key: &HolderSecrets,
    counter: u64,
    sites: u32,
) -> Vec<u8> {
    let request = Request {
        client,
        timestamp,
        read_only: false,
        op: op.into(),
    };
    let digest = request.digest();
    let statement = redoubt_core::keys::holder_statement(
        redoubt_core::keys::Purpose::Request,
        Principal::Client(client),
        counter,
        &digest,
    );
    let sr = SignedRequest {
        request,
        auth: Arc::from(vec![Mac([0; MAC_LEN]); sites as usize]),
        sig: Some(RequestSig {
            counter,
            sig: key.sign(&statement.0),
        }),
    };
    let stamp = SiteTable {
        me: Principal::Client(client),
        sites,
        directory: Directory::default(),
    };
    redoubt_core::seal::seal(&stamp, &Message::from(sr), None, sites)
}

/// The answer inside a reply frame the global core sent a client, if it is one.
pub fn reply_of(frame: &[u8]) -> Option<(ClientId, u64, Vec<u8>)> {
    let f = redoubt_core::message::decode_frame(frame, 1 << 24).ok()?;
    match redoubt_core::message::decode_body(&f.body).ok()? {
        Message::Client(redoubt_core::message::ClientMessage::Reply(r)) => {
            Some((r.client, r.timestamp, r.result.to_vec()))
        }
        _ => None,
    }
}
