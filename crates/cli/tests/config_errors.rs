//! `redoubt replica` refuses a broken setup with one message that names the file (or field)
//! and the problem, and a non-zero exit status. Each case starts from a cluster written by
//! `redoubt init` and breaks one thing.

mod common;

use common::{init, init_with, output_within, redoubt};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Runs replica 0 of `config`; returns its exit code and stderr.
fn run_replica(config: &Path) -> (Option<i32>, String) {
    let mut cmd = redoubt();
    cmd.arg("replica")
        .arg("--config")
        .arg(config)
        .args(["--id", "0"]);
    let out = output_within(cmd, Duration::from_secs(20));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Asserts a failure (status 1) whose stderr contains every fact.
fn assert_fails(config: &Path, facts: &[&str]) -> String {
    let (code, stderr) = run_replica(config);
    assert_eq!(code, Some(1), "expected exit status 1, stderr:\n{stderr}");
    for fact in facts {
        assert!(
            stderr.contains(fact),
            "stderr does not contain {fact:?}:\n{stderr}"
        );
    }
    stderr
}

/// A cluster on static MAC keys: most cases below are about the key files and ports a replica
/// reads itself (with session keys the key holder reads the key file).
fn fresh() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = init_with(dir.path(), 4, 1, &["--static-keys"]);
    (dir, config)
}

#[test]
fn session_keys_without_a_key_holder() {
    let dir = tempfile::tempdir().unwrap();
    let config = init(dir.path(), 4, 1);
    assert_fails(
        &config,
        &[
            "key holder of replica:0",
            "keyholder-0.sock",
            "redoubt monitor --config",
            "redoubt keyholder --config",
        ],
    );
}

fn edit(config: &Path, f: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(config).unwrap();
    let new = f(text.clone());
    assert_ne!(new, text, "the edit changed nothing");
    std::fs::write(config, new).unwrap();
}

#[test]
fn missing_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nowhere.toml");
    assert_fails(
        &config,
        &[
            &config.display().to_string(),
            "cannot read config file",
            "redoubt init",
        ],
    );
}

#[test]
fn toml_syntax_error_names_the_line() {
    let (_dir, config) = fresh();
    let mut line = 0;
    edit(&config, |t| {
        let mut lines: Vec<&str> = t.lines().collect();
        let at = lines.iter().position(|l| l.starts_with("tick_ms")).unwrap();
        lines[at] = "tick_ms = = 5";
        line = at + 1;
        lines.join("\n")
    });
    assert_fails(
        &config,
        &[
            &config.display().to_string(),
            "syntax error",
            &format!("line {line}"),
        ],
    );
}

#[test]
fn replica_count_must_be_3f_plus_1() {
    let (_dir, config) = fresh();
    edit(&config, |t| {
        // Drop the last [[replica]] entry (5 lines and the blank one after it).
        let start = t.rfind("[[replica]]").unwrap();
        let end = start + t[start..].find("\n\n").unwrap() + 2;
        format!("{}{}", &t[..start], &t[end..])
    });
    assert_fails(
        &config,
        &[
            &config.display().to_string(),
            "3f+1 = 4 replicas",
            "3 [[replica]] entries",
        ],
    );
}

#[test]
fn duplicate_addresses() {
    let (_dir, config) = fresh();
    let cfg = redoubt_config::ClusterConfig::load(&config).unwrap();
    let (a0, a1) = (cfg.replicas[0].addr, cfg.replicas[1].addr);
    edit(&config, |t| {
        t.replace(&format!("addr = \"{a1}\""), &format!("addr = \"{a0}\""))
    });
    assert_fails(
        &config,
        &[
            &config.display().to_string(),
            "replica 0 addr",
            "replica 1 addr",
            &a0.to_string(),
            "distinct",
        ],
    );
}

#[test]
fn missing_key_file() {
    let (dir, config) = fresh();
    let key = dir.path().join("keys/replica-0.key");
    std::fs::remove_file(&key).unwrap();
    assert_fails(
        &config,
        &[
            "cannot read key file",
            &key.display().to_string(),
            "replica:0",
        ],
    );
}

#[test]
fn key_file_of_another_principal() {
    let (dir, config) = fresh();
    let key0 = dir.path().join("keys/replica-0.key");
    let key1 = dir.path().join("keys/replica-1.key");
    std::fs::remove_file(&key0).unwrap();
    std::fs::copy(&key1, &key0).unwrap();
    std::fs::set_permissions(&key0, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_fails(
        &config,
        &[
            &key0.display().to_string(),
            "belongs to replica:1, not replica:0",
        ],
    );
}

#[test]
fn key_file_readable_by_others() {
    let (dir, config) = fresh();
    let key0 = dir.path().join("keys/replica-0.key");
    std::fs::set_permissions(&key0, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_fails(&config, &[&key0.display().to_string(), "chmod 600"]);
}

#[test]
fn protocol_port_in_use() {
    let (_dir, config) = fresh();
    let cfg = redoubt_config::ClusterConfig::load(&config).unwrap();
    let addr = cfg.replicas[0].addr;
    let _squatter = TcpListener::bind(addr).expect("bind the replica's port first");
    assert_fails(
        &config,
        &[&addr.to_string(), "`addr` of replica 0", "in use"],
    );
}

#[test]
fn metrics_port_in_use() {
    let (_dir, config) = fresh();
    let cfg = redoubt_config::ClusterConfig::load(&config).unwrap();
    let addr = cfg.replicas[0].metrics_addr;
    let _squatter = TcpListener::bind(addr).expect("bind the replica's metrics port first");
    assert_fails(
        &config,
        &[&addr.to_string(), "`metrics_addr` of replica 0", "in use"],
    );
}

#[test]
fn unknown_replica_id() {
    let (_dir, config) = fresh();
    let mut cmd = redoubt();
    cmd.arg("replica")
        .arg("--config")
        .arg(&config)
        .args(["--id", "9"]);
    let out = output_within(cmd, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("has no replica 9"), "{stderr}");
    assert!(stderr.contains("0 to 3"), "{stderr}");
}

#[test]
fn usage_errors_exit_with_2() {
    let out = output_within(
        {
            let mut c = redoubt();
            c.args(["replica", "--config", "x.toml"]);
            c
        },
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--id"));
}

#[test]
fn init_refuses_a_bad_replica_count() {
    let dir = tempfile::tempdir().unwrap();
    let out = output_within(
        {
            let mut c = redoubt();
            c.args(["init", "--replicas", "5", "--out"]).arg(dir.path());
            c
        },
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("3f+1"), "{stderr}");
    assert!(stderr.contains("use 4 (f = 1) or 7 (f = 2)"), "{stderr}");
}
