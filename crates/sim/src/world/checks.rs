//! The checks at the end of a run (liveness, proactive recovery completed, linearizability,
//! the view bound, state repaired after corruption) and the periodic footprint and watermark
//! checks.

use super::*;

impl World {
    /// Runs every end-of-run check (`stopped`: the scenario's stop time cut the run short).
    pub(super) fn end_of_run_checks(&mut self, stopped: bool) {
        self.stats.sim_time_ms = self.now;
        self.check_footprints();
        self.check_watermarks();
        self.check_execution_acked();
        if self.violations.is_empty() && !self.all_clients_done() && !stopped {
            let stuck: Vec<String> = self
                .clients
                .iter()
                .filter(|c| c.done < self.sc.ops_per_client)
                .map(|c| {
                    let since = c.current.map(|h| self.history[h].invoke_ms);
                    format!(
                        "c{} ({} of {} done, outstanding since {:?}ms)",
                        c.core.id(),
                        c.done,
                        self.sc.ops_per_client,
                        since
                    )
                })
                .collect();
            self.violation(format!(
                "liveness: correct clients did not finish within {}ms after heal at {}ms: {}",
                self.sc.liveness_bound_ms,
                self.sc.heal_ms,
                stuck.join(", ")
            ));
        }
        if self.violations.is_empty() && !stopped {
            self.check_bounded_delay();
            self.check_planted_rows();
        }
        if let Some(p) = &self.sc.proactive {
            if self.violations.is_empty() && !self.proactive_done() && !stopped {
                let (c, rec) = (self.stats.compromises, self.stats.recoveries);
                let want = p.compromises;
                let waiting = match self.awaiting_recovery {
                    Some((r, at)) => format!(" (r{r}'s, started at {at}ms, never completed)"),
                    None => String::new(),
                };
                self.violation(format!(
                    "proactive recovery: {c} of {want} compromises, {rec} recoveries \
                     completed{waiting}"
                ));
            }
        }
        if self.violations.is_empty() || self.trace_on {
            if let Err(v) = linearizability::check(&self.history) {
                self.violation(format!(
                    "linearizability: key {:?}: {}",
                    String::from_utf8_lossy(&v.key),
                    v.explanation
                ));
            }
        }
        for r in &self.replicas {
            self.stats.max_view = self.stats.max_view.max(r.view());
            self.stats.requests_doubted += r.stats.requests_doubted;
        }
        if let Some(bound) = self.sc.view_bound {
            let correct_max = (0..self.sc.core.n())
                .filter(|r| !self.adversary.controls(*r))
                .map(|r| self.replicas[r as usize].view())
                .max()
                .unwrap_or(0);
            if correct_max > bound {
                self.violation(format!(
                    "a correct replica reached view {correct_max}, above the scenario's bound \
                     {bound}: a lone faulty replica, or view changes no fault called for, moved it"
                ));
            }
        }
        if let Some(at) = self.sc.views_settled_ms {
            self.check_views_settled(at, stopped);
        }
        // A state check finds every corrupt page, and a replica that knows of corrupt pages
        // repairs them (given time after the heal to fetch them).
        for r in 0..self.sc.core.n() {
            if self.up[r as usize] != Up::Running || self.adversary.controls(r) {
                continue;
            }
            let st = self.replicas[r as usize].state();
            let bad = st.verify();
            let unknown: Vec<u64> = bad
                .iter()
                .filter(|p| !st.invalid_pages().contains(p))
                .copied()
                .collect();
            let known = st.invalid_pages().clone();
            let needs_repair = st.needs_repair();
            if !unknown.is_empty() && !self.unscrubbed.contains(&r) {
                self.violation(format!("r{r} has corrupt pages {unknown:?} a check missed"));
            }
            let found = self.corrupt_found.get(&r).copied().unwrap_or(0);
            if needs_repair {
                self.stats.unrepaired_at_end += 1;
            }
            if needs_repair && self.now > found.max(self.sc.heal_ms) + 5_000 {
                self.violation(format!(
                    "r{r} still has corrupt pages {known:?} found at {found}ms"
                ));
            }
        }
        // A corrupted replica must have repaired itself: its last checkpoint agrees with what
        // the correct replicas computed at that sequence number (given time to notice: the
        // votes of the others arrive after its own checkpoint; and time after the network
        // heals: simulator seed 1305 ended with the replica partitioned away since 740 ms
        // after its corruption, its transfers restarted by the checkpoints before that).
        for r in self.corrupted.clone() {
            if let Some((seq, d, at)) = self.last_checkpoint.get(&r).copied() {
                if let Some(good) = self.checker.checkpoint_digest(seq) {
                    if good != d
                        && self.now > at.max(self.sc.heal_ms) + 2_000
                        && self.up[r as usize] == Up::Running
                    {
                        self.violation(format!(
                            "r{r} was corrupted and still has a wrong checkpoint at n{seq}"
                        ));
                    }
                }
            }
        }
    }

