//! Replica frames over the overlay. A replica's outgoing connection to a peer is one-way
//! length-prefixed frames; the daemon cuts each whole frame into overlay messages of at most
//! `payload_bytes_max` bytes (one flag byte, then data) sent in the ordered flow to the peer's
//! daemon, which glues them back and writes the frame to its replica. Only whole frames enter
//! the flow, so a dropped frame never leaves half a frame behind; the reassembly buffer is
//! bounded and is reset when the source's incarnation starts over (sequence 0).

/// Flag byte of the chunk that ends a frame.
const LAST: u8 = 1;
/// Flag byte of any other chunk.
const MORE: u8 = 0;

/// Cuts `frame` into overlay payloads of at most `payload_bytes_max` bytes (at least 2).
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
    #[error("frame larger than tunnel_frame_bytes_max")]
    TooLarge,
}

/// Glues the chunks of one source back into frames.
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
    fn a_restarted_source_starts_clean() {
        let mut r = Reassembly::new(100);
        assert_eq!(r.push(5, &[MORE, 1, 2]).unwrap(), None);
        assert_eq!(r.push(0, &[LAST, 3]).unwrap(), Some(vec![3]));
        assert!(r.push(1, &[7]).is_err());
    }
}
