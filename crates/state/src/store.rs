//! Where pages live between checkpoints: the durable base.
//!
//! A [`PageStore`] holds the state as of one checkpoint (the *base*): every page's bytes,
//! every page's `(lm, digest)` entry, and the checkpoint's auxiliary bytes (the replica's
//! reply table). [`PageStore::commit`] moves the base to a later checkpoint atomically: after a
//! crash at any point, the store opens at either the old or the new base, never a mixture.
//! Pages modified after the base live in memory (see [`crate::PagedState`]), so memory is
//! proportional to the pages modified since the last stable checkpoint, not to the state.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use redoubt_crypto::{Digest, DIGEST_LEN};
use serde::{Deserialize, Serialize};

use crate::Geometry;

/// The tree tuple of a page or meta-data partition: the checkpoint of its last modification
/// and its digest (BFT-PR §4.6.2: `<lm, d>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub lm: u64,
    pub digest: Digest,
}

/// Bytes of one encoded [`Entry`] in the tree file.
const ENTRY_LEN: usize = 8 + DIGEST_LEN;

/// The durable base as read back.
#[derive(Clone, Debug)]
pub struct Base {
    pub seq: u64,
    pub aux: Vec<u8>,
    /// One entry per page.
    pub entries: Vec<Entry>,
}

/// One page of a commit.
#[derive(Clone, Copy, Debug)]
pub struct CommitPage<'a> {
    pub index: u64,
    pub entry: Entry,
    pub bytes: &'a [u8],
}

/// A move of the durable base to checkpoint `seq`, made by [`crate::PagedState`] and written
/// by its host ([`StateCommit::apply`]): the pages that differ from the previous base, with
/// their entries at `seq`. The state reads these pages from the commit until the host has
/// applied it (see [`crate::PagedState::take_commits`]).
#[derive(Debug, PartialEq, Eq)]
pub struct StateCommit {
    pub seq: u64,
    pub aux: Vec<u8>,
    pub pages: BTreeMap<u64, (Entry, Vec<u8>)>,
}

impl StateCommit {
    /// Writes the commit to `store` (atomically, as [`PageStore::commit`] does).
    pub fn apply(&self, store: &mut dyn PageStore) -> io::Result<()> {
        let pages: Vec<CommitPage<'_>> = self
            .pages
            .iter()
            .map(|(index, (entry, bytes))| CommitPage {
                index: *index,
                entry: *entry,
                bytes,
            })
            .collect();
        store.commit(self.seq, &self.aux, &pages)
    }

    /// The bytes of page `index` in this commit, if it holds it.
    pub fn page(&self, index: u64) -> Option<&[u8]> {
        self.pages.get(&index).map(|(_, b)| b.as_slice())
    }
}

