//! A replicated SQL database: SQLite whose database file lives in the replicated, paged state.
//!
//! [`SqlService`] runs SQLite (bundled, so every replica runs the same version) over a VFS
//! that lays the database file over the state the library gives the service ([`vfs`]):
//! checkpoints, incremental digests, page-level state transfer, corruption repair and
//! proactive recovery work for it unchanged. Each ordered [`SqlOp::Write`] is one transaction,
//! executed in sequence order.
//!
//! Determinism: a statement sees the operation's agreed time as `'now'`, SQLite's random
//! generator is seeded from the operation's agreed seed (so `random()`, `randomblob()` and
//! random row ids agree), every statement is bounded by [`STEPS_MAX`] virtual-machine steps
//! (an endless query stops at the same step on every replica), and what could carry
//! per-connection or per-machine state is refused with a clear error: `ATTACH`, `PRAGMA`
//! (except reading the schema), temporary objects, transaction control inside an operation,
//! `VACUUM`, extensions, `total_changes()`.
//!
//! Reads take the read-only path: [`SqlOp::Read`] runs in a transaction that is always rolled
//! back, its writes (if any) going to an overlay that is dropped, so the state is never
//! modified. Interactive transactions run optimistically on that path and commit as one
//! [`SqlOp::Write`] that checks every statement still returns what its client saw
//! ([`Transaction`]).

mod dump;
mod engine;
mod op;
mod vfs;

pub use dump::dump;
pub use engine::Engine;
pub(crate) use op::{decode_exact, encode};
pub use op::{
    leading_keyword, looks_read_only, Column, DecodeError, SqlError, SqlErrorKind, SqlOp, SqlReply,
    Statement, StmtResult, Value,
};
pub use vfs::DB_BASE;

use redoubt_core::{ExecContext, Service};
use redoubt_state::{StateRead, StateWrite};
use rusqlite::{ffi, Connection, OpenFlags};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// The most virtual-machine steps one operation may take (all its statements together).
pub const STEPS_MAX: u64 = 20_000_000;
/// The most bytes of results one operation may return.
pub const RESULT_BYTES_MAX: usize = 1 << 20;
/// The most statements one operation may carry.
pub const STATEMENTS_MAX: usize = 1024;
/// SQLite's page cache per replica (KiB).
const CACHE_KIB: i64 = 16 * 1024;
/// The progress handler runs every this many steps.
const STEP_GRAIN: i32 = 1000;

/// PRAGMAs a statement may use: they read the schema and change nothing.
const PRAGMAS_ALLOWED: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
];

/// SQLite's random generator is process-wide: operations take turns (one replica per
/// process in production; the simulator and tests host several).
static SQLITE_TURN: Mutex<()> = Mutex::new(());

/// The replicated SQL service (see the module documentation).
pub struct SqlService {
    engine: Engine,
}

/// The connection and what its hooks read.
struct Db {
    conn: Connection,
    /// Set while the service itself runs transaction control.
    internal: Arc<AtomicBool>,
    /// Steps left to the running operation.
    steps: Arc<AtomicU64>,
    /// Set when the progress handler stopped a statement.
    stopped: Arc<AtomicBool>,
}

impl Default for SqlService {
    fn default() -> Self {
        SqlService::new()
    }
}

impl SqlService {
    pub fn new() -> Self {
        SqlService {
            engine: Engine::new(),
        }
    }
}

