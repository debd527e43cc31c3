//! Builds the DataFusion context a statement is planned and run in: every table and view
//! registered at one snapshot, PostgreSQL's session functions, PostgreSQL-like settings.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::catalog::MemorySchemaProvider;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::ScalarValue;
use datafusion::datasource::MemTable;
use datafusion::datasource::TableProvider;
use datafusion::error::DataFusionError;
use datafusion::execution::disk_manager::DiskManagerBuilder;
use datafusion::execution::memory_pool::{GreedyMemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::{
    create_udf, ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::catalog::{Catalog, Object, ObjectId};
use crate::error::{Error, ErrorKind, Result};
use crate::state::Snapshot;
use crate::stream::{ActorId, FailedActors};

use super::backends::Settings;
use super::provider::{Origin, RelationRows, RelationTable};

/// What `version()` answers; its shape is what drivers parse (`PostgreSQL <major>.<minor>`).
pub fn version_string() -> String {
    format!(
        "PostgreSQL {} (Weir {}) on {}-unknown-linux-gnu, compiled by rustc, 64-bit",
        crate::PG_VERSION,
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    )
}

pub fn base_config() -> SessionConfig {
    SessionConfig::new()
        .with_default_catalog_and_schema("weir", "public")
        .with_information_schema(false)
        .set_str("datafusion.sql_parser.dialect", "PostgreSQL")
        .set_bool("datafusion.sql_parser.map_string_types_to_utf8view", false)
        // Numeric literals are exact (`0.1` is numeric, as in PostgreSQL, not a float).
        .set_bool("datafusion.sql_parser.parse_float_as_decimal", true)
        // timestamptz values are computed and shown in UTC.
        .set_str(
            "datafusion.execution.time_zone",
            crate::types::TIMESTAMPTZ_ZONE,
        )
        .set_bool(
            "datafusion.execution.parquet.schema_force_view_types",
            false,
        )
        .with_target_partitions(1)
}

/// A context with Weir's configuration and analyzer rules, and no relations, whose queries
/// take their working memory from `runtime`'s pool.
fn new_context(runtime: &Arc<RuntimeEnv>) -> SessionContext {
    let state = SessionStateBuilder::new()
        .with_config(base_config())
        .with_runtime_env(runtime.clone())
        .with_default_features()
        .build();
    let rules: Vec<_> = super::rules::early_analyzer_rules()
        .into_iter()
        .chain(state.analyzer().rules.iter().cloned())
        .chain(super::rules::analyzer_rules())
        .collect();
    let ctx = SessionContext::new_with_state(
        SessionStateBuilder::new_from_existing(state)
            .with_analyzer_rules(rules)
            .with_query_planner(Arc::new(super::checked::CheckedPlanner))
            .with_physical_optimizer_rule(Arc::new(YieldingJoins))
            .build(),
    );
    ctx.register_udaf(super::checked::PgSum::udaf());
    for function in super::sized::sized_functions(&runtime.memory_pool) {
        ctx.register_udf(function);
    }
    ctx
}

/// Makes every join yield to the runtime between the batches it produces, so that a query is
/// stopped (by `statement_timeout`, a CancelRequest or its client leaving) between any two
/// batches. DataFusion yields only where its scans produce batches; a join turns one batch read
/// into any number of batches produced (a cross join of two 100,000-row inputs reads 26
/// batches and produces 10 billion rows), and would run to its end without yielding.
#[derive(Debug)]
struct YieldingJoins;

impl PhysicalOptimizerRule for YieldingJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if node.children().len() < 2 {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(
                Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>
            ))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "yielding_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// What batch queries run in: a memory pool of `bytes` shared by every query, and the
/// temporary files (`temp`) that operators spill to when they would go past it.
pub fn query_runtime(
    bytes: u64,
    temp: &Arc<crate::changelog::TempDisk>,
) -> Result<Arc<RuntimeEnv>> {
    let pool = TrackConsumersPool::new(
        GreedyMemoryPool::new(usize::try_from(bytes).unwrap_or(usize::MAX)),
        std::num::NonZeroUsize::MIN.saturating_add(2),
    );
    Ok(RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(pool))
        .with_disk_manager_builder(
            DiskManagerBuilder::default()
                .with_temp_file_factory(Arc::new(crate::changelog::Spills(temp.clone()))),
        )
        .build_arc()?)
}

/// A context with every relation of `catalog` that `scope` sees readable at `snapshot`, except those in
/// `overrides`, which are read from the given providers instead.
pub fn query_context(
    catalog: &Catalog,
    scope: crate::catalog::Scope,
    snapshot: &Arc<Snapshot>,
    failed: &FailedActors,
    settings: &Settings,
    overrides: Vec<(ObjectId, Arc<dyn TableProvider>)>,
    runtime: &Arc<RuntimeEnv>,
) -> Result<SessionContext> {
    let ctx = new_context(runtime);
    let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let relations = Arc::new(super::pg_catalog::Relations::of(catalog, scope, settings));
    for object in catalog.visible_objects(scope) {
        let id = object.id();
        let origin = relations.by_id(id).map(|r| Origin {
            oid: r.oid,
            columns: r.columns.iter().map(|c| (c.type_oid, c.typmod)).collect(),
        });
        let Some(schema) = catalog.schema(id) else {
            continue;
        };
        let provider: Arc<dyn TableProvider> = match overrides.iter().find(|(oid, _)| *oid == id) {
            Some((_, p)) => p.clone(),
            None if matches!(object, Object::Source(_)) => Arc::new(RelationTable {
                origin,
                schema,
                rows: RelationRows::Stream {
                    name: object.name().to_string(),
                },
            }),
            None => Arc::new(RelationTable {
                origin,
                schema,
                rows: RelationRows::Snapshot {
                    name: object.name().to_string(),
                    table: id,
                    snapshot: snapshot.clone(),
                    order: match object {
                        Object::Table(t) => t.storage_order(),
                        Object::View(_) | Object::Source(_) => Vec::new(),
                    },
                    failure: failure(&failed, id),
                },
            }),
        };
        ctx.register_table(object.name(), provider)?;
    }
    register_functions(&ctx, settings);
    let Some(weir) = ctx.catalog("weir") else {
        return Err(Error::internal("the default catalog is missing"));
    };
    weir.register_schema(
        "pg_catalog",
        Arc::new(super::pg_catalog::CatalogSchema::pg_catalog(
            relations.clone(),
        )),
    )?;
    weir.register_schema(
        "information_schema",
        Arc::new(super::pg_catalog::CatalogSchema::information_schema(
            relations.clone(),
        )),
    )?;
    super::pg_compat::register_functions(&ctx, &relations);
    Ok(ctx)
}

/// Why relation `id` cannot be read, if its actor failed. An actor that failed because a
/// relation it reads had failed reports no cause of its own: a full disk or another I/O error
/// that stopped an actor is then the likely one (it stops every actor that writes state).
fn failure(failed: &HashMap<ActorId, Error>, id: ObjectId) -> Option<Error> {
    let own = failed.get(&id)?;
    if own.kind != ErrorKind::Unavailable {
        return Some(own.clone());
    }
    Some(
        failed
            .values()
            .find(|e| e.kind.is_io())
            .unwrap_or(own)
            .clone(),
    )
}

/// The schema of Weir's own system tables (`weir_catalog.checkpoints`, ...).
pub const SYSTEM_SCHEMA: &str = "weir_catalog";

/// Registers the system tables under `weir_catalog`, each a batch of rows taken now.
pub fn register_system_tables(
    ctx: &SessionContext,
    tables: Vec<(&'static str, RecordBatch)>,
) -> Result<()> {
    let Some(catalog) = ctx.catalog("weir") else {
        return Err(Error::internal("the default catalog is missing"));
    };
    catalog.register_schema(SYSTEM_SCHEMA, Arc::new(MemorySchemaProvider::new()))?;
    for (name, batch) in tables {
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]])?;
        ctx.register_table(format!("{SYSTEM_SCHEMA}.{name}"), Arc::new(table))?;
    }
    Ok(())
}

