//! The PostgreSQL side: pgwire handlers for one connection, the pool of client ids, and the
//! accept loop.
//!
//! Each accepted connection takes a free client id from the pool and gives it back when it
//! closes (after its last request finished); with none free the connection is refused with
//! SQLSTATE 53300. Everything the connection does goes through its [`SessionHandle`]; the
//! handlers here only translate between PostgreSQL messages and session outcomes, and keep
//! the transaction status pgwire reports in ReadyForQuery equal to the session's.

use crate::session::{self, Backend, Outcome, Prepared, SessionHandle, TxStatus};
use crate::split::{classify, split, Command};
use crate::types::{decode_param, described_types, encode_rows, fields, format_at, inferred_types};
use crate::GwError;
use async_trait::async_trait;
use futures::sink::{Sink, SinkExt};
use futures::stream;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::StartupHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{
    send_execution_response, send_query_response, send_ready_for_query, ExtendedQueryHandler,
    SimpleQueryHandler,
};
use pgwire::api::results::{DescribePortalResponse, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ErrorHandler, PgWireConnectionState, PgWireServerHandlers, Type,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::extendedquery::Execute;
use pgwire::messages::response::{EmptyQueryResponse, NoticeResponse, TransactionStatus};
use pgwire::messages::simplequery::Query;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use redoubt_client::sql::SqlClient;
use redoubt_client::{ClientError, ClientSetup, Connections};
use redoubt_services::sql::{Statement, StmtResult};
use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tracing::{info, warn};

/// What the gateway needs to start.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Where PostgreSQL clients connect (a trusted interface: there is no authentication).
    pub listen: SocketAddr,
    /// One client per connection the gateway may hold open at a time.
    pub clients: Vec<ClientSetup>,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start client {id} of the cluster: {source}")]
    Client { id: u64, source: ClientError },
    #[error("the gateway needs at least one client id (--clients)")]
    NoClients,
}

/// A bound gateway with its clients started, not yet serving.
pub struct Gateway {
    listener: TcpListener,
    pool: Vec<SqlClient>,
}

impl Gateway {
    /// Binds `cfg.listen` and starts one client per setup, over connections to the replicas
    /// they share.
    pub async fn bind(cfg: GatewayConfig) -> Result<Gateway, GatewayError> {
        let first = cfg.clients.first().ok_or(GatewayError::NoClients)?;
        let listener =
            TcpListener::bind(cfg.listen)
                .await
                .map_err(|source| GatewayError::Listen {
                    addr: cfg.listen,
                    source,
                })?;
        let frame_bytes_max = cfg.clients.iter().map(|s| s.frame_bytes_max).max();
        let connections = Connections::open(
            &first.replicas,
            cfg.clients.len(),
            frame_bytes_max.unwrap_or(first.frame_bytes_max),
        );
        let mut pool = Vec::with_capacity(cfg.clients.len());
        for setup in cfg.clients {
            let id = setup.id;
            let client = redoubt_client::Client::connect_over(setup, &connections)
                .await
                .map_err(|source| GatewayError::Client { id, source })?;
            pool.push(SqlClient::new(client));
        }
        Ok(Gateway { listener, pool })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The client ids connections will use.
    pub fn client_ids(&self) -> Vec<u64> {
        self.pool.iter().map(|c| c.client().id()).collect()
    }

    /// Serves until `shutdown` completes (see [`serve`]).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        serve(self.listener, self.pool, shutdown).await
    }
}

/// The client ids not in use.
struct Pool<B> {
    free: Mutex<Vec<B>>,
    size: usize,
}

/// A client id taken from the pool; it goes back when the lease is dropped.
struct Lease<B: Backend + Clone> {
    client: B,
    pool: Arc<Pool<B>>,
}

impl<B: Backend + Clone> Drop for Lease<B> {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
        free.push(self.client.clone());
    }
}

impl<B: Backend + Clone> Pool<B> {
    fn take(self: &Arc<Pool<B>>) -> Option<Lease<B>> {
        let client = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(Lease {
            client,
            pool: self.clone(),
        })
    }
}

