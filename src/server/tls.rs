//! TLS on the SQL port (`[tls]` in the config): the certificate and key read at start, and the
//! stream a connection is served over, plain or encrypted. A client asks for TLS with an
//! SSLRequest, or opens with a TLS handshake at once (PostgreSQL 17's direct negotiation,
//! which must name the `postgresql` ALPN protocol).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsConfig;
use crate::error::{Error, ErrorKind, Result};

/// The ALPN protocol PostgreSQL's clients name.
const ALPN: &[u8] = b"postgresql";

/// The first byte of a TLS handshake record: a client opening with TLS at once.
const HANDSHAKE_RECORD: u8 = 0x16;

/// The server's TLS acceptors: the SQL port's, and the admin port's (HTTP, whose clients
/// name `http/1.1`).
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    http: tokio_rustls::TlsAcceptor,
    require: bool,
    /// The certificate chain as read (PEM), for SCRAM's channel binding.
    cert_pem: Arc<Vec<u8>>,
}

impl Tls {
    /// Reads the certificate chain and key `config` names (PEM); `None` without `[tls]`.
    pub fn load(config: Option<&TlsConfig>) -> Result<Option<Tls>> {
        let Some(config) = config else {
            return Ok(None);
        };
        let bad = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
            Error::new(
                ErrorKind::InvalidParameter,
                format!("cannot read the TLS {what} {}: {e}", path.display()),
            )
        };
        let cert_pem =
            std::fs::read(&config.cert).map_err(|e| bad("certificate", &config.cert, &e))?;
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad("certificate", &config.cert, &e))?;
        if certs.is_empty() {
            return Err(bad("certificate", &config.cert, &"no certificate in it"));
        }
        let key =
            PrivateKeyDer::from_pem_file(&config.key).map_err(|e| bad("key", &config.key, &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
            .map_err(|e| bad("key", &config.key, &e))?;
        let mut http = server.clone();
        server.alpn_protocols = vec![ALPN.to_vec()];
        http.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            http: tokio_rustls::TlsAcceptor::from(Arc::new(http)),
            require: config.require,
            cert_pem: Arc::new(cert_pem),
        }))
    }

    /// Runs the server's side of a handshake on `socket`.
    pub async fn accept(&self, socket: TcpStream) -> io::Result<Stream> {
        let stream = self.acceptor.accept(socket).await?;
        Ok(Stream::Tls(Box::new(stream)))
    }

    /// The admin port's side of a handshake on `socket`.
    pub async fn accept_http(&self, socket: TcpStream) -> io::Result<Stream> {
        let stream = self.http.accept(socket).await?;
        Ok(Stream::Tls(Box::new(stream)))
    }

    /// The server's certificate chain (PEM), which SCRAM-SHA-256-PLUS binds the exchange to.
    pub fn cert_pem(&self) -> Arc<Vec<u8>> {
        self.cert_pem.clone()
    }

    /// Whether plaintext clients are refused (`[tls] require`).
    pub fn required(&self) -> bool {
        self.require
    }
}

/// Whether the client's first byte opens a TLS handshake; `None` if it left first.
pub async fn opens_with_tls(socket: &TcpStream) -> io::Result<Option<bool>> {
    let mut first = [0u8; 1];
    Ok(match socket.peek(&mut first).await? {
        0 => None,
        _ => Some(first[0] == HANDSHAKE_RECORD),
    })
}

/// A client's connection, plain or under TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Stream {
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// Whether the client named `postgresql` in its ALPN extension.
    pub fn named_postgresql(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(s) => s.get_ref().1.alpn_protocol() == Some(ALPN),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
