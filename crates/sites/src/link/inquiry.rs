//! Blacklisting on the erasure-coded link (Amir et al. 2009 §4.1.1, Figure 3; spec/attack.md
//! §2.5 and trap 7).
//!
//! Erasure parts are not individually verifiable: when f+1 parts from site S decode to no
//! validly signed message, the receiving site R cannot tell whether some parts were bad or S
//! encoded a badly signed message. So R asks: it threshold-signs an INQUIRY naming the f+1
//! parts it used and sends it peer to peer (never erasure coded), and handles nothing more from
//! S but the answer. S, knowing what it encoded, recomputes the parts:
//!
//! - every part in the INQUIRY is a correct part: R's inquiry is spurious, S blacklists R;
//! - the bad parts name only servers S's earlier answers to R already named: R asked twice
//!   about the same server, S blacklists R;
//! - otherwise S blacklists its own servers whose parts were bad and answers with an
//!   INQUIRY-RESPONSE carrying the whole message.
//!
//! R, with the whole message, recomputes the parts: if they all match what it decoded, S
//! encoded a badly signed message and R blacklists S; otherwise R blacklists the servers of S
//! whose parts did not match (S as a whole once more than f are), hands over the message if it
//! is validly signed, and resumes S. Every step runs at local execution, on locally ordered
//! events, so every correct server of a site takes the same decisions; each decision keeps its
//! proof for an operator.
//!
//! One INQUIRY per site at a time: R numbers them and sends the next only after it processed
//! the answer to the last; S answers only the next number it expects from R.

use super::erasure::{bad_parts, FailedDecoding, Part};
use super::Emit;
use crate::message::SignedMessage;
use crate::{Server, Shape, SiteId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Proofs kept for the operator; older ones are dropped (the host logs each as it comes).
pub const PROOFS_MAX: usize = 64;

/// The link-protocol messages: threshold-signed by their site, sent server i to server i.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    Inquiry(Inquiry),
    Response(Response),
    /// BLink: the receiving site handed over every message of the sender numbered up to this
    /// that reached it.
    Ack {
        up_to: u64,
    },
}

/// R asks S about a failed decoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inquiry {
    /// inquirySeq_{R,S}.
    pub seq: u64,
    /// The f+1 parts the failed decoding used.
    pub parts: Vec<Part>,
    /// erasureSeq_{S,R}: the number of S's message in question.
    pub erasure_seq: u64,
    /// R, and S.
    pub from: SiteId,
    pub about: SiteId,
}

/// S answers with the message it encoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub seq: u64,
    pub erasure_seq: u64,
    /// The whole message, as S signed it.
    pub message: SignedMessage,
    /// S, and R.
    pub from: SiteId,
    pub to: SiteId,
}

/// A server or a site found faulty, and what shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// These servers of `site` signed parts that are not parts of the message their site sent
    /// (`message`, validly signed by it, carried by an INQUIRY-RESPONSE or retained here).
    BadParts {
        site: SiteId,
        servers: BTreeSet<Server>,
        parts: Vec<Part>,
        message: SignedMessage,
    },
    /// `site` sent an INQUIRY about parts that were all correct, or about servers already found
    /// faulty, or with parts its servers' signatures do not cover.
    SpuriousInquiry {
        site: SiteId,
        inquiry: SignedMessage,
        why: &'static str,
    },
    /// `site` encoded a message that is not validly signed: its INQUIRY-RESPONSE gives a
    /// message whose parts are exactly the ones that failed.
    BadEncoding {
        site: SiteId,
        response: SignedMessage,
    },
    /// More than f servers of `site` were found faulty: the site is.
    TooManyFaultyServers { site: SiteId, servers: usize },
}

/// What a control message's execution gave.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub emit: Option<Emit>,
    pub deliver: Option<SignedMessage>,
    pub misbehaviour: Vec<Misbehaviour>,
    pub blocked_on: Option<u64>,
}

