//! The CLI's contract with people and programs, through the real `redoubt` binary: clients
//! that refuse a cluster of another service, `init`'s next steps for the service it wrote,
//! the service in `redoubt status`, errors as JSON with `-o json`, logs without ANSI escapes,
//! host names in the cluster file, help texts, and the wording of a timed-out read.

mod common;

use common::{output_within, redoubt, Cluster};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

/// (exit code, stdout, stderr).
fn run(cmd: Command) -> (Option<i32>, String, String) {
    let out: Output = output_within(cmd, LIMIT);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `redoubt ARGS` with `--config config` after the subcommand.
fn with_config(config: &Path, args: &[&str]) -> Command {
    let mut cmd = redoubt();
    cmd.arg(args[0])
        .arg("--config")
        .arg(config)
        .args(&args[1..]);
    cmd
}

/// `redoubt init --service SERVICE` into `dir` with free ports and `path` as PATH; stdout.
fn init_service(dir: &Path, service: &str, clients: u32, path: &str) -> (PathBuf, String) {
    let base = redoubt_node::init::free_base_port(4).expect("free ports");
    let mut cmd = redoubt();
    cmd.env("PATH", path)
        .args(["init", "--service", service])
        .args(["--clients", &clients.to_string()])
        .args(["--base-port", &base.to_string()])
        .arg("--out")
        .arg(dir);
    let (code, out, err) = run(cmd);
    assert_eq!(code, Some(0), "{out}{err}");
    (dir.join("redoubt.toml"), out)
}

/// The JSON object a `-o json` command printed on stdout.
fn json_of(out: &str) -> serde_json::Value {
    assert_eq!(out.lines().count(), 1, "one line on stdout: {out:?}");
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

#[test]
fn clients_refuse_a_cluster_of_another_service() {
    let dir = tempfile::tempdir().unwrap();
    let sql = init_service(&dir.path().join("sql"), "sql", 2, "/usr/bin:/bin").0;
    let files = init_service(&dir.path().join("files"), "files", 1, "/usr/bin:/bin").0;
    let kv = init_service(&dir.path().join("kv"), "kv", 1, "/usr/bin:/bin").0;

    // `kv` on an SQL cluster: refused at once (nothing runs: no reply is ever waited for).
    let (code, out, err) = run(with_config(&sql, &["kv", "--client", "1", "put", "a", "b"]));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("runs the \"sql\" service"), "{err}");
    assert!(err.contains("not the key-value store"), "{err}");
    assert!(err.contains("redoubt sql-gateway --config"), "{err}");
    assert!(!err.contains("undecodable"), "{err}");
    assert_eq!(out, "");
    // `kv` on a file-system cluster names `redoubt mount`.
    let (code, _, err) = run(with_config(&files, &["kv", "--client", "1", "get", "a"]));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("runs the \"files\" service"), "{err}");
    assert!(err.contains("redoubt mount --config"), "{err}");
    // `sql-gateway` on a key-value cluster: refused before it listens.
    let (code, out, err) = run(with_config(
        &kv,
        &["sql-gateway", "--clients", "1", "--listen", "127.0.0.1:0"],
    ));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("runs the \"kv\" service"), "{err}");
    assert!(err.contains("not the SQL database"), "{err}");
    assert!(err.contains("redoubt kv --config"), "{err}");
    assert!(!out.contains("listening"), "{out}");
    // The same refusal for a program: one JSON object on stdout.
    let (code, out, err) = run(with_config(
        &sql,
        &["kv", "--client", "1", "-o", "json", "get", "a"],
    ));
    assert_eq!(code, Some(1), "{out}{err}");
    let answer = json_of(&out);
    assert_eq!(answer["exit"], 1, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap_or_default()
            .contains("\"sql\" service"),
        "{answer}"
    );
    assert!(err.contains("\"sql\" service"), "{err}");
}

