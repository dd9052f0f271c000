//! The cluster file as `redoubt init` writes it ([`ClusterConfig::to_toml`]): every option
//! present, each with a comment giving its meaning, unit and default.
//!
//! The options of each section are its fields as serialized (for `[protocol]`, the fields of
//! [`redoubt_core::Config`]), so their names and values are never listed by hand; this file
//! holds only their comments, and a test fails when a field has none (or a comment no field).

use crate::error::ConfigError;
use crate::sections::{
    ClientSection, KeysSection, NodeSection, RecoverySection, StateSection, StorageSection,
};
use crate::ClusterConfig;
use serde::Serialize;
use std::fmt::Write as _;

/// One section of the file: a comment above its header, and each option's comment, in which
/// `{default}` stands for the option's default value.
struct Section {
    name: &'static str,
    about: &'static str,
    options: &'static [(&'static str, &'static str)],
}

impl ClusterConfig {
    /// The configuration as a TOML file: every option present, each with a comment giving
    /// its meaning, unit and default. This is what `redoubt init` writes. Fails only for a
    /// value TOML cannot hold (an integer above `i64::MAX`).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        let mut out = format!(
            r#"# redoubt cluster configuration: one file for the whole cluster.
# Every option is documented in docs/configuration.md. Unknown keys are errors.
# Relative paths are resolved against the directory of this file.
# Sections other than [cluster] and [[replica]] may be omitted (defaults apply).

[cluster]
# Human-readable name of the cluster (logs, metrics).
name = {name}
# Random identifier written by `redoubt init`; every key file carries it, so that keys of
# another cluster are refused. Do not change it.
id = {id}

# One [[replica]] per replica: exactly 3f+1 of them, with ids 0 to 3f.
#   addr          protocol and client traffic (TCP host:port)
#   metrics_addr  HTTP endpoint serving Prometheus /metrics and /status (host:port)
#   home          data directory of the replica (journal, checkpoints)
#   key_file      the replica's key-holder file (session keys) or secret MAC keys (static
#                 keys); must be mode 0600. With session keys only the key holder reads it.
#   holder_socket (optional) Unix socket of the replica's key holder; default
#                 keyholder-<id>.sock in the directory that holds <home>
"#,
            name = quote(&self.cluster.name),
            id = quote(&self.cluster.id),
        );
        for r in &self.replicas {
            write_node(&mut out, "replica", r);
        }
        if !self.executors.is_empty() {
            out.push_str(
                "# Separated deployment: one [[executor]] per execution node, exactly\n\
                 # [protocol] executors (2g+1) of them, ids 0 to 2g; the same fields as a replica's\n\
                 # (holder_socket default: keyholder-executor-<id>.sock beside <home>).\n",
            );
        }
        for r in &self.executors {
            write_node(&mut out, "executor", r);
        }
        if !self.filters.is_empty() {
            out.push_str(
                "# Firewall deployment: one [[filter]] per filter node, (h+1)^2 of them for\n\
                 # [protocol] filter_rows = h+1, id = row * (h+1) + column, row 0 next to the\n\
                 # replicas. Filters hold no keys and no state: addr and metrics_addr only.\n",
            );
        }
        for x in &self.filters {
            let _ = write!(
                out,
                "[[filter]]\nid = {}\naddr = {}\nmetrics_addr = {}\n\n",
                x.id,
                quote(&x.addr.to_string()),
                quote(&x.metrics_addr.to_string()),
            );
        }
        out.push_str(
            "# One [[client]] per client allowed to submit requests; ids are distinct.\n\
             #   key_file      the client's key-holder file or secret MAC keys (must be mode 0600)\n",
        );
        for c in &self.clients {
            let _ = write!(
                out,
                "[[client]]\nid = {}\nkey_file = {}\n\n",
                c.id,
                quote(&c.key_file.to_string_lossy()),
            );
        }
        let sections = [
            self.section(
                &PROTOCOL_OPTIONS,
                &self.protocol,
                &crate::protocol::defaults(),
            )?,
            self.section(
                &CLIENT_TIMING_OPTIONS,
                &self.client,
                &ClientSection::default(),
            )?,
            self.section(&NODE_OPTIONS, &self.node, &NodeSection::default())?,
            self.section(&STORAGE_OPTIONS, &self.storage, &StorageSection::default())?,
            self.section(&STATE_OPTIONS, &self.state, &StateSection::default())?,
            self.section(&KEYS_OPTIONS, &self.keys, &KeysSection::default())?,
            self.section(
                &RECOVERY_OPTIONS,
                &self.recovery,
                &RecoverySection::default(),
            )?,
        ];
        out.push_str(&sections.join("\n"));
        for t in &self.overlay_tunnels {
            let (who, key, id) = match (t.replica, t.client) {
                (Some(r), _) => ("replica", "replica", u64::from(r)),
                (None, Some(c)) => ("client", "client", c),
                // Refused by validation; written as it is so that the error names it.
                (None, None) => ("nobody", "# neither replica nor client", 0),
            };
            let _ = write!(
                out,
                "\n# Overlay mode: {who} {id} reaches replica {} through an overlay daemon.\n\
                 [[overlay_tunnel]]\n{key} = {id}\npeer = {}\naddr = \"{}\"\n",
                t.peer, t.peer, t.addr
            );
        }
        Ok(out)
    }

    /// Section `s` with the values of `value`, commented with those of `default`.
    fn section<T: Serialize>(
        &self,
        s: &Section,
        value: &T,
        default: &T,
    ) -> Result<String, ConfigError> {
        let table = |v: &T| {
            toml::Table::try_from(v).map_err(|e| ConfigError::Invalid {
                path: self.path.clone(),
                field: format!("[{}]", s.name),
                message: format!("a value does not fit in a TOML file: {e}"),
            })
        };
        let (values, defaults) = (table(value)?, table(default)?);
        let mut out = String::new();
        for line in s.about.lines() {
            let _ = writeln!(out, "# {line}");
        }
        let _ = writeln!(out, "[{}]", s.name);
        for (key, doc) in s.options {
            let shown = |t: &toml::Table| t.get(*key).map(|v| v.to_string()).unwrap_or_default();
            for line in doc.replace("{default}", &shown(&defaults)).lines() {
                let _ = writeln!(out, "# {line}");
            }
            let _ = writeln!(out, "{key} = {}", shown(&values));
        }
        Ok(out)
    }
}

