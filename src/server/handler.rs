//! pgwire handlers for one connection: startup, the simple and the extended query protocol.

use std::fmt::Debug;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::ParamValues;
use futures::{FutureExt, Sink, SinkExt};
use pgwire::api::auth::StartupHandler;
use pgwire::api::cancel::CancelHandler;
use pgwire::api::copy::send_copy_in_response;
use pgwire::api::portal::{Format, Portal, PortalExecutionState};
use pgwire::api::query::{
    send_describe_response, send_execution_response, send_ready_for_query, ExtendedQueryHandler,
    SimpleQueryHandler,
};
use pgwire::api::results::{DescribePortalResponse, DescribeStatementResponse, Response, Tag};
use pgwire::api::stmt::StoredStatement;
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{
    ClientInfo, ClientPortalStore, PgWireConnectionState, PgWireServerHandlers, Type, DEFAULT_NAME,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::data::{ParameterDescription, RowDescription};
use pgwire::messages::extendedquery::{
    Describe, Execute, PortalSuspended, Sync as SyncMessage, TARGET_TYPE_BYTE_PORTAL,
    TARGET_TYPE_BYTE_STATEMENT,
};
use pgwire::messages::response::{EmptyQueryResponse, TransactionStatus};
use pgwire::messages::simplequery::Query;
use pgwire::messages::PgWireBackendMessage;
use tokio::sync::{Mutex, OwnedSemaphorePermit};

use super::cancel::{Canceller, Cancels};
use super::copy::send as send_copy;
use super::copy_in::{Copies, CopyIn};
use super::prepared::{bind_parameters, Prepared, StatementParser};
use super::respond::{field_infos, pg_type, send_rows, to_response, Sent};
use super::sqlstate::sqlstate;
use super::startup::Startup;
use crate::db::{Database, Output};
use crate::error::{Error, ErrorKind, Result};
use crate::session::{copy_header_lines, BlockState, Session};
use crate::sql::{parse_message, Backend, BackendState, Parsed, Registered};

/// The handlers of one connection, holding its session.
pub struct Connection {
    db: Arc<Database>,
    cancels: Arc<Cancels>,
    /// The server's certificate chain when it has TLS (SCRAM's channel binding).
    cert_pem: Option<Arc<Vec<u8>>>,
    /// The session's place in the registry of sessions, once started.
    backend: Arc<std::sync::Mutex<Option<Registered>>>,
    /// The connection's place under the connection limit.
    slot: Slot,
    session: Arc<Mutex<Option<Session>>>,
    parser: Arc<StatementParser>,
    /// A second handle on the client's socket, until the session takes it.
    socket: Arc<std::sync::Mutex<Option<tokio::net::TcpStream>>>,
    /// The `COPY ... FROM STDIN` whose data the client is sending, if any.
    copying: Arc<std::sync::Mutex<Option<CopyIn>>>,
}

/// A connection's place under `connections_max`.
pub struct Slot {
    /// `None` when the connection is over the limit: it is refused at startup.
    pub permit: Option<OwnedSemaphorePermit>,
    /// Every connection's places, of which the free ones tell whether a connection that is
    /// not a superuser's may take one of the last.
    pub slots: Arc<tokio::sync::Semaphore>,
}

impl Connection {
    /// The handlers of a connection on a socket of which `socket` is a second handle (for
    /// noticing that the client hangs up while a query runs).
    pub fn new(
        db: Arc<Database>,
        slot: Slot,
        (cancels, cert_pem): (Arc<Cancels>, Option<Arc<Vec<u8>>>),
        socket: Option<tokio::net::TcpStream>,
    ) -> Connection {
        let session = Arc::new(Mutex::new(None));
        Connection {
            parser: Arc::new(StatementParser {
                session: session.clone(),
                db: db.clone(),
            }),
            db,
            cancels,
            cert_pem,
            backend: Arc::new(std::sync::Mutex::new(None)),
            slot,
            session,
            socket: Arc::new(std::sync::Mutex::new(socket)),
            copying: Arc::new(std::sync::Mutex::new(None)),
        }
    }
}

impl Connection {
    /// Ends the session once its client has gone: a transaction block it left open is rolled
    /// back, its DDL undone, before anything else can trip over it.
    pub async fn close(&self) {
        let session = self.session.lock().await.take();
        if let Some(mut session) = session {
            session.close().await;
        }
    }
}

impl Connection {
    fn queries(&self) -> Queries {
        Queries {
            session: self.session.clone(),
            db: self.db.clone(),
            parser: self.parser.clone(),
            copying: self.copying.clone(),
            backend: self.backend.clone(),
        }
    }

    fn copies(&self) -> Copies {
        Copies {
            session: self.session.clone(),
            copying: self.copying.clone(),
        }
    }

    /// The session's entry in the registry of sessions, once it has started.
    pub(super) fn backend(&self) -> Option<Arc<Backend>> {
        registered(&self.backend)
    }

    /// A CancelRequest came while the client sends a `COPY ... FROM STDIN`'s data: the COPY
    /// ends with 57014, nothing of it applied, and the session's block fails with it. `None`
    /// when no COPY was in progress.
    pub(super) async fn cancel_copy<C: ClientInfo>(&self, client: &mut C) -> Option<PgWireError> {
        let copies = self.copies();
        let copy = copies.take()?;
        Some(copies.failed(client, copy.cancelled()).await)
    }
}

/// What `pg_stat_activity` shows of a session waiting for its client, its block in `status`.
pub(super) fn waiting_state(status: TransactionStatus) -> BackendState {
    match status {
        TransactionStatus::Idle => BackendState::Idle,
        TransactionStatus::Transaction => BackendState::IdleInTransaction,
        TransactionStatus::Error => BackendState::IdleInFailedTransaction,
    }
}

fn registered(slot: &std::sync::Mutex<Option<Registered>>) -> Option<Arc<Backend>> {
    let slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    slot.as_ref().map(|r| r.0.clone())
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(backend) = self.backend() {
            self.cancels.remove(backend.start.pid);
        }
    }
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        Arc::new(self.queries())
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        Arc::new(self.queries())
    }

    fn copy_handler(&self) -> Arc<impl pgwire::api::copy::CopyHandler> {
        Arc::new(self.copies())
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        Arc::new(Startup {
            admitted: self.slot.permit.is_some(),
            slots: self.slot.slots.clone(),
            proof: Arc::default(),
            session: self.session.clone(),
            db: self.db.clone(),
            cancels: self.cancels.clone(),
            cert_pem: self.cert_pem.clone(),
            backend: self.backend.clone(),
            socket: self.socket.clone(),
        })
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(Canceller {
            cancels: self.cancels.clone(),
        })
    }
}

