//! `redoubt-sim`: run the deterministic simulator.
//!
//! ```text
//! redoubt-sim --seeds 10000                 # many random seeds; ends with "N passed, M failed"
//! redoubt-sim --seed 42 --trace             # replay one seed and print its trace
//! redoubt-sim --mutant commit-quorum        # a deliberately broken core: must fail
//! redoubt-sim --scenario primary-crash      # a named scenario
//! ```

use clap::Parser;
use redoubt_core::Mutant;
use redoubt_sim::runner::{mutant_by_name, run, run_seeds, scenario_for, Optimizations};
use redoubt_sim::Scenario;
use std::io::Write;
use std::process::ExitCode;

/// Default seed budget of a run (also the budget within which every mutant must be caught).
const DEFAULT_SEEDS: u64 = 1000;

#[derive(Parser)]
#[command(
    name = "redoubt-sim",
    about = "Deterministic Byzantine simulator for redoubt"
)]
struct Args {
    /// Number of random seeds to run.
    #[arg(long)]
    seeds: Option<u64>,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start_seed: u64,
    /// Run exactly this seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Print the full trace of the run (with --seed or --scenario).
    #[arg(long)]
    trace: bool,
    /// Run a deliberately broken core (see --list for every mutant).
    #[arg(long)]
    mutant: Option<String>,
    /// With --seed or --scenario: force request and reply bodies sealed ("sealed") or in clear
    /// ("clear") instead of the seed's draw (replays seeds found before the draw existed).
    #[arg(long, value_parser = ["sealed", "clear"])]
    bodies: Option<String>,
    /// Switch every optimization on in every random seed (read-only fast path, digest
    /// replies, tentative execution, requests beside the pre-prepare from 32 bytes) instead
    /// of drawing them per seed.
    #[arg(long, conflicts_with_all = ["quiet_primary", "hybrid"])]
    all_optimizations: bool,
    /// Like --all-optimizations but with tentative execution off and a primary that leaves
    /// first replies to the backups (primary_replies = false) in every random seed.
    #[arg(long, conflicts_with = "hybrid")]
    quiet_primary: bool,
    /// Like --all-optimizations but with tentative execution only for batches of up to 1 to 4
    /// requests (by seed) and a primary that leaves first replies to larger batches to the
    /// backups, as the default configuration does.
    #[arg(long)]
    hybrid: bool,
    /// Run every random seed in the separated deployment: the replicas only order, 2g+1
    /// execution nodes (up to g of them faulty) run the service (per-seed optimizations;
    /// with --ordering prime, Prime orders).
    #[arg(long, conflicts_with_all = ["all_optimizations", "quiet_primary", "hybrid"])]
    separated: bool,
    /// Run every random seed in the firewall deployment: the separated deployment with
    /// sealed bodies and an (h+1)² array of filter nodes between the clusters (up to h of
    /// them faulty).
    #[arg(long, conflicts_with_all = ["all_optimizations", "quiet_primary", "hybrid", "separated"])]
    firewall: bool,
    /// The ordering protocol of every random seed: pbft (default) or prime (ADR 0007; the
    /// seed's other draws kept, tentative execution off).
    #[arg(long, value_parser = ["pbft", "prime"], default_value = "pbft",
          conflicts_with_all = ["all_optimizations", "quiet_primary", "hybrid"])]
    ordering: String,
    /// With --ordering prime: also check that correct clients' updates received by a correct
    /// replica after stabilisation execute within the bound computed from the simulated
    /// delays (Prime's promise; see docs/simulator.md).
    #[arg(long)]
    bounded_delay: bool,
    /// Run a named scenario (see --list).
    #[arg(long)]
    scenario: Option<String>,
    /// List the named scenarios and mutants.
    #[arg(long)]
    list: bool,
    /// Print the scenario of --seed or --scenario and exit without running it.
    #[arg(long)]
    show_scenario: bool,
    /// Worker threads (default: available cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Stop after this many failures (useful with mutants).
    #[arg(long)]
    stop_after: Option<u64>,
    /// Print one line per seed on stdout: its verdict and every figure of its run. Two
    /// builds whose lines are identical (sorted by seed) behaved alike on those seeds; a
    /// refactoring of the core is checked that way.
    #[arg(long)]
    per_seed: bool,
    /// Wide-area sites as logical machines (ADR 0010): 4 sites, global Prime, the
    /// erasure-coded or naive link, faulty servers and sites. Mutants: --list.
    #[arg(long, conflicts_with_all = ["all_optimizations", "quiet_primary", "hybrid", "separated", "firewall", "scenario"])]
    sites: bool,
    /// With --sites: run every logical link in one fault-free scenario (4 and 7 servers per
    /// site) and print what each costs on the wide area.
    #[arg(long, requires = "sites")]
    link_costs: bool,
}

