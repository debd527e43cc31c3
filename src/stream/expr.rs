//! Vectorised expression evaluation for operators, with per-row errors kept out of the way.
//!
//! A view must keep running when one row's expression fails (say, a division by zero). An
//! operator evaluates each expression over the whole batch; only when that fails does it
//! evaluate the batch row by row, giving the failing rows NULL in that expression (a failing
//! filter predicate drops the row) and counting the error against the view. The same input row
//! always fails the same way, so its later deletion retracts exactly what its insertion added.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{new_null_array, Array, ArrayRef, BooleanArray, RecordBatch};
use datafusion::arrow::compute::{concat, prep_null_mask_filter};
use datafusion::physical_plan::PhysicalExpr;

use crate::error::{Error, Result};

/// Row-level evaluation errors of one view.
#[derive(Debug, Default)]
pub struct RowErrors {
    count: AtomicU64,
    last: Mutex<Option<String>>,
}

impl RowErrors {
    pub fn record(&self, view: &str, error: &Error) {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        // Log the first few and then every thousandth, so a bad view cannot flood the log.
        if n <= 10 || n.is_multiple_of(1000) {
            tracing::warn!(view, errors = n, "row error in materialized view: {error}");
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.message.clone());
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn last(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Where an operator reports row errors: the view's counter and its name for the log.
#[derive(Debug, Clone)]
pub struct ErrorSink {
    pub view: Arc<str>,
    pub errors: Arc<RowErrors>,
}

impl ErrorSink {
    pub fn new(view: &str) -> ErrorSink {
        ErrorSink {
            view: view.into(),
            errors: Arc::new(RowErrors::default()),
        }
    }
}

fn eval_one(expr: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<ArrayRef> {
    Ok(expr.evaluate(batch)?.into_array(batch.num_rows())?)
}

/// Evaluates `expr` over `batch`; rows on which it fails get NULL and are reported.
pub fn eval_column(
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
    sink: &ErrorSink,
) -> Result<ArrayRef> {
    match eval_one(expr, batch) {
        Ok(a) => Ok(a),
        Err(whole) if is_row_error(&whole) => {
            let data_type = expr.data_type(&batch.schema())?;
            let mut parts: Vec<ArrayRef> = Vec::with_capacity(batch.num_rows());
            for row in 0..batch.num_rows() {
                match eval_one(expr, &batch.slice(row, 1)) {
                    Ok(a) => parts.push(a),
                    Err(e) if is_row_error(&e) => {
                        sink.errors.record(&sink.view, &e);
                        parts.push(new_null_array(&data_type, 1));
                    }
                    Err(e) => return Err(e),
                }
            }
            let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            Ok(concat(&refs)?)
        }
        Err(e) => Err(e),
    }
}

pub fn eval_columns(
    exprs: &[Arc<dyn PhysicalExpr>],
    batch: &RecordBatch,
    sink: &ErrorSink,
) -> Result<Vec<ArrayRef>> {
    exprs.iter().map(|e| eval_column(e, batch, sink)).collect()
}

/// Evaluates a predicate to a mask where NULL (and a failed evaluation) counts as false.
pub fn eval_predicate(
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
    sink: &ErrorSink,
) -> Result<BooleanArray> {
    let array = eval_column(expr, batch, sink)?;
    let mask = array
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| Error::internal("predicate did not evaluate to boolean"))?;
    if mask.null_count() == 0 {
        return Ok(mask.clone());
    }
    Ok(prep_null_mask_filter(mask))
}

/// Errors that depend on a row's values (as opposed to bugs or resource failures).
fn is_row_error(e: &Error) -> bool {
    use crate::error::ErrorKind as K;
    matches!(
        e.kind,
        K::DivisionByZero
            | K::NumericOutOfRange
            | K::InvalidText
            | K::InvalidParameter
            | K::StringTooLong
            | K::TypeMismatch
    )
}
