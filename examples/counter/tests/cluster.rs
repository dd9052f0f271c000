//! The counter on a real cluster of four replicas on 127.0.0.1, each with its journal, page
//! store and key holder:
//!
//! - in this process: four `redoubt_node::run_replica` tasks hosting `CounterService`, and a
//!   client built from the cluster file. The primary is killed and restarted from its journal;
//!   then another replica is killed, so that the cluster goes on only if the restarted one is
//!   back in the protocol;
//! - as processes: four `counter replica` processes and `counter` client commands.

use redoubt_client::ClientSetup;
use redoubt_example_counter::{CounterClient, CounterError, CounterService};
use redoubt_node::init::{init_cluster, InitOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::task::JoinHandle;

/// A cluster of four replicas and one client in `dir` (`redoubt init`, session keys, free
/// ports); returns the cluster file.
fn init(dir: &Path) -> PathBuf {
    init_cluster(&InitOptions {
        replicas: 4,
        clients: 1,
        out: dir.join("cluster"),
        base_port: redoubt_node::init::free_base_port(4).unwrap(),
        ..InitOptions::default()
    })
    .unwrap()
}

fn start(path: &Path, id: u32) -> JoinHandle<()> {
    let path = path.to_path_buf();
    tokio::spawn(async move {
        let opts = Default::default();
        if let Err(e) = redoubt_node::run_replica(&path, id, opts, CounterService::new()).await {
            panic!("replica {id}: {e}");
        }
    })
}

/// Increments `times` times, checking that each increment is applied exactly once.
async fn increment(counter: &CounterClient, times: u64) {
    for _ in 0..times {
        let before = counter.get().await.unwrap();
        let after = counter.increment().await.unwrap();
        assert_eq!(after.value, before.value + 1);
        assert_eq!(after.updates, before.updates + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_count_through_a_crash_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = init(dir.path());
    let cfg = redoubt_config::ClusterConfig::load(&path).unwrap();
    for id in 0..4 {
        redoubt_node::holder::serve_for_replica(&cfg, id).unwrap();
    }
    let mut replicas: Vec<JoinHandle<()>> = (0..4).map(|id| start(&path, id)).collect();

    let mut setup = ClientSetup::from_config(&path, 1).unwrap();
    setup.deadline = Duration::from_secs(15);
    let counter = CounterClient::connect(setup).await.unwrap();

    increment(&counter, 10).await;
    // Kill the primary of view 0: the others change view and go on counting.
    replicas[0].abort();
    increment(&counter, 10).await;
    assert!(counter.client().view() >= 1, "the primary was replaced");
    // Restart it from its journal and page store.
    replicas[0] = start(&path, 0);
    assert_eq!(counter.add(100).await.unwrap().value, 120);
    // Now kill another replica: with f = 1, the cluster needs replica 0 back to go on.
    replicas[2].abort();
    increment(&counter, 5).await;

    let c = counter.get().await.unwrap();
    assert_eq!((c.value, c.updates), (125, 26));
    assert!(c.updated_at_ms > 0, "agreed time of the last update");
    assert!(matches!(
        counter.add(u64::MAX).await,
        Err(CounterError::Refused(m)) if m.contains("overflows")
    ));
    assert_eq!(
        counter.get().await.unwrap(),
        c,
        "a refused add changes nothing"
    );
    // Replicas 0 (restarted), 1 and 3 are still running (`start` panics on an error).
    for id in [0, 1, 3] {
        assert!(!replicas[id].is_finished(), "replica {id} stopped");
    }
    for r in replicas {
        r.abort();
    }
}

// ----- the `counter` binary ---------------------------------------------------------------

/// Kills the replica processes however the test ends.
struct Replicas(Vec<Child>);

impl Drop for Replicas {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn counter(config: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_counter"))
        .args(&args[..1])
        .arg("--config")
        .arg(config)
        .args(["--client", "1"])
        .args(&args[1..])
        .output()
        .expect("run counter");
    assert!(
        out.status.success(),
        "counter {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn counter_replica_processes_and_client_commands() {
    let dir = tempfile::tempdir().unwrap();
    let config = init(dir.path());
    let _replicas = Replicas(
        (0..4)
            .map(|id| {
                Command::new(env!("CARGO_BIN_EXE_counter"))
                    .arg("replica")
                    .arg("--config")
                    .arg(&config)
                    .args(["--id", &id.to_string(), "--with-keyholder"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start counter replica")
            })
            .collect(),
    );
    assert_eq!(counter(&config, &["add", "5"]), "5 (updates: 1)\n");
    assert_eq!(counter(&config, &["increment"]), "6 (updates: 2)\n");
    assert_eq!(counter(&config, &["get"]), "6 (updates: 2)\n");
}
