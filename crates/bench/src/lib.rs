//! The benchmarks of `redoubt bench ...`: real replica processes on 127.0.0.1, measured against
//! unreplicated baselines of the same code in the same run.

mod andrew;
mod attack;
mod common;
mod flame;
mod measure;
mod micro;
mod overlay;
mod recovery;
mod separation;
mod sql;
mod state_transfer;
mod versus;

use clap::{Args, Subcommand};
use std::process::ExitCode;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Bytes and time for a restarted replica to catch up by page-level state transfer,
    /// next to a whole-state copy
    StateTransfer(state_transfer::StateTransferArgs),
    /// Latency and throughput of 0/0, 0/4 and 4/0 operations against an unreplicated baseline
    Micro(micro::MicroArgs),
    /// Time to recover a replica, step by step, and the throughput cost of proactive recovery
    Recovery(recovery::RecoveryArgs),
    /// Latency and throughput of the co-located, separated, threshold and firewall
    /// deployments (Yin et al. 2003) against an unreplicated baseline
    Separation(separation::SeparationArgs),
    /// Throughput and latency of PBFT and Prime second by second, before and during an attack
    /// by faulty replicas or clients (needs the `redoubt-attack` harness built)
    Attack(attack::AttackArgs),
    /// SQL throughput and latency (updates and queries of the JHU replication benchmark)
    /// against the same engine unreplicated
    Sql(sql::SqlArgs),
    /// The Andrew benchmark's five phases on redoubt's FUSE mount, an unreplicated FUSE mount
    /// and the plain file system (needs root and /dev/fuse)
    Andrew(andrew::AndrewArgs),
    /// The overlay daemon against Amir et al. 2004: hop-by-hop against end-to-end recovery on
    /// the report's chain, ODSBR against a Byzantine relay, a cluster over the overlay
    Overlay(overlay::OverlayArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.which {
        Bench::Micro(a) => micro::run(a),
        Bench::Recovery(a) => recovery::run(a),
        Bench::StateTransfer(a) => state_transfer::run(a),
        Bench::Separation(a) => separation::run(a),
        Bench::Attack(a) => attack::run(a),
        Bench::Sql(a) => sql::run(a),
        Bench::Andrew(a) => andrew::run(a),
        Bench::Overlay(a) => overlay::run(a),
    }
}
