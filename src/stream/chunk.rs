//! `StreamChunk`: an Arrow batch of rows, each marked as an insertion or a deletion.
//!
//! An update travels as a deletion of the old row followed by an insertion of the new one.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, Int8Array, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{filter_record_batch, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Insert,
    Delete,
}

impl Op {
    /// +1 for an insertion, -1 for a deletion: the change in a row's multiplicity.
    pub fn weight(self) -> i64 {
        match self {
            Op::Insert => 1,
            Op::Delete => -1,
        }
    }

    fn code(self) -> i8 {
        match self {
            Op::Insert => 1,
            Op::Delete => -1,
        }
    }

    fn from_code(c: i8) -> Option<Op> {
        match c {
            1 => Some(Op::Insert),
            -1 => Some(Op::Delete),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct StreamChunk {
    pub ops: Vec<Op>,
    pub data: RecordBatch,
}

/// Name of the column that carries the ops when a chunk is stored as a plain batch.
const OP_COLUMN: &str = "__weir_op";

impl StreamChunk {
    pub fn new(ops: Vec<Op>, data: RecordBatch) -> StreamChunk {
        assert_eq!(ops.len(), data.num_rows(), "one op per row");
        StreamChunk { ops, data }
    }

    pub fn inserts(data: RecordBatch) -> StreamChunk {
        StreamChunk::new(vec![Op::Insert; data.num_rows()], data)
    }

    pub fn deletes(data: RecordBatch) -> StreamChunk {
        StreamChunk::new(vec![Op::Delete; data.num_rows()], data)
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn schema(&self) -> SchemaRef {
        self.data.schema()
    }

    /// The chunk in consecutive slices of at most `rows` rows (zero-copy), in order.
    pub fn slices(self, rows: usize) -> Vec<StreamChunk> {
        let rows = rows.max(1);
        if self.len() <= rows {
            return vec![self];
        }
        (0..self.len())
            .step_by(rows)
            .map(|start| {
                let n = rows.min(self.len() - start);
                StreamChunk::new(
                    self.ops[start..start + n].to_vec(),
                    self.data.slice(start, n),
                )
            })
            .collect()
    }

    /// Keeps the rows where `mask` is true.
    pub fn filter(&self, mask: &BooleanArray) -> Result<StreamChunk> {
        let data = filter_record_batch(&self.data, mask)?;
        let ops = self
            .ops
            .iter()
            .zip(mask.iter())
            .filter(|(_, m)| m.unwrap_or(false))
            .map(|(op, _)| *op)
            .collect();
        Ok(StreamChunk::new(ops, data))
    }

    /// The rows at `indices`, in that order.
    pub fn take(&self, indices: &[u32]) -> Result<StreamChunk> {
        let idx = UInt32Array::from(indices.to_vec());
        let data = take_record_batch(&self.data, &idx)?;
        let ops = indices.iter().map(|i| self.ops[*i as usize]).collect();
        Ok(StreamChunk::new(ops, data))
    }

    /// The chunk as one batch with the ops in an extra last column (for the change log).
    pub fn to_batch_with_ops(&self) -> Result<RecordBatch> {
        let schema = self.data.schema();
        let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(OP_COLUMN, DataType::Int8, false)));
        let mut columns: Vec<ArrayRef> = self.data.columns().to_vec();
        columns.push(Arc::new(Int8Array::from_iter_values(
            self.ops.iter().map(|o| o.code()),
        )));
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns,
        )?)
    }

    /// Reads back a batch written by `to_batch_with_ops`.
    pub fn from_batch_with_ops(batch: RecordBatch) -> Result<StreamChunk> {
        let n = batch.num_columns();
        let corrupt = || Error::new(crate::error::ErrorKind::DataCorruption, "bad op column");
        if n == 0 || batch.schema().field(n - 1).name() != OP_COLUMN {
            return Err(corrupt());
        }
        let ops_col = batch
            .column(n - 1)
            .as_any()
            .downcast_ref::<Int8Array>()
            .ok_or_else(corrupt)?;
        let ops = ops_col
            .values()
            .iter()
            .map(|c| Op::from_code(*c).ok_or_else(corrupt))
            .collect::<Result<Vec<_>>>()?;
        let data = batch.project(&(0..n - 1).collect::<Vec<_>>())?;
        Ok(StreamChunk::new(ops, data))
    }
}

/// Prints a chunk as one line per row: `+ 1 4` or `- 2 NULL`, the form operator tests use.
impl fmt::Display for StreamChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let options = FormatOptions::default().with_null("NULL");
        let formatters: Vec<ArrayFormatter> = match self
            .data
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<_, _>>()
        {
            Ok(f) => f,
            Err(_) => return Err(fmt::Error),
        };
        for (row, op) in self.ops.iter().enumerate() {
            f.write_str(match op {
                Op::Insert => "+",
                Op::Delete => "-",
            })?;
            for fm in &formatters {
                write!(f, " {}", fm.value(row))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub mod test_util {
    //! Builds chunks from the pretty-printed form, for operator tests.
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};

    /// Parses lines like `+ 1 a` against a schema of Int32/Int64/Float64/Utf8 columns.
    pub fn chunk(schema: &SchemaRef, text: &str) -> StreamChunk {
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| l.split_whitespace().collect())
            .collect();
        let ops = lines
            .iter()
            .map(|l| match l[0] {
                "+" => Op::Insert,
                "-" => Op::Delete,
                other => panic!("bad op {other}"),
            })
            .collect();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, field)| {
                let cells = lines.iter().map(|l| match l[i + 1] {
                    "NULL" => None,
                    v => Some(v),
                });
                let array: ArrayRef = match field.data_type() {
                    DataType::Int32 => Arc::new(
                        cells
                            .map(|c| c.map(|v| v.parse::<i32>().unwrap()))
                            .collect::<Int32Array>(),
                    ),
                    DataType::Int64 => Arc::new(
                        cells
                            .map(|c| c.map(|v| v.parse::<i64>().unwrap()))
                            .collect::<Int64Array>(),
                    ),
                    DataType::Float64 => Arc::new(
                        cells
                            .map(|c| c.map(|v| v.parse::<f64>().unwrap()))
                            .collect::<Float64Array>(),
                    ),
                    DataType::Utf8 => Arc::new(cells.collect::<StringArray>()),
                    other => panic!("unsupported test type {other}"),
                };
                array
            })
            .collect();
        StreamChunk::new(ops, RecordBatch::try_new(schema.clone(), columns).unwrap())
    }

    pub fn schema(cols: &[(&str, DataType)]) -> SchemaRef {
        Arc::new(Schema::new(
            cols.iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ))
    }

    /// Renders chunks as text with rows sorted, so tests do not depend on emission order.
    pub fn render_sorted(chunks: &[StreamChunk]) -> String {
        let mut lines: Vec<String> = chunks
            .iter()
            .flat_map(|c| {
                c.to_string()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        lines.sort();
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;

    #[test]
    fn chunk_round_trips_through_batch_with_ops() {
        let s = schema(&[("a", DataType::Int32), ("b", DataType::Utf8)]);
        let c = chunk(&s, "+ 1 x\n- 2 NULL");
        let back = StreamChunk::from_batch_with_ops(c.to_batch_with_ops().unwrap()).unwrap();
        assert_eq!(back.to_string(), "+ 1 x\n- 2 NULL\n");
    }
}
