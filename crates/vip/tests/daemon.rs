//! The daemon without root: members on loopback addresses whose `ip_command` is a script that records
//! what it is asked to do (or fails), so the runtime's ordering, fail-over and failure
//! handling are checked on any machine.

use redoubt_vip::daemon::{self, Report};
use redoubt_vip::VipConfig;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

const ADDRESSES: [&str; 4] = [
    "192.0.2.10/24",
    "192.0.2.11/24",
    "192.0.2.12/24",
    "192.0.2.13/24",
];

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("redoubt-vip-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A stand-in for `ip`: appends its arguments to `log`; `addr add|del` fail when `fail`.
fn fake_ip(dir: &Path, name: &str, fail: bool) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join(format!("{name}.sh"));
    let log = dir.join(format!("{name}.log"));
    let body = format!(
        "#!/bin/sh\necho \"$@\" >> '{}'\ncase \"$1\" in -o) exit 0;; esac\n{}\n",
        log.display(),
        if fail {
            "echo 'RTNETLINK answers: Operation not permitted' >&2; exit 2"
        } else {
            "exit 0"
        }
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// What the recorded `ip addr add/del` calls leave configured.
fn configured(dir: &Path, name: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    let mut held = BTreeSet::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["addr", "add", a, "dev", "lo"] => {
                held.insert(a.to_string());
            }
            ["addr", "del", a, "dev", "lo"] => {
                held.remove(*a);
            }
            _ => {}
        }
    }
    held
}

/// `n` distinct free UDP ports on `ip`: every socket is held until all are picked, so the
/// kernel cannot hand the same port out twice (the ports are free again when this returns).
/// Each test uses its own loopback address, so a port another test picked and released at the
/// same moment cannot collide with its members.
fn free_ports<const N: usize>(ip: &str) -> [u16; N] {
    let held: Vec<std::net::UdpSocket> = (0..N)
        .map(|_| std::net::UdpSocket::bind((ip, 0)).unwrap())
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

fn config(dir: &Path, ip: &str, members: &[(u32, u16, &Path)], extra: &str) -> Vec<VipConfig> {
    members
        .iter()
        .map(|(id, _, script)| {
            let mut text = format!(
                "interface = \"lo\"\naddresses = {ADDRESSES:?}\n\
                 key_hex = \"000102030405060708090a0b0c0d0e0f\"\n\
                 heartbeat_ms = 50\nsuspect_ms = 200\nmature_ms = 300\narp_count = 0\n\
                 ip_command = \"{}\"\nid = {id}\n{extra}\n",
                script.display()
            );
            for (m, port, _) in members {
                text += &format!("[[member]]\nid = {m}\naddr = \"{ip}:{port}\"\n");
            }
            VipConfig::parse(&text, &dir.join(format!("vip{id}.toml"))).unwrap()
        })
        .collect()
}

async fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

fn spawn(cfg: VipConfig) -> (oneshot::Sender<()>, tokio::task::JoinHandle<Report>) {
    let (tx, rx) = oneshot::channel::<()>();
    let id = cfg.id.unwrap();
    let task = tokio::spawn(async move {
        daemon::run(&cfg, id, async {
            let _ = rx.await;
        })
        .await
        .expect("daemon runs")
    });
    (tx, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_share_and_hand_over_on_leave() {
    let dir = TempDir::new("daemon-pair");
    let (s0, s1) = (fake_ip(&dir.0, "ip0", false), fake_ip(&dir.0, "ip1", false));
    let ip = "127.0.77.1";
    let [p0, p1] = free_ports(ip);
    let cfgs = config(&dir.0, ip, &[(0, p0, &s0), (1, p1, &s1)], "");
    let (stop0, task0) = spawn(cfgs[0].clone());
    let (stop1, task1) = spawn(cfgs[1].clone());

    let all: BTreeSet<String> = ADDRESSES.iter().map(|a| a.to_string()).collect();
    let shared = wait_for(Duration::from_secs(5), || {
        let (a, b) = (configured(&dir.0, "ip0"), configured(&dir.0, "ip1"));
        a.len() == 2 && b.len() == 2 && a.union(&b).cloned().collect::<BTreeSet<_>>() == all
    })
    .await;
    assert!(
        shared,
        "not shared two and two: {:?} {:?}",
        configured(&dir.0, "ip0"),
        configured(&dir.0, "ip1")
    );

    let t0 = Instant::now();
    stop1.send(()).unwrap();
    let r1 = task1.await.unwrap();
    assert!(
        configured(&dir.0, "ip1").is_empty(),
        "a leaving member releases everything"
    );
    assert_eq!((r1.host.acquired, r1.host.released), (2, 2));
    let took_over = wait_for(Duration::from_secs(2), || configured(&dir.0, "ip0") == all).await;
    assert!(took_over, "member 0 did not take over");
    let leave_ms = t0.elapsed().as_millis();
    // Well under suspect_ms (200): the leave message, not a timeout, moved the addresses.
    assert!(leave_ms < 150, "take-over after a leave took {leave_ms} ms");

    stop0.send(()).unwrap();
    let r0 = task0.await.unwrap();
    assert_eq!(r0.host.ip_failures, 0);
    assert_eq!(
        r0.core.rejected.total(),
        0,
        "{:?}",
        r0.core.rejected.nonzero()
    );
    assert!(configured(&dir.0, "ip0").is_empty());
    println!("leave take-over on loopback: {leave_ms} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_ip_command_is_counted_and_retried() {
    let dir = TempDir::new("daemon-fail");
    let script = fake_ip(&dir.0, "ip0", true);
    let ip = "127.0.77.2";
    let [p0] = free_ports(ip);
    let cfgs = config(&dir.0, ip, &[(0, p0, &script)], "retry_ms = 100");
    let (stop, task) = spawn(cfgs[0].clone());
    // Immature for 300 ms, then it takes all four addresses; each `ip addr add` fails and is
    // retried every 100 ms.
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.send(()).unwrap();
    let r = task.await.unwrap();
    let log = std::fs::read_to_string(dir.0.join("ip0.log")).unwrap();
    let adds = log.lines().filter(|l| l.starts_with("addr add")).count();
    assert!(
        adds >= 8,
        "each address tried again: {adds} attempts\n{log}"
    );
    assert_eq!(r.host.acquired, 0);
    // Every failed add and the failed deletes at leave are counted.
    assert!(r.host.ip_failures >= adds as u64, "{:?}", r.host);
}
