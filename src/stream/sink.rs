//! A sink's seam with the dataflow: the sink's own actor hands each change to its connector's
//! `SinkWriter` and drives the writer's two-phase commit with the checkpoints
//! (`docs/design/0008-connectors.md`, "Sinks").
//!
//! At a checkpoint's barrier, after every change before it is written, the writer pre-commits
//! and returns a handle (what a restart needs to finish or undo the epoch), which the actor's
//! acknowledgement carries to the checkpoint's manifest. Once that manifest is durable, the
//! actor commits the epoch at its next barrier. A restart opens the writer with the handle of
//! the checkpoint it restored (`sink::open`), and the dataflow sends again everything after
//! that checkpoint: what a sink made visible is what the checkpoints say, exactly once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use super::chunk::{Op, StreamChunk};
use super::message::{Barrier, BarrierKind};
use crate::error::Result;

/// Where a sink's changes go: the connector's side of the seam.
#[async_trait::async_trait]
pub trait SinkWriter: Send {
    /// Takes the next changes, in order (buffering them is the writer's choice: none is final
    /// before its epoch commits).
    fn write(&mut self, chunk: &StreamChunk) -> Result<()>;

    /// Every change before checkpoint `epoch`'s barrier has been written: makes them ready to
    /// commit and returns what a restart needs to commit or abort them, kept in the manifest.
    async fn pre_commit(&mut self, epoch: u64) -> Result<serde_json::Value>;

    /// A checkpoint at or after `epoch` is durable: makes the changes up to `epoch` final.
    /// Called once per pre-committed epoch, in order; an epoch whose checkpoint failed commits
    /// just before the next durable one's, which holds it.
    async fn commit(&mut self, epoch: u64) -> Result<()>;
}

/// The changes a sink has received since the server started (`weir_catalog.sinks`).
#[derive(Debug, Default)]
pub struct SinkCounter {
    pub inserts: AtomicU64,
    pub deletes: AtomicU64,
}

/// A sink's actor's side of the seam: its writer, its counts, and the epochs pre-committed
/// and not yet committed.
pub struct SinkDriver {
    writer: Box<dyn SinkWriter>,
    counter: Arc<SinkCounter>,
    pending: VecDeque<u64>,
    /// The epoch of the newest checkpoint whose manifest is durable.
    durable: watch::Receiver<u64>,
}

impl SinkDriver {
    pub fn new(
        writer: Box<dyn SinkWriter>,
        counter: Arc<SinkCounter>,
        durable: watch::Receiver<u64>,
    ) -> SinkDriver {
        SinkDriver {
            writer,
            counter,
            pending: VecDeque::new(),
            durable,
        }
    }

    pub fn write(&mut self, chunk: &StreamChunk) -> Result<()> {
        let deletes = chunk.ops.iter().filter(|o| **o == Op::Delete).count() as u64;
        self.counter.deletes.fetch_add(deletes, Ordering::Relaxed);
        (self.counter.inserts).fetch_add(chunk.len() as u64 - deletes, Ordering::Relaxed);
        self.writer.write(chunk)
    }

    /// At a barrier, after the changes before it are written: commits the epochs whose
    /// checkpoints are durable, and at a checkpoint's barrier pre-commits its epoch and
    /// returns the handle for the manifest. A checkpoint that failed never becomes durable; its
    /// epoch commits with the next one that does.
    pub async fn on_barrier(&mut self, barrier: &Barrier) -> Result<Option<serde_json::Value>> {
        let durable = *self.durable.borrow_and_update();
        while let Some(&epoch) = self.pending.front().filter(|e| **e <= durable) {
            self.writer.commit(epoch).await?;
            self.pending.pop_front();
        }
        if barrier.kind != BarrierKind::Checkpoint {
            return Ok(None);
        }
        let handle = self.writer.pre_commit(barrier.epoch).await?;
        self.pending.push_back(barrier.epoch);
        Ok(Some(handle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Mutex;

    /// Records what the driver asks of it.
    struct Recorder(Arc<Mutex<Vec<String>>>);

    #[async_trait::async_trait]
    impl SinkWriter for Recorder {
        fn write(&mut self, chunk: &StreamChunk) -> Result<()> {
            self.0
                .lock()
                .unwrap()
                .push(format!("write {}", chunk.len()));
            Ok(())
        }
        async fn pre_commit(&mut self, epoch: u64) -> Result<serde_json::Value> {
            self.0.lock().unwrap().push(format!("pre_commit {epoch}"));
            Ok(serde_json::json!(epoch))
        }
        async fn commit(&mut self, epoch: u64) -> Result<()> {
            self.0.lock().unwrap().push(format!("commit {epoch}"));
            Ok(())
        }
    }

    fn barrier(epoch: u64, checkpoint: bool) -> Barrier {
        Barrier {
            epoch,
            time_us: 0,
            kind: if checkpoint {
                BarrierKind::Checkpoint
            } else {
                BarrierKind::Regular
            },
            mutation: None,
        }
    }

    #[tokio::test]
    async fn epochs_commit_in_order_once_their_checkpoint_is_durable_and_never_before() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (durable, watching) = watch::channel(0);
        let counter = Arc::new(SinkCounter::default());
        let mut driver =
            SinkDriver::new(Box::new(Recorder(log.clone())), counter.clone(), watching);
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let rows = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))]);
        let chunk = StreamChunk::new(vec![Op::Insert, Op::Delete], rows.unwrap());
        driver.write(&chunk).unwrap();
        assert_eq!(driver.on_barrier(&barrier(1, false)).await.unwrap(), None);
        let handle = driver.on_barrier(&barrier(2, true)).await.unwrap();
        assert_eq!(handle, Some(serde_json::json!(2)));
        // Checkpoint 2 failed; checkpoint 3's manifest is durable before barrier 4.
        driver.on_barrier(&barrier(3, true)).await.unwrap();
        durable.send_replace(3);
        driver.on_barrier(&barrier(4, false)).await.unwrap();
        driver.on_barrier(&barrier(5, true)).await.unwrap();
        driver.on_barrier(&barrier(6, false)).await.unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            [
                "write 2",
                "pre_commit 2",
                "pre_commit 3",
                "commit 2",
                "commit 3",
                "pre_commit 5"
            ]
        );
        assert_eq!(counter.inserts.load(Ordering::Relaxed), 1);
        assert_eq!(counter.deletes.load(Ordering::Relaxed), 1);
    }
}
