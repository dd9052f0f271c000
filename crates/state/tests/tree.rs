//! Property tests of the partition tree: incremental digests equal digests recomputed from
//! scratch, checkpoint copies return the state as of their checkpoint, copy-on-write copies
//! never outlive the stable checkpoint, durable bases reopen exactly, transfers converge,
//! tentative writes are undone exactly.

use std::collections::BTreeMap;

use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_crypto::Digest;
use redoubt_state::{
    meta_digest, page_digest, FileStore, Geometry, MemStore, PageStore, PagedState, StateRead,
    StateWrite,
};

/// The state as a plain model: page bytes and lm per page.
#[derive(Clone)]
struct Model {
    geo: Geometry,
    pages: Vec<Vec<u8>>,
    lm: Vec<u64>,
    written: Vec<bool>,
}

impl Model {
    fn new(geo: Geometry) -> Model {
        Model {
            geo,
            pages: vec![vec![0; geo.page_size()]; geo.pages() as usize],
            lm: vec![0; geo.pages() as usize],
            written: vec![false; geo.pages() as usize],
        }
    }

    fn write(&mut self, addr: u64, data: &[u8]) {
        let ps = self.geo.page_size() as u64;
        for (i, b) in data.iter().enumerate() {
            let at = addr + i as u64;
            self.pages[(at / ps) as usize][(at % ps) as usize] = *b;
            self.written[(at / ps) as usize] = true;
        }
    }

    fn checkpoint(&mut self, seq: u64) {
        for (i, w) in self.written.iter_mut().enumerate() {
            if *w {
                self.lm[i] = seq;
                *w = false;
            }
        }
    }

    /// Root digest recomputed from scratch.
    fn root(&self) -> Digest {
        let g = self.geo;
        let mut level: Vec<(u64, Digest)> = (0..g.pages())
            .map(|i| {
                let lm = self.lm[i as usize];
                (lm, page_digest(i, lm, &self.pages[i as usize]))
            })
            .collect();
        for l in (0..g.depth()).rev() {
            level = (0..g.nodes_at(l))
                .map(|i| {
                    let r = g.children(l, i);
                    let kids = &level[r.start as usize..r.end as usize];
                    let lm = kids.iter().map(|k| k.0).max().unwrap();
                    let entries: Vec<redoubt_state::Entry> = kids
                        .iter()
                        .map(|k| redoubt_state::Entry {
                            lm: k.0,
                            digest: k.1,
                        })
                        .collect();
                    (lm, meta_digest(l, i, lm, entries.iter()))
                })
                .collect();
        }
        level[0].1
    }
}

fn random_write(rng: &mut ChaCha8Rng, geo: Geometry) -> (u64, Vec<u8>) {
    let size = geo.size();
    let len = rng.random_range(1..=(geo.page_size() as u64 * 2).min(size));
    let addr = rng.random_range(0..=size - len);
    let mut data = vec![0u8; len as usize];
    rng.fill_bytes(&mut data);
    (addr, data)
}

fn check_live(st: &PagedState, m: &Model) {
    let mut buf = vec![0u8; st.size() as usize];
    st.read(0, &mut buf);
    assert_eq!(buf, m.pages.concat(), "live bytes");
}

