//! The SQLite VFS that lays the database file over the replicated state.
//!
//! SQLite reads and writes its main database file through this VFS; every byte lands in the
//! state the library gives the service ([`StateWrite`]), so checkpoints, incremental digests,
//! page-level state transfer and proactive recovery cover the database unchanged. The state
//! is reached through a per-thread pointer set only while an operation runs
//! ([`with_backing`]): outside an operation SQLite sees an I/O error.
//!
//! Layout of the state: a header page (magic, database length, agreed time of the latest
//! write), then the database file from [`DB_BASE`]. An all-zero state is an empty database.
//!
//! Everything SQLite could otherwise take from the machine is agreed: the current time is the
//! operation's agreed time, sleeping returns at once, randomness is seeded per operation by
//! the caller, and files other than the main database (statement journals, temporary tables
//! for sorting) live in memory and vanish with the operation's connection state.

use redoubt_state::{StateRead, StateWrite};
use rusqlite::ffi;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Once;

/// The VFS's registered name.
pub(crate) const VFS_NAME: &CStr = c"redoubt";
/// The main database's name (any other main database is refused: `VACUUM INTO`, `ATTACH`).
pub(crate) const DB_NAME: &str = "redoubt.db";
/// Where the database file starts in the state; the header page before it.
pub const DB_BASE: u64 = 4096;
const MAGIC: [u8; 8] = *b"RDBTSQL1";
/// In-memory side files (journals, temporary sort files) are bounded.
const MEM_FILE_BYTES_MAX: usize = 256 << 20;
/// Overlay chunk: SQLite's page size (the service refuses `PRAGMA page_size`).
const CHUNK: u64 = 4096;

/// The header at the start of the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Length of the database file in bytes.
    pub len: u64,
    /// Agreed time (ms) of the latest write: `'now'` in read-only statements.
    pub time_ms: u64,
}

impl Header {
    pub(crate) fn read(state: &dyn StateRead) -> Result<Header, String> {
        let mut b = [0u8; 24];
        state.read(0, &mut b);
        if b == [0; 24] {
            return Ok(Header { len: 0, time_ms: 0 });
        }
        if b[..8] != MAGIC {
            return Err("the state does not hold a redoubt SQL database (bad magic)".into());
        }
        let len = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        let time_ms = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
        if len > state.size().saturating_sub(DB_BASE) {
            return Err(format!(
                "the database length {len} exceeds the state ({} bytes)",
                state.size()
            ));
        }
        Ok(Header { len, time_ms })
    }

    fn write(&self, state: &mut dyn StateWrite) {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&MAGIC);
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.time_ms.to_le_bytes());
        state.write(0, &b);
    }
}

/// The most the database may grow to in a state of `size` bytes.
pub(crate) fn db_bytes_max(size: u64) -> u64 {
    size.saturating_sub(DB_BASE)
}

/// Where SQLite's file operations go during one operation.
pub(crate) enum Access<'a> {
    /// An ordered write: straight into the replicated state.
    Write(&'a mut dyn StateWrite),
    /// A read (read-only path, describe, connection setup): writes land in an overlay that is
    /// dropped with the access, so the state is never modified.
    Overlay {
        state: &'a dyn StateRead,
        chunks: BTreeMap<u64, Box<[u8]>>,
        len: Option<u64>,
    },
}

/// The state behind the database during one operation, and the agreed time.
pub(crate) struct Backing<'a> {
    access: Access<'a>,
    header: Header,
    /// `'now'` for this operation.
    pub time_ms: u64,
}

impl<'a> Backing<'a> {
    /// A backing that writes into `state`.
    pub(crate) fn write(state: &'a mut dyn StateWrite, time_ms: u64) -> Result<Self, String> {
        let header = Header::read(&*state)?;
        Ok(Backing {
            access: Access::Write(state),
            header,
            time_ms,
        })
    }

    /// A backing that never modifies `state`; `'now'` is the time of the latest write.
    pub(crate) fn overlay(state: &'a dyn StateRead) -> Result<Self, String> {
        let header = Header::read(state)?;
        Ok(Backing {
            access: Access::Overlay {
                state,
                chunks: BTreeMap::new(),
                len: None,
            },
            header,
            time_ms: header.time_ms,
        })
    }

