//! `redoubt bench andrew`: the Andrew benchmark (Howard et al. 1988), as the BFT papers ran it
//! on BFS, on three file systems in one run: redoubt's replicated file system mounted with
//! FUSE (n = 4, f = 1, all on this machine), the same FUSE layer over the same file service
//! unreplicated in the mount's process (`redoubt mount --local`), and the plain local file
//! system for reference.
//!
//! The five phases: (1) create the directory tree, (2) copy a source tree into it, (3) stat
//! every file, (4) read every byte, (5) compile and link it with `make -j1` and `cc`. The
//! source tree is C generated here (deterministic: no download), `--dirs` directories of
//! `--files` files each with a header per directory, a main program and a Makefile; the
//! linked program runs at the end and must print the same checksum on every file system.

use super::measure::{source_commit, KillOnDrop, Progress, COLORS};
use super::versus::{make_cluster, start, System};
use anyhow::Context as _;
use clap::Args;
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct AndrewArgs {
    /// A smoke run under a minute: a small tree, one run per file system
    #[arg(long)]
    quick: bool,
    /// Directories of the generated source tree [default: 20; quick: 4]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    dirs: Option<u32>,
    /// C files per directory [default: 10; quick: 4]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    files: Option<u32>,
    /// Runs of the five phases on each file system; the tables show each phase's median
    /// [default: 3; quick: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: Option<u32>,
    /// Client ids of the redoubt mount: requests it has in flight at once
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    mount_clients: u32,
    /// Sync the replicas' journals (the baselines keep everything in memory either way)
    #[arg(long)]
    fsync: bool,
    /// Mount both FUSE file systems with `--write-through`: every write sent before
    /// `write(2)` returns, instead of held until close
    #[arg(long)]
    write_through: bool,
    /// Override a setting of the benchmarked cluster (repeatable; see docs/configuration.md)
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// Kill this replica once the cluster is up and never restart it: the redoubt mount runs
    /// every phase with a tolerated fault (at most f = 1), e.g. `--down 3`
    #[arg(long, value_delimiter = ',', value_name = "ID")]
    down: Vec<u32>,
    /// Directory for andrew.md, andrew.csv and andrew.svg
    #[arg(long, value_name = "DIR", default_value = "bench-andrew")]
    out: PathBuf,
}

const PHASES: [&str; 5] = ["mkdir", "copy", "stat", "read", "make"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fs {
    Plain,
    LocalFuse,
    Redoubt,
}

impl Fs {
    fn name(self) -> &'static str {
        match self {
            Fs::Plain => "plain",
            Fs::LocalFuse => "fuse-local",
            Fs::Redoubt => "redoubt",
        }
    }

    fn legend(self) -> &'static str {
        match self {
            Fs::Plain => "local file system (no FUSE)",
            Fs::LocalFuse => "FUSE, unreplicated (mount --local)",
            Fs::Redoubt => "FUSE, redoubt (n = 4)",
        }
    }
}

/// The seconds of each phase of one run.
type Run = [f64; 5];

pub fn run(args: AndrewArgs) -> anyhow::Result<ExitCode> {
    redoubt_localcluster::runtime(2)?.block_on(andrew(args))
}

