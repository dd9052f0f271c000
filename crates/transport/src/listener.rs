//! The accepting side: one reader and one writer task per connection, all bounded.

use crate::frame::{read_buffered_frame, write_frame, FrameError, READ_BUFFER_BYTES};
use crate::outbox::{outbox, OutboxRx, OutboxTx, Refused};
use crate::Bytes;
use crate::LinkError;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

/// Identifies one accepted connection for the lifetime of its [`Listener`]; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "conn{}", self.0)
    }
}

/// Tuning of a [`Listener`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Largest frame accepted or sent (bytes). A bigger incoming frame closes its connection.
    pub frame_bytes_max: usize,
    /// Frames waiting to be written on one connection; beyond this [`Listener::send`] drops.
    pub per_conn_queue_max: usize,
    /// Bytes of the frames waiting to be written on one connection; beyond this
    /// [`Listener::send`] drops (at least `frame_bytes_max` is used, so that any frame can be
    /// queued).
    pub per_conn_queue_bytes_max: usize,
    /// Open connections at once; further connections are accepted and closed at once.
    pub connections_max: usize,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            frame_bytes_max: 32 << 20,
            per_conn_queue_max: 256,
            per_conn_queue_bytes_max: 8 << 20,
            connections_max: 1024,
        }
    }
}

/// Counters of a [`Listener`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Connections open right now.
    pub connections_open: usize,
    /// Connections accepted (and served) so far.
    pub accepted: u64,
    /// Connections refused because `connections_max` were open.
    pub refused_connections_max: u64,
    /// Frames received and delivered to `inbound`.
    pub frames_received: u64,
    /// Frames received but dropped because `inbound` was full.
    pub frames_dropped_inbound: u64,
    /// Frames handed to a socket.
    pub frames_sent: u64,
    /// Frames [`Listener::send`] dropped because the connection's queue was full.
    pub frames_dropped_full: u64,
    /// Connections closed because the peer announced a frame above `frame_bytes_max`.
    pub rejected_too_large: u64,
    /// Connections closed by [`Listener::close_conn`] (the caller found garbage).
    pub closed_bad_frames: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    refused_connections_max: AtomicU64,
    frames_received: AtomicU64,
    frames_dropped_inbound: AtomicU64,
    frames_sent: AtomicU64,
    frames_dropped_full: AtomicU64,
    rejected_too_large: AtomicU64,
    closed_bad_frames: AtomicU64,
}

/// What the listener keeps per open connection. Dropping it closes the connection.
struct Conn {
    queue: OutboxTx,
    _close: oneshot::Sender<()>,
}

