//! `connector = 'kafka'`: a topic's messages as a source's rows, `FORMAT PLAIN ENCODE JSON`
//! (or `ENCODE CSV`), each message's value one row of the declared columns.
//!
//! Its splits are the topic's partitions, each holding the next offset to read: the feed
//! records them with the rows and checkpoints keep them, so a restart reads on from exactly
//! where the views' state ends. Where the source starts (`scan.startup.mode`) is resolved into
//! offsets per partition once, at `CREATE SOURCE`, and kept with its options, so that the
//! start means the same messages at every restart even after the broker's retention has
//! moved the topic's own start. Offsets are never committed to a consumer group and never
//! read from one. See `docs/design/0011-kafka-source.md`.
//!
//! TODO (issue 20): partitions added to the topic after CREATE; a late view's backfill over
//! several partitions (needs the splits at the barrier, not only the row count); watermarks
//! per partition with an idle timeout; `weir_catalog.source_errors`; per-partition lag;
//! `FORMAT UPSERT` and `FORMAT DEBEZIUM`; `INCLUDE key | partition | offset | timestamp`;
//! parallel readers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use futures::FutureExt;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::{Keep, Options, Start};
use crate::catalog::{ColumnDef, SourceDef};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Batches, Splits};

/// Reads Kafka topics.
pub struct Kafka;

/// How long a call to the broker at `CREATE SOURCE` (its partitions, their offsets) may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// The most messages in one batch of rows, and the most bytes of their values (a batch takes
/// at least one message, however large: the broker bounds a message's size).
const BATCH_MESSAGES_MAX: usize = 4096;
const BATCH_BYTES_MAX: usize = 16 << 20;

/// What a message's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encode {
    Json,
    Csv,
}

/// A Kafka source's options.
struct Config {
    topic: String,
    /// librdkafka's settings: `bootstrap.servers` and every `properties.*` option.
    client: BTreeMap<String, String>,
    encode: Encode,
    /// `scan.startup.mode` as given.
    mode: String,
    timestamp_ms: Option<i64>,
    /// Where the source starts, per partition (resolved at `CREATE SOURCE`).
    start: Option<BTreeMap<i32, i64>>,
}

impl Config {
    fn read(options: &mut Options) -> Result<Config> {
        let bad = |message: String| Error::new(ErrorKind::InvalidParameter, message);
        let topic = options
            .take("topic")
            .ok_or_else(|| bad("a Kafka source needs a topic".into()))?;
        let mut client = BTreeMap::new();
        for (key, value) in options.take_prefixed("properties.") {
            // RisingWave's spelling of librdkafka's `bootstrap.servers`.
            let key = match key.as_str() {
                "bootstrap.server" => "bootstrap.servers".to_string(),
                _ => key,
            };
            client.insert(key, value);
        }
        if !client.contains_key("bootstrap.servers") {
            return Err(bad(
                "a Kafka source needs properties.bootstrap.server".into()
            ));
        }
        for owned in ["group.id", "enable.auto.commit", "auto.offset.reset"] {
            if client.contains_key(owned) {
                return Err(bad(format!(
                    "properties.{owned} is Weir's to set: a Kafka source keeps its offsets in \
                     checkpoints"
                )));
            }
        }
        let format = options.take("format").map(|f| f.to_lowercase());
        let encode = options.take("encode").map(|e| e.to_lowercase());
        let encode = match (format.as_deref(), encode.as_deref()) {
            (None | Some("plain"), None | Some("json")) => Encode::Json,
            (None | Some("plain"), Some("csv")) => Encode::Csv,
            (f, e) => {
                return Err(Error::not_supported(format!(
                    "Kafka sources read FORMAT PLAIN ENCODE JSON or CSV, not FORMAT {} ENCODE {}",
                    f.unwrap_or("plain").to_uppercase(),
                    e.unwrap_or("json").to_uppercase()
                )))
            }
        };
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
        Ok(Config {
            topic,
            client,
            encode,
            mode,
            timestamp_ms,
            start,
        })
    }

