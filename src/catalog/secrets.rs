//! Secrets (`CREATE SECRET`, `docs/design/0021-secrets.md`): values that connectors' options
//! name (`password = SECRET pg_password`) instead of holding. The catalog keeps each value
//! only sealed (AES-256-GCM) under the server's secret key, so neither the data directory nor
//! a checkpoint's copy of the catalog holds one in clear. A connector keeps which of its
//! options are secrets and by what name; their values are put into its options only in
//! memory, when the catalog is opened with the key.

use std::collections::BTreeMap;

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use super::{Catalog, Connector, Object};
use crate::error::{Error, ErrorKind, Result};

/// A secret: its name, its owner and its value, sealed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretDef {
    pub name: String,
    /// The role that created it: it alone (and superusers) may use, change or drop it.
    pub owner: u32,
    /// Where the value is kept: `meta`, the catalog, is the one backend there is.
    pub backend: String,
    sealed: Sealed,
}

/// A value encrypted with the secret's name as associated data, so that a sealed value
/// cannot be moved to another secret's entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Sealed {
    /// The fingerprint of the key that sealed it: which of the server's keys opens it, and
    /// whether a start should seal it again under the current key.
    key: String,
    /// The 96-bit nonce, in base64: random for each sealing.
    nonce: String,
    /// The ciphertext and its tag, in base64.
    value: String,
}

/// A 256-bit AES key, given as 64 hexadecimal digits (`openssl rand -hex 32`).
#[derive(Clone)]
pub struct SecretKey {
    key: [u8; 32],
    /// A name for the key that says nothing of it (`fingerprint_of`), computed once.
    fingerprint: String,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", self.fingerprint)
    }
}

fn unavailable(message: String) -> Error {
    Error::new(ErrorKind::ObjectNotInPrerequisiteState, message)
}

impl SecretKey {
    /// Reads 64 hexadecimal digits; anything else is refused without being repeated.
    pub fn parse(text: &str) -> Result<SecretKey> {
        let text = text.trim();
        let bad = || {
            Error::new(
                ErrorKind::InvalidParameter,
                "a secret key must be 64 hexadecimal digits (256 bits)",
            )
            .with_hint("Make one with: openssl rand -hex 32")
        };
        if text.len() != 64 || !text.is_ascii() {
            return Err(bad());
        }
        let mut key = [0u8; 32];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(SecretKey {
            key,
            fingerprint: fingerprint_of(&key),
        })
    }

    fn aead(&self) -> LessSafeKey {
        // A 32-byte key is always one AES-256-GCM takes.
        let key = UnboundKey::new(&AES_256_GCM, &self.key).expect("a 256-bit key");
        LessSafeKey::new(key)
    }
}

/// A name for `key` that says nothing of it: the first 8 bytes of a SHA-256 of it, in
/// hexadecimal.
fn fingerprint_of(key: &[u8; 32]) -> String {
    let mut input = b"weir secret key\0".to_vec();
    input.extend_from_slice(key);
    let digest = ring::digest::digest(&ring::digest::SHA256, &input);
    (digest.as_ref()[..8].iter())
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The server's secret keys: the current one seals; it and the previous ones open (a key
/// being rotated out). Without a current key no secret can be created, and those in the
/// catalog stay sealed.
#[derive(Debug, Clone, Default)]
pub struct SecretKeys {
    current: Option<SecretKey>,
    previous: Vec<SecretKey>,
}

impl SecretKeys {
    pub fn new(current: Option<&str>, previous: &[String]) -> Result<SecretKeys> {
        Ok(SecretKeys {
            current: current.map(SecretKey::parse).transpose()?,
            previous: (previous.iter())
                .map(|k| SecretKey::parse(k))
                .collect::<Result<_>>()?,
        })
    }

    /// Seals secret `name`'s `value` under the current key.
    fn seal(&self, name: &str, value: &str) -> Result<Sealed> {
        let key = self.current.as_ref().ok_or_else(|| {
            unavailable("the server has no secret key to encrypt secrets with".to_string())
                .with_hint(
                    "Set secret_key in the config file or the WEIR_SECRET_KEY environment \
                     variable (64 hexadecimal digits: openssl rand -hex 32).",
                )
        })?;
        let mut nonce = [0u8; NONCE_LEN];
        (SystemRandom::new().fill(&mut nonce))
            .map_err(|_| Error::internal("the system's random numbers are unavailable"))?;
        let mut value = value.as_bytes().to_vec();
        key.aead()
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(name.as_bytes()),
                &mut value,
            )
            .map_err(|_| Error::internal("a secret could not be encrypted"))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok(Sealed {
            key: key.fingerprint.clone(),
            nonce: b64.encode(nonce),
            value: b64.encode(value),
        })
    }

    /// Opens secret `name`'s sealed value with the key that sealed it.
    fn open(&self, name: &str, sealed: &Sealed) -> Result<String> {
        let key = (self.current.iter().chain(&self.previous))
            .find(|k| k.fingerprint == sealed.key)
            .ok_or_else(|| {
                unavailable(format!(
                    "secret \"{name}\" cannot be decrypted: the server does not have the key it \
                     was encrypted with"
                ))
                .with_hint(
                    "Start the server with the secret key it had (secret_key or \
                     WEIR_SECRET_KEY), or the new key with the old one among \
                     secret_keys_previous.",
                )
            })?;
        let corrupt = || {
            Error::new(
                ErrorKind::DataCorruption,
                format!("secret \"{name}\"'s encrypted value is damaged"),
            )
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        let nonce: [u8; NONCE_LEN] = (b64.decode(&sealed.nonce).ok())
            .and_then(|n| n.try_into().ok())
            .ok_or_else(corrupt)?;
        let mut value = b64.decode(&sealed.value).map_err(|_| corrupt())?;
        let plain = (key.aead())
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(name.as_bytes()),
                &mut value,
            )
            .map_err(|_| corrupt())?;
        String::from_utf8(plain.to_vec()).map_err(|_| corrupt())
    }

    /// Whether `sealed` is sealed under a key other than the current one.
    fn is_stale(&self, sealed: &Sealed) -> bool {
        (self.current.as_ref()).is_some_and(|k| k.fingerprint != sealed.key)
    }
}

