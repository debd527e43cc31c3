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

/// A relation's rows at the snapshot's epoch.
#[derive(Debug)]
pub struct SnapshotTable {
    pub name: String,
    pub schema: SchemaRef,
    pub table: TableId,
    pub snapshot: Arc<Snapshot>,
    /// Set when the relation's actor failed: its contents are no longer maintained.
    pub failure: Option<String>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Snapshot(epoch {})", self.epoch)
    }
}

#[async_trait]
impl TableProvider for SnapshotTable {
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
        if let Some(reason) = &self.failure {
            let e = Error::new(
                ErrorKind::Internal,
                format!("materialized view \"{}\" is broken: {reason}", self.name),
            )
            .with_hint("Drop and recreate the view.");
            return Err(DataFusionError::External(Box::new(e)));
        }
        let batches = read_snapshot(&self.snapshot, self.table, &self.schema, SCAN_ROWS_MAX)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            self.schema.clone(),
            projection.cloned(),
        )?)
    }
}

/// Rows held in memory: the latest rows of the table a DML statement changes.
#[derive(Debug)]
pub struct RowsTable {
    pub schema: SchemaRef,
    pub rows: RecordBatch,
}

#[async_trait]
impl TableProvider for RowsTable {
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
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![self.rows.clone()]],
            self.schema.clone(),
            projection.cloned(),
        )?)
    }
}
