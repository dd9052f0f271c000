//! Prime's pre-ordering (spec prime.md §3.2): every replica introduces its clients' requests
//! in PO-REQUESTs numbered per originator; every replica acknowledges, in PO-ACKs, the
//! PO-REQUESTs it holds contiguously; 2f+1 matching acknowledgements (the originator's own
//! included) make a PO certificate; a replica's PO-ARU row reports how far it holds
//! certificates contiguously from each originator.
//!
//! This store is pure: the replica hands it what arrived (already authenticated: MACs of
//! acknowledgements, client signatures inside PO-REQUESTs, signatures of rows) and sends what
//! it returns. What it keeps per originator is bounded by a window above what that
//! originator has executed (spec §8.2 trap 11).
//!
//! Filling holes: a request made eligible by an ordered matrix is held by f+1 correct
//! replicas with its certificate. A replica missing it (or holding another version, from an
//! equivocating originator) takes a copy once f+1 replicas sent copies with one digest: one
//! of them is correct, so that is the certified version. Copies come from reconciliation
//! (the designated senders push them) and from asking ([`PreOrder::holes`]).

use super::matrix::{Matrix, PoAru, RowOrder, SignedPoAru};
use crate::message::SignedRequest;
use crate::types::{ReplicaId, Seq};
use redoubt_crypto::pk::Signature;
use redoubt_crypto::{Digest, DigestBuilder};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `<PO-REQUEST, originator, seq, requests>`: client requests (each signed by its client)
/// introduced by `originator` as its `seq`-th.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoRequest {
    pub originator: ReplicaId,
    pub seq: Seq,
    pub requests: Vec<SignedRequest>,
}

impl PoRequest {
    /// What acknowledgements name: originator, number and the requests' digests (what
    /// executes; the clients' signatures do not change it).
    pub fn digest(&self) -> Digest {
        let mut b = DigestBuilder::new("redoubt.prime.po-request.v1");
        b.u64(self.originator as u64)
            .u64(self.seq)
            .u64(self.requests.len() as u64);
        for r in &self.requests {
            b.digest(&r.request.digest());
        }
        b.finish()
    }
}

/// One acknowledgement: the sender holds `originator`'s `seq`-th PO-REQUEST with `digest`
/// (and every earlier one of that originator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckPart {
    pub originator: ReplicaId,
    pub seq: Seq,
    pub digest: Digest,
}

/// Pre-ordering's bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreOrderConfig {
    pub n: u32,
    pub f: u32,
    /// PO-REQUESTs kept per originator above what it has executed; a correct originator
    /// introduces no more than this many unexecuted ones (the release's
    /// `MAX_PO_IN_FLIGHT`, 20).
    pub window: Seq,
}

/// Why a PO-REQUEST or an acknowledgement was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoError {
    #[error("originator {0} is not a replica")]
    NoSuchOriginator(ReplicaId),
    #[error("number {seq} of originator {originator} is outside its window")]
    OutsideWindow { originator: ReplicaId, seq: Seq },
    #[error("a second, different PO-REQUEST {seq} of originator {originator}")]
    Equivocation { originator: ReplicaId, seq: Seq },
}

/// What the store knows of one PO-REQUEST.
#[derive(Default)]
struct Slot {
    /// The copy we hold, and its digest.
    held: Option<(Digest, Arc<PoRequest>)>,
    /// Acknowledgements: replica -> the digest it acknowledged (its first).
    acks: BTreeMap<ReplicaId, Digest>,
    /// Copies offered to fill a hole: replica -> (digest, copy) (its first).
    offered: BTreeMap<ReplicaId, (Digest, Arc<PoRequest>)>,
    /// The digest 2f+1 replicas acknowledged, or f+1 offered for an eligible request.
    certified: Option<Digest>,
}

