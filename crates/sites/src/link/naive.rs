//! The naive logical link (Amir et al. 2009 §4, discussion; spec/attack.md §2.2): f+1 servers
//! of the sending site each send the whole signed message to f+1 servers of the receiving site.
//! At least one sender is correct and at least one of its receivers is correct, so the message
//! gets into the receiving site's local ordering whatever f servers on each side do; the cost
//! is up to (f+1)^2 copies of every message on the wide area.
//!
//! Which servers send and receive rotates with the message's number (servers seq, seq+1, ...,
//! seq+f modulo 3f+1 on both sides), so the load is spread and no fixed f+1 carry everything.

use super::{Executed, LinkEvent, LogicalLink, Wan, Whole};
use crate::message::{Refused, SignedMessage, SiteKeys};
use crate::{Server, Shape, SiteId};

/// The naive link as one server runs it.
pub struct Naive(Whole);

impl Naive {
    pub fn new(
        shape: Shape,
        site: SiteId,
        me: Server,
        keys: SiteKeys,
        frame_bytes_max: usize,
    ) -> Naive {
        Naive(Whole::new(shape, site, me, keys, frame_bytes_max))
    }

    /// The f+1 servers that send message `seq`, and (the same indices) receive it.
    pub fn carriers(shape: &Shape, seq: u64) -> impl Iterator<Item = Server> {
        let n = shape.servers() as u64;
        (0..=shape.f() as u64).map(move |k| Server(((seq + k) % n) as u16))
    }
}

impl LogicalLink for Naive {
    fn send(&mut self, msg: &SignedMessage, to: SiteId) -> Vec<Wan> {
        let w = &self.0;
        if to == w.site || !Naive::carriers(&w.shape, msg.seq).any(|s| s == w.me) {
            return Vec::new();
        }
        let frame = LinkEvent::Message(msg.clone()).encode();
        Naive::carriers(&w.shape, msg.seq)
            .map(|to_server| Wan {
                to_site: to,
                to_server,
                frame: frame.clone(),
            })
            .collect()
    }

    fn receive(
        &mut self,
        site: SiteId,
        _from: Server,
        frame: &[u8],
    ) -> Result<Option<LinkEvent>, Refused> {
        self.0.receive(site, frame)
    }

    fn executed(&mut self, event: &LinkEvent) -> Executed {
        self.0.executed(event)
    }
}
