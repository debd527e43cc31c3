//! A subscription's seam with the dataflow: a new output of a relation's actor, added at a
//! barrier like a new view's input but with no contents first, whose changes a task of its
//! own takes off the channel at once and holds, an epoch at a time, for the client to read.
//! A client that reads slowly never holds up the relation's actor: its subscription's held
//! changes grow instead, and past their bound the subscription ends with an error (54000)
//! and its channel closes, which drops the output at the actor's next send.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::row::{RowConverter, SortField};
use tokio::sync::{mpsc, Notify};

use super::chunk::{Op, StreamChunk};
use super::message::{ActorId, Message, Mutation, NewOutput};
use crate::error::{Error, ErrorKind, Result};

/// Subscriptions' ids as their relations' actors know them, far above any actor's.
static NEXT_ID: AtomicU32 = AtomicU32::new(0xF000_0000);

/// What a subscription holds for its client.
#[derive(Default)]
struct Held {
    /// Each sealed epoch's changes not yet read, with their bytes.
    epochs: VecDeque<(u64, Vec<StreamChunk>, usize)>,
    bytes: usize,
    /// Why the subscription ended, once it has.
    end: Option<Error>,
}

#[derive(Default)]
struct Buffer {
    held: Mutex<Held>,
    /// Told when an epoch or the end is held.
    ready: Notify,
}

impl Buffer {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn end(&self, e: Error) {
        self.held().end.get_or_insert(e);
        self.ready.notify_one();
    }
}

/// A relation's changes after the barrier that adds the subscription, an epoch at a time.
pub struct Subscription {
    buffer: Arc<Buffer>,
}

/// A subscription to relation `relation` (named `name`, for errors), and the mutation whose
/// barrier starts it: the changes of every epoch after that barrier's come, none before.
/// Past `bytes_max` bytes of changes not yet read, it ends with 54000.
pub fn subscribe(
    relation: ActorId,
    name: &str,
    channel_messages_max: usize,
    bytes_max: usize,
) -> (Mutation, Subscription) {
    let (tx, rx) = mpsc::channel(channel_messages_max.max(1));
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut mutation = Mutation::default();
    mutation.add_outputs.insert(
        relation,
        vec![NewOutput {
            targets: vec![(id, tx)],
            partitioner: None,
            backfill: None,
        }],
    );
    let buffer = Arc::new(Buffer::default());
    tokio::spawn(pump(rx, buffer.clone(), name.to_string(), bytes_max));
    (mutation, Subscription { buffer })
}

/// Takes the relation's messages off the channel as they come, until the subscription is
/// dropped, its bound is passed, or the relation stops.
async fn pump(
    mut rx: mpsc::Receiver<Message>,
    buffer: Arc<Buffer>,
    name: String,
    bytes_max: usize,
) {
    let mut current: Vec<StreamChunk> = Vec::new();
    let mut current_bytes = 0;
    loop {
        let Some(message) = rx.recv().await else {
            buffer.end(Error::new(
                ErrorKind::UndefinedTable,
                format!("relation \"{name}\" was dropped, or stopped: the subscription ends"),
            ));
            return;
        };
        // Nobody reads any more.
        if Arc::strong_count(&buffer) == 1 {
            return;
        }
        match message {
            Message::Chunk(chunk) => {
                current_bytes += chunk.data.get_array_memory_size();
                current.push(chunk);
            }
            Message::Barrier(barrier) => {
                let mut held = buffer.held();
                held.bytes += current_bytes;
                let epoch = (barrier.epoch, std::mem::take(&mut current), current_bytes);
                held.epochs.push_back(epoch);
                current_bytes = 0;
                drop(held);
                buffer.ready.notify_one();
            }
            Message::Watermark(_) => {}
        }
        if buffer.held().bytes + current_bytes > bytes_max {
            buffer.end(
                Error::new(
                    ErrorKind::ProgramLimitExceeded,
                    format!(
                    "the subscription to \"{name}\" holds more than {bytes_max} bytes of changes \
                     its client has not read"
                ),
                )
                .with_hint("Read the changes as they come, or subscribe again."),
            );
            return;
        }
    }
}

impl Subscription {
    /// The next epoch's changes (in the order the relation emitted them), waiting for them;
    /// or why the subscription ended.
    pub async fn next(&self) -> Result<(u64, Vec<StreamChunk>)> {
        loop {
            {
                let mut held = self.buffer.held();
                if let Some((epoch, chunks, bytes)) = held.epochs.pop_front() {
                    held.bytes -= bytes;
                    return Ok((epoch, chunks));
                }
                if let Some(e) = &held.end {
                    return Err(e.clone());
                }
            }
            self.buffer.ready.notified().await;
        }
    }
}

/// How a row changed in an epoch, as a subscription reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Insert,
    Delete,
    /// A key's row before and after an update: the two come together, the old row first.
    UpdateDelete,
    UpdateInsert,
}

impl Change {
    pub fn name(self) -> &'static str {
        match self {
            Change::Insert => "insert",
            Change::Delete => "delete",
            Change::UpdateDelete => "update_delete",
            Change::UpdateInsert => "update_insert",
        }
    }
}

