//! The actor: the one control loop every dataflow node runs. It aligns barriers across its
//! inputs, pushes chunks through its tree of operators into the relation's Materialize, and
//! at each barrier flushes state, commits the epoch, carries out the barrier's mutation,
//! forwards the barrier and acknowledges it to the coordinator.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, RecordBatch};
use futures::FutureExt;
use tokio::sync::mpsc;

use super::align::{AlignedInputs, Event};
use super::chunk::{Op, StreamChunk};
use super::coordinator::ActorEvent;
use super::expr::ErrorSink;
use super::message::{
    ActorId, Backfills, Barrier, FeedPosition, Message, NewOutput, Positions, Watermark,
};
use super::operator::{Emit, Operator};
use super::operators::materialize::Materialize;
use super::sink::SinkDriver;
use crate::error::{Error, ErrorKind, Result};
use crate::state::{EpochWrites, StateStore, StateTable, TableId};

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
    pub events: mpsc::Sender<ActorEvent>,
    /// Distinct rows per chunk when sending a backfill snapshot downstream.
    pub chunk_rows_max: usize,
    /// About how many bytes of its rows a relation sends each new view at a barrier while it
    /// backfills it.
    pub backfill_bytes_per_barrier: usize,
    pub outputs: Vec<NewOutput>,
    /// Outputs to new views that still receive the relation's rows, a part per barrier.
    pub backfilling: Vec<Backfilling>,
    /// The last watermark sent downstream per column, for outputs added later (after their
    /// backfill).
    pub watermarks: Vec<Watermark>,
    /// A sink's own actor hands its changes to the sink's connector.
    pub sink: Option<SinkDriver>,
    /// A source's actor: what it backfills new downstreams from.
    pub source: Option<SourceRows>,
    /// The errors this actor's rows and groups hold, kept under its id in `ERRORS_TABLE` at
    /// each barrier where they changed.
    pub errors: ActorErrors,
    /// Where the actor runs (`Dataflow`).
    pub runtime: tokio::runtime::Handle,
}

/// The threads the dataflow's actors run on, apart from the server's runtime, which serves
/// clients, the accept loop, the admin port and the barrier coordinator: an actor whose read
/// of its state waits on the disk holds up only other actors, never those. As many threads as
/// cores, each with the statement threads' stack (`STACK_BYTES`: a view evaluates expressions
/// as deep as a statement may be).
pub struct Dataflow {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Dataflow {
    pub fn start() -> std::io::Result<Dataflow> {
        let runtime = crate::cores_runtime("weir-dataflow")?;
        Ok(Dataflow {
            runtime: Some(runtime),
        })
    }

    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the dataflow runtime runs until dropped")
            .handle()
            .clone()
    }
}

impl Drop for Dataflow {
    /// Stops the threads and waits (up to `STOP_WAIT`) until they have dropped their actors'
    /// tasks, so that the state store closes before the database is gone: a process that
    /// exits while a thread still closes RocksDB crashes in RocksDB's static destructors. The
    /// wait runs on a thread of its own, outside any runtime (tokio refuses to wait for a
    /// runtime from within one).
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            crate::stop_runtime(runtime, STOP_WAIT, "the dataflow's threads");
        }
    }
}

/// How long a dropped `Dataflow` waits for its threads (an actor in a stalled disk read).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An output to a new view still receiving the relation's current rows, a part at each
/// barrier, in the order of their keys in the relation's state. Until it has them all, a live
/// change goes on to it only for a row up to the last key sent: the part that brings a later
/// row reads it as it is then, changes included.
pub struct Backfilling {
    output: NewOutput,
    /// The last row key sent; `None` before the first part.
    after: Option<Vec<u8>>,
    left: Arc<Backfills>,
}

/// An actor's count of row errors and where it is kept.
pub struct ActorErrors {
    pub sink: ErrorSink,
    pub table: StateTable,
    /// The count as the state holds it.
    pub kept: i64,
}

impl ActorErrors {
    /// The key of actor `id`'s count.
    pub fn key(id: ActorId) -> Vec<u8> {
        id.to_be_bytes().to_vec()
    }

