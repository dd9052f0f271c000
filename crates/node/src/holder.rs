//! The key holder outside the replica process: the stand-in for the papers' secure
//! co-processor.
//!
//! A principal's key-holder file holds the seed of its long-term secrets (an Ed25519 signing
//! key and an X25519 opening key); next to it, `<file>.counter` holds the key holder's
//! counter, written and synced before every signature is released, so it never goes
//! backwards across restarts, and `<file>.admitted` holds the counter of the last NEW-KEY it
//! admitted from each principal of the directory, written and synced before the key it
//! carries is released, so a NEW-KEY is never admitted twice (a replica's latest excepted, see
//! [`redoubt_core::keys::admits`]) across restarts and recoveries. For a replica, the files
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

use crate::config::{parse_principal, principal_name};
use redoubt_core::keys::{Admitted, Directory, HolderError, KeyHolder, NewKey, Purpose};
use redoubt_core::Principal;
use redoubt_crypto::pk::{self, HolderSecrets, SealPublicKey, Signature};
use redoubt_crypto::{Digest, MacKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Largest request or answer on the key-holder socket (bytes).
const FRAME_MAX: usize = 64 << 10;
/// How long the replica waits for its key holder before reporting it unreachable.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHolderFile {
    principal: String,
    cluster_id: String,
    seed: String,
}

/// A key-holder file, read.
pub struct HolderFile {
    pub principal: Principal,
    pub cluster_id: String,
    pub secrets: HolderSecrets,
    pub path: PathBuf,
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

pub(crate) fn unhex32(s: &str) -> Result<[u8; 32], String> {
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

/// Writes a new key-holder file (mode 0600, never overwriting) with a seed from the operating
/// system's generator; returns the principal's public keys.
pub fn write_holder_file(
    path: &Path,
    cluster_id: &str,
    me: Principal,
    seed: &[u8; 32],
) -> Result<pk::PublicKeys, HolderFileError> {
    let text = format!(
        "# redoubt key-holder file of {who}: the seed of its long-term signing and opening keys.\n\
         # Readable only by the key holder (mode 0600); never copy it to another host.\n\
         principal = \"{who}\"\ncluster_id = \"{cluster_id}\"\nseed = \"{seed}\"\n",
        who = principal_name(me),
        seed = hex(seed),
    );
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| HolderFileError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|source| HolderFileError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(HolderSecrets::from_seed(seed).public())
}

/// Reads and checks a key-holder file: mode 0600 or stricter, the expected principal.
pub fn read_holder_file(path: &Path, me: Principal) -> Result<HolderFile, HolderFileError> {
    let read = |source| HolderFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(HolderFileError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    let src = std::fs::read_to_string(path).map_err(read)?;
    let malformed = |message: String| HolderFileError::Malformed {
        path: path.to_path_buf(),
        message,
    };
    let raw: RawHolderFile =
        toml::from_str(&src).map_err(|e| malformed(e.message().trim().to_string()))?;
    let principal = parse_principal(&raw.principal).ok_or_else(|| {
        malformed(format!(
            "principal {:?} is not replica:N or client:N",
            raw.principal
        ))
    })?;
    if principal != me {
        return Err(malformed(format!(
            "it belongs to {}, not to {}",
            principal_name(principal),
            principal_name(me)
        )));
    }
    let seed = unhex32(&raw.seed).map_err(|e| malformed(format!("seed: {e}")))?;
    Ok(HolderFile {
        principal,
        cluster_id: raw.cluster_id,
        secrets: HolderSecrets::from_seed(&seed),
        path: path.to_path_buf(),
    })
}

/// A key holder over a key-holder file: secrets in memory, randomness from the operating
/// system, the counter persisted in `<file>.counter` before each signature is released, and
/// the last NEW-KEY counter admitted from each principal persisted in `<file>.admitted` before
/// the key it carries is released.
pub struct FileHolder {
    who: Principal,
    secrets: HolderSecrets,
    directory: Arc<Directory>,
    counter: u64,
    counter_path: PathBuf,
    admitted: BTreeMap<Principal, u64>,
    admitted_path: PathBuf,
}

/// `path` with `suffix` appended to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(suffix);
    PathBuf::from(p)
}

/// Reads a file the key holder keeps; `None` if it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, HolderFileError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HolderFileError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses `<file>.admitted`: one `<principal> <counter>` per line (`#` comments and blank
/// lines ignored). Principals not in `directory` are dropped: they cannot be admitted, and
/// the record stays bounded by the directory.
fn parse_admitted(
    path: &Path,
    text: &str,
    directory: &Directory,
) -> Result<BTreeMap<Principal, u64>, HolderFileError> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let malformed = |message: String| HolderFileError::Malformed {
            path: path.to_path_buf(),
            message: format!("line {}: {message}", i + 1),
        };
        let mut words = line.split_whitespace();
        let (Some(who), Some(counter), None) = (words.next(), words.next(), words.next()) else {
            return Err(malformed(format!(
                "expected `<principal> <counter>`, found {line:?}"
            )));
        };
        let p = parse_principal(who)
            .ok_or_else(|| malformed(format!("{who:?} is not replica:N or client:N")))?;
        let counter = counter
            .parse::<u64>()
            .map_err(|e| malformed(format!("counter {counter:?}: {e}")))?;
        if out.insert(p, counter).is_some() {
            return Err(malformed(format!("{who} is listed twice")));
        }
    }
    out.retain(|p, _| directory.get(*p).is_some());
    Ok(out)
}

