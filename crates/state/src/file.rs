//! The page store on disk ([`FileStore`]).
//!
//! Files in the store's directory:
//! - `pages.dat`: the page bytes, page `i` at `i * page_size`;
//! - `tree.dat`: one `(lm, digest)` entry per page;
//! - `aux.0`, `aux.1`: the two slots of the base's auxiliary bytes (the replica's reply table,
//!   which can be megabytes: every client's last result). A commit writes the new bytes into
//!   the slot the base does not use, so the base's own bytes are never overwritten, and they
//!   are written once per commit;
//! - `base.meta`: the geometry, the base's checkpoint, and which slot holds its auxiliary
//!   bytes (their length and CRC-32C), under a BLAKE3 checksum; replaced by a rename;
//! - `redo.log`: a commit in progress.
//!
//! A commit writes the auxiliary bytes to the free slot, then the new pages, their entries and
//! the new meta-data to `redo.log` with its length and a CRC-32C, syncs both, applies the pages
//! in place, syncs, replaces `base.meta` and invalidates the log by overwriting its magic.
//! Opening a store replays a complete log and discards a torn one. The log is rewritten in
//! place, never truncated (except when a much larger commit left it far longer than the last),
//! so a commit does not ask the file system to cut back a file it may still be writing back
//! (whether that alone costs time was not measured apart). The checksums only have to catch
//! torn and corrupt writes (whoever can write these files controls the replica anyway), which
//! CRC-32C does at a fraction of BLAKE3's cost for the megabytes of a commit.
//!
//! Commits are synced to the medium (`fsync`) at each step unless [`FileStore::set_sync`]
//! turned it off: a crash of the process then still opens at a whole base (the bytes written
//! are in the kernel's page cache), a power loss may not.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use redoubt_crypto::{Digest, DIGEST_LEN};
use serde::{Deserialize, Serialize};

use crate::store::{Base, CommitPage, Entry, PageStore, ENTRY_LEN};
use crate::Geometry;

/// `base.meta` in the current format; [`LEGACY_META_MAGIC`] held the auxiliary bytes inline.
const META_MAGIC: &[u8; 8] = b"RDSTATE2";
const LEGACY_META_MAGIC: &[u8; 8] = b"RDSTATE1";
const REDO_MAGIC: &[u8; 8] = b"RDREDO03";
/// A redo log file longer than this, and more than twice the commit just applied, is cut back
/// to nothing once that commit is applied (see [`FileStore::clear_redo`]).
const REDO_KEPT_BYTES: u64 = 64 << 20;

/// Where a base's auxiliary bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct AuxRef {
    slot: u8,
    len: u64,
    crc: u32,
}

#[derive(Serialize, Deserialize)]
struct MetaFile {
    geometry: Geometry,
    seq: u64,
    aux: AuxRef,
}

