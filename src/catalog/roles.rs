//! Roles (`CREATE ROLE`, `CREATE USER`): who may log in, with what attributes, and their
//! passwords, kept only as SCRAM-SHA-256 verifiers in PostgreSQL's text form
//! (`docs/design/0019-authentication.md`). The verifier's computation and the check of a
//! clear-text password against it are here; the SCRAM exchange is `server/`'s.

use std::num::NonZeroU32;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ring::{digest, hmac, pbkdf2};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// The bootstrap superuser's name, created at the first start.
pub const BOOTSTRAP_ROLE: &str = "weir";

/// The bootstrap superuser's OID, as PostgreSQL's.
pub const BOOTSTRAP_OID: u32 = 10;

/// The iteration count of new verifiers (PostgreSQL's `scram_iterations` default).
pub const SCRAM_ITERATIONS: u32 = 4096;

/// The most iterations a verifier given as text may ask for: each login derives a key with
/// that many rounds.
const SCRAM_ITERATIONS_MAX: u32 = 1 << 20;

/// A role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleDef {
    pub oid: u32,
    pub name: String,
    pub superuser: bool,
    /// Whether the role may connect (`LOGIN`); `CREATE USER` gives it, `CREATE ROLE` not.
    pub login: bool,
    pub create_role: bool,
    pub create_db: bool,
    /// The most connections the role may hold at once; -1: no limit.
    pub connection_limit: i32,
    /// Whether the role has the privileges of the roles it is a member of (`INHERIT`, the
    /// default) or only may be granted them.
    #[serde(default = "inherits")]
    pub inherit: bool,
    /// The password's SCRAM-SHA-256 verifier; `None`: the role has no password, and only a
    /// `trust` rule admits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Verifier>,
    /// `ALTER ROLE ... SET name = value`: settings each of its sessions starts with, in the
    /// order they were first set (as `pg_roles.rolconfig` lists them).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "settings_in_either_form"
    )]
    pub settings: Vec<(String, String)>,
}

fn inherits() -> bool {
    true
}

/// A role's settings as a list of pairs, or as the object by name an earlier build of this
/// catalog format wrote.
fn settings_in_either_form<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<(String, String)>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        List(Vec<(String, String)>),
        ByName(std::collections::BTreeMap<String, String>),
    }
    Ok(match Either::deserialize(d)? {
        Either::List(list) => list,
        Either::ByName(map) => map.into_iter().collect(),
    })
}

impl RoleDef {
    /// A role of no attribute but `login`, without a password.
    pub fn new(oid: u32, name: &str, login: bool) -> RoleDef {
        RoleDef {
            oid,
            name: name.to_string(),
            superuser: false,
            login,
            create_role: false,
            create_db: false,
            connection_limit: -1,
            inherit: true,
            password: None,
            settings: Default::default(),
        }
    }
}

/// A SCRAM-SHA-256 verifier: what checks a password without holding it.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    /// `H(HMAC(SaltedPassword, "Client Key"))`
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier(********)")
    }
}

impl Serialize for Verifier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_text())
    }
}

impl<'de> Deserialize<'de> for Verifier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Verifier::parse(&text).ok_or_else(|| serde::de::Error::custom("not a SCRAM verifier"))
    }
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&key, message).as_ref().to_vec()
}

/// `Hi(password, salt, iterations)`, RFC 5802's salted password, over the password as SASLprep
/// normalizes it (or as it is, where it is not valid for SASLprep, as PostgreSQL does).
fn salted_password(password: &str, salt: &[u8], iterations: u32) -> Vec<u8> {
    let prepared = stringprep::saslprep(password)
        .map(|p| p.into_owned())
        .unwrap_or_else(|_| password.to_string());
    let mut out = vec![0u8; digest::SHA256_OUTPUT_LEN];
    let rounds = NonZeroU32::new(iterations).unwrap_or(NonZeroU32::MIN);
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        rounds,
        salt,
        prepared.as_bytes(),
        &mut out,
    );
    out
}

