//! A sink's seam with the dataflow (`docs/design/0014-sink-log.md`): the sink's own actor
//! writes what it emits into the sink's log, a state table of its own that each checkpoint
//! holds with the rest of the state, and a delivery task sends each durable checkpoint's share
//! of the log to the connector's `SinkWriter`, which records the checkpoint in the same target
//! transaction. What a target receives after a restart is what the checkpoints logged, never
//! output computed again, and a slow target holds up only its own sink until the log's bound.
//!
//! The log's keys are `(epoch, sequence)`, big-endian; each value is one Arrow IPC stream of a
//! batch of the epoch's changes with their ops (`StreamChunk::to_batch_with_ops`). Entries of
//! epochs the target holds are deleted at the next barrier.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use tokio::sync::{watch, Notify};

use super::chunk::{Op, StreamChunk};
use crate::error::{Error, ErrorKind, Result};
use crate::state::{EpochWrites, StateStore, StateTable, TableId};

/// Where a sink's changes go: the connector's side of the seam. A delivery is `begin`, the
/// checkpoint's changes in order through `write`, and `commit`, which makes them visible in the
/// target together with the checkpoint's epoch, all or nothing. A delivery that fails is begun
/// again from its start: `begin` abandons whatever an earlier one left open.
#[async_trait::async_trait]
pub trait SinkWriter: Send {
    /// The epoch of the newest checkpoint whose changes the target holds (`None`: none yet).
    /// Asked at start and after every failure: what is sent next follows it.
    async fn delivered(&mut self) -> Result<Option<u64>>;

    /// Starts the delivery of the checkpoint at `epoch`. With `replace`, the delivery takes the
    /// place of everything the sink delivered before (the sink was built again and sends its
    /// view's rows anew): a target that can drops that earlier output in the same transaction.
    async fn begin(&mut self, epoch: u64, replace: bool) -> Result<()>;

    /// The next changes of the delivery, in the order the view emitted them.
    async fn write(&mut self, chunk: StreamChunk) -> Result<()>;

    /// Makes the delivery's changes final in the target, with `epoch` as its record of what it
    /// holds.
    async fn commit(&mut self, epoch: u64) -> Result<()>;
}

/// What a sink has done since the server started, and where its delivery stands
/// (`weir_catalog.sinks`).
#[derive(Debug, Default)]
pub struct SinkStatus {
    /// Changes the view emitted into the sink.
    pub inserts: AtomicU64,
    pub deletes: AtomicU64,
    /// Changes the target took, in committed deliveries.
    pub sent: AtomicU64,
    /// The epoch of the last checkpoint the target holds.
    pub delivered: AtomicU64,
    /// The bytes of the log not yet delivered.
    pub log_bytes: AtomicU64,
    /// Failed deliveries in a row, and the last one's error (cleared by a success).
    pub retries: AtomicU64,
    pub error: Mutex<Option<String>>,
    /// Told when a delivery commits, and when the sink is dropped.
    pub changed: Notify,
    stopped: std::sync::atomic::AtomicBool,
}