/// The pre-ordering state of one replica.
pub struct PreOrder {
    cfg: PreOrderConfig,
    me: ReplicaId,
    /// Our next own number.
    next_own: Seq,
    slots: BTreeMap<(ReplicaId, Seq), Slot>,
    /// Per originator: we hold its PO-REQUESTs contiguously up to here.
    aru: Vec<Seq>,
    /// Per originator: we acknowledged up to here.
    acked: Vec<Seq>,
    /// Per originator: we hold certified copies contiguously up to here (our row).
    cum_aru: Vec<Seq>,
    /// Our row as last signed, and its number.
    row_sent: Option<Vec<Seq>>,
    row_num: u64,
    /// The incarnation of the order key our rows are signed with.
    inc: u64,
    /// Per replica: the incarnation of its order key we last learnt of.
    incs: Vec<u64>,
    /// Per replica: its latest row (the summary matrix).
    rows: Vec<Option<SignedPoAru>>,
    /// `known[j][i]`: replica `j` holds originator `i`'s PO-REQUESTs up to here (from its
    /// acknowledgements and rows).
    known: Vec<Vec<Seq>>,
    /// Per originator: executed up to here (eligible in an executed ordinal).
    executed: Vec<Seq>,
    /// Certificates formed since the host last took them (it journals them).
    newly_certified: Vec<AckPart>,
    #[cfg(feature = "mutants")]
    acks_at_f: bool,
}

impl PreOrder {
    pub fn new(cfg: PreOrderConfig, me: ReplicaId) -> PreOrder {
        let n = cfg.n as usize;
        PreOrder {
            cfg,
            me,
            next_own: 1,
            slots: BTreeMap::new(),
            aru: vec![0; n],
            acked: vec![0; n],
            cum_aru: vec![0; n],
            row_sent: None,
            row_num: 0,
            inc: 0,
            incs: vec![0; n],
            rows: vec![None; n],
            known: vec![vec![0; n]; n],
            executed: vec![0; n],
            newly_certified: Vec::new(),
            #[cfg(feature = "mutants")]
            acks_at_f: false,
        }
    }

    fn quorum(&self) -> usize {
        #[cfg(feature = "mutants")]
        if self.acks_at_f {
            return self.cfg.f as usize + 1;
        }
        2 * self.cfg.f as usize + 1
    }

    /// The simulator's mutant `po-acks-at-f`: f+1 matching acknowledgements make a
    /// certificate (2f+1 are needed).
    #[cfg(feature = "mutants")]
    pub fn certify_at_f(&mut self) {
        self.acks_at_f = true;
    }

    fn in_window(&self, i: ReplicaId, seq: Seq) -> Result<(), PoError> {
        let e = *self
            .executed
            .get(i as usize)
            .ok_or(PoError::NoSuchOriginator(i))?;
        if seq <= e || seq > e + self.cfg.window {
            return Err(PoError::OutsideWindow { originator: i, seq });
        }
        Ok(())
    }

    /// Whether we may introduce another PO-REQUEST (flow control: our unexecuted ones stay
    /// within the window every replica keeps).
    pub fn can_introduce(&self) -> bool {
        self.next_own <= self.executed[self.me as usize] + self.cfg.window
    }

    /// Introduces client requests as our next PO-REQUEST (to send to every replica); `None`
    /// if the window is full.
    pub fn introduce(&mut self, requests: Vec<SignedRequest>) -> Option<Arc<PoRequest>> {
        while self.can_introduce() {
            let req = Arc::new(PoRequest {
                originator: self.me,
                seq: self.next_own,
                requests: requests.clone(),
            });
            self.next_own += 1;
            // A number we used before losing our journal (amnesia) comes back from the
            // others: it is skipped, never reused with other content.
            if self.receive_request(req.clone()).is_ok() {
                return Some(req);
            }
        }
        None
    }

    /// Our own PO-REQUEST from the journal (after a restart): held again, and our numbering
    /// continues after it, so that no number is reused with other content. Outside the
    /// window (executed since) it is only skipped over.
    pub fn restore_own(&mut self, req: Arc<PoRequest>) {
        if req.originator != self.me {
            return;
        }
        self.next_own = self.next_own.max(req.seq + 1);
        let _ = self.receive_request(req);
    }

    /// Another replica's PO-REQUEST we accepted before a restart (from the journal): held
    /// again. Its certificate forms again as acknowledgements are resent.
    pub fn restore_held(&mut self, req: Arc<PoRequest>) {
        if req.originator == self.me {
            return;
        }
        let _ = self.receive_request(req);
    }

    /// Certificates formed since the last call (to journal: after a restart a copy we hold is
    /// still known to be the certified version, which we may execute and hand to peers).
    pub fn take_certified(&mut self) -> Vec<AckPart> {
        std::mem::take(&mut self.newly_certified)
    }

