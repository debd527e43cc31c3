//! Physical expressions as a stored plan keeps them: each expression a flat list of nodes,
//! children before parents, so that neither encoding nor decoding recurses however deep the
//! expression is, and the JSON stays two levels deep.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::compute::CastOptions;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::config::ConfigOptions;
use datafusion::common::format::DEFAULT_FORMAT_OPTIONS;
use datafusion::logical_expr::{Operator, ScalarUDF};
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_expr::expressions::{
    CaseExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal,
    NegativeExpr, NotExpr, TryCastExpr,
};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use serde::{Deserialize, Serialize};

use super::types::{corrupt, StoredField, Value};
use crate::error::{Error, Result};
use crate::stream::dispatch::VnodeOf;

/// What decoding needs from the planner: the scalar functions by name, and the options they
/// run under.
pub trait Functions {
    /// The function `name` whose result is of `return_type` (Weir's checked arithmetic is one
    /// function per result type).
    fn scalar(&self, name: &str, return_type: &DataType) -> Result<Arc<ScalarUDF>>;
    fn config(&self) -> Arc<ConfigOptions>;
}

/// One expression: its nodes, children first; the last is the expression itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredExpr(Vec<Node>);

/// One node of an expression; `usize` fields are earlier nodes of the same expression.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Node {
    Column {
        name: String,
        index: usize,
    },
    Literal(Value),
    Binary {
        op: String,
        left: usize,
        right: usize,
    },
    Cast {
        expr: usize,
        /// The target; `explicit`: its name, nullability and metadata are the cast's own, not
        /// passed through from the input.
        to: StoredField,
        explicit: bool,
        safe: bool,
    },
    TryCast {
        expr: usize,
        to: StoredField,
    },
    Not(usize),
    Negative(usize),
    IsNull(usize),
    IsNotNull(usize),
    Case {
        operand: Option<usize>,
        when_then: Vec<(usize, usize)>,
        otherwise: Option<usize>,
    },
    InList {
        expr: usize,
        list: Vec<usize>,
        negated: bool,
    },
    Like {
        expr: usize,
        pattern: usize,
        negated: bool,
        case_insensitive: bool,
    },
    Function {
        name: String,
        args: Vec<usize>,
        /// The result's type and nullability.
        returns: StoredField,
    },
    /// `VnodeOf`: the virtual node of its arguments.
    Vnode(Vec<usize>),
}

/// Why `e` cannot be kept: the plan holds an expression this format has no node for.
fn unkept(what: impl std::fmt::Display) -> Error {
    Error::not_supported(format!(
        "a view's plan cannot be stored: it evaluates {what}, which Weir cannot keep yet"
    ))
}

/// Every binary operator, by the name a stored plan gives it (its Rust variant's).
const OPERATORS: &[Operator] = &[
    Operator::Eq,
    Operator::NotEq,
    Operator::Lt,
    Operator::LtEq,
    Operator::Gt,
    Operator::GtEq,
    Operator::Plus,
    Operator::Minus,
    Operator::Multiply,
    Operator::Divide,
    Operator::Modulo,
    Operator::And,
    Operator::Or,
    Operator::IsDistinctFrom,
    Operator::IsNotDistinctFrom,
    Operator::RegexMatch,
    Operator::RegexIMatch,
    Operator::RegexNotMatch,
    Operator::RegexNotIMatch,
    Operator::LikeMatch,
    Operator::ILikeMatch,
    Operator::NotLikeMatch,
    Operator::NotILikeMatch,
    Operator::BitwiseAnd,
    Operator::BitwiseOr,
    Operator::BitwiseXor,
    Operator::BitwiseShiftRight,
    Operator::BitwiseShiftLeft,
    Operator::StringConcat,
    Operator::AtArrow,
    Operator::ArrowAt,
    Operator::Arrow,
    Operator::LongArrow,
    Operator::HashArrow,
    Operator::HashLongArrow,
    Operator::AtAt,
    Operator::IntegerDivide,
    Operator::HashMinus,
    Operator::AtQuestion,
    Operator::Question,
    Operator::QuestionAnd,
    Operator::QuestionPipe,
];

fn op_name(op: &Operator) -> String {
    format!("{op:?}")
}

