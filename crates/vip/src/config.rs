//! The group's configuration file (TOML). One file describes the whole group; every member
//! reads the same file and is told which member it is (`--id`, or `id` in the file).
//!
//! ```toml
//! interface = "eth0"
//! addresses = ["192.0.2.100/24", "192.0.2.101/24"]
//! key_file = "/etc/redoubt/vip.key"      # or key_hex = "..."
//! heartbeat_ms = 400
//! suspect_ms = 1000
//!
//! [[member]]
//! id = 1
//! addr = "10.1.0.1:7400"
//! [[member]]
//! id = 2
//! addr = "10.1.0.2:7400"
//! ```
//!
//! Every option, its default and unit is in `docs/vip.md`. Unknown keys are errors, so a
//! misspelt option never silently falls back to its default.

use crate::machine::MachineConfig;
use crate::wire::{MemberId, ADDRESSES_MAX, MEMBERS_MAX};
use crate::Cidr;
use redoubt_crypto::MacKey;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Context of the group key's derivation from the configured key material.
const KEY_CONTEXT: &str = "redoubt-vip group key v1";
/// Least key material, in bytes.
pub const KEY_BYTES_MIN: usize = 16;

pub const HEARTBEAT_MS_DEFAULT: u64 = 400;
pub const SUSPECT_MS_DEFAULT: u64 = 1000;
pub const MATURE_MS_DEFAULT: u64 = 2000;
pub const ARP_COUNT_DEFAULT: u32 = 3;
pub const ARP_INTERVAL_MS_DEFAULT: u64 = 200;
pub const COMMAND_TIMEOUT_MS_DEFAULT: u64 = 2000;
pub const RETRY_MS_DEFAULT: u64 = 1000;

const HEARTBEAT_MS_RANGE: (u64, u64) = (10, 60_000);
const SUSPECT_MS_MAX: u64 = 600_000;
const MATURE_MS_MAX: u64 = 3_600_000;
const ARP_COUNT_MAX: u32 = 10;
const ARP_INTERVAL_MS_MAX: u64 = 10_000;
const COMMAND_TIMEOUT_MS_RANGE: (u64, u64) = (100, 60_000);
const RETRY_MS_RANGE: (u64, u64) = (100, 600_000);
/// Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
const INTERFACE_BYTES_MAX: usize = 15;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: `{field}`: {reason}")]
    Invalid {
        path: PathBuf,
        field: String,
        reason: String,
    },
}

