//! Certificates of the execution cluster taken on the word of h+1 nodes of a filter row.
//!
//! A correct filter passes a reply certificate down only once its threshold signature checked
//! (the top row combines and checks it; every row below checks what comes from above or takes
//! it here), and at most h filters are faulty. So a certificate that h+1 distinct filters of
//! the same row passed down is one a correct filter checked: the node below takes it without
//! a pairing of its own. One that fewer pass down (a filter of the row is down or faulty)
//! waits, and the second tick after its arrival has its signature checked.
//!
//! A certificate is named by everything its validity depends on (the sequence number, the
//! statement and the signature, or the whole message body): a faulty filter that passes the
//! right bundle under a wrong signature vouches for a different certificate.
//!
//! Bounds: at most [`WAITING_MAX`] certificates wait; the caller checks one beyond at once.

use crate::types::FilterId;
use std::collections::BTreeSet;

/// Certificates waiting for vouchers, at most.
pub(crate) const WAITING_MAX: usize = 64;

/// A certificate some filters passed down, not taken yet.
pub(crate) struct Waiting<K, T> {
    pub(crate) key: K,
    pub(crate) by: BTreeSet<FilterId>,
    pub(crate) item: T,
}

/// What a filter's copy of a certificate did.
pub(crate) enum Vouched<K, T> {
    /// h+1 filters passed it down: take it.
    Enough(Waiting<K, T>),
    /// The first copy: it waits (unless the caller finds no room, see [`Vouches::full`]).
    First(Waiting<K, T>),
    /// Another copy of a certificate that still waits, or one from a filter that vouched for
    /// it already.
    Waits,
}

/// The certificates fewer than h+1 filters vouched for: those that came since the last tick
/// (`fresh`) and before it (`due`).
pub(crate) struct Vouches<K, T> {
    needed: usize,
    fresh: Vec<Waiting<K, T>>,
    due: Vec<Waiting<K, T>>,
}

impl<K: PartialEq, T> Vouches<K, T> {
    /// Certificates `needed` filters vouch for are taken (h+1).
    pub(crate) fn new(needed: usize) -> Self {
        Vouches {
            needed: needed.max(1),
            fresh: Vec::new(),
            due: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.fresh.len() + self.due.len()
    }

    /// Whether a first copy finds no room to wait (the caller checks it at once).
    pub(crate) fn full(&self) -> bool {
        self.len() >= WAITING_MAX
    }

    /// Filter `x` passed down the certificate `key`; `item` builds what is kept of it.
    pub(crate) fn vouch(&mut self, key: K, x: FilterId, item: impl FnOnce() -> T) -> Vouched<K, T> {
        for list in [&mut self.fresh, &mut self.due] {
            if let Some(i) = list.iter().position(|w| w.key == key) {
                list[i].by.insert(x);
                if list[i].by.len() >= self.needed {
                    return Vouched::Enough(list.swap_remove(i));
                }
                return Vouched::Waits;
            }
        }
        let w = Waiting {
            key,
            by: BTreeSet::from([x]),
            item: item(),
        };
        if self.needed <= 1 {
            Vouched::Enough(w)
        } else {
            Vouched::First(w)
        }
    }

    /// Keeps a first copy waiting (the caller made sure it is not [`full`](Self::full)).
    pub(crate) fn wait(&mut self, w: Waiting<K, T>) {
        self.fresh.push(w);
    }

    /// At a tick: the certificates that waited since the tick before, for the caller to
    /// check their signatures.
    pub(crate) fn take_due(&mut self) -> Vec<Waiting<K, T>> {
        std::mem::replace(&mut self.due, std::mem::take(&mut self.fresh))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h_plus_one_distinct_filters_make_a_certificate_taken() {
        let mut v: Vouches<u32, ()> = Vouches::new(2);
        let Vouched::First(w) = v.vouch(7, 0, || ()) else {
            panic!("first copy")
        };
        v.wait(w);
        // The same filter again does not count twice; another certificate is apart.
        assert!(matches!(v.vouch(7, 0, || ()), Vouched::Waits));
        assert!(matches!(v.vouch(8, 1, || ()), Vouched::First(_)));
        let Vouched::Enough(w) = v.vouch(7, 1, || ()) else {
            panic!("two filters vouched")
        };
        assert_eq!(w.by.len(), 2);
        assert_eq!(v.len(), 0);
    }

    #[test]
    fn with_h_zero_one_filter_is_enough() {
        let mut v: Vouches<u32, ()> = Vouches::new(1);
        assert!(matches!(v.vouch(7, 0, || ()), Vouched::Enough(_)));
    }

    #[test]
    fn what_waits_is_due_at_the_second_tick() {
        let mut v: Vouches<u32, ()> = Vouches::new(2);
        let Vouched::First(w) = v.vouch(7, 0, || ()) else {
            panic!()
        };
        v.wait(w);
        assert!(v.take_due().is_empty(), "arrived since the last tick");
        let due = v.take_due();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].key, 7);
        assert_eq!(v.len(), 0);
    }
}