/// Accepts PostgreSQL connections on `listener` until `shutdown` completes, each served
/// with one client of `pool` (refused with SQLSTATE 53300 when all are in use). Connections
/// open at shutdown are dropped with the runtime.
pub async fn serve<B: Backend + Clone>(
    listener: TcpListener,
    pool: Vec<B>,
    shutdown: impl Future<Output = ()>,
) {
    let pool = Arc::new(Pool {
        size: pool.len(),
        free: Mutex::new(pool),
    });
    tokio::pin!(shutdown);
    loop {
        let (socket, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, mostly: wait rather than spin.
                    warn!(error = %e, "sql-gateway cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = socket.set_nodelay(true);
        match pool.take() {
            Some(lease) => {
                tokio::spawn(connection(socket, peer, lease));
            }
            None => {
                warn!(%peer, clients = pool.size, "sql-gateway refuses a connection: every client id is in use");
                let refusal = Arc::new(Refusal { clients: pool.size });
                tokio::spawn(async move {
                    let _ = pgwire::tokio::process_socket(socket, None, refusal).await;
                });
            }
        }
    }
}

async fn connection<B: Backend + Clone>(socket: TcpStream, peer: SocketAddr, lease: Lease<B>) {
    let client = lease.client.client_id();
    info!(client, %peer, "sql-gateway connection opened");
    let session = session::spawn(lease.client.clone(), lease);
    let conn = Arc::new(Connection {
        parser: Arc::new(Parser {
            session: session.clone(),
        }),
        session,
        status: Mutex::new(TxStatus::Idle),
        described: Mutex::new(None),
        client,
    });
    if let Err(e) = pgwire::tokio::process_socket(socket, None, Handlers(conn)).await {
        info!(client, %peer, error = %e, "sql-gateway connection failed");
    }
    info!(client, %peer, "sql-gateway connection closed");
}

/// Answers the startup of a connection the pool has no client id for.
struct Refusal {
    clients: usize,
}

impl PgWireServerHandlers for Refusal {
    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        Arc::new(Refusal {
            clients: self.clients,
        })
    }
}

#[async_trait]
impl StartupHandler for Refusal {
    async fn on_startup<C>(
        &self,
        _client: &mut C,
        _message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        Err(PgWireError::UserError(Box::new(ErrorInfo::new(
            "FATAL".into(),
            "53300".into(),
            format!(
                "too many connections: the gateway has {} client ids (--clients)",
                self.clients
            ),
        ))))
    }
}

/// The handlers pgwire asks for: all the one connection.
struct Handlers(Arc<Connection>);

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.0.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.0.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.0.clone()
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        self.0.clone()
    }
}

/// One PostgreSQL connection.
struct Connection {
    session: SessionHandle,
    parser: Arc<Parser>,
    /// The session's status after its last request, for ReadyForQuery.
    status: Mutex<TxStatus>,
    /// A portal that ran when it was described (see `do_describe_portal`), for its Execute.
    described: Mutex<Option<Described>>,
    client: u64,
}

/// The outcome of a portal run at its Describe, and the fields that Describe announced.
struct Described {
    /// The portal's address: a new Bind makes a new portal.
    portal: usize,
    sql: String,
    outcome: Outcome,
    fields: Vec<FieldInfo>,
}

/// Where `portal` lives, to tell it from other portals.
fn portal_key(portal: &Portal<Prepared>) -> usize {
    portal as *const Portal<Prepared> as usize
}

/// The statement `portal` runs: its SQL and its parameters as SQLite values.
fn bound_statement(portal: &Portal<Prepared>) -> Result<Statement, GwError> {
    let p = &portal.statement.statement;
    if portal.parameters.len() != p.params {
        return Err(GwError::new(
            "08P01",
            format!(
                "bind message supplies {} parameters, but prepared statement requires {}",
                portal.parameters.len(),
                p.params
            ),
        ));
    }
    let mut params = Vec::with_capacity(p.params);
    for (i, b) in portal.parameters.iter().enumerate() {
        let ty = portal
            .statement
            .parameter_types
            .get(i)
            .cloned()
            .flatten()
            .unwrap_or(Type::TEXT);
        let format = format_at(&portal.parameter_format, i);
        params.push(decode_param(i, &ty, format, b.as_deref())?);
    }
    Ok(Statement::with_params(p.sql.clone(), params))
}

fn pg_status(s: TxStatus) -> TransactionStatus {
    match s {
        TxStatus::Idle => TransactionStatus::Idle,
        TxStatus::InTransaction => TransactionStatus::Transaction,
        TxStatus::Failed => TransactionStatus::Error,
    }
}

fn error_info(severity: &str, e: GwError) -> ErrorInfo {
    ErrorInfo::new(severity.into(), e.code.into(), e.message)
}

fn user_error(e: GwError) -> PgWireError {
    PgWireError::UserError(Box::new(error_info("ERROR", e)))
}

