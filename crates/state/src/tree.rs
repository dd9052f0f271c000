//! The partition tree with copy-on-write checkpoints.
//!
//! Live state = the store's base pages, overlaid by the pages modified since the base (kept in
//! memory). The tree's entries describe the latest checkpoint. For each checkpoint `c` still
//! held, `copies[c]` keeps the pre-images of what changed after `c`: page bytes saved on the
//! first write after `c` (the copy-on-write bit is "already saved in the latest copy"), and
//! tree entries saved when the next checkpoint recomputes them. A value at checkpoint `c` is the
//! pre-image in the first copy at or after `c` that holds one, else the live value.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use redoubt_crypto::{Digest, DigestBuilder};

use crate::cache::{PageCache, DEFAULT_PAGE_CACHE_BYTES};
use crate::store::{Base, Entry, PageStore, StateCommit};
use crate::{Geometry, StateRead, StateWrite};

/// The digest a page entry gets when a check found its bytes do not match: it matches no
/// real digest, so the partitions above it differ from every correct replica's.
pub const INVALID: Digest = Digest([0xA5; 32]);

/// Digest of a page: its index, the checkpoint of its last modification and its bytes.
pub fn page_digest(index: u64, lm: u64, bytes: &[u8]) -> Digest {
    DigestBuilder::new("redoubt.page.v1")
        .u64(index)
        .u64(lm)
        .bytes(bytes)
        .finish()
}

/// Digest of a meta-data partition: its level and index, its lm and its children's entries
/// (lm and digest) in order, so a parent vouches for each child's lm as well as its digest.
/// See `docs/adr/0004-state.md` for why this hashes the children (a 256-ary Merkle node)
/// instead of summing them modulo a large integer as AdHash does.
pub fn meta_digest<'a>(
    level: u8,
    index: u64,
    lm: u64,
    children: impl Iterator<Item = &'a Entry>,
) -> Digest {
    let mut b = DigestBuilder::new("redoubt.meta.v2");
    b.u64(level as u64).u64(index).u64(lm);
    for e in children {
        b.u64(e.lm).digest(&e.digest);
    }
    b.finish()
}

/// A node name: (level, index). Level `depth` names pages.
pub type NodeId = (u8, u64);

#[derive(Clone, Debug, Default)]
struct Copy {
    aux: Arc<Vec<u8>>,
    root: Digest,
    pages: BTreeMap<u64, Arc<[u8]>>,
    nodes: BTreeMap<NodeId, Entry>,
}

/// What a state check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub pages_checked: u64,
    /// Pages whose bytes do not match their digest (now marked invalid).
    pub corrupt: Vec<u64>,
}

/// Sizes a host can export and a simulator can bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateFootprint {
    /// Pages held in memory because they were modified since the durable base.
    pub overlay_pages: usize,
    /// Checkpoints held.
    pub checkpoints: usize,
    /// Page pre-images held by checkpoint copies.
    pub copied_pages: usize,
    /// Tree entries held by checkpoint copies.
    pub copied_nodes: usize,
    /// Pages written since the last checkpoint.
    pub dirty_pages: usize,
    /// Pages known to be corrupt and not yet repaired.
    pub invalid_pages: usize,
}

/// The service state: pages, tree, checkpoints.
pub struct PagedState {
    geo: Geometry,
    store: Box<dyn PageStore>,
    /// `tree[level][index]`; `tree[depth]` holds the pages' entries.
    tree: Vec<Vec<Entry>>,
    overlay: BTreeMap<u64, Box<[u8]>>,
    base_seq: u64,
    copies: BTreeMap<u64, Copy>,
    /// Pages written by the service since the latest checkpoint.
    dirty: BTreeSet<u64>,
    /// Meta-data partitions whose entry must be recomputed.
    stale: BTreeSet<NodeId>,
    invalid: BTreeSet<u64>,
    /// While a tentative batch executes and until it is kept or undone: the pre-images of the
    /// pages it wrote (see [`PagedState::begin_tentative`]).
    undo: Option<Undo>,
    /// Copies of base pages recently read from the store (see [`crate::cache`]).
    cache: RefCell<PageCache>,
    /// Moves of the base the host has not yet written to the store, oldest first (see
    /// [`PagedState::take_commits`]); base pages are read from the newest that holds them.
    unsynced: Vec<Arc<StateCommit>>,
    /// How many of `unsynced` were handed to the host.
    handed: usize,
}

