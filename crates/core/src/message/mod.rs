//! Protocol messages and their canonical wire encoding.
//!
//! Every message travels inside a [`Frame`]: version, claimed sender, the encoded body and an
//! authentication tag. The encoding is postcard (deterministic: the same message always
//! encodes to the same bytes), so a digest over the body bytes is the same on every replica.
//! Decoding never trusts a length field: frames larger than the configured maximum are
//! rejected before decoding, and postcard bounds allocations by the input length.

use crate::types::{ClientId, Principal, ReplicaId, Seq, View};
use bytes::Bytes;
use redoubt_crypto::{Digest, DigestBuilder, Mac, MAC_LEN};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

mod firewall;
mod frame;
mod prime;
mod separated;
mod table;
pub use firewall::*;
pub use frame::*;
pub use prime::*;
pub use separated::*;
pub use table::*;

/// Wire format version carried by every frame.
pub const WIRE_VERSION: u8 = 6;

/// The digest that stands for the null request in view changes.
pub const NULL_DIGEST: Digest = Digest::ZERO;

/// A client operation. `timestamp` is strictly increasing per client and gives exactly-once
/// semantics.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub client: ClientId,
    pub timestamp: u64,
    pub read_only: bool,
    /// The operation. Shared, not copied, when a request moves from the pool into a batch or
    /// into several messages.
    pub op: Bytes,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "req(c{} t{} {}B{})",
            self.client,
            self.timestamp,
            self.op.len(),
            if self.read_only { " ro" } else { "" }
        )
    }
}

impl Request {
    /// The request's digest (a long operation hashed on its own: see
    /// [`DigestBuilder::long_bytes`]).
    pub fn digest(&self) -> Digest {
        DigestBuilder::new("redoubt.request.v2")
            .u64(self.client)
            .u64(self.timestamp)
            .u64(self.read_only as u64)
            .long_bytes(&self.op)
            .finish()
    }

    /// `self == other`, without comparing the operations' bytes when both share one buffer
    /// (a request taken from the pool into a batch): comparing a large operation costs
    /// about as much as hashing it.
    pub fn same_as(&self, other: &Request) -> bool {
        self.client == other.client
            && self.timestamp == other.timestamp
            && self.read_only == other.read_only
            && (self.op.as_ptr() == other.op.as_ptr() && self.op.len() == other.op.len()
                || self.op == other.op)
    }
}

/// A request with the client's authenticator: one MAC per replica (indexed by replica id)
/// over the request digest. It carries its own authentication, so a backup can relay it to the
/// primary and the primary can piggyback it in a pre-prepare.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedRequest {
    pub request: Request,
    /// Shared: the primary keeps a request while it also travels in a batch.
    pub auth: std::sync::Arc<[Mac]>,
    /// The client's signature over the request digest (by its key holder), which every
    /// replica can check: clients add it when they retransmit, so a request whose MAC
    /// entries do not verify everywhere (a faulty client's, or a key not yet everywhere)
    /// still gets vouched for, and a client under suspicion must send it (see
    /// `Replica::suspects`). Not part of the request digest.
    pub sig: Option<RequestSig>,
}

/// A client's key-holder signature of a request: `holder_statement(Purpose::Request, client,
/// counter, request digest)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSig {
    pub counter: u64,
    pub sig: redoubt_crypto::pk::Signature,
}

/// Values the primary proposes for non-deterministic choices (PBFT §4.6): a timestamp and a
/// random seed. Replicas validate them deterministically at execution time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NonDet {
    pub time_ms: u64,
    pub seed: u64,
}

/// The requests ordered at one sequence number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub nondet: NonDet,
    pub requests: Vec<SignedRequest>,
    /// Prime: the summary matrix this proposal orders (ADR 0007); the requests it makes
    /// eligible are derived from it at execution time, and `requests` is empty. `None` in
    /// PBFT.
    pub matrix: Option<Arc<Matrix>>,
}

impl Batch {
    /// The batch digest covers the proposed values and the request digests (not the client
    /// authenticators, which differ per receiver and do not change what is executed).
    pub fn digest(&self) -> Digest {
        let request_digests: Vec<Digest> =
            self.requests.iter().map(|r| r.request.digest()).collect();
        self.digest_with(&request_digests)
    }

