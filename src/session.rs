//! A client session: its settings, and the dispatch of each parsed statement to the database.
//!
//! Transactions: BEGIN, COMMIT and ROLLBACK are accepted so that drivers which wrap every
//! statement in a transaction work unchanged, but every statement takes effect when it runs
//! (autocommit); ROLLBACK undoes nothing. See `docs/sql.md`.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::ParamValues;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::sqlparser::ast::{self, Statement as Ast};

use crate::catalog::Kind;
use crate::db::{text_rows, Database, Output, RowStream};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{relation_name, Parsed, Statement};

/// Settings every session starts with, as PostgreSQL 15 reports them (names lower-case).
fn default_settings() -> HashMap<String, String> {
    let pairs = [
        ("application_name", ""),
        ("client_encoding", "UTF8"),
        ("datestyle", "ISO, MDY"),
        ("default_transaction_isolation", "read committed"),
        ("default_transaction_read_only", "off"),
        ("extra_float_digits", "1"),
        ("in_hot_standby", "off"),
        ("integer_datetimes", "on"),
        ("intervalstyle", "postgres"),
        ("read_after_write", "on"),
        ("is_superuser", "on"),
        ("lc_messages", "C"),
        ("max_identifier_length", "63"),
        ("search_path", "\"$user\", public"),
        ("server_encoding", "UTF8"),
        ("server_version", crate::PG_VERSION),
        ("server_version_num", crate::PG_VERSION_NUM),
        ("standard_conforming_strings", "on"),
        ("statement_timeout", "0"),
        ("timezone", "UTC"),
        ("transaction_isolation", "read committed"),
        ("transaction_read_only", "off"),
    ];
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Settings whose only supported value is fixed: Weir computes and prints in UTC, ISO date
/// style and UTF-8.
fn fixed_setting(name: &str) -> Option<&'static [&'static str]> {
    match name {
        "timezone" => Some(&["utc", "etc/utc", "gmt", "z", "zulu", "+00:00", "0", "00:00"]),
        "client_encoding" => Some(&["utf8", "utf-8", "unicode"]),
        "datestyle" => Some(&["iso, mdy", "iso", "iso,mdy", "iso, ymd", "iso,ymd"]),
        _ => None,
    }
}

/// What a statement will take and return, for the extended protocol's Describe.
pub struct Description {
    pub parameters: Vec<DataType>,
    /// `None` when the statement returns no rows.
    pub columns: Option<SchemaRef>,
}

/// What stops a session's running query before it ends, besides `statement_timeout`.
pub struct Interrupts {
    /// Signalled by a CancelRequest for the session.
    pub cancel: Arc<tokio::sync::Notify>,
    /// A second handle on the client's socket, watched for the client hanging up.
    pub socket: Option<Arc<tokio::net::TcpStream>>,
}

impl Interrupts {
    /// Completes when the client has closed its connection (or the socket failed).
    fn hung_up(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let socket = self.socket.clone();
        async move {
            let Some(socket) = socket else {
                return std::future::pending().await;
            };
            loop {
                match socket.ready(tokio::io::Interest::READABLE).await {
                    Ok(ready) if !ready.is_read_closed() => {
                        // The client sent its next message before this answer: that is not
                        // a hang-up. Forget this readiness and wait for the next change.
                        let _ = socket.try_io(tokio::io::Interest::READABLE, || {
                            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
                        });
                    }
                    Ok(_) | Err(_) => return,
                }
            }
        }
    }
}

pub struct Session {
    db: Arc<Database>,
    pub settings: HashMap<String, String>,
    interrupts: Interrupts,
}

impl Session {
    pub fn new(
        db: Arc<Database>,
        startup: &HashMap<String, String>,
        interrupts: Interrupts,
    ) -> Session {
        let mut settings = default_settings();
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
        Session {
            db,
            settings,
            interrupts,
        }
    }

