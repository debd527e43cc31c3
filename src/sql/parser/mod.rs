//! Splits a query string into statements and parses each into a typed syntax tree: standard
//! SQL through DataFusion's sqlparser (PostgreSQL dialect), with Weir's clauses and `CREATE
//! SINK` read from the same tokens (`extensions`), and Weir's own commands (FLUSH,
//! CHECKPOINT, SHOW CHECKPOINTS, SHOW MATERIALIZED VIEWS, SHOW CREATE (TABLE, SOURCE, MATERIALIZED VIEW, SINK), DROP
//! SOURCE/SINK) by their leading keywords. Nothing is printed back to text and parsed again.
//!
//! The whole string is parsed before anything runs, as in PostgreSQL: a syntax error in the
//! third statement means the first two do not run either.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, Visit, Visitor};
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use crate::error::{Error, Result};
use crate::sql::dialect::WeirDialect;
use crate::sql::extensions::{self, CreateSink, CreateView, Watermark};
use crate::sql::{grants, roles};

mod cursors;
mod limits;

pub use self::cursors::{Count, CursorQuery, Subscribe};

use self::limits::{
    balance_logic, check_depth, check_expansion, too_complex, PARSER_RECURSION_MAX, SPLIT_HINT,
};

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
    /// `SHOW CREATE TABLE | SOURCE | MATERIALIZED VIEW | SINK name`: the statement that
    /// creates the object.
    ShowCreate(crate::catalog::Kind, String),
    /// `CREATE`, `ALTER` and `DROP` of a `ROLE` or `USER`.
    Role(crate::sql::RoleStatement),
    /// `GRANT` and `REVOKE`, of privileges or of roles.
    Grant(crate::sql::GrantStatement),
    /// `CREATE`, `ALTER` and `DROP SECRET`.
    Secret(crate::sql::SecretStatement),
    ShowSources,
    ShowSinks,
    /// `CREATE TABLE`, with its watermark, and for a table fed by a connector its `FORMAT`
    /// and `INCLUDE` clauses.
    CreateTable {
        table: Box<ast::CreateTable>,
        watermark: Option<Box<Watermark>>,
        format: Option<extensions::Format>,
        include: Vec<extensions::Include>,
        /// `FROM source TABLE 'upstream'`: a table fed by a source of several tables.
        from: Option<extensions::FromSource>,
    },
    /// `CREATE SOURCE`, read as the `CREATE TABLE` it resembles.
    CreateSource {
        table: Box<ast::CreateTable>,
        watermark: Option<Box<Watermark>>,
        /// `FORMAT ... ENCODE ...`, which the connector reads as its `format` and `encode`
        /// options.
        format: Option<extensions::Format>,
        /// `INCLUDE ... [AS ...]`, which the connector reads as its `include.*` options.
        include: Vec<extensions::Include>,
    },
    CreateView(Box<CreateView>),
    CreateSink(Box<CreateSink>),
    /// `DROP SOURCE` or `DROP SINK`.
    Drop {
        kind: crate::catalog::Kind,
        names: Vec<String>,
        if_exists: bool,
        cascade: bool,
    },
    /// `SUBSCRIBE TO relation`: its rows, then its changes as they are sealed.
    Subscribe(Subscribe),
    /// `COPY (SUBSCRIBE ...) TO STDOUT`, with the COPY's options in `copy` (over `SELECT 1`).
    CopySubscribe {
        subscribe: Subscribe,
        copy: Box<ast::Statement>,
    },
    /// `DECLARE name CURSOR FOR ...`.
    Declare {
        name: String,
        query: CursorQuery,
    },
    /// `FETCH` (or, `moves`, `MOVE`) from a cursor.
    Fetch {
        name: String,
        count: Count,
        moves: bool,
    },
    /// `CLOSE name`, or `CLOSE ALL` (`None`).
    Close(Option<String>),
    Sql(Box<ast::Statement>),
}

