//! Union: UNION ALL of any number of inputs; each input's changes pass through under the
//! union's schema (the planner has already cast every input to the union's column types).
//! A column's watermark passes on once every input has one, as the least of them: no input
//! will send anything below it. (This is also how a parallel view's own actor gathers its
//! workers.)

use std::collections::HashMap;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;

use crate::error::Result;
use crate::stream::chunk::StreamChunk;
use crate::stream::message::Watermark;
use crate::stream::operator::{Emit, Operator};

pub struct Union {
    schema: SchemaRef,
    /// The last watermark of each input, by column.
    watermarks: Vec<HashMap<usize, i64>>,
}

impl Union {
    pub fn new(schema: SchemaRef, inputs: usize) -> Union {
        Union {
            schema,
            watermarks: vec![HashMap::new(); inputs],
        }
    }
}

impl Operator for Union {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()> {
        let options = RecordBatchOptions::new().with_row_count(Some(chunk.data.num_rows()));
        let data = RecordBatch::try_new_with_options(
            self.schema.clone(),
            chunk.data.columns().to_vec(),
            &options,
        )?;
        out.emit(StreamChunk::new(chunk.ops, data))?;
        Ok(())
    }

    fn on_watermark(
        &mut self,
        input: usize,
        watermark: Watermark,
        _out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        let Some(seen) = self.watermarks.get_mut(input) else {
            return Ok(Vec::new());
        };
        let last = seen.entry(watermark.column).or_insert(watermark.value);
        *last = (*last).max(watermark.value);
        let least = self
            .watermarks
            .iter()
            .map(|w| w.get(&watermark.column).copied())
            .collect::<Option<Vec<i64>>>()
            .and_then(|values| values.into_iter().min());
        Ok(least
            .map(|value| Watermark {
                column: watermark.column,
                value,
            })
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;

    #[test]
    fn every_input_passes_through_under_the_union_schema() {
        let a = schema(&[("x", DataType::Int64)]);
        let b = schema(&[("y", DataType::Int64)]);
        let mut u = Union::new(a.clone(), 2);
        let mut out = vec![];
        u.on_chunk(0, chunk(&a, "+ 1\n- 2"), &mut out).unwrap();
        u.on_chunk(1, chunk(&b, "+ 3"), &mut out).unwrap();
        assert_eq!(out[0].to_string() + &out[1].to_string(), "+ 1\n- 2\n+ 3\n");
        assert_eq!(out[1].schema().field(0).name(), "x");
    }

    #[test]
    fn a_watermark_passes_once_every_input_has_reached_it() {
        let mut u = Union::new(schema(&[("x", DataType::Int64)]), 2);
        let w = |value| Watermark { column: 0, value };
        assert!(u.on_watermark(0, w(10), &mut vec![]).unwrap().is_empty());
        assert_eq!(u.on_watermark(1, w(7), &mut vec![]).unwrap(), [w(7)]);
        assert_eq!(u.on_watermark(1, w(20), &mut vec![]).unwrap(), [w(10)]);
        assert_eq!(u.on_watermark(0, w(15), &mut vec![]).unwrap(), [w(15)]);
    }
}
