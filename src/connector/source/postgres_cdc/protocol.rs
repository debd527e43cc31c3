//! A replication connection to PostgreSQL: the wire protocol's startup with
//! `replication=database`, password authentication (SCRAM-SHA-256, MD5 or cleartext, as the
//! server asks), over TLS as the endpoint's `sslmode` asks, and the CopyBoth stream that
//! `START_REPLICATION` opens. tokio-postgres has no replication mode;
//! postgres-protocol (which it is built on) encodes and decodes the messages.

use bytes::{Buf, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub use crate::connector::postgres::Endpoint;
use crate::error::{Error, ErrorKind, Result};

/// The largest message accepted from the server: PostgreSQL's own limit on one value is 1 GiB.
const MESSAGE_BYTES_MAX: usize = (1 << 30) + (1 << 20);

/// An upstream that refused or broke the connection (08001 / 08006), or answered a query
/// with an error (its SQLSTATE's class is not ours: reported as the connector's failure).
fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::ConnectionFailure,
        format!("PostgreSQL replication connection: {what}: {e}"),
    )
}

/// A connection's byte stream: plain TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One replication connection.
pub struct Connection {
    stream: Box<dyn Io>,
    read: BytesMut,
    write: BytesMut,
}

/// A message read off the connection: one the protocol crate decodes, or the CopyBoth
/// response it does not know.
enum Incoming {
    Message(Message),
    CopyBothResponse,
}

/// `stream` encrypted as `to`'s `sslmode` asks: an SSLRequest, and TLS if the server takes
/// it (which `prefer` does without, and the other modes refuse to).
async fn encrypted(mut stream: TcpStream, to: &Endpoint) -> Result<Box<dyn Io>> {
    use crate::connector::postgres::SslMode;
    let Some(tls) = to.tls()? else {
        return Ok(Box::new(stream));
    };
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    stream
        .write_all(&request)
        .await
        .map_err(|e| failed("SSLRequest", e))?;
    let mut answer = [0u8; 1];
    (stream.read_exact(&mut answer).await).map_err(|e| failed("SSLRequest", e))?;
    match (answer[0], to.ssl_mode) {
        (b'S', _) => {
            let tls = crate::connector::postgres::handshake(tls, &to.host, stream)
                .await
                .map_err(|e| failed("TLS", e))?;
            Ok(Box::new(tls))
        }
        (b'N', SslMode::Prefer) => Ok(Box::new(stream)),
        (b'N', _) => Err(failed(
            "TLS",
            format!(
                "the server does not support SSL, which sslmode {} needs",
                to.ssl_mode.name()
            ),
        )),
        (other, _) => Err(failed(
            "SSLRequest",
            format!("unexpected answer {other:#04x}"),
        )),
    }
}

