//! The services `redoubt replica` can host, chosen by the cluster file's `[state] service`.

use crate::files::FileService;
use crate::kv::KvService;
use crate::sql::SqlService;
use redoubt_core::{ExecContext, Service};
use redoubt_state::{StateRead, StateWrite};

/// One of the built-in services (every replica of a cluster hosts the same one).
pub enum Hosted {
    Kv(KvService),
    Sql(SqlService),
    Files(FileService),
}

impl Hosted {
    /// The service named `kind` (`[state] service`: "kv", "sql" or "files").
    pub fn named(kind: &str) -> Result<Hosted, String> {
        match kind {
            "kv" => Ok(Hosted::Kv(KvService::new())),
            "sql" => Ok(Hosted::Sql(SqlService::new())),
            "files" => Ok(Hosted::Files(FileService::new())),
            other => Err(format!(
                "unknown service \"{}\": expected \"kv\", \"sql\" or \"files\"",
                other.escape_debug()
            )),
        }
    }

    fn inner(&self) -> &dyn Service {
        match self {
            Hosted::Kv(s) => s,
            Hosted::Sql(s) => s,
            Hosted::Files(s) => s,
        }
    }

    fn inner_mut(&mut self) -> &mut dyn Service {
        match self {
            Hosted::Kv(s) => s,
            Hosted::Sql(s) => s,
            Hosted::Files(s) => s,
        }
    }
}

impl Service for Hosted {
    fn execute(&mut self, state: &mut dyn StateWrite, op: &[u8], ctx: &ExecContext) -> Vec<u8> {
        self.inner_mut().execute(state, op, ctx)
    }

    fn execute_read_only(&self, state: &dyn StateRead, op: &[u8]) -> Option<Vec<u8>> {
        self.inner().execute_read_only(state, op)
    }

    fn load(&mut self, state: &dyn StateRead) -> Result<(), String> {
        self.inner_mut().load(state)
    }
}
