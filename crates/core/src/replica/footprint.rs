//! The sizes of a replica's bounded structures ([`Footprint`]), and the bounds they must stay
//! within, which the simulator's bounded-memory check and the metrics read.

use super::*;

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// Sizes of every bounded structure, for tests and metrics.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            log_slots: self.ordering.order.log.len(),
            pending_pre_prepares: self.ordering.order.pending_pp.len(),
            executed: self.exec.executed_len(),
            batches: self.ordering.order.batches.len(),
            checkpoints: self.exec.checkpoints_len(),
            checkpoint_votes: self.ordering.ckpt_votes.len(),
            pset: self.views.claims.prepared_len(),
            qset_pairs: self.views.claims.q_pairs(),
            clients: self.exec.clients_len(),
            waiting: self.requests.pool.len(),
            replaced: self.requests.pool.replaced_len(),
            replaced_bytes: self.requests.pool.replaced_bytes(),
            arrivals: self.requests.pool.arrivals_len(),
            reads: self.requests.reads.len(),
            view_changes: self.views.store.messages(),
            acks: self.views.store.acks_len(),
            bodies_journaled: self.ordering.order.bodies_journaled.len(),
            body_sessions: self.exec.sessions_len(),
            state: self.exec.state().footprint(),
            prime: self
                .proposals
                .prime()
                .map(|p| p.footprint())
                .unwrap_or_default(),
        }
    }

    /// The bounds [`Replica::footprint`] must stay within, given the number of known clients.
    pub fn footprint_bounds(&self, clients: usize) -> Footprint {
        let n = self.cfg.n() as usize;
        let l = self.cfg.log_size as usize;
        let f = self.cfg.f as usize;
        let ckpts = (self.cfg.log_size / self.cfg.checkpoint_interval) as usize + 2;
        Footprint {
            log_slots: l,
            pending_pre_prepares: l,
            executed: l,
            batches: l * (f + 4),
            checkpoints: ckpts,
            checkpoint_votes: n * ckpts,
            pset: l,
            qset_pairs: l * (f + 2),
            clients,
            waiting: clients,
            replaced: RequestPool::replaced_bounds(&self.cfg).0,
            replaced_bytes: RequestPool::replaced_bounds(&self.cfg).1,
            arrivals: clients,
            reads: clients,
            view_changes: 5 * n,
            acks: n * ACKS_PER_ACKER_MAX,
            bodies_journaled: l,
            body_sessions: clients,
            state: StateFootprint {
                // Pages modified since the stable checkpoint are bounded by what the log's
                // requests can write; the simulator's small states make this the page count.
                overlay_pages: self.exec.state().geometry().pages() as usize,
                checkpoints: ckpts + 1,
                copied_pages: self.exec.state().geometry().pages() as usize * (ckpts + 1),
                copied_nodes: 2 * self.exec.state().geometry().pages() as usize * (ckpts + 1),
                dirty_pages: self.exec.state().geometry().pages() as usize,
                invalid_pages: self.exec.state().geometry().pages() as usize,
            },
            prime: if self.proposals.prime().is_some() {
                crate::prime::side::prime_bounds(&self.cfg, ckpts)
            } else {
                PrimeFootprint::default()
            },
        }
    }
}

/// Sizes of a replica's bounded structures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub log_slots: usize,
    pub pending_pre_prepares: usize,
    pub executed: usize,
    pub batches: usize,
    pub checkpoints: usize,
    pub checkpoint_votes: usize,
    pub pset: usize,
    pub qset_pairs: usize,
    pub clients: usize,
    pub waiting: usize,
    pub replaced: usize,
    pub replaced_bytes: usize,
    pub arrivals: usize,
    pub reads: usize,
    pub view_changes: usize,
    pub acks: usize,
    pub bodies_journaled: usize,
    pub body_sessions: usize,
    pub state: StateFootprint,
    /// Prime's structures (all zero under PBFT).
    pub prime: PrimeFootprint,
}

impl Footprint {
    /// Names of the fields of `self` that exceed `bound`.
    pub fn exceeds(&self, bound: &Footprint) -> Vec<&'static str> {
        let pairs = [
            ("log_slots", self.log_slots, bound.log_slots),
            (
                "pending_pre_prepares",
                self.pending_pre_prepares,
                bound.pending_pre_prepares,
            ),
            ("executed", self.executed, bound.executed),
            ("batches", self.batches, bound.batches),
            ("checkpoints", self.checkpoints, bound.checkpoints),
            (
                "checkpoint_votes",
                self.checkpoint_votes,
                bound.checkpoint_votes,
            ),
            ("pset", self.pset, bound.pset),
            ("qset_pairs", self.qset_pairs, bound.qset_pairs),
            ("clients", self.clients, bound.clients),
            ("waiting", self.waiting, bound.waiting),
            ("replaced", self.replaced, bound.replaced),
            ("replaced_bytes", self.replaced_bytes, bound.replaced_bytes),
            ("arrivals", self.arrivals, bound.arrivals),
            ("reads", self.reads, bound.reads),
            ("view_changes", self.view_changes, bound.view_changes),
            ("acks", self.acks, bound.acks),
            (
                "bodies_journaled",
                self.bodies_journaled,
                bound.bodies_journaled,
            ),
            ("body_sessions", self.body_sessions, bound.body_sessions),
            (
                "state_checkpoints",
                self.state.checkpoints,
                bound.state.checkpoints,
            ),
            (
                "state_copied_pages",
                self.state.copied_pages,
                bound.state.copied_pages,
            ),
            (
                "state_copied_nodes",
                self.state.copied_nodes,
                bound.state.copied_nodes,
            ),
            ("prime_slots", self.prime.slots, bound.prime.slots),
            (
                "prime_slot_entries",
                self.prime.slot_entries,
                bound.prime.slot_entries,
            ),
            (
                "prime_challenges",
                self.prime.challenges,
                bound.prime.challenges,
            ),
            ("prime_pings", self.prime.pings, bound.prime.pings),
            (
                "prime_checkpoints",
                self.prime.checkpoints,
                bound.prime.checkpoints,
            ),
            ("prime_arrivals", self.prime.arrivals, bound.prime.arrivals),
            (
                "prime_leave_votes",
                self.prime.leave_votes,
                bound.prime.leave_votes,
            ),
        ];
        pairs
            .iter()
            .filter(|(_, v, b)| v > b)
            .map(|(n, _, _)| *n)
            .collect()
    }
}
