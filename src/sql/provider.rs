//! Table providers that let DataFusion read Weir's relations: a table or view at a sealed
//! epoch, or (for the target of a DML statement) a table's latest rows.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::ScalarValue;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};

use crate::error::{Error, ErrorKind};
use crate::state::{Snapshot, TableId};
use crate::stream::relation::{read_added_part, read_snapshot_part, Changes};
use crate::stream::RowCodec;

/// Distinct rows per batch when reading a relation.
const SCAN_ROWS_MAX: usize = 8192;

/// A relation as DataFusion reads it: at a sealed epoch, or (for DML) a table's latest rows.
#[derive(Debug)]
pub struct RelationTable {
    pub schema: SchemaRef,
    pub rows: RelationRows,
    /// How a client sees the relation's columns described (`RowDescription`), when known.
    pub origin: Option<Origin>,
}

/// A relation as a client's description of a result column names it: the relation's OID,
/// and each column's type OID and type modifier (`varchar(20)` is 1043 with 24).
#[derive(Debug, Clone)]
pub struct Origin {
    pub oid: u32,
    pub columns: Vec<(u32, i32)>,
}

/// Where a relation's rows are read from.
#[derive(Debug)]
pub enum RelationRows {
    /// The relation's rows at the snapshot's epoch.
    Snapshot {
        name: String,
        table: TableId,
        snapshot: Arc<Snapshot>,
        /// The order in which its rows store their columns (`RowCodec::ordered`).
        order: Vec<usize>,
        /// Set when the relation's actor failed: its contents are no longer maintained.
        failure: Option<Error>,
    },
    /// A table's latest rows, for DML: its rows at the snapshot's epoch with the changes of
    /// the statements the snapshot does not hold yet.
    Latest {
        table: TableId,
        snapshot: Arc<Snapshot>,
        order: Vec<usize>,
        changes: Arc<Changes>,
    },
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

    /// Equalities between a column and a constant are offered to the scan, which reads only
    /// the rows they select when they fix the first columns (rows are stored in the order of
    /// their columns' values). DataFusion applies them after the scan all the same.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match column_equals(f, &self.schema) {
                Some(_) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let read = match &self.rows {
            RelationRows::Snapshot {
                failure: Some(reason),
                name,
                ..
            } => return Err(external(broken(name, reason))),
            RelationRows::Snapshot {
                table,
                snapshot,
                order,
                ..
            } => (*table, snapshot.clone(), order.clone(), None),
            RelationRows::Latest {
                table,
                snapshot,
                order,
                changes,
            } => (
                *table,
                snapshot.clone(),
                order.clone(),
                Some(changes.clone()),
            ),
            RelationRows::Stream { name } => {
                return Err(external(
                    Error::not_supported(format!(
                        "source \"{name}\" is a stream and keeps no rows to query"
                    ))
                    .with_hint("Create a materialized view over it, and query the view."),
                ))
            }
        };
        let mut scan = SnapshotScan::new(read, self.schema.clone(), projection.cloned(), limit)?;
        scan.key_prefix(filters)?;
        Ok(Arc::new(scan))
    }
}

/// A relation at a sealed epoch, read batch by batch as the query consumes it: each batch is
/// read from RocksDB on a blocking thread, continuing after the last key read, so that a scan
/// holds one batch of the relation at a time and never blocks an async worker. With changes
/// (a table's latest rows), each row read is counted with its change, and the rows the
/// changes add come last.
#[derive(Debug)]
struct SnapshotScan {
    table: TableId,
    snapshot: Arc<Snapshot>,
    /// The order in which the rows store their columns (`RowCodec::ordered`).
    order: Vec<usize>,
    changes: Option<Arc<Changes>>,
    /// The relation's columns.
    schema: SchemaRef,
    projection: Option<Vec<usize>>,
    /// Rows past this many are not read (the query's LIMIT, when nothing filters first).
    limit: Option<usize>,
    /// Only rows whose keys start with these bytes are read: the encoding of the values that
    /// equalities fix for the columns the rows store first (empty: every row).
    prefix: Vec<u8>,
    /// The columns `prefix` fixes.
    fixed: Vec<usize>,
    properties: Arc<PlanProperties>,
}

