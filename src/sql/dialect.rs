//! The SQL dialect Weir parses: PostgreSQL's, as sqlparser knows it, with a bound on the
//! parser's work.

use std::any::TypeId;
use std::cell::Cell;

use datafusion::sql::sqlparser::ast::{Expr, GranteesType};
use datafusion::sql::sqlparser::dialect::{Dialect, PostgreSqlDialect, Precedence};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};

/// PostgreSQL's dialect with a budget for the parser's work, and without expression-named
/// function arguments.
///
/// sqlparser backtracks: where a construct may start in two ways it tries one, and on failure
/// goes back and tries the other. Nested, such retries multiply, and some shapes take time
/// exponential in their depth (`CAST(CASE (...` 12 levels deep took 48 s, even though the
/// statement is invalid). Every expression the parser starts and every operator it looks for
/// spends one unit of a budget proportional to the statement's length; a statement that
/// exhausts it is refused (54001) instead of being parsed for ever. Linear parses of real
/// statements spend a small multiple of their length.
///
/// Expression-named function arguments (`json_object('a': 1)`, which PostgreSQL 15 lacks) are
/// off: sqlparser tries to read every function argument as such a name first and reads it
/// again when that fails, which doubles the work at every level of nested calls. Named
/// arguments (`f(a => 1)`) still parse. Everything else is `PostgreSqlDialect`'s: each method
/// it defines is passed on, and sqlparser's checks for PostgreSQL see it as that dialect.
#[derive(Debug)]
pub struct WeirDialect {
    pg: PostgreSqlDialect,
    /// Units of work left.
    budget: Cell<usize>,
}

/// Units of parser work a statement may spend per token, and at least.
const WORK_PER_TOKEN: usize = 64;
const WORK_MIN: usize = 4096;

impl WeirDialect {
    /// The dialect for parsing a statement of `tokens` tokens.
    pub fn for_tokens(tokens: usize) -> WeirDialect {
        WeirDialect {
            pg: PostgreSqlDialect {},
            budget: Cell::new(tokens.saturating_mul(WORK_PER_TOKEN).max(WORK_MIN)),
        }
    }

    /// For tokenizing only (the tokenizer asks the dialect about characters, not work).
    pub fn for_tokenizing() -> WeirDialect {
        WeirDialect::for_tokens(0)
    }

    /// Whether a parse stopped because it spent its budget.
    pub fn exhausted(&self) -> bool {
        self.budget.get() == 0
    }

    /// Spends a unit of work; an error once the budget is spent. The error is the one
    /// sqlparser passes through its backtracking unchanged, so that the parse stops.
    fn spend(&self) -> Result<(), ParserError> {
        match self.budget.get() {
            0 => Err(ParserError::RecursionLimitExceeded),
            n => {
                self.budget.set(n - 1);
                Ok(())
            }
        }
    }
}

impl Dialect for WeirDialect {
    fn dialect(&self) -> TypeId {
        self.pg.dialect()
    }

    fn supports_named_fn_args_with_expr_name(&self) -> bool {
        false
    }

    fn parse_prefix(&self, parser: &mut Parser) -> Option<Result<Expr, ParserError>> {
        if let Err(e) = self.spend() {
            return Some(Err(e));
        }
        self.pg.parse_prefix(parser)
    }

    fn get_next_precedence(&self, parser: &Parser) -> Option<Result<u8, ParserError>> {
        if let Err(e) = self.spend() {
            return Some(Err(e));
        }
        self.pg.get_next_precedence(parser)
    }

    fn identifier_quote_style(&self, identifier: &str) -> Option<char> {
        self.pg.identifier_quote_style(identifier)
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        self.pg.is_delimited_identifier_start(ch)
    }

    fn is_identifier_start(&self, ch: char) -> bool {
        self.pg.is_identifier_start(ch)
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        self.pg.is_identifier_part(ch)
    }

    fn supports_unicode_string_literal(&self) -> bool {
        self.pg.supports_unicode_string_literal()
    }

