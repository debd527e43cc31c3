//! What flows on the channels between actors: chunks of changes, watermarks and barriers.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::TimestampMicrosecondType;

use super::chunk::{Op, StreamChunk};
use super::dispatch::Partitioner;

/// Identifies an actor. Each table and each view runs as one actor whose id is the catalog id
/// of the object.
pub type ActorId = u32;

#[derive(Debug, Clone)]
pub enum Message {
    Chunk(StreamChunk),
    Barrier(Barrier),
    Watermark(Watermark),
}

/// No row arriving after this on the channel has a value below `value` in column `column`
/// (event time, in microseconds since the Unix epoch). Changes to rows below it may still come
/// (a table accepts any statement); operators that emit on window close ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    pub column: usize,
    pub value: i64,
}

impl Watermark {
    /// Moves `current` (a relation's watermark on `column`, `delay_us` behind the newest time
    /// inserted) past the rows `chunk` inserts; returns the watermark if it advanced.
    pub fn advance(
        column: usize,
        delay_us: i64,
        current: &mut Option<i64>,
        chunk: &StreamChunk,
    ) -> Option<Watermark> {
        let times = chunk
            .data
            .column(column)
            .as_primitive_opt::<TimestampMicrosecondType>()?;
        let newest = if times.null_count() == 0 && chunk.ops.iter().all(|o| *o == Op::Insert) {
            times.values().iter().copied().max()?
        } else {
            chunk
                .ops
                .iter()
                .enumerate()
                .filter(|(i, op)| **op == Op::Insert && times.is_valid(*i))
                .map(|(i, _)| times.value(i))
                .max()?
        };
        let candidate = newest.saturating_sub(delay_us);
        if current.is_some_and(|w| w >= candidate) {
            return None;
        }
        *current = Some(candidate);
        Some(Watermark {
            column,
            value: candidate,
        })
    }
}

/// Ends epoch `epoch` on the channel it travels: every chunk sent before it belongs to that
/// epoch or an earlier one, every chunk after it to a later one.
#[derive(Debug, Clone)]
pub struct Barrier {
    pub epoch: u64,
    /// The coordinator's clock when it injected the barrier (microseconds since the Unix
    /// epoch): `now()` for the rows of this epoch.
    pub time_us: i64,
    pub kind: BarrierKind,
    /// A change to the dataflow that takes effect at this barrier, everywhere at once.
    pub mutation: Option<Arc<Mutation>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierKind {
    Regular,
    /// Reserved for checkpoint barriers: state is also persisted to the object store.
    Checkpoint,
}

#[derive(Debug, Default)]
pub struct Mutation {
    /// New downstream channels, by the upstream actor that must feed them. An upstream sends
    /// its current contents first (backfill), then every later change.
    pub add_outputs: HashMap<ActorId, Vec<NewOutput>>,
    /// Actors that stop after this barrier: upstreams stop feeding them, and their state is
    /// dropped.
    pub stop: HashSet<ActorId>,
}

/// How many rows one message of a source's feed carries at most: the feed's bound then
/// bounds rows, not statements, so a large statement waits for the dataflow instead of
/// queueing far ahead of the next barrier.
pub const FEED_ROWS_MAX: usize = 4096;

/// The channel into a source's actor (a table's feed), shared by its writer and the barrier
/// coordinator. A statement's changes go in whole under the lock, so that no barrier falls
/// between them: every statement belongs to exactly one epoch.
#[derive(Debug, Clone)]
pub struct Feed {
    sender: mpsc::Sender<Message>,
    /// Held while a statement or a barrier goes in.
    lock: Arc<tokio::sync::Mutex<Sent>>,
    /// Where the feed started: the source's position before anything it sends, which is also
    /// where the actor's state ends until it commits an epoch.
    pub start: FeedPosition,
    /// A table's or a source's feed: its positions at its barriers, for `offset_at` and
    /// `positions`.
    positions: Option<Positions>,
}

/// What has gone into a feed: its position, and the epoch of the last barrier (0 before any).
#[derive(Debug)]
struct Sent {
    position: FeedPosition,
    barrier: u64,
}

/// A feed's position at each barrier where its offset had moved since the one before, until
/// the epoch is known to be past: sealed (a table's writer asks) or handled by the actor (a
/// source's actor asks, to read the stream again up to there for a new view).
#[derive(Debug)]
struct BarrierPositions {
    /// (epoch, position), oldest first.
    barriers: VecDeque<(u64, FeedPosition)>,
    /// The position at the newest barrier known past (before any: where the feed started).
    past: FeedPosition,
}

/// A feed's positions at its barriers (`Feed::positions`), for the actor it feeds.
#[derive(Debug, Clone)]
pub struct Positions(Arc<std::sync::Mutex<BarrierPositions>>);

impl Positions {
    fn new(start: FeedPosition) -> Positions {
        Positions(Arc::new(std::sync::Mutex::new(BarrierPositions {
            barriers: VecDeque::new(),
            past: start,
        })))
    }

