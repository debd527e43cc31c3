//! What a CDC source asks of the upstream database on a plain connection (tokio-postgres):
//! its settings, the publication and the slot, a table's columns and key, snapshot chunks, and
//! the watermarks that bound them in the WAL.

use tokio_postgres::Client;

use super::pgoutput::Lsn;
use super::protocol::Endpoint;
use crate::connector::postgres;
use crate::error::{Error, ErrorKind, Result};

/// The prefix of the logical messages that mark a snapshot chunk's bounds in the WAL.
pub const WATERMARK_PREFIX: &str = "weir";

/// An upstream that cannot be reached (08001), or an error it answered.
pub fn upstream_error(what: &str, e: tokio_postgres::Error) -> Error {
    postgres::error("upstream PostgreSQL", what, e)
}

/// A plain connection to the upstream.
pub async fn connect(to: &Endpoint) -> Result<Client> {
    postgres::connect(to, "upstream PostgreSQL").await
}

/// Refuses an upstream whose WAL carries no logical decoding.
pub async fn check_logical(client: &Client) -> Result<()> {
    let level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(|e| upstream_error("wal_level", e))?
        .get(0);
    if level != "logical" {
        return Err(Error::new(
            ErrorKind::ObjectNotInPrerequisiteState,
            format!("upstream PostgreSQL has wal_level = {level}, not logical"),
        )
        .with_hint("Set wal_level = logical in postgresql.conf and restart it."));
    }
    Ok(())
}

/// Creates the publication when it is missing; whether it did.
pub async fn ensure_publication(client: &Client, name: &str) -> Result<bool> {
    let exists = client
        .query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&name])
        .await
        .map_err(|e| upstream_error("publication", e))?
        .is_some();
    if exists {
        return Ok(false);
    }
    client
        .batch_execute(&format!("CREATE PUBLICATION {name}"))
        .await
        .map_err(|e| upstream_error("CREATE PUBLICATION", e))?;
    Ok(true)
}

/// Creates the logical replication slot (pgoutput) when it is missing; whether it did.
pub async fn ensure_slot(client: &Client, name: &str) -> Result<bool> {
    let plugin: Option<String> = client
        .query_opt(
            "SELECT plugin FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| upstream_error("replication slot", e))?
        .map(|r| r.get(0));
    match plugin.as_deref() {
        Some("pgoutput") => Ok(false),
        Some(other) => Err(Error::new(
            ErrorKind::ObjectNotInPrerequisiteState,
            format!("replication slot \"{name}\" decodes with {other}, not pgoutput"),
        )),
        None => {
            client
                .query_one(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&name],
                )
                .await
                .map_err(|e| upstream_error("creating the replication slot", e))?;
            Ok(true)
        }
    }
}

/// An upstream table as its catalog describes it.
#[derive(Debug, Clone)]
pub struct UpstreamTable {
    pub schema: String,
    pub name: String,
    /// Each column, in order.
    pub columns: Vec<UpstreamColumn>,
    /// The primary key's columns, in the key's order.
    pub key: Vec<String>,
    /// `d` default, `n` nothing, `f` full, `i` an index.
    pub replica_identity: u8,
}

/// A column of an upstream table.
#[derive(Debug, Clone)]
pub struct UpstreamColumn {
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
    /// Its type as PostgreSQL writes it (`numeric(10,2)`).
    pub type_name: String,
}

impl UpstreamTable {
    /// The table's name quoted and qualified, for SQL.
    pub fn qualified(&self) -> String {
        format!("{}.{}", quote(&self.schema), quote(&self.name))
    }
}

/// Splits `schema.table` (or `table`, in `public`).
pub fn split_name(name: &str) -> (String, String) {
    match name.split_once('.') {
        Some((s, t)) => (s.to_string(), t.to_string()),
        None => ("public".to_string(), name.to_string()),
    }
}

/// Reads an upstream table's columns, key and replica identity.
pub async fn describe(client: &Client, name: &str) -> Result<UpstreamTable> {
    let (schema, table) = split_name(name);
    let row = client
        .query_opt(
            "SELECT c.oid, c.relreplident::text, c.relkind::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table],
        )
        .await
        .map_err(|e| upstream_error("describing the table", e))?
        .ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedTable,
                format!("upstream table \"{schema}.{table}\" does not exist"),
            )
        })?;
    let oid: u32 = row.get(0);
    let identity: String = row.get(1);
    let kind: String = row.get(2);
    if kind != "r" && kind != "p" {
        return Err(Error::new(
            ErrorKind::WrongObjectType,
            format!("upstream \"{schema}.{table}\" is not a table"),
        ));
    }
    let columns = client
        .query(
            "SELECT attname::text, atttypid, atttypmod, format_type(atttypid, atttypmod) \
             FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&oid],
        )
        .await
        .map_err(|e| upstream_error("describing the table's columns", e))?
        .iter()
        .map(|r| UpstreamColumn {
            name: r.get(0),
            type_oid: r.get(1),
            type_modifier: r.get(2),
            type_name: r.get(3),
        })
        .collect();
    let key = client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.n",
            &[&oid],
        )
        .await
        .map_err(|e| upstream_error("describing the table's key", e))?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    Ok(UpstreamTable {
        schema,
        name: table,
        columns,
        key,
        replica_identity: identity.bytes().next().unwrap_or(b'd'),
    })
}

