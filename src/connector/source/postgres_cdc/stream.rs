//! A CDC source's task: reads the replication slot from the least position of its tables,
//! buffers each upstream transaction and feeds it at its commit into every attached table at
//! once (`Feed::send_rows_together`, every table's position the transaction's end), reads the
//! tables' snapshots a chunk at a time between watermarks (`snapshot`), and tells the slot
//! how far the durable checkpoints hold the stream. A lost connection or an upstream that
//! restarts is waited out and the stream read again from the last position fed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use tokio_postgres::Client;

use super::config::Config;
use super::pgoutput::{self, Logical, Lsn, Replication};
use super::protocol::Connection;
use super::snapshot::Chunk;
use super::tables::{Row, Table};
use super::upstream;
use crate::catalog::{ObjectId, SourceDef};
use crate::connector::source::{Options, SharedContext, SplitProgress};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Feed, Op, Splits, StreamChunk};

/// How long the task waits after a failed connection, doubling from the least to the most.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// How often the task tells the upstream where it is (PostgreSQL ends a replication connection
/// that says nothing for `wal_sender_timeout`, 60 s by default).
const STATUS_INTERVAL: Duration = Duration::from_secs(5);

/// A transaction's changes held before its commit, at most this many bytes; past it they go
/// to the tables before the commit (keyed tables take a change twice without harm, but a
/// barrier may then fall inside the transaction).
const TRANSACTION_BYTES_MAX: usize = 64 << 20;

/// How many durable checkpoints back the slot is confirmed: a restore that falls back to an
/// older retained checkpoint still finds its WAL.
const DURABLE_KEPT: usize = 8;

pub async fn run(source: SourceDef, context: SharedContext) {
    let read = (source.connector.check_secrets())
        .and_then(|()| Config::read(&mut Options::kept(&source.connector.options)));
    let config = match read {
        Ok(c) => c,
        Err(e) => return context.progress.stopped(&source.name, &e),
    };
    let mut task = Task {
        source,
        config,
        context,
        tables: BTreeMap::new(),
        relations: HashMap::new(),
        transaction: Vec::new(),
        bytes: 0,
        chunk: None,
        chunks: 0,
        durable: VecDeque::new(),
    };
    task.run().await;
}

pub(super) struct Task {
    pub(super) source: SourceDef,
    pub(super) config: Config,
    context: SharedContext,
    pub(super) tables: BTreeMap<ObjectId, Table>,
    /// The stream's relation OIDs, as its Relation messages named them, by table.
    relations: HashMap<u32, ObjectId>,
    /// The open transaction's changes, in order.
    transaction: Vec<(ObjectId, Op, Row)>,
    bytes: usize,
    /// The snapshot chunk between its watermarks, if any.
    pub(super) chunk: Option<Chunk>,
    pub(super) chunks: u64,
    /// The least position of the source's tables in each of the last durable checkpoints.
    durable: VecDeque<Lsn>,
}

/// Why a stream stopped without an error.
enum Stop {
    /// The source was dropped.
    Dropped,
    /// It has no table to feed.
    Paused,
}

/// What woke the stream up.
enum Woken {
    Data(Result<Option<bytes::Bytes>>),
    Attach(Option<crate::connector::source::Attach>),
    Durable,
    Status,
    Running(bool),
}

