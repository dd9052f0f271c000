//! The erasure-coded logical link (Amir et al. 2009 §4.1; spec/attack.md §2.5).
//!
//! Virtual link i joins server i of the sending site S with server i of the receiving site R.
//! Every server of S encodes the signed message with an MDS(3f+1, f+1) code (Reed-Solomon:
//! f+1 data parts, 2f redundant ones, any f+1 of them decode) and sends *its own* part, part i,
//! signed with its own key, to its peer. With both sites correct, at least f+1 of the 3f+1
//! virtual links have correct servers at both ends, so f+1 parts arrive whatever the faulty
//! servers do, and each costs 1/(f+1) of the message: (3f+1)/(f+1) in all, against (f+1)^2
//! for the naive link.
//!
//! The receiver introduces each part into R's local ordering; parts are collected as they are
//! *locally executed*, and the message is decoded when f+1 distinct parts of it have been
//! (trap 6: decoding on receipt would have servers decode different subsets and disagree on
//! which decodings failed). A decoded message is handed over only under S's threshold
//! signature. A decoding that yields no validly signed message is reported as a
//! [`FailedDecoding`] naming the f+1 parts used, the same at every correct server of R: the
//! blacklisting protocol of Figure 3 ([`super::inquiry`]) starts from it; until it resolves, R
//! handles nothing more from S on this link but the answer.
//!
//! The same link runs over a site's broadcast hub ([`Erasure::hub`], [`super::hub`]): a
//! (2f+1, 3f+1) code, a first set of 2f+1 senders and a second set of f that send only when
//! they do not overhear the first set's parts in time, and f+1 introducers per received part.

use super::hub::{self, Hub, HubConfig, HubStats};
use super::inquiry::{Control, Inquiries};
use super::resend::Resend;
use super::{Delivered, Executed, LinkEvent, LogicalLink, Payload, Timed, Wan};
use crate::message::{Refused, SignedMessage, SiteKeys};
use crate::{Server, Shape, SiteId};
use redoubt_crypto::pk::{self, HolderSecrets, Signature, VerifyKey};
use redoubt_crypto::DigestBuilder;
use reed_solomon_erasure::galois_8::ReedSolomon;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Messages of one sending site being collected at once; beyond it the lowest number is
/// dropped (counted). Within it each server of the sending site has a quota of
/// `COLLECTING_PER_SITE_MAX / 3f+1` parts waiting: beyond its quota a server's own oldest part
/// goes, so a faulty server that sends lone parts of far-ahead numbers crowds out only itself.
pub const COLLECTING_PER_SITE_MAX: usize = 1024;

/// One erasure part of a signed message, signed by the server that made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// The sending site S and the receiving site R.
    pub site: SiteId,
    pub to: SiteId,
    /// The message's number at S (erasureSeq).
    pub seq: u64,
    /// The part's number: the index of the server of S that made and sent it.
    pub index: Server,
    /// Bytes of the encoded message.
    pub len: u32,
    #[serde(with = "serde_bytes")]
    pub shard: Vec<u8>,
    /// Server `index` of S's signature over everything above.
    pub sig: Signature,
}

impl Part {
    /// What the server that made the part signs: everything in it but the signature.
    pub fn statement(&self) -> [u8; 32] {
        DigestBuilder::new("redoubt.site.part.v1")
            .u64(self.site.0 as u64)
            .u64(self.to.0 as u64)
            .u64(self.seq)
            .u64(self.index.0 as u64)
            .u64(self.len as u64)
            .long_bytes(&self.shard)
            .finish()
            .0
    }
}

/// Every server's verification key, by site and index.
#[derive(Clone, Debug)]
pub struct ServerKeys {
    keys: Vec<Vec<VerifyKey>>,
}

impl ServerKeys {
    pub fn new(keys: Vec<Vec<VerifyKey>>) -> ServerKeys {
        ServerKeys { keys }
    }
    pub fn key(&self, site: SiteId, server: Server) -> Option<&VerifyKey> {
        self.keys.get(site.0 as usize)?.get(server.0 as usize)
    }
    /// Whether the server that `part` names signed it.
    pub fn signed(&self, part: &Part) -> bool {
        self.key(part.site, part.index)
            .is_some_and(|key| pk::verify(key, &part.statement(), &part.sig))
    }
}

