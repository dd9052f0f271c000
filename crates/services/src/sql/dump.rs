//! The SQL service's database as SQL text (`redoubt sql-dump`): the schema and one `INSERT` per
//! row, in PostgreSQL's literal syntax, which the gateway translates back, so that `psql -f`
//! through `redoubt sql-gateway` restores it into an empty cluster, in transactions small
//! enough for one request each.

use super::Engine;
use redoubt_state::StateRead;
use rusqlite::types::ValueRef;
use std::fmt::Write as _;

/// SQL text of one transaction at most (bytes): a cluster takes a transaction as one request,
/// which must fit `[protocol] request_bytes_max` (64 KiB by default) with room to spare.
pub const TRANSACTION_TEXT_MAX: usize = 16 << 10;

/// The database held by `state` as SQL text: the tables with their rows, then the indexes,
/// views and triggers; rows in transactions of at most [`TRANSACTION_TEXT_MAX`] bytes of SQL
/// (a longer row alone). SQLite's own tables (`sqlite_*`) are left out.
pub fn dump(state: &dyn StateRead) -> Result<String, String> {
    let engine = Engine::new();
    engine.load(state)?;
    engine.read_tx(state, 0, |conn| {
        dump_conn(conn).map_err(|e| format!("reading the database: {e}"))
    })?
}

fn dump_conn(conn: &rusqlite::Connection) -> rusqlite::Result<String> {
    let mut out = Packer::default();
    out.text.push_str("-- redoubt sql-dump\n");
    let objects: Vec<(String, String, Option<String>)> = conn
        .prepare(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
             ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'index' THEN 1 WHEN 'view' THEN 2 ELSE 3 END, rowid",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    for (kind, name, sql) in &objects {
        // Indexes SQLite made for constraints have no SQL: the table's creates them.
        let Some(sql) = sql else { continue };
        out.alone(format!("{sql};\n"));
        if kind == "table" {
            rows(conn, name, &mut out)?;
        }
    }
    Ok(out.finish())
}

/// Statements packed into transactions of at most [`TRANSACTION_TEXT_MAX`] bytes.
#[derive(Default)]
struct Packer {
    text: String,
    open: String,
}

impl Packer {
    /// A statement that may share a transaction with its neighbours.
    fn row(&mut self, stmt: String) {
        if !self.open.is_empty() && self.open.len() + stmt.len() > TRANSACTION_TEXT_MAX {
            self.close();
        }
        self.open.push_str(&stmt);
    }

    /// A statement in no transaction of the dump's.
    fn alone(&mut self, stmt: String) {
        self.close();
        self.text.push_str(&stmt);
    }

    fn close(&mut self) {
        if !self.open.is_empty() {
            self.text.push_str("BEGIN;\n");
            self.text.push_str(&self.open);
            self.text.push_str("COMMIT;\n");
            self.open.clear();
        }
    }

    fn finish(mut self) -> String {
        self.close();
        self.text
    }
}

/// One `INSERT` per row of table `name`.
fn rows(conn: &rusqlite::Connection, name: &str, out: &mut Packer) -> rusqlite::Result<()> {
    let table = ident(name);
    let mut stmt = conn.prepare(&format!("SELECT * FROM {table}"))?;
    let columns: Vec<String> = stmt.column_names().map(ident).collect();
    let head = format!("INSERT INTO {table} ({}) VALUES (", columns.join(", "));
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let mut line = head.clone();
        for i in 0..columns.len() {
            if i > 0 {
                line.push_str(", ");
            }
            literal(row.get_ref(i)?, &mut line);
        }
        line.push_str(");\n");
        out.row(line);
    }
    Ok(())
}

