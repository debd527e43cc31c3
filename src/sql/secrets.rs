//! `CREATE SECRET`, `ALTER SECRET` and `DROP SECRET` read from their tokens, the `SECRET name`
//! values of connectors' options (`password = SECRET pg_password`), and statements' text with
//! secrets' values hidden (`docs/design/0021-secrets.md`).

use std::borrow::Cow;

use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Word};

use crate::error::{Error, Result};

/// A secret statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretStatement {
    /// `CREATE SECRET [IF NOT EXISTS] name [WITH (backend = 'meta')] AS 'value'`.
    Create {
        name: String,
        if_not_exists: bool,
        value: String,
    },
    /// `ALTER SECRET name [WITH (backend = 'meta')] AS 'value'`: a new value.
    Alter { name: String, value: String },
    /// `DROP SECRET [IF EXISTS] name`.
    Drop { name: String, if_exists: bool },
}

impl SecretStatement {
    pub fn tag(&self) -> &'static str {
        match self {
            SecretStatement::Create { .. } => "CREATE SECRET",
            SecretStatement::Alter { .. } => "ALTER SECRET",
            SecretStatement::Drop { .. } => "DROP SECRET",
        }
    }
}

/// The name a function of this spelling has in an option's value: what `SECRET name` is read
/// as (`references`), quoted so that no function of SQL's is taken for it.
const REFERENCE: &str = "secret";

fn word(t: &Token) -> Option<String> {
    match t {
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_uppercase()),
        _ => None,
    }
}

/// A name as written: a quoted one as it is, another in lower case.
fn name(t: &Token) -> Option<String> {
    match t {
        Token::Word(w) if w.quote_style == Some('"') => Some(w.value.clone()),
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_lowercase()),
        _ => None,
    }
}

/// Reads a statement that begins `CREATE SECRET`, `ALTER SECRET` or `DROP SECRET`; `None`
/// for any other.
pub fn statement(sql: &str, group: &[TokenWithSpan]) -> Option<Result<SecretStatement>> {
    let tokens: Vec<&TokenWithSpan> = (group.iter())
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    let verb = word(&tokens.first()?.token)?;
    if !matches!(verb.as_str(), "CREATE" | "ALTER" | "DROP")
        || word(&tokens.get(1)?.token).as_deref() != Some("SECRET")
    {
        return None;
    }
    let mut at = 2;
    let next_is = |words: &[&str], at: &mut usize| {
        let found = (0..words.len()).all(|i| {
            (tokens.get(*at + i))
                .and_then(|t| word(&t.token))
                .as_deref()
                == Some(words[i])
        });
        if found {
            *at += words.len();
        }
        found
    };
    let if_not_exists = verb == "CREATE" && next_is(&["IF", "NOT", "EXISTS"], &mut at);
    let if_exists = verb == "DROP" && next_is(&["IF", "EXISTS"], &mut at);
    let end = TokenWithSpan::wrap(Token::EOF);
    let near = |at: usize| super::parser::near(sql, tokens.get(at).copied().unwrap_or(&end));
    let Some(secret) = tokens.get(at).and_then(|t| name(&t.token)) else {
        return Some(Err(near(at)));
    };
    at += 1;
    if verb == "DROP" {
        return Some(match tokens.get(at) {
            None => Ok(SecretStatement::Drop {
                name: secret,
                if_exists,
            }),
            Some(_) => Err(near(at)),
        });
    }
    if next_is(&["WITH"], &mut at) {
        if let Err(e) = backend(sql, &tokens, &mut at) {
            return Some(Err(e));
        }
    }
    if !next_is(&["AS"], &mut at) {
        return Some(Err(near(at)));
    }
    let value = match tokens.get(at).map(|t| &t.token) {
        Some(
            Token::SingleQuotedString(v)
            | Token::EscapedStringLiteral(v)
            | Token::NationalStringLiteral(v),
        ) => v.clone(),
        Some(Token::DollarQuotedString(d)) => d.value.clone(),
        _ => return Some(Err(near(at))),
    };
    if tokens.get(at + 1).is_some() {
        return Some(Err(near(at + 1)));
    }
    Some(Ok(match verb.as_str() {
        "CREATE" => SecretStatement::Create {
            name: secret,
            if_not_exists,
            value,
        },
        _ => SecretStatement::Alter {
            name: secret,
            value,
        },
    }))
}

