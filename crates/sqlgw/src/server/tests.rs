//! The gateway as PostgreSQL clients see it, over a scripted backend: tokio-postgres for
//! the extended protocol, and raw protocol messages for what drivers do not show (the
//! transaction status in ReadyForQuery, warnings).

use super::*;
use crate::testing::Fake;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

#[test]
fn tag_prefixes_leave_pgwire_the_row_count() {
    assert_eq!(tag_prefix("SELECT 3"), "SELECT");
    assert_eq!(tag_prefix("INSERT 0 2"), "INSERT 0");
    assert_eq!(tag_prefix("CREATE TABLE"), "CREATE TABLE");
    assert_eq!(tag_prefix("SHOW"), "SHOW");
}

/// A gateway over `pool` on a free port; it stops when the returned sender is dropped.
async fn gateway(pool: Vec<Fake>) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, pool, async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

async fn connect(addr: SocketAddr) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={} user=t", addr.port()),
        NoTls,
    )
    .await?;
    tokio::spawn(conn);
    Ok(client)
}

#[tokio::test]
async fn extended_protocol_parameters_reach_the_service_typed() {
    let fake = Fake::default();
    let (addr, _stop) = gateway(vec![fake.clone()]).await;
    let c = connect(addr).await.expect("connect");
    // The fake echoes a SELECT's parameters; undeclared columns are described as text.
    let stmt = c
        .prepare_typed(
            "SELECT $1, $2, $3, $4",
            &[Type::INT8, Type::BOOL, Type::FLOAT8, Type::BYTEA],
        )
        .await
        .expect("prepare");
    let row = c
        .query_one(&stmt, &[&-5i64, &true, &2.5f64, &vec![0u8, 255]])
        .await
        .expect("query");
    let got: Vec<String> = (0..4).map(|i| row.get(i)).collect();
    assert_eq!(got, ["-5", "1", "2.5", "\\x00ff"]);
    // Untyped parameters are text.
    let row = c
        .query_one("SELECT $1", &[&"hi"])
        .await
        .expect("text param");
    assert_eq!(row.get::<_, String>(0), "hi");
    let n = c
        .execute("INSERT INTO t VALUES ($1)", &[&"a"])
        .await
        .expect("insert");
    assert_eq!(n, 1);
    // A statement the service cannot describe fails at Parse, with its SQLSTATE.
    let e = c
        .prepare("SELECT * FROM fail")
        .await
        .expect_err("describe fails");
    assert_eq!(e.code(), Some(&SqlState::UNDEFINED_TABLE), "{e:?}");
    let e = c
        .prepare("SELECT 1; SELECT 2")
        .await
        .expect_err("two statements");
    assert_eq!(e.code(), Some(&SqlState::SYNTAX_ERROR), "{e:?}");
    let calls = fake.take_calls();
    assert!(
        calls.contains(&"execute INSERT INTO t VALUES ($1)".to_string()),
        "{calls:?}"
    );
}

