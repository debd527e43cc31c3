//! Subqueries as PostgreSQL plans them and DataFusion does not: a correlated scalar
//! subquery that is not an aggregate, or whose filter compares with the outer row other than
//! by equality; `ARRAY(subquery)`; and `ARRAY(SELECT f(x) FROM unnest(a) x)`.
//!
//! DataFusion plans a correlated scalar subquery as a join on its equalities with the outer
//! row, grouped by them, so it needs an aggregate and equality-only correlation. The rewrite
//! gives it both where the meaning stays PostgreSQL's:
//! - the selected expression becomes `weir_single(e)`, an aggregate that is `e` of the one
//!   row, NULL without rows, and PostgreSQL's 21000 error for more than one;
//! - a condition on the outer row alone moves out of the subquery: `(SELECT ... WHERE k = o.k
//!   AND o.flag)` is `CASE WHEN o.flag THEN (SELECT ... WHERE k = o.k) END`;
//! - in any other condition, an outer column that an equality binds to an inner expression is
//!   replaced by it: `WHERE c.oid = a.coll AND a.coll <> t.coll` compares `c.oid <> t.coll`.
//!
//! The grouping reads the inner rows of every key, not only of the outer rows' keys: a key
//! with two inner rows that no outer row has raises 21000 where PostgreSQL would not look.

use std::collections::HashSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, Visit, VisitMut, Visitor, VisitorMut};
use datafusion::sql::sqlparser::tokenizer::Span;

use super::{call, catalog_name};

/// The aggregate a correlated scalar subquery's expression is planned with.
pub const SINGLE: &str = "weir_single";

/// A subquery of one plain SELECT of one expression (no grouping, DISTINCT or LIMIT): the
/// SELECT.
fn plain_select(query: &mut ast::Query) -> Option<&mut ast::Select> {
    let plain = query.with.is_none()
        && query.limit_clause.is_none()
        && query.fetch.is_none()
        && query.locks.is_empty();
    let ast::SetExpr::Select(select) = query.body.as_mut() else {
        return None;
    };
    let ungrouped = matches!(&select.group_by, ast::GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    let simple = plain
        && ungrouped
        && select.distinct.is_none()
        && select.having.is_none()
        && select.projection.len() == 1
        && !select.from.is_empty()
        && select.lateral_views.is_empty();
    simple.then_some(select.as_mut())
}

/// The names a SELECT's FROM gives its relations (aliases, or tables' last names).
fn inner_names(from: &[ast::TableWithJoins]) -> HashSet<String> {
    let factors = from
        .iter()
        .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)));
    let mut names = HashSet::new();
    for factor in factors {
        let (alias, name) = match factor {
            ast::TableFactor::Table { alias, name, .. } => (alias, Some(name)),
            ast::TableFactor::Derived { alias, .. }
            | ast::TableFactor::TableFunction { alias, .. }
            | ast::TableFactor::Function { alias, .. }
            | ast::TableFactor::UNNEST { alias, .. } => (alias, None),
            // Anything else: no decorrelation (every name would look outer).
            _ => return HashSet::from([String::new()]),
        };
        let last = name.and_then(|n| n.0.last()?.as_ident().map(|i| i.value.to_lowercase()));
        if let Some(name) = alias.as_ref().map(|a| a.name.value.to_lowercase()).or(last) {
            names.insert(name);
        }
    }
    names
}

/// What an expression refers to: inner columns (qualified by an inner name, or unqualified),
/// outer ones (qualified by another name), and whether it holds a subquery of its own.
#[derive(Default)]
struct Refs<'a> {
    inner_names: Option<&'a HashSet<String>>,
    inner: bool,
    outer: bool,
    nested: bool,
}

impl Visitor for Refs<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, _: &ast::Query) -> ControlFlow<()> {
        self.nested = true;
        ControlFlow::Break(())
    }

    fn pre_visit_expr(&mut self, expr: &ast::Expr) -> ControlFlow<()> {
        match expr {
            ast::Expr::Identifier(_) => self.inner = true,
            ast::Expr::CompoundIdentifier(parts) => match is_outer(parts, self.inner_names) {
                true => self.outer = true,
                false => self.inner = true,
            },
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

fn is_outer(parts: &[ast::Ident], inner: Option<&HashSet<String>>) -> bool {
    let qualifier = match parts {
        [q, _] => q,
        [_, q, _] => q,
        _ => return false,
    };
    inner.is_some_and(|names| !names.contains(&qualifier.value.to_lowercase()))
}

fn refs<'a, T: Visit>(node: &T, inner: &'a HashSet<String>) -> Refs<'a> {
    let mut refs = Refs {
        inner_names: Some(inner),
        ..Refs::default()
    };
    let _ = node.visit(&mut refs);
    refs
}

