//! Opening a received frame in two steps, so that a host can spread the first over its cores.
//!
//! [`preopen`] decodes a frame and its message and computes the digests the checks of it
//! need (the digest its MACs cover and, for a request, the request digest). It holds no keys
//! and reads no state: a host runs it on whichever thread read the frame. The core then does
//! the rest, in order: the size bound, the sender, the tag and its MACs (keys change with
//! NEW-KEY, so MACs are checked there), and the protocol. A replica handles
//! [`Input::Preopened`](crate::Input::Preopened) exactly as [`Input::Receive`](crate::Input::Receive)
//! of the same bytes: both go through [`Head::of`], once on the host's thread, once on the
//! core's.

use crate::auth::Auth;
use crate::message::ClientMessage;
use crate::message::{decode_body, decode_frame_ref, Frame, Message, Reject, Tag};
use crate::types::Principal;
use redoubt_crypto::Digest;
use std::ops::Range;

/// A received frame, decoded and hashed ahead of the core. Made by [`preopen`] or
/// [`preopen_from`].
#[derive(Debug)]
pub struct Preopened {
    bytes: Vec<u8>,
    head: Result<Head, Reject>,
}

impl Preopened {
    /// The frame as it arrived.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The sender the frame names (unauthenticated), if it decoded.
    pub fn sender(&self) -> Option<Principal> {
        self.head.as_ref().ok().map(|h| h.from)
    }

    /// The request the frame carries, if it was decoded and is one, with its digest
    /// (unauthenticated: the core checks the client's authenticator).
    pub fn request(&self) -> Option<(&crate::message::SignedRequest, Digest)> {
        match self.head.as_ref().ok()?.opened.as_ref()? {
            Opened {
                msg: Ok(Message::Client(ClientMessage::Request(sr))),
                request_digest: Some(d),
                ..
            } => Some((sr, *d)),
            _ => None,
        }
    }

    pub(crate) fn into_parts(self) -> (Vec<u8>, Result<Head, Reject>) {
        (self.bytes, self.head)
    }
}

/// Decodes `bytes` as a frame and its message and computes the digests its checks need.
/// Pure: no keys, no state, no clock; safe to run on any thread.
pub fn preopen(bytes: Vec<u8>) -> Preopened {
    preopen_from(bytes, |_| true)
}

/// Like [`preopen`], but leaves the message of a frame whose claimed sender `known` refuses
/// undecoded: a stranger's frame costs a header read, as the core rejects it unread. The
/// core decodes it itself if it does know the sender, so `known` only moves work.
pub fn preopen_from(bytes: Vec<u8>, known: impl Fn(Principal) -> bool) -> Preopened {
    let head = Head::of(&bytes, known);
    Preopened { bytes, head }
}

/// What [`preopen`] learns of a frame.
#[derive(Debug)]
pub(crate) struct Head {
    pub from: Principal,
    pub epoch: u32,
    pub tag: Tag,
    /// Where the body lies in the frame's bytes.
    body: Range<usize>,
    /// The message and digests, unless left for the core (a sender `known` refused).
    opened: Option<Opened>,
}

/// A frame's message and the digests its checks need.
#[derive(Debug)]
pub(crate) struct Opened {
    pub msg: Result<Message, Reject>,
    /// The digest the frame's MACs cover, when its tag carries any and is of the kind the
    /// message requires (no MAC is checked otherwise).
    pub auth_digest: Option<Digest>,
    /// The request's digest, when the message is a request.
    pub request_digest: Option<Digest>,
}

impl Opened {
    fn of(from: Principal, epoch: u32, tag: &Tag, body: &[u8]) -> Opened {
        let msg = decode_body(body);
        let auth_digest = match &msg {
            Ok(m) if m.required_tag() == tag.kind() && *tag != Tag::None => {
                Some(Frame::auth_digest(from, epoch, body))
            }
            _ => None,
        };
        let request_digest = match &msg {
            Ok(Message::Client(ClientMessage::Request(sr))) => Some(sr.request.digest()),
            _ => None,
        };
        Opened {
            msg,
            auth_digest,
            request_digest,
        }
    }
}

impl Head {
    /// Decodes a frame (no size bound: the core checks the bound of its configuration) and,
    /// if `known` accepts its sender, its message, and computes the digests.
    pub(crate) fn of(bytes: &[u8], known: impl Fn(Principal) -> bool) -> Result<Head, Reject> {
        let frame = decode_frame_ref(bytes, usize::MAX)?;
        let start = frame.body.as_ptr() as usize - bytes.as_ptr() as usize;
        let opened =
            known(frame.from).then(|| Opened::of(frame.from, frame.epoch, &frame.tag, frame.body));
        Ok(Head {
            from: frame.from,
            epoch: frame.epoch,
            tag: frame.tag,
            body: start..start + frame.body.len(),
            opened,
        })
    }

