//! State transfer glue (BFT-PR §4.6.2): when to fetch, asking the execution component's
//! walk for the next FETCH, serving others, and adopting a fetched checkpoint.

use super::*;
use crate::holder::HolderResult;

impl<S: Service, A: KeyTable> Replica<S, A> {
    // ----- state transfer ---------------------------------------------------------------------

    /// Our state disagrees with what f+1 replicas vouch for: stop executing, check every page
    /// (corrupt ones are marked and counted) and fetch a vouched checkpoint.
    pub(super) fn on_divergence(&mut self) {
        self.exec.set_diverged(true);
        self.exec.drop_unbegun_transfer();
        let report = self.exec.state_mut().check();
        if !report.corrupt.is_empty() {
            self.stats.corrupt_pages_found += report.corrupt.len() as u64;
            self.event(Event::StateCorrupt {
                pages: report.corrupt.len() as u64,
            });
        }
    }

    pub(super) fn start_transfer(&mut self, seq: Seq, digest: Digest, urgent: bool) {
        let delay = if urgent {
            0
        } else {
            self.cfg.state_transfer_delay_ms
        };
        let first = self.env.entropy % self.cfg.n() as u64;
        self.exec
            .start_transfer(seq, digest, self.now(), delay, first);
    }

    pub(super) fn drive_transfer(&mut self) {
        if self.exec.transfer_target().is_none() {
            self.probe_for_checkpoint();
            return;
        }
        match self.exec.transfer_due(self.now()) {
            Due::Nothing => return,
            Due::Begin => {
                // Fetching begins: undo the writes since our latest checkpoint so every page
                // we keep is described by our tree, and stop executing until the transfer
                // ends. A tentative batch is undone first (its entries in the exactly-once
                // table too).
                self.undo_tentative();
                self.exec.begin_walk();
                // A new state session for every transfer (confidential bodies).
                self.keying.new_transfer();
            }
            Due::Ask => {}
        }
        // First ask, or a retry: whatever was asked and not answered is asked again, of
        // another replier.
        let voters = self
            .exec
            .transfer_target()
            .map(|(seq, digest)| self.ordering.ckpt_votes.voters(seq, &digest))
            .unwrap_or_default();
        self.exec
            .retry_with_next_replier(voters, self.id, self.cfg.n());
        self.send_fetch();
    }

    /// Asks the designated replier for the next partitions and arms the retry timer.
    pub(super) fn send_fetch(&mut self) {
        let (max, retry) = (
            self.cfg.transfer_items_max,
            self.cfg.state_transfer_retry_ms,
        );
        if let Some((to, mut fetch)) = self.exec.next_fetch(self.now(), max, retry) {
            if self.seals_state() {
                match self.state_session() {
                    Some(enc) => fetch.session = Some(enc),
                    None => {
                        // Asked of the key holder (sent with its answer), or it failed (the
                        // retry timer asks again).
                        self.exec.unsend_fetch();
                        return;
                    }
                }
            }
            self.send_replica(to, &Message::from(fetch));
        }
    }

    /// With a known-bad state and no checkpoint to fetch, ask every replica for the root of
    /// its latest stable checkpoint; f+1 matching answers give a digest to fetch.
    pub(super) fn probe_for_checkpoint(&mut self) {
        let retry = self.cfg.state_transfer_retry_ms;
        if let Some(fetch) = self.exec.probe_due(self.now(), retry) {
            let msg = Message::from(fetch);
            for r in 0..self.cfg.n() {
                self.send_replica(r, &msg);
            }
        }
    }

