//! The execution nodes of a separated deployment in the world (`Config::executors > 0`; Yin
//! et al. 2003): each runs the unmodified core [`Executor`] over its own page store; the
//! faulty ones ([`ExecBehavior`]) lie, keep silent or drop what they send. Their events go to
//! a checker of their own (correct execution nodes agree on what ran at each sequence number
//! and on every checkpoint), and what a correct one executes must be what the agreement
//! cluster ordered there.

use super::*;
use crate::scenario::ExecBehavior;
use redoubt_core::keys::Purpose;
use redoubt_core::message::{
    checkpoint_statement, decode_frame, Certified, Relay, Reply, ReplyBundle, ReplyCert,
    SignedVote, VouchedCert,
};
use redoubt_core::message::{ClientMessage, FirewallMessage, SeparatedMessage};
use redoubt_core::{Executor, ExecutorId};
use redoubt_crypto::threshold::ThresholdSig;

pub(super) struct SimExec {
    pub(super) core: Executor<KvService, SessionKeys>,
    pub(super) behavior: Option<ExecBehavior>,
    /// Its durable page store (state commits are written to it).
    store: MemStore,
    /// Off: it lost power and has not rebooted (receives and does nothing).
    off: bool,
}

impl World {
    /// Builds the execution nodes of the scenario (none when co-located).
    pub(super) fn build_executors(
        sc: &Scenario,
        mut keys: impl FnMut(Principal) -> SessionKeys,
        dealt: &Option<super::filters::Dealt>,
    ) -> Vec<SimExec> {
        (0..sc.core.executors)
            .map(|e| {
                let store = MemStore::new(sim_geometry());
                let core = Executor::new(
                    sc.core.clone(),
                    e,
                    keys(Principal::Executor(e)),
                    KvService::new(),
                    open_state(Box::new(store.clone())).expect("memory store"),
                )
                .and_then(|c| match dealt {
                    Some(d) => c.with_firewall(d.keys.clone(), d.shares[e as usize].clone()),
                    None => Ok(c),
                })
                .expect("valid executor");
                let behavior = sc
                    .exec_byzantine
                    .iter()
                    .find(|(x, _)| *x == e)
                    .map(|(_, b)| *b);
                SimExec {
                    core,
                    behavior,
                    store,
                    off: false,
                }
            })
            .collect()
    }

    pub(super) fn exec_faulty(&self, e: ExecutorId) -> bool {
        self.execs[e as usize].behavior.is_some()
    }

    /// Execution node `e` loses power (`on` false), or reboots from its page store: the
    /// core starts over from the store's durable base, with a new incarnation of its keys.
    pub(super) fn exec_power(&mut self, e: ExecutorId, on: bool) {
        if !on {
            self.log(|| format!("e{e} POWER OFF"));
            self.execs[e as usize].off = true;
            return;
        }
        let store = self.execs[e as usize].store.clone();
        let keys = self.session_keys(Principal::Executor(e));
        let state = match open_state(Box::new(store)) {
            Ok(s) => s,
            Err(err) => {
                self.violation(format!("e{e} cannot open its page store: {err}"));
                return;
            }
        };
        let built =
            Executor::new(self.sc.core.clone(), e, keys, KvService::new(), state).and_then(|c| {
                match &self.dealt {
                    Some(d) => c.with_firewall(d.keys.clone(), d.shares[e as usize].clone()),
                    None => Ok(c),
                }
            });
        match built {
            Ok(core) => {
                let from = core.last_executed();
                self.log(|| format!("e{e} REBOOT from checkpoint n{from}"));
                self.exec_checker.restarted(e, from, true);
                self.execs[e as usize].core = core;
                self.execs[e as usize].off = false;
            }
            Err(err) => self.violation(format!("e{e} does not restart from its page store: {err}")),
        }
    }

    pub(super) fn tick_exec(&mut self, e: ExecutorId) {
        if self.execs[e as usize].off {
            self.schedule(self.now + TICK_MS, Ev::TickExec(e));
            return;
        }
        let env = self.env();
        let eff = self.execs[e as usize].core.handle(env, Input::Tick);
        self.exec_effects(e, eff);
        self.schedule(self.now + TICK_MS, Ev::TickExec(e));
    }

    pub(super) fn deliver_exec(&mut self, e: ExecutorId, bytes: &[u8]) {
        if self.execs[e as usize].behavior == Some(ExecBehavior::Silent)
            || self.execs[e as usize].off
        {
            return;
        }
        let env = self.env();
        let eff = self.execs[e as usize]
            .core
            .handle(env, Input::Receive(bytes));
        self.exec_effects(e, eff);
    }

