//! The operator trait: what every incremental operator implements. The actor owns the loop.

use super::chunk::StreamChunk;
use super::message::Watermark;
use crate::error::Result;
use crate::state::EpochWrites;

/// Where an operator puts its output: the operator above it in the actor, which takes each
/// chunk as it comes, or the actor's output, which sends chunks downstream once enough wait.
/// So an operator whose output for one chunk is far larger than the chunk (a join on a hot
/// key) never holds that output whole: it emits it a part at a time.
pub trait Emit {
    fn emit(&mut self, chunk: StreamChunk) -> Result<()>;
}

/// Output gathered in memory (tests, and the barrier's output of a pipeline).
impl Emit for Vec<StreamChunk> {
    fn emit(&mut self, chunk: StreamChunk) -> Result<()> {
        self.push(chunk);
        Ok(())
    }
}

/// An incremental operator: it turns input changes into output changes and keeps whatever
/// state it needs. It never sees barriers as messages and never forwards them. Most operators
/// have one input; a join has two, a union any number.
pub trait Operator: Send {
    /// Transforms one chunk of changes arriving on input `input` (numbered from 0), emitting
    /// output chunks to `out`.
    fn on_chunk(&mut self, input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()>;

    /// A watermark arrived on input `input`. Returns the watermarks to pass downstream (on
    /// the operator's own output columns); the default passes none. An operator that closes
    /// windows emits their final rows to `out`.
    fn on_watermark(
        &mut self,
        _input: usize,
        _watermark: Watermark,
        _out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        Ok(Vec::new())
    }

    /// The barrier ending the epoch carries this time; called just before `on_barrier`.
    fn on_tick(&mut self, _now_us: i64) {}

    /// Called once when epoch `epoch` ends on every input: emit the changes the operator held
    /// back for the epoch (if any) and move its dirty state into `writes`. Stateless
    /// operators have nothing to do.
    fn on_barrier(
        &mut self,
        _epoch: u64,
        _out: &mut dyn Emit,
        _writes: &mut EpochWrites,
    ) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
pub mod test_util {
    //! A state store for operator tests, and the epochs ended on it.
    use std::sync::Arc;

    use super::Operator;
    use crate::state::{EpochWrites, StateStore};
    use crate::stream::chunk::StreamChunk;

    pub struct Epochs {
        _dir: tempfile::TempDir,
        pub store: Arc<StateStore>,
        /// The last epoch ended.
        epoch: u64,
    }

    impl Default for Epochs {
        fn default() -> Epochs {
            Epochs::new()
        }
    }

    impl Epochs {
        pub fn new() -> Epochs {
            let dir = tempfile::tempdir().unwrap();
            let store = StateStore::open_fresh(dir.path()).unwrap();
            Epochs {
                _dir: dir,
                store,
                epoch: 0,
            }
        }

        /// Ends the next epoch of `op`: its barrier hook runs, appending what it emits to
        /// `out`, and its writes are committed and sealed, so later reads come from RocksDB.
        pub async fn end(&mut self, op: &mut dyn Operator, out: &mut Vec<StreamChunk>) {
            self.epoch += 1;
            let mut writes = EpochWrites::default();
            op.on_barrier(self.epoch, out, &mut writes).unwrap();
            self.store.commit(self.epoch, writes).await.unwrap();
            self.store.seal(self.epoch);
        }

        /// Ends the next epoch of several operators on the store, dropping what they emit.
        pub async fn end_all(&mut self, ops: &mut [&mut dyn Operator]) {
            self.epoch += 1;
            for op in ops.iter_mut() {
                let mut writes = EpochWrites::default();
                op.on_barrier(self.epoch, &mut vec![], &mut writes).unwrap();
                self.store.commit(self.epoch, writes).await.unwrap();
            }
            self.store.seal(self.epoch);
        }
    }
}
