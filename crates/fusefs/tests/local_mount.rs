//! The FUSE layer mounted over the in-process file service ([`LocalBackend`]): what programs
//! see through the kernel. Needs root and /dev/fuse; passes with a message without them.

use redoubt_fusefs::{
    check_can_mount, is_mount_point, mount, CallStats, LocalBackend, MountOptions,
};
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::panic::AssertUnwindSafe;
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Mounts a fresh 16 MiB local file system at a temporary directory, runs `f` on it, and
/// unmounts; the operations the mount sent, by name. Skipped (None) without root or FUSE.
fn with_mount(
    write_behind: bool,
    ttl: Duration,
    f: impl FnOnce(&std::path::Path, &CallStats),
) -> Option<Vec<(&'static str, u64)>> {
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    if let Err(e) = check_can_mount(&mp) {
        println!("SKIPPED: cannot mount FUSE here: {e}");
        return None;
    }
    let rt = runtime();
    let options = MountOptions {
        ttl,
        write_behind,
        ..MountOptions::default()
    };
    let mounted = mount(
        LocalBackend::new(16 << 20).unwrap(),
        &mp,
        rt.handle().clone(),
        &options,
    )
    .unwrap();
    assert!(is_mount_point(&mp));
    let stats = mounted.stats();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(&mp, &stats)));
    mounted.unmount().unwrap();
    assert!(!is_mount_point(&mp));
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    Some(
        stats
            .snapshot()
            .into_iter()
            .map(|(op, c)| (op, c.count))
            .collect(),
    )
}

#[test]
fn posix_operations_through_the_kernel() {
    for write_behind in [true, false] {
        with_mount(write_behind, Duration::from_millis(100), |mp, _| {
            exercise(mp)
        });
    }
}

