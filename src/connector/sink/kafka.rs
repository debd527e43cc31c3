//! `connector = 'kafka'`: a view's changes as messages of a Kafka topic, ENCODE JSON. Each
//! checkpoint's share of the sink's log goes in one delivery whose marker is the committed
//! offset of the consumer group `weir-sink-<sink>` on the topic's partition 0, set to the
//! checkpoint's epoch (`docs/design/0014-sink-log.md`):
//!
//! - `sink.delivery = 'exactly_once'` (the default): a transactional producer
//!   (`transactional.id = weir-sink-<sink>`) sends the messages and the marker
//!   (`send_offsets_to_transaction`) in one transaction, so `read_committed` readers see each
//!   change once. A restart's `init_transactions` aborts a transaction the crash left open.
//! - `sink.delivery = 'at_least_once'`, for brokers without transactions: an idempotent
//!   producer sends the messages, and the marker is committed once the broker has acknowledged
//!   every one. A crash in between sends that checkpoint again; readers deduplicate by key.
//!
//! FORMAT UPSERT keys each message by the JSON of the key's columns and sends a key's row as it
//! is after each chunk, or a tombstone (no value) for a row gone. FORMAT PLAIN sends each
//! inserted row, unkeyed. FORMAT DEBEZIUM sends `{"before", "after", "op"}` per change, keyed.

use std::collections::BTreeMap;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::json::writer::{LineDelimited, WriterBuilder};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::{Format, Net, Options, Spec};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Op, SinkWriter, StreamChunk};

/// `connector = 'kafka'`.
pub struct Kafka;

/// How long a call to the broker may take before the delivery fails and is retried.
const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// How a sink's deliveries reach the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    ExactlyOnce,
    AtLeastOnce,
}

#[derive(Debug, Clone)]
struct Config {
    sink: String,
    topic: String,
    /// librdkafka's settings: `bootstrap.servers` and every `properties.*` option.
    client: BTreeMap<String, String>,
    delivery: Delivery,
}

fn bad(m: String) -> Error {
    Error::new(ErrorKind::InvalidParameter, m)
}

fn broker_error(what: &str, e: KafkaError) -> Error {
    Error::new(
        ErrorKind::ConnectionFailure,
        format!("Kafka broker: {what}: {e}"),
    )
}

impl Config {
    fn read(name: &str, options: &mut Options, spec: &Spec) -> Result<Config> {
        let topic = options
            .take("topic")
            .ok_or_else(|| bad("a Kafka sink needs a topic".into()))?;
        let client = options.take_kafka_properties()?;
        if !client.contains_key("bootstrap.servers") {
            return Err(bad("a Kafka sink needs properties.bootstrap.server".into()));
        }
        for owned in ["transactional.id", "enable.idempotence", "group.id"] {
            if client.contains_key(owned) {
                return Err(bad(format!(
                    "properties.{owned} is Weir's to set: it keeps a Kafka sink's deliveries \
                     exactly once"
                )));
            }
        }
        let delivery = match options.take("sink.delivery").as_deref() {
            None | Some("exactly_once") => Delivery::ExactlyOnce,
            Some("at_least_once") => Delivery::AtLeastOnce,
            Some(other) => {
                return Err(bad(format!(
                    "sink.delivery must be 'exactly_once' or 'at_least_once', not \"{other}\""
                )))
            }
        };
        match spec.encode.as_deref() {
            Some("json") => {}
            Some(other) => {
                return Err(Error::not_supported(format!(
                    "a Kafka sink writes ENCODE JSON, not ENCODE {}",
                    other.to_uppercase()
                )))
            }
            None => {
                return Err(Error::syntax("a Kafka sink needs FORMAT ... ENCODE JSON")
                    .with_hint("For example: FORMAT UPSERT ENCODE JSON."))
            }
        }
        Ok(Config {
            sink: name.to_string(),
            topic,
            client,
            delivery,
        })
    }

    fn kept(&self) -> Vec<(String, String)> {
        let mut kept = vec![
            ("topic".to_string(), self.topic.clone()),
            (
                "sink.delivery".to_string(),
                match self.delivery {
                    Delivery::ExactlyOnce => "exactly_once",
                    Delivery::AtLeastOnce => "at_least_once",
                }
                .to_string(),
            ),
        ];
        for (key, value) in &self.client {
            let key = match key.as_str() {
                "bootstrap.servers" => "bootstrap.server",
                other => other,
            };
            kept.push((format!("properties.{key}"), value.clone()));
        }
        kept
    }

    /// The consumer group whose committed offset on partition 0 is the marker.
    fn group(&self) -> String {
        format!("weir-sink-{}", self.sink)
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.client {
            config.set(key, value);
        }
        config
    }

