//! The agreement side of a firewall deployment (Yin et al. 2003 §4; `crate::filter`): the
//! replica sends its pieces of agreement certificates signed with its order key to the bottom
//! row of filters, and learns what the execution cluster did only from certificates coming
//! down: a reply certificate for n says g+1 execution nodes executed through n (the pipeline's
//! cumulative acknowledgement), an execution checkpoint certificate that g+1 hold a stable
//! checkpoint. Clients get their entry of a reply certificate ([`CertifiedReply`]), and a
//! client asking again gets it from the last certificate that named it.
//!
//! Bounds: one cached certified reply per client with an exactly-once entry; the statements
//! of the last `log_size` reply certificates checked here.

use super::*;
use crate::filter::FirewallKeys;
use redoubt_crypto::pk::HolderSecrets;

/// The replica's firewall keys and what came down through the firewall.
pub(super) struct FirewallSide {
    keys: Arc<FirewallKeys>,
    order_key: HolderSecrets,
    /// Each client's reply from the latest certificate naming it.
    replies: BTreeMap<ClientId, CertifiedReply>,
    /// Reply certificates whose signature checked here (the h+1 bottom filters each send
    /// one): sequence number and statement.
    checked: BTreeMap<Seq, Digest>,
}

impl FirewallSide {
    pub(super) fn new(keys: Arc<FirewallKeys>, order_key: HolderSecrets) -> Self {
        FirewallSide {
            keys,
            order_key,
            replies: BTreeMap::new(),
            checked: BTreeMap::new(),
        }
    }
}

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Signs our piece and sends it to the bottom row of filters.
    pub(super) fn send_signed_order(&mut self, order: Order) {
        let Some(fw) = &self.remote.firewall else {
            return; // checked at construction: a firewall replica has its keys
        };
        let signature = fw.order_key.sign(&SignedOrder::statement(&order).0);
        let msg = Message::SignedOrder(SignedOrder { order, signature });
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
        if !self.cfg.firewall() || !self.cfg.filter_row(0).any(|f| f == x) {
            return Err(Reject::UnknownSender);
        }
        let msg = msg()?;
        if msg.required_tag() != TagKind::None {
            return Err(Reject::WrongTag);
        }
        match msg {
            Message::ReplyCert(c) => self.on_reply_cert(c),
            Message::StableCert(c) => self.on_stable_cert(c),
            _ => Err(Reject::Unexpected),
        }
    }

    fn on_reply_cert(&mut self, cert: ReplyCert) -> Result<(), Reject> {
        let Some(fw) = &mut self.remote.firewall else {
            return Err(Reject::Unexpected);
        };
        let seq = cert.bundle.seq;
        if seq <= self.remote.queue.acked.saturating_sub(self.cfg.log_size) {
            return Ok(()); // old news
        }
        let leaves = cert.bundle.leaves();
        let st = bundle_statement(seq, &leaves);
        if fw.checked.get(&seq) == Some(&st) {
            return Ok(()); // the same certificate through another filter
        }
        if !fw.keys.group.verify(&st.0, &cert.signature) {
            return Err(Reject::BadSignature);
        }
        fw.checked.insert(seq, st);
        while fw.checked.len() as u64 > self.cfg.log_size {
            fw.checked.pop_first();
        }
        self.stats.certified_replies += 1;
        let mut ours = Vec::new();
        for (i, e) in cert.bundle.entries.iter().enumerate() {
            let newer = fw
                .replies
                .get(&e.client)
                .is_none_or(|r| r.entry.timestamp <= e.timestamp);
            // Only clients the exactly-once table knows (bounded with it).
            if !newer || self.exec.last_reply(e.client).is_none() {
                continue;
            }
            let Some(r) = CertifiedReply::of(&cert, &leaves, i, self.views.installed) else {
                continue;
            };
            fw.replies.insert(e.client, r.clone());
            if designated_replier(e.client, e.timestamp, self.cfg.n()) == self.id
                && !self.out.replaying
            {
                ours.push((e.client, r));
            }
        }
        // Replies only for clients still in the exactly-once table.
        let exec = &self.exec;
        fw.replies.retain(|c, _| exec.last_reply(*c).is_some());
        for (client, r) in ours {
            self.send_certified(client, r);
        }
        let stable = self.remote.queue.stable_acked;
        self.exec_progress(seq, stable);
        Ok(())
    }

    fn on_stable_cert(&mut self, c: StableCert) -> Result<(), Reject> {
        let Some(fw) = &self.remote.firewall else {
            return Err(Reject::Unexpected);
        };
        if c.seq <= self.remote.queue.stable_acked {
            return Ok(());
        }
        if !fw.keys.check_stable(&c) {
            return Err(Reject::BadSignature);
        }
        let acked = self.remote.queue.acked.max(c.seq);
        self.exec_progress(acked, c.seq);
        Ok(())
    }

    /// A client asked again for request `timestamp`, ordered here already: its certified
    /// reply, if one came down.
    pub(super) fn answer_from_certificates(&mut self, client: ClientId, timestamp: u64) -> bool {
        let Some(r) = self
            .remote
            .firewall
            .as_ref()
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
        let msg = Message::CertifiedReply(r);
        if self.keying.calls.hold(to, &msg) {
            return;
        }
        let bytes = Arc::new(seal(&self.auth, &msg, Some(to), 0));
        self.out.effects.push(Effect::Send { to, bytes });
    }
}
