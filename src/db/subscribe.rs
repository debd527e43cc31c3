//! `SUBSCRIBE TO relation`: the relation's rows at one sealed epoch, then its changes, each
//! epoch's together once it is sealed, as rows of the relation's columns with `weir_op`
//! (`insert`, `delete`, `update_delete`, `update_insert`, or `progress` for an epoch without
//! changes, where asked) and `weir_epoch`. The subscription is added to the relation's actor
//! at a barrier (`stream::subscribe`); the rows it starts with are read from the first sealed
//! snapshot at or after that barrier, and the changes of epochs that snapshot holds are
//! passed over. With `since = e` (the epoch of a retained checkpoint), it starts instead with
//! how that snapshot differs from the checkpoint's rows: the rows gone since as deletes, then
//! the rows come since as inserts.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::{Database, Output, RowStream};
use crate::catalog::{Catalog, Object, Scope};
use crate::checkpoint::Retained;
use crate::error::{Error, ErrorKind, Result};
use crate::sql::Subscribe;
use crate::state::Snapshot;
use crate::stream::relation::{read_excess_part, read_snapshot_part};
use crate::stream::{Change, RowCodec, Subscription};

/// Rows of the starting snapshot read at a time.
const SNAPSHOT_ROWS: usize = 4096;

/// A subscription's options.
#[derive(Debug, Clone, Copy)]
struct Options {
    /// Start with the relation's rows.
    snapshot: bool,
    /// A row for each epoch without changes.
    progress: bool,
    /// Start from the rows of the retained checkpoint of this epoch.
    since: Option<u64>,
}

fn flag(key: &str, value: &str) -> Result<bool> {
    match value.to_lowercase().as_str() {
        "true" | "on" => Ok(true),
        "false" | "off" => Ok(false),
        _ => Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("{key} must be true or false, not \"{value}\""),
        )),
    }
}

fn options(pairs: &[(String, String)]) -> Result<Options> {
    let mut options = Options {
        snapshot: true,
        progress: false,
        since: None,
    };
    let invalid = |message: String| Error::new(ErrorKind::InvalidParameter, message);
    for (key, value) in pairs {
        match key.as_str() {
            "snapshot" => options.snapshot = flag(key, value)?,
            "progress" => options.progress = flag(key, value)?,
            "since" => {
                let epoch = value.trim().parse::<u64>().map_err(|_| {
                    invalid(format!(
                        "since must be an epoch (an integer), not \"{value}\""
                    ))
                })?;
                options.since = Some(epoch);
            }
            other => return Err(invalid(format!("unknown SUBSCRIBE option \"{other}\""))),
        }
    }
    if options.since.is_some() && !options.snapshot {
        return Err(invalid(
            "since and snapshot = false cannot be combined: since starts with the changes \
             from the checkpoint's rows to the current ones"
                .into(),
        ));
    }
    Ok(options)
}

/// A subscribed relation: its id, schema, storage order and key.
type Subscribed = (
    crate::catalog::ObjectId,
    SchemaRef,
    Vec<usize>,
    Option<Vec<usize>>,
);

/// A subscription's columns: the relation's (nullable: a progress row has none), `weir_op`
/// and `weir_epoch`.
fn output_schema(schema: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Field> = (schema.fields().iter())
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.push(Field::new("weir_op", DataType::Utf8, false));
    fields.push(Field::new("weir_epoch", DataType::Int64, false));
    Arc::new(Schema::new(fields))
}

/// What a subscription reads, and where it is.
struct Reader {
    barriers: crate::stream::BarrierClient,
    relation: crate::catalog::ObjectId,
    schema: SchemaRef,
    out: SchemaRef,
    codec: Arc<RowCodec>,
    key: Option<Vec<usize>>,
    options: Options,
    subscription: Subscription,
    /// The checkpoint's rows to start from (`since`), until the start.
    since: Option<Retained>,
    phase: Phase,
}

enum Phase {
    /// Added at the barrier of this epoch; the starting snapshot is not taken yet.
    Start(u64),
    /// The starting snapshot, read after this key.
    Snapshot(Arc<Snapshot>, Option<Vec<u8>>),
    /// How the starting snapshot differs from a checkpoint's rows.
    Since(Box<Since>),
    /// Changes after the snapshot's epoch.
    Changes(u64),
}

/// A start `since` a checkpoint: the checkpoint's rows the starting snapshot lacks (deletes),
/// then the snapshot's rows the checkpoint lacks (inserts), read after the key `after`.
struct Since {
    past: Retained,
    now: Arc<Snapshot>,
    change: Change,
    after: Option<Vec<u8>>,
}

