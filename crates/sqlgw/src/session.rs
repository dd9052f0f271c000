//! One PostgreSQL connection's session: autocommit statements, transaction blocks and the
//! failed-transaction state, over a [`Backend`] (the SQL client, or a fake in tests).
//!
//! Outside a transaction block, the statements of one simple query run as one transaction
//! ([`Backend::execute`]: all or nothing, on the read-only path when they only read). `BEGIN`
//! opens an optimistic transaction: each statement runs at once on the read-only path after
//! the transaction's earlier ones ([`Backend::run`]), and `COMMIT` submits them all as one
//! ordered operation that applies only if every statement still returns what it returned
//! ([`Backend::commit`]; SQLSTATE 40001 otherwise). After an error inside a block the
//! transaction is failed: every statement but `ROLLBACK`/`COMMIT` gets 25P02, as in
//! PostgreSQL.
//!
//! A session runs in its own task ([`spawn`]) because a transaction borrows its client; the
//! connection's handlers talk to it through a [`SessionHandle`].

use crate::catalog;
use crate::split::{classify, command_tag, placeholders, split, Command};
use crate::translate::translate;
use crate::GwError;
use redoubt_client::sql::{SqlClient, SqlClientError, Transaction};
use redoubt_services::sql::{Column, Statement, StmtResult, Value};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// What a session needs from the SQL service.
pub trait Backend: Send + Sync + 'static {
    /// A transaction in progress.
    type Tx<'a>: Send
    where
        Self: 'a;

    /// The client id requests go out as (for logs).
    fn client_id(&self) -> u64;

    /// Runs `stmts` as one transaction in autocommit mode.
    fn execute(
        &self,
        stmts: Vec<Statement>,
    ) -> impl Future<Output = Result<Vec<StmtResult>, SqlClientError>> + Send;

    /// The parameter count and result columns of `sql`.
    fn describe(
        &self,
        sql: &str,
    ) -> impl Future<Output = Result<(u32, Vec<Column>), SqlClientError>> + Send;

    /// Starts a transaction.
    fn begin(&self) -> Self::Tx<'_>;

    /// Runs `stmt` in `tx`.
    fn run<'a>(
        tx: &mut Self::Tx<'a>,
        stmt: Statement,
    ) -> impl Future<Output = Result<StmtResult, SqlClientError>> + Send;

    /// Commits `tx`.
    fn commit(tx: Self::Tx<'_>) -> impl Future<Output = Result<(), SqlClientError>> + Send;

    /// How many statements `tx` holds (where a savepoint marks it).
    fn mark(tx: &Self::Tx<'_>) -> usize;

    /// Forgets the statements of `tx` after the first `mark` (`ROLLBACK TO` a savepoint).
    fn rollback_to(tx: &mut Self::Tx<'_>, mark: usize);
}

impl Backend for SqlClient {
    type Tx<'a> = Transaction<'a>;

    fn client_id(&self) -> u64 {
        self.client().id()
    }

    fn execute(
        &self,
        stmts: Vec<Statement>,
    ) -> impl Future<Output = Result<Vec<StmtResult>, SqlClientError>> + Send {
        SqlClient::execute(self, stmts)
    }

    fn describe(
        &self,
        sql: &str,
    ) -> impl Future<Output = Result<(u32, Vec<Column>), SqlClientError>> + Send {
        SqlClient::describe(self, sql)
    }

    fn begin(&self) -> Transaction<'_> {
        self.transaction()
    }

    fn run<'a>(
        tx: &mut Self::Tx<'a>,
        stmt: Statement,
    ) -> impl Future<Output = Result<StmtResult, SqlClientError>> + Send {
        tx.run(stmt)
    }

    fn commit(tx: Self::Tx<'_>) -> impl Future<Output = Result<(), SqlClientError>> + Send {
        tx.commit()
    }

    fn mark(tx: &Self::Tx<'_>) -> usize {
        tx.statements().len()
    }

    fn rollback_to(tx: &mut Self::Tx<'_>, mark: usize) {
        tx.rollback_to(mark)
    }
}

/// The transaction status a ReadyForQuery message reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStatus {
    Idle,
    InTransaction,
    Failed,
}

/// The answer to one statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// A statement that ran (in the service, or `SHOW`): its result and command tag.
    Rows {
        result: StmtResult,
        tag: String,
    },
    /// A statement the gateway answered itself (transaction control, `SET`): its command
    /// tag, and a warning to send before it.
    Command {
        tag: String,
        warning: Option<GwError>,
    },
    Error(GwError),
}

