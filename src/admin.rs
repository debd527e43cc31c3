//! The admin HTTP port (`admin_listen`): for operators and other systems, not SQL clients.
//!
//! - `POST /api/v1/checkpoints` takes a checkpoint and answers once it is complete:
//!   `{"id": .., "epoch": ..}`, or status 500 with `{"error": ..}`. With `?label=...` the
//!   checkpoint is an external one carrying that label (how another system triggers one).
//! - `GET /api/v1/checkpoints`: the checkpoints, newest first, as JSON.
//! - `GET /metrics`: Prometheus' text format.
//!
//! One request per connection; HTTP/1.1 with `Connection: close`, or HTTPS with the SQL port's
//! certificate when the config has `[tls]` (plain HTTP is then refused if TLS is required).
//!
//! Every request proves who sends it (`docs/design/0019-authentication.md`): the config's
//! `admin_token` as `Authorization: Bearer ...` may do everything, its `admin_read_token` may
//! read (GET); `Authorization: Basic` with a role's name and password, checked as the SQL
//! port's `[[auth]]` rules would check that role from that address, may do everything for a
//! superuser and read for another role. A request without credentials is the bootstrap
//! superuser's, admitted only where the rules trust it without a password (the default:
//! loopback, while it has none). Otherwise 401; a reader asking to change something, 403.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::checkpoint::Kind;
use crate::config::AuthMethod;
use crate::db::Database;
use crate::server::Tls;

/// Request heads longer than this are refused.
const HEAD_BYTES_MAX: usize = 16 * 1024;

pub async fn serve(
    db: Arc<Database>,
    listener: TcpListener,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((socket, peer)) => {
                let db = db.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    if let Err(e) = accept(db, socket, peer.ip(), tls).await {
                        tracing::debug!("admin request failed: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("admin accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn json(status: u16, value: serde_json::Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: value.to_string(),
        }
    }

    fn error(status: u16, message: &str) -> Response {
        Response::json(status, serde_json::json!({ "error": message }))
    }
}

/// How long a client has to send its request head.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves one connection, over TLS if it opens with a handshake and the server has TLS.
async fn accept(
    db: Arc<Database>,
    socket: TcpStream,
    peer: IpAddr,
    tls: Option<Tls>,
) -> std::io::Result<()> {
    let deadline = crate::clock::monotonic() + REQUEST_TIMEOUT;
    let Some(tls) = tls else {
        let request = Request { peer, tls: false };
        return handle(&db, socket, request, deadline).await;
    };
    let opens = tokio::time::timeout_at(deadline, crate::server::opens_with_tls(&socket)).await;
    match opens {
        Ok(Ok(Some(true))) => {
            let Ok(Ok(stream)) = tokio::time::timeout_at(deadline, tls.accept_http(socket)).await
            else {
                return Ok(());
            };
            handle(&db, stream, Request { peer, tls: true }, deadline).await
        }
        Ok(Ok(Some(false))) if tls.required() => {
            let refused = Response::error(403, "TLS is required: use https");
            respond(socket, refused).await
        }
        Ok(Ok(Some(false))) => handle(&db, socket, Request { peer, tls: false }, deadline).await,
        _ => Ok(()),
    }
}

/// Where a request comes from.
#[derive(Clone, Copy)]
struct Request {
    peer: IpAddr,
    tls: bool,
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    db: &Database,
    mut socket: S,
    request: Request,
    deadline: tokio::time::Instant,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let response = loop {
        let n = match tokio::time::timeout_at(deadline, socket.read(&mut buf)).await {
            Ok(read) => read?,
            Err(_) => return Ok(()),
        };
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end);
            let head = String::from_utf8_lossy(&head);
            let access = access(db, &head, request);
            break route(db, &head, access).await;
        }
        if head.len() > HEAD_BYTES_MAX {
            break Response::error(431, "request head too large");
        }
    };
    respond(socket, response).await
}

