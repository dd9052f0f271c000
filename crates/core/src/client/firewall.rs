//! A client behind the privacy firewall: its replies are certified entries passed on by the
//! replicas (ADR 0006).

use super::*;

impl<A: KeyTable> Client<A> {
    /// Behind a firewall: a certified reply passed on by a replica. A replica passes a
    /// client's entry on only once it took the reply certificate in (every bottom-row filter
    /// vouched for it, or its threshold signature checked there), so f+1 replicas passing
    /// matching entries include a correct one that did: the client completes on those
    /// without a pairing of its own (ADR 0006). The view is the (f+1)-th highest the
    /// replicas reported.
    pub(super) fn receive_certified(
        &mut self,
        env: Env,
        frame: &FrameRef<'_>,
    ) -> Option<Completion> {
        let (from, cert) = match (frame.from, open(&self.auth, frame)) {
            (Principal::Replica(r), Ok(Message::Client(ClientMessage::CertifiedReply(c))))
                if r < self.cfg.n() =>
            {
                (r, c)
            }
            (Principal::Replica(_), Ok(Message::Recovery(RecoveryMessage::NewKey(nk))))
                if nk.from == frame.from =>
            {
                self.asked_for_keys(frame.from);
                return None;
            }
            _ => {
                self.stats.rejected += 1;
                return None;
            }
        };
        if cert.entry.client != self.id {
            self.stats.unwanted += 1;
            return None;
        }
        // The view is the sending replica's claim: counted for every reply addressed to us,
        // late ones included (every replica answers a retransmission with the reply it holds).
        let f = self.cfg.f;
        let fw = self.firewall.as_mut()?;
        let view = fw.report(f, from, cert.view);
        #[cfg(feature = "mutants")]
        let view = if self.cfg.mutant == crate::types::Mutant::TrustViewHint {
            cert.view
        } else {
            view
        };
        if !self.wants(cert.entry.timestamp) {
            self.stats.unwanted += 1;
            return None;
        }
        let Some(digest) = cert.entry_digest() else {
            self.stats.rejected += 1;
            return None;
        };
        let o = self.outstanding.as_mut().expect("wanted");
        o.vote(
            from,
            Vote {
                view: cert.view,
                digest,
                result: (!cert.digest_only).then_some(cert.entry.result),
                tentative: false,
            },
        );
        #[cfg(feature = "mutants")]
        let needed = if self.cfg.mutant == crate::types::Mutant::TrustOneCertifiedCopy {
            1
        } else {
            self.cfg.weak_quorum()
        };
        #[cfg(not(feature = "mutants"))]
        let needed = self.cfg.weak_quorum();
        let matching = || o.replies.values().filter(|v| v.digest == digest);
        if matching().count() < needed {
            return None;
        }
        let Some(result) = matching().find_map(|v| v.result.clone()) else {
            // Matching digests, but the designated replica's full copy is missing (faulty, or
            // its frame was lost).
            if o.ask_for_full_result(env.now_ms, self.srtt_ms) {
                self.stats.full_result_asks += 1;
            }
            return None;
        };
        let o = self.outstanding.take().expect("wanted");
        Some(self.complete(env, o, result, view))
    }
}
