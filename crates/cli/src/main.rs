//! `redoubt`: the command-line front end of redoubt, an intrusion-tolerant replicated service
//! (a key-value store, an SQL database or a file system; PBFT or Prime ordering).
//!
//! - `redoubt init`: write a cluster configuration and one key file per principal;
//! - `redoubt replica`: run one replica until SIGTERM/SIGINT;
//! - `redoubt monitor`: a replica's recovery monitor (key holder, replica, proactive recovery);
//! - `redoubt keyholder`: only a replica's key holder;
//! - `redoubt kv`: one key-value operation through the cluster;
//! - `redoubt status`: a table of every replica's view, progress and health;
//! - `redoubt sql-gateway`: a PostgreSQL wire-protocol gateway to the SQL service;
//! - `redoubt mount`: the replicated file system as a FUSE mount;
//! - `redoubt demo`: a real 4-process cluster on 127.0.0.1 under load, with a primary crash.
//!
//! Exit status: 0 success, 1 failure (one message on stderr says what, where, and what to do),
//! 2 usage error, 3 a negative answer of `kv` (key absent, compare-and-swap not applied).

mod cmd_executor;
mod cmd_init;
mod cmd_keyholder;
mod cmd_kv;
mod cmd_monitor;
mod cmd_mount;
mod cmd_overlay;
mod cmd_pin;
mod cmd_replica;
mod cmd_snapshot;
mod cmd_sql_dump;
mod cmd_sql_gateway;
mod cmd_status;
mod cmd_vip;
mod demo;
mod init_overlay;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Exit status of a failed command.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a `kv` operation whose answer is negative: `get`/`delete` of an absent key,
/// `cas` whose comparison failed.
pub const EXIT_NEGATIVE: u8 = 3;

#[derive(Parser)]
#[command(
    name = "redoubt",
    version,
    about = "An intrusion-tolerant replicated service: key-value store, SQL database or file \
        system (PBFT or Prime ordering)",
    long_about = "An intrusion-tolerant replicated service (PBFT or Prime ordering).\n\n\
        Services (`redoubt init --service`): kv, the key-value store (`redoubt kv`); sql, an SQL \
        database (`redoubt sql-gateway`, then any PostgreSQL client); files, a file system \
        (`redoubt mount`). A custom service runs in its own binary that calls \
        redoubt_node::run_replica (examples/counter).\n\n\
        Quick look: `redoubt demo` runs a 4-replica cluster on this machine, crashes its primary \
        under load and checks that no acknowledged write was lost.\n\n\
        Exit status: 0 success, 1 failure, 2 usage error, 3 negative kv answer (key absent, \
        compare-and-swap not applied).",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a cluster configuration and one key file per replica and client
    Init(cmd_init::InitArgs),
    /// Run one replica of a cluster (the service its file names: kv, sql or files) until
    /// SIGTERM or SIGINT
    Replica(cmd_replica::ReplicaArgs),
    /// Run one execution node of a separated deployment (the service its file names: kv, sql
    /// or files)
    Executor(cmd_executor::ExecutorArgs),
    /// Run one filter node of a firewall deployment (no keys, no state)
    Filter(cmd_executor::FilterArgs),
    /// Run a replica's recovery monitor: its key holder, the replica, proactive recovery
    Monitor(cmd_monitor::MonitorArgs),
    /// Run only a replica's key holder on its Unix socket
    Keyholder(cmd_keyholder::KeyholderArgs),
    /// Pin an executable in the cluster file (rolling upgrade: then SIGHUP each monitor in turn)
    Pin(cmd_pin::PinArgs),
    /// Run one key-value operation through a cluster of the kv service
    Kv(cmd_kv::KvArgs),
    /// Show the cluster's service and every replica's view, progress and health
    Status(cmd_status::StatusArgs),
    /// Back up the service state: a replica on this machine writes its stable checkpoint,
    /// which f+1 replicas must vouch for (`--verify FILE` checks a snapshot file)
    Snapshot(cmd_snapshot::SnapshotArgs),
    /// Write the SQL database of a snapshot as SQL that `psql -f` restores through the gateway
    SqlDump(cmd_sql_dump::SqlDumpArgs),
    /// Serve PostgreSQL clients from a cluster running the SQL service (no authentication)
    SqlGateway(cmd_sql_gateway::SqlGatewayArgs),
    /// Mount the replicated file system (`init --service files`) with FUSE until SIGINT/SIGTERM
    Mount(cmd_mount::MountArgs),
    /// Run a 4-replica cluster on 127.0.0.1 under load, crash its primary, verify every write
    Demo(demo::DemoArgs),
    /// Benchmarks on a local cluster against unreplicated baselines: micro, recovery,
    /// state-transfer, separation, attack, sql, andrew, overlay
    Bench(redoubt_bench::BenchArgs),
    /// Run the unreplicated baseline server of the benchmarks (one server, no agreement)
    Baseline(BaselineArgs),
    /// Keep virtual IP addresses covered by a group of servers (Wackamole fail-over)
    Vip(cmd_vip::VipArgs),
    /// Run one overlay daemon (hop-by-hop links, ODSBR routing, WAN emulation, connection
    /// tunnels for replicas and clients), or deal its nodes' keys (`overlay keygen`)
    Overlay(cmd_overlay::OverlayArgs),
}