    /// The batch digest from request digests the caller already computed (one per request,
    /// in order), so a receiver hashes each request once for both the batch digest and the
    /// client authenticators.
    pub fn digest_with(&self, request_digests: &[Digest]) -> Digest {
        debug_assert_eq!(request_digests.len(), self.requests.len());
        match &self.matrix {
            None => Batch::digest_of(&self.nondet, request_digests),
            Some(m) => {
                let mut b = DigestBuilder::new("redoubt.batch.prime.v1");
                b.digest(&Batch::digest_of(&self.nondet, request_digests))
                    .digest(&m.digest());
                b.finish()
            }
        }
    }

    /// The digest of a batch with these non-deterministic choices and request digests (one
    /// per request, in order; the batch itself need not be at hand).
    pub fn digest_of(nondet: &NonDet, request_digests: &[Digest]) -> Digest {
        let mut b = DigestBuilder::new("redoubt.batch.v1");
        b.u64(nondet.time_ms)
            .u64(nondet.seed)
            .u64(request_digests.len() as u64);
        for d in request_digests {
            b.digest(d);
        }
        b.finish()
    }

    pub fn op_bytes(&self) -> usize {
        self.requests.iter().map(|r| r.request.op.len()).sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrePrepare {
    pub view: View,
    pub seq: Seq,
    pub digest: Digest,
    /// The batch, except the requests listed in `beside`.
    pub batch: Batch,
    /// Large requests that travel beside the pre-prepare (clients multicast them to every
    /// replica), named by client and digest, in increasing batch position. `digest` covers
    /// the whole batch with them in place.
    pub beside: Vec<Beside>,
}

/// A request of a batch that the pre-prepare names instead of carrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beside {
    /// Its position in the whole batch.
    pub index: u32,
    pub client: ClientId,
    pub digest: Digest,
}

impl PrePrepare {
    /// The whole batch, with each request named in `beside` taken from `lookup` (which must
    /// return the request of that client with that digest; the batch digest is checked
    /// against `digest` afterwards anyway); `None` if a request is missing or the positions
    /// are malformed.
    pub fn whole_batch(
        &self,
        mut lookup: impl FnMut(&Beside) -> Option<SignedRequest>,
    ) -> Option<Batch> {
        if self.beside.is_empty() {
            return Some(self.batch.clone());
        }
        let total = self.batch.requests.len() + self.beside.len();
        let mut requests = Vec::with_capacity(total);
        let mut inline = self.batch.requests.iter();
        let mut beside = self.beside.iter().peekable();
        for i in 0..total {
            match beside.peek() {
                Some(b) if b.index as usize == i => {
                    let r = lookup(b)?;
                    if r.request.client != b.client {
                        return None;
                    }
                    requests.push(r);
                    beside.next();
                }
                _ => requests.push(inline.next()?.clone()),
            }
        }
        if beside.next().is_some() || inline.next().is_some() {
            return None;
        }
        Some(Batch {
            nondet: self.batch.nondet,
            requests,
            matrix: self.batch.matrix.clone(),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepare {
    pub view: View,
    pub seq: Seq,
    pub digest: Digest,
    pub replica: ReplicaId,
    /// The positions in the batch of the requests this replica could not authenticate
    /// (strictly increasing; empty when it vouches for the whole batch). The vote still
    /// counts for the order; a request is prepared only if f+1 replicas of the certificate,
    /// the primary included, vouch for it (`quorum::prepared`).
    pub doubts: Vec<u16>,
}

/// Whether a PREPARE's doubts are well formed: strictly increasing positions inside a batch of
/// at most `batch_requests_max` requests.
pub fn doubts_well_formed(doubts: &[u16], batch_requests_max: usize) -> bool {
    doubts.len() <= batch_requests_max
        && doubts.windows(2).all(|w| w[0] < w[1])
        && doubts
            .last()
            .is_none_or(|i| (*i as usize) < batch_requests_max)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    pub view: View,
    pub seq: Seq,
    pub digest: Digest,
    pub replica: ReplicaId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub view: View,
    pub timestamp: u64,
    pub client: ClientId,
    pub replica: ReplicaId,
    /// With `digest_only`, the 32-byte digest of the result instead of the result (PBFT's
    /// digest replies: only the designated replier sends the result itself).
    pub digest_only: bool,
    /// The request executed tentatively (prepared, not yet committed): only 2f+1 matching
    /// replies make a certificate.
    pub tentative: bool,
    #[serde(with = "serde_bytes")]
    pub result: Vec<u8>,
}

impl Reply {
    /// The digest of the result this reply vouches for; `None` for a malformed digest reply.
    pub fn result_digest(&self) -> Option<Digest> {
        if self.digest_only {
            let bytes: [u8; 32] = self.result.as_slice().try_into().ok()?;
            Some(Digest(bytes))
        } else {
            Some(Digest::of(&self.result))
        }
    }
}

/// Results at most this long always travel in full (a digest would not be shorter).
pub const DIGEST_REPLY_MIN_BYTES: usize = 33;

/// The replica that sends the full result of request (`client`, `timestamp`) when digest
/// replies are on; the others send its digest. Spread over replicas by a hash.
pub fn designated_replier(client: ClientId, timestamp: u64, n: u32) -> ReplicaId {
    let d = DigestBuilder::new("redoubt.replier.v1")
        .u64(client)
        .u64(timestamp)
        .finish();
    (u64::from_le_bytes(d.0[..8].try_into().expect("8 bytes")) % n as u64) as ReplicaId
}

/// Like [`designated_replier`], chosen among the replicas other than `skip` (a primary that
/// does not send first replies): replica `skip` itself is never chosen.
pub fn designated_replier_except(
    client: ClientId,
    timestamp: u64,
    n: u32,
    skip: ReplicaId,
) -> ReplicaId {
    let r = designated_replier(client, timestamp, n - 1);
    if r >= skip {
        r + 1
    } else {
        r
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub seq: Seq,
    pub digest: Digest,
    pub replica: ReplicaId,
}

/// `⟨n, d, v⟩`: request `d` prepared at `n` in view `v` (and nothing prepared later).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PEntry {
    pub seq: Seq,
    pub digest: Digest,
    pub view: View,
}

/// `⟨n, {⟨d, v⟩…}⟩`: for each request pre-prepared at `n`, the latest view it was pre-prepared in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QEntry {
    pub seq: Seq,
    pub pairs: Vec<(Digest, View)>,
}

/// VIEW-CHANGE of the MAC-only protocol (BFT-PR §4.3): no certificates, claims only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewChange {
    pub view: View,
    pub replica: ReplicaId,
    /// Sequence number of the sender's last stable checkpoint.
    pub ls: Seq,
    /// One `(seq, digest)` per checkpoint the sender stores.
    pub checkpoints: Vec<(Seq, Digest)>,
    pub p: Vec<PEntry>,
    pub q: Vec<QEntry>,
}

impl ViewChange {
    pub fn digest(&self) -> Digest {
        let bytes = postcard::to_stdvec(self).expect("view change encodes");
        Digest::of_parts("redoubt.view-change.v1", &[&bytes])
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewChangeAck {
    pub view: View,
    pub acker: ReplicaId,
    pub sender: ReplicaId,
    pub digest: Digest,
}

/// NEW-VIEW: the view-change messages used (by sender and digest), the chosen checkpoint and
/// one digest per sequence number after it (`chosen[i]` is for `checkpoint.0 + 1 + i`).
/// `batches` carries bodies of chosen batches so backups need not fetch them; they are checked
/// against the chosen digests and are not part of the decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewView {
    pub view: View,
    pub vcs: Vec<(ReplicaId, Digest)>,
    pub checkpoint: (Seq, Digest),
    pub chosen: Vec<Digest>,
    pub batches: Vec<Batch>,
}

impl NewView {
    /// The digest of the decision: view, view changes named, checkpoint and choices (the
    /// batch bodies carried beside them are not part of it).
    pub fn digest(&self) -> Digest {
        let bytes = postcard::to_stdvec(&(self.view, &self.vcs, self.checkpoint, &self.chosen))
            .expect("new view encodes");
        Digest::of_parts("redoubt.new-view.v1", &[&bytes])
    }
}

/// Receiver-driven retransmission (BFT-PR §4.6.1): a summary of what the sender has. Peers
/// answer with what it lacks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Status {
    pub replica: ReplicaId,
    pub view: View,
    /// False while the sender is changing view (it has sent VIEW-CHANGE for `view`).
    pub normal: bool,
    /// While active in `view`: the digest ([`NewView::digest`]) of the NEW-VIEW it entered
    /// the view on, if it holds it.
    pub new_view: Option<Digest>,
    pub last_executed: Seq,
    pub stable: Seq,
    /// Sequence numbers above `last_executed` the sender has prepared in `view`.
    pub prepared: Vec<Seq>,
    /// Sequence numbers above `last_executed` the sender has committed in `view`.
    pub committed: Vec<Seq>,
    /// Batch bodies the sender needs.
    pub missing_batches: Vec<Digest>,
    /// View-change messages named in a NEW-VIEW the sender holds but lacks.
    pub missing_vcs: Vec<(ReplicaId, Digest)>,
}

/// One partition asked for by a [`Fetch`]: (`level`, `index`) of the partition tree, and `lc`,
/// the checkpoint the asker's copy of it reflects (children not modified after `lc` are left
/// out of the answer; 0 asks for all of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchItem {
    pub level: u8,
    pub index: u64,
    pub lc: Seq,
}

/// FETCH (BFT-PR §4.6.2): partitions of checkpoint `seq`. `seq` 0 asks every receiver for the
/// root of its latest stable checkpoint (used when the asker knows no checkpoint digest; it
/// waits for f+1 matching answers).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetch {
    pub seq: Seq,
    pub items: Vec<FetchItem>,
    /// With confidential bodies: the asker's state session with the executors (an HPKE
    /// encapsulation, see `redoubt_crypto::body`); the answer's pages and auxiliary bytes come
    /// back sealed under its key.
    pub session: Option<[u8; 32]>,
}

/// A child entry in a META-DATA answer: index at the child level, lm, digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildEntry {
    pub index: u64,
    pub lm: Seq,
    pub digest: Digest,
}

