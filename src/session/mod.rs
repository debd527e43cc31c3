//! A client session: its settings, and the dispatch of each parsed statement to the database.
//!
//! Transaction blocks: between BEGIN and COMMIT, INSERT, UPDATE and DELETE are kept in the
//! session's block (`table::Block`), which its statements read, and reach the tables only at
//! COMMIT; ROLLBACK, a failed COMMIT or a disconnect drop them. After an error the block is
//! failed: every statement but COMMIT and ROLLBACK (which both end it) gets 25P02. DDL in a
//! block is the block's (its objects are seen by it alone, its drops hidden from it) until
//! COMMIT applies it with the writes; FLUSH and CHECKPOINT take effect when they run. See
//! `docs/sql.md` and `docs/design/0010-transactions.md`.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::ParamValues;
use datafusion::sql::sqlparser::ast::{self, Statement as Ast};

use crate::catalog::Kind;
use crate::db::{Database, Output};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{relation_name, CursorQuery, Parsed, Settings, Statement};
use crate::table::Block;

mod copy;
mod cursors;
mod parameters;
mod settings;
mod stops;

pub use self::copy::header_lines as copy_header_lines;
use self::parameters::parameter_types;
pub use self::settings::parse_timeout;
use self::settings::{default_settings, on_off};
pub use self::stops::{terminated, Interrupts};
use self::stops::{Interruptible, Stops};

/// What a statement will take and return, for the extended protocol's Describe.
pub struct Description {
    pub parameters: Vec<DataType>,
    /// `None` when the statement returns no rows.
    pub columns: Option<SchemaRef>,
}

pub struct Session {
    db: Arc<Database>,
    pub settings: Settings,
    /// The settings the session started with, which RESET restores.
    initial: Settings,
    interrupts: Interrupts,
    transaction: Transaction,
    /// While a block is open (or failed): the settings as they were at its BEGIN, which
    /// ROLLBACK restores, and the values SET LOCAL replaced, which its end restores either way.
    begun: Option<Begun>,
    /// The block's cursors, by name.
    cursors: HashMap<String, cursors::Cursor>,
    /// The most `statement_mem` a session of its role may set unless a superuser (0: any):
    /// the role's own, or the server's.
    statement_mem_max: u64,
}

struct Begun {
    settings: Settings,
    local: HashMap<String, Option<String>>,
}

/// Where a session stands with respect to a transaction block.
enum Transaction {
    /// Outside a block: each statement commits on its own.
    Idle,
    Open(Block),
    /// A statement of the block failed: its writes are dropped, and it waits for its end,
    /// which undoes its DDL.
    Failed(Block),
}

/// What ReadyForQuery reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    Idle,
    Open,
    Failed,
}

impl Session {
    pub fn new(
        db: Arc<Database>,
        startup: &HashMap<String, String>,
        interrupts: Interrupts,
    ) -> Session {
        let mut settings = Settings::new(default_settings(), Some(interrupts.backend.clone()));
        settings.insert(
            "streaming_parallelism".into(),
            db.config.streaming_parallelism.max(1).to_string(),
        );
        settings.insert(
            "read_after_write".into(),
            on_off(db.config.read_after_write).into(),
        );
        if let Some(app) = startup.get("application_name") {
            settings.insert("application_name".into(), app.clone());
        }
        if let Some(user) = startup.get("user") {
            settings.insert("session_authorization".into(), user.clone());
        }
        let statement_mem_max = db.config.statement_mem;
        settings.insert(
            crate::sql::STATEMENT_MEM.into(),
            crate::sql::memory_text(statement_mem_max),
        );
        Session {
            db,
            initial: settings.clone(),
            settings,
            interrupts,
            transaction: Transaction::Idle,
            begun: None,
            cursors: HashMap::new(),
            statement_mem_max,
        }
    }

    /// Where the session stands in a transaction block.
    pub fn block_state(&self) -> BlockState {
        match self.transaction {
            Transaction::Idle => BlockState::Idle,
            Transaction::Open(_) => BlockState::Open,
            Transaction::Failed(_) => BlockState::Failed,
        }
    }

    /// Runs a query, bounded, in the session's block if one is open.
    async fn query(&self, stmt: &Ast, params: Option<&ParamValues>) -> Result<Output> {
        let block = self.open_block();
        self.bounded(self.db.query(stmt, params, &self.settings, block))
            .await
    }

