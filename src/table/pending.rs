//! A transaction block's changes to one table until COMMIT (`Pending`): summed in memory as
//! the writer sums its unsealed changes, and past `MEMORY_BYTES` moved to a tally on disk in
//! the spool directory, whose files count against `temp_disk_limit`. So a block writes as much
//! as a statement outside one may (`docs/design/0010-transactions.md`).

use std::sync::Arc;

use datafusion::common::HashMap as RowMap;

use crate::changelog::{Reserved, TempDisk};
use crate::error::{Error, Result};
use crate::state::Tally;
use crate::stream::relation::{Changes, RowChanges};

use super::{add_to, Change};

/// The most bytes of changes a block keeps in memory for one table (each change counted
/// twice: summed, and as a key touched); past them, they go to disk.
pub(super) const MEMORY_BYTES: usize = 16 << 20;

/// How many changes go to disk in one write.
const SPILL_ENTRIES: usize = 64 << 10;

/// The tally's key spaces: rows as the table stores them, with how the block changed their
/// multiplicity; primary keys, with how it moved them (+1 added, -1 removed); and what it
/// touched, for its conflicts (each key, or each row deleted from a table without a primary
/// key).
const ROWS: u8 = b'r';
const KEYS: u8 = b'k';
const TOUCHED: u8 = b't';

/// A block's changes to one table. Never 0.
#[derive(Default)]
pub(super) struct Pending {
    changes: RowChanges,
    keys: RowMap<Arc<[u8]>, i64>,
    touched: RowMap<Arc<[u8]>, ()>,
    /// What the maps above take (about).
    bytes: usize,
    /// The changes moved out of memory, added to those in it.
    disk: Option<OnDisk>,
}

struct OnDisk {
    tally: Tally,
    reserved: Reserved,
}

impl Pending {
    /// Takes one statement's changes (checked); past `MEMORY_BYTES`, moves every change in
    /// memory to disk, refused with 53400 once the tally's files pass `temp_disk_limit`.
    pub(super) fn add(&mut self, changes: Vec<Change>, temp: &Arc<TempDisk>) -> Result<()> {
        for c in changes {
            self.bytes += 2 * c.bytes();
            add_to(&mut self.changes, &c.row, c.weight);
            if let Some(k) = &c.key {
                add_to(&mut self.keys, k, c.weight);
            }
            match c.key {
                Some(k) => self.touched.insert(k, ()),
                None if c.weight < 0 => self.touched.insert(c.row, ()),
                None => None,
            };
        }
        if self.bytes > MEMORY_BYTES {
            crate::blocking(|| self.spill(temp))?;
        }
        Ok(())
    }

    fn spill(&mut self, temp: &Arc<TempDisk>) -> Result<()> {
        let disk = match &mut self.disk {
            Some(disk) => disk,
            None => self.disk.insert(OnDisk {
                tally: Tally::create(&temp.path("block"))?,
                reserved: Reserved::new(temp),
            }),
        };
        let rows = std::mem::take(&mut self.changes);
        let keys = std::mem::take(&mut self.keys);
        let touched = std::mem::take(&mut self.touched);
        self.bytes = 0;
        let all = (rows.into_iter().map(|(k, c)| (ROWS, k, c)))
            .chain(keys.into_iter().map(|(k, c)| (KEYS, k, c)))
            .chain(touched.into_iter().map(|(k, ())| (TOUCHED, k, 1)));
        let mut part: Vec<(Vec<u8>, i64)> = Vec::with_capacity(SPILL_ENTRIES);
        for (space, key, count) in all {
            part.push(([&[space], &*key].concat(), count));
            if part.len() == SPILL_ENTRIES {
                disk.tally
                    .add(part.iter().map(|(k, c)| (k.as_slice(), *c)))?;
                part.clear();
            }
        }
        disk.tally
            .add(part.iter().map(|(k, c)| (k.as_slice(), *c)))?;
        disk.reserved.set(disk.tally.disk_bytes())
    }

    /// Whether some of the changes are on disk.
    pub(super) fn on_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// How the block moved a primary key: +1 added, -1 removed, 0 neither (or both).
    pub(super) fn moved(&self, key: &[u8]) -> Result<i64> {
        let memory = self.keys.get(key).copied().unwrap_or(0);
        match &self.disk {
            Some(disk) => Ok(memory + disk.tally.get(&[&[KEYS], key].concat())?),
            None => Ok(memory),
        }
    }

    /// Whether the block changed the row of primary key `key` (or, for a table without one,
    /// deleted row `key`).
    pub(super) fn touches(&self, key: &[u8]) -> Result<bool> {
        if self.touched.contains_key(key) {
            return Ok(true);
        }
        match &self.disk {
            Some(disk) => Ok(disk.tally.get(&[&[TOUCHED], key].concat())? > 0),
            None => Ok(false),
        }
    }

    /// Whether the block touched a key that `recent` (keys with the number of the commit that
    /// last changed each) says a commit `after` its start changed.
    pub(super) fn touched_since(
        &self,
        recent: &RowMap<Arc<[u8]>, u64>,
        after: &dyn Fn(u64) -> bool,
    ) -> Result<bool> {
        if self.disk.is_none() {
            let changed = |k: &[u8]| recent.get(k).is_some_and(|s| after(*s));
            return Ok(self.touched.keys().any(|k| changed(k)));
        }
        for (key, _) in recent.iter().filter(|(_, s)| after(**s)) {
            if self.touches(key)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The block's changes to the rows, laid over `unsealed` (the table's changes the last
    /// sealed snapshot does not hold), as a read sees them.
    pub(super) fn over(&self, unsealed: &Arc<RowChanges>) -> Changes {
        let memory = match self.changes.is_empty() {
            true => unsealed.clone(),
            false => {
                let mut both = (**unsealed).clone();
                for (row, weight) in &self.changes {
                    add_to(&mut both, row, *weight);
                }
                Arc::new(both)
            }
        };
        Changes::new(memory, self.rows_on_disk())
    }

    /// The block's changes to the rows alone, in key order to scan.
    pub(super) fn rows(&self) -> Changes {
        Changes::new(Arc::new(self.changes.clone()), self.rows_on_disk())
    }

    fn rows_on_disk(&self) -> Option<crate::state::TallyView> {
        self.disk.as_ref().map(|d| d.tally.view(&[ROWS]))
    }

    /// The changes in memory, when none are on disk.
    pub(super) fn in_memory(&self) -> Result<&RowChanges> {
        match self.disk {
            None => Ok(&self.changes),
            Some(_) => Err(Error::internal(
                "a block's changes on disk read as if in memory",
            )),
        }
    }
}
