//! The pure core: group membership and the Wackamole algorithm as one deterministic state
//! machine, `(now_ms, Input) -> Vec<Effect>`. It reads no clock, touches no socket and draws
//! no randomness; the daemon and the simulator tests are its two hosts.
//!
//! **Membership.** Every member sends a [`Beat`] to every configured member each
//! `heartbeat_ms`. A member not heard for `suspect_ms` is suspected; a member that announced
//! a [`Leave`] is gone at once. The *connected set* of a member is itself plus every member it
//! hears that says it hears it. When that set differs from the installed view, the lowest id
//! in it (the coordinator) proposes a view: a larger [`ViewId`] and the set as its ordered
//! membership list. It installs the view and announces it in its beats; a member that receives
//! a beat for a larger view that lists it installs that view too. A member whose connected set
//! keeps differing from its view for `suspect_ms` proposes itself, so a lost or confused
//! coordinator never stalls the group.
//!
//! **Wackamole** (Amir et al., DSN 2003, Algorithms 1-2). Installing a view is the paper's
//! `VIEW_CHANGE`: the member snapshots what it holds (its `STATE_MSG`, carried in every beat
//! of that view) and enters GATHER. Each state received from a member later in the list that
//! lists an address we hold makes us release it at once (`ResolveConflicts`). With every
//! member's state in hand, all compute the same new allocation ([`crate::alloc`]) and enter
//! RUN: holes are acquired at once; an address moving from one member to another for balance
//! is acquired only after the old holder's beat shows it released, so it is never held twice
//! in one view. Beats are resent quickly while gathering, and no address is acquired while
//! gathering. The paper's `mature` flag is kept: a member starts immature and holding nothing,
//! becomes mature on gathering with a mature member or after `mature_ms`, and a view without a
//! mature member allocates nothing (a rebooting cluster does not shuffle addresses).

use crate::alloc;
use crate::membership::Peers;
use crate::wire::{
    group_digest, Beat, Instance, Leave, MemberId, Message, Reject, Rejects, Sealer, ViewId,
    VipSet, ADDRESSES_MAX, MEMBERS_MAX,
};
use crate::Cidr;
use redoubt_crypto::MacKey;
use tracing::{debug, info};

/// What the core needs to know: the group, this member, the timeouts and the group key.
#[derive(Clone, Debug)]
pub struct MachineConfig {
    pub me: MemberId,
    /// Larger on every start of this member (the daemon uses the wall clock in ms).
    pub incarnation: u64,
    /// Every member of the group, ascending, including `me`.
    pub members: Vec<MemberId>,
    pub addresses: Vec<Cidr>,
    pub heartbeat_ms: u64,
    pub suspect_ms: u64,
    pub mature_ms: u64,
    pub key: MacKey,
}

