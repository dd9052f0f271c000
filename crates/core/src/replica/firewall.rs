//! The agreement side of a firewall deployment (Yin et al. 2003 §4; `crate::filter`): the
//! replica sends its pieces of agreement certificates signed with its order key to the bottom
//! row of filters, and learns what the execution cluster did only from certificates coming
//! down: a reply certificate for n says g+1 execution nodes executed through n (the pipeline's
//! cumulative acknowledgement), an execution checkpoint certificate that g+1 hold a stable
//! checkpoint. Clients get their entry of a reply certificate ([`CertifiedReply`]), and a
//! client asking again gets it from the last certificate that named it.
//!
//! The replica takes a reply certificate in (its replies kept for clients asking again, the
//! execution progress it shows) once all h+1 bottom-row filters vouched for it
//! ([`VouchedCert`], `crate::filter::vouch`: one of them is correct and checked it), or once
//! its threshold signature checked here, at the second tick after it came with fewer vouches;
//! nothing of it is recorded before. Then, and only then, it passes each client its entry,
//! MACed: a client takes f+1 matching entries from distinct replicas (one of them correct)
//! without checking the signature itself (a pairing, about 1.3 ms of the client's CPU). The
//! designated replier of an entry sends it with the certificate's leaves, so that the client
//! holds what anyone can check against the execution cluster's key; the others send the
//! entry alone, or with `digest_replies` and a result longer than a digest only the entry's
//! digest.
//!
//! Bounds: one cached certified reply per client with an exactly-once entry; the statements
//! of the last `log_size` reply certificates taken in here; at most
//! [`WAITING_MAX`](crate::filter::vouch::WAITING_MAX) certificates waiting for their check.

use super::*;
use crate::filter::vouch::{Vouched, Vouches};
use crate::filter::FirewallKeys;
use redoubt_crypto::pk::HolderSecrets;
use redoubt_crypto::threshold::ThresholdSig;

/// The replica's firewall keys and what came down through the firewall.
pub(super) struct FirewallSide {
    keys: Arc<FirewallKeys>,
    order_key: HolderSecrets,
    /// Each client's reply from the latest certificate naming it.
    replies: BTreeMap<ClientId, CertifiedReply>,
    /// Reply certificates taken in here (the h+1 bottom filters each send one): sequence
    /// number and statement.
    accepted: BTreeMap<Seq, Digest>,
    /// Reply certificates passed to their clients and waiting for their check.
    unchecked: Vouches<CertKey, Unchecked>,
}

/// A reply certificate's sequence number, statement and signature.
type CertKey = (Seq, Digest, ThresholdSig);

/// A reply certificate passed to its clients but not taken in yet.
struct Unchecked {
    cert: ReplyCert,
    leaves: Vec<Digest>,
    st: Digest,
}

/// Whether entry `e` is newer than the reply held for its client.
fn newer_than_held(held: &BTreeMap<ClientId, CertifiedReply>, e: &ReplyEntry) -> bool {
    held.get(&e.client)
        .is_none_or(|r| r.entry.timestamp <= e.timestamp)
}

