//! Logical links behind one interface (Amir et al. 2009 §4; ADR 0010, decision 5).
//!
//! A logical link carries a site's signed global messages to another site. Sending, a server
//! turns a message its site signed into the WAN frames *it* sends (which depends on the link:
//! the whole message to a few peers, or one erasure part to its own peer). Receiving, a server
//! checks a WAN frame and introduces what it carries into its site's local ordering as a
//! [`LinkEvent`]; only when local ordering executes that event does the link hand messages to
//! the logical machine, so every correct server of the site hands over the same messages at
//! the same point of the local order (trap 6).
//!
//! Safety never rests on the link: a message reaches the logical machine only under its site's
//! threshold signature, checked again at execution (a faulty server can introduce anything).
//!
//! - [`naive`]: f+1 senders each send the whole message to f+1 receivers;
//! - [`erasure`]: MDS(3f+1, f+1) parts, part i from server i to its peer;
//! - [`hub`]: the erasure-coded link over a broadcast hub, (2f+1, 3f+1) parts, a second set of
//!   senders that stays quiet when it overhears the first set's parts in time;
//! - [`blink`]: one elected forwarder and receiver, replaced when messages stay
//!   unacknowledged too long (the foil: live, not attack-resilient);
//! - [`df`]: through each site's dependable forwarder ([`crate::forwarder`]), one copy of
//!   each message on the wide area.

pub mod blink;
pub mod df;
pub mod erasure;
pub mod hub;
pub mod inquiry;
pub mod naive;
mod resend;

use crate::message::{Refused, SignedMessage, SiteKeys};
use crate::{Server, Shape, SiteId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub use blink::BLink;
pub use df::{Df, FORWARDER};
pub use erasure::{Erasure, Part};
pub use hub::HubConfig;
pub use inquiry::{Control, Misbehaviour};
pub use naive::Naive;

/// What a signed message's body carries: a frame of the global protocol, for the logical
/// machine, or a message of a link's own protocol (the erasure-coded link's blacklisting),
/// which that link handles itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Payload {
    Global(#[serde(with = "serde_bytes")] Vec<u8>),
    Control(Control),
}

impl Payload {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a payload encodes")
    }
    pub fn decode(bytes: &[u8]) -> Result<Payload, Refused> {
        postcard::from_bytes(bytes).map_err(|e| Refused::Malformed(e.to_string()))
    }
}

/// A link-protocol message the logical machine must sign (in the bundle of the event being
/// executed) and send to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emit {
    pub to: SiteId,
    pub control: Control,
}

/// A frame this server sends across the wide area to one server of another site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wan {
    pub to_site: SiteId,
    pub to_server: Server,
    pub frame: Vec<u8>,
}

/// What a server introduces into its site's local ordering for a link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkEvent {
    /// A whole signed message.
    Message(SignedMessage),
    /// One erasure part of a message.
    Part(Part),
    /// This server proposes that the link to `to` leave its `epoch` (BLink: a message stayed
    /// unacknowledged too long); counted per submitting server.
    Suspect { to: SiteId, epoch: u64 },
}

impl LinkEvent {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a link event encodes")
    }
    pub fn decode(bytes: &[u8], bytes_max: usize) -> Result<LinkEvent, Refused> {
        if bytes.len() > bytes_max {
            return Err(Refused::TooLarge(bytes.len(), bytes_max));
        }
        postcard::from_bytes(bytes).map_err(|e| Refused::Malformed(e.to_string()))
    }
}

/// What executing a link event gave the logical machine, and what went wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Executed {
    /// Messages the logical machine now processes, each once.
    pub delivered: Vec<SignedMessage>,
    /// The event was refused at execution (a faulty server introduced it).
    pub refused: Option<Refused>,
    /// Parts that decoded to no validly signed message (see [`erasure`]).
    pub failed: Vec<erasure::FailedDecoding>,
    /// Link-protocol messages to sign and send.
    pub emit: Vec<Emit>,
    /// Servers or sites found faulty, with the proof.
    pub misbehaviour: Vec<Misbehaviour>,
    /// The event cannot be executed until this server has sent its site's message with this
    /// number (an INQUIRY about it came first): execute the same event again after that.
    pub blocked_on: Option<u64>,
}

