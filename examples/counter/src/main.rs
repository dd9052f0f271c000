//! `counter`: a replica hosting the replicated counter, and a client of it, over a cluster file
//! written by `redoubt init`.
//!
//! ```sh
//! redoubt init --replicas 4 --clients 1 --out c
//! for i in 0 1 2 3; do counter replica --config c/redoubt.toml --id $i --with-keyholder & done
//! counter add --config c/redoubt.toml --client 1 5
//! counter get --config c/redoubt.toml --client 1
//! ```

use clap::{Parser, Subcommand};
use redoubt_client::ClientSetup;
use redoubt_example_counter::{CounterClient, CounterOp, CounterService};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "A replicated counter hosted by redoubt")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one replica of the counter until SIGTERM or SIGINT
    Replica {
        /// The cluster file (written by `redoubt init`)
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Which replica of the cluster file to run
        #[arg(long, value_name = "I")]
        id: u32,
        /// Serve the replica's key holder from this process (session keys). A deployment runs
        /// it apart, under another user: `redoubt keyholder --config FILE --id I`.
        #[arg(long)]
        with_keyholder: bool,
    },
    /// Add one to the counter
    Increment(ClientArgs),
    /// Add N to the counter
    Add {
        #[command(flatten)]
        client: ClientArgs,
        n: u64,
    },
    /// Read the counter
    Get(ClientArgs),
}

#[derive(clap::Args)]
struct ClientArgs {
    /// The cluster file (written by `redoubt init`)
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The client id to act as (a [[client]] of the cluster file)
    #[arg(long, value_name = "C")]
    client: u64,
}

fn main() -> ExitCode {
    let result = match Args::parse().command {
        Command::Replica {
            config,
            id,
            with_keyholder,
        } => replica(config, id, with_keyholder),
        Command::Increment(c) => operate(c, CounterOp::Increment),
        Command::Add { client, n } => operate(client, CounterOp::Add(n)),
        Command::Get(c) => operate(c, CounterOp::Get),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Runs replica `id` of the cluster in `config`, hosting the counter.
fn replica(config: PathBuf, id: u32, with_keyholder: bool) -> Result<()> {
    redoubt_node::logging::init(redoubt_node::logging::LogFormat::Human);
    if with_keyholder {
        let cfg = redoubt_config::ClusterConfig::load(&config)?;
        redoubt_node::holder::serve_for_replica(&cfg, id)?;
    }
    let opts = redoubt_node::runtime::RunOptions::default();
    let service = CounterService::new();
    runtime()?.block_on(redoubt_node::run_replica(&config, id, opts, service))?;
    Ok(())
}

/// Runs one operation as a client of the cluster in `args.config`; prints the counter.
fn operate(args: ClientArgs, op: CounterOp) -> Result<()> {
    let setup = ClientSetup::from_config(&args.config, args.client)?;
    let c = runtime()?.block_on(async {
        let counter = CounterClient::connect(setup).await?;
        let c = match op {
            CounterOp::Increment => counter.increment().await?,
            CounterOp::Add(n) => counter.add(n).await?,
            CounterOp::Get => counter.get().await?,
        };
        Result::Ok(c)
    })?;
    println!("{} (updates: {})", c.value, c.updates);
    Ok(())
}
