//! The privacy firewall in the world (`Config::filter_rows > 0`; Yin et al. 2003 §4): the
//! unmodified core [`Filter`]s between the clusters, the physical links of the paper's
//! Figure 2(c) (each node talks to the rows next to it only, and a frame on a link comes
//! from the node at its other end), the faulty filters ([`FilterBehavior`]), and the
//! confidentiality check: a correct client's value in clear must never reach a faulty
//! agreement node, a client other than through its own sealed reply, or a faulty filter
//! below an all-correct row.

use super::*;
use crate::scenario::FilterBehavior;
use redoubt_core::filter::FirewallKeys;
use redoubt_core::message::{frame_sender, ReplyBundle, ReplyCert, ReplyEntry, VouchedCert};
use redoubt_core::{Filter, FilterId};
use redoubt_crypto::threshold::{self, KeyShare, ThresholdSig};

pub(super) struct SimFilter {
    core: Filter,
    behavior: Option<FilterBehavior>,
    /// A leaky filter passes each distinct frame on once (two of them next to each other
    /// would otherwise echo frames between them without end).
    passed: BTreeSet<redoubt_crypto::Digest>,
}

/// Distinct frames a leaky filter remembers having passed on.
const PASSED_MAX: usize = 4096;

/// The firewall's keys as the dealer made them (`redoubt init` in a deployment).
pub(super) struct Dealt {
    pub(super) keys: Arc<FirewallKeys>,
    pub(super) order_keys: Vec<HolderSecrets>,
    pub(super) shares: Vec<KeyShare>,
    /// Each filter's filter key (it signs its vouches).
    pub(super) vouching: Vec<HolderSecrets>,
}

impl World {
    /// Deals the firewall's keys from the run's master secret (none without a firewall).
    pub(super) fn deal_firewall(sc: &Scenario, master: &[u8]) -> Option<Dealt> {
        if !sc.core.firewall() {
            return None;
        }
        let seed =
            |what: &str| *blake3::keyed_hash(&master_key(master), what.as_bytes()).as_bytes();
        let order_keys: Vec<HolderSecrets> = (0..sc.core.n())
            .map(|r| HolderSecrets::from_seed(&seed(&format!("order key r{r}"))))
            .collect();
        // The mutant `threshold-at-g`: g shares sign.
        let threshold = if sc.mutant == redoubt_core::Mutant::ThresholdAtG {
            sc.core.g() as usize - 1
        } else {
            sc.core.g() as usize
        };
        let (group, shares) = threshold::deal(
            threshold,
            sc.core.executors as usize,
            seed("threshold dealer"),
        );
        let vouching: Vec<HolderSecrets> = (0..sc.core.filters())
            .map(|x| HolderSecrets::from_seed(&seed(&format!("filter key x{x}"))))
            .collect();
        let keys = Arc::new(FirewallKeys {
            orders: order_keys.iter().map(|k| k.public().verify).collect(),
            group,
            filters: vouching.iter().map(|k| k.public().verify).collect(),
        });
        Some(Dealt {
            keys,
            order_keys,
            shares,
            vouching,
        })
    }

    pub(super) fn build_filters(sc: &Scenario, dealt: &Option<Dealt>) -> Vec<SimFilter> {
        let Some(d) = dealt else {
            return Vec::new();
        };
        (0..sc.core.filters())
            .map(|x| SimFilter {
                core: Filter::new(
                    sc.core.clone(),
                    x,
                    d.keys.clone(),
                    d.vouching[x as usize].clone(),
                )
                .expect("valid filter"),
                behavior: sc
                    .filter_byzantine
                    .iter()
                    .find(|(y, _)| *y == x)
                    .map(|(_, b)| *b),
                passed: BTreeSet::new(),
            })
            .collect()
    }

    /// A replica with the keys its deployment gives it (firewall, Prime), or as it is.
    pub(super) fn arm_replica(
        &self,
        r: ReplicaId,
        rep: Replica<KvService, SessionKeys>,
    ) -> Replica<KvService, SessionKeys> {
        super::prime::arm(&self.dealt, &self.prime, r, rep)
    }

