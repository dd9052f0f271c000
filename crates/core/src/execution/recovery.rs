//! Recovery requests as execution runs them (BFT-PR §4.4). A replica's recovery request is a
//! request of its reserved client ([`crate::message::recovery_client`]) whose operation is a
//! [`RecoveryOp`] and whose timestamp is its key holder's counter. Its result, a
//! [`RecoveryResult`], is a function of the reply table, the request and the agreed time, so
//! every replica computes the same bytes: accepted at most once per `recovery_interval_min_ms` within a key-holder
//! epoch, the checkpoint the recovery waits for, and under Prime the order key in force.
//!
//! What an accepted request means for the replica that runs it (fresh session keys, Prime's
//! fence, an event) is the caller's: the step says so ([`super::Step::Recovery`]).

use super::LastReply;
use crate::keys::epoch_of;
use crate::message::{recovery_replica, RecoveryOp, RecoveryResult};
use crate::types::{ClientId, ReplicaId, Seq};

/// How a batch treats the requests of the reserved recovery clients.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Recoveries {
    /// They do not run here and are not recorded (execution nodes: a recovery concerns the
    /// agreement replicas' keys only).
    Skip,
    /// They run by these rules (agreement replicas).
    Run(RecoveryRules),
}

/// The configuration a recovery request's result depends on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecoveryRules {
    /// Replicas: only the reserved clients of replicas `0..n` are recovery requests (the
    /// others run as ordinary requests).
    pub(crate) n: u32,
    pub(crate) interval_min_ms: u64,
    pub(crate) checkpoint_interval: Seq,
    pub(crate) log_size: Seq,
    /// Prime: an accepted request installs the order key it names.
    pub(crate) prime: bool,
    /// The mutant that refuses a new epoch's request within the interval (second review,
    /// G8).
    pub(crate) interval_only: bool,
}

impl Recoveries {
    /// The replica whose recovery request a request of client `c` is, if it is one here.
    pub(crate) fn replica_of(&self, c: ClientId) -> Option<ReplicaId> {
        match self {
            Recoveries::Skip => recovery_replica(c),
            Recoveries::Run(rules) => recovery_replica(c).filter(|r| *r < rules.n),
        }
    }
}

/// Runs replica `r`'s recovery request (operation bytes `op`, key-holder counter `counter`)
/// at `seq` (agreed time `time_ms`), `previous` being the last result recorded for its
/// client. Returns the result to record and whether the request was accepted: refused if
/// `r`'s previous accepted recovery is more recent than the interval (unless the request is
/// of a later key-holder epoch, signed after a reboot by the monitor, so that one signed in
/// advance while the replica was held cannot veto its real recovery).
pub(crate) fn run_recovery(
    rules: &RecoveryRules,
    previous: Option<&LastReply>,
    op: &[u8],
    counter: u64,
    seq: Seq,
    time_ms: u64,
) -> (Vec<u8>, bool) {
    let op = postcard::from_bytes::<RecoveryOp>(op).ok();
    let before = previous.and_then(|l| postcard::from_bytes::<RecoveryResult>(&l.result).ok());
    let previous_ms = before.as_ref().and_then(|p| p.last_accepted_ms);
    let previous_counter = before.as_ref().and_then(|p| p.last_accepted_counter);
    let previous_key = before.and_then(|p| p.row_key);
    let new_epoch =
        previous_counter.is_some_and(|c| epoch_of(counter) > epoch_of(c)) && !rules.interval_only;
    let accepted =
        new_epoch || previous_ms.is_none_or(|t| time_ms.saturating_sub(t) >= rules.interval_min_ms);
    let (k, l) = (rules.checkpoint_interval, rules.log_size);
    let h_r = seq / k * k + l;
    let target = if accepted {
        op.map_or(0, |op| op.h_m).max(h_r).min(h_r + l).div_ceil(k) * k
    } else {
        0
    };
    let fresh_key = op
        .and_then(|op| op.row_key)
        .filter(|_| accepted && rules.prime);
    let result = RecoveryResult {
        seq,
        accepted,
        last_accepted_ms: if accepted { Some(time_ms) } else { previous_ms },
        last_accepted_counter: if accepted {
            Some(counter)
        } else {
            previous_counter
        },
        target,
        row_key: fresh_key.map(|k| (counter, k)).or(previous_key),
    };
    (postcard::to_stdvec(&result).expect("encodes"), accepted)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Rules of four replicas, K = 4, L = 8, a 1 s interval.
    pub(in crate::execution) fn rules() -> RecoveryRules {
        RecoveryRules {
            n: 4,
            interval_min_ms: 1_000,
            checkpoint_interval: 4,
            log_size: 8,
            prime: false,
            interval_only: false,
        }
    }

    /// What a recovery request's result is after `previous` (counter, agreed time).
    fn recover(
        rules: &RecoveryRules,
        previous: Option<&LastReply>,
        counter: u64,
        time_ms: u64,
    ) -> (LastReply, RecoveryResult) {
        let (result, _) = run_recovery(rules, previous, &[], counter, 13, time_ms);
        let decoded = postcard::from_bytes(&result).unwrap();
        let last = LastReply {
            timestamp: counter,
            result,
        };
        (last, decoded)
    }

    #[test]
    fn a_recovery_within_the_interval_is_refused_unless_of_a_later_epoch() {
        let rules = rules();
        let (first, r) = recover(&rules, None, 1, 5_000);
        assert!(r.accepted);
        assert_eq!(r.target, 20, "max(H_M, H_R), H_M = 0 (no op), H_R = 12 + 8");
        let (refused, r) = recover(&rules, Some(&first), 2, 5_500);
        assert!(!r.accepted);
        assert_eq!(
            (r.last_accepted_ms, r.last_accepted_counter),
            (Some(5_000), Some(1))
        );
        assert!(
            recover(&rules, Some(&refused), 3, 6_000).1.accepted,
            "the interval passed"
        );
        let later_epoch = crate::keys::next_epoch(1);
        assert!(recover(&rules, Some(&first), later_epoch, 5_500).1.accepted);
        let mutant = RecoveryRules {
            interval_only: true,
            ..rules
        };
        assert!(
            !recover(&mutant, Some(&first), later_epoch, 5_500)
                .1
                .accepted
        );
    }
}
