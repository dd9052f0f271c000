//! A key-value store whose entire persistent content lives in a flat byte range
//! ([`StateRead`] / [`StateWrite`]) that the library lays over 4 KiB pages.
//!
//! Every write is tracked, digested and transferred page by page, so the store keeps writes
//! small and local, and it keeps *nothing* persistent only in memory: [`PagedKv`] holds a
//! derived index that [`PagedKv::load`] rebuilds from the bytes alone. The index rebuilt by
//! `load` is equal (field by field) to the one maintained incrementally, and every decision
//! (allocation, placement, what to write) is a function of that index, the current bytes and
//! the call arguments only. Replicas that apply the same calls to the same bytes therefore
//! write the same bytes, whether or not they restarted (or fetched the state) in between.
//!
//! # Layout
//!
//! The range is cut into 64-byte *granules* (`size / 64` of them; trailing bytes of a size
//! that is not a multiple of 64 are never used). The granules are tiled by *blocks*; each block
//! begins at a granule boundary with a 16-byte header (all integers little-endian):
//!
//! | block        | header                                                                  | length (granules)          |
//! |--------------|-------------------------------------------------------------------------|----------------------------|
//! | zero         | 16 zero bytes                                                           | 1                          |
//! | free         | magic `"PKVf"` u32, check u32, length u64                               | the stored length (≥ 1)    |
//! | record       | magic `"PKVr"` u32, key_len u16, flags u16 (= 0), value_len u32, check u32 | ⌈(16 + key_len + value_len) / 64⌉ |
//!
//! A record's key follows its header, then its value; the rest of its last granule is padding.
//! `check` is a hash of the other header fields, so random bytes are rejected as headers.
//! Only block headers are ever interpreted: the bytes after a header, up to the block's end,
//! are key/value data (records) or stale leftovers (free blocks). A pristine all-zero state is
//! a tiling of zero blocks, i.e. an empty store.
//!
//! Because free blocks carry their own length, a deleted record's bytes (which may contain
//! anything, including what looks like valid headers at every granule boundary) are never
//! parsed again. Freeing a record therefore costs a single 16-byte write (a free header over
//! its record header), on the record's first page, instead of zeroing a header in every
//! granule (which would touch every page of a large value).
//!
//! # Index
//!
//! * `index`: key → extent (first granule, granule count, value length). Keys are kept in
//!   memory, values never (they are read from the state on `get` / `scan`).
//! * Free space as *maximal* runs of free granules, by start and by `(length, start)`. Adjacent
//!   free blocks in the bytes are merged into one run; the block structure inside a run does
//!   not matter to any decision, so the index never needs to know it.
//!
//! `load` walks the blocks from granule 0 (reading 64 KiB page-aligned chunks, not a read per
//! granule): it validates each header, records each record, merges free blocks into runs, and
//! rejects bad magic, bad check, non-zero flags, zero-length free blocks, blocks running past
//! the end and duplicate keys with `Err`. Every step advances by at least one granule, so it
//! always terminates, and it never panics on any bytes. Any bytes `load` accepts form a
//! consistent store.
//!
//! # Operations and what they write
//!
//! * **Allocation** (new key, or relocation): best fit — the smallest free run that is large
//!   enough, lowest start among equal lengths — carved from the run's start. The record is
//!   written with one write, and the rest of the run (if any) gets a free header right after
//!   the record (usually on the record's last page).
//! * **Update** of an existing key, in order of preference:
//!   1. the new record needs no more granules than the old: rewrite in place, writing only the
//!      bytes that differ from the old record (page by page, the span from the first to the
//!      last differing byte), and free the surplus tail granules (one free header);
//!   2. the free run right after the record is big enough for the growth: grow in place (diff
//!      write of the old part, plain write of the new part, free header after);
//!   3. otherwise relocate, to whichever is the better fit (smaller `(length, start)`) of the
//!      best-fit free run and the run formed by the free run just before the record + the
//!      record's own granules + the free run just after it (the new record is then written
//!      over its old location from that run's start). In the former case the old extent is
//!      freed afterwards.
//!
//!   Only if no placement exists even counting the record's own space does `put` return
//!   [`PagedKvError::Full`]; the state is then unchanged.
//! * **Delete**: one 16-byte free header at the record's start.
//! * `get` / `scan`: one read per value.
//!
//! Keys longer than `u16::MAX` bytes or values longer than `u32::MAX` bytes cannot be
//! represented and are rejected with [`PagedKvError::Full`] (the service layer enforces far
//! smaller limits anyway).
//!
//! The store must always be used with the state it was loaded from (same size); it does not
//! own the state because the library hands out access per operation.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use redoubt_state::{StateRead, StateWrite};

/// Allocation unit, in bytes.
const GRANULE: u64 = 64;
/// Size of a block header, in bytes.
const HEADER: usize = 16;
/// Page size of the underlying state (only used to split diff writes at page boundaries).
const PAGE: u64 = 4096;
/// Bytes read at a time by [`PagedKv::load`].
const LOAD_CHUNK: u64 = 64 * 1024;
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"PKVr");
const FREE_MAGIC: u32 = u32::from_le_bytes(*b"PKVf");

/// Why a [`PagedKv::put`] failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PagedKvError {
    /// No free run is large enough for the record (the state is unchanged).
    #[error(
        "store full: need {need} contiguous bytes, largest usable free run is {largest_free} bytes"
    )]
    Full { need: u64, largest_free: u64 },
}

/// Where a record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    /// First granule.
    start: u64,
    /// Number of granules.
    granules: u64,
    value_len: u32,
}

