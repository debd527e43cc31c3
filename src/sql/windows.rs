//! Time windows as table functions in `FROM`: `TUMBLE(t, ts, size)` and
//! `HOP(t, ts, slide, size)` (RisingWave's form), also written as Flink's
//! `TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), size))`. Each is rewritten into a derived table
//! that adds `window_start` and `window_end` to `t`'s columns, so that views and queries plan
//! them like any other subquery:
//!
//! - TUMBLE: `window_start = date_bin(size, ts, '1970-01-01')`, `window_end = window_start +
//!   size`: every row falls in exactly one window.
//! - HOP: every row falls in `size / slide` windows (the size must be a whole number of
//!   slides): one `UNION ALL` branch per window, starting `i` slides before the row's slide.
//!
//! Windows are aligned to the Unix epoch, as in Flink and RisingWave. A row whose time is NULL
//! belongs to no window and is left out. Over a `timestamptz` column the window's bounds are
//! `timestamp`s in UTC (as Flink's are over a `TIMESTAMP_LTZ`).

use std::ops::ControlFlow;

use datafusion::arrow::compute::kernels::cast_utils::parse_interval_month_day_nano;
use datafusion::sql::sqlparser::ast::{self, VisitMut, VisitorMut};
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Word};

use crate::error::{Error, ErrorKind, Result};
use crate::sql::dialect::WeirDialect;

/// A hopping window covers at most this many slides (one branch of the plan each).
const HOP_SLIDES_MAX: i128 = 64;

const ORIGIN: &str = "TIMESTAMP '1970-01-01 00:00:00'";

/// Rewrites Flink's `TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), ...))` into `TUMBLE(t, ts, ...)`
/// at the token level (sqlparser reads neither `TABLE t` nor `DESCRIPTOR(ts)` as arguments).
pub fn rewrite_flink_tokens(tokens: &[TokenWithSpan]) -> Vec<TokenWithSpan> {
    let is_word = |t: &TokenWithSpan, w: &str| matches!(&t.token, Token::Word(Word { value, quote_style: None, .. }) if value.eq_ignore_ascii_case(w));
    let meaningful = crate::sql::extensions::meaningful(tokens);
    let at = |k: usize| meaningful.get(k).map(|&i| &tokens[i]);
    let mut drop = vec![false; tokens.len()];
    for k in 0..meaningful.len() {
        // TABLE ( TUMBLE|HOP ( TABLE name , DESCRIPTOR ( col ) , ... ) )
        let matches = at(k).is_some_and(|t| is_word(t, "TABLE"))
            && at(k + 1).is_some_and(|t| t.token == Token::LParen)
            && at(k + 2).is_some_and(|t| is_word(t, "TUMBLE") || is_word(t, "HOP"))
            && at(k + 3).is_some_and(|t| t.token == Token::LParen)
            && at(k + 4).is_some_and(|t| is_word(t, "TABLE"));
        if !matches {
            continue;
        }
        // The closing parenthesis of TABLE( ... ).
        let mut depth = 0;
        let mut close = None;
        for (j, &i) in meaningful.iter().enumerate().skip(k + 1) {
            match tokens[i].token {
                Token::LParen => depth += 1,
                Token::RParen => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { continue };
        // DESCRIPTOR ( col ): keep only col.
        let Some(d) = (k + 5..close).find(|&j| at(j).is_some_and(|t| is_word(t, "DESCRIPTOR")))
        else {
            continue;
        };
        if !(at(d + 1).is_some_and(|t| t.token == Token::LParen)
            && at(d + 3).is_some_and(|t| t.token == Token::RParen))
        {
            continue;
        }
        for j in [k, k + 1, k + 4, d, d + 1, d + 3, close] {
            drop[meaningful[j]] = true;
        }
    }
    tokens
        .iter()
        .zip(drop)
        .filter(|(_, d)| !d)
        .map(|(t, _)| t.clone())
        .collect()
}

/// Replaces every `TUMBLE(...)` and `HOP(...)` in `FROM` with its derived table.
pub fn rewrite_window_functions(stmt: &mut ast::Statement) -> Result<()> {
    struct Rewrite;
    impl VisitorMut for Rewrite {
        type Break = Error;
        fn pre_visit_table_factor(&mut self, factor: &mut ast::TableFactor) -> ControlFlow<Error> {
            match window_table(factor) {
                Ok(Some(derived)) => {
                    *factor = derived;
                    ControlFlow::Continue(())
                }
                Ok(None) => ControlFlow::Continue(()),
                Err(e) => ControlFlow::Break(e),
            }
        }
    }
    match stmt.visit(&mut Rewrite) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e),
    }
}

