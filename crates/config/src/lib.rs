//! The cluster file of redoubt (TOML): one file describes the whole cluster — its replicas,
//! its clients, the protocol parameters and the node runtime settings — and the key files it
//! names. Replicas (`redoubt-node`) and clients (`redoubt-client`) read the same file through
//! this crate.
//!
//! - [`ClusterConfig`]: the file, read ([`ClusterConfig::load`]), validated and written
//!   ([`ClusterConfig::to_toml`], what `redoubt init` writes);
//! - [`protocol`]: `[protocol]`, which is [`redoubt_core::Config`] itself;
//! - [`sections`]: the other sections and the replica and client entries;
//! - [`keys`]: key files, the public-key directory, and a principal's keys as the file names
//!   them ([`keys::load_file_keys`]);
//! - [`ConfigError`]: every error names the file concerned and says what to do about it.
//!
//! Every option, its default and its unit is documented in `docs/configuration.md`; the file
//! that `redoubt init` writes lists every option with a comment. Unknown keys are errors, so a
//! misspelt option never silently falls back to its default.

pub mod addr;
mod cluster;
mod error;
mod firewall;
pub mod keys;
mod pin;
pub mod protocol;
pub mod sections;
mod template;

pub use cluster::{override_toml, ClusterConfig};
pub use error::{ConfigError, Location};
pub use firewall::{
    load_filter_key, load_firewall, load_order_key, load_prime_orders, load_reply_share,
    write_firewall_keys,
};
pub use keys::{load_file_keys, session_keys};
pub use pin::pin_executable;
pub use redoubt_keyholder::{parse_principal, principal_name};
pub use sections::{
    ClientEntry, ClientSection, ClusterSection, FilterEntry, KeysSection, NodeSection,
    OverlayTunnel, RecoverySection, ReplicaEntry, StateSection, StorageSection, KEY_MODES,
    LOG_FORMATS, SERVICES,
};
