//! Fetching state (BFT-PR §4.6.2): the walk of a checkpoint whose digest f+1 replicas vouch
//! for, asked of one designated replier at a time, and probes for a checkpoint to fetch when
//! the state is known bad. See [`crate::transfer::Walk`] for the checks of every answer.

use super::Execution;
use crate::message::{Fetch, FetchItem, Reject, StateData, StateItem};
use crate::service::Service;
use crate::transfer::{checkpoint_digest_of, rebuild_meta, Walk};
use crate::types::{ReplicaId, Seq};
use redoubt_crypto::Digest;
use std::collections::BTreeSet;

/// A checkpoint being fetched.
pub(crate) struct Transfer {
    seq: Seq,
    digest: Digest,
    next_try_ms: u64,
    attempt: u64,
    /// The walk, once fetching began (the service's writes since the latest checkpoint were
    /// rolled back then; execution waits until the transfer ends).
    walk: Option<Walk>,
    /// Repliers that sent answers failing their digests during this transfer.
    bad: BTreeSet<ReplicaId>,
    replier: Option<ReplicaId>,
}

/// What driving the transfer calls for now.
pub(crate) enum Due {
    /// No transfer, or nothing due yet.
    Nothing,
    /// Fetching begins: the tentative batch must be undone first, then [`Execution::begin_walk`].
    Begin,
    /// Ask (again) for what is outstanding.
    Ask,
}

/// What an answer to our FETCH did.
pub(crate) enum Answered {
    /// Nothing to do now.
    Nothing,
    /// Our state changed under the walk (only a test's tampering writes during one): the
    /// tentative batch must be undone, then [`Execution::restart_walk`].
    Dirty,
    /// Every partition that differed is installed: [`Execution::finish_walk`].
    Complete,
    /// Ask for the next partitions right away.
    Ask,
}

/// How a completed walk ended.
pub(crate) enum Finished {
    /// The installed state did not check out against the checkpoint (our own pages changed
    /// under us): the walk starts again from the root, asking for everything.
    Again,
    /// The checkpoint's pages are installed and adopted; its auxiliary bytes still need
    /// loading ([`Execution::load_aux`]).
    Adopted {
        seq: Seq,
        digest: Digest,
        aux: Vec<u8>,
        pages: u64,
        metas: u64,
    },
}

impl<S: Service> Execution<S> {
    /// The checkpoint being fetched, if any.
    pub(crate) fn transfer_target(&self) -> Option<(Seq, Digest)> {
        self.transfer.as_ref().map(|t| (t.seq, t.digest))
    }

    /// Whether fetching began (execution waits until the transfer ends).
    pub(crate) fn walking(&self) -> bool {
        self.transfer.as_ref().is_some_and(|t| t.walk.is_some())
    }

    /// Whether our state differs from one f+1 replicas vouch for (execution stops until the
    /// vouched state is fetched).
    pub(crate) fn diverged(&self) -> bool {
        self.diverged
    }

    pub(crate) fn set_diverged(&mut self, diverged: bool) {
        self.diverged = diverged;
    }

    /// Whether our state is known bad (diverged, or with corrupt pages).
    pub(crate) fn repairing(&self) -> bool {
        self.diverged || self.state.needs_repair()
    }

    /// Forgets the transfer (all of it, or only one that has not begun fetching, or one for a
    /// checkpoint above `seq`).
    pub(crate) fn drop_transfer(&mut self) {
        self.transfer = None;
    }

    pub(crate) fn drop_unbegun_transfer(&mut self) {
        if self.transfer.as_ref().is_some_and(|t| t.walk.is_none()) {
            self.transfer = None;
        }
    }

    pub(crate) fn drop_transfer_above(&mut self, seq: Seq) {
        if self.transfer.as_ref().is_some_and(|t| t.seq > seq) {
            self.transfer = None;
        }
    }

    /// The `lc` to ask partitions with: our latest checkpoint if we trust our copy of it, 0
    /// (everything) if our state diverged or has corrupt pages.
    fn fetch_lc(&self) -> Seq {
        if self.repairing() {
            0
        } else {
            self.state.latest()
        }
    }

