//! `redoubt monitor`: the recovery monitor of one replica host (BFT-PR §4.4), the stand-in for
//! the papers' read-only recovery monitor and watchdog timer.
//!
//! It runs the replica's key holder (on the replica's `holder_socket`), starts the replica
//! from this executable (refusing to when its BLAKE3 differs from `[recovery]
//! executable_blake3`), restarts it when it exits unexpectedly (as a recovery: a crash may be an
//! attack), and every watchdog period T_w recovers it: SIGTERM (the replica hands over if it is
//! primary, syncs its journal and state and stops), check the executable, start it again with
//! `--recover`. Replicas take turns: replica `i` recovers in the `i`-th of `n` slots of each
//! period, and waits while `f` others are still recovering (up to `stagger_wait_max_s`).
//!
//! SIGUSR1 asks for a recovery now (still waiting while `f` others recover); with `--manual`
//! that and a crash are the only triggers (benchmarks, operators who schedule recoveries
//! themselves).

use crate::cmd_keyholder::start_key_holder;
use anyhow::Context as _;
use clap::Args;
use redoubt_config::ClusterConfig;
use redoubt_localcluster::file_blake3;
use redoubt_localcluster::probe::fetch;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::process::{Child, Command};
use tracing::{error, info, warn};

#[derive(Args)]
pub struct MonitorArgs {
    /// The cluster configuration file
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// The replica to run and recover
    #[arg(long, value_name = "I")]
    id: u32,
    /// Watchdog period T_w in seconds [default: `[recovery] watchdog_period_s`]
    #[arg(long, value_name = "S")]
    watchdog_period_s: Option<u64>,
    /// No periodic watchdog: recover only on SIGUSR1 or after the replica exits unexpectedly
    /// (the watchdog period is still reported to the replica for its window of vulnerability)
    #[arg(long)]
    manual: bool,
    /// Start the replica as this user (and its primary group) instead of the monitor's: the
    /// monitor runs as root, keeps the key-holder file to itself and hands the replica only
    /// the key holder's socket
    #[arg(long, value_name = "USER")]
    replica_user: Option<String>,
}

/// A user's uid and primary gid, from the password database.
fn lookup_user(name: &str) -> anyhow::Result<(u32, u32)> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| anyhow::anyhow!("--replica-user {name:?}: not a user name"))?;
    // SAFETY: getpwnam returns null or a pointer to static storage, read at once, before any
    // other call could overwrite it (the monitor is single-threaded at this point).
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    if pw.is_null() {
        anyhow::bail!("--replica-user {name:?}: no such user");
    }
    // SAFETY: non-null, points to a valid passwd record.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok((uid, gid))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whether the executable may be started: its hash matches the configured one (or none is
/// configured). Says why not.
fn executable_ok(cfg: &ClusterConfig, exe: &Path) -> Result<(), String> {
    let want = cfg.recovery.executable_blake3.trim().to_ascii_lowercase();
    if want.is_empty() {
        return Ok(());
    }
    match file_blake3(exe) {
        Ok(h) if h == want => Ok(()),
        Ok(h) => Err(format!(
            "{} has BLAKE3 {h}, not the configured {want} ([recovery] executable_blake3): refusing to start it",
            exe.display()
        )),
        Err(e) => Err(format!("cannot read {}: {e}", exe.display())),
    }
}

/// Start of replica `id`'s next turn after `now` (ms): slot `id` of the `n` slots of a period.
pub fn next_turn(now: u64, period_ms: u64, n: u32, id: u32) -> u64 {
    let slot = (period_ms / n as u64).max(1);
    let mut k = now / slot + 1;
    while k % n as u64 != id as u64 {
        k += 1;
    }
    k * slot
}

struct Recovery {
    watchdog_at_ms: u64,
    started: Instant,
    alerted: bool,
}

struct Monitor {
    cfg: ClusterConfig,
    id: u32,
    exe: PathBuf,
    period_override_ms: Option<u64>,
    manual: bool,
    /// The replica's uid and gid when it runs as another user.
    replica_ids: Option<(u32, u32)>,
    longest_recovery_ms: u64,
    recoveries: u64,
    /// The replica's key holder, served by this process.
    holder: redoubt_node::holder::Served,
}

impl Monitor {
    fn period_ms(&self) -> u64 {
        self.period_override_ms
            .unwrap_or_else(|| self.cfg.watchdog_period_ms(self.longest_recovery_ms))
    }