impl SnapshotScan {
    fn new(
        (table, snapshot, order, changes): (
            TableId,
            Arc<Snapshot>,
            Vec<usize>,
            Option<Arc<Changes>>,
        ),
        schema: SchemaRef,
        projection: Option<Vec<usize>>,
        limit: Option<usize>,
    ) -> datafusion::error::Result<SnapshotScan> {
        let projected = match &projection {
            Some(p) => Arc::new(schema.project(p)?),
            None => schema.clone(),
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(projected),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(SnapshotScan {
            table,
            snapshot,
            order,
            changes,
            schema,
            projection,
            limit,
            prefix: Vec::new(),
            fixed: Vec::new(),
            properties,
        })
    }

    /// Narrows the scan to the rows that `filters` fix the first stored columns of, as far as
    /// equalities with constants fix them (`a = 1 AND b = 'x'` on a relation whose rows store
    /// a and b first).
    fn key_prefix(&mut self, filters: &[Expr]) -> datafusion::error::Result<()> {
        let fixed: Vec<(usize, ScalarValue)> = filters
            .iter()
            .flat_map(split_conjunction)
            .filter_map(|f| column_equals(f, &self.schema))
            .collect();
        let stored: Vec<usize> = if self.order.is_empty() {
            (0..self.schema.fields().len()).collect()
        } else {
            self.order.clone()
        };
        let (fixed_columns, values): (Vec<usize>, Vec<ScalarValue>) = stored
            .iter()
            .map_while(|c| fixed.iter().find(|(i, _)| i == c).cloned())
            .unzip();
        if values.is_empty() {
            return Ok(());
        }
        let types = values.iter().map(|v| v.data_type()).collect();
        let codec = RowCodec::new(types).map_err(external)?;
        let columns = values
            .iter()
            .map(|v| v.to_array())
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let mut keys = codec.encode(&columns).map_err(external)?;
        self.prefix = keys.pop().unwrap_or_default();
        self.fixed = fixed_columns;
        Ok(())
    }
}

/// The conjuncts of a filter (without recursion: a chain of `AND`s can be long).
fn split_conjunction(e: &Expr) -> Vec<&Expr> {
    let (mut out, mut todo) = (Vec::new(), vec![e]);
    while let Some(e) = todo.pop() {
        match e {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::And,
                right,
            }) => {
                todo.push(right);
                todo.push(left);
            }
            other => out.push(other),
        }
    }
    out
}

/// `column = constant` (either way round), as the column's index and the constant in the
/// column's type; None for anything else, and for a NULL constant, which selects nothing.
fn column_equals(e: &Expr, schema: &SchemaRef) -> Option<(usize, ScalarValue)> {
    let Expr::BinaryExpr(BinaryExpr {
        left,
        op: Operator::Eq,
        right,
    }) = e
    else {
        return None;
    };
    let (column, value) = match (left.as_ref(), right.as_ref()) {
        (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c)) => (c, v),
        _ => return None,
    };
    let index = schema.index_of(&column.name).ok()?;
    let field = schema.field(index);
    if value.is_null() || value.data_type() != *field.data_type() {
        return None;
    }
    Some((index, value.clone()))
}