    /// The count kept for actor `id`, 0 if none.
    pub fn read(table: &StateTable, id: ActorId) -> Result<i64> {
        Ok(match table.get(&Self::key(id))? {
            Some(v) => i64::from_le_bytes(v.as_slice().try_into().map_err(|_| {
                Error::new(ErrorKind::DataCorruption, "bad row error count in state")
            })?),
            None => 0,
        })
    }

    /// Moves the count into this epoch's writes if it changed; with `stopping`, its deletion.
    fn write(&mut self, id: ActorId, stopping: bool, writes: &mut EpochWrites) {
        let now = if stopping { 0 } else { self.sink.outstanding() };
        if now != self.kept {
            match now {
                0 => self.table.delete(Self::key(id)),
                n => self.table.put(Self::key(id), n.to_le_bytes().to_vec()),
            }
            self.kept = now;
        }
        self.table.take_writes(writes);
    }
}

/// A source's rows so far, read again for a view created after they went by: a source keeps
/// no rows, but reads its stream again from the start (`history`) up to where its feed was at
/// the barrier (`positions`).
pub struct SourceRows {
    /// Rows the actor has passed on, from the stream's first.
    pub seen: u64,
    /// The feed's positions at its barriers: where a reading again stops. A stream of several
    /// splits (Kafka partitions) read again interleaves them differently, so that the first
    /// `seen` rows it gives need not be those that went by; each split's position says which.
    pub positions: Positions,
    pub history: Arc<dyn SourceHistory>,
}

/// A stream of batches, read in order. A caller may stop waiting for `next_batch` (drop
/// its future) and call it again: a reader loses no rows by it.
#[async_trait::async_trait]
pub trait Batches: Send {
    /// The next rows (at most `message::FEED_ROWS_MAX`), or `None` at the end of the stream.
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>>;
}

/// A source's stream from its first row, read again (implemented by the source side,
/// `source::History`).
pub trait SourceHistory: Send + Sync {
    /// The source's name, for errors.
    fn name(&self) -> &str;

    /// A reader of the stream from its first row up to `to` (the feed's position at a
    /// barrier: its row count, and the connector's position per split where it keeps one),
    /// which refuses to read other rows than those that went by (a file changed since).
    fn read_again(&self, to: &FeedPosition) -> Result<Box<dyn Batches>>;
}

impl Actor {
    /// Runs the actor on the runtime; its end (normal, error or panic) is reported to the
    /// coordinator, so that no epoch waits for an actor that is gone.
    pub fn spawn(self) {
        let id = self.id;
        let events = self.events.clone();
        let runtime = self.runtime.clone();
        runtime.spawn(async move {
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
            let _ = events.send(ActorEvent::Exited { actor: id, error }).await;
        });
    }

