//! Gratuitous ARP: after taking an address, tell the LAN (the router, the clients) that it now
//! lives at this interface's MAC, so their ARP caches stop pointing at the old holder — the
//! paper's "ARP spoofing". Each announcement is two broadcast frames from a raw `AF_PACKET`
//! socket: an ARP request and an ARP reply, both with sender and target IP the address (what
//! `arping -U` and `arping -A` send). Linux updates an existing cache entry on either
//! (`arp_process`: a gratuitous ARP overrides the entry's lock time). Needs `CAP_NET_RAW`.

use std::ffi::CString;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Ethernet frames are padded to 60 bytes (without the FCS).
const FRAME_LEN: usize = 60;
const BROADCAST: [u8; 6] = [0xff; 6];

#[derive(Debug, thiserror::Error)]
pub enum ArpError {
    #[error("cannot read the MAC address of {interface} from {path}: {reason}")]
    Mac {
        interface: String,
        path: String,
        reason: String,
    },
    #[error("no interface {interface}: {source}")]
    NoInterface {
        interface: String,
        source: std::io::Error,
    },
    #[error("cannot open a raw packet socket (needs CAP_NET_RAW): {0}")]
    Socket(std::io::Error),
    #[error("cannot send gratuitous ARP for {addr} on {interface}: {source}")]
    Send {
        addr: Ipv4Addr,
        interface: String,
        source: std::io::Error,
    },
}

/// A raw socket bound to one interface, ready to announce addresses.
#[derive(Debug)]
pub struct ArpAnnouncer {
    fd: OwnedFd,
    interface: String,
    ifindex: i32,
    mac: [u8; 6],
}

impl ArpAnnouncer {
    pub fn open(interface: &str) -> Result<ArpAnnouncer, ArpError> {
        let mac = read_mac(interface)?;
        let name = CString::new(interface).map_err(|e| ArpError::NoInterface {
            interface: interface.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
        })?;
        // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(ArpError::NoInterface {
                interface: interface.to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
        // Protocol 0: the socket only sends; it receives nothing, so nothing piles up in it.
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(ArpError::Socket(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a freshly opened descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(ArpAnnouncer {
            fd,
            interface: interface.to_string(),
            ifindex: ifindex as i32,
            mac,
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Sends one announcement (request and reply) for `addr`.
    pub fn announce(&self, addr: Ipv4Addr) -> Result<(), ArpError> {
        for frame in frames(self.mac, addr) {
            self.send(&frame).map_err(|source| ArpError::Send {
                addr,
                interface: self.interface.clone(),
                source,
            })?;
        }
        Ok(())
    }

    fn send(&self, frame: &[u8; FRAME_LEN]) -> std::io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ARP as u16).to_be();
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&BROADCAST);
        // SAFETY: the buffer and the address are valid for the lengths given, for the call.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n as usize != frame.len() {
            return Err(std::io::Error::other(format!(
                "short send: {n} of {} bytes",
                frame.len()
            )));
        }
        Ok(())
    }
}

/// The interface's MAC, from `/sys/class/net/IFACE/address`.
pub fn read_mac(interface: &str) -> Result<[u8; 6], ArpError> {
    let path = format!("/sys/class/net/{interface}/address");
    let err = |reason: String| ArpError::Mac {
        interface: interface.to_string(),
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
    parse_mac(text.trim()).ok_or_else(|| err(format!("{:?} is not a MAC address", text.trim())))
}

pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in mac.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The two broadcast frames of one announcement: an ARP request and an ARP reply, sender and
/// target protocol address both `addr`. The reply's target hardware address is our own MAC,
/// which Linux requires to treat a reply as gratuitous.
pub fn frames(mac: [u8; 6], addr: Ipv4Addr) -> [[u8; FRAME_LEN]; 2] {
    let frame = |oper: u16, tha: [u8; 6]| {
        let mut f = [0u8; FRAME_LEN];
        f[0..6].copy_from_slice(&BROADCAST);
        f[6..12].copy_from_slice(&mac);
        f[12..14].copy_from_slice(&0x0806u16.to_be_bytes()); // ARP
        f[14..16].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
        f[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
        f[18] = 6;
        f[19] = 4;
        f[20..22].copy_from_slice(&oper.to_be_bytes());
        f[22..28].copy_from_slice(&mac);
        f[28..32].copy_from_slice(&addr.octets());
        f[32..38].copy_from_slice(&tha);
        f[38..42].copy_from_slice(&addr.octets());
        f
    };
    [frame(1, [0; 6]), frame(2, mac)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs() {
        assert_eq!(
            parse_mac("02:00:0a:ff:00:9C"),
            Some([2, 0, 10, 255, 0, 0x9c])
        );
        for bad in [
            "",
            "02:00:0a:ff:00",
            "02:00:0a:ff:00:9c:01",
            "2:00:0a:ff:00:9c",
            "zz:00:0a:ff:00:9c",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
        assert!(read_mac("no-such-if0").is_err());
    }

    #[test]
    fn frame_layout() {
        let mac = [2, 0, 0, 0, 0, 7];
        let [req, rep] = frames(mac, Ipv4Addr::new(10, 213, 0, 100));
        let expect_req: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 7, 0x08, 0x06, // ethernet
            0, 1, 0x08, 0x00, 6, 4, 0, 1, // ARP request
            2, 0, 0, 0, 0, 7, 10, 213, 0, 100, // sender
            0, 0, 0, 0, 0, 0, 10, 213, 0, 100, // target
        ];
        assert_eq!(req[..42], expect_req);
        assert!(req[42..].iter().all(|b| *b == 0));
        assert_eq!(rep[20..22], [0, 2]);
        assert_eq!(
            rep[32..38],
            mac,
            "a gratuitous reply names us as target too"
        );
    }
}
