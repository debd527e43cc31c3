//! Splits a query string into statements and parses each into a typed syntax tree: standard
//! SQL through DataFusion's sqlparser (PostgreSQL dialect), with Weir's clauses and `CREATE
//! SINK` read from the same tokens (`extensions`), and Weir's own commands (FLUSH,
//! CHECKPOINT, SHOW CHECKPOINTS, SHOW MATERIALIZED VIEWS, SHOW CREATE MATERIALIZED VIEW, DROP
//! SOURCE/SINK) by their leading keywords. Nothing is printed back to text and parsed again.
//!
//! The whole string is parsed before anything runs, as in PostgreSQL: a syntax error in the
//! third statement means the first two do not run either.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, Visit, VisitMut, Visitor, VisitorMut};
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use crate::error::{Error, Result};
use crate::sql::dialect::WeirDialect;
use crate::sql::extensions::{self, CreateSink, CreateView, Watermark};

/// Parentheses, brackets, `CASE` expressions and prefix operators (and so subqueries and
/// function calls) nest no deeper than this; deeper statements are refused (54001) rather
/// than risking the stack.
pub const NESTING_MAX: usize = 1_000;

/// A statement's syntax tree is no deeper than this, as `Shape::depth` counts it: a chain of
/// operators (`1 + 1 + ...`, `UNION`s, joins) is one level per operator or keyword, and each
/// parenthesis, bracket or `CASE` one more (chains of `AND` and `OR` are balanced, and count
/// for nothing). Every thread that parses, plans and runs statements has a stack sized for
/// trees this deep (`crate::STACK_BYTES`); deeper statements are refused (54001).
pub const DEPTH_MAX: usize = 16_384;

/// Subqueries in expressions (`EXISTS`, `IN`, scalar) nest no deeper than this: DataFusion
/// checks a plan's subqueries in time exponential in their nesting (20 levels took 5 s, 25
/// more than a minute).
pub const SUBQUERY_NESTING_MAX: usize = 16;