    fn open_block(&self) -> Option<&Block> {
        match &self.transaction {
            Transaction::Open(b) => Some(b),
            _ => None,
        }
    }

    /// The block whose objects the session's statements see.
    fn scope(&self) -> crate::catalog::Scope {
        self.open_block().map(|b| b.number)
    }

    /// A statement of the session's open block failed (also where the failure came after
    /// `execute` returned: a query's rows, a statement that did not parse).
    pub fn fail(&mut self) {
        self.transaction = match std::mem::replace(&mut self.transaction, Transaction::Idle) {
            Transaction::Open(mut block) => {
                block.forget_writes();
                Transaction::Failed(block)
            }
            other => other,
        };
    }

    /// Runs one statement: BEGIN, COMMIT and ROLLBACK on the session's block, anything else
    /// in it (refused with 25P02 once it has failed, and failing it when it fails).
    pub async fn execute(
        &mut self,
        parsed: &Parsed,
        params: Option<&ParamValues>,
    ) -> Result<Output> {
        let output = self.run(parsed, params).await;
        // What `pg_stat_activity` shows of it (SET, RESET and ROLLBACK change it).
        let name = self.settings.get("application_name");
        self.interrupts
            .backend
            .set_application_name(name.map_or("", String::as_str));
        let idle = (self.settings.get("idle_in_transaction_session_timeout"))
            .and_then(|t| parse_timeout("idle_in_transaction_session_timeout", t).ok())
            .unwrap_or_default();
        self.interrupts
            .backend
            .set_idle_in_transaction_timeout(idle);
        output
    }

    /// The role the session logged in as.
    fn session_user(&self) -> String {
        self.interrupts.backend.start.user.clone()
    }

    async fn run(&mut self, parsed: &Parsed, params: Option<&ParamValues>) -> Result<Output> {
        if let Statement::Sql(stmt) = &parsed.statement {
            match stmt.as_ref() {
                Ast::StartTransaction { modes, .. } => {
                    // In a block already, PostgreSQL warns and goes on with it.
                    if let Transaction::Idle = self.transaction {
                        self.begin(modes)?;
                    }
                    return Ok(Output::TransactionStart);
                }
                Ast::Commit { .. } => return self.commit().await,
                Ast::Rollback {
                    savepoint: None, ..
                } => {
                    self.rollback().await;
                    return Ok(Output::TransactionEnd {
                        tag: "ROLLBACK".into(),
                    });
                }
                _ => {}
            }
        }
        if let Transaction::Failed(_) = self.transaction {
            return Err(Error::new(
                ErrorKind::InFailedTransaction,
                "current transaction is aborted, commands ignored until end of transaction block",
            ));
        }
        let output = match writes(parsed) {
            Some(command) if self.read_only() => Err(Error::new(
                ErrorKind::ReadOnlySqlTransaction,
                format!("cannot execute {command} in a read-only transaction"),
            )),
            _ => self.execute_statement(parsed, params).await,
        };
        if output.is_err() {
            self.fail();
        }
        output
    }

    /// Opens a block with `modes` (READ ONLY, an isolation level) over the defaults.
    fn begin(&mut self, modes: &[ast::TransactionMode]) -> Result<()> {
        let mut defaults = Vec::new();
        for name in ["transaction_isolation", "transaction_read_only"] {
            let default = self.settings.get(&format!("default_{name}")).cloned();
            defaults.push((name, default.unwrap_or_default()));
        }
        self.begun = Some(Begun {
            settings: self.settings.clone(),
            local: HashMap::new(),
        });
        for (name, value) in defaults {
            self.settings.insert(name.to_string(), value);
        }
        if let Err(e) = self.transaction_modes(modes) {
            self.end(false);
            return Err(e);
        }
        self.transaction = Transaction::Open(self.db.begin());
        Ok(())
    }

    /// Ends the session: its client has gone. An open block is rolled back.
    pub async fn close(&mut self) {
        self.rollback().await;
    }

    /// Ends the block without committing it: its writes dropped, its DDL undone, its settings
    /// restored.
    async fn rollback(&mut self) {
        match std::mem::replace(&mut self.transaction, Transaction::Idle) {
            Transaction::Open(block) | Transaction::Failed(block) => self.db.rollback(block).await,
            Transaction::Idle => {}
        }
        self.end(false);
    }

