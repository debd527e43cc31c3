//! DDL: creating tables and sources, dropping every kind of object, and starting tables and
//! sources, which recovery also uses. Views and sinks are in `views`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::sql::sqlparser::ast;
use tokio::sync::mpsc;

use crate::catalog::{Kind, Object, ObjectId, Scope, SourceDef, TableDef};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{self, relation_name, Format, FromSource, Include, Watermark};
use crate::stream::spec::UpsertSpec;
use crate::stream::{
    build_actor, ActorId, ErrorSink, Feed, FeedPosition, Mutation, PlanNode, SourceRows,
};
use crate::table::{Block, TableWriter};

use super::secrets::{mark_secrets, with_options};
use super::{Database, Output, SOURCES_DIR};

impl Database {
    /// Starts a table's actor and returns its writer with what to feed it: its whole change
    /// log, or with `restored` (a table restored from a checkpoint: its offset and watermark)
    /// the records from that offset on, the restored state holding those before.
    pub(super) async fn start_table(
        &self,
        def: TableDef,
        restored: Option<(u64, Option<i64>)>,
    ) -> Result<Replay> {
        let (feed_tx, feed_rx) = mpsc::channel(self.config.channel_messages_max);
        let (offset, watermark) = restored.unwrap_or((0, None));
        let feed = Feed::for_table(feed_tx, offset, watermark);
        let (writer, history) = TableWriter::open(
            def.clone(),
            &self.tables_dir,
            (
                feed.clone(),
                self.barriers.clone(),
                self.transactions.clone(),
            ),
            restored.map(|(offset, watermark)| crate::table::Restored { offset, watermark }),
            (self.config.memory_limit_bytes() / 16) as usize,
        )?;
        let schema = writer.schema().clone();
        self.catalog_mut().set_schema(def.id, schema.clone());
        let actor = build_actor(
            &self.actors,
            def.id,
            PlanNode::Input(0),
            Some((schema, def.storage_order())),
            &[def.id],
            vec![feed_rx],
            ErrorSink::new(&def.name),
        )?;
        actor.spawn();
        self.barriers
            .inject(None, vec![def.id], vec![(def.id, feed.clone())])
            .await?;
        Ok(Replay {
            id: def.id,
            feed,
            writer,
            history,
        })
    }

