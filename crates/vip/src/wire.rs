//! The datagrams members exchange, their authentication and their bounded, fallible decoding.
//!
//! A datagram is `magic (4) | version (1) | group fingerprint (8) | body (postcard) | MAC (16)`.
//! The MAC is the group key's MAC over a digest of everything before it, so a datagram from a
//! host without the key, or altered on the way, is rejected before its body is decoded. The
//! fingerprint is a digest of the configured members and addresses: members configured with
//! different groups refuse each other's datagrams with a reason of their own
//! ([`Reject::GroupMismatch`]) rather than a bare MAC failure.

use redoubt_crypto::{Digest, DigestBuilder, Mac, MacKey, MAC_LEN};
use serde::{Deserialize, Serialize};

/// A member's id, as configured.
pub type MemberId = u32;

/// Largest datagram sent or accepted, in bytes. The largest [`Beat`] (every limit at its
/// maximum) is about 1,100 bytes.
pub const DATAGRAM_BYTES_MAX: usize = 2048;
/// Most members a group may have (the `hears` bitmap is one `u64`).
pub const MEMBERS_MAX: usize = 64;
/// Most virtual addresses a group may manage (a [`VipSet`] is 256 bits).
pub const ADDRESSES_MAX: usize = 256;

const MAGIC: [u8; 4] = *b"RVIP";
const VERSION: u8 = 1;
const FINGERPRINT_LEN: usize = 8;
const HEADER_LEN: usize = MAGIC.len() + 1 + FINGERPRINT_LEN;
const MAC_DOMAIN: &str = "redoubt-vip datagram v1";

/// One run of one member: its id and the incarnation it started with. A member that restarts
/// comes back with a larger incarnation, so the others can tell it holds nothing any more.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct Instance {
    pub id: MemberId,
    pub incarnation: u64,
}

/// A membership view's identifier, totally ordered: a member moves only to a larger view.
/// The coordinator that proposed it is part of the id, so two members proposing at once
/// never make two different views with the same id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct ViewId {
    pub epoch: u64,
    pub coordinator: MemberId,
    pub coordinator_incarnation: u64,
}

impl std::fmt::Display for ViewId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.epoch, self.coordinator)
    }
}

/// A set of virtual addresses, by their index in the configured list.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug, Serialize, Deserialize)]
pub struct VipSet([u64; ADDRESSES_MAX / 64]);

impl VipSet {
    pub fn contains(&self, i: usize) -> bool {
        i < ADDRESSES_MAX && self.0[i / 64] & (1 << (i % 64)) != 0
    }

    pub fn insert(&mut self, i: usize) {
        assert!(i < ADDRESSES_MAX);
        self.0[i / 64] |= 1 << (i % 64);
    }

    pub fn remove(&mut self, i: usize) {
        assert!(i < ADDRESSES_MAX);
        self.0[i / 64] &= !(1 << (i % 64));
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The indices in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..ADDRESSES_MAX).filter(move |i| self.contains(*i))
    }

    pub fn intersection(&self, other: &VipSet) -> VipSet {
        let mut out = VipSet::default();
        for (o, (a, b)) in out.0.iter_mut().zip(self.0.iter().zip(other.0.iter())) {
            *o = a & b;
        }
        out
    }

    /// Whether every index is below `n` (network input is checked against the group's size).
    pub fn within(&self, n: usize) -> bool {
        self.iter().all(|i| i < n)
    }
}

/// The one periodic message: heartbeat, view announcement and Wackamole `STATE_MSG` at once.
/// A member sends it every `heartbeat_ms` to every configured member, and faster while it
/// gathers states; a member that receives a beat for a larger view that lists it installs
/// that view.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Beat {
    pub from: MemberId,
    pub incarnation: u64,
    /// Increases with every datagram the sender seals; older or repeated ones are dropped.
    pub seq: u64,
    /// The view the sender has installed.
    pub view: ViewId,
    /// That view's members, ascending by id (the paper's uniquely ordered membership list).
    pub members: Vec<Instance>,
    /// The sender's `STATE_MSG` for `view`: the addresses it held when it installed the view.
    /// Fixed for the whole view, so every member computes on the same table.
    pub state: VipSet,
    /// Whether the sender was mature when it installed `view`.
    pub state_mature: bool,
    /// The addresses the sender holds now (they only shrink while it gathers).
    pub held: VipSet,
    /// The configured members the sender currently hears, by position in the member list.
    pub hears: u64,
    /// Whether the sender has finished gathering states for `view` (the paper's RUN).
    pub running: bool,
    pub mature: bool,
}

/// A voluntary departure: the sender has released its addresses and stops.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Leave {
    pub from: MemberId,
    pub incarnation: u64,
    pub seq: u64,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Message {
    Beat(Beat),
    Leave(Leave),
}

