//! The key-holder file and the key holder that keeps its secrets in memory ([`FileHolder`]):
//! in a client's own process, or behind a replica's socket ([`crate::serve`]).

use crate::{hex, parse_principal, principal_name, unhex32, HolderFileError};
use redoubt_crypto::body::{BodyKey, ExecutorSecret, ENC_LEN};
use redoubt_crypto::pk::{self, HolderSecrets, SealPublicKey, Signature};
use redoubt_crypto::{Digest, MacKey};
use redoubt_keys::Principal;
use redoubt_keys::{Admitted, Directory, HolderError, KeyHolder, NewKey, Purpose};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHolderFile {
    principal: String,
    cluster_id: String,
    seed: String,
    #[serde(default)]
    executor_seed: Option<String>,
}

/// A key-holder file, read.
pub struct HolderFile {
    pub principal: Principal,
    pub cluster_id: String,
    pub secrets: HolderSecrets,
    /// The executors' secret (replicas of a cluster with confidential bodies).
    pub executor: Option<ExecutorSecret>,
    pub path: PathBuf,
}

/// Writes a new key-holder file (mode 0600, never overwriting) with a seed from the operating
/// system's generator, and the seed of the executors' secret for a replica of a cluster with
/// confidential bodies; returns the principal's public keys.
pub fn write_holder_file(
    path: &Path,
    cluster_id: &str,
    me: Principal,
    seed: &[u8; 32],
    executor_seed: Option<&[u8; 32]>,
) -> Result<pk::PublicKeys, HolderFileError> {
    let mut text = format!(
        "# redoubt key-holder file of {who}: the seed of its long-term signing and opening keys.\n\
         # Readable only by the key holder (mode 0600); never copy it to another host.\n\
         principal = \"{who}\"\ncluster_id = \"{cluster_id}\"\nseed = \"{seed}\"\n",
        who = principal_name(me),
        seed = hex(seed),
    );
    if let Some(e) = executor_seed {
        text.push_str(&format!(
            "# The executors' shared secret: opens clients' sealed request bodies.\n\
             executor_seed = \"{}\"\n",
            hex(e)
        ));
    }
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
    let executor = match &raw.executor_seed {
        Some(s) => Some(ExecutorSecret::from_seed(
            &unhex32(s).map_err(|e| malformed(format!("executor_seed: {e}")))?,
        )),
        None => None,
    };
    Ok(HolderFile {
        principal,
        cluster_id: raw.cluster_id,
        secrets: HolderSecrets::from_seed(&seed),
        executor,
        path: path.to_path_buf(),
    })
}

/// A key holder over a key-holder file: secrets in memory, randomness from the operating
/// system, the counter reserved in blocks of [`COUNTER_RESERVE`] persisted in `<file>.counter`
/// before a signature of the block is released (after a restart counting resumes above the
/// block, so no counter value is ever given twice), and
/// the last NEW-KEY counter admitted from each principal persisted in `<file>.admitted` before
/// the key it carries is released.
pub struct FileHolder {
    who: Principal,
    secrets: HolderSecrets,
    executor: Option<ExecutorSecret>,
    directory: Arc<Directory>,
    counter: u64,
    /// The counter value persisted: signatures up to it need no write.
    reserved: u64,
    counter_path: PathBuf,
    admitted: BTreeMap<Principal, u64>,
    admitted_path: PathBuf,
}

/// Counter values reserved by one write of `<file>.counter`.
pub const COUNTER_RESERVE: u64 = 256;

/// `path` with `suffix` appended to its file name.
pub(crate) fn beside(path: &Path, suffix: &str) -> PathBuf {
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
        // Opening is a start: a new epoch of the counter (`redoubt_keys::EPOCH_SHIFT`).
        // Its values are above every one reserved before, so none is given twice.
        Ok(FileHolder {
            who: file.principal,
            secrets: file.secrets,
            executor: file.executor,
            directory,
            counter: redoubt_keys::next_epoch(counter),
            reserved: counter,
            counter_path,
            admitted,
            admitted_path,
        })
    }

    /// The current counter value.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Starts a new epoch of the counter: the monitor calls it whenever it starts its replica
    /// again (a recovery's reboot, or after a crash), so that whatever the replica had signed
    /// before is of an earlier epoch than what it signs now (see
    /// `redoubt_keys::EPOCH_SHIFT`). Nothing is written: the next signature reserves
    /// its block above every value reserved before.
    pub fn begin_epoch(&mut self) {
        self.counter = redoubt_keys::next_epoch(self.counter);
    }

    /// The counter of the last NEW-KEY admitted from `p`.
    pub fn admitted(&self, p: Principal) -> Option<u64> {
        self.admitted.get(&p).copied()
    }

    pub fn public(&self) -> pk::PublicKeys {
        self.secrets.public()
    }

    /// The executors' public key, if this holder holds their secret.
    pub fn executors_public(&self) -> Option<SealPublicKey> {
        self.executor.as_ref().map(ExecutorSecret::public)
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
        if next > self.reserved {
            // One synchronous write per block of signatures, not per signature (a Prime
            // client signs every request).
            let reserve = next + COUNTER_RESERVE - 1;
            self.persist_counter(reserve)
                .map_err(|e| HolderError::Refused(format!("cannot persist the counter: {e}")))?;
            self.reserved = reserve;
        }
        self.counter = next;
        let st = redoubt_keys::holder_statement(purpose, self.who, next, content);
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
        redoubt_keys::admit_new_key(
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
    fn open_body(
        &mut self,
        info: &[u8],
        enc: &[u8; ENC_LEN],
    ) -> Result<Option<BodyKey>, HolderError> {
        redoubt_keys::open_body_with(self.executor.as_ref(), info, enc)
    }
}