    fn is_reserved_for_identifier(&self, kw: Keyword) -> bool {
        self.pg.is_reserved_for_identifier(kw)
    }

    fn is_custom_operator_part(&self, ch: char) -> bool {
        self.pg.is_custom_operator_part(ch)
    }

    fn supports_filter_during_aggregation(&self) -> bool {
        self.pg.supports_filter_during_aggregation()
    }

    fn supports_group_by_expr(&self) -> bool {
        self.pg.supports_group_by_expr()
    }

    fn prec_value(&self, prec: Precedence) -> u8 {
        self.pg.prec_value(prec)
    }

    fn allow_extract_custom(&self) -> bool {
        self.pg.allow_extract_custom()
    }

    fn allow_extract_single_quotes(&self) -> bool {
        self.pg.allow_extract_single_quotes()
    }

    fn supports_create_index_with_clause(&self) -> bool {
        self.pg.supports_create_index_with_clause()
    }

    fn supports_explain_with_utility_options(&self) -> bool {
        self.pg.supports_explain_with_utility_options()
    }

    fn supports_listen_notify(&self) -> bool {
        self.pg.supports_listen_notify()
    }

    fn supports_factorial_operator(&self) -> bool {
        self.pg.supports_factorial_operator()
    }

    fn supports_bitwise_shift_operators(&self) -> bool {
        self.pg.supports_bitwise_shift_operators()
    }

    fn supports_comment_on(&self) -> bool {
        self.pg.supports_comment_on()
    }

    /// Every grantee is read as a name (`PUBLIC` among them, which `sql::grants` knows), as
    /// PostgreSQL reads them: sqlparser would otherwise take `TO PUBLIC, alice` as two PUBLICs.
    fn get_reserved_grantees_types(&self) -> &[GranteesType] {
        &[
            GranteesType::Public,
            GranteesType::Role,
            GranteesType::User,
            GranteesType::Group,
            GranteesType::Share,
            GranteesType::DatabaseRole,
            GranteesType::Application,
            GranteesType::ApplicationRole,
        ]
    }

    fn supports_load_extension(&self) -> bool {
        self.pg.supports_load_extension()
    }

    fn supports_named_fn_args_with_colon_operator(&self) -> bool {
        self.pg.supports_named_fn_args_with_colon_operator()
    }

    fn supports_empty_projections(&self) -> bool {
        self.pg.supports_empty_projections()
    }

    fn supports_nested_comments(&self) -> bool {
        self.pg.supports_nested_comments()
    }

    fn supports_string_escape_constant(&self) -> bool {
        self.pg.supports_string_escape_constant()
    }

    fn supports_numeric_literal_underscores(&self) -> bool {
        self.pg.supports_numeric_literal_underscores()
    }

    fn supports_array_typedef_with_brackets(&self) -> bool {
        self.pg.supports_array_typedef_with_brackets()
    }

    fn supports_geometric_types(&self) -> bool {
        self.pg.supports_geometric_types()
    }

    fn supports_set_names(&self) -> bool {
        self.pg.supports_set_names()
    }

    fn supports_alter_column_type_using(&self) -> bool {
        self.pg.supports_alter_column_type_using()
    }

    fn supports_notnull_operator(&self) -> bool {
        self.pg.supports_notnull_operator()
    }

    fn supports_interval_options(&self) -> bool {
        self.pg.supports_interval_options()
    }

    fn supports_insert_table_alias(&self) -> bool {
        self.pg.supports_insert_table_alias()
    }

    fn supports_create_table_like_parenthesized(&self) -> bool {
        self.pg.supports_create_table_like_parenthesized()
    }

    fn supports_select_wildcard_with_alias(&self) -> bool {
        self.pg.supports_select_wildcard_with_alias()
    }

    fn supports_comma_separated_trim(&self) -> bool {
        self.pg.supports_comma_separated_trim()
    }

    fn supports_xml_expressions(&self) -> bool {
        self.pg.supports_xml_expressions()
    }

