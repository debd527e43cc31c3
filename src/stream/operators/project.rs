//! Project: computes the output columns of each changed row; the ops pass through unchanged.
//!
//! A watermark on an input column passes to every output column that is a non-decreasing
//! function of it alone: the column itself, `date_bin` or `date_trunc` of it, and those plus or
//! minus a constant (window bounds). The new watermark is the expression's value at the old.

use std::sync::Arc;

use datafusion::arrow::array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::physical_plan::PhysicalExpr;

use crate::error::Result;
use crate::stream::chunk::StreamChunk;
use crate::stream::expr::{eval_columns, ErrorSink};
use crate::stream::message::Watermark;
use crate::stream::operator::{Emit, Operator};
use crate::stream::spec::monotonic_in;

pub struct Project {
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    input_schema: SchemaRef,
    schema: SchemaRef,
    /// For each output column, the input column it is a non-decreasing function of, if any.
    monotonic: Vec<Option<usize>>,
    errors: ErrorSink,
}

impl Project {
    pub fn new(
        exprs: Vec<Arc<dyn PhysicalExpr>>,
        input_schema: SchemaRef,
        schema: SchemaRef,
        errors: ErrorSink,
    ) -> Project {
        // Watermarks are microseconds since 1970: a timestamp's or a timestamptz's.
        let micros = |t: &DataType| matches!(t, DataType::Timestamp(TimeUnit::Microsecond, _));
        let monotonic = exprs
            .iter()
            .zip(schema.fields())
            .map(|(e, f)| {
                monotonic_in(e).filter(|c| {
                    micros(f.data_type())
                        && input_schema
                            .fields()
                            .get(*c)
                            .is_some_and(|f| micros(f.data_type()))
                })
            })
            .collect();
        Project {
            exprs,
            input_schema,
            schema,
            monotonic,
            errors,
        }
    }

    /// The output columns of `chunk`'s rows.
    pub fn rows(&self, chunk: &StreamChunk) -> Result<RecordBatch> {
        let columns = eval_columns(&self.exprs, &chunk.data, &chunk.ops, &self.errors)?;
        // A projection may keep no columns at all (COUNT(*) reads none), so give the row count.
        let options = RecordBatchOptions::new().with_row_count(Some(chunk.data.num_rows()));
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &options,
        )?)
    }

    /// The watermarks a watermark on the input gives the output columns.
    pub fn watermarks(&self, watermark: Watermark) -> Result<Vec<Watermark>> {
        let mut passed = Vec::new();
        if !self.monotonic.contains(&Some(watermark.column)) {
            return Ok(passed);
        }
        // One row: the watermark in its column, NULL elsewhere.
        let columns: Vec<ArrayRef> = self
            .input_schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                if i == watermark.column {
                    // In the column's own type: a timestamp's, or a timestamptz's with its zone.
                    let zone = match f.data_type() {
                        DataType::Timestamp(_, zone) => zone.clone(),
                        _ => None,
                    };
                    ScalarValue::TimestampMicrosecond(Some(watermark.value), zone).to_array()
                } else {
                    Ok(new_null_array(f.data_type(), 1))
                }
            })
            .collect::<std::result::Result<_, _>>()?;
        // NULL in every other column, so every column must be nullable here.
        let fields: Vec<Field> = self
            .input_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let row = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
        for (out_column, source) in self.monotonic.iter().enumerate() {
            if *source != Some(watermark.column) {
                continue;
            }
            let value = self.exprs[out_column].evaluate(&row)?.into_array(1)?;
            if let ScalarValue::TimestampMicrosecond(Some(v), _) =
                ScalarValue::try_from_array(&value, 0)?
            {
                passed.push(Watermark {
                    column: out_column,
                    value: v,
                });
            }
        }
        Ok(passed)
    }
}

impl Operator for Project {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()> {
        let data = self.rows(&chunk)?;
        out.emit(StreamChunk::new(chunk.ops, data))?;
        Ok(())
    }

    fn on_watermark(
        &mut self,
        _input: usize,
        watermark: Watermark,
        _out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        self.watermarks(watermark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::Operator as BinOp;
    use datafusion::physical_expr::expressions::BinaryExpr;
    use datafusion::physical_expr::expressions::{col, lit};

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
            input.clone(),
            output,
            sink.clone(),
        );
        let mut out = vec![];
        p.on_chunk(0, chunk(&input, "+ 6 3\n+ 1 0\n- 8 2"), &mut out)
            .unwrap();
        assert_eq!(out[0].to_string(), "+ 6 2\n+ 1 NULL\n- 8 4\n");
        assert_eq!(sink.errors.outstanding(), 1);
    }

    #[test]
    fn watermarks_pass_to_columns_that_grow_with_them() {
        let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
        let input = schema(&[("id", DataType::Int64), ("at", ts.clone())]);
        let at = col("at", &input).unwrap();
        let hour = ScalarValue::IntervalMonthDayNano(Some(
            datafusion::arrow::datatypes::IntervalMonthDayNano::new(0, 0, 3_600_000_000_000),
        ));
        let later: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(at.clone(), BinOp::Plus, lit(hour)));
        let negated: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            lit(ScalarValue::Int64(Some(0))),
            BinOp::Minus,
            col("id", &input).unwrap(),
        ));
        let output = schema(&[("at", ts.clone()), ("later", ts), ("neg", DataType::Int64)]);
        let mut p = Project::new(vec![at, later, negated], input, output, ErrorSink::new("v"));
        let passed = p
            .on_watermark(
                0,
                Watermark {
                    column: 1,
                    value: 10,
                },
                &mut vec![],
            )
            .unwrap();
        assert_eq!(
            passed,
            [
                Watermark {
                    column: 0,
                    value: 10
                },
                Watermark {
                    column: 1,
                    value: 3_600_000_010
                }
            ]
        );
        // A watermark on another column passes nowhere.
        assert!(p
            .on_watermark(
                0,
                Watermark {
                    column: 0,
                    value: 1
                },
                &mut vec![]
            )
            .unwrap()
            .is_empty());
    }
}