impl Task {
    async fn run(&mut self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.wait_running().await {
                None => return,
                Some(false) => continue,
                Some(true) => {}
            }
            match self.stream().await {
                Ok(Stop::Dropped) => return,
                Ok(Stop::Paused) => backoff = BACKOFF_MIN,
                Err(e) => {
                    tracing::warn!(source = self.source.name, "CDC source waits out: {e}");
                    self.waiting(Some(e.to_string()));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Waits until the source runs with a table attached; `None` once it is dropped.
    async fn wait_running(&mut self) -> Option<bool> {
        loop {
            while let Ok(a) = self.context.attach.try_recv() {
                self.attach(a);
            }
            if *self.context.running.borrow_and_update() && !self.tables.is_empty() {
                return Some(true);
            }
            tokio::select! {
                a = self.context.attach.recv() => match a {
                    Some(a) => self.attach(a),
                    None => return None,
                },
                r = self.context.running.changed() => {
                    if r.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    fn attach(&mut self, a: crate::connector::source::Attach) {
        let name = a.table.name.clone();
        match Table::attach(a) {
            Ok(t) => {
                self.tables.insert(t.def.id, t);
            }
            Err(e) => tracing::error!(table = name, "cannot attach a CDC table: {e}"),
        }
    }

    fn waiting(&self, why: Option<String>) {
        self.context.progress.waiting(why.clone());
        for t in self.tables.values() {
            t.progress.waiting(why.clone());
        }
    }

    /// One replication connection's life.
    async fn stream(&mut self) -> Result<Stop> {
        let client = upstream::connect(&self.config.endpoint).await?;
        let mut conn = Connection::connect(&self.config.endpoint).await?;
        let start = self
            .tables
            .values()
            .filter_map(|t| t.lsn)
            .min()
            .unwrap_or_default();
        conn.start(&format!(
            "START_REPLICATION SLOT {} LOGICAL {start} (proto_version '1', \
             publication_names '{}', messages 'true')",
            self.config.slot, self.config.publication
        ))
        .await?;
        self.waiting(None);
        // A chunk in flight when the connection broke is read again.
        self.chunk = None;
        self.transaction.clear();
        self.bytes = 0;
        let mut status = tokio::time::interval(STATUS_INTERVAL);
        loop {
            if self.chunk.is_none() {
                self.next_chunk(&client).await?;
            }
            let woken = tokio::select! {
                d = conn.next_copy() => Woken::Data(d),
                a = self.context.attach.recv() => Woken::Attach(a),
                r = self.context.durable.changed() => match r {
                    Ok(()) => Woken::Durable,
                    Err(_) => Woken::Running(false),
                },
                _ = status.tick() => Woken::Status,
                r = self.context.running.changed() => Woken::Running(r.is_ok()),
            };
            match woken {
                Woken::Data(d) => match d? {
                    Some(d) => self.on_data(&d, &mut conn).await?,
                    None => return Err(ended()),
                },
                Woken::Attach(Some(a)) => self.attach(a),
                Woken::Attach(None) | Woken::Running(false) => return Ok(Stop::Dropped),
                Woken::Running(true) => {
                    if !*self.context.running.borrow_and_update() {
                        return Ok(Stop::Paused);
                    }
                }
                Woken::Durable => {
                    self.note_durable();
                    self.status(&mut conn).await?;
                }
                Woken::Status => {
                    self.status(&mut conn).await?;
                    self.publish_slot(&client).await;
                }
            }
            self.tables.retain(|_, t| !t.feed.is_closed());
            if self.tables.is_empty() {
                return Ok(Stop::Paused);
            }
        }
    }

    async fn on_data(&mut self, data: &[u8], conn: &mut Connection) -> Result<()> {
        match pgoutput::replication(data)? {
            Replication::Keepalive { reply: true, .. } => self.status(conn).await,
            Replication::Keepalive { .. } => Ok(()),
            Replication::XLogData { data, .. } => self.on_logical(pgoutput::logical(data)?).await,
        }
    }

    async fn on_logical(&mut self, message: Logical<'_>) -> Result<()> {
        match message {
            Logical::Begin { .. } => {
                self.transaction.clear();
                self.bytes = 0;
            }
            Logical::Relation(r) => {
                let name = format!("{}.{}", r.namespace, r.name);
                if let Some(t) = self.tables.values_mut().find(|t| t.upstream == name) {
                    t.check_relation(&r);
                    self.relations.insert(r.oid, t.def.id);
                }
            }
            Logical::Insert { relation, new } => {
                self.change(relation, |t| Ok(vec![(Op::Insert, row(t, &new)?)]))
                    .await?
            }
            Logical::Update { relation, old, new } => {
                self.change(relation, |t| {
                    let mut changes = Vec::new();
                    // An unchanged TOASTed value left out of the new row is the old row's,
                    // where the stream carries it whole.
                    let whole = match &old {
                        Some(pgoutput::Old::Row(v)) => Some(v.as_slice()),
                        _ => None,
                    };
                    let new = t.row_or(&new, whole).ok_or_else(|| unchanged(t))?;
                    if let Some(old) = old {
                        // The key changed (or the old row is all there): the old key's row goes.
                        let old = t.row(old.values()).unwrap_or_default();
                        if !old.is_empty() && t.key(&old) != t.key(&new) {
                            changes.push((Op::Delete, t.key_row(&old)));
                        }
                    }
                    changes.push((Op::Insert, new));
                    Ok(changes)
                })
                .await?
            }
            Logical::Delete { relation, old } => {
                self.change(relation, |t| {
                    Ok(vec![(Op::Delete, t.key_row(&row(t, &old)?))])
                })
                .await?
            }
            Logical::Truncate { relations } => {
                for relation in relations {
                    // A deletion without a key empties the table (`operators::upsert`).
                    self.change(relation, |t| {
                        Ok(vec![(Op::Delete, vec![None; t.places.len()])])
                    })
                    .await?;
                }
            }
            Logical::Commit { end, .. } => self.commit(end).await?,
            Logical::Message {
                prefix, content, ..
            } if prefix == upstream::WATERMARK_PREFIX => self.on_watermark(content).await?,
            Logical::Message { .. } | Logical::Other(_) => {}
        }
        Ok(())
    }

    /// A change to one relation's table, as `changes` makes it of the table; one the table
    /// cannot take stops that table.
    async fn change(
        &mut self,
        relation: u32,
        changes: impl FnOnce(&Table) -> std::result::Result<Vec<(Op, Row)>, String>,
    ) -> Result<()> {
        let Some(id) = self.relations.get(&relation).copied() else {
            return Ok(());
        };
        let Some(t) = self.tables.get_mut(&id).filter(|t| t.stopped.is_none()) else {
            return Ok(());
        };
        match changes(t) {
            Ok(changes) => {
                for (op, row) in changes {
                    if let Some(c) = &mut self.chunk {
                        c.changed(id, &t.key(&row));
                    }
                    self.bytes += row.iter().flatten().map(String::len).sum::<usize>();
                    self.transaction.push((id, op, row));
                }
            }
            Err(why) => t.stop(why),
        }
        if self.bytes > TRANSACTION_BYTES_MAX {
            self.feed(None).await?;
        }
        Ok(())
    }

    /// The transaction ending at `end` into every table, each at its new position (tables
    /// whose position is at or past `end` already hold it).
    async fn commit(&mut self, end: Lsn) -> Result<()> {
        self.feed(Some(end)).await
    }

    /// Feeds the held changes (and, with `end`, every table's new position) into the tables.
    async fn feed(&mut self, end: Option<Lsn>) -> Result<()> {
        let changes = std::mem::take(&mut self.transaction);
        self.bytes = 0;
        let mut by_table: BTreeMap<ObjectId, Vec<(Op, Row)>> = BTreeMap::new();
        for (id, op, row) in changes {
            by_table.entry(id).or_default().push((op, row));
        }
        let mut parts: Vec<(ObjectId, Vec<StreamChunk>)> = Vec::new();
        for (id, t) in &mut self.tables {
            if t.stopped.is_some() {
                continue;
            }
            // Already held: a transaction read again after a restart.
            if end.is_some() && t.lsn.is_some() && t.lsn >= end {
                continue;
            }
            let chunks = match by_table.remove(id) {
                Some(changes) => match t.chunk(&changes) {
                    Ok(c) => vec![c],
                    Err(e) => {
                        t.stop(format!("an upstream value does not read: {e}"));
                        continue;
                    }
                },
                None if end.is_none() => continue,
                None => Vec::new(),
            };
            if end.is_some() {
                t.lsn = end;
            }
            parts.push((*id, chunks));
        }
        self.send(parts).await;
        Ok(())
    }

    /// Sends chunks into tables, together, each at its position; tables whose actors are gone
    /// are let go.
    pub(super) async fn send(&mut self, parts: Vec<(ObjectId, Vec<StreamChunk>)>) {
        if parts.is_empty() {
            return;
        }
        let mut ids = Vec::with_capacity(parts.len());
        let mut rows = Vec::with_capacity(parts.len());
        let mut with: Vec<(&Feed, Vec<StreamChunk>, Splits)> = Vec::with_capacity(parts.len());
        for (id, chunks) in parts {
            if let Some(t) = self.tables.get(&id) {
                ids.push(id);
                rows.push(chunks.iter().map(|c| c.len() as u64).sum::<u64>());
                with.push((&t.feed, chunks, t.splits()));
            }
        }
        let gone = Feed::send_rows_together(with).await;
        for (i, id) in ids.iter().enumerate() {
            if gone.contains(&i) {
                self.tables.remove(id);
            } else if let Some(t) = self.tables.get(id) {
                t.progress
                    .offset
                    .fetch_add(rows[i], std::sync::atomic::Ordering::AcqRel);
            }
        }
    }

    /// Keeps the least position of the source's tables in the newest durable checkpoint.
    fn note_durable(&mut self) {
        let splits = self.context.durable.borrow_and_update().clone();
        let least = self
            .tables
            .keys()
            .filter_map(|id| {
                splits
                    .get(id)?
                    .get("cdc")?
                    .get("lsn")?
                    .as_str()?
                    .parse()
                    .ok()
            })
            .min();
        if let Some(lsn) = least {
            if self.durable.back() != Some(&lsn) {
                self.durable.push_back(lsn);
            }
            while self.durable.len() > DURABLE_KEPT {
                self.durable.pop_front();
            }
        }
    }

    /// Tells the upstream the WAL it may let go: up to the position of the oldest durable
    /// checkpoint kept (nothing before one is durable).
    async fn status(&mut self, conn: &mut Connection) -> Result<()> {
        let confirmed = self.durable.front().copied().unwrap_or_default();
        conn.send_copy(&pgoutput::status_update(
            confirmed,
            crate::clock::wall_ms() * 1000,
        ))
        .await
    }

    /// The slot's WAL held back, for `weir_catalog.source_splits`.
    async fn publish_slot(&self, client: &Client) {
        let retained = upstream::retained_bytes(client, &self.config.slot)
            .await
            .ok()
            .flatten();
        let confirmed = self.durable.front().copied().unwrap_or_default();
        self.context.progress.set_splits(vec![SplitProgress {
            split: format!("slot {}", self.config.slot),
            position: serde_json::Value::String(confirmed.to_string()),
            end: None,
            lag: retained,
        }]);
    }
}

/// A row of the stream as the table's, or why it cannot be one.
fn row(t: &Table, values: &[pgoutput::Value<'_>]) -> std::result::Result<Row, String> {
    t.row(values).ok_or_else(|| unchanged(t))
}

/// Why a change without its old row cannot be a row of `t`.
fn unchanged(t: &Table) -> String {
    format!(
        "an update to {} left out an unchanged TOASTed value: set REPLICA IDENTITY FULL on the \
         upstream table, so that updates carry the old row",
        t.upstream
    )
}

fn ended() -> Error {
    Error::new(
        ErrorKind::ConnectionFailure,
        "upstream PostgreSQL ended the replication stream",
    )
}
