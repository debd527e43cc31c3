//! The Postgres wire front end: accepts connections, enforces the connection limit, and
//! hands each statement to the connection's session.
//!
//! Invariant: this is the only module that imports `pgwire`, and the only one that knows
//! SQLSTATE codes.

mod auth;
mod cancel;
mod copy;
mod copy_fields;
mod copy_in;
mod encode;
mod framing;
mod handler;
mod prepared;
mod respond;
mod sqlstate;
mod startup;
mod tls;

use std::future::Future;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use pgwire::api::{ClientInfo, DefaultClient, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::response::{GssEncResponse, SslResponse, TransactionStatus};
use pgwire::messages::SslNegotiationMetaMessage;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{process_error, process_message, PgWireMessageServerCodec};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::codec::Framed;

use crate::db::Database;

pub use cancel::Cancels;
/// COPY's CSV (or text) lines of a batch's rows, and its header line, which a file sink
/// writes as ENCODE CSV.
pub use copy::{header as copy_header, lines as copy_lines};
/// PostgreSQL's text format of a value, which a `postgres` sink COPYs into its target.
pub use encode::text_value;
pub use handler::Connection;
pub use tls::{opens_with_tls, Stream, Tls};

/// Serves connections on `listener` until `shutdown` completes, offering `tls` to clients
/// that ask for it.
pub async fn serve(
    db: Arc<Database>,
    listener: TcpListener,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(db.config.connections_max));
    let cancels = Arc::new(Cancels::default());
    tokio::pin!(shutdown);
    let mut accept_failing = false;
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (socket, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: keep serving the connections we have,
                // and say so once, not at every retry.
                if !accept_failing {
                    tracing::warn!("accept failed: {e}; retrying every 50 ms");
                    accept_failing = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if std::mem::take(&mut accept_failing) {
            tracing::info!("accepting connections again");
        }
        let _ = socket.set_nodelay(true);
        // A connection that would take the descriptors the server keeps for its own files is
        // refused like one over `connections_max`.
        let permit = match descriptors_short() {
            true => {
                tracing::warn!(%peer, "connection refused: file descriptors are short");
                None
            }
            false => permits.clone().try_acquire_owned().ok(),
        };
        let slot = handler::Slot {
            permit,
            slots: permits.clone(),
        };
        let handlers = Arc::new(Connection::new(
            db.clone(),
            slot,
            (cancels.clone(), tls.as_ref().map(Tls::cert_pem)),
            second_handle(&socket),
        ));
        let limit = db.config.message_bytes_max;
        let startup = std::time::Duration::from_millis(db.config.authentication_timeout_ms);
        let deadline = crate::clock::monotonic() + startup;
        let tls = tls.clone();
        tokio::spawn(async move {
            let served = serve_socket(socket, handlers.clone(), (limit, deadline), tls).await;
            handlers.close().await;
            if let Err(e) = served {
                tracing::debug!(%peer, "connection ended with an error: {e}");
            }
        });
    }
}

/// A second handle on `socket` (a duplicated descriptor), or `None` when the process is out
/// of descriptors; the connection then works, but a client that hangs up during a query is
/// noticed only when the answer is written.
/// Whether a connection (its socket and the second handle on it) would leave fewer file
/// descriptors than the server keeps for itself: RocksDB's files, change logs, checkpoint
/// uploads, the catalog. A quarter of the limit is kept, at least 64; running out in RocksDB
/// stops every actor until a restart, where a refused connection can simply retry.
fn descriptors_short() -> bool {
    let Some(limit) = crate::open_files_limit() else {
        return false;
    };
    let Ok(open) = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64) else {
        return false;
    };
    open + 2 + (limit / 4).max(64) > limit
}

fn second_handle(socket: &tokio::net::TcpStream) -> Option<tokio::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = socket.as_fd().try_clone_to_owned().ok()?;
    let socket = std::net::TcpStream::from(fd);
    socket.set_nonblocking(true).ok()?;
    tokio::net::TcpStream::from_std(socket).ok()
}

