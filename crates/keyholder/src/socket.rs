//! A replica's key holder in another process: [`serve`] answers on a Unix socket, and
//! [`SocketHolder`] is the replica's side of it.

use crate::{principal_name, FileHolder};
use redoubt_crypto::body::{BodyKey, ENC_LEN};
use redoubt_crypto::pk::{SealPublicKey, Signature};
use redoubt_crypto::{Digest, MacKey};
use redoubt_keys::Principal;
use redoubt_keys::{Admitted, HolderError, KeyHolder, NewKey, Purpose};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Largest request or answer on the key-holder socket (bytes).
const FRAME_MAX: usize = 64 << 10;
/// How long the replica waits for its key holder before reporting it unreachable.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

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
    OpenBody {
        info: Vec<u8>,
        enc: [u8; ENC_LEN],
    },
}

#[derive(Serialize, Deserialize)]
enum Answer {
    Principal(Principal),
    Signed(u64, Signature),
    Key(MacKey),
    Sealed(Vec<u8>),
    Admitted(Admitted),
    BodyKey(Option<[u8; 32]>),
    Error(String),
}

/// Names the answer's kind only: an answer may hold key material, which never goes in a log.
impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Answer::Principal(_) => "principal",
            Answer::Signed(..) => "signature",
            Answer::Key(_) => "key",
            Answer::Sealed(_) => "sealed key",
            Answer::Admitted(_) => "admitted",
            Answer::BodyKey(_) => "body key",
            Answer::Error(e) => return write!(f, "error: {e}"),
        };
        f.write_str(kind)
    }
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
///
/// The socket is bound and restricted under a temporary name and renamed to `path` once it
/// listens, so whoever waits for `path` to appear (the cluster launcher, an operator's script)
/// never connects between bind and listen (refused) or before the mode is set.
pub fn serve(path: &Path, holder: FileHolder) -> std::io::Result<std::thread::JoinHandle<()>> {
    serve_shared(path, std::sync::Arc::new(std::sync::Mutex::new(holder)))
}

/// Like [`serve`], for a holder its caller keeps a handle on (the monitor starts a new epoch
/// of its counter whenever it restarts the replica: [`FileHolder::begin_epoch`]).
pub fn serve_shared(
    path: &Path,
    holder: std::sync::Arc<std::sync::Mutex<FileHolder>>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mut staging = path.as_os_str().to_owned();
    staging.push("~");
    let staging = PathBuf::from(staging);
    // Left by a key holder that was killed (also a dangling link, which `exists` would miss).
    match std::fs::remove_file(&staging) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    // The staging name is one byte longer than `path`: say which name did not bind (a Unix
    // socket path has at most 107 bytes).
    let listener = UnixListener::bind(&staging).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "cannot bind {} ({} bytes): {e}",
                staging.display(),
                staging.as_os_str().len()
            ),
        )
    })?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&staging, path)?;
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
        Request::OpenBody { info, enc } => h
            .open_body(&info, &enc)
            .map_or_else(err, |k| Answer::BodyKey(k.map(|k| k.bytes()))),
    }
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
    fn open_body(
        &mut self,
        info: &[u8],
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        match self.call(Request::OpenBody {
            info: info.to_vec(),
            enc: *enc,
        })? {
            Answer::BodyKey(k) => Ok(k.map(BodyKey::from_bytes)),
            other => Err(HolderError::Refused(format!("unexpected answer {other:?}"))),
        }
    }
}
