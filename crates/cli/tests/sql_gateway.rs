//! `redoubt sql-gateway` in front of a real 4-replica cluster hosting the SQL service, driven
//! by an ordinary PostgreSQL client (tokio-postgres): schema, parameters in both protocols,
//! transaction blocks, a serialization conflict between two connections, a join, errors
//! with their SQLSTATEs, the connection limit, and the primary killed mid-way.

mod common;

use common::{start_gateway, Cluster};

use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

async fn connect(addr: &str) -> Result<Client, tokio_postgres::Error> {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let (client, conn) = tokio_postgres::connect(
        &format!("host={host} port={port} user=tester dbname=bank connect_timeout=10"),
        NoTls,
    )
    .await?;
    tokio::spawn(conn);
    Ok(client)
}

/// [`connect`], waiting (at most 10 s) for a client id to come back to the pool: a closed
/// connection returns its id once the gateway has seen it close.
async fn connect_when_free(addr: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match connect(addr).await {
            Ok(c) => return c,
            Err(e) if code(&e) == Some(&SqlState::TOO_MANY_CONNECTIONS) => {
                assert!(Instant::now() < deadline, "no client id came back");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("connect: {e:?}"),
        }
    }
}

fn code(e: &tokio_postgres::Error) -> Option<&SqlState> {
    e.code()
}

/// The command tags (`CommandComplete` row counts) and rows of a simple query.
fn completes(msgs: &[SimpleQueryMessage]) -> Vec<u64> {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::CommandComplete(n) => Some(*n),
            _ => None,
        })
        .collect()
}