impl SinkStatus {
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_error(&self, error: Option<String>) {
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    /// Ends the delivery task (the sink is dropped or the server stops).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

/// Most rows in one value of the log.
const LOG_VALUE_ROWS_MAX: usize = 8192;

/// The log's key of an epoch's `seq`-th value.
fn log_key(epoch: u64, seq: u32) -> Vec<u8> {
    let mut k = epoch.to_be_bytes().to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn key_epoch(key: &[u8]) -> Result<u64> {
    key.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| Error::new(ErrorKind::DataCorruption, "a sink log key is too short"))
}

fn encode(chunk: &StreamChunk) -> Result<Vec<u8>> {
    let batch = chunk.to_batch_with_ops()?;
    let mut bytes = Vec::new();
    let mut w = StreamWriter::try_new(&mut bytes, &batch.schema())?;
    w.write(&batch)?;
    w.finish()?;
    drop(w);
    Ok(bytes)
}

fn decode(bytes: &[u8]) -> Result<Vec<StreamChunk>> {
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    let mut chunks = Vec::new();
    for batch in reader {
        chunks.push(StreamChunk::from_batch_with_ops(batch?)?);
    }
    Ok(chunks)
}

/// The sink's log as its actor keeps it.
pub struct SinkLog {
    table: StateTable,
    /// The changes emitted since the last barrier.
    pending: Vec<StreamChunk>,
    /// The log's epochs, with the bytes each holds.
    held: BTreeMap<u64, (u32, u64)>,
    /// Past this many bytes not yet delivered, the actor waits for the delivery at its
    /// barriers (while there is a durable checkpoint to deliver).
    bytes_max: u64,
    durable: watch::Receiver<u64>,
}

impl SinkLog {
    /// The log in state table `table`, as the store holds it (restored, or empty).
    pub fn open(
        store: Arc<StateStore>,
        table: TableId,
        bytes_max: u64,
        durable: watch::Receiver<u64>,
    ) -> Result<SinkLog> {
        let table = StateTable::new(store, table);
        let mut held: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        table.try_scan(&[], None, &mut |k, v| {
            let e = held.entry(key_epoch(k)?).or_default();
            e.0 += 1;
            e.1 += v.len() as u64;
            Ok(true)
        })?;
        Ok(SinkLog {
            table,
            pending: Vec::new(),
            held,
            bytes_max,
            durable,
        })
    }

    fn bytes_after(&self, delivered: u64) -> u64 {
        self.held.range(delivered + 1..).map(|(_, (_, b))| b).sum()
    }
}

/// A sink's actor's side of the seam: its counts, and its log unless its connector keeps
/// nothing (blackhole).
pub struct SinkDriver {
    status: Arc<SinkStatus>,
    log: Option<SinkLog>,
}

impl SinkDriver {
    pub fn new(status: Arc<SinkStatus>, log: Option<SinkLog>) -> SinkDriver {
        if let Some(log) = &log {
            let delivered = status.delivered.load(Ordering::Acquire);
            status
                .log_bytes
                .store(log.bytes_after(delivered), Ordering::Relaxed);
        }
        SinkDriver { status, log }
    }

    pub fn write(&mut self, chunk: &StreamChunk) -> Result<()> {
        let deletes = chunk.ops.iter().filter(|o| **o == Op::Delete).count() as u64;
        self.status.deletes.fetch_add(deletes, Ordering::Relaxed);
        (self.status.inserts).fetch_add(chunk.len() as u64 - deletes, Ordering::Relaxed);
        if let Some(log) = &mut self.log {
            log.pending.push(chunk.clone());
        }
        Ok(())
    }

    /// At barrier `epoch`, after the changes before it: writes them into the log under the
    /// epoch, and deletes the entries the target holds. Past the log's bound it waits for the
    /// delivery of the durable checkpoints first (never for this epoch's, which cannot become
    /// durable while this actor waits).
    pub async fn on_barrier(&mut self, epoch: u64, writes: &mut EpochWrites) -> Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        let pending = std::mem::take(&mut log.pending);
        let mut seq = 0u32;
        let mut at = 0;
        while at < pending.len() {
            // Consecutive chunks of one schema, up to the rows of a value.
            let mut rows = 0;
            let mut end = at;
            while end < pending.len()
                && (end == at || rows + pending[end].len() <= LOG_VALUE_ROWS_MAX)
            {
                rows += pending[end].len();
                end += 1;
            }
            let batches = pending[at..end]
                .iter()
                .map(|c| c.data.clone())
                .collect::<Vec<_>>();
            let data = concat_batches(&pending[at].schema(), &batches)?;
            let ops = pending[at..end].iter().flat_map(|c| c.ops.iter().copied());
            let value = encode(&StreamChunk::new(ops.collect(), data))?;
            let e = log.held.entry(epoch).or_default();
            e.0 += 1;
            e.1 += value.len() as u64;
            log.table.put(log_key(epoch, seq), value);
            seq += 1;
            at = end;
        }
        let delivered = self.status.delivered.load(Ordering::Acquire);
        let gone: Vec<u64> = log.held.range(..=delivered).map(|(e, _)| *e).collect();
        for e in gone {
            if let Some((values, _)) = log.held.remove(&e) {
                for s in 0..values {
                    log.table.delete(log_key(e, s));
                }
            }
        }
        log.table.take_writes(writes);
        loop {
            let delivered = self.status.delivered.load(Ordering::Acquire);
            let bytes = log.bytes_after(delivered);
            self.status.log_bytes.store(bytes, Ordering::Relaxed);
            let durable = *log.durable.borrow();
            if bytes <= log.bytes_max || durable <= delivered || self.status.stopped() {
                return Ok(());
            }
            let changed = self.status.changed.notified();
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }
}

/// Longest wait between attempts at a failing delivery.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// How a sink's delivery starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkStart {
    /// A sink just created: the target holds nothing of it.
    Created,
    /// Restored with its log from the checkpoint of this epoch (durable, though no
    /// checkpoint since has said so).
    Restored(u64),
    /// Built again at a start whose restored checkpoint has this epoch, its log lost: it sends
    /// its view's rows anew, and the first delivery replaces what the target holds of it.
    Rebuilt(u64),
}

/// Sends each durable checkpoint's share of a sink's log to its writer, until the sink is
/// stopped.
pub async fn deliver(
    store: Arc<StateStore>,
    table: TableId,
    mut writer: Box<dyn SinkWriter>,
    status: Arc<SinkStatus>,
    mut durable: watch::Receiver<u64>,
    start: SinkStart,
) {
    let restored = match start {
        SinkStart::Created => 0,
        SinkStart::Restored(e) | SinkStart::Rebuilt(e) => e,
    };
    // Whether the next delivery replaces the target's earlier output: decided at the first
    // answer of the target, until a delivery has done it.
    let mut replace: Option<bool> = match start {
        SinkStart::Rebuilt(_) => None,
        _ => Some(false),
    };
    let mut first_answer: Option<u64> = None;
    let mut backoff = Duration::from_millis(100);
    let mut target: Option<u64> = None;
    while !status.stopped() {
        let result = async {
            let delivered = match target {
                Some(d) => d,
                None => {
                    let d = writer.delivered().await?.unwrap_or(0);
                    if d > restored.max(*durable.borrow()) {
                        return Err(Error::new(
                            ErrorKind::DataCorruption,
                            format!(
                                "the target holds the output up to epoch {d}, after the \
                                 checkpoint the server restored (epoch {restored})"
                            ),
                        ));
                    }
                    // A rebuilt sink whose target holds output of its earlier life. A marker
                    // past the first answer means a delivery of this life is in the target
                    // (one whose commit reported a failure but landed, or that the writer
                    // finished, as a file sink does): the first of them replaced that output.
                    match first_answer {
                        None => first_answer = Some(d),
                        Some(first) if d > first => replace = Some(false),
                        Some(_) => {}
                    }
                    replace.get_or_insert(d > 0);
                    target = Some(d);
                    status.delivered.store(d, Ordering::Release);
                    d
                }
            };
            let upto = restored.max(*durable.borrow_and_update());
            if upto <= delivered {
                return Ok(false);
            }
            let whole = replace == Some(true);
            let sent =
                deliver_range(&store, table, writer.as_mut(), (delivered, upto), whole).await?;
            replace = Some(false);
            status.sent.fetch_add(sent, Ordering::Relaxed);
            status.delivered.store(upto, Ordering::Release);
            target = Some(upto);
            Ok(true)
        }
        .await;
        match result {
            Ok(progress) => {
                status.retries.store(0, Ordering::Relaxed);
                status.set_error(None);
                backoff = Duration::from_millis(100);
                if progress {
                    status.changed.notify_waiters();
                    continue;
                }
                let stopped = status.changed.notified();
                tokio::select! {
                    r = durable.changed() => if r.is_err() { return },
                    _ = stopped => {}
                }
            }
            Err(e) => {
                tracing::warn!("sink delivery failed, retrying in {backoff:?}: {e}");
                status.retries.fetch_add(1, Ordering::Relaxed);
                status.set_error(Some(e.to_string()));
                target = None;
                let stopped = status.changed.notified();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped => {}
                }
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Delivers the log's entries of the epochs after `after` up to `upto` as the checkpoint of
/// `upto`, a value at a time; returns the changes sent. Nothing to send: nothing is asked of
/// the target (its record stays behind, harmless: those epochs hold no entries), unless the
/// delivery is to `replace` the target's earlier output.
async fn deliver_range(
    store: &Arc<StateStore>,
    table: TableId,
    writer: &mut dyn SinkWriter,
    (after, upto): (u64, u64),
    replace: bool,
) -> Result<u64> {
    let snapshot = store.sealed_snapshot();
    let mut from = log_key(after + 1, 0);
    let mut begun = replace;
    if replace {
        writer.begin(upto, true).await?;
    }
    let mut sent = 0;
    loop {
        let next = crate::blocking(|| {
            let mut found = None;
            snapshot.scan_table_from(table, Some(&from), &mut |k, v| {
                found = Some((k.to_vec(), v.to_vec()));
                false
            })?;
            Ok::<_, Error>(found)
        })?;
        let Some((key, value)) = next else { break };
        if key_epoch(&key)? > upto {
            break;
        }
        if !begun {
            writer.begin(upto, false).await?;
            begun = true;
        }
        for chunk in decode(&value)? {
            sent += chunk.len() as u64;
            writer.write(chunk).await?;
        }
        from = key;
        from.push(0);
    }
    if begun {
        writer.commit(upto).await?;
    }
    Ok(sent)
}

#[cfg(test)]
mod tests;