/// The in-memory index of a key-value store kept in a flat state; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagedKv {
    /// Number of granules in the state.
    granules: u64,
    index: BTreeMap<Vec<u8>, Extent>,
    /// Maximal free runs: start → length (granules).
    free_by_start: BTreeMap<u64, u64>,
    /// The same runs as `(length, start)`, for best fit.
    free_by_len: BTreeSet<(u64, u64)>,
    /// Total granules in free runs.
    free_granules: u64,
}

/// A parsed block header.
enum Block {
    Zero,
    Free(u64),
    Record { key_len: u16, value_len: u32 },
}

/// A 32-bit hash of header fields (splitmix64 finaliser).
fn check(magic: u32, fields: u64) -> u32 {
    let mut x = fields ^ (u64::from(magic) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x as u32
}

fn record_fields(key_len: u16, value_len: u32) -> u64 {
    (u64::from(key_len) << 32) | u64::from(value_len)
}

fn record_header(key_len: u16, value_len: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&key_len.to_le_bytes());
    // h[6..8]: flags, zero.
    h[8..12].copy_from_slice(&value_len.to_le_bytes());
    let c = check(RECORD_MAGIC, record_fields(key_len, value_len));
    h[12..16].copy_from_slice(&c.to_le_bytes());
    h
}

fn free_header(len: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..4].copy_from_slice(&FREE_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&check(FREE_MAGIC, len).to_le_bytes());
    h[8..16].copy_from_slice(&len.to_le_bytes());
    h
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Parses the 16-byte header `h`.
fn parse_block(h: &[u8]) -> Result<Block, String> {
    if h.iter().all(|&b| b == 0) {
        return Ok(Block::Zero);
    }
    match le_u32(&h[0..4]) {
        RECORD_MAGIC => {
            let key_len = le_u16(&h[4..6]);
            let flags = le_u16(&h[6..8]);
            let value_len = le_u32(&h[8..12]);
            if flags != 0 {
                return Err(format!("record header with flags {flags:#06x}"));
            }
            if le_u32(&h[12..16]) != check(RECORD_MAGIC, record_fields(key_len, value_len)) {
                return Err("record header check mismatch".into());
            }
            Ok(Block::Record { key_len, value_len })
        }
        FREE_MAGIC => {
            let len = le_u64(&h[8..16]);
            if le_u32(&h[4..8]) != check(FREE_MAGIC, len) {
                return Err("free header check mismatch".into());
            }
            if len == 0 {
                return Err("free block of length 0".into());
            }
            Ok(Block::Free(len))
        }
        magic => Err(format!("bad block magic {magic:#010x}")),
    }
}

/// Granules taken by a record (header + key + value).
fn record_granules(key_len: u64, value_len: u64) -> u64 {
    (HEADER as u64)
        .saturating_add(key_len)
        .saturating_add(value_len)
        .div_ceil(GRANULE)
}

/// Header + key + value. The lengths must fit the header fields (checked by the caller).
fn record_image(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut img = Vec::with_capacity(HEADER + key.len() + value.len());
    img.extend_from_slice(&record_header(key.len() as u16, value.len() as u32));
    img.extend_from_slice(key);
    img.extend_from_slice(value);
    img
}

/// Byte address of granule `g`.
fn addr(g: u64) -> u64 {
    g * GRANULE
}

/// Writes `new` at `at`, where the state currently holds `old[..]` at `at` (for the common
/// prefix of the two): within each page only the span from the first to the last differing
/// byte is written, pages without differences not at all; bytes of `new` beyond `old` are
/// written unconditionally.
fn write_diff(state: &mut dyn StateWrite, at: u64, old: &[u8], new: &[u8]) {
    let common = old.len().min(new.len());
    let mut off = 0usize;
    while off < common {
        let page_end = ((at + off as u64) / PAGE + 1) * PAGE;
        let seg_end = ((page_end - at) as usize).min(common);
        let (o, n) = (&old[off..seg_end], &new[off..seg_end]);
        if let Some((first, last)) = differing_span(o, n) {
            state.write(at + (off + first) as u64, &n[first..=last]);
        }
        off = seg_end;
    }
    if new.len() > common {
        state.write(at + common as u64, &new[common..]);
    }
}

/// The first and last index at which `a` and `b` (of equal length) differ, or `None` if they
/// are equal. Compares 64-byte blocks as slices (vectorized `memcmp`) and only the differing
/// end blocks byte by byte.
fn differing_span(a: &[u8], b: &[u8]) -> Option<(usize, usize)> {
    const BLOCK: usize = 64;
    debug_assert_eq!(a.len(), b.len());
    if a == b {
        return None;
    }
    let blocks = a.len().div_ceil(BLOCK);
    let block = |i: usize| i * BLOCK..((i + 1) * BLOCK).min(a.len());
    let differs = |i: usize| a[block(i)] != b[block(i)];
    let fb = (0..blocks).find(|&i| differs(i))?;
    let lb = (fb..blocks).rev().find(|&i| differs(i)).unwrap_or(fb);
    let first = block(fb).find(|&j| a[j] != b[j])?;
    let last = block(lb).rev().find(|&j| a[j] != b[j])?;
    Some((first, last))
}

/// Sequential reader for [`PagedKv::load`]: serves small reads from page-aligned chunks.
struct ChunkReader<'a> {
    state: &'a dyn StateRead,
    size: u64,
    base: u64,
    buf: Vec<u8>,
}

