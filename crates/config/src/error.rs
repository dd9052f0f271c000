//! What can go wrong with a cluster file, a key file or `redoubt init`, and where in the file.

use redoubt_core::{ClientId, ReplicaId};
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Everything that can go wrong loading a configuration or key file, or initialising a
/// cluster. Every message names the file concerned and says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file is missing or unreadable.
    #[error("cannot read config file {path}: {source}; create one with `redoubt init`")]
    Read { path: PathBuf, source: io::Error },

    /// The file is not valid TOML.
    #[error(
        "config file {path}: TOML syntax error at {at}: {message}; fix the syntax at that position"
    )]
    Syntax {
        path: PathBuf,
        at: Location,
        message: String,
    },

    /// The TOML is valid but does not fit the schema: unknown key, wrong type, missing key.
    #[error("config file {path}: {message} at {at}; {hint}")]
    Schema {
        path: PathBuf,
        at: Location,
        message: String,
        /// What to do about it.
        hint: &'static str,
    },

    /// The number of `[[replica]]` entries is not `3f+1`.
    #[error(
        "config file {path}: [protocol] f = {f} requires exactly 3f+1 = {expected} replicas, but {found} [[replica]] entries are listed; {advice}"
    )]
    ReplicaCount {
        path: PathBuf,
        f: u32,
        expected: u32,
        found: usize,
        advice: String,
    },

    /// Replica ids are not exactly `0..n`.
    #[error(
        "config file {path}: replica ids must be exactly 0..={last}, each once, but {problem}; renumber the [[replica]] entries"
    )]
    ReplicaIds {
        path: PathBuf,
        last: u32,
        problem: String,
    },

    /// Two `[[client]]` entries have the same id.
    #[error(
        "config file {path}: client id {id} is listed twice{at}; give every [[client]] a distinct id"
    )]
    DuplicateClient {
        path: PathBuf,
        id: ClientId,
        /// Where, e.g. ` (line 3, column 6 and line 9, column 6)`; empty when unknown.
        at: String,
    },

    /// Two replica endpoints (protocol or metrics) share an address.
    #[error(
        "config file {path}: {first} and {second} are both {addr}; every replica's addr and metrics_addr must be distinct"
    )]
    DuplicateAddress {
        path: PathBuf,
        addr: SocketAddr,
        first: String,
        second: String,
    },

    /// Two replicas share a data directory.
    #[error(
        "config file {path}: replicas {first} and {second} both use home {home}; give every replica its own data directory"
    )]
    DuplicateHome {
        path: PathBuf,
        home: PathBuf,
        first: ReplicaId,
        second: ReplicaId,
    },

    /// The `[protocol]` values are incoherent (`redoubt_core::Config::validate`).
    #[error("config file {path}: invalid [protocol] section: {message}")]
    Protocol { path: PathBuf, message: String },

    /// An option outside `[protocol]` has an invalid value.
    #[error("config file {path}: invalid value for {field}: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },

    /// A replica id that the file does not list was asked for.
    #[error("config file {path} has no replica {id}; valid replica ids are {valid}")]
    UnknownReplica {
        path: PathBuf,
        id: ReplicaId,
        valid: String,
    },

    /// A client id that the file does not list was asked for.
    #[error("config file {path} has no client {id}; {valid}")]
    UnknownClient {
        path: PathBuf,
        id: ClientId,
        valid: String,
    },

    /// A key file is missing or unreadable.
    #[error(
        "cannot read key file {path} of {principal}: {source}; key files are created by `redoubt init`"
    )]
    KeyRead {
        principal: String,
        path: PathBuf,
        source: io::Error,
    },

    /// A key-holder file (session keys) cannot be used.
    #[error("{0}; key-holder files are created by `redoubt init`")]
    HolderFile(#[from] redoubt_keyholder::HolderFileError),

    /// The public-key directory is missing, malformed or incomplete.
    #[error("public-key directory {path}: {message}; it is written by `redoubt init` next to redoubt.toml")]
    Directory { path: PathBuf, message: String },

    /// The replica's key holder does not answer.
    #[error("key holder of {principal} at {socket}: {message}; start it with `redoubt monitor --config {config} --id {id}` (which runs the key holder and the replica) or `redoubt keyholder --config {config} --id {id}`")]
    KeyHolder {
        principal: String,
        socket: PathBuf,
        message: String,
        config: PathBuf,
        id: u32,
    },

    /// A key file is not valid TOML or does not fit the key file schema.
    #[error("key file {path}: {message} at {at}; regenerate the keys with `redoubt init`")]
    KeyMalformed {
        path: PathBuf,
        at: Location,
        message: String,
    },

    /// A key file belongs to another principal.
    #[error(
        "key file {path} belongs to {found}, not {expected}; check key_file of {expected} in the config file"
    )]
    KeyOwner {
        path: PathBuf,
        found: String,
        expected: String,
    },

    /// A key file belongs to another cluster.
    #[error(
        "key file {path} belongs to cluster {found}, but config file {config} is cluster {expected}; use the key files that `redoubt init` wrote with this config"
    )]
    KeyCluster {
        path: PathBuf,
        config: PathBuf,
        found: String,
        expected: String,
    },

    /// A key file lacks the keys for a peer of the cluster.
    #[error(
        "key file {path} of {principal} has no keys for {peer}, which is in config file {config}; regenerate the keys with `redoubt init`"
    )]
    KeyMissingPeer {
        path: PathBuf,
        config: PathBuf,
        principal: String,
        peer: String,
    },

    /// A key is not 32 bytes of hex.
    #[error(
        "key file {path}: `{field}` key of peer {peer} at {at} {problem}; a key is 64 hex digits (32 bytes)"
    )]
    KeyBadHex {
        path: PathBuf,
        peer: String,
        field: &'static str,
        at: Location,
        problem: String,
    },

    /// A key file is readable or writable by group or others.
    #[error(
        "key file {path} has mode {mode:04o}: it must not be accessible by group or others; run `chmod 600 {path}`"
    )]
    KeyPermissions { path: PathBuf, mode: u32 },

    /// `write_key_file` found the file already there.
    #[error("key file {path} already exists; refusing to overwrite it (remove it first if you mean to replace the keys)")]
    KeyExists { path: PathBuf },

    /// `redoubt init` was asked for a replica count that is not `3f+1`.
    #[error("cannot initialise a cluster of {replicas} replicas: the count must be 3f+1 with f >= 1 (4, 7, 10, ...); {advice}")]
    InitReplicas { replicas: u32, advice: String },

    /// `redoubt init` was given an invalid option.
    #[error("cannot initialise the cluster: {0}")]
    InitInvalid(String),

    /// `redoubt init` found an existing cluster in the output directory.
    #[error(
        "{path} already exists; refusing to overwrite an existing cluster (choose another output directory or remove it)"
    )]
    InitExists { path: PathBuf },

    /// A file system operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl ConfigError {
    /// Maps an I/O error of `action` on `path` to [`ConfigError::Io`] (for `map_err`).
    pub fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ConfigError {
        let path = path.to_path_buf();
        move |source| ConfigError::Io {
            action,
            path,
            source,
        }
    }
}