/// Whether `query` may refer to an outer query's columns: it is not a single SELECT, or one
/// of its columns or conditions names a relation its FROM does not have, or holds a subquery.
fn has_outer_references(query: &ast::Query) -> bool {
    let ast::SetExpr::Select(select) = query.body.as_ref() else {
        return true;
    };
    let names = inner_names(&select.from);
    let projection = refs(&select.projection, &names);
    let selection = refs(&select.selection, &names);
    projection.outer || projection.nested || selection.outer || selection.nested
}

/// `e`'s conjuncts, in order (without recursion: a long AND chain is a deep tree).
fn conjuncts(e: ast::Expr) -> Vec<ast::Expr> {
    let mut out = Vec::new();
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        match e {
            ast::Expr::BinaryOp {
                left,
                op: ast::BinaryOperator::And,
                right,
            } => {
                stack.push(*right);
                stack.push(*left);
            }
            ast::Expr::Nested(inner)
                if matches!(
                    inner.as_ref(),
                    ast::Expr::BinaryOp {
                        op: ast::BinaryOperator::And,
                        ..
                    }
                ) =>
            {
                stack.push(*inner)
            }
            other => out.push(other),
        }
    }
    out
}

fn and(conjuncts: Vec<ast::Expr>) -> Option<ast::Expr> {
    conjuncts.into_iter().reduce(|l, r| ast::Expr::BinaryOp {
        left: Box::new(l),
        op: ast::BinaryOperator::And,
        right: Box::new(r),
    })
}

/// Replaces outer columns by the inner expressions equal to them.
struct Substitute<'a>(&'a [(ast::Expr, ast::Expr)]);

impl VisitorMut for Substitute<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, _: &mut ast::Query) -> ControlFlow<()> {
        ControlFlow::Break(())
    }

    fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
        if let Some((_, inner)) = self.0.iter().find(|(outer, _)| outer == expr) {
            *expr = ast::Expr::Nested(Box::new(inner.clone()));
        }
        ControlFlow::Continue(())
    }
}

/// Whether `e` calls an aggregate (not as a window function).
fn aggregates(e: &ast::Expr, is_aggregate: &dyn Fn(&str) -> bool) -> bool {
    struct Find<'a>(&'a dyn Fn(&str) -> bool);
    impl Visitor for Find<'_> {
        type Break = ();
        fn pre_visit_query(&mut self, _: &ast::Query) -> ControlFlow<()> {
            ControlFlow::Break(())
        }
        fn pre_visit_expr(&mut self, e: &ast::Expr) -> ControlFlow<()> {
            match e {
                ast::Expr::Function(f)
                    if f.over.is_none() && catalog_name(&f.name).is_some_and(|n| (self.0)(&n)) =>
                {
                    ControlFlow::Break(())
                }
                _ => ControlFlow::Continue(()),
            }
        }
    }
    // A nested query also breaks the walk: count it as an aggregate, which leaves `e` alone.
    e.visit(&mut Find(is_aggregate)).is_break()
}