    /// Whether this run observes Prime's bounded delay.
    pub(super) fn probing_delay(&self) -> bool {
        self.sc.core.prime() && self.sc.bounded_delay
    }

    /// Prime's promise (spec prime.md §1): once the network is stable, the latency of an
    /// update a correct server introduces is bounded, whatever up to f faulty replicas do, a
    /// faulty leader included (Suspect-Leader replaces one slower than the bound). Measured
    /// from the first receipt of a correct client's update at a correct replica to its
    /// execution at f+1 correct replicas (see `delay.rs`), for updates received after
    /// stabilisation: the heal time, every crash, reboot and pause over, the last hand-over
    /// and the last proactive recovery done, plus time for the replicas to settle (view changes, catch-up). The bound is
    /// generous against the simulated delays but far below what a leader holding its
    /// proposals back just under the view-change timeout costs each update.
    /// `Scenario::views_settled_ms`: at the end of the run, at or after `at`, every correct
    /// running replica is active in one view (a replica left alone in a view change the
    /// others never join fails it, however well the others serve the clients).
    fn check_views_settled(&mut self, at: u64, stopped: bool) {
        if self.now < at && !stopped {
            self.violation(format!(
                "the run ended at {}ms, before the view check due at {at}ms",
                self.now
            ));
            return;
        }
        let views: Vec<(ReplicaId, u64, bool)> = (0..self.sc.core.n())
            .filter(|r| {
                !self.adversary.controls(*r)
                    && !self.faulty.contains(r)
                    && self.up[*r as usize] == Up::Running
            })
            .map(|r| {
                let rep = &self.replicas[r as usize];
                (r, rep.view(), rep.is_normal())
            })
            .collect();
        let settled = views
            .iter()
            .all(|(_, v, normal)| *normal && *v == views[0].1);
        if !settled {
            let list: Vec<String> = views
                .iter()
                .map(|(r, v, normal)| {
                    let how = if *normal { "active" } else { "changing" };
                    format!("r{r} {how} in view {v}")
                })
                .collect();
            self.violation(format!(
                "views not settled at {}ms (due by {at}ms): {}",
                self.now,
                list.join(", ")
            ));
        }
    }

    fn check_bounded_delay(&mut self) {
        if !self.probing_delay() {
            return;
        }
        let windows = self
            .sc
            .amnesia
            .iter()
            .chain(&self.sc.pauses)
            .chain(&self.sc.reboots);
        // An operator's hand-over (step-down) may give the lead to a faulty replica that
        // Suspect-Leader then has to replace: the promise starts again after the last one.
        let stable = windows
            .map(|w| w.end_ms)
            .chain(self.sc.step_downs.iter().copied())
            .chain([self.sc.heal_ms, self.last_recovered_ms])
            .max()
            .unwrap_or(0)
            + PRIME_SETTLE_MS;
        let bound = prime_delay_bound(&self.sc);
        let late = self.delay.slowest_since(stable);
        if let Some((lat, c, at)) = late.filter(|(lat, _, _)| *lat > bound) {
            self.violation(format!(
                "bounded delay: c{c}'s update first received by a correct replica at {at}ms \
                 took {lat}ms to execute at f+1 correct replicas after stabilisation at \
                 {stable}ms (bound {bound}ms)"
            ));
        }
    }

    /// Prime under proactive recovery: at the end, no correct replica's matrix holds a row of
    /// a replica it knows recovered (it ran the request that installed the replica's order
    /// key in force) claiming certificates the replica does not hold: rows an attacker signed
    /// with a key it took from the replica must not outlive the recovery (a planted row far
    /// ahead is replaced only by a newer one, which the replica never signs).
    fn check_planted_rows(&mut self) {
        if !self.sc.core.prime() || self.sc.proactive.is_none() {
            return;
        }
        let n = self.sc.core.n();
        let mut lies = Vec::new();
        for j in 0..n {
            let rj = &self.replicas[j as usize];
            if self.faulty.contains(&j)
                || self.compromised == Some(j)
                || self.up[j as usize] != Up::Running
            {
                continue;
            }
            let (Some((inc, _)), Some((_, cum))) = (rj.order_key(), rj.prime_rows()) else {
                continue;
            };
            for i in (0..n).filter(|i| *i != j && !self.faulty.contains(i)) {
                let ri = &self.replicas[i as usize];
                if self.up[i as usize] != Up::Running || ri.incarnation_of(j) != inc {
                    continue;
                }
                let Some((rows, _)) = ri.prime_rows() else {
                    continue;
                };
                if let Some(row) = rows.get(j as usize).and_then(Option::as_ref) {
                    if row.aru.iter().zip(&cum).any(|(claim, held)| claim > held) {
                        lies.push(format!(
                            "r{i} holds r{j}'s row {:?} (r{j} holds {cum:?})",
                            row.aru
                        ));
                    }
                }
            }
        }
        if let Some(first) = lies.first() {
            self.violation(format!(
                "planted rows: {} rows claim more than their recovered replica holds, e.g. {first}",
                lies.len()
            ));
        }
    }

