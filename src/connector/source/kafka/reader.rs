//! A Kafka source's reader: one consumer assigned each partition at its offset, turning the
//! messages it receives into rows (`decode::Payloads`, with the metadata columns the source
//! includes), each partition's next offset its split.
//!
//! The source's own reader also reports into its `Progress` (skipped messages, the broker's
//! errors while it waits them out, each partition's offset and high watermark), tracks each
//! partition's newest event time for the watermark (the least over the partitions, leaving
//! out those idle for `watermark.idle.timeout.ms`), and looks for partitions added to the
//! topic. A reader reading the stream again for a new view stops each partition where the
//! source was at the view's barrier.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{SchemaRef, TimestampMicrosecondType};
use futures::FutureExt;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message, Timestamp};
use rdkafka::statistics::Statistics;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio::time::Instant;

use super::config::{Config, OnError};
use super::rows::{Rows, Taken};
use super::unreachable;
use crate::catalog::SourceDef;
use crate::connector::source::decode::malformed;
use crate::connector::source::{Progress, SplitProgress, Times};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Batches, DurableSplits, Op, Splits};

/// The most messages in one batch of rows, and the most bytes of their values (a batch takes
/// at least one message, however large: the broker bounds a message's size).
const BATCH_MESSAGES_MAX: usize = 4096;
const BATCH_BYTES_MAX: usize = 16 << 20;

/// How long a reader waits after a broker's error before it reads again: doubling from the
/// least to the most while the errors go on.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How often librdkafka reports each partition's high watermark to the source's own reader.
const STATISTICS_INTERVAL_MS: &str = "1000";

/// A batch's rows, each one's change and each one's partition.
type Changes = (RecordBatch, Vec<Op>, Vec<i32>);

/// Where a reader is in each partition, and where it stops when reading again.
struct Offsets {
    /// The next offset of each partition.
    next: BTreeMap<i32, i64>,
    /// Reading again for a new view: where each partition stops (messages from there on went
    /// by after the barrier the view starts at). The reader ends once every partition is there.
    until: Option<BTreeMap<i32, i64>>,
}

impl Offsets {
    /// Whether a message is one to take, moving its partition's offset past it if so; a
    /// message past its partition's end when reading again is not.
    fn take(&mut self, partition: i32, offset: i64) -> bool {
        if let Some(until) = &self.until {
            if until.get(&partition).is_none_or(|u| offset >= *u) {
                return false;
            }
        }
        self.next.insert(partition, offset.saturating_add(1));
        true
    }

    /// Reading again, every partition has reached where it stops.
    fn read_again_to_end(&self) -> bool {
        self.until.as_ref().is_some_and(|until| {
            self.next
                .iter()
                .all(|(p, o)| until.get(p).is_none_or(|u| o >= u))
        })
    }
}

/// The consumer's context: the partitions' high watermarks from librdkafka's statistics, and
/// the broker's errors, reported to the source's progress.
pub struct Context {
    source: String,
    topic: String,
    progress: Option<Arc<Progress>>,
    /// Each partition's next offset, as the reader last took messages, and its high
    /// watermark, as librdkafka last reported it.
    splits: Mutex<(BTreeMap<i32, i64>, BTreeMap<i32, i64>)>,
}

impl Context {
    /// Publishes the partitions' progress (after the reader's `next` offsets moved, or the
    /// statistics came) for `weir_catalog.source_splits`.
    fn publish(&self, next: Option<&BTreeMap<i32, i64>>) {
        let Some(progress) = &self.progress else {
            return;
        };
        let mut splits = self.splits.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(next) = next {
            splits.0.clone_from(next);
        }
        let (next, ends) = &*splits;
        progress.set_splits(
            next.iter()
                .map(|(p, next)| {
                    let end = ends.get(p).copied();
                    SplitProgress {
                        split: p.to_string(),
                        position: serde_json::Value::from(*next),
                        end,
                        lag: end.map(|e| (e - next).max(0)),
                    }
                })
                .collect(),
        );
    }
}