/// Refuses statements over the configured size before parsing them.
pub(super) fn check_size(db: &Database, sql: &str) -> Result<()> {
    let max = db.config.statement_bytes_max;
    if sql.len() > max {
        return Err(Error::new(
            ErrorKind::ProgramLimitExceeded,
            format!("statement is longer than {max} bytes"),
        ));
    }
    Ok(())
}

pub(super) fn no_session() -> PgWireError {
    to_pgwire(Error::internal("query before startup completed"))
}

pub fn to_pgwire(e: Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

fn error_info(e: Error) -> ErrorInfo {
    // A terminated session's error ends its connection.
    let severity = match e.kind {
        ErrorKind::AdminShutdown => "FATAL",
        _ => "ERROR",
    };
    let mut info = ErrorInfo::new(severity.into(), sqlstate(e.kind).into(), e.message);
    info.detail = e.detail;
    info.hint = e.hint;
    info.position = e.position.map(|p| p.to_string());
    info.where_context = e.context;
    info
}

struct Queries {
    session: Arc<Mutex<Option<Session>>>,
    db: Arc<Database>,
    parser: Arc<StatementParser>,
    copying: Arc<std::sync::Mutex<Option<CopyIn>>>,
    /// The session's entry in the registry of sessions: what it is running.
    backend: Arc<std::sync::Mutex<Option<Registered>>>,
}

impl Queries {
    /// The session starts running `text` (a Query message's, or an Execute's statement).
    fn running(&self, text: &str) {
        if let Some(backend) = registered(&self.backend) {
            backend.running(text);
        }
    }

    /// The session is about to wait for its client (ReadyForQuery), its block in `status`.
    fn waiting(&self, status: TransactionStatus) {
        if let Some(backend) = registered(&self.backend) {
            backend.waiting(waiting_state(status));
        }
    }

    /// Where the session's transaction block stands, for ReadyForQuery.
    async fn status(&self) -> TransactionStatus {
        match self.session.lock().await.as_ref().map(Session::block_state) {
            Some(BlockState::Open) => TransactionStatus::Transaction,
            Some(BlockState::Failed) => TransactionStatus::Error,
            Some(BlockState::Idle) | None => TransactionStatus::Idle,
        }
    }

    /// A statement failed outside `Session::execute` (its rows, or before it could run): the
    /// session's block, if open, fails with it.
    async fn fail(&self) {
        if let Some(session) = self.session.lock().await.as_mut() {
            session.fail();
        }
    }

    /// An Execute failed: the session's block with it, and the client told the block's state.
    async fn failed<C: ClientInfo>(&self, client: &mut C, e: PgWireError) -> PgWireError {
        self.fail().await;
        client.set_transaction_status(self.status().await);
        e
    }

    /// Sends a started portal's next rows (at most `max_rows`, or all if 0), then
    /// CommandComplete when the portal is through or PortalSuspended when it is not.
    async fn fetch<C>(
        &self,
        client: &mut C,
        state: &Mutex<PortalExecutionState>,
        max_rows: usize,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut state = state.lock().await;
        let sent = match &mut *state {
            PortalExecutionState::Suspended(results) => {
                let command_tag = results.command_tag.clone();
                send_rows(client, results, max_rows)
                    .await
                    .map(|sent| (command_tag, sent))
            }
            // A portal run to its end: no more rows.
            PortalExecutionState::Finished => Ok(("SELECT".to_string(), Sent::All(0))),
            PortalExecutionState::Initial => {
                return Err(PgWireError::ApiError("a portal that never started".into()))
            }
        };
        match sent {
            Ok((tag, Sent::All(rows))) => {
                *state = PortalExecutionState::Finished;
                let tag = Tag::new(&tag).with_rows(rows);
                client
                    .feed(PgWireBackendMessage::CommandComplete(tag.into()))
                    .await?;
            }
            Ok((_, Sent::Part)) => {
                client
                    .feed(PgWireBackendMessage::PortalSuspended(PortalSuspended::new()))
                    .await?;
            }
            Ok((_, Sent::Failed(info))) => {
                *state = PortalExecutionState::Finished;
                return Err(self.failed(client, PgWireError::UserError(info)).await);
            }
            Err(e) => {
                *state = PortalExecutionState::Finished;
                return Err(self.failed(client, e).await);
            }
        }
        Ok(())
    }

    /// A statement's output as a response; a `COPY ... FROM STDIN` becomes the connection's
    /// COPY in progress, whose data the client is asked for.
    fn respond(&self, output: Output, formats: Option<&Format>) -> Result<Response> {
        match output {
            Output::CopyIn(from) => {
                let copy =
                    CopyIn::new(*from, self.db.config.message_bytes_max, self.db.temp_disk());
                let response = copy.response();
                *self.copying.lock().unwrap_or_else(|p| p.into_inner()) = Some(copy);
                Ok(Response::CopyIn(response))
            }
            output => to_response(output, formats),
        }
    }

    /// Runs one statement of a Query message (`last`: its last): the response, and how
    /// many header lines it sends if it is a `COPY ... TO STDOUT`.
    async fn statement(
        &self,
        pending: crate::sql::Pending,
        message: &str,
        last: bool,
    ) -> (Result<Response>, usize) {
        let parsed = match pending.parsed(message) {
            Ok(parsed) => parsed,
            Err(e) => return (Err(e), 0),
        };
        let header = copy_header_lines(&parsed.statement);
        let response = self
            .run(&parsed, None)
            .await
            .and_then(|o| self.respond(o, None));
        match response {
            // Its data comes in the messages after this one, which the statements after it
            // would have to wait for.
            Ok(Response::CopyIn(_)) if !last => {
                self.copying
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                let e = Error::not_supported(
                    "COPY ... FROM STDIN must be the last statement of its query",
                )
                .with_hint("Send the statements after it in a query of their own.");
                (Err(e), header)
            }
            other => (other, header),
        }
    }

    /// Runs one statement, turning a panic into an internal error so that the connection
    /// (and the server) go on.
    async fn run(&self, parsed: &Parsed, params: Option<&ParamValues>) -> Result<Output> {
        let mut guard = self.session.lock().await;
        let session = guard
            .as_mut()
            .ok_or_else(|| Error::internal("no session"))?;
        match AssertUnwindSafe(session.execute(parsed, params))
            .catch_unwind()
            .await
        {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                tracing::error!(statement = %parsed.text, "statement panicked: {msg}");
                session.fail();
                Err(Error::internal(format!("internal error: {msg}")))
            }
        }
    }
}

