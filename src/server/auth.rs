//! Who a connecting client is (`docs/design/0019-authentication.md`): the first of the
//! config's rules that covers its address and user decides how it proves it — `trust`,
//! SCRAM-SHA-256 (`md5` too, as in PostgreSQL, since passwords are kept as SCRAM verifiers), a
//! clear-text password, or refusal — and the role must then be one that may log in.

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use pgwire::api::auth::mechanism::{AuthMechanism, AuthMechanismFactory, AuthState};
use pgwire::api::auth::sasl::scram::{ScramAuth, ScramSecret};
use pgwire::api::auth::{AuthSource, LoginInfo, Password};
use pgwire::api::ClientInfo;
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::startup::{Authentication, PasswordMessageFamily};

use super::sqlstate::sqlstate;
use crate::catalog::{RoleDef, Verifier};
use crate::config::AuthMethod;
use crate::db::Database;
use crate::error::ErrorKind;

pub(super) fn fatal(kind: ErrorKind, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(pgwire::error::ErrorInfo::new(
        "FATAL".into(),
        sqlstate(kind).into(),
        message,
    )))
}

/// PostgreSQL's answer to any failed proof, whatever failed: the reason is the server log's.
pub(super) fn password_failed(user: &str) -> PgWireError {
    fatal(
        ErrorKind::InvalidPassword,
        format!("password authentication failed for user \"{user}\""),
    )
}

/// How a client at `ip` logging in as `user` must prove who it is.
pub(super) enum Proof {
    /// None: the role is admitted as it is.
    Trusted,
    /// The exchange a mechanism runs.
    Exchange(Box<dyn AuthMechanism>),
}

/// The first rule of the server's that covers the client decides; none is PostgreSQL's
/// `no pg_hba.conf entry` (28000), as is a plaintext client when TLS is required.
/// `channel_binding`: the server's certificate chain (PEM) over TLS, which SCRAM-SHA-256-PLUS
/// binds the exchange to.
pub(super) fn proof(
    db: &Database,
    (ip, user): (IpAddr, &str),
    tls: bool,
    channel_binding: Option<&[u8]>,
) -> PgWireResult<Proof> {
    let role = db.role(user);
    let has_password = role.as_ref().is_some_and(|r| r.password.is_some());
    let Some(method) = db.config.auth_method(ip, user, tls, has_password) else {
        return Err(fatal(
            ErrorKind::InvalidAuthorization,
            format!(
                "no pg_hba.conf entry for host \"{ip}\", user \"{user}\", database \"{}\", {}",
                crate::DATABASE_NAME,
                if tls {
                    "SSL encryption"
                } else {
                    "no encryption"
                }
            ),
        ));
    };
    // A role that does not exist, or has no password, is checked against a verifier that no
    // password matches, so that the exchange looks the same to the client.
    let verifier = role
        .and_then(|r| r.password)
        .unwrap_or_else(|| unmatched_verifier(user));
    Ok(match method {
        AuthMethod::Trust => Proof::Trusted,
        AuthMethod::ScramSha256 | AuthMethod::Md5 => {
            let source = Arc::new(KnownVerifier(verifier));
            let mut scram = ScramAuth::new(source);
            if let Some(cert) = channel_binding {
                scram.configure_certificate(cert)?;
            }
            Proof::Exchange(Box::new(Sasl {
                inner: scram.create(),
                started: false,
            }))
        }
        AuthMethod::Password => Proof::Exchange(Box::new(ClearText(verifier))),
        AuthMethod::Reject => {
            return Err(fatal(
                ErrorKind::InvalidAuthorization,
                format!(
                    "pg_hba.conf rejects connection for host \"{ip}\", user \"{user}\", \
                     database \"{}\", {}",
                    crate::DATABASE_NAME,
                    if tls {
                        "SSL encryption"
                    } else {
                        "no encryption"
                    }
                ),
            ))
        }
    })
}

/// After its proof: the role must exist and may log in (28000 otherwise).
pub(super) fn admitted(db: &Database, user: &str) -> PgWireResult<RoleDef> {
    let role = db.role(user).ok_or_else(|| {
        fatal(
            ErrorKind::InvalidAuthorization,
            format!("role \"{user}\" does not exist"),
        )
    })?;
    if !role.login {
        return Err(fatal(
            ErrorKind::InvalidAuthorization,
            format!("role \"{user}\" is not permitted to log in"),
        ));
    }
    Ok(role)
}