fn count(calls: &[(&'static str, u64)], op: &str) -> u64 {
    calls.iter().find(|c| c.0 == op).map_or(0, |c| c.1)
}

fn writes_sent(stats: &CallStats) -> u64 {
    stats
        .snapshot()
        .iter()
        .find(|c| c.0 == "write")
        .map_or(0, |c| c.1.count)
}

/// An object file written as an assembler writes it: small pieces at scattered offsets through
/// one open file, with reads between them. Held back, the pieces go to the service as one write
/// at close, and the program reads back what it wrote all along; written through, each is an
/// operation.
#[test]
fn pieces_of_one_open_file_go_out_as_one_write_at_close() {
    let pieces: Vec<(u64, Vec<u8>)> = (0..12u64)
        .map(|i| {
            (
                (i * 7_919) % 30_000,
                vec![b'a' + i as u8; 100 + i as usize * 37],
            )
        })
        .collect();
    let mut want = Vec::new();
    for (o, d) in &pieces {
        let o = *o as usize;
        if want.len() < o + d.len() {
            want.resize(o + d.len(), 0);
        }
        want[o..o + d.len()].copy_from_slice(d);
    }
    let run = |write_behind: bool| {
        let (pieces, want) = (pieces.clone(), want.clone());
        with_mount(write_behind, Duration::from_secs(60), move |mp, _| {
            let path = mp.join("obj.o");
            let mut f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            let mut sofar: Vec<u8> = Vec::new();
            for (o, d) in &pieces {
                f.seek(SeekFrom::Start(*o)).unwrap();
                f.write_all(d).unwrap();
                let o = *o as usize;
                if sofar.len() < o + d.len() {
                    sofar.resize(o + d.len(), 0);
                }
                sofar[o..o + d.len()].copy_from_slice(d);
                // Read back through the kernel, from another descriptor too.
                assert_eq!(fs::metadata(&path).unwrap().len(), sofar.len() as u64);
                assert_eq!(fs::read(&path).unwrap(), sofar);
            }
            drop(f);
            assert_eq!(fs::read(&path).unwrap(), want);
            // fsync sends too, and a truncation comes after what was held.
            let mut f = fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.seek(SeekFrom::Start(5)).unwrap();
            f.write_all(b"Z").unwrap();
            f.sync_all().unwrap();
            f.write_all(b"Y").unwrap();
            f.set_len(6).unwrap();
            drop(f);
            let mut head = want[..6].to_vec();
            head[5] = b'Z';
            assert_eq!(fs::read(&path).unwrap(), head);
            let mut s = String::new();
            fs::File::open(&path)
                .unwrap()
                .read_to_string(&mut s)
                .unwrap();
            assert_eq!(s.as_bytes(), head);
        })
    };
    let Some(behind) = run(true) else {
        return;
    };
    let through = run(false).unwrap();
    assert_eq!(count(&through, "write"), pieces.len() as u64 + 2);
    assert_eq!(
        count(&behind, "write"),
        3,
        "one write at close, one at fsync, one before the truncation: {behind:?}"
    );
    assert!(
        count(&behind, "read") < count(&through, "read")
            && count(&behind, "getattr") < count(&through, "getattr"),
        "held data answers the program's reads and stats: {behind:?} against {through:?}"
    );
}

/// A write never closed reaches the service after about the TTL: the mount's own periodic
/// send, seen in its operation count while the file is still open.
#[test]
fn a_write_left_open_is_sent_after_the_ttl() {
    with_mount(true, Duration::from_millis(200), |mp, stats| {
        let mut f = fs::File::create(mp.join("log")).unwrap();
        f.write_all(b"line 1\n").unwrap();
        assert_eq!(writes_sent(stats), 0, "held");
        std::thread::sleep(Duration::from_millis(1_000));
        assert_eq!(writes_sent(stats), 1, "sent while the file is open");
        assert_eq!(fs::read(mp.join("log")).unwrap(), b"line 1\n");
        drop(f);
        assert_eq!(writes_sent(stats), 1, "nothing left to send at close");
    });
}

/// `df` after `rm`: the space of deleted files shows free again.
#[test]
fn deleted_files_give_their_space_back_to_statfs() {
    with_mount(true, Duration::from_millis(100), |mp, _| {
        let free = || {
            let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid path and a zeroed out-struct.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
            st.f_bfree * st.f_bsize
        };
        let empty = free();
        let data = vec![3u8; 4 << 20];
        fs::write(mp.join("big"), &data).unwrap();
        let full = free();
        assert!(empty - full >= 4 << 20, "{empty} then {full}");
        fs::remove_file(mp.join("big")).unwrap();
        let after = free();
        assert!(
            after + (256 << 10) >= empty,
            "free before {empty}, after writing {full}, after deleting {after}"
        );
    });
}

fn exercise(mp: &std::path::Path) {
    // Directories, files, appends, a write across the 128 KiB limit of one operation.
    fs::create_dir_all(mp.join("a/b/c")).unwrap();
    fs::write(mp.join("a/b/c/f"), b"hello").unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(mp.join("a/b/c/f"))
        .unwrap()
        .write_all(b", world")
        .unwrap();
    assert_eq!(fs::read(mp.join("a/b/c/f")).unwrap(), b"hello, world");
    let big: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(mp.join("big"), &big).unwrap();
    assert_eq!(fs::read(mp.join("big")).unwrap(), big);
    assert_eq!(
        fs::metadata(mp.join("big")).unwrap().len(),
        big.len() as u64
    );
    // Reads and writes at offsets, and a hole.
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mp.join("big"))
        .unwrap();
    f.seek(SeekFrom::Start(1_000_000)).unwrap();
    f.write_all(b"tail").unwrap();
    f.seek(SeekFrom::Start(699_999)).unwrap();
    let mut buf = vec![0u8; 10];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(buf[0], big[699_999]);
    assert_eq!(&buf[1..], &[0u8; 9]);
    drop(f);
    assert_eq!(fs::metadata(mp.join("big")).unwrap().len(), 1_000_004);

    // Truncate, chmod, times.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(mp.join("big"))
        .unwrap();
    f.set_len(10).unwrap();
    drop(f);
    assert_eq!(fs::read(mp.join("big")).unwrap(), &big[..10]);
    fs::set_permissions(mp.join("big"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(mp.join("big")).unwrap().mode() & 0o7777, 0o600);
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    fs::File::open(mp.join("big"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    assert_eq!(
        fs::metadata(mp.join("big")).unwrap().modified().unwrap(),
        when
    );

    // Symbolic and hard links, rename.
    std::os::unix::fs::symlink("a/b/c/f", mp.join("s")).unwrap();
    assert_eq!(
        fs::read_link(mp.join("s")).unwrap().to_str(),
        Some("a/b/c/f")
    );
    assert_eq!(fs::read(mp.join("s")).unwrap(), b"hello, world");
    fs::hard_link(mp.join("a/b/c/f"), mp.join("h")).unwrap();
    assert_eq!(fs::metadata(mp.join("h")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(mp.join("h")).unwrap().ino(),
        fs::metadata(mp.join("a/b/c/f")).unwrap().ino()
    );
    fs::rename(mp.join("h"), mp.join("a/moved")).unwrap();
    assert!(!mp.join("h").exists());
    assert_eq!(fs::read(mp.join("a/moved")).unwrap(), b"hello, world");

    // Listing: "." and "..", every name, many entries across the service's pages.
    fs::create_dir(mp.join("many")).unwrap();
    for i in 0..1500 {
        fs::write(mp.join(format!("many/{i:04}")), i.to_string()).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(mp.join("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 1500);
    assert_eq!(names[0], "0000");
    assert_eq!(names[1499], "1499");

    // Errors programs rely on.
    let err = |r: std::io::Result<()>| r.unwrap_err().raw_os_error().unwrap();
    assert_eq!(err(fs::remove_dir(mp.join("a"))), libc::ENOTEMPTY);
    assert_eq!(err(fs::create_dir(mp.join("a"))), libc::EEXIST);
    assert_eq!(
        err(fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(mp.join("big"))
            .map(drop)),
        libc::EEXIST
    );
    assert_eq!(err(fs::remove_file(mp.join("nope"))), libc::ENOENT);
    let fifo =
        std::ffi::CString::new(mp.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );

    // Removal.
    fs::remove_file(mp.join("a/moved")).unwrap();
    assert_eq!(fs::metadata(mp.join("a/b/c/f")).unwrap().nlink(), 1);
    fs::remove_dir_all(mp.join("a")).unwrap();
    fs::remove_dir_all(mp.join("many")).unwrap();
    let left: Vec<_> = fs::read_dir(mp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");

    // statfs sees the state's capacity.
    let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path and a zeroed out-struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_bsize, 4096);
    assert!(st.f_blocks > 3000 && st.f_blocks <= 4096, "{}", st.f_blocks);
    assert!(st.f_bfree > 0 && st.f_bfree <= st.f_blocks);
}