/// `name` as a quoted identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A value as a PostgreSQL literal.
fn literal(v: ValueRef<'_>, out: &mut String) {
    match v {
        ValueRef::Null => out.push_str("NULL"),
        ValueRef::Integer(i) => {
            let _ = write!(out, "{i}");
        }
        ValueRef::Real(f) if f.is_finite() => {
            // Debug prints the shortest text that reads back as the same double, always
            // with a point or an exponent.
            let _ = write!(out, "{f:?}");
        }
        ValueRef::Real(f) => out.push_str(if f > 0.0 { "9e999" } else { "-9e999" }),
        ValueRef::Text(t) => {
            out.push('\'');
            out.push_str(&String::from_utf8_lossy(t).replace('\'', "''"));
            out.push('\'');
        }
        ValueRef::Blob(b) => {
            out.push_str("'\\x");
            for byte in b {
                let _ = write!(out, "{byte:02x}");
            }
            out.push_str("'::bytea");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{SqlOp, SqlReply, SqlService, Statement};
    use redoubt_core::{ExecContext, Service};
    use redoubt_state::FlatState;

    fn run(svc: &mut SqlService, state: &mut FlatState, sql: &str, n: u64) {
        let ctx = ExecContext {
            seq: n,
            client: 1,
            time_ms: 1_000 + n,
            batch_seed: n,
            index: 0,
        };
        let op = SqlOp::Write {
            stmts: vec![Statement::new(sql)],
            expect: vec![None],
        }
        .encode();
        let reply = SqlReply::decode(&svc.execute(state, &op, &ctx)).unwrap();
        assert!(matches!(reply, SqlReply::Done(_)), "{sql}: {reply:?}");
    }

    #[test]
    fn a_dump_read_back_into_an_empty_database_gives_the_same_dump() {
        let mut svc = SqlService::new();
        let mut state = FlatState::new(4 << 20);
        let setup = [
            "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, score REAL, data BLOB)",
            "INSERT INTO t VALUES (1, 'it''s', 1.5, x'00ff10')",
            "INSERT INTO t VALUES (2, NULL, 0.1, NULL)",
            "INSERT INTO t VALUES (3, 'back\\slash \"q\"', -2e300, x'')",
            "CREATE INDEX t_name ON t (name)",
            "CREATE VIEW v AS SELECT id FROM t WHERE score > 0",
        ];
        for (n, sql) in setup.iter().enumerate() {
            run(&mut svc, &mut state, sql, n as u64 + 1);
        }
        let text = dump(&state).unwrap();
        assert!(text.contains("INSERT INTO \"t\" (\"id\", \"name\", \"score\", \"data\") VALUES (1, 'it''s', 1.5, '\\x00ff10'::bytea);"), "{text}");
        assert!(text.contains("VALUES (2, NULL, 0.1, NULL);"), "{text}");
        assert!(text.contains("-2e300"), "{text}");
        assert!(text.find("CREATE INDEX").unwrap() > text.find("INSERT").unwrap());
        assert!(text.contains("BEGIN;\nINSERT"), "{text}");

        // The service's own SQL (no gateway) reads the blobs back from SQLite's x'' form.
        let sqlite_text = text.replace("'\\x", "x'").replace("'::bytea", "'");
        let mut svc2 = SqlService::new();
        let mut state2 = FlatState::new(4 << 20);
        for (n, stmt) in sqlite_text
            .lines()
            .filter(|l| !l.starts_with("--") && *l != "BEGIN;" && *l != "COMMIT;")
            .enumerate()
        {
            run(
                &mut svc2,
                &mut state2,
                stmt.trim_end_matches(';'),
                n as u64 + 1,
            );
        }
        assert_eq!(dump(&state2).unwrap(), text);
    }

    #[test]
    fn an_empty_state_dumps_to_an_empty_transaction() {
        let state = FlatState::new(1 << 20);
        assert_eq!(dump(&state).unwrap(), "-- redoubt sql-dump\n");
    }

    #[test]
    fn rows_go_in_transactions_of_bounded_text() {
        let mut p = Packer::default();
        let row = format!("{};\n", "x".repeat(1000));
        for _ in 0..40 {
            p.row(row.clone());
        }
        p.alone("CREATE INDEX i ON t (x);\n".into());
        p.row("y".repeat(TRANSACTION_TEXT_MAX + 5));
        let text = p.finish();
        let txs: Vec<&str> = text.split("BEGIN;\n").skip(1).collect();
        assert_eq!(txs.len(), 4, "16 + 16 + 8 rows, then the long one alone");
        for tx in &txs[..3] {
            assert!(tx.len() <= TRANSACTION_TEXT_MAX + "COMMIT;\n".len() + 30);
        }
        let index = text.find("CREATE INDEX").unwrap();
        assert!(
            text[..index].ends_with("COMMIT;\n"),
            "the index outside any transaction"
        );
    }
}
