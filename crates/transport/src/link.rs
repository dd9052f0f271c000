//! The dialing side: a connection to one address that reconnects forever.

use crate::frame::{read_buffered_frame, write_frame, FrameError, READ_BUFFER_BYTES};
use crate::outbox::{outbox, OutboxRx, OutboxTx, Refused};
use crate::Bytes;
use crate::{jittered, LinkError};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

/// Tuning of a [`Link`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// Frames waiting to be written; beyond this [`Link::send`] drops (at least 1 is used).
    pub frames_queued_max: usize,
    /// Bytes of the frames waiting to be written; beyond this [`Link::send`] drops (at least
    /// `frame_bytes_max` is used, so that any frame can be queued).
    pub bytes_queued_max: usize,
    /// Largest frame sent or accepted (bytes). A bigger incoming frame closes the connection.
    pub frame_bytes_max: usize,
    /// First reconnection delay; doubled after every failure up to `backoff_max`.
    pub backoff_min: Duration,
    /// Cap of the reconnection delay.
    pub backoff_max: Duration,
    /// Give up a connection attempt after this long.
    pub connect_timeout: Duration,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            frames_queued_max: 1024,
            bytes_queued_max: 64 << 20,
            frame_bytes_max: 32 << 20,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// Counters of a [`Link`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Whether a TCP connection is established right now.
    pub connected: bool,
    /// Frames handed to the socket.
    pub frames_sent: u64,
    /// Frames [`Link::send`] dropped because the outgoing queue was full.
    pub frames_dropped_full: u64,
    /// Frames received and delivered to `inbound`.
    pub frames_received: u64,
    /// Frames received but dropped because `inbound` was full.
    pub frames_dropped_inbound: u64,
    /// Connections established after the first one.
    pub reconnects: u64,
    /// Connection attempts that failed or timed out.
    pub connect_failures: u64,
    /// Connections closed because the peer announced a frame above `frame_bytes_max`.
    pub closed_too_large: u64,
    /// Frames waiting in the outgoing queue.
    pub queue_len: usize,
    /// Bytes of the frames waiting in the outgoing queue.
    pub queue_bytes: usize,
}

#[derive(Default)]
struct Counters {
    connected: AtomicBool,
    frames_sent: AtomicU64,
    frames_dropped_full: AtomicU64,
    frames_received: AtomicU64,
    frames_dropped_inbound: AtomicU64,
    reconnects: AtomicU64,
    connect_failures: AtomicU64,
    closed_too_large: AtomicU64,
}

/// Where a link delivers the frames its peer sends: a channel, or anything that can take a
/// frame without waiting (a router that hands each frame to one of several consumers).
pub trait Inbound: Send + Sync + 'static {
    /// Takes one frame; `false` if it had to drop it (a full queue).
    fn deliver(&self, frame: Vec<u8>) -> bool;
}

impl Inbound for mpsc::Sender<Vec<u8>> {
    fn deliver(&self, frame: Vec<u8>) -> bool {
        self.try_send(frame).is_ok()
    }
}

/// A connection to one remote address that reconnects forever, with exponential jittered
/// back-off between attempts, and a bounded outgoing queue.
///
/// Frames queued while the connection is down wait (up to the queue bound) and go out once it
/// is up again; frames the peer sends on the connection go to the [`Inbound`] (a channel,
/// typically) given to [`Link::spawn`]. Cloning is cheap and every clone drives the same connection; the
/// connection task stops on [`Link::close`] or when the last clone is dropped.
#[derive(Clone)]
pub struct Link {
    inner: Arc<Inner>,
}

struct Inner {
    addr: SocketAddr,
    frame_bytes_max: usize,
    queue: OutboxTx,
    counters: Arc<Counters>,
    closed: watch::Sender<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.send_replace(true);
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.inner.addr)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Link {
    /// Starts the connection task (on the current tokio runtime) and returns its handle.
    /// Never fails: an unreachable address is retried until the link is closed.
    pub fn spawn(addr: SocketAddr, cfg: LinkConfig, inbound: impl Inbound) -> Link {
        let (queue, rx) = outbox(
            cfg.frames_queued_max,
            cfg.bytes_queued_max.max(cfg.frame_bytes_max),
        );
        let (closed, closed_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let frame_bytes_max = cfg.frame_bytes_max;
        tokio::spawn(run(addr, cfg, rx, inbound, counters.clone(), closed_rx));
        Link {
            inner: Arc::new(Inner {
                addr,
                frame_bytes_max,
                queue,
                counters,
                closed,
            }),
        }
    }

    /// The remote address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Queues a frame; never blocks. When the queue is full (in frames or in bytes) the frame
    /// is dropped and counted (the protocol retransmits) and `Err(Full)` returned.
    pub fn send(&self, frame: Bytes) -> Result<(), LinkError> {
        if frame.len() > self.inner.frame_bytes_max {
            return Err(LinkError::TooLarge {
                len: frame.len(),
                max: self.inner.frame_bytes_max,
            });
        }
        if *self.inner.closed.borrow() {
            return Err(LinkError::Closed);
        }
        match self.inner.queue.try_send(frame) {
            Ok(()) => Ok(()),
            Err(Refused::Full) => {
                self.inner
                    .counters
                    .frames_dropped_full
                    .fetch_add(1, Relaxed);
                Err(LinkError::Full)
            }
            Err(Refused::Closed) => Err(LinkError::Closed),
        }
    }

    /// A snapshot of the counters.
    /// Connections established after the first one (cheaper than [`Link::stats`]).
    pub fn reconnects(&self) -> u64 {
        self.inner.counters.reconnects.load(Relaxed)
    }

    pub fn stats(&self) -> LinkStats {
        let c = &self.inner.counters;
        let q = &self.inner.queue;
        LinkStats {
            connected: c.connected.load(Relaxed),
            frames_sent: c.frames_sent.load(Relaxed),
            frames_dropped_full: c.frames_dropped_full.load(Relaxed),
            frames_received: c.frames_received.load(Relaxed),
            frames_dropped_inbound: c.frames_dropped_inbound.load(Relaxed),
            reconnects: c.reconnects.load(Relaxed),
            connect_failures: c.connect_failures.load(Relaxed),
            closed_too_large: c.closed_too_large.load(Relaxed),
            queue_len: q.frames(),
            queue_bytes: q.bytes(),
        }
    }

    /// Closes the connection and stops reconnecting, for every clone. Queued frames are
    /// discarded; later sends return `Err(Closed)`.
    pub fn close(&self) {
        self.inner.closed.send_replace(true);
    }
}

/// Resolves once the link is closed (or every handle is gone).
async fn closed(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|c| *c).await;
}