impl ClientContext for Context {
    fn stats(&self, statistics: Statistics) {
        let Some(topic) = statistics.topics.get(&self.topic) else {
            return;
        };
        {
            let mut splits = self.splits.lock().unwrap_or_else(|p| p.into_inner());
            for (p, partition) in &topic.partitions {
                if *p >= 0 && partition.hi_offset >= 0 {
                    splits.1.insert(*p, partition.hi_offset);
                }
            }
        }
        self.publish(None);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(
            source = self.source,
            "Kafka client error: {error}: {reason}"
        );
        if let Some(p) = &self.progress {
            p.waiting(Some(format!("Kafka broker error: {reason}")));
        }
    }
}

impl ConsumerContext for Context {}

/// Each partition's newest event time and when it last had a message: the source's watermark
/// is the least newest time over the partitions that are not idle.
struct PartitionTimes {
    /// The watermark's column in the source's rows.
    column: usize,
    idle_timeout: Duration,
    /// (newest time, last message) by partition.
    partitions: BTreeMap<i32, (Option<i64>, Instant)>,
}

impl PartitionTimes {
    fn seen(&mut self, partition: i32, time: Option<i64>, now: Instant) {
        let entry = self.partitions.entry(partition).or_insert((None, now));
        entry.0 = entry.0.max(time);
        entry.1 = now;
    }

    fn idle(&self, last: Instant, now: Instant) -> bool {
        !self.idle_timeout.is_zero() && now.duration_since(last) >= self.idle_timeout
    }

    /// The least newest time over the partitions not idle at `now`; over them all when every
    /// one is idle (the source is quiet: nothing holds its watermark back); `None` while a
    /// partition that is not idle has had no time yet.
    fn least(&self, now: Instant) -> Option<i64> {
        let mut active = self
            .partitions
            .values()
            .filter(|(_, last)| !self.idle(*last, now))
            .peekable();
        if active.peek().is_none() {
            return self.partitions.values().filter_map(|(t, _)| *t).max();
        }
        active.map(|(t, _)| *t).min().flatten()
    }

    /// When the next partition that is not idle becomes idle, if any will.
    fn next_idle(&self, now: Instant) -> Option<Instant> {
        if self.idle_timeout.is_zero() {
            return None;
        }
        self.partitions
            .values()
            .filter(|(_, last)| !self.idle(*last, now))
            .map(|(_, last)| *last + self.idle_timeout)
            .min()
    }
}

/// What only the source's own reader does.
struct Own {
    progress: Arc<Progress>,
    /// The source's id, under which checkpoints keep its offsets.
    id: crate::catalog::ObjectId,
    /// News of durable checkpoints, whose offsets for this source go to its consumer group
    /// (`weir-<source>`) for the usual lag tools; nothing reads them back.
    durable: Option<watch::Receiver<DurableSplits>>,
    /// The checkpoint's positions last committed.
    committed: Option<DurableSplits>,
    config: Config,
    /// `None` for a source without a watermark.
    times: Option<PartitionTimes>,
    /// The least time last given to the source (`Reader::times`), so that an idle partition's
    /// leaving gives a new one only once.
    least: Option<i64>,
    /// When to look for new partitions next; `None`: never.
    discovery: Option<Instant>,
}

pub struct KafkaReader {
    source: String,
    /// Taken only when the reader is dropped; `None` from the start for a reading again that
    /// has nothing to read.
    consumer: Option<StreamConsumer<Context>>,
    rows: Rows,
    schema: SchemaRef,
    on_error: OnError,
    /// The changes of the batch last given, for a table (`Reader::take_ops`).
    ops: Option<Vec<Op>>,
    offsets: Offsets,
    own: Option<Own>,
    /// A message that is not a row, with `on_error = 'fail'`: the next call fails with it,
    /// after the rows before it went out.
    failure: Option<Error>,
    /// How long to wait after the next error.
    backoff: Duration,
}