    /// Ends the block: its writes dropped (unless `commit` applied them), and its settings
    /// undone: all of them, or after a commit those SET LOCAL changed and the transaction's
    /// modes.
    fn end(&mut self, committed: bool) {
        self.transaction = Transaction::Idle;
        self.cursors.clear();
        let Some(begun) = self.begun.take() else {
            return;
        };
        if !committed {
            self.settings = begun.settings;
            return;
        }
        let modes = ["transaction_isolation", "transaction_read_only"]
            .map(|name| (name.to_string(), begun.settings.get(name).cloned()));
        for (name, value) in begun.local.into_iter().chain(modes) {
            match value {
                Some(v) => self.settings.insert(name, v),
                None => self.settings.remove(&name),
            };
        }
    }

    /// Ends the session's block: its writes are applied, atomically, or (for a failed block,
    /// which answers ROLLBACK as PostgreSQL does, or when the commit fails) dropped.
    async fn commit(&mut self) -> Result<Output> {
        match std::mem::replace(&mut self.transaction, Transaction::Idle) {
            Transaction::Idle => Ok(Output::TransactionEnd {
                tag: "COMMIT".into(),
            }),
            Transaction::Failed(block) => {
                self.db.rollback(block).await;
                self.end(false);
                Ok(Output::TransactionEnd {
                    tag: "ROLLBACK".into(),
                })
            }
            Transaction::Open(block) => {
                let committed = self.db.commit(block).await;
                self.end(committed.is_ok());
                committed?;
                Ok(Output::TransactionEnd {
                    tag: "COMMIT".into(),
                })
            }
        }
    }

    async fn execute_statement(
        &mut self,
        parsed: &Parsed,
        params: Option<&ParamValues>,
    ) -> Result<Output> {
        let scope = self.scope();
        let actor = self.session_user();
        let block = match &mut self.transaction {
            Transaction::Open(b) => Some(b),
            _ => None,
        };
        match &parsed.statement {
            Statement::Flush => self.db.flush().await,
            Statement::Checkpoint { base } => self.db.checkpoint(*base).await,
            Statement::ShowCheckpoints => self.db.show_checkpoints(),
            Statement::ShowTables => self.db.show_names(Kind::Table, scope),
            Statement::ShowMaterializedViews => self.db.show_views(&self.settings, scope),
            Statement::ShowCreate(kind, name) => self.db.show_create(name, *kind, scope),
            // Roles change outside transaction blocks only: a rolled back block could not
            // take back a password its statement set.
            Statement::Role(role) if block.is_some() => Err(Error::new(
                crate::error::ErrorKind::ActiveTransaction,
                format!("{} cannot run inside a transaction block", role.tag()),
            )),
            Statement::Role(role) => {
                if let crate::sql::RoleStatement::Set {
                    setting: Some(setting),
                    value: Some(value),
                    ..
                } = role
                {
                    self.check_setting(setting, value)?;
                }
                self.db.role_statement(&actor, role).await
            }
            // As roles, privileges change outside transaction blocks only.
            Statement::Grant(grant) if block.is_some() => Err(Error::new(
                crate::error::ErrorKind::ActiveTransaction,
                format!("{} cannot run inside a transaction block", grant.tag()),
            )),
            Statement::Grant(grant) => self.db.grant_statement(&actor, grant).await,
            // As roles, secrets change outside transaction blocks only.
            Statement::Secret(secret) if block.is_some() => Err(Error::new(
                crate::error::ErrorKind::ActiveTransaction,
                format!("{} cannot run inside a transaction block", secret.tag()),
            )),
            Statement::Secret(secret) => self.db.secret_statement(&actor, secret).await,
            Statement::ShowSources => self.db.show_names(Kind::Source, scope),
            Statement::ShowSinks => self.db.show_names(Kind::Sink, scope),
            Statement::CreateTable {
                table,
                watermark,
                format,
                include,
                from,
            } => {
                let clauses = (watermark.as_deref(), format.as_ref(), include.as_slice());
                self.db
                    .create_table(table, clauses, from.as_ref(), (&parsed.text, &actor), block)
                    .await
            }
            Statement::CreateSource {
                table,
                watermark,
                format,
                include,
            } => {
                let clauses = (watermark.as_deref(), format.as_ref(), include.as_slice());
                (self.db)
                    .create_source(table, clauses, (&parsed.text, &actor), block)
                    .await
            }
            Statement::CreateView(cv) => {
                crate::sql::check_supported(cv.view.as_ref())?;
                let stop = Stops::new(&self.settings, &self.interrupts)?.stopped();
                self.db.create_view(cv, &self.settings, block, stop).await
            }
            Statement::CreateSink(sink) => {
                crate::sql::check_supported(sink.query.as_ref())?;
                let stop = Stops::new(&self.settings, &self.interrupts)?.stopped();
                (self.db)
                    .create_sink(sink, (&self.settings, &actor), block, stop)
                    .await
            }
            Statement::Drop {
                kind,
                names,
                if_exists,
                cascade,
            } => {
                self.db
                    .drop_objects(*kind, (names, *if_exists, *cascade), (block, &actor))
                    .await
            }
            Statement::Subscribe(sub) => {
                self.bounded(self.db.subscribe(sub, &self.settings, scope))
                    .await
            }
            Statement::CopySubscribe { subscribe, copy } => {
                self.copy_subscribe(subscribe, copy).await
            }
            Statement::Declare { name, query } => self.declare(name, query, params).await,
            Statement::Fetch { name, count, moves } => self.fetch(name, *count, *moves).await,
            Statement::Close(name) => self.close_cursor(name.as_deref()),
            Statement::Sql(stmt) => {
                crate::sql::check_supported(stmt)?;
                self.execute_sql(stmt, params).await
            }
        }
    }

