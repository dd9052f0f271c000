//! The client side of the SQL service: statements, read-only queries and optimistic
//! transactions over the library's [`Client`].

use crate::{Client, ClientError, ClientSetup};
use redoubt_services::sql::{
    looks_read_only, Column, SqlError, SqlOp, SqlReply, Statement, StmtResult,
};
use std::time::Duration;

/// Why an SQL call failed.
#[derive(Debug, thiserror::Error)]
pub enum SqlClientError {
    /// The cluster did not answer (see [`ClientError`]).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Statement `index` of the call failed; nothing the call did remains.
    #[error("statement {} failed: {error}", index + 1)]
    Sql { index: u32, error: SqlError },
    /// A transaction's statement `index` would now return another result than it did when
    /// the transaction ran: another client's write came first. Nothing remains; run the
    /// transaction again (SQLSTATE 40001).
    #[error("could not serialize the transaction: statement {} saw data another transaction changed since; run it again", index + 1)]
    Conflict { index: u32 },
    /// The certified reply is not a reply of the expected kind (a service of another kind
    /// or version answered).
    #[error("unexpected reply: {0}")]
    UnexpectedReply(String),
}

impl SqlClientError {
    /// The PostgreSQL error code for this error.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            // The outcome is unknown: PostgreSQL's transaction_resolution_unknown.
            SqlClientError::Client(ClientError::Unreachable { .. }) => "08007",
            SqlClientError::Client(ClientError::TooLarge(_)) => "54000",
            SqlClientError::Client(_) => "08006",
            SqlClientError::Sql { error, .. } => error.kind.sqlstate(),
            SqlClientError::Conflict { .. } => "40001",
            SqlClientError::UnexpectedReply(_) => "XX000",
        }
    }
}

/// A client of the replicated SQL service ([`redoubt_services::sql::SqlService`]).
#[derive(Clone, Debug)]
pub struct SqlClient {
    client: Client,
    deadline: Option<Duration>,
}

impl SqlClient {
    /// Wraps a connected client.
    pub fn new(client: Client) -> Self {
        SqlClient {
            client,
            deadline: None,
        }
    }

    /// Connects a client (see [`Client::connect`]) and wraps it.
    pub async fn connect(setup: ClientSetup) -> Result<Self, ClientError> {
        Ok(SqlClient::new(Client::connect(setup).await?))
    }

    /// This client with `deadline` for every call instead of the setup's; clones share the
    /// connection.
    pub fn with_deadline(&self, deadline: Duration) -> SqlClient {
        SqlClient {
            client: self.client.clone(),
            deadline: Some(deadline),
        }
    }

    /// The underlying client (for its view and stats).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends `op` and returns the certified reply.
    pub async fn run(&self, op: &SqlOp) -> Result<SqlReply, SqlClientError> {
        let bytes = op.encode();
        let reply = self
            .client
            .invoke_as(bytes, op.is_read_only(), self.deadline)
            .await?;
        SqlReply::decode(&reply)
            .map_err(|e| SqlClientError::UnexpectedReply(format!("undecodable ({e})")))
    }

    /// Runs `stmts` as one transaction in autocommit mode: on the read-only path when every
    /// statement only reads (one round trip, no ordering), else ordered.
    pub async fn execute(&self, stmts: Vec<Statement>) -> Result<Vec<StmtResult>, SqlClientError> {
        if !stmts.is_empty() && stmts.iter().all(|s| looks_read_only(&s.sql)) {
            let op = SqlOp::Read {
                prefix: Vec::new(),
                expect: Vec::new(),
                stmts,
                transaction: false,
            };
            match self.run(&op).await? {
                SqlReply::NotReadOnly => {}
                reply => return results(reply),
            }
            let SqlOp::Read { stmts, .. } = op else {
                unreachable!("built above")
            };
            return self.write(stmts, Vec::new()).await;
        }
        self.write(stmts, Vec::new()).await
    }

    /// One statement in autocommit mode (see [`SqlClient::execute`]).
    pub async fn query(&self, stmt: Statement) -> Result<StmtResult, SqlClientError> {
        let mut r = self.execute(vec![stmt]).await?;
        r.pop()
            .ok_or_else(|| SqlClientError::UnexpectedReply("no result".into()))
    }