impl Outcome {
    fn command(tag: &str) -> Outcome {
        Outcome::Command {
            tag: tag.into(),
            warning: None,
        }
    }

    fn warned(tag: &str, code: &'static str, message: &str) -> Outcome {
        Outcome::Command {
            tag: tag.into(),
            warning: Some(GwError::new(code, message)),
        }
    }

    fn rows(sql: &str, result: StmtResult) -> Outcome {
        let tag = command_tag(sql, &result.verb, result.rows.len(), result.changes);
        Outcome::Rows { result, tag }
    }
}

/// A statement prepared by the extended query protocol (`Parse`).
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    /// The statement, without its `;`.
    pub sql: String,
    pub command: Command,
    /// How many parameters it takes.
    pub params: usize,
    /// Its result columns; `None` when they could not be known before it runs (a statement
    /// inside a transaction on a table the transaction created).
    pub columns: Option<Vec<Column>>,
}

/// The `SHOW` parameters the gateway answers: name (lower-cased) and value.
const SETTINGS: &[(&str, &str)] = &[
    ("server_version", "16.6"),
    ("server_version_num", "160006"),
    ("server_encoding", "UTF8"),
    ("client_encoding", "UTF8"),
    ("transaction_isolation", "serializable"),
    ("default_transaction_isolation", "serializable"),
    ("transaction isolation level", "serializable"),
    ("standard_conforming_strings", "on"),
    ("datestyle", "ISO, MDY"),
    ("timezone", "UTC"),
    ("integer_datetimes", "on"),
];

/// A transaction's savepoints, oldest first: name and the statement count they mark.
type Savepoints = Vec<(String, usize)>;

enum State<T> {
    Idle,
    Open(T, Savepoints),
    /// Failed by an error: the transaction is kept while it has savepoints, which `ROLLBACK
    /// TO` can return to.
    Failed(Option<(T, Savepoints)>),
}

/// One connection's session state machine.
pub struct Session<'b, B: Backend> {
    backend: &'b B,
    state: State<B::Tx<'b>>,
}

/// A statement for the service in SQLite's dialect: a catalog query rewritten on SQLite's
/// schema, anything else translated (see [`crate::translate`]).
fn to_sqlite(sql: &str) -> Result<String, GwError> {
    if catalog::reads_catalog(sql) {
        catalog::rewrite(sql)
    } else {
        translate(sql)
    }
}

fn no_savepoint(name: &str) -> GwError {
    GwError::new("3B001", format!("savepoint \"{name}\" does not exist"))
}

