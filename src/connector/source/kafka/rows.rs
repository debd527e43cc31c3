//! Kafka messages into rows: a source's rows (`FORMAT PLAIN`), or a table's changes by key
//! (`docs/design/0012-connector-tables.md`): with `FORMAT PLAIN` and `UPSERT` each value is
//! the row its key has now, an `UPSERT` message without a value deletes its key's row, and a
//! `DEBEZIUM` value is a change event whose `op` says which. The metadata columns the source
//! includes follow each row's payload columns. A message that cannot be a row (it does not
//! decode, or a table's key or NOT NULL column is missing) is given back as bad, with why.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
    StructArray, TimestampMicrosecondArray,
};
use datafusion::arrow::compute::{filter_record_batch, interleave};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};

use super::config::{Format, Meta};
use crate::catalog::SourceDef;
use crate::connector::source::decode::{Encode, Payloads};
use crate::error::Result;
use crate::stream::Op;

/// A message taken from the consumer: what the rows need of it.
pub struct Taken {
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    /// Copied only where a column includes it or the format reads it.
    pub key: Option<Vec<u8>>,
    /// `None` for a message without a value (a tombstone).
    pub payload: Option<Vec<u8>>,
}

/// Where a column of the rows comes from.
#[derive(Debug, Clone, Copy)]
enum Column {
    /// The payload's column at this index of the payloads' schema.
    Payload(usize),
    Meta(Meta),
}

/// The rows of a batch of messages.
#[derive(Debug, Default)]
pub struct Built {
    /// `None` when no message gave a row.
    pub batch: Option<RecordBatch>,
    /// Each row's change: an insert is the row its key has now (a source's rows are all
    /// inserts), a delete its key's row gone.
    pub ops: Vec<Op>,
    /// The message each row came from (an index into the messages), in order.
    pub messages: Vec<usize>,
    /// The messages that gave no row, and why, in order.
    pub bad: Vec<(usize, String)>,
}

/// What a format makes of a batch of messages: the payload columns of its rows, each row's
/// change, each row's message, and the messages that gave no row with why.
type Changes = (
    Option<RecordBatch>,
    Vec<Op>,
    Vec<usize>,
    Vec<(usize, String)>,
);

/// Turns messages into rows, by the source's format.
pub struct Rows {
    format: Format,
    payloads: Payloads,
    /// `DEBEZIUM`: the change event around the payload's columns.
    envelope: Option<Payloads>,
    schema: SchemaRef,
    columns: Vec<Column>,
    /// The primary key's columns (a table's) and the names of the key's payload columns.
    key: Vec<usize>,
    key_names: Vec<String>,
    /// Columns that must have a value in a table's row: NOT NULL ones and the key's.
    required: Vec<usize>,
    /// Whether messages' keys are read (a column includes them, or the format reads them).
    pub reads_keys: bool,
}

impl Rows {
    pub fn new(
        def: &SourceDef,
        format: Format,
        encode: Encode,
        include: &[(Meta, String)],
    ) -> Rows {
        let schema = def.schema();
        let mut columns = Vec::with_capacity(def.columns.len());
        let mut payload_fields = Vec::new();
        for (i, c) in def.columns.iter().enumerate() {
            match include.iter().find(|(_, n)| *n == c.name) {
                Some((m, _)) => columns.push(Column::Meta(*m)),
                None => {
                    columns.push(Column::Payload(payload_fields.len()));
                    payload_fields.push(schema.field(i).clone());
                }
            }
        }
        let payload_schema = Arc::new(Schema::new(payload_fields));
        let envelope = (format == Format::Debezium).then(|| {
            let row = DataType::Struct(payload_schema.fields().clone());
            let event = Fields::from(vec![
                Field::new("before", row.clone(), true),
                Field::new("after", row, true),
                Field::new("op", DataType::Utf8, true),
            ]);
            let mut fields: Vec<Field> = event.iter().map(|f| f.as_ref().clone()).collect();
            // Debezium's JSON converter with schemas wraps the event in `payload`.
            fields.push(Field::new("payload", DataType::Struct(event), true));
            Payloads {
                encode: Encode::Json,
                schema: Arc::new(Schema::new(fields)),
            }
        });
        let required: Vec<usize> = (0..def.columns.len())
            .filter(|c| def.columns[*c].not_null || def.primary_key.contains(c))
            .collect();
        Rows {
            reads_keys: format == Format::Upsert
                || columns.iter().any(|c| matches!(c, Column::Meta(Meta::Key))),
            format,
            payloads: Payloads {
                encode,
                schema: payload_schema,
            },
            envelope,
            key_names: def
                .primary_key
                .iter()
                .map(|c| def.columns[*c].name.clone())
                .collect(),
            key: def.primary_key.clone(),
            required,
            schema,
            columns,
        }
    }

