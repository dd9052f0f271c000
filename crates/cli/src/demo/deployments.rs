//! The demo's separated and firewall parts: execution node 1 killed and restarted, and
//! the firewall's verification (leak attempts refused, no value in clear on the replicas).

use super::*;

/// The firewall deployment's compromised execution node, and the filter killed for good.
pub(super) const FW_LEAKER: u32 = 2;
pub(super) const FW_VICTIM: u32 = 1;

/// The firewall's part of the verification: the compromised execution node's leak attempts
/// were refused by the top row of filters (their metrics count them), and no value the
/// workload wrote lies in clear anywhere under a replica's home.
pub(super) async fn firewall_check(cfg: &ClusterConfig) -> Result<String, String> {
    let top = cfg.protocol.filter_rows.saturating_sub(1);
    let mut refused = 0.0;
    for x in cfg.protocol.filter_row(top) {
        let Some(entry) = cfg.filters.get(x as usize) else {
            continue;
        };
        let text = redoubt_localcluster::http::get(entry.metrics_addr, "/metrics", POLL_TIMEOUT)
            .await
            .map_err(|e| format!("filter {x}'s metrics: {e}"))?;
        for line in String::from_utf8_lossy(&text).lines() {
            let counted = line.starts_with("redoubt_firewall_certificates_rejected_total")
                || line.starts_with("redoubt_firewall_shares_rejected_total");
            if let (true, Some(v)) = (counted, line.split_whitespace().last()) {
                refused += v.parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    if refused < 1.0 {
        return Err(
            "the top row of filters refused no leak attempt (was the compromised node running?)"
                .into(),
        );
    }
    let mut scanned = 0u64;
    for r in &cfg.replicas {
        let home = cfg.resolve(&r.home);
        if let Some(path) = find_in_tree(&home, b"-v", &mut scanned) {
            return Err(format!(
                "a written value lies in clear in {} (a replica's disk)",
                path.display()
            ));
        }
    }
    Ok(format!(
        "blocked: {refused:.0} leak attempts refused by the top row of filters; no written value in clear in {scanned} bytes of the replicas' journals and state"
    ))
}

/// The first file under `dir` holding a workload value (`c<digits><marker><digits>`).
fn find_in_tree(dir: &std::path::Path, marker: &[u8], scanned: &mut u64) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            if let Some(p) = find_in_tree(&path, marker, scanned) {
                return Some(p);
            }
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        *scanned += bytes.len() as u64;
        let value_at = |i: usize| {
            i >= 2
                && bytes[i - 1].is_ascii_digit()
                && bytes[..i - 1]
                    .iter()
                    .rev()
                    .find(|b| !b.is_ascii_digit())
                    .is_some_and(|b| *b == b'c')
                && bytes.get(i + marker.len()).is_some_and(u8::is_ascii_digit)
        };
        if bytes
            .windows(marker.len())
            .enumerate()
            .any(|(i, w)| w == marker && value_at(i))
        {
            return Some(path);
        }
    }
    None
}

/// The separated deployment's part of the story: execution node 1 killed at a quarter of
/// the run, restarted at three eighths, and followed until it executed as far as the others.
#[derive(Default)]
pub(super) struct ExecStory {
    killed: Option<Instant>,
    restarted: Option<Instant>,
    caught_up: Option<(Duration, u64)>,
}

const EXEC_VICTIM: u32 = 1;

impl ExecStory {
    pub(super) async fn step(
        &mut self,
        cfg: &ClusterConfig,
        procs: &mut ReplicaProcs,
        ui: &Ui,
        elapsed: Duration,
        d: Duration,
    ) -> anyhow::Result<()> {
        if self.killed.is_none() && elapsed >= d / 4 {
            procs.kill(EXEC_VICTIM)?;
            self.killed = Some(Instant::now());
            ui.event(format!(
                "killed execution node {EXEC_VICTIM} with SIGKILL (g = 1: the other two answer)"
            ));
        }
        if self.restarted.is_none() && elapsed >= d * 3 / 8 {
            procs.start(EXEC_VICTIM)?;
            self.restarted = Some(Instant::now());
            ui.event(format!(
                "restarted execution node {EXEC_VICTIM} (from its stable checkpoint)"
            ));
        }
        if let (Some(t), None) = (self.restarted, self.caught_up) {
            let mut executed = Vec::new();
            for x in &cfg.executors {
                executed.push(
                    fetch(x.metrics_addr, POLL_TIMEOUT)
                        .await
                        .map(|s| s.last_executed)
                        .unwrap_or(0),
                );
            }
            let mine = executed[EXEC_VICTIM as usize];
            let others = executed
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != EXEC_VICTIM as usize)
                .map(|(_, e)| *e)
                .min()
                .unwrap_or(0);
            if mine > 0 && mine + cfg.protocol.checkpoint_interval >= others {
                self.caught_up = Some((t.elapsed(), mine));
                ui.event(format!(
                    "execution node {EXEC_VICTIM} caught up: executed batch {mine} (the others {others}), {:.1} s after its restart",
                    t.elapsed().as_secs_f64()
                ));
            }
        }
        Ok(())
    }

    pub(super) fn summary(&self) -> String {
        match (self.killed, self.caught_up) {
            (None, _) => "no execution node was killed".into(),
            (Some(_), Some((t, seq))) => format!(
                "node {EXEC_VICTIM} killed and restarted; caught up (batch {seq}) {:.1} s after its restart",
                t.as_secs_f64()
            ),
            (Some(_), None) => format!("node {EXEC_VICTIM} had not caught up by the end"),
        }
    }
}
