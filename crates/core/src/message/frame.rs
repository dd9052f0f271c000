//! Frames: the envelope every message travels in (version, claimed sender, body, tag), their
//! canonical encoding, bounded decoding, and why a frame or message is rejected.

use super::*;

/// Kind of authentication tag on a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagKind {
    None,
    Mac,
    Authenticator,
}

/// Authentication tag: nothing, one MAC for the single receiver, or an authenticator (one MAC
/// per replica, indexed by replica id; the sender's own slot is zero).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tag {
    None,
    Mac(Mac),
    Authenticator(Vec<Mac>),
}

impl Tag {
    pub fn kind(&self) -> TagKind {
        match self {
            Tag::None => TagKind::None,
            Tag::Mac(_) => TagKind::Mac,
            Tag::Authenticator(_) => TagKind::Authenticator,
        }
    }
}

/// The unit on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub version: u8,
    pub from: Principal,
    /// Key epoch of the sender's keys used for the tag. Static keys use epoch 0; session-key
    /// refresh (NEW-KEY) advances it.
    pub epoch: u32,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    pub tag: Tag,
}

impl Frame {
    /// The digest every MAC of this frame covers: sender, epoch and body (a long body hashed
    /// on its own, as in [`Request::digest`]).
    pub fn auth_digest(from: Principal, epoch: u32, body: &[u8]) -> Digest {
        let mut buf = [0u8; PRINCIPAL_BYTES_MAX];
        let from_bytes = postcard::to_slice(&from, &mut buf).expect("a principal fits");
        DigestBuilder::new("redoubt.frame.v2")
            .bytes(from_bytes)
            .u64(epoch as u64)
            .long_bytes(body)
            .finish()
    }
}

/// Why a frame or message was rejected. Every rejection is counted by reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, thiserror::Error)]
pub enum Reject {
    #[error("frame larger than the configured maximum")]
    Oversized,
    #[error("frame or message does not decode")]
    Malformed,
    #[error("unsupported wire version")]
    BadVersion,
    #[error("sender unknown to this node")]
    UnknownSender,
    #[error("wrong kind of authentication tag for the message")]
    WrongTag,
    #[error("MAC or authenticator entry does not verify")]
    BadMac,
    #[error("client authenticator on a request does not verify")]
    BadRequestAuth,
    #[error("message fields contradict the sender or each other")]
    Inconsistent,
    #[error("message outside the watermarks or for another view")]
    OutOfWindow,
    #[error("message exceeds a configured bound")]
    TooLarge,
    #[error("digest does not match content")]
    BadDigest,
    #[error("conflicts with an accepted message")]
    Conflict,
    #[error("proposed non-deterministic value refused")]
    BadNonDet,
    #[error("stale or replayed")]
    Stale,
    #[error("over this sender's state-transfer rate limit")]
    RateLimited,
    #[error("state transfer answer does not match the digests it must match")]
    BadState,
    #[error("message not expected by this node's role")]
    Unexpected,
    #[error("key-holder signature does not verify")]
    BadSignature,
    #[error("key holder unavailable")]
    KeyHolder,
    #[error("sender's NEW-KEY still being admitted, and no room to hold the frame till it is")]
    KeyPending,
}

impl Reject {
    pub fn as_str(&self) -> &'static str {
        match self {
            Reject::Oversized => "oversized",
            Reject::Malformed => "malformed",
            Reject::BadVersion => "bad_version",
            Reject::UnknownSender => "unknown_sender",
            Reject::WrongTag => "wrong_tag",
            Reject::BadMac => "bad_mac",
            Reject::BadRequestAuth => "bad_request_auth",
            Reject::Inconsistent => "inconsistent",
            Reject::OutOfWindow => "out_of_window",
            Reject::TooLarge => "too_large",
            Reject::BadDigest => "bad_digest",
            Reject::Conflict => "conflict",
            Reject::BadNonDet => "bad_nondet",
            Reject::Stale => "stale",
            Reject::RateLimited => "rate-limited",
            Reject::BadState => "bad-state",
            Reject::Unexpected => "unexpected",
            Reject::BadSignature => "bad_signature",
            Reject::KeyHolder => "key_holder",
            Reject::KeyPending => "key_pending",
        }
    }
}

/// A [`Frame`] decoded with its body borrowed from the received bytes (no copy of it).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct FrameRef<'a> {
    pub version: u8,
    pub from: Principal,
    pub epoch: u32,
    #[serde(borrow)]
    pub body: &'a [u8],
    pub tag: Tag,
}

/// Whom a reply frame is for: the client and the timestamp of the request it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyHeader {
    pub client: ClientId,
    pub timestamp: u64,
}

