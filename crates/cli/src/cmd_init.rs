//! `redoubt init`: writes a cluster configuration and the key files, then says what to run next.

use anyhow::Context as _;
use clap::Args;
use redoubt_config::{ClusterConfig, StateSection};
use redoubt_node::init::{init_cluster, InitOptions, DEFAULT_BASE_PORT};
use redoubt_node::snapshot::Snapshot;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct InitArgs {
    /// Number of replicas: 3f+1 (4, 7, 10, ...) to tolerate f faulty ones
    #[arg(
        long,
        visible_alias = "agreement",
        default_value_t = 4,
        value_name = "N"
    )]
    replicas: u32,
    /// Separated deployment: this many execution nodes (2g+1: 3, 5, ...) run the service and
    /// the replicas only order requests; 0 (the default) has the replicas execute
    #[arg(long, default_value_t = 0, value_name = "M")]
    execution: u32,
    /// Firewall deployment: an (H+1) x (H+1) array of filter nodes between the replicas and
    /// the execution nodes, tolerating H faulty filters (needs --execution)
    #[arg(long, value_name = "H")]
    firewall: Option<u32>,
    /// Number of clients (ids 1 to N) allowed to submit operations
    #[arg(long, default_value_t = 1, value_name = "N")]
    clients: u32,
    /// Output directory: receives redoubt.toml and keys/ (created if missing)
    #[arg(long, default_value = "redoubt-cluster", value_name = "DIR")]
    out: PathBuf,
    /// Replica i listens on port P+i and serves metrics and status on P+100+i
    #[arg(long, default_value_t = DEFAULT_BASE_PORT, value_name = "P")]
    base_port: u16,
    /// Address the replicas listen on and are reached at (edit the file to spread them over hosts)
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    host: IpAddr,
    /// Name of the cluster, for the people who run it ([cluster] name; nothing reads it)
    #[arg(long, default_value = "redoubt")]
    name: String,
    /// Fixed pairwise MAC keys instead of session keys with key holders (no key refresh, no
    /// proactive recovery)
    #[arg(long)]
    static_keys: bool,
    /// The ordering protocol: pbft, or prime (bounded delay under attack; needs session keys)
    #[arg(long, default_value = "pbft", value_name = "PROTOCOL")]
    ordering: redoubt_core::OrderProtocol,
    /// The service the replicas host: kv (the key-value store), sql (the SQL database,
    /// reached through `redoubt sql-gateway`) or files (the file system, `redoubt mount`)
    /// [default: kv, or the snapshot's]
    #[arg(long, value_name = "SERVICE", value_parser = ["kv", "sql", "files"])]
    service: Option<String>,
    /// Start the new cluster from a snapshot (`redoubt snapshot`): its service, its state
    /// size, and its pages as every executing node's initial state
    #[arg(long, value_name = "FILE")]
    from_snapshot: Option<PathBuf>,
    /// Size of the service's state ([state] size_mib, MiB): what the store, database or file
    /// system can hold [default: 256 for files, 64 for kv and sql]
    #[arg(long, value_name = "N", conflicts_with = "from_snapshot",
          value_parser = clap::value_parser!(u64).range(1..=65536))]
    size_mib: Option<u64>,
    /// Run replica and client traffic over the overlay network: also write overlay.toml (one
    /// daemon beside each replica, one for the clients, every pair linked, every tunnel),
    /// the matching [[overlay_tunnel]] entries, and the daemons' key files
    #[arg(long)]
    overlay: bool,
}

/// The file system's default size: files want more room than a store of small values.
const FILES_SIZE_MIB: u64 = 256;

