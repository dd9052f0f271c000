//! Where the mount's operations go: the replicated cluster ([`ClusterBackend`]) or the same
//! file service run in this process without replication ([`LocalBackend`], the benchmarks'
//! baseline).

use redoubt_client::files::{FileClient, FileClientError};
use redoubt_core::{ExecContext, Service};
use redoubt_services::files::{Errno, FileOp, FileReply, FileService, BLOCK, IO_BYTES_MAX};
use redoubt_state::FlatState;
use std::future::Future;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

/// Runs file operations; an `Err` is the Linux `errno` to report to the program.
pub trait Backend: Send + Sync + 'static {
    fn call(&self, op: FileOp) -> impl Future<Output = Result<FileReply, i32>> + Send;

    /// The most data bytes one [`FileOp::Write`] may carry.
    fn write_bytes_max(&self) -> u32 {
        IO_BYTES_MAX
    }
}

/// Bytes a [`FileOp::Write`] encodes besides its data: tag, inode, offset, length (postcard
/// varints, at most 1 + 10 + 10 + 5), rounded up.
const WRITE_OVERHEAD_BYTES: usize = 64;

/// The most data bytes of a write whose encoding fits in `request_bytes_max` (the cluster's
/// limit on one operation): whole blocks where possible, so that writes stay block-aligned,
/// and never more than the service's [`IO_BYTES_MAX`].
pub fn write_bytes_max(request_bytes_max: usize) -> u32 {
    let room = request_bytes_max.saturating_sub(WRITE_OVERHEAD_BYTES);
    let blocks = room - room % BLOCK as usize;
    let bytes = if blocks > 0 { blocks } else { room.max(1) };
    bytes.min(IO_BYTES_MAX as usize) as u32
}

/// An operation's name, for logs and [`FileClient::run`].
pub fn op_name(op: &FileOp) -> &'static str {
    match op {
        FileOp::Lookup { .. } => "lookup",
        FileOp::GetAttr { .. } => "getattr",
        FileOp::Read { .. } => "read",
        FileOp::ReadDir { .. } => "readdir",
        FileOp::ReadLink { .. } => "readlink",
        FileOp::StatFs => "statfs",
        FileOp::Create { .. } => "create",
        FileOp::Mkdir { .. } => "mkdir",
        FileOp::Symlink { .. } => "symlink",
        FileOp::Write { .. } => "write",
        FileOp::SetAttr { .. } => "setattr",
        FileOp::Unlink { .. } => "unlink",
        FileOp::Rmdir { .. } => "rmdir",
        FileOp::Rename { .. } => "rename",
        FileOp::Link { .. } => "link",
    }
}

/// The replicated file system, through a pool of clients. The protocol allows one outstanding
/// request per client id, so the pool's size bounds how many of the kernel's requests are in
/// flight at once; the rest wait for a free client.
pub struct ClusterBackend {
    idle: Mutex<Vec<FileClient>>,
    free: Semaphore,
    write_bytes_max: u32,
}

impl ClusterBackend {
    /// `clients` of a cluster that accepts operations of up to `request_bytes_max` bytes
    /// (`[protocol] request_bytes_max`).
    ///
    /// # Panics
    /// If `clients` is empty.
    pub fn new(clients: Vec<FileClient>, request_bytes_max: usize) -> ClusterBackend {
        assert!(!clients.is_empty(), "a cluster backend needs a client");
        ClusterBackend {
            free: Semaphore::new(clients.len()),
            idle: Mutex::new(clients),
            write_bytes_max: write_bytes_max(request_bytes_max),
        }
    }
}

impl Backend for ClusterBackend {
    async fn call(&self, op: FileOp) -> Result<FileReply, i32> {
        let _permit = self
            .free
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let client = self
            .idle
            .lock()
            .expect("not poisoned")
            .pop()
            .expect("a permit means an idle client");
        let name = op_name(&op);
        let result = client.run(op, name).await;
        self.idle.lock().expect("not poisoned").push(client);
        result.map_err(|e| {
            if !matches!(e, FileClientError::Fs(_)) {
                // The program sees only EIO or ETIMEDOUT: say why here.
                tracing::warn!(op = name, error = %e, "the cluster did not answer");
            }
            e.errno()
        })
    }

