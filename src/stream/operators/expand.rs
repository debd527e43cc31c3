//! Expand: several projections of one input, each changed row passing through every one (a
//! `UNION ALL` of projections of the same rows, read once: a `HOP` window's copies of a row).
//! A watermark passes to an output column when every projection passes one to it, as the
//! least of them.

use crate::error::Result;
use crate::stream::chunk::StreamChunk;
use crate::stream::message::Watermark;
use crate::stream::operator::{Emit, Operator};
use crate::stream::operators::project::Project;

pub struct Expand {
    projections: Vec<Project>,
}

impl Expand {
    pub fn new(projections: Vec<Project>) -> Expand {
        Expand { projections }
    }
}

impl Operator for Expand {
    fn on_chunk(&mut self, _input: usize, chunk: StreamChunk, out: &mut dyn Emit) -> Result<()> {
        let Some((last, rest)) = self.projections.split_last() else {
            return Ok(());
        };
        for projection in rest {
            let data = projection.rows(&chunk)?;
            out.emit(StreamChunk::new(chunk.ops.clone(), data))?;
        }
        let data = last.rows(&chunk)?;
        out.emit(StreamChunk::new(chunk.ops, data))?;
        Ok(())
    }

    fn on_watermark(
        &mut self,
        _input: usize,
        watermark: Watermark,
        _out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        let mut least: Option<Vec<Watermark>> = None;
        for projection in &self.projections {
            let passed = projection.watermarks(watermark)?;
            least = Some(match least {
                None => passed,
                // Kept only where this projection passes one too, as the lesser.
                Some(kept) => kept
                    .into_iter()
                    .filter_map(|w| {
                        let other = passed.iter().find(|p| p.column == w.column)?;
                        Some(Watermark {
                            column: w.column,
                            value: w.value.min(other.value),
                        })
                    })
                    .collect(),
            });
        }
        Ok(least.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType, IntervalMonthDayNano, TimeUnit};
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::Operator as BinOp;
    use datafusion::physical_expr::expressions::{col, lit, BinaryExpr};
    use datafusion::physical_plan::PhysicalExpr;

    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use crate::stream::ErrorSink;

    #[test]
    fn each_row_passes_through_every_projection_with_its_change() {
        let input = schema(&[("a", DataType::Int64), ("b", DataType::Int64)]);
        let output = schema(&[("x", DataType::Int64)]);
        let project = |c: &str| {
            Project::new(
                vec![col(c, &input).unwrap()],
                input.clone(),
                output.clone(),
                ErrorSink::new("v"),
            )
        };
        let mut expand = Expand::new(vec![project("a"), project("b")]);
        let mut out = vec![];
        expand
            .on_chunk(0, chunk(&input, "+ 1 2\n- 3 4"), &mut out)
            .unwrap();
        let rendered: Vec<String> = out.iter().map(|c| c.to_string()).collect();
        assert_eq!(rendered, ["+ 1\n- 3\n", "+ 2\n- 4\n"]);
    }

    #[test]
    fn a_watermark_passes_as_the_least_of_the_projections_and_only_where_all_pass_one() {
        let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
        let input = schema(&[("at", ts.clone()), ("id", DataType::Int64)]);
        let output = schema(&[("start", ts.clone()), ("id", DataType::Int64)]);
        let at = col("at", &input).unwrap();
        let id = col("id", &input).unwrap();
        let earlier = |seconds: i64| -> Arc<dyn PhysicalExpr> {
            let interval = IntervalMonthDayNano::new(0, 0, seconds * 1_000_000_000);
            Arc::new(BinaryExpr::new(
                at.clone(),
                BinOp::Minus,
                lit(ScalarValue::IntervalMonthDayNano(Some(interval))),
            ))
        };
        let project = |exprs: Vec<Arc<dyn PhysicalExpr>>| {
            Project::new(exprs, input.clone(), output.clone(), ErrorSink::new("v"))
        };
        let watermark = Watermark {
            column: 0,
            value: 100_000_000,
        };
        let mut copies = Expand::new(vec![
            project(vec![earlier(0), id.clone()]),
            project(vec![earlier(5), id.clone()]),
            project(vec![earlier(10), id.clone()]),
        ]);
        assert_eq!(
            copies.on_watermark(0, watermark, &mut vec![]).unwrap(),
            [Watermark {
                column: 0,
                value: 90_000_000
            }]
        );
        // A copy whose column does not follow the watermark holds it back for good.
        let fixed = lit(ScalarValue::TimestampMicrosecond(Some(0), None));
        let mut held = Expand::new(vec![
            project(vec![earlier(0), id.clone()]),
            project(vec![fixed, id]),
        ]);
        assert_eq!(held.on_watermark(0, watermark, &mut vec![]).unwrap(), []);
    }
}