fn aborted() -> GwError {
    GwError::new(
        "25P02",
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

impl<'b, B: Backend> Session<'b, B> {
    pub fn new(backend: &'b B) -> Self {
        Session {
            backend,
            state: State::Idle,
        }
    }

    pub fn status(&self) -> TxStatus {
        match self.state {
            State::Idle => TxStatus::Idle,
            State::Open(..) => TxStatus::InTransaction,
            State::Failed(_) => TxStatus::Failed,
        }
    }

    /// An error the session did not see (a protocol error, a result that could not be
    /// encoded) happened: an open transaction fails, as any error fails it.
    pub fn abort(&mut self) {
        if let State::Open(..) = self.state {
            let State::Open(tx, savepoints) = std::mem::replace(&mut self.state, State::Idle)
            else {
                unreachable!("matched above")
            };
            self.state = State::Failed((!savepoints.is_empty()).then_some((tx, savepoints)));
        }
    }

    /// A simple query: its statements in order, one outcome each, stopping after the first
    /// error (like PostgreSQL, which skips the rest of the query string). Consecutive
    /// statements outside a transaction block run as one transaction.
    pub async fn simple(&mut self, sql: &str) -> Vec<Outcome> {
        let mut out = Vec::new();
        let mut batch: Vec<Statement> = Vec::new();
        // As PostgreSQL parses the whole query string before running any of it, a statement
        // the gateway cannot translate fails the query before anything runs.
        let mut stmts: Vec<String> = Vec::new();
        for s in split(sql) {
            if classify(s) != Command::Sql {
                stmts.push(s.to_string());
                continue;
            }
            match to_sqlite(s) {
                Ok(t) => stmts.push(t),
                Err(e) => {
                    self.abort();
                    return vec![Outcome::Error(e)];
                }
            }
        }
        let stmts: Vec<&str> = stmts.iter().map(String::as_str).collect();
        let mut k = 0;
        while k < stmts.len() {
            let s = stmts[k];
            k += 1;
            let command = classify(s);
            if command == Command::Begin && matches!(self.state, State::Idle) {
                if let Some(n) = whole_block(&stmts[k..]) {
                    // The client sent the whole block at once, so it cannot act on what
                    // one statement returns before the next runs: one call runs the block,
                    // with no speculative round trip per statement.
                    if !self.flush(&mut batch, &mut out).await {
                        return out;
                    }
                    out.push(Outcome::command("BEGIN"));
                    batch.extend(stmts[k..k + n].iter().map(|s| Statement::new(*s)));
                    k += n + 1;
                    if !self.flush(&mut batch, &mut out).await {
                        // As in PostgreSQL: the rest of the query, COMMIT included, is
                        // skipped, and the block stays open, failed, until ROLLBACK.
                        self.state = State::Failed(None);
                        return out;
                    }
                    out.push(Outcome::command("COMMIT"));
                    continue;
                }
            }
            if command == Command::Sql && matches!(self.state, State::Idle) {
                batch.push(Statement::new(s));
                continue;
            }
            if !self.flush(&mut batch, &mut out).await {
                return out;
            }
            let o = self.step(command, Statement::new(s)).await;
            let failed = matches!(o, Outcome::Error(_));
            out.push(o);
            if failed {
                return out;
            }
        }
        self.flush(&mut batch, &mut out).await;
        out
    }

    /// Runs the autocommit statements gathered so far; false if they failed.
    async fn flush(&mut self, batch: &mut Vec<Statement>, out: &mut Vec<Outcome>) -> bool {
        if batch.is_empty() {
            return true;
        }
        let stmts = std::mem::take(batch);
        let sqls: Vec<String> = stmts.iter().map(|s| s.sql.clone()).collect();
        match self.backend.execute(stmts).await {
            Ok(results) if results.len() == sqls.len() => {
                out.extend(sqls.iter().zip(results).map(|(s, r)| Outcome::rows(s, r)));
                true
            }
            Ok(results) => {
                out.push(Outcome::Error(GwError::new(
                    "XX000",
                    format!(
                        "the service returned {} results for {} statements",
                        results.len(),
                        sqls.len()
                    ),
                )));
                false
            }
            Err(e) => {
                out.push(Outcome::Error(GwError::from_client(&e)));
                false
            }
        }
    }

    /// Runs one statement of the extended query protocol.
    pub async fn execute(&mut self, command: Command, stmt: Statement) -> Outcome {
        self.step(command, stmt).await
    }

    /// Prepares `sql` (one statement): its parameter count and result columns. `Ok(None)`
    /// when it holds no statement (only comments).
    pub async fn prepare(&mut self, sql: &str) -> Result<Option<Prepared>, GwError> {
        let stmts = split(sql);
        let s = match stmts.as_slice() {
            [] => return Ok(None),
            [s] => *s,
            _ => {
                return Err(GwError::new(
                    "42601",
                    "cannot insert multiple commands into a prepared statement",
                ))
            }
        };
        let command = classify(s);
        let translated;
        let s = if command == Command::Sql {
            translated = to_sqlite(s)?;
            translated.as_str()
        } else {
            s
        };
        let (params, columns) = match &command {
            Command::Sql => {
                if let State::Failed(_) = self.state {
                    return Err(aborted());
                }
                match self.backend.describe(s).await {
                    Ok((n, columns)) => (n as usize, Some(columns)),
                    // The service describes against the committed database: a statement on
                    // a table this transaction created is not known there yet.
                    Err(_) if matches!(self.state, State::Open(..)) => (placeholders(s), None),
                    Err(e) => return Err(GwError::from_client(&e)),
                }
            }
            Command::Show(name) => (
                0,
                Some(vec![Column {
                    name: name.clone(),
                    decl_type: Some("TEXT".into()),
                }]),
            ),
            _ => (0, Some(Vec::new())),
        };
        Ok(Some(Prepared {
            sql: s.to_string(),
            command,
            params,
            columns,
        }))
    }

    async fn step(&mut self, command: Command, stmt: Statement) -> Outcome {
        let outcome = match (command, &mut self.state) {
            (Command::Begin, State::Idle) => {
                self.state = State::Open(self.backend.begin(), Vec::new());
                Outcome::command("BEGIN")
            }
            (Command::Begin, State::Open(..)) => Outcome::warned(
                "BEGIN",
                "25001",
                "there is already a transaction in progress",
            ),
            (Command::Commit | Command::Rollback, State::Failed(_)) => {
                self.state = State::Idle;
                Outcome::command("ROLLBACK")
            }
            (Command::Commit, State::Idle) => {
                Outcome::warned("COMMIT", "25P01", "there is no transaction in progress")
            }
            (Command::Rollback, State::Idle) => {
                Outcome::warned("ROLLBACK", "25P01", "there is no transaction in progress")
            }
            (Command::Commit, State::Open(..)) => {
                let State::Open(tx, _) = std::mem::replace(&mut self.state, State::Idle) else {
                    unreachable!("matched above")
                };
                match B::commit(tx).await {
                    Ok(()) => Outcome::command("COMMIT"),
                    Err(e) => Outcome::Error(GwError::from_client(&e)),
                }
            }
            (Command::Rollback, State::Open(..)) => {
                self.state = State::Idle;
                Outcome::command("ROLLBACK")
            }
            (Command::Deallocate(name), _) => {
                // Protocol-level prepared statements are dropped by the connection (it holds
                // them); SQL-level PREPARE is refused, so there is nothing else to drop.
                Outcome::command(if name.is_some() {
                    "DEALLOCATE"
                } else {
                    "DEALLOCATE ALL"
                })
            }
            (Command::Savepoint(_) | Command::Release(_) | Command::RollbackTo(_), State::Idle) => {
                Outcome::Error(GwError::new(
                    "25P01",
                    "savepoints can only be used in transaction blocks",
                ))
            }
            (Command::Savepoint(name), State::Open(tx, savepoints)) => {
                savepoints.push((name, B::mark(tx)));
                Outcome::command("SAVEPOINT")
            }
            (Command::Release(name), State::Open(_, savepoints)) => {
                match savepoints.iter().rposition(|(n, _)| *n == name) {
                    Some(i) => {
                        savepoints.truncate(i);
                        Outcome::command("RELEASE")
                    }
                    None => Outcome::Error(no_savepoint(&name)),
                }
            }
            (Command::RollbackTo(name), State::Open(tx, savepoints)) => {
                match savepoints.iter().rposition(|(n, _)| *n == name) {
                    Some(i) => {
                        B::rollback_to(tx, savepoints[i].1);
                        savepoints.truncate(i + 1);
                        Outcome::command("ROLLBACK")
                    }
                    None => Outcome::Error(no_savepoint(&name)),
                }
            }
            (Command::RollbackTo(name), State::Failed(kept)) => {
                let found = kept
                    .as_ref()
                    .and_then(|(_, sps)| sps.iter().rposition(|(n, _)| *n == name));
                match (found, kept.take()) {
                    (Some(i), Some((mut tx, mut savepoints))) => {
                        B::rollback_to(&mut tx, savepoints[i].1);
                        savepoints.truncate(i + 1);
                        self.state = State::Open(tx, savepoints);
                        Outcome::command("ROLLBACK")
                    }
                    (_, back) => {
                        *kept = back;
                        Outcome::Error(no_savepoint(&name))
                    }
                }
            }
            (_, State::Failed(_)) => Outcome::Error(aborted()),
            (Command::Set, _) => Outcome::command("SET"),
            (Command::Reset, _) => Outcome::command("RESET"),
            (Command::Show(name), _) => show(&name),
            (Command::Unsupported(what), _) => Outcome::Error(GwError::new(
                "0A000",
                format!("{what} is not supported by the redoubt SQL gateway"),
            )),
            (Command::Sql, State::Idle) => {
                let sql = stmt.sql.clone();
                match self.backend.execute(vec![stmt]).await {
                    Ok(mut r) if r.len() == 1 => Outcome::rows(&sql, r.pop().expect("one")),
                    Ok(r) => Outcome::Error(GwError::new(
                        "XX000",
                        format!("the service returned {} results for 1 statement", r.len()),
                    )),
                    Err(e) => Outcome::Error(GwError::from_client(&e)),
                }
            }
            (Command::Sql, State::Open(tx, _)) => {
                let sql = stmt.sql.clone();
                match B::run(tx, stmt).await {
                    Ok(r) => Outcome::rows(&sql, r),
                    Err(e) => Outcome::Error(GwError::from_client(&e)),
                }
            }
        };
        if let Outcome::Error(_) = outcome {
            self.abort();
        }
        outcome
    }
}

/// When `rest` (what follows a `BEGIN`) is statements for the service and then `COMMIT`:
/// how many statements come before the `COMMIT`.
fn whole_block(rest: &[&str]) -> Option<usize> {
    let end = rest.iter().position(|s| classify(s) != Command::Sql)?;
    (classify(rest[end]) == Command::Commit).then_some(end)
}

fn show(name: &str) -> Outcome {
    match SETTINGS.iter().find(|(n, _)| *n == name) {
        Some((n, v)) => Outcome::Rows {
            result: StmtResult {
                columns: vec![Column {
                    name: n.to_string(),
                    decl_type: Some("TEXT".into()),
                }],
                rows: vec![vec![Value::Text(v.to_string())]],
                changes: 0,
                verb: "SHOW".into(),
            },
            tag: "SHOW".into(),
        },
        None => Outcome::Error(GwError::new(
            "0A000",
            format!(
                "SHOW {name} is not supported by the redoubt SQL gateway (it answers {})",
                SETTINGS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

enum Request {
    Simple(String, oneshot::Sender<(Vec<Outcome>, TxStatus)>),
    Prepare(
        String,
        oneshot::Sender<(Result<Option<Prepared>, GwError>, TxStatus)>,
    ),
    Execute(Command, Statement, oneshot::Sender<(Outcome, TxStatus)>),
    Abort(oneshot::Sender<TxStatus>),
}

/// The connection's side of a session running in its own task. Dropping every clone ends
/// the session once its request in progress (if any) has finished.
#[derive(Clone)]
pub struct SessionHandle {
    requests: mpsc::Sender<(bool, Request)>,
    /// An error happened that the session did not see; it aborts an open transaction
    /// before its next request.
    error_pending: Arc<AtomicBool>,
}

/// Starts a session over `backend` in its own task; `guard` is dropped when the session ends
/// (after its last request finished: the pool gets the client id back then).
pub fn spawn<B: Backend>(backend: B, guard: impl Send + 'static) -> SessionHandle {
    let (requests, mut rx) = mpsc::channel::<(bool, Request)>(1);
    tokio::spawn(async move {
        {
            let mut session = Session::new(&backend);
            while let Some((error_pending, req)) = rx.recv().await {
                if error_pending {
                    session.abort();
                }
                // A send fails only when the connection is gone; the session goes on until
                // the channel closes.
                match req {
                    Request::Simple(sql, reply) => {
                        let out = session.simple(&sql).await;
                        let _ = reply.send((out, session.status()));
                    }
                    Request::Prepare(sql, reply) => {
                        let out = session.prepare(&sql).await;
                        let _ = reply.send((out, session.status()));
                    }
                    Request::Execute(command, stmt, reply) => {
                        let out = session.execute(command, stmt).await;
                        let _ = reply.send((out, session.status()));
                    }
                    Request::Abort(reply) => {
                        session.abort();
                        let _ = reply.send(session.status());
                    }
                }
            }
        }
        drop(guard);
    });
    SessionHandle {
        requests,
        error_pending: Arc::new(AtomicBool::new(false)),
    }
}

fn session_gone() -> GwError {
    GwError::new("08006", "the gateway's session for this connection ended")
}

impl SessionHandle {
    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Request) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        let pending = self.error_pending.swap(false, Ordering::AcqRel);
        self.requests.send((pending, make(tx))).await.ok()?;
        rx.await.ok()
    }

    /// Notes an error the session did not see (see [`Session::abort`]).
    pub fn note_error(&self) {
        self.error_pending.store(true, Ordering::Release);
    }

    pub async fn simple(&self, sql: String) -> (Vec<Outcome>, TxStatus) {
        self.call(|r| Request::Simple(sql, r))
            .await
            .unwrap_or_else(|| (vec![Outcome::Error(session_gone())], TxStatus::Idle))
    }

    pub async fn prepare(&self, sql: String) -> (Result<Option<Prepared>, GwError>, TxStatus) {
        self.call(|r| Request::Prepare(sql, r))
            .await
            .unwrap_or_else(|| (Err(session_gone()), TxStatus::Idle))
    }

    pub async fn execute(&self, command: Command, stmt: Statement) -> (Outcome, TxStatus) {
        self.call(|r| Request::Execute(command, stmt, r))
            .await
            .unwrap_or_else(|| (Outcome::Error(session_gone()), TxStatus::Idle))
    }

    /// Fails an open transaction now; returns the new status.
    pub async fn abort(&self) -> TxStatus {
        self.call(Request::Abort).await.unwrap_or(TxStatus::Idle)
    }
}

#[cfg(test)]
mod tests;
