//! An in-memory cluster of n = 3f+1 replicas and some clients over an explicit network.
//!
//! Replicas and clients are *live* (the core's state machines, driven through `handle`,
//! `receive`, `tick`) or *scripted* (only their keys: the test speaks for them with
//! [`Cluster::receive`] or [`Cluster::send`], so they can be Byzantine, silent or lagging).
//! Every frame sent is decoded, logged ([`Cluster::sent`]) and queued ([`Cluster::pending`]);
//! nothing moves until the test delivers it ([`Cluster::deliver_all`], [`Cluster::deliver`],
//! [`Cluster::deliver_next`]) or runs the clock ([`Cluster::run`], [`Cluster::run_until`]).
//! Blocking rules ([`Cluster::block`], [`Cluster::partition`], [`Cluster::isolate`]) drop the
//! frames they match at delivery. Time is virtual: [`Cluster::now`] moves only when the test
//! says so.

use super::{fresh_store, view_change, KeyMode, Keyring, Out, Svc, Wire};
use redoubt_core::keys::{Accepted, NewKeyError, Purpose};
use redoubt_core::message::*;
use redoubt_core::seal::{request_authenticator, seal};
use redoubt_core::*;
use redoubt_crypto::Digest;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub type Rep = Replica<Svc, Keys>;

/// Frames delivered by one `deliver_all` before it declares a message storm.
const DELIVERIES_MAX: usize = 1_000_000;

enum Node {
    Live(Box<Rep>),
    Scripted(Box<Keys>),
}

enum ClientNode {
    Live(Box<Client<Keys>>),
    Scripted(Box<Keys>),
}

/// A frame on the network.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub from: Principal,
    pub to: Principal,
    /// When it was sent (virtual ms).
    pub at: u64,
    pub msg: Message,
    pub bytes: Bytes,
}

impl Envelope {
    pub fn kind(&self) -> &'static str {
        self.msg.kind()
    }
    /// Whether it goes between replicas `a` and `b`, either way.
    pub fn between(&self, a: ReplicaId, b: ReplicaId) -> bool {
        let (x, y) = (Principal::Replica(a), Principal::Replica(b));
        (self.from == x && self.to == y) || (self.from == y && self.to == x)
    }
}

/// A blocking rule, to lift with [`Cluster::unblock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule(usize);

type Pred = Box<dyn Fn(&Envelope) -> bool>;

/// A NEW-KEY a scripted node was delivered: its sender, and whether the node took it.
pub type KeyOutcome = (Principal, Result<Accepted, NewKeyError>);

pub struct Builder {
    f: u32,
    mode: KeyMode,
    scripted: BTreeSet<ReplicaId>,
    clients: BTreeSet<ClientId>,
    live_clients: BTreeSet<ClientId>,
    cfg: Config,
    step_ms: u64,
}

impl Builder {
    /// Session keys instead of static ones.
    pub fn session_keys(mut self) -> Self {
        self.mode = KeyMode::Session;
        self
    }
    /// Replicas the test speaks for (the others are live).
    pub fn scripted(mut self, ids: impl IntoIterator<Item = ReplicaId>) -> Self {
        self.scripted.extend(ids);
        self
    }
    /// The live replicas (every other one is scripted).
    pub fn live(mut self, ids: impl IntoIterator<Item = ReplicaId>) -> Self {
        let live: BTreeSet<ReplicaId> = ids.into_iter().collect();
        self.scripted = (0..self.cfg.n()).filter(|r| !live.contains(r)).collect();
        self
    }
    /// The scripted clients (instead of 7, 8 and 9).
    pub fn clients(mut self, ids: impl IntoIterator<Item = ClientId>) -> Self {
        self.clients = ids.into_iter().collect();
        self
    }
    /// A live client (a [`Client`] state machine).
    pub fn live_client(mut self, id: ClientId) -> Self {
        self.live_clients.insert(id);
        self
    }
    /// Prime orders requests (with session keys, as a Prime deployment runs): every replica
    /// gets its order key, dealt from a seed as `redoubt init --ordering prime` deals them.
    pub fn prime(mut self) -> Self {
        self.mode = KeyMode::Session;
        self.cfg.ordering = OrderProtocol::Prime;
        self.cfg.tentative_execution = false;
        self.cfg.primary_replies = false;
        self
    }
    pub fn config(mut self, tune: impl FnOnce(&mut Config)) -> Self {
        tune(&mut self.cfg);
        self
    }
    /// The clock step of [`Cluster::run`] (10 ms by default).
    pub fn step_ms(mut self, ms: u64) -> Self {
        self.step_ms = ms;
        self
    }

