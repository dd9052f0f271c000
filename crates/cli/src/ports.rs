//! Free ports on 127.0.0.1 for a local cluster.
//!
//! `redoubt init` gives replica `i` port `base + i` and metrics port `base + 100 + i`, so a base
//! port is good when all `2n` of those ports can be bound. Candidates are drawn at random below
//! the kernel's ephemeral range (which outgoing connections take their local ports from), so
//! that concurrent clusters, and the connections of this one, are unlikely to collide.

use redoubt_node::init::METRICS_PORT_OFFSET;
use std::net::{Ipv4Addr, TcpListener};

/// A base port whose `n` protocol ports and `n` metrics ports are all free on 127.0.0.1 now.
pub fn free_base_port(n: u16) -> anyhow::Result<u16> {
    let (ephemeral_low, _) = ephemeral_range();
    let lowest: u32 = 10_000;
    let span = u32::from(METRICS_PORT_OFFSET) + u32::from(n);
    let highest = u32::from(ephemeral_low)
        .saturating_sub(span + 1)
        .max(lowest + 1000);
    for _ in 0..200 {
        let base = (lowest + rand_u32() % (highest - lowest)) as u16;
        let all_free = (0..n)
            .flat_map(|i| [base + i, base + METRICS_PORT_OFFSET + i])
            .all(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok());
        if all_free {
            return Ok(base);
        }
    }
    anyhow::bail!(
        "cannot find {} free ports on 127.0.0.1 (tried 200 ranges between {lowest} and {highest}); \
         is this machine out of ports?",
        2 * n
    )
}

/// The kernel's ephemeral port range (Linux), or the IANA one.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((49152, 65535))
}

/// A random number without a dependency: the std hasher is randomly keyed per process, and the
/// time and a counter vary it between calls.
fn rand_u32() -> u32 {
    use std::hash::{BuildHasher as _, Hasher as _};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish() as u32
}
