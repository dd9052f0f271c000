//! The key holder outside the replica process: the stand-in for the papers' secure
//! co-processor.
//!
//! A principal's key-holder file holds the seed of its long-term secrets (an Ed25519 signing
//! key and an X25519 opening key); next to it, `<file>.counter` holds the key holder's
//! counter, written and synced before every signature is released, so it never goes
//! backwards across restarts, and `<file>.admitted` holds the counter of the last NEW-KEY it
//! admitted from each principal of the directory, written and synced before the key it
//! carries is released, so a NEW-KEY is never admitted twice (a replica's latest excepted, see
//! [`redoubt_keys::admits`]) across restarts and recoveries. For a replica, the files
//! are read only by the key-holder service (`redoubt keyholder`, or the one `redoubt monitor`
//! runs), which answers the replica over a Unix socket: sign a NEW-KEY or a recovery request,
//! draw a fresh session key, seal a key to a public key, admit a NEW-KEY (check its signature
//! against the directory and its counter, record the counter, open the key sealed to this
//! principal). It signs nothing else and opens nothing else.
//!
//! Threat model: an attacker who controls the replica process can ask the key holder for
//! signatures and openings while it is in control (as with the papers' co-processor), but it
//! cannot read the long-term secrets, roll the counter back, or make the key holder forget a
//! NEW-KEY it admitted (or record a counter no principal signed), provided the key holder runs
//! under a user the replica's user cannot act as and the key-holder file is readable only by
//! that user. After the watchdog restarts the replica from a trusted executable, the keys the
//! attacker saw are retired by the recovery's NEW-KEYs and everything it signed earlier carries
//! an older counter.
//!
//! Clients keep their key holder in their own process ([`FileHolder`]); they are not
//! proactively recovered.
//!
//! This crate knows nothing of cluster files: `redoubt-config` finds a principal's key-holder
//! file and socket from them, and the node serves a replica's key holder.

mod file;
mod socket;

pub use file::{read_holder_file, write_holder_file, FileHolder, HolderFile, COUNTER_RESERVE};
pub use socket::{serve, serve_shared, SocketHolder};

