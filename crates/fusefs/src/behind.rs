//! Write-behind: the data of `write(2)` held in the mount until the file is closed or synced,
//! as an NFS v3 client holds unstable writes until COMMIT (close-to-open consistency).
//!
//! A program that writes a file in many small pieces (an assembler patching an object file, a
//! stdio stream) costs one replicated operation per piece when every write goes through; held
//! back, the pieces merge into as few writes as the service's size limit allows, sent when the
//! file is closed (`flush`), synced (`fsync`), its attributes are set, it has been dirty for
//! the attribute TTL, or the held bytes pass a bound. Until then this mount answers reads and
//! attributes of the file with the held data laid over the service's. After they are sent, the
//! attributes the service answered the last write with answer `getattr` for up to the TTL, as
//! the kernel's own cache would have (unless this mount changed the file's names or
//! attributes since).
//!
//! [`Dirty`] is one file's held data: plain values, no I/O, tested below. [`Behind`] is the
//! table of them the file system shares between its requests.

use redoubt_services::files::{Attr, Ino};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes held for one file before its writes are sent at once.
pub const FILE_BYTES_MAX: usize = 1 << 20;
/// Bytes held for all files of the mount before a write sends its own file's.
pub const TOTAL_BYTES_MAX: usize = 32 << 20;
/// Files with held data (or a known size, just created) at once.
pub const FILES_MAX: usize = 4_096;

/// One file's held writes, merged: non-overlapping, non-adjacent extents by offset.
#[derive(Debug, Default)]
pub struct Dirty {
    extents: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
    /// The service's attributes of the file as this mount last learned them (from the create,
    /// a lookup or getattr, or the last write sent): what reads beyond its size and attribute
    /// requests are answered from.
    base: Option<Attr>,
    /// When `base` was learned, and the table's epoch then.
    learned: Option<(Instant, u64)>,
    /// When the oldest held write came.
    since: Option<Instant>,
    /// The time of the newest held write (ms since the epoch): the file's mtime until sent.
    written_ms: u64,
    /// Taken out of the table: a request that held this entry looks the file up again.
    retired: bool,
}

