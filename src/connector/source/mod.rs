//! Sources: append-only streams that a connector produces and a task feeds into the
//! dataflow through a `Feed`, as a table's writer does, but with no writer and no stored rows.
//!
//! A connector is one implementation of `Connector`, in its own file, named in the registry
//! (`CONNECTORS`): it validates a new source's options and columns, and opens a `Reader` of
//! its stream from any point the source reached before. The rest of Weir sees a source
//! through this module alone.
//!
//! A source's offset is the number of rows it has fed; beside it, a connector may keep its
//! own position, split by split (a file source: the file and byte it reached), which the feed
//! records with the rows it sent (`message::Splits`) and checkpoints keep. A restart feeds on
//! from a checkpoint's offset, at the connector's position where it kept one, or else by
//! counting rows from the start (the Nexmark generator is a function of the event number), so
//! the views reading a source end as if nothing had failed.
//!
//! A source produces only while a view or sink reads it (`Handle::set_running`). It keeps no
//! rows, but a view created after some went by is backfilled with them all the same: the
//! source's actor reads its stream again from the start up to the rows it has passed on
//! (`History`, behind the dataflow's `stream::actor::SourceHistory`), so every view over a
//! source is its query over every row the source has produced, whenever the view was created.

mod decode;
mod files;
mod kafka;
mod nexmark;
mod postgres_cdc;
mod shared;

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::catalog::{ColumnDef, ObjectId, SourceDef};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{
    Batches, DurableSplits, Feed, FeedPosition, Op, SourceHistory, Splits, StreamChunk, Watermark,
};

/// Every connector, by the name `WITH (connector = '...')` gives.
const CONNECTORS: &[&dyn Connector] = &[
    &nexmark::Nexmark,
    &files::Files,
    &files::S3,
    &kafka::Kafka,
    &postgres_cdc::PostgresCdc,
];

pub use self::nexmark::write_json as nexmark_json;
pub use self::shared::{Attach, Attacher, Context as SharedContext, Shared};
pub use super::options::{count, flag, Options};

/// A kind of source: how its options read, what its columns are, and how its stream is read.
pub trait Connector: Send + Sync {
    /// The name `WITH (connector = '...')` gives.
    fn name(&self) -> &'static str;

    /// Checks a new source's options, taking those it knows from `options`, and its columns
    /// (`declared`: those `CREATE SOURCE` named, maybe none). `table` is the primary key of a
    /// table the connector is to feed (`CREATE TABLE ... WITH (connector = ...)`, maybe no
    /// key), `None` for a source: a connector that feeds no tables refuses it with 0A000.
    /// Returns the options the catalog keeps for `open` (written out in full, defaults
    /// included) and the source's columns. A bad option is refused with the SQLSTATE a user
    /// should see (22023 for a bad value).
    fn create(
        &self,
        options: &mut Options,
        declared: Vec<ColumnDef>,
        table: Option<&[usize]>,
    ) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)>;

    /// A reader of `def`'s stream from `start`. With `keep`, the reader may keep what it needs
    /// in the data directory to read the same rows again later (a file source's ledger).
    fn open(
        &self,
        def: &SourceDef,
        start: Start<'_>,
        keep: Option<Keep<'_>>,
    ) -> Result<Box<dyn Reader>>;

    /// The paths on the server's file system the kept options name.
    fn server_paths<'a>(&self, _kept: &'a BTreeMap<String, String>) -> Vec<&'a str> {
        Vec::new()
    }

    /// Removes what source `id` kept in `dir` (it was dropped).
    fn forget(&self, _dir: &Path, _id: ObjectId) -> Result<()> {
        Ok(())
    }

    /// Refuses a new view over `def` that would need its first `rows` rows read again when
    /// the connector cannot read them again as they went by.
    fn check_read_again(&self, _def: &SourceDef, _rows: u64) -> Result<()> {
        Ok(())
    }

    /// A connector whose source's one stream feeds several tables instead of views (a
    /// database's changes) gives its side of that here.
    fn shared(&self) -> Option<&'static dyn Shared> {
        None
    }
}

/// Refuses a new view over source `def`, which has produced `rows` rows, when its connector
/// cannot read them again for the view's backfill (`Connector::check_read_again`).
pub fn check_read_again(def: &SourceDef, rows: u64) -> Result<()> {
    connector(&def.connector.name)?.check_read_again(def, rows)
}

/// The connector named `name` (any case).
pub fn connector(name: &str) -> Result<&'static dyn Connector> {
    let name = name.to_lowercase();
    CONNECTORS
        .iter()
        .copied()
        .find(|c| c.name() == name)
        .ok_or_else(|| {
            let names: Vec<String> = CONNECTORS
                .iter()
                .map(|c| format!("'{}'", c.name()))
                .collect();
            Error::not_supported(format!("connector \"{name}\" is not supported"))
                .with_hint(format!("Sources take connector = {}.", names.join(" or ")))
        })
}

