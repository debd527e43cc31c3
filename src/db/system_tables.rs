//! The `weir_catalog` system tables and the `SHOW` statements' rows: each a list of columns
//! and rows of cells, turned into one Arrow batch by [`Rows`].

use std::sync::atomic::Ordering;

use datafusion::arrow::array::RecordBatch;

use super::{Database, Output};
use crate::catalog::{Kind, Object, Scope, TableDef};
use crate::checkpoint::restore::Recovery;
use crate::checkpoint::{Record, RetainedFiles};
use crate::connector::source::Handle as SourceHandle;
use crate::error::{Error, ErrorKind, Result};
use crate::sql::rows::{Cell, Rows, Type};

/// A mutex's value, also after a panic elsewhere while it was held.
fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One batch as a statement's rows.
fn rows_of(batch: RecordBatch) -> Output {
    Output::Rows {
        schema: batch.schema(),
        batches: vec![batch],
    }
}

/// The rows of `SHOW CHECKPOINTS` and `weir_catalog.checkpoints`.
fn checkpoints(records: &[Record]) -> Result<RecordBatch> {
    use Type::*;
    let mut rows = Rows::new(&[
        ("id", Int),
        ("epoch?", Int),
        ("kind?", Text),
        ("mode?", Text),
        ("status", Text),
        ("started_at", Time),
        ("duration_ms", Int),
        ("align_ms", Int),
        ("snapshot_ms", Int),
        ("upload_ms", Int),
        ("files_uploaded", Int),
        ("files_reused", Int),
        ("bytes_uploaded", Int),
        ("bytes_referenced", Int),
    ]);
    for r in records {
        rows.push(vec![
            r.id.into(),
            r.epoch.into(),
            r.kind.map(|k| k.as_str()).into(),
            r.mode.map(|m| m.as_str()).into(),
            r.status.to_string().into(),
            Cell::Time(r.started_at_ms),
            r.duration_ms.into(),
            r.timings.align_ms.into(),
            r.timings.snapshot_ms.into(),
            r.timings.upload_ms.into(),
            r.files_uploaded.into(),
            r.files_reused.into(),
            r.bytes_uploaded.into(),
            r.bytes_referenced.into(),
        ]);
    }
    rows.batch()
}

/// The rows of `weir_catalog.recoveries`: the starts recorded in the data directory, newest
/// first.
fn recoveries(recoveries: &[Recovery]) -> Result<RecordBatch> {
    use Type::*;
    let mut rows = Rows::new(&[
        ("started_at", Time),
        ("checkpoint_id?", Int),
        ("epoch?", Int),
        ("damaged?", Text),
        ("from_store_alone", Bool),
        ("files_reused", Int),
        ("files_downloaded", Int),
        ("bytes_downloaded", Int),
        ("records_replayed", Int),
        ("restore_ms", Int),
        ("replay_ms", Int),
        ("total_ms", Int),
    ]);
    for r in recoveries.iter().rev() {
        let damaged: Vec<String> = r
            .damaged
            .iter()
            .map(|d| format!("{}: {}", d.manifest, d.reason))
            .collect();
        rows.push(vec![
            Cell::Time(r.started_at_ms),
            r.checkpoint_id.into(),
            r.epoch.into(),
            (!damaged.is_empty()).then(|| damaged.join("; ")).into(),
            r.from_store_alone.into(),
            r.files_reused.into(),
            r.files_downloaded.into(),
            r.bytes_downloaded.into(),
            r.records_replayed.into(),
            r.restore_ms.into(),
            r.replay_ms.into(),
            r.total_ms.into(),
        ]);
    }
    rows.batch()
}

/// The rows of `weir_catalog.checkpoint_files`: every object a retained checkpoint names.
fn checkpoint_files(files: &RetainedFiles) -> Result<RecordBatch> {
    use Type::*;
    let mut rows = Rows::new(&[
        ("object_name", Text),
        ("size_bytes", Int),
        ("ref_count", Int),
        ("checkpoint_ids", Text),
    ]);
    for (name, (size, by)) in files {
        let ids: Vec<String> = by.iter().map(u64::to_string).collect();
        rows.push(vec![
            name.as_str().into(),
            (*size).into(),
            (by.len() as u64).into(),
            format!("{{{}}}", ids.join(",")).into(),
        ]);
    }
    rows.batch()
}

