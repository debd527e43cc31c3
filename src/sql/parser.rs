//! Splits a query string into statements and parses each: standard SQL through DataFusion's
//! sqlparser (PostgreSQL dialect), and Weir's own statements (FLUSH, CHECKPOINT, SHOW
//! CHECKPOINTS, SHOW MATERIALIZED VIEWS, SHOW CREATE MATERIALIZED VIEW) by their leading
//! keywords.
//!
//! The whole string is parsed before anything runs, as in PostgreSQL: a syntax error in the
//! third statement means the first two do not run either.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, Visit, Visitor};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use crate::error::{Error, Result};

/// Statements nest no deeper than this (parentheses, subqueries): deeper input is refused
/// rather than risking the stack.
const NESTING_MAX: usize = 64;

#[derive(Debug, Clone)]
pub enum Statement {
    /// Wait until every acknowledged change is visible in every view.
    Flush,
    /// Take a checkpoint now and answer with its id once it is complete.
    Checkpoint,
    ShowCheckpoints,
    ShowTables,
    ShowMaterializedViews,
    ShowCreateMaterializedView(String),
    Sql(Box<ast::Statement>),
}

#[derive(Debug, Clone)]
pub struct Parsed {
    pub statement: Statement,
    /// The statement's own text (without the separating semicolon).
    pub text: String,
}

pub fn parse(sql: &str) -> Result<Vec<Parsed>> {
    let dialect = PostgreSqlDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| {
            let pos = char_position(sql, e.location);
            Error::syntax(e.message.to_lowercase()).with_position(pos)
        })?;
    let mut out = Vec::new();
    for group in tokens.split(|t| t.token == Token::SemiColon) {
        let meaningful: Vec<TokenWithSpan> = group
            .iter()
            .filter(|t| !matches!(t.token, Token::Whitespace(_)))
            .cloned()
            .collect();
        let (Some(first), Some(last)) = (meaningful.first(), meaningful.last()) else {
            continue;
        };
        let start = char_position(sql, first.span.start) - 1;
        let end = char_position(sql, last.span.end) - 1;
        let text: String = sql.chars().skip(start).take(end - start).collect();
        let statement = match weir_statement(&meaningful) {
            Some(s) => s,
            None => {
                let group = crate::sql::windows::rewrite_flink_tokens(group);
                let mut stmt = match crate::sql::windows::rewrite_streaming_clauses(&group) {
                    Some(rewritten) => {
                        let tokens = Tokenizer::new(&dialect, &rewritten)
                            .tokenize_with_location()
                            .map_err(|e| Error::syntax(e.message.to_lowercase()))?;
                        parse_one(&rewritten, &tokens)?
                    }
                    None => parse_one(sql, &group)?,
                };
                normalize_interval_literals(&mut stmt);
                crate::sql::windows::rewrite_window_functions(&mut stmt)?;
                Statement::Sql(Box::new(stmt))
            }
        };
        out.push(Parsed { statement, text });
    }
    Ok(out)
}

/// Refuses what the planner would answer wrongly: `EXCEPT ALL` and `INTERSECT ALL`, which
/// DataFusion plans as plain anti and semi joins (dropping or keeping every copy of a row,
/// instead of as many copies as the other side has).
pub fn check_supported(stmt: &ast::Statement) -> Result<()> {
    struct Check;
    impl Visitor for Check {
        type Break = String;
        fn pre_visit_query(&mut self, query: &ast::Query) -> ControlFlow<String> {
            bag_operation(&query.body).map_or(ControlFlow::Continue(()), ControlFlow::Break)
        }
    }
    match stmt.visit(&mut Check) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(op) => Err(Error::not_supported(format!("{op} is not supported"))
            .with_hint(format!(
                "Use {} without ALL, or compare counts with GROUP BY.",
                op.trim_end_matches(" ALL")
            ))),
    }
}

fn bag_operation(body: &ast::SetExpr) -> Option<String> {
    let ast::SetExpr::SetOperation {
        left,
        op,
        set_quantifier,
        right,
    } = body
    else {
        return None;
    };
    let all = matches!(
        set_quantifier,
        ast::SetQuantifier::All | ast::SetQuantifier::AllByName
    );
    match op {
        ast::SetOperator::Except | ast::SetOperator::Minus if all => Some("EXCEPT ALL".into()),
        ast::SetOperator::Intersect if all => Some("INTERSECT ALL".into()),
        _ => bag_operation(left).or_else(|| bag_operation(right)),
    }
}

fn parse_one(sql: &str, tokens: &[TokenWithSpan]) -> Result<ast::Statement> {
    let dialect = PostgreSqlDialect {};
    let mut tokens = tokens.to_vec();
    let end = tokens
        .last()
        .map(|t| t.span.end)
        .unwrap_or(Location { line: 1, column: 1 });
    tokens.push(TokenWithSpan::at(Token::EOF, end, end));
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(NESTING_MAX)
        .with_tokens_with_locations(tokens);
    let statement = parser.parse_statement().map_err(|e| syntax_error(sql, e))?;
    let next = parser.peek_token();
    if next.token != Token::EOF {
        return Err(near(sql, &next));
    }
    Ok(statement)
}