impl Db {
    /// Opens the connection; a backing must be in place (the pragmas read the header).
    fn open() -> Result<Db, String> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_EXRESCODE;
        let mut conn = Connection::open_with_flags_and_vfs(vfs::DB_NAME, flags, vfs::VFS_NAME)
            .map_err(|e| format!("opening the SQL database: {e}"))?;
        let internal = Arc::new(AtomicBool::new(true));
        let steps = Arc::new(AtomicU64::new(STEPS_MAX));
        let stopped = Arc::new(AtomicBool::new(false));
        {
            let (steps, stopped) = (steps.clone(), stopped.clone());
            conn.progress_handler(
                STEP_GRAIN,
                Some(move || {
                    let left = steps.load(Relaxed);
                    if left < STEP_GRAIN as u64 {
                        stopped.store(true, Relaxed);
                        return true;
                    }
                    steps.store(left - STEP_GRAIN as u64, Relaxed);
                    false
                }),
            )
            .map_err(|e| format!("installing the step limit: {e}"))?;
        }
        let allow = internal.clone();
        conn.authorizer(Some(move |ctx: rusqlite::hooks::AuthContext<'_>| {
            authorize(&ctx.action, allow.load(Relaxed))
        }))
        .map_err(|e| format!("installing the authorizer: {e}"))?;
        conn.execute_batch(
            "PRAGMA journal_mode=MEMORY; PRAGMA synchronous=OFF; PRAGMA temp_store=MEMORY; \
             PRAGMA foreign_keys=ON; PRAGMA recursive_triggers=OFF;",
        )
        .map_err(|e| format!("setting up the SQL connection: {e}"))?;
        conn.pragma_update(None, "cache_size", -CACHE_KIB)
            .map_err(|e| format!("setting up the SQL connection: {e}"))?;
        internal.store(false, Relaxed);
        Ok(Db {
            conn,
            internal,
            steps,
            stopped,
        })
    }

    fn control(&self, sql: &str) -> rusqlite::Result<()> {
        self.internal.store(true, Relaxed);
        let r = self.conn.execute_batch(sql);
        self.internal.store(false, Relaxed);
        r
    }

    /// Prepares the operation's run: a fresh step budget, a seeded generator and no stale
    /// per-connection values.
    fn start(&self, seed: u64) {
        self.steps.store(STEPS_MAX, Relaxed);
        self.stopped.store(false, Relaxed);
        let x = (seed as u32 | 1) as std::ffi::c_int;
        // SAFETY: the connection handle is valid; PRNG_SEED takes an int and a (null)
        // connection pointer; the caller holds SQLITE_TURN.
        unsafe {
            ffi::sqlite3_test_control(
                ffi::SQLITE_TESTCTRL_PRNG_SEED,
                x,
                std::ptr::null_mut::<ffi::sqlite3>(),
            );
            ffi::sqlite3_set_last_insert_rowid(self.conn.handle(), 0);
        }
    }

    /// Runs `stmts` inside an open transaction, checking expectations; returns the results or
    /// the reply that ends the operation.
    fn run_all(
        &self,
        stmts: &[Statement],
        expect: &[Option<[u8; 32]>],
        first_index: usize,
        only_reads: bool,
        budget: &mut usize,
    ) -> Result<Vec<StmtResult>, SqlReply> {
        let mut out = Vec::with_capacity(stmts.len());
        for (i, st) in stmts.iter().enumerate() {
            let index = (first_index + i) as u32;
            let r = self.run_one(st, only_reads, budget).map_err(|e| match e {
                RunError::NotReadOnly => SqlReply::NotReadOnly,
                RunError::Sql(error) => SqlReply::Failed { index, error },
            })?;
            if let Some(Some(want)) = expect.get(i) {
                if r.digest() != *want {
                    return Err(SqlReply::Conflict { index });
                }
            }
            out.push(r);
        }
        Ok(out)
    }

    fn run_one(
        &self,
        st: &Statement,
        only_reads: bool,
        budget: &mut usize,
    ) -> Result<StmtResult, RunError> {
        let verb = leading_keyword(&st.sql);
        if let Some(why) = refused_verb(&verb) {
            return Err(RunError::Sql(SqlError {
                kind: SqlErrorKind::NotSupported,
                message: why,
            }));
        }
        let mut stmt = self
            .prepare(&st.sql)
            .map_err(|e| RunError::Sql(self.error(e)))?;
        if only_reads && !stmt.readonly() {
            return Err(RunError::NotReadOnly);
        }
        bind(&mut stmt, &st.params).map_err(RunError::Sql)?;
        let columns = columns_of(&stmt);
        let n = columns.len();
        let mut rows = Vec::new();
        {
            let mut raw = stmt.raw_query();
            loop {
                match raw.next() {
                    Ok(Some(row)) => {
                        let mut vals = Vec::with_capacity(n);
                        for c in 0..n {
                            let v = value_of(row.get_ref_unwrap(c));
                            *budget = budget.saturating_sub(value_bytes(&v));
                            vals.push(v);
                        }
                        if *budget == 0 {
                            return Err(RunError::Sql(SqlError {
                                kind: SqlErrorKind::ResultTooLarge,
                                message: format!(
                                    "the results exceed {RESULT_BYTES_MAX} bytes, the most one \
                                     operation may return: add a LIMIT or select fewer columns"
                                ),
                            }));
                        }
                        rows.push(vals);
                    }
                    Ok(None) => break,
                    Err(e) => return Err(RunError::Sql(self.error(e))),
                }
            }
        }
        let writes = !stmt.readonly();
        drop(stmt);
        let changes = if writes
            && matches!(
                verb.as_str(),
                "INSERT" | "UPDATE" | "DELETE" | "REPLACE" | "WITH"
            ) {
            self.conn.changes()
        } else {
            0
        };
        Ok(StmtResult {
            columns,
            rows,
            changes,
            verb,
        })
    }

    fn prepare(&self, sql: &str) -> rusqlite::Result<rusqlite::CachedStatement<'_>> {
        self.conn.prepare_cached(sql)
    }

    /// Classifies a SQLite error (deterministically: codes and SQLite's own message).
    fn error(&self, e: rusqlite::Error) -> SqlError {
        if self.stopped.load(Relaxed) {
            return SqlError {
                kind: SqlErrorKind::StepLimit,
                message: format!(
                    "the operation ran over {STEPS_MAX} virtual-machine steps, the most one \
                     operation may take"
                ),
            };
        }
        classify(e)
    }
}

