//! Certificates of the execution cluster waiting for their signature check at an agreement
//! node, each kept once whichever filters passed it down.
//!
//! A certificate is named by everything its validity depends on (the sequence number, the
//! statement and the signature): a faulty filter that passes the right bundle under a wrong
//! signature passes a different certificate, checked on its own.
//!
//! The filters that passed a certificate down are counted, but their word takes nothing: frames
//! across the firewall carry no MAC and name their senders unauthenticated (ADR 0006), so one
//! faulty node can name every filter of a row. Production passes `needed = usize::MAX`; the
//! mutant `one-filter-vouches` takes a certificate on one filter's word, and the simulator
//! catches it.
//!
//! Bounds: at most [`WAITING_MAX`] certificates wait; the caller checks one beyond at once.

use crate::types::FilterId;
use std::collections::BTreeSet;

/// Certificates waiting for vouchers, at most.
pub(crate) const WAITING_MAX: usize = 64;

/// A certificate some filters passed down, not checked yet.
pub(crate) struct Waiting<K, T> {
    pub(crate) key: K,
    pub(crate) by: BTreeSet<FilterId>,
    pub(crate) item: T,
}

/// What a filter's copy of a certificate did.
pub(crate) enum Vouched<K, T> {
    /// `needed` filters passed it down (only a mutant sets a `needed` that can be reached).
    Enough(Waiting<K, T>),
    /// The first copy: it waits (unless the caller finds no room, see [`Vouches::full`]).
    First(Waiting<K, T>),
    /// Another copy of a certificate that still waits, or one from a filter that vouched for
    /// it already.
    Waits,
}

/// The certificates waiting for their check.
pub(crate) struct Vouches<K, T> {
    needed: usize,
    waiting: Vec<Waiting<K, T>>,
}

impl<K: PartialEq, T> Vouches<K, T> {
    /// Certificates `needed` filters pass down are taken unchecked.
    pub(crate) fn new(needed: usize) -> Self {
        Vouches {
            needed: needed.max(1),
            waiting: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether a first copy finds no room to wait (the caller checks it at once).
    pub(crate) fn full(&self) -> bool {
        self.len() >= WAITING_MAX
    }

    /// Filter `x` passed down the certificate `key`; `item` builds what is kept of it.
    pub(crate) fn vouch(&mut self, key: K, x: FilterId, item: impl FnOnce() -> T) -> Vouched<K, T> {
        if let Some(i) = self.waiting.iter().position(|w| w.key == key) {
            self.waiting[i].by.insert(x);
            if self.waiting[i].by.len() >= self.needed {
                return Vouched::Enough(self.waiting.swap_remove(i));
            }
            return Vouched::Waits;
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
        self.waiting.push(w);
    }

    /// Every certificate waiting, for the caller to check their signatures.
    pub(crate) fn take_all(&mut self) -> Vec<Waiting<K, T>> {
        std::mem::take(&mut self.waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_distinct_filters_make_a_certificate_taken() {
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
    fn with_one_needed_the_first_copy_is_enough() {
        let mut v: Vouches<u32, ()> = Vouches::new(1);
        assert!(matches!(v.vouch(7, 0, || ()), Vouched::Enough(_)));
    }

    #[test]
    fn copies_of_one_certificate_wait_once_and_all_are_taken_at_once() {
        let mut v: Vouches<u32, ()> = Vouches::new(usize::MAX);
        for (key, x) in [(7, 0), (7, 1), (8, 1)] {
            match v.vouch(key, x, || ()) {
                Vouched::First(w) => v.wait(w),
                Vouched::Waits => {}
                Vouched::Enough(_) => panic!("no filter's word is enough"),
            }
        }
        assert_eq!(v.len(), 2);
        let all = v.take_all();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].by.len(), 2);
        assert_eq!(v.len(), 0);
    }
}
