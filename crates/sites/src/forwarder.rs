//! The dependable forwarder (Amir et al. 2009 §4.3; spec/attack.md §2.7, traps 4 and 5): a
//! small process between a site's servers and the wide area (`redoubt forwarder`), neutral to
//! the global protocol. It holds no key of the site and checks no signature.
//!
//! Outgoing: every server of the site hands it each signed global message with a header (the
//! message's number, which every correct server gives the same message, and its destination).
//! For each (number, destination) the forwarder keeps a *slot* per distinct message (keyed by
//! the whole frame, trap 4) with the servers that sent that copy; when LOCAL-THRESHOLD servers
//! (between f+1 and 2f+1) sent the same copy, it sends exactly one copy to the forwarder of the
//! destination site. With the threshold at f+1 or more, faulty servers alone send nothing.
//!
//! Memory is bounded by WINDOW: a server's frame numbered more than WINDOW above the highest
//! number sent is not taken now ([`Take::Later`]: the host stops reading that server's session
//! until the others catch up; it does not drop it, trap 5), and slots more than WINDOW below
//! it are dropped. Each server has at most one copy per (number, destination).
//!
//! Incoming: a frame from another site's forwarder goes to every server of the site (the
//! host's per-link queue is bounded and drops when full); f+1 of them introduce it
//! ([`crate::link::df`]).
//!
//! Safety never rests on the forwarder: receivers act only on messages under their site's
//! threshold signature. A faulty forwarder can drop, delay or duplicate, which costs its own
//! site's liveness (the simulator counts a withholding forwarder's site among the F faulty).

use crate::{Server, Shape, SiteId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What a server prepends to a frame for its forwarder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The message's number in its site (the same at every correct server).
    pub seq: u64,
    /// The site it goes to.
    pub to: SiteId,
}

/// A forwarder's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwarderConfig {
    /// Matching copies from distinct servers before a message goes out: in [f+1, 2f+1].
    pub local_threshold: usize,
    /// Numbers above the highest sent that a server's frames may run ahead.
    pub window: u64,
}

impl ForwarderConfig {
    /// The paper's choices: f+1 copies (one correct server wants it sent), a window of 256.
    pub fn for_shape(shape: &Shape) -> ForwarderConfig {
        ForwarderConfig {
            local_threshold: shape.f() + 1,
            window: 256,
        }
    }
}