enum RunError {
    NotReadOnly,
    Sql(SqlError),
}

/// Statement kinds refused before SQLite sees them, and why.
fn refused_verb(verb: &str) -> Option<String> {
    let why = match verb {
        "BEGIN" | "COMMIT" | "END" | "ROLLBACK" | "SAVEPOINT" | "RELEASE" => {
            "transaction control inside an operation: each operation is one transaction (the \
             gateway maps BEGIN ... COMMIT onto one)"
        }
        "ATTACH" | "DETACH" => "other databases: the replicated database is the only one",
        "VACUUM" => "VACUUM: it would rewrite the whole database in one operation",
        "" => "an empty statement",
        _ => return None,
    };
    Some(format!(
        "not supported by the replicated SQL service: {why}"
    ))
}

fn authorize(
    action: &rusqlite::hooks::AuthAction<'_>,
    internal: bool,
) -> rusqlite::hooks::Authorization {
    use rusqlite::hooks::{AuthAction as A, Authorization};
    let allowed = match action {
        A::Transaction { .. } | A::Savepoint { .. } => internal,
        A::Attach { .. } | A::Detach { .. } => false,
        A::Pragma { pragma_name, .. } => {
            internal || PRAGMAS_ALLOWED.contains(&pragma_name.to_ascii_lowercase().as_str())
        }
        A::CreateTempIndex { .. }
        | A::CreateTempTable { .. }
        | A::CreateTempTrigger { .. }
        | A::CreateTempView { .. }
        | A::DropTempIndex { .. }
        | A::DropTempTable { .. }
        | A::DropTempTrigger { .. }
        | A::DropTempView { .. } => false,
        A::Function { function_name } => !matches!(
            function_name.to_ascii_lowercase().as_str(),
            "load_extension" | "total_changes" | "changes" | "sqlite_compileoption_used"
        ),
        _ => true,
    };
    if allowed {
        Authorization::Allow
    } else {
        Authorization::Deny
    }
}

/// Binds `$N`/`?N` parameters to `params[N-1]`, and anonymous `?` in order.
fn bind(stmt: &mut rusqlite::Statement<'_>, params: &[Value]) -> Result<(), SqlError> {
    let count = stmt.parameter_count();
    let bad = |message: String| SqlError {
        kind: SqlErrorKind::BadParameter,
        message,
    };
    for i in 1..=count {
        let at = match stmt.parameter_name(i) {
            Some(name) => match name[1..].parse::<usize>() {
                Ok(n) if n >= 1 && (name.starts_with('$') || name.starts_with('?')) => n - 1,
                _ => {
                    return Err(bad(format!(
                        "named parameter {name}: use $1, $2 ... (positional)"
                    )))
                }
            },
            None => i - 1,
        };
        let Some(v) = params.get(at) else {
            return Err(bad(format!(
                "the statement uses parameter ${} but {} were given",
                at + 1,
                params.len()
            )));
        };
        let r = match v {
            Value::Null => stmt.raw_bind_parameter(i, rusqlite::types::Null),
            Value::Integer(x) => stmt.raw_bind_parameter(i, x),
            Value::Real(x) => stmt.raw_bind_parameter(i, x),
            Value::Text(x) => stmt.raw_bind_parameter(i, x),
            Value::Blob(x) => stmt.raw_bind_parameter(i, x),
        };
        r.map_err(|e| bad(format!("binding parameter {i}: {e}")))?;
    }
    Ok(())
}