/// `SELECT 3` -> `SELECT`, `INSERT 0 2` -> `INSERT 0`: pgwire appends the rows it sends.
fn tag_prefix(tag: &str) -> &str {
    match tag.rsplit_once(' ') {
        Some((p, n)) if n.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => tag,
    }
}

fn rows_response(
    fields: Vec<FieldInfo>,
    tag: &str,
    rows: &[Vec<redoubt_services::sql::Value>],
) -> Result<Response, GwError> {
    let fields = Arc::new(fields);
    let encoded = encode_rows(&fields, rows)?;
    let mut q = QueryResponse::new(fields, stream::iter(encoded.into_iter().map(Ok)));
    q.set_command_tag(tag_prefix(tag));
    Ok(Response::Query(q))
}

/// The response to `outcome`, its warning (if any) sent first; `fields_of` describes the
/// rows of a result that has columns. `Err` inside: the error to send.
async fn respond<C>(
    client: &mut C,
    outcome: Outcome,
    fields_of: impl FnOnce(&StmtResult) -> Result<Vec<FieldInfo>, GwError>,
) -> PgWireResult<Result<Response, GwError>>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    Ok(match outcome {
        Outcome::Error(e) => Err(e),
        Outcome::Command { tag, warning } => {
            if let Some(w) = warning {
                let notice = NoticeResponse::from(error_info("WARNING", w));
                client
                    .feed(PgWireBackendMessage::NoticeResponse(notice))
                    .await?;
            }
            Ok(Response::Execution(Tag::new(&tag)))
        }
        Outcome::Rows { result, tag } if result.columns.is_empty() => {
            Ok(Response::Execution(Tag::new(&tag)))
        }
        Outcome::Rows { result, tag } => {
            fields_of(&result).and_then(|f| rows_response(f, &tag, &result.rows))
        }
    })
}

impl Connection {
    fn set_status(&self, s: TxStatus) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    fn status(&self) -> TxStatus {
        *self.status.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl NoopStartupHandler for Connection {
    async fn post_startup<C>(
        &self,
        client: &mut C,
        _message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let md = client.metadata();
        info!(
            client = self.client,
            peer = %client.socket_addr(),
            user = md.get("user").map(String::as_str).unwrap_or(""),
            database = md.get("database").map(String::as_str).unwrap_or(""),
            "sql-gateway session started (no authentication: trust)"
        );
        Ok(())
    }
}

impl ErrorHandler for Connection {
    fn on_error<C>(&self, _client: &C, _error: &mut PgWireError)
    where
        C: ClientInfo,
    {
        // Any error fails an open transaction; the session learns of it before its next
        // request (most errors came from the session, which already knows).
        self.session.note_error();
    }
}

#[async_trait]
impl SimpleQueryHandler for Connection {
    /// Replaces pgwire's default so that ReadyForQuery carries the session's own status (a
    /// failed COMMIT ends the transaction although it is an error) and warnings go out.
    async fn on_query<C>(&self, client: &mut C, query: Query) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        for s in split(&query.query) {
            if let Command::Deallocate(Some(name)) = classify(s) {
                client.portal_store().rm_statement(&name);
            }
        }
        let (outcomes, mut status) = self.session.simple(query.query).await;
        if outcomes.is_empty() {
            client
                .feed(PgWireBackendMessage::EmptyQueryResponse(
                    EmptyQueryResponse::new(),
                ))
                .await?;
        }
        for o in outcomes {
            let response = respond(client, o, |r| {
                let types = inferred_types(&r.columns, &r.rows);
                Ok(fields(&r.columns, &types, &Format::UnifiedText))
            })
            .await?;
            match response {
                Ok(Response::Query(q)) => send_query_response(client, q, true).await?,
                Ok(Response::Execution(tag)) => send_execution_response(client, tag).await?,
                Ok(_) => unreachable!("only queries and executions are built above"),
                Err(e) => {
                    // The session fails an open transaction at its own errors: one still
                    // open means a result that could not be encoded.
                    let failed = status == TxStatus::InTransaction;
                    client
                        .feed(PgWireBackendMessage::ErrorResponse(
                            error_info("ERROR", e).into(),
                        ))
                        .await?;
                    if failed {
                        // The statement ran, but its client saw an error.
                        status = self.session.abort().await;
                    }
                    // The session stops at its first error; an encoding error stops here.
                    break;
                }
            }
        }
        self.set_status(status);
        client.set_state(PgWireConnectionState::ReadyForQuery);
        client.set_transaction_status(pg_status(status));
        send_ready_for_query(client, pg_status(status)).await
    }

    async fn do_query<C>(&self, _client: &mut C, _query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        unreachable!("on_query is overridden and never calls do_query")
    }
}

/// Prepares statements for the extended protocol: one describe by the service per `Parse`.
struct Parser {
    session: SessionHandle,
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        self.session
            .prepare(sql.to_string())
            .await
            .0
            .map_err(user_error)
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        // Parameters the client gave no type for are text; SQLite converts by affinity.
        Ok(vec![Type::TEXT; stmt.params])
    }

