//! Linearizability checker for key-value histories.
//!
//! A history is linearizable if every operation can be given a single instant between its
//! invocation and its completion such that executing the operations one at a time in the
//! order of those instants, on a sequential map that starts empty, yields exactly the
//! observed results. Operations that never completed may take effect at any instant after
//! their invocation, or not at all.
//!
//! Linearizability is compositional (Herlihy & Wing's locality, "P-compositionality" in
//! Porcupine), and a map is a product of independent registers, so the history is split by
//! key and each key is checked on its own. Per key, the checker runs the Wing & Gong search
//! with Lowe's memoization, as in Porcupine: the history is a doubly linked list of call and
//! return events sorted by time; the search repeatedly linearizes the first call it can
//! (removing the call and its return from the list, pushing an undo record) and backtracks
//! when it reaches a return whose call is still pending. Configurations (set of linearized
//! operations as a bitset, register state) already explored are cached, which makes the
//! search polynomial on realistic histories. A step budget bounds the worst case.
//!
//! One refinement over Porcupine: an operation whose observed output implies that it left
//! the state unchanged (a Get, a failed Cas, a Put that reported the value it wrote, ...) is
//! linearized as soon as it is a candidate that matches the current state, and no alternative
//! to it is explored. This is sound because moving such an operation earlier, to a point
//! where all its real-time predecessors are linearized and its output matches, preserves
//! every other operation's result and every real-time constraint. It removes the branching
//! over interleavings of concurrent reads, which dominates the cost of *rejecting* a history
//! (the search must then exhaust every configuration). A test cross-checks the result
//! against brute-force enumeration on thousands of small histories.
//!
//! Values are interned to small integers so that states compare and hash cheaply.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use redoubt_services::kv::{KvOp, KvResult};

/// Default per-key bound on search steps of [`check`].
pub const DEFAULT_STEP_BUDGET: u64 = 5_000_000;

/// One client operation as observed by the test harness.
#[derive(Clone, Debug)]
pub struct Operation {
    pub client: u64,
    pub invoke_ms: u64,
    /// None if the operation never completed (its effect may or may not have happened).
    pub complete_ms: Option<u64>,
    pub op: KvOp,
    /// None iff complete_ms is None.
    pub result: Option<KvResult>,
}

/// Why a history is not (or could not be shown to be) linearizable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub key: Vec<u8>,
    pub explanation: String,
}

/// Checks that the history is linearizable w.r.t. a sequential map (initially empty).
pub fn check(history: &[Operation]) -> Result<(), Violation> {
    check_with_budget(history, DEFAULT_STEP_BUDGET)
}

/// [`check`] with an explicit per-key bound on search steps. Exhausting the budget is
/// reported as a violation ("search budget exhausted"), never as success.
pub fn check_with_budget(history: &[Operation], step_budget: u64) -> Result<(), Violation> {
    let mut per_key: BTreeMap<&[u8], Vec<usize>> = BTreeMap::new();
    for (i, o) in history.iter().enumerate() {
        let key = validate(i, o)?;
        per_key.entry(key).or_default().push(i);
    }
    for (key, ops) in per_key {
        check_key(history, &ops, step_budget).map_err(|explanation| Violation {
            key: key.to_vec(),
            explanation,
        })?;
    }
    Ok(())
}

/// Checks the shape of one operation and returns its key.
fn validate(i: usize, o: &Operation) -> Result<&[u8], Violation> {
    let Some(key) = o.op.key() else {
        let KvOp::Scan { start, .. } = &o.op else {
            unreachable!("only Scan has no key")
        };
        return Err(Violation {
            key: start.clone(),
            explanation: format!(
                "op #{i} is a Scan, which the checker does not support (single-key operations \
                 only): {}",
                describe(o)
            ),
        });
    };
    let malformed = |what: &str| Violation {
        key: key.to_vec(),
        explanation: format!("malformed history: op #{i} {what}: {}", describe(o)),
    };
    if o.complete_ms.is_some() != o.result.is_some() {
        return Err(malformed("must have a result iff it completed"));
    }
    if o.complete_ms.is_some_and(|c| c < o.invoke_ms) {
        return Err(malformed("completed before it was invoked"));
    }
    let Some(result) = &o.result else {
        return Ok(key);
    };
    let kind_ok = match (&o.op, result) {
        (_, KvResult::Error(e)) => {
            return Err(Violation {
                key: key.to_vec(),
                explanation: format!(
                    "op #{i} returned an error, which the sequential map never does for a \
                     well-formed operation ({e}): {}",
                    describe(o)
                ),
            })
        }
        (KvOp::Get { .. }, KvResult::Value(_)) => true,
        (KvOp::Put { .. } | KvOp::Delete { .. }, KvResult::Written { .. }) => true,
        (KvOp::Set { .. }, KvResult::Done) => true,
        (KvOp::Cas { .. }, KvResult::Cas { .. }) => true,
        _ => false,
    };
    if !kind_ok {
        return Err(Violation {
            key: key.to_vec(),
            explanation: format!("op #{i} got a result of the wrong kind: {}", describe(o)),
        });
    }
    Ok(key)
}

/// A register value: 0 is "absent", `i + 1` is the i-th interned byte string.
type State = u32;

/// The effect of an operation on the register.
#[derive(Clone, Copy, Debug)]
enum Effect {
    Get,
    Put(State),
    Set(State),
    Delete,
    Cas { expected: State, new: State },
}

/// An operation's observed output, with values interned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Value(State),
    Written(State),
    Done,
    Cas { ok: bool, current: State },
}

