//! PostgreSQL's array functions that tools' catalog queries call and DataFusion lacks:
//! `array_lower`, `array_upper`, and `information_schema._pg_expandarray` (pgJDBC's key
//! columns), which the rewrite plans as `unnest(weir_expandarray(a))`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int32Array, ListArray, StructArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::functions::{any, f, CatalogFn};

/// `array_lower` and `array_upper` of a one-dimensional array, and `weir_in_array`.
pub(super) fn array_functions() -> Vec<CatalogFn> {
    vec![
        in_array(),
        f(
            "array_upper",
            any(),
            2..=2,
            |_| DataType::Int32,
            |v| {
                let length = match (&v[0], v[1].cast_to(&DataType::Int64)?) {
                    (ScalarValue::List(a), ScalarValue::Int64(Some(1))) if !a.is_null(0) => {
                        a.value(0).len()
                    }
                    _ => 0,
                };
                Ok(ScalarValue::Int32(
                    i32::try_from(length).ok().filter(|&n| n > 0),
                ))
            },
        ),
        f(
            "array_lower",
            any(),
            2..=2,
            |_| DataType::Int32,
            |v| {
                // Weir's arrays start at 1; an empty one has no lower bound.
                let lower = match (&v[0], v[1].cast_to(&DataType::Int64)?) {
                    (ScalarValue::List(a), ScalarValue::Int64(Some(1))) => {
                        (!a.is_null(0) && !a.value(0).is_empty()).then_some(1)
                    }
                    _ => None,
                };
                Ok(ScalarValue::Int32(lower))
            },
        ),
    ]
}

/// `weir_in_array(x, a)`: `x IN (subquery)` over the subquery's values `a`, as PostgreSQL
/// answers it: true when `x` is one of them, false when there are none, NULL when `x` is NULL
/// or not found among values of which one is NULL, else false.
pub(super) fn in_array() -> CatalogFn {
    f(
        "weir_in_array",
        any(),
        2..=2,
        |_| DataType::Boolean,
        |v| {
            let values = match &v[1] {
                ScalarValue::List(a) if !a.is_null(0) => a.value(0),
                _ => return Ok(ScalarValue::Boolean(Some(false))),
            };
            if values.is_empty() {
                return Ok(ScalarValue::Boolean(Some(false)));
            }
            if v[0].is_null() {
                return Ok(ScalarValue::Boolean(None));
            }
            let x = v[0].cast_to(values.data_type())?;
            let mut unknown = false;
            for i in 0..values.len() {
                if values.is_null(i) {
                    unknown = true;
                } else if ScalarValue::try_from_array(&values, i)? == x {
                    return Ok(ScalarValue::Boolean(Some(true)));
                }
            }
            Ok(ScalarValue::Boolean((!unknown).then_some(false)))
        },
    )
}

/// `weir_expandarray(a)`: the elements of `a` as a list of `(x, n)` records, each element and
/// its position (from 1), which `unnest` turns into `_pg_expandarray`'s rows.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct ExpandArray {
    signature: Signature,
}

impl ExpandArray {
    pub(super) fn new() -> ExpandArray {
        ExpandArray {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

fn record_fields(element: &DataType) -> Fields {
    Fields::from(vec![
        Field::new("x", element.clone(), true),
        Field::new("n", DataType::Int32, false),
    ])
}

fn element_type(t: &DataType) -> DfResult<DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) => Ok(f.data_type().clone()),
        other => Err(DataFusionError::Plan(format!(
            "_pg_expandarray takes an array, not {other}"
        ))),
    }
}

impl ScalarUDFImpl for ExpandArray {
    fn name(&self) -> &str {
        "weir_expandarray"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        let element = element_type(args.first().unwrap_or(&DataType::Null))?;
        Ok(DataType::List(Arc::new(Field::new_list_field(
            DataType::Struct(record_fields(&element)),
            true,
        ))))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let list = arrays[0]
            .as_list_opt::<i32>()
            .ok_or_else(|| DataFusionError::Plan("_pg_expandarray takes an array".to_string()))?;
        let element = element_type(list.data_type())?;
        // Each element's position within its own array.
        let positions: Int32Array = (0..list.len())
            .flat_map(|row| {
                let length = if list.is_null(row) {
                    0
                } else {
                    list.value_length(row)
                };
                1..=length
            })
            .map(Some)
            .collect();
        let values = list.values().slice(
            list.value_offsets()[0] as usize,
            (list.value_offsets()[list.len()] - list.value_offsets()[0]) as usize,
        );
        let records = StructArray::try_new(
            record_fields(&element),
            vec![values, Arc::new(positions) as ArrayRef],
            None,
        )?;
        let base = list.value_offsets()[0];
        let offsets = OffsetBuffer::new(
            list.value_offsets()
                .iter()
                .map(|o| o - base)
                .collect::<Vec<i32>>()
                .into(),
        );
        let field = Arc::new(Field::new_list_field(
            DataType::Struct(record_fields(&element)),
            true,
        ));
        let result = ListArray::try_new(field, offsets, Arc::new(records), list.nulls().cloned())?;
        let result: ArrayRef = Arc::new(result);
        Ok(match &args.args[0] {
            ColumnarValue::Scalar(_) => {
                ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?)
            }
            ColumnarValue::Array(_) => ColumnarValue::Array(result),
        })
    }
}