fn format_admitted(admitted: &BTreeMap<Principal, u64>) -> String {
    let mut text = String::from(
        "# redoubt key holder: the counter of the last NEW-KEY admitted from each principal.\n\
         # Written by the key holder before it releases a key; never edit or delete it.\n",
    );
    for (p, c) in admitted {
        let _ = writeln!(text, "{} {c}", principal_name(*p));
    }
    text
}

/// Replaces `path` by `text` durably: a synced temporary file renamed over it, then the
/// directory synced.
fn write_synced(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = beside(path, ".tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

impl FileHolder {
    /// Opens the key holder of `file`, which admits NEW-KEYs from the principals of
    /// `directory`, with its counter and admitted counters as persisted beside the file.
    pub fn open(
        file: HolderFile,
        directory: Arc<Directory>,
    ) -> Result<FileHolder, HolderFileError> {
        let counter_path = beside(&file.path, ".counter");
        let counter = match read_optional(&counter_path)? {
            Some(s) => s
                .trim()
                .parse::<u64>()
                .map_err(|e| HolderFileError::Malformed {
                    path: counter_path.clone(),
                    message: format!("counter: {e}"),
                })?,
            None => 0,
        };
        let admitted_path = beside(&file.path, ".admitted");
        let admitted = match read_optional(&admitted_path)? {
            Some(s) => parse_admitted(&admitted_path, &s, &directory)?,
            None => BTreeMap::new(),
        };
        Ok(FileHolder {
            who: file.principal,
            secrets: file.secrets,
            directory,
            counter,
            counter_path,
            admitted,
            admitted_path,
        })
    }

    /// The current counter value.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// The counter of the last NEW-KEY admitted from `p`.
    pub fn admitted(&self, p: Principal) -> Option<u64> {
        self.admitted.get(&p).copied()
    }

    pub fn public(&self) -> pk::PublicKeys {
        self.secrets.public()
    }

    fn persist_counter(&self, value: u64) -> std::io::Result<()> {
        write_synced(&self.counter_path, &format!("{value}\n"))
    }
}

fn random32() -> [u8; 32] {
    use rand::Rng as _;
    let mut out = [0u8; 32];
    rand::rng().fill_bytes(&mut out);
    out
}

impl KeyHolder for FileHolder {
    fn principal(&self) -> Principal {
        self.who
    }
    fn sign(
        &mut self,
        purpose: Purpose,
        content: &Digest,
    ) -> Result<(u64, Signature), HolderError> {
        let next = self.counter + 1;
        self.persist_counter(next)
            .map_err(|e| HolderError::Refused(format!("cannot persist the counter: {e}")))?;
        self.counter = next;
        let st = redoubt_core::keys::holder_statement(purpose, self.who, next, content);
        Ok((next, self.secrets.sign(&st.0)))
    }
    fn fresh_key(&mut self) -> Result<MacKey, HolderError> {
        Ok(MacKey(random32()))
    }
    fn seal(
        &mut self,
        to: &SealPublicKey,
        info: &[u8],
        key: &MacKey,
    ) -> Result<Vec<u8>, HolderError> {
        Ok(pk::seal_key(to, info, &key.0, random32()))
    }
    fn admit(&mut self, nk: &NewKey) -> Result<Admitted, HolderError> {
        let path = &self.admitted_path;
        redoubt_core::keys::admit_new_key(
            self.who,
            &self.secrets,
            &self.directory,
            &mut self.admitted,
            nk,
            |next| {
                write_synced(path, &format_admitted(next)).map_err(|e| {
                    HolderError::Refused(format!(
                        "cannot persist the admitted counters in {}: {e}",
                        path.display()
                    ))
                })
            },
        )
    }
}

/// What the replica asks its key holder.
#[derive(Debug, Serialize, Deserialize)]
enum Request {
    Principal,
    Sign {
        purpose: Purpose,
        content: Digest,
    },
    FreshKey,
    Seal {
        to: SealPublicKey,
        info: Vec<u8>,
        key: MacKey,
    },
    Admit(NewKey),
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Principal(Principal),
    Signed(u64, Signature),
    Key(MacKey),
    Sealed(Vec<u8>),
    Admitted(Admitted),
    Error(String),
}

fn write_frame(s: &mut UnixStream, body: &[u8]) -> std::io::Result<()> {
    s.write_all(&(body.len() as u32).to_le_bytes())?;
    s.write_all(body)
}

fn read_frame(s: &mut UnixStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {FRAME_MAX}"),
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// Serves `holder` on a Unix socket at `path` (replacing a stale socket; mode 0600) until the
/// process ends. One connection at a time is enough: the replica holds one.
pub fn serve(path: &Path, holder: FileHolder) -> std::io::Result<std::thread::JoinHandle<()>> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let holder = std::sync::Arc::new(std::sync::Mutex::new(holder));
    let handle = std::thread::Builder::new()
        .name("keyholder".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let holder = holder.clone();
                let _ = std::thread::Builder::new()
                    .name("keyholder-conn".into())
                    .spawn(move || {
                        while let Ok(body) = read_frame(&mut conn) {
                            let answer = match postcard::from_bytes::<Request>(&body) {
                                Ok(req) => {
                                    let mut h = holder.lock().unwrap_or_else(|e| e.into_inner());
                                    answer(&mut h, req)
                                }
                                Err(e) => Answer::Error(format!("malformed request: {e}")),
                            };
                            let out = postcard::to_stdvec(&answer).expect("answers encode");
                            if write_frame(&mut conn, &out).is_err() {
                                break;
                            }
                        }
                    });
            }
        })?;
    Ok(handle)
}

