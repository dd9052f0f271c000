//! The execution component: the replicated service, its paged state, the exactly-once reply
//! table and the agreed clock (PBFT §4.2 "execution", §5.1 tentative execution).
//!
//! It owns what a checkpoint covers and nothing of the order: batches come down to it with the
//! sequence number agreement assigned them, and what it reports back up is values, never
//! references into agreement's state — how far it executed (`last_executed`), the digest it
//! executed at each sequence number still in the window, and checkpoint digests. A batch may
//! run tentatively (before it committed) and be undone until it commits.
//!
//! Bounds: `executed` holds at most one digest per sequence number above the stable checkpoint
//! (at most L, trimmed by [`Execution::forget_executed_through`]); the reply table holds one
//! entry per client that ever had a request executed (client ids are configured); at most one
//! batch is tentative.

mod batch;
mod fetch;
mod recovery;
mod replies;
mod serve;
mod sessions;
pub(crate) use batch::Step;
pub(crate) use fetch::{Answered, Due, Finished};
pub(crate) use recovery::{Recoveries, RecoveryRules};
pub(crate) use replies::{aux_digest, LastReply};
pub(crate) use serve::{Refused, ServeLimits};

use crate::message::{Batch, Request};
use crate::service::{ExecContext, Service};
use crate::types::{ClientId, ReplicaId, Seq};
use redoubt_crypto::body::ENC_LEN;
use redoubt_crypto::Digest;
use redoubt_state::{PageStore, PagedState};
use replies::Replies;
use std::collections::BTreeMap;
use std::sync::Arc;

/// State commits a replica may hold unwritten between two steps (see `check_invariants`).
const UNSYNCED_COMMITS_MAX: usize = 8;

/// The auxiliary bytes of checkpoint 0 (no client executed anything yet, clock at 0).
pub(crate) use replies::initial_aux;

/// Opens the service state held by `store` (a fresh store starts as checkpoint 0 of an
/// all-zero state), ready for [`crate::Replica::new`] or [`crate::Replica::restore`].
pub fn open_state(store: Box<dyn PageStore>) -> std::io::Result<PagedState> {
    PagedState::open(store, &initial_aux())
}

/// A batch executed before it committed (PBFT §5.1): every batch before it committed, and
/// its effects can be undone until it commits too.
#[derive(Clone, Debug)]
pub(crate) struct Tentative {
    pub(crate) seq: Seq,
    pub(crate) digest: Digest,
    pub(crate) batch: Arc<Batch>,
    /// Requests it executed.
    pub(crate) executed: Vec<(ClientId, u64)>,
    undo: Undo,
}

/// What a tentative batch changed besides its pages, restored if it is undone.
#[derive(Clone, Debug)]
struct Undo {
    /// The agreed clock before it.
    last_time_before: u64,
    /// The exactly-once entries it replaced, in execution order.
    clients_before: Vec<(ClientId, Option<LastReply>)>,
}

/// What undoing a tentative batch found.
pub(crate) enum Undone {
    /// The batch at `seq` is undone.
    Clean { seq: Seq },
    /// The batch at `seq` is undone, but the service did not load from the restored pages:
    /// the state must be corrupt.
    Corrupt { seq: Seq },
}

/// The execution component (see the module documentation).
pub(crate) struct Execution<S: Service> {
    service: S,
    state: PagedState,
    /// The exactly-once table: per client, its last executed request and result.
    clients: Replies,
    /// The agreed clock: the time the last executed batch ran at.
    last_time_ms: u64,
    last_executed: Seq,
    /// Prime: per originator, the last PO-REQUEST executed (ADR 0007); empty until the first
    /// ordered matrix made one eligible, and always in PBFT. Part of checkpoints.
    eligible: Vec<Seq>,
    /// Digest executed at each sequence number above the stable checkpoint (at most L).
    executed: BTreeMap<Seq, Digest>,
    /// The batch at `last_executed + 1` executed tentatively, if any (its effects are in the
    /// state and the exactly-once table; it is not in `executed`).
    tentative: Option<Tentative>,
    /// Set between [`Execution::begin_tentative`] and [`Execution::hold_tentative`]: what the
    /// tentative batch replaces, recorded as it runs.
    opening: Option<Undo>,
    /// Per asking replica: state-transfer byte allowance and when it was last refilled (at
    /// most one entry per replica id that asked).
    serve_budget: BTreeMap<ReplicaId, (i64, u64)>,
    /// Digests of the checkpoints of this state (taken here or fetched) within the window:
    /// at most one per checkpoint interval above the stable checkpoint, and that one.
    checkpoints: BTreeMap<Seq, Digest>,
    /// The checkpoint being fetched (see `fetch.rs`).
    transfer: Option<fetch::Transfer>,
    /// When a known-bad state may next probe for a checkpoint to fetch.
    next_probe_ms: u64,
    /// Our state was found to differ from a checkpoint f+1 replicas vouch for: execution
    /// stops until the vouched state is fetched.
    diverged: bool,
    /// Clients' body sessions (see `sessions.rs`).
    sessions: sessions::Sessions,
    /// Ordered operations refused because they did not open (counted once each, where they
    /// run; read-only answers are not counted).
    bodies_refused: u64,
}

