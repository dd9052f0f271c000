//! Signed checkpoint votes (separated deployment with session keys). A checkpoint of the
//! execution cluster is stable at a node once g+1 nodes voted for it, but MAC-authenticated
//! votes convince only their receiver. A correct node that fell further behind than the
//! agreement nodes keep batches for (it was down while the others went on) then needs to
//! learn the stable checkpoint from its one correct peer, while a faulty peer tells it
//! something else: no g+1 matching votes ever reach it, and it stays behind for good
//! (simulator seed 1450 of `--separated`: a rebooted node beside a lying one). So each node's
//! key holder signs its own vote (once per checkpoint), and a node answering a peer's MISSING
//! hands over the g+1 signed votes of its stable checkpoint, which the peer checks itself.
//! Behind a firewall the threshold signature does the same job (see `firewall.rs`).

use super::*;
use crate::holder::HolderResult;
use crate::keys::{holder_statement, Purpose};
use redoubt_crypto::pk;
use std::collections::BTreeSet;

/// Our signed votes (the stable checkpoint's included) and the peers' (above the stable
/// checkpoint), and the proof of the stable checkpoint.
#[derive(Default)]
pub(super) struct SignedVotes {
    /// Our own signature per checkpoint (signed once, sent with every vote for it).
    own: BTreeMap<Seq, (Digest, u64, pk::Signature)>,
    /// Verified votes of peers: checkpoint -> executor -> vote.
    peers: BTreeMap<Seq, BTreeMap<ExecutorId, SignedVote>>,
    /// g+1 matching signed votes for our stable checkpoint.
    pub(super) proof: Vec<SignedVote>,
}

impl<S: Service, A: KeyTable> Executor<S, A> {
    fn signs_votes(&self) -> bool {
        self.firewall.is_none() && self.auth.session_ref().is_some()
    }

    /// Our key holder's signature on our vote for `(seq, digest)` (signed once); `None`
    /// behind a firewall, without session keys, or while the key holder has not signed it
    /// (it is asked, unless it already is: the vote goes with its MAC alone meanwhile, and
    /// again with the signature once it comes; see [`Executor::vote_signed`]).
    pub(super) fn vote_signature(
        &mut self,
        seq: Seq,
        digest: &Digest,
    ) -> Option<(u64, pk::Signature)> {
        if !self.signs_votes() {
            return None;
        }
        if let Some((d, counter, sig)) = self.signed.own.get(&seq) {
            if d == digest {
                return Some((*counter, *sig));
            }
        }
        let now = self.env.now_ms;
        if let Some(call) = self.keying.calls.sign_vote(seq, *digest, now) {
            self.effects.push(Effect::Holder(call));
        }
        None
    }

    /// The key holder answered the call signing our vote for `(seq, digest)` (`None`: given
    /// up; the next heartbeat asks again): the vote goes to the peers again, signed, and if
    /// the checkpoint is already stable here, it joins the proof.
    pub(super) fn vote_signed(&mut self, seq: Seq, digest: Digest, result: Option<HolderResult>) {
        let (counter, sig) = match HolderResult::signed(result) {
            Ok(s) => s,
            Err(e) => {
                self.event(Event::KeyHolderFailed(e.to_string()));
                return;
            }
        };
        if seq < self.window.stable || self.exec.own_checkpoint(seq) != Some(digest) {
            return; // no longer ours to vote for
        }
        self.signed.own.insert(seq, (digest, counter, sig));
        self.send_vote(seq, digest);
        if seq == self.window.stable {
            self.prove_stable_signed(seq);
        }
    }

    /// Whether `v` is a vote of its executor that its key holder signed.
    fn vote_valid(&self, v: &SignedVote) -> bool {
        if v.executor >= self.cfg.executors {
            return false;
        }
        let who = Principal::Executor(v.executor);
        let Some(keys) = self
            .auth
            .session_ref()
            .and_then(|s| s.directory().get(who).copied())
        else {
            return false;
        };
        let st = holder_statement(
            Purpose::Checkpoint,
            who,
            v.counter,
            &checkpoint_statement(v.seq, &v.digest),
        );
        pk::verify(&keys.verify, &st.0, &v.sig)
    }

    /// A peer's vote arrived with its signature: kept once it verifies.
    pub(super) fn note_signed_vote(&mut self, c: &ExecCheckpoint) {
        let Some((counter, sig)) = c.signed else {
            return;
        };
        if !self.signs_votes() || c.executor == self.id {
            return;
        }
        let v = SignedVote {
            executor: c.executor,
            seq: c.seq,
            digest: c.digest,
            counter,
            sig,
        };
        let known = self
            .signed
            .peers
            .get(&c.seq)
            .and_then(|m| m.get(&c.executor))
            .is_some_and(|held| *held == v);
        // Votes come again with every heartbeat: each is checked once.
        if !known && self.vote_valid(&v) {
            self.signed
                .peers
                .entry(c.seq)
                .or_default()
                .insert(c.executor, v);
        }
    }