/// Serves one client: begins TLS if it opens with a handshake or asks for it (and the server
/// has it), refuses GSS encryption, then hands each message to the connection's handlers until
/// the client leaves. Messages are read through [`framing::Checked`], so one longer than
/// `limit` ends the connection with 54000 before its body is buffered; a message that cannot
/// be decoded ends it with 08P01, as in PostgreSQL. A client that has not finished its startup
/// (TLS, the startup message, its proof) by `deadline` is disconnected, as PostgreSQL's
/// `authentication_timeout` does, so that silent sockets cannot keep connection slots.
async fn serve_socket(
    socket: TcpStream,
    handlers: Arc<Connection>,
    (limit, deadline): (usize, tokio::time::Instant),
    tls: Option<Tls>,
) -> std::io::Result<()> {
    let Some(mut socket) = open(socket, limit, tls.as_ref(), deadline).await? else {
        return Ok(());
    };
    let startup = handlers.startup_handler();
    let queries = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    // While a COPY's data comes: the session's cancel signal, watched between messages.
    let mut copy_cancel = None;
    loop {
        let awaiting_startup = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingSslRequest
                | PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let next = if awaiting_startup {
            match tokio::time::timeout_at(deadline, socket.next()).await {
                Ok(next) => next,
                Err(_) => return Ok(()),
            }
        } else {
            match wait(&mut socket, handlers.backend(), &mut copy_cancel).await {
                Waited::Message(next) => next,
                Waited::Terminated => return terminate(&mut socket, &handlers).await,
                Waited::IdleInTransaction => {
                    let message = "terminating connection due to idle-in-transaction timeout";
                    let kind = crate::error::ErrorKind::IdleInTransactionTimeout;
                    return fatal(&mut socket, kind, message.into()).await;
                }
                Waited::CopyCancelled => {
                    copy_cancel = None;
                    let extended =
                        matches!(socket.state(), PgWireConnectionState::CopyInProgress(true));
                    if let Some(e) = handlers.cancel_copy(&mut socket).await {
                        process_error(&mut socket, e, extended).await?;
                    }
                    continue;
                }
            }
        };
        let message = match next {
            None => return Ok(()),
            Some(Ok(message)) => message,
            Some(Err(e)) => return refuse(&mut socket, e).await,
        };
        match message {
            PgWireFrontendMessage::SslNegotiation(SslNegotiationMetaMessage::PostgresSsl(_)) => {
                socket = match ssl_request(socket, tls.as_ref(), deadline).await? {
                    Some(socket) => socket,
                    None => return Ok(()),
                };
            }
            PgWireFrontendMessage::SslNegotiation(SslNegotiationMetaMessage::PostgresGss(_)) => {
                socket
                    .send(PgWireBackendMessage::GssEncResponse(GssEncResponse::Refuse))
                    .await?;
            }
            PgWireFrontendMessage::SslNegotiation(SslNegotiationMetaMessage::None) => {
                socket.set_state(PgWireConnectionState::AwaitingStartup);
            }
            // The client is leaving.
            PgWireFrontendMessage::Terminate(_) => return Ok(()),
            message => {
                let extended_protocol = match socket.state() {
                    PgWireConnectionState::CopyInProgress(extended) => extended,
                    _ => message.is_extended_query(),
                };
                // A CancelRequest comes on a connection of its own, which ends with it.
                let is_cancel = matches!(message, PgWireFrontendMessage::CancelRequest(_));
                let handled = process_message(
                    message,
                    &mut socket,
                    startup.clone(),
                    queries.clone(),
                    extended.clone(),
                    copy.clone(),
                    cancel.clone(),
                )
                .await;
                if let Err(e) = handled {
                    let fatal = e.is_fatal();
                    process_error(&mut socket, e, extended_protocol).await?;
                    if fatal {
                        return Ok(());
                    }
                }
                if is_cancel {
                    return Ok(());
                }
                if let Some(backend) = handlers.backend() {
                    if backend.terminating() {
                        return terminate(&mut socket, &handlers).await;
                    }
                    watch_session(&socket, &backend, &mut copy_cancel);
                }
            }
        }
    }
}

