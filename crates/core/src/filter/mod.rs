//! A filter node of the privacy firewall (Yin et al. 2003 §4): one of an (h+1) × (h+1)
//! array between the agreement nodes (below) and the execution nodes (above). With at most
//! h faulty filters some row is all correct (a correct cut) and some column is (a correct
//! path): a faulty node either sees confidential data or talks to the outside, not both.
//!
//! - **Up**: agreement nodes' signed pieces of agreement certificates ([`SignedOrder`]).
//!   Once f+1 matching pieces certify the batch at n (one correct agreement node ordered
//!   it), each further piece arriving from below is one *request*: if the reply for n is
//!   known it goes down, else n is marked seen and the certificate goes up (to the next row,
//!   or to every execution node from the top row), at most once per status interval per n.
//! - **Down**: replies only as reply certificates (a bundle and the execution cluster's
//!   threshold signature, one encoding whichever g+1 signed). The top row combines g+1 signature
//!   shares; every other filter checks the signature. A complete reply for n goes down only
//!   if n was seen (and then n is answered from the table), else it is held: each request
//!   from below releases at most one reply, and no reply leaves unasked.
//! - Execution checkpoint certificates go down once each, in increasing order (agreement
//!   nodes collect garbage below them).
//!
//! What a filter forwards authenticates itself, so a filter checks what it passes and
//! forwards pieces and checkpoint certificates unchanged under its own name. Reply
//! certificates go down with its vouch ([`VouchedCert`]), signed with its filter key: the
//! filters of the row below and the agreement nodes take a certificate that all h+1 filters
//! of the row above vouched for without checking its threshold signature (one of them is
//! correct and checked it, or took it on the vouches of the row above it), and check the
//! signature themselves of one that fewer vouched for within a tick ([`vouch`]). Which row a
//! frame came from is its claimed sender's; deployments give filters links to the adjacent
//! rows only (docs/operations.md, "Firewall deployment"), which the simulator models.
//!
//! Bounds (P = `log_size`, maxN the highest certified sequence number seen): pieces for
//! `(maxN - P, maxN + P]` only, one per agreement node per sequence number, and one piece
//! per agreement node beyond (f+1 matching ones there move the window: a restarted filter
//! joins in again); per sequence
//! number in `(maxN - P, maxN + P]` one table entry and, in the top row, one share per
//! execution node.

use crate::effect::{Bytes, Effect, Env, Event};
use crate::message::*;
use crate::replica::Input;
use crate::types::{Config, ExecutorId, FilterId, Principal, ReplicaId, Seq};
use redoubt_crypto::pk::{self, HolderSecrets, VerifyKey};
use redoubt_crypto::threshold::{GroupKey, ThresholdSig};
use redoubt_crypto::Digest;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) mod vouch;
use vouch::{Vouched, Vouches, Waiting};

/// The public keys everything crossing the firewall is checked against.
#[derive(Clone, Debug)]
pub struct FirewallKeys {
    /// Each agreement node's order key (it signs its pieces).
    pub orders: Vec<VerifyKey>,
    /// The execution cluster's threshold group key.
    pub group: GroupKey,
    /// Each filter's filter key (it signs its vouches with it), by filter id.
    pub filters: Vec<VerifyKey>,
}

impl FirewallKeys {
    /// Whether `so` is its agreement node's signed piece.
    pub fn check_order(&self, so: &SignedOrder) -> bool {
        self.orders
            .get(so.order.replica as usize)
            .is_some_and(|k| pk::verify(k, &SignedOrder::statement(&so.order).0, &so.signature))
    }
    /// Whether `cert` carries the execution cluster's signature on its bundle.
    pub fn check_reply(&self, cert: &ReplyCert) -> bool {
        self.group
            .verify(&cert.bundle.statement().0, &cert.signature)
    }
    /// Whether `vouch` is filter `x`'s on the certificate [`VouchedCert::statement`] `key`.
    pub fn check_vouch(&self, x: FilterId, key: &Digest, vouch: &pk::Signature) -> bool {
        self.filters
            .get(x as usize)
            .is_some_and(|k| pk::verify(k, &key.0, vouch))
    }
    pub fn check_stable(&self, c: &StableCert) -> bool {
        self.group.verify(&stable_statement(c.seq).0, &c.signature)
    }
    /// Whether a client's certified reply carries the execution cluster's signature.
    pub fn check_certified_reply(&self, r: &CertifiedReply) -> bool {
        r.statement()
            .is_some_and(|st| self.group.verify(&st.0, &r.signature))
    }
}

