//! Sealing and opening frames with a key table ([`crate::auth::Auth`]).
//!
//! A frame's tag is computed over [`Frame::auth_digest`]: the body is hashed once, then each
//! MAC is a keyed hash of that digest (PBFT §5.2): one MAC for a point-to-point message, an
//! authenticator (a MAC for every replica) for a multicast.

use crate::auth::Auth;
use crate::message::{
    encode_frame_head, encode_frame_parts, postcard_tag, Frame, FrameRef, Message, Reject, Tag,
    TagKind, WIRE_VERSION,
};
use crate::types::{Principal, ReplicaId};
use redoubt_crypto::{Digest, Mac};

/// Encodes `msg` from `auth.me()` with the tag its kind requires. `to` names the receiver for
/// single-MAC messages; authenticators cover replicas `0..n`.
pub fn seal<A: Auth + ?Sized>(auth: &A, msg: &Message, to: Option<Principal>, n: u32) -> Vec<u8> {
    let kind = msg.required_tag();
    let (mut out, body) =
        encode_frame_head(WIRE_VERSION, auth.me(), auth.send_epoch(), msg, kind, n);
    let tag = make_tag(auth, &out[body], kind, to, n);
    postcard_tag(&mut out, &tag);
    out
}

/// Encodes `msg` from `auth.me()` with an authenticator over the execution nodes
/// `0..executors` of a separated deployment (an agreement node's [`crate::message::Order`]):
/// any execution node can check its entry, so the frame can be passed between them.
pub fn seal_to_executors<A: Auth + ?Sized>(auth: &A, msg: &Message, executors: u32) -> Vec<u8> {
    let kind = TagKind::Authenticator;
    debug_assert_eq!(msg.required_tag(), kind);
    let (mut out, body) = encode_frame_head(
        WIRE_VERSION,
        auth.me(),
        auth.send_epoch(),
        msg,
        kind,
        executors,
    );
    let d = Frame::auth_digest(auth.me(), auth.send_epoch(), &out[body]);
    let tag = Tag::Authenticator(
        (0..executors)
            .map(|e| auth.mac_to(Principal::Executor(e), &d).unwrap_or_default())
            .collect(),
    );
    postcard_tag(&mut out, &tag);
    out
}

/// Like [`seal`] for an already encoded body and an explicit tag kind (the adversary of the
/// simulator uses this to build well-authenticated lies).
pub fn seal_body<A: Auth + ?Sized>(
    auth: &A,
    body: Vec<u8>,
    kind: TagKind,
    to: Option<Principal>,
    n: u32,
) -> Vec<u8> {
    let tag = make_tag(auth, &body, kind, to, n);
    encode_frame_parts(WIRE_VERSION, auth.me(), auth.send_epoch(), &body, &tag)
}

/// The tag of kind `kind` over `body`, sent by `auth.me()` in its current epoch.
fn make_tag<A: Auth + ?Sized>(
    auth: &A,
    body: &[u8],
    kind: TagKind,
    to: Option<Principal>,
    n: u32,
) -> Tag {
    let from = auth.me();
    let epoch = auth.send_epoch();
    match kind {
        TagKind::None => Tag::None,
        TagKind::Mac => {
            let d = Frame::auth_digest(from, epoch, body);
            let to = to.expect("single-MAC messages name their receiver");
            Tag::Mac(auth.mac_to(to, &d).unwrap_or_default())
        }
        TagKind::Authenticator => {
            let d = Frame::auth_digest(from, epoch, body);
            Tag::Authenticator(
                (0..n as ReplicaId)
                    .map(|r| {
                        let p = Principal::Replica(r);
                        if p == from {
                            Mac::default()
                        } else {
                            auth.mac_to(p, &d).unwrap_or_default()
                        }
                    })
                    .collect(),
            )
        }
    }
}

/// Verifies a decoded frame addressed to `auth.me()` and decodes its message. The tag kind
/// must be the one the message kind requires.
pub fn open<A: Auth + ?Sized>(auth: &A, frame: &FrameRef<'_>) -> Result<Message, Reject> {
    if !auth.knows(frame.from) {
        return Err(Reject::UnknownSender);
    }
    let msg = crate::message::decode_body(frame.body)?;
    check_tag(auth, frame.from, frame.epoch, &frame.tag, &msg, || {
        Frame::auth_digest(frame.from, frame.epoch, frame.body)
    })?;
    Ok(msg)
}

/// Checks that a frame from `from` (key epoch `epoch`) carrying `msg` has the tag `msg`'s kind
/// requires and that the tag's MAC for `auth.me()` verifies over `digest()` (the frame's
/// [`Frame::auth_digest`], computed only if a MAC is to be checked).
pub(crate) fn check_tag<A: Auth + ?Sized>(
    auth: &A,
    from: Principal,
    epoch: u32,
    tag: &Tag,
    msg: &Message,
    digest: impl FnOnce() -> Digest,
) -> Result<(), Reject> {
    if msg.required_tag() != tag.kind() {
        return Err(Reject::WrongTag);
    }
    let ok = match tag {
        Tag::None => true,
        Tag::Mac(mac) => auth.verify_from(from, epoch, &digest(), mac),
        Tag::Authenticator(macs) => {
            // Replicas' authenticators are indexed by replica, executors' by executor.
            let (Principal::Replica(i) | Principal::Executor(i)) = auth.me() else {
                return Err(Reject::WrongTag);
            };
            match macs.get(i as usize) {
                Some(mac) => auth.verify_from(from, epoch, &digest(), mac),
                None => false,
            }
        }
    };
    if ok {
        Ok(())
    } else {
        Err(Reject::BadMac)
    }
}

