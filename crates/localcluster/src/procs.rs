//! Replica processes of a local cluster: started from this very executable
//! (`redoubt replica --config FILE --id I --log-format json`), their stdout and stderr appended
//! to `DIR/replica-I.log`. Whatever happens to the parent, no replica outlives it: the drop
//! kills them, and each child asks the kernel for SIGTERM should its parent die first.

use anyhow::Context as _;
use std::fs::OpenOptions;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub struct ReplicaProcs {
    exe: PathBuf,
    config: PathBuf,
    log_dir: PathBuf,
    children: Vec<Option<Child>>,
    /// With session keys, each replica's key holder (`redoubt keyholder`), started with the
    /// replica and kept running across its restarts, like the papers' co-processor.
    holders: Vec<Option<Child>>,
    /// Sockets of the key holders (empty with static keys).
    holder_sockets: Vec<PathBuf>,
    /// Replicas, or the execution nodes of a separated deployment (`redoubt executor`, whose
    /// key holder runs in its own process), or the filter nodes of a firewall deployment.
    kind: Kind,
    /// Extra arguments of some nodes (`redoubt executor --compromised-leak` in the demo).
    extra: std::collections::BTreeMap<u32, Vec<String>>,
    /// Replicas run by another program and command (the attack harness's faulty replicas).
    programs: std::collections::BTreeMap<u32, (PathBuf, Vec<String>)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Replica,
    Executor,
    Filter,
}

/// How a replica ended when asked to stop.
pub enum Stopped {
    /// It exited by itself after SIGTERM (or earlier), with this status.
    Exited(ExitStatus),
    /// It did not exit within the grace period and was killed.
    Killed,
}

impl ReplicaProcs {
    pub fn new(exe: PathBuf, config: PathBuf, log_dir: PathBuf, n: usize) -> ReplicaProcs {
        let holder_sockets = match redoubt_config::ClusterConfig::load(&config) {
            Ok(cfg) if cfg.keys.session() => (0..n as u32)
                .filter_map(|i| cfg.holder_socket_of(i).ok())
                .collect(),
            _ => Vec::new(),
        };
        ReplicaProcs {
            exe,
            config,
            log_dir,
            children: (0..n).map(|_| None).collect(),
            holders: (0..n).map(|_| None).collect(),
            holder_sockets,
            kind: Kind::Replica,
            extra: Default::default(),
            programs: Default::default(),
        }
    }

    /// The `e` execution nodes of a separated deployment, logging to
    /// `DIR/executor-I.log`.
    pub fn executors(exe: PathBuf, config: PathBuf, log_dir: PathBuf, e: usize) -> ReplicaProcs {
        ReplicaProcs {
            exe,
            config,
            log_dir,
            children: (0..e).map(|_| None).collect(),
            holders: Vec::new(),
            holder_sockets: Vec::new(),
            kind: Kind::Executor,
            extra: Default::default(),
            programs: Default::default(),
        }
    }

    /// The `x` filter nodes of a firewall deployment, logging to `DIR/filter-I.log`.
    pub fn filters(exe: PathBuf, config: PathBuf, log_dir: PathBuf, x: usize) -> ReplicaProcs {
        let mut procs = ReplicaProcs::executors(exe, config, log_dir, x);
        procs.kind = Kind::Filter;
        procs
    }

    /// Node `id` starts with these extra arguments from now on.
    pub fn set_extra_args(&mut self, id: u32, args: Vec<String>) {
        self.extra.insert(id, args);
    }

    /// Replica `id` runs as `program <command> --config FILE --id I` from now on (its key
    /// holder is still this executable's).
    pub fn set_program(&mut self, id: u32, program: PathBuf, command: Vec<String>) {
        self.programs.insert(id, (program, command));
    }