/// Counters a host can export as metrics.
#[derive(Clone, Debug, Default)]
pub struct FilterStats {
    /// Agreement certificates passed up, and reply certificates passed down.
    pub requests_forwarded: u64,
    pub replies_forwarded: u64,
    /// Reply certificates held because no request for them came from below (yet).
    pub replies_held: u64,
    /// Reply certificates combined here from signature shares (top row).
    pub replies_combined: u64,
    /// Execution checkpoint certificates passed down.
    pub stable_forwarded: u64,
    /// Signature shares that did not verify (top row), and certificates whose signature did
    /// not (a faulty node above tried to pass something the execution cluster did not vouch
    /// for: the leak attempts the firewall blocks).
    pub shares_rejected: u64,
    pub certificates_rejected: u64,
    /// Vouches that did not verify under their claimed filter's key.
    pub vouches_rejected: u64,
    /// Reply certificates taken on the vouches of every filter of the row above, and those
    /// whose threshold signature was checked here (fewer vouched for them in time).
    pub replies_vouched: u64,
    pub replies_checked: u64,
    /// Pieces whose signature or body did not check, and frames rejected otherwise.
    pub pieces_rejected: u64,
    pub rejected: u64,
}

/// An agreement node's piece as a filter keeps it: the digest it names, and its message body.
type Piece = (Digest, Arc<Vec<u8>>);

/// Per sequence number: whether a request came from below, and the reply certificate once
/// known: its [`VouchedCert::statement`] and the message body this filter passes down (the
/// certificate with its vouch).
#[derive(Default)]
struct Slot {
    seen: bool,
    reply: Option<(Digest, Arc<Vec<u8>>)>,
    /// When the certificate last went up (ms).
    sent_up_ms: Option<u64>,
}

/// Signature shares on one statement (top row).
struct Shares<T> {
    content: T,
    by: BTreeMap<ExecutorId, ThresholdSig>,
}

pub struct Filter {
    cfg: Config,
    id: FilterId,
    row: u32,
    keys: Arc<FirewallKeys>,
    /// This filter's filter key: it signs its vouches.
    vouch_key: HolderSecrets,
    env: Env,
    effects: Vec<Effect>,
    pub stats: FilterStats,
    max_n: Seq,
    /// Pieces per sequence number: each agreement node's digest and the message body.
    pieces: BTreeMap<Seq, BTreeMap<ReplicaId, Piece>>,
    /// Each agreement node's latest piece beyond the window (at most one per node).
    far: BTreeMap<ReplicaId, (Seq, Piece)>,
    table: BTreeMap<Seq, Slot>,
    /// Top row: reply shares per sequence number, grouped by statement, and each execution
    /// node's statement there; stable shares per sequence number.
    reply_shares: BTreeMap<Seq, BTreeMap<Digest, Shares<ReplyBundle>>>,
    share_of: BTreeMap<(Seq, ExecutorId), Digest>,
    stable_shares: BTreeMap<Seq, BTreeMap<ExecutorId, ThresholdSig>>,
    /// The highest execution checkpoint certificate passed down (its message body), and
    /// when it last went down again on a request from below (ms).
    stable_down: Seq,
    stable_body: Option<Arc<Vec<u8>>>,
    stable_again_ms: u64,
    /// Reply certificates from the row above that fewer than h+1 of its filters vouched for
    /// yet (their [`VouchedCert::statement`]s).
    vouches: Vouches<Digest, ReplyCert>,
}