/// f+1 locally executed parts that decoded to no message validly signed by their site: every
/// correct server of the receiving site reports the same one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedDecoding {
    pub site: SiteId,
    pub seq: u64,
    /// The parts used, by index.
    pub parts: Vec<Part>,
}

/// An MDS(3f+1, data) code over a site's servers: f+1 data parts on the erasure-coded link,
/// 2f+1 on a hub.
struct Codec {
    data: usize,
    rs: ReedSolomon,
}

impl Codec {
    fn new(shape: &Shape, data: usize) -> Codec {
        let parity = shape.servers() - data;
        Codec {
            data,
            rs: ReedSolomon::new(data, parity).expect("1 <= data and parity <= 255"),
        }
    }

    fn shard_len(&self, len: usize) -> usize {
        len.div_ceil(self.data).max(1)
    }

    /// Every part of `bytes`, part i at index i.
    fn encode(&self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let shard = self.shard_len(bytes.len());
        let total = self.rs.total_shard_count();
        let mut shards: Vec<Vec<u8>> = (0..total)
            .map(|i| {
                let mut s = vec![0u8; shard];
                if i < self.data {
                    let from = (i * shard).min(bytes.len());
                    let to = ((i + 1) * shard).min(bytes.len());
                    s[..to - from].copy_from_slice(&bytes[from..to]);
                }
                s
            })
            .collect();
        self.rs.encode(&mut shards).expect("equal shards");
        shards
    }

    /// The `len` bytes that f+1 parts (index, shard) decode to, if they decode at all.
    fn decode(&self, len: usize, parts: &[(usize, &[u8])]) -> Option<Vec<u8>> {
        let shard = self.shard_len(len);
        let mut shards: Vec<Option<Vec<u8>>> = vec![None; self.rs.total_shard_count()];
        for (i, s) in parts {
            if s.len() != shard {
                return None;
            }
            shards[*i] = Some(s.to_vec());
        }
        self.rs.reconstruct_data(&mut shards).ok()?;
        let mut bytes: Vec<u8> = shards
            .into_iter()
            .take(self.data)
            .flat_map(|s| s.expect("reconstructed"))
            .collect();
        bytes.truncate(len);
        Some(bytes)
    }
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErasureStats {
    pub parts_sent: u64,
    pub parts_executed: u64,
    pub decoded: u64,
    pub failed_decodings: u64,
    pub collecting_dropped: u64,
    /// Parts of suspended sites held, and those dropped beyond the bound.
    pub parts_held: u64,
    pub held_dropped: u64,
    /// Parts executed but set aside: their site suspended or blacklisted, their server
    /// blacklisted, or their message already handed over.
    pub parts_ignored: u64,
}

/// Our own messages kept to answer INQUIRYs about them (trap 8); beyond it the oldest go.
pub const RETAINED_MAX: usize = 4096;
/// Parts of a suspended site held for when it is resumed, with a quota of
/// `HELD_PER_SITE_MAX / 3f+1` per server (beyond it the server's own oldest go); beyond the
/// whole bound the oldest go (counted).
pub const HELD_PER_SITE_MAX: usize = 4096;

/// How parts travel: each to the sender's peer, or through the sites' hubs.
enum Mode {
    Peer,
    Hub(Hub),
}

/// The erasure-coded link as one server runs it.
pub struct Erasure {
    shape: Shape,
    site: SiteId,
    me: Server,
    keys: SiteKeys,
    servers: ServerKeys,
    secret: HolderSecrets,
    frame_bytes_max: usize,
    codec: Codec,
    mode: Mode,
    delivered: Delivered,
    collecting: BTreeMap<SiteId, BTreeMap<u64, BTreeMap<Server, Part>>>,
    /// Parts of a site suspended on an INQUIRY, in the order they were executed: handled, in
    /// that order, once the site is resumed, so that one bad part loses no message of a
    /// correct site.
    held: BTreeMap<SiteId, VecDeque<Part>>,
    retained: BTreeMap<u64, SignedMessage>,
    /// Our part of the message last sent (number, encoded length, part).
    last_part: Option<(u64, u32, Vec<u8>)>,
    inquiries: Inquiries,
    stats: ErasureStats,
    /// Figure 3's messages sent again until answered.
    resend: Resend,
    /// [`crate::Mutant::DecodeOnReceipt`]: the parts this server received, by message.
    received: Option<BTreeMap<(SiteId, u64), Vec<Part>>>,
}

impl Erasure {
    pub fn new(
        shape: Shape,
        site: SiteId,
        me: Server,
        keys: SiteKeys,
        servers: ServerKeys,
        secret: HolderSecrets,
        frame_bytes_max: usize,
    ) -> Erasure {
        let data = shape.f() + 1;
        Erasure {
            codec: Codec::new(&shape, data),
            mode: Mode::Peer,
            shape,
            site,
            me,
            keys,
            servers,
            secret,
            frame_bytes_max,
            delivered: Delivered::default(),
            collecting: BTreeMap::new(),
            held: BTreeMap::new(),
            retained: BTreeMap::new(),
            last_part: None,
            inquiries: Inquiries::new(shape, site, data),
            stats: ErasureStats::default(),
            resend: Resend::default(),
            received: None,
        }
    }

