//! Virtual addresses: an IPv4 address with the prefix length it is configured with on the
//! interface (`10.0.0.100/24`).

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// One virtual address as `ip addr add` takes it. IPv4 only: fail-over announces the new
/// holder with gratuitous ARP, which IPv6 replaces with neighbour advertisements that this
/// crate does not send.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Cidr {
        assert!(prefix <= 32, "prefix {prefix} > 32");
        Cidr { addr, prefix }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let Some((addr, prefix)) = s.split_once('/') else {
            return Err(format!(
                "{s:?} has no prefix length: write it as ADDRESS/PREFIX, e.g. 10.0.0.100/24"
            ));
        };
        let addr: Ipv4Addr = addr.parse().map_err(|_| {
            if addr.contains(':') {
                format!("{addr:?} is IPv6: only IPv4 virtual addresses are supported")
            } else {
                format!("{addr:?} is not an IPv4 address")
            }
        })?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("prefix length {prefix:?} is not a number from 0 to 32"))?;
        Ok(Cidr { addr, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::Cidr;

    #[test]
    fn parses_and_rejects() {
        let table: &[(&str, Option<&str>)] = &[
            ("10.0.0.1/24", Some("10.0.0.1/24")),
            ("192.168.7.200/32", Some("192.168.7.200/32")),
            ("0.0.0.0/0", Some("0.0.0.0/0")),
            ("10.0.0.1", None),
            ("10.0.0.1/33", None),
            ("10.0.0.1/-1", None),
            ("10.0.0/24", None),
            ("fe80::1/64", None),
            ("", None),
        ];
        for (text, want) in table {
            let got = text.parse::<Cidr>().ok().map(|c| c.to_string());
            assert_eq!(got.as_deref(), *want, "{text}");
        }
        let err = "fe80::1/64".parse::<Cidr>().unwrap_err();
        assert!(err.contains("IPv6"), "{err}");
    }
}
