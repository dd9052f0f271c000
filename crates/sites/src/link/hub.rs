//! The hub-based logical link's sending and receiving roles (Amir et al. 2009 §4.2;
//! spec/attack.md §2.6, traps 10, 11 and 13).
//!
//! A site's servers reach the wide area through a broadcast hub (or a network tap), which gives
//! two properties: *uniform reception* (a frame one local server receives from the wide area,
//! every local server receives) and *overhearing* (a frame one local server sends to the wide
//! area, every local server sees). The link is the erasure-coded one ([`super::erasure`]) with a
//! (2f+1, 3f+1) code instead of (f+1, 3f+1): thanks to uniform reception a virtual link needs
//! only a correct *sender*, so 2f+1 parts of 1/(2f+1) of the message each are enough, and the
//! overhead tends to 1.5 instead of 3.
//!
//! Sending: each message is mapped, by its number and destination, to a *first set* of 2f+1
//! servers, which send their part at once, and a *second set* of f, which wait a local timeout
//! and send only if by then they have not overheard 2f+1 distinct servers' validly signed parts
//! of this very message (Hub-Optimistic). With [`HubConfig::immediate`] every server sends at
//! once (Hub-Immediate): less delay under attack, a fixed overhead of (3f+1)/(2f+1).
//!
//! Receiving: every server of the receiving site gets every part; f+1 of them, chosen by the
//! part's number and the message's, introduce it into local ordering (so a correct one does),
//! and duplicates are dropped at local execution, where parts are counted (trap 11).
//!
//! Overheard parts are only counted, never trusted: a faulty server that sends a bad part to
//! cancel the second set's sends costs one failed decoding, which the blacklisting protocol of
//! Figure 3 ([`super::inquiry`]) answers, and the server is blacklisted (trap 9). From then on
//! its parts are not counted, and a part of ours cancelled on the strength of its part is sent
//! after all: the receiving site ignores a blacklisted server's parts, so without ours it would
//! hold one part too few of that message for ever.

use super::Wan;
use crate::{Server, Shape, SiteId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Our parts waiting for the local timeout, and messages whose overheard parts are counted;
/// beyond it the oldest go (a dropped scheduled part is sent at once: a part too many costs
/// bandwidth, a part too few may cost the message).
pub const SCHEDULED_MAX: usize = 4096;
pub const OVERHEARD_MAX: usize = 4096;
/// Our cancelled parts kept, with the servers whose parts cancelled them, in case one of those
/// servers is found faulty; beyond it the oldest go.
pub const CANCELLED_MAX: usize = 4096;

/// How a site's servers use their hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubConfig {
    /// Hub-Immediate: every server sends its part at once.
    pub immediate: bool,
    /// Hub-Optimistic: how long a second-set server waits to overhear 2f+1 parts before it
    /// sends its own (the paper: 25 ms).
    pub timeout_ms: u64,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            immediate: false,
            timeout_ms: 25,
        }
    }
}

/// Parts that decode a message on a hub: 2f+1.
pub fn data_parts(shape: &Shape) -> usize {
    2 * shape.f() + 1
}

/// Server `server`'s position in a rotation of the site's servers starting at `offset`.
fn position(shape: &Shape, offset: u64, server: Server) -> u64 {
    let n = shape.servers() as u64;
    (server.0 as u64 + n - offset % n) % n
}

/// Whether `server` is in the first set (sends at once) for message `seq` to site `to`: 2f+1
/// servers, rotated by the message so that no server always waits.
pub fn first_set(shape: &Shape, to: SiteId, seq: u64, server: Server) -> bool {
    position(shape, seq.wrapping_add(to.0 as u64), server) < data_parts(shape) as u64
}

