//! A site server: its copy of the logical machine, its share of the site's signing key, and
//! its end of every logical link, driven by its host (ADR 0010; spec/attack.md §1.7, Figure 5).
//!
//! ```text
//!   local ordering executes an event ──► logical machine ──► bundle ──► share to the site
//!   shares from the site ──► f+1 combine ──► signed messages ──► link ──► WAN frames
//!   WAN frame ──► link check ──► event to introduce into local ordering
//!   own clock ──► tick proposal, link events to introduce; link frames due (hub timeouts)
//!   frame a server of the site sent, overheard on the hub ──► link
//! ```
//!
//! Pure, like everything in this crate: the host submits the events this returns to local
//! ordering (as this server's own requests), sends shares to the site's other servers and WAN
//! frames to other sites, and calls back with what arrives.

use crate::link::{LogicalLink, Misbehaviour, Wan};
use crate::machine::{Event, LogicalMachine, Participant, Step, Submitter};
use crate::message::{Bundle, Refused};
use crate::sign::{Share, ShareProof, ShareRefused, Signing, SiteSigner};
use crate::{Server, SiteId};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;

/// What the host does after a call.
#[derive(Debug, Default)]
pub struct Work {
    /// Shares to send to every other server of the site.
    pub shares: Vec<Share>,
    /// Frames to send to servers of other sites.
    pub wan: Vec<Wan>,
    /// Answers to send to local clients.
    pub replies: Vec<(u64, Vec<u8>)>,
    /// Faulty servers and sites found, with proofs (log them; `redoubt status` shows them).
    pub misbehaviour: Vec<Misbehaviour>,
    pub bad_shares: Vec<ShareProof>,
    /// The event could not be executed yet (see [`Step::blocked_on`]).
    pub blocked_on: Option<u64>,
    /// The event was refused, and why.
    pub refused: Option<String>,
}

/// What this server's clock gave.
#[derive(Debug, Default)]
pub struct Clocked {
    /// Events to introduce into local ordering (a tick proposal, a link's own).
    pub introduce: Vec<Vec<u8>>,
    /// Frames to send to servers of other sites.
    pub wan: Vec<Wan>,
}

/// A site server.
pub struct SiteServer<P, L> {
    me: Server,
    machine: LogicalMachine<P, L>,
    signer: SiteSigner,
    /// Bundles waiting for their site signature, and each message's destinations.
    unsigned: BTreeMap<Digest, (Bundle, Vec<Vec<SiteId>>)>,
    /// Their roots by first message number, oldest first.
    unsigned_order: BTreeMap<u64, Digest>,
    /// The tick round this server last proposed, and when (its own clock) it saw the round
    /// before it fire.
    proposed: u64,
    round_since_ms: Option<u64>,
    tick_ms: u64,
    mutant: crate::Mutant,
    sent: Sent,
}

/// What this server handed its link to send: signed messages, counted once per destination,
/// and their encoded bytes (what one copy per destination costs: the measure of a link's
/// wide-area overhead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    pub messages: u64,
    pub bytes: u64,
}

impl<P: Participant, L: LogicalLink> SiteServer<P, L> {
    /// `tick_ms`: how long after a tick fires this server proposes the next one.
    pub fn new(
        me: Server,
        machine: LogicalMachine<P, L>,
        signer: SiteSigner,
        tick_ms: u64,
    ) -> Self {
        assert!(tick_ms > 0);
        SiteServer {
            me,
            machine,
            signer,
            unsigned: BTreeMap::new(),
            unsigned_order: BTreeMap::new(),
            proposed: 0,
            round_since_ms: None,
            tick_ms,
            mutant: crate::Mutant::None,
            sent: Sent::default(),
        }
    }

    /// The simulator's broken variants ([`crate::Mutant`]), in every part of the server.
    pub fn set_mutant(&mut self, mutant: crate::Mutant) {
        self.mutant = mutant;
        self.signer.set_mutant(mutant);
        self.machine.link_mut().set_mutant(mutant);
    }

