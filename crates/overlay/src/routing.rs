//! Link-state routing (Spines §4): the link-state database, the topology it implies, and
//! shortest paths over it.
//!
//! Each node floods updates listing its up links and their measured costs. An update is
//! authenticated to every node by its origin (an authenticator: one MAC per node), so a relay
//! cannot forge or alter another node's links; it is accepted only if newer than the one held,
//! and an origin's updates arriving faster than half its minimum spacing are refused (a faulty
//! origin cannot make the overlay flood without bound). A link enters the topology only if
//! **both** ends list it, at the larger of their two costs: a faulty node cannot invent a link
//! to a correct node, nor make one look cheaper than the correct end says. Two colluding faulty
//! nodes can still advertise a link between themselves (ODSBR's "virtual link"); ODSBR then
//! accuses it if it loses packets.

use crate::stats::DropReason;
use crate::types::{LinkId, NodeId};
use crate::wire::{Lsu, LsuSeq};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Cost advertised for a link: one-way latency in ms, inflated by loss (10% loss doubles it).
pub fn link_cost(srtt_ms: Option<u64>, loss_permille: u32, cost_max: u32) -> u32 {
    let one_way = srtt_ms.map_or(100, |s| (s / 2).max(1));
    let c = one_way * (1_000 + 10 * loss_permille.min(1_000) as u64) / 1_000;
    c.clamp(1, cost_max as u64) as u32
}

/// Whether a new measured cost differs enough from the advertised one to flood an update
/// (more than 25%): avoids flooding on every jitter.
pub fn cost_changed_significantly(advertised: u32, measured: u32) -> bool {
    4 * advertised.abs_diff(measured) as u64 > advertised as u64
}

#[derive(Clone, Debug)]
struct Entry {
    lsu: Lsu,
    stored_ms: u64,
}

/// The link-state database: the newest update of each origin.
#[derive(Clone, Debug)]
pub(crate) struct LinkStateDb {
    me: NodeId,
    entries: Vec<Option<Entry>>,
    /// Per origin, the newest update that arrived too soon after the one held: it is installed
    /// when the origin's spacing allows (so rate limiting never loses the latest state).
    deferred: Vec<Option<Lsu>>,
    /// Grows on every change; caches of derived routes compare it.
    version: u64,
    graph: Option<(u64, Graph)>,
}

/// The confirmed topology: `adj[a]` lists `(b, cost)` for every link both ends advertise.
#[derive(Clone, Debug, Default)]
pub(crate) struct Graph {
    pub adj: Vec<Vec<(NodeId, u32)>>,
}

impl Graph {
    pub fn cost(&self, a: NodeId, b: NodeId) -> Option<u32> {
        self.adj
            .get(a.index())?
            .iter()
            .find(|(n, _)| *n == b)
            .map(|&(_, c)| c)
    }
}