impl FirewallSide {
    /// `vouchers`: `Config::vouchers`.
    pub(super) fn new(keys: Arc<FirewallKeys>, order_key: HolderSecrets, vouchers: usize) -> Self {
        FirewallSide {
            keys,
            order_key,
            replies: BTreeMap::new(),
            accepted: BTreeMap::new(),
            unchecked: Vouches::new(vouchers),
        }
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Signs our piece and sends it to the bottom row of filters.
    pub(super) fn send_signed_order(&mut self, order: Order) {
        let Some(fw) = self.sink.side() else {
            return; // checked at construction: a firewall replica has its keys
        };
        let signature = fw.order_key.sign(&SignedOrder::statement(&order).0);
        let msg = Message::from(SignedOrder { order, signature });
        let bytes: Bytes = Arc::new(seal(&self.auth, &msg, None, self.cfg.n()));
        for x in self.cfg.filter_row(0) {
            self.out.effects.push(Effect::Send {
                to: Principal::Filter(x),
                bytes: bytes.clone(),
            });
        }
    }

    /// A frame of a bottom-row filter: a certificate of the execution cluster.
    pub(super) fn on_filter_frame(
        &mut self,
        x: FilterId,
        msg: impl FnOnce() -> Result<Message, Reject>,
    ) -> Result<(), Reject> {
        if !self.sink.firewall() || !self.cfg.filter_row(0).any(|f| f == x) {
            return Err(Reject::UnknownSender);
        }
        let msg = msg()?;
        if msg.required_tag() != TagKind::None {
            return Err(Reject::WrongTag);
        }
        match msg {
            Message::Firewall(FirewallMessage::VouchedCert(v)) => self.on_reply_cert(x, v),
            Message::Firewall(FirewallMessage::StableCert(c)) => self.on_stable_cert(c),
            _ => Err(Reject::Unexpected),
        }
    }

    /// A reply certificate bottom-row filter `x` vouched for. Its clients' entries go out at
    /// once; the replica takes it in once every bottom-row filter vouched for it, or its
    /// signature checked (see the module's text).
    fn on_reply_cert(&mut self, x: FilterId, v: VouchedCert) -> Result<(), Reject> {
        if self.sink.side().is_none() {
            return Err(Reject::Unexpected);
        }
        let seq = v.cert.bundle.seq;
        if seq <= self.sink.acked().saturating_sub(self.cfg.log_size) {
            return Ok(()); // old news
        }
        let fw = self.sink.side_mut().expect("checked above");
        let VouchedCert { cert, vouch } = v;
        let leaves = cert.bundle.leaves();
        let st = bundle_statement(seq, &leaves);
        if fw.accepted.get(&seq) == Some(&st) {
            return Ok(()); // the same certificate through another filter
        }
        if !fw.keys.check_vouch(
            x,
            &VouchedCert::statement(seq, &st, &cert.signature),
            &vouch,
        ) {
            return Err(Reject::BadSignature);
        }
        let key = (seq, st, cert.signature);
        let w = match fw
            .unchecked
            .vouch(key, x, || Unchecked { cert, leaves, st })
        {
            Vouched::Waits => return Ok(()),
            Vouched::Enough(w) => {
                self.accept_reply_cert(w.item);
                return Ok(());
            }
            Vouched::First(w) => w,
        };
        let fw = self.sink.side_mut().expect("checked above");
        if !fw.unchecked.full() {
            fw.unchecked.wait(w);
            return Ok(());
        }
        // What waits is bounded: this one is checked at once.
        if !fw.keys.group.verify(&st.0, &w.item.cert.signature) {
            return Err(Reject::BadSignature);
        }
        self.accept_reply_cert(w.item);
        Ok(())
    }

    /// At a tick: checks the signatures of the reply certificates that waited since the tick
    /// before, taking in those that hold.
    pub(super) fn check_reply_certs(&mut self) {
        let Some(fw) = self.sink.side_mut() else {
            return;
        };
        let due = fw.unchecked.take_due();
        let keys = fw.keys.clone();
        for w in due {
            if keys.group.verify(&w.item.st.0, &w.item.cert.signature) {
                self.accept_reply_cert(w.item);
            } else {
                for x in w.by {
                    self.reject(Principal::Filter(x), "filter", Reject::BadSignature);
                }
            }
        }
    }

    /// A reply certificate whose signature checked (here or at a correct filter): its entries
    /// to their clients and kept for the clients asking again, and the execution progress it
    /// shows.
    fn accept_reply_cert(&mut self, c: Unchecked) {
        let Some(fw) = self.sink.side_mut() else {
            return;
        };
        let seq = c.cert.bundle.seq;
        fw.accepted.insert(seq, c.st);
        while fw.accepted.len() as u64 > self.cfg.log_size {
            fw.accepted.pop_first();
        }
        self.stats.certified_replies += 1;
        let mut out = Vec::new();
        for (i, e) in c.cert.bundle.entries.iter().enumerate() {
            // Only clients the exactly-once table knows (bounded with it).
            if !newer_than_held(&fw.replies, e) || self.exec.last_reply(e.client).is_none() {
                continue;
            }
            if let Some(r) = CertifiedReply::of(&c.cert, &c.leaves, i, self.views.installed) {
                if designated_replier(e.client, e.timestamp, self.cfg.n()) == self.id {
                    out.push(r.clone());
                } else if self.cfg.digest_replies && e.result.len() >= DIGEST_REPLY_MIN_BYTES {
                    // The others' copies count for the match only: the entry's digest.
                    out.push(CertifiedReply {
                        leaves: Vec::new(),
                        entry: ReplyEntry {
                            result: e.leaf().0.to_vec(),
                            ..e.clone()
                        },
                        digest_only: true,
                        ..r.clone()
                    });
                } else {
                    out.push(CertifiedReply {
                        leaves: Vec::new(),
                        ..r.clone()
                    });
                }
                fw.replies.insert(e.client, r);
            }
        }
        // Replies only for clients still in the exactly-once table.
        let exec = &self.exec;
        fw.replies.retain(|c, _| exec.last_reply(*c).is_some());
        let stable = self.sink.stable_acked();
        self.exec_progress(seq, stable);
        if !self.out.replaying {
            for r in out {
                self.send_certified(r.entry.client, r);
            }
        }
    }

    fn on_stable_cert(&mut self, c: StableCert) -> Result<(), Reject> {
        let Some(fw) = self.sink.side() else {
            return Err(Reject::Unexpected);
        };
        if c.seq <= self.sink.stable_acked() {
            return Ok(());
        }
        if !fw.keys.check_stable(&c) {
            return Err(Reject::BadSignature);
        }
        let acked = self.sink.acked().max(c.seq);
        self.exec_progress(acked, c.seq);
        Ok(())
    }

    /// A client asked again for request `timestamp`, ordered here already: its certified
    /// reply, if one came down.
    pub(super) fn answer_from_certificates(&mut self, client: ClientId, timestamp: u64) -> bool {
        let Some(r) = self
            .sink
            .side()
            .and_then(|fw| fw.replies.get(&client))
            .filter(|r| r.entry.timestamp == timestamp)
            .cloned()
        else {
            return false;
        };
        self.send_certified(client, r);
        true
    }

    /// A certified reply to `client`, under its key (held while the client's NEW-KEY is being
    /// admitted: the client retired the key we hold now).
    fn send_certified(&mut self, client: ClientId, r: CertifiedReply) {
        let to = Principal::Client(client);
        let msg = Message::from(r);
        if self.keying.calls.hold(to, &msg) {
            return;
        }
        let bytes = Arc::new(seal(&self.auth, &msg, Some(to), 0));
        self.out.effects.push(Effect::Send { to, bytes });
    }
}
