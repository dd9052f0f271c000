//! Seed sweep of the overlay simulator: runs seeds, prints each failing seed (to replay with
//! `--seed S --verbose`) and a summary; exits non-zero if any seed failed.

use clap::Parser;
use redoubt_overlay::sim::{bench, run_seed_catching, SeedReport};
use redoubt_overlay::{Mutant, Recovery, Stats};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Parser)]
#[command(about = "Seeded simulation sweep of the redoubt overlay (Spines + ODSBR)")]
struct Args {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start_seed: u64,
    /// Run only this seed (replay), ignoring --seeds and --start-seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// A deliberately broken variant: unauthenticated-probe-acks, ignore-loss-threshold,
    /// keep-accused-route (the sweep should fail).
    #[arg(long, default_value = "none")]
    mutant: String,
    /// Print every seed's scenario and counters, not only failures.
    #[arg(long)]
    verbose: bool,
    /// Print every protocol event (links, routes, probes, accusations) of each seed.
    #[arg(long)]
    trace: bool,
    /// Instead of the sweep, compare hop-by-hop and end-to-end recovery on the A-F chain.
    #[arg(long)]
    chain_bench: bool,
    /// Instead of the sweep, the Byzantine-relay experiment: node 1 of a square starts dropping
    /// 30% of what it forwards after 15 s of a 45 s ordered 1 Mbit/s stream from 0 to 3.
    #[arg(long)]
    byzantine_bench: bool,
    /// Latency of the two links of the other route 0-2-3 for --byzantine-bench (the faulty
    /// route's links take 10 ms).
    #[arg(long, default_value_t = 11)]
    alt_latency_ms: u64,
    /// Loss on link C-D for --chain-bench, per mille.
    #[arg(long, default_value_t = 10)]
    loss_permille: u32,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let Some(mutant) = Mutant::from_name(&args.mutant) else {
        eprintln!(
            "unknown mutant {:?}; one of: none, {}",
            args.mutant,
            Mutant::ALL.map(|m| m.name()).join(", ")
        );
        return ExitCode::from(2);
    };
    if args.chain_bench {
        for r in [Recovery::HopByHop, Recovery::EndToEnd] {
            let s = bench::chain_delay(r, args.loss_permille, 16, 5_000, args.start_seed);
            println!(
                "{:?}: {} of {} delivered, delayed >60 ms {:.1}%, >100 ms {:.1}%, mean {:.1} ms, max {} ms",
                s.recovery,
                s.delivered,
                s.sent,
                s.over_60ms_permille as f64 / 10.0,
                s.over_100ms_permille as f64 / 10.0,
                s.mean_ms,
                s.max_ms
            );
        }
        return ExitCode::SUCCESS;
    }
    if args.byzantine_bench {
        let s = bench::byzantine_reroute(300, 8, 45, 15, args.alt_latency_ms, args.start_seed);
        println!(
            "{} of {} delivered; localised after {:?} ms; {} accusations, {} route changes after \
             the fault; max delay {} ms",
            s.delivered, s.sent, s.localise_ms, s.accusations, s.route_changes, s.max_delay_ms
        );
        for p in &s.phases {
            println!(
                "  {:<22} {:>6}-{:>6} ms: {:7.1} msgs/s ({:6.0} kbit/s), mean delay {:8.1} ms",
                p.name,
                p.from_ms,
                p.to_ms,
                p.delivered_per_s,
                p.delivered_per_s * 8.0,
                p.mean_delay_ms
            );
        }
        if args.verbose {
            for (t, e) in &s.source_events {
                println!("  {t:>6} ms  {e:?}");
            }
        }
        return ExitCode::SUCCESS;
    }
    let (first, count) = match args.seed {
        Some(s) => (s, 1),
        None => (args.start_seed, args.seeds),
    };
    let next = AtomicU64::new(first);
    let end = first + count;
    let reports: Mutex<Vec<SeedReport>> = Mutex::new(Vec::new());
    let print = Mutex::new(());
    std::thread::scope(|s| {
        for _ in 0..args.jobs.max(1) {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    break;
                }
                let r = run_seed_catching(seed, mutant);
                {
                    let _g = print.lock().expect("print lock");
                    if !r.failures.is_empty() {
                        println!("FAIL seed {seed}: {}", r.description);
                        for f in &r.failures {
                            println!("    {f}");
                        }
                        println!(
                            "    replay: cargo run --release -p redoubt-overlay --bin \
                             redoubt-overlay-sim -- --seed {seed}{} --verbose",
                            if mutant == Mutant::None {
                                String::new()
                            } else {
                                format!(" --mutant {}", mutant.name())
                            }
                        );
                    } else if args.verbose {
                        println!("ok seed {seed}: {}", r.description);
                    }
                    if args.trace {
                        for line in &r.trace {
                            println!("    {line}");
                        }
                    }
                    if args.verbose {
                        println!(
                            "    delivered {}, accusations {}, ended at {} ms; {:?}",
                            r.delivered, r.accusations, r.end_ms, r.stats
                        );
                    }
                }
                reports.lock().expect("reports lock").push(r);
            });
        }
    });
    let reports = reports.into_inner().expect("reports lock");
    let failed: Vec<u64> = reports
        .iter()
        .filter(|r| !r.failures.is_empty())
        .map(|r| r.seed)
        .collect();
    let mut total = Stats::default();
    for r in &reports {
        total.add(&r.stats);
    }
    let delivered: usize = reports.iter().map(|r| r.delivered).sum();
    let accusations: usize = reports.iter().map(|r| r.accusations).sum();
    println!(
        "{} seeds from {first} (mutant {}): {} passed, {} failed; {delivered} messages delivered, \
         {accusations} accusations",
        reports.len(),
        mutant.name(),
        reports.len() - failed.len(),
        failed.len()
    );
    println!("counters: {total:?}");
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        let mut f = failed;
        f.sort();
        println!("failed seeds: {f:?}");
        ExitCode::FAILURE
    }
}