    pub async fn execute(
        &mut self,
        parsed: &Parsed,
        params: Option<&ParamValues>,
    ) -> Result<Output> {
        match &parsed.statement {
            Statement::Flush => self.db.flush().await,
            Statement::Checkpoint { base } => self.db.checkpoint(*base).await,
            Statement::ShowCheckpoints => self.db.show_checkpoints(),
            Statement::ShowTables => self.db.show_names(Kind::Table),
            Statement::ShowMaterializedViews => self.db.show_views(),
            Statement::ShowCreateMaterializedView(name) => self.db.show_create_view(name),
            Statement::ShowSources => self.db.show_names(Kind::Source),
            Statement::ShowSinks => self.db.show_names(Kind::Sink),
            Statement::CreateTable { table, watermark } => {
                self.db.create_table(table, watermark.as_deref()).await
            }
            Statement::CreateSource { table, watermark } => {
                self.db.create_source(table, watermark.as_deref()).await
            }
            Statement::CreateView(cv) => {
                crate::sql::check_supported(cv.view.as_ref())?;
                self.db.create_view(cv, &self.settings).await
            }
            Statement::CreateSink(sink) => {
                crate::sql::check_supported(sink.query.as_ref())?;
                self.db.create_sink(sink, &self.settings).await
            }
            Statement::Drop {
                kind,
                names,
                if_exists,
                cascade,
            } => {
                self.db
                    .drop_objects(*kind, names, *if_exists, *cascade)
                    .await
            }
            Statement::Sql(stmt) => {
                crate::sql::check_supported(stmt)?;
                self.execute_sql(stmt, params).await
            }
        }
    }

    /// Runs a query until it ends, the session's `statement_timeout` passes, a CancelRequest
    /// for the session arrives or the client hangs up; then the query stops (its execution is
    /// dropped, and its memory freed) with 57014. A query's rows are computed as they are
    /// sent, and the same timeout and cancellation stop them there. Only queries are bounded:
    /// a write stopped between its log append and its answer would be reported as failed
    /// although it is durable.
    async fn bounded(
        &self,
        query: impl std::future::Future<Output = Result<Output>>,
    ) -> Result<Output> {
        let timeout = self
            .settings
            .get("statement_timeout")
            .map(|v| parse_timeout(v))
            .transpose()?
            .unwrap_or_default();
        // Enabled now, so that a cancel is seen even while nothing waits for it (between
        // two batches of rows).
        let mut cancelled = Box::pin(self.interrupts.cancel.clone().notified_owned());
        cancelled.as_mut().enable();
        let mut deadline = (!timeout.is_zero()).then(|| Box::pin(tokio::time::sleep(timeout)));
        let timed_out = async {
            match deadline.as_mut() {
                Some(d) => d.as_mut().await,
                None => std::future::pending().await,
            }
        };
        let mut hung_up = Box::pin(self.interrupts.hung_up());
        let output = tokio::select! {
            output = query => output?,
            _ = cancelled.as_mut() => return Err(cancelled_by_user()),
            _ = timed_out => return Err(cancelled_by_timeout()),
            // Nobody will read the answer.
            _ = hung_up.as_mut() => return Err(hung_up_error()),
        };
        Ok(match output {
            Output::Stream { schema, rows } => Output::Stream {
                schema,
                rows: Box::pin(Interruptible {
                    rows,
                    cancelled,
                    deadline,
                    hung_up,
                    done: false,
                }),
            },
            other => other,
        })
    }