/// A verifier no password matches, the same for a user name every time (its salt is derived
/// from the name and a key of this process's), as PostgreSQL's mock authentication.
fn unmatched_verifier(user: &str) -> Verifier {
    use ring::digest;
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut key = [0u8; 32];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key);
        key
    });
    let salt = digest::digest(&digest::SHA256, &[key.as_slice(), user.as_bytes()].concat());
    let random = |n: u8| {
        digest::digest(&digest::SHA256, &[key.as_slice(), &[n]].concat())
            .as_ref()
            .to_vec()
    };
    Verifier {
        iterations: crate::catalog::SCRAM_ITERATIONS,
        salt: salt.as_ref()[..16].to_vec(),
        stored_key: random(1),
        server_key: random(2),
    }
}

/// The one verifier a connection's SCRAM exchange checks the client's proof against.
#[derive(Debug)]
struct KnownVerifier(Verifier);

#[async_trait]
impl AuthSource for KnownVerifier {
    async fn get_password(&self, _: &LoginInfo) -> PgWireResult<Password> {
        // Only the verifier is known: SCRAM never asks for the password itself.
        Err(PgWireError::InvalidPassword(String::new()))
    }

    async fn get_scram_secret(&self, _: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        let v = &self.0;
        Ok((
            ScramSecret::Verifier {
                salt: v.salt.clone(),
                iterations: v.iterations as usize,
                stored_key: v.stored_key.clone(),
                server_key: v.server_key.clone(),
            },
            None,
        ))
    }
}

/// pgwire's SCRAM exchange, with the client's first message (SASLInitialResponse) checked
/// before pgwire decodes it: pgwire reads its length fields as given, and a client whose
/// lengths do not match the message would panic the connection's task.
struct Sasl {
    inner: Box<dyn AuthMechanism>,
    started: bool,
}

#[async_trait]
impl AuthMechanism for Sasl {
    async fn begin(&mut self, client: &(dyn ClientInfo + Send + Sync)) -> PgWireResult<AuthState> {
        self.inner.begin(client).await
    }

    async fn next(
        &mut self,
        client: &(dyn ClientInfo + Send + Sync),
        message: PasswordMessageFamily,
    ) -> PgWireResult<AuthState> {
        if !std::mem::replace(&mut self.started, true) {
            if let PasswordMessageFamily::Raw(body) = &message {
                if !sasl_initial_layout(body) {
                    return Err(fatal(
                        ErrorKind::ProtocolViolation,
                        "malformed SASLInitialResponse message".into(),
                    ));
                }
            }
        }
        self.inner.next(client, message).await
    }
}

/// Whether `body` has a SASLInitialResponse's layout: a mechanism's name ended by a zero
/// byte, then the length of the data that follows (-1: none), then exactly that data.
fn sasl_initial_layout(body: &[u8]) -> bool {
    let Some(end) = body.iter().position(|b| *b == 0) else {
        return false;
    };
    let rest = &body[end + 1..];
    let Some((length, data)) = rest.split_first_chunk::<4>() else {
        return false;
    };
    match i32::from_be_bytes(*length) {
        -1 => data.is_empty(),
        n => usize::try_from(n).is_ok_and(|n| n == data.len()),
    }
}

/// The `password` method: the client sends its password in clear text, which is checked
/// against the verifier.
struct ClearText(Verifier);

#[async_trait]
impl AuthMechanism for ClearText {
    async fn begin(&mut self, _: &(dyn ClientInfo + Send + Sync)) -> PgWireResult<AuthState> {
        Ok(AuthState::InProgress(Authentication::CleartextPassword))
    }

    async fn next(
        &mut self,
        _: &(dyn ClientInfo + Send + Sync),
        message: PasswordMessageFamily,
    ) -> PgWireResult<AuthState> {
        let password = message.into_password()?.password;
        Ok(match self.0.accepts(&password) {
            true => AuthState::Ok {
                final_message: None,
                identity: None,
            },
            false => AuthState::Failed(PgWireError::InvalidPassword(String::new())),
        })
    }
}