fn run(
    seed: u64,
    geo: Geometry,
    store: Box<dyn PageStore>,
    reopen: &dyn Fn() -> Box<dyn PageStore>,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut st = PagedState::open(store, b"aux0").unwrap();
    let mut m = Model::new(geo);
    assert_eq!(st.root(), m.root());
    let mut snaps: BTreeMap<u64, Model> = BTreeMap::new();
    snaps.insert(0, m.clone());
    let mut seq = 0;
    let mut base = 0;
    for _ in 0..60 {
        for _ in 0..rng.random_range(0..12) {
            let (a, d) = random_write(&mut rng, geo);
            st.write(a, &d);
            m.write(a, &d);
        }
        check_live(&st, &m);
        if rng.random_range(0..3) == 0 {
            // A tentatively executed batch: its writes are kept or undone.
            let before = m.clone();
            st.begin_tentative();
            for _ in 0..rng.random_range(0..6) {
                let (a, d) = random_write(&mut rng, geo);
                st.write(a, &d);
                m.write(a, &d);
            }
            check_live(&st, &m);
            if rng.random_bool(0.5) {
                st.undo_tentative();
                m = before;
            } else {
                st.keep_tentative();
            }
            assert!(!st.is_tentative());
            check_live(&st, &m);
        }
        match rng.random_range(0..10) {
            0 => {
                // Roll back to the latest checkpoint.
                st.revert_to_latest();
                m = snaps[&seq].clone();
                check_live(&st, &m);
            }
            1..=6 => {
                seq += rng.random_range(1..4);
                let root = st.checkpoint(seq, format!("aux{seq}").into_bytes());
                m.checkpoint(seq);
                assert_eq!(
                    root,
                    m.root(),
                    "incremental root == from scratch (seed {seed})"
                );
                snaps.insert(seq, m.clone());
            }
            _ => {
                // A held checkpoint becomes stable: durable base, older copies dropped.
                let held = st.checkpoints();
                let c = held[rng.random_range(0..held.len())];
                st.commit_base(c);
                st.write_commits().unwrap();
                base = base.max(c);
                snaps.retain(|k, _| *k >= base);
                assert_eq!(st.checkpoints(), snaps.keys().copied().collect::<Vec<_>>());
            }
        }
        // Every held checkpoint reads back as it was.
        for (c, sm) in &snaps {
            let (root, aux) = st.held(*c).unwrap();
            assert_eq!(root, sm.root());
            if *c > 0 {
                assert_eq!(&aux[..], format!("aux{c}").as_bytes());
            }
            for p in 0..geo.pages() {
                let (e, bytes) = st.page_at(*c, p).unwrap();
                assert_eq!(bytes, sm.pages[p as usize], "page {p} at {c}");
                assert_eq!(e.lm, sm.lm[p as usize]);
            }
        }
        // Copy-on-write never leaks: copies hold only pages modified since the base, and the
        // overlay only pages that differ from it.
        let fp = st.footprint();
        let modified_since_base = (0..geo.pages() as usize)
            .filter(|p| {
                m.pages[*p] != snaps[&base].pages[*p]
                    || m.lm[*p] != snaps[&base].lm[*p]
                    || m.written[*p]
            })
            .count();
        assert!(fp.checkpoints == snaps.len());
        assert!(fp.overlay_pages <= geo.pages() as usize);
        let changed_any = (0..geo.pages() as usize)
            .filter(|p| {
                snaps
                    .values()
                    .any(|s| s.pages[*p] != m.pages[*p] || s.lm[*p] != m.lm[*p])
                    || m.written[*p]
            })
            .count();
        assert!(
            fp.copied_pages <= changed_any * snaps.len(),
            "copies hold {} pages, only {} changed",
            fp.copied_pages,
            changed_any
        );
        let _ = modified_since_base;
    }
    // Reopen from the durable base: exactly the base checkpoint.
    let latest = *snaps.keys().next_back().unwrap();
    st.commit_base(latest);
    st.write_commits().unwrap();
    drop(st);
    let st = PagedState::open(reopen(), b"unused").unwrap();
    let sm = &snaps[&latest];
    assert_eq!(st.base_seq(), latest);
    assert_eq!(st.root(), sm.root());
    check_live(&st, sm);
    assert_eq!(st.footprint().overlay_pages, 0);
}

#[test]
fn incremental_digests_and_copies_in_memory() {
    for seed in 0..40 {
        let geo = Geometry::new(64, 1 + seed % 37, 2 + (seed as u32 % 5)).unwrap();
        let store = MemStore::new(geo);
        let s2 = store.clone();
        run(seed, geo, Box::new(store), &|| Box::new(s2.clone()));
    }
}

/// Runs the seeds from `first` on file stores, synced or not (`[storage] fsync = false`:
/// commits skip the syncs, and what a process, not a power loss, leaves behind still opens at
/// a whole base).
fn on_disk(first: u64, seeds: u64, sync: bool) {
    for seed in first..first + seeds {
        let dir = tempfile::tempdir().unwrap();
        let geo = Geometry::new(128, 50, 4).unwrap();
        let path = dir.path().to_path_buf();
        let open = || {
            let mut s = FileStore::open(&path, geo).unwrap();
            s.set_sync(sync);
            s
        };
        run(seed, geo, Box::new(open()), &|| Box::new(open()));
    }
}