/// State shared by the handles, the accept loop and the connection tasks.
struct Shared {
    cfg: ListenerConfig,
    conns: Mutex<HashMap<ConnId, Conn>>,
    counters: Counters,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, HashMap<ConnId, Conn>> {
        // Nothing panics while holding the lock; recover anyway rather than propagate.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a listener's connections deliver the frames they read: a channel of
/// `(ConnId, frame)`, or anything that can take a frame without waiting (a host that decodes
/// it on the reading task's thread first, then queues it).
pub trait ConnInbound: Clone + Send + Sync + 'static {
    /// Takes one frame read on connection `conn`; `false` if it had to drop it (a full queue).
    fn deliver(&self, conn: ConnId, frame: Vec<u8>) -> bool;
}

impl ConnInbound for mpsc::Sender<(ConnId, Vec<u8>)> {
    fn deliver(&self, conn: ConnId, frame: Vec<u8>) -> bool {
        self.try_send((conn, frame)).is_ok()
    }
}

/// A TCP accept loop. Each accepted connection gets a reader task that delivers
/// `(ConnId, frame)` to the `inbound` given to [`Listener::bind`] (dropping and
/// counting when it is full) and a writer task draining a bounded per-connection queue that
/// [`Listener::send`] fills. Cloning is cheap; the listener and all its connections stop on
/// [`Listener::close`] or when the last clone is dropped.
#[derive(Clone)]
pub struct Listener {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    closed: watch::Sender<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.send_replace(true);
        self.shared.conns().clear();
    }
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.inner.local_addr)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Listener {
    /// Binds `addr` and starts accepting on the current tokio runtime. A bind failure (such as
    /// the port being in use) is returned for the caller to report.
    pub async fn bind(
        addr: SocketAddr,
        cfg: ListenerConfig,
        inbound: impl ConnInbound,
    ) -> std::io::Result<Listener> {
        let tcp = TcpListener::bind(addr).await?;
        let local_addr = tcp.local_addr()?;
        let shared = Arc::new(Shared {
            cfg,
            conns: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        });
        let (closed, closed_rx) = watch::channel(false);
        tokio::spawn(accept_loop(tcp, shared.clone(), inbound, closed_rx));
        Ok(Listener {
            inner: Arc::new(Inner {
                shared,
                local_addr,
                closed,
            }),
        })
    }

    /// The bound address (with the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Queues a frame for `conn`; never blocks. The frame is dropped (and an error returned)
    /// when the connection's queue is full or the connection is gone.
    pub fn send(&self, conn: ConnId, frame: Bytes) -> Result<(), LinkError> {
        let shared = &self.inner.shared;
        let max = shared.cfg.frame_bytes_max;
        if frame.len() > max {
            return Err(LinkError::TooLarge {
                len: frame.len(),
                max,
            });
        }
        let conns = shared.conns();
        let Some(c) = conns.get(&conn) else {
            return Err(LinkError::UnknownConn);
        };
        enqueue(shared, &c.queue, frame)
    }

    /// A handle that writes to `conn` without going through the listener (for a task that
    /// answers on one connection), or `None` if the connection is not open. It behaves like
    /// [`Listener::send`] and fails with `UnknownConn` once the connection is closed.
    pub fn sender(&self, conn: ConnId) -> Option<ConnSender> {
        let shared = &self.inner.shared;
        let queue = shared.conns().get(&conn)?.queue.clone();
        Some(ConnSender {
            conn,
            queue,
            shared: shared.clone(),
        })
    }

    /// Closes one connection at once, discarding what is queued for it (used when a peer sends
    /// garbage). Unknown or already closed connections are ignored.
    pub fn close_conn(&self, conn: ConnId) {
        let shared = &self.inner.shared;
        if shared.conns().remove(&conn).is_some() {
            shared.counters.closed_bad_frames.fetch_add(1, Relaxed);
            debug!(%conn, "connection closed by the listener's owner");
        }
    }

    /// Whether `conn` is still open.
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.inner.shared.conns().contains_key(&conn)
    }

    /// Stops accepting and closes every connection, for every clone.
    pub fn close(&self) {
        self.inner.closed.send_replace(true);
        self.inner.shared.conns().clear();
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ListenerStats {
        let s = &self.inner.shared;
        let c = &s.counters;
        ListenerStats {
            connections_open: s.conns().len(),
            accepted: c.accepted.load(Relaxed),
            refused_connections_max: c.refused_connections_max.load(Relaxed),
            frames_received: c.frames_received.load(Relaxed),
            frames_dropped_inbound: c.frames_dropped_inbound.load(Relaxed),
            frames_sent: c.frames_sent.load(Relaxed),
            frames_dropped_full: c.frames_dropped_full.load(Relaxed),
            rejected_too_large: c.rejected_too_large.load(Relaxed),
            closed_bad_frames: c.closed_bad_frames.load(Relaxed),
        }
    }
}

/// Writes frames to one connection of a [`Listener`]; see [`Listener::sender`].
#[derive(Clone)]
pub struct ConnSender {
    conn: ConnId,
    queue: OutboxTx,
    shared: Arc<Shared>,
}

impl ConnSender {
    /// The connection this handle writes to.
    pub fn conn(&self) -> ConnId {
        self.conn
    }

