//! Global Prime among logical machines, end to end: four sites of four servers, each server's
//! logical machine running the core's Prime replica as site j of a 4-site cluster, over the
//! erasure-coded and the naive link, while one server of site 0 sends bad shares and bad parts
//! and site 3 is wholly faulty and silent. Closed-loop clients at the three correct sites sign
//! their updates; every correct server of every correct site must execute the same updates in
//! the same order, and every client gets f+1 matching answers from its own site.

mod common;

use common::{world, World};
use redoubt_core::state::{Geometry, MemStore, StateRead, StateWrite};
use redoubt_core::types::Principal;
use redoubt_core::{open_state, Directory, ExecContext, Service};
use redoubt_crypto::pk::HolderSecrets;
use redoubt_sites::global::{reply_of, update_frame, GlobalPrime};
use redoubt_sites::link::LogicalLink;
use redoubt_sites::machine::Event;
use redoubt_sites::{Server, SiteId};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Appends every operation to a log and answers with its position (kept in the state's first
/// eight bytes, so a state transfer would carry it; the log itself is for the checks).
#[derive(Default)]
struct Ledger {
    ops: Vec<Vec<u8>>,
}

impl Service for Ledger {
    fn execute(&mut self, state: &mut dyn StateWrite, op: &[u8], _ctx: &ExecContext) -> Vec<u8> {
        let mut n = [0u8; 8];
        state.read(0, &mut n);
        let n = u64::from_le_bytes(n) + 1;
        state.write(0, &n.to_le_bytes());
        self.ops.push(op.to_vec());
        n.to_le_bytes().to_vec()
    }
    fn execute_read_only(&self, _state: &dyn StateRead, _op: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn load(&mut self, _state: &dyn StateRead) -> Result<(), String> {
        Ok(())
    }
}

const CLIENTS: [u64; 3] = [100, 101, 102];
const UPDATES: u64 = 5;

fn client_key(c: u64) -> HolderSecrets {
    HolderSecrets::from_seed(&[0x90 + c as u8; 32])
}

fn order_key(site: u16) -> HolderSecrets {
    HolderSecrets::from_seed(&[0x70 + site as u8; 32])
}

fn global(site: SiteId, _: Server) -> GlobalPrime<Ledger> {
    let cfg = redoubt_sites::global::config(1);
    let mut directory = Directory::default();
    for c in CLIENTS {
        directory
            .keys
            .insert(Principal::Client(c), client_key(c).public());
    }
    let orders = Arc::new(
        (0..4)
            .map(|s| order_key(s).public().verify)
            .collect::<Vec<_>>(),
    );
    let store = MemStore::new(Geometry::new(256, 16, 4).unwrap());
    let state = open_state(Box::new(store)).unwrap();
    GlobalPrime::new(
        cfg,
        site,
        directory,
        Ledger::default(),
        state,
        orders,
        order_key(site.0),
    )
    .unwrap()
}

/// Each client sends its next update once f+1 servers of its site answered the last one.
fn run<L: LogicalLink>(mut w: World<GlobalPrime<Ledger>, L>) -> World<GlobalPrime<Ledger>, L> {
    let mut sent: BTreeMap<u64, u64> = BTreeMap::new();
    for r in 0..3000 {
        for (s, &c) in CLIENTS.iter().enumerate() {
            let ts = *sent.get(&c).unwrap_or(&0);
            // Answers to `ts` from distinct servers of the client's own site.
            let answered = (0..w.shape.servers())
                .filter(|&i| !w.faulty(s, i))
                .filter(|&i| {
                    w.sites[s].replies[i].iter().any(|(cl, frame)| {
                        *cl == c && reply_of(frame).is_some_and(|(_, t, _)| t == ts)
                    })
                })
                .count();
            if (ts == 0 || answered > w.shape.f()) && ts < UPDATES {
                let next = ts + 1;
                let op = format!("client {c} update {next}").into_bytes();
                let frame = update_frame(c, next, op, &client_key(c), next, 4);
                w.submit(s, c, Event::Update(frame).encode());
                sent.insert(c, next);
            }
        }
        w.round(r, true);
        if CLIENTS.iter().all(|c| sent.get(c) == Some(&UPDATES)) && r % 100 == 99 {
            break;
        }
    }
    // Global Prime keeps talking (statuses, rows), so servers may not all be at the end of
    // their site's order: the checks compare what each executed.
    w.settle(200);
    w
}

fn check<L: LogicalLink>(w: &World<GlobalPrime<Ledger>, L>) {
    let correct: Vec<(usize, usize)> = (0..3)
        .flat_map(|s| (0..w.shape.servers()).map(move |i| (s, i)))
        .filter(|&(s, i)| !w.faulty(s, i))
        .collect();
    let ops = |s: usize, i: usize| {
        &w.sites[s].servers[i]
            .machine()
            .participant()
            .core()
            .service()
            .ops
    };
    // Agreement: what each correct server of each correct site executed is a prefix of what
    // the one furthest along executed (a slow server may still be behind its site).
    let (rs, ri) = *correct
        .iter()
        .max_by_key(|&&(s, i)| ops(s, i).len())
        .unwrap();
    let reference = ops(rs, ri);
    for &(s, i) in &correct {
        let mine = ops(s, i);
        assert_eq!(
            &reference[..mine.len()],
            &mine[..],
            "site {s} server {i} ordered differently"
        );
    }
    for c in CLIENTS {
        for k in 1..=UPDATES {
            let op = format!("client {c} update {k}").into_bytes();
            assert_eq!(
                reference.iter().filter(|o| **o == op).count(),
                1,
                "client {c}'s update {k} ran once"
            );
        }
    }
    // Every client got its last answer from f+1 correct servers of its own site, and most
    // servers of every correct site executed everything.
    for (s, c) in CLIENTS.iter().enumerate() {
        let answered = (0..w.shape.servers())
            .filter(|&i| !w.faulty(s, i))
            .filter(|&i| {
                w.sites[s].replies[i]
                    .iter()
                    .any(|(cl, f)| cl == c && reply_of(f).is_some_and(|(_, t, _)| t == UPDATES))
            })
            .count();
        assert!(answered > w.shape.f(), "client {c}: {answered} answers");
    }
    let complete = correct
        .iter()
        .filter(|&&(s, i)| ops(s, i).len() == reference.len())
        .count();
    assert!(
        complete >= correct.len() - 1,
        "{complete} of {} servers complete",
        correct.len()
    );
}

#[test]
fn global_prime_orders_every_update_once_over_the_erasure_link() {
    let w = run(world(global, common::erasure));
    check(&w);
}

#[test]
fn a_logical_machine_on_its_servers_clocks_is_caught() {
    // The check above fails when each server feeds global Prime its own clock: the servers
    // of a site then emit different messages, their shares never combine, and the sites
    // stop agreeing or stop answering.
    let mut w = world(global, common::naive);
    w.server_clocks = true;
    let w = run(w);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&w)));
    assert!(caught.is_err(), "the broken logical machine went unnoticed");
}

#[test]
fn global_prime_orders_every_update_once_over_the_naive_link() {
    let w = run(world(global, common::naive));
    check(&w);
}