impl SecretDef {
    /// A new secret, sealed under `keys`' current key.
    pub fn new(name: &str, owner: u32, value: &str, keys: &SecretKeys) -> Result<SecretDef> {
        Ok(SecretDef {
            name: name.to_string(),
            owner,
            backend: "meta".to_string(),
            sealed: keys.seal(name, value)?,
        })
    }

    /// The value, opened with `keys`.
    pub fn value(&self, keys: &SecretKeys) -> Result<String> {
        keys.open(&self.name, &self.sealed)
    }
}

impl Connector {
    /// Refuses (55000) a connector whose secret options were not put in when the catalog was
    /// opened: the server lacks the key that opens them.
    pub fn check_secrets(&self) -> Result<()> {
        match (self.secrets.iter()).find(|(option, _)| !self.options.contains_key(*option)) {
            Some((option, name)) => Err(unavailable(format!(
                "option \"{option}\" names secret \"{name}\", which the server cannot decrypt"
            ))
            .with_hint(
                "Start the server with the secret key the secret was encrypted with \
                 (secret_key or WEIR_SECRET_KEY).",
            )),
            None => Ok(()),
        }
    }
}

/// 42704 for a secret that does not exist.
pub fn undefined_secret(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedObject,
        format!("secret \"{name}\" does not exist"),
    )
}

impl Catalog {
    pub fn secrets(&self) -> &[SecretDef] {
        &self.data.secrets
    }

    pub fn secret(&self, name: &str) -> Option<&SecretDef> {
        self.data.secrets.iter().find(|s| s.name == name)
    }

    /// Adds or replaces secret `def` (by name) and saves the catalog; the connectors that
    /// name it take its new value in memory (`value`). On failure the catalog is as before.
    pub fn put_secret(&mut self, def: SecretDef, value: &str) -> Result<()> {
        let before = self.data.secrets.clone();
        match self.data.secrets.iter_mut().find(|s| s.name == def.name) {
            Some(s) => *s = def.clone(),
            None => self.data.secrets.push(def.clone()),
        }
        self.save().inspect_err(|_| self.data.secrets = before)?;
        for c in self.connectors_mut() {
            let options: Vec<String> = (c.secrets.iter())
                .filter(|(_, n)| **n == def.name)
                .map(|(o, _)| o.clone())
                .collect();
            for option in options {
                c.options.insert(option, value.to_string());
            }
        }
        Ok(())
    }

    /// Drops secret `name` and saves the catalog; refused (2BP01) while a connector names it.
    pub fn drop_secret(&mut self, name: &str) -> Result<()> {
        let users: Vec<String> = (self.data.objects.iter())
            .filter(|o| connector_of(o).is_some_and(|c| c.secrets.values().any(|n| n == name)))
            .map(|o| format!("{} {} depends on secret {name}", o.kind_name(), o.name()))
            .collect();
        if !users.is_empty() {
            return Err(Error::new(
                ErrorKind::DependentObjects,
                format!("cannot drop secret {name} because other objects depend on it"),
            )
            .with_detail(users.join("\n")));
        }
        let before = self.data.secrets.clone();
        self.data.secrets.retain(|s| s.name != name);
        self.save().inspect_err(|_| self.data.secrets = before)
    }