    pub(super) fn on_fetch(&mut self, from: ReplicaId, f: Fetch) -> Result<(), Reject> {
        let limits = ServeLimits {
            items_max: self.cfg.transfer_items_max,
            reply_bytes_max: self.cfg.transfer_reply_bytes_max,
            rate_bytes_per_sec: self.cfg.transfer_rate_bytes_per_sec,
        };
        // Under confidential bodies pages never leave in clear: the answer is sealed under
        // the fetcher's state session, whose key may first be asked of the key holder.
        let key = if self.seals_state() && f.seq != 0 {
            let (peer, now) = (Principal::Replica(from), self.now());
            let key =
                self.keying
                    .state_key(&mut self.auth, peer, &f, now, &mut self.out.effects)?;
            match key {
                Some(key) => Some(key),
                None => return Ok(()), // answered when the key holder has opened it
            }
        } else {
            None
        };
        match self.exec.serve(
            from,
            &f,
            self.ordering.ckpt_votes.stable_seq(),
            self.now(),
            limits,
        ) {
            Ok((mut data, used)) => {
                if let Some(key) = &key {
                    crate::transfer::seal_answer(key, self.id, self.env.entropy, &mut data);
                }
                self.stats.transfer_bytes_out += used as u64;
                self.send_replica(from, &Message::from(data));
                Ok(())
            }
            Err(Refused::Rejected(r)) => Err(r),
            Err(Refused::CorruptPage) => {
                // Our own page is corrupt: stop serving and repair ourselves.
                self.stats.corrupt_pages_found += 1;
                self.event(Event::StateCorrupt { pages: 1 });
                self.exec.set_diverged(true);
                Err(Reject::Stale)
            }
        }
    }

    pub(super) fn on_state_data(
        &mut self,
        from: ReplicaId,
        mut d: StateData,
        len: usize,
    ) -> Result<(), Reject> {
        self.stats.transfer_bytes_in += len as u64;
        if !self.exec.walking() {
            return self.on_probe_answer(from, d);
        }
        #[cfg(feature = "mutants")]
        let check_pages = self.cfg.mutant != crate::types::Mutant::TrustReplier;
        #[cfg(not(feature = "mutants"))]
        let check_pages = true;
        if self.seals_state() {
            self.open_state(&mut d)?;
        } else if d.sealed.is_some() {
            return Err(Reject::BadState);
        }
        match self.exec.answer(from, &d, check_pages) {
            Err(e) => {
                if e == Reject::BadState {
                    self.stats.transfer_bad_answers += 1;
                }
                Err(e)
            }
            Ok(Answered::Nothing) => Ok(()),
            Ok(Answered::Dirty) => {
                // Only a test's tampering writes during a walk. The rollback may undo
                // installed pages too, so the walk starts again from the root.
                self.undo_tentative();
                self.exec.restart_walk();
                Ok(())
            }
            Ok(Answered::Complete) => {
                self.finish_transfer();
                Ok(())
            }
            Ok(Answered::Ask) => {
                // Keep the designated replier busy: ask for the next partitions right away.
                self.send_fetch();
                Ok(())
            }
        }
    }

    /// An answer to a probe (`Fetch` for seq 0): the root of the sender's stable checkpoint.
    /// It counts as that replica's CHECKPOINT vote; f+1 matching ones start a transfer.
    pub(super) fn on_probe_answer(&mut self, from: ReplicaId, d: StateData) -> Result<(), Reject> {
        let (seq, digest) = self.exec.probe_answer(&d, self.cfg.checkpoint_interval)?;
        self.ordering.ckpt_votes.record(from, seq, digest);
        self.check_checkpoint(seq);
        Ok(())
    }