    async fn run(mut self) -> Result<()> {
        while let Some(event) = self.inputs.next().await {
            match event {
                Event::Chunk { input, chunk } => {
                    if let Some(source) = &mut self.source {
                        source.seen += chunk.len() as u64;
                    }
                    let (root, mut outlet) = self.parts();
                    root.on_chunk(input, chunk, &mut outlet)?;
                    outlet.finish().await;
                }
                Event::Watermark { input, watermark } => {
                    let (root, mut outlet) = self.parts();
                    let forward = root.on_watermark(input, watermark, &mut outlet)?;
                    outlet.finish().await;
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
        let (root, mut outlet) = self.parts();
        root.on_barrier(epoch, barrier.time_us, &mut writes, &mut outlet)?;
        outlet.finish().await;
        if let Some(m) = &mut self.materialize {
            m.flush(&mut writes)?;
        }
        if stopping {
            writes = EpochWrites::default();
            for t in &self.state_tables {
                writes.drop_table(*t);
            }
        }
        self.errors.write(self.id, stopping, &mut writes);
        if let (Some(driver), false) = (&mut self.sink, stopping) {
            driver.on_barrier(epoch, &mut writes).await?;
        }
        self.store.commit(epoch, writes).await?;
        // Acknowledged as soon as committed: the coordinator takes an acknowledgement to mean
        // that this actor's state holds the epoch (where a failed table's state ends).
        self.events
            .send(ActorEvent::Ack {
                actor: self.id,
                epoch,
            })
            .await
            .map_err(|_| Error::unavailable("barrier coordinator is gone"))?;
        // New downstreams get the relation's contents first: a table's or view's a part at
        // each barrier from this one on, a source's whole now (read again from its start, and
        // chunk by chunk to each in turn, so that several, a view's parallel workers, backfill
        // at the same time). Those restored from a checkpoint already hold them.
        let mut sources: Vec<(NewOutput, Arc<Backfills>)> = Vec::new();
        // Asked at every barrier, so that the feed forgets the positions before it.
        let position = self.source.as_ref().map(|s| s.positions.at(epoch));
        for output in barrier.new_outputs(self.id).iter().cloned() {
            match output.backfill.clone() {
                Some(left) if self.materialize.is_some() => self.backfilling.push(Backfilling {
                    output,
                    after: None,
                    left,
                }),
                Some(left) => sources.push((output, left)),
                None => {
                    for w in &self.watermarks {
                        let _ = deliver(&output, &Message::Watermark(*w)).await;
                    }
                    self.outputs.push(output);
                }
            }
        }
        if let (Some(source), Some(position)) = (self.source.as_ref(), position) {
            if !sources.is_empty() {
                if position.offset != source.seen {
                    return Err(Error::internal(format!(
                        "source \"{}\" passed on {} rows before the barrier of epoch {epoch}, \
                         but its feed sent {}",
                        source.history.name(),
                        source.seen,
                        position.offset
                    )));
                }
                backfill_from_source(source, &position, self.chunk_rows_max, &sources).await?;
            }
            for (output, left) in sources {
                for w in &self.watermarks {
                    let _ = deliver(&output, &Message::Watermark(*w)).await;
                }
                left.done();
                self.outputs.push(output);
            }
        }
        self.advance_backfills().await?;
        self.send(Message::Barrier(barrier.clone())).await;
        let stopped = |o: &NewOutput| o.targets.iter().any(|(a, _)| barrier.stops(*a));
        self.outputs.retain(|o| !stopped(o));
        self.backfilling.retain(|b| !stopped(&b.output));
        Ok(stopping)
    }

    /// The operators, and the output they emit into.
    fn parts(&mut self) -> (&mut OpNode, Outlet<'_>) {
        let outlet = Outlet {
            id: self.id,
            materialize: &mut self.materialize,
            sink: self.sink.as_mut(),
            outputs: &mut self.outputs,
            backfilling: &mut self.backfilling,
            waiting: Vec::new(),
            waiting_rows: 0,
        };
        (&mut self.root, outlet)
    }

    async fn send(&mut self, msg: Message) {
        let mut outputs = Outputs {
            id: self.id,
            live: &mut self.outputs,
            backfilling: &mut self.backfilling,
            materialize: self.materialize.as_ref(),
        };
        outputs.send(msg).await
    }

    /// Sends each backfilling output its next part of the relation's rows, as they are at the
    /// epoch just committed: about `backfill_bytes_per_barrier` bytes. An output that has
    /// them all is done: it gets the last watermarks and every change from now on.
    async fn advance_backfills(&mut self) -> Result<()> {
        let Some(m) = self.materialize.as_ref() else {
            return Ok(());
        };
        let rows_max = self.chunk_rows_max;
        let mut finished = Vec::new();
        for (i, b) in self.backfilling.iter_mut().enumerate() {
            let mut sent = 0;
            if b.after.is_none() {
                // What the view's progress is told against (`weir_catalog.backfills`).
                b.left.counted(crate::blocking(|| m.row_count())?);
            }
            while sent < self.backfill_bytes_per_barrier {
                // Read off the async workers' queue: RocksDB reads can wait on the disk.
                let part = crate::blocking(|| m.contents_part(b.after.as_deref(), rows_max))?;
                let Some((chunk, last)) = part else {
                    finished.push(i);
                    break;
                };
                sent += chunk.data.get_array_memory_size();
                b.left.sent(chunk.data.num_rows() as u64);
                if let Err(why) = deliver(&b.output, &Message::Chunk(chunk)).await {
                    tracing::warn!(actor = self.id, "no longer backfilling a new view: {why}");
                    finished.push(i);
                    break;
                }
                b.after = Some(last);
            }
        }
        for i in finished.into_iter().rev() {
            let b = self.backfilling.remove(i);
            for w in &self.watermarks {
                let _ = deliver(&b.output, &Message::Watermark(*w)).await;
            }
            b.left.done();
            self.outputs.push(b.output);
        }
        Ok(())
    }
}

/// Sends new outputs a source's rows so far, read again from the start, batch by batch (a
/// long stream is never held whole).
async fn backfill_from_source(
    source: &SourceRows,
    to: &FeedPosition,
    rows_max: usize,
    outputs: &[(NewOutput, Arc<Backfills>)],
) -> Result<()> {
    let mut reader = source.history.read_again(to)?;
    let mut open = vec![true; outputs.len()];
    for (_, left) in outputs {
        left.counted(to.offset);
    }
    let mut read = 0;
    while read < to.offset {
        let Some(batch) = reader.next_batch().await? else {
            return Err(Error::internal(format!(
                "source \"{}\" ended after {read} rows when read again, not {}",
                source.history.name(),
                to.offset
            )));
        };
        let rows = (to.offset - read).min(batch.num_rows() as u64) as usize;
        read += rows as u64;
        let chunk = StreamChunk::new(vec![Op::Insert; rows], batch.slice(0, rows));
        for slice in chunk.slices(rows_max) {
            let sent = slice.data.num_rows() as u64;
            let message = Message::Chunk(slice);
            for ((output, left), open) in outputs.iter().zip(open.iter_mut()) {
                if *open && deliver(output, &message).await.is_err() {
                    *open = false;
                }
                left.sent(sent);
            }
        }
    }
    Ok(())
}

/// An actor's outputs, as it sends a message.
struct Outputs<'a> {
    id: ActorId,
    live: &'a mut Vec<NewOutput>,
    backfilling: &'a mut Vec<Backfilling>,
    /// The relation's rows, whose keys tell which changes a backfilling output takes.
    materialize: Option<&'a Materialize>,
}

impl Outputs<'_> {
    /// Sends a message to every output: chunks to a backfilling one only for rows up to its
    /// last key sent, watermarks not until it is done. An output whose targets are gone is
    /// dropped.
    async fn send(&mut self, msg: Message) {
        let mut gone = Vec::new();
        for (i, o) in self.live.iter().enumerate() {
            if let Err(why) = deliver(o, &msg).await {
                gone.push((i, why));
            }
        }
        for (i, why) in gone.into_iter().rev() {
            let o = self.live.remove(i);
            report_gone(self.id, &o, &why);
        }
        if self.backfilling.is_empty() || matches!(msg, Message::Watermark(_)) {
            return;
        }
        let keys = match (&msg, self.materialize) {
            (Message::Chunk(c), Some(m)) => match m.row_keys(c) {
                Ok(keys) => Some(keys),
                Err(e) => {
                    tracing::error!(actor = self.id, "cannot read the keys of rows: {e}");
                    return;
                }
            },
            _ => None,
        };
        let mut gone = Vec::new();
        for (i, b) in self.backfilling.iter().enumerate() {
            let message = match (&msg, &keys) {
                (Message::Chunk(chunk), Some(keys)) => {
                    let Some(after) = &b.after else { continue };
                    let mask: BooleanArray = keys.iter().map(|k| Some(k <= after)).collect();
                    match chunk.filter(&mask) {
                        Ok(c) if c.is_empty() => continue,
                        Ok(c) => Message::Chunk(c),
                        Err(e) => {
                            gone.push((i, e.to_string()));
                            continue;
                        }
                    }
                }
                _ => msg.clone(),
            };
            if let Err(why) = deliver(&b.output, &message).await {
                gone.push((i, why));
            }
        }
        for (i, why) in gone.into_iter().rev() {
            let b = self.backfilling.remove(i);
            report_gone(self.id, &b.output, &why);
        }
    }
}

fn report_gone(id: ActorId, output: &NewOutput, why: &str) {
    let downstream: Vec<ActorId> = output.targets.iter().map(|(a, _)| *a).collect();
    tracing::warn!(
        actor = id,
        ?downstream,
        "no longer feeding downstream actors: {why}"
    );
}

/// Past this many rows waiting in an actor's output, they are sent before its operators go
/// on: an operator's output for one input chunk (a join on a hot key) is then never whole in
/// memory, whatever its size.
const WAITING_ROWS_MAX: usize = 65_536;

/// The actor's own output, where its tree of operators emits: each chunk goes into the
/// relation's Materialize (or a sink's counts) at once, and waits to be sent downstream when
/// the operators are done with their input (`finish`), or sooner once `WAITING_ROWS_MAX` rows
/// wait.
struct Outlet<'a> {
    id: ActorId,
    materialize: &'a mut Option<Materialize>,
    sink: Option<&'a mut SinkDriver>,
    outputs: &'a mut Vec<NewOutput>,
    backfilling: &'a mut Vec<Backfilling>,
    waiting: Vec<StreamChunk>,
    waiting_rows: usize,
}

