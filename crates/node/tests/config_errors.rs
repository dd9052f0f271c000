//! Every configuration, key file and `init` error names the file and says what to do; the
//! happy path round-trips through `redoubt init`.

use redoubt_config::keys::write_key_file;
use redoubt_config::{ClusterConfig, ConfigError};
use redoubt_core::{Auth, Principal};
use redoubt_crypto::Digest;
use redoubt_node::holder::load_keys;
use redoubt_node::init::{init_cluster, InitOptions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const CLUSTER: &str = r#"[cluster]
name = "test"
id = "c0ffee"
"#;

fn replicas(n: u32) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[replica]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nmetrics_addr = \"127.0.0.1:{}\"\nhome = \"replica-{i}\"\nkey_file = \"keys/replica-{i}.key\"\n\n",
                7400 + i,
                7500 + i
            )
        })
        .collect()
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("redoubt.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Loads `text` as a config file and returns the error message.
fn load_err(text: &str) -> (String, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), text);
    let err = ClusterConfig::load(&path).expect_err("config must be refused");
    (err.to_string(), path)
}

/// Set `SHOW_MESSAGES=1` to print every message checked (to review their wording).
fn assert_contains(msg: &str, facts: &[&str]) {
    if std::env::var_os("SHOW_MESSAGES").is_some() {
        eprintln!("{msg}\n");
    }
    for fact in facts {
        assert!(
            msg.contains(fact),
            "message does not contain {fact:?}:\n{msg}"
        );
    }
}

// ---- configuration file ----------------------------------------------------------------

#[test]
fn minimal_config_loads_with_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), &format!("{CLUSTER}{}", replicas(4)));
    let cfg = ClusterConfig::load(&path).unwrap();
    assert_eq!(cfg.protocol, redoubt_core::Config::new(1));
    assert_eq!(cfg.replicas.len(), 4);
    assert!(cfg.clients.is_empty());
    assert_eq!(cfg.client.deadline_ms, 5_000);
    assert_eq!(cfg.client_timing(), redoubt_core::ClientTiming::default());
    assert_eq!(cfg.node.tick_ms, 5);
    assert_eq!(cfg.node.peer_queue_frames_max, 8192);
    assert_eq!(cfg.node.client_connections_max, 1024);
    assert_eq!(cfg.node.reconnect_backoff_min_ms, 50);
    assert_eq!(cfg.node.reconnect_backoff_max_ms, 500);
    assert_eq!(cfg.node.log_format, "human");
    assert!(cfg.storage.fsync);
    assert_eq!(cfg.storage.page_cache_mib, 32);
    assert_eq!(
        cfg.resolve(&cfg.replica(2).unwrap().home),
        dir.path().join("replica-2")
    );
    assert_eq!(
        cfg.principals(),
        (0..4).map(Principal::Replica).collect::<Vec<_>>()
    );
}

#[test]
fn replicas_are_sorted_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = CLUSTER.to_string();
    for i in [2, 0, 3, 1] {
        text += &format!(
            "[[replica]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nmetrics_addr = \"127.0.0.1:{}\"\nhome = \"r{i}\"\nkey_file = \"k{i}\"\n",
            7400 + i,
            7500 + i
        );
    }
    text += "[[client]]\nid = 5\nkey_file = \"c5\"\n[[client]]\nid = 2\nkey_file = \"c2\"\n";
    let cfg = ClusterConfig::load(&write_config(dir.path(), &text)).unwrap();
    let ids: Vec<u32> = cfg.replicas.iter().map(|r| r.id).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(
        cfg.principals(),
        vec![
            Principal::Replica(0),
            Principal::Replica(1),
            Principal::Replica(2),
            Principal::Replica(3),
            Principal::Client(2),
            Principal::Client(5)
        ]
    );
}

#[test]
fn missing_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.toml");
    let msg = ClusterConfig::load(&path).unwrap_err().to_string();
    assert_contains(
        &msg,
        &[
            "cannot read config file",
            &path.display().to_string(),
            "No such file",
            "create one with `redoubt init`",
        ],
    );
}