#[test]
fn init_prints_next_steps_that_fit_its_service() {
    let exe = env!("CARGO_BIN_EXE_redoubt");
    let dir = tempfile::tempdir().unwrap();
    // Not on PATH: the commands name this executable by its path, and say why.
    let (_, sql) = init_service(&dir.path().join("sql"), "sql", 3, "/usr/bin:/bin");
    assert!(sql.contains("`redoubt` is not on PATH"), "{sql}");
    assert!(
        sql.contains(&format!("    {exe} monitor --config ")),
        "{sql}"
    );
    assert!(
        sql.contains(&format!("    {exe} status --config ")),
        "{sql}"
    );
    assert!(
        sql.contains(&format!("    {exe} sql-gateway --config ")) && sql.contains("--clients 1-3"),
        "{sql}"
    );
    assert!(sql.contains("psql "), "{sql}");
    assert!(!sql.contains(" kv --config"), "{sql}");

    let (_, files) = init_service(&dir.path().join("files"), "files", 2, "/usr/bin:/bin");
    assert!(
        files.contains(&format!("    {exe} mount --config ")) && files.contains("--client 1-2"),
        "{files}"
    );
    assert!(
        files.contains(&format!("    {exe} monitor --config ")),
        "{files}"
    );
    assert!(!files.contains(" kv --config"), "{files}");
    assert!(!files.contains("sql-gateway"), "{files}");

    // On PATH (this very executable): plain `redoubt`, no note.
    let bin_dir = Path::new(exe).parent().unwrap().display().to_string();
    let (_, kv) = init_service(
        &dir.path().join("kv"),
        "kv",
        1,
        &format!("{bin_dir}:/usr/bin:/bin"),
    );
    assert!(kv.contains("    redoubt monitor --config "), "{kv}");
    assert!(kv.contains("    redoubt kv --config "), "{kv}");
    assert!(kv.contains("put greeting hello"), "{kv}");
    assert!(!kv.contains("not on PATH"), "{kv}");
    assert!(
        !kv.contains("sql-gateway") && !kv.contains(" mount "),
        "{kv}"
    );
}

#[test]
fn errors_are_json_with_json_output() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    for args in [
        &["kv", "--client", "1", "-o", "json", "get", "k"][..],
        &["status", "-o", "json"][..],
    ] {
        let (code, out, err) = run(with_config(&missing, args));
        assert_eq!(code, Some(1), "{args:?}: {out}{err}");
        let answer = json_of(&out);
        assert_eq!(answer["exit"], 1, "{answer}");
        let msg = answer["error"].as_str().unwrap_or_default();
        assert!(msg.contains("nope.toml"), "{answer}");
        // People still read it on stderr.
        assert!(
            err.contains("error: ") && err.contains("nope.toml"),
            "{err}"
        );
    }
    // A usage error keeps status 2, and is JSON too.
    let (code, out, err) = run(with_config(
        &missing,
        &["kv", "--client", "1", "-o", "json", "frobnicate"],
    ));
    assert_eq!(code, Some(2), "{out}{err}");
    let answer = json_of(&out);
    assert_eq!(answer["exit"], 2, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap_or_default()
            .contains("frobnicate"),
        "{answer}"
    );
    assert!(err.contains("frobnicate"), "{err}");
    // Text output: nothing on stdout, as before.
    let (code, out, err) = run(with_config(&missing, &["kv", "--client", "1", "get", "k"]));
    assert_eq!((code, out.as_str()), (Some(1), ""), "{err}");
    // Help is not an error.
    let (code, out, _) = run({
        let mut c = redoubt();
        c.args(["kv", "-o", "json", "--help"]);
        c
    });
    assert_eq!(code, Some(0));
    assert!(out.contains("Usage"), "{out}");
}

#[test]
fn help_texts_name_every_service_ordering_and_benchmark() {
    let help = |args: &[&str]| {
        let mut c = redoubt();
        c.args(args);
        let (code, out, err) = run(c);
        assert_eq!(code, Some(0), "{err}");
        out
    };
    let top = help(&["--help"]);
    assert!(!top.contains("key-value store (PBFT)"), "{top}");
    for word in ["key-value", "SQL", "file system", "PBFT", "Prime", "custom"] {
        assert!(top.contains(word), "{word} missing from:\n{top}");
    }
    for bench in [
        "micro",
        "recovery",
        "state-transfer",
        "separation",
        "attack",
        "sql",
        "andrew",
        "overlay",
    ] {
        let line = top
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("bench"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(line.contains(bench), "{bench} missing from: {line}");
    }
    for sub in ["replica", "executor"] {
        let text = help(&[sub, "--help"]);
        assert!(!text.contains("(the key-value store)"), "{text}");
        assert!(text.contains("kv, sql or files"), "{text}");
    }
}

#[test]
fn a_timed_out_read_does_not_say_it_may_have_taken_effect() {
    // No replica runs: every operation times out.
    let dir = tempfile::tempdir().unwrap();
    let config = common::init(dir.path(), 4, 1);
    let (code, _, err) = run(with_config(
        &config,
        &["kv", "--client", "1", "--timeout", "1", "get", "k"],
    ));
    assert_eq!(code, Some(1), "{err}");
    assert!(!err.contains("may or may not"), "{err}");
    assert!(err.contains("nothing was read"), "{err}");
    let (code, _, err) = run(with_config(
        &config,
        &["kv", "--client", "1", "--timeout", "1", "put", "k", "v"],
    ));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("may or may not have taken effect"), "{err}");
}

