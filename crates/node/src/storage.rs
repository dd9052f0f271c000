//! The replica's durable journal: one append-only file of checksummed records in the home
//! directory, synced before the sends that depend on them, rewritten (compacted) after each
//! checkpoint or view record so it stays bounded (about 3L + 2 records).
//!
//! Record framing: `u32 length (LE) | 8-byte BLAKE3 prefix of the payload | payload (postcard)`.
//! A torn or corrupt tail (a record whose sync never completed, so nothing depending on it was
//! ever sent) is truncated at start-up and reported.

use redoubt_core::journal::{compact, Record};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const JOURNAL: &str = "journal.log";
const JOURNAL_TMP: &str = "journal.tmp";
const LOCK: &str = "LOCK";
/// Largest record accepted when reading the journal back (bytes).
const RECORD_BYTES_MAX: usize = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("cannot use home directory {path}: {source}; check that it exists and is writable by this user")]
    Home {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("home directory {0} is in use by another redoubt process (lock held on LOCK); stop it first or use another home")]
    Locked(PathBuf),
    #[error("journal {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub struct Journal {
    dir: PathBuf,
    file: BufWriter<File>,
    records: Vec<Record>,
    fsync: bool,
    dirty: bool,
    _lock: File,
    /// Bytes of the tail dropped at open (torn write), for the operator.
    pub truncated_tail_bytes: u64,
    pub syncs: u64,
    pub compactions: u64,
}

impl Journal {
    /// Opens (creating) the journal in `dir`, returning it with the records it holds.
    pub fn open(dir: &Path, fsync: bool) -> Result<(Journal, Vec<Record>), StorageError> {
        std::fs::create_dir_all(dir).map_err(|source| StorageError::Home {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK))
            .map_err(|source| StorageError::Home {
                path: dir.to_path_buf(),
                source,
            })?;
        if lock.try_lock().is_err() {
            return Err(StorageError::Locked(dir.to_path_buf()));
        }
        let path = dir.join(JOURNAL);
        let io = |source| StorageError::Io {
            path: path.clone(),
            source,
        };
        let mut bytes = Vec::new();
        if path.exists() {
            File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(io)?;
        }
        let (records, good) = parse(&bytes);
        let truncated_tail_bytes = (bytes.len() - good) as u64;
        let mut j = Journal {
            dir: dir.to_path_buf(),
            // Replaced by `rewrite` below; opening the journal itself keeps this honest.
            file: BufWriter::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(io)?,
            ),
            records: Vec::new(),
            fsync,
            dirty: false,
            _lock: lock,
            truncated_tail_bytes,
            syncs: 0,
            compactions: 0,
        };
        // Rewrite a clean, compacted journal (drops any torn tail).
        j.records = compact(records.clone());
        j.rewrite()?;
        Ok((j, records))
    }

    /// Appends a record (buffered until [`Journal::sync`]). Checkpoint and view records
    /// trigger compaction.
    pub fn append(&mut self, r: Record) -> Result<(), StorageError> {
        if matches!(r, Record::Checkpoint { .. } | Record::View { .. }) {
            // The rewrite encodes every kept record, this one included.
            self.records.push(r);
            let records = std::mem::take(&mut self.records);
            self.records = compact(records);
            self.compactions += 1;
            self.rewrite()
        } else {
            let frame = frame(&r);
            self.records.push(r);
            self.file
                .write_all(&frame)
                .map_err(|source| self.io(source))?;
            self.dirty = true;
            Ok(())
        }
    }

    /// Makes everything appended durable (fsync unless disabled in the config).
    pub fn sync(&mut self) -> Result<(), StorageError> {
        if !self.dirty {
            return Ok(());
        }
        self.file.flush().map_err(|source| self.io(source))?;
        if self.fsync {
            self.file
                .get_ref()
                .sync_data()
                .map_err(|source| self.io(source))?;
        }
        self.dirty = false;
        self.syncs += 1;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn io(&self, source: std::io::Error) -> StorageError {
        StorageError::Io {
            path: self.dir.join(JOURNAL),
            source,
        }
    }

    /// Writes the current records to a temporary file, syncs it, and renames it over the
    /// journal (atomic on POSIX), then keeps appending to it.
    fn rewrite(&mut self) -> Result<(), StorageError> {
        let tmp = self.dir.join(JOURNAL_TMP);
        let path = self.dir.join(JOURNAL);
        let io = |source| StorageError::Io {
            path: tmp.clone(),
            source,
        };
        let mut w = BufWriter::new(File::create(&tmp).map_err(io)?);
        for r in &self.records {
            w.write_all(&frame(r)).map_err(io)?;
        }
        w.flush().map_err(io)?;
        if self.fsync {
            w.get_ref().sync_data().map_err(io)?;
        }
        std::fs::rename(&tmp, &path).map_err(io)?;
        if self.fsync {
            if let Ok(d) = File::open(&self.dir) {
                let _ = d.sync_all();
            }
        }
        let f = OpenOptions::new().append(true).open(&path).map_err(io)?;
        self.file = BufWriter::new(f);
        self.dirty = false;
        Ok(())
    }
}

fn frame(r: &Record) -> Vec<u8> {
    // The record is encoded in place after room for its header (no second copy of a body).
    let mut out = postcard::to_extend(r, vec![0u8; 12]).expect("records encode");
    let len = (out.len() - 12) as u32;
    let sum = blake3::hash(&out[12..]);
    out[..4].copy_from_slice(&len.to_le_bytes());
    out[4..12].copy_from_slice(&sum.as_bytes()[..8]);
    out
}

/// Parses records until the first incomplete or corrupt one; returns them and the number of
/// good bytes.
fn parse(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= 12 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len > RECORD_BYTES_MAX || bytes.len() - at - 12 < len {
            break;
        }
        let payload = &bytes[at + 12..at + 12 + len];
        if blake3::hash(payload).as_bytes()[..8] != bytes[at + 4..at + 12] {
            break;
        }
        match Record::decode(payload) {
            Ok(r) => out.push(r),
            Err(_) => break,
        }
        at += 12 + len;
    }
    (out, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_crypto::Digest;

    fn ex(n: u64) -> Record {
        Record::Executed {
            seq: n,
            digest: Digest([n as u8; 32]),
            batch: None,
        }
    }

    #[test]
    fn append_sync_reopen_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, recs) = Journal::open(dir.path(), true).unwrap();
            assert!(recs.is_empty());
            for n in 1..=5 {
                j.append(ex(n)).unwrap();
            }
            j.sync().unwrap();
        }
        // A torn write at the end is dropped.
        let path = dir.path().join(JOURNAL);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        let (j, recs) = Journal::open(dir.path(), true).unwrap();
        assert_eq!(recs, (1..=5).map(ex).collect::<Vec<_>>());
        assert_eq!(j.truncated_tail_bytes, 6);
        // A second process cannot open the same home.
        assert!(matches!(
            Journal::open(dir.path(), true),
            Err(StorageError::Locked(_))
        ));
    }

    #[test]
    fn checkpoint_compacts() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path(), false).unwrap();
        for n in 1..=10 {
            j.append(ex(n)).unwrap();
        }
        j.append(Record::Checkpoint {
            seq: 8,
            digest: Digest([1; 32]),
        })
        .unwrap();
        assert_eq!(j.len(), 3, "checkpoint + executions 9 and 10");
        drop(j);
        let (_, recs) = Journal::open(dir.path(), false).unwrap();
        assert_eq!(recs.len(), 3);
    }
}
