//! The request in flight and the replies voting on it.

use super::*;

/// The request the client waits for, how it was sent, and the replies so far.
pub(super) struct Outstanding {
    pub(super) request: Request,
    /// The operation before sealing, and the body session it was sealed in (confidential
    /// bodies).
    pub(super) plain: bytes::Bytes,
    pub(super) session: Option<BodyKey>,
    /// On the read-only fast path (2f+1 matching replies needed).
    pub(super) fast_read: bool,
    /// A fast read sent to 2f+1 replicas: the others, not asked yet, and when they will be.
    pub(super) unasked: Vec<ReplicaId>,
    pub(super) widen_ms: u64,
    /// It was, and then went to the others too.
    pub(super) widened: bool,
    pub(super) bytes: Bytes,
    pub(super) started_ms: u64,
    pub(super) deadline_ms: u64,
    pub(super) backoff: u32,
    /// Our key holder's signature of the request, drawn at its first retransmission.
    pub(super) sig: Option<RequestSig>,
    /// replica -> its reply
    pub(super) replies: BTreeMap<ReplicaId, Vote>,
    /// Matching digests made a certificate but no result came in full (its designated
    /// sender is faulty, or the frame was lost): the retransmission was brought forward once.
    pub(super) asked_full: bool,
    /// The retransmission due was brought forward (it is no sign of trouble when it comes),
    /// and whether one came when the timeout ran out.
    pub(super) early: bool,
    pub(super) timed_out: bool,
}

impl Outstanding {
    /// Records `from`'s vote. The same replica again for the same result keeps what either
    /// vote vouches for (the result itself; committed over tentative; the later view); a vote
    /// for another result replaces its earlier one.
    pub(super) fn vote(&mut self, from: ReplicaId, vote: Vote) {
        match self.replies.get_mut(&from) {
            Some(v) if v.digest == vote.digest => {
                if v.result.is_none() {
                    v.result = vote.result;
                }
                v.tentative &= vote.tentative;
                v.view = v.view.max(vote.view);
            }
            _ => {
                self.replies.insert(from, vote);
            }
        }
    }

    /// Matching digests made a certificate but no vote carries the result in full (its
    /// designated sender is faulty, or the frame was lost): brings the retransmission forward,
    /// once per request, since every replica answers a retransmission in full. Whether it did.
    pub(super) fn ask_for_full_result(&mut self, now_ms: u64, srtt_ms: f64) -> bool {
        if self.asked_full {
            return false;
        }
        self.asked_full = true;
        self.retransmit_within(now_ms, srtt_ms);
        true
    }

    /// Brings the next retransmission forward to one round trip (`srtt_ms`) from `now_ms`,
    /// if it was due later: the answers the client still lacks should have come by then.
    pub(super) fn retransmit_within(&mut self, now_ms: u64, srtt_ms: f64) {
        let grace = (srtt_ms as u64).max(1);
        if now_ms + grace < self.deadline_ms {
            self.deadline_ms = now_ms + grace;
            self.early = true;
        }
    }
}

/// One replica's reply to the outstanding request.
pub(super) struct Vote {
    pub(super) view: View,
    pub(super) digest: Digest,
    /// The result, if sent in full.
    pub(super) result: Option<Vec<u8>>,
    /// Executed tentatively (not known committed at that replica).
    pub(super) tentative: bool,
}
