//! A bounded cache of base pages read from the page store.
//!
//! Reading a page from a file store is a system call and a copy per page; a service that
//! reads the same hot pages batch after batch pays it every time. The cache holds copies of
//! base pages (the store's bytes, never the overlay of pages modified since the base) up to a
//! byte budget, evicting the oldest inserted first. The tree forgets a page here whenever it
//! commits new bytes for it to the store. Checks of the medium (scrubs, start-up checks)
//! bypass it: they must see what the medium holds.

use std::collections::{HashMap, VecDeque};

/// Default budget of the cache (bytes).
pub const DEFAULT_PAGE_CACHE_BYTES: usize = 32 << 20;

pub(crate) struct PageCache {
    pages: HashMap<u64, Box<[u8]>>,
    /// Insertion order, for eviction; holds exactly the keys of `pages`.
    order: VecDeque<u64>,
    capacity: usize,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl PageCache {
    /// A cache of at most `capacity` pages (0: none kept).
    pub(crate) fn new(capacity: usize) -> PageCache {
        PageCache {
            pages: HashMap::new(),
            order: VecDeque::new(),
            capacity,
            hits: 0,
            misses: 0,
        }
    }

    pub(crate) fn get(&mut self, index: u64) -> Option<&[u8]> {
        match self.pages.get(&index) {
            Some(p) => {
                self.hits += 1;
                Some(p)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Keeps base page `index`, evicting the oldest pages beyond the capacity.
    pub(crate) fn insert(&mut self, index: u64, bytes: Box<[u8]>) {
        if self.capacity == 0 {
            return;
        }
        if self.pages.insert(index, bytes).is_none() {
            self.order.push_back(index);
        }
        self.evict();
    }

    /// Evicts the oldest pages beyond the capacity.
    fn evict(&mut self) {
        while self.pages.len() > self.capacity {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.pages.remove(&old);
        }
    }

    /// Forgets every page in `indexes` (the store's bytes for them change).
    pub(crate) fn forget_all(&mut self, indexes: impl IntoIterator<Item = u64>) {
        let mut any = false;
        for i in indexes {
            any |= self.pages.remove(&i).is_some();
        }
        if any {
            let pages = &self.pages;
            self.order.retain(|i| pages.contains_key(i));
        }
    }

    /// Changes the capacity, evicting the oldest pages beyond it.
    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
        self.evict();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_oldest_first_and_forgets() {
        let mut c = PageCache::new(2);
        c.insert(1, Box::new([1]));
        c.insert(2, Box::new([2]));
        c.insert(1, Box::new([11])); // replaces, keeps its place
        c.insert(3, Box::new([3]));
        assert_eq!(c.pages.len(), 2);
        assert!(c.get(1).is_none(), "the oldest inserted went first");
        assert_eq!(c.get(2), Some(&[2u8][..]));
        c.forget_all([2]);
        assert!(c.get(2).is_none());
        assert_eq!(c.order.len(), c.pages.len());
        c.insert(4, Box::new([4]));
        c.forget_all([3, 4, 9]);
        assert_eq!((c.pages.len(), c.order.len()), (0, 0));
        c.insert(5, Box::new([5]));
        c.set_capacity(0);
        assert_eq!(c.pages.len(), 0);
        c.insert(6, Box::new([6]));
        assert_eq!(c.pages.len(), 0, "capacity 0 keeps nothing");
        assert_eq!((c.hits, c.misses), (1, 2));
    }
}