impl LinkStateDb {
    pub fn new(me: NodeId, nodes_count: u16) -> LinkStateDb {
        LinkStateDb {
            me,
            entries: vec![None; nodes_count as usize],
            deferred: vec![None; nodes_count as usize],
            version: 0,
            graph: None,
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn seq_of(&self, origin: NodeId) -> Option<LsuSeq> {
        self.entries[origin.index()].as_ref().map(|e| e.lsu.seq)
    }

    /// Installs our own update (no checks: we made it).
    pub fn install_own(&mut self, lsu: Lsu, now_ms: u64) {
        assert_eq!(lsu.origin, self.me);
        if let Some(held) = self.seq_of(self.me) {
            assert!(lsu.seq > held, "own updates grow");
        }
        self.entries[self.me.index()] = Some(Entry {
            lsu,
            stored_ms: now_ms,
        });
        self.version += 1;
    }

    /// Takes an authenticated update from another origin. `Ok(true)`: installed (flood it);
    /// `Ok(false)`: newer but too soon after the one held, deferred until
    /// [`LinkStateDb::install_deferred`]; `Err`: older than what is held or deferred.
    pub fn accept(
        &mut self,
        lsu: Lsu,
        now_ms: u64,
        min_interval_ms: u64,
    ) -> Result<bool, DropReason> {
        debug_assert_ne!(lsu.origin, self.me);
        let origin = lsu.origin.index();
        if let Some(e) = &self.entries[origin] {
            if lsu.seq <= e.lsu.seq
                || self.deferred[origin]
                    .as_ref()
                    .is_some_and(|d| lsu.seq <= d.seq)
            {
                return Err(DropReason::LsuStale);
            }
            if now_ms < e.stored_ms + min_interval_ms / 2 {
                self.deferred[origin] = Some(lsu);
                return Ok(false);
            }
        }
        self.deferred[origin] = None;
        self.entries[origin] = Some(Entry {
            lsu,
            stored_ms: now_ms,
        });
        self.version += 1;
        Ok(true)
    }

    /// Installs deferred updates whose origin's spacing has passed; returns them (to flood).
    pub fn install_deferred(&mut self, now_ms: u64, min_interval_ms: u64) -> Vec<Lsu> {
        let mut out = Vec::new();
        for origin in 0..self.deferred.len() {
            let due = self.deferred[origin].is_some()
                && self.entries[origin]
                    .as_ref()
                    .is_none_or(|e| now_ms >= e.stored_ms + min_interval_ms / 2);
            if due {
                let lsu = self.deferred[origin].take().expect("checked");
                self.entries[origin] = Some(Entry {
                    lsu: lsu.clone(),
                    stored_ms: now_ms,
                });
                self.version += 1;
                out.push(lsu);
            }
        }
        out
    }

    /// When the earliest deferred update may be installed.
    pub fn next_deferred_ms(&self, min_interval_ms: u64) -> Option<u64> {
        self.deferred
            .iter()
            .enumerate()
            .filter(|(_, d)| d.is_some())
            .map(|(o, _)| {
                self.entries[o]
                    .as_ref()
                    .map_or(0, |e| e.stored_ms + min_interval_ms / 2)
            })
            .min()
    }

    /// Forgets updates not refreshed for `max_age_ms` (their origin is gone or cut off).
    pub fn expire(&mut self, now_ms: u64, max_age_ms: u64) {
        let me = self.me;
        let mut changed = false;
        for (i, slot) in self.entries.iter_mut().enumerate() {
            if i == me.index() {
                continue;
            }
            if slot
                .as_ref()
                .is_some_and(|e| now_ms >= e.stored_ms + max_age_ms)
            {
                *slot = None;
                changed = true;
            }
        }
        if changed {
            self.version += 1;
        }
    }

    /// Earliest time an update will expire.
    pub fn next_expiry_ms(&self, max_age_ms: u64) -> Option<u64> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.me.index())
            .filter_map(|(_, e)| e.as_ref().map(|e| e.stored_ms + max_age_ms))
            .min()
    }

    /// Every update held, for a neighbour whose link just came up.
    pub fn all(&self) -> impl Iterator<Item = &Lsu> {
        self.entries.iter().flatten().map(|e| &e.lsu)
    }

    /// The confirmed topology (cached per version).
    pub fn graph(&mut self) -> &Graph {
        if self.graph.as_ref().is_none_or(|(v, _)| *v != self.version) {
            let n = self.entries.len();
            let mut adj = vec![Vec::new(); n];
            for (a, e) in self.entries.iter().enumerate() {
                let Some(e) = e else { continue };
                for l in &e.lsu.links {
                    let b = l.neighbour.index();
                    let Some(other) = self.entries.get(b).and_then(|x| x.as_ref()) else {
                        continue;
                    };
                    if let Some(back) = other.lsu.links.iter().find(|x| x.neighbour.index() == a) {
                        adj[a].push((l.neighbour, l.cost.max(back.cost)));
                    }
                }
                adj[a].sort();
            }
            self.graph = Some((self.version, Graph { adj }));
        }
        &self.graph.as_ref().expect("just built").1
    }
}

/// Result of Dijkstra from one node: distance and predecessor of every node, and the order in
/// which nodes were settled.
#[derive(Clone, Debug)]
pub(crate) struct Tree {
    pub from: NodeId,
    pub dist: Vec<Option<u64>>,
    pub prev: Vec<Option<NodeId>>,
    pub order: Vec<NodeId>,
}

