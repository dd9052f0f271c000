//! Whether requests are authentic at a replica: clients' authenticator entries and
//! signatures, recovering replicas' key-holder signatures, and vouching late for requests
//! that became checkable (PBFT §4.2 with Aardvark's signed fallback, BFT-PR §4.4).

use super::recovery::recovery_of;
use super::*;
use crate::keys::Purpose;
use crate::message::RequestSig;
use redoubt_crypto::{pk, Mac};

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Sends a PREPARE for every pre-prepared slot we have not vouched for in full whose
    /// doubts shrank (the request arrived, or its client's key did) or that has none of ours
    /// yet (after a restart the journal says only that we did not vouch in full). Receivers
    /// keep what any of our PREPAREs vouched for.
    pub(super) fn vouch_late(&mut self) {
        if !self.views.normal || self.is_primary() || self.out.replaying {
            return;
        }
        let me = self.id;
        let candidates: Vec<(Seq, Digest)> = self
            .ordering
            .order
            .log
            .from(self.exec.last_executed() + 1)
            .filter(|(_, s)| !s.vouched_by(me) && !s.prepared)
            .filter_map(|(n, s)| s.pp.filter(|d| *d != NULL_DIGEST).map(|d| (*n, d)))
            .collect();
        for (seq, digest) in candidates {
            let Some(batch) = self.ordering.order.batches.get(&digest).cloned() else {
                continue;
            };
            let mut doubts: Vec<u16> = batch
                .requests
                .iter()
                .enumerate()
                .filter(|(_, r)| !self.can_vouch_for(r, &self.request_digest(r)))
                .map(|(i, _)| i as u16)
                .collect();
            let slot = self.ordering.order.log.slot(seq);
            if slot.sent_prepare {
                let old = slot.doubts.get(&me).map(Vec::as_slice).unwrap_or(&[]);
                doubts.retain(|i| old.binary_search(i).is_ok());
                if doubts.len() == old.len() {
                    continue;
                }
            }
            slot.sent_prepare = true;
            slot.prepares.insert(me, digest);
            if doubts.is_empty() {
                slot.doubts.remove(&me);
            } else {
                slot.doubts.insert(me, doubts.clone());
            }
            if doubts.is_empty() {
                let view = self.views.view;
                self.persist(Record::PrePrepared {
                    view,
                    seq,
                    digest,
                    batch: None,
                    vouched: true,
                });
            }
            let view = self.views.view;
            self.broadcast(&Message::from(Prepare {
                view,
                seq,
                digest,
                replica: me,
                doubts,
            }));
            self.check_slot(seq);
        }
    }

    // ----- requests from replicas ---------------------------------------------------------------

    /// The principal that receives the replies to a request from client id `c`.
    pub(super) fn requester(&self, c: ClientId) -> Principal {
        match recovery_of(c, self.cfg.n()) {
            Some(r) => Principal::Replica(r),
            None => Principal::Client(c),
        }
    }

    /// Whether a request is authentic: a client's authenticator entry for us, or, for a
    /// recovery request, the recovering replica's key-holder signature.
    pub(super) fn request_authentic(&self, req: &Request, digest: &Digest, macs: &[Mac]) -> bool {
        if let Some(r) = recovery_replica(req.client) {
            return self.recovery_authentic(r, req);
        }
        let c = Principal::Client(req.client);
        self.auth.knows(c) && verify_request(&self.auth, c, digest, macs)
    }

    /// Whether `sr` (digest `digest`) is authentic: its authenticator entry for this replica
    /// verifies, or its client's signature does.
    pub(super) fn signed_request_authentic(&self, sr: &SignedRequest, digest: &Digest) -> bool {
        self.request_authentic(&sr.request, digest, &sr.auth)
            || sr
                .sig
                .is_some_and(|s| self.request_signature_valid(&sr.request, digest, &s))
    }

    /// Whether `sig` is client `req.client`'s key-holder signature of the request.
    ///
    /// Requests' signatures are checked under ZIP 215's rules ([`pk::verify_zip215`]), alone
    /// here and in batches in PO-REQUESTs ([`Self::request_signatures_valid`]): a signature's
    /// verdict is then the same in every grouping, at every replica.
    pub(super) fn request_signature_valid(
        &self,
        req: &Request,
        digest: &Digest,
        sig: &RequestSig,
    ) -> bool {
        self.request_statement(req, digest, sig)
            .is_some_and(|(key, st)| pk::verify_zip215(&key, &st, &sig.sig))
    }

    /// Whether every one of `reqs` (request, digest, signature) carries its client's valid
    /// signature, checked in one batch.
    pub(super) fn request_signatures_valid(&self, reqs: &[(&Request, Digest, RequestSig)]) -> bool {
        let mut statements = Vec::with_capacity(reqs.len());
        for (req, digest, sig) in reqs {
            let Some(s) = self.request_statement(req, digest, sig) else {
                return false;
            };
            statements.push(s);
        }
        let items: Vec<pk::Item<'_>> = statements
            .iter()
            .zip(reqs)
            .map(|((key, st), (_, _, sig))| (key, &st[..], &sig.sig))
            .collect();
        pk::verify_all_zip215(&items)
    }

    /// The key a request's signature must verify under, and the statement it signs; `None` if
    /// its client has no key (or it is a recovering replica's).
    fn request_statement(
        &self,
        req: &Request,
        digest: &Digest,
        sig: &RequestSig,
    ) -> Option<(pk::VerifyKey, [u8; 32])> {
        let c = Principal::Client(req.client);
        if recovery_replica(req.client).is_some() {
            return None;
        }
        let pubkeys = self.auth.directory().and_then(|d| d.get(c).copied())?;
        let st = crate::keys::holder_statement(Purpose::Request, c, sig.counter, digest);
        Some((pubkeys.verify, st.0))
    }

    pub(super) fn recovery_authentic(&self, r: ReplicaId, req: &Request) -> bool {
        if r >= self.cfg.n() || req.read_only {
            return false;
        }
        let Ok(op) = postcard::from_bytes::<RecoveryOp>(&req.op) else {
            return false;
        };
        let Some(pubkeys) = self
            .auth
            .directory()
            .and_then(|d| d.get(Principal::Replica(r)).copied())
        else {
            return false;
        };
        let content = RecoveryOp::content_digest(r, op.h_m, op.row_key.as_ref());
        let st = crate::keys::holder_statement(
            Purpose::Recovery,
            Principal::Replica(r),
            req.timestamp,
            &content,
        );
        op.replica == r && pk::verify(&pubkeys.verify, &st.0, &op.sig)
    }
}
