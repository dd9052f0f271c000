//! Snapshots: a stable checkpoint's service state in one file, for backups and for starting a
//! new cluster from it (`redoubt snapshot`, `redoubt init --from-snapshot`).
//!
//! A replica writes one on SIGUSR2 ([`Snapshot::take`], [`write_into`]): the checkpoint's
//! number and digest, its auxiliary bytes, every page's last-modified checkpoint and the bytes
//! of the pages that are not all zero. The file proves itself against the digest
//! ([`Snapshot::verify`] rebuilds the partition tree and the checkpoint digest the replicas
//! agreed on), so whoever vouches for the digest vouches for the file: `redoubt snapshot`
//! accepts a snapshot only once f+1 replicas report that digest for that checkpoint.
//!
//! Format: the 8 bytes `RDSNAP01`, a `u32` (LE) length and that many bytes of the postcard
//! [`Header`], then the non-zero pages' bytes in the order the header lists them. Reading
//! refuses a file whose parts do not add up.

use crate::status::{CheckpointSeen, SnapshotSeen};
use redoubt_core::state::{page_digest, root_of, Entry, FileStore, Geometry, PageStore};
use redoubt_core::{checkpoint_digest_of, open_state};
use redoubt_crypto::Digest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"RDSNAP01";
/// Largest header read back (bytes): the auxiliary bytes and one `u64` per page.
const HEADER_BYTES_MAX: usize = 1 << 30;
/// Snapshot files a replica keeps in its `snapshots` directory (the newest).
pub const SNAPSHOTS_KEPT: usize = 2;
/// Pages written to a new store per commit when a snapshot is installed.
const INSTALL_PAGES_PER_COMMIT: usize = 4096;

/// What a snapshot file says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// `[cluster] name` of the cluster it was taken from.
    pub cluster: String,
    /// `[state] service`: "kv", "sql" or "files".
    pub service: String,
    /// The checkpoint and its digest (as the replicas' CHECKPOINT messages carry it).
    pub seq: u64,
    pub digest: Digest,
    pub page_bytes: u32,
    pub pages: u64,
    pub fanout: u32,
    /// The checkpoint's auxiliary bytes (the reply table).
    pub aux: Vec<u8>,
    /// Each page's last-modified checkpoint, one per page.
    pub lms: Vec<u64>,
    /// The pages whose bytes follow, ascending; every other page is all zero.
    pub present: Vec<u64>,
}

/// A snapshot in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub header: Header,
    /// The bytes of the pages in `header.present`.
    pub pages: BTreeMap<u64, Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a redoubt snapshot: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error("{0}")]
    Invalid(String),
}

impl Snapshot {
    /// The state of checkpoint `seq` (digest `digest`), which `state` must hold.
    pub fn take(
        state: &redoubt_core::state::PagedState,
        seq: u64,
        digest: Digest,
        cluster: &str,
        service: &str,
    ) -> Result<Snapshot, String> {
        let geo = state.geometry();
        let (_, aux) = state
            .held(seq)
            .ok_or_else(|| format!("checkpoint {seq} is no longer held"))?;
        let mut lms = Vec::with_capacity(geo.pages() as usize);
        let mut pages = BTreeMap::new();
        for i in 0..geo.pages() {
            let (entry, bytes) = state
                .page_at(seq, i)
                .ok_or_else(|| format!("page {i} of checkpoint {seq} is not held"))?;
            lms.push(entry.lm);
            if bytes.iter().any(|b| *b != 0) {
                pages.insert(i, bytes);
            }
        }
        Ok(Snapshot {
            header: Header {
                cluster: cluster.into(),
                service: service.into(),
                seq,
                digest,
                page_bytes: geo.page_size() as u32,
                pages: geo.pages(),
                fanout: geo.fanout() as u32,
                aux: aux.to_vec(),
                lms,
                present: pages.keys().copied().collect(),
            },
            pages,
        })
    }

    /// The geometry of the state it holds.
    pub fn geometry(&self) -> Result<Geometry, String> {
        let h = &self.header;
        Geometry::new(h.page_bytes, h.pages, h.fanout)
    }

    /// The state's size in MiB, if whole.
    pub fn size_mib(&self) -> Option<u64> {
        let bytes = self
            .header
            .pages
            .checked_mul(u64::from(self.header.page_bytes))?;
        bytes.is_multiple_of(1 << 20).then_some(bytes >> 20)
    }

