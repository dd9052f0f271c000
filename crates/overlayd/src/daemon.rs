//! The daemon's event loop: one task owns the [`Node`], reads datagrams from its UDP socket,
//! passes the node's datagrams through the faulty relay (test only) and the per-link WAN
//! emulation, ticks it at its deadlines, and carries the tunnel connections ([`Conns`]):
//! what the local connections read goes into the overlay, what the overlay delivers goes to
//! them.

use crate::config::{Emulation, OverlayFile};
use crate::conns::{Admit, Conns, Inbox, Limits, Outgoing, TunnelCounters};
use crate::faulty::FaultyRelay;
use crate::tunnel::{chunk, Reassembly, HEADER_BYTES};
use crate::wan::{WanDrop, WanLink};
use redoubt_overlay::{Delivery, Effect, Event, Input, Node, NodeId, SubmitError};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Largest datagram the daemon reads (the largest UDP payload).
const DATAGRAM_BYTES_MAX: usize = 65_536;
/// Frames and connection reports from all tunnel connections waiting for the event loop.
const TUNNEL_INBOX_MAX: usize = 1_024;
/// Control requests waiting for the event loop.
const CONTROL_QUEUE_MAX: usize = 64;
/// Events kept for an in-process observer that does not read them.
const EVENT_QUEUE_MAX: usize = 4_096;

/// Why the daemon could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] crate::config::OverlayConfigError),
    #[error("node {0} is not in the overlay file")]
    UnknownNode(u16),
    #[error("the overlay core refused its configuration: {0}")]
    Core(#[from] redoubt_overlay::ConfigError),
    #[error("cannot bind {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install a signal handler: {0}")]
    Signal(std::io::Error),
}

/// What a host of the daemon may ask at run time.
pub enum Control {
    /// Changes the emulation of what this node sends to `neighbour`.
    SetLink {
        neighbour: NodeId,
        emulation: Emulation,
    },
    /// TEST ONLY: changes the fraction of forwarded packets this node drops.
    SetFaulty(f64),
    /// Answers with the status as JSON.
    Status(oneshot::Sender<serde_json::Value>),
    /// Stops the daemon.
    Shutdown,
}

/// The daemon's own counters (the core counts the protocol's).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters {
    pub datagrams_received: u64,
    pub datagrams_sent: u64,
    /// Datagrams from an address that is not a neighbour's.
    pub datagrams_unknown_addr: u64,
    /// Datagrams the socket could not send (buffer full).
    pub datagrams_send_failed: u64,
    pub wan_lost: u64,
    pub wan_queue_full: u64,
    /// The tunnel connections' counters (kept by the tunnel table, copied here for status).
    #[serde(flatten)]
    pub tunnels: TunnelCounters,
    pub unordered_ignored: u64,
    pub faulty_dropped: u64,
}

/// A daemon started in this process (benchmarks, tests).
pub struct DaemonHandle {
    pub control: mpsc::Sender<Control>,
    /// Protocol events with the time (ms since the daemon started) they happened.
    pub events: mpsc::Receiver<(u64, Event)>,
    pub join: tokio::task::JoinHandle<Result<(), DaemonError>>,
}

/// Starts node `id` of `file` in this process, without signal handlers.
pub async fn spawn(file: OverlayFile, id: u16) -> Result<DaemonHandle, DaemonError> {
    let (control_tx, control_rx) = mpsc::channel(CONTROL_QUEUE_MAX);
    let (event_tx, event_rx) = mpsc::channel(EVENT_QUEUE_MAX);
    let d = Daemon::start(file, id, Some(event_tx)).await?;
    let join = tokio::spawn(d.run(control_rx, false));
    Ok(DaemonHandle {
        control: control_tx,
        events: event_rx,
        join,
    })
}

/// Runs node `id` of `file` until SIGTERM or SIGINT, answering `control` (its status feeds
/// the metrics endpoint; see [`control_channel`]). SIGHUP rereads the file's `[[link]]` and
/// `[[faulty]]` entries; SIGUSR1 logs the status line.
pub async fn run(
    file: OverlayFile,
    id: u16,
    control: mpsc::Receiver<Control>,
) -> Result<(), DaemonError> {
    let d = Daemon::start(file, id, None).await?;
    d.run(control, true).await
}

/// A control channel of the bounded size the daemon reads ([`run`]).
pub fn control_channel() -> (mpsc::Sender<Control>, mpsc::Receiver<Control>) {
    mpsc::channel(CONTROL_QUEUE_MAX)
}