/// What ended the wait for a client's next message.
enum Waited {
    Message(Option<Result<PgWireFrontendMessage, PgWireError>>),
    /// `pg_terminate_backend` ended the session.
    Terminated,
    /// A CancelRequest came during a `COPY ... FROM STDIN`.
    CopyCancelled,
    /// The session waited in a transaction block past `idle_in_transaction_session_timeout`.
    IdleInTransaction,
}

type Socket<S> = Framed<framing::Checked<tls::Stream>, PgWireMessageServerCodec<S>>;

/// The client's connection, under TLS at once if it opens with a handshake (PostgreSQL 17's
/// direct negotiation) and the server has TLS; `None` once it has ended.
async fn open<S>(
    socket: TcpStream,
    limit: usize,
    tls: Option<&Tls>,
    deadline: tokio::time::Instant,
) -> std::io::Result<Option<Socket<S>>> {
    let client = DefaultClient::new(socket.peer_addr()?, false);
    let direct = match tls {
        Some(_) => match tokio::time::timeout_at(deadline, tls::opens_with_tls(&socket)).await {
            Ok(Ok(Some(direct))) => direct,
            _ => return Ok(None),
        },
        None => false,
    };
    let socket = Framed::new(
        framing::Checked::new(tls::Stream::Plain(socket), limit),
        PgWireMessageServerCodec::new(client),
    );
    let (true, Some(tls)) = (direct, tls) else {
        return Ok(Some(socket));
    };
    let Some(mut socket) = begin_tls(socket, tls, deadline).await? else {
        return Ok(None);
    };
    if !socket.get_ref().get_ref().named_postgresql() {
        fatal(
            &mut socket,
            crate::error::ErrorKind::ProtocolViolation,
            "received direct SSL connection request without ALPN protocol negotiation extension"
                .into(),
        )
        .await?;
        return Ok(None);
    }
    Ok(Some(socket))
}

/// Answers an SSLRequest: `N` without TLS, else `S` and the handshake; one over TLS already
/// ends the connection (08P01). `None` once the connection has ended.
async fn ssl_request<S>(
    mut socket: Socket<S>,
    tls: Option<&Tls>,
    deadline: tokio::time::Instant,
) -> std::io::Result<Option<Socket<S>>> {
    if socket.get_ref().get_ref().is_tls() {
        let message = "SSLRequest over an encrypted connection".to_string();
        fatal(
            &mut socket,
            crate::error::ErrorKind::ProtocolViolation,
            message,
        )
        .await?;
        return Ok(None);
    }
    let Some(tls) = tls else {
        socket
            .send(PgWireBackendMessage::SslResponse(SslResponse::Refuse))
            .await?;
        return Ok(Some(socket));
    };
    socket
        .send(PgWireBackendMessage::SslResponse(SslResponse::Accept))
        .await?;
    begin_tls(socket, tls, deadline).await
}

/// The client's connection under TLS, its handshake done, awaiting the startup message;
/// `None` when the handshake failed or did not end by `deadline`, or the client sent more
/// after its SSLRequest before TLS began (which PostgreSQL refuses too: an attacker in the
/// middle could have put it there).
async fn begin_tls<S>(
    socket: Socket<S>,
    tls: &Tls,
    deadline: tokio::time::Instant,
) -> std::io::Result<Option<Socket<S>>> {
    let parts = socket.into_parts();
    if !parts.read_buf.is_empty() {
        return Ok(None);
    }
    let limit = parts.io.limit();
    let Some(tls::Stream::Plain(tcp)) = parts.io.into_inner() else {
        return Ok(None);
    };
    let stream = match tokio::time::timeout_at(deadline, tls.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!("TLS handshake failed: {e}");
            return Ok(None);
        }
        Err(_) => return Ok(None),
    };
    let mut codec = parts.codec;
    codec.client_info.is_secure = true;
    let mut socket = Framed::new(framing::Checked::new(stream, limit), codec);
    socket.set_state(PgWireConnectionState::AwaitingStartup);
    Ok(Some(socket))
}

