//! Backup and restore through the real `redoubt` binary: `redoubt snapshot` against a running
//! cluster with one replica down, `--verify` of the file and of a damaged copy, and a new
//! cluster started from it with `redoubt init --from-snapshot`.

mod common;

use common::{output_within, redoubt, Cluster};
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
    assert!(
        err.contains("replica 3"),
        "the replica down is named: {err}"
    );
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
