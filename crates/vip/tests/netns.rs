//! Fail-over on a real (virtual) LAN: three `redoubt-vip` daemons and a client, each in its
//! own network namespace, joined by veth pairs to a bridge in a fifth namespace. The client
//! pings every virtual address every 10 ms from a raw ICMP socket (the paper's method: a
//! request every 10 ms, interruption measured at the client). The test
//!
//! 1. waits until the six addresses are held once each, two per member;
//! 2. crashes a member (SIGKILL, and its link goes down: the host is gone) and measures the
//!    time until its addresses are configured on the survivors and answer the client again,
//!    which needs the gratuitous ARP (the client's cache still names the dead host's MAC);
//! 3. stops another member with SIGTERM (a voluntary leave) and measures the same.
//!
//! Needs root and `ip netns`; otherwise it prints why and passes. Namespaces are removed even
//! when the test fails.

use redoubt_vip::host::parse_inet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MEMBERS: usize = 3;
const VIPS: usize = 6;
const HEARTBEAT_MS: u64 = 400;
const SUSPECT_MS: u64 = 1000;
const PROBE_INTERVAL_MS: u64 = 10;

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Namespaces, daemons and files of one run; all removed on drop, pass or fail.
struct Lab {
    tag: String,
    namespaces: Vec<String>,
    members: Vec<Option<Child>>,
    dir: PathBuf,
}

impl Lab {
    fn ns(&self, name: &str) -> String {
        format!("{}-{name}", self.tag)
    }

