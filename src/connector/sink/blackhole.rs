//! The blackhole connector: a sink whose changes go nowhere (the sink's actor counts them,
//! `weir_catalog.sinks`), with no log and nothing to deliver. A benchmark's passthrough query
//! measures the dataflow, not a writer.

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::SchemaRef;

use super::{Options, Spec};
use crate::error::{Error, Result};
use crate::stream::SinkWriter;

/// `connector = 'blackhole'`.
pub struct Blackhole;

impl super::Connector for Blackhole {
    fn name(&self) -> &'static str {
        "blackhole"
    }

    fn create(
        &self,
        _name: &str,
        _options: &mut Options,
        _spec: &Spec,
        _schema: &SchemaRef,
    ) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }

    fn delivers(&self) -> bool {
        false
    }

    fn open(
        &self,
        name: &str,
        _options: &BTreeMap<String, String>,
        _spec: &Spec,
        _schema: &SchemaRef,
    ) -> Result<Box<dyn SinkWriter>> {
        Err(Error::internal(format!(
            "sink \"{name}\" is a blackhole: it delivers nothing"
        )))
    }
}
