//! How a statement's answer goes on the wire: its `Output` as pgwire's response, and a
//! query's rows sent as they come, flushed whenever the next are not ready yet (a
//! subscription's next epoch), so that a client sees each row Weir has.

use std::fmt::Debug;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use futures::{stream, Sink, SinkExt, StreamExt};
use pgwire::api::portal::Format;
use pgwire::api::results::{FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::Type;
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;

use super::encode::{data_rows, Encoding};
use super::handler::to_pgwire;
use crate::db::Output;
use crate::error::{Error, Result};
use crate::types::pg_type_of;

pub fn pg_type(t: &DataType) -> Type {
    Type::from_oid(pg_type_of(t).oid).unwrap_or(Type::TEXT)
}

/// Each column's description: name, type, and for a relation's column read unchanged, the
/// relation's OID, the column's number and its declared type and modifier
/// (`sql::result_schema`'s metadata), as PostgreSQL describes it.
pub fn field_infos(schema: &SchemaRef, format: Option<&Format>) -> Vec<FieldInfo> {
    use crate::sql::{ATTNUM, TABLE_OID, TYPE_OID, TYPMOD};
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let fmt = format.map(|f| f.format_for(i)).unwrap_or(FieldFormat::Text);
            let meta = |key: &str| f.metadata().get(key).and_then(|v| v.parse::<i64>().ok());
            // An OID is unsigned; the message carries its 32 bits.
            let table = (meta(TABLE_OID).and_then(|v| u32::try_from(v).ok())).map(|v| v as i32);
            let column = meta(ATTNUM).and_then(|v| i16::try_from(v).ok());
            let declared = meta(TYPE_OID)
                .and_then(|oid| Type::from_oid(u32::try_from(oid).ok()?))
                .filter(|t| travels_as(t, &pg_type(f.data_type())));
            let datatype = declared.unwrap_or_else(|| pg_type(f.data_type()));
            let mut info = FieldInfo::new(f.name().clone(), table, column, datatype, fmt);
            if let Some(typmod) = meta(TYPMOD).and_then(|v| i32::try_from(v).ok()) {
                info = info.with_type_modifier(typmod);
            }
            info
        })
        .collect()
}

/// Whether values of the type `natural` (the one their Arrow type maps to) are sent as they
/// are as values of the declared type `declared`: `varchar`, `name`, `"char"`, `json` and
/// `pg_node_tree` are text, `xid` an OID, `int2vector` and `oidvector` arrays (with a text of
/// their own, `encodings`). The catalog's columns of types whose values Weir never has (ACLs,
/// `"char"` arrays, `anyarray`, `bytea` trigger arguments) are NULL in every row, which the
/// catalog's builder ensures, so they are described as PostgreSQL describes them.
fn travels_as(declared: &Type, natural: &Type) -> bool {
    let never_valued = [
        Type::ACLITEM_ARRAY,
        Type::CHAR_ARRAY,
        Type::ANYARRAY,
        Type::BYTEA,
    ];
    declared == natural
        || *declared == Type::VARCHAR
        || (*natural == Type::TEXT
            && ([Type::NAME, Type::CHAR, Type::PG_NODE_TREE, Type::JSON].contains(declared)
                || never_valued.contains(declared)))
        || (*natural == Type::TEXT_ARRAY && never_valued.contains(declared))
        || (*natural == Type::OID && *declared == Type::XID)
        || (*natural == Type::INT2_ARRAY && *declared == Type::INT2_VECTOR)
        || (*natural == Type::OID_ARRAY && *declared == Type::OID_VECTOR)
}

/// How each of `fields`' values is sent: in binary where the client asked for it, as a
/// vector's text for `int2vector` and `oidvector`, else as text.
fn encodings(fields: &[FieldInfo]) -> Vec<Encoding> {
    (fields.iter())
        .map(|f| match f.format() {
            FieldFormat::Binary => Encoding::Binary,
            FieldFormat::Text if [Type::INT2_VECTOR, Type::OID_VECTOR].contains(f.datatype()) => {
                Encoding::VectorText
            }
            FieldFormat::Text => Encoding::Text,
        })
        .collect()
}

pub fn to_response(output: Output, format: Option<&Format>) -> Result<Response> {
    Ok(match output {
        Output::Rows { schema, batches } => {
            let fields = Arc::new(field_infos(&schema, format));
            let rows = data_rows(&batches, &encodings(&fields))?;
            Response::Query(QueryResponse::new(
                fields,
                stream::iter(rows.into_iter().map(Ok)),
            ))
        }
        Output::Fetched { schema, batches } => {
            let rows = Output::Rows { schema, batches };
            let Response::Query(mut response) = to_response(rows, format)? else {
                return Err(Error::internal("rows answered as something else"));
            };
            response.set_command_tag("FETCH");
            Response::Query(response)
        }
        Output::Stream { schema, rows } => {
            let fields = Arc::new(field_infos(&schema, format));
            let encodings = encodings(&fields);
            // One batch is encoded at a time, when the client is ready for it.
            let rows = rows.flat_map(move |batch| {
                let encoded = batch.and_then(|b| data_rows(&[b], &encodings));
                match encoded {
                    Ok(rows) => stream::iter(rows.into_iter().map(Ok)).left_stream(),
                    Err(e) => stream::once(async { Err(to_pgwire(e)) }).right_stream(),
                }
            });
            Response::Query(QueryResponse::new(fields, rows))
        }
        Output::Command { tag, rows } => {
            let mut t = Tag::new(&tag);
            if let Some(n) = rows {
                t = t.with_rows(n);
            }
            Response::Execution(t)
        }
        Output::TransactionStart => Response::TransactionStart(Tag::new("BEGIN")),
        Output::TransactionEnd { tag } => Response::TransactionEnd(Tag::new(&tag)),
        Output::CopyOut {
            columns,
            rows,
            format,
        } => super::copy::response(columns, rows, format),
        // Answered by the handler, which keeps the COPY in progress.
        Output::CopyIn(_) => {
            return Err(Error::internal(
                "COPY FROM STDIN answered without its handler",
            ))
        }
    })
}

/// How far `send_rows` got.
pub enum Sent {
    /// Every row, this many in this call.
    All(usize),
    /// As many as the limit: more may follow.
    Part,
    /// A row could not be computed or encoded (the rows before it were sent).
    Failed(Box<ErrorInfo>),
}

/// Sends a query's rows as they come, up to `max_rows` (0: all). Each row is fed to the
/// connection, which writes once its buffer fills: a client that stops reading holds the
/// query back instead of letting rows pile up in memory.
pub async fn send_rows<C>(
    client: &mut C,
    results: &mut QueryResponse,
    max_rows: usize,
) -> PgWireResult<Sent>
where
    C: Sink<PgWireBackendMessage> + Unpin,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let rows = results.data_rows();
    let mut sent = 0;
    while max_rows == 0 || sent < max_rows {
        // What is ready goes out before Weir waits for more (a subscription's next epoch).
        let next = match futures::poll!(rows.next()) {
            std::task::Poll::Ready(next) => next,
            std::task::Poll::Pending => {
                client.flush().await?;
                rows.next().await
            }
        };
        match next {
            None => return Ok(Sent::All(sent)),
            Some(Ok(row)) => {
                client.feed(PgWireBackendMessage::DataRow(row)).await?;
                sent += 1;
            }
            Some(Err(PgWireError::UserError(info))) => return Ok(Sent::Failed(info)),
            Some(Err(e)) => return Err(e),
        }
    }
    Ok(Sent::Part)
}
