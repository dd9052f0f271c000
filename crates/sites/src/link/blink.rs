//! BLink, the foil (Amir et al. 2009 §2 and §4, after Steward's BLink; spec/attack.md §2.3):
//! one elected *forwarder* of the sending site sends each message to one elected *receiver*
//! of the receiving site, and the other servers watch. The receiving site acknowledges what it
//! handed over (an `Ack`, threshold-signed like any site message, carried back over its own
//! BLink); every server of the sending site keeps what the site sent and, when a message stays
//! unacknowledged longer than the timeout on its clock, proposes (through local ordering) that
//! the pair be replaced. At f+1 distinct proposals the pair moves on, to the next of the
//! n x n (forwarder, receiver) pairs, and the new forwarder sends again what is unacknowledged.
//!
//! It is live: a faulty pair that stops forwarding is replaced within a timeout. It is not
//! attack-resilient, which is why the paper argues against it: a faulty forwarder and receiver
//! that pass each message on just before the timeout stay in power for ever and set the pace
//! of the whole system (the simulator's and the benchmark's attack).
//!
//! Safety does not rest on the pair: every message is checked against its site's threshold
//! signature when it is introduced and again when it is executed.

use super::inquiry::Control;
use super::{Emit, Executed, LinkEvent, LogicalLink, Payload, Timed, Wan, Whole};
use crate::message::{Refused, SignedMessage, SiteKeys};
use crate::timeouts::TimeoutVotes;
use crate::{Server, Shape, SiteId};
use std::collections::{BTreeMap, BTreeSet};

/// Messages to one site kept until acknowledged; beyond it the oldest go (a site that never
/// acknowledges is faulty, and the global protocol retransmits what matters).
pub const UNACKED_PER_SITE_MAX: usize = 4096;

