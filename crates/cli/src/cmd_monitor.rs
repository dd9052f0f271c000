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
//!
//! The pin is re-read from the cluster file before every start and on SIGHUP. A replica whose
//! executable is not the pinned one is held down, not given up: the monitor says why on the
//! replica's metrics address (`/status` and `/healthz` answer 503 with the reason;
//! `redoubt_replica_held_down` on `/metrics`), checks again every few seconds and at once on
//! SIGHUP, and still honours SIGTERM and SIGINT. SIGHUP after `redoubt pin` restarts a replica
//! that runs another executable on the pinned one, as a recovery (a rolling upgrade).

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

/// Whether the executable at `exe` may be started under `pin` (empty: anything may): its
/// BLAKE3 hash if so, why not otherwise.
fn executable_ok(pin: &str, exe: &Path) -> Result<String, String> {
    let want = pin.trim().to_ascii_lowercase();
    match file_blake3(exe) {
        Ok(h) if want.is_empty() || h == want => Ok(h),
        Ok(h) => Err(format!(
            "{} has BLAKE3 {h}, not the pinned {want} ([recovery] executable_blake3): pin it with `redoubt pin` and send this monitor SIGHUP, or install the pinned executable",
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

impl Recovery {
    /// A recovery the watchdog (or a crash, or an upgrade) started at `at` (ms).
    fn at(at: u64) -> Recovery {
        Recovery {
            watchdog_at_ms: at,
            started: Instant::now(),
            alerted: false,
        }
    }
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
    /// `[recovery] executable_blake3` as last read from the cluster file.
    pin: String,
    /// BLAKE3 of the executable the running replica was started from.
    running: Option<String>,
}

/// The replica held down because it may not be started (its executable is not the pinned
/// one): why, the stand-in answering on its metrics address, when to check again, and
/// whether to start it recovering.
struct Held {
    reason: String,
    stand_in: Option<tokio::task::JoinHandle<()>>,
    retry_at: Instant,
    recover: bool,
}

/// How often a held-down replica's executable and pin are checked again.
const HELD_RETRY: Duration = Duration::from_secs(5);

impl Monitor {
    fn period_ms(&self) -> u64 {
        self.period_override_ms
            .unwrap_or_else(|| self.cfg.watchdog_period_ms(self.longest_recovery_ms))
    }

    fn spawn(&self, recover: Option<(u64, u64)>) -> std::io::Result<Child> {
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
        Command::from(cmd).kill_on_drop(true).spawn()
    }

    /// Re-reads the pin from the cluster file (keeping the one it has if the file does not
    /// load, with a warning).
    fn reload_pin(&mut self) {
        match ClusterConfig::load(&self.cfg.path) {
            Ok(c) if c.recovery.executable_blake3 != self.pin => {
                info!(replica = self.id, pin = %c.recovery.executable_blake3, was = %self.pin, "new executable pin");
                self.pin = c.recovery.executable_blake3;
            }
            Ok(_) => {}
            Err(e) => warn!(
                replica = self.id,
                "cannot re-read the pin, keeping {}: {e}", self.pin
            ),
        }
    }

    /// Starts the replica if its executable is the pinned one (the pin re-read first); why
    /// not otherwise.
    fn start(&mut self, recover: Option<(u64, u64)>) -> Result<Child, String> {
        self.reload_pin();
        let hash = executable_ok(&self.pin, &self.exe)?;
        let child = self
            .spawn(recover)
            .map_err(|e| format!("cannot start {}: {e}", self.exe.display()))?;
        self.running = Some(hash);
        Ok(child)
    }

    /// Whether the running replica's executable is not the pinned one.
    fn runs_unpinned(&self) -> bool {
        !self.pin.is_empty()
            && self
                .running
                .as_deref()
                .is_some_and(|h| !h.eq_ignore_ascii_case(self.pin.trim()))
    }

    /// Holds the replica down for `reason`: logs it and answers on its metrics address.
    async fn hold(&self, reason: String, recover: bool) -> Held {
        error!(replica = self.id, "replica held down: {reason}");
        let addr = self.cfg.replica(self.id).map(|r| r.metrics_addr);
        let stand_in = match addr {
            Ok(addr) => match redoubt_node::metrics::serve_held_down(
                addr,
                self.id,
                "executable_not_pinned",
                reason.clone(),
            )
            .await
            {
                Ok(h) => Some(h),
                Err(e) => {
                    warn!(replica = self.id, %addr, "cannot say why on the metrics address: {e}");
                    None
                }
            },
            Err(_) => None,
        };
        Held {
            reason,
            stand_in,
            retry_at: Instant::now() + HELD_RETRY,
            recover,
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
    info!(replica = args.id, socket = %socket.display(), exe = %exe.display(), "monitor: key holder serving");
    let monitor = Monitor {
        period_override_ms: args.watchdog_period_s.map(|s| s * 1000),
        manual: args.manual,
        replica_ids,
        pin: cfg.recovery.executable_blake3.clone(),
        cfg,
        id: args.id,
        exe,
        longest_recovery_ms: 0,
        recoveries: 0,
        holder,
        running: None,
    };
    let code = crate::runtime_with(1).and_then(|rt| rt.block_on(supervise(monitor)));
    // The key holder's socket goes whatever the way out.
    let _ = std::fs::remove_file(&socket);
    code
}

/// The replica's process: running, or held down (with why).
enum Replica {
    Running(Child),
    Held(Held),
}

impl Replica {
    /// Waits for the running replica to exit (never, when held down).
    async fn exited(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Replica::Running(c) => c.wait().await,
            Replica::Held(_) => std::future::pending().await,
        }
    }
}

/// Starts the replica, or holds it down saying why.
async fn launch(m: &mut Monitor, recover: Option<(u64, u64)>) -> Replica {
    match m.start(recover) {
        Ok(child) => Replica::Running(child),
        Err(why) => Replica::Held(m.hold(why, recover.is_some()).await),
    }
}

async fn supervise(mut m: Monitor) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut replica = launch(&mut m, None).await;
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
    // SIGHUP found the replica on another executable than the pinned one.
    let mut upgrade = false;
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
        Reload,
        Tick,
    }
    loop {
        let wake = tokio::select! {
            _ = term.recv() => Wake::Stop,
            _ = int.recv() => Wake::Stop,
            s = replica.exited() => Wake::Exited(s),
            _ = usr1.recv() => Wake::RecoverNow,
            _ = hup.recv() => Wake::Reload,
            _ = tick.tick() => Wake::Tick,
        };
        match wake {
            Wake::Stop => {
                match &mut replica {
                    Replica::Running(child) => {
                        stop(child, Duration::from_secs(10)).await;
                    }
                    Replica::Held(h) => {
                        if let Some(s) = h.stand_in.take() {
                            s.abort();
                        }
                    }
                }
                info!(replica = m.id, "monitor stopped");
                return Ok(ExitCode::SUCCESS);
            }
            Wake::Exited(status) => {
                warn!(replica = m.id, status = ?status.ok(), "replica exited unexpectedly; restarting it{}", if enabled { " with a recovery" } else { "" });
                tokio::time::sleep(Duration::from_secs(1)).await;
                let at = now_ms();
                replica = launch(&mut m, enabled.then_some((at, 0))).await;
                if enabled && matches!(replica, Replica::Running(_)) {
                    pending = Some(Recovery::at(at));
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
                } else if let Replica::Held(h) = &replica {
                    warn!(
                        replica = m.id,
                        "SIGUSR1 ignored: the replica is held down ({})", h.reason
                    );
                } else {
                    info!(replica = m.id, "SIGUSR1: recovering now");
                    turn = now_ms();
                }
            }
            Wake::Reload => {
                m.reload_pin();
                match &mut replica {
                    Replica::Held(h) => {
                        info!(replica = m.id, "SIGHUP: checking the executable again");
                        h.retry_at = Instant::now();
                    }
                    Replica::Running(_) if m.runs_unpinned() => {
                        info!(
                            replica = m.id,
                            running = m.running.as_deref().unwrap_or_default(),
                            pin = %m.pin,
                            "SIGHUP: the replica runs another executable than the pinned one; restarting it on the pinned one (after the f others that may be recovering)"
                        );
                        upgrade = true;
                    }
                    Replica::Running(_) => {
                        info!(
                            replica = m.id,
                            "SIGHUP: pin re-read; the replica runs the pinned executable"
                        );
                    }
                }
            }
            Wake::Tick => {
                if let Replica::Held(h) = &mut replica {
                    if Instant::now() < h.retry_at {
                        continue;
                    }
                    m.reload_pin();
                    match executable_ok(&m.pin, &m.exe) {
                        Err(why) => {
                            if why != h.reason {
                                error!(replica = m.id, "replica held down: {why}");
                                h.reason = why;
                            }
                            h.retry_at = Instant::now() + HELD_RETRY;
                            continue;
                        }
                        Ok(_) => {
                            // The stand-in leaves the metrics address to the replica.
                            if let Some(s) = h.stand_in.take() {
                                s.abort();
                                let _ = s.await;
                            }
                            let recover = h.recover && enabled;
                            info!(
                                replica = m.id,
                                "the executable is the pinned one: starting the replica"
                            );
                            let at = now_ms();
                            replica = launch(&mut m, recover.then_some((at, 0))).await;
                            if recover && matches!(replica, Replica::Running(_)) {
                                pending = Some(Recovery::at(at));
                            }
                            continue;
                        }
                    }
                }
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
                if !upgrade && (!enabled || now_ms() < turn) {
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
                    "{}: recovering (save state, restart, recover)",
                    if upgrade { "upgrade" } else { "watchdog" }
                );
                upgrade = false;
                let Replica::Running(child) = &mut replica else {
                    continue;
                };
                let saved = stop(child, Duration::from_secs(30)).await;
                let recover = enabled.then_some((at, saved.as_millis() as u64));
                replica = launch(&mut m, recover).await;
                if enabled && matches!(replica, Replica::Running(_)) {
                    pending = Some(Recovery::at(at));
                }
                if enabled {
                    turn = schedule(&m);
                }
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
