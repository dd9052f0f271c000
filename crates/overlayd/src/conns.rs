//! Tunnel connections, both ways. A daemon accepts local TCP connections on its tunnel ports
//! (a replica dialling a peer, a client dialling a replica); for each it tells the peer's
//! daemon to OPEN one TCP connection to its replica, and then carries the frames each end
//! writes to the other end, in the ordered overlay flows between the two daemons. Either
//! end's connection ending (EOF, an error, a failed dial) CLOSEs the other.
//!
//! The table here is driven by the daemon's event loop: it takes what the connection tasks
//! report ([`Inbox`]) and the glued messages of the peers, and returns the messages to send
//! ([`Outgoing`]). Every connection is one task that reads whole frames from its socket and
//! writes the frames queued for it. Bounds: connections per tunnel port (and per source
//! tunnel at the far end), connections in all, frames and bytes queued per connection.

use crate::tunnel::{decode, encode, Header, Kind, Origin};
use redoubt_overlay::NodeId;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Longest wait for the local replica to accept a connection.
const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Longest a local connection may take to accept one frame before it is dropped (a peer
/// that stopped reading must not hold a task forever).
const WRITE_TIMEOUT_MS: u64 = 10_000;
/// Read buffer of one connection.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// What the connection tasks and tunnel ports report to the event loop.
pub(crate) enum Inbox {
    /// Tunnel port `port` (its index in the file's tunnels) towards `peer` accepted `stream`.
    Accepted {
        port: usize,
        peer: NodeId,
        stream: TcpStream,
        from: SocketAddr,
    },
    /// A whole frame read from local connection `slot`.
    Frame { slot: u64, frame: Vec<u8> },
    /// Local connection `slot` ended, or could not be opened.
    Closed { slot: u64, reason: String },
}

/// How the daemon admits a message into a destination's backlog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// A frame: dropped when it would take the backlog past `tunnel_backlog_bytes_max`.
    Data,
    /// The OPEN and the CLOSE of a connection of this table: at most one each per connection
    /// and connections are bounded (a connection is only taken while the backlog has room).
    Always,
    /// A CLOSE answering a message for a connection this table does not know: only while the
    /// backlog is under its bound.
    IfRoom,
}

/// A message for `dst`'s daemon.
pub(crate) struct Outgoing {
    pub dst: NodeId,
    pub msg: Vec<u8>,
    pub admit: Admit,
}

/// Counters of the tunnels (in the daemon's status line).
#[derive(Clone, Debug, Default, Serialize)]
pub struct TunnelCounters {
    /// Connections accepted on this daemon's tunnel ports.
    pub tunnel_conns_accepted: u64,
    /// Connections this daemon opened to its replica for another daemon's tunnel.
    pub tunnel_conns_opened: u64,
    /// Connections refused: a limit reached, a full backlog, or no replica here.
    pub tunnel_conns_refused: u64,
    /// Connections closed, by either end.
    pub tunnel_conns_closed: u64,
    /// Connections open now.
    pub tunnel_conns_open: u64,
    /// Frames read from local connections, into the overlay.
    pub tunnel_frames_in: u64,
    /// Frames from the overlay handed to local connections.
    pub tunnel_frames_out: u64,
    /// Frames refused because the destination's backlog was full.
    pub tunnel_frames_backlog_full: u64,
    /// Frames dropped because one local connection's queue was full.
    pub tunnel_frames_conn_full: u64,
    /// Chunks that did not glue into a message (malformed or oversized).
    pub tunnel_chunks_bad: u64,
    /// Glued messages that are malformed or break the protocol.
    pub tunnel_msgs_bad: u64,
    /// Messages for a connection already closed, or of a daemon's earlier incarnation.
    pub tunnel_msgs_stale: u64,
    /// CLOSE answers not sent because the backlog was full.
    pub tunnel_closes_dropped: u64,
}

/// The limits of [`Conns`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Connections one tunnel port accepts (and one source tunnel may have opened here).
    pub per_port: usize,
    /// Connections in all.
    pub total: usize,
    /// Frames queued towards one local connection.
    pub queue_frames: usize,
    /// Bytes queued towards one local connection (a frame always enters an empty queue).
    pub queue_bytes: usize,
    /// Largest frame read from a local connection.
    pub frame_bytes_max: usize,
}