    fn filter_row(&self, x: FilterId) -> u32 {
        x / self.sc.core.filter_rows
    }

    fn filter_faulty(&self, x: FilterId) -> bool {
        self.filters[x as usize].behavior.is_some()
    }

    /// The paper's links (Figure 2(c)): clients and agreement nodes among themselves, the
    /// bottom row with the agreement nodes, each row with the rows next to it, the top row
    /// with the execution nodes, execution nodes among themselves. Without a firewall every
    /// node reaches every other.
    pub(super) fn linked(&self, a: Principal, b: Principal) -> bool {
        if !self.sc.core.firewall() {
            return true;
        }
        let top = self.sc.core.filter_rows - 1;
        let side = |p: Principal| match p {
            Principal::Client(_) => -2i64,
            Principal::Replica(_) => -1,
            Principal::Filter(x) => self.filter_row(x) as i64,
            Principal::Executor(_) => top as i64 + 1,
        };
        let (sa, sb) = (side(a), side(b));
        match (a, b) {
            (Principal::Client(_), Principal::Client(_)) => false,
            (Principal::Client(_), Principal::Replica(_))
            | (Principal::Replica(_), Principal::Client(_)) => true,
            (Principal::Client(_), _) | (_, Principal::Client(_)) => false,
            (Principal::Filter(_), Principal::Filter(_)) => sa.abs_diff(sb) == 1,
            _ => sa == sb || sa.abs_diff(sb) == 1,
        }
    }

    /// Whether a frame may travel from `from` to `to`: a link between them, and a frame that
    /// names its sender truly where the receiver relies on the link for it (filters, and
    /// execution nodes behind the firewall).
    pub(super) fn may_travel(&self, from: Principal, to: Principal, bytes: &[u8]) -> bool {
        if !self.sc.core.firewall() {
            return true;
        }
        if !self.linked(from, to) {
            return false;
        }
        let relies = matches!(to, Principal::Filter(_) | Principal::Executor(_))
            || matches!(from, Principal::Filter(_));
        !relies || frame_sender(bytes) == Some(from)
    }

    pub(super) fn deliver_filter(&mut self, x: FilterId, from: Principal, bytes: &[u8]) {
        if x as usize >= self.filters.len() {
            return;
        }
        match self.filters[x as usize].behavior {
            Some(FilterBehavior::Silent) => {}
            Some(FilterBehavior::Leaky) => self.leak_through(x, from, bytes),
            None => self.filter_input(x, Input::Receive(bytes)),
        }
    }

    pub(super) fn tick_filter(&mut self, x: FilterId) {
        if self.filters[x as usize].behavior.is_none() {
            self.filter_input(x, Input::Tick);
        }
        self.schedule(self.now + TICK_MS, Ev::TickFilter(x));
    }

    fn filter_input(&mut self, x: FilterId, input: Input<'_>) {
        let env = self.env();
        let eff = self.filters[x as usize].core.handle(env, input);
        if let Err(v) = self.filters[x as usize].core.check_invariants() {
            self.violation(format!("x{x} broke an invariant of its core: {v}"));
        }
        for e in eff {
            match e {
                Effect::Send { to, bytes } => {
                    self.transmit(Principal::Filter(x), to, bytes.to_vec(), 0)
                }
                Effect::Event(Event::Rejected { from, kind, reason }) => {
                    self.log(|| format!("x{x} rejected {kind} from {from:?}: {reason}"));
                }
                _ => {}
            }
        }
    }