impl Filter {
    /// Filter `id` with the firewall's public keys and its own filter key.
    pub fn new(
        cfg: Config,
        id: FilterId,
        keys: Arc<FirewallKeys>,
        vouch_key: HolderSecrets,
    ) -> Result<Filter, String> {
        cfg.validate()?;
        if !cfg.firewall() || id >= cfg.filters() {
            return Err(format!(
                "filter {id} is not one of the {} filter nodes",
                cfg.filters()
            ));
        }
        if keys.orders.len() != cfg.n() as usize {
            return Err(format!(
                "{} order keys for {} agreement nodes",
                keys.orders.len(),
                cfg.n()
            ));
        }
        if keys.filters.len() != cfg.filters() as usize {
            return Err(format!(
                "{} filter keys for {} filters",
                keys.filters.len(),
                cfg.filters()
            ));
        }
        if keys.filters[id as usize] != vouch_key.public().verify {
            return Err(format!(
                "the filter key given is not filter {id}'s in the public key file"
            ));
        }
        let vouchers = cfg.vouchers();
        Ok(Filter {
            row: id / cfg.filter_rows,
            cfg,
            id,
            keys,
            vouch_key,
            env: Env::default(),
            effects: Vec::new(),
            stats: FilterStats::default(),
            max_n: 0,
            pieces: BTreeMap::new(),
            far: BTreeMap::new(),
            table: BTreeMap::new(),
            reply_shares: BTreeMap::new(),
            share_of: BTreeMap::new(),
            stable_shares: BTreeMap::new(),
            stable_down: 0,
            stable_body: None,
            stable_again_ms: 0,
            vouches: Vouches::new(vouchers),
        })
    }

    pub fn id(&self) -> FilterId {
        self.id
    }
    pub fn row(&self) -> u32 {
        self.row
    }
    fn top(&self) -> bool {
        self.row + 1 == self.cfg.filter_rows
    }
    pub fn max_certified(&self) -> Seq {
        self.max_n
    }

    /// Handles one input; returns what the host must do.
    pub fn handle(&mut self, env: Env, input: Input<'_>) -> Vec<Effect> {
        self.env = env;
        match input {
            Input::Receive(bytes) => self.receive(bytes),
            Input::Preopened(p) => self.receive(p.bytes()),
            Input::Tick => self.tick(),
            // Filters hold no session keys and call no key holder.
            Input::Idle | Input::StepDown | Input::Recover | Input::Holder(_) => {}
        }
        std::mem::take(&mut self.effects)
    }

    /// Checks the node's bounds; `Err` names the first that fails.
    pub fn check_invariants(&self) -> Result<(), String> {
        let p = self.cfg.log_size;
        let span = 2 * p as usize + 1;
        if self.table.len() > span || self.pieces.len() > span {
            return Err(format!(
                "{} table entries, {} piece slots held",
                self.table.len(),
                self.pieces.len()
            ));
        }
        if self.reply_shares.len() > span || self.stable_shares.len() > span {
            return Err("too many share slots held".into());
        }
        if self.vouches.len() > vouch::WAITING_MAX {
            return Err(format!(
                "{} certificates wait for vouches",
                self.vouches.len()
            ));
        }
        Ok(())
    }

    fn low(&self) -> Seq {
        self.max_n.saturating_sub(self.cfg.log_size)
    }
    fn in_window(&self, seq: Seq) -> bool {
        seq > self.low() && seq <= self.max_n.saturating_add(self.cfg.log_size)
    }

    // ----- receiving ------------------------------------------------------------------------

