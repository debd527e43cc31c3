//! The tables a CDC source's task feeds: each one's upstream columns and position, the
//! stream's row values into the table's columns, and a transaction's changes into chunks.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use serde::{Deserialize, Serialize};

use super::pgoutput::{Lsn, Relation, Value};
use super::types;
use crate::catalog::SourceDef;
use crate::connector::source::{Attach, Progress, SplitProgress};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Feed, Op, Splits, StreamChunk};

/// The name of a CDC table's one split.
const SPLIT: &str = "cdc";

/// A table's position: the end of the last upstream transaction fed to it, and how far its
/// snapshot has gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// `None` before the table has seen a transaction end.
    pub lsn: Option<String>,
    pub snapshot: Snapshot,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Snapshot {
    /// Every row of the upstream table has been read.
    Done,
    /// The chunks after this key (its columns' text) are still to read; `None`: from the
    /// first row.
    After(Option<Vec<String>>),
}

/// A table attached to the task.
pub struct Table {
    pub def: SourceDef,
    /// `schema.name` upstream.
    pub upstream: String,
    /// The upstream's columns (name, type OID, type modifier) when the table was created: a
    /// Relation message that differs is a change of its schema.
    pub expected: Vec<(String, u32, i32)>,
    /// For each of the table's columns, its place among the upstream's.
    pub places: Vec<usize>,
    pub feed: Feed,
    pub progress: Arc<Progress>,
    pub schema: SchemaRef,
    pub lsn: Option<Lsn>,
    pub snapshot: Snapshot,
    /// Why the table no longer takes changes (a change of the upstream's schema).
    pub stopped: Option<String>,
}

/// A row as the table's columns' text, in the table's column order.
pub type Row = Vec<Option<String>>;

impl Table {
    /// A table attached from its definition (whose options name its upstream and that
    /// upstream's columns) and where it starts.
    pub fn attach(a: Attach) -> Result<Table> {
        let options = &a.table.connector.options;
        let upstream = options
            .get("table")
            .cloned()
            .ok_or_else(|| Error::internal("a CDC table without its upstream table"))?;
        let expected: Vec<(String, u32, i32)> = options
            .get("upstream.columns")
            .map(|c| serde_json::from_str(c))
            .transpose()
            .map_err(|e| Error::internal(format!("a CDC table's upstream columns: {e}")))?
            .unwrap_or_default();
        let places = a
            .table
            .columns
            .iter()
            .map(|c| {
                expected
                    .iter()
                    .position(|(n, _, _)| *n == c.name)
                    .ok_or_else(|| {
                        Error::internal(format!(
                            "column \"{}\" is not among the upstream's",
                            c.name
                        ))
                    })
            })
            .collect::<Result<_>>()?;
        let position: Position = match a.start.splits.as_ref().and_then(|s| s.get(SPLIT)) {
            Some(p) => serde_json::from_value(p.clone()).map_err(|e| {
                Error::new(
                    ErrorKind::DataCorruption,
                    format!("table \"{}\" has a bad CDC position: {e}", a.table.name),
                )
            })?,
            None => Position {
                lsn: None,
                snapshot: Snapshot::After(None),
            },
        };
        let lsn = position.lsn.as_deref().map(str::parse).transpose()?;
        a.progress
            .offset
            .store(a.start.offset, std::sync::atomic::Ordering::Release);
        Ok(Table {
            schema: a.table.schema(),
            def: a.table,
            upstream,
            expected,
            places,
            feed: a.feed,
            progress: a.progress,
            lsn,
            snapshot: position.snapshot,
            stopped: None,
        })
    }

    /// The table's position as its feed keeps it.
    pub fn splits(&self) -> Splits {
        let position = Position {
            lsn: self.lsn.map(|l| l.to_string()),
            snapshot: self.snapshot.clone(),
        };
        let value = serde_json::to_value(position).unwrap_or(serde_json::Value::Null);
        self.progress.set_splits(vec![SplitProgress {
            split: SPLIT.into(),
            position: value.clone(),
            end: None,
            lag: None,
        }]);
        Arc::new(BTreeMap::from([(SPLIT.to_string(), value)]))
    }

