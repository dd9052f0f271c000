//! The kernel's FUSE requests as file service operations.
//!
//! fuser calls these methods one at a time on its own thread; each spawns a task on the tokio
//! runtime and returns, so several requests can be in flight (as many as the backend allows).
//! Inode numbers are the service's and `open` and `release` keep no state. Two things are kept:
//! an open directory's listing, read at its start, so that the offsets the kernel hands back
//! stay valid; and, unless the mount writes through, the data of writes not yet sent
//! ([`crate::behind`]), sent when the file is closed or synced.

use crate::backend::{op_name, Backend};
mod held;

use crate::behind::{Behind, FILE_BYTES_MAX, TOTAL_BYTES_MAX};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use held::send_old_writes;
use redoubt_services::files::{
    Attr, FileOp, FileReply, Ino, Kind, SetTime, BLOCK, IO_BYTES_MAX, NAME_BYTES_MAX, READDIR_MAX,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The handle of a file opened read-only: closing it sends nothing.
const READER: FileHandle = FileHandle(0);
/// The handle of a file opened for writing (or created).
const WRITER: FileHandle = FileHandle(1);

/// One entry of an open directory's listing: inode, type, name.
type Listed = (Ino, FileType, String);

/// A FUSE file system over a [`Backend`].
pub struct FuseFs<B: Backend> {
    shared: Arc<Shared<B>>,
    rt: tokio::runtime::Handle,
}

struct Shared<B> {
    backend: B,
    /// How long the kernel may keep attributes and names before asking again.
    ttl: Duration,
    /// Open directories' listings, by handle.
    dirs: Mutex<HashMap<u64, Arc<Vec<Listed>>>>,
    next_fh: AtomicU64,
    /// Unsupported requests already logged (each is logged once).
    refused: Mutex<HashSet<&'static str>>,
    calls: Arc<CallStats>,
    /// Writes held until close or fsync; `None` when every write goes through at once.
    behind: Option<Behind>,
}

/// Per operation of the service: how many the mount called, how many failed, and their total
/// time.
#[derive(Default)]
pub struct CallStats(Mutex<BTreeMap<&'static str, Calls>>);

/// The calls of one operation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Calls {
    pub count: u64,
    pub failed: u64,
    pub time: Duration,
}

impl CallStats {
    fn add(&self, op: &'static str, failed: bool, time: Duration) {
        let mut calls = self.0.lock().expect("not poisoned");
        let c = calls.entry(op).or_default();
        c.count += 1;
        c.failed += u64::from(failed);
        c.time += time;
    }

    /// Every operation called so far, by name.
    pub fn snapshot(&self) -> Vec<(&'static str, Calls)> {
        let calls = self.0.lock().expect("not poisoned");
        calls.iter().map(|(op, c)| (*op, *c)).collect()
    }
}

impl<B: Backend> FuseFs<B> {
    /// Serves `backend`, running its calls on `rt`; the kernel caches attributes and entries
    /// for `ttl`. With `write_behind`, writes are held until the file is closed or synced (or
    /// for at most `ttl`); without, each is sent before `write(2)` returns.
    pub fn new(
        backend: B,
        rt: tokio::runtime::Handle,
        ttl: Duration,
        write_behind: bool,
    ) -> FuseFs<B> {
        let shared = Arc::new(Shared {
            backend,
            ttl,
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            refused: Mutex::new(HashSet::new()),
            calls: Arc::default(),
            behind: write_behind.then(Behind::default),
        });
        if write_behind {
            rt.spawn(send_old_writes(Arc::downgrade(&shared)));
        }
        FuseFs { shared, rt }
    }

    /// What this file system has asked of its backend.
    pub fn stats(&self) -> Arc<CallStats> {
        self.shared.calls.clone()
    }

    fn spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Shared<B>>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(f(self.shared.clone()));
    }

    /// Runs `op`, which answers with the attributes of an inode that now has a name (or
    /// answers the error of a name the service cannot hold).
    fn entry_op(&self, op: Result<FileOp, Errno>, reply: ReplyEntry) {
        let op = match op {
            Ok(op) => op,
            Err(e) => return reply.error(e),
        };
        self.spawn(|s| async move {
            match s.attr(op).await {
                Ok(a) => reply.entry(&s.ttl, &file_attr(&s.shown(a).await), Generation(0)),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn done_op(&self, op: Result<FileOp, Errno>, reply: ReplyEmpty) {
        let op = match op {
            Ok(op) => op,
            Err(e) => return reply.error(e),
        };
        self.spawn(|s| async move {
            match s.call(op).await {
                Ok(FileReply::Done) => reply.ok(),
                Ok(other) => reply.error(Errno::from_i32(unexpected("Done", &other))),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    /// An operation that may change a file's attributes (its links, its times) starts:
    /// attributes learned before it are no longer answered from.
    fn changing(&self) {
        if let Some(b) = &self.shared.behind {
            b.changing();
        }
    }

    /// Sends `ino`'s held writes, then answers (with the error of the first that failed).
    fn send_file_then(&self, ino: INodeNo, reply: ReplyEmpty) {
        self.spawn(|s| async move {
            match s.send_file(ino.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    /// Logs, once per kind, that a request is not supported.
    fn refuse(&self, what: &'static str, errno: Errno) -> Errno {
        if self
            .shared
            .refused
            .lock()
            .expect("not poisoned")
            .insert(what)
        {
            tracing::warn!(
                request = what,
                errno = errno.code(),
                "not supported by the replicated file system; refused (logged once)"
            );
        }
        errno
    }
}

impl<B: Backend> Shared<B> {
    /// The file's bytes `[offset, offset + size)` from the service (split into reads the
    /// service allows; short at its end of file).
    async fn read_service(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>, i32> {
        let mut out = Vec::with_capacity(size as usize);
        while out.len() < size as usize {
            let len = (size - out.len() as u32).min(IO_BYTES_MAX);
            let op = FileOp::Read {
                ino,
                offset: offset + out.len() as u64,
                len,
            };
            match self.call(op).await? {
                FileReply::Data(d) => {
                    let short = d.len() < len as usize;
                    out.extend_from_slice(&d);
                    if short {
                        break;
                    }
                }
                other => return Err(unexpected("Data", &other)),
            }
        }
        Ok(out)
    }

    /// Runs `op` on the backend, counting it.
    async fn call(&self, op: FileOp) -> Result<FileReply, i32> {
        let name = op_name(&op);
        let started = Instant::now();
        let result = self.backend.call(op).await;
        tracing::debug!(
            op = name,
            errno = result.as_ref().err(),
            us = started.elapsed().as_micros() as u64,
            "called"
        );
        self.calls.add(name, result.is_err(), started.elapsed());
        result
    }

    async fn attr(&self, op: FileOp) -> Result<Attr, i32> {
        match self.call(op).await? {
            FileReply::Attr(a) => Ok(a),
            other => Err(unexpected("Attr", &other)),
        }
    }

    /// The whole listing of directory `ino`, with "." and ".." first.
    async fn list(&self, ino: Ino) -> Result<Vec<Listed>, i32> {
        let parent = self.attr(FileOp::Lookup {
            parent: ino,
            name: "..".into(),
        });
        let first = self.page(ino, None);
        let (parent, first) = tokio::join!(parent, first);
        let mut out = vec![
            (ino, FileType::Directory, ".".to_string()),
            (parent?.ino, FileType::Directory, "..".to_string()),
        ];
        let (mut entries, mut more) = first?;
        loop {
            let after = entries.last().map(|e| e.2.clone());
            out.append(&mut entries);
            // An empty page that claims more would never end: take it as the end.
            if !more || after.is_none() {
                return Ok(out);
            }
            (entries, more) = self.page(ino, after).await?;
        }
    }

    async fn page(&self, ino: Ino, after: Option<String>) -> Result<(Vec<Listed>, bool), i32> {
        let op = FileOp::ReadDir {
            ino,
            after,
            max: READDIR_MAX,
        };
        match self.call(op).await? {
            FileReply::Entries { entries, more } => Ok((
                entries
                    .into_iter()
                    .map(|e| (e.ino, file_type(e.kind), e.name))
                    .collect(),
                more,
            )),
            other => Err(unexpected("Entries", &other)),
        }
    }
}

/// A reply of the wrong kind: a bug on one side, reported as EIO.
fn unexpected(wanted: &str, got: &FileReply) -> i32 {
    tracing::error!(
        wanted,
        ?got,
        "the file service answered with the wrong kind of reply"
    );
    libc::EIO
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

fn time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(ms(t)),
    }
}

pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time(a.atime_ms),
        mtime: time(a.mtime_ms),
        ctime: time(a.ctime_ms),
        crtime: time(a.ctime_ms),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: BLOCK as u32,
        flags: 0,
    }
}

/// The attributes of a negative entry (inode 0): only the inode number is read.
fn absent() -> FileAttr {
    file_attr(&Attr {
        ino: 0,
        kind: Kind::File,
        mode: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        size: 0,
        atime_ms: 0,
        mtime_ms: 0,
        ctime_ms: 0,
    })
}

/// A name the service can hold (UTF-8), else `errno`.
fn name(n: &OsStr, errno: Errno) -> Result<String, Errno> {
    n.to_str().map(str::to_string).ok_or(errno)
}

/// Creation modes: permission bits only, less the caller's umask (the kernel may have applied
/// it already; applying it twice changes nothing).
fn perm(mode: u32, umask: u32) -> u32 {
    mode & !umask & 0o7777
}

impl<B: Backend> Filesystem for FuseFs<B> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // One write request is one operation of the service; reads are split if need be.
        let _ = config.set_max_write(self.shared.backend.write_bytes_max());
        let _ = config.set_max_readahead(IO_BYTES_MAX);
        let _ = config.set_time_granularity(Duration::from_millis(1));
        Ok(())
    }

    fn destroy(&mut self) {
        // Unmounted: whatever is still held goes now.
        if let Some(b) = &self.shared.behind {
            let s = self.shared.clone();
            let inodes = b.inodes();
            self.rt.block_on(async move {
                for ino in inodes {
                    let _ = s.send_file(ino).await;
                }
            });
        }
        // What the mount asked of the service: where its time went.
        for (op, c) in self.shared.calls.snapshot() {
            tracing::info!(
                op,
                count = c.count,
                failed = c.failed,
                mean_ms = format!("{:.3}", c.time.as_secs_f64() * 1e3 / c.count.max(1) as f64),
                total_s = format!("{:.3}", c.time.as_secs_f64()),
                "operations served"
            );
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        let name = match name(n, Errno::ENOENT) {
            Ok(name) => name,
            Err(e) => return reply.error(e),
        };
        let op = FileOp::Lookup {
            parent: parent.0,
            name,
        };
        self.spawn(|s| async move {
            match s.attr(op).await {
                Ok(a) => reply.entry(&s.ttl, &file_attr(&s.shown(a).await), Generation(0)),
                // Inode 0 is an absent name the kernel may remember for the TTL, as it does
                // names that exist: compilers and make look for the same absent files often.
                Err(libc::ENOENT) => reply.entry(&s.ttl, &absent(), Generation(0)),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.spawn(|s| async move {
            // A file with held writes (its attributes as last learned, with them), or whose
            // last write this mount sent less than a TTL ago.
            if let (Some(g), Some(b)) = (s.held(ino.0, false).await, &s.behind) {
                if let Some(a) = g.attr(Instant::now(), s.ttl, b.epoch()) {
                    return reply.attr(&s.ttl, &file_attr(&a));
                }
            }
            match s.attr(FileOp::GetAttr { ino: ino.0 }).await {
                Ok(a) => reply.attr(&s.ttl, &file_attr(&s.shown(a).await)),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let op = if mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && size.is_none()
            && atime.is_none()
            && mtime.is_none()
        {
            // Only what the service sets itself (ctime): nothing to change.
            FileOp::GetAttr { ino: ino.0 }
        } else {
            FileOp::SetAttr {
                ino: ino.0,
                mode: mode.map(|m| m & 0o7777),
                uid,
                gid,
                size,
                atime: atime.map(set_time),
                mtime: mtime.map(set_time),
            }
        };
        // Held writes go first: a truncation or a time set (`cp -p`, `touch`) comes after them.
        self.changing();
        self.spawn(|s| async move {
            if let Err(e) = s.send_file(ino.0).await {
                return reply.error(Errno::from_i32(e));
            }
            match s.attr(op).await {
                Ok(a) => reply.attr(&s.ttl, &file_attr(&s.shown(a).await)),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(|s| async move {
            match s.call(FileOp::ReadLink { ino: ino.0 }).await {
                Ok(FileReply::Target(t)) => reply.data(t.as_bytes()),
                Ok(other) => reply.error(Errno::from_i32(unexpected("Target", &other))),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(self.refuse(
                "mknod of a device, FIFO or socket (only regular files, directories and symbolic links exist here)",
                Errno::EOPNOTSUPP,
            ));
        }
        let op = name(n, Errno::EINVAL).map(|name| FileOp::Create {
            parent: parent.0,
            name,
            mode: perm(mode, umask),
            uid: req.uid(),
            gid: req.gid(),
            exclusive: true,
        });
        self.entry_op(op, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let op = name(n, Errno::EINVAL).map(|name| FileOp::Mkdir {
            parent: parent.0,
            name,
            mode: perm(mode, umask),
            uid: req.uid(),
            gid: req.gid(),
        });
        self.entry_op(op, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.changing();
        let op = name(n, Errno::ENOENT).map(|name| FileOp::Unlink {
            parent: parent.0,
            name,
        });
        self.done_op(op, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let op = name(n, Errno::ENOENT).map(|name| FileOp::Rmdir {
            parent: parent.0,
            name,
        });
        self.done_op(op, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let op = name(link_name, Errno::EINVAL).and_then(|name| {
            Ok(FileOp::Symlink {
                parent: parent.0,
                name,
                target: self::name(target.as_os_str(), Errno::EINVAL)?,
                uid: req.uid(),
                gid: req.gid(),
            })
        });
        self.entry_op(op, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            // RENAME_NOREPLACE and RENAME_EXCHANGE: programs fall back to a plain rename.
            return reply.error(self.refuse("rename with flags", Errno::EINVAL));
        }
        self.changing();
        let op = name(n, Errno::ENOENT).and_then(|name| {
            Ok(FileOp::Rename {
                parent: parent.0,
                name,
                new_parent: newparent.0,
                new_name: self::name(newname, Errno::EINVAL)?,
            })
        });
        self.done_op(op, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.changing();
        let op = name(newname, Errno::EINVAL).map(|new_name| FileOp::Link {
            ino: ino.0,
            new_parent: newparent.0,
            new_name,
        });
        self.entry_op(op, reply);
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // No FOPEN_KEEP_CACHE: the kernel drops its cached pages at each open, so a file
        // opened after another client wrote it is read afresh (close-to-open, as NFS). The
        // handle says only whether the file was opened for writing (its close sends).
        let fh = if flags.0 & libc::O_ACCMODE == libc::O_RDONLY {
            READER
        } else {
            WRITER
        };
        reply.opened(fh, FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn(|s| async move {
            let held = s.held(ino.0, false).await;
            if let Some(data) = held.as_ref().and_then(|g| g.read_held(offset, size)) {
                return reply.data(&data);
            }
            match s.read_service(ino.0, offset, size).await {
                Ok(got) => match held {
                    Some(g) => reply.data(&g.read_over(offset, size, got)),
                    None => reply.data(&got),
                },
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.spawn(|s| async move {
            if let Some(mut g) = s.held(ino.0, true).await {
                let before = g.bytes();
                g.write(offset, &data, Instant::now(), ms(SystemTime::now()));
                let total = s
                    .behind
                    .as_ref()
                    .map_or(0, |b| b.add_bytes(g.bytes() as isize - before as isize));
                if g.bytes() >= FILE_BYTES_MAX
                    || total >= TOTAL_BYTES_MAX
                    || g.older_than(s.ttl, Instant::now())
                {
                    if let Err(e) = s.send_held(ino.0, &mut g).await {
                        return reply.error(Errno::from_i32(e));
                    }
                }
                return reply.written(data.len() as u32);
            }
            // Writing through (or the table of held files is full).
            let mut done = 0usize;
            for chunk in data.chunks(s.backend.write_bytes_max() as usize) {
                let op = FileOp::Write {
                    ino: ino.0,
                    offset: offset + done as u64,
                    data: chunk.to_vec(),
                };
                match s.attr(op).await {
                    Ok(_) => done += chunk.len(),
                    // What was written stays written: report it, or the error if nothing was.
                    Err(e) if done == 0 => return reply.error(Errno::from_i32(e)),
                    Err(_) => break,
                }
            }
            reply.written(done as u32);
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) of a descriptor open for writing: the file's held writes go to the service
        // before it returns (closing a reader's sends nothing, as on NFS).
        if fh == READER {
            return reply.ok();
        }
        self.send_file_then(ino, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.send_file_then(ino, reply);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.shared.next_fh.fetch_add(1, Ordering::Relaxed);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.spawn(|s| async move {
            // The listing is read at offset 0 (the start, or a rewind) and kept while the
            // directory is open: the kernel resumes at the offset of the last entry it took.
            let kept = (offset > 0)
                .then(|| s.dirs.lock().expect("not poisoned").get(&fh.0).cloned())
                .flatten();
            let listing = match kept {
                Some(l) => l,
                None => match s.list(ino.0).await {
                    Ok(l) => {
                        let l = Arc::new(l);
                        s.dirs.lock().expect("not poisoned").insert(fh.0, l.clone());
                        l
                    }
                    Err(e) => return reply.error(Errno::from_i32(e)),
                },
            };
            for (i, (ino, kind, name)) in listing.iter().enumerate().skip(offset as usize) {
                if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.shared.dirs.lock().expect("not poisoned").remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(|s| async move {
            match s.call(FileOp::StatFs).await {
                Ok(FileReply::Stats(st)) => reply.statfs(
                    st.blocks,
                    st.blocks_free,
                    st.blocks_free,
                    st.files,
                    // An inode takes a row, not a fixed slot: free blocks bound new files.
                    st.blocks_free,
                    BLOCK as u32,
                    NAME_BYTES_MAX as u32,
                    BLOCK as u32,
                ),
                Ok(other) => reply.error(Errno::from_i32(unexpected("Stats", &other))),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Mounted with default_permissions: the kernel checks the bits itself.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = match name(n, Errno::EINVAL) {
            Ok(name) => name,
            Err(e) => return reply.error(e),
        };
        let op = FileOp::Create {
            parent: parent.0,
            name,
            mode: perm(mode, umask),
            uid: req.uid(),
            gid: req.gid(),
            exclusive: flags & libc::O_EXCL != 0,
        };
        self.spawn(|s| async move {
            match s.attr(op).await {
                Ok(a) => {
                    // A new file's size is known: reads beyond what it is written need no
                    // service, and its pieces may join over zeros.
                    if let (Some(mut g), Some(b)) = (s.held(a.ino, true).await, &s.behind) {
                        g.learn(a, Instant::now(), b.epoch());
                    }
                    reply.created(
                        &s.ttl,
                        &file_attr(&a),
                        Generation(0),
                        WRITER,
                        FopenFlags::empty(),
                    )
                }
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    // Extended attributes: ENOSYS makes the kernel stop asking and answer EOPNOTSUPP itself.
    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refuse("extended attributes", Errno::ENOSYS));
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _n: &OsStr, _size: u32, reply: ReplyXattr) {
        reply.error(self.refuse("extended attributes", Errno::ENOSYS));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(self.refuse("extended attributes", Errno::ENOSYS));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refuse("extended attributes", Errno::ENOSYS));
    }

    // Locks (getlk, setlk) are not overridden: the mount does not ask the kernel to forward
    // them (no FUSE_POSIX_LOCKS), so the kernel keeps them itself, local to this machine.

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        // posix_fallocate(3) then writes zeros instead.
        reply.error(self.refuse("fallocate", Errno::EOPNOTSUPP));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        // SEEK_DATA and SEEK_HOLE: ENOSYS lets the kernel treat the whole file as data.
        reply.error(Errno::ENOSYS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_keep_permission_bits_and_count_blocks() {
        let a = Attr {
            ino: 7,
            kind: Kind::File,
            mode: 0o104755,
            nlink: 2,
            uid: 3,
            gid: 4,
            size: 513,
            atime_ms: 1_500,
            mtime_ms: 2_000,
            ctime_ms: 2_001,
        };
        let f = file_attr(&a);
        assert_eq!(f.perm, 0o4755);
        assert_eq!(f.blocks, 2);
        assert_eq!(f.kind, FileType::RegularFile);
        assert_eq!(ms(f.atime), 1_500);
        assert_eq!(ms(f.ctime), 2_001);
        assert_eq!(perm(0o100666, 0o022), 0o644);
    }
}