/// Shortest paths from `from`; `edge_cost(link, advertised_cost)` gives the cost used.
/// Deterministic: ties go to the path found first, scanning neighbours by id.
pub(crate) fn shortest_paths(
    graph: &Graph,
    from: NodeId,
    hops_max: usize,
    edge_cost: impl Fn(LinkId, u32) -> u64,
) -> Tree {
    let n = graph.adj.len();
    let mut dist: Vec<Option<u64>> = vec![None; n];
    let mut hops = vec![0usize; n];
    let mut prev = vec![None; n];
    let mut done = vec![false; n];
    let mut order = Vec::new();
    let mut heap = BinaryHeap::new();
    dist[from.index()] = Some(0);
    heap.push(Reverse((0u64, from)));
    while let Some(Reverse((d, u))) = heap.pop() {
        if done[u.index()] {
            continue;
        }
        done[u.index()] = true;
        order.push(u);
        if hops[u.index()] >= hops_max {
            continue;
        }
        for &(v, c) in &graph.adj[u.index()] {
            if done[v.index()] {
                continue;
            }
            let nd = d.saturating_add(edge_cost(LinkId::new(u, v), c).max(1));
            if dist[v.index()].is_none_or(|old| nd < old) {
                dist[v.index()] = Some(nd);
                prev[v.index()] = Some(u);
                hops[v.index()] = hops[u.index()] + 1;
                heap.push(Reverse((nd, v)));
            }
        }
    }
    Tree {
        from,
        dist,
        prev,
        order,
    }
}

impl Tree {
    /// The path from the root to `dst`, both included.
    pub fn path_to(&self, dst: NodeId) -> Option<Vec<NodeId>> {
        self.dist.get(dst.index())?.as_ref()?;
        let mut path = vec![dst];
        let mut at = dst;
        while at != self.from {
            at = self.prev[at.index()].expect("reached nodes have predecessors");
            path.push(at);
            assert!(
                path.len() <= self.dist.len(),
                "predecessor chain has no cycle"
            );
        }
        path.reverse();
        Some(path)
    }

    /// First hop towards every node (link-state forwarding table).
    pub fn first_hops(&self) -> Vec<Option<NodeId>> {
        let mut first = vec![None; self.dist.len()];
        for &v in &self.order {
            if v == self.from {
                continue;
            }
            let p = self.prev[v.index()].expect("settled nodes have predecessors");
            first[v.index()] = if p == self.from {
                Some(v)
            } else {
                first[p.index()]
            };
        }
        first
    }
}

