//! Recovery at start: the state store restored from the newest whole checkpoint (or opened
//! empty), the data directory rebuilt from the store alone when it has no catalog, the
//! restored objects whose state is usable; and the tasks that keep the change logs in step
//! with checkpoints (truncation below what every retained checkpoint holds, shipping to the
//! store).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::views::ViewStart;
use super::Database;
use crate::catalog::{Catalog, Object, ObjectId};
use crate::checkpoint::plan::{self, StoreContents};
use crate::checkpoint::Manifest;
use crate::checkpoint::Storage;
use crate::checkpoint::{logs, restore};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::state::{StateStore, TableId};
use crate::stream::{ActorErrors, FeedPosition, ERRORS_TABLE};
use crate::table::TableWriter;

/// How long a checkpoint's truncation waits for a table's writer.
const TRUNCATE_WAIT: Duration = Duration::from_secs(1);

/// Truncates each table's change log below the records every retained checkpoint holds, as
/// each checkpoint completes, until the database is gone.
pub(super) async fn truncate_logs(
    db: std::sync::Weak<Database>,
    mut requests: mpsc::Receiver<crate::checkpoint::Truncate>,
    shipped: Option<Storage>,
) {
    while let Some((floors, done)) = requests.recv().await {
        let Some(db) = db.upgrade() else { return };
        for (table, floor) in floors {
            let writer = db
                .tables
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&table)
                .cloned();
            // A writer busy with a large statement is left for the next checkpoint rather
            // than holding up this one's completion for the length of the statement.
            let locked = match writer {
                Some(w) => tokio::time::timeout(TRUNCATE_WAIT, w.lock_owned())
                    .await
                    .ok(),
                None => None,
            };
            if let Some(mut writer) = locked {
                if let Err(e) = writer.truncate_log_below(floor) {
                    tracing::warn!("cannot truncate the change log of table {table}: {e}");
                }
            }
            if let Some(storage) = &shipped {
                if let Err(e) = logs::collect(storage, table, floor).await {
                    tracing::warn!("cannot delete shipped log segments of table {table}: {e}");
                }
            }
        }
        let _ = done.send(());
    }
}

/// Ships every table's new change-log records to the store every `interval`, until the
/// database is gone (`checkpoint.ship_logs_ms`).
pub(super) async fn ship_logs(db: std::sync::Weak<Database>, storage: Storage, interval: Duration) {
    // The next record to ship, per table; from the segments already in the store at first.
    let mut next: HashMap<ObjectId, u64> = HashMap::new();
    loop {
        tokio::time::sleep(interval).await;
        let Some(db) = db.upgrade() else { return };
        let writers: Vec<(ObjectId, Arc<tokio::sync::Mutex<TableWriter>>)> = db
            .tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, w)| (*id, w.clone()))
            .collect();
        drop(db);
        for (table, writer) in writers {
            let from = match next.get(&table) {
                Some(n) => *n,
                None => match logs::segments(&storage, table).await {
                    Ok(s) => s.iter().map(|s| s.end).max().unwrap_or(0),
                    Err(e) => {
                        tracing::warn!("cannot list shipped log segments of table {table}: {e}");
                        continue;
                    }
                },
            };
            let read = writer.lock().await.log_from(from);
            let (first, end, bytes) = match read {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("cannot read the change log of table {table}: {e}");
                    continue;
                }
            };
            if end > first {
                if let Err(e) = logs::ship(&storage, table, first, end, bytes).await {
                    tracing::warn!("cannot ship the change log of table {table}: {e}");
                    continue;
                }
            }
            next.insert(table, end);
        }
    }
}