    /// Execution node `e`'s key holder answers `call` (see `holders.rs`).
    pub(super) fn exec_holder_answer(&mut self, e: ExecutorId, call: redoubt_core::HolderCall) {
        if self.execs[e as usize].off {
            return;
        }
        let holder = self.execs[e as usize].core.auth().holder();
        let answer =
            redoubt_core::holder::perform(holder.lock().expect("key holder").as_mut(), &call);
        let env = self.env();
        let eff = self.execs[e as usize]
            .core
            .handle(env, Input::Holder(answer));
        self.exec_effects(e, eff);
    }

    fn exec_effects(&mut self, e: ExecutorId, effects: Vec<Effect>) {
        let faulty = self.exec_faulty(e);
        if !faulty {
            if let Err(v) = self.execs[e as usize].core.check_invariants() {
                self.violation(format!("e{e} broke an invariant of its core: {v}"));
            }
        }
        for eff in effects {
            match eff {
                Effect::Send { to, bytes } => self.exec_send(e, to, bytes.to_vec()),
                Effect::Broadcast { .. } | Effect::Persist(_) => {}
                Effect::Holder(call) => self.holder_call(Principal::Executor(e), call),
                Effect::CommitState(c) => {
                    let mut store = self.execs[e as usize].store.clone();
                    if let Err(err) = c.apply(&mut store) {
                        self.violation(format!("e{e} state commit failed in memory: {err}"));
                    }
                }
                Effect::Event(ev) => {
                    if let Event::Rejected { from, kind, reason } = &ev {
                        let (from, kind, reason) = (*from, *kind, *reason);
                        self.log(|| format!("e{e} rejected {kind} from {from:?}: {reason}"));
                    }
                    if !faulty {
                        self.observe_exec(e, ev);
                    }
                }
            }
        }
    }

    fn exec_send(&mut self, e: ExecutorId, to: Principal, bytes: Vec<u8>) {
        let from = Principal::Executor(e);
        match self.execs[e as usize].behavior {
            None => self.transmit(from, to, bytes, 0),
            Some(ExecBehavior::Silent) => {}
            Some(ExecBehavior::Flaky) => {
                if self.rng.random_bool(0.5) {
                    self.transmit(from, to, bytes, 0);
                }
            }
            Some(ExecBehavior::Liar) => {
                let lie = self.exec_lie(e, to, &bytes);
                self.transmit(from, to, lie.unwrap_or(bytes), 0);
                if self.sc.core.firewall() && matches!(to, Principal::Filter(_)) {
                    self.exec_forge_cert(e, to);
                }
            }
        }
    }