async fn balances(c: &Client) -> Vec<(i64, String, i64)> {
    c.query("SELECT id, owner, balance FROM accounts ORDER BY id", &[])
        .await
        .expect("select balances")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_clients_use_the_replicated_database_through_the_gateway() {
    let t0 = Instant::now();
    let mut cluster = Cluster::start_init(&["--service", "sql"], 8).await;
    let gw = start_gateway(&cluster, "5-7");
    let c1 = connect(&gw.addr).await.expect("connect 1");

    // Schema and rows through the simple protocol: one implicit transaction.
    let msgs = c1
        .simple_query(
            "CREATE TABLE owners (name TEXT PRIMARY KEY, city TEXT NOT NULL);
             CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT NOT NULL
                 REFERENCES owners(name), balance INTEGER NOT NULL CHECK (balance >= 0));
             INSERT INTO owners VALUES ('alice', 'Paris'), ('bob', 'Oslo'), ('carol', 'Lima');",
        )
        .await
        .expect("create schema");
    assert_eq!(completes(&msgs), [0, 0, 3]);

    // Extended protocol: typed parameters (binary) and untyped ones (text).
    let insert = c1
        .prepare_typed(
            "INSERT INTO accounts (id, owner, balance) VALUES ($1, $2, $3)",
            &[Type::INT8, Type::TEXT, Type::INT8],
        )
        .await
        .expect("prepare insert");
    for (id, owner, balance) in [(1i64, "alice", 100i64), (2, "bob", 50), (3, "carol", 75)] {
        let n = c1
            .execute(&insert, &[&id, &owner, &balance])
            .await
            .expect("insert");
        assert_eq!(n, 1);
    }
    let n = c1
        .execute(
            "UPDATE accounts SET balance = balance + 5 WHERE owner = $1",
            &[&"carol"],
        )
        .await
        .expect("update with a text parameter");
    assert_eq!(n, 1);
    assert_eq!(
        balances(&c1).await,
        [
            (1, "alice".into(), 100),
            (2, "bob".into(), 50),
            (3, "carol".into(), 80)
        ]
    );

    // A transaction block through the driver's API: a transfer.
    {
        let mut c = connect(&gw.addr).await.expect("connect 2");
        let tx = c.transaction().await.expect("begin");
        let funds: i64 = tx
            .query_one("SELECT balance FROM accounts WHERE id = 1", &[])
            .await
            .expect("read in a transaction")
            .get(0);
        assert_eq!(funds, 100);
        let move_money = tx
            .prepare_typed(
                "UPDATE accounts SET balance = balance + $2 WHERE id = $1",
                &[Type::INT8, Type::INT8],
            )
            .await
            .expect("prepare in a transaction");
        tx.execute(&move_money, &[&1i64, &-30i64])
            .await
            .expect("debit");
        tx.execute(&move_money, &[&2i64, &30i64])
            .await
            .expect("credit");
        // The transaction sees its own writes; others do not until it commits.
        let mine: i64 = tx
            .query_one("SELECT balance FROM accounts WHERE id = 1", &[])
            .await
            .expect("read own write")
            .get(0);
        assert_eq!(mine, 70);
        assert_eq!(balances(&c1).await[0].2, 100, "uncommitted write visible");
        tx.commit().await.expect("commit");
    }
    assert_eq!(balances(&c1).await[0].2, 70);
    assert_eq!(balances(&c1).await[1].2, 80);

    // A multi-statement block in one simple query; a failed statement fails the block.
    let msgs = c1
        .simple_query(
            "BEGIN; UPDATE accounts SET balance = balance - 10 WHERE id = 3; \
             UPDATE accounts SET balance = balance + 10 WHERE id = 1; COMMIT",
        )
        .await
        .expect("block");
    assert_eq!(completes(&msgs), [0, 1, 1, 0]);
    // An interactive transaction whose first statement writes.
    c1.batch_execute("BEGIN; UPDATE accounts SET balance = 0 WHERE id = 1")
        .await
        .expect("begin");
    let e = c1
        .batch_execute("UPDATE accounts SET balance = -1 WHERE id = 2")
        .await
        .expect_err("the check constraint fails");
    assert_eq!(code(&e), Some(&SqlState::CHECK_VIOLATION), "{e:?}");
    let e = c1
        .batch_execute("SELECT 1")
        .await
        .expect_err("failed transaction");
    assert_eq!(
        code(&e),
        Some(&SqlState::IN_FAILED_SQL_TRANSACTION),
        "{e:?}"
    );
    c1.batch_execute("COMMIT")
        .await
        .expect("commit of a failed block rolls back");
    assert_eq!(
        balances(&c1).await[0].2,
        80,
        "the failed block left nothing"
    );

    // Two interleaved transactions on the same row: the second commit must fail with 40001.
    let c2 = connect_when_free(&gw.addr).await;
    c1.batch_execute("BEGIN").await.expect("begin 1");
    let b1: i64 = c1
        .query_one("SELECT balance FROM accounts WHERE id = 2", &[])
        .await
        .expect("read 1")
        .get(0);
    assert_eq!(b1, 80);
    c1.execute(
        "UPDATE accounts SET balance = balance + 1 WHERE id = 2",
        &[],
    )
    .await
    .expect("write 1");
    c2.batch_execute("BEGIN; UPDATE accounts SET balance = balance + 100 WHERE id = 2; COMMIT")
        .await
        .expect("the first commit wins");
    let e = c1.batch_execute("COMMIT").await.expect_err("conflict");
    assert_eq!(
        code(&e),
        Some(&SqlState::T_R_SERIALIZATION_FAILURE),
        "{e:?}"
    );
    assert_eq!(
        balances(&c1).await[1].2,
        b1 + 100,
        "only the first commit applied"
    );

    // Errors carry their SQLSTATE; the connection stays usable.
    let e = c1
        .query("SELECT * FROM nowhere", &[])
        .await
        .expect_err("no table");
    assert_eq!(code(&e), Some(&SqlState::UNDEFINED_TABLE), "{e:?}");
    let e = c1
        .batch_execute("INSERT INTO accounts VALUES (1, 'alice', 1)")
        .await
        .expect_err("duplicate key");
    assert_eq!(code(&e), Some(&SqlState::UNIQUE_VIOLATION), "{e:?}");

    // Every client id is in use (c1, c2 and one more): the next connection is refused.
    let c3 = connect_when_free(&gw.addr).await;
    let e = connect(&gw.addr).await.expect_err("a fourth connection");
    assert_eq!(code(&e), Some(&SqlState::TOO_MANY_CONNECTIONS), "{e:?}");
    drop(c3);

    // The primary dies; the same connections keep working after the view change.
    cluster.kill(0);
    let killed = Instant::now();
    c2.execute(
        "INSERT INTO accounts (id, owner, balance) VALUES (4, $1, 5)",
        &[&"bob"],
    )
    .await
    .expect("insert after the primary died");
    eprintln!("first write after the kill took {:?}", killed.elapsed());
    c1.batch_execute("BEGIN; UPDATE accounts SET balance = balance + 1 WHERE id = 4; COMMIT")
        .await
        .expect("transaction after the primary died");

    // A join, read back through a new connection (c3's client id was returned).
    let c4 = connect_when_free(&gw.addr).await;
    let rows = c4
        .query(
            "SELECT o.city, count(*), sum(a.balance) FROM accounts a \
             JOIN owners o ON o.name = a.owner GROUP BY o.city ORDER BY o.city",
            &[],
        )
        .await
        .expect("join");
    // Expressions have no declared type: the extended protocol announces them as text.
    let got: Vec<(String, i64, i64)> = rows
        .iter()
        .map(|r| {
            let n: String = r.get(1);
            let sum: String = r.get(2);
            (r.get(0), n.parse().unwrap(), sum.parse().unwrap())
        })
        .collect();
    let bob = b1 + 100;
    assert_eq!(
        got,
        [
            ("Lima".to_string(), 1, 70),
            ("Oslo".to_string(), 2, bob + 6),
            ("Paris".to_string(), 1, 80)
        ]
    );
    // The simple protocol sends the same sum as text.
    let msgs = c4
        .simple_query("SELECT sum(balance) AS total FROM accounts")
        .await
        .expect("sum");
    let SimpleQueryMessage::Row(row) = &msgs[1] else {
        panic!("{msgs:?}")
    };
    assert_eq!(
        row.get("total"),
        Some((70 + bob + 6 + 80).to_string().as_str())
    );
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t0.elapsed()
    );
}
