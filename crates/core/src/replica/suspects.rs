//! Clients under suspicion (a child module of [`crate::replica`]).
//!
//! A faulty client can make its authenticator verify at some replicas only. With a faulty
//! replica that vouches for such a request towards chosen replicas, the batch holding it can
//! prepare nowhere (a slot prepares only when f+1 backups vouch for each request) and stall
//! until a view change decides it null. That costs one view change per attempt, so a client
//! whose request was doubted (named in some PREPARE's doubts) in a batch that did not commit
//! before the view change comes under suspicion for `suspect_client_ms`: its requests are
//! ordered only when they carry its key-holder signature, which every replica can check. A
//! correct client signs every retransmission, so it is slowed by one retransmission timeout per
//! request while suspected; a faulty client that will not sign is shut out.
//!
//! Suspicion is local: the primary holds back a suspect's unsigned requests, and backups do
//! not run their view-change timer for them.

use super::*;

/// Clients under suspicion kept at most; the one whose suspicion ends first goes first.
pub(super) const SUSPECTS_MAX: usize = 4096;

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Whether client `c` is under suspicion now.
    pub(super) fn suspected(&self, c: ClientId) -> bool {
        self.suspects
            .get(&c)
            .is_some_and(|until| *until > self.now())
    }

    /// Whether a waiting request may be ordered: its client is not suspected, or it is signed.
    pub(super) fn orderable(&self, w: &Waiting) -> bool {
        w.signed || !self.suspected(w.req.request.client)
    }

    /// Puts under suspicion the clients of requests doubted in the slots of the view we are
    /// leaving that did not commit.
    pub(super) fn suspect_doubted_clients(&mut self) {
        let mut doubted = BTreeSet::new();
        for s in self.log.values().filter(|s| !s.committed) {
            let Some(b) = s.pp.and_then(|d| self.batches.get(&d)) else {
                continue;
            };
            for i in s.doubts.values().flatten() {
                if let Some(r) = b.requests.get(*i as usize) {
                    doubted.insert(r.request.client);
                }
            }
        }
        let until = self.now() + self.cfg.suspect_client_ms;
        for c in doubted {
            if recovery::recovery_of(c, self.cfg.n()).is_some() {
                continue;
            }
            if self.suspects.len() >= SUSPECTS_MAX && !self.suspects.contains_key(&c) {
                let now = self.now();
                self.suspects.retain(|_, u| *u > now);
                if self.suspects.len() >= SUSPECTS_MAX {
                    let first = self
                        .suspects
                        .iter()
                        .min_by_key(|(c, u)| (**u, **c))
                        .map(|(c, _)| *c)
                        .expect("full");
                    self.suspects.remove(&first);
                }
            }
            self.suspects.insert(c, until);
            self.stats.clients_suspected += 1;
            self.event(Event::ClientSuspected { client: c });
        }
    }
}
