//! The nonce check of sealed bodies (second review, G6): no key may seal two different
//! bodies under one IV, the IV its keystream is drawn from (with AES-GCM-SIV the synthetic IV,
//! with a stream AEAD the nonce itself). Otherwise a wire observer of both ciphertexts gets
//! the XOR of the two bodies (for example an old and a new balance, two results of one read).
//! Replies and state-transfer answers are checked; requests are not: a faulty client may
//! reuse a timestamp for two operations of its own.
//!
//! The seals come from `redoubt_crypto::body::audit`, switched on for the run's thread.

use redoubt_crypto::body::audit::{self, Sealed};
use redoubt_crypto::body::Direction;
use std::collections::HashMap;

/// What each (key, direction, IV) sealed so far in the run.
#[derive(Default)]
pub(super) struct NonceCheck {
    seen: HashMap<([u8; 32], u8, [u8; 16]), [u8; 32]>,
    /// Bodies checked (for the run's statistics).
    pub(super) checked: u64,
}

impl NonceCheck {
    /// Takes the seals recorded since the last call; a violation if one key and IV sealed two
    /// different bodies.
    pub(super) fn check(&mut self) -> Option<String> {
        for Sealed {
            key,
            dir,
            iv,
            plain,
        } in audit::take()
        {
            if dir == Direction::Request as u8 {
                continue;
            }
            self.checked += 1;
            match self.seen.insert((key, dir, iv), plain) {
                Some(before) if before != plain => {
                    return Some(format!(
                        "nonce reuse: one key sealed two different bodies (direction {dir}) \
                         under IV {}",
                        hex(&iv)
                    ));
                }
                _ => {}
            }
        }
        None
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
