//! The client side of the file service: typed operations over the library's [`Client`].

use crate::{Client, ClientError, ClientSetup};
use redoubt_services::files::{Attr, DirEntry, Errno, FileOp, FileReply, FsStats, Ino, SetTime};
use std::time::Duration;

/// Why a file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FileClientError {
    /// The cluster did not answer (see [`ClientError`]).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The file system refused the operation; nothing changed.
    #[error(transparent)]
    Fs(#[from] Errno),
    /// The certified reply is not a reply of the expected kind.
    #[error("unexpected reply to {op}: {reply}")]
    UnexpectedReply { op: &'static str, reply: String },
}

impl FileClientError {
    /// The Linux `errno` to report to a program (EIO when the cluster did not answer,
    /// ETIMEDOUT when no certified reply came in time).
    pub fn errno(&self) -> i32 {
        match self {
            FileClientError::Fs(e) => e.code(),
            FileClientError::Client(ClientError::Unreachable { .. }) => 110,
            FileClientError::Client(ClientError::TooLarge(_)) => 27,
            _ => 5,
        }
    }
}

/// A client of the replicated file service ([`redoubt_services::files::FileService`]).
#[derive(Clone, Debug)]
pub struct FileClient {
    client: Client,
    deadline: Option<Duration>,
}

macro_rules! expect {
    ($self:ident, $op:expr, $name:literal, $pat:pat => $out:expr) => {
        match $self.run($op, $name).await? {
            $pat => Ok($out),
            other => Err(FileClientError::UnexpectedReply {
                op: $name,
                reply: format!("{other:?}"),
            }),
        }
    };
}

impl FileClient {
    pub fn new(client: Client) -> Self {
        FileClient {
            client,
            deadline: None,
        }
    }

    pub async fn connect(setup: ClientSetup) -> Result<Self, ClientError> {
        Ok(FileClient::new(Client::connect(setup).await?))
    }

    /// This client with `deadline` for every call instead of the setup's.
    pub fn with_deadline(&self, deadline: Duration) -> FileClient {
        FileClient {
            client: self.client.clone(),
            deadline: Some(deadline),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends `op`; an [`FileReply::Error`] becomes [`FileClientError::Fs`].
    pub async fn run(&self, op: FileOp, name: &'static str) -> Result<FileReply, FileClientError> {
        let reply = self
            .client
            .invoke_as(op.encode(), op.is_read_only(), self.deadline)
            .await?;
        match FileReply::decode(&reply) {
            Ok(FileReply::Error(e)) => Err(FileClientError::Fs(e)),
            Ok(r) => Ok(r),
            Err(e) => Err(FileClientError::UnexpectedReply {
                op: name,
                reply: format!("undecodable ({e})"),
            }),
        }
    }

    pub async fn lookup(&self, parent: Ino, name: &str) -> Result<Attr, FileClientError> {
        let op = FileOp::Lookup {
            parent,
            name: name.into(),
        };
        expect!(self, op, "lookup", FileReply::Attr(a) => a)
    }

    pub async fn getattr(&self, ino: Ino) -> Result<Attr, FileClientError> {
        expect!(self, FileOp::GetAttr { ino }, "getattr", FileReply::Attr(a) => a)
    }

    pub async fn read(&self, ino: Ino, offset: u64, len: u32) -> Result<Vec<u8>, FileClientError> {
        let op = FileOp::Read { ino, offset, len };
        expect!(self, op, "read", FileReply::Data(d) => d)
    }

    /// Up to `max` entries after `after`, and whether more remain.
    pub async fn readdir(
        &self,
        ino: Ino,
        after: Option<String>,
        max: u32,
    ) -> Result<(Vec<DirEntry>, bool), FileClientError> {
        let op = FileOp::ReadDir { ino, after, max };
        expect!(self, op, "readdir", FileReply::Entries { entries, more } => (entries, more))
    }

    pub async fn readlink(&self, ino: Ino) -> Result<String, FileClientError> {
        expect!(self, FileOp::ReadLink { ino }, "readlink", FileReply::Target(t) => t)
    }

    pub async fn statfs(&self) -> Result<FsStats, FileClientError> {
        expect!(self, FileOp::StatFs, "statfs", FileReply::Stats(s) => s)
    }

    pub async fn create(
        &self,
        parent: Ino,
        name: &str,
        mode: u32,
        uid: u32,
        gid: u32,
        exclusive: bool,
    ) -> Result<Attr, FileClientError> {
        let op = FileOp::Create {
            parent,
            name: name.into(),
            mode,
            uid,
            gid,
            exclusive,
        };
        expect!(self, op, "create", FileReply::Attr(a) => a)
    }

    pub async fn mkdir(
        &self,
        parent: Ino,
        name: &str,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attr, FileClientError> {
        let op = FileOp::Mkdir {
            parent,
            name: name.into(),
            mode,
            uid,
            gid,
        };
        expect!(self, op, "mkdir", FileReply::Attr(a) => a)
    }

    pub async fn symlink(
        &self,
        parent: Ino,
        name: &str,
        target: &str,
        uid: u32,
        gid: u32,
    ) -> Result<Attr, FileClientError> {
        let op = FileOp::Symlink {
            parent,
            name: name.into(),
            target: target.into(),
            uid,
            gid,
        };
        expect!(self, op, "symlink", FileReply::Attr(a) => a)
    }

    /// Writes `data` at `offset`; returns the attributes after the write.
    pub async fn write(
        &self,
        ino: Ino,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Attr, FileClientError> {
        let op = FileOp::Write { ino, offset, data };
        expect!(self, op, "write", FileReply::Attr(a) => a)
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn setattr(
        &self,
        ino: Ino,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    ) -> Result<Attr, FileClientError> {
        let op = FileOp::SetAttr {
            ino,
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        expect!(self, op, "setattr", FileReply::Attr(a) => a)
    }

    pub async fn unlink(&self, parent: Ino, name: &str) -> Result<(), FileClientError> {
        let op = FileOp::Unlink {
            parent,
            name: name.into(),
        };
        expect!(self, op, "unlink", FileReply::Done => ())
    }

    pub async fn rmdir(&self, parent: Ino, name: &str) -> Result<(), FileClientError> {
        let op = FileOp::Rmdir {
            parent,
            name: name.into(),
        };
        expect!(self, op, "rmdir", FileReply::Done => ())
    }

    pub async fn rename(
        &self,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
    ) -> Result<(), FileClientError> {
        let op = FileOp::Rename {
            parent,
            name: name.into(),
            new_parent,
            new_name: new_name.into(),
        };
        expect!(self, op, "rename", FileReply::Done => ())
    }

    pub async fn link(
        &self,
        ino: Ino,
        new_parent: Ino,
        new_name: &str,
    ) -> Result<Attr, FileClientError> {
        let op = FileOp::Link {
            ino,
            new_parent,
            new_name: new_name.into(),
        };
        expect!(self, op, "link", FileReply::Attr(a) => a)
    }
}
