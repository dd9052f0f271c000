//! Pairwise keys. The caller gives each node one symmetric key per other node (derived however
//! the deployment likes, e.g. `MacKey::derive` from a cluster secret); the node splits each
//! into purpose keys so that a MAC made for one purpose never verifies for another.

use crate::config::ConfigError;
use crate::types::NodeId;
use redoubt_crypto::MacKey;
use std::collections::BTreeMap;

/// The keys a node shares with one other node, one per purpose.
#[derive(Clone, Debug)]
pub(crate) struct PairKeys {
    /// Link MAC on every datagram between neighbours.
    pub link: MacKey,
    /// End-to-end MAC of a data packet (source → destination).
    pub data: MacKey,
    /// Per-hop MAC of a source-routed packet (source → each intermediate node).
    pub hop: MacKey,
    /// MAC of an ack layer (each acking probe or destination → source).
    pub ack: MacKey,
    /// Authenticator entry of a link-state update (origin → each node).
    pub lsu: MacKey,
}

impl PairKeys {
    fn derive(pairwise: &MacKey) -> PairKeys {
        let d = |purpose: &str| MacKey::derive(purpose, &pairwise.0);
        PairKeys {
            link: link_key(pairwise),
            data: d("redoubt-overlay v1 data"),
            hop: d("redoubt-overlay v1 hop"),
            ack: d("redoubt-overlay v1 ack"),
            lsu: d("redoubt-overlay v1 lsu"),
        }
    }
}

/// A node's key table, indexed by node id.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    pairs: Vec<Option<PairKeys>>,
}

impl Keys {
    /// `pairwise` must hold a key for every node of `0..nodes_count` except `me` (ODSBR may
    /// probe any node, and link-state updates are authenticated to every node).
    pub fn new(
        me: NodeId,
        nodes_count: u16,
        pairwise: &BTreeMap<NodeId, MacKey>,
    ) -> Result<Keys, ConfigError> {
        if let Some((&n, _)) = pairwise.iter().find(|(n, _)| n.0 >= nodes_count) {
            return Err(ConfigError::NodeOutOfRange(n.0));
        }
        let mut pairs = Vec::with_capacity(nodes_count as usize);
        for i in 0..nodes_count {
            if i == me.0 {
                pairs.push(None);
                continue;
            }
            let k = pairwise.get(&NodeId(i)).ok_or(ConfigError::MissingKey(i))?;
            pairs.push(Some(PairKeys::derive(k)));
        }
        Ok(Keys { pairs })
    }

    pub fn with(&self, other: NodeId) -> Option<&PairKeys> {
        self.pairs.get(other.index()).and_then(|p| p.as_ref())
    }
}

/// The link-MAC key a node derives from its pairwise key with a neighbour. Public for hosts
/// that must open and reseal their own datagrams (the daemon's test-only faulty relay).
pub fn link_key(pairwise: &MacKey) -> MacKey {
    MacKey::derive("redoubt-overlay v1 link", &pairwise.0)
}

/// A deterministic pairwise key for tests and the simulator: both ends derive the same key
/// from a shared master and the unordered pair of ids.
pub fn pairwise_key_for_tests(master: &[u8], a: NodeId, b: NodeId) -> MacKey {
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    let mut material = master.to_vec();
    material.extend_from_slice(&lo.0.to_le_bytes());
    material.extend_from_slice(&hi.0.to_le_bytes());
    MacKey::derive("redoubt-overlay test pairwise key", &material)
}

/// The pairwise key map of node `me` in an overlay of `nodes_count` nodes built with
/// [`pairwise_key_for_tests`].
pub fn key_map_for_tests(master: &[u8], me: NodeId, nodes_count: u16) -> BTreeMap<NodeId, MacKey> {
    (0..nodes_count)
        .map(NodeId)
        .filter(|&n| n != me)
        .map(|n| (n, pairwise_key_for_tests(master, me, n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_crypto::Digest;

    #[test]
    fn both_ends_share_keys_and_purposes_differ() {
        let a = Keys::new(NodeId(0), 3, &key_map_for_tests(b"m", NodeId(0), 3)).unwrap();
        let b = Keys::new(NodeId(1), 3, &key_map_for_tests(b"m", NodeId(1), 3)).unwrap();
        let d = Digest::of(b"x");
        let ka = a.with(NodeId(1)).unwrap();
        let kb = b.with(NodeId(0)).unwrap();
        assert!(kb.link.verify(&d, &ka.link.mac(&d)));
        assert!(!kb.hop.verify(&d, &ka.link.mac(&d)));
        assert!(a.with(NodeId(0)).is_none());
    }

    #[test]
    fn missing_or_foreign_keys_are_refused() {
        let mut m = key_map_for_tests(b"m", NodeId(0), 3);
        m.remove(&NodeId(2));
        assert_eq!(
            Keys::new(NodeId(0), 3, &m).unwrap_err(),
            ConfigError::MissingKey(2)
        );
        let m = key_map_for_tests(b"m", NodeId(0), 5);
        assert_eq!(
            Keys::new(NodeId(0), 3, &m).unwrap_err(),
            ConfigError::NodeOutOfRange(3)
        );
    }
}