#[test]
fn incremental_digests_and_copies_on_disk() {
    on_disk(1000, 6, true);
}

#[test]
fn unsynced_file_store_reopens_at_its_last_commit() {
    on_disk(2000, 3, false);
}

/// A file store in `dir` whose base is checkpoint 5 (auxiliary bytes "five") with "hello" at
/// offset 0, closed.
fn write_hello_at_five(dir: &std::path::Path, geo: Geometry) {
    let mut st = PagedState::open(Box::new(FileStore::open(dir, geo).unwrap()), b"").unwrap();
    st.write(0, b"hello");
    st.checkpoint(5, b"five".to_vec());
    st.commit_base(5);
    st.write_commits().unwrap();
}

#[test]
fn file_store_refuses_other_geometry_and_ignores_torn_redo() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(128, 20, 4).unwrap();
    write_hello_at_five(dir.path(), geo);
    assert!(FileStore::open(dir.path(), Geometry::new(128, 21, 4).unwrap()).is_err());
    // A torn redo log (crash while writing it) leaves the old base.
    std::fs::write(dir.path().join("redo.log"), b"RDREDO03garbage").unwrap();
    let st = PagedState::open(Box::new(FileStore::open(dir.path(), geo).unwrap()), b"").unwrap();
    assert_eq!(st.base_seq(), 5);
    let mut b = [0u8; 5];
    st.read(0, &mut b);
    assert_eq!(&b, b"hello");
    assert_eq!(&st.held(5).unwrap().1[..], b"five");
}

/// Copies the store's files of `from` into `to`.
fn copy_store(from: &std::path::Path, to: &std::path::Path) {
    for name in [
        "pages.dat",
        "tree.dat",
        "base.meta",
        "redo.log",
        "aux.0",
        "aux.1",
    ] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
}

#[test]
fn a_complete_redo_log_is_applied_at_open_and_a_torn_one_is_not() {
    // The redo log is rewritten in place and invalidated by its magic: a crash after the log
    // reached the disk and before the base moved leaves a complete log, which opening applies;
    // one cut short anywhere (even over a longer, older log) leaves the old base.
    let geo = Geometry::new(128, 20, 4).unwrap();
    let live = tempfile::tempdir().unwrap();
    let before = tempfile::tempdir().unwrap();
    let mut st =
        PagedState::open(Box::new(FileStore::open(live.path(), geo).unwrap()), b"").unwrap();
    for p in 0..20u64 {
        st.write(p * 128, b"old");
    }
    st.checkpoint(5, b"five".to_vec());
    st.commit_base(5);
    st.write_commits().unwrap();
    copy_store(live.path(), before.path());
    st.write(0, b"new");
    st.checkpoint(7, b"seven".to_vec());
    st.commit_base(7);
    st.write_commits().unwrap();
    drop(st);
    let mut log = std::fs::read(live.path().join("redo.log")).unwrap();
    assert_eq!(&log[..8], &[0u8; 8], "an applied log is invalidated");
    log[..8].copy_from_slice(b"RDREDO03");
    let commit_len = 16 + u64::from_le_bytes(log[8..16].try_into().unwrap()) as usize + 4;
    assert!(
        commit_len < log.len(),
        "the short commit lies over the long one"
    );
    let open_with_log = |log: &[u8]| {
        let dir = tempfile::tempdir().unwrap();
        copy_store(before.path(), dir.path());
        // The crash came after the commit wrote its auxiliary bytes (to the slot the base
        // does not use) and then its log.
        for slot in ["aux.0", "aux.1"] {
            std::fs::copy(live.path().join(slot), dir.path().join(slot)).unwrap();
        }
        std::fs::write(dir.path().join("redo.log"), log).unwrap();
        let st =
            PagedState::open(Box::new(FileStore::open(dir.path(), geo).unwrap()), b"").unwrap();
        let mut b = [0u8; 3];
        st.read(0, &mut b);
        (st.base_seq(), b, st.held(st.base_seq()).unwrap().1.to_vec())
    };
    assert_eq!(open_with_log(&log), (7, *b"new", b"seven".to_vec()));
    for cut in [commit_len - 1, commit_len / 2, 20] {
        let mut torn = log[..cut].to_vec();
        torn.extend_from_slice(&vec![0xa5; log.len() - cut]);
        assert_eq!(
            open_with_log(&torn),
            (5, *b"old", b"five".to_vec()),
            "cut at {cut}"
        );
    }
}