#[derive(Clone, Copy, Debug)]
struct Model {
    effect: Effect,
    /// None for an operation that never completed: any output is acceptable.
    output: Option<Output>,
}

impl Model {
    /// True if the observed output implies that the operation left the state unchanged,
    /// wherever it was linearized.
    fn is_inert(&self) -> bool {
        match (self.effect, self.output) {
            (_, None) => false,
            (Effect::Get, _) => true,
            (Effect::Put(v), Some(Output::Written(previous))) => v == previous,
            (Effect::Delete, Some(Output::Written(previous))) => previous == 0,
            (Effect::Cas { .. }, Some(Output::Cas { ok: false, .. })) => true,
            (Effect::Cas { expected, new }, Some(Output::Cas { ok: true, .. })) => expected == new,
            _ => false,
        }
    }

    /// The sequential specification: the next state if this operation, applied in state `s`,
    /// produces the observed output.
    fn step(&self, s: State) -> Option<State> {
        let (out, next) = match self.effect {
            Effect::Get => (Output::Value(s), s),
            Effect::Put(v) => (Output::Written(s), v),
            Effect::Set(v) => (Output::Done, v),
            Effect::Delete => (Output::Written(s), 0),
            Effect::Cas { expected, new } if s == expected => (
                Output::Cas {
                    ok: true,
                    current: new,
                },
                new,
            ),
            Effect::Cas { .. } => (
                Output::Cas {
                    ok: false,
                    current: s,
                },
                s,
            ),
        };
        match self.output {
            Some(o) if o != out => None,
            _ => Some(next),
        }
    }
}

#[derive(Default)]
struct Interner<'a> {
    ids: HashMap<&'a [u8], State>,
    values: Vec<&'a [u8]>,
}

impl<'a> Interner<'a> {
    fn id(&mut self, v: Option<&'a Vec<u8>>) -> State {
        let Some(v) = v else { return 0 };
        if let Some(&id) = self.ids.get(v.as_slice()) {
            return id;
        }
        self.values.push(v);
        let id = self.values.len() as State;
        self.ids.insert(v, id);
        id
    }

    fn show(&self, s: State) -> String {
        match s {
            0 => "absent".to_string(),
            i => show_bytes(self.values[i as usize - 1]),
        }
    }
}

const NIL: usize = usize::MAX;

/// An undo record of the search: `op` was linearized in state `state`.
struct Undo {
    op: usize,
    state: State,
    /// Linearized eagerly (inert), so there is no alternative to try instead of it.
    forced: bool,
}

/// The Fx hash (from rustc): much faster than SipHash on the cache's bitsets, and collision
/// resistance does not matter here.
#[derive(Default)]
struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The deepest point the search reached, for the explanation of a failure.
struct Best {
    depth: usize,
    state: State,
    /// The operation whose return was reached while it was still pending.
    blocked: usize,
    /// Pending operations invoked before `blocked` returned: every one of them failed.
    candidates: Vec<usize>,
    /// The last few operations of the linearized prefix, oldest first.
    tail: Vec<usize>,
}

