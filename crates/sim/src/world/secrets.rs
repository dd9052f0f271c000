//! The confidentiality checker of sealed bodies (`Config::confidential_bodies`): every value
//! a correct client writes carries [`SECRET_TAG`], and no frame a correct principal puts on the
//! network may hold it in clear (requests, pre-prepares, replies, state-transfer answers).

use super::*;
use redoubt_core::message::decode_frame;

/// What every value written by a correct client starts with in a run with sealed bodies.
pub(super) const SECRET_TAG: &[u8] = b"~secret~";

impl World {
    /// A correct principal's frame about to go on the network: with sealed bodies, it must
    /// not hold a correct client's value in clear.
    pub(super) fn check_sealed(&mut self, from: Principal, bytes: &[u8]) {
        if !self.sc.core.confidential_bodies || !holds_tag(bytes) {
            return;
        }
        // A frame a replica passes on for an execution node (separated deployment) is the
        // execution node's: judged as sent by it.
        let from = match redoubt_core::message::frame_sender(bytes) {
            Some(p @ Principal::Executor(_)) => p,
            _ => from,
        };
        let correct = match from {
            Principal::Replica(r) => !self.faulty.contains(&r) && !self.adversary.controls(r),
            Principal::Client(id) => self.clients.iter().any(|c| c.core.id() == id),
            // Execution nodes hold the values; a faulty one may leak them (nothing but the
            // privacy firewall stops that).
            Principal::Executor(e) => !self.exec_faulty(e),
            Principal::Filter(x) => self.filter_correct(x),
        };
        if !correct {
            return;
        }
        let kind = decode_frame(bytes, self.sc.core.message_bytes_max)
            .ok()
            .and_then(|f| redoubt_core::message::decode_body(&f.body).ok())
            .map_or("undecodable", |m| m.kind());
        self.violation(format!(
            "{from} sent a client's value in clear in a {kind} frame (confidential bodies)"
        ));
    }

    /// The value a client writes: tagged in runs with sealed bodies.
    pub(super) fn value_of(&self, client: ClientId, counter: u64) -> Vec<u8> {
        let mut v = Vec::new();
        if self.sc.core.confidential_bodies {
            v.extend_from_slice(SECRET_TAG);
        }
        v.extend_from_slice(format!("c{client}-{counter}").as_bytes());
        v.resize(v.len() + self.sc.value_pad, b'.');
        v
    }
}

pub(super) fn holds_tag(bytes: &[u8]) -> bool {
    bytes.windows(SECRET_TAG.len()).any(|w| w == SECRET_TAG)
}