impl<S: Service> Execution<S> {
    pub(crate) fn new(service: S, state: PagedState, confidential: bool) -> Self {
        #[allow(unused_mut)]
        let mut sessions = sessions::Sessions::new(confidential);
        Execution {
            service,
            state,
            clients: Replies::default(),
            last_time_ms: 0,
            last_executed: 0,
            eligible: Vec::new(),
            executed: BTreeMap::new(),
            tentative: None,
            opening: None,
            serve_budget: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            transfer: None,
            next_probe_ms: 0,
            diverged: false,
            sessions,
            bodies_refused: 0,
        }
    }

    // ----- the service and its state ---------------------------------------------------------

    pub(crate) fn service(&self) -> &S {
        &self.service
    }

    pub(crate) fn service_mut(&mut self) -> &mut S {
        &mut self.service
    }

    pub(crate) fn state(&self) -> &PagedState {
        &self.state
    }

    /// The paged state, for state transfer and checks (which fetch, install and verify pages
    /// underneath the service; they reload it with [`Execution::load_aux`] afterwards).
    pub(crate) fn state_mut(&mut self) -> &mut PagedState {
        &mut self.state
    }

    /// Test hook: run `f` on the service and its state.
    #[cfg(feature = "mutants")]
    pub(crate) fn tamper(&mut self, f: impl FnOnce(&mut S, &mut PagedState)) {
        f(&mut self.service, &mut self.state)
    }

    /// A read-only request's answer from the executed state, sealed when bodies are (`None`:
    /// not read-only).
    pub(crate) fn read_only(&self, req: &Request) -> Option<Vec<u8>> {
        match self.sessions.open(req) {
            Ok(op) => self
                .service
                .execute_read_only(&self.state, &op)
                .map(|r| self.sessions.seal(req, r)),
            Err(refusal) => Some(refusal),
        }
    }

    /// The body session whose key must be learnt before `req` can run, if any.
    pub(crate) fn session_wanted(&self, req: &Request) -> Option<[u8; ENC_LEN]> {
        self.sessions.wanted(req)
    }

    /// The key of `client`'s body session `enc`, as the key holder opened it (`None`: the
    /// session does not open).
    pub(crate) fn learn_session(
        &mut self,
        client: ClientId,
        enc: [u8; ENC_LEN],
        key: Option<redoubt_crypto::body::BodyKey>,
    ) {
        self.sessions.learn(client, enc, key);
    }

    /// Mutant `clear-bodies`.
    #[cfg(feature = "mutants")]
    pub(crate) fn clear_bodies(&mut self) {
        self.sessions.clear = true;
    }

    /// Mutant `stale-reply-digest` (carried over to the tables that state transfer and
    /// restarts load).
    #[cfg(feature = "mutants")]
    pub(crate) fn stale_reply_digests(&mut self) {
        self.clients.keep_digest_on_replace = true;
    }

    /// Ordered operations refused because they did not open (confidential bodies).
    pub(crate) fn bodies_refused(&self) -> u64 {
        self.bodies_refused
    }

    /// Body sessions known (one per client at most).
    pub(crate) fn sessions_len(&self) -> usize {
        self.sessions.len()
    }

    // ----- how far it executed ---------------------------------------------------------------

    pub(crate) fn last_executed(&self) -> Seq {
        self.last_executed
    }

    /// Execution stands at checkpoint `seq` without having loaded it (its state is known bad
    /// and will be fetched).
    pub(crate) fn stand_at(&mut self, seq: Seq) {
        self.last_executed = seq;
    }