/// One `[[replica]]` or `[[executor]]` entry.
fn write_node(out: &mut String, kind: &str, r: &crate::sections::ReplicaEntry) {
    let _ = write!(
        out,
        "[[{kind}]]\nid = {}\naddr = {}\nmetrics_addr = {}\nhome = {}\nkey_file = {}\n",
        r.id,
        quote(&r.addr.to_string()),
        quote(&r.metrics_addr.to_string()),
        quote(&r.home.to_string_lossy()),
        quote(&r.key_file.to_string_lossy()),
    );
    if let Some(sock) = &r.holder_socket {
        let _ = writeln!(out, "holder_socket = {}", quote(&sock.to_string_lossy()));
    }
    out.push('\n');
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// `[protocol]`: Protocol parameters: identical on every replica and client.
const PROTOCOL_OPTIONS: Section = Section {
    name: "protocol",
    about: "Protocol parameters: identical on every replica and client.",
    options: &[
        (
            "f",
            "Maximum number of faulty replicas tolerated; the cluster has n = 3f+1 replicas.\n\
             Default: {default}.",
        ),
        (
            "checkpoint_interval",
            "Checkpoint interval K (sequence numbers): a checkpoint every K batches. Default: {default}.",
        ),
        (
            "log_size",
            "Log size L (sequence numbers): messages are accepted for h < n <= h + L; a multiple of\n\
             checkpoint_interval, at least twice it. Default: {default}.",
        ),
        (
            "batch_requests_max",
            "Maximum number of requests the primary packs into one pre-prepare (requests). Default: {default}.",
        ),
        (
            "batch_bytes_max",
            "Maximum total operation bytes in one batch (bytes). Default: {default} (1 MiB).",
        ),
        (
            "inflight_batches_max",
            "Maximum number of batches the primary keeps in flight, proposed but not yet executed\n\
             (batches); requests arriving meanwhile queue and go out together. Default: {default}.",
        ),
        (
            "exec_inflight_batches_max",
            "Separated deployments: maximum number of batches the primary keeps ordered and not yet\n\
             acknowledged by g+1 execution nodes (batches). Default: {default}.",
        ),
        (
            "view_change_timeout_ms",
            "Base view-change timeout (ms); doubled on each view change that makes no progress.\n\
             Default: {default}.",
        ),
        (
            "view_change_timeout_max_ms",
            "Cap on the doubled view-change timeout (ms). Default: {default}.",
        ),
        (
            "status_interval_ms",
            "Interval between status messages, the retransmission heartbeat (ms). Default: {default}.",
        ),
        (
            "retransmit_entries_max",
            "Maximum number of log entries retransmitted in answer to one status message (entries).\n\
             Default: {default}.",
        ),
        (
            "state_transfer_delay_ms",
            "How long a replica that knows of a newer checkpoint waits for the log to catch up before\n\
             fetching the checkpoint state (ms). Default: {default}.",
        ),
        (
            "state_transfer_retry_ms",
            "Retry interval of a state fetch; each retry asks another replica (ms). Default: {default}.",
        ),
        (
            "read_only_fast_path",
            "Read-only operations (gets, scans) go to every replica and are answered without being\n\
             ordered; the client needs 2f+1 matching answers and falls back to the ordered path\n\
             (true/false). Default: {default}.",
        ),
        (
            "read_only_to_quorum",
            "With the read-only fast path, a client sends each read to 2f+1 replicas first and to the\n\
             others only when those answers are late or do not match (true/false). Default: {default}.",
        ),
        (
            "digest_replies",
            "Digest replies: for results over 32 bytes, one replica per request (chosen by a hash of the\n\
             client and timestamp) sends the result and the others its digest (true/false).\n\
             Default: {default}.",
        ),
        (
            "tentative_execution",
            "Tentative execution: a replica executes a batch once it is prepared (everything before it\n\
             committed) and replies at once; the client needs 2f+1 matching replies. Saves one message\n\
             delay; a batch that a view change drops is undone (true/false). Default: {default}.",
        ),
        (
            "tentative_batch_max",
            "With tentative execution, the largest batch that executes tentatively; larger batches (a\n\
             loaded service) execute once committed (requests). Default: {default}.",
        ),
        (
            "primary_replies",
            "Whether the primary sends first replies like every replica to batches that execute once\n\
             committed. A client needs only f+1 matching committed replies, which the backups supply,\n\
             and a quiet primary saves the busiest replica a reply per request; the primary always\n\
             replies to batches that execute tentatively (true/false). Default: {default}.",
        ),
        (
            "defer_tentative_commits",
            "Whether a replica holds back its COMMIT for a batch that executes tentatively until its\n\
             next broadcast (the next batch's PREPARE or PRE-PREPARE carries it in the same write) or\n\
             tick: the commit is off the client's path, and under a light closed loop the COMMITs\n\
             cost no writes or wake-ups of their own (true/false). Default: {default}.",
        ),
        (
            "large_request_bytes",
            "Requests with operations of at least this many bytes travel beside the pre-prepare: the\n\
             client sends them to every replica and the primary names them by digest (bytes; 0: all\n\
             requests travel inside the pre-prepare). Default: {default}.",
        ),
        (
            "transfer_reply_bytes_max",
            "Largest state-transfer answer a replica sends (bytes); at least 64 KiB and at most half\n\
             of message_bytes_max. Default: {default} (1 MiB).",
        ),
        (
            "transfer_rate_bytes_per_sec",
            "State-transfer bytes served to one asking replica per second (bytes/s); FETCHes above\n\
             the rate are dropped, so a restarted replica cannot flood its peers. Default: {default}.",
        ),
        (
            "transfer_items_max",
            "Partitions asked for in one FETCH (partitions). Default: {default}.",
        ),
        (
            "key_refresh_ms",
            "Session-key refresh period T_k (ms): every replica and client sends a NEW-KEY this often.\n\
             The window of vulnerability is 2 T_k + T_r. Default: {default}.",
        ),
        (
            "client_key_lifetime_ms",
            "Replicas discard a client's key when it was not refreshed for this long (ms); at least\n\
             twice key_refresh_ms. Default: {default}.",
        ),
        (
            "suspect_client_ms",
            "A client stays under suspicion this long (ms) after a request of it was doubted in a batch\n\
             that did not commit before a view change: its requests are then ordered only when signed\n\
             (clients sign retransmissions). Default: {default}.",
        ),
        (
            "suspect_on_doubts",
            "Also suspect a client as soon as f+1 replicas doubt a request of it in a pre-prepare (they\n\
             could not authenticate it): a client whose MACs verify at the primary only is shut out\n\
             after its first such request instead of stalling batch after batch (true/false).\n\
             Default: {default}.",
        ),
        (
            "primary_pace_window_ms",
            "PBFT: how often replicas check the primary's pace (ms; 0: never). A window that executes\n\
             fewer than half the requests of the best of the 4 windows before, with requests waiting,\n\
             makes a replica start a view change: a primary slow just under the view-change timeout\n\
             is replaced. Unused under Prime. At least 100. Default: {default}.",
        ),
        (
            "recovery_interval_min_ms",
            "A replica's recovery request is refused when its previous recovery was accepted less than\n\
             this long before (ms, agreed time): repeated recoveries cannot deny service. Keep it at\n\
             most half the watchdog period. Default: {default}.",
        ),
        (
            "clock_skew_max_ms",
            "Largest accepted difference between the primary's batch time and a backup's clock (ms);\n\
             larger skews make backups refuse the pre-prepare (liveness only, never safety).\n\
             Default: {default}.",
        ),
        (
            "request_bytes_max",
            "Largest operation accepted in a request (bytes); at most batch_bytes_max.\n\
             Default: {default} (64 KiB).",
        ),
        (
            "confidential_bodies",
            "Seal request and reply bodies between each client and the executors (ChaCha20-Poly1305\n\
             under a key each client session agrees with the executors' key pair by HPKE): the\n\
             network sees ciphertext only. Needs [keys] mode = \"session\" (the executors' secret\n\
             is in the key holder of each node that executes, dealt by `redoubt init`). State-transfer\n\
             answers are sealed the same way. Default: {default}.",
        ),
        (
            "executors",
            "Separated deployment (Yin et al. 2003): the number of execution nodes, 2g+1, listed as\n\
             [[executor]] entries; the replicas then only order requests, the execution nodes run the\n\
             service and answer (g+1 matching replies), and only they hold the executors' secret.\n\
             0: the replicas execute (co-located). Default: {default}.",
        ),
        (
            "filter_rows",
            "Firewall deployment (Yin et al. 2003 section 4): h+1 rows of h+1 filter nodes between the\n\
             replicas and the execution nodes, listed as [[filter]] entries, tolerating h faulty\n\
             filters; replies leave the execution cluster only as threshold signatures of g+1 of its\n\
             nodes. Needs executors > 0 and confidential_bodies. 0: no firewall. Default: {default}.",
        ),
        (
            "ordering",
            "The ordering protocol: \"pbft\" (the primary batches requests) or \"prime\" (Amir et al.:\n\
             every replica introduces its clients' requests, the leader orders summary matrices, and\n\
             Suspect-Leader replaces a leader slower than the bound measured from round trips; see\n\
             docs/adr/0007-prime.md). Prime needs [keys] mode = \"session\" and\n\
             tentative_execution = false; its replicas sign rows with the order keys `redoubt init`\n\
             deals (file [keys] firewall). Default: {default}.",
        ),
        (
            "prime_window",
            "Prime: PO-REQUESTs accepted per originator above the last it executed (the pre-ordering\n\
             window; PO-REQUESTs). Default: {default}.",
        ),
        (
            "prime_preorder_period_ms",
            "Prime: how often a replica retries introducing waiting requests and sends due\n\
             acknowledgements and rows (ms; they also go out as soon as they change). Default: {default}.",
        ),
        (
            "prime_proposal_period_ms",
            "Prime: the leader's proposal period (ms): at most one summary matrix per period. Part of\n\
             the bound a leader must meet. Default: {default}.",
        ),
        (
            "prime_k_lat_permille",
            "Prime: K_Lat in thousandths: a leader whose turnaround time exceeds K_Lat times the\n\
             acceptable one plus the proposal period is replaced. At least 1000. Default: {default}.",
        ),
        (
            "prime_min_rtt_ms",
            "Prime: the floor of the acceptable turnaround time (ms), so that jitter on a fast network\n\
             does not replace correct leaders. Default: {default}.",
        ),
        (
            "prime_ping_interval_ms",
            "Prime: the period of round-trip pings and turnaround reports (ms). Default: {default}.",
        ),
        (
            "prime_row_interval_ms",
            "Prime: under load, a replica signs a new PO-ARU row at most this often (ms); a row that\n\
             covers everything it holds goes at once. 0: a row at every growth. Default: {default}.",
        ),
        (
            "message_bytes_max",
            "Largest encoded message accepted; bigger frames are rejected before decoding (bytes).\n\
             batch_bytes_max must be at most half of it. Default: {default} (32 MiB).",
        ),
    ],
};

/// `[client_timing]`: Client retransmission and deadline.
const CLIENT_TIMING_OPTIONS: Section = Section {
    name: "client_timing",
    about: "Client retransmission and deadline.",
    options: &[
        (
            "retransmit_min_ms",
            "Lower bound of the retransmission timeout (ms). Default: {default}.",
        ),
        (
            "retransmit_max_ms",
            "Upper bound of the retransmission timeout after back-off (ms). Default: {default}.",
        ),
        (
            "initial_rtt_ms",
            "Initial response-time estimate, before any measurement (ms). Default: {default}.",
        ),
        (
            "deadline_ms",
            "An invocation gives up after this long without a reply certificate (ms): long enough for a\n\
             view change, short enough that an application learns of an outage. Default: {default}.",
        ),
    ],
};

/// `[node]`: The replica process.
const NODE_OPTIONS: Section = Section {
    name: "node",
    about: "The replica process.",
    options: &[
        (
            "tick_ms",
            "Interval between ticks delivered to the protocol core, the resolution of every protocol\n\
             timer (ms). Default: {default}.",
        ),
        (
            "peer_queue_frames_max",
            "Frames queued for one peer, or for one client connection (frames); further frames are\n\
             dropped and the protocol retransmits what is lost. Default: {default}.",
        ),
        (
            "peer_queue_mib",
            "Bytes of the frames queued for one peer (MiB), beside peer_queue_frames_max; further\n\
             frames are dropped. Raised to message_bytes_max if smaller. Default: {default}.",
        ),
        (
            "client_queue_mib",
            "Bytes of the frames (replies) queued for one client connection (MiB), beside\n\
             peer_queue_frames_max; further frames are dropped. Raised to message_bytes_max if smaller.\n\
             Default: {default}.",
        ),
        (
            "inbound_queue_mib",
            "Bytes of received frames waiting for the protocol task (MiB), for each of a node's two\n\
             inbound queues (its listener's connections, its links), beside the 16,384 frames each holds.\n\
             A frame that does not fit is dropped unread and counted in\n\
             redoubt_frames_dropped_total{queue=\"listener_inbound\"|\"link_inbound\"}; the protocol\n\
             retransmits. Raised to message_bytes_max if smaller. Default: {default}.",
        ),
        (
            "client_connections_max",
            "Simultaneous client connections one replica accepts (connections). Default: {default}.",
        ),
        (
            "reconnect_backoff_min_ms",
            "First delay before reconnecting to a peer (ms); doubled on each failed attempt.\n\
             Default: {default}.",
        ),
        (
            "reconnect_backoff_max_ms",
            "Cap on the reconnection delay (ms). Default: {default}.",
        ),
        (
            "worker_threads",
            "Threads of the replica process's async runtime (threads); 0 = one per core. One thread\n\
             keeps network I/O and the protocol on one core without cross-thread wake-ups, which was\n\
             fastest in `redoubt bench micro` on 2 cores with 4 replicas. Default: {default}.",
        ),
        (
            "log_format",
            "Log output: \"human\" (readable lines) or \"json\" (one JSON object per line).\n\
             Default: {default}.",
        ),
    ],
};

/// `[storage]`: The replica's journal.
const STORAGE_OPTIONS: Section = Section {
    name: "storage",
    about: "The replica's journal.",
    options: &[
        (
            "fsync",
            "Sync the journal to disk before sending messages that depend on it (true/false); false\n\
             trades durability across power loss for latency. Default: {default}.",
        ),
        (
            "page_cache_mib",
            "Memory for copies of state pages read from the page file (MiB; 0: none).\n\
             Default: {default}.",
        ),
    ],
};

/// `[state]`: The replicated service state: pages under a partition tree. Identical on every replica.
const STATE_OPTIONS: Section = Section {
    name: "state",
    about: "The replicated service state: pages under a partition tree. Identical on every replica.",
    options: &[
        (
            "service",
            "The service every replica hosts: \"kv\" (the key-value store), \"sql\" (the SQL database;\n\
             clients reach it through `redoubt sql-gateway`) or \"files\" (the file system; `redoubt\n\
             mount`). Default: {default}.",
        ),
        (
            "size_mib",
            "Size of the service state (MiB); the page file is this large (sparse on disk).\n\
             Default: {default}.",
        ),
        (
            "page_bytes",
            "Page size (bytes): a power of two between 64 and 1048576. Default: {default}.",
        ),
        (
            "fanout",
            "Sub-partitions per meta-data partition (2 to 4096). Default: {default}.",
        ),
        (
            "check_on_start",
            "Check every page against its digest at start-up (true/false); corrupt pages are fetched\n\
             from the other replicas. Reads the whole state. Default: {default}.",
        ),
    ],
};

/// `[keys]`: How principals authenticate.
const KEYS_OPTIONS: Section = Section {
    name: "keys",
    about: "How principals authenticate.",
    options: &[
        (
            "mode",
            "\"session\": MAC keys refreshed by NEW-KEY every key_refresh_ms, long-term secrets in a key\n\
             holder (the replica reaches it over holder_socket); required for proactive recovery.\n\
             \"static\": fixed pairwise MAC keys (no refresh, no recovery). Default: {default}.",
        ),
        (
            "directory",
            "Public keys (signing and sealing) of every principal, written by `redoubt init`.\n\
             Default: {default}.",
        ),
        (
            "firewall",
            "Firewall deployment: the public keys crossing the firewall is checked against (each\n\
             replica's order key, the execution nodes' threshold key), written by `redoubt init`; the\n\
             secret halves lie beside it (order-replica-<id>.key, share-executor-<id>.key, mode\n\
             0600). Default: {default}.",
        ),
    ],
};

/// `[recovery]`: Proactive recovery, driven by `redoubt monitor` (one per replica host).
const RECOVERY_OPTIONS: Section = Section {
    name: "recovery",
    about: "Proactive recovery, driven by `redoubt monitor` (one per replica host).",
    options: &[
        (
            "enabled",
            "Restart and recover each replica periodically, in turn (true/false). Default: {default}.",
        ),
        (
            "watchdog_period_s",
            "Watchdog period T_w (s): each replica recovers once per period; 0 = derived from the\n\
             measured recovery time (n x 2 x the longest recovery seen, at least\n\
             watchdog_period_min_s). Default: {default}.",
        ),
        (
            "watchdog_period_min_s",
            "Lower bound of a derived watchdog period (s). Default: {default}.",
        ),
        (
            "alert_after_s",
            "A recovery longer than this (s) is logged at warn level and counted as a possible attack.\n\
             Default: {default}.",
        ),
        (
            "executable_blake3",
            "BLAKE3 of the replica executable (64 hex digits); the monitor refuses to start any other\n\
             executable. Empty: not checked. `redoubt init` writes the hash of the binary that ran it.",
        ),
        (
            "stagger_wait_max_s",
            "Longest a monitor waits, at its turn, while f other replicas are still recovering (s).\n\
             Default: {default}.",
        ),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tests::sample;
    use std::collections::BTreeSet;

    /// Every field of every section has a comment and a line in the file, and every comment
    /// belongs to a field: a field added to `redoubt_core::Config` (or to a section) fails
    /// here until it is documented.
    #[test]
    fn every_option_is_written_and_commented() {
        fn keys<T: Serialize>(v: &T) -> BTreeSet<String> {
            toml::Table::try_from(v).unwrap().keys().cloned().collect()
        }
        fn commented(s: &Section) -> BTreeSet<String> {
            let set: BTreeSet<String> = s.options.iter().map(|(k, _)| k.to_string()).collect();
            assert_eq!(set.len(), s.options.len(), "[{}] repeats an option", s.name);
            set
        }
        let cfg = sample();
        for (s, fields) in [
            (&PROTOCOL_OPTIONS, keys(&cfg.protocol)),
            (&CLIENT_TIMING_OPTIONS, keys(&cfg.client)),
            (&NODE_OPTIONS, keys(&cfg.node)),
            (&STORAGE_OPTIONS, keys(&cfg.storage)),
            (&STATE_OPTIONS, keys(&cfg.state)),
            (&KEYS_OPTIONS, keys(&cfg.keys)),
            (&RECOVERY_OPTIONS, keys(&cfg.recovery)),
        ] {
            assert_eq!(commented(s), fields, "[{}]", s.name);
        }
        let text = cfg.to_toml().unwrap();
        for key in keys(&redoubt_core::Config::new(1)) {
            assert!(text.contains(&format!("\n{key} = ")), "{key} missing");
        }
        assert!(!text.contains("{default}"), "{text}");
        assert!(!text.contains("mutant"));
    }

    #[test]
    fn defaults_and_values_are_shown() {
        let mut cfg = sample();
        cfg.protocol.batch_bytes_max = 4096;
        cfg.node.log_format = "json".into();
        let text = cfg.to_toml().unwrap();
        assert!(
            text.contains(
                "# Maximum total operation bytes in one batch (bytes). Default: 1048576 (1 MiB).\n\
                 batch_bytes_max = 4096\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# Default: \"human\".\nlog_format = \"json\"\n"),
            "{text}"
        );
        assert!(text.contains("\n[recovery]\n"));
    }

    #[test]
    fn values_toml_cannot_hold_are_refused() {
        let mut cfg = sample();
        cfg.protocol.key_refresh_ms = u64::MAX;
        let msg = cfg.to_toml().unwrap_err().to_string();
        assert!(msg.contains("[protocol]"), "{msg}");
    }
}