    /// Runs a query until it ends, the session's `statement_timeout` passes, a CancelRequest
    /// (or `pg_cancel_backend`) for the session arrives, `pg_terminate_backend` ends the
    /// session or the client hangs up; then the query stops (its execution is dropped, and
    /// its memory freed) with 57014 (57P01 when terminated). A query's rows are computed as
    /// they are sent, and the same interruptions stop them there. A write is stopped only
    /// until its rows are computed (`Database::dml`): one stopped between its log append and
    /// its answer would be reported as failed although it is durable.
    async fn bounded(
        &self,
        query: impl std::future::Future<Output = Result<Output>>,
    ) -> Result<Output> {
        let mut stops = Stops::new(&self.settings, &self.interrupts)?;
        let output = tokio::select! {
            output = query => output?,
            e = std::future::poll_fn(|cx| stops.poll(cx)) => return Err(e),
        };
        Ok(match output {
            Output::Stream { schema, rows } => Output::Stream {
                schema,
                rows: Box::pin(Interruptible::new(rows, stops)),
            },
            other => other,
        })
    }

    async fn execute_sql(&mut self, stmt: &Ast, params: Option<&ParamValues>) -> Result<Output> {
        let db = self.db.clone();
        let actor = self.session_user();
        let mut block = match &mut self.transaction {
            Transaction::Open(b) => Some(b),
            _ => None,
        };
        match stmt {
            Ast::Drop {
                object_type,
                if_exists,
                names,
                cascade,
                ..
            } => {
                let kind = match object_type {
                    ast::ObjectType::Table => Kind::Table,
                    ast::ObjectType::MaterializedView => Kind::MaterializedView,
                    ast::ObjectType::View => {
                        return Err(Error::new(
                            crate::error::ErrorKind::UndefinedTable,
                            "Weir has no plain views",
                        )
                        .with_hint("Use DROP MATERIALIZED VIEW."))
                    }
                    other => {
                        return Err(Error::not_supported(format!(
                            "DROP {other} is not supported"
                        )))
                    }
                };
                let names = names
                    .iter()
                    .map(relation_name)
                    .collect::<Result<Vec<String>>>()?;
                db.drop_objects(kind, (&names, *if_exists, *cascade), (block, &actor))
                    .await
            }
            Ast::Insert(_) | Ast::Update(_) | Ast::Delete(_) => {
                let table = written_table(stmt)?;
                let stop = Stops::new(&self.settings, &self.interrupts)?.stopped();
                db.dml(&table, stmt, params, &self.settings, block.take(), stop)
                    .await
            }
            Ast::Query(_) => self.query(stmt, params).await,
            Ast::Copy {
                source,
                to: true,
                target: ast::CopyTarget::Stdout,
                options,
                legacy_options,
                ..
            } => self.copy_out(source, options, legacy_options, params).await,
            Ast::Copy {
                source,
                to: false,
                target: ast::CopyTarget::Stdin,
                options,
                legacy_options,
                ..
            } => self.copy_in(source, options, legacy_options),
            Ast::Copy { to, target, .. } => Err(copy::refused(*to, target)),
            Ast::Explain { statement, .. } => match statement.as_ref() {
                Ast::CreateView(cv) if cv.materialized => {
                    db.explain_view(cv, &self.settings, self.scope()).await
                }
                _ => self.query(stmt, params).await,
            },
            Ast::Rollback { .. } => Err(Error::not_supported("savepoints are not supported")),
            Ast::Set(set) => self.set(set),
            Ast::ShowVariable { variable } => self.show(variable),
            Ast::Discard { .. } => Ok(Output::command("DISCARD ALL")),
            Ast::Reset(reset) => Ok(self.reset(&reset.reset)),
            // Weir has no LISTEN: what a pool sends to clean a connection it takes back
            // (asyncpg's reset) has nothing to do.
            Ast::UNLISTEN { .. } => Ok(Output::command("UNLISTEN")),
            Ast::Deallocate { .. } => Ok(Output::command("DEALLOCATE")),
            other => Err(Error::not_supported(format!(
                "statement is not supported: {}",
                first_words(&other.to_string())
            ))),
        }
    }