/// Checks the operations `idx` (all on one key) of `history`. Returns the number of search
/// steps on success.
fn check_key(history: &[Operation], idx: &[usize], budget: u64) -> Result<u64, String> {
    // Incomplete reads have no effect and constrain nothing: drop them.
    let ops: Vec<&Operation> = idx
        .iter()
        .map(|&i| &history[i])
        .filter(|o| o.complete_ms.is_some() || !o.op.is_read_only())
        .collect();
    let n = ops.len();
    let mut interner = Interner::default();
    let models: Vec<Model> = ops
        .iter()
        .map(|o| {
            let effect = match &o.op {
                KvOp::Get { .. } => Effect::Get,
                KvOp::Put { value, .. } => Effect::Put(interner.id(Some(value))),
                KvOp::Set { value, .. } => Effect::Set(interner.id(Some(value))),
                KvOp::Delete { .. } => Effect::Delete,
                KvOp::Cas { expected, new, .. } => Effect::Cas {
                    expected: interner.id(expected.as_ref()),
                    new: interner.id(Some(new)),
                },
                KvOp::Scan { .. } => unreachable!("rejected by validate"),
            };
            let output = o.result.as_ref().map(|r| match r {
                KvResult::Value(v) => Output::Value(interner.id(v.as_ref())),
                KvResult::Written { previous } => Output::Written(interner.id(previous.as_ref())),
                KvResult::Done => Output::Done,
                KvResult::Cas { ok, current } => Output::Cas {
                    ok: *ok,
                    current: interner.id(current.as_ref()),
                },
                KvResult::Pairs(_) | KvResult::Error(_) => unreachable!("rejected by validate"),
            });
            Model { effect, output }
        })
        .collect();

    // Events sorted by time; at equal times calls come first, since operations are ordered
    // only if one completes strictly before the other is invoked.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n); // (time, is_return, op)
    for (i, o) in ops.iter().enumerate() {
        events.push((o.invoke_ms, false, i));
        if let Some(c) = o.complete_ms {
            events.push((c, true, i));
        }
    }
    events.sort_unstable();

    // Doubly linked list over nodes: 0 is the head sentinel, event j is node j + 1.
    let m = events.len();
    let mut next: Vec<usize> = (1..=m + 1).map(|j| if j > m { NIL } else { j }).collect();
    let mut prev: Vec<usize> = (0..=m).map(|j| if j == 0 { NIL } else { j - 1 }).collect();
    let node_op: Vec<usize> = std::iter::once(NIL)
        .chain(events.iter().map(|e| e.2))
        .collect();
    let node_is_return: Vec<bool> = std::iter::once(false)
        .chain(events.iter().map(|e| e.1))
        .collect();
    let mut call_node = vec![NIL; n];
    let mut return_node = vec![NIL; n];
    for (j, &(_, is_return, op)) in events.iter().enumerate() {
        if is_return {
            return_node[op] = j + 1;
        } else {
            call_node[op] = j + 1;
        }
    }

    fn unlink(next: &mut [usize], prev: &mut [usize], x: usize) {
        next[prev[x]] = next[x];
        if next[x] != NIL {
            prev[next[x]] = prev[x];
        }
    }
    fn relink(next: &mut [usize], prev: &mut [usize], x: usize) {
        next[prev[x]] = x;
        if next[x] != NIL {
            prev[next[x]] = x;
        }
    }

    // Operations whose observed output implies they leave the state unchanged (reads,
    // failed Cas, ...). If such an operation is a candidate and matches the current state,
    // linearizing it right now is never worse than later: it changes nothing, and every
    // operation that must precede it is already linearized. So it is linearized eagerly and
    // no alternative is explored for it.
    let inert: Vec<bool> = models.iter().map(Model::is_inert).collect();
    let words = n.div_ceil(64).max(1);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, State), BuildHasherDefault<FxHasher>> = HashSet::default();
    let mut stack: Vec<Undo> = Vec::new();
    let mut state: State = 0;
    let mut remaining = ops.iter().filter(|o| o.complete_ms.is_some()).count();
    let mut best: Option<Best> = None;
    let mut entry = next[0];
    // True when the search just entered a new configuration.
    let mut fresh = true;
    let mut steps: u64 = 0;

    // Invariant: while a completed operation is pending, its return is in the list after
    // `entry`, so `entry` never runs off the end.
    while remaining > 0 {
        steps += 1;
        if steps > budget {
            let depth = best.map_or(0, |b| b.depth).max(stack.len());
            return Err(format!(
                "search budget exhausted after {budget} steps on {n} operations (longest \
                 linearizable prefix found: {depth} operations); the history may or may not \
                 be linearizable"
            ));
        }
        let mut forced = None;
        if fresh {
            fresh = false;
            entry = next[0];
            // Look for an inert candidate that matches (candidates are the calls before the
            // first return).
            let mut x = next[0];
            while x != NIL && !node_is_return[x] {
                let op = node_op[x];
                if inert[op] && models[op].step(state).is_some() {
                    forced = Some(op);
                    break;
                }
                x = next[x];
            }
        }
        let backtrack = if let Some(op) = forced {
            linearized[op / 64] |= 1 << (op % 64);
            if cache.insert((linearized.clone(), state)) {
                stack.push(Undo {
                    op,
                    state,
                    forced: true,
                });
                unlink(&mut next, &mut prev, call_node[op]);
                unlink(&mut next, &mut prev, return_node[op]);
                remaining -= 1;
                fresh = true;
                continue;
            }
            // Explored before and failed, hence so does this configuration.
            linearized[op / 64] &= !(1 << (op % 64));
            true
        } else {
            debug_assert_ne!(entry, NIL);
            let op = node_op[entry];
            if !node_is_return[entry] {
                // Inert candidates were found not to match on entering this configuration.
                if !inert[op] {
                    if let Some(new_state) = models[op].step(state) {
                        linearized[op / 64] |= 1 << (op % 64);
                        if cache.insert((linearized.clone(), new_state)) {
                            stack.push(Undo {
                                op,
                                state,
                                forced: false,
                            });
                            state = new_state;
                            unlink(&mut next, &mut prev, call_node[op]);
                            if return_node[op] != NIL {
                                unlink(&mut next, &mut prev, return_node[op]);
                                remaining -= 1;
                            }
                            fresh = true;
                            continue;
                        }
                        linearized[op / 64] &= !(1 << (op % 64));
                    }
                }
                entry = next[entry];
                false
            } else {
                // `op` must take effect before it returns, and no pending call before this
                // point can be linearized next.
                if best.as_ref().map_or(0, |b| b.depth + 1) <= stack.len() {
                    let mut candidates = Vec::new();
                    let mut x = next[0];
                    while x != entry {
                        candidates.push(node_op[x]);
                        x = next[x];
                    }
                    let tail = stack[stack.len().saturating_sub(5)..]
                        .iter()
                        .map(|u| u.op)
                        .collect();
                    best = Some(Best {
                        depth: stack.len(),
                        state,
                        blocked: op,
                        candidates,
                        tail,
                    });
                }
                true
            }
        };
        if backtrack {
            // Undo down to the last free choice and try the next candidate after it.
            loop {
                let Some(u) = stack.pop() else {
                    return Err(explain(&ops, &interner, best));
                };
                state = u.state;
                linearized[u.op / 64] &= !(1 << (u.op % 64));
                if return_node[u.op] != NIL {
                    relink(&mut next, &mut prev, return_node[u.op]);
                    remaining += 1;
                }
                relink(&mut next, &mut prev, call_node[u.op]);
                if !u.forced {
                    entry = next[call_node[u.op]];
                    break;
                }
            }
        }
    }
    Ok(steps)
}

fn explain(ops: &[&Operation], interner: &Interner, best: Option<Best>) -> String {
    let n = ops.len();
    let Some(best) = best else {
        return format!("not linearizable: no linearization of the {n} operations on this key");
    };
    let mut s = format!(
        "not linearizable: of {n} operations on this key, the search linearized at most {} \
         (leaving the value {}), after which {} cannot take effect before it returns",
        best.depth,
        interner.show(best.state),
        describe(ops[best.blocked]),
    );
    let others: Vec<usize> = best
        .candidates
        .iter()
        .copied()
        .filter(|&c| c != best.blocked)
        .collect();
    if !others.is_empty() {
        s.push_str(", nor can any concurrent pending operation: ");
        push_list(&mut s, ops, &others, 8);
    }
    if !best.tail.is_empty() {
        s.push_str("; last linearized: ");
        push_list(&mut s, ops, &best.tail, 5);
    }
    s
}

