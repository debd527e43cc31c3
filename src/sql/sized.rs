//! String functions whose results are sized by their arguments (`repeat`, `lpad`, `rpad`),
//! computed as PostgreSQL computes them, over whole batches. A value PostgreSQL could not
//! allocate (over 1 GB) is refused with 54000 before anything is allocated, as PostgreSQL
//! refuses it; and a batch's results are reserved from the query memory pool before they are
//! built, so that a statement asking for more than the pool has left fails with 53200
//! instead of taking the memory. The reservation lives as long as the results do (`hold`):
//! a result passed to another function still counts while that one reserves its own.
//!
//! Batch plans also concatenate within the pool (`bound_functions`): `||`, `concat` and
//! `concat_ws` reserve the most their results can take (the sum of their arguments) before
//! they are computed. Views keep DataFusion's functions: their rows never wait on a pool
//! that batch queries fill.

use std::sync::Arc;

use datafusion::arrow::array::{make_array, Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::compute::kernels::concat_elements::concat_elements_utf8;
use datafusion::arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::tree_node::Transformed;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ReturnFieldArgs,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::error::{Error, ErrorKind};

/// PostgreSQL's largest allocation (`MaxAllocSize`): a value with its 4-byte header must fit.
const MAX_ALLOC_BYTES: i64 = 0x3fff_ffff;
/// A varlena's header.
const HEADER_BYTES: i64 = 4;
/// The most bytes a character takes in UTF-8 (`pg_database_encoding_max_length`).
const CHAR_BYTES_MAX: i64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Repeat,
    Lpad,
    Rpad,
}

/// The query memory pool, compared by identity (a function's equality is its name's and
/// kind's).
#[derive(Debug, Clone)]
struct Pool(Arc<dyn MemoryPool>);

impl PartialEq for Pool {
    fn eq(&self, other: &Pool) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Pool {}

impl std::hash::Hash for Pool {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Sized {
    kind: Kind,
    signature: Signature,
    pool: Pool,
}

/// `repeat`, `lpad` and `rpad`, reserving their results from `pool`.
pub fn sized_functions(pool: &Arc<dyn MemoryPool>) -> Vec<ScalarUDF> {
    [Kind::Repeat, Kind::Lpad, Kind::Rpad]
        .into_iter()
        .map(|kind| {
            ScalarUDF::new_from_impl(Sized {
                kind,
                signature: Signature::user_defined(Volatility::Immutable),
                pool: Pool(pool.clone()),
            })
        })
        .collect()
}

fn too_large() -> DataFusionError {
    DataFusionError::External(Box::new(Error::new(
        ErrorKind::ProgramLimitExceeded,
        "requested length too large",
    )))
}

/// One row's arguments: the string, the count or length, and the fill (lpad and rpad).
struct Row<'a> {
    string: &'a str,
    n: i64,
    fill: &'a str,
}

impl Kind {
    /// The bytes of the row's result, after PostgreSQL's checks: 54000 for a value it could
    /// not allocate.
    fn bytes(self, r: &Row<'_>) -> DfResult<i64> {
        match self {
            Kind::Repeat => {
                let bytes = (r.string.len() as i64).saturating_mul(r.n.max(0));
                if bytes.saturating_add(HEADER_BYTES) > MAX_ALLOC_BYTES {
                    return Err(too_large());
                }
                Ok(bytes)
            }
            Kind::Lpad | Kind::Rpad => {
                let (kept, len) = pad_lengths(r);
                // PostgreSQL checks the worst case, every character of four bytes.
                if len
                    .saturating_mul(CHAR_BYTES_MAX)
                    .saturating_add(HEADER_BYTES)
                    > MAX_ALLOC_BYTES
                {
                    return Err(too_large());
                }
                let fill_chars = (r.fill.chars().count() as i64).max(1);
                let fill_bytes = r.fill.len() as i64;
                // The fill's bytes per character, rounded up: an estimate, for capacity.
                let per_char = ((fill_bytes + fill_chars - 1) / fill_chars).max(1);
                let padding = (len - kept) * per_char;
                Ok(r.string.len() as i64 + padding)
            }
        }
    }

