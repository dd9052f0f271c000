//! The request pool (agreement side): requests waiting to be ordered, one per client, in
//! arrival order; which clients have a request in a proposed batch not yet executed; and
//! requests replaced by a newer one of their client before executing here, kept (bounded) so
//! that a pre-prepare naming one beside itself resolves from this replica's own copies.
//!
//! Bounds: `waiting` and `inflight` hold at most one entry per client (client ids are
//! configured, not chosen by a sender); `replaced` at most `replaced_most` requests and
//! `replaced_bytes_most` bytes of operations, the oldest dropped first.

use crate::message::{Beside, SignedRequest};
use crate::types::{ClientId, Config, View};
use redoubt_crypto::Digest;
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};

/// A request waiting to be ordered.
#[derive(Clone, Debug)]
pub(crate) struct Waiting {
    pub(crate) req: SignedRequest,
    /// Digest of `req.request`.
    pub(crate) digest: Digest,
    order: u64,
    /// `req` carries a valid signature of its client.
    pub(crate) signed: bool,
    /// `req`'s authenticator came in a copy that named its client as sender and whose entry
    /// for this replica verified: no later copy replaces it.
    client_auth: bool,
    /// The view in which a backup last relayed it to the primary.
    pub(crate) relayed_in: Option<View>,
}

/// What [`RequestPool::next_batch`] does with a waiting request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pick {
    Take,
    /// Not now (it stays waiting).
    Skip,
    /// Never: the caller drops it.
    Stale,
}

pub(crate) struct RequestPool {
    /// Looked up by key only: a hash map, with a fixed hasher so that runs stay
    /// reproducible. `arrivals` keeps their order.
    waiting: FxHashMap<ClientId, Waiting>,
    arrivals: BTreeMap<u64, ClientId>,
    next_order: u64,
    /// Per client, the timestamp of its request in a proposed batch not yet executed.
    inflight: FxHashMap<ClientId, u64>,
    /// Requests that travel beside pre-prepares, replaced in `waiting` by a newer request of
    /// their client before executing here: a lagging backup receives a client's next request
    /// (its client completed on the other replicas' replies) before the pre-prepare naming
    /// the one before. Kept by (client, digest), oldest dropped first.
    replaced: FxHashMap<(ClientId, Digest), SignedRequest>,
    replaced_order: VecDeque<(ClientId, Digest)>,
    replaced_bytes: usize,
    replaced_most: usize,
    replaced_bytes_most: usize,
    /// Requests whose operation has at least this many bytes travel beside pre-prepares (0:
    /// none do); only those are kept when replaced.
    beside_from: usize,
}

impl RequestPool {
    /// A pool for configuration `cfg` (see [`RequestPool::replaced_bounds`]); only requests
    /// that travel beside pre-prepares are kept when replaced.
    pub(crate) fn new(cfg: &Config) -> Self {
        let (replaced_most, replaced_bytes_most) = Self::replaced_bounds(cfg);
        RequestPool {
            waiting: FxHashMap::default(),
            arrivals: BTreeMap::new(),
            next_order: 0,
            inflight: FxHashMap::default(),
            replaced: FxHashMap::default(),
            replaced_order: VecDeque::new(),
            replaced_bytes: 0,
            replaced_most,
            replaced_bytes_most,
            beside_from: cfg.large_request_bytes,
        }
    }

    /// Most replaced requests, and most bytes of their operations, kept: four batches' worth
    /// of requests, two of bytes.
    pub(crate) fn replaced_bounds(cfg: &Config) -> (usize, usize) {
        (4 * cfg.batch_requests_max, 2 * cfg.batch_bytes_max)
    }

    /// Client `c`'s waiting request.
    pub(crate) fn get(&self, c: ClientId) -> Option<&Waiting> {
        self.waiting.get(&c)
    }

