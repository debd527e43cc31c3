//! What stops a session's statement before its own end: a cancel (a CancelRequest,
//! `pg_cancel_backend`), `pg_terminate_backend`, `statement_timeout`, or the client hanging
//! up. See `docs/design/0018-session-control.md`.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;

use super::settings::parse_timeout;
use crate::db::RowStream;
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{Backend, Settings};

/// What stops a session's running query before it ends, besides `statement_timeout`.
pub struct Interrupts {
    /// The session as the server's registry has it: its cancel signal (a CancelRequest,
    /// `pg_cancel_backend`), and whether `pg_terminate_backend` ended it.
    pub backend: Arc<Backend>,
    /// A second handle on the client's socket, watched for the client hanging up.
    pub socket: Option<Arc<tokio::net::TcpStream>>,
}

impl Interrupts {
    /// Completes when the client has closed its connection (or the socket failed).
    fn hung_up(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let socket = self.socket.clone();
        async move {
            let Some(socket) = socket else {
                return std::future::pending().await;
            };
            loop {
                match socket.ready(tokio::io::Interest::READABLE).await {
                    Ok(ready) if !ready.is_read_closed() => {
                        // The client sent its next message before this answer: that is not
                        // a hang-up. Forget this readiness and wait for the next change.
                        let _ = socket.try_io(tokio::io::Interest::READABLE, || {
                            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
                        });
                    }
                    Ok(_) | Err(_) => return,
                }
            }
        }
    }
}

fn cancelled_by_user() -> Error {
    Error::new(
        ErrorKind::QueryCanceled,
        "canceling statement due to user request",
    )
}

/// What a session `pg_terminate_backend` ended reports, as PostgreSQL does (sent as FATAL).
pub fn terminated() -> Error {
    Error::new(
        ErrorKind::AdminShutdown,
        "terminating connection due to administrator command",
    )
}

fn hung_up_error() -> Error {
    Error::new(
        ErrorKind::QueryCanceled,
        "canceling statement: the client closed its connection",
    )
}

fn cancelled_by_timeout() -> Error {
    Error::new(
        ErrorKind::QueryCanceled,
        "canceling statement due to statement timeout",
    )
}

/// What stops a statement besides its own end: see [`Stops::new`].
pub(super) struct Stops {
    backend: Arc<Backend>,
    cancelled: std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    hung_up: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl Stops {
    /// What stops the session's statement from now on: a cancel, its termination, its
    /// `statement_timeout`, its client hanging up. Watched from the moment this is called,
    /// so that a cancel is seen even while nothing waits for it (between two batches of rows).
    pub(super) fn new(settings: &Settings, interrupts: &Interrupts) -> Result<Stops> {
        let timeout = settings
            .get("statement_timeout")
            .map(|v| parse_timeout("statement_timeout", v))
            .transpose()?
            .unwrap_or_default();
        let backend = interrupts.backend.clone();
        let mut cancelled = Box::pin(backend.cancel.clone().notified_owned());
        cancelled.as_mut().enable();
        Ok(Stops {
            backend,
            cancelled,
            deadline: (!timeout.is_zero()).then(|| Box::pin(tokio::time::sleep(timeout))),
            hung_up: Box::pin(interrupts.hung_up()),
        })
    }

    /// Completes with the error a statement stopped then reports: given to what can be
    /// stopped midway without leaving anything behind (a view's backfill).
    pub(super) async fn stopped(mut self) -> Error {
        std::future::poll_fn(|cx| self.poll(cx)).await
    }

    /// Ready with the statement's error once one of the stops has happened.
    pub(super) fn poll(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Error> {
        use std::future::Future;
        use std::task::Poll;
        if self.cancelled.as_mut().poll(cx).is_ready() {
            if self.backend.terminating() {
                self.backend.tell_terminated();
                return Poll::Ready(terminated());
            }
            return Poll::Ready(cancelled_by_user());
        }
        if (self.deadline.as_mut()).is_some_and(|d| d.as_mut().poll(cx).is_ready()) {
            return Poll::Ready(cancelled_by_timeout());
        }
        if self.hung_up.as_mut().poll(cx).is_ready() {
            return Poll::Ready(hung_up_error());
        }
        Poll::Pending
    }
}

/// A query's rows, ended with 57014 when the session's query is cancelled, its
/// `statement_timeout` passes or its client hangs up while they are computed or sent (57P01
/// when the session is terminated).
pub(super) struct Interruptible {
    rows: RowStream,
    stops: Stops,
    done: bool,
}

impl Interruptible {
    pub(super) fn new(rows: RowStream, stops: Stops) -> Interruptible {
        Interruptible {
            rows,
            stops,
            done: false,
        }
    }
}

impl futures::Stream for Interruptible {
    type Item = Result<RecordBatch>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(e) = this.stops.poll(cx) {
            this.done = true;
            return Poll::Ready(Some(Err(e)));
        }
        let next = this.rows.as_mut().poll_next(cx);
        if matches!(next, Poll::Ready(None)) {
            this.done = true;
        }
        next
    }
}
