//! Prime's messages (ADR 0007; spec prime.md §2): pre-ordering, summaries to the leader,
//! Suspect-Leader, and filling holes. The proposal itself is a PRE-PREPARE whose batch
//! carries a summary matrix (`Batch::matrix`).

use crate::types::{ReplicaId, Seq};
use serde::{Deserialize, Serialize};

pub use crate::prime::matrix::{Matrix, PoAru, SignedPoAru};
pub use crate::prime::preorder::{AckPart, PoRequest};
pub use crate::prime::suspect::SuspectMsg;

/// PO-ACK: what `replica` holds, as acknowledgement parts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoAck {
    pub replica: ReplicaId,
    pub parts: Vec<AckPart>,
}

/// PROOF-MATRIX: a replica's summary matrix, to the leader only (its answer is timed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub replica: ReplicaId,
    pub matrix: Matrix,
}

/// Suspect-Leader traffic of `replica`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspicion {
    pub replica: ReplicaId,
    pub msg: SuspectMsg,
}

/// Asks for certified copies of PO-REQUESTs (originator, number) an ordered matrix made
/// eligible and the sender lacks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoFetch {
    pub replica: ReplicaId,
    pub wanted: Vec<(ReplicaId, Seq)>,
}

/// A certified PO-REQUEST sent by `replica`: reconciliation, or the answer to a PO-FETCH.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoCopy {
    pub replica: ReplicaId,
    pub request: PoRequest,
}
