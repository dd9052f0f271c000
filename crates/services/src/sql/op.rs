//! What travels between SQL clients (the PostgreSQL gateway, [`super::SqlClient`]) and the
//! replicated SQL service: operations, results and errors, as canonical postcard encodings.

use serde::{Deserialize, Serialize};

/// A value bound to a parameter or returned in a row (SQLite's storage classes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(#[serde(with = "serde_bytes")] Vec<u8>),
}

/// One SQL statement and its positional parameters (`$1`, `?1` or `?`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    pub sql: String,
    pub params: Vec<Value>,
}

impl Statement {
    /// A statement without parameters.
    pub fn new(sql: impl Into<String>) -> Statement {
        Statement {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// A statement with positional parameters.
    pub fn with_params(sql: impl Into<String>, params: Vec<Value>) -> Statement {
        Statement {
            sql: sql.into(),
            params,
        }
    }
}

/// An operation on the SQL service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SqlOp {
    /// Ordered: runs `stmts` in sequence as one transaction, all or nothing. When
    /// `expect[i]` is present it is the [`StmtResult::digest`] the client saw for statement `i`
    /// when it ran the transaction speculatively ([`SqlOp::Read`] with a prefix); a different
    /// result now aborts the transaction with [`SqlReply::Conflict`] (optimistic concurrency:
    /// the committed transaction read exactly what its client saw, so it is serializable).
    Write {
        stmts: Vec<Statement>,
        expect: Vec<Option<[u8; 32]>>,
    },
    /// Read-only path: runs `prefix` then `stmts` in a transaction that is always rolled
    /// back, and returns the results of `stmts`. Outside a `transaction` every statement must
    /// be read-only, else the reply is [`SqlReply::NotReadOnly`] and the client submits a
    /// [`SqlOp::Write`]; inside one (an interactive transaction in progress at the client,
    /// its earlier statements the prefix) statements may write: their effects are seen by
    /// later statements and then discarded. `expect`
    /// works as in [`SqlOp::Write`], for the prefix: a transaction whose earlier statements
    /// would now read otherwise learns at once that it cannot commit.
    Read {
        prefix: Vec<Statement>,
        expect: Vec<Option<[u8; 32]>>,
        stmts: Vec<Statement>,
        transaction: bool,
    },
    /// Read-only path: the parameter count and result columns of a statement, without
    /// running it.
    Describe { sql: String },
}

/// A result column: its name and declared type (none for expressions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    pub name: String,
    pub decl_type: Option<String>,
}

/// The result of one statement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StmtResult {
    /// Result columns (empty for statements that return no rows).
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Value>>,
    /// Rows inserted, updated or deleted by the statement (0 for other statements).
    pub changes: u64,
    /// The statement's leading keyword, upper-cased (`SELECT`, `INSERT`, `CREATE`...): the
    /// command tag a PostgreSQL client expects.
    pub verb: String,
}

impl StmtResult {
    /// Canonical digest of the result, as [`SqlOp::Write`]'s expectations carry it.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(b"redoubt.sql.result.v1");
        h.update(&encode(self));
        *h.finalize().as_bytes()
    }
}

/// Why a statement failed. Each kind maps to a PostgreSQL SQLSTATE ([`SqlErrorKind::sqlstate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SqlErrorKind {
    Syntax,
    UndefinedTable,
    UndefinedColumn,
    DuplicateObject,
    UniqueViolation,
    NotNullViolation,
    ForeignKeyViolation,
    CheckViolation,
    /// Another integrity constraint.
    Constraint,
    DataMismatch,
    /// The database reached the replicated state's size (`[state] size_mib`).
    Full,
    /// A string, blob or row over SQLite's length limit.
    TooBig,
    /// The statement ran more virtual-machine steps than one operation may
    /// ([`super::STEPS_MAX`]): every replica stops it at the same step.
    StepLimit,
    /// The results exceed the reply size an operation may return ([`super::RESULT_BYTES_MAX`]).
    ResultTooLarge,
    /// The statement is valid SQL that the replicated service does not allow (ATTACH,
    /// PRAGMA, VACUUM, explicit transaction control inside an operation...).
    NotSupported,
    /// A parameter count or type that does not fit the statement.
    BadParameter,
    /// The operation itself did not decode (a client of another version).
    BadOperation,
    Other,
}