    fn consumer(&self) -> Result<BaseConsumer> {
        self.client_config()
            .set("group.id", self.group())
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| broker_error("client", e))
    }

    fn producer(&self) -> Result<FutureProducer> {
        let mut config = self.client_config();
        config.set("enable.idempotence", "true").set("acks", "all");
        if self.delivery == Delivery::ExactlyOnce {
            config
                .set("transactional.id", self.group())
                .set("transaction.timeout.ms", "60000");
        }
        config.create().map_err(|e| broker_error("producer", e))
    }

    /// The marker: the epoch the group's committed offset says.
    fn marker(&self, consumer: &BaseConsumer) -> Result<Option<u64>> {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.topic, 0);
        let got = consumer
            .committed_offsets(list, BROKER_TIMEOUT)
            .map_err(|e| broker_error("the sink's committed offset", e))?;
        Ok(got.elements().first().and_then(|e| match e.offset() {
            Offset::Offset(o) if o > 0 => Some(o as u64),
            _ => None,
        }))
    }
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
        name: &str,
        options: &mut Options,
        spec: &Spec,
        _schema: &SchemaRef,
    ) -> Result<Vec<(String, String)>> {
        let config = Config::read(name, options, spec)?;
        let consumer = config.consumer()?;
        let topic = config.topic.clone();
        crate::blocking(|| {
            let metadata = consumer
                .fetch_metadata(Some(&topic), Duration::from_secs(10))
                .map_err(|e| broker_error("the topic's metadata", e))
                .map_err(|e| {
                    e.with_hint("Check properties.bootstrap.server and that the broker is up.")
                })?;
            let missing = metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .is_none_or(|t| t.error().is_some() || t.partitions().is_empty());
            if missing {
                return Err(Error::new(
                    ErrorKind::UndefinedObject,
                    format!("Kafka topic \"{topic}\" does not exist"),
                )
                .with_hint("Create the topic first."));
            }
            // A new sink starts over, whatever a dropped one of the same name delivered.
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&topic, 0, Offset::Offset(0))
                .map_err(|e| broker_error("reset the sink's marker", e))?;
            consumer
                .commit(&list, CommitMode::Sync)
                .map_err(|e| broker_error("reset the sink's marker", e))
        })?;
        Ok(config.kept())
    }

    fn open(
        &self,
        name: &str,
        options: &BTreeMap<String, String>,
        spec: &Spec,
        _schema: &SchemaRef,
    ) -> Result<Box<dyn SinkWriter>> {
        let mut options = Options::kept(options).of_sink();
        let config = Config::read(name, &mut options, spec)?;
        Ok(Box::new(Writer {
            config,
            spec: spec.clone(),
            producer: None,
            consumer: None,
            sending: Vec::new(),
        }))
    }
}

/// Delivers a sink's checkpoints into its topic.
struct Writer {
    config: Config,
    spec: Spec,
    /// The clients, while they work; a failure drops them (a new transactional producer
    /// aborts the transaction the old one left open).
    producer: Option<FutureProducer>,
    consumer: Option<BaseConsumer>,
    /// Messages sent in this delivery and not yet acknowledged.
    sending: Vec<DeliveryFuture>,
}

/// The rows of `batch` as JSON objects, one per row, in one buffer.
struct JsonRows {
    bytes: Vec<u8>,
    /// Where each row's object ends in `bytes` (the next begins after its newline).
    ends: Vec<usize>,
}

impl std::ops::Index<usize> for JsonRows {
    type Output = [u8];

    fn index(&self, row: usize) -> &[u8] {
        let start = match row {
            0 => 0,
            r => self.ends[r - 1] + 1,
        };
        &self.bytes[start..self.ends[row]]
    }
}

fn json_rows(batch: &RecordBatch) -> Result<JsonRows> {
    let mut bytes = Vec::new();
    let mut w = WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, LineDelimited>(&mut bytes);
    w.write(batch)?;
    w.finish()?;
    drop(w);
    let ends: Vec<usize> = (bytes.iter().enumerate())
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i)
        .collect();
    if ends.len() != batch.num_rows() {
        return Err(Error::internal(
            "JSON rows and the batch's rows differ in number",
        ));
    }
    Ok(JsonRows { bytes, ends })
}

impl Writer {
    /// Creates the clients where there are none.
    fn connect(&mut self) -> Result<()> {
        if self.producer.is_none() {
            let producer = self.config.producer()?;
            if self.config.delivery == Delivery::ExactlyOnce {
                crate::blocking(|| producer.init_transactions(BROKER_TIMEOUT))
                    .map_err(|e| broker_error("init_transactions", e))?;
            }
            self.producer = Some(producer);
        }
        if self.consumer.is_none() {
            self.consumer = Some(self.config.consumer()?);
        }
        Ok(())
    }

    fn clients(&self) -> Result<(&FutureProducer, &BaseConsumer)> {
        match (&self.producer, &self.consumer) {
            (Some(p), Some(c)) => Ok((p, c)),
            _ => Err(Error::internal("no Kafka clients")),
        }
    }

