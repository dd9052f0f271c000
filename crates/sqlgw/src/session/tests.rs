//! The session state machine over a scripted backend: which calls reach the service, the
//! outcomes and the transaction status after each query.

use super::*;
use crate::testing::Fake;

/// The outcomes as short strings: the tag, `!CODE` for an error, `warn CODE` first.
fn show_outcomes(out: &[Outcome]) -> Vec<String> {
    out.iter()
        .map(|o| match o {
            Outcome::Rows { tag, .. } => tag.clone(),
            Outcome::Command {
                tag,
                warning: Some(w),
            } => format!("warn {} {tag}", w.code),
            Outcome::Command { tag, .. } => tag.clone(),
            Outcome::Error(e) => format!("!{}", e.code),
        })
        .collect()
}

#[tokio::test]
async fn a_multi_statement_query_outside_a_block_is_one_call() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    let out = s
        .simple("CREATE TABLE t (a INT); INSERT INTO t VALUES (1); SELECT a FROM t;")
        .await;
    assert_eq!(
        show_outcomes(&out),
        ["CREATE TABLE", "INSERT 0 1", "SELECT 1"]
    );
    assert_eq!(
        fake.take_calls(),
        ["execute CREATE TABLE t (a INT) | INSERT INTO t VALUES (1) | SELECT a FROM t"]
    );
    assert_eq!(s.status(), TxStatus::Idle);
    assert!(s.simple("  ;; -- nothing\n").await.is_empty());
    assert!(fake.take_calls().is_empty());
}

#[tokio::test]
async fn an_error_in_an_implicit_transaction_stops_the_query() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    let out = s
        .simple("INSERT INTO t VALUES (1); SELECT * FROM fail; INSERT INTO t VALUES (2)")
        .await;
    assert_eq!(show_outcomes(&out), ["!42P01"]);
    // All three went in one call (the service rolled all of them back).
    assert_eq!(fake.take_calls().len(), 1);
    assert_eq!(s.status(), TxStatus::Idle);
    // Statements before a BEGIN run on their own; the error stops the rest.
    let out = s.simple("SELECT 1; BEGIN; SELECT fail; SELECT 2").await;
    assert_eq!(show_outcomes(&out), ["SELECT 1", "BEGIN", "!42P01"]);
    assert_eq!(
        fake.take_calls(),
        ["execute SELECT 1", "begin", "run SELECT fail"]
    );
    assert_eq!(s.status(), TxStatus::Failed);
}

#[tokio::test]
async fn a_transaction_block_runs_each_statement_then_commits_them_all() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    assert_eq!(show_outcomes(&s.simple("BEGIN").await), ["BEGIN"]);
    assert_eq!(s.status(), TxStatus::InTransaction);
    let out = s.simple("UPDATE t SET a = 2; SELECT a FROM t").await;
    assert_eq!(show_outcomes(&out), ["UPDATE 1", "SELECT 1"]);
    assert_eq!(s.status(), TxStatus::InTransaction);
    assert_eq!(show_outcomes(&s.simple("COMMIT").await), ["COMMIT"]);
    assert_eq!(s.status(), TxStatus::Idle);
    assert_eq!(
        fake.take_calls(),
        [
            "begin",
            "run UPDATE t SET a = 2",
            "run SELECT a FROM t",
            "commit UPDATE t SET a = 2 | SELECT a FROM t"
        ]
    );
    // START TRANSACTION ... END in one query string.
    let out = s
        .simple("START TRANSACTION; INSERT INTO t VALUES (3); END")
        .await;
    assert_eq!(show_outcomes(&out), ["BEGIN", "INSERT 0 1", "COMMIT"]);
    assert_eq!(s.status(), TxStatus::Idle);
}