    /// The feed's position at the barrier of `epoch`, or of the newest before it that the feed
    /// carried (where the feed started, before any); the barrier of `epoch` must have been
    /// sent, and `epoch` may not be older than one asked about before.
    pub fn at(&self, epoch: u64) -> FeedPosition {
        let mut positions = self.0.lock().unwrap_or_else(|p| p.into_inner());
        while positions.barriers.front().is_some_and(|(e, _)| *e <= epoch) {
            if let Some((_, position)) = positions.barriers.pop_front() {
                positions.past = position;
            }
        }
        positions.past.clone()
    }

    /// Records the position at a barrier, where the offset moved since the last one, so that
    /// an idle feed keeps nothing.
    fn record(&self, epoch: u64, position: &FeedPosition) {
        let mut positions = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let last = positions
            .barriers
            .back()
            .map_or(positions.past.offset, |b| b.1.offset);
        if position.offset != last {
            positions.barriers.push_back((epoch, position.clone()));
        }
    }
}

/// Where a source's connector resumes after the rows fed so far: one value per split of the
/// source (a file, a partition), each the connector's own, opaque to the dataflow and kept in
/// checkpoints as it is.
pub type Splits = Arc<BTreeMap<String, serde_json::Value>>;

/// How far a source's feed has gone: its offset, the last watermark value it sent, and its
/// connector's position where it keeps one.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FeedPosition {
    /// A table's change-log records fed so far (replayed ones included), or a source's rows.
    pub offset: u64,
    pub watermark: Option<i64>,
    /// `None`: the connector resumes by counting `offset` rows (a table, the Nexmark
    /// generator, a source restored from a checkpoint that kept no splits).
    pub splits: Option<Splits>,
}

impl FeedPosition {
    pub fn at(offset: u64, watermark: Option<i64>) -> FeedPosition {
        FeedPosition {
            offset,
            watermark,
            splits: None,
        }
    }
}

impl Feed {
    pub fn new(sender: mpsc::Sender<Message>) -> Feed {
        Feed::starting_at(sender, FeedPosition::default())
    }

    /// A feed whose first statement is the source's `start.offset`-th (replay from a
    /// checkpoint).
    pub fn starting_at(sender: mpsc::Sender<Message>, start: FeedPosition) -> Feed {
        Feed {
            sender,
            lock: Arc::new(tokio::sync::Mutex::new(Sent {
                position: start.clone(),
                barrier: 0,
            })),
            start,
            positions: None,
        }
    }

    /// A table's feed, which can tell its offset at any sealed epoch (`offset_at`).
    pub fn for_table(sender: mpsc::Sender<Message>, offset: u64, watermark: Option<i64>) -> Feed {
        Feed::keeping_positions(sender, FeedPosition::at(offset, watermark))
    }

    /// A source's feed, which can tell its actor its position at each barrier (`positions`).
    pub fn for_source(sender: mpsc::Sender<Message>, start: FeedPosition) -> Feed {
        Feed::keeping_positions(sender, start)
    }

    fn keeping_positions(sender: mpsc::Sender<Message>, start: FeedPosition) -> Feed {
        Feed {
            positions: Some(Positions::new(start.clone())),
            ..Feed::starting_at(sender, start)
        }
    }

