//! Startup: the protocol version, the startup parameters, who may connect (loopback only,
//! unless remote clients are trusted), the connection limit and the database name; then the
//! connection's session and the ParameterStatus values PostgreSQL sends.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::{
    finish_authentication, protocol_negotiation, save_startup_parameters_to_metadata,
    ServerParameterProvider, StartupHandler,
};
use pgwire::api::{ClientInfo, METADATA_DATABASE};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::sync::Mutex;

use super::cancel::Cancels;
use super::sqlstate::sqlstate;
use crate::db::Database;
use crate::error::ErrorKind;
use crate::session::{Interrupts, Session};
use crate::sql::{BackendStart, Registered};

pub(super) struct Startup {
    pub(super) admitted: bool,
    pub(super) session: Arc<Mutex<Option<Session>>>,
    pub(super) db: Arc<Database>,
    pub(super) cancels: Arc<Cancels>,
    pub(super) backend: Arc<std::sync::Mutex<Option<Registered>>>,
    pub(super) socket: Arc<std::sync::Mutex<Option<tokio::net::TcpStream>>>,
}

fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".into(),
        code.into(),
        message,
    )))
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let PgWireFrontendMessage::Startup(ref startup) = message else {
            return Ok(());
        };
        protocol_negotiation(client, startup).await?;
        save_startup_parameters_to_metadata(client, startup);
        if !client.socket_addr().ip().is_loopback() && !self.db.config.trust_remote_clients {
            return Err(fatal(
                sqlstate(ErrorKind::InvalidAuthorization),
                format!(
                    "no authentication is configured: connections from {} are refused",
                    client.socket_addr().ip()
                ),
            ));
        }
        if !self.admitted {
            return Err(fatal(
                sqlstate(ErrorKind::TooManyConnections),
                "sorry, too many clients already".into(),
            ));
        }
        let database = client
            .metadata()
            .get(METADATA_DATABASE)
            .cloned()
            .unwrap_or_default();
        if database != crate::DATABASE_NAME {
            return Err(fatal(
                sqlstate(ErrorKind::UndefinedDatabase),
                format!("database \"{database}\" does not exist"),
            ));
        }
        let meta = client.metadata();
        let get = |k: &str| meta.get(k).cloned().unwrap_or_default();
        let (user, application_name) = (get("user"), get("application_name"));
        let address = client.socket_addr();
        let (key, registered) = self.cancels.register(client, |pid| BackendStart {
            pid,
            user,
            application_name,
            client: address,
        });
        let backend = registered.0.clone();
        *self.backend.lock().unwrap_or_else(|p| p.into_inner()) = Some(registered);
        client.set_pid_and_secret_key(backend.start.pid, key);
        let interrupts = Interrupts {
            backend,
            socket: self
                .socket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .map(Arc::new),
        };
        *self.session.lock().await =
            Some(Session::new(self.db.clone(), client.metadata(), interrupts));
        finish_authentication(client, &Parameters).await
    }
}

/// The ParameterStatus values PostgreSQL 15 sends after authentication.
struct Parameters;

impl ServerParameterProvider for Parameters {
    fn server_parameters<C: ClientInfo>(&self, client: &C) -> Option<HashMap<String, String>> {
        let meta = client.metadata();
        let get = |k: &str| meta.get(k).cloned().unwrap_or_default();
        let pairs = [
            ("application_name", get("application_name")),
            ("client_encoding", "UTF8".to_string()),
            ("DateStyle", "ISO, MDY".to_string()),
            ("default_transaction_read_only", "off".to_string()),
            ("in_hot_standby", "off".to_string()),
            ("integer_datetimes", "on".to_string()),
            ("IntervalStyle", "postgres".to_string()),
            ("is_superuser", "on".to_string()),
            ("server_encoding", "UTF8".to_string()),
            ("server_version", crate::PG_VERSION.to_string()),
            ("session_authorization", get("user")),
            ("standard_conforming_strings", "on".to_string()),
            ("TimeZone", "UTC".to_string()),
        ];
        Some(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
}
