//! Clients' body sessions as the executors know them (see `crate::bodies`): per client, the
//! session of its latest sealed request and the key it opens to.
//!
//! Not replicated state: the key is a function of the session (every executor derives the
//! same one, or finds the session does not open), so this is a cache in front of the key
//! holder, which holds the executors' secret. Bounded: one entry per client id that sent a
//! sealed request (client ids are configured).

use crate::bodies::{self, session_of};
use crate::message::Request;
use crate::types::ClientId;
use redoubt_crypto::body::{BodyKey, ENC_LEN};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Why an operation did not reach the service.
const NOT_SEALED: &str = "this cluster takes sealed operations only";
const DOES_NOT_OPEN: &str = "the operation does not open under its session";

#[derive(Default)]
pub(crate) struct Sessions {
    /// Bodies are sealed in this cluster.
    pub(crate) confidential: bool,
    /// Per client: its latest session and its key (`None`: the session does not open).
    keys: BTreeMap<ClientId, ([u8; ENC_LEN], Option<BodyKey>)>,
    /// Mutant `clear-bodies`: unsealed operations run and results go back unsealed.
    #[cfg(feature = "mutants")]
    pub(crate) clear: bool,
}

impl Sessions {
    pub(crate) fn new(confidential: bool) -> Self {
        Sessions {
            confidential,
            keys: BTreeMap::new(),
            #[cfg(feature = "mutants")]
            clear: false,
        }
    }

    /// The session whose key must be learnt before `req` can run, if any.
    pub(crate) fn wanted(&self, req: &Request) -> Option<[u8; ENC_LEN]> {
        if !self.confidential {
            return None;
        }
        let enc = session_of(&req.op)?;
        match self.keys.get(&req.client) {
            Some((known, _)) if *known == enc => None,
            _ => Some(enc),
        }
    }

    /// The key holder's answer for `client`'s session `enc`.
    pub(crate) fn learn(&mut self, client: ClientId, enc: [u8; ENC_LEN], key: Option<BodyKey>) {
        self.keys.insert(client, (enc, key));
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// `req`'s operation, opened when bodies are sealed; `Err` holds the result of an
    /// operation that does not open (the same refusal at every executor). The session's key
    /// must have been learnt (see [`Sessions::wanted`]).
    pub(crate) fn open<'a>(&self, req: &'a Request) -> Result<Cow<'a, [u8]>, Vec<u8>> {
        if !self.confidential {
            return Ok(Cow::Borrowed(&req.op[..]));
        }
        #[cfg(feature = "mutants")]
        if self.clear {
            return Ok(Cow::Borrowed(&req.op[..]));
        }
        let Some(enc) = session_of(&req.op) else {
            return Err(bodies::refused(NOT_SEALED));
        };
        let key = match self.keys.get(&req.client) {
            Some((known, Some(key))) if *known == enc => key,
            _ => return Err(bodies::refused(DOES_NOT_OPEN)),
        };
        bodies::open_op(key, req.client, req.timestamp, req.read_only, &req.op)
            .map(Cow::Owned)
            .ok_or_else(|| bodies::refused(DOES_NOT_OPEN))
    }

    /// Seals `plain`, the result of `req` (as is when bodies are not sealed).
    pub(crate) fn seal(&self, req: &Request, plain: Vec<u8>) -> Vec<u8> {
        #[cfg(feature = "mutants")]
        if self.clear {
            return plain;
        }
        if !self.confidential {
            return plain;
        }
        match self.keys.get(&req.client) {
            Some((_, Some(key))) => bodies::seal_result(key, req.client, req.timestamp, &plain),
            _ => bodies::refused(DOES_NOT_OPEN),
        }
    }
}