    pub fn build(&self, taken: &[Taken]) -> Result<Built> {
        let (payload, ops, messages, mut bad) = match self.format {
            Format::Plain => self.plain(taken)?,
            Format::Upsert => self.upsert(taken)?,
            Format::Debezium => self.debezium(taken)?,
        };
        let Some(payload) = payload else {
            bad.sort_by_key(|b| b.0);
            return Ok(Built {
                bad,
                ..Built::default()
            });
        };
        let rows: Vec<&Taken> = messages.iter().map(|m| &taken[*m]).collect();
        let columns: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|c| match c {
                Column::Payload(i) => payload.column(*i).clone(),
                Column::Meta(m) => metadata(*m, &rows),
            })
            .collect();
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        let built = self.check(batch, ops, messages, bad)?;
        Ok(built)
    }

    /// Each value one row: a source's rows, or upserts into a table.
    fn plain(&self, taken: &[Taken]) -> Result<Changes> {
        let (with_payload, payloads) = with_payloads(taken);
        let decoded = self.payloads.decode(&payloads)?;
        let messages: Vec<usize> = decoded.rows.iter().map(|r| with_payload[*r]).collect();
        let bad = decoded
            .bad
            .into_iter()
            .map(|(r, why)| (with_payload[r], why))
            .collect();
        Ok((
            decoded.batch,
            vec![Op::Insert; messages.len()],
            messages,
            bad,
        ))
    }

    /// A value is the row its key has now, the key's columns filled from the message's key
    /// where the value lacks them; a message without a value deletes its key's row.
    fn upsert(&self, taken: &[Taken]) -> Result<Changes> {
        let mut texts: Vec<Vec<u8>> = Vec::with_capacity(taken.len());
        let mut of = Vec::with_capacity(taken.len());
        let mut ops_of = Vec::with_capacity(taken.len());
        let mut bad = Vec::new();
        for (i, t) in taken.iter().enumerate() {
            let key = t.key.as_deref().map(|k| key_fields(k, &self.key_names));
            let text = match (key, t.payload.as_deref()) {
                (None, None) => {
                    bad.push((
                        i,
                        "a message without a value deletes by its key: it has none".into(),
                    ));
                    continue;
                }
                (Some(None), None) => {
                    bad.push((i, "its key is not the table's key as JSON".into()));
                    continue;
                }
                (Some(Some(key)), None) => {
                    ops_of.push(Op::Delete);
                    object(&[&key])
                }
                (key, Some(value)) => {
                    ops_of.push(Op::Insert);
                    match (key.flatten(), object_fields(value)) {
                        // Fields named twice: the value's, which come last, are kept.
                        (Some(key), Some(value)) => object(&[&key, value]),
                        _ => value.to_vec(),
                    }
                }
            };
            texts.push(text);
            of.push(i);
        }
        let payloads: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        let decoded = self.payloads.decode(&payloads)?;
        let messages: Vec<usize> = decoded.rows.iter().map(|r| of[*r]).collect();
        let ops = decoded.rows.iter().map(|r| ops_of[*r]).collect();
        bad.extend(decoded.bad.into_iter().map(|(r, why)| (of[r], why)));
        Ok((decoded.batch, ops, messages, bad))
    }

    /// Change events: `c` and `r` give the row after, `u` retracts the row before (when the
    /// event carries it) and gives the row after, `d` retracts the row before.
    fn debezium(&self, taken: &[Taken]) -> Result<Changes> {
        let envelope = self
            .envelope
            .as_ref()
            .expect("a DEBEZIUM reader decodes change events");
        // A message without a value follows a deletion (for log compaction): no change.
        let (with_payload, payloads) = with_payloads(taken);
        let decoded = envelope.decode(&payloads)?;
        let mut bad: Vec<(usize, String)> = decoded
            .bad
            .iter()
            .map(|(r, why)| (with_payload[*r], why.clone()))
            .collect();
        let Some(events) = decoded.batch else {
            return Ok((None, Vec::new(), Vec::new(), bad));
        };
        let payload = events.column(3).as_struct();
        // The four rows an event may hold: before and after, at the top or in `payload`.
        let sides: [&StructArray; 4] = [
            events.column(0).as_struct(),
            events.column(1).as_struct(),
            payload.column(0).as_struct(),
            payload.column(1).as_struct(),
        ];
        let ops_top = events.column(2).as_string::<i32>();
        let ops_wrapped = payload.column(2).as_string::<i32>();
        let mut picks: Vec<(usize, usize)> = Vec::new();
        let mut ops = Vec::new();
        let mut messages = Vec::new();
        for (r, row) in decoded.rows.iter().enumerate() {
            let message = with_payload[*row];
            let (before, after, op) = if payload.is_valid(r) {
                (2, 3, ops_wrapped)
            } else {
                (0, 1, ops_top)
            };
            let has = |side: usize| sides[side].is_valid(r);
            let mut push = |side: usize, o: Op| {
                picks.push((side, r));
                ops.push(o);
                messages.push(message);
            };
            match op.is_valid(r).then(|| op.value(r)) {
                Some("c" | "r") if has(after) => push(after, Op::Insert),
                Some("u") if has(after) => {
                    if has(before) {
                        push(before, Op::Delete);
                    }
                    push(after, Op::Insert);
                }
                Some("d") if has(before) => push(before, Op::Delete),
                Some(o @ ("c" | "r" | "u" | "d")) => bad.push((
                    message,
                    format!("a change event with op \"{o}\" lacks the row it changes"),
                )),
                Some(other) => bad.push((
                    message,
                    format!("op \"{other}\" is not a change of a row (c, r, u or d)"),
                )),
                None => bad.push((message, "not a Debezium change event (no op)".into())),
            }
        }
        if picks.is_empty() {
            return Ok((None, ops, messages, bad));
        }
        let columns = (0..self.payloads.schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn Array> = sides.iter().map(|s| s.column(c).as_ref()).collect();
                interleave(&arrays, &picks)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let rows = RecordBatch::try_new(self.payloads.schema.clone(), columns)?;
        Ok((Some(rows), ops, messages, bad))
    }

    /// Drops the rows a table cannot take: an insert without a value in a key or NOT NULL
    /// column, a delete without one in a key column.
    fn check(
        &self,
        batch: RecordBatch,
        ops: Vec<Op>,
        messages: Vec<usize>,
        mut bad: Vec<(usize, String)>,
    ) -> Result<Built> {
        let missing = |row: usize| {
            let columns: &[usize] = match ops[row] {
                Op::Insert => &self.required,
                Op::Delete => &self.key,
            };
            columns
                .iter()
                .find(|c| batch.column(**c).is_null(row))
                .map(|c| self.schema.field(*c).name().clone())
        };
        let refused: Vec<(usize, String)> = (0..batch.num_rows())
            .filter_map(|row| missing(row).map(|c| (row, c)))
            .collect();
        if refused.is_empty() {
            bad.sort_by_key(|b| b.0);
            return Ok(Built {
                batch: Some(batch),
                ops,
                messages,
                bad,
            });
        }
        let mut keep = vec![true; batch.num_rows()];
        for (row, column) in refused {
            keep[row] = false;
            bad.push((
                messages[row],
                format!("column \"{column}\" has no value, and the table needs one"),
            ));
        }
        bad.sort_by_key(|b| b.0);
        let mask = BooleanArray::from(keep.clone());
        let batch = filter_record_batch(&batch, &mask)?;
        Ok(Built {
            batch: (batch.num_rows() > 0).then_some(batch),
            ops: kept(ops, &keep),
            messages: kept(messages, &keep),
            bad,
        })
    }
}