#[async_trait]
impl SimpleQueryHandler for Queries {
    /// Runs a Query message's statements in turn, each one's result sent (and flushed) before
    /// the next runs, as PostgreSQL does: a message of many statements never holds more than
    /// one result, and its client sees each as it comes. The first error ends the message.
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
        self.running(&query.query);
        match check_size(&self.db, &query.query).and_then(|_| parse_message(&query.query)) {
            Err(e) => {
                client
                    .feed(PgWireBackendMessage::ErrorResponse(error_info(e).into()))
                    .await?;
                self.fail().await;
            }
            // Nothing but blanks, semicolons and comments.
            Ok(statements) if statements.is_empty() => {
                client
                    .feed(PgWireBackendMessage::EmptyQueryResponse(
                        EmptyQueryResponse::new(),
                    ))
                    .await?;
            }
            Ok(statements) => {
                let count = statements.len();
                for (i, pending) in statements.into_iter().enumerate() {
                    let (response, header) =
                        self.statement(pending, &query.query, i + 1 == count).await;
                    match response {
                        Ok(Response::Query(mut results)) => {
                            client
                                .feed(PgWireBackendMessage::RowDescription(RowDescription::new(
                                    results.row_schema.iter().map(Into::into).collect(),
                                )))
                                .await?;
                            match send_rows(client, &mut results, 0).await? {
                                Sent::All(rows) => {
                                    let tag = Tag::new(&results.command_tag).with_rows(rows);
                                    client
                                        .feed(PgWireBackendMessage::CommandComplete(tag.into()))
                                        .await?;
                                }
                                Sent::Part => {
                                    return Err(PgWireError::ApiError(
                                        "rows without a limit stopped short".into(),
                                    ))
                                }
                                Sent::Failed(info) => {
                                    client
                                        .feed(PgWireBackendMessage::ErrorResponse((*info).into()))
                                        .await?;
                                    self.fail().await;
                                    break;
                                }
                            }
                        }
                        Ok(Response::CopyOut(copy)) => {
                            if let Some(info) = send_copy(client, copy, header).await? {
                                client
                                    .feed(PgWireBackendMessage::ErrorResponse((*info).into()))
                                    .await?;
                                self.fail().await;
                                break;
                            }
                        }
                        Ok(Response::CopyIn(copy)) => {
                            // The client sends the data now; CopyDone ends the query.
                            send_copy_in_response(client, copy).await?;
                            client.set_state(PgWireConnectionState::CopyInProgress(false));
                            return Ok(());
                        }
                        Ok(Response::TransactionStart(tag)) => {
                            send_execution_response(client, tag).await?;
                        }
                        Ok(Response::TransactionEnd(tag)) => {
                            send_execution_response(client, tag).await?;
                        }
                        Ok(Response::Execution(tag)) => {
                            send_execution_response(client, tag).await?;
                        }
                        Ok(_) => {
                            return Err(PgWireError::ApiError(
                                "a statement answered with a response the simple query \
                                 protocol does not send"
                                    .into(),
                            ))
                        }
                        Err(e) => {
                            client
                                .feed(PgWireBackendMessage::ErrorResponse(error_info(e).into()))
                                .await?;
                            self.fail().await;
                            break;
                        }
                    }
                    client.flush().await?;
                }
            }
        }
        let status = self.status().await;
        client.set_state(PgWireConnectionState::ReadyForQuery);
        client.set_transaction_status(status);
        self.waiting(status);
        send_ready_for_query(client, status).await
    }

    /// Never called: `on_query`, which pgwire calls for a Query message, runs and answers
    /// each statement itself.
    async fn do_query<C>(&self, _client: &mut C, _query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        Err(PgWireError::ApiError(
            "a Query message is answered by on_query, statement by statement".into(),
        ))
    }
}