/// Whether `server` of the receiving site introduces part `index` of message `seq` into local
/// ordering: f+1 servers per part, so at least one is correct.
pub fn introduces(shape: &Shape, index: Server, seq: u64, server: Server) -> bool {
    position(shape, seq.wrapping_add(index.0 as u64), server) <= shape.f() as u64
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HubStats {
    /// Our parts held for the local timeout, then sent when it expired or cancelled because
    /// 2f+1 other parts were overheard first.
    pub scheduled: u64,
    pub sent_after_timeout: u64,
    pub cancelled: u64,
    /// Parts of other servers overheard and counted.
    pub overheard: u64,
    /// Parts received that other servers of the site introduce.
    pub not_ours: u64,
    /// Cancelled parts sent after all: a server whose part cancelled them was found faulty.
    pub sent_after_blacklisting: u64,
}

/// One server's hub state: its scheduled parts and what it overheard.
#[derive(Clone, Debug)]
pub(crate) struct Hub {
    cfg: HubConfig,
    shape: Shape,
    me: Server,
    /// This server's clock, as its host last said ([`super::LogicalLink::timer`]).
    now_ms: u64,
    scheduled: BTreeMap<(u64, SiteId), (u64, Wan)>,
    overheard: BTreeMap<(u64, SiteId), BTreeSet<Server>>,
    cancelled: BTreeMap<(u64, SiteId), Wan>,
    /// Parts to send at the next timer call.
    due: Vec<Wan>,
    pub(crate) stats: HubStats,
}

impl Hub {
    pub(crate) fn new(cfg: HubConfig, shape: Shape, me: Server) -> Hub {
        Hub {
            cfg,
            shape,
            me,
            now_ms: 0,
            scheduled: BTreeMap::new(),
            overheard: BTreeMap::new(),
            cancelled: BTreeMap::new(),
            due: Vec::new(),
            stats: HubStats::default(),
        }
    }

    fn enough_overheard(&self, seq: u64, to: SiteId) -> bool {
        self.overheard
            .get(&(seq, to))
            .is_some_and(|s| s.len() >= data_parts(&self.shape))
    }

    /// Our part of message `seq` to `to`: sent now, or held for the local timeout.
    pub(crate) fn outgoing(&mut self, seq: u64, wan: Wan) -> Option<Wan> {
        let to = wan.to_site;
        if self.cfg.immediate || first_set(&self.shape, to, seq, self.me) {
            return Some(wan);
        }
        self.stats.scheduled += 1;
        if self.enough_overheard(seq, to) {
            self.cancel(seq, to, wan);
            return None;
        }
        let due = self.now_ms + self.cfg.timeout_ms;
        self.scheduled.insert((seq, to), (due, wan));
        if self.scheduled.len() > SCHEDULED_MAX {
            // Sent early rather than lost; the host sends it on its next timer call.
            if let Some((key, (_, wan))) = self.scheduled.pop_first() {
                self.scheduled.insert(key, (0, wan));
            }
        }
        None
    }

    /// Another server of the site sent its (validly signed) part of message `seq` to `to`.
    pub(crate) fn overheard(&mut self, seq: u64, to: SiteId, index: Server) {
        if index == self.me {
            return;
        }
        let servers = self.overheard.entry((seq, to)).or_default();
        if !servers.insert(index) {
            return;
        }
        self.stats.overheard += 1;
        if servers.len() >= data_parts(&self.shape) {
            if let Some((_, wan)) = self.scheduled.remove(&(seq, to)) {
                self.cancel(seq, to, wan);
            }
        }
        while self.overheard.len() > OVERHEARD_MAX {
            self.overheard.pop_first();
        }
    }

    fn cancel(&mut self, seq: u64, to: SiteId, wan: Wan) {
        self.stats.cancelled += 1;
        self.cancelled.insert((seq, to), wan);
        while self.cancelled.len() > CANCELLED_MAX {
            self.cancelled.pop_first();
        }
    }

    /// Our site found `server` faulty: its parts no longer count, and our parts they cancelled
    /// go out at the next timer call.
    pub(crate) fn blacklisted(&mut self, server: Server) {
        let enough = data_parts(&self.shape);
        let mut again = Vec::new();
        for (key, servers) in self.overheard.iter_mut() {
            if servers.remove(&server) && servers.len() < enough {
                again.push(*key);
            }
        }
        for key in again {
            if let Some(wan) = self.cancelled.remove(&key) {
                self.stats.sent_after_blacklisting += 1;
                self.due.push(wan);
            }
        }
    }

    /// The clock moved: the parts whose timeout expired, to send now.
    pub(crate) fn timer(&mut self, now_ms: u64) -> Vec<Wan> {
        self.now_ms = self.now_ms.max(now_ms);
        let now = self.now_ms;
        let due: Vec<(u64, SiteId)> = self
            .scheduled
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(k, _)| *k)
            .collect();
        let mut out = std::mem::take(&mut self.due);
        for k in due {
            if let Some((_, wan)) = self.scheduled.remove(&k) {
                self.stats.sent_after_timeout += 1;
                out.push(wan);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_and_introducers_have_the_sizes_the_paper_gives() {
        for servers in [4, 7, 10] {
            let shape = Shape::new(4, servers).unwrap();
            let f = shape.f();
            for seq in 0..20 {
                for to in shape.site_ids() {
                    let first = shape
                        .server_ids()
                        .filter(|s| first_set(&shape, to, seq, *s))
                        .count();
                    assert_eq!(first, 2 * f + 1);
                }
                for index in shape.server_ids() {
                    let n = shape
                        .server_ids()
                        .filter(|s| introduces(&shape, index, seq, *s))
                        .count();
                    assert_eq!(n, f + 1);
                }
            }
            // The second set rotates: every server is in it for some message.
            for s in shape.server_ids() {
                assert!((0..servers as u64).any(|seq| !first_set(&shape, SiteId(1), seq, s)));
            }
        }
    }
}