/// The correlated scalar subquery `query` as DataFusion plans it, if it needs rewriting.
pub fn decorrelate(
    query: &mut ast::Query,
    is_aggregate: &dyn Fn(&str) -> bool,
) -> Option<ast::Expr> {
    let select = plain_select(query)?;
    // Only one expression is selected (checked before anything changes).
    if !matches!(
        select.projection.first(),
        Some(ast::SelectItem::UnnamedExpr(_) | ast::SelectItem::ExprWithAlias { .. })
    ) {
        return None;
    }
    let inner = inner_names(&select.from);
    let correlated = (select.projection.iter())
        .filter_map(|item| match item {
            ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } => {
                Some(e)
            }
            _ => None,
        })
        .chain(&select.selection)
        .any(|e| refs(e, &inner).outer);
    if !correlated {
        return None;
    }
    let mut bound: Vec<(ast::Expr, ast::Expr)> = Vec::new();
    let all = select.selection.take().map(conjuncts).unwrap_or_default();
    for c in &all {
        if let ast::Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::Eq,
            right,
        } = c
        {
            for (o, i) in [(left, right), (right, left)] {
                let (outer, within) = (refs(o.as_ref(), &inner), refs(i.as_ref(), &inner));
                let column = matches!(o.as_ref(), ast::Expr::CompoundIdentifier(_));
                if column && outer.outer && !within.outer && within.inner && !within.nested {
                    bound.push((o.as_ref().clone(), i.as_ref().clone()));
                }
            }
        }
    }
    let (mut guards, mut kept) = (Vec::new(), Vec::new());
    for mut c in all {
        let r = refs(&c, &inner);
        if r.outer && !r.inner && !r.nested {
            guards.push(c);
            continue;
        }
        let binding = matches!(&c, ast::Expr::BinaryOp { op: ast::BinaryOperator::Eq, left, right }
            if bound.iter().any(|(o, _)| o == left.as_ref() || o == right.as_ref()));
        if r.outer && !binding {
            let _ = VisitMut::visit(&mut c, &mut Substitute(&bound));
        }
        kept.push(c);
    }
    select.selection = and(kept);
    if let Some(item) = select.projection.first_mut() {
        let e = match item {
            ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } => e,
            _ => return None,
        };
        if !aggregates(e, is_aggregate) {
            *e = call(SINGLE, vec![e.clone()]);
        }
    }
    let subquery = ast::Expr::Subquery(Box::new(query.clone()));
    Some(match and(guards) {
        None => subquery,
        Some(condition) => ast::Expr::Case {
            case_token: ast::helpers::attached_token::AttachedToken::empty(),
            end_token: ast::helpers::attached_token::AttachedToken::empty(),
            operand: None,
            conditions: vec![ast::CaseWhen {
                condition,
                result: subquery,
            }],
            else_result: None,
        },
    })
}

/// `ARRAY(subquery)` as DataFusion plans it: `array_transform` (and `array_filter`) over
/// `unnest(a)`, `array_agg` over a plain SELECT of one expression, or `array_agg` over the
/// subquery as a derived table.
/// Without rows it is the empty array (`array_agg` alone would be NULL).
pub fn array_of(query: &ast::Query, is_aggregate: &dyn Fn(&str) -> bool) -> Option<ast::Expr> {
    let aggregated = aggregated_array(query, is_aggregate)?;
    Some(call(
        "coalesce",
        vec![aggregated, call("make_array", vec![])],
    ))
}

fn aggregated_array(query: &ast::Query, is_aggregate: &dyn Fn(&str) -> bool) -> Option<ast::Expr> {
    let mut query = query.clone();
    if let Some(transform) = over_unnest(&mut query) {
        return Some(transform);
    }
    let order = match query.order_by.take() {
        Some(ast::OrderBy {
            kind: ast::OrderByKind::Expressions(order),
            ..
        }) => order,
        Some(_) => return None,
        None => Vec::new(),
    };
    let Some(select) = plain_select(&mut query) else {
        return derived_array(query, order);
    };
    let item = match select.projection.first_mut()? {
        ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } => e,
        _ => return None,
    };
    let mut order = order;
    for o in &mut order {
        // `ORDER BY 1`: the selected expression.
        if matches!(&o.expr, ast::Expr::Value(v) if v.to_string() == "1") {
            o.expr = item.clone();
        }
    }
    let mut agg = call("array_agg", vec![item.clone()]);
    if let (ast::Expr::Function(f), false) = (&mut agg, order.is_empty()) {
        if let ast::FunctionArguments::List(list) = &mut f.args {
            list.clauses
                .push(ast::FunctionArgumentClause::OrderBy(order));
        }
    }
    *item = agg;
    Some(decorrelate_aggregated(&mut query, is_aggregate))
}

fn decorrelate_aggregated(
    query: &mut ast::Query,
    is_aggregate: &dyn Fn(&str) -> bool,
) -> ast::Expr {
    decorrelate(query, is_aggregate).unwrap_or_else(|| ast::Expr::Subquery(Box::new(query.clone())))
}

