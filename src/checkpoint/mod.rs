//! Checkpoints: consistent images of all operator state, persisted to an object store with only
//! new SST files uploaded (see `docs/design/0003-checkpoints.md`).
//!
//! `ledger` holds the decisions, free of I/O: which files a checkpoint uploads and which it
//! reuses, how many retained checkpoints name each object, and what the expiry of old
//! checkpoints deletes. `manifest` is the commit point's format, `storage` the object store,
//! `restore` finds the newest whole checkpoint and rebuilds RocksDB's directory from it;
//! `logs` ships change-log segments to the store.
//! The checkpointer task here runs one checkpoint at a time: it asks the barrier coordinator
//! for a checkpoint barrier, receives the RocksDB checkpoint of its epoch, uploads what the
//! ledger says, writes the manifest, and deletes what expired. The dataflow only waits for
//! the local snapshot, never for the object store.
//!
//! Invariant: this is the only module that imports `object_store`.

mod ledger;
pub mod logs;
mod manifest;
pub mod plan;
pub mod restore;
mod retained;
mod storage;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

pub use self::ledger::manifest_object;
use self::ledger::{Completed, FileRef, Ledger, LocalFile};
use self::manifest::FORMAT;
pub use self::manifest::{Kind, Manifest, Mode, Timings, FORMAT_FAILED_TABLES_RESUME};
pub use self::retained::Retained;
use self::retained::{reads_dir, Pins};
pub use self::storage::{Holder, Storage};
use crate::catalog::Catalog;
use crate::config::CheckpointConfig;
use crate::error::{Error, Result};
use crate::failpoint;
use crate::metrics::Metrics;
use crate::state::{Delta, Image};
use crate::stream::BarrierClient;

/// What `SHOW CHECKPOINTS` shows of one checkpoint.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub id: u64,
    pub epoch: Option<u64>,
    /// Unknown only for a damaged checkpoint whose manifest does not decode.
    pub kind: Option<Kind>,
    /// Known once the state's image is taken.
    pub mode: Option<Mode>,
    pub label: Option<String>,
    pub status: Status,
    pub started_at_ms: i64,
    pub duration_ms: u64,
    pub timings: Timings,
    pub files_uploaded: u64,
    pub files_reused: u64,
    pub bytes_uploaded: u64,
    pub bytes_referenced: u64,
}

/// Where a checkpoint is in its life, as `SHOW CHECKPOINTS` shows it (`Display`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Status {
    #[default]
    InProgress,
    Completed,
    /// No longer retained: the files only it named are deleted.
    Expired,
    Failed(String),
    /// Found in the store at start, and not restorable.
    Damaged(String),
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::InProgress => f.write_str("in progress"),
            Status::Completed => f.write_str("completed"),
            Status::Expired => f.write_str("expired"),
            Status::Failed(why) => write!(f, "failed: {why}"),
            Status::Damaged(why) => write!(f, "damaged: {why}"),
        }
    }
}

/// Every object retained checkpoints name: its size and the ids of the checkpoints naming it.
pub type RetainedFiles = BTreeMap<String, (u64, Vec<u64>)>;

/// How many checkpoints `SHOW CHECKPOINTS` remembers.
const RECORDS_MAX: usize = 100;

struct Trigger {
    kind: Kind,
    label: Option<String>,
    base: bool,
    reply: oneshot::Sender<Result<(u64, u64)>>,
}

/// What the start found in the store: its contents, read once, the checkpoint the state store
/// was restored from, and the manifests found damaged.
pub struct Found<'a> {
    pub store: &'a plan::StoreContents,
    pub restored: Option<u64>,
    pub damaged: &'a [restore::Damaged],
}

/// The handle the rest of the server uses: trigger a checkpoint, read the records.
#[derive(Clone)]
pub struct CheckpointClient {
    triggers: mpsc::Sender<Trigger>,
    records: Arc<Mutex<Vec<Record>>>,
    ledger: Arc<Mutex<RetainedFiles>>,
    /// Checkpoints being read (`retained`), which do not expire until they are not.
    pins: Pins,
    storage: Storage,
    data_dir: PathBuf,
}

/// For each table, the first change-log record some retained checkpoint may still need
/// replayed: the least of its offsets in the retained checkpoints, 0 where one lacks it.
/// Records below it can be truncated.
pub type LogFloors = BTreeMap<u32, u64>;