pub fn run(args: InitArgs) -> anyhow::Result<()> {
    let snapshot = match &args.from_snapshot {
        Some(path) => Some(read_snapshot(path, args.service.as_deref())?),
        None => None,
    };
    let service = match (&snapshot, args.service) {
        (Some(s), _) => s.header.service.clone(),
        (None, service) => service.unwrap_or_else(|| "kv".into()),
    };
    let state_geometry = match &snapshot {
        Some(s) => Some((
            s.size_mib()
                .context("the snapshot's state is not a whole number of MiB")?,
            s.header.page_bytes,
            s.header.fanout,
        )),
        None => {
            let default = StateSection::default();
            let size_mib = args.size_mib.unwrap_or(if service == "files" {
                FILES_SIZE_MIB
            } else {
                default.size_mib
            });
            Some((size_mib, default.page_bytes, default.fanout))
        }
    };
    let opts = InitOptions {
        replicas: args.replicas,
        executors: args.execution,
        firewall: args.firewall,
        clients: args.clients,
        out: args.out.clone(),
        base_port: args.base_port,
        host: args.host,
        name: args.name,
        static_keys: args.static_keys,
        ordering: args.ordering,
        service,
        executable_blake3: if args.static_keys {
            None
        } else {
            Some(redoubt_localcluster::executable_blake3()?)
        },
        state_geometry,
    };
    let path = init_cluster(&opts)?;
    let load = || {
        ClusterConfig::load(&path).with_context(|| {
            format!(
                "`redoubt init` wrote {} but cannot read it back",
                path.display()
            )
        })
    };
    let mut cfg = load()?;
    if let Some(snap) = &snapshot {
        install_snapshot(&cfg, snap).with_context(|| {
            format!(
                "cannot install the snapshot; remove {} and run `redoubt init` again",
                args.out.display()
            )
        })?;
    }
    let overlay = if args.overlay {
        let written = crate::init_overlay::write(&cfg, opts.base_port)?;
        cfg = load()?;
        Some(written)
    } else {
        None
    };
    print!("{}", summary(&cfg));
    if let Some(s) = &snapshot {
        println!(
            "Initial state: checkpoint {} of cluster {:?} (digest {}), in every {}'s home.",
            s.header.seq,
            s.header.cluster,
            s.header.digest.short(),
            if cfg.executors.is_empty() {
                "replica"
            } else {
                "execution node"
            }
        );
    }
    if let Some(w) = overlay {
        print!("{}", overlay_summary(&cfg, &w));
    }
    Ok(())
}

/// Reads a snapshot and checks its pages against its digest and its service against the one
/// asked for.
fn read_snapshot(path: &Path, service: Option<&str>) -> anyhow::Result<Snapshot> {
    let snap = Snapshot::read(path)?;
    snap.verify()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if let Some(asked) = service.filter(|s| *s != snap.header.service) {
        anyhow::bail!(
            "{} holds a {} state, not {asked}: leave out --service",
            path.display(),
            snap.header.service
        );
    }
    Ok(snap)
}

/// Makes the snapshot's pages the initial state of every node that executes: the replicas,
/// or the execution nodes of a separated deployment.
fn install_snapshot(cfg: &ClusterConfig, snap: &Snapshot) -> anyhow::Result<()> {
    let executing = if cfg.executors.is_empty() {
        &cfg.replicas
    } else {
        &cfg.executors
    };
    for node in executing {
        let state = cfg.resolve(&node.home).join("state");
        snap.install(&state).map_err(|e| anyhow::anyhow!(e))?;
    }
    Ok(())
}

/// What `init --overlay` wrote beside the cluster, and how to start the daemons.
fn overlay_summary(cfg: &ClusterConfig, w: &crate::init_overlay::Written) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let file = w.overlay_file.display();
    let _ = writeln!(
        s,
        "\nOverlay: {file} ({} daemons: node i beside replica i, node {} for the clients; {} \
         tunnels in the cluster file), keys {} ... {} (mode 0600: copy each only to its node's host).",
        w.daemons,
        w.daemons - 1,
        cfg.overlay_tunnels.len(),
        w.key_files.first().map(|p| p.display().to_string()).unwrap_or_default(),
        w.key_files
            .last()
            .and_then(|p| p.file_name())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let _ = writeln!(
        s,
        "Start the daemons first, then the replicas as above:\n  for k in $(seq 0 {}); do redoubt overlay --config {file} --id $k & done",
        w.daemons - 1
    );
    s
}

