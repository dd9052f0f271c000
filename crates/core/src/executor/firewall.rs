//! An execution node behind a privacy firewall (Yin et al. 2003 §4; `crate::filter`). It
//! talks only to its peers and to the top row of filters: agreement certificates come up as
//! agreement nodes' signed pieces, and what goes down is its signature share on each batch's
//! reply bundle and on each stable checkpoint, which the top row combines from g+1 nodes.
//! No acknowledgements, relayed replies or NEW-KEYs go to agreement nodes or clients: a
//! compromised execution node has no channel down but shares, and a share that does not
//! match its correct peers' makes no certificate.
//!
//! Bounds: one share message kept per batch executed above the stable checkpoint (at most
//! `log_size`), and when each was last sent again.

use super::*;
use crate::filter::FirewallKeys;
use redoubt_crypto::threshold::{KeyShare, ThresholdSig};

pub(super) struct ExecFirewall {
    keys: Arc<FirewallKeys>,
    share: KeyShare,
    /// Our share message of each batch executed above the stable checkpoint, and when it
    /// was last sent (ms).
    sent: BTreeMap<Seq, (Bytes, u64)>,
    /// Our share message on our stable checkpoint.
    stable: Option<(Seq, Bytes)>,
    /// Peers' shares on their checkpoint votes (within the vote window), and the proof of
    /// our stable checkpoint.
    vote_shares: BTreeMap<Seq, BTreeMap<ExecutorId, (Digest, ThresholdSig)>>,
    proof: Option<CheckpointProof>,
    /// Our own share per checkpoint above the stable one: signed once, sent with every vote
    /// for it (a share costs a hash to the curve; votes are repeated on every heartbeat).
    own_shares: BTreeMap<Seq, (Digest, ThresholdSig)>,
}

impl ExecFirewall {
    pub(super) fn new(keys: Arc<FirewallKeys>, share: KeyShare) -> Self {
        ExecFirewall {
            keys,
            share,
            sent: BTreeMap::new(),
            stable: None,
            vote_shares: BTreeMap::new(),
            proof: None,
            own_shares: BTreeMap::new(),
        }
    }
}

impl<S: Service, A: KeyTable> Executor<S, A> {
    /// A frame a top-row filter passed up: an agreement node's signed piece.
    pub(super) fn on_filter_frame(&mut self, x: FilterId, body: &[u8]) -> Result<(), Reject> {
        if !self.cfg.firewall()
            || !self
                .cfg
                .filter_row(self.cfg.filter_rows - 1)
                .any(|f| f == x)
        {
            return Err(Reject::UnknownSender);
        }
        let msg = decode_body(body)?;
        let Message::Firewall(FirewallMessage::SignedOrder(so)) = msg else {
            return Err(Reject::Unexpected);
        };
        let frame = Arc::new(encode_frame_parts(
            WIRE_VERSION,
            Principal::Filter(x),
            0,
            body,
            &Tag::None,
        ));
        self.on_signed_order(so, frame)?;
        self.try_execute();
        Ok(())
    }

    /// Takes a signed piece (from a filter, or a peer's CERTIFIED answer).
    pub(super) fn on_signed_order(&mut self, so: SignedOrder, frame: Bytes) -> Result<(), Reject> {
        let Some(fw) = &self.firewall else {
            return Err(Reject::Unexpected);
        };
        if so.order.replica >= self.cfg.n() || !fw.keys.check_order(&so) {
            self.stats.orders_refused += 1;
            return Err(Reject::BadSignature);
        }
        let seq = so.order.seq;
        if seq <= self.exec.last_executed() {
            // The agreement cluster still waits for the certificate of what we ran: our
            // share again, at most once per status interval.
            self.share_again(seq);
            return Ok(());
        }
        self.on_order(so.order.replica, so.order, frame)
    }

    fn share_again(&mut self, seq: Seq) {
        let now = self.env.now_ms;
        let interval = self.cfg.status_interval_ms;
        let Some(fw) = &mut self.firewall else {
            return;
        };
        let Some((bytes, last)) = fw.sent.get_mut(&seq) else {
            return;
        };
        if now < *last + interval {
            return;
        }
        *last = now;
        let bytes = bytes.clone();
        self.stats.shares_resent += 1;
        self.send_top_row(bytes);
    }

    /// Signs the bundle of the batch just executed and sends our share up.
    pub(super) fn send_bundle(&mut self, bundle: ReplyBundle) {
        let seq = bundle.seq;
        let now = self.env.now_ms;
        let Some(fw) = &mut self.firewall else {
            return;
        };
        let share = fw.share.sign(&bundle.statement().0);
        let msg = Message::from(ReplyShare {
            executor: self.id,
            bundle,
            share,
        });
        let bytes: Bytes = Arc::new(seal(&self.auth, &msg, None, self.cfg.n()));
        fw.sent.insert(seq, (bytes.clone(), now));
        self.send_top_row(bytes);
    }

