//! A CDC table's snapshot, a chunk at a time (DBLog, Flink CDC's incremental snapshot): a low
//! watermark written into the WAL, a chunk of the table's rows read by key on a plain
//! connection, a high watermark. While the stream goes from the low watermark to the high
//! one, the keys it changes are noted; at the high watermark the chunk's other rows go into
//! the table as upserts (the stream's changes to the noted keys are newer than the chunk's),
//! and the table's position moves past the chunk's last key.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::stream::Task;
use super::tables::{Row, Snapshot};
use super::upstream;
use crate::catalog::ObjectId;
use crate::error::Result;
use crate::stream::Op;

/// A chunk read, waiting for its high watermark.
pub struct Chunk {
    id: u64,
    table: ObjectId,
    rows: Vec<Row>,
    /// Fewer rows than asked for: the table's last chunk.
    last: bool,
    low_seen: bool,
    /// The keys the stream changed since the low watermark.
    changed: HashSet<Vec<Option<String>>>,
}

impl Chunk {
    /// The stream changed the row of `key` in `table`.
    pub fn changed(&mut self, table: ObjectId, key: &[Option<String>]) {
        if self.low_seen && table == self.table {
            self.changed.insert(key.to_vec());
        }
    }
}

/// A watermark's message: which source's chunk it bounds, and which bound.
#[derive(Debug, Serialize, Deserialize)]
struct Mark {
    source: ObjectId,
    table: ObjectId,
    chunk: u64,
    high: bool,
}

impl Task {
    /// Reads the next chunk of the first table whose snapshot is not done, between its
    /// watermarks; nothing when every table's is done.
    pub(super) async fn next_chunk(&mut self, client: &Client) -> Result<()> {
        let Some((id, after, upstream_name, columns)) =
            self.tables
                .values()
                .find_map(|t| match (&t.snapshot, &t.stopped) {
                    (Snapshot::After(after), None) => Some((
                        t.def.id,
                        after.clone(),
                        t.upstream.clone(),
                        t.def
                            .columns
                            .iter()
                            .map(|c| c.name.clone())
                            .collect::<Vec<_>>(),
                    )),
                    _ => None,
                })
        else {
            return Ok(());
        };
        let table = upstream::describe(client, &upstream_name).await?;
        self.chunks += 1;
        let mark = |high: bool| {
            serde_json::to_string(&Mark {
                source: self.source.id,
                table: id,
                chunk: self.chunks,
                high,
            })
            .unwrap_or_default()
        };
        upstream::watermark(client, &mark(false)).await?;
        let rows = upstream::chunk(
            client,
            &table,
            &columns,
            after.as_deref(),
            self.config.snapshot_rows,
        )
        .await?;
        upstream::watermark(client, &mark(true)).await?;
        self.chunk = Some(Chunk {
            id: self.chunks,
            table: id,
            last: (rows.len() as u64) < self.config.snapshot_rows,
            rows,
            low_seen: false,
            changed: HashSet::new(),
        });
        Ok(())
    }

    /// A watermark came through the stream: the low one opens the chunk's window, the high one
    /// sends the chunk's rows the stream did not change meanwhile.
    pub(super) async fn on_watermark(&mut self, content: &[u8]) -> Result<()> {
        let Ok(mark) = serde_json::from_slice::<Mark>(content) else {
            return Ok(());
        };
        let ours = self
            .chunk
            .as_ref()
            .is_some_and(|c| mark.source == self.source.id && c.id == mark.chunk);
        if !ours {
            // Another source's, or a chunk read before the connection was made again.
            return Ok(());
        }
        if !mark.high {
            if let Some(c) = &mut self.chunk {
                c.low_seen = true;
            }
            return Ok(());
        }
        let Some(chunk) = self.chunk.take() else {
            return Ok(());
        };
        let Some(t) = self.tables.get_mut(&chunk.table) else {
            return Ok(());
        };
        let last_key: Option<Vec<String>> = chunk.rows.last().map(|r| {
            t.key(r)
                .into_iter()
                .map(Option::unwrap_or_default)
                .collect()
        });
        let upserts: Vec<(Op, Row)> = chunk
            .rows
            .into_iter()
            .filter(|r| !chunk.changed.contains(&t.key(r)))
            .map(|r| (Op::Insert, r))
            .collect();
        t.snapshot = match (chunk.last, last_key) {
            (false, Some(key)) => Snapshot::After(Some(key)),
            _ => Snapshot::Done,
        };
        let chunks = if upserts.is_empty() {
            Vec::new()
        } else {
            match t.chunk(&upserts) {
                Ok(c) => vec![c],
                Err(e) => {
                    t.stop(format!("an upstream value does not read: {e}"));
                    return Ok(());
                }
            }
        };
        let id = t.def.id;
        self.send(vec![(id, chunks)]).await;
        Ok(())
    }
}
