//! Wide-area sites as logical machines (Amir et al. 2009; ADR 0010).
//!
//! N = 3F+1 sites of 3f+1 servers each. Inside a site, local ordering turns the servers into
//! one *logical machine* that takes part in a global protocol among the sites; what the logical
//! machine sends is threshold-signed by its site and carried to the other sites by a *logical
//! link*. This crate holds the pieces a site server runs beside its local ordering:
//!
//! - [`merkle`]: batch signing, one signature over many messages;
//! - [`message`]: the signed global message and the site's public keys that check it;
//! - [`sign`]: the threshold-signing protocol among a site's servers, with verified shares and
//!   the blacklisting of a server whose share does not verify;
//! - [`timeouts`]: a global timeout fires when f+1 servers' proposals of it are locally
//!   executed, never on one server's clock (trap 1);
//! - [`link`]: logical links behind one interface (naive, erasure-coded with its blacklisting
//!   protocol, over hubs, through dependable forwarders, and BLink);
//! - [`forwarder`]: a site's dependable forwarder, protocol-neutral and keyless;
//! - [`machine`]: the logical machine, which feeds locally executed events to the global
//!   protocol (a [`machine::Participant`]) and numbers what it emits;
//! - [`server`]: one site server, tying the machine, the signer and the links together;
//! - [`global`]: global Prime, the core's replica among the sites, as the participant.
//!
//! Everything here is pure: no clock, no socket, no thread, no randomness of its own. A host
//! (the node runtime or the simulator) feeds inputs and carries out what comes back, so the
//! same code runs under the seeded simulator. Nothing here trusts a link, a hub or a
//! forwarder: a global message is acted on only under its site's threshold signature.

pub mod forwarder;
pub mod global;
pub mod link;
pub mod machine;
pub mod merkle;
pub mod message;
pub mod server;
pub mod sign;
pub mod timeouts;

use serde::{Deserialize, Serialize};
use std::fmt;

/// Deliberately broken variants, for the simulator to show its checkers catch them (never set
/// outside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mutant {
    #[default]
    None,
    /// The logical machine takes each server's own clock for an event's time instead of the
    /// time local ordering agreed (trap 1).
    ServerClock,
    /// The site signer sends a combined signature out without checking it, so one bad share
    /// spoils it.
    ShareUnverified,
    /// The erasure link's receiving side does not blacklist the servers an INQUIRY-RESPONSE
    /// proved faulty (Figure 3, E7).
    NoBlacklisting,
    /// The erasure-coded link decodes from the parts a server *received* instead of those
    /// local ordering executed (trap 6): on a hub, where every server receives every part,
    /// servers decode at different points of the local order.
    DecodeOnReceipt,
    /// Global Prime leaves a view on one site's own suspicion instead of with 2f+1 votes
    /// (the core's `leave-alone`): a site whose timer fired alone is stranded in the later
    /// view and answers none of its clients. Only the simulator, built with the core's
    /// mutants, can set it.
    LeaveAlone,
}

impl Mutant {
    pub const ALL: [(&'static str, Mutant); 5] = [
        ("server-clock", Mutant::ServerClock),
        ("share-unverified", Mutant::ShareUnverified),
        ("no-blacklisting", Mutant::NoBlacklisting),
        ("decode-on-receipt", Mutant::DecodeOnReceipt),
        ("leave-alone", Mutant::LeaveAlone),
    ];
}

/// A site: one participant of the global protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SiteId(pub u16);

/// A server's index inside its site, from 0: also its threshold key share's index and the
/// number of the virtual link it serves (server i talks to server i of other sites).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Server(pub u16);

impl fmt::Display for SiteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "site {}", self.0)
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server {}", self.0)
    }
}

/// How many sites and how many servers in each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    sites: usize,
    servers: usize,
}

/// A shape that is not 3F+1 sites of 3f+1 servers.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShapeError {
    #[error("{0} sites: need 3F+1 sites for some F >= 1 (4, 7, 10, ...)")]
    Sites(usize),
    #[error("{0} servers per site: need 3f+1 servers for some f >= 1 (4, 7, 10, ...)")]
    Servers(usize),
}

impl Shape {
    pub fn new(sites: usize, servers: usize) -> Result<Shape, ShapeError> {
        let fits = |n: usize| n >= 4 && (n - 1).is_multiple_of(3) && n <= u16::MAX as usize;
        if !fits(sites) {
            return Err(ShapeError::Sites(sites));
        }
        if !fits(servers) {
            return Err(ShapeError::Servers(servers));
        }
        Ok(Shape { sites, servers })
    }
    pub fn sites(&self) -> usize {
        self.sites
    }
    pub fn servers(&self) -> usize {
        self.servers
    }
    /// f: faulty servers a correct site tolerates.
    pub fn f(&self) -> usize {
        (self.servers - 1) / 3
    }
    /// F: wholly faulty sites the system tolerates.
    pub fn big_f(&self) -> usize {
        (self.sites - 1) / 3
    }
    pub fn site_ids(&self) -> impl Iterator<Item = SiteId> {
        (0..self.sites as u16).map(SiteId)
    }
    pub fn server_ids(&self) -> impl Iterator<Item = Server> {
        (0..self.servers as u16).map(Server)
    }
    pub fn has_site(&self, s: SiteId) -> bool {
        (s.0 as usize) < self.sites
    }
    pub fn has_server(&self, s: Server) -> bool {
        (s.0 as usize) < self.servers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_three_f_plus_one_of_three_f_plus_one() {
        let s = Shape::new(7, 4).unwrap();
        assert_eq!((s.big_f(), s.f()), (2, 1));
        assert_eq!(Shape::new(5, 4), Err(ShapeError::Sites(5)));
        assert_eq!(Shape::new(4, 1), Err(ShapeError::Servers(1)));
        assert_eq!(Shape::new(4, 6), Err(ShapeError::Servers(6)));
    }
}
