//! A PostgreSQL CDC source's options: the upstream, its replication slot and publication, and
//! how its tables' snapshots are read.

use std::collections::BTreeMap;

use super::protocol::Endpoint;
use crate::connector::source::{count, Options};
use crate::error::{Error, ErrorKind, Result};

/// Rows per chunk of a table's snapshot, by default.
const SNAPSHOT_ROWS_DEFAULT: u64 = 10_000;
/// The most rows a chunk may be asked to have (a chunk is held whole until the stream reaches
/// its high watermark).
const SNAPSHOT_ROWS_MAX: u64 = 1_000_000;

pub struct Config {
    pub endpoint: Endpoint,
    pub slot: String,
    pub publication: String,
    /// Weir created the publication (and drops it with the source), or the slot.
    pub created_publication: bool,
    pub created_slot: bool,
    pub snapshot_rows: u64,
}

fn bad(message: String) -> Error {
    Error::new(ErrorKind::InvalidParameter, message)
}

/// A slot's or publication's name: PostgreSQL's rules for slots (lower-case letters, digits,
/// underscores), which also make it safe to write into replication commands unquoted.
fn name(option: &str, value: String) -> Result<String> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        return Err(bad(format!(
            "{option} must be 1 to 63 lower-case letters, digits and underscores, not \"{value}\""
        )));
    }
    Ok(value)
}

impl Config {
    pub fn read(options: &mut Options) -> Result<Config> {
        let required = |options: &mut Options, key: &str| {
            options
                .take(key)
                .ok_or_else(|| bad(format!("a postgres-cdc source needs {key}")))
        };
        let endpoint = Endpoint::read(options, "a postgres-cdc source")?;
        let slot = name("slot.name", required(options, "slot.name")?)?;
        let publication = match options.take("publication.name") {
            Some(p) => name("publication.name", p)?,
            None => slot.clone(),
        };
        let flag = |options: &mut Options, key: &str| {
            crate::connector::source::flag(key, options.take(key)).map(|f| f.unwrap_or(false))
        };
        let created_publication = flag(options, "publication.created")?;
        let created_slot = flag(options, "slot.created")?;
        let snapshot_rows = count("snapshot.batch_rows", options.take("snapshot.batch_rows"))?
            .unwrap_or(SNAPSHOT_ROWS_DEFAULT);
        if !(1..=SNAPSHOT_ROWS_MAX).contains(&snapshot_rows) {
            return Err(bad(format!(
                "snapshot.batch_rows must be from 1 to {SNAPSHOT_ROWS_MAX}, not {snapshot_rows}"
            )));
        }
        Ok(Config {
            endpoint,
            slot,
            publication,
            created_publication,
            created_slot,
            snapshot_rows,
        })
    }

    /// The options the catalog keeps, written out in full.
    pub fn kept(&self) -> BTreeMap<String, String> {
        let mut kept: BTreeMap<String, String> = self.endpoint.kept().into_iter().collect();
        kept.extend([
            ("slot.name".to_string(), self.slot.clone()),
            ("publication.name".to_string(), self.publication.clone()),
            (
                "publication.created".to_string(),
                self.created_publication.to_string(),
            ),
            ("slot.created".to_string(), self.created_slot.to_string()),
            (
                "snapshot.batch_rows".to_string(),
                self.snapshot_rows.to_string(),
            ),
        ]);
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> Options {
        Options::new(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn options_are_checked_and_kept() {
        let base = [
            ("hostname", "127.0.0.1"),
            ("username", "weir"),
            ("database.name", "shop"),
            ("slot.name", "weir_shop"),
        ];
        let mut o = options(&base);
        let c = Config::read(&mut o).unwrap();
        o.finish().unwrap();
        assert_eq!(
            (c.endpoint.port, c.publication.as_str()),
            (5432, "weir_shop")
        );
        let kept = c.kept();
        assert_eq!(
            Config::read(&mut Options::kept(&kept)).unwrap().kept(),
            kept
        );
        for bad in [
            ("slot.name", "Weir-Shop"),
            ("port", "99999"),
            ("snapshot.batch_rows", "0"),
            ("publication.name", "a;drop"),
        ] {
            let mut pairs: Vec<(&str, &str)> =
                base.iter().filter(|(k, _)| *k != bad.0).copied().collect();
            pairs.push(bad);
            let e = Config::read(&mut options(&pairs)).err().map(|e| e.kind);
            assert_eq!(e, Some(ErrorKind::InvalidParameter), "{bad:?}");
        }
        let e = Config::read(&mut options(&base[1..])).err().map(|e| e.kind);
        assert_eq!(e, Some(ErrorKind::InvalidParameter));
    }
}