    /// Opens every secret the connectors name and puts its value into their options, in
    /// memory; seals again under the current key (and saves) those sealed under a previous
    /// one. A secret that cannot be opened is left out (`Connector::check_secrets` refuses
    /// its connector) and reported in the returned list.
    pub fn unseal_secrets(&mut self, keys: &SecretKeys) -> Result<Vec<Error>> {
        let mut problems = Vec::new();
        let mut values = BTreeMap::new();
        let mut resealed = Vec::new();
        for s in &self.data.secrets {
            match s.value(keys) {
                Ok(v) => {
                    if keys.is_stale(&s.sealed) {
                        resealed.push((s.name.clone(), keys.seal(&s.name, &v)?));
                    }
                    values.insert(s.name.clone(), v);
                }
                Err(e) => problems.push(e),
            }
        }
        for c in self.connectors_mut() {
            for (option, name) in &c.secrets {
                if let Some(v) = values.get(name) {
                    c.options.insert(option.clone(), v.clone());
                }
            }
        }
        if !resealed.is_empty() {
            let before = self.data.secrets.clone();
            for (name, sealed) in resealed {
                if let Some(s) = self.data.secrets.iter_mut().find(|s| s.name == name) {
                    s.sealed = sealed;
                }
            }
            self.save().inspect_err(|_| self.data.secrets = before)?;
        }
        Ok(problems)
    }

    fn connectors_mut(&mut self) -> impl Iterator<Item = &mut Connector> {
        self.data.objects.iter_mut().filter_map(|o| match o {
            Object::Table(t) => t.connector.as_mut(),
            Object::Source(s) => Some(&mut s.connector),
            Object::View(v) => v.sink_to.as_mut(),
        })
    }
}

/// The connector of a table, source or sink, if it has one.
fn connector_of(o: &Object) -> Option<&Connector> {
    match o {
        Object::Table(t) => t.connector.as_ref(),
        Object::Source(s) => Some(&s.connector),
        Object::View(v) => v.sink_to.as_ref(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const OTHER: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    #[test]
    fn a_secret_opens_only_with_its_key_and_its_name() {
        let keys = SecretKeys::new(Some(KEY), &[]).unwrap();
        let s = SecretDef::new("pw", 10, "hunter2", &keys).unwrap();
        let text = serde_json::to_string(&s).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(s.value(&keys).unwrap(), "hunter2");
        let other = SecretKeys::new(Some(OTHER), &[]).unwrap();
        let e = s.value(&other).unwrap_err();
        assert_eq!(e.kind, ErrorKind::ObjectNotInPrerequisiteState);
        // Rotated: the old key opens it, and it is stale until sealed again.
        let rotated = SecretKeys::new(Some(OTHER), &[KEY.to_string()]).unwrap();
        assert_eq!(s.value(&rotated).unwrap(), "hunter2");
        assert!(rotated.is_stale(&s.sealed) && !keys.is_stale(&s.sealed));
        // Moved to another name, the value does not open.
        let moved = SecretDef {
            name: "other".into(),
            ..s.clone()
        };
        assert_eq!(
            moved.value(&keys).unwrap_err().kind,
            ErrorKind::DataCorruption
        );
        // Two sealings of one value differ (a fresh nonce each time).
        let again = SecretDef::new("pw", 10, "hunter2", &keys).unwrap();
        assert_ne!(again.sealed, s.sealed);
        assert!(SecretDef::new("pw", 10, "x", &SecretKeys::default()).is_err());
    }

    #[test]
    fn a_connector_saves_and_shows_its_secrets_by_name() {
        let mut c = Connector::plain(
            "postgres",
            BTreeMap::from([
                ("password".to_string(), "hunter2".to_string()),
                ("hostname".to_string(), "db".to_string()),
            ]),
        );
        c.secrets.insert("password".into(), "pw".into());
        let saved = serde_json::to_string(&c).unwrap();
        let shown = format!("{c:?}");
        for text in [&saved, &shown] {
            assert!(
                text.contains("\"pw\"") && !text.contains("hunter2"),
                "{text}"
            );
        }
        let read: Connector = serde_json::from_str(&saved).unwrap();
        assert_eq!(read.secrets, c.secrets);
        assert_eq!(
            read.check_secrets().unwrap_err().kind,
            ErrorKind::ObjectNotInPrerequisiteState
        );
        assert!(c.check_secrets().is_ok());
    }

    #[test]
    fn keys_are_64_hexadecimal_digits() {
        assert!(SecretKey::parse(KEY).is_ok());
        for bad in ["", "00", &KEY[1..], &format!("{}zz", &KEY[2..]), "é"] {
            assert_eq!(
                SecretKey::parse(bad).unwrap_err().kind,
                ErrorKind::InvalidParameter,
                "{bad}"
            );
        }
        assert!(!format!("{:?}", SecretKey::parse(KEY).unwrap()).contains("0102"));
    }
}
