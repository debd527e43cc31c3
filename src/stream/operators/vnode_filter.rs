//! VnodeFilter: the receiving end of a hash exchange. Each of a fragment's parallel actors
//! keeps the rows whose key hashes to a virtual node it owns (`stream::dispatch`), with one
//! Arrow filter per chunk, so that every key's state lives in exactly one actor.

use std::sync::Arc;

use datafusion::arrow::array::BooleanArray;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::physical_plan::PhysicalExpr;

use crate::error::Result;
use crate::stream::chunk::StreamChunk;
use crate::stream::dispatch::{vnodes, VnodeMapping};
use crate::stream::expr::{eval_columns, ErrorSink};
use crate::stream::message::Watermark;
use crate::stream::operator::Operator;

pub struct VnodeFilter {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The types the keys are compared in (both sides of a join hash alike).
    key_types: Vec<DataType>,
    mapping: VnodeMapping,
    owner: usize,
    errors: ErrorSink,
}

impl VnodeFilter {
    pub fn new(
        keys: Vec<Arc<dyn PhysicalExpr>>,
        key_types: Vec<DataType>,
        mapping: VnodeMapping,
        owner: usize,
        errors: ErrorSink,
    ) -> VnodeFilter {
        VnodeFilter {
            keys,
            key_types,
            mapping,
            owner,
            errors,
        }
    }
}

impl Operator for VnodeFilter {
    fn on_chunk(
        &mut self,
        _input: usize,
        chunk: StreamChunk,
        out: &mut Vec<StreamChunk>,
    ) -> Result<()> {
        let mut columns = eval_columns(&self.keys, &chunk.data, &self.errors)?;
        for (c, t) in columns.iter_mut().zip(&self.key_types) {
            if c.data_type() != t {
                *c = cast(c, t)?;
            }
        }
        let mask: BooleanArray = vnodes(&columns)?
            .into_iter()
            .map(|v| Some(self.mapping.owner(v) == self.owner))
            .collect();
        let kept = chunk.filter(&mask)?;
        if !kept.is_empty() {
            out.push(kept);
        }
        Ok(())
    }

    /// Every actor of the fragment sees every watermark.
    fn on_watermark(
        &mut self,
        _input: usize,
        watermark: Watermark,
        _out: &mut Vec<StreamChunk>,
    ) -> Result<Vec<Watermark>> {
        Ok(vec![watermark])
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use datafusion::physical_expr::expressions::col;

    #[test]
    fn the_actors_of_a_fragment_share_the_rows_out() {
        let s = schema(&[("k", DataType::Int64), ("v", DataType::Int64)]);
        let text: String = (0..200).map(|i| format!("+ {} {i}\n", i % 13)).collect();
        let c = chunk(&s, &text);
        let mut total = 0;
        let mut owner_of_key: HashMap<String, usize> = HashMap::new();
        for owner in 0..3 {
            let mut f = VnodeFilter::new(
                vec![col("k", &s).unwrap()],
                vec![DataType::Int32],
                VnodeMapping::new(3),
                owner,
                ErrorSink::new("v"),
            );
            let mut out = vec![];
            f.on_chunk(0, c.clone(), &mut out).unwrap();
            for part in &out {
                total += part.len();
                for line in part.to_string().lines() {
                    let key = line.split(' ').nth(1).unwrap().to_string();
                    // No key goes to two actors.
                    assert_eq!(*owner_of_key.entry(key).or_insert(owner), owner);
                }
            }
        }
        assert_eq!(total, 200);
        assert_eq!(owner_of_key.len(), 13);
    }
}
