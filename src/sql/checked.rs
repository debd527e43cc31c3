//! Integer arithmetic that raises an error on overflow, as PostgreSQL does (22003, `integer out
//! of range`), where DataFusion's `+`, `-` and `*` wrap around.
//!
//! Three places see integer arithmetic, and each gets it checked:
//! - constants: `FoldIntegers`, an analyzer rule, folds `+ - *` of integer constants with
//!   checked arithmetic before DataFusion's simplifier could fold them wrapping
//!   (`SELECT 2147483647 + 1` is refused when planned);
//! - batch queries and DML: `CheckedPlanner` turns `+ - *` of integer operands of the optimised
//!   plan into `CheckedArithmetic` calls just before physical planning. Earlier, as an analyzer
//!   rule, the calls would have made every later pass quadratic in a long chain's length
//!   (DataFusion works a function call's type out from its arguments', recursively);
//! - views: `checked_physical` does the same to each physical expression their operators
//!   evaluate.
//!
//! And `sum` has PostgreSQL's result types (`PgSum`): `bigint` for `smallint` and `integer`,
//! `numeric` for `bigint`, so that it does not overflow where PostgreSQL's does not.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::Array;
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::catalog::Session;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::expr::{Cast, ScalarFunction};
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr::expressions::BinaryExpr as PhysicalBinary;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use datafusion::arrow::datatypes::FieldRef;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, GroupsAccumulator, ReversedUDAF,
    SetMonotonicity,
};

use crate::error::{Error, ErrorKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Plus,
    Minus,
    Multiply,
}

impl Op {
    fn of(op: &Operator) -> Option<Op> {
        match op {
            Operator::Plus => Some(Op::Plus),
            Operator::Minus => Some(Op::Minus),
            Operator::Multiply => Some(Op::Multiply),
            _ => None,
        }
    }

    fn apply(self, a: i64, b: i64) -> Option<i64> {
        match self {
            Op::Plus => a.checked_add(b),
            Op::Minus => a.checked_sub(b),
            Op::Multiply => a.checked_mul(b),
        }
    }
}

fn is_integer(t: &DataType) -> bool {
    matches!(t, DataType::Int16 | DataType::Int32 | DataType::Int64)
}

/// PostgreSQL's name of an integer type, for its `... out of range` message.
fn type_name(t: &DataType) -> &'static str {
    match t {
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        _ => "bigint",
    }
}

fn out_of_range(t: &DataType) -> DataFusionError {
    DataFusionError::External(Box::new(Error::new(
        ErrorKind::NumericOutOfRange,
        format!("{} out of range", type_name(t)),
    )))
}

/// `+`, `-` or `*` of two integers of one type, with PostgreSQL's error on overflow.
#[derive(Debug, PartialEq, Eq, Hash)]
struct CheckedArithmetic {
    op: Op,
    data_type: DataType,
    signature: Signature,
}

impl CheckedArithmetic {
    fn udf(op: Op, data_type: DataType) -> Arc<ScalarUDF> {
        Arc::new(ScalarUDF::new_from_impl(CheckedArithmetic {
            op,
            data_type,
            signature: Signature::any(2, Volatility::Immutable),
        }))
    }
}

/// The checked arithmetic function `name` (as a stored plan names it) of result `data_type`.
pub fn checked_function(name: &str, data_type: &DataType) -> Option<Arc<ScalarUDF>> {
    let op = match name {
        "checked_plus" => Op::Plus,
        "checked_minus" => Op::Minus,
        "checked_multiply" => Op::Multiply,
        _ => return None,
    };
    Some(CheckedArithmetic::udf(op, data_type.clone()))
}

impl ScalarUDFImpl for CheckedArithmetic {
    fn name(&self) -> &str {
        match self.op {
            Op::Plus => "checked_plus",
            Op::Minus => "checked_minus",
            Op::Multiply => "checked_multiply",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(self.data_type.clone())
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        use datafusion::arrow::compute::kernels::numeric;
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [left, right] = arrays.as_slice() else {
            return Err(DataFusionError::Internal(format!(
                "{} takes two arguments",
                self.name()
            )));
        };
        let result = match self.op {
            Op::Plus => numeric::add(left, right),
            Op::Minus => numeric::sub(left, right),
            Op::Multiply => numeric::mul(left, right),
        };
        let result = match result {
            Ok(r) => r,
            Err(ArrowError::ArithmeticOverflow(_)) => return Err(out_of_range(&self.data_type)),
            Err(e) => return Err(e.into()),
        };
        if scalar && result.len() == 1 {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &result, 0,
            )?));
        }
        Ok(ColumnarValue::Array(result))
    }
}

