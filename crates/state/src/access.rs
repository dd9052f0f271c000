//! How a service reads and writes its state: a flat byte range laid over pages.
//!
//! The service never holds a mutable reference to page memory. Every write goes through
//! [`StateWrite::write`], which is the papers' `modify` call: it copies the page on its first
//! write in a checkpoint interval and marks it for the next checkpoint's digests. A write the
//! library does not see is therefore impossible by construction.

/// Read access to the service state.
pub trait StateRead {
    /// Size of the state in bytes (a multiple of the page size).
    fn size(&self) -> u64;
    /// Copies `buf.len()` bytes starting at byte `addr` into `buf`.
    ///
    /// # Panics
    /// If `addr + buf.len()` exceeds [`StateRead::size`] (a service bug, not bad input).
    fn read(&self, addr: u64, buf: &mut [u8]);
}

/// Write access to the service state.
pub trait StateWrite: StateRead {
    /// Writes `data` at byte `addr` (may span pages).
    ///
    /// # Panics
    /// If `addr + data.len()` exceeds [`StateRead::size`].
    fn write(&mut self, addr: u64, data: &[u8]);
}

/// A plain in-memory state with no pages, checkpoints or digests: for unit tests of services
/// and for the unreplicated baseline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatState {
    bytes: Vec<u8>,
}

impl FlatState {
    /// A zeroed state of `size` bytes.
    pub fn new(size: u64) -> FlatState {
        FlatState {
            bytes: vec![0; size as usize],
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl StateRead for FlatState {
    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read(&self, addr: u64, buf: &mut [u8]) {
        let a = addr as usize;
        buf.copy_from_slice(&self.bytes[a..a + buf.len()]);
    }
}

impl StateWrite for FlatState {
    fn write(&mut self, addr: u64, data: &[u8]) {
        let a = addr as usize;
        self.bytes[a..a + data.len()].copy_from_slice(data);
    }
}
