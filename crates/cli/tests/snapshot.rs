//! Backup and restore through the real `redoubt` binary: `redoubt snapshot` against a running
//! cluster with one replica down, `--verify` of the file and of a damaged copy, a new cluster
//! started from it with `redoubt init --from-snapshot`; for SQL, `redoubt sql-dump` restored
//! with `psql -f` through the gateway.

mod common;

use common::{output_within, redoubt, start_gateway, Cluster};
use redoubt_client::kv::KvClient;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(8);
const LIMIT: Duration = Duration::from_secs(90);

/// (exit code, stdout, stderr).
fn run(cmd: Command) -> (Option<i32>, String, String) {
    let out = output_within(cmd, LIMIT);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn snapshot(config: &Path, replica: u32, out: &Path) -> (Option<i32>, String, String) {
    let mut cmd = redoubt();
    cmd.args(["snapshot", "--replica", &replica.to_string()])
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out);
    run(cmd)
}

fn verify(file: &Path) -> (Option<i32>, String, String) {
    let mut cmd = redoubt();
    cmd.arg("snapshot").arg("--verify").arg(file);
    run(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vouched_snapshot_restores_into_a_new_cluster() {
    let mut cluster = Cluster::start(1).await;
    let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    // Enough writes for checkpoints past the first (one every `checkpoint_interval`).
    let before = 400;
    for i in 0..before {
        kv.put(format!("key-{i:04}"), format!("value-{i}").into_bytes())
            .await
            .expect("put");
    }
    // A replica down: the other three still vouch.
    cluster.kill(3);
    let file = cluster.config_path().with_file_name("backup.rdsnap");
    let (code, out, err) = snapshot(cluster.config_path(), 1, &file);
    assert_eq!(code, Some(0), "{out}{err}{}", cluster.logs_hint());
    assert!(out.contains("vouched for by replicas"), "{out}");
    assert!(err.contains("node 3"), "the replica down is named: {err}");
    // Writes after the snapshot are not in it.
    for i in 0..20 {
        kv.put(format!("late-{i}"), b"after".to_vec())
            .await
            .expect("put after the snapshot");
    }
    drop(kv);
    cluster.stop_all();

    let (code, out, err) = verify(&file);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("kv service"), "{out}");
    let damaged = file.with_file_name("damaged.rdsnap");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0x40;
    std::fs::write(&damaged, &bytes).unwrap();
    let (code, _, err) = verify(&damaged);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not the"), "names the digest mismatch: {err}");

    let file_arg = file.display().to_string();
    let restored = Cluster::start_init(&["--from-snapshot", &file_arg], 1).await;
    let kv = KvClient::connect(restored.client_setup(1, DEADLINE))
        .await
        .expect("client of the new cluster");
    // The snapshot holds a prefix of the writes (one client, one at a time): those up to its
    // checkpoint.
    let mut present = 0;
    for i in 0..before {
        let got = kv.get(format!("key-{i:04}")).await.expect("get");
        if let Some(v) = got {
            assert_eq!(present, i, "key-{i:04} present after a missing one");
            assert_eq!(v, format!("value-{i}").into_bytes());
            present += 1;
        }
    }
    assert!(
        present >= 128,
        "only {present} of {before} writes in the snapshot"
    );
    assert_eq!(kv.get("late-0").await.expect("get"), None);
    // The new cluster takes writes.
    kv.put("fresh", b"new".to_vec()).await.expect("put");
    assert_eq!(kv.get("fresh").await.expect("get"), Some(b"new".to_vec()));
    eprintln!("{present} of {before} writes restored");
}

async fn pg(addr: &str) -> tokio_postgres::Client {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let (client, conn) = tokio_postgres::connect(
        &format!("host={host} port={port} user=t dbname=d connect_timeout=10"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the gateway");
    tokio::spawn(conn);
    client
}

/// Every row of `acct` as text, by id.
async fn accounts(addr: &str) -> Vec<String> {
    let c = pg(addr).await;
    c.simple_query("SELECT id, owner, balance, opened, note, ratio FROM acct ORDER BY id")
        .await
        .expect("select")
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            ),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sql_snapshot_dumps_to_sql_that_psql_restores() {
    let cluster = Cluster::start_init(&["--service", "sql"], 2).await;
    let gw = start_gateway(&cluster, "1-2");
    let c = pg(&gw.addr).await;
    c.batch_execute(
        "CREATE TABLE acct (id SERIAL PRIMARY KEY, owner TEXT NOT NULL, balance NUMERIC(10,2), \
         opened TIMESTAMP, note TEXT, ratio DOUBLE PRECISION)",
    )
    .await
    .expect("create");
    c.batch_execute("CREATE INDEX acct_owner ON acct (owner)")
        .await
        .expect("index");
    for i in 0..300 {
        let note = match i % 3 {
            0 => "NULL".to_string(),
            1 => format!("'it''s line {i}\nand a second'"),
            _ => format!("'{}'", "long ".repeat(200)),
        };
        c.batch_execute(&format!(
            "INSERT INTO acct (owner, balance, opened, note, ratio) VALUES \
             ('owner {i}', {i}.25, '2026-01-0{} 10:00:00', {note}, {})",
            i % 9 + 1,
            i as f64 / 7.0
        ))
        .await
        .expect("insert");
    }
    drop(c);
    let file = cluster.config_path().with_file_name("sql.rdsnap");
    let (code, out, err) = snapshot(cluster.config_path(), 0, &file);
    assert_eq!(code, Some(0), "{out}{err}");
    let dump = file.with_file_name("dump.sql");
    let mut cmd = redoubt();
    cmd.arg("sql-dump").arg(&file).arg("--out").arg(&dump);
    let (code, out, err) = run(cmd);
    assert_eq!(code, Some(0), "{out}{err}");
    let text = std::fs::read_to_string(&dump).unwrap();
    assert!(text.contains("CREATE INDEX acct_owner"), "{}", &text[..500]);
    let expected: Vec<String> = accounts(&gw.addr)
        .await
        .into_iter()
        .take(text.matches("INSERT INTO").count())
        .collect();
    assert!(expected.len() >= 100, "{} rows in the dump", expected.len());

    // A kv snapshot is refused by sql-dump with the reason.
    let mut cmd = redoubt();
    let kv = dump.with_file_name("not-a-snapshot");
    std::fs::write(&kv, b"nothing").unwrap();
    cmd.arg("sql-dump").arg(&kv);
    let (code, _, err) = run(cmd);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not a redoubt snapshot"), "{err}");

    // Started from the snapshot: the same rows.
    let file_arg = file.display().to_string();
    let restored = Cluster::start_init(&["--from-snapshot", &file_arg], 2).await;
    let gw2 = start_gateway(&restored, "1-2");
    assert_eq!(accounts(&gw2.addr).await, expected);

    // Restored from the dump into an empty cluster with psql: the same rows.
    if Command::new("psql").arg("--version").output().is_err() {
        eprintln!("psql is not installed: the dump is not restored with it");
        return;
    }
    let empty = Cluster::start_init(&["--service", "sql"], 2).await;
    let gw3 = start_gateway(&empty, "1-2");
    let (host, port) = gw3.addr.rsplit_once(':').unwrap();
    let mut psql = Command::new("psql");
    psql.args(["-h", host, "-p", port, "-U", "t", "-d", "d", "-X", "-q"])
        .args(["-v", "ON_ERROR_STOP=1", "-f"])
        .arg(&dump)
        .env("PGCONNECT_TIMEOUT", "10");
    let (code, out, err) = run(psql);
    assert_eq!(code, Some(0), "psql -f: {out}{err}");
    assert_eq!(accounts(&gw3.addr).await, expected);
    // Ids go on after the restored ones.
    let c = pg(&gw3.addr).await;
    let rows = c
        .simple_query("INSERT INTO acct (owner) VALUES ('new') RETURNING id")
        .await
        .expect("insert after the restore");
    let id = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    });
    assert_eq!(id, Some((expected.len() + 1).to_string()));
}

/// A separated deployment: the execution nodes hold the state, g+1 of them vouch, and a new
/// separated cluster starts from the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_node_snapshot_restores_into_a_new_separated_cluster() {
    let mut cluster = Cluster::start_separated(1, 3).await;
    let kv = KvClient::connect(cluster.client_setup(1, DEADLINE))
        .await
        .expect("client");
    for i in 0..200 {
        kv.put(format!("key-{i:04}"), format!("value-{i}").into_bytes())
            .await
            .expect("put");
    }
    drop(kv);
    let file = cluster.config_path().with_file_name("sep.rdsnap");
    let (code, out, err) = snapshot(cluster.config_path(), 0, &file);
    assert_eq!(code, Some(1), "--replica refused: {out}{err}");
    assert!(err.contains("--executor"), "{err}");
    let mut cmd = redoubt();
    cmd.args(["snapshot", "--executor", "2", "--config"])
        .arg(cluster.config_path())
        .arg("--out")
        .arg(&file);
    let (code, out, err) = run(cmd);
    assert_eq!(code, Some(0), "{out}{err}{}", cluster.logs_hint());
    assert!(out.contains("vouched for by execution nodes"), "{out}");
    cluster.stop_all();
    for e in 0..3 {
        cluster.kill_executor(e);
    }

    let file_arg = file.display().to_string();
    let restored = Cluster::start_init_separated(&["--from-snapshot", &file_arg], 1, 3).await;
    let kv = KvClient::connect(restored.client_setup(1, DEADLINE))
        .await
        .expect("client of the new cluster");
    let got = kv.get("key-0000").await.expect("get");
    assert_eq!(got, Some(b"value-0".to_vec()));
}