    /// The parameter types and result columns of a statement, without running it.
    pub async fn describe(&self, parsed: &Parsed) -> Result<Description> {
        let none = |columns: Option<SchemaRef>| Description {
            parameters: vec![],
            columns,
        };
        let scope = self.scope();
        let stmt = match &parsed.statement {
            Statement::Sql(s) => s,
            Statement::Flush | Statement::Role(_) | Statement::Grant(_) | Statement::Secret(_) => {
                return Ok(none(None))
            }
            Statement::Checkpoint { .. } => return Ok(none(Some(crate::db::checkpoint_schema()))),
            Statement::ShowCheckpoints => {
                return Ok(none(rows_schema(self.db.show_checkpoints()?)))
            }
            // These answer rows; run them to learn their shape (they are cheap and read-only).
            Statement::ShowTables => {
                return Ok(none(rows_schema(self.db.show_names(Kind::Table, scope)?)))
            }
            Statement::ShowMaterializedViews => {
                return Ok(none(rows_schema(
                    self.db.show_views(&self.settings, scope)?,
                )))
            }
            Statement::ShowCreate(kind, name) => {
                let shown = self.db.show_create(name, *kind, scope)?;
                return Ok(none(rows_schema(shown)));
            }
            Statement::ShowSources => {
                return Ok(none(rows_schema(self.db.show_names(Kind::Source, scope)?)))
            }
            Statement::ShowSinks => {
                return Ok(none(rows_schema(self.db.show_names(Kind::Sink, scope)?)))
            }
            Statement::CreateTable { .. }
            | Statement::CreateSource { .. }
            | Statement::CreateView(_)
            | Statement::CreateSink(_)
            | Statement::Drop { .. }
            | Statement::Declare {
                query: CursorQuery::Subscribe(_),
                ..
            }
            | Statement::Close(_)
            | Statement::CopySubscribe { .. }
            | Statement::Fetch { moves: true, .. } => return Ok(none(None)),
            Statement::Declare {
                query: CursorQuery::Select(q),
                ..
            } => {
                let stmt = Ast::Query(q.clone());
                let (_, plan) = (self.db)
                    .plan_query(&stmt, &self.settings, vec![], scope)
                    .await?;
                return Ok(Description {
                    parameters: parameter_types(&plan)?,
                    columns: None,
                });
            }
            Statement::Fetch { name, .. } => {
                let cursor = self.cursors.get(name);
                return Ok(none(cursor.map(|c| c.schema.clone())));
            }
            Statement::Subscribe(sub) => {
                return Ok(none(Some(self.db.subscribe_schema(sub, self.scope())?)))
            }
        };
        crate::sql::check_supported(stmt)?;
        if let Ast::Explain { statement, .. } = stmt.as_ref() {
            if let Ast::CreateView(cv) = statement.as_ref() {
                return Ok(none(rows_schema(
                    self.db.explain_view(cv, &self.settings, scope).await?,
                )));
            }
        }
        match stmt.as_ref() {
            Ast::Query(_) | Ast::Explain { .. } => {
                let (_, plan) = self
                    .db
                    .plan_query(stmt, &self.settings, vec![], scope)
                    .await?;
                Ok(Description {
                    parameters: parameter_types(&plan)?,
                    columns: Some(crate::db::result_schema(&plan)),
                })
            }
            Ast::Insert(_) | Ast::Update(_) | Ast::Delete(_) => {
                let (_, plan) = self
                    .db
                    .plan_statement(stmt, &self.settings, vec![], scope)
                    .await?;
                Ok(Description {
                    parameters: parameter_types(&plan)?,
                    columns: None,
                })
            }
            Ast::ShowVariable { variable } => Ok(none(rows_schema(self.show(variable)?))),
            // Its table, columns and options are checked when it is parsed, as in PostgreSQL
            // (a client of the extended protocol expects the COPY to start once bound).
            Ast::Copy {
                source,
                to: false,
                target: ast::CopyTarget::Stdin,
                options,
                legacy_options,
                ..
            } => {
                self.copy_in(source, options, legacy_options)?;
                Ok(none(None))
            }
            _ => Ok(none(None)),
        }
    }
}

