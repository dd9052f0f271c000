//! Connections to every replica of a cluster, shared by the clients of one process: each
//! connection's reader hands a frame to the client it is for, by the reply header inside,
//! with no task in between; bounded per client in frames and bytes.

use redoubt_core::message::{reply_header, ReplyHeader};
use redoubt_core::ClientId as Id;
use redoubt_transport::{ByteBudget, Charge, Inbound, Link, LinkConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Frames received from all replicas waiting for the client's invocation to take them.
const INBOUND_QUEUE: usize = 1024;
/// Bytes of those frames (raised to one largest frame).
const INBOUND_BYTES: usize = 4 << 20;
/// Frames waiting to be written to one replica. A client has one request outstanding, so a
/// handful suffices; more would only delay fresh retransmissions behind stale ones.
const LINK_QUEUE: usize = 16;

/// Frames waiting to be written to one replica on connections shared by many clients, per
/// client sharing them.
const SHARED_LINK_QUEUE_PER_CLIENT: usize = 8;

/// Bytes of the frames waiting to be written to one replica (raised to one largest frame).
const LINK_QUEUE_BYTES: usize = 64 << 20;

/// Connections to every replica of a cluster, shared by the clients of one process (see
/// [`Client::connect_over`]). Each connection's reader hands a reply to the client it is for
/// (by the client id inside the reply) if that client still waits for it (by the request
/// timestamp inside); a replica's request for a client's key goes to every client on the
/// connection. Cheap to clone; the connections close when the last clone and the last
/// client using them are gone.
#[derive(Clone)]
pub struct Connections {
    pub(crate) links: Vec<Link>,
    routes: Arc<Mutex<HashMap<Id, Route>>>,
    pub(crate) frame_bytes_max: usize,
    unwanted: Arc<AtomicU64>,
}

/// Hands the frames the shared connections receive to their clients, from each connection's
/// reader (no task in between).
#[derive(Clone)]
struct Router {
    routes: std::sync::Weak<Mutex<HashMap<Id, Route>>>,
    unwanted: Arc<AtomicU64>,
    pub(crate) frame_bytes_max: usize,
}

impl Inbound for Router {
    fn deliver(&self, frame: Vec<u8>) -> bool {
        let Some(table) = self.routes.upgrade() else {
            return false; // the connections are being closed
        };
        // The sends do not wait, so the table's lock is held only briefly. A full client
        // queue drops the frame, as a full link would.
        let t = table.lock().unwrap_or_else(|p| p.into_inner());
        match demux_target(&frame, self.frame_bytes_max) {
            Some(h) => match t.get(&h.client) {
                Some(route) if route.wanted.load(Acquire) == h.timestamp => {
                    route.offer(Arc::new(frame), Some(h))
                }
                Some(_) => {
                    // Beyond the certificate, or late: not worth waking the client (it would
                    // drop it too).
                    self.unwanted.fetch_add(1, Relaxed);
                    true
                }
                None => true, // for no client of ours
            },
            None => {
                // One copy shared by every client's queue (each charges its own budget), so a
                // faulty replica's frame costs its size once, not once per client.
                let frame = Arc::new(frame);
                for route in t.values() {
                    let _ = route.offer(frame.clone(), None);
                }
                true
            }
        }
    }
}

/// A frame queued for one client: its reply header as the router read it (`None`: not a
/// reply), and the charge on the client's byte budget it holds until taken.
pub(crate) struct Arrived {
    pub(crate) frame: Arc<Vec<u8>>,
    pub(crate) header: Option<ReplyHeader>,
    pub(crate) charge: Charge,
}

/// Where the replies for one client go.
struct Route {
    tx: mpsc::Sender<Arrived>,
    /// The timestamp of the client's outstanding request (0: none), published by its invocations.
    wanted: Arc<AtomicU64>,
    /// The bytes `tx`'s queue may hold: frames wait there between invocations, and a faulty
    /// replica may send large ones. Each queued frame carries its charge.
    budget: Arc<ByteBudget>,
}

impl Route {
    /// Queues `frame` for the client unless the queue is full in frames or in bytes.
    fn offer(&self, frame: Arc<Vec<u8>>, header: Option<ReplyHeader>) -> bool {
        match self.budget.charge(frame.len()) {
            Some(charge) => self
                .tx
                .try_send(Arrived {
                    frame,
                    header,
                    charge,
                })
                .is_ok(),
            None => false,
        }
    }
}

impl Connections {
    /// Opens reconnecting connections to `replicas` (index = replica id) for up to
    /// `clients_max` clients (it sizes the outgoing queues). Must be called inside a tokio
    /// runtime.
    pub fn open(replicas: &[SocketAddr], clients_max: usize, frame_bytes_max: usize) -> Self {
        let routes: Arc<Mutex<HashMap<Id, Route>>> = Arc::default();
        let unwanted = Arc::new(AtomicU64::new(0));
        let router = Router {
            routes: Arc::downgrade(&routes),
            unwanted: unwanted.clone(),
            frame_bytes_max,
        };
        let link_cfg = LinkConfig {
            frames_queued_max: (SHARED_LINK_QUEUE_PER_CLIENT * clients_max).max(LINK_QUEUE),
            bytes_queued_max: LINK_QUEUE_BYTES.max(frame_bytes_max),
            frame_bytes_max,
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
        };
        let links: Vec<Link> = replicas
            .iter()
            .map(|addr| Link::spawn(*addr, link_cfg.clone(), router.clone()))
            .collect();
        Connections {
            links,
            routes,
            frame_bytes_max,
            unwanted,
        }
    }

    /// Replies dropped on arrival because their client no longer waited for them (the
    /// replies beyond each request's certificate, mostly).
    pub fn unwanted_replies(&self) -> u64 {
        self.unwanted.load(Relaxed)
    }

    /// Registers client `id`, whose invocations publish the timestamp it waits for in `wanted`;
    /// `None` if a client with that id already uses the connections.
    pub(crate) fn attach(&self, id: Id, wanted: Arc<AtomicU64>) -> Option<Received> {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        match routes.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(e) => {
                let (tx, frames) = mpsc::channel(INBOUND_QUEUE);
                e.insert(Route {
                    tx,
                    wanted,
                    budget: ByteBudget::new(INBOUND_BYTES.max(self.frame_bytes_max)),
                });
                Some(frames)
            }
        }
    }

    pub(crate) fn detach(&self, id: Id) {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
}

/// A client's end of its route: each frame with its charge of the route's byte budget, returned
/// when the frame is taken.
pub(crate) type Received = mpsc::Receiver<Arrived>;

/// The client a frame from a replica is for, and the request it answers: the client and
/// timestamp named in a reply; `None` (every client) for anything else a replica sends
/// clients (its NEW-KEY asking for their keys) or for a frame that does not decode (each
/// client counts it as rejected).
fn demux_target(frame: &[u8], max: usize) -> Option<ReplyHeader> {
    if frame.len() > max {
        return None;
    }
    reply_header(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_bounded_in_bytes_and_frames_and_gives_bytes_back() {
        let (tx, mut received) = mpsc::channel(4);
        let budget = ByteBudget::new(100);
        let route = Route {
            tx,
            wanted: Arc::new(AtomicU64::new(0)),
            budget: budget.clone(),
        };
        assert!(route.offer(Arc::new(vec![0; 60]), None));
        // 60 + 50 > 100: refused, and the refusal leaves the count as it was.
        assert!(!route.offer(Arc::new(vec![0; 50]), None));
        assert_eq!(budget.queued(), 60);
        assert!(route.offer(Arc::new(vec![0; 40]), None));
        assert!(route.offer(Arc::default(), None));
        assert!(route.offer(Arc::default(), None));
        // Four frames: the channel's bound refuses a fifth, even an empty one, and gives its
        // bytes back.
        assert!(!route.offer(Arc::default(), None));
        assert_eq!(budget.queued(), 100);
        let taken = received.try_recv().unwrap();
        drop(taken);
        assert_eq!(budget.queued(), 40);
        // Room for 60 bytes again, and one frame.
        assert!(route.offer(Arc::new(vec![0; 60]), None));
        assert!(!route.offer(Arc::new(vec![0; 1]), None));
    }

    #[test]
    fn a_frame_for_every_client_is_queued_once_and_shared() {
        let routes: Arc<Mutex<HashMap<Id, Route>>> = Arc::default();
        let mut queues = Vec::new();
        for id in 1..=3 {
            let (tx, rx) = mpsc::channel(4);
            routes.lock().unwrap().insert(
                id,
                Route {
                    tx,
                    wanted: Arc::new(AtomicU64::new(0)),
                    budget: ByteBudget::new(1 << 20),
                },
            );
            queues.push(rx);
        }
        let router = Router {
            routes: Arc::downgrade(&routes),
            unwanted: Arc::default(),
            frame_bytes_max: 1 << 20,
        };
        // Not a reply (a faulty replica's garbage): every client gets it, to count it.
        assert!(router.deliver(vec![0xee; 100_000]));
        let frames: Vec<_> = queues
            .iter_mut()
            .map(|q| q.try_recv().unwrap().frame)
            .collect();
        assert!(frames.iter().all(|f| Arc::ptr_eq(f, &frames[0])));
        assert_eq!(frames[0].len(), 100_000);
    }
}
