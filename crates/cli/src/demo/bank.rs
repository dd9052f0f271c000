//! The demo's SQL workload (`redoubt demo --service sql`), a Jepsen-style bank: clients move
//! money between accounts in serializable transactions while replicas are killed and
//! restarted; audits read the total on the read-only path. The checks: the total is always
//! the initial total, no balance goes negative, every acknowledged transfer is in the
//! transfer log (and nothing that was never attempted), and every balance equals its initial
//! amount plus what the log moved in and out.

use super::{lock, Workload};
use redoubt_client::sql::{SqlClient, SqlClientError};
use redoubt_services::sql::{Statement, StmtResult, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Accounts in the bank.
pub const ACCOUNTS: i64 = 16;
/// Each account's opening balance.
pub const OPENING: i64 = 1_000;
/// How long the schema may take to be created (the cluster just came up).
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// What a client did, for the verification.
#[derive(Default)]
pub struct BankRecord {
    /// Transfers whose commit was acknowledged.
    pub acked: BTreeSet<String>,
    /// Transfers whose commit was sent but never acknowledged (may or may not have happened).
    pub unknown: BTreeSet<String>,
    /// Transactions refused with a serialization conflict (and retried as new transfers).
    pub conflicts: u64,
}

fn sql_error(e: &SqlClientError) -> bool {
    matches!(
        e,
        SqlClientError::Sql { .. } | SqlClientError::UnexpectedReply(_)
    )
}

/// Creates the accounts and the transfer log (idempotent: a retry after a lost reply finds
/// them there).
pub async fn setup(sql: &SqlClient) -> Result<(), String> {
    let mut stmts = vec![
        Statement::new(
            "CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, \
             balance INTEGER NOT NULL CHECK (balance >= 0))",
        ),
        Statement::new(
            "CREATE TABLE IF NOT EXISTS transfers (id TEXT PRIMARY KEY, src INTEGER NOT NULL \
             REFERENCES accounts(id), dst INTEGER NOT NULL REFERENCES accounts(id), \
             amount INTEGER NOT NULL, at TEXT NOT NULL)",
        ),
    ];
    for a in 0..ACCOUNTS {
        stmts.push(Statement::with_params(
            "INSERT OR IGNORE INTO accounts VALUES ($1, $2)",
            vec![Value::Integer(a), Value::Integer(OPENING)],
        ));
    }
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        match sql.write(stmts.clone(), vec![]).await {
            Ok(_) => return Ok(()),
            Err(e) if sql_error(&e) => return Err(format!("creating the bank: {e}")),
            Err(e) if Instant::now() >= deadline => return Err(format!("creating the bank: {e}")),
            Err(_) => {}
        }
    }
}

/// Starts the PostgreSQL gateway in this process for every second client id (2, 4, ...) on
/// a free loopback port; returns those ids and the address.
pub async fn gateway(
    cfg: &redoubt_config::ClusterConfig,
    clients: u32,
) -> anyhow::Result<(Vec<u64>, std::net::SocketAddr)> {
    let ids: Vec<u64> = (1..=u64::from(clients)).filter(|c| c % 2 == 0).collect();
    let setups = ids
        .iter()
        .map(|&c| redoubt_client::ClientSetup::from_cluster(cfg, c))
        .collect::<Result<Vec<_>, _>>()?;
    if setups.is_empty() {
        return Ok((ids, std::net::SocketAddr::from(([127, 0, 0, 1], 0))));
    }
    let gw = redoubt_sqlgw::Gateway::bind(redoubt_sqlgw::GatewayConfig {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        clients: setups,
    })
    .await?;
    let addr = gw.local_addr()?;
    // Serves until the demo's process ends.
    tokio::spawn(gw.run(std::future::pending()));
    Ok((ids, addr))
}

/// A Postgres driver's connection to the gateway at `addr`.
pub async fn pg_connect(addr: std::net::SocketAddr) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(
        &format!(
            "host={} port={} user=demo dbname=bank",
            addr.ip(),
            addr.port()
        ),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(connection);
    Ok(client)
}

