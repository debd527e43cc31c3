//! What keeps a hostile statement from taking the server down: limits on nesting, on the
//! depth of the trees made from a statement (read from its tokens, before any recursive pass
//! sees it), and on how far the planner would copy its expressions; and the balancing of long
//! chains of `AND` and `OR`.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, Visit, VisitMut, Visitor, VisitorMut};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use crate::error::{Error, Result};

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
pub(super) const PARSER_RECURSION_MAX: usize = 4 * NESTING_MAX + 64;

/// Expression nodes a statement may grow by when the planner copies operands.
pub const EXPANSION_MAX: u64 = 1_000_000;

/// Refuses a statement whose expressions the planner would copy into more than
/// `EXPANSION_MAX` more nodes than it has. DataFusion's simplifier writes `coalesce(a, b)`
/// (and `nvl`, `ifnull`, `nvl2`) as `CASE WHEN a IS NOT NULL THEN a ELSE b END`,
/// `e BETWEEN l AND h` as `e >= l AND e <= h` and `e IN (l1, l2, l3)` as an `OR` of
/// comparisons, each copying an operand: nested, they grow exponentially (30 nested
/// `coalesce` calls took all of a machine's memory). Counted bottom-up in one visit.
pub(super) fn check_expansion(statement: &ast::Statement) -> Result<()> {
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
pub(super) fn balance_logic(stmt: &mut ast::Statement) {
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
pub(super) const SPLIT_HINT: &str = "Split the statement into several, or nest less deeply.";
const CHAIN_HINT: &str =
    "Write long chains of OR as IN lists, or split the statement into several.";
const SUBQUERY_HINT: &str = "Write nested subqueries as joins or with WITH.";

pub(super) fn too_complex(message: String, hint: &str) -> Error {
    Error::new(crate::error::ErrorKind::StatementTooComplex, message).with_hint(hint)
}

/// Refuses a statement whose syntax tree could be deeper than `DEPTH_MAX`, nest deeper than
/// `NESTING_MAX` or nest subqueries in expressions deeper than `SUBQUERY_NESTING_MAX`, from
/// its tokens alone (before any recursive pass sees it).
pub(super) fn check_depth(tokens: &[TokenWithSpan]) -> Result<()> {
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

/// A group of tokens opened by `(`, `[`, `{` or `CASE` (or the whole statement), as
/// `Shape::of` walks it.
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
    const STATEMENT: Group = Group {
        base: 0,
        item: 0,
        logic: 0,
        case: false,
        from: false,
        table: false,
        subquery: false,
        empty: false,
    };

    /// The depth bound at this point of the group.
    fn level(&self) -> usize {
        // A balanced chain of n operators is about log2(n) + 1 levels deep.
        self.base + self.item + (usize::BITS - self.logic.leading_zeros()) as usize
    }

    /// The group a token opens inside this one, after `previous`.
    fn open(&self, previous: Option<&Token>, keyword: Option<Keyword>) -> Group {
        let table = match previous {
            Some(Token::Word(w)) => {
                matches!(w.keyword, Keyword::FROM | Keyword::JOIN | Keyword::LATERAL)
            }
            Some(Token::Comma) => self.from,
            Some(Token::LParen) => self.table,
            _ => false,
        };
        Group {
            base: self.level() + 1,
            item: 0,
            logic: 0,
            case: keyword.is_some(),
            from: false,
            table,
            subquery: false,
            empty: keyword.is_none(),
        }
    }

    /// Counts a token that neither opens nor closes a group.
    fn step(&mut self, token: &Token, keyword: Option<Keyword>) {
        use Keyword as K;
        match (token, keyword) {
            (Token::Comma, _) if !self.from => (self.item, self.logic) = (0, 0),
            (Token::Comma, _) => self.item += 1,
            (_, Some(K::WHEN | K::THEN | K::ELSE)) if self.case => (self.item, self.logic) = (0, 0),
            (_, Some(K::AND | K::OR)) => self.logic += 1,
            (_, Some(K::NoKeyword)) | (Token::Period, _) => {}
            (_, Some(k)) => {
                self.item += 1;
                match k {
                    K::FROM => self.from = true,
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
                    | K::VALUES => self.from = false,
                    _ => {}
                }
            }
            (token, None) if is_literal(token) => {}
            (_, None) => self.item += 1,
        }
    }
}

/// Whether `token` is a prefix operator (`-`, `+`, `~`, `NOT`): one where an operand is
/// expected, after an operator, a keyword, an opening or a comma, or first.
fn is_prefix(previous: Option<&Token>, token: &Token, keyword: Option<Keyword>) -> bool {
    let operand_expected = match previous {
        None => true,
        Some(Token::Word(w)) => {
            w.keyword != Keyword::NoKeyword
                && !matches!(w.keyword, Keyword::NULL | Keyword::TRUE | Keyword::FALSE)
        }
        Some(p) => !is_literal(p) && !matches!(p, Token::RParen | Token::RBracket | Token::RBrace),
    };
    operand_expected
        && (matches!(token, Token::Minus | Token::Plus | Token::Tilde)
            || keyword == Some(Keyword::NOT))
}

impl Shape {
    fn of(tokens: &[TokenWithSpan]) -> Shape {
        let mut groups = vec![Group::STATEMENT];
        let mut shape = Shape::default();
        let (mut subqueries, mut prefix_run) = (0usize, 0usize);
        let mut previous: Option<&Token> = None;
        for t in tokens {
            let keyword = match &t.token {
                Token::Word(w) => Some(w.keyword),
                _ => None,
            };
            let top = groups.len() - 1;
            prefix_run = if is_prefix(previous, &t.token, keyword) {
                prefix_run + 1
            } else {
                0
            };
            if groups[top].empty {
                groups[top].empty = false;
                let query = matches!(
                    keyword,
                    Some(Keyword::SELECT | Keyword::WITH | Keyword::VALUES)
                );
                if query && !groups[top].table {
                    groups[top].subquery = true;
                    subqueries += 1;
                    shape.subqueries = shape.subqueries.max(subqueries);
                }
            }
            let open = matches!(t.token, Token::LParen | Token::LBracket | Token::LBrace)
                || keyword == Some(Keyword::CASE);
            let close = matches!(t.token, Token::RParen | Token::RBracket | Token::RBrace)
                || (keyword == Some(Keyword::END) && groups[top].case);
            if open {
                let inner = groups[top].open(previous, keyword);
                groups.push(inner);
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
                groups[top].step(&t.token, keyword);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::sql::dialect::WeirDialect;
    use crate::sql::parser::{parse, Statement};
    use datafusion::sql::sqlparser::tokenizer::Tokenizer;

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
    fn deep_nesting_is_refused_not_overflowed() {
        let sql = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
        assert!(parse(&sql).is_err());
    }
}
