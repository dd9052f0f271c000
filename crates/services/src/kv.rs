//! A replicated key-value store over byte strings.
//!
//! Operations ([`KvOp`]) and results ([`KvResult`]) travel as canonical postcard encodings.
//! [`KvService`] keeps every pair in the replicated, paged state through [`crate::pagedkv`], so
//! checkpoints, digests and state transfer cover it page by page, and a state larger than RAM
//! works (only keys and free space are indexed in memory).
//!
//! Its client, `redoubt_client::kv::KvClient`, is in the client library.

use crate::pagedkv::{PagedKv, PagedKvError};
use redoubt_core::{ExecContext, Service};
use redoubt_state::{StateRead, StateWrite};
use serde::{Deserialize, Serialize};

/// Default maximum key length in bytes.
pub const DEFAULT_MAX_KEY_BYTES: usize = 1024;
/// Default maximum value length in bytes.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 64 * 1024;
/// Default maximum `limit` of a [`KvOp::Scan`].
pub const DEFAULT_MAX_SCAN: u32 = 1000;

/// An operation on the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvOp {
    Get {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    Put {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    Delete {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// Sets `key` to `value` without returning the previous value (a blind write).
    Set {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// Sets `key` to `new` iff its current value equals `expected` (None = absent).
    Cas {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        expected: Option<Vec<u8>>,
        #[serde(with = "serde_bytes")]
        new: Vec<u8>,
    },
    /// Keys in [start, end) (end None = unbounded), at most `limit` pairs, ascending.
    Scan {
        #[serde(with = "serde_bytes")]
        start: Vec<u8>,
        #[serde(with = "serde_bytes")]
        end: Option<Vec<u8>>,
        limit: u32,
    },
}

/// The result of an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvResult {
    /// Result of a Get: the current value, if any.
    Value(#[serde(with = "serde_bytes")] Option<Vec<u8>>),
    /// Result of a Put or Delete: the value before the operation.
    Written {
        #[serde(with = "serde_bytes")]
        previous: Option<Vec<u8>>,
    },
    /// Result of a Cas: whether it applied, and the value after the operation.
    Cas {
        ok: bool,
        #[serde(with = "serde_bytes")]
        current: Option<Vec<u8>>,
    },
    /// Result of a Scan: key-value pairs in ascending key order.
    Pairs(#[serde(with = "pairs")] Vec<(Vec<u8>, Vec<u8>)>),
    /// The operation was undecodable or exceeded a limit; the state is unchanged.
    Error(String),
    /// Result of a Set: done.
    Done,
}

/// Errors of decoding and of limit checks.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("malformed encoding: {0}")]
    Malformed(#[from] postcard::Error),
    #[error("{0} trailing bytes after the encoding")]
    TrailingBytes(usize),
    #[error("key of {len} bytes exceeds the limit of {max}")]
    KeyTooLarge { len: usize, max: usize },
    #[error("value of {len} bytes exceeds the limit of {max}")]
    ValueTooLarge { len: usize, max: usize },
    #[error("scan limit {limit} exceeds the maximum of {max}")]
    ScanTooLarge { limit: u32, max: u32 },
}

/// Serde helper: a list of byte-string pairs, each byte string encoded as bytes.
mod pairs {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    pub fn serialize<S: Serializer>(v: &[(Vec<u8>, Vec<u8>)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(k, v)| (Bytes::new(k), Bytes::new(v))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Pairs, D::Error> {
        let v = Vec::<(ByteBuf, ByteBuf)>::deserialize(d)?;
        Ok(v.into_iter()
            .map(|(k, v)| (k.into_vec(), v.into_vec()))
            .collect())
    }
}

/// Decodes exactly one postcard value from `b`, rejecting trailing bytes.
fn decode_exact<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, KvError> {
    let (v, rest) = postcard::take_from_bytes(b)?;
    if !rest.is_empty() {
        return Err(KvError::TrailingBytes(rest.len()));
    }
    Ok(v)
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing these types into a growable vector cannot fail.
    postcard::to_stdvec(v).expect("postcard encoding into a Vec is infallible")
}

impl KvOp {
    /// Canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Decodes an operation; trailing bytes are an error.
    pub fn decode(b: &[u8]) -> Result<KvOp, KvError> {
        decode_exact(b)
    }

    /// True for operations that never modify state (Get and Scan).
    pub fn is_read_only(&self) -> bool {
        matches!(self, KvOp::Get { .. } | KvOp::Scan { .. })
    }

    /// The single key this operation touches, or `None` for a Scan.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            KvOp::Get { key }
            | KvOp::Put { key, .. }
            | KvOp::Set { key, .. }
            | KvOp::Delete { key }
            | KvOp::Cas { key, .. } => Some(key),
            KvOp::Scan { .. } => None,
        }
    }
}

impl KvResult {
    /// Canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Decodes a result; trailing bytes are an error.
    pub fn decode(b: &[u8]) -> Result<KvResult, KvError> {
        decode_exact(b)
    }
}

/// The key-value state machine. Every pair lives in the replicated state (see
/// [`crate::pagedkv`]); the service itself keeps only the in-memory index derived from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvService {
    /// `None` until [`Service::load`] (or the first execution) reads the state.
    index: Option<PagedKv>,
    max_key_bytes: usize,
    max_value_bytes: usize,
    max_scan: u32,
}

impl Default for KvService {
    fn default() -> Self {
        Self::new()
    }
}

impl KvService {
    /// A store with the default limits (1 KiB keys, 64 KiB values, scans of 1000).
    pub fn new() -> Self {
        Self::with_limits(
            DEFAULT_MAX_KEY_BYTES,
            DEFAULT_MAX_VALUE_BYTES,
            DEFAULT_MAX_SCAN,
        )
    }

    /// A store with the given limits. All replicas must use the same limits.
    pub fn with_limits(max_key_bytes: usize, max_value_bytes: usize, max_scan: u32) -> Self {
        KvService {
            index: None,
            max_key_bytes,
            max_value_bytes,
            max_scan,
        }
    }

    /// Number of keys stored (0 before the state is loaded).
    pub fn len(&self) -> usize {
        self.index.as_ref().map_or(0, |i| i.len())
    }

    /// True if no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the state used by records and free, once loaded.
    pub fn usage(&self) -> Option<(u64, u64)> {
        self.index
            .as_ref()
            .map(|i| (i.used_bytes(), i.free_bytes()))
    }

    /// The value stored under `key`.
    pub fn get(&self, state: &dyn StateRead, key: &[u8]) -> Option<Vec<u8>> {
        self.index.as_ref()?.get(state, key)
    }

    fn check_key(&self, key: &[u8]) -> Result<(), KvError> {
        if key.len() > self.max_key_bytes {
            return Err(KvError::KeyTooLarge {
                len: key.len(),
                max: self.max_key_bytes,
            });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<(), KvError> {
        if value.len() > self.max_value_bytes {
            return Err(KvError::ValueTooLarge {
                len: value.len(),
                max: self.max_value_bytes,
            });
        }
        Ok(())
    }

    /// Checks the limits of `op`. Depends only on `op`, never on the state.
    fn check_limits(&self, op: &KvOp) -> Result<(), KvError> {
        match op {
            KvOp::Get { key } | KvOp::Delete { key } => self.check_key(key),
            KvOp::Put { key, value } | KvOp::Set { key, value } => {
                self.check_key(key)?;
                self.check_value(value)
            }
            KvOp::Cas { key, expected, new } => {
                self.check_key(key)?;
                if let Some(e) = expected {
                    self.check_value(e)?;
                }
                self.check_value(new)
            }
            KvOp::Scan { start, end, limit } => {
                self.check_key(start)?;
                if let Some(e) = end {
                    self.check_key(e)?;
                }
                if *limit > self.max_scan {
                    return Err(KvError::ScanTooLarge {
                        limit: *limit,
                        max: self.max_scan,
                    });
                }
                Ok(())
            }
        }
    }

    fn ensure_loaded(&mut self, state: &dyn StateRead) -> Result<&mut PagedKv, String> {
        if self.index.is_none() {
            self.index = Some(PagedKv::load(state)?);
        }
        Ok(self.index.as_mut().expect("loaded"))
    }

    /// Applies a decoded operation.
    fn apply(&mut self, state: &mut dyn StateWrite, op: KvOp) -> KvResult {
        if let Err(e) = self.check_limits(&op) {
            return KvResult::Error(e.to_string());
        }
        let index = match self.ensure_loaded(state) {
            Ok(i) => i,
            Err(e) => return KvResult::Error(format!("state does not load: {e}")),
        };
        let full = |e: PagedKvError| KvResult::Error(e.to_string());
        match op {
            KvOp::Get { key } => KvResult::Value(index.get(state, &key)),
            KvOp::Put { key, value } => match index.put(state, &key, &value) {
                Ok(previous) => KvResult::Written { previous },
                Err(e) => full(e),
            },
            KvOp::Delete { key } => KvResult::Written {
                previous: index.delete(state, &key),
            },
            KvOp::Set { key, value } => match index.put(state, &key, &value) {
                Ok(_) => KvResult::Done,
                Err(e) => full(e),
            },
            KvOp::Cas { key, expected, new } => {
                let current = index.get(state, &key);
                if current == expected {
                    match index.put(state, &key, &new) {
                        Ok(_) => KvResult::Cas {
                            ok: true,
                            current: Some(new),
                        },
                        Err(e) => full(e),
                    }
                } else {
                    KvResult::Cas { ok: false, current }
                }
            }
            KvOp::Scan { start, end, limit } => {
                KvResult::Pairs(index.scan(state, &start, end.as_deref(), limit as usize))
            }
        }
    }

    /// Executes a read-only operation; `None` if `op` is not read-only.
    fn read(&self, state: &dyn StateRead, op: &KvOp) -> Option<KvResult> {
        if !op.is_read_only() {
            return None;
        }
        if let Err(e) = self.check_limits(op) {
            return Some(KvResult::Error(e.to_string()));
        }
        let loaded;
        let index = match &self.index {
            Some(i) => i,
            None => match PagedKv::load(state) {
                Ok(i) => {
                    loaded = i;
                    &loaded
                }
                Err(e) => return Some(KvResult::Error(format!("state does not load: {e}"))),
            },
        };
        Some(match op {
            KvOp::Get { key } => KvResult::Value(index.get(state, key)),
            KvOp::Scan { start, end, limit } => {
                KvResult::Pairs(index.scan(state, start, end.as_deref(), *limit as usize))
            }
            _ => unreachable!("checked read-only above"),
        })
    }
}

impl Service for KvService {
    fn execute(&mut self, state: &mut dyn StateWrite, op: &[u8], _ctx: &ExecContext) -> Vec<u8> {
        let result = match KvOp::decode(op) {
            Ok(op) => self.apply(state, op),
            Err(e) => KvResult::Error(e.to_string()),
        };
        result.encode()
    }

    fn execute_read_only(&self, state: &dyn StateRead, op: &[u8]) -> Option<Vec<u8>> {
        let op = KvOp::decode(op).ok()?;
        self.read(state, &op).map(|r| r.encode())
    }

    fn load(&mut self, state: &dyn StateRead) -> Result<(), String> {
        self.index = Some(PagedKv::load(state)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(seq: u64) -> ExecContext {
        ExecContext {
            seq,
            client: 1,
            time_ms: seq,
            batch_seed: seq,
            index: 0,
        }
    }

    fn b(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    /// A service with its state, for tests.
    struct Kv {
        svc: KvService,
        st: redoubt_state::FlatState,
    }

    impl Kv {
        fn new() -> Kv {
            Kv::with(KvService::new())
        }

        fn with(svc: KvService) -> Kv {
            Kv {
                svc,
                st: redoubt_state::FlatState::new(64 << 10),
            }
        }

        fn execute(&mut self, op: &[u8], c: &ExecContext) -> Vec<u8> {
            self.svc.execute(&mut self.st, op, c)
        }

        fn execute_read_only(&self, op: &[u8]) -> Option<Vec<u8>> {
            self.svc.execute_read_only(&self.st, op)
        }

        fn snapshot(&self) -> Vec<u8> {
            self.st.bytes().to_vec()
        }

        fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
            self.svc.get(&self.st, key)
        }

        fn is_empty(&self) -> bool {
            self.svc.is_empty()
        }

        fn len(&self) -> usize {
            self.svc.len()
        }
    }

    fn run(s: &mut Kv, op: KvOp) -> KvResult {
        KvResult::decode(&s.execute(&op.encode(), &ctx(1))).expect("result decodes")
    }

    fn put(k: &str, v: &str) -> KvOp {
        KvOp::Put {
            key: b(k),
            value: b(v),
        }
    }

    fn get(k: &str) -> KvOp {
        KvOp::Get { key: b(k) }
    }

    #[test]
    fn get_put_delete() {
        let mut s = Kv::new();
        assert!(s.is_empty());
        assert_eq!(run(&mut s, get("a")), KvResult::Value(None));
        assert_eq!(
            run(&mut s, put("a", "1")),
            KvResult::Written { previous: None }
        );
        assert_eq!(run(&mut s, get("a")), KvResult::Value(Some(b("1"))));
        assert_eq!(
            run(&mut s, put("a", "2")),
            KvResult::Written {
                previous: Some(b("1"))
            }
        );
        assert_eq!(s.get(b"a"), Some(b("2")));
        assert_eq!(s.len(), 1);
        assert_eq!(
            run(&mut s, KvOp::Delete { key: b("a") }),
            KvResult::Written {
                previous: Some(b("2"))
            }
        );
        assert_eq!(
            run(&mut s, KvOp::Delete { key: b("a") }),
            KvResult::Written { previous: None }
        );
        assert_eq!(run(&mut s, get("a")), KvResult::Value(None));
        assert!(s.is_empty());
        // Empty keys and values are legal.
        assert_eq!(
            run(&mut s, put("", "")),
            KvResult::Written { previous: None }
        );
        assert_eq!(run(&mut s, get("")), KvResult::Value(Some(Vec::new())));
    }

    #[test]
    fn cas_success_and_failure() {
        let mut s = Kv::new();
        let cas = |e: Option<&str>, n: &str| KvOp::Cas {
            key: b("k"),
            expected: e.map(b),
            new: b(n),
        };
        // Absent key: expected None succeeds, expected Some fails.
        assert_eq!(
            run(&mut s, cas(Some("x"), "1")),
            KvResult::Cas {
                ok: false,
                current: None
            }
        );
        assert_eq!(s.get(b"k"), None);
        assert_eq!(
            run(&mut s, cas(None, "1")),
            KvResult::Cas {
                ok: true,
                current: Some(b("1"))
            }
        );
        assert_eq!(
            run(&mut s, cas(None, "2")),
            KvResult::Cas {
                ok: false,
                current: Some(b("1"))
            }
        );
        assert_eq!(
            run(&mut s, cas(Some("0"), "2")),
            KvResult::Cas {
                ok: false,
                current: Some(b("1"))
            }
        );
        assert_eq!(s.get(b"k"), Some(b("1")));
        assert_eq!(
            run(&mut s, cas(Some("1"), "2")),
            KvResult::Cas {
                ok: true,
                current: Some(b("2"))
            }
        );
        assert_eq!(run(&mut s, get("k")), KvResult::Value(Some(b("2"))));
    }

    #[test]
    fn scan_bounds_and_limit() {
        let mut s = Kv::new();
        for k in ["a", "b", "c", "d", "e"] {
            run(&mut s, put(k, &k.to_uppercase()));
        }
        let scan = |st: &str, end: Option<&str>, limit: u32| KvOp::Scan {
            start: b(st),
            end: end.map(b),
            limit,
        };
        let keys = |r: KvResult| match r {
            KvResult::Pairs(p) => p
                .into_iter()
                .map(|(k, _)| String::from_utf8(k).unwrap())
                .collect::<Vec<_>>(),
            other => panic!("not pairs: {other:?}"),
        };
        assert_eq!(keys(run(&mut s, scan("b", Some("d"), 10))), ["b", "c"]);
        assert_eq!(
            keys(run(&mut s, scan("", None, 10))),
            ["a", "b", "c", "d", "e"]
        );
        assert_eq!(keys(run(&mut s, scan("bb", None, 2))), ["c", "d"]);
        assert_eq!(keys(run(&mut s, scan("a", None, 0))), Vec::<String>::new());
        assert_eq!(
            keys(run(&mut s, scan("c", Some("c"), 10))),
            Vec::<String>::new()
        );
        assert_eq!(
            keys(run(&mut s, scan("d", Some("b"), 10))),
            Vec::<String>::new()
        );
        assert_eq!(keys(run(&mut s, scan("f", None, 10))), Vec::<String>::new());
        assert_eq!(
            run(&mut s, scan("a", Some("b"), 5)),
            KvResult::Pairs(vec![(b("a"), b("A"))]),
            "values are returned too"
        );
        assert!(matches!(
            run(&mut s, scan("a", None, DEFAULT_MAX_SCAN + 1)),
            KvResult::Error(_)
        ));
        assert_eq!(
            keys(run(&mut s, scan("a", None, DEFAULT_MAX_SCAN))).len(),
            5
        );
    }

    #[test]
    fn limits() {
        let mut s = Kv::with(KvService::with_limits(4, 8, 3));
        assert!(matches!(run(&mut s, put("12345", "v")), KvResult::Error(_)));
        assert!(matches!(
            run(&mut s, put("k", "123456789")),
            KvResult::Error(_)
        ));
        assert!(matches!(run(&mut s, get("12345")), KvResult::Error(_)));
        assert!(matches!(
            run(
                &mut s,
                KvOp::Cas {
                    key: b("k"),
                    expected: None,
                    new: b("123456789")
                }
            ),
            KvResult::Error(_)
        ));
        assert!(matches!(
            run(
                &mut s,
                KvOp::Scan {
                    start: b(""),
                    end: None,
                    limit: 4
                }
            ),
            KvResult::Error(_)
        ));
        assert!(s.is_empty(), "rejected operations do not change state");
        assert_eq!(
            run(&mut s, put("1234", "12345678")),
            KvResult::Written { previous: None }
        );
        assert!(matches!(
            run(
                &mut s,
                KvOp::Scan {
                    start: b(""),
                    end: None,
                    limit: 3
                }
            ),
            KvResult::Pairs(_)
        ));
    }

    #[test]
    fn read_only_execution() {
        let mut s = Kv::new();
        run(&mut s, put("a", "1"));
        let before = s.snapshot();
        let r = s
            .execute_read_only(&get("a").encode())
            .expect("Get is read-only");
        assert_eq!(KvResult::decode(&r).unwrap(), KvResult::Value(Some(b("1"))));
        let r = s
            .execute_read_only(
                &KvOp::Scan {
                    start: b(""),
                    end: None,
                    limit: 9,
                }
                .encode(),
            )
            .unwrap();
        assert_eq!(
            KvResult::decode(&r).unwrap(),
            KvResult::Pairs(vec![(b("a"), b("1"))])
        );
        assert_eq!(s.execute_read_only(&put("a", "2").encode()), None);
        assert_eq!(
            s.execute_read_only(&KvOp::Delete { key: b("a") }.encode()),
            None
        );
        assert_eq!(
            s.execute_read_only(
                &KvOp::Cas {
                    key: b("a"),
                    expected: None,
                    new: b("x")
                }
                .encode()
            ),
            None
        );
        assert_eq!(s.execute_read_only(b"\xff\xff\xff"), None);
        assert_eq!(s.snapshot(), before);
        assert!(get("a").is_read_only() && !put("a", "1").is_read_only());
        assert_eq!(get("a").key(), Some(&b"a"[..]));
        assert_eq!(
            KvOp::Scan {
                start: b("a"),
                end: None,
                limit: 1
            }
            .key(),
            None
        );
    }

    #[test]
    fn encoding_roundtrip() {
        let ops = [
            get("k"),
            put("k", "v"),
            KvOp::Delete { key: b("k") },
            KvOp::Cas {
                key: b("k"),
                expected: None,
                new: b("n"),
            },
            KvOp::Cas {
                key: b("k"),
                expected: Some(b("e")),
                new: b("n"),
            },
            KvOp::Scan {
                start: b("a"),
                end: Some(b("z")),
                limit: 7,
            },
            KvOp::Scan {
                start: b("a"),
                end: None,
                limit: 0,
            },
        ];
        for op in ops {
            assert_eq!(KvOp::decode(&op.encode()).unwrap(), op);
        }
        let results = [
            KvResult::Value(None),
            KvResult::Value(Some(b("v"))),
            KvResult::Written {
                previous: Some(b("p")),
            },
            KvResult::Cas {
                ok: true,
                current: Some(b("c")),
            },
            KvResult::Pairs(vec![(b("a"), b("1")), (b("b"), Vec::new())]),
            KvResult::Error("e".into()),
        ];
        for r in results {
            assert_eq!(KvResult::decode(&r.encode()).unwrap(), r);
        }
        // Bytes are encoded compactly (length prefix + raw bytes).
        assert_eq!(put("ab", "c").encode(), vec![1, 2, b'a', b'b', 1, b'c']);
        // Trailing bytes are rejected.
        let mut e = get("k").encode();
        e.push(0);
        assert!(matches!(KvOp::decode(&e), Err(KvError::TrailingBytes(1))));
    }

    #[test]
    fn garbage_op_yields_error() {
        let mut s = Kv::new();
        run(&mut s, put("a", "1"));
        let before = s.snapshot();
        let garbage: [&[u8]; 6] = [
            b"",
            b"\x09",
            b"\x01\xff\xff\xff\xff\xff",
            b"\x00\x05ab",
            b"\x02",
            &[0xff; 64],
        ];
        for g in garbage {
            let r = KvResult::decode(&s.execute(g, &ctx(2))).expect("always a decodable result");
            assert!(matches!(r, KvResult::Error(_)), "{g:?} gave {r:?}");
        }
        assert_eq!(s.snapshot(), before);
    }

    #[test]
    fn reload_from_state() {
        let mut s = Kv::new();
        for i in 0..50u32 {
            run(
                &mut s,
                KvOp::Put {
                    key: i.to_be_bytes().to_vec(),
                    value: vec![i as u8; i as usize],
                },
            );
        }
        run(
            &mut s,
            KvOp::Delete {
                key: 7u32.to_be_bytes().to_vec(),
            },
        );
        // A fresh service loaded from the same bytes is the same service.
        let mut t = KvService::new();
        t.load(&s.st).unwrap();
        assert_eq!(t, s.svc);
        assert_eq!(t.len(), 49);
        assert_eq!(t.get(&s.st, &8u32.to_be_bytes()), Some(vec![8; 8]));
        // The all-zero state is the empty store.
        let mut e = KvService::new();
        e.load(&redoubt_state::FlatState::new(4096)).unwrap();
        assert!(e.is_empty());
    }

    #[test]
    fn execution_is_deterministic() {
        let ops: Vec<KvOp> = (0..200u32)
            .map(|i| {
                let k = format!("k{}", (i * 7919) % 23);
                match i % 4 {
                    0 | 1 => put(&k, &format!("v{i}")),
                    2 => KvOp::Delete { key: b(&k) },
                    _ => KvOp::Cas {
                        key: b(&k),
                        expected: None,
                        new: b(&format!("c{i}")),
                    },
                }
            })
            .collect();
        let mut a = Kv::new();
        let mut bb = Kv::new();
        for (i, op) in ops.iter().enumerate() {
            let ra = a.execute(&op.encode(), &ctx(i as u64));
            // Different contexts must not matter.
            let rb = bb.execute(&op.encode(), &ctx(1000 + 2 * i as u64));
            assert_eq!(ra, rb);
        }
        assert_eq!(a.snapshot(), bb.snapshot());
        run(&mut bb, put("x", "3"));
        assert_ne!(a.snapshot(), bb.snapshot());
    }

    #[test]
    fn full_store_and_garbage_state_give_errors() {
        let mut s = Kv::with(KvService::new());
        s.st = redoubt_state::FlatState::new(4096);
        let big = KvOp::Put {
            key: b("k"),
            value: vec![1; 8000],
        };
        assert!(matches!(run(&mut s, big), KvResult::Error(_)));
        assert!(s.is_empty());
        // Bytes that are not a store: loading fails, execution answers with an error result.
        let mut g = Kv::new();
        for (i, b) in b"garbage garbage garbage".iter().enumerate() {
            redoubt_state::StateWrite::write(&mut g.st, i as u64, &[*b]);
        }
        assert!(KvService::new().load(&g.st).is_err());
        assert!(matches!(run(&mut g, get("a")), KvResult::Error(_)));
    }
}