/// One text column per name, one row per list: what the `SHOW` statements that list names
/// return.
pub fn text_rows(columns: &[&'static str], values: Vec<Vec<String>>) -> Result<Output> {
    let types: Vec<(&'static str, Type)> = columns.iter().map(|c| (*c, Type::Text)).collect();
    let mut rows = Rows::new(&types);
    for row in values {
        rows.push(row.into_iter().map(Cell::from).collect());
    }
    rows.batch().map(rows_of)
}

/// Whose rows of the system tables a statement sees: the objects `scope` sees, and of those
/// the ones `role` may read (SELECT on a relation, ownership of a sink), since their rows show
/// what they hold (a source's skipped payloads, a view's errors); every one for a superuser or
/// the server itself.
#[derive(Clone, Copy)]
pub(super) struct Seen<'a> {
    pub scope: Scope,
    pub role: Option<&'a crate::catalog::RoleDef>,
    /// The reader's session, through which the server's sessions are seen (none for the
    /// server's own reads).
    pub backend: Option<&'a crate::sql::Backend>,
}

impl Seen<'_> {
    fn objects(self, catalog: &crate::catalog::Catalog) -> Vec<&Object> {
        let shown = |o: &&Object| match (self.role, o) {
            (None, _) => true,
            (Some(r), Object::View(v)) if v.sink => catalog.owns(r, o.id()),
            (Some(r), _) => catalog.holds(r, o.id(), crate::catalog::Privilege::Select),
        };
        catalog.visible_objects(self.scope).filter(shown).collect()
    }
}

impl Database {
    /// The `weir_catalog` system tables, as of now, as `seen` may see them.
    pub(super) fn system_tables(&self, seen: Seen) -> Result<Vec<(&'static str, RecordBatch)>> {
        let Some(checkpoints) = self.checkpoints.get() else {
            return Ok(Vec::new());
        };
        let recoveries = recoveries(&self.recoveries.lock().unwrap_or_else(|p| p.into_inner()))?;
        Ok(vec![
            ("checkpoints", self::checkpoints(&checkpoints.records())?),
            ("checkpoint_files", checkpoint_files(&checkpoints.files())?),
            ("recoveries", recoveries),
            ("sources", self.sources_batch(seen)?),
            ("source_errors", self.source_errors_batch(seen)?),
            ("source_splits", self.source_splits_batch(seen)?),
            ("sinks", self.sinks_batch(seen)?),
            ("views", self.views_batch(seen)?),
            ("backfills", self.backfills_batch()?),
            ("secrets", self.secrets_batch()?),
            ("sessions", self.sessions_batch(seen)?),
        ])
    }

    /// `weir_catalog.sessions`: each session of the server, and what its statements use: the
    /// working memory they hold in the query pool now and the most they held at once, and the
    /// CPU time of the threads their plans ran on. As in `pg_stat_activity`, a session of a
    /// role whose privileges the reader lacks shows who it is, not what it does.
    fn sessions_batch(&self, seen: Seen) -> Result<RecordBatch> {
        use Type::*;
        let mut rows = Rows::new(&[
            ("pid", Int),
            ("usename", Text),
            ("state?", Text),
            ("memory_bytes?", Int),
            ("memory_peak_bytes?", Int),
            ("cpu_ms?", Int),
        ]);
        let catalog = self.catalog();
        let privileged = seen.role.map(|r| (r.superuser, catalog.privileged_as(r)));
        for s in seen.backend.map(|b| b.sessions()).unwrap_or_default() {
            let shown = privileged.as_ref().is_none_or(|(superuser, of)| {
                *superuser
                    || catalog
                        .role(&s.start.user)
                        .is_some_and(|r| of.contains(&r.oid))
            });
            let usage = &s.usage;
            let cpu_ms = u64::try_from(usage.cpu().as_millis()).unwrap_or(u64::MAX);
            let bytes = |b: usize| shown.then_some(b as u64);
            rows.push(vec![
                i64::from(s.start.pid).into(),
                s.start.user.as_str().into(),
                Cell::Text(shown.then(|| s.activity().state.name().to_string())),
                bytes(usage.memory()).into(),
                bytes(usage.memory_peak()).into(),
                shown.then_some(cpu_ms).into(),
            ]);
        }
        rows.batch()
    }