/// One answered partition.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateItem {
    /// META-DATA: the children of a meta-data partition modified after the asked `lc`.
    Meta {
        level: u8,
        index: u64,
        children: Vec<ChildEntry>,
    },
    /// DATA: a page with the checkpoint of its last modification.
    Page {
        index: u64,
        lm: Seq,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
}

impl std::fmt::Debug for StateItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateItem::Meta {
                level,
                index,
                children,
            } => write!(f, "meta({level},{index}: {} kids)", children.len()),
            StateItem::Page { index, lm, bytes } => {
                write!(f, "page({index} lm{lm} {}B)", bytes.len())
            }
        }
    }
}

/// The answer to a [`Fetch`]: items of checkpoint `seq`, the checkpoint's auxiliary bytes when
/// the root is among them, and `stable`, the sender's latest stable checkpoint (an answer with
/// no items and `stable > seq` says the sender no longer holds `seq`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateData {
    pub seq: Seq,
    pub stable: Seq,
    #[serde(with = "serde_bytes")]
    pub aux: Option<Vec<u8>>,
    pub items: Vec<StateItem>,
    /// With confidential bodies: `aux` and `items`, sealed under the asker's state session
    /// (`[counter, 8 bytes little-endian][ciphertext]`; `aux` and `items` are then empty).
    #[serde(with = "serde_bytes")]
    pub sealed: Option<Vec<u8>>,
}

