//! Tunnel messages over the overlay. Each tunnel connection is carried as messages in the
//! ordered overlay flow between the two daemons: OPEN (the connecting daemon accepted a local
//! connection), DATA (one whole length-prefixed frame read from one end's local connection),
//! CLOSE (one end's local connection ended). A message names its connection by the number
//! the accepting daemon gave it and that daemon's incarnation, so connections of a daemon
//! that restarted never mix with the new ones ([`Header`]).
//!
//! The daemon cuts each whole message into overlay payloads of at most `payload_bytes_max`
//! bytes (one flag byte, then data); the peer's daemon glues them back. Only whole messages
//! enter the flow, so a dropped one never leaves half a message behind; the reassembly buffer
//! is bounded and is reset when the source's incarnation starts over (sequence 0).

/// What a tunnel message says about its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The sender accepted a local connection: the receiver connects to its replica.
    Open,
    /// One frame, written to the receiver's local end of the connection.
    Data,
    /// The sender's local end closed: the receiver closes its end.
    Close,
}

/// Whose numbering the message's connection id and incarnation are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The sender accepted the connection (its number, its incarnation).
    Sender,
    /// The receiver accepted it: the sender is the end that connected to its replica.
    Receiver,
}

/// The fixed part of a tunnel message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub origin: Origin,
    /// Incarnation of the daemon that accepted the connection.
    pub epoch: u64,
    /// The number that daemon gave the connection.
    pub conn: u64,
}

/// Bytes of an encoded [`Header`]: kind, origin, epoch and connection id.
pub const HEADER_BYTES: usize = 18;

/// Why a glued message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("message shorter than its {HEADER_BYTES}-byte header")]
    Short,
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("unknown origin {0}")]
    Origin(u8),
    #[error("OPEN or CLOSE message with a body")]
    Body,
}

/// Encodes a message: the header, then `body` (a frame for DATA, empty otherwise).
pub fn encode(h: Header, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_BYTES + body.len());
    v.push(match h.kind {
        Kind::Open => 1,
        Kind::Data => 2,
        Kind::Close => 3,
    });
    v.push(match h.origin {
        Origin::Sender => 0,
        Origin::Receiver => 1,
    });
    v.extend_from_slice(&h.epoch.to_le_bytes());
    v.extend_from_slice(&h.conn.to_le_bytes());
    v.extend_from_slice(body);
    v
}

/// Decodes a glued message into its header and body.
pub fn decode(msg: &[u8]) -> Result<(Header, &[u8]), MessageError> {
    let (head, body) = msg
        .split_first_chunk::<HEADER_BYTES>()
        .ok_or(MessageError::Short)?;
    let kind = match head[0] {
        1 => Kind::Open,
        2 => Kind::Data,
        3 => Kind::Close,
        k => return Err(MessageError::Kind(k)),
    };
    let origin = match head[1] {
        0 => Origin::Sender,
        1 => Origin::Receiver,
        o => return Err(MessageError::Origin(o)),
    };
    if kind != Kind::Data && !body.is_empty() {
        return Err(MessageError::Body);
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[at..at + 8]);
        u64::from_le_bytes(b)
    };
    Ok((
        Header {
            kind,
            origin,
            epoch: word(2),
            conn: word(10),
        },
        body,
    ))
}

/// Flag byte of the chunk that ends a frame.
const LAST: u8 = 1;
/// Flag byte of any other chunk.
const MORE: u8 = 0;

/// Cuts a message `frame` into overlay payloads of at most `payload_bytes_max` bytes (at least 2).
pub fn chunk(frame: &[u8], payload_bytes_max: usize) -> Vec<Vec<u8>> {
    let room = payload_bytes_max.max(2) - 1;
    if frame.is_empty() {
        return vec![vec![LAST]];
    }
    let parts = frame.len().div_ceil(room);
    frame
        .chunks(room)
        .enumerate()
        .map(|(i, part)| {
            let mut v = Vec::with_capacity(part.len() + 1);
            v.push(if i + 1 == parts { LAST } else { MORE });
            v.extend_from_slice(part);
            v
        })
        .collect()
}