/// `base.meta` as written before the slots (auxiliary bytes inline); read, never written.
#[derive(Deserialize)]
struct LegacyMetaFile {
    geometry: Geometry,
    seq: u64,
    aux: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct RedoHeader {
    seq: u64,
    aux: AuxRef,
    pages: u64,
}

/// The meta-data as read: the legacy format's auxiliary bytes come with it.
struct Meta {
    geometry: Geometry,
    seq: u64,
    aux: MetaAux,
}

enum MetaAux {
    Slot(AuxRef),
    Inline(Vec<u8>),
}

/// A store in a directory (see the module documentation).
///
/// Clones share the open files: the state reads pages through one while its host writes
/// commits through another.
#[derive(Clone)]
pub struct FileStore {
    dir: PathBuf,
    geo: Geometry,
    pages: Arc<File>,
    tree: Arc<File>,
    /// The slot of the base's auxiliary bytes (2: none yet, or inline in a legacy meta-data
    /// file); a commit writes the other one.
    slot: Arc<AtomicU8>,
    /// Whether commits sync what they wrote (opening always does).
    sync: bool,
}

fn corrupt(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

impl FileStore {
    /// Opens (creating if needed) the store in `dir` with geometry `geo`. A store created with
    /// another geometry is refused. A complete commit left in the redo log is applied.
    pub fn open(dir: &Path, geo: Geometry) -> io::Result<FileStore> {
        std::fs::create_dir_all(dir)?;
        let pages = open_rw(&dir.join("pages.dat"))?;
        let tree = open_rw(&dir.join("tree.dat"))?;
        let s = FileStore {
            dir: dir.to_path_buf(),
            geo,
            pages: Arc::new(pages),
            tree: Arc::new(tree),
            slot: Arc::new(AtomicU8::new(2)),
            sync: true,
        };
        if let Some(meta) = s.read_meta()? {
            if meta.geometry != geo {
                return Err(corrupt(format!(
                    "state in {} was created with {:?}, configured {:?}",
                    dir.display(),
                    meta.geometry,
                    geo
                )));
            }
        }
        s.replay_redo()?;
        // The redo log exists from now on, with its name durable, so a commit only ever
        // rewrites its contents.
        s.clear_redo(0)?;
        sync_dir(dir)?;
        if let Some(Meta {
            aux: MetaAux::Slot(a),
            ..
        }) = s.read_meta()?
        {
            s.slot.store(a.slot, Ordering::Relaxed);
        }
        let want_pages = geo.size();
        if s.pages.metadata()?.len() != want_pages {
            s.pages.set_len(want_pages)?;
        }
        let want_tree = geo.pages() * ENTRY_LEN as u64;
        if s.tree.metadata()?.len() != want_tree {
            s.tree.set_len(want_tree)?;
        }
        Ok(s)
    }

    /// Whether commits sync what they write to the medium (on by default; see the module
    /// documentation for what turning it off risks).
    pub fn set_sync(&mut self, sync: bool) {
        self.sync = sync;
    }

    /// Overwrites bytes of a page on disk without updating anything else: silent corruption,
    /// for tests and fault drills.
    pub fn corrupt_page(&self, index: u64, offset: usize, bytes: &[u8]) -> io::Result<()> {
        let at = index * self.geo.page_size() as u64 + offset as u64;
        self.pages.write_all_at(bytes, at)?;
        self.pages.sync_all()
    }

    fn sync_file(&self, f: &File) -> io::Result<()> {
        if self.sync {
            f.sync_all()?;
        }
        Ok(())
    }

    fn aux_path(&self, slot: u8) -> PathBuf {
        self.dir.join(format!("aux.{slot}"))
    }

    fn read_meta(&self) -> io::Result<Option<Meta>> {
        let bytes = match std::fs::read(self.dir.join("base.meta")) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if bytes.len() < 8 + DIGEST_LEN {
            return Err(corrupt("base.meta: too short"));
        }
        let (body, sum) = bytes[8..].split_at(bytes.len() - 8 - DIGEST_LEN);
        if Digest::of_parts("redoubt.state.meta.v1", &[body]).0[..] != sum[..] {
            return Err(corrupt("base.meta: checksum mismatch"));
        }
        let bad = |e: postcard::Error| corrupt(format!("base.meta: {e}"));
        match &bytes[..8] {
            m if m == META_MAGIC => {
                let f: MetaFile = postcard::from_bytes(body).map_err(bad)?;
                Ok(Some(Meta {
                    geometry: f.geometry,
                    seq: f.seq,
                    aux: MetaAux::Slot(f.aux),
                }))
            }
            m if m == LEGACY_META_MAGIC => {
                let f: LegacyMetaFile = postcard::from_bytes(body).map_err(bad)?;
                Ok(Some(Meta {
                    geometry: f.geometry,
                    seq: f.seq,
                    aux: MetaAux::Inline(f.aux),
                }))
            }
            _ => Err(corrupt("base.meta: bad magic")),
        }
    }

    fn write_meta(&self, seq: u64, aux: AuxRef) -> io::Result<()> {
        let body = postcard::to_stdvec(&MetaFile {
            geometry: self.geo,
            seq,
            aux,
        })
        .map_err(|e| corrupt(e.to_string()))?;
        let mut bytes = META_MAGIC.to_vec();
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&Digest::of_parts("redoubt.state.meta.v1", &[&body]).0);
        let tmp = self.dir.join("base.meta.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        self.sync_file(&f)?;
        std::fs::rename(&tmp, self.dir.join("base.meta"))?;
        if self.sync {
            sync_dir(&self.dir)?;
        }
        self.slot.store(aux.slot, Ordering::Relaxed);
        Ok(())
    }

    /// Writes auxiliary bytes into the slot the base does not use.
    fn write_aux(&self, aux: &[u8]) -> io::Result<AuxRef> {
        let slot = match self.slot.load(Ordering::Relaxed) {
            0 => 1,
            _ => 0,
        };
        // Rewritten in place: bytes past `len` are an older commit's (see the module
        // documentation on truncation).
        let f = open_rw(&self.aux_path(slot))?;
        f.write_all_at(aux, 0)?;
        self.sync_file(&f)?;
        Ok(AuxRef {
            slot,
            len: aux.len() as u64,
            crc: crc32c::crc32c(aux),
        })
    }

    fn read_aux(&self, a: AuxRef) -> io::Result<Vec<u8>> {
        let path = self.aux_path(a.slot);
        let f = File::open(&path)?;
        let len = usize::try_from(a.len).map_err(|_| corrupt("aux: length"))?;
        let mut aux = vec![0u8; len];
        f.read_exact_at(&mut aux, 0)
            .map_err(|e| corrupt(format!("{}: {e}", path.display())))?;
        if crc32c::crc32c(&aux) != a.crc {
            return Err(corrupt(format!("{}: checksum mismatch", path.display())));
        }
        Ok(aux)
    }

    fn write_entry(&self, index: u64, e: &Entry) -> io::Result<()> {
        let mut b = [0u8; ENTRY_LEN];
        b[..8].copy_from_slice(&e.lm.to_le_bytes());
        b[8..].copy_from_slice(&e.digest.0);
        self.tree.write_all_at(&b, index * ENTRY_LEN as u64)
    }

    /// Applies a complete redo log, or discards a torn one.
    fn replay_redo(&self) -> io::Result<()> {
        let bytes = match std::fs::read(self.dir.join("redo.log")) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        // A log whose magic was written but whose body was not (a torn rewrite over an older
        // log of the same length) reads as the older, applied commit: replaying it again
        // writes what the store holds.
        let Some((h, pages)) = parse_redo(&bytes, self.geo) else {
            // Empty, applied already, or torn while being written: the base is still the
            // previous one.
            return self.clear_redo(0);
        };
        for (index, entry, data) in &pages {
            self.pages
                .write_all_at(data, index * self.geo.page_size() as u64)?;
            self.write_entry(*index, entry)?;
        }
        self.sync_file(&self.pages)?;
        self.sync_file(&self.tree)?;
        self.write_meta(h.seq, h.aux)?;
        self.clear_redo(bytes.len() as u64)
    }

    /// Invalidates the redo log (its commit, `applied` bytes long, is in place): overwrites its
    /// magic rather than truncating it, except that a log far longer than that commit (left by
    /// a large one, such as a state transfer's) is cut back.
    fn clear_redo(&self, applied: u64) -> io::Result<()> {
        let f = open_rw(&self.dir.join("redo.log"))?;
        let len = f.metadata()?.len();
        if len > REDO_KEPT_BYTES && len > applied.saturating_mul(2) {
            f.set_len(0)?;
        } else if len > 0 {
            f.write_all_at(&[0u8; 8], 0)?;
        }
        self.sync_file(&f)
    }
}

type RedoPages<'a> = Vec<(u64, Entry, &'a [u8])>;

/// The log is `magic | u64 body length (LE) | body | u32 CRC-32C of the body (LE)`, where the
/// body is the postcard header and then each page as `u64 index | u64 lm | digest | bytes`.
fn parse_redo(bytes: &[u8], geo: Geometry) -> Option<(RedoHeader, RedoPages<'_>)> {
    if bytes.len() < 16 || &bytes[..8] != REDO_MAGIC {
        return None;
    }
    // The log is rewritten in place: bytes past this commit's end are an older one's.
    let len = usize::try_from(u64::from_le_bytes(bytes[8..16].try_into().ok()?)).ok()?;
    let rest = &bytes[16..];
    if rest.len() < len.checked_add(4)? {
        return None;
    }
    let (body, sum) = (&rest[..len], &rest[len..len + 4]);
    if crc32c::crc32c(body).to_le_bytes() != sum {
        return None;
    }
    let (h, mut rest): (RedoHeader, &[u8]) = postcard::take_from_bytes(body).ok()?;
    let ps = geo.page_size();
    let mut pages = Vec::new();
    for _ in 0..h.pages {
        if rest.len() < 8 + ENTRY_LEN + ps {
            return None;
        }
        let index = u64::from_le_bytes(rest[..8].try_into().ok()?);
        let lm = u64::from_le_bytes(rest[8..16].try_into().ok()?);
        let digest = Digest(rest[16..16 + DIGEST_LEN].try_into().ok()?);
        if index >= geo.pages() {
            return None;
        }
        let data = &rest[8 + ENTRY_LEN..8 + ENTRY_LEN + ps];
        pages.push((index, Entry { lm, digest }, data));
        rest = &rest[8 + ENTRY_LEN + ps..];
    }
    rest.is_empty().then_some((h, pages))
}

impl PageStore for FileStore {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn base(&mut self) -> io::Result<Option<Base>> {
        let Some(meta) = self.read_meta()? else {
            return Ok(None);
        };
        let aux = match meta.aux {
            MetaAux::Slot(a) => self.read_aux(a)?,
            MetaAux::Inline(aux) => aux,
        };
        let n = self.geo.pages() as usize;
        let mut raw = vec![0u8; n * ENTRY_LEN];
        self.tree.read_exact_at(&mut raw, 0)?;
        let entries = raw
            .chunks_exact(ENTRY_LEN)
            .map(|c| Entry {
                lm: u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                digest: Digest(c[8..].try_into().expect("digest bytes")),
            })
            .collect();
        Ok(Some(Base {
            seq: meta.seq,
            aux,
            entries,
        }))
    }