    fn spawn(&self, recover: Option<(u64, u64)>) -> anyhow::Result<Child> {
        if recover.is_some() {
            // Whatever the replica had its key holder sign before this start (an attacker
            // holding it may have had recovery requests signed in advance) is of an earlier
            // epoch than what the recovering replica signs now.
            self.holder.begin_epoch();
        }
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg("replica")
            .arg("--config")
            .arg(&self.cfg.path)
            .arg("--id")
            .arg(self.id.to_string())
            .arg("--watchdog-period-ms")
            .arg(self.period_ms().to_string());
        if let Some((at, save)) = recover {
            cmd.arg("--recover")
                .arg("--watchdog-at-ms")
                .arg(at.to_string())
                .arg("--save-ms")
                .arg(save.to_string());
        }
        if let Some((uid, gid)) = self.replica_ids {
            // std drops the supplementary groups too when it changes the uid as root.
            cmd.uid(uid).gid(gid);
        }
        // The replica never outlives its monitor.
        redoubt_localcluster::procs::die_with_parent(&mut cmd);
        Ok(Command::from(cmd).kill_on_drop(true).spawn()?)
    }

    /// Starts the replica if its executable checks out; otherwise keeps checking every few
    /// seconds (the replica stays down until an operator installs the right executable).
    async fn start(&self, recover: Option<(u64, u64)>) -> anyhow::Result<Child> {
        let mut warned = false;
        loop {
            match executable_ok(&self.cfg, &self.exe) {
                Ok(()) => return self.spawn(recover),
                Err(why) => {
                    if !warned {
                        error!(replica = self.id, "{why}");
                        warned = true;
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        }
    }

    /// How many other replicas report that they are recovering.
    async fn others_recovering(&self) -> usize {
        let mut n = 0;
        for r in &self.cfg.replicas {
            if r.id == self.id {
                continue;
            }
            if let Ok(s) = fetch(r.metrics_addr, Duration::from_millis(500)).await {
                n += s.recovering as usize;
            }
        }
        n
    }
}

/// Stops the replica: SIGTERM, then SIGKILL after `grace`. Returns how long it took.
async fn stop(child: &mut Child, grace: Duration) -> Duration {
    let t = Instant::now();
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
    t.elapsed()
}

pub fn run(args: MonitorArgs) -> anyhow::Result<ExitCode> {
    let cfg = ClusterConfig::load(&args.config)?;
    let format = cfg
        .node
        .log_format
        .parse()
        .unwrap_or(redoubt_node::logging::LogFormat::Human);
    redoubt_node::logging::init(format);
    cfg.replica(args.id)?;
    let replica_ids = match &args.replica_user {
        Some(user) => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                anyhow::bail!("--replica-user needs the monitor to run as root (it starts the replica as another user)");
            }
            Some(lookup_user(user)?)
        }
        None => None,
    };
    let holder = start_key_holder(&cfg, args.id)?;
    let socket = holder.socket.clone();
    if let Some((uid, gid)) = replica_ids {
        // Only the replica's user may talk to the key holder.
        std::os::unix::fs::chown(&socket, Some(uid), Some(gid))
            .and_then(|()| {
                std::fs::set_permissions(
                    &socket,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
            })
            .with_context(|| {
                format!(
                    "cannot hand the key-holder socket {} to the replica's user",
                    socket.display()
                )
            })?;
    }
    let exe = std::env::current_exe()?;
    if let Err(why) = executable_ok(&cfg, &exe) {
        anyhow::bail!("{why}");
    }
    info!(replica = args.id, socket = %socket.display(), exe = %exe.display(), "monitor: key holder serving");
    let monitor = Monitor {
        period_override_ms: args.watchdog_period_s.map(|s| s * 1000),
        manual: args.manual,
        replica_ids,
        cfg,
        id: args.id,
        exe,
        longest_recovery_ms: 0,
        recoveries: 0,
        holder,
    };
    let rt = crate::runtime_with(1)?;
    let code = rt.block_on(supervise(monitor))?;
    let _ = std::fs::remove_file(&socket);
    Ok(code)
}

async fn supervise(mut m: Monitor) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut child = m.start(None).await?;
    let enabled = m.cfg.recovery.enabled;
    let n = m.cfg.protocol.n();
    let f = m.cfg.protocol.f as usize;
    let schedule = |m: &Monitor| {
        if m.manual {
            u64::MAX
        } else {
            next_turn(now_ms(), m.period_ms(), n, m.id)
        }
    };
    let mut turn = schedule(&m);
    let mut waiting_since: Option<Instant> = None;
    let mut pending: Option<Recovery> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let alert_ms = m.cfg.recovery.alert_after_s * 1000;
    let status_addr = m.cfg.replica(m.id)?.metrics_addr;
    if enabled && m.manual {
        info!(
            replica = m.id,
            "proactive recovery on demand: SIGUSR1 recovers this replica (no periodic watchdog)"
        );
    } else if enabled {
        info!(
            replica = m.id,
            period_s = m.period_ms() / 1000,
            first_in_s = turn.saturating_sub(now_ms()) / 1000,
            "proactive recovery on: this replica recovers once per watchdog period, in turn"
        );
    }
    enum Wake {
        Stop,
        Exited(std::io::Result<std::process::ExitStatus>),
        RecoverNow,
        Tick,
    }
    loop {
        let wake = tokio::select! {
            _ = term.recv() => Wake::Stop,
            _ = int.recv() => Wake::Stop,
            s = child.wait() => Wake::Exited(s),
            _ = usr1.recv() => Wake::RecoverNow,
            _ = tick.tick() => Wake::Tick,
        };
        match wake {
            Wake::Stop => {
                stop(&mut child, Duration::from_secs(10)).await;
                info!(replica = m.id, "monitor stopped");
                return Ok(ExitCode::SUCCESS);
            }
            Wake::Exited(status) => {
                warn!(replica = m.id, status = ?status.ok(), "replica exited unexpectedly; restarting it{}", if enabled { " with a recovery" } else { "" });
                tokio::time::sleep(Duration::from_secs(1)).await;
                let at = now_ms();
                child = m.start(enabled.then_some((at, 0))).await?;
                if enabled {
                    pending = Some(Recovery {
                        watchdog_at_ms: at,
                        started: Instant::now(),
                        alerted: false,
                    });
                }
            }
            Wake::RecoverNow => {
                if !enabled {
                    warn!(
                        replica = m.id,
                        "SIGUSR1 ignored: [recovery] enabled = false"
                    );
                } else if pending.is_some() {
                    warn!(replica = m.id, "SIGUSR1 ignored: a recovery is in progress");
                } else {
                    info!(replica = m.id, "SIGUSR1: recovering now");
                    turn = now_ms();
                }
            }
            Wake::Tick => {
                if let Some(p) = &mut pending {
                    if let Ok(s) = fetch(status_addr, Duration::from_millis(500)).await {
                        if let (false, Some(b)) = (s.recovering, s.last_recovery) {
                            m.recoveries += 1;
                            m.longest_recovery_ms = m.longest_recovery_ms.max(b.total_ms);
                            info!(
                                replica = m.id,
                                recoveries = m.recoveries,
                                total_ms = b.total_ms,
                                watchdog_at_ms = p.watchdog_at_ms,
                                period_s = m.period_ms() / 1000,
                                "recovery complete"
                            );
                            pending = None;
                            continue;
                        }
                    }
                    if !p.alerted && p.started.elapsed().as_millis() as u64 > alert_ms {
                        warn!(
                            replica = m.id,
                            after_s = alert_ms / 1000,
                            "recovery still not complete: possible attack on recovery"
                        );
                        p.alerted = true;
                    }
                    continue;
                }
                if !enabled || now_ms() < turn {
                    continue;
                }
                // At most f replicas recover at once.
                if m.others_recovering().await >= f {
                    let since = *waiting_since.get_or_insert_with(Instant::now);
                    if since.elapsed().as_secs() < m.cfg.recovery.stagger_wait_max_s {
                        continue;
                    }
                    warn!(replica = m.id, "other replicas still recovering after stagger_wait_max_s; recovering anyway");
                }
                waiting_since = None;
                let at = now_ms();
                info!(
                    replica = m.id,
                    "watchdog: recovering (save state, restart, recover)"
                );
                let saved = stop(&mut child, Duration::from_secs(30)).await;
                child = m.start(Some((at, saved.as_millis() as u64))).await?;
                pending = Some(Recovery {
                    watchdog_at_ms: at,
                    started: Instant::now(),
                    alerted: false,
                });
                turn = schedule(&m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::next_turn;

    #[test]
    fn turns_are_staggered_slots() {
        // Period 8 s, 4 replicas: slots of 2 s; replica 1 owns [2, 4) mod 8.
        assert_eq!(next_turn(0, 8000, 4, 1), 2000);
        assert_eq!(next_turn(2000, 8000, 4, 1), 10_000);
        assert_eq!(next_turn(2500, 8000, 4, 0), 8000);
        assert_eq!(next_turn(7999, 8000, 4, 3), 14_000);
    }
}