#[test]
fn check_finds_corruption_and_transfer_repairs_it() {
    let geo = Geometry::new(64, 40, 3).unwrap();
    let good_store = MemStore::new(geo);
    let bad_store = MemStore::new(geo);
    let mut good = PagedState::open(Box::new(good_store.clone()), b"").unwrap();
    let mut bad = PagedState::open(Box::new(bad_store.clone()), b"").unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..30 {
        let (a, d) = random_write(&mut rng, geo);
        good.write(a, &d);
        bad.write(a, &d);
    }
    let r1 = good.checkpoint(10, vec![]);
    assert_eq!(bad.checkpoint(10, vec![]), r1);
    good.commit_base(10);
    good.write_commits().unwrap();
    bad.commit_base(10);
    bad.write_commits().unwrap();
    // Silent corruption of two durable pages at the bad replica, found by a check.
    bad_store.corrupt(3, 5, b"xx");
    bad_store.corrupt(17, 0, b"y");
    let mut bad = PagedState::open(Box::new(bad_store.clone()), b"").unwrap();
    let report = bad.check();
    assert_eq!(report.corrupt, vec![3, 17]);
    assert!(bad.needs_repair());
    assert_ne!(bad.installed_root(), r1);
    // A walk from the root fetches exactly the corrupt pages.
    let depth = geo.depth();
    let mut todo = vec![(0u8, 0u64)];
    let mut fetched = Vec::new();
    while let Some((l, i)) = todo.pop() {
        for (c, e) in good.children_at(10, (l, i), 0).unwrap() {
            if bad.entry((l + 1, c)).unwrap() == e {
                continue;
            }
            if l + 1 == depth {
                let (e, bytes) = good.verified_page_at(10, c).unwrap();
                assert_eq!(page_digest(c, e.lm, &bytes), e.digest);
                bad.install_page(c, e, &bytes);
                fetched.push(c);
            } else {
                todo.push((l + 1, c));
            }
        }
    }
    fetched.sort();
    assert_eq!(fetched, vec![3, 17]);
    assert_eq!(bad.installed_root(), r1);
    bad.adopt_installed(10, vec![]);
    bad.write_commits().unwrap();
    assert!(!bad.needs_repair());
    let reopened = PagedState::open(Box::new(bad_store), b"").unwrap();
    assert_eq!(reopened.root(), r1);
}

/// A small in-memory state whose page 1 holds "data", committed to its store at checkpoint 1.
fn data_in_page_one_committed() -> (MemStore, PagedState) {
    let geo = Geometry::new(64, 8, 2).unwrap();
    let store = MemStore::new(geo);
    let mut st = PagedState::open(Box::new(store.clone()), b"").unwrap();
    st.write(64, b"data");
    st.checkpoint(1, vec![]);
    st.commit_base(1);
    st.write_commits().unwrap();
    (store, st)
}

#[test]
fn a_replier_never_serves_a_corrupt_page() {
    let (store, mut st) = data_in_page_one_committed();
    store.corrupt(1, 0, b"X");
    assert!(st.verified_page_at(1, 1).is_none());
    assert!(st.needs_repair());
    assert!(st.verified_page_at(1, 2).is_some());
}

/// A page read into the cache, flipped on the medium, then written (dirty): its saved
/// pre-image comes from the cache and is fine, but a rollback drops the page from memory and
/// reads the medium again. The check must look at the medium too (it did not: simulator seed
/// 5250 with --all-optimizations).
#[test]
fn a_check_sees_the_medium_under_a_dirty_page_cached_before_it_was_flipped() {
    let (store, mut st) = data_in_page_one_committed();
    let mut b = [0u8; 4];
    st.read(64, &mut b);
    store.corrupt(1, 0, b"X");
    st.write(65, b"!");
    assert_eq!(st.check().corrupt, vec![1], "the medium's copy is corrupt");
    assert!(st.needs_repair());
}