    /// `weir_catalog.secrets`: each secret's name, owner and backend, for everyone to see (as
    /// pg_catalog shows relations' names); never a value.
    fn secrets_batch(&self) -> Result<RecordBatch> {
        use Type::*;
        let mut rows = Rows::new(&[("name", Text), ("owner", Text), ("backend", Text)]);
        let catalog = self.catalog();
        for s in catalog.secrets() {
            let owner = catalog.role_by_oid(s.owner).map(|r| r.name.clone());
            rows.push(vec![
                s.name.as_str().into(),
                owner.unwrap_or_else(|| s.owner.to_string()).into(),
                s.backend.as_str().into(),
            ]);
        }
        rows.batch()
    }

    /// `weir_catalog.backfills`: each view and sink being created, while its inputs send it
    /// their rows: how many inputs have sent them all, the rows sent, and the rows they send
    /// in all (NULL until every input has counted its own).
    fn backfills_batch(&self) -> Result<RecordBatch> {
        use Type::*;
        let mut rows = Rows::new(&[
            ("name", Text),
            ("kind", Text),
            ("started", Time),
            ("inputs", Int),
            ("inputs_done", Int),
            ("rows_done", Int),
            ("rows_total?", Int),
        ]);
        let filling = self.filling.lock().unwrap_or_else(|p| p.into_inner());
        for f in filling.values() {
            let p = f.parts.progress();
            rows.push(vec![
                f.name.as_str().into(),
                (if f.sink { "sink" } else { "materialized view" }).into(),
                Cell::Time(f.started_us / 1000),
                (p.inputs as u64).into(),
                (p.inputs_done as u64).into(),
                p.rows_sent.into(),
                p.rows_total.into(),
            ]);
        }
        rows.batch()
    }

    /// `SHOW CHECKPOINTS`: the rows of `weir_catalog.checkpoints`.
    pub fn show_checkpoints(&self) -> Result<Output> {
        checkpoints(&self.checkpoint_records()?).map(rows_of)
    }

    /// `weir_catalog.sources`: each source's connector, rows fed, whether it has ended, why it
    /// stopped early, whether something reads it (it produces only then), what it waits out
    /// (a broker down), how many inputs it skipped, and how far it trails its upstream: the
    /// sum of its splits' lags, where known (`source_splits`).
    fn sources_batch(&self, seen: Seen) -> Result<RecordBatch> {
        use Type::*;
        let mut rows = Rows::new(&[
            ("name", Text),
            ("connector", Text),
            ("rows", Int),
            ("done", Bool),
            ("error?", Text),
            ("read", Bool),
            ("waiting?", Text),
            ("skipped", Int),
            ("lag?", Int),
        ]);
        self.each_source(seen, |name, connector, h| {
            let p = &h.progress;
            let lag = locked(&p.splits)
                .iter()
                .filter_map(|s| s.lag)
                .reduce(i64::saturating_add);
            rows.push(vec![
                name.into(),
                connector.into(),
                p.offset.load(Ordering::Acquire).into(),
                p.done.load(Ordering::Acquire).into(),
                locked(&p.error).clone().into(),
                h.running().into(),
                locked(&p.waiting).clone().into(),
                p.skipped.load(Ordering::Acquire).into(),
                Cell::Int(lag),
            ]);
        });
        rows.batch()
    }