/// Where a reader starts: after the stream's first `rows` rows, at the connector's position
/// `splits` where a checkpoint kept one (else the connector counts `rows` rows from the start).
#[derive(Debug, Clone, Copy)]
pub struct Start<'a> {
    pub rows: u64,
    pub splits: Option<&'a BTreeMap<String, serde_json::Value>>,
}

impl Start<'_> {
    /// The stream's first row.
    pub const FIRST: Start<'static> = Start {
        rows: 0,
        splits: None,
    };
}

/// What a reader may keep in the data directory: the sources' directory, and whether the reader
/// is the source's own, which records what it reads and reports its progress (`progress`), or
/// one reading the stream again up to row `checked` (and each split up to its position in
/// `until`, where the source keeps positions), which only checks that it reads what went by
/// before.
#[derive(Debug, Clone, Copy)]
pub struct Keep<'a> {
    pub dir: &'a Path,
    pub own: bool,
    pub checked: u64,
    pub until: Option<&'a BTreeMap<String, serde_json::Value>>,
    pub progress: Option<&'a Arc<Progress>>,
    /// The own reader's news of durable checkpoints, with the sources' positions in them: a
    /// connector may tell its upstream how far the source has durably read.
    pub durable: Option<&'a watch::Receiver<DurableSplits>>,
}

/// Produces a source's rows in order.
pub trait Reader: Batches {
    /// Where the connector resumes after the rows returned so far; `None` where it resumes by
    /// counting rows.
    fn splits(&self) -> Option<Splits>;

    /// The most events per second the reader gives, and how many it has given so far, in the
    /// unit of that rate (Nexmark: events of the whole sequence, of all three streams); `None`:
    /// as fast as the dataflow takes them.
    fn pace(&self) -> Option<(u64, u64)> {
        None
    }

    /// How the source's watermark follows what the reader reads.
    fn times(&self) -> Times {
        Times::Rows
    }

    /// The changes of the rows `next_batch` gave last, from a reader that feeds a table
    /// (`docs/design/0012-connector-tables.md`): an insert is the row its key has now, a
    /// delete its key's row gone (only the key's columns set). `None`: every row an insert.
    fn take_ops(&mut self) -> Option<Vec<Op>> {
        None
    }
}

/// How a source's watermark follows its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Times {
    /// The newest event time of every row read so far.
    Rows,
    /// The least, over the splits still active, of each split's newest event time, as the
    /// reader tracks it (Kafka partitions: a partition behind the others holds the watermark
    /// back, one idle for a while does not); `None` while a split has given no time yet.
    Splits(Option<i64>),
}

/// A source's stream read again from its first row, for a view created after rows went by.
pub struct History {
    def: SourceDef,
    dir: PathBuf,
}

impl History {
    /// `dir`: the directory where sources keep what they read.
    pub fn new(def: SourceDef, dir: PathBuf) -> History {
        History { def, dir }
    }
}

impl SourceHistory for History {
    fn name(&self) -> &str {
        &self.def.name
    }

    fn read_again(&self, to: &FeedPosition) -> Result<Box<dyn Batches>> {
        let keep = Keep {
            dir: &self.dir,
            own: false,
            checked: to.offset,
            until: to.splits.as_deref(),
            progress: None,
            durable: None,
        };
        self.def.connector.check_secrets()?;
        let reader =
            connector(&self.def.connector.name)?.open(&self.def, Start::FIRST, Some(keep))?;
        Ok(reader)
    }
}

/// What a source's task has done so far, for `weir_catalog.sources`, `source_errors` and
/// `source_splits`. Its reader reports into it as it reads (`Keep::progress`).
#[derive(Debug, Default)]
pub struct Progress {
    /// Rows fed (the offset of the next one).
    pub offset: AtomicU64,
    /// The stream has ended: every row is fed.
    pub done: AtomicBool,
    /// Why the source stopped early (an unreadable file, a malformed row with
    /// `on_error = 'fail'`, messages the broker no longer holds).
    pub error: Mutex<Option<String>>,
    /// What the source waits out while it cannot read (a broker down), cleared once it reads.
    pub waiting: Mutex<Option<String>>,
    /// Input that did not decode into a row and was skipped, since the server started.
    pub skipped: AtomicU64,
    /// The last `SOURCE_ERRORS_MAX` of those, newest last.
    pub errors: Mutex<VecDeque<SkippedInput>>,
    /// Each split's position and the upstream's end there, as the reader last saw them.
    pub splits: Mutex<Vec<SplitProgress>>,
}