    fn get_result_schema(
        &self,
        stmt: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let Some(columns) = &stmt.columns else {
            return Ok(Vec::new());
        };
        let format = format.cloned().unwrap_or_default();
        Ok(fields(columns, &described_types(columns), &format))
    }
}

#[async_trait]
impl ExtendedQueryHandler for Connection {
    type Statement = Prepared;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    /// pgwire's execute, then the session's status for the next ReadyForQuery (after an
    /// error pgwire makes an open transaction failed, as the session does).
    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let r = self._on_execute(client, message).await;
        client.set_transaction_status(pg_status(self.status()));
        r
    }

    /// A read whose result columns are not all known before it runs (expressions such as
    /// `count(*)`, or a table its transaction created) runs now, so that its columns
    /// announce the types of its values (`count(*)` as `int8`); its Execute, which follows
    /// at once in what drivers send (libpq's Bind, Describe, Execute), sends the result
    /// kept here. Other portals are described from their statement.
    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        portal: &Portal<Prepared>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let p = &portal.statement.statement;
        // Only a read runs early: a write runs when the client executes it, never because
        // it asked what the result will look like (its undeclared columns are then text).
        let unknown = p.command == Command::Sql
            && reads_only(&p.sql)
            && p.columns
                .as_ref()
                .is_none_or(|cols| cols.iter().any(|c| c.decl_type.is_none()));
        if !unknown {
            let fields = self
                .parser
                .get_result_schema(p, Some(&portal.result_column_format))?;
            return Ok(DescribePortalResponse::new(fields));
        }
        let stmt = bound_statement(portal).map_err(user_error)?;
        let (outcome, status) = self.session.execute(p.command.clone(), stmt).await;
        self.set_status(status);
        let fields = match &outcome {
            Outcome::Error(e) => return Err(user_error(e.clone())),
            Outcome::Rows { result, .. } if !result.columns.is_empty() => {
                let types = inferred_types(&result.columns, &result.rows);
                fields(&result.columns, &types, &portal.result_column_format)
            }
            _ => Vec::new(),
        };
        // No fields: NoData.
        let response = DescribePortalResponse::new(fields.clone());
        *self.described.lock().unwrap_or_else(|e| e.into_inner()) = Some(Described {
            portal: portal_key(portal),
            sql: p.sql.clone(),
            outcome,
            fields,
        });
        Ok(response)
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let p = &portal.statement.statement;
        let ran = {
            let mut d = self.described.lock().unwrap_or_else(|e| e.into_inner());
            match d.take() {
                Some(d) if d.portal == portal_key(portal) && d.sql == p.sql => Some(d),
                _ => None,
            }
        };
        if let Some(d) = ran {
            let fields = d.fields;
            let response = respond(client, d.outcome, |_| Ok(fields)).await?;
            return response.map_err(user_error);
        }
        let stmt = bound_statement(portal).map_err(user_error)?;
        let (outcome, status) = self.session.execute(p.command.clone(), stmt).await;
        self.set_status(status);
        let response = respond(client, outcome, |r| {
            let Some(columns) = &p.columns else {
                return Err(GwError::new(
                    "0A000",
                    "this statement returns rows but could not be described when it was \
                     prepared (it uses a table its transaction created): run it with the \
                     simple query protocol, or after COMMIT",
                ));
            };
            if columns.len() != r.columns.len() {
                return Err(GwError::new(
                    "0A000",
                    "cached plan must not change result type: prepare the statement again",
                ));
            }
            let types = described_types(columns);
            Ok(fields(columns, &types, &portal.result_column_format))
        })
        .await?;
        response.map_err(user_error)
    }
}

/// Whether `sql` surely only reads: a SELECT or VALUES, or a WITH naming no writing
/// statement (conservative: a false answer only costs typed result columns).
fn reads_only(sql: &str) -> bool {
    match redoubt_services::sql::leading_keyword(sql).as_str() {
        "SELECT" | "VALUES" => true,
        "WITH" => {
            let upper = sql.to_ascii_uppercase();
            !["INSERT", "UPDATE", "DELETE", "REPLACE"]
                .iter()
                .any(|w| upper.contains(w))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
