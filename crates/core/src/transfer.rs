//! Page-level state transfer, fetching side (BFT-PR §4.6.2).
//!
//! A [`Walk`] fetches checkpoint `seq` whose digest is known. It starts at the root, whose
//! META-DATA is checked against the checkpoint digest (root digest and auxiliary bytes), and
//! recurses only into partitions whose entry differs from the local one; each META-DATA and
//! DATA answer is checked against an entry learned from an already checked parent, so the
//! answers of a single (designated) replier are enough and any wrong answer is detected. A
//! META-DATA answer leaves out children not modified after the `lc` the asker named; the walk
//! fills them in from its own entries, and if the digest then does not match (its own copy was
//! not what it believed), it asks again with `lc = 0`.
//!
//! Concurrent execution and garbage collection at the other replicas are handled by moving
//! the walk to a newer checkpoint when the old one is gone (see `docs/adr/0004-state.md`):
//! pages already installed are kept wherever their entry at the new checkpoint is unchanged.

use std::collections::BTreeMap;

use redoubt_crypto::{Digest, DigestBuilder};
use redoubt_state::{meta_digest, page_digest, Entry, NodeId, PagedState};

use crate::message::{ChildEntry, FetchItem, Reject, StateData, StateItem};
use crate::types::Seq;

/// The digest of checkpoint `seq`: the partition tree's root and the digest of the auxiliary
/// bytes (the replica's reply table and agreed clock, see
/// [`crate::execution::aux_digest`]) together.
pub fn checkpoint_digest(seq: Seq, root: &Digest, aux_digest: &Digest) -> Digest {
    DigestBuilder::new("redoubt.checkpoint.v3")
        .u64(seq)
        .digest(root)
        .digest(aux_digest)
        .finish()
}

/// The digest of checkpoint `seq` whose state has root `root` and auxiliary bytes `aux`: what
/// replicas agree on in CHECKPOINT messages ([`checkpoint_digest`] of the bytes' digest).
pub fn checkpoint_digest_of(seq: Seq, root: &Digest, aux: &[u8]) -> Digest {
    checkpoint_digest(seq, root, &crate::execution::aux_digest(aux))
}

/// Counters of one transfer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStats {
    pub metas: u64,
    pub pages: u64,
    pub page_bytes: u64,
    pub refetched_full: u64,
}

/// Recomputes a meta-data partition's entry from an answer, filling in the children it left
/// out from `local`. Returns `None` if the answer is malformed (children out of range, not
/// ascending, or at or below `lc`) or, with `lc == 0`, incomplete.
pub(crate) fn rebuild_meta(
    state: &mut PagedState,
    id: NodeId,
    lc: Seq,
    children: &[ChildEntry],
) -> Option<(Entry, BTreeMap<u64, Entry>)> {
    let geo = state.geometry();
    if id.0 >= geo.depth() || !geo.contains(id.0, id.1) {
        return None;
    }
    let range = geo.children(id.0, id.1);
    let mut given = BTreeMap::new();
    let mut prev: Option<u64> = None;
    for c in children {
        if !range.contains(&c.index) || prev.is_some_and(|p| p >= c.index) || (lc > 0 && c.lm <= lc)
        {
            return None;
        }
        prev = Some(c.index);
        given.insert(
            c.index,
            Entry {
                lm: c.lm,
                digest: c.digest,
            },
        );
    }
    let mut full = Vec::with_capacity((range.end - range.start) as usize);
    for c in range {
        match given.get(&c) {
            Some(e) => full.push(*e),
            None if lc > 0 => full.push(state.entry((id.0 + 1, c))?),
            None => return None,
        }
    }
    let lm = full.iter().map(|e| e.lm).max().unwrap_or(0);
    let digest = meta_digest(id.0, id.1, lm, full.iter());
    Some((Entry { lm, digest }, given))
}

/// The fetching side of one transfer.
#[derive(Clone, Debug)]
pub(crate) struct Walk {
    pub seq: Seq,
    pub digest: Digest,
    /// Entries the source holds at `seq`, learned from checked parents.
    expected: BTreeMap<NodeId, Entry>,
    /// Partitions to ask for, with the `lc` to ask with.
    todo: BTreeMap<NodeId, Seq>,
    /// Asked for and not yet answered.
    asked: BTreeMap<NodeId, Seq>,
    aux: Option<Vec<u8>>,
    pub stats: WalkStats,
}

impl Walk {
    pub fn new(seq: Seq, digest: Digest, root_lc: Seq) -> Walk {
        Walk {
            seq,
            digest,
            expected: BTreeMap::new(),
            todo: BTreeMap::from([((0, 0), root_lc)]),
            asked: BTreeMap::new(),
            aux: None,
            stats: WalkStats::default(),
        }
    }

    /// Moves up to `max` partitions from the to-do list to the asked list.
    pub fn next_items(&mut self, max: usize) -> Vec<FetchItem> {
        let take: Vec<(NodeId, Seq)> = self.todo.iter().take(max).map(|(k, v)| (*k, *v)).collect();
        take.into_iter()
            .map(|(id, lc)| {
                self.todo.remove(&id);
                self.asked.insert(id, lc);
                FetchItem {
                    level: id.0,
                    index: id.1,
                    lc,
                }
            })
            .collect()
    }

    /// Everything asked and not answered goes back on the to-do list (a retry).
    pub fn requeue(&mut self) {
        let asked = std::mem::take(&mut self.asked);
        self.todo.extend(asked);
    }

    pub fn has_todo(&self) -> bool {
        !self.todo.is_empty()
    }

