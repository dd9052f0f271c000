//! SQLite over the replicated state, as a building block: one connection, reopened whenever
//! the library reloads the state, and the per-operation set-up every run needs (the state
//! behind the VFS, the agreed seed and time, a fresh step budget). [`super::SqlService`] runs
//! clients' SQL on it; the file service keeps its tables in it.

use super::vfs::{with_backing, Backing};
use super::{Db, SQLITE_TURN};
use redoubt_core::ExecContext;
use redoubt_state::{StateRead, StateWrite};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

/// A database in the replicated state (see the module documentation).
pub struct Engine {
    db: Mutex<Option<Db>>,
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new()
    }
}

impl Engine {
    pub fn new() -> Engine {
        super::vfs::register();
        Engine {
            db: Mutex::new(None),
        }
    }

    /// Opens a new connection on `state` (SQLite's page cache must not outlive a rollback or
    /// a state transfer) and checks that the state holds a database.
    pub fn load(&self, state: &dyn StateRead) -> Result<(), String> {
        // The same lock order as run_write and run_read: the turn, then the connection.
        let _turn = SQLITE_TURN.lock().unwrap_or_else(|p| p.into_inner());
        let mut backing = Backing::overlay(state)?;
        let mut guard = self.db.lock().unwrap_or_else(|p| p.into_inner());
        *guard = None;
        let db = with_backing(&mut backing, || {
            let db = Db::open()?;
            db.internal.store(true, Relaxed);
            let schema = db
                .conn
                .query_row("PRAGMA schema_version", [], |r| r.get::<_, i64>(0));
            db.internal.store(false, Relaxed);
            schema.map_err(|e| format!("reading the SQL database's schema: {e}"))?;
            Ok::<_, String>(db)
        })?;
        *guard = Some(db);
        Ok(())
    }

    /// Runs `f` with `state` writable behind the database; `f` says whether the operation
    /// wrote (its agreed time is then recorded as the latest write's). `Err`: the state holds
    /// no usable database.
    pub(super) fn run_write<R>(
        &self,
        state: &mut dyn StateWrite,
        ctx: &ExecContext,
        f: impl FnOnce(&Db) -> (R, bool),
    ) -> Result<R, String> {
        let _turn = SQLITE_TURN.lock().unwrap_or_else(|p| p.into_inner());
        let mut backing = Backing::write(state, ctx.time_ms)?;
        let (r, wrote) = with_backing(&mut backing, || {
            self.with_db(|db| {
                db.start(ctx.seed());
                f(db)
            })
        })?;
        if wrote {
            backing.stamp_time();
        }
        Ok(r)
    }

    /// Runs `f` over `state` without modifying it (writes land in a dropped overlay).
    pub(super) fn run_read<R>(
        &self,
        state: &dyn StateRead,
        seed: u64,
        f: impl FnOnce(&Db) -> R,
    ) -> Result<R, String> {
        let _turn = SQLITE_TURN.lock().unwrap_or_else(|p| p.into_inner());
        let mut backing = Backing::overlay(state)?;
        with_backing(&mut backing, || {
            self.with_db(|db| {
                db.start(seed);
                f(db)
            })
        })
    }

    fn with_db<R>(&self, f: impl FnOnce(&mut Db) -> R) -> Result<R, String> {
        let mut guard = self.db.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(Db::open()?);
        }
        Ok(f(guard.as_mut().expect("opened above")))
    }

    /// Runs the service's own statements in `f` as one transaction on the writable state:
    /// committed if `f` returns `Ok`, rolled back otherwise (also when the commit fails, e.g.
    /// on a full state: that error is `f`'s kind). Trusted code: nothing is refused.
    pub fn write_tx<T, E: From<rusqlite::Error>>(
        &self,
        state: &mut dyn StateWrite,
        ctx: &ExecContext,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, E>,
    ) -> Result<Result<T, E>, String> {
        self.run_write(state, ctx, |db| {
            db.internal.store(true, Relaxed);
            let out = match db.conn.execute_batch("BEGIN IMMEDIATE") {
                Err(e) => Err(format!("starting a transaction: {e}")),
                Ok(()) => match f(&db.conn) {
                    Ok(v) => match db.conn.execute_batch("COMMIT") {
                        Ok(()) => Ok(Ok(v)),
                        Err(e) => {
                            let _ = db.conn.execute_batch("ROLLBACK");
                            Ok(Err(E::from(e)))
                        }
                    },
                    Err(e) => {
                        let _ = db.conn.execute_batch("ROLLBACK");
                        Ok(Err(e))
                    }
                },
            };
            db.internal.store(false, Relaxed);
            let wrote = matches!(out, Ok(Ok(_)));
            (out, wrote)
        })?
    }

    /// Runs the service's own statements in `f` over `state` in a transaction that is rolled
    /// back: nothing reaches the state.
    pub fn read_tx<T>(
        &self,
        state: &dyn StateRead,
        seed: u64,
        f: impl FnOnce(&rusqlite::Connection) -> T,
    ) -> Result<T, String> {
        self.run_read(state, seed, |db| {
            db.internal.store(true, Relaxed);
            let out = match db.conn.execute_batch("BEGIN") {
                Err(e) => Err(format!("starting a transaction: {e}")),
                Ok(()) => {
                    let v = f(&db.conn);
                    let _ = db.conn.execute_batch("ROLLBACK");
                    Ok(v)
                }
            };
            db.internal.store(false, Relaxed);
            out
        })?
    }
}