    pub fn build(self) -> Cluster {
        let n = self.cfg.n();
        let all_clients: BTreeSet<ClientId> =
            self.clients.union(&self.live_clients).copied().collect();
        let mut keyring = Keyring::new(self.mode, n, all_clients.iter().copied());
        let order_keys: Vec<redoubt_crypto::pk::HolderSecrets> = (0..n)
            .map(|r| redoubt_crypto::pk::HolderSecrets::from_seed(&[0x50 + r as u8; 32]))
            .collect();
        let orders = std::sync::Arc::new(
            order_keys
                .iter()
                .map(|k| k.public().verify)
                .collect::<Vec<_>>(),
        );
        let mut stores = Vec::new();
        let replicas = (0..n)
            .map(|i| {
                let keys = keyring.keys(Principal::Replica(i));
                let (store, st) = fresh_store();
                stores.push(store);
                if self.scripted.contains(&i) {
                    Node::Scripted(Box::new(keys))
                } else {
                    let mut r = Replica::new(self.cfg.clone(), i, keys, Svc::default(), st);
                    if self.cfg.prime() {
                        r = r.with_prime(orders.clone(), order_keys[i as usize].clone());
                    }
                    Node::Live(Box::new(r))
                }
            })
            .collect();
        let clients = all_clients
            .iter()
            .map(|c| {
                let keys = keyring.keys(Principal::Client(*c));
                let node = if self.live_clients.contains(c) {
                    let timing = ClientTiming::default();
                    ClientNode::Live(Box::new(Client::new(self.cfg.clone(), timing, *c, keys)))
                } else {
                    ClientNode::Scripted(Box::new(keys))
                };
                (*c, node)
            })
            .collect();
        let prime_keys = self.cfg.prime().then_some((orders, order_keys));
        Cluster {
            f: self.f,
            cfg: self.cfg,
            now: 0,
            step_ms: self.step_ms,
            keyring,
            replicas,
            clients,
            pending: VecDeque::new(),
            sent: Vec::new(),
            dropped: Vec::new(),
            rules: Vec::new(),
            events: Vec::new(),
            journals: vec![Vec::new(); n as usize],
            stores,
            completions: Vec::new(),
            accepted: Vec::new(),
            prime_keys,
            holding: BTreeMap::new(),
            held: Vec::new(),
        }
    }
}

pub struct Cluster {
    pub f: u32,
    /// Every replica's and client's configuration.
    pub cfg: Config,
    /// Virtual time (ms).
    pub now: u64,
    pub step_ms: u64,
    pub keyring: Keyring,
    replicas: Vec<Node>,
    clients: BTreeMap<ClientId, ClientNode>,
    pending: VecDeque<Envelope>,
    sent: Vec<Envelope>,
    dropped: Vec<Envelope>,
    rules: Vec<Option<Pred>>,
    events: Vec<(ReplicaId, Event)>,
    journals: Vec<Vec<Record>>,
    /// Each replica's page store, to which its state commits are written.
    stores: Vec<state::MemStore>,
    completions: Vec<(ClientId, Completion)>,
    /// NEW-KEYs scripted nodes took: (receiver, (sender, outcome)).
    accepted: Vec<(Principal, KeyOutcome)>,
    /// Prime: the replicas' public order keys and each one's own, given again at a restart.
    prime_keys: Option<PrimeKeys>,
    /// Replicas whose key holder keeps its answers back (see [`Cluster::hold_key_holder`]),
    /// and the calls it holds.
    /// Replicas whose key holders keep answers back: to the calls the function picks.
    holding: BTreeMap<ReplicaId, fn(&HolderCall) -> bool>,
    held: Vec<(ReplicaId, HolderCall)>,
}

