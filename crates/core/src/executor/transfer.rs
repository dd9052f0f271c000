//! State transfer between execution nodes (BFT-PR §4.6.2 over the execution component's
//! fetch and serve, as replicas do): a node whose state differs from a checkpoint g+1 peers
//! vouch for, or that lags further than certificates reach, fetches that checkpoint from its
//! peers, page by page against the checkpoint digest, sealed under a state session with the
//! executors when bodies are sealed.
//!
//! Bounds: one transfer at a time; one vote per peer beyond the window (`far`); one served
//! state session per peer.

use super::*;
use crate::execution::{Answered, Due, Finished, Refused as ServeRefused, ServeLimits};
use crate::holder::HolderResult;

impl<S: Service, A: KeyTable> Executor<S, A> {
    /// A peer proved (threshold signature, or g+1 signed votes) that checkpoint `seq` with
    /// `digest` is stable: the checkpoint to fetch, even when no second correct peer votes
    /// for it to us (a faulty peer's votes lie).
    pub(super) fn accept_checkpoint_proof(&mut self, from: ExecutorId, seq: Seq, digest: Digest) {
        if seq > self.exec.last_executed() + self.cfg.log_size + self.cfg.checkpoint_interval {
            self.window.far.insert(from, (seq, digest));
        } else {
            self.window
                .votes
                .entry(seq)
                .or_default()
                .insert(from, digest);
        }
        self.fetch_checkpoint(seq, digest, true);
    }

    /// g+1 peers vouch for checkpoint `seq` (`digest`) that we do not hold: fetch it, after
    /// `state_transfer_delay_ms` unless `urgent` (certificates may still bring us there).
    pub(super) fn fetch_checkpoint(&mut self, seq: Seq, digest: Digest, urgent: bool) {
        if self.exec.transfer_target().is_some_and(|(s, _)| s >= seq) {
            return; // already fetching it or a later one
        }
        let delay = if urgent {
            0
        } else {
            self.cfg.state_transfer_delay_ms
        };
        let first = self.env.entropy % u64::from(self.cfg.executors.max(1));
        self.exec
            .start_transfer(seq, digest, self.env.now_ms, delay, first);
    }

    /// A vote of `from` far beyond our window: kept (the latest per peer); g+1 matching far
    /// votes are a checkpoint to fetch at once.
    pub(super) fn far_vote(&mut self, from: ExecutorId, seq: Seq, digest: Digest) {
        self.window.far.insert(from, (seq, digest));
        let matching = self
            .window
            .far
            .values()
            .filter(|v| **v == (seq, digest))
            .count();
        if matching >= self.cfg.exec_quorum() {
            self.fetch_checkpoint(seq, digest, true);
        }
    }

