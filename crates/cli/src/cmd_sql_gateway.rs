//! `redoubt sql-gateway`: a PostgreSQL wire-protocol front end to a cluster whose replicas
//! host the SQL service. PostgreSQL clients connect to `--listen`; each open connection uses
//! one of the `--clients` ids (a client id has one request outstanding at a time), so the
//! ids bound how many connections may be open at once.
//!
//! There is no authentication (trust): listen on a trusted interface only.

use crate::cmd_kv::lock_client;
use anyhow::Context as _;
use clap::Args;
use redoubt_client::ClientSetup;
use redoubt_config::ClusterConfig;
use redoubt_core::ClientId;
use redoubt_sqlgw::{Gateway, GatewayConfig};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct SqlGatewayArgs {
    /// The cluster configuration file (written by `redoubt init --service sql`)
    #[arg(long, value_name = "FILE", env = "REDOUBT_CONFIG")]
    config: PathBuf,
    /// Client ids the gateway acts as, one per open connection: a range `5-8` or a list
    /// `5,6,9` (or both: `1-3,7`). No other process may use them meanwhile.
    #[arg(long, value_name = "IDS", value_parser = parse_ids)]
    clients: ClientIds,
    /// Address PostgreSQL clients connect to (no authentication: a trusted interface only)
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:5432")]
    listen: SocketAddr,
}

/// The ids of `--clients`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClientIds(Vec<ClientId>);

/// `5-8`, `5,6,9`, `1-3,7` -> the ids, each once, in order.
fn parse_ids(s: &str) -> Result<ClientIds, String> {
    let mut ids = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |x: &str| {
            x.trim()
                .parse::<ClientId>()
                .map_err(|_| format!("{x:?} is not a client id (a number) in {s:?}"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("the range {part:?} is empty (write low-high)"));
                }
                if b - a >= 10_000 {
                    return Err(format!("the range {part:?} holds more than 10,000 ids"));
                }
                ids.extend(a..=b);
            }
            None => ids.push(num(part)?),
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(*id));
    if ids.is_empty() {
        return Err("no client ids given (e.g. --clients 5-8)".into());
    }
    Ok(ClientIds(ids))
}

pub fn run(args: SqlGatewayArgs) -> anyhow::Result<ExitCode> {
    redoubt_node::logging::init(redoubt_node::logging::LogFormat::Human);
    let cfg = ClusterConfig::load(&args.config)?;
    crate::require_service(&cfg, "sql")?;
    let ids = args.clients.0;
    let mut locks = Vec::with_capacity(ids.len());
    let mut clients = Vec::with_capacity(ids.len());
    for &id in &ids {
        locks.push(lock_client(&args.config, id)?);
        clients.push(ClientSetup::from_cluster(&cfg, id).with_context(|| {
            format!(
                "client {id} of --clients is not usable in {}",
                args.config.display()
            )
        })?);
    }
    let rt = crate::runtime(2)?;
    rt.block_on(async {
        let gateway = Gateway::bind(GatewayConfig {
            listen: args.listen,
            clients,
        })
        .await?;
        let addr = gateway
            .local_addr()
            .context("cannot read the bound address")?;
        println!(
            "sql-gateway listening on {addr} with {} client ids",
            ids.len()
        );
        std::io::stdout().flush()?;
        gateway.run(shutdown_signal()?).await;
        eprintln!("sql-gateway stopped");
        anyhow::Ok(())
    })?;
    drop(locks);
    Ok(ExitCode::SUCCESS)
}

/// Completes on the first SIGTERM or SIGINT.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_ids, ClientIds};

    #[test]
    fn client_ids_are_ranges_and_lists() {
        assert_eq!(parse_ids("5-8"), Ok(ClientIds(vec![5, 6, 7, 8])));
        assert_eq!(parse_ids("5,6, 9"), Ok(ClientIds(vec![5, 6, 9])));
        assert_eq!(parse_ids("1-3,7,2"), Ok(ClientIds(vec![1, 2, 3, 7])));
        assert!(parse_ids("8-5").is_err());
        assert!(parse_ids("x").unwrap_err().contains("not a client id"));
        assert!(parse_ids("").is_err());
    }
}
