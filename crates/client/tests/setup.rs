//! Building a client's setup from a cluster file, with the client crate alone.

use redoubt_client::{Client, ClientSetup};
use redoubt_core::auth::pairwise_key;
use redoubt_core::{Auth, ClientTiming, Config, Principal};
use std::path::Path;
use std::time::Duration;

/// A cluster file for four replicas and clients 7 and 8 with static keys, and client 7's key
/// file; nothing else (no node crate, no `redoubt init`).
fn write_cluster(dir: &Path) -> std::path::PathBuf {
    let mut text = String::from(
        "[cluster]\nname = \"t\"\nid = \"c0ffee\"\n\n\
         [keys]\nmode = \"static\"\n\n[recovery]\nenabled = false\n\n\
         [protocol]\nrequest_bytes_max = 4096\n\n\
         [client_timing]\ninitial_rtt_ms = 7\ndeadline_ms = 1500\n\n",
    );
    for i in 0..4 {
        text += &format!(
            "[[replica]]\nid = {i}\naddr = \"127.0.0.1:{}\"\nmetrics_addr = \"127.0.0.1:{}\"\n\
             home = \"r{i}\"\nkey_file = \"r{i}.key\"\n\n",
            7400 + i,
            7500 + i
        );
    }
    text +=
        "[[client]]\nid = 7\nkey_file = \"c7.key\"\n\n[[client]]\nid = 8\nkey_file = \"c8.key\"\n";
    let path = dir.join("redoubt.toml");
    std::fs::write(&path, text).unwrap();
    let me = Principal::Client(7);
    let keys: Vec<_> = (0..4)
        .map(|r| {
            let peer = Principal::Replica(r);
            (
                peer,
                pairwise_key(b"m", me, peer),
                pairwise_key(b"m", peer, me),
            )
        })
        .collect();
    redoubt_config::keys::write_key_file(&dir.join("c7.key"), "c0ffee", me, &keys).unwrap();
    path
}

#[tokio::test]
async fn a_setup_from_the_cluster_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_cluster(dir.path());
    let setup = ClientSetup::from_config(&path, 7).unwrap();
    assert_eq!(setup.id, 7);
    let addrs: Vec<String> = setup.replicas.iter().map(|a| a.to_string()).collect();
    assert_eq!(
        addrs,
        [
            "127.0.0.1:7400",
            "127.0.0.1:7401",
            "127.0.0.1:7402",
            "127.0.0.1:7403"
        ]
    );
    let mut core = Config::new(1);
    core.request_bytes_max = 4096;
    assert_eq!(setup.core, core);
    assert_eq!(setup.frame_bytes_max, core.message_bytes_max);
    assert_eq!(
        setup.timing,
        ClientTiming {
            initial_rtt_ms: 7,
            ..ClientTiming::default()
        }
    );
    assert_eq!(setup.deadline, Duration::from_millis(1500));
    assert_eq!(setup.keys.me(), Principal::Client(7));
    // The setup is complete: a client starts from it (no replica needs to be up).
    let client = Client::connect(setup).await.unwrap();
    assert_eq!(client.id(), 7);

    // Errors name the file and what to do.
    let msg = ClientSetup::from_config(&path, 9).unwrap_err().to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("valid client ids are 7, 8"),
        "{msg}"
    );
    let msg = ClientSetup::from_config(&path, 8).unwrap_err().to_string();
    assert!(
        msg.contains("c8.key") && msg.contains("redoubt init"),
        "{msg}"
    );
    let msg = ClientSetup::from_config(&dir.path().join("nope.toml"), 7)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("cannot read config file"), "{msg}");
}