struct Daemon {
    file: OverlayFile,
    me: NodeId,
    node: Node,
    started: Instant,
    sock: UdpSocket,
    addrs: BTreeMap<NodeId, SocketAddr>,
    by_addr: BTreeMap<SocketAddr, NodeId>,
    wan: BTreeMap<NodeId, WanLink>,
    faulty: FaultyRelay,
    inbox: mpsc::Receiver<Inbox>,
    conns: Conns,
    backlog: BTreeMap<NodeId, (VecDeque<Vec<u8>>, usize)>,
    reassembly: BTreeMap<NodeId, Reassembly>,
    events: Option<mpsc::Sender<(u64, Event)>>,
    counters: Counters,
    /// Set when a submission was refused for a full flow backlog.
    backlog_refused: bool,
}

impl Daemon {
    async fn start(
        file: OverlayFile,
        id: u16,
        events: Option<mpsc::Sender<(u64, Event)>>,
    ) -> Result<Daemon, DaemonError> {
        let entry = file
            .nodes
            .get(id as usize)
            .cloned()
            .ok_or(DaemonError::UnknownNode(id))?;
        let me = NodeId(id);
        let cfg = file.protocol_config()?;
        if file.uses_shared_secret() {
            warn!(
                node = id,
                "TEST ONLY: keys derive from [overlay] secret_file, which gives every daemon every \
                 pair's key; deal per-node key files with `redoubt overlay keygen` instead"
            );
        }
        let pairwise = file.pairwise_keys(id)?;
        let neighbours = file.neighbours(id);
        let ids: Vec<NodeId> = neighbours.keys().copied().collect();
        let started = Instant::now();
        // The incarnation must grow across restarts: the wall clock in ms does.
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64)
            .max(1);
        let node = Node::new(cfg.clone(), me, &ids, &pairwise, epoch, 0)?;
        let sock = UdpSocket::bind(entry.addr)
            .await
            .map_err(|source| DaemonError::Bind {
                what: "UDP",
                addr: entry.addr,
                source,
            })?;
        let addrs: BTreeMap<NodeId, SocketAddr> = ids
            .iter()
            .map(|&n| (n, file.nodes[n.index()].addr))
            .collect();
        let by_addr = addrs.iter().map(|(&n, &a)| (a, n)).collect();
        let seed = file.overlay.emulation_seed ^ ((id as u64) << 32);
        let wan = neighbours
            .iter()
            .map(|(&n, &e)| {
                let s = seed ^ n.0 as u64;
                (n, WanLink::new(e, s, file.overlay.link_queue_bytes_max))
            })
            .collect();
        let neighbour_keys = pairwise
            .iter()
            .filter(|(n, _)| neighbours.contains_key(n))
            .map(|(&n, k)| (n, k.clone()))
            .collect();
        let faulty = FaultyRelay::new(me, file.faulty_drop(id), &neighbour_keys, &cfg, seed);
        if faulty.drop_fraction() > 0.0 {
            warn!(
                node = id,
                drop = faulty.drop_fraction(),
                "TEST ONLY: this node drops forwarded packets ([[faulty]] in the overlay file)"
            );
        }
        let (inbox_tx, inbox) = mpsc::channel(TUNNEL_INBOX_MAX);
        for (port, t) in file
            .tunnels
            .iter()
            .enumerate()
            .filter(|(_, t)| t.node == id)
        {
            let listener =
                TcpListener::bind(t.listen)
                    .await
                    .map_err(|source| DaemonError::Bind {
                        what: "tunnel",
                        addr: t.listen,
                        source,
                    })?;
            info!(node = id, peer = t.peer, listen = %t.listen, "tunnel port open");
            tokio::spawn(accept_tunnel(
                listener,
                port,
                NodeId(t.peer),
                inbox_tx.clone(),
            ));
        }
        let o = &file.overlay;
        let limits = Limits {
            per_port: o.tunnel_conns_max,
            total: o.tunnel_conns_total_max,
            queue_frames: o.tunnel_queue_frames_max,
            queue_bytes: o.tunnel_conn_queue_bytes_max,
            frame_bytes_max: o.tunnel_frame_bytes_max,
        };
        let tunnels_from = (0..file.nodes.len() as u16)
            .map(|src| (NodeId(src), file.tunnels_between(src, id)))
            .filter(|(_, k)| *k > 0)
            .collect();
        let conns = Conns::new(
            me,
            epoch,
            entry.replica_addr,
            limits,
            tunnels_from,
            inbox_tx,
        );
        info!(
            node = id,
            addr = %entry.addr,
            neighbours = ?ids,
            routing = %file.overlay.routing,
            recovery = %file.overlay.recovery,
            "overlay daemon started"
        );
        Ok(Daemon {
            file,
            me,
            node,
            started,
            sock,
            addrs,
            by_addr,
            wan,
            faulty,
            inbox,
            conns,
            backlog: BTreeMap::new(),
            reassembly: BTreeMap::new(),
            events,
            counters: Counters::default(),
            backlog_refused: false,
        })
    }

    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    async fn run(
        mut self,
        mut control: mpsc::Receiver<Control>,
        signals: bool,
    ) -> Result<(), DaemonError> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sig = if signals {
            let s = |k| signal(k).map_err(DaemonError::Signal);
            Some((
                s(SignalKind::terminate())?,
                s(SignalKind::interrupt())?,
                s(SignalKind::hangup())?,
                s(SignalKind::user_defined1())?,
            ))
        } else {
            None
        };
        let status_every = Duration::from_millis(self.file.overlay.status_interval_ms);
        let mut next_status = Instant::now() + status_every;
        let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
        loop {
            let due_us = self
                .wan
                .values()
                .filter_map(|w| w.next_due_us())
                .min()
                .unwrap_or(u64::MAX)
                .min(self.node.next_deadline_ms().saturating_mul(1_000));
            let wake = (self.started + Duration::from_micros(due_us.min(1 << 50))).min(next_status);
            let room = self.backlog.values().map(|(_, b)| *b).sum::<usize>()
                < self.file.overlay.tunnel_backlog_bytes_max.saturating_mul(4);
            let (term, int, hup, usr1) = match sig.as_mut() {
                Some((a, b, c, d)) => (Some(a), Some(b), Some(c), Some(d)),
                None => (None, None, None, None),
            };
            tokio::select! {
                r = self.sock.recv_from(&mut buf) => match r {
                    Ok((len, from)) => self.on_datagram(from, buf[..len].to_vec()),
                    Err(e) => debug!(error = %e, "UDP receive failed"),
                },
                Some(item) = self.inbox.recv(), if room => self.on_inbox(item),
                c = control.recv() => match c {
                    Some(Control::SetLink { neighbour, emulation }) => self.set_link(neighbour, emulation),
                    Some(Control::SetFaulty(f)) => {
                        warn!(node = self.me.0, drop = f, "TEST ONLY: faulty relay fraction set");
                        self.faulty.set_drop_fraction(f);
                    }
                    Some(Control::Status(tx)) => { let _ = tx.send(self.status()); }
                    Some(Control::Shutdown) => return Ok(()),
                    // No host holds the sender (the command-line daemon): signals rule.
                    None if signals => std::future::pending::<()>().await,
                    None => return Ok(()),
                },
                _ = tokio::time::sleep_until(wake) => {}
                _ = recv_opt(term) => { info!(node = self.me.0, "SIGTERM: stopping"); return Ok(()) }
                _ = recv_opt(int) => { info!(node = self.me.0, "SIGINT: stopping"); return Ok(()) }
                _ = recv_opt(hup) => self.reload(),
                _ = recv_opt(usr1) => info!(status = %self.status(), "overlay status"),
            }
            let now_us = self.now_us();
            if now_us / 1_000 >= self.node.next_deadline_ms() {
                let effects = self.node.step(Input::Tick {
                    now_ms: now_us / 1_000,
                });
                self.on_effects(effects);
            }
            self.pump();
            self.flush_wan();
            if Instant::now() >= next_status {
                next_status = Instant::now() + status_every;
                info!(status = %self.status(), "overlay status");
            }
        }
    }

    fn on_datagram(&mut self, from: SocketAddr, bytes: Vec<u8>) {
        self.counters.datagrams_received += 1;
        if !self.by_addr.contains_key(&from) {
            self.counters.datagrams_unknown_addr += 1;
            if self.counters.datagrams_unknown_addr.is_power_of_two() {
                warn!(node = self.me.0, %from, count = self.counters.datagrams_unknown_addr,
                    "datagram from an address that is not a neighbour's, dropped");
            }
            return;
        }
        let now_ms = self.now_us() / 1_000;
        let effects = self.node.step(Input::Receive { now_ms, bytes });
        self.on_effects(effects);
    }

    fn on_inbox(&mut self, item: Inbox) {
        let mut out = Vec::new();
        match item {
            Inbox::Accepted {
                port,
                peer,
                stream,
                from,
            } => {
                let queued = self.backlog.get(&peer).map_or(0, |(_, b)| *b);
                if queued >= self.file.overlay.tunnel_backlog_bytes_max {
                    // Dropping the stream closes it: the dialler retries later.
                    self.conns
                        .refused(peer, "the overlay backlog to the peer is full");
                } else {
                    self.conns.accept(port, peer, stream, from, &mut out);
                }
            }
            Inbox::Frame { slot, frame } => self.conns.on_local_frame(slot, frame, &mut out),
            Inbox::Closed { slot, reason } => self.conns.on_local_closed(slot, &reason, &mut out),
        }
        self.enqueue(out);
    }

    /// Puts tunnel messages, whole, into their destinations' backlogs, within their bounds.
    fn enqueue(&mut self, out: Vec<Outgoing>) {
        let max = self.file.overlay.tunnel_backlog_bytes_max;
        for Outgoing { dst, msg, admit } in out {
            let (q, bytes) = self.backlog.entry(dst).or_default();
            let admitted = match admit {
                Admit::Data => *bytes + msg.len() <= max,
                Admit::Always => true,
                Admit::IfRoom => *bytes < max,
            };
            if !admitted {
                let c = &mut self.conns.counters;
                match admit {
                    Admit::Data => c.tunnel_frames_backlog_full += 1,
                    _ => c.tunnel_closes_dropped += 1,
                }
                continue;
            }
            for c in chunk(&msg, self.file.overlay.payload_bytes_max) {
                *bytes += c.len();
                q.push_back(c);
            }
        }
    }

    /// Submits waiting chunks until the core refuses one for a full flow.
    fn pump(&mut self) {
        let dsts: Vec<NodeId> = self
            .backlog
            .iter()
            .filter(|(_, (q, _))| !q.is_empty())
            .map(|(&d, _)| d)
            .collect();
        for dst in dsts {
            while let Some(payload) = self.backlog.get(&dst).and_then(|(q, _)| q.front()).cloned() {
                self.backlog_refused = false;
                let now_ms = self.now_us() / 1_000;
                let len = payload.len();
                let effects = self.node.step(Input::Submit {
                    now_ms,
                    dst,
                    delivery: Delivery::Ordered,
                    payload,
                });
                self.on_effects(effects);
                if self.backlog_refused {
                    break;
                }
                if let Some((q, bytes)) = self.backlog.get_mut(&dst) {
                    q.pop_front();
                    *bytes -= len;
                }
            }
        }
    }

    fn on_effects(&mut self, effects: Vec<Effect>) {
        let now_us = self.now_us();
        for e in effects {
            match e {
                Effect::Send { to, bytes } => {
                    let before = self.faulty.dropped;
                    let bytes = self.faulty.outgoing(to, bytes);
                    self.counters.faulty_dropped += self.faulty.dropped - before;
                    match self.wan.get_mut(&to).map(|w| w.offer(now_us, bytes)) {
                        Some(Ok(())) => {}
                        Some(Err(WanDrop::Loss)) => self.counters.wan_lost += 1,
                        Some(Err(WanDrop::QueueFull)) => self.counters.wan_queue_full += 1,
                        None => warn!(node = self.me.0, %to, "core sent to a non-neighbour"),
                    }
                }
                Effect::Deliver {
                    src,
                    delivery,
                    seq,
                    payload,
                } => self.on_deliver(src, delivery, seq, payload),
                Effect::Accepted { .. } => {}
                Effect::Rejected { dst, reason, .. } => match reason {
                    SubmitError::BacklogFull => self.backlog_refused = true,
                    other => {
                        warn!(node = self.me.0, %dst, reason = %other, "tunnel chunk refused");
                        self.conns.counters.tunnel_chunks_bad += 1;
                    }
                },
                Effect::Event(ev) => self.on_event(now_us / 1_000, ev),
            }
        }
    }

    fn on_event(&mut self, at_ms: u64, ev: Event) {
        match &ev {
            Event::Accused { dst, link, weight } => {
                warn!(node = self.me.0, %dst, link = ?link, weight, "accused link")
            }
            Event::RouteChanged { dst, route } => {
                info!(node = self.me.0, %dst, route = ?route, "route changed")
            }
            Event::ProbeAdded { dst, probe } => {
                info!(node = self.me.0, %dst, %probe, "probe added")
            }
            Event::LinkUp { neighbour } => info!(node = self.me.0, %neighbour, "link up"),
            Event::LinkDown { neighbour } => warn!(node = self.me.0, %neighbour, "link down"),
        }
        if let Some(tx) = &self.events {
            let _ = tx.try_send((at_ms, ev));
        }
    }

    fn on_deliver(&mut self, src: NodeId, delivery: Delivery, seq: u64, payload: Vec<u8>) {
        if delivery != Delivery::Ordered {
            self.counters.unordered_ignored += 1;
            return;
        }
        if seq == 0 {
            // A flow starts at 0 once per incarnation of its source.
            self.conns.on_peer_restart(src);
        }
        let max = self.file.overlay.tunnel_frame_bytes_max + HEADER_BYTES;
        let r = self
            .reassembly
            .entry(src)
            .or_insert_with(|| Reassembly::new(max));
        let msg = match r.push(seq, &payload) {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => {
                self.conns.counters.tunnel_chunks_bad += 1;
                warn!(node = self.me.0, %src, error = %e, "tunnel chunk dropped");
                return;
            }
        };
        let mut out = Vec::new();
        self.conns.on_message(src, &msg, &mut out);
        self.enqueue(out);
    }

    fn flush_wan(&mut self) {
        let now_us = self.now_us();
        for (n, w) in self.wan.iter_mut() {
            while let Some(bytes) = w.pop_due(now_us) {
                match self.sock.try_send_to(&bytes, self.addrs[n]) {
                    Ok(_) => self.counters.datagrams_sent += 1,
                    Err(_) => self.counters.datagrams_send_failed += 1,
                }
            }
        }
    }

    fn set_link(&mut self, neighbour: NodeId, emulation: Emulation) {
        match self.wan.get_mut(&neighbour) {
            Some(w) => {
                info!(node = self.me.0, %neighbour, ?emulation, "link emulation changed");
                w.set(emulation);
            }
            None => warn!(node = self.me.0, %neighbour, "no such neighbour"),
        }
    }

    fn reload(&mut self) {
        let file = match OverlayFile::load(&self.file.path) {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, "SIGHUP: the overlay file is invalid; nothing changed");
                return;
            }
        };
        for (n, e) in file.neighbours(self.me.0) {
            if self.wan.get(&n).is_some_and(|w| w.emulation() != e) {
                self.set_link(n, e);
            }
        }
        let f = file.faulty_drop(self.me.0);
        if f != self.faulty.drop_fraction() {
            warn!(
                node = self.me.0,
                drop = f,
                "TEST ONLY: faulty relay fraction set"
            );
            self.faulty.set_drop_fraction(f);
        }
        info!(node = self.me.0, "SIGHUP: links and faulty entries reread");
    }

    fn status(&self) -> serde_json::Value {
        let s = self.node.stats();
        let links: Vec<_> = self
            .node
            .links()
            .into_iter()
            .map(|l| {
                serde_json::json!({
                    "neighbour": l.neighbour.0, "up": l.up, "srtt_ms": l.srtt_ms,
                    "loss_permille": l.loss_permille, "queued_msgs": l.queued_msgs,
                    "in_flight_frames": l.in_flight_frames,
                })
            })
            .collect();
        let routes: BTreeMap<String, Vec<u16>> = (0..self.file.nodes.len() as u16)
            .filter(|&n| n != self.me.0)
            .filter_map(|n| {
                let r = self.node.route_to(NodeId(n))?;
                Some((n.to_string(), r.iter().map(|x| x.0).collect()))
            })
            .collect();
        let heavy: Vec<_> = self
            .node
            .heavy_links()
            .into_iter()
            .map(|(l, w)| serde_json::json!({"link": [l.lo.0, l.hi.0], "weight": w}))
            .collect();
        let drops: BTreeMap<&str, u64> = s
            .drops_nonzero()
            .into_iter()
            .map(|(r, n)| (r.name(), n))
            .collect();
        serde_json::json!({
            "node": self.me.0,
            "uptime_ms": self.started.elapsed().as_millis() as u64,
            "daemon": Counters {
                tunnels: self.conns.counters.clone(),
                ..self.counters.clone()
            },
            "core": {
                "frames_received": s.frames_received, "frames_sent": s.frames_sent,
                "link_retransmits": s.link_retransmits, "e2e_retransmits": s.e2e_retransmits,
                "messages_submitted": s.messages_submitted,
                "messages_delivered": s.messages_delivered,
                "packets_sent": s.packets_sent, "packets_forwarded": s.packets_forwarded,
                "packets_acked": s.packets_acked, "packets_lost": s.packets_lost,
                "probes_inserted": s.probes_inserted, "accusations": s.accusations,
                "route_changes": s.route_changes, "drops": drops,
            },
            "links": links,
            "routes": routes,
            "heavy_links": heavy,
        })
    }
}

async fn recv_opt(s: Option<&mut tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Accepts the local connections of one tunnel port and hands them to the event loop.
async fn accept_tunnel(
    listener: TcpListener,
    port: usize,
    peer: NodeId,
    inbox: mpsc::Sender<Inbox>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let item = Inbox::Accepted {
                    port,
                    peer,
                    stream,
                    from,
                };
                if inbox.send(item).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                warn!(%peer, error = %e, "tunnel accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