    fn write_bytes_max(&self) -> u32 {
        self.write_bytes_max
    }
}

/// The file service executed in this process on an in-memory state, one operation at a time,
/// with no agreement, no network and no journal: what the replicated mount costs on top of the
/// FUSE layer and the service itself.
pub struct LocalBackend {
    inner: Mutex<Local>,
}

struct Local {
    service: FileService,
    state: FlatState,
    seq: u64,
    time_ms: u64,
}

impl LocalBackend {
    /// A fresh, empty file system in a state of `size_bytes`.
    pub fn new(size_bytes: u64) -> Result<LocalBackend, String> {
        let state = FlatState::new(size_bytes);
        let mut service = FileService::new();
        service.load(&state)?;
        Ok(LocalBackend {
            inner: Mutex::new(Local {
                service,
                state,
                seq: 0,
                time_ms: 0,
            }),
        })
    }

    fn run(&self, op: FileOp) -> Result<FileReply, i32> {
        let bytes = op.encode();
        let mut local = self.inner.lock().expect("not poisoned");
        let reply = if op.is_read_only() {
            local
                .service
                .execute_read_only(&local.state, &bytes)
                .ok_or(Errno::Io.code())?
        } else {
            // Like the agreed time of the replicas: the clock, but never backwards.
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            local.time_ms = now.max(local.time_ms + 1);
            local.seq += 1;
            let ctx = ExecContext {
                seq: local.seq,
                client: 0,
                time_ms: local.time_ms,
                batch_seed: 0,
                index: 0,
            };
            let Local { service, state, .. } = &mut *local;
            service.execute(state, &bytes, &ctx)
        };
        match FileReply::decode(&reply) {
            Ok(FileReply::Error(e)) => Err(e.code()),
            Ok(r) => Ok(r),
            Err(_) => Err(Errno::Io.code()),
        }
    }
}

impl Backend for LocalBackend {
    async fn call(&self, op: FileOp) -> Result<FileReply, i32> {
        self.run(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_services::files::{Attr, ROOT};

    fn attr(r: Result<FileReply, i32>) -> Attr {
        match r {
            Ok(FileReply::Attr(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn local_backend_runs_writes_and_reads_with_times_that_never_go_back() {
        let b = LocalBackend::new(4 << 20).unwrap();
        let create = FileOp::Create {
            parent: ROOT,
            name: "a".into(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            exclusive: true,
        };
        let f = attr(b.call(create.clone()).await);
        let w = attr(
            b.call(FileOp::Write {
                ino: f.ino,
                offset: 0,
                data: b"hello".to_vec(),
            })
            .await,
        );
        assert_eq!(w.size, 5);
        assert!(
            w.mtime_ms > f.mtime_ms,
            "{} then {}",
            f.mtime_ms,
            w.mtime_ms
        );
        let read = b
            .call(FileOp::Read {
                ino: f.ino,
                offset: 0,
                len: 100,
            })
            .await;
        assert_eq!(read, Ok(FileReply::Data(b"hello".to_vec())));
        assert_eq!(b.call(create).await, Err(libc::EEXIST));
    }

    #[test]
    fn a_write_fits_in_one_request_in_whole_blocks() {
        assert_eq!(write_bytes_max(64 << 10), 60 << 10);
        assert_eq!(write_bytes_max(1 << 20), IO_BYTES_MAX);
        assert_eq!(write_bytes_max(1000), 936);
        assert_eq!(write_bytes_max(10), 1);
        let op = FileOp::Write {
            ino: u64::MAX,
            offset: u64::MAX,
            data: vec![0; write_bytes_max(64 << 10) as usize],
        };
        assert!(op.encode().len() <= 64 << 10);
        let op = FileOp::Write {
            ino: u64::MAX,
            offset: u64::MAX,
            data: vec![0; 936],
        };
        assert!(op.encode().len() <= 1000);
    }
}