#[async_trait]
impl ExtendedQueryHandler for Queries {
    type Statement = Prepared;
    type QueryParser = StatementParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    /// Sync: the unnamed portal goes, and the client is told the session waits for it (as
    /// pgwire does), once `pg_stat_activity` shows it waiting.
    async fn on_sync<C>(&self, client: &mut C, _message: SyncMessage) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        client.portal_store().rm_portal(DEFAULT_NAME);
        self.waiting(client.transaction_status());
        send_ready_for_query(client, client.transaction_status()).await
    }

    /// Describes a statement or portal as pgwire does, and also a cursor DECLAREd in SQL as
    /// the portal it is in PostgreSQL (psycopg describes its server-side cursors so).
    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        if message.target_type == TARGET_TYPE_BYTE_PORTAL
            && client.portal_store().get_portal(name).is_none()
        {
            let guard = self.session.lock().await;
            let cursor = guard.as_ref().and_then(|s| s.cursor_schema(name));
            drop(guard);
            if let Some(schema) = cursor {
                let response = DescribePortalResponse::new(field_infos(&schema, None));
                return send_describe_response(client, &response).await;
            }
        }
        // A statement without result columns is described with NoData after its parameters,
        // as PostgreSQL does (pgwire sends an empty RowDescription when there are parameters,
        // which pgJDBC reads as a result: `executeBatch` then counts 0 rows).
        if message.target_type == TARGET_TYPE_BYTE_STATEMENT {
            if let Some(Entry::Value(stmt)) = client.portal_store().get_statement(name) {
                let response = self.do_describe_statement(client, &stmt).await?;
                if response.fields.is_empty() {
                    let oids = response.parameters.iter().map(|t| t.oid()).collect();
                    client
                        .send(PgWireBackendMessage::ParameterDescription(
                            ParameterDescription::new(oids),
                        ))
                        .await?;
                    let no_data = DescribePortalResponse::new(vec![]);
                    return send_describe_response(client, &no_data).await;
                }
                return send_describe_response(client, &response).await;
            }
        }
        self._on_describe(client, message).await
    }

    /// Executes a portal as pgwire does, except that rows go to the client as they are
    /// produced, never gathered first: pgwire collects up to the row limit (every row when
    /// there is none) before sending, and reserves room for the limit. A row limit of 0 or
    /// less means every row, as in PostgreSQL; after a limit's rows the portal is suspended,
    /// and the next Execute continues it.
    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        let max_rows = usize::try_from(message.max_rows).unwrap_or(0);
        let portal = match client.portal_store().get_portal(name) {
            Some(Entry::Value(portal)) => portal,
            Some(Entry::Empty) => {
                client
                    .feed(PgWireBackendMessage::EmptyQueryResponse(
                        EmptyQueryResponse::new(),
                    ))
                    .await?;
                client.set_state(PgWireConnectionState::ReadyForQuery);
                return Ok(());
            }
            None => return Err(PgWireError::PortalNotFound(name.to_owned())),
        };
        if let Some(parsed) = &portal.statement.statement.parsed {
            self.running(&parsed.text);
        }
        let state = portal.state();
        let started = !matches!(*state.lock().await, PortalExecutionState::Initial);
        let mut fetch = started;
        if !started {
            let response =
                match ExtendedQueryHandler::do_query(self, client, portal.as_ref(), max_rows).await
                {
                    Ok(response) => response,
                    Err(e) => {
                        return Err(self.failed(client, e).await);
                    }
                };
            match response {
                Response::Query(results) => {
                    portal.start(results).await;
                    fetch = true;
                }
                Response::EmptyQuery => {
                    client
                        .feed(PgWireBackendMessage::EmptyQueryResponse(
                            EmptyQueryResponse::new(),
                        ))
                        .await?;
                }
                Response::Execution(tag) => send_execution_response(client, tag).await?,
                Response::CopyOut(copy) => {
                    let parsed = portal.statement.statement.parsed.as_ref();
                    let header = parsed.map_or(0, |p| copy_header_lines(&p.statement));
                    if let Some(info) = send_copy(client, copy, header).await? {
                        return Err(self.failed(client, PgWireError::UserError(info)).await);
                    }
                }
                Response::CopyIn(copy) => {
                    // The client sends the data now; CopyDone completes the Execute.
                    client.set_state(PgWireConnectionState::CopyInProgress(true));
                    send_copy_in_response(client, copy).await?;
                    return Ok(());
                }
                Response::TransactionStart(tag) => {
                    send_execution_response(client, tag).await?;
                }
                Response::TransactionEnd(tag) => {
                    send_execution_response(client, tag).await?;
                    client.portal_store().rm_portal(DEFAULT_NAME);
                }
                _ => {
                    return Err(PgWireError::ApiError(
                        "a statement answered with a response Weir does not send".into(),
                    ))
                }
            }
        }
        if fetch {
            self.fetch(client, &state, max_rows).await?;
        }
        client.set_state(PgWireConnectionState::ReadyForQuery);
        client.set_transaction_status(self.status().await);
        Ok(())
    }

    async fn do_query<C>(
        &self,
        _client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let prepared = &portal.statement.statement;
        let Some(parsed) = &prepared.parsed else {
            return Ok(Response::EmptyQuery);
        };
        let params = bind_parameters(portal).map_err(to_pgwire)?;
        let output = self.run(parsed, params.as_ref()).await.map_err(to_pgwire)?;
        self.respond(output, Some(&portal.result_column_format))
            .map_err(to_pgwire)
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        target: &StoredStatement<Prepared>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let stmt = &target.statement;
        let params = (0..stmt.parameters.len().max(target.parameter_types.len()))
            .map(|i| {
                target
                    .parameter_types
                    .get(i)
                    .cloned()
                    .flatten()
                    .filter(|t| *t != Type::UNKNOWN)
                    .or_else(|| stmt.parameters.get(i).map(pg_type))
                    .unwrap_or(Type::TEXT)
            })
            .collect();
        Ok(DescribeStatementResponse::new(params, stmt.fields(None)))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        target: &Portal<Prepared>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let fields = target
            .statement
            .statement
            .fields(Some(&target.result_column_format));
        Ok(DescribePortalResponse::new(fields))
    }
}
