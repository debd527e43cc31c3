//! Row keys: columns encoded as order-preserving bytes (Arrow's row format), and back.
//!
//! State tables key rows and groups by these bytes, so that a prefix scan visits a group and
//! ordered scans visit values in SQL order (MIN/MAX).

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};

use crate::error::Result;

pub struct RowCodec {
    converter: RowConverter,
    types: Vec<DataType>,
}

impl RowCodec {
    pub fn new(types: Vec<DataType>) -> Result<RowCodec> {
        let fields = types.iter().map(|t| SortField::new(t.clone())).collect();
        Ok(RowCodec {
            converter: RowConverter::new(fields)?,
            types,
        })
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

    pub fn types(&self) -> &[DataType] {
        &self.types
    }

    /// One key per row of `columns`.
    pub fn encode(&self, columns: &[ArrayRef]) -> Result<Vec<Vec<u8>>> {
        let rows = self.converter.convert_columns(columns)?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    }

    /// The columns of the rows whose keys are given, in that order.
    pub fn decode<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>> {
        let parser = self.converter.parser();
        let rows: Vec<_> = keys.into_iter().map(|k| parser.parse(k)).collect();
        Ok(self.converter.convert_rows(rows)?)
    }
}
