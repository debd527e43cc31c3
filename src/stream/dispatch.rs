//! Hash partitioning for exchanges between parallel actors (see
//! `docs/design/0002-parallel-dataflow.md`): a row's key is hashed to one of `VNODE_COUNT`
//! virtual nodes, each owned by one actor, and a chunk is split into one chunk per actor with
//! Arrow's `take`.
//!
//! The hash is Weir's own and must never change: state keys start with their vnode, so a key's
//! state is found where its vnode's owner left it, across restarts and versions. It is FNV-1a
//! over a canonical encoding of each value (integers widened to 64 bits, floats with -0.0 and
//! NaN normalised), finished with murmur3's 64-bit mixer.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int32Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type,
    Int32Type, Int64Type, Int8Type, IntervalMonthDayNanoType, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::PhysicalExpr;

use super::chunk::StreamChunk;
use super::expr::{eval_columns, ErrorSink};
use crate::error::{Error, Result};

/// Virtual nodes per fragment: the unit in which keys move between actors.
pub const VNODE_COUNT: usize = 256;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// murmur3's finaliser: spreads FNV's weak low bits over the whole word.
fn mix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Value tags, so that values of different kinds never encode alike.
mod tag {
    pub const NULL: u8 = 0;
    pub const INTEGER: u8 = 1;
    pub const LARGE_UNSIGNED: u8 = 2;
    pub const FLOAT: u8 = 3;
    pub const DECIMAL: u8 = 4;
    pub const TEXT: u8 = 5;
    pub const BOOLEAN: u8 = 6;
    pub const DATE: u8 = 7;
    pub const TIMESTAMP: u8 = 8;
    pub const INTERVAL: u8 = 9;
    pub const BINARY: u8 = 10;
}

/// Hashes each row's value of `column` into its running hash: `value(i, buf)` writes row i's
/// canonical encoding (NULLs are written here).
fn each(hashes: &mut [u64], column: &ArrayRef, mut value: impl FnMut(usize, &mut Vec<u8>)) {
    let mut buf = Vec::with_capacity(32);
    for (i, h) in hashes.iter_mut().enumerate().take(column.len()) {
        buf.clear();
        if column.is_null(i) {
            buf.push(tag::NULL);
        } else {
            value(i, &mut buf);
        }
        *h = fnv(*h, &buf);
    }
}

fn integer(buf: &mut Vec<u8>, v: i64) {
    buf.push(tag::INTEGER);
    buf.extend_from_slice(&v.to_le_bytes());
}

/// Integers of every width hash alike: 1 as a smallint is 1 as a bigint.
fn integers<T: ArrowPrimitiveType>(hashes: &mut [u64], column: &ArrayRef)
where
    T::Native: Into<i64>,
{
    let a = column.as_primitive::<T>();
    each(hashes, column, |i, b| integer(b, a.value(i).into()));
}

/// Floats hash as 64 bits, with -0.0 as 0.0 and every NaN alike.
fn floats<T: ArrowPrimitiveType>(hashes: &mut [u64], column: &ArrayRef)
where
    T::Native: Into<f64>,
{
    let a = column.as_primitive::<T>();
    each(hashes, column, |i, buf| {
        let v: f64 = a.value(i).into();
        let v = if v == 0.0 { 0.0 } else { v };
        let bits = if v.is_nan() {
            f64::NAN.to_bits()
        } else {
            v.to_bits()
        };
        buf.push(tag::FLOAT);
        buf.extend_from_slice(&bits.to_le_bytes());
    });
}

fn timestamps(hashes: &mut [u64], column: &ArrayRef, unit: TimeUnit) {
    fn of<T: ArrowPrimitiveType<Native = i64>>(hashes: &mut [u64], column: &ArrayRef, unit: u8) {
        let a = column.as_primitive::<T>();
        each(hashes, column, |i, buf| {
            buf.push(tag::TIMESTAMP);
            buf.push(unit);
            buf.extend_from_slice(&a.value(i).to_le_bytes());
        });
    }
    match unit {
        TimeUnit::Second => of::<TimestampSecondType>(hashes, column, 0),
        TimeUnit::Millisecond => of::<TimestampMillisecondType>(hashes, column, 1),
        TimeUnit::Microsecond => of::<TimestampMicrosecondType>(hashes, column, 2),
        TimeUnit::Nanosecond => of::<TimestampNanosecondType>(hashes, column, 3),
    }
}

