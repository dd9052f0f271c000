//! The runtime: one UDP socket, a 10 ms timer and the host's address control, driving one
//! [`Wackamole`] core. Effects are carried out in the order the core emits them, so a leaving
//! member's addresses are gone from its interface before its leave message is sent.
//!
//! A failed `ip` command or ARP send is logged and counted and the daemon keeps going; a failed
//! acquisition or release is retried every `retry_ms` for as long as the core still wants it.

use crate::arp::ArpAnnouncer;
use crate::config::VipConfig;
use crate::host::IpTool;
use crate::machine::{Effect, Input, Stats, Wackamole};
use crate::wire::{MemberId, DATAGRAM_BYTES_MAX};
use crate::{Cidr, VipError};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use tracing::{debug, error, info, warn};

/// How often the core is ticked: the resolution of suspicion and of beat timing.
pub const TICK_MS: u64 = 10;
/// How often counters are logged while running.
const STATS_LOG_MS: u64 = 60_000;

/// What the daemon did on the host, besides the core's own counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    pub acquired: u64,
    pub released: u64,
    pub ip_failures: u64,
    pub arp_sent: u64,
    pub arp_failures: u64,
    pub send_failures: u64,
    pub recv_failures: u64,
    /// Configured virtual addresses found on the interface at start and removed.
    pub stale_removed: u64,
}

/// Counters at exit.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    pub host: HostStats,
    pub core: Stats,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Add,
    Del,
}

struct ArpDue {
    addr: Cidr,
    at_ms: u64,
    left: u32,
}

/// The host side: sockets, `ip`, ARP, retries.
struct Host {
    me: MemberId,
    socket: UdpSocket,
    peers: HashMap<MemberId, SocketAddr>,
    ip: IpTool,
    arp: Option<ArpAnnouncer>,
    arp_count: u32,
    arp_interval_ms: u64,
    retry_ms: u64,
    retry: BTreeMap<Cidr, Op>,
    next_retry_ms: u64,
    arp_due: Vec<ArpDue>,
    stats: HostStats,
}

/// Runs member `id` until `shutdown` completes, then leaves the group (releasing its
/// addresses first) and returns its counters.
pub async fn run(
    cfg: &VipConfig,
    id: MemberId,
    shutdown: impl Future<Output = ()>,
) -> Result<Report, VipError> {
    let member = cfg.member(id)?.clone();
    let interface = cfg.interface_of(id)?.to_string();
    let socket = UdpSocket::bind(member.addr)
        .await
        .map_err(|source| VipError::Bind {
            addr: member.addr,
            source,
        })?;
    let ip = IpTool::new(&cfg.ip_command, &interface, cfg.command_timeout_ms);
    let arp = if cfg.arp_count == 0 {
        None
    } else {
        match ArpAnnouncer::open(&interface) {
            Ok(a) => Some(a),
            Err(e) => {
                warn!(member = id, error = %e, "no gratuitous ARP: clients' ARP caches will update only when their entries expire");
                None
            }
        }
    };
    let mut host = Host {
        me: id,
        socket,
        peers: cfg.members.iter().map(|m| (m.id, m.addr)).collect(),
        ip,
        arp,
        arp_count: cfg.arp_count,
        arp_interval_ms: cfg.arp_interval_ms,
        retry_ms: cfg.retry_ms,
        retry: BTreeMap::new(),
        next_retry_ms: 0,
        arp_due: Vec::new(),
        stats: HostStats::default(),
    };
    if host.arp.is_none() && cfg.arp_count > 0 {
        host.stats.arp_failures += 1;
    }
    // A member starts holding nothing (the paper's immature start): addresses left on the
    // interface by an earlier run that crashed belong to whoever the group gives them to now.
    match host.ip.present(&cfg.addresses).await {
        Ok(stale) => {
            for addr in stale {
                warn!(member = id, %addr, "removing a virtual address left from an earlier run");
                match host.ip.del(&addr).await {
                    Ok(()) => host.stats.stale_removed += 1,
                    Err(e) => {
                        error!(member = id, %addr, error = %e, "cannot remove a stale virtual address");
                        host.stats.ip_failures += 1;
                        host.retry.insert(addr, Op::Del);
                    }
                }
            }
        }
        Err(e) => {
            error!(member = id, error = %e, "cannot list the interface's addresses");
            host.stats.ip_failures += 1;
        }
    }

    // Incarnations must grow across restarts: the wall clock in ms does, unless it is set back.
    let incarnation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64)
        .max(1);
    let mut machine = Wackamole::new(cfg.machine_config(id, incarnation));
    info!(
        member = id,
        addr = %member.addr,
        interface = %interface,
        addresses = cfg.addresses.len(),
        members = cfg.members.len(),
        heartbeat_ms = cfg.heartbeat_ms,
        suspect_ms = cfg.suspect_ms,
        "virtual address daemon started"
    );

    let start = Instant::now();
    let now_ms = move || start.elapsed().as_millis() as u64;
    let mut tick = tokio::time::interval(Duration::from_millis(TICK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX + 1];
    let mut next_stats_ms = STATS_LOG_MS;
    tokio::pin!(shutdown);
    loop {
        let effects = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = host.socket.recv_from(&mut buf) => match r {
                Ok((n, _)) => machine.handle(now_ms(), Input::Datagram(&buf[..n])),
                Err(e) => {
                    debug!(member = id, error = %e, "receive failed");
                    host.stats.recv_failures += 1;
                    Vec::new()
                }
            },
            _ = tick.tick() => {
                let now = now_ms();
                host.on_tick(&machine, now).await;
                if now >= next_stats_ms {
                    next_stats_ms = now + STATS_LOG_MS;
                    log_stats(id, &host.stats, machine.stats());
                }
                machine.handle(now, Input::Tick)
            }
        };
        host.perform(&machine, effects, now_ms()).await;
    }
    info!(member = id, "leaving the group");
    let effects = machine.handle(now_ms(), Input::Leave);
    host.perform(&machine, effects, now_ms()).await;
    let report = Report {
        host: host.stats,
        core: *machine.stats(),
    };
    log_stats(id, &report.host, &report.core);
    Ok(report)
}

