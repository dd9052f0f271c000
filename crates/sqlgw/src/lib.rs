//! A PostgreSQL wire-protocol gateway to redoubt's replicated SQL service.
//!
//! PostgreSQL clients (psql, drivers, ORMs) connect to the gateway as to a PostgreSQL
//! server; the gateway runs their statements on the replicated SQLite database through a
//! pool of redoubt clients, one client id per open connection (a client id has at most one
//! outstanding request). The gateway holds no data and decides nothing: every answer it
//! sends is a certified reply of the replicas, converted to PostgreSQL's types and command
//! tags. It is trusted by its own PostgreSQL clients, not by the replicas: a compromised
//! gateway can do whatever its client ids may do, no more.
//!
//! - [`catalog`]: the PostgreSQL catalog queries psql and drivers send, on SQLite's schema;
//! - [`split`]: the SQL lexer (statements, placeholders, commands the gateway answers);
//! - [`translate`]: PostgreSQL syntax drivers send (`::` casts, `SERIAL`...) in SQLite's;
//! - [`types`]: PostgreSQL types of result columns and parameters;
//! - [`session`]: one connection's transaction state machine, behind a [`session::Backend`];
//! - [`server`]: the pgwire handlers, the pool of client ids and the accept loop.
//!
//! The gateway authenticates nobody (trust): it must listen on a trusted interface only.

pub mod catalog;
pub mod server;
pub mod session;
pub mod split;
#[cfg(test)]
mod testing;
pub mod translate;
pub mod types;

pub use server::{serve, Gateway, GatewayConfig, GatewayError};

use redoubt_client::sql::SqlClientError;

/// An error as a PostgreSQL client sees it: a SQLSTATE code and a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} (SQLSTATE {code})")]
pub struct GwError {
    pub code: &'static str,
    pub message: String,
}

impl GwError {
    pub fn new(code: &'static str, message: impl Into<String>) -> GwError {
        GwError {
            code,
            message: message.into(),
        }
    }

    /// A failed call to the service: its SQLSTATE and message.
    pub fn from_client(e: &SqlClientError) -> GwError {
        GwError::new(e.sqlstate(), e.to_string())
    }
}
