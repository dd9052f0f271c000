//! The demo's SQL workload (`redoubt demo --service sql`), a Jepsen-style bank: clients move
//! money between accounts in serializable transactions while replicas are killed and
//! restarted; audits read the total on the read-only path. The checks: the total is always
//! the initial total, no balance goes negative, every acknowledged transfer is in the
//! transfer log (and nothing that was never attempted), and every balance equals its initial
//! amount plus what the log moved in and out.

use super::{lock, Workload};
use redoubt_services::sql::{SqlClient, SqlClientError, Statement, StmtResult, Value};
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

/// One client: transfers between random accounts, with an audit of the total every few.
pub async fn client_loop(w: Arc<Workload>, idx: usize, sql: SqlClient) {
    let c = idx + 1;
    let record = &w.clients[idx];
    let mut pick = Pick(c as u64 * 7919);
    let mut seq: u64 = 0;
    while !w.stop.load(Relaxed) {
        seq += 1;
        let t0 = Instant::now();
        if seq.is_multiple_of(4) {
            match audit(&sql).await {
                Ok(()) => {
                    w.completed(t0);
                    let mut r = lock(record);
                    r.latencies_us.push(t0.elapsed().as_micros() as u64);
                    r.reads += 1;
                }
                Err(Audit::Wrong(msg)) => lock(record).anomalies.push(msg),
                Err(Audit::Failed(e)) => fail(&w, idx, e),
            }
            continue;
        }
        let src = pick.next(ACCOUNTS as u64) as i64;
        let dst = (src + 1 + pick.next(ACCOUNTS as u64 - 1) as i64) % ACCOUNTS;
        let amount = 1 + pick.next(50) as i64;
        let id = format!("c{c}-t{seq}");
        match transfer(&sql, &id, src, dst, amount, &w, idx).await {
            Ok(()) => {
                w.completed(t0);
                let mut r = lock(record);
                r.latencies_us.push(t0.elapsed().as_micros() as u64);
                r.puts += 1;
            }
            // Another transfer touched the same rows first: nothing happened; go on.
            Err(SqlClientError::Conflict { .. }) => lock(&w.bank[idx]).conflicts += 1,
            Err(e) => fail(&w, idx, e),
        }
    }
}

fn fail(w: &Workload, idx: usize, e: SqlClientError) {
    w.failed.fetch_add(1, Relaxed);
    let mut r = lock(&w.clients[idx]);
    if sql_error(&e) {
        r.anomalies.push(format!("unexpected answer: {e}"));
    }
    r.last_error = Some(e.to_string());
}

/// One serializable transfer: read the source balance, move the money if it is there, log
/// it. A conflict (another transfer touched the same rows first) means nothing happened.
async fn transfer(
    sql: &SqlClient,
    id: &str,
    src: i64,
    dst: i64,
    amount: i64,
    w: &Workload,
    idx: usize,
) -> Result<(), SqlClientError> {
    // Read-modify-write with absolute balances, as applications do: only serializability
    // keeps two concurrent transfers from losing one's update (and the total with it).
    let mut tx = sql.transaction();
    let mut bal = [0i64; 2];
    for (i, acct) in [src, dst].into_iter().enumerate() {
        let r = tx
            .run(Statement::with_params(
                "SELECT balance FROM accounts WHERE id = $1",
                vec![Value::Integer(acct)],
            ))
            .await?;
        bal[i] = int(&r).unwrap_or(0);
    }
    if bal[0] < amount {
        return Ok(()); // not enough money: nothing to do (the transaction is dropped)
    }
    for (acct, new) in [(src, bal[0] - amount), (dst, bal[1] + amount)] {
        tx.run(Statement::with_params(
            "UPDATE accounts SET balance = $1 WHERE id = $2",
            vec![Value::Integer(new), Value::Integer(acct)],
        ))
        .await?;
    }
    tx.run(Statement::with_params(
        "INSERT INTO transfers VALUES ($1, $2, $3, $4, datetime('now'))",
        vec![
            Value::Text(id.into()),
            Value::Integer(src),
            Value::Integer(dst),
            Value::Integer(amount),
        ],
    ))
    .await?;
    lock(&w.bank[idx]).unknown.insert(id.to_string());
    match tx.commit().await {
        Ok(()) => {
            let mut b = lock(&w.bank[idx]);
            b.unknown.remove(id);
            b.acked.insert(id.to_string());
            Ok(())
        }
        Err(e @ (SqlClientError::Conflict { .. } | SqlClientError::Sql { .. })) => {
            lock(&w.bank[idx]).unknown.remove(id);
            Err(e)
        }
        Err(e) => Err(e),
    }
}

enum Audit {
    Wrong(String),
    Failed(SqlClientError),
}

async fn audit(sql: &SqlClient) -> Result<(), Audit> {
    let r = sql
        .query(Statement::new(
            "SELECT sum(balance), count(*), sum(balance < 0) FROM accounts",
        ))
        .await
        .map_err(Audit::Failed)?;
    let row = r.rows.first().cloned().unwrap_or_default();
    let want = [
        Value::Integer(OPENING * ACCOUNTS),
        Value::Integer(ACCOUNTS),
        Value::Integer(0),
    ];
    if row != want {
        return Err(Audit::Wrong(format!(
            "audit read (total, accounts, negative) = {row:?}, expected {want:?}"
        )));
    }
    Ok(())
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
    match tokio::time::timeout(super::VERIFY_READ_TIMEOUT, audit(sql)).await {
        Ok(Ok(())) => {}
        Ok(Err(Audit::Wrong(m))) => problems.push(m),
        Ok(Err(Audit::Failed(e))) => problems.push(format!("final audit: {e}")),
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
    for b in &w.bank {
        let b = lock(b);
        conflicts += b.conflicts;
        for id in &b.acked {
            acked += 1;
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
            "total conserved ({} in {ACCOUNTS} accounts), all {acked} acknowledged transfers in the log, \
             balances match the log ({} transfers logged, {unknown_done} of them unacknowledged; \
             {conflicts} conflicts retried)",
            OPENING * ACCOUNTS,
            logged.len()
        )
    })
}