use redoubt_keys::Principal;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Why a key-holder file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HolderFileError {
    #[error("cannot read key-holder file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "key-holder file {path} is readable by others (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("key-holder file {path}: {message}")]
    Malformed { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Formats a principal as it appears in key files and messages: `replica:0`, `client:3`,
/// `executor:1`.
pub fn principal_name(p: Principal) -> String {
    match p {
        Principal::Replica(r) => format!("replica:{r}"),
        Principal::Client(c) => format!("client:{c}"),
        Principal::Executor(e) => format!("executor:{e}"),
        Principal::Filter(x) => format!("filter:{x}"),
    }
}

/// Parses `replica:N`, `client:N` or `executor:N`.
pub fn parse_principal(s: &str) -> Option<Principal> {
    let (kind, id) = s.split_once(':')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match kind {
        "replica" => id.parse().ok().map(Principal::Replica),
        "client" => id.parse().ok().map(Principal::Client),
        "executor" => id.parse().ok().map(Principal::Executor),
        _ => None,
    }
}

/// Lower-case hex digits of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Decodes 64 hex digits into 32 bytes.
pub fn unhex32(s: &str) -> Result<[u8; 32], String> {
    if s.len() != 64 || !s.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "expected 64 hex digits, found {} characters",
            s.len()
        ));
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::beside;
    use redoubt_crypto::pk::{self, HolderSecrets};
    use redoubt_crypto::{Digest, MacKey};
    use redoubt_keys::{Admitted, Directory, KeyHolder, Purpose};
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    #[test]
    fn principal_names() {
        for p in [Principal::Replica(0), Principal::Client(17)] {
            assert_eq!(parse_principal(&principal_name(p)), Some(p));
        }
        assert_eq!(parse_principal("replica:"), None);
        assert_eq!(parse_principal("replica:+1"), None);
        assert_eq!(parse_principal("node:1"), None);
    }

    #[test]
    fn counter_survives_restart_and_socket_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r0.holder");
        let me = Principal::Replica(0);
        let public = write_holder_file(&path, "cid", me, &[3; 32], None).unwrap();
        // Never overwritten.
        assert!(write_holder_file(&path, "cid", me, &[4; 32], None).is_err());
        let directory = Arc::new(Directory::default());
        let mut h =
            FileHolder::open(read_holder_file(&path, me).unwrap(), directory.clone()).unwrap();
        let (c1, _) = h.sign(Purpose::NewKey, &Digest::of(b"a")).unwrap();
        let (c2, _) = h.sign(Purpose::NewKey, &Digest::of(b"b")).unwrap();
        let epoch = redoubt_keys::EPOCH_SHIFT;
        assert_eq!((c1, c2), ((1 << epoch) + 1, (1 << epoch) + 2));
        // The monitor starts a new epoch when it restarts the replica.
        h.begin_epoch();
        let (c3, _) = h.sign(Purpose::NewKey, &Digest::of(b"c")).unwrap();
        assert_eq!(c3, (2 << epoch) + 1);
        drop(h);
        let h = FileHolder::open(read_holder_file(&path, me).unwrap(), directory).unwrap();
        // Opening starts an epoch above the block reserved before: the counter never goes
        // backwards.
        assert_eq!(h.counter(), 3 << epoch, "the counter never goes backwards");
        assert!(h.counter() > c3 + file::COUNTER_RESERVE);
        assert_eq!(h.public(), public);
        assert!(read_holder_file(&path, Principal::Replica(1)).is_err());

        let sock = dir.path().join("kh.sock");
        serve(&sock, h).unwrap();
        let mut remote = SocketHolder::connect(&sock, me).unwrap();
        let content = Digest::of(b"c");
        let (c4, sig) = remote.sign(Purpose::Recovery, &content).unwrap();
        assert_eq!(c4, (3 << epoch) + 1);
        let st = redoubt_keys::holder_statement(Purpose::Recovery, me, c4, &content);
        assert!(pk::verify(&public.verify, &st.0, &sig));
        let k = remote.fresh_key().unwrap();
        let sealed = remote.seal(&public.seal, b"i", &k).unwrap();
        let secrets = HolderSecrets::from_seed(&[3; 32]);
        assert_eq!(secrets.open_key(b"i", &sealed).map(MacKey), Some(k));
        assert!(SocketHolder::connect(&sock, Principal::Replica(1)).is_err());
        // No executors' secret in this file: opening a body session is refused, not faked.
        assert!(remote.open_body(b"c", &[9; 32]).is_err());

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            read_holder_file(&path, me),
            Err(HolderFileError::Permissions { .. })
        ));
    }

    #[test]
    fn the_socket_appears_listening_and_private_replacing_stale_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r2.holder");
        let me = Principal::Replica(2);
        write_holder_file(&path, "cid", me, &[3; 32], None).unwrap();
        let h = FileHolder::open(
            read_holder_file(&path, me).unwrap(),
            Arc::new(Directory::default()),
        )
        .unwrap();
        // Left behind: a stale socket path, and a dangling link at its staging name.
        let sock = dir.path().join("kh.sock");
        std::fs::write(&sock, b"stale").unwrap();
        std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("kh.sock~")).unwrap();
        serve(&sock, h).unwrap();
        let meta = std::fs::symlink_metadata(&sock).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(std::fs::symlink_metadata(dir.path().join("kh.sock~")).is_err());
        // Connectable the moment its path exists (the launcher waits for the path only).
        assert!(SocketHolder::connect(&sock, me).is_ok());
        // A path too long for the staging name is refused naming the name that did not bind.
        let base = dir.path().as_os_str().len() + 1;
        let long = dir
            .path()
            .join("k".repeat(107usize.saturating_sub(base).max(1)));
        let h = FileHolder::open(
            read_holder_file(&path, me).unwrap(),
            Arc::new(Directory::default()),
        )
        .unwrap();
        let err = serve(&long, h).unwrap_err().to_string();
        assert!(err.contains(&format!("{}~", long.display())), "{err}");
    }

    #[test]
    fn an_executors_secret_in_the_file_opens_client_sessions_over_the_socket() {
        use redoubt_crypto::body::{establish, ExecutorSecret};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r1.holder");
        let me = Principal::Replica(1);
        write_holder_file(&path, "cid", me, &[3; 32], Some(&[8; 32])).unwrap();
        let h = FileHolder::open(
            read_holder_file(&path, me).unwrap(),
            Arc::new(Directory::default()),
        )
        .unwrap();
        let executors = ExecutorSecret::from_seed(&[8; 32]).public();
        assert_eq!(h.executors_public(), Some(executors));
        let sock = dir.path().join("kh.sock");
        serve(&sock, h).unwrap();
        let mut remote = SocketHolder::connect(&sock, me).unwrap();
        let (enc, key) = establish(&executors, b"client 4", [5; 32]).unwrap();
        assert_eq!(remote.open_body(b"client 4", &enc).unwrap(), Some(key));
        assert_eq!(remote.open_body(b"client 4", &[0; 32]).unwrap(), None);
    }

    const R0: Principal = Principal::Replica(0);
    const R1: Principal = Principal::Replica(1);
    const C1: Principal = Principal::Client(1);

    /// The directory of replica 0 (key-holder seed `[3; 32]`), replica 1 and client 1, and
    /// session keys of replica 1 and client 1 to send NEW-KEYs from.
    fn peers() -> (
        Arc<Directory>,
        redoubt_core::SessionKeys,
        redoubt_core::SessionKeys,
    ) {
        let secrets = |p: Principal| match p {
            Principal::Replica(0) => HolderSecrets::from_seed(&[3; 32]),
            Principal::Replica(_) => HolderSecrets::from_seed(&[5; 32]),
            Principal::Client(_) | Principal::Executor(_) | Principal::Filter(_) => {
                HolderSecrets::from_seed(&[7; 32])
            }
        };
        let directory = Arc::new(Directory {
            keys: [R0, R1, C1]
                .into_iter()
                .map(|p| (p, secrets(p).public()))
                .collect(),
            executors: None,
        });
        let session = |p: Principal| {
            let holder = redoubt_keys::LocalHolder::new(
                p,
                secrets(p),
                directory.clone(),
                Default::default(),
                Default::default(),
                [9; 32],
            );
            redoubt_core::SessionKeys::new(Box::new(holder), directory.clone())
        };
        (directory.clone(), session(R1), session(C1))
    }

    /// Review finding 3: the counters of admitted NEW-KEYs are the key holder's, kept on disk,
    /// so a replayed NEW-KEY is refused after a restart, over the socket too, and a forged one
    /// cannot raise them.
    #[test]
    fn admitted_counters_survive_reopening_and_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r0.holder");
        write_holder_file(&path, "cid", R0, &[3; 32], None).unwrap();
        let (directory, mut r1, mut c1) = peers();
        let open = || FileHolder::open(read_holder_file(&path, R0).unwrap(), directory.clone());
        let mut h = open().unwrap();
        assert_eq!(h.admitted(C1), None, "no file: nothing admitted yet");
        let client_old = c1.refresh(&[R0]).unwrap();
        let client_latest = c1.refresh(&[R0]).unwrap();
        let replica_old = r1.refresh(&[R0]).unwrap();
        let replica_latest = r1.refresh(&[R0]).unwrap();
        assert!(matches!(h.admit(&client_old), Ok(Admitted::Key(_))));
        assert!(matches!(h.admit(&client_latest), Ok(Admitted::Key(_))));
        assert_eq!(h.admit(&client_latest), Ok(Admitted::Stale));
        assert!(matches!(h.admit(&replica_latest), Ok(Admitted::Key(_))));
        // Refusals that name their reason.
        assert_eq!(
            h.admit(&c1.refresh(&[R1]).unwrap()),
            Ok(Admitted::NoKey),
            "no key for replica 0 in it"
        );
        let mut stranger = client_latest.clone();
        stranger.from = Principal::Client(77);
        assert_eq!(h.admit(&stranger), Ok(Admitted::UnknownSender));
        drop(h);

        // Reopened (the key holder restarted): the replays are refused, the replica's latest
        // NEW-KEY is admitted again and opens to the key replica 1 chose.
        let mut h = open().unwrap();
        assert_eq!(h.admitted(C1), Some(client_latest.counter));
        assert_eq!(h.admitted(R1), Some(replica_latest.counter));
        assert_eq!(h.admit(&client_old), Ok(Admitted::Stale));
        assert_eq!(h.admit(&client_latest), Ok(Admitted::Stale));
        assert_eq!(h.admit(&replica_old), Ok(Admitted::Stale));
        let chosen = r1.steal().inbound[&R0].clone();
        assert_eq!(h.admit(&replica_latest), Ok(Admitted::Key(chosen)));

        // A forged NEW-KEY with a huge counter is refused and leaves the record alone.
        let mut forged = c1.refresh(&[R0]).unwrap();
        let genuine = forged.counter;
        forged.counter = u64::MAX;
        assert_eq!(h.admit(&forged), Ok(Admitted::BadSignature));
        assert_eq!(h.admitted(C1), Some(client_latest.counter));
        drop(h);

        // Over the socket, after another restart.
        let sock = dir.path().join("kh.sock");
        serve(&sock, open().unwrap()).unwrap();
        let mut remote = SocketHolder::connect(&sock, R0).unwrap();
        assert_eq!(remote.admit(&forged), Ok(Admitted::BadSignature));
        assert_eq!(remote.admit(&client_latest), Ok(Admitted::Stale));
        forged.counter = genuine;
        let chosen = c1.steal().inbound[&R0].clone();
        assert_eq!(remote.admit(&forged), Ok(Admitted::Key(chosen)));
        assert_eq!(remote.admit(&forged), Ok(Admitted::Stale));
        drop(remote);
        assert_eq!(open().unwrap().admitted(C1), Some(genuine));

        // The file: one line per principal; unknown principals dropped; garbage refused.
        let admitted_path = beside(&path, ".admitted");
        let text = std::fs::read_to_string(&admitted_path).unwrap();
        assert!(text.contains(&format!("client:1 {genuine}\n")), "{text}");
        std::fs::write(&admitted_path, "client:77 5\nclient:1 3\n").unwrap();
        let h = open().unwrap();
        assert_eq!(h.admitted(Principal::Client(77)), None);
        assert_eq!(h.admitted(C1), Some(3));
        for bad in [
            "client:1 x\n",
            "client:1\n",
            "clown:1 3\n",
            "client:1 3\nclient:1 4\n",
        ] {
            std::fs::write(&admitted_path, bad).unwrap();
            let msg = open().err().expect("malformed").to_string();
            assert!(
                msg.contains("r0.holder.admitted") && msg.contains("line"),
                "{msg}"
            );
        }
    }
}
