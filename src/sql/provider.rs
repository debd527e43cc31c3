//! Table providers that let DataFusion read Weir's relations: a table or view at a sealed
//! epoch, or (for the target of a DML statement) a table's latest rows.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::error::{Error, ErrorKind};
use crate::state::{Snapshot, TableId};
use crate::stream::operators::materialize::read_snapshot;

/// Distinct rows per batch when reading a relation.
const SCAN_ROWS_MAX: usize = 8192;

/// A relation as DataFusion reads it: at a sealed epoch, or (for the target of a DML
/// statement) as rows held in memory.
#[derive(Debug)]
pub struct RelationTable {
    pub schema: SchemaRef,
    pub rows: Rows,
}

#[derive(Debug)]
pub enum Rows {
    /// The relation's rows at the snapshot's epoch.
    Snapshot {
        name: String,
        table: TableId,
        snapshot: Arc<Snapshot>,
        /// Set when the relation's actor failed: its contents are no longer maintained.
        failure: Option<String>,
    },
    /// A table's latest rows, for the DML statement that changes it.
    Latest(RecordBatch),
    /// A source: a stream whose rows are not kept, so there is nothing to read.
    Stream { name: String },
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Snapshot(epoch {})", self.epoch)
    }
}

#[async_trait]
impl TableProvider for RelationTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let batches = match &self.rows {
            Rows::Snapshot {
                failure: Some(reason),
                name,
                ..
            } => {
                let e = Error::new(
                    ErrorKind::Internal,
                    format!("materialized view \"{name}\" is broken: {reason}"),
                )
                .with_hint("Drop and recreate the view.");
                return Err(DataFusionError::External(Box::new(e)));
            }
            Rows::Snapshot {
                table, snapshot, ..
            } => read_snapshot(snapshot, *table, &self.schema, SCAN_ROWS_MAX)
                .map_err(|e| DataFusionError::External(Box::new(e)))?,
            Rows::Latest(batch) => vec![batch.clone()],
            Rows::Stream { name } => {
                let e = Error::not_supported(format!(
                    "source \"{name}\" is a stream and keeps no rows to query"
                ))
                .with_hint("Create a materialized view over it, and query the view.");
                return Err(DataFusionError::External(Box::new(e)));
            }
        };
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            self.schema.clone(),
            projection.cloned(),
        )?)
    }
}
