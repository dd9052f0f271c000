use super::*;
use redoubt_state::FlatState;

const MIB: u64 = 1 << 20;

fn ctx(seq: u64) -> ExecContext {
    ExecContext {
        seq,
        client: 1,
        time_ms: 1_700_000_000_000 + seq,
        batch_seed: 42 + seq,
        index: 0,
    }
}

struct Db {
    svc: SqlService,
    state: FlatState,
    seq: u64,
}

impl Db {
    fn new(size: u64) -> Db {
        let state = FlatState::new(size);
        let mut svc = SqlService::new();
        svc.load(&state).unwrap();
        Db { svc, state, seq: 0 }
    }

    fn op(&mut self, op: SqlOp) -> SqlReply {
        self.seq += 1;
        let r = self
            .svc
            .execute(&mut self.state, &op.encode(), &ctx(self.seq));
        SqlReply::decode(&r).unwrap()
    }

    fn write(&mut self, sqls: &[&str]) -> SqlReply {
        self.op(SqlOp::Write {
            stmts: sqls.iter().map(|s| Statement::new(*s)).collect(),
            expect: vec![],
        })
    }

    fn read_only(&self, op: SqlOp) -> SqlReply {
        SqlReply::decode(
            &self
                .svc
                .execute_read_only(&self.state, &op.encode())
                .unwrap(),
        )
        .unwrap()
    }