type PrimeKeys = (
    std::sync::Arc<Vec<redoubt_crypto::pk::VerifyKey>>,
    Vec<redoubt_crypto::pk::HolderSecrets>,
);

impl Cluster {
    /// A cluster tolerating `f` faults: by default every replica live, the default
    /// configuration except that COMMITs are never held back (`defer_tentative_commits`
    /// off: these tests read a replica's COMMIT as the sign that it prepared; the tests of
    /// held-back COMMITs switch it on), static keys, scripted clients 7, 8 and 9.
    pub fn builder(f: u32) -> Builder {
        let mut cfg = Config::new(f);
        cfg.defer_tentative_commits = false;
        Builder {
            f,
            mode: KeyMode::Static,
            scripted: BTreeSet::new(),
            clients: [7, 8, 9].into(),
            live_clients: BTreeSet::new(),
            cfg,
            step_ms: 10,
        }
    }

    pub fn n(&self) -> u32 {
        self.cfg.n()
    }

    // ----- nodes -------------------------------------------------------------------------

    pub fn is_live(&self, i: ReplicaId) -> bool {
        matches!(self.replicas[i as usize], Node::Live(_))
    }

    /// Live replica `i` (panics for a scripted one).
    pub fn replica(&self, i: ReplicaId) -> &Rep {
        match &self.replicas[i as usize] {
            Node::Live(r) => r,
            Node::Scripted(_) => panic!("replica {i} is scripted"),
        }
    }

    pub fn replica_mut(&mut self, i: ReplicaId) -> &mut Rep {
        match &mut self.replicas[i as usize] {
            Node::Live(r) => r,
            Node::Scripted(_) => panic!("replica {i} is scripted"),
        }
    }

    /// The live replicas.
    pub fn live(&self) -> impl Iterator<Item = &Rep> {
        self.replicas.iter().filter_map(|n| match n {
            Node::Live(r) => Some(&**r),
            Node::Scripted(_) => None,
        })
    }

    /// Live client `c`.
    pub fn client(&self, c: ClientId) -> &Client<Keys> {
        match &self.clients[&c] {
            ClientNode::Live(cl) => cl,
            ClientNode::Scripted(_) => panic!("client {c} is scripted"),
        }
    }

    pub fn client_mut(&mut self, c: ClientId) -> &mut Client<Keys> {
        match self.clients.get_mut(&c).expect("a client of the cluster") {
            ClientNode::Live(cl) => cl,
            ClientNode::Scripted(_) => panic!("client {c} is scripted"),
        }
    }

    /// The keys `p` sends with (a live node's own, or a scripted node's).
    pub fn keys(&self, p: Principal) -> &Keys {
        match p {
            Principal::Replica(i) => match &self.replicas[i as usize] {
                Node::Live(r) => r.auth(),
                Node::Scripted(k) => k,
            },
            Principal::Client(c) => match &self.clients[&c] {
                ClientNode::Live(cl) => cl.auth(),
                ClientNode::Scripted(k) => k,
            },
            Principal::Executor(_) | Principal::Filter(_) => {
                panic!("this harness runs co-located clusters only")
            }
        }
    }

    /// The session keys of scripted node `p`.
    pub fn session_mut(&mut self, p: Principal) -> &mut SessionKeys {
        let keys = match p {
            Principal::Replica(i) => match &mut self.replicas[i as usize] {
                Node::Scripted(k) => k,
                Node::Live(_) => panic!("{p:?} is live"),
            },
            Principal::Client(c) => match self.clients.get_mut(&c) {
                Some(ClientNode::Scripted(k)) => k,
                _ => panic!("{p:?} is not a scripted client"),
            },
            Principal::Executor(_) | Principal::Filter(_) => {
                panic!("this harness runs co-located clusters only")
            }
        };
        keys.session().expect("session keys")
    }

    /// Replica `i` restarts from the journal `records` over a fresh state (pages checked),
    /// with a new incarnation of its keys; `records` become its journal.
    pub fn restart(&mut self, i: ReplicaId, records: &[Record]) {
        let keys = self.keyring.keys(Principal::Replica(i));
        self.restart_with(i, records, keys);
    }