/// One server's state of Figure 3, for every other site.
#[derive(Clone, Debug)]
pub struct Inquiries {
    shape: Shape,
    site: SiteId,
    /// Parts that decode a message on this link (f+1 erasure-coded, 2f+1 on a hub).
    data: usize,
    /// As R: the number of the next INQUIRY to S, and the one awaiting its answer (S is
    /// suspended meanwhile).
    next_to: BTreeMap<SiteId, u64>,
    pending: BTreeMap<SiteId, (u64, FailedDecoding)>,
    /// As S: the next INQUIRY number each R may send, and the servers of ours our answers
    /// to it implicated (R ignores their parts since, so it has no cause to ask about them).
    expected_from: BTreeMap<SiteId, u64>,
    implicated_to: BTreeMap<SiteId, BTreeSet<Server>>,
    /// Servers found faulty, by site (our own site included), and whole sites.
    servers: BTreeMap<SiteId, BTreeSet<Server>>,
    sites: BTreeSet<SiteId>,
    proofs: VecDeque<Misbehaviour>,
    mutant: crate::Mutant,
}

impl Inquiries {
    pub fn new(shape: Shape, site: SiteId, data: usize) -> Inquiries {
        Inquiries {
            shape,
            site,
            data,
            next_to: BTreeMap::new(),
            pending: BTreeMap::new(),
            expected_from: BTreeMap::new(),
            implicated_to: BTreeMap::new(),
            servers: BTreeMap::new(),
            sites: BTreeSet::new(),
            proofs: VecDeque::new(),
            mutant: crate::Mutant::None,
        }
    }

    pub(crate) fn set_mutant(&mut self, mutant: crate::Mutant) {
        self.mutant = mutant;
    }

    pub fn site_blacklisted(&self, site: SiteId) -> bool {
        self.sites.contains(&site)
    }
    pub fn server_blacklisted(&self, site: SiteId, server: Server) -> bool {
        self.servers.get(&site).is_some_and(|s| s.contains(&server))
    }
    /// The failed decoding S is suspended on, if it is.
    /// The number of our INQUIRY to `site` awaiting its answer.
    pub fn pending_inquiry(&self, site: SiteId) -> Option<u64> {
        self.pending.get(&site).map(|(seq, _)| *seq)
    }

    pub fn pending(&self, site: SiteId) -> Option<&FailedDecoding> {
        self.pending.get(&site).map(|(_, f)| f)
    }
    pub fn blacklisted_sites(&self) -> &BTreeSet<SiteId> {
        &self.sites
    }
    pub fn blacklisted_servers(&self) -> &BTreeMap<SiteId, BTreeSet<Server>> {
        &self.servers
    }
    pub fn proofs(&self) -> impl Iterator<Item = &Misbehaviour> {
        self.proofs.iter()
    }

    fn found(&mut self, m: Misbehaviour, out: &mut Outcome) {
        match &m {
            Misbehaviour::BadParts { .. }
                if self.mutant == crate::Mutant::NoBlacklisting && !self.is_own(&m) => {}
            Misbehaviour::BadParts { site, servers, .. } => {
                let known = self.servers.entry(*site).or_default();
                known.extend(servers.iter().copied());
                let n = known.len();
                if n > self.shape.f() && *site != self.site {
                    self.sites.insert(*site);
                    self.pending.remove(site);
                    let too_many = Misbehaviour::TooManyFaultyServers {
                        site: *site,
                        servers: n,
                    };
                    self.keep(too_many.clone());
                    out.misbehaviour.push(too_many);
                }
            }
            Misbehaviour::SpuriousInquiry { site, .. } | Misbehaviour::BadEncoding { site, .. } => {
                self.sites.insert(*site);
                self.pending.remove(site);
            }
            Misbehaviour::TooManyFaultyServers { site, .. } => {
                self.sites.insert(*site);
            }
        }
        self.keep(m.clone());
        out.misbehaviour.insert(0, m);
    }

    fn is_own(&self, m: &Misbehaviour) -> bool {
        matches!(m, Misbehaviour::BadParts { site, .. } if *site == self.site)
    }

    fn keep(&mut self, m: Misbehaviour) {
        if self.proofs.len() >= PROOFS_MAX {
            self.proofs.pop_front();
        }
        self.proofs.push_back(m);
    }