    async fn execute_sql(&mut self, stmt: &Ast, params: Option<&ParamValues>) -> Result<Output> {
        let db = self.db.clone();
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
                db.drop_objects(kind, &names, *if_exists, *cascade).await
            }
            Ast::Insert(i) => {
                let table = match &i.table {
                    ast::TableObject::TableName(n) => relation_name(n)?,
                    other => return Err(Error::not_supported(format!("INSERT INTO {other}"))),
                };
                if i.on.is_some() || i.returning.is_some() {
                    return Err(Error::not_supported(
                        "INSERT ... ON CONFLICT and RETURNING are not supported",
                    ));
                }
                db.dml(&table, stmt, params, &self.settings).await
            }
            Ast::Update(u) => {
                if u.returning.is_some() || u.from.is_some() {
                    return Err(Error::not_supported(
                        "UPDATE ... FROM and RETURNING are not supported",
                    ));
                }
                let table = target_table(&u.table.relation)?;
                db.dml(&table, stmt, params, &self.settings).await
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
                let table = target_table(&t.relation)?;
                db.dml(&table, stmt, params, &self.settings).await
            }
            Ast::Query(_) => self.bounded(db.query(stmt, params, &self.settings)).await,
            Ast::Explain { statement, .. } => match statement.as_ref() {
                Ast::CreateView(cv) if cv.materialized => db.explain_view(cv, &self.settings).await,
                _ => self.bounded(db.query(stmt, params, &self.settings)).await,
            },
            Ast::StartTransaction { .. } => Ok(Output::TransactionStart),
            Ast::Commit { .. } => Ok(Output::TransactionEnd {
                tag: "COMMIT".into(),
            }),
            Ast::Rollback { .. } => Ok(Output::TransactionEnd {
                tag: "ROLLBACK".into(),
            }),
            Ast::Set(set) => self.set(set),
            Ast::ShowVariable { variable } => self.show(variable),
            Ast::Discard { .. } => Ok(Output::command("DISCARD ALL")),
            Ast::Deallocate { .. } => Ok(Output::command("DEALLOCATE")),
            other => Err(Error::not_supported(format!(
                "statement is not supported: {}",
                first_words(&other.to_string())
            ))),
        }
    }

    fn set(&mut self, set: &ast::Set) -> Result<Output> {
        match set {
            ast::Set::SingleAssignment {
                variable, values, ..
            } => {
                let name = variable.to_string().to_lowercase();
                let value = values
                    .iter()
                    .map(setting_value)
                    .collect::<Vec<_>>()
                    .join(", ");
                self.assign(&name, value)?;
            }
            ast::Set::SetTimeZone { value, .. } => self.assign("timezone", setting_value(value))?,
            ast::Set::SetTransaction { .. } => {}
            ast::Set::SetNames { charset_name, .. } => {
                self.assign("client_encoding", charset_name.value.clone())?
            }
            other => return Err(Error::not_supported(format!("{other} is not supported"))),
        }
        Ok(Output::command("SET"))
    }

    fn assign(&mut self, name: &str, value: String) -> Result<()> {
        let value = if value.eq_ignore_ascii_case("default") {
            if name == "streaming_parallelism" {
                let n = self.db.config.streaming_parallelism.max(1);
                self.settings.insert(name.to_string(), n.to_string());
                return Ok(());
            }
            if name == "read_after_write" {
                let on = on_off(self.db.config.read_after_write);
                self.settings.insert(name.to_string(), on.to_string());
                return Ok(());
            }
            match default_settings().get(name) {
                Some(v) => v.clone(),
                None => return Ok(()),
            }
        } else {
            value
        };
        if let Some(allowed) = fixed_setting(name) {
            if !allowed.contains(&value.to_lowercase().as_str()) {
                return Err(Error::new(
                    ErrorKind::InvalidParameter,
                    format!("invalid value for parameter \"{name}\": \"{value}\""),
                )
                .with_hint(format!(
                    "Weir supports only {} for {name}.",
                    default_settings().get(name).cloned().unwrap_or_default()
                )));
            }
            return Ok(());
        }
        if name == "streaming_parallelism" {
            crate::db::parse_parallelism(&value)?;
        }
        if name == "statement_timeout" {
            parse_timeout(&value)?;
        }
        if name == "read_after_write" {
            let on = parse_bool(name, &value)?;
            self.settings
                .insert(name.to_string(), on_off(on).to_string());
            return Ok(());
        }
        // Unknown settings are kept (and shown back) like PostgreSQL's custom settings;
        // read-only ones are refused.
        if matches!(
            name,
            "server_version"
                | "server_version_num"
                | "server_encoding"
                | "integer_datetimes"
                | "max_identifier_length"
                | "is_superuser"
                | "in_hot_standby"
        ) {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("parameter \"{name}\" cannot be changed"),
            ));
        }
        self.settings.insert(name.to_string(), value);
        Ok(())
    }

    fn show(&self, variable: &[ast::Ident]) -> Result<Output> {
        let words: Vec<String> = variable.iter().map(|i| i.value.to_lowercase()).collect();
        let name = match words.join(" ").as_str() {
            "transaction isolation level" => "transaction_isolation".to_string(),
            "time zone" => "timezone".to_string(),
            other => other.replace(' ', "_"),
        };
        if name == "all" {
            let mut pairs: Vec<Vec<String>> = self
                .settings
                .iter()
                .map(|(k, v)| vec![k.clone(), v.clone()])
                .collect();
            pairs.sort();
            return text_rows(&["name", "setting"], pairs);
        }
        let value = self.settings.get(&name).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedObject,
                format!("unrecognized configuration parameter \"{name}\""),
            )
        })?;
        let schema = Arc::new(Schema::new(vec![Field::new(&name, DataType::Utf8, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec![value]))],
        )?;
        Ok(Output::Rows {
            schema,
            batches: vec![batch],
        })
    }

    /// The parameter types and result columns of a statement, without running it.
    pub async fn describe(&self, parsed: &Parsed) -> Result<Description> {
        let none = |columns: Option<SchemaRef>| Description {
            parameters: vec![],
            columns,
        };
        let stmt = match &parsed.statement {
            Statement::Sql(s) => s,
            Statement::Flush => return Ok(none(None)),
            Statement::Checkpoint { .. } => return Ok(none(Some(crate::db::checkpoint_schema()))),
            Statement::ShowCheckpoints => {
                return Ok(none(rows_schema(self.db.show_checkpoints()?)))
            }
            // These answer rows; run them to learn their shape (they are cheap and read-only).
            Statement::ShowTables => {
                return Ok(none(rows_schema(self.db.show_names(Kind::Table)?)))
            }
            Statement::ShowMaterializedViews => {
                return Ok(none(rows_schema(self.db.show_views()?)))
            }
            Statement::ShowCreateMaterializedView(name) => {
                return Ok(none(rows_schema(self.db.show_create_view(name)?)))
            }
            Statement::ShowSources => {
                return Ok(none(rows_schema(self.db.show_names(Kind::Source)?)))
            }
            Statement::ShowSinks => return Ok(none(rows_schema(self.db.show_names(Kind::Sink)?))),
            Statement::CreateTable { .. }
            | Statement::CreateSource { .. }
            | Statement::CreateView(_)
            | Statement::CreateSink(_)
            | Statement::Drop { .. } => return Ok(none(None)),
        };
        crate::sql::check_supported(stmt)?;
        if let Ast::Explain { statement, .. } = stmt.as_ref() {
            if let Ast::CreateView(cv) = statement.as_ref() {
                return Ok(none(rows_schema(
                    self.db.explain_view(cv, &self.settings).await?,
                )));
            }
        }
        match stmt.as_ref() {
            Ast::Query(_) | Ast::Explain { .. } => {
                let (_, plan) = self.db.plan_query(stmt, &self.settings).await?;
                Ok(Description {
                    parameters: parameter_types(&plan)?,
                    columns: Some(crate::db::result_schema(&plan)),
                })
            }
            Ast::Insert(_) | Ast::Update(_) | Ast::Delete(_) => {
                let (_, plan) = self.db.plan_statement(stmt, &self.settings).await?;
                Ok(Description {
                    parameters: parameter_types(&plan)?,
                    columns: None,
                })
            }
            Ast::ShowVariable { variable } => Ok(none(rows_schema(self.show(variable)?))),
            _ => Ok(none(None)),
        }
    }
}