fn op_named(name: &str) -> Result<Operator> {
    OPERATORS
        .iter()
        .find(|op| op_name(op) == name)
        .copied()
        .ok_or_else(|| corrupt(format!("unknown operator {name}")))
}

fn cast_options(safe: bool) -> CastOptions<'static> {
    CastOptions {
        safe,
        format_options: DEFAULT_FORMAT_OPTIONS,
    }
}

/// Identity of a shared subexpression, so that it is stored once.
fn key(e: &Arc<dyn PhysicalExpr>) -> *const () {
    Arc::as_ptr(e) as *const ()
}

impl StoredExpr {
    #[cfg(test)]
    pub fn nodes(&self) -> usize {
        self.0.len()
    }

    pub fn encode(root: &Arc<dyn PhysicalExpr>) -> Result<StoredExpr> {
        let mut nodes = Vec::new();
        let mut at: HashMap<*const (), usize> = HashMap::new();
        let mut stack = vec![root.clone()];
        while let Some(e) = stack.last().cloned() {
            if at.contains_key(&key(&e)) {
                stack.pop();
                continue;
            }
            let pending: Vec<_> = e
                .children()
                .into_iter()
                .filter(|c| !at.contains_key(&key(c)))
                .cloned()
                .collect();
            if !pending.is_empty() {
                stack.extend(pending);
                continue;
            }
            let index = |c: &Arc<dyn PhysicalExpr>| at[&key(c)];
            nodes.push(node(&e, &index)?);
            at.insert(key(&e), nodes.len() - 1);
            stack.pop();
        }
        Ok(StoredExpr(nodes))
    }

    /// The expression, over rows of `schema`.
    pub fn decode(
        &self,
        schema: &Schema,
        functions: &dyn Functions,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let mut built: Vec<Arc<dyn PhysicalExpr>> = Vec::with_capacity(self.0.len());
        for n in &self.0 {
            let e = {
                let get = |i: usize| -> Result<Arc<dyn PhysicalExpr>> {
                    built
                        .get(i)
                        .cloned()
                        .ok_or_else(|| corrupt("an expression node refers to a later one"))
                };
                decode_node(n, &get, schema, functions)?
            };
            built.push(e);
        }
        built.pop().ok_or_else(|| corrupt("an empty expression"))
    }
}

fn node(e: &Arc<dyn PhysicalExpr>, at: &dyn Fn(&Arc<dyn PhysicalExpr>) -> usize) -> Result<Node> {
    if let Some(c) = e.downcast_ref::<Column>() {
        return Ok(Node::Column {
            name: c.name().to_string(),
            index: c.index(),
        });
    }
    if let Some(l) = e.downcast_ref::<Literal>() {
        return Ok(Node::Literal(Value::of(l.value())?));
    }
    if let Some(b) = e.downcast_ref::<BinaryExpr>() {
        if !OPERATORS.contains(b.op()) {
            return Err(unkept(format!("the operator {}", b.op())));
        }
        return Ok(Node::Binary {
            op: op_name(b.op()),
            left: at(b.left()),
            right: at(b.right()),
        });
    }
    if let Some(c) = e.downcast_ref::<CastExpr>() {
        let options = c.cast_options();
        if options != &cast_options(options.safe) {
            return Err(unkept("a cast with its own formatting"));
        }
        return Ok(Node::Cast {
            expr: at(c.expr()),
            to: StoredField::of(c.target_field())?,
            explicit: c.has_explicit_metadata() || c.has_explicit_nullability(),
            safe: options.safe,
        });
    }
    if let Some(c) = e.downcast_ref::<TryCastExpr>() {
        return Ok(Node::TryCast {
            expr: at(c.expr()),
            to: StoredField::of(c.target_field())?,
        });
    }
    if let Some(n) = e.downcast_ref::<NotExpr>() {
        return Ok(Node::Not(at(n.arg())));
    }
    if let Some(n) = e.downcast_ref::<NegativeExpr>() {
        return Ok(Node::Negative(at(n.arg())));
    }
    if let Some(n) = e.downcast_ref::<IsNullExpr>() {
        return Ok(Node::IsNull(at(n.arg())));
    }
    if let Some(n) = e.downcast_ref::<IsNotNullExpr>() {
        return Ok(Node::IsNotNull(at(n.arg())));
    }
    if let Some(c) = e.downcast_ref::<CaseExpr>() {
        return Ok(Node::Case {
            operand: c.expr().map(at),
            when_then: c
                .when_then_expr()
                .iter()
                .map(|(w, t)| (at(w), at(t)))
                .collect(),
            otherwise: c.else_expr().map(at),
        });
    }
    if let Some(l) = e.downcast_ref::<InListExpr>() {
        return Ok(Node::InList {
            expr: at(l.expr()),
            list: l.list().iter().map(at).collect(),
            negated: l.negated(),
        });
    }
    if let Some(l) = e.downcast_ref::<LikeExpr>() {
        return Ok(Node::Like {
            expr: at(l.expr()),
            pattern: at(l.pattern()),
            negated: l.negated(),
            case_insensitive: l.case_insensitive(),
        });
    }
    if let Some(f) = e.downcast_ref::<ScalarFunctionExpr>() {
        return Ok(Node::Function {
            name: f.name().to_string(),
            args: f.args().iter().map(at).collect(),
            returns: StoredField::of(&Field::new(f.name(), f.return_type().clone(), f.nullable()))?,
        });
    }
    if let Some(v) = e.downcast_ref::<VnodeOf>() {
        return Ok(Node::Vnode(v.args().iter().map(at).collect()));
    }
    Err(unkept(format!("the expression {e}")))
}

