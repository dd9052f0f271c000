//! `redoubt-sim --sites --link-costs`: what each logical link puts on the wide area.

use super::{run, LinkKind, SitesScenario};
use redoubt_sites::Mutant;
use std::collections::BTreeMap;

/// One link's wide-area cost in a fault-free run (no faulty server or site, no loss).
#[derive(Clone, Debug)]
pub struct LinkCost {
    pub link: LinkKind,
    pub servers: usize,
    pub updates: u64,
    pub wan_frames: u64,
    pub wan_bytes: u64,
    pub message_bytes: u64,
}

impl LinkCost {
    /// Bytes on the wide area per byte of one copy of each message per destination
    /// (Table 1's bandwidth overhead, signatures and framing included).
    pub fn overhead(&self) -> f64 {
        self.wan_bytes as f64 / self.message_bytes.max(1) as f64
    }
}

/// Every link, with 4 and 7 servers per site, in the same fault-free scenario: what each
/// costs on the wide area (`redoubt-sim --sites --link-costs`).
pub fn link_costs() -> Vec<LinkCost> {
    let links = [
        LinkKind::Df,
        LinkKind::Hub { immediate: false },
        LinkKind::Hub { immediate: true },
        LinkKind::Erasure,
        LinkKind::BLink,
        LinkKind::Naive,
    ];
    let mut out = Vec::new();
    for servers in [4, 7] {
        for link in links {
            let sc = SitesScenario {
                seed: 1,
                servers,
                link,
                faulty_site: None,
                faulty_servers: BTreeMap::new(),
                wan_delay: (5, 5),
                wan_loss_permille: 0,
                paces: vec![vec![3; servers]; 4],
                updates: 6,
                mutant: Mutant::None,
            };
            let o = run(sc);
            assert!(o.passed(), "{link:?} x {servers}: {:?}", o.violations);
            out.push(LinkCost {
                link,
                servers,
                updates: o.updates_acked,
                wan_frames: o.wan_frames,
                wan_bytes: o.wan_bytes,
                message_bytes: o.message_bytes,
            });
        }
    }
    out
}
