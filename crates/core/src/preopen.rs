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
use crate::message::{decode_body, decode_frame_ref, Frame, Message, Reject, Tag};
use crate::types::Principal;
use redoubt_crypto::Digest;

/// A received frame, decoded and hashed ahead of the core. Made by [`preopen`].
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

    /// The request the frame carries, if any, with its digest (unauthenticated: the core
    /// checks the client's authenticator).
    pub fn request(&self) -> Option<(&crate::message::SignedRequest, Digest)> {
        let h = self.head.as_ref().ok()?;
        match (&h.msg, h.request_digest) {
            (Ok(Message::Request(sr)), Some(d)) => Some((sr, d)),
            _ => None,
        }
    }

    pub(crate) fn into_parts(self) -> (Vec<u8>, Result<Head, Reject>) {
        (self.bytes, self.head)
    }
}

/// Decodes `bytes` as a frame and computes the digests its checks need. Pure: no keys, no
/// state, no clock; safe to run on any thread.
pub fn preopen(bytes: Vec<u8>) -> Preopened {
    let head = Head::of(&bytes);
    Preopened { bytes, head }
}

/// What [`preopen`] learns of a frame.
#[derive(Debug)]
pub(crate) struct Head {
    pub from: Principal,
    pub epoch: u32,
    pub tag: Tag,
    pub msg: Result<Message, Reject>,
    /// The digest the frame's MACs cover, when its tag carries any and is of the kind the
    /// message requires (no MAC is checked otherwise).
    pub auth_digest: Option<Digest>,
    /// The request's digest, when the message is a request.
    pub request_digest: Option<Digest>,
}

impl Head {
    /// Decodes a frame (no size bound: the core checks the bound of its configuration) and
    /// its message, and computes the digests.
    pub(crate) fn of(bytes: &[u8]) -> Result<Head, Reject> {
        let frame = decode_frame_ref(bytes, usize::MAX)?;
        let msg = decode_body(frame.body);
        let auth_digest = match &msg {
            Ok(m) if m.required_tag() == frame.tag.kind() && frame.tag != Tag::None => {
                Some(Frame::auth_digest(frame.from, frame.epoch, frame.body))
            }
            _ => None,
        };
        let request_digest = match &msg {
            Ok(Message::Request(sr)) => Some(sr.request.digest()),
            _ => None,
        };
        Ok(Head {
            from: frame.from,
            epoch: frame.epoch,
            tag: frame.tag,
            msg,
            auth_digest,
            request_digest,
        })
    }

    /// Checks the frame's sender and tag with `auth` and yields its message: what
    /// [`open`](crate::seal::open) gives for the same frame.
    pub(crate) fn open<A: Auth + ?Sized>(&mut self, auth: &A) -> Result<Message, Reject> {
        if !auth.knows(self.from) {
            return Err(Reject::UnknownSender);
        }
        let msg = std::mem::replace(&mut self.msg, Err(Reject::Malformed))?;
        crate::seal::check_tag(auth, self.from, self.epoch, &self.tag, &msg, || {
            self.auth_digest
                .expect("a tag of the required kind has its digest")
        })?;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::StaticKeys;
    use crate::message::{FrameRef, Prepare, Request, SignedRequest};
    use crate::seal::tests::cluster as keys;
    use crate::seal::{open, request_authenticator, seal};

    fn frames(ks: &[StaticKeys]) -> Vec<Vec<u8>> {
        let prepare = Message::Prepare(Prepare {
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
        let request = Message::Request(SignedRequest {
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
            let (bytes, head) = preopen(bytes).into_parts();
            let two_steps = head.and_then(|mut h| h.open(&ks[0]));
            assert_eq!(two_steps, at_once, "frame {bytes:?}");
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
    }
}