impl Executed {
    pub(crate) fn refused(r: Refused) -> Executed {
        Executed {
            refused: Some(r),
            ..Executed::default()
        }
    }
}

/// What a link does when its server's clock moves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timed {
    /// Frames whose time came, to send now.
    pub wan: Vec<Wan>,
    /// Events to introduce into local ordering.
    pub introduce: Vec<LinkEvent>,
}

/// One logical link, as one server of a site runs it.
pub trait LogicalLink {
    /// This server's frames for a message its site signed, to site `to`.
    fn send(&mut self, msg: &SignedMessage, to: SiteId) -> Vec<Wan>;
    /// A frame that came from server `from` of site `site` (as the hop's transport says; only
    /// signatures are trusted): the event to introduce into local ordering, if any.
    fn receive(
        &mut self,
        site: SiteId,
        from: Server,
        frame: &[u8],
    ) -> Result<Option<LinkEvent>, Refused>;
    /// Local ordering executed `event`.
    fn executed(&mut self, event: &LinkEvent) -> Executed;
    /// Local ordering executed `event`, which server `by` of this site introduced (`None`: a
    /// client did). Links that count servers' proposals need it; the others ignore it.
    fn executed_by(&mut self, event: &LinkEvent, _by: Option<Server>) -> Executed {
        self.executed(event)
    }
    /// A frame another server of this site sent to the wide area, seen on the site's hub
    /// (overhearing, [`hub`]); a link without a hub ignores it.
    fn overhear(&mut self, _from: Server, _frame: &[u8]) {}
    /// This server's clock reads `now_ms` (its host calls this every few milliseconds).
    fn timer(&mut self, _now_ms: u64) -> Timed {
        Timed::default()
    }
    /// The simulator's broken variants ([`crate::Mutant`]); a link without one ignores it.
    fn set_mutant(&mut self, _mutant: crate::Mutant) {}
    /// The sites and servers this link found faulty, for a link that blacklists.
    fn blacklists(&self) -> Option<Blacklists> {
        None
    }
    /// Whether this site found its own server `server` faulty (at local execution, so every
    /// correct server of the site agrees).
    fn own_blacklisted(&self, _server: Server) -> bool {
        false
    }
}

/// A link chosen at run time.
impl<L: LogicalLink + ?Sized> LogicalLink for Box<L> {
    fn send(&mut self, msg: &SignedMessage, to: SiteId) -> Vec<Wan> {
        (**self).send(msg, to)
    }
    fn receive(
        &mut self,
        site: SiteId,
        from: Server,
        frame: &[u8],
    ) -> Result<Option<LinkEvent>, Refused> {
        (**self).receive(site, from, frame)
    }
    fn executed(&mut self, event: &LinkEvent) -> Executed {
        (**self).executed(event)
    }
    fn executed_by(&mut self, event: &LinkEvent, by: Option<Server>) -> Executed {
        (**self).executed_by(event, by)
    }
    fn overhear(&mut self, from: Server, frame: &[u8]) {
        (**self).overhear(from, frame)
    }
    fn timer(&mut self, now_ms: u64) -> Timed {
        (**self).timer(now_ms)
    }
    fn set_mutant(&mut self, mutant: crate::Mutant) {
        (**self).set_mutant(mutant)
    }
    fn blacklists(&self) -> Option<Blacklists> {
        (**self).blacklists()
    }
    fn own_blacklisted(&self, server: Server) -> bool {
        (**self).own_blacklisted(server)
    }
}

/// What every link that carries whole messages holds: who it serves, the keys that check a
/// message, and which messages it handed over.
#[derive(Clone, Debug)]
pub(crate) struct Whole {
    pub shape: Shape,
    pub site: SiteId,
    pub me: Server,
    pub keys: SiteKeys,
    pub frame_bytes_max: usize,
    pub delivered: Delivered,
}