impl Outlet<'_> {
    fn outputs(&mut self) -> Outputs<'_> {
        Outputs {
            id: self.id,
            live: self.outputs,
            backfilling: self.backfilling,
            materialize: self.materialize.as_ref(),
        }
    }

    /// Sends what waits.
    async fn finish(mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        let mut outputs = self.outputs();
        for c in waiting {
            outputs.send(Message::Chunk(c)).await;
        }
    }
}

impl Emit for Outlet<'_> {
    fn emit(&mut self, chunk: StreamChunk) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        if let Some(m) = self.materialize.as_mut() {
            m.apply(&chunk)?;
        }
        if let Some(sink) = self.sink.as_mut() {
            sink.write(&chunk)?;
        }
        self.waiting_rows += chunk.len();
        self.waiting.push(chunk);
        if self.waiting_rows > WAITING_ROWS_MAX {
            // The operators are in the middle of their work, on this thread: send from here,
            // after handing the worker's other tasks to another thread. (On a current-thread
            // runtime, in unit tests, the rows wait.)
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
                    let waiting = std::mem::take(&mut self.waiting);
                    let mut outputs = self.outputs();
                    tokio::task::block_in_place(|| {
                        handle.block_on(async {
                            for c in waiting {
                                outputs.send(Message::Chunk(c)).await;
                            }
                        })
                    });
                    self.waiting_rows = 0;
                }
            }
        }
        Ok(())
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