    fn receive(&mut self, bytes: &[u8]) {
        let frame = match decode_frame_ref(bytes, self.cfg.message_bytes_max) {
            Ok(f) => f,
            Err(r) => return self.reject(Principal::Client(u64::MAX), "frame", r),
        };
        let from = frame.from;
        let msg = match decode_body(frame.body) {
            Ok(m) if m.required_tag() == frame.tag.kind() => m,
            Ok(_) => return self.reject(from, "frame", Reject::WrongTag),
            Err(r) => return self.reject(from, "frame", r),
        };
        let kind = msg.kind();
        let body = frame.body;
        let res = match (msg, from) {
            (Message::Firewall(FirewallMessage::SignedOrder(so)), f) if self.below(f) => {
                self.on_piece(so, body)
            }
            (Message::Firewall(FirewallMessage::ReplyShare(s)), Principal::Executor(e))
                if self.top() && s.executor == e =>
            {
                self.on_reply_share(s)
            }
            (Message::Firewall(FirewallMessage::StableShare(s)), Principal::Executor(e))
                if self.top() && s.executor == e =>
            {
                self.on_stable_share(s)
            }
            (Message::Firewall(FirewallMessage::VouchedCert(v)), Principal::Filter(x))
                if self.above(from) =>
            {
                self.on_vouched(x, v)
            }
            (Message::Firewall(FirewallMessage::VouchedCert(_)), Principal::Executor(_))
                if self.above(from) =>
            {
                // Execution nodes send shares only: a certificate of one's own making is a
                // leak attempt, refused unchecked.
                self.stats.certificates_rejected += 1;
                Err(Reject::Unexpected)
            }
            (Message::Firewall(FirewallMessage::StableCert(c)), f) if self.above(f) => {
                if c.seq <= self.stable_down {
                    return;
                }
                if self.keys.check_stable(&c) {
                    self.complete_stable(c);
                    Ok(())
                } else {
                    self.stats.certificates_rejected += 1;
                    Err(Reject::BadSignature)
                }
            }
            _ => Err(Reject::Unexpected),
        };
        if let Err(r) = res {
            self.reject(from, kind, r);
        }
    }

    /// A reply certificate filter `x` of the row above passed down with its vouch: taken once
    /// every filter of that row vouched for it, or its signature checked at the second tick
    /// after it came (at once when too many wait).
    fn on_vouched(&mut self, x: FilterId, v: VouchedCert) -> Result<(), Reject> {
        let seq = v.cert.bundle.seq;
        if !self.in_window(seq) {
            return Ok(()); // old news
        }
        let key = VouchedCert::statement(seq, &v.cert.bundle.statement(), &v.cert.signature);
        if let Some((known, _)) = self.table.get(&seq).and_then(|e| e.reply.as_ref()) {
            // The certificate through another filter of the row above: nothing to check
            // again, nothing goes down for it. A certificate at a sequence number is unique
            // (one bundle, one signature): any other is forged.
            if *known != key {
                self.stats.certificates_rejected += 1;
                return Err(Reject::BadSignature);
            }
            return Ok(());
        }
        if !self.keys.check_vouch(x, &key, &v.vouch) {
            self.stats.vouches_rejected += 1;
            return Err(Reject::BadSignature);
        }
        #[cfg(feature = "mutants")]
        if self.cfg.mutant == crate::types::Mutant::FilterUnvouched {
            let body = self.vouched_body(key, v.cert);
            self.send_down(&body);
            return Ok(());
        }
        let w = match self.vouches.vouch(key, x, || v.cert) {
            Vouched::Waits => return Ok(()),
            Vouched::Enough(w) => {
                self.stats.replies_vouched += 1;
                self.complete_reply(seq, w.key, w.item);
                return Ok(());
            }
            Vouched::First(w) => w,
        };
        if self.vouches.full() {
            return self.check_reply_now(w);
        }
        self.vouches.wait(w);
        Ok(())
    }

    /// Checks the threshold signature of a certificate fewer than h+1 filters vouched for.
    fn check_reply_now(&mut self, w: Waiting<Digest, ReplyCert>) -> Result<(), Reject> {
        if !self.keys.check_reply(&w.item) {
            self.stats.certificates_rejected += 1;
            return Err(Reject::BadSignature);
        }
        self.stats.replies_checked += 1;
        self.complete_reply(w.item.bundle.seq, w.key, w.item);
        Ok(())
    }

    /// At a tick: certificates waiting since the tick before are checked now.
    fn tick(&mut self) {
        for w in self.vouches.take_due() {
            let by = w.by.clone();
            if let Err(r) = self.check_reply_now(w) {
                for x in by {
                    self.reject(Principal::Filter(x), "vouched-cert", r);
                }
            }
        }
    }