/// `(SELECT array_agg(c ORDER BY ...) FROM (subquery) AS weir_array(c))`.
fn derived_array(query: ast::Query, order: Vec<ast::OrderByExpr>) -> Option<ast::Expr> {
    let order = match order.is_empty() {
        true => String::new(),
        false => " ORDER BY weir_array.c".to_string(),
    };
    let template =
        format!("SELECT array_agg(weir_array.c{order}) FROM (SELECT 1) AS weir_array(c)");
    let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
    let parsed = datafusion::sql::sqlparser::parser::Parser::parse_sql(&dialect, &template).ok()?;
    let Some(ast::Statement::Query(mut outer)) = parsed.into_iter().next() else {
        return None;
    };
    let ast::SetExpr::Select(select) = outer.body.as_mut() else {
        return None;
    };
    let ast::TableFactor::Derived { subquery, .. } = &mut select.from.first_mut()?.relation else {
        return None;
    };
    let mut query = query;
    if !order.is_empty() {
        // The derived table keeps its rows' order for the aggregate to follow.
        query.order_by = None;
    }
    **subquery = query;
    Some(ast::Expr::Subquery(outer))
}

/// `ARRAY(SELECT f(x) FROM unnest(a) [AS] x [WHERE p(x)])` as
/// `array_transform(array_filter(a, x -> p(x)), x -> f(x))`.
fn over_unnest(query: &mut ast::Query) -> Option<ast::Expr> {
    if query.order_by.is_some() {
        return None;
    }
    let select = plain_select(query)?;
    let [from] = select.from.as_slice() else {
        return None;
    };
    if !from.joins.is_empty() {
        return None;
    }
    let (array, alias) = match &from.relation {
        ast::TableFactor::Table {
            name,
            args: Some(args),
            alias,
            ..
        } if catalog_name(name).as_deref() == Some("unnest") && args.args.len() == 1 => {
            let ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(a)) = &args.args[0] else {
                return None;
            };
            (a.clone(), alias.clone()?)
        }
        ast::TableFactor::UNNEST {
            array_exprs,
            alias: Some(alias),
            with_offset: false,
            with_ordinality: false,
            ..
        } if array_exprs.len() == 1 => (array_exprs[0].clone(), alias.clone()),
        _ => return None,
    };
    let variable = match alias.columns.as_slice() {
        [] => alias.name.clone(),
        [column] => column.name.clone(),
        _ => return None,
    };
    let lambda = |body: ast::Expr| {
        ast::Expr::Lambda(ast::LambdaFunction {
            params: ast::OneOrManyWithParens::One(ast::LambdaFunctionParameter {
                name: variable.clone(),
                data_type: None,
            }),
            body: Box::new(body),
            syntax: ast::LambdaSyntax::Arrow,
        })
    };
    let mut array = array;
    // The selected expression is taken before the filter, so that nothing changes when
    // this form does not apply.
    let item = match select.projection.first()? {
        ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } => {
            e.clone()
        }
        _ => return None,
    };
    if let Some(filter) = select.selection.take() {
        array = call("array_filter", vec![array, lambda(filter)]);
    }
    if matches!(&item, ast::Expr::Identifier(i) if i.value == variable.value) {
        return Some(array);
    }
    Some(call("array_transform", vec![array, lambda(item)]))
}

