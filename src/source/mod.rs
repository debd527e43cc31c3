//! Sources: append-only streams that a connector produces and a task feeds into the
//! dataflow through a `Feed`, as a table's writer does, but with no writer and no stored rows.
//!
//! A source's offset is the number of rows it has fed. Every connector can start again at any
//! offset (the Nexmark generator is a function of the event number; a file source skips rows),
//! so a checkpoint records the offset at its barrier and a restart feeds on from there: the
//! views reading a source end as if nothing had failed.
//!
//! A source produces only while a view or sink reads it (`Handle::set_running`). It keeps no
//! rows, but a view created after some went by is backfilled with them all the same: the
//! source's actor reads its stream again from the start up to the rows it has passed on
//! (`stream::actor::SourceRows`), so every view over a source is its query over every row the
//! source has produced, whenever the view was created.

pub mod file;
pub mod nexmark;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::catalog::{Connector, SourceDef};
use crate::error::{Error, Result};
use crate::stream::chunk::{Op, StreamChunk};
use crate::stream::message::{Feed, FEED_ROWS_MAX};

/// Produces a source's rows in order.
pub trait Reader: Send {
    /// The next rows (at most `rows_max`), or `None` at the end of the stream.
    fn next_batch(&mut self, rows_max: usize) -> Result<Option<RecordBatch>>;

    /// How far the reader has gone, in the unit of the source's rate limit (Nexmark: events
    /// of the whole sequence, of all three streams).
    fn position(&self) -> u64;
}

/// A reader of `def`'s stream whose first row is the `offset`-th. With `ledger` (the
/// directory of the sources' ledgers, and whether this reader is the source's own, which
/// records what it reads), a file source checks that the files before row `checked` are those
/// it read before (`file::FileLedger`).
pub fn open(
    def: &SourceDef,
    (offset, checked): (u64, u64),
    ledger: Option<(&std::path::Path, bool)>,
) -> Result<Box<dyn Reader>> {
    match &def.connector {
        Connector::Nexmark { stream, events, .. } => Ok(Box::new(nexmark::NexmarkReader::open(
            stream,
            *events,
            offset,
            def.schema(),
        )?)),
        Connector::File { path, header } => Ok(Box::new(file::FileReader::open(
            std::path::Path::new(path),
            *header,
            def.schema(),
            (offset, checked),
            ledger
                .map(|(dir, record)| file::FileLedger::open(dir, def.id, record))
                .transpose()?,
        )?)),
    }
}

/// What a source's task has done so far, for `weir_catalog.sources`.
#[derive(Debug, Default)]
pub struct Progress {
    /// Rows fed (the offset of the next one).
    pub offset: AtomicU64,
    /// The stream has ended: every row is fed.
    pub done: AtomicBool,
    /// Why the source stopped early (an unreadable file, a malformed row).
    pub error: Mutex<Option<String>>,
}

/// A running source task.
pub struct Handle {
    running: watch::Sender<bool>,
    pub progress: Arc<Progress>,
}

impl Handle {
    /// Starts or pauses the source: it feeds rows only while something reads it.
    pub fn set_running(&self, running: bool) {
        self.running.send_replace(running);
    }

    /// Whether something reads the source, so that it feeds rows until its stream ends.
    pub fn running(&self) -> bool {
        *self.running.borrow()
    }
}

/// Starts the task that feeds `def`'s rows from `offset` on into `feed`, paused; `watermark`
/// is the source's watermark at `offset` (from a checkpoint), from which it only advances.
/// `ledgers` is the directory of the sources' ledgers. A source whose input cannot be read
/// again as it was (a file changed or gone) reports it in its progress and feeds nothing.
pub fn spawn(
    def: SourceDef,
    feed: Feed,
    (offset, watermark): (u64, Option<i64>),
    ledgers: &std::path::Path,
) -> Handle {
    let (running, paused) = watch::channel(false);
    let progress = Arc::new(Progress {
        offset: AtomicU64::new(offset),
        ..Default::default()
    });
    let reader = match open(&def, (offset, offset), Some((ledgers, true))) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(source = %def.name, "source stopped: {e}");
            *progress.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            return Handle { running, progress };
        }
    };
    tokio::spawn(feed_rows(
        def,
        feed,
        reader,
        paused,
        progress.clone(),
        watermark,
    ));
    Handle { running, progress }
}

async fn feed_rows(
    def: SourceDef,
    feed: Feed,
    mut reader: Box<dyn Reader>,
    mut running: watch::Receiver<bool>,
    progress: Arc<Progress>,
    mut watermark: Option<i64>,
) {
    let rate = match &def.connector {
        Connector::Nexmark {
            events_per_second, ..
        } => *events_per_second,
        Connector::File { .. } => None,
    };
    let files = matches!(def.connector, Connector::File { .. });
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
        if let Some(rate) = rate.filter(|r| *r > 0) {
            let (start, base) =
                *paced.get_or_insert((crate::clock::monotonic(), reader.position()));
            let ahead = reader.position().saturating_sub(base);
            tokio::time::sleep_until(start + Duration::from_secs_f64(ahead as f64 / rate as f64))
                .await;
        }
        // Files are read off the async workers: a slow disk must not hold up the others.
        let read = match files {
            true => {
                let read = tokio::task::spawn_blocking(move || {
                    let batch = reader.next_batch(FEED_ROWS_MAX);
                    (reader, batch)
                })
                .await;
                match read {
                    Ok((r, batch)) => {
                        reader = r;
                        batch
                    }
                    Err(e) => {
                        let e = Error::internal(format!("reading a source: {e}"));
                        *progress.error.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(e.to_string());
                        return;
                    }
                }
            }
            false => reader.next_batch(FEED_ROWS_MAX),
        };
        let batch = match read {
            Ok(Some(b)) => b,
            Ok(None) => {
                progress.done.store(true, Ordering::Release);
                return;
            }
            Err(e) => {
                tracing::error!(source = %def.name, "source stopped: {e}");
                *progress.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                return;
            }
        };
        let rows = batch.num_rows();
        let chunk = StreamChunk::new(vec![Op::Insert; rows], batch);
        let advanced = def
            .watermark
            .and_then(|w| crate::table::advance_watermark(w, &mut watermark, &chunk));
        // The source's actor is gone: the source was dropped.
        if feed.send_rows(chunk, advanced).await.is_err() {
            return;
        }
        progress.offset.fetch_add(rows as u64, Ordering::Release);
    }
}
