//! The key holder outside the replica process: the stand-in for the papers' secure
//! co-processor.
//!
//! A principal's key-holder file holds the seed of its long-term secrets (an Ed25519 signing
//! key and an X25519 opening key); next to it, `<file>.counter` holds the key holder's
//! counter, written and synced before every signature is released, so it never goes
//! backwards across restarts. For a replica, the file is read only by the key-holder service
//! (`redoubt keyholder`, or the one `redoubt monitor` runs), which answers the replica over a
//! Unix socket: sign a NEW-KEY or a recovery request, draw a fresh session key, seal a key to a
//! public key, open a key sealed to this principal. It signs nothing else.
//!
//! Threat model: an attacker who controls the replica process can ask the key holder for
//! signatures and openings while it is in control (as with the papers' co-processor), but it
//! cannot read the long-term secrets or roll the counter back, provided the key holder runs
//! under a user the replica's user cannot act as and the key-holder file is readable only by
//! that user. After the watchdog restarts the replica from a trusted executable, the keys the
//! attacker saw are retired by the recovery's NEW-KEYs and everything it signed earlier carries
//! an older counter.
//!
//! Clients keep their key holder in their own process ([`FileHolder`]); they are not
//! proactively recovered.

use crate::config::{parse_principal, principal_name};
use redoubt_core::keys::{HolderError, KeyHolder, Purpose};
use redoubt_core::Principal;
use redoubt_crypto::pk::{self, HolderSecrets, SealPublicKey, Signature};
use redoubt_crypto::{Digest, MacKey};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
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
/// system, the counter persisted in `<file>.counter` before each signature is released.
pub struct FileHolder {
    who: Principal,
    secrets: HolderSecrets,
    counter: u64,
    counter_path: PathBuf,
}

impl FileHolder {
    pub fn open(file: HolderFile) -> Result<FileHolder, HolderFileError> {
        let mut counter_path = file.path.clone().into_os_string();
        counter_path.push(".counter");
        let counter_path = PathBuf::from(counter_path);
        let counter = match std::fs::read_to_string(&counter_path) {
            Ok(s) => s
                .trim()
                .parse::<u64>()
                .map_err(|e| HolderFileError::Malformed {
                    path: counter_path.clone(),
                    message: format!("counter: {e}"),
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => {
                return Err(HolderFileError::Read {
                    path: counter_path,
                    source,
                })
            }
        };
        Ok(FileHolder {
            who: file.principal,
            secrets: file.secrets,
            counter,
            counter_path,
        })
    }

    /// The current counter value.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    pub fn public(&self) -> pk::PublicKeys {
        self.secrets.public()
    }

    fn persist_counter(&self, value: u64) -> std::io::Result<()> {
        let mut tmp = self.counter_path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(format!("{value}\n").as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.counter_path)?;
        if let Some(dir) = self.counter_path.parent() {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
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
    fn open(&mut self, info: &[u8], sealed: &[u8]) -> Result<Option<MacKey>, HolderError> {
        Ok(self.secrets.open_key(info, sealed).map(MacKey))
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
    Open {
        info: Vec<u8>,
        sealed: Vec<u8>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Principal(Principal),
    Signed(u64, Signature),
    Key(MacKey),
    Sealed(Vec<u8>),
    Opened(Option<MacKey>),
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
        Request::Open { info, sealed } => h.open(&info, &sealed).map_or_else(err, Answer::Opened),
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
    let holder = FileHolder::open(file)?;
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
    fn open(&mut self, info: &[u8], sealed: &[u8]) -> Result<Option<MacKey>, HolderError> {
        match self.call(Request::Open {
            info: info.to_vec(),
            sealed: sealed.to_vec(),
        })? {
            Answer::Opened(k) => Ok(k),
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
        let mut h = FileHolder::open(read_holder_file(&path, me).unwrap()).unwrap();
        let (c1, _) = h.sign(Purpose::NewKey, &Digest::of(b"a")).unwrap();
        let (c2, _) = h.sign(Purpose::NewKey, &Digest::of(b"b")).unwrap();
        assert_eq!((c1, c2), (1, 2));
        drop(h);
        let h = FileHolder::open(read_holder_file(&path, me).unwrap()).unwrap();
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
        assert_eq!(remote.open(b"i", &sealed).unwrap(), Some(k));
        assert!(SocketHolder::connect(&sock, Principal::Replica(1)).is_err());

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            read_holder_file(&path, me),
            Err(HolderFileError::Permissions { .. })
        ));
    }
}