impl Connection {
    pub async fn connect(to: &Endpoint) -> Result<Connection> {
        let stream = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            TcpStream::connect((to.host.as_str(), to.port)),
        )
        .await
        .map_err(|_| failed("connect", "timed out after 10 s"))?
        .map_err(|e| failed("connect", e))?;
        stream.set_nodelay(true).map_err(|e| failed("connect", e))?;
        let mut c = Connection {
            stream: encrypted(stream, to).await?,
            read: BytesMut::with_capacity(64 << 10),
            write: BytesMut::new(),
        };
        let params = [
            ("user", to.user.as_str()),
            ("database", to.database.as_str()),
            ("replication", "database"),
            ("application_name", "weir"),
            // Values come as text; these make them read the same whatever the server's
            // defaults.
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            ("extra_float_digits", "3"),
        ];
        frontend::startup_message(params.iter().copied(), &mut c.write)
            .map_err(|e| failed("startup", e))?;
        c.flush().await?;
        c.authenticate(to).await?;
        // Parameter statuses and the backend's key, up to ReadyForQuery.
        loop {
            match c.next().await? {
                Incoming::Message(Message::ReadyForQuery(_)) => return Ok(c),
                Incoming::Message(Message::ErrorResponse(e)) => return Err(error_of(e)),
                _ => {}
            }
        }
    }

    async fn authenticate(&mut self, to: &Endpoint) -> Result<()> {
        loop {
            let Incoming::Message(m) = self.next().await? else {
                return Err(failed("authentication", "unexpected CopyBothResponse"));
            };
            match m {
                Message::AuthenticationOk => return Ok(()),
                Message::AuthenticationCleartextPassword => {
                    frontend::password_message(to.password.as_bytes(), &mut self.write)
                        .map_err(|e| failed("authentication", e))?;
                    self.flush().await?;
                }
                Message::AuthenticationMd5Password(body) => {
                    let hash = postgres_protocol::authentication::md5_hash(
                        to.user.as_bytes(),
                        to.password.as_bytes(),
                        body.salt(),
                    );
                    frontend::password_message(hash.as_bytes(), &mut self.write)
                        .map_err(|e| failed("authentication", e))?;
                    self.flush().await?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut scram = false;
                    while let Some(m) =
                        mechanisms.next().map_err(|e| failed("authentication", e))?
                    {
                        scram |= m == "SCRAM-SHA-256";
                    }
                    if !scram {
                        return Err(failed(
                            "authentication",
                            "the server offers no SCRAM-SHA-256",
                        ));
                    }
                    self.scram(to).await?;
                }
                Message::ErrorResponse(e) => return Err(error_of(e)),
                _ => return Err(failed("authentication", "a method Weir does not speak")),
            }
        }
    }

    async fn scram(&mut self, to: &Endpoint) -> Result<()> {
        let mut scram = ScramSha256::new(to.password.as_bytes(), ChannelBinding::unsupported());
        frontend::sasl_initial_response("SCRAM-SHA-256", scram.message(), &mut self.write)
            .map_err(|e| failed("authentication", e))?;
        self.flush().await?;
        let Incoming::Message(m) = self.next().await? else {
            return Err(failed("authentication", "unexpected CopyBothResponse"));
        };
        let body = match m {
            Message::AuthenticationSaslContinue(b) => b,
            Message::ErrorResponse(e) => return Err(error_of(e)),
            _ => return Err(failed("authentication", "unexpected SCRAM message")),
        };
        scram
            .update(body.data())
            .map_err(|e| failed("authentication", e))?;
        frontend::sasl_response(scram.message(), &mut self.write)
            .map_err(|e| failed("authentication", e))?;
        self.flush().await?;
        let Incoming::Message(m) = self.next().await? else {
            return Err(failed("authentication", "unexpected CopyBothResponse"));
        };
        match m {
            Message::AuthenticationSaslFinal(b) => scram
                .finish(b.data())
                .map_err(|e| failed("authentication", e)),
            Message::ErrorResponse(e) => Err(error_of(e)),
            _ => Err(failed("authentication", "unexpected SCRAM message")),
        }
    }

    /// Sends `START_REPLICATION ...` and waits for the CopyBoth stream to open.
    pub async fn start(&mut self, command: &str) -> Result<()> {
        frontend::query(command, &mut self.write).map_err(|e| failed("query", e))?;
        self.flush().await?;
        loop {
            match self.next().await? {
                Incoming::CopyBothResponse => return Ok(()),
                Incoming::Message(Message::ErrorResponse(e)) => return Err(error_of(e)),
                Incoming::Message(_) => {}
            }
        }
    }

    /// The next CopyData of the replication stream; `None` when the server ended it.
    pub async fn next_copy(&mut self) -> Result<Option<bytes::Bytes>> {
        loop {
            match self.next().await? {
                Incoming::Message(Message::CopyData(d)) => return Ok(Some(d.into_bytes())),
                Incoming::Message(Message::CopyDone) => return Ok(None),
                Incoming::Message(Message::ErrorResponse(e)) => return Err(error_of(e)),
                _ => {}
            }
        }
    }

    /// Sends a CopyData message (a standby status update).
    pub async fn send_copy(&mut self, data: &[u8]) -> Result<()> {
        self.write.extend_from_slice(b"d");
        self.write
            .extend_from_slice(&((data.len() + 4) as u32).to_be_bytes());
        self.write.extend_from_slice(data);
        self.flush().await
    }

    async fn flush(&mut self) -> Result<()> {
        let out = self.write.split();
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| failed("write", e))
    }

    /// Reads the next message, a whole one.
    async fn next(&mut self) -> Result<Incoming> {
        loop {
            if self.read.len() >= 5 {
                let len =
                    u32::from_be_bytes([self.read[1], self.read[2], self.read[3], self.read[4]])
                        as usize;
                if !(4..=MESSAGE_BYTES_MAX).contains(&len) {
                    return Err(failed("read", format!("a message of {len} bytes")));
                }
                if self.read[0] == b'W' && self.read.len() > len {
                    self.read.advance(len + 1);
                    return Ok(Incoming::CopyBothResponse);
                }
                if let Some(m) = Message::parse(&mut self.read).map_err(|e| failed("read", e))? {
                    return Ok(Incoming::Message(m));
                }
            }
            if self.read.capacity() - self.read.len() < 8192 {
                self.read.reserve(64 << 10);
            }
            let n = self
                .stream
                .read_buf(&mut self.read)
                .await
                .map_err(|e| failed("read", e))?;
            if n == 0 {
                return Err(failed("read", "the server closed the connection"));
            }
        }
    }
}

/// A server's ErrorResponse as an error naming its SQLSTATE and message.
fn error_of(e: postgres_protocol::message::backend::ErrorResponseBody) -> Error {
    let mut code = String::new();
    let mut message = String::new();
    let mut fields = e.fields();
    while let Ok(Some(f)) = fields.next() {
        match f.type_() {
            b'C' => code = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            _ => {}
        }
    }
    let kind = match code.as_str() {
        // Authentication failed, or the user may not replicate.
        "28P01" | "28000" | "42501" => ErrorKind::InvalidAuthorization,
        "3D000" => ErrorKind::UndefinedDatabase,
        "42704" => ErrorKind::UndefinedObject,
        "42710" => ErrorKind::DuplicateObject,
        "55000" | "55006" => ErrorKind::ObjectNotInPrerequisiteState,
        _ => ErrorKind::ConnectionFailure,
    };
    Error::new(kind, format!("upstream PostgreSQL: {message} ({code})"))
}