/// Why a datagram was refused. Counted per reason; never a panic.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Reject {
    TooShort,
    TooLong,
    BadMagic,
    BadVersion,
    /// Sealed for a group with other members or addresses.
    GroupMismatch,
    BadMac,
    Undecodable,
    /// Valid MAC and body followed by extra bytes.
    TrailingBytes,
    UnknownMember,
    FromSelf,
    /// Decoded, but inconsistent (unsorted members, indices out of range, ...).
    Invalid,
    /// From an earlier incarnation of the sender than one already heard.
    StaleIncarnation,
    /// A sequence number not above the last one accepted from that sender.
    Replayed,
    /// From an incarnation that has already left.
    AfterLeave,
}

impl Reject {
    pub const ALL: [Reject; 14] = [
        Reject::TooShort,
        Reject::TooLong,
        Reject::BadMagic,
        Reject::BadVersion,
        Reject::GroupMismatch,
        Reject::BadMac,
        Reject::Undecodable,
        Reject::TrailingBytes,
        Reject::UnknownMember,
        Reject::FromSelf,
        Reject::Invalid,
        Reject::StaleIncarnation,
        Reject::Replayed,
        Reject::AfterLeave,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reject::TooShort => "too_short",
            Reject::TooLong => "too_long",
            Reject::BadMagic => "bad_magic",
            Reject::BadVersion => "bad_version",
            Reject::GroupMismatch => "group_mismatch",
            Reject::BadMac => "bad_mac",
            Reject::Undecodable => "undecodable",
            Reject::TrailingBytes => "trailing_bytes",
            Reject::UnknownMember => "unknown_member",
            Reject::FromSelf => "from_self",
            Reject::Invalid => "invalid",
            Reject::StaleIncarnation => "stale_incarnation",
            Reject::Replayed => "replayed",
            Reject::AfterLeave => "after_leave",
        }
    }

    fn index(self) -> usize {
        Reject::ALL
            .iter()
            .position(|r| *r == self)
            .expect("every reason is in ALL")
    }
}

/// Rejected datagrams, counted by reason.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Rejects([u64; Reject::ALL.len()]);

impl Rejects {
    pub fn count(&mut self, r: Reject) {
        self.0[r.index()] += 1;
    }