    pub(crate) fn executed_at(&self, seq: Seq) -> Option<Digest> {
        self.executed.get(&seq).copied()
    }

    /// Forgets the digests executed at or below `seq` (a checkpoint there became stable).
    pub(crate) fn forget_executed_through(&mut self, seq: Seq) {
        self.executed = self.executed.split_off(&(seq + 1));
    }

    pub(crate) fn executed_len(&self) -> usize {
        self.executed.len()
    }

    // ----- the exactly-once table -------------------------------------------------------------

    pub(crate) fn last_reply(&self, c: ClientId) -> Option<&LastReply> {
        self.clients.get(&c)
    }

    pub(crate) fn replies(&self) -> impl Iterator<Item = (&ClientId, &LastReply)> {
        self.clients.iter()
    }

    pub(crate) fn clients_len(&self) -> usize {
        self.clients.len()
    }

    /// The timestamp up to which client `c`'s requests are settled, given that its request
    /// `ts` was in an executed batch.
    pub(crate) fn settled(&self, c: ClientId, ts: u64) -> u64 {
        self.clients.get(&c).map_or(ts, |l| l.timestamp.max(ts))
    }

    // ----- running batches ------------------------------------------------------------------

    /// Starts running a batch proposed at `proposed_ms`: returns the agreed clock for it
    /// (strictly after the previous batch's).
    fn start_batch(&mut self, proposed_ms: u64) -> u64 {
        let time_ms = proposed_ms.max(self.last_time_ms + 1);
        self.last_time_ms = time_ms;
        time_ms
    }

    /// Whether client `c`'s request `ts` ran already (exactly once).
    fn ran(&self, c: ClientId, ts: u64) -> bool {
        self.clients.get(&c).is_some_and(|l| l.timestamp >= ts)
    }

    /// Runs one request against the service: its operation opened and its result sealed
    /// when bodies are sealed (an operation that does not open gets a refusal, identical at
    /// every executor, and does not run).
    fn run(&mut self, req: &Request, ctx: &ExecContext) -> Vec<u8> {
        match self.sessions.open(req) {
            Ok(op) => {
                let result = self.service.execute(&mut self.state, &op, ctx);
                self.sessions.seal(req, result)
            }
            Err(refusal) => {
                self.bodies_refused += 1;
                refusal
            }
        }
    }

    /// Records client `c`'s executed request (and, while a tentative batch runs, what it
    /// replaced, for undoing).
    pub(crate) fn record(&mut self, c: ClientId, last: LastReply) {
        let old = self.clients.insert(c, last);
        if let Some(undo) = self.opening.as_mut() {
            undo.clients_before.push((c, old));
        }
    }

    /// Batch `seq` (`digest`) executed and committed.
    pub(crate) fn complete(&mut self, seq: Seq, digest: Digest) {
        debug_assert_eq!(seq, self.last_executed + 1);
        self.last_executed = seq;
        self.executed.insert(seq, digest);
    }

    // ----- tentative execution --------------------------------------------------------------

    pub(crate) fn tentative(&self) -> Option<&Tentative> {
        self.tentative.as_ref()
    }

    /// A batch is about to run tentatively: its writes and its exactly-once entries are
    /// recorded so they can be undone.
    pub(crate) fn begin_tentative(&mut self) {
        debug_assert!(self.tentative.is_none() && self.opening.is_none());
        self.state.begin_tentative();
        self.opening = Some(Undo {
            last_time_before: self.last_time_ms,
            clients_before: Vec::new(),
        });
    }

    /// The tentative batch begun last ran: hold it until it commits or is undone.
    pub(crate) fn hold_tentative(
        &mut self,
        seq: Seq,
        digest: Digest,
        batch: Arc<Batch>,
        executed: Vec<(ClientId, u64)>,
    ) {
        let undo = self.opening.take().expect("a tentative batch began");
        self.tentative = Some(Tentative {
            seq,
            digest,
            batch,
            executed,
            undo,
        });
    }

    /// The tentative batch committed: its effects stay. Returns it (to complete like any
    /// batch).
    pub(crate) fn keep_tentative(&mut self) -> Option<Tentative> {
        let t = self.tentative.take()?;
        self.state.keep_tentative();
        Some(t)
    }