/// The functions of a context, as a view's stored plan calls them (`stream::stored`).
pub struct PlanFunctions(datafusion::execution::SessionState);

impl PlanFunctions {
    /// The functions every context has, in a context without relations: reading a plan needs
    /// no table, and building every relation's provider and the system tables per view would
    /// cost a start time in the square of the catalog's size.
    pub fn new(runtime: &Arc<RuntimeEnv>) -> PlanFunctions {
        let ctx = new_context(runtime);
        register_functions(&ctx, &Settings::default());
        PlanFunctions(ctx.state())
    }
}

impl crate::stream::Functions for PlanFunctions {
    fn scalar(
        &self,
        name: &str,
        return_type: &DataType,
    ) -> Result<Arc<datafusion::logical_expr::ScalarUDF>> {
        if let Some(f) = super::checked::checked_function(name, return_type) {
            return Ok(f);
        }
        self.0.scalar_functions().get(name).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedFunction,
                format!("a view's stored plan calls {name}(), which this version of Weir lacks"),
            )
        })
    }

    fn config(&self) -> Arc<ConfigOptions> {
        self.0.config_options().clone()
    }
}

/// The name `now()` and `current_timestamp` take in a view's query: volatile, so that the
/// optimizer leaves it in the plan (it folds `now()` into a constant), where the view compiler
/// finds it and builds a temporal filter. Evaluated, it is the current time.
pub const VIEW_NOW: &str = "weir_now";