    /// Records the agreed time of this write in the header (ordered writes only).
    pub(crate) fn stamp_time(&mut self) {
        if let Access::Write(state) = &mut self.access {
            self.header.time_ms = self.time_ms;
            self.header.write(&mut **state);
        }
    }

    fn state(&self) -> &dyn StateRead {
        match &self.access {
            Access::Write(s) => &**s,
            Access::Overlay { state, .. } => *state,
        }
    }

    fn len(&self) -> u64 {
        match &self.access {
            Access::Overlay { len: Some(l), .. } => *l,
            _ => self.header.len,
        }
    }

    fn set_len(&mut self, len: u64) {
        match &mut self.access {
            Access::Write(state) => {
                self.header.len = len;
                self.header.write(&mut **state);
            }
            Access::Overlay { len: l, .. } => *l = Some(len),
        }
    }

    fn read(&self, off: u64, buf: &mut [u8]) {
        match &self.access {
            Access::Write(s) => s.read(DB_BASE + off, buf),
            Access::Overlay { state, chunks, .. } => {
                let mut done = 0usize;
                while done < buf.len() {
                    let at = off + done as u64;
                    let (chunk, within) = (at / CHUNK, (at % CHUNK) as usize);
                    let n = (CHUNK as usize - within).min(buf.len() - done);
                    match chunks.get(&chunk) {
                        Some(c) => buf[done..done + n].copy_from_slice(&c[within..within + n]),
                        None => state.read(DB_BASE + at, &mut buf[done..done + n]),
                    }
                    done += n;
                }
            }
        }
    }

    fn write_at(&mut self, off: u64, data: &[u8]) {
        match &mut self.access {
            Access::Write(s) => s.write(DB_BASE + off, data),
            Access::Overlay { state, chunks, .. } => {
                let mut done = 0usize;
                while done < data.len() {
                    let at = off + done as u64;
                    let (chunk, within) = (at / CHUNK, (at % CHUNK) as usize);
                    let n = (CHUNK as usize - within).min(data.len() - done);
                    let c = chunks.entry(chunk).or_insert_with(|| {
                        let mut b = vec![0u8; CHUNK as usize].into_boxed_slice();
                        let base = DB_BASE + chunk * CHUNK;
                        let avail = state.size().saturating_sub(base).min(CHUNK) as usize;
                        state.read(base, &mut b[..avail]);
                        b
                    });
                    c[within..within + n].copy_from_slice(&data[done..done + n]);
                    done += n;
                }
            }
        }
    }
}

thread_local! {
    static CURRENT: Cell<*mut Backing<'static>> = const { Cell::new(std::ptr::null_mut()) };
}