async fn andrew(args: AndrewArgs) -> anyhow::Result<ExitCode> {
    let dirs = args.dirs.unwrap_or(if args.quick { 4 } else { 20 });
    let files = args.files.unwrap_or(if args.quick { 4 } else { 10 });
    let runs = args.runs.unwrap_or(if args.quick { 1 } else { 3 });
    let cluster = make_cluster(
        "andrew",
        "files",
        args.mount_clients,
        args.fsync,
        &args.sets,
        &args.down,
    )?;
    let work = cluster.dir.join("andrew");
    std::fs::create_dir(&work)?;
    redoubt_fusefs::check_can_mount(&work)?;
    let tree = SourceTree::generate(&work.join("source"), dirs, files)?;
    println!(
        "redoubt bench andrew: the five phases on the plain file system, an unreplicated FUSE mount and redoubt's (n = 4, f = 1, journal fsync {}), on {} cores, {runs} run(s) each",
        if args.fsync { "on" } else { "off" },
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    println!(
        "  source tree: {} directories, {} files, {} KiB; compiled with `make -j1` and `{}`",
        tree.dirs.len(),
        tree.files.len(),
        tree.bytes / 1024,
        cc_version()
    );

    // All three are up at once and the runs interleave, so that whatever else the machine
    // does meanwhile falls on each alike.
    const ALL: [Fs; 3] = [Fs::Plain, Fs::LocalFuse, Fs::Redoubt];
    let root = |fs: Fs| work.join(format!("fs-{}", fs.name()));
    let stats = |fs: Fs| cluster.dir.join(format!("calls-{}.csv", fs.name()));
    let mut procs = cluster.replicas();
    let system = if cluster.down.is_empty() {
        System::Redoubt
    } else {
        println!(
            "  redoubt with {} (killed once the cluster is up, never restarted)",
            cluster.down_label()
        );
        System::Degraded
    };
    start(system, &cluster, &mut procs, None, None).await?;
    let mut mounts = Vec::new();
    for fs in ALL {
        std::fs::create_dir(root(fs))?;
        let mut mount_args = match fs {
            Fs::Plain => continue,
            Fs::LocalFuse => vec![
                "--local".to_string(),
                "--size-mib".into(),
                cluster.cfg.state.size_mib.to_string(),
            ],
            Fs::Redoubt => vec![
                "--config".into(),
                cluster.config_path.display().to_string(),
                "--client".into(),
                format!("1-{}", args.mount_clients),
            ],
        };
        mount_args.extend(["--stats".into(), stats(fs).display().to_string()]);
        if args.write_through {
            mount_args.push("--write-through".into());
        }
        let log = cluster.dir.join(format!("mount-{}.log", fs.name()));
        mounts.push(MountChild::start(
            &cluster.exe,
            &mount_args,
            &root(fs),
            &log,
        )?);
    }
    let mut progress = Progress::new(ALL.len() * runs as usize);
    let mut results: Vec<(Fs, Vec<Run>)> = ALL.iter().map(|fs| (*fs, Vec::new())).collect();
    let mut checksums = Vec::new();
    for r in 0..runs {
        for (fs, fs_runs) in results.iter_mut() {
            let target = root(*fs).join(format!("run{r}"));
            let (times, sum) = tokio::task::block_in_place(|| tree.phases(&target))
                .with_context(|| format!("run {} on {}", r + 1, fs.legend()))?;
            checksums.push((*fs, sum));
            fs_runs.push(times);
            progress.step(&format!(
                "{} run {} ({:.1} s)",
                fs.name(),
                r + 1,
                times.iter().sum::<f64>()
            ));
        }
    }
    for m in mounts {
        m.stop()?;
    }
    procs.stop_all(Duration::from_secs(5));
    let calls: Vec<(Fs, Vec<OpCalls>)> = [Fs::LocalFuse, Fs::Redoubt]
        .into_iter()
        .map(|fs| Ok((fs, read_calls(&stats(fs))?)))
        .collect::<anyhow::Result<_>>()?;
    progress.finish();
    let first = &checksums[0].1;
    if let Some((fs, other)) = checksums.iter().find(|(_, s)| s != first) {
        anyhow::bail!(
            "the compiled program printed {other:?} on {} but {first:?} on the plain file system",
            fs.legend()
        );
    }

    let down = (!cluster.down.is_empty()).then(|| cluster.down_label());
    let report = report(&tree, runs, &results, &calls, down.as_deref());
    print!("{report}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut csv = String::from("fs,run,phase,seconds\n");
    for (fs, fs_runs) in &results {
        for (r, times) in fs_runs.iter().enumerate() {
            for (p, t) in PHASES.iter().zip(times) {
                let _ = writeln!(csv, "{},{},{p},{t:.4}", fs.name(), r + 1);
            }
        }
    }
    std::fs::write(args.out.join("andrew.csv"), csv)?;
    std::fs::write(args.out.join("andrew.md"), &report)?;
    std::fs::write(args.out.join("andrew.svg"), plot(&results))?;
    println!(
        "\nwrote {0}/andrew.md, {0}/andrew.csv and {0}/andrew.svg",
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Each phase's median over the runs, and the total of the medians.
fn medians(fs_runs: &[Run]) -> (Run, f64) {
    let mut out = [0.0; 5];
    for (p, m) in out.iter_mut().enumerate() {
        *m = median(fs_runs.iter().map(|r| r[p]).collect());
    }
    (out, out.iter().sum())
}

/// One operation's calls by a mount over all runs: name, count, failed, seconds.
type OpCalls = (String, u64, u64, f64);

/// The `--stats` file a mount wrote at its end.
fn read_calls(path: &Path) -> anyhow::Result<Vec<OpCalls>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the mount's statistics {}", path.display()))?;
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        anyhow::ensure!(f.len() == 4, "bad line {line:?} in {}", path.display());
        out.push((
            f[0].to_string(),
            f[1].parse()?,
            f[2].parse()?,
            f[3].parse()?,
        ));
    }
    Ok(out)
}

fn report(
    tree: &SourceTree,
    runs: u32,
    results: &[(Fs, Vec<Run>)],
    calls: &[(Fs, Vec<OpCalls>)],
    down: Option<&str>,
) -> String {
    let mut out = format!(
        "Run in a checkout at commit {} with `redoubt bench andrew{}`.{}\n\nSource tree: {} directories, {} files, {} KiB of C; `make -j1` with `{}`. Median of {runs} run(s) per file system, seconds:\n\n| phase |",
        source_commit(),
        std::env::args()
            .skip(3)
            .map(|a| format!(" {a}"))
            .collect::<String>(),
        down.map_or_else(String::new, |d| format!(
            " The redoubt mount ran with {d} (killed once the cluster was up, never restarted)."
        )),
        tree.dirs.len(),
        tree.files.len(),
        tree.bytes / 1024,
        cc_version(),
    );
    for (fs, _) in results {
        let _ = write!(out, " {} |", fs.legend());
    }
    out.push_str(" redoubt / FUSE unreplicated |\n|---|");
    out.push_str(&"---:|".repeat(results.len() + 1));
    out.push('\n');
    let med: Vec<(Run, f64)> = results.iter().map(|(_, r)| medians(r)).collect();
    let find = |want: Fs| results.iter().position(|(fs, _)| *fs == want);
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}", a / b)
        } else {
            "n/a".into()
        }
    };
    let rows = PHASES
        .iter()
        .enumerate()
        .map(|(p, name)| (format!("{} {name}", p + 1), p));
    for (label, p) in rows {
        let _ = write!(out, "| {label} |");
        for (m, _) in &med {
            let _ = write!(out, " {:.3} |", m[p]);
        }
        let r = match (find(Fs::Redoubt), find(Fs::LocalFuse)) {
            (Some(a), Some(b)) => ratio(med[a].0[p], med[b].0[p]),
            _ => "n/a".into(),
        };
        let _ = writeln!(out, " {r} |");
    }
    let _ = write!(out, "| **total** |");
    for (_, total) in &med {
        let _ = write!(out, " **{total:.3}** |");
    }
    let total_ratio = match (find(Fs::Redoubt), find(Fs::LocalFuse)) {
        (Some(a), Some(b)) => ratio(med[a].1, med[b].1),
        _ => "n/a".into(),
    };
    let _ = writeln!(out, " **{total_ratio}** |");
    if let (Some(a), Some(b), Some(c)) = (find(Fs::Redoubt), find(Fs::LocalFuse), find(Fs::Plain)) {
        let _ = writeln!(
            out,
            "\nredoubt took {:+.0}% of the unreplicated FUSE mount's time (aim: within 30%), {:.2}x the plain file system's; the unreplicated FUSE mount {:.2}x the plain file system's.",
            100.0 * (med[a].1 / med[b].1 - 1.0),
            med[a].1 / med[c].1,
            med[b].1 / med[c].1
        );
    }
    let _ = writeln!(
        out,
        "\nOperations the two FUSE mounts sent to the file service, per run (all five phases), and their mean time (ms); the redoubt mount's are each one replicated operation:\n\n| operation | unreplicated: per run | mean ms | redoubt: per run | mean ms | failed (ENOENT and the like) |\n|---|---:|---:|---:|---:|---:|"
    );
    let ops: std::collections::BTreeSet<&str> = calls
        .iter()
        .flat_map(|(_, c)| c.iter().map(|o| o.0.as_str()))
        .collect();
    let of = |fs: Fs, op: &str| {
        calls
            .iter()
            .find(|(f, _)| *f == fs)
            .and_then(|(_, c)| c.iter().find(|o| o.0 == op))
            .map_or((0, 0, 0.0), |o| (o.1, o.2, o.3))
    };
    let mut totals = [(0u64, 0.0f64); 2];
    for op in ops {
        let (l, r) = (of(Fs::LocalFuse, op), of(Fs::Redoubt, op));
        let mean = |(n, _, t): (u64, u64, f64)| if n > 0 { 1e3 * t / n as f64 } else { 0.0 };
        let _ = writeln!(
            out,
            "| {op} | {} | {:.3} | {} | {:.3} | {} |",
            l.0 / u64::from(runs),
            mean(l),
            r.0 / u64::from(runs),
            mean(r),
            r.1 / u64::from(runs)
        );
        totals[0].0 += l.0;
        totals[0].1 += l.2;
        totals[1].0 += r.0;
        totals[1].1 += r.2;
    }
    let _ = writeln!(
        out,
        "| **all** | {} | {:.2} s per run | {} | {:.2} s per run | |",
        totals[0].0 / u64::from(runs),
        totals[0].1 / f64::from(runs),
        totals[1].0 / u64::from(runs),
        totals[1].1 / f64::from(runs)
    );
    if runs > 1 {
        let _ = writeln!(out, "\nEvery run's total (seconds):\n");
        for (fs, fs_runs) in results {
            let totals: Vec<String> = fs_runs
                .iter()
                .map(|r| format!("{:.2}", r.iter().sum::<f64>()))
                .collect();
            let _ = writeln!(out, "- {}: {}", fs.legend(), totals.join(", "));
        }
    }
    out
}

