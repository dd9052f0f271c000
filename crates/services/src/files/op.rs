//! What travels between file-system clients (the FUSE mount, [`super::FileClient`]) and the
//! replicated file service: operations, attributes and errors (NFS v3's model).

use crate::sql::{decode_exact, encode};
use serde::{Deserialize, Serialize};

/// An inode number. The root directory is [`ROOT`].
pub type Ino = u64;
/// The root directory's inode.
pub const ROOT: Ino = 1;
/// File data is stored in blocks of this many bytes.
pub const BLOCK: u64 = 4096;
/// The most bytes one read or write moves.
pub const IO_BYTES_MAX: u32 = 128 * 1024;
/// The longest name in a directory (bytes).
pub const NAME_BYTES_MAX: usize = 255;
/// The longest symbolic link target (bytes).
pub const TARGET_BYTES_MAX: usize = 4095;
/// The most entries one directory read returns.
pub const READDIR_MAX: u32 = 1024;

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// An inode's attributes. Times are milliseconds since the Unix epoch: the agreed time of the
/// operation that set them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ms: u64,
    pub mtime_ms: u64,
    pub ctime_ms: u64,
}

/// A directory entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub ino: Ino,
    pub kind: Kind,
}

/// How [`FileOp::SetAttr`] sets a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    /// The operation's agreed time.
    Now,
    /// This time (ms since the Unix epoch).
    At(u64),
}

/// An operation on the file system.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileOp {
    // Read-only (the read-only path).
    /// The entry `name` in directory `parent`.
    Lookup {
        parent: Ino,
        name: String,
    },
    GetAttr {
        ino: Ino,
    },
    /// Up to `len` bytes from `offset` (fewer at the end of the file).
    Read {
        ino: Ino,
        offset: u64,
        len: u32,
    },
    /// Up to `max` entries of a directory, in name order, after the entry named `after`.
    ReadDir {
        ino: Ino,
        after: Option<String>,
        max: u32,
    },
    ReadLink {
        ino: Ino,
    },
    StatFs,
    // Writes (ordered).
    /// Creates a regular file (`exclusive`: fail if `name` exists; else an existing file is
    /// returned as it is).
    Create {
        parent: Ino,
        name: String,
        mode: u32,
        uid: u32,
        gid: u32,
        exclusive: bool,
    },
    Mkdir {
        parent: Ino,
        name: String,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Symlink {
        parent: Ino,
        name: String,
        target: String,
        uid: u32,
        gid: u32,
    },
    Write {
        ino: Ino,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Changes what is given; `size` truncates or extends with zeros.
    SetAttr {
        ino: Ino,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    },
    /// Removes a non-directory entry (the inode goes with its last link).
    Unlink {
        parent: Ino,
        name: String,
    },
    /// Removes an empty directory.
    Rmdir {
        parent: Ino,
        name: String,
    },
    /// Moves `parent/name` to `new_parent/new_name`, replacing a file there, or an empty
    /// directory when the source is a directory.
    Rename {
        parent: Ino,
        name: String,
        new_parent: Ino,
        new_name: String,
    },
    /// A new name for a non-directory inode.
    Link {
        ino: Ino,
        new_parent: Ino,
        new_name: String,
    },
}

/// Why an operation failed: POSIX's error numbers, as NFS v3 reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Errno {
    #[error("no such file or directory")]
    NoEnt,
    #[error("file exists")]
    Exist,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("file name too long")]
    NameTooLong,
    #[error("invalid argument")]
    Inval,
    #[error("no space left: the replicated state is full ([state] size_mib)")]
    NoSpace,
    #[error("too many links")]
    MLink,
    #[error("input/output error")]
    Io,
}

impl Errno {
    /// The Linux `errno` value.
    pub fn code(self) -> i32 {
        match self {
            Errno::NoEnt => 2,
            Errno::Io => 5,
            Errno::Exist => 17,
            Errno::NotDir => 20,
            Errno::IsDir => 21,
            Errno::Inval => 22,
            Errno::NoSpace => 28,
            Errno::MLink => 31,
            Errno::NameTooLong => 36,
            Errno::NotEmpty => 39,
        }
    }
}

/// File-system totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStats {
    /// Capacity and use, in [`BLOCK`]-byte blocks.
    pub blocks: u64,
    pub blocks_free: u64,
    /// Inodes in use.
    pub files: u64,
}

/// The reply to a [`FileOp`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileReply {
    /// Lookup, GetAttr, Create, Mkdir, Symlink, Write, SetAttr, Link: the inode's attributes
    /// after the operation.
    Attr(Attr),
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A directory's entries; `more` when entries remain after the last one.
    Entries {
        entries: Vec<DirEntry>,
        more: bool,
    },
    Target(String),
    Stats(FsStats),
    /// Unlink, Rmdir, Rename.
    Done,
    Error(Errno),
}

/// An encoding that did not decode.
pub type DecodeError = crate::sql::DecodeError;

impl FileOp {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    pub fn decode(b: &[u8]) -> Result<FileOp, DecodeError> {
        decode_exact(b)
    }

    /// True for the operations that take the read-only path.
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            FileOp::Lookup { .. }
                | FileOp::GetAttr { .. }
                | FileOp::Read { .. }
                | FileOp::ReadDir { .. }
                | FileOp::ReadLink { .. }
                | FileOp::StatFs
        )
    }
}

impl FileReply {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    pub fn decode(b: &[u8]) -> Result<FileReply, DecodeError> {
        decode_exact(b)
    }
}