#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// Time passes; hosts call this every few milliseconds.
    Tick,
    /// A datagram arrived on the member's socket.
    Datagram(&'a [u8]),
    /// Leave voluntarily: release everything, tell the others, stop.
    Leave,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Effect {
    Send {
        to: MemberId,
        bytes: Vec<u8>,
    },
    /// Configure the address on the interface.
    Acquire {
        addr: Cidr,
    },
    /// Remove the address from the interface.
    Release {
        addr: Cidr,
    },
    /// Announce with gratuitous ARP that the address is here now (follows every `Acquire`).
    AnnounceArp {
        addr: Cidr,
    },
    /// For logs: a view was installed (`proposed`: by this member).
    ViewInstalled {
        view: ViewId,
        members: Vec<MemberId>,
        proposed: bool,
    },
    /// For logs: gathering finished; what this member holds or will hold in the view.
    Allocated {
        view: ViewId,
        held: Vec<Cidr>,
        mature: bool,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    Gather,
    Run,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct View {
    pub id: ViewId,
    pub members: Vec<Instance>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub datagrams_received: u64,
    pub datagrams_sent: u64,
    pub rejected: Rejects,
    pub views_installed: u64,
    pub views_proposed: u64,
}

/// One member's Wackamole state machine.
pub struct Wackamole {
    cfg: MachineConfig,
    sealer: Sealer,
    me: Instance,
    peers: Peers,
    view: Option<View>,
    phase: Phase,
    installed_ms: u64,
    /// Our `STATE_MSG` for the view: what we held when we installed it.
    snapshot: VipSet,
    snapshot_mature: bool,
    /// The states gathered so far, by position in the view.
    states: Vec<Option<(VipSet, bool)>>,
    held: VipSet,
    /// Addresses allocated to us that some member whose state listed them has yet to release.
    pending: Vec<usize>,
    /// Whether the last finished gathering had a mature member (and so allocated addresses).
    view_mature: bool,
    mature: bool,
    started_ms: Option<u64>,
    max_epoch: u64,
    next_beat_ms: u64,
    mismatch_since_ms: Option<u64>,
    /// When we last proposed a view, and its membership.
    last_proposal: Option<(u64, Vec<Instance>)>,
    seq: u64,
    stopped: bool,
    stats: Stats,
}

impl Wackamole {
    /// Panics on an inconsistent configuration (the config module validates files first).
    pub fn new(cfg: MachineConfig) -> Wackamole {
        assert!(!cfg.members.is_empty() && cfg.members.len() <= MEMBERS_MAX);
        assert!(
            cfg.members.windows(2).all(|w| w[0] < w[1]),
            "members ascending"
        );
        assert!(cfg.addresses.len() <= ADDRESSES_MAX);
        assert!(cfg.heartbeat_ms > 0 && cfg.suspect_ms > cfg.heartbeat_ms);
        assert!(cfg.incarnation > 0);
        let me_pos = cfg
            .members
            .binary_search(&cfg.me)
            .expect("this member is in the member list");
        let sealer = Sealer::new(cfg.key.clone(), &group_digest(&cfg.members, &cfg.addresses));
        let peers = Peers::new(cfg.members.clone(), me_pos, cfg.suspect_ms);
        let me = Instance {
            id: cfg.me,
            incarnation: cfg.incarnation,
        };
        Wackamole {
            sealer,
            me,
            peers,
            view: None,
            phase: Phase::Gather,
            installed_ms: 0,
            snapshot: VipSet::default(),
            snapshot_mature: false,
            states: Vec::new(),
            held: VipSet::default(),
            pending: Vec::new(),
            view_mature: false,
            mature: false,
            started_ms: None,
            max_epoch: 0,
            next_beat_ms: 0,
            mismatch_since_ms: None,
            last_proposal: None,
            seq: 0,
            stopped: false,
            stats: Stats::default(),
            cfg,
        }
    }

    pub fn handle(&mut self, now_ms: u64, input: Input<'_>) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.stopped {
            return out;
        }
        self.started_ms.get_or_insert(now_ms);
        match input {
            Input::Tick => self.on_tick(now_ms, &mut out),
            Input::Datagram(bytes) => {
                self.stats.datagrams_received += 1;
                if let Err(r) = self.on_datagram(now_ms, bytes, &mut out) {
                    debug!(reason = r.name(), len = bytes.len(), "datagram rejected");
                    self.stats.rejected.count(r);
                }
            }
            Input::Leave => {
                self.leave(&mut out);
                return out;
            }
        }
        self.check_view(now_ms, &mut out);
        self.check_invariants();
        out
    }

    // ---- accessors (for hosts, logs and tests) ----

    pub fn id(&self) -> MemberId {
        self.cfg.me
    }

    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn is_mature(&self) -> bool {
        self.mature
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    pub fn holds(&self, addr: &Cidr) -> bool {
        self.index_of(addr).is_some_and(|i| self.held.contains(i))
    }

    pub fn held_addresses(&self) -> Vec<Cidr> {
        self.held.iter().map(|i| self.cfg.addresses[i]).collect()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    fn index_of(&self, addr: &Cidr) -> Option<usize> {
        self.cfg.addresses.iter().position(|a| a == addr)
    }

    // ---- inputs ----

    fn on_tick(&mut self, now: u64, out: &mut Vec<Effect>) {
        let started = self.started_ms.expect("set on the first input");
        if !self.mature && now >= started.saturating_add(self.cfg.mature_ms) {
            info!(
                member = self.cfg.me,
                "no mature member reached: mature by timeout"
            );
            self.mature = true;
        }
        if now >= self.next_beat_ms && self.view.is_some() {
            let all: Vec<MemberId> = self.others().collect();
            self.send_beat(now, &all, out);
            self.next_beat_ms = now + self.beat_period_ms();
        }
    }

    fn on_datagram(&mut self, now: u64, bytes: &[u8], out: &mut Vec<Effect>) -> Result<(), Reject> {
        match self.sealer.open(bytes)? {
            Message::Beat(b) => self.on_beat(now, b, out),
            Message::Leave(l) => {
                let pos = self.sender_position(l.from)?;
                if self.peers.has_left(pos, l.incarnation) {
                    return Ok(());
                }
                self.peers.accept(pos, now, l.incarnation, l.seq)?;
                self.peers.record_leave(pos);
                info!(
                    member = self.cfg.me,
                    from = l.from,
                    "member left voluntarily"
                );
                Ok(())
            }
        }
    }

    fn sender_position(&self, from: MemberId) -> Result<usize, Reject> {
        let pos = self.peers.position(from).ok_or(Reject::UnknownMember)?;
        if from == self.cfg.me {
            return Err(Reject::FromSelf);
        }
        Ok(pos)
    }

    fn on_beat(&mut self, now: u64, b: Beat, out: &mut Vec<Effect>) -> Result<(), Reject> {
        let pos = self.sender_position(b.from)?;
        if !self.peers.valid_beat(&b, self.cfg.addresses.len()) {
            return Err(Reject::Invalid);
        }
        if let Some(v) = &self.view {
            // One view id names one membership; anything else is a confused sender.
            if v.id == b.view && v.members != b.members {
                return Err(Reject::Invalid);
            }
        }
        self.peers.accept(pos, now, b.incarnation, b.seq)?;
        self.peers.record_beat(pos, now, &b);
        self.max_epoch = self.max_epoch.max(b.view.epoch);

        let newer = self.view.as_ref().is_none_or(|v| b.view > v.id);
        if newer && b.members.binary_search(&self.me).is_ok() {
            self.install(now, b.view, b.members.clone(), false, out);
        }
        let Some(view) = &self.view else {
            return Ok(());
        };
        if view.id != b.view {
            return Ok(());
        }
        let sender = Instance {
            id: b.from,
            incarnation: b.incarnation,
        };
        let vpos = view
            .members
            .binary_search(&sender)
            .expect("a valid beat lists its sender");
        match self.phase {
            Phase::Gather => self.record_state(now, vpos, b.state, b.state_mature, out),
            Phase::Run => {
                self.try_pending(out);
                // A member still gathering may be missing our state: answer it now rather than
                // at our next beat, at most once per resend interval.
                let resend = self.resend_ms();
                let p = self.peers.get_mut(pos);
                if !b.running && p.last_reply_ms.is_none_or(|t| now >= t + resend) {
                    p.last_reply_ms = Some(now);
                    self.send_beat(now, &[b.from], out);
                }
            }
        }
        Ok(())
    }

    fn leave(&mut self, out: &mut Vec<Effect>) {
        // Release first, so that the others may take the addresses the moment they hear.
        for i in self.held.iter().collect::<Vec<_>>() {
            self.release(i, out);
        }
        self.pending.clear();
        // Twice: a lost leave costs a full suspicion timeout.
        for _ in 0..2 {
            self.seq += 1;
            let bytes = self.sealer.seal(&Message::Leave(Leave {
                from: self.cfg.me,
                incarnation: self.cfg.incarnation,
                seq: self.seq,
            }));
            for to in self.others().collect::<Vec<_>>() {
                self.stats.datagrams_sent += 1;
                out.push(Effect::Send {
                    to,
                    bytes: bytes.clone(),
                });
            }
        }
        self.stopped = true;
        info!(member = self.cfg.me, "left the group");
    }

    // ---- membership ----

    /// Proposes a new view when the connected set and the installed view disagree (or the
    /// view's gathering is stuck, or a view that allocated nothing now has a mature member).
    fn check_view(&mut self, now: u64, out: &mut Vec<Effect>) {
        let connected = self.peers.connected(now, self.me);
        let mismatch = match &self.view {
            None => true,
            Some(v) => {
                v.members != connected
                    || (self.phase == Phase::Gather
                        && now >= self.installed_ms + self.cfg.suspect_ms)
                    || (self.phase == Phase::Run && !self.view_mature && self.any_mature(v))
            }
        };
        if !mismatch {
            self.mismatch_since_ms = None;
            return;
        }
        let since = *self.mismatch_since_ms.get_or_insert(now);
        let coordinator = connected[0] == self.me;
        if !coordinator && now < since + self.cfg.suspect_ms {
            return;
        }
        // Proposing the same membership again (a stuck gathering, or coordinators that
        // disagree) waits; a membership that changed is proposed at once.
        if self
            .last_proposal
            .as_ref()
            .is_some_and(|(t, m)| *m == connected && now < t + self.propose_gap_ms())
        {
            return;
        }
        let epoch = self
            .max_epoch
            .max(self.view.as_ref().map_or(0, |v| v.id.epoch))
            + 1;
        let id = ViewId {
            epoch,
            coordinator: self.cfg.me,
            coordinator_incarnation: self.cfg.incarnation,
        };
        self.stats.views_proposed += 1;
        self.last_proposal = Some((now, connected.clone()));
        self.install(now, id, connected, true, out);
    }

    fn any_mature(&self, v: &View) -> bool {
        self.mature
            || v.members
                .iter()
                .any(|m| self.peers.instance(*m).is_some_and(|p| p.mature))
    }

    /// The paper's `VIEW_CHANGE`: snapshot, then GATHER.
    fn install(
        &mut self,
        now: u64,
        id: ViewId,
        members: Vec<Instance>,
        proposed: bool,
        out: &mut Vec<Effect>,
    ) {
        assert!(
            self.view.as_ref().is_none_or(|v| id > v.id),
            "views only grow"
        );
        let my_vpos = members
            .binary_search(&self.me)
            .expect("a member installs only views that list it");
        self.max_epoch = self.max_epoch.max(id.epoch);
        self.phase = Phase::Gather;
        self.installed_ms = now;
        self.snapshot = self.held;
        self.snapshot_mature = self.mature;
        self.pending.clear();
        self.mismatch_since_ms = None;
        self.stats.views_installed += 1;
        info!(
            member = self.cfg.me,
            view = %id,
            members = ?members.iter().map(|m| m.id).collect::<Vec<_>>(),
            proposed,
            "view installed"
        );
        out.push(Effect::ViewInstalled {
            view: id,
            members: members.iter().map(|m| m.id).collect(),
            proposed,
        });
        self.states = vec![None; members.len()];
        self.states[my_vpos] = Some((self.snapshot, self.snapshot_mature));
        self.view = Some(View { id, members });
        let targets: Vec<MemberId> = self.view_others().collect();
        self.send_beat(now, &targets, out);
        self.next_beat_ms = now + self.resend_ms();
        // States that arrived before we installed the view (their beats are cached).
        let view = self.view.clone().expect("just installed");
        for (vpos, m) in view.members.iter().enumerate() {
            if *m == self.me {
                continue;
            }
            if let Some(p) = self.peers.instance(*m) {
                if p.view == Some(id) {
                    let (state, mature) = (p.state, p.state_mature);
                    self.record_state(now, vpos, state, mature, out);
                }
            }
        }
        self.maybe_finish(now, out);
    }

    // ---- Wackamole ----

    /// GATHER: one member's state for the view; `ResolveConflicts` against it.
    fn record_state(
        &mut self,
        now: u64,
        vpos: usize,
        state: VipSet,
        mature: bool,
        out: &mut Vec<Effect>,
    ) {
        if self.states[vpos].is_some() {
            return;
        }
        debug_assert_eq!(self.phase, Phase::Gather);
        self.states[vpos] = Some((state, mature));
        let my_vpos = self.my_view_position();
        if alloc::loses_conflict(my_vpos, vpos) {
            for i in self.held.intersection(&state).iter().collect::<Vec<_>>() {
                debug!(member = self.cfg.me, addr = %self.cfg.addresses[i], "conflict: releasing");
                self.release(i, out);
            }
        }
        self.maybe_finish(now, out);
    }

    /// With every state in: `Reallocate_IPs`, then RUN.
    fn maybe_finish(&mut self, now: u64, out: &mut Vec<Effect>) {
        if self.phase != Phase::Gather || self.states.iter().any(Option::is_none) {
            return;
        }
        let view = self.view.clone().expect("gathering for a view");
        let my_vpos = self.my_view_position();
        let states: Vec<VipSet> = self.states.iter().map(|s| s.expect("all in").0).collect();
        self.view_mature = self.states.iter().any(|s| s.expect("all in").1);
        let holders = alloc::resolve_conflicts(&states, self.cfg.addresses.len());
        for i in self.held.iter() {
            assert_eq!(
                holders[i],
                Some(my_vpos),
                "we kept only what we resolved to us"
            );
        }
        if self.view_mature {
            self.mature = true;
            let target = alloc::reallocate(&holders, view.members.len());
            for (i, (h, t)) in holders.iter().zip(&target).enumerate() {
                if *t == my_vpos {
                    match h {
                        Some(h) if *h == my_vpos => {}
                        Some(_) => self.pending.push(i),
                        None => self.acquire(i, out),
                    }
                } else if *h == Some(my_vpos) {
                    self.release(i, out);
                }
            }
        } else {
            assert!(self.held.is_empty(), "only a mature member holds addresses");
        }
        self.phase = Phase::Run;
        let mut will_hold = self.held;
        for i in &self.pending {
            will_hold.insert(*i);
        }
        out.push(Effect::Allocated {
            view: view.id,
            held: will_hold.iter().map(|i| self.cfg.addresses[i]).collect(),
            mature: self.view_mature,
        });
        // Everyone, not only the view: our releases unblock the members waiting for them.
        let all: Vec<MemberId> = self.others().collect();
        self.send_beat(now, &all, out);
        self.next_beat_ms = now + self.cfg.heartbeat_ms;
        self.try_pending(out);
    }

    /// Acquires the balancing moves that every member whose state listed them has released,
    /// as its latest beat in this view shows: the resolved holder giving it up, and also the
    /// members that lost the conflict over it and may not have heard of it yet. (A member's
    /// holdings only shrink within a view, apart from what is allocated to it.)
    fn try_pending(&mut self, out: &mut Vec<Effect>) {
        let Some(view) = &self.view else { return };
        let my_vpos = view
            .members
            .binary_search(&self.me)
            .expect("in our own view");
        let mut ready = Vec::new();
        self.pending.retain(|i| {
            let released = view.members.iter().enumerate().all(|(vpos, m)| {
                let listed = self.states[vpos].is_some_and(|(s, _)| s.contains(*i));
                vpos == my_vpos
                    || !listed
                    || self
                        .peers
                        .instance(*m)
                        .is_some_and(|p| p.view == Some(view.id) && !p.held.contains(*i))
            });
            if released {
                ready.push(*i);
            }
            !released
        });
        for i in ready {
            self.acquire(i, out);
        }
    }

    fn acquire(&mut self, i: usize, out: &mut Vec<Effect>) {
        assert!(self.mature && !self.held.contains(i));
        self.held.insert(i);
        let addr = self.cfg.addresses[i];
        out.push(Effect::Acquire { addr });
        out.push(Effect::AnnounceArp { addr });
    }

    fn release(&mut self, i: usize, out: &mut Vec<Effect>) {
        assert!(self.held.contains(i));
        self.held.remove(i);
        out.push(Effect::Release {
            addr: self.cfg.addresses[i],
        });
    }

    // ---- sending ----

    fn send_beat(&mut self, now: u64, to: &[MemberId], out: &mut Vec<Effect>) {
        let view = self.view.as_ref().expect("beats belong to a view");
        self.seq += 1;
        let beat = Beat {
            from: self.cfg.me,
            incarnation: self.cfg.incarnation,
            seq: self.seq,
            view: view.id,
            members: view.members.clone(),
            state: self.snapshot,
            state_mature: self.snapshot_mature,
            held: self.held,
            hears: self.peers.hears_bitmap(now),
            running: self.phase == Phase::Run,
            mature: self.mature,
        };
        let bytes = self.sealer.seal(&Message::Beat(beat));
        for to in to {
            self.stats.datagrams_sent += 1;
            out.push(Effect::Send {
                to: *to,
                bytes: bytes.clone(),
            });
        }
    }

    fn others(&self) -> impl Iterator<Item = MemberId> + '_ {
        let me = self.cfg.me;
        self.cfg.members.iter().copied().filter(move |m| *m != me)
    }

    fn view_others(&self) -> impl Iterator<Item = MemberId> + '_ {
        let me = self.cfg.me;
        self.view
            .iter()
            .flat_map(|v| v.members.iter().map(|m| m.id))
            .filter(move |m| *m != me)
    }

    fn my_view_position(&self) -> usize {
        let v = self.view.as_ref().expect("in a view");
        v.members.binary_search(&self.me).expect("in our own view")
    }

    fn beat_period_ms(&self) -> u64 {
        match self.phase {
            Phase::Gather => self.resend_ms(),
            Phase::Run => self.cfg.heartbeat_ms,
        }
    }

    /// Beat interval while gathering: a lost state message costs this, not a heartbeat.
    fn resend_ms(&self) -> u64 {
        (self.cfg.heartbeat_ms / 4).max(1)
    }

    /// Least time between two proposals of the same membership by this member: bounds churn
    /// when connectivity is not transitive (outside the model, where coordinators could
    /// disagree forever).
    fn propose_gap_ms(&self) -> u64 {
        (self.cfg.heartbeat_ms / 2).max(1)
    }

    fn check_invariants(&self) {
        assert!(self.held.within(self.cfg.addresses.len()));
        assert!(
            self.held.is_empty() || self.mature,
            "immature members hold nothing"
        );
        if let Some(v) = &self.view {
            assert!(v.members.binary_search(&self.me).is_ok());
            assert_eq!(self.states.len(), v.members.len());
            if self.phase == Phase::Gather {
                assert!(self.pending.is_empty(), "no acquisition while gathering");
            }
        }
        for i in &self.pending {
            assert!(!self.held.contains(*i));
        }
    }
}