    fn restart_with(&mut self, i: ReplicaId, records: &[Record], keys: Keys) {
        let cfg = self.cfg.clone();
        let (store, st) = fresh_store();
        self.stores[i as usize] = store;
        let mut r = Replica::restore(cfg, i, keys, Svc::default(), st, records, true)
            .expect("the journal restores");
        if let Some((orders, order_keys)) = &self.prime_keys {
            r = r.with_prime(orders.clone(), order_keys[i as usize].clone());
        }
        self.replicas[i as usize] = Node::Live(Box::new(r));
        self.journals[i as usize] = records.to_vec();
    }

    /// Like [`Cluster::restart`] with session keys whose key holder fails every call opening
    /// a body session while `failing` is set.
    pub fn restart_failing_bodies(
        &mut self,
        i: ReplicaId,
        records: &[Record],
        failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) {
        let keys = Keys::Session(
            self.keyring
                .session_failing_bodies(Principal::Replica(i), failing),
        );
        self.restart_with(i, records, keys);
    }

    /// Everything replica `i` journaled (since its last restart: what it restarted from, then
    /// what it recorded).
    pub fn journal(&self, i: ReplicaId) -> &[Record] {
        &self.journals[i as usize]
    }

    /// The events replica `i` reported.
    pub fn events(&self, i: ReplicaId) -> Vec<Event> {
        of(&self.events, i)
    }

    /// What live client `c` completed.
    pub fn completions(&self, c: ClientId) -> Vec<Completion> {
        of(&self.completions, c)
    }

    /// Whether live client `c` completed its request at timestamp `ts`.
    pub fn completed(&self, c: ClientId, ts: u64) -> bool {
        self.completions(c).iter().any(|done| done.timestamp == ts)
    }

    /// The NEW-KEYs scripted node `p` was delivered: (sender, outcome).
    pub fn accepted(&self, p: Principal) -> Vec<KeyOutcome> {
        of(&self.accepted, p)
    }

    // ----- time --------------------------------------------------------------------------

    pub fn env(&self) -> Env {
        Env {
            now_ms: self.now,
            entropy: self.now + 1,
        }
    }

    /// Moves the clock `ms` on (nothing runs).
    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    /// Moves the clock to `t` (nothing runs).
    pub fn advance_to(&mut self, t: u64) {
        assert!(t >= self.now, "time runs forward: {} to {t}", self.now);
        self.now = t;
    }

    /// One tick of live replica `i`.
    pub fn tick(&mut self, i: ReplicaId) -> Out {
        self.input(i, Input::Tick)
    }

    /// Any input but a frame to live replica `i` (a tick, step-down, recovery).
    pub fn input(&mut self, i: ReplicaId, input: Input<'_>) -> Out {
        let env = self.env();
        let effects = self.replica_mut(i).handle(env, input);
        let out = self.route(Principal::Replica(i), effects);
        self.end_turn(i, out)
    }

    /// One tick of live client `c`.
    pub fn tick_client(&mut self, c: ClientId) -> Out {
        let env = self.env();
        let effects = self.client_mut(c).tick(env);
        self.route(Principal::Client(c), effects)
    }