impl KafkaReader {
    /// A reader of `def`'s topic from `next`, each partition up to `until` where given (reading
    /// again); with `progress`, the source's own reader.
    pub fn open(
        def: &SourceDef,
        config: Config,
        (next, until): (BTreeMap<i32, i64>, Option<BTreeMap<i32, i64>>),
        progress: Option<Arc<Progress>>,
        durable: Option<watch::Receiver<DurableSplits>>,
    ) -> Result<KafkaReader> {
        let rows = Rows::new(def, config.format, config.encode, &config.include);
        let context = Context {
            source: def.name.clone(),
            topic: config.topic.clone(),
            progress: progress.clone(),
            splits: Mutex::new((next.clone(), BTreeMap::new())),
        };
        let consumer = if until.is_some() && next.is_empty() {
            None
        } else {
            let mut client = config.client_config();
            if progress.is_some() {
                client
                    .set("statistics.interval.ms", STATISTICS_INTERVAL_MS)
                    .set("group.id", format!("weir-{}", def.name));
            }
            let consumer: StreamConsumer<Context> =
                client.create_with_context(context).map_err(unreachable)?;
            assign(&consumer, &config.topic, &next)?;
            Some(consumer)
        };
        let now = crate::clock::monotonic();
        let own = progress.map(|progress| Own {
            progress,
            id: def.id,
            durable,
            committed: None,
            times: def.watermark.map(|w| PartitionTimes {
                column: w.column,
                idle_timeout: config.idle_timeout,
                partitions: next.keys().map(|p| (*p, (None, now))).collect(),
            }),
            least: None,
            discovery: (!config.discovery_interval.is_zero())
                .then(|| now + config.discovery_interval),
            config,
        });
        let reader = KafkaReader {
            source: def.name.clone(),
            consumer,
            rows,
            schema: def.schema(),
            on_error: own.as_ref().map_or(OnError::Skip, |o| o.config.on_error),
            ops: None,
            offsets: Offsets { next, until },
            own,
            failure: None,
            backoff: BACKOFF_MIN,
        };
        reader.publish();
        Ok(reader)
    }

