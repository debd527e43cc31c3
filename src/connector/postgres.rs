//! A PostgreSQL server as a connector reaches it, upstream (`postgres-cdc` sources) or as a
//! target (`postgres` sinks): where and as whom to connect, a plain tokio-postgres
//! connection (over TLS as `sslmode` asks: `postgres_tls`), and its errors with the SQLSTATEs
//! Weir reports for them.

use std::sync::Arc;

use tokio_postgres::{Client, NoTls};

use super::postgres_tls::{check, client_config, MakeRustls};
pub use super::postgres_tls::{handshake, SslMode};
use super::Options;
use crate::error::{Error, ErrorKind, Result};

/// Where and as whom to connect.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: String,
    /// Whether and how the connection is encrypted (libpq's `sslmode`; `prefer` by default).
    pub ssl_mode: SslMode,
    /// The PEM file of the certificate authorities `verify-ca` and `verify-full` trust (a
    /// path on the server, confined as `file` connectors' are).
    pub root_cert: Option<String>,
}

impl Endpoint {
    /// Takes `hostname`, `port` (5432 when absent), `username`, `password` (empty when
    /// absent), `database.name`, `sslmode` and `sslrootcert` from a connector's options;
    /// `what` names the connector in errors ("a postgres-cdc source").
    pub fn read(options: &mut Options, what: &str) -> Result<Endpoint> {
        let bad = |m: String| Error::new(ErrorKind::InvalidParameter, m);
        let mut required = |key: &str| {
            options
                .take(key)
                .ok_or_else(|| bad(format!("{what} needs {key}")))
        };
        let host = required("hostname")?;
        let user = required("username")?;
        let database = required("database.name")?;
        let port = match options.take("port") {
            None => 5432,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| bad(format!("port must be a port number, not \"{p}\"")))?,
        };
        let password = options.take("password").unwrap_or_default();
        let ssl_mode =
            (options.take("sslmode").as_deref()).map_or(Ok(SslMode::Prefer), SslMode::parse)?;
        let root_cert = options.take("sslrootcert");
        check(ssl_mode, root_cert.as_deref())?;
        Ok(Endpoint {
            host,
            port,
            user,
            password,
            database,
            ssl_mode,
            root_cert,
        })
    }

    /// The TLS client settings of `sslmode`; `None` for `disable`.
    pub fn tls(&self) -> Result<Option<Arc<tokio_rustls::rustls::ClientConfig>>> {
        client_config(self.ssl_mode, self.root_cert.as_deref())
    }

    /// The options `read` takes, written out in full.
    pub fn kept(&self) -> Vec<(String, String)> {
        vec![
            ("hostname".to_string(), self.host.clone()),
            ("port".to_string(), self.port.to_string()),
            ("username".to_string(), self.user.clone()),
            ("password".to_string(), self.password.clone()),
            ("database.name".to_string(), self.database.clone()),
            ("sslmode".to_string(), self.ssl_mode.name().to_string()),
        ]
        .into_iter()
        .chain((self.root_cert.clone()).map(|p| ("sslrootcert".to_string(), p)))
        .collect()
    }

    /// The same endpoint for tokio-postgres.
    pub fn tokio_postgres(&self) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host(&self.host)
            .port(self.port)
            .user(&self.user)
            .password(&self.password)
            .dbname(&self.database)
            .application_name("weir")
            .ssl_mode(match self.ssl_mode {
                SslMode::Disable => tokio_postgres::config::SslMode::Disable,
                SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
                _ => tokio_postgres::config::SslMode::Require,
            })
            .connect_timeout(std::time::Duration::from_secs(10));
        c
    }
}

/// A server that cannot be reached (08001), or an error it answered, with its SQLSTATE's
/// meaning where Weir has one. `role` says which server it is ("upstream PostgreSQL").
pub fn error(role: &str, what: &str, e: tokio_postgres::Error) -> Error {
    let kind = match e.code().map(|c| c.code()) {
        Some("28P01" | "28000" | "42501") => ErrorKind::InvalidAuthorization,
        Some("3D000") => ErrorKind::UndefinedDatabase,
        Some("42P01" | "42704") => ErrorKind::UndefinedObject,
        Some("55000" | "55006") => ErrorKind::ObjectNotInPrerequisiteState,
        _ => ErrorKind::ConnectionFailure,
    };
    let detail = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    };
    Error::new(kind, format!("{role}: {what}: {detail}"))
}

/// A plain connection, its task spawned on the current runtime, in UTC with ISO dates and
/// floats written exactly.
pub async fn connect(to: &Endpoint, role: &str) -> Result<Client> {
    let config = to.tokio_postgres();
    let client = match to.tls()? {
        None => {
            let (client, connection) =
                (config.connect(NoTls).await).map_err(|e| error(role, "connect", e))?;
            tokio::spawn(ended(connection));
            client
        }
        Some(tls) => {
            let (client, connection) =
                (config.connect(MakeRustls(tls)).await).map_err(|e| error(role, "connect", e))?;
            tokio::spawn(ended(connection));
            client
        }
    };
    client
        .batch_execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET extra_float_digits = 3")
        .await
        .map_err(|e| error(role, "session settings", e))?;
    Ok(client)
}

/// Waits out a connection's task, which ends with its client.
async fn ended<F: std::future::Future<Output = std::result::Result<(), tokio_postgres::Error>>>(
    connection: F,
) {
    if let Err(e) = connection.await {
        tracing::debug!("PostgreSQL connection ended: {e}");
    }
}
