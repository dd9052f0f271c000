//! Threshold signing of a site's outgoing bundles (Amir et al. 2009, §3.2: "verifiable partial
//! signatures"; ADR 0010, decision 3).
//!
//! Each server of a site holds one share of the site's (f+1, 3f+1) BLS key. When its logical
//! machine emits a bundle, a server signs the bundle's root with its share and sends the share
//! to the site's other servers; f+1 shares on the same root combine into the site's signature,
//! which at least one correct server assented to. Shares are not checked one by one: the
//! combined signature is checked (one pairing), and only when it fails are the shares that went
//! into it checked, to find the server whose share does not verify. That server is blacklisted
//! here, its shares ignored from then on, and the share kept as a proof an operator (or anyone
//! with the site's group key) can check again: [`ShareProof::holds`].
//!
//! Bounds: at most [`PENDING_MAX`] of our own roots wait for shares, at most
//! [`EARLY_PER_SERVER_MAX`] shares from each server wait for a root we have not produced yet
//! (a server ahead of us in local execution), and [`DONE_MAX`] signed roots are remembered to
//! drop late shares.

use crate::message::statement;
use crate::{Server, SiteId};
use redoubt_crypto::threshold::{GroupKey, KeyShare, ThresholdSig};
use redoubt_crypto::Digest;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Own roots waiting for shares; beyond it the oldest is given up (counted).
pub const PENDING_MAX: usize = 1024;
/// Shares one server may have waiting for a root we have not produced yet.
pub const EARLY_PER_SERVER_MAX: usize = 256;
/// Signed roots remembered, to drop the shares that arrive after the signature was made.
pub const DONE_MAX: usize = 4096;

/// One server's share on a bundle root, sent to the site's other servers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub site: SiteId,
    pub signer: Server,
    pub root: Digest,
    pub share: ThresholdSig,
}

/// A share that does not verify under its signer's public share: proof that the signer is
/// faulty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareProof {
    pub site: SiteId,
    pub server: Server,
    pub root: Digest,
    pub share: ThresholdSig,
}

impl ShareProof {
    /// Whether the proof holds: the share is not the server's valid share on the root.
    pub fn holds(&self, group: &GroupKey) -> bool {
        !group.verify_share(
            self.server.0 as usize,
            &statement(self.site, &self.root),
            &self.share,
        )
    }
}

/// What the signing protocol asks of its host, or tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signing {
    /// Send this share to every other server of the site.
    Share(Share),
    /// The site's signature over `root`: the bundle can go out.
    Signed { root: Digest, sig: ThresholdSig },
    /// A server sent a share that does not verify; it is blacklisted here.
    Blacklisted(ShareProof),
}

/// Why a share was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShareRefused {
    #[error("share names another site")]
    OtherSite,
    #[error("share names a server that does not exist")]
    UnknownServer,
    #[error("share claims to be our own")]
    Ours,
    #[error("signer is blacklisted")]
    Blacklisted,
    #[error("share names another server than the one that sent it")]
    NotTheSender,
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SignerStats {
    pub roots_signed: u64,
    pub shares_taken: u64,
    pub shares_late: u64,
    pub shares_refused: u64,
    pub bad_shares: u64,
    pub early_dropped: u64,
    pub pending_dropped: u64,
}

/// One server's side of its site's threshold signing.
pub struct SiteSigner {
    site: SiteId,
    me: Server,
    servers: usize,
    group: GroupKey,
    key: KeyShare,
    /// Our own roots waiting for shares, and in what order they came (oldest first).
    pending: BTreeMap<Digest, BTreeMap<Server, ThresholdSig>>,
    pending_order: VecDeque<Digest>,
    early: BTreeMap<Server, VecDeque<(Digest, ThresholdSig)>>,
    done: BTreeSet<Digest>,
    done_order: VecDeque<Digest>,
    blacklist: BTreeMap<Server, ShareProof>,
    stats: SignerStats,
    mutant: crate::Mutant,
}

impl SiteSigner {
    /// `key` is this server's share of its site's group key (`key.index()` is its index).
    pub fn new(site: SiteId, servers: usize, group: GroupKey, key: KeyShare) -> SiteSigner {
        assert!(key.index() < servers);
        assert_eq!(group.threshold(), (servers - 1) / 3, "(f+1, 3f+1) key");
        SiteSigner {
            site,
            me: Server(key.index() as u16),
            servers,
            group,
            key,
            pending: BTreeMap::new(),
            pending_order: VecDeque::new(),
            early: BTreeMap::new(),
            done: BTreeSet::new(),
            done_order: VecDeque::new(),
            blacklist: BTreeMap::new(),
            stats: SignerStats::default(),
            mutant: crate::Mutant::None,
        }
    }

    /// The simulator's broken variants ([`crate::Mutant`]).
    pub fn set_mutant(&mut self, mutant: crate::Mutant) {
        self.mutant = mutant;
    }

    pub fn stats(&self) -> &SignerStats {
        &self.stats
    }

    /// Servers blacklisted here, with the share that proves each faulty.
    pub fn blacklist(&self) -> &BTreeMap<Server, ShareProof> {
        &self.blacklist
    }

    fn f(&self) -> usize {
        (self.servers - 1) / 3
    }