fn push_list(s: &mut String, ops: &[&Operation], list: &[usize], max: usize) {
    let shown: Vec<String> = list.iter().take(max).map(|&i| describe(ops[i])).collect();
    s.push_str(&shown.join(", "));
    if list.len() > max {
        s.push_str(&format!(" and {} more", list.len() - max));
    }
}

fn show_bytes(v: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(v))
}

fn show_opt(v: &Option<Vec<u8>>) -> String {
    v.as_deref()
        .map_or_else(|| "absent".to_string(), show_bytes)
}

/// A one-line description of an operation, e.g. `c3 Put "v" -> prev absent [10..25ms]`.
fn describe(o: &Operation) -> String {
    let op = match &o.op {
        KvOp::Get { .. } => "Get".to_string(),
        KvOp::Put { value, .. } => format!("Put {}", show_bytes(value)),
        KvOp::Set { value, .. } => format!("Set {}", show_bytes(value)),
        KvOp::Delete { .. } => "Delete".to_string(),
        KvOp::Cas { expected, new, .. } => {
            format!("Cas {} => {}", show_opt(expected), show_bytes(new))
        }
        KvOp::Scan { start, end, limit } => format!(
            "Scan [{}, {}) limit {limit}",
            show_bytes(start),
            show_opt(end)
        ),
    };
    let result = match &o.result {
        None => "pending".to_string(),
        Some(KvResult::Value(v)) => show_opt(v),
        Some(KvResult::Written { previous }) => format!("prev {}", show_opt(previous)),
        Some(KvResult::Cas { ok, current }) => {
            format!(
                "{} now {}",
                if *ok { "ok" } else { "failed" },
                show_opt(current)
            )
        }
        Some(KvResult::Pairs(p)) => format!("{} pairs", p.len()),
        Some(KvResult::Error(e)) => format!("error {e:?}"),
        Some(KvResult::Done) => "done".to_string(),
    };
    let end = o
        .complete_ms
        .map_or_else(|| "?".to_string(), |c| c.to_string());
    format!("c{} {op} -> {result} [{}..{end}ms]", o.client, o.invoke_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redoubt_core::{ExecContext, Service};
    use redoubt_services::kv::KvService;
    use std::time::{Duration, Instant};

    fn b(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    fn v(s: Option<&str>) -> Option<Vec<u8>> {
        s.map(b)
    }

    fn done(client: u64, t: (u64, u64), op: KvOp, result: KvResult) -> Operation {
        Operation {
            client,
            invoke_ms: t.0,
            complete_ms: Some(t.1),
            op,
            result: Some(result),
        }
    }

    fn pending(client: u64, t0: u64, op: KvOp) -> Operation {
        Operation {
            client,
            invoke_ms: t0,
            complete_ms: None,
            op,
            result: None,
        }
    }

    fn put(c: u64, t: (u64, u64), val: &str, prev: Option<&str>) -> Operation {
        done(
            c,
            t,
            KvOp::Put {
                key: b("k"),
                value: b(val),
            },
            KvResult::Written { previous: v(prev) },
        )
    }

    fn get(c: u64, t: (u64, u64), val: Option<&str>) -> Operation {
        done(c, t, KvOp::Get { key: b("k") }, KvResult::Value(v(val)))
    }

    fn del(c: u64, t: (u64, u64), prev: Option<&str>) -> Operation {
        done(
            c,
            t,
            KvOp::Delete { key: b("k") },
            KvResult::Written { previous: v(prev) },
        )
    }

    fn cas(
        c: u64,
        t: (u64, u64),
        exp: Option<&str>,
        new: &str,
        ok: bool,
        cur: Option<&str>,
    ) -> Operation {
        done(
            c,
            t,
            KvOp::Cas {
                key: b("k"),
                expected: v(exp),
                new: b(new),
            },
            KvResult::Cas {
                ok,
                current: v(cur),
            },
        )
    }

    fn put_pending(c: u64, t0: u64, val: &str) -> Operation {
        pending(
            c,
            t0,
            KvOp::Put {
                key: b("k"),
                value: b(val),
            },
        )
    }

    #[track_caller]
    fn rejected(h: &[Operation]) -> Violation {
        let v = check(h).expect_err("history must be rejected");
        assert!(!v.explanation.contains("budget"), "{}", v.explanation);
        v
    }

    #[test]
    fn empty_and_sequential_histories_pass() {
        assert_eq!(check(&[]), Ok(()));
        let h = [
            get(1, (0, 1), None),
            put(1, (2, 3), "a", None),
            get(2, (4, 5), Some("a")),
            cas(2, (6, 7), Some("a"), "b", true, Some("b")),
            cas(1, (8, 9), Some("a"), "c", false, Some("b")),
            del(1, (10, 11), Some("b")),
            get(2, (12, 13), None),
        ];
        assert_eq!(check(&h), Ok(()));
    }

    #[test]
    fn stale_read_after_completed_write_is_rejected() {
        let h = [put(1, (0, 10), "1", None), get(2, (20, 30), None)];
        let v = rejected(&h);
        assert_eq!(v.key, b("k"));
        assert!(
            v.explanation.contains("not linearizable"),
            "{}",
            v.explanation
        );
        // The same read concurrent with the write is fine.
        assert_eq!(
            check(&[put(1, (0, 10), "1", None), get(2, (5, 30), None)]),
            Ok(())
        );
        // Touching endpoints count as concurrent.
        assert_eq!(
            check(&[put(1, (0, 10), "1", None), get(2, (10, 30), None)]),
            Ok(())
        );
    }

    #[test]
    fn inconsistent_orders_of_concurrent_writes_are_rejected() {
        // The writes' results fix the order a then b; reader 3 sees b then a.
        let h = [
            put(1, (0, 100), "a", None),
            put(2, (0, 100), "b", Some("a")),
            get(3, (10, 20), Some("b")),
            get(3, (30, 40), Some("a")),
        ];
        rejected(&h);
        // Incomplete writes: two readers observe a and b in opposite orders.
        let h = [
            put_pending(1, 0, "a"),
            put_pending(2, 0, "b"),
            get(3, (10, 20), Some("a")),
            get(3, (30, 40), Some("b")),
            get(4, (10, 20), Some("b")),
            get(4, (30, 40), Some("a")),
        ];
        rejected(&h);
        // Both readers agreeing on one order is fine.
        let h = [
            put_pending(1, 0, "a"),
            put_pending(2, 0, "b"),
            get(3, (10, 20), Some("a")),
            get(3, (30, 40), Some("b")),
            get(4, (10, 20), Some("a")),
            get(4, (30, 40), Some("b")),
        ];
        assert_eq!(check(&h), Ok(()));
    }

    #[test]
    fn read_of_a_value_never_written_is_rejected() {
        let h = [put(1, (0, 10), "a", None), get(2, (0, 30), Some("zzz"))];
        let v = rejected(&h);
        assert!(v.explanation.contains("\"zzz\""), "{}", v.explanation);
        // Also a Put or Cas reporting a previous value that was never there.
        rejected(&[put(1, (0, 10), "a", Some("ghost"))]);
        rejected(&[cas(1, (0, 10), None, "a", false, Some("ghost"))]);
    }

    #[test]
    fn lost_write_is_rejected() {
        let h = [
            put(1, (0, 10), "v1", None),
            put(1, (20, 30), "v2", Some("v1")),
            get(2, (40, 50), Some("v1")),
        ];
        let v = rejected(&h);
        assert!(v.explanation.contains("c2 Get"), "{}", v.explanation);
        // Deleted values must stay deleted, too.
        rejected(&[
            put(1, (0, 10), "v1", None),
            del(1, (20, 30), Some("v1")),
            get(2, (40, 50), Some("v1")),
        ]);
    }

    #[test]
    fn wrong_cas_outcomes_are_rejected() {
        // Cas that claims success although the value differs.
        rejected(&[
            put(1, (0, 10), "a", None),
            cas(2, (20, 30), Some("x"), "b", true, Some("b")),
        ]);
        // Cas that claims failure although the expected value was there.
        rejected(&[
            put(1, (0, 10), "a", None),
            cas(2, (20, 30), Some("a"), "b", false, Some("a")),
        ]);
        // Two successful Cas from the same expected value without anything in between.
        rejected(&[
            put(1, (0, 10), "a", None),
            cas(2, (20, 30), Some("a"), "b", true, Some("b")),
            cas(3, (20, 30), Some("a"), "c", true, Some("c")),
        ]);
    }

    #[test]
    fn concurrent_ops_with_valid_interleavings_pass() {
        let h = [
            put(1, (0, 50), "a", None),
            get(2, (10, 20), None),
            get(3, (10, 20), Some("a")),
            get(2, (30, 40), Some("a")),
            get(2, (60, 70), Some("a")),
            put(3, (25, 80), "b", Some("a")),
            get(4, (26, 90), Some("b")),
            del(1, (55, 95), Some("b")),
            get(4, (96, 99), None),
        ];
        assert_eq!(check(&h), Ok(()));
        // Results force a non-obvious order: the later-invoked write linearizes first.
        let h = [
            put(1, (0, 100), "a", Some("b")),
            put(2, (50, 60), "b", None),
            get(3, (110, 120), Some("a")),
        ];
        assert_eq!(check(&h), Ok(()));
    }

    #[test]
    fn incomplete_ops_may_or_may_not_take_effect() {
        // Took effect.
        assert_eq!(
            check(&[put_pending(1, 0, "a"), get(2, (50, 60), Some("a"))]),
            Ok(())
        );
        // Took effect late: first read misses it, later one sees it.
        assert_eq!(
            check(&[
                put_pending(1, 0, "a"),
                get(2, (50, 60), None),
                get(2, (70, 80), Some("a"))
            ]),
            Ok(())
        );
        // Never took effect.
        assert_eq!(
            check(&[
                put_pending(1, 0, "a"),
                get(2, (50, 60), None),
                get(2, (70, 80), None)
            ]),
            Ok(())
        );
        // An incomplete Delete and Cas.
        let h = [
            put(1, (0, 5), "a", None),
            pending(2, 10, KvOp::Delete { key: b("k") }),
            pending(
                3,
                10,
                KvOp::Cas {
                    key: b("k"),
                    expected: None,
                    new: b("c"),
                },
            ),
            get(4, (20, 30), None),
            get(4, (40, 50), Some("c")),
        ];
        assert_eq!(check(&h), Ok(()));
        // An incomplete read is ignored.
        assert_eq!(
            check(&[
                pending(1, 0, KvOp::Get { key: b("k") }),
                put(2, (1, 2), "a", None)
            ]),
            Ok(())
        );
        // But an incomplete write cannot take effect before it was invoked...
        rejected(&[get(2, (0, 10), Some("a")), put_pending(1, 20, "a")]);
        // ...nor be undone, nor take effect twice.
        rejected(&[
            put_pending(1, 0, "a"),
            get(2, (50, 60), Some("a")),
            get(2, (70, 80), None),
        ]);
        rejected(&[
            put_pending(1, 0, "a"),
            get(2, (10, 20), Some("a")),
            put(2, (30, 40), "b", Some("a")),
            get(2, (50, 60), Some("a")),
        ]);
    }

    #[test]
    fn cas_chains_pass() {
        // Five clients race Cas(i -> i+1) concurrently; results give a chain.
        let mut h = vec![put(0, (0, 1), "0", None)];
        for i in 0..5u64 {
            let (e, n) = (i.to_string(), (i + 1).to_string());
            h.push(cas(i + 1, (10, 100), Some(&e), &n, true, Some(&n)));
        }
        // Losers of a race report the value at their linearization point.
        h.push(cas(9, (10, 100), Some("0"), "x", false, Some("3")));
        h.push(get(9, (110, 120), Some("5")));
        assert_eq!(check(&h), Ok(()));
        // Reversed list order does not matter.
        h.reverse();
        assert_eq!(check(&h), Ok(()));
    }

    #[test]
    fn keys_are_checked_independently() {
        let k = |key: &str, mut o: Operation| {
            match &mut o.op {
                KvOp::Get { key: kk } | KvOp::Put { key: kk, .. } => *kk = b(key),
                _ => unreachable!(),
            }
            o
        };
        let h = [
            k("x", put(1, (0, 10), "1", None)),
            k("y", get(2, (20, 30), None)), // fine: y was never written
            k("x", get(2, (40, 50), Some("1"))),
        ];
        assert_eq!(check(&h), Ok(()));
        let h = [
            k("x", put(1, (0, 10), "1", None)),
            k("y", get(2, (20, 30), Some("1"))), // x's value read on y
        ];
        assert_eq!(rejected(&h).key, b("y"));
    }

    #[test]
    fn unsupported_and_malformed_histories_are_reported() {
        let scan = done(
            1,
            (0, 1),
            KvOp::Scan {
                start: b("a"),
                end: None,
                limit: 5,
            },
            KvResult::Pairs(vec![]),
        );
        let v = check(&[scan]).unwrap_err();
        assert!(v.explanation.contains("Scan"), "{}", v.explanation);
        let mut o = get(1, (0, 1), None);
        o.result = None;
        assert!(check(&[o]).unwrap_err().explanation.contains("malformed"));
        assert!(check(&[get(1, (5, 1), None)])
            .unwrap_err()
            .explanation
            .contains("malformed"));
        let e = done(
            1,
            (0, 1),
            KvOp::Get { key: b("k") },
            KvResult::Error("boom".into()),
        );
        assert!(check(&[e]).unwrap_err().explanation.contains("error"));
        let wrong = done(
            1,
            (0, 1),
            KvOp::Get { key: b("k") },
            KvResult::Written { previous: None },
        );
        assert!(check(&[wrong])
            .unwrap_err()
            .explanation
            .contains("wrong kind"));
    }

    #[test]
    fn budget_exhaustion_is_a_violation() {
        let h = [
            put(1, (0, 10), "a", None),
            get(2, (0, 10), Some("a")),
            get(3, (20, 30), Some("a")),
        ];
        let v = check_with_budget(&h, 2).unwrap_err();
        assert!(
            v.explanation.contains("search budget exhausted"),
            "{}",
            v.explanation
        );
        assert_eq!(check_with_budget(&h, 1000), Ok(()));
    }

    /// splitmix64: a tiny deterministic generator, so the tests need no extra dependencies.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    struct Gen {
        clients: u64,
        ops_per_client: u64,
        keys: u64,
        /// 0: every write a fresh value; otherwise values drawn from a pool of this size.
        value_pool: u64,
        /// Maximum gap between invocation and linearization point, and between that point
        /// and completion: larger means more overlap.
        max_span: u64,
        pending_percent: u64,
    }

    /// Generates a history from a real sequential execution on [`KvService`]: every operation
    /// gets a linearization point inside its interval, and operations are executed in the
    /// order of those points. Incomplete operations take effect or not at random.
    fn generate(rng: &mut Rng, g: &Gen) -> Vec<Operation> {
        let mut planned: Vec<(u64, usize, bool)> = Vec::new(); // (point, op index, takes effect)
        let mut history = Vec::new();
        for c in 0..g.clients {
            let mut t = rng.below(20);
            for i in 0..g.ops_per_client {
                let key = format!("k{}", rng.below(g.keys)).into_bytes();
                let val = |rng: &mut Rng| match g.value_pool {
                    0 => format!("c{c}-{i}").into_bytes(),
                    p => format!("v{}", rng.below(p)).into_bytes(),
                };
                let op = match rng.below(10) {
                    0..=3 => KvOp::Put {
                        key,
                        value: val(rng),
                    },
                    4..=6 => KvOp::Get { key },
                    7 => KvOp::Delete { key },
                    _ => {
                        let expected = match rng.below(3) {
                            0 => None,
                            _ if g.value_pool > 0 => Some(val(rng)),
                            _ => Some(
                                format!("c{}-{}", rng.below(g.clients), rng.below(i + 1))
                                    .into_bytes(),
                            ),
                        };
                        KvOp::Cas {
                            key,
                            expected,
                            new: val(rng),
                        }
                    }
                };
                let point = t + rng.below(g.max_span + 1);
                let complete = point + rng.below(g.max_span + 1);
                let is_pending = rng.chance(g.pending_percent);
                planned.push((point, history.len(), !is_pending || rng.chance(50)));
                history.push(Operation {
                    client: c,
                    invoke_ms: t,
                    complete_ms: (!is_pending).then_some(complete),
                    op,
                    result: None,
                });
                if is_pending {
                    break; // the client is stuck on its pending operation
                }
                t = complete + rng.below(10);
            }
        }
        // Sort by linearization point; ties keep generation order, which is each client's
        // program order.
        planned.sort_by_key(|&(point, i, _)| (point, i));
        let mut svc = KvService::new();
        let mut st = redoubt_core::state::FlatState::new(1 << 20);
        for (seq, &(_, i, effective)) in planned.iter().enumerate() {
            if !effective {
                continue;
            }
            let ctx = ExecContext {
                seq: seq as u64,
                client: history[i].client,
                time_ms: 0,
                batch_seed: 0,
                index: 0,
            };
            let out = svc.execute(&mut st, &history[i].op.encode(), &ctx);
            if history[i].complete_ms.is_some() {
                history[i].result = Some(KvResult::decode(&out).unwrap());
            }
        }
        history
    }

    fn gens() -> Vec<Gen> {
        vec![
            Gen {
                clients: 5,
                ops_per_client: 20,
                keys: 3,
                value_pool: 0,
                max_span: 20,
                pending_percent: 3,
            },
            Gen {
                clients: 5,
                ops_per_client: 20,
                keys: 2,
                value_pool: 3,
                max_span: 20,
                pending_percent: 3,
            },
            Gen {
                clients: 10,
                ops_per_client: 10,
                keys: 1,
                value_pool: 0,
                max_span: 40,
                pending_percent: 5,
            },
            Gen {
                clients: 8,
                ops_per_client: 15,
                keys: 1,
                value_pool: 2,
                max_span: 30,
                pending_percent: 5,
            },
        ]
    }

    #[test]
    fn random_histories_from_sequential_executions_pass() {
        let mut rng = Rng(1);
        for g in gens() {
            for trial in 0..100 {
                let h = generate(&mut rng, &g);
                if let Err(v) = check(&h) {
                    panic!("trial {trial}: valid history rejected: {v:?}\n{h:#?}");
                }
            }
        }
    }

    #[test]
    fn random_histories_with_one_corrupted_read_are_usually_rejected() {
        let mut rng = Rng(2);
        let (mut trials, mut rejections) = (0, 0);
        for g in gens() {
            for _ in 0..100 {
                let mut h = generate(&mut rng, &g);
                let reads: Vec<usize> = (0..h.len())
                    .filter(|&i| matches!(h[i].op, KvOp::Get { .. }) && h[i].result.is_some())
                    .collect();
                if reads.is_empty() {
                    continue;
                }
                let r = reads[rng.below(reads.len() as u64) as usize];
                // Replace the value read by another value written to the same key (or absent).
                let key = h[r].op.key().unwrap().to_vec();
                let mut alternatives: Vec<Option<Vec<u8>>> = vec![None];
                for o in &h {
                    match &o.op {
                        KvOp::Put { key: k, value }
                        | KvOp::Cas {
                            key: k, new: value, ..
                        } if *k == key => alternatives.push(Some(value.clone())),
                        _ => {}
                    }
                }
                let Some(KvResult::Value(old)) = h[r].result.clone() else {
                    unreachable!()
                };
                alternatives.retain(|a| *a != old);
                alternatives.sort();
                alternatives.dedup();
                if alternatives.is_empty() {
                    continue;
                }
                let new = alternatives[rng.below(alternatives.len() as u64) as usize].clone();
                h[r].result = Some(KvResult::Value(new));
                trials += 1;
                match check(&h) {
                    Ok(()) => {}
                    Err(v) => {
                        assert!(!v.explanation.contains("budget"), "{}", v.explanation);
                        assert_eq!(v.key, key);
                        rejections += 1;
                    }
                }
            }
        }
        eprintln!("corrupted reads rejected in {rejections} of {trials} trials");
        assert!(trials >= 300, "only {trials} trials");
        assert!(
            rejections * 2 >= trials,
            "only {rejections} of {trials} corrupted histories rejected"
        );
    }

    #[test]
    fn corrupted_large_histories_are_rejected_quickly() {
        // Rejection is the expensive case: the search must exhaust every configuration.
        let mut rng = Rng(4);
        for (clients, pool, pending_percent) in [(10, 0, 0), (10, 2, 3), (20, 0, 0), (20, 3, 3)] {
            let g = Gen {
                clients,
                ops_per_client: 300 / clients,
                keys: 1,
                value_pool: pool,
                max_span: 80,
                pending_percent,
            };
            for _ in 0..5 {
                let mut h = generate(&mut rng, &g);
                // Corrupt one of the last reads to a value written earlier (or "absent").
                let reads: Vec<usize> = (0..h.len())
                    .filter(|&i| matches!(h[i].op, KvOp::Get { .. }) && h[i].result.is_some())
                    .collect();
                let r = reads[reads.len() - 1 - rng.below(3.min(reads.len() as u64)) as usize];
                let old = h.iter().find_map(|o| match &o.op {
                    KvOp::Put { value, .. }
                        if o.complete_ms.is_some_and(|c| c < h[r].invoke_ms) =>
                    {
                        Some(value.clone())
                    }
                    _ => None,
                });
                let Some(KvResult::Value(actual)) = &h[r].result else {
                    unreachable!()
                };
                let new = if *actual == old { None } else { old };
                h[r].result = Some(KvResult::Value(new));
                let idx: Vec<usize> = (0..h.len()).collect();
                let start = Instant::now();
                let res = check_key(&h, &idx, DEFAULT_STEP_BUDGET);
                let took = start.elapsed();
                eprintln!("{clients} clients, {} ops: {res:.60?} in {took:?}", h.len());
                if let Err(e) = &res {
                    assert!(!e.contains("budget"), "{e}");
                }
                assert!(took < Duration::from_secs(2), "took {took:?}");
            }
        }
    }

    /// Sequential specification written independently of `Model`.
    fn spec(state: &Option<Vec<u8>>, op: &KvOp) -> (KvResult, Option<Vec<u8>>) {
        match op {
            KvOp::Get { .. } => (KvResult::Value(state.clone()), state.clone()),
            KvOp::Put { value, .. } => (
                KvResult::Written {
                    previous: state.clone(),
                },
                Some(value.clone()),
            ),
            KvOp::Delete { .. } => (
                KvResult::Written {
                    previous: state.clone(),
                },
                None,
            ),
            KvOp::Set { value, .. } => (KvResult::Done, Some(value.clone())),
            KvOp::Cas { expected, new, .. } if state == expected => (
                KvResult::Cas {
                    ok: true,
                    current: Some(new.clone()),
                },
                Some(new.clone()),
            ),
            KvOp::Cas { .. } => (
                KvResult::Cas {
                    ok: false,
                    current: state.clone(),
                },
                state.clone(),
            ),
            KvOp::Scan { .. } => unreachable!(),
        }
    }

    /// Exhaustive search over all orders of all subsets containing every completed operation.
    fn brute_force(h: &[Operation], done: &mut Vec<bool>, state: &Option<Vec<u8>>) -> bool {
        if h.iter()
            .zip(done.iter())
            .all(|(o, &d)| d || o.complete_ms.is_none())
        {
            return true;
        }
        for i in 0..h.len() {
            if done[i] {
                continue;
            }
            // Every operation that completed before `i` was invoked must already be done.
            let ready = (0..h.len())
                .all(|j| done[j] || !matches!(h[j].complete_ms, Some(c) if c < h[i].invoke_ms));
            if !ready {
                continue;
            }
            let (out, next) = spec(state, &h[i].op);
            if h[i].result.as_ref().is_some_and(|r| *r != out) {
                continue;
            }
            done[i] = true;
            let ok = brute_force(h, done, &next);
            done[i] = false;
            if ok {
                return true;
            }
        }
        false
    }

    #[test]
    fn agrees_with_brute_force_on_small_histories() {
        let mut rng = Rng(5);
        let (mut accepted, mut rejected) = (0, 0);
        for trial in 0..3000 {
            let g = Gen {
                clients: 2 + rng.below(3),
                ops_per_client: 1 + rng.below(3),
                keys: 1,
                value_pool: rng.below(3),
                max_span: 5 + rng.below(20),
                pending_percent: 15,
            };
            let mut h = generate(&mut rng, &g);
            h.truncate(7);
            // Corrupt one result in most trials, with a random result of the right kind.
            let completed: Vec<usize> = (0..h.len()).filter(|&i| h[i].result.is_some()).collect();
            if !completed.is_empty() && rng.chance(70) {
                let i = completed[rng.below(completed.len() as u64) as usize];
                let val = |rng: &mut Rng| match rng.below(4) {
                    0 => None,
                    x => Some(format!("v{x}").into_bytes()),
                };
                h[i].result = Some(match h[i].op {
                    KvOp::Get { .. } => KvResult::Value(val(&mut rng)),
                    KvOp::Put { .. } | KvOp::Delete { .. } => KvResult::Written {
                        previous: val(&mut rng),
                    },
                    _ => KvResult::Cas {
                        ok: rng.chance(50),
                        current: val(&mut rng),
                    },
                });
            }
            let expected = brute_force(&h, &mut vec![false; h.len()], &None);
            let got = check(&h);
            assert_eq!(
                got.is_ok(),
                expected,
                "trial {trial}: checker says {got:?}\n{h:#?}"
            );
            if expected {
                accepted += 1;
            } else {
                rejected += 1;
            }
        }
        eprintln!("brute force: {accepted} linearizable, {rejected} not");
        assert!(accepted > 500 && rejected > 500, "{accepted} / {rejected}");
    }

    #[test]
    fn three_hundred_ops_ten_clients_single_key_is_fast() {
        let mut rng = Rng(3);
        let gens = [
            Gen {
                clients: 10,
                ops_per_client: 30,
                keys: 1,
                value_pool: 0,
                max_span: 50,
                pending_percent: 0,
            },
            Gen {
                clients: 10,
                ops_per_client: 30,
                keys: 1,
                value_pool: 3,
                max_span: 50,
                pending_percent: 0,
            },
            Gen {
                clients: 10,
                ops_per_client: 30,
                keys: 1,
                value_pool: 0,
                max_span: 50,
                pending_percent: 2,
            },
        ];
        for g in gens {
            for _ in 0..5 {
                let h = generate(&mut rng, &g);
                let completed = h.iter().filter(|o| o.complete_ms.is_some()).count();
                assert!(h.len() >= 10 * 30 / 2, "{} ops", h.len());
                let start = Instant::now();
                let idx: Vec<usize> = (0..h.len()).collect();
                let steps =
                    check_key(&h, &idx, DEFAULT_STEP_BUDGET).unwrap_or_else(|e| panic!("{e}"));
                let took = start.elapsed();
                eprintln!(
                    "{} ops ({completed} completed): {steps} steps in {took:?}",
                    h.len()
                );
                assert!(steps < DEFAULT_STEP_BUDGET / 50, "{steps} steps");
                assert!(took < Duration::from_secs(2), "took {took:?}");
            }
        }
    }
}