    /// The same link over the sites' broadcast hubs ([`super::hub`]): a (2f+1, 3f+1) code.
    pub fn over_hub(mut self, cfg: HubConfig) -> Erasure {
        let data = hub::data_parts(&self.shape);
        self.codec = Codec::new(&self.shape, data);
        self.inquiries = Inquiries::new(self.shape, self.site, data);
        self.mode = Mode::Hub(Hub::new(cfg, self.shape, self.me));
        self
    }

    pub fn stats(&self) -> &ErasureStats {
        &self.stats
    }

    /// The hub's counters, on a hub.
    pub fn hub_stats(&self) -> Option<&HubStats> {
        match &self.mode {
            Mode::Hub(h) => Some(&h.stats),
            Mode::Peer => None,
        }
    }

    /// The blacklisting protocol's state: suspended sites, blacklists, proofs.
    pub fn inquiries(&self) -> &Inquiries {
        &self.inquiries
    }

    /// The failed decoding a site is suspended on, if it is.
    pub fn suspended(&self, site: SiteId) -> Option<&FailedDecoding> {
        self.inquiries.pending(site)
    }

    /// What every part must satisfy wherever it is looked at: addressed to us, from a server
    /// and site that exist, of the size its length implies, signed by the server that made it.
    fn check_part(&self, part: &Part) -> Result<(), Refused> {
        if part.to != self.site || part.site == self.site {
            return Err(Refused::Malformed("part addressed to another site".into()));
        }
        if !self.shape.has_site(part.site) {
            return Err(Refused::UnknownSite(part.site));
        }
        if !self.shape.has_server(part.index) {
            return Err(Refused::Malformed("part number out of range".into()));
        }
        if part.len as usize > self.frame_bytes_max
            || part.shard.len() != self.codec.shard_len(part.len as usize)
        {
            return Err(Refused::Malformed(
                "part size does not match its length".into(),
            ));
        }
        if !self.servers.signed(part) {
            return Err(Refused::Malformed("part signature does not verify".into()));
        }
        Ok(())
    }

    fn decode(
        &mut self,
        site: SiteId,
        seq: u64,
        parts: &BTreeMap<Server, Part>,
    ) -> Result<SignedMessage, ()> {
        // The length the lowest-numbered part claims; a part claiming another has the wrong
        // size for it and fails the decoding like any other bad part.
        let len = parts.values().next().expect("f+1 parts").len as usize;
        let shards: Vec<(usize, &[u8])> = parts
            .values()
            .map(|p| (p.index.0 as usize, p.shard.as_slice()))
            .collect();
        let bytes = self.codec.decode(len, &shards).ok_or(())?;
        let msg = SignedMessage::decode(&bytes, self.frame_bytes_max).map_err(|_| ())?;
        if msg.site != site || msg.seq != seq || self.keys.check(&msg).is_err() {
            return Err(());
        }
        Ok(msg)
    }