/// How many skipped inputs a source keeps for `weir_catalog.source_errors`.
pub const SOURCE_ERRORS_MAX: usize = 100;
/// How many bytes of a skipped input's payload `weir_catalog.source_errors` shows.
pub const PAYLOAD_PREFIX_BYTES: usize = 256;

/// An input skipped because it did not decode into a row.
#[derive(Debug, Clone)]
pub struct SkippedInput {
    /// When it was skipped (milliseconds since the Unix epoch).
    pub at_ms: i64,
    /// Where it was: its split (a partition) and position there (an offset).
    pub split: String,
    pub position: String,
    /// Its first bytes, as text (invalid UTF-8 replaced).
    pub payload: String,
    pub error: String,
}

/// A split's progress: where the source is, and how far the upstream goes.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitProgress {
    pub split: String,
    /// The connector's position in the split (a Kafka partition's next offset).
    pub position: serde_json::Value,
    /// The upstream's end of the split, where known (the partition's high watermark), and how
    /// far the source trails it.
    pub end: Option<i64>,
    pub lag: Option<i64>,
}

impl Progress {
    fn stopped(&self, source: &str, e: &Error) {
        tracing::error!(source, "source stopped: {e}");
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
    }

    /// The source waits out `why` (`None`: it reads again).
    pub fn waiting(&self, why: Option<String>) {
        *self.waiting.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// An input was skipped: counted, and kept among the last `SOURCE_ERRORS_MAX`.
    pub fn skipped(
        &self,
        source: &str,
        split: String,
        position: String,
        payload: &[u8],
        error: String,
    ) {
        let n = self.skipped.fetch_add(1, Ordering::AcqRel) + 1;
        let cut = &payload[..payload.len().min(PAYLOAD_PREFIX_BYTES)];
        let payload = String::from_utf8_lossy(cut).into_owned();
        tracing::warn!(
            source,
            skipped = n,
            split,
            position,
            "skipped input that does not decode: {error}"
        );
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errors.len() == SOURCE_ERRORS_MAX {
            errors.pop_front();
        }
        errors.push_back(SkippedInput {
            at_ms: crate::clock::wall_ms(),
            split,
            position,
            payload,
            error,
        });
    }

    /// The splits' progress, as the reader sees them now.
    pub fn set_splits(&self, splits: Vec<SplitProgress>) {
        *self.splits.lock().unwrap_or_else(|p| p.into_inner()) = splits;
    }
}

/// A running source task.
pub struct Handle {
    running: watch::Sender<bool>,
    pub progress: Arc<Progress>,
    id: ObjectId,
    connector: Option<&'static dyn Connector>,
    /// A shared source's: where its tables attach, and its connector's side with its
    /// definition, to drop what it made upstream.
    attach: Option<tokio::sync::mpsc::Sender<Attach>>,
    shared: Option<(&'static dyn Shared, SourceDef)>,
}

impl Handle {
    /// The rows the source has fed so far.
    pub fn rows(&self) -> u64 {
        self.progress.offset.load(Ordering::Acquire)
    }

    /// Starts or pauses the source: it feeds rows only while something reads it.
    pub fn set_running(&self, running: bool) {
        self.running.send_replace(running);
    }

    /// Whether something reads the source, so that it feeds rows until its stream ends.
    pub fn running(&self) -> bool {
        *self.running.borrow()
    }