/// One stacked horizontal bar per file system, a segment per phase (median seconds).
fn plot(results: &[(Fs, Vec<Run>)]) -> String {
    let (w, left, right, bar, gap, top) = (760.0, 250.0, 40.0, 34.0, 22.0, 60.0);
    let med: Vec<(Run, f64)> = results.iter().map(|(_, r)| medians(r)).collect();
    let max = med.iter().map(|m| m.1).fold(0.001, f64::max) * 1.08;
    let h = top + results.len() as f64 * (bar + gap) + 90.0;
    let x = |s: f64| left + (w - left - right) * s / max;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"26\" text-anchor=\"middle\" font-size=\"15\">Andrew benchmark: seconds per phase (median)</text>\n",
        w / 2.0
    );
    for (i, ((fs, _), (run, total))) in results.iter().zip(&med).enumerate() {
        let y = top + i as f64 * (bar + gap);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            left - 8.0,
            y + bar / 2.0 + 4.0,
            fs.legend()
        );
        let mut at = 0.0;
        for (p, s) in run.iter().enumerate() {
            let _ = writeln!(
                svg,
                "<rect x=\"{:.1}\" y=\"{y}\" width=\"{:.1}\" height=\"{bar}\" fill=\"{}\"><title>{} {s:.3} s</title></rect>",
                x(at),
                x(at + s) - x(at),
                COLORS[p],
                PHASES[p]
            );
            at += s;
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\">{total:.1} s</text>",
            x(at) + 4.0,
            y + bar / 2.0 + 4.0
        );
    }
    let axis = top + results.len() as f64 * (bar + gap);
    let _ = writeln!(
        svg,
        "<line x1=\"{left}\" y1=\"{axis}\" x2=\"{}\" y2=\"{axis}\" stroke=\"black\"/>",
        w - right
    );
    for i in 0..=5 {
        let v = max * i as f64 / 5.0;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{v:.0}</text>",
            x(v),
            axis + 16.0
        );
    }
    for (p, name) in PHASES.iter().enumerate() {
        let lx = left + p as f64 * 95.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{lx}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{} {name}</text>",
            axis + 34.0,
            COLORS[p],
            lx + 16.0,
            axis + 44.0,
            p + 1
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn cc_version() -> String {
    Command::new("cc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "cc (version unknown)".into())
}

/// The generated source tree: its directories and files (relative paths) on the plain file
/// system under `root`.
struct SourceTree {
    root: PathBuf,
    dirs: Vec<PathBuf>,
    files: Vec<PathBuf>,
    bytes: u64,
}

impl SourceTree {
    /// Writes `dirs` directories of `files` C files each, a header per directory, a common
    /// header, a main program and a Makefile.
    fn generate(root: &Path, dirs: u32, files: u32) -> anyhow::Result<SourceTree> {
        let mut tree = SourceTree {
            root: root.to_path_buf(),
            dirs: Vec::new(),
            files: Vec::new(),
            bytes: 0,
        };
        let mut objects = Vec::new();
        let mut calls = String::new();
        let mut decls = String::new();
        for d in 0..dirs {
            // Two levels, as a real tree: lib/dNN.
            let dir = PathBuf::from(format!("lib/d{d:02}"));
            if d == 0 {
                tree.dirs.push(PathBuf::from("lib"));
            }
            tree.dirs.push(dir.clone());
            let mut header =
                format!("#ifndef D{d}_H\n#define D{d}_H\n#include \"../../common.h\"\n");
            for f in 0..files {
                let func = format!("d{d}_f{f}");
                let _ = writeln!(header, "long {func}(long n);");
                let _ = writeln!(decls, "long {func}(long n);");
                let _ = writeln!(calls, "    sum = mix(sum, {func}({}));", 1000 + d * 7 + f);
                tree.add(&dir.join(format!("f{f}.c")), &c_file(d, f, files))?;
                objects.push(format!("{}/f{f}.o", dir.display()));
            }
            header.push_str("#endif\n");
            tree.add(&dir.join(format!("d{d:02}.h")), &header)?;
        }
        tree.add(Path::new("common.h"), COMMON_H)?;
        tree.add(
            Path::new("main.c"),
            &format!(
                "#include <stdio.h>\n#include \"common.h\"\n{decls}\nint main(void) {{\n    long sum = 0;\n{calls}    printf(\"andrew %ld\\n\", sum);\n    return 0;\n}}\n"
            ),
        )?;
        tree.add(
            Path::new("Makefile"),
            &format!(
                "CC = cc\nCFLAGS = -O1 -Wall\nOBJS = main.o {}\n\nandrew: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\n%.o: %.c common.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n",
                objects.join(" ")
            ),
        )?;
        Ok(tree)
    }

    fn add(&mut self, rel: &Path, text: &str) -> anyhow::Result<()> {
        let path = self.root.join(rel);
        std::fs::create_dir_all(path.parent().expect("a parent"))?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        self.files.push(rel.to_path_buf());
        self.bytes += text.len() as u64;
        Ok(())
    }

    /// Runs the five phases into `target` (which must not exist): their seconds, and what the
    /// compiled program printed.
    fn phases(&self, target: &Path) -> anyhow::Result<(Run, String)> {
        let mut times = [0.0; 5];
        let timed = |times: &mut Run, p: usize, f: &dyn Fn() -> anyhow::Result<()>| {
            let t = Instant::now();
            f().with_context(|| format!("phase {} ({})", p + 1, PHASES[p]))?;
            times[p] = t.elapsed().as_secs_f64();
            anyhow::Ok(())
        };
        timed(&mut times, 0, &|| {
            std::fs::create_dir(target)?;
            for d in &self.dirs {
                std::fs::create_dir(target.join(d))?;
            }
            Ok(())
        })?;
        timed(&mut times, 1, &|| {
            for f in &self.files {
                let bytes = std::fs::read(self.root.join(f))?;
                std::fs::write(target.join(f), bytes)?;
            }
            Ok(())
        })?;
        timed(&mut times, 2, &|| {
            let n = walk(target, &mut |_, _| Ok(()))?;
            anyhow::ensure!(n == self.files.len(), "stat saw {n} files");
            Ok(())
        })?;
        timed(&mut times, 3, &|| {
            let mut bytes = 0u64;
            walk(target, &mut |p, _| {
                bytes += std::fs::read(p)?.len() as u64;
                Ok(())
            })?;
            anyhow::ensure!(bytes == self.bytes, "read {bytes} bytes");
            Ok(())
        })?;
        timed(&mut times, 4, &|| {
            let out = Command::new("make")
                .args(["-j1", "-s"])
                .current_dir(target)
                .stdin(Stdio::null())
                .output()
                .context("cannot run make")?;
            anyhow::ensure!(
                out.status.success(),
                "make failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        })?;
        let out = Command::new(target.join("andrew"))
            .output()
            .context("cannot run the compiled program")?;
        Ok((
            times,
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    }
}

/// Stats every entry under `dir` (as `find -exec stat` would), calling `file` for each regular
/// file; the number of regular files.
fn walk(
    dir: &Path,
    file: &mut dyn FnMut(&Path, &std::fs::Metadata) -> anyhow::Result<()>,
) -> anyhow::Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let m = std::fs::symlink_metadata(&p)?;
        if m.is_dir() {
            n += walk(&p, file)?;
        } else if m.is_file() {
            file(&p, &m)?;
            n += 1;
        }
    }
    Ok(n)
}

const COMMON_H: &str = "#ifndef COMMON_H\n#define COMMON_H\n\
static inline long mix(long a, long b) { return (a * 1000003L) ^ (b + (a >> 7)); }\n\
struct pair { long key; long value; };\n#endif\n";

/// A C file of a few functions that give the compiler something to do: loops, a table, a
/// sort, arithmetic; `f{file}` of directory `d` exports `d{d}_f{file}`.
fn c_file(d: u32, file: u32, files: u32) -> String {
    let mut s = format!("#include \"d{d:02}.h\"\n\nstatic struct pair table_{file}[64];\n\n");
    for k in 0..6 {
        let _ = write!(
            s,
            "static long step{k}(long x, long y) {{\n    long acc = x;\n    for (int i = 0; i < {n}; i++) {{\n        if ((acc + i) % {m} == 0)\n            acc = mix(acc, y + i);\n        else\n            acc += (y ^ i) * {c} - (acc >> 3);\n    }}\n    return acc;\n}}\n\n",
            n = 16 + k * 3,
            m = 3 + k,
            c = 17 + d + file + k,
        );
    }
    let _ = write!(
        s,
        "static void sort_{file}(struct pair *p, int n) {{\n    for (int i = 1; i < n; i++) {{\n        struct pair v = p[i];\n        int j = i - 1;\n        while (j >= 0 && p[j].key > v.key) {{\n            p[j + 1] = p[j];\n            j--;\n        }}\n        p[j + 1] = v;\n    }}\n}}\n\n\
long d{d}_f{file}(long n) {{\n    long acc = n;\n    for (int i = 0; i < 64; i++) {{\n        table_{file}[i].key = (n * (i + 1) * 2654435761L) % 1000;\n        table_{file}[i].value = step{s0}(n, i);\n    }}\n    sort_{file}(table_{file}, 64);\n    for (int i = 0; i < 64; i++)\n        acc = mix(acc, table_{file}[i].value + step{s1}(table_{file}[i].key, {files}));\n    switch (acc & 7) {{\n",
        s0 = file % 6,
        s1 = (file + 3) % 6,
    );
    for case in 0..8 {
        let _ = writeln!(
            s,
            "    case {case}: acc = step{}(acc, {}); break;",
            case % 6,
            case * 11 + d
        );
    }
    s.push_str("    }\n    return acc;\n}\n");
    s
}

/// A `redoubt mount` process serving `root`; stopped with SIGTERM (its mount point is
/// detached should it not unmount).
struct MountChild {
    child: KillOnDrop,
    root: PathBuf,
}

impl MountChild {
    fn start(exe: &Path, args: &[String], root: &Path, log: &Path) -> anyhow::Result<MountChild> {
        let mut child = Command::new(exe)
            .arg("mount")
            .args(args)
            .arg(root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("cannot start redoubt mount")?;
        let stdout = child.stdout.take().expect("piped");
        let child = MountChild {
            child: KillOnDrop(child),
            root: root.to_path_buf(),
        };
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        anyhow::ensure!(
            line.starts_with("mounted"),
            "redoubt mount did not mount {}: {}",
            root.display(),
            std::fs::read_to_string(log).unwrap_or_default().trim()
        );
        Ok(child)
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: kill(2) on our child, not yet reaped.
        unsafe { libc::kill(self.child.0.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.0.try_wait()?.is_none() {
            anyhow::ensure!(Instant::now() < deadline, "redoubt mount did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for MountChild {
    fn drop(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
        if redoubt_fusefs::is_mount_point(&self.root) {
            let _ = redoubt_fusefs::unmount_path(&self.root);
        }
    }
}