#[test]
fn syntax_error_has_line_and_column() {
    let text = format!("{CLUSTER}{}[node]\ntick_ms = = 5\n", replicas(4));
    let line = text.lines().position(|l| l == "tick_ms = = 5").unwrap() + 1;
    let (msg, path) = load_err(&text);
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "TOML syntax error",
            &format!("line {line}, column 11"),
            "tick_ms = = 5",
        ],
    );
}

#[test]
fn unterminated_string_has_line() {
    let (msg, _) = load_err("[cluster]\nname = \"test\nid = \"x\"\n");
    assert_contains(&msg, &["TOML syntax error", "line 2"]);
}

#[test]
fn unknown_field_has_line() {
    let text = format!("{CLUSTER}{}[node]\ntick_msx = 5\n", replicas(4));
    let line = text.lines().position(|l| l == "tick_msx = 5").unwrap() + 1;
    let (msg, path) = load_err(&text);
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "unknown option `tick_msx`",
            "tick_ms",
            &format!("line {line}"),
            "docs/configuration.md",
        ],
    );
}

/// `[protocol]` deserializes straight into `redoubt_core::Config`, laid over its defaults:
/// its errors are as precise as those of the other sections.
#[test]
fn protocol_options_are_checked_like_the_others() {
    let text = format!(
        "{CLUSTER}{}[protocol]\nf = 1\nlog_sise = 512\n",
        replicas(4)
    );
    let line = text.lines().position(|l| l == "log_sise = 512").unwrap() + 1;
    let (msg, path) = load_err(&text);
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "unknown option `log_sise`",
            "`log_size`",
            &format!("line {line}, column 1"),
            "docs/configuration.md",
        ],
    );
    let text = format!("{CLUSTER}{}[protocol]\ndigest_replies = 1\n", replicas(4));
    let line = text
        .lines()
        .position(|l| l.starts_with("digest_replies"))
        .unwrap()
        + 1;
    let (msg, _) = load_err(&text);
    assert_contains(
        &msg,
        &[
            "invalid type",
            "bool",
            &format!("line {line}"),
            "fix the value",
        ],
    );
    // Options left out keep their defaults.
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        &format!(
            "{CLUSTER}{}[protocol]\ndigest_replies = false\n",
            replicas(4)
        ),
    );
    let mut expected = redoubt_core::Config::new(1);
    expected.digest_replies = false;
    assert_eq!(ClusterConfig::load(&path).unwrap().protocol, expected);
}

#[test]
fn unknown_field_in_replica_entry_has_line() {
    let text = format!("{CLUSTER}{}", replicas(4)).replacen("home =", "homme =", 1);
    let line = text.lines().position(|l| l.starts_with("homme")).unwrap() + 1;
    let (msg, _) = load_err(&text);
    assert_contains(&msg, &["unknown option `homme`", &format!("line {line}")]);
}

#[test]
fn unknown_section() {
    let (msg, _) = load_err(&format!("{CLUSTER}{}[nodes]\ntick_ms = 5\n", replicas(4)));
    assert_contains(&msg, &["unknown option `nodes`", "line"]);
}

#[test]
fn wrong_type_has_line() {
    let text = format!("{CLUSTER}{}[node]\ntick_ms = \"five\"\n", replicas(4));
    let line = text.lines().position(|l| l.starts_with("tick_ms")).unwrap() + 1;
    let (msg, path) = load_err(&text);
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "invalid type",
            &format!("line {line}"),
            "fix the value",
        ],
    );
}

#[test]
fn bad_address_has_line() {
    let text = format!("{CLUSTER}{}", replicas(4)).replacen("127.0.0.1:7402", "localhost", 1);
    let line = text
        .lines()
        .position(|l| l.contains("\"localhost\""))
        .unwrap()
        + 1;
    let (msg, _) = load_err(&text);
    assert_contains(&msg, &["address", &format!("line {line}")]);
}