/// One member of the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberConfig {
    pub id: MemberId,
    /// Where the member's daemon listens for the group's datagrams (a stationary address,
    /// never one of the virtual ones).
    pub addr: SocketAddr,
    /// The interface that carries this member's virtual addresses, if not the group's.
    pub interface: Option<String>,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct VipConfig {
    pub path: PathBuf,
    pub id: Option<MemberId>,
    pub interface: String,
    pub addresses: Vec<Cidr>,
    pub heartbeat_ms: u64,
    pub suspect_ms: u64,
    pub mature_ms: u64,
    pub key: MacKey,
    pub arp_count: u32,
    pub arp_interval_ms: u64,
    pub ip_command: String,
    pub command_timeout_ms: u64,
    pub retry_ms: u64,
    /// Ascending by id.
    pub members: Vec<MemberConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    id: Option<MemberId>,
    interface: String,
    addresses: Vec<String>,
    heartbeat_ms: Option<u64>,
    suspect_ms: Option<u64>,
    mature_ms: Option<u64>,
    key_hex: Option<String>,
    key_file: Option<PathBuf>,
    arp_count: Option<u32>,
    arp_interval_ms: Option<u64>,
    ip_command: Option<String>,
    command_timeout_ms: Option<u64>,
    retry_ms: Option<u64>,
    #[serde(default)]
    member: Vec<RawMember>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMember {
    id: MemberId,
    addr: String,
    interface: Option<String>,
}

impl VipConfig {
    pub fn load(path: &Path) -> Result<VipConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        VipConfig::parse(&text, path)
    }

    /// Parses `text` as the file at `path` (relative key files are resolved against the
    /// file's directory).
    pub fn parse(text: &str, path: &Path) -> Result<VipConfig, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let invalid = |field: &str, reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };

        check_interface(&raw.interface).map_err(|r| invalid("interface", r))?;
        if raw.addresses.is_empty() || raw.addresses.len() > ADDRESSES_MAX {
            return Err(invalid(
                "addresses",
                format!(
                    "{} addresses: list from 1 to {ADDRESSES_MAX}",
                    raw.addresses.len()
                ),
            ));
        }
        let mut addresses = Vec::with_capacity(raw.addresses.len());
        for (i, text) in raw.addresses.iter().enumerate() {
            let field = format!("addresses[{i}]");
            let cidr: Cidr = text.parse().map_err(|r| invalid(&field, r))?;
            if let Some(j) = addresses.iter().position(|a: &Cidr| a.addr == cidr.addr) {
                return Err(invalid(
                    &field,
                    format!("{} is listed twice (also addresses[{j}])", cidr.addr),
                ));
            }
            addresses.push(cidr);
        }

        let heartbeat_ms = raw.heartbeat_ms.unwrap_or(HEARTBEAT_MS_DEFAULT);
        in_range("heartbeat_ms", heartbeat_ms, HEARTBEAT_MS_RANGE)
            .map_err(|r| invalid("heartbeat_ms", r))?;
        let suspect_ms = raw.suspect_ms.unwrap_or(SUSPECT_MS_DEFAULT);
        in_range("suspect_ms", suspect_ms, (2 * heartbeat_ms, SUSPECT_MS_MAX)).map_err(|r| {
            invalid(
                "suspect_ms",
                format!("{r} (at least twice heartbeat_ms, or one lost beat is a failure)"),
            )
        })?;
        let mature_ms = raw.mature_ms.unwrap_or(MATURE_MS_DEFAULT);
        in_range("mature_ms", mature_ms, (0, MATURE_MS_MAX))
            .map_err(|r| invalid("mature_ms", r))?;
        let arp_count = raw.arp_count.unwrap_or(ARP_COUNT_DEFAULT);
        if arp_count > ARP_COUNT_MAX {
            return Err(invalid(
                "arp_count",
                format!("{arp_count} is more than {ARP_COUNT_MAX}"),
            ));
        }
        let arp_interval_ms = raw.arp_interval_ms.unwrap_or(ARP_INTERVAL_MS_DEFAULT);
        in_range("arp_interval_ms", arp_interval_ms, (1, ARP_INTERVAL_MS_MAX))
            .map_err(|r| invalid("arp_interval_ms", r))?;
        let command_timeout_ms = raw.command_timeout_ms.unwrap_or(COMMAND_TIMEOUT_MS_DEFAULT);
        in_range(
            "command_timeout_ms",
            command_timeout_ms,
            COMMAND_TIMEOUT_MS_RANGE,
        )
        .map_err(|r| invalid("command_timeout_ms", r))?;
        let retry_ms = raw.retry_ms.unwrap_or(RETRY_MS_DEFAULT);
        in_range("retry_ms", retry_ms, RETRY_MS_RANGE).map_err(|r| invalid("retry_ms", r))?;
        let ip_command = raw.ip_command.unwrap_or_else(|| "ip".to_string());
        if ip_command.trim().is_empty() {
            return Err(invalid("ip_command", "is empty".into()));
        }

        let material =
            match (&raw.key_hex, &raw.key_file) {
                (Some(hex), None) => decode_hex(hex.trim()).map_err(|r| invalid("key_hex", r))?,
                (None, Some(file)) => {
                    let file = match file.is_relative() {
                        true => path.parent().unwrap_or(Path::new(".")).join(file),
                        false => file.clone(),
                    };
                    read_key_file(&file).map_err(|r| invalid("key_file", r))?
                }
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        "key_hex",
                        "both key_hex and key_file are set: keep one".into(),
                    ))
                }
                (None, None) => return Err(invalid(
                    "key_file",
                    "no group key: set key_file (a file of at least 16 secret bytes) or key_hex"
                        .into(),
                )),
            };
        if material.len() < KEY_BYTES_MIN {
            return Err(invalid(
                if raw.key_hex.is_some() {
                    "key_hex"
                } else {
                    "key_file"
                },
                format!(
                    "{} bytes of key material: at least {KEY_BYTES_MIN} are needed",
                    material.len()
                ),
            ));
        }
        let key = MacKey::derive(KEY_CONTEXT, &material);

        if raw.member.is_empty() || raw.member.len() > MEMBERS_MAX {
            return Err(invalid(
                "member",
                format!(
                    "{} [[member]] entries: list from 1 to {MEMBERS_MAX}",
                    raw.member.len()
                ),
            ));
        }
        let mut members: Vec<MemberConfig> = Vec::with_capacity(raw.member.len());
        for (i, m) in raw.member.iter().enumerate() {
            let field = |f: &str| format!("member[{i}].{f}");
            let addr: SocketAddr = m.addr.parse().map_err(|_| {
                invalid(
                    &field("addr"),
                    format!("{:?} is not an IP:PORT address", m.addr),
                )
            })?;
            if addr.port() == 0 || addr.ip().is_unspecified() {
                return Err(invalid(
                    &field("addr"),
                    format!("{addr}: give the member's own address and a port other than 0"),
                ));
            }
            if let Some(other) = members.iter().find(|o| o.id == m.id) {
                return Err(invalid(
                    &field("id"),
                    format!("id {} is used twice (also by {})", m.id, other.addr),
                ));
            }
            if let Some(other) = members.iter().find(|o| o.addr == addr) {
                return Err(invalid(
                    &field("addr"),
                    format!("{addr} is also member {}'s address", other.id),
                ));
            }
            if addresses
                .iter()
                .any(|c| std::net::IpAddr::V4(c.addr) == addr.ip())
            {
                return Err(invalid(
                    &field("addr"),
                    format!("{} is one of the virtual addresses: members talk over their stationary addresses", addr.ip()),
                ));
            }
            if let Some(ifname) = &m.interface {
                check_interface(ifname).map_err(|r| invalid(&field("interface"), r))?;
            }
            members.push(MemberConfig {
                id: m.id,
                addr,
                interface: m.interface.clone(),
            });
        }
        members.sort_by_key(|m| m.id);
        if let Some(id) = raw.id {
            if !members.iter().any(|m| m.id == id) {
                return Err(invalid("id", format!("no [[member]] has id {id}")));
            }
        }
        Ok(VipConfig {
            path: path.to_path_buf(),
            id: raw.id,
            interface: raw.interface,
            addresses,
            heartbeat_ms,
            suspect_ms,
            mature_ms,
            key,
            arp_count,
            arp_interval_ms,
            ip_command,
            command_timeout_ms,
            retry_ms,
            members,
        })
    }

    pub fn member(&self, id: MemberId) -> Result<&MemberConfig, ConfigError> {
        self.members
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| ConfigError::Invalid {
                path: self.path.clone(),
                field: "member".into(),
                reason: format!(
                    "no [[member]] has id {id} (ids: {:?})",
                    self.members.iter().map(|m| m.id).collect::<Vec<_>>()
                ),
            })
    }

    /// The interface member `id` manages its virtual addresses on.
    pub fn interface_of(&self, id: MemberId) -> Result<&str, ConfigError> {
        Ok(self
            .member(id)?
            .interface
            .as_deref()
            .unwrap_or(&self.interface))
    }

    pub fn machine_config(&self, id: MemberId, incarnation: u64) -> MachineConfig {
        MachineConfig {
            me: id,
            incarnation,
            members: self.members.iter().map(|m| m.id).collect(),
            addresses: self.addresses.clone(),
            heartbeat_ms: self.heartbeat_ms,
            suspect_ms: self.suspect_ms,
            mature_ms: self.mature_ms,
            key: self.key.clone(),
        }
    }
}