    /// The same request again: the client's own authenticator (`own`: a copy naming the
    /// client as sender whose entry for this replica verified) replaces a relayed copy's,
    /// once; and a signature, once one arrives, is kept. A frame's sender is not
    /// authenticated, so a later copy claiming to be the client's never replaces the
    /// authenticator of one that claimed it first: otherwise anyone on the path could swap a
    /// correct client's pooled authenticator for one whose other entries are garbage, and
    /// have the backups doubt it (the first review's F6a). An attacker on the path must now
    /// deliver its copy before the client's own.
    pub(crate) fn refresh(&mut self, c: ClientId, own: bool, sr: &SignedRequest, signed: bool) {
        if let Some(w) = self.waiting.get_mut(&c) {
            if own && !w.client_auth {
                w.req.auth = sr.auth.clone();
                w.client_auth = true;
            }
            if signed && !w.signed {
                w.req.sig = sr.sig;
                w.signed = true;
            }
        }
    }

    /// Client `c`'s new request, last in arrival order; the one it replaces is kept aside.
    pub(crate) fn admit(&mut self, sr: SignedRequest, digest: Digest, signed: bool, own: bool) {
        let c = sr.request.client;
        if let Some(old) = self.waiting.remove(&c) {
            self.arrivals.remove(&old.order);
            self.keep_replaced(old.req, old.digest);
        }
        let order = self.next_order;
        self.next_order += 1;
        self.arrivals.insert(order, c);
        self.waiting.insert(
            c,
            Waiting {
                req: sr,
                digest,
                order,
                signed,
                client_auth: own,
                relayed_in: None,
            },
        );
    }

    /// Client `c`'s waiting request went to the primary of `view`.
    pub(crate) fn mark_relayed(&mut self, c: ClientId, view: View) {
        if let Some(w) = self.waiting.get_mut(&c) {
            w.relayed_in = Some(view);
        }
    }

    /// Drops client `c`'s waiting request.
    pub(crate) fn remove(&mut self, c: ClientId) {
        if let Some(w) = self.waiting.remove(&c) {
            self.arrivals.remove(&w.order);
        }
    }

    /// Client `c`'s requests up to `ts` are settled (executed, here or in fetched state).
    pub(crate) fn done(&mut self, c: ClientId, ts: u64) {
        if self
            .waiting
            .get(&c)
            .is_some_and(|w| w.req.request.timestamp <= ts)
        {
            self.remove(c);
        }
        if self.inflight.get(&c).is_some_and(|t| *t <= ts) {
            self.inflight.remove(&c);
        }
    }

    /// The waiting requests in arrival order.
    pub(crate) fn in_order(&self) -> impl Iterator<Item = (ClientId, &Waiting)> {
        self.arrivals.values().map(|c| (*c, &self.waiting[c]))
    }

    /// The next batch: waiting requests not in a proposed batch, in arrival order, that
    /// `pick` takes, up to `most` requests and `bytes_most` bytes of operations (the first
    /// always fits); and the clients whose request `pick` found stale.
    pub(crate) fn next_batch(
        &self,
        most: usize,
        bytes_most: usize,
        mut pick: impl FnMut(&Waiting) -> Pick,
    ) -> (Vec<&Waiting>, Vec<ClientId>) {
        let mut batch = Vec::with_capacity(most.min(self.waiting.len()));
        let mut stale = Vec::new();
        let mut bytes = 0usize;
        for (c, w) in self.in_order() {
            if batch.len() >= most {
                break;
            }
            if self.inflight_covers(c, w.req.request.timestamp) {
                continue;
            }
            match pick(w) {
                Pick::Skip => continue,
                Pick::Stale => {
                    stale.push(c);
                    continue;
                }
                Pick::Take => {}
            }
            let len = w.req.request.op.len();
            if !batch.is_empty() && bytes + len > bytes_most {
                break;
            }
            bytes += len;
            batch.push(w);
        }
        (batch, stale)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.arrivals.is_empty()
    }