    /// Certificates we saw before a restart (from the journal).
    pub fn restore_certified(&mut self, parts: &[AckPart]) {
        for p in parts {
            if self.in_window(p.originator, p.seq).is_err() {
                continue;
            }
            if self
                .slots
                .get(&(p.originator, p.seq))
                .is_some_and(|x| x.certified.is_some())
            {
                continue;
            }
            self.certify(p);
            self.advance_held(p.originator);
        }
    }

    /// Our acknowledgements from the journal (after a restart): we never acknowledge another
    /// version of what we acknowledged before, or two certificates could exist for one
    /// number.
    pub fn restore_acks(&mut self, parts: &[AckPart]) {
        for p in parts {
            if self.in_window(p.originator, p.seq).is_err() {
                continue;
            }
            let slot = self.slots.entry((p.originator, p.seq)).or_default();
            slot.acks.entry(self.me).or_insert(p.digest);
            let a = &mut self.acked[p.originator as usize];
            *a = (*a).max(p.seq);
        }
    }

    /// Our rows are signed from now on with the order key of incarnation `inc` (installed by
    /// our recovery): the first under it may report less than the last under the old one.
    pub fn set_incarnation(&mut self, inc: u64) {
        if inc != self.inc {
            self.inc = inc;
            self.row_sent = None;
            self.row_num = 0;
        }
    }

    /// The incarnation our rows are signed in.
    pub fn incarnation(&self) -> u64 {
        self.inc
    }

    /// Replica `j`'s order key is now of incarnation `inc`: a row of it signed with an
    /// earlier key goes from our matrix, with what it claimed (an attacker that held the old
    /// key may have signed anything).
    pub fn retire_rows(&mut self, j: ReplicaId, inc: u64) {
        let ju = j as usize;
        let Some(seen) = self.incs.get_mut(ju) else {
            return;
        };
        if inc <= *seen {
            return;
        }
        *seen = inc;
        // What it held before (from its rows and acknowledgements) it forgot in its recovery:
        // it is not known to hold anything beyond what executed.
        self.known[ju] = self.executed.clone();
        if self.rows[ju].as_ref().is_some_and(|r| r.row.inc < inc) {
            self.rows[ju] = None;
        }
    }

    /// The freshness rule (BFT-PR §4.3) on pre-ordering: our keys changed, so what others
    /// sent under the old ones no longer counts towards a certificate not yet formed (an
    /// attacker's acknowledgements from before a recovery must not combine with a later
    /// one's). Our own acknowledgements stay; peers send theirs again.
    pub fn drop_uncertified_votes(&mut self) {
        let me = self.me;
        for slot in self.slots.values_mut() {
            if slot.certified.is_none() {
                slot.acks.retain(|r, _| *r == me);
                slot.offered.clear();
            }
        }
    }

    /// A recovering replica distrusts what its journal gave back (an attacker may have
    /// written it): every PO-REQUEST, certificate and row goes, and it learns them again from
    /// its peers. What executed stays (the state is checked separately), and so do its own
    /// acknowledgements: a number it acknowledged before is never acknowledged in a second
    /// version (review G1). Two PO certificates for one number share f+1 acknowledgers, at
    /// least one of them correct; were its acknowledgements forgotten at every proactive
    /// recovery, which correct replicas go through too, that correct one could acknowledge
    /// both versions, one before its recovery and one after. An acknowledgement an attacker
    /// wrote into the journal while it held the replica pins that replica to the attacker's
    /// version of the number: a replica it held was faulty then, and the pin costs liveness
    /// only (another version certifies without it, [`PreOrder::certify`]).
    pub fn forget_all(&mut self) {
        let me = self.me;
        let executed = &self.executed;
        self.slots.retain(|(i, s), slot| {
            if *s <= executed[*i as usize] {
                return false;
            }
            let Some(mine) = slot.acks.get(&me).copied() else {
                return false;
            };
            *slot = Slot::default();
            slot.acks.insert(me, mine);
            true
        });
        self.newly_certified.clear();
        self.aru = self.executed.clone();
        self.acked = self.executed.clone();
        self.cum_aru = self.executed.clone();
        self.rows = vec![None; self.cfg.n as usize];
        self.known = vec![self.executed.clone(); self.cfg.n as usize];
        self.row_sent = None;
        self.row_num = 0;
        self.next_own = self.executed[self.me as usize] + 1;
    }

    /// The `forget-own-acks` mutant: nothing of pre-ordering survives a recovery, not even
    /// our own acknowledgements.
    #[cfg(feature = "mutants")]
    pub fn forget_own_acks(&mut self) {
        self.slots.clear();
    }