impl Verifier {
    /// The verifier of `password` with a new random salt.
    pub fn of_password(password: &str) -> Result<Verifier> {
        let mut salt = vec![0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt)
            .map_err(|_| Error::internal("no random bytes for a password's salt"))?;
        Ok(Verifier::derive(password, salt, SCRAM_ITERATIONS))
    }

    fn derive(password: &str, salt: Vec<u8>, iterations: u32) -> Verifier {
        let salted = salted_password(password, &salt, iterations);
        let client_key = hmac_sha256(&salted, b"Client Key");
        Verifier {
            iterations,
            stored_key: digest::digest(&digest::SHA256, &client_key)
                .as_ref()
                .to_vec(),
            server_key: hmac_sha256(&salted, b"Server Key"),
            salt,
        }
    }

    /// A password as a statement gives it: a verifier's text is kept as it is (pg_dump's
    /// `ALTER ROLE ... PASSWORD 'SCRAM-SHA-256$...'`), anything else is a clear-text password.
    pub fn of_statement(password: &str) -> Result<Verifier> {
        if password.starts_with("SCRAM-SHA-256$") {
            return Verifier::parse(password).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidParameter,
                    "the password looks like a SCRAM-SHA-256 verifier but is not one",
                )
            });
        }
        if password.starts_with("md5") && password.len() == 35 {
            return Err(
                Error::not_supported("MD5-hashed passwords are not supported")
                    .with_hint("Give the password in clear text, or as a SCRAM-SHA-256 verifier."),
            );
        }
        Verifier::of_password(password)
    }

    /// Whether `password` (clear text, as the `password` method receives it) is the one this
    /// verifier was made from.
    pub fn accepts(&self, password: &str) -> bool {
        let derived = Verifier::derive(password, self.salt.clone(), self.iterations);
        same_bytes(&derived.stored_key, &self.stored_key)
    }

    /// PostgreSQL's text form: `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    pub fn to_text(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            BASE64.encode(&self.salt),
            BASE64.encode(&self.stored_key),
            BASE64.encode(&self.server_key)
        )
    }

    pub fn parse(text: &str) -> Option<Verifier> {
        let rest = text.strip_prefix("SCRAM-SHA-256$")?;
        let (head, keys) = rest.split_once('$')?;
        let (iterations, salt) = head.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        let iterations: u32 = iterations.parse().ok()?;
        let verifier = Verifier {
            iterations,
            salt: BASE64.decode(salt).ok()?,
            stored_key: BASE64.decode(stored).ok()?,
            server_key: BASE64.decode(server).ok()?,
        };
        let sized = |k: &[u8]| k.len() == digest::SHA256_OUTPUT_LEN;
        let valid = (1..=SCRAM_ITERATIONS_MAX).contains(&iterations)
            && !verifier.salt.is_empty()
            && sized(&verifier.stored_key)
            && sized(&verifier.server_key);
        valid.then_some(verifier)
    }
}

impl super::Catalog {
    /// The roles, in creation order.
    pub fn roles(&self) -> &[RoleDef] {
        &self.data.roles
    }

    pub fn role(&self, name: &str) -> Option<&RoleDef> {
        self.data.roles.iter().find(|r| r.name == name)
    }

    /// Adds `role`, or replaces the role of its name, and saves the catalog; on failure the
    /// catalog is as before.
    pub fn put_role(&mut self, role: RoleDef) -> Result<()> {
        let before = self.data.roles.clone();
        match self.data.roles.iter_mut().find(|r| r.name == role.name) {
            Some(r) => *r = role,
            None => self.data.roles.push(role),
        }
        self.save().inspect_err(|_| self.data.roles = before)
    }