impl Dirty {
    /// Holds `data` at `offset` over whatever was held there; `now_ms` becomes the file's
    /// modification time.
    pub fn write(&mut self, offset: u64, data: &[u8], now: Instant, now_ms: u64) {
        if data.is_empty() {
            return;
        }
        self.since.get_or_insert(now);
        self.written_ms = now_ms;
        let end = offset + data.len() as u64;
        // Appending to the extent that ends where this write starts: extend it in place.
        let nothing_after = self.extents.range(offset..=end).next().is_none();
        if let Some((&k, d)) = self.extents.range_mut(..=offset).next_back() {
            if nothing_after && k + d.len() as u64 == offset {
                d.extend_from_slice(data);
                self.bytes += data.len();
                return;
            }
        }
        let touching: Vec<u64> = self
            .extents
            .range(..=end)
            .rev()
            .take_while(|(k, d)| *k + d.len() as u64 >= offset)
            .map(|(k, _)| *k)
            .collect();
        let start = touching.iter().copied().fold(offset, u64::min);
        let stop = touching
            .iter()
            .map(|k| k + self.extents[k].len() as u64)
            .fold(end, u64::max);
        let mut buf = vec![0u8; (stop - start) as usize];
        for k in touching {
            let d = self.extents.remove(&k).expect("listed above");
            self.bytes -= d.len();
            buf[(k - start) as usize..][..d.len()].copy_from_slice(&d);
        }
        buf[(offset - start) as usize..][..data.len()].copy_from_slice(data);
        self.bytes += buf.len();
        self.extents.insert(start, buf);
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_clean(&self) -> bool {
        self.extents.is_empty()
    }

    /// Whether the oldest held write is older than `age`.
    pub fn older_than(&self, age: Duration, now: Instant) -> bool {
        self.since.is_some_and(|s| now.duration_since(s) >= age)
    }

    /// The end of the held data (0 when none is held).
    fn end(&self) -> u64 {
        self.extents
            .iter()
            .next_back()
            .map_or(0, |(k, d)| k + d.len() as u64)
    }

    /// Learns the service's attributes of the file, at `now` in the table's `epoch`.
    pub fn learn(&mut self, a: Attr, now: Instant, epoch: u64) {
        self.base = Some(a);
        self.learned = Some((now, epoch));
    }

    /// Whether the attributes learned are no older than `ttl` and from `epoch`.
    fn fresh(&self, now: Instant, ttl: Duration, epoch: u64) -> bool {
        self.learned
            .is_some_and(|(t, e)| e == epoch && now.duration_since(t) < ttl)
    }

    /// The service's size of the file as last learned.
    fn base_size(&self) -> Option<u64> {
        self.base.as_ref().map(|a| a.size)
    }

    /// `a` (the service's attributes) as this mount shows them: longer by the held data, and
    /// modified when it was written.
    pub fn patch(&self, a: &mut Attr) {
        if self.is_clean() {
            return;
        }
        a.size = a.size.max(self.end());
        a.mtime_ms = a.mtime_ms.max(self.written_ms);
        a.ctime_ms = a.ctime_ms.max(self.written_ms);
    }

    /// The attributes to answer with without asking the service, when known: with held
    /// data, as last learned with it; without, as learned no longer than `ttl` ago in the
    /// table's current `epoch`.
    pub fn attr(&self, now: Instant, ttl: Duration, epoch: u64) -> Option<Attr> {
        let mut a = self.base?;
        if self.is_clean() && !self.fresh(now, ttl, epoch) {
            return None;
        }
        self.patch(&mut a);
        Some(a)
    }

    /// The file's bytes in `[offset, offset + len)` when the held data and the known size
    /// answer them without the service: every byte below the service's size is held.
    pub fn read_held(&self, offset: u64, len: u32) -> Option<Vec<u8>> {
        if self.is_clean() {
            return None;
        }
        let base = self.base_size()?;
        let eof = base.max(self.end());
        if offset >= eof {
            return Some(Vec::new());
        }
        let stop = (offset + u64::from(len)).min(eof);
        let mut at = offset;
        for (k, d) in self.extents.range(..stop) {
            let e = k + d.len() as u64;
            if e <= at {
                continue;
            }
            if *k > at && at < base {
                return None;
            }
            at = at.max(e);
        }
        if at < stop.min(base) {
            return None;
        }
        let mut out = vec![0u8; (stop - offset) as usize];
        self.overlay(offset, &mut out);
        Some(out)
    }

    /// The service's answer `got` to a read of `[offset, offset + len)` with the held data
    /// laid over it (and the file longer by it).
    pub fn read_over(&self, offset: u64, len: u32, mut got: Vec<u8>) -> Vec<u8> {
        let short = got.len() < len as usize;
        if short {
            let eof = (offset + got.len() as u64).max(self.end());
            let want = (offset + u64::from(len)).min(eof).saturating_sub(offset);
            got.resize(want as usize, 0);
        }
        self.overlay(offset, &mut got);
        got
    }

    fn overlay(&self, offset: u64, out: &mut [u8]) {
        let stop = offset + out.len() as u64;
        for (k, d) in self.extents.range(..stop) {
            let e = k + d.len() as u64;
            if e <= offset {
                continue;
            }
            let from = (*k).max(offset);
            let to = e.min(stop);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&d[(from - k) as usize..(to - k) as usize]);
        }
    }

    /// Takes the held data out as writes of at most `max` bytes, as few as possible: extents
    /// separated by a gap beyond the service's size (which reads as zeros) are sent as one
    /// write with the gap's zeros when that saves a write.
    pub fn take_writes(&mut self, max: usize) -> Vec<(u64, Vec<u8>)> {
        let base = self.base_size().unwrap_or(u64::MAX);
        let pieces = |len: usize| len.div_ceil(max);
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (k, d) in std::mem::take(&mut self.extents) {
            if let Some((s, run)) = runs.last_mut() {
                let run_end = *s + run.len() as u64;
                let joined = (k + d.len() as u64 - *s) as usize;
                if run_end >= base && pieces(joined) < pieces(run.len()) + pieces(d.len()) {
                    run.resize((k - *s) as usize, 0);
                    run.extend_from_slice(&d);
                    continue;
                }
            }
            runs.push((k, d));
        }
        self.bytes = 0;
        self.since = None;
        let mut out = Vec::new();
        for (s, run) in runs {
            for (i, chunk) in run.chunks(max).enumerate() {
                out.push((s + (i * max) as u64, chunk.to_vec()));
            }
        }
        out
    }
}

