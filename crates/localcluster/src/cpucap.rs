//! CPU caps for benchmark server processes (`redoubt bench micro --server-cpu`): each capped
//! process gets a control group of its own with a CFS bandwidth quota, so that every server,
//! the baseline's one and each of redoubt's replicas alike, has the same CPU to spend, as if it
//! ran on a machine of its own; the benchmark's clients stay uncapped.
//!
//! Works with the cgroup v1 `cpu` controller (`/sys/fs/cgroup/cpu`) and with cgroup v2 when
//! its root offers the `cpu` controller (`/sys/fs/cgroup/cgroup.controllers`). Needs root (or a
//! delegated hierarchy); the groups are removed again when the caps are dropped, after the
//! processes in them have exited.

use anyhow::Context as _;
use std::path::{Path, PathBuf};

/// The CFS period of every group (µs): short, so that a throttled server waits at most this
/// long for its next share instead of the default 100 ms.
pub const PERIOD_US: u64 = 10_000;
/// The smallest quota the kernel accepts (µs).
const QUOTA_MIN_US: u64 = 1_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A parent group holding one capped group per server process.
pub struct CpuCaps {
    version: Version,
    parent: PathBuf,
    quota_us: u64,
    groups: Vec<PathBuf>,
}

impl CpuCaps {
    /// Prepares caps of `cores` CPU cores per process (0.1 at least).
    pub fn new(cores: f64) -> anyhow::Result<CpuCaps> {
        anyhow::ensure!(
            cores.is_finite() && cores > 0.0,
            "--server-cpu must be a positive number of cores, e.g. 0.25"
        );
        let quota_us = (cores * PERIOD_US as f64).round() as u64;
        anyhow::ensure!(
            quota_us >= QUOTA_MIN_US,
            "--server-cpu {cores}: at least {} cores (the kernel's smallest quota)",
            QUOTA_MIN_US as f64 / PERIOD_US as f64
        );
        let v2_root = Path::new("/sys/fs/cgroup");
        let v1_root = Path::new("/sys/fs/cgroup/cpu");
        let name = format!("redoubt-bench-{}", std::process::id());
        let (version, parent) = if v1_root.join("cpu.cfs_quota_us").exists() {
            (Version::V1, v1_root.join(name))
        } else if std::fs::read_to_string(v2_root.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu"))
        {
            (Version::V2, v2_root.join(name))
        } else {
            anyhow::bail!(
                "--server-cpu needs the cgroup cpu controller: neither /sys/fs/cgroup/cpu (v1) nor a cgroup v2 root offering \"cpu\" is mounted here"
            );
        };
        if version == Version::V2 {
            // The root must hand the cpu controller down to our group, and our group to its
            // children (it holds no process itself, as v2 requires).
            write(&v2_root.join("cgroup.subtree_control"), "+cpu")?;
        }
        std::fs::create_dir(&parent).with_context(|| {
            format!(
                "cannot create the control group {} (--server-cpu needs root or a delegated cgroup)",
                parent.display()
            )
        })?;
        let caps = CpuCaps {
            version,
            parent,
            quota_us,
            groups: Vec::new(),
        };
        if version == Version::V2 {
            write(&caps.parent.join("cgroup.subtree_control"), "+cpu")?;
        }
        Ok(caps)
    }

    /// The cap in cores, as configured.
    pub fn cores(&self) -> f64 {
        self.quota_us as f64 / PERIOD_US as f64
    }

    /// Moves process `pid` (all its threads, and the children it starts later) into a capped
    /// group of its own named `name`.
    pub fn cap(&mut self, name: &str, pid: u32) -> anyhow::Result<()> {
        let group = self.parent.join(name);
        std::fs::create_dir(&group)
            .with_context(|| format!("cannot create the control group {}", group.display()))?;
        self.groups.push(group.clone());
        match self.version {
            Version::V1 => {
                write(&group.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                write(&group.join("cpu.cfs_quota_us"), &self.quota_us.to_string())?;
            }
            Version::V2 => write(
                &group.join("cpu.max"),
                &format!("{} {PERIOD_US}", self.quota_us),
            )?,
        }
        write(&group.join("cgroup.procs"), &pid.to_string())
    }

    /// Moves process `pid` into the capped group `name` made by [`CpuCaps::cap`] before, so
    /// that the processes in it share one cap (as if on one machine).
    pub fn join(&mut self, name: &str, pid: u32) -> anyhow::Result<()> {
        let group = self.parent.join(name);
        anyhow::ensure!(
            self.groups.contains(&group),
            "no control group {name} to join"
        );
        write(&group.join("cgroup.procs"), &pid.to_string())
    }

    /// Periods in which a capped process had used up its quota and waited, over all groups
    /// (from each group's `cpu.stat`).
    pub fn throttled_periods(&self) -> u64 {
        self.groups
            .iter()
            .filter_map(|g| std::fs::read_to_string(g.join("cpu.stat")).ok())
            .filter_map(|stat| {
                stat.lines()
                    .find_map(|l| l.strip_prefix("nr_throttled "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .sum()
    }
}

impl Drop for CpuCaps {
    /// Removes the groups (the processes in them have been stopped by then; a group that
    /// still holds one is left behind and named).
    fn drop(&mut self) {
        for g in self.groups.iter().chain(std::iter::once(&self.parent)) {
            if let Err(e) = std::fs::remove_dir(g) {
                eprintln!("warning: cannot remove control group {}: {e}", g.display());
            }
        }
    }
}

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    std::fs::write(path, value)
        .with_context(|| format!("cannot write {value} to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_below_the_kernel_minimum_or_not_positive_are_refused() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 0.05] {
            let err = CpuCaps::new(bad).err().expect("refused");
            assert!(err.to_string().contains("--server-cpu"), "{err}");
        }
    }
}