    /// The options the catalog keeps, written out in full.
    fn kept(&self) -> BTreeMap<String, String> {
        let mut kept = BTreeMap::from([
            ("topic".to_string(), self.topic.clone()),
            ("format".to_string(), "plain".to_string()),
            (
                "encode".to_string(),
                match self.encode {
                    Encode::Json => "json",
                    Encode::Csv => "csv",
                }
                .to_string(),
            ),
            ("scan.startup.mode".to_string(), self.mode.clone()),
        ]);
        for (key, value) in &self.client {
            let key = match key.as_str() {
                "bootstrap.servers" => "bootstrap.server",
                other => other,
            };
            kept.insert(format!("properties.{key}"), value.clone());
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

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.client {
            config.set(key, value);
        }
        // Offsets are the checkpoints'; an offset the broker no longer has is an error, never
        // a silent jump to another.
        config
            .set("group.id", format!("weir-{}", self.topic))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false");
        config
    }

    /// Resolves `scan.startup.mode` into the offset each partition starts at, asking the
    /// broker. Blocking (`weir::blocking`).
    fn resolve_start(&self) -> Result<BTreeMap<i32, i64>> {
        let consumer: BaseConsumer = self.client_config().create().map_err(unreachable)?;
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
        let partitions: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
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
}

/// Reads `0:120,1:98`.
fn parse_offsets(text: &str) -> Result<BTreeMap<i32, i64>> {
    let bad = || {
        Error::new(
            ErrorKind::InvalidParameter,
            format!(
                "scan.startup.specific.offsets must read 'partition:offset,...', not \"{text}\""
            ),
        )
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

    fn create(
        &self,
        options: &mut Options,
        declared: Vec<ColumnDef>,
    ) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)> {
        let mut config = Config::read(options)?;
        if declared.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                "a Kafka source needs its columns declared",
            ));
        }
        if config.start.is_none() {
            config.start = Some(crate::blocking(|| config.resolve_start())?);
        }
        Ok((config.kept(), declared))
    }

    /// Read again for a late view, a stream of several partitions interleaves differently
    /// from how it went by: its first rows need not be the same ones.
    fn check_read_again(&self, def: &SourceDef, rows: u64) -> Result<()> {
        let config = Config::read(&mut Options::kept(&def.connector.options))?;
        let partitions = config.start.map_or(0, |s| s.len());
        if rows > 0 && partitions > 1 {
            return Err(Error::not_supported(format!(
                "a view over Kafka source \"{}\" can only be created before the source has \
                 read messages of its topic's {partitions} partitions",
                def.name,
            ))
            .with_hint("Create every view over the source before its first view starts it."));
        }
        Ok(())
    }

    fn open(
        &self,
        def: &SourceDef,
        start: Start<'_>,
        keep: Option<Keep<'_>>,
    ) -> Result<Box<dyn super::Reader>> {
        let config = Config::read(&mut Options::kept(&def.connector.options))?;
        let first = config.start.clone().unwrap_or_default();
        let next: BTreeMap<i32, i64> = match start.splits {
            Some(splits) => {
                let mut next = first.clone();
                for (split, offset) in splits.iter() {
                    let (Ok(p), Some(o)) = (split.parse::<i32>(), offset.as_i64()) else {
                        return Err(Error::new(
                            ErrorKind::DataCorruption,
                            format!(
                                "Kafka source \"{}\" has a bad position {split}: {offset}",
                                def.name
                            ),
                        ));
                    };
                    next.insert(p, o);
                }
                next
            }
            None if start.rows == 0 => first.clone(),
            None => {
                return Err(Error::internal(format!(
                    "Kafka source \"{}\" was asked to resume after {} rows without its offsets",
                    def.name, start.rows
                )))
            }
        };
        if let Some(k) = keep.filter(|k| !k.own) {
            self.check_read_again(def, k.checked)?;
        }
        let consumer: StreamConsumer = config.client_config().create().map_err(unreachable)?;
        let mut list = TopicPartitionList::new();
        for (p, o) in &next {
            list.add_partition_offset(&config.topic, *p, Offset::Offset(*o))
                .map_err(unreachable)?;
        }
        consumer.assign(&list).map_err(unreachable)?;
        Ok(Box::new(KafkaReader {
            source: def.name.clone(),
            consumer: Some(consumer),
            schema: def.schema(),
            encode: config.encode,
            next,
            skipped: 0,
            backoff: BACKOFF_MIN,
        }))
    }
}

