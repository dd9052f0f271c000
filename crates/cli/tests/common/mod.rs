//! Shared by the process-level tests: the real `redoubt` binary, free ports, and a local
//! cluster of replica processes that is killed when dropped.

#![allow(dead_code)] // each test file uses a different part

use redoubt_client::ClientSetup;
use redoubt_config::ClusterConfig;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `redoubt` binary built for these tests.
pub fn redoubt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_redoubt"))
}

/// Runs `redoubt init` into `dir` with free ports; returns the config path.
pub fn init(dir: &Path, replicas: u32, clients: u32) -> PathBuf {
    init_with(dir, replicas, clients, &[])
}

/// [`init`] with extra `redoubt init` arguments (e.g. `--static-keys`).
pub fn init_with(dir: &Path, replicas: u32, clients: u32, extra: &[&str]) -> PathBuf {
    // Execution nodes (`--execution M`) take ports after the replicas'.
    let executors: u32 = extra
        .iter()
        .position(|a| *a == "--execution")
        .and_then(|i| extra.get(i + 1)?.parse().ok())
        .unwrap_or(0);
    // Filters (`--firewall H`, (H+1)² of them) after the execution nodes'.
    let filters: u32 = extra
        .iter()
        .position(|a| *a == "--firewall")
        .and_then(|i| extra.get(i + 1)?.parse::<u32>().ok())
        .map_or(0, |h| (h + 1) * (h + 1));
    let base = redoubt_node::init::free_base_port((replicas + executors + filters) as u16)
        .expect("free ports");
    let out = redoubt()
        .args(["init", "--replicas", &replicas.to_string()])
        .args(extra)
        .args(["--clients", &clients.to_string()])
        .args(["--base-port", &base.to_string()])
        .arg("--out")
        .arg(dir)
        .output()
        .expect("run redoubt init");
    assert!(
        out.status.success(),
        "redoubt init failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("redoubt.toml")
}

/// Runs `cmd` to completion within `limit`, asserts it exited 0 (showing its output if not),
/// and returns its stdout.
pub fn stdout_of_success(cmd: Command, limit: Duration) -> String {
    let out = output_within(cmd, limit);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// Runs a command to completion, killing it if it takes longer than `limit`.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "command still running after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET path` over HTTP/1.1; the body of a 200 response.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&buf).to_string();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("no HTTP head in {text:?}"))?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("not 200: {head}"));
        }
        Ok(body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .map_err(|_| "timeout".to_string())?
}

/// A replica's `/status` as JSON.
pub async fn status(addr: SocketAddr) -> Result<serde_json::Value, String> {
    let body = http_get(addr, "/status").await?;
    serde_json::from_str(&body).map_err(|e| e.to_string())
}

/// A cluster of `redoubt replica` processes in a temporary directory; killed on drop.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub cfg: ClusterConfig,
    children: Vec<Option<Child>>,
    /// Key holders (`redoubt keyholder`), when replicas run without monitors.
    holders: Vec<Child>,
    /// `children` are `redoubt monitor` processes (each runs its key holder and replica).
    monitored: bool,
    /// Separated deployment: the `redoubt executor` processes.
    executors: Vec<Option<Child>>,
    /// Firewall deployment: the `redoubt filter` processes.
    filters: Vec<Option<Child>>,
    /// The `redoubt` executable the processes run: the test build's, or a copy a test put at
    /// `<dir>/bin/redoubt` (in `prepare`) to replace it under running monitors.
    program: PathBuf,
}

impl Cluster {
    /// `redoubt init` with free ports, every replica started, all answering `/status` in the
    /// same view.
    pub async fn start(clients: u32) -> Cluster {
        Cluster::start_init(&[], clients).await
    }

