//! PostgreSQL's catalog spellings, for the queries psql, drivers and tools send
//! (`docs/design/0016-pg-catalog.md`): a rewrite of the syntax tree before planning, and the
//! catalog functions over a query's [`Relations`](super::pg_catalog::Relations).

mod arrays;
mod functions;
mod privileges;
mod series;
mod strings;
mod subquery;

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, VisitMut, VisitorMut};

use super::pg_catalog::CATALOG_TABLES;

pub use self::functions::register_functions;
pub use self::subquery::SINGLE;

/// Rewrites PostgreSQL's catalog spellings in `statement` into what DataFusion plans:
/// `pg_catalog.f(...)` is `f(...)`, `OPERATOR(pg_catalog.~)` is `~`, `COLLATE
/// pg_catalog.default` goes, an unqualified catalog table is `pg_catalog`'s, and casts to
/// `regclass`, `regtype`, `regnamespace`, `oid`, `name` and `"char"` become functions.
/// Subqueries are rewritten as `subquery` says; `is_aggregate` tells an aggregate function's
/// name.
pub fn rewrite(statement: &mut ast::Statement, is_aggregate: &dyn Fn(&str) -> bool) {
    let _ = statement.visit(&mut Rewrite { is_aggregate });
}

struct Rewrite<'a> {
    is_aggregate: &'a dyn Fn(&str) -> bool,
}

/// The last part of a name, lowercased, when the name is `part` or `pg_catalog.part`.
fn catalog_name(name: &ast::ObjectName) -> Option<String> {
    let parts: Vec<String> = (name.0.iter())
        .filter_map(|p| p.as_ident().map(|i| i.value.to_lowercase()))
        .collect();
    match parts.as_slice() {
        [one] => Some(one.clone()),
        [schema, one] if schema == "pg_catalog" => Some(one.clone()),
        _ => None,
    }
}