/// Opens the state store: restored from the newest whole checkpoint in `storage` whose files
/// check, or empty (every view rebuilt from the logs) when the store holds no checkpoint, or
/// none can be restored and every log still starts at record 0. Fills in `recovery`.
pub(super) async fn restore_state(
    config: &Config,
    storage: &Storage,
    contents: &StoreContents,
    recovery: &mut restore::Recovery,
) -> Result<(Arc<StateStore>, Option<crate::checkpoint::Manifest>)> {
    let state_dir = config.data_dir.join("state");
    let plan = plan::recovery_plan(contents)?;
    recovery.damaged = plan.damaged;
    let rebuilding = config.data_dir.join("state.restoring");
    for m in plan.candidates {
        if rebuilding.exists() {
            std::fs::remove_dir_all(&rebuilding)?;
        }
        let fetched = config.data_dir.join("deltas.restoring");
        if fetched.exists() {
            std::fs::remove_dir_all(&fetched)?;
        }
        let kept = crate::checkpoint::deltas_dir(&config.data_dir);
        let fetch = async {
            let mut rebuilt = restore::rebuild(storage, &m, &state_dir, &rebuilding).await?;
            let deltas = restore::fetch_deltas(storage, &m, &kept, &fetched, &mut rebuilt).await?;
            Ok::<_, Error>((rebuilt, deltas))
        };
        let (rebuilt, deltas) = match fetch.await {
            Ok(fetched) => fetched,
            // A file whose bytes do not match the manifest: the next older checkpoint.
            Err(e) if e.kind == ErrorKind::DataCorruption => {
                std::fs::remove_dir_all(&rebuilding)?;
                if fetched.exists() {
                    std::fs::remove_dir_all(&fetched)?;
                }
                recovery.damaged.push(restore::Damaged {
                    manifest: crate::checkpoint::manifest_object(m.id),
                    reason: e.message,
                });
                continue;
            }
            Err(e) => return Err(e),
        };
        restore::install(&rebuilding, &state_dir)?;
        for d in &recovery.damaged {
            tracing::error!(
                "checkpoint {} cannot be restored: {}; checkpoint {} is restored instead",
                d.manifest,
                d.reason,
                m.id
            );
        }
        let store = StateStore::open_restored(&state_dir, m.epoch, &deltas)?;
        if fetched.exists() {
            std::fs::remove_dir_all(&fetched)?;
        }
        tracing::info!(
            "restored checkpoint {} (epoch {}, {} deltas): {} files reused, {} downloaded \
             ({} bytes)",
            m.id,
            m.epoch,
            deltas.len(),
            rebuilt.files_reused,
            rebuilt.files_downloaded,
            rebuilt.bytes_downloaded
        );
        recovery.checkpoint_id = Some(m.id);
        recovery.epoch = Some(m.epoch);
        recovery.files_reused = rebuilt.files_reused;
        recovery.files_downloaded = rebuilt.files_downloaded;
        recovery.bytes_downloaded = rebuilt.bytes_downloaded;
        return Ok((store, Some(m)));
    }
    let truncated = TableWriter::truncated(&config.data_dir.join("tables"))?;
    plan::without_checkpoint(&recovery.damaged, truncated.first().copied())?;
    for d in &recovery.damaged {
        tracing::error!(
            "checkpoint {} cannot be restored ({}); without one, every view is rebuilt from \
             the change logs",
            d.manifest,
            d.reason
        );
    }
    Ok((StateStore::open_fresh(&state_dir)?, None))
}

/// Without a local catalog (a new machine, a lost disk), the checkpoint `m`'s catalog becomes
/// the data directory's, and each table's log starts at the checkpoint's offset with the
/// records shipped to the store after it: what was acknowledged after that lived only on the
/// lost disk.
pub(super) async fn install_from_store(
    config: &Config,
    storage: &Storage,
    contents: &StoreContents,
    m: &Manifest,
    tables_dir: &Path,
) -> Result<()> {
    // Empty logs are what a crash during this step leaves; anything else is local
    // data that must not be overwritten.
    for entry in std::fs::read_dir(tables_dir)? {
        if entry?.metadata()?.len() > 0 {
            return Err(Error::new(
                ErrorKind::DataCorruption,
                format!(
                    "{} holds change logs but no catalog.json: restore the catalog, \
                     or move the data directory aside to restore from the checkpoint \
                     store alone",
                    config.data_dir.display()
                ),
            ));
        }
    }
    for object in Catalog::objects_in(&m.catalog)? {
        // A connector table has no change log: its connector reads on from the checkpoint.
        if let Object::Table(t) = object.clone() {
            if t.connector.is_some() {
                continue;
            }
            let offset = m.offsets.get(&t.id).copied().unwrap_or(0);
            let shipped = logs::segments_in(contents.objects.keys(), t.id);
            logs::restore(storage, &shipped, tables_dir, t.id, offset).await?;
        }
    }
    // Last: the catalog's presence says the logs are in place.
    Catalog::install(&config.data_dir, &m.catalog)?;
    tracing::warn!(
        "no local catalog: restored from checkpoint {} in the store alone; changes \
         acknowledged after its epoch {} are lost",
        m.id,
        m.epoch
    );
    Ok(())
}