    /// A row we signed before, seen again (in an ordered matrix, after a restart): later rows
    /// never go below it.
    pub fn restore_row(&mut self, row: &PoAru) {
        if row.replica != self.me || row.inc != self.inc || row.aru.len() != self.cfg.n as usize {
            return;
        }
        if row.num >= self.row_num {
            self.row_num = row.num;
            self.row_sent = Some(row.aru.clone());
        }
    }

    /// A PO-REQUEST (its client requests authenticated by the caller). The first copy of a
    /// number is kept; a different later one is evidence of equivocation and is refused.
    /// `Ok(true)` if it is new.
    pub fn receive_request(&mut self, req: Arc<PoRequest>) -> Result<bool, PoError> {
        let (i, s) = (req.originator, req.seq);
        self.in_window(i, s)?;
        let digest = req.digest();
        let slot = self.slots.entry((i, s)).or_default();
        if slot.acks.get(&self.me).is_some_and(|d| *d != digest) {
            // We acknowledged another version (before a restart): never this one.
            return Err(PoError::Equivocation {
                originator: i,
                seq: s,
            });
        }
        match &slot.held {
            Some((d, _)) if *d == digest => return Ok(false),
            Some(_) => {
                return Err(PoError::Equivocation {
                    originator: i,
                    seq: s,
                })
            }
            None => {}
        }
        if slot.certified.is_some_and(|c| c != digest) {
            // Another version is certified already: this one can never execute.
            return Err(PoError::Equivocation {
                originator: i,
                seq: s,
            });
        }
        slot.held = Some((digest, req));
        self.advance_held(i);
        Ok(true)
    }

    /// Acknowledgements due: everything held contiguously and not yet acknowledged. They
    /// count as our own acknowledgements at once.
    pub fn take_acks(&mut self) -> Vec<AckPart> {
        let mut parts = Vec::new();
        for i in 0..self.cfg.n {
            let iu = i as usize;
            for s in (self.acked[iu] + 1)..=self.aru[iu] {
                let Some((digest, _)) = self.slots.get(&(i, s)).and_then(|x| x.held.as_ref())
                else {
                    continue;
                };
                parts.push(AckPart {
                    originator: i,
                    seq: s,
                    digest: *digest,
                });
            }
            self.acked[iu] = self.aru[iu];
        }
        let me = self.me;
        for p in &parts {
            self.vote(me, p);
        }
        parts
    }

    /// Acknowledgements from replica `from` (authenticated by the caller). Parts outside the
    /// window are skipped.
    pub fn receive_acks(&mut self, from: ReplicaId, parts: &[AckPart]) {
        if from >= self.cfg.n {
            return;
        }
        for p in parts {
            if self.in_window(p.originator, p.seq).is_ok() {
                self.vote(from, p);
            }
        }
    }

    fn vote(&mut self, from: ReplicaId, p: &AckPart) {
        let quorum = self.quorum();
        let slot = self.slots.entry((p.originator, p.seq)).or_default();
        slot.acks.entry(from).or_insert(p.digest);
        let k = &mut self.known[from as usize][p.originator as usize];
        *k = (*k).max(p.seq);
        if slot.certified.is_none() {
            let matching = slot.acks.values().filter(|d| **d == p.digest).count();
            if matching >= quorum {
                self.certify(p);
                self.newly_certified.push(*p);
            }
        }
        self.advance_certified(p.originator);
    }

    /// `p.digest` is the certified version of `(p.originator, p.seq)`. A version we hold that
    /// is not it goes, and the hole is filled like any other.
    fn certify(&mut self, p: &AckPart) {
        let slot = self.slots.entry((p.originator, p.seq)).or_default();
        slot.certified = Some(p.digest);
        if slot.held.as_ref().is_some_and(|(d, _)| *d != p.digest) {
            slot.held = None;
            let a = &mut self.aru[p.originator as usize];
            *a = (*a).min(p.seq - 1);
        }
    }

    /// Moves `aru[i]` over what we now hold contiguously, then `cum_aru[i]`.
    fn advance_held(&mut self, i: ReplicaId) {
        let a = &mut self.aru[i as usize];
        while self
            .slots
            .get(&(i, *a + 1))
            .is_some_and(|s| s.held.is_some())
        {
            *a += 1;
        }
        self.advance_certified(i);
    }

