//! One seed's draws for `redoubt-sim --sites`: the shape, the link, the faulty site and
//! servers, the wide area's delays and loss, the servers' paces, the clients' work.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redoubt_sites::Mutant;
use std::collections::{BTreeMap, BTreeSet};

/// BLink's timeout for an unacknowledged message.
pub(super) const BLINK_TIMEOUT_MS: u64 = 150;
/// Hub-Optimistic's local timeout (the paper's 25 ms).
pub(super) const HUB_TIMEOUT_MS: u64 = 25;

/// What a faulty server does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerFault {
    BadShares,
    BadParts,
    Silent,
    TickSpam,
    ForgedEvents,
    BogusAnswers,
    /// Holds every frame it sends to other sites back: its parts arrive late (the paper's
    /// attacks: 300 ms on the erasure-coded link, 100 ms on a hub, where the second set's
    /// timeout then expires).
    SlowFrames,
}

/// The logical link of a seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Naive,
    Erasure,
    /// Over broadcast hubs: Hub-Optimistic (25 ms local timeout), or Hub-Immediate.
    Hub {
        immediate: bool,
    },
    /// One forwarder and one receiver per link, replaced after [`BLINK_TIMEOUT_MS`] without an
    /// acknowledgement.
    BLink,
    /// Through each site's dependable forwarder.
    Df,
}

impl LinkKind {
    /// Whether messages travel as erasure parts (and Figure 3's blacklisting runs).
    pub(super) fn coded(self) -> bool {
        matches!(self, LinkKind::Erasure | LinkKind::Hub { .. })
    }
    pub(super) fn hub(self) -> bool {
        matches!(self, LinkKind::Hub { .. })
    }
    /// How long a SlowFrames server holds its frames back: on BLink, just under the timeout
    /// (the collusion the paper describes: the pair stays in power).
    pub(super) fn slow_ms(self) -> u64 {
        match self {
            LinkKind::Hub { .. } => 100,
            LinkKind::BLink => BLINK_TIMEOUT_MS * 4 / 5,
            _ => 300,
        }
    }
}

/// What a wholly faulty site does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteFault {
    Silent,
    Noisy,
    /// Its servers are correct, but its dependable forwarder drops everything, both ways,
    /// from this time on (DF seeds only).
    ForwarderWithholds {
        from_ms: u64,
    },
}

/// One seed's draws.
#[derive(Clone, Debug)]
pub struct SitesScenario {
    pub seed: u64,
    pub servers: usize,
    pub link: LinkKind,
    pub faulty_site: Option<(usize, SiteFault)>,
    pub faulty_servers: BTreeMap<(usize, usize), ServerFault>,
    /// Wide-area delay in rounds (1 ms each), and loss per thousand frames.
    pub wan_delay: (u64, u64),
    pub wan_loss_permille: u32,
    /// Events each server executes per round.
    pub paces: Vec<Vec<usize>>,
    pub updates: u64,
    pub mutant: Mutant,
}

impl SitesScenario {
    pub fn draw(seed: u64, mutant: Mutant) -> SitesScenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5175_e500);
        let servers = if rng.random_bool(0.25) { 7 } else { 4 };
        let f = (servers - 1) / 3;
        let faulty_site = rng.random_bool(0.5).then(|| {
            let fault = if rng.random_bool(0.5) {
                SiteFault::Silent
            } else {
                SiteFault::Noisy
            };
            (rng.random_range(0..4), fault)
        });
        let erasure = rng.random_bool(0.5);
        let mut faulty_servers = BTreeMap::new();
        for s in 0..4 {
            if faulty_site.is_some_and(|(fs, _)| fs == s) {
                continue;
            }
            let k = rng.random_range(0..=f);
            let mut chosen = BTreeSet::new();
            while chosen.len() < k {
                chosen.insert(rng.random_range(0..servers));
            }
            for i in chosen {
                let fault = match rng.random_range(0..7) {
                    0 => ServerFault::BadShares,
                    1 => ServerFault::BadParts,
                    2 => ServerFault::Silent,
                    3 => ServerFault::TickSpam,
                    4 => ServerFault::ForgedEvents,
                    5 => ServerFault::SlowFrames,
                    _ => ServerFault::BogusAnswers,
                };
                faulty_servers.insert((s, i), fault);
            }
        }
        let lo = rng.random_range(1..4);
        let wan_delay = (lo, lo + rng.random_range(0..8));
        let wan_loss_permille = if rng.random_bool(0.3) {
            rng.random_range(1..20)
        } else {
            0
        };
        let paces = (0..4)
            .map(|_| (0..servers).map(|_| rng.random_range(1..5)).collect())
            .collect();
        let updates = rng.random_range(3..7);
        // Drawn last, so that seeds drawn before hubs existed keep their other draws.
        let link = match (erasure, rng.random_bool(0.5)) {
            (false, false) => LinkKind::Naive,
            (false, true) => {
                if rng.random_bool(0.5) {
                    LinkKind::BLink
                } else {
                    LinkKind::Df
                }
            }
            (true, false) => LinkKind::Erasure,
            (true, true) => LinkKind::Hub {
                immediate: rng.random_bool(0.3),
            },
        };
        let faulty_site = match faulty_site {
            Some((s, _)) if link == LinkKind::Df && rng.random_bool(0.5) => Some((
                s,
                SiteFault::ForwarderWithholds {
                    from_ms: rng.random_range(0..2000),
                },
            )),
            other => other,
        };
        SitesScenario {
            seed,
            servers,
            link,
            faulty_site,
            faulty_servers,
            wan_delay,
            wan_loss_permille,
            paces,
            updates,
            mutant,
        }
    }

    pub(super) fn site_faulty(&self, s: usize) -> bool {
        self.faulty_site.is_some_and(|(fs, _)| fs == s)
    }

    pub(super) fn fault(&self, s: usize, i: usize) -> Option<ServerFault> {
        self.faulty_servers.get(&(s, i)).copied()
    }

    pub(super) fn correct(&self, s: usize, i: usize) -> bool {
        !self.site_faulty(s) && self.fault(s, i).is_none()
    }
}