impl SqlErrorKind {
    /// The PostgreSQL error code a client of the gateway sees.
    pub fn sqlstate(self) -> &'static str {
        match self {
            SqlErrorKind::Syntax => "42601",
            SqlErrorKind::UndefinedTable => "42P01",
            SqlErrorKind::UndefinedColumn => "42703",
            SqlErrorKind::DuplicateObject => "42P07",
            SqlErrorKind::UniqueViolation => "23505",
            SqlErrorKind::NotNullViolation => "23502",
            SqlErrorKind::ForeignKeyViolation => "23503",
            SqlErrorKind::CheckViolation => "23514",
            SqlErrorKind::Constraint => "23000",
            SqlErrorKind::DataMismatch => "22000",
            SqlErrorKind::Full => "53100",
            SqlErrorKind::TooBig => "54000",
            SqlErrorKind::StepLimit => "57014",
            SqlErrorKind::ResultTooLarge => "54000",
            SqlErrorKind::NotSupported => "0A000",
            SqlErrorKind::BadParameter => "08P01",
            SqlErrorKind::BadOperation => "08P01",
            SqlErrorKind::Other => "XX000",
        }
    }
}

/// A statement's error: its kind and SQLite's message (deterministic: identical on every
/// correct replica).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct SqlError {
    pub kind: SqlErrorKind,
    pub message: String,
}

/// The reply to an [`SqlOp`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SqlReply {
    /// Every statement ran (and, for a write, committed): one result per statement.
    Done(Vec<StmtResult>),
    /// Statement `index` failed; nothing the operation did remains. (Indices count a
    /// [`SqlOp::Read`]'s prefix first.)
    Failed { index: u32, error: SqlError },
    /// Statement `index` of a [`SqlOp::Write`] returned a result other than the one its
    /// client expected: a concurrent transaction changed what it read. Nothing remains; the
    /// client retries the transaction (SQLSTATE 40001).
    Conflict { index: u32 },
    /// A [`SqlOp::Read`] outside a transaction contained a statement that writes.
    NotReadOnly,
    /// The answer to a [`SqlOp::Describe`].
    Described { params: u32, columns: Vec<Column> },
}

/// An encoding that did not decode.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("malformed encoding: {0}")]
    Malformed(#[from] postcard::Error),
    #[error("{0} trailing bytes after the encoding")]
    TrailingBytes(usize),
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing these types into a growable vector cannot fail.
    postcard::to_stdvec(v).expect("postcard encoding into a Vec is infallible")
}

pub(crate) fn decode_exact<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, DecodeError> {
    let (v, rest) = postcard::take_from_bytes(b)?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes(rest.len()));
    }
    Ok(v)
}

impl SqlOp {
    /// Canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Decodes an operation; trailing bytes are an error.
    pub fn decode(b: &[u8]) -> Result<SqlOp, DecodeError> {
        decode_exact(b)
    }

    /// True for the operations that take the read-only path.
    pub fn is_read_only(&self) -> bool {
        !matches!(self, SqlOp::Write { .. })
    }
}

impl SqlReply {
    /// Canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Decodes a reply; trailing bytes are an error.
    pub fn decode(b: &[u8]) -> Result<SqlReply, DecodeError> {
        decode_exact(b)
    }
}

/// True when `sql` begins with a keyword of a statement that usually only reads (the client
/// then tries the read-only path first; the service has the last word).
pub fn looks_read_only(sql: &str) -> bool {
    let verb = leading_keyword(sql);
    matches!(verb.as_str(), "SELECT" | "WITH" | "VALUES" | "EXPLAIN")
}

/// The first keyword of `sql`, upper-cased, after whitespace, comments and parentheses.
pub fn leading_keyword(sql: &str) -> String {
    let mut s = sql;
    loop {
        let t = s.trim_start_matches(|c: char| c.is_whitespace() || c == '(');
        if let Some(rest) = t.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(rest) = t.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |(_, r)| r);
        } else {
            s = t;
            break;
        }
    }
    s.chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_uppercase()
}