async fn respond<S: AsyncWrite + Unpin>(mut socket: S, response: Response) -> std::io::Result<()> {
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    };
    let challenge = match response.status {
        401 => "WWW-Authenticate: Basic realm=\"weir\", Bearer realm=\"weir\"\r\n",
        _ => "",
    };
    let out = format!(
        "HTTP/1.1 {} {reason}\r\n{challenge}Content-Type: {}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{}",
        response.status,
        response.content_type,
        response.body.len(),
        response.body
    );
    socket.write_all(out.as_bytes()).await?;
    socket.shutdown().await
}

/// What a request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Access {
    None,
    Read,
    Admin,
}

/// What the request whose head is `head` may do, by its `Authorization` header.
fn access(db: &Database, head: &str, request: Request) -> Access {
    let authorization = head.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then(|| value.trim())
    });
    let Some(authorization) = authorization else {
        // The bootstrap superuser, where the rules trust it without a password.
        let user = crate::catalog::BOOTSTRAP_ROLE;
        return match signs_in(db, request, user, None) {
            true => Access::Admin,
            false => Access::None,
        };
    };
    let (scheme, credentials) = authorization.split_once(' ').unwrap_or((authorization, ""));
    let credentials = credentials.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        let config = &db.config;
        return match (&config.admin_token, &config.admin_read_token) {
            (Some(t), _) if same(t, credentials) => Access::Admin,
            (_, Some(t)) if same(t, credentials) => Access::Read,
            _ => Access::None,
        };
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return Access::None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(credentials)
        .ok()
        .and_then(|d| String::from_utf8(d).ok());
    let Some((user, password)) = decoded.as_deref().and_then(|d| d.split_once(':')) else {
        return Access::None;
    };
    if !signs_in(db, request, user, Some(password)) {
        return Access::None;
    }
    match db.role(user).is_some_and(|r| r.superuser) {
        true => Access::Admin,
        false => Access::Read,
    }
}

/// Whether `user` may sign in from the request's address with `password` (or none) as the
/// SQL port's rules would let it: trusted, or its password matching its verifier.
fn signs_in(db: &Database, request: Request, user: &str, password: Option<&str>) -> bool {
    let Some(role) = db.role(user).filter(|r| r.login) else {
        return false;
    };
    let has_password = role.password.is_some();
    let method = db
        .config
        .auth_method(request.peer, user, request.tls, has_password);
    match (method, password, &role.password) {
        (Some(AuthMethod::Trust), _, _) => true,
        (
            Some(AuthMethod::ScramSha256 | AuthMethod::Md5 | AuthMethod::Password),
            Some(password),
            Some(verifier),
        ) => verifier.accepts(password),
        _ => false,
    }
}

/// Compares a token in time independent of where it differs.
fn same(expected: &str, given: &str) -> bool {
    crate::catalog::same_bytes(expected.as_bytes(), given.as_bytes())
}

async fn route(db: &Database, head: &str, access: Access) -> Response {
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Response::error(400, "malformed request line");
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let needs = match method {
        "GET" | "HEAD" => Access::Read,
        _ => Access::Admin,
    };
    if access == Access::None {
        return Response::error(401, "authentication required");
    }
    if access < needs {
        return Response::error(403, "this token or role may only read");
    }
    match (method, path) {
        ("POST", "/api/v1/checkpoints") => {
            let label = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("label="))
                .map(percent_decode);
            let kind = if label.is_some() {
                Kind::External
            } else {
                Kind::Manual
            };
            let base = query.split('&').any(|kv| kv == "base=true");
            match db.take_checkpoint(kind, label, base).await {
                Ok((id, epoch)) => {
                    Response::json(200, serde_json::json!({"id": id, "epoch": epoch}))
                }
                Err(e) => Response::error(500, &e.message),
            }
        }
        ("GET", "/api/v1/checkpoints") => match db.checkpoint_records() {
            Ok(records) => Response::json(
                200,
                serde_json::Value::Array(
                    records
                        .iter()
                        .map(|r| {
                            serde_json::json!({
                                "id": r.id,
                                "epoch": r.epoch,
                                "kind": r.kind.map(|k| k.as_str()),
                                "mode": r.mode.map(|m| m.as_str()),
                                "label": r.label,
                                "status": r.status.to_string(),
                                "started_at_ms": r.started_at_ms,
                                "duration_ms": r.duration_ms,
                                "align_ms": r.timings.align_ms,
                                "snapshot_ms": r.timings.snapshot_ms,
                                "upload_ms": r.timings.upload_ms,
                                "files_uploaded": r.files_uploaded,
                                "files_reused": r.files_reused,
                                "bytes_uploaded": r.bytes_uploaded,
                                "bytes_referenced": r.bytes_referenced,
                            })
                        })
                        .collect(),
                ),
            ),
            Err(e) => Response::error(500, &e.message),
        },
        ("GET", "/metrics") => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4",
            body: metrics(db),
        },
        (_, "/api/v1/checkpoints" | "/metrics") => Response::error(405, "method not allowed"),
        _ => Response::error(404, "no such endpoint"),
    }
}

