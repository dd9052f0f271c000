//! Prime: an originator that equivocates across a correct replica's proactive recovery
//! (second review, G1). The faulty originator o puts a faulty client's write in place of
//! its PO-REQUEST (o, s) and sends this version v1 to every replica but a spare one b; the
//! network keeps copies of (o, s) from b, and the recovering replica's acknowledgement of v1
//! (a replica keeps the first acknowledgement it hears from each peer). o never lets its own
//! row reach s, so (o, s) certifies without becoming eligible. A correct replica r then
//! recovers proactively; once it has, o sends it and b a second version v2 of (o, s), the
//! same client's other write, with its own acknowledgement. A recovered replica that forgot
//! acknowledging v1 acknowledges v2 too: r and b hold a certificate for v2, the third correct
//! replica for v1, and the rows of the correct replicas make (o, s) eligible, so that correct
//! replicas execute different writes (the agreement check). Correct code refuses v2 at r.

use super::frames::message_of;
use super::*;
use crate::scenario::Split;
use redoubt_core::message::{AckPart, PoAck, PoRequest, SignedPoAru};
use redoubt_core::message::{PbftMessage, PrimeMessage};
use std::sync::Arc;

/// Where the attack stands.
#[derive(Clone, Debug, Default)]
pub(super) struct SplitState {
    /// The two versions of the number it attacks, once the first went out.
    v1: Option<Arc<PoRequest>>,
    v2: Option<Arc<PoRequest>>,
    /// The recovering replica is rebooted and recovering.
    recovering: bool,
    /// The second version went out.
    v2_sent: bool,
}

impl World {
    fn split_plan(&self) -> Option<Split> {
        self.sc.split.clone()
    }

    /// A frame replica `r` sends to `to`: whether the attack took it over (dropped or sent
    /// rewritten).
    pub(super) fn split_outgoing(&mut self, r: ReplicaId, to: Principal, bytes: &[u8]) -> bool {
        let Some(plan) = self.split_plan() else {
            return false;
        };
        if r != plan.originator || self.now < plan.start_ms {
            return false;
        }
        let Some(msg) = message_of(bytes) else {
            return false;
        };
        let spare = Principal::Replica(plan.spare);
        if self.split.v1.is_none() {
            let Message::Prime(PrimeMessage::PoRequest(po)) = &msg else {
                return false;
            };
            let (Some(a), Some(b)) = (self.split_write(1), self.split_write(2)) else {
                return false;
            };
            let version = |req| {
                Arc::new(PoRequest {
                    originator: r,
                    seq: po.seq,
                    requests: vec![req],
                })
            };
            let (v1, v2) = (version(a), version(b));
            self.log(|| {
                format!(
                    "r{r} SPLIT: (r{r}, {}) v1 kept from r{}",
                    po.seq, plan.spare
                )
            });
            self.split.v1 = Some(v1);
            self.split.v2 = Some(v2);
            self.schedule(self.now + plan.recover_after_ms, Ev::SplitRecover);
        }
        let Some(v1) = self.split.v1.clone() else {
            return false;
        };
        let s = v1.seq;
        match msg {
            // The first version in place of its own, to all but the spare; no later
            // number of its own.
            Message::Prime(PrimeMessage::PoRequest(po)) if po.seq == s => {
                let recovering = Principal::Replica(plan.recovering);
                if to != spare && !(self.split.recovering && to == recovering) {
                    self.split_send(r, to, Message::Prime(PrimeMessage::PoRequest(v1)));
                }
                true
            }
            Message::Prime(PrimeMessage::PoRequest(po)) => po.seq > s,
            // Its acknowledgements name v1 for (o, s) (v2 to the two it sent v2), and none
            // reaches the spare before v2: the spare must acknowledge v2 first.
            Message::Prime(PrimeMessage::PoAck(mut ack)) => {
                let to_pair = to == spare || to == Principal::Replica(plan.recovering);
                let v2 = self
                    .split
                    .v2
                    .clone()
                    .filter(|_| self.split.v2_sent && to_pair);
                let digest = v2.map_or(v1.digest(), |v| v.digest());
                let hide = to == spare && !self.split.v2_sent;
                ack.parts
                    .retain(|p| !(hide && p.originator == r && p.seq == s));
                for p in ack.parts.iter_mut() {
                    if p.originator == r && p.seq == s {
                        p.digest = digest;
                    }
                }
                if !ack.parts.is_empty() {
                    self.split_send(r, to, Message::Prime(PrimeMessage::PoAck(ack)));
                }
                true
            }
            Message::Prime(PrimeMessage::PoCopy(_)) => true,
            // Its rows never reach s in its own column, and it sends the leader no
            // summary matrix (which holds its own row).
            Message::Prime(PrimeMessage::Summary(_)) => true,
            // As leader it proposes nothing (its proposal would carry its own row): it is
            // replaced.
            Message::Pbft(PbftMessage::PrePrepare(_)) => true,
            Message::Prime(PrimeMessage::PoAru(row)) => {
                self.split_capped_row(r, to, row, s);
                true
            }
            _ => false,
        }
    }