    /// Undoes the tentative batch, if any. The service rebuilds its in-memory structures from
    /// the restored pages (a scan of the state; undoing is rare).
    pub(crate) fn undo_tentative(&mut self) -> Option<Undone> {
        let t = self.tentative.take()?;
        self.state.undo_tentative();
        let loaded = self.service.load(&self.state).is_ok();
        for (c, before) in t.undo.clients_before.into_iter().rev() {
            match before {
                Some(l) => {
                    self.clients.insert(c, l);
                }
                None => {
                    self.clients.remove(&c);
                }
            }
        }
        self.last_time_ms = t.undo.last_time_before;
        Some(if loaded {
            Undone::Clean { seq: t.seq }
        } else {
            Undone::Corrupt { seq: t.seq }
        })
    }

    // ----- Prime's eligibility ---------------------------------------------------------------

    /// Prime: per originator, the last PO-REQUEST executed (empty before any).
    pub(crate) fn eligible(&self) -> &[Seq] {
        &self.eligible
    }

    /// Prime: the batch just applied ran the PO-REQUESTs up to `eligible` (set in the same
    /// step as the batch, so a checkpoint never sees one without the other).
    pub(crate) fn set_eligible(&mut self, eligible: Vec<Seq>) {
        self.eligible = eligible;
    }

    // ----- checkpoints ---------------------------------------------------------------------

    /// The auxiliary bytes of a checkpoint at `seq` of the current execution state.
    pub(crate) fn checkpoint_aux(&self, seq: Seq) -> Vec<u8> {
        self.clients.aux(seq, self.last_time_ms, &self.eligible)
    }

    /// Takes checkpoint `seq` of the executed state (pages and auxiliary bytes) and returns
    /// its digest; `None` if the state already holds a checkpoint at or after `seq`.
    pub(crate) fn checkpoint(&mut self, seq: Seq) -> Option<Digest> {
        if seq <= self.state.latest() {
            return None;
        }
        let aux = self.checkpoint_aux(seq);
        let aux_digest = self
            .clients
            .aux_digest(seq, self.last_time_ms, &self.eligible);
        // The simulator (built with mutants) checks every checkpoint's digest from its bytes,
        // as a replica fetching or restoring it computes it.
        #[cfg(any(test, feature = "mutants"))]
        assert_eq!(
            aux_digest,
            replies::aux_digest(&aux),
            "incremental auxiliary digest"
        );
        let root = self.state.checkpoint(seq, aux);
        Some(crate::transfer::checkpoint_digest(seq, &root, &aux_digest))
    }

    /// The digest of our own checkpoint at `seq`, if we hold one.
    pub(crate) fn own_checkpoint(&self, seq: Seq) -> Option<Digest> {
        self.checkpoints.get(&seq).copied()
    }

    /// The latest of our own checkpoints.
    pub(crate) fn latest_own_checkpoint(&self) -> Option<Seq> {
        self.checkpoints.keys().next_back().copied()
    }

    /// Our state is checkpoint `seq` with `digest` (taken, fetched or restored).
    pub(crate) fn note_checkpoint(&mut self, seq: Seq, digest: Digest) {
        self.checkpoints.insert(seq, digest);
    }

    /// Our checkpoint at `seq` is not what f+1 replicas computed: forget it.
    pub(crate) fn forget_checkpoint(&mut self, seq: Seq) {
        self.checkpoints.remove(&seq);
    }

    /// Our checkpoints at `seq` and after, in order.
    pub(crate) fn own_checkpoints_from(&self, seq: Seq) -> Vec<(Seq, Digest)> {
        self.checkpoints
            .range(seq..)
            .map(|(n, d)| (*n, *d))
            .collect()
    }

    /// Forgets every checkpoint of ours (the state starts over).
    pub(crate) fn forget_checkpoints(&mut self) {
        self.checkpoints.clear();
    }

    /// Forgets our checkpoints below `seq` (the new low watermark).
    pub(crate) fn forget_checkpoints_below(&mut self, seq: Seq) {
        self.checkpoints = self.checkpoints.split_off(&seq);
    }

    /// Forgets our checkpoints but the stable one and those after `seq` (a fetched checkpoint
    /// at `seq` replaces what we had computed up to it).
    pub(crate) fn forget_checkpoints_but(&mut self, stable: Seq, seq: Seq) {
        self.checkpoints.retain(|n, _| *n == stable || *n > seq);
    }

    pub(crate) fn checkpoints_len(&self) -> usize {
        self.checkpoints.len()
    }