    /// Removes the role `name`, and its memberships, and saves the catalog; on failure the
    /// catalog is as before.
    pub fn remove_role(&mut self, name: &str) -> Result<()> {
        let before = (self.data.roles.clone(), self.data.members.clone());
        if let Some(oid) = self.role(name).map(|r| r.oid) {
            (self.data.members).retain(|m| m.role != oid && m.member != oid);
        }
        self.data.roles.retain(|r| r.name != name);
        self.save()
            .inspect_err(|_| (self.data.roles, self.data.members) = before)
    }

    /// A catalog without roles (new, or of a version before them) gets the bootstrap
    /// superuser, with `password`'s verifier if one is given; whether it had none.
    pub(super) fn bootstrap_roles(&mut self, password: Option<Verifier>) -> bool {
        if !self.data.roles.is_empty() {
            return false;
        }
        let mut weir = RoleDef::new(BOOTSTRAP_OID, BOOTSTRAP_ROLE, true);
        weir.superuser = true;
        weir.create_role = true;
        weir.create_db = true;
        weir.password = password;
        self.data.roles.push(weir);
        true
    }
}

/// Whether `a` and `b` are equal, compared in time independent of where they differ (keys,
/// tokens).
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {

    #[test]
    fn settings_read_as_a_list_or_by_name() {
        let role = |settings: &str| {
            let text = format!(
                "{{\"oid\":20,\"name\":\"a\",\"superuser\":false,\"login\":true,\
                 \"create_role\":false,\"create_db\":false,\"connection_limit\":-1,\
                 \"settings\":{settings}}}"
            );
            serde_json::from_str::<RoleDef>(&text).unwrap().settings
        };
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            role("[[\"x\",\"1\"],[\"a\",\"2\"]]"),
            [pair("x", "1"), pair("a", "2")]
        );
        assert_eq!(role("{\"x\":\"1\"}"), [pair("x", "1")]);
    }

    use super::*;

    #[test]
    fn a_verifier_accepts_its_password_only_and_reads_back_from_its_text() {
        let v = Verifier::of_password("s3cret").unwrap();
        assert!(v.accepts("s3cret"));
        assert!(!v.accepts("s3cret "));
        assert!(!v.accepts(""));
        let text = v.to_text();
        assert!(text.starts_with("SCRAM-SHA-256$4096:"), "{text}");
        assert!(!text.contains("s3cret"));
        assert_eq!(Verifier::parse(&text), Some(v.clone()));
        assert_eq!(Verifier::of_statement(&text).unwrap(), v);
        // Two verifiers of one password differ by their salts.
        assert_ne!(Verifier::of_password("s3cret").unwrap(), v);
        assert_eq!(format!("{v:?}"), "Verifier(********)");
    }

    #[test]
    fn postgresql_s_verifier_of_a_password_checks_it() {
        // `SELECT rolpassword FROM pg_authid` in PostgreSQL 15 after
        // `CREATE ROLE u PASSWORD 'pencil'`.
        let pg = "SCRAM-SHA-256$4096:4CEUWcyKenxpTQLlpsDBtQ==$\
                  POgzKMGk7hIkImVv9P5NayKL/eXfR6SlmPgaEAyrWfk=:\
                  i8hhLbMrBj6KJbtkzBjRkuU0Y0VD6J+X4oiMnvatrjs=";
        let v = Verifier::parse(pg).unwrap();
        assert!(v.accepts("pencil"));
        assert!(!v.accepts("pencils"));
    }

    #[test]
    fn malformed_verifiers_and_md5_hashes_are_refused() {
        for bad in [
            "SCRAM-SHA-256$",
            "SCRAM-SHA-256$0:c2FsdA==$AA==:AA==",
            "SCRAM-SHA-256$99999999999:c2FsdA==$AA==:AA==",
            "SCRAM-SHA-256$4096:c2FsdA==$AA==:AA==",
        ] {
            assert!(Verifier::of_statement(bad).is_err(), "{bad}");
        }
        let md5 = format!("md5{}", "0".repeat(32));
        assert_eq!(
            Verifier::of_statement(&md5).unwrap_err().kind,
            ErrorKind::NotSupported
        );
    }
}
