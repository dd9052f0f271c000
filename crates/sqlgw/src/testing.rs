//! A scripted [`Backend`] for the tests: it records its calls and answers from the SQL text.

use crate::session::Backend;
use crate::split::placeholders;
use redoubt_client::sql::SqlClientError;
use redoubt_services::sql::{Column, SqlError, SqlErrorKind, Statement, StmtResult, Value};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A backend that records its calls. A statement containing `fail` fails (undefined
/// table); commits conflict while `conflict` is set; describing a statement containing
/// `new_table` fails (the table does not exist in the committed database).
#[derive(Clone, Default)]
pub struct Fake {
    calls: Arc<Mutex<Vec<String>>>,
    pub conflict: Arc<AtomicBool>,
}

pub struct FakeTx<'a> {
    fake: &'a Fake,
    stmts: Vec<String>,
}

/// A `SELECT` returns one row: its parameters (columns `p1`, `p2`...), or `x` = 1 when it
/// has none. Writes change one row.
fn result_of(sql: &str, params: &[Value]) -> StmtResult {
    let verb = redoubt_services::sql::leading_keyword(sql);
    let (columns, rows) = if verb != "SELECT" {
        (Vec::new(), Vec::new())
    } else if placeholders(sql) == 0 {
        (vec!["x".to_string()], vec![vec![Value::Integer(1)]])
    } else {
        let names = (1..=placeholders(sql)).map(|i| format!("p{i}")).collect();
        (names, vec![params.to_vec()])
    };
    StmtResult {
        columns: columns
            .into_iter()
            .map(|name| Column {
                name,
                decl_type: None,
            })
            .collect(),
        rows,
        changes: matches!(verb.as_str(), "INSERT" | "UPDATE" | "DELETE") as u64,
        verb,
    }
}

fn failure(index: usize) -> SqlClientError {
    SqlClientError::Sql {
        index: index as u32,
        error: SqlError {
            kind: SqlErrorKind::UndefinedTable,
            message: "no such table: fail".into(),
        },
    }
}

impl Fake {
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }

    pub fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl Backend for Fake {
    type Tx<'a> = FakeTx<'a>;

    fn client_id(&self) -> u64 {
        0
    }

    fn execute(
        &self,
        stmts: Vec<Statement>,
    ) -> impl Future<Output = Result<Vec<StmtResult>, SqlClientError>> + Send {
        let sqls: Vec<&str> = stmts.iter().map(|s| s.sql.as_str()).collect();
        self.log(format!("execute {}", sqls.join(" | ")));
        let r = match sqls.iter().position(|s| s.contains("fail")) {
            Some(i) => Err(failure(i)),
            None => Ok(stmts.iter().map(|s| result_of(&s.sql, &s.params)).collect()),
        };
        std::future::ready(r)
    }

    fn describe(
        &self,
        sql: &str,
    ) -> impl Future<Output = Result<(u32, Vec<Column>), SqlClientError>> + Send {
        self.log(format!("describe {sql}"));
        let r = if sql.contains("new_table") || sql.contains("fail") {
            Err(failure(0))
        } else {
            Ok((placeholders(sql) as u32, result_of(sql, &[]).columns))
        };
        std::future::ready(r)
    }

    fn begin(&self) -> FakeTx<'_> {
        self.log("begin".into());
        FakeTx {
            fake: self,
            stmts: Vec::new(),
        }
    }

    fn run<'a>(
        tx: &mut Self::Tx<'a>,
        stmt: Statement,
    ) -> impl Future<Output = Result<StmtResult, SqlClientError>> + Send {
        tx.fake.log(format!("run {}", stmt.sql));
        let r = if stmt.sql.contains("fail") {
            Err(failure(tx.stmts.len()))
        } else {
            tx.stmts.push(stmt.sql.clone());
            Ok(result_of(&stmt.sql, &stmt.params))
        };
        std::future::ready(r)
    }

    fn mark(tx: &Self::Tx<'_>) -> usize {
        tx.stmts.len()
    }

    fn rollback_to(tx: &mut Self::Tx<'_>, mark: usize) {
        tx.fake.log(format!("rollback_to {mark}"));
        tx.stmts.truncate(mark);
    }

    fn commit(tx: Self::Tx<'_>) -> impl Future<Output = Result<(), SqlClientError>> + Send {
        tx.fake.log(format!("commit {}", tx.stmts.join(" | ")));
        let r = if tx.fake.conflict.load(Ordering::Relaxed) {
            Err(SqlClientError::Conflict { index: 0 })
        } else {
            Ok(())
        };
        std::future::ready(r)
    }
}