#[derive(clap::Args)]
struct BaselineArgs {
    /// The cluster configuration file; the server uses replica 0's keys
    #[arg(long, value_name = "FILE")]
    config: std::path::PathBuf,
    /// Address to listen on [default: replica 0's addr]
    #[arg(long, value_name = "HOST:PORT")]
    addr: Option<std::net::SocketAddr>,
    /// Runtime threads [default: the configuration's [node] worker_threads, as a replica]
    #[arg(long, value_name = "N")]
    worker_threads: Option<usize>,
}

fn baseline(args: BaselineArgs) -> anyhow::Result<ExitCode> {
    redoubt_node::logging::init(redoubt_node::logging::LogFormat::Human);
    let cfg = redoubt_config::ClusterConfig::load(&args.config)?;
    let addr = match args.addr {
        Some(a) => a,
        None => cfg.replica(0)?.addr,
    };
    let threads = args.worker_threads.unwrap_or(cfg.node.worker_threads);
    // The service the cluster file names ([state] service), as `redoubt replica` hosts it.
    let service = cmd_replica::hosted_service(&args.config).map_err(|e| anyhow::anyhow!(e))?;
    runtime_with(threads)?.block_on(redoubt_node::baseline::run_baseline(
        &args.config,
        addr,
        service,
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // A usage error of `kv` or `status -o json` is a JSON object on stdout too, for the
            // program that reads it (the text stays on stderr for people); help and version
            // are not errors.
            if e.use_stderr() && json_requested(std::env::args_os().skip(1)) {
                let text = e.render().to_string();
                let first = text
                    .lines()
                    .map(|l| l.trim().trim_start_matches("error:").trim())
                    .find(|l| !l.is_empty())
                    .unwrap_or("usage error")
                    .to_string();
                print_json_error(&first, e.exit_code());
            }
            e.exit()
        }
    };
    let json_errors = match &cli.command {
        Command::Kv(a) => a.output() == Output::Json,
        Command::Status(a) => a.output() == Output::Json,
        _ => false,
    };
    let result = match cli.command {
        Command::Init(a) => cmd_init::run(a).map(|()| ExitCode::SUCCESS),
        Command::Replica(a) => return cmd_replica::run(a),
        Command::Executor(a) => return cmd_executor::run(a),
        Command::Filter(a) => return cmd_executor::run_filter(a),
        Command::Monitor(a) => cmd_monitor::run(a),
        Command::Keyholder(a) => cmd_keyholder::run(a),
        Command::Kv(a) => cmd_kv::run(a),
        Command::Status(a) => cmd_status::run(a),
        Command::Pin(a) => cmd_pin::run(a),
        Command::Snapshot(a) => cmd_snapshot::run(a),
        Command::SqlDump(a) => cmd_sql_dump::run(a).map(|()| ExitCode::SUCCESS),
        Command::SqlGateway(a) => cmd_sql_gateway::run(a),
        Command::Mount(a) => cmd_mount::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => redoubt_bench::run(a),
        Command::Baseline(a) => baseline(a),
        Command::Vip(a) => cmd_vip::run(a),
        Command::Overlay(a) => cmd_overlay::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let line = report(&e);
            eprintln!("error: {line}");
            if json_errors {
                print_json_error(&line, i32::from(EXIT_FAILURE));
            }
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// An error for programs (`-o json`): one object `{"error": MESSAGE, "exit": STATUS}` and a
/// newline on stdout.
fn print_json_error(message: &str, exit: i32) {
    use std::io::Write as _;
    let v = serde_json::json!({ "error": message, "exit": exit });
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Whether command-line arguments that did not parse are those of `kv` or `status` with
/// `-o json` (`-o json`, `-ojson`, `--output json`, `--output=json`).
fn json_requested(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let Some(cmd) = args.iter().find(|a| !a.starts_with('-')) else {
        return false;
    };
    if cmd != "kv" && cmd != "status" {
        return false;
    }
    args.iter().enumerate().any(|(i, a)| match a.as_str() {
        "-o" | "--output" => args.get(i + 1).is_some_and(|v| v == "json"),
        "-ojson" | "--output=json" => true,
        _ => false,
    })
}

/// Refuses to go on when the cluster in `cfg` does not run the service `wanted` ([state]
/// service: kv, sql or files), naming the service it runs and the command that fits it (a
/// client of another service would only get undecodable replies later).
pub fn require_service(cfg: &redoubt_config::ClusterConfig, wanted: &str) -> anyhow::Result<()> {
    let service = cfg.state.service.as_str();
    if service == wanted {
        return Ok(());
    }
    let config = cfg.path.display();
    let what = |s: &str| match s {
        "kv" => "the key-value store",
        "sql" => "the SQL database",
        "files" => "the file system",
        _ => "another service",
    };
    let fits = match service {
        "kv" => format!("use `redoubt kv --config {config} --client C get KEY` (and put, delete, cas, scan)"),
        "sql" => format!(
            "serve it to PostgreSQL clients with `redoubt sql-gateway --config {config} --clients IDS`, then connect with psql"
        ),
        "files" => format!("mount it with `redoubt mount --config {config} --client C DIR`"),
        _ => "use that service's own client".to_string(),
    };
    anyhow::bail!(
        "the cluster in {config} runs the {service:?} service ([state] service), not {}: {fits} \
         (or make a cluster of {} with `redoubt init --service {wanted}`)",
        what(wanted),
        what(wanted),
    )
}

/// An error and its causes on one line, each cause once: messages that already name their
/// cause (most of ours do, with advice after it) are not followed by it again.
pub fn report(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::report;

    #[test]
    fn json_is_requested_by_kv_and_status_only() {
        let yes = |line: &str| super::json_requested(line.split(' ').map(Into::into));
        assert!(yes("kv -o json get"));
        assert!(yes("kv --client 1 --output=json"));
        assert!(yes("status -ojson --nope"));
        assert!(!yes("kv -o text get"));
        assert!(!yes("init -o json"));
        assert!(!yes("-o json"));
    }

    #[test]
    fn a_cause_the_message_names_is_not_repeated() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let named = redoubt_config::ConfigError::Read {
            path: "/nope.toml".into(),
            source: missing,
        };
        let line = report(&anyhow::Error::from(named));
        assert_eq!(line.matches("no such file").count(), 1, "{line}");
        assert!(line.ends_with("create one with `redoubt init`"), "{line}");
        // A cause the message does not name is still shown.
        let e = anyhow::anyhow!("disk full").context("cannot write the journal");
        assert_eq!(report(&e), "cannot write the journal: disk full");
    }
}

/// A node's runtime: one thread (`current_thread`) when `threads` is 1, else a
/// multi-thread runtime with `threads` workers named `redoubt-net` (0 = one per core). A node
/// runs its protocol loop in `block_on`, on the main thread: with workers, its connections
/// and links (reading, decoding and hashing frames, writing) run on them.
pub fn runtime_with(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context as _;
    let workers = match threads {
        1 => {
            return tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")
        }
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("redoubt-net")
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub use redoubt_localcluster::runtime;

/// Bytes as text for messages: UTF-8 as a quoted string, anything else with `\xNN` escapes.
/// How a command prints its answer: for people (`text`) or for programs (`json`, one
/// object on stdout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Bytes for a JSON answer: the string itself if they are UTF-8, else `{"hex": "..."}`.
pub fn json_bytes(b: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(b) {
        Ok(s) => serde_json::Value::String(s.to_string()),
        Err(_) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            serde_json::json!({ "hex": hex })
        }
    }
}

pub fn show_bytes(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => format!("{s:?}"),
        Err(_) => format!("\"{}\"", b.escape_ascii()),
    }
}
