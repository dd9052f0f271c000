//! Confidential bodies on the wire (Yin et al. 2003 §4: bodies readable by clients and
//! executors only): how a client's operation and the executors' result are sealed.
//!
//! A sealed operation is `[SEALED][enc (32 bytes)][ciphertext]`: `enc` is the client's body
//! session (see `redoubt_crypto::body`), the ciphertext the operation sealed under the
//! session's key with the request's timestamp as nonce and the request's client, timestamp
//! and read-only flag as associated data. A sealed result is `[SEALED][ciphertext]` under the
//! same key in the other direction; a result the executors could not produce because the
//! operation did not open is `[REFUSED][reason]` (in clear: it says nothing about the state).
//! Every executor opens and seals identically, so the usual f+1 (or 2f+1) matching replies
//! certify a sealed result.

use crate::types::ClientId;
use redoubt_crypto::body::{BodyKey, Direction, ENC_LEN};

/// First byte of a sealed operation or result.
pub const SEALED: u8 = 0xB1;
/// First byte of a result refused because the operation did not open.
pub const REFUSED: u8 = 0xB0;
/// What sealing adds to an operation: the marker, the encapsulation and the tag.
pub const OP_OVERHEAD: usize = 1 + ENC_LEN + redoubt_crypto::body::TAG_LEN;

fn aad(client: ClientId, timestamp: u64, read_only: bool) -> [u8; 17] {
    let mut a = [0u8; 17];
    a[..8].copy_from_slice(&client.to_le_bytes());
    a[8..16].copy_from_slice(&timestamp.to_le_bytes());
    a[16] = read_only as u8;
    a
}

/// Seals a client's operation.
pub fn seal_op(
    key: &BodyKey,
    enc: &[u8; ENC_LEN],
    client: ClientId,
    timestamp: u64,
    read_only: bool,
    plain: &[u8],
) -> Vec<u8> {
    let ct = key.seal(
        Direction::Request,
        timestamp,
        &aad(client, timestamp, read_only),
        plain,
    );
    let mut out = Vec::with_capacity(1 + ENC_LEN + ct.len());
    out.push(SEALED);
    out.extend_from_slice(enc);
    out.extend_from_slice(&ct);
    out
}

/// The session of a sealed operation (`None`: not a sealed operation).
pub fn session_of(op: &[u8]) -> Option<[u8; ENC_LEN]> {
    if op.first() != Some(&SEALED) || op.len() < 1 + ENC_LEN {
        return None;
    }
    op[1..1 + ENC_LEN].try_into().ok()
}

/// Opens a sealed operation with its session's key.
pub fn open_op(
    key: &BodyKey,
    client: ClientId,
    timestamp: u64,
    read_only: bool,
    op: &[u8],
) -> Option<Vec<u8>> {
    session_of(op)?;
    key.open(
        Direction::Request,
        timestamp,
        &aad(client, timestamp, read_only),
        &op[1 + ENC_LEN..],
    )
}

/// Seals a result for the client.
pub fn seal_result(key: &BodyKey, client: ClientId, timestamp: u64, plain: &[u8]) -> Vec<u8> {
    let ct = key.seal(
        Direction::Reply,
        timestamp,
        &aad(client, timestamp, false),
        plain,
    );
    let mut out = Vec::with_capacity(1 + ct.len());
    out.push(SEALED);
    out.extend_from_slice(&ct);
    out
}

/// The result of an operation that did not open.
pub fn refused(reason: &str) -> Vec<u8> {
    let mut out = vec![REFUSED];
    out.extend_from_slice(reason.as_bytes());
    out
}

/// What a client makes of a certified result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opened {
    Result(Vec<u8>),
    /// The executors refused the operation (it did not open there).
    Refused(String),
    /// Not a result sealed for this request under this key.
    Malformed,
}

/// Opens a certified result of request `timestamp`.
pub fn open_result(key: &BodyKey, client: ClientId, timestamp: u64, result: &[u8]) -> Opened {
    match result.split_first() {
        Some((&SEALED, ct)) => key
            .open(
                Direction::Reply,
                timestamp,
                &aad(client, timestamp, false),
                ct,
            )
            .map_or(Opened::Malformed, Opened::Result),
        Some((&REFUSED, reason)) => Opened::Refused(String::from_utf8_lossy(reason).into_owned()),
        _ => Opened::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_crypto::body::{establish, ExecutorSecret};

    #[test]
    fn an_operation_and_its_result_round_trip_and_bind_their_request() {
        let exec = ExecutorSecret::from_seed(&[5; 32]);
        let (enc, key) = establish(&exec.public(), b"c7", [1; 32]).unwrap();
        let op = seal_op(&key, &enc, 7, 1000, false, b"put secret");
        assert_eq!(op.len(), 10 + OP_OVERHEAD);
        assert_eq!(session_of(&op), Some(enc));
        let k2 = exec.open(b"c7", &enc).unwrap();
        assert_eq!(
            open_op(&k2, 7, 1000, false, &op).as_deref(),
            Some(&b"put secret"[..])
        );
        // Another client, timestamp or read-only flag does not open it.
        assert_eq!(open_op(&k2, 8, 1000, false, &op), None);
        assert_eq!(open_op(&k2, 7, 1001, false, &op), None);
        assert_eq!(open_op(&k2, 7, 1000, true, &op), None);
        assert_eq!(session_of(b"put"), None);

        let r = seal_result(&k2, 7, 1000, b"ok");
        assert_eq!(
            r,
            seal_result(&key, 7, 1000, b"ok"),
            "every executor seals alike"
        );
        assert_eq!(
            open_result(&key, 7, 1000, &r),
            Opened::Result(b"ok".to_vec())
        );
        assert_eq!(open_result(&key, 7, 1001, &r), Opened::Malformed);
        assert_eq!(
            open_result(&key, 7, 1000, &refused("no")),
            Opened::Refused("no".into())
        );
        assert_eq!(open_result(&key, 7, 1000, b""), Opened::Malformed);
    }
}