/// How a connection ended.
enum End {
    /// Every handle is gone: stop.
    QueueClosed,
    /// The connection failed; reconnect.
    Broken(String),
}

/// The connection task: connect, serve, back off, repeat.
async fn run<I: Inbound>(
    addr: SocketAddr,
    cfg: LinkConfig,
    mut queue: OutboxRx,
    inbound: I,
    counters: Arc<Counters>,
    mut closed_rx: watch::Receiver<bool>,
) {
    let mut backoff = cfg.backoff_min;
    let mut connected_before = false;
    loop {
        let attempt = tokio::select! {
            r = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(addr)) => r,
            _ = closed(&mut closed_rx) => break,
        };
        match attempt {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                if connected_before {
                    counters.reconnects.fetch_add(1, Relaxed);
                }
                connected_before = true;
                counters.connected.store(true, Relaxed);
                debug!(%addr, "link connected");
                let started = Instant::now();
                let received_before = counters.frames_received.load(Relaxed);
                let end = tokio::select! {
                    end = serve(stream, &mut queue, &inbound, &counters, cfg.frame_bytes_max) => end,
                    _ = closed(&mut closed_rx) => End::QueueClosed,
                };
                counters.connected.store(false, Relaxed);
                match end {
                    End::QueueClosed => break,
                    End::Broken(reason) => debug!(%addr, %reason, "link disconnected"),
                }
                // A connection that worked for a while (or delivered something) resets the
                // back-off; one that a peer keeps accepting and dropping does not.
                if started.elapsed() >= cfg.backoff_max
                    || counters.frames_received.load(Relaxed) > received_before
                {
                    backoff = cfg.backoff_min;
                }
            }
            Ok(Err(e)) => {
                counters.connect_failures.fetch_add(1, Relaxed);
                debug!(%addr, error = %e, "link connect failed");
            }
            Err(_) => {
                counters.connect_failures.fetch_add(1, Relaxed);
                debug!(%addr, timeout = ?cfg.connect_timeout, "link connect timed out");
            }
        }
        let delay = jittered(backoff).max(cfg.backoff_min);
        backoff = backoff
            .saturating_mul(2)
            .min(cfg.backoff_max.max(cfg.backoff_min));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = closed(&mut closed_rx) => break,
        }
    }
    counters.connected.store(false, Relaxed);
}

/// Moves frames both ways on one connection until it breaks or the queue closes.
async fn serve<I: Inbound>(
    stream: TcpStream,
    queue: &mut OutboxRx,
    inbound: &I,
    counters: &Counters,
    frame_bytes_max: usize,
) -> End {
    let peer = stream.peer_addr().ok();
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(READ_BUFFER_BYTES, rd);
    let reader = async {
        loop {
            match read_buffered_frame(&mut rd, frame_bytes_max).await {
                Ok(frame) => {
                    if inbound.deliver(frame) {
                        counters.frames_received.fetch_add(1, Relaxed);
                    } else {
                        counters.frames_dropped_inbound.fetch_add(1, Relaxed);
                    }
                }
                Err(e @ FrameError::TooLarge { .. }) => {
                    counters.closed_too_large.fetch_add(1, Relaxed);
                    warn!(?peer, reason = %e, "closing link connection");
                    return e.to_string();
                }
                Err(e) => return e.to_string(),
            }
        }
    };
    let writer = async {
        let mut w = BufWriter::new(wr);
        loop {
            let Some(frame) = queue.recv().await else {
                let _ = w.flush().await;
                return End::QueueClosed;
            };
            let mut next = Some(frame);
            // Write everything already queued, then flush once.
            while let Some(frame) = next {
                if let Err(e) = write_frame(&mut w, &frame).await {
                    return End::Broken(e.to_string());
                }
                counters.frames_sent.fetch_add(1, Relaxed);
                next = queue.try_recv();
            }
            if let Err(e) = w.flush().await {
                return End::Broken(e.to_string());
            }
        }
    };
    tokio::select! {
        reason = reader => End::Broken(reason),
        end = writer => end,
    }
}
