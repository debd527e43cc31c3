//! Vectorised expression evaluation for operators, with per-row errors kept out of the way.
//!
//! A view must keep running when one row's expression fails (say, a division by zero). An
//! operator evaluates each expression over the whole batch; only when that fails does it
//! evaluate the batch row by row, giving the failing rows NULL in that expression (a failing
//! filter predicate drops the row) and counting the error against the view. The same input row
//! always fails the same way, so its later deletion retracts exactly what its insertion added,
//! and takes its error off the count: the count is the errors the view holds now.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{new_null_array, Array, ArrayRef, BooleanArray, RecordBatch};
use datafusion::arrow::compute::{concat, prep_null_mask_filter};
use datafusion::physical_plan::PhysicalExpr;

use crate::error::{Error, Result};
use crate::state::TableId;
use crate::stream::chunk::Op;

/// The state table where each actor keeps how many of its rows and groups are in error
/// (`ActorErrors`), keyed by actor id. Catalog ids start at 1,000, so ids below are free for
/// the server's own tables.
pub const ERRORS_TABLE: TableId = 1;

/// Row-level evaluation errors of one view: the errors outstanding in each of its actors, the
/// last error seen, and how many were seen since the server started (for the log).
#[derive(Debug, Default)]
pub struct RowErrors {
    seen: AtomicU64,
    last: Mutex<Option<String>>,
    actors: Mutex<Vec<Arc<AtomicI64>>>,
}

impl RowErrors {
    /// Records an error on a row that comes (`weight` 1) or goes (-1), or on a group's output
    /// that starts (1) or stops (-1) failing.
    fn record(&self, view: &str, error: &Error, outstanding: &AtomicI64, weight: i64) {
        outstanding.fetch_add(weight, Ordering::Relaxed);
        if weight < 0 {
            return;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        // Log the first few and then every thousandth, so a bad view cannot flood the log.
        if n <= 10 || n.is_multiple_of(1000) {
            tracing::warn!(view, errors = n, "row error in materialized view: {error}");
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.message.clone());
    }

    /// The rows and groups of the view whose values are NULL (or whose rows are missing)
    /// because an expression failed on them, now.
    pub fn outstanding(&self) -> i64 {
        self.actors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }

    /// The last error recorded, while any is outstanding.
    pub fn last(&self) -> Option<String> {
        if self.outstanding() == 0 {
            return None;
        }
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Where an operator reports row errors: its view's errors, the view's name for the log, and
/// the count of the actor it runs in, which the actor keeps in `ERRORS_TABLE` so that a
/// restored view knows the errors its restored rows carry.
#[derive(Debug, Clone)]
pub struct ErrorSink {
    pub view: Arc<str>,
    pub errors: Arc<RowErrors>,
    outstanding: Arc<AtomicI64>,
}

impl ErrorSink {
    pub fn new(view: &str) -> ErrorSink {
        let outstanding = Arc::new(AtomicI64::new(0));
        let errors = RowErrors {
            actors: Mutex::new(vec![outstanding.clone()]),
            ..RowErrors::default()
        };
        ErrorSink {
            view: view.into(),
            errors: Arc::new(errors),
            outstanding,
        }
    }

    /// The sink of one more actor of the same view, starting from the errors its state holds.
    pub fn for_actor(&self, outstanding: i64) -> ErrorSink {
        let counter = Arc::new(AtomicI64::new(outstanding));
        self.errors
            .actors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(counter.clone());
        ErrorSink {
            view: self.view.clone(),
            errors: self.errors.clone(),
            outstanding: counter,
        }
    }

    /// Records an error on a row of weight `weight` (see `RowErrors::record`).
    pub fn record(&self, error: &Error, weight: i64) {
        self.errors
            .record(&self.view, error, &self.outstanding, weight);
    }

    /// A group's output that failed no longer does.
    pub fn cleared(&self) {
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
    }

    /// This actor's outstanding errors.
    pub fn outstanding(&self) -> i64 {
        self.outstanding.load(Ordering::Relaxed)
    }
}

fn eval_one(expr: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<ArrayRef> {
    Ok(expr.evaluate(batch)?.into_array(batch.num_rows())?)
}

/// Evaluates `expr` over `batch`, whose rows come and go as `ops` says; rows on which it fails
/// get NULL and are reported, counted up as they come and down as they go.
pub fn eval_column(
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
    ops: &[Op],
    sink: &ErrorSink,
) -> Result<ArrayRef> {
    match eval_one(expr, batch) {
        Ok(a) => Ok(a),
        Err(whole) if is_row_error(&whole) => {
            let data_type = expr.data_type(&batch.schema())?;
            let mut parts: Vec<ArrayRef> = Vec::with_capacity(batch.num_rows());
            assert_eq!(ops.len(), batch.num_rows(), "a change per row");
            for (row, op) in ops.iter().enumerate() {
                match eval_one(expr, &batch.slice(row, 1)) {
                    Ok(a) => parts.push(a),
                    Err(e) if is_row_error(&e) => {
                        sink.record(&e, op.weight());
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
    ops: &[Op],
    sink: &ErrorSink,
) -> Result<Vec<ArrayRef>> {
    exprs
        .iter()
        .map(|e| eval_column(e, batch, ops, sink))
        .collect()
}

/// Evaluates a predicate to a mask where NULL (and a failed evaluation) counts as false.
pub fn eval_predicate(
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
    ops: &[Op],
    sink: &ErrorSink,
) -> Result<BooleanArray> {
    let array = eval_column(expr, batch, ops, sink)?;
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