fn log_stats(id: MemberId, host: &HostStats, core: &Stats) {
    info!(
        member = id,
        acquired = host.acquired,
        released = host.released,
        ip_failures = host.ip_failures,
        arp_sent = host.arp_sent,
        arp_failures = host.arp_failures,
        send_failures = host.send_failures,
        received = core.datagrams_received,
        sent = core.datagrams_sent,
        views = core.views_installed,
        rejected = ?core.rejected.nonzero(),
        "counters"
    );
}

impl Host {
    async fn perform(&mut self, machine: &Wackamole, effects: Vec<Effect>, now: u64) {
        for e in effects {
            match e {
                Effect::Send { to, bytes } => {
                    let Some(addr) = self.peers.get(&to) else {
                        continue;
                    };
                    if let Err(e) = self.socket.send_to(&bytes, addr).await {
                        // Routine while a peer's host is down: not worth more than debug.
                        debug!(member = self.me, to, error = %e, "send failed");
                        self.stats.send_failures += 1;
                    }
                }
                Effect::Acquire { addr } => {
                    self.retry.remove(&addr);
                    if !self.change_address(Op::Add, addr, false).await {
                        self.next_retry_ms = now + self.retry_ms;
                    }
                }
                Effect::Release { addr } => {
                    self.retry.remove(&addr);
                    self.arp_due.retain(|d| d.addr != addr);
                    if !self.change_address(Op::Del, addr, false).await {
                        self.next_retry_ms = now + self.retry_ms;
                    }
                }
                Effect::AnnounceArp { addr } => {
                    // Not while the address failed to come up: it is announced once it does.
                    if self.retry.get(&addr) != Some(&Op::Add) {
                        self.announce(addr, now);
                    }
                }
                Effect::ViewInstalled { .. } => {}
                Effect::Allocated { view, held, mature } => {
                    let held: Vec<String> = held.iter().map(|c| c.to_string()).collect();
                    info!(member = self.me, view = %view, mature, held = ?held, "allocation");
                }
            }
        }
        debug_assert!(self
            .retry
            .iter()
            .all(|(a, op)| (*op == Op::Add) == machine.holds(a)));
    }

    /// Adds or removes a virtual address on the interface; on failure, counts and logs it
    /// and leaves it to the retry timer. `true` if it took effect.
    async fn change_address(&mut self, op: Op, addr: Cidr, retrying: bool) -> bool {
        let result = match op {
            Op::Add => self.ip.add(&addr).await,
            Op::Del => self.ip.del(&addr).await,
        };
        let done = match (op, retrying) {
            (Op::Add, false) => "acquired",
            (Op::Add, true) => "acquired on retry",
            (Op::Del, false) => "released",
            (Op::Del, true) => "released on retry",
        };
        match result {
            Ok(()) => {
                info!(member = self.me, %addr, "{done}");
                match op {
                    Op::Add => self.stats.acquired += 1,
                    Op::Del => self.stats.released += 1,
                }
                true
            }
            Err(e) => {
                let what = match op {
                    Op::Add => "acquire",
                    Op::Del => "release",
                };
                if retrying {
                    warn!(member = self.me, %addr, error = %e, "cannot {what} yet; will retry");
                } else {
                    error!(member = self.me, %addr, error = %e, "cannot {what}; will retry");
                }
                self.stats.ip_failures += 1;
                self.retry.insert(addr, op);
                false
            }
        }
    }

    /// First announcement now, the rest every `arp_interval_ms`.
    fn announce(&mut self, addr: Cidr, now: u64) {
        self.arp_due.retain(|d| d.addr != addr);
        self.send_arp(addr);
        if self.arp_count > 1 {
            self.arp_due.push(ArpDue {
                addr,
                at_ms: now + self.arp_interval_ms,
                left: self.arp_count - 1,
            });
        }
    }

    fn send_arp(&mut self, addr: Cidr) {
        let Some(arp) = &self.arp else {
            return;
        };
        match arp.announce(addr.addr) {
            Ok(()) => self.stats.arp_sent += 1,
            Err(e) => {
                warn!(member = self.me, error = %e, "gratuitous ARP failed");
                self.stats.arp_failures += 1;
            }
        }
    }

    async fn on_tick(&mut self, machine: &Wackamole, now: u64) {
        let mut due = Vec::new();
        self.arp_due.retain_mut(|d| {
            if now < d.at_ms {
                return true;
            }
            due.push(d.addr);
            d.left -= 1;
            d.at_ms = now + self.arp_interval_ms;
            d.left > 0
        });
        for addr in due {
            if machine.holds(&addr) {
                self.send_arp(addr);
            }
        }
        if self.retry.is_empty() || now < self.next_retry_ms {
            return;
        }
        self.next_retry_ms = now + self.retry_ms;
        for (addr, op) in std::mem::take(&mut self.retry) {
            let wanted = machine.holds(&addr);
            match op {
                Op::Add if wanted => {
                    let added = self.change_address(op, addr, true).await;
                    if added {
                        self.announce(addr, now);
                    }
                }
                Op::Del if !wanted => {
                    self.change_address(op, addr, true).await;
                }
                // The core changed its mind since: nothing left to do.
                _ => {}
            }
        }
    }
}