fn feed(hashes: &mut [u64], column: &ArrayRef) -> Result<()> {
    match column.data_type() {
        DataType::Int8 => integers::<Int8Type>(hashes, column),
        DataType::Int16 => integers::<Int16Type>(hashes, column),
        DataType::Int32 => integers::<Int32Type>(hashes, column),
        DataType::Int64 => integers::<Int64Type>(hashes, column),
        DataType::UInt8 => integers::<UInt8Type>(hashes, column),
        DataType::UInt16 => integers::<UInt16Type>(hashes, column),
        DataType::UInt32 => integers::<UInt32Type>(hashes, column),
        DataType::UInt64 => {
            let a = column.as_primitive::<UInt64Type>();
            each(hashes, column, |i, b| match i64::try_from(a.value(i)) {
                Ok(v) => integer(b, v),
                Err(_) => {
                    b.push(tag::LARGE_UNSIGNED);
                    b.extend_from_slice(&a.value(i).to_le_bytes());
                }
            });
        }
        DataType::Float32 => floats::<Float32Type>(hashes, column),
        DataType::Float64 => floats::<Float64Type>(hashes, column),
        DataType::Decimal128(_, scale) => {
            let a = column.as_primitive::<Decimal128Type>();
            let scale = *scale as u8;
            each(hashes, column, |i, b| {
                b.push(tag::DECIMAL);
                b.push(scale);
                b.extend_from_slice(&a.value(i).to_le_bytes());
            });
        }
        DataType::Utf8 => {
            let a = column.as_string::<i32>();
            each(hashes, column, |i, b| {
                text(b, a.value(i).as_bytes(), tag::TEXT)
            });
        }
        DataType::LargeUtf8 => {
            let a = column.as_string::<i64>();
            each(hashes, column, |i, b| {
                text(b, a.value(i).as_bytes(), tag::TEXT)
            });
        }
        DataType::Utf8View => {
            let a = column.as_string_view();
            each(hashes, column, |i, b| {
                text(b, a.value(i).as_bytes(), tag::TEXT)
            });
        }
        DataType::Binary => {
            let a = column.as_binary::<i32>();
            each(hashes, column, |i, b| text(b, a.value(i), tag::BINARY));
        }
        DataType::Boolean => {
            let a = column.as_boolean();
            each(hashes, column, |i, b| {
                b.push(tag::BOOLEAN);
                b.push(a.value(i) as u8);
            });
        }
        DataType::Date32 => {
            let a = column.as_primitive::<Date32Type>();
            each(hashes, column, |i, b| {
                b.push(tag::DATE);
                b.extend_from_slice(&(a.value(i) as i64).to_le_bytes());
            });
        }
        DataType::Timestamp(unit, _) => timestamps(hashes, column, *unit),
        DataType::Interval(datafusion::arrow::datatypes::IntervalUnit::MonthDayNano) => {
            let a = column.as_primitive::<IntervalMonthDayNanoType>();
            each(hashes, column, |i, b| {
                let v = a.value(i);
                b.push(tag::INTERVAL);
                b.extend_from_slice(&v.months.to_le_bytes());
                b.extend_from_slice(&v.days.to_le_bytes());
                b.extend_from_slice(&v.nanoseconds.to_le_bytes());
            });
        }
        other => {
            return Err(Error::not_supported(format!(
                "partitioning by a {other} column is not supported"
            )))
        }
    }
    Ok(())
}

/// Whether values of type `t` can be hashed to a vnode.
pub fn hashable(t: &DataType) -> bool {
    use datafusion::arrow::datatypes::IntervalUnit;
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(..)
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::Boolean
            | DataType::Date32
            | DataType::Timestamp(..)
            | DataType::Interval(IntervalUnit::MonthDayNano)
    )
}