fn answer(h: &mut FileHolder, req: Request) -> Answer {
    let err = |e: HolderError| Answer::Error(e.to_string());
    match req {
        Request::Principal => Answer::Principal(h.principal()),
        Request::Sign { purpose, content } => match h.sign(purpose, &content) {
            Ok((c, s)) => Answer::Signed(c, s),
            Err(e) => err(e),
        },
        Request::FreshKey => h.fresh_key().map_or_else(err, Answer::Key),
        Request::Seal { to, info, key } => {
            h.seal(&to, &info, &key).map_or_else(err, Answer::Sealed)
        }
        Request::Admit(nk) => h.admit(&nk).map_or_else(err, Answer::Admitted),
    }
}

/// Opens replica `id`'s key-holder file (checked against the cluster) and serves it on the
/// replica's `holder_socket`, in threads of this process. Returns the socket path.
pub fn serve_for_replica(
    cfg: &crate::config::ClusterConfig,
    id: u32,
) -> Result<PathBuf, crate::config::ConfigError> {
    use crate::config::ConfigError;
    if !cfg.keys.session() {
        return Err(ConfigError::Invalid {
            path: cfg.path.clone(),
            field: "[keys] mode".into(),
            message: "it is \"static\": there is no key holder to run".into(),
        });
    }
    let me = Principal::Replica(id);
    let file = read_holder_file(&cfg.key_file_of(me)?, me)?;
    crate::keys::check_holder_cluster(cfg, &file)?;
    let directory = Arc::new(crate::keys::load_directory(cfg)?);
    let holder = FileHolder::open(file, directory)?;
    let socket = cfg.holder_socket_of(id)?;
    let io = ConfigError::io;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
    }
    serve(&socket, holder).map_err(io("serve the key holder on", &socket))?;
    Ok(socket)
}