/// sqlparser counts a level per parenthesis and per unary operator, and several for a
/// subquery: room for `NESTING_MAX` nested subqueries.
const PARSER_RECURSION_MAX: usize = 4 * NESTING_MAX + 64;

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
    /// `CREATE TABLE`, with its watermark.
    CreateTable {
        table: Box<ast::CreateTable>,
        watermark: Option<Box<Watermark>>,
    },
    /// `CREATE SOURCE`, read as the `CREATE TABLE` it resembles.
    CreateSource {
        table: Box<ast::CreateTable>,
        watermark: Option<Box<Watermark>>,
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
        let statement = match weir_statement(&meaningful) {
            Some(s) => s,
            None => statement(sql, group)?,
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
    if lead.starts_with(&["CREATE", "SINK"]) {
        let sink = extensions::create_sink(sql, group, |tokens| match parse_sql(sql, tokens)? {
            ast::Statement::Query(q) => Ok(*q),
            _ => Err(Error::syntax("a sink is defined by a query")),
        })?;
        return Ok(Statement::CreateSink(Box::new(sink)));
    }
    let mut tokens = group.to_vec();
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
    let emit_on_window_close = lead == ["CREATE", "MATERIALIZED", "VIEW"]
        && extensions::take_emit_on_window_close(&mut tokens);
    Ok(match parse_sql(sql, &tokens)? {
        ast::Statement::CreateTable(ct) if source => Statement::CreateSource {
            table: Box::new(ct),
            watermark,
        },
        ast::Statement::CreateTable(ct) => Statement::CreateTable {
            table: Box::new(ct),
            watermark,
        },
        ast::Statement::CreateView(cv) => Statement::CreateView(Box::new(CreateView {
            view: Box::new(cv),
            emit_on_window_close,
        })),
        stmt => Statement::Sql(Box::new(stmt)),
    })
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

/// Expression nodes a statement may grow by when the planner copies operands.
pub const EXPANSION_MAX: u64 = 1_000_000;

/// Refuses a statement whose expressions the planner would copy into more than
/// `EXPANSION_MAX` more nodes than it has. DataFusion's simplifier writes `coalesce(a, b)`
/// (and `nvl`, `ifnull`, `nvl2`) as `CASE WHEN a IS NOT NULL THEN a ELSE b END`,
/// `e BETWEEN l AND h` as `e >= l AND e <= h` and `e IN (l1, l2, l3)` as an `OR` of
/// comparisons, each copying an operand: nested, they grow exponentially (30 nested
/// `coalesce` calls took all of a machine's memory). Counted bottom-up in one visit.
fn check_expansion(statement: &ast::Statement) -> Result<()> {
    /// Per expression being visited: the expanded sizes of its sub-expressions so far.
    struct Sizes {
        frames: Vec<Vec<u64>>,
        plain: u64,
    }
    impl Visitor for Sizes {
        type Break = ();
        fn pre_visit_expr(&mut self, _: &ast::Expr) -> ControlFlow<()> {
            self.frames.push(Vec::new());
            self.plain += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_expr(&mut self, expr: &ast::Expr) -> ControlFlow<()> {
            let children = self.frames.pop().unwrap_or_default();
            let sum = children.iter().fold(1u64, |a, c| a.saturating_add(*c));
            let first = children.first().copied().unwrap_or(0);
            let size = match expr {
                ast::Expr::Function(f) if copies_arguments(&f.name) => sum.saturating_mul(2),
                ast::Expr::Between { .. } => sum.saturating_add(first),
                ast::Expr::InList { list, .. } if list.len() <= 3 => {
                    sum.saturating_add(first.saturating_mul(list.len().saturating_sub(1) as u64))
                }
                _ => sum,
            };
            if let Some(parent) = self.frames.last_mut() {
                parent.push(size);
            }
            ControlFlow::Continue(())
        }
    }
    fn copies_arguments(name: &ast::ObjectName) -> bool {
        let name = name.to_string().to_ascii_lowercase();
        let name = name.rsplit('.').next().unwrap_or_default();
        matches!(name, "coalesce" | "nvl" | "ifnull" | "nvl2")
    }
    let mut sizes = Sizes {
        frames: vec![Vec::new()],
        plain: 0,
    };
    let _ = Visit::visit(statement, &mut sizes);
    let expanded = sizes.frames[0]
        .iter()
        .fold(0u64, |a, c| a.saturating_add(*c));
    if expanded.saturating_sub(sizes.plain) > EXPANSION_MAX {
        return Err(too_complex(
            format!(
                "statement is too complex: planning it would copy its expressions into more \
                 than {EXPANSION_MAX} nodes (nested coalesce, BETWEEN or short IN lists)"
            ),
            "Nest coalesce, BETWEEN and IN less deeply, or compute the inner values in a \
             subquery.",
        ));
    }
    Ok(())
}

/// Operands a chain of `AND` or `OR` has before it is balanced.
const BALANCED_CHAIN_MIN: usize = 8;

/// Regroups each long chain of `AND`s or of `OR`s (`x = 1 OR x = 2 OR ...`, as ORMs write
/// them) into a balanced tree of the same operands in the same order: a chain of 10 000
/// becomes 14 levels deep instead of 10 000, and DataFusion plans it in time near linear
/// instead of quadratic. Exact: both operators are associative in SQL's three-valued logic,
/// and SQL promises no order of evaluation.
fn balance_logic(stmt: &mut ast::Statement) {
    struct Balance;
    impl VisitorMut for Balance {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
            let ast::Expr::BinaryOp { op, .. } = expr else {
                return ControlFlow::Continue(());
            };
            if !matches!(op, ast::BinaryOperator::And | ast::BinaryOperator::Or) {
                return ControlFlow::Continue(());
            }
            let op = op.clone();
            // The chain's operands, left to right, without recursion.
            let mut operands = Vec::new();
            let mut stack = vec![std::mem::replace(expr, ast::Expr::value(ast::Value::Null))];
            while let Some(e) = stack.pop() {
                match e {
                    ast::Expr::BinaryOp { left, op: o, right } if o == op => {
                        stack.push(*right);
                        stack.push(*left);
                    }
                    other => operands.push(other),
                }
            }
            if operands.len() < BALANCED_CHAIN_MIN {
                // Short: left-deep again, as parsed.
                let mut operands = operands.into_iter();
                let first = operands
                    .next()
                    .unwrap_or(ast::Expr::value(ast::Value::Null));
                *expr = operands.fold(first, |left, right| ast::Expr::BinaryOp {
                    left: Box::new(left),
                    op: op.clone(),
                    right: Box::new(right),
                });
                return ControlFlow::Continue(());
            }
            while operands.len() > 1 {
                let mut pairs = Vec::with_capacity(operands.len().div_ceil(2));
                let mut rest = operands.into_iter();
                while let Some(left) = rest.next() {
                    pairs.push(match rest.next() {
                        Some(right) => ast::Expr::BinaryOp {
                            left: Box::new(left),
                            op: op.clone(),
                            right: Box::new(right),
                        },
                        None => left,
                    });
                }
                operands = pairs;
            }
            if let Some(balanced) = operands.pop() {
                *expr = balanced;
            }
            ControlFlow::Continue(())
        }
    }
    let _ = VisitMut::visit(stmt, &mut Balance);
}

/// Hints for a statement refused as too complex, by what made it so.
const SPLIT_HINT: &str = "Split the statement into several, or nest less deeply.";
const CHAIN_HINT: &str =
    "Write long chains of OR as IN lists, or split the statement into several.";
const SUBQUERY_HINT: &str = "Write nested subqueries as joins or with WITH.";

fn too_complex(message: String, hint: &str) -> Error {
    Error::new(crate::error::ErrorKind::StatementTooComplex, message).with_hint(hint)
}

/// Refuses a statement whose syntax tree could be deeper than `DEPTH_MAX`, nest deeper than
/// `NESTING_MAX` or nest subqueries in expressions deeper than `SUBQUERY_NESTING_MAX`, from
/// its tokens alone (before any recursive pass sees it).
fn check_depth(tokens: &[TokenWithSpan]) -> Result<()> {
    let shape = Shape::of(tokens);
    if shape.nesting > NESTING_MAX {
        return Err(too_complex(
            format!(
                "statement is too complex: it nests parentheses, brackets, CASE and prefix \
             operators more than {NESTING_MAX} levels deep"
            ),
            SPLIT_HINT,
        ));
    }
    if shape.subqueries > SUBQUERY_NESTING_MAX {
        return Err(too_complex(
            format!(
                "statement is too complex: it nests subqueries in expressions more than \
             {SUBQUERY_NESTING_MAX} levels deep"
            ),
            SUBQUERY_HINT,
        ));
    }
    if shape.depth > DEPTH_MAX {
        return Err(too_complex(
            format!(
                "statement is too complex: its expressions are more than {DEPTH_MAX} levels deep"
            ),
            CHAIN_HINT,
        ));
    }
    Ok(())
}

/// What a statement's tokens say about the trees made from it, in one pass without recursion.
#[derive(Debug, Default, PartialEq, Eq)]
struct Shape {
    /// An upper bound on the depth of the syntax tree and of the plans made from it.
    ///
    /// Parsers build deep trees only from chains: each operator of `a + b + c` (and each
    /// `IS`, `::`, `UNION`, `JOIN`, ...) is a level above the one before. Items of a list
    /// (separated by commas, or by `WHEN`/`THEN`/`ELSE` in a `CASE`) are siblings, so each
    /// starts from its list's level; a comma in a `FROM` list is a join, so it counts as a
    /// level. Every keyword and operator counts, except `AND` and `OR`, whose chains are
    /// balanced right after parsing (`balance_logic`) and so add the logarithm of their
    /// length; literals, names, commas and periods do not. A group opened by `(`, `[`, `{` or `CASE` starts one level below where it opens.
    depth: usize,
    /// The deepest nesting of groups and of prefix operators (`- - x`, `NOT NOT x`).
    nesting: usize,
    /// The deepest nesting of subqueries in expressions (`EXISTS (SELECT ...)`, `IN (SELECT
    /// ...)`, scalar subqueries); subqueries in `FROM` do not count.
    subqueries: usize,
}

impl Shape {
    fn of(tokens: &[TokenWithSpan]) -> Shape {
        use datafusion::sql::sqlparser::keywords::Keyword as K;
        #[derive(Clone, Copy)]
        struct Group {
            /// The depth bound where the group opened.
            base: usize,
            /// Levels counted since the group's current item began.
            item: usize,
            /// `AND`s and `OR`s since the item began: balanced, they add their logarithm.
            logic: usize,
            case: bool,
            /// Commas are joins (a `FROM` list).
            from: bool,
            /// The group stands where a table does (`FROM (...)`, `JOIN (...)`).
            table: bool,
            /// The group holds a query that is an expression's subquery.
            subquery: bool,
            /// The group has had no token yet.
            empty: bool,
        }
        impl Group {
            /// The depth bound at this point of the group.
            fn level(&self) -> usize {
                // A balanced chain of n operators is about log2(n) + 1 levels deep.
                self.base + self.item + (usize::BITS - self.logic.leading_zeros()) as usize
            }
        }
        let root = Group {
            base: 0,
            item: 0,
            logic: 0,
            case: false,
            from: false,
            table: false,
            subquery: false,
            empty: false,
        };
        let mut groups = vec![root];
        let mut shape = Shape::default();
        let (mut subqueries, mut prefix_run) = (0usize, 0usize);
        let mut previous: Option<&Token> = None;
        for t in tokens {
            let keyword = match &t.token {
                Token::Word(w) => Some(w.keyword),
                _ => None,
            };
            let top = groups.len() - 1;
            // Whatever comes after an operator, a keyword, an opening or a comma, or first.
            let operand_expected = match previous {
                None => true,
                Some(Token::Word(w)) => {
                    w.keyword != K::NoKeyword && !matches!(w.keyword, K::NULL | K::TRUE | K::FALSE)
                }
                Some(p) => {
                    !is_literal(p) && !matches!(p, Token::RParen | Token::RBracket | Token::RBrace)
                }
            };
            let prefix = operand_expected
                && (matches!(t.token, Token::Minus | Token::Plus | Token::Tilde)
                    || keyword == Some(K::NOT));
            prefix_run = if prefix { prefix_run + 1 } else { 0 };
            if groups[top].empty {
                groups[top].empty = false;
                if matches!(keyword, Some(K::SELECT | K::WITH | K::VALUES)) && !groups[top].table {
                    groups[top].subquery = true;
                    subqueries += 1;
                    shape.subqueries = shape.subqueries.max(subqueries);
                }
            }
            let open = matches!(t.token, Token::LParen | Token::LBracket | Token::LBrace)
                || keyword == Some(K::CASE);
            let close = matches!(t.token, Token::RParen | Token::RBracket | Token::RBrace)
                || (keyword == Some(K::END) && groups[top].case);
            if open {
                let g = groups[top];
                let table = match previous {
                    Some(Token::Word(w)) => matches!(w.keyword, K::FROM | K::JOIN | K::LATERAL),
                    Some(Token::Comma) => g.from,
                    Some(Token::LParen) => g.table,
                    _ => false,
                };
                groups.push(Group {
                    base: g.level() + 1,
                    item: 0,
                    logic: 0,
                    case: keyword.is_some(),
                    from: false,
                    table,
                    subquery: false,
                    empty: keyword.is_none(),
                });
            } else if close {
                if groups.len() > 1 {
                    if groups[top].subquery {
                        subqueries -= 1;
                    }
                    groups.pop();
                }
                let top = groups.len() - 1;
                groups[top].item += 1;
            } else {
                let g = &mut groups[top];
                match (&t.token, keyword) {
                    (Token::Comma, _) if !g.from => (g.item, g.logic) = (0, 0),
                    (Token::Comma, _) => g.item += 1,
                    (_, Some(K::WHEN | K::THEN | K::ELSE)) if g.case => (g.item, g.logic) = (0, 0),
                    (_, Some(K::AND | K::OR)) => g.logic += 1,
                    (_, Some(K::NoKeyword)) | (Token::Period, _) => {}
                    (_, Some(k)) => {
                        g.item += 1;
                        match k {
                            K::FROM => g.from = true,
                            K::WHERE
                            | K::GROUP
                            | K::HAVING
                            | K::ORDER
                            | K::LIMIT
                            | K::OFFSET
                            | K::WINDOW
                            | K::UNION
                            | K::EXCEPT
                            | K::INTERSECT
                            | K::RETURNING
                            | K::SELECT
                            | K::VALUES => g.from = false,
                            _ => {}
                        }
                    }
                    (token, None) if is_literal(token) => {}
                    (_, None) => g.item += 1,
                }
            }
            shape.depth = shape.depth.max(groups[groups.len() - 1].level());
            shape.nesting = shape.nesting.max(groups.len() - 1 + prefix_run);
            previous = Some(&t.token);
        }
        shape
    }
}

/// Whether a token is a literal value: a leaf of any tree.
fn is_literal(token: &Token) -> bool {
    matches!(
        token,
        Token::Number(..)
            | Token::Char(_)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::TripleSingleQuotedByteStringLiteral(_)
            | Token::TripleDoubleQuotedByteStringLiteral(_)
            | Token::SingleQuotedRawStringLiteral(_)
            | Token::DoubleQuotedRawStringLiteral(_)
            | Token::TripleSingleQuotedRawStringLiteral(_)
            | Token::TripleDoubleQuotedRawStringLiteral(_)
            | Token::NationalStringLiteral(_)
            | Token::QuoteDelimitedStringLiteral(_)
            | Token::NationalQuoteDelimitedStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_)
            | Token::Placeholder(_)
    )
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

    fn bound(sql: &str) -> (usize, usize) {
        let tokens = Tokenizer::new(&WeirDialect::for_tokenizing(), sql)
            .tokenize_with_location()
            .unwrap();
        let meaningful: Vec<TokenWithSpan> = tokens
            .into_iter()
            .filter(|t| !matches!(t.token, Token::Whitespace(_)))
            .collect();
        let shape = Shape::of(&meaningful);
        (shape.depth, shape.nesting)
    }

    /// The depth of the deepest expression or query in a parsed statement, counted by a
    /// (recursive) visitor: for small statements only.
    fn real_depth(stmt: &ast::Statement) -> usize {
        struct Depth {
            now: usize,
            max: usize,
        }
        impl Visitor for Depth {
            type Break = ();
            fn pre_visit_expr(&mut self, _: &ast::Expr) -> ControlFlow<()> {
                self.now += 1;
                self.max = self.max.max(self.now);
                ControlFlow::Continue(())
            }
            fn post_visit_expr(&mut self, _: &ast::Expr) -> ControlFlow<()> {
                self.now -= 1;
                ControlFlow::Continue(())
            }
            fn pre_visit_query(&mut self, _: &ast::Query) -> ControlFlow<()> {
                self.now += 1;
                self.max = self.max.max(self.now);
                ControlFlow::Continue(())
            }
            fn post_visit_query(&mut self, _: &ast::Query) -> ControlFlow<()> {
                self.now -= 1;
                ControlFlow::Continue(())
            }
        }
        let mut d = Depth { now: 0, max: 0 };
        let _ = stmt.visit(&mut d);
        d.max
    }

    fn chain(item: impl Fn(usize) -> String, sep: &str, n: usize) -> String {
        (0..n).map(item).collect::<Vec<_>>().join(sep)
    }

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
    fn the_depth_bound_is_never_below_the_trees_depth() {
        let statements = [
            format!("SELECT {}", chain(|_| "1".into(), " + ", 200)),
            format!(
                "SELECT * FROM t WHERE {}",
                chain(|i| format!("x = {i}"), " OR ", 200)
            ),
            format!("SELECT {}1{}", "(".repeat(100), ")".repeat(100)),
            format!("SELECT {}true", "NOT ".repeat(100)),
            format!("SELECT {}1", "- ".repeat(100)),
            format!("SELECT 1{}", "::int".repeat(100)),
            format!("SELECT 'a' {}", "|| 'b' ".repeat(100)),
            chain(|i| format!("SELECT {i}"), " UNION ALL ", 100),
            format!(
                "SELECT * FROM {}(SELECT 1 AS a) s{}",
                "(SELECT * FROM ".repeat(50),
                ") s".repeat(50)
            ),
            format!("SELECT f({}1{})", "g(".repeat(50), ")".repeat(50)),
            format!(
                "SELECT CASE WHEN a THEN {} ELSE 0 END",
                chain(|_| "1".into(), " + ", 100)
            ),
            format!(
                "SELECT CASE {} END",
                chain(
                    |i| format!("WHEN x = {i} THEN CASE WHEN y THEN {i} END"),
                    " ",
                    100
                )
            ),
            format!(
                "SELECT x IN ({}) AND {}",
                chain(|i| i.to_string(), ", ", 100),
                chain(|_| "y".into(), " AND ", 100)
            ),
            format!(
                "SELECT a FROM t WHERE a + 1 + 1 > 2 AND EXISTS (SELECT 1 FROM u WHERE {})",
                chain(|_| "b".into(), " - ", 100)
            ),
            "SELECT a[1][2][3][4], (x).y.z FROM t".to_string(),
            "SELECT sum(a) OVER (PARTITION BY b ORDER BY c + d) FROM t".to_string(),
        ];
        for sql in &statements {
            let parsed = parse(sql).unwrap();
            let Statement::Sql(stmt) = &parsed[0].statement else {
                panic!("{sql}")
            };
            let (depth, _) = bound(sql);
            let real = real_depth(stmt);
            assert!(real <= depth + 2, "{sql}: depth {real}, bound {depth}");
        }
    }

    #[test]
    fn lists_and_case_branches_do_not_add_up() {
        // An IN list, a CASE of many branches and a VALUES list are flat.
        let (depth, nesting) = bound(&format!(
            "SELECT x IN ({})",
            chain(|i| i.to_string(), ", ", 10_000)
        ));
        assert!(depth < 10, "{depth}");
        assert_eq!(nesting, 1);
        let (depth, _) = bound(&format!(
            "SELECT CASE {} END FROM t",
            chain(|i| format!("WHEN x = {i} THEN -{i}"), " ", 1_000)
        ));
        assert!(depth < 10, "{depth}");
        let (depth, _) = bound(&format!(
            "INSERT INTO t VALUES {}",
            chain(|i| format!("(-{i}, 'a' || 'b', NULL)"), ", ", 10_000)
        ));
        assert!(depth < 10, "{depth}");
        // Commas of a FROM list join, and count; those of the select list after it do not.
        let (depth, _) = bound(&format!(
            "SELECT a, b FROM {} WHERE c = 1 ORDER BY {}",
            chain(|i| format!("t{i}"), ", ", 100),
            chain(|i| format!("c{i}"), ", ", 1_000),
        ));
        assert!((100..120).contains(&depth), "{depth}");
    }

    #[test]
    fn long_chains_parse_and_deep_nesting_is_refused() {
        with_stack(long_chains_and_deep_nesting);
    }

    fn long_chains_and_deep_nesting() {
        // The shapes generated SQL takes: 10 000 terms, 10 000 ORs, 1 000 nested groups.
        for sql in [
            format!("SELECT {}", chain(|_| "1".into(), " + ", 10_000)),
            format!(
                "SELECT * FROM t WHERE {}",
                chain(|i| format!("x = {i}"), " OR ", 10_000)
            ),
            format!(
                "SELECT {}1{}",
                "(".repeat(NESTING_MAX),
                ")".repeat(NESTING_MAX)
            ),
            format!(
                "SELECT * FROM {}(SELECT 1 AS a) s{}",
                "(SELECT * FROM ".repeat(NESTING_MAX - 1),
                ") s".repeat(NESTING_MAX - 1)
            ),
        ] {
            let depth = bound(&sql).0;
            assert!(depth <= DEPTH_MAX, "{depth}");
            parse(&sql).unwrap();
        }
        let too_deep = [
            format!(
                "SELECT {}1{}",
                "(".repeat(NESTING_MAX + 1),
                ")".repeat(NESTING_MAX + 1)
            ),
            format!("SELECT {}", chain(|_| "1".into(), " + ", DEPTH_MAX + 1)),
            format!("SELECT {}1", "- ".repeat(PARSER_RECURSION_MAX + 1)),
            // Unbalanced: still refused, before any parser sees it.
            format!("SELECT {}", "(".repeat(100_000)),
        ];
        for sql in &too_deep {
            let e = parse(sql).unwrap_err();
            assert_eq!(e.kind, ErrorKind::StatementTooComplex, "{}", e.message);
            assert!(
                e.message.starts_with("statement is too complex"),
                "{}",
                e.message
            );
        }
    }

    /// Runs `f` on a thread with the stack statements are sized for.
    fn with_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(crate::STACK_BYTES)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn prefix_operators_and_expression_subqueries_nest_within_their_limits() {
        with_stack(|| {
            let minus = |n: usize| format!("SELECT {}x FROM t", "- ".repeat(n));
            parse(&minus(NESTING_MAX)).unwrap();
            let e = parse(&minus(NESTING_MAX + 1)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::StatementTooComplex);
            assert!(e.message.contains("prefix operators"), "{}", e.message);
            // `x - -1` is one binary and one prefix minus.
            assert_eq!(bound("SELECT x - -1, NOT a AND NOT NOT b").1, 2);

            let exists =
                |n: usize| format!("SELECT {}1{}", "EXISTS (SELECT ".repeat(n), ")".repeat(n));
            parse(&exists(SUBQUERY_NESTING_MAX)).unwrap();
            let e = parse(&exists(SUBQUERY_NESTING_MAX + 1)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::StatementTooComplex);
            assert!(e.message.contains("subqueries"), "{}", e.message);
            let scalar = |n: usize| format!("SELECT {}1{}", "(SELECT ".repeat(n), ")".repeat(n));
            assert!(parse(&scalar(SUBQUERY_NESTING_MAX + 1)).is_err());
            // Subqueries in FROM, and queries beside each other, do not count.
            let from = format!(
                "SELECT * FROM {}t{} JOIN (SELECT 1) u ON true",
                "(SELECT * FROM ".repeat(100),
                ") s".repeat(100)
            );
            parse(&from).unwrap();
            let beside = (0..100)
                .map(|i| format!("(SELECT {i})"))
                .collect::<Vec<_>>()
                .join(" + ");
            parse(&format!("SELECT {beside}")).unwrap();
        });
    }

    #[test]
    fn long_chains_of_and_and_or_are_balanced_in_order() {
        let sql = format!(
            "SELECT * FROM t WHERE {} AND y",
            chain(|i| format!("x = {i}"), " OR ", 1000)
        );
        let parsed = parse(&sql).unwrap();
        let Statement::Sql(stmt) = &parsed[0].statement else {
            panic!()
        };
        assert!(real_depth(stmt) < 20, "{}", real_depth(stmt));
        // The same operands, in the same order: printed, it reads as the statement did.
        assert_eq!(stmt.to_string(), sql);
        // A short chain stays as parsed.
        let short = "SELECT * FROM t WHERE a OR b OR c";
        let Statement::Sql(stmt) = &parse(short).unwrap()[0].statement else {
            panic!()
        };
        let left_deep = format!("{stmt:?}");
        assert!(
            left_deep.contains("BinaryOp { left: BinaryOp"),
            "{left_deep}"
        );
    }

    #[test]
    fn nested_shapes_parse_in_time_linear_in_their_depth() {
        // Each of these took sqlparser time exponential in `n` in some dialect or version;
        // at n = NESTING_MAX / 4 any of them would run for longer than the universe.
        with_stack(|| {
            let n = NESTING_MAX / 4;
            let nest = |open: &str, inner: &str, close: &str| {
                format!("{}{inner}{}", open.repeat(n), close.repeat(n))
            };
            for sql in [
                format!("SELECT {}", nest("abs(", "x", ")")),
                format!("SELECT {}", nest("coalesce(1, ", "x", ")")),
                format!("SELECT {}", nest("f(a => ", "x", ")")),
                format!("SELECT {}", nest("CAST(CASE (", "1", ") END AS int)")),
                format!("SELECT {}", nest("(", "1", ")")),
                format!("SELECT {}", nest("ARRAY[", "1", "]")),
                format!("SELECT {}", nest("(1, ", "1", ")")),
                format!("SELECT 1 FROM {}", nest("(", "t", ")")),
                format!("SELECT * FROM {}", nest("(SELECT * FROM ", "t", ") s")),
                format!("SELECT {}", nest("EXISTS (SELECT ", "1", ")")),
                format!("SELECT {}", nest("x IN (SELECT ", "1", ")")),
                format!("SELECT {}", nest("CASE WHEN x THEN ", "1", " END")),
                format!("SELECT {}", nest("- (", "1", ")")),
                format!("SELECT {}", nest("NOT (", "true", ")")),
                format!("SELECT {}", nest("sum(", "x", ") OVER ()")),
            ] {
                if let Err(e) = parse(&sql) {
                    // Refused is fine (not every shape is valid SQL); quickly is the point.
                    assert!(
                        matches!(e.kind, ErrorKind::Syntax | ErrorKind::StatementTooComplex),
                        "{}: {}",
                        sql.chars().take(60).collect::<String>(),
                        e.message
                    );
                }
            }
        });
    }

    #[test]
    fn operands_the_planner_would_copy_exponentially_are_refused() {
        let nest = |n: usize, open: &str, inner: &str, close: &str| {
            format!("SELECT {}{inner}{} FROM t", open.repeat(n), close.repeat(n))
        };
        let too_complex = |sql: &str| match parse(sql) {
            Err(e) => e.kind == ErrorKind::StatementTooComplex,
            Ok(_) => false,
        };
        for (open, close) in [
            ("coalesce(", ", 0)"),
            ("nvl(", ", 0)"),
            ("pg_catalog.COALESCE(", ", 0)"),
            ("nvl2(", ", 1, 0)"),
            ("(", " BETWEEN 1 AND 2)::int"),
            ("(", " IN (1, 2, 3))::int"),
        ] {
            // 3^8 copies at most: planned in moments.
            assert!(!too_complex(&nest(8, open, "x", close)), "{open}{close}");
            // 2^30 or more: refused before DataFusion sees it.
            assert!(too_complex(&nest(30, open, "x", close)), "{open}{close}");
        }
        // Long IN lists become no OR chain; nothing is copied.
        let long_in =
            |n: usize| format!("({} IN ({}))::int", "x", chain(|i| i.to_string(), ", ", n));
        let nested = format!(
            "SELECT {} FROM t",
            (0..30).fold("x".to_string(), |e, _| long_in(4).replace("x", &e))
        );
        assert!(!too_complex(&nested));
        // A large statement that copies nothing is not refused, however large.
        let values = format!(
            "INSERT INTO t VALUES {}",
            chain(|i| format!("({i}, {i})"), ", ", 400_000)
        );
        assert!(!too_complex(&values));
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
        let Statement::CreateSource { table, watermark } = &p[0].statement else {
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
            Statement::CreateSource { table, watermark: None } if table.columns.is_empty()
        ));
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
        let Statement::CreateTable { table, watermark } = &p[2].statement else {
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

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let sql = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
        assert!(parse(&sql).is_err());
    }
}