impl<'a> ChunkReader<'a> {
    fn new(state: &'a dyn StateRead) -> ChunkReader<'a> {
        ChunkReader {
            state,
            size: state.size(),
            base: 0,
            buf: Vec::new(),
        }
    }

    /// `len` bytes at `at`; `at + len` must not exceed the state size.
    fn slice(&mut self, at: u64, len: usize) -> &[u8] {
        let end = at + len as u64;
        if at < self.base || end > self.base + self.buf.len() as u64 {
            let base = at - at % PAGE;
            let want = (end - base).max(LOAD_CHUNK).min(self.size - base);
            self.buf.resize(want as usize, 0);
            self.state.read(base, &mut self.buf);
            self.base = base;
        }
        let off = (at - self.base) as usize;
        &self.buf[off..off + len]
    }
}

/// Where an update that cannot stay in place goes.
enum Placement {
    /// A free run elsewhere, starting at this granule.
    Elsewhere(u64),
    /// The run made of the free run before the record (start, length), the record and the
    /// free run after it.
    Around(u64, u64),
}

impl PagedKv {
    fn empty(granules: u64) -> PagedKv {
        PagedKv {
            granules,
            index: BTreeMap::new(),
            free_by_start: BTreeMap::new(),
            free_by_len: BTreeSet::new(),
            free_granules: 0,
        }
    }

    /// Rebuilds the in-memory index from the bytes. An all-zero state is an empty store.
    ///
    /// Corrupt bytes yield `Err` (never a panic; the walk always terminates).
    pub fn load(state: &dyn StateRead) -> Result<PagedKv, String> {
        let granules = state.size() / GRANULE;
        let mut kv = PagedKv::empty(granules);
        let mut reader = ChunkReader::new(state);
        let mut run: Option<(u64, u64)> = None;
        let mut g = 0u64;
        while g < granules {
            let block = parse_block(reader.slice(addr(g), HEADER))
                .map_err(|e| format!("granule {g}: {e}"))?;
            match block {
                Block::Zero | Block::Free(_) => {
                    let len = match block {
                        Block::Free(len) => len,
                        _ => 1,
                    };
                    if len > granules - g {
                        return Err(format!(
                            "granule {g}: free block of {len} granules runs past the end ({granules})"
                        ));
                    }
                    run = Some(match run {
                        Some((s, l)) => (s, l + len),
                        None => (g, len),
                    });
                    g += len;
                }
                Block::Record { key_len, value_len } => {
                    let n = record_granules(u64::from(key_len), u64::from(value_len));
                    if n > granules - g {
                        return Err(format!(
                            "granule {g}: record of {n} granules runs past the end ({granules})"
                        ));
                    }
                    if let Some((s, l)) = run.take() {
                        kv.insert_run(s, l);
                        kv.free_granules += l;
                    }
                    let key = reader
                        .slice(addr(g) + HEADER as u64, usize::from(key_len))
                        .to_vec();
                    let extent = Extent {
                        start: g,
                        granules: n,
                        value_len,
                    };
                    if kv.index.insert(key, extent).is_some() {
                        return Err(format!("granule {g}: duplicate key"));
                    }
                    g += n;
                }
            }
        }
        if let Some((s, l)) = run {
            kv.insert_run(s, l);
            kv.free_granules += l;
        }
        Ok(kv)
    }

    /// The value of `key`, if present.
    pub fn get(&self, state: &dyn StateRead, key: &[u8]) -> Option<Vec<u8>> {
        let e = self.index.get(key)?;
        Some(read_value(state, key.len(), e))
    }

    /// Sets `key` to `value` and returns the previous value.
    ///
    /// `Err(PagedKvError::Full { .. })` if there is no room; the state is then unchanged.
    pub fn put(
        &mut self,
        state: &mut dyn StateWrite,
        key: &[u8],
        value: &[u8],
    ) -> Result<Option<Vec<u8>>, PagedKvError> {
        let need = record_granules(key.len() as u64, value.len() as u64);
        if u16::try_from(key.len()).is_err() || u32::try_from(value.len()).is_err() {
            return Err(self.full(need, self.largest_free()));
        }
        let image = record_image(key, value);
        let new_extent = |start| Extent {
            start,
            granules: need,
            value_len: value.len() as u32,
        };

        let Some(old) = self.index.get(key).copied() else {
            let (_, start) = self
                .best_fit(need)
                .ok_or_else(|| self.full(need, self.largest_free()))?;
            self.take(state, start, need);
            state.write(addr(start), &image);
            self.index.insert(key.to_vec(), new_extent(start));
            return Ok(None);
        };

        let old_value = read_value(state, key.len(), &old);
        let after = old.start + old.granules;
        let next_len = self.free_by_start.get(&after).copied().unwrap_or(0);
        let start = if need <= old.granules {
            // Same size or shrinking: in place, then free the surplus tail.
            write_diff(
                state,
                addr(old.start),
                &record_image(key, &old_value),
                &image,
            );
            if need < old.granules {
                self.release(state, old.start + need, old.granules - need);
            }
            old.start
        } else if next_len >= need - old.granules {
            // Growing into the free run that follows.
            self.take(state, after, need - old.granules);
            write_diff(
                state,
                addr(old.start),
                &record_image(key, &old_value),
                &image,
            );
            old.start
        } else {
            let prev = self.run_ending_at(old.start);
            let around_len = prev.map_or(0, |(_, l)| l) + old.granules + next_len;
            let elsewhere = self.best_fit(need);
            let around = prev
                .filter(|_| around_len >= need)
                .map(|(s, _)| (around_len, s));
            let placement = match (elsewhere, around) {
                (Some(e), Some(a)) if a < e => Placement::Around(a.1, around_len),
                (Some((_, s)), _) => Placement::Elsewhere(s),
                (None, Some((_, s))) => Placement::Around(s, around_len),
                (None, None) => {
                    return Err(self.full(need, self.largest_free().max(around_len)));
                }
            };
            match placement {
                Placement::Elsewhere(s) => {
                    self.take(state, s, need);
                    state.write(addr(s), &image);
                    self.release(state, old.start, old.granules);
                    s
                }
                Placement::Around(s, total) => {
                    let prev_len = self.remove_run(s);
                    if next_len > 0 {
                        self.remove_run(after);
                    }
                    self.free_granules -= prev_len + next_len;
                    state.write(addr(s), &image);
                    let rest = total - need;
                    if rest > 0 {
                        // Not adjacent to another run: the old runs were maximal.
                        state.write(addr(s + need), &free_header(rest));
                        self.insert_run(s + need, rest);
                        self.free_granules += rest;
                    }
                    s
                }
            }
        };
        if let Some(e) = self.index.get_mut(key) {
            *e = new_extent(start);
        }
        Ok(Some(old_value))
    }