    /// The message and digests of the frame `bytes` this head was made from: as preopened,
    /// or decoded now if they were left for the core.
    pub(crate) fn take_opened(&mut self, bytes: &[u8]) -> Opened {
        self.opened.take().unwrap_or_else(|| {
            Opened::of(self.from, self.epoch, &self.tag, &bytes[self.body.clone()])
        })
    }

    /// Checks the sender and tag of the frame `bytes` this head was made from with `auth`,
    /// and yields its message (what [`open`](crate::seal::open) gives for the same frame)
    /// with the request digest if it is a request.
    pub(crate) fn open<A: Auth + ?Sized>(
        &mut self,
        auth: &A,
        bytes: &[u8],
    ) -> Result<(Message, Option<Digest>), Reject> {
        if !auth.knows(self.from) {
            return Err(Reject::UnknownSender);
        }
        let opened = self.take_opened(bytes);
        let msg = opened.msg?;
        crate::seal::check_tag(auth, self.from, self.epoch, &self.tag, &msg, || {
            opened
                .auth_digest
                .expect("a tag of the required kind has its digest")
        })?;
        Ok((msg, opened.request_digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::StaticKeys;
    use crate::message::{encode_body, FrameRef, Prepare, Request, SignedRequest, TagKind};
    use crate::seal::tests::cluster as keys;
    use crate::seal::{open, request_authenticator, seal, seal_body};

    fn frames(ks: &[StaticKeys]) -> Vec<Vec<u8>> {
        let prepare = Message::from(Prepare {
            view: 0,
            seq: 1,
            digest: Digest::ZERO,
            replica: 1,
            doubts: Vec::new(),
        });
        let request = Request {
            client: 7,
            timestamp: 3,
            read_only: false,
            op: vec![9u8; 5000].into(),
        };
        let auth = request_authenticator(&ks[4], &request.digest(), 4);
        let request = Message::from(SignedRequest {
            request,
            auth: auth.into(),
            sig: None,
        });
        let good = seal(&ks[1], &prepare, None, 4);
        let mut forged = good.clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        let mut body_flipped = good.clone();
        body_flipped[6] ^= 0x40;
        let stranger = StaticKeys::derive(
            b"master",
            Principal::Client(99),
            vec![Principal::Replica(0), Principal::Client(99)],
        );
        vec![
            seal(&stranger, &prepare, None, 4), // verifies, but from a sender 0 does not know
            good,
            forged,
            body_flipped,
            seal(&ks[4], &request, None, 4),
            seal(&ks[4], &prepare, None, 4), // a client may not send PREPARE
            seal_body(&ks[1], encode_body(&prepare), TagKind::None, None, 4), // wrong tag
            vec![],
            vec![5, 0, 0],
            b"garbage that is not a frame".to_vec(),
        ]
    }

    #[test]
    fn opening_in_two_steps_gives_what_opening_at_once_gives() {
        let ks = keys();
        for bytes in frames(&ks) {
            let at_once = crate::message::decode_frame_ref(&bytes, usize::MAX)
                .and_then(|f: FrameRef<'_>| open(&ks[0], &f));
            // Everything decoded ahead; nothing (the core decodes); as the core's own
            // Receive path does (strangers' messages never decoded).
            let ways: [&dyn Fn(Principal) -> bool; 3] =
                [&|_| true, &|_| false, &|p| ks[0].knows(p)];
            for known in ways {
                let (bytes, head) = preopen_from(bytes.clone(), known).into_parts();
                let two_steps = head.and_then(|mut h| h.open(&ks[0], &bytes).map(|(m, _)| m));
                assert_eq!(two_steps, at_once, "frame {bytes:?}");
            }
        }
    }

    #[test]
    fn a_request_comes_with_its_digest_and_sender() {
        let ks = keys();
        let p = preopen(frames(&ks).swap_remove(4));
        let (sr, d) = p.request().expect("a request");
        assert_eq!(d, sr.request.digest());
        assert_eq!(p.sender(), Some(Principal::Client(7)));
        assert!(preopen(b"garbage".to_vec()).request().is_none());
        // A stranger's frame is read no further than its header.
        let p = preopen_from(frames(&ks).swap_remove(4), |_| false);
        assert!(p.request().is_none());
        assert_eq!(p.sender(), Some(Principal::Client(7)));
    }
}