    fn own_blacklisted(&self) -> BTreeSet<Server> {
        self.inquiries
            .blacklisted_servers()
            .get(&self.site)
            .cloned()
            .unwrap_or_default()
    }

    fn ignores(&self, site: SiteId) -> bool {
        self.inquiries.site_blacklisted(site) || self.inquiries.pending(site).is_some()
    }

    fn executed_part(&mut self, part: &Part) -> Executed {
        // A copy of a part already counted, or of a message already handed over, costs a
        // lookup, not a signature check: on a hub f+1 servers introduce every part.
        let counted = self
            .collecting
            .get(&part.site)
            .and_then(|m| m.get(&part.seq))
            .is_some_and(|parts| parts.get(&part.index) == Some(part));
        if counted || self.delivered.contains(part.site, part.seq) {
            self.stats.parts_ignored += 1;
            return Executed::default();
        }
        if let Err(e) = self.check_part(part) {
            return Executed::refused(e);
        }
        self.stats.parts_executed += 1;
        let mut out = Executed::default();
        if let Some(received) = &mut self.received {
            // The broken variant: every part received so far counts as executed.
            for p in received.remove(&(part.site, part.seq)).unwrap_or_default() {
                self.collect(&p, &mut out);
            }
        }
        self.collect(part, &mut out);
        out
    }

    fn hold(&mut self, part: Part) {
        let quota = HELD_PER_SITE_MAX / self.shape.servers();
        let held = self.held.entry(part.site).or_default();
        // Each server's quota, as for collecting: a flooding server pushes out its own.
        if held.iter().filter(|p| p.index == part.index).count() >= quota {
            if let Some(at) = held.iter().position(|p| p.index == part.index) {
                held.remove(at);
                self.stats.held_dropped += 1;
            }
        }
        if held.len() >= HELD_PER_SITE_MAX {
            held.pop_front();
            self.stats.held_dropped += 1;
        }
        held.push_back(part);
        self.stats.parts_held += 1;
    }

    fn collect(&mut self, part: &Part, out: &mut Executed) {
        if self.inquiries.pending(part.site).is_some()
            && !self.inquiries.server_blacklisted(part.site, part.index)
            && !self.delivered.contains(part.site, part.seq)
        {
            self.hold(part.clone());
            return;
        }
        if self.ignores(part.site)
            || self.inquiries.server_blacklisted(part.site, part.index)
            || self.delivered.contains(part.site, part.seq)
        {
            self.stats.parts_ignored += 1;
            return;
        }
        let quota = COLLECTING_PER_SITE_MAX / self.shape.servers();
        let site_parts = self.collecting.entry(part.site).or_default();
        let parts = site_parts.entry(part.seq).or_default();
        // A server's first part of a message stands.
        parts.entry(part.index).or_insert_with(|| part.clone());
        if parts.len() < self.codec.data {
            let waiting: Vec<u64> = site_parts
                .iter()
                .filter(|(_, p)| p.contains_key(&part.index))
                .map(|(seq, _)| *seq)
                .collect();
            if waiting.len() > quota {
                let oldest = waiting[0];
                let parts = site_parts.get_mut(&oldest).expect("listed");
                parts.remove(&part.index);
                if parts.is_empty() {
                    site_parts.remove(&oldest);
                }
                self.stats.collecting_dropped += 1;
            }
            if site_parts.len() > COLLECTING_PER_SITE_MAX {
                site_parts.pop_first();
                self.stats.collecting_dropped += 1;
            }
            return;
        }
        let parts = site_parts.remove(&part.seq).expect("just inserted");
        match self.decode(part.site, part.seq, &parts) {
            Ok(msg) => {
                self.stats.decoded += 1;
                self.delivered.first_time(part.site, part.seq);
                out.delivered.push(msg);
            }
            Err(()) => {
                self.stats.failed_decodings += 1;
                let failed = FailedDecoding {
                    site: part.site,
                    seq: part.seq,
                    parts: parts.into_values().collect(),
                };
                // Everything else collected from that site waits for the answer: it is
                // handled again, in order, once the site is resumed.
                let collected = self.collecting.remove(&part.site).unwrap_or_default();
                out.emit.extend(self.inquiries.failed(failed.clone()));
                out.failed.push(failed);
                for p in collected
                    .into_values()
                    .flat_map(|parts| parts.into_values())
                {
                    self.hold(p);
                }
            }
        }
    }

