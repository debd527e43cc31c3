//! TLS to a PostgreSQL server a connector reaches, as libpq's `sslmode` and `sslrootcert`
//! ask: `disable`, `prefer` (TLS where the server offers it, unverified; libpq's default),
//! `require` (TLS, unverified), `verify-ca` (a certificate signed by `sslrootcert`'s) and
//! `verify-full` (that, for the host connected to). rustls, with the ring provider the SQL
//! port's TLS uses; for tokio-postgres connections and for the CDC replication connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::error::{Error, ErrorKind, Result};

/// How a connection uses TLS (libpq's `sslmode`; `allow` is not offered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(text: &str) -> Result<SslMode> {
        Ok(match text.to_lowercase().as_str() {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidParameter,
                    format!(
                        "sslmode must be disable, prefer, require, verify-ca or verify-full, \
                         not \"{text}\""
                    ),
                ))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Refuses (22023) a verifying mode without the authorities to verify with. Checked when
/// options are read; the file itself is read at each connection, so that a start does not
/// depend on it.
pub fn check(mode: SslMode, root_cert: Option<&str>) -> Result<()> {
    let verifying = matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull);
    if verifying && root_cert.is_none() {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!(
                "sslmode {} needs sslrootcert, the certificate authorities to trust",
                mode.name()
            ),
        ));
    }
    Ok(())
}

/// The TLS client settings of `mode`, trusting the certificates of the PEM file `root_cert`
/// for the verifying modes (which need one); `None` for `disable`.
pub fn client_config(
    mode: SslMode,
    root_cert: Option<&str>,
) -> Result<Option<Arc<rustls::ClientConfig>>> {
    let bad = |m: String| Error::new(ErrorKind::InvalidParameter, m);
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("TLS protocol versions: {e}")))?;
    let config = match (mode, root_cert) {
        (SslMode::Disable, _) => return Ok(None),
        (SslMode::Prefer | SslMode::Require, _) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider()))),
        (_, None) => {
            check(mode, None)?;
            return Err(Error::internal("a verifying sslmode without sslrootcert"));
        }
        (_, Some(path)) => {
            let mut roots = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(format!("sslrootcert \"{path}\" cannot be read: {e}")))?;
            for cert in certs {
                let cert =
                    cert.map_err(|e| bad(format!("sslrootcert \"{path}\" is not PEM: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("sslrootcert \"{path}\": {e}")))?;
            }
            if roots.is_empty() {
                return Err(bad(format!("sslrootcert \"{path}\" holds no certificate")));
            }
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| bad(format!("sslrootcert \"{path}\": {e}")))?;
            match mode {
                SslMode::VerifyFull => builder.with_webpki_verifier(webpki),
                _ => builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyName(webpki))),
            }
        }
    };
    Ok(Some(Arc::new(config.with_no_client_auth())))
}

/// `require` and `prefer`: encrypted, with the server's signature checked against the
/// certificate it sends, which itself is not checked (as libpq does without a root
/// certificate).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted authority, for whatever host.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match (self.0).verify_server_cert(end_entity, intermediates, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The server name TLS checks `host` against.
fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Begins TLS over `stream` to `host`.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    config: Arc<rustls::ClientConfig>,
    host: &str,
    stream: S,
) -> io::Result<tokio_rustls::client::TlsStream<S>> {
    let name = server_name(host)?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
}

/// tokio-postgres's TLS seam over rustls.
#[derive(Clone)]
pub struct MakeRustls(pub Arc<rustls::ClientConfig>);

/// One connection's TLS, for the host it was made for.
pub struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    host: String,
}

/// A TLS stream as tokio-postgres reads and writes it.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> tokio_postgres::tls::MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<RustlsConnect> {
        Ok(RustlsConnect {
            config: self.0.clone(),
            host: host.to_string(),
        })
    }
}

impl<S> tokio_postgres::tls::TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = handshake(self.config, &self.host, stream).await?;
            Ok(RustlsStream(tls))
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        tokio_postgres::tls::ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