/// Whether a server's frame was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Take {
    /// Taken; these frames go out to other sites' forwarders now.
    Now(Vec<(SiteId, Vec<u8>)>),
    /// Too far ahead: hand it again once the window moved (stop reading that session).
    Later,
    /// Refused: a number below the window, a second copy from the same server, an unknown
    /// destination or server, or a threshold outside [f+1, 2f+1].
    Refused(&'static str),
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwarderStats {
    pub taken: u64,
    pub held_back: u64,
    pub refused: u64,
    pub sent: u64,
    pub slots_dropped: u64,
    pub incoming: u64,
}

/// The forwarder of one site.
pub struct Forwarder {
    shape: Shape,
    site: SiteId,
    cfg: ForwarderConfig,
    /// The highest number sent to any site.
    last_sent: Option<u64>,
    /// (number, destination) -> distinct copies -> the servers that sent each.
    slots: BTreeMap<(u64, SiteId), BTreeMap<Vec<u8>, BTreeSet<Server>>>,
    /// (number, destination) already sent: later copies are dropped.
    sent: BTreeSet<(u64, SiteId)>,
    stats: ForwarderStats,
}

impl Forwarder {
    pub fn new(shape: Shape, site: SiteId, cfg: ForwarderConfig) -> Result<Forwarder, String> {
        let f = shape.f();
        if cfg.local_threshold < f + 1 || cfg.local_threshold > 2 * f + 1 {
            return Err(format!(
                "local threshold {} outside [f+1, 2f+1] = [{}, {}]",
                cfg.local_threshold,
                f + 1,
                2 * f + 1
            ));
        }
        if cfg.window == 0 {
            return Err("a window of 0 takes nothing".into());
        }
        Ok(Forwarder {
            shape,
            site,
            cfg,
            last_sent: None,
            slots: BTreeMap::new(),
            sent: BTreeSet::new(),
            stats: ForwarderStats::default(),
        })
    }

    pub fn stats(&self) -> &ForwarderStats {
        &self.stats
    }

    /// Slots held now (bounded by servers x 2 x window x sites).
    pub fn slots(&self) -> usize {
        self.slots.values().map(|s| s.len()).sum()
    }

    fn low(&self) -> u64 {
        self.last_sent
            .map_or(0, |s| s.saturating_sub(self.cfg.window))
    }

    /// Server `from` of the site hands over `frame` for `header.to`.
    pub fn from_server(&mut self, from: Server, header: Header, frame: &[u8]) -> Take {
        if !self.shape.has_server(from) || !self.shape.has_site(header.to) || header.to == self.site
        {
            self.stats.refused += 1;
            return Take::Refused("unknown server or destination");
        }
        let high = self
            .last_sent
            .map_or(self.cfg.window, |s| s + self.cfg.window);
        if header.seq > high {
            self.stats.held_back += 1;
            return Take::Later;
        }
        let key = (header.seq, header.to);
        if header.seq < self.low() || self.sent.contains(&key) {
            // Already sent, or too old to matter: nothing to keep.
            self.stats.refused += 1;
            return Take::Refused("already sent or below the window");
        }
        let copies = self.slots.entry(key).or_default();
        if copies.values().any(|servers| servers.contains(&from)) {
            self.stats.refused += 1;
            return Take::Refused("a second copy from the same server");
        }
        self.stats.taken += 1;
        let servers = copies.entry(frame.to_vec()).or_default();
        servers.insert(from);
        if servers.len() < self.cfg.local_threshold {
            return Take::Now(Vec::new());
        }
        // LOCAL-THRESHOLD matching copies: exactly one goes out.
        self.slots.remove(&key);
        self.sent.insert(key);
        self.stats.sent += 1;
        if self.last_sent.is_none_or(|s| header.seq > s) {
            self.last_sent = Some(header.seq);
            self.collect();
        }
        Take::Now(vec![(header.to, frame.to_vec())])
    }

    /// Drops what fell below the window.
    fn collect(&mut self) {
        let low = self.low();
        let kept = self.slots.split_off(&(low, SiteId(0)));
        self.stats.slots_dropped += self.slots.values().map(|s| s.len() as u64).sum::<u64>();
        self.slots = kept;
        self.sent = self.sent.split_off(&(low, SiteId(0)));
    }

    /// A frame from site `from`'s forwarder: it goes to every server of this site.
    pub fn from_wan(&mut self, _from: SiteId, frame: &[u8]) -> Vec<(Server, Vec<u8>)> {
        self.stats.incoming += 1;
        self.shape
            .server_ids()
            .map(|s| (s, frame.to_vec()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(servers: usize) -> Forwarder {
        let shape = Shape::new(4, servers).unwrap();
        Forwarder::new(
            shape,
            SiteId(0),
            ForwarderConfig {
                local_threshold: shape.f() + 1,
                window: 4,
            },
        )
        .unwrap()
    }

    fn h(seq: u64, to: u16) -> Header {
        Header {
            seq,
            to: SiteId(to),
        }
    }

    #[test]
    fn one_copy_goes_out_at_the_threshold_and_faulty_servers_alone_send_nothing() {
        let mut d = fwd(7); // f = 2: 3 copies
        assert_eq!(d.from_server(Server(0), h(0, 1), b"m"), Take::Now(vec![]));
        // Two faulty servers agree on junk: not enough.
        assert_eq!(
            d.from_server(Server(5), h(0, 1), b"junk"),
            Take::Now(vec![])
        );
        assert_eq!(
            d.from_server(Server(6), h(0, 1), b"junk"),
            Take::Now(vec![])
        );
        assert!(matches!(
            d.from_server(Server(5), h(0, 1), b"m"),
            Take::Refused(_)
        ));
        assert_eq!(d.from_server(Server(1), h(0, 1), b"m"), Take::Now(vec![]));
        assert_eq!(
            d.from_server(Server(2), h(0, 1), b"m"),
            Take::Now(vec![(SiteId(1), b"m".to_vec())])
        );
        // Exactly one copy: later ones are dropped.
        assert!(matches!(
            d.from_server(Server(3), h(0, 1), b"m"),
            Take::Refused(_)
        ));
        assert_eq!(d.stats().sent, 1);
    }

    #[test]
    fn a_server_far_ahead_waits_and_memory_stays_within_the_window() {
        let mut d = fwd(4); // f = 1: 2 copies, window 4
        assert_eq!(d.from_server(Server(0), h(5, 2), b"x"), Take::Later);
        for seq in 0..=20u64 {
            let frame = seq.to_le_bytes().to_vec();
            d.from_server(Server(3), h(seq + 50, 1), b"far");
            assert_eq!(
                d.from_server(Server(0), h(seq, 1), &frame),
                Take::Now(vec![])
            );
            assert_eq!(
                d.from_server(Server(1), h(seq, 1), &frame),
                Take::Now(vec![(SiteId(1), frame.clone())])
            );
            // A lone copy left behind by a lagging server.
            d.from_server(Server(2), h(seq, 3), b"lone");
            assert!(d.slots() <= 2 * 4 + 1, "{}", d.slots());
        }
        assert_eq!(d.from_server(Server(0), h(24, 2), b"x"), Take::Now(vec![]));
        assert_eq!(d.from_server(Server(0), h(25, 2), b"x"), Take::Later);
        assert!(matches!(
            d.from_server(Server(0), h(3, 2), b"old"),
            Take::Refused(_)
        ));
    }

    #[test]
    fn a_threshold_outside_f_plus_one_to_2f_plus_one_is_refused() {
        let shape = Shape::new(4, 4).unwrap();
        for t in [0, 1, 4] {
            let cfg = ForwarderConfig {
                local_threshold: t,
                window: 8,
            };
            assert!(Forwarder::new(shape, SiteId(0), cfg).is_err(), "{t}");
        }
        for t in [2, 3] {
            let cfg = ForwarderConfig {
                local_threshold: t,
                window: 8,
            };
            assert!(Forwarder::new(shape, SiteId(0), cfg).is_ok(), "{t}");
        }
    }
}