/// Why a chunk was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("empty or badly flagged chunk")]
    Malformed,
    #[error("message larger than tunnel_frame_bytes_max and its header")]
    TooLarge,
}

/// Glues the chunks of one source back into messages.
pub struct Reassembly {
    buf: Vec<u8>,
    frame_bytes_max: usize,
    /// Skipping the rest of a refused frame.
    skipping: bool,
}

impl Reassembly {
    pub fn new(frame_bytes_max: usize) -> Reassembly {
        Reassembly {
            buf: Vec::new(),
            frame_bytes_max,
            skipping: false,
        }
    }

    /// Takes the chunk delivered as message `seq` of the source's ordered flow; returns a
    /// whole frame when this chunk ends one.
    pub fn push(&mut self, seq: u64, chunk: &[u8]) -> Result<Option<Vec<u8>>, ChunkError> {
        if seq == 0 {
            // A new incarnation of the source: whatever was half-glued will never finish.
            self.buf.clear();
            self.skipping = false;
        }
        let (&flag, data) = chunk.split_first().ok_or(ChunkError::Malformed)?;
        if flag != LAST && flag != MORE {
            self.buf.clear();
            self.skipping = flag == MORE;
            return Err(ChunkError::Malformed);
        }
        if self.skipping {
            self.skipping = flag != LAST;
            return Ok(None);
        }
        if self.buf.len() + data.len() > self.frame_bytes_max {
            self.buf = Vec::new();
            self.skipping = flag != LAST;
            return Err(ChunkError::TooLarge);
        }
        self.buf.extend_from_slice(data);
        if flag == LAST {
            Ok(Some(std::mem::take(&mut self.buf)))
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_chunking() {
        for len in [0, 1, 9, 10, 11, 100] {
            let frame: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let chunks = chunk(&frame, 10);
            assert!(chunks.iter().all(|c| c.len() <= 10));
            let mut r = Reassembly::new(1_000);
            let mut out = None;
            for (i, c) in chunks.iter().enumerate() {
                let got = r.push(i as u64 + 1, c).unwrap();
                assert_eq!(got.is_some(), i + 1 == chunks.len());
                out = got.or(out);
            }
            assert_eq!(out.unwrap(), frame);
        }
    }

    #[test]
    fn oversized_frames_are_skipped_whole() {
        let mut r = Reassembly::new(15);
        let big = chunk(&[1; 30], 10);
        let small = chunk(&[2; 5], 10);
        let mut errors = 0;
        for (i, c) in big.iter().enumerate() {
            match r.push(i as u64 + 1, c) {
                Err(_) => errors += 1,
                Ok(got) => assert_eq!(got, None),
            }
        }
        assert_eq!(errors, 1);
        assert_eq!(r.push(9, &small[0]).unwrap(), Some(vec![2; 5]));
    }

    #[test]
    fn messages_round_trip_and_bad_ones_are_refused() {
        let h = Header {
            kind: Kind::Data,
            origin: Origin::Receiver,
            epoch: 1_700_000_000_123,
            conn: 42,
        };
        let m = encode(h, b"frame");
        assert_eq!(decode(&m).unwrap(), (h, &b"frame"[..]));
        let open = Header {
            kind: Kind::Open,
            origin: Origin::Sender,
            ..h
        };
        assert_eq!(decode(&encode(open, b"")).unwrap(), (open, &b""[..]));
        assert_eq!(decode(&encode(open, b"x")), Err(MessageError::Body));
        assert_eq!(decode(&m[..HEADER_BYTES - 1]), Err(MessageError::Short));
        let mut bad = m.clone();
        bad[0] = 9;
        assert_eq!(decode(&bad), Err(MessageError::Kind(9)));
        bad[0] = 2;
        bad[1] = 7;
        assert_eq!(decode(&bad), Err(MessageError::Origin(7)));
    }

    #[test]
    fn a_restarted_source_starts_clean() {
        let mut r = Reassembly::new(100);
        assert_eq!(r.push(5, &[MORE, 1, 2]).unwrap(), None);
        assert_eq!(r.push(0, &[LAST, 3]).unwrap(), Some(vec![3]));
        assert!(r.push(1, &[7]).is_err());
    }
}
