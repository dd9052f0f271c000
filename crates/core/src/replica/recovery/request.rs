//! The recovering replica's recovery request (BFT-PR §4.4 step 3): signed by its key holder
//! (an effect; see `crate::holder`), ordered like a client's, and answered by 2f+1 matching
//! replies that give n_R and the checkpoint H to reach.

use super::*;

impl<S: Service, A: KeyTable> Replica<S, A> {
    /// The key holder answered the call signing our recovery request (`None`: it was given
    /// up): the request is made, and sent at once.
    pub(in crate::replica) fn recovery_signed(&mut self, result: Option<HolderResult>) {
        let now = self.now();
        let Some(h_m) = self
            .recovery
            .as_ref()
            .filter(|r| r.phase == Phase::Requesting && r.request.is_none())
            .map(|r| r.h_m)
        else {
            return; // no longer wanted (its key, if any, is never used)
        };
        let signed = match HolderResult::recovery(result) {
            Ok(s) => s,
            Err(e) => {
                if let Some(rec) = self.recovery.as_mut() {
                    rec.next_retry_ms = now + self.cfg.status_interval_ms * 10;
                }
                self.event(Event::KeyHolderFailed(e.to_string()));
                return;
            }
        };
        let me = self.id;
        let op = RecoveryOp {
            replica: me,
            h_m,
            row_key: signed.row_key,
            sig: signed.sig,
        };
        let request = SignedRequest {
            request: Request {
                client: recovery_client(me),
                timestamp: signed.counter,
                read_only: false,
                op: postcard::to_stdvec(&op).expect("encodes").into(),
            },
            auth: Vec::new().into(),
            sig: None,
        };
        if let Some(rec) = self.recovery.as_mut() {
            rec.request = Some(request);
        }
        // Prime: rows are signed with the fresh order key once the request ran.
        if let Some(seed) = signed.seed {
            self.draw_order_key(seed.0);
        }
        self.drive_recovery();
    }

    /// A reply to our recovery request (from a peer, or from our own execution).
    pub(in crate::replica) fn on_recovery_reply(
        &mut self,
        from: ReplicaId,
        r: Reply,
    ) -> Result<(), Reject> {
        if r.replica != from
            || r.client != recovery_client(self.id)
            || r.digest_only
            || r.view > crate::types::VIEW_LIMIT
        {
            return Err(Reject::Inconsistent);
        }
        let Some(mut rec) = self.recovery.take() else {
            return Err(Reject::Unexpected);
        };
        let ours = rec
            .request
            .as_ref()
            .is_some_and(|sr| sr.request.timestamp == r.timestamp);
        if rec.phase != Phase::Requesting || !ours {
            self.recovery = Some(rec);
            return Err(Reject::Stale);
        }
        rec.replies.insert(from, r.result.clone());
        rec.reply_views.insert(from, r.view);
        let matching = rec.replies.values().filter(|v| **v == r.result).count();
        if matching >= self.cfg.quorum() {
            let Ok(result) = postcard::from_bytes::<RecoveryResult>(&r.result) else {
                self.recovery = Some(rec);
                return Err(Reject::Malformed);
            };
            if !result.accepted {
                // A recovery of ours was accepted recently (a restart mid-recovery): ask again
                // with a new request once the interval has passed.
                self.event(Event::RecoveryRefused);
                rec.request = None;
                rec.replies.clear();
                rec.reply_views.clear();
                rec.next_retry_ms = self.now() + self.cfg.recovery_interval_min_ms;
                self.recovery = Some(rec);
                return Ok(());
            }
            let k = self.cfg.checkpoint_interval;
            let h_r = result.seq / k * k + self.cfg.log_size;
            rec.h = rec.h_m.max(h_r);
            rec.n_r = result.seq;
            rec.replied_ms = self.now();
            let views: Vec<View> = rec
                .replies
                .iter()
                .filter(|(_, v)| **v == r.result)
                .filter_map(|(j, _)| rec.reply_views.get(j).copied())
                .collect();
            self.estimate_view(views);
            rec.phase = Phase::Fetching;
            // Check every page; corrupt ones are fetched at the next vouched checkpoint.
            rec.corrupt_pages = self.check_state().len() as u64;
        }
        self.recovery = Some(rec);
        self.drive_recovery();
        Ok(())
    }
}
