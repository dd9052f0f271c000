//! Fail-over on a real (virtual) LAN: three `redoubt-vip` daemons and a client, each in its
//! own network namespace, joined by veth pairs to a bridge (`redoubt_vip::lab`). The client
//! pings every virtual address every 10 ms. The test
//!
//! 1. waits until the six addresses are held once each, two per member;
//! 2. crashes a member (SIGKILL, and its link goes down: the host is gone) and measures the
//!    time until its addresses are configured on the survivors and answer the client again,
//!    which needs the gratuitous ARP (the client's cache still names the dead host's MAC);
//! 3. stops another member with SIGTERM (a voluntary leave) and measures the same.
//!
//! Needs root and `ip netns`; otherwise it prints why and passes. Namespaces are removed even
//! when the test fails.

use redoubt_vip::lab::{is_root, measure, wait_for, Lab, LabSpec, Prober};
use std::time::{Duration, Instant};

const MEMBERS: usize = 3;
const VIPS: usize = 6;
const HEARTBEAT_MS: u64 = 400;
const SUSPECT_MS: u64 = 1000;

#[test]
fn fail_over_in_network_namespaces() {
    if !is_root() {
        println!("skipping the namespace test: it needs root (ip netns, raw sockets)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("redoubt-vip-netns-{}", std::process::id()));
    let spec = LabSpec {
        members: MEMBERS,
        addresses: VIPS,
        heartbeat_ms: HEARTBEAT_MS,
        suspect_ms: SUSPECT_MS,
    };
    let daemon = vec![env!("CARGO_BIN_EXE_redoubt-vip").into()];
    let mut lab = match Lab::create(&spec, daemon, dir) {
        Ok(lab) => lab,
        Err(e) => {
            println!("skipping the namespace test: cannot build the network: {e}");
            return;
        }
    };
    for i in 0..MEMBERS {
        lab.start_member(i).unwrap();
    }

    // 1. Every address held once, two per member.
    let started = Instant::now();
    let ok = wait_for(Duration::from_secs(15), || {
        let h = lab.holders();
        h.iter().all(|x| x.len() == 1)
            && (0..MEMBERS).all(|i| h.iter().filter(|x| x[0] == i).count() == 2)
    });
    assert!(
        ok,
        "no balanced allocation: {:?}\n{}",
        lab.holders(),
        lab.logs()
    );
    println!(
        "allocated 6 addresses over 3 members in {} ms",
        started.elapsed().as_millis()
    );
    let mut prober = Prober::start(lab.client_ns(), lab.vips().to_vec());
    let ok = wait_for(Duration::from_secs(5), || {
        prober.all_answer(VIPS, Duration::from_millis(100))
    });
    assert!(ok, "the client cannot reach every address");

    // 2. Crash: SIGKILL, and the host's link goes down with it.
    let victim = 1;
    let holders = lab.holders();
    let gone: Vec<usize> = (0..VIPS).filter(|k| holders[*k] == [victim]).collect();
    // At an arbitrary point of the heartbeat cycle, so that runs spread over the detection
    // range (suspect_ms - heartbeat_ms to suspect_ms after the victim's last beat).
    let phase = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    std::thread::sleep(Duration::from_millis(u64::from(phase) % HEARTBEAT_MS));
    let t0 = lab.crash_member(victim).unwrap();
    let crash = measure(&lab, &prober, &gone, t0, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    let h = lab.holders();
    assert!(h.iter().all(|x| x.len() == 1), "after the crash: {h:?}");
    for k in &gone {
        let holder = h[*k][0];
        assert_eq!(
            lab.client_arp(lab.vips()[*k]),
            lab.member_mac(holder),
            "the client's ARP cache names the new holder of {}",
            lab.vips()[*k]
        );
    }

    // 3. Voluntary leave: SIGTERM; the member releases, tells the others and exits. (After
    // the last gratuitous ARP of the crash, so the two measurements do not overlap.)
    std::thread::sleep(Duration::from_millis(700));
    let leaver = 2;
    let gone: Vec<usize> = (0..VIPS).filter(|k| h[*k] == [leaver]).collect();
    assert_eq!(gone.len(), 3, "{h:?}");
    let (t0, mut child) = lab.leave_member(leaver).unwrap();
    let leave = measure(&lab, &prober, &gone, t0, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.logs()));
    let status = child.wait().unwrap();
    assert!(status.success(), "the leaving member exited with {status}");
    let h = lab.holders();
    assert!(
        h.iter().all(|x| x == &[0]),
        "the last member holds everything: {h:?}"
    );
    prober.stop().unwrap();

    println!(
        "crash (SIGKILL + link down), heartbeat_ms {HEARTBEAT_MS}, suspect_ms {SUSPECT_MS}: \
         addresses on survivors after {} ms, reachable after {} ms (client interruption {} ms)",
        crash.assigned_ms, crash.reachable_ms, crash.interruption_ms
    );
    println!(
        "voluntary leave (SIGTERM): addresses on survivor after {} ms, reachable after {} ms \
         (client interruption {} ms)",
        leave.assigned_ms, leave.reachable_ms, leave.interruption_ms
    );
    // Detection takes between suspect_ms - heartbeat_ms and suspect_ms; the rest is a view
    // change, two `ip` runs and ARP. Without gratuitous ARP the client would keep the dead
    // host's MAC for many seconds (reachable_time, then delay_first_probe_time).
    assert!(
        crash.reachable_ms + 50 >= u128::from(SUSPECT_MS - HEARTBEAT_MS),
        "a reply {} ms after the crash came before anyone could have suspected it",
        crash.reachable_ms
    );
    assert!(
        crash.reachable_ms < u128::from(SUSPECT_MS) + 1000,
        "crash fail-over took {} ms\n{}",
        crash.reachable_ms,
        lab.logs()
    );
    // A leave involves no timeout at all.
    assert!(
        leave.reachable_ms < u128::from(SUSPECT_MS - HEARTBEAT_MS),
        "leave fail-over took {} ms\n{}",
        leave.reachable_ms,
        lab.logs()
    );
}