    /// The walk installed everything that differed: check the whole state against the
    /// checkpoint digest and adopt it.
    pub(super) fn finish_transfer(&mut self) {
        #[cfg(feature = "mutants")]
        let recheck = self.cfg.mutant != crate::types::Mutant::TrustReplier;
        #[cfg(not(feature = "mutants"))]
        let recheck = true;
        let Finished::Adopted {
            seq,
            digest,
            aux,
            pages,
            metas,
        } = self.exec.finish_walk(recheck)
        else {
            // Cannot happen when every answer checked out, unless our own pages changed
            // under us: the walk starts again from the root asking for everything.
            return;
        };
        let recoveries_before = self.recovery_timestamps();
        if self.exec.load_aux(seq, &aux).is_err() {
            // f+1 replicas vouch for this state, so a page we kept must be corrupt in a way our
            // entries did not show. Check every page, stay diverged, fetch again.
            self.exec.set_diverged(true);
            let report = self.exec.state_mut().check();
            self.stats.corrupt_pages_found += report.corrupt.len() as u64;
            self.event(Event::StateCorrupt {
                pages: report.corrupt.len() as u64,
            });
            return;
        }
        self.exec.set_diverged(false);
        if self.sync_proposals() {
            // The journal learns what the fetched state ran (see `journal::kept`).
            self.persist(Record::Ran {
                seq,
                eligible: self.exec.eligible().to_vec(),
                requests: Vec::new(),
            });
        }
        self.rekey_if_recoveries_changed(&recoveries_before);
        self.stats.state_transfers += 1;
        self.stats.transfer_pages += pages;
        self.stats.transfer_metas += metas;
        let stable = self.ordering.ckpt_votes.stable_seq();
        self.exec.forget_checkpoints_but(stable, seq);
        self.exec.note_checkpoint(seq, digest);
        // Our state now is that checkpoint, every page checked against its digest: vouch for
        // it like for one we took. Without our vote a checkpoint that only the replicas which
        // executed up to it vouch for may never become stable when another replica is silent,
        // and a recovering replica waits for exactly that (seed 1224 of --all-optimizations).
        let id = self.id;
        self.ordering.ckpt_votes.record(id, seq, digest);
        self.broadcast(&Message::from(Checkpoint {
            seq,
            digest,
            replica: id,
        }));
        // Requests settled by the transferred state are no longer waited for.
        let settled: Vec<(ClientId, u64)> = self
            .exec
            .replies()
            .map(|(c, l)| (*c, l.timestamp))
            .collect();
        for (c, ts) in settled {
            self.request_done(c, ts);
        }
        self.persist(Record::Checkpoint { seq, digest });
        self.event(Event::StateTransferred {
            seq,
            digest,
            pages,
            metas,
        });
        if self.ordering.proposing.next_seq <= seq {
            self.ordering.proposing.next_seq = seq + 1;
        }
        if self.ordering.ckpt_votes.stable_seq() < seq
            && self.ordering.ckpt_votes.voters(seq, &digest).len() >= self.cfg.quorum()
        {
            self.make_stable(seq, digest);
        }
        self.arm_request_timer();
        self.try_execute();
    }

    // ----- sealed state (confidential bodies) ---------------------------------------------------

    /// Whether state-transfer answers are sealed (confidential bodies; not under the mutant
    /// `clear-state`).
    fn seals_state(&self) -> bool {
        #[cfg(feature = "mutants")]
        if self.cfg.mutant == crate::types::Mutant::ClearState {
            return false;
        }
        // In a separated deployment the replicas' state holds no operation or result (only
        // which requests were ordered), and they hold no executors' secret to open sessions.
        self.cfg.confidential_bodies && self.sink.here()
    }

    /// Our state session with the executors for the transfer under way (see
    /// [`crate::keying::Keying::state_session`]): `None` while the key holder is asked for it
    /// or if it failed.
    fn state_session(&mut self) -> Option<[u8; 32]> {
        let now = self.now();
        self.keying
            .state_session(&mut self.auth, self.env.entropy, now, &mut self.out.effects)
    }

    /// The key holder answered the call for our state session's randomness (`None`: given
    /// up): the FETCH that waited for it goes out.
    pub(super) fn state_session_answered(&mut self, result: Option<HolderResult>) {
        let entropy = self.env.entropy;
        if self
            .keying
            .state_session_answered(&self.auth, entropy, result, &mut self.out.effects)
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
            .state_key_answered(peer, enc, result, &mut self.out.effects);
        if let (Some(f), Principal::Replica(r)) = (waiting, peer) {
            if let Err(reason) = self.on_fetch(r, f) {
                self.reject(peer, "fetch", reason);
            }
        }
    }

    /// Opens a sealed answer to our FETCH in place (an unsealed one is refused).
    fn open_state(&mut self, d: &mut StateData) -> Result<(), Reject> {
        self.keying.open_state(d)
    }
}