impl Args {
    fn optimizations(&self) -> Optimizations {
        if self.quiet_primary {
            Optimizations::QuietPrimary
        } else if self.hybrid {
            Optimizations::Hybrid
        } else if self.all_optimizations {
            Optimizations::All
        } else if self.firewall && self.ordering == "prime" {
            Optimizations::PrimeFirewall
        } else if self.separated && self.ordering == "prime" {
            Optimizations::PrimeSeparated
        } else if self.separated {
            Optimizations::Separated
        } else if self.firewall {
            Optimizations::Firewall
        } else if self.ordering == "prime" && self.bounded_delay {
            Optimizations::PrimeBounded
        } else if self.ordering == "prime" {
            Optimizations::Prime
        } else {
            Optimizations::PerSeed
        }
    }
}

/// `--sites`: one seed (with `--seed`) or many.
fn run_sites(args: &Args) -> ExitCode {
    use redoubt_sim::sites::{run, SitesScenario};
    let mutant = match args.mutant.as_deref() {
        None => redoubt_sites::Mutant::None,
        Some(name) => match redoubt_sites::Mutant::ALL.iter().find(|(n, _)| *n == name) {
            Some((_, m)) => *m,
            None => {
                eprintln!("unknown sites mutant {name:?}; try --list");
                return ExitCode::from(2);
            }
        },
    };
    if args.link_costs {
        println!("| link | servers per site | updates | WAN frames | WAN bytes | message bytes | overhead |");
        println!("|---|---|---|---|---|---|---|");
        for c in redoubt_sim::sites::link_costs() {
            println!(
                "| {:?} | {} | {} | {} | {} | {} | {:.2} |",
                c.link,
                c.servers,
                c.updates,
                c.wan_frames,
                c.wan_bytes,
                c.message_bytes,
                c.overhead()
            );
        }
        return ExitCode::SUCCESS;
    }
    let print = |out: &redoubt_sim::sites::SitesOutcome| {
        println!(
            "seed {} (sites: {}): {} updates acknowledged in {} rounds, {} events ordered, {} WAN frames, {} servers blacklisted",
            out.seed, out.summary, out.updates_acked, out.rounds, out.events, out.wan_frames, out.blacklisted
        );
        for v in &out.violations {
            println!("VIOLATION: {v}");
        }
        for line in &out.state {
            println!("  {line}");
        }
    };
    if let Some(seed) = args.seed {
        let out = run(SitesScenario::draw(seed, mutant));
        print(&out);
        println!(
            "{} passed, {} failed",
            out.passed() as u32,
            !out.passed() as u32
        );
        return if out.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let count = args.seeds.unwrap_or(DEFAULT_SEEDS);
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let next = std::sync::atomic::AtomicU64::new(args.start_seed);
    let end = args.start_seed + count;
    let failed = std::sync::Mutex::new(Vec::new());
    let ran = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if seed >= end {
                    return;
                }
                if args
                    .stop_after
                    .is_some_and(|n| failed.lock().expect("lock").len() as u64 >= n)
                {
                    return;
                }
                let out = run(SitesScenario::draw(seed, mutant));
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if args.per_seed || !out.passed() {
                    print(&out);
                }
                if !out.passed() {
                    failed.lock().expect("lock").push(seed);
                }
            });
        }
    });
    let failed = failed.into_inner().expect("lock");
    let ran = ran.into_inner() as usize;
    println!(
        "{} passed, {} failed",
        ran.saturating_sub(failed.len()),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.sites && !args.list {
        return run_sites(&args);
    }
    if args.list {
        println!("scenarios:");
        for s in Scenario::NAMED {
            println!("  {s}");
        }
        println!("mutants:");
        for (n, _) in Mutant::ALL {
            println!("  {n}");
        }
        println!("mutants with --sites:");
        for (n, _) in redoubt_sites::Mutant::ALL {
            println!("  {n}");
        }
        return ExitCode::SUCCESS;
    }
    let mutant = match args.mutant.as_deref() {
        None => Mutant::None,
        Some(name) => match mutant_by_name(name) {
            Some(m) => m,
            None => {
                eprintln!("unknown mutant {name:?}; try --list");
                return ExitCode::from(2);
            }
        },
    };
    if args.seed.is_some() || args.scenario.is_some() {
        let seed = args.seed.unwrap_or(args.start_seed);
        let sc = match &args.scenario {
            Some(name) => match Scenario::named(name, seed) {
                Some(mut s) => {
                    s.mutant = mutant;
                    s
                }
                None => {
                    eprintln!("unknown scenario {name:?}; try --list");
                    return ExitCode::from(2);
                }
            },
            None => scenario_for(seed, mutant, args.optimizations()),
        };
        let mut sc = sc;
        if let Some(b) = &args.bodies {
            sc.core.confidential_bodies = b == "sealed";
        }
        if args.trace || args.show_scenario {
            println!("scenario: {sc:#?}");
        }
        if args.show_scenario {
            return ExitCode::SUCCESS;
        }
        let mut collusion = None;
        let sc_holder_delay_ms = sc.holder_delay_ms;
        let out = if args.scenario.as_deref() == Some("colluding-client") {
            let report = redoubt_sim::runner::colluding_client(seed, args.trace);
            let line = format!(
                "  correct clients' operations in the 60 s window: {} under attack, {} without \
                 it (same seed), ratio {:.3}; {} view changes under attack (max view {})",
                report.attack_ops,
                report.control_ops,
                report.ratio,
                report.view_changes,
                report.attack.stats.max_view
            );
            collusion = Some(line);
            report.attack
        } else {
            run(sc, args.trace)
        };
        let stdout = std::io::stdout();
        let mut w = stdout.lock();
        for line in &out.trace {
            let _ = writeln!(w, "{line}");
        }
        let _ = writeln!(
            w,
            "seed {} ({}): {} ops, {} view changes (max view {}), {} state transfers, {} tentative batches undone, {} requests doubted, {} messages, {} rejected, {}ms simulated",
            out.seed,
            out.scenario,
            out.stats.ops_completed,
            out.stats.view_changes,
            out.stats.max_view,
            out.stats.state_transfers,
            out.stats.tentative_undone,
            out.stats.requests_doubted,
            out.stats.messages,
            out.stats.rejected,
            out.stats.sim_time_ms
        );
        if let Some(line) = collusion {
            let _ = writeln!(w, "{line}");
        }
        if out.stats.compromises > 0 {
            let _ = writeln!(
                w,
                "  proactive recovery: {} compromises, {} recoveries (longest {}ms), forged frames: {} after their receiver re-keyed (all rejected), {} before",
                out.stats.compromises,
                out.stats.recoveries,
                out.stats.recovery_max_ms,
                out.stats.forged_after_rekey,
                out.stats.forged_before_rekey
            );
        }
        if out.stats.planted_sent + out.stats.planted_held > 0 {
            let _ = writeln!(
                w,
                "  planting: {} frames planted, {} kept back ({} released after their sender recovered), {} coordinated planted-view-change attacks",
                out.stats.planted_sent,
                out.stats.planted_held,
                out.stats.planted_released,
                out.stats.join_attacks
            );
        }
        if out.stats.new_keys_replayed > 0 {
            let _ = writeln!(
                w,
                "  {} old NEW-KEYs replayed to replicas right after they rebooted",
                out.stats.new_keys_replayed
            );
        }
        if out.stats.holder_calls > 0 {
            let _ = writeln!(
                w,
                "  {} key-holder calls answered up to {}ms late, {} answers lost to a restart",
                out.stats.holder_calls, sc_holder_delay_ms, out.stats.holder_answers_lost
            );
        }
        if out.stats.power_cuts_mid_step > 0 {
            let _ = writeln!(
                w,
                "  {} power failures in the middle of a step (a prefix of its writes kept)",
                out.stats.power_cuts_mid_step
            );
        }
        if out.stats.disk_tampered > 0 {
            let _ = writeln!(
                w,
                "  disk tampering: {} journals or page stores rewritten before a watchdog reboot",
                out.stats.disk_tampered
            );
        }
        for v in &out.violations {
            let _ = writeln!(w, "VIOLATION: {v}");
        }
        let _ = writeln!(
            w,
            "{} passed, {} failed",
            out.passed() as u32,
            !out.passed() as u32
        );
        return if out.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let count = args.seeds.unwrap_or(DEFAULT_SEEDS);
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let started = std::time::Instant::now();
    let done = std::sync::atomic::AtomicU64::new(0);
    let summary = run_seeds(
        args.start_seed,
        count,
        mutant,
        args.optimizations(),
        jobs,
        args.stop_after,
        |out| {
            let d = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            if args.per_seed {
                let verdict = out.violations.first().map_or("passed", String::as_str);
                println!("seed {} {}: {:?}", out.seed, verdict, out.stats);
            }
            if !out.passed() {
                eprintln!("seed {} FAILED: {}", out.seed, out.violations[0]);
            }
            if d.is_multiple_of(100) {
                eprintln!(
                    "  {d}/{count} seeds, {:.0}s",
                    started.elapsed().as_secs_f64()
                );
            }
        },
    );
    if !summary.failures.is_empty() {
        println!("failing seeds (replay with `redoubt-sim --seed S --trace`):");
        let holes: std::collections::BTreeMap<u64, &str> = summary.holes.iter().copied().collect();
        for (seed, v) in summary.failures.iter().take(40) {
            match holes.get(seed) {
                Some(h) => println!("  {seed} [open hole: {h}]: {v}"),
                None => println!("  {seed}: {v}"),
            }
        }
        let mut by_hole: std::collections::BTreeMap<&str, u64> = Default::default();
        for (_, h) in &summary.holes {
            *by_hole.entry(h).or_default() += 1;
        }
        for (h, n) in by_hole {
            println!("  {n} failing seeds draw an attack on an open hole of the core: {h}");
        }
    }
    println!(
        "{} ops, {} view changes, {} state transfers, {} tentative batches undone in {:.1}s",
        summary.ops,
        summary.view_changes,
        summary.state_transfers,
        summary.tentative_undone,
        started.elapsed().as_secs_f64()
    );
    println!(
        "{} passed, {} failed ({} not explained by an open hole)",
        summary.passed, summary.failed, summary.unexplained
    );
    if summary.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