/// The messages that have a value (by index), and their values.
fn with_payloads(taken: &[Taken]) -> (Vec<usize>, Vec<&[u8]>) {
    taken
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.payload.as_deref().map(|p| (i, p)))
        .unzip()
}

/// The items of `v` whose place in `keep` is true.
fn kept<T>(v: Vec<T>, keep: &[bool]) -> Vec<T> {
    v.into_iter()
        .zip(keep)
        .filter(|(_, k)| **k)
        .map(|(x, _)| x)
        .collect()
}

/// The fields of a JSON object's text, without its braces; `None` when it is not one.
fn object_fields(text: &[u8]) -> Option<&[u8]> {
    let trimmed = text.trim_ascii();
    let inner = trimmed.strip_prefix(b"{")?.strip_suffix(b"}")?;
    Some(inner.trim_ascii())
}

/// A JSON object of the given objects' fields, in order.
fn object(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![b'{'];
    for p in parts.iter().filter(|p| !p.is_empty()) {
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(p);
    }
    out.push(b'}');
    out
}

/// A message key as the fields of the table's key columns: a JSON object's fields, or for a
/// key of one column a JSON value (or else the key's text as a string) under its name;
/// `None` when it is neither.
fn key_fields(key: &[u8], names: &[String]) -> Option<Vec<u8>> {
    if let Some(fields) = object_fields(key) {
        return Some(fields.to_vec());
    }
    let [name] = names else { return None };
    let value = match serde_json::from_slice::<serde_json::Value>(key) {
        Ok(v @ (serde_json::Value::Number(_) | serde_json::Value::String(_))) => v,
        _ => serde_json::Value::String(String::from_utf8_lossy(key).into_owned()),
    };
    let name = serde_json::Value::String(name.clone());
    Some(format!("{name}:{value}").into_bytes())
}

