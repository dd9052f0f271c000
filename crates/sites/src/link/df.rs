//! The dependable-forwarder link, as a server runs it (Amir et al. 2009 §4.3; the forwarder
//! itself is [`crate::forwarder`]): every server hands each signed message to its site's
//! forwarder (the frame addressed to [`FORWARDER`], with its number and destination in the
//! frame's header), which sends one copy once LOCAL-THRESHOLD servers agreed; the receiving
//! site's forwarder hands it to every server there, and f+1 of them, chosen by the message's
//! number, introduce it into local ordering. Each message crosses the wide area once: the
//! best bandwidth of the links (Table 1).
//!
//! Nothing rests on the forwarders: a message is introduced and executed only under its
//! site's threshold signature.

use super::{Executed, LinkEvent, LogicalLink, Wan, Whole};
use crate::forwarder::Header;
use crate::message::{Refused, SignedMessage, SiteKeys};
use crate::{Server, Shape, SiteId};

/// The address of a site's own forwarder: a frame to it goes to the forwarder of the sending
/// site, which sends it on to `Wan::to_site`'s; a frame from it came from the site's own.
pub const FORWARDER: Server = Server(u16::MAX);

/// A frame between a server and its forwarder: the header, then the message.
pub fn frame(header: Header, msg: &[u8]) -> Vec<u8> {
    postcard::to_stdvec(&(header, serde_bytes::Bytes::new(msg))).expect("a frame encodes")
}

/// The header and message of a frame a server sent its forwarder.
pub fn unframe(bytes: &[u8]) -> Result<(Header, Vec<u8>), Refused> {
    let (header, msg): (Header, serde_bytes::ByteBuf) =
        postcard::from_bytes(bytes).map_err(|e| Refused::Malformed(e.to_string()))?;
    Ok((header, msg.into_vec()))
}

/// The f+1 servers of the receiving site that introduce message `seq`.
pub fn introducers(shape: &Shape, seq: u64) -> impl Iterator<Item = Server> {
    super::naive::Naive::carriers(shape, seq)
}

/// The dependable-forwarder link as one server runs it.
pub struct Df(Whole);

impl Df {
    pub fn new(
        shape: Shape,
        site: SiteId,
        me: Server,
        keys: SiteKeys,
        frame_bytes_max: usize,
    ) -> Df {
        Df(Whole::new(shape, site, me, keys, frame_bytes_max))
    }
}

impl LogicalLink for Df {
    fn send(&mut self, msg: &SignedMessage, to: SiteId) -> Vec<Wan> {
        if to == self.0.site || msg.site != self.0.site {
            return Vec::new();
        }
        let header = Header { seq: msg.seq, to };
        let whole = LinkEvent::Message(msg.clone()).encode();
        vec![Wan {
            to_site: to,
            to_server: FORWARDER,
            frame: frame(header, &whole),
        }]
    }

    fn receive(
        &mut self,
        site: SiteId,
        from: Server,
        frame: &[u8],
    ) -> Result<Option<LinkEvent>, Refused> {
        if from != FORWARDER {
            return Err(Refused::Malformed(
                "a server's frame on the forwarder link".into(),
            ));
        }
        let w = &self.0;
        Ok(w.receive(site, frame)?.filter(|e| match e {
            LinkEvent::Message(m) => introducers(&w.shape, m.seq).any(|s| s == w.me),
            _ => false,
        }))
    }

    fn executed(&mut self, event: &LinkEvent) -> Executed {
        self.0.executed(event)
    }
}