    /// As R: a decoding of S's parts failed (lines A1-A7). S is suspended and the INQUIRY to
    /// sign and send is returned.
    pub(crate) fn failed(&mut self, failed: FailedDecoding) -> Option<Emit> {
        let s = failed.site;
        if self.sites.contains(&s) || self.pending.contains_key(&s) {
            return None;
        }
        let seq = *self.next_to.entry(s).or_insert(0);
        let inquiry = Inquiry {
            seq,
            parts: failed.parts.clone(),
            erasure_seq: failed.seq,
            from: self.site,
            about: s,
        };
        self.pending.insert(s, (seq, failed));
        Some(Emit {
            to: s,
            control: Control::Inquiry(inquiry),
        })
    }

    /// As S: R's INQUIRY was executed (lines C1-C9). `signed` is the message that carried it
    /// (validly signed by R), `retained` the message of ours it asks about if this server has
    /// sent it, `part_signed` whether one of our servers signed a part.
    pub(crate) fn on_inquiry(
        &mut self,
        signed: &SignedMessage,
        inq: &Inquiry,
        retained: Option<&SignedMessage>,
        part_signed: impl Fn(&Part) -> bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        let r = signed.site;
        if inq.from != r || inq.about != self.site || self.sites.contains(&r) {
            return out;
        }
        if inq.seq != self.expected_from.get(&r).copied().unwrap_or(0) {
            return out;
        }
        let spurious = |why| Misbehaviour::SpuriousInquiry {
            site: r,
            inquiry: signed.clone(),
            why,
        };
        let indices: BTreeSet<Server> = inq.parts.iter().map(|p| p.index).collect();
        let well_formed = inq.parts.len() == self.data
            && indices.len() == inq.parts.len()
            && inq.parts.iter().all(|p| {
                p.site == self.site
                    && p.to == r
                    && p.seq == inq.erasure_seq
                    && self.shape.has_server(p.index)
                    && part_signed(p)
            });
        if !well_formed {
            self.found(spurious("parts our servers did not sign"), &mut out);
            return out;
        }
        let Some(message) = retained else {
            out.blocked_on = Some(inq.erasure_seq);
            return out;
        };
        let failed = FailedDecoding {
            site: self.site,
            seq: inq.erasure_seq,
            parts: inq.parts.clone(),
        };
        let bad = bad_parts(&self.shape, self.data, &failed, message);
        if bad.is_empty() {
            self.found(spurious("every part was correct"), &mut out);
            return out;
        }
        let told = self.implicated_to.entry(r).or_default();
        if bad.is_subset(told) {
            self.found(
                spurious("only servers our answers already named to it"),
                &mut out,
            );
            return out;
        }
        told.extend(bad.iter().copied());
        self.expected_from.insert(r, inq.seq + 1);
        self.found(
            Misbehaviour::BadParts {
                site: self.site,
                servers: bad,
                parts: inq.parts.clone(),
                message: message.clone(),
            },
            &mut out,
        );
        out.emit = Some(Emit {
            to: r,
            control: Control::Response(Response {
                seq: inq.seq,
                erasure_seq: inq.erasure_seq,
                message: message.clone(),
                from: self.site,
                to: r,
            }),
        });
        out
    }

    /// As R: S's INQUIRY-RESPONSE was executed (lines E1-E11). `signed` carried it (validly
    /// signed by S); `message_checks` whether the message inside is validly signed by S.
    pub(crate) fn on_response(
        &mut self,
        signed: &SignedMessage,
        resp: &Response,
        message_checks: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        let s = signed.site;
        let Some((seq, failed)) = self.pending.get(&s) else {
            return out;
        };
        if resp.from != s
            || resp.to != self.site
            || resp.seq != *seq
            || resp.erasure_seq != failed.seq
            || resp.message.site != s
            || resp.message.seq != failed.seq
        {
            return out;
        }
        let failed = failed.clone();
        let bad = bad_parts(&self.shape, self.data, &failed, &resp.message);
        if bad.is_empty() || !message_checks {
            self.found(
                Misbehaviour::BadEncoding {
                    site: s,
                    response: signed.clone(),
                },
                &mut out,
            );
            return out;
        }
        self.found(
            Misbehaviour::BadParts {
                site: s,
                servers: bad,
                parts: failed.parts,
                message: resp.message.clone(),
            },
            &mut out,
        );
        if !self.sites.contains(&s) {
            self.pending.remove(&s);
            *self.next_to.entry(s).or_insert(0) += 1;
            out.deliver = Some(resp.message.clone());
        }
        out
    }
}