    /// Removes what the source kept in the data directory's `dir` (it was dropped).
    pub fn forget(&self, dir: &Path) -> Result<()> {
        match self.connector {
            Some(c) => c.forget(dir, self.id),
            None => Ok(()),
        }
    }
}

/// Starts the task of a source whose stream feeds tables (`Connector::shared`), paused until
/// a table runs it; `None` for a source of another connector.
pub fn spawn_shared(def: &SourceDef, durable: watch::Receiver<DurableSplits>) -> Option<Handle> {
    let shared = connector(&def.connector.name).ok()?.shared()?;
    Some(shared::spawn(def.clone(), shared, durable))
}

/// The connector of a source that feeds tables, for a table `CREATE TABLE ... FROM` adds.
pub fn shared(def: &SourceDef) -> Result<&'static dyn Shared> {
    def.connector.check_secrets()?;
    connector(&def.connector.name)?.shared().ok_or_else(|| {
        Error::new(
            ErrorKind::WrongObjectType,
            format!("source \"{}\" does not feed tables", def.name),
        )
        .with_hint("CREATE TABLE ... FROM reads a source of a database's changes (connector = 'postgres-cdc').")
    })
}

/// Starts the task that feeds `def`'s rows from `start` on into `feed`, paused; `start`'s
/// watermark is the source's at that point (from a checkpoint), from which it only advances.
/// `dir` is where sources keep what they read; `durable` follows the durable checkpoints. A
/// source whose input cannot be read again as it was (a file changed or gone) reports it in
/// its progress and feeds nothing.
pub fn spawn(
    def: SourceDef,
    feed: Feed,
    start: &FeedPosition,
    dir: &Path,
    durable: watch::Receiver<DurableSplits>,
) -> Handle {
    let (running, paused) = watch::channel(false);
    let progress = Arc::new(Progress {
        offset: AtomicU64::new(start.offset),
        ..Default::default()
    });
    let from = Start {
        rows: start.offset,
        splits: start.splits.as_deref(),
    };
    let connector = connector(&def.connector.name);
    let handle = Handle {
        running,
        progress: progress.clone(),
        id: def.id,
        connector: connector.as_ref().ok().copied(),
        attach: None,
        shared: None,
    };
    let keep = Keep {
        dir,
        own: true,
        checked: start.offset,
        until: None,
        progress: Some(&progress),
        durable: Some(&durable),
    };
    let opened = (def.connector.check_secrets())
        .and(connector)
        .and_then(|c| c.open(&def, from, Some(keep)));
    match opened {
        Ok(reader) => {
            let watermark = start.watermark;
            tokio::spawn(feed_rows(def, feed, reader, paused, progress, watermark));
        }
        Err(e) => progress.stopped(&def.name, &e),
    }
    handle
}

async fn feed_rows(
    def: SourceDef,
    feed: Feed,
    mut reader: Box<dyn Reader>,
    mut running: watch::Receiver<bool>,
    progress: Arc<Progress>,
    mut watermark: Option<i64>,
) {
    // Where pacing started: the time and the reader's position then.
    let mut paced: Option<(Instant, u64)> = None;
    loop {
        // The database is gone (its handle with it).
        if running.has_changed().is_err() {
            return;
        }
        if !*running.borrow_and_update() {
            paced = None;
            if running.changed().await.is_err() {
                return;
            }
            continue;
        }
        if let Some((rate, position)) = reader.pace().filter(|(r, _)| *r > 0) {
            let (start, base) = *paced.get_or_insert((crate::clock::monotonic(), position));
            let ahead = position.saturating_sub(base);
            tokio::time::sleep_until(start + Duration::from_secs_f64(ahead as f64 / rate as f64))
                .await;
        }
        // A reader waiting on the network (Kafka) is left when the source is paused or
        // dropped; readers give up nothing they took while they wait (`Batches`).
        let next = tokio::select! {
            next = reader.next_batch() => next,
            _ = running.changed() => continue,
        };
        let batch = match next {
            Ok(Some(b)) => b,
            Ok(None) => {
                progress.done.store(true, Ordering::Release);
                return;
            }
            Err(e) => return progress.stopped(&def.name, &e),
        };
        let rows = batch.num_rows();
        let ops = match reader.take_ops() {
            Some(ops) if ops.len() == rows => ops,
            Some(ops) => {
                let e = Error::internal(format!(
                    "a reader gave {} changes for {rows} rows",
                    ops.len()
                ));
                return progress.stopped(&def.name, &e);
            }
            None => vec![Op::Insert; rows],
        };
        let chunk = StreamChunk::new(ops, batch);
        let advanced = def.watermark.and_then(|w| match reader.times() {
            Times::Rows => Watermark::advance(w.column, w.delay_us, &mut watermark, &chunk),
            Times::Splits(least) => {
                let candidate = least?.saturating_sub(w.delay_us);
                if watermark.is_some_and(|v| v >= candidate) {
                    return None;
                }
                watermark = Some(candidate);
                Some(Watermark {
                    column: w.column,
                    value: candidate,
                })
            }
        });
        // No rows: the reader moved the watermark alone (a partition went idle).
        if rows == 0 {
            if let Some(w) = advanced {
                if feed.send_watermark(w).await.is_err() {
                    return;
                }
            }
            continue;
        }
        // The source's actor is gone: the source was dropped.
        if feed
            .send_rows(chunk, advanced, reader.splits())
            .await
            .is_err()
        {
            return;
        }
        progress.offset.fetch_add(rows as u64, Ordering::Release);
    }
}

/// Refuses to feed a table with a connector that only feeds sources.
fn sources_only(connector: &str, table: Option<&[usize]>) -> Result<()> {
    match table {
        Some(_) => Err(Error::not_supported(format!(
            "connector '{connector}' feeds sources, not tables"
        ))
        .with_hint(format!(
            "CREATE SOURCE ... WITH (connector = '{connector}', ...), and a view over it."
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connectors_are_found_by_name_in_any_case() {
        assert!(connector("FILE").is_ok());
        assert_eq!(
            connector("pulsar").err().map(|e| e.kind),
            Some(ErrorKind::NotSupported)
        );
    }
}