    /// The split's faulty client's write number `i`, signed by its key holder (one
    /// timestamp for both: the exactly-once table takes one of them).
    fn split_write(&mut self, i: u8) -> Option<SignedRequest> {
        let n = self.sc.core.n();
        let c = self.byz_clients.last()?;
        let request = Request {
            client: c.id,
            timestamp: 1 << 40,
            read_only: false,
            op: KvOp::Put {
                key: b"split".to_vec(),
                value: format!("split-{i}").into_bytes(),
            }
            .encode()
            .into(),
        };
        let digest = request.digest();
        let (counter, sig) = c
            .keys
            .with_holder(|h| h.sign(redoubt_core::keys::Purpose::Request, &digest))
            .ok()?;
        let auth = request_authenticator(&c.keys, &digest, n);
        Some(SignedRequest {
            request,
            auth: auth.into(),
            sig: Some(redoubt_core::message::RequestSig { counter, sig }),
        })
    }

    /// Sends `msg` as replica `o` to `to`.
    fn split_send(&mut self, o: ReplicaId, to: Principal, msg: Message) {
        let keys = self.replicas[o as usize].auth().clone();
        let bytes = seal(&keys, &msg, Some(to), self.sc.core.n());
        self.transmit(Principal::Replica(o), to, bytes, 0);
    }

    /// Sends `row` with column `o` below `s`, signed again with o's order key.
    fn split_capped_row(&mut self, o: ReplicaId, to: Principal, mut row: SignedPoAru, s: u64) {
        let Some(col) = row.row.aru.get_mut(o as usize) else {
            return;
        };
        if *col >= s {
            *col = s - 1;
            row.row.num = row.row.aru.iter().sum();
            let Some(key) = self.adversary.order_key(o) else {
                return;
            };
            row.sig = key.sign(&row.row.statement().0);
        }
        self.split_send(o, to, Message::Prime(PrimeMessage::PoAru(row)));
    }

    /// Whether the network keeps this frame from its receiver: a copy of (o, s) from
    /// the spare for good, and from the recovering replica until it got v2; the recovering
    /// replica's acknowledgement of v1 from the spare (whose first acknowledgement from a
    /// replica is the one it keeps).
    pub(super) fn split_cut(&self, from: Principal, to: Principal, bytes: &[u8]) -> bool {
        let Some(plan) = self.sc.split.as_ref() else {
            return false;
        };
        let (Principal::Replica(a), Principal::Replica(b)) = (from, to) else {
            return false;
        };
        let Some(v1) = self.split.v1.as_ref() else {
            return false;
        };
        let (o, s) = (plan.originator, v1.seq);
        if a == o || (b != plan.spare && b != plan.recovering) {
            return false;
        }
        let Some(msg) = message_of(bytes) else {
            return false;
        };
        match msg {
            Message::Prime(PrimeMessage::PoCopy(c))
                if c.request.originator == o && c.request.seq == s =>
            {
                b == plan.spare || !self.split.v2_sent
            }
            Message::Prime(PrimeMessage::PoAck(ack)) => {
                b == plan.spare
                    && a == plan.recovering
                    && !self.split.recovering
                    && ack.parts.iter().any(|p| p.originator == o && p.seq == s)
            }
            _ => false,
        }
    }

    /// The recovering replica's proactive recovery: the watchdog reboots it (it is correct)
    /// and it recovers.
    pub(super) fn split_recover(&mut self) {
        let Some(plan) = self.split_plan() else {
            return;
        };
        let r = plan.recovering;
        if self.up[r as usize] != Up::Running {
            return;
        }
        self.log(|| format!("r{r} SPLIT: between the two versions"));
        self.split.recovering = true;
        self.reboot_and_recover(r);
    }

    /// Replica `r` finished a recovery: if it is the attack's, the second version goes out.
    pub(super) fn split_recovered(&mut self, r: ReplicaId) {
        let Some(plan) = self.split_plan() else {
            return;
        };
        if r != plan.recovering || !self.split.recovering || self.split.v2_sent {
            return;
        }
        let Some(v2) = self.split.v2.clone() else {
            return;
        };
        self.split.v2_sent = true;
        let o = plan.originator;
        let ack = PoAck {
            replica: o,
            parts: vec![AckPart {
                originator: o,
                seq: v2.seq,
                digest: v2.digest(),
            }],
        };
        self.log(|| {
            format!(
                "r{o} SPLIT: (r{o}, {}) v2 to r{r} and r{}",
                v2.seq, plan.spare
            )
        });
        let keys = self.replicas[o as usize].auth().clone();
        let n = self.sc.core.n();
        for t in [plan.recovering, plan.spare] {
            let to = Principal::Replica(t);
            for m in [
                Message::Prime(PrimeMessage::PoRequest(v2.clone())),
                Message::Prime(PrimeMessage::PoAck(ack.clone())),
            ] {
                let bytes = seal(&keys, &m, Some(to), n);
                self.transmit(Principal::Replica(o), to, bytes, 2);
            }
        }
    }
}