/// The client and the request timestamp a REPLY frame is for, read from the start of its body
/// without decoding or copying the rest (a process whose clients share connections routes
/// replies with it, and a client drops replies to requests it no longer waits for before
/// verifying them); `None` for any other frame or a malformed one. Unauthenticated, like the
/// routing it serves: the client itself verifies the replies it keeps.
pub fn reply_header(bytes: &[u8]) -> Option<ReplyHeader> {
    let (frame, _) = postcard::take_from_bytes::<FrameRef<'_>>(bytes).ok()?;
    if frame.version != WIRE_VERSION {
        return None;
    }
    // A message is its tag, then the fields in order: for REPLY, view, timestamp, client; for
    // CERTIFIED-REPLY, view, seq, index, the bundle's leaves (a length, then 32 bytes each),
    // then the entry's client and timestamp.
    let (tag, rest) = postcard::take_from_bytes::<u32>(frame.body).ok()?;
    match tag {
        tag::REPLY => {
            let ((_view, timestamp, client), _) =
                postcard::take_from_bytes::<(View, u64, ClientId)>(rest).ok()?;
            Some(ReplyHeader { client, timestamp })
        }
        tag::CERTIFIED_REPLY => {
            let ((_view, _seq, _index, leaves), rest) =
                postcard::take_from_bytes::<(View, Seq, u32, u64)>(rest).ok()?;
            let skip = usize::try_from(leaves)
                .ok()?
                .checked_mul(redoubt_crypto::DIGEST_LEN)?;
            let ((client, timestamp), _) =
                postcard::take_from_bytes::<(ClientId, u64)>(rest.get(skip..)?).ok()?;
            Some(ReplyHeader { client, timestamp })
        }
        _ => None,
    }
}

/// The sender a frame names, read from its header without decoding the rest; `None` for a
/// malformed frame or another wire version. Unauthenticated: only for decisions that a later
/// verification confirms.
pub fn frame_sender(bytes: &[u8]) -> Option<Principal> {
    let ((version, from), _) = postcard::take_from_bytes::<(u8, Principal)>(bytes).ok()?;
    (version == WIRE_VERSION).then_some(from)
}

/// Decodes a frame without verifying it. Bounded by `max_bytes`.
pub fn decode_frame(bytes: &[u8], max_bytes: usize) -> Result<Frame, Reject> {
    decode_frame_ref(bytes, max_bytes).map(|f| Frame {
        version: f.version,
        from: f.from,
        epoch: f.epoch,
        body: f.body.to_vec(),
        tag: f.tag,
    })
}

impl Frame {
    /// This frame as [`decode_frame_ref`] would give it (for [`open`](crate::seal::open)).
    pub fn borrowed(&self) -> FrameRef<'_> {
        FrameRef {
            version: self.version,
            from: self.from,
            epoch: self.epoch,
            body: &self.body,
            tag: self.tag.clone(),
        }
    }
}

/// Like [`decode_frame`], with the body borrowed from `bytes`.
pub fn decode_frame_ref(bytes: &[u8], max_bytes: usize) -> Result<FrameRef<'_>, Reject> {
    if bytes.len() > max_bytes {
        return Err(Reject::Oversized);
    }
    let (frame, rest): (FrameRef<'_>, &[u8]) =
        postcard::take_from_bytes(bytes).map_err(|_| Reject::Malformed)?;
    if !rest.is_empty() {
        return Err(Reject::Malformed);
    }
    if frame.version != WIRE_VERSION {
        return Err(Reject::BadVersion);
    }
    Ok(frame)
}

/// Decodes a message body.
pub fn decode_body(body: &[u8]) -> Result<Message, Reject> {
    let (m, rest): (Message, &[u8]) =
        postcard::take_from_bytes(body).map_err(|_| Reject::Malformed)?;
    if !rest.is_empty() {
        return Err(Reject::Malformed);
    }
    Ok(m)
}

pub fn encode_body(m: &Message) -> Vec<u8> {
    // Sized first: growing the vector as postcard writes costs a reallocation per doubling.
    let len = postcard::experimental::serialized_size(m).expect("messages always encode");
    postcard::to_extend(m, Vec::with_capacity(len)).expect("messages always encode")
}

pub fn encode_frame(f: &Frame) -> Vec<u8> {
    encode_frame_parts(f.version, f.from, f.epoch, &f.body, &f.tag)
}

/// Most bytes a [`Principal`] takes encoded (an enum tag and a varint of at most 64 bits).
const PRINCIPAL_BYTES_MAX: usize = 16;

