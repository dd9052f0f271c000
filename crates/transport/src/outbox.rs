//! A connection's outgoing queue, bounded both in frames and in bytes: a peer that stops
//! reading holds at most that much of its sender's memory, however large the frames.

use crate::budget::{ByteBudget, Charge};
use crate::Bytes;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Why [`OutboxTx::try_send`] did not queue a frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Either bound would be exceeded.
    Full,
    /// The receiving side is gone.
    Closed,
}

/// A queue of at most `frames_max` frames (at least 1) and `bytes_max` bytes of frames.
pub(crate) fn outbox(frames_max: usize, bytes_max: usize) -> (OutboxTx, OutboxRx) {
    let (tx, rx) = mpsc::channel(frames_max.max(1));
    (
        OutboxTx {
            tx,
            budget: ByteBudget::new(bytes_max),
        },
        OutboxRx { rx },
    )
}

/// The sending side; cloning is cheap.
#[derive(Clone)]
pub(crate) struct OutboxTx {
    tx: mpsc::Sender<(Bytes, Charge)>,
    budget: Arc<ByteBudget>,
}

impl OutboxTx {
    /// Queues `frame` unless a bound would be exceeded; never waits. A closed queue says so
    /// whatever its bounds.
    pub(crate) fn try_send(&self, frame: Bytes) -> Result<(), Refused> {
        let slot = self.tx.try_reserve().map_err(|e| match e {
            mpsc::error::TrySendError::Full(()) => Refused::Full,
            mpsc::error::TrySendError::Closed(()) => Refused::Closed,
        })?;
        let charge = self.budget.charge(frame.len()).ok_or(Refused::Full)?;
        slot.send((frame, charge));
        Ok(())
    }

    /// Frames queued now.
    pub(crate) fn frames(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Bytes of the frames queued now.
    pub(crate) fn bytes(&self) -> usize {
        self.budget.queued()
    }
}

/// The receiving side: a frame's bytes leave the count when it is taken, and those of the
/// frames left in the queue when the queue goes (each frame carries its charge).
pub(crate) struct OutboxRx {
    rx: mpsc::Receiver<(Bytes, Charge)>,
}

impl OutboxRx {
    /// The next frame; `None` once every sender is gone and the queue is empty.
    pub(crate) async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await.map(|(frame, _)| frame)
    }

    /// The next frame if one is queued.
    pub(crate) fn try_recv(&mut self) -> Option<Bytes> {
        self.rx.try_recv().ok().map(|(frame, _)| frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: usize) -> Bytes {
        Arc::new(vec![0; n])
    }

    #[tokio::test]
    async fn bounded_by_bytes_and_by_frames() {
        let (tx, mut rx) = outbox(3, 100);
        assert_eq!(tx.try_send(frame(60)), Ok(()));
        // 60 + 50 > 100: refused, and the refusal leaves the count as it was.
        assert_eq!(tx.try_send(frame(50)), Err(Refused::Full));
        assert_eq!(tx.bytes(), 60);
        assert_eq!(tx.try_send(frame(40)), Ok(()));
        assert_eq!(tx.try_send(frame(0)), Ok(()));
        // Three frames: the frame bound refuses even an empty one, and gives its bytes back.
        assert_eq!(tx.try_send(frame(0)), Err(Refused::Full));
        assert_eq!((tx.frames(), tx.bytes()), (3, 100));
        assert_eq!(rx.recv().await.map(|f| f.len()), Some(60));
        assert_eq!((tx.frames(), tx.bytes()), (2, 40));
        assert_eq!(tx.try_send(frame(50)), Ok(()));
        assert_eq!(rx.try_recv().map(|f| f.len()), Some(40));
        assert_eq!(rx.try_recv().map(|f| f.len()), Some(0));
        assert_eq!(rx.try_recv().map(|f| f.len()), Some(50));
        assert_eq!(rx.try_recv(), None);
        assert_eq!(tx.bytes(), 0);
        drop(rx);
        assert_eq!(tx.try_send(frame(1)), Err(Refused::Closed));
        assert_eq!(tx.bytes(), 0);
    }

    #[tokio::test]
    async fn a_closed_queue_says_closed_and_returns_its_bytes() {
        let (tx, rx) = outbox(8, 100);
        assert_eq!(tx.try_send(frame(100)), Ok(()));
        assert_eq!(tx.try_send(frame(1)), Err(Refused::Full));
        // The receiver goes with a frame still queued: its bytes leave the count, and a full
        // queue that is closed says closed.
        drop(rx);
        assert_eq!(tx.bytes(), 0);
        assert_eq!(tx.try_send(frame(100)), Err(Refused::Closed));
        assert_eq!(tx.try_send(frame(1)), Err(Refused::Closed));
        assert_eq!(tx.bytes(), 0);
    }
}