#[tokio::test]
async fn a_whole_block_in_one_query_is_one_call() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    let out = s
        .simple("INSERT INTO t VALUES (0); BEGIN; UPDATE t SET a = 1; SELECT a FROM t; COMMIT; SELECT 2")
        .await;
    assert_eq!(
        show_outcomes(&out),
        [
            "INSERT 0 1",
            "BEGIN",
            "UPDATE 1",
            "SELECT 1",
            "COMMIT",
            "SELECT 1"
        ]
    );
    assert_eq!(
        fake.take_calls(),
        [
            "execute INSERT INTO t VALUES (0)",
            "execute UPDATE t SET a = 1 | SELECT a FROM t",
            "execute SELECT 2"
        ]
    );
    assert_eq!(s.status(), TxStatus::Idle);
    // A failure skips the rest, COMMIT included: the block stays open and failed.
    let out = s
        .simple("BEGIN; INSERT INTO t VALUES (1); SELECT * FROM fail; COMMIT; SELECT 3")
        .await;
    assert_eq!(show_outcomes(&out), ["BEGIN", "!42P01"]);
    assert_eq!(s.status(), TxStatus::Failed);
    assert_eq!(fake.take_calls().len(), 1);
    assert_eq!(show_outcomes(&s.simple("ROLLBACK").await), ["ROLLBACK"]);
    // Without its COMMIT in the same query, a block runs statement by statement.
    s.simple("BEGIN; UPDATE t SET a = 2").await;
    assert_eq!(fake.take_calls(), ["begin", "run UPDATE t SET a = 2"]);
    assert_eq!(s.status(), TxStatus::InTransaction);
}

#[tokio::test]
async fn a_failed_transaction_ignores_statements_until_its_end() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    s.simple("BEGIN; INSERT INTO t VALUES (1)").await;
    assert_eq!(
        show_outcomes(&s.simple("SELECT * FROM fail").await),
        ["!42P01"]
    );
    assert_eq!(s.status(), TxStatus::Failed);
    fake.take_calls();
    for q in ["SELECT 1", "SET x = 1", "SHOW server_version", "BEGIN"] {
        assert_eq!(show_outcomes(&s.simple(q).await), ["!25P02"], "{q}");
        assert_eq!(s.status(), TxStatus::Failed);
    }
    assert!(fake.take_calls().is_empty(), "nothing reaches the service");
    // COMMIT of a failed transaction rolls back, as in PostgreSQL.
    assert_eq!(show_outcomes(&s.simple("COMMIT").await), ["ROLLBACK"]);
    assert_eq!(s.status(), TxStatus::Idle);
    assert!(fake.take_calls().is_empty(), "no commit was sent");
    s.simple("BEGIN; SELECT fail").await;
    assert_eq!(show_outcomes(&s.simple("ROLLBACK").await), ["ROLLBACK"]);
    assert_eq!(s.status(), TxStatus::Idle);
}

#[tokio::test]
async fn a_conflicting_commit_is_40001_and_ends_the_transaction() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    s.simple("BEGIN; UPDATE t SET a = a + 1").await;
    fake.conflict.store(true, Ordering::Relaxed);
    let out = s.simple("COMMIT").await;
    assert_eq!(show_outcomes(&out), ["!40001"]);
    assert_eq!(s.status(), TxStatus::Idle);
}

#[tokio::test]
async fn transaction_control_out_of_place_warns_like_postgresql() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    assert_eq!(
        show_outcomes(&s.simple("COMMIT").await),
        ["warn 25P01 COMMIT"]
    );
    assert_eq!(
        show_outcomes(&s.simple("ROLLBACK").await),
        ["warn 25P01 ROLLBACK"]
    );
    let out = s.simple("BEGIN; BEGIN").await;
    assert_eq!(show_outcomes(&out), ["BEGIN", "warn 25001 BEGIN"]);
    assert_eq!(s.status(), TxStatus::InTransaction);
    assert_eq!(fake.take_calls(), ["begin"], "one transaction");
}

