//! A replicated file system: directories, files, symbolic and hard links, attributes and
//! permissions as NFS v3 offers them, kept in tables of the replicated SQL engine
//! ([`crate::sql::Engine`]), so every byte of every file lives in the replicated, paged state.
//!
//! Each write operation is one transaction at its agreed time (which sets the times it
//! changes); reads take the read-only path. Permission checks are the client's (the FUSE
//! mount asks the kernel to check the permission bits, as NFS clients do); the service keeps
//! the bits, the owners and the structure consistent.

mod op;
mod store;

pub use op::{
    Attr, DirEntry, Errno, FileOp, FileReply, FsStats, Ino, Kind, SetTime, BLOCK, IO_BYTES_MAX,
    NAME_BYTES_MAX, READDIR_MAX, ROOT, TARGET_BYTES_MAX,
};

use crate::sql::Engine;
use redoubt_core::{ExecContext, Service};
use redoubt_state::{StateRead, StateWrite};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The replicated file service (see the module documentation).
pub struct FileService {
    engine: Engine,
    /// The state holds the tables (learnt at load, set by the first write): operations then
    /// skip creating them.
    schema: AtomicBool,
}

impl Default for FileService {
    fn default() -> Self {
        FileService::new()
    }
}

impl FileService {
    pub fn new() -> Self {
        FileService {
            engine: Engine::new(),
            schema: AtomicBool::new(false),
        }
    }
}

fn reply_of(r: Result<Result<FileReply, Errno>, String>) -> Vec<u8> {
    match r {
        Ok(Ok(reply)) => reply.encode(),
        Ok(Err(e)) => FileReply::Error(e).encode(),
        Err(_) => FileReply::Error(Errno::Io).encode(),
    }
}

impl Service for FileService {
    fn execute(&mut self, state: &mut dyn StateWrite, op: &[u8], ctx: &ExecContext) -> Vec<u8> {
        let Ok(op) = FileOp::decode(op) else {
            return FileReply::Error(Errno::Inval).encode();
        };
        let size = state.size();
        let ready = self.schema.load(Relaxed);
        if op.is_read_only() {
            return reply_of(
                self.engine
                    .read_tx(&*state, ctx.seed(), |c| store::read(c, &op, size, ready)),
            );
        }
        let r = self
            .engine
            .write_tx(state, ctx, |c| store::write(c, op, ctx.time_ms, ready));
        // A write creates the tables inside its own transaction: only a committed one leaves
        // them in the state.
        if matches!(r, Ok(Ok(_))) {
            self.schema.store(true, Relaxed);
        }
        reply_of(r)
    }

    fn execute_read_only(&self, state: &dyn StateRead, op: &[u8]) -> Option<Vec<u8>> {
        let Ok(op) = FileOp::decode(op) else {
            return Some(FileReply::Error(Errno::Inval).encode());
        };
        if !op.is_read_only() {
            return None;
        }
        let size = state.size();
        let ready = self.schema.load(Relaxed);
        Some(reply_of(
            self.engine
                .read_tx(state, 0, |c| store::read(c, &op, size, ready)),
        ))
    }

    fn load(&mut self, state: &dyn StateRead) -> Result<(), String> {
        self.engine.load(state)?;
        let present = self.engine.read_tx(state, 0, store::schema_present)?;
        self.schema.store(present, Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
