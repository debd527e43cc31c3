//! `connector = 'postgres'`: a view's rows kept in a PostgreSQL table. Each checkpoint's share
//! of the sink's log goes in one target transaction, which also sets the sink's row of
//! `weir_sink_progress` to the checkpoint's epoch: a restart asks that row what the target
//! holds, and the target never holds a checkpoint twice or half of one
//! (`docs/design/0014-sink-log.md`).
//!
//! FORMAT UPSERT (the default when the sink has a key) applies each chunk of changes as its
//! net effect per key: the keys whose last change deletes them in one `DELETE ... USING`, the
//! others in one `INSERT ... ON CONFLICT DO UPDATE`, both from a temporary table filled by
//! `COPY`. FORMAT PLAIN copies the inserted rows into the table. The target table is created
//! at `CREATE SINK` when it does not exist, from the view's columns and key.

use std::collections::BTreeMap;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use futures::SinkExt;
use tokio_postgres::Client;

use super::{Format, Net, Options, Spec};
use crate::connector::postgres::{self, Endpoint};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Op, SinkWriter, StreamChunk};
use crate::wait;

/// `connector = 'postgres'`.
pub struct Postgres;

/// The target table, as its options name it and its columns are.
#[derive(Debug, Clone)]
struct Target {
    endpoint: Endpoint,
    /// The sink's name: its row in the progress table.
    sink: String,
    /// `"schema"."table"`, quoted.
    table: String,
    schema_name: String,
    table_name: String,
    /// The view's columns, quoted, and their PostgreSQL types.
    columns: Vec<String>,
    types: Vec<&'static str>,
    key: Vec<usize>,
    format: Format,
}

const ROLE: &str = "target PostgreSQL";

const PROGRESS: &str = "CREATE TABLE IF NOT EXISTS public.weir_sink_progress \
     (sink text PRIMARY KEY, checkpoint_epoch bigint NOT NULL)";

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

fn failed(what: &str) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
    move |e| postgres::error(ROLE, what, e)
}

impl Target {
    fn read(name: &str, options: &mut Options, spec: &Spec, schema: &SchemaRef) -> Result<Target> {
        let endpoint = Endpoint::read(options, "a postgres sink")?;
        let table = options.take("table.name").ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidParameter,
                "a postgres sink needs table.name",
            )
        })?;
        let (schema_name, table_name) = match table.split_once('.') {
            Some((s, t)) => (s.to_string(), t.to_string()),
            None => ("public".to_string(), table),
        };
        if spec.format == Format::Debezium {
            return Err(Error::not_supported(
                "a postgres sink takes FORMAT UPSERT or PLAIN, not DEBEZIUM",
            ));
        }
        Ok(Target {
            endpoint,
            sink: name.to_string(),
            table: format!("{}.{}", quote(&schema_name), quote(&table_name)),
            schema_name,
            table_name,
            columns: schema.fields().iter().map(|f| quote(f.name())).collect(),
            types: schema
                .fields()
                .iter()
                .map(|f| crate::types::pg_type_of(f.data_type()).name)
                .collect(),
            key: spec.key.clone(),
            format: spec.format,
        })
    }

    /// The view's columns as a CREATE TABLE lists them: `"name" type`.
    fn column_defs(&self) -> Vec<String> {
        (self.columns.iter().zip(&self.types))
            .map(|(c, t)| format!("{c} {t}"))
            .collect()
    }

    fn kept(&self) -> Vec<(String, String)> {
        let mut kept = self.endpoint.kept();
        kept.push((
            "table.name".into(),
            format!("{}.{}", self.schema_name, self.table_name),
        ));
        kept
    }

    /// The table's columns in the target, by name (none: no such table).
    async fn existing_columns(&self, client: &Client) -> Result<Vec<String>> {
        let rows = client
            .query(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = $1 AND table_name = $2",
                &[&self.schema_name, &self.table_name],
            )
            .await
            .map_err(failed("the target table's columns"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Creates the table when it does not exist, or checks that it has the view's columns
    /// and, for UPSERT, a unique index on exactly the key.
    async fn prepare(&self, client: &Client) -> Result<()> {
        client
            .batch_execute(PROGRESS)
            .await
            .map_err(failed("create weir_sink_progress"))?;
        // A new sink starts over, whatever a dropped one of the same name delivered.
        client
            .execute(
                "DELETE FROM public.weir_sink_progress WHERE sink = $1",
                &[&self.sink],
            )
            .await
            .map_err(failed("reset the sink's progress"))?;
        let existing = self.existing_columns(client).await?;
        if existing.is_empty() {
            let mut defs = self.column_defs();
            if !self.key.is_empty() {
                let key: Vec<&str> = self.key.iter().map(|k| self.columns[*k].as_str()).collect();
                defs.push(format!("PRIMARY KEY ({})", key.join(", ")));
            }
            let sql = format!("CREATE TABLE {} ({})", self.table, defs.join(", "));
            client
                .batch_execute(&sql)
                .await
                .map_err(failed("create the target table"))?;
            return Ok(());
        }
        for c in &self.columns {
            let name = &c[1..c.len() - 1].replace("\"\"", "\"");
            if !existing.contains(name) {
                return Err(Error::new(
                    ErrorKind::UndefinedColumn,
                    format!(
                        "target table {} has no column \"{name}\", which the sink sends",
                        self.table
                    ),
                ));
            }
        }
        if self.format == Format::Upsert {
            let mut key: Vec<String> = self
                .key
                .iter()
                .map(|k| self.columns[*k][1..self.columns[*k].len() - 1].replace("\"\"", "\""))
                .collect();
            key.sort();
            let unique = client
                .query(
                    "SELECT 1 FROM pg_index i WHERE i.indrelid = $1::text::regclass \
                     AND i.indisunique AND (SELECT array_agg(a.attname::text ORDER BY \
                     a.attname::text) FROM pg_attribute a WHERE a.attrelid = i.indrelid \
                     AND a.attnum = ANY(i.indkey)) = $2::text[]",
                    &[&self.table, &key],
                )
                .await
                .map_err(failed("the target table's indexes"))?;
            if unique.is_empty() {
                return Err(Error::new(
                    ErrorKind::InvalidColumnReference,
                    format!(
                        "target table {} has no primary key or unique index on ({})",
                        self.table,
                        key.join(", ")
                    ),
                )
                .with_hint("FORMAT UPSERT writes each key's row with ON CONFLICT on the key."));
            }
        }
        Ok(())
    }
}

impl super::Connector for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    /// `sslrootcert`, the certificate authorities' file, is the server's.
    fn server_paths<'a>(&self, kept: &'a BTreeMap<String, String>) -> Vec<&'a str> {
        kept.get("sslrootcert")
            .map(String::as_str)
            .into_iter()
            .collect()
    }

    fn default_format(&self, keyed: bool) -> Option<Format> {
        Some(if keyed { Format::Upsert } else { Format::Plain })
    }

    fn create(
        &self,
        name: &str,
        options: &mut Options,
        spec: &Spec,
        schema: &SchemaRef,
    ) -> Result<Vec<(String, String)>> {
        let target = Target::read(name, options, spec, schema)?;
        wait(async {
            let client = postgres::connect(&target.endpoint, ROLE).await?;
            target.prepare(&client).await
        })?;
        Ok(target.kept())
    }

    fn open(
        &self,
        name: &str,
        options: &BTreeMap<String, String>,
        spec: &Spec,
        schema: &SchemaRef,
    ) -> Result<Box<dyn SinkWriter>> {
        let mut options = Options::kept(options).of_sink();
        let target = Target::read(name, &mut options, spec, schema)?;
        Ok(Box::new(Writer {
            target,
            client: None,
            skip: false,
        }))
    }
}