/// The type of `e`, without recursion where `e` is already checked arithmetic (whose operands
/// DataFusion would otherwise type again, all the way down a chain).
fn type_of(e: &Expr, schema: &DFSchema) -> Option<DataType> {
    if let Expr::ScalarFunction(ScalarFunction { func, .. }) = e {
        if let Some(c) = func.inner().downcast_ref::<CheckedArithmetic>() {
            return Some(c.data_type.clone());
        }
    }
    e.get_type(schema).ok()
}

/// `a op b` as checked arithmetic, where both are integers of one type.
fn checked_expr(e: Expr, schema: &DFSchema) -> datafusion::error::Result<Transformed<Expr>> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &e else {
        return Ok(Transformed::no(e));
    };
    let Some(op) = Op::of(op) else {
        return Ok(Transformed::no(e));
    };
    match (type_of(left, schema), type_of(right, schema)) {
        (Some(l), Some(r)) if l == r && is_integer(&l) => {
            let args = vec![left.as_ref().clone(), right.as_ref().clone()];
            Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(CheckedArithmetic::udf(op, l), args),
            )))
        }
        _ => Ok(Transformed::no(e)),
    }
}

/// Plans queries as DataFusion does, with integer arithmetic checked.
#[derive(Debug)]
pub struct CheckedPlanner;

#[async_trait]
impl QueryPlanner for CheckedPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        state: &dyn Session,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let plan = super::rules::rewrite_expressions(plan.clone(), checked_expr)?;
        DefaultPhysicalPlanner::default()
            .create_physical_plan(&plan, state)
            .await
    }
}

/// `expr` (over `schema`) with its integer `+ - *` checked.
pub fn checked_physical(
    expr: Arc<dyn PhysicalExpr>,
    schema: &Schema,
) -> crate::error::Result<Arc<dyn PhysicalExpr>> {
    let config = Arc::new(ConfigOptions::default());
    let rewritten = expr.transform_up(|e| {
        let Some(b) = e.downcast_ref::<PhysicalBinary>() else {
            return Ok(Transformed::no(e));
        };
        let Some(op) = Op::of(b.op()) else {
            return Ok(Transformed::no(e));
        };
        let (l, r) = (b.left().data_type(schema)?, b.right().data_type(schema)?);
        if l != r || !is_integer(&l) {
            return Ok(Transformed::no(e));
        }
        let call = ScalarFunctionExpr::try_new(
            CheckedArithmetic::udf(op, l),
            vec![b.left().clone(), b.right().clone()],
            schema,
            config.clone(),
        )?;
        Ok(Transformed::yes(Arc::new(call) as Arc<dyn PhysicalExpr>))
    })?;
    Ok(rewritten.data)
}

/// Folds `+ - *` of integer constants with checked arithmetic; an overflow is 22003. Runs
/// after DataFusion's type coercion, so that both operands have the operator's type.
#[derive(Debug)]
pub struct FoldIntegers;

impl AnalyzerRule for FoldIntegers {
    fn analyze(
        &self,
        plan: LogicalPlan,
        _config: &ConfigOptions,
    ) -> datafusion::error::Result<LogicalPlan> {
        super::rules::rewrite_expressions(plan, |e, _| fold(e))
    }

    fn name(&self) -> &str {
        "fold_integers"
    }
}

fn fold(e: Expr) -> datafusion::error::Result<Transformed<Expr>> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &e else {
        return Ok(Transformed::no(e));
    };
    let Some(op) = Op::of(op) else {
        return Ok(Transformed::no(e));
    };
    let (Some((a, l)), Some((b, r))) = (constant(left), constant(right)) else {
        return Ok(Transformed::no(e));
    };
    if l != r {
        return Ok(Transformed::no(e));
    }
    let value = op.apply(a, b).and_then(|v| integer_scalar(v, &l));
    match value {
        Some(v) => Ok(Transformed::yes(Expr::Literal(v, None))),
        None => Err(out_of_range(&l)),
    }
}

