//! Clients under suspicion (a child module of [`crate::replica`]).
//!
//! A faulty client can make its authenticator verify at some replicas only. With a faulty
//! replica that vouches for such a request towards chosen replicas, the batch holding it can
//! prepare nowhere (a slot prepares only when 2f backups vouch for each request) and stall
//! until a view change decides it null. That costs one view change per attempt, so a client
//! whose request was doubted (named in some PREPARE's doubts) in a batch that did not commit
//! before the view change comes under suspicion for `suspect_client_ms`: its requests are
//! ordered only when they carry its key-holder signature, which every replica can check. A
//! correct client signs every retransmission, so it is slowed by one retransmission timeout per
//! request while suspected; a faulty client that will not sign is shut out.
//!
//! With `suspect_on_doubts` a client also comes under suspicion as soon as f+1 replicas doubt
//! one of its requests in a pre-prepare (one of them is correct and could not authenticate
//! it): otherwise a client whose MACs verify at the primary only stalls each batch holding its
//! request until its retransmission reaches the backups, and never causes a view change.
//!
//! Suspicion is local: the primary holds back a suspect's unsigned requests, and backups do
//! not run their view-change timer for them.

use super::*;

/// Clients under suspicion kept at most; the one whose suspicion ends first goes first.
pub(super) const SUSPECTS_MAX: usize = 4096;

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Whether client `c` is under suspicion now.
    pub(super) fn suspected(&self, c: ClientId) -> bool {
        self.requests
            .suspects
            .get(&c)
            .is_some_and(|until| *until > self.now())
    }

    /// Whether this replica holds client `c` under suspicion now (for hosts and the
    /// simulator: a correct client suspected after a lossy spell pays a retransmission
    /// timeout per request until the suspicion ends).
    pub fn suspects(&self, c: ClientId) -> bool {
        self.suspected(c)
    }

    /// Whether a waiting request may be ordered: its client is not suspected, or it is signed.
    pub(super) fn orderable(&self, w: &Waiting) -> bool {
        w.signed || !self.suspected(w.req.request.client)
    }

    /// Puts under suspicion the clients of requests doubted in the slots of the view we are
    /// leaving that did not commit.
    pub(super) fn suspect_doubted_clients(&mut self) {
        let mut doubted = BTreeSet::new();
        for s in self.ordering.order.log.values().filter(|s| !s.committed) {
            let Some(b) = s.pp.and_then(|d| self.ordering.order.batches.get(&d)) else {
                continue;
            };
            for i in s.doubts.values().flatten() {
                if let Some(r) = b.requests.get(*i as usize) {
                    doubted.insert(r.request.client);
                }
            }
        }
        for c in doubted {
            self.suspect_client(c);
        }
    }

    /// With `suspect_on_doubts`: f+1 replicas doubt request `i` of the batch at `seq`, so a
    /// correct one could not authenticate it; its client comes under suspicion now.
    pub(super) fn suspect_if_doubted(&mut self, seq: Seq, i: u16) {
        if !self.cfg.suspect_on_doubts {
            return;
        }
        let Some(slot) = self.ordering.order.log.get(&seq) else {
            return;
        };
        let doubting = slot
            .doubts
            .values()
            .filter(|d| d.binary_search(&i).is_ok())
            .count();
        if doubting <= self.cfg.f as usize {
            return;
        }
        let client = slot
            .pp
            .and_then(|d| self.ordering.order.batches.get(&d))
            .and_then(|b| b.requests.get(i as usize))
            .map(|r| r.request.client);
        if let Some(c) = client {
            if !self.suspected(c) {
                self.suspect_client(c);
            }
        }
    }

    /// Puts client `c` under suspicion for `suspect_client_ms` (never a recovery client).
    fn suspect_client(&mut self, c: ClientId) {
        let until = self.now() + self.cfg.suspect_client_ms;
        if recovery::recovery_of(c, self.cfg.n()).is_some() {
            return;
        }
        if self.requests.suspects.len() >= SUSPECTS_MAX && !self.requests.suspects.contains_key(&c)
        {
            let now = self.now();
            self.requests.suspects.retain(|_, u| *u > now);
            if self.requests.suspects.len() >= SUSPECTS_MAX {
                let first = self
                    .requests
                    .suspects
                    .iter()
                    .min_by_key(|(c, u)| (**u, **c))
                    .map(|(c, _)| *c)
                    .expect("full");
                self.requests.suspects.remove(&first);
            }
        }
        // A client suspected already has its suspicion renewed, not counted again.
        let renewed = self.suspected(c);
        self.requests.suspects.insert(c, until);
        if !renewed {
            self.stats.clients_suspected += 1;
            self.event(Event::ClientSuspected { client: c });
        }
    }
}