#[test]
fn missing_field_is_named() {
    let text =
        format!("{CLUSTER}{}", replicas(4)).replacen("key_file = \"keys/replica-1.key\"\n", "", 1);
    let (msg, _) = load_err(&text);
    assert_contains(&msg, &["missing field `key_file`", "line 11", "add it"]);
    let (msg, _) = load_err(&replicas(4));
    assert_contains(&msg, &["missing field `cluster`"]);
}

#[test]
fn replica_count_must_be_3f_plus_1() {
    let (msg, path) = load_err(&format!("{CLUSTER}{}", replicas(5)));
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "f = 1 requires exactly 3f+1 = 4 replicas",
            "but 5 [[replica]] entries",
            "list 4 replicas",
        ],
    );
    // 7 replicas fit f = 2: say so.
    let (msg, _) = load_err(&format!("{CLUSTER}{}", replicas(7)));
    assert_contains(&msg, &["= 4 replicas", "7 [[replica]]", "set f = 2"]);
    // f = 2 with 7 replicas is fine.
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        &format!("{CLUSTER}{}[protocol]\nf = 2\n", replicas(7)),
    );
    assert_eq!(ClusterConfig::load(&path).unwrap().protocol.n(), 7);
}

#[test]
fn replica_ids_must_be_0_to_n_minus_1() {
    let text = format!("{CLUSTER}{}", replicas(4)).replace("id = 3\n", "id = 5\n");
    let (msg, path) = load_err(&text);
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "replica ids must be exactly 0..=3",
            "id 5",
            "missing: 3",
            "renumber",
        ],
    );
    let text = format!("{CLUSTER}{}", replicas(4)).replace("id = 2\n", "id = 1\n");
    let (msg, _) = load_err(&text);
    assert_contains(&msg, &["id 1 is listed twice", "line"]);
}

#[test]
fn duplicate_client_ids() {
    let text = format!(
        "{CLUSTER}{}[[client]]\nid = 3\nkey_file = \"a\"\n[[client]]\nid = 3\nkey_file = \"b\"\n",
        replicas(4)
    );
    let (msg, path) = load_err(&text);
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "client id 3 is listed twice",
            "distinct id",
        ],
    );
}

#[test]
fn duplicate_addresses_name_both_replicas() {
    let text = format!("{CLUSTER}{}", replicas(4)).replace("127.0.0.1:7502", "127.0.0.1:7400");
    let (msg, path) = load_err(&text);
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "replica 0 addr",
            "replica 2 metrics_addr",
            "127.0.0.1:7400",
            "distinct",
        ],
    );
    let text = format!("{CLUSTER}{}", replicas(4)).replace("127.0.0.1:7401", "127.0.0.1:7403");
    let (msg, _) = load_err(&text);
    assert_contains(&msg, &["replica 1 addr", "replica 3 addr"]);
}

#[test]
fn duplicate_homes() {
    let text = format!("{CLUSTER}{}", replicas(4)).replace("\"replica-3\"", "\"replica-1\"");
    let (msg, _) = load_err(&text);
    assert_contains(&msg, &["replicas 1 and 3 both use home"]);
}

#[test]
fn invalid_protocol_values() {
    let (msg, path) = load_err(&format!(
        "{CLUSTER}{}[protocol]\nlog_size = 200\n",
        replicas(4)
    ));
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "[protocol]",
            "log_size (200) must be a multiple of checkpoint_interval (128)",
        ],
    );
    let (msg, _) = load_err(&format!("{CLUSTER}{}[protocol]\nf = 0\n", replicas(4)));
    assert_contains(&msg, &["[protocol]", "f must be at least 1"]);
}