    pub fn get(&self, r: Reject) -> u64 {
        self.0[r.index()]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The non-zero counters, for logs.
    pub fn nonzero(&self) -> Vec<(&'static str, u64)> {
        Reject::ALL
            .iter()
            .map(|r| (r.name(), self.get(*r)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// Seals and opens datagrams with the group key.
#[derive(Clone, Debug)]
pub struct Sealer {
    key: MacKey,
    fingerprint: [u8; FINGERPRINT_LEN],
}

impl Sealer {
    /// `group` is a digest of the group's configuration (see [`group_digest`]).
    pub fn new(key: MacKey, group: &Digest) -> Sealer {
        let mut fingerprint = [0; FINGERPRINT_LEN];
        fingerprint.copy_from_slice(&group.0[..FINGERPRINT_LEN]);
        Sealer { key, fingerprint }
    }

    pub fn seal(&self, msg: &Message) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.fingerprint);
        let body = postcard::to_allocvec(msg).expect("messages always serialize");
        out.extend_from_slice(&body);
        let mac = self.key.mac(&Digest::of_parts(MAC_DOMAIN, &[&out]));
        out.extend_from_slice(&mac.0);
        assert!(
            out.len() <= DATAGRAM_BYTES_MAX,
            "sealed datagram of {} bytes exceeds DATAGRAM_BYTES_MAX",
            out.len()
        );
        out
    }

    pub fn open(&self, bytes: &[u8]) -> Result<Message, Reject> {
        if bytes.len() < HEADER_LEN + 1 + MAC_LEN {
            return Err(Reject::TooShort);
        }
        if bytes.len() > DATAGRAM_BYTES_MAX {
            return Err(Reject::TooLong);
        }
        if bytes[..MAGIC.len()] != MAGIC {
            return Err(Reject::BadMagic);
        }
        if bytes[MAGIC.len()] != VERSION {
            return Err(Reject::BadVersion);
        }
        if bytes[MAGIC.len() + 1..HEADER_LEN] != self.fingerprint {
            return Err(Reject::GroupMismatch);
        }
        let (signed, mac_bytes) = bytes.split_at(bytes.len() - MAC_LEN);
        let mut mac = Mac::default();
        mac.0.copy_from_slice(mac_bytes);
        if !self
            .key
            .verify(&Digest::of_parts(MAC_DOMAIN, &[signed]), &mac)
        {
            return Err(Reject::BadMac);
        }
        let (msg, rest) = postcard::take_from_bytes::<Message>(&signed[HEADER_LEN..])
            .map_err(|_| Reject::Undecodable)?;
        if !rest.is_empty() {
            return Err(Reject::TrailingBytes);
        }
        Ok(msg)
    }
}

/// The digest that identifies a group: its member ids and its addresses, in order.
pub fn group_digest(members: &[MemberId], addresses: &[crate::Cidr]) -> Digest {
    let mut b = DigestBuilder::new("redoubt-vip group v1");
    b.u64(members.len() as u64);
    for m in members {
        b.u64(u64::from(*m));
    }
    b.u64(addresses.len() as u64);
    for a in addresses {
        b.bytes(&a.addr.octets()).u64(u64::from(a.prefix));
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(material: &[u8]) -> Sealer {
        let group = group_digest(&[1, 2, 3], &["10.0.0.1/24".parse().unwrap()]);
        Sealer::new(MacKey::derive("test", material), &group)
    }

    fn largest_beat() -> Beat {
        let mut all = VipSet::default();
        for i in 0..ADDRESSES_MAX {
            all.insert(i);
        }
        Beat {
            from: u32::MAX,
            incarnation: u64::MAX,
            seq: u64::MAX,
            view: ViewId {
                epoch: u64::MAX,
                coordinator: u32::MAX,
                coordinator_incarnation: u64::MAX,
            },
            members: (0..MEMBERS_MAX as u32)
                .map(|i| Instance {
                    id: u32::MAX - i,
                    incarnation: u64::MAX,
                })
                .collect(),
            state: all,
            state_mature: true,
            held: all,
            hears: u64::MAX,
            running: true,
            mature: true,
        }
    }

    #[test]
    fn the_largest_beat_fits_a_datagram_and_round_trips() {
        let s = sealer(b"k");
        let msg = Message::Beat(largest_beat());
        let bytes = s.seal(&msg);
        assert!(bytes.len() <= DATAGRAM_BYTES_MAX, "{}", bytes.len());
        assert_eq!(s.open(&bytes), Ok(msg));
    }

    #[test]
    fn every_kind_of_damage_is_rejected_with_its_reason() {
        let s = sealer(b"k");
        let good = s.seal(&Message::Leave(Leave {
            from: 1,
            incarnation: 7,
            seq: 3,
        }));
        let mut bad_mac = good.clone();
        let last = bad_mac.len() - 1;
        bad_mac[last] ^= 1;
        let mut body_flip = good.clone();
        body_flip[HEADER_LEN] ^= 0x40;
        let mut magic = good.clone();
        magic[0] = b'X';
        let mut version = good.clone();
        version[4] = 9;
        let other_group = Sealer::new(
            MacKey::derive("test", b"k"),
            &group_digest(&[1, 2], &["10.0.0.1/24".parse().unwrap()]),
        );
        let trailing = {
            // A valid MAC over a body with a byte appended.
            let mut v = good[..good.len() - MAC_LEN].to_vec();
            v.push(0);
            let mac = MacKey::derive("test", b"k").mac(&Digest::of_parts(MAC_DOMAIN, &[&v]));
            v.extend_from_slice(&mac.0);
            v
        };
        let garbage_body = {
            let mut v = good[..HEADER_LEN].to_vec();
            v.extend_from_slice(&[0xff; 12]);
            let mac = MacKey::derive("test", b"k").mac(&Digest::of_parts(MAC_DOMAIN, &[&v]));
            v.extend_from_slice(&mac.0);
            v
        };
        let other_key = sealer(b"other");
        let table: Vec<(&str, Vec<u8>, &Sealer, Reject)> = vec![
            ("empty", vec![], &s, Reject::TooShort),
            (
                "header only",
                good[..HEADER_LEN].to_vec(),
                &s,
                Reject::TooShort,
            ),
            (
                "too long",
                vec![0; DATAGRAM_BYTES_MAX + 1],
                &s,
                Reject::TooLong,
            ),
            ("magic", magic, &s, Reject::BadMagic),
            ("version", version, &s, Reject::BadVersion),
            ("mac flipped", bad_mac, &s, Reject::BadMac),
            ("body flipped", body_flip, &s, Reject::BadMac),
            ("other key", good.clone(), &other_key, Reject::BadMac),
            (
                "other group",
                good.clone(),
                &other_group,
                Reject::GroupMismatch,
            ),
            ("trailing", trailing, &s, Reject::TrailingBytes),
            ("garbage body", garbage_body, &s, Reject::Undecodable),
        ];
        for (name, bytes, opener, want) in table {
            assert_eq!(opener.open(&bytes), Err(want), "{name}");
        }
        assert!(s.open(&good).is_ok());
    }

    #[test]
    fn vip_sets() {
        let mut s = VipSet::default();
        for i in [0, 5, 63, 64, 200, 255] {
            s.insert(i);
        }
        assert_eq!(s.len(), 6);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 5, 63, 64, 200, 255]);
        assert!(!s.within(255) && s.within(256));
        s.remove(64);
        assert!(!s.contains(64) && s.contains(63));
        assert!(!s.contains(ADDRESSES_MAX + 3));
        let mut t = VipSet::default();
        t.insert(5);
        t.insert(6);
        assert_eq!(s.intersection(&t).iter().collect::<Vec<_>>(), vec![5]);
    }
}