/// Builds the client authenticator of a request: one MAC per replica over the request digest.
pub fn request_authenticator<A: Auth + ?Sized>(auth: &A, digest: &Digest, n: u32) -> Vec<Mac> {
    (0..n as ReplicaId)
        .map(|r| {
            auth.mac_to(Principal::Replica(r), digest)
                .unwrap_or_default()
        })
        .collect()
}

/// Checks this replica's entry of a client request authenticator.
pub fn verify_request<A: Auth + ?Sized>(
    auth: &A,
    client: Principal,
    digest: &Digest,
    macs: &[Mac],
) -> bool {
    let Principal::Replica(i) = auth.me() else {
        return false;
    };
    macs.get(i as usize)
        .is_some_and(|m| auth.verify_from(client, 0, digest, m))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::auth::StaticKeys;
    use crate::message::{decode_frame, encode_body, Prepare};
    use crate::message::{ClientMessage, PbftMessage};

    /// Keys of four replicas and client 7.
    pub(crate) fn cluster() -> Vec<StaticKeys> {
        let all: Vec<Principal> = (0..4)
            .map(Principal::Replica)
            .chain([Principal::Client(7)])
            .collect();
        all.iter()
            .map(|p| StaticKeys::derive(b"master", *p, all.clone()))
            .collect()
    }

    #[test]
    fn authenticator_verifies_at_every_receiver_and_not_when_forged() {
        let ks = cluster();
        let m = Message::from(Prepare {
            view: 0,
            seq: 1,
            digest: Digest::of(b"x"),
            replica: 1,
            doubts: Vec::new(),
        });
        let bytes = seal(&ks[1], &m, None, 4);
        for r in [0usize, 2, 3] {
            let f = decode_frame(&bytes, 1 << 20).unwrap();
            assert_eq!(open(&ks[r], &f.borrowed()), Ok(m.clone()));
        }
        // Claiming to be replica 2 while using replica 1's keys fails.
        let mut f = decode_frame(&bytes, 1 << 20).unwrap();
        f.from = Principal::Replica(2);
        assert_eq!(open(&ks[0], &f.borrowed()), Err(Reject::BadMac));
        // Changing the body fails.
        let mut f = decode_frame(&bytes, 1 << 20).unwrap();
        let last = f.body.len() - 1;
        f.body[last] ^= 1;
        assert!(open(&ks[0], &f.borrowed()).is_err());
        // A single MAC where an authenticator is required is refused.
        let wrong = seal_body(
            &ks[1],
            encode_body(&m),
            TagKind::Mac,
            Some(Principal::Replica(0)),
            4,
        );
        let f = decode_frame(&wrong, 1 << 20).unwrap();
        assert_eq!(open(&ks[0], &f.borrowed()), Err(Reject::WrongTag));
    }

    #[test]
    fn frames_sealed_in_one_buffer_equal_the_body_encoded_first() {
        let ks = cluster();
        let msgs = [
            Message::Pbft(PbftMessage::Prepare(Prepare {
                view: 3,
                seq: 300,
                digest: Digest::of(b"x"),
                replica: 1,
                doubts: Vec::new(),
            })),
            Message::Client(ClientMessage::Reply(crate::message::Reply {
                view: 0,
                timestamp: 1 << 40,
                client: 7,
                replica: 1,
                digest_only: false,
                tentative: true,
                result: vec![9; 5000],
            })),
        ];
        for m in &msgs {
            for (kind, to) in [
                (TagKind::None, None),
                (TagKind::Mac, Some(Principal::Client(7))),
                (TagKind::Authenticator, None),
            ] {
                let (mut out, body) =
                    encode_frame_head(WIRE_VERSION, ks[1].me(), ks[1].send_epoch(), m, kind, 4);
                assert_eq!(out[body.clone()], encode_body(m)[..]);
                let tag = make_tag(&ks[1], &out[body], kind, to, 4);
                postcard_tag(&mut out, &tag);
                assert_eq!(out, seal_body(&ks[1], encode_body(m), kind, to, 4));
            }
        }
        let reply = &msgs[1];
        assert_eq!(
            seal(&ks[1], reply, Some(Principal::Client(7)), 4),
            seal_body(
                &ks[1],
                encode_body(reply),
                TagKind::Mac,
                Some(Principal::Client(7)),
                4
            )
        );
    }

    #[test]
    fn client_request_authenticator() {
        let ks = cluster();
        let d = Digest::of(b"req");
        let macs = request_authenticator(&ks[4], &d, 4);
        for k in &ks[..4] {
            assert!(verify_request(k, Principal::Client(7), &d, &macs));
        }
        assert!(!verify_request(
            &ks[0],
            Principal::Client(7),
            &Digest::of(b"other"),
            &macs
        ));
        assert!(!verify_request(&ks[0], Principal::Client(8), &d, &macs));
    }
}