    fn add_ns(&mut self, name: &str) -> Result<String, String> {
        let ns = self.ns(name);
        ip(&["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A host namespace with `eth0` (address `addr`/24) plugged into the bridge.
    fn add_host(&mut self, name: &str, port: &str, addr: Ipv4Addr) -> Result<String, String> {
        let ns = self.add_ns(name)?;
        let br = self.ns("br");
        ip(&[
            "-n", &br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["-n", &br, "link", "set", port, "master", "br0", "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        Ok(ns)
    }

    fn member_ns(&self, i: usize) -> String {
        self.ns(&format!("m{i}"))
    }

    fn start_member(&mut self, i: usize, config: &std::path::Path) {
        let log = std::fs::File::create(self.dir.join(format!("m{i}.log"))).expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.member_ns(i)])
            .arg(env!("CARGO_BIN_EXE_redoubt-vip"))
            .arg("--config")
            .arg(config)
            .args(["--id", &i.to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn redoubt-vip");
        self.members[i] = Some(child);
    }

    /// Which live members hold each virtual address, from `ip addr show` in their namespaces.
    fn holders(&self, vips: &[Ipv4Addr]) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); vips.len()];
        for i in 0..MEMBERS {
            if self.members[i].is_none() {
                continue;
            }
            let text = ip(&[
                "-n",
                &self.member_ns(i),
                "-o",
                "-4",
                "addr",
                "show",
                "dev",
                "eth0",
            ])
            .unwrap_or_default();
            for c in parse_inet(&text) {
                if let Some(k) = vips.iter().position(|v| *v == c.addr) {
                    out[k].push(i);
                }
            }
        }
        out
    }

    fn logs(&self) -> String {
        (0..MEMBERS)
            .map(|i| {
                let text =
                    std::fs::read_to_string(self.dir.join(format!("m{i}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(25).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- member {i} (last lines) ---\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in self.members.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Pings every address every 10 ms from inside the client namespace and records each reply.
struct Prober {
    stop: Arc<AtomicBool>,
    replies: Arc<Mutex<Vec<(usize, Instant)>>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Prober {
    fn start(ns: &str, vips: Vec<Ipv4Addr>) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let replies = Arc::new(Mutex::new(Vec::new()));
        let (s, r, ns) = (stop.clone(), replies.clone(), ns.to_string());
        let thread = std::thread::spawn(move || probe(&ns, &vips, &s, &r));
        Prober {
            stop,
            replies,
            thread: Some(thread),
        }
    }

    fn first_after(&self, vip: usize, t: Instant) -> Option<Instant> {
        let r = self.replies.lock().unwrap();
        r.iter().find(|(k, at)| *k == vip && *at > t).map(|x| x.1)
    }

    fn last_before(&self, vip: usize, t: Instant) -> Option<Instant> {
        let r = self.replies.lock().unwrap();
        r.iter()
            .rev()
            .find(|(k, at)| *k == vip && *at <= t)
            .map(|x| x.1)
    }

    fn stop(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| "prober panicked".to_string())?,
            None => Ok(()),
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn probe(
    ns: &str,
    vips: &[Ipv4Addr],
    stop: &AtomicBool,
    replies: &Mutex<Vec<(usize, Instant)>>,
) -> Result<(), String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let nsfile = std::fs::File::open(format!("/run/netns/{ns}")).map_err(|e| e.to_string())?;
    // SAFETY: setns on this thread only, with a namespace file descriptor we hold open.
    if unsafe { libc::setns(nsfile.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: plain socket(2); checked before use and owned right away.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
    if raw < 0 {
        return Err(format!("raw socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let ident = (std::process::id() & 0xffff) as u16;
    let mut seq: u16 = 0;
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        for vip in vips {
            seq = seq.wrapping_add(1);
            let mut pkt = [0u8; 16];
            pkt[0] = 8; // echo request
            pkt[4..6].copy_from_slice(&ident.to_be_bytes());
            pkt[6..8].copy_from_slice(&seq.to_be_bytes());
            let c = checksum(&pkt);
            pkt[2..4].copy_from_slice(&c.to_be_bytes());
            // SAFETY: sockaddr_in is plain data; zeroed is valid.
            let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as u16;
            sin.sin_addr.s_addr = u32::from_ne_bytes(vip.octets());
            // SAFETY: buffers valid for the lengths given. Failures (no route while the
            // address moves) are part of what is measured, so they are ignored.
            unsafe {
                libc::sendto(
                    fd.as_raw_fd(),
                    pkt.as_ptr().cast(),
                    pkt.len(),
                    libc::MSG_DONTWAIT,
                    (&sin as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                );
            }
        }
        let until = Instant::now() + Duration::from_millis(PROBE_INTERVAL_MS);
        while Instant::now() < until {
            // SAFETY: `buf` is valid for its length.
            let n = unsafe {
                libc::recv(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                std::thread::sleep(Duration::from_micros(500));
                continue;
            }
            let pkt = &buf[..n as usize];
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            if pkt.len() < ihl + 8 || pkt[ihl] != 0 || pkt[ihl + 4..ihl + 6] != ident.to_be_bytes()
            {
                continue;
            }
            let src = Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]);
            if let Some(k) = vips.iter().position(|v| *v == src) {
                replies.lock().unwrap().push((k, Instant::now()));
            }
        }
    }
    Ok(())
}

fn link_mac(ns: &str) -> String {
    let text = ip(&["-n", ns, "-o", "link", "show", "dev", "eth0"]).unwrap_or_default();
    let mut words = text.split_whitespace();
    words.find(|w| *w == "link/ether");
    words.next().unwrap_or("").to_string()
}

fn neigh_mac(ns: &str, addr: Ipv4Addr) -> String {
    let text = ip(&["-n", ns, "neigh", "show", &addr.to_string()]).unwrap_or_default();
    let mut words = text.split_whitespace();
    words.find(|w| *w == "lladdr");
    words.next().unwrap_or("").to_string()
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

struct Measured {
    assigned_ms: u128,
    reachable_ms: u128,
    interruption_ms: u128,
}

/// After the fault at `t0`: when the addresses `gone` were all configured on other members
/// and all answered the client again; and the longest gap between a reply before and after.
fn measure(lab: &Lab, prober: &Prober, vips: &[Ipv4Addr], gone: &[usize], t0: Instant) -> Measured {
    let mut assigned = None;
    let ok = wait_for(Duration::from_secs(10), || {
        let h = lab.holders(vips);
        if assigned.is_none() && gone.iter().all(|k| h[*k].len() == 1) {
            assigned = Some(t0.elapsed());
        }
        assigned.is_some() && gone.iter().all(|k| prober.first_after(*k, t0).is_some())
    });
    assert!(
        ok,
        "addresses {gone:?} not taken over within 10 s\n{}",
        lab.logs()
    );
    let reachable = gone
        .iter()
        .map(|k| prober.first_after(*k, t0).unwrap() - t0)
        .max()
        .unwrap();
    let interruption = gone
        .iter()
        .map(|k| {
            let after = prober.first_after(*k, t0).unwrap();
            after - prober.last_before(*k, t0).unwrap_or(t0)
        })
        .max()
        .unwrap();
    Measured {
        assigned_ms: assigned.unwrap().as_millis(),
        reachable_ms: reachable.as_millis(),
        interruption_ms: interruption.as_millis(),
    }
}

#[test]
fn fail_over_in_network_namespaces() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipping the namespace test: it needs root (ip netns, raw sockets)");
        return;
    }
    let tag = format!("rvip{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("redoubt-vip-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lab = Lab {
        tag,
        namespaces: Vec::new(),
        members: (0..MEMBERS).map(|_| None).collect(),
        dir: dir.clone(),
    };
    let br = match lab.add_ns("br") {
        Ok(ns) => ns,
        Err(e) => {
            println!("skipping the namespace test: cannot create a network namespace: {e}");
            return;
        }
    };
    ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]).unwrap();
    ip(&["-n", &br, "link", "set", "br0", "up"]).unwrap();
    for i in 0..MEMBERS {
        lab.add_host(
            &format!("m{i}"),
            &format!("p{i}"),
            Ipv4Addr::new(10, 213, 0, 1 + i as u8),
        )
        .unwrap();
    }
    let client = lab
        .add_host("c", "pc", Ipv4Addr::new(10, 213, 0, 50))
        .unwrap();

    let vips: Vec<Ipv4Addr> = (0..VIPS)
        .map(|k| Ipv4Addr::new(10, 213, 0, 100 + k as u8))
        .collect();
    let config = dir.join("vip.toml");
    let mut text = format!(
        "interface = \"eth0\"\naddresses = [{}]\nkey_hex = \"5c0ffee05c0ffee05c0ffee05c0ffee0\"\n\
         heartbeat_ms = {HEARTBEAT_MS}\nsuspect_ms = {SUSPECT_MS}\n",
        vips.iter()
            .map(|v| format!("\"{v}/24\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for i in 0..MEMBERS {
        text += &format!("[[member]]\nid = {i}\naddr = \"10.213.0.{}:7400\"\n", 1 + i);
    }
    std::fs::write(&config, text).unwrap();
    for i in 0..MEMBERS {
        lab.start_member(i, &config);
    }

    // 1. Every address held once, two per member.
    let started = Instant::now();
    let ok = wait_for(Duration::from_secs(15), || {
        let h = lab.holders(&vips);
        h.iter().all(|x| x.len() == 1)
            && (0..MEMBERS).all(|i| h.iter().filter(|x| x[0] == i).count() == 2)
    });
    assert!(
        ok,
        "no balanced allocation: {:?}\n{}",
        lab.holders(&vips),
        lab.logs()
    );
    println!(
        "allocated 6 addresses over 3 members in {} ms",
        started.elapsed().as_millis()
    );
    let mut prober = Prober::start(&client, vips.clone());
    let ok = wait_for(Duration::from_secs(5), || {
        let now = Instant::now();
        (0..VIPS).all(|k| {
            prober
                .first_after(k, now - Duration::from_millis(100))
                .is_some()
        })
    });
    assert!(ok, "the client cannot reach every address");

    // 2. Crash: SIGKILL, and the host's link goes down with it.
    let victim = 1;
    let holders = lab.holders(&vips);
    let gone: Vec<usize> = (0..VIPS).filter(|k| holders[*k] == [victim]).collect();
    // At an arbitrary point of the heartbeat cycle, so that runs spread over the detection
    // range (suspect_ms - heartbeat_ms to suspect_ms after the victim's last beat).
    let phase = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    std::thread::sleep(Duration::from_millis(u64::from(phase) % HEARTBEAT_MS));
    // The link first: the kernel of a killed daemon's namespace would go on answering pings.
    ip(&["-n", &lab.member_ns(victim), "link", "set", "eth0", "down"]).unwrap();
    let t0 = Instant::now();
    let mut child = lab.members[victim].take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let crash = measure(&lab, &prober, &vips, &gone, t0);
    let h = lab.holders(&vips);
    assert!(h.iter().all(|x| x.len() == 1), "after the crash: {h:?}");
    for k in &gone {
        let holder = h[*k][0];
        assert_eq!(
            neigh_mac(&client, vips[*k]),
            link_mac(&lab.member_ns(holder)),
            "the client's ARP cache names the new holder of {}",
            vips[*k]
        );
    }

    // 3. Voluntary leave: SIGTERM; the member releases, tells the others and exits. (After
    // the last gratuitous ARP of the crash, so the two measurements do not overlap.)
    std::thread::sleep(Duration::from_millis(700));
    let leaver = 2;
    let gone: Vec<usize> = (0..VIPS).filter(|k| h[*k] == [leaver]).collect();
    assert_eq!(gone.len(), 3, "{h:?}");
    let t0 = Instant::now();
    let mut child = lab.members[leaver].take().unwrap();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let leave = measure(&lab, &prober, &vips, &gone, t0);
    let status = child.wait().unwrap();
    assert!(status.success(), "the leaving member exited with {status}");
    let h = lab.holders(&vips);
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
