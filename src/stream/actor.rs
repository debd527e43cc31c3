//! The actor: the one control loop every dataflow node runs. It aligns barriers across its
//! inputs, pushes chunks through its tree of operators into the relation's Materialize, and
//! at each barrier flushes state, commits the epoch, carries out the barrier's mutation,
//! forwards the barrier and acknowledges it to the coordinator.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::mpsc;

use super::align::{AlignedInputs, Event};
use super::chunk::{Op, StreamChunk};
use super::coordinator::ActorEvent;
use super::message::{ActorId, Barrier, Message, NewOutput, Watermark};
use super::operator::Operator;
use super::operators::materialize::Materialize;
use crate::error::{Error, Result};
use crate::state::{EpochWrites, StateStore, TableId};

pub struct Actor {
    pub id: ActorId,
    pub inputs: AlignedInputs,
    pub root: OpNode,
    /// The relation's rows; `None` for a parallel worker of a view, whose output goes to the
    /// view's own actor.
    pub materialize: Option<Materialize>,
    /// Every state table this actor writes, dropped when the actor is stopped.
    pub state_tables: Vec<TableId>,
    pub store: Arc<StateStore>,
    pub events: mpsc::UnboundedSender<ActorEvent>,
    /// Distinct rows per chunk when sending a backfill snapshot downstream.
    pub chunk_rows_max: usize,
    pub outputs: Vec<NewOutput>,
    /// The last watermark sent downstream per column, for outputs added later (after their
    /// backfill).
    pub watermarks: Vec<Watermark>,
    /// A sink's own actor counts the changes it drops.
    pub sink: Option<Arc<SinkCounter>>,
    /// A source's actor: what it backfills new downstreams from.
    pub source: Option<SourceRows>,
}

/// A source's rows so far, read again for a view created after they went by: a source keeps
/// no rows, but reads its stream again from the start (`source::open`).
pub struct SourceRows {
    pub def: crate::catalog::SourceDef,
    /// Rows the actor has passed on, from the stream's first.
    pub seen: u64,
    /// The directory of the sources' ledgers: what is read again must be what was read.
    pub ledgers: std::path::PathBuf,
}

/// The changes a sink has received since the server started (`weir_catalog.sinks`).
#[derive(Debug, Default)]
pub struct SinkCounter {
    pub inserts: AtomicU64,
    pub deletes: AtomicU64,
}

