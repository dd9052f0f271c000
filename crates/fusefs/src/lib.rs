//! A FUSE mount of redoubt's replicated file service: ordinary programs read and write files
//! whose every operation is agreed on by the replicas.
//!
//! [`FuseFs`] turns the kernel's FUSE requests into [`redoubt_services::files::FileOp`]s and
//! hands them to a [`Backend`]: [`ClusterBackend`] sends them to the cluster through a pool of
//! clients; [`LocalBackend`] executes the same file service in this process on an in-memory
//! state, the unreplicated baseline the benchmarks compare with. [`mount`] mounts either with
//! fuser's pure-Rust mount (the `mount(2)` system call; needs root, `/dev/fuse`, and no libfuse
//! or fusermount).
//!
//! What this crate must never do: keep file data or attributes beyond what the kernel caches
//! for the TTL (the file system is shared with other clients; every answer comes from the
//! service), or let `close(2)` or `fsync(2)` return before the backend acknowledged every write
//! of the file. Writes are held until then (write-behind, [`behind`]: NFS v3's unstable writes
//! and COMMIT), for at most the TTL, unless the mount writes through.

mod backend;
pub mod behind;
mod fs;

pub use backend::{op_name, write_bytes_max, Backend, ClusterBackend, LocalBackend};
pub use fs::{CallStats, Calls, FuseFs};

use fuser::{Config, MountOption, SessionACL};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The kernel's device for FUSE.
pub const DEV_FUSE: &str = "/dev/fuse";

/// How long the kernel caches attributes and names unless told otherwise: short, because
/// other clients of the cluster may change them.
pub const DEFAULT_TTL: Duration = Duration::from_secs(1);

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{DEV_FUSE} does not exist: load the FUSE module (`modprobe fuse`) or, in a container, give it the device (`--device /dev/fuse`)")]
    NoDevice,
    #[error("mounting needs root (this process runs as uid {uid}): the mount is made with the mount(2) system call, without fusermount; run it with sudo")]
    NotRoot { uid: u32 },
    #[error("the mount point {0} is not a directory: create it first (`mkdir -p {0}`)")]
    NotADirectory(PathBuf),
    #[error("{0} is a mount whose server is gone (\"transport endpoint is not connected\"): unmount it first (`umount -l {0}`)")]
    Stale(PathBuf),
    #[error("cannot mount at {path}: {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot unmount {path}: {source}")]
    Unmount {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Checks what a mount needs before anything else starts: `/dev/fuse`, root, a directory to
/// mount on.
pub fn check_can_mount(mountpoint: &Path) -> Result<(), MountError> {
    if !Path::new(DEV_FUSE).exists() {
        return Err(MountError::NoDevice);
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(MountError::NotRoot { uid });
    }
    match std::fs::metadata(mountpoint) {
        Ok(m) if m.is_dir() => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            Err(MountError::Stale(mountpoint.to_path_buf()))
        }
        _ => Err(MountError::NotADirectory(mountpoint.to_path_buf())),
    }
}

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel caches attributes and names.
    pub ttl: Duration,
    /// The source name shown in /proc/mounts.
    pub fs_name: String,
    /// Hold writes until the file is closed or synced (or for the TTL) rather than sending
    /// each before `write(2)` returns.
    pub write_behind: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            ttl: DEFAULT_TTL,
            fs_name: "redoubt".into(),
            write_behind: true,
        }
    }
}

/// A mounted file system, served by a thread of its own until [`Mounted::unmount`] or until
/// someone else unmounts it.
pub struct Mounted {
    session: fuser::BackgroundSession,
    mountpoint: PathBuf,
    stats: std::sync::Arc<CallStats>,
}

/// Mounts `backend` at `mountpoint`, its calls run on `rt`. Permission bits are checked by the
/// kernel (`default_permissions`) and every user may use the mount (`allow_other`, as we are
/// root).
pub fn mount<B: Backend>(
    backend: B,
    mountpoint: &Path,
    rt: tokio::runtime::Handle,
    options: &MountOptions,
) -> Result<Mounted, MountError> {
    check_can_mount(mountpoint)?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(options.fs_name.clone()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    config.acl = SessionACL::All;
    let fs = FuseFs::new(backend, rt, options.ttl, options.write_behind);
    let stats = fs.stats();
    let session =
        fuser::spawn_mount(fs, mountpoint, &config).map_err(|source| MountError::Mount {
            path: mountpoint.to_path_buf(),
            source,
        })?;
    Ok(Mounted {
        session,
        mountpoint: mountpoint.to_path_buf(),
        stats,
    })
}

impl Mounted {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// What the mount has asked of its backend so far.
    pub fn stats(&self) -> std::sync::Arc<CallStats> {
        self.stats.clone()
    }

    /// False once the file system was unmounted (by anyone) and its thread ended.
    pub fn is_mounted(&self) -> bool {
        !self.session.guard.is_finished()
    }

    /// Unmounts, lazily if a process still uses the mount (it goes when they let go), and
    /// waits for the serving thread to end.
    pub fn unmount(self) -> Result<(), MountError> {
        let Mounted {
            session,
            mountpoint,
            ..
        } = self;
        let result = if session.guard.is_finished() {
            session.join()
        } else {
            session.umount_and_join()
        };
        match result {
            Ok(()) => Ok(()),
            // A process still uses it: detach it now (the serving thread ends when the last
            // one lets go, or with this process).
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => unmount_path(&mountpoint),
            Err(source) => Err(MountError::Unmount {
                path: mountpoint,
                source,
            }),
        }
    }
}

/// Unmounts `mountpoint`, lazily (MNT_DETACH) if it is busy.
pub fn unmount_path(mountpoint: &Path) -> Result<(), MountError> {
    let err = |source| MountError::Unmount {
        path: mountpoint.to_path_buf(),
        source,
    };
    let c = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|e| err(std::io::Error::other(e)))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let first = std::io::Error::last_os_error();
    if first.raw_os_error() != Some(libc::EBUSY) {
        return Err(err(first));
    }
    tracing::warn!(mountpoint = %mountpoint.display(), "the mount is busy: unmounting lazily (it goes when the last process lets go)");
    // SAFETY: as above.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(err(std::io::Error::last_os_error()))
    }
}

/// Whether `path` is a mount point now (from /proc/self/mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(canonical) = std::fs::canonicalize(path) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = canonical.to_string_lossy();
    // Field 5 is the mount point, with spaces and the like escaped as \040 etc.
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|m| unescape_mountinfo(m) == want)
    })
}

fn unescape_mountinfo(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