    /// Queues a frame; never blocks. Dropped with an error when the queue is full or the
    /// connection is closed.
    pub fn send(&self, frame: Bytes) -> Result<(), LinkError> {
        let max = self.shared.cfg.frame_bytes_max;
        if frame.len() > max {
            return Err(LinkError::TooLarge {
                len: frame.len(),
                max,
            });
        }
        enqueue(&self.shared, &self.queue, frame)
    }
}

impl std::fmt::Debug for ConnSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnSender")
            .field("conn", &self.conn)
            .finish()
    }
}

fn enqueue(shared: &Shared, queue: &OutboxTx, frame: Bytes) -> Result<(), LinkError> {
    match queue.try_send(frame) {
        Ok(()) => Ok(()),
        Err(Refused::Full) => {
            shared.counters.frames_dropped_full.fetch_add(1, Relaxed);
            Err(LinkError::Full)
        }
        Err(Refused::Closed) => Err(LinkError::UnknownConn),
    }
}

async fn accept_loop<I: ConnInbound>(
    tcp: TcpListener,
    shared: Arc<Shared>,
    inbound: I,
    mut closed: watch::Receiver<bool>,
) {
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            a = tcp.accept() => a,
            _ = closed.wait_for(|c| *c) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Typically out of file descriptors: wait instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if *closed.borrow() {
            break; // closed while this connection was being accepted
        }
        let mut conns = shared.conns();
        if conns.len() >= shared.cfg.connections_max {
            drop(conns);
            shared
                .counters
                .refused_connections_max
                .fetch_add(1, Relaxed);
            debug!(%peer, max = shared.cfg.connections_max, "connection refused: too many open");
            continue; // dropping `stream` closes it
        }
        let id = ConnId(next_id);
        next_id += 1;
        let (queue, rx) = outbox(
            shared.cfg.per_conn_queue_max,
            shared
                .cfg
                .per_conn_queue_bytes_max
                .max(shared.cfg.frame_bytes_max),
        );
        let (close, close_rx) = oneshot::channel();
        conns.insert(
            id,
            Conn {
                queue,
                _close: close,
            },
        );
        drop(conns);
        shared.counters.accepted.fetch_add(1, Relaxed);
        debug!(%peer, conn = %id, "connection accepted");
        tokio::spawn(serve(
            id,
            peer,
            stream,
            rx,
            close_rx,
            shared.clone(),
            inbound.clone(),
        ));
    }
    debug!("listener closed");
}

/// Serves one connection until it breaks or the listener drops its entry.
async fn serve<I: ConnInbound>(
    id: ConnId,
    peer: SocketAddr,
    stream: TcpStream,
    mut queue: OutboxRx,
    close: oneshot::Receiver<()>,
    shared: Arc<Shared>,
    inbound: I,
) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(READ_BUFFER_BYTES, rd);
    let counters = &shared.counters;
    let max = shared.cfg.frame_bytes_max;
    let reader = async {
        loop {
            match read_buffered_frame(&mut rd, max).await {
                Ok(frame) => {
                    if inbound.deliver(id, frame) {
                        counters.frames_received.fetch_add(1, Relaxed);
                    } else {
                        counters.frames_dropped_inbound.fetch_add(1, Relaxed);
                    }
                }
                Err(e @ FrameError::TooLarge { .. }) => {
                    counters.rejected_too_large.fetch_add(1, Relaxed);
                    warn!(%peer, conn = %id, reason = %e, "closing connection");
                    return;
                }
                Err(FrameError::Closed) => return,
                Err(e) => {
                    debug!(%peer, conn = %id, reason = %e, "connection broken");
                    return;
                }
            }
        }
    };
    let writer = async {
        let mut w = BufWriter::new(wr);
        while let Some(frame) = queue.recv().await {
            let mut next = Some(frame);
            while let Some(frame) = next {
                if write_frame(&mut w, &frame).await.is_err() {
                    return;
                }
                counters.frames_sent.fetch_add(1, Relaxed);
                next = queue.try_recv();
            }
            if w.flush().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = reader => {}
        _ = writer => {}
        _ = close => {}
    }
    shared.conns().remove(&id);
    debug!(%peer, conn = %id, "connection closed");
}