    /// Fetch checkpoint `seq` (`digest`) after `delay_ms`. A walk in progress moves to a newer
    /// checkpoint at once: installed pages stay, the walk restarts at the root (the old
    /// checkpoint may be collected by now). `first_attempt` picks the first replier.
    pub(crate) fn start_transfer(
        &mut self,
        seq: Seq,
        digest: Digest,
        now: u64,
        delay_ms: u64,
        first_attempt: u64,
    ) {
        if seq < self.state.base_seq() {
            // Our durable base is already a later verified checkpoint; moving it backwards
            // would leave the journal naming a checkpoint the page file no longer holds.
            return;
        }
        if let Some(t) = &self.transfer {
            if t.seq > seq || (t.seq == seq && t.digest == digest) {
                return;
            }
        }
        let walk = self.transfer.take().and_then(|t| t.walk);
        let moving = walk.is_some();
        self.transfer = Some(Transfer {
            seq,
            digest,
            next_try_ms: if moving { 0 } else { now + delay_ms },
            attempt: first_attempt,
            walk: walk.map(|w| {
                let mut fresh = Walk::new(seq, digest, 0);
                fresh.stats = w.stats;
                fresh
            }),
            bad: BTreeSet::new(),
            replier: None,
        });
    }

    /// What the transfer calls for at `now`. A transfer that has not begun is dropped once
    /// execution caught up with its checkpoint on its own.
    pub(crate) fn transfer_due(&mut self, now: u64) -> Due {
        let Some(t) = self.transfer.as_ref() else {
            return Due::Nothing;
        };
        if t.walk.is_none() {
            if self.last_executed >= t.seq && !self.repairing() {
                self.transfer = None;
                return Due::Nothing;
            }
            if now < t.next_try_ms {
                return Due::Nothing;
            }
            return Due::Begin;
        }
        if now < t.next_try_ms {
            Due::Nothing
        } else {
            Due::Ask
        }
    }

    /// Fetching begins: the service's writes since our latest checkpoint are undone (the
    /// tentative batch already was) so that every page we keep is described by our tree.
    pub(crate) fn begin_walk(&mut self) {
        self.state.revert_to_latest();
        let lc = self.fetch_lc();
        if let Some(t) = self.transfer.as_mut() {
            t.walk = Some(Walk::new(t.seq, t.digest, lc));
        }
    }

    /// After our state changed under the walk: roll back and walk again from the root.
    pub(crate) fn restart_walk(&mut self) {
        self.state.revert_to_latest();
        if let Some(t) = self.transfer.as_mut() {
            let stats = t.walk.as_ref().map(|w| w.stats).unwrap_or_default();
            let mut fresh = Walk::new(t.seq, t.digest, 0);
            fresh.stats = stats;
            t.walk = Some(fresh);
            t.next_try_ms = 0;
        }
    }

    /// The FETCH [`Execution::next_fetch`] just made did not go out (its state session was
    /// not ready): what it asked is asked again with the next one.
    pub(crate) fn unsend_fetch(&mut self) {
        if let Some(w) = self.transfer.as_mut().and_then(|t| t.walk.as_mut()) {
            w.requeue();
        }
    }

    /// Whatever was asked and not answered is asked again, of the next designated replier:
    /// in turn among `voters` (the replicas that vouched for the checkpoint), all others if
    /// none did, skipping any that sent a wrong answer. `me` is this replica, of `n`.
    pub(crate) fn retry_with_next_replier(
        &mut self,
        voters: Vec<ReplicaId>,
        me: ReplicaId,
        n: u32,
    ) {
        let Some(t) = self.transfer.as_mut() else {
            return;
        };
        if let Some(w) = t.walk.as_mut() {
            w.requeue();
        }
        let mut candidates: Vec<ReplicaId> = voters
            .into_iter()
            .filter(|r| *r != me && !t.bad.contains(r))
            .collect();
        if candidates.is_empty() {
            candidates = (0..n).filter(|r| *r != me && !t.bad.contains(r)).collect();
        }
        if candidates.is_empty() {
            candidates = (0..n).filter(|r| *r != me).collect();
        }
        t.replier = Some(candidates[(t.attempt % candidates.len() as u64) as usize]);
        t.attempt += 1;
    }

    /// The next FETCH for the designated replier (up to `items_max` partitions), arming the
    /// retry timer (`retry_ms`).
    pub(crate) fn next_fetch(
        &mut self,
        now: u64,
        items_max: usize,
        retry_ms: u64,
    ) -> Option<(ReplicaId, Fetch)> {
        let t = self.transfer.as_mut()?;
        let (Some(w), Some(to)) = (t.walk.as_mut(), t.replier) else {
            return None;
        };
        let items = w.next_items(items_max);
        t.next_try_ms = now + retry_ms;
        if items.is_empty() {
            return None;
        }
        Some((
            to,
            Fetch {
                seq: t.seq,
                items,
                session: None,
            },
        ))
    }

