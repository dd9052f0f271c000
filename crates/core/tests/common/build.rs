//! Message builders for scripting Byzantine replicas and clients. Everything here is a plain
//! message; [`crate::common::Cluster::receive`] and friends seal it with the sender's keys.
//! Requests need a client's keys: see [`crate::common::Cluster::request`].

use redoubt_core::keys::NewKey;
use redoubt_core::message::*;
use redoubt_core::*;
use redoubt_crypto::{Digest, Mac};

pub fn replica(i: ReplicaId) -> Principal {
    Principal::Replica(i)
}

pub fn client(c: ClientId) -> Principal {
    Principal::Client(c)
}

/// What can be sent: a [`Message`] or the body of one.
pub trait Wire {
    fn into_message(self) -> Message;
}

impl<T: Into<Message>> Wire for T {
    fn into_message(self) -> Message {
        self.into()
    }
}

/// `sr` with the authenticator entries of `replicas` spoiled (they will not verify there).
pub fn spoil(mut sr: SignedRequest, replicas: &[ReplicaId]) -> SignedRequest {
    let mut auth = sr.auth.to_vec();
    for r in replicas {
        auth[*r as usize] = Mac::default();
    }
    sr.auth = auth.into();
    sr
}

/// A batch of `requests` with proposed time and seed 0.
pub fn batch(requests: Vec<SignedRequest>) -> Batch {
    Batch {
        nondet: NonDet {
            time_ms: 0,
            seed: 0,
        },
        requests,
        matrix: None,
    }
}

/// The pre-prepare of a batch of `requests` (carried inside it) at `seq` in `view`.
pub fn pre_prepare(view: View, seq: Seq, requests: Vec<SignedRequest>) -> PrePrepare {
    let batch = batch(requests);
    PrePrepare {
        view,
        seq,
        digest: batch.digest(),
        batch,
        beside: Vec::new(),
    }
}

/// The lean pre-prepare of a batch of `requests`, all of them named beside it.
pub fn lean_pre_prepare(view: View, seq: Seq, requests: &[SignedRequest]) -> PrePrepare {
    let mut pp = pre_prepare(view, seq, requests.to_vec());
    pp.batch.requests.clear();
    pp.beside = requests
        .iter()
        .enumerate()
        .map(|(i, r)| Beside {
            index: i as u32,
            client: r.request.client,
            digest: r.request.digest(),
        })
        .collect();
    pp
}

/// PREPARE of `replica`, vouching for every request of the batch.
pub fn prepare(view: View, seq: Seq, digest: Digest, replica: ReplicaId) -> Prepare {
    prepare_doubting(view, seq, digest, replica, Vec::new())
}

/// PREPARE of `replica`, doubting the requests at positions `doubts`.
pub fn prepare_doubting(
    view: View,
    seq: Seq,
    digest: Digest,
    replica: ReplicaId,
    doubts: Vec<u16>,
) -> Prepare {
    Prepare {
        view,
        seq,
        digest,
        replica,
        doubts,
    }
}

pub fn commit(view: View, seq: Seq, digest: Digest, replica: ReplicaId) -> Commit {
    Commit {
        view,
        seq,
        digest,
        replica,
    }
}

pub fn checkpoint(seq: Seq, digest: Digest, replica: ReplicaId) -> Checkpoint {
    Checkpoint {
        seq,
        digest,
        replica,
    }
}

/// A VIEW-CHANGE of `replica` for `view` from its stable checkpoint `(seq, digest)`, claiming
/// nothing prepared or pre-prepared.
pub fn view_change(view: View, replica: ReplicaId, (seq, digest): (Seq, Digest)) -> ViewChange {
    ViewChange {
        view,
        replica,
        ls: seq,
        checkpoints: vec![(seq, digest)],
        p: vec![],
        q: vec![],
    }
}

/// `acker`'s acknowledgement of `vc` for `view`.
pub fn ack(view: View, acker: ReplicaId, vc: &ViewChange) -> ViewChangeAck {
    ViewChangeAck {
        view,
        acker,
        sender: vc.replica,
        digest: vc.digest(),
    }
}

/// A NEW-VIEW for `view` naming the VIEW-CHANGEs `vcs` (sender, digest), moving to
/// `checkpoint` and choosing nothing after it.
pub fn new_view(view: View, vcs: &[(ReplicaId, Digest)], checkpoint: (Seq, Digest)) -> NewView {
    NewView {
        view,
        vcs: vcs.to_vec(),
        checkpoint,
        chosen: vec![],
        batches: vec![],
    }
}