/// `/metrics`: the coordinator's and checkpoints' series, and where memory stands.
fn metrics(db: &Database) -> String {
    use crate::metrics::gauge;
    let mut out = db.render_metrics();
    let m = db.memory();
    gauge(
        &mut out,
        "weir_memory_limit_bytes",
        "The server's memory_limit.",
        m.limit_bytes,
    );
    let help = "The memory batch statements may reserve together (half of memory_limit).";
    gauge(
        &mut out,
        "weir_statement_memory_limit_bytes",
        help,
        m.statements_limit_bytes,
    );
    let help = "The memory batch statements have reserved: their operators' working memory and \
                the results of functions their arguments size.";
    gauge(
        &mut out,
        "weir_statement_memory_bytes",
        help,
        m.statements_bytes,
    );
    let help = "Batch plans running, each on a thread of its own (open cursors included).";
    gauge(
        &mut out,
        "weir_statements_running",
        help,
        m.statements_running,
    );
    let help = "State in RocksDB's memtables: written by views and tables, not yet flushed.";
    gauge(
        &mut out,
        "weir_state_memtable_bytes",
        help,
        m.state_memtable_bytes,
    );
    let help = "Blocks of state files in RocksDB's block cache.";
    gauge(
        &mut out,
        "weir_state_block_cache_bytes",
        help,
        m.state_block_cache_bytes,
    );
    let help = "The disk statements' temporary files take: spilled sorts and aggregations, \
                spooled rows of large writes and COPY.";
    gauge(&mut out, "weir_temp_disk_bytes", help, m.temp_disk_bytes);
    let help = "The disk statements' temporary files may take together (temp_disk_limit).";
    gauge(
        &mut out,
        "weir_temp_disk_limit_bytes",
        help,
        m.temp_disk_limit_bytes,
    );
    let help = "Operators' caches of their state (aggregations' groups), estimated.";
    gauge(
        &mut out,
        "weir_operator_cache_bytes",
        help,
        m.operator_cache_bytes,
    );
    let help = "What operators' caches may hold together (an eighth of memory_limit); past it \
                a barrier is asked for, at which each empties its own.";
    gauge(
        &mut out,
        "weir_operator_cache_limit_bytes",
        help,
        m.operator_cache_limit_bytes,
    );
    let help = "Operators' state writes of the current epoch, held until its barrier, estimated.";
    gauge(
        &mut out,
        "weir_epoch_writes_bytes",
        help,
        m.epoch_writes_bytes,
    );
    let help = "What operators' state writes of an epoch may hold together (an eighth of \
                memory_limit); past it a barrier is asked for.";
    gauge(
        &mut out,
        "weir_epoch_writes_limit_bytes",
        help,
        m.epoch_writes_limit_bytes,
    );
    if let Some((rss, peak)) = crate::metrics::resident_bytes() {
        let help = "The process's resident memory (VmRSS).";
        gauge(&mut out, "weir_resident_memory_bytes", help, rss);
        let help = "The most resident memory the process has had (VmHWM).";
        gauge(&mut out, "weir_resident_memory_peak_bytes", help, peak);
    }
    out
}

/// Decodes `%XX` escapes and `+` (a space) in a query value.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (
                    bytes.get(i + 1).and_then(|b| hex(*b)),
                    bytes.get(i + 2).and_then(|b| hex(*b)),
                ) {
                    (Some(hi), Some(lo)) => {
                        out.push((hi * 16 + lo) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(percent_decode("nightly+run%2F7"), "nightly run/7");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%é"), "%é");
    }
}