/// Reads `(backend = 'meta')` at `at`: the one backend there is.
fn backend(sql: &str, tokens: &[&TokenWithSpan], at: &mut usize) -> Result<()> {
    let end = TokenWithSpan::wrap(Token::EOF);
    let near = |at: usize| super::parser::near(sql, tokens.get(at).copied().unwrap_or(&end));
    let token = |i: usize| tokens.get(i).map(|t| &t.token);
    if token(*at) != Some(&Token::LParen) {
        return Err(near(*at));
    }
    *at += 1;
    loop {
        let key = (token(*at)).and_then(|t| match t {
            Token::SingleQuotedString(k) => Some(k.to_lowercase()),
            t => name(t),
        });
        let Some(key) = key else {
            return Err(near(*at));
        };
        if token(*at + 1) != Some(&Token::Eq) {
            return Err(near(*at + 1));
        }
        let Some(Token::SingleQuotedString(value)) = token(*at + 2) else {
            return Err(near(*at + 2));
        };
        if key != "backend" {
            return Err(Error::new(
                crate::error::ErrorKind::InvalidParameter,
                format!("unknown secret option \"{key}\""),
            ));
        }
        if !value.eq_ignore_ascii_case("meta") {
            return Err(Error::not_supported(format!(
                "secret backend \"{value}\" is not supported"
            ))
            .with_hint("Secrets are kept in the catalog, encrypted: backend = 'meta'."));
        }
        *at += 3;
        match token(*at) {
            Some(Token::Comma) => *at += 1,
            Some(Token::RParen) => {
                *at += 1;
                return Ok(());
            }
            _ => return Err(near(*at)),
        }
    }
}