    fn consumer(&self) -> &StreamConsumer<Context> {
        self.consumer
            .as_ref()
            .expect("a reader that reads has its consumer until it drops")
    }

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
                    self.source, self.offsets.next
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
        if let Some(own) = &self.own {
            own.progress
                .waiting(Some(format!("Kafka broker error: {e}")));
        }
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        Ok(())
    }

    /// Keeps a message taken from the consumer in `batch` if it is one to read (not past its
    /// partition's end when reading again); returns its value's bytes.
    fn keep(&mut self, t: Taken, batch: &mut Vec<Taken>) -> usize {
        if !self.offsets.take(t.partition, t.offset) {
            return 0;
        }
        let bytes = t.payload.as_ref().map_or(0, Vec::len);
        batch.push(t);
        bytes
    }

    /// The rows (or a table's changes) of the messages taken; messages that give none are
    /// skipped (and recorded), or with `on_error = 'fail'` end the batch before the first of
    /// them and fail the next call, the partitions' offsets put back to `before` and those
    /// taken after it (so that the position fed with the rows is theirs). Returns the rows,
    /// their changes and each one's partition.
    fn changes(
        &mut self,
        taken: &mut Vec<Taken>,
        before: BTreeMap<i32, i64>,
    ) -> Result<Option<Changes>> {
        let mut built = self.rows.build(taken)?;
        if self.on_error == OnError::Fail {
            if let Some((first, why)) = built.bad.first().cloned() {
                let t = &taken[first];
                let at = format!("partition {} offset {}", t.partition, t.offset);
                self.failure = Some(malformed(&self.source, &at, &why));
                let kept = built.messages.iter().take_while(|m| **m < first).count();
                built.batch = built
                    .batch
                    .map(|b| b.slice(0, kept))
                    .filter(|b| b.num_rows() > 0);
                built.ops.truncate(kept);
                built.messages.truncate(kept);
                self.offsets.next = before;
                for t in &taken[..first] {
                    self.offsets.next.insert(t.partition, t.offset + 1);
                }
                taken.truncate(first);
            }
        } else if let Some(own) = &self.own {
            for (m, why) in &built.bad {
                let t = &taken[*m];
                own.progress.skipped(
                    &self.source,
                    t.partition.to_string(),
                    t.offset.to_string(),
                    t.payload
                        .as_deref()
                        .or(t.key.as_deref())
                        .unwrap_or_default(),
                    why.clone(),
                );
            }
        }
        let Some(batch) = built.batch else {
            return Ok(None);
        };
        let partitions = built.messages.iter().map(|m| taken[*m].partition).collect();
        Ok(Some((batch, built.ops, partitions)))
    }

    /// Each row's event time into its partition's; every message taken marks its partition
    /// as not idle.
    fn track_times(&mut self, taken: &[Taken], rows: Option<&Changes>) {
        let Some(times) = self.own.as_mut().and_then(|o| o.times.as_mut()) else {
            return;
        };
        let now = crate::clock::monotonic();
        for t in taken {
            times.seen(t.partition, None, now);
        }
        if let Some((batch, _, partitions)) = rows {
            if let Some(column) = batch
                .column(times.column)
                .as_primitive_opt::<TimestampMicrosecondType>()
            {
                for (row, p) in partitions.iter().enumerate() {
                    if column.is_valid(row) {
                        times.seen(*p, Some(column.value(row)), now);
                    }
                }
            }
        }
    }

    /// The partitions' progress into the source's, for `weir_catalog.source_splits`.
    fn publish(&self) {
        if let (Some(_), Some(consumer)) = (&self.own, &self.consumer) {
            consumer.context().publish(Some(&self.offsets.next));
        }
    }

    /// Looks for partitions added to the topic, and reads each from its first offset (a
    /// partition is new when it is created, so that offset is 0).
    fn discover(&mut self) -> Result<()> {
        let (Some(own), Some(consumer)) = (&self.own, &self.consumer) else {
            return Ok(());
        };
        let partitions = match crate::blocking(|| own.config.partitions(consumer)) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(
                    source = self.source,
                    "cannot list the topic's partitions: {e}"
                );
                return Ok(());
            }
        };
        let new: Vec<i32> = partitions
            .into_iter()
            .filter(|p| !self.offsets.next.contains_key(p))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        tracing::info!(source = self.source, ?new, "Kafka topic has new partitions");
        for p in &new {
            self.offsets.next.insert(*p, 0);
        }
        assign(consumer, &own.config.topic, &self.offsets.next)?;
        let now = crate::clock::monotonic();
        if let Some(times) = self.own.as_mut().and_then(|o| o.times.as_mut()) {
            for p in new {
                times.partitions.entry(p).or_insert((None, now));
            }
        }
        Ok(())
    }

    /// Commits the offsets of the newest durable checkpoint to the source's consumer group,
    /// where they changed: for monitoring only.
    fn commit_durable(&mut self) {
        let (Some(own), Some(consumer)) = (&mut self.own, &self.consumer) else {
            return;
        };
        let Some(durable) = own.durable.as_mut() else {
            return;
        };
        let splits = durable.borrow_and_update().clone();
        if own
            .committed
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &splits))
        {
            return;
        }
        own.committed = Some(splits.clone());
        let Some(offsets) = splits.get(&own.id) else {
            return;
        };
        let mut list = TopicPartitionList::new();
        for (p, o) in offsets {
            if let (Ok(p), Some(o)) = (p.parse::<i32>(), o.as_i64()) {
                let _ = list.add_partition_offset(&own.config.topic, p, Offset::Offset(o));
            }
        }
        if let Err(e) = consumer.commit(&list, CommitMode::Async) {
            tracing::warn!(
                source = self.source,
                "cannot commit offsets to the consumer group: {e}"
            );
        }
    }

    /// When the reader must wake up without a message: to look for partitions, or because a
    /// partition becomes idle.
    fn wake_at(&self) -> Option<Instant> {
        let own = self.own.as_ref()?;
        let now = crate::clock::monotonic();
        let idle = own.times.as_ref().and_then(|t| t.next_idle(now));
        match (own.discovery, idle) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Raises the least time over the partitions that the source reads (`Reader::times`) to
    /// what the partitions' times say now; whether it rose.
    fn least_rose(&mut self) -> bool {
        let Some(own) = &mut self.own else {
            return false;
        };
        let Some(times) = &own.times else {
            return false;
        };
        let least = times.least(crate::clock::monotonic());
        if least > own.least {
            own.least = least;
            return true;
        }
        false
    }
}

