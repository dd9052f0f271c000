//! Where pages live between checkpoints: the durable base.
//!
//! A [`PageStore`] holds the state as of one checkpoint (the *base*): every page's bytes,
//! every page's `(lm, digest)` entry, and the checkpoint's auxiliary bytes (the replica's
//! reply table). [`PageStore::commit`] moves the base to a later checkpoint atomically: after a
//! crash at any point, the store opens at either the old or the new base, never a mixture.
//! Pages modified after the base live in memory (see [`crate::PagedState`]), so memory is
//! proportional to the pages modified since the last stable checkpoint, not to the state.

use std::collections::BTreeMap;
use std::io;
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
pub(crate) const ENTRY_LEN: usize = 8 + DIGEST_LEN;

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
    /// Shared with the checkpoint's copy in the state (it can be megabytes).
    pub aux: Arc<Vec<u8>>,
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
