//! Real PostgreSQL drivers through `redoubt sql-gateway` in front of a real 4-replica SQL
//! cluster: psycopg2, psycopg 3 and SQLAlchemy (core and ORM) run `tests/sql_drivers/
//! drivers.py` in a venv the test makes under the cargo target dir, and the real `psql`
//! answers `\dt`, `\d TABLE` and `\l`.
//!
//! The test installs what it needs (`pip install psycopg2-binary psycopg[binary]
//! sqlalchemy`); it is skipped, saying why, only when `python3` itself is absent. A failing
//! `pip` fails it.

mod common;

use common::{start_gateway, Cluster};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A venv with the drivers, made (or brought up to date) under the cargo target dir.
fn venv() -> Option<PathBuf> {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED sql_drivers: python3 is not installed");
        return None;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sqlgw-venv");
    let python = dir.join("bin").join("python");
    if !python.exists() {
        let st = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&dir)
            .status()
            .expect("python3 -m venv");
        assert!(st.success(), "python3 -m venv {} failed", dir.display());
    }
    let st = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(["psycopg2-binary", "psycopg[binary]", "sqlalchemy"])
        .status()
        .expect("pip install");
    assert!(
        st.success(),
        "pip install psycopg2-binary psycopg[binary] sqlalchemy failed"
    );
    Some(python)
}

fn psql(addr: &str, args: &[&str]) -> (bool, String) {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let out = common::output_within(
        {
            let mut c = Command::new("psql");
            c.args([
                "-h", host, "-p", port, "-U", "tester", "-d", "redoubt", "-X",
            ])
            .args(args)
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null());
            c
        },
        Duration::from_secs(30),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_drivers_work_through_the_gateway() {
    let Some(python) = venv() else { return };
    let cluster = Cluster::start_init(&["--service", "sql"], 8).await;
    let gw = start_gateway(&cluster, "5-8");
    let (host, port) = gw.addr.rsplit_once(':').expect("host:port");
    let script = cluster.dir.path().join("drivers.py");
    std::fs::write(&script, include_str!("sql_drivers/drivers.py")).expect("script");
    let out = common::output_within(
        {
            let mut c = Command::new(&python);
            c.arg(&script)
                .env("GW_HOST", host)
                .env("GW_PORT", port)
                .stdin(Stdio::null());
            c
        },
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "drivers.py failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        cluster.logs_hint()
    );

    if Command::new("psql").arg("--version").output().is_err() {
        eprintln!("psql is not installed: its \\d commands are not checked");
        return;
    }
    let (ok, text) = psql(&gw.addr, &["-c", "\\dt"]);
    assert!(ok, "psql \\dt: {text}");
    for table in ["p2", "p3", "sa_users", "sa_notes"] {
        assert!(text.contains(table), "\\dt lists {table}: {text}");
    }
    let (ok, text) = psql(&gw.addr, &["-c", "\\d p3"]);
    assert!(ok, "psql \\d p3: {text}");
    assert!(text.contains("Table \"public.p3\""), "{text}");
    for column in ["id", "ts", "tz", "ok"] {
        assert!(text.contains(column), "\\d p3 lists {column}: {text}");
    }
    assert!(text.contains("timestamptz"), "{text}");
    let (ok, text) = psql(&gw.addr, &["-l"]);
    assert!(ok, "psql -l: {text}");
    assert!(text.contains("redoubt"), "{text}");
    let (ok, text) = psql(&gw.addr, &["-c", "\\df"]);
    assert!(!ok, "psql \\df: {text}");
    assert!(text.contains("not supported"), "psql \\df: {text}");
    drop(gw);
}