    /// Our checkpoint at `seq` became stable: the g+1 signed votes for it that we hold (ours
    /// among them) become its proof, and what lies at or below it goes.
    pub(super) fn prove_stable_signed(&mut self, seq: Seq) {
        let Some(digest) = self.exec.own_checkpoint(seq) else {
            return;
        };
        let own = self
            .vote_signature(seq, &digest)
            .map(|(counter, sig)| SignedVote {
                executor: self.id,
                seq,
                digest,
                counter,
                sig,
            });
        let quorum = self.cfg.exec_quorum();
        let mut votes: Vec<SignedVote> = own.into_iter().collect();
        votes.extend(
            self.signed
                .peers
                .get(&seq)
                .into_iter()
                .flat_map(|m| m.values())
                .filter(|v| v.digest == digest)
                .copied(),
        );
        votes.truncate(quorum);
        if votes.len() == quorum {
            self.signed.proof = votes;
        }
        // Our signature on the stable checkpoint stays: peers that lag get our vote for it
        // again, and a key holder writes its counter with every signature. The peers' votes
        // for it stay too: should our own signature come later, the proof is made again.
        self.signed.own = self.signed.own.split_off(&seq);
        self.signed.peers = self.signed.peers.split_off(&seq);
    }

    /// The proof of our stable checkpoint, for a peer that asked (empty if we hold none).
    pub(super) fn signed_proof(&self) -> Vec<SignedVote> {
        self.signed.proof.clone()
    }

    /// A peer's proof of its stable checkpoint: g+1 signed votes of distinct execution nodes
    /// for one checkpoint. Beyond what we executed, it is the checkpoint to fetch, even when
    /// no second correct peer votes for it to us.
    pub(super) fn on_signed_proof(&mut self, from: ExecutorId, votes: &[SignedVote]) {
        if !self.signs_votes() {
            return;
        }
        let Some((seq, digest)) =
            proven_checkpoint(votes, self.cfg.exec_quorum(), |v| self.vote_valid(v))
        else {
            return;
        };
        if seq > self.exec.last_executed() {
            self.accept_checkpoint_proof(from, seq, digest);
        }
    }

    /// Bounds of what this part keeps.
    pub(super) fn signed_votes_bounds(&self) -> Result<(), String> {
        let window = ((self.cfg.log_size + self.cfg.checkpoint_interval)
            / self.cfg.checkpoint_interval
            + 2) as usize;
        if self.signed.own.len() > window || self.signed.peers.len() > window {
            return Err(format!(
                "{} own and {} peers' signed votes kept",
                self.signed.own.len(),
                self.signed.peers.len()
            ));
        }
        Ok(())
    }
}

/// The checkpoint `votes` prove: at least `quorum` votes of distinct execution nodes for one
/// checkpoint, each passing `valid` (its signature); `None` otherwise.
fn proven_checkpoint(
    votes: &[SignedVote],
    quorum: usize,
    valid: impl Fn(&SignedVote) -> bool,
) -> Option<(Seq, Digest)> {
    let first = votes.first()?;
    let mut voters = BTreeSet::new();
    for v in votes {
        if v.seq != first.seq || v.digest != first.digest || !voters.insert(v.executor) {
            return None;
        }
    }
    (voters.len() >= quorum && votes.iter().all(valid)).then_some((first.seq, first.digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(executor: ExecutorId, seq: Seq, digest: &[u8]) -> SignedVote {
        SignedVote {
            executor,
            seq,
            digest: Digest::of(digest),
            counter: 1,
            sig: pk::Signature::default(),
        }
    }

    #[test]
    fn a_proof_needs_g_plus_1_distinct_valid_votes_for_one_checkpoint() {
        let ok = [vote(0, 8, b"d"), vote(2, 8, b"d")];
        assert_eq!(
            proven_checkpoint(&ok, 2, |_| true),
            Some((8, Digest::of(b"d")))
        );
        assert_eq!(proven_checkpoint(&ok[..1], 2, |_| true), None, "one vote");
        assert_eq!(proven_checkpoint(&[], 2, |_| true), None);
        let repeated = [vote(1, 8, b"d"), vote(1, 8, b"d")];
        assert_eq!(
            proven_checkpoint(&repeated, 2, |_| true),
            None,
            "one voter twice"
        );
        let split = [vote(0, 8, b"d"), vote(2, 8, b"e")];
        assert_eq!(proven_checkpoint(&split, 2, |_| true), None, "two digests");
        let seqs = [vote(0, 8, b"d"), vote(2, 12, b"d")];
        assert_eq!(
            proven_checkpoint(&seqs, 2, |_| true),
            None,
            "two checkpoints"
        );
        assert_eq!(
            proven_checkpoint(&ok, 2, |v| v.executor != 2),
            None,
            "a signature that does not verify"
        );
    }
}