/// An operator's input `k` as its child emits into it: each chunk goes through the operator
/// on to `out` as it comes.
struct Feeding<'a> {
    op: &'a mut dyn Operator,
    k: usize,
    out: &'a mut dyn Emit,
}

impl Emit for Feeding<'_> {
    fn emit(&mut self, chunk: StreamChunk) -> Result<()> {
        self.op.on_chunk(self.k, chunk, self.out)
    }
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

    /// Pushes a chunk from actor input `input` up the path to this node, emitting this node's
    /// output to `out`.
    fn on_chunk(&mut self, input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()> {
        match self {
            OpNode::Input(_) => out.emit(chunk),
            OpNode::Op { op, inputs } => {
                let (k, child) = child_reading(inputs, input);
                let mut into = Feeding {
                    op: op.as_mut(),
                    k,
                    out,
                };
                child.on_chunk(input, chunk, &mut into)
            }
        }
    }

    /// Pushes a watermark from actor input `input` up the path to this node; returns the
    /// watermark this node passes on, emitting rows it emits (closed windows) to `out`.
    fn on_watermark(
        &mut self,
        input: usize,
        watermark: Watermark,
        out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        match self {
            OpNode::Input(_) => Ok(vec![watermark]),
            OpNode::Op { op, inputs } => {
                let (k, child) = child_reading(inputs, input);
                let mut into = Feeding {
                    op: op.as_mut(),
                    k,
                    out: &mut *out,
                };
                let forwarded = child.on_watermark(input, watermark, &mut into)?;
                let mut passed = Vec::new();
                for w in forwarded {
                    passed.extend(op.on_watermark(k, w, out)?);
                }
                Ok(passed)
            }
        }
    }

    /// Ends the epoch bottom-up: each operator first receives what its inputs emit at the
    /// barrier, then runs its own barrier hook.
    fn on_barrier(
        &mut self,
        epoch: u64,
        now_us: i64,
        writes: &mut EpochWrites,
        out: &mut dyn Emit,
    ) -> Result<()> {
        match self {
            OpNode::Input(_) => Ok(()),
            OpNode::Op { op, inputs } => {
                for (k, child) in inputs.iter_mut().enumerate() {
                    let mut into = Feeding {
                        op: op.as_mut(),
                        k,
                        out: &mut *out,
                    };
                    child.on_barrier(epoch, now_us, writes, &mut into)?;
                }
                op.on_tick(now_us);
                op.on_barrier(epoch, out, writes)
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