    /// Appends the row's result to `out`.
    fn append(self, r: &Row<'_>, out: &mut StringBuilder) {
        match self {
            Kind::Repeat => out.append_value(r.string.repeat(r.n.max(0) as usize)),
            Kind::Lpad | Kind::Rpad => {
                let (kept, len) = pad_lengths(r);
                let head: String = r.string.chars().take(kept as usize).collect();
                let padding: String = (r.fill.chars().cycle())
                    .take((len - kept) as usize)
                    .collect();
                match self {
                    Kind::Lpad => out.append_value(padding + &head),
                    _ => out.append_value(head + &padding),
                }
            }
        }
    }
}

/// `lpad`'s and `rpad`'s characters of the string kept and the result's length, as
/// PostgreSQL computes them: a negative length is zero, the string is cut to the length,
/// and with nothing to pad with, nothing is padded.
fn pad_lengths(r: &Row<'_>) -> (i64, i64) {
    let mut len = r.n.max(0);
    let kept = (r.string.chars().count() as i64).min(len);
    if r.fill.is_empty() {
        len = kept;
    }
    (kept, len)
}

impl ScalarUDFImpl for Sized {
    fn name(&self) -> &str {
        match self.kind {
            Kind::Repeat => "repeat",
            Kind::Lpad => "lpad",
            Kind::Rpad => "rpad",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> DfResult<Vec<DataType>> {
        let arity = match self.kind {
            Kind::Repeat => 2..=2,
            _ => 2..=3,
        };
        if !arity.contains(&args.len()) {
            return Err(DataFusionError::Plan(format!(
                "function {}({}) does not exist",
                self.name(),
                args.iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let integer = |t: &DataType| t.is_integer() || t.is_null();
        if !integer(&args[1]) {
            return Err(DataFusionError::Plan(format!(
                "function {}(text, {}) does not exist",
                self.name(),
                args[1]
            )));
        }
        Ok((0..args.len())
            .map(|i| match i {
                1 => DataType::Int64,
                _ => DataType::Utf8,
            })
            .collect())
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        // A constant argument becomes a column of one value per row: reserved first, as a
        // large constant over many rows would take memory before any length is checked. The
        // constant itself counts too: a function's constant result holds no reservation.
        let broadcast = MemoryConsumer::new(self.name()).register(&self.pool.0);
        broadcast.try_grow(broadcast_bytes(&args.args, args.number_rows + 1))?;
        // In the types `coerce_types` asks for; a plan kept by a view from before may pass
        // others (`Utf8View`, `Int32`).
        let given = ColumnarValue::values_to_arrays(&args.args)?;
        let arrays = (given.iter().enumerate())
            .map(|(i, a)| match i {
                1 => cast(a, &DataType::Int64),
                _ => cast(a, &DataType::Utf8),
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let strings = arrays[0].as_string::<i32>();
        let counts = arrays[1].as_primitive::<Int64Type>();
        let fills = arrays.get(2).map(|f| f.as_string::<i32>());
        let rows = strings.len();
        let row = |i: usize| -> Option<Row<'_>> {
            let fill = match fills {
                Some(f) if f.is_null(i) => return None,
                Some(f) => f.value(i),
                None => " ",
            };
            if strings.is_null(i) || counts.is_null(i) {
                return None;
            }
            Some(Row {
                string: strings.value(i),
                n: counts.value(i),
                fill,
            })
        };
        // Every value is checked and the batch's results reserved before any is built.
        let mut total: i64 = 0;
        for i in 0..rows {
            if let Some(r) = row(i) {
                total = total.saturating_add(self.kind.bytes(&r)?);
            }
        }
        // A batch's text column holds at most 2 GB (32-bit offsets).
        if total > i64::from(i32::MAX) {
            return Err(DataFusionError::External(Box::new(Error::new(
                ErrorKind::ProgramLimitExceeded,
                format!(
                    "the results of {}() for one batch of {rows} rows would exceed 2 GB",
                    self.name()
                ),
            ))));
        }
        let total = usize::try_from(total).unwrap_or(usize::MAX);
        let reservation = MemoryConsumer::new(self.name()).register(&self.pool.0);
        reservation.try_grow(total)?;
        let mut out = StringBuilder::with_capacity(rows, total);
        for i in 0..rows {
            match row(i) {
                Some(r) => self.kind.append(&r, &mut out),
                None => out.append_null(),
            }
        }
        let result = hold(Arc::new(out.finish()), reservation)?;
        columnar(result, scalar)
    }
}

/// A function's result: the value of its one row when every argument was a constant.
fn columnar(result: ArrayRef, constant: bool) -> DfResult<ColumnarValue> {
    match constant {
        true => Ok(ColumnarValue::Scalar(
            datafusion::common::ScalarValue::try_from_array(&result, 0)?,
        )),
        false => Ok(ColumnarValue::Array(result)),
    }
}

/// The bytes of a constant string argument (0 for a column, a NULL or another type).
fn constant_bytes(arg: &ColumnarValue) -> usize {
    match arg {
        ColumnarValue::Scalar(s) => match s.try_as_str() {
            Some(Some(v)) => v.len(),
            _ => 0,
        },
        ColumnarValue::Array(_) => 0,
    }
}

/// The bytes constant string arguments take as `rows` values each (a column of `rows`
/// values, and the constant itself: `rows + 1`).
fn broadcast_bytes(args: &[ColumnarValue], rows: usize) -> usize {
    (args.iter())
        .map(|a| constant_bytes(a).saturating_mul(rows))
        .fold(0, usize::saturating_add)
}

/// The most bytes a concatenation of `args` over `rows` rows takes: every argument's bytes,
/// counted `times[i]` times (`concat_ws` repeats its separator).
fn concatenated_bytes(
    args: &[ColumnarValue],
    rows: usize,
    times: impl Fn(usize) -> usize,
) -> usize {
    (args.iter().enumerate())
        .map(|(i, a)| {
            let bytes = match a {
                ColumnarValue::Scalar(_) => constant_bytes(a).saturating_mul(rows),
                ColumnarValue::Array(a) => a.get_buffer_memory_size(),
            };
            bytes.saturating_mul(times(i))
        })
        .fold(0, usize::saturating_add)
}

/// Where `hold` keeps a reservation: with the buffer it accounts for, until the last array
/// that shares the buffer is dropped.
struct Held {
    _buffer: Buffer,
    _reservation: std::panic::AssertUnwindSafe<MemoryReservation>,
}

/// `array`, whose largest buffer now holds `reservation` until it is freed.
fn hold(array: ArrayRef, reservation: MemoryReservation) -> DfResult<ArrayRef> {
    let data = array.to_data();
    let Some((i, largest)) = (data.buffers().iter().enumerate()).max_by_key(|(_, b)| b.len())
    else {
        return Ok(array);
    };
    let Some(start) = std::ptr::NonNull::new(largest.as_ptr().cast_mut()) else {
        return Ok(array);
    };
    let len = largest.len();
    let owner = Arc::new(Held {
        _buffer: largest.clone(),
        _reservation: std::panic::AssertUnwindSafe(reservation),
    });
    // SAFETY: `start` and `len` are those of a live buffer, which `owner` keeps alive for as
    // long as the new buffer (and every clone of it) exists.
    let held = unsafe { Buffer::from_custom_allocation(start, len, owner) };
    let mut buffers = data.buffers().to_vec();
    buffers[i] = held;
    let data = data.into_builder().buffers(buffers).build()?;
    Ok(make_array(data))
}

/// DataFusion's `concat` or `concat_ws`, reserving the most its result can take first.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Bounded {
    inner: Arc<ScalarUDF>,
    /// The inner function's, volatile.
    signature: Signature,
    pool: Pool,
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.coerce_types(args)
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(args)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let separators = args.args.len().saturating_sub(2).max(1);
        let ws = self.inner.name() == "concat_ws";
        let bytes = concatenated_bytes(&args.args, args.number_rows, |i| match (ws, i) {
            (true, 0) => separators,
            _ => 1,
        });
        // Constant arguments (a function's constant result) are held by no reservation.
        let constants = broadcast_bytes(&args.args, 1);
        let reservation = MemoryConsumer::new(self.name()).register(&self.pool.0);
        reservation.try_grow(bytes.saturating_add(constants))?;
        let result = self.inner.invoke_with_args(args)?;
        reservation.shrink(constants.min(reservation.size()));
        match result {
            ColumnarValue::Array(a) => Ok(ColumnarValue::Array(hold(a, reservation)?)),
            scalar => Ok(scalar),
        }
    }
}

/// `||` between strings (PostgreSQL's `textcat`): NULL when either side is, reserving its
/// result first.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Textcat {
    signature: Signature,
    pool: Pool,
}

impl ScalarUDFImpl for Textcat {
    fn name(&self) -> &str {
        "textcat"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let reservation = MemoryConsumer::new(self.name()).register(&self.pool.0);
        // Constant arguments as columns, and themselves (held by no reservation).
        let broadcast = broadcast_bytes(&args.args, rows + 1);
        reservation
            .try_grow(concatenated_bytes(&args.args, rows, |_| 1).saturating_add(broadcast))?;
        let scalar = (args.args.iter()).all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [left, right] = arrays.as_slice() else {
            return Err(DataFusionError::Internal(
                "textcat takes two arguments".into(),
            ));
        };
        let (left, right) = (cast(left, &DataType::Utf8)?, cast(right, &DataType::Utf8)?);
        let joined = concat_elements_utf8(left.as_string::<i32>(), right.as_string::<i32>())?;
        drop(arrays);
        reservation.shrink(broadcast.min(reservation.size()));
        let result = hold(Arc::new(joined), reservation)?;
        columnar(result, scalar)
    }
}

/// `plan` (a batch query's, analyzed) with the functions that size their results from their
/// arguments reserving them from `pool`, and kept from the optimizer's constant folding
/// (volatile), which would compute them outside the pool and keep their values in the plan:
/// `repeat`, `lpad` and `rpad`, `||` between strings (as `textcat`), `concat` and `concat_ws`.
pub fn bound_functions(plan: LogicalPlan, pool: &Arc<dyn MemoryPool>) -> DfResult<LogicalPlan> {
    let pool = Pool(pool.clone());
    let textcat = Arc::new(ScalarUDF::new_from_impl(Textcat {
        signature: Signature::any(2, Volatility::Volatile),
        pool: pool.clone(),
    }));
    super::rules::rewrite_expressions(plan, |e, schema| match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::StringConcat,
            right,
        }) if is_text(&left.get_type(schema)?) && is_text(&right.get_type(schema)?) => {
            Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(textcat.clone(), vec![*left, *right]),
            )))
        }
        Expr::ScalarFunction(f) if f.func.signature().volatility != Volatility::Volatile => {
            let bounded = if let Some(sized) = f.func.inner().downcast_ref::<Sized>() {
                ScalarUDF::new_from_impl(Sized {
                    kind: sized.kind,
                    signature: Signature::user_defined(Volatility::Volatile),
                    pool: pool.clone(),
                })
            } else if matches!(f.func.name(), "concat" | "concat_ws") {
                let signature = f.func.signature().type_signature.clone();
                ScalarUDF::new_from_impl(Bounded {
                    signature: Signature::new(signature, Volatility::Volatile),
                    inner: f.func.clone(),
                    pool: pool.clone(),
                })
            } else {
                return Ok(Transformed::no(Expr::ScalarFunction(f)));
            };
            Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(Arc::new(bounded), f.args),
            )))
        }
        e => Ok(Transformed::no(e)),
    })
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}
