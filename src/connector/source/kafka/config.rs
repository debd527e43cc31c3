//! A Kafka source's options: read and checked at `CREATE SOURCE`, kept in the catalog written
//! out in full, and read again at every open.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::{unreachable, BROKER_TIMEOUT};
use crate::catalog::ColumnDef;
use crate::connector::source::decode::Encode;
use crate::connector::source::{count, Options};
use crate::error::{Error, ErrorKind, Result};
use crate::types::SqlType;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Its value is a row (into a table with a primary key: the row its key has now).
    Plain,
    /// Its value is the row its key has now, and a message without a value deletes the key's
    /// row (a compacted topic).
    Upsert,
    /// Its value is a Debezium change event (`before`, `after`, `op`).
    Debezium,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Plain => "plain",
            Format::Upsert => "upsert",
            Format::Debezium => "debezium",
        }
    }
}

/// What to do with a message that is not a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Count it, record it in `weir_catalog.source_errors`, and read on.
    Skip,
    /// Stop the source, with the reason in `weir_catalog.sources`.
    Fail,
}

/// A column of each message's metadata (`INCLUDE key | partition | offset | timestamp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Meta {
    /// The message's key, as text (invalid UTF-8 replaced).
    Key,
    Partition,
    Offset,
    /// The broker's or the producer's time of the message.
    Timestamp,
}

impl Meta {
    const ALL: [Meta; 4] = [Meta::Key, Meta::Partition, Meta::Offset, Meta::Timestamp];

    fn name(self) -> &'static str {
        match self {
            Meta::Key => "key",
            Meta::Partition => "partition",
            Meta::Offset => "offset",
            Meta::Timestamp => "timestamp",
        }
    }

    pub fn ty(self) -> SqlType {
        match self {
            Meta::Key => SqlType::Text,
            Meta::Partition => SqlType::Integer,
            Meta::Offset => SqlType::BigInt,
            Meta::Timestamp => SqlType::Timestamptz,
        }
    }
}

/// A Kafka source's options.
pub struct Config {
    pub topic: String,
    pub format: Format,
    /// librdkafka's settings: `bootstrap.servers` and every `properties.*` option.
    client: BTreeMap<String, String>,
    pub encode: Encode,
    /// `scan.startup.mode` as given.
    mode: String,
    timestamp_ms: Option<i64>,
    /// Where the source starts, per partition (resolved at `CREATE SOURCE`).
    pub start: Option<BTreeMap<i32, i64>>,
    pub on_error: OnError,
    /// The metadata columns and their names (in the order of the INCLUDE clauses at CREATE).
    pub include: Vec<(Meta, String)>,
    /// How long a partition may go without a message before the source's watermark stops
    /// waiting for it; 0: never.
    pub idle_timeout: Duration,
    /// How often the reader looks for partitions added to the topic; 0: never.
    pub discovery_interval: Duration,
}

