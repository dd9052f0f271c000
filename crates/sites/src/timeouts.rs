//! Global timeouts as locally ordered events (Amir et al. 2009 trap 1; ADR 0010, decision 2).
//!
//! The logical machine has no clock. When it arms a timer (a global protocol timer `key`, in
//! its `round`-th arming), every server watches that timer against its own clock and, when it
//! expires there, proposes `(key, round)` to local ordering. The timeout fires in the logical
//! machine when the (f+1)-th distinct server's proposal is locally executed: at least one
//! correct server's clock then ran out, so faulty servers alone cannot fire a timeout early
//! (making a site suspect a correct leader site), and they cannot hold one back either, because
//! the correct servers' proposals are enough.
//!
//! Every correct server executes the same proposals in the same order, so every one of them
//! fires the same timeouts at the same point of the local order.
//!
//! Bounds: one round per key (the global protocol's timers are a fixed set) and at most one
//! vote per server in it.

use crate::Server;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug)]
struct Armed {
    round: u64,
    voters: BTreeSet<Server>,
    fired: bool,
}

/// Why a proposal did not count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VoteIgnored {
    #[error("the timer is not armed")]
    NotArmed,
    #[error("the proposal names another round than the armed one")]
    OtherRound,
    #[error("the timeout already fired in this round")]
    Fired,
    #[error("this server already proposed this round")]
    Repeated,
    #[error("no such server")]
    UnknownServer,
}

/// The timers a logical machine has armed and the proposals counted for each.
#[derive(Clone, Debug)]
pub struct TimeoutVotes<K> {
    servers: usize,
    armed: BTreeMap<K, Armed>,
}

impl<K: Ord + Clone> TimeoutVotes<K> {
    pub fn new(servers: usize) -> TimeoutVotes<K> {
        assert!(servers >= 4 && (servers - 1).is_multiple_of(3));
        TimeoutVotes {
            servers,
            armed: BTreeMap::new(),
        }
    }

    fn f(&self) -> usize {
        (self.servers - 1) / 3
    }

    /// The logical machine armed `key` for `round` (rounds of one key only go up; arming a
    /// round again, or an older one, changes nothing).
    pub fn arm(&mut self, key: K, round: u64) {
        match self.armed.get(&key) {
            Some(a) if a.round >= round => {}
            _ => {
                self.armed.insert(
                    key,
                    Armed {
                        round,
                        voters: BTreeSet::new(),
                        fired: false,
                    },
                );
            }
        }
    }

    /// The logical machine cancelled `key`: proposals for it no longer count.
    pub fn disarm(&mut self, key: &K) {
        self.armed.remove(key);
    }

    /// The round `key` is armed for, if it is armed and has not fired.
    pub fn armed(&self, key: &K) -> Option<u64> {
        self.armed.get(key).filter(|a| !a.fired).map(|a| a.round)
    }

    /// A proposal of `server` that `key`'s `round` expired was locally executed. `Ok(true)`:
    /// this proposal is the (f+1)-th, and the timeout fires now.
    pub fn executed(&mut self, server: Server, key: &K, round: u64) -> Result<bool, VoteIgnored> {
        if server.0 as usize >= self.servers {
            return Err(VoteIgnored::UnknownServer);
        }
        let f = self.f();
        let a = self.armed.get_mut(key).ok_or(VoteIgnored::NotArmed)?;
        if a.round != round {
            return Err(VoteIgnored::OtherRound);
        }
        if a.fired {
            return Err(VoteIgnored::Fired);
        }
        if !a.voters.insert(server) {
            return Err(VoteIgnored::Repeated);
        }
        if a.voters.len() > f {
            a.fired = true;
            a.voters.clear();
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_fires_at_the_f_plus_first_distinct_proposal() {
        let mut t = TimeoutVotes::new(4);
        t.arm("suspect", 1);
        assert_eq!(t.executed(Server(3), &"suspect", 1), Ok(false));
        // The same faulty server again does not count, nor does another round.
        assert_eq!(
            t.executed(Server(3), &"suspect", 1),
            Err(VoteIgnored::Repeated)
        );
        assert_eq!(
            t.executed(Server(2), &"suspect", 2),
            Err(VoteIgnored::OtherRound)
        );
        assert_eq!(t.executed(Server(0), &"suspect", 1), Ok(true));
        assert_eq!(
            t.executed(Server(1), &"suspect", 1),
            Err(VoteIgnored::Fired)
        );
        assert_eq!(t.armed(&"suspect"), None);
    }

    #[test]
    fn f_faulty_servers_alone_cannot_fire_a_timeout() {
        let mut t = TimeoutVotes::new(7); // f = 2
        t.arm(7u8, 4);
        assert_eq!(t.executed(Server(5), &7, 4), Ok(false));
        assert_eq!(t.executed(Server(6), &7, 4), Ok(false));
        assert_eq!(t.armed(&7), Some(4));
        assert_eq!(t.executed(Server(0), &7, 4), Ok(true));
    }

    #[test]
    fn rearming_starts_a_new_count_and_disarming_stops_it() {
        let mut t = TimeoutVotes::new(4);
        t.arm(1u8, 1);
        t.executed(Server(0), &1, 1).unwrap();
        t.arm(1, 2);
        assert_eq!(t.executed(Server(1), &1, 2), Ok(false), "old votes dropped");
        t.arm(1, 1); // an older round changes nothing
        assert_eq!(t.executed(Server(2), &1, 2), Ok(true));
        t.arm(1, 3);
        t.disarm(&1);
        assert_eq!(t.executed(Server(0), &1, 3), Err(VoteIgnored::NotArmed));
        assert_eq!(
            t.executed(Server(9), &1, 3),
            Err(VoteIgnored::UnknownServer)
        );
    }
}