    fn advance_certified(&mut self, i: ReplicaId) {
        let c = &mut self.cum_aru[i as usize];
        while let Some(slot) = self.slots.get(&(i, *c + 1)) {
            match (&slot.held, slot.certified) {
                (Some((d, _)), Some(cd)) if *d == cd => *c += 1,
                _ => break,
            }
        }
    }

    /// Our row, if our certificates grew since we last signed one: the caller signs it,
    /// sends it to every replica and hands it back through [`PreOrder::receive_row`].
    pub fn new_row(&mut self) -> Option<PoAru> {
        // A row never goes below one we signed before (a restart forgets certificates until
        // they are fetched again): the other replicas would take it for a faulty one.
        let below = self
            .row_sent
            .as_ref()
            .is_some_and(|sent| sent.iter().zip(&self.cum_aru).any(|(s, c)| c < s));
        if below
            || self.row_sent.as_ref() == Some(&self.cum_aru)
            || self.cum_aru.iter().all(|s| *s == 0)
        {
            return None;
        }
        // Numbered by the sum of its entries: a row that grew has a higher number, also
        // after a restart that forgot the numbers used before.
        self.row_num = self.cum_aru.iter().sum();
        self.row_sent = Some(self.cum_aru.clone());
        Some(PoAru {
            replica: self.me,
            inc: self.inc,
            num: self.row_num,
            aru: self.cum_aru.clone(),
        })
    }

    /// Whether we hold PO-REQUESTs not yet certified here (their certificates are on the
    /// way: a row signed now would soon be out of date).
    pub fn certifying(&self) -> bool {
        self.aru.iter().zip(&self.cum_aru).any(|(a, c)| a > c)
    }

    /// A signed row (signature and shape checked by the caller). `Newer` rows replace the
    /// sender's previous one in our summary matrix.
    pub fn receive_row(&mut self, row: SignedPoAru) -> RowOrder {
        let j = row.row.replica as usize;
        if j >= self.rows.len() || row.row.aru.len() != self.rows.len() {
            return RowOrder::NotNewer;
        }
        let order = match &self.rows[j] {
            Some(old) => row.row.compare(&old.row),
            None if row.row.aru.iter().any(|s| *s > 0) => RowOrder::Newer,
            None => RowOrder::NotNewer,
        };
        if order == RowOrder::Newer {
            for (k, s) in self.known[j].iter_mut().zip(&row.row.aru) {
                *k = (*k).max(*s);
            }
            self.rows[j] = Some(row);
        }
        order
    }

    /// Whether our matrix holds replica `j`'s row with this statement and signature (its
    /// signature was checked when it came): a proposal or summary repeating it needs no
    /// second check.
    pub fn holds_row(&self, j: ReplicaId, statement: &Digest, sig: &Signature) -> bool {
        self.rows
            .get(j as usize)
            .and_then(Option::as_ref)
            .is_some_and(|r| r.sig == *sig && r.row.statement() == *statement)
    }

    /// What the store holds: PO-REQUEST slots, and the acknowledgements and offered copies
    /// recorded in them.
    pub fn footprint(&self) -> (usize, usize) {
        let entries = self
            .slots
            .values()
            .map(|s| s.acks.len() + s.offered.len())
            .sum();
        (self.slots.len(), entries)
    }

    /// The summary matrix: the latest row of every replica.
    pub fn matrix(&self) -> Matrix {
        Matrix {
            rows: self.rows.clone(),
        }
    }

    /// Whether our matrix would make more eligible than `eligible` (what we already sent the
    /// leader or saw proposed): only then is a summary worth sending.
    pub fn would_advance(&self, eligible: &[Seq]) -> bool {
        let m = self.matrix();
        let f = self.cfg.f as usize;
        (0..self.rows.len()).any(|i| m.proof_aru(i, f) > eligible.get(i).copied().unwrap_or(0))
    }

    /// How far replica `j` holds originator `i`'s PO-REQUESTs, as its acknowledgements and
    /// rows told us.
    pub fn known(&self, j: ReplicaId, i: ReplicaId) -> Seq {
        self.known
            .get(j as usize)
            .and_then(|k| k.get(i as usize))
            .copied()
            .unwrap_or(0)
    }

    /// What we hold certificates for, per originator (our row's content).
    pub fn cum_aru(&self) -> &[Seq] {
        &self.cum_aru
    }

    /// What has executed, per originator.
    pub fn executed(&self) -> &[Seq] {
        &self.executed
    }