/// A Kafka source's reader: one consumer assigned every partition at its offset.
struct KafkaReader {
    source: String,
    /// Taken only when the reader is dropped.
    consumer: Option<StreamConsumer>,
    schema: SchemaRef,
    encode: Encode,
    /// The next offset of each partition.
    next: BTreeMap<i32, i64>,
    /// Messages whose value did not decode, skipped.
    skipped: u64,
    /// How long to wait after the next error.
    backoff: Duration,
}

/// How long a reader waits after a broker's error before it reads again: doubling from the
/// least to the most while the errors go on.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

impl KafkaReader {
    /// A read failed. Messages the broker no longer holds stop the source (its views cannot be
    /// their query over every message any more); anything else (a broker down, a network
    /// error, a leader moving) is waited out, librdkafka reconnecting meanwhile.
    async fn failed(&mut self, e: KafkaError) -> Result<()> {
        use rdkafka::types::RDKafkaErrorCode;
        if let KafkaError::MessageConsumption(
            code @ (RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::UnknownTopicOrPartition),
        ) = e
        {
            return Err(Error::new(
                ErrorKind::ObjectNotInPrerequisiteState,
                format!(
                    "Kafka source \"{}\" cannot read on from offsets {:?}: {code}",
                    self.source, self.next
                ),
            )
            .with_hint(
                "The broker no longer holds messages the source has not read (retention).",
            ));
        }
        tracing::warn!(
            source = self.source,
            "Kafka source waits out a broker's error: {e}"
        );
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        Ok(())
    }

    /// Decodes message values into rows; a value that does not decode into exactly one row
    /// is skipped (and counted).
    fn decode(&mut self, values: &[Vec<u8>]) -> Result<Option<RecordBatch>> {
        let mut joined = Vec::with_capacity(values.iter().map(|v| v.len() + 1).sum());
        for v in values {
            joined.extend_from_slice(v);
            joined.push(b'\n');
        }
        if let Ok(Some(batch)) = self.decode_bytes(&joined) {
            if batch.num_rows() == values.len() {
                return Ok(Some(batch));
            }
        }
        // One at a time, to find the bad ones.
        let mut good = Vec::new();
        for v in values {
            let mut one = v.clone();
            one.push(b'\n');
            match self.decode_bytes(&one) {
                Ok(Some(b)) if b.num_rows() == 1 => good.push(b),
                Ok(_) => self.skip(v, "not one row"),
                Err(e) => self.skip(v, &e.to_string()),
            }
        }
        if good.is_empty() {
            return Ok(None);
        }
        Ok(Some(datafusion::arrow::compute::concat_batches(
            &self.schema,
            &good,
        )?))
    }

    fn skip(&mut self, value: &[u8], why: &str) {
        self.skipped += 1;
        let prefix = String::from_utf8_lossy(&value[..value.len().min(64)]).into_owned();
        tracing::warn!(
            source = self.source,
            skipped = self.skipped,
            "skipped a Kafka message whose value does not decode ({why}): {prefix}"
        );
    }

    fn decode_bytes(&self, bytes: &[u8]) -> Result<Option<RecordBatch>> {
        match self.encode {
            Encode::Json => {
                let mut decoder = datafusion::arrow::json::ReaderBuilder::new(self.schema.clone())
                    .with_batch_size(BATCH_MESSAGES_MAX)
                    .build_decoder()?;
                let mut rest = bytes;
                while !rest.is_empty() {
                    let read = decoder.decode(rest)?;
                    if read == 0 {
                        break;
                    }
                    rest = &rest[read..];
                }
                Ok(decoder.flush()?)
            }
            Encode::Csv => {
                let mut decoder = datafusion::arrow::csv::ReaderBuilder::new(self.schema.clone())
                    .with_batch_size(BATCH_MESSAGES_MAX)
                    .build_decoder();
                let mut rest = bytes;
                loop {
                    let read = decoder.decode(rest)?;
                    if read == 0 {
                        break;
                    }
                    rest = &rest[read..];
                }
                Ok(decoder.flush()?)
            }
        }
    }
}