/// Pre-images of the pages written since [`PagedState::begin_tentative`].
#[derive(Default)]
struct Undo {
    pages: BTreeMap<u64, Box<[u8]>>,
    /// Pages that became dirty (first write since the latest checkpoint) under the mark.
    newly_dirty: BTreeSet<u64>,
}

fn io_fatal(what: &str, e: std::io::Error) -> ! {
    // The medium failed: continuing could act on state we cannot read or persist. The host
    // restarts the replica from its durable base.
    panic!("page store {what} failed: {e}")
}

/// The partition tree over `pages` (one entry per page), level 0 (the root) first.
fn build_tree(geo: Geometry, pages: Vec<Entry>) -> Vec<Vec<Entry>> {
    let depth = geo.depth();
    let mut tree: Vec<Vec<Entry>> = vec![Vec::new(); depth as usize + 1];
    tree[depth as usize] = pages;
    for level in (0..depth).rev() {
        let below = &tree[level as usize + 1];
        let row = (0..geo.nodes_at(level))
            .map(|i| {
                let kids = &below
                    [geo.children(level, i).start as usize..geo.children(level, i).end as usize];
                let lm = kids.iter().map(|e| e.lm).max().unwrap_or(0);
                Entry {
                    lm,
                    digest: meta_digest(level, i, lm, kids.iter()),
                }
            })
            .collect();
        tree[level as usize] = row;
    }
    tree
}

/// The root digest of a state of `geo` whose pages have `entries` (one per page, in order):
/// what [`PagedState::root`] gives for that state. `None` if the count is not the geometry's.
pub fn root_of(geo: Geometry, entries: Vec<Entry>) -> Option<Digest> {
    (entries.len() as u64 == geo.pages()).then(|| build_tree(geo, entries)[0][0].digest)
}