/// Assigns the consumer each partition at its offset.
fn assign(
    consumer: &StreamConsumer<Context>,
    topic: &str,
    next: &BTreeMap<i32, i64>,
) -> Result<()> {
    let mut list = TopicPartitionList::new();
    for (p, o) in next {
        list.add_partition_offset(topic, *p, Offset::Offset(*o))
            .map_err(unreachable)?;
    }
    consumer.assign(&list).map_err(unreachable)
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
            if let Some(e) = self.failure.take() {
                return Err(e);
            }
            if self.offsets.read_again_to_end() {
                return Ok(None);
            }
            let now = crate::clock::monotonic();
            if let Some(own) = self
                .own
                .as_mut()
                .filter(|o| o.discovery.is_some_and(|d| d <= now))
            {
                own.discovery = Some(now + own.config.discovery_interval);
                self.discover()?;
            }
            self.commit_durable();
            if self.least_rose() {
                // Partitions went idle: the watermark moves without a row.
                return Ok(Some(RecordBatch::new_empty(self.schema.clone())));
            }
            let wake = self.wake_at();
            let key = self.rows.reads_keys;
            // Wait for the first message, woken to look for partitions or when a partition
            // goes idle.
            let first = {
                let consumer = self
                    .consumer
                    .as_ref()
                    .expect("a reader that reads has its consumer until it drops");
                let durable = self.own.as_mut().and_then(|o| o.durable.as_mut());
                let timer = async {
                    match wake {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let checkpointed = async {
                    let changed = match durable {
                        Some(d) => d.changed().await.is_ok(),
                        None => false,
                    };
                    if !changed {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    m = consumer.recv() => Some(m.map(|m| copy(&m, key))),
                    _ = timer => None,
                    _ = checkpointed => None,
                }
            };
            let first = match first {
                None => continue,
                Some(Err(e)) => {
                    self.failed(e).await?;
                    continue;
                }
                Some(Ok(t)) => {
                    self.backoff = BACKOFF_MIN;
                    t
                }
            };
            // Nothing is awaited from here to the return, so that a caller that stops waiting
            // (the source paused) never drops messages already taken.
            let before = self.offsets.next.clone();
            let mut batch = Vec::new();
            let mut bytes = self.keep(first, &mut batch);
            while batch.len() < BATCH_MESSAGES_MAX && bytes < BATCH_BYTES_MAX {
                let next = match self.consumer().recv().now_or_never() {
                    Some(Ok(m)) => copy(&m, key),
                    // Met again, and waited out, by the next call.
                    Some(Err(_)) | None => break,
                };
                bytes += self.keep(next, &mut batch);
            }
            if let Some(own) = &self.own {
                own.progress.waiting(None);
            }
            let changes = self.changes(&mut batch, before)?;
            self.track_times(&batch, changes.as_ref());
            // The rows go out with the watermark their times give.
            self.least_rose();
            self.publish();
            if let Some((rows, ops, _)) = changes {
                self.ops = Some(ops);
                return Ok(Some(rows));
            }
        }
    }
}

/// A message's parts, copied out of the consumer's buffer (its key only where a column
/// includes it).
fn copy(m: &BorrowedMessage<'_>, key: bool) -> Taken {
    Taken {
        partition: m.partition(),
        offset: m.offset(),
        timestamp_ms: match m.timestamp() {
            Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
            Timestamp::NotAvailable => None,
        },
        key: key.then(|| m.key().map(<[u8]>::to_vec)).flatten(),
        payload: m.payload().map(<[u8]>::to_vec),
    }
}

impl crate::connector::source::Reader for KafkaReader {
    fn splits(&self) -> Option<Splits> {
        Some(Arc::new(
            self.offsets
                .next
                .iter()
                .map(|(p, o)| (p.to_string(), serde_json::Value::from(*o)))
                .collect(),
        ))
    }

    fn take_ops(&mut self) -> Option<Vec<Op>> {
        self.ops.take()
    }

    fn times(&self) -> Times {
        match self
            .own
            .as_ref()
            .and_then(|o| o.times.as_ref().map(|_| o.least))
        {
            Some(least) => Times::Splits(least),
            None => Times::Rows,
        }
    }
}