    /// Our logical machine emitted a bundle with this root: sign it, and combine once f+1
    /// shares are here.
    pub fn local(&mut self, root: Digest) -> Vec<Signing> {
        if self.done.contains(&root) || self.pending.contains_key(&root) {
            return Vec::new();
        }
        if self.pending.len() >= PENDING_MAX {
            if let Some(oldest) = self.pending_order.pop_front() {
                self.pending.remove(&oldest);
                self.stats.pending_dropped += 1;
            }
        }
        let own = self.key.sign(&statement(self.site, &root));
        let mut shares = BTreeMap::from([(self.me, own)]);
        for (server, queue) in self.early.iter_mut() {
            if let Some(at) = queue.iter().position(|(r, _)| *r == root) {
                let (_, share) = queue.remove(at).expect("position is in range");
                shares.insert(*server, share);
            }
        }
        self.early.retain(|_, q| !q.is_empty());
        self.pending.insert(root, shares);
        self.pending_order.push_back(root);
        let mut out = vec![Signing::Share(Share {
            site: self.site,
            signer: self.me,
            root,
            share: own,
        })];
        self.try_combine(root, &mut out);
        out
    }

    /// A share that server `from` of the site sent (as the local transport authenticated it):
    /// a share it claims for another server is refused, so no server can have another one
    /// blacklisted with a junk share in its name.
    pub fn on_share(&mut self, from: Server, share: Share) -> Result<Vec<Signing>, ShareRefused> {
        let refused = if share.site != self.site {
            Some(ShareRefused::OtherSite)
        } else if share.signer.0 as usize >= self.servers {
            Some(ShareRefused::UnknownServer)
        } else if share.signer == self.me {
            Some(ShareRefused::Ours)
        } else if share.signer != from {
            Some(ShareRefused::NotTheSender)
        } else if self.blacklist.contains_key(&share.signer) {
            Some(ShareRefused::Blacklisted)
        } else {
            None
        };
        if let Some(r) = refused {
            self.stats.shares_refused += 1;
            return Err(r);
        }
        let mut out = Vec::new();
        if self.done.contains(&share.root) {
            self.stats.shares_late += 1;
        } else if let Some(shares) = self.pending.get_mut(&share.root) {
            // A server's first share on a root stands; a second one is not looked at.
            if let std::collections::btree_map::Entry::Vacant(e) = shares.entry(share.signer) {
                e.insert(share.share);
                self.stats.shares_taken += 1;
                self.try_combine(share.root, &mut out);
            }
        } else {
            let queue = self.early.entry(share.signer).or_default();
            if !queue.iter().any(|(r, _)| *r == share.root) {
                if queue.len() >= EARLY_PER_SERVER_MAX {
                    queue.pop_front();
                    self.stats.early_dropped += 1;
                }
                queue.push_back((share.root, share.share));
                self.stats.shares_taken += 1;
            }
        }
        Ok(out)
    }

    fn try_combine(&mut self, root: Digest, out: &mut Vec<Signing>) {
        let message = statement(self.site, &root);
        loop {
            let Some(shares) = self.pending.get(&root) else {
                return;
            };
            if shares.len() <= self.f() {
                return;
            }
            // Our own share first (it is good), then the lowest indices.
            let mut chosen: Vec<(usize, ThresholdSig)> =
                vec![(self.me.0 as usize, shares[&self.me])];
            chosen.extend(
                shares
                    .iter()
                    .filter(|(s, _)| **s != self.me)
                    .take(self.f())
                    .map(|(s, sig)| (s.0 as usize, *sig)),
            );
            let combined = self.group.combine(&chosen);
            let unchecked = self.mutant == crate::Mutant::ShareUnverified;
            if let Some(sig) = combined.filter(|sig| unchecked || self.group.verify(&message, sig))
            {
                self.finish(root);
                self.stats.roots_signed += 1;
                out.push(Signing::Signed { root, sig });
                return;
            }
            // Some share that went in is bad: find it by checking them one by one.
            let bad: Vec<(Server, ThresholdSig)> = chosen
                .iter()
                .skip(1)
                .filter(|(i, s)| !self.group.verify_share(*i, &message, s))
                .map(|(i, s)| (Server(*i as u16), *s))
                .collect();
            if bad.is_empty() {
                // Every share verifies but they do not combine: cannot happen with a sound
                // key; give the root up rather than loop.
                debug_assert!(false, "valid shares that do not combine");
                return;
            }
            for (server, share) in bad {
                self.blacklist_server(server, root, share, out);
            }
        }
    }

    fn blacklist_server(
        &mut self,
        server: Server,
        root: Digest,
        share: ThresholdSig,
        out: &mut Vec<Signing>,
    ) {
        let proof = ShareProof {
            site: self.site,
            server,
            root,
            share,
        };
        self.stats.bad_shares += 1;
        self.blacklist.insert(server, proof.clone());
        for shares in self.pending.values_mut() {
            shares.remove(&server);
        }
        self.early.remove(&server);
        out.push(Signing::Blacklisted(proof));
    }

    fn finish(&mut self, root: Digest) {
        self.pending.remove(&root);
        self.pending_order.retain(|r| *r != root);
        if self.done_order.len() >= DONE_MAX {
            if let Some(old) = self.done_order.pop_front() {
                self.done.remove(&old);
            }
        }
        self.done.insert(root);
        self.done_order.push_back(root);
    }
}
