//! The global message as it travels between sites: the logical machine's frame, its sequence
//! number, and its site's threshold signature over the Merkle root of the batch it was made
//! in; and the site keys that check it.
//!
//! A logical machine numbers every global message it emits (its `seq`, the same at every correct
//! server of the site, trap 2) and emits them in *bundles*: all the messages that executing one
//! locally ordered event produced. A bundle is signed once, over the root of a Merkle tree whose
//! leaves are its messages; each message carries its path. Servers that executed the same event
//! build the same bundle, so they sign the same root, and BLS signatures being unique, send the
//! same bytes whichever f+1 shares were combined.

use crate::merkle::{self, Path};
use crate::SiteId;
use redoubt_crypto::threshold::{GroupKey, ThresholdSig};
use redoubt_crypto::{Digest, DigestBuilder};
use serde::{Deserialize, Serialize};

/// The most messages in one bundle.
pub const BUNDLE_MESSAGES_MAX: usize = 4096;

/// A global message signed by its site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedMessage {
    /// The logical machine that sent it.
    pub site: SiteId,
    /// Its number among the messages that logical machine sent.
    pub seq: u64,
    /// The site it is for, or `None` for every other site (signed with the rest: a faulty
    /// server cannot hand one site's message to another).
    pub to: Option<SiteId>,
    /// The global protocol's frame.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// From its leaf to the bundle's root.
    pub path: Path,
    /// The site's signature over the bundle's root.
    pub sig: ThresholdSig,
}

/// Why a signed message was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum Refused {
    #[error("frame of {0} bytes is over the limit of {1}")]
    TooLarge(usize, usize),
    #[error("frame does not decode: {0}")]
    Malformed(String),
    #[error("{0} is not a site of this system")]
    UnknownSite(SiteId),
    #[error("Merkle path is malformed")]
    BadPath,
    #[error("threshold signature of {0} does not verify")]
    BadSignature(SiteId),
    #[error("{0} is blacklisted")]
    Blacklisted(SiteId),
}

/// The leaf of a message in its bundle's tree.
pub fn leaf(site: SiteId, seq: u64, to: Option<SiteId>, body: &[u8]) -> Digest {
    DigestBuilder::new("redoubt.site.message.v2")
        .u64(site.0 as u64)
        .u64(seq)
        .u64(to.map_or(u64::MAX, |t| t.0 as u64))
        .long_bytes(body)
        .finish()
}

/// What a site's servers sign for a bundle: the site and the root, domain separated.
pub fn statement(site: SiteId, root: &Digest) -> Vec<u8> {
    let mut m = b"redoubt.site.bundle.v1".to_vec();
    m.extend_from_slice(&site.0.to_le_bytes());
    m.extend_from_slice(&root.0);
    m
}

/// The messages one locally executed event made, numbered from `first_seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    site: SiteId,
    first_seq: u64,
    bodies: Vec<(Vec<u8>, Option<SiteId>)>,
    root: Digest,
    paths: Vec<Path>,
}

impl Bundle {
    /// 1 to [`BUNDLE_MESSAGES_MAX`] bodies, each for every other site.
    pub fn new(site: SiteId, first_seq: u64, bodies: Vec<Vec<u8>>) -> Bundle {
        Bundle::addressed(
            site,
            first_seq,
            bodies.into_iter().map(|b| (b, None)).collect(),
        )
    }

    /// 1 to [`BUNDLE_MESSAGES_MAX`] bodies, each with the site it is for (`None`: every
    /// other site).
    pub fn addressed(
        site: SiteId,
        first_seq: u64,
        bodies: Vec<(Vec<u8>, Option<SiteId>)>,
    ) -> Bundle {
        assert!(!bodies.is_empty() && bodies.len() <= BUNDLE_MESSAGES_MAX);
        let leaves: Vec<Digest> = bodies
            .iter()
            .enumerate()
            .map(|(i, (b, to))| leaf(site, first_seq + i as u64, *to, b))
            .collect();
        let (root, paths) = merkle::paths(&leaves);
        Bundle {
            site,
            first_seq,
            bodies,
            root,
            paths,
        }
    }
    pub fn root(&self) -> Digest {
        self.root
    }
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }
    pub fn len(&self) -> usize {
        self.bodies.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bodies.is_empty()
    }
    /// Every message of the bundle under the site's signature over its root.
    pub fn signed(&self, sig: ThresholdSig) -> Vec<SignedMessage> {
        self.bodies
            .iter()
            .zip(&self.paths)
            .enumerate()
            .map(|(i, ((body, to), path))| SignedMessage {
                site: self.site,
                seq: self.first_seq + i as u64,
                to: *to,
                body: body.clone(),
                path: path.clone(),
                sig,
            })
            .collect()
    }
}

/// Every site's group key: what checks a global message.
#[derive(Clone, Debug)]
pub struct SiteKeys {
    groups: Vec<GroupKey>,
}

impl SiteKeys {
    /// Site i's group key at index i.
    pub fn new(groups: Vec<GroupKey>) -> SiteKeys {
        SiteKeys { groups }
    }
    pub fn group(&self, site: SiteId) -> Option<&GroupKey> {
        self.groups.get(site.0 as usize)
    }
    /// Whether `msg` is what its site signed.
    pub fn check(&self, msg: &SignedMessage) -> Result<(), Refused> {
        let group = self.group(msg.site).ok_or(Refused::UnknownSite(msg.site))?;
        let root = msg
            .path
            .root_of(&leaf(msg.site, msg.seq, msg.to, &msg.body))
            .ok_or(Refused::BadPath)?;
        if group.verify(&statement(msg.site, &root), &msg.sig) {
            Ok(())
        } else {
            Err(Refused::BadSignature(msg.site))
        }
    }
}

impl SignedMessage {
    /// Whether it was signed for `site` (or for every site).
    pub fn for_site(&self, site: SiteId) -> bool {
        self.to.is_none_or(|t| t == site)
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a signed message encodes")
    }
    /// Decodes a frame of at most `bytes_max` bytes (the signature is not checked here).
    pub fn decode(frame: &[u8], bytes_max: usize) -> Result<SignedMessage, Refused> {
        if frame.len() > bytes_max {
            return Err(Refused::TooLarge(frame.len(), bytes_max));
        }
        let msg: SignedMessage =
            postcard::from_bytes(frame).map_err(|e| Refused::Malformed(e.to_string()))?;
        if msg.path.siblings.len() > 16 {
            return Err(Refused::BadPath);
        }
        Ok(msg)
    }
}