/// A position in a file: 1-based line and column, with the line's text when short.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// 1-based line; 0 when unknown.
    pub line: u32,
    /// 1-based column (characters); 0 when unknown.
    pub column: u32,
    /// The text of that line, trimmed (empty when unknown or too long to quote).
    pub text: String,
}

impl Location {
    /// Locates byte offset range `span` of `src`.
    pub fn of(src: &str, span: Option<Range<usize>>) -> Location {
        let Some(span) = span else {
            return Location {
                line: 0,
                column: 0,
                text: String::new(),
            };
        };
        let start = floor_char_boundary(src, span.start.min(src.len()));
        let before = &src[..start];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = src[line_start..start].chars().count() + 1;
        let line_end = src[start..].find('\n').map_or(src.len(), |i| start + i);
        let text = src[line_start..line_end].trim();
        Location {
            line: u32::try_from(line).unwrap_or(u32::MAX),
            column: u32::try_from(column).unwrap_or(u32::MAX),
            text: if text.chars().count() <= 80 {
                text.to_string()
            } else {
                String::new()
            },
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            return write!(f, "an unknown position");
        }
        write!(f, "line {}, column {}", self.line, self.column)?;
        if !self.text.is_empty() {
            write!(f, " (`{}`)", self.text)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_counts_lines_and_chars() {
        let src = "a = 1\nbé = 2\n";
        let at = Location::of(src, Some(10..11));
        assert_eq!((at.line, at.column), (2, 4));
        assert_eq!(at.text, "bé = 2");
        assert_eq!(at.to_string(), "line 2, column 4 (`bé = 2`)");
        assert_eq!(Location::of(src, None).to_string(), "an unknown position");
    }
}