    /// Queues a message; waits for those in flight while librdkafka's queue is full.
    async fn send(&mut self, key: Option<&[u8]>, value: Option<&[u8]>) -> Result<()> {
        loop {
            self.connect()?;
            let (producer, _) = self.clients()?;
            let mut record = FutureRecord::<[u8], [u8]>::to(&self.config.topic);
            if let Some(k) = key {
                record = record.key(k);
            }
            if let Some(v) = value {
                record = record.payload(v);
            }
            match producer.send_result(record) {
                Ok(future) => {
                    self.sending.push(future);
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    self.acknowledged().await?;
                }
                Err((e, _)) => return Err(broker_error("send", e)),
            }
        }
    }

    /// Waits until the broker has acknowledged every message sent.
    async fn acknowledged(&mut self) -> Result<()> {
        for future in std::mem::take(&mut self.sending) {
            match future.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(broker_error("a message", e)),
                Err(_) => return Err(broker_error("a message", KafkaError::Canceled)),
            }
        }
        Ok(())
    }

    /// Each row's key as a JSON object (`{"customer":"c1"}`).
    fn keys(&self, chunk: &StreamChunk) -> Result<JsonRows> {
        json_rows(&chunk.data.project(&self.spec.key)?)
    }
}

#[async_trait::async_trait]
impl SinkWriter for Writer {
    async fn delivered(&mut self) -> Result<Option<u64>> {
        // Asked after a failure too: start on new clients.
        self.producer = None;
        self.consumer = None;
        self.sending.clear();
        self.connect()?;
        let (_, consumer) = self.clients()?;
        crate::blocking(|| self.config.marker(consumer))
    }

    async fn begin(&mut self, _epoch: u64, replace: bool) -> Result<()> {
        if replace {
            // A topic keeps what it was sent: the view's rows come anew on top of it.
            tracing::warn!(
                sink = self.config.sink,
                "the sink was built again: its view's rows are sent again after its earlier output"
            );
        }
        self.sending.clear();
        let exactly_once = self.config.delivery == Delivery::ExactlyOnce;
        self.connect()?;
        let (producer, _) = self.clients()?;
        if exactly_once {
            producer
                .begin_transaction()
                .map_err(|e| broker_error("begin_transaction", e))?;
        }
        Ok(())
    }

    async fn write(&mut self, chunk: StreamChunk) -> Result<()> {
        match self.spec.format {
            Format::Plain => {
                let rows = json_rows(&chunk.data)?;
                for (row, op) in chunk.ops.iter().enumerate() {
                    if *op == Op::Insert {
                        self.send(None, Some(&rows[row])).await?;
                    }
                }
            }
            Format::Upsert => {
                let rows = json_rows(&chunk.data)?;
                let keys = self.keys(&chunk)?;
                for net in super::net_changes(&chunk, &self.spec.key)? {
                    match net {
                        Net::Holds(row) => {
                            self.send(Some(&keys[row]), Some(&rows[row])).await?;
                        }
                        Net::Gone(row) => {
                            self.send(Some(&keys[row]), None).await?;
                        }
                    }
                }
            }
            Format::Debezium => {
                let rows = json_rows(&chunk.data)?;
                let keys = self.keys(&chunk)?;
                for (row, op) in chunk.ops.iter().enumerate() {
                    let (before, after, code): (&[u8], &[u8], &str) = match op {
                        Op::Insert => (b"null", &rows[row], "c"),
                        Op::Delete => (&rows[row], b"null", "d"),
                    };
                    let mut event = b"{\"before\":".to_vec();
                    event.extend_from_slice(before);
                    event.extend_from_slice(b",\"after\":");
                    event.extend_from_slice(after);
                    event.extend_from_slice(format!(",\"op\":\"{code}\"}}").as_bytes());
                    self.send(Some(&keys[row]), Some(&event)).await?;
                }
            }
        }
        Ok(())
    }

    async fn commit(&mut self, epoch: u64) -> Result<()> {
        let offset = i64::try_from(epoch).map_err(|_| Error::internal("epoch out of range"))?;
        let mut marker = TopicPartitionList::new();
        marker
            .add_partition_offset(&self.config.topic, 0, Offset::Offset(offset))
            .map_err(|e| broker_error("marker", e))?;
        self.acknowledged().await?;
        crate::failpoint::reach("sink.kafka.before_marker").await;
        let exactly_once = self.config.delivery == Delivery::ExactlyOnce;
        self.connect()?;
        let (producer, consumer) = self.clients()?;
        crate::blocking(|| {
            if exactly_once {
                let group = consumer
                    .group_metadata()
                    .ok_or_else(|| Error::internal("the sink's consumer has no group"))?;
                producer
                    .send_offsets_to_transaction(&marker, &group, BROKER_TIMEOUT)
                    .map_err(|e| broker_error("send_offsets_to_transaction", e))?;
                producer
                    .commit_transaction(BROKER_TIMEOUT)
                    .map_err(|e| broker_error("commit_transaction", e))
            } else {
                consumer
                    .commit(&marker, CommitMode::Sync)
                    .map_err(|e| broker_error("commit the sink's marker", e))
            }
        })
    }
}
