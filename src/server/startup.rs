//! Startup: the protocol version, the startup parameters, the connection limit and the
//! database name, the client's proof of who it is (`auth`); then the connection's session and
//! the ParameterStatus values PostgreSQL sends.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{Sink, SinkExt};
use pgwire::api::auth::mechanism::{AuthMechanism, AuthState};
use pgwire::api::auth::{
    finish_authentication, protocol_negotiation, save_startup_parameters_to_metadata,
    ServerParameterProvider, StartupHandler,
};
use pgwire::api::{
    ClientInfo, DefaultClient, PgWireConnectionState, METADATA_DATABASE, METADATA_USER,
};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::sync::Mutex;

use super::auth;
use super::cancel::Cancels;
use crate::db::Database;
use crate::error::ErrorKind;
use crate::session::{Interrupts, Session};
use crate::sql::{BackendStart, Registered};

pub(super) struct Startup {
    pub(super) admitted: bool,
    /// Every connection's places under `connections_max`.
    pub(super) slots: Arc<tokio::sync::Semaphore>,
    /// The client's proof of who it is, while its messages come.
    pub(super) proof: Arc<Mutex<Option<Box<dyn AuthMechanism>>>>,
    pub(super) session: Arc<Mutex<Option<Session>>>,
    pub(super) db: Arc<Database>,
    pub(super) cancels: Arc<Cancels>,
    /// The server's certificate chain when it has TLS (SCRAM's channel binding).
    pub(super) cert_pem: Option<Arc<Vec<u8>>>,
    pub(super) backend: Arc<std::sync::Mutex<Option<Registered>>>,
    pub(super) socket: Arc<std::sync::Mutex<Option<tokio::net::TcpStream>>>,
}

#[async_trait]
impl StartupHandler for Startup {
    /// The startup message, then the messages of the client's proof of who it is (the first
    /// rule of the server's that covers it decides which: `server::auth`), then the session.
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
        let state = match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                self.check_startup(client)?;
                let user = user_of(client);
                // Over TLS, SCRAM may bind the exchange to the server's certificate.
                let binding = (self.cert_pem.as_deref()).filter(|_| client.is_secure());
                let mut proof = match auth::proof(
                    &self.db,
                    (client.socket_addr().ip(), &user),
                    client.is_secure(),
                    binding.map(Vec::as_slice),
                )? {
                    auth::Proof::Trusted => return self.start(client, &user).await,
                    auth::Proof::Exchange(mechanism) => mechanism,
                };
                let state = proof.begin(&proxy(client)).await;
                *self.proof.lock().await = Some(proof);
                state
            }
            PgWireFrontendMessage::PasswordMessageFamily(message) => {
                let Some(mut proof) = self.proof.lock().await.take() else {
                    return Err(auth::fatal(
                        ErrorKind::ProtocolViolation,
                        "a password message came without an authentication under way".into(),
                    ));
                };
                let state = proof.next(&proxy(client), message).await;
                *self.proof.lock().await = Some(proof);
                state
            }
            _ => return Ok(()),
        };
        let user = user_of(client);
        match state {
            Ok(AuthState::InProgress(request)) => {
                client.set_state(PgWireConnectionState::AuthenticationInProgress);
                client
                    .send(PgWireBackendMessage::Authentication(request))
                    .await?;
                Ok(())
            }
            Ok(AuthState::Ok { final_message, .. }) => {
                self.proof.lock().await.take();
                if let Some(last) = final_message {
                    client
                        .feed(PgWireBackendMessage::Authentication(last))
                        .await?;
                }
                self.start(client, &user).await
            }
            // A message that breaks the protocol is refused as such (08P01).
            Err(e @ PgWireError::UserError(_)) => {
                tracing::info!(user, "authentication failed: {e}");
                Err(e)
            }
            Ok(AuthState::Failed(e)) | Err(e) => {
                tracing::info!(user, "authentication failed: {e}");
                Err(auth::password_failed(&user))
            }
        }
    }
}

/// The user the client's startup message names.
fn user_of<C: ClientInfo>(client: &C) -> String {
    let meta = client.metadata();
    meta.get(METADATA_USER).cloned().unwrap_or_default()
}

/// What the authentication mechanisms see of the client: its address, security and startup
/// parameters (they read no more).
fn proxy<C: ClientInfo>(client: &C) -> DefaultClient<()> {
    let mut proxy = DefaultClient::new(client.socket_addr(), client.is_secure());
    proxy.metadata = client.metadata().clone();
    proxy
}

impl Startup {
    /// What is checked before anyone proves who they are: the connection limit and the
    /// database, and that a user is named.
    fn check_startup<C: ClientInfo>(&self, client: &C) -> PgWireResult<()> {
        if !self.admitted {
            return Err(auth::fatal(
                ErrorKind::TooManyConnections,
                "sorry, too many clients already".into(),
            ));
        }
        let meta = client.metadata();
        let database = meta.get(METADATA_DATABASE).cloned().unwrap_or_default();
        if database != crate::DATABASE_NAME {
            return Err(auth::fatal(
                ErrorKind::UndefinedDatabase,
                format!("database \"{database}\" does not exist"),
            ));
        }
        if meta.get(METADATA_USER).is_none_or(|u| u.is_empty()) {
            return Err(auth::fatal(
                ErrorKind::InvalidAuthorization,
                "no PostgreSQL user name specified in startup packet".into(),
            ));
        }
        Ok(())
    }

    /// The client has proven who it is: its role must be one that may log in; then its
    /// session starts.
    async fn start<C>(&self, client: &mut C, user: &str) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let role = auth::admitted(&self.db, user)?;
        // The last free places are kept for superusers, as PostgreSQL keeps them.
        let reserved = self.db.config.superuser_reserved_connections;
        if !role.superuser && self.slots.available_permits() < reserved {
            return Err(auth::fatal(
                ErrorKind::TooManyConnections,
                "remaining connection slots are reserved for roles with the SUPERUSER attribute"
                    .into(),
            ));
        }
        // A role's connection limit, which superusers are not held to, as in PostgreSQL.
        let limit = usize::try_from(role.connection_limit).ok();
        if limit.is_some_and(|n| !role.superuser && self.cancels.sessions_of(&role.name) >= n) {
            return Err(auth::fatal(
                ErrorKind::TooManyConnections,
                format!("too many connections for role \"{}\"", role.name),
            ));
        }
        let meta = client.metadata();
        let application_name = meta.get("application_name").cloned().unwrap_or_default();
        let address = client.socket_addr();
        let (key, registered) = self.cancels.register(client, |pid| BackendStart {
            pid,
            user: role.name.clone(),
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
        let mut session = Session::new(self.db.clone(), client.metadata(), interrupts);
        session.start_as(&role);
        *self.session.lock().await = Some(session);
        finish_authentication(
            client,
            &Parameters {
                superuser: role.superuser,
            },
        )
        .await
    }
}

/// The ParameterStatus values PostgreSQL 15 sends after authentication.
struct Parameters {
    superuser: bool,
}

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
            (
                "is_superuser",
                (if self.superuser { "on" } else { "off" }).to_string(),
            ),
            ("server_encoding", "UTF8".to_string()),
            ("server_version", crate::PG_VERSION.to_string()),
            ("session_authorization", get("user")),
            ("standard_conforming_strings", "on".to_string()),
            ("TimeZone", "UTC".to_string()),
        ];
        Some(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
}