impl Config {
    pub fn read(options: &mut Options) -> Result<Config> {
        let topic = options
            .take("topic")
            .ok_or_else(|| bad("a Kafka source needs a topic".into()))?;
        let client = options.take_kafka_properties()?;
        if !client.contains_key("bootstrap.servers") {
            return Err(bad(
                "a Kafka source needs properties.bootstrap.server".into()
            ));
        }
        for owned in [
            "group.id",
            "enable.auto.commit",
            "auto.offset.reset",
            "statistics.interval.ms",
        ] {
            if client.contains_key(owned) {
                return Err(bad(format!(
                    "properties.{owned} is Weir's to set: a Kafka source keeps its offsets in \
                     checkpoints"
                )));
            }
        }
        let format = match options.take("format").map(|f| f.to_lowercase()).as_deref() {
            None | Some("plain") => Format::Plain,
            Some("upsert") => Format::Upsert,
            Some("debezium") => Format::Debezium,
            Some(other) => {
                return Err(Error::not_supported(format!(
                    "Kafka sources and tables read FORMAT PLAIN, UPSERT or DEBEZIUM, not \
                     FORMAT {}",
                    other.to_uppercase()
                )))
            }
        };
        let encode = match options.take("encode").map(|e| e.to_lowercase()) {
            None => Encode::Json,
            Some(e) => match Encode::named(&e) {
                Some(Encode::Csv) if format != Format::Plain => {
                    return Err(Error::not_supported(format!(
                        "FORMAT {} reads ENCODE JSON, not ENCODE CSV",
                        format.name().to_uppercase()
                    )))
                }
                Some(encode @ (Encode::Json | Encode::Csv)) => encode,
                Some(Encode::Parquet) | None => {
                    return Err(Error::not_supported(format!(
                        "Kafka messages are read as ENCODE JSON or CSV, not ENCODE {}",
                        e.to_uppercase()
                    )))
                }
            },
        };
        let (mode, timestamp_ms, start) = startup(options)?;
        let on_error = match options
            .take("on_error")
            .map(|o| o.to_lowercase())
            .as_deref()
        {
            None | Some("skip") => OnError::Skip,
            Some("fail") => OnError::Fail,
            Some(other) => {
                return Err(bad(format!(
                    "on_error must be 'skip' or 'fail', not \"{other}\""
                )))
            }
        };
        let mut include = Vec::new();
        for (what, name) in options.take_prefixed("include.") {
            let meta = Meta::ALL
                .into_iter()
                .find(|m| m.name() == what)
                .ok_or_else(|| {
                    Error::not_supported(format!(
                        "a Kafka source cannot INCLUDE {what}: it includes key, partition, \
                         offset or timestamp"
                    ))
                })?;
            let name = if name.is_empty() {
                format!("_kafka_{what}")
            } else {
                name
            };
            include.push((meta, name));
        }
        let millis = |key: &str, default: u64, options: &mut Options| {
            count(key, options.take(key)).map(|v| Duration::from_millis(v.unwrap_or(default)))
        };
        let idle_timeout = millis("watermark.idle.timeout.ms", 10_000, options)?;
        let discovery_interval = millis("scan.partition.discovery.interval.ms", 10_000, options)?;
        Ok(Config {
            topic,
            format,
            client,
            encode,
            mode,
            timestamp_ms,
            start,
            on_error,
            include,
            idle_timeout,
            discovery_interval,
        })
    }

    /// The options the catalog keeps, written out in full.
    pub fn kept(&self) -> BTreeMap<String, String> {
        let mut kept = BTreeMap::from([
            ("topic".to_string(), self.topic.clone()),
            ("format".to_string(), self.format.name().to_string()),
            ("encode".to_string(), self.encode.name().to_string()),
            ("scan.startup.mode".to_string(), self.mode.clone()),
            (
                "on_error".to_string(),
                match self.on_error {
                    OnError::Skip => "skip",
                    OnError::Fail => "fail",
                }
                .to_string(),
            ),
            (
                "watermark.idle.timeout.ms".to_string(),
                self.idle_timeout.as_millis().to_string(),
            ),
            (
                "scan.partition.discovery.interval.ms".to_string(),
                self.discovery_interval.as_millis().to_string(),
            ),
        ]);
        for (key, value) in &self.client {
            let key = match key.as_str() {
                "bootstrap.servers" => "bootstrap.server",
                other => other,
            };
            kept.insert(format!("properties.{key}"), value.clone());
        }
        for (meta, name) in &self.include {
            kept.insert(format!("include.{}", meta.name()), name.clone());
        }
        if let Some(t) = self.timestamp_ms {
            kept.insert("scan.startup.timestamp.millis".into(), t.to_string());
        }
        if let Some(start) = &self.start {
            kept.insert(
                "scan.startup.specific.offsets".into(),
                start
                    .iter()
                    .map(|(p, o)| format!("{p}:{o}"))
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        kept
    }

    /// The source's columns: those declared (the payload's), then the metadata ones, in the
    /// order of the INCLUDE clauses. An open tells them apart by name (the kept options name
    /// the metadata columns, in another order).
    pub fn columns(&self, declared: Vec<ColumnDef>) -> Result<Vec<ColumnDef>> {
        let mut columns = declared;
        for (meta, name) in &self.include {
            if columns.iter().any(|c| &c.name == name) {
                return Err(Error::new(
                    ErrorKind::DuplicateColumn,
                    format!("column \"{name}\" specified more than once"),
                )
                .with_hint(format!(
                    "INCLUDE {} AS another name keeps it apart from the payload's columns.",
                    meta.name()
                )));
            }
            columns.push(ColumnDef {
                name: name.clone(),
                ty: meta.ty(),
                not_null: false,
            });
        }
        Ok(columns)
    }

    /// librdkafka's configuration for this source's consumers.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.client {
            config.set(key, value);
        }
        // Offsets are the checkpoints'; an offset the broker no longer has is an error, never
        // a silent jump to another. The group only shows progress to the usual tools.
        config
            .set("group.id", format!("weir-{}", self.topic))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false");
        config
    }