    /// A leaky filter: everything it got goes on to every node it has a link to, under its
    /// own name (once per distinct frame; others' vouches so passed on do not verify), and what
    /// came from the execution nodes also down inside a reply certificate of its own making,
    /// vouched for with its own filter key.
    fn leak_through(&mut self, x: FilterId, from: Principal, bytes: &[u8]) {
        let Ok(frame) = decode_frame(bytes, usize::MAX) else {
            return;
        };
        let seen = &mut self.filters[x as usize].passed;
        if seen.len() >= PASSED_MAX {
            seen.clear();
        }
        if !seen.insert(redoubt_crypto::Digest::of(&frame.body)) {
            return;
        }
        let me = Principal::Filter(x);
        let mut out = vec![frame.body.clone()];
        // What the execution nodes send (the leaked values a faulty one hands it) also goes
        // down wrapped in a reply certificate of its own making (wrapping what other filters
        // pass would make two leaky neighbours wrap each other's frames without end).
        if matches!(from, Principal::Executor(_)) {
            let bundle = ReplyBundle {
                seq: self.rng.random_range(1..64),
                entries: vec![ReplyEntry {
                    client: 1,
                    timestamp: 1,
                    result: frame.body.clone(),
                }],
            };
            let cert = ReplyCert {
                bundle,
                signature: ThresholdSig([0x5a; threshold::SIG_LEN]),
            };
            let key =
                VouchedCert::statement(cert.bundle.seq, &cert.bundle.statement(), &cert.signature);
            let vouch = match &self.dealt {
                Some(d) => d.vouching[x as usize].sign(&key.0),
                None => return,
            };
            let cert = Message::from(VouchedCert { cert, vouch });
            out.push(redoubt_core::message::encode_body(&cert));
        }
        let peers: Vec<Principal> = (0..self.sc.core.n())
            .map(Principal::Replica)
            .chain((0..self.sc.core.filters()).map(Principal::Filter))
            .chain((0..self.sc.core.executors).map(Principal::Executor))
            .filter(|p| *p != me && self.linked(me, *p))
            .collect();
        for body in out {
            let frame = redoubt_core::message::encode_frame_parts(
                redoubt_core::message::WIRE_VERSION,
                me,
                0,
                &body,
                &redoubt_core::message::Tag::None,
            );
            for p in &peers {
                self.transmit(me, *p, frame.clone(), 0);
            }
        }
    }

    /// The confidentiality check at delivery: a correct client's value in clear reaching a
    /// node that must never hold one.
    pub(super) fn check_leak(&mut self, to: Principal, from: Principal, bytes: &[u8]) {
        if !self.sc.core.firewall() || !secrets::holds_tag(bytes) {
            return;
        }
        let leaked = match to {
            Principal::Replica(r) => self.faulty.contains(&r) || self.adversary.controls(r),
            Principal::Client(id) => !self.clients.iter().any(|c| c.core.id() == id),
            Principal::Executor(_) => false,
            Principal::Filter(x) => self.filter_faulty(x) && self.below_correct_row(x),
        };
        if leaked {
            let kind = describe(bytes);
            self.violation(format!(
                "confidentiality: a client's value in clear reached {to:?} (from {from:?}, \
                 {kind}) through the firewall"
            ));
        }
    }

    /// Whether some all-correct row lies above filter `x`'s row (the correct cut: what
    /// passes it is only what g+1 execution nodes vouched for).
    fn below_correct_row(&self, x: FilterId) -> bool {
        let row = self.filter_row(x);
        (row + 1..self.sc.core.filter_rows)
            .any(|r| self.sc.core.filter_row(r).all(|y| !self.filter_faulty(y)))
    }

    pub(super) fn filter_correct(&self, x: FilterId) -> bool {
        (x as usize) < self.filters.len() && !self.filter_faulty(x)
    }

    /// Counters of the correct filters at the end of a run.
    pub(super) fn filter_totals(&self) -> (u64, u64, u64) {
        self.filters
            .iter()
            .filter(|f| f.behavior.is_none())
            .fold((0, 0, 0), |(a, b, c), f| {
                (
                    a + f.core.stats.replies_forwarded,
                    b + f.core.stats.certificates_rejected,
                    c + f.core.stats.shares_rejected,
                )
            })
    }
}

/// A 32-byte key for deriving the firewall's secrets from the run's master secret.
pub(super) fn master_key(master: &[u8]) -> [u8; 32] {
    *blake3::hash(master).as_bytes()
}