    /// Our share on our stable checkpoint (once it is stable, and on each heartbeat).
    pub(super) fn send_stable_share(&mut self) {
        let seq = self.window.stable;
        let Some(fw) = &mut self.firewall else {
            return;
        };
        // The stable checkpoint's own batch stays: its reply certificate may still be asked for.
        fw.sent = fw.sent.split_off(&seq);
        if seq == 0 {
            return;
        }
        let bytes = match &fw.stable {
            Some((s, bytes)) if *s == seq => bytes.clone(),
            _ => {
                let share = fw.share.sign(&stable_statement(seq).0);
                let msg = Message::from(StableShare {
                    executor: self.id,
                    seq,
                    share,
                });
                let bytes: Bytes = Arc::new(seal(&self.auth, &msg, None, self.cfg.n()));
                fw.stable = Some((seq, bytes.clone()));
                bytes
            }
        };
        self.send_top_row(bytes);
    }

    /// Our share on checkpoint `(seq, digest)`, for our vote.
    pub(super) fn checkpoint_share(&mut self, seq: Seq, digest: &Digest) -> Option<ThresholdSig> {
        let fw = self.firewall.as_mut()?;
        if let Some((d, share)) = fw.own_shares.get(&seq) {
            if d == digest {
                return Some(*share);
            }
        }
        let share = fw.share.sign(&checkpoint_statement(seq, digest).0);
        fw.own_shares.insert(seq, (*digest, share));
        Some(share)
    }

    pub(super) fn note_checkpoint_share(&mut self, c: &ExecCheckpoint) {
        let (Some(fw), Some(share)) = (&mut self.firewall, c.share) else {
            return;
        };
        fw.vote_shares
            .entry(c.seq)
            .or_default()
            .insert(c.executor, (c.digest, share));
    }

    /// Our checkpoint at `seq` became stable: the proof, from our share and the peers'
    /// matching ones (each checked when the combination does not verify).
    pub(super) fn prove_stable(&mut self, seq: Seq) {
        let Some(digest) = self.exec.own_checkpoint(seq) else {
            return;
        };
        let own = self.checkpoint_share(seq, &digest);
        let quorum = self.cfg.exec_quorum();
        let me = self.id;
        let Some(fw) = &mut self.firewall else {
            return;
        };
        let st = checkpoint_statement(seq, &digest);
        let mut shares: Vec<(usize, ThresholdSig)> = fw
            .vote_shares
            .get(&seq)
            .into_iter()
            .flatten()
            .filter(|(e, (d, _))| **e != me && *d == digest)
            .map(|(e, (_, s))| (*e as usize, *s))
            .collect();
        shares.extend(own.map(|s| (me as usize, s)));
        let group = &fw.keys.group;
        let mut sig = (shares.len() >= quorum)
            .then(|| group.combine(&shares[..quorum]))
            .flatten()
            .filter(|s| group.verify(&st.0, s));
        if sig.is_none() {
            shares.retain(|(e, s)| group.verify_share(*e, &st.0, s));
            sig = (shares.len() >= quorum)
                .then(|| group.combine(&shares[..quorum]))
                .flatten();
        }
        fw.vote_shares = fw.vote_shares.split_off(&(seq + 1));
        // The stable checkpoint's own share stays: peers that lag get our vote for it again.
        fw.own_shares = fw.own_shares.split_off(&seq);
        if let Some(signature) = sig {
            fw.proof = Some(CheckpointProof {
                seq,
                digest,
                signature,
            });
        }
    }

    pub(super) fn checkpoint_proof(&self) -> Option<CheckpointProof> {
        self.firewall.as_ref().and_then(|fw| fw.proof)
    }

    /// A peer's proof of its stable checkpoint: beyond what we executed, the checkpoint to
    /// fetch (the prover holds it), even when no second correct peer votes for it (a faulty
    /// peer's votes lie).
    pub(super) fn on_checkpoint_proof(&mut self, from: ExecutorId, p: CheckpointProof) {
        let Some(fw) = &self.firewall else {
            return;
        };
        if p.seq <= self.exec.last_executed()
            || !fw
                .keys
                .group
                .verify(&checkpoint_statement(p.seq, &p.digest).0, &p.signature)
        {
            return;
        }
        self.accept_checkpoint_proof(from, p.seq, p.digest);
    }

    fn send_top_row(&mut self, bytes: Bytes) {
        for x in self.cfg.filter_row(self.cfg.filter_rows - 1) {
            self.effects.push(Effect::Send {
                to: Principal::Filter(x),
                bytes: bytes.clone(),
            });
        }
    }

    pub(super) fn firewall_bounds(&self) -> Result<(), String> {
        match &self.firewall {
            Some(fw) if fw.sent.len() as u64 > self.cfg.log_size + 1 => {
                Err(format!("{} share messages kept", fw.sent.len()))
            }
            Some(fw)
                if fw.own_shares.len() as u64
                    > (self.cfg.log_size + self.cfg.checkpoint_interval)
                        / self.cfg.checkpoint_interval
                        + 2 =>
            {
                Err(format!(
                    "{} own checkpoint shares kept",
                    fw.own_shares.len()
                ))
            }
            _ => Ok(()),
        }
    }
}