/// Which end of its connection this daemon is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Accepted on tunnel port `port`; the connection's number is its slot here.
    Accepted { port: usize },
    /// Opened to the local replica for the peer's connection `id` of its incarnation `epoch`.
    Opened { epoch: u64, id: u64 },
}

struct Conn {
    peer: NodeId,
    side: Side,
    tx: mpsc::Sender<Vec<u8>>,
    queued_bytes: Arc<AtomicUsize>,
}

/// The tunnel connections of one daemon.
pub(crate) struct Conns {
    me: NodeId,
    /// This daemon's incarnation: it names the connections accepted here.
    epoch: u64,
    replica: Option<SocketAddr>,
    limits: Limits,
    /// Tunnels each source has to this node: it may have `per_port` connections open here
    /// for each.
    tunnels_from: BTreeMap<NodeId, usize>,
    next_slot: u64,
    conns: BTreeMap<u64, Conn>,
    /// Connections opened here: (peer, its incarnation, its number) to slot.
    opened: BTreeMap<(NodeId, u64, u64), u64>,
    /// Newest incarnation of each peer seen naming its own connections.
    peer_epochs: BTreeMap<NodeId, u64>,
    inbox: mpsc::Sender<Inbox>,
    pub counters: TunnelCounters,
}

impl Conns {
    pub fn new(
        me: NodeId,
        epoch: u64,
        replica: Option<SocketAddr>,
        limits: Limits,
        tunnels_from: BTreeMap<NodeId, usize>,
        inbox: mpsc::Sender<Inbox>,
    ) -> Conns {
        Conns {
            me,
            epoch,
            replica,
            limits,
            tunnels_from,
            next_slot: 1,
            conns: BTreeMap::new(),
            opened: BTreeMap::new(),
            peer_epochs: BTreeMap::new(),
            inbox,
            counters: TunnelCounters::default(),
        }
    }

    /// Counts a refused connection, warning on the first and then at powers of two.
    pub fn refused(&mut self, peer: NodeId, why: &str) {
        self.counters.tunnel_conns_refused += 1;
        let n = self.counters.tunnel_conns_refused;
        if n.is_power_of_two() {
            warn!(node = self.me.0, %peer, count = n, "tunnel connection refused: {why}");
        }
    }

    /// Takes a connection accepted on tunnel port `port` towards `peer`, within the limits,
    /// and asks `peer`'s daemon to open its end.
    pub fn accept(
        &mut self,
        port: usize,
        peer: NodeId,
        stream: TcpStream,
        from: SocketAddr,
        out: &mut Vec<Outgoing>,
    ) {
        let on_port = self
            .conns
            .values()
            .filter(|c| c.side == Side::Accepted { port })
            .count();
        if on_port >= self.limits.per_port {
            return self.refused(peer, "tunnel_conns_max reached on its port");
        }
        if self.conns.len() >= self.limits.total {
            return self.refused(peer, "tunnel_conns_total_max reached");
        }
        let slot = self.spawn(peer, Side::Accepted { port }, Target::Accepted(stream));
        self.counters.tunnel_conns_accepted += 1;
        debug!(node = self.me.0, %peer, %from, slot, "tunnel connection accepted");
        out.push(Outgoing {
            dst: peer,
            msg: encode(self.header(slot, Kind::Open), &[]),
            admit: Admit::Always,
        });
    }

    /// A frame read from local connection `slot`: to the other end.
    pub fn on_local_frame(&mut self, slot: u64, frame: Vec<u8>, out: &mut Vec<Outgoing>) {
        let Some(c) = self.conns.get(&slot) else {
            return;
        };
        self.counters.tunnel_frames_in += 1;
        out.push(Outgoing {
            dst: c.peer,
            msg: encode(self.header(slot, Kind::Data), &frame),
            admit: Admit::Data,
        });
    }

    /// Local connection `slot` ended: the other end closes too.
    pub fn on_local_closed(&mut self, slot: u64, reason: &str, out: &mut Vec<Outgoing>) {
        if !self.conns.contains_key(&slot) {
            return;
        }
        let close = encode(self.header(slot, Kind::Close), &[]);
        if let Some(c) = self.remove(slot) {
            debug!(node = self.me.0, peer = %c.peer, slot, reason, "tunnel connection closed here");
            out.push(Outgoing {
                dst: c.peer,
                msg: close,
                admit: Admit::Always,
            });
        }
    }