/// Finishes the transaction blocks a crash cut short after their commit points, before
/// anything starts: the catalog changes of those that ran DDL first (their objects kept, their
/// drops applied; the objects of blocks that never committed dropped, with their tables'
/// logs), then each block's records into the logs that miss them.
/// Opens the data directory's catalog: the first start (or the first of a catalog from
/// before roles) creates the bootstrap superuser, later ones keep the roles the catalog
/// holds; commits a crash cut short are finished; and secrets' values go into their
/// connectors' options, in memory only (a secret the keys cannot open leaves its connectors
/// to report it as they start).
pub(super) fn open_catalog(
    config: &Config,
    tables_dir: &Path,
) -> Result<(Catalog, crate::catalog::SecretKeys)> {
    let password = (config.superuser_password.as_deref())
        .map(crate::catalog::Verifier::of_password)
        .transpose()?;
    let mut catalog = Catalog::open(&config.data_dir, password)?;
    finish_commits(&mut catalog, tables_dir)?;
    let secret_keys = config.secret_keys()?;
    for problem in catalog.unseal_secrets(&secret_keys)? {
        tracing::warn!("{problem}");
    }
    Ok((catalog, secret_keys))
}

pub(super) fn finish_commits(catalog: &mut Catalog, tables_dir: &Path) -> Result<()> {
    let committed = TableWriter::committed_blocks(tables_dir)?;
    for gone in catalog.settle_blocks(&committed)? {
        if let Object::Table(t) = gone {
            TableWriter::remove(tables_dir, t.id)?;
        }
    }
    let tables: HashSet<ObjectId> = catalog
        .objects()
        .iter()
        .filter_map(|o| match o {
            Object::Table(t) => Some(t.id),
            _ => None,
        })
        .collect();
    TableWriter::redo_commits(tables_dir, |id| tables.contains(&id))
}

/// The objects of the restored checkpoint whose state is usable, by id. The state of the
/// others is deleted (with the row errors their actors counted) and they start as new ones.
pub(super) fn usable_objects(
    store: &StateStore,
    restored: Option<&Manifest>,
    objects: &[Object],
) -> Result<HashMap<ObjectId, Object>> {
    // Each object's fate is decided by `fate` alone; this carries it out.
    let failed: HashSet<u32> = restored
        .into_iter()
        .flat_map(|m| m.failed_actors.iter().copied())
        .collect();
    let tables_resume =
        restored.is_none_or(|m| m.format >= crate::checkpoint::FORMAT_FAILED_TABLES_RESUME);
    let mut in_checkpoint: HashMap<ObjectId, Object> = match restored {
        Some(m) => Catalog::objects_in(&m.catalog)?
            .into_iter()
            .map(|o| (o.id(), o))
            .collect(),
        None => HashMap::new(),
    };
    let live: HashSet<ObjectId> = objects.iter().map(Object::id).collect();
    let mut unusable = Vec::new();
    for o in in_checkpoint.values() {
        match fate(o, &live, &failed, tables_resume) {
            Fate::Usable => {}
            Fate::Resumed => tracing::warn!(
                "table \"{}\" had failed when checkpoint was taken: its change log is \
                 replayed from where its state ends",
                o.name()
            ),
            Fate::Rebuilt => {
                tracing::warn!(
                    "\"{}\" had failed when checkpoint was taken: it is rebuilt",
                    o.name()
                );
                unusable.push(o.id());
            }
            Fate::Dropped => unusable.push(o.id()),
        }
    }
    let gone: Vec<Object> = unusable
        .iter()
        .filter_map(|id| in_checkpoint.remove(id))
        .collect();
    let dropped: Vec<TableId> = gone
        .iter()
        .flat_map(|o| match o {
            Object::Table(t) => vec![t.id],
            Object::Source(_) => vec![],
            Object::View(v) => std::iter::once(v.id)
                .chain(v.state_tables.iter().copied())
                .collect(),
        })
        .collect();
    store.delete_tables(&dropped)?;
    // And the row errors their actors counted.
    let counts: Vec<Vec<u8>> = gone
        .iter()
        .filter_map(|o| match o {
            Object::View(v) => Some(std::iter::once(v.id).chain(v.workers.iter().copied())),
            _ => None,
        })
        .flatten()
        .map(ActorErrors::key)
        .collect();
    store.delete_keys(ERRORS_TABLE, &counts)?;
    Ok(in_checkpoint)
}