fn decode_node(
    n: &Node,
    get: &dyn Fn(usize) -> Result<Arc<dyn PhysicalExpr>>,
    schema: &Schema,
    functions: &dyn Functions,
) -> Result<Arc<dyn PhysicalExpr>> {
    let all = |ids: &[usize]| ids.iter().map(|&i| get(i)).collect::<Result<Vec<_>>>();
    Ok(match n {
        Node::Column { name, index } => Arc::new(Column::new(name, *index)),
        Node::Literal(v) => Arc::new(Literal::new(v.scalar()?)),
        Node::Binary { op, left, right } => {
            Arc::new(BinaryExpr::new(get(*left)?, op_named(op)?, get(*right)?))
        }
        Node::Cast {
            expr,
            to,
            explicit,
            safe,
        } => {
            let to = to.arrow()?;
            let options = Some(cast_options(*safe));
            if *explicit {
                Arc::new(CastExpr::new_with_target_field(get(*expr)?, to, options))
            } else {
                Arc::new(CastExpr::new(get(*expr)?, to.data_type().clone(), options))
            }
        }
        Node::TryCast { expr, to } => {
            Arc::new(TryCastExpr::new_with_target_field(get(*expr)?, to.arrow()?))
        }
        Node::Not(a) => Arc::new(NotExpr::new(get(*a)?)),
        Node::Negative(a) => Arc::new(NegativeExpr::new(get(*a)?)),
        Node::IsNull(a) => Arc::new(IsNullExpr::new(get(*a)?)),
        Node::IsNotNull(a) => Arc::new(IsNotNullExpr::new(get(*a)?)),
        Node::Case {
            operand,
            when_then,
            otherwise,
        } => Arc::new(CaseExpr::try_new(
            operand.map(get).transpose()?,
            when_then
                .iter()
                .map(|(w, t)| Ok((get(*w)?, get(*t)?)))
                .collect::<Result<_>>()?,
            otherwise.map(get).transpose()?,
        )?),
        Node::InList {
            expr,
            list,
            negated,
        } => Arc::new(InListExpr::try_new(
            get(*expr)?,
            all(list)?,
            *negated,
            schema,
        )?),
        Node::Like {
            expr,
            pattern,
            negated,
            case_insensitive,
        } => Arc::new(LikeExpr::new(
            *negated,
            *case_insensitive,
            get(*expr)?,
            get(*pattern)?,
        )),
        Node::Function {
            name,
            args,
            returns,
        } => {
            let returns = returns.arrow()?;
            let udf = functions.scalar(name, returns.data_type())?;
            Arc::new(ScalarFunctionExpr::new(
                name,
                udf,
                all(args)?,
                returns,
                functions.config(),
            ))
        }
        Node::Vnode(args) => Arc::new(VnodeOf::new(all(args)?)),
    })
}