    /// Removes `key` and returns its value, if present.
    pub fn delete(&mut self, state: &mut dyn StateWrite, key: &[u8]) -> Option<Vec<u8>> {
        let e = self.index.remove(key)?;
        let value = read_value(state, key.len(), &e);
        self.release(state, e.start, e.granules);
        Some(value)
    }

    /// Keys in `[start, end)` in ascending order (`end` None = unbounded), at most `limit`
    /// pairs.
    pub fn scan(
        &self,
        state: &dyn StateRead,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let hi = match end {
            Some(e) if e <= start => return Vec::new(),
            Some(e) => Bound::Excluded(e),
            None => Bound::Unbounded,
        };
        self.index
            .range::<[u8], _>((Bound::Included(start), hi))
            .take(limit)
            .map(|(k, e)| (k.clone(), read_value(state, k.len(), e)))
            .collect()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Bytes of the state occupied by records (whole granules, headers and padding included).
    pub fn used_bytes(&self) -> u64 {
        (self.granules - self.free_granules) * GRANULE
    }

    /// Bytes of the state in free granules (not necessarily contiguous).
    pub fn free_bytes(&self) -> u64 {
        self.free_granules * GRANULE
    }

    fn full(&self, need: u64, largest: u64) -> PagedKvError {
        PagedKvError::Full {
            need: need.saturating_mul(GRANULE),
            largest_free: largest * GRANULE,
        }
    }

    /// Length of the largest free run, in granules.
    fn largest_free(&self) -> u64 {
        self.free_by_len.last().map_or(0, |&(l, _)| l)
    }

    /// The smallest free run of at least `n` granules (lowest start among equals), as
    /// `(length, start)`.
    fn best_fit(&self, n: u64) -> Option<(u64, u64)> {
        self.free_by_len.range((n, 0)..).next().copied()
    }

    /// The free run that ends right before granule `g`, as `(start, length)`.
    fn run_ending_at(&self, g: u64) -> Option<(u64, u64)> {
        self.free_by_start
            .range(..g)
            .next_back()
            .filter(|&(&s, &l)| s + l == g)
            .map(|(&s, &l)| (s, l))
    }

    fn insert_run(&mut self, start: u64, len: u64) {
        self.free_by_start.insert(start, len);
        self.free_by_len.insert((len, start));
    }

    /// Removes the run starting at `start` from the run sets (not from `free_granules`) and
    /// returns its length (0 if there is none).
    fn remove_run(&mut self, start: u64) -> u64 {
        match self.free_by_start.remove(&start) {
            Some(len) => {
                self.free_by_len.remove(&(len, start));
                len
            }
            None => 0,
        }
    }

    /// Allocates the first `n` granules of the free run starting at `start` (which must exist
    /// and hold at least `n` granules); the rest of the run gets a free header.
    fn take(&mut self, state: &mut dyn StateWrite, start: u64, n: u64) {
        let len = self.remove_run(start);
        debug_assert!(len >= n, "take {n} from run of {len}");
        self.free_granules -= n;
        if len > n {
            state.write(addr(start + n), &free_header(len - n));
            self.insert_run(start + n, len - n);
        }
    }

    /// Frees `len` granules at `start` (currently a record, or the tail of one): one free
    /// header, then merging with the neighbouring runs in memory.
    fn release(&mut self, state: &mut dyn StateWrite, start: u64, len: u64) {
        state.write(addr(start), &free_header(len));
        self.free_granules += len;
        let (mut s, mut l) = (start, len);
        if let Some((ps, pl)) = self.run_ending_at(start) {
            self.remove_run(ps);
            s = ps;
            l += pl;
        }
        l += self.remove_run(start + len);
        self.insert_run(s, l);
    }
}

/// Reads the value of the record `e` whose key has `key_len` bytes.
fn read_value(state: &dyn StateRead, key_len: usize, e: &Extent) -> Vec<u8> {
    let mut v = vec![0u8; e.value_len as usize];
    state.read(addr(e.start) + (HEADER + key_len) as u64, &mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use redoubt_state::FlatState;

    /// `differing_span` agrees with a byte-by-byte search on random buffers of every length
    /// around the block size, with differences anywhere (including none, first and last byte).
    #[test]
    fn differing_span_matches_bytewise_search() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for len in (0..300).chain([4096, 4095, 4097]) {
            for _ in 0..20 {
                let a: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let mut b = a.clone();
                for _ in 0..rng.random_range(0..4usize) {
                    if len > 0 {
                        let i = rng.random_range(0..len);
                        b[i] = b[i].wrapping_add(rng.random_range(1..=255u8));
                    }
                }
                let first = a.iter().zip(&b).position(|(x, y)| x != y);
                let last = a.iter().zip(&b).rposition(|(x, y)| x != y);
                assert_eq!(differing_span(&a, &b), first.zip(last), "len {len}");
            }
        }
    }

    /// A [`FlatState`] that records which pages were written and how many bytes.
    #[derive(Clone)]
    struct Tracked {
        inner: FlatState,
        pages: BTreeSet<u64>,
        writes: usize,
        bytes: usize,
    }

    impl Tracked {
        fn new(size: u64) -> Tracked {
            Tracked {
                inner: FlatState::new(size),
                pages: BTreeSet::new(),
                writes: 0,
                bytes: 0,
            }
        }

        fn reset(&mut self) {
            self.pages.clear();
            self.writes = 0;
            self.bytes = 0;
        }
    }

    impl StateRead for Tracked {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read(&self, at: u64, buf: &mut [u8]) {
            self.inner.read(at, buf)
        }
    }

    impl StateWrite for Tracked {
        fn write(&mut self, at: u64, data: &[u8]) {
            if !data.is_empty() {
                let last = at + data.len() as u64 - 1;
                self.pages.extend(at / PAGE..=last / PAGE);
            }
            self.writes += 1;
            self.bytes += data.len();
            self.inner.write(at, data)
        }
    }

    /// Structural invariants of the index.
    fn check_invariants(kv: &PagedKv) {
        let mut spans: Vec<(u64, u64, bool)> = kv
            .index
            .iter()
            .map(|(k, e)| {
                assert_eq!(
                    e.granules,
                    record_granules(k.len() as u64, u64::from(e.value_len))
                );
                (e.start, e.granules, false)
            })
            .collect();
        spans.extend(kv.free_by_start.iter().map(|(&s, &l)| (s, l, true)));
        spans.sort();
        let mut g = 0;
        let mut prev_free = false;
        let mut free = 0;
        for (s, l, is_free) in spans {
            assert_eq!(s, g, "gap or overlap at granule {g}");
            assert!(l > 0);
            assert!(!(prev_free && is_free), "free runs not maximal at {s}");
            if is_free {
                assert!(kv.free_by_len.contains(&(l, s)));
                free += l;
            }
            prev_free = is_free;
            g = s + l;
        }
        assert_eq!(g, kv.granules);
        assert_eq!(free, kv.free_granules);
        assert_eq!(kv.free_by_len.len(), kv.free_by_start.len());
        assert_eq!(kv.used_bytes() + kv.free_bytes(), kv.granules * GRANULE);
    }

    fn full_err(r: Result<Option<Vec<u8>>, PagedKvError>) -> (u64, u64) {
        match r {
            Err(PagedKvError::Full { need, largest_free }) => (need, largest_free),
            Ok(v) => panic!("expected Full, got Ok({v:?})"),
        }
    }

    #[test]
    fn empty_state_is_empty_store() {
        let st = FlatState::new(64 * 1024);
        let kv = PagedKv::load(&st).unwrap();
        assert!(kv.is_empty());
        assert_eq!(kv.len(), 0);
        assert_eq!(kv.used_bytes(), 0);
        assert_eq!(kv.free_bytes(), 64 * 1024);
        assert_eq!(kv.get(&st, b"x"), None);
        assert!(kv.scan(&st, b"", None, 10).is_empty());
        check_invariants(&kv);
    }

    #[test]
    fn put_get_delete() {
        let mut st = FlatState::new(64 * 1024);
        let mut kv = PagedKv::load(&st).unwrap();
        assert_eq!(kv.put(&mut st, b"a", b"1").unwrap(), None);
        assert_eq!(kv.put(&mut st, b"b", b"22").unwrap(), None);
        assert_eq!(kv.put(&mut st, b"", b"empty key").unwrap(), None);
        assert_eq!(kv.put(&mut st, b"e", b"").unwrap(), None);
        assert_eq!(kv.len(), 4);
        assert_eq!(kv.get(&st, b"a"), Some(b"1".to_vec()));
        assert_eq!(kv.get(&st, b"b"), Some(b"22".to_vec()));
        assert_eq!(kv.get(&st, b""), Some(b"empty key".to_vec()));
        assert_eq!(kv.get(&st, b"e"), Some(vec![]));
        assert_eq!(kv.get(&st, b"c"), None);
        assert_eq!(kv.used_bytes(), 4 * GRANULE);
        assert_eq!(kv.put(&mut st, b"a", b"one").unwrap(), Some(b"1".to_vec()));
        assert_eq!(kv.get(&st, b"a"), Some(b"one".to_vec()));
        assert_eq!(kv.delete(&mut st, b"a"), Some(b"one".to_vec()));
        assert_eq!(kv.delete(&mut st, b"a"), None);
        assert_eq!(kv.get(&st, b"a"), None);
        assert_eq!(kv.len(), 3);
        check_invariants(&kv);
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
        for k in [&b"b"[..], b"", b"e"] {
            kv.delete(&mut st, k).unwrap();
        }
        assert!(kv.is_empty());
        assert_eq!(kv.free_bytes(), 64 * 1024);
        assert_eq!(kv.free_by_start.len(), 1);
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
    }

    #[test]
    fn update_in_place_shrink_and_grow() {
        let mut st = FlatState::new(64 * 1024);
        let mut kv = PagedKv::load(&st).unwrap();
        kv.put(&mut st, b"k", &[1; 500]).unwrap();
        kv.put(&mut st, b"z", &[9; 10]).unwrap();
        let start = kv.index[&b"k"[..]].start;
        // Same granule count.
        kv.put(&mut st, b"k", &[2; 480]).unwrap();
        assert_eq!(kv.index[&b"k"[..]].start, start);
        // Shrink: stays, tail freed.
        kv.put(&mut st, b"k", &[3; 100]).unwrap();
        assert_eq!(kv.index[&b"k"[..]].start, start);
        assert_eq!(kv.index[&b"k"[..]].granules, 2);
        check_invariants(&kv);
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
        // Grow back into the freed tail.
        kv.put(&mut st, b"k", &[4; 500]).unwrap();
        assert_eq!(kv.index[&b"k"[..]].start, start);
        assert_eq!(kv.get(&st, b"k"), Some(vec![4; 500]));
        // Grow beyond the free tail: relocate.
        kv.put(&mut st, b"k", &[5; 2000]).unwrap();
        assert_ne!(kv.index[&b"k"[..]].start, start);
        assert_eq!(kv.get(&st, b"k"), Some(vec![5; 2000]));
        assert_eq!(kv.get(&st, b"z"), Some(vec![9; 10]));
        check_invariants(&kv);
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
    }

    #[test]
    fn grow_relocates_over_own_and_previous_space() {
        // 16 granules: a = [0,4), b = [4,8), c = [8,16).
        let mut st = FlatState::new(16 * GRANULE);
        let mut kv = PagedKv::load(&st).unwrap();
        let bytes = |granules: usize| vec![7u8; granules * 64 - HEADER - 1];
        kv.put(&mut st, b"a", &bytes(4)).unwrap();
        kv.put(&mut st, b"b", &bytes(4)).unwrap();
        kv.put(&mut st, b"c", &bytes(8)).unwrap();
        assert_eq!(kv.free_bytes(), 0);
        kv.delete(&mut st, b"a").unwrap();
        // b needs 6 granules: only [0,4) + its own [4,8) can hold it.
        let v = vec![8u8; 6 * 64 - HEADER - 1];
        assert_eq!(kv.put(&mut st, b"b", &v).unwrap(), Some(bytes(4)));
        assert_eq!(kv.index[&b"b"[..]].start, 0);
        assert_eq!(kv.get(&st, b"b"), Some(v));
        assert_eq!(kv.free_by_start.iter().collect::<Vec<_>>(), [(&6, &2)]);
        check_invariants(&kv);
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
        // 9 granules does not fit anywhere: Full, reporting the 8 usable granules.
        let before = st.clone();
        let (need, largest) = full_err(kv.put(&mut st, b"b", &[0; 9 * 64 - HEADER - 1]));
        assert_eq!((need, largest), (9 * 64, 8 * 64));
        assert_eq!(st, before);
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
    }

    #[test]
    fn scan_bounds_and_limit() {
        let mut st = FlatState::new(64 * 1024);
        let mut kv = PagedKv::load(&st).unwrap();
        for i in 0..20u8 {
            kv.put(&mut st, &[b'k', b'a' + i], &[i; 3]).unwrap();
        }
        let keys = |v: Vec<(Vec<u8>, Vec<u8>)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        let all = kv.scan(&st, b"", None, 100);
        assert_eq!(all.len(), 20);
        assert_eq!(all[3], (b"kd".to_vec(), vec![3; 3]));
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(
            keys(kv.scan(&st, b"kc", Some(b"kf"), 100)),
            [b"kc".to_vec(), b"kd".to_vec(), b"ke".to_vec()]
        );
        assert_eq!(
            keys(kv.scan(&st, b"kc", None, 2)),
            [b"kc".to_vec(), b"kd".to_vec()]
        );
        assert!(kv.scan(&st, b"kc", None, 0).is_empty());
        assert!(kv.scan(&st, b"kf", Some(b"kc"), 10).is_empty());
        assert!(kv.scan(&st, b"kc", Some(b"kc"), 10).is_empty());
        assert!(kv.scan(&st, b"z", None, 10).is_empty());
    }

    #[test]
    fn full_leaves_state_unchanged() {
        let mut st = FlatState::new(4096);
        let mut kv = PagedKv::load(&st).unwrap();
        let mut i = 0u32;
        let err = loop {
            match kv.put(&mut st, &i.to_be_bytes(), &[i as u8; 100]) {
                Ok(None) => i += 1,
                Ok(Some(_)) => unreachable!(),
                Err(e) => break e,
            }
        };
        // 100 + 4 + 16 bytes = 2 granules each, 64 granules in all.
        assert_eq!(i, 32);
        assert_eq!(
            err,
            PagedKvError::Full {
                need: 128,
                largest_free: 0
            }
        );
        assert!(err.to_string().contains("need 128"));
        assert_eq!(kv.free_bytes(), 0);
        let before = st.clone();
        // Growing an existing key does not fit either, and keeps the old value.
        full_err(kv.put(&mut st, &0u32.to_be_bytes(), &[1; 200]));
        assert_eq!(st, before);
        assert_eq!(kv.get(&st, &0u32.to_be_bytes()), Some(vec![0; 100]));
        // Unrepresentable key: Full, nothing written.
        full_err(kv.put(&mut st, &vec![0; 70_000], b""));
        assert_eq!(st, before);
        // Free two non-adjacent records: 2 + 2 granules free, 3 needed.
        kv.delete(&mut st, &3u32.to_be_bytes()).unwrap();
        kv.delete(&mut st, &5u32.to_be_bytes()).unwrap();
        let before = st.clone();
        let (need, largest) = full_err(kv.put(&mut st, b"new", &[0; 150]));
        assert_eq!((need, largest), (192, 128));
        assert_eq!(st, before);
        kv.put(&mut st, b"new", &[0; 100]).unwrap();
        check_invariants(&kv);
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
    }

    #[test]
    fn tiny_states() {
        for size in [0u64, 1, 63] {
            let mut st = FlatState::new(size);
            let mut kv = PagedKv::load(&st).unwrap();
            assert_eq!(kv.free_bytes(), 0);
            full_err(kv.put(&mut st, b"", b""));
        }
        let mut st = FlatState::new(100);
        let mut kv = PagedKv::load(&st).unwrap();
        assert_eq!(kv.put(&mut st, b"k", &[1; 47]).unwrap(), None);
        full_err(kv.put(&mut st, b"k", &[1; 48]));
        full_err(kv.put(&mut st, b"j", b""));
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
        assert_eq!(kv.get(&st, b"k"), Some(vec![1; 47]));
    }

    #[test]
    fn pages_touched_are_minimal() {
        let mut st = Tracked::new(1 << 20);
        let mut kv = PagedKv::load(&st).unwrap();
        let mut v = vec![0u8; 60_000];
        ChaCha8Rng::seed_from_u64(1).fill(&mut v[..]);
        st.reset();
        kv.put(&mut st, b"big", &v).unwrap();
        // 60 019 bytes from address 0: pages 0..=14, and the remainder header in page 14.
        assert_eq!(st.pages.len(), 15);
        assert_eq!(st.writes, 2);

        // Rewriting the same value writes nothing.
        st.reset();
        kv.put(&mut st, b"big", &v).unwrap();
        assert_eq!((st.writes, st.bytes), (0, 0));

        // Changing two nearby bytes in the middle dirties one page.
        v[30_000] ^= 1;
        v[30_010] ^= 1;
        st.reset();
        kv.put(&mut st, b"big", &v).unwrap();
        assert_eq!(st.pages.len(), 1);
        assert_eq!(st.bytes, 11);

        // Changing the length by a few bytes (same granules): header + tail.
        v.push(7);
        st.reset();
        kv.put(&mut st, b"big", &v).unwrap();
        assert_eq!(st.pages.iter().copied().collect::<Vec<_>>(), [0, 14]);
        assert!(st.bytes <= 8 + 1, "{}", st.bytes);

        // Delete: one header on one page.
        st.reset();
        assert_eq!(kv.delete(&mut st, b"big"), Some(v));
        assert_eq!((st.writes, st.bytes, st.pages.len()), (1, HEADER, 1));
        assert_eq!(PagedKv::load(&st).unwrap(), kv);
    }

    /// Returns a 64-byte granule that holds a valid record header for `key` → `value`.
    fn fake_record_granule(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut g = record_image(key, value);
        g.resize(GRANULE as usize, 0);
        g
    }

    #[test]
    fn deleted_fake_headers_do_not_resurrect() {
        let ghost = fake_record_granule(b"ghost", b"boo");
        let mut fake_free = free_header(1 << 40).to_vec();
        fake_free.resize(GRANULE as usize, 0);
        for key_len in [0usize, 1, 5, 16, 47, 48, 63, 100] {
            let mut st = FlatState::new(64 * 1024);
            let mut kv = PagedKv::load(&st).unwrap();
            kv.put(&mut st, b"before", b"x").unwrap();
            let key = vec![b'a'; key_len];
            // A value with a fake granule at every granule boundary it covers.
            let mut value = vec![0xee; 40 * 64];
            let first = (64 - (HEADER + key_len) % 64) % 64;
            for (i, at) in (first..value.len() - 64).step_by(64).enumerate() {
                let fake = if i % 3 == 2 { &fake_free } else { &ghost };
                value[at..at + 64].copy_from_slice(fake);
            }
            kv.put(&mut st, &key, &value).unwrap();
            kv.put(&mut st, b"after", b"y").unwrap();
            assert_eq!(PagedKv::load(&st).unwrap(), kv);
            kv.delete(&mut st, &key).unwrap();
            let loaded = PagedKv::load(&st).unwrap();
            assert_eq!(loaded, kv);
            assert_eq!(loaded.get(&st, b"ghost"), None);
            assert_eq!(loaded.len(), 2);
            // Reuse the start of the freed extent: the rest stays unreadable.
            kv.put(&mut st, b"small", b"z").unwrap();
            let loaded = PagedKv::load(&st).unwrap();
            assert_eq!(loaded, kv);
            assert_eq!(loaded.get(&st, b"ghost"), None);
            // And shrinking a record with fake headers in its tail.
            kv.put(&mut st, &key, &value).unwrap();
            kv.put(&mut st, &key, &value[..100]).unwrap();
            let loaded = PagedKv::load(&st).unwrap();
            assert_eq!(loaded, kv);
            assert_eq!(loaded.get(&st, b"ghost"), None);
            check_invariants(&kv);
        }
    }

    #[test]
    fn garbage_is_rejected() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for size in [64u64, 4096, 64 * 1024, 100_000] {
            for _ in 0..20 {
                let mut st = FlatState::new(size);
                let mut b = vec![0u8; size as usize];
                rng.fill(&mut b[..]);
                st.write(0, &b);
                assert!(PagedKv::load(&st).is_err());
            }
        }

        let err = |st: &FlatState| PagedKv::load(st).unwrap_err();
        // A record running past the end.
        let mut st = FlatState::new(4096);
        st.write(4096 - 64, &record_header(1, 100));
        assert!(err(&st).contains("past the end"), "{}", err(&st));
        // A free block running past the end.
        let mut st = FlatState::new(4096);
        st.write(64, &free_header(64));
        assert!(err(&st).contains("past the end"));
        // A free block of length 0.
        let mut st = FlatState::new(4096);
        st.write(0, &free_header(0));
        assert!(err(&st).contains("length 0"));
        // Duplicate keys.
        let mut st = FlatState::new(4096);
        st.write(0, &record_image(b"k", b"1"));
        st.write(128, &record_image(b"k", b"2"));
        assert!(err(&st).contains("duplicate"));
        // Non-zero flags, bad check, bad magic.
        let mut st = FlatState::new(4096);
        let mut h = record_header(1, 1);
        h[6] = 1;
        st.write(0, &h);
        assert!(err(&st).contains("flags"));
        let mut h = record_header(1, 1);
        h[8] = 2;
        st.write(0, &h);
        assert!(err(&st).contains("check"));
        let mut h = free_header(3);
        h[8] = 4;
        st.write(0, &h);
        assert!(err(&st).contains("check"));
        st.write(0, &[1]);
        assert!(err(&st).contains("magic"));
    }

