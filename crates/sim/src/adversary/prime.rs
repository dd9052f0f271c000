//! Prime's lies of a faulty replica (a child module of [`crate::adversary`]): a
//! [`Behavior::PrimeLiar`](crate::scenario::Behavior::PrimeLiar)'s equivocation, made-up
//! acknowledgements, inflated rows and Suspect-Leader lies, and a
//! [`Behavior::RowForger`](crate::scenario::Behavior::RowForger)'s proposals with rows of
//! retired incarnations.

use super::*;
use redoubt_core::message::{PbftMessage, PoRequest, PrimeMessage};
use redoubt_core::prime::matrix::{PoAru, SignedPoAru};
use redoubt_core::prime::suspect::SuspectMsg;

/// What a `RowForger` leader's made-up rows claim in every column.
const FORGED_CLAIM: u64 = 100_000;

impl Adversary {
    /// Leader `from`'s proposal with the rows of retired incarnations (of replicas that
    /// recovered) made up to claim everything ([`FORGED_CLAIM`]), which pass unchecked in a proposal (second
    /// review, G2), and its own row claiming as much, signed with its order key: 2f+1 rows
    /// that, taken at their word, answer every challenge for good. `None`: fewer than 2f
    /// replicas recovered.
    pub(super) fn forge_retired_rows(
        &self,
        from: ReplicaId,
        mut pp: PrePrepare,
    ) -> Option<Message> {
        let m = pp.batch.matrix.as_ref()?;
        let n = self.cfg.n() as usize;
        let key = self.order_keys.get(from as usize)?;
        // Far beyond anything a run pre-orders, yet not so far that a core cutting at the
        // highest entry (mutant `cut-without-quorum`) allocates the range it would run.
        let claim = |replica: ReplicaId, inc: u64| PoAru {
            replica,
            inc,
            num: FORGED_CLAIM * n as u64,
            aru: vec![FORGED_CLAIM; n],
        };
        let mut forged = (**m).clone();
        let mut retired = 0;
        for (j, row) in forged.rows.iter_mut().enumerate() {
            let Some(inc) = row.as_ref().map(|r| r.row.inc) else {
                continue;
            };
            if j == from as usize {
                let own = claim(from, inc);
                let sig = key.sign(&own.statement().0);
                *row = Some(SignedPoAru { row: own, sig });
            } else if inc > 0 {
                *row = Some(SignedPoAru {
                    row: claim(j as ReplicaId, inc - 1),
                    sig: Default::default(),
                });
                retired += 1;
            }
        }
        if retired < 2 * self.cfg.f as usize {
            return None;
        }
        pp.batch.matrix = Some(std::sync::Arc::new(forged));
        pp.digest = pp.batch.digest();
        Some(Message::Pbft(PbftMessage::PrePrepare(pp)))
    }

    /// Originator `from`'s PO-REQUEST with its clients' signatures corrupted and their MACs
    /// for one other replica (chosen by the number) too: the others take it by their MACs,
    /// the one can take it only from copies once it is certified (f+1 matching copies fill
    /// the hole without authenticating the requests again: core test
    /// `copies_fill_a_hole_their_requests_fail_to_authenticate_here`).
    fn unsigned_for_one(&self, from: ReplicaId, po: &PoRequest) -> PoRequest {
        let n = self.cfg.n();
        let victim = (from + 1 + (po.seq % u64::from(n - 1)) as ReplicaId) % n;
        let mut other = po.clone();
        for r in other.requests.iter_mut() {
            let Some(sig) = r.sig.as_mut() else {
                continue; // a recovering replica's request: its signature is inside
            };
            sig.sig.0[0] ^= 0xff;
            if let Some(mac) = std::sync::Arc::make_mut(&mut r.auth).get_mut(victim as usize) {
                mac.0[0] ^= 0xff;
            }
        }
        other
    }

    /// Prime's lies (see [`Behavior::PrimeLiar`]); `None`: the honest message.
    pub(super) fn prime_lie(
        &mut self,
        rng: &mut ChaCha8Rng,
        from: ReplicaId,
        to: Principal,
        msg: Message,
    ) -> Option<Vec<Out>> {
        let lie = match msg {
            Message::Prime(PrimeMessage::PoRequest(po)) => {
                let Principal::Replica(r) = to else {
                    return None;
                };
                if po.requests.is_empty() {
                    return None;
                }
                // Odd numbers: equivocation (receivers with an odd id get another version);
                // even ones: one version to everyone, authentic at all but one replica.
                let other = if po.seq % 2 == 1 {
                    if r % 2 == 0 {
                        return None;
                    }
                    let mut other = (*po).clone();
                    other.requests.pop();
                    other
                } else {
                    self.unsigned_for_one(from, &po)
                };
                Message::Prime(PrimeMessage::PoRequest(std::sync::Arc::new(other)))
            }
            Message::Prime(PrimeMessage::PoAck(mut ack)) => {
                for p in ack.parts.iter_mut() {
                    if rng.random_bool(0.5) {
                        p.digest = Digest(rng.random());
                    }
                }
                Message::Prime(PrimeMessage::PoAck(ack))
            }
            Message::Prime(PrimeMessage::PoAru(mut row)) => {
                let key = self.order_keys.get(from as usize)?;
                for x in row.row.aru.iter_mut() {
                    *x += 1 + self.cfg.prime_window;
                }
                row.row.num = row.row.aru.iter().sum();
                row.sig = key.sign(&row.row.statement().0);
                Message::Prime(PrimeMessage::PoAru(row))
            }
            // Suspect-Leader: frame the leader (a huge turnaround), tighten the bound (an
            // alpha of 0), skew peers' round trips either way, never answer a ping, and vote
            // to leave the view (now and then instead of a ping, and for later views too).
            Message::Prime(PrimeMessage::Suspicion(mut sus)) => {
                match &mut sus.msg {
                    SuspectMsg::Ping { view, .. } if rng.random_bool(0.2) => {
                        sus.msg = SuspectMsg::Leave { view: *view };
                    }
                    SuspectMsg::Leave { view } => *view += rng.random_range(0..2),
                    SuspectMsg::TatMeasure { max_tat_ms, .. } => *max_tat_ms = 60_000,
                    SuspectMsg::TatUb { alpha_ms, .. } => *alpha_ms = 0,
                    SuspectMsg::RttMeasure { rtt_ms, .. } => {
                        *rtt_ms = if rng.random_bool(0.5) { 0 } else { 60_000 }
                    }
                    SuspectMsg::Pong { .. } => return Some(vec![]),
                    SuspectMsg::Ping { .. } => return None,
                }
                Message::Prime(PrimeMessage::Suspicion(sus))
            }
            _ => return None,
        };
        Some(vec![(to, self.seal(from, &lie, to), 0)])
    }
}