    /// How many statements of a table's feed the state at `sealed_epoch` holds: those sent
    /// before the barrier of that epoch, or of the newest before it that this feed carried
    /// (where the feed started, before any). `sealed_epoch` must be sealed, and not older
    /// than an epoch asked about before. `None` for a feed that keeps no positions.
    pub fn offset_at(&self, sealed_epoch: u64) -> Option<u64> {
        Some(self.positions.as_ref()?.at(sealed_epoch).offset)
    }

    /// The feed's positions at its barriers, for the one reader that asks (a source's actor);
    /// `None` for a feed that keeps none.
    pub fn positions(&self) -> Option<Positions> {
        self.positions.clone()
    }

    /// Whether the actor behind the feed is gone (failed or stopped): nothing sent reaches it.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends one statement's changes, in slices of at most `FEED_ROWS_MAX` rows, and the
    /// watermark they advanced, with no barrier in between. Fails when the actor is gone.
    pub async fn send_statement(
        &self,
        chunk: StreamChunk,
        watermark: Option<Watermark>,
    ) -> Result<(), ()> {
        self.send_changes(chunk.slices(FEED_ROWS_MAX), watermark, 1)
            .await
            .map(drop)
    }

    /// Sends a source's rows (at most `FEED_ROWS_MAX`) and the watermark they advanced, with no
    /// barrier in between; the offset counts rows, and `splits` is where the connector resumes
    /// after them. Fails when the actor is gone.
    pub async fn send_rows(
        &self,
        chunk: StreamChunk,
        watermark: Option<Watermark>,
        splits: Option<Splits>,
    ) -> Result<(), ()> {
        let rows = chunk.len() as u64;
        let mut sent = self.send_changes([chunk], watermark, rows).await?;
        sent.position.splits = splits;
        Ok(())
    }

    /// Sends one statement's changes into each of several feeds (with the watermark each
    /// advanced), all in the same epoch: under every feed's lock, taken in the order given
    /// (table-id order, so that two such sends cannot deadlock), once each has received the
    /// same last barrier; while a barrier is only partly injected, the locks are let go and
    /// taken again. Fails when an actor is gone (the feeds before it have their changes).
    pub async fn send_together(
        parts: Vec<(&Feed, StreamChunk, Option<Watermark>)>,
    ) -> Result<(), ()> {
        let feeds: Vec<&Feed> = parts.iter().map(|p| p.0).collect();
        let mut held = Feed::lock_aligned(&feeds).await;
        for ((feed, chunk, watermark), sent) in parts.into_iter().zip(&mut held) {
            feed.send_locked(sent, chunk.slices(FEED_ROWS_MAX), watermark, 1)
                .await?;
        }
        Ok(())
    }

    /// Sends a source's rows into each of several feeds, all in the same epoch (locked as
    /// `send_together` locks them): a transaction of a database's stream of several tables. Each
    /// feed's offset counts its rows, and its position becomes its `splits` (also a feed that
    /// takes no rows). Returns the positions in `parts` of the feeds whose actors are gone; the
    /// others have their rows.
    pub async fn send_rows_together(parts: Vec<(&Feed, Vec<StreamChunk>, Splits)>) -> Vec<usize> {
        let feeds: Vec<&Feed> = parts.iter().map(|p| p.0).collect();
        let mut held = Feed::lock_aligned(&feeds).await;
        let mut gone = Vec::new();
        for (i, ((feed, chunks, splits), sent)) in parts.into_iter().zip(&mut held).enumerate() {
            let rows = chunks.iter().map(|c| c.len() as u64).sum();
            let slices = chunks.into_iter().flat_map(|c| c.slices(FEED_ROWS_MAX));
            match feed.send_locked(sent, slices, None, rows).await {
                Ok(()) => sent.position.splits = Some(splits),
                Err(()) => gone.push(i),
            }
        }
        gone
    }