/// A metadata column of the rows of `taken`.
fn metadata(meta: Meta, taken: &[&Taken]) -> ArrayRef {
    match meta {
        Meta::Key => Arc::new(
            taken
                .iter()
                .map(|t| t.key.as_deref().map(String::from_utf8_lossy))
                .collect::<StringArray>(),
        ),
        Meta::Partition => Arc::new(
            taken
                .iter()
                .map(|t| Some(t.partition))
                .collect::<Int32Array>(),
        ),
        Meta::Offset => Arc::new(taken.iter().map(|t| Some(t.offset)).collect::<Int64Array>()),
        Meta::Timestamp => Arc::new(
            taken
                .iter()
                .map(|t| t.timestamp_ms.map(|ms| ms.saturating_mul(1000)))
                .collect::<TimestampMicrosecondArray>()
                .with_timezone(crate::types::TIMESTAMPTZ_ZONE),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ColumnDef, Connector};
    use crate::types::SqlType;

    fn table(key: Vec<usize>) -> SourceDef {
        let column = |name: &str, ty, not_null| ColumnDef {
            name: name.into(),
            ty,
            not_null,
        };
        SourceDef {
            id: 1000,
            name: "users".into(),
            columns: vec![
                column("id", SqlType::BigInt, true),
                column("name", SqlType::Text, false),
                column("plan", SqlType::Text, true),
            ],
            watermark: None,
            connector: Connector::plain("kafka", Default::default()),
            primary_key: key,
            create_sql: None,
        }
    }

    fn message(key: Option<&str>, value: Option<&str>) -> Taken {
        Taken {
            partition: 0,
            offset: 0,
            timestamp_ms: None,
            key: key.map(|k| k.as_bytes().to_vec()),
            payload: value.map(|v| v.as_bytes().to_vec()),
        }
    }

    /// Each row as `op id name plan`, and the bad messages' indices.
    fn render(b: &Built) -> (Vec<String>, Vec<usize>) {
        let mut rows = Vec::new();
        if let Some(batch) = &b.batch {
            let ids = batch
                .column(0)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            let text = |c: usize, r: usize| {
                let a = batch.column(c).as_string::<i32>();
                if a.is_null(r) {
                    "NULL".to_string()
                } else {
                    a.value(r).to_string()
                }
            };
            for r in 0..batch.num_rows() {
                let op = if b.ops[r] == Op::Insert { "+" } else { "-" };
                rows.push(format!(
                    "{op} {} {} {}",
                    ids.value(r),
                    text(1, r),
                    text(2, r)
                ));
            }
        }
        (rows, b.bad.iter().map(|x| x.0).collect())
    }

    #[test]
    fn upserts_take_their_key_from_the_message_and_a_missing_value_deletes() {
        let rows = Rows::new(&table(vec![0]), Format::Upsert, Encode::Json, &[]);
        let built = rows
            .build(&[
                message(
                    Some(r#"{"id": 1}"#),
                    Some(r#"{"id": 1, "name": "ann", "plan": "free"}"#),
                ),
                // The value lacks the key's column: the message key gives it.
                message(Some("2"), Some(r#"{"name": "bob", "plan": "pro"}"#)),
                message(Some(r#"{"id": 1}"#), None),
                // No key to delete by; a plan missing where the table needs one.
                message(None, None),
                message(Some("3"), Some(r#"{"name": "cy"}"#)),
                message(Some("not json"), None),
            ])
            .unwrap();
        let (rows, bad) = render(&built);
        assert_eq!(rows, ["+ 1 ann free", "+ 2 bob pro", "- 1 NULL NULL"]);
        assert_eq!(bad, [3, 4, 5]);
        assert_eq!(built.messages, [0, 1, 2]);
    }

    #[test]
    fn debezium_events_become_changes_by_their_op() {
        let rows = Rows::new(&table(vec![0]), Format::Debezium, Encode::Json, &[]);
        let after =
            |id: i64, plan: &str| format!(r#"{{"id": {id}, "name": "n{id}", "plan": "{plan}"}}"#);
        let built = rows
            .build(&[
                message(None, Some(&format!(r#"{{"before": null, "after": {}, "op": "c"}}"#, after(1, "a")))),
                message(
                    None,
                    Some(&format!(
                        r#"{{"schema": {{}}, "payload": {{"before": {}, "after": {}, "op": "u", "ts_ms": 1}}}}"#,
                        after(1, "a"),
                        after(1, "b")
                    )),
                ),
                message(None, Some(&format!(r#"{{"before": {}, "after": null, "op": "d"}}"#, after(1, "b")))),
                message(None, None),
                message(None, Some(r#"{"op": "t"}"#)),
                message(None, Some(&format!(r#"{{"after": {}, "op": "r"}}"#, after(2, "c")))),
            ])
            .unwrap();
        let (rows, bad) = render(&built);
        assert_eq!(
            rows,
            ["+ 1 n1 a", "- 1 n1 a", "+ 1 n1 b", "- 1 n1 b", "+ 2 n2 c"]
        );
        assert_eq!(bad, [4]);
        assert_eq!(built.messages, [0, 1, 1, 2, 5]);
    }

    #[test]
    fn a_plain_table_without_a_key_takes_rows_with_their_not_null_columns() {
        let rows = Rows::new(&table(vec![]), Format::Plain, Encode::Json, &[]);
        let built = rows
            .build(&[
                message(None, Some(r#"{"id": 1, "plan": "a"}"#)),
                message(None, Some(r#"{"id": 2}"#)),
            ])
            .unwrap();
        assert_eq!(render(&built), (vec!["+ 1 NULL a".to_string()], vec![1]));
    }
}
