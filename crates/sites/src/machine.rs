//! The logical machine (Amir et al. 2009 §3.1; ADR 0010, decisions 1 and 2): what every server
//! of a site runs on the events its local ordering executed, so that all correct servers of the
//! site compute the same global state and emit the same global messages with the same numbers.
//!
//! Local ordering carries [`Event`]s: a link event a server received (a whole signed message or
//! an erasure part), a server's proposal that the logical machine's clock ticked, or a local
//! client's update. Executing one, the machine hands what it delivers to the global protocol (a
//! [`Participant`]) and numbers every message the protocol emits, in one [`Bundle`] per event:
//! the bundle each server then threshold-signs ([`crate::server`]).
//!
//! Time: the participant never reads a clock. Its time is the agreed time of the local batch
//! that ran the event (local ordering's proposal time, which correct servers check against
//! their clocks), and its timers are looked at only when a tick fires, which takes f+1 servers'
//! proposals ([`TimeoutVotes`]): a faulty local leader moves the logical machine's clock by at
//! most the clock skew local ordering allows, and faulty servers alone fire no tick.

use crate::link::{Emit, LinkEvent, LogicalLink, Misbehaviour, Payload};
use crate::message::{Bundle, BUNDLE_MESSAGES_MAX};
use crate::timeouts::TimeoutVotes;
use crate::{Server, Shape, SiteId};
use serde::{Deserialize, Serialize};

/// What local ordering carries for the logical machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A link event a server received from another site.
    Link(LinkEvent),
    /// The submitting server's clock says tick `round` is due.
    Tick { round: u64 },
    /// The submitting local client's update.
    Update(#[serde(with = "serde_bytes")] Vec<u8>),
}

impl Event {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("an event encodes")
    }
    pub fn decode(bytes: &[u8]) -> Result<Event, String> {
        postcard::from_bytes(bytes).map_err(|e| format!("event does not decode: {e}"))
    }
}

/// Who submitted an event to local ordering (local ordering authenticated it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitter {
    Server(Server),
    Client(u64),
}

/// What the global protocol asks of its logical machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GlobalOut {
    /// A frame to one site.
    Send { to: SiteId, body: Vec<u8> },
    /// A frame to every other site.
    Broadcast { body: Vec<u8> },
    /// An answer for a local client (every correct server of the site sends the same).
    Reply { client: u64, body: Vec<u8> },
}

/// The global protocol as one logical machine runs it: deterministic, fed only by locally
/// executed events.
pub trait Participant {
    /// A global message from `site` (its site signature checked).
    fn on_message(&mut self, now_ms: u64, site: SiteId, body: &[u8]) -> Vec<GlobalOut>;
    /// A tick fired: timers due at `now_ms` fire.
    fn on_tick(&mut self, now_ms: u64) -> Vec<GlobalOut>;
    /// A local client's update.
    fn on_update(&mut self, now_ms: u64, client: u64, update: &[u8]) -> Vec<GlobalOut>;
}

/// What executing one event gave.
#[derive(Debug, Default)]
pub struct Step {
    /// The messages the event made, numbered, and each one's destinations.
    pub bundle: Option<(Bundle, Vec<Vec<SiteId>>)>,
    pub replies: Vec<(u64, Vec<u8>)>,
    /// The event was not executed, and why (malformed, forged, a tick from a client ...).
    pub refused: Option<String>,
    pub misbehaviour: Vec<Misbehaviour>,
    /// The event cannot run before this server sent its site's message with this number:
    /// execute it again then (see [`crate::link::Executed::blocked_on`]).
    pub blocked_on: Option<u64>,
    /// A tick fired.
    pub ticked: bool,
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineStats {
    pub events: u64,
    pub refused: u64,
    pub delivered: u64,
    pub ticks: u64,
    pub updates: u64,
    pub messages: u64,
}

/// One server's copy of its site's logical machine.
pub struct LogicalMachine<P, L> {
    shape: Shape,
    site: SiteId,
    participant: P,
    link: L,
    ticks: TimeoutVotes<()>,
    /// Ticks fired so far; the next one is round `fired + 1`.
    fired: u64,
    /// The number the next emitted message gets.
    next_seq: u64,
    stats: MachineStats,
}

impl<P: Participant, L: LogicalLink> LogicalMachine<P, L> {
    pub fn new(shape: Shape, site: SiteId, participant: P, link: L) -> Self {
        let mut ticks = TimeoutVotes::new(shape.servers());
        ticks.arm((), 1);
        LogicalMachine {
            shape,
            site,
            participant,
            link,
            ticks,
            fired: 0,
            next_seq: 0,
            stats: MachineStats::default(),
        }
    }