    /// All partitions that differed are installed.
    pub fn is_complete(&self) -> bool {
        self.aux.is_some() && self.todo.is_empty() && self.asked.is_empty()
    }

    pub fn aux(&self) -> Option<&[u8]> {
        self.aux.as_deref()
    }

    /// Applies an answer. Items that check out are installed (pages) or expand the walk
    /// (META-DATA); the first item that fails its check makes the whole answer count as
    /// wrong (`Err(BadState)`): the sender is avoided and what is still asked is asked again
    /// elsewhere. `lc_for` gives the `lc` to ask children with.
    pub fn accept(
        &mut self,
        state: &mut PagedState,
        data: &StateData,
        lc_for: Seq,
        check_pages: bool,
    ) -> Result<usize, Reject> {
        if data.seq != self.seq {
            return Err(Reject::Stale);
        }
        let geo = state.geometry();
        let depth = geo.depth();
        let mut applied = 0;
        for item in &data.items {
            match item {
                StateItem::Meta {
                    level,
                    index,
                    children,
                } => {
                    let id = (*level, *index);
                    let Some(&lc) = self.asked.get(&id) else {
                        continue; // duplicate or unasked: ignore
                    };
                    let rebuilt = rebuild_meta(state, id, lc, children);
                    let ok = match &rebuilt {
                        None => false,
                        Some((e, _)) if id == (0, 0) => data.aux.as_ref().is_some_and(|aux| {
                            checkpoint_digest_of(self.seq, &e.digest, aux) == self.digest
                        }),
                        Some((e, _)) => self.expected.get(&id) == Some(e),
                    };
                    if !ok {
                        if lc > 0 && rebuilt.is_some() {
                            // Our own copy of an unmodified child was not what we believed:
                            // ask for every child.
                            self.asked.remove(&id);
                            self.todo.insert(id, 0);
                            self.stats.refetched_full += 1;
                            continue;
                        }
                        self.requeue();
                        return Err(Reject::BadState);
                    }
                    let (_, given) = rebuilt.expect("checked");
                    self.asked.remove(&id);
                    self.expected.remove(&id);
                    if id == (0, 0) {
                        self.aux = data.aux.clone();
                    }
                    self.stats.metas += 1;
                    for (c, e) in given {
                        let child = (id.0 + 1, c);
                        if state.entry(child) != Some(e) {
                            self.expected.insert(child, e);
                            self.todo
                                .insert(child, if child.0 == depth { 0 } else { lc_for });
                        }
                    }
                    applied += 1;
                }
                StateItem::Page { index, lm, bytes } => {
                    let id = (depth, *index);
                    if !self.asked.contains_key(&id) {
                        continue;
                    }
                    let Some(e) = self.expected.get(&id).copied() else {
                        continue;
                    };
                    if bytes.len() != geo.page_size()
                        || (check_pages
                            && (*lm != e.lm || page_digest(*index, *lm, bytes) != e.digest))
                    {
                        self.requeue();
                        return Err(Reject::BadState);
                    }
                    state.install_page(*index, e, bytes);
                    self.asked.remove(&id);
                    self.expected.remove(&id);
                    self.stats.pages += 1;
                    self.stats.page_bytes += bytes.len() as u64;
                    applied += 1;
                }
            }
        }
        Ok(applied)
    }
}

/// Seals `data`'s auxiliary bytes and items in place under the asker's state-session `key`
/// (confidential bodies: pages never leave a node in clear). The nonce is unique per answer
/// under the key: the sender's id and fresh `entropy` (two repliers, or one asked twice, may
/// answer one FETCH differently).
pub(crate) fn seal_answer(
    key: &redoubt_crypto::body::BodyKey,
    sender: u32,
    entropy: u64,
    data: &mut crate::message::StateData,
) {
    use redoubt_crypto::body::Direction;
    let plain = postcard::to_stdvec(&(data.aux.take(), std::mem::take(&mut data.items)))
        .expect("state items encode");
    let counter = ((sender as u64) << 56) | (entropy & ((1 << 56) - 1));
    let mut sealed = counter.to_le_bytes().to_vec();
    sealed.extend_from_slice(&key.seal(
        Direction::State,
        counter,
        &state_aad(data.seq, data.stable),
        &plain,
    ));
    data.sealed = Some(sealed);
}

/// Opens a sealed answer in place under our state-session `key`; an unsealed one is refused.
pub(crate) fn open_answer(
    key: &redoubt_crypto::body::BodyKey,
    d: &mut crate::message::StateData,
) -> Result<(), crate::message::Reject> {
    use crate::message::{Reject, StateItem};
    use redoubt_crypto::body::Direction;
    let sealed = d.sealed.take().ok_or(Reject::BadState)?;
    if sealed.len() < 8 {
        return Err(Reject::BadState);
    }
    let counter = u64::from_le_bytes(sealed[..8].try_into().expect("8 bytes"));
    let plain = key
        .open(
            Direction::State,
            counter,
            &state_aad(d.seq, d.stable),
            &sealed[8..],
        )
        .ok_or(Reject::BadState)?;
    let (aux, items): (Option<Vec<u8>>, Vec<StateItem>) =
        postcard::from_bytes(&plain).map_err(|_| Reject::BadState)?;
    d.aux = aux;
    d.items = items;
    Ok(())
}

/// What a sealed state answer's ciphertext is bound to besides its key and nonce.
fn state_aad(seq: Seq, stable: Seq) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..8].copy_from_slice(&seq.to_le_bytes());
    a[8..].copy_from_slice(&stable.to_le_bytes());
    a
}