    #[test]
    fn bit_flips_never_panic() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut st = FlatState::new(32 * 1024);
        let mut kv = PagedKv::load(&st).unwrap();
        for i in 0..200u32 {
            let key = (i % 40).to_be_bytes();
            if rng.random_bool(0.3) {
                kv.delete(&mut st, &key);
            } else {
                let len = rng.random_range(0..600);
                let _ = kv.put(&mut st, &key, &vec![i as u8; len]);
            }
        }
        let clean = st.clone();
        for _ in 0..300 {
            let mut st = clean.clone();
            let at = rng.random_range(0..st.size());
            let mut b = [0u8];
            st.read(at, &mut b);
            b[0] ^= 1 << rng.random_range(0..8);
            st.write(at, &b);
            if let Ok(mut kv) = PagedKv::load(&st) {
                check_invariants(&kv);
                let all = kv.scan(&st, b"", None, usize::MAX);
                assert_eq!(all.len(), kv.len());
                for (k, _) in all.iter().take(5) {
                    kv.delete(&mut st, k);
                }
                let _ = kv.put(&mut st, b"new", &[1; 300]);
                assert_eq!(PagedKv::load(&st).unwrap(), kv);
            }
        }
    }

    /// Random operations against a `BTreeMap` model. `a` is maintained incrementally; `b`
    /// gets the same operations but is reloaded from its bytes at random points. Both must
    /// answer identically and keep byte-identical states.
    fn random_ops(seed: u64, size: u64, keys: u32, steps: usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut sa = Tracked::new(size);
        let mut a = PagedKv::load(&sa).unwrap();
        let mut sb = FlatState::new(size);
        let mut b = PagedKv::load(&sb).unwrap();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let key_of = |n: u32| {
            let mut k = format!("k{n:04}").into_bytes();
            k.resize(k.len() + (n as usize % 7) * 9, b'-');
            k
        };
        let (mut fulls, mut reloads) = (0, 0);
        for step in 0..steps {
            let key = key_of(rng.random_range(0..keys));
            sa.reset();
            match rng.random_range(0..100) {
                0..50 => {
                    let len = match rng.random_range(0..100) {
                        0..70 => rng.random_range(0..200),
                        70..95 => rng.random_range(200..3000),
                        _ => rng.random_range(3000..20_000),
                    };
                    let mut value = vec![0u8; len];
                    rng.fill(&mut value[..]);
                    let ra = a.put(&mut sa, &key, &value);
                    let rb = b.put(&mut sb, &key, &value);
                    assert_eq!(ra, rb);
                    match ra {
                        Ok(prev) => assert_eq!(prev, model.insert(key, value)),
                        Err(PagedKvError::Full { need, largest_free }) => {
                            fulls += 1;
                            assert_eq!(sa.writes, 0, "Full must not write");
                            assert!(need > largest_free);
                            assert!(largest_free >= a.largest_free() * GRANULE);
                        }
                    }
                }
                50..70 => {
                    let ra = a.delete(&mut sa, &key);
                    assert_eq!(ra, b.delete(&mut sb, &key));
                    let expected = model.remove(&key);
                    if expected.is_some() {
                        assert_eq!((sa.writes, sa.bytes), (1, HEADER));
                    } else {
                        assert_eq!(sa.writes, 0);
                    }
                    assert_eq!(ra, expected);
                }
                70..85 => {
                    let ra = a.get(&sa, &key);
                    assert_eq!(ra, b.get(&sb, &key));
                    assert_eq!(ra.as_ref(), model.get(&key));
                }
                _ => {
                    let end = rng
                        .random_bool(0.7)
                        .then(|| key_of(rng.random_range(0..keys)));
                    let limit = rng.random_range(0..30);
                    let ra = a.scan(&sa, &key, end.as_deref(), limit);
                    assert_eq!(ra, b.scan(&sb, &key, end.as_deref(), limit));
                    let expected: Vec<_> = match &end {
                        Some(e) if *e <= key => vec![],
                        _ => model
                            .range::<Vec<u8>, _>((
                                Bound::Included(&key),
                                end.as_ref().map_or(Bound::Unbounded, Bound::Excluded),
                            ))
                            .take(limit)
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    };
                    assert_eq!(ra, expected);
                }
            }
            assert_eq!(a.len(), model.len());
            if rng.random_range(0..40) == 0 {
                reloads += 1;
                b = PagedKv::load(&sb).unwrap();
                assert_eq!(b, a, "reloaded index differs at step {step}");
            }
            if step % 50 == 0 {
                assert_eq!(
                    sa.inner.bytes(),
                    sb.bytes(),
                    "states diverge at step {step}"
                );
                check_invariants(&a);
            }
        }
        assert_eq!(sa.inner.bytes(), sb.bytes());
        check_invariants(&a);
        assert_eq!(PagedKv::load(&sa).unwrap(), a);
        let all = a.scan(&sa, b"", None, usize::MAX);
        let expected: Vec<_> = model.into_iter().collect();
        assert_eq!(all, expected);
        assert!(reloads > 10);
        // The small configurations must exercise the Full path.
        if size <= 128 * 1024 {
            assert!(fulls > 0, "no Full in seed {seed}");
        }
    }

    #[test]
    fn random_ops_match_model_and_reload() {
        random_ops(1, 256 * 1024, 150, 4000);
        random_ops(2, 256 * 1024, 400, 4000);
        random_ops(3, 128 * 1024, 150, 3000);
        random_ops(4, 64 * 1024, 60, 3000);
    }
}