fn weir_now() -> datafusion::logical_expr::ScalarUDF {
    create_udf(
        VIEW_NOW,
        vec![],
        DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        Volatility::Volatile,
        Arc::new(|_| {
            let now = crate::clock::Clock::now_us(&crate::clock::SystemClock);
            Ok(ColumnarValue::Scalar(ScalarValue::TimestampMicrosecond(
                Some(now),
                Some("+00:00".into()),
            )))
        }),
    )
}

/// A function without arguments whose value is fixed for the query: `version()`,
/// `current_schema`, the session's user. `declared` is the PostgreSQL type of its text when
/// that is not `text` (the names are `name`), which the client is told.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Constant {
    name: String,
    value: String,
    declared: Option<u32>,
    signature: Signature,
}

impl Constant {
    fn udf(name: &str, value: String, declared: Option<u32>) -> ScalarUDF {
        ScalarUDF::new_from_impl(Constant {
            name: name.to_string(),
            value,
            declared,
            signature: Signature::nullary(Volatility::Stable),
        })
    }
}

impl ScalarUDFImpl for Constant {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(
        &self,
        _: ReturnFieldArgs,
    ) -> datafusion::error::Result<datafusion::arrow::datatypes::FieldRef> {
        let field = Field::new(&self.name, DataType::Utf8, false);
        Ok(Arc::new(match self.declared {
            Some(oid) => super::names::declared(field, oid),
            None => field,
        }))
    }

    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
            self.value.clone(),
        ))))
    }
}

fn register_functions(ctx: &SessionContext, settings: &Settings) {
    let name = Some(super::names::NAME_OID);
    ctx.register_udf(weir_now());
    ctx.register_udf(ScalarUDF::new_from_impl(super::to_char::ToChar::new()));
    ctx.register_udf(Constant::udf("version", version_string(), None));
    ctx.register_udf(Constant::udf("current_schema", "public".into(), name));
    for function in ["current_database", "current_catalog"] {
        ctx.register_udf(Constant::udf(function, crate::DATABASE_NAME.into(), name));
    }
    // The session's user (`current_user`, `user` and `current_role` too, until roles can be
    // switched).
    let user = (settings.get("session_authorization").cloned())
        .unwrap_or_else(|| super::pg_catalog::ROLE_NAME.to_string());
    for function in ["current_user", "session_user", "user", "current_role"] {
        ctx.register_udf(Constant::udf(function, user.clone(), name));
    }
    // Weir has no advisory locks, so a session holds none to release (a pool's reset of a
    // connection calls it). PostgreSQL returns void: an empty value.
    ctx.register_udf(create_udf(
        "pg_advisory_unlock_all",
        vec![],
        DataType::Utf8,
        Volatility::Volatile,
        Arc::new(|_| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(
                Some(String::new()),
            )))
        }),
    ));
    let settings = settings.clone();
    ctx.register_udf(create_udf(
        "current_setting",
        vec![DataType::Utf8],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(move |args| {
            let lookup = |name: &str| {
                settings.get(&name.to_lowercase()).cloned().ok_or_else(|| {
                    DataFusionError::External(Box::new(Error::new(
                        ErrorKind::UndefinedObject,
                        format!("unrecognized configuration parameter \"{name}\""),
                    )))
                })
            };
            match &args[0] {
                ColumnarValue::Scalar(ScalarValue::Utf8(Some(name))) => Ok(ColumnarValue::Scalar(
                    ScalarValue::Utf8(Some(lookup(name)?)),
                )),
                ColumnarValue::Scalar(_) => Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))),
                ColumnarValue::Array(a) => {
                    let names = a.as_any().downcast_ref::<StringArray>().ok_or_else(|| {
                        DataFusionError::Plan("current_setting takes text".into())
                    })?;
                    let mut out = Vec::with_capacity(names.len());
                    for n in names.iter() {
                        out.push(match n {
                            Some(n) => Some(lookup(n)?),
                            None => None,
                        });
                    }
                    Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
                }
            }
        }),
    ));
}