impl Database {
    /// Starts the catalog's objects at start: those restored with their state first (tables,
    /// views connected to them without backfill, then the tables' log records after the
    /// checkpoint fed to both), then the objects created after the checkpoint, in catalog
    /// order, as on a first start. Returns the log records replayed.
    pub(super) async fn start_objects(
        &self,
        objects: Vec<Object>,
        in_checkpoint: &HashMap<ObjectId, Object>,
        restored: Option<&Manifest>,
    ) -> Result<u64> {
        let (restored_objects, new_objects): (Vec<Object>, Vec<Object>) = objects
            .into_iter()
            .partition(|o| in_checkpoint.contains_key(&o.id()));
        let offsets = restored.map(|m| m.offsets.clone()).unwrap_or_default();
        let mut replays = Vec::new();
        let mut replayed = 0;
        for object in &restored_objects {
            match object {
                Object::Table(t) if t.connector.is_some() => {
                    self.start_connector_table(t.clone(), position(restored, t.id))
                        .await?;
                }
                Object::Table(t) => {
                    let offset = offsets.get(&t.id).copied().ok_or_else(|| {
                        Error::new(
                            ErrorKind::DataCorruption,
                            format!(
                                "the checkpoint restored holds table \"{}\" but no offset in \
                                 its change log",
                                t.name
                            ),
                        )
                    })?;
                    let watermark = restored.and_then(|m| m.watermarks.get(&t.id).copied());
                    replays.push(
                        self.start_table(t.clone(), Some((offset, watermark)))
                            .await?,
                    );
                }
                Object::View(v) => self.start_view_from_catalog(v, ViewStart::Restored).await?,
                Object::Source(src) => {
                    self.start_source(src.clone(), position(restored, src.id))
                        .await?;
                }
            }
        }
        for replay in replays {
            replayed += replay.history.len() as u64;
            self.replay(replay).await?;
        }
        for object in new_objects {
            match object {
                Object::Table(t) if t.connector.is_some() => {
                    self.start_connector_table(t, FeedPosition::default())
                        .await?
                }
                Object::Table(t) => {
                    let replay = self.start_table(t, None).await?;
                    replayed += replay.history.len() as u64;
                    self.replay(replay).await?;
                }
                Object::View(v) => self.start_view_from_catalog(&v, ViewStart::Rebuilt).await?,
                Object::Source(src) => self.start_source(src, FeedPosition::default()).await?,
            }
        }
        Ok(replayed)
    }

    /// Starts the tasks that keep the change logs in step with checkpoints: truncation below
    /// what every retained checkpoint holds (through the sender returned, which the
    /// checkpointer signals) and, when configured, shipping to the store.
    pub(super) fn spawn_log_tasks(
        self: &Arc<Database>,
        storage: &Storage,
    ) -> mpsc::Sender<crate::checkpoint::Truncate> {
        let (truncate, requests) = mpsc::channel(1);
        let shipping = self.config.checkpoint.ship_logs_ms;
        let shipped = (shipping > 0).then(|| storage.clone());
        tokio::spawn(truncate_logs(
            Arc::downgrade(self),
            requests,
            shipped.clone(),
        ));
        if let Some(storage) = shipped {
            tokio::spawn(ship_logs(
                Arc::downgrade(self),
                storage,
                Duration::from_millis(shipping),
            ));
        }
        truncate
    }
}