/// Takes a message: its value (`None` for a message without one), and moves its partition's
/// offset in `next` past it.
fn take(
    next: &mut BTreeMap<i32, i64>,
    message: &rdkafka::message::BorrowedMessage<'_>,
) -> Option<Vec<u8>> {
    next.insert(message.partition(), message.offset().saturating_add(1));
    message.payload().map(<[u8]>::to_vec)
}

impl Drop for KafkaReader {
    fn drop(&mut self) {
        // librdkafka's destroy joins its threads and closes its connections.
        let consumer = self.consumer.take();
        crate::blocking(|| drop(consumer));
    }
}

/// Waiting for the first message is the one point where a caller may stop waiting; after it,
/// the batch is built without awaiting anything.
#[async_trait::async_trait]
impl Batches for KafkaReader {
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            let consumer = self
                .consumer
                .as_ref()
                .expect("a reader's consumer until it drops");
            // Wait for the first message; take whatever else is there already.
            let first = match consumer.recv().await {
                Ok(m) => Ok(take(&mut self.next, &m)),
                Err(e) => Err(e),
            };
            let mut values = match first {
                Ok(value) => {
                    self.backoff = BACKOFF_MIN;
                    value.into_iter().collect::<Vec<_>>()
                }
                Err(e) => {
                    self.failed(e).await?;
                    continue;
                }
            };
            // Nothing is awaited from here to the return, so that a caller that stops waiting
            // (the source paused) never drops messages already taken.
            let consumer = self
                .consumer
                .as_ref()
                .expect("a reader's consumer until it drops");
            let mut bytes = values.iter().map(Vec::len).sum::<usize>();
            while values.len() < BATCH_MESSAGES_MAX && bytes < BATCH_BYTES_MAX {
                match consumer.recv().now_or_never() {
                    Some(Ok(m)) => {
                        if let Some(v) = take(&mut self.next, &m) {
                            bytes += v.len();
                            values.push(v);
                        }
                    }
                    // Met again, and waited out, by the next call.
                    Some(Err(_)) | None => break,
                }
            }
            if let Some(batch) = self.decode(&values)? {
                return Ok(Some(batch));
            }
        }
    }
}

impl super::Reader for KafkaReader {
    fn splits(&self) -> Option<Splits> {
        Some(Arc::new(
            self.next
                .iter()
                .map(|(p, o)| (p.to_string(), serde_json::Value::from(*o)))
                .collect(),
        ))
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
    fn options_are_checked_and_kept_in_full() {
        let mut o = options(&[
            ("topic", "clicks"),
            ("properties.bootstrap.server", "127.0.0.1:9092"),
            ("properties.client.id", "weir"),
            ("scan.startup.mode", "specific"),
            ("scan.startup.specific.offsets", "0:5, 1:0"),
            ("encode", "CSV"),
        ]);
        let config = Config::read(&mut o).unwrap();
        o.finish().unwrap();
        assert_eq!(config.encode, Encode::Csv);
        assert_eq!(config.start, Some(BTreeMap::from([(0, 5), (1, 0)])));
        let kept = config.kept();
        assert_eq!(kept["properties.bootstrap.server"], "127.0.0.1:9092");
        assert_eq!(kept["scan.startup.specific.offsets"], "0:5,1:0");
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
        ] {
            assert_eq!(
                refused(&[("topic", "t"), broker, bad]),
                Some(ErrorKind::InvalidParameter),
                "{bad:?}"
            );
        }
        assert_eq!(
            refused(&[("topic", "t"), broker, ("encode", "avro")]),
            Some(ErrorKind::NotSupported)
        );
        assert_eq!(
            refused(&[("topic", "t"), broker, ("scan.startup.mode", "timestamp")]),
            Some(ErrorKind::InvalidParameter)
        );
    }
}