/// Durable page storage. Errors are I/O failures of the medium; callers treat them as fatal
/// (a replica that cannot read or write its state stops and is restarted from its base).
pub trait PageStore: Send {
    fn geometry(&self) -> Geometry;
    /// The durable base, or `None` for a store never initialised (all pages zero).
    fn base(&mut self) -> io::Result<Option<Base>>;
    /// Makes a base of all-zero pages at checkpoint 0 with the given entries durable.
    fn initialize(&mut self, aux: &[u8], entries: &[Entry]) -> io::Result<()>;
    /// Reads page `index` of the base into `buf` (one page long).
    fn read_page(&self, index: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Atomically moves the base to checkpoint `seq`: `pages` are the pages that differ from
    /// the current base, with their entries at `seq`.
    fn commit(&mut self, seq: u64, aux: &[u8], pages: &[CommitPage<'_>]) -> io::Result<()>;
}

// ----- in memory ------------------------------------------------------------------------------

#[derive(Debug)]
struct MemInner {
    geo: Geometry,
    base: Option<(u64, Vec<u8>)>,
    entries: Vec<Entry>,
    pages: BTreeMap<u64, Vec<u8>>,
    commits: u64,
}

/// A store in memory, for the simulator and tests. Clones share the same storage (a
/// simulated disk that survives the replica object); everything committed is "durable".
#[derive(Clone, Debug)]
pub struct MemStore(Arc<Mutex<MemInner>>);

impl MemStore {
    pub fn new(geo: Geometry) -> MemStore {
        MemStore(Arc::new(Mutex::new(MemInner {
            geo,
            base: None,
            entries: Vec::new(),
            pages: BTreeMap::new(),
            commits: 0,
        })))
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, MemInner> {
        // A poisoned lock means a test already panicked; keep the data.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Overwrites bytes of a durable page without updating anything else: silent corruption
    /// of the medium, for fault injection.
    pub fn corrupt(&self, index: u64, offset: usize, bytes: &[u8]) {
        let mut g = self.inner();
        let ps = g.geo.page_size();
        let page = g.pages.entry(index).or_insert_with(|| vec![0; ps]);
        let end = (offset + bytes.len()).min(ps);
        let n = end.saturating_sub(offset);
        page[offset.min(ps)..end].copy_from_slice(&bytes[..n]);
    }

    /// Number of pages ever written (stored non-zero pages).
    pub fn stored_pages(&self) -> usize {
        self.inner().pages.len()
    }

    /// Number of commits so far.
    pub fn commits(&self) -> u64 {
        self.inner().commits
    }

    /// Forgets everything (a replica that lost its disk).
    pub fn wipe(&self) {
        let mut g = self.inner();
        g.base = None;
        g.entries.clear();
        g.pages.clear();
    }
}

impl PageStore for MemStore {
    fn geometry(&self) -> Geometry {
        self.inner().geo
    }

    fn base(&mut self) -> io::Result<Option<Base>> {
        let g = self.inner();
        Ok(g.base.as_ref().map(|(seq, aux)| Base {
            seq: *seq,
            aux: aux.clone(),
            entries: g.entries.clone(),
        }))
    }

    fn initialize(&mut self, aux: &[u8], entries: &[Entry]) -> io::Result<()> {
        let mut g = self.inner();
        g.base = Some((0, aux.to_vec()));
        g.entries = entries.to_vec();
        g.pages.clear();
        Ok(())
    }

    fn read_page(&self, index: u64, buf: &mut [u8]) -> io::Result<()> {
        let g = self.inner();
        match g.pages.get(&index) {
            Some(p) => buf.copy_from_slice(p),
            None => buf.fill(0),
        }
        Ok(())
    }

    fn commit(&mut self, seq: u64, aux: &[u8], pages: &[CommitPage<'_>]) -> io::Result<()> {
        let mut g = self.inner();
        for p in pages {
            g.entries[p.index as usize] = p.entry;
            g.pages.insert(p.index, p.bytes.to_vec());
        }
        g.base = Some((seq, aux.to_vec()));
        g.commits += 1;
        Ok(())
    }
}

// ----- on disk --------------------------------------------------------------------------------

const META_MAGIC: &[u8; 8] = b"RDSTATE1";
const REDO_MAGIC: &[u8; 8] = b"RDREDO01";

#[derive(Serialize, Deserialize)]
struct MetaFile {
    geometry: Geometry,
    seq: u64,
    aux: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct RedoHeader {
    seq: u64,
    aux: Vec<u8>,
    pages: u64,
}

/// A store in a directory: `pages.dat` (the page bytes), `tree.dat` (one entry per page),
/// `base.meta` (geometry, checkpoint, auxiliary bytes) and `redo.log` (a commit in progress).
///
/// A commit first writes the new pages, entries and base header to `redo.log` with a BLAKE3
/// checksum and syncs it, then applies them in place, syncs, replaces `base.meta` atomically
/// and empties the log. Opening a store replays a complete log and discards a torn one.
///
/// Clones share the open files: the state reads pages through one while its host writes
/// commits through another.
#[derive(Clone)]
pub struct FileStore {
    dir: PathBuf,
    geo: Geometry,
    pages: Arc<File>,
    tree: Arc<File>,
}

fn corrupt(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl FileStore {
    /// Opens (creating if needed) the store in `dir` with geometry `geo`. A store created with
    /// another geometry is refused. A complete commit left in the redo log is applied.
    pub fn open(dir: &Path, geo: Geometry) -> io::Result<FileStore> {
        std::fs::create_dir_all(dir)?;
        let open = |name: &str| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.join(name))
        };
        let pages = open("pages.dat")?;
        let tree = open("tree.dat")?;
        let mut s = FileStore {
            dir: dir.to_path_buf(),
            geo,
            pages: Arc::new(pages),
            tree: Arc::new(tree),
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
        s.clear_redo()?;
        sync_dir(dir)?;
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

    fn read_meta(&self) -> io::Result<Option<MetaFile>> {
        let bytes = match std::fs::read(self.dir.join("base.meta")) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if bytes.len() < META_MAGIC.len() + DIGEST_LEN || &bytes[..8] != META_MAGIC {
            return Err(corrupt("base.meta: bad magic"));
        }
        let (body, sum) = bytes[8..].split_at(bytes.len() - 8 - DIGEST_LEN);
        if Digest::of_parts("redoubt.state.meta.v1", &[body]).0[..] != sum[..] {
            return Err(corrupt("base.meta: checksum mismatch"));
        }
        postcard::from_bytes(body)
            .map(Some)
            .map_err(|e| corrupt(format!("base.meta: {e}")))
    }

    fn write_meta(&self, seq: u64, aux: &[u8]) -> io::Result<()> {
        let body = postcard::to_stdvec(&MetaFile {
            geometry: self.geo,
            seq,
            aux: aux.to_vec(),
        })
        .map_err(|e| corrupt(e.to_string()))?;
        let mut bytes = META_MAGIC.to_vec();
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&Digest::of_parts("redoubt.state.meta.v1", &[&body]).0);
        let tmp = self.dir.join("base.meta.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join("base.meta"))?;
        sync_dir(&self.dir)
    }

    fn write_entry(&self, index: u64, e: &Entry) -> io::Result<()> {
        let mut b = [0u8; ENTRY_LEN];
        b[..8].copy_from_slice(&e.lm.to_le_bytes());
        b[8..].copy_from_slice(&e.digest.0);
        self.tree.write_all_at(&b, index * ENTRY_LEN as u64)
    }

    /// Applies a complete redo log, or discards a torn one.
    fn replay_redo(&mut self) -> io::Result<()> {
        let path = self.dir.join("redo.log");
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let Some((seq, aux, pages)) = parse_redo(&bytes, self.geo) else {
            // Torn while being written: the base is still the previous one.
            return self.clear_redo();
        };
        for (index, entry, data) in &pages {
            self.pages
                .write_all_at(data, index * self.geo.page_size() as u64)?;
            self.write_entry(*index, entry)?;
        }
        self.pages.sync_all()?;
        self.tree.sync_all()?;
        self.write_meta(seq, &aux)?;
        self.clear_redo()
    }

    fn clear_redo(&self) -> io::Result<()> {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.dir.join("redo.log"))?;
        f.sync_all()
    }
}

type RedoPages<'a> = Vec<(u64, Entry, &'a [u8])>;

fn parse_redo(bytes: &[u8], geo: Geometry) -> Option<(u64, Vec<u8>, RedoPages<'_>)> {
    if bytes.len() < 8 + DIGEST_LEN || &bytes[..8] != REDO_MAGIC {
        return None;
    }
    let (body, sum) = bytes[8..].split_at(bytes.len() - 8 - DIGEST_LEN);
    if Digest::of_parts("redoubt.state.redo.v1", &[body]).0[..] != sum[..] {
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
    rest.is_empty().then_some((h.seq, h.aux, pages))
}

impl PageStore for FileStore {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn base(&mut self) -> io::Result<Option<Base>> {
        let Some(meta) = self.read_meta()? else {
            return Ok(None);
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
            aux: meta.aux,
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
        self.write_meta(0, aux)
    }

    fn read_page(&self, index: u64, buf: &mut [u8]) -> io::Result<()> {
        self.pages
            .read_exact_at(buf, index * self.geo.page_size() as u64)
    }

    fn commit(&mut self, seq: u64, aux: &[u8], pages: &[CommitPage<'_>]) -> io::Result<()> {
        let header = postcard::to_stdvec(&RedoHeader {
            seq,
            aux: aux.to_vec(),
            pages: pages.len() as u64,
        })
        .map_err(|e| corrupt(e.to_string()))?;
        let ps = self.geo.page_size();
        let mut body = Vec::with_capacity(header.len() + pages.len() * (8 + ENTRY_LEN + ps));
        body.extend_from_slice(&header);
        for p in pages {
            body.extend_from_slice(&p.index.to_le_bytes());
            body.extend_from_slice(&p.entry.lm.to_le_bytes());
            body.extend_from_slice(&p.entry.digest.0);
            body.extend_from_slice(p.bytes);
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.dir.join("redo.log"))?;
        f.write_all(REDO_MAGIC)?;
        f.write_all(&body)?;
        f.write_all(&Digest::of_parts("redoubt.state.redo.v1", &[&body]).0)?;
        f.sync_all()?;
        drop(f);
        for p in pages {
            self.pages.write_all_at(p.bytes, p.index * ps as u64)?;
            self.write_entry(p.index, &p.entry)?;
        }
        self.pages.sync_all()?;
        self.tree.sync_all()?;
        self.write_meta(seq, aux)?;
        self.clear_redo()
    }
}

impl FileStore {
    /// Overwrites bytes of a page on disk without updating anything else: silent corruption,
    /// for tests and fault drills.
    pub fn corrupt_page(&self, index: u64, offset: usize, bytes: &[u8]) -> io::Result<()> {
        let at = index * self.geo.page_size() as u64 + offset as u64;
        self.pages.write_all_at(bytes, at)?;
        self.pages.sync_all()
    }
}
