//! Messages of the privacy firewall (Yin et al. 2003 §4; `crate::filter`). Everything that
//! crosses the firewall authenticates itself: agreement nodes sign their pieces of agreement
//! certificates ([`SignedOrder`]), and execution nodes' replies and checkpoints cross only as
//! threshold signatures of g+1 of them ([`ReplyCert`], [`StableCert`]), whose encoding is
//! unique. Filters pass reply certificates down with their vouch ([`VouchedCert`]), signed
//! with their filter key, so that those below need not check the threshold signature again.

use super::Order;
use crate::types::{ClientId, ExecutorId, ReplicaId, Seq, View};
use redoubt_crypto::pk::Signature;
use redoubt_crypto::threshold::ThresholdSig;
use redoubt_crypto::{Digest, DigestBuilder};
use serde::{Deserialize, Serialize};

/// An agreement node's piece of an agreement certificate ([`Order`]), signed with its order
/// key instead of a MAC authenticator: filters and execution nodes check it alike, whichever
/// filter passed it on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedOrder {
    pub order: Order,
    pub signature: Signature,
}

impl SignedOrder {
    /// What the signature covers: the piece without its body (the body is checked against
    /// the digest).
    pub fn statement(o: &Order) -> Digest {
        order_statement(o.replica, o.view, o.seq, &o.digest)
    }
}

pub fn order_statement(replica: ReplicaId, view: View, seq: Seq, digest: &Digest) -> Digest {
    DigestBuilder::new("redoubt.firewall.order.v1")
        .u64(replica as u64)
        .u64(view)
        .u64(seq)
        .digest(digest)
        .finish()
}

/// One client's reply in a batch's bundle. `result` is sealed for the client when bodies are
/// sealed (deterministically: every correct execution node computes the same bytes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyEntry {
    pub client: ClientId,
    pub timestamp: u64,
    #[serde(with = "serde_bytes")]
    pub result: Vec<u8>,
}

impl ReplyEntry {
    /// The entry's leaf in the bundle statement.
    pub fn leaf(&self) -> Digest {
        DigestBuilder::new("redoubt.firewall.reply-entry.v1")
            .u64(self.client)
            .u64(self.timestamp)
            .long_bytes(&self.result)
            .finish()
    }
}

/// The replies of the batch at `seq`, in the batch's order: what the execution nodes vouch
/// for together, once per batch (the paper's bundles, §4.7). A batch with no reply (the
/// null request, or only requests already answered) has an empty bundle, still signed: its
/// certificate tells the agreement nodes the batch ran. No view: execution nodes learn a
/// batch's view from whichever pieces certify it, so it is not theirs to agree on (the
/// agreement node that passes a reply on names its own view, a hint for the client).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyBundle {
    pub seq: Seq,
    pub entries: Vec<ReplyEntry>,
}

impl ReplyBundle {
    pub fn leaves(&self) -> Vec<Digest> {
        self.entries.iter().map(ReplyEntry::leaf).collect()
    }
    /// The statement the execution nodes sign.
    pub fn statement(&self) -> Digest {
        bundle_statement(self.seq, &self.leaves())
    }
}

pub fn bundle_statement(seq: Seq, leaves: &[Digest]) -> Digest {
    let mut b = DigestBuilder::new("redoubt.firewall.bundle.v1");
    b.u64(seq).u64(leaves.len() as u64);
    for l in leaves {
        b.digest(l);
    }
    b.finish()
}

/// The statement of an execution checkpoint certificate: g+1 execution nodes hold a stable
/// checkpoint at `seq` (no state digest: it would tell those outside something about the
/// state).
pub fn stable_statement(seq: Seq) -> Digest {
    DigestBuilder::new("redoubt.firewall.stable.v1")
        .u64(seq)
        .finish()
}

/// An execution node's signature share on a bundle, to the top row of filters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyShare {
    pub executor: ExecutorId,
    pub bundle: ReplyBundle,
    pub share: ThresholdSig,
}

/// A reply certificate: a bundle and the execution cluster's threshold signature on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyCert {
    pub bundle: ReplyBundle,
    pub signature: ThresholdSig,
}

/// An execution node's signature share on [`stable_statement`] for its stable checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StableShare {
    pub executor: ExecutorId,
    pub seq: Seq,
    pub share: ThresholdSig,
}

/// A reply certificate as a filter passes it down (to the row below, or from the bottom row
/// to the agreement nodes), with its vouch: its signature with its filter key on
/// [`VouchedCert::statement`]. A correct filter vouches only for a certificate it took in (its
/// threshold signature checked, or the vouches of every filter of the row above), and at most
/// h filters are faulty: the vouches of the h+1 filters of one row stand for the signature
/// (`crate::filter::vouch`). Who vouched is the frame's sender, checked by the signature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VouchedCert {
    pub cert: ReplyCert,
    pub vouch: Signature,
}

impl VouchedCert {
    /// What a vouch covers: everything a certificate's validity depends on (a certificate
    /// with the right bundle under a wrong signature is another certificate).
    pub fn statement(seq: Seq, bundle_statement: &Digest, signature: &ThresholdSig) -> Digest {
        DigestBuilder::new("redoubt.firewall.vouch.v1")
            .u64(seq)
            .digest(bundle_statement)
            .bytes(&signature.0)
            .finish()
    }
}

/// An execution checkpoint certificate: g+1 execution nodes hold a stable checkpoint at
/// `seq` (agreement nodes collect garbage below it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StableCert {
    pub seq: Seq,
    pub signature: ThresholdSig,
}

/// An agreement node to a client: the client's entry of a reply certificate, with the other
/// entries' leaves (digests only), which the client checks against the signature, and the
/// agreement node's view (outside the signature: a hint of the primary).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertifiedReply {
    pub view: View,
    pub seq: Seq,
    pub index: u32,
    pub leaves: Vec<Digest>,
    pub entry: ReplyEntry,
    pub signature: ThresholdSig,
    /// The entry's result is the entry's leaf (32 bytes), not the result: a copy from a replica
    /// other than the designated one, which the client counts for its match only (as PBFT's
    /// digest replies). Such a copy carries no leaves.
    pub digest_only: bool,
}

impl CertifiedReply {
    /// Cuts a client's reply out of a certificate; `None` if `index` is out of range.
    pub fn of(
        cert: &ReplyCert,
        leaves: &[Digest],
        index: usize,
        view: View,
    ) -> Option<CertifiedReply> {
        Some(CertifiedReply {
            view,
            seq: cert.bundle.seq,
            index: index as u32,
            leaves: leaves.to_vec(),
            entry: cert.bundle.entries.get(index)?.clone(),
            signature: cert.signature,
            digest_only: false,
        })
    }
    /// The digest the copies of one entry match on: the entry's leaf.
    pub fn entry_digest(&self) -> Option<Digest> {
        if !self.digest_only {
            return Some(self.entry.leaf());
        }
        let d: [u8; 32] = self.entry.result.as_slice().try_into().ok()?;
        Some(Digest(d))
    }
    /// The statement the signature must cover, if the entry is the leaf it claims to be.
    pub fn statement(&self) -> Option<Digest> {
        if self.digest_only {
            return None;
        }
        let leaf = self.leaves.get(self.index as usize)?;
        (*leaf == self.entry.leaf()).then(|| bundle_statement(self.seq, &self.leaves))
    }
}
