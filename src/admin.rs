//! The admin HTTP port (`admin_listen`): for operators and other systems, not SQL clients.
//!
//! - `POST /api/v1/checkpoints` takes a checkpoint and answers once it is complete:
//!   `{"id": .., "epoch": ..}`, or status 500 with `{"error": ..}`. With `?label=...` the
//!   checkpoint is an external one carrying that label (how another system triggers one).
//! - `GET /api/v1/checkpoints`: the checkpoints, newest first, as JSON.
//! - `GET /metrics`: Prometheus' text format.
//!
//! One request per connection; HTTP/1.1 with `Connection: close`.

use std::future::Future;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::checkpoint::Kind;
use crate::db::Database;

/// Request heads longer than this are refused.
const HEAD_BYTES_MAX: usize = 16 * 1024;

pub async fn serve(db: Arc<Database>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((socket, _)) => {
                let db = db.clone();
                tokio::spawn(async move {
                    if let Err(e) = handle(db, socket).await {
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

async fn handle(db: Arc<Database>, mut socket: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let response = loop {
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end);
            break route(&db, &String::from_utf8_lossy(&head)).await;
        }
        if head.len() > HEAD_BYTES_MAX {
            break Response::error(431, "request head too large");
        }
    };
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    };
    let out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        response.status,
        response.content_type,
        response.body.len(),
        response.body
    );
    socket.write_all(out.as_bytes()).await?;
    socket.shutdown().await
}

async fn route(db: &Database, head: &str) -> Response {
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Response::error(400, "malformed request line");
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
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
            body: db.render_metrics(),
        },
        (_, "/api/v1/checkpoints" | "/metrics") => Response::error(405, "method not allowed"),
        _ => Response::error(404, "no such endpoint"),
    }
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