#[test]
fn an_address_whose_name_does_not_resolve_is_a_config_error_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::init(dir.path(), 4, 1);
    let text = std::fs::read_to_string(&config).unwrap();
    let cfg = redoubt_config::ClusterConfig::load(&config).unwrap();
    let addr = cfg.replicas[2].addr.to_string();
    let bad = format!("no-such-host.invalid:{}", cfg.replicas[2].addr.port());
    let line = text
        .lines()
        .position(|l| l.contains(&format!("addr = \"{addr}\"")) && !l.contains("metrics"))
        .expect("replica 2's addr line")
        + 1;
    std::fs::write(
        &config,
        text.replace(&format!("addr = \"{addr}\""), &format!("addr = \"{bad}\"")),
    )
    .unwrap();
    let (code, out, err) = run(with_config(&config, &["status"]));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains(&config.display().to_string()), "{err}");
    assert!(err.contains(&format!("line {line}")), "{err}");
    assert!(err.contains(&format!("addr = \"{bad}\"")), "{err}");
    assert!(
        err.contains("host name \"no-such-host.invalid\" does not resolve"),
        "{err}"
    );
}

/// A live key-value cluster whose file names its replicas `localhost:PORT`, run by monitors
/// whose logs go to files: the names resolve, `status` shows the service, the logs hold no
/// ANSI escapes, and the SQL gateway refuses the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_names_service_in_status_and_plain_logs() {
    assert!(
        std::env::var_os("NO_COLOR").is_none(),
        "run this test without NO_COLOR: it checks that logs in files are plain without it"
    );
    let cluster =
        Cluster::start_monitored(1, 0, |text| text.replace("\"127.0.0.1:", "\"localhost:")).await;
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    assert!(text.contains("addr = \"localhost:"), "{text}");
    assert!(!text.contains("\"127.0.0.1:"), "{text}");

    let (code, _, err) = run(with_config(
        &cluster.config,
        &["kv", "--client", "1", "put", "greeting", "hello"],
    ));
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = run(with_config(
        &cluster.config,
        &["kv", "--client", "1", "get", "greeting"],
    ));
    assert_eq!((code, out.as_str()), (Some(0), "hello\n"), "{err}");

    let (code, out, err) = run(with_config(&cluster.config, &["status"]));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("cluster \"redoubt\": service kv"), "{out}");
    assert!(out.contains("ordering pbft"), "{out}");
    let (code, out, err) = run(with_config(&cluster.config, &["status", "-o", "json"]));
    assert_eq!(code, Some(0), "{out}{err}");
    let answer = json_of(&out);
    assert_eq!(answer["service"], "kv", "{answer}");
    assert_eq!(answer["ordering"], "pbft", "{answer}");
    assert_eq!(answer["serving"], true, "{answer}");

    for i in 0..4 {
        let log = std::fs::read(cluster.log_path(i)).unwrap();
        let text = String::from_utf8_lossy(&log);
        assert!(text.contains("INFO"), "monitor {i} logged nothing:\n{text}");
        assert!(
            !log.contains(&0x1b),
            "monitor {i}'s log holds ANSI escapes:\n{text}"
        );
    }
}

/// A live SQL cluster: `status` names its service, `kv` refuses it, and the gateway's log in a
/// file (a connection served) holds no ANSI escapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_cluster_status_kv_refusal_and_plain_gateway_log() {
    assert!(
        std::env::var_os("NO_COLOR").is_none(),
        "run without NO_COLOR"
    );
    let cluster = Cluster::start_init(&["--service", "sql"], 2).await;
    let (code, out, err) = run(with_config(&cluster.config, &["status"]));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("cluster \"redoubt\": service sql"), "{out}");
    let (_, out, _) = run(with_config(&cluster.config, &["status", "-o", "json"]));
    assert_eq!(json_of(&out)["service"], "sql", "{out}");
    let (code, _, err) = run(with_config(
        &cluster.config,
        &["kv", "--client", "1", "put", "a", "b"],
    ));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("runs the \"sql\" service"), "{err}");

    let log_path = cluster.dir.path().join("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = with_config(
        &cluster.config,
        &["sql-gateway", "--clients", "2", "--listen", "127.0.0.1:0"],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(log)
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .strip_prefix("sql-gateway listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_string();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let (client, conn) = tokio_postgres::connect(
        &format!("host={host} port={port} user=tester dbname=redoubt connect_timeout=10"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the gateway");
    let conn = tokio::spawn(conn);
    client
        .simple_query("CREATE TABLE t (k INTEGER PRIMARY KEY)")
        .await
        .expect("a statement through the gateway");
    drop(client);
    let _ = conn.await;
    // The gateway logs the connection and its end; SIGTERM stops it.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let log = std::fs::read(&log_path).unwrap();
    let text = String::from_utf8_lossy(&log);
    assert!(text.contains("INFO"), "the gateway logged nothing:\n{text}");
    assert!(
        !log.contains(&0x1b),
        "ANSI escapes in the gateway's log:\n{text}"
    );
}