/// `[NOT] EXISTS (subquery)` in a SELECT's list (not in a filter, where DataFusion plans it)
/// as `(SELECT count(1) > 0 ...)` (`= 0`), decorrelated as a scalar subquery; an uncorrelated
/// `x [NOT] IN (subquery)` there as `weir_in_array(x, ARRAY(subquery))`.
pub fn exists_as_count(select: &mut ast::Select, is_aggregate: &dyn Fn(&str) -> bool) {
    struct Exists<'a>(&'a dyn Fn(&str) -> bool);
    impl VisitorMut for Exists<'_> {
        type Break = ();
        fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
            if let ast::Expr::InSubquery {
                expr: tested,
                subquery,
                negated,
            } = expr
            {
                // An uncorrelated `x IN (SELECT ...)`: `x` among the subquery's values, with
                // PostgreSQL's NULLs (`weir_in_array`).
                let correlated = has_outer_references(subquery);
                if let Some(values) = (!correlated).then(|| array_of(subquery, self.0)).flatten() {
                    let within = call("weir_in_array", vec![(**tested).clone(), values]);
                    *expr = match negated {
                        true => ast::Expr::UnaryOp {
                            op: ast::UnaryOperator::Not,
                            expr: Box::new(ast::Expr::Nested(Box::new(within))),
                        },
                        false => within,
                    };
                }
                return ControlFlow::Continue(());
            }
            let ast::Expr::Exists { subquery, negated } = expr else {
                return ControlFlow::Continue(());
            };
            let mut query = subquery.as_ref().clone();
            let Some(select) = plain_select(&mut query) else {
                return ControlFlow::Continue(());
            };
            let one = ast::Expr::value(ast::Value::Number("1".into(), false));
            let count = call("count", vec![one]);
            let test = ast::Expr::BinaryOp {
                left: Box::new(count),
                op: match negated {
                    true => ast::BinaryOperator::Eq,
                    false => ast::BinaryOperator::Gt,
                },
                right: Box::new(ast::Expr::value(ast::Value::Number("0".into(), false))),
            };
            select.projection = vec![ast::SelectItem::UnnamedExpr(test)];
            *expr = decorrelate(&mut query, self.0)
                .unwrap_or_else(|| ast::Expr::Subquery(Box::new(query)));
            ControlFlow::Continue(())
        }
    }
    for item in &mut select.projection {
        if let ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } =
            item
        {
            let _ = VisitMut::visit(e, &mut Exists(is_aggregate));
        }
    }
}

/// Gives each later one of a SELECT's unnamed expressions that DataFusion would name alike
/// (`SELECT NULL, NULL`), and each column named beside a wildcard that holds it too
/// (`SELECT c.oid, c.*`), an alias of its own, which the result's column names read as
/// PostgreSQL's name for the expression (`sql::names`): PostgreSQL allows a result two
/// columns of one name, DataFusion does not.
pub fn distinct_names(select: &mut ast::Select) {
    let mut seen = HashSet::new();
    let mut wildcards = HashSet::new();
    let mut unqualified = false;
    for item in &select.projection {
        match item {
            ast::SelectItem::Wildcard(_) => unqualified = true,
            ast::SelectItem::QualifiedWildcard(
                ast::SelectItemQualifiedWildcardKind::ObjectName(name),
                _,
            ) => {
                if let Some(q) = name.0.last().and_then(|p| p.as_ident()) {
                    wildcards.insert(q.value.clone());
                }
            }
            _ => {}
        }
    }
    // Whether a wildcard of the SELECT gives a column `e` names too.
    let in_wildcard = |e: &ast::Expr| match e {
        ast::Expr::Identifier(_) => unqualified,
        ast::Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [.., q, _] => unqualified || wildcards.contains(&q.value),
            _ => false,
        },
        _ => false,
    };
    for (i, item) in select.projection.iter_mut().enumerate() {
        let ast::SelectItem::UnnamedExpr(e) = item else {
            continue;
        };
        if seen.insert(e.to_string()) && !in_wildcard(e) {
            continue;
        }
        *item = ast::SelectItem::ExprWithAlias {
            expr: e.clone(),
            alias: ast::Ident::with_span(Span::empty(), format!("{}{i}", crate::sql::UNNAMED)),
        };
    }
}