    /// A site was resumed: its held parts are handled now, in the order they came.
    fn resume(&mut self, site: SiteId, out: &mut Executed) {
        let mut held = self.held.remove(&site).unwrap_or_default();
        while let Some(p) = held.pop_front() {
            self.collect(&p, out);
            if self.inquiries.pending(site).is_some() {
                // Another failure: the rest waits again, behind what that one held.
                let again = self.held.entry(site).or_default();
                held.extend(again.drain(..));
                *again = held;
                return;
            }
        }
    }

    fn executed_control(&mut self, msg: &SignedMessage) -> Executed {
        if msg.site == self.site || self.inquiries.site_blacklisted(msg.site) {
            return Executed::refused(Refused::Blacklisted(msg.site));
        }
        if !msg.for_site(self.site) {
            return Executed::refused(Refused::Malformed(
                "a control message for another site".into(),
            ));
        }
        if let Err(e) = self.keys.check(msg) {
            return Executed::refused(e);
        }
        let Ok(Payload::Control(control)) = Payload::decode(&msg.body) else {
            return Executed::refused(Refused::Malformed(
                "a whole global message on the erasure link".into(),
            ));
        };
        if self.delivered.contains(msg.site, msg.seq) {
            return Executed::default();
        }
        let ours_before = self.own_blacklisted();
        let outcome = match &control {
            Control::Inquiry(inq) => {
                let retained = self.retained.get(&inq.erasure_seq).cloned();
                let servers = &self.servers;
                self.inquiries
                    .on_inquiry(msg, inq, retained.as_ref(), |p| servers.signed(p))
            }
            Control::Response(resp) => {
                let checks = self.keys.check(&resp.message).is_ok();
                self.inquiries.on_response(msg, resp, checks)
            }
            Control::Ack { .. } => {
                return Executed::refused(Refused::Malformed(
                    "BLink's acknowledgement on the erasure link".into(),
                ))
            }
        };
        if let Mode::Hub(h) = &mut self.mode {
            let ours_after = self.inquiries.blacklisted_servers().get(&self.site);
            for server in ours_after.into_iter().flatten() {
                if !ours_before.contains(server) {
                    h.blacklisted(*server);
                }
            }
        }
        // Nothing more of a site found faulty is handled: what was kept of it goes.
        for site in [msg.site, self.site] {
            if self.inquiries.site_blacklisted(site) {
                self.collecting.remove(&site);
                self.held.remove(&site);
            }
        }
        let mut out = Executed {
            emit: outcome.emit.into_iter().collect(),
            misbehaviour: outcome.misbehaviour,
            blocked_on: outcome.blocked_on,
            ..Executed::default()
        };
        if out.blocked_on.is_none() {
            self.delivered.first_time(msg.site, msg.seq);
        }
        if let Some(m) = outcome.deliver {
            let site = m.site;
            if self.delivered.first_time(m.site, m.seq) {
                out.delivered.push(m);
            }
            self.resume(site, &mut out);
        }
        out
    }
}

impl LogicalLink for Erasure {
    fn send(&mut self, msg: &SignedMessage, to: SiteId) -> Vec<Wan> {
        if to == self.site || msg.site != self.site {
            return Vec::new();
        }
        if let Ok(Payload::Control(control)) = Payload::decode(&msg.body) {
            // Figure 3's messages go whole, peer to peer, never erasure coded, and again
            // until answered.
            let wan = Wan {
                to_site: to,
                to_server: self.me,
                frame: LinkEvent::Message(msg.clone()).encode(),
            };
            match control {
                Control::Inquiry(i) => self.resend.inquiry_sent(to, i.seq, wan.clone()),
                Control::Response(r) => self.resend.response_sent(to, r.seq, wan.clone()),
                Control::Ack { .. } => {}
            }
            return vec![wan];
        }
        if self.retained.len() >= RETAINED_MAX && !self.retained.contains_key(&msg.seq) {
            self.retained.pop_first();
        }
        self.retained.insert(msg.seq, msg.clone());
        // A message to several sites is encoded once: the part differs only in its address.
        let (len, shard) = match &self.last_part {
            Some((seq, len, shard)) if *seq == msg.seq => (*len, shard.clone()),
            _ => {
                let bytes = msg.encode();
                let mut shards = self.codec.encode(&bytes);
                let shard = shards.swap_remove(self.me.0 as usize);
                self.last_part = Some((msg.seq, bytes.len() as u32, shard.clone()));
                (bytes.len() as u32, shard)
            }
        };
        let mut part = Part {
            site: self.site,
            to,
            seq: msg.seq,
            index: self.me,
            len,
            shard,
            sig: Signature::default(),
        };
        part.sig = self.secret.sign(&part.statement());
        let wan = Wan {
            to_site: to,
            to_server: self.me,
            frame: LinkEvent::Part(part).encode(),
        };
        let wan = match &mut self.mode {
            Mode::Peer => Some(wan),
            Mode::Hub(hub) => hub.outgoing(msg.seq, wan),
        };
        self.stats.parts_sent += wan.is_some() as u64;
        wan.into_iter().collect()
    }