fn text(buf: &mut Vec<u8>, bytes: &[u8], t: u8) {
    buf.push(t);
    buf.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    buf.extend_from_slice(bytes);
}

/// The virtual node of every row, from its key columns (all of one length).
pub fn vnodes(keys: &[ArrayRef]) -> Result<Vec<u16>> {
    let rows = keys.first().map_or(0, |k| k.len());
    let mut hashes = vec![FNV_OFFSET; rows];
    for column in keys {
        feed(&mut hashes, column)?;
    }
    Ok(hashes
        .into_iter()
        .map(|h| (mix(h) % VNODE_COUNT as u64) as u16)
        .collect())
}

/// `vnode(a, b, ...)`: the virtual node of the values of its arguments, as an `int`. It spreads
/// rows over a fragment's actors where no key of the query does (the partial step of a
/// global aggregate or Top-N groups by the vnode of the whole row).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct VnodeOf {
    args: Vec<Arc<dyn PhysicalExpr>>,
}

impl VnodeOf {
    pub fn new(args: Vec<Arc<dyn PhysicalExpr>>) -> VnodeOf {
        VnodeOf { args }
    }

    pub fn args(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.args
    }

    /// The vnode of a row of `schema`, from every column whose type hashes.
    pub fn of_row(schema: &Schema) -> VnodeOf {
        let args = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| hashable(f.data_type()))
            .map(|(i, f)| Arc::new(Column::new(f.name(), i)) as Arc<dyn PhysicalExpr>)
            .collect();
        VnodeOf { args }
    }
}

impl fmt::Display for VnodeOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self.args.iter().map(|a| a.to_string()).collect();
        write!(f, "vnode({})", args.join(", "))
    }
}

impl PhysicalExpr for VnodeOf {
    fn data_type(&self, _input_schema: &Schema) -> datafusion::error::Result<DataType> {
        Ok(DataType::Int32)
    }

    fn nullable(&self, _input_schema: &Schema) -> datafusion::error::Result<bool> {
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> datafusion::error::Result<ColumnarValue> {
        let rows = batch.num_rows();
        let args = self
            .args
            .iter()
            .map(|a| a.evaluate(batch)?.into_array(rows))
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let vnodes = if args.is_empty() {
            vec![0; rows]
        } else {
            vnodes(&args).map_err(|e| DataFusionError::External(Box::new(e)))?
        };
        Ok(ColumnarValue::Array(Arc::new(
            Int32Array::from_iter_values(vnodes.into_iter().map(i32::from)),
        )))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.args.iter().collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        args: Vec<Arc<dyn PhysicalExpr>>,
    ) -> datafusion::error::Result<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(VnodeOf { args }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Which of a fragment's actors owns each virtual node: contiguous, nearly equal ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VnodeMapping {
    owners: Vec<u16>,
    actors: usize,
}

impl VnodeMapping {
    pub fn new(actors: usize) -> VnodeMapping {
        assert!(
            (1..=VNODE_COUNT).contains(&actors),
            "a fragment has between 1 and {VNODE_COUNT} actors"
        );
        let owners = (0..VNODE_COUNT)
            .map(|v| (v * actors / VNODE_COUNT) as u16)
            .collect();
        VnodeMapping { owners, actors }
    }

    pub fn actors(&self) -> usize {
        self.actors
    }

    pub fn owner(&self, vnode: u16) -> usize {
        self.owners[vnode as usize] as usize
    }
}

/// Splits a chunk by the owners of its rows' keys: one chunk per actor, `None` for an actor
/// that gets no rows. Rows keep their order within each part.
pub fn split(
    chunk: &StreamChunk,
    keys: &[ArrayRef],
    mapping: &VnodeMapping,
) -> Result<Vec<Option<StreamChunk>>> {
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); mapping.actors()];
    for (i, vnode) in vnodes(keys)?.into_iter().enumerate() {
        rows[mapping.owner(vnode)].push(i as u32);
    }
    rows.into_iter()
        .map(|r| {
            if r.is_empty() {
                Ok(None)
            } else if r.len() == chunk.len() {
                Ok(Some(chunk.clone()))
            } else {
                chunk.take(&r).map(Some)
            }
        })
        .collect()
}

