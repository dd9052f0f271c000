//! `redoubt mount` over a real 4-replica cluster hosting the file service: ordinary file
//! operations through the kernel (directories, writes, appends, renames, symbolic and hard
//! links, chmod, truncate), the primary killed with SIGKILL mid-way, then everything read
//! back through a second mount acting as other clients and compared with what was written.
//! Needs root and /dev/fuse; passes with a message without them.

mod common;

use common::{output_within, redoubt, Cluster};
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = Path::new("/dev/fuse").exists();
    if !root || !dev {
        println!("SKIPPED: FUSE mounts need root and /dev/fuse (root: {root}, /dev/fuse: {dev})");
    }
    root && dev
}

/// A `redoubt mount` process; on drop it is killed and its mount point detached, so that a
/// failing test leaves no mount behind.
struct MountProcess {
    child: Child,
    mountpoint: PathBuf,
}

impl MountProcess {
    fn start(config: &Path, clients: &str, mountpoint: &Path, log: &Path) -> MountProcess {
        fs::create_dir_all(mountpoint).unwrap();
        let mut child = redoubt()
            .arg("mount")
            .arg("--config")
            .arg(config)
            .args(["--client", clients])
            .arg(mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(log).unwrap())
            .spawn()
            .expect("spawn redoubt mount");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let m = MountProcess {
            child,
            mountpoint: mountpoint.to_path_buf(),
        };
        assert!(
            line.starts_with(&format!(
                "mounted the replicated file system at {}",
                mountpoint.display()
            )),
            "first line {line:?}; log:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        m
    }

    /// SIGTERM, then the exit status: 0 and the mount point no longer mounted.
    fn stop(mut self) {
        // SAFETY: kill(2) on our child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "mount did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "redoubt mount exited with {status}");
        assert!(!is_mounted(&self.mountpoint));
    }
}

impl Drop for MountProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mounted(&self.mountpoint) {
            let c = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn is_mounted(p: &Path) -> bool {
    let p = p.to_string_lossy().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

/// What a tree holds: per relative path, its kind and content (a file's bytes, a link's
/// target) and permission bits.
fn snapshot(root: &Path) -> BTreeMap<String, (char, Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let mode = m.mode() & 0o7777;
            let entry = if m.is_symlink() {
                (
                    'l',
                    fs::read_link(&p).unwrap().into_os_string().into_vec(),
                    mode,
                )
            } else if m.is_dir() {
                stack.push(p.clone());
                ('d', Vec::new(), mode)
            } else {
                ('f', fs::read(&p).unwrap(), mode)
            };
            out.insert(rel, entry);
        }
    }
    out
}

/// Writes a tree through the mount at `m` and the same into the plain directory `r`.
fn write_both(m: &Path, r: &Path, round: u32) {
    for root in [m, r] {
        let d = root.join(format!("round{round}/src/lib"));
        fs::create_dir_all(&d).unwrap();
        for i in 0..20u32 {
            let body: Vec<u8> = (0..(i * 3001 + round * 17) % 70_000)
                .map(|j| (j * 31 + i) as u8)
                .collect();
            fs::write(d.join(format!("f{i}.c")), &body).unwrap();
        }
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("log"))
            .unwrap();
        writeln!(log, "round {round} written").unwrap();
        drop(log);
        // A 300 KB file: more than one 128 KiB operation per write.
        let big: Vec<u8> = (0..300_000u32)
            .map(|j| (j % 253) as u8 ^ round as u8)
            .collect();
        fs::write(root.join(format!("round{round}/big")), &big).unwrap();
        fs::rename(
            root.join(format!("round{round}/src/lib/f0.c")),
            root.join(format!("round{round}/renamed.c")),
        )
        .unwrap();
        std::os::unix::fs::symlink("src/lib/f1.c", root.join(format!("round{round}/link")))
            .unwrap();
        fs::hard_link(
            root.join(format!("round{round}/src/lib/f2.c")),
            root.join(format!("round{round}/hard")),
        )
        .unwrap();
        fs::set_permissions(
            root.join(format!("round{round}/src/lib/f3.c")),
            fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        fs::OpenOptions::new()
            .write(true)
            .open(root.join(format!("round{round}/src/lib/f4.c")))
            .unwrap()
            .set_len(100)
            .unwrap();
        fs::remove_file(root.join(format!("round{round}/src/lib/f5.c"))).unwrap();
        fs::create_dir(root.join(format!("round{round}/empty"))).unwrap();
        fs::remove_dir(root.join(format!("round{round}/empty"))).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_survive_a_killed_primary_and_read_back_through_another_mount() {
    if !can_mount() {
        return;
    }
    let mut cluster = Cluster::start_init(&["--service", "files"], 8).await;
    let dir = cluster.dir.path().to_path_buf();
    let reference = dir.join("reference");
    fs::create_dir(&reference).unwrap();
    let (mp1, mp2) = (dir.join("mnt1"), dir.join("mnt2"));
    let first = MountProcess::start(cluster.config_path(), "5-8", &mp1, &dir.join("mount1.log"));

    let (m, r) = (mp1.clone(), reference.clone());
    tokio::task::spawn_blocking(move || write_both(&m, &r, 1))
        .await
        .unwrap();
    let primary = cluster.primary().await;
    cluster.kill(primary);
    // The next operations wait for the view change.
    let (m, r) = (mp1.clone(), reference.clone());
    tokio::task::spawn_blocking(move || write_both(&m, &r, 2))
        .await
        .unwrap();
    let views: Vec<u64> = cluster
        .statuses()
        .await
        .into_iter()
        .flatten()
        .filter_map(|s| s["view"].as_u64())
        .collect();
    assert!(
        views.len() == 3 && views.iter().all(|v| *v > 0),
        "the three live replicas should have changed view: {views:?}"
    );

    // Another client's mount sees exactly what was written (its cache is empty).
    let second = MountProcess::start(cluster.config_path(), "1-2", &mp2, &dir.join("mount2.log"));
    let (m1, m2, r) = (mp1.clone(), mp2.clone(), reference.clone());
    tokio::task::spawn_blocking(move || {
        let want = snapshot(&r);
        assert!(want.len() > 40, "{}", want.len());
        let got = snapshot(&m2);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        );
        for (k, v) in &want {
            assert!(got[k] == *v, "{k} differs through the second mount");
        }
        assert!(snapshot(&m1) == want, "the first mount differs");
        // A hard link is one inode with two names.
        let (a, b) = (
            fs::metadata(m2.join("round2/hard")).unwrap(),
            fs::metadata(m2.join("round2/src/lib/f2.c")).unwrap(),
        );
        assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
        assert_eq!(
            fs::read_to_string(m2.join("log")).unwrap(),
            "round 1 written\nround 2 written\n"
        );
    })
    .await
    .unwrap();
    second.stop();
    first.stop();
}

#[test]
fn mount_explains_a_missing_mount_point() {
    let mut cmd = redoubt();
    cmd.args(["mount", "--local", "/nonexistent/redoubt-mnt"]);
    let out = output_within(cmd, Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/redoubt-mnt") && stderr.contains("mkdir -p")
            || stderr.contains("needs root")
            || stderr.contains("/dev/fuse"),
        "{stderr}"
    );
}

#[test]
fn andrew_benchmark_runs_its_five_phases_on_the_three_file_systems() {
    if !can_mount() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let mut cmd = redoubt();
    cmd.args([
        "bench", "andrew", "--quick", "--dirs", "2", "--files", "2", "--out",
    ])
    .arg(out.path());
    let stdout = common::stdout_of_success(cmd, Duration::from_secs(120));
    assert!(stdout.contains("| **total** |"), "{stdout}");
    let csv = fs::read_to_string(out.path().join("andrew.csv")).unwrap();
    // A header, then five phases of one run on each of the three.
    assert_eq!(csv.lines().count(), 1 + 5 * 3, "{csv}");
    for fs in ["plain", "fuse-local", "redoubt"] {
        assert!(csv.contains(&format!("{fs},1,make,")), "{csv}");
    }
    let svg = fs::read_to_string(out.path().join("andrew.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("redoubt (n = 4)"));
}