/// A buffer holding the header of a frame with a body of `body_len` bytes, with room for
/// the body and a tag of kind `kind` (authenticators of `n` entries).
fn frame_header(
    version: u8,
    from: Principal,
    epoch: u32,
    body_len: usize,
    kind: TagKind,
    n: usize,
) -> Vec<u8> {
    let tag_bytes = match kind {
        TagKind::None => 1,
        TagKind::Mac => 1 + MAC_LEN,
        TagKind::Authenticator => 1 + 10 + n * MAC_LEN,
    };
    let out = Vec::with_capacity(1 + PRINCIPAL_BYTES_MAX + 5 + 10 + body_len + tag_bytes);
    postcard::to_extend(&(version, from, epoch, body_len as u64), out)
        .expect("frame headers encode")
}

/// The start of a frame carrying `msg` (header and body, the tag still to come, room for a
/// tag of kind `kind` reserved), written in one buffer of the right size, and where in it
/// the body lies. Finish it with [`postcard_tag`]; the result is the encoding of the
/// [`Frame`] with these fields and `encode_body(msg)` as its body.
pub fn encode_frame_head(
    version: u8,
    from: Principal,
    epoch: u32,
    msg: &Message,
    kind: TagKind,
    n: u32,
) -> (Vec<u8>, std::ops::Range<usize>) {
    let len = postcard::experimental::serialized_size(msg).expect("messages always encode");
    let out = frame_header(version, from, epoch, len, kind, n as usize);
    let start = out.len();
    let out = postcard::to_extend(msg, out).expect("messages always encode");
    debug_assert_eq!(out.len(), start + len);
    (out, start..start + len)
}

/// Appends the encoding of `tag`, which ends a frame.
pub fn postcard_tag(out: &mut Vec<u8>, tag: &Tag) {
    let buf = std::mem::take(out);
    *out = postcard::to_extend(tag, buf).expect("tags encode");
}