    /// Whether `p` is a node of the row below (the agreement nodes for row 0).
    fn below(&self, p: Principal) -> bool {
        match p {
            Principal::Replica(r) => self.row == 0 && r < self.cfg.n(),
            Principal::Filter(x) => {
                x < self.cfg.filters() && x / self.cfg.filter_rows + 1 == self.row
            }
            _ => false,
        }
    }
    /// Whether `p` is a node of the row above (the execution nodes for the top row).
    fn above(&self, p: Principal) -> bool {
        match p {
            Principal::Executor(e) => self.top() && e < self.cfg.executors,
            Principal::Filter(x) => {
                x < self.cfg.filters() && x / self.cfg.filter_rows == self.row + 1
            }
            _ => false,
        }
    }

    // ----- requests (up) --------------------------------------------------------------------

    fn on_piece(&mut self, so: SignedOrder, body: &[u8]) -> Result<(), Reject> {
        let o = &so.order;
        if o.replica >= self.cfg.n() {
            return Err(Reject::Inconsistent);
        }
        if o.seq <= self.low() {
            return Ok(()); // old news: not the sender's fault
        }
        let body_digest = o.batch.as_ref().map_or(NULL_DIGEST, Batch::digest);
        if body_digest != o.digest || !self.keys.check_order(&so) {
            self.stats.pieces_rejected += 1;
            return Err(Reject::BadSignature);
        }
        let seq = o.seq;
        let piece: Piece = (o.digest, Arc::new(body.to_vec()));
        if !self.in_window(seq) {
            // Far ahead of our window (we restarted, or were cut off): each agreement node's
            // latest such piece is kept; f+1 matching ones move the window there.
            self.far.insert(o.replica, (seq, piece));
            let matching: Vec<ReplicaId> = self
                .far
                .iter()
                .filter(|(_, (s, (d, _)))| *s == seq && *d == o.digest)
                .map(|(r, _)| *r)
                .collect();
            if matching.len() < self.cfg.weak_quorum() {
                return Ok(());
            }
            self.advance(seq);
            let slot = self.pieces.entry(seq).or_default();
            for r in matching {
                if let Some((_, p)) = self.far.remove(&r) {
                    slot.insert(r, p);
                }
            }
            self.far.retain(|_, (s, _)| *s > seq);
        } else {
            self.pieces.entry(seq).or_default().insert(o.replica, piece);
        }
        let slot = &self.pieces[&seq];
        let mut count: BTreeMap<Digest, usize> = BTreeMap::new();
        for (d, _) in slot.values() {
            *count.entry(*d).or_default() += 1;
        }
        let Some(digest) = count
            .into_iter()
            .find(|(_, c)| *c >= self.cfg.weak_quorum())
            .map(|(d, _)| d)
        else {
            return Ok(());
        };
        if o.digest != digest {
            return Ok(());
        }
        // A request for `seq` from below (one correct agreement node ordered the batch).
        self.advance(seq);
        let now = self.env.now_ms;
        let interval = self.cfg.status_interval_ms;
        let entry = self.table.entry(seq).or_default();
        entry.seen = true;
        let reply = entry.reply.clone();
        // A request for what a checkpoint certificate here covers (g+1 execution nodes ran it):
        // the certificate goes down again, whether or not the batch's reply certificate formed
        // (the agreement nodes' checkpoint may wait for it, and the execution nodes do not
        // sign again what lies below their stable checkpoint).
        if reply.is_none() && seq <= self.stable_down {
            if let Some(stable) = self.stable_body.clone() {
                if now >= self.stable_again_ms + interval {
                    self.stable_again_ms = now;
                    self.send_down(&stable);
                }
            }
        }
        if let Some((_, reply)) = reply {
            self.send_down(&reply);
            self.stats.replies_forwarded += 1;
            // The agreement nodes ask again for what ran: their checkpoint may wait for the
            // execution checkpoint certificate, which may have been lost on its way down.
            if let Some(stable) = self.stable_body.clone() {
                if now >= self.stable_again_ms + interval {
                    self.stable_again_ms = now;
                    self.send_down(&stable);
                }
            }
            // A checkpoint's sequence number asked for again while its certificate has not
            // come down here: it may have been lost below the rows above, which answer the
            // request with it. (Requests going up tell those above nothing they may not know.)
            let checkpoint = seq.is_multiple_of(self.cfg.checkpoint_interval);
            if !checkpoint || self.stable_down >= seq {
                return Ok(());
            }
        }
        let entry = self.table.entry(seq).or_default();
        if entry.sent_up_ms.is_some_and(|t| now < t + interval) {
            return Ok(());
        }
        entry.sent_up_ms = Some(now);
        let cert: Vec<Arc<Vec<u8>>> = self.pieces[&seq]
            .values()
            .filter(|(d, _)| *d == digest)
            .take(self.cfg.weak_quorum())
            .map(|(_, b)| b.clone())
            .collect();
        for b in cert {
            self.send_up(&b);
        }
        self.stats.requests_forwarded += 1;
        Ok(())
    }

