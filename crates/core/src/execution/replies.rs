//! The exactly-once table (per client, its last executed request and result) and the
//! auxiliary bytes that carry it, with the agreed clock, in every checkpoint (PBFT §4.2: the
//! last replies are part of the state, so exactly-once execution survives state transfer).
//!
//! A checkpoint's digest covers these bytes through [`aux_digest`], which is built from each
//! client's result digest rather than from the bytes as one string: the table keeps the
//! result digests and recomputes only those of the entries changed since the last checkpoint,
//! so a checkpoint hashes what changed, not every client's last result again (with 1,000
//! clients holding 4 KiB results, 4 MiB at every checkpoint). The bytes themselves are one
//! canonical encoding ([`decode`] refuses any other), encoded without copying the results
//! first, written whole to the page store and served whole by state transfer.
//!
//! Bounds: one entry, and one result digest, per client that ever had a request executed
//! (client ids are configured).

use crate::types::{ClientId, Seq};
use redoubt_crypto::{Digest, DigestBuilder};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A client's last executed request and its result (the exactly-once table's entry).
#[derive(Clone, Debug)]
pub(crate) struct LastReply {
    pub(crate) timestamp: u64,
    pub(crate) result: Vec<u8>,
}

/// The exactly-once table, with the result digests checkpoints are made of.
#[derive(Default)]
pub(crate) struct Replies {
    entries: BTreeMap<ClientId, LastReply>,
    /// Digest of each entry's result: current for every client not in `stale`.
    digests: BTreeMap<ClientId, Digest>,
    /// Clients whose entry changed (or went) since their digest was computed.
    stale: BTreeSet<ClientId>,
    /// Mutant `stale-reply-digest`: a replaced entry is not marked stale.
    #[cfg(feature = "mutants")]
    pub(crate) keep_digest_on_replace: bool,
}