/// What `init` wrote and what to run next.
fn summary(cfg: &ClusterConfig) -> String {
    use std::fmt::Write as _;
    let config = cfg.path.display().to_string();
    let n = cfg.replicas.len();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Initialised cluster {:?}: {n} replicas (tolerates f = {} faulty), {} client{}.",
        cfg.cluster.name,
        cfg.protocol.f,
        cfg.clients.len(),
        if cfg.clients.len() == 1 { "" } else { "s" }
    );
    let mut files: Vec<(String, String)> = vec![(
        config.clone(),
        "the configuration: every replica and client (the same file everywhere)".into(),
    )];
    let key_files = |what: &str, paths: Vec<PathBuf>| -> Vec<(String, String)> {
        if paths.len() <= 8 {
            paths
                .into_iter()
                .map(|p| {
                    (
                        p.display().to_string(),
                        format!("secret keys of {what} (mode 0600: copy it only to its host)"),
                    )
                })
                .collect()
        } else {
            vec![(
                format!(
                    "{} ... {}",
                    paths[0].display(),
                    paths[paths.len() - 1]
                        .file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                ),
                format!("secret keys, one file per {what} (mode 0600)"),
            )]
        }
    };
    let replica_keys: Vec<PathBuf> = cfg
        .replicas
        .iter()
        .map(|r| cfg.resolve(&r.key_file))
        .collect();
    let client_keys: Vec<PathBuf> = cfg
        .clients
        .iter()
        .map(|c| cfg.resolve(&c.key_file))
        .collect();
    let many = replica_keys.len() > 8;
    files.extend(key_files(
        if many { "replica" } else { "this replica" },
        replica_keys,
    ));
    files.extend(key_files(
        if client_keys.len() > 8 {
            "client"
        } else {
            "this client"
        },
        client_keys,
    ));
    if cfg.protocol.firewall() {
        let public = cfg.firewall_path();
        let dir = public.parent().map(PathBuf::from).unwrap_or_default();
        files.push((
            public.display().to_string(),
            "the firewall's public keys (every node and client reads it)".into(),
        ));
        files.push((
            dir.join("order-replica-<id>.key").display().to_string(),
            "each replica's order key (mode 0600: copy it only to that replica's host)".into(),
        ));
        files.push((
            dir.join("share-executor-<id>.key").display().to_string(),
            "each execution node's threshold key share (mode 0600: only to its host)".into(),
        ));
    }
    let width = files.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
    for (p, what) in &files {
        let _ = writeln!(s, "  {p:width$}  {what}");
    }
    let _ = writeln!(s);
    for r in &cfg.replicas {
        let _ = writeln!(
            s,
            "  replica {}: protocol {}, status http://{}/status, data in {}",
            r.id,
            r.addr,
            r.metrics_addr,
            cfg.resolve(&r.home).display()
        );
    }
    for x in &cfg.executors {
        let _ = writeln!(
            s,
            "  execution node {}: protocol {}, status http://{}/status, data in {}",
            x.id,
            x.addr,
            x.metrics_addr,
            cfg.resolve(&x.home).display()
        );
    }
    for x in &cfg.filters {
        let _ = writeln!(
            s,
            "  filter node {} (row {}): protocol {}, status http://{}/status",
            x.id,
            x.id / cfg.protocol.filter_rows.max(1),
            x.addr,
            x.metrics_addr,
        );
    }
    let _ = writeln!(s);
    if cfg.protocol.firewall() {
        let _ = writeln!(
            s,
            "Not promised in this deployment: proactive recovery. The replicas' order keys are
  dealt here once and never rotate, so an attacker who takes f+1 replicas over the
  cluster's whole life (not within one window) can have the execution nodes run a batch
  the replicas never agreed on; execution nodes and filters are never recovered
  proactively either. Replace the deployment's keys (a new `init`) if more than f
  replicas may have been compromised since it was set up (docs/operations.md,
  \"Firewall deployment\").
"
        );
    }
    let _ = writeln!(s, "Next:");
    let program = program();
    let bin = program.command.as_str();
    if let Some(note) = &program.note {
        let _ = writeln!(s, "  ({note})");
    }
    if !cfg.filters.is_empty() {
        let _ = writeln!(
            s,
            "  start every filter node (firewall deployment), each in its own terminal; a safe
  deployment puts each on its own machine, linked to the rows next to it only:"
        );
        for x in &cfg.filters {
            let _ = writeln!(s, "    {bin} filter --config {config} --id {}", x.id);
        }
    }
    if !cfg.executors.is_empty() {
        let _ = writeln!(
            s,
            "  start every execution node (separated deployment), each in its own terminal:"
        );
        for x in &cfg.executors {
            let _ = writeln!(s, "    {bin} executor --config {config} --id {}", x.id);
        }
    }
    if cfg.keys.session() {
        let _ = writeln!(
            s,
            "  start every replica's monitor (key holder, replica, proactive recovery), each in its\n  own terminal (on several hosts: docs/operations.md):"
        );
        for r in &cfg.replicas {
            let _ = writeln!(s, "    {bin} monitor --config {config} --id {}", r.id);
        }
    } else {
        let _ = writeln!(
            s,
            "  start every replica, each in its own terminal (on several hosts: docs/operations.md):"
        );
        for r in &cfg.replicas {
            let _ = writeln!(s, "    {bin} replica --config {config} --id {}", r.id);
        }
    }
    let _ = writeln!(s, "  check that they are up:");
    let _ = writeln!(s, "    {bin} status --config {config}");
    let first = cfg.clients.first().map(|c| c.id);
    let last = cfg.clients.last().map(|c| c.id);
    match (cfg.state.service.as_str(), first, last) {
        (_, None, _) | (_, _, None) => {}
        ("sql", Some(a), Some(b)) => {
            let ids = if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            };
            let _ = writeln!(
                s,
                "  serve PostgreSQL clients (one open connection per client id; no \
                 authentication:\n  listen on a trusted interface only), then connect with psql:"
            );
            let _ = writeln!(
                s,
                "    {bin} sql-gateway --config {config} --clients {ids} --listen 127.0.0.1:5432"
            );
            let _ = writeln!(s, "    psql \"host=127.0.0.1 port=5432 dbname=redoubt\"");
        }
        ("files", Some(a), Some(b)) => {
            let ids = if a == b {
                a.to_string()
            } else {
                format!("{a}-{}", b.min(a + 63))
            };
            let _ = writeln!(
                s,
                "  mount the file system (FUSE: needs /dev/fuse; SIGINT or SIGTERM unmounts):"
            );
            let _ = writeln!(s, "    mkdir -p /tmp/redoubt-files");
            let _ = writeln!(
                s,
                "    {bin} mount --config {config} --client {ids} /tmp/redoubt-files"
            );
        }
        (_, Some(c), _) => {
            let _ = writeln!(s, "  store and read a value:");
            let _ = writeln!(
                s,
                "    {bin} kv --config {config} --client {c} put greeting hello"
            );
            let _ = writeln!(
                s,
                "    {bin} kv --config {config} --client {c} get greeting"
            );
        }
    }
    s
}