/// The sending end of a hash exchange: splits each chunk among a fragment's actors by the
/// vnodes of the rows' keys, evaluated over the sender's rows.
#[derive(Debug)]
pub struct Partitioner {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The types the keys are hashed in (both sides of a join hash alike).
    key_types: Vec<DataType>,
    mapping: VnodeMapping,
    /// A key that fails on a row is NULL there, as it is for the receiving operator, which
    /// evaluates the same key again and reports the error to its view; so none is reported
    /// here.
    unreported: ErrorSink,
}

impl Partitioner {
    pub fn new(
        keys: Vec<Arc<dyn PhysicalExpr>>,
        key_types: Vec<DataType>,
        actors: usize,
    ) -> Partitioner {
        Partitioner {
            keys,
            key_types,
            mapping: VnodeMapping::new(actors),
            unreported: ErrorSink::new("exchange"),
        }
    }

    pub fn actors(&self) -> usize {
        self.mapping.actors()
    }

    /// One chunk per actor (`None` for an actor that gets no rows).
    pub fn split(&self, chunk: &StreamChunk) -> Result<Vec<Option<StreamChunk>>> {
        let mut columns = eval_columns(&self.keys, &chunk.data, &chunk.ops, &self.unreported)?;
        for (c, t) in columns.iter_mut().zip(&self.key_types) {
            if c.data_type() != t {
                *c = cast(c, t)?;
            }
        }
        split(chunk, &columns, &self.mapping)
    }
}

#[cfg(test)]
mod tests {