    /// A certified sequence number: the window moves, what falls below it is forgotten.
    fn advance(&mut self, seq: Seq) {
        if seq <= self.max_n {
            return;
        }
        self.max_n = seq;
        let low = self.low() + 1;
        self.table = self.table.split_off(&low);
        self.pieces = self.pieces.split_off(&low);
        self.reply_shares = self.reply_shares.split_off(&low);
        self.stable_shares = self.stable_shares.split_off(&low);
        self.share_of.retain(|(s, _), _| *s >= low);
    }

    // ----- replies (down) -------------------------------------------------------------------

    /// A complete reply certificate for `seq` (`key` its [`VouchedCert::statement`]): down
    /// with our vouch if asked for, else held.
    fn complete_reply(&mut self, seq: Seq, key: Digest, cert: ReplyCert) {
        if !self.in_window(seq) {
            return;
        }
        self.advance(seq);
        self.reply_shares.remove(&seq);
        if self.table.get(&seq).is_some_and(|e| e.reply.is_some()) {
            return; // a duplicate: nothing goes down for it
        }
        let body = self.vouched_body(key, cert);
        let entry = self.table.entry(seq).or_default();
        entry.reply = Some((key, body.clone()));
        if entry.seen {
            self.send_down(&body);
            self.stats.replies_forwarded += 1;
        } else {
            self.stats.replies_held += 1;
        }
    }

    /// The message body of `cert` (`key` its statement) with our vouch.
    fn vouched_body(&self, key: Digest, cert: ReplyCert) -> Arc<Vec<u8>> {
        let vouch = self.vouch_key.sign(&key.0);
        Arc::new(encode_body(&Message::Firewall(
            FirewallMessage::VouchedCert(VouchedCert { cert, vouch }),
        )))
    }

    fn complete_stable(&mut self, c: StableCert) {
        self.stable_shares = self.stable_shares.split_off(&(c.seq + 1));
        if c.seq <= self.stable_down {
            return;
        }
        self.stable_down = c.seq;
        self.stats.stable_forwarded += 1;
        let body = Arc::new(encode_body(&Message::Firewall(
            FirewallMessage::StableCert(c),
        )));
        self.send_down(&body);
        self.stable_body = Some(body);
    }

    fn on_reply_share(&mut self, s: ReplyShare) -> Result<(), Reject> {
        let seq = s.bundle.seq;
        if !self.in_window(seq) || self.table.get(&seq).is_some_and(|e| e.reply.is_some()) {
            return Ok(());
        }
        let st = s.bundle.statement();
        // One share per execution node per sequence number: a later one replaces it.
        if let Some(old) = self.share_of.insert((seq, s.executor), st) {
            if let Some(g) = self
                .reply_shares
                .get_mut(&seq)
                .and_then(|m| m.get_mut(&old))
            {
                g.by.remove(&s.executor);
            }
        }
        let groups = self.reply_shares.entry(seq).or_default();
        let group = groups.entry(st).or_insert_with(|| Shares {
            content: s.bundle,
            by: BTreeMap::new(),
        });
        group.by.insert(s.executor, s.share);
        let Some(sig) = self.combine(seq, st) else {
            return Ok(());
        };
        let bundle = self.reply_shares[&seq][&st].content.clone();
        let key = VouchedCert::statement(seq, &st, &sig);
        let cert = ReplyCert {
            bundle,
            signature: sig,
        };
        self.stats.replies_combined += 1;
        self.complete_reply(seq, key, cert);
        Ok(())
    }