impl PagedState {
    /// Opens the state held by `store`: its durable base (checkpoint `seq` with `aux`), or, for
    /// a fresh store, all-zero pages at checkpoint 0 with `initial_aux` (made durable now).
    /// Pages are not checked here; see [`PagedState::check`].
    pub fn open(mut store: Box<dyn PageStore>, initial_aux: &[u8]) -> std::io::Result<PagedState> {
        let geo = store.geometry();
        let base = match store.base()? {
            Some(b) => b,
            None => {
                let zero = vec![0u8; geo.page_size()];
                let entries: Vec<Entry> = (0..geo.pages())
                    .map(|i| Entry {
                        lm: 0,
                        digest: page_digest(i, 0, &zero),
                    })
                    .collect();
                store.initialize(initial_aux, &entries)?;
                Base {
                    seq: 0,
                    aux: initial_aux.to_vec(),
                    entries,
                }
            }
        };
        if base.entries.len() as u64 != geo.pages() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "tree entries do not match the page count",
            ));
        }
        let tree = build_tree(geo, base.entries);
        let mut s = PagedState {
            geo,
            store,
            tree,
            overlay: BTreeMap::new(),
            base_seq: base.seq,
            copies: BTreeMap::new(),
            dirty: BTreeSet::new(),
            stale: BTreeSet::new(),
            invalid: BTreeSet::new(),
            undo: None,
            cache: RefCell::new(PageCache::new(
                DEFAULT_PAGE_CACHE_BYTES / geo.page_size().max(1),
            )),
            unsynced: Vec::new(),
            handed: 0,
        };
        let root = s.root();
        s.copies.insert(
            base.seq,
            Copy {
                aux: Arc::new(base.aux),
                root,
                ..Copy::default()
            },
        );
        Ok(s)
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Sets the budget of the cache of base pages read from the store (bytes; 0 turns it
    /// off). The default is [`DEFAULT_PAGE_CACHE_BYTES`].
    pub fn set_page_cache_bytes(&mut self, bytes: usize) {
        let pages = bytes / self.geo.page_size().max(1);
        self.cache.get_mut().set_capacity(pages);
    }

    /// Reads of base pages served by the page cache, and those that went to the store.
    pub fn page_cache_stats(&self) -> (u64, u64) {
        let c = self.cache.borrow();
        (c.hits, c.misses)
    }

    /// The latest checkpoint (the one the tree's entries describe).
    pub fn latest(&self) -> u64 {
        *self
            .copies
            .keys()
            .next_back()
            .expect("a checkpoint is always held")
    }

    /// The checkpoint the durable store holds.
    pub fn base_seq(&self) -> u64 {
        self.base_seq
    }

    /// Root digest of the latest checkpoint (after pending recomputation).
    pub fn root(&self) -> Digest {
        self.tree[0][0].digest
    }

    /// Checkpoints held, ascending.
    pub fn checkpoints(&self) -> Vec<u64> {
        self.copies.keys().copied().collect()
    }

    /// Root digest and auxiliary bytes of checkpoint `seq`, if held.
    pub fn held(&self, seq: u64) -> Option<(Digest, Arc<Vec<u8>>)> {
        self.copies.get(&seq).map(|c| (c.root, c.aux.clone()))
    }

    pub fn footprint(&self) -> StateFootprint {
        StateFootprint {
            overlay_pages: self.overlay.len(),
            checkpoints: self.copies.len(),
            copied_pages: self.copies.values().map(|c| c.pages.len()).sum(),
            copied_nodes: self.copies.values().map(|c| c.nodes.len()).sum(),
            dirty_pages: self.dirty.len(),
            invalid_pages: self.invalid.len(),
        }
    }

    /// True if the service wrote since the latest checkpoint.
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Pages found corrupt and not yet repaired.
    pub fn invalid_pages(&self) -> &BTreeSet<u64> {
        &self.invalid
    }

    /// True if any page is known corrupt: the state is not a valid checkpoint.
    pub fn needs_repair(&self) -> bool {
        !self.invalid.is_empty()
    }

    // ----- live pages ------------------------------------------------------------------------

    /// The live bytes of page `index`: the overlay's, else the base page (from the cache).
    fn read_live(&self, index: u64, buf: &mut [u8]) {
        match self.overlay.get(&index) {
            Some(p) => buf.copy_from_slice(p),
            None => self.with_base_page(index, |bytes| buf.copy_from_slice(bytes)),
        }
    }

    /// The bytes of base page `index` in a commit the host has not written yet.
    fn unsynced_page(&self, index: u64) -> Option<&[u8]> {
        self.unsynced.iter().rev().find_map(|c| c.page(index))
    }

    /// Runs `f` on base page `index`, read through the cache.
    fn with_base_page<R>(&self, index: u64, f: impl FnOnce(&[u8]) -> R) -> R {
        if let Some(bytes) = self.unsynced_page(index) {
            return f(bytes);
        }
        let mut cache = self.cache.borrow_mut();
        if let Some(bytes) = cache.get(index) {
            return f(bytes);
        }
        let mut page = vec![0u8; self.geo.page_size()].into_boxed_slice();
        if let Err(e) = self.store.read_page(index, &mut page) {
            io_fatal("read", e)
        }
        let r = f(&page);
        cache.insert(index, page);
        r
    }

    /// Like [`PagedState::read_live`] but a base page comes from the medium itself, not the
    /// cache: checks must see what the medium holds.
    fn read_medium(&self, index: u64, buf: &mut [u8]) {
        match self.overlay.get(&index) {
            Some(p) => buf.copy_from_slice(p),
            None => self.read_store(index, buf),
        }
    }

    /// The base page `index` as the store holds it (neither overlay nor cache), or as a commit
    /// the host is about to write holds it.
    fn read_store(&self, index: u64, buf: &mut [u8]) {
        if let Some(bytes) = self.unsynced_page(index) {
            buf.copy_from_slice(bytes);
            return;
        }
        if let Err(e) = self.store.read_page(index, buf) {
            io_fatal("read", e)
        }
    }

    /// Moves the base to checkpoint `seq` with `pages`: a commit for the host to write (the
    /// cache forgets the pages; until written they are read from the commit).
    fn store_commit(
        &mut self,
        seq: u64,
        aux: Arc<Vec<u8>>,
        pages: BTreeMap<u64, (Entry, Vec<u8>)>,
    ) {
        self.cache.get_mut().forget_all(pages.keys().copied());
        self.unsynced
            .push(Arc::new(StateCommit { seq, aux, pages }));
    }

    /// The moves of the durable base made since the last call, oldest first, for the host to
    /// write to its store in this order ([`StateCommit::apply`]) before it next calls into
    /// the state's owner. Until [`PagedState::commits_written`] the state reads their pages
    /// from them. Nothing here writes to the store: the host does.
    pub fn take_commits(&mut self) -> Vec<Arc<StateCommit>> {
        let new = self.unsynced[self.handed..].to_vec();
        self.handed = self.unsynced.len();
        new
    }

    /// The host wrote every commit [`PagedState::take_commits`] handed it.
    pub fn commits_written(&mut self) {
        self.unsynced.drain(..self.handed);
        self.handed = 0;
    }

    /// Commits made and not yet written by the host (handed or not).
    pub fn unsynced_commits(&self) -> usize {
        self.unsynced.len()
    }

    /// Writes the commits not yet handed out to the state's own store, for owners with no
    /// host loop (start-up replay, tests, the unreplicated baseline).
    pub fn write_commits(&mut self) -> std::io::Result<()> {
        for c in self.take_commits() {
            c.apply(self.store.as_mut())?;
        }
        self.commits_written();
        Ok(())
    }

    fn live_page(&self, index: u64) -> Vec<u8> {
        let mut buf = vec![0; self.geo.page_size()];
        self.read_live(index, &mut buf);
        buf
    }

    fn live_mut(&mut self, index: u64) -> &mut [u8] {
        if !self.overlay.contains_key(&index) {
            let page = self.live_page(index).into_boxed_slice();
            self.overlay.insert(index, page);
        }
        self.overlay.get_mut(&index).expect("just inserted")
    }

    fn latest_copy(&mut self) -> &mut Copy {
        self.copies
            .values_mut()
            .next_back()
            .expect("a checkpoint is always held")
    }

    /// Saves the page's bytes into the latest copy unless it already holds them.
    fn save_page(&mut self, index: u64) {
        let latest = self.latest();
        if self.copies[&latest].pages.contains_key(&index) {
            return;
        }
        let bytes: Arc<[u8]> = self.live_page(index).into();
        self.latest_copy().pages.insert(index, bytes);
    }

    /// Saves a tree entry into the latest copy unless it already holds one.
    fn save_node(&mut self, id: NodeId) {
        let e = self.tree[id.0 as usize][id.1 as usize];
        self.latest_copy().nodes.entry(id).or_insert(e);
    }

    fn set_node(&mut self, id: NodeId, e: Entry) {
        self.save_node(id);
        self.tree[id.0 as usize][id.1 as usize] = e;
        if id.0 > 0 {
            self.stale.insert((id.0 - 1, id.1 / self.geo.fanout()));
        }
    }

    /// Recomputes stale meta-data entries bottom-up.
    fn refresh(&mut self) {
        while let Some(&(level, index)) = self.stale.iter().next_back() {
            // Deepest first: iteration order is by level, so the last is the deepest.
            self.stale.remove(&(level, index));
            let kids = self.geo.children(level, index);
            let below = &self.tree[level as usize + 1][kids.start as usize..kids.end as usize];
            let lm = below.iter().map(|e| e.lm).max().unwrap_or(0);
            let digest = meta_digest(level, index, lm, below.iter());
            let e = Entry { lm, digest };
            if self.tree[level as usize][index as usize] != e {
                self.set_node((level, index), e);
            }
        }
    }

    // ----- checkpoints -----------------------------------------------------------------------

    /// Takes checkpoint `seq` (above the latest): pages written since the latest checkpoint get
    /// `lm = seq` and fresh digests, their ancestors are recomputed, and a new copy starts.
    /// Cost: proportional to the pages written (times the depth), not to the state size.
    /// Returns the root digest.
    pub fn checkpoint(&mut self, seq: u64, aux: Vec<u8>) -> Digest {
        assert!(
            seq > self.latest(),
            "checkpoints are taken in increasing order"
        );
        assert!(self.undo.is_none(), "no checkpoint of a tentative state");
        let depth = self.geo.depth();
        let dirty = std::mem::take(&mut self.dirty);
        let mut buf = vec![0u8; self.geo.page_size()];
        for p in dirty {
            self.read_live(p, &mut buf);
            let e = Entry {
                lm: seq,
                digest: page_digest(p, seq, &buf),
            };
            self.set_node((depth, p), e);
        }
        self.refresh();
        let root = self.root();
        self.copies.insert(
            seq,
            Copy {
                aux: Arc::new(aux),
                root,
                ..Copy::default()
            },
        );
        root
    }

    /// Discards the copies of checkpoints below `seq` (never above the base: those copies
    /// say which pages differ from the store).
    fn discard_below(&mut self, seq: u64) {
        let keep_from = seq.min(self.latest()).min(self.base_seq);
        self.copies = self.copies.split_off(&keep_from);
        self.prune_overlay();
    }

    /// Keeps in memory only pages modified after the base (the others equal the store's).
    fn prune_overlay(&mut self) {
        let base = self.base_seq;
        let mut keep: BTreeSet<u64> = self.dirty.clone();
        for c in self.copies.range(base..).map(|(_, c)| c) {
            keep.extend(c.pages.keys());
        }
        if keep.len() == self.overlay.len() {
            return;
        }
        self.overlay.retain(|p, _| keep.contains(p));
    }

    /// Makes checkpoint `seq` (held) the durable base and discards older copies. Writes only
    /// the pages modified between the old base and `seq`.
    pub fn commit_base(&mut self, seq: u64) {
        assert!(
            self.copies.contains_key(&seq),
            "checkpoint {seq} is not held"
        );
        if seq <= self.base_seq {
            self.discard_below(seq);
            return;
        }
        let changed: BTreeSet<u64> = self
            .copies
            .range(self.base_seq..seq)
            .flat_map(|(_, c)| {
                c.pages.keys().copied().chain(
                    c.nodes
                        .keys()
                        .filter(|(l, _)| *l == self.geo.depth())
                        .map(|(_, i)| *i),
                )
            })
            .collect();
        let pages: BTreeMap<u64, (Entry, Vec<u8>)> = changed
            .into_iter()
            .map(|p| (p, self.page_at(seq, p).expect("held")))
            .collect();
        let aux = self.copies[&seq].aux.clone();
        self.store_commit(seq, aux, pages);
        self.base_seq = seq;
        self.discard_below(seq);
    }

    // ----- tentative writes ------------------------------------------------------------------

    /// Marks the live state: the writes that follow (one tentatively executed batch) can be
    /// undone with [`PagedState::undo_tentative`] or kept with [`PagedState::keep_tentative`].
    /// No checkpoint may be taken while the mark is set.
    pub fn begin_tentative(&mut self) {
        assert!(self.undo.is_none(), "one tentative batch at a time");
        self.undo = Some(Undo::default());
    }

    /// Whether tentative writes are outstanding.
    pub fn is_tentative(&self) -> bool {
        self.undo.is_some()
    }

    /// Keeps the writes made since [`PagedState::begin_tentative`] (the batch committed).
    pub fn keep_tentative(&mut self) {
        self.undo = None;
    }

    /// Undoes the writes made since [`PagedState::begin_tentative`]; a no-op without a mark.
    /// Cost: proportional to the pages the tentative batch wrote.
    pub fn undo_tentative(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        for (p, bytes) in undo.pages {
            self.overlay.insert(p, bytes);
        }
        for p in undo.newly_dirty {
            // The page equals the latest checkpoint again: its saved pre-image is not needed.
            self.dirty.remove(&p);
            self.latest_copy().pages.remove(&p);
        }
        self.prune_overlay();
    }

    /// Rolls the live state back to the latest checkpoint (undoes the service's writes since).
    pub fn revert_to_latest(&mut self) {
        self.undo = None;
        let latest = self.latest();
        let dirty = std::mem::take(&mut self.dirty);
        for p in dirty {
            let saved = self
                .copies
                .get_mut(&latest)
                .and_then(|c| c.pages.remove(&p))
                .expect("a dirty page's pre-image is in the latest copy");
            self.overlay.insert(p, saved.to_vec().into_boxed_slice());
        }
        self.prune_overlay();
    }

    // ----- values at a checkpoint -----------------------------------------------------------

    /// The entry of node `id` at checkpoint `seq`, if held.
    pub fn node_at(&self, seq: u64, id: NodeId) -> Option<Entry> {
        if !self.copies.contains_key(&seq) || !self.geo.contains(id.0, id.1) {
            return None;
        }
        let saved = self
            .copies
            .range(seq..)
            .find_map(|(_, c)| c.nodes.get(&id).copied());
        Some(saved.unwrap_or(self.tree[id.0 as usize][id.1 as usize]))
    }

    /// The children of meta-data partition `id` at checkpoint `seq` modified after `lc` (all
    /// of them for `lc == 0`).
    pub fn children_at(&self, seq: u64, id: NodeId, lc: u64) -> Option<Vec<(u64, Entry)>> {
        if id.0 >= self.geo.depth() || !self.geo.contains(id.0, id.1) {
            return None;
        }
        self.copies.get(&seq)?;
        Some(
            self.geo
                .children(id.0, id.1)
                .map(|i| (i, self.node_at(seq, (id.0 + 1, i)).expect("held")))
                .filter(|(_, e)| lc == 0 || e.lm > lc)
                .collect(),
        )
    }

    /// A page's entry and bytes at checkpoint `seq`, if held.
    pub fn page_at(&self, seq: u64, index: u64) -> Option<(Entry, Vec<u8>)> {
        let e = self.node_at(seq, (self.geo.depth(), index))?;
        let saved = self
            .copies
            .range(seq..)
            .find_map(|(_, c)| c.pages.get(&index).cloned());
        let bytes = match saved {
            Some(b) => b.to_vec(),
            None => self.live_page(index),
        };
        Some((e, bytes))
    }

    /// Like [`PagedState::page_at`], but checks the bytes against the digest first; a page
    /// that fails is marked invalid and not returned (a replica never serves a page it cannot
    /// vouch for).
    pub fn verified_page_at(&mut self, seq: u64, index: u64) -> Option<(Entry, Vec<u8>)> {
        if self.invalid.contains(&index) {
            return None;
        }
        let (e, bytes) = self.page_at(seq, index)?;
        if page_digest(index, e.lm, &bytes) == e.digest {
            return Some((e, bytes));
        }
        self.mark_invalid(index);
        None
    }

    // ----- checking and installing ------------------------------------------------------------

    fn mark_invalid(&mut self, index: u64) {
        // A dirty page stays invalid after the next checkpoint recomputes its entry: its
        // bytes derive from corrupt ones.
        self.invalid.insert(index);
        let depth = self.geo.depth();
        let e = self.tree[depth as usize][index as usize];
        self.set_node(
            (depth, index),
            Entry {
                lm: e.lm,
                digest: INVALID,
            },
        );
        self.refresh();
    }

    /// Checks every page not written since the latest checkpoint against its digest; pages
    /// that fail are marked invalid (their entries get [`INVALID`], so a state transfer
    /// fetches them). Reads the whole state.
    pub fn check(&mut self) -> CheckReport {
        let depth = self.geo.depth() as usize;
        let mut report = CheckReport::default();
        let mut buf = vec![0u8; self.geo.page_size()];
        let latest = self.latest();
        for p in 0..self.geo.pages() {
            if self.invalid.contains(&p) {
                continue;
            }
            let e = self.tree[depth][p as usize];
            report.pages_checked += 1;
            if self.dirty.contains(&p) {
                // Written since the latest checkpoint: check the saved pre-image, which a
                // rollback would restore.
                let saved = &self.copies[&latest].pages[&p];
                let mut bad = page_digest(p, e.lm, saved) != e.digest;
                // The pre-image may have come from the cache. If the page did not change
                // between the base and the latest checkpoint, a rollback drops it from memory
                // and reads the store again, so the store must hold it too (simulator seed
                // 5250 with --all-optimizations: bytes flipped on the medium under a cached,
                // then dirty, page went unnoticed by a scrub and surfaced after a rollback).
                let base_version = !self
                    .copies
                    .range(self.base_seq..latest)
                    .any(|(_, c)| c.pages.contains_key(&p));
                if !bad && base_version {
                    self.read_store(p, &mut buf);
                    bad = page_digest(p, e.lm, &buf) != e.digest;
                }
                if bad {
                    report.corrupt.push(p);
                }
                continue;
            }
            self.read_medium(p, &mut buf);
            if page_digest(p, e.lm, &buf) != e.digest {
                report.corrupt.push(p);
            }
        }
        for p in &report.corrupt {
            self.mark_invalid(*p);
        }
        report
    }

    /// Checks the pages changed since the latest checkpoint (written, installed) that are not
    /// dirty against their current entries; mismatches are marked invalid. Returns how many
    /// failed. A transfer runs it before adopting what it installed.
    pub fn check_changed(&mut self) -> usize {
        let depth = self.geo.depth() as usize;
        let latest = self.latest();
        let changed: Vec<u64> = self.copies[&latest]
            .pages
            .keys()
            .copied()
            .filter(|p| !self.dirty.contains(p))
            .collect();
        let mut buf = vec![0u8; self.geo.page_size()];
        let mut bad = Vec::new();
        for p in changed {
            let e = self.tree[depth][p as usize];
            self.read_medium(p, &mut buf);
            if page_digest(p, e.lm, &buf) != e.digest {
                bad.push(p);
            }
        }
        for p in &bad {
            self.mark_invalid(*p);
        }
        bad.len()
    }

    /// Drops from the invalid set the pages whose live bytes match their (non-invalid) entry
    /// again (installed or rewritten to the right content). Returns how many remain.
    pub fn revalidate(&mut self) -> usize {
        let depth = self.geo.depth() as usize;
        let mut buf = vec![0u8; self.geo.page_size()];
        let invalid: Vec<u64> = self.invalid.iter().copied().collect();
        for p in invalid {
            if self.dirty.contains(&p) {
                continue;
            }
            let e = self.tree[depth][p as usize];
            self.read_medium(p, &mut buf);
            if e.digest != INVALID && page_digest(p, e.lm, &buf) == e.digest {
                self.invalid.remove(&p);
            }
        }
        self.invalid.len()
    }

    /// Like [`PagedState::check`] but changes nothing: the pages that do not match.
    pub fn verify(&self) -> Vec<u64> {
        let depth = self.geo.depth() as usize;
        let mut buf = vec![0u8; self.geo.page_size()];
        (0..self.geo.pages())
            .filter(|p| !self.dirty.contains(p))
            .filter(|p| {
                self.read_medium(*p, &mut buf);
                let e = self.tree[depth][*p as usize];
                page_digest(*p, e.lm, &buf) != e.digest
            })
            .collect()
    }

    /// The current entry of node `id` (the latest checkpoint's, plus installed pages).
    pub fn entry(&mut self, id: NodeId) -> Option<Entry> {
        if !self.geo.contains(id.0, id.1) {
            return None;
        }
        self.refresh();
        Some(self.tree[id.0 as usize][id.1 as usize])
    }

    /// Installs a fetched page (already verified against `entry`). The service must not have
    /// written since the latest checkpoint ([`PagedState::revert_to_latest`] first).
    pub fn install_page(&mut self, index: u64, entry: Entry, bytes: &[u8]) {
        assert!(self.dirty.is_empty(), "revert before installing pages");
        self.save_page(index);
        self.live_mut(index).copy_from_slice(bytes);
        self.set_node((self.geo.depth(), index), entry);
        self.invalid.remove(&index);
    }

    /// The root digest of the live pages as installed so far (pending entries recomputed).
    /// After a transfer the caller checks it against the digest it was fetching.
    pub fn installed_root(&mut self) -> Digest {
        self.refresh();
        self.root()
    }

    /// Forgets which checkpoint the live state is, when its label cannot be trusted (a page
    /// store whose base was rewritten): the live pages (after undoing uncheckpointed writes)
    /// become checkpoint `seq` with `aux`, the only one held and the durable base. Pages known
    /// invalid stay invalid. The caller fetches a vouched checkpoint over it before executing.
    pub fn relabel(&mut self, seq: u64, aux: Vec<u8>) -> Digest {
        self.revert_to_latest();
        let invalid = std::mem::take(&mut self.invalid);
        let root = self.adopt_installed(seq, aux);
        self.invalid = invalid;
        root
    }

    /// Ends a transfer: the live pages form checkpoint `seq` (the caller checked the root).
    /// It becomes the only checkpoint held and the durable base; every page modified since
    /// the old base is written to the store.
    pub fn adopt_installed(&mut self, seq: u64, aux: Vec<u8>) -> Digest {
        assert!(self.dirty.is_empty(), "revert before installing pages");
        assert!(
            self.invalid.is_empty(),
            "a transfer ends with every page repaired"
        );
        self.refresh();
        let depth = self.geo.depth();
        let changed: BTreeSet<u64> = self
            .copies
            .range(self.base_seq..)
            .flat_map(|(_, c)| {
                c.pages
                    .keys()
                    .copied()
                    .chain(c.nodes.keys().filter(|(l, _)| *l == depth).map(|(_, i)| *i))
            })
            .collect();
        let pages: BTreeMap<u64, (Entry, Vec<u8>)> = changed
            .into_iter()
            .map(|p| {
                (
                    p,
                    (self.tree[depth as usize][p as usize], self.live_page(p)),
                )
            })
            .collect();
        let aux = Arc::new(aux);
        self.store_commit(seq, aux.clone(), pages);
        let root = self.root();
        self.base_seq = seq;
        self.copies.clear();
        self.copies.insert(
            seq,
            Copy {
                aux,
                root,
                ..Copy::default()
            },
        );
        self.overlay.clear();
        root
    }
}