#[derive(Debug, Clone)]
pub struct Parsed {
    pub statement: Statement,
    /// The statement's own text (without the separating semicolon).
    pub text: String,
}

pub fn parse(sql: &str) -> Result<Vec<Parsed>> {
    let mut out = Vec::new();
    each_statement(sql, |parsed, _| out.push(parsed))?;
    Ok(out)
}

/// Statements of a message kept parsed; those after them are parsed again as they run.
const PARSED_KEPT_MAX: usize = 16;

/// A statement of a message of several: parsed, or where its text is, to be parsed again
/// when it runs.
pub enum Pending {
    Parsed(Parsed),
    Text(std::ops::Range<usize>),
}

/// Checks every statement of `sql` as `parse` does, but keeps only the first few parsed: for
/// the others it keeps where their text is. A message of many statements then never holds
/// every statement's syntax tree at once (about 14 KB each for `SELECT 1`: 1.4 GB for a
/// message of 100,000).
pub fn parse_message(sql: &str) -> Result<Vec<Pending>> {
    let mut out = Vec::new();
    each_statement(sql, |parsed, text| {
        out.push(if out.len() < PARSED_KEPT_MAX {
            Pending::Parsed(parsed)
        } else {
            Pending::Text(text)
        })
    })?;
    Ok(out)
}

impl Pending {
    /// The statement, parsed again from `sql` (the message) if it was not kept.
    pub fn parsed(self, sql: &str) -> Result<Parsed> {
        match self {
            Pending::Parsed(p) => Ok(p),
            Pending::Text(range) => parse(&sql[range])?
                .into_iter()
                .next()
                .ok_or_else(|| Error::internal("a statement's text parsed to nothing")),
        }
    }
}

/// Parses the statements of `sql` in order, handing each to `f` with the byte range of its
/// text.
fn each_statement(sql: &str, mut f: impl FnMut(Parsed, std::ops::Range<usize>)) -> Result<()> {
    let dialect = WeirDialect::for_tokenizing();
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| {
            let pos = char_position(sql, e.location);
            Error::syntax(e.message.to_lowercase()).with_position(pos)
        })?;
    // Positions are found in one pass over the text however many statements it holds.
    let lines = Lines::new(sql);
    let mut cursor = ByteCursor::new(sql);
    for group in tokens.split(|t| t.token == Token::SemiColon) {
        let meaningful: Vec<TokenWithSpan> = group
            .iter()
            .filter(|t| !matches!(t.token, Token::Whitespace(_)))
            .cloned()
            .collect();
        let (Some(first), Some(last)) = (meaningful.first(), meaningful.last()) else {
            continue;
        };
        check_depth(&meaningful)?;
        let start = lines.position(first.span.start) - 1;
        let end = lines.position(last.span.end) - 1;
        let (from, to) = (cursor.byte_at(start), cursor.byte_at(end));
        let range = from..to.max(from);
        let text = sql[range.clone()].to_string();
        let query = |tokens: &[TokenWithSpan]| match parse_sql(sql, tokens)? {
            ast::Statement::Query(q) => Ok(*q),
            _ => Err(Error::syntax("a cursor is declared for a query")),
        };
        let statement = match cursors::statement(sql, &meaningful, query) {
            Some(s) => s?,
            None => match weir_statement(&meaningful) {
                Some(s) => s,
                None => statement(sql, group)?,
            },
        };
        f(Parsed { statement, text }, range);
    }
    Ok(())
}

