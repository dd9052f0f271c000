//! What a member knows of the others: which incarnation of each it last heard, when, what it
//! said, and from that the set of members it is connected to (each hears the other). The group
//! membership of [`crate::machine`] is built on this table.

use crate::wire::{Beat, Instance, MemberId, Reject, ViewId, VipSet};

/// The last word from one configured member.
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    /// 0 until the member is first heard.
    pub incarnation: u64,
    pub last_seq: u64,
    pub last_heard_ms: Option<u64>,
    /// This incarnation announced a voluntary leave.
    pub left: bool,
    /// From its latest beat.
    pub hears: u64,
    pub view: Option<ViewId>,
    pub state: VipSet,
    pub state_mature: bool,
    pub held: VipSet,
    pub running: bool,
    pub mature: bool,
    /// When we last answered one of its beats out of turn.
    pub last_reply_ms: Option<u64>,
}

impl Peer {
    fn fresh(incarnation: u64) -> Peer {
        Peer {
            incarnation,
            last_seq: 0,
            last_heard_ms: None,
            left: false,
            hears: 0,
            view: None,
            state: VipSet::default(),
            state_mature: false,
            held: VipSet::default(),
            running: false,
            mature: false,
            last_reply_ms: None,
        }
    }
}

/// The table of peers, indexed by position in the configured (ascending) member list.
#[derive(Clone, Debug)]
pub(crate) struct Peers {
    members: Vec<MemberId>,
    me_pos: usize,
    peers: Vec<Peer>,
    suspect_ms: u64,
}

impl Peers {
    pub fn new(members: Vec<MemberId>, me_pos: usize, suspect_ms: u64) -> Peers {
        assert!(members.windows(2).all(|w| w[0] < w[1]), "members ascending");
        assert!(me_pos < members.len());
        let peers = vec![Peer::fresh(0); members.len()];
        Peers {
            members,
            me_pos,
            peers,
            suspect_ms,
        }
    }

    pub fn position(&self, id: MemberId) -> Option<usize> {
        self.members.binary_search(&id).ok()
    }

    pub fn get_mut(&mut self, pos: usize) -> &mut Peer {
        &mut self.peers[pos]
    }

    /// The peer with this id and exactly this incarnation, if that is the one we know.
    pub fn instance(&self, inst: Instance) -> Option<&Peer> {
        let p = &self.peers[self.position(inst.id)?];
        (p.incarnation == inst.incarnation).then_some(p)
    }

    /// Freshness of a datagram from `pos`: a newer incarnation replaces everything we knew of
    /// the member; an older one is refused while the known one is alive (after that it is a
    /// restart with a clock set back, and replaces it too); an announced leave or a sequence
    /// number already seen is refused.
    pub fn accept(
        &mut self,
        pos: usize,
        now_ms: u64,
        incarnation: u64,
        seq: u64,
    ) -> Result<(), Reject> {
        assert_ne!(pos, self.me_pos);
        let alive = self.alive(pos, now_ms);
        let p = &mut self.peers[pos];
        if incarnation == 0 || (incarnation < p.incarnation && alive) {
            return Err(Reject::StaleIncarnation);
        }
        if incarnation != p.incarnation {
            *p = Peer::fresh(incarnation);
        }
        if p.left {
            return Err(Reject::AfterLeave);
        }
        if seq <= p.last_seq {
            return Err(Reject::Replayed);
        }
        p.last_seq = seq;
        Ok(())
    }

    pub fn record_beat(&mut self, pos: usize, now_ms: u64, b: &Beat) {
        let p = &mut self.peers[pos];
        debug_assert_eq!(p.incarnation, b.incarnation);
        p.last_heard_ms = Some(now_ms);
        p.hears = b.hears;
        p.view = Some(b.view);
        p.state = b.state;
        p.state_mature = b.state_mature;
        p.held = b.held;
        p.running = b.running;
        p.mature = b.mature;
    }

    /// Whether this incarnation of the member at `pos` has already announced its leave (the
    /// leave is sent twice; the copy is not an error).
    pub fn has_left(&self, pos: usize, incarnation: u64) -> bool {
        let p = &self.peers[pos];
        p.left && p.incarnation == incarnation
    }

    pub fn record_leave(&mut self, pos: usize) {
        let p = &mut self.peers[pos];
        p.left = true;
        p.last_heard_ms = None;
        p.held = VipSet::default();
    }

    /// Heard from within `suspect_ms` and not departed.
    pub fn alive(&self, pos: usize, now_ms: u64) -> bool {
        let p = &self.peers[pos];
        pos != self.me_pos
            && !p.left
            && p.last_heard_ms
                .is_some_and(|t| now_ms < t.saturating_add(self.suspect_ms))
    }

    /// The members we hear, as the bitmap our beats carry.
    pub fn hears_bitmap(&self, now_ms: u64) -> u64 {
        (0..self.members.len())
            .filter(|pos| self.alive(*pos, now_ms))
            .fold(0, |acc, pos| acc | 1 << pos)
    }

    /// Ourselves and every member we hear that also says it hears us, ascending by id: the
    /// membership a coordinator proposes. Requiring both directions keeps a member that can
    /// send but not receive (or the reverse) out of views it could not take part in.
    pub fn connected(&self, now_ms: u64, me: Instance) -> Vec<Instance> {
        (0..self.members.len())
            .filter_map(|pos| {
                if pos == self.me_pos {
                    return Some(me);
                }
                let p = &self.peers[pos];
                (self.alive(pos, now_ms) && p.hears & (1 << self.me_pos) != 0).then_some(Instance {
                    id: self.members[pos],
                    incarnation: p.incarnation,
                })
            })
            .collect()
    }