    /// `src`'s daemon started a new incarnation (its flow restarted): the connections opened
    /// here for its earlier one have no other end any more.
    pub fn on_peer_restart(&mut self, src: NodeId) {
        self.close_opened_for(src, u64::MAX);
    }

    /// A glued message from `src`'s daemon.
    pub fn on_message(&mut self, src: NodeId, msg: &[u8], out: &mut Vec<Outgoing>) {
        let (h, body) = match decode(msg) {
            Ok(m) => m,
            Err(e) => return self.bad(src, &e.to_string()),
        };
        match h.origin {
            Origin::Receiver => {
                // About a connection accepted here: only its peer speaks for it.
                let ours = h.epoch == self.epoch
                    && self
                        .conns
                        .get(&h.conn)
                        .is_some_and(|c| c.peer == src && matches!(c.side, Side::Accepted { .. }));
                if !ours {
                    self.counters.tunnel_msgs_stale += 1;
                    return;
                }
                match h.kind {
                    Kind::Open => self.bad(src, "OPEN for a connection accepted here"),
                    Kind::Data => self.deliver(h.conn, body),
                    Kind::Close => {
                        if self.remove(h.conn).is_some() {
                            debug!(node = self.me.0, %src, slot = h.conn, "tunnel connection closed by the far end");
                        }
                    }
                }
            }
            Origin::Sender => {
                let known = self.peer_epochs.get(&src).copied().unwrap_or(0);
                if h.epoch < known {
                    self.counters.tunnel_msgs_stale += 1;
                    return;
                }
                if h.epoch > known {
                    self.close_opened_for(src, h.epoch);
                    self.peer_epochs.insert(src, h.epoch);
                }
                let key = (src, h.epoch, h.conn);
                match (h.kind, self.opened.get(&key).copied()) {
                    (Kind::Open, None) => self.open_for(src, h.epoch, h.conn, out),
                    (Kind::Open, Some(_)) => self.bad(src, "OPEN for a connection already open"),
                    (Kind::Data, Some(slot)) => self.deliver(slot, body),
                    (Kind::Close, Some(slot)) => {
                        self.remove(slot);
                    }
                    (Kind::Data, None) => {
                        // Closed here already, or never opened (refused, or this daemon
                        // restarted): tell the sender to close its end.
                        self.counters.tunnel_msgs_stale += 1;
                        let h = Header {
                            kind: Kind::Close,
                            origin: Origin::Receiver,
                            ..h
                        };
                        out.push(Outgoing {
                            dst: src,
                            msg: encode(h, &[]),
                            admit: Admit::IfRoom,
                        });
                    }
                    (Kind::Close, None) => self.counters.tunnel_msgs_stale += 1,
                }
            }
        }
    }

    fn bad(&mut self, src: NodeId, why: &str) {
        self.counters.tunnel_msgs_bad += 1;
        let n = self.counters.tunnel_msgs_bad;
        if n.is_power_of_two() {
            warn!(node = self.me.0, %src, count = n, "tunnel message refused: {why}");
        }
    }

    /// The peer's connection `id` of its incarnation `epoch` was accepted there: open ours to
    /// the local replica, or answer with CLOSE.
    fn open_for(&mut self, src: NodeId, epoch: u64, id: u64, out: &mut Vec<Outgoing>) {
        let refuse = |why: &str, this: &mut Conns, out: &mut Vec<Outgoing>| {
            this.refused(src, why);
            let h = Header {
                kind: Kind::Close,
                origin: Origin::Receiver,
                epoch,
                conn: id,
            };
            out.push(Outgoing {
                dst: src,
                msg: encode(h, &[]),
                admit: Admit::IfRoom,
            });
        };
        let Some(replica) = self.replica else {
            return refuse("this node has no replica_addr", self, out);
        };
        let from_src = self
            .opened
            .range((src, 0, 0)..=(src, u64::MAX, u64::MAX))
            .count();
        let allowed = self.tunnels_from.get(&src).copied().unwrap_or(0) * self.limits.per_port;
        if from_src >= allowed {
            return refuse(
                "the source's tunnels have tunnel_conns_max open each",
                self,
                out,
            );
        }
        if self.conns.len() >= self.limits.total {
            return refuse("tunnel_conns_total_max reached", self, out);
        }
        let slot = self.spawn(src, Side::Opened { epoch, id }, Target::Dial(replica));
        self.opened.insert((src, epoch, id), slot);
        self.counters.tunnel_conns_opened += 1;
        debug!(node = self.me.0, %src, id, slot, "tunnel connection opened to the local replica");
    }