impl std::fmt::Debug for StateData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "StateData(n{} stable{} {} items)",
            self.seq,
            self.stable,
            self.items.len()
        )
    }
}

/// QUERY-STABLE: the estimation step of a recovery; `nonce` ties the answers to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryStable {
    pub replica: ReplicaId,
    pub nonce: u64,
}

/// REPLY-STABLE: `c` is the sender's last checkpoint, `p` the last sequence number it
/// prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyStable {
    pub replica: ReplicaId,
    pub c: Seq,
    pub p: Seq,
    pub nonce: u64,
}

/// The operation of a recovery request (BFT-PR §4.4): the recovering replica's estimate H_M,
/// signed by its key holder. It travels as the op of a [`Request`] from the replica's
/// reserved client id ([`recovery_client`]) whose timestamp is the key holder's counter.
/// Under Prime it also carries the public half of the replica's fresh order key, which signs
/// its PO-ARU rows once the request executed (the old one may be in an attacker's hands).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryOp {
    pub replica: ReplicaId,
    pub h_m: Seq,
    pub row_key: Option<redoubt_crypto::pk::VerifyKey>,
    pub sig: redoubt_crypto::pk::Signature,
}

impl RecoveryOp {
    /// The digest the key holder signs (with purpose Recovery and its counter).
    pub fn content_digest(
        replica: ReplicaId,
        h_m: Seq,
        row_key: Option<&redoubt_crypto::pk::VerifyKey>,
    ) -> Digest {
        let mut b = DigestBuilder::new("redoubt.recovery.v2");
        b.u64(replica as u64).u64(h_m);
        match row_key {
            None => b.u64(0),
            Some(k) => b.u64(1).bytes(&k.0),
        };
        b.finish()
    }
}