    /// Takes the locks of `feeds`, in the order given, once each has received the same last
    /// barrier; while a barrier is only partly injected, lets them go and takes them again.
    async fn lock_aligned<'a>(feeds: &[&'a Feed]) -> Vec<tokio::sync::MutexGuard<'a, Sent>> {
        loop {
            let mut held = Vec::with_capacity(feeds.len());
            for feed in feeds {
                held.push(feed.lock.lock().await);
            }
            let first = held.first().map(|s| s.barrier);
            if held.iter().all(|s| Some(s.barrier) == first) {
                return held;
            }
            drop(held);
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Sends `chunks` and then `watermark` under the lock, and moves the offset by `advance`;
    /// returns with the lock held.
    async fn send_changes(
        &self,
        chunks: impl IntoIterator<Item = StreamChunk>,
        watermark: Option<Watermark>,
        advance: u64,
    ) -> Result<tokio::sync::MutexGuard<'_, Sent>, ()> {
        let mut sent = self.lock.lock().await;
        self.send_locked(&mut sent, chunks, watermark, advance)
            .await?;
        Ok(sent)
    }

    /// `send_changes` with the lock already held.
    async fn send_locked(
        &self,
        sent: &mut Sent,
        chunks: impl IntoIterator<Item = StreamChunk>,
        watermark: Option<Watermark>,
        advance: u64,
    ) -> Result<(), ()> {
        for chunk in chunks {
            self.sender
                .send(Message::Chunk(chunk))
                .await
                .map_err(|_| ())?;
        }
        if let Some(w) = watermark {
            self.sender
                .send(Message::Watermark(w))
                .await
                .map_err(|_| ())?;
            sent.position.watermark = Some(w.value);
        }
        sent.position.offset += advance;
        Ok(())
    }

    /// Sends a watermark between statements (a restored source's, before anything else).
    pub async fn send_watermark(&self, watermark: Watermark) -> Result<(), ()> {
        let mut sent = self.lock.lock().await;
        self.sender
            .send(Message::Watermark(watermark))
            .await
            .map_err(|_| ())?;
        sent.position.watermark = Some(watermark.value);
        Ok(())
    }

    /// Sends a barrier between statements. `record` is told the feed's position at the
    /// barrier (statements sent before it, last watermark) before the barrier goes in, so
    /// before its actor can acknowledge it.
    pub async fn send_barrier(
        &self,
        barrier: Barrier,
        record: impl FnOnce(FeedPosition),
    ) -> Result<(), ()> {
        let mut sent = self.lock.lock().await;
        record(sent.position.clone());
        if let Some(positions) = &self.positions {
            positions.record(barrier.epoch, &sent.position);
        }
        sent.barrier = barrier.epoch;
        self.sender
            .send(Message::Barrier(barrier))
            .await
            .map_err(|_| ())
    }
}

/// A downstream actor and the channel to it.
pub type Target = (ActorId, mpsc::Sender<Message>);

/// An actor's output: a channel to one downstream actor, or a hash exchange to the actors of
/// a parallel fragment.
#[derive(Debug, Clone)]
pub struct NewOutput {
    /// The downstream actors and their channels, in the order of the fragment's actors.
    pub targets: Vec<Target>,
    /// How chunks are split among `targets`; `None`: all to the one target. Barriers and
    /// watermarks go to every target.
    pub partitioner: Option<Arc<Partitioner>>,
    /// When the relation's current contents go first (a new view's backfill), the count of
    /// the view's backfills still under way, which this one takes off when it is done; `None`
    /// for a view restored from a checkpoint, whose state already holds them.
    pub backfill: Option<Arc<Backfills>>,
}

/// How many of a new view's inputs are still sending it their current contents, and how far
/// they are. A relation with rows (a table, a view) sends them a part at every barrier, so
/// that the view holds one part of them per epoch, not all; the view is whole at the epoch
/// whose barrier follows the last part of the last of them.
#[derive(Debug)]
pub struct Backfills {
    inputs: usize,
    left: AtomicUsize,
    /// Inputs that have counted the rows they will send, and the sum of their counts.
    counted: AtomicUsize,
    rows_total: AtomicU64,
    /// Rows sent so far, by every input.
    rows_sent: AtomicU64,
}

/// Where a new view's backfill stands (`weir_catalog.backfills`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackfillProgress {
    pub inputs: usize,
    pub inputs_done: usize,
    pub rows_sent: u64,
    /// The rows all inputs send, once each has counted its own.
    pub rows_total: Option<u64>,
}