    fn query(&self, sql: &str) -> StmtResult {
        match self.read_only(SqlOp::Read {
            prefix: vec![],
            expect: vec![],
            stmts: vec![Statement::new(sql)],
            transaction: false,
        }) {
            SqlReply::Done(mut r) => r.pop().unwrap(),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

fn done(r: SqlReply) -> Vec<StmtResult> {
    match r {
        SqlReply::Done(r) => r,
        other => panic!("expected Done, got {other:?}"),
    }
}

fn failed(r: SqlReply) -> (u32, SqlError) {
    match r {
        SqlReply::Failed { index, error } => (index, error),
        other => panic!("expected Failed, got {other:?}"),
    }
}

fn ints(r: &StmtResult) -> Vec<i64> {
    r.rows
        .iter()
        .map(|row| match row[0] {
            Value::Integer(i) => i,
            ref v => panic!("not an integer: {v:?}"),
        })
        .collect()
}

#[test]
fn tables_rows_and_joins_live_in_the_state() {
    let mut db = Db::new(4 * MIB);
    let r = done(db.write(&[
        "CREATE TABLE a (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
        "CREATE TABLE b (a_id INTEGER REFERENCES a(id), v REAL)",
        "INSERT INTO a (name) VALUES ('x'), ('y')",
        "INSERT INTO b VALUES (1, 1.5), (2, 2.5), (2, 3.0)",
    ]));
    assert_eq!(r[2].changes, 2);
    assert_eq!(r[2].verb, "INSERT");
    assert_eq!(r[0].changes, 0);
    let j = db.query(
        "SELECT a.name, sum(b.v) FROM a JOIN b ON b.a_id = a.id GROUP BY a.id ORDER BY a.id",
    );
    assert_eq!(
        j.rows,
        vec![
            vec![Value::Text("x".into()), Value::Real(1.5)],
            vec![Value::Text("y".into()), Value::Real(5.5)],
        ]
    );
    assert_eq!(j.columns[0].name, "name");
    assert_eq!(j.columns[0].decl_type.as_deref(), Some("TEXT"));
    // A fresh service over the same bytes sees the same database: nothing lives elsewhere.
    let mut other = SqlService::new();
    other.load(&db.state).unwrap();
    let r = other
        .execute_read_only(
            &db.state,
            &SqlOp::Read {
                prefix: vec![],
                expect: vec![],
                stmts: vec![Statement::new("SELECT count(*) FROM b")],
                transaction: false,
            }
            .encode(),
        )
        .unwrap();
    assert_eq!(ints(&done(SqlReply::decode(&r).unwrap())[0]), vec![3]);
}

#[test]
fn replicas_running_the_same_operations_hold_identical_bytes() {
    let script: &[&[&str]] = &[
        &["CREATE TABLE t (id INTEGER PRIMARY KEY, r INTEGER, at TEXT, blob BLOB)"],
        &["INSERT INTO t (r, at, blob) VALUES (random(), datetime('now'), randomblob(8))"],
        &[
            "INSERT INTO t (id) VALUES (9223372036854775807)",
            "INSERT INTO t (r) VALUES (1)",
        ],
        &[
            "UPDATE t SET r = r + 1 WHERE id > 1",
            "DELETE FROM t WHERE id = 9223372036854775807",
        ],
    ];
    let mut a = Db::new(2 * MIB);
    let mut b = Db::new(2 * MIB);
    for (i, step) in script.iter().enumerate() {
        let ra = a.write(step);
        // Replica b has a different history of local activity: read-only queries and a
        // reload between operations. None of it may show in what it writes.
        let _ = b.read_only(SqlOp::Read {
            prefix: vec![],
            expect: vec![],
            stmts: vec![Statement::new("SELECT random(), randomblob(4)")],
            transaction: false,
        });
        if i == 2 {
            b.svc.load(&b.state).unwrap();
        }
        let rb = b.write(step);
        assert_eq!(ra, rb, "step {i}");
        assert!(matches!(ra, SqlReply::Done(_)), "step {i}: {ra:?}");
    }
    assert!(
        a.state.bytes() == b.state.bytes(),
        "the replicas' states differ"
    );
    let t = a.query("SELECT at FROM t WHERE at IS NOT NULL");
    // The agreed time of operation 2, not the machine's clock.
    assert_eq!(
        t.rows,
        vec![vec![Value::Text("2023-11-14 22:13:20".into())]]
    );
}

#[test]
fn a_failed_statement_undoes_the_whole_operation() {
    let mut db = Db::new(MIB);
    done(db.write(&["CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)"]));
    let before = db.state.clone();
    let (index, e) = failed(db.write(&[
        "INSERT INTO t VALUES (1, 'a')",
        "INSERT INTO t VALUES (1, 'b')",
    ]));
    assert_eq!(index, 1);
    assert_eq!(e.kind, SqlErrorKind::UniqueViolation);
    assert_eq!(e.kind.sqlstate(), "23505");
    assert_eq!(
        db.query("SELECT count(*) FROM t").rows,
        vec![vec![Value::Integer(0)]]
    );
    assert_eq!(
        before.bytes()[DB_BASE as usize..],
        db.state.bytes()[DB_BASE as usize..]
    );
    let (_, e) = failed(db.write(&["INSERT INTO t VALUES (2, NULL)"]));
    assert_eq!(e.kind, SqlErrorKind::NotNullViolation);
    let (_, e) = failed(db.write(&["SELEC 1"]));
    assert_eq!(e.kind, SqlErrorKind::Syntax);
    let (_, e) = failed(db.write(&["SELECT * FROM nowhere"]));
    assert_eq!(e.kind, SqlErrorKind::UndefinedTable);
    assert_eq!(e.kind.sqlstate(), "42P01");
}

#[test]
fn reads_never_modify_the_state_and_writes_are_sent_back() {
    let mut db = Db::new(MIB);
    done(db.write(&["CREATE TABLE t (v INTEGER)", "INSERT INTO t VALUES (1)"]));
    let before = db.state.clone();
    assert_eq!(
        db.read_only(SqlOp::Read {
            prefix: vec![],
            expect: vec![],
            stmts: vec![Statement::new("INSERT INTO t VALUES (2)")],
            transaction: false,
        }),
        SqlReply::NotReadOnly
    );
    // Inside a transaction (a prefix) writes are seen by later statements, then dropped.
    let r = done(db.read_only(SqlOp::Read {
        prefix: vec![Statement::new("INSERT INTO t SELECT v + 1 FROM t")],
        expect: vec![],
        stmts: vec![
            Statement::new("INSERT INTO t VALUES (10)"),
            Statement::new("SELECT sum(v) FROM t"),
        ],
        transaction: true,
    }));
    assert_eq!(ints(&r[1]), vec![13]);
    assert_eq!(before, db.state);
    assert_eq!(ints(&db.query("SELECT sum(v) FROM t")), vec![1]);
    // A transaction's first statement may write: it is not sent back.
    let r = done(db.read_only(SqlOp::Read {
        prefix: vec![],
        expect: vec![],
        stmts: vec![Statement::new("UPDATE t SET v = 5")],
        transaction: true,
    }));
    assert_eq!(r[0].changes, 1);
    assert_eq!(before, db.state);
    // The service refuses a write on the read-only path outright.
    let w = SqlOp::Write {
        stmts: vec![Statement::new("DELETE FROM t")],
        expect: vec![],
    };
    assert!(db.svc.execute_read_only(&db.state, &w.encode()).is_none());
}

#[test]
fn a_transaction_commits_only_if_what_it_read_still_holds() {
    let mut db = Db::new(MIB);
    done(db.write(&[
        "CREATE TABLE acct (id INTEGER PRIMARY KEY, bal INTEGER NOT NULL)",
        "INSERT INTO acct VALUES (1, 100), (2, 100)",
    ]));
    // Client A reads account 1 inside a transaction...
    let read = Statement::new("SELECT bal FROM acct WHERE id = 1");
    let seen = done(db.read_only(SqlOp::Read {
        prefix: vec![],
        expect: vec![],
        stmts: vec![read.clone()],
        transaction: false,
    }));
    let digest = seen[0].digest();
    let update = Statement::with_params(
        "UPDATE acct SET bal = $1 WHERE id = 1",
        vec![Value::Integer(50)],
    );
    // ... client B withdraws first ...
    done(db.write(&["UPDATE acct SET bal = bal - 30 WHERE id = 1"]));
    // ... and A learns at once that it cannot commit, and its commit is refused.
    assert_eq!(
        db.read_only(SqlOp::Read {
            prefix: vec![read.clone()],
            expect: vec![Some(digest)],
            stmts: vec![update.clone()],
            transaction: true,
        }),
        SqlReply::Conflict { index: 0 }
    );
    let commit = SqlOp::Write {
        stmts: vec![read.clone(), update.clone()],
        expect: vec![Some(digest), None],
    };
    assert_eq!(db.op(commit), SqlReply::Conflict { index: 0 });
    assert_eq!(
        ints(&db.query("SELECT bal FROM acct WHERE id = 1")),
        vec![70]
    );
    // Rerun against what is there now: it commits.
    let seen = done(db.read_only(SqlOp::Read {
        prefix: vec![],
        expect: vec![],
        stmts: vec![read.clone()],
        transaction: false,
    }));
    let commit = SqlOp::Write {
        stmts: vec![read, update],
        expect: vec![Some(seen[0].digest()), None],
    };
    assert!(matches!(db.op(commit), SqlReply::Done(_)));
    assert_eq!(
        ints(&db.query("SELECT bal FROM acct WHERE id = 1")),
        vec![50]
    );
}

#[test]
fn parameters_bind_by_their_number() {
    let mut db = Db::new(MIB);
    done(db.write(&["CREATE TABLE t (a TEXT, b INTEGER)"]));
    done(db.op(SqlOp::Write {
        stmts: vec![Statement::with_params(
            "INSERT INTO t (b, a) VALUES ($2, $1)",
            vec![Value::Text("one".into()), Value::Integer(1)],
        )],
        expect: vec![],
    }));
    let r = db.query("SELECT a, b FROM t");
    assert_eq!(
        r.rows,
        vec![vec![Value::Text("one".into()), Value::Integer(1)]]
    );
    let (_, e) = failed(db.op(SqlOp::Write {
        stmts: vec![Statement::with_params(
            "INSERT INTO t VALUES ($1, $2)",
            vec![Value::Null],
        )],
        expect: vec![],
    }));
    assert_eq!(e.kind, SqlErrorKind::BadParameter);
    let (_, e) = failed(db.op(SqlOp::Write {
        stmts: vec![Statement::with_params(
            "INSERT INTO t VALUES (:a, 1)",
            vec![Value::Null],
        )],
        expect: vec![],
    }));
    assert_eq!(e.kind, SqlErrorKind::BadParameter);
    match db.read_only(SqlOp::Describe {
        sql: "SELECT a, b + 1 AS c FROM t WHERE b = $1".into(),
    }) {
        SqlReply::Described { params, columns } => {
            assert_eq!(params, 1);
            assert_eq!(columns[0].decl_type.as_deref(), Some("TEXT"));
            assert_eq!(columns[1].name, "c");
            assert_eq!(columns[1].decl_type, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn what_could_differ_between_replicas_is_refused() {
    let mut db = Db::new(MIB);
    done(db.write(&["CREATE TABLE t (v)"]));
    for sql in [
        "ATTACH DATABASE 'x.db' AS x",
        "PRAGMA writable_schema = ON",
        "PRAGMA foreign_keys = OFF",
        "PRAGMA page_size = 512",
        "CREATE TEMP TABLE tt (v)",
        "BEGIN",
        "COMMIT",
        "SAVEPOINT s",
        "VACUUM",
        "VACUUM INTO 'copy.db'",
        "SELECT total_changes()",
        "SELECT load_extension('x')",
    ] {
        let (_, e) = failed(db.write(&[sql]));
        assert_eq!(e.kind, SqlErrorKind::NotSupported, "{sql}: {e:?}");
    }
    // Reading the schema is fine.
    let r = db.query("PRAGMA table_info(t)");
    assert_eq!(r.rows.len(), 1);
}

#[test]
fn an_endless_query_stops_at_the_same_step_everywhere() {
    let mut db = Db::new(MIB);
    let endless =
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
    let (_, e) = failed(db.write(&[endless]));
    assert_eq!(e.kind, SqlErrorKind::StepLimit);
    assert_eq!(e.kind.sqlstate(), "57014");
    // The budget is per operation: the next one runs.
    done(db.write(&["CREATE TABLE t (v)"]));
    let r = db.read_only(SqlOp::Read {
        prefix: vec![],
        expect: vec![],
        stmts: vec![Statement::new(endless)],
        transaction: false,
    });
    assert_eq!(failed(r).1.kind, SqlErrorKind::StepLimit);
    // A result set over the reply limit is refused, not truncated.
    let big = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) \
               SELECT x, 'padding padding padding' FROM c";
    let r = db.read_only(SqlOp::Read {
        prefix: vec![],
        expect: vec![],
        stmts: vec![Statement::new(big)],
        transaction: false,
    });
    assert_eq!(failed(r).1.kind, SqlErrorKind::ResultTooLarge);
}

#[test]
fn a_full_database_refuses_the_write_and_keeps_the_rest() {
    let mut db = Db::new(256 * 1024);
    done(db.write(&["CREATE TABLE t (b BLOB)", "INSERT INTO t VALUES (x'01')"]));
    let (_, e) = failed(db.write(&["INSERT INTO t VALUES (randomblob(400000))"]));
    assert_eq!(e.kind, SqlErrorKind::Full, "{e:?}");
    assert!(e.message.contains("size_mib"), "{}", e.message);
    assert_eq!(ints(&db.query("SELECT count(*) FROM t")), vec![1]);
    done(db.write(&["INSERT INTO t VALUES (x'02')"]));
    assert_eq!(ints(&db.query("SELECT count(*) FROM t")), vec![2]);
}

#[test]
fn a_rolled_back_state_is_what_the_next_operation_sees() {
    let mut db = Db::new(MIB);
    done(db.write(&["CREATE TABLE t (v)", "INSERT INTO t VALUES (1)"]));
    let checkpoint = db.state.clone();
    done(db.write(&["INSERT INTO t VALUES (2)"]));
    assert_eq!(ints(&db.query("SELECT count(*) FROM t")), vec![2]);
    // The library rolls the state back (tentative execution, state transfer) and reloads.
    db.state = checkpoint;
    db.svc.load(&db.state).unwrap();
    assert_eq!(ints(&db.query("SELECT count(*) FROM t")), vec![1]);
    done(db.write(&["INSERT INTO t VALUES (3)"]));
    assert_eq!(ints(&db.query("SELECT v FROM t ORDER BY v")), vec![1, 3]);
}

#[test]
fn garbage_and_foreign_states_get_clear_errors() {
    let mut db = Db::new(MIB);
    db.seq += 1;
    let r = db
        .svc
        .execute(&mut db.state, b"\xff\xff\xff garbage", &ctx(db.seq));
    let (_, e) = failed(SqlReply::decode(&r).unwrap());
    assert_eq!(e.kind, SqlErrorKind::BadOperation);
    let r = db.svc.execute_read_only(&db.state, b"\x09").unwrap();
    assert_eq!(
        failed(SqlReply::decode(&r).unwrap()).1.kind,
        SqlErrorKind::BadOperation
    );
    let mut foreign = FlatState::new(MIB);
    redoubt_state::StateWrite::write(&mut foreign, 0, b"not a database");
    let err = SqlService::new().load(&foreign).unwrap_err();
    assert!(err.contains("magic"), "{err}");
}
