//! The glue between the kernel's requests and the writes held for each file
//! ([`crate::behind`]): taking a file's entry, sending its writes, showing its attributes,
//! and the periodic send of writes held longer than the TTL.

use super::Shared;
use crate::backend::Backend;
use crate::behind::{Behind, Dirty};
use redoubt_services::files::{Attr, FileOp, Ino};
use std::sync::Weak;
use std::time::{Duration, Instant};

impl<B: Backend> Shared<B> {
    /// The held writes of `ino`, locked, if it has an entry (`make`: made if need be, unless
    /// the table is full).
    pub(super) async fn held(
        &self,
        ino: Ino,
        make: bool,
    ) -> Option<tokio::sync::OwnedMutexGuard<Dirty>> {
        let b = self.behind.as_ref()?;
        loop {
            let e = if make { b.get_or_make(ino) } else { b.get(ino) }?;
            let g = e.lock_owned().await;
            if !Behind::is_retired(&g) {
                return Some(g);
            }
        }
    }

    /// Sends the writes held in `d` for `ino`; the error of the first that failed (the rest
    /// are dropped with it, as a failed COMMIT loses an NFS client's unstable writes).
    pub(super) async fn send_held(&self, ino: Ino, d: &mut Dirty) -> Result<(), i32> {
        let Some(b) = &self.behind else {
            return Ok(());
        };
        let held = d.bytes();
        let writes = d.take_writes(self.backend.write_bytes_max() as usize);
        b.add_bytes(-(held as isize));
        for (offset, data) in writes {
            let op = FileOp::Write { ino, offset, data };
            match self.attr(op).await {
                Ok(a) => d.learn(a, Instant::now(), b.epoch()),
                // The file is gone, and its data with it.
                Err(libc::ENOENT | libc::ESTALE) => return Ok(()),
                Err(e) => {
                    tracing::warn!(
                        ino,
                        offset,
                        errno = e,
                        held_bytes = held,
                        "a held write failed: its file's held data is lost and the error \
                         goes to the program's close or fsync"
                    );
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Sends `ino`'s held writes, if any, and forgets the file.
    pub(super) async fn send_file(&self, ino: Ino) -> Result<(), i32> {
        let Some(mut g) = self.held(ino, false).await else {
            return Ok(());
        };
        let result = self.send_held(ino, &mut g).await;
        if let Some(b) = &self.behind {
            b.retire_if_stale(ino, &mut g, Instant::now(), self.ttl);
        }
        result
    }

    /// `a` as this mount shows it: with the held writes of its file.
    pub(super) async fn shown(&self, mut a: Attr) -> Attr {
        if let (Some(mut g), Some(b)) = (self.held(a.ino, false).await, &self.behind) {
            g.learn(a, Instant::now(), b.epoch());
            g.patch(&mut a);
        }
        a
    }
}

/// Sends the held writes of files dirty for longer than the TTL (and forgets files with none
/// held), every half TTL, for as long as the file system lives: another client sees a write
/// that was never closed after about a TTL, as it sees attributes.
pub(super) async fn send_old_writes<B: Backend>(shared: Weak<Shared<B>>) {
    let period = match shared.upgrade() {
        Some(s) => (s.ttl / 2).max(Duration::from_millis(50)),
        None => return,
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = shared.upgrade() else {
            return;
        };
        let Some(b) = &s.behind else {
            return;
        };
        for ino in b.inodes() {
            let Some(e) = b.get(ino) else {
                continue;
            };
            // A file a request is working on now is left to it.
            let Ok(mut g) = e.try_lock() else {
                continue;
            };
            if g.older_than(s.ttl, Instant::now()) {
                let _ = s.send_held(ino, &mut g).await;
            }
            b.retire_if_stale(ino, &mut g, Instant::now(), s.ttl);
        }
    }
}