/// The columns of an answer, if it has rows.
fn rows_schema(out: Output) -> Option<SchemaRef> {
    match out {
        Output::Rows { schema, .. } | Output::Stream { schema, .. } => Some(schema),
        _ => None,
    }
}

fn cancelled_by_user() -> Error {
    Error::new(
        ErrorKind::QueryCanceled,
        "canceling statement due to user request",
    )
}

fn hung_up_error() -> Error {
    Error::new(
        ErrorKind::QueryCanceled,
        "canceling statement: the client closed its connection",
    )
}

fn cancelled_by_timeout() -> Error {
    Error::new(
        ErrorKind::QueryCanceled,
        "canceling statement due to statement timeout",
    )
}

/// A query's rows, ended with 57014 when the session's query is cancelled, its
/// `statement_timeout` passes or its client hangs up while they are computed or sent.
struct Interruptible {
    rows: RowStream,
    cancelled: std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    hung_up: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    done: bool,
}

impl futures::Stream for Interruptible {
    type Item = Result<RecordBatch>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future;
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let interrupted = if this.cancelled.as_mut().poll(cx).is_ready() {
            Some(cancelled_by_user())
        } else if this
            .deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready())
        {
            Some(cancelled_by_timeout())
        } else if this.hung_up.as_mut().poll(cx).is_ready() {
            Some(hung_up_error())
        } else {
            None
        };
        if let Some(e) = interrupted {
            this.done = true;
            return Poll::Ready(Some(Err(e)));
        }
        let next = this.rows.as_mut().poll_next(cx);
        if matches!(next, Poll::Ready(None)) {
            this.done = true;
        }
        next
    }
}

