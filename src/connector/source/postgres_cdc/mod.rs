//! `connector = 'postgres-cdc'`: a PostgreSQL database's changes, read from a logical
//! replication slot (`pgoutput`), feeding the tables created `FROM` the source
//! (`docs/design/0013-postgres-cdc.md`). The source is a slot and a publication, created at
//! `CREATE SOURCE` when missing; each table checks its upstream table (columns, types, key,
//! replica identity) at `CREATE TABLE ... FROM source TABLE 'schema.table'` and is added to the
//! publication. One task per source (`stream`) feeds every table each upstream transaction
//! together, every table's position the transaction's end LSN; snapshots come a chunk at a
//! time between watermarks (`snapshot`). The slot is told an LSN only once a checkpoint that
//! holds it is durable.
//!
//! `config` reads the options, `protocol` speaks the replication protocol, `pgoutput` decodes
//! its messages, `upstream` asks the database on a plain connection, `types` reads its values,
//! `tables` keeps each table's columns and position.
//!
//! TODO (issue 23): TLS to the upstream (`sslmode`). An update that leaves out an unchanged
//! TOASTed value takes it from the old row under `REPLICA IDENTITY FULL` and stops the table
//! otherwise; it could take it from the table's own row instead (in its `Upsert`).

mod config;
mod pgoutput;
mod protocol;
mod snapshot;
mod stream;
mod tables;
mod types;
mod upstream;

use std::collections::BTreeMap;
use std::path::Path;

use futures::future::BoxFuture;

use self::config::Config;
use super::{Keep, Options, Shared, SharedContext, Start};
use crate::catalog::{ColumnDef, ObjectId, SourceDef};
use crate::error::{Error, ErrorKind, Result};
use crate::wait;

/// Reads PostgreSQL's changes.
pub struct PostgresCdc;

impl super::Connector for PostgresCdc {
    fn name(&self) -> &'static str {
        "postgres-cdc"
    }

    /// `sslrootcert`, the certificate authorities' file, is the server's.
    fn server_paths<'a>(&self, kept: &'a BTreeMap<String, String>) -> Vec<&'a str> {
        kept.get("sslrootcert")
            .map(String::as_str)
            .into_iter()
            .collect()
    }

    fn create(
        &self,
        options: &mut Options,
        declared: Vec<ColumnDef>,
        table: Option<&[usize]>,
    ) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)> {
        if table.is_some() {
            return Err(
                Error::not_supported("a postgres-cdc source feeds tables created FROM it")
                    .with_hint(
                        "CREATE SOURCE s WITH (connector = 'postgres-cdc', ...); then \
                 CREATE TABLE t (...) FROM s TABLE 'schema.table'.",
                    ),
            );
        }
        if !declared.is_empty() {
            return Err(Error::not_supported(
                "a postgres-cdc source has no columns: its tables have",
            ));
        }
        let mut config = Config::read(options)?;
        wait(async {
            let client = upstream::connect(&config.endpoint).await?;
            upstream::check_logical(&client).await?;
            config.created_publication |=
                upstream::ensure_publication(&client, &config.publication).await?;
            config.created_slot |= upstream::ensure_slot(&client, &config.slot).await?;
            Ok::<_, Error>(())
        })?;
        Ok((config.kept(), Vec::new()))
    }

    fn open(
        &self,
        def: &SourceDef,
        _start: Start<'_>,
        _keep: Option<Keep<'_>>,
    ) -> Result<Box<dyn super::Reader>> {
        Err(Error::internal(format!(
            "source \"{}\" is read by its tables' task, not a reader",
            def.name
        )))
    }

    fn check_read_again(&self, def: &SourceDef, _rows: u64) -> Result<()> {
        Err(
            Error::not_supported(format!("source \"{}\" feeds tables, not views", def.name))
                .with_hint(
                    "CREATE TABLE t (...) FROM the source TABLE 'schema.table', and a view over t.",
                ),
        )
    }

    fn forget(&self, _dir: &Path, _id: ObjectId) -> Result<()> {
        Ok(())
    }

    fn shared(&self) -> Option<&'static dyn Shared> {
        Some(&PostgresCdc)
    }
}

impl Shared for PostgresCdc {
    fn create_table(
        &self,
        source: SourceDef,
        name: String,
        columns: Vec<ColumnDef>,
        key: Vec<usize>,
    ) -> BoxFuture<'static, Result<BTreeMap<String, String>>> {
        Box::pin(async move {
            let config = Config::read(&mut Options::kept(&source.connector.options))?;
            let client = upstream::connect(&config.endpoint).await?;
            let table = upstream::describe(&client, &name).await?;
            check_table(&table, &columns, &key)?;
            upstream::publish(&client, &config.publication, &table).await?;
            let upstream_columns: Vec<(String, u32, i32)> = table
                .columns
                .iter()
                .map(|c| (c.name.clone(), c.type_oid, c.type_modifier))
                .collect();
            Ok(BTreeMap::from([
                (
                    "table".to_string(),
                    format!("{}.{}", table.schema, table.name),
                ),
                (
                    "upstream.columns".to_string(),
                    serde_json::to_string(&upstream_columns).unwrap_or_default(),
                ),
            ]))
        })
    }

    fn run(&self, source: SourceDef, context: SharedContext) -> BoxFuture<'static, ()> {
        Box::pin(stream::run(source, context))
    }

    fn drop_source(&self, source: &SourceDef) -> BoxFuture<'static, Result<()>> {
        let options = source.connector.options.clone();
        Box::pin(async move {
            let config = Config::read(&mut Options::kept(&options))?;
            let client = upstream::connect(&config.endpoint).await?;
            let publication = config
                .created_publication
                .then_some(config.publication.as_str());
            upstream::drop_source(&client, &config.slot, publication).await
        })
    }
}

/// Checks a table's declared columns and key against its upstream table's.
fn check_table(
    table: &upstream::UpstreamTable,
    columns: &[ColumnDef],
    key: &[usize],
) -> Result<()> {
    let name = format!("{}.{}", table.schema, table.name);
    for c in columns {
        let Some(u) = table.columns.iter().find(|u| u.name == c.name) else {
            return Err(Error::new(
                ErrorKind::UndefinedColumn,
                format!(
                    "column \"{}\" does not exist in upstream table {name}",
                    c.name
                ),
            ));
        };
        if !types::reads(c.ty, u.type_oid, u.type_modifier) {
            return Err(Error::new(
                ErrorKind::TypeMismatch,
                format!(
                    "column \"{}\" is {} here but {} in upstream table {name}",
                    c.name, c.ty, u.type_name
                ),
            ));
        }
    }
    let declared: Vec<&str> = key.iter().map(|k| columns[*k].name.as_str()).collect();
    let upstream: Vec<&str> = table.key.iter().map(String::as_str).collect();
    if declared != upstream {
        return Err(Error::new(
            ErrorKind::InvalidTableDefinition,
            format!(
                "the primary key ({}) is not upstream table {name}'s ({})",
                declared.join(", "),
                upstream.join(", ")
            ),
        )
        .with_hint("Declare the upstream table's primary key: its changes come by that key."));
    }
    match table.replica_identity {
        b'd' | b'f' => Ok(()),
        other => Err(Error::new(
            ErrorKind::ObjectNotInPrerequisiteState,
            format!(
                "upstream table {name} has REPLICA IDENTITY {}: its deletes would not say their key",
                if other == b'n' { "NOTHING" } else { "USING INDEX" }
            ),
        )
        .with_hint("ALTER TABLE ... REPLICA IDENTITY DEFAULT upstream.")),
    }
}