    fn role(&self) -> &'static str {
        match self.kind {
            Kind::Replica => "replica",
            Kind::Executor => "execution node",
            Kind::Filter => "filter node",
        }
    }

    /// Starts replica `id`'s key holder if it uses one and it is not running, and waits for its
    /// socket.
    fn ensure_holder(&mut self, id: u32) -> anyhow::Result<()> {
        let Some(socket) = self.holder_sockets.get(id as usize).cloned() else {
            return Ok(());
        };
        if let Some(Some(h)) = self.holders.get_mut(id as usize) {
            if h.try_wait().ok().flatten().is_none() {
                return Ok(());
            }
        }
        let _ = std::fs::remove_file(&socket);
        let log = self.log_dir.join(format!("keyholder-{id}.log"));
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open the log file {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("keyholder")
            .arg("--config")
            .arg(&self.config)
            .arg("--id")
            .arg(id.to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start the key holder of replica {id}"))?;
        self.holders[id as usize] = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "the key holder of replica {id} did not open {} (see {})",
                    socket.display(),
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    pub fn log_path(&self, id: u32) -> PathBuf {
        let name = match self.kind {
            Kind::Replica => "replica",
            Kind::Executor => "executor",
            Kind::Filter => "filter",
        };
        self.log_dir.join(format!("{name}-{id}.log"))
    }

    /// Starts replica `id` (its log is appended to, so a restart keeps the earlier lines).
    pub fn start(&mut self, id: u32) -> anyhow::Result<()> {
        let extra = self.extra.get(&id).cloned().unwrap_or_default();
        match self.kind {
            Kind::Executor => return self.spawn(id, &["executor".into()], &extra),
            Kind::Filter => return self.spawn(id, &["filter".into()], &extra),
            Kind::Replica => {}
        }
        self.ensure_holder(id)?;
        if let Some((program, command)) = self.programs.get(&id).cloned() {
            let exe = std::mem::replace(&mut self.exe, program);
            let spawned = self.spawn(id, &command, &extra);
            self.exe = exe;
            return spawned;
        }
        self.spawn(
            id,
            &["replica".into()],
            &["--log-format".into(), "json".into()],
        )
    }

    /// Starts replica `id` under `redoubt monitor` (which runs its key holder and restarts it
    /// for recoveries), with `extra` monitor arguments; both log to the replica's log.
    pub fn start_monitor(&mut self, id: u32, extra: &[String]) -> anyhow::Result<()> {
        self.spawn(id, &["monitor".into()], extra)
    }

    /// Sends `signal` to replica `id`'s process (the monitor, if it runs under one).
    pub fn signal(&self, id: u32, signal: libc::c_int) -> anyhow::Result<()> {
        let child = self
            .children
            .get(id as usize)
            .and_then(Option::as_ref)
            .with_context(|| format!("replica {id} is not running"))?;
        // SAFETY: kill(2) on the pid of a child we have not reaped yet.
        if unsafe { libc::kill(child.id() as libc::pid_t, signal) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot signal replica {id} (pid {})", child.id()));
        }
        Ok(())
    }

    /// `redoubt <command> --config <config> --id <id> <extra>`, output appended to the log.
    fn spawn(&mut self, id: u32, command: &[String], extra: &[String]) -> anyhow::Result<()> {
        let log = self.log_path(id);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open the log file {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("cannot open the log file {}", log.display()))?;
        let mut cmd = Command::new(&self.exe);
        cmd.args(command)
            .arg("--config")
            .arg(&self.config)
            .arg("--id")
            .arg(id.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        die_with_parent(&mut cmd);
        let role = self.role();
        let child = cmd.spawn().with_context(|| {
            format!(
                "cannot start {role} {id} ({} {} --config {} --id {id})",
                self.exe.display(),
                command.join(" "),
                self.config.display()
            )
        })?;
        if let Some(slot) = self.children.get_mut(id as usize) {
            if let Some(mut old) = slot.replace(child) {
                let _ = old.kill();
                let _ = old.wait();
            }
        }
        Ok(())
    }

    /// Kills replica `id` with SIGKILL (no chance to clean up) and reaps it.
    pub fn kill(&mut self, id: u32) -> anyhow::Result<()> {
        if let Some(mut child) = self.children.get_mut(id as usize).and_then(Option::take) {
            child
                .kill()
                .with_context(|| format!("cannot kill replica {id} (pid {})", child.id()))?;
            let _ = child.wait();
        }
        Ok(())
    }

    /// Process id of replica `id`, if it is running.
    pub fn pid(&self, id: u32) -> Option<u32> {
        Some(self.children.get(id as usize)?.as_ref()?.id())
    }

    /// If replica `id` was started and has exited since, its exit status (the slot is freed).
    pub fn exited(&mut self, id: u32) -> Option<ExitStatus> {
        let slot = self.children.get_mut(id as usize)?;
        let status = slot.as_mut()?.try_wait().ok().flatten()?;
        *slot = None;
        Some(status)
    }

    /// SIGTERM to every running replica; those still running after `grace` get SIGKILL.
    pub fn stop_all(&mut self, grace: Duration) -> Vec<(u32, Stopped)> {
        for child in self.children.iter().flatten() {
            // SAFETY: kill(2) on the pid of a child we have not reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        let mut out = Vec::new();
        loop {
            for (id, slot) in self.children.iter_mut().enumerate() {
                if let Some(child) = slot {
                    if let Ok(Some(status)) = child.try_wait() {
                        out.push((id as u32, Stopped::Exited(status)));
                        *slot = None;
                    }
                }
            }
            if self.children.iter().all(Option::is_none) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for (id, slot) in self.children.iter_mut().enumerate() {
            if let Some(mut child) = slot.take() {
                let _ = child.kill();
                let _ = child.wait();
                out.push((id as u32, Stopped::Killed));
            }
        }
        out.sort_by_key(|(id, _)| *id);
        for mut h in self.holders.iter_mut().filter_map(Option::take) {
            let _ = h.kill();
            let _ = h.wait();
        }
        out
    }
}

impl Drop for ReplicaProcs {
    fn drop(&mut self) {
        for mut child in self
            .children
            .iter_mut()
            .chain(self.holders.iter_mut())
            .filter_map(Option::take)
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The directory a local cluster lives in: `keep` if given (kept afterwards), else a new
/// temporary directory named `prefix...`, removed when the returned guard is dropped.
pub fn work_dir(
    keep: Option<&Path>,
    prefix: &str,
) -> anyhow::Result<(Option<tempfile::TempDir>, PathBuf)> {
    Ok(match keep {
        Some(d) => (None, d.to_path_buf()),
        None => {
            let t = tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .context("cannot create a temporary directory for the cluster")?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    })
}

/// Asks the kernel to send the child SIGTERM when this process dies, and refuses to start it
/// if this process is already gone.
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::other("the parent process is gone"));
            }
            Ok(())
        });
    }
}

/// The last `lines` lines of a replica log, JSON lines rendered as `LEVEL message key=value`.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| format!("    {}", render_log_line(l)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn render_log_line(line: &str) -> String {
    let Ok(serde_json::Value::Object(obj)) = serde_json::from_str::<serde_json::Value>(line) else {
        return line.to_string();
    };
    let level = obj.get("level").and_then(|v| v.as_str()).unwrap_or("");
    let mut out = level.to_string();
    if let Some(serde_json::Value::Object(fields)) = obj.get("fields") {
        if let Some(m) = fields.get("message").and_then(|v| v.as_str()) {
            out.push(' ');
            out.push_str(m);
        }
        for (k, v) in fields.iter().filter(|(k, _)| *k != "message") {
            match v {
                serde_json::Value::String(s) => out.push_str(&format!(" {k}={s}")),
                other => out.push_str(&format!(" {k}={other}")),
            }
        }
    }
    out
}