#[tokio::test]
async fn set_show_and_unsupported_statements_stay_in_the_gateway() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    let out = s
        .simple("SET client_encoding = 'UTF8'; SHOW transaction_isolation")
        .await;
    assert_eq!(show_outcomes(&out), ["SET", "SHOW"]);
    let Outcome::Rows { result, .. } = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(result.rows, vec![vec![Value::Text("serializable".into())]]);
    assert_eq!(show_outcomes(&s.simple("SHOW work_mem").await), ["!0A000"]);
    assert_eq!(
        show_outcomes(&s.simple("COPY t FROM STDIN").await),
        ["!0A000"]
    );
    assert!(fake.take_calls().is_empty());
    // Inside a block, an unsupported statement fails the transaction.
    s.simple("BEGIN").await;
    assert_eq!(
        show_outcomes(&s.simple("COPY t TO STDOUT").await),
        ["!0A000"]
    );
    assert_eq!(s.status(), TxStatus::Failed);
}

#[tokio::test]
async fn savepoints_forget_the_statements_rolled_back_to() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    // Outside a block, as in PostgreSQL: 25P01.
    assert_eq!(show_outcomes(&s.simple("SAVEPOINT a").await), ["!25P01"]);
    let out = s
        .simple("BEGIN; INSERT INTO t VALUES (1); SAVEPOINT a; INSERT INTO t VALUES (2)")
        .await;
    assert_eq!(
        show_outcomes(&out),
        ["BEGIN", "INSERT 0 1", "SAVEPOINT", "INSERT 0 1"]
    );
    assert_eq!(
        show_outcomes(&s.simple("ROLLBACK TO SAVEPOINT a").await),
        ["ROLLBACK"]
    );
    // An error after a savepoint fails the block until ROLLBACK TO.
    assert_eq!(show_outcomes(&s.simple("SELECT fail").await), ["!42P01"]);
    assert_eq!(s.status(), TxStatus::Failed);
    assert_eq!(show_outcomes(&s.simple("SELECT 1").await), ["!25P02"]);
    assert_eq!(show_outcomes(&s.simple("ROLLBACK TO b").await), ["!3B001"]);
    assert_eq!(s.status(), TxStatus::Failed);
    assert_eq!(
        show_outcomes(&s.simple("ROLLBACK TO a").await),
        ["ROLLBACK"]
    );
    assert_eq!(s.status(), TxStatus::InTransaction);
    let out = s
        .simple("SAVEPOINT b; INSERT INTO t VALUES (3); RELEASE SAVEPOINT b; RELEASE a")
        .await;
    assert_eq!(
        show_outcomes(&out),
        ["SAVEPOINT", "INSERT 0 1", "RELEASE", "RELEASE"]
    );
    assert_eq!(show_outcomes(&s.simple("RELEASE a").await), ["!3B001"]);
    s.simple("ROLLBACK").await;
    let out = s
        .simple("BEGIN; INSERT INTO t VALUES (1); SAVEPOINT a; INSERT INTO t VALUES (2); RELEASE a; COMMIT")
        .await;
    assert_eq!(out.len(), 6, "{out:?}");
    let calls = fake.take_calls();
    assert!(calls.contains(&"rollback_to 1".to_string()), "{calls:?}");
    // The commit holds what was not rolled back: 1 and 3, then 1 and 2.
    assert!(
        calls.contains(&"commit INSERT INTO t VALUES (1) | INSERT INTO t VALUES (2)".to_string()),
        "{calls:?}"
    );
    // Without a savepoint, an error drops the transaction: ROLLBACK TO finds nothing.
    s.simple("BEGIN; SELECT fail").await;
    assert_eq!(show_outcomes(&s.simple("ROLLBACK TO a").await), ["!3B001"]);
    assert_eq!(show_outcomes(&s.simple("ROLLBACK").await), ["ROLLBACK"]);
}