    /// Ticks every live replica and client.
    pub fn tick_all(&mut self) {
        for i in 0..self.n() {
            if self.is_live(i) {
                self.tick(i);
            }
        }
        let live: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(_, n)| matches!(n, ClientNode::Live(_)))
            .map(|(c, _)| *c)
            .collect();
        for c in live {
            self.tick_client(c);
        }
    }

    /// Until `until` holds or `ms` have passed: delivers every pending frame, moves the clock
    /// one step and ticks every live node. Checks `until` before each delivery (so when it
    /// returns true, the frames of the last tick are still pending). Returns `until`.
    pub fn run_until(&mut self, ms: u64, mut until: impl FnMut(&Cluster) -> bool) -> bool {
        let end = self.now + ms;
        loop {
            if until(self) {
                return true;
            }
            if self.now >= end {
                return false;
            }
            self.deliver_all();
            self.advance(self.step_ms.min(end - self.now));
            self.tick_all();
        }
    }

    /// Runs `ms` (see [`Cluster::run_until`]), then delivers what is pending.
    pub fn run(&mut self, ms: u64) {
        self.run_until(ms, |_| false);
        self.deliver_all();
    }

    // ----- speaking for nodes -------------------------------------------------------------

    /// `msg` sealed by `from` for `to`.
    pub fn seal(&self, from: Principal, to: Principal, msg: &Message) -> Vec<u8> {
        seal(self.keys(from), msg, Some(to), self.n())
    }

    /// Hands `msg` from replica `from` to replica `to` at once (no network, no rules);
    /// returns what `to` did.
    pub fn receive(&mut self, to: ReplicaId, from: ReplicaId, msg: impl Wire) -> Out {
        self.receive_from(to, Principal::Replica(from), msg)
    }

    /// Like [`Cluster::receive`], from any principal.
    pub fn receive_from(&mut self, to: ReplicaId, from: Principal, msg: impl Wire) -> Out {
        let to = Principal::Replica(to);
        let msg = msg.into_message();
        let bytes: Bytes = self.seal(from, to, &msg).into();
        self.log(from, to, bytes.clone(), msg);
        self.hand(to, &bytes)
    }

    /// Replica `to` reads `msgs` (sender, message) in one turn of its host, as a busy node
    /// reads what already waits: no `Input::Idle` between them, one after the last; returns
    /// what it did, and without `idle` leaves the end of the turn out.
    pub fn receive_turn(
        &mut self,
        to: ReplicaId,
        msgs: Vec<(Principal, Message)>,
        idle: bool,
    ) -> Out {
        let dest = Principal::Replica(to);
        let mut out = Out::default();
        for (from, msg) in msgs {
            let bytes: Bytes = self.seal(from, dest, &msg).into();
            self.log(from, dest, bytes.clone(), msg);
            let env = self.env();
            let effects = self.replica_mut(to).handle(env, Input::Receive(&bytes));
            out.extend(self.route(dest, effects));
        }
        if idle {
            out = self.end_turn(to, out);
        }
        out
    }

    /// Ends live replica `i`'s turn (`Input::Idle`) after `out`, the effects of its last
    /// input, were routed (its state commits written); returns `out` and what it did.
    fn end_turn(&mut self, i: ReplicaId, mut out: Out) -> Out {
        let env = self.env();
        let effects = self.replica_mut(i).handle(env, Input::Idle);
        out.extend(self.route(Principal::Replica(i), effects));
        out
    }

    /// Client `sr.request.client` sends its request to replica `to`, which gets it at once.
    pub fn receive_request(&mut self, to: ReplicaId, sr: &SignedRequest) -> Out {
        self.receive_from(to, Principal::Client(sr.request.client), sr.clone())
    }

    /// Hands the frame `bytes` to replica `to` at once.
    pub fn receive_frame(&mut self, to: ReplicaId, bytes: &[u8]) -> Out {
        self.hand(Principal::Replica(to), bytes)
    }

    /// Puts `msg` from `from` to `to` on the network.
    pub fn send(&mut self, from: Principal, to: Principal, msg: impl Wire) {
        let msg = msg.into_message();
        let bytes = self.seal(from, to, &msg);
        self.queue(from, to, bytes.into(), msg);
    }

    /// A request of client `c` at timestamp `ts` with its authenticator.
    pub fn request(&self, c: ClientId, ts: u64, op: &[u8]) -> SignedRequest {
        let request = Request {
            client: c,
            timestamp: ts,
            read_only: false,
            op: op.to_vec().into(),
        };
        let auth =
            request_authenticator(self.keys(Principal::Client(c)), &request.digest(), self.n());
        SignedRequest {
            request,
            auth: auth.into(),
            sig: None,
        }
    }

    /// A read-only request of client `c` at timestamp `ts` with its authenticator.
    pub fn read_request(&self, c: ClientId, ts: u64, op: &[u8]) -> SignedRequest {
        let mut sr = self.request(c, ts, op);
        sr.request.read_only = true;
        sr.auth = request_authenticator(
            self.keys(Principal::Client(c)),
            &sr.request.digest(),
            self.n(),
        )
        .into();
        sr
    }

    /// `sr` signed by its client's key holder (session keys).
    pub fn sign(&self, mut sr: SignedRequest) -> SignedRequest {
        let keys = self.keys(Principal::Client(sr.request.client));
        let d = sr.request.digest();
        let (counter, sig) = keys
            .session_ref()
            .expect("session keys")
            .with_holder(|h| h.sign(Purpose::Request, &d))
            .expect("the key holder signs");
        sr.sig = Some(RequestSig { counter, sig });
        sr
    }

    /// Scripted `p` draws new session keys for the replicas `recipients` (but itself) and
    /// hands each its NEW-KEY at once; returns what they did.
    pub fn rekey(&mut self, p: Principal, recipients: &[ReplicaId]) -> Out {
        let to: Vec<ReplicaId> = recipients
            .iter()
            .copied()
            .filter(|r| Principal::Replica(*r) != p)
            .collect();
        let principals: Vec<Principal> = to.iter().map(|r| Principal::Replica(*r)).collect();
        let nk = self
            .session_mut(p)
            .refresh(&principals)
            .expect("fresh keys");
        let mut out = Out::default();
        for r in to {
            out.extend(self.receive_from(r, p, nk.clone()));
        }
        out
    }

    /// Live client `c` invokes `op`; returns its timestamp (the request is queued).
    pub fn invoke(&mut self, c: ClientId, op: &[u8]) -> u64 {
        self.invoke_as(c, op, false)
    }

    /// Like [`Cluster::invoke`], read-only if `read_only`.
    pub fn invoke_as(&mut self, c: ClientId, op: &[u8], read_only: bool) -> u64 {
        let env = self.env();
        let (ts, effects) = self
            .client_mut(c)
            .invoke(env, op.to_vec(), read_only)
            .expect("the client is idle");
        self.route(Principal::Client(c), effects);
        ts
    }

    /// Live replica `i` receives the VIEW-CHANGEs `vcs`, each from its sender; returns the
    /// VIEW-CHANGE it sent itself (it joined their view).
    pub fn join_view(
        &mut self,
        i: ReplicaId,
        vcs: impl IntoIterator<Item = ViewChange>,
    ) -> ViewChange {
        let mut out = Out::default();
        for vc in vcs {
            out.extend(self.receive(i, vc.replica, vc));
        }
        out.find(|m| match m {
            Message::Pbft(PbftMessage::ViewChange(vc)) if vc.replica == i => Some(vc),
            _ => None,
        })
        .unwrap_or_else(|| panic!("replica {i} did not join the view"))
    }

    /// Scripted agreement at live replica `i`: `pp` from its view's primary, then the
    /// PREPAREs of `preparers` and the COMMITs of `committers`; returns what `i` did.
    pub fn agree(
        &mut self,
        i: ReplicaId,
        pp: PrePrepare,
        preparers: &[ReplicaId],
        committers: &[ReplicaId],
    ) -> Out {
        let (view, seq, d) = (pp.view, pp.seq, pp.digest);
        let mut out = self.receive(i, self.cfg.primary(view), pp);
        for r in preparers {
            out.extend(self.receive(i, *r, super::prepare(view, seq, d, *r)));
        }
        for r in committers {
            out.extend(self.receive(i, *r, super::commit(view, seq, d, *r)));
        }
        out
    }

    /// The digest of every replica's checkpoint 0 under this configuration (what a fresh
    /// replica reports in its first VIEW-CHANGE).
    pub fn checkpoint_zero(&self) -> Digest {
        let cfg = self.cfg.clone();
        let mut probe = Cluster::builder(self.f)
            .config(|c| *c = cfg)
            .live([0])
            .build();
        let others = (1..=self.f + 1).map(|r| view_change(1, r, (0, Digest::ZERO)));
        probe.join_view(0, others).checkpoints[0].1
    }

    // ----- the network -------------------------------------------------------------------

    /// Every frame sent or handed over so far.
    pub fn sent(&self) -> &[Envelope] {
        &self.sent
    }

    /// The frames on the network, oldest first.
    pub fn pending(&self) -> &VecDeque<Envelope> {
        &self.pending
    }

    /// The frames dropped (by [`Cluster::drop_where`] or a rule).
    pub fn dropped(&self) -> &[Envelope] {
        &self.dropped
    }

    /// Delivers the oldest pending frame (unless a rule drops it); returns it.
    pub fn deliver_next(&mut self) -> Option<Envelope> {
        let e = self.pending.pop_front()?;
        self.deliver_envelope(e.clone());
        Some(e)
    }

    /// Delivers the oldest pending frame that `pred` matches (unless a rule drops it);
    /// returns what its receiver did.
    pub fn deliver(&mut self, pred: impl Fn(&Envelope) -> bool) -> Option<Out> {
        let at = self.pending.iter().position(pred)?;
        let e = self.pending.remove(at).expect("present");
        Some(self.deliver_envelope(e))
    }

    /// Delivers pending frames, and what they cause, until none is left; returns how many.
    pub fn deliver_all(&mut self) -> usize {
        self.deliver_all_where(|_| true)
    }

    /// Delivers the pending frames `pred` matches, and those of what they cause, until none
    /// matches; the others stay pending. Returns how many.
    pub fn deliver_all_where(&mut self, pred: impl Fn(&Envelope) -> bool) -> usize {
        let mut count = 0;
        while self.deliver(&pred).is_some() {
            count += 1;
            assert!(count < DELIVERIES_MAX, "a message storm");
        }
        count
    }

    /// Drops the pending frames `pred` matches; returns how many.
    pub fn drop_where(&mut self, pred: impl Fn(&Envelope) -> bool) -> usize {
        let (gone, kept): (VecDeque<Envelope>, VecDeque<Envelope>) =
            std::mem::take(&mut self.pending)
                .into_iter()
                .partition(pred);
        self.pending = kept;
        let count = gone.len();
        self.dropped.extend(gone);
        count
    }

    /// From now on, drops every frame `pred` matches when it would be delivered.
    pub fn block(&mut self, pred: impl Fn(&Envelope) -> bool + 'static) -> Rule {
        self.rules.push(Some(Box::new(pred)));
        Rule(self.rules.len() - 1)
    }

    pub fn unblock(&mut self, rule: Rule) {
        self.rules[rule.0] = None;
    }

    /// Lifts every rule.
    pub fn heal(&mut self) {
        self.rules.clear();
    }

    /// Cuts the replicas of `side` off from every other node (replicas and clients).
    pub fn partition(&mut self, side: &[ReplicaId]) -> Rule {
        let side: Vec<Principal> = side.iter().map(|r| Principal::Replica(*r)).collect();
        self.block(move |e| side.contains(&e.from) != side.contains(&e.to))
    }

    /// Cuts replica `i` off from every other node.
    pub fn isolate(&mut self, i: ReplicaId) -> Rule {
        self.partition(&[i])
    }

    // ----- plumbing ----------------------------------------------------------------------

    fn log(&mut self, from: Principal, to: Principal, bytes: Bytes, msg: Message) -> Envelope {
        let e = Envelope {
            from,
            to,
            at: self.now,
            msg,
            bytes,
        };
        self.sent.push(e.clone());
        e
    }

    fn queue(&mut self, from: Principal, to: Principal, bytes: Bytes, msg: Message) {
        let e = self.log(from, to, bytes, msg);
        self.pending.push_back(e);
    }

    /// Routes the effects of a step of `from`: frames to the network, records to its
    /// journal, events to the log.
    fn route(&mut self, from: Principal, effects: Vec<Effect>) -> Out {
        let mut calls = Vec::new();
        for e in &effects {
            match e {
                Effect::Holder(call) => calls.push(call.clone()),
                Effect::Send { to, bytes } => {
                    self.queue(from, *to, bytes.clone(), super::decode(bytes));
                }
                Effect::Broadcast { bytes } => {
                    let msg = super::decode(bytes);
                    for r in (0..self.n()).map(Principal::Replica) {
                        if r != from {
                            self.queue(from, r, bytes.clone(), msg.clone());
                        }
                    }
                }
                Effect::Persist(rec) => {
                    let Principal::Replica(i) = from else {
                        panic!("{from:?} journals")
                    };
                    self.journals[i as usize].push(rec.clone());
                }
                Effect::Event(ev) => {
                    if let Principal::Replica(i) = from {
                        self.events.push((i, ev.clone()));
                    }
                }
                Effect::CommitState(c) => {
                    let Principal::Replica(i) = from else {
                        panic!("{from:?} commits state")
                    };
                    c.apply(&mut self.stores[i as usize]).expect("memory store");
                }
            }
        }
        let mut out = Out { effects };
        // The key holder answers at once, in order (unless it holds its answers back).
        let Principal::Replica(i) = from else {
            return out;
        };
        let calls = match self.holding.get(&i) {
            Some(which) => {
                let (held, now): (Vec<_>, Vec<_>) = calls.into_iter().partition(which);
                self.held.extend(held.into_iter().map(|c| (i, c)));
                now
            }
            None => calls,
        };
        out.extend(self.answer_calls(i, calls));
        out
    }

    /// Replica `i`'s key holder keeps its answers back until [`Cluster::release_key_holder`].
    pub fn hold_key_holder(&mut self, i: ReplicaId) {
        self.holding.insert(i, |_| true);
    }

    /// Like [`Cluster::hold_key_holder`] for the calls `which` picks only.
    pub fn hold_key_holder_calls(&mut self, i: ReplicaId, which: fn(&HolderCall) -> bool) {
        self.holding.insert(i, which);
    }

    /// Replica `i`'s key holder answers what it held, and answers at once from now on.
    pub fn release_key_holder(&mut self, i: ReplicaId) -> Out {
        self.holding.remove(&i);
        let (calls, kept): (Vec<_>, Vec<_>) = self.held.drain(..).partition(|(r, _)| *r == i);
        self.held = kept;
        self.answer_calls(i, calls.into_iter().map(|(_, c)| c).collect())
    }

    /// Replica `i`'s key holder answers `calls`, in order.
    fn answer_calls(&mut self, i: ReplicaId, calls: Vec<HolderCall>) -> Out {
        let mut out = Out::default();
        for call in calls {
            let holder = self
                .replica(i)
                .auth()
                .session_ref()
                .expect("only nodes with session keys call their key holder")
                .holder();
            let answer =
                redoubt_core::holder::perform(holder.lock().expect("key holder").as_mut(), &call);
            out.extend(self.input(i, Input::Holder(answer)));
        }
        out
    }

    fn deliver_envelope(&mut self, e: Envelope) -> Out {
        if self.rules.iter().flatten().any(|rule| rule(&e)) {
            self.dropped.push(e);
            return Out::default();
        }
        self.hand(e.to, &e.bytes)
    }

    /// Gives `bytes` to `to`: a live node handles it, a scripted one takes the NEW-KEYs.
    fn hand(&mut self, to: Principal, bytes: &[u8]) -> Out {
        let env = self.env();
        let scripted = match to {
            Principal::Replica(i) => match &mut self.replicas[i as usize] {
                Node::Live(r) => {
                    let effects = r.handle(env, Input::Receive(bytes));
                    let out = self.route(to, effects);
                    return self.end_turn(i, out);
                }
                Node::Scripted(keys) => keys,
            },
            Principal::Client(c) => match self.clients.get_mut(&c) {
                Some(ClientNode::Live(cl)) => {
                    if let Some(done) = cl.receive(env, bytes) {
                        self.completions.push((c, done));
                    }
                    return Out::default();
                }
                Some(ClientNode::Scripted(keys)) => keys,
                None => return Out::default(),
            },
            Principal::Executor(_) | Principal::Filter(_) => return Out::default(), // co-located only
        };
        if let Some((from, outcome)) = take_new_key(scripted, env.now_ms, bytes) {
            self.accepted.push((to, (from, outcome)));
        }
        Out::default()
    }
}

/// A scripted node with session keys takes a NEW-KEY sent to it: (sender, outcome); `None`
/// for any other frame.
fn take_new_key(keys: &mut Keys, now_ms: u64, bytes: &[u8]) -> Option<KeyOutcome> {
    let Message::Recovery(RecoveryMessage::NewKey(nk)) = super::decode(bytes) else {
        return None;
    };
    Some((nk.from, keys.session()?.accept(&nk, now_ms)))
}

/// The entries of `log` that belong to `key`.
fn of<K: PartialEq, T: Clone>(log: &[(K, T)], key: K) -> Vec<T> {
    log.iter()
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v.clone())
        .collect()
}