    /// The PO-REQUESTs of `(originator, seq)` pairs, if we hold every one with its
    /// certificate; else the ones missing (holes: the ordinal waits).
    pub fn ready(
        &self,
        pairs: &[(ReplicaId, Seq)],
    ) -> Result<Vec<Arc<PoRequest>>, Vec<(ReplicaId, Seq)>> {
        let mut got = Vec::with_capacity(pairs.len());
        let mut holes = Vec::new();
        for &(i, s) in pairs {
            match self.slots.get(&(i, s)) {
                Some(Slot {
                    held: Some((d, r)),
                    certified: Some(c),
                    ..
                }) if d == c => got.push(r.clone()),
                _ => holes.push((i, s)),
            }
        }
        if holes.is_empty() {
            Ok(got)
        } else {
            Err(holes)
        }
    }

    /// A copy of a PO-REQUEST from replica `from`, to fill a hole: taken once f+1 replicas
    /// offered copies with one digest, or at once if it has the digest 2f+1 replicas
    /// acknowledged, or the digest we acknowledged ourselves and `authentic` (its clients'
    /// requests authenticate here: after a proactive recovery our own acknowledgement may be
    /// one the attacker wrote). `true` if it filled the hole.
    pub fn offer(&mut self, from: ReplicaId, req: Arc<PoRequest>, authentic: bool) -> bool {
        let (i, s) = (req.originator, req.seq);
        if from >= self.cfg.n || self.in_window(i, s).is_err() {
            return false;
        }
        let f = self.cfg.f as usize;
        let digest = req.digest();
        let slot = self.slots.entry((i, s)).or_default();
        if slot
            .held
            .as_ref()
            .is_some_and(|(d, _)| Some(*d) == slot.certified)
        {
            return false; // no hole here
        }
        if slot.certified.is_some_and(|c| c != digest) {
            return false; // not the version our acknowledgements certify
        }
        slot.offered.entry(from).or_insert((digest, req));
        let matching = slot.offered.values().filter(|(d, _)| *d == digest).count();
        // With 2f+1 acknowledgements of this digest seen, or our own (we held it from its
        // originator, before a restart) and requests that authenticate here, one copy that
        // matches will do.
        let vouched = slot.certified == Some(digest)
            || (authentic && slot.acks.get(&self.me) == Some(&digest));
        if matching < f + 1 && !vouched {
            return false;
        }
        let (_, copy) = slot
            .offered
            .values()
            .find(|(d, _)| *d == digest)
            .cloned()
            .expect("counted");
        slot.certified = Some(digest);
        slot.held = Some((digest, copy));
        slot.offered.clear();
        self.advance_held(i);
        true
    }

    /// The certified PO-REQUEST `(i, s)`, if we hold it (to send to a replica that asks, or
    /// in reconciliation).
    pub fn certified_copy(&self, i: ReplicaId, s: Seq) -> Option<Arc<PoRequest>> {
        let slot = self.slots.get(&(i, s))?;
        match (&slot.held, slot.certified) {
            (Some((d, r)), Some(c)) if *d == c => Some(r.clone()),
            _ => None,
        }
    }

    /// Reconciliation of `(i, s)`, newly eligible in an ordinal with matrix `m`: the replicas
    /// we should send our certified copy to. We are a designated sender if we are among the
    /// first 2f+1 replicas (by id) whose row claims column `i` at least `ProofARU(i)`; the
    /// destinations are the replicas (other than the originator) not known to hold it.
    pub fn reconcile(&self, m: &Matrix, i: ReplicaId, s: Seq) -> Vec<ReplicaId> {
        if self.certified_copy(i, s).is_none() {
            return Vec::new();
        }
        let f = self.cfg.f as usize;
        let t = m.proof_aru(i as usize, f);
        let designated = (0..self.cfg.n)
            .filter(|j| m.entry(*j as usize, i as usize) >= t)
            .take(self.quorum());
        if !designated.into_iter().any(|j| j == self.me) {
            return Vec::new();
        }
        (0..self.cfg.n)
            .filter(|k| *k != i && *k != self.me && self.known[*k as usize][i as usize] < s)
            .collect()
    }

