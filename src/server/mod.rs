//! The Postgres wire front end: accepts connections, enforces the connection limit, and
//! hands each statement to the connection's session.
//!
//! Invariant: this is the only module that imports `pgwire`, and the only one that knows
//! SQLSTATE codes.

mod encode;
mod handler;
mod sqlstate;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::db::Database;

pub use handler::{Cancels, Connection};

/// Serves connections on `listener` until `shutdown` completes.
pub async fn serve(db: Arc<Database>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let permits = Arc::new(Semaphore::new(db.config.connections_max));
    let cancels = Arc::new(Cancels::default());
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (socket, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: keep serving the connections we have.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let permit = permits.clone().try_acquire_owned().ok();
        let handlers = Arc::new(Connection::new(
            db.clone(),
            permit,
            cancels.clone(),
            second_handle(&socket),
        ));
        tokio::spawn(async move {
            if let Err(e) = pgwire::tokio::process_socket(socket, None, handlers).await {
                tracing::debug!(%peer, "connection ended with an error: {e}");
            }
        });
    }
}

/// A second handle on `socket` (a duplicated descriptor), or `None` when the process is out
/// of descriptors; the connection then works, but a client that hangs up during a query is
/// noticed only when the answer is written.
fn second_handle(socket: &tokio::net::TcpStream) -> Option<tokio::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = socket.as_fd().try_clone_to_owned().ok()?;
    let socket = std::net::TcpStream::from(fd);
    socket.set_nonblocking(true).ok()?;
    tokio::net::TcpStream::from_std(socket).ok()
}