/// Runs `f` with `backing` behind the VFS on this thread (SQLite calls the VFS synchronously,
/// on the calling thread).
pub(crate) fn with_backing<R>(backing: &mut Backing<'_>, f: impl FnOnce() -> R) -> R {
    struct Restore(*mut Backing<'static>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    // The pointer is only dereferenced while `f` runs, during which `backing` is borrowed.
    let ptr = std::ptr::from_mut(backing).cast::<Backing<'static>>();
    let _restore = Restore(CURRENT.with(|c| c.replace(ptr)));
    f()
}

fn current<R>(f: impl FnOnce(&mut Backing<'static>) -> R) -> Option<R> {
    let ptr = CURRENT.with(|c| c.get());
    if ptr.is_null() {
        return None;
    }
    // SAFETY: set by `with_backing` from a live exclusive borrow for the duration of the
    // closure that is running now, on this thread; the VFS never holds it across calls.
    Some(f(unsafe { &mut *ptr }))
}

/// SQLite's file object: the main database or an in-memory side file.
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    kind: Kind,
}

enum Kind {
    Main,
    Mem(Vec<u8>),
}

unsafe fn kind<'f>(f: *mut ffi::sqlite3_file) -> &'f mut Kind {
    // SAFETY (callers): SQLite passes back the file object `x_open` initialised.
    unsafe { &mut (*(f as *mut File)).kind }
}

/// Registers the VFS once per process.
pub(crate) fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let vfs = Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: std::mem::size_of::<File>() as c_int,
            mxPathname: 512,
            pNext: std::ptr::null_mut(),
            zName: VFS_NAME.as_ptr(),
            pAppData: std::ptr::null_mut(),
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: Some(x_dl_open),
            xDlError: Some(x_dl_error),
            xDlSym: Some(x_dl_sym),
            xDlClose: Some(x_dl_close),
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        });
        // SAFETY: the VFS lives for the rest of the process (leaked); registering is
        // thread-safe in SQLite.
        let rc = unsafe { ffi::sqlite3_vfs_register(Box::leak(vfs), 0) };
        assert_eq!(rc, ffi::SQLITE_OK, "registering the SQLite VFS");
    });
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_lock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let main = flags & ffi::SQLITE_OPEN_MAIN_DB != 0;
    if main {
        // SAFETY: SQLite passes a NUL-terminated name or null.
        let ours =
            !name.is_null() && unsafe { CStr::from_ptr(name) }.to_bytes() == DB_NAME.as_bytes();
        if !ours {
            return ffi::SQLITE_CANTOPEN;
        }
    }
    let kind = if main {
        Kind::Main
    } else {
        Kind::Mem(Vec::new())
    };
    // SAFETY: SQLite allocated `szOsFile` bytes for the file object.
    unsafe {
        std::ptr::write(
            file as *mut File,
            File {
                base: ffi::sqlite3_file {
                    pMethods: &IO_METHODS,
                },
                kind,
            },
        );
        if !out_flags.is_null() {
            *out_flags = flags;
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: initialised by `x_open`; SQLite closes a file once.
    unsafe { std::ptr::drop_in_place(kind(file) as *mut Kind) };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite passes a buffer of `amount` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, amount.max(0) as usize) };
    let off = offset.max(0) as u64;
    let fill = |len: u64, buf: &mut [u8], read: &mut dyn FnMut(u64, &mut [u8])| {
        let avail = len.saturating_sub(off).min(buf.len() as u64) as usize;
        read(off, &mut buf[..avail]);
        buf[avail..].fill(0);
        if avail < buf.len() {
            ffi::SQLITE_IOERR_SHORT_READ
        } else {
            ffi::SQLITE_OK
        }
    };
    // SAFETY: initialised by `x_open`.
    match unsafe { kind(file) } {
        Kind::Mem(v) => fill(v.len() as u64, buf, &mut |o, b| {
            b.copy_from_slice(&v[o as usize..o as usize + b.len()])
        }),
        Kind::Main => current(|bk| {
            let len = bk.len();
            fill(len, buf, &mut |o, b| bk.read(o, b))
        })
        .unwrap_or(ffi::SQLITE_IOERR_READ),
    }
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite passes a buffer of `amount` bytes.
    let data = unsafe { std::slice::from_raw_parts(buf as *const u8, amount.max(0) as usize) };
    let off = offset.max(0) as u64;
    let end = off + data.len() as u64;
    // SAFETY: initialised by `x_open`.
    match unsafe { kind(file) } {
        Kind::Mem(v) => {
            if end as usize > MEM_FILE_BYTES_MAX {
                return ffi::SQLITE_FULL;
            }
            if v.len() < end as usize {
                v.resize(end as usize, 0);
            }
            v[off as usize..end as usize].copy_from_slice(data);
            ffi::SQLITE_OK
        }
        Kind::Main => current(|bk| {
            if end > db_bytes_max(bk.state().size()) {
                return ffi::SQLITE_FULL;
            }
            bk.write_at(off, data);
            if end > bk.len() {
                bk.set_len(end);
            }
            ffi::SQLITE_OK
        })
        .unwrap_or(ffi::SQLITE_IOERR_WRITE),
    }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let size = size.max(0) as u64;
    // SAFETY: initialised by `x_open`.
    match unsafe { kind(file) } {
        Kind::Mem(v) => {
            v.truncate(size as usize);
            ffi::SQLITE_OK
        }
        Kind::Main => current(|bk| {
            if size < bk.len() {
                bk.set_len(size);
            }
            ffi::SQLITE_OK
        })
        .unwrap_or(ffi::SQLITE_IOERR_TRUNCATE),
    }
}

unsafe extern "C" fn x_sync(_file: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    // Durability is the library's: the state is checkpointed and the log replayed.
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: initialised by `x_open`.
    let len = match unsafe { kind(file) } {
        Kind::Mem(v) => Some(v.len() as u64),
        Kind::Main => current(|bk| bk.len()),
    };
    match len {
        Some(l) => {
            // SAFETY: SQLite passes a valid out-pointer.
            unsafe { *size = l as ffi::sqlite3_int64 };
            ffi::SQLITE_OK
        }
        None => ffi::SQLITE_IOERR_FSTAT,
    }
}