fn near(sql: &str, token: &TokenWithSpan) -> Error {
    let message = match &token.token {
        Token::EOF => "syntax error at end of input".to_string(),
        t => format!("syntax error at or near \"{t}\""),
    };
    Error::syntax(message).with_position(char_position(sql, token.span.start))
}

/// Turns sqlparser's "Expected: X, found: Y at Line: l, Column: c" into PostgreSQL's form.
fn syntax_error(sql: &str, e: ParserError) -> Error {
    let text = match e {
        ParserError::RecursionLimitExceeded => {
            return Error::new(
                crate::error::ErrorKind::ProgramLimitExceeded,
                format!("statement is nested more than {NESTING_MAX} levels deep"),
            )
        }
        ParserError::ParserError(m) | ParserError::TokenizerError(m) => m,
    };
    let location = text.rfind(" at Line: ").and_then(|i| {
        let rest = &text[i + " at Line: ".len()..];
        let (line, col) = rest.split_once(", Column: ")?;
        Some(Location {
            line: line.trim().parse().ok()?,
            column: col.trim().parse().ok()?,
        })
    });
    let found = text
        .split_once("found: ")
        .map(|(_, f)| f.split(" at Line: ").next().unwrap_or(f).trim().to_string());
    let message = match found.as_deref() {
        Some("EOF") | None => "syntax error at end of input".to_string(),
        Some(f) => format!("syntax error at or near \"{f}\""),
    };
    let detail = text.split(" at Line: ").next().unwrap_or(&text).to_string();
    let mut err = Error::syntax(message).with_detail(detail);
    if let Some(loc) = location {
        err = err.with_position(char_position(sql, loc));
    }
    err
}

/// The 1-based character position of a line/column location (as PostgreSQL reports it).
fn char_position(sql: &str, loc: Location) -> usize {
    let mut pos = 0usize;
    for (i, line) in sql.split('\n').enumerate() {
        if (i as u64) + 1 == loc.line {
            return pos + (loc.column.max(1) as usize);
        }
        pos += line.chars().count() + 1;
    }
    pos.max(1)
}

/// Rewrites `INTERVAL '04:05:06'` literals (PostgreSQL's clock notation) into the form
/// DataFusion reads. DataFusion turns these into values while planning, before any analyzer
/// rule runs; casts of text to interval are rewritten later, by `sql::rules`.
fn normalize_interval_literals(stmt: &mut ast::Statement) {
    let _ = ast::visit_expressions_mut(stmt, |e| {
        if let ast::Expr::Interval(i) = e {
            if let ast::Expr::Value(v) = i.value.as_mut() {
                if let ast::Value::SingleQuotedString(s) = &mut v.value {
                    if let Some(n) = crate::types::normalize_interval_text(s) {
                        *s = n;
                    }
                }
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// Recognises Weir's own statements by their keywords.
fn weir_statement(tokens: &[TokenWithSpan]) -> Option<Statement> {
    let words: Vec<String> = tokens
        .iter()
        .map(|t| match &t.token {
            Token::Word(w) if w.quote_style.is_none() => w.value.to_uppercase(),
            Token::Word(w) => w.value.clone(),
            other => other.to_string(),
        })
        .collect();
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    match w.as_slice() {
        ["FLUSH"] => Some(Statement::Flush),
        ["CHECKPOINT"] => Some(Statement::Checkpoint),
        ["SHOW", "CHECKPOINTS"] => Some(Statement::ShowCheckpoints),
        ["SHOW", "TABLES"] => Some(Statement::ShowTables),
        ["SHOW", "MATERIALIZED", "VIEWS"] => Some(Statement::ShowMaterializedViews),
        ["SHOW", "CREATE", "MATERIALIZED", "VIEW", _] => {
            let name = match &tokens[4].token {
                Token::Word(word) if word.quote_style.is_some() => word.value.clone(),
                Token::Word(word) => word.value.to_lowercase(),
                _ => return None,
            };
            Some(Statement::ShowCreateMaterializedView(name))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn splits_statements_and_keeps_their_text() {
        let p = parse("CREATE TABLE t (a int); FLUSH ;\n select 'a;b' from t;;").unwrap();
        assert_eq!(p.len(), 3);
        assert!(matches!(p[1].statement, Statement::Flush));
        assert_eq!(p[2].text, "select 'a;b' from t");
        assert_eq!(p[0].text, "CREATE TABLE t (a int)");
    }

    #[test]
    fn syntax_errors_carry_a_position() {
        let e = parse("SELECT 1;\nSELEC 2").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Syntax);
        assert_eq!(e.message, "syntax error at or near \"SELEC\"");
        assert_eq!(e.position, Some(11));
        let e = parse("SELECT * FROM").unwrap_err();
        assert_eq!(e.message, "syntax error at end of input");
        let e = parse("SELECT 1 2").unwrap_err();
        assert_eq!(e.position, Some(10));
    }

    #[test]
    fn weir_statements_are_recognised() {
        let p = parse("show create materialized view \"My\"; SHOW MATERIALIZED VIEWS").unwrap();
        assert!(matches!(&p[0].statement, Statement::ShowCreateMaterializedView(n) if n == "My"));
        assert!(matches!(p[1].statement, Statement::ShowMaterializedViews));
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let sql = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
        assert!(parse(&sql).is_err());
    }
}