    /// A faulty execution node's version of an outgoing frame, sealed with its keys.
    fn exec_lie(&mut self, e: ExecutorId, to: Principal, bytes: &[u8]) -> Option<Vec<u8>> {
        let frame = decode_frame(bytes, usize::MAX).ok()?;
        let msg = decode_body(&frame.body).ok()?;
        let lie = match msg {
            // Its replies travel inside relays: the reply inside is rewritten.
            Message::Separated(SeparatedMessage::Relay(r)) => {
                let inner = self.exec_lie(e, Principal::Client(r.client), &r.frame)?;
                Message::Separated(SeparatedMessage::Relay(Relay {
                    client: r.client,
                    frame: serde_bytes::ByteBuf::from(inner),
                }))
            }
            Message::Client(ClientMessage::Reply(r)) => {
                // A wrong result; with sealed bodies, half the time a tagged value in clear
                // instead, as a leak.
                let result = if self.sc.core.confidential_bodies && self.rng.random_bool(0.5) {
                    let mut v = secrets::SECRET_TAG.to_vec();
                    v.extend_from_slice(b"leaked");
                    v
                } else {
                    KvResult::Value(Some(b"lie".to_vec())).encode()
                };
                Message::Client(ClientMessage::Reply(Reply {
                    digest_only: false,
                    result,
                    ..r
                }))
            }
            Message::Separated(SeparatedMessage::ExecAck(mut a)) => {
                a.seq += self.rng.random_range(1..3 * self.sc.core.log_size);
                Message::Separated(SeparatedMessage::ExecAck(a))
            }
            Message::Separated(SeparatedMessage::ExecCheckpoint(mut c)) => {
                // A wrong digest, signed by our key holder when votes are signed: a faulty
                // node's vote is valid, only never matched by g correct ones.
                c.digest = random_digest(&mut self.rng);
                if c.signed.is_some() {
                    c.signed = self.exec_sign_vote(e, c.seq, &c.digest);
                }
                Message::Separated(SeparatedMessage::ExecCheckpoint(c))
            }
            // Behind a firewall: half the time a bundle leaking a value in clear, under its
            // own (valid) share, else a share of garbage.
            Message::Firewall(FirewallMessage::ReplyShare(mut s)) => {
                if self.rng.random_bool(0.5) {
                    let mut v = secrets::SECRET_TAG.to_vec();
                    v.extend_from_slice(b"leaked");
                    for entry in &mut s.bundle.entries {
                        entry.result = v.clone();
                    }
                    if s.bundle.entries.is_empty() {
                        s.bundle.entries.push(redoubt_core::message::ReplyEntry {
                            client: 1,
                            timestamp: 1,
                            result: v,
                        });
                    }
                    let share = self.dealt.as_ref()?.shares[e as usize].clone();
                    s.share = share.sign(&s.bundle.statement().0);
                } else {
                    s.share = ThresholdSig([0xee; redoubt_crypto::threshold::SIG_LEN]);
                }
                Message::Firewall(FirewallMessage::ReplyShare(s))
            }
            Message::Firewall(FirewallMessage::StableShare(mut s)) => {
                s.share = ThresholdSig([0xdd; redoubt_crypto::threshold::SIG_LEN]);
                Message::Firewall(FirewallMessage::StableShare(s))
            }
            Message::Separated(SeparatedMessage::Certified(c)) => {
                // Garbage frames, a later stable checkpoint, and a "proof" of it: our own
                // signed vote for a made-up digest, repeated g+1 times.
                let stable = c.stable + self.sc.core.checkpoint_interval;
                let digest = random_digest(&mut self.rng);
                let votes = match self.exec_sign_vote(e, stable, &digest) {
                    Some((counter, sig)) => {
                        let v = SignedVote {
                            executor: e,
                            seq: stable,
                            digest,
                            counter,
                            sig,
                        };
                        vec![v; c.votes.len().max(2)]
                    }
                    None => c.votes,
                };
                Message::Separated(SeparatedMessage::Certified(Certified {
                    frames: vec![serde_bytes::ByteBuf::from(vec![0xAB; 64])],
                    stable,
                    votes,
                    ..c
                }))
            }
            _ => return None,
        };
        let auth = self.execs[e as usize].core.auth();
        Some(seal(auth, &lie, Some(to), self.sc.core.n()))
    }

    /// A checkpoint vote signed by faulty execution node `e`'s key holder (with session keys).
    fn exec_sign_vote(
        &self,
        e: ExecutorId,
        seq: u64,
        digest: &redoubt_crypto::Digest,
    ) -> Option<(u64, redoubt_crypto::pk::Signature)> {
        let st = checkpoint_statement(seq, digest);
        self.execs[e as usize]
            .core
            .auth()
            .with_holder(|h| h.sign(Purpose::Checkpoint, &st))
            .ok()
    }

    /// An extra message of a faulty execution node behind a firewall, now and then: a reply
    /// certificate of its own making (no valid signature) that carries a value in clear.
    fn exec_forge_cert(&mut self, e: ExecutorId, to: Principal) {
        if !self.rng.random_bool(0.2) {
            return;
        }
        let mut v = secrets::SECRET_TAG.to_vec();
        v.extend_from_slice(b"smuggled");
        let cert = Message::from(VouchedCert {
            cert: ReplyCert {
                bundle: ReplyBundle {
                    seq: self.execs[e as usize].core.last_executed(),
                    entries: vec![redoubt_core::message::ReplyEntry {
                        client: 1,
                        timestamp: 1,
                        result: v,
                    }],
                },
                signature: ThresholdSig([0x11; redoubt_crypto::threshold::SIG_LEN]),
            },
            vouch: redoubt_crypto::pk::Signature([0x22; 64]),
        });
        let auth = self.execs[e as usize].core.auth();
        let bytes = seal(auth, &cert, None, self.sc.core.n());
        self.transmit(Principal::Executor(e), to, bytes, 0);
    }

    fn observe_exec(&mut self, e: ExecutorId, ev: Event) {
        if matches!(ev, Event::StateTransferred { .. }) {
            self.stats.exec_state_transfers += 1;
        }
        if let Event::Executed { seq, digest, .. } = &ev {
            if let Some(ordered) = self.checker.executed_digest(*seq) {
                if ordered != *digest {
                    self.violation(format!(
                        "execution: e{e} executed {digest:?} at n{seq} but the agreement \
                         cluster ordered {ordered:?}"
                    ));
                }
            }
            self.stats.max_executed = self.stats.max_executed.max(*seq);
        }
        if let Some(v) = self.exec_checker.observe(e, &ev) {
            self.violation(v);
        }
    }
}