    /// Checks that the pages, their last-modified checkpoints and the auxiliary bytes make
    /// exactly the checkpoint digest the header names.
    pub fn verify(&self) -> Result<(), String> {
        let h = &self.header;
        let geo = self.geometry()?;
        if h.lms.len() as u64 != geo.pages() {
            return Err(format!(
                "{} last-modified entries for {} pages",
                h.lms.len(),
                geo.pages()
            ));
        }
        let zero = vec![0u8; geo.page_size()];
        let entries = h
            .lms
            .iter()
            .enumerate()
            .map(|(i, lm)| {
                let bytes = self.pages.get(&(i as u64)).unwrap_or(&zero);
                Entry {
                    lm: *lm,
                    digest: page_digest(i as u64, *lm, bytes),
                }
            })
            .collect();
        let root = root_of(geo, entries).ok_or("the page count does not fit the geometry")?;
        let digest = checkpoint_digest_of(h.seq, &root, &h.aux);
        if digest != h.digest {
            return Err(format!(
                "the pages make checkpoint digest {}, not the {} the file names",
                digest.short(),
                h.digest.short()
            ));
        }
        Ok(())
    }

    /// Writes the snapshot to `path` (through a temporary file in the same directory,
    /// synced, then renamed: a crash leaves the old file or the new one).
    pub fn write(&self, path: &Path) -> Result<u64, SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        };
        let header = postcard::to_stdvec(&self.header).map_err(|e| SnapshotError::Format {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let tmp = path.with_extension("tmp");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        f.write_all(MAGIC).map_err(io)?;
        f.write_all(&(header.len() as u32).to_le_bytes())
            .map_err(io)?;
        f.write_all(&header).map_err(io)?;
        for bytes in self.pages.values() {
            f.write_all(bytes).map_err(io)?;
        }
        let f = f.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        drop(f);
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(len)
    }

    /// Reads a snapshot file (without verifying it: see [`Snapshot::verify`]).
    pub fn read(path: &Path) -> Result<Snapshot, SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        };
        let bad = |reason: String| SnapshotError::Format {
            path: path.to_path_buf(),
            reason,
        };
        let mut f = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
        let mut magic = [0u8; 8];
        f.read_exact(&mut magic)
            .map_err(|_| bad("shorter than its magic".into()))?;
        if &magic != MAGIC {
            return Err(bad("wrong magic (not written by `redoubt snapshot`)".into()));
        }
        let mut len = [0u8; 4];
        f.read_exact(&mut len)
            .map_err(|_| bad("no header length".into()))?;
        let len = u32::from_le_bytes(len) as usize;
        if len > HEADER_BYTES_MAX {
            return Err(bad(format!("header of {len} bytes")));
        }
        let mut header = vec![0u8; len];
        f.read_exact(&mut header)
            .map_err(|_| bad("the header is cut short".into()))?;
        let header: Header =
            postcard::from_bytes(&header).map_err(|e| bad(format!("header: {e}")))?;
        let page_bytes = header.page_bytes as usize;
        if page_bytes == 0 || page_bytes > 1 << 20 {
            return Err(bad(format!("page size {page_bytes}")));
        }
        if !header.present.windows(2).all(|w| w[0] < w[1])
            || header.present.last().is_some_and(|p| *p >= header.pages)
        {
            return Err(bad(
                "the list of pages present is not ascending within the state".into(),
            ));
        }
        let mut pages = BTreeMap::new();
        for &i in &header.present {
            let mut bytes = vec![0u8; page_bytes];
            f.read_exact(&mut bytes)
                .map_err(|_| bad(format!("page {i} is cut short")))?;
            pages.insert(i, bytes);
        }
        if f.read(&mut [0u8; 1]).map_err(io)? != 0 {
            return Err(bad("bytes after the last page".into()));
        }
        Ok(Snapshot { header, pages })
    }

    /// Makes `state_dir` (a node's `home/state`, which must not hold a state yet) a page store
    /// at checkpoint 0 whose pages are this snapshot's: a new cluster starts from it. Each
    /// page is last modified at 0 and the reply table starts empty (the new cluster's clients
    /// have no history in it).
    pub fn install(&self, state_dir: &Path) -> Result<(), String> {
        let geo = self.geometry()?;
        if state_dir.join("base.meta").exists() {
            return Err(format!(
                "{} already holds a state; a snapshot is installed only into a new home",
                state_dir.display()
            ));
        }
        let mut store = FileStore::open(state_dir, geo)
            .map_err(|e| format!("page store in {}: {e}", state_dir.display()))?;
        let state = open_state(Box::new(store.clone()))
            .map_err(|e| format!("page store in {}: {e}", state_dir.display()))?;
        let (_, aux) = state.held(0).ok_or("a new store holds checkpoint 0")?;
        drop(state);
        let pages: Vec<(u64, Entry, &[u8])> = self
            .pages
            .iter()
            .map(|(i, bytes)| {
                let entry = Entry {
                    lm: 0,
                    digest: page_digest(*i, 0, bytes),
                };
                (*i, entry, bytes.as_slice())
            })
            .collect();
        for chunk in pages.chunks(INSTALL_PAGES_PER_COMMIT) {
            let chunk: Vec<_> = chunk
                .iter()
                .map(|(index, entry, bytes)| redoubt_core::state::CommitPage {
                    index: *index,
                    entry: *entry,
                    bytes,
                })
                .collect();
            store
                .commit(0, &aux, &chunk)
                .map_err(|e| format!("writing pages into {}: {e}", state_dir.display()))?;
        }
        Ok(())
    }
}

