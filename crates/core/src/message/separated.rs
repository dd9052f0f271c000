//! Messages between the agreement cluster and the execution cluster of a separated deployment
//! (Yin et al. 2003 §3; `crate::executor`).

use super::Batch;
use crate::types::{ClientId, ExecutorId, ReplicaId, Seq, View};
use redoubt_crypto::Digest;
use serde::{Deserialize, Serialize};

/// One agreement node's piece of an agreement certificate (`<COMMIT, v, n, d, A>`, §3.1.2):
/// it ordered batch `digest` at `seq` (committed, in order) in `view`. Sent with an
/// authenticator over the execution nodes, so an execution node can pass the frame on to a
/// peer that missed it and the peer checks its own entry. f+1 pieces from distinct agreement
/// nodes naming one digest certify the batch. `batch` is the body (`None` for the null
/// request, whose digest is the null digest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub replica: ReplicaId,
    pub view: View,
    pub seq: Seq,
    pub digest: Digest,
    pub batch: Option<Batch>,
}

/// An execution node executed every batch through `seq` (its partial reply certificate for
/// the pipeline, §3.2.1), and its state is durable through its stable checkpoint `stable`
/// (what it restarts from): agreement nodes take their checkpoints once g+1 execution nodes
/// acknowledged them, and keep for resending what some execution node holds only above its
/// stable checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecAck {
    pub executor: ExecutorId,
    pub seq: Seq,
    pub stable: Seq,
}

/// An agreement node received again a request of `client` it already ordered (`retryHint`,
/// §3.2): execution nodes send their reply to it again, if they executed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    pub replica: ReplicaId,
    pub client: ClientId,
    pub timestamp: u64,
}

/// `<CHECKPOINT, n, d>` among execution nodes (§3.3.2): g+1 matching make it stable.
/// Behind a firewall it carries the sender's threshold signature share on
/// [`checkpoint_statement`]: g+1 of them combine into a proof that any execution node can
/// check (a lagging node learns from one peer which checkpoint to fetch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecCheckpoint {
    pub executor: ExecutorId,
    pub seq: Seq,
    pub digest: Digest,
    pub share: Option<redoubt_crypto::threshold::ThresholdSig>,
    /// Without a firewall, with session keys: the sender's key-holder signature (counter and
    /// signature) on [`checkpoint_statement`], so that the vote can be shown to a third node.
    pub signed: Option<(u64, redoubt_crypto::pk::Signature)>,
}

/// A checkpoint vote an execution node's key holder signed: g+1 matching ones prove a stable
/// checkpoint to any execution node, as the threshold signature does behind a firewall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedVote {
    pub executor: ExecutorId,
    pub seq: Seq,
    pub digest: Digest,
    pub counter: u64,
    pub sig: redoubt_crypto::pk::Signature,
}

/// What g+1 execution nodes sign about a checkpoint among themselves (it never leaves the
/// execution cluster: the digest would tell outsiders something about the state).
pub fn checkpoint_statement(seq: Seq, digest: &Digest) -> Digest {
    redoubt_crypto::DigestBuilder::new("redoubt.firewall.checkpoint.v1")
        .u64(seq)
        .digest(digest)
        .finish()
}

/// A stable execution checkpoint, proven by the execution cluster's threshold signature on
/// [`checkpoint_statement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointProof {
    pub seq: Seq,
    pub digest: Digest,
    pub signature: redoubt_crypto::threshold::ThresholdSig,
}

/// An execution node holds no certificate for `seq` (the next it must execute) while it
/// holds later ones: the second level of retransmission (§3.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Missing {
    pub executor: ExecutorId,
    pub seq: Seq,
}

/// The answer to [`Missing`]: the agreement nodes' frames of the certificates the sender
/// holds from the asked sequence number on (each checked by the receiver against its own
/// authenticator entry; the sender is not trusted), and the sender's stable checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certified {
    pub executor: ExecutorId,
    pub stable: Seq,
    pub frames: Vec<serde_bytes::ByteBuf>,
    /// Behind a firewall: the proof of the sender's stable checkpoint, if it holds one.
    pub proof: Option<CheckpointProof>,
    /// Without a firewall, with session keys: g+1 signed votes proving the sender's stable
    /// checkpoint (empty if it holds none).
    pub votes: Vec<SignedVote>,
}

/// A frame of an execution node for a client (its reply, or its NEW-KEY), handed to an
/// agreement node to pass on: clients talk to the agreement nodes only (Yin et al. §3.1.1),
/// so the execution nodes need no route to them. The frame is sealed for the client by the
/// execution node; the agreement node can neither read a sealed result nor forge the frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relay {
    pub client: ClientId,
    pub frame: serde_bytes::ByteBuf,
}