    pub(super) fn check_footprints(&mut self) {
        // Recovery requests add one reserved client per replica.
        let clients =
            self.sc.clients as usize + self.sc.byz_clients.len() + self.sc.core.n() as usize;
        for r in 0..self.replicas.len() {
            if self.faulty.contains(&(r as ReplicaId)) {
                continue;
            }
            let rep = &self.replicas[r];
            let cfg = rep.config();
            // A compacted journal: one checkpoint, one view, one watermark, and per sequence
            // number in the window at most a pre-prepare (and a late vouch for it), a
            // prepare, an execution and, for an execution recorded without its body, the
            // pre-prepare of an earlier view that carries it.
            // Prime adds per sequence number its execution's requests, and, within the window
            // per originator, what is not yet run: our own PO-REQUESTs, the ones we accepted,
            // and acknowledgement and certificate records (each names one not yet run, twice
            // over between two compactions), and the order keys drawn for recoveries.
            let prime = if cfg.prime() {
                let n = cfg.n() as usize;
                cfg.log_size as usize
                    + (1 + n + 2 * n + 2 * n) * cfg.prime_window as usize
                    + redoubt_core::journal::ORDER_KEYS_KEPT
            } else {
                0
            };
            let disk_bound = 3 + 5 * (cfg.log_size as usize) + prime;
            if self.disks[r].len() > disk_bound {
                let len = self.disks[r].len();
                let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
                for rec in &self.disks[r] {
                    *kinds.entry(rec.kind()).or_default() += 1;
                }
                self.violation(format!(
                    "r{r} journal holds {len} records, bound {disk_bound}: {kinds:?}"
                ));
            }
            let rep = &self.replicas[r];
            let over = rep.footprint().exceeds(&rep.footprint_bounds(clients));
            if !over.is_empty() {
                let fp = rep.footprint();
                self.violation(format!("r{r} exceeds memory bounds {over:?}: {fp:?}"));
            }
        }
    }

    /// Separated deployments: what a correct agreement node takes as executed (from
    /// execution nodes' acknowledgements or certificates) some correct execution node
    /// executed; beyond it, the agreement node was fooled (and may drop batches execution
    /// still needs).
    pub(super) fn check_execution_acked(&mut self) {
        if !self.sc.core.separated() {
            return;
        }
        let max = self.exec_checker.max_executed();
        for r in 0..self.sc.core.n() {
            if self.up[r as usize] != Up::Running || self.checker.is_faulty(r) {
                continue;
            }
            let acked = self.replicas[r as usize].execution_acked();
            if acked > max && self.watermark_reported.insert(r) {
                self.violation(format!(
                    "r{r} took execution through n{acked}, beyond what any correct \
                     execution node executed (n{max})"
                ));
            }
        }
    }

    /// A correct replica's low watermark is a checkpoint some correct replica took (2f+1
    /// vouched for it, or f+1 named it in a NEW-VIEW's view changes): one above every
    /// checkpoint correct replicas took means it adopted a fabricated one (and waits forever
    /// to fetch it).
    pub(super) fn check_watermarks(&mut self) {
        let max = self.checker.max_checkpoint();
        for r in 0..self.sc.core.n() {
            if self.up[r as usize] != Up::Running || self.checker.is_faulty(r) {
                continue;
            }
            let h = self.replicas[r as usize].stable_checkpoint();
            if h > max && self.watermark_reported.insert(r) {
                self.violation(format!(
                    "r{r} moved its low watermark to n{h}, above every checkpoint a correct \
                     replica took (n{max}): a fabricated checkpoint"
                ));
            }
        }
    }
}

/// How long after stabilisation the bounded-delay check starts (ms).
const PRIME_SETTLE_MS: u64 = 3000;

/// The latency a correct client's update may take after stabilisation in a Prime run (ms):
/// thirty worst-case one-way delays (the request, pre-ordering, the summary, the three
/// ordering phases and the reply, with room for a retransmission and a view change to a
/// correct leader) plus two proposal periods. A worst-case delay between correct replicas
/// includes what a replica slow to hear its peers adds (`Scenario::slow_inbound`): Prime's
/// promise is for timely links between the stable servers, and a correct replica that hears
/// its peers late for the whole run is one of the 2f+1 whenever f replicas are faulty.
pub(super) fn prime_delay_bound(sc: &crate::scenario::Scenario) -> u64 {
    let slow = sc.slow_inbound.iter().map(|(_, ms)| *ms).max().unwrap_or(0);
    30 * (sc.delay_ms.1 + slow)
        + 4 * sc.core.prime_proposal_period_ms
        + 2 * sc.core.status_interval_ms
}