impl Actor {
    /// Runs the actor on the runtime; its end (normal, error or panic) is reported to the
    /// coordinator, so that no epoch waits for an actor that is gone.
    pub fn spawn(self) {
        let id = self.id;
        let events = self.events.clone();
        tokio::spawn(async move {
            let result = AssertUnwindSafe(self.run()).catch_unwind().await;
            let error = match result {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(panic) => Some(Error::internal(
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "actor panicked".to_string()),
                )),
            };
            if let Some(e) = &error {
                tracing::error!(actor = id, "dataflow actor failed: {e}");
            }
            let _ = events.send(ActorEvent::Exited { actor: id, error });
        });
    }

    async fn run(mut self) -> Result<()> {
        while let Some(event) = self.inputs.next().await {
            match event {
                Event::Chunk { input, chunk } => {
                    if let Some(source) = &mut self.source {
                        source.seen += chunk.len() as u64;
                    }
                    let chunks = self.root.on_chunk(input, chunk)?;
                    self.emit(chunks).await?;
                }
                Event::Watermark { input, watermark } => {
                    let mut chunks = Vec::new();
                    let forward = self.root.on_watermark(input, watermark, &mut chunks)?;
                    self.emit(chunks).await?;
                    for w in forward {
                        // Watermarks only advance.
                        match self.watermarks.iter_mut().find(|l| l.column == w.column) {
                            Some(last) if last.value >= w.value => continue,
                            Some(last) => *last = w,
                            None => self.watermarks.push(w),
                        }
                        self.send(Message::Watermark(w)).await;
                    }
                }
                Event::Barrier(barrier) => {
                    if self.on_barrier(barrier).await? {
                        return Ok(());
                    }
                }
            }
        }
        // An actor stops only at a barrier that says so; an input that closes first means the
        // relation this one reads has failed, and so has this one.
        Err(Error::unavailable("the relation this one reads has failed"))
    }

    async fn emit(&mut self, chunks: Vec<StreamChunk>) -> Result<()> {
        for c in chunks {
            if c.is_empty() {
                continue;
            }
            if let Some(m) = &mut self.materialize {
                m.apply(&c)?;
            }
            if let Some(counter) = &self.sink {
                let deletes = c.ops.iter().filter(|o| **o == Op::Delete).count() as u64;
                counter.deletes.fetch_add(deletes, Ordering::Relaxed);
                counter
                    .inserts
                    .fetch_add(c.len() as u64 - deletes, Ordering::Relaxed);
            }
            self.send(Message::Chunk(c)).await;
        }
        Ok(())
    }

    /// Handles one aligned barrier; returns true when the actor stops at it.
    async fn on_barrier(&mut self, barrier: Barrier) -> Result<bool> {
        let epoch = barrier.epoch;
        if cfg!(debug_assertions) && crate::failpoint::fails(&format!("actor.{}.barrier", self.id))
        {
            return Err(Error::internal(
                "failpoint: the actor fails at this barrier",
            ));
        }
        let stopping = barrier.stops(self.id);
        let mut writes = EpochWrites::default();
        let chunks = self.root.on_barrier(epoch, barrier.time_us, &mut writes)?;
        self.emit(chunks).await?;
        if let Some(m) = &mut self.materialize {
            m.flush(&mut writes)?;
        }
        if stopping {
            writes = EpochWrites::default();
            for t in &self.state_tables {
                writes.drop_table(*t);
            }
        }
        self.store.commit(epoch, writes).await?;
        // Acknowledged as soon as committed: the coordinator takes an acknowledgement to mean
        // that this actor's state holds the epoch (where a failed table's state ends).
        self.events
            .send(ActorEvent::Ack {
                actor: self.id,
                epoch,
            })
            .map_err(|_| Error::unavailable("barrier coordinator is gone"))?;
        // New downstreams get the relation's contents first, chunk by chunk to each in turn,
        // so that several (a view's parallel workers) backfill at the same time.
        // Those restored from a checkpoint (`backfill` false) already hold them.
        let new_outputs = barrier.new_outputs(self.id).to_vec();
        if !new_outputs.is_empty() {
            let mut open: Vec<bool> = new_outputs.iter().map(|o| o.backfill).collect();
            if let Some(m) = self
                .materialize
                .as_ref()
                .filter(|_| open.iter().any(|o| *o))
            {
                // A part at a time, so that the relation is never whole in memory; nothing
                // changes it meanwhile, as this actor takes no input until it is done.
                let mut after = None;
                let rows_max = self.chunk_rows_max;
                // Read off the async workers' queue: RocksDB reads can wait on the disk.
                while let Some((chunk, last)) =
                    crate::blocking(|| m.contents_part(after.as_deref(), rows_max))?
                {
                    let message = Message::Chunk(chunk);
                    for (output, open) in new_outputs.iter().zip(open.iter_mut()) {
                        if *open && deliver(output, &message).await.is_err() {
                            *open = false;
                        }
                    }
                    after = Some(last);
                }
            }
            if let Some(source) = self.source.as_ref().filter(|_| open.iter().any(|o| *o)) {
                // Batch by batch: a long stream is never held whole.
                let ledger = Some((source.ledgers.as_path(), false));
                let mut reader = crate::source::open(&source.def, (0, source.seen), ledger)?;
                let mut read = 0;
                while read < source.seen {
                    let rows = (source.seen - read).min(self.chunk_rows_max as u64) as usize;
                    let Some(batch) = crate::blocking(|| reader.next_batch(rows))? else {
                        return Err(Error::internal(format!(
                            "source \"{}\" ended after {read} rows when read again, not {}",
                            source.def.name, source.seen
                        )));
                    };
                    read += batch.num_rows() as u64;
                    let message =
                        Message::Chunk(StreamChunk::new(vec![Op::Insert; batch.num_rows()], batch));
                    for (output, open) in new_outputs.iter().zip(open.iter_mut()) {
                        if *open && deliver(output, &message).await.is_err() {
                            *open = false;
                        }
                    }
                }
            }
            for output in &new_outputs {
                for w in &self.watermarks {
                    let _ = deliver(output, &Message::Watermark(*w)).await;
                }
            }
            self.outputs.extend(new_outputs);
        }
        self.send(Message::Barrier(barrier.clone())).await;
        self.outputs
            .retain(|o| !o.targets.iter().any(|(a, _)| barrier.stops(*a)));
        Ok(stopping)
    }

    async fn send(&mut self, msg: Message) {
        let mut gone = Vec::new();
        for (i, o) in self.outputs.iter().enumerate() {
            if let Err(why) = deliver(o, &msg).await {
                gone.push((i, why));
            }
        }
        for (i, why) in gone.into_iter().rev() {
            let o = self.outputs.remove(i);
            let downstream: Vec<ActorId> = o.targets.iter().map(|(a, _)| *a).collect();
            tracing::warn!(
                actor = self.id,
                ?downstream,
                "no longer feeding downstream actors: {why}"
            );
        }
    }
}