/// The result replicas return for a recovery request: the sequence number it executed at
/// (n_R), whether it was accepted (refused when the same replica recovered less than
/// `recovery_interval_min_ms` earlier), and the agreed time of that replica's last accepted
/// recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryResult {
    pub seq: Seq,
    pub accepted: bool,
    pub last_accepted_ms: Option<u64>,
    /// The key-holder counter of the last accepted recovery request (its epoch decides
    /// whether a request within the interval is a new boot's, see `keys::EPOCH_SHIFT`).
    pub last_accepted_counter: Option<u64>,
    /// The checkpoint the recovery waits for: max(H_M, H_R), capped at H_R + L. Until it is
    /// stable, an idle primary proposes empty batches so the recovery can complete.
    pub target: Seq,
    /// Prime: the replica's order key in force after this request, with its incarnation
    /// (the counter of the request that installed it); `None` while it is the one dealt at
    /// `init`.
    pub row_key: Option<(u64, redoubt_crypto::pk::VerifyKey)>,
}

/// First client id reserved for recovery requests: replica `r` uses `RECOVERY_CLIENT_BASE + r`.
pub const RECOVERY_CLIENT_BASE: ClientId = u64::MAX - (1 << 20);

/// The reserved client id of replica `r`'s recovery requests.
pub fn recovery_client(r: ReplicaId) -> ClientId {
    RECOVERY_CLIENT_BASE + r as ClientId
}

/// The replica a reserved recovery client id belongs to.
pub fn recovery_replica(c: ClientId) -> Option<ReplicaId> {
    (c >= RECOVERY_CLIENT_BASE && c - RECOVERY_CLIENT_BASE < (1 << 20))
        .then(|| (c - RECOVERY_CLIENT_BASE) as ReplicaId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_as_is_equality_with_or_without_a_shared_buffer() {
        let op = Bytes::from(vec![7u8; 4096]);
        let a = Request {
            client: 3,
            timestamp: 9,
            read_only: false,
            op: op.clone(),
        };
        // The same buffer, a copy of it, and requests that differ in each field.
        let shared = a.clone();
        let copied = Request {
            op: Bytes::from(op.to_vec()),
            ..a.clone()
        };
        assert!(a.same_as(&shared) && a.same_as(&copied));
        let mut other_op = op.to_vec();
        other_op[4095] = 8;
        let differ = [
            Request {
                op: Bytes::from(other_op),
                ..a.clone()
            },
            Request {
                op: op.slice(..4095),
                ..a.clone()
            },
            Request {
                client: 4,
                ..a.clone()
            },
            Request {
                timestamp: 10,
                ..a.clone()
            },
            Request {
                read_only: true,
                ..a.clone()
            },
        ];
        for d in &differ {
            assert_eq!(a.same_as(d), a == *d);
            assert!(!a.same_as(d), "{d:?}");
        }
    }
}