/// The (forwarder, receiver) pair of `epoch` on the link from `from` to `to`: every one of the
/// n x n pairs in turn, starting at different servers for different links.
pub fn pair(shape: &Shape, from: SiteId, to: SiteId, epoch: u64) -> (Server, Server) {
    let n = shape.servers() as u64;
    let forwarder = (epoch + to.0 as u64) % n;
    let receiver = (epoch / n + from.0 as u64) % n;
    (Server(forwarder as u16), Server(receiver as u16))
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BLinkStats {
    pub forwarded: u64,
    pub resent: u64,
    pub acks_executed: u64,
    pub suspicions_proposed: u64,
    /// Times a pair was replaced, on every link from this site.
    pub pairs_replaced: u64,
    pub unacked_dropped: u64,
}

/// One message the site sent, as this server watches it.
#[derive(Clone, Debug)]
struct Watched {
    msg: SignedMessage,
    /// When, on this server's clock, its current pair became responsible for it.
    since_ms: u64,
}

/// BLink as one server runs it.
pub struct BLink {
    /// Who this server is, the site keys, and what it handed over.
    w: Whole,
    timeout_ms: u64,
    now_ms: u64,
    /// Per destination: the agreed epoch (changed only by executed proposals), the proposals
    /// counted for leaving it, and the epoch this server last proposed to leave.
    epochs: BTreeMap<SiteId, u64>,
    votes: TimeoutVotes<SiteId>,
    proposed: BTreeMap<SiteId, u64>,
    unacked: BTreeMap<SiteId, BTreeMap<u64, Watched>>,
    /// Destinations whose pair changed: the new forwarder sends their unacknowledged
    /// messages at the next timer call.
    replaced: BTreeSet<SiteId>,
    /// The highest message number handed over from each site (what we acknowledge).
    highest: BTreeMap<SiteId, u64>,
    stats: BLinkStats,
}

impl BLink {
    /// `timeout_ms`: how long a message may stay unacknowledged before this server proposes
    /// to replace the pair.
    pub fn new(
        shape: Shape,
        site: SiteId,
        me: Server,
        keys: SiteKeys,
        frame_bytes_max: usize,
        timeout_ms: u64,
    ) -> BLink {
        let mut votes = TimeoutVotes::new(shape.servers());
        let mut epochs = BTreeMap::new();
        for to in shape.site_ids().filter(|s| *s != site) {
            votes.arm(to, 1);
            epochs.insert(to, 0);
        }
        BLink {
            w: Whole::new(shape, site, me, keys, frame_bytes_max),
            timeout_ms,
            now_ms: 0,
            epochs,
            votes,
            proposed: BTreeMap::new(),
            unacked: BTreeMap::new(),
            replaced: BTreeSet::new(),
            highest: BTreeMap::new(),
            stats: BLinkStats::default(),
        }
    }

    pub fn stats(&self) -> &BLinkStats {
        &self.stats
    }

    /// The agreed epoch of the link to `to`.
    pub fn epoch(&self, to: SiteId) -> u64 {
        self.epochs.get(&to).copied().unwrap_or(0)
    }

    fn current_pair(&self, to: SiteId) -> (Server, Server) {
        pair(&self.w.shape, self.w.site, to, self.epoch(to))
    }

    fn frame_to(&self, to: SiteId, msg: &SignedMessage) -> Wan {
        Wan {
            to_site: to,
            to_server: self.current_pair(to).1,
            frame: LinkEvent::Message(msg.clone()).encode(),
        }
    }

    fn acknowledged(&mut self, by: SiteId, up_to: u64) {
        self.stats.acks_executed += 1;
        if let Some(watched) = self.unacked.get_mut(&by) {
            let rest = watched.split_off(&(up_to + 1));
            *watched = rest;
        }
    }

    fn executed_suspect(&mut self, to: SiteId, epoch: u64, by: Option<Server>) -> Executed {
        let Some(server) = by else {
            return Executed::refused(Refused::Malformed("a suspicion from a client".into()));
        };
        if !self.epochs.contains_key(&to) {
            return Executed::refused(Refused::UnknownSite(to));
        }
        // A late or repeated proposal is harmless; only the armed epoch counts.
        if let Ok(true) = self.votes.executed(server, &to, epoch + 1) {
            self.epochs.insert(to, epoch + 1);
            self.votes.arm(to, epoch + 2);
            self.stats.pairs_replaced += 1;
            self.replaced.insert(to);
            let now = self.now_ms;
            for w in self.unacked.entry(to).or_default().values_mut() {
                w.since_ms = now;
            }
        }
        Executed::default()
    }

    fn executed_message(&mut self, msg: &SignedMessage) -> Executed {
        if msg.site == self.w.site || !msg.for_site(self.w.site) {
            return Executed::refused(Refused::Malformed(
                "our own site's message, or one for another site".into(),
            ));
        }
        if let Err(e) = self.w.keys.check(msg) {
            return Executed::refused(e);
        }
        let mut out = Executed::default();
        if !self.w.delivered.first_time(msg.site, msg.seq) {
            return out;
        }
        match Payload::decode(&msg.body) {
            Ok(Payload::Control(Control::Ack { up_to })) => self.acknowledged(msg.site, up_to),
            Ok(Payload::Control(_)) => {
                return Executed::refused(Refused::Malformed(
                    "an erasure link's control message on BLink".into(),
                ))
            }
            _ => {
                // Handed over, and acknowledged in the bundle of this very event.
                let highest = self.highest.entry(msg.site).or_default();
                *highest = (*highest).max(msg.seq);
                out.emit.push(Emit {
                    to: msg.site,
                    control: Control::Ack { up_to: *highest },
                });
                out.delivered.push(msg.clone());
            }
        }
        out
    }
}

impl LogicalLink for BLink {
    fn send(&mut self, msg: &SignedMessage, to: SiteId) -> Vec<Wan> {
        if to == self.w.site || msg.site != self.w.site || !self.epochs.contains_key(&to) {
            return Vec::new();
        }
        // Acknowledgements are not themselves acknowledged.
        let is_ack = matches!(
            Payload::decode(&msg.body),
            Ok(Payload::Control(Control::Ack { .. }))
        );
        if !is_ack {
            let watched = self.unacked.entry(to).or_default();
            watched.insert(
                msg.seq,
                Watched {
                    msg: msg.clone(),
                    since_ms: self.now_ms,
                },
            );
            if watched.len() > UNACKED_PER_SITE_MAX {
                watched.pop_first();
                self.stats.unacked_dropped += 1;
            }
        }
        if self.current_pair(to).0 != self.w.me {
            return Vec::new();
        }
        self.stats.forwarded += 1;
        vec![self.frame_to(to, msg)]
    }

    fn receive(
        &mut self,
        site: SiteId,
        _from: Server,
        frame: &[u8],
    ) -> Result<Option<LinkEvent>, Refused> {
        self.w.receive(site, frame)
    }

    fn executed(&mut self, event: &LinkEvent) -> Executed {
        self.executed_by(event, None)
    }

    fn executed_by(&mut self, event: &LinkEvent, by: Option<Server>) -> Executed {
        match event {
            LinkEvent::Message(msg) => self.executed_message(msg),
            LinkEvent::Suspect { to, epoch } => self.executed_suspect(*to, *epoch, by),
            LinkEvent::Part(_) => {
                Executed::refused(Refused::Malformed("an erasure part on BLink".into()))
            }
        }
    }

    fn timer(&mut self, now_ms: u64) -> Timed {
        self.now_ms = self.now_ms.max(now_ms);
        let now = self.now_ms;
        let mut out = Timed::default();
        for to in std::mem::take(&mut self.replaced) {
            if self.current_pair(to).0 == self.w.me {
                let msgs: Vec<SignedMessage> = self
                    .unacked
                    .get(&to)
                    .map(|w| w.values().map(|w| w.msg.clone()).collect())
                    .unwrap_or_default();
                for msg in msgs {
                    self.stats.resent += 1;
                    out.wan.push(self.frame_to(to, &msg));
                }
            }
        }
        for (to, watched) in &self.unacked {
            let epoch = self.epochs.get(to).copied().unwrap_or(0);
            let overdue = watched
                .values()
                .next()
                .is_some_and(|w| now.saturating_sub(w.since_ms) > self.timeout_ms);
            if overdue && self.proposed.get(to).is_none_or(|p| *p <= epoch) {
                self.proposed.insert(*to, epoch + 1);
                self.stats.suspicions_proposed += 1;
                out.introduce.push(LinkEvent::Suspect { to: *to, epoch });
            }
        }
        out
    }
}
