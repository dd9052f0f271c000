//! Flame graphs of the replicas during a benchmark point (`redoubt bench micro --flamegraph`):
//! `perf record` with DWARF call graphs on every replica process at once, folded per process
//! and drawn for the busiest one (the most samples), so the report keeps a picture of where
//! its CPU went at the peak.
//!
//! Needs `perf` (Debian: `linux-perf`) and the permission to trace the replicas (root, or
//! `kernel.perf_event_paranoid` at most 1). Without them the benchmark runs on and says why
//! no flame graph was drawn.

use anyhow::Context as _;
use inferno::collapse::Collapse as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Sampling frequency (Hz): odd, so that it does not beat with the 5 ms protocol tick.
const FREQUENCY_HZ: u32 = 499;

/// A `perf record` running on a set of processes.
pub(super) struct Recording {
    child: Child,
    data: PathBuf,
    /// Replica pid -> replica id.
    names: BTreeMap<u32, u32>,
}

/// What a finished recording drew.
pub(super) struct Drawn {
    pub replica: u32,
    pub samples: u64,
    pub svg: PathBuf,
}

/// Starts `perf record` on `pids` (replica id, pid) for `seconds`; `Err` says why it cannot.
pub(super) fn start(pids: &[(u32, u32)], seconds: f64, data: &Path) -> anyhow::Result<Recording> {
    let list = pids
        .iter()
        .map(|(_, p)| p.to_string())
        .collect::<Vec<_>>()
        .join(",");
    // perf's messages go to a file, not a pipe nobody reads until it ends (a full pipe would
    // stall it).
    let log_path = data.with_extension("log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new("perf")
        .args(["record", "-q", "-F", &FREQUENCY_HZ.to_string(), "-g"])
        .args(["--call-graph", "dwarf,16384", "-p", &list, "-o"])
        .arg(data)
        .args(["--", "sleep", &format!("{seconds:.1}")])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .context("cannot run `perf` (install it, e.g. `apt-get install linux-perf`)")?;
    Ok(Recording {
        child,
        data: data.to_path_buf(),
        names: pids.iter().map(|(r, p)| (*p, *r)).collect(),
    })
}

impl Recording {
    /// Waits for the recording, folds its stacks per process and draws the busiest replica's
    /// into `svg_for(replica)`, titled `title`.
    pub(super) fn finish(
        self,
        title: &str,
        svg_for: impl Fn(u32) -> PathBuf,
    ) -> anyhow::Result<Drawn> {
        let mut child = self.child;
        let status = child.wait().context("waiting for perf record")?;
        let log_path = self.data.with_extension("log");
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let _ = std::fs::remove_file(&log_path);
        if !status.success() {
            anyhow::bail!("perf record failed ({status}): {}", log.trim());
        }
        let script = Command::new("perf")
            .args(["script", "-F", "comm,pid,tid,time,event,ip,sym,dso", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .context("running perf script")?;
        let _ = std::fs::remove_file(&self.data);
        let mut opts = inferno::collapse::perf::Options::default();
        opts.include_pid = true;
        let mut folded = Vec::new();
        inferno::collapse::perf::Folder::from(opts)
            .collapse(&script.stdout[..], &mut folded)
            .context("folding perf stacks")?;
        let folded = String::from_utf8_lossy(&folded);
        // Root frames read `comm-PID`: split the stacks by process.
        let mut per_pid: BTreeMap<u32, (u64, Vec<String>)> = BTreeMap::new();
        for line in folded.lines() {
            let Some((stack, count)) = line.rsplit_once(' ') else {
                continue;
            };
            let (root, rest) = stack.split_once(';').unwrap_or((stack, ""));
            let Some(pid) = root
                .rsplit_once('-')
                .and_then(|(_, p)| p.parse::<u32>().ok())
            else {
                continue;
            };
            let count: u64 = count.parse().unwrap_or(0);
            let e = per_pid.entry(pid).or_default();
            e.0 += count;
            e.1.push(format!("{rest} {count}"));
        }
        let Some((pid, (samples, lines))) = per_pid
            .into_iter()
            .filter(|(pid, _)| self.names.contains_key(pid))
            .max_by_key(|(_, (n, _))| *n)
        else {
            anyhow::bail!("perf recorded no samples of the replicas");
        };
        let replica = self.names[&pid];
        let svg = svg_for(replica);
        let mut fg = inferno::flamegraph::Options::default();
        fg.title = format!("{title}: replica {replica}, {samples} samples at {FREQUENCY_HZ} Hz");
        let file = std::fs::File::create(&svg)
            .with_context(|| format!("cannot create {}", svg.display()))?;
        inferno::flamegraph::from_lines(
            &mut fg,
            lines.iter().map(String::as_str),
            std::io::BufWriter::new(file),
        )
        .context("drawing the flame graph")?;
        Ok(Drawn {
            replica,
            samples,
            svg,
        })
    }
}