    fn initialize(&mut self, aux: &[u8], entries: &[Entry]) -> io::Result<()> {
        let mut raw = Vec::with_capacity(entries.len() * ENTRY_LEN);
        for e in entries {
            raw.extend_from_slice(&e.lm.to_le_bytes());
            raw.extend_from_slice(&e.digest.0);
        }
        self.tree.write_all_at(&raw, 0)?;
        self.tree.sync_all()?;
        self.pages.sync_all()?;
        let a = self.write_aux(aux)?;
        self.write_meta(0, a)
    }

    fn read_page(&self, index: u64, buf: &mut [u8]) -> io::Result<()> {
        self.pages
            .read_exact_at(buf, index * self.geo.page_size() as u64)
    }

    fn commit(&mut self, seq: u64, aux: &[u8], pages: &[CommitPage<'_>]) -> io::Result<()> {
        let a = self.write_aux(aux)?;
        let header = postcard::to_stdvec(&RedoHeader {
            seq,
            aux: a,
            pages: pages.len() as u64,
        })
        .map_err(|e| corrupt(e.to_string()))?;
        let ps = self.geo.page_size();
        let body_len = header.len() + pages.len() * (8 + ENTRY_LEN + ps);
        let mut log = Vec::with_capacity(16 + body_len + 4);
        log.extend_from_slice(REDO_MAGIC);
        log.extend_from_slice(&(body_len as u64).to_le_bytes());
        log.extend_from_slice(&header);
        for p in pages {
            log.extend_from_slice(&p.index.to_le_bytes());
            log.extend_from_slice(&p.entry.lm.to_le_bytes());
            log.extend_from_slice(&p.entry.digest.0);
            log.extend_from_slice(p.bytes);
        }
        let sum = crc32c::crc32c(&log[16..]);
        log.extend_from_slice(&sum.to_le_bytes());
        let f = open_rw(&self.dir.join("redo.log"))?;
        f.write_all_at(&log, 0)?;
        self.sync_file(&f)?;
        drop(f);
        for p in pages {
            self.pages.write_all_at(p.bytes, p.index * ps as u64)?;
            self.write_entry(p.index, &p.entry)?;
        }
        self.sync_file(&self.pages)?;
        self.sync_file(&self.tree)?;
        self.write_meta(seq, a)?;
        self.clear_redo(log.len() as u64)
    }
}