/// Asks for the tables' logs to be truncated below their floors; answered once they are.
pub type Truncate = (LogFloors, oneshot::Sender<()>);

impl CheckpointClient {
    /// Takes a checkpoint after the one in flight, if any (a base one with `base`); returns
    /// its id and epoch once it is complete, or why it failed.
    pub async fn trigger(
        &self,
        kind: Kind,
        label: Option<String>,
        base: bool,
    ) -> Result<(u64, u64)> {
        let (reply, rx) = oneshot::channel();
        let trigger = Trigger {
            kind,
            label,
            base,
            reply,
        };
        self.triggers
            .send(trigger)
            .await
            .map_err(|_| Error::unavailable("the checkpointer has stopped"))?;
        rx.await
            .map_err(|_| Error::unavailable("the checkpointer has stopped"))?
    }

    /// The checkpoints of this run, newest first.
    pub fn records(&self) -> Vec<Record> {
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        records.reverse();
        records
    }

    /// Every object retained checkpoints name: its size and the checkpoints naming it.
    pub fn files(&self) -> RetainedFiles {
        self.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub struct Checkpointer {
    config: CheckpointConfig,
    storage: Storage,
    barriers: BarrierClient,
    ledger: Ledger,
    run: String,
    next_id: u64,
    staging: PathBuf,
    /// The deltas of retained checkpoints, as written and uploaded: a restart restores from
    /// them without downloading them.
    deltas: PathBuf,
    /// The catalog every checkpoint records, read while DDL is held off.
    catalog: Arc<std::sync::RwLock<Catalog>>,
    triggers: mpsc::Receiver<Trigger>,
    records: Arc<Mutex<Vec<Record>>>,
    files: Arc<Mutex<RetainedFiles>>,
    pins: Pins,
    /// The tables' offsets in each retained checkpoint, by checkpoint id.
    offsets: BTreeMap<u64, BTreeMap<u32, u64>>,
    /// Where each completed checkpoint's log truncation is asked for.
    truncate: Option<mpsc::Sender<Truncate>>,
    /// Held by every DDL statement while it changes the catalog and the dataflow; held here
    /// while the checkpoint barrier is injected and the catalog read, so that both describe
    /// the same epoch.
    ddl: Arc<tokio::sync::Mutex<()>>,
    metrics: Arc<Metrics>,
}

impl Checkpointer {
    /// Starts the checkpointer over `storage`: the checkpoints already in it stay retained
    /// until newer ones replace them, except `damaged` ones, which are shown and left alone;
    /// what a crash left half done is removed. `restored` is the checkpoint the state store
    /// was restored from, whose files are reused by name.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        config: CheckpointConfig,
        storage: Storage,
        found: Found<'_>,
        truncate: Option<mpsc::Sender<Truncate>>,
        barriers: BarrierClient,
        data_dir: PathBuf,
        catalog: Arc<std::sync::RwLock<Catalog>>,
        ddl: Arc<tokio::sync::Mutex<()>>,
        metrics: Arc<Metrics>,
    ) -> Result<CheckpointClient> {
        let run = run_id();
        let mut ledger = Ledger::new(run.clone(), config.retained);
        let (existing, unusable) = plan::adopted(found.store, found.damaged);
        let unusable = unusable_records(unusable);
        let next_id = existing
            .iter()
            .map(|m| m.id)
            .chain(unusable.iter().map(|r| r.id))
            .max()
            .map_or(1, |id| id + 1);
        for m in &existing {
            ledger.adopt(Completed {
                id: m.id,
                files: m.files.clone(),
                deltas: m.deltas.clone(),
            });
        }
        if let Some(id) = found.restored {
            ledger.restored_from(id);
        }
        for name in plan::orphans(found.store, &existing) {
            match storage.delete(&name).await {
                Ok(()) => tracing::info!("removed {name}, which no checkpoint names"),
                Err(e) => tracing::warn!("cannot remove {name}: {e}"),
            }
        }
        let existing: Vec<Manifest> = existing.into_iter().cloned().collect();
        let staging = data_dir.join("checkpoints").join("staging");
        if staging.exists() {
            std::fs::remove_dir_all(&staging)?;
        }
        let reads = reads_dir(&data_dir);
        if reads.exists() {
            std::fs::remove_dir_all(&reads)?;
        }
        let deltas = deltas_dir(&data_dir);
        sweep_deltas(&deltas, &existing)?;
        // After the sweep, which would take parts written ahead for unnamed files.
        std::fs::create_dir_all(&deltas)?;
        barriers.keep_changes(plan::keep(&config, &deltas));
        let (triggers, rx) = mpsc::channel(16);
        let mut found: Vec<Record> = existing
            .iter()
            .map(|m| record_of(m, Status::Completed))
            .chain(unusable)
            .collect();
        found.sort_by_key(|r| r.id);
        let records = Arc::new(Mutex::new(found));
        let files = Arc::new(Mutex::new(BTreeMap::new()));
        let pins = Pins::default();
        let client = CheckpointClient {
            triggers,
            records: records.clone(),
            ledger: files.clone(),
            pins: pins.clone(),
            storage: storage.clone(),
            data_dir,
        };
        let offsets = existing.iter().map(|m| (m.id, m.offsets.clone())).collect();
        let checkpointer = Checkpointer {
            config,
            storage,
            barriers,
            ledger,
            run,
            next_id,
            staging,
            deltas,
            catalog,
            triggers: rx,
            records,
            files,
            pins,
            offsets,
            truncate,
            ddl,
            metrics,
        };
        if let Some(last) = checkpointer.ledger.retained().last() {
            checkpointer
                .metrics
                .checkpoint_last_completed_id
                .store(last.id, Ordering::Relaxed);
        }
        checkpointer.publish_files();
        tokio::spawn(checkpointer.run());
        Ok(client)
    }

    async fn run(mut self) {
        let interval = Duration::from_millis(self.config.interval_ms);
        let min_pause = Duration::from_millis(self.config.min_pause_ms);
        let mut last_start = crate::clock::monotonic();
        let mut last_end = crate::clock::monotonic();
        loop {
            let due = (last_start + interval).max(last_end + min_pause);
            let periodic = async {
                if interval.is_zero() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep_until(due).await;
            };
            tokio::select! {
                trigger = self.triggers.recv() => {
                    let Some(t) = trigger else { return };
                    last_start = crate::clock::monotonic();
                    let result = self.checkpoint(t.kind, t.label, t.base).await;
                    last_end = crate::clock::monotonic();
                    let _ = t.reply.send(result);
                }
                _ = periodic => {
                    last_start = crate::clock::monotonic();
                    if let Err(e) = self.checkpoint(Kind::Periodic, None, false).await {
                        tracing::warn!("periodic checkpoint failed: {e}");
                    }
                    last_end = crate::clock::monotonic();
                }
            }
        }
    }

    /// Takes one checkpoint, start to finish; returns its id and epoch.
    async fn checkpoint(
        &mut self,
        kind: Kind,
        label: Option<String>,
        base: bool,
    ) -> Result<(u64, u64)> {
        let id = self.next_id;
        self.next_id += 1;
        let started_at_ms = crate::clock::wall_ms();
        let started = crate::clock::monotonic();
        let mut record = Record {
            id,
            epoch: None,
            kind: Some(kind),
            label: label.clone(),
            status: Status::InProgress,
            started_at_ms,
            ..Record::default()
        };
        self.set_record(&record);
        let dir = self.staging.join(id.to_string());
        let mut uploaded = Vec::new();
        let result = self
            .take(
                id,
                (kind, label, base),
                (started_at_ms, started),
                &dir,
                &mut record,
                &mut uploaded,
            )
            .await;
        let _ = std::fs::remove_dir_all(&dir);
        if result.is_err() {
            record.duration_ms = started.elapsed().as_millis() as u64;
        }
        match &result {
            Ok(()) => {
                record.status = Status::Completed;
                let m = &self.metrics;
                m.checkpoint_duration
                    .observe(Duration::from_millis(record.duration_ms));
                m.checkpoint_bytes_uploaded
                    .fetch_add(record.bytes_uploaded, Ordering::Relaxed);
                m.checkpoints_completed.fetch_add(1, Ordering::Relaxed);
                m.checkpoint_last_completed_id.store(id, Ordering::Relaxed);
                tracing::info!(
                    id,
                    epoch = record.epoch,
                    uploaded = record.bytes_uploaded,
                    referenced = record.bytes_referenced,
                    ms = record.duration_ms,
                    "checkpoint completed"
                );
            }
            Err(e) => {
                record.status = Status::Failed(e.message.clone());
                self.metrics
                    .checkpoints_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(id, "checkpoint failed: {}", e.message);
                // No retained checkpoint names what this one uploaded: a shared file it did
                // not reuse is not in the last completed checkpoint, and so in none (a file
                // name is never reused within a run). What cannot be deleted now is retried
                // when the next checkpoint completes.
                let mut left = Vec::new();
                for object in uploaded {
                    // Its deltas' local copies too (a base file is not among them).
                    if let Some(local) = object.strip_prefix("shared/") {
                        let _ = std::fs::remove_file(self.deltas.join(local));
                    }
                    if self.storage.delete(&object).await.is_err() {
                        left.push(object);
                    }
                }
                self.ledger.fail(left);
            }
        }
        self.set_record(&record);
        result.map(|()| (id, record.epoch.unwrap_or_default()))
    }

    /// The checkpoint a delta checkpoint would extend now, if it may (`plan::may_extend`).
    fn chain(&self, base: bool) -> Option<&Completed> {
        let last = self.ledger.chain()?;
        let (incremental, max_deltas) = (self.config.incremental, self.config.max_deltas);
        plan::may_extend(
            last,
            base,
            incremental,
            max_deltas,
            self.barriers.state_bytes(),
        )
        .then_some(last)
    }

    async fn take(
        &mut self,
        id: u64,
        (kind, label, base): (Kind, Option<String>, bool),
        (started_at_ms, started): (i64, tokio::time::Instant),
        dir: &std::path::Path,
        record: &mut Record,
        uploaded: &mut Vec<String>,
    ) -> Result<()> {
        let chain = self.chain(base).cloned();
        let (catalog, snapshot) = {
            let _ddl = self.ddl.lock().await;
            let catalog = self
                .catalog
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .saved()?;
            let snapshot = self
                .barriers
                .checkpoint_barrier(dir.to_path_buf(), chain.is_some())
                .await?;
            (catalog, snapshot)
        };
        let taken = snapshot
            .await
            .map_err(|_| Error::unavailable("the barrier coordinator has stopped"))??;
        // Known after the snapshot: an actor failing before the epoch sealed is among them.
        let mut failed_actors: Vec<u32> = self
            .barriers
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        failed_actors.sort_unstable();
        record.epoch = Some(taken.epoch);
        record.timings.align_ms = taken.align.as_millis() as u64;
        record.timings.snapshot_ms = taken.snapshot.as_millis() as u64;
        record.mode = Some(match taken.image {
            Image::Delta(_) => Mode::Delta,
            Image::Files(_) => Mode::Base,
        });
        self.set_record(record);
        let upload_started = crate::clock::monotonic();
        failpoint::reach("checkpoint.before_upload").await;
        let (mode, files, deltas) = match (taken.image, chain) {
            (Image::Delta(delta), Some(chain)) => {
                let mut deltas = chain.deltas.clone();
                record.files_reused = (chain.files.len() + deltas.len()) as u64;
                deltas.extend(self.upload_delta(id, delta, record, uploaded).await?);
                (Mode::Delta, chain.files, deltas)
            }
            (Image::Files(files), _) => {
                let files = self.upload_files(id, dir, files, record, uploaded).await?;
                (Mode::Base, files, Vec::new())
            }
            (Image::Delta(_), None) => {
                return Err(Error::internal(
                    "a delta taken without a checkpoint to extend",
                ))
            }
        };
        let mut manifest = Manifest {
            format: FORMAT,
            id,
            epoch: taken.epoch,
            kind,
            label,
            run: self.run.clone(),
            started_at_ms,
            mode,
            files: files.clone(),
            deltas: deltas.clone(),
            files_uploaded: record.files_uploaded,
            bytes_uploaded: record.bytes_uploaded,
            offsets: taken.offsets.clone(),
            watermarks: taken.watermarks.clone(),
            splits: taken.splits.clone(),
            failed_actors,
            catalog,
            timings: record.timings.clone(),
        };
        manifest.timings.upload_ms = upload_started.elapsed().as_millis() as u64;
        record.bytes_referenced = manifest.bytes_referenced();
        failpoint::reach("checkpoint.before_manifest").await;
        self.storage
            .put(&manifest_object(id), Bytes::from(manifest.encode()?))
            .await?;
        // Complete: what follows (expiry, the logs' truncation) is not in its duration.
        record.duration_ms = started.elapsed().as_millis() as u64;
        failpoint::reach("checkpoint.after_manifest").await;
        self.barriers
            .checkpoint_durable(taken.epoch, Arc::new(taken.splits.clone()));
        record.timings = manifest.timings.clone();
        self.offsets.insert(id, taken.offsets.clone());
        self.retire(Completed { id, files, deltas }).await;
        self.publish_files();
        self.truncate_logs().await;
        Ok(())
    }

    /// Records `completed` in the ledger, now that its manifest exists, and deletes what
    /// expired: manifests first, so that a crash between these deletions leaves only objects
    /// no manifest names.
    /// A checkpoint being read does not expire (`retained`): the pins are held until the
    /// expired ones are marked, so that a reader never pins one that is going.
    async fn retire(&mut self, completed: Completed) {
        let retired = {
            let pins = self.pins.held();
            let retired = self
                .ledger
                .complete(completed, &pins.keys().copied().collect());
            let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
            for r in records
                .iter_mut()
                .filter(|r| retired.expired.contains(&r.id))
            {
                r.status = Status::Expired;
            }
            retired
        };
        for expired in &retired.expired {
            if let Err(e) = self.storage.delete(&manifest_object(*expired)).await {
                tracing::warn!("cannot delete expired checkpoint {expired}: {e}");
            }
        }
        for object in &retired.delete {
            failpoint::reach("checkpoint.during_expiry").await;
            if let Err(e) = self.storage.delete(object).await {
                tracing::warn!("cannot delete {object}, left for the sweep at start: {e}");
            }
            if let Some(local) = object.strip_prefix("shared/") {
                let _ = std::fs::remove_file(self.deltas.join(local));
            }
        }
    }

    /// Writes checkpoint `id`'s delta as SST files beside the others (its parts written
    /// ahead, then the rest) and uploads them, oldest first; none when there were no writes.
    /// On an error, none of them is left on the local disk.
    async fn upload_delta(
        &mut self,
        id: u64,
        delta: Delta,
        record: &mut Record,
        uploaded: &mut Vec<String>,
    ) -> Result<Vec<FileRef>> {
        std::fs::create_dir_all(&self.deltas)?;
        let names: Vec<(String, String)> = (0..delta.files_max())
            .map(|part| self.ledger.delta_names(id, part))
            .collect();
        let paths: Vec<PathBuf> = names.iter().map(|(_, l)| self.deltas.join(l)).collect();
        // Waiting for the parts, sorting the writes and encoding them run off the async
        // threads.
        let sizes = {
            let paths = paths.clone();
            tokio::task::spawn_blocking(move || delta.write(&paths))
                .await
                .map_err(|e| Error::internal(format!("writing a delta: {e}")))??
        };
        let mut files = Vec::with_capacity(sizes.len());
        for ((object, local), path) in names.into_iter().zip(&paths).take(sizes.len()) {
            match self.upload(path.clone(), &object, record, uploaded).await {
                Ok((size, crc32)) => files.push(FileRef {
                    object,
                    local,
                    size,
                    crc32,
                }),
                Err(e) => {
                    for path in &paths[..sizes.len()] {
                        let _ = std::fs::remove_file(path);
                    }
                    return Err(e);
                }
            }
        }
        Ok(files)
    }

    /// Uploads what the ledger says of a RocksDB checkpoint's `files` in `dir`; returns every
    /// file the checkpoint names, reused and uploaded.
    async fn upload_files(
        &mut self,
        id: u64,
        dir: &std::path::Path,
        files: Vec<(String, u64)>,
        record: &mut Record,
        uploaded: &mut Vec<String>,
    ) -> Result<Vec<FileRef>> {
        let files: Vec<LocalFile> = files
            .into_iter()
            .map(|(name, size)| LocalFile { name, size })
            .collect();
        let plan = self.ledger.plan(id, &files, self.config.incremental);
        let mut refs = plan.reuse.clone();
        for (file, object) in &plan.upload {
            let (size, crc32) = self
                .upload(dir.join(&file.name), object, record, uploaded)
                .await?;
            failpoint::reach("checkpoint.between_uploads").await;
            refs.push(FileRef {
                object: object.clone(),
                local: file.name.clone(),
                size,
                crc32,
            });
        }
        record.files_reused = plan.reuse.len() as u64;
        Ok(refs)
    }

    /// Uploads the file at `path` as `object` (named in `uploaded` first, so that a failed
    /// checkpoint deletes it) and counts it in `record`; returns its size and CRC32.
    async fn upload(
        &self,
        path: PathBuf,
        object: &str,
        record: &mut Record,
        uploaded: &mut Vec<String>,
    ) -> Result<(u64, u32)> {
        uploaded.push(object.to_string());
        // A part at a time: an SST can be larger than memory.
        let (size, crc32) = self.storage.put_file(object, &path).await?;
        record.files_uploaded += 1;
        record.bytes_uploaded += size;
        Ok((size, crc32))
    }

    fn set_record(&self, record: &Record) {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        match records.iter_mut().find(|r| r.id == record.id) {
            Some(r) => *r = record.clone(),
            None => records.push(record.clone()),
        }
        let excess = records.len().saturating_sub(RECORDS_MAX);
        records.drain(..excess);
    }

    /// Truncates the tables' logs below the records the retained checkpoints hold, and waits
    /// until that is done.
    async fn truncate_logs(&mut self) {
        let retained: BTreeSet<u64> = self.ledger.retained().map(|c| c.id).collect();
        self.offsets.retain(|id, _| retained.contains(id));
        let floors: LogFloors = plan::log_floors(&self.offsets);
        if let Some(truncate) = &self.truncate {
            let (done, wait) = oneshot::channel();
            if truncate.send((floors, done)).await.is_ok() {
                let _ = wait.await;
            }
        }
    }

    /// Publishes the retained checkpoints' objects for `weir_catalog.checkpoint_files`.
    fn publish_files(&self) {
        let mut files = RetainedFiles::new();
        for c in self.ledger.retained() {
            for f in c.objects() {
                let entry = files
                    .entry(f.object.clone())
                    .or_insert((f.size, Vec::new()));
                entry.1.push(c.id);
            }
        }
        *self.files.lock().unwrap_or_else(|p| p.into_inner()) = files;
    }
}

fn record_of(m: &Manifest, status: Status) -> Record {
    Record {
        id: m.id,
        epoch: Some(m.epoch),
        kind: Some(m.kind),
        mode: Some(m.mode),
        label: m.label.clone(),
        status,
        started_at_ms: m.started_at_ms,
        duration_ms: m.timings.align_ms + m.timings.snapshot_ms + m.timings.upload_ms,
        timings: m.timings.clone(),
        files_uploaded: m.files_uploaded,
        files_reused: {
            let named = (m.files.len() + m.deltas.len()) as u64;
            named - m.files_uploaded.min(named)
        },
        bytes_uploaded: m.bytes_uploaded,
        bytes_referenced: m.bytes_referenced(),
    }
}

/// A record of each manifest the checkpointer leaves alone (`plan::adopted`).
fn unusable_records(unusable: Vec<plan::LeftAlone<'_>>) -> Vec<Record> {
    let mut records = Vec::new();
    for (name, decoded, reason) in unusable {
        tracing::error!("checkpoint {name} is damaged and left alone: {reason}");
        let id = name
            .split('/')
            .nth(1)
            .and_then(|id| id.parse().ok())
            .unwrap_or_default();
        let status = Status::Damaged(reason);
        records.push(match decoded {
            Some(m) => record_of(m, status),
            None => Record {
                id,
                status,
                ..Record::default()
            },
        });
    }
    records
}

/// Where a data directory keeps the deltas of retained checkpoints.
pub fn deltas_dir(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("checkpoints").join("deltas")
}

/// Removes the local deltas that no checkpoint in the store names (expired while the server
/// was down, or written by a checkpoint that never completed).
fn sweep_deltas(dir: &std::path::Path, manifests: &[Manifest]) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let named: BTreeSet<&str> = manifests
        .iter()
        .flat_map(|m| m.deltas.iter().map(|f| f.local.as_str()))
        .collect();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if !named.contains(name.to_string_lossy().as_ref()) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// A random id for this run of the server, so that its file names never meet another run's.
fn run_id() -> String {
    random_id()
}

/// 64 random bits in hex (from the clock and the process id if `/dev/urandom` cannot be read).
pub(crate) fn random_id() -> String {
    let mut bytes = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if random.is_err() {
        let nanos = crate::clock::wall()
            .timestamp_nanos_opt()
            .unwrap_or_default();
        bytes = ((nanos as u64) ^ ((std::process::id() as u64) << 32)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