    /// Structural checks of a beat that passed authentication. Members are honest but the
    /// datagram may come from a member with a different build; nothing here may panic.
    pub fn valid_beat(&self, b: &Beat, addresses: usize) -> bool {
        let n = self.members.len();
        let sender = Instance {
            id: b.from,
            incarnation: b.incarnation,
        };
        let coordinator = Instance {
            id: b.view.coordinator,
            incarnation: b.view.coordinator_incarnation,
        };
        !b.members.is_empty()
            && b.members.len() <= n
            && b.members.windows(2).all(|w| w[0].id < w[1].id)
            && b.members
                .iter()
                .all(|m| self.position(m.id).is_some() && m.incarnation > 0)
            && b.members.binary_search(&sender).is_ok()
            && b.members.binary_search(&coordinator).is_ok()
            && b.view.epoch > 0
            && b.state.within(addresses)
            && b.held.within(addresses)
            && (n == 64 || b.hears >> n == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(from: MemberId, inc: u64, seq: u64, hears: u64) -> Beat {
        Beat {
            from,
            incarnation: inc,
            seq,
            view: ViewId {
                epoch: 1,
                coordinator: from,
                coordinator_incarnation: inc,
            },
            members: vec![Instance {
                id: from,
                incarnation: inc,
            }],
            state: VipSet::default(),
            state_mature: false,
            held: VipSet::default(),
            hears,
            running: true,
            mature: false,
        }
    }

    #[test]
    fn freshness_rules() {
        let mut p = Peers::new(vec![1, 2, 3], 0, 100);
        // (now, incarnation, seq, expected); a beat is recorded after each accepted datagram.
        let table: &[(u64, u64, u64, Result<(), Reject>)] = &[
            (0, 0, 1, Err(Reject::StaleIncarnation)),
            (0, 5, 1, Ok(())),
            (1, 5, 1, Err(Reject::Replayed)),
            (2, 5, 0, Err(Reject::Replayed)),
            (3, 5, 9, Ok(())),
            (4, 4, 10, Err(Reject::StaleIncarnation)),
            (5, 6, 1, Ok(())), // restarted: sequence numbers start again
            (50, 5, 10, Err(Reject::StaleIncarnation)),
            // Silent for suspect_ms: an older incarnation is a restart with the clock set back.
            (200, 3, 1, Ok(())),
        ];
        for (now, inc, seq, want) in table {
            let got = p.accept(1, *now, *inc, *seq);
            assert_eq!(got, *want, "at {now}: inc {inc} seq {seq}");
            if got.is_ok() {
                p.record_beat(1, *now, &beat(2, *inc, *seq, 0));
            }
        }
        p.record_leave(1);
        assert_eq!(p.accept(1, 300, 3, 2), Err(Reject::AfterLeave));
        assert_eq!(
            p.accept(1, 300, 7, 1),
            Ok(()),
            "a new incarnation may come back"
        );
    }

    #[test]
    fn connected_needs_both_directions_and_recent_word() {
        let me = Instance {
            id: 1,
            incarnation: 9,
        };
        let mut p = Peers::new(vec![1, 2, 3], 0, 100);
        p.accept(1, 0, 4, 1).unwrap();
        p.record_beat(1, 10, &beat(2, 4, 1, 0b001)); // 2 hears us
        p.accept(2, 0, 4, 1).unwrap();
        p.record_beat(2, 10, &beat(3, 4, 1, 0b010)); // 3 hears only 2
        let c = p.connected(50, me);
        assert_eq!(c.iter().map(|i| i.id).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(p.hears_bitmap(50), 0b110);
        // Silence for suspect_ms: suspected.
        assert_eq!(p.connected(110, me), vec![me]);
        assert_eq!(p.hears_bitmap(110), 0);
    }

    #[test]
    fn structural_checks() {
        let p = Peers::new(vec![1, 2, 3], 0, 100);
        let ok = beat(2, 4, 1, 0b111);
        assert!(p.valid_beat(&ok, 4));
        let mut cases: Vec<(&str, Beat)> = Vec::new();
        let mut b = ok.clone();
        b.hears = 0b1000;
        cases.push(("hears beyond the group", b));
        let mut b = ok.clone();
        b.held.insert(4);
        cases.push(("address index out of range", b));
        let mut b = ok.clone();
        b.members.clear();
        cases.push(("no members", b));
        let mut b = ok.clone();
        b.members.insert(
            0,
            Instance {
                id: 9,
                incarnation: 1,
            },
        );
        cases.push(("unknown member", b));
        let mut b = ok.clone();
        b.members.push(Instance {
            id: 1,
            incarnation: 1,
        });
        cases.push(("unsorted", b));
        let mut b = ok.clone();
        b.view.coordinator = 3;
        cases.push(("coordinator not a member", b));
        let mut b = ok.clone();
        b.view.epoch = 0;
        cases.push(("epoch zero", b));
        let mut b = ok;
        b.members[0].incarnation = 5;
        cases.push(("sender not in its view", b));
        for (name, b) in cases {
            assert!(!p.valid_beat(&b, 4), "{name}");
        }
    }
}