    fn receive(
        &mut self,
        site: SiteId,
        from: Server,
        frame: &[u8],
    ) -> Result<Option<LinkEvent>, Refused> {
        match LinkEvent::decode(frame, self.frame_bytes_max)? {
            LinkEvent::Part(part) => {
                // Part i comes from server i, and, peer to peer, only on virtual link i.
                let peer = matches!(self.mode, Mode::Peer);
                if part.site != site || part.index != from || (peer && part.index != self.me) {
                    return Err(Refused::Malformed("part off its virtual link".into()));
                }
                self.check_part(&part)?;
                if self.delivered.contains(part.site, part.seq) {
                    return Ok(None);
                }
                if let Some(received) = &mut self.received {
                    received
                        .entry((part.site, part.seq))
                        .or_default()
                        .push(part.clone());
                    while received.len() > COLLECTING_PER_SITE_MAX {
                        received.pop_first();
                    }
                }
                if !peer && !hub::introduces(&self.shape, part.index, part.seq, self.me) {
                    if let Mode::Hub(h) = &mut self.mode {
                        h.stats.not_ours += 1;
                    }
                    return Ok(None);
                }
                Ok(Some(LinkEvent::Part(part)))
            }
            LinkEvent::Message(msg) => {
                // On a hub every server hears every server's copy; each introduces its peer's.
                if matches!(self.mode, Mode::Hub(_)) && msg.site == site && from != self.me {
                    return Ok(None);
                }
                if msg.site != site || from != self.me {
                    return Err(Refused::Malformed(
                        "control message off its virtual link".into(),
                    ));
                }
                if !matches!(Payload::decode(&msg.body), Ok(Payload::Control(_))) {
                    return Err(Refused::Malformed(
                        "a whole global message on the erasure link".into(),
                    ));
                }
                if self.delivered.contains(msg.site, msg.seq) {
                    // Asked again: our answer may have been lost.
                    if let Ok(Payload::Control(Control::Inquiry(i))) = Payload::decode(&msg.body) {
                        if i.from == msg.site {
                            self.resend.asked_again(msg.site, i.seq);
                        }
                    }
                    return Ok(None);
                }
                self.keys.check(&msg)?;
                Ok(Some(LinkEvent::Message(msg)))
            }
            LinkEvent::Suspect { .. } => Err(Refused::Malformed(
                "a local proposal from the wide area".into(),
            )),
        }
    }

