//! Union: UNION ALL of any number of inputs; each input's changes pass through under the
//! union's schema (the planner has already cast every input to the union's column types).

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;

use crate::error::Result;
use crate::stream::chunk::StreamChunk;
use crate::stream::operator::Operator;

pub struct Union {
    schema: SchemaRef,
}

impl Union {
    pub fn new(schema: SchemaRef) -> Union {
        Union { schema }
    }
}

impl Operator for Union {
    fn on_chunk(
        &mut self,
        _input: usize,
        chunk: StreamChunk,
        out: &mut Vec<StreamChunk>,
    ) -> Result<()> {
        let options = RecordBatchOptions::new().with_row_count(Some(chunk.data.num_rows()));
        let data = RecordBatch::try_new_with_options(
            self.schema.clone(),
            chunk.data.columns().to_vec(),
            &options,
        )?;
        out.push(StreamChunk::new(chunk.ops, data));
        Ok(())
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
        let mut u = Union::new(a.clone());
        let mut out = vec![];
        u.on_chunk(0, chunk(&a, "+ 1\n- 2"), &mut out).unwrap();
        u.on_chunk(1, chunk(&b, "+ 3"), &mut out).unwrap();
        assert_eq!(out[0].to_string() + &out[1].to_string(), "+ 1\n- 2\n+ 3\n");
        assert_eq!(out[1].schema().field(0).name(), "x");
    }
}
