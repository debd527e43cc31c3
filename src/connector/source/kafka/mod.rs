//! `connector = 'kafka'`: a topic's messages as a source's rows, `FORMAT PLAIN ENCODE JSON`
//! (or `ENCODE CSV`), each message's value one row of the declared columns, followed by the
//! metadata columns the source includes (`INCLUDE key | partition | offset | timestamp`).
//!
//! Its splits are the topic's partitions, each holding the next offset to read: the feed
//! records them with the rows and checkpoints keep them, so a restart reads on from exactly
//! where the views' state ends. Where the source starts (`scan.startup.mode`) is resolved into
//! offsets per partition once, at `CREATE SOURCE`, and kept with its options, so that the
//! start means the same messages at every restart even after the broker's retention has
//! moved the topic's own start. A view created later reads each partition again from there
//! up to where the source was at the view's barrier. Offsets are never read from a consumer
//! group. See `docs/design/0011-kafka-source.md`.
//!
//! `config` reads the options, `reader` reads the topic.
//!
//! It feeds tables too (`FORMAT UPSERT`, `DEBEZIUM`, or `PLAIN` by primary key: see
//! `docs/design/0012-connector-tables.md`). After each checkpoint its offsets go to the
//! consumer group `weir-<source>`, for the usual lag tools; nothing reads them back.
//!
//! TODO (issue 20): parallel readers (partitions split across a source's actors). Decoding
//! each batch on a task of its own, two at once, was tried: on 2 cores beside the broker
//! (`bench/connectors/run`) it read no faster (611 000-623 000 messages/s against
//! 607 000-685 000) and cost 5 % more CPU per message, the broker taking the other core. Worth
//! measuring again where the broker runs on other machines.

mod config;
mod reader;
mod rows;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::error::KafkaError;

use self::config::{Config, Format};
use super::{Keep, Options, Start};
use crate::catalog::{ColumnDef, SourceDef};
use crate::error::{Error, ErrorKind, Result};

/// Reads Kafka topics.
pub struct Kafka;

/// How long a call to the broker at `CREATE SOURCE` (its partitions, their offsets) may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// A broker that cannot be reached or refused what was asked (08001).
fn unreachable(e: KafkaError) -> Error {
    Error::new(
        ErrorKind::ConnectionFailure,
        format!("could not read from the Kafka broker: {e}"),
    )
    .with_hint("Check properties.bootstrap.server and that the broker is up.")
}