/// What the next read of a start `since` a checkpoint gave.
enum Part {
    Rows(RecordBatch, Change),
    /// Rows read, none of them changed.
    Unchanged,
    /// Past the last row of both reads.
    Done,
}

impl Since {
    /// Reads the next rows that differ.
    async fn next(
        &mut self,
        relation: crate::catalog::ObjectId,
        schema: &SchemaRef,
        codec: Arc<RowCodec>,
    ) -> Result<Part> {
        let (past, now) = (self.past.snapshot()?.clone(), self.now.clone());
        let (from, against) = match self.change {
            Change::Delete => (past, now),
            _ => (now, past),
        };
        let (schema, after) = (schema.clone(), self.after.take());
        let part = tokio::task::spawn_blocking(move || {
            read_excess_part(
                (&from, &against),
                relation,
                &schema,
                &codec,
                after.as_deref(),
                SNAPSHOT_ROWS,
            )
        })
        .await
        .map_err(|e| Error::internal(format!("reading a checkpoint: {e}")))??;
        Ok(match part {
            Some((batch, last)) => {
                self.after = Some(last);
                match batch.num_rows() {
                    0 => Part::Unchanged,
                    _ => Part::Rows(batch, self.change),
                }
            }
            None if self.change == Change::Delete => {
                self.change = Change::Insert;
                Part::Unchanged
            }
            None => Part::Done,
        })
    }
}

impl Database {
    /// Starts a subscription to the table or view `sub.name`: the rows' schema (the
    /// relation's columns, `weir_op`, `weir_epoch`) and the rows, which never end unless the
    /// relation is dropped or the client falls too far behind.
    pub async fn subscribe(
        &self,
        sub: &Subscribe,
        settings: &crate::sql::Settings,
        scope: Scope,
    ) -> Result<Output> {
        let options = options(&sub.options)?;
        let (relation, schema, order, key) = self.subscribed(sub, scope)?;
        let role = self.acting_for(settings)?;
        let object = self.catalog().by_id(relation).cloned();
        if let Some(object) = object {
            self.check_object(&role, &object, crate::catalog::Privilege::Select)?;
        }
        if let Some(e) = (self.barriers.failed.lock())
            .unwrap_or_else(|p| p.into_inner())
            .get(&relation)
        {
            return Err(e.clone());
        }
        let since = match options.since {
            Some(epoch) => Some(self.retained_rows(relation, &sub.name, epoch).await?),
            None => None,
        };
        let (mutation, subscription) = crate::stream::subscribe(
            relation,
            &sub.name,
            self.config.channel_messages_max,
            self.config.subscription_bytes_max,
        );
        let added = self.barriers.inject(Some(mutation), vec![], vec![]).await?;
        let out = output_schema(&schema);
        let reader = Reader {
            barriers: self.barriers.clone(),
            relation,
            codec: Arc::new(RowCodec::ordered(&schema, &order)?),
            schema,
            out: out.clone(),
            key,
            options,
            subscription,
            since,
            phase: Phase::Start(added),
        };
        let rows: RowStream = Box::pin(futures::stream::try_unfold(reader, |mut r| async move {
            Ok(r.next().await?.map(|b| (b, r)))
        }));
        Ok(Output::Stream { schema: out, rows })
    }

    /// The retained checkpoint of `epoch`, open to read `relation`'s rows (`since`).
    async fn retained_rows(
        &self,
        relation: crate::catalog::ObjectId,
        name: &str,
        epoch: u64,
    ) -> Result<Retained> {
        let past = self.checkpoints()?.retained(epoch).await?;
        let m = &past.manifest;
        if !Catalog::objects_in(&m.catalog)?
            .iter()
            .any(|o| o.id() == relation)
        {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("relation \"{name}\" did not exist yet at epoch {epoch}"),
            ));
        }
        if m.failed_actors.contains(&relation) {
            return Err(Error::new(
                ErrorKind::ObjectNotInPrerequisiteState,
                format!(
                    "relation \"{name}\" had failed at epoch {epoch}: the checkpoint does not \
                     hold its rows"
                ),
            ));
        }
        Ok(past)
    }

    /// The columns of `SUBSCRIBE TO sub.name`'s rows.
    pub fn subscribe_schema(&self, sub: &Subscribe, scope: Scope) -> Result<SchemaRef> {
        Ok(output_schema(&self.subscribed(sub, scope)?.1))
    }

    /// The relation `sub` names: its id, schema, the order its rows store their columns in,
    /// and its key.
    fn subscribed(&self, sub: &Subscribe, scope: Scope) -> Result<Subscribed> {
        let catalog = self.catalog();
        let object = catalog.get(&sub.name, scope).ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedTable,
                format!("relation \"{}\" does not exist", sub.name),
            )
        })?;
        let id = object.id();
        let schema = catalog
            .schema(id)
            .ok_or_else(|| Error::internal("a relation without a schema"))?;
        Ok(match object {
            Object::Table(t) => (id, schema, t.storage_order(), Some(t.primary_key.clone())),
            Object::View(v) if !v.sink => (id, schema, Vec::new(), v.key.clone()),
            Object::View(_) => {
                return Err(Error::new(
                    ErrorKind::WrongObjectType,
                    format!(
                        "\"{}\" is a sink: it keeps no rows to subscribe to",
                        sub.name
                    ),
                ))
            }
            Object::Source(_) => {
                return Err(Error::not_supported(format!(
                    "source \"{}\" is a stream and keeps no rows to subscribe to",
                    sub.name
                ))
                .with_hint("Create a materialized view over it, and subscribe to the view."))
            }
        })
    }
}