#[test]
fn reads_come_through_the_page_cache_and_checks_see_the_medium() {
    let (store, mut st) = data_in_page_one_committed();
    let mut b = [0u8; 4];
    st.read(64, &mut b);
    st.read(64, &mut b);
    assert_eq!(&b, b"data");
    let (hits, misses) = st.page_cache_stats();
    assert!(hits >= 1 && misses >= 1, "{hits} hits, {misses} misses");
    // The medium flips a byte of the cached page: reads keep the copy, a check does not.
    store.corrupt(1, 0, b"X");
    st.read(64, &mut b);
    assert_eq!(&b, b"data");
    assert_eq!(st.check().corrupt, vec![1], "the check reads the medium");
    // New base bytes replace the cached ones.
    st.write(64, b"more");
    st.checkpoint(2, vec![]);
    st.commit_base(2);
    st.write_commits().unwrap();
    st.read(64, &mut b);
    assert_eq!(&b, b"more");
    // Without a cache every read goes to the store.
    st.set_page_cache_bytes(0);
    let before = st.page_cache_stats();
    st.read(0, &mut b);
    st.read(0, &mut b);
    let after = st.page_cache_stats();
    assert_eq!((after.0 - before.0, after.1 - before.1), (0, 2));
}

/// Moving the base writes nothing: the commit goes to the host, which writes it to its own
/// handle on the store; until then the state reads the new base pages from the commit.
#[test]
fn a_commit_is_written_by_the_host_and_read_from_memory_until_then() {
    let geo = Geometry::new(64, 8, 2).unwrap();
    let store = MemStore::new(geo);
    let mut st = PagedState::open(Box::new(store.clone()), b"").unwrap();
    st.write(64, b"data");
    st.checkpoint(1, b"aux1".to_vec());
    st.commit_base(1);
    let before = store.commits();
    let commits = st.take_commits();
    assert_eq!(commits.len(), 1);
    assert_eq!(commits[0].seq, 1);
    assert_eq!(store.commits(), before, "the state wrote to its store");
    // The state's view of the base is already checkpoint 1, read from the commit.
    st.set_page_cache_bytes(0);
    let mut b = [0u8; 4];
    st.read(64, &mut b);
    assert_eq!(&b, b"data");
    assert_eq!(st.check().corrupt, Vec::<u64>::new());
    assert!(st.take_commits().is_empty(), "handed over once");
    // The host writes it through its own handle.
    let mut host = store.clone();
    commits[0].apply(&mut host).unwrap();
    st.commits_written();
    assert_eq!(st.unsynced_commits(), 0);
    st.read(64, &mut b);
    assert_eq!(&b, b"data");
    let reopened = PagedState::open(Box::new(store), b"").unwrap();
    assert_eq!(reopened.base_seq(), 1);
    assert_eq!(reopened.root(), st.root());
}

#[test]
fn a_store_with_its_auxiliary_bytes_inline_in_base_meta_still_opens() {
    // Stores written before the auxiliary-byte slots kept the bytes in `base.meta`.
    let geo = Geometry::new(128, 20, 4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_hello_at_five(dir.path(), geo);
    let body = postcard::to_stdvec(&(geo, 5u64, b"five".to_vec())).unwrap();
    let mut meta = b"RDSTATE1".to_vec();
    meta.extend_from_slice(&body);
    meta.extend_from_slice(&redoubt_crypto::Digest::of_parts("redoubt.state.meta.v1", &[&body]).0);
    std::fs::write(dir.path().join("base.meta"), meta).unwrap();
    for slot in ["aux.0", "aux.1"] {
        std::fs::remove_file(dir.path().join(slot)).unwrap();
    }
    let mut st =
        PagedState::open(Box::new(FileStore::open(dir.path(), geo).unwrap()), b"").unwrap();
    assert_eq!(st.base_seq(), 5);
    assert_eq!(&st.held(5).unwrap().1[..], b"five");
    // The next commit moves it to the current format.
    st.write(0, b"again");
    st.checkpoint(9, b"nine".to_vec());
    st.commit_base(9);
    st.write_commits().unwrap();
    drop(st);
    let st = PagedState::open(Box::new(FileStore::open(dir.path(), geo).unwrap()), b"").unwrap();
    assert_eq!(st.base_seq(), 9);
    assert_eq!(&st.held(9).unwrap().1[..], b"nine");
    let mut b = [0u8; 5];
    st.read(0, &mut b);
    assert_eq!(&b, b"again");
}