/// Where a source's or a connector table's feed starts: at the restored checkpoint's row count,
/// watermark and connector position for it.
fn position(restored: Option<&Manifest>, id: ObjectId) -> FeedPosition {
    FeedPosition {
        offset: restored
            .and_then(|m| m.offsets.get(&id).copied())
            .unwrap_or(0),
        watermark: restored.and_then(|m| m.watermarks.get(&id).copied()),
        splits: restored
            .and_then(|m| m.splits.get(&id))
            .map(|s| Arc::new(s.clone())),
    }
}

/// What becomes of an object of the restored checkpoint's catalog.
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    /// Its state is restored as it was.
    Usable,
    /// A table that had failed: its state ends at the offset recorded for it, and its log is
    /// replayed from there.
    Resumed,
    /// Its state stopped short of the checkpoint's epoch (a view whose actors had failed, or
    /// a failed table of a format that recorded the barrier's offset): it goes, and the
    /// object is built again as a new one.
    Rebuilt,
    /// Dropped since: its state goes.
    Dropped,
}

/// The fate of `o`, given the objects of the catalog now (`live`), the actors that had
/// failed when the checkpoint was taken, and whether its format records a failed table's
/// offset where its state ends (`tables_resume`).
fn fate(o: &Object, live: &HashSet<ObjectId>, failed: &HashSet<u32>, tables_resume: bool) -> Fate {
    if !live.contains(&o.id()) {
        return Fate::Dropped;
    }
    match o {
        // A connector table's position where its state ends is not known: it reads again.
        Object::Table(t) if failed.contains(&t.id) && t.connector.is_some() => Fate::Rebuilt,
        Object::Table(t) if failed.contains(&t.id) && tables_resume => Fate::Resumed,
        Object::Table(t) if failed.contains(&t.id) => Fate::Rebuilt,
        Object::Table(_) => Fate::Usable,
        // A source keeps no state: its offset at the barrier is right even if its actor had
        // failed, and its views were restored with that offset.
        Object::Source(_) => Fate::Usable,
        Object::View(v)
            if std::iter::once(&v.id)
                .chain(&v.workers)
                .any(|a| failed.contains(a)) =>
        {
            Fate::Rebuilt
        }
        Object::View(_) => Fate::Usable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{TableDef, ViewDef};

    fn table(id: ObjectId) -> Object {
        Object::Table(TableDef {
            id,
            name: format!("t{id}"),
            columns: vec![],
            primary_key: vec![],
            watermark: None,
            key_first: true,
            connector: None,
            reads: None,
            create_sql: None,
        })
    }

    fn view(id: ObjectId, workers: &[ObjectId]) -> Object {
        Object::View(ViewDef {
            id,
            name: format!("v{id}"),
            query: "SELECT 1".into(),
            depends_on: vec![],
            state_tables: vec![],
            emit_on_window_close: false,
            workers: workers.to_vec(),
            parallelism: 1 + workers.len(),
            sink: false,
            sink_to: None,
            key: None,
            int4_literals: true,
            plan: None,
        })
    }

    #[test]
    fn restored_objects_keep_their_state_unless_dropped_or_cut_short() {
        let live: HashSet<ObjectId> = [1000, 1001, 1002, 1003].into();
        let none = HashSet::new();
        for resume in [true, false] {
            assert_eq!(fate(&table(1000), &live, &none, resume), Fate::Usable);
            assert_eq!(
                fate(&view(1001, &[1005]), &live, &none, resume),
                Fate::Usable
            );
            assert_eq!(fate(&table(1009), &live, &none, resume), Fate::Dropped);
            // Dropped wins over failed: nothing is rebuilt of an object that is gone.
            assert_eq!(
                fate(&view(1009, &[]), &live, &[1009].into(), resume),
                Fate::Dropped
            );
        }
        // A view is rebuilt when its own actor or any worker had failed.
        assert_eq!(
            fate(&view(1001, &[1005]), &live, &[1001].into(), true),
            Fate::Rebuilt
        );
        assert_eq!(
            fate(&view(1001, &[1005]), &live, &[1005].into(), true),
            Fate::Rebuilt
        );
        // A failed table resumes from its offset where the format records it there.
        assert_eq!(
            fate(&table(1000), &live, &[1000].into(), true),
            Fate::Resumed
        );
        assert_eq!(
            fate(&table(1000), &live, &[1000].into(), false),
            Fate::Rebuilt
        );
    }
}
