//! Filter: keeps the changed rows on which the predicate is true.

use std::sync::Arc;

use datafusion::physical_plan::PhysicalExpr;

use crate::error::Result;
use crate::stream::chunk::StreamChunk;
use crate::stream::expr::{eval_predicate, ErrorSink};
use crate::stream::message::Watermark;
use crate::stream::operator::{Emit, Operator};

pub struct Filter {
    predicate: Arc<dyn PhysicalExpr>,
    errors: ErrorSink,
}

impl Filter {
    pub fn new(predicate: Arc<dyn PhysicalExpr>, errors: ErrorSink) -> Filter {
        Filter { predicate, errors }
    }
}

impl Operator for Filter {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()> {
        let mask = eval_predicate(&self.predicate, &chunk.data, &chunk.ops, &self.errors)?;
        let kept = chunk.filter(&mask)?;
        if !kept.is_empty() {
            out.emit(kept)?;
        }
        Ok(())
    }

    /// A filter keeps columns as they are, so their watermarks hold.
    fn on_watermark(
        &mut self,
        _input: usize,
        watermark: Watermark,
        _out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        Ok(vec![watermark])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::Operator as BinOp;
    use datafusion::physical_expr::expressions::{col, lit, BinaryExpr};

    #[test]
    fn keeps_matching_inserts_and_deletes_and_drops_null() {
        let s = schema(&[("a", DataType::Int64)]);
        let pred = Arc::new(BinaryExpr::new(col("a", &s).unwrap(), BinOp::Gt, lit(2i64)));
        let mut f = Filter::new(pred, ErrorSink::new("v"));
        let mut out = vec![];
        f.on_chunk(0, chunk(&s, "+ 1\n+ 3\n- 5\n+ NULL\n- 2"), &mut out)
            .unwrap();
        assert_eq!(out[0].to_string(), "+ 3\n- 5\n");
    }
}