    /// `weir_catalog.source_errors`: the last inputs each source skipped because they did not
    /// decode into a row (`source::SOURCE_ERRORS_MAX` per source), oldest first.
    fn source_errors_batch(&self, seen: Seen) -> Result<RecordBatch> {
        use Type::*;
        let mut rows = Rows::new(&[
            ("source", Text),
            ("at", Time),
            ("split", Text),
            ("position", Text),
            ("payload", Text),
            ("error", Text),
        ]);
        self.each_source(seen, |name, _, h| {
            for e in locked(&h.progress.errors).iter() {
                rows.push(vec![
                    name.into(),
                    Cell::Time(e.at_ms),
                    e.split.clone().into(),
                    e.position.clone().into(),
                    e.payload.clone().into(),
                    e.error.clone().into(),
                ]);
            }
        });
        rows.batch()
    }

    /// `weir_catalog.source_splits`: each split of each source (a Kafka partition), where the
    /// source is in it, the upstream's end there and the lag between the two.
    fn source_splits_batch(&self, seen: Seen) -> Result<RecordBatch> {
        use Type::*;
        let mut rows = Rows::new(&[
            ("source", Text),
            ("split", Text),
            ("position", Text),
            ("end?", Int),
            ("lag?", Int),
        ]);
        self.each_source(seen, |name, _, h| {
            for s in locked(&h.progress.splits).iter() {
                let position = match &s.position {
                    serde_json::Value::String(t) => t.clone(),
                    other => other.to_string(),
                };
                rows.push(vec![
                    name.into(),
                    s.split.clone().into(),
                    position.into(),
                    Cell::Int(s.end),
                    Cell::Int(s.lag),
                ]);
            }
        });
        rows.batch()
    }

    /// Calls `f` with each visible source's (and connector table's) name, connector and
    /// running task.
    fn each_source(&self, seen: Seen, mut f: impl FnMut(&str, &str, &SourceHandle)) {
        let catalog = self.catalog();
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        for o in seen.objects(&catalog) {
            let connector = match o {
                Object::Source(def) => &def.connector,
                Object::Table(TableDef {
                    connector: Some(c), ..
                }) => c,
                _ => continue,
            };
            if let Some(h) = sources.get(&o.id()) {
                f(o.name(), &connector.name, h);
            }
        }
    }

    /// `weir_catalog.sinks`: each sink's connector, the changes its view emitted into it and
    /// those its target took since the server started, the epoch of the last checkpoint the
    /// target holds and how many epochs it lags the dataflow, the bytes of its log not yet
    /// delivered, and the failed deliveries in a row with the last one's error.
    fn sinks_batch(&self, seen: Seen) -> Result<RecordBatch> {
        use Type::*;
        let mut rows = Rows::new(&[
            ("name", Text),
            ("connector", Text),
            ("inserts", Int),
            ("deletes", Int),
            ("sent", Int),
            ("delivered_epoch", Int),
            ("lag_epochs", Int),
            ("log_bytes", Int),
            ("retries", Int),
            ("last_error?", Text),
        ]);
        let catalog = self.catalog();
        let sinks = self.sinks.lock().unwrap_or_else(|p| p.into_inner());
        let sealed = self.actors.store.sealed_epoch();
        for o in seen.objects(&catalog) {
            let (Some(c), Object::View(v)) = (sinks.get(&o.id()), o) else {
                continue;
            };
            let connector = v.sink_to.as_ref().map_or("blackhole", |c| c.name.as_str());
            let delivers = connector != "blackhole";
            let delivered = c.delivered.load(Ordering::Relaxed);
            rows.push(vec![
                o.name().into(),
                connector.into(),
                c.inserts.load(Ordering::Relaxed).into(),
                c.deletes.load(Ordering::Relaxed).into(),
                c.sent.load(Ordering::Relaxed).into(),
                delivered.into(),
                match delivers {
                    true => sealed.saturating_sub(delivered).into(),
                    false => 0u64.into(),
                },
                c.log_bytes.load(Ordering::Relaxed).into(),
                c.retries.load(Ordering::Relaxed).into(),
                c.error().into(),
            ]);
        }
        rows.batch()
    }