/// Cost of a given route under `edge_cost`, or `None` if one of its links is not in the graph.
pub(crate) fn route_cost(
    graph: &Graph,
    route: &[NodeId],
    edge_cost: impl Fn(LinkId, u32) -> u64,
) -> Option<u64> {
    let mut total = 0u64;
    for w in route.windows(2) {
        let c = graph.cost(w[0], w[1])?;
        total = total.saturating_add(edge_cost(LinkId::new(w[0], w[1]), c).max(1));
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::LsuLink;

    fn lsu(origin: u16, counter: u64, links: &[(u16, u32)]) -> Lsu {
        Lsu {
            origin: NodeId(origin),
            seq: LsuSeq { epoch: 1, counter },
            links: links
                .iter()
                .map(|&(n, cost)| LsuLink {
                    neighbour: NodeId(n),
                    cost,
                })
                .collect(),
            auth: vec![],
        }
    }

    /// A ring 0-1-2-3-0 with a cheap chord 0-2 advertised by 0 only.
    fn db() -> LinkStateDb {
        let mut db = LinkStateDb::new(NodeId(0), 4);
        db.install_own(lsu(0, 1, &[(1, 10), (3, 10), (2, 1)]), 0);
        for l in [
            lsu(1, 1, &[(0, 10), (2, 10)]),
            lsu(2, 1, &[(1, 10), (3, 10)]),
            lsu(3, 1, &[(2, 10), (0, 30)]),
        ] {
            assert_eq!(db.accept(l, 0, 200), Ok(true));
        }
        db
    }

    #[test]
    fn only_links_both_ends_advertise_count_at_the_larger_cost() {
        let mut db = db();
        let g = db.graph().clone();
        assert_eq!(
            g.cost(NodeId(0), NodeId(2)),
            None,
            "one-sided chord ignored"
        );
        assert_eq!(g.cost(NodeId(0), NodeId(3)), Some(30));
        assert_eq!(g.cost(NodeId(3), NodeId(0)), Some(30));
        let t = shortest_paths(&g, NodeId(0), 16, |_, c| c as u64);
        assert_eq!(
            t.path_to(NodeId(3)),
            Some(vec![NodeId(0), NodeId(3)]),
            "30 direct vs 30 around: first found wins"
        );
        assert_eq!(
            t.path_to(NodeId(2)),
            Some(vec![NodeId(0), NodeId(1), NodeId(2)])
        );
        let first = t.first_hops();
        assert_eq!(first[2], Some(NodeId(1)));
        assert_eq!(first[1], Some(NodeId(1)));
        assert_eq!(first[0], None);
    }

    #[test]
    fn weights_steer_paths_and_route_cost_checks_links() {
        let mut db = db();
        let g = db.graph().clone();
        let bad = LinkId::new(NodeId(0), NodeId(1));
        let t = shortest_paths(&g, NodeId(0), 16, |l, c| {
            if l == bad {
                8 * c as u64
            } else {
                c as u64
            }
        });
        assert_eq!(
            t.path_to(NodeId(2)),
            Some(vec![NodeId(0), NodeId(3), NodeId(2)])
        );
        assert_eq!(
            route_cost(&g, &[NodeId(0), NodeId(1), NodeId(2)], |_, c| c as u64),
            Some(20)
        );
        assert_eq!(
            route_cost(&g, &[NodeId(0), NodeId(2)], |_, c| c as u64),
            None
        );
    }

    #[test]
    fn stale_rate_limited_and_expired_updates() {
        let mut db = db();
        assert_eq!(
            db.accept(lsu(1, 1, &[]), 1_000, 200),
            Err(DropReason::LsuStale)
        );
        // Too soon: deferred, not lost; an older one than the deferred is stale.
        assert_eq!(db.accept(lsu(1, 3, &[]), 50, 200), Ok(false));
        assert_eq!(
            db.accept(lsu(1, 2, &[]), 60, 200),
            Err(DropReason::LsuStale)
        );
        assert_eq!(db.next_deferred_ms(200), Some(100));
        assert!(db.install_deferred(99, 200).is_empty());
        assert_eq!(db.install_deferred(100, 200).len(), 1);
        assert_eq!(db.seq_of(NodeId(1)).unwrap().counter, 3);
        assert_eq!(db.next_deferred_ms(200), None);
        assert_eq!(db.accept(lsu(1, 4, &[]), 200, 200), Ok(true));
        let v = db.version();
        db.expire(30_000, 35_000);
        assert_eq!(db.version(), v);
        db.expire(35_000, 35_000);
        assert!(db.seq_of(NodeId(2)).is_none());
        assert!(db.seq_of(NodeId(0)).is_some(), "own update never expires");
        assert_eq!(db.next_expiry_ms(35_000), Some(35_200));
    }

    #[test]
    fn hop_limit_bounds_paths() {
        // Chain 0-1-2-3.
        let mut db = LinkStateDb::new(NodeId(0), 4);
        db.install_own(lsu(0, 1, &[(1, 1)]), 0);
        for l in [
            lsu(1, 1, &[(0, 1), (2, 1)]),
            lsu(2, 1, &[(1, 1), (3, 1)]),
            lsu(3, 1, &[(2, 1)]),
        ] {
            assert_eq!(db.accept(l, 0, 200), Ok(true));
        }
        let g = db.graph().clone();
        assert!(shortest_paths(&g, NodeId(0), 3, |_, c| c as u64)
            .path_to(NodeId(3))
            .is_some());
        assert!(shortest_paths(&g, NodeId(0), 2, |_, c| c as u64)
            .path_to(NodeId(3))
            .is_none());
    }

    #[test]
    fn costs() {
        assert_eq!(link_cost(Some(20), 0, 60_000), 10);
        assert_eq!(link_cost(Some(20), 100, 60_000), 20);
        assert_eq!(link_cost(None, 0, 60_000), 100);
        assert_eq!(link_cost(Some(0), 0, 60_000), 1);
        assert!(!cost_changed_significantly(100, 120));
        assert!(cost_changed_significantly(100, 130));
    }
}
