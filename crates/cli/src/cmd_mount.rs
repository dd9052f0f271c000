//! `redoubt mount`: the replicated file system (a cluster made with `redoubt init --service
//! files`) as a FUSE mount, until SIGINT or SIGTERM. With `--local`, the same file service runs
//! in this process on an in-memory state instead: the unreplicated baseline of `redoubt bench
//! andrew`.
//!
//! Each client id has one request outstanding at a time; `--client 5-8` gives the mount four,
//! so four of the kernel's requests (from several programs, or readahead) run at once.

use crate::cmd_kv::lock_client;
use anyhow::Context as _;
use clap::Args;
use redoubt_client::files::FileClient;
use redoubt_client::ClientSetup;
use redoubt_config::ClusterConfig;
use redoubt_core::ClientId;
use redoubt_fusefs::{
    check_can_mount, mount, Backend, ClusterBackend, LocalBackend, MountOptions, Mounted,
};
use redoubt_services::files::ROOT;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct MountArgs {
    /// The cluster configuration file (written by `redoubt init --service files`)
    #[arg(
        long,
        value_name = "FILE",
        env = "REDOUBT_CONFIG",
        required_unless_present = "local"
    )]
    config: Option<PathBuf>,
    /// Client id, or a range C-D of ids, the mount acts as: one request in flight per id. No
    /// other process may use them meanwhile.
    #[arg(long, value_name = "C[-D]", env = "REDOUBT_CLIENT", value_parser = parse_range,
          required_unless_present = "local")]
    client: Option<ClientRange>,
    /// Mount an unreplicated file system held in this process's memory instead (the
    /// benchmark's baseline; it is gone when the mount ends)
    #[arg(long, conflicts_with_all = ["config", "client"])]
    local: bool,
    /// Size of the `--local` file system's state (MiB)
    #[arg(long, value_name = "N", default_value_t = 64, requires = "local",
          value_parser = clap::value_parser!(u64).range(1..=65536))]
    size_mib: u64,
    /// How long the kernel may cache attributes and names (ms): other clients' changes show
    /// after at most this long
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    ttl_ms: u64,
    /// Send every write to the cluster before `write(2)` returns, instead of holding a file's
    /// writes until it is closed or synced (or for at most the TTL)
    #[arg(long)]
    write_through: bool,
    /// Send each read-only operation to 2f+1 replicas first, as `[protocol]
    /// read_only_to_quorum` has other clients do, instead of to all of them: less work for the
    /// replicas, but a program waits whenever one of the 2f+1 is slow
    #[arg(long)]
    reads_to_quorum: bool,
    /// At unmount, write how many operations of each kind the mount sent and their time to
    /// this CSV file (`op,count,failed,total_s`; for benchmarks)
    #[arg(long, value_name = "FILE", hide = true)]
    stats: Option<PathBuf>,
    /// The directory to mount on
    mountpoint: PathBuf,
}

/// The ids of `--client`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClientRange(Vec<ClientId>);

/// `C` or `C-D`: the ids.
fn parse_range(s: &str) -> Result<ClientRange, String> {
    let id = |x: &str| {
        x.trim()
            .parse::<ClientId>()
            .map_err(|_| format!("{x:?} is not a client id: write C or C-D, e.g. 5-8"))
    };
    let (first, last) = match s.split_once('-') {
        Some((a, b)) => (id(a)?, id(b)?),
        None => (id(s)?, id(s)?),
    };
    if first > last || last - first >= 64 {
        return Err(format!(
            "{s:?} is not a range of 1 to 64 client ids (write low-high)"
        ));
    }
    Ok(ClientRange((first..=last).collect()))
}