fn window_table(factor: &ast::TableFactor) -> Result<Option<ast::TableFactor>> {
    let ast::TableFactor::Table {
        name,
        alias,
        args: Some(args),
        ..
    } = factor
    else {
        return Ok(None);
    };
    let function = name.to_string().to_lowercase();
    if function != "tumble" && function != "hop" {
        return Ok(None);
    }
    let exprs: Vec<&ast::Expr> = args
        .args
        .iter()
        .map(|a| match a {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
            other => Err(invalid(format!(
                "unexpected argument {other} to {function}"
            ))),
        })
        .collect::<Result<_>>()?;
    let (table, column, intervals) = match (function.as_str(), exprs.as_slice()) {
        ("tumble", [t, c, size]) => (*t, *c, vec![*size]),
        ("hop", [t, c, slide, size]) => (*t, *c, vec![*slide, *size]),
        _ => {
            return Err(invalid(format!(
                "{function}() takes a table, a timestamp column and {}",
                if function == "tumble" {
                    "a window size"
                } else {
                    "a slide and a window size"
                }
            )))
        }
    };
    let table_name = match table {
        ast::Expr::Identifier(i) => i.to_string(),
        ast::Expr::CompoundIdentifier(parts) => parts
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join("."),
        other => {
            return Err(invalid(format!(
                "the first argument of {function}() must be a table or view, not {other}"
            )))
        }
    };
    let nanos: Vec<i128> = intervals
        .iter()
        .map(|e| interval_nanos(e, &function))
        .collect::<Result<_>>()?;
    // DataFusion bins a timestamptz in nanoseconds; windows are binned on the column's
    // microseconds as a timestamp (UTC), which a watermark on the column passes through.
    let column = format!("arrow_cast({column}, 'Timestamp(Microsecond, None)')");
    let sql = if function == "tumble" {
        let size = intervals[0];
        format!(
            "SELECT *, date_bin({size}, {column}, {ORIGIN}) AS window_start, \
             date_bin({size}, {column}, {ORIGIN}) + {size} AS window_end \
             FROM {table_name} WHERE {column} IS NOT NULL"
        )
    } else {
        let (slide, size) = (intervals[0], intervals[1]);
        let (slide_ns, size_ns) = (nanos[0], nanos[1]);
        if size_ns % slide_ns != 0 {
            return Err(invalid(
                "the size of a HOP window must be a whole number of slides".into(),
            ));
        }
        let slides = size_ns / slide_ns;
        if slides > HOP_SLIDES_MAX {
            return Err(Error::new(
                ErrorKind::ProgramLimitExceeded,
                format!("a HOP window can span at most {HOP_SLIDES_MAX} slides, not {slides}"),
            ));
        }
        (0..slides)
            .map(|i| {
                let back = format!("INTERVAL '{} microseconds'", i * slide_ns / 1000);
                format!(
                    "SELECT *, date_bin({slide}, {column}, {ORIGIN}) - {back} AS window_start, \
                     date_bin({slide}, {column}, {ORIGIN}) - {back} + {size} AS window_end \
                     FROM {table_name} WHERE {column} IS NOT NULL"
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    };
    let subquery = Parser::new(&WeirDialect::for_tokens(sql.len()))
        .try_with_sql(&sql)
        .and_then(|mut p| p.parse_query())
        .map_err(|e| Error::internal(format!("window rewrite produced bad SQL: {e}")))?;
    // Unaliased, the window keeps the table's name, so that `t.col` still resolves.
    let alias = alias.clone().unwrap_or_else(|| ast::TableAlias {
        explicit: true,
        name: ast::Ident::new(table_name.rsplit('.').next().unwrap_or(&table_name)),
        columns: vec![],
        at: None,
    });
    Ok(Some(ast::TableFactor::Derived {
        lateral: false,
        subquery,
        alias: Some(alias),
        sample: None,
    }))
}

/// A window's size or slide (or a watermark's delay) in nanoseconds: a positive interval
/// literal of fixed length.
pub fn interval_nanos(e: &ast::Expr, function: &str) -> Result<i128> {
    let ast::Expr::Interval(i) = e else {
        return Err(invalid(format!(
            "the sizes of a {function}() window must be interval literals, not {e}"
        )));
    };
    let text = match (i.value.as_ref(), &i.leading_field) {
        (ast::Expr::Value(v), field) => match (&v.value, field) {
            (ast::Value::SingleQuotedString(s), None) => s.clone(),
            (ast::Value::SingleQuotedString(s), Some(f)) => format!("{s} {f}"),
            _ => String::new(),
        },
        _ => String::new(),
    };
    let value = parse_interval_month_day_nano(&text)
        .map_err(|_| invalid(format!("cannot read {e} as a window size")))?;
    if value.months != 0 {
        return Err(invalid(format!(
            "{function}() windows must have a fixed length; {e} counts months"
        )));
    }
    let nanos = value.days as i128 * 86_400_000_000_000 + value.nanoseconds as i128;
    if nanos <= 0 || nanos % 1000 != 0 {
        return Err(invalid(format!(
            "{function}() window sizes must be positive whole microseconds, not {e}"
        )));
    }
    Ok(nanos)
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidParameter, message)
}

#[cfg(test)]
mod tests {
    use crate::sql::parser::{parse, Statement};

    fn sql_of(text: &str) -> String {
        match &parse(text).unwrap()[0].statement {
            Statement::Sql(s) => s.to_string(),
            _ => panic!("not SQL"),
        }
    }

    #[test]
    fn flink_window_syntax_reads_as_the_function() {
        let flink = sql_of(
            "SELECT * FROM TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE, INTERVAL '2' MINUTE))",
        );
        let plain = sql_of("SELECT * FROM HOP(t, ts, INTERVAL '1' MINUTE, INTERVAL '2' MINUTE)");
        assert_eq!(flink, plain);
        assert!(plain.contains("UNION ALL"), "{plain}");
    }
}
