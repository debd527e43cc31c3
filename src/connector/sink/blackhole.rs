//! The blackhole connector: a sink whose changes go nowhere (the sink's actor counts them,
//! `weir_catalog.sinks`). A benchmark's passthrough query measures the dataflow, not a writer.

use crate::catalog::ViewDef;
use crate::error::Result;
use crate::stream::{SinkWriter, StreamChunk};

/// `connector = 'blackhole'`.
pub struct Blackhole;

impl super::Connector for Blackhole {
    fn name(&self) -> &'static str {
        "blackhole"
    }

    fn open(
        &self,
        _def: &ViewDef,
        _recovered: Option<&serde_json::Value>,
    ) -> Result<Box<dyn SinkWriter>> {
        Ok(Box::new(Dropping))
    }
}

/// Drops every change: nothing to make ready or final, and nothing to recover.
struct Dropping;

#[async_trait::async_trait]
impl SinkWriter for Dropping {
    fn write(&mut self, _chunk: &StreamChunk) -> Result<()> {
        Ok(())
    }

    async fn pre_commit(&mut self, _epoch: u64) -> Result<serde_json::Value> {
        Ok(serde_json::Value::Null)
    }

    async fn commit(&mut self, _epoch: u64) -> Result<()> {
        Ok(())
    }
}