/// A query ordered by an expression with a subquery in it (Grafana's table picker: `ORDER BY
/// CASE WHEN schema IN (SELECT ...) THEN 0 ELSE 1 END`), which DataFusion cannot sort by, as
/// the same query computing that expression as a column of its own, ordered by it and without
/// it: `SELECT a FROM (SELECT a, <expr> AS weir_order_1 FROM ...) weir_ordered ORDER BY
/// weir_order_1`. Only for a plain SELECT (no DISTINCT or GROUP BY) whose columns all have
/// names; a query that cannot be rewritten so is left as it is.
pub fn order_by_subqueries(query: &mut ast::Query, is_aggregate: &dyn Fn(&str) -> bool) {
    let Some(ast::OrderBy {
        kind: ast::OrderByKind::Expressions(order),
        ..
    }) = &query.order_by
    else {
        return;
    };
    if !order.iter().any(|o| has_subquery(&o.expr)) {
        return;
    }
    let ast::SetExpr::Select(select) = query.body.as_ref() else {
        return;
    };
    let grouped = !matches!(&select.group_by, ast::GroupByExpr::Expressions(e, _) if e.is_empty());
    if select.distinct.is_some() || grouped || select.having.is_some() {
        return;
    }
    let names: Option<Vec<ast::Ident>> = (select.projection.iter())
        .map(|item| match item {
            ast::SelectItem::ExprWithAlias { alias, .. } => Some(alias.clone()),
            ast::SelectItem::UnnamedExpr(ast::Expr::Identifier(i)) => Some(i.clone()),
            ast::SelectItem::UnnamedExpr(ast::Expr::CompoundIdentifier(parts)) => {
                parts.last().cloned()
            }
            _ => None,
        })
        .collect();
    let Some(names) = names else {
        return;
    };
    let mut inner = select.clone();
    let mut keys = Vec::with_capacity(order.len());
    for (k, o) in order.iter().enumerate() {
        let output = match &o.expr {
            ast::Expr::Value(_) => true,
            ast::Expr::Identifier(i) => names.iter().any(|n| n.value == i.value),
            _ => false,
        };
        let mut key = o.clone();
        if !output {
            let hidden = ast::Ident::new(format!("weir_order_{}", k + 1));
            inner.projection.push(ast::SelectItem::ExprWithAlias {
                expr: o.expr.clone(),
                alias: hidden.clone(),
            });
            key.expr = ast::Expr::Identifier(hidden);
        }
        keys.push(key.to_string());
    }
    exists_as_count(&mut inner, is_aggregate);
    let columns: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let sql = format!(
        "SELECT {} FROM ({inner}) AS weir_ordered ORDER BY {}",
        columns.join(", "),
        keys.join(", ")
    );
    let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
    let Ok(mut rewritten) = datafusion::sql::sqlparser::parser::Parser::new(&dialect)
        .try_with_sql(&sql)
        .and_then(|mut p| p.parse_query())
    else {
        return;
    };
    rewritten.with = query.with.take();
    rewritten.limit_clause = query.limit_clause.take();
    rewritten.fetch = query.fetch.take();
    *query = *rewritten;
}

/// Whether `e` holds a subquery.
fn has_subquery(e: &ast::Expr) -> bool {
    struct Finds(bool);
    impl Visitor for Finds {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &ast::Expr) -> ControlFlow<()> {
            if matches!(
                e,
                ast::Expr::Subquery(_) | ast::Expr::InSubquery { .. } | ast::Expr::Exists { .. }
            ) {
                self.0 = true;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }
    }
    let mut finds = Finds(false);
    let _ = e.visit(&mut finds);
    finds.0
}

#[cfg(test)]
mod tests {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn rewritten(sql: &str) -> String {
        let mut statement = Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .unwrap()
            .remove(0);
        super::super::rewrite(&mut statement, &|name| matches!(name, "count" | "max"));
        statement.to_string()
    }

    #[test]
    fn correlated_scalar_subqueries_become_single_rows_with_outer_conditions_outside() {
        assert_eq!(
            rewritten("SELECT (SELECT d.x FROM d WHERE d.k = o.k AND o.flag) FROM o"),
            "SELECT CASE WHEN o.flag THEN (SELECT weir_single(d.x) FROM d WHERE d.k = o.k) END \
             FROM o"
        );
        // An outer column bound by an equality stands for the inner side elsewhere.
        assert_eq!(
            rewritten("SELECT (SELECT c.n FROM c WHERE c.id = a.coll AND a.coll <> c.d) FROM a"),
            "SELECT (SELECT weir_single(c.n) FROM c WHERE c.id = a.coll AND (c.id) <> c.d) FROM a"
        );
        // Aggregates and uncorrelated subqueries stay as they are.
        for sql in [
            "SELECT (SELECT max(d.x) FROM d WHERE d.k = o.k) FROM o",
            "SELECT (SELECT d.x FROM d WHERE d.k = 1) FROM o",
        ] {
            assert_eq!(rewritten(sql), sql);
        }
    }

    #[test]
    fn subqueries_the_rewrite_does_not_handle_are_left_whole() {
        // A wildcard is not one expression: nothing changes, the outer condition stays.
        let sql = "SELECT (SELECT * FROM d WHERE d.k = o.k AND o.flag) FROM o";
        assert_eq!(rewritten(sql), sql);
        let sql = "SELECT ARRAY(SELECT * FROM unnest(o.a) AS x WHERE x > 1) FROM o";
        assert!(rewritten(sql).contains("WHERE x > 1"), "{}", rewritten(sql));
    }
}