    /// The topic's partitions, asking the broker. Blocking (`weir::blocking`).
    pub fn partitions<C: rdkafka::consumer::ConsumerContext>(
        &self,
        consumer: &impl Consumer<C>,
    ) -> Result<Vec<i32>> {
        let metadata = consumer
            .fetch_metadata(Some(&self.topic), BROKER_TIMEOUT)
            .map_err(unreachable)?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.topic)
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::UndefinedObject,
                    format!("Kafka topic \"{}\" does not exist", self.topic),
                )
                .with_hint("Create the topic first: Weir does not create topics.")
            })?;
        Ok(topic.partitions().iter().map(|p| p.id()).collect())
    }

    /// Resolves `scan.startup.mode` into the offset each partition starts at, asking the
    /// broker. Blocking (`weir::blocking`).
    pub fn resolve_start(&self) -> Result<BTreeMap<i32, i64>> {
        let consumer: BaseConsumer = self.client_config().create().map_err(unreachable)?;
        let partitions = self.partitions(&consumer)?;
        let mut start = BTreeMap::new();
        match self.mode.as_str() {
            "timestamp" => {
                let at = self.timestamp_ms.unwrap_or(0);
                let mut list = TopicPartitionList::new();
                for p in &partitions {
                    list.add_partition_offset(&self.topic, *p, Offset::Offset(at))
                        .map_err(unreachable)?;
                }
                let found = consumer
                    .offsets_for_times(list, BROKER_TIMEOUT)
                    .map_err(unreachable)?;
                for e in found.elements() {
                    let offset = match e.offset() {
                        Offset::Offset(o) => o,
                        // No message at or after the time: from the partition's end.
                        _ => {
                            consumer
                                .fetch_watermarks(&self.topic, e.partition(), BROKER_TIMEOUT)
                                .map_err(unreachable)?
                                .1
                        }
                    };
                    start.insert(e.partition(), offset);
                }
            }
            mode => {
                for p in partitions {
                    let (low, high) = consumer
                        .fetch_watermarks(&self.topic, p, BROKER_TIMEOUT)
                        .map_err(unreachable)?;
                    start.insert(p, if mode == "latest" { high } else { low });
                }
            }
        }
        Ok(start)
    }

    /// The first offset the broker still holds in each of `partitions`. Blocking.
    pub fn first_offsets(
        &self,
        partitions: impl Iterator<Item = i32>,
    ) -> Result<BTreeMap<i32, i64>> {
        let consumer: BaseConsumer = self.client_config().create().map_err(unreachable)?;
        let mut first = BTreeMap::new();
        for p in partitions {
            let (low, _) = consumer
                .fetch_watermarks(&self.topic, p, BROKER_TIMEOUT)
                .map_err(unreachable)?;
            first.insert(p, low);
        }
        Ok(first)
    }
}

fn bad(message: String) -> Error {
    Error::new(ErrorKind::InvalidParameter, message)
}

/// `scan.startup.mode`, the time of `timestamp`, and the offsets per partition.
type Startup = (String, Option<i64>, Option<BTreeMap<i32, i64>>);

/// Reads `scan.startup.mode` and the options it needs: the mode, the time of `timestamp`, the
/// offsets of `specific` (or those kept, resolved at `CREATE SOURCE`).
fn startup(options: &mut Options) -> Result<Startup> {
    let mode = options
        .take("scan.startup.mode")
        .unwrap_or_else(|| "earliest".into())
        .to_lowercase();
    let timestamp_ms = options
        .take("scan.startup.timestamp.millis")
        .map(|t| {
            t.parse::<i64>().map_err(|_| {
                bad(format!(
                    "scan.startup.timestamp.millis must be milliseconds since 1970, not \"{t}\""
                ))
            })
        })
        .transpose()?;
    let start = options
        .take("scan.startup.specific.offsets")
        .map(|o| parse_offsets(&o))
        .transpose()?;
    match mode.as_str() {
        "earliest" | "latest" => {}
        "timestamp" if timestamp_ms.is_none() => {
            return Err(bad(
                "scan.startup.mode = 'timestamp' needs scan.startup.timestamp.millis".into(),
            ))
        }
        "timestamp" => {}
        "specific" if start.is_none() => {
            return Err(bad(
                "scan.startup.mode = 'specific' needs scan.startup.specific.offsets \
                 ('partition:offset,...')"
                    .into(),
            ))
        }
        "specific" => {}
        other => {
            return Err(bad(format!(
                "scan.startup.mode must be 'earliest', 'latest', 'timestamp' or 'specific', \
                 not \"{other}\""
            )))
        }
    }
    Ok((mode, timestamp_ms, start))
}

