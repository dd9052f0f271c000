//! `redoubt demo --vip`: virtual-address fail-over (`redoubt vip`, docs/vip.md) on this one
//! machine. Three members and a client, each in its own network namespace on a bridge; six
//! virtual addresses; the client pings each every 10 ms. A member's host crashes, comes back,
//! and another member leaves; after each, where the addresses went and how long the client
//! went unanswered. Needs root (network namespaces, addresses, raw sockets).

use anyhow::Context as _;
use redoubt_vip::lab::{is_root, measure, wait_for, Lab, LabSpec, Measured, Prober};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const MEMBERS: usize = 3;
const ADDRESSES: usize = 6;
/// The settings of docs/vip.md's measurements (the paper's tuned Spread).
const HEARTBEAT_MS: u64 = 400;
const SUSPECT_MS: u64 = 1000;
/// How long a fault's addresses may take to answer again before the demo fails.
const FAIL_OVER_LIMIT: Duration = Duration::from_secs(10);

/// One line of the summary.
struct Row {
    event: String,
    moved: usize,
    measured: Measured,
}

pub fn run(keep: Option<&Path>) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        is_root(),
        "the vip demo builds network namespaces and moves addresses between them: run it as \
         root (sudo redoubt demo --vip)"
    );
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let dir = match keep {
        Some(d) => d.to_path_buf(),
        None => std::env::temp_dir().join(format!("redoubt-demo-vip-{}", std::process::id())),
    };
    let spec = LabSpec {
        members: MEMBERS,
        addresses: ADDRESSES,
        heartbeat_ms: HEARTBEAT_MS,
        suspect_ms: SUSPECT_MS,
    };
    println!(
        "Virtual-address fail-over: {MEMBERS} members of `redoubt vip` and a client, each in a \
         network namespace of its own on one bridge (10.213.0.0/24); {ADDRESSES} virtual \
         addresses; heartbeat {HEARTBEAT_MS} ms, suspicion after {SUSPECT_MS} ms. The client \
         pings every address every 10 ms."
    );
    let mut lab = Lab::create(&spec, vec![exe.into(), "vip".into()], dir)
        .map_err(|e| anyhow::anyhow!("cannot build the network: {e}"))?;
    if keep.is_some() {
        lab.keep_dir();
    }
    match story(&mut lab) {
        Ok(rows) => {
            summary(&rows);
            println!(
                "OK: every address was held by exactly one member after each fault and answered \
                 the client again; the client's ARP cache named each new holder."
            );
            if keep.is_some() {
                println!(
                    "The group's file and the members' logs are in {}",
                    lab.dir().display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("FAILED: {e:#}\n{}", lab.logs());
            Ok(ExitCode::FAILURE)
        }
    }
}

fn story(lab: &mut Lab) -> anyhow::Result<Vec<Row>> {
    for i in 0..MEMBERS {
        lab.start_member(i).map_err(anyhow::Error::msg)?;
    }
    let started = Instant::now();
    anyhow::ensure!(
        wait_for(Duration::from_secs(15), || lab.balanced()),
        "no balanced allocation within 15 s: {:?}",
        lab.holders()
    );
    println!(
        "[{:>5} ms] the members formed a group and shared the addresses: {}",
        started.elapsed().as_millis(),
        allocation(lab)
    );
    let mut prober = Prober::start(lab.client_ns(), lab.vips().to_vec());
    anyhow::ensure!(
        wait_for(Duration::from_secs(5), || prober
            .all_answer(ADDRESSES, Duration::from_millis(100))),
        "the client cannot reach every address"
    );
    let mut rows = Vec::new();

    // A host crash: its link goes down and its daemon is killed.
    let victim = 1;
    let before = lab.holders();
    let gone = held_by(&before, victim);
    let t0 = lab.crash_member(victim).map_err(anyhow::Error::msg)?;
    println!("member {victim} crashes (its link down, its daemon killed with SIGKILL)");
    let m = measure(lab, &prober, &gone, t0, FAIL_OVER_LIMIT).map_err(anyhow::Error::msg)?;
    check_arp(lab, &gone)?;
    println!(
        "[{:>5} ms] its {} addresses are on the survivors; all answer after {} ms: {}",
        m.assigned_ms,
        gone.len(),
        m.reachable_ms,
        allocation(lab)
    );
    rows.push(Row {
        event: format!("member {victim} crashes"),
        moved: gone.len(),
        measured: m,
    });

    // The host comes back: the group takes it in and gives it its share again.
    std::thread::sleep(Duration::from_millis(1000));
    lab.restart_member(victim).map_err(anyhow::Error::msg)?;
    let t0 = Instant::now();
    println!("member {victim} comes back");
    anyhow::ensure!(
        wait_for(FAIL_OVER_LIMIT, || held_by(&lab.holders(), victim).len()
            == ADDRESSES / MEMBERS
            && lab.balanced()),
        "member {victim} got no share back within {} s: {:?}",
        FAIL_OVER_LIMIT.as_secs(),
        lab.holders()
    );
    let assigned = t0.elapsed();
    let moved = held_by(&lab.holders(), victim);
    anyhow::ensure!(
        wait_for(FAIL_OVER_LIMIT, || moved
            .iter()
            .all(|k| prober.first_after(*k, t0 + assigned).is_some())),
        "the addresses given back to member {victim} do not answer"
    );
    std::thread::sleep(Duration::from_millis(200));
    check_arp(lab, &moved)?;
    let end = Instant::now();
    let reachable = moved
        .iter()
        .filter_map(|k| prober.first_after(*k, t0 + assigned))
        .map(|t| t - t0)
        .max()
        .unwrap_or_default();
    let interruption = moved
        .iter()
        .map(|k| prober.longest_gap(*k, t0, end))
        .max()
        .unwrap_or_default();
    println!(
        "[{:>5} ms] it holds {} addresses again (moved to it only once their holders had \
         released them; client interruption {} ms): {}",
        assigned.as_millis(),
        moved.len(),
        interruption.as_millis(),
        allocation(lab)
    );
    rows.push(Row {
        event: format!("member {victim} comes back"),
        moved: moved.len(),
        measured: Measured {
            assigned_ms: assigned.as_millis(),
            reachable_ms: reachable.as_millis(),
            interruption_ms: interruption.as_millis(),
        },
    });

    // A voluntary leave: SIGTERM; the member releases its addresses and says so.
    std::thread::sleep(Duration::from_millis(700));
    let leaver = 2;
    let gone = held_by(&lab.holders(), leaver);
    let (t0, mut child) = lab.leave_member(leaver).map_err(anyhow::Error::msg)?;
    println!("member {leaver} leaves (SIGTERM)");
    let m = measure(lab, &prober, &gone, t0, FAIL_OVER_LIMIT).map_err(anyhow::Error::msg)?;
    let status = child.wait().context("waiting for the leaving member")?;
    anyhow::ensure!(status.success(), "the leaving member exited with {status}");
    check_arp(lab, &gone)?;
    println!(
        "[{:>5} ms] its {} addresses are on the others; all answer after {} ms: {}",
        m.assigned_ms,
        gone.len(),
        m.reachable_ms,
        allocation(lab)
    );
    rows.push(Row {
        event: format!("member {leaver} leaves"),
        moved: gone.len(),
        measured: m,
    });
    anyhow::ensure!(
        lab.balanced(),
        "not balanced at the end: {:?}",
        lab.holders()
    );
    prober.stop().map_err(anyhow::Error::msg)?;
    Ok(rows)
}

/// The indices of the addresses `member` alone holds.
fn held_by(holders: &[Vec<usize>], member: usize) -> Vec<usize> {
    (0..holders.len())
        .filter(|k| holders[*k] == [member])
        .collect()
}

/// "member 0: .100 .103, member 1: ..." for the running members.
fn allocation(lab: &Lab) -> String {
    let h = lab.holders();
    (0..lab.members())
        .filter_map(|i| {
            let mine: Vec<String> = held_by(&h, i)
                .iter()
                .map(|k| format!(".{}", lab.vips()[*k].octets()[3]))
                .collect();
            (!mine.is_empty()).then(|| format!("member {i} {}", mine.join(" ")))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The client's ARP cache names each address's holder (the gratuitous ARP reached it).
fn check_arp(lab: &Lab, addresses: &[usize]) -> anyhow::Result<()> {
    let h = lab.holders();
    for k in addresses {
        let vip = lab.vips()[*k];
        let [holder] = h[*k][..] else {
            anyhow::bail!("{vip} is held by {:?}", h[*k]);
        };
        let (cached, mac) = (lab.client_arp(vip), lab.member_mac(holder));
        anyhow::ensure!(
            cached == mac,
            "the client's ARP cache names {cached} for {vip}, its holder member {holder} is {mac}"
        );
    }
    Ok(())
}

fn summary(rows: &[Row]) {
    println!();
    println!(
        "{:<24} {:>9} {:>16} {:>16} {:>24}",
        "event", "addresses", "held again (ms)", "answering (ms)", "client interruption (ms)"
    );
    for r in rows {
        println!(
            "{:<24} {:>9} {:>16} {:>16} {:>24}",
            r.event,
            r.moved,
            r.measured.assigned_ms,
            r.measured.reachable_ms,
            r.measured.interruption_ms
        );
    }
    println!();
}