/// Sends a message to an output: a chunk split by its partitioner, anything else to every
/// target. Fails when a target is gone, or when the rows cannot be partitioned; the output is
/// then dropped, its channels close, and the downstream actors fail instead of this one.
async fn deliver(output: &NewOutput, msg: &Message) -> std::result::Result<(), String> {
    let gone = |_| "a downstream actor is gone".to_string();
    match (msg, &output.partitioner) {
        (Message::Chunk(chunk), Some(partitioner)) => {
            let parts = partitioner
                .split(chunk)
                .map_err(|e| format!("cannot partition rows: {e}"))?;
            for ((_, sender), part) in output.targets.iter().zip(parts) {
                if let Some(part) = part {
                    sender.send(Message::Chunk(part)).await.map_err(gone)?;
                }
            }
        }
        _ => {
            for (_, sender) in &output.targets {
                sender.send(msg.clone()).await.map_err(gone)?;
            }
        }
    }
    Ok(())
}

/// The actor's operators as a tree whose leaves are its inputs.
pub enum OpNode {
    /// The changes arriving on actor input `i`.
    Input(usize),
    /// An operator; its input `k` is the output of `inputs[k]`.
    Op {
        op: Box<dyn Operator>,
        inputs: Vec<OpNode>,
    },
}

impl OpNode {
    pub fn unary(op: Box<dyn Operator>, input: OpNode) -> OpNode {
        OpNode::Op {
            op,
            inputs: vec![input],
        }
    }

    fn reads(&self, input: usize) -> bool {
        match self {
            OpNode::Input(i) => *i == input,
            OpNode::Op { inputs, .. } => inputs.iter().any(|n| n.reads(input)),
        }
    }

    /// Pushes a chunk from actor input `input` up the path to this node; returns this node's
    /// output.
    fn on_chunk(&mut self, input: usize, chunk: StreamChunk) -> Result<Vec<StreamChunk>> {
        match self {
            OpNode::Input(_) => Ok(vec![chunk]),
            OpNode::Op { op, inputs } => {
                let (k, child) = child_reading(inputs, input);
                let mut out = Vec::new();
                for c in child.on_chunk(input, chunk)? {
                    op.on_chunk(k, c, &mut out)?;
                }
                Ok(out)
            }
        }
    }

    /// Pushes a watermark from actor input `input` up the path to this node; returns the
    /// watermark this node passes on, appending rows it emits (closed windows) to `out`.
    fn on_watermark(
        &mut self,
        input: usize,
        watermark: Watermark,
        out: &mut Vec<StreamChunk>,
    ) -> Result<Vec<Watermark>> {
        match self {
            OpNode::Input(_) => Ok(vec![watermark]),
            OpNode::Op { op, inputs } => {
                let (k, child) = child_reading(inputs, input);
                let mut below = Vec::new();
                let forwarded = child.on_watermark(input, watermark, &mut below)?;
                for c in below {
                    op.on_chunk(k, c, out)?;
                }
                let mut passed = Vec::new();
                for w in forwarded {
                    passed.extend(op.on_watermark(k, w, out)?);
                }
                Ok(passed)
            }
        }
    }

    /// Ends the epoch bottom-up: each operator first receives what its inputs emitted at the
    /// barrier, then runs its own barrier hook.
    fn on_barrier(
        &mut self,
        epoch: u64,
        now_us: i64,
        writes: &mut EpochWrites,
    ) -> Result<Vec<StreamChunk>> {
        match self {
            OpNode::Input(_) => Ok(Vec::new()),
            OpNode::Op { op, inputs } => {
                let mut out = Vec::new();
                for (k, child) in inputs.iter_mut().enumerate() {
                    for c in child.on_barrier(epoch, now_us, writes)? {
                        op.on_chunk(k, c, &mut out)?;
                    }
                }
                op.on_tick(now_us);
                op.on_barrier(epoch, &mut out, writes)?;
                Ok(out)
            }
        }
    }
}

/// The child of an operator whose subtree reads actor input `input`, and its position.
fn child_reading(children: &mut [OpNode], input: usize) -> (usize, &mut OpNode) {
    children
        .iter_mut()
        .enumerate()
        .find(|(_, c)| c.reads(input))
        .expect("every actor input is a leaf of its operator tree")
}