    fn supports_comment_optimizer_hint(&self) -> bool {
        self.pg.supports_comment_optimizer_hint()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

    use super::*;

    /// Every statement of the sqllogictest files (`sql-tests/*.slt`).
    fn slt_statements() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sql-tests");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            for record in text.split("\n\n") {
                let mut lines = record.lines().skip_while(|l| l.starts_with('#'));
                let Some(header) = lines.next() else { continue };
                if !(header.starts_with("statement") || header.starts_with("query")) {
                    continue;
                }
                let sql: Vec<&str> = lines.take_while(|l| *l != "----").collect();
                out.push(sql.join("\n"));
            }
        }
        assert!(out.len() > 400, "{} statements", out.len());
        out
    }

    fn parse_with(dialect: &dyn Dialect, sql: &str) -> Result<Vec<String>, ParserError> {
        Parser::new(dialect)
            .try_with_sql(sql)?
            .parse_statements()
            .map(|s| s.iter().map(|s| format!("{s:?}")).collect())
    }

    #[test]
    fn statements_parse_as_in_postgresqls_dialect() {
        let mut more = slt_statements();
        more.extend(
            [
                "SELECT 5 !, 1 << 2, 'a' ~ 'b', x::int[], E'\\n', U&'\\0041', $1, a->>'b'",
                "SELECT json_build_object('a', 1), f(g(h(1)))",
                "SELECT * FROM t WHERE x IS NOT DISTINCT FROM y AND z NOTNULL",
                "SET NAMES 'utf8'; LISTEN c; NOTIFY c",
                "SELECT COUNT(*) FILTER (WHERE x > 1) FROM t GROUP BY CUBE (a, b)",
                "SELECT interval '1' day, TIMESTAMP WITH TIME ZONE '2020-01-01 00:00:00+00'",
            ]
            .map(String::from),
        );
        for sql in &more {
            let weir = parse_with(&WeirDialect::for_tokens(sql.len()), sql);
            let pg = parse_with(&PostgreSqlDialect {}, sql);
            match (&weir, &pg) {
                (Ok(w), Ok(p)) => assert_eq!(w, p, "{sql}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{sql}: {weir:?} vs {pg:?}"),
            }
        }
    }

    #[test]
    fn named_arguments_are_named_by_identifiers() {
        let parsed = parse_with(
            &WeirDialect::for_tokens(100),
            "SELECT f(a => 1, b => x + 1)",
        );
        let parsed = parsed.unwrap().join("");
        assert!(
            parsed.contains("Named { name: Ident { value: \"a\""),
            "{parsed}"
        );
    }

    #[test]
    fn real_statements_spend_a_small_part_of_their_budget() {
        let mut worst = (0.0f64, String::new());
        for sql in slt_statements() {
            let tokens = Tokenizer::new(&PostgreSqlDialect {}, &sql)
                .tokenize()
                .unwrap()
                .into_iter()
                .filter(|t| !matches!(t, Token::Whitespace(_)))
                .count();
            let dialect = WeirDialect::for_tokens(tokens);
            let budget = dialect.budget.get();
            let _ = parse_with(&dialect, &sql);
            let per_token = (budget - dialect.budget.get()) as f64 / tokens.max(1) as f64;
            if per_token > worst.0 {
                worst = (per_token, sql);
            }
        }
        assert!(
            worst.0 * 4.0 < WORK_PER_TOKEN as f64,
            "{} units per token: {}",
            worst.0,
            worst.1
        );
    }

    #[test]
    fn a_parse_that_spends_its_budget_stops() {
        // Invalid, and exponential without the budget: 12 levels took 48 s.
        let sql = format!(
            "SELECT {}1{}",
            "CAST(CASE (".repeat(30),
            ") END AS int)".repeat(30)
        );
        let dialect = WeirDialect::for_tokens(sql.len());
        let err = parse_with(&dialect, &sql).unwrap_err();
        assert_eq!(err, ParserError::RecursionLimitExceeded);
        assert!(dialect.exhausted());
    }
}