impl DisplayAs for SnapshotScan {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "SnapshotScan: relation={}, epoch={}",
            self.table, self.snapshot.epoch
        )?;
        if !self.fixed.is_empty() {
            let fixed: Vec<&str> = self
                .fixed
                .iter()
                .map(|c| self.schema.field(*c).name().as_str())
                .collect();
            write!(f, ", fixed=[{}]", fixed.join(", "))?;
        }
        if self.changes.is_some() {
            write!(f, ", latest")?;
        }
        if let Some(limit) = self.limit {
            write!(f, ", limit={limit}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for SnapshotScan {
    fn name(&self) -> &str {
        "SnapshotScan"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let codec = Arc::new(RowCodec::ordered(&self.schema, &self.order).map_err(external)?);
        let (table, snapshot, schema) = (self.table, self.snapshot.clone(), self.schema.clone());
        let (projection, changes) = (self.projection.clone(), self.changes.clone());
        let prefix = Arc::new(self.prefix.clone());
        // Where the next batch starts, and how many rows may still be read.
        let start = (Phase::Snapshot(None), self.limit.unwrap_or(usize::MAX));
        let batches = futures::stream::try_unfold(start, move |(phase, left)| {
            let (snapshot, schema, codec) = (snapshot.clone(), schema.clone(), codec.clone());
            let (projection, prefix, changes) =
                (projection.clone(), prefix.clone(), changes.clone());
            async move {
                if left == 0 {
                    return Ok(None);
                }
                let read = tokio::task::spawn_blocking(move || {
                    let rows = SCAN_ROWS_MAX.min(left);
                    let after = match phase {
                        Phase::Snapshot(after) => {
                            let from = (prefix.as_slice(), after.as_deref());
                            let part = read_snapshot_part(
                                &snapshot,
                                table,
                                &schema,
                                &codec,
                                from,
                                rows,
                                changes.as_deref(),
                            )?;
                            if let Some((batch, last)) = part {
                                return Ok(Some((batch, Phase::Snapshot(Some(last)))));
                            }
                            // The snapshot is read: the rows the changes add are next.
                            None
                        }
                        Phase::Added(after) => after,
                    };
                    let Some(changes) = changes else {
                        return Ok(None);
                    };
                    let from = (prefix.as_slice(), after.as_deref());
                    let part =
                        read_added_part(&snapshot, table, &schema, &codec, from, rows, &changes)?;
                    Ok(part.map(|(batch, last)| (batch, Phase::Added(Some(last)))))
                })
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .map_err(external)?;
                let Some((batch, next)) = read else {
                    return Ok(None);
                };
                // A row stored with a count comes out that many times.
                let batch = batch.slice(0, batch.num_rows().min(left));
                let left = left - batch.num_rows();
                let batch = match &projection {
                    Some(p) => batch.project(p)?,
                    None => batch,
                };
                Ok(Some((batch, (next, left))))
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.properties.eq_properties.schema().clone(),
            batches,
        )))
    }
}

/// Where a scan of a relation goes on: in its snapshot, or (with changes) among the rows the
/// changes add, after the last key read.
enum Phase {
    Snapshot(Option<Vec<u8>>),
    Added(Option<Vec<u8>>),
}

fn external(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Why a relation whose actor failed cannot be read (its rows would stop at the epoch it
/// failed in): a full disk, no descriptor left or a device error keeps its kind, and a restart
/// once it is fixed restores the relation; anything else is a bug.
fn broken(name: &str, reason: &Error) -> Error {
    if reason.kind.is_io() {
        return Error::new(
            reason.kind,
            format!("relation \"{name}\" cannot be read: its actor stopped: {reason}"),
        )
        .with_hint(
            "Restart the server once the cause is fixed: the relation is restored from the \
             last checkpoint and its tables' change logs.",
        );
    }
    Error::new(
        ErrorKind::Internal,
        format!("relation \"{name}\" is broken: {reason}"),
    )
    .with_hint("Drop and recreate it.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{EpochWrites, StateStore};
    use crate::stream::relation::{Materialize, RowChanges};
    use crate::stream::test_util::{chunk, schema};
    use datafusion::arrow::array::{AsArray, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Int64Type};
    use futures::TryStreamExt;

    /// A relation of `distinct` rows `(i, i % 7)`, the first one stored twice.
    async fn relation(distinct: usize) -> (tempfile::TempDir, Arc<Snapshot>, SchemaRef) {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let s = schema(&[("a", DataType::Int64), ("b", DataType::Int64)]);
        let mut m = Materialize::new(store.clone(), 9, s.clone(), &[]).unwrap();
        let text: String = std::iter::once("+ 0 0\n".to_string())
            .chain((0..distinct).map(|i| format!("+ {i} {}\n", i % 7)))
            .collect();
        m.apply(&chunk(&s, &text)).unwrap();
        let mut w = EpochWrites::default();
        m.flush(&mut w).unwrap();
        store.commit(1, w).await.unwrap();
        store.seal(1);
        (dir, store.snapshot(), s)
    }

    async fn scan(
        snapshot: &Arc<Snapshot>,
        s: &SchemaRef,
        projection: Option<Vec<usize>>,
        limit: Option<usize>,
    ) -> Vec<RecordBatch> {
        let plan = SnapshotScan::new(
            (9, snapshot.clone(), Vec::new(), None),
            s.clone(),
            projection,
            limit,
        )
        .unwrap();
        plan.execute(0, Arc::new(TaskContext::default()))
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scan_reads_its_relation_batch_by_batch() {
        let distinct = 2 * SCAN_ROWS_MAX + 100;
        let (_dir, snapshot, s) = relation(distinct).await;
        let batches = scan(&snapshot, &s, None, None).await;
        let sizes: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
        // Batches of distinct rows; the row stored twice comes out twice.
        assert_eq!(sizes, [SCAN_ROWS_MAX + 1, SCAN_ROWS_MAX, 100]);
        let a: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let a = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Int64Array>();
                a.unwrap().values().to_vec()
            })
            .collect();
        let mut expected: Vec<i64> = (0..distinct as i64).collect();
        expected.insert(0, 0);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, expected, "every row once, in one pass");
        // A projection and a limit: only the rows asked for are read.
        let batches = scan(&snapshot, &s, Some(vec![1]), Some(10)).await;
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
        assert!(batches.iter().all(|b| b.num_columns() == 1));
        assert_eq!(batches[0].schema().field(0).name(), "b");
        // A limit of 0 reads nothing.
        let batches = scan(&snapshot, &s, None, Some(0)).await;
        assert!(batches.is_empty());
        // An equality on the first column reads that value's rows only.
        use datafusion::prelude::{col, lit};
        let mut plan = SnapshotScan::new(
            (9, snapshot.clone(), Vec::new(), None),
            s.clone(),
            None,
            None,
        )
        .unwrap();
        plan.key_prefix(&[col("b").eq(lit(6i64)).and(col("a").eq(lit(8000i64)))])
            .unwrap();
        let batches: Vec<RecordBatch> = plan
            .execute(0, Arc::new(TaskContext::default()))
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let rows: Vec<String> = batches
            .iter()
            .flat_map(|b| (0..b.num_rows()).map(move |r| format!("{:?}", b.slice(r, 1).columns())))
            .collect();
        assert_eq!(rows.len(), 1, "{rows:?}");
    }

    /// A table's latest rows: each row read counted with its change, those the changes add
    /// last, an equality narrowing both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn latest_rows_are_the_snapshot_with_the_changes() {
        let distinct = SCAN_ROWS_MAX + 10;
        let (_dir, snapshot, s) = relation(distinct).await;
        let codec = RowCodec::for_schema(&s).unwrap();
        let key = |a: i64, b: i64| {
            let columns: Vec<datafusion::arrow::array::ArrayRef> = vec![
                Arc::new(datafusion::arrow::array::Int64Array::from(vec![a])),
                Arc::new(datafusion::arrow::array::Int64Array::from(vec![b])),
            ];
            codec.encode(&columns).unwrap().pop().unwrap()
        };
        let mut changes = RowChanges::default();
        changes.insert(key(0, 0).into(), -1); // stored twice, once left
        changes.insert(key(5, 5).into(), -1); // gone
        changes.insert(key(3, 3).into(), 1); // twice now
        changes.insert(key(-1, 9).into(), 2); // new, twice
        let in_memory = Arc::new(Changes::new(Arc::new(changes), None));
        let read = |filters: Vec<Expr>, changes: &Arc<Changes>| {
            let mut plan = SnapshotScan::new(
                (9, snapshot.clone(), Vec::new(), Some(changes.clone())),
                s.clone(),
                None,
                None,
            )
            .unwrap();
            plan.key_prefix(&filters).unwrap();
            async move {
                let batches: Vec<RecordBatch> = plan
                    .execute(0, Arc::new(TaskContext::default()))
                    .unwrap()
                    .try_collect()
                    .await
                    .unwrap();
                let mut rows: Vec<(i64, i64)> = batches
                    .iter()
                    .flat_map(|b| {
                        let a = b.column(0).as_primitive::<Int64Type>().clone();
                        let c = b.column(1).as_primitive::<Int64Type>().clone();
                        (0..b.num_rows()).map(move |r| (a.value(r), c.value(r)))
                    })
                    .collect();
                rows.sort_unstable();
                rows
            }
        };
        let mut expected: Vec<(i64, i64)> = (0..distinct as i64)
            .filter(|i| *i != 5)
            .map(|i| (i, i % 7))
            .chain([(3, 3), (-1, 9), (-1, 9)])
            .collect();
        expected.sort_unstable();
        assert_eq!(read(vec![], &in_memory).await, expected);
        use datafusion::prelude::{col, lit};
        let a_is = |a: i64| vec![col("a").eq(lit(a))];
        assert_eq!(read(a_is(-1), &in_memory).await, [(-1, 9), (-1, 9)]);
        assert_eq!(read(a_is(3), &in_memory).await, [(3, 3), (3, 3)]);
        assert_eq!(read(a_is(5), &in_memory).await, []);

        // The same with some of the changes on disk (a transaction block's past memory), one
        // row's changes on both, and more rows added there than one read takes.
        let dir = tempfile::tempdir().unwrap();
        let tally = crate::state::Tally::create(&dir.path().join("t")).unwrap();
        let mut memory = RowChanges::default();
        memory.insert(key(0, 0).into(), -1);
        memory.insert(key(3, 3).into(), 2);
        let more = SCAN_ROWS_MAX as i64 + 10;
        let on_disk: Vec<(Vec<u8>, i64)> = [(key(5, 5), -1), (key(3, 3), -1), (key(-1, 9), 2)]
            .into_iter()
            .chain((0..more).map(|i| (key(-2 - i, 1), 1)))
            .map(|(k, c)| ([b"r".as_slice(), &k].concat(), c))
            .collect();
        tally
            .add(on_disk.iter().map(|(k, c)| (k.as_slice(), *c)))
            .unwrap();
        let layered = Arc::new(Changes::new(Arc::new(memory), Some(tally.view(b"r"))));
        // Changes written after the read began are not seen.
        tally.add([(on_disk[2].0.as_slice(), 5)]).unwrap();
        expected.extend((0..more).map(|i| (-2 - i, 1)));
        expected.sort_unstable();
        assert_eq!(read(vec![], &layered).await, expected);
        assert_eq!(read(a_is(-1), &layered).await, [(-1, 9), (-1, 9)]);
        assert_eq!(read(a_is(3), &layered).await, [(3, 3), (3, 3)]);
        assert_eq!(read(a_is(5), &layered).await, []);
        assert_eq!(read(a_is(-7), &layered).await, [(-7, 1)]);
    }

    /// Equalities on the first columns narrow the read to the rows they select; other
    /// filters still read every row; the answers are the same.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn equalities_on_the_first_columns_read_only_their_rows() {
        let (_dir, snapshot, s) = relation(1000).await;
        let ctx = datafusion::prelude::SessionContext::new();
        let table = RelationTable {
            origin: None,
            schema: s,
            rows: RelationRows::Snapshot {
                name: "t".into(),
                table: 9,
                snapshot,
                order: Vec::new(),
                failure: None,
            },
        };
        ctx.register_table("t", Arc::new(table)).unwrap();
        for (query, fixed, expected) in [
            ("SELECT count(*) FROM t WHERE a = 5", Some("fixed=[a]"), 1),
            ("SELECT count(*) FROM t WHERE 0 = a", Some("fixed=[a]"), 2),
            (
                "SELECT count(*) FROM t WHERE a = 5 AND b = 5",
                Some("fixed=[a, b]"),
                1,
            ),
            (
                "SELECT count(*) FROM t WHERE a = 5 AND b = 4",
                Some("fixed=[a, b]"),
                0,
            ),
            ("SELECT count(*) FROM t WHERE b = 3", None, 143),
            ("SELECT count(*) FROM t WHERE a = 5 OR a = 6", None, 2),
        ] {
            let df = ctx.sql(query).await.unwrap();
            let plan = df.clone().create_physical_plan().await.unwrap();
            let shown = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            match fixed {
                Some(columns) => assert!(shown.contains(columns), "{query}: {shown}"),
                None => assert!(!shown.contains("fixed="), "{query}: {shown}"),
            }
            let batches = df.collect().await.unwrap();
            let count = batches[0]
                .column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
                .unwrap()
                .value(0);
            assert_eq!(count, expected, "{query}");
        }
    }
}