/// An integer constant's value and type: a literal, its negation, or a cast of one to an
/// integer type it fits (the casts type coercion adds, and those `TypedChains` adds to long
/// chains). `None` where the value does not fit: the expression is left to fail when run.
fn constant(e: &Expr) -> Option<(i64, DataType)> {
    match e {
        Expr::Literal(v, _) => {
            let n = match v {
                ScalarValue::Int16(Some(n)) => i64::from(*n),
                ScalarValue::Int32(Some(n)) => i64::from(*n),
                ScalarValue::Int64(Some(n)) => *n,
                _ => return None,
            };
            Some((n, v.data_type()))
        }
        Expr::Negative(inner) => {
            let (n, t) = constant(inner)?;
            let negated = n.checked_neg()?;
            integer_scalar(negated, &t)?;
            Some((negated, t))
        }
        Expr::Cast(Cast { expr, field }) if is_integer(field.data_type()) => {
            let (n, _) = constant(expr)?;
            integer_scalar(n, field.data_type())?;
            Some((n, field.data_type().clone()))
        }
        _ => None,
    }
}

fn integer_scalar(v: i64, t: &DataType) -> Option<ScalarValue> {
    match t {
        DataType::Int16 => i16::try_from(v).ok().map(|v| ScalarValue::Int16(Some(v))),
        DataType::Int32 => i32::try_from(v).ok().map(|v| ScalarValue::Int32(Some(v))),
        DataType::Int64 => Some(ScalarValue::Int64(Some(v))),
        _ => None,
    }
}

/// `sum` with PostgreSQL's result types: integers of up to 32 bits sum to `bigint` (as in
/// DataFusion), and `bigint` to `numeric` (DataFusion's is `bigint`, and wraps around past
/// 2^63). Everything else is DataFusion's `sum`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PgSum {
    inner: Sum,
    signature: Signature,
}

/// What `sum(bigint)` adds up in: `numeric` with no fractional digits.
const BIGINT_SUM: DataType = DataType::Decimal128(38, 0);

impl PgSum {
    pub fn udaf() -> AggregateUDF {
        AggregateUDF::new_from_impl(PgSum {
            inner: Sum::new(),
            signature: Signature::user_defined(Volatility::Immutable),
        })
    }
}

impl AggregateUDFImpl for PgSum {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> datafusion::error::Result<Vec<DataType>> {
        let [t] = arg_types else {
            return Err(DataFusionError::Plan(format!(
                "sum takes one argument, not {}",
                arg_types.len()
            )));
        };
        let to = match t {
            DataType::Int64 | DataType::UInt64 => BIGINT_SUM,
            DataType::Int8 | DataType::Int16 | DataType::Int32 => DataType::Int64,
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => DataType::Int64,
            DataType::Float16 | DataType::Float32 | DataType::Float64 => DataType::Float64,
            DataType::Decimal32(..)
            | DataType::Decimal64(..)
            | DataType::Decimal128(..)
            | DataType::Decimal256(..)
            | DataType::Duration(_)
            | DataType::Interval(_) => t.clone(),
            // An untyped NULL or a parameter: summed as PostgreSQL would sum an integer.
            DataType::Null => DataType::Int64,
            other => {
                return Err(DataFusionError::Plan(format!(
                    "function sum({other}) does not exist"
                )))
            }
        };
        Ok(vec![to])
    }

    fn return_type(&self, arg_types: &[DataType]) -> datafusion::error::Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn accumulator(
        &self,
        acc_args: AccumulatorArgs,
    ) -> datafusion::error::Result<Box<dyn Accumulator>> {
        self.inner.accumulator(acc_args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> datafusion::error::Result<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> datafusion::error::Result<Box<dyn GroupsAccumulator>> {
        self.inner.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> datafusion::error::Result<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        self.inner.reverse_expr()
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.inner.order_sensitivity()
    }

    fn set_monotonicity(&self, data_type: &DataType) -> SetMonotonicity {
        self.inner.set_monotonicity(data_type)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}