    /// Closes the connections opened here for `src`'s incarnations older than `epoch`.
    fn close_opened_for(&mut self, src: NodeId, epoch: u64) {
        let old: Vec<u64> = self
            .opened
            .range((src, 0, 0)..(src, epoch, 0))
            .map(|(_, &slot)| slot)
            .collect();
        if !old.is_empty() {
            info!(node = self.me.0, %src, conns = old.len(), "the peer restarted: closing the tunnel connections of its earlier incarnation");
        }
        for slot in old {
            self.remove(slot);
        }
    }

    /// Queues a frame for local connection `slot` within its bounds.
    fn deliver(&mut self, slot: u64, frame: &[u8]) {
        let Some(c) = self.conns.get(&slot) else {
            return;
        };
        let len = frame.len();
        let queued = c.queued_bytes.fetch_add(len, Relaxed);
        if queued > 0 && queued + len > self.limits.queue_bytes {
            c.queued_bytes.fetch_sub(len, Relaxed);
            self.counters.tunnel_frames_conn_full += 1;
            return;
        }
        if c.tx.try_send(frame.to_vec()).is_ok() {
            self.counters.tunnel_frames_out += 1;
        } else {
            c.queued_bytes.fetch_sub(len, Relaxed);
            self.counters.tunnel_frames_conn_full += 1;
        }
    }

    /// The header of a message about connection `slot` (which must exist).
    fn header(&self, slot: u64, kind: Kind) -> Header {
        match self.conns.get(&slot).map(|c| c.side) {
            Some(Side::Opened { epoch, id }) => Header {
                kind,
                origin: Origin::Receiver,
                epoch,
                conn: id,
            },
            _ => Header {
                kind,
                origin: Origin::Sender,
                epoch: self.epoch,
                conn: slot,
            },
        }
    }

    fn spawn(&mut self, peer: NodeId, side: Side, target: Target) -> u64 {
        let slot = self.next_slot;
        self.next_slot += 1;
        let (tx, rx) = mpsc::channel(self.limits.queue_frames.max(1));
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run_conn(
            slot,
            target,
            rx,
            queued_bytes.clone(),
            self.inbox.clone(),
            self.limits.frame_bytes_max,
        ));
        self.conns.insert(
            slot,
            Conn {
                peer,
                side,
                tx,
                queued_bytes,
            },
        );
        self.counters.tunnel_conns_open = self.conns.len() as u64;
        slot
    }

    /// Forgets connection `slot`; its task writes what is queued, then closes the socket.
    fn remove(&mut self, slot: u64) -> Option<Conn> {
        let c = self.conns.remove(&slot)?;
        if let Side::Opened { epoch, id } = c.side {
            self.opened.remove(&(c.peer, epoch, id));
        }
        self.counters.tunnel_conns_closed += 1;
        self.counters.tunnel_conns_open = self.conns.len() as u64;
        Some(c)
    }
}

enum Target {
    Accepted(TcpStream),
    Dial(SocketAddr),
}