impl Backfills {
    pub fn new(count: usize) -> Backfills {
        Backfills {
            inputs: count,
            left: AtomicUsize::new(count),
            counted: AtomicUsize::new(0),
            rows_total: AtomicU64::new(0),
            rows_sent: AtomicU64::new(0),
        }
    }

    /// One backfill is done.
    pub fn done(&self) {
        self.left.fetch_sub(1, Ordering::AcqRel);
    }

    /// The backfills still under way.
    pub fn left(&self) -> usize {
        self.left.load(Ordering::Acquire)
    }

    /// An input will send `rows` rows.
    pub fn counted(&self, rows: u64) {
        self.rows_total.fetch_add(rows, Ordering::AcqRel);
        self.counted.fetch_add(1, Ordering::AcqRel);
    }

    /// An input sent `rows` more rows.
    pub fn sent(&self, rows: u64) {
        self.rows_sent.fetch_add(rows, Ordering::AcqRel);
    }

    pub fn progress(&self) -> BackfillProgress {
        let counted = self.counted.load(Ordering::Acquire) >= self.inputs;
        BackfillProgress {
            inputs: self.inputs,
            inputs_done: self.inputs.saturating_sub(self.left()),
            rows_sent: self.rows_sent.load(Ordering::Acquire),
            rows_total: counted.then(|| self.rows_total.load(Ordering::Acquire)),
        }
    }
}

impl NewOutput {
    pub fn to(downstream: ActorId, sender: mpsc::Sender<Message>) -> NewOutput {
        NewOutput {
            targets: vec![(downstream, sender)],
            partitioner: None,
            backfill: Some(Arc::new(Backfills::new(1))),
        }
    }

    pub fn feeds(&self, actor: ActorId) -> bool {
        self.targets.iter().any(|(a, _)| *a == actor)
    }
}

impl Barrier {
    pub fn stops(&self, actor: ActorId) -> bool {
        self.mutation
            .as_ref()
            .is_some_and(|m| m.stop.contains(&actor))
    }

    pub fn new_outputs(&self, actor: ActorId) -> &[NewOutput] {
        self.mutation
            .as_ref()
            .and_then(|m| m.add_outputs.get(&actor))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;

    /// A statement larger than the channel goes in slices, and a barrier sent meanwhile comes
    /// before all of them or after all of them, never between.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_stays_within_one_epoch() {
        let s = schema(&[("a", DataType::Int64)]);
        let rows = FEED_ROWS_MAX * 3 + 5;
        let text: String = (0..rows).map(|i| format!("+ {i}\n")).collect();
        let statement = chunk(&s, &text);
        for _ in 0..20 {
            let (tx, mut rx) = mpsc::channel(1);
            let feed = Feed::new(tx);
            let writer = feed.clone();
            let statement = statement.clone();
            let write = tokio::spawn(async move { writer.send_statement(statement, None).await });
            let barrier = Barrier {
                epoch: 1,
                time_us: 0,
                kind: BarrierKind::Regular,
                mutation: None,
            };
            let inject = tokio::spawn(async move {
                let mut position = None;
                feed.send_barrier(barrier, |p| position = Some(p)).await?;
                position.ok_or(())
            });
            let mut seen = Vec::new();
            while seen.len() < 5 {
                match rx.recv().await.unwrap() {
                    Message::Chunk(c) => {
                        assert!(c.len() <= FEED_ROWS_MAX);
                        seen.push(c.len());
                    }
                    Message::Barrier(_) => seen.push(0),
                    Message::Watermark(_) => unreachable!(),
                }
            }
            write.await.unwrap().unwrap();
            let FeedPosition {
                offset, watermark, ..
            } = inject.await.unwrap().unwrap();
            assert_eq!(watermark, None);
            let at = seen.iter().position(|n| *n == 0).unwrap();
            assert!(at == 0 || at == 4, "barrier between slices: {seen:?}");
            // The barrier's offset counts the statement exactly when it came first.
            assert_eq!(offset, if at == 0 { 0 } else { 1 });
            assert_eq!(seen.iter().sum::<usize>(), rows);
        }
    }
}
