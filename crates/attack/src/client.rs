//! Faulty clients: the shipped client library, with every request rewritten so that each
//! replica's copy verifies only at that replica (the "big MAC" attack of Aardvark).
//!
//! A replica that receives the request from the client checks its own entry and finds it good;
//! the copy the primary puts in a batch carries the primary's copy of the authenticator, whose
//! entries for the backups are wrong, so no backup can vouch for it. The signature a client adds
//! to a retransmission (which would let every replica vouch) is stripped.

use redoubt_client::Rewrite;
use redoubt_core::message::ClientMessage;
use redoubt_core::message::{
    decode_body, decode_frame_ref, encode_body, encode_frame_parts, Message,
};
use redoubt_crypto::Mac;
use std::sync::Arc;

/// The rewrite of one frame sent to replica `to`: a request's MAC entries other than `to`'s
/// are flipped and its signature removed; any other frame goes out unchanged.
pub fn big_mac(to: u32, bytes: &[u8]) -> Vec<u8> {
    let Ok(frame) = decode_frame_ref(bytes, usize::MAX) else {
        return bytes.to_vec();
    };
    let Ok(Message::Client(ClientMessage::Request(mut sr))) = decode_body(frame.body) else {
        return bytes.to_vec();
    };
    let auth: Vec<Mac> = sr
        .auth
        .iter()
        .enumerate()
        .map(|(r, m)| {
            if r as u32 == to {
                *m
            } else {
                let mut bad = *m;
                bad.0[0] ^= 0xff;
                bad
            }
        })
        .collect();
    sr.auth = auth.into();
    sr.sig = None;
    let body = encode_body(&Message::from(sr));
    encode_frame_parts(frame.version, frame.from, frame.epoch, &body, &frame.tag)
}

pub fn big_mac_rewrite() -> Rewrite {
    Rewrite(Arc::new(big_mac))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_core::auth::StaticKeys;
    use redoubt_core::message::{Request, SignedRequest};
    use redoubt_core::seal::{request_authenticator, seal};
    use redoubt_core::types::Principal;

    #[test]
    fn each_replica_s_copy_verifies_there_only_and_loses_its_signature() {
        let all: Vec<Principal> = (0..4)
            .map(Principal::Replica)
            .chain([Principal::Client(7)])
            .collect();
        let keys = StaticKeys::derive(b"master", Principal::Client(7), all);
        let request = Request {
            client: 7,
            timestamp: 1,
            read_only: false,
            op: b"op".to_vec().into(),
        };
        let d = request.digest();
        let auth = request_authenticator(&keys, &d, 4);
        let msg = Message::from(SignedRequest {
            request,
            auth: auth.clone().into(),
            sig: None,
        });
        let frame = seal(&keys, &msg, None, 4);
        let out = big_mac(2, &frame);
        let f = decode_frame_ref(&out, usize::MAX).unwrap();
        let Message::Client(ClientMessage::Request(sr)) = decode_body(f.body).unwrap() else {
            panic!("still a request");
        };
        assert!(sr.sig.is_none());
        for (r, (got, made)) in sr.auth.iter().zip(&auth).enumerate() {
            assert_eq!(got == made, r == 2, "entry {r}");
        }
        // Not a request: unchanged.
        let other = seal(
            &keys,
            &Message::from(redoubt_core::message::Status::default()),
            None,
            4,
        );
        assert_eq!(big_mac(2, &other), other);
    }
}