/// Delivers a sink's checkpoints into its table.
struct Writer {
    target: Target,
    /// The connection, while it works; a failure drops it (and with it an open transaction).
    client: Option<Client>,
    /// The open delivery is of a checkpoint the target holds already.
    skip: bool,
}

/// The staging table of an UPSERT sink's connection (temporary: each connection has its own).
const STAGE: &str = "weir_sink_stage";

impl Writer {
    async fn client(&mut self) -> Result<&Client> {
        if self.client.is_none() {
            let client = postgres::connect(&self.target.endpoint, ROLE).await?;
            client
                .batch_execute(PROGRESS)
                .await
                .map_err(failed("create weir_sink_progress"))?;
            if self.target.format == Format::Upsert {
                let mut defs = self.target.column_defs();
                defs.push("weir_live boolean".into());
                let sql = format!("CREATE TEMPORARY TABLE {STAGE} ({})", defs.join(", "));
                client
                    .batch_execute(&sql)
                    .await
                    .map_err(failed("create the staging table"))?;
            }
            self.client = Some(client);
        }
        self.client
            .as_ref()
            .ok_or_else(|| Error::internal("no connection"))
    }

    /// COPYs `rows` (lines of PostgreSQL's text format) into `into`.
    async fn copy(&mut self, into: &str, rows: Vec<u8>) -> Result<()> {
        let client = self.client().await?;
        let sql = format!("COPY {into} FROM STDIN");
        let sink = client.copy_in(&sql).await.map_err(failed("COPY"))?;
        futures::pin_mut!(sink);
        sink.send(Bytes::from(rows)).await.map_err(failed("COPY"))?;
        sink.finish().await.map_err(failed("COPY"))?;
        Ok(())
    }