impl StateRead for PagedState {
    fn size(&self) -> u64 {
        self.geo.size()
    }

    fn read(&self, addr: u64, buf: &mut [u8]) {
        let ps = self.geo.page_size() as u64;
        assert!(
            addr.checked_add(buf.len() as u64)
                .is_some_and(|end| end <= self.geo.size()),
            "read beyond the state"
        );
        let mut done = 0usize;
        while done < buf.len() {
            let at = addr + done as u64;
            let (p, off) = (at / ps, (at % ps) as usize);
            let n = (ps as usize - off).min(buf.len() - done);
            let out = &mut buf[done..done + n];
            match self.overlay.get(&p) {
                Some(bytes) => out.copy_from_slice(&bytes[off..off + n]),
                None => self.with_base_page(p, |bytes| out.copy_from_slice(&bytes[off..off + n])),
            }
            done += n;
        }
    }
}

impl StateWrite for PagedState {
    fn write(&mut self, addr: u64, data: &[u8]) {
        let ps = self.geo.page_size() as u64;
        assert!(
            addr.checked_add(data.len() as u64)
                .is_some_and(|end| end <= self.geo.size()),
            "write beyond the state"
        );
        let mut done = 0usize;
        while done < data.len() {
            let at = addr + done as u64;
            let (p, off) = (at / ps, (at % ps) as usize);
            let n = (ps as usize - off).min(data.len() - done);
            if self
                .undo
                .as_ref()
                .is_some_and(|u| !u.pages.contains_key(&p))
            {
                let pre = self.live_page(p).into_boxed_slice();
                let newly_dirty = !self.dirty.contains(&p);
                let undo = self.undo.as_mut().expect("checked");
                undo.pages.insert(p, pre);
                if newly_dirty {
                    undo.newly_dirty.insert(p);
                }
            }
            // modify(): copy-on-write once per checkpoint interval, then mark dirty.
            if self.dirty.insert(p) {
                self.save_page(p);
            }
            self.live_mut(p)[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }
}