    /// The ordinal executed up to `eligible`: the window moves past what it ran. Certified
    /// copies of what ran are kept for replicas that have not run it yet, until
    /// [`PreOrder::forget_through`].
    pub fn executed_through(&mut self, eligible: &[Seq]) {
        for (ex, e) in self.executed.iter_mut().zip(eligible) {
            *ex = (*ex).max(*e);
        }
        let executed = &self.executed;
        // Only certified copies of what ran are worth keeping.
        self.slots.retain(|(o, s), slot| {
            *s > executed[*o as usize]
                || matches!((&slot.held, slot.certified), (Some((d, _)), Some(c)) if *d == c)
        });
        for i in 0..self.cfg.n {
            let ex = self.executed[i as usize];
            for v in [&mut self.aru, &mut self.acked, &mut self.cum_aru] {
                v[i as usize] = v[i as usize].max(ex);
            }
            // What we held beyond it (a jump past what we had, after a transfer) counts.
            self.advance_held(i);
        }
        self.next_own = self.next_own.max(self.executed[self.me as usize] + 1);
    }

    /// Forgets the certified copies of what ran up to `eligible` (what a stable checkpoint
    /// covers: a replica behind it fetches the checkpoint instead).
    pub fn forget_through(&mut self, eligible: &[Seq]) {
        let executed = &self.executed;
        self.slots.retain(|(o, s), _| {
            *s > executed[*o as usize] || *s > eligible.get(*o as usize).copied().unwrap_or(0)
        });
    }

    /// PO-REQUESTs within the window that we lack while f+1 peers say they hold them (from
    /// their acknowledgements or rows): a correct replica that missed one another correct replica
    /// holds would otherwise never acknowledge or certify what follows it. At most `max`.
    pub fn missing(&self, max: usize) -> Vec<(ReplicaId, Seq)> {
        let mut out = Vec::new();
        for i in 0..self.cfg.n {
            let iu = i as usize;
            // The (f+1)-th highest of the peers' claims: at least one correct replica holds
            // that much (f faulty peers claiming more would send us fetching what no one has).
            let mut claims: Vec<Seq> = (0..self.cfg.n as usize)
                .filter(|j| *j != self.me as usize)
                .map(|j| self.known[j][iu])
                .collect();
            claims.sort_unstable_by(|a, b| b.cmp(a));
            let top = claims
                .get(self.cfg.f as usize)
                .copied()
                .unwrap_or(0)
                .min(self.executed[iu] + self.cfg.window);
            for s in (self.aru[iu] + 1)..=top {
                if out.len() >= max {
                    return out;
                }
                if self.slots.get(&(i, s)).is_none_or(|x| x.held.is_none()) {
                    out.push((i, s));
                }
            }
        }
        out
    }

    /// Our acknowledgements of what we hold certificates for and replica `j`'s latest row
    /// says it does not (at most `max`): a peer that missed them would otherwise never
    /// certify what we stopped acknowledging once we had our certificate.
    pub fn acks_for(&self, j: ReplicaId, max: usize) -> Vec<AckPart> {
        let mut out = Vec::new();
        let Some(theirs) = self.rows.get(j as usize) else {
            return out;
        };
        for i in 0..self.cfg.n {
            let iu = i as usize;
            let from = theirs
                .as_ref()
                .map_or(0, |r| r.row.aru[iu])
                .max(self.executed[iu]);
            for s in (from + 1)..=self.cum_aru[iu] {
                if out.len() >= max {
                    return out;
                }
                if let Some(d) = self.slots.get(&(i, s)).and_then(|x| x.acks.get(&self.me)) {
                    out.push(AckPart {
                        originator: i,
                        seq: s,
                        digest: *d,
                    });
                }
            }
        }
        out
    }

    /// For retransmission: our own PO-REQUESTs not yet executed, and acknowledgements of
    /// what we hold that is not yet certified.
    pub fn unsettled(&self) -> (Vec<Arc<PoRequest>>, Vec<AckPart>) {
        let mut own = Vec::new();
        let mut acks = Vec::new();
        for ((i, s), slot) in &self.slots {
            if *s <= self.executed[*i as usize] {
                continue;
            }
            if let (true, Some((_, r))) = (*i == self.me, &slot.held) {
                own.push(r.clone());
            }
            // Our acknowledgements, even of what we no longer hold (a restart): a peer that
            // missed one may need it for its certificate.
            if let (None, Some(d)) = (slot.certified, slot.acks.get(&self.me)) {
                acks.push(AckPart {
                    originator: *i,
                    seq: *s,
                    digest: *d,
                });
            }
        }
        (own, acks)
    }

    /// PO-REQUEST slots held (for bounds and metrics).
    pub fn slots(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests;