fn call(name: &str, args: Vec<ast::Expr>) -> ast::Expr {
    ast::Expr::Function(ast::Function {
        name: ast::ObjectName::from(vec![ast::Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: ast::FunctionArguments::None,
        args: ast::FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: (args.into_iter())
                .map(|a| ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

/// A type spelled `pg_catalog.t` as the type `t` (which DataFusion plans).
fn plain_type(t: &mut ast::DataType) {
    use ast::DataType as T;
    if let T::Array(ast::ArrayElemTypeDef::SquareBracket(element, _)) = t {
        plain_type(element);
        return;
    }
    let T::Custom(name, modifiers) = t else {
        return;
    };
    if name.0.len() != 2 || !modifiers.is_empty() {
        return;
    }
    let plain = match catalog_name(name).as_deref() {
        Some("text") => T::Text,
        Some("int2") => T::Int2(None),
        Some("int4") => T::Int4(None),
        Some("int8") => T::Int8(None),
        Some("bool") => T::Bool,
        Some("float4") => T::Float4,
        Some("float8") => T::Float8,
        Some("numeric") => T::Numeric(ast::ExactNumberInfo::None),
        Some("varchar") => T::Varchar(None),
        Some("date") => T::Date,
        Some("timestamp") => T::Timestamp(None, ast::TimezoneInfo::None),
        Some("timestamptz") => T::Timestamp(None, ast::TimezoneInfo::WithTimeZone),
        _ => return,
    };
    *t = plain;
}

/// `generate_subscripts(a, 1)` in a SELECT list as `unnest(generate_series(1,
/// array_length(a, 1)))`, which set-returning functions beside it (`unnest(a)`) zip with, as
/// PostgreSQL's do (SQLAlchemy reads a primary key's columns so).
fn generate_subscripts(f: &ast::Function) -> Option<ast::Expr> {
    if catalog_name(&f.name).as_deref() != Some("generate_subscripts") {
        return None;
    }
    let ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let args: Vec<ast::Expr> = (list.args.iter())
        .map(|a| match a {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Some(e.clone()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let [array, dimension] = args.as_slice() else {
        return None;
    };
    let one = ast::Expr::value(ast::Value::Number("1".into(), false));
    let length = call("array_length", vec![array.clone(), dimension.clone()]);
    let series = call("generate_series", vec![one, length]);
    Some(call("unnest", vec![series]))
}

/// `OPERATOR(pg_catalog.~)` and the other comparisons spelled so, as plain operators.
fn plain_operator(parts: &[String]) -> Option<ast::BinaryOperator> {
    use ast::BinaryOperator as B;
    Some(match parts.last().map(String::as_str).unwrap_or_default() {
        "~" => B::PGRegexMatch,
        "~*" => B::PGRegexIMatch,
        "!~" => B::PGRegexNotMatch,
        "!~*" => B::PGRegexNotIMatch,
        "=" => B::Eq,
        "<>" => B::NotEq,
        "<" => B::Lt,
        ">" => B::Gt,
        "<=" => B::LtEq,
        ">=" => B::GtEq,
        _ => return None,
    })
}

/// `(keys).x.y`, fields of a record, as `get_field(get_field(keys, 'x'), 'y')`; `None` for
/// another access (a subscript).
fn field_access(root: &ast::Expr, chain: &[ast::AccessExpr]) -> Option<ast::Expr> {
    let mut access = root.clone();
    for a in chain {
        let ast::AccessExpr::Dot(ast::Expr::Identifier(field)) = a else {
            return None;
        };
        let field = match field.quote_style {
            Some(_) => field.value.clone(),
            None => field.value.to_lowercase(),
        };
        let name = ast::Expr::value(ast::Value::SingleQuotedString(field));
        access = call("get_field", vec![access, name]);
    }
    Some(access)
}

/// A constant LIKE pattern whose escape character is not the backslash (`'pg/_%' ESCAPE
/// '/'`, SQLAlchemy's), written with the backslash as its escape, which DataFusion's LIKE
/// takes (`ESCAPE ''`, no escape at all, too); `None` for a pattern that is not constant or
/// an escape of several characters.
fn backslash_pattern(pattern: &ast::Expr, escape: &ast::Value) -> Option<String> {
    let escape: Vec<char> = match escape {
        ast::Value::SingleQuotedString(e) => e.chars().collect(),
        _ => return None,
    };
    let text = constant_text(pattern)?;
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match escape.as_slice() {
            [e] if c == *e => {
                out.push('\\');
                out.push(chars.next()?);
            }
            _ if c == '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    Some(out)
}

/// The text of a string constant, or of string constants joined with `||`.
fn constant_text(e: &ast::Expr) -> Option<String> {
    match e {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) => Some(s.clone()),
            _ => None,
        },
        ast::Expr::Nested(inner) => constant_text(inner),
        ast::Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::StringConcat,
            right,
        } => Some(constant_text(left)? + &constant_text(right)?),
        _ => None,
    }
}

/// A scalar function called in FROM, `f(args) AS s`, as the derived table `(SELECT f(args)
/// AS s) AS s`. Only the functions tools call so are known to be scalar here.
fn scalar_in_from(factor: &ast::TableFactor) -> Option<ast::TableFactor> {
    let ast::TableFactor::Table {
        name,
        args: Some(args),
        alias,
        ..
    } = factor
    else {
        return None;
    };
    let function = catalog_name(name)?;
    if !matches!(
        function.as_str(),
        "string_to_array" | "current_schemas" | "parse_ident"
    ) {
        return None;
    }
    let column = match alias {
        Some(a) => a
            .columns
            .first()
            .map_or_else(|| a.name.clone(), |c| c.name.clone()),
        None => ast::Ident::new(function.clone()),
    };
    let table = alias
        .as_ref()
        .map_or_else(|| ast::Ident::new(&function), |a| a.name.clone());
    let args: Vec<String> = args.args.iter().map(|a| a.to_string()).collect();
    let sql = format!(
        "SELECT 1 FROM (SELECT {function}({}) AS {column}) AS {table}",
        args.join(", ")
    );
    let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
    let query = (datafusion::sql::sqlparser::parser::Parser::new(&dialect).try_with_sql(&sql))
        .ok()?
        .parse_query()
        .ok()?;
    match *query.body {
        ast::SetExpr::Select(select) => select.from.into_iter().next().map(|t| t.relation),
        _ => None,
    }
}

/// `information_schema._pg_expandarray(a)` (pgJDBC's key columns: a row `(x, n)` per element
/// and its position) as `unnest(weir_expandarray(a))`.
fn expand_array(f: &ast::Function) -> Option<ast::Expr> {
    let parts: Vec<String> = (f.name.0.iter())
        .map(|p| p.as_ident().map(|i| i.value.to_lowercase()))
        .collect::<Option<_>>()?;
    let named = match parts.as_slice() {
        [schema, name] => schema == "information_schema" && name == "_pg_expandarray",
        [name] => name == "_pg_expandarray",
        _ => false,
    };
    let ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(array))] = list.args.as_slice()
    else {
        return None;
    };
    named.then(|| {
        call(
            "unnest",
            vec![call("weir_expandarray", vec![array.clone()])],
        )
    })
}

/// What a cast to the type `t` becomes, if it is a catalog type.
fn catalog_cast(t: &ast::DataType, expr: &ast::Expr) -> Option<ast::Expr> {
    let name = match t {
        ast::DataType::Regclass => "regclass".to_string(),
        ast::DataType::Custom(name, modifiers) if modifiers.is_empty() => catalog_name(name)?,
        _ => return None,
    };
    let function = match name.as_str() {
        "regclass" => "weir_regclass",
        "regtype" => "weir_regtype",
        "regnamespace" => "weir_regnamespace",
        "regproc" | "regprocedure" => "weir_regproc",
        "oid" => "weir_oid",
        "name" => "weir_name",
        "char" => "weir_char",
        "bpchar" => "weir_text",
        _ => return None,
    };
    Some(call(function, vec![expr.clone()]))
}

impl VisitorMut for Rewrite<'_> {
    type Break = ();

    fn pre_visit_relation(&mut self, name: &mut ast::ObjectName) -> ControlFlow<()> {
        let is_table = |t: &ast::Ident| CATALOG_TABLES.iter().any(|(n, _)| *n == t.value);
        match name.0.as_slice() {
            [ast::ObjectNamePart::Identifier(table)] if is_table(table) => {
                let table = table.clone();
                *name = ast::ObjectName::from(vec![ast::Ident::new("pg_catalog"), table]);
            }
            // `pg_catalog.unnest(...)`, `pg_catalog.generate_series(...)`: table functions.
            [ast::ObjectNamePart::Identifier(schema), ast::ObjectNamePart::Identifier(f)]
                if schema.value == "pg_catalog" && !is_table(f) =>
            {
                let f = f.clone();
                *name = ast::ObjectName::from(vec![f]);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    /// `FROM generate_series(...) s` names its column `s`, as in PostgreSQL; a function that
    /// returns one value (`string_to_array(...) s`, Grafana's) is a relation of one row whose
    /// column is named `s`.
    fn pre_visit_table_factor(&mut self, factor: &mut ast::TableFactor) -> ControlFlow<()> {
        if let Some(one_row) = scalar_in_from(factor) {
            *factor = one_row;
            return ControlFlow::Continue(());
        }
        if let ast::TableFactor::Table {
            name,
            args: Some(_),
            alias: Some(alias),
            ..
        } = factor
        {
            let scalar = catalog_name(name)
                .is_some_and(|n| matches!(n.as_str(), "generate_series" | "unnest" | "range"));
            if scalar && alias.columns.is_empty() {
                let column = ast::TableAliasColumnDef::from_name(alias.name.value.clone());
                alias.columns.push(column);
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, query: &mut ast::Query) -> ControlFlow<()> {
        subquery::order_by_subqueries(query, self.is_aggregate);
        let mut bodies = vec![query.body.as_mut()];
        while let Some(body) = bodies.pop() {
            match body {
                ast::SetExpr::Select(select) => {
                    subquery::exists_as_count(select, self.is_aggregate);
                    subquery::distinct_names(select);
                }
                ast::SetExpr::SetOperation { left, right, .. } => {
                    bodies.push(left.as_mut());
                    bodies.push(right.as_mut());
                }
                _ => {}
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
        match expr {
            ast::Expr::Function(f) => {
                if let Some(name) = (f.name.0.len() == 2)
                    .then(|| catalog_name(&f.name))
                    .flatten()
                {
                    f.name = ast::ObjectName::from(vec![ast::Ident::new(name)]);
                }
                if let Some(subscripts) = generate_subscripts(f) {
                    *expr = subscripts;
                    return ControlFlow::Continue(());
                }
                if let Some(expanded) = expand_array(f) {
                    *expr = expanded;
                    return ControlFlow::Continue(());
                }
                let array = catalog_name(&f.name).is_some_and(|n| n == "array");
                if let (true, ast::FunctionArguments::Subquery(query)) = (array, &f.args) {
                    if let Some(rewritten) = subquery::array_of(query, self.is_aggregate) {
                        *expr = rewritten;
                    }
                }
            }
            // SQL's functions without parentheses, which PostgreSQL reads as such even where
            // a column has the name (unless it is quoted).
            ast::Expr::Identifier(i)
                if i.quote_style.is_none()
                    && matches!(
                        i.value.to_lowercase().as_str(),
                        "current_user"
                            | "session_user"
                            | "user"
                            | "current_role"
                            | "current_catalog"
                    ) =>
            {
                *expr = call(&i.value.to_lowercase(), vec![]);
            }
            // `substring(s FROM 'pattern')`: the part of `s` the POSIX pattern matches (its
            // first parenthesized part, if it has one), as `regexp_match` finds it.
            ast::Expr::Substring {
                expr: text,
                substring_from: Some(from),
                substring_for: None,
                special: false,
                ..
            } if constant_text(from).is_some() => {
                let matched = call("regexp_match", vec![(**text).clone(), (**from).clone()]);
                let one = ast::Expr::value(ast::Value::Number("1".into(), false));
                *expr = call("array_element", vec![matched, one]);
            }
            // `(keys).x`, a record's field: DataFusion's `get_field`.
            ast::Expr::CompoundFieldAccess { root, access_chain } => {
                if let Some(access) = field_access(root, access_chain) {
                    *expr = access;
                }
            }
            ast::Expr::Subquery(query) => {
                if let Some(rewritten) = subquery::decorrelate(query, self.is_aggregate) {
                    *expr = rewritten;
                }
            }
            ast::Expr::BinaryOp { op, .. } => {
                if let ast::BinaryOperator::PGCustomBinaryOperator(parts) = op {
                    if let Some(plain) = plain_operator(parts) {
                        *op = plain;
                    }
                }
            }
            ast::Expr::Like {
                pattern,
                escape_char,
                ..
            }
            | ast::Expr::ILike {
                pattern,
                escape_char,
                ..
            } => {
                if let Some(escaped) = escape_char
                    .as_ref()
                    .and_then(|e| backslash_pattern(pattern, &e.value))
                {
                    **pattern = ast::Expr::value(ast::Value::SingleQuotedString(escaped));
                    *escape_char = None;
                }
            }
            ast::Expr::Collate {
                expr: inner,
                collation,
            } => {
                let default = catalog_name(collation)
                    .is_some_and(|c| matches!(c.as_str(), "default" | "c" | "posix"));
                if default {
                    *expr = (**inner).clone();
                }
            }
            ast::Expr::Cast {
                expr: inner,
                data_type,
                ..
            } => {
                plain_type(data_type);
                if let Some(call) = catalog_cast(data_type, inner) {
                    *expr = call;
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}