    /// [`Cluster::start`] with extra `redoubt init` arguments (e.g. `--service sql`).
    pub async fn start_init(init_extra: &[&str], clients: u32) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = init_with(dir.path(), 4, clients, init_extra);
        let mut c = Cluster::new(dir, config, false);
        for i in 0..c.children.len() as u32 {
            c.spawn_holder(i);
        }
        for i in 0..c.children.len() as u32 {
            c.spawn(i);
        }
        c.wait_up().await;
        c
    }

    /// Like [`Cluster::start`], but every replica runs under `redoubt monitor` with proactive
    /// recovery every `period_s` seconds; `edit` may change the config text first.
    pub async fn start_monitored(
        clients: u32,
        period_s: u64,
        edit: impl Fn(String) -> String,
    ) -> Cluster {
        Cluster::start_monitored_with(clients, period_s, edit, &[], |_| {}).await
    }

    /// [`Cluster::start_monitored`] with extra `redoubt monitor` arguments, and `prepare`
    /// called with the cluster directory before the monitors start.
    pub async fn start_monitored_with(
        clients: u32,
        period_s: u64,
        edit: impl Fn(String) -> String,
        extra: &[&str],
        prepare: impl FnOnce(&Path),
    ) -> Cluster {
        Cluster::start_monitored_init(&[], clients, period_s, edit, extra, prepare).await
    }

    /// [`Cluster::start_monitored_with`] with extra `redoubt init` arguments (e.g.
    /// `--ordering prime`).
    pub async fn start_monitored_init(
        init_extra: &[&str],
        clients: u32,
        period_s: u64,
        edit: impl Fn(String) -> String,
        extra: &[&str],
        prepare: impl FnOnce(&Path),
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = init_with(dir.path(), 4, clients, init_extra);
        let text = std::fs::read_to_string(&config).expect("config");
        let text = text.replace(
            "\nwatchdog_period_s = 0\n",
            &format!("\nwatchdog_period_s = {period_s}\n"),
        );
        std::fs::write(&config, edit(text)).expect("config");
        prepare(dir.path());
        let mut c = Cluster::new(dir, config, true);
        let mut args = vec!["monitor"];
        args.extend_from_slice(extra);
        for i in 0..c.children.len() as u32 {
            let child = c.spawn_logged(&args, i, c.log_path(i));
            c.children[i as usize] = Some(child);
        }
        c.wait_up().await;
        c
    }

    fn new(dir: tempfile::TempDir, config: PathBuf, monitored: bool) -> Cluster {
        let cfg = ClusterConfig::load(&config).expect("config loads");
        let n = cfg.replicas.len();
        let copy = dir.path().join("bin").join("redoubt");
        let program = if copy.exists() {
            copy
        } else {
            PathBuf::from(env!("CARGO_BIN_EXE_redoubt"))
        };
        Cluster {
            program,
            dir,
            config,
            cfg,
            children: (0..n).map(|_| None).collect(),
            holders: Vec::new(),
            monitored,
            executors: Vec::new(),
            filters: Vec::new(),
        }
    }

    /// A separated deployment: `redoubt init --execution <executors>` with free ports,
    /// every execution node and replica started (replicas with their key holders), all
    /// replicas answering `/status` in the same view.
    pub async fn start_separated(clients: u32, executors: u32) -> Cluster {
        Cluster::start_init_separated(&[], clients, executors).await
    }

    /// [`Cluster::start_separated`] with extra `redoubt init` arguments.
    pub async fn start_init_separated(extra: &[&str], clients: u32, executors: u32) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let executors_arg = executors.to_string();
        let mut args = vec!["--execution", executors_arg.as_str()];
        args.extend_from_slice(extra);
        let config = init_with(dir.path(), 4, clients, &args);
        let mut c = Cluster::new(dir, config, false);
        c.executors = (0..executors).map(|_| None).collect();
        for e in 0..executors {
            c.spawn_executor(e);
        }
        for i in 0..c.children.len() as u32 {
            c.spawn_holder(i);
        }
        for i in 0..c.children.len() as u32 {
            c.spawn(i);
        }
        c.wait_up().await;
        c
    }

    /// Like [`Cluster::start_separated`], behind a privacy firewall of (h+1)² filter nodes
    /// (`redoubt init --firewall h`), each started.
    pub async fn start_firewall(clients: u32, executors: u32, h: u32) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = init_with(
            dir.path(),
            4,
            clients,
            &[
                "--execution",
                &executors.to_string(),
                "--firewall",
                &h.to_string(),
            ],
        );
        let mut c = Cluster::new(dir, config, false);
        c.filters = (0..(h + 1) * (h + 1)).map(|_| None).collect();
        for x in 0..c.filters.len() as u32 {
            c.spawn_filter(x);
        }
        c.executors = (0..executors).map(|_| None).collect();
        for e in 0..executors {
            c.spawn_executor(e);
        }
        for i in 0..c.children.len() as u32 {
            c.spawn_holder(i);
        }
        for i in 0..c.children.len() as u32 {
            c.spawn(i);
        }
        c.wait_up().await;
        c
    }

    /// Starts filter node `id` (appending to its log).
    pub fn spawn_filter(&mut self, id: u32) {
        let log = self.dir.path().join(format!("filter-{id}.log"));
        let child = self.spawn_logged(&["filter"], id, log);
        self.filters[id as usize] = Some(child);
    }

    /// SIGKILL to filter node `id`.
    pub fn kill_filter(&mut self, id: u32) {
        if let Some(mut c) = self.filters[id as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn executor_log_path(&self, id: u32) -> PathBuf {
        self.dir.path().join(format!("executor-{id}.log"))
    }

    /// Starts execution node `id` (appending to its log).
    pub fn spawn_executor(&mut self, id: u32) {
        self.spawn_executor_with(id, &[]);
    }

    /// Starts execution node `id` with extra arguments.
    pub fn spawn_executor_with(&mut self, id: u32, extra: &[&str]) {
        let mut args = vec!["executor"];
        args.extend_from_slice(extra);
        let child = self.spawn_logged(&args, id, self.executor_log_path(id));
        self.executors[id as usize] = Some(child);
    }

    /// SIGKILL to execution node `id`.
    pub fn kill_executor(&mut self, id: u32) {
        if let Some(mut c) = self.executors[id as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `redoubt <args> --config <config> --id <id>`, its output appended to `log`.
    fn spawn_logged(&self, args: &[&str], id: u32, log: PathBuf) -> Child {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        Command::new(&self.program)
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .args(["--id", &id.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn redoubt {args:?}: {e}"))
    }

    /// Starts replica `id`'s key holder (session keys) and waits for its socket.
    fn spawn_holder(&mut self, id: u32) {
        if !self.cfg.keys.session() {
            return;
        }
        let socket = self.cfg.holder_socket_of(id).expect("socket path");
        let log = self.dir.path().join(format!("keyholder-{id}.log"));
        let child = self.spawn_logged(&["keyholder"], id, log);
        self.holders.push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "key holder {id} did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Pid of replica `id`'s process (its monitor's when monitored).
    pub fn pid(&self, id: u32) -> Option<u32> {
        self.children[id as usize].as_ref().map(Child::id)
    }

    pub fn config_path(&self) -> &Path {
        &self.config
    }

    pub fn log_path(&self, id: u32) -> PathBuf {
        self.dir.path().join(format!("replica-{id}.log"))
    }

    /// Starts replica `id` (appending to its log).
    pub fn spawn(&mut self, id: u32) {
        let child = self.spawn_logged(&["replica", "--log-format", "json"], id, self.log_path(id));
        self.children[id as usize] = Some(child);
    }

    /// SIGKILL to replica `id`.
    pub fn kill(&mut self, id: u32) {
        if let Some(mut c) = self.children[id as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn kill_all(&mut self) {
        for i in 0..self.children.len() as u32 {
            self.kill(i);
        }
    }

    /// SIGTERM to every monitor (or replica), waiting for them to exit.
    pub fn stop_all(&mut self) {
        for c in self.children.iter().flatten() {
            // SAFETY: kill(2) on a child we have not reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        for c in self.children.iter_mut() {
            if let Some(mut child) = c.take() {
                let deadline = Instant::now() + Duration::from_secs(15);
                while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Waits (at most 30 s) until every replica answers `/status` and all are in normal
    /// operation in the same view.
    pub async fn wait_up(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for (i, c) in self.children.iter_mut().enumerate() {
                if let Some(child) = c {
                    if let Ok(Some(st)) = child.try_wait() {
                        panic!(
                            "replica {i} exited ({st}):\n{}",
                            std::fs::read_to_string(
                                self.dir.path().join(format!("replica-{i}.log"))
                            )
                            .unwrap_or_default()
                        );
                    }
                }
            }
            let mut views = Vec::new();
            for r in &self.cfg.replicas {
                match status(r.metrics_addr).await {
                    Ok(s) if s["normal"] == true => views.push(s["view"].as_u64()),
                    _ => break,
                }
            }
            if views.len() == self.cfg.replicas.len() && views.windows(2).all(|w| w[0] == w[1]) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not come up within 30 s; logs in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every reachable replica's status.
    pub async fn statuses(&self) -> Vec<Option<serde_json::Value>> {
        let mut out = Vec::new();
        for r in &self.cfg.replicas {
            out.push(status(r.metrics_addr).await.ok());
        }
        out
    }

    /// The primary most replicas in normal operation agree on.
    pub async fn primary(&self) -> u32 {
        let mut votes = std::collections::BTreeMap::<u64, usize>::new();
        for s in self.statuses().await.into_iter().flatten() {
            if s["normal"] == true {
                *votes.entry(s["primary"].as_u64().unwrap()).or_default() += 1;
            }
        }
        votes
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(p, _)| p as u32)
            .expect("no replica in normal operation")
    }

    /// A client setup for client `c`, with a short deadline.
    pub fn client_setup(&self, c: u64, deadline: Duration) -> ClientSetup {
        ClientSetup {
            deadline,
            ..ClientSetup::from_cluster(&self.cfg, c).expect("client setup")
        }
    }

    /// Keeps the directory (for a failing test's logs) and returns its path.
    pub fn logs_hint(&self) -> String {
        format!("replica logs: {}/replica-*.log", self.dir.path().display())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.monitored {
            // Monitors stop their replicas on SIGTERM.
            self.stop_all();
        }
        self.kill_all();
        for e in 0..self.executors.len() as u32 {
            self.kill_executor(e);
        }
        for x in 0..self.filters.len() as u32 {
            self.kill_filter(x);
        }
        for h in self.holders.iter_mut() {
            let _ = h.kill();
            let _ = h.wait();
        }
        if std::thread::panicking() {
            // Keep the logs of a failing test.
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
            eprintln!("cluster directory kept: {}", dir.keep().display());
        }
    }
}

/// The gateway process; killed on drop.
pub struct GatewayProcess {
    child: Child,
    pub addr: String,
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `redoubt sql-gateway` with `clients` on a free port; returns once it listens.
pub fn start_gateway(cluster: &Cluster, clients: &str) -> GatewayProcess {
    let log = std::fs::File::create(cluster.dir.path().join("sql-gateway.log")).expect("log");
    let mut child = redoubt()
        .arg("sql-gateway")
        .arg("--config")
        .arg(cluster.config_path())
        .args(["--clients", clients, "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn redoubt sql-gateway");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the gateway's first line");
    // "sql-gateway listening on ADDR with N client ids"
    let addr = line
        .strip_prefix("sql-gateway listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line from the gateway: {line:?}"))
        .to_string();
    GatewayProcess { child, addr }
}
