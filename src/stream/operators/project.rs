//! Project: computes the output columns of each changed row; the ops pass through unchanged.

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::physical_plan::PhysicalExpr;

use crate::error::Result;
use crate::stream::chunk::StreamChunk;
use crate::stream::expr::{eval_columns, ErrorSink};
use crate::stream::operator::Operator;

pub struct Project {
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    schema: SchemaRef,
    errors: ErrorSink,
}

impl Project {
    pub fn new(exprs: Vec<Arc<dyn PhysicalExpr>>, schema: SchemaRef, errors: ErrorSink) -> Project {
        Project {
            exprs,
            schema,
            errors,
        }
    }
}

impl Operator for Project {
    fn on_chunk(
        &mut self,
        _input: usize,
        chunk: StreamChunk,
        out: &mut Vec<StreamChunk>,
    ) -> Result<()> {
        let columns = eval_columns(&self.exprs, &chunk.data, &self.errors)?;
        // A projection may keep no columns at all (COUNT(*) reads none), so give the row count.
        let options = RecordBatchOptions::new().with_row_count(Some(chunk.data.num_rows()));
        let data = RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)?;
        out.push(StreamChunk::new(chunk.ops, data));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::Operator as BinOp;
    use datafusion::physical_expr::expressions::{col, BinaryExpr};

    #[test]
    fn division_by_zero_gives_null_and_is_counted() {
        let input = schema(&[("a", DataType::Int64), ("b", DataType::Int64)]);
        let quotient: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            col("a", &input).unwrap(),
            BinOp::Divide,
            col("b", &input).unwrap(),
        ));
        let output = schema(&[("a", DataType::Int64), ("q", DataType::Int64)]);
        let sink = ErrorSink::new("v");
        let mut p = Project::new(
            vec![col("a", &input).unwrap(), quotient],
            output,
            sink.clone(),
        );
        let mut out = vec![];
        p.on_chunk(0, chunk(&input, "+ 6 3\n+ 1 0\n- 8 2"), &mut out)
            .unwrap();
        assert_eq!(out[0].to_string(), "+ 6 2\n+ 1 NULL\n- 8 4\n");
        assert_eq!(sink.errors.count(), 1);
    }
}