    /// Combines the shares on statement `st` at `seq` if g+1 are there: optimistically the
    /// first g+1, checking the result; if it does not verify, each share on its own, dropping
    /// the bad ones (a faulty execution node's share must not stall the certificate).
    fn combine(&mut self, seq: Seq, st: Digest) -> Option<ThresholdSig> {
        #[cfg(feature = "mutants")]
        let quorum = if self.cfg.mutant == crate::types::Mutant::ThresholdAtG {
            self.cfg.g() as usize
        } else {
            self.cfg.exec_quorum()
        };
        #[cfg(not(feature = "mutants"))]
        let quorum = self.cfg.exec_quorum();
        let group = self.reply_shares.get_mut(&seq)?.get_mut(&st)?;
        if group.by.len() < quorum {
            return None;
        }
        let shares: Vec<(usize, ThresholdSig)> =
            group.by.iter().map(|(e, s)| (*e as usize, *s)).collect();
        if let Some(sig) = self.keys.group.combine(&shares[..quorum]) {
            if self.keys.group.verify(&st.0, &sig) {
                return Some(sig);
            }
        }
        let keys = self.keys.clone();
        let before = group.by.len();
        group
            .by
            .retain(|e, s| keys.group.verify_share(*e as usize, &st.0, s));
        self.stats.shares_rejected += (before - group.by.len()) as u64;
        if group.by.len() < quorum {
            return None;
        }
        let shares: Vec<(usize, ThresholdSig)> =
            group.by.iter().map(|(e, s)| (*e as usize, *s)).collect();
        self.keys.group.combine(&shares[..quorum])
    }

    fn on_stable_share(&mut self, s: StableShare) -> Result<(), Reject> {
        if s.seq <= self.stable_down || !s.seq.is_multiple_of(self.cfg.checkpoint_interval) {
            return Ok(());
        }
        if s.seq > self.max_n.saturating_add(self.cfg.log_size) {
            return Ok(());
        }
        let st = stable_statement(s.seq);
        if !self
            .keys
            .group
            .verify_share(s.executor as usize, &st.0, &s.share)
        {
            self.stats.shares_rejected += 1;
            return Err(Reject::BadSignature);
        }
        let by = self.stable_shares.entry(s.seq).or_default();
        by.insert(s.executor, s.share);
        if by.len() < self.cfg.exec_quorum() {
            return Ok(());
        }
        let shares: Vec<(usize, ThresholdSig)> =
            by.iter().map(|(e, s)| (*e as usize, *s)).collect();
        let Some(sig) = self.keys.group.combine(&shares) else {
            return Ok(());
        };
        self.complete_stable(StableCert {
            seq: s.seq,
            signature: sig,
        });
        Ok(())
    }

    // ----- sending --------------------------------------------------------------------------

    fn frame(&self, body: &[u8]) -> Bytes {
        Arc::new(encode_frame_parts(
            WIRE_VERSION,
            Principal::Filter(self.id),
            0,
            body,
            &Tag::None,
        ))
    }

    /// To the row above (every execution node from the top row).
    fn send_up(&mut self, body: &[u8]) {
        let to: Vec<Principal> = if self.top() {
            (0..self.cfg.executors).map(Principal::Executor).collect()
        } else {
            self.cfg
                .filter_row(self.row + 1)
                .map(Principal::Filter)
                .collect()
        };
        self.send_all(to, body);
    }

    /// To the row below (every replica from row 0).
    fn send_down(&mut self, body: &[u8]) {
        let to: Vec<Principal> = if self.row == 0 {
            (0..self.cfg.n()).map(Principal::Replica).collect()
        } else {
            self.cfg
                .filter_row(self.row - 1)
                .map(Principal::Filter)
                .collect()
        };
        self.send_all(to, body);
    }

    fn send_all(&mut self, to: Vec<Principal>, body: &[u8]) {
        let bytes = self.frame(body);
        for to in to {
            self.effects.push(Effect::Send {
                to,
                bytes: bytes.clone(),
            });
        }
    }

    fn reject(&mut self, from: Principal, kind: &'static str, reason: Reject) {
        self.stats.rejected += 1;
        self.effects
            .push(Effect::Event(Event::Rejected { from, kind, reason }));
    }
}

#[cfg(test)]
mod tests;