/// The replica's side of the key-holder socket. Calls block (briefly) the caller; a broken
/// connection is re-opened on the next call.
pub struct SocketHolder {
    who: Principal,
    path: PathBuf,
    conn: Option<UnixStream>,
}

impl SocketHolder {
    /// Connects and checks that the key holder serves `who`.
    pub fn connect(path: &Path, who: Principal) -> Result<SocketHolder, HolderError> {
        let mut h = SocketHolder {
            who,
            path: path.to_path_buf(),
            conn: None,
        };
        match h.call(Request::Principal)? {
            Answer::Principal(p) if p == who => Ok(h),
            Answer::Principal(p) => Err(HolderError::Refused(format!(
                "the key holder at {} serves {}, not {}",
                path.display(),
                principal_name(p),
                principal_name(who)
            ))),
            other => Err(HolderError::Refused(format!("unexpected answer {other:?}"))),
        }
    }

    fn call(&mut self, req: Request) -> Result<Answer, HolderError> {
        let body = postcard::to_stdvec(&req).expect("requests encode");
        if body.len() > FRAME_MAX {
            // The key holder would drop the connection; a NEW-KEY this large is not one a
            // principal of the cluster sends.
            return Err(HolderError::Refused(format!(
                "a request of {} bytes exceeds the key holder's {FRAME_MAX}",
                body.len()
            )));
        }
        for attempt in 0..2 {
            if self.conn.is_none() {
                let c = UnixStream::connect(&self.path).map_err(|e| {
                    HolderError::Unreachable(format!("{}: {e}", self.path.display()))
                })?;
                let _ = c.set_read_timeout(Some(SOCKET_TIMEOUT));
                let _ = c.set_write_timeout(Some(SOCKET_TIMEOUT));
                self.conn = Some(c);
            }
            let conn = self.conn.as_mut().expect("connected");
            match write_frame(conn, &body).and_then(|_| read_frame(conn)) {
                Ok(out) => {
                    return match postcard::from_bytes::<Answer>(&out) {
                        Ok(Answer::Error(e)) => Err(HolderError::Refused(e)),
                        Ok(a) => Ok(a),
                        Err(e) => Err(HolderError::Refused(format!("malformed answer: {e}"))),
                    }
                }
                Err(e) => {
                    self.conn = None;
                    if attempt == 1 {
                        return Err(HolderError::Unreachable(format!(
                            "{}: {e}",
                            self.path.display()
                        )));
                    }
                }
            }
        }
        unreachable!("the loop returns")
    }
}