/// Reads `0:120,1:98`.
fn parse_offsets(text: &str) -> Result<BTreeMap<i32, i64>> {
    let bad = || {
        bad(format!(
            "scan.startup.specific.offsets must read 'partition:offset,...', not \"{text}\""
        ))
    };
    let mut offsets = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (p, o) = pair.split_once(':').ok_or_else(bad)?;
        let p: i32 = p.trim().parse().map_err(|_| bad())?;
        let o: i64 = o.trim().parse().map_err(|_| bad())?;
        if p < 0 || o < 0 || offsets.insert(p, o).is_some() {
            return Err(bad());
        }
    }
    if offsets.is_empty() {
        return Err(bad());
    }
    Ok(offsets)
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
    fn options_are_checked_and_kept_in_full() {
        let mut o = options(&[
            ("topic", "clicks"),
            ("properties.bootstrap.server", "127.0.0.1:9092"),
            ("properties.client.id", "weir"),
            ("scan.startup.mode", "specific"),
            ("scan.startup.specific.offsets", "0:5, 1:0"),
            ("encode", "CSV"),
            ("on_error", "FAIL"),
            ("include.offset", ""),
            ("include.key", "k"),
        ]);
        let config = Config::read(&mut o).unwrap();
        o.finish().unwrap();
        assert_eq!(config.encode, Encode::Csv);
        assert_eq!(config.on_error, OnError::Fail);
        assert_eq!(config.start, Some(BTreeMap::from([(0, 5), (1, 0)])));
        assert_eq!(
            config.include,
            [
                (Meta::Offset, "_kafka_offset".into()),
                (Meta::Key, "k".into())
            ]
        );
        let kept = config.kept();
        assert_eq!(kept["properties.bootstrap.server"], "127.0.0.1:9092");
        assert_eq!(kept["scan.startup.specific.offsets"], "0:5,1:0");
        assert_eq!(kept["watermark.idle.timeout.ms"], "10000");
        let again = Config::read(&mut Options::kept(&kept)).unwrap();
        assert_eq!(again.kept(), kept);
        let refused =
            |pairs: &[(&str, &str)]| Config::read(&mut options(pairs)).err().map(|e| e.kind);
        let broker = ("properties.bootstrap.server", "127.0.0.1:9092");
        assert_eq!(refused(&[broker]), Some(ErrorKind::InvalidParameter));
        assert_eq!(
            refused(&[("topic", "t")]),
            Some(ErrorKind::InvalidParameter)
        );
        for bad in [
            ("scan.startup.mode", "sometime"),
            ("scan.startup.specific.offsets", "0=5"),
            ("scan.startup.timestamp.millis", "noon"),
            ("properties.group.id", "mine"),
            ("on_error", "ignore"),
            ("watermark.idle.timeout.ms", "-1"),
        ] {
            assert_eq!(
                refused(&[("topic", "t"), broker, bad]),
                Some(ErrorKind::InvalidParameter),
                "{bad:?}"
            );
        }
        for unsupported in [
            ("encode", "avro"),
            ("include.header", ""),
            ("format", "canal"),
        ] {
            assert_eq!(
                refused(&[("topic", "t"), broker, unsupported]),
                Some(ErrorKind::NotSupported),
                "{unsupported:?}"
            );
        }
        assert_eq!(
            refused(&[("topic", "t"), broker, ("scan.startup.mode", "timestamp")]),
            Some(ErrorKind::InvalidParameter)
        );
    }

    #[test]
    fn metadata_columns_follow_the_payloads_and_may_not_repeat_a_name() {
        let mut o = options(&[
            ("topic", "t"),
            ("properties.bootstrap.server", "b:1"),
            ("include.partition", "p"),
            ("include.timestamp", ""),
        ]);
        let config = Config::read(&mut o).unwrap();
        let declared = vec![ColumnDef {
            name: "id".into(),
            ty: SqlType::BigInt,
            not_null: false,
        }];
        let names: Vec<String> = config
            .columns(declared.clone())
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["id", "p", "_kafka_timestamp"]);
        let mut o = options(&[
            ("topic", "t"),
            ("properties.bootstrap.server", "b:1"),
            ("include.key", "id"),
        ]);
        let e = Config::read(&mut o).unwrap().columns(declared).unwrap_err();
        assert_eq!(e.kind, ErrorKind::DuplicateColumn);
    }
}