fn in_range(name: &str, v: u64, (lo, hi): (u64, u64)) -> Result<(), String> {
    if v < lo || v > hi {
        return Err(format!("{name} = {v} is outside {lo}..={hi}"));
    }
    Ok(())
}

fn check_interface(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > INTERFACE_BYTES_MAX
        || name.contains(|c: char| c == '/' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{name:?} is not an interface name (1 to {INTERFACE_BYTES_MAX} bytes, no '/' or spaces)"
        ));
    }
    Ok(())
}

fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("{} hex digits: an even number is needed", s.len()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("not hexadecimal at character {i}"))
        })
        .collect()
}

/// The key file's bytes, surrounding whitespace trimmed (so `openssl rand -hex 32 > FILE`
/// works); a file anyone may read is refused, since the key lets a host take addresses.
fn read_key_file(file: &Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    if meta.permissions().mode() & 0o004 != 0 {
        return Err(format!(
            "{} is readable by everyone: chmod o-r it",
            file.display()
        ));
    }
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    Ok(bytes.trim_ascii().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
interface = "eth0"
addresses = ["10.9.0.100/24", "10.9.0.101/24"]
key_hex = "00112233445566778899aabbccddeeff"
[[member]]
id = 2
addr = "10.9.0.2:7400"
[[member]]
id = 1
addr = "10.9.0.1:7400"
interface = "ens3"
"#;

    #[test]
    fn a_good_file_with_defaults() {
        let c = VipConfig::parse(GOOD, Path::new("/x/vip.toml")).unwrap();
        assert_eq!(
            c.members.iter().map(|m| m.id).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(c.heartbeat_ms, HEARTBEAT_MS_DEFAULT);
        assert_eq!(c.suspect_ms, SUSPECT_MS_DEFAULT);
        assert_eq!(c.mature_ms, MATURE_MS_DEFAULT);
        assert_eq!(c.ip_command, "ip");
        assert_eq!(c.interface_of(1).unwrap(), "ens3");
        assert_eq!(c.interface_of(2).unwrap(), "eth0");
        assert!(c.member(3).is_err());
        let m = c.machine_config(2, 5);
        assert_eq!(m.members, vec![1, 2]);
        assert_eq!(m.addresses.len(), 2);
    }

    /// Each bad file names the field that is wrong.
    #[test]
    fn errors_say_what_and_where() {
        let table: &[(&str, &str, &str)] = &[
            ("interface = \"eth0\"", "interface = \"\"", "`interface`"),
            ("\"10.9.0.101/24\"", "\"10.9.0.101\"", "`addresses[1]`"),
            ("\"10.9.0.101/24\"", "\"10.9.0.100/25\"", "listed twice"),
            ("\"10.9.0.101/24\"", "\"fe80::1/64\"", "IPv6"),
            (
                "key_hex = \"00112233445566778899aabbccddeeff\"",
                "key_hex = \"0011\"",
                "at least 16",
            ),
            (
                "key_hex = \"00112233445566778899aabbccddeeff\"",
                "key_hex = \"zz\"",
                "not hexadecimal",
            ),
            (
                "key_hex = \"00112233445566778899aabbccddeeff\"",
                "",
                "no group key",
            ),
            ("id = 2\n", "id = 1\n", "id 1 is used twice"),
            ("10.9.0.2:7400", "10.9.0.1:7400", "also member 2"),
            (
                "10.9.0.2:7400",
                "10.9.0.100:7400",
                "one of the virtual addresses",
            ),
            ("10.9.0.2:7400", "nowhere", "`member[0].addr`"),
            (
                "interface = \"ens3\"",
                "interface = \"a/b\"",
                "`member[1].interface`",
            ),
            (
                "interface = \"eth0\"",
                "interface = \"eth0\"\nheartbeat_ms = 5",
                "`heartbeat_ms`",
            ),
            (
                "interface = \"eth0\"",
                "interface = \"eth0\"\nsuspect_ms = 500",
                "twice heartbeat_ms",
            ),
            (
                "interface = \"eth0\"",
                "interface = \"eth0\"\narp_count = 99",
                "`arp_count`",
            ),
            (
                "interface = \"eth0\"",
                "interface = \"eth0\"\nid = 7",
                "no [[member]] has id 7",
            ),
            (
                "interface = \"eth0\"",
                "interface = \"eth0\"\nheartbeat = 5",
                "unknown field",
            ),
            ("interface = \"eth0\"", "interface = 3", "line 2"),
        ];
        for (from, to, expect) in table {
            assert!(GOOD.contains(from), "{from}");
            let text = GOOD.replacen(from, to, 1);
            let err = VipConfig::parse(&text, Path::new("/etc/vip.toml"))
                .expect_err(to)
                .to_string();
            assert!(err.contains(expect), "{to:?}: {err}");
            assert!(err.starts_with("/etc/vip.toml"), "{err}");
        }
    }

    #[test]
    fn key_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("redoubt-vip-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("vip.key");
        std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = GOOD.replace(
            "key_hex = \"00112233445566778899aabbccddeeff\"",
            "key_file = \"vip.key\"",
        );
        let a = VipConfig::parse(&text, &dir.join("vip.toml")).unwrap();
        let b = VipConfig::parse(&text, &dir.join("vip.toml")).unwrap();
        assert_eq!(a.key, b.key);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = VipConfig::parse(&text, &dir.join("vip.toml")).unwrap_err();
        assert!(err.to_string().contains("readable by everyone"), "{err}");
        let err = VipConfig::parse(&text, Path::new("/nonexistent/vip.toml")).unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