/// Writes `snapshot` into `dir` as `snapshot-<seq>.rdsnap` and keeps only the
/// [`SNAPSHOTS_KEPT`] newest there; returns the file's path and length.
pub fn write_into(dir: &Path, snapshot: &Snapshot) -> Result<(PathBuf, u64), SnapshotError> {
    std::fs::create_dir_all(dir).map_err(|source| SnapshotError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(format!("snapshot-{}.rdsnap", snapshot.header.seq));
    let len = snapshot.write(&path)?;
    let mut kept: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|source| SnapshotError::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| {
            let p = e.ok()?.path();
            let seq = p
                .file_name()?
                .to_str()?
                .strip_prefix("snapshot-")?
                .strip_suffix(".rdsnap")?
                .parse()
                .ok()?;
            Some((seq, p))
        })
        .collect();
    kept.sort();
    let extra = kept.len().saturating_sub(SNAPSHOTS_KEPT);
    for (_, old) in kept.into_iter().take(extra) {
        let _ = std::fs::remove_file(old);
    }
    Ok((path, len))
}

/// Stable checkpoints a replica remembers for its status (the newest).
pub const STABLE_SEEN_MAX: usize = 256;

/// A replica's snapshots: where it writes them, and the stable checkpoints it reports.
pub(crate) struct Snapshots {
    dir: PathBuf,
    cluster: String,
    service: String,
    stable: std::collections::VecDeque<CheckpointSeen>,
    last: Option<SnapshotSeen>,
}

impl Snapshots {
    /// Snapshots written into `home/snapshots`.
    pub(crate) fn new(home: &Path, cluster: &str, service: &str) -> Snapshots {
        Snapshots {
            dir: home.join("snapshots"),
            cluster: cluster.into(),
            service: service.into(),
            stable: Default::default(),
            last: None,
        }
    }

    /// Checkpoint `seq` became stable with `digest`.
    pub(crate) fn stable(&mut self, seq: u64, digest: Digest) {
        if self.stable.back().is_some_and(|c| c.seq >= seq) {
            return;
        }
        if self.stable.len() == STABLE_SEEN_MAX {
            self.stable.pop_front();
        }
        self.stable.push_back(CheckpointSeen {
            seq,
            digest: digest.to_hex(),
        });
    }

    /// [`Snapshots::write`], logged for `node` (e.g. "replica 2"): the request, then the
    /// file written or why not.
    pub(crate) fn write_logged(
        &mut self,
        node: &str,
        state: &redoubt_core::state::PagedState,
        seq: u64,
        digest: Digest,
        now_ms: u64,
    ) {
        tracing::info!(
            node,
            seq,
            "writing a snapshot of the stable checkpoint (SIGUSR2)"
        );
        let seen = self.write(state, seq, digest, now_ms);
        match &seen.error {
            None => tracing::info!(
                node,
                seq,
                digest = %digest.short(),
                path = %seen.path,
                bytes = seen.bytes,
                took_ms = seen.took_ms,
                "snapshot written"
            ),
            Some(e) => tracing::warn!(node, seq, error = %e, "snapshot not written"),
        }
    }

    /// Writes a snapshot of stable checkpoint `seq` (`digest`) of `state`; what happened
    /// is reported in [`Snapshots::last`].
    pub(crate) fn write(
        &mut self,
        state: &redoubt_core::state::PagedState,
        seq: u64,
        digest: Digest,
        now_ms: u64,
    ) -> &SnapshotSeen {
        let started = std::time::Instant::now();
        let written = Snapshot::take(state, seq, digest, &self.cluster, &self.service)
            .and_then(|snap| write_into(&self.dir, &snap).map_err(|e| e.to_string()));
        let (path, bytes, error) = match written {
            Ok((path, bytes)) => (path.display().to_string(), bytes, None),
            Err(e) => (String::new(), 0, Some(e)),
        };
        self.last.insert(SnapshotSeen {
            asked_at_ms: now_ms,
            seq,
            digest: digest.to_hex(),
            path,
            bytes,
            took_ms: started.elapsed().as_millis() as u64,
            error,
        })
    }