    /// `weir_catalog.views`: each view's status (`running`; `degraded` while some of its rows
    /// hold an error: `row_errors` of them, the last `last_error`; or why its actors failed)
    /// and parallelism, by name.
    fn views_batch(&self, seen: Seen) -> Result<RecordBatch> {
        use Type::*;
        let mut rows = Rows::new(&[
            ("name", Text),
            ("status", Text),
            ("parallelism", Int),
            ("row_errors", Int),
            ("last_error?", Text),
        ]);
        let catalog = self.catalog();
        let failed = self
            .barriers
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let errors = self.view_errors.lock().unwrap_or_else(|p| p.into_inner());
        let mut views: Vec<_> = (seen.objects(&catalog).into_iter())
            .filter_map(|o| match o {
                Object::View(v) if !v.sink => Some(v),
                _ => None,
            })
            .collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        for v in views {
            let sink = errors.get(&v.id);
            let outstanding = sink.map_or(0, |s| s.errors.outstanding());
            let failure = std::iter::once(&v.id)
                .chain(&v.workers)
                .find_map(|id| failed.get(id));
            let status = match failure {
                Some(e) => format!("failed: {e}"),
                None if outstanding != 0 => "degraded".to_string(),
                None => "running".to_string(),
            };
            rows.push(vec![
                v.name.as_str().into(),
                status.into(),
                (v.parallelism() as u64).into(),
                outstanding.into(),
                sink.and_then(|s| s.errors.last()).into(),
            ]);
        }
        rows.batch()
    }

    /// SHOW MATERIALIZED VIEWS: the rows of `weir_catalog.views` that the session's role may
    /// see.
    pub fn show_views(&self, settings: &crate::sql::Settings, scope: Scope) -> Result<Output> {
        let role = self.acting_for(settings)?;
        self.views_batch(Seen {
            scope,
            role: role.as_ref(),
            backend: None,
        })
        .map(rows_of)
    }

    /// SHOW TABLES, SHOW SOURCES, SHOW SINKS: the names of the objects of `kind`.
    pub fn show_names(&self, kind: Kind, scope: Scope) -> Result<Output> {
        let mut names: Vec<String> = self
            .catalog()
            .visible_objects(scope)
            .filter(|o| o.kind() == kind)
            .map(|o| o.name().to_string())
            .collect();
        names.sort();
        text_rows(&["name"], names.into_iter().map(|n| vec![n]).collect())
    }

    /// SHOW CREATE TABLE, SOURCE, MATERIALIZED VIEW and SINK (`kind`): the object's name and
    /// its statement, with the secrets in its options redacted.
    pub fn show_create(&self, name: &str, kind: Kind, scope: Scope) -> Result<Output> {
        let catalog = self.catalog();
        let written = |text: Option<String>| {
            text.as_deref().map(crate::sql::redacted).ok_or_else(|| {
                Error::not_supported(format!(
                    "{} \"{name}\" was created before Weir kept the statements that create \
                     sources and tables fed by connectors",
                    kind.name()
                ))
            })
        };
        let shown = match catalog.get(name, scope) {
            Some(o) if o.kind() != kind => None,
            Some(Object::View(v)) => Some((v.name.clone(), crate::sql::redacted(&v.create_sql()))),
            Some(Object::Table(t)) => Some((t.name.clone(), written(t.create_statement())?)),
            Some(Object::Source(s)) => Some((s.name.clone(), written(s.create_sql.clone())?)),
            None => {
                return Err(Error::new(
                    ErrorKind::UndefinedTable,
                    format!("{} \"{name}\" does not exist", kind.name()),
                ))
            }
        };
        match shown {
            Some((name, sql)) => text_rows(&["name", "create_sql"], vec![vec![name, sql]]),
            None => Err(Error::new(
                ErrorKind::WrongObjectType,
                format!("\"{name}\" is not a {}", kind.name()),
            )),
        }
    }
}