    /// Sets the execution variables from checkpoint `seq`'s auxiliary bytes and lets the
    /// service rebuild its in-memory structures from the pages.
    pub(crate) fn load_aux(&mut self, seq: Seq, aux: &[u8]) -> Result<(), String> {
        let st = replies::decode(aux)?;
        if st.seq != seq {
            return Err(format!("auxiliary bytes are for checkpoint {}", st.seq));
        }
        self.service
            .load(&self.state)
            .map_err(|e| format!("service state: {e}"))?;
        #[cfg(feature = "mutants")]
        let keep = self.clients.keep_digest_on_replace;
        self.clients = st.replies;
        #[cfg(feature = "mutants")]
        {
            self.clients.keep_digest_on_replace = keep;
        }
        self.last_time_ms = st.last_time_ms;
        self.last_executed = seq;
        self.eligible = st.eligible;
        self.executed.clear();
        Ok(())
    }

    /// Execution starts over at checkpoint 0 (a recovery that distrusts its own state): the
    /// reply table and clock of checkpoint 0, nothing executed.
    pub(crate) fn restart_at_genesis(&mut self) {
        let _ = self.load_aux(0, &initial_aux());
        self.last_executed = 0;
        self.executed.clear();
    }

    /// Checks the component's invariants; `Err` names the first that fails.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        // Commits are handed to the host at the end of every step and written before the
        // next: only one step's worth (a checkpoint or two, a transfer) is ever unwritten.
        if self.state.unsynced_commits() > UNSYNCED_COMMITS_MAX {
            return Err(format!(
                "{} state commits not written by the host",
                self.state.unsynced_commits()
            ));
        }
        if let Some((&top, _)) = self.executed.last_key_value() {
            if top > self.last_executed {
                return Err(format!(
                    "executed digest recorded at n{top} beyond last executed n{}",
                    self.last_executed
                ));
            }
        }
        if let Some(t) = &self.tentative {
            if t.seq != self.last_executed + 1 {
                return Err(format!(
                    "tentative batch at n{} with last executed n{}",
                    t.seq, self.last_executed
                ));
            }
            if t.batch.digest() != t.digest {
                return Err(format!(
                    "tentative batch at n{} under a wrong digest",
                    t.seq
                ));
            }
        }
        if self.opening.is_some() {
            return Err("a tentative batch began and was never held".into());
        }
        if self.state.latest() > self.last_executed && !self.diverged {
            // A checkpoint is only taken of executed state (a fetched one sets last_executed).
            // The exception: a fetched checkpoint the service did not load from (a kept page
            // corrupt where its digest entry did not show it). The state then holds that
            // checkpoint, diverged, until the corrupt pages are fetched again and it loads
            // (simulator seed 66029).
            return Err(format!(
                "state checkpoint n{} beyond last executed n{}",
                self.state.latest(),
                self.last_executed
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{NonDet, RecoveryResult, SignedRequest};
    use redoubt_state::{Geometry, MemStore, StateRead, StateWrite};

    /// Adds each operation's first byte to a counter at offset 0 and returns the new value.
    struct Counter;
    impl Service for Counter {
        fn execute(&mut self, st: &mut dyn StateWrite, op: &[u8], _: &ExecContext) -> Vec<u8> {
            let mut b = [0u8; 8];
            st.read(0, &mut b);
            let v = u64::from_le_bytes(b) + op.first().copied().unwrap_or(0) as u64;
            st.write(0, &v.to_le_bytes());
            v.to_le_bytes().to_vec()
        }
        fn execute_read_only(&self, st: &dyn StateRead, _: &[u8]) -> Option<Vec<u8>> {
            let mut b = [0u8; 8];
            st.read(0, &mut b);
            Some(b.to_vec())
        }
        fn load(&mut self, _: &dyn StateRead) -> Result<(), String> {
            Ok(())
        }
    }

    fn exec() -> Execution<Counter> {
        let state =
            open_state(Box::new(MemStore::new(Geometry::new(256, 16, 4).unwrap()))).unwrap();
        Execution::new(Counter, state, false)
    }

    fn ctx(seq: Seq, client: ClientId) -> ExecContext {
        ExecContext {
            seq,
            client,
            time_ms: 0,
            batch_seed: 0,
            index: 0,
        }
    }

    fn op(client: ClientId, timestamp: u64, op: Vec<u8>) -> Request {
        Request {
            client,
            timestamp,
            read_only: false,
            op: op.into(),
        }
    }

    fn batch() -> Arc<Batch> {
        Arc::new(Batch {
            nondet: NonDet {
                time_ms: 5,
                seed: 0,
            },
            requests: Vec::new(),
            matrix: None,
        })
    }

    /// Runs `add` for `client`'s request `ts` as batch `seq`, committed.
    fn run_committed(e: &mut Execution<Counter>, seq: Seq, client: ClientId, ts: u64, add: u8) {
        e.start_batch(seq * 10);
        let result = e.run(&op(client, seq, vec![add]), &ctx(seq, client));
        e.record(
            client,
            LastReply {
                timestamp: ts,
                result,
            },
        );
        e.complete(seq, Digest::ZERO);
    }

    /// Client 7's request 101 (adds 4) as batch 2, run tentatively.
    fn run_tentative(e: &mut Execution<Counter>) {
        e.begin_tentative();
        e.start_batch(500);
        let result = e.run(&op(7, 2, vec![4]), &ctx(2, 7));
        e.record(
            7,
            LastReply {
                timestamp: 101,
                result,
            },
        );
        e.hold_tentative(2, batch().digest(), batch(), vec![(7, 101)]);
    }

    fn value(e: &Execution<Counter>) -> u64 {
        u64::from_le_bytes(
            e.read_only(&Request {
                client: 0,
                timestamp: 0,
                read_only: true,
                op: Default::default(),
            })
            .unwrap()
            .try_into()
            .unwrap(),
        )
    }

    #[test]
    fn requests_run_once_and_the_clock_only_moves_forward() {
        let mut e = exec();
        run_committed(&mut e, 1, 7, 100, 3);
        assert!(e.ran(7, 100) && e.ran(7, 99) && !e.ran(7, 101) && !e.ran(8, 1));
        assert_eq!(e.settled(7, 90), 100);
        assert_eq!(
            e.start_batch(0),
            11,
            "a proposal from the past runs after the last"
        );
        assert_eq!(e.last_executed(), 1);
        assert_eq!(e.executed_at(1), Some(Digest::ZERO));
        e.forget_executed_through(1);
        assert_eq!(e.executed_at(1), None);
        assert_eq!(e.check_invariants(), Ok(()));
    }

    #[test]
    fn an_undone_tentative_batch_leaves_no_trace_and_a_kept_one_stays() {
        let mut e = exec();
        run_committed(&mut e, 1, 7, 100, 3);
        let clock = e.start_batch(0);
        // Undone: pages, the reply table and the clock are as before.
        run_tentative(&mut e);
        assert_eq!(value(&e), 7);
        assert_eq!(e.check_invariants(), Ok(()));
        assert!(matches!(e.undo_tentative(), Some(Undone::Clean { seq: 2 })));
        assert_eq!(value(&e), 3);
        assert!(!e.ran(7, 101) && e.ran(7, 100));
        assert_eq!(e.start_batch(0), clock + 1);
        // Kept: everything stays.
        run_tentative(&mut e);
        let t = e.keep_tentative().expect("held");
        e.complete(t.seq, t.digest);
        assert_eq!(value(&e), 7);
        assert!(e.ran(7, 101));
        assert!(e.undo_tentative().is_none());
    }

    #[test]
    fn checkpoint_bytes_restore_the_reply_table_and_clock() {
        let mut e = exec();
        run_committed(&mut e, 1, 7, 100, 3);
        let aux = e.checkpoint_aux(1);
        let mut f = exec();
        assert!(f.load_aux(2, &aux).is_err(), "bytes of another checkpoint");
        f.load_aux(1, &aux).unwrap();
        assert!(f.ran(7, 100) && !f.ran(7, 101));
        assert_eq!(f.last_executed(), 1);
        assert_eq!(f.start_batch(0), e.start_batch(0));
        assert!(f.load_aux(1, b"garbage").is_err());
    }

    #[test]
    fn the_invariant_check_finds_a_tentative_batch_out_of_place() {
        let mut e = exec();
        e.begin_tentative();
        assert!(e.check_invariants().is_err(), "begun but never held");
        e.hold_tentative(5, batch().digest(), batch(), Vec::new());
        let err = e.check_invariants().unwrap_err();
        assert!(err.contains("tentative batch at n5"), "{err}");
        e.undo_tentative();
        e.hold_wrong_digest_for_test();
        assert!(e.check_invariants().unwrap_err().contains("wrong digest"));
    }

    #[test]
    fn serving_state_answers_within_limits_and_budget() {
        use crate::message::{Fetch, FetchItem, Reject, StateItem};
        let mut e = exec();
        let root = |seq| Fetch {
            seq,
            items: vec![FetchItem {
                level: 0,
                index: 0,
                lc: 0,
            }],
            session: None,
        };
        let limits = ServeLimits {
            items_max: 4,
            reply_bytes_max: 64,
            rate_bytes_per_sec: 0,
        };
        // A probe (seq 0) gets the root of the stable checkpoint, with the auxiliary bytes.
        let (d, used) = e.serve(1, &root(0), 0, 0, limits).unwrap();
        assert_eq!((d.seq, d.stable), (0, 0));
        assert!(d.aux.is_some());
        assert!(matches!(d.items[..], [StateItem::Meta { level: 0, .. }]));
        assert!(used > 0);
        // A checkpoint we do not hold: an empty answer.
        assert!(e
            .serve(1, &root(32), 0, 0, limits)
            .unwrap()
            .0
            .items
            .is_empty());
        // Too many items.
        let mut big = root(0);
        big.items = vec![big.items[0]; 5];
        assert_eq!(
            e.serve(1, &big, 0, 0, limits),
            Err(Refused::Rejected(Reject::TooLarge))
        );
        // The asker's budget (4 answers' worth, no refill) runs out; another asker's does not.
        let refused = (0..8)
            .map(|_| e.serve(1, &root(0), 0, 0, limits))
            .filter(|r| *r == Err(Refused::Rejected(Reject::RateLimited)))
            .count();
        assert!(refused > 0, "the budget ran out");
        assert!(e.serve(2, &root(0), 0, 0, limits).is_ok());
    }

    /// Two components talking through values only: one executes and checkpoints, the other
    /// fetches that checkpoint from it partition by partition and ends in the same state.
    #[test]
    fn a_checkpoint_is_fetched_from_another_execution() {
        let limits = ServeLimits {
            items_max: 256,
            reply_bytes_max: 1 << 20,
            rate_bytes_per_sec: 1 << 30,
        };
        let mut a = exec();
        for seq in 1..=16 {
            run_committed(&mut a, seq, 7, 100 + seq, seq as u8);
        }
        let digest = a.checkpoint(16).expect("a new checkpoint");
        assert_eq!(a.checkpoint(16), None, "taken already");
        let mut b = exec();
        b.start_transfer(16, digest, 0, 0, 0);
        assert!(matches!(b.transfer_due(0), Due::Begin));
        b.begin_walk();
        b.retry_with_next_replier(vec![0], 1, 4);
        let mut rounds = 0;
        let finished = loop {
            rounds += 1;
            assert!(rounds < 20, "the walk ends");
            let (to, fetch) = b.next_fetch(0, limits.items_max, 100).expect("asks");
            assert_eq!(to, 0);
            let (data, _) = a.serve(1, &fetch, 16, 0, limits).expect("served");
            match b.answer(0, &data, true).expect("checks out") {
                Answered::Complete => break b.finish_walk(true),
                Answered::Ask => {}
                _ => panic!("an answer with data moves the walk"),
            }
        };
        let Finished::Adopted { seq, aux, .. } = finished else {
            panic!("the fetched state checks out")
        };
        b.load_aux(seq, &aux).unwrap();
        assert_eq!(value(&b), value(&a));
        assert!(b.ran(7, 116) && !b.ran(7, 117));
        assert_eq!(b.last_executed(), 16);
        assert_eq!(b.transfer_target(), None);
    }

    // ----- running a batch, request by request (batch.rs) ----------------------------------

    fn batch_of(requests: Vec<(ClientId, u64, u8)>) -> Batch {
        Batch {
            nondet: NonDet {
                time_ms: 40,
                seed: 9,
            },
            requests: requests
                .into_iter()
                .map(|(c, ts, add)| SignedRequest {
                    request: op(c, ts, vec![add]),
                    auth: Arc::from(Vec::new()),
                    sig: None,
                })
                .collect(),
            matrix: None,
        }
    }

    /// Replica 1's recovery client (of four replicas).
    const RC: ClientId = crate::message::RECOVERY_CLIENT_BASE + 1;

    fn steps_with(
        e: &mut Execution<Counter>,
        b: &Batch,
        runs: bool,
        recoveries: Recoveries,
    ) -> Vec<String> {
        let executed = e.run_batch(3, b, runs, &recoveries);
        let mut out = Vec::new();
        for step in executed.steps {
            out.push(match step {
                Step::Ran { index, result } => format!("ran {index}{}", shown(&result)),
                Step::Again { index, last } => {
                    let recovery = b.requests[index].request.client == RC;
                    let last = match last {
                        Some(_) if recovery => " = the recovery's result".to_string(),
                        Some(l) => shown(&l),
                        None => String::new(),
                    };
                    format!("again {index}{last}")
                }
                Step::Recovery {
                    index,
                    replica,
                    accepted,
                    ..
                } => format!("recovery {index} of {replica} accepted {accepted}"),
            });
        }
        out
    }

    /// A counter's result as the steps show it.
    fn shown(result: &[u8]) -> String {
        match <[u8; 8]>::try_from(result) {
            Ok(v) => format!(" = {}", u64::from_le_bytes(v)),
            Err(_) => format!(" ({} bytes)", result.len()),
        }
    }

    fn steps(e: &mut Execution<Counter>, b: &Batch, runs: bool) -> Vec<String> {
        steps_with(e, b, runs, Recoveries::Run(recovery::tests::rules()))
    }

    #[test]
    fn each_request_runs_once_in_order_and_recovery_requests_run_by_their_rules() {
        let mut e = exec();
        // Client 7's request 5 twice in one batch (a faulty primary's), an older one of
        // client 7 after it, a recovery request twice.
        let b = batch_of(vec![
            (7, 5, 2),
            (RC, 1, 0),
            (7, 5, 2),
            (7, 4, 3),
            (RC, 1, 0),
            (8, 1, 1),
        ]);
        assert_eq!(
            steps(&mut e, &b, true),
            [
                "ran 0 = 2",
                "recovery 1 of 1 accepted true",
                "again 2 = 2",
                "again 3",
                "again 4 = the recovery's result",
                "ran 5 = 3"
            ]
        );
        assert_eq!(value(&e), 3, "2 and 1 added, each once");
        let result = e.last_reply(RC).map(|l| l.result.clone()).unwrap();
        let result: RecoveryResult = postcard::from_bytes(&result).unwrap();
        assert_eq!((result.seq, result.accepted, result.target), (3, true, 8));
        assert_eq!(result.last_accepted_ms, Some(e.last_time_ms));
        // The next batch runs later on the agreed clock, and nothing in it twice.
        assert_eq!(
            steps(&mut e, &b, true),
            [
                "again 0 = 2",
                "again 1 = the recovery's result",
                "again 2 = 2",
                "again 3",
                "again 4 = the recovery's result",
                "again 5 = 3"
            ]
        );
        // Execution nodes skip recovery requests: no step, nothing recorded. A reserved id
        // beyond the replicas is an ordinary client at a replica.
        let mut x = exec();
        let beyond = crate::message::RECOVERY_CLIENT_BASE + 4;
        let b = batch_of(vec![(RC, 1, 0), (beyond, 1, 1), (8, 1, 1)]);
        assert_eq!(
            steps_with(&mut x, &b, true, Recoveries::Skip),
            ["ran 2 = 1"]
        );
        assert!(x.last_reply(RC).is_none() && x.last_reply(beyond).is_none());
        let mut y = exec();
        assert_eq!(
            steps(&mut y, &b, true),
            ["recovery 0 of 1 accepted true", "ran 1 = 1", "ran 2 = 2"]
        );
    }

    #[test]
    fn a_batch_only_ordered_here_is_recorded_not_run() {
        let mut e = exec();
        let b = batch_of(vec![(7, 5, 2)]);
        assert_eq!(steps(&mut e, &b, false), ["ran 0 (0 bytes)"]);
        assert_eq!(value(&e), 0, "the service did not run");
        assert_eq!(
            e.last_reply(7).map(|l| (l.timestamp, l.result.len())),
            Some((5, 0))
        );
    }

    impl Execution<Counter> {
        fn hold_wrong_digest_for_test(&mut self) {
            self.begin_tentative();
            self.hold_tentative(1, Digest::ZERO, batch(), Vec::new());
        }
    }
}