impl Replies {
    pub(crate) fn get(&self, c: &ClientId) -> Option<&LastReply> {
        self.entries.get(c)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ClientId, &LastReply)> {
        self.entries.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Sets client `c`'s entry; returns the one it replaces.
    pub(crate) fn insert(&mut self, c: ClientId, last: LastReply) -> Option<LastReply> {
        let old = self.entries.insert(c, last);
        #[cfg(feature = "mutants")]
        if self.keep_digest_on_replace && old.is_some() {
            return old;
        }
        self.stale.insert(c);
        old
    }

    pub(crate) fn remove(&mut self, c: &ClientId) {
        self.stale.insert(*c);
        self.entries.remove(c);
    }

    /// The digest of the auxiliary bytes [`Replies::aux`] encodes for checkpoint `seq`,
    /// hashing only the results that changed since it was last asked.
    pub(crate) fn aux_digest(&mut self, seq: Seq, last_time_ms: u64, eligible: &[Seq]) -> Digest {
        for c in std::mem::take(&mut self.stale) {
            match self.entries.get(&c) {
                Some(l) => {
                    self.digests.insert(c, result_digest(&l.result));
                }
                None => {
                    self.digests.remove(&c);
                }
            }
        }
        let mut b = DigestBuilder::new("redoubt.checkpoint.aux.v1");
        b.u64(seq).u64(last_time_ms).u64(eligible.len() as u64);
        for e in eligible {
            b.u64(*e);
        }
        b.u64(self.entries.len() as u64);
        for (c, l) in &self.entries {
            b.u64(*c).u64(l.timestamp).digest(&self.digests[c]);
        }
        b.finish()
    }

    /// The auxiliary bytes of checkpoint `seq` (see the module documentation).
    pub(crate) fn aux(&self, seq: Seq, last_time_ms: u64, eligible: &[Seq]) -> Vec<u8> {
        postcard::to_stdvec(&AuxOut {
            seq,
            last_time_ms,
            clients: self
                .entries
                .iter()
                .map(|(c, l)| (*c, l.timestamp, serde_bytes::Bytes::new(&l.result)))
                .collect(),
            eligible,
        })
        .expect("checkpoint encodes")
    }
}

/// The encoding of the auxiliary bytes, borrowed (the results are not copied to encode them).
/// Same wire format as [`AuxIn`]: postcard encodes a byte string and a sequence of bytes alike.
#[derive(Serialize)]
struct AuxOut<'a> {
    seq: Seq,
    last_time_ms: u64,
    clients: Vec<(ClientId, u64, &'a serde_bytes::Bytes)>,
    /// Prime: per originator, the last PO-REQUEST executed (empty in PBFT).
    eligible: &'a [Seq],
}

#[derive(Deserialize)]
struct AuxIn {
    seq: Seq,
    last_time_ms: u64,
    clients: Vec<(ClientId, u64, serde_bytes::ByteBuf)>,
    eligible: Vec<Seq>,
}

/// What a checkpoint's auxiliary bytes hold.
pub(crate) struct Aux {
    pub(crate) seq: Seq,
    pub(crate) last_time_ms: u64,
    pub(crate) replies: Replies,
    pub(crate) eligible: Vec<Seq>,
}

/// Decodes auxiliary bytes, refusing any but the canonical encoding of what they hold
/// (clients in increasing order, each once, nothing after): bytes that decode are exactly the
/// bytes every correct replica writes for the same checkpoint.
pub(crate) fn decode(aux: &[u8]) -> Result<Aux, String> {
    let st: AuxIn = postcard::from_bytes(aux).map_err(|e| format!("auxiliary bytes: {e}"))?;
    let mut replies = Replies::default();
    for (c, timestamp, result) in st.clients {
        replies.insert(
            c,
            LastReply {
                timestamp,
                result: result.into_vec(),
            },
        );
    }
    if replies.aux(st.seq, st.last_time_ms, &st.eligible) != aux {
        return Err("auxiliary bytes are not in canonical form".into());
    }
    Ok(Aux {
        seq: st.seq,
        last_time_ms: st.last_time_ms,
        replies,
        eligible: st.eligible,
    })
}

/// The digest a checkpoint's digest covers for its auxiliary bytes `aux`: equal to
/// [`Replies::aux_digest`] of the table that encoded them. Bytes that do not decode get a
/// digest of their own, which no decodable bytes share.
pub(crate) fn aux_digest(aux: &[u8]) -> Digest {
    match decode(aux) {
        Ok(mut a) => a.replies.aux_digest(a.seq, a.last_time_ms, &a.eligible),
        Err(_) => DigestBuilder::new("redoubt.checkpoint.aux.malformed.v1")
            .long_bytes(aux)
            .finish(),
    }
}

/// The auxiliary bytes of checkpoint 0 (no client executed anything yet, clock at 0).
pub(crate) fn initial_aux() -> Vec<u8> {
    Replies::default().aux(0, 0, &[])
}

fn result_digest(result: &[u8]) -> Digest {
    DigestBuilder::new("redoubt.checkpoint.result.v1")
        .long_bytes(result)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(ts: u64, len: usize) -> LastReply {
        LastReply {
            timestamp: ts,
            result: vec![ts as u8; len],
        }
    }

    #[test]
    fn the_incremental_digest_is_the_digest_of_the_bytes() {
        let mut t = Replies::default();
        assert_eq!(t.aux_digest(0, 0, &[]), aux_digest(&initial_aux()));
        // Entries set, replaced, removed between checkpoints; results short and long (hashed
        // on their own past LONG_BYTES).
        // (client, Some((timestamp, result length)) to set, None to remove)
        type Change = (ClientId, Option<(u64, usize)>);
        let steps: [&[Change]; 4] = [
            &[(3, Some((1, 10))), (9, Some((1, 5000)))],
            &[(3, Some((2, 0))), (1, Some((1, 3000)))],
            &[(9, None), (2, Some((7, 1)))],
            &[],
        ];
        for (i, step) in steps.iter().enumerate() {
            for (c, e) in step.iter() {
                match e {
                    Some((ts, len)) => {
                        t.insert(*c, reply(*ts, *len));
                    }
                    None => t.remove(c),
                }
            }
            let seq = i as u64 * 16;
            let eligible = vec![i as u64; i];
            let bytes = t.aux(seq, 100 + i as u64, &eligible);
            assert_eq!(
                t.aux_digest(seq, 100 + i as u64, &eligible),
                aux_digest(&bytes),
                "step {i}"
            );
            let back = decode(&bytes).unwrap();
            assert_eq!((back.seq, back.last_time_ms), (seq, 100 + i as u64));
            assert_eq!(back.replies.len(), t.len());
        }
    }

    #[test]
    fn the_digest_covers_every_field() {
        let mut t = Replies::default();
        t.insert(4, reply(1, 8));
        let base = t.aux_digest(16, 5, &[2]);
        assert_ne!(base, t.aux_digest(32, 5, &[2]), "seq");
        assert_ne!(base, t.aux_digest(16, 6, &[2]), "clock");
        assert_ne!(base, t.aux_digest(16, 5, &[3]), "eligible");
        t.insert(4, reply(2, 8));
        assert_ne!(base, t.aux_digest(16, 5, &[2]), "timestamp");
        t.insert(
            4,
            LastReply {
                timestamp: 1,
                result: vec![9; 8],
            },
        );
        assert_ne!(base, t.aux_digest(16, 5, &[2]), "result");
        t.insert(4, reply(1, 8));
        assert_eq!(base, t.aux_digest(16, 5, &[2]), "back as it was");
    }

    #[test]
    fn only_the_canonical_encoding_decodes() {
        let mut t = Replies::default();
        t.insert(1, reply(1, 3));
        t.insert(2, reply(1, 3));
        let good = t.aux(16, 5, &[]);
        assert!(decode(&good).is_ok());
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(decode(&trailing).is_err());
        assert_ne!(aux_digest(&trailing), aux_digest(&good));
        // The same entries in the other order, and one twice.
        let encode = |clients: Vec<(u64, u64, Vec<u8>)>| {
            postcard::to_stdvec(&(16u64, 5u64, clients, Vec::<u64>::new())).unwrap()
        };
        assert!(decode(&encode(vec![(2, 1, vec![1; 3]), (1, 1, vec![1; 3])])).is_err());
        assert!(decode(&encode(vec![(1, 1, vec![1; 3]), (1, 1, vec![1; 3])])).is_err());
        // The wire format is the plain one (a sequence of bytes encodes like a byte string),
        // so checkpoints stored before still decode.
        assert_eq!(encode(vec![(1, 1, vec![1; 3]), (2, 1, vec![1; 3])]), good);
    }
}