    /// Whether a waiting request is not in a proposed batch yet (a next batch is coming).
    pub(crate) fn has_unproposed(&self) -> bool {
        self.in_order()
            .any(|(c, w)| !self.inflight_covers(c, w.req.request.timestamp))
    }

    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }

    // ----- in flight ------------------------------------------------------------------------

    /// Client `c`'s request `ts` is in a proposed batch.
    pub(crate) fn mark_inflight(&mut self, c: ClientId, ts: u64) {
        self.inflight.insert(c, ts);
    }

    /// Whether client `c`'s request `ts` (or a later one) is in a proposed batch.
    pub(crate) fn inflight_covers(&self, c: ClientId, ts: u64) -> bool {
        self.inflight.get(&c).is_some_and(|t| *t >= ts)
    }

    /// Nothing is in flight any more (a new view, or a recovery).
    pub(crate) fn clear_inflight(&mut self) {
        self.inflight.clear();
    }

    // ----- replaced requests ----------------------------------------------------------------

    /// Keeps request `req` (digest `digest`), not executed here but no longer its client's
    /// waiting one, if it is of the kind that travels beside pre-prepares (smaller ones
    /// travel inside them).
    pub(crate) fn keep_replaced(&mut self, req: SignedRequest, digest: Digest) {
        let len = req.request.op.len();
        if self.beside_from == 0 || len < self.beside_from {
            return;
        }
        let key = (req.request.client, digest);
        if self.replaced.insert(key, req).is_none() {
            self.replaced_order.push_back(key);
            self.replaced_bytes += len;
        }
        while self.replaced_order.len() > self.replaced_most
            || self.replaced_bytes > self.replaced_bytes_most
        {
            let Some(k) = self.replaced_order.pop_front() else {
                break;
            };
            if let Some(r) = self.replaced.remove(&k) {
                self.replaced_bytes -= r.request.op.len();
            }
        }
    }

    /// A replaced request of client `c` with digest `d`.
    pub(crate) fn replaced(&self, c: ClientId, d: &Digest) -> Option<&SignedRequest> {
        self.replaced.get(&(c, *d))
    }

    /// This replica's own copy of the request named by `b` (beside a pre-prepare): the
    /// client's waiting request, or one it replaced (then `true`).
    pub(crate) fn held_beside(&self, b: &Beside) -> Option<(&SignedRequest, bool)> {
        match self.waiting.get(&b.client) {
            Some(w) if w.digest == b.digest => Some((&w.req, false)),
            _ => self.replaced(b.client, &b.digest).map(|r| (r, true)),
        }
    }

    pub(crate) fn replaced_len(&self) -> usize {
        self.replaced.len()
    }

    pub(crate) fn replaced_bytes(&self) -> usize {
        self.replaced_bytes
    }

    pub(crate) fn arrivals_len(&self) -> usize {
        self.arrivals.len()
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        if self.arrivals.len() != self.waiting.len() {
            return Err(format!(
                "{} arrivals for {} waiting requests",
                self.arrivals.len(),
                self.waiting.len()
            ));
        }
        if let Some((o, c)) = self
            .arrivals
            .iter()
            .find(|(o, c)| self.waiting.get(c).is_none_or(|w| w.order != **o))
        {
            return Err(format!(
                "arrival {o} names c{c}, whose waiting request is not it"
            ));
        }
        if self.replaced_order.len() != self.replaced.len() {
            return Err("replaced requests and their order disagree".into());
        }
        let bytes: usize = self.replaced.values().map(|r| r.request.op.len()).sum();
        if bytes != self.replaced_bytes
            || self.replaced.len() > self.replaced_most
            || bytes > self.replaced_bytes_most
        {
            return Err(format!(
                "{} replaced requests of {bytes} bytes (counted {}), bounds {} and {}",
                self.replaced.len(),
                self.replaced_bytes,
                self.replaced_most,
                self.replaced_bytes_most
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Request;

    fn req(client: ClientId, timestamp: u64, len: usize) -> SignedRequest {
        SignedRequest {
            request: Request {
                client,
                timestamp,
                read_only: false,
                op: vec![0u8; len].into(),
            },
            auth: Vec::new().into(),
            sig: None,
        }
    }

    fn pool() -> RequestPool {
        let mut cfg = Config::new(1);
        cfg.batch_requests_max = 1; // four replaced requests at most
        cfg.batch_bytes_max = 1 << 20;
        cfg.large_request_bytes = 100;
        RequestPool::new(&cfg)
    }

    fn admit(p: &mut RequestPool, r: SignedRequest) -> Digest {
        let d = r.request.digest();
        p.admit(r, d, false, true);
        d
    }

    #[test]
    fn one_request_per_client_in_arrival_order() {
        let mut p = pool();
        admit(&mut p, req(2, 1, 10));
        admit(&mut p, req(1, 1, 10));
        admit(&mut p, req(2, 2, 10)); // replaces client 2's and moves it last
        let order: Vec<(ClientId, u64)> = p
            .in_order()
            .map(|(c, w)| (c, w.req.request.timestamp))
            .collect();
        assert_eq!(order, vec![(1, 1), (2, 2)]);
        p.mark_inflight(1, 1);
        assert!(p.inflight_covers(1, 1) && !p.inflight_covers(1, 2));
        p.done(1, 1);
        assert!(p.get(1).is_none() && !p.inflight_covers(1, 1));
        p.done(2, 1); // an older one settled: the waiting one stays
        assert!(p.get(2).is_some());
        assert_eq!(p.check_invariants(), Ok(()));
    }

    #[test]
    fn replaced_requests_are_kept_only_if_large_and_within_bounds() {
        let mut p = pool();
        let small = admit(&mut p, req(1, 1, 10));
        let large = admit(&mut p, req(1, 2, 200));
        admit(&mut p, req(1, 3, 200));
        assert!(
            p.replaced(1, &small).is_none(),
            "small requests travel inside"
        );
        let b = Beside {
            index: 0,
            client: 1,
            digest: large,
        };
        assert!(matches!(p.held_beside(&b), Some((_, true))));
        for ts in 4..12 {
            admit(&mut p, req(1, ts, 200));
        }
        assert_eq!(p.replaced_len(), 4, "the oldest dropped first");
        assert!(p.replaced(1, &large).is_none());
        assert_eq!(p.replaced_bytes(), 800);
        assert_eq!(p.check_invariants(), Ok(()));
    }

    /// F6a: the frame's sender is not authenticated. A copy claiming to come from the client
    /// replaces a relayed copy's authenticator once; after that no later copy, whatever it
    /// claims, replaces it (anyone on the path could otherwise swap in garbage entries for
    /// the other replicas and have them doubt a correct client's request).
    #[test]
    fn the_clients_own_authenticator_is_replaced_by_nothing() {
        let with_auth = |entry: u8| {
            let mut r = req(7, 1, 10);
            r.auth = vec![redoubt_crypto::Mac([entry; 16]); 4].into();
            r
        };
        let auth_of = |p: &RequestPool| p.get(7).map(|w| w.req.auth[1]);
        // Relayed first (a faulty replica may have damaged it): the client's copy replaces
        // it, once.
        let mut p = pool();
        let relayed = with_auth(1);
        let d = relayed.request.digest();
        p.admit(relayed, d, false, false);
        p.refresh(7, true, &with_auth(2), false);
        assert_eq!(auth_of(&p), Some(redoubt_crypto::Mac([2; 16])));
        p.refresh(7, true, &with_auth(3), false);
        assert_eq!(
            auth_of(&p),
            Some(redoubt_crypto::Mac([2; 16])),
            "replaced twice"
        );
        // Straight from the client first: nothing replaces it.
        let mut p = pool();
        p.admit(with_auth(4), d, false, true);
        p.refresh(7, true, &with_auth(5), false);
        p.refresh(7, false, &with_auth(6), false);
        assert_eq!(auth_of(&p), Some(redoubt_crypto::Mac([4; 16])));
        // A signature still joins.
        let mut signed = with_auth(7);
        signed.sig = Some(crate::message::RequestSig {
            counter: 1,
            sig: Default::default(),
        });
        p.refresh(7, true, &signed, true);
        assert!(p.get(7).is_some_and(|w| w.signed && w.req.sig.is_some()));
        assert_eq!(auth_of(&p), Some(redoubt_crypto::Mac([4; 16])));
    }
}