#[tokio::test]
async fn deallocate_and_translated_statements() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    assert_eq!(
        show_outcomes(&s.simple("DEALLOCATE ALL; DEALLOCATE p1").await),
        ["DEALLOCATE ALL", "DEALLOCATE"]
    );
    assert_eq!(
        show_outcomes(&s.simple("SELECT $1::int").await)[0],
        "SELECT 1"
    );
    assert_eq!(fake.take_calls(), ["execute SELECT CAST($1 AS INTEGER)"]);
    // An untranslatable statement fails the whole query before anything runs.
    assert_eq!(
        show_outcomes(&s.simple("INSERT INTO t VALUES (1); SELECT ARRAY[1]").await),
        ["!0A000"]
    );
    assert!(fake.take_calls().is_empty());
    let p = s.prepare("SELECT $1::int").await.unwrap().unwrap();
    assert_eq!(p.sql, "SELECT CAST($1 AS INTEGER)");
    assert_eq!(p.params, 1);
}

#[tokio::test]
async fn prepare_describes_service_statements_only() {
    let fake = Fake::default();
    let mut s = Session::new(&fake);
    let p = s.prepare("SELECT $1, $2;").await.unwrap().unwrap();
    assert_eq!(p.sql, "SELECT $1, $2");
    assert_eq!(p.params, 2);
    assert_eq!(p.columns.as_ref().map(Vec::len), Some(2));
    assert_eq!(fake.take_calls(), ["describe SELECT $1, $2"]);
    let p = s.prepare("BEGIN").await.unwrap().unwrap();
    assert_eq!(
        (p.command, p.params, p.columns),
        (Command::Begin, 0, Some(vec![]))
    );
    assert!(fake.take_calls().is_empty());
    assert_eq!(s.prepare("-- nothing").await, Ok(None));
    assert_eq!(
        s.prepare("SELECT 1; SELECT 2").await.unwrap_err().code,
        "42601"
    );
    // Outside a transaction a statement that does not describe is an error at once...
    assert_eq!(
        s.prepare("INSERT INTO new_table VALUES ($1)")
            .await
            .unwrap_err()
            .code,
        "42P01"
    );
    // ...inside one it may use a table the transaction created: its columns are unknown.
    s.simple("BEGIN; CREATE TABLE new_table (a INT)").await;
    let p = s
        .prepare("INSERT INTO new_table VALUES ($1, $2)")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((p.params, p.columns), (2, None));
    let out = s
        .execute(
            p.command,
            Statement::with_params(p.sql, vec![Value::Integer(1), Value::Null]),
        )
        .await;
    assert_eq!(show_outcomes(&[out]), ["INSERT 0 1"]);
    s.simple("SELECT fail").await;
    assert_eq!(s.prepare("SELECT 1").await.unwrap_err().code, "25P02");
}

#[tokio::test]
async fn a_spawned_session_returns_its_guard_when_the_handle_is_gone() {
    let (tx, rx) = oneshot::channel::<()>();
    struct Guard(Option<oneshot::Sender<()>>);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.take().map(|t| t.send(()));
        }
    }
    let h = spawn(Fake::default(), Guard(Some(tx)));
    let (out, status) = h.simple("BEGIN; SELECT 1".into()).await;
    assert_eq!(show_outcomes(&out), ["BEGIN", "SELECT 1"]);
    assert_eq!(status, TxStatus::InTransaction);
    // An error the session did not see fails the open transaction before the next request.
    h.note_error();
    let (out, status) = h.execute(Command::Sql, Statement::new("SELECT 2")).await;
    assert_eq!(show_outcomes(&[out]), ["!25P02"]);
    assert_eq!(status, TxStatus::Failed);
    assert_eq!(h.simple("ROLLBACK".into()).await.1, TxStatus::Idle);
    h.simple("BEGIN".into()).await;
    assert_eq!(h.abort().await, TxStatus::Failed);
    drop(h);
    tokio::time::timeout(std::time::Duration::from_secs(5), rx)
        .await
        .expect("the guard is dropped")
        .expect("sent");
}
