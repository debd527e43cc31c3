//! Connectors' options: what `WITH (...)` gives a source or a sink, taken option by option
//! by its connector, which refuses what it does not know.

use std::collections::BTreeMap;

use crate::error::{Error, ErrorKind, Result};

/// A new source's or sink's options (`WITH (...)` less `connector`, and its FORMAT clause's
/// as `format` and `encode`): each connector takes those it knows, and any left over is
/// refused.
#[derive(Debug)]
pub struct Options {
    left: Vec<(String, String)>,
    /// What the options are of, for errors: "source" or "sink".
    of: &'static str,
}

impl Options {
    /// Refuses an option given twice (42601, as PostgreSQL's "conflicting or redundant
    /// options").
    pub fn new(pairs: Vec<(String, String)>) -> Result<Options> {
        let mut seen = std::collections::HashSet::with_capacity(pairs.len());
        for (key, _) in &pairs {
            if !seen.insert(key.as_str()) {
                return Err(Error::syntax(format!(
                    "conflicting or redundant options: \"{key}\" is given twice"
                )));
            }
        }
        Ok(Options {
            left: pairs,
            of: "source",
        })
    }

    /// The options the catalog kept for a source (`Connector::create`'s), to read again.
    pub fn kept(options: &BTreeMap<String, String>) -> Options {
        Options {
            left: options
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            of: "source",
        }
    }

    /// The same options as a sink's.
    pub fn of_sink(self) -> Options {
        Options { of: "sink", ..self }
    }

    pub fn take(&mut self, key: &str) -> Option<String> {
        let at = self.left.iter().position(|(k, _)| k == key)?;
        Some(self.left.remove(at).1)
    }

    /// Takes every option whose key starts with `prefix`, keyed by the rest of it.
    pub fn take_prefixed(&mut self, prefix: &str) -> Vec<(String, String)> {
        let (taken, left) = std::mem::take(&mut self.left)
            .into_iter()
            .partition(|(k, _)| k.starts_with(prefix));
        self.left = left;
        taken
            .into_iter()
            .map(|(k, v): (String, String)| (k[prefix.len()..].to_string(), v))
            .collect()
    }

    /// A Kafka client's settings: every `properties.<name>` option, under librdkafka's name
    /// (RisingWave's `bootstrap.server` is librdkafka's `bootstrap.servers`). Those that would
    /// have the server load code or run a command are refused (42501).
    pub fn take_kafka_properties(&mut self) -> Result<BTreeMap<String, String>> {
        let properties: BTreeMap<String, String> = (self.take_prefixed("properties."))
            .into_iter()
            .map(|(key, value)| match key.as_str() {
                "bootstrap.server" => ("bootstrap.servers".to_string(), value),
                _ => (key, value),
            })
            .collect();
        if let Some(key) = KAFKA_REFUSED.iter().find(|k| properties.contains_key(**k)) {
            return Err(Error::new(
                ErrorKind::InsufficientPrivilege,
                format!("permission denied to set properties.{key}"),
            )
            .with_detail("It would have the server load code or run a command of its host."));
        }
        Ok(properties)
    }

    /// Refuses the first option no connector took.
    pub fn finish(self) -> Result<()> {
        match self.left.first() {
            Some((key, _)) => Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("unknown {} option \"{key}\"", self.of),
            )),
            None => Ok(()),
        }
    }
}

/// librdkafka settings that load code or run commands on the server's host (a plugin, an
/// OpenSSL engine or provider, Kerberos' `kinit`): refused for every role.
const KAFKA_REFUSED: [&str; 4] = [
    "plugin.library.paths",
    "ssl.engine.location",
    "ssl.providers",
    "sasl.kerberos.kinit.cmd",
];

/// librdkafka settings that name files of the server's (certificates, keys, a keytab): a
/// Kafka connector's kept options name them as `properties.<name>`, confined as a `file`
/// connector's path is (`connector/paths.rs`). The `*.pem` settings take the same contents
/// inline instead.
const KAFKA_FILES: [&str; 8] = [
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.crl.location",
    "ssl.keystore.location",
    "sasl.kerberos.keytab",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.jwt.template.file",
];

/// The server's files a Kafka connector's kept options name (`KAFKA_FILES`).
pub fn kafka_server_paths(kept: &BTreeMap<String, String>) -> Vec<&str> {
    (KAFKA_FILES.iter())
        .filter_map(|name| kept.get(&format!("properties.{name}")))
        .map(String::as_str)
        .collect()
}

/// Reads option `key` as a count (`events = 1000`); `None` when absent.
pub fn count(key: &str, value: Option<String>) -> Result<Option<u64>> {
    value
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                Error::new(
                    ErrorKind::InvalidParameter,
                    format!("{key} must be a non-negative integer, not \"{v}\""),
                )
            })
        })
        .transpose()
}

/// Reads `true` or `false` (any case); `None` when absent.
pub fn flag(key: &str, value: Option<String>) -> Result<Option<bool>> {
    match value.as_deref().map(str::to_lowercase).as_deref() {
        None => Ok(None),
        Some("false") => Ok(Some(false)),
        Some("true") => Ok(Some(true)),
        Some(other) => Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("{key} must be true or false, not \"{other}\""),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_given_twice_or_unknown_are_refused() {
        let pairs = |p: &[(&str, &str)]| {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let twice = Options::new(pairs(&[("path", "a"), ("path", "b")])).unwrap_err();
        assert_eq!(twice.kind, ErrorKind::Syntax);
        let mut o = Options::new(pairs(&[("path", "a"), ("colour", "red")])).unwrap();
        assert_eq!(o.take("path").as_deref(), Some("a"));
        assert_eq!(o.take("path"), None);
        let e = o.finish().unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidParameter);
        assert!(e.message.contains("colour"), "{e}");
        assert!(e.message.starts_with("unknown source option"), "{e}");
        let mut o = Options::new(pairs(&[("colour", "red")])).unwrap().of_sink();
        assert!(o.take("path").is_none());
        let e = o.finish().unwrap_err();
        assert!(e.message.starts_with("unknown sink option"), "{e}");
    }
}