unsafe extern "C" fn x_lock(_file: *mut ffi::sqlite3_file, _level: c_int) -> c_int {
    // One connection per state, used by one operation at a time: nothing to lock against.
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_check_reserved_lock(
    _file: *mut ffi::sqlite3_file,
    out: *mut c_int,
) -> c_int {
    // SAFETY: SQLite passes a valid out-pointer.
    unsafe { *out = 0 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_file_control(
    _file: *mut ffi::sqlite3_file,
    _op: c_int,
    _arg: *mut c_void,
) -> c_int {
    ffi::SQLITE_NOTFOUND
}

unsafe extern "C" fn x_sector_size(_file: *mut ffi::sqlite3_file) -> c_int {
    CHUNK as c_int
}

unsafe extern "C" fn x_device_characteristics(_file: *mut ffi::sqlite3_file) -> c_int {
    ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
}

unsafe extern "C" fn x_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    _name: *const c_char,
    _sync_dir: c_int,
) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_access(
    _vfs: *mut ffi::sqlite3_vfs,
    _name: *const c_char,
    _flags: c_int,
    out: *mut c_int,
) -> c_int {
    // No journal or WAL file ever exists beside the database.
    // SAFETY: SQLite passes a valid out-pointer.
    unsafe { *out = 0 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n_out: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: SQLite passes a NUL-terminated name and an output buffer of `n_out` bytes.
    unsafe {
        let src = CStr::from_ptr(name).to_bytes_with_nul();
        if src.len() > n_out.max(0) as usize {
            return ffi::SQLITE_CANTOPEN;
        }
        std::ptr::copy_nonoverlapping(src.as_ptr() as *const c_char, out, src.len());
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_dl_open(_vfs: *mut ffi::sqlite3_vfs, _name: *const c_char) -> *mut c_void {
    // Extensions are never loaded on a replica.
    std::ptr::null_mut()
}

unsafe extern "C" fn x_dl_error(_vfs: *mut ffi::sqlite3_vfs, n: c_int, msg: *mut c_char) {
    let text = c"loading extensions is not supported by the replicated SQL service";
    let bytes = text.to_bytes_with_nul();
    let len = bytes.len().min(n.max(0) as usize);
    if len > 0 {
        // SAFETY: SQLite passes a buffer of `n` bytes; the copy ends with a NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, msg, len);
            *msg.add(len - 1) = 0;
        }
    }
}

unsafe extern "C" fn x_dl_sym(
    _vfs: *mut ffi::sqlite3_vfs,
    _handle: *mut c_void,
    _symbol: *const c_char,
) -> Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)> {
    None
}

unsafe extern "C" fn x_dl_close(_vfs: *mut ffi::sqlite3_vfs, _handle: *mut c_void) {}

unsafe extern "C" fn x_randomness(
    _vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    // Never the machine's entropy: the service seeds SQLite's generator per operation.
    // SAFETY: SQLite passes a buffer of `n` bytes.
    unsafe { std::ptr::write_bytes(out, 0, n.max(0) as usize) };
    n
}

unsafe extern "C" fn x_sleep(_vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    // Nothing to wait for (no other connection holds a lock), and no local time may pass.
    micros
}

/// Milliseconds since the Unix epoch to SQLite's Julian-day milliseconds.
const UNIX_EPOCH_JULIAN_MS: i64 = 210_866_760_000_000;

fn agreed_time_ms() -> i64 {
    current(|bk| bk.time_ms as i64).unwrap_or(0)
}

unsafe extern "C" fn x_current_time(_vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    let ms = UNIX_EPOCH_JULIAN_MS + agreed_time_ms();
    // SAFETY: SQLite passes a valid out-pointer.
    unsafe { *out = ms as f64 / 86_400_000.0 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_current_time_int64(
    _vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite passes a valid out-pointer.
    unsafe { *out = UNIX_EPOCH_JULIAN_MS + agreed_time_ms() };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_get_last_error(
    _vfs: *mut ffi::sqlite3_vfs,
    _n: c_int,
    _out: *mut c_char,
) -> c_int {
    0
}