impl KeyHolder for SocketHolder {
    fn principal(&self) -> Principal {
        self.who
    }
    fn sign(
        &mut self,
        purpose: Purpose,
        content: &Digest,
    ) -> Result<(u64, Signature), HolderError> {
        match self.call(Request::Sign {
            purpose,
            content: *content,
        })? {
            Answer::Signed(c, s) => Ok((c, s)),
            other => Err(HolderError::Refused(format!("unexpected answer {other:?}"))),
        }
    }
    fn fresh_key(&mut self) -> Result<MacKey, HolderError> {
        match self.call(Request::FreshKey)? {
            Answer::Key(k) => Ok(k),
            other => Err(HolderError::Refused(format!("unexpected answer {other:?}"))),
        }
    }
    fn seal(
        &mut self,
        to: &SealPublicKey,
        info: &[u8],
        key: &MacKey,
    ) -> Result<Vec<u8>, HolderError> {
        match self.call(Request::Seal {
            to: *to,
            info: info.to_vec(),
            key: key.clone(),
        })? {
            Answer::Sealed(s) => Ok(s),
            other => Err(HolderError::Refused(format!("unexpected answer {other:?}"))),
        }
    }
    fn admit(&mut self, nk: &NewKey) -> Result<Admitted, HolderError> {
        match self.call(Request::Admit(nk.clone()))? {
            Answer::Admitted(a) => Ok(a),
            other => Err(HolderError::Refused(format!("unexpected answer {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_survives_restart_and_socket_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r0.holder");
        let me = Principal::Replica(0);
        let public = write_holder_file(&path, "cid", me, &[3; 32]).unwrap();
        // Never overwritten.
        assert!(write_holder_file(&path, "cid", me, &[4; 32]).is_err());
        let directory = Arc::new(Directory::default());
        let mut h =
            FileHolder::open(read_holder_file(&path, me).unwrap(), directory.clone()).unwrap();
        let (c1, _) = h.sign(Purpose::NewKey, &Digest::of(b"a")).unwrap();
        let (c2, _) = h.sign(Purpose::NewKey, &Digest::of(b"b")).unwrap();
        assert_eq!((c1, c2), (1, 2));
        drop(h);
        let h = FileHolder::open(read_holder_file(&path, me).unwrap(), directory).unwrap();
        assert_eq!(h.counter(), 2, "the counter never goes backwards");
        assert_eq!(h.public(), public);
        assert!(read_holder_file(&path, Principal::Replica(1)).is_err());

        let sock = dir.path().join("kh.sock");
        serve(&sock, h).unwrap();
        let mut remote = SocketHolder::connect(&sock, me).unwrap();
        let content = Digest::of(b"c");
        let (c3, sig) = remote.sign(Purpose::Recovery, &content).unwrap();
        assert_eq!(c3, 3);
        let st = redoubt_core::keys::holder_statement(Purpose::Recovery, me, 3, &content);
        assert!(pk::verify(&public.verify, &st.0, &sig));
        let k = remote.fresh_key().unwrap();
        let sealed = remote.seal(&public.seal, b"i", &k).unwrap();
        let secrets = HolderSecrets::from_seed(&[3; 32]);
        assert_eq!(secrets.open_key(b"i", &sealed).map(MacKey), Some(k));
        assert!(SocketHolder::connect(&sock, Principal::Replica(1)).is_err());

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            read_holder_file(&path, me),
            Err(HolderFileError::Permissions { .. })
        ));
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
            Principal::Client(_) => HolderSecrets::from_seed(&[7; 32]),
        };
        let directory = Arc::new(Directory {
            keys: [R0, R1, C1]
                .into_iter()
                .map(|p| (p, secrets(p).public()))
                .collect(),
        });
        let session = |p: Principal| {
            let holder = redoubt_core::LocalHolder::new(
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
        write_holder_file(&path, "cid", R0, &[3; 32]).unwrap();
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