fn columns_of(stmt: &rusqlite::Statement<'_>) -> Vec<Column> {
    stmt.columns()
        .map(|c| Column {
            name: c.name().to_string(),
            decl_type: c.decl_type().map(str::to_string),
        })
        .collect()
}

fn value_of(v: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef as V;
    match v {
        V::Null => Value::Null,
        V::Integer(i) => Value::Integer(i),
        V::Real(f) => Value::Real(f),
        V::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        V::Blob(b) => Value::Blob(b.to_vec()),
    }
}

fn value_bytes(v: &Value) -> usize {
    match v {
        Value::Null => 1,
        Value::Integer(_) | Value::Real(_) => 9,
        Value::Text(t) => t.len() + 5,
        Value::Blob(b) => b.len() + 5,
    }
}

fn classify(e: rusqlite::Error) -> SqlError {
    use SqlErrorKind as K;
    let failure = match &e {
        rusqlite::Error::SqliteFailure(err, msg) => {
            Some((*err, msg.clone().unwrap_or_else(|| err.to_string())))
        }
        rusqlite::Error::SqlInputError { error, msg, .. } => Some((*error, msg.clone())),
        _ => None,
    };
    let (kind, message) = match (failure, &e) {
        (Some((err, text)), _) => {
            let kind = match err.extended_code {
                ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                    K::UniqueViolation
                }
                ffi::SQLITE_CONSTRAINT_NOTNULL => K::NotNullViolation,
                ffi::SQLITE_CONSTRAINT_FOREIGNKEY => K::ForeignKeyViolation,
                ffi::SQLITE_CONSTRAINT_CHECK => K::CheckViolation,
                _ => match err.code {
                    rusqlite::ErrorCode::ConstraintViolation => K::Constraint,
                    rusqlite::ErrorCode::DiskFull => K::Full,
                    rusqlite::ErrorCode::TooBig => K::TooBig,
                    rusqlite::ErrorCode::AuthorizationForStatementDenied => K::NotSupported,
                    rusqlite::ErrorCode::TypeMismatch => K::DataMismatch,
                    rusqlite::ErrorCode::ParameterOutOfRange => K::BadParameter,
                    _ if text.starts_with("not authorized") => K::NotSupported,
                    _ if text.contains("syntax error")
                        || text.contains("incomplete input")
                        || text.contains("unrecognized token") =>
                    {
                        K::Syntax
                    }
                    _ if text.starts_with("no such table") => K::UndefinedTable,
                    _ if text.starts_with("no such column") => K::UndefinedColumn,
                    _ if text.contains("already exists") => K::DuplicateObject,
                    _ => K::Other,
                },
            };
            let message = match kind {
                K::Full => format!(
                    "the database is full: {text} (it may grow to the replicated state's size, \
                     [state] size_mib, less {DB_BASE} bytes)"
                ),
                K::NotSupported => format!("not supported by the replicated SQL service: {text}"),
                _ => text,
            };
            (kind, message)
        }
        (None, rusqlite::Error::MultipleStatement) => (
            K::NotSupported,
            "one statement per Statement: split the text at its semicolons".to_string(),
        ),
        (None, other) => (K::Other, other.to_string()),
    };
    SqlError { kind, message }
}

impl Service for SqlService {
    fn execute(&mut self, state: &mut dyn StateWrite, op: &[u8], ctx: &ExecContext) -> Vec<u8> {
        let op = match SqlOp::decode(op) {
            Ok(op) => op,
            Err(e) => return bad_operation(e),
        };
        let reply = match op {
            SqlOp::Write { stmts, expect } => {
                if let Some(r) = too_many(&stmts, &[]) {
                    return r.encode();
                }
                self.engine.run_write(state, ctx, |db| {
                    let reply = write(db, &stmts, &expect);
                    let wrote = matches!(reply, SqlReply::Done(_));
                    (reply, wrote)
                })
            }
            read => self
                .engine
                .run_read(&*state, ctx.seed(), |db| read_only(db, read)),
        };
        reply.unwrap_or_else(corrupt_reply).encode()
    }