/// A statement of standard SQL with Weir's clauses (`extensions`), or `CREATE SINK`.
fn statement(sql: &str, group: &[TokenWithSpan]) -> Result<Statement> {
    let lead: Vec<String> = group
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .take(3)
        .map(|t| match &t.token {
            Token::Word(w) if w.quote_style.is_none() => w.value.to_uppercase(),
            other => other.to_string(),
        })
        .collect();
    let lead: Vec<&str> = lead.iter().map(String::as_str).collect();
    if let Some(secret) = super::secrets::statement(sql, group) {
        return Ok(Statement::Secret(secret?));
    }
    if lead.starts_with(&["CREATE", "SINK"]) {
        let mut group = group.to_vec();
        super::secrets::references(&mut group);
        let sink = extensions::create_sink(sql, &group, |tokens| match parse_sql(sql, tokens)? {
            ast::Statement::Query(q) => Ok(*q),
            _ => Err(Error::syntax("a sink is defined by a query")),
        })?;
        return Ok(Statement::CreateSink(Box::new(sink)));
    }
    if matches!(lead.first(), Some(&"GRANT" | &"REVOKE")) {
        if let Some(membership) = grants::membership(group) {
            return Ok(Statement::Grant(membership?));
        }
    }
    let mut tokens = group.to_vec();
    // A user is a role that may log in (`CREATE USER`), read as PostgreSQL's `ROLE`.
    let user = matches!(lead.as_slice(), ["CREATE" | "ALTER" | "DROP", "USER", ..]);
    if user {
        if let Some(t) = tokens
            .iter_mut()
            .find(|t| matches!(&t.token, Token::Word(w) if w.value.eq_ignore_ascii_case("user")))
        {
            t.token = Token::make_keyword("ROLE");
        }
    }
    if matches!(lead.as_slice(), ["CREATE" | "ALTER", "USER" | "ROLE", ..]) {
        negative_limits(&mut tokens);
    }
    // A source is declared as a table is: its columns, a watermark, WITH options.
    let source = lead.starts_with(&["CREATE", "SOURCE"]);
    if source {
        if let Some(t) = tokens
            .iter_mut()
            .find(|t| matches!(&t.token, Token::Word(w) if w.value.eq_ignore_ascii_case("source")))
        {
            t.token = Token::make_keyword("TABLE");
        }
    }
    let watermark = if source || lead.starts_with(&["CREATE", "TABLE"]) {
        extensions::take_watermark(sql, &mut tokens)?
    } else {
        None
    };
    let table = lead.starts_with(&["CREATE", "TABLE"]);
    let (format, include) = if source || table {
        super::secrets::references(&mut tokens);
        extensions::join_dotted_option_names(&mut tokens);
        let format = extensions::take_format(&mut tokens);
        (format, extensions::take_includes(sql, &mut tokens)?)
    } else {
        (None, Vec::new())
    };
    let from = if table {
        extensions::take_from_source(sql, &mut tokens)?
    } else {
        None
    };
    let emit_on_window_close = lead == ["CREATE", "MATERIALIZED", "VIEW"]
        && extensions::take_emit_on_window_close(&mut tokens);
    Ok(match parse_sql(sql, &tokens)? {
        ast::Statement::CreateTable(ct) if source => Statement::CreateSource {
            table: Box::new(ct),
            watermark,
            format,
            include,
        },
        ast::Statement::CreateTable(ct) => Statement::CreateTable {
            table: Box::new(ct),
            watermark,
            format,
            include,
            from,
        },
        ast::Statement::CreateView(cv) => Statement::CreateView(Box::new(CreateView {
            view: Box::new(cv),
            emit_on_window_close,
        })),
        ast::Statement::CreateRole(c) => Statement::Role(roles::create_role(&c, user)?),
        ast::Statement::Grant(g) => Statement::Grant(grants::grant(&g)?),
        ast::Statement::Revoke(r) => Statement::Grant(grants::revoke(&r)?),
        ast::Statement::AlterRole { name, operation } => {
            Statement::Role(roles::alter_role(&name, &operation)?)
        }
        ast::Statement::Drop {
            object_type: ast::ObjectType::Role | ast::ObjectType::User,
            names,
            if_exists,
            ..
        } => Statement::Role(roles::drop_roles(&names, if_exists)?),
        stmt => Statement::Sql(Box::new(stmt)),
    })
}