/// Rewrites each `= SECRET name` (an option's value that names a secret) as a call of the
/// function `"secret"('name')`, which the statement's parser reads as an expression and
/// `reference` recognises.
pub fn references(tokens: &mut Vec<TokenWithSpan>) {
    let mut out = Vec::with_capacity(tokens.len());
    let solid: Vec<usize> = (0..tokens.len())
        .filter(|&i| !matches!(tokens[i].token, Token::Whitespace(_)))
        .collect();
    // Whether each solid token is directly in a `WITH (...)` list: a query's `= secret x` (a
    // column and its alias) is not an option's value.
    let mut in_options = Vec::with_capacity(solid.len());
    let (mut depth, mut options) = (0usize, None);
    for (k, &i) in solid.iter().enumerate() {
        match &tokens[i].token {
            Token::LParen => {
                depth += 1;
                let after_with =
                    k > 0 && word(&tokens[solid[k - 1]].token).as_deref() == Some("WITH");
                if after_with && options.is_none() {
                    options = Some(depth);
                }
            }
            Token::RParen => {
                if options == Some(depth) {
                    options = None;
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        in_options.push(options == Some(depth));
    }
    let mut rewrite = std::collections::BTreeMap::new();
    for (k, w) in solid.windows(3).enumerate() {
        let secret = word(&tokens[w[1]].token).as_deref() == Some("SECRET");
        if tokens[w[0]].token == Token::Eq && secret && in_options[k] {
            if let Some(n) = name(&tokens[w[2]].token) {
                rewrite.insert(w[1], None);
                rewrite.insert(w[2], Some(n));
            }
        }
    }
    for (i, t) in tokens.drain(..).enumerate() {
        match rewrite.get(&i) {
            None => out.push(t),
            Some(None) => out.push(TokenWithSpan::new(
                Token::Word(Word {
                    value: REFERENCE.to_string(),
                    quote_style: Some('"'),
                    keyword: datafusion::sql::sqlparser::keywords::Keyword::NoKeyword,
                }),
                t.span,
            )),
            Some(Some(n)) => {
                out.push(TokenWithSpan::new(Token::LParen, t.span));
                out.push(TokenWithSpan::new(
                    Token::SingleQuotedString(n.clone()),
                    t.span,
                ));
                out.push(TokenWithSpan::new(Token::RParen, t.span));
            }
        }
    }
    *tokens = out;
}

/// The secret an option's value names (`SECRET name`, as `references` rewrote it).
pub fn reference(value: &ast::Expr) -> Option<String> {
    let ast::Expr::Function(f) = value else {
        return None;
    };
    let [ast::ObjectNamePart::Identifier(id)] = f.name.0.as_slice() else {
        return None;
    };
    if id.value != REFERENCE || id.quote_style != Some('"') {
        return None;
    }
    let ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    match list.args.as_slice() {
        [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(ast::Expr::Value(v)))] => {
            match &v.value {
                ast::Value::SingleQuotedString(n) => Some(n.clone()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `sql` as the server shows and logs it (`pg_stat_activity.query`): a `CREATE SECRET` or
/// `ALTER SECRET` with its value replaced by `'********'`. Other text is as it was.
pub fn shown(sql: &str) -> Cow<'_, str> {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::tokenizer::Tokenizer;
    if !sql.to_ascii_lowercase().contains("secret") {
        return Cow::Borrowed(sql);
    }
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        return Cow::Borrowed("********");
    };
    // Words read of the statement so far (up to three), and whether `AS` came in a secret's.
    let mut lead: Vec<String> = Vec::new();
    let mut after_as = false;
    let mut out = String::with_capacity(sql.len());
    for token in tokens {
        let mut shown = None;
        match &token {
            Token::Whitespace(_) => {}
            Token::SemiColon => {
                lead.clear();
                after_as = false;
            }
            t => {
                let secret = lead.len() >= 2 && lead[1] == "SECRET";
                if secret && after_as && !matches!(t, Token::Word(_)) {
                    shown = Some("'********'".to_string());
                }
                let w = word(t);
                after_as = secret && (after_as || w.as_deref() == Some("AS"));
                if lead.len() < 2 {
                    lead.push(w.unwrap_or_default());
                }
            }
        }
        out.push_str(&shown.unwrap_or_else(|| token.to_string()));
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::tokenizer::Tokenizer;

    fn read(sql: &str) -> Option<Result<SecretStatement>> {
        let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
            .tokenize_with_location()
            .unwrap();
        statement(sql, &tokens)
    }

    #[test]
    fn secret_statements_are_read() {
        assert_eq!(
            read("CREATE SECRET IF NOT EXISTS \"Pw\" WITH (backend = 'meta') AS 'it''s'")
                .unwrap()
                .unwrap(),
            SecretStatement::Create {
                name: "Pw".into(),
                if_not_exists: true,
                value: "it's".into()
            }
        );
        assert_eq!(
            read("alter secret pw as $$new$$").unwrap().unwrap(),
            SecretStatement::Alter {
                name: "pw".into(),
                value: "new".into()
            }
        );
        assert_eq!(
            read("DROP SECRET IF EXISTS pw").unwrap().unwrap(),
            SecretStatement::Drop {
                name: "pw".into(),
                if_exists: true
            }
        );
        assert!(read("CREATE TABLE secret (a int)").is_none());
        for bad in [
            "CREATE SECRET pw",
            "CREATE SECRET pw AS 1",
            "CREATE SECRET pw AS 'x' 'y'",
            "CREATE SECRET pw WITH (backend = 'vault') AS 'x'",
            "CREATE SECRET pw WITH (colour = 'meta') AS 'x'",
            "DROP SECRET a, b",
        ] {
            assert!(read(bad).unwrap().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_secret_s_value_is_not_shown() {
        assert_eq!(
            shown("CREATE SECRET pw AS 'hunter2'; SELECT 'secret' AS x"),
            "CREATE SECRET pw AS '********'; SELECT 'secret' AS x"
        );
        assert_eq!(
            shown("alter secret pw with (backend = 'meta') as E'a\\'b'"),
            "alter secret pw with (backend = 'meta') as '********'"
        );
        assert!(matches!(shown("SELECT 1"), Cow::Borrowed(_)));
    }
}
