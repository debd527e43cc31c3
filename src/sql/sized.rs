//! String functions whose results are sized by their arguments (`repeat`, `lpad`, `rpad`),
//! computed as PostgreSQL computes them, over whole batches. A value PostgreSQL could not
//! allocate (over 1 GB) is refused with 54000 before anything is allocated, as PostgreSQL
//! refuses it; and a batch's results are reserved from the query memory pool before they are
//! built, so that a statement asking for more than the pool has left fails with 53200
//! instead of taking the memory.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
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
        let result: ArrayRef = Arc::new(out.finish());
        drop(reservation);
        match scalar {
            true => Ok(ColumnarValue::Scalar(
                datafusion::common::ScalarValue::try_from_array(&result, 0)?,
            )),
            false => Ok(ColumnarValue::Array(result)),
        }
    }
}