/// The most parameters a statement can have: a Bind message counts its values in 16 bits.
pub const PARAMETERS_MAX: usize = 65_535;

/// The types of `$1, $2, ...` as DataFusion inferred them (text where it could not).
fn parameter_types(plan: &LogicalPlan) -> Result<Vec<DataType>> {
    let types = plan.get_parameter_types()?;
    let mut numbered: Vec<(usize, DataType)> = Vec::new();
    for (name, t) in types {
        let n = match name.strip_prefix('$').map(str::parse::<u64>) {
            Some(Ok(0)) => {
                return Err(Error::new(
                    ErrorKind::UndefinedParameter,
                    "there is no parameter $0",
                ))
            }
            Some(Ok(n)) if n <= PARAMETERS_MAX as u64 => n as usize,
            Some(Ok(n)) => {
                return Err(Error::new(
                    ErrorKind::ProgramLimitExceeded,
                    format!(
                        "parameter ${n} is past the most a statement can have \
                         ({PARAMETERS_MAX})"
                    ),
                ))
            }
            _ => return Err(Error::syntax(format!("bad parameter name {name}"))),
        };
        numbered.push((n, t.unwrap_or(DataType::Utf8)));
    }
    numbered.sort_by_key(|(n, _)| *n);
    let count = numbered.last().map(|(n, _)| *n).unwrap_or(0);
    let mut out = vec![DataType::Utf8; count];
    for (n, t) in numbered {
        out[n - 1] = t;
    }
    Ok(out)
}

fn target_table(rel: &ast::TableFactor) -> Result<String> {
    match rel {
        ast::TableFactor::Table { name, .. } => relation_name(name),
        other => Err(Error::not_supported(format!("cannot change {other}"))),
    }
}

fn setting_value(e: &ast::Expr) -> String {
    match e {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) | ast::Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        },
        ast::Expr::Identifier(i) => i.value.clone(),
        other => other.to_string(),
    }
}

fn first_words(s: &str) -> String {
    s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// A Boolean setting as PostgreSQL reads one: `on`, `off`, `true`, `false`, `yes`, `no`, `1`,
/// `0`, or a unique prefix of the words (any case).
fn parse_bool(name: &str, value: &str) -> Result<bool> {
    let v = value.trim().to_lowercase();
    let is = |word: &str, shortest: usize| v.len() >= shortest && word.starts_with(v.as_str());
    if v == "1" || is("true", 1) || is("yes", 1) || is("on", 2) {
        Ok(true)
    } else if v == "0" || is("false", 1) || is("no", 1) || is("off", 2) {
        Ok(false)
    } else {
        Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("parameter \"{name}\" requires a Boolean value"),
        ))
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// The longest `statement_timeout` PostgreSQL accepts: 2^31 - 1 milliseconds.
const TIMEOUT_MAX_MS: u64 = i32::MAX as u64;

/// A `statement_timeout` as PostgreSQL reads it: milliseconds, or a number with a unit (`us`,
/// `ms`, `s`, `min`, `h`, `d`); 0 turns it off.
pub fn parse_timeout(value: &str) -> Result<std::time::Duration> {
    let invalid = |hint: &str| {
        Error::new(
            ErrorKind::InvalidParameter,
            format!("invalid value for parameter \"statement_timeout\": \"{value}\""),
        )
        .with_hint(hint.to_string())
    };
    let text = value.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| {
        invalid(
            "Valid units for this parameter are \"us\", \"ms\", \"s\", \"min\", \"h\", and \"d\".",
        )
    })?;
    let ms_per_unit = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return Err(invalid(
            "Valid units for this parameter are \"us\", \"ms\", \"s\", \"min\", \"h\", and \"d\".",
        )),
    };
    let ms = (number * ms_per_unit).round();
    if !(0.0..=TIMEOUT_MAX_MS as f64).contains(&ms) {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!(
                "{ms} ms is outside the valid range for parameter \"statement_timeout\" (0 .. {TIMEOUT_MAX_MS})"
            ),
        ));
    }
    Ok(std::time::Duration::from_millis(ms as u64))
}