/// The command a statement that writes runs, as a read-only transaction refuses it (25006).
fn writes(parsed: &Parsed) -> Option<&'static str> {
    Some(match &parsed.statement {
        Statement::CreateTable { .. } => "CREATE TABLE",
        Statement::CreateSource { .. } => "CREATE SOURCE",
        Statement::CreateView(_) => "CREATE MATERIALIZED VIEW",
        Statement::CreateSink(_) => "CREATE SINK",
        Statement::Drop { .. } => "DROP",
        Statement::Role(role) => role.tag(),
        Statement::Grant(grant) => grant.tag(),
        Statement::Secret(secret) => secret.tag(),
        Statement::Sql(stmt) => match stmt.as_ref() {
            Ast::Insert(_) => "INSERT",
            Ast::Update(_) => "UPDATE",
            Ast::Delete(_) => "DELETE",
            Ast::Copy { to: false, .. } => "COPY FROM",
            Ast::Drop { .. } => "DROP",
            _ => return None,
        },
        _ => return None,
    })
}

/// The columns of an answer, if it has rows.
fn rows_schema(out: Output) -> Option<SchemaRef> {
    match out {
        Output::Rows { schema, .. }
        | Output::Stream { schema, .. }
        | Output::Fetched { schema, .. } => Some(schema),
        _ => None,
    }
}

/// The table an INSERT, UPDATE or DELETE writes, once the forms Weir does not run are refused.
fn written_table(stmt: &Ast) -> Result<String> {
    match stmt {
        Ast::Insert(i) => {
            if i.on.is_some() || i.returning.is_some() {
                return Err(Error::not_supported(
                    "INSERT ... ON CONFLICT and RETURNING are not supported",
                ));
            }
            match &i.table {
                ast::TableObject::TableName(n) => relation_name(n),
                other => Err(Error::not_supported(format!("INSERT INTO {other}"))),
            }
        }
        Ast::Update(u) => {
            if u.returning.is_some() || u.from.is_some() {
                return Err(Error::not_supported(
                    "UPDATE ... FROM and RETURNING are not supported",
                ));
            }
            target_table(&u.table.relation)
        }
        Ast::Delete(d) => {
            if d.returning.is_some() || d.using.is_some() {
                return Err(Error::not_supported(
                    "DELETE ... USING and RETURNING are not supported",
                ));
            }
            let from = match &d.from {
                ast::FromTable::WithFromKeyword(t) | ast::FromTable::WithoutKeyword(t) => t,
            };
            let [t] = from.as_slice() else {
                return Err(Error::not_supported(
                    "DELETE from several tables is not supported",
                ));
            };
            target_table(&t.relation)
        }
        _ => Err(Error::internal(
            "a statement that writes no table was run as a write",
        )),
    }
}

fn target_table(rel: &ast::TableFactor) -> Result<String> {
    match rel {
        ast::TableFactor::Table { name, .. } => relation_name(name),
        other => Err(Error::not_supported(format!("cannot change {other}"))),
    }
}

fn first_words(s: &str) -> String {
    s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}