/// An entry of the table: one file's held data, locked for as long as a request reads or sends
/// it (an async lock: sending awaits the service).
pub type Entry = Arc<tokio::sync::Mutex<Dirty>>;

/// Every file's held data.
#[derive(Default)]
pub struct Behind {
    files: Mutex<HashMap<Ino, Entry>>,
    total: Mutex<usize>,
    /// Counts this mount's operations that may change a file's attributes without naming
    /// it (unlink, rename, link) or change them (setattr): attributes learned before are
    /// not answered from.
    epoch: std::sync::atomic::AtomicU64,
}

impl Behind {
    /// The entry of `ino`, if it has one.
    pub fn get(&self, ino: Ino) -> Option<Entry> {
        self.files.lock().expect("not poisoned").get(&ino).cloned()
    }

    /// The entry of `ino`, made if need be (none when the table is full).
    pub fn get_or_make(&self, ino: Ino) -> Option<Entry> {
        let mut files = self.files.lock().expect("not poisoned");
        if let Some(e) = files.get(&ino) {
            return Some(e.clone());
        }
        if files.len() >= FILES_MAX {
            return None;
        }
        Some(files.entry(ino).or_default().clone())
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A change of some file's attributes is under way: forget what was learned.
    pub fn changing(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Takes `ino`'s entry out of the table if it holds nothing and its attributes are no
    /// longer fresh (`ttl`); the caller holds its lock.
    pub fn retire_if_stale(&self, ino: Ino, d: &mut Dirty, now: Instant, ttl: Duration) {
        if d.is_clean() && !d.retired && !d.fresh(now, ttl, self.epoch()) {
            d.retired = true;
            self.files.lock().expect("not poisoned").remove(&ino);
        }
    }

    /// Whether a request holding this entry must look the file up again.
    pub fn is_retired(d: &Dirty) -> bool {
        d.retired
    }

    /// Counts `delta` more (or fewer) held bytes in all; returns the new total.
    pub fn add_bytes(&self, delta: isize) -> usize {
        let mut t = self.total.lock().expect("not poisoned");
        *t = t.saturating_add_signed(delta);
        *t
    }

    /// Files with held data, or with a known size and nothing held yet.
    pub fn inodes(&self) -> Vec<Ino> {
        self.files
            .lock()
            .expect("not poisoned")
            .keys()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_services::files::Kind;

    fn attr(size: u64) -> Attr {
        Attr {
            ino: 9,
            kind: Kind::File,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size,
            atime_ms: 10,
            mtime_ms: 10,
            ctime_ms: 10,
        }
    }

    fn held(writes: &[(u64, &[u8])], base: Option<u64>) -> Dirty {
        let mut d = Dirty::default();
        if let Some(b) = base {
            d.learn(attr(b), Instant::now(), 0);
        }
        for (o, data) in writes {
            d.write(*o, data, Instant::now(), 99);
        }
        d
    }

    /// The file as a flat buffer: what the writes make of `base` bytes of `b'.'`.
    fn model(base: usize, writes: &[(u64, &[u8])]) -> Vec<u8> {
        let mut f = vec![b'.'; base];
        for (o, data) in writes {
            let o = *o as usize;
            if f.len() < o + data.len() {
                f.resize(o + data.len(), 0);
            }
            f[o..o + data.len()].copy_from_slice(data);
        }
        f
    }

    #[test]
    fn overlapping_and_adjacent_writes_merge_and_the_last_wins() {
        let writes: &[(u64, &[u8])] = &[
            (10, b"aaaa"),
            (14, b"bb"),
            (4, b"cccccccc"),
            (30, b"dd"),
            (12, b"E"),
            (32, b"ff"),
        ];
        let d = held(writes, Some(0));
        assert_eq!(d.extents.len(), 2, "{:?}", d.extents);
        assert_eq!(d.bytes(), 12 + 4);
        let f = model(0, writes);
        assert_eq!(d.read_held(0, 64).unwrap(), f);
        assert_eq!(d.read_held(5, 9).unwrap(), f[5..14]);
    }

    #[test]
    fn reads_below_the_service_size_need_the_service_unless_held() {
        let writes: &[(u64, &[u8])] = &[(2, b"xy"), (20, b"zz")];
        let d = held(writes, Some(8));
        assert!(d.read_held(0, 4).is_none(), "bytes 0-1 are the service's");
        assert_eq!(d.read_held(2, 2).unwrap(), b"xy");
        assert!(d.read_held(2, 8).is_none(), "bytes 4-7 are the service's");
        // Beyond the service's size: zeros and held data.
        assert_eq!(d.read_held(8, 100).unwrap(), model(8, writes)[8..]);
        assert_eq!(d.read_held(30, 4).unwrap(), b"");
        // Unknown size: only what is held answers.
        let d = held(writes, None);
        assert!(d.read_held(2, 2).is_none());
        // The service's bytes with the held ones over them.
        let d = held(writes, Some(8));
        let service = vec![b'.'; 8];
        assert_eq!(d.read_over(0, 100, service), model(8, writes));
        assert_eq!(d.read_over(0, 4, b"....".to_vec()), b"..xy");
    }

    #[test]
    fn writes_go_out_in_as_few_pieces_as_fit() {
        // A new file patched at scattered offsets: one write with the gaps' zeros.
        let writes: &[(u64, &[u8])] = &[(0, b"head"), (100, b"mid"), (40, b"x"), (200, b"t")];
        let mut d = held(writes, Some(0));
        let out = d.take_writes(4096);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 0);
        assert_eq!(out[0].1, model(0, writes));
        assert!(d.is_clean() && d.bytes() == 0);
        // Gaps over the service's bytes are not filled.
        let mut d = held(writes, Some(150));
        let out: Vec<u64> = d.take_writes(4096).iter().map(|w| w.0).collect();
        assert_eq!(out, vec![0, 40, 100, 200]);
        // Long runs split at the limit; no write is longer.
        let big = vec![7u8; 10_000];
        let mut d = held(&[(5, &big)], None);
        let out = d.take_writes(4096);
        assert_eq!(
            out.iter().map(|w| (w.0, w.1.len())).collect::<Vec<_>>(),
            vec![(5, 4096), (4101, 4096), (8197, 1808)]
        );
        // Joining only when it saves a write.
        let mut d = held(&[(0, &big[..4000]), (4100, b"z")], Some(0));
        assert_eq!(d.take_writes(4096).len(), 2);
    }

    #[test]
    fn attributes_show_the_held_size_and_time() {
        let (now, ttl) = (Instant::now(), Duration::from_secs(1));
        let d = held(&[(100, b"abc")], Some(50));
        let a = d.attr(now, ttl, 0).unwrap();
        assert_eq!((a.size, a.mtime_ms, a.ctime_ms), (103, 99, 99));
        let d = held(&[(1, b"abc")], Some(50));
        assert_eq!(d.attr(now, ttl, 0).unwrap().size, 50);
        assert!(held(&[], None).attr(now, ttl, 0).is_none());
        // Nothing held: answered while fresh, and in the same epoch only.
        let d = held(&[], Some(50));
        assert_eq!(d.attr(now, ttl, 0).unwrap().size, 50);
        assert!(d.attr(now, ttl, 1).is_none(), "a change since");
        assert!(
            d.attr(now + ttl * 2, ttl, 0).is_none(),
            "older than the TTL"
        );
        // Held data is answered in any epoch (the writes are this mount's own).
        let d = held(&[(1, b"abc")], Some(50));
        assert!(d.attr(now + ttl * 5, ttl, 7).is_some());
    }

    #[test]
    fn random_writes_read_back_as_a_flat_file_does() {
        // A small deterministic generator: no dependency for one test.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for round in 0..200 {
            let base = next(64) as usize;
            let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
            for i in 0..next(12) + 1 {
                let len = next(20) as usize + 1;
                writes.push((next(100), vec![(round + i) as u8 | 1; len]));
            }
            let refs: Vec<(u64, &[u8])> = writes.iter().map(|(o, d)| (*o, &d[..])).collect();
            let f = model(base, &refs);
            let d = held(&refs, Some(base as u64));
            let service = vec![b'.'; base];
            assert_eq!(d.read_over(0, 200, service), f, "round {round}");
            let mut d = d;
            let mut flat = vec![b'.'; base];
            for (o, w) in d.take_writes(16) {
                assert!(w.len() <= 16);
                let o = o as usize;
                if flat.len() < o + w.len() {
                    flat.resize(o + w.len(), 0);
                }
                flat[o..o + w.len()].copy_from_slice(&w);
            }
            assert_eq!(flat, f, "round {round}: the writes sent make the same file");
        }
    }
}