    /// Feeds a started table its log's records and opens it to writes.
    pub(super) async fn replay(&self, replay: Replay) -> Result<()> {
        let Replay {
            id,
            feed,
            mut writer,
            history,
        } = replay;
        // A restored table's watermark first: its actor and the views restored with it lost
        // theirs with the process, and rows late for it must stay late.
        if let Some(w) = writer.watermark() {
            feed.send_watermark(w)
                .await
                .map_err(|_| Error::internal("table actor stopped during replay"))?;
        }
        // A record at a time, read as it is sent, with a barrier whenever what is unsealed
        // grows past its bound: a log longer than memory (a large statement's group) replays
        // within it.
        for record in history {
            let (record, chunk) = record?;
            writer.bound_unsealed().await?;
            let watermark = writer.replayed(record, &chunk)?;
            feed.send_statement(chunk, watermark)
                .await
                .map_err(|_| Error::internal("table actor stopped during replay"))?;
        }
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::new(tokio::sync::Mutex::new(writer)));
        Ok(())
    }

    /// `CREATE TABLE`, by role `actor`.
    pub async fn create_table(
        &self,
        ct: &ast::CreateTable,
        clauses: (Option<&Watermark>, Option<&Format>, &[Include]),
        from: Option<&FromSource>,
        (text, actor): (&str, &str),
        block: Option<&mut Block>,
    ) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let scope = block.as_ref().map(|b| b.number);
        let name = relation_name(&ct.name)?;
        let role = self.acting(actor)?;
        self.check_create(&role)?;
        if self.catalog().get(&name, scope).is_some() && ct.if_not_exists {
            return Ok(Output::command("CREATE TABLE"));
        }
        self.catalog().check_free(&name, scope)?;
        let mut ct = ct.clone();
        let secrets = self.open_secrets(&role, with_options(&mut ct), sql::ident_name)?;
        if let Some(declared) = sql::declared_connector(&ct)? {
            self.check_server_files(&declared, false, role.superuser)?;
        }
        let id = self.catalog_mut().allocate_ids(1)[0];
        let mut def = sql::create_table(&ct, clauses, id)?;
        if let Some(c) = &mut def.connector {
            mark_secrets(c, secrets)?;
            self.check_server_files(c, false, role.superuser)?;
        }
        def.create_sql = Some(text.to_string());
        if let Some(from) = from {
            self.read_from_source(&mut def, from, scope).await?;
        }
        if def.connector.is_some() {
            self.start_connector_table(def.clone(), FeedPosition::default())
                .await?;
            self.add_started(Object::Table(def), block, role.oid)
                .await?;
            // A source of several tables' stream runs once a table reads it.
            self.run_sources_read();
            return Ok(Output::command("CREATE TABLE"));
        }
        // A log left behind by a table of the same id cannot exist (ids are never reused),
        // but make sure the new table starts empty.
        TableWriter::remove(&self.tables_dir, id)?;
        let replay = self.start_table(def.clone(), None).await?;
        self.replay(replay).await?;
        self.add_started(Object::Table(def), block, role.oid)
            .await?;
        Ok(Output::command("CREATE TABLE"))
    }

    /// Makes `def` a table fed by the stream of the source `from` names: its connector checks
    /// the upstream table against the declared one and keeps the options the table reads by.
    async fn read_from_source(
        &self,
        def: &mut TableDef,
        from: &FromSource,
        scope: Scope,
    ) -> Result<()> {
        if def.connector.is_some() {
            return Err(Error::syntax(
                "a table FROM a source takes no connector of its own",
            ));
        }
        let name = relation_name(&from.source)?;
        let source = match self.catalog().get(&name, scope) {
            Some(Object::Source(s)) => s.clone(),
            Some(_) => {
                return Err(Error::new(
                    ErrorKind::WrongObjectType,
                    format!("\"{name}\" is not a source"),
                ))
            }
            None => {
                return Err(Error::new(
                    ErrorKind::UndefinedObject,
                    format!("source \"{name}\" does not exist"),
                ))
            }
        };
        let shared = crate::connector::source::shared(&source)?;
        if def.primary_key.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidTableDefinition,
                format!(
                    "table \"{}\" needs a primary key to be fed by source \"{name}\"",
                    def.name
                ),
            )
            .with_hint("Declare the upstream table's primary key: changes come by key."));
        }
        let options = shared
            .create_table(
                source.clone(),
                from.table.clone(),
                def.columns.clone(),
                def.primary_key.clone(),
            )
            .await?;
        def.connector = Some(crate::catalog::Connector::plain(
            source.connector.name.clone(),
            options,
        ));
        def.reads = Some(source.id);
        Ok(())
    }

    /// Where sources keep what they read (a file source's ledger).
    pub(super) fn sources_dir(&self) -> PathBuf {
        self.config.data_dir.join(SOURCES_DIR)
    }

    /// Starts a source's actor and its task from `start` (paused until something reads it).
    /// A source whose stream feeds tables (PostgreSQL CDC) has no actor: only its task, to
    /// which its tables attach as they start.
    pub(super) async fn start_source(&self, def: SourceDef, start: FeedPosition) -> Result<()> {
        if let Some(handle) =
            crate::connector::source::spawn_shared(&def, self.barriers.durable_splits())
        {
            // Named to the planner (with no columns), so that a view over it is refused as
            // one over a source that feeds tables.
            self.catalog_mut().set_schema(def.id, def.schema());
            self.sources
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(def.id, handle);
            return Ok(());
        }
        let (feed_tx, feed_rx) = mpsc::channel(self.config.channel_messages_max);
        let feed = Feed::for_source(feed_tx, start.clone());
        let handle = crate::connector::source::spawn(
            def.clone(),
            feed.clone(),
            &start,
            &self.sources_dir(),
            self.barriers.durable_splits(),
        );
        self.catalog_mut().set_schema(def.id, def.schema());
        let mut actor = build_actor(
            &self.actors,
            def.id,
            PlanNode::Input(0),
            None,
            &[],
            vec![feed_rx],
            ErrorSink::new(&def.name),
        )?;
        actor.source = Some(SourceRows {
            seen: start.offset,
            positions: feed
                .positions()
                .ok_or_else(|| Error::internal("a source's feed keeps its positions"))?,
            history: Arc::new(crate::connector::source::History::new(
                def.clone(),
                self.sources_dir(),
            )),
        });
        actor.spawn();
        let epoch = self
            .barriers
            .inject(None, vec![def.id], vec![(def.id, feed.clone())])
            .await?;
        self.barriers.wait_sealed(epoch).await?;
        restore_watermark(&feed, def.watermark, start.watermark).await?;
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.id, handle);
        Ok(())
    }

    /// Starts a table fed by a connector (`docs/design/0012-connector-tables.md`): its actor
    /// turns the connector's changes by key into its rows (an `Upsert` over its input when
    /// it has a primary key) and keeps them, and the connector's task feeds it from `start`
    /// (a checkpoint's position, or the stream's start), whether or not anything reads it.
    pub(super) async fn start_connector_table(
        &self,
        def: TableDef,
        start: FeedPosition,
    ) -> Result<()> {
        let reads = def
            .feed()
            .ok_or_else(|| Error::internal("a connector table without its connector"))?;
        let (feed_tx, feed_rx) = mpsc::channel(self.config.channel_messages_max);
        let feed = Feed::starting_at(feed_tx, start.clone());
        let schema = def.schema();
        self.catalog_mut().set_schema(def.id, schema.clone());
        let order = def.storage_order();
        let root = if def.primary_key.is_empty() {
            PlanNode::Input(0)
        } else {
            PlanNode::Upsert {
                input: Box::new(PlanNode::Input(0)),
                spec: UpsertSpec {
                    schema: schema.clone(),
                    key: def.primary_key.clone(),
                    order: order.clone(),
                    table: def.id,
                },
            }
        };
        let actor = build_actor(
            &self.actors,
            def.id,
            root,
            Some((schema, order)),
            &[def.id],
            vec![feed_rx],
            ErrorSink::new(&def.name),
        )?;
        actor.spawn();
        let epoch = self
            .barriers
            .inject(None, vec![def.id], vec![(def.id, feed.clone())])
            .await?;
        self.barriers.wait_sealed(epoch).await?;
        restore_watermark(&feed, def.watermark, start.watermark).await?;
        let handle = match def.reads {
            // A table of a source's stream of several tables: that source's task feeds it.
            Some(source) => {
                let attach = {
                    let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
                    let source = sources.get(&source).ok_or_else(|| {
                        Error::internal(format!(
                            "table \"{}\" reads a source that has not started",
                            def.name
                        ))
                    })?;
                    source.attacher()
                };
                attach.attach(reads, feed.clone(), start).await?
            }
            None => crate::connector::source::spawn(
                reads,
                feed.clone(),
                &start,
                &self.sources_dir(),
                self.barriers.durable_splits(),
            ),
        };
        handle.set_running(true);
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.id, handle);
        Ok(())
    }

    /// Runs the sources some view or sink reads, and pauses the others: a source produces
    /// nothing before it is read (a view created later backfills what went by). A connector
    /// table's connector always runs: the table keeps its rows.
    pub(super) fn run_sources_read(&self) {
        let catalog = self.catalog();
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        for (id, handle) in sources.iter() {
            let table = matches!(catalog.by_id(*id), Some(Object::Table(_)));
            handle.set_running(table || !catalog.dependents(*id).is_empty());
        }
    }

    /// `CREATE SOURCE`, by role `actor`.
    pub async fn create_source(
        &self,
        ct: &ast::CreateTable,
        clauses: (Option<&Watermark>, Option<&Format>, &[Include]),
        (text, actor): (&str, &str),
        block: Option<&mut Block>,
    ) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let scope = block.as_ref().map(|b| b.number);
        let name = relation_name(&ct.name)?;
        let role = self.acting(actor)?;
        self.check_create(&role)?;
        if self.catalog().get(&name, scope).is_some() && ct.if_not_exists {
            return Ok(Output::command("CREATE SOURCE"));
        }
        self.catalog().check_free(&name, scope)?;
        let mut ct = ct.clone();
        let secrets = self.open_secrets(&role, with_options(&mut ct), sql::ident_name)?;
        // The server's files the options name are checked before the connector opens any.
        if let Some(declared) = sql::declared_connector(&ct)? {
            self.check_server_files(&declared, false, role.superuser)?;
        }
        let id = self.catalog_mut().allocate_ids(1)[0];
        let mut def = sql::create_source(&ct, clauses, id)?;
        mark_secrets(&mut def.connector, secrets)?;
        self.check_server_files(&def.connector, false, role.superuser)?;
        def.create_sql = Some(text.to_string());
        self.start_source(def.clone(), FeedPosition::default())
            .await?;
        self.add_started(Object::Source(def), block, role.oid)
            .await?;
        Ok(Output::command("CREATE SOURCE"))
    }

    /// DROP TABLE / MATERIALIZED VIEW / SOURCE / SINK: `kind` is what each name must be. In
    /// a transaction block, what the block created goes at once, and the rest is hidden from
    /// the block and goes at its COMMIT.
    pub async fn drop_objects(
        &self,
        kind: Kind,
        (names, if_exists, cascade): (&[String], bool, bool),
        (block, actor): (Option<&mut Block>, &str),
    ) -> Result<Output> {
        let _ddl = self.ddl.lock().await;
        let scope = block.as_ref().map(|b| b.number);
        let role = self.acting(actor)?;
        let tag = match kind {
            Kind::Table => "DROP TABLE",
            Kind::MaterializedView => "DROP MATERIALIZED VIEW",
            Kind::Source => "DROP SOURCE",
            Kind::Sink => "DROP SINK",
        };
        let statement = |k: Kind| match k {
            Kind::Table => "TABLE",
            Kind::MaterializedView => "MATERIALIZED VIEW",
            Kind::Source => "SOURCE",
            Kind::Sink => "SINK",
        };
        let mut to_stop: Vec<ObjectId> = Vec::new();
        {
            let catalog = self.catalog();
            for name in names {
                let Some(object) = catalog.get(name, scope) else {
                    if if_exists {
                        continue;
                    }
                    return Err(match kind {
                        Kind::Table => crate::catalog::undefined_table(name),
                        other => Error::new(
                            ErrorKind::UndefinedTable,
                            format!("{} \"{name}\" does not exist", other.name()),
                        ),
                    });
                };
                if object.kind() != kind {
                    return Err(Error::new(
                        ErrorKind::WrongObjectType,
                        format!("\"{name}\" is not a {}", kind.name()),
                    )
                    .with_hint(format!("Use DROP {}.", statement(object.kind()))));
                }
                if !catalog.owns(&role, object.id()) {
                    return Err(super::privileges::not_owner(object));
                }
                let dependents: Vec<ObjectId> = catalog
                    .dependents(object.id())
                    .into_iter()
                    .filter(|d| !catalog.dropped_by(*d, scope))
                    .collect();
                let outside: Vec<ObjectId> = dependents
                    .iter()
                    .copied()
                    .filter(|d| !to_stop.contains(d))
                    .collect();
                if !outside.is_empty() && !cascade {
                    let detail: Vec<String> = outside
                        .iter()
                        .filter_map(|d| catalog.by_id(*d))
                        .map(|d| {
                            format!(
                                "{} {} depends on {} {}",
                                d.kind_name(),
                                d.name(),
                                object.kind_name(),
                                name
                            )
                        })
                        .collect();
                    return Err(Error::new(
                        ErrorKind::DependentObjects,
                        format!(
                            "cannot drop {} {name} because other objects depend on it",
                            object.kind_name()
                        ),
                    )
                    .with_detail(detail.join("\n"))
                    .with_hint("Use DROP ... CASCADE to drop the dependent objects too."));
                }
                to_stop.push(object.id());
                to_stop.extend(outside);
            }
        }
        if let Some(block) = block {
            for id in &to_stop {
                block.forget_table(*id);
            }
            let committed: Vec<ObjectId> = {
                let (created, _) = self.catalog().block_changes(block.number);
                to_stop
                    .iter()
                    .copied()
                    .filter(|id| !created.contains(id))
                    .collect()
            };
            if !committed.is_empty() {
                block.ddl = true;
                self.catalog_mut().hide(&committed, block.number);
            }
            to_stop.retain(|id| !committed.contains(id));
        }
        self.remove_objects(&to_stop).await?;
        Ok(Output::command(tag))
    }

    /// Removes objects from the catalog and stops their actors, which drop their state.
    pub(super) async fn remove_objects(&self, to_stop: &[ObjectId]) -> Result<()> {
        if to_stop.is_empty() {
            return Ok(());
        }
        let (actors, dropped_tables) = self.actors_and_tables(to_stop);
        // The catalog first: a DROP refused because the catalog cannot be saved changes
        // nothing. Once saved, the objects are gone (a restart finds none of them, and drops
        // their state); their actors stop at the next barrier.
        self.catalog_mut().remove(to_stop)?;
        self.retire(actors, to_stop, &dropped_tables).await;
        Ok(())
    }

    /// The actors of objects of the catalog (a view's parallel workers with its own), and
    /// which of the objects are tables.
    fn actors_and_tables(&self, ids: &[ObjectId]) -> (HashSet<ActorId>, Vec<ObjectId>) {
        let catalog = self.catalog();
        let mut actors: HashSet<ActorId> = ids.iter().copied().collect();
        let mut tables = Vec::new();
        for id in ids {
            match catalog.by_id(*id) {
                Some(Object::View(v)) => actors.extend(&v.workers),
                Some(Object::Table(_)) => tables.push(*id),
                _ => {}
            }
        }
        (actors, tables)
    }

    /// Stops the actors of objects no longer in the catalog, and forgets them; a source of
    /// several tables' stream also drops what it made upstream (its replication slot).
    async fn retire(&self, actors: HashSet<ActorId>, objects: &[ObjectId], tables: &[ObjectId]) {
        if let Err(e) = self.stop_actors(actors).await {
            // Only when the dataflow itself has stopped (the server is going down).
            tracing::warn!("cannot stop the actors of dropped objects: {e}");
        }
        let shared: Vec<_> = {
            let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<ObjectId> = objects
                .iter()
                .copied()
                .filter(|id| sources.get(id).is_some_and(|h| h.is_shared()))
                .collect();
            ids.iter().filter_map(|id| sources.remove(id)).collect()
        };
        for handle in shared {
            if let Err(e) = handle.drop_upstream().await {
                tracing::warn!("cannot drop what a dropped source made upstream: {e}");
            }
        }
        self.forget(objects, tables);
        self.run_sources_read();
    }

    /// Commits a block that ran DDL (`docs/design/0010-transactions.md`): its writes and its
    /// catalog changes together (the objects it created become everyone's, those it dropped
    /// go), or, on an error, none of it, and what it created is dropped.
    pub(super) async fn commit_ddl(&self, mut block: Block) -> Result<()> {
        // Its end is handled here, whatever it turns out to be.
        block.ddl = false;
        let number = block.number;
        let _ddl = self.ddl.lock().await;
        let (_, dropped) = self.catalog().block_changes(number);
        if let Err(e) = self.check_still_droppable(&dropped) {
            drop(block);
            self.undo_block(number).await;
            return Err(e);
        }
        // Read before the commit takes the dropped objects out of the catalog.
        let (actors, tables) = self.actors_and_tables(&dropped);
        let settle = || self.catalog_mut().commit_block(number, &dropped);
        match self
            .commit_writes(block, Some((number, &dropped)), settle)
            .await
        {
            Ok(()) => {}
            Err(e) if e.kind == ErrorKind::TransactionResolutionUnknown => return Err(e),
            Err(e) => {
                self.undo_block(number).await;
                return Err(e);
            }
        }
        // The catalog's dependents change only with the drops.
        if !dropped.is_empty() {
            self.retire(actors, &dropped, &tables).await;
        }
        Ok(())
    }

    /// Refuses the commit of a block's drops (2BP01) when another session has since created
    /// an object that reads one of them (where PostgreSQL would have made it wait for the
    /// block's end).
    fn check_still_droppable(&self, dropped: &[ObjectId]) -> Result<()> {
        let catalog = self.catalog();
        for id in dropped {
            let Some(reader) = catalog
                .dependents(*id)
                .into_iter()
                .find(|d| !dropped.contains(d))
                .and_then(|d| catalog.by_id(d))
            else {
                continue;
            };
            let (kind, name) = catalog
                .by_id(*id)
                .map(|o| (o.kind_name(), o.name()))
                .unwrap_or_default();
            return Err(Error::new(
                ErrorKind::DependentObjects,
                format!("cannot drop {kind} {name} because other objects depend on it"),
            )
            .with_detail(format!(
                "{} {} was created by another session after this transaction dropped {name}.",
                reader.kind_name(),
                reader.name()
            ))
            .with_hint("Retry the transaction, with DROP ... CASCADE to drop it too."));
        }
        Ok(())
    }

    /// Ends a block without committing it (ROLLBACK, a failed block's end): drops what it
    /// created and forgets its drops.
    pub async fn rollback(&self, mut block: Block) {
        if !block.ddl {
            return;
        }
        block.ddl = false;
        let number = block.number;
        drop(block);
        let _ddl = self.ddl.lock().await;
        self.undo_block(number).await;
    }

    /// Undoes the DDL of block `number`, which will not commit. The caller holds the DDL lock.
    pub(super) async fn undo_block(&self, number: u64) {
        let (created, _) = self.catalog().block_changes(number);
        self.catalog_mut().unhide(number);
        if let Err(e) = self.remove_objects(&created).await {
            // Still marked as the block's in the saved catalog: the next start drops them.
            tracing::warn!("cannot drop the objects of a transaction rolled back: {e}");
        }
    }

    /// Stops actors at the next barrier; they drop their state.
    pub(super) async fn stop_actors(&self, actors: HashSet<ActorId>) -> Result<()> {
        let mutation = Mutation {
            stop: actors,
            ..Default::default()
        };
        let epoch = self.barriers.inject(Some(mutation), vec![], vec![]).await?;
        self.barriers.wait_sealed(epoch).await
    }

    /// Forgets objects whose actors have stopped: their writers, change logs (of `tables`),
    /// source ledgers, sink counters and row errors.
    pub(super) fn forget(&self, objects: &[ObjectId], tables: &[ObjectId]) {
        {
            let mut writers = self.tables.write().unwrap_or_else(|p| p.into_inner());
            for id in tables {
                writers.remove(id);
            }
        }
        for id in tables {
            if let Err(e) = TableWriter::remove(&self.tables_dir, *id) {
                tracing::warn!("cannot remove the change log of dropped table {id}: {e}");
            }
        }
        let mut errors = self.view_errors.lock().unwrap_or_else(|p| p.into_inner());
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        let mut sinks = self.sinks.lock().unwrap_or_else(|p| p.into_inner());
        for id in objects {
            errors.remove(id);
            if let Some(source) = sources.remove(id) {
                if let Err(e) = source.forget(&self.sources_dir()) {
                    tracing::warn!("cannot remove what dropped source {id} kept: {e}");
                }
            }
            if let Some(sink) = sinks.remove(id) {
                sink.stop();
            }
        }
    }

    /// Adds an object whose actors already run to the catalog, owned by role `owner`. When its
    /// entry cannot be saved, the statement is refused and what it started stops and leaves
    /// nothing behind (its actors drop their state; a table's log goes), as if it had never
    /// run.
    /// In a transaction block, the object is the block's until it commits.
    pub(super) async fn add_started(
        &self,
        object: Object,
        block: Option<&mut Block>,
        owner: u32,
    ) -> Result<()> {
        let scope = block.as_ref().map(|b| b.number);
        let Err(e) = self.catalog_mut().add(object.clone(), scope, owner) else {
            if let Some(block) = block {
                block.ddl = true;
            }
            return Ok(());
        };
        self.abandon(&object).await;
        Err(e)
    }

    /// Stops the actors of an object started but not added to the catalog, and forgets it:
    /// its actors drop their state, a table's log goes, as if it had never been created.
    pub(super) async fn abandon(&self, object: &Object) {
        let mut actors: HashSet<ActorId> = HashSet::from([object.id()]);
        if let Object::View(v) = object {
            actors.extend(&v.workers);
        }
        if let Err(stop) = self.stop_actors(actors).await {
            tracing::warn!("cannot stop the actors of \"{}\": {stop}", object.name());
        }
        let table = matches!(object, Object::Table(_)).then_some(object.id());
        self.forget(&[object.id()], table.as_slice());
        self.catalog_mut().forget_schema(object.id());
    }
}

/// Sends a restored source's (or connector table's) watermark into its feed before anything
/// else, as a restored table's: the views restored with it lost theirs with the process, and
/// rows late for it must stay late.
async fn restore_watermark(
    feed: &Feed,
    watermark: Option<crate::catalog::WatermarkDef>,
    value: Option<i64>,
) -> Result<()> {
    if let (Some(w), Some(value)) = (watermark, value) {
        feed.send_watermark(crate::stream::Watermark {
            column: w.column,
            value,
        })
        .await
        .map_err(|_| Error::internal("an actor stopped while it started"))?;
    }
    Ok(())
}

/// A started table and the log records still to feed it.
pub(super) struct Replay {
    id: ObjectId,
    feed: Feed,
    writer: TableWriter,
    pub(super) history: crate::table::Records,
}
