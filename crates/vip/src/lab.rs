//! A fail-over group on one machine: members and a client, each in its own network namespace,
//! joined by veth pairs to a bridge in a namespace of its own, the way the paper's servers
//! share a LAN. The client pings every virtual address every 10 ms from a raw ICMP socket (the
//! paper's method: a request every 10 ms, interruption measured at the client). Used by
//! `redoubt demo --vip` and by the namespace test; needs root (`ip netns`, raw sockets).
//!
//! Everything a [`Lab`] creates (namespaces, daemons, and unless kept its directory) is removed
//! when it is dropped, whatever happened.

use crate::host::parse_inet;
use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Interval between two rounds of pings, one to every address.
pub const PROBE_INTERVAL_MS: u64 = 10;

/// Runs `ip` with `args`; its output, or why it failed.
pub fn ip(args: &[&str]) -> Result<String, String> {
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

/// Whether this process runs as root (the lab needs it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The shape of a lab: members `0..members` at 10.213.0.1, .2, ..., the client at
/// 10.213.0.50, the virtual addresses from 10.213.0.100 on.
#[derive(Clone, Debug)]
pub struct LabSpec {
    pub members: usize,
    pub addresses: usize,
    pub heartbeat_ms: u64,
    pub suspect_ms: u64,
}

/// Namespaces, daemons and files of one run.
pub struct Lab {
    tag: String,
    namespaces: Vec<String>,
    members: Vec<Option<Child>>,
    dir: PathBuf,
    config: PathBuf,
    daemon: Vec<OsString>,
    vips: Vec<Ipv4Addr>,
    client: String,
    /// Whether the directory stays when the lab goes.
    keep_dir: bool,
}

impl Lab {
    /// Builds the LAN of `spec` and writes the group's file into `dir` (removed on drop).
    /// `daemon` is the command that runs one member, before its `--config FILE --id N`
    /// (`redoubt-vip`, or `redoubt vip`). No daemon runs yet: see [`Lab::start_member`].
    pub fn create(spec: &LabSpec, daemon: Vec<OsString>, dir: PathBuf) -> Result<Lab, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let vips: Vec<Ipv4Addr> = (0..spec.addresses)
            .map(|k| Ipv4Addr::new(10, 213, 0, 100 + k as u8))
            .collect();
        let mut lab = Lab {
            tag: format!("rvip{}", std::process::id()),
            namespaces: Vec::new(),
            members: (0..spec.members).map(|_| None).collect(),
            config: dir.join("vip.toml"),
            dir,
            daemon,
            vips,
            client: String::new(),
            keep_dir: false,
        };
        let br = lab.add_ns("br")?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for i in 0..spec.members {
            lab.add_host(
                &format!("m{i}"),
                &format!("p{i}"),
                Ipv4Addr::new(10, 213, 0, 1 + i as u8),
            )?;
        }
        lab.client = lab.add_host("c", "pc", Ipv4Addr::new(10, 213, 0, 50))?;
        let mut text = format!(
            "interface = \"eth0\"\naddresses = [{}]\nkey_hex = \"5c0ffee05c0ffee05c0ffee05c0ffee0\"\n\
             heartbeat_ms = {}\nsuspect_ms = {}\n",
            lab.vips
                .iter()
                .map(|v| format!("\"{v}/24\""))
                .collect::<Vec<_>>()
                .join(", "),
            spec.heartbeat_ms,
            spec.suspect_ms,
        );
        for i in 0..spec.members {
            text += &format!("[[member]]\nid = {i}\naddr = \"10.213.0.{}:7400\"\n", 1 + i);
        }
        std::fs::write(&lab.config, text).map_err(|e| format!("{}: {e}", lab.config.display()))?;
        Ok(lab)
    }

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
        let cidr = format!("{addr}/24");
        ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        Ok(ns)
    }

    /// The virtual addresses.
    pub fn vips(&self) -> &[Ipv4Addr] {
        &self.vips
    }

    /// The client's namespace.
    pub fn client_ns(&self) -> &str {
        &self.client
    }

    pub fn member_ns(&self, i: usize) -> String {
        self.ns(&format!("m{i}"))
    }

    /// The members' number.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// Starts member `i`'s daemon in its namespace (its log: `m{i}.log` in the directory).
    pub fn start_member(&mut self, i: usize) -> Result<(), String> {
        let log_path = self.dir.join(format!("m{i}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.member_ns(i)])
            .args(&self.daemon)
            .arg("--config")
            .arg(&self.config)
            .args(["--id", &i.to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start member {i}: {e}"))?;
        self.members[i] = Some(child);
        Ok(())
    }

    /// Crashes member `i` as a host crash looks to the others: its link goes down (else its
    /// namespace's kernel would go on answering pings), then its daemon is killed. Returns
    /// the moment the link went down.
    pub fn crash_member(&mut self, i: usize) -> Result<Instant, String> {
        ip(&["-n", &self.member_ns(i), "link", "set", "eth0", "down"])?;
        let t0 = Instant::now();
        if let Some(mut child) = self.members[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(t0)
    }

    /// Brings member `i`'s host back after [`Lab::crash_member`]: link up, daemon started.
    pub fn restart_member(&mut self, i: usize) -> Result<(), String> {
        ip(&["-n", &self.member_ns(i), "link", "set", "eth0", "up"])?;
        self.start_member(i)
    }

    /// Stops member `i` with SIGTERM (a voluntary leave); returns when the signal went and
    /// the daemon, to wait for.
    pub fn leave_member(&mut self, i: usize) -> Result<(Instant, Child), String> {
        let child = self.members[i]
            .take()
            .ok_or_else(|| format!("member {i} is not running"))?;
        let t0 = Instant::now();
        // SAFETY: signalling our own child process.
        if unsafe { libc::kill(child.id() as i32, libc::SIGTERM) } != 0 {
            return Err(format!("kill: {}", std::io::Error::last_os_error()));
        }
        Ok((t0, child))
    }

    /// Which running members hold each virtual address, from `ip addr show` in their
    /// namespaces.
    pub fn holders(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); self.vips.len()];
        for (i, m) in self.members.iter().enumerate() {
            if m.is_none() {
                continue;
            }
            let ns = self.member_ns(i);
            let text =
                ip(&["-n", &ns, "-o", "-4", "addr", "show", "dev", "eth0"]).unwrap_or_default();
            for c in parse_inet(&text) {
                if let Some(k) = self.vips.iter().position(|v| *v == c.addr) {
                    out[k].push(i);
                }
            }
        }
        out
    }

    /// Whether every address is held once, and the running members hold them in shares that
    /// differ by at most one.
    pub fn balanced(&self) -> bool {
        let h = self.holders();
        let running: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].is_some())
            .collect();
        if running.is_empty() || h.iter().any(|x| x.len() != 1) {
            return false;
        }
        let counts: Vec<usize> = running
            .iter()
            .map(|i| h.iter().filter(|x| x[0] == *i).count())
            .collect();
        counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
    }

    /// The MAC address of member `i`'s interface.
    pub fn member_mac(&self, i: usize) -> String {
        let text = ip(&[
            "-n",
            &self.member_ns(i),
            "-o",
            "link",
            "show",
            "dev",
            "eth0",
        ])
        .unwrap_or_default();
        let mut words = text.split_whitespace();
        words.find(|w| *w == "link/ether");
        words.next().unwrap_or("").to_string()
    }

    /// The MAC address the client's ARP cache holds for `addr`.
    pub fn client_arp(&self, addr: Ipv4Addr) -> String {
        let text =
            ip(&["-n", &self.client, "neigh", "show", &addr.to_string()]).unwrap_or_default();
        let mut words = text.split_whitespace();
        words.find(|w| *w == "lladdr");
        words.next().unwrap_or("").to_string()
    }

    /// The last lines of every member's log.
    pub fn logs(&self) -> String {
        (0..self.members.len())
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

    /// The lab's directory (the group's file and the members' logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Leaves the directory in place when the lab goes (the namespaces still go).
    pub fn keep_dir(&mut self) {
        self.keep_dir = true;
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
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Pings every address every [`PROBE_INTERVAL_MS`] from inside the client's namespace and
/// records each reply.
pub struct Prober {
    stop: Arc<AtomicBool>,
    replies: Arc<Mutex<Vec<(usize, Instant)>>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Prober {
    pub fn start(ns: &str, vips: Vec<Ipv4Addr>) -> Prober {
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

    /// The first reply from address `vip` (its index) after `t`.
    pub fn first_after(&self, vip: usize, t: Instant) -> Option<Instant> {
        let r = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().find(|(k, at)| *k == vip && *at > t).map(|x| x.1)
    }

    /// The last reply from address `vip` at or before `t`.
    pub fn last_before(&self, vip: usize, t: Instant) -> Option<Instant> {
        let r = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        r.iter()
            .rev()
            .find(|(k, at)| *k == vip && *at <= t)
            .map(|x| x.1)
    }

    /// The longest gap between two replies from `vip` within `from..to`.
    pub fn longest_gap(&self, vip: usize, from: Instant, to: Instant) -> Duration {
        let r = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        let times: Vec<Instant> = r
            .iter()
            .filter(|(k, at)| *k == vip && *at >= from && *at <= to)
            .map(|x| x.1)
            .collect();
        times
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default()
    }

    /// Whether every address answered within the last `window`.
    pub fn all_answer(&self, addresses: usize, window: Duration) -> bool {
        let since = Instant::now() - window;
        (0..addresses).all(|k| self.first_after(k, since).is_some())
    }

    pub fn stop(&mut self) -> Result<(), String> {
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
                replies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((k, Instant::now()));
            }
        }
    }
    Ok(())
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// How a fault at `t0` looked: when the addresses it took were all configured elsewhere, when
/// they all answered the client again, and the longest interruption the client saw (from the
/// last reply before `t0` to the first after).
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub assigned_ms: u128,
    pub reachable_ms: u128,
    pub interruption_ms: u128,
}

/// Waits (up to `timeout`) until the addresses `gone` (their indices) are held by exactly one
/// member each and have all answered the client after `t0`.
pub fn measure(
    lab: &Lab,
    prober: &Prober,
    gone: &[usize],
    t0: Instant,
    timeout: Duration,
) -> Result<Measured, String> {
    let mut assigned = None;
    let ok = wait_for(timeout, || {
        let h = lab.holders();
        if assigned.is_none() && gone.iter().all(|k| h[*k].len() == 1) {
            assigned = Some(t0.elapsed());
        }
        assigned.is_some() && gone.iter().all(|k| prober.first_after(*k, t0).is_some())
    });
    let (Some(assigned), true) = (assigned, ok) else {
        return Err(format!(
            "addresses {gone:?} not taken over within {} s (holders {:?})",
            timeout.as_secs(),
            lab.holders()
        ));
    };
    let first = |k: &usize| prober.first_after(*k, t0).expect("answered");
    let reachable = gone.iter().map(|k| first(k) - t0).max().unwrap_or_default();
    let interruption = gone
        .iter()
        .map(|k| first(k) - prober.last_before(*k, t0).unwrap_or(t0))
        .max()
        .unwrap_or_default();
    Ok(Measured {
        assigned_ms: assigned.as_millis(),
        reachable_ms: reachable.as_millis(),
        interruption_ms: interruption.as_millis(),
    })
}