/// `CONNECTION LIMIT -1` (no limit) as one number, which the parser reads only unsigned.
fn negative_limits(tokens: &mut [TokenWithSpan]) {
    let meaningful: Vec<usize> = (0..tokens.len())
        .filter(|&i| !matches!(tokens[i].token, Token::Whitespace(_)))
        .collect();
    for w in meaningful.windows(3) {
        let limit =
            matches!(&tokens[w[0]].token, Token::Word(k) if k.value.eq_ignore_ascii_case("limit"));
        if !limit || tokens[w[1]].token != Token::Minus {
            continue;
        }
        if let Token::Number(n, long) = &tokens[w[2]].token {
            tokens[w[2]].token = Token::Number(format!("-{n}"), *long);
            tokens[w[1]].token =
                Token::Whitespace(datafusion::sql::sqlparser::tokenizer::Whitespace::Space);
        }
    }
}

/// A statement of standard SQL: Flink's window syntax read as the function, and the windows
/// and interval literals rewritten as the planner needs them.
fn parse_sql(sql: &str, tokens: &[TokenWithSpan]) -> Result<ast::Statement> {
    let tokens = crate::sql::windows::rewrite_flink_tokens(tokens);
    let mut stmt = parse_one(sql, &tokens)?;
    normalize_interval_literals(&mut stmt);
    crate::sql::windows::rewrite_window_functions(&mut stmt)?;
    Ok(stmt)
}

/// Refuses what the planner would answer wrongly: `EXCEPT ALL` and `INTERSECT ALL`, which
/// DataFusion plans as plain anti and semi joins (dropping or keeping every copy of a row,
/// instead of as many copies as the other side has).
pub fn check_supported(stmt: &impl Visit) -> Result<()> {
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
    let mut statement = parse_with(sql, tokens, |p| p.parse_statement())?;
    balance_logic(&mut statement);
    check_expansion(&statement)?;
    Ok(statement)
}

/// Parses `tokens` (part of `sql`) with `f`, which must read them all, with the work budget
/// and recursion limit every statement gets.
pub(crate) fn parse_with<T>(
    sql: &str,
    tokens: &[TokenWithSpan],
    f: impl FnOnce(&mut Parser) -> std::result::Result<T, ParserError>,
) -> Result<T> {
    let dialect = WeirDialect::for_tokens(tokens.len());
    let mut tokens = tokens.to_vec();
    let end = tokens
        .last()
        .map(|t| t.span.end)
        .unwrap_or(Location { line: 1, column: 1 });
    tokens.push(TokenWithSpan::at(Token::EOF, end, end));
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(PARSER_RECURSION_MAX)
        .with_tokens_with_locations(tokens);
    let parsed = f(&mut parser).map_err(|e| match dialect.exhausted() {
        true => too_complex("statement is too complex to parse".into(), SPLIT_HINT),
        false => syntax_error(sql, e),
    })?;
    let next = parser.peek_token();
    if next.token != Token::EOF {
        return Err(near(sql, &next));
    }
    Ok(parsed)
}