    /// Checks a Relation message against the upstream columns the table was created with;
    /// a difference stops the table, naming it.
    pub fn check_relation(&mut self, r: &Relation) {
        let now: Vec<(String, u32, i32)> = r
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.type_oid, c.type_modifier))
            .collect();
        if now == self.expected {
            return;
        }
        let added: Vec<&str> = now
            .iter()
            .filter(|c| !self.expected.iter().any(|e| e.0 == c.0))
            .map(|c| c.0.as_str())
            .collect();
        let dropped: Vec<&str> = self
            .expected
            .iter()
            .filter(|e| !now.iter().any(|c| c.0 == e.0))
            .map(|e| e.0.as_str())
            .collect();
        let retyped: Vec<&str> = now
            .iter()
            .filter(|c| self.expected.iter().any(|e| e.0 == c.0 && e != *c))
            .map(|c| c.0.as_str())
            .collect();
        let mut what = Vec::new();
        for (verb, names) in [("added", added), ("dropped", dropped), ("retyped", retyped)] {
            if !names.is_empty() {
                what.push(format!("{verb} {}", names.join(", ")));
            }
        }
        if what.is_empty() {
            what.push("its columns' order changed".into());
        }
        self.stop(format!(
            "upstream table {} changed ({}): the table takes no more changes",
            self.upstream,
            what.join("; ")
        ));
    }

    pub fn stop(&mut self, why: String) {
        tracing::error!(table = self.def.name, "CDC table stopped: {why}");
        *self
            .progress
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
        self.stopped = Some(why);
    }

    /// A row of the stream (the upstream's columns) as the table's; `None` where a value is an
    /// unchanged TOASTed one the stream left out.
    pub fn row(&self, values: &[Value<'_>]) -> Option<Row> {
        self.row_or(values, None)
    }

    /// As `row`, an unchanged TOASTed value taken from `old` (an update's whole old row) where
    /// given.
    pub fn row_or(&self, values: &[Value<'_>], old: Option<&[Value<'_>]>) -> Option<Row> {
        let text = |v: Option<&Value<'_>>| match v {
            None | Some(Value::Null) => Some(None),
            Some(Value::Text(t)) => Some(Some(String::from_utf8_lossy(t).into_owned())),
            Some(Value::Unchanged) => None,
        };
        self.places
            .iter()
            .map(|p| match values.get(*p) {
                Some(Value::Unchanged) => text(old?.get(*p)),
                v => text(v),
            })
            .collect()
    }

    /// The key columns' text of a row.
    pub fn key(&self, row: &Row) -> Vec<Option<String>> {
        self.def
            .primary_key
            .iter()
            .map(|c| row[*c].clone())
            .collect()
    }

    /// A row with only its key's values (a deletion by key).
    pub fn key_row(&self, row: &Row) -> Row {
        (0..row.len())
            .map(|c| {
                self.def
                    .primary_key
                    .contains(&c)
                    .then(|| row[c].clone())
                    .flatten()
            })
            .collect()
    }

    /// Changes as a chunk of the table's columns.
    pub fn chunk(&self, changes: &[(Op, Row)]) -> Result<StreamChunk> {
        let columns = self
            .schema
            .fields()
            .iter()
            .enumerate()
            .map(|(c, f)| {
                let values: Vec<Option<&str>> =
                    changes.iter().map(|(_, r)| r[c].as_deref()).collect();
                types::column(&values, f.data_type())
            })
            .collect::<Result<Vec<_>>>()?;
        let data = RecordBatch::try_new(self.schema.clone(), columns)?;
        Ok(StreamChunk::new(
            changes.iter().map(|(op, _)| *op).collect(),
            data,
        ))
    }
}