    pub fn machine(&self) -> &LogicalMachine<P, L> {
        &self.machine
    }
    pub fn machine_mut(&mut self) -> &mut LogicalMachine<P, L> {
        &mut self.machine
    }
    pub fn signer(&self) -> &SiteSigner {
        &self.signer
    }

    /// Local ordering executed `op`, submitted by `by`, in a batch of agreed time `agreed_ms`;
    /// `now_ms` is this server's clock.
    pub fn executed(&mut self, op: &[u8], by: Submitter, agreed_ms: u64, now_ms: u64) -> Work {
        let time = if self.mutant == crate::Mutant::ServerClock {
            now_ms
        } else {
            agreed_ms
        };
        let step: Step = self.machine.execute(op, by, time);
        let mut work = Work {
            replies: step.replies,
            misbehaviour: step.misbehaviour,
            blocked_on: step.blocked_on,
            refused: step.refused,
            ..Work::default()
        };
        if step.ticked {
            self.round_since_ms = Some(now_ms);
        }
        if let Some((bundle, dests)) = step.bundle {
            let root = bundle.root();
            self.unsigned_order.insert(bundle.first_seq(), root);
            self.unsigned.insert(root, (bundle, dests));
            let out = self.signer.local(root);
            self.signing(out, &mut work);
        }
        work
    }

    /// A share that server `from` of the site sent (the local transport authenticated it).
    pub fn on_share(&mut self, from: Server, share: Share) -> Result<Work, ShareRefused> {
        let out = self.signer.on_share(from, share)?;
        let mut work = Work::default();
        self.signing(out, &mut work);
        Ok(work)
    }

    /// A frame from server `from` of site `site`: the event to introduce into local ordering.
    pub fn on_wan(
        &mut self,
        site: SiteId,
        from: Server,
        frame: &[u8],
    ) -> Result<Option<Vec<u8>>, Refused> {
        Ok(self
            .machine
            .link_mut()
            .receive(site, from, frame)?
            .map(|e| Event::Link(e).encode()))
    }

    /// This server's clock reads `now_ms`: a tick proposal if one is due, and what the link
    /// does at this time.
    pub fn clock(&mut self, now_ms: u64) -> Clocked {
        let timed = self.machine.link_mut().timer(now_ms);
        let mut out = Clocked {
            introduce: timed
                .introduce
                .into_iter()
                .map(|e| Event::Link(e).encode())
                .collect(),
            wan: timed.wan,
        };
        let round = self.machine.tick_round();
        let since = *self.round_since_ms.get_or_insert(now_ms);
        if self.proposed < round && now_ms.saturating_sub(since) >= self.tick_ms {
            self.proposed = round;
            out.introduce.push(Event::Tick { round }.encode());
        }
        out
    }

    /// A frame server `from` of this site sent to the wide area, overheard on the site's hub.
    pub fn on_overheard(&mut self, from: Server, frame: &[u8]) {
        if from != self.me {
            self.machine.link_mut().overhear(from, frame);
        }
    }

    fn signing(&mut self, out: Vec<Signing>, work: &mut Work) {
        for o in out {
            match o {
                Signing::Share(s) => work.shares.push(s),
                Signing::Blacklisted(p) => work.bad_shares.push(p),
                Signing::Signed { root, sig } => {
                    let Some((bundle, dests)) = self.unsigned.remove(&root) else {
                        continue;
                    };
                    self.unsigned_order.remove(&bundle.first_seq());
                    for (msg, to) in bundle.signed(sig).iter().zip(dests) {
                        self.sent.messages += to.len() as u64;
                        self.sent.bytes += (msg.encode().len() * to.len()) as u64;
                        for site in to {
                            work.wan.extend(self.machine.link_mut().send(msg, site));
                        }
                    }
                }
            }
        }
        // The signer gives up its oldest roots beyond its bound; so do we.
        while self.unsigned.len() > crate::sign::PENDING_MAX {
            let (_, oldest) = self
                .unsigned_order
                .pop_first()
                .expect("as many as unsigned");
            self.unsigned.remove(&oldest);
        }
    }

    pub fn sent(&self) -> Sent {
        self.sent
    }

    pub fn me(&self) -> Server {
        self.me
    }
}
