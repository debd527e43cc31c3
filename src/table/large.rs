//! A statement whose rows were spooled (`changelog::Rows::Spooled`): checked a part at a time
//! (its primary keys against the latest rows and against its own earlier keys, kept in a
//! scratch store on disk), logged as one group of records whose last sync commits it, then
//! applied a part per epoch while readers stay at the epoch before it, so that they see all of
//! it or none (`docs/design/0023-large-writes.md`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::changelog::{Reserved, Rows, TempDisk};
use crate::error::Result;
use crate::state::{Scratch, Snapshot};
use crate::stream::{Op, StreamChunk};

use super::{duplicate_key, TableWriter};

/// What the scratch store keeps for a key the statement touched.
const REMOVED: u8 = 0;
const ADDED: u8 = 1;

/// A statement's changes a part at a time, as chunks: the deleted rows first, then the
/// inserted ones, as `TableWriter::chunk_of` orders a small statement's.
pub(super) fn changes<'a>(
    deleted: Option<&'a Rows>,
    inserted: Option<&'a Rows>,
) -> Result<impl Iterator<Item = Result<StreamChunk>> + 'a> {
    let mut all = Vec::new();
    for (rows, op) in [(deleted, Op::Delete), (inserted, Op::Insert)] {
        if let Some(rows) = rows {
            all.push(rows.parts()?.map(move |part| {
                let part = part?;
                Ok(StreamChunk::new(vec![op; part.num_rows()], part))
            }));
        }
    }
    Ok(all.into_iter().flatten())
}

impl TableWriter {
    /// Checks, logs and applies a statement too large for memory; returns how many rows it
    /// affected. As for any statement, a failure before it is logged leaves nothing of it, and
    /// once it is logged it is acknowledged even if the table's actor stops meanwhile.
    pub(super) async fn write_large(
        &mut self,
        deleted: Option<Rows>,
        inserted: Option<Rows>,
        temp: &Arc<TempDisk>,
    ) -> Result<usize> {
        let (deleted, inserted) = (deleted.as_ref(), inserted.as_ref());
        let affected = affected_rows(deleted, inserted);
        let snapshot = self.ready().await?;
        crate::blocking(|| self.check_large(deleted, inserted, &snapshot, temp))?;
        let first = crate::blocking(|| self.log.append_group(&mut changes(deleted, inserted)?))?;
        // Durable but not yet sent nor acknowledged: a crash here leaves a statement in doubt.
        crate::failpoint::hit("table.after_append");
        // Logged, the statement is acknowledged whatever happens next: a restart applies
        // what of it did not reach the table's actor.
        if let Err(e) = self.apply_group(first, deleted, inserted).await {
            tracing::error!(
                table = %self.def.name,
                "a logged statement could not be applied whole ({e}); the table takes no \
                 more writes, and views see the statement after a restart"
            );
            self.in_doubt = true;
        }
        self.barriers.wrote();
        Ok(affected)
    }

    /// Applies a logged group (from record `first`) a part per epoch, and seals the last,
    /// with readers held at the epoch before the first until then.
    async fn apply_group(
        &mut self,
        first: u64,
        deleted: Option<&Rows>,
        inserted: Option<&Rows>,
    ) -> Result<()> {
        let in_flight = self.transactions.commit();
        let sequence = in_flight.sequence;
        let _hold = self.barriers.hold();
        for (record, chunk) in (first..).zip(changes(deleted, inserted)?) {
            let chunk = chunk?;
            if record > first {
                // One part per epoch: the table's actor, the views after it and the unsealed
                // changes hold about a part (what the barrier sealed is forgotten).
                self.barriers.flush().await?;
                self.seal()?;
            }
            let watermark = self.apply(record, sequence, &chunk)?;
            if self.feed.send_statement(chunk, watermark).await.is_err() {
                return Err(self.stopped());
            }
            // A crash here leaves a logged statement partly applied (a checkpoint may hold it
            // so): a restart applies the rest from the log.
            crate::failpoint::hit("table.group_part_sent");
        }
        self.barriers.flush().await?;
        Ok(())
    }

    /// Checks a large statement's rows as `check_columns` and `check_keys` check a small
    /// one's: its inserted rows against the columns' constraints, and its keys (deleted ones
    /// first) against the latest rows and each other, those of earlier parts in a scratch
    /// store in `temp` (whose files count against its budget).
    fn check_large(
        &self,
        deleted: Option<&Rows>,
        inserted: Option<&Rows>,
        snapshot: &Snapshot,
        temp: &Arc<TempDisk>,
    ) -> Result<()> {
        let keyed = self.unsealed.key.is_some();
        let mut scratch = match keyed {
            true => Some((Scratch::create(&temp.path("keys"))?, Reserved::new(temp))),
            false => None,
        };
        for chunk in changes(deleted, inserted)? {
            let chunk = chunk?;
            if chunk.ops.first() == Some(&Op::Insert) {
                self.check_columns(&chunk.data)?;
            }
            if let Some((scratch, reserved)) = &mut scratch {
                self.check_part_keys(&chunk, snapshot, scratch)?;
                reserved.set(scratch.disk_bytes())?;
            }
        }
        Ok(())
    }

    /// Checks one part's keys and keeps them in `scratch` for the parts after it.
    fn check_part_keys(
        &self,
        chunk: &StreamChunk,
        snapshot: &Snapshot,
        scratch: &Scratch,
    ) -> Result<()> {
        let Some(keys) = self.unsealed.keys_of(chunk.data.columns())? else {
            return Ok(());
        };
        // What the statement did to each key before this part, where it did anything.
        let mut before: HashMap<&[u8], Option<u8>> = HashMap::with_capacity(keys.len());
        for key in &keys {
            if !before.contains_key(key.as_slice()) {
                before.insert(key, scratch.get(key)?);
            }
        }
        let moved = |key: &[u8]| self.unsealed.keys.get(key).copied().unwrap_or(0);
        let unsettled: Vec<&[u8]> = keys
            .iter()
            .zip(&chunk.ops)
            .filter(|(k, op)| **op == Op::Insert && before[k.as_slice()].is_none() && moved(k) == 0)
            .map(|(k, _)| k.as_slice())
            .collect();
        let held = self.held_keys(snapshot, &unsettled)?;
        let holds = |key: &[u8]| match moved(key) {
            0 => held.contains(key),
            change => change > 0,
        };
        let mut now: HashMap<&[u8], u8> = HashMap::with_capacity(keys.len());
        for (row, (key, op)) in keys.iter().zip(&chunk.ops).enumerate() {
            let key = key.as_slice();
            let done = now.get(key).copied().or(before[key]);
            match op {
                Op::Delete => {
                    now.insert(key, REMOVED);
                }
                Op::Insert => {
                    let taken = match done {
                        Some(ADDED) => true,
                        Some(_) => false,
                        None => holds(key),
                    };
                    if taken {
                        return Err(duplicate_key(&self.def, chunk, row));
                    }
                    now.insert(key, ADDED);
                }
            }
        }
        scratch.put(now)
    }
}

/// How many rows a statement of these deleted and inserted rows affected, as `block::affected`
/// counts a chunk's.
pub(super) fn affected_rows(deleted: Option<&Rows>, inserted: Option<&Rows>) -> usize {
    let rows = |r: Option<&Rows>| r.map_or(0, Rows::num_rows);
    rows(deleted).max(rows(inserted))
}

/// Whether a statement's rows are too many for memory (spooled): such a statement is written
/// by `write_large`.
pub(super) fn spooled(rows: &Option<Rows>) -> bool {
    matches!(rows, Some(Rows::Spooled(_)))
}