/// Ends the connection with a FATAL error of `kind`.
async fn fatal<S>(
    socket: &mut Socket<S>,
    kind: crate::error::ErrorKind,
    message: String,
) -> std::io::Result<()> {
    let info = ErrorInfo::new("FATAL".into(), sqlstate::sqlstate(kind).into(), message);
    socket
        .send(PgWireBackendMessage::ErrorResponse(info.into()))
        .await?;
    socket.close().await
}

/// Waits for the client's next message, the session's end, or a cancel of its COPY.
async fn wait<S>(
    socket: &mut Socket<S>,
    backend: Option<Arc<crate::sql::Backend>>,
    copy_cancel: &mut Option<std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>>,
) -> Waited {
    let Some(backend) = backend else {
        return Waited::Message(socket.next().await);
    };
    let copy_cancelled = async {
        match copy_cancel.as_mut() {
            Some(cancelled) => cancelled.as_mut().await,
            None => std::future::pending().await,
        }
    };
    // Only between statements, in a block (PostgreSQL's `idle in transaction`).
    let in_block = matches!(
        socket.transaction_status(),
        TransactionStatus::Transaction | TransactionStatus::Error
    );
    let idle_limit = match socket.state() {
        PgWireConnectionState::ReadyForQuery if in_block => backend.idle_in_transaction_timeout(),
        _ => None,
    };
    let idle_too_long = async {
        match idle_limit {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        _ = backend.terminated() => Waited::Terminated,
        _ = copy_cancelled => Waited::CopyCancelled,
        _ = idle_too_long => Waited::IdleInTransaction,
        next = socket.next() => Waited::Message(next),
    }
}

/// After a message: what `pg_stat_activity` shows of the session once it waits for its
/// client, and, while a COPY's data comes, its cancel signal watched (from now, so that a
/// cancel between two messages is not missed).
fn watch_session<S>(
    socket: &Socket<S>,
    backend: &Arc<crate::sql::Backend>,
    copy_cancel: &mut Option<std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>>,
) {
    match socket.state() {
        PgWireConnectionState::CopyInProgress(_) => {
            if copy_cancel.is_none() {
                let mut cancelled = Box::pin(backend.cancel.clone().notified_owned());
                cancelled.as_mut().enable();
                *copy_cancel = Some(cancelled);
            }
        }
        state => {
            *copy_cancel = None;
            // After a COPY (whose ReadyForQuery pgwire sends): the Query and Sync handlers
            // record it before their ReadyForQuery.
            if matches!(state, PgWireConnectionState::ReadyForQuery) {
                backend.waiting(handler::waiting_state(socket.transaction_status()));
            }
        }
    }
}

/// Ends a session `pg_terminate_backend` terminated: its client is told with 57P01 (unless
/// its stopped statement already told it), and the connection closes.
async fn terminate<S>(socket: &mut Socket<S>, handlers: &Connection) -> std::io::Result<()> {
    if handlers.backend().is_some_and(|b| b.tell_terminated()) {
        let e = crate::session::terminated();
        let info = ErrorInfo::new("FATAL".into(), sqlstate::sqlstate(e.kind).into(), e.message);
        socket
            .send(PgWireBackendMessage::ErrorResponse(info.into()))
            .await?;
    }
    socket.close().await
}

/// Answers a message that could not be read with a FATAL error, and ends the connection.
async fn refuse<S>(socket: &mut Socket<S>, error: PgWireError) -> std::io::Result<()> {
    use crate::error::ErrorKind;
    let (kind, message) = match &error {
        PgWireError::IoError(e) => match e.get_ref().and_then(|e| e.downcast_ref()) {
            Some(v @ framing::Violation::TooLong { .. }) => {
                (ErrorKind::ProgramLimitExceeded, v.to_string())
            }
            Some(v) => (ErrorKind::ProtocolViolation, v.to_string()),
            // The connection itself failed: nobody to answer.
            None => return Ok(()),
        },
        e => (
            ErrorKind::ProtocolViolation,
            format!("invalid message: {e}"),
        ),
    };
    fatal(socket, kind, message).await
}