pub(crate) fn near(sql: &str, token: &TokenWithSpan) -> Error {
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
            return too_complex(
                format!(
                    "statement is too complex: it nests more than {PARSER_RECURSION_MAX} \
                 parentheses, subqueries and unary operators deep"
                ),
                SPLIT_HINT,
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
/// Where each line of a text starts, in characters: turns a token's line and column into its
/// position without reading the text again.
struct Lines {
    starts: Vec<usize>,
    chars: usize,
}

impl Lines {
    fn new(sql: &str) -> Lines {
        let mut starts = vec![0];
        let mut chars = 0;
        for c in sql.chars() {
            chars += 1;
            if c == '\n' {
                starts.push(chars);
            }
        }
        Lines { starts, chars }
    }

    /// The 1-based character position of `loc`, as `char_position` computes it.
    fn position(&self, loc: Location) -> usize {
        let line = usize::try_from(loc.line).unwrap_or(usize::MAX);
        match line.checked_sub(1).and_then(|l| self.starts.get(l)) {
            Some(start) => start + usize::try_from(loc.column.max(1)).unwrap_or(0),
            None => (self.chars + 1).max(1),
        }
    }
}

/// Turns character positions into byte offsets, moving forward through the text (and back to
/// its start when asked for an earlier position).
struct ByteCursor<'a> {
    sql: &'a str,
    chars: usize,
    byte: usize,
}

impl<'a> ByteCursor<'a> {
    fn new(sql: &'a str) -> ByteCursor<'a> {
        ByteCursor {
            sql,
            chars: 0,
            byte: 0,
        }
    }

    /// The byte offset of the character at `position` (the text's length past its end).
    fn byte_at(&mut self, position: usize) -> usize {
        if position < self.chars {
            (self.chars, self.byte) = (0, 0);
        }
        for c in self.sql[self.byte..].chars() {
            if self.chars == position {
                break;
            }
            self.chars += 1;
            self.byte += c.len_utf8();
        }
        self.byte
    }
}

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
        ["SHOW", "CREATE", "MATERIALIZED", "VIEW", _]
        | ["SHOW", "CREATE", "SINK" | "TABLE" | "SOURCE", _] => {
            use crate::catalog::Kind;
            let name = match &tokens[words.len() - 1].token {
                Token::Word(word) if word.quote_style.is_some() => word.value.clone(),
                Token::Word(word) => word.value.to_lowercase(),
                _ => return None,
            };
            let kind = match words[2].as_str() {
                "SINK" => Kind::Sink,
                "TABLE" => Kind::Table,
                "SOURCE" => Kind::Source,
                _ => Kind::MaterializedView,
            };
            Some(Statement::ShowCreate(kind, name))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn each_statement_keeps_its_own_text_across_lines_and_multibyte_characters() {
        let sql = "SELECT 'é' ;\n  SELECT 'ü😀', 1;SELECT\n2;;  \n SELECT 'x'";
        let texts: Vec<String> = parse(sql).unwrap().into_iter().map(|p| p.text).collect();
        assert_eq!(
            texts,
            ["SELECT 'é'", "SELECT 'ü😀', 1", "SELECT\n2", "SELECT 'x'"]
        );
    }

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
        assert!(
            matches!(&p[0].statement, Statement::ShowCreate(crate::catalog::Kind::MaterializedView, n) if n == "My")
        );
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
        let Statement::CreateSource {
            table, watermark, ..
        } = &p[0].statement
        else {
            panic!("{:?}", p[0].statement)
        };
        assert_eq!(table.columns.len(), 2);
        let watermark = watermark.as_ref().unwrap();
        assert_eq!(watermark.column.value, "date_time");
        assert_eq!(
            watermark.expr.to_string(),
            "date_time - INTERVAL '4' SECOND"
        );
        let options = table.table_options.to_string();
        assert_eq!(options, "WITH (connector = 'nexmark', stream = 'bid')");
        assert!(matches!(
            &p[1].statement,
            Statement::CreateSource { table, watermark: None, format: None, .. } if table.columns.is_empty()
        ));
        let p = parse(
            "CREATE SOURCE c (a int) WITH (connector = 'kafka', topic = 'c', \
             Properties.bootstrap.server = 'b:9092') FORMAT PLAIN ENCODE JSON;",
        )
        .unwrap();
        let Statement::CreateSource { table, format, .. } = &p[0].statement else {
            panic!("{:?}", p[0].statement)
        };
        assert_eq!(table.columns.len(), 1);
        let format = format.as_ref().unwrap();
        assert_eq!(
            (format.format.as_str(), format.encode.as_str()),
            ("plain", "json")
        );
        let p = parse(
            "CREATE SINK s AS SELECT a, count(*) FROM t GROUP BY a WITH (connector = 'blackhole');
             create sink IF NOT EXISTS \"S2\" from v; \
             CREATE SINK w AS SELECT 1 FROM t EMIT ON WINDOW CLOSE WITH (connector = 'blackhole')",
        )
        .unwrap();
        let Statement::CreateSink(sink) = &p[0].statement else {
            panic!("{:?}", p[0].statement)
        };
        assert_eq!(sink.name.to_string(), "s");
        assert_eq!(
            sink.query.to_string(),
            "SELECT a, count(*) FROM t GROUP BY a"
        );
        assert_eq!(sink.options.len(), 1);
        assert!(!sink.emit_on_window_close);
        let Statement::CreateSink(sink) = &p[1].statement else {
            panic!("{:?}", p[1].statement)
        };
        assert!(sink.if_not_exists);
        assert_eq!(sink.name.to_string(), "\"S2\"");
        assert_eq!(sink.query.to_string(), "SELECT * FROM v");
        let Statement::CreateSink(sink) = &p[2].statement else {
            panic!("{:?}", p[2].statement)
        };
        assert!(sink.emit_on_window_close);
        assert_eq!(sink.query.to_string(), "SELECT 1 FROM t");
        assert!(parse("CREATE SINK s WITH (connector = 'blackhole')").is_err());
        // The query is the tree sqlparser read, never text printed and read again: an escaped
        // string keeps its value (a quote, a backslash, a tab).
        let p = parse(r"CREATE SINK e AS SELECT E'it\'s a\\b\t' AS x FROM t").unwrap();
        let Statement::CreateSink(sink) = &p[0].statement else {
            panic!("{:?}", p[0].statement)
        };
        let ast::SetExpr::Select(select) = sink.query.body.as_ref() else {
            panic!("{}", sink.query)
        };
        let ast::SelectItem::ExprWithAlias { expr, .. } = &select.projection[0] else {
            panic!("{}", sink.query)
        };
        assert!(
            matches!(expr, ast::Expr::Value(v)
                if v.value == ast::Value::EscapedStringLiteral("it's a\\b\t".into())),
            "{expr:?}"
        );
    }

    #[test]
    fn streaming_clauses_are_read_from_the_tokens_with_their_positions() {
        let p = parse(
            r#"CREATE MATERIALIZED VIEW v AS SELECT 'it''s' AS s, "we""ird" FROM t EMIT ON WINDOW CLOSE;
               CREATE MATERIALIZED VIEW w AS SELECT 1;
               CREATE TABLE t (ts timestamp, s text, WATERMARK FOR ts AS ts - INTERVAL '5 seconds')"#,
        )
        .unwrap();
        let Statement::CreateView(v) = &p[0].statement else {
            panic!("{:?}", p[0].statement)
        };
        assert!(v.emit_on_window_close);
        assert_eq!(
            v.view.query.to_string(),
            r#"SELECT 'it''s' AS s, "we""ird" FROM t"#
        );
        assert!(matches!(&p[1].statement, Statement::CreateView(w) if !w.emit_on_window_close));
        let Statement::CreateTable {
            table, watermark, ..
        } = &p[2].statement
        else {
            panic!("{:?}", p[2].statement)
        };
        assert_eq!(table.columns.len(), 2);
        assert_eq!(table.table_options, ast::CreateTableOptions::None);
        assert_eq!(
            watermark.as_ref().unwrap().expr.to_string(),
            "ts - INTERVAL '5 seconds'"
        );
        // An error in the watermark points into the statement as written.
        let sql = "CREATE TABLE t (ts timestamp, WATERMARK FOR ts AS ts - - )";
        let e = parse(sql).unwrap_err();
        assert_eq!(e.position, Some(sql.find(')').unwrap() + 1), "{e:?}");
    }

    #[test]
    fn drops_of_sources_and_sinks_are_read() {
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
}