/// One local connection: reads whole frames into the event loop, writes the frames queued for
/// it; ends when either fails or the loop drops the queue's sender (after writing the rest).
async fn run_conn(
    slot: u64,
    target: Target,
    mut rx: mpsc::Receiver<Vec<u8>>,
    queued_bytes: Arc<AtomicUsize>,
    inbox: mpsc::Sender<Inbox>,
    frame_bytes_max: usize,
) {
    let stream = match target {
        Target::Accepted(s) => s,
        Target::Dial(addr) => {
            let connect = TcpStream::connect(addr);
            match tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), connect).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    let reason = format!("cannot connect to the local replica at {addr}: {e}");
                    let _ = inbox.send(Inbox::Closed { slot, reason }).await;
                    return;
                }
                Err(_) => {
                    let reason = format!("connecting to the local replica at {addr} timed out");
                    let _ = inbox.send(Inbox::Closed { slot, reason }).await;
                    return;
                }
            }
        }
    };
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let reader = async {
        let mut rd = BufReader::with_capacity(READ_BUFFER_BYTES, rd);
        loop {
            match redoubt_transport::read_buffered_frame(&mut rd, frame_bytes_max).await {
                Ok(frame) => {
                    if inbox.send(Inbox::Frame { slot, frame }).await.is_err() {
                        return "the daemon stopped".to_string();
                    }
                }
                Err(e) => return format!("read: {e}"),
            }
        }
    };
    let writer = async {
        let mut w = BufWriter::new(wr);
        let limit = Duration::from_millis(WRITE_TIMEOUT_MS);
        while let Some(frame) = rx.recv().await {
            let res = tokio::time::timeout(limit, async {
                redoubt_transport::write_frame(&mut w, &frame).await?;
                if rx.is_empty() {
                    w.flush().await?;
                }
                std::io::Result::Ok(())
            })
            .await;
            queued_bytes.fetch_sub(frame.len(), Relaxed);
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return format!("write: {e}"),
                Err(_) => return format!("write: no progress in {WRITE_TIMEOUT_MS} ms"),
            }
        }
        let _ = tokio::time::timeout(limit, w.flush()).await;
        "closed by the other end".to_string()
    };
    let reason = tokio::select! {
        r = reader => r,
        r = writer => r,
    };
    // Unknown to the loop when it closed the connection itself; it then ignores this.
    let _ = inbox.send(Inbox::Closed { slot, reason }).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    const A: NodeId = NodeId(0);
    const B: NodeId = NodeId(1);

    fn limits() -> Limits {
        Limits {
            per_port: 1,
            total: 4,
            queue_frames: 8,
            queue_bytes: 1 << 16,
            frame_bytes_max: 1 << 16,
        }
    }

    /// Daemon A (no replica, a tunnel port towards B) and daemon B (its replica at
    /// `replica`), wired back to back: what one sends the other receives.
    struct Pair {
        a: Conns,
        b: Conns,
        a_rx: mpsc::Receiver<Inbox>,
        b_rx: mpsc::Receiver<Inbox>,
    }

    impl Pair {
        fn new(replica: SocketAddr) -> Pair {
            let (a_tx, a_rx) = mpsc::channel(64);
            let (b_tx, b_rx) = mpsc::channel(64);
            let a = Conns::new(A, 100, None, limits(), BTreeMap::new(), a_tx);
            let from_a = BTreeMap::from([(A, 1)]);
            let b = Conns::new(B, 200, Some(replica), limits(), from_a, b_tx);
            Pair { a, b, a_rx, b_rx }
        }

        /// Hands every message to its destination until none is left.
        fn carry(&mut self, mut out: Vec<Outgoing>) {
            while !out.is_empty() {
                let mut next = Vec::new();
                for o in out {
                    match o.dst {
                        B => self.b.on_message(A, &o.msg, &mut next),
                        _ => self.a.on_message(B, &o.msg, &mut next),
                    }
                }
                out = next;
            }
        }

        /// Runs both tables' connection reports for `ms`.
        async fn run(&mut self, ms: u64) {
            let until = tokio::time::Instant::now() + Duration::from_millis(ms);
            loop {
                let mut out = Vec::new();
                tokio::select! {
                    Some(i) = self.a_rx.recv() => handle(&mut self.a, i, &mut out),
                    Some(i) = self.b_rx.recv() => handle(&mut self.b, i, &mut out),
                    _ = tokio::time::sleep_until(until) => return,
                }
                self.carry(out);
            }
        }
    }

    fn handle(c: &mut Conns, item: Inbox, out: &mut Vec<Outgoing>) {
        match item {
            Inbox::Accepted { .. } => unreachable!("the test accepts by hand"),
            Inbox::Frame { slot, frame } => c.on_local_frame(slot, frame, out),
            Inbox::Closed { slot, reason } => c.on_local_closed(slot, &reason, out),
        }
    }

    /// A local connection accepted on A's tunnel port: (the dialler's end, A's end).
    async fn dial(port: &TcpListener) -> (TcpStream, TcpStream, SocketAddr) {
        let client = TcpStream::connect(port.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, from) = port.accept().await.unwrap();
        (client, accepted, from)
    }

    #[tokio::test]
    async fn frames_go_both_ways_and_a_close_crosses() {
        let replica = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut p = Pair::new(replica.local_addr().unwrap());
        let (mut client, accepted, from) = dial(&port).await;
        let mut out = Vec::new();
        p.a.accept(0, B, accepted, from, &mut out);
        assert_eq!(out.len(), 1, "an OPEN");
        p.carry(out);
        assert_eq!(p.b.counters.tunnel_conns_opened, 1);
        redoubt_transport::write_frame(&mut client, b"request")
            .await
            .unwrap();
        let (mut at_replica, _) = replica.accept().await.unwrap();
        p.run(200).await;
        let got = redoubt_transport::read_frame(&mut at_replica, 100)
            .await
            .unwrap();
        assert_eq!(got, b"request");
        // The reply comes back on the same connection.
        redoubt_transport::write_frame(&mut at_replica, b"reply")
            .await
            .unwrap();
        p.run(200).await;
        let got = redoubt_transport::read_frame(&mut client, 100)
            .await
            .unwrap();
        assert_eq!(got, b"reply");
        assert_eq!(p.a.counters.tunnel_frames_in, 1);
        assert_eq!(p.a.counters.tunnel_frames_out, 1);
        assert_eq!(p.b.counters.tunnel_frames_out, 1);
        // The replica hangs up: the dialler's connection ends too.
        drop(at_replica);
        p.run(200).await;
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(2), client.read(&mut buf))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "EOF at the dialler");
        assert_eq!(p.a.counters.tunnel_conns_open, 0);
        assert_eq!(p.b.counters.tunnel_conns_open, 0);
    }

    #[tokio::test]
    async fn limits_unreachable_replicas_and_old_incarnations_are_refused() {
        // Nothing listens at the replica's address.
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let replica = gone.local_addr().unwrap();
        drop(gone);
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut p = Pair::new(replica);
        let (mut client, accepted, from) = dial(&port).await;
        let mut out = Vec::new();
        p.a.accept(0, B, accepted, from, &mut out);
        // A second connection on the same port is over tunnel_conns_max = 1.
        let (_c2, accepted2, from2) = dial(&port).await;
        p.a.accept(0, B, accepted2, from2, &mut out);
        assert_eq!(p.a.counters.tunnel_conns_refused, 1);
        p.carry(out);
        // B cannot reach its replica: the dialler is closed.
        p.run(300).await;
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(3), client.read(&mut buf))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0);
        assert_eq!(p.a.counters.tunnel_conns_open, 0);
        // A message of an incarnation of A older than the one B saw is stale; DATA for a
        // connection B does not know is answered with CLOSE; garbage is counted as bad.
        let old = Header {
            kind: Kind::Open,
            origin: Origin::Sender,
            epoch: 99,
            conn: 7,
        };
        let mut out = Vec::new();
        p.b.on_message(A, &encode(old, &[]), &mut out);
        assert_eq!(p.b.counters.tunnel_msgs_stale, 1);
        let unknown = Header {
            kind: Kind::Data,
            epoch: 100,
            ..old
        };
        p.b.on_message(A, &encode(unknown, b"x"), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].admit, Admit::IfRoom);
        let (h, _) = decode(&out[0].msg).unwrap();
        assert_eq!(
            (h.kind, h.origin, h.conn),
            (Kind::Close, Origin::Receiver, 7)
        );
        p.b.on_message(A, b"junk", &mut out);
        assert_eq!(p.b.counters.tunnel_msgs_bad, 1);
        // A message about a connection B never accepted is stale.
        let forged = Header {
            kind: Kind::Close,
            origin: Origin::Receiver,
            epoch: 200,
            conn: 1,
        };
        p.b.on_message(A, &encode(forged, &[]), &mut out);
        assert_eq!(p.b.counters.tunnel_msgs_stale, 3);
    }
}