    pub(crate) fn stable_seen(&self) -> Vec<CheckpointSeen> {
        self.stable.iter().cloned().collect()
    }

    pub(crate) fn last(&self) -> Option<SnapshotSeen> {
        self.last.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_core::state::{MemStore, StateWrite};

    /// A state with a few pages written and checkpointed at 7.
    fn state() -> (redoubt_core::state::PagedState, Digest) {
        let geo = Geometry::new(4096, 64, 4).unwrap();
        let mut s = open_state(Box::new(MemStore::new(geo))).unwrap();
        s.write(5000, b"hello snapshot");
        s.write(4096 * 40, &[7u8; 5000]);
        let aux = s.held(0).unwrap().1.to_vec();
        let root = s.checkpoint(7, aux.clone());
        (s, checkpoint_digest_of(7, &root, &aux))
    }

    #[test]
    fn a_snapshot_proves_itself_and_reads_back_as_written() {
        let (s, digest) = state();
        let snap = Snapshot::take(&s, 7, digest, "c", "kv").unwrap();
        assert_eq!(snap.header.present, vec![1, 40, 41]);
        snap.verify().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = write_into(dir.path(), &snap).unwrap();
        let back = Snapshot::read(&path).unwrap();
        assert_eq!(back, snap);
        back.verify().unwrap();
    }

    #[test]
    fn a_changed_page_lm_or_digest_fails_verification() {
        let (s, digest) = state();
        let snap = Snapshot::take(&s, 7, digest, "c", "kv").unwrap();
        let mut page = snap.clone();
        page.pages.get_mut(&40).unwrap()[3] ^= 1;
        assert!(page.verify().unwrap_err().contains("not the"));
        let mut lm = snap.clone();
        lm.header.lms[2] = 3;
        assert!(lm.verify().is_err());
        let mut named = snap.clone();
        named.header.digest = Digest::of(b"other");
        assert!(named.verify().is_err());
        let mut aux = snap;
        aux.header.aux.push(0);
        assert!(aux.verify().is_err());
    }

    #[test]
    fn a_cut_or_foreign_file_is_refused_with_the_reason() {
        let (s, digest) = state();
        let snap = Snapshot::take(&s, 7, digest, "c", "kv").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (path, len) = write_into(dir.path(), &snap).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..len as usize - 10]).unwrap();
        let e = Snapshot::read(&path).unwrap_err().to_string();
        assert!(e.contains("page 41 is cut short"), "{e}");
        std::fs::write(&path, b"RDJRNL02 something else").unwrap();
        let e = Snapshot::read(&path).unwrap_err().to_string();
        assert!(e.contains("wrong magic"), "{e}");
        let mut long = bytes.clone();
        long.push(0);
        std::fs::write(&path, &long).unwrap();
        let e = Snapshot::read(&path).unwrap_err().to_string();
        assert!(e.contains("after the last page"), "{e}");
    }

    #[test]
    fn only_the_newest_snapshots_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (s, digest) = state();
        let mut snap = Snapshot::take(&s, 7, digest, "c", "kv").unwrap();
        for seq in [3, 9, 12] {
            snap.header.seq = seq;
            write_into(dir.path(), &snap).unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["snapshot-12.rdsnap", "snapshot-9.rdsnap"]);
    }

    #[test]
    fn an_installed_snapshot_is_the_new_stores_state_at_checkpoint_zero() {
        let (s, digest) = state();
        let snap = Snapshot::take(&s, 7, digest, "c", "kv").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("state");
        snap.install(&state_dir).unwrap();
        let geo = snap.geometry().unwrap();
        let opened = open_state(Box::new(FileStore::open(&state_dir, geo).unwrap())).unwrap();
        assert_eq!(opened.latest(), 0);
        for i in 0..geo.pages() {
            let (entry, bytes) = opened.page_at(0, i).unwrap();
            assert_eq!(entry.lm, 0);
            let want = snap.pages.get(&i).cloned().unwrap_or(vec![0; 4096]);
            assert_eq!(bytes, want, "page {i}");
        }
        assert!(opened.verify().is_empty(), "every page matches its digest");
        let e = snap.install(&state_dir).unwrap_err();
        assert!(e.contains("already holds a state"), "{e}");
    }
}