    pub fn participant(&self) -> &P {
        &self.participant
    }
    /// The participant, for what the host reads off it (observations, metrics); it must not
    /// be fed inputs other than through [`LogicalMachine::execute`].
    pub fn participant_mut(&mut self) -> &mut P {
        &mut self.participant
    }
    pub fn link(&self) -> &L {
        &self.link
    }
    /// The link, for what a server does outside the local order: sending and receiving.
    pub fn link_mut(&mut self) -> &mut L {
        &mut self.link
    }
    pub fn stats(&self) -> &MachineStats {
        &self.stats
    }
    /// The tick round a server proposes next.
    pub fn tick_round(&self) -> u64 {
        self.fired + 1
    }
    /// The number the next emitted message gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Executes one locally ordered event, submitted by `by`, in a batch of agreed time
    /// `now_ms`.
    pub fn execute(&mut self, op: &[u8], by: Submitter, now_ms: u64) -> Step {
        self.stats.events += 1;
        let mut step = Step::default();
        // A server our site proved faulty (its bad parts, Figure 3) is not heard any more.
        if let Submitter::Server(s) = by {
            if self.link.own_blacklisted(s) {
                return self.refuse(step, format!("{s} was found faulty by its own site"));
            }
        }
        let event = match Event::decode(op) {
            Ok(e) => e,
            Err(e) => return self.refuse(step, e),
        };
        let mut outs = Vec::new();
        let mut emits = Vec::new();
        match event {
            Event::Link(e) => {
                let server = match by {
                    Submitter::Server(s) => Some(s),
                    Submitter::Client(_) => None,
                };
                let done = self.link.executed_by(&e, server);
                if let Some(r) = done.refused {
                    return self.refuse(step, r.to_string());
                }
                step.blocked_on = done.blocked_on;
                step.misbehaviour = done.misbehaviour;
                emits = done.emit;
                for msg in done.delivered {
                    // A message signed for another site is not ours, whoever handed it over.
                    if !msg.for_site(self.site) {
                        self.stats.refused += 1;
                        continue;
                    }
                    // A link's own messages are the link's; only global frames go on.
                    if let Ok(Payload::Global(body)) = Payload::decode(&msg.body) {
                        self.stats.delivered += 1;
                        outs.extend(self.participant.on_message(now_ms, msg.site, &body));
                    }
                }
            }
            Event::Tick { round } => {
                let Submitter::Server(server) = by else {
                    return self.refuse(step, "a tick from a client".into());
                };
                match self.ticks.executed(server, &(), round) {
                    Ok(true) => {
                        self.fired = round;
                        self.ticks.arm((), round + 1);
                        self.stats.ticks += 1;
                        step.ticked = true;
                        outs.extend(self.participant.on_tick(now_ms));
                    }
                    Ok(false) => {}
                    // A late or repeated proposal: harmless, nothing to do.
                    Err(_) => {}
                }
            }
            Event::Update(update) => {
                let Submitter::Client(client) = by else {
                    return self.refuse(step, "an update from a server".into());
                };
                self.stats.updates += 1;
                outs.extend(self.participant.on_update(now_ms, client, &update));
            }
        }
        self.bundle(&mut step, outs, emits);
        step
    }

    fn refuse(&mut self, mut step: Step, why: String) -> Step {
        self.stats.refused += 1;
        step.refused = Some(why);
        step
    }

    fn bundle(&mut self, step: &mut Step, outs: Vec<GlobalOut>, emits: Vec<Emit>) {
        let others: Vec<SiteId> = self.shape.site_ids().filter(|s| *s != self.site).collect();
        let mut bodies = Vec::new();
        let mut dests = Vec::new();
        // The link's own messages first: a cut below never drops an INQUIRY whose answer the
        // link already waits for.
        for e in emits {
            bodies.push((Payload::Control(e.control).encode(), Some(e.to)));
            dests.push(vec![e.to]);
        }
        for out in outs {
            match out {
                GlobalOut::Send { to, body } if to != self.site && self.shape.has_site(to) => {
                    bodies.push((Payload::Global(body).encode(), Some(to)));
                    dests.push(vec![to]);
                }
                GlobalOut::Send { .. } => {}
                GlobalOut::Broadcast { body } => {
                    bodies.push((Payload::Global(body).encode(), None));
                    dests.push(others.clone());
                }
                GlobalOut::Reply { client, body } => step.replies.push((client, body)),
            }
        }
        if bodies.is_empty() {
            return;
        }
        // A participant emitting more in one event than a bundle holds is a bug of the
        // participant; the cut drops its last messages and keeps numbering and signing sound.
        debug_assert!(bodies.len() <= BUNDLE_MESSAGES_MAX);
        bodies.truncate(BUNDLE_MESSAGES_MAX);
        dests.truncate(BUNDLE_MESSAGES_MAX);
        let bundle = Bundle::addressed(self.site, self.next_seq, bodies);
        self.next_seq += bundle.len() as u64;
        self.stats.messages += bundle.len() as u64;
        step.bundle = Some((bundle, dests));
    }
}
