//! A small process-wide table of signature checks already made. A check's answer is a pure
//! function of (key, message, signature), so a process that meets the same signed bytes several
//! times (many clients behind one gateway, the simulator's nodes in one process) pays for one
//! check. Keyed by a digest of the three; bounded, the oldest entry goes first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Entries of the table.
const REMEMBERED: usize = 8192;

type Table = (HashMap<[u8; 32], bool>, VecDeque<[u8; 32]>);

static CHECKED: Mutex<Option<Table>> = Mutex::new(None);

/// The answer of `check` for (key, msg, sig) under `scheme`, from the table when it was made
/// before.
pub(crate) fn check_once(
    scheme: &str,
    key: &[u8],
    msg: &[u8],
    sig: &[u8],
    check: impl FnOnce() -> bool,
) -> bool {
    let id = id(scheme, key, msg, sig);
    if let Some(ok) = lookup(&id) {
        return ok;
    }
    let ok = check();
    note(id, ok);
    ok
}

/// What the table knows (key, msg, sig) under `scheme` by.
pub(crate) fn id(scheme: &str, key: &[u8], msg: &[u8], sig: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("redoubt remembered signature check v1");
    for part in [scheme.as_bytes(), key, msg, sig] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// The answer a check gave for `id` before, if any.
pub(crate) fn lookup(id: &[u8; 32]) -> Option<bool> {
    CHECKED
        .lock()
        .expect("check table")
        .as_ref()
        .and_then(|(map, _)| map.get(id).copied())
}

/// Remembers `ok` as the answer for `id`.
pub(crate) fn note(id: [u8; 32], ok: bool) {
    let mut table = CHECKED.lock().expect("check table");
    let (map, order) = table.get_or_insert_with(Default::default);
    if map.insert(id, ok).is_none() {
        order.push_back(id);
        if order.len() > REMEMBERED {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }
}
