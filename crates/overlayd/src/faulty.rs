//! TEST ONLY: a Byzantine relay for tests and benchmarks. The node runs the unmodified core;
//! its outgoing datagrams are opened with its own link keys, a fraction of the data packets
//! and acks it forwards for other nodes are removed, and the datagram is sealed again. The
//! neighbour's link layer therefore acknowledges what it got and hop-by-hop recovery cannot
//! mask the loss: only the end-to-end acks (and ODSBR's probing) can see it. A production
//! overlay file has no `[[faulty]]` entry.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_crypto::MacKey;
use redoubt_overlay::wire::{self, Limits, OverlayMsg};
use redoubt_overlay::{Config, NodeId};
use std::collections::BTreeMap;

pub struct FaultyRelay {
    me: NodeId,
    drop_fraction: f64,
    link_keys: BTreeMap<NodeId, MacKey>,
    limits: Limits,
    rng: ChaCha8Rng,
    /// Transit messages removed so far.
    pub dropped: u64,
}

impl FaultyRelay {
    pub fn new(
        me: NodeId,
        drop_fraction: f64,
        neighbours_pairwise: &BTreeMap<NodeId, MacKey>,
        cfg: &Config,
        seed: u64,
    ) -> FaultyRelay {
        FaultyRelay {
            me,
            drop_fraction,
            link_keys: neighbours_pairwise
                .iter()
                .map(|(&n, k)| (n, redoubt_overlay::link_key(k)))
                .collect(),
            limits: Limits::from_config(cfg),
            rng: ChaCha8Rng::seed_from_u64(seed),
            dropped: 0,
        }
    }

    pub fn drop_fraction(&self) -> f64 {
        self.drop_fraction
    }

    pub fn set_drop_fraction(&mut self, f: f64) {
        self.drop_fraction = f.clamp(0.0, 1.0);
    }

    /// Rewrites one datagram the node sends to `to`; returns it unchanged when there is
    /// nothing to drop (or it cannot be opened, which would be a bug in the core).
    pub fn outgoing(&mut self, to: NodeId, bytes: Vec<u8>) -> Vec<u8> {
        if self.drop_fraction <= 0.0 {
            return bytes;
        }
        let Some(key) = self.link_keys.get(&to).cloned() else {
            return bytes;
        };
        let me = self.me;
        let Ok((_, mut frame)) =
            wire::open(&bytes, to, &self.limits, |n| (n == me).then_some(&key))
        else {
            return bytes;
        };
        let before = self.dropped;
        if let Some(batch) = frame.reliable.as_mut() {
            let msgs = std::mem::take(&mut batch.msgs);
            batch.msgs = self.filter(msgs);
        }
        let msgs = std::mem::take(&mut frame.unreliable);
        frame.unreliable = self.filter(msgs);
        if self.dropped == before {
            return bytes;
        }
        wire::seal(me, to, &frame, &key)
    }

    fn filter(&mut self, msgs: Vec<OverlayMsg>) -> Vec<OverlayMsg> {
        let me = self.me;
        let mut kept = Vec::with_capacity(msgs.len());
        for m in msgs {
            let transit = match &m {
                OverlayMsg::Data(d) => d.src != me && d.dst != me,
                OverlayMsg::Ack(a) => a.src != me && a.dst != me,
                OverlayMsg::Lsu(_) => false,
            };
            if transit && self.rng.random_bool(self.drop_fraction) {
                self.dropped += 1;
            } else {
                kept.push(m);
            }
        }
        kept
    }
}