impl Reader {
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            match &mut self.phase {
                Phase::Start(added) => {
                    self.barriers.wait_sealed(*added).await?;
                    let snapshot = self.barriers.sealed_snapshot();
                    self.phase = if let Some(past) = self.since.take() {
                        Phase::Since(Box::new(Since {
                            past,
                            now: snapshot,
                            change: Change::Delete,
                            after: None,
                        }))
                    } else if self.options.snapshot {
                        Phase::Snapshot(snapshot, None)
                    } else {
                        Phase::Changes(snapshot.epoch)
                    };
                }
                Phase::Snapshot(snapshot, after) => {
                    let (snap, from) = (snapshot.clone(), after.take());
                    let (relation, schema) = (self.relation, self.schema.clone());
                    let codec = self.codec.clone();
                    let part = tokio::task::spawn_blocking(move || {
                        read_snapshot_part(
                            &snap,
                            relation,
                            &schema,
                            &codec,
                            (&[], from.as_deref()),
                            SNAPSHOT_ROWS,
                            None,
                        )
                    })
                    .await
                    .map_err(|e| Error::internal(format!("reading a snapshot: {e}")))??;
                    let epoch = snapshot.epoch;
                    match part {
                        Some((batch, last)) => {
                            *after = Some(last);
                            let inserts = vec![Change::Insert; batch.num_rows()];
                            return self.rows(&batch, &inserts, epoch).map(Some);
                        }
                        None => self.phase = Phase::Changes(epoch),
                    }
                }
                Phase::Since(since) => {
                    let epoch = since.now.epoch;
                    let codec = self.codec.clone();
                    match since.next(self.relation, &self.schema, codec).await? {
                        Part::Rows(batch, change) => {
                            let changes = vec![change; batch.num_rows()];
                            return self.rows(&batch, &changes, epoch).map(Some);
                        }
                        Part::Unchanged => {}
                        Part::Done => self.phase = Phase::Changes(epoch),
                    }
                }
                Phase::Changes(seen) => {
                    let seen = *seen;
                    let (epoch, chunks) = self.subscription.next().await?;
                    if epoch <= seen {
                        continue;
                    }
                    self.barriers.wait_sealed(epoch).await?;
                    match crate::stream::net_epoch(&self.schema, &chunks, self.key.as_deref())? {
                        Some((batch, changes)) => {
                            return self.rows(&batch, &changes, epoch).map(Some)
                        }
                        None if self.options.progress => return self.progress(epoch).map(Some),
                        None => {}
                    }
                }
            }
        }
    }

    /// `batch`'s rows with their changes and epoch.
    fn rows(&self, batch: &RecordBatch, changes: &[Change], epoch: u64) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns.push(Arc::new(StringArray::from_iter_values(
            changes.iter().map(|c| c.name()),
        )));
        columns.push(Arc::new(Int64Array::from_value(
            epoch as i64,
            batch.num_rows(),
        )));
        Ok(RecordBatch::try_new(self.out.clone(), columns)?)
    }

    /// The row that says `epoch` passed without changes: NULL columns, `progress`.
    fn progress(&self, epoch: u64) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = self
            .schema
            .fields()
            .iter()
            .map(|f| datafusion::arrow::array::new_null_array(f.data_type(), 1))
            .collect();
        columns.push(Arc::new(StringArray::from(vec!["progress"])));
        columns.push(Arc::new(Int64Array::from(vec![epoch as i64])));
        Ok(RecordBatch::try_new(self.out.clone(), columns)?)
    }
}