    use datafusion::arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};

    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};

    fn ints64(values: &[Option<i64>]) -> ArrayRef {
        Arc::new(Int64Array::from(values.to_vec()))
    }

    #[test]
    fn the_hash_never_changes() {
        // State keys start with these vnodes: a change here moves every key's state. (The
        // values were computed independently of this code, from the definition above.)
        let keys = [
            ints64(&[Some(0), Some(1), Some(5), None]),
            Arc::new(StringArray::from(vec![
                Some("a"),
                Some(""),
                Some("weir"),
                None,
            ])) as ArrayRef,
        ];
        assert_eq!(vnodes(&keys).unwrap(), [146, 158, 4, 109]);
    }

    #[test]
    fn equal_values_of_different_types_share_a_vnode() {
        let small: ArrayRef = Arc::new(Int32Array::from(vec![5, -7]));
        let big = ints64(&[Some(5), Some(-7)]);
        assert_eq!(vnodes(&[small]).unwrap(), vnodes(&[big]).unwrap());
        let zeros: ArrayRef = Arc::new(Float64Array::from(vec![0.0, -0.0]));
        let v = vnodes(&[zeros]).unwrap();
        assert_eq!(v[0], v[1]);
        // NULL is not zero, and the order of key columns matters.
        let v = vnodes(&[ints64(&[None, Some(0)])]).unwrap();
        assert_ne!(v[0], v[1]);
        let (a, b) = (ints64(&[Some(1)]), ints64(&[Some(2)]));
        assert_ne!(
            vnodes(&[a.clone(), b.clone()]).unwrap(),
            vnodes(&[b, a]).unwrap()
        );
    }

    #[test]
    fn vnodes_are_owned_in_contiguous_balanced_ranges() {
        assert!((0..256).all(|v| VnodeMapping::new(1).owner(v) == 0));
        let m = VnodeMapping::new(3);
        let counts: Vec<usize> = (0..3)
            .map(|a| (0..256u16).filter(|v| m.owner(*v) == a).count())
            .collect();
        assert_eq!(counts.iter().sum::<usize>(), 256);
        assert!(counts.iter().all(|c| (85..=86).contains(c)), "{counts:?}");
        assert!((1..256u16).all(|v| m.owner(v) >= m.owner(v - 1)));
    }

    #[test]
    fn split_sends_each_key_to_one_actor_and_keeps_every_row() {
        let s = schema(&[("k", DataType::Int64), ("v", DataType::Utf8)]);
        let text: String = (0..1000)
            .map(|i| format!("{} {} x{i}\n", if i % 3 == 0 { "-" } else { "+" }, i % 97))
            .collect();
        let c = chunk(&s, &text);
        let mapping = VnodeMapping::new(4);
        let parts = split(&c, &[c.data.column(0).clone()], &mapping).unwrap();
        let mut total = 0;
        let mut owner_of_key = std::collections::HashMap::new();
        for (actor, part) in parts.iter().enumerate() {
            let part = part.as_ref().expect("every actor gets some of 97 keys");
            total += part.len();
            // A fair share: 97 keys over 4 actors.
            assert!(
                (150..=350).contains(&part.len()),
                "actor {actor}: {}",
                part.len()
            );
            let keys = part.data.column(0).as_primitive::<Int64Type>();
            for k in keys.values() {
                assert_eq!(*owner_of_key.entry(*k).or_insert(actor), actor);
            }
        }
        assert_eq!(total, 1000);
    }

    #[test]
    fn a_partitioner_splits_by_a_computed_key_in_the_hashing_type() {
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
        use datafusion::scalar::ScalarValue;

        let s = schema(&[("a", DataType::Int32), ("v", DataType::Utf8)]);
        let text: String = (0..200).map(|i| format!("+ {i} x{i}\n")).collect();
        let c = chunk(&s, &text);
        // The right side of `ON l.k = r.a + 1`, hashed as bigint like the left side's key.
        let key: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("a", 0)),
            Operator::Plus,
            Arc::new(Literal::new(ScalarValue::Int32(Some(1)))),
        ));
        let partitioner = Partitioner::new(vec![key], vec![DataType::Int64], 3);
        let parts = partitioner.split(&c).unwrap();
        assert_eq!(parts.len(), 3);
        let mapping = VnodeMapping::new(3);
        let mut total = 0;
        for (actor, part) in parts.into_iter().enumerate() {
            let part = part.expect("200 keys reach every actor");
            total += part.len();
            let a = part.data.column(0).as_primitive::<Int32Type>();
            let keys: Vec<Option<i64>> = a.values().iter().map(|v| Some(*v as i64 + 1)).collect();
            for v in vnodes(&[ints64(&keys)]).unwrap() {
                assert_eq!(mapping.owner(v), actor);
            }
        }
        assert_eq!(total, 200);
    }

    #[test]
    fn vnode_of_a_row_hashes_its_hashable_columns() {
        let s = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new("k", DataType::Int64, true),
            datafusion::arrow::datatypes::Field::new(
                "t",
                DataType::Time64(TimeUnit::Microsecond),
                true,
            ),
        ]));
        let keys = ints64(&[Some(1), Some(2), None]);
        let times: ArrayRef = Arc::new(datafusion::arrow::array::Time64MicrosecondArray::from(
            vec![5, 6, 7],
        ));
        let batch = RecordBatch::try_new(s.clone(), vec![keys.clone(), times]).unwrap();
        let got = VnodeOf::of_row(&s)
            .evaluate(&batch)
            .unwrap()
            .into_array(3)
            .unwrap();
        let want: Vec<i32> = vnodes(&[keys])
            .unwrap()
            .into_iter()
            .map(i32::from)
            .collect();
        assert_eq!(got.as_primitive::<Int32Type>().values().to_vec(), want);
        // With no column to hash, every row has vnode 0.
        let none = VnodeOf::new(vec![])
            .evaluate(&batch)
            .unwrap()
            .into_array(3)
            .unwrap();
        assert_eq!(
            none.as_primitive::<Int32Type>().values().to_vec(),
            [0, 0, 0]
        );
    }
}