    fn executed(&mut self, event: &LinkEvent) -> Executed {
        match event {
            LinkEvent::Part(part) => self.executed_part(part),
            LinkEvent::Message(msg) => self.executed_control(msg),
            LinkEvent::Suspect { .. } => Executed::refused(Refused::Malformed(
                "BLink's suspicion on the erasure link".into(),
            )),
        }
    }

    fn set_mutant(&mut self, mutant: crate::Mutant) {
        self.inquiries.set_mutant(mutant);
        if mutant == crate::Mutant::DecodeOnReceipt {
            self.received = Some(BTreeMap::new());
        }
    }

    fn overhear(&mut self, from: Server, frame: &[u8]) {
        if !matches!(self.mode, Mode::Hub(_)) {
            return;
        }
        let Ok(LinkEvent::Part(part)) = LinkEvent::decode(frame, self.frame_bytes_max) else {
            return;
        };
        // Only a part our server `from` made and signed counts (trap 10: distinct servers),
        // and not once our site found that server faulty (trap 9).
        if part.site != self.site
            || part.index != from
            || self.inquiries.server_blacklisted(self.site, from)
            || !self.servers.signed(&part)
        {
            return;
        }
        if let Mode::Hub(h) = &mut self.mode {
            h.overheard(part.seq, part.to, part.index);
        }
    }

    fn timer(&mut self, now_ms: u64) -> Timed {
        let mut wan = match &mut self.mode {
            Mode::Hub(h) => h.timer(now_ms),
            Mode::Peer => Vec::new(),
        };
        self.stats.parts_sent += wan.len() as u64;
        let inquiries = &self.inquiries;
        wan.extend(self.resend.timer(now_ms, |s| inquiries.pending_inquiry(s)));
        Timed {
            wan,
            ..Timed::default()
        }
    }

    fn own_blacklisted(&self, server: Server) -> bool {
        self.inquiries.server_blacklisted(self.site, server)
    }

    fn blacklists(&self) -> Option<super::Blacklists> {
        Some(super::Blacklists {
            sites: self.inquiries.blacklisted_sites().clone(),
            servers: self.inquiries.blacklisted_servers().clone(),
        })
    }
}

/// Which servers' parts in a failed decoding are not the parts of `msg` (the message the
/// sending site says it encoded): the servers whose parts were bad, or none, if every part
/// matches (then the sending site encoded a badly signed message itself).
/// `data`: the parts that decode a message on the link (f+1, or 2f+1 on a hub).
pub fn bad_parts(
    shape: &Shape,
    data: usize,
    failed: &FailedDecoding,
    msg: &SignedMessage,
) -> BTreeSet<Server> {
    let codec = Codec::new(shape, data);
    let bytes = msg.encode();
    let expected = codec.encode(&bytes);
    failed
        .parts
        .iter()
        .filter(|p| p.len as usize != bytes.len() || expected[p.index.0 as usize] != p.shard)
        .map(|p| p.index)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_f_plus_one_parts_decode() {
        let shape = Shape::new(4, 7).unwrap(); // f = 2: 3 data parts, 4 redundant
        let codec = Codec::new(&shape, shape.f() + 1);
        for len in [0usize, 1, 2, 3, 4, 100, 1000, 1001] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let parts = codec.encode(&bytes);
            assert_eq!(parts.len(), 7);
            for pick in [[0, 1, 2], [4, 5, 6], [0, 3, 6], [2, 5, 1]] {
                let chosen: Vec<(usize, &[u8])> =
                    pick.iter().map(|&i| (i, parts[i].as_slice())).collect();
                assert_eq!(
                    codec.decode(len, &chosen),
                    Some(bytes.clone()),
                    "{len} {pick:?}"
                );
            }
        }
    }
}