/// An epoch's changes, net: a row inserted and deleted again in the epoch is left out, a row
/// inserted (or deleted) n times more than deleted (inserted) comes n times. Where `key` is
/// given, a key with one row deleted and one inserted is an update (`UpdateDelete` then
/// `UpdateInsert`, together where the first of them was). `None`: no change.
pub fn net_epoch(
    schema: &SchemaRef,
    chunks: &[StreamChunk],
    key: Option<&[usize]>,
) -> Result<Option<(RecordBatch, Vec<Change>)>> {
    if chunks.iter().all(|c| c.is_empty()) {
        return Ok(None);
    }
    let data = concat_batches(schema, chunks.iter().map(|c| &c.data))?;
    let ops: Vec<Op> = chunks.iter().flat_map(|c| c.ops.iter().copied()).collect();
    let converter = |cols: &[usize]| -> Result<datafusion::arrow::row::Rows> {
        let fields = cols
            .iter()
            .map(|c| SortField::new(schema.field(*c).data_type().clone()))
            .collect();
        let columns: Vec<_> = cols.iter().map(|c| data.column(*c).clone()).collect();
        Ok(RowConverter::new(fields)?.convert_columns(&columns)?)
    };
    let all: Vec<usize> = (0..schema.fields().len()).collect();
    let rows = converter(&all)?;
    // Each distinct row's net count, in the order rows first appear.
    let mut net: HashMap<&[u8], (i64, usize)> = HashMap::new();
    let mut order = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let e = net.entry(rows.row(i).data()).or_insert_with(|| {
            order.push(i);
            (0, i)
        });
        e.0 += op.weight();
    }
    let mut changes: Vec<(usize, Change)> = Vec::new();
    for i in order {
        let (n, _) = net[rows.row(i).data()];
        let change = if n > 0 {
            Change::Insert
        } else {
            Change::Delete
        };
        for _ in 0..n.unsigned_abs() {
            changes.push((i, change));
        }
    }
    if changes.is_empty() {
        return Ok(None);
    }
    if let Some(key) = key.filter(|k| !k.is_empty()) {
        changes = pair_updates(changes, &converter(key)?);
    }
    let indices: Vec<u32> = changes.iter().map(|(i, _)| *i as u32).collect();
    let batch = datafusion::arrow::compute::take_record_batch(
        &data,
        &datafusion::arrow::array::UInt32Array::from(indices),
    )?;
    Ok(Some((batch, changes.into_iter().map(|(_, c)| c).collect())))
}

/// Marks a key's one delete and one insert as an update, the two together.
fn pair_updates(
    changes: Vec<(usize, Change)>,
    keys: &datafusion::arrow::row::Rows,
) -> Vec<(usize, Change)> {
    let mut per_key: HashMap<&[u8], (Vec<usize>, Vec<usize>)> = HashMap::new();
    for (at, (i, change)) in changes.iter().enumerate() {
        let e = per_key.entry(keys.row(*i).data()).or_default();
        match change {
            Change::Delete => e.0.push(at),
            _ => e.1.push(at),
        }
    }
    let mut out = Vec::with_capacity(changes.len());
    let mut done = vec![false; changes.len()];
    for (at, (i, _)) in changes.iter().enumerate() {
        if done[at] {
            continue;
        }
        match per_key.get(keys.row(*i).data()) {
            Some((deleted, inserted)) if deleted.len() == 1 && inserted.len() == 1 => {
                let (d, n) = (deleted[0], inserted[0]);
                out.push((changes[d].0, Change::UpdateDelete));
                out.push((changes[n].0, Change::UpdateInsert));
                done[d] = true;
                done[n] = true;
            }
            _ => {
                out.push(changes[at]);
                done[at] = true;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;
    use datafusion::arrow::util::display::array_value_to_string;

    fn render(s: &SchemaRef, chunks: &[StreamChunk], key: Option<&[usize]>) -> Vec<String> {
        let Some((batch, changes)) = net_epoch(s, chunks, key).unwrap() else {
            return Vec::new();
        };
        (0..batch.num_rows())
            .map(|r| {
                let k = array_value_to_string(batch.column(0), r).unwrap();
                let v = array_value_to_string(batch.column(1), r).unwrap();
                format!("{} {k} {v}", changes[r].name())
            })
            .collect()
    }

    #[test]
    fn an_epochs_changes_are_net_and_a_keys_delete_and_insert_are_an_update() {
        let s = schema(&[("k", DataType::Utf8), ("v", DataType::Int64)]);
        // a: updated; b: inserted and deleted again; c: deleted; d: inserted twice.
        let chunks = [
            chunk(&s, "+ a 2\n+ b 1\n- c 3"),
            chunk(&s, "- a 1\n- b 1\n+ d 4\n+ d 4"),
        ];
        assert_eq!(
            render(&s, &chunks, Some(&[0])),
            [
                "update_delete a 1",
                "update_insert a 2",
                "delete c 3",
                "insert d 4",
                "insert d 4"
            ]
        );
        // Without a key, an update is a delete and an insert.
        assert_eq!(
            render(&s, &chunks, None),
            [
                "insert a 2",
                "delete c 3",
                "delete a 1",
                "insert d 4",
                "insert d 4"
            ]
        );
        assert!(render(&s, &[chunk(&s, "+ x 1\n- x 1")], Some(&[0])).is_empty());
    }
}