    /// Runs `stmts` ordered as one transaction, checking the expected result digests.
    pub async fn write(
        &self,
        stmts: Vec<Statement>,
        expect: Vec<Option<[u8; 32]>>,
    ) -> Result<Vec<StmtResult>, SqlClientError> {
        results(self.run(&SqlOp::Write { stmts, expect }).await?)
    }

    /// The parameter count and result columns of `sql`.
    pub async fn describe(&self, sql: &str) -> Result<(u32, Vec<Column>), SqlClientError> {
        match self.run(&SqlOp::Describe { sql: sql.into() }).await? {
            SqlReply::Described { params, columns } => Ok((params, columns)),
            SqlReply::Failed { index, error } => Err(SqlClientError::Sql { index, error }),
            other => Err(SqlClientError::UnexpectedReply(format!("{other:?}"))),
        }
    }

    /// Starts a transaction (see [`Transaction`]).
    pub fn transaction(&self) -> Transaction<'_> {
        Transaction {
            client: self,
            stmts: Vec::new(),
            seen: Vec::new(),
        }
    }
}

fn results(reply: SqlReply) -> Result<Vec<StmtResult>, SqlClientError> {
    match reply {
        SqlReply::Done(r) => Ok(r),
        SqlReply::Failed { index, error } => Err(SqlClientError::Sql { index, error }),
        SqlReply::Conflict { index } => Err(SqlClientError::Conflict { index }),
        other => Err(SqlClientError::UnexpectedReply(format!("{other:?}"))),
    }
}

/// An interactive, serializable transaction run optimistically. Each statement runs at once
/// on the read-only path after the transaction's earlier statements (whose writes it sees,
/// and which are then discarded); [`Transaction::commit`] submits the whole transaction as
/// one ordered operation that commits only if every statement still returns what the client
/// saw ([`SqlClientError::Conflict`] otherwise: run it again).
#[derive(Debug)]
pub struct Transaction<'a> {
    client: &'a SqlClient,
    stmts: Vec<Statement>,
    seen: Vec<[u8; 32]>,
}

impl Transaction<'_> {
    /// Runs `stmt` in the transaction and returns its result.
    pub async fn run(&mut self, stmt: Statement) -> Result<StmtResult, SqlClientError> {
        let op = SqlOp::Read {
            prefix: self.stmts.clone(),
            expect: self.seen.iter().copied().map(Some).collect(),
            stmts: vec![stmt],
            transaction: true,
        };
        let reply = self.client.run(&op).await?;
        let SqlOp::Read { mut stmts, .. } = op else {
            unreachable!("built above")
        };
        let result = match reply {
            SqlReply::Done(mut r) if r.len() == 1 => r.pop().expect("one result"),
            // Indices count the prefix first: the new statement itself failed.
            SqlReply::Failed { index, error } if index as usize == self.stmts.len() => {
                return Err(SqlClientError::Sql { index, error })
            }
            // A statement that ran before fails now: another client's write changed what
            // the transaction depends on.
            SqlReply::Failed { index, .. } | SqlReply::Conflict { index } => {
                return Err(SqlClientError::Conflict { index })
            }
            other => return Err(SqlClientError::UnexpectedReply(format!("{other:?}"))),
        };
        self.stmts.push(stmts.pop().expect("one statement"));
        self.seen.push(result.digest());
        Ok(result)
    }

    /// The statements run so far.
    pub fn statements(&self) -> &[Statement] {
        &self.stmts
    }

    /// Forgets every statement after the first `n` (a savepoint's `ROLLBACK TO`): they are
    /// not committed, and later statements run after the first `n` alone.
    pub fn rollback_to(&mut self, n: usize) {
        self.stmts.truncate(n);
        self.seen.truncate(n);
    }

    /// Commits: one ordered operation, applied only if every statement returns what it
    /// returned in [`Transaction::run`].
    pub async fn commit(self) -> Result<(), SqlClientError> {
        if self.stmts.is_empty() {
            return Ok(());
        }
        let expect = self.seen.into_iter().map(Some).collect();
        self.client.write(self.stmts, expect).await.map(|_| ())
    }
}