#[test]
fn invalid_runtime_values() {
    let (msg, path) = load_err(&format!(
        "{CLUSTER}{}[node]\nlog_format = \"xml\"\n",
        replicas(4)
    ));
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "[node] log_format",
            "\"xml\"",
            "json",
        ],
    );
    let (msg, _) = load_err(&format!(
        "{CLUSTER}{}[client_timing]\nretransmit_min_ms = 5000\n",
        replicas(4)
    ));
    assert_contains(
        &msg,
        &["retransmit_min_ms (5000) <= retransmit_max_ms (4000)"],
    );
    let (msg, _) = load_err(&format!("{CLUSTER}{}[node]\ntick_ms = 0\n", replicas(4)));
    assert_contains(&msg, &["[node] tick_ms", "positive"]);
}

#[test]
fn unknown_replica_and_client_ids_list_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        &format!(
            "{CLUSTER}{}[[client]]\nid = 1\nkey_file = \"a\"\n[[client]]\nid = 2\nkey_file = \"b\"\n",
            replicas(4)
        ),
    );
    let cfg = ClusterConfig::load(&path).unwrap();
    let msg = cfg.replica(9).unwrap_err().to_string();
    assert_contains(
        &msg,
        &[&path.display().to_string(), "no replica 9", "0 to 3"],
    );
    let msg = cfg.client_entry(7).unwrap_err().to_string();
    assert_contains(
        &msg,
        &[
            &path.display().to_string(),
            "no client 7",
            "valid client ids are 1, 2",
        ],
    );
    let path = write_config(dir.path(), &format!("{CLUSTER}{}", replicas(4)));
    let cfg = ClusterConfig::load(&path).unwrap();
    let msg = cfg.client_entry(1).unwrap_err().to_string();
    assert_contains(&msg, &["no client 1", "lists no clients", "[[client]]"]);
}

// ---- init ------------------------------------------------------------------------------