/// A small deterministic generator per client (which accounts, how much).
struct Pick(u64);

impl Pick {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn int(r: &StmtResult) -> Option<i64> {
    match r.rows.first().and_then(|row| row.first()) {
        Some(Value::Integer(i)) => Some(*i),
        _ => None,
    }
}

/// How a client reaches the database: the Rust client, or a PostgreSQL driver through the
/// gateway (`redoubt sql-gateway`, run in the demo's process).
pub enum Conn {
    Direct(SqlClient),
    Pg(tokio_postgres::Client),
}

/// Why an operation did not complete.
enum Fault {
    /// Another transfer touched the same rows first: nothing happened.
    Conflict,
    /// The database refused it (nothing happened): never expected here.
    Refused(String),
    /// No certified answer: it may or may not have taken effect.
    Unknown(String),
}

impl From<SqlClientError> for Fault {
    fn from(e: SqlClientError) -> Fault {
        match e {
            SqlClientError::Conflict { .. } => Fault::Conflict,
            SqlClientError::Client(_) => Fault::Unknown(e.to_string()),
            e => Fault::Refused(e.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for Fault {
    fn from(e: tokio_postgres::Error) -> Fault {
        use tokio_postgres::error::SqlState;
        match e.code() {
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE => Fault::Conflict,
            // Connection-class codes and a closed connection: the outcome is unknown.
            Some(c) if c.code().starts_with("08") || c.code() == "57014" => {
                Fault::Unknown(e.to_string())
            }
            None => Fault::Unknown(e.to_string()),
            Some(_) => Fault::Refused(format!(
                "{e}: {}",
                e.as_db_error().map_or("", |d| d.message())
            )),
        }
    }
}

/// One client: transfers between random accounts, with an audit of the total every few.
pub async fn client_loop(w: Arc<Workload>, idx: usize, mut conn: Conn) {
    let c = idx + 1;
    let record = &w.clients[idx];
    let mut pick = Pick(c as u64 * 7919);
    let mut seq: u64 = 0;
    while !w.stop.load(Relaxed) {
        seq += 1;
        let t0 = Instant::now();
        let done = if seq.is_multiple_of(4) {
            match conn.audit().await {
                Ok(row) if row == [OPENING * ACCOUNTS, ACCOUNTS, 0] => Ok(false),
                Ok(row) => {
                    lock(record).anomalies.push(format!(
                        "audit read (total, accounts, negative) = {row:?}, expected [{}, {ACCOUNTS}, 0]",
                        OPENING * ACCOUNTS
                    ));
                    continue;
                }
                Err(e) => Err(e),
            }
        } else {
            let src = pick.next(ACCOUNTS as u64) as i64;
            let dst = (src + 1 + pick.next(ACCOUNTS as u64 - 1) as i64) % ACCOUNTS;
            let amount = 1 + pick.next(50) as i64;
            let id = format!("c{c}-t{seq}");
            let bank = &w.bank[idx];
            let r = conn
                .transfer(&id, src, dst, amount, || {
                    lock(bank).unknown.insert(id.clone());
                })
                .await;
            let mut b = lock(bank);
            match &r {
                Ok(_) => {
                    if b.unknown.remove(&id) {
                        b.acked.insert(id.clone());
                    }
                }
                Err(Fault::Conflict | Fault::Refused(_)) => {
                    b.unknown.remove(&id);
                }
                Err(Fault::Unknown(_)) => {}
            }
            r.map(|()| true)
        };
        match done {
            Ok(transfer) => {
                w.completed(t0);
                let mut r = lock(record);
                r.record(t0);
                if transfer {
                    r.puts += 1;
                } else {
                    r.reads += 1;
                }
            }
            Err(Fault::Conflict) => lock(&w.bank[idx]).conflicts += 1,
            Err(Fault::Refused(e)) => {
                w.failed.fetch_add(1, Relaxed);
                let mut r = lock(record);
                r.anomalies.push(format!("unexpected answer: {e}"));
                r.last_error = Some(e);
            }
            Err(Fault::Unknown(e)) => {
                w.failed.fetch_add(1, Relaxed);
                lock(record).last_error = Some(e);
            }
        }
    }
}

const READ_BALANCE: &str = "SELECT balance FROM accounts WHERE id = $1";
const SET_BALANCE: &str = "UPDATE accounts SET balance = $1 WHERE id = $2";
const LOG_TRANSFER: &str = "INSERT INTO transfers VALUES ($1, $2, $3, $4, datetime('now'))";
const AUDIT: &str = "SELECT sum(balance), count(*), sum(balance < 0) FROM accounts";

impl Conn {
    /// One serializable transfer: read both balances, write the new absolute balances if the
    /// money is there, log it. Read-modify-write, as applications do: only serializability
    /// keeps two concurrent transfers from losing one's update (and the total with it).
    /// `committing` runs just before the commit is sent.
    async fn transfer(
        &mut self,
        id: &str,
        src: i64,
        dst: i64,
        amount: i64,
        committing: impl FnOnce(),
    ) -> Result<(), Fault> {
        match self {
            Conn::Direct(sql) => {
                let mut tx = sql.transaction();
                let mut bal = [0i64; 2];
                for (i, acct) in [src, dst].into_iter().enumerate() {
                    let r = tx
                        .run(Statement::with_params(
                            READ_BALANCE,
                            vec![Value::Integer(acct)],
                        ))
                        .await?;
                    bal[i] = int(&r).unwrap_or(0);
                }
                if bal[0] < amount {
                    return Ok(()); // not enough money: nothing to do
                }
                for (acct, new) in [(src, bal[0] - amount), (dst, bal[1] + amount)] {
                    tx.run(Statement::with_params(
                        SET_BALANCE,
                        vec![Value::Integer(new), Value::Integer(acct)],
                    ))
                    .await?;
                }
                tx.run(Statement::with_params(
                    LOG_TRANSFER,
                    vec![
                        Value::Text(id.into()),
                        Value::Integer(src),
                        Value::Integer(dst),
                        Value::Integer(amount),
                    ],
                ))
                .await?;
                committing();
                Ok(tx.commit().await?)
            }
            Conn::Pg(pg) => {
                use tokio_postgres::types::Type;
                let tx = pg.transaction().await?;
                let mut bal = [0i64; 2];
                for (i, acct) in [src, dst].into_iter().enumerate() {
                    let rows = tx.query_typed(READ_BALANCE, &[(&acct, Type::INT8)]).await?;
                    bal[i] = rows.first().map_or(0, |r| r.get::<_, i64>(0));
                }
                if bal[0] < amount {
                    return Ok(());
                }
                for (acct, new) in [(src, bal[0] - amount), (dst, bal[1] + amount)] {
                    tx.query_typed(SET_BALANCE, &[(&new, Type::INT8), (&acct, Type::INT8)])
                        .await?;
                }
                tx.query_typed(
                    LOG_TRANSFER,
                    &[
                        (&id, Type::TEXT),
                        (&src, Type::INT8),
                        (&dst, Type::INT8),
                        (&amount, Type::INT8),
                    ],
                )
                .await?;
                committing();
                Ok(tx.commit().await?)
            }
        }
    }

    /// (total, accounts, accounts below zero), on the read-only path.
    async fn audit(&mut self) -> Result<[i64; 3], Fault> {
        let cells: Vec<Option<i64>> = match self {
            Conn::Direct(sql) => {
                let r = sql.query(Statement::new(AUDIT)).await?;
                let row = r.rows.into_iter().next().unwrap_or_default();
                row.iter()
                    .map(|v| match v {
                        Value::Integer(i) => Some(*i),
                        _ => None,
                    })
                    .collect()
            }
            Conn::Pg(pg) => {
                let msgs = pg.simple_query(AUDIT).await?;
                let row = msgs.iter().find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                    _ => None,
                });
                (0..3)
                    .map(|i| row.and_then(|r| r.get(i)).and_then(|v| v.parse().ok()))
                    .collect()
            }
        };
        match cells.as_slice() {
            [Some(a), Some(b), Some(c)] => Ok([*a, *b, *c]),
            _ => Err(Fault::Refused(format!("audit returned {cells:?}"))),
        }
    }
}

/// The final check (see the module documentation).
pub async fn verify(w: &Workload, sql: &SqlClient) -> Result<String, String> {
    let mut problems: Vec<String> = Vec::new();
    for r in &w.clients {
        problems.extend(lock(r).anomalies.iter().cloned());
    }
    let read = |q: &'static str| async move {
        tokio::time::timeout(super::VERIFY_READ_TIMEOUT, sql.query(Statement::new(q)))
            .await
            .map_err(|_| format!("no answer to `{q}`"))?
            .map_err(|e| format!("`{q}`: {e}"))
    };
    let mut direct = Conn::Direct(sql.clone());
    match tokio::time::timeout(super::VERIFY_READ_TIMEOUT, direct.audit()).await {
        Ok(Ok(row)) if row == [OPENING * ACCOUNTS, ACCOUNTS, 0] => {}
        Ok(Ok(row)) => problems.push(format!("final audit (total, accounts, negative) = {row:?}")),
        Ok(Err(Fault::Conflict)) => problems.push("final audit: conflict".into()),
        Ok(Err(Fault::Refused(e) | Fault::Unknown(e))) => {
            problems.push(format!("final audit: {e}"))
        }
        Err(_) => problems.push("final audit: no answer".into()),
    }
    let log = read("SELECT id, src, dst, amount FROM transfers").await?;
    let balances = read("SELECT id, balance FROM accounts ORDER BY id").await?;
    let mut logged = BTreeSet::new();
    let mut expected: BTreeMap<i64, i64> = (0..ACCOUNTS).map(|a| (a, OPENING)).collect();
    for row in &log.rows {
        if let [Value::Text(id), Value::Integer(s), Value::Integer(d), Value::Integer(a)] =
            row.as_slice()
        {
            logged.insert(id.clone());
            *expected.entry(*s).or_default() -= a;
            *expected.entry(*d).or_default() += a;
        } else {
            problems.push(format!("malformed transfer row {row:?}"));
        }
    }
    let (mut acked, mut unknown_done, mut conflicts) = (0usize, 0usize, 0u64);
    // Clients 2, 4, ... went through the gateway.
    let mut via_gateway = 0usize;
    for (idx, b) in w.bank.iter().enumerate() {
        let b = lock(b);
        conflicts += b.conflicts;
        for id in &b.acked {
            acked += 1;
            via_gateway += usize::from((idx + 1) % 2 == 0);
            if !logged.contains(id) {
                problems.push(format!("acknowledged transfer {id} is not in the log"));
            }
        }
        unknown_done += b.unknown.iter().filter(|id| logged.contains(*id)).count();
    }
    let mut attempted = BTreeSet::new();
    for b in &w.bank {
        let b = lock(b);
        attempted.extend(b.acked.iter().cloned());
        attempted.extend(b.unknown.iter().cloned());
    }
    for id in &logged {
        if !attempted.contains(id) {
            problems.push(format!(
                "transfer {id} is in the log but was never committed by its client"
            ));
        }
    }
    for row in &balances.rows {
        if let [Value::Integer(a), Value::Integer(bal)] = row.as_slice() {
            if expected.get(a) != Some(bal) {
                problems.push(format!(
                    "account {a} holds {bal} but the transfer log gives {}",
                    expected.get(a).copied().unwrap_or(0)
                ));
            }
        }
    }
    super::outcome(problems, || {
        format!(
            "total conserved ({} in {ACCOUNTS} accounts), all {acked} acknowledged transfers \
             ({via_gateway} through the PostgreSQL gateway) in the log, balances match the log ({} transfers logged, {unknown_done} of them unacknowledged; \
             {conflicts} conflicts retried)",
            OPENING * ACCOUNTS,
            logged.len()
        )
    })
}
