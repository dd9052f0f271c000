//! Addresses in the cluster file: `host:port`, where host is an IP address (IPv6 in
//! brackets) or a host name. A name is resolved when the file is loaded (the system resolver:
//! DNS, `/etc/hosts`), and the first address it resolves to is used; one that does not
//! resolve is an error at the key's line.

use serde::{de::Error as _, Deserialize, Deserializer};
use std::net::{SocketAddr, ToSocketAddrs};

/// `addr = "host:port"`.
pub(crate) fn addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    keyed(d, "addr")
}

/// `metrics_addr = "host:port"`.
pub(crate) fn metrics_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    keyed(d, "metrics_addr")
}

fn keyed<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    resolve(&text)
        .map_err(|e| D::Error::custom(format!("{key} = {text:?} is not a usable address: {e}")))
}

/// `host:port` as a socket address: an IP address as it is, a host name resolved (its first
/// address).
pub fn resolve(text: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    let form = "write host:port, e.g. \"db1.example:7400\", \"10.0.0.1:7400\" or \"[::1]:7400\"";
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("no port: {form}"));
    };
    let host = host.trim();
    if host.is_empty() {
        return Err(format!("no host: {form}"));
    }
    if host.contains(':') || host.starts_with('[') {
        return Err(format!(
            "not an address (an IPv6 address goes in brackets: \"[::1]:7400\"): {form}"
        ));
    }
    let port: u16 = port
        .trim()
        .parse()
        .map_err(|_| format!("{port:?} is not a port number (0 to 65535): {form}"))?;
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("host name {host:?} resolves to no address")),
        Err(e) => Err(format!(
            "host name {host:?} does not resolve ({e}): fix the name, make it resolvable on \
             this machine (DNS, /etc/hosts), or write an IP address"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::resolve;

    #[test]
    fn addresses_and_names() {
        assert_eq!(
            resolve("10.0.0.1:7400"),
            Ok("10.0.0.1:7400".parse().unwrap())
        );
        assert_eq!(resolve("[::1]:7400"), Ok("[::1]:7400".parse().unwrap()));
        let local = resolve("localhost:7400").expect("localhost resolves");
        assert!(local.ip().is_loopback(), "{local}");
        assert_eq!(local.port(), 7400);
        assert!(resolve("localhost").unwrap_err().contains("no port"));
        assert!(resolve(":7400").unwrap_err().contains("no host"));
        assert!(resolve("localhost:99999")
            .unwrap_err()
            .contains("port number"));
        assert!(resolve("::1:7400").unwrap_err().contains("brackets"));
        let e = resolve("no-such-host.invalid:7400").unwrap_err();
        assert!(e.contains("does not resolve"), "{e}");
    }
}