impl super::Connector for Kafka {
    fn name(&self) -> &'static str {
        "kafka"
    }

    /// Certificates, keys and keytabs that librdkafka settings name are the server's files.
    fn server_paths<'a>(&self, kept: &'a BTreeMap<String, String>) -> Vec<&'a str> {
        crate::connector::options::kafka_server_paths(kept)
    }

    fn create(
        &self,
        options: &mut Options,
        declared: Vec<ColumnDef>,
        table: Option<&[usize]>,
    ) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)> {
        let mut config = Config::read(options)?;
        if declared.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                "a Kafka source needs its columns declared",
            ));
        }
        if config.format != Format::Plain && table.is_none_or(<[usize]>::is_empty) {
            return Err(Error::not_supported(format!(
                "FORMAT {} gives changes by key: it feeds a table with a primary key",
                config.format.name().to_uppercase()
            ))
            .with_hint(
                "CREATE TABLE t (..., PRIMARY KEY (...)) WITH (connector = 'kafka', ...) \
                 FORMAT UPSERT ENCODE JSON.",
            ));
        }
        let columns = config.columns(declared)?;
        if config.start.is_none() {
            config.start = Some(crate::blocking(|| config.resolve_start())?);
        }
        Ok((config.kept(), columns))
    }

    /// A late view reads each partition again from the source's start: refused (55000) when
    /// the broker no longer holds a partition's first messages (retention), which the view
    /// could then not hold.
    fn check_read_again(&self, def: &SourceDef, rows: u64) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let config = Config::read(&mut Options::kept(&def.connector.options))?;
        let start = config.start.clone().unwrap_or_default();
        let first = crate::blocking(|| config.first_offsets(start.keys().copied()))?;
        match first_lost(&start, &first) {
            Some((p, first)) => Err(Error::new(
                ErrorKind::ObjectNotInPrerequisiteState,
                format!(
                    "Kafka source \"{}\" cannot be read again for a new view: partition {p} of \
                     topic \"{}\" starts at offset {first} now, after the source's start at {}",
                    def.name, config.topic, start[&p]
                ),
            )
            .with_hint(
                "The broker no longer holds messages the source read (retention): create the \
                 view over a new source, or before the broker drops messages.",
            )),
            None => Ok(()),
        }
    }

    fn open(
        &self,
        def: &SourceDef,
        start: Start<'_>,
        keep: Option<Keep<'_>>,
    ) -> Result<Box<dyn super::Reader>> {
        let config = Config::read(&mut Options::kept(&def.connector.options))?;
        let first = config.start.clone().unwrap_or_default();
        let mut next = first.clone();
        match start.splits {
            Some(splits) => next.extend(offsets(def, splits)?),
            None if start.rows == 0 => {}
            None => {
                return Err(Error::internal(format!(
                    "Kafka source \"{}\" was asked to resume after {} rows without its offsets",
                    def.name, start.rows
                )))
            }
        }
        // Read again for a new view: each partition from the source's start up to where the
        // source was at the barrier (a partition added later: from its first offset).
        let until = match keep.filter(|k| !k.own) {
            Some(k) => {
                let until = match k.until {
                    Some(splits) => offsets(def, splits)?,
                    None if k.checked == 0 => BTreeMap::new(),
                    None => {
                        return Err(Error::internal(format!(
                            "Kafka source \"{}\" was asked to read {} rows again without its \
                             offsets",
                            def.name, k.checked
                        )))
                    }
                };
                next = until
                    .keys()
                    .map(|p| (*p, first.get(p).copied().unwrap_or(0)))
                    .collect();
                next.retain(|p, o| until.get(p).is_some_and(|u| u > o));
                Some(until)
            }
            None => None,
        };
        let progress = keep.and_then(|k| k.progress).cloned();
        let durable = keep.and_then(|k| k.durable).cloned();
        let reader = reader::KafkaReader::open(def, config, (next, until), progress, durable)?;
        Ok(Box::new(reader))
    }
}

/// The first partition whose first offset on the broker (`first`) is past the source's start
/// there, with that offset: messages the source read that the broker no longer holds.
fn first_lost(start: &BTreeMap<i32, i64>, first: &BTreeMap<i32, i64>) -> Option<(i32, i64)> {
    first
        .iter()
        .find(|(p, f)| start.get(p).is_some_and(|s| *f > s))
        .map(|(p, f)| (*p, *f))
}

/// A Kafka source's position as the checkpoints keep it: the next offset of each partition.
fn offsets(
    def: &SourceDef,
    splits: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<i32, i64>> {
    splits
        .iter()
        .map(
            |(split, offset)| match (split.parse::<i32>(), offset.as_i64()) {
                (Ok(p), Some(o)) => Ok((p, o)),
                _ => Err(Error::new(
                    ErrorKind::DataCorruption,
                    format!(
                        "Kafka source \"{}\" has a bad position {split}: {offset}",
                        def.name
                    ),
                )),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_whose_first_messages_are_gone_is_named() {
        let start = BTreeMap::from([(0, 0), (1, 10), (2, 5)]);
        assert_eq!(
            first_lost(&start, &BTreeMap::from([(0, 0), (1, 10), (2, 5)])),
            None
        );
        // A partition the source does not know yet has lost nothing of its own.
        assert_eq!(first_lost(&start, &BTreeMap::from([(0, 0), (3, 7)])), None);
        assert_eq!(
            first_lost(&start, &BTreeMap::from([(0, 0), (1, 11), (2, 9)])),
            Some((1, 11))
        );
    }
}