    /// With a known-bad state and no checkpoint to fetch: whether to ask every replica for
    /// the root of its latest stable checkpoint now (every `retry_ms`); the FETCH to send.
    pub(crate) fn probe_due(&mut self, now: u64, retry_ms: u64) -> Option<Fetch> {
        if !self.repairing() || now < self.next_probe_ms {
            return None;
        }
        self.next_probe_ms = now + retry_ms;
        Some(Fetch {
            seq: 0,
            items: vec![FetchItem {
                level: 0,
                index: 0,
                lc: 0,
            }],
            session: None,
        })
    }

    /// An answer to our FETCH from `from` while walking. `check_pages` is false only in the
    /// simulator's `trust-replier` mutant. A wrong answer is `Err(Reject::BadState)`: its
    /// sender is avoided and what is still asked is asked of another at the next tick.
    pub(crate) fn answer(
        &mut self,
        from: ReplicaId,
        d: &StateData,
        check_pages: bool,
    ) -> Result<Answered, Reject> {
        let t = self.transfer.as_ref().expect("walking");
        if d.seq != t.seq || t.bad.contains(&from) {
            return Err(Reject::Stale);
        }
        if d.items.is_empty() {
            // The replier no longer holds the checkpoint (or has nothing to give): ask another
            // now; a newer vouched checkpoint moves the walk when its votes arrive.
            if t.replier == Some(from) {
                if let Some(t) = self.transfer.as_mut() {
                    t.next_try_ms = 0;
                }
            }
            return Ok(Answered::Nothing);
        }
        let lc = self.fetch_lc();
        if self.state.is_dirty() {
            // The rollback may undo installed pages too, so the walk starts again.
            return Ok(Answered::Dirty);
        }
        let mut t = self.transfer.take().expect("walking");
        let mut w = t.walk.take().expect("walking");
        let result = w.accept(&mut self.state, d, lc, check_pages);
        if t.replier == Some(from) && matches!(result, Ok(n) if n > 0) {
            // The designated replier answered; whatever it left out (over its answer budget)
            // is asked again at once rather than after the retry timer.
            w.requeue();
        }
        let complete = w.is_complete();
        let more = w.has_todo();
        t.walk = Some(w);
        let applied = match result {
            Ok(n) => n,
            Err(e) => {
                if e == Reject::BadState {
                    t.bad.insert(from);
                    t.next_try_ms = 0; // ask another replier at the next tick
                }
                self.transfer = Some(t);
                return Err(e);
            }
        };
        if complete {
            self.transfer = Some(t);
            return Ok(Answered::Complete);
        }
        let ask = applied > 0 && more;
        if ask && t.replier.is_none() {
            // Keep the designated replier busy.
            t.replier = Some(from);
        }
        self.transfer = Some(t);
        Ok(if ask {
            Answered::Ask
        } else {
            Answered::Nothing
        })
    }

    /// The walk installed everything that differed: check the whole state against the
    /// checkpoint digest and adopt it. `recheck` is false only in the `trust-replier` mutant.
    pub(crate) fn finish_walk(&mut self, recheck: bool) -> Finished {
        let mut t = self.transfer.take().expect("transfer in progress");
        let w = t.walk.take().expect("walking");
        let aux = w.aux().expect("complete walks have the root").to_vec();
        let root = self.state.installed_root();
        let rechecked = if recheck {
            self.state.check_changed()
        } else {
            0
        };
        let unrepaired = rechecked + self.state.revalidate();
        if unrepaired > 0 || checkpoint_digest_of(t.seq, &root, &aux) != t.digest {
            t.walk = Some(Walk::new(t.seq, t.digest, 0));
            t.next_try_ms = 0;
            self.transfer = Some(t);
            return Finished::Again;
        }
        self.state.adopt_installed(t.seq, aux.clone());
        Finished::Adopted {
            seq: t.seq,
            digest: t.digest,
            aux,
            pages: w.stats.pages,
            metas: w.stats.metas,
        }
    }

    /// An answer to a probe (FETCH for seq 0): the root of the sender's stable checkpoint,
    /// as the checkpoint vote it amounts to, for checkpoint interval `k`.
    pub(crate) fn probe_answer(&mut self, d: &StateData, k: Seq) -> Result<(Seq, Digest), Reject> {
        if !self.repairing() {
            return Err(Reject::Stale);
        }
        let (
            Some(aux),
            Some(StateItem::Meta {
                level: 0,
                index: 0,
                children,
            }),
        ) = (d.aux.as_ref(), d.items.first())
        else {
            return Err(Reject::Inconsistent);
        };
        if !d.seq.is_multiple_of(k) {
            return Err(Reject::Inconsistent);
        }
        let Some((root, _)) = rebuild_meta(&mut self.state, (0, 0), 0, children) else {
            return Err(Reject::BadState);
        };
        Ok((d.seq, checkpoint_digest_of(d.seq, &root.digest, aux)))
    }
}