#[tokio::test]
async fn connections_beyond_the_pool_are_refused_until_one_closes() {
    let (addr, _stop) = gateway(vec![Fake::default()]).await;
    let c1 = connect(addr).await.expect("first connection");
    let e = connect(addr).await.expect_err("second connection");
    assert_eq!(e.code(), Some(&SqlState::TOO_MANY_CONNECTIONS), "{e:?}");
    let message = e.as_db_error().map(|d| d.message()).unwrap_or_default();
    assert!(message.contains("1 client ids (--clients)"), "{message}");
    drop(c1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match connect(addr).await {
            Ok(c) => {
                c.simple_query("SELECT 1").await.expect("usable");
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Some(&SqlState::TOO_MANY_CONNECTIONS), "{e:?}");
                assert!(
                    std::time::Instant::now() < deadline,
                    "the id never came back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// A PostgreSQL frontend at the message level.
struct Raw(TcpStream);

/// A backend message: its type byte and body.
type Msg = (u8, Vec<u8>);

impl Raw {
    async fn connect(addr: SocketAddr) -> Raw {
        let mut r = Raw(TcpStream::connect(addr).await.expect("connect"));
        let mut body = 196608i32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0t\0\0");
        let mut m = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        m.extend_from_slice(&body);
        r.0.write_all(&m).await.expect("startup");
        let (_, status) = r.until_ready().await;
        assert_eq!(status, b'I');
        r
    }

    async fn send(&mut self, ty: u8, body: &[u8]) {
        let mut m = vec![ty];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend_from_slice(body);
        self.0.write_all(&m).await.expect("send");
    }

    /// Messages up to ReadyForQuery, and its transaction status.
    async fn until_ready(&mut self) -> (Vec<Msg>, u8) {
        let mut out = Vec::new();
        loop {
            let ty = self.0.read_u8().await.expect("type");
            let len = self.0.read_i32().await.expect("length") as usize;
            let mut body = vec![0; len - 4];
            self.0.read_exact(&mut body).await.expect("body");
            if ty == b'Z' {
                return (out, body[0]);
            }
            out.push((ty, body));
        }
    }

    async fn query(&mut self, sql: &str) -> (Vec<Msg>, u8) {
        self.send(b'Q', format!("{sql}\0").as_bytes()).await;
        self.until_ready().await
    }

    /// Parse, Bind, Execute and Sync of `sql` without parameters.
    async fn extended(&mut self, sql: &str) -> (Vec<Msg>, u8) {
        self.send(b'P', format!("\0{sql}\0\0\0").as_bytes()).await;
        self.send(b'B', b"\0\0\0\0\0\0\0\0").await;
        self.send(b'E', b"\0\0\0\0\0").await;
        self.send(b'S', b"").await;
        self.until_ready().await
    }
}

/// Short names of messages: the command tag of a CommandComplete, `E<code>` of an error,
/// `N<code>` of a notice, the type letter of the others.
fn names(msgs: &[Msg]) -> Vec<String> {
    let field = |body: &[u8], code: u8| {
        body.split(|b| *b == 0)
            .find(|f| f.first() == Some(&code))
            .map(|f| String::from_utf8_lossy(&f[1..]).to_string())
            .unwrap_or_default()
    };
    msgs.iter()
        .map(|(ty, body)| match ty {
            b'C' => String::from_utf8_lossy(&body[..body.len() - 1]).to_string(),
            b'E' => format!("E{}", field(body, b'C')),
            b'N' => format!("N{}", field(body, b'C')),
            other => (*other as char).to_string(),
        })
        .collect()
}

#[tokio::test]
async fn ready_for_query_carries_the_session_status() {
    let fake = Fake::default();
    let (addr, _stop) = gateway(vec![fake.clone()]).await;
    let mut r = Raw::connect(addr).await;
    let (m, st) = r.query("BEGIN").await;
    assert_eq!((names(&m), st), (vec!["BEGIN".to_string()], b'T'));
    let (m, st) = r.query("BEGIN").await;
    assert_eq!(
        names(&m),
        ["N25001", "BEGIN"],
        "a warning, as in PostgreSQL"
    );
    assert_eq!(st, b'T');
    let (m, st) = r.query("SELECT * FROM fail").await;
    assert_eq!((names(&m), st), (vec!["E42P01".to_string()], b'E'));
    let (m, st) = r.query("SELECT 1").await;
    assert_eq!((names(&m), st), (vec!["E25P02".to_string()], b'E'));
    let (m, st) = r.query("COMMIT").await;
    assert_eq!((names(&m), st), (vec!["ROLLBACK".to_string()], b'I'));
    let (m, st) = r.query("SELECT 1; SELECT 2").await;
    assert_eq!(names(&m), ["T", "D", "SELECT 1", "T", "D", "SELECT 1"]);
    assert_eq!(st, b'I');
    let (m, st) = r.query(" -- nothing\n;").await;
    assert_eq!((names(&m), st), (vec!["I".to_string()], b'I'));

    // The extended protocol: an error inside a block fails it...
    r.query("BEGIN; UPDATE t SET a = 1").await;
    let (m, st) = r.extended("SELECT * FROM fail").await;
    assert_eq!(names(&m), ["1", "2", "E42P01"]);
    assert_eq!(st, b'E');
    let (m, st) = r.extended("ROLLBACK").await;
    assert_eq!(names(&m), ["1", "2", "ROLLBACK"]);
    assert_eq!(st, b'I');
    // ...and a commit that conflicts ends it: the error, then Idle.
    r.query("BEGIN; UPDATE t SET a = 2").await;
    fake.conflict.store(true, Ordering::Relaxed);
    let (m, st) = r.extended("COMMIT").await;
    assert_eq!(names(&m), ["1", "2", "E40001"]);
    assert_eq!(st, b'I');
    fake.conflict.store(false, Ordering::Relaxed);
    let (m, st) = r.extended("SELECT 7").await;
    assert_eq!(names(&m), ["1", "2", "D", "SELECT 1"]);
    assert_eq!(st, b'I');
}

#[test]
fn only_reads_run_when_described() {
    assert!(super::reads_only("select count(*) from t"));
    assert!(super::reads_only("  (VALUES (1))"));
    assert!(super::reads_only("WITH x AS (SELECT 1) SELECT * FROM x"));
    assert!(!super::reads_only(
        "WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x"
    ));
    assert!(!super::reads_only(
        "INSERT INTO t VALUES (1) RETURNING id * 2"
    ));
    assert!(!super::reads_only("UPDATE t SET a = 1 RETURNING a + 1"));
}