/// How the next steps name the `redoubt` executable.
struct Program {
    /// `redoubt` when that name on PATH is this executable, else this executable's path.
    command: String,
    /// Why the commands do not say plain `redoubt`, if they do not.
    note: Option<String>,
}

/// The executable that runs `init`, as the next steps should name it.
fn program() -> Program {
    let Ok(me) = std::env::current_exe() else {
        return Program {
            command: "redoubt".into(),
            note: Some(
                "the path of this executable is unknown: `redoubt` below means it; it is not \
                 necessarily the one on PATH"
                    .into(),
            ),
        };
    };
    let me_canonical = std::fs::canonicalize(&me).unwrap_or_else(|_| me.clone());
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("redoubt"))
                .find(|p| p.is_file())
        })
        .unwrap_or_default();
    match on_path {
        Some(p) if std::fs::canonicalize(&p).is_ok_and(|c| c == me_canonical) => Program {
            command: "redoubt".into(),
            note: None,
        },
        other => {
            let shown = me.display().to_string();
            let command = if shown
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@".contains(c))
            {
                shown
            } else {
                format!("'{}'", shown.replace('\'', r"'\''"))
            };
            let why = match other {
                Some(p) => format!(
                    "`redoubt` on PATH is {}, not this executable: the commands below name \
                     this one",
                    p.display()
                ),
                None => "`redoubt` is not on PATH: the commands below name this executable \
                         by its path"
                    .to_string(),
            };
            Program {
                command,
                note: Some(why),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Second review, G9: `init --firewall` says plainly that the deployment gives no
    /// proactive-recovery guarantee; other deployments do not carry the warning.
    #[test]
    fn the_firewall_summary_says_what_it_does_not_promise() {
        for firewall in [None, Some(1)] {
            let dir = tempfile::tempdir().unwrap();
            let opts = InitOptions {
                replicas: 4,
                executors: 3,
                firewall,
                clients: 1,
                out: dir.path().join("c"),
                base_port: 23_000,
                host: std::net::IpAddr::from([127, 0, 0, 1]),
                name: "g9".into(),
                static_keys: false,
                ordering: Default::default(),
                service: "kv".into(),
                executable_blake3: None,
                state_geometry: None,
            };
            let path = init_cluster(&opts).unwrap();
            let text = summary(&ClusterConfig::load(&path).unwrap());
            assert_eq!(
                text.contains("Not promised in this deployment: proactive recovery"),
                firewall.is_some(),
                "{text}"
            );
        }
    }
}
