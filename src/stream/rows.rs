//! Row keys: columns encoded as order-preserving bytes (Arrow's row format), and back.
//!
//! State tables key rows and groups by these bytes, so that a prefix scan visits a group and
//! ordered scans visit values in SQL order (MIN/MAX).

use datafusion::arrow::array::{make_array, Array, ArrayRef};
use datafusion::arrow::buffer::MutableBuffer;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};

use crate::error::Result;

pub struct RowCodec {
    converter: RowConverter,
    types: Vec<DataType>,
    /// The columns in the order their values are encoded (`order[i]` is the column encoded
    /// i-th), and where each column is encoded; both empty when that is the columns' order.
    order: Vec<usize>,
    position: Vec<usize>,
}

impl RowCodec {
    pub fn new(types: Vec<DataType>) -> Result<RowCodec> {
        let fields = types.iter().map(|t| SortField::new(t.clone())).collect();
        Ok(RowCodec {
            converter: RowConverter::new(fields)?,
            types,
            order: Vec::new(),
            position: Vec::new(),
        })
    }

    /// A codec for rows of `schema` that encodes their columns in `order` (a permutation of
    /// the column positions; empty for the columns' own order), so that keys sort by those
    /// columns first. Columns go in and come out in the schema's order.
    pub fn ordered(schema: &SchemaRef, order: &[usize]) -> Result<RowCodec> {
        if order.is_empty() || order.iter().enumerate().all(|(i, c)| i == *c) {
            return RowCodec::for_schema(schema);
        }
        let mut position = vec![usize::MAX; order.len()];
        for (i, c) in order.iter().enumerate() {
            match position.get_mut(*c) {
                Some(p) if *p == usize::MAX => *p = i,
                _ => {
                    return Err(crate::error::Error::internal(format!(
                        "column order {order:?} is not a permutation"
                    )))
                }
            }
        }
        if order.len() != schema.fields().len() {
            return Err(crate::error::Error::internal(format!(
                "column order {order:?} does not cover {} columns",
                schema.fields().len()
            )));
        }
        let mut codec = RowCodec::new(
            order
                .iter()
                .map(|c| schema.field(*c).data_type().clone())
                .collect(),
        )?;
        codec.order = order.to_vec();
        codec.position = position;
        Ok(codec)
    }

    pub fn for_schema(schema: &SchemaRef) -> Result<RowCodec> {
        RowCodec::new(
            schema
                .fields()
                .iter()
                .map(|f| f.data_type().clone())
                .collect(),
        )
    }

    /// The types of the columns in the order they are encoded.
    pub fn types(&self) -> &[DataType] {
        &self.types
    }

    /// The columns in the order they are encoded (`None`: their own order).
    pub fn order(&self) -> Option<&[usize]> {
        (!self.order.is_empty()).then_some(self.order.as_slice())
    }

    /// One key per row of `columns`.
    pub fn encode(&self, columns: &[ArrayRef]) -> Result<Vec<Vec<u8>>> {
        let rows = if self.order.is_empty() {
            self.converter.convert_columns(columns)?
        } else {
            let ordered: Vec<ArrayRef> = self.order.iter().map(|c| columns[*c].clone()).collect();
            self.converter.convert_columns(&ordered)?
        };
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    }

    /// The columns of the rows whose keys are given, in that order.
    pub fn decode<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>> {
        let parser = self.converter.parser();
        let rows: Vec<_> = keys.into_iter().map(|k| parser.parse(k)).collect();
        let columns = self.converter.convert_rows(rows)?;
        let columns: Vec<ArrayRef> = if self.position.is_empty() {
            columns
        } else {
            self.position.iter().map(|p| columns[*p].clone()).collect()
        };
        columns.into_iter().map(zero_null_slots).collect()
    }
}

/// The row format decodes a NULL integer as the type's minimum value (its all-zero key bytes
/// with the sign bit restored). Arrow leaves null slots unspecified, but some kernels compute
/// on them before applying the null mask, and overflow there (`date_trunc` subtracts from
/// `i64::MIN`); so decoded null slots are set to zero, as Arrow's builders write them.
fn zero_null_slots(array: ArrayRef) -> Result<ArrayRef> {
    let width = match array.data_type().primitive_width() {
        Some(w) if array.null_count() > 0 => w,
        _ => return Ok(array),
    };
    let data = array.to_data();
    let Some(nulls) = data.nulls() else {
        return Ok(array);
    };
    let mut values = MutableBuffer::from(data.buffers()[0].as_slice().to_vec());
    let bytes = values.as_slice_mut();
    for i in 0..data.len() {
        if nulls.is_null(i) {
            let start = (data.offset() + i) * width;
            bytes[start..start + width].fill(0);
        }
    }
    let data = data.into_builder().buffers(vec![values.into()]).build()?;
    Ok(make_array(data))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{AsArray, Int64Array, StringArray, TimestampMicrosecondArray};
    use datafusion::arrow::datatypes::{Int64Type, TimeUnit, TimestampMicrosecondType};

    use super::*;

    #[test]
    fn rows_round_trip_and_null_slots_decode_as_zero() {
        let codec = RowCodec::new(vec![
            DataType::Int64,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            DataType::Utf8,
        ])
        .unwrap();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![Some(-5), None])),
            Arc::new(TimestampMicrosecondArray::from(vec![None, Some(7)])),
            Arc::new(StringArray::from(vec![Some("a"), None])),
        ];
        let keys = codec.encode(&columns).unwrap();
        let decoded = codec.decode(keys.iter().map(|k| k.as_slice())).unwrap();
        assert_eq!(decoded, columns);
        assert_eq!(decoded[0].as_primitive::<Int64Type>().values()[1], 0);
        // Encoded in another order, the keys sort by the columns encoded first; the columns
        // come back in their own order.
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new("a", DataType::Int64, true),
            datafusion::arrow::datatypes::Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            datafusion::arrow::datatypes::Field::new("s", DataType::Utf8, true),
        ]));
        let ordered = RowCodec::ordered(&schema, &[2, 0, 1]).unwrap();
        let keys = ordered.encode(&columns).unwrap();
        let by_s = RowCodec::new(vec![DataType::Utf8]).unwrap();
        let s_keys = by_s.encode(&columns[2..]).unwrap();
        assert!(keys[0].starts_with(&s_keys[0]) && keys[1].starts_with(&s_keys[1]));
        assert_eq!(
            ordered.decode(keys.iter().map(|k| k.as_slice())).unwrap(),
            decoded
        );
        assert!(RowCodec::ordered(&schema, &[0, 0, 1]).is_err());
        assert!(RowCodec::ordered(&schema, &[1, 0]).is_err());
        assert_eq!(
            decoded[1]
                .as_primitive::<TimestampMicrosecondType>()
                .values()[0],
            0
        );
    }
}
