//! Test scaffolding shared by the core's integration tests: a small deterministic service and
//! a fresh in-memory state.

use redoubt_core::*;

/// Appends every operation to the state (8-byte length, then the bytes, wrapping around).
pub struct Svc;
impl Service for Svc {
    fn execute(&mut self, st: &mut dyn state::StateWrite, op: &[u8], _c: &ExecContext) -> Vec<u8> {
        let mut len = [0u8; 8];
        st.read(0, &mut len);
        let at = u64::from_le_bytes(len);
        for (i, b) in op.iter().enumerate() {
            st.write(8 + (at + i as u64) % (st.size() - 8), &[*b]);
        }
        st.write(0, &(at + op.len() as u64).to_le_bytes());
        op.to_vec()
    }
    fn execute_read_only(&self, _st: &dyn state::StateRead, _op: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn load(&mut self, _st: &dyn state::StateRead) -> Result<(), String> {
        Ok(())
    }
}

pub fn fresh_state() -> state::PagedState {
    open_state(Box::new(state::MemStore::new(
        state::Geometry::new(256, 16, 4).unwrap(),
    )))
    .unwrap()
}