    fn execute_read_only(&self, state: &dyn StateRead, op: &[u8]) -> Option<Vec<u8>> {
        let op = match SqlOp::decode(op) {
            Ok(op) => op,
            Err(e) => return Some(bad_operation(e)),
        };
        if !op.is_read_only() {
            return None;
        }
        let seed = u64::from_le_bytes(
            blake3::hash(&op.encode()).as_bytes()[..8]
                .try_into()
                .expect("8 bytes"),
        );
        let reply = self.engine.run_read(state, seed, |db| read_only(db, op));
        Some(reply.unwrap_or_else(corrupt_reply).encode())
    }

    fn load(&mut self, state: &dyn StateRead) -> Result<(), String> {
        self.engine.load(state)
    }
}

fn read_only(db: &Db, op: SqlOp) -> SqlReply {
    match op {
        SqlOp::Read {
            prefix,
            expect,
            stmts,
            transaction,
        } => read(db, &prefix, &expect, &stmts, transaction),
        SqlOp::Describe { sql } => describe(db, &sql),
        SqlOp::Write { .. } => unreachable!("writes are ordered"),
    }
}

fn write(db: &Db, stmts: &[Statement], expect: &[Option<[u8; 32]>]) -> SqlReply {
    if let Err(e) = db.control("BEGIN IMMEDIATE") {
        return SqlReply::Failed {
            index: 0,
            error: db.error(e),
        };
    }
    let mut budget = RESULT_BYTES_MAX;
    match db.run_all(stmts, expect, 0, false, &mut budget) {
        Ok(results) => match db.control("COMMIT") {
            Ok(()) => SqlReply::Done(results),
            Err(e) => {
                let error = db.error(e);
                let _ = db.control("ROLLBACK");
                SqlReply::Failed {
                    index: stmts.len().saturating_sub(1) as u32,
                    error,
                }
            }
        },
        Err(reply) => {
            let _ = db.control("ROLLBACK");
            reply
        }
    }
}

fn read(
    db: &Db,
    prefix: &[Statement],
    expect: &[Option<[u8; 32]>],
    stmts: &[Statement],
    transaction: bool,
) -> SqlReply {
    if let Some(r) = too_many(prefix, stmts) {
        return r;
    }
    if let Err(e) = db.control("BEGIN") {
        return SqlReply::Failed {
            index: 0,
            error: db.error(e),
        };
    }
    let mut budget = RESULT_BYTES_MAX;
    let reply = db
        .run_all(prefix, expect, 0, false, &mut budget)
        .and_then(|_| {
            // The prefix's results are the client's already: only this call's count.
            budget = RESULT_BYTES_MAX;
            db.run_all(stmts, &[], prefix.len(), !transaction, &mut budget)
        });
    let _ = db.control("ROLLBACK");
    match reply {
        Ok(results) => SqlReply::Done(results),
        Err(r) => r,
    }
}

fn describe(db: &Db, sql: &str) -> SqlReply {
    if let Some(why) = refused_verb(&leading_keyword(sql)) {
        return SqlReply::Failed {
            index: 0,
            error: SqlError {
                kind: SqlErrorKind::NotSupported,
                message: why,
            },
        };
    }
    match db.prepare(sql) {
        Ok(stmt) => SqlReply::Described {
            params: stmt.parameter_count() as u32,
            columns: columns_of(&stmt),
        },
        Err(e) => SqlReply::Failed {
            index: 0,
            error: db.error(e),
        },
    }
}

fn too_many(a: &[Statement], b: &[Statement]) -> Option<SqlReply> {
    (a.len() + b.len() > STATEMENTS_MAX).then(|| SqlReply::Failed {
        index: STATEMENTS_MAX as u32,
        error: SqlError {
            kind: SqlErrorKind::TooBig,
            message: format!(
                "{} statements in one operation; at most {STATEMENTS_MAX}",
                a.len() + b.len()
            ),
        },
    })
}

fn bad_operation(e: DecodeError) -> Vec<u8> {
    SqlReply::Failed {
        index: 0,
        error: SqlError {
            kind: SqlErrorKind::BadOperation,
            message: format!("the operation does not decode as an SQL operation: {e}"),
        },
    }
    .encode()
}

fn corrupt_reply(e: String) -> SqlReply {
    SqlReply::Failed {
        index: 0,
        error: SqlError {
            kind: SqlErrorKind::Other,
            message: format!("the replicated database is unusable: {e}"),
        },
    }
}

#[cfg(test)]
mod tests;
