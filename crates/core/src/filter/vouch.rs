//! Reply certificates of the execution cluster vouched for by filters of the row above, at a
//! filter or an agreement node, each kept once whichever filters vouched for it.
//!
//! A correct filter vouches only for a certificate it took in, and at most h filters are
//! faulty: once all h+1 filters of a row vouched for a certificate (`needed`, from
//! `Config::vouchers`), one of them is correct, and the certificate is taken without checking
//! its threshold signature again. Each vouch is the filter's signature with its filter key
//! (`VouchedCert`), checked by the caller before it counts here: a faulty node cannot vouch in
//! another filter's name. The mutant `one-filter-vouches` takes a certificate on one filter's
//! vouch, and the simulator catches it.
//!
//! A certificate is named by everything its validity depends on (the sequence number, the
//! statement and the signature): a faulty filter that vouches for the right bundle under a
//! wrong signature vouches for a different certificate, counted on its own. One fewer vouches
//! than needed within a tick (a faulty or slow filter) leaves the caller to check the
//! signature itself ([`Vouches::take_due`]).
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
    /// Whether a tick passed since it began to wait.
    aged: bool,
}

/// What a filter's copy of a certificate did.
pub(crate) enum Vouched<K, T> {
    /// `needed` filters vouched for it.
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
    /// Certificates `needed` filters vouch for are taken unchecked.
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

    /// Filter `x` vouched for the certificate `key`; `item` builds what is kept of it.
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
            aged: false,
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

    /// At a tick: the certificates that waited since the tick before, for the caller to
    /// check their signatures (the others wait one more tick).
    pub(crate) fn take_due(&mut self) -> Vec<Waiting<K, T>> {
        let (due, young) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.aged);
        self.waiting = young;
        for w in &mut self.waiting {
            w.aged = true;
        }
        due
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
    fn copies_of_one_certificate_wait_once_and_are_due_at_the_second_tick() {
        let mut v: Vouches<u32, ()> = Vouches::new(3);
        for (key, x) in [(7, 0), (7, 1), (8, 1)] {
            match v.vouch(key, x, || ()) {
                Vouched::First(w) => v.wait(w),
                Vouched::Waits => {}
                Vouched::Enough(_) => panic!("three are needed"),
            }
        }
        assert_eq!(v.len(), 2);
        assert!(v.take_due().is_empty(), "nothing waited a whole tick yet");
        let Vouched::First(w) = v.vouch(9, 0, || ()) else {
            panic!("first copy")
        };
        v.wait(w);
        let due = v.take_due();
        assert_eq!(due.iter().map(|w| w.key).collect::<Vec<_>>(), [7, 8]);
        assert_eq!(due[0].by.len(), 2);
        assert_eq!(v.len(), 1);
        assert_eq!(v.take_due().len(), 1);
        assert_eq!(v.len(), 0);
    }
}