    /// On every tick: begin fetching when due, ask (again) for what is outstanding.
    pub(super) fn drive_transfer(&mut self) {
        match self.exec.transfer_due(self.env.now_ms) {
            Due::Nothing => return,
            Due::Begin => {
                self.exec.begin_walk();
                self.keying.new_transfer();
            }
            Due::Ask => {}
        }
        let voters: Vec<u32> = self
            .exec
            .transfer_target()
            .map(|(seq, digest)| {
                let near = self
                    .window
                    .votes
                    .get(&seq)
                    .map(|v| {
                        v.iter()
                            .filter(|(_, d)| **d == digest)
                            .map(|(e, _)| *e)
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                let far = self
                    .window
                    .far
                    .iter()
                    .filter(|(_, v)| **v == (seq, digest))
                    .map(|(e, _)| *e);
                near.into_iter().chain(far).collect()
            })
            .unwrap_or_default();
        self.exec
            .retry_with_next_replier(voters, self.id, self.cfg.executors);
        self.send_fetch();
    }

    fn send_fetch(&mut self) {
        let (max, retry) = (
            self.cfg.transfer_items_max,
            self.cfg.state_transfer_retry_ms,
        );
        let now = self.env.now_ms;
        let Some((to, mut fetch)) = self.exec.next_fetch(now, max, retry) else {
            return;
        };
        if self.cfg.confidential_bodies {
            let entropy = self.env.entropy;
            match self
                .keying
                .state_session(&mut self.auth, entropy, now, &mut self.effects)
            {
                Some(enc) => fetch.session = Some(enc),
                None => {
                    // Asked of the key holder (sent with its answer), or it failed (the retry
                    // timer asks again).
                    self.exec.unsend_fetch();
                    return;
                }
            }
        }
        self.send(Principal::Executor(to), &Message::from(fetch));
    }

    /// The key holder answered the call for our state session's randomness (`None`: given
    /// up): the FETCH that waited for it goes out.
    pub(super) fn state_session_answered(&mut self, result: Option<HolderResult>) {
        let entropy = self.env.entropy;
        if self
            .keying
            .state_session_answered(&self.auth, entropy, result, &mut self.effects)
        {
            self.send_fetch();
        }
    }

    /// The key holder answered the call opening `peer`'s state session `enc` (`None`: given
    /// up): the FETCH that waited for it is answered.
    pub(super) fn state_key_answered(
        &mut self,
        peer: Principal,
        enc: [u8; 32],
        result: Option<HolderResult>,
    ) {
        let waiting = self
            .keying
            .state_key_answered(peer, enc, result, &mut self.effects);
        if let (Some(f), Principal::Executor(e)) = (waiting, peer) {
            if let Err(reason) = self.on_fetch(e, f) {
                self.reject(peer, "fetch", reason);
            }
        }
    }

    pub(super) fn on_fetch(&mut self, from: ExecutorId, f: Fetch) -> Result<(), Reject> {
        if f.seq == 0 {
            return Err(Reject::Unexpected); // execution nodes do not probe
        }
        let limits = ServeLimits {
            items_max: self.cfg.transfer_items_max,
            reply_bytes_max: self.cfg.transfer_reply_bytes_max,
            rate_bytes_per_sec: self.cfg.transfer_rate_bytes_per_sec,
        };
        // Sealed under the fetcher's state session, whose key may first be asked of the key
        // holder (the FETCH is answered with its answer).
        let key = if self.cfg.confidential_bodies {
            let (peer, now) = (Principal::Executor(from), self.env.now_ms);
            match self
                .keying
                .state_key(&mut self.auth, peer, &f, now, &mut self.effects)?
            {
                Some(key) => Some(key),
                None => return Ok(()),
            }
        } else {
            None
        };
        let mut data = match self
            .exec
            .serve(from, &f, self.window.stable, self.env.now_ms, limits)
        {
            Ok((data, used)) => {
                self.stats.transfer_bytes_out += used as u64;
                data
            }
            Err(ServeRefused::Rejected(r)) => return Err(r),
            Err(ServeRefused::CorruptPage) => {
                self.event(Event::StateCorrupt { pages: 1 });
                self.exec.set_diverged(true);
                return Err(Reject::Stale);
            }
        };
        if let Some(key) = &key {
            crate::transfer::seal_answer(key, self.id, self.env.entropy, &mut data);
        }
        self.send(Principal::Executor(from), &Message::from(data));
        Ok(())
    }

    pub(super) fn on_state_data(
        &mut self,
        from: ExecutorId,
        mut d: StateData,
    ) -> Result<(), Reject> {
        if !self.exec.walking() {
            return Ok(()); // late, or for a transfer that ended
        }
        if self.cfg.confidential_bodies {
            self.keying.open_state(&mut d)?;
        } else if d.sealed.is_some() {
            return Err(Reject::BadState);
        }
        match self.exec.answer(from, &d, true)? {
            Answered::Nothing => Ok(()),
            Answered::Dirty => {
                self.exec.restart_walk();
                Ok(())
            }
            Answered::Ask => {
                self.send_fetch();
                Ok(())
            }
            Answered::Complete => {
                self.finish_transfer();
                Ok(())
            }
        }
    }

    /// The walk installed everything that differed: check the whole state and adopt it, as
    /// our stable checkpoint (g+1 vouch for it).
    fn finish_transfer(&mut self) {
        let Finished::Adopted {
            seq, digest, aux, ..
        } = self.exec.finish_walk(true)
        else {
            return; // our own pages changed under us: the walk starts again
        };
        if self.exec.load_aux(seq, &aux).is_err() {
            // g+1 vouch for this state: a page we kept must be corrupt; check, fetch again.
            self.exec.set_diverged(true);
            let report = self.exec.state_mut().check();
            self.event(Event::StateCorrupt {
                pages: report.corrupt.len() as u64,
            });
            return;
        }
        self.exec.set_diverged(false);
        self.stats.state_transfers += 1;
        self.exec.forget_checkpoints_but(self.window.stable, seq);
        self.exec.note_checkpoint(seq, digest);
        self.orders.forget_through(seq);
        self.window.done.clear();
        self.window.far.clear();
        self.window
            .votes
            .entry(seq)
            .or_default()
            .insert(self.id, digest);
        self.event(Event::StateTransferred {
            seq,
            digest,
            pages: 0,
            metas: 0,
        });
        self.make_stable(seq);
        self.acknowledge();
        self.try_execute();
    }
}