fn init(dir: &Path, replicas: u32, clients: u32) -> PathBuf {
    init_cluster(&InitOptions {
        replicas,
        clients,
        out: dir.join("cluster"),
        name: "test".into(),
        // The key-file tests below are about static MAC key files.
        static_keys: true,
        ..InitOptions::default()
    })
    .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn init_round_trip_keys_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = init(dir.path(), 4, 2);
    let out = dir.path().join("cluster");
    assert_eq!(path, out.join("redoubt.toml"));
    let cfg = ClusterConfig::load(&path).unwrap();
    assert_eq!(cfg.cluster.name, "test");
    assert_eq!(cfg.cluster.id.len(), 32);
    assert_eq!(cfg.protocol.f, 1);
    assert_eq!(cfg.replicas[3].addr, "127.0.0.1:7403".parse().unwrap());
    assert_eq!(
        cfg.replicas[3].metrics_addr,
        "127.0.0.1:7503".parse().unwrap()
    );
    assert_eq!(cfg.replicas[3].home, PathBuf::from("replica-3"));
    assert!(!out.join("replica-3").exists(), "homes are not created");
    assert_eq!(cfg.clients.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(mode(&out.join("keys")), 0o700);

    let all = cfg.principals();
    assert_eq!(all.len(), 6);
    let keys: Vec<_> = all
        .iter()
        .map(|&p| {
            assert_eq!(mode(&cfg.key_file_of(p).unwrap()), 0o600);
            load_keys(&cfg, p).unwrap()
        })
        .collect();
    let d = Digest::of(b"round trip");
    for (i, a) in keys.iter().enumerate() {
        for (j, b) in keys.iter().enumerate() {
            let (pa, pb) = (all[i], all[j]);
            if i == j {
                continue;
            }
            if matches!((pa, pb), (Principal::Client(_), Principal::Client(_))) {
                // Clients share no keys with each other.
                assert!(a.mac_to(pb, &d).is_none());
                continue;
            }
            let mac = a.mac_to(pb, &d).expect("key to peer");
            assert!(b.verify_from(pa, 0, &d, &mac), "{pa} -> {pb}");
            // The key is directional and pairwise: it is not the key b -> a, and nobody else
            // accepts it as coming from a.
            assert_ne!(b.mac_to(pa, &d), Some(mac), "{pa} <-> {pb} share a key");
            for (k, c) in keys.iter().enumerate() {
                if k != j && k != i {
                    assert!(!c.verify_from(pa, 0, &d, &mac));
                }
            }
        }
    }
    // The example the brief names: replica 0's send key to replica 1 is replica 1's recv key.
    let mac = keys[0].mac_to(Principal::Replica(1), &d).unwrap();
    assert!(keys[1].verify_from(Principal::Replica(0), 0, &d, &mac));

    // Every option is in the written file.
    let text = std::fs::read_to_string(&path).unwrap();
    if std::env::var_os("SHOW_MESSAGES").is_some() {
        let key = std::fs::read_to_string(cfg.key_file_of(Principal::Client(1)).unwrap());
        eprintln!("{text}\n---- client-1.key\n{}", key.unwrap());
    }
    for key in [
        "checkpoint_interval",
        "message_bytes_max",
        "deadline_ms",
        "peer_queue_frames_max",
        "log_format",
        "page_cache_mib",
        "fsync",
    ] {
        assert!(text.contains(&format!("\n{key} = ")), "{key} missing");
    }
    assert!(!text.contains("mutant"));
}

#[test]
fn init_f2_with_host_and_base_port() {
    let dir = tempfile::tempdir().unwrap();
    let path = init_cluster(&InitOptions {
        replicas: 7,
        executors: 0,
        firewall: None,
        clients: 0,
        out: dir.path().join("c7"),
        base_port: 9000,
        host: "127.0.0.2".parse().unwrap(),
        name: "seven".into(),
        static_keys: true,
        ordering: redoubt_core::OrderProtocol::Pbft,
        service: "kv".into(),
        executable_blake3: None,
        state_geometry: None,
    })
    .unwrap();
    let cfg = ClusterConfig::load(&path).unwrap();
    assert_eq!(cfg.protocol.f, 2);
    assert_eq!(cfg.replicas[6].addr, "127.0.0.2:9006".parse().unwrap());
    assert_eq!(
        cfg.replicas[6].metrics_addr,
        "127.0.0.2:9106".parse().unwrap()
    );
    for p in cfg.principals() {
        load_keys(&cfg, p).unwrap();
    }
}

#[test]
fn init_refuses_bad_replica_counts() {
    let dir = tempfile::tempdir().unwrap();
    let opts = |replicas| InitOptions {
        replicas,
        out: dir.path().join("x"),
        ..InitOptions::default()
    };
    let msg = init_cluster(&opts(5)).unwrap_err().to_string();
    assert_contains(&msg, &["5 replicas", "3f+1", "4 (f = 1) or 7 (f = 2)"]);
    let msg = init_cluster(&opts(1)).unwrap_err().to_string();
    assert_contains(&msg, &["1 replicas", "f >= 1", "use 4"]);
    assert!(!dir.path().join("x").exists(), "nothing written on error");
}

#[test]
fn init_refuses_existing_cluster() {
    let dir = tempfile::tempdir().unwrap();
    init(dir.path(), 4, 1);
    let msg = init_cluster(&InitOptions {
        out: dir.path().join("cluster"),
        ..InitOptions::default()
    })
    .unwrap_err()
    .to_string();
    assert_contains(
        &msg,
        &["redoubt.toml already exists", "refusing to overwrite"],
    );
}

#[test]
fn init_refuses_unspecified_host() {
    let dir = tempfile::tempdir().unwrap();
    let msg = init_cluster(&InitOptions {
        out: dir.path().join("x"),
        host: "0.0.0.0".parse().unwrap(),
        ..InitOptions::default()
    })
    .unwrap_err()
    .to_string();
    assert_contains(&msg, &["0.0.0.0", "127.0.0.1"]);
}

// ---- key files -------------------------------------------------------------------------

/// An initialised cluster, its config, and the key file of replica 1.
fn cluster() -> (tempfile::TempDir, ClusterConfig, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = init(dir.path(), 4, 1);
    let cfg = ClusterConfig::load(&path).unwrap();
    let key = cfg.key_file_of(Principal::Replica(1)).unwrap();
    (dir, cfg, key)
}

/// Replaces the key file at `path` with `text`, mode 0600.
fn rewrite_key(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn keys_err(cfg: &ClusterConfig, p: Principal) -> String {
    load_keys(cfg, p)
        .expect_err("keys must be refused")
        .to_string()
}

#[test]
fn missing_key_file() {
    let (_dir, cfg, key) = cluster();
    std::fs::remove_file(&key).unwrap();
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(
        &msg,
        &[
            "replica:1",
            &key.display().to_string(),
            "No such file",
            "redoubt init",
        ],
    );
}

#[test]
fn key_file_of_unknown_principal() {
    let (_dir, cfg, _) = cluster();
    let msg = keys_err(&cfg, Principal::Client(9));
    assert_contains(&msg, &["no client 9", "valid client ids are 1"]);
}

#[test]
fn malformed_key_file_has_line() {
    let (_dir, cfg, key) = cluster();
    let text = std::fs::read_to_string(&key).unwrap();
    rewrite_key(&key, &text.replacen("[[peer]]", "[[peer]\n", 1));
    let line = text.lines().position(|l| l == "[[peer]]").unwrap() + 1;
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(
        &msg,
        &[
            &key.display().to_string(),
            "TOML syntax error",
            &format!("line {line}"),
            "redoubt init",
        ],
    );
    rewrite_key(&key, &text.replacen("send =", "sned =", 1));
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(&msg, &[&key.display().to_string(), "sned", "line 8"]);
    // Key material is never quoted in a message.
    let secret = text.lines().find(|l| l.starts_with("send =")).unwrap();
    assert!(!msg.contains(&secret[8..24]), "{msg}");
    rewrite_key(
        &key,
        &text.replacen("principal = \"replica:1\"", "principal = \"replica-1\"", 1),
    );
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(&msg, &["\"replica-1\"", "replica:N or client:N", "line 3"]);
}

#[test]
fn key_file_of_another_principal() {
    let (_dir, cfg, key) = cluster();
    let other = cfg.key_file_of(Principal::Replica(2)).unwrap();
    rewrite_key(&key, &std::fs::read_to_string(other).unwrap());
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(
        &msg,
        &[&format!(
            "key file {} belongs to replica:2, not replica:1",
            key.display()
        )],
    );
}

#[test]
fn key_file_of_another_cluster() {
    let (_dir, mut cfg, key) = cluster();
    let real = cfg.cluster.id.clone();
    cfg.cluster.id = "0123456789abcdef".into();
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(
        &msg,
        &[
            &key.display().to_string(),
            &format!("belongs to cluster {real}"),
            "is cluster 0123456789abcdef",
        ],
    );
}

#[test]
fn key_file_missing_a_peer() {
    let (dir, _cfg, key) = cluster();
    // Add a client to the config after init: the replicas' files lack its keys.
    let path = dir.path().join("cluster/redoubt.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text = text.replacen(
        "[protocol]",
        "[[client]]\nid = 9\nkey_file = \"keys/client-9.key\"\n\n[protocol]",
        1,
    );
    std::fs::write(&path, text).unwrap();
    let cfg = ClusterConfig::load(&path).unwrap();
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(
        &msg,
        &[
            &key.display().to_string(),
            "replica:1 has no keys for client:9",
            "redoubt init",
        ],
    );
}

#[test]
fn bad_hex_and_wrong_length() {
    let (_dir, cfg, key) = cluster();
    let text = std::fs::read_to_string(&key).unwrap();
    let send_line = text.lines().position(|l| l.starts_with("send =")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let hex = lines[send_line]
        .trim_start_matches("send = \"")
        .trim_end_matches('"');
    assert_eq!(hex.len(), 64);

    let bad = format!("zz{}", &hex[2..]);
    rewrite_key(&key, &text.replacen(hex, &bad, 1));
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(
        &msg,
        &[
            &key.display().to_string(),
            "`send` key of peer replica:0",
            &format!("line {}", send_line + 1),
            "not a hex digit",
            "64 hex digits",
        ],
    );
    rewrite_key(&key, &text.replacen(hex, &hex[..62], 1));
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(
        &msg,
        &[
            "`send` key of peer replica:0",
            "has 62 hex digits",
            "not 64",
        ],
    );
}

#[test]
fn key_file_readable_by_others() {
    let (_dir, cfg, key) = cluster();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let msg = keys_err(&cfg, Principal::Replica(1));
    assert_contains(
        &msg,
        &[
            &key.display().to_string(),
            "0644",
            &format!("chmod 600 {}", key.display()),
        ],
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_contains(&keys_err(&cfg, Principal::Replica(1)), &["chmod 600"]);
}

#[test]
fn write_key_file_refuses_to_overwrite() {
    let (_dir, _cfg, key) = cluster();
    let before = std::fs::read(&key).unwrap();
    let err = write_key_file(&key, "x", Principal::Replica(1), &[]).unwrap_err();
    assert!(matches!(err, ConfigError::KeyExists { .. }));
    assert_contains(
        &err.to_string(),
        &[
            &key.display().to_string(),
            "already exists",
            "refusing to overwrite",
        ],
    );
    assert_eq!(std::fs::read(&key).unwrap(), before);
}

// ---- session keys ------------------------------------------------------------------------

#[test]
fn session_init_writes_holder_files_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = init_cluster(&InitOptions {
        out: dir.path().join("s"),
        base_port: 7800,
        ..InitOptions::default()
    })
    .unwrap();
    let cfg = ClusterConfig::load(&path).unwrap();
    assert!(cfg.keys.session());
    assert!(cfg.recovery.enabled);
    for p in cfg.principals() {
        assert_eq!(mode(&cfg.key_file_of(p).unwrap()), 0o600);
    }
    let directory = redoubt_config::keys::load_directory(&cfg).unwrap();
    assert_eq!(directory.keys.len(), cfg.principals().len());
    // A client keeps its key holder in its own process.
    assert!(matches!(
        load_keys(&cfg, Principal::Client(1)).unwrap(),
        redoubt_core::Keys::Session(_)
    ));
    // A replica needs its key holder running, and says how to start it.
    let msg = keys_err(&cfg, Principal::Replica(0));
    assert_contains(
        &msg,
        &[
            "key holder of replica:0",
            "keyholder-0.sock",
            "redoubt monitor",
        ],
    );
    redoubt_node::holder::serve_for_replica(&cfg, 0).unwrap();
    assert!(matches!(
        load_keys(&cfg, Principal::Replica(0)).unwrap(),
        redoubt_core::Keys::Session(_)
    ));
    // A key holder for the wrong replica's file is refused.
    let other = cfg.key_file_of(Principal::Replica(2)).unwrap();
    let own = cfg.key_file_of(Principal::Replica(1)).unwrap();
    std::fs::copy(&other, &own).unwrap();
    let msg = redoubt_node::holder::serve_for_replica(&cfg, 1)
        .unwrap_err()
        .to_string();
    assert_contains(&msg, &["belongs to replica:2", "replica:1"]);
    // A directory missing a principal is refused.
    let dpath = cfg.directory_path();
    let text = std::fs::read_to_string(&dpath).unwrap();
    let cut = text.find("[[principal]]\nname = \"client:1\"").unwrap();
    std::fs::write(&dpath, &text[..cut]).unwrap();
    let msg = keys_err(&cfg, Principal::Client(1));
    assert_contains(
        &msg,
        &["public-key directory", "no public keys for client:1"],
    );
}
