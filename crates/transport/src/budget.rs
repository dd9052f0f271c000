//! A byte budget shared by the frames of one queue: each frame holds a [`Charge`] of its
//! length while queued, returned when the charge is dropped (the frame taken, or the queue
//! gone), so no path can forget to give bytes back.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// The bytes one queue may hold.
pub struct ByteBudget {
    queued: AtomicUsize,
    max: usize,
}

impl ByteBudget {
    pub fn new(max: usize) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            queued: AtomicUsize::new(0),
            max,
        })
    }

    /// Bytes charged now.
    pub fn queued(&self) -> usize {
        self.queued.load(Relaxed)
    }

    /// Charges `bytes`, or `None` if they would take the queue past its maximum.
    pub fn charge(self: &Arc<Self>, bytes: usize) -> Option<Charge> {
        self.queued
            .fetch_update(Relaxed, Relaxed, |q| {
                q.checked_add(bytes).filter(|&after| after <= self.max)
            })
            .ok()?;
        Some(Charge {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes held of a [`ByteBudget`], returned when dropped.
pub struct Charge {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.queued.fetch_sub(self.bytes, Relaxed);
    }
}
