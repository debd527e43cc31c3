//! SQL cursors: `DECLARE name CURSOR FOR query` or `FOR SUBSCRIBE TO relation`, `FETCH` and
//! `MOVE` forward, `CLOSE`. As PostgreSQL's without `WITH HOLD`, a cursor lives in its
//! transaction block (DECLARE outside one is refused with 25P01) and ends with it. A query's
//! rows are computed as FETCH takes them; a subscription's never end, so FETCH waits for the
//! first row it can give and then gives only those already there, up to its count.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::ParamValues;
use datafusion::sql::sqlparser::ast::Statement as Ast;
use futures::{FutureExt, StreamExt};

use super::{Session, Transaction};
use crate::db::{Output, RowStream};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{Count, CursorQuery};

/// A declared cursor.
pub(super) struct Cursor {
    pub schema: SchemaRef,
    /// In a mutex only so that a session, which holds its cursors, can be shared between
    /// threads: a FETCH takes the cursor out and reads it through `get_mut`.
    rows: std::sync::Mutex<RowStream>,
    /// Rows of a batch that a FETCH did not take.
    left: Option<RecordBatch>,
    /// A subscription's: its rows never end.
    live: bool,
}

fn undefined(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedCursor,
        format!("cursor \"{name}\" does not exist"),
    )
}

impl Session {
    /// `DECLARE name CURSOR FOR query`.
    pub(super) async fn declare(
        &mut self,
        name: &str,
        query: &CursorQuery,
        params: Option<&ParamValues>,
    ) -> Result<Output> {
        let Transaction::Open(block) = &self.transaction else {
            return Err(Error::new(
                ErrorKind::NoActiveTransaction,
                "DECLARE CURSOR can only be used in transaction blocks",
            ));
        };
        if self.cursors.contains_key(name) {
            return Err(Error::new(
                ErrorKind::DuplicateCursor,
                format!("cursor \"{name}\" already exists"),
            ));
        }
        let (output, live) = match query {
            CursorQuery::Select(q) => {
                crate::sql::check_supported(q.as_ref())?;
                let stmt = Ast::Query(q.clone());
                let out = (self.db)
                    .query(&stmt, params, &self.settings, Some(block))
                    .await?;
                (out, false)
            }
            CursorQuery::Subscribe(s) => (
                self.db.subscribe(s, &self.settings, self.scope()).await?,
                true,
            ),
        };
        let (schema, rows): (SchemaRef, RowStream) = match output {
            Output::Stream { schema, rows } => (schema, rows),
            Output::Rows { schema, batches } => (
                schema,
                Box::pin(futures::stream::iter(batches.into_iter().map(Ok))),
            ),
            _ => return Err(Error::internal("a cursor's query gave no rows")),
        };
        let cursor = Cursor {
            schema,
            rows: std::sync::Mutex::new(rows),
            left: None,
            live,
        };
        self.cursors.insert(name.to_string(), cursor);
        Ok(Output::command("DECLARE CURSOR"))
    }

    /// `FETCH count FROM name`, or with `moves` `MOVE`: the rows are taken, and for MOVE
    /// only counted. Bounded as a query is (`statement_timeout`, cancellation).
    pub(super) async fn fetch(&mut self, name: &str, count: Count, moves: bool) -> Result<Output> {
        let mut cursor = self.cursors.remove(name).ok_or_else(|| undefined(name))?;
        let schema = cursor.schema.clone();
        let taken = self
            .bounded(async {
                let batches = take(&mut cursor, count).await?;
                Ok(Output::Fetched {
                    schema: schema.clone(),
                    batches,
                })
            })
            .await;
        self.cursors.insert(name.to_string(), cursor);
        let Output::Fetched { batches, .. } = taken? else {
            return Err(Error::internal("a FETCH gave no rows"));
        };
        if moves {
            let rows = batches.iter().map(RecordBatch::num_rows).sum();
            return Ok(Output::Command {
                tag: "MOVE".into(),
                rows: Some(rows),
            });
        }
        Ok(Output::Fetched { schema, batches })
    }

    /// The columns of cursor `name`'s rows, if the session has it.
    pub fn cursor_schema(&self, name: &str) -> Option<SchemaRef> {
        self.cursors.get(name).map(|c| c.schema.clone())
    }

    /// `CLOSE name`, or every cursor.
    pub(super) fn close_cursor(&mut self, name: Option<&str>) -> Result<Output> {
        match name {
            Some(name) => {
                self.cursors.remove(name).ok_or_else(|| undefined(name))?;
                Ok(Output::command("CLOSE CURSOR"))
            }
            None => {
                self.cursors.clear();
                Ok(Output::command("CLOSE CURSOR ALL"))
            }
        }
    }
}

/// Takes up to `count` rows from `cursor`: all it asks for from a query's, and from a
/// subscription's at least one, then those ready.
async fn take(cursor: &mut Cursor, count: Count) -> Result<Vec<RecordBatch>> {
    let wanted = match count {
        Count::Rows(n) => usize::try_from(n).unwrap_or(usize::MAX),
        Count::All => usize::MAX,
    };
    let rows = cursor.rows.get_mut().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    let mut got = 0;
    while got < wanted {
        let batch = match cursor.left.take() {
            Some(b) => b,
            None if cursor.live && got > 0 => match rows.next().now_or_never() {
                Some(Some(b)) => b?,
                Some(None) | None => break,
            },
            None => match rows.next().await {
                Some(b) => b?,
                None => break,
            },
        };
        let n = batch.num_rows().min(wanted - got);
        if n < batch.num_rows() {
            cursor.left = Some(batch.slice(n, batch.num_rows() - n));
        }
        got += n;
        out.push(batch.slice(0, n));
    }
    Ok(out)
}