impl Whole {
    pub fn new(
        shape: Shape,
        site: SiteId,
        me: Server,
        keys: SiteKeys,
        frame_bytes_max: usize,
    ) -> Whole {
        Whole {
            shape,
            site,
            me,
            keys,
            frame_bytes_max,
            delivered: Delivered::default(),
        }
    }
    /// What a frame from `site` gives: the message to introduce, checked against its site's
    /// signature, unless it was already handed over.
    pub fn receive(&self, site: SiteId, frame: &[u8]) -> Result<Option<LinkEvent>, Refused> {
        let LinkEvent::Message(msg) = LinkEvent::decode(frame, self.frame_bytes_max)? else {
            return Err(Refused::Malformed(
                "not a whole message on this link".into(),
            ));
        };
        if msg.site != site {
            // A site's own messages only.
            return Err(Refused::Malformed(format!(
                "{} carried a message of {}",
                site, msg.site
            )));
        }
        if self.delivered.contains(msg.site, msg.seq) {
            return Ok(None);
        }
        self.keys.check(&msg)?;
        Ok(Some(LinkEvent::Message(msg)))
    }

    /// Local ordering executed `event`: the message is checked again (the server that
    /// introduced it may be faulty; the verdict is the same at every server, so every correct
    /// server hands over the same messages) and handed over once.
    pub fn executed(&mut self, event: &LinkEvent) -> Executed {
        let LinkEvent::Message(msg) = event else {
            return Executed::refused(Refused::Malformed(
                "not a whole message on this link".into(),
            ));
        };
        if msg.site == self.site {
            return Executed::refused(Refused::Malformed("our own site's message".into()));
        }
        if let Err(e) = self.keys.check(msg) {
            return Executed::refused(e);
        }
        let mut out = Executed::default();
        if self.delivered.first_time(msg.site, msg.seq) {
            out.delivered.push(msg.clone());
        }
        out
    }
}

/// Sites, and servers by site, a link found faulty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blacklists {
    pub sites: BTreeSet<SiteId>,
    pub servers: BTreeMap<SiteId, BTreeSet<Server>>,
}

/// Messages handed to the logical machine, per sending site: each is handed over once.
/// Bounded: the newest [`DELIVERED_PER_SITE_MAX`] numbers of each site are remembered, and a
/// number at or below the oldest forgotten one counts as delivered.
#[derive(Clone, Debug, Default)]
pub struct Delivered {
    sites: BTreeMap<SiteId, (Option<u64>, BTreeSet<u64>)>,
}

pub const DELIVERED_PER_SITE_MAX: usize = 4096;

impl Delivered {
    pub fn contains(&self, site: SiteId, seq: u64) -> bool {
        self.sites
            .get(&site)
            .is_some_and(|(floor, seen)| floor.is_some_and(|f| seq <= f) || seen.contains(&seq))
    }
    /// Records `seq` of `site`; whether it was new.
    pub fn first_time(&mut self, site: SiteId, seq: u64) -> bool {
        if self.contains(site, seq) {
            return false;
        }
        let (floor, seen) = self.sites.entry(site).or_default();
        seen.insert(seq);
        while seen.len() > DELIVERED_PER_SITE_MAX {
            let oldest = seen.pop_first().expect("not empty");
            *floor = Some(oldest);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_delivered_once_and_memory_stays_bounded() {
        let mut d = Delivered::default();
        assert!(d.first_time(SiteId(1), 5));
        assert!(!d.first_time(SiteId(1), 5));
        assert!(d.first_time(SiteId(2), 5));
        for s in 10..10 + DELIVERED_PER_SITE_MAX as u64 {
            assert!(d.first_time(SiteId(1), s));
        }
        // 5 was forgotten: it and everything below it now count as delivered.
        assert!(
            d.contains(SiteId(1), 3),
            "below the floor counts as delivered"
        );
        assert!(!d.first_time(SiteId(1), 5));
        assert!(!d.contains(SiteId(1), 1_000_000));
        assert_eq!(d.sites[&SiteId(1)].1.len(), DELIVERED_PER_SITE_MAX);
    }
}