/// An identifier quoted for SQL.
pub fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Adds a table to the publication, unless it is in it.
pub async fn publish(client: &Client, publication: &str, table: &UpstreamTable) -> Result<()> {
    let published = client
        .query_opt(
            "SELECT 1 FROM pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &table.schema, &table.name],
        )
        .await
        .map_err(|e| upstream_error("publication", e))?
        .is_some();
    if !published {
        client
            .batch_execute(&format!(
                "ALTER PUBLICATION {publication} ADD TABLE {}",
                table.qualified()
            ))
            .await
            .map_err(|e| upstream_error("ALTER PUBLICATION ... ADD TABLE", e))?;
    }
    Ok(())
}

/// Writes a watermark into the WAL (a logical message outside any transaction) and returns
/// its LSN.
pub async fn watermark(client: &Client, content: &str) -> Result<Lsn> {
    let lsn: String = client
        .query_one(
            "SELECT pg_logical_emit_message(false, $1, $2)::text",
            &[&WATERMARK_PREFIX, &content],
        )
        .await
        .map_err(|e| upstream_error("writing a snapshot watermark", e))?
        .get(0);
    lsn.parse()
}

/// The next chunk of a table's rows, by its key, after the key `after` (from the first
/// without it): at most `rows`, each column's value as text.
pub async fn chunk(
    client: &Client,
    table: &UpstreamTable,
    columns: &[String],
    after: Option<&[String]>,
    rows: u64,
) -> Result<Vec<Vec<Option<String>>>> {
    // Qualified by an alias: ORDER BY a bare name would sort by the output column, the text.
    let select: Vec<String> = columns
        .iter()
        .map(|c| format!("t.{}::text", quote(c)))
        .collect();
    let key: Vec<String> = table
        .key
        .iter()
        .map(|c| format!("t.{}", quote(c)))
        .collect();
    let mut sql = format!(
        "SELECT {} FROM {} AS t",
        select.join(", "),
        table.qualified()
    );
    let mut params: Vec<String> = Vec::new();
    if let Some(after) = after {
        // ($1::text::<type>, ...): each key value read back in its own type.
        let bounds: Vec<String> = table
            .key
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let ty = table
                    .columns
                    .iter()
                    .find(|c| &c.name == k)
                    .map_or("text", |c| c.type_name.as_str());
                format!("${}::text::{ty}", i + 1)
            })
            .collect();
        sql.push_str(&format!(
            " WHERE ({}) > ({})",
            key.join(", "),
            bounds.join(", ")
        ));
        params = after.to_vec();
    }
    sql.push_str(&format!(" ORDER BY {} LIMIT {rows}", key.join(", ")));
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
        .iter()
        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let found = client
        .query(&sql, &params)
        .await
        .map_err(|e| upstream_error("reading a snapshot chunk", e))?;
    Ok(found
        .iter()
        .map(|r| {
            (0..columns.len())
                .map(|i| r.get::<_, Option<String>>(i))
                .collect()
        })
        .collect())
}

/// How many bytes of WAL the slot holds back (since what Weir last confirmed).
pub async fn retained_bytes(client: &Client, slot: &str) -> Result<Option<i64>> {
    Ok(client
        .query_opt(
            "SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| upstream_error("the slot's retained WAL", e))?
        .and_then(|r| r.get::<_, Option<i64>>(0)))
}

/// Drops the slot (waiting, up to 5 s, for the connection that used it to let go) and, when
/// Weir created it, the publication.
pub async fn drop_source(client: &Client, slot: &str, publication: Option<&str>) -> Result<()> {
    for _ in 0..50 {
        let active: Option<bool> = client
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(|e| upstream_error("the replication slot", e))?
            .map(|r| r.get(0));
        match active {
            None => break,
            Some(false) => {
                client
                    .query_one("SELECT pg_drop_replication_slot($1)", &[&slot])
                    .await
                    .map_err(|e| upstream_error("dropping the replication slot", e))?;
                break;
            }
            Some(true) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    if let Some(p) = publication {
        client
            .batch_execute(&format!("DROP PUBLICATION IF EXISTS {p}"))
            .await
            .map_err(|e| upstream_error("DROP PUBLICATION", e))?;
    }
    Ok(())
}
