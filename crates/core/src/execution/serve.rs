//! Serving state transfer (BFT-PR §4.6.2): answers to FETCH for META-DATA and DATA of a
//! checkpoint the state still holds, within a per-asker byte budget.

use super::Execution;
use crate::message::{ChildEntry, Fetch, Reject, StateData, StateItem};
use crate::service::Service;
use crate::types::{ReplicaId, Seq};

/// The limits a replica serves state within (from `Config`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ServeLimits {
    /// Most items one FETCH may ask for.
    pub(crate) items_max: usize,
    /// Bytes of items one answer carries at most (one item may overshoot it).
    pub(crate) reply_bytes_max: usize,
    /// Refill rate of each asker's byte budget.
    pub(crate) rate_bytes_per_sec: u64,
}

/// Why a FETCH got no answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The FETCH is malformed, too large, or over the asker's budget, or our state is under
    /// repair.
    Rejected(Reject),
    /// One of our own pages failed its digest while being read: stop serving and repair.
    CorruptPage,
}

impl From<Reject> for Refused {
    fn from(r: Reject) -> Self {
        Refused::Rejected(r)
    }
}

impl<S: Service> Execution<S> {
    /// The answer to `from`'s FETCH at time `now`, and the bytes of items it carries.
    /// `stable` is the current stable checkpoint: a probe (`seq` 0) asks for its root, and
    /// every answer reports it.
    pub(crate) fn serve(
        &mut self,
        from: ReplicaId,
        f: &Fetch,
        stable: Seq,
        now: u64,
        limits: ServeLimits,
    ) -> Result<(StateData, usize), Refused> {
        if f.items.len() > limits.items_max {
            return Err(Reject::TooLarge.into());
        }
        if self.state.needs_repair() {
            return Err(Reject::Stale.into()); // we cannot vouch for our pages until repaired
        }
        // Token bucket per asking replica, in bytes.
        let rate = limits.rate_bytes_per_sec;
        let cap = (limits.reply_bytes_max as i64).saturating_mul(4);
        let (tokens, last) = self.serve_budget.entry(from).or_insert((cap, now));
        let refill = (now.saturating_sub(*last)).saturating_mul(rate) / 1000;
        *tokens = tokens
            .saturating_add(refill.min(i64::MAX as u64) as i64)
            .min(cap);
        *last = now;
        if *tokens <= 0 {
            return Err(Reject::RateLimited.into());
        }
        let (seq, probe) = if f.seq == 0 {
            (stable, true)
        } else {
            (f.seq, false)
        };
        let Some((_, aux)) = self.state.held(seq) else {
            let empty = StateData {
                seq: f.seq,
                stable,
                aux: None,
                items: Vec::new(),
                sealed: None,
            };
            return Ok((empty, 0));
        };
        let geo = self.state.geometry();
        let budget = limits.reply_bytes_max;
        let mut used = 0usize;
        let mut items = Vec::new();
        let mut with_aux = None;
        for it in if probe {
            &f.items[..1.min(f.items.len())]
        } else {
            &f.items[..]
        } {
            if !geo.contains(it.level, it.index) {
                return Err(Reject::Inconsistent.into());
            }
            if used >= budget {
                break;
            }
            if it.level < geo.depth() {
                let lc = if probe { 0 } else { it.lc };
                let children = self
                    .state
                    .children_at(seq, (it.level, it.index), lc)
                    .expect("held checkpoint, valid partition");
                used += 24 + children.len() * 52;
                if (it.level, it.index) == (0, 0) {
                    used += aux.len();
                    with_aux = Some(aux.to_vec());
                }
                items.push(StateItem::Meta {
                    level: it.level,
                    index: it.index,
                    children: children
                        .into_iter()
                        .map(|(index, e)| ChildEntry {
                            index,
                            lm: e.lm,
                            digest: e.digest,
                        })
                        .collect(),
                });
            } else {
                let Some((e, bytes)) = self.state.verified_page_at(seq, it.index) else {
                    return Err(Refused::CorruptPage);
                };
                used += 24 + bytes.len();
                items.push(StateItem::Page {
                    index: it.index,
                    lm: e.lm,
                    bytes,
                });
            }
        }
        if let Some((tokens, _)) = self.serve_budget.get_mut(&from) {
            *tokens = tokens.saturating_sub(used as i64);
        }
        let data = StateData {
            seq,
            stable,
            aux: with_aux,
            items,
            sealed: None,
        };
        Ok((data, used))
    }
}