    /// Applies the net change per key of `chunk` (`net_changes`).
    async fn upsert(&mut self, chunk: &StreamChunk) -> Result<()> {
        let mut lines = Vec::new();
        for net in super::net_changes(chunk, &self.target.key)? {
            let (row, live): (usize, &[u8]) = match net {
                Net::Holds(row) => (row, b"\tt\n"),
                Net::Gone(row) => (row, b"\tf\n"),
            };
            line(&chunk.data, row, &mut lines)?;
            lines.pop();
            lines.extend_from_slice(live);
        }
        self.copy(STAGE, lines).await?;
        let t = &self.target;
        let on_key: Vec<String> = (t.key.iter())
            .map(|k| format!("t.{c} = s.{c}", c = t.columns[*k]))
            .collect();
        let updates: Vec<String> = (0..t.columns.len())
            .filter(|c| !t.key.contains(c))
            .map(|c| format!("{c} = EXCLUDED.{c}", c = t.columns[c]))
            .collect();
        let key_list: Vec<&str> = t.key.iter().map(|k| t.columns[*k].as_str()).collect();
        let conflict = match updates.is_empty() {
            true => "DO NOTHING".to_string(),
            false => format!("DO UPDATE SET {}", updates.join(", ")),
        };
        let sql = format!(
            "DELETE FROM {table} t USING {STAGE} s WHERE NOT s.weir_live AND {on_key}; \
             INSERT INTO {table} ({cols}) SELECT {cols} FROM {STAGE} WHERE weir_live \
             ON CONFLICT ({key}) {conflict}; TRUNCATE {STAGE}",
            table = t.table,
            on_key = on_key.join(" AND "),
            cols = t.columns.join(", "),
            key = key_list.join(", "),
        );
        let client = self.client().await?;
        client
            .batch_execute(&sql)
            .await
            .map_err(failed("apply the changes"))?;
        Ok(())
    }
}

/// Appends the value at `(column, row)` in COPY's text format: `\N` for NULL, backslash and
/// control characters escaped.
fn text_field(batch: &RecordBatch, column: usize, row: usize, out: &mut Vec<u8>) -> Result<()> {
    let mut value = Vec::new();
    if !crate::server::text_value(batch.column(column), row, &mut value)? {
        out.extend_from_slice(b"\\N");
        return Ok(());
    }
    for b in value {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b => out.push(b),
        }
    }
    Ok(())
}

/// Appends row `row` of `batch` as a line of COPY's text format.
fn line(batch: &RecordBatch, row: usize, out: &mut Vec<u8>) -> Result<()> {
    for c in 0..batch.num_columns() {
        if c > 0 {
            out.push(b'\t');
        }
        text_field(batch, c, row, out)?;
    }
    out.push(b'\n');
    Ok(())
}

#[async_trait::async_trait]
impl SinkWriter for Writer {
    async fn delivered(&mut self) -> Result<Option<u64>> {
        // Asked after a failure too: start on a new connection.
        self.client = None;
        let sink = self.target.sink.clone();
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT checkpoint_epoch FROM public.weir_sink_progress WHERE sink = $1",
                &[&sink],
            )
            .await
            .map_err(failed("read weir_sink_progress"))?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    async fn begin(&mut self, epoch: u64, replace: bool) -> Result<()> {
        let sink = self.target.sink.clone();
        let table = self.target.table.clone();
        let client = self.client().await?;
        client
            .batch_execute("BEGIN")
            .await
            .map_err(failed("BEGIN"))?;
        client
            .execute(
                "INSERT INTO public.weir_sink_progress VALUES ($1, 0) ON CONFLICT DO NOTHING",
                &[&sink],
            )
            .await
            .map_err(failed("weir_sink_progress"))?;
        let held: i64 = client
            .query_one(
                "SELECT checkpoint_epoch FROM public.weir_sink_progress WHERE sink = $1 \
                 FOR UPDATE",
                &[&sink],
            )
            .await
            .map_err(failed("weir_sink_progress"))?
            .get(0);
        let skip = held as u64 >= epoch;
        if replace && !skip {
            let sql = format!("DELETE FROM {}", table);
            client
                .batch_execute(&sql)
                .await
                .map_err(failed("replace the sink's earlier output"))?;
        }
        self.skip = skip;
        Ok(())
    }

    async fn write(&mut self, chunk: StreamChunk) -> Result<()> {
        if self.skip || chunk.is_empty() {
            return Ok(());
        }
        match self.target.format {
            Format::Upsert => self.upsert(&chunk).await,
            _ => {
                let mut lines = Vec::new();
                for row in 0..chunk.len() {
                    if chunk.ops[row] == Op::Insert {
                        line(&chunk.data, row, &mut lines)?;
                    }
                }
                let into = format!("{} ({})", self.target.table, self.target.columns.join(", "));
                self.copy(&into, lines).await
            }
        }
    }

    async fn commit(&mut self, epoch: u64) -> Result<()> {
        let sink = self.target.sink.clone();
        let skip = self.skip;
        let client = self.client().await?;
        if skip {
            client
                .batch_execute("ROLLBACK")
                .await
                .map_err(failed("ROLLBACK"))?;
            return Ok(());
        }
        let epoch = i64::try_from(epoch).map_err(|_| Error::internal("epoch out of range"))?;
        client
            .execute(
                "UPDATE public.weir_sink_progress SET checkpoint_epoch = $2 WHERE sink = $1",
                &[&sink, &epoch],
            )
            .await
            .map_err(failed("weir_sink_progress"))?;
        crate::failpoint::reach("sink.postgres.before_commit").await;
        client
            .batch_execute("COMMIT")
            .await
            .map_err(failed("COMMIT"))?;
        // Committed at the target, and nothing of it known to Weir yet.
        crate::failpoint::reach("sink.postgres.after_commit").await;
        Ok(())
    }
}
