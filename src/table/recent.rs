//! What a table remembers of recent commits for first committer wins: for each row a commit
//! changed (by primary key; for a table without one, each row it deleted), the commit's number,
//! while a transaction block that may count the commit as after its start is open, or could
//! still begin (`docs/design/0010-transactions.md`, "Isolation").

use std::sync::Arc;

use datafusion::common::HashMap as RowMap;

use crate::error::Result;
use crate::stream::StreamChunk;

/// The most bytes of keys a table remembers for open blocks' conflict checks, and of changes it
/// keeps aside for blocks that may begin.
const RECENT_BYTES_MAX: usize = 16 << 20;

/// The rows changed by recent commits, by commit number. A block whose COMMIT finds one of its
/// rows numbered after its start conflicts. Bounded by `RECENT_BYTES_MAX`: past it everything
/// is forgotten and `horizon` set, and the blocks that began before it get 40001 at COMMIT
/// rather than an unchecked commit.
#[derive(Default)]
pub(super) struct Recent {
    pub(super) keys: RowMap<Arc<[u8]>, u64>,
    bytes: usize,
    pub(super) horizon: u64,
    /// Commits applied while no block was open, as their changes, while a block that begins
    /// now would count them as after its start (they are in flight): their keys are taken only
    /// if such a block opens.
    aside: Vec<(u64, StreamChunk)>,
    aside_bytes: usize,
}

/// Where the blocks stand as a commit is applied or checked: `oldest`, the commit after which
/// an open block may count commits as after its start, and the commits in flight, which a
/// block that begins now counts so.
pub(super) struct Blocks {
    pub(super) oldest: Option<u64>,
    pub(super) in_flight: Vec<u64>,
}

impl Blocks {
    /// Whether a block, open or yet to begin, may count commit `sequence` as after its start.
    fn may_count(&self, sequence: u64) -> bool {
        self.oldest.is_some_and(|o| sequence > o) || self.in_flight.contains(&sequence)
    }
}

impl Recent {
    /// Takes in commit `sequence`'s changes (`keys` gives the rows they change): by key while
    /// a block is open, aside otherwise.
    pub(super) fn take(
        &mut self,
        sequence: u64,
        chunk: &StreamChunk,
        blocks: &Blocks,
        keys: &dyn Fn(&StreamChunk) -> Result<Vec<Vec<u8>>>,
    ) -> Result<()> {
        self.settle(blocks, keys)?;
        if blocks.oldest.is_some() {
            return self.insert(sequence, keys(chunk)?);
        }
        self.aside_bytes += chunk.data.get_array_memory_size();
        self.aside.push((sequence, chunk.clone()));
        if self.aside_bytes > RECENT_BYTES_MAX {
            // Too much to keep (a large statement in flight): a block that begins meanwhile
            // cannot be checked key by key.
            self.horizon = self.horizon.max(sequence);
            self.aside.clear();
            self.aside_bytes = 0;
        }
        Ok(())
    }

    /// Brings what is remembered up to date with `blocks`: the commits kept aside that an open
    /// block counts as after its start are taken by key, those no block can count any more are
    /// dropped, and so are the keys no block can care about.
    pub(super) fn settle(
        &mut self,
        blocks: &Blocks,
        keys: &dyn Fn(&StreamChunk) -> Result<Vec<Vec<u8>>>,
    ) -> Result<()> {
        if !self.aside.is_empty() {
            let aside = std::mem::take(&mut self.aside);
            self.aside_bytes = 0;
            for (sequence, chunk) in aside {
                if blocks.oldest.is_some_and(|o| sequence > o) {
                    self.insert(sequence, keys(&chunk)?)?;
                } else if blocks.may_count(sequence) {
                    self.aside_bytes += chunk.data.get_array_memory_size();
                    self.aside.push((sequence, chunk));
                }
            }
        }
        if blocks.oldest.is_none() || self.bytes > RECENT_BYTES_MAX / 2 {
            self.keys.retain(|_, s| blocks.may_count(*s));
            self.bytes = self.keys.keys().map(|k| k.len()).sum();
        }
        Ok(())
    }

    fn insert(&mut self, sequence: u64, keys: Vec<Vec<u8>>) -> Result<()> {
        for key in keys {
            if self.bytes + key.len() > RECENT_BYTES_MAX {
                // Too much to remember: the blocks open now cannot be checked key by key.
                self.keys.clear();
                self.bytes = 0;
                self.horizon = sequence;
                return Ok(());
            }
            let len = key.len();
            if self.keys.insert(Arc::from(key), sequence).is_none() {
                self.bytes += len;
            }
        }
        Ok(())
    }
}