/// The encoding of a [`Frame`] with these fields, built in one buffer of the right size (the
/// same bytes as encoding the struct: postcard writes a struct as its fields in order).
pub fn encode_frame_parts(
    version: u8,
    from: Principal,
    epoch: u32,
    body: &[u8],
    tag: &Tag,
) -> Vec<u8> {
    let n = match tag {
        Tag::Authenticator(m) => m.len(),
        _ => 0,
    };
    let mut out = frame_header(version, from, epoch, body.len(), tag.kind(), n);
    out.extend_from_slice(body);
    postcard_tag(&mut out, tag);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_built_in_one_buffer_encode_as_the_struct_does() {
        let froms = [
            Principal::Replica(0),
            Principal::Replica(3),
            Principal::Client(1),
            Principal::Client(u64::MAX),
        ];
        let tags = [
            Tag::None,
            Tag::Mac(Mac([7; MAC_LEN])),
            Tag::Authenticator(vec![Mac([1; MAC_LEN]); 4]),
            Tag::Authenticator(Vec::new()),
        ];
        for (i, from) in froms.into_iter().enumerate() {
            for tag in &tags {
                for len in [0usize, 1, 127, 128, 300, 16_384, 70_000] {
                    let f = Frame {
                        version: WIRE_VERSION,
                        from,
                        epoch: [0, 1, 300, u32::MAX][i],
                        body: (0..len).map(|b| b as u8).collect(),
                        tag: tag.clone(),
                    };
                    let derived = postcard::to_stdvec(&f).unwrap();
                    assert_eq!(encode_frame(&f), derived, "{from:?} {tag:?} {len}");
                    assert_eq!(decode_frame(&derived, 1 << 20).unwrap(), f);
                    let r = decode_frame_ref(&derived, 1 << 20).unwrap();
                    assert_eq!(
                        (r.from, r.epoch, r.body, &r.tag),
                        (f.from, f.epoch, &f.body[..], &f.tag)
                    );
                }
            }
        }
    }

    #[test]
    fn whole_batch_puts_requests_beside_back_in_place() {
        let r = |c: ClientId| SignedRequest {
            request: Request {
                client: c,
                timestamp: 1,
                read_only: false,
                op: vec![c as u8; 8].into(),
            },
            auth: vec![Mac([0; 16])].into(),
            sig: None,
        };
        let whole = Batch {
            nondet: NonDet::default(),
            requests: vec![r(1), r(2), r(3)],
            matrix: None,
        };
        let named = |i: u32, c: ClientId| Beside {
            index: i,
            client: c,
            digest: r(c).request.digest(),
        };
        let pp = |inline: Vec<SignedRequest>, beside: Vec<Beside>| PrePrepare {
            view: 0,
            seq: 1,
            digest: whole.digest(),
            batch: Batch {
                nondet: NonDet::default(),
                requests: inline,
                matrix: None,
            },
            beside,
        };
        let lookup = |b: &Beside| Some(r(b.client));
        let lean = pp(vec![r(1), r(3)], vec![named(1, 2)]);
        assert_eq!(lean.whole_batch(lookup), Some(whole.clone()));
        // A missing request, a position past the end, a count that does not add up, a lookup
        // returning another client's request: no batch.
        assert_eq!(lean.whole_batch(|_| None), None);
        assert_eq!(
            pp(vec![r(1), r(3)], vec![named(5, 2)]).whole_batch(lookup),
            None
        );
        assert_eq!(
            pp(vec![r(1)], vec![named(0, 2), named(0, 3)]).whole_batch(lookup),
            None
        );
        assert_eq!(lean.whole_batch(|_| Some(r(9))), None);
    }

    #[test]
    fn frame_sender_reads_the_header_of_any_frame() {
        let body = encode_body(&Message::from(Commit {
            view: 1,
            seq: 2,
            digest: NULL_DIGEST,
            replica: 0,
        }));
        for from in [
            Principal::Client(9_000_000_001),
            Principal::Replica(3),
            Principal::Client(1),
        ] {
            let f = |version| {
                encode_frame(&Frame {
                    version,
                    from,
                    epoch: 7,
                    body: body.clone(),
                    tag: Tag::None,
                })
            };
            assert_eq!(frame_sender(&f(WIRE_VERSION)), Some(from));
            assert_eq!(frame_sender(&f(WIRE_VERSION + 1)), None);
        }
        assert_eq!(frame_sender(&[]), None);
        assert_eq!(frame_sender(&[WIRE_VERSION]), None);
    }

    #[test]
    fn reply_header_reads_client_and_timestamp_of_replies_only() {
        let reply = Message::from(Reply {
            view: 7,
            timestamp: 1_700_000_000_000,
            client: 123_456,
            replica: 2,
            digest_only: false,
            tentative: true,
            result: vec![5; 40],
        });
        let frame = |m: &Message| {
            encode_frame(&Frame {
                version: WIRE_VERSION,
                from: Principal::Replica(2),
                epoch: 3,
                body: encode_body(m),
                tag: Tag::Mac(Mac([1; 16])),
            })
        };
        assert_eq!(
            reply_header(&frame(&reply)),
            Some(ReplyHeader {
                client: 123_456,
                timestamp: 1_700_000_000_000
            })
        );
        let commit = Message::from(Commit {
            view: 1,
            seq: 2,
            digest: NULL_DIGEST,
            replica: 0,
        });
        assert_eq!(reply_header(&frame(&commit)), None);
        let bytes = frame(&reply);
        assert_eq!(reply_header(&bytes[..bytes.len() / 2]), None);
        assert_eq!(reply_header(b"garbage"), None);
        // A certified reply (the firewall's): its entry's client and timestamp, after the
        // leaves of its bundle.
        let certified = Message::from(CertifiedReply {
            view: 7,
            seq: 99,
            index: 1,
            leaves: vec![Digest([3; 32]); 300],
            entry: ReplyEntry {
                client: 654_321,
                timestamp: 1_700_000_000_001,
                result: vec![9; 40],
            },
            signature: redoubt_crypto::threshold::ThresholdSig([4; 96]),
            digest_only: false,
        });
        let bytes = frame(&certified);
        assert_eq!(
            reply_header(&bytes),
            Some(ReplyHeader {
                client: 654_321,
                timestamp: 1_700_000_000_001
            })
        );
        assert_eq!(reply_header(&bytes[..bytes.len() / 2]), None);
    }

    #[test]
    fn batch_digest_ignores_authenticators_but_not_content() {
        let r = |ts, auth: u8| SignedRequest {
            request: Request {
                client: 1,
                timestamp: ts,
                read_only: false,
                op: vec![1, 2, 3].into(),
            },
            auth: vec![Mac([auth; 16])].into(),
            sig: None,
        };
        let b1 = Batch {
            nondet: NonDet::default(),
            requests: vec![r(1, 0)],
            matrix: None,
        };
        let mut b2 = b1.clone();
        b2.requests[0].auth = vec![Mac([9; 16])].into();
        assert_eq!(b1.digest(), b2.digest());
        let b3 = Batch {
            nondet: NonDet::default(),
            requests: vec![r(2, 0)],
            matrix: None,
        };
        assert_ne!(b1.digest(), b3.digest());
        let mut b4 = b1.clone();
        b4.nondet.time_ms = 1;
        assert_ne!(b1.digest(), b4.digest());
        assert_ne!(b1.digest(), NULL_DIGEST);
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for len in 0..400usize {
            let mut buf = vec![0u8; len];
            for b in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let _ = decode_frame(&buf, 1 << 20);
            let _ = decode_body(&buf);
        }
        assert_eq!(decode_frame(&[0u8; 100], 10), Err(Reject::Oversized));
    }

    #[test]
    fn huge_length_prefix_does_not_allocate() {
        // A body that claims a vector of 2^60 elements must fail fast, not allocate.
        let mut body = vec![tag::BATCHES as u8];
        body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(decode_body(&body), Err(Reject::Malformed));
    }
}