pub fn run(args: MountArgs) -> anyhow::Result<ExitCode> {
    redoubt_node::logging::init(redoubt_node::logging::LogFormat::Human);
    // Before anything starts: no /dev/fuse, not root, no directory.
    check_can_mount(&args.mountpoint)?;
    let options = MountOptions {
        ttl: Duration::from_millis(args.ttl_ms),
        write_behind: !args.write_through,
        ..MountOptions::default()
    };
    let rt = crate::runtime(2)?;
    let mp = args.mountpoint.clone();
    if args.local {
        let backend = LocalBackend::new(args.size_mib << 20)
            .map_err(|e| anyhow::anyhow!("cannot start the local file service: {e}"))?;
        let what = format!(
            "({} MiB in this process's memory, gone at unmount)",
            args.size_mib
        );
        return serve(
            &rt,
            backend,
            &mp,
            &options,
            ("an unreplicated local file system", &what),
            args.stats.as_deref(),
        );
    }
    let stats = args.stats;
    let (Some(config), Some(ClientRange(ids))) = (args.config, args.client) else {
        anyhow::bail!("--config and --client are required without --local");
    };
    let cfg = ClusterConfig::load(&config)?;
    anyhow::ensure!(
        cfg.state.service == "files",
        "the cluster in {} runs the {:?} service ([state] service), not the file system: make \
         one with `redoubt init --service files`",
        config.display(),
        cfg.state.service
    );
    let mut locks = Vec::with_capacity(ids.len());
    let mut setups = Vec::with_capacity(ids.len());
    for &id in &ids {
        locks.push(lock_client(&config, id)?);
        let mut setup = ClientSetup::from_cluster(&cfg, id)
            .with_context(|| format!("client {id} is not usable in {}", config.display()))?;
        // A program waits for each operation of the mount: its reads go to every replica and
        // the first 2f+1 matching answers count, rather than to 2f+1 that must all be quick.
        setup.core.read_only_to_quorum = args.reads_to_quorum;
        setups.push(setup);
    }
    let request_bytes_max = setups[0].core.request_bytes_max;
    let clients = rt.block_on(async {
        let mut clients = Vec::with_capacity(setups.len());
        for s in setups {
            clients.push(FileClient::connect(s).await?);
        }
        // Fail now rather than at the first program's access: is anyone there?
        clients[0].getattr(ROOT).await.with_context(|| {
            format!(
                "the cluster in {} did not answer (are its replicas running?)",
                config.display()
            )
        })?;
        anyhow::Ok(clients)
    })?;
    let ids_text = match (ids.first(), ids.last()) {
        (Some(a), Some(b)) if a != b => format!("{a}-{b}"),
        (Some(a), _) => a.to_string(),
        _ => String::new(),
    };
    let what = format!("(client ids {ids_text})");
    let code = serve(
        &rt,
        ClusterBackend::new(clients, request_bytes_max),
        &mp,
        &options,
        ("the replicated file system", &what),
        stats.as_deref(),
    );
    drop(locks);
    code
}

/// Mounts `backend` and serves it until a signal or someone else's unmount.
fn serve<B: Backend>(
    rt: &tokio::runtime::Runtime,
    backend: B,
    mp: &Path,
    options: &MountOptions,
    (what, detail): (&str, &str),
    stats: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let mounted = mount(backend, mp, rt.handle().clone(), options)?;
    println!(
        "mounted {what} at {} {detail}; attributes cached for {} ms; {}; SIGINT or SIGTERM \
         unmounts",
        mp.display(),
        options.ttl.as_millis(),
        if options.write_behind {
            "writes held until close or fsync"
        } else {
            "every write sent before it returns"
        }
    );
    std::io::stdout().flush()?;
    let signalled = rt.block_on(wait_for_end(&mounted))?;
    if !signalled {
        eprintln!("{} was unmounted from outside; exiting", mp.display());
    }
    let calls = mounted.stats();
    mounted.unmount()?;
    eprintln!("unmounted {}", mp.display());
    if let Some(path) = stats {
        let mut csv = String::from("op,count,failed,total_s\n");
        for (op, c) in calls.snapshot() {
            csv.push_str(&format!(
                "{op},{},{},{:.6}\n",
                c.count,
                c.failed,
                c.time.as_secs_f64()
            ));
        }
        std::fs::write(path, csv).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Waits for SIGINT or SIGTERM (true) or for the mount to end otherwise (false).
async fn wait_for_end(mounted: &Mounted) -> anyhow::Result<bool> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(true),
            _ = int.recv() => return Ok(true),
            _ = tick.tick() => {
                if !mounted.is_mounted() {
                    return Ok(false);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_range, ClientRange};

    #[test]
    fn client_ranges() {
        assert_eq!(parse_range("5"), Ok(ClientRange(vec![5])));
        assert_eq!(parse_range("5-8"), Ok(ClientRange(vec![5, 6, 7, 8])));
        assert!(parse_range("8-5").is_err());
        assert!(parse_range("1-100").is_err());
        assert!(parse_range("x").unwrap_err().contains("not a client id"));
    }
}
