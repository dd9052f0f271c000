//! The wire format: a 4-byte big-endian length, then that many bytes.

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt,
};

/// Bytes of the length prefix in front of every frame (`u32`, big-endian).
pub const LEN_PREFIX_BYTES: usize = 4;

/// How much a frame buffer grows ahead of the bytes that actually arrived. A peer that claims a
/// large (but permitted) frame and then sends little of it costs at most this much memory more
/// than it sent.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Read buffer of a connection: a busy connection delivers many frames per `read` system call.
pub const READ_BUFFER_BYTES: usize = 64 << 10;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection cleanly between two frames.
    #[error("connection closed by the peer")]
    Closed,
    /// The length prefix announces more than the receiver accepts; nothing was allocated.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge { len: u64, max: usize },
    /// Any other I/O failure, including a connection that ended in the middle of a frame
    /// (`UnexpectedEof`).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame. The announced length is checked against `max` **before** anything is
/// allocated, and the buffer then grows only as the bytes arrive.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Vec<u8>, FrameError> {
    let mut prefix = [0u8; LEN_PREFIX_BYTES];
    let mut filled = 0;
    while filled < LEN_PREFIX_BYTES {
        let got = r.read(&mut prefix[filled..]).await?;
        if got == 0 {
            return Err(if filled == 0 {
                FrameError::Closed
            } else {
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed inside a length prefix",
                )
                .into()
            });
        }
        filled += got;
    }
    let len = u32::from_be_bytes(prefix) as u64;
    if len > max as u64 {
        return Err(FrameError::TooLarge { len, max });
    }
    let len = len as usize; // <= max, so it fits
    let mut frame = Vec::with_capacity(len.min(READ_CHUNK_BYTES));
    let got = r.take(len as u64).read_to_end(&mut frame).await?;
    if got < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("connection closed after {got} of {len} frame bytes"),
        )
        .into());
    }
    Ok(frame)
}

/// Reads one frame from a buffered reader: a frame that already lies whole in the reader's
/// buffer (the usual case on a busy connection, which delivers many frames per `read`) is
/// copied out in one piece; any other goes through [`read_frame`], with the same checks.
pub async fn read_buffered_frame<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Vec<u8>, FrameError> {
    let buf = r.fill_buf().await?;
    if buf.is_empty() {
        return Err(FrameError::Closed);
    }
    if let Some(prefix) = buf.first_chunk::<LEN_PREFIX_BYTES>() {
        let len = u32::from_be_bytes(*prefix) as u64;
        if len > max as u64 {
            return Err(FrameError::TooLarge { len, max });
        }
        let end = LEN_PREFIX_BYTES + len as usize;
        if buf.len() >= end {
            let frame = buf[LEN_PREFIX_BYTES..end].to_vec();
            r.consume(end);
            return Ok(frame);
        }
    }
    read_frame(r, max).await
}

/// Writes one frame (prefix and body). Does not flush: wrap the writer in a
/// [`tokio::io::BufWriter`] and flush when there is nothing more to send, or flush yourself.
/// Frames longer than `u32::MAX` bytes are refused with `InvalidInput`.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(frame.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("frame of {} bytes cannot be length-prefixed", frame.len()),
        )
    })?;
    w.write_all(&len.to_be_bytes()).await?;
    w.write_all(frame).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn buffered_frames_read_whole_split_and_oversized() {
        // Frames written in one piece, then read through a buffer smaller than some of them,
        // so that both the whole-in-buffer path and the fallback are taken.
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let frames: Vec<Vec<u8>> = [0usize, 1, 3, 4, 100, 700, 5000, 2]
            .iter()
            .map(|&n| (0..n).map(|i| i as u8).collect())
            .collect();
        for f in &frames {
            write_frame(&mut a, f).await.unwrap();
        }
        write_frame(&mut a, &[1u8; 6001]).await.unwrap();
        drop(a);
        let mut rd = tokio::io::BufReader::with_capacity(1024, b);
        for f in &frames {
            assert_eq!(&read_buffered_frame(&mut rd, 6000).await.unwrap(), f);
        }
        assert!(matches!(
            read_buffered_frame(&mut rd, 6000).await,
            Err(FrameError::TooLarge {
                len: 6001,
                max: 6000
            })
        ));
        // A prefix split across two reads, then a clean end.
        let (mut a, b) = tokio::io::duplex(64);
        let mut rd = tokio::io::BufReader::with_capacity(1024, b);
        let writer = tokio::spawn(async move {
            a.write_all(&[0, 0]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            a.write_all(&[0, 3, 7, 8, 9]).await.unwrap();
        });
        assert_eq!(
            read_buffered_frame(&mut rd, 10).await.unwrap(),
            vec![7, 8, 9]
        );
        writer.await.unwrap();
        assert!(matches!(
            read_buffered_frame(&mut rd, 10).await,
            Err(FrameError::Closed)
        ));
        // A frame cut off by the end of the connection.
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(&[0, 0, 0, 9, 1, 2]).await.unwrap();
        drop(a);
        let mut rd = tokio::io::BufReader::new(b);
        assert!(matches!(
            read_buffered_frame(&mut rd, 10).await,
            Err(FrameError::Io(_))
        ));
    }

    #[tokio::test]
    async fn roundtrip_and_endings() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        for f in [&b""[..], b"x", &[7u8; 5000][..]] {
            write_frame(&mut a, f).await.unwrap();
            assert_eq!(read_frame(&mut b, 5000).await.unwrap(), f);
        }
        write_frame(&mut a, &[1u8; 5001]).await.unwrap();
        assert!(matches!(
            read_frame(&mut b, 5000).await,
            Err(FrameError::TooLarge {
                len: 5001,
                max: 5000
            })
        ));
        drop(a);
        // The rest of the oversized frame is still in the pipe; what matters is no panic.
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[0, 0]).await.unwrap();
        drop(a);
        match read_frame(&mut b, 10).await {
            Err(FrameError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[0, 0, 0, 9, 1, 2]).await.unwrap();
        drop(a);
        assert!(matches!(
            read_frame(&mut b, 10).await,
            Err(FrameError::Io(_))
        ));
        let (a, mut b) = tokio::io::duplex(64);
        drop(a);
        assert!(matches!(
            read_frame(&mut b, 10).await,
            Err(FrameError::Closed)
        ));
    }
}
