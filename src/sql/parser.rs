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
    /// Take a checkpoint now and answer with its id once it is complete; `CHECKPOINT BASE`
    /// takes a base one (a RocksDB image, not a delta).
    Checkpoint {
        base: bool,
    },
    ShowCheckpoints,
    ShowTables,
    ShowMaterializedViews,
    ShowCreateMaterializedView(String),
    ShowSources,
    ShowSinks,
    /// `CREATE SOURCE`, read as the `CREATE TABLE` it resembles.
    CreateSource(Box<ast::CreateTable>),
    /// `CREATE SINK`, read as a materialized view whose options include the connector.
    CreateSink(Box<ast::CreateView>),
    /// `DROP SOURCE` or `DROP SINK`.
    Drop {
        kind: crate::catalog::Kind,
        names: Vec<String>,
        if_exists: bool,
        cascade: bool,
    },
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
        let leading: Vec<String> = meaningful
            .iter()
            .take(2)
            .map(|t| t.token.to_string().to_uppercase())
            .collect();
        let source = leading == ["CREATE", "SOURCE"];
        let statement = match weir_statement(&meaningful) {
            Some(s) => s,
            None if leading == ["CREATE", "SINK"] => {
                let rewritten = rewrite_sink(sql, group)?;
                let tokens = Tokenizer::new(&dialect, &rewritten)
                    .tokenize_with_location()
                    .map_err(|e| Error::syntax(e.message.to_lowercase()))?;
                match parse_one(&rewritten, &tokens)? {
                    ast::Statement::CreateView(cv) => Statement::CreateSink(Box::new(cv)),
                    _ => return Err(Error::syntax("syntax error in CREATE SINK")),
                }
            }
            None => {
                // A source is declared as a table is: its columns, a watermark, WITH options.
                let mut group = group.to_vec();
                if source {
                    if let Some(t) = group.iter_mut().find(|t| {
                        matches!(&t.token, Token::Word(w) if w.value.eq_ignore_ascii_case("source"))
                    }) {
                        t.token = Token::make_keyword("TABLE");
                    }
                }
                let group = crate::sql::windows::rewrite_flink_tokens(&group);
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
                match stmt {
                    ast::Statement::CreateTable(ct) if source => {
                        Statement::CreateSource(Box::new(ct))
                    }
                    stmt => Statement::Sql(Box::new(stmt)),
                }
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
        ["CHECKPOINT"] => Some(Statement::Checkpoint { base: false }),
        ["CHECKPOINT", "BASE"] => Some(Statement::Checkpoint { base: true }),
        ["SHOW", "CHECKPOINTS"] => Some(Statement::ShowCheckpoints),
        ["SHOW", "TABLES"] => Some(Statement::ShowTables),
        ["SHOW", "MATERIALIZED", "VIEWS"] => Some(Statement::ShowMaterializedViews),
        ["SHOW", "SOURCES"] => Some(Statement::ShowSources),
        ["SHOW", "SINKS"] => Some(Statement::ShowSinks),
        ["DROP", kind @ ("SOURCE" | "SINK"), rest @ ..] => {
            let kind = match *kind {
                "SOURCE" => crate::catalog::Kind::Source,
                _ => crate::catalog::Kind::Sink,
            };
            let (if_exists, rest) = match rest {
                ["IF", "EXISTS", rest @ ..] => (true, rest),
                rest => (false, rest),
            };
            let (cascade, rest) = match rest {
                [rest @ .., "CASCADE"] => (true, rest),
                [rest @ .., "RESTRICT"] => (false, rest),
                rest => (false, rest),
            };
            // Names separated by commas; the tokens' own spelling (quoted names keep case).
            let first =
                tokens.len() - rest.len() - usize::from(cascade || w.last() == Some(&"RESTRICT"));
            let mut names = Vec::new();
            for (i, word) in rest.iter().enumerate() {
                if i % 2 == 1 {
                    if *word != "," {
                        return None;
                    }
                    continue;
                }
                match &tokens[first + i].token {
                    Token::Word(w) if w.quote_style.is_some() => names.push(w.value.clone()),
                    Token::Word(w) => names.push(w.value.to_lowercase()),
                    _ => return None,
                }
            }
            if names.is_empty() || rest.len() % 2 == 0 {
                return None;
            }
            Some(Statement::Drop {
                kind,
                names,
                if_exists,
                cascade,
            })
        }
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

/// `CREATE SINK [IF NOT EXISTS] name {AS query | FROM relation} [EMIT ON WINDOW CLOSE]
/// [WITH (options)]` as the materialized view statement it is read as:
/// `CREATE MATERIALIZED VIEW name WITH (options) AS query`.
fn rewrite_sink(sql: &str, tokens: &[TokenWithSpan]) -> Result<String> {
    use crate::sql::windows::{token_text, tokens_text};
    let words = crate::sql::windows::words(tokens);
    let text = |range| tokens_text(tokens, range);
    let upper: Vec<&str> = words.iter().map(|(_, w)| w.as_str()).collect();
    let bad = |k: usize| match words.get(k) {
        Some((i, _)) => near(sql, &tokens[*i]),
        None => Error::syntax("syntax error at end of input"),
    };
    let (if_not_exists, name_at) = match upper.get(2..5) {
        Some(["IF", "NOT", "EXISTS"]) => ("IF NOT EXISTS ", 5),
        _ => ("", 2),
    };
    if !matches!(words.get(name_at), Some((i, _)) if matches!(tokens[*i].token, Token::Word(_))) {
        return Err(bad(name_at));
    }
    let name = token_text(&tokens[words[name_at].0].token);
    // Trailing `WITH ( ... )`.
    let mut end = upper.len();
    let mut options = Vec::new();
    if upper.last() == Some(&")") {
        let mut depth = 0;
        let mut open = None;
        for k in (0..upper.len()).rev() {
            match upper[k] {
                ")" => depth += 1,
                "(" => {
                    depth -= 1;
                    if depth == 0 {
                        open = Some(k);
                        break;
                    }
                }
                _ => {}
            }
        }
        if let Some(open) = open.filter(|o| *o > 0 && upper[o - 1] == "WITH") {
            options.push(text(words[open].0 + 1..words[upper.len() - 1].0));
            end = open - 1;
        }
    }
    if end >= 4 && upper[end - 4..end] == ["EMIT", "ON", "WINDOW", "CLOSE"] {
        options.push("emit_on_window_close = true".into());
        end -= 4;
    }
    let query_end = words.get(end).map(|(i, _)| *i).unwrap_or(tokens.len());
    let body = match upper.get(name_at + 1) {
        Some(&"AS") if end > name_at + 2 => text(words[name_at + 2].0..query_end),
        Some(&"FROM") if end == name_at + 3 => {
            format!("SELECT * FROM {}", text(words[name_at + 2].0..query_end))
        }
        _ => return Err(bad(name_at + 1)),
    };
    let with = if options.is_empty() {
        String::new()
    } else {
        format!("WITH ({}) ", options.join(", "))
    };
    Ok(format!(
        "CREATE MATERIALIZED VIEW {if_not_exists}{name} {with}AS {body}"
    ))
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
        let p = parse("CHECKPOINT; checkpoint base").unwrap();
        assert!(matches!(
            p[0].statement,
            Statement::Checkpoint { base: false }
        ));
        assert!(matches!(
            p[1].statement,
            Statement::Checkpoint { base: true }
        ));
    }

    #[test]
    fn sources_and_sinks_are_read() {
        let p = parse(
            "CREATE SOURCE bid (auction bigint, date_time timestamp, \
             WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) \
             WITH (connector = 'nexmark', stream = 'bid');
             CREATE SOURCE p WITH (connector = 'nexmark', stream = 'person')",
        )
        .unwrap();
        let Statement::CreateSource(ct) = &p[0].statement else {
            panic!("{:?}", p[0].statement)
        };
        assert_eq!(ct.columns.len(), 2);
        let options = ct.table_options.to_string();
        assert!(
            options.contains("watermark = 'date_time - INTERVAL ''4'' SECOND'"),
            "{options}"
        );
        assert!(options.contains("connector = 'nexmark'"), "{options}");
        assert!(matches!(&p[1].statement, Statement::CreateSource(ct) if ct.columns.is_empty()));
        let p = parse(
            "CREATE SINK s AS SELECT a, count(*) FROM t GROUP BY a WITH (connector = 'blackhole');
             create sink IF NOT EXISTS \"S2\" from v; \
             CREATE SINK w AS SELECT 1 FROM t EMIT ON WINDOW CLOSE WITH (connector = 'blackhole')",
        )
        .unwrap();
        let Statement::CreateSink(cv) = &p[0].statement else {
            panic!("{:?}", p[0].statement)
        };
        assert_eq!(cv.name.to_string(), "s");
        assert_eq!(cv.query.to_string(), "SELECT a, count(*) FROM t GROUP BY a");
        let Statement::CreateSink(cv) = &p[1].statement else {
            panic!("{:?}", p[1].statement)
        };
        assert!(cv.if_not_exists);
        assert_eq!(cv.query.to_string(), "SELECT * FROM v");
        let Statement::CreateSink(cv) = &p[2].statement else {
            panic!("{:?}", p[2].statement)
        };
        assert!(cv
            .options
            .to_string()
            .contains("emit_on_window_close = true"));
        assert!(parse("CREATE SINK s WITH (connector = 'blackhole')").is_err());
        let p = parse("DROP SOURCE IF EXISTS a, \"B\" CASCADE; DROP SINK s").unwrap();
        assert!(
            matches!(&p[0].statement, Statement::Drop { names, if_exists: true, cascade: true, .. }
            if names == &["a".to_string(), "B".to_string()])
        );
        assert!(matches!(
            &p[1].statement,
            Statement::Drop { cascade: false, .. }
        ));
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let sql = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
        assert!(parse(&sql).is_err());
    }
}
