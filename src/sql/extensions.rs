//! Weir's own syntax around standard statements, read from the statement's tokens and never
//! printed back to text: `WATERMARK FOR col AS expr` in a table's or a source's column list,
//! `EMIT ON WINDOW CLOSE` after a materialized view's query, `CREATE SINK`, a source's
//! `FORMAT ... ENCODE ...` and its dotted option names (`properties.bootstrap.server = ...`,
//! RisingWave's). Each clause is
//! cut out of the tokens and parsed on its own by sqlparser's parser; the tokens keep their
//! positions, so that an error points into the statement as it was written.

use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Word};

use super::parser::{near, parse_with};
use crate::error::{Error, Result};

/// `WATERMARK FOR column AS expr`: rows later than `expr` (`column` or `column - INTERVAL
/// '...'`) behind the latest are late.
#[derive(Debug, Clone)]
pub struct Watermark {
    pub column: ast::Ident,
    pub expr: ast::Expr,
}

/// `CREATE [MATERIALIZED] VIEW` as sqlparser reads it, with `EMIT ON WINDOW CLOSE`.
#[derive(Debug, Clone)]
pub struct CreateView {
    pub view: Box<ast::CreateView>,
    pub emit_on_window_close: bool,
}

/// `CREATE SINK [IF NOT EXISTS] name {AS query | FROM relation} [EMIT ON WINDOW CLOSE]
/// [WITH (options)] [FORMAT format ENCODE encode]`.
#[derive(Debug, Clone)]
pub struct CreateSink {
    pub name: ast::ObjectName,
    pub if_not_exists: bool,
    /// The query, or `SELECT * FROM relation`.
    pub query: Box<ast::Query>,
    pub emit_on_window_close: bool,
    /// Dotted names (`properties.bootstrap.server`) joined into one, lower-case.
    pub options: Vec<ast::SqlOption>,
    pub format: Option<Format>,
}

/// The word a token spells, upper-cased, if it is an unquoted word.
fn keyword(t: &TokenWithSpan) -> Option<String> {
    match &t.token {
        Token::Word(Word {
            value,
            quote_style: None,
            ..
        }) => Some(value.to_uppercase()),
        _ => None,
    }
}

fn is(t: Option<&TokenWithSpan>, word: &str) -> bool {
    t.and_then(keyword).is_some_and(|k| k == word)
}

/// The positions in `tokens` of those that are not whitespace.
pub(crate) fn meaningful(tokens: &[TokenWithSpan]) -> Vec<usize> {
    (0..tokens.len())
        .filter(|&i| !matches!(tokens[i].token, Token::Whitespace(_)))
        .collect()
}

/// Cuts `, WATERMARK FOR column AS expr` (up to the column list's closing parenthesis) out of
/// a `CREATE TABLE` or `CREATE SOURCE`, and reads it. A statement without the clause, or with
/// it elsewhere, is left as it is, for the statement's parser to accept or refuse.
pub fn take_watermark(
    sql: &str,
    tokens: &mut Vec<TokenWithSpan>,
) -> Result<Option<Box<Watermark>>> {
    let m = meaningful(tokens);
    let at = |k: usize| m.get(k).map(|&i| &tokens[i]);
    let Some(w) = (1..m.len()).find(|&k| is(at(k), "WATERMARK") && is(at(k + 1), "FOR")) else {
        return Ok(None);
    };
    if at(w - 1).map(|t| &t.token) != Some(&Token::Comma) || !is(at(w + 3), "AS") {
        return Ok(None);
    }
    let mut depth = 0usize;
    let mut end = None;
    for k in w + 4..m.len() {
        match tokens[m[k]].token {
            Token::LParen => depth += 1,
            Token::RParen if depth == 0 => {
                end = Some(k);
                break;
            }
            Token::RParen => depth -= 1,
            Token::Comma if depth == 0 => return Ok(None),
            _ => {}
        }
    }
    let Some(end) = end else { return Ok(None) };
    let column = parse_with(sql, &tokens[m[w + 2]..m[w + 3]], |p| p.parse_identifier())?;
    let expr = parse_with(sql, &tokens[m[w + 4]..m[end]], |p| p.parse_expr())?;
    tokens.drain(m[w - 1]..m[end]);
    Ok(Some(Box::new(Watermark { column, expr })))
}

/// A source's `FORMAT <format> ENCODE <encode>` (`FORMAT PLAIN ENCODE JSON`), lower-case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    pub format: String,
    pub encode: String,
}

/// Cuts a trailing `FORMAT <word> ENCODE <word>` off a `CREATE SOURCE` or `CREATE TABLE`
/// (RisingWave's clause, after `WITH (...)`); `None` when there is none.
pub fn take_format(tokens: &mut Vec<TokenWithSpan>) -> Option<Format> {
    let m = meaningful(tokens);
    let mut end = m.len();
    // A statement's closing semicolon stays.
    if end > 0 && tokens[m[end - 1]].token == Token::SemiColon {
        end -= 1;
    }
    let first = end.checked_sub(4)?;
    let word = |k: usize| match &tokens[m[k]].token {
        Token::Word(w) => Some(w.value.to_lowercase()),
        _ => None,
    };
    if !is(Some(&tokens[m[first]]), "FORMAT") || !is(Some(&tokens[m[first + 2]]), "ENCODE") {
        return None;
    }
    let format = Format {
        format: word(first + 1)?,
        encode: word(first + 3)?,
    };
    tokens.drain(m[first]..=m[first + 3]);
    Some(format)
}

/// `INCLUDE <what> [AS <name>]` after a source's column list (RisingWave's clause): a column
/// of each row's metadata (a Kafka message's key, partition, offset or timestamp), which the
/// connector reads as its option `include.<what>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Include {
    /// What to include, lower-case.
    pub what: String,
    /// The column's name, where given.
    pub name: Option<String>,
}

/// Cuts every `INCLUDE <word> [AS <name>]` that follows a `CREATE SOURCE`'s column list (before
/// `WITH`) out of its tokens, and reads them.
pub fn take_includes(sql: &str, tokens: &mut Vec<TokenWithSpan>) -> Result<Vec<Include>> {
    let m = meaningful(tokens);
    let at = |k: usize| m.get(k).map(|&i| &tokens[i]);
    // The first INCLUDE at the statement's top level right after a closing parenthesis (the
    // column list's): a relation may be named "include".
    let mut depth = 0usize;
    let mut first = None;
    for k in 0..m.len() {
        match tokens[m[k]].token {
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            _ if depth == 0
                && is(at(k), "INCLUDE")
                && k > 0
                && tokens[m[k - 1]].token == Token::RParen =>
            {
                first = Some(k);
                break;
            }
            _ => {}
        }
    }
    let Some(first) = first else {
        return Ok(Vec::new());
    };
    let name_of = |t: &TokenWithSpan| match &t.token {
        Token::Word(w) if w.quote_style.is_some() => Some(w.value.clone()),
        Token::Word(w) => Some(w.value.to_lowercase()),
        _ => None,
    };
    let bad = |t: Option<&TokenWithSpan>| match t {
        Some(t) => near(sql, t),
        None => Error::syntax("syntax error at end of input"),
    };
    let mut includes = Vec::new();
    let mut k = first;
    while is(at(k), "INCLUDE") {
        let what = at(k + 1)
            .and_then(keyword)
            .ok_or_else(|| bad(at(k + 1)))?
            .to_lowercase();
        k += 2;
        let mut name = None;
        if is(at(k), "AS") {
            name = Some(at(k + 1).and_then(name_of).ok_or_else(|| bad(at(k + 1)))?);
            k += 2;
        }
        includes.push(Include { what, name });
    }
    let end = m.get(k).copied().unwrap_or(tokens.len());
    tokens.drain(m[first]..end);
    Ok(includes)
}

/// `FROM <source> TABLE '<upstream table>'` after a `CREATE TABLE`'s column list: a table fed
/// by a source's stream of several tables (PostgreSQL CDC), RisingWave's clause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromSource {
    pub source: ast::ObjectName,
    pub table: String,
}

/// Cuts `FROM <source> TABLE '<name>'` that follows a `CREATE TABLE`'s column list out of its
/// tokens, and reads it.
pub fn take_from_source(sql: &str, tokens: &mut Vec<TokenWithSpan>) -> Result<Option<FromSource>> {
    let m = meaningful(tokens);
    let at = |k: usize| m.get(k).map(|&i| &tokens[i]);
    let mut depth = 0usize;
    let mut first = None;
    for k in 0..m.len() {
        match tokens[m[k]].token {
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            _ if depth == 0
                && is(at(k), "FROM")
                && k > 0
                && tokens[m[k - 1]].token == Token::RParen =>
            {
                first = Some(k);
                break;
            }
            _ => {}
        }
    }
    let Some(first) = first else {
        return Ok(None);
    };
    // The source's name, up to TABLE.
    let Some(table_at) = (first + 2..m.len()).find(|&k| is(at(k), "TABLE")) else {
        return Err(near(sql, &tokens[m[first]]));
    };
    let source = parse_with(sql, &tokens[m[first + 1]..m[table_at]], |p| {
        p.parse_object_name(false)
    })?;
    let table = match at(table_at + 1).map(|t| &t.token) {
        Some(Token::SingleQuotedString(s)) => s.clone(),
        Some(_) => return Err(near(sql, &tokens[m[table_at + 1]])),
        None => return Err(Error::syntax("syntax error at end of input")),
    };
    let end = m.get(table_at + 2).copied().unwrap_or(tokens.len());
    tokens.drain(m[first]..end);
    Ok(Some(FromSource { source, table }))
}

/// Joins the dotted option names of a statement's first `WITH (...)` (`properties.bootstrap.server
/// = '...'`, which sqlparser does not read) into one quoted name each, lower-case.
pub fn join_dotted_option_names(tokens: &mut Vec<TokenWithSpan>) {
    let m = meaningful(tokens);
    let token = |k: usize| m.get(k).map(|&i| &tokens[i].token);
    let Some(with) = (0..m.len()).find(|&k| is(m.get(k).map(|&i| &tokens[i]), "WITH")) else {
        return;
    };
    if token(with + 1) != Some(&Token::LParen) {
        return;
    }
    let mut joins = Vec::new();
    let mut depth = 1usize;
    let mut k = with + 2;
    while depth > 0 && k < m.len() {
        match token(k) {
            Some(Token::LParen) => depth += 1,
            Some(Token::RParen) => depth -= 1,
            Some(Token::Word(first)) if depth == 1 => {
                let mut parts = vec![first.value.to_lowercase()];
                let mut end = k;
                while token(end + 1) == Some(&Token::Period) {
                    let Some(Token::Word(next)) = token(end + 2) else {
                        break;
                    };
                    parts.push(next.value.to_lowercase());
                    end += 2;
                }
                if end > k && token(end + 1) == Some(&Token::Eq) {
                    joins.push((m[k], m[end], parts.join(".")));
                }
                k = end;
            }
            _ => {}
        }
        k += 1;
    }
    for (first, last, name) in joins.into_iter().rev() {
        let span = tokens[first].span.union(&tokens[last].span);
        let word = Token::Word(Word {
            value: name,
            quote_style: Some('"'),
            keyword: Keyword::NoKeyword,
        });
        tokens.splice(first..=last, [TokenWithSpan::new(word, span)]);
    }
}

/// Cuts a trailing `EMIT ON WINDOW CLOSE` off a `CREATE MATERIALIZED VIEW`; whether it was there.
pub fn take_emit_on_window_close(tokens: &mut Vec<TokenWithSpan>) -> bool {
    let m = meaningful(tokens);
    let Some(first) = m.len().checked_sub(4) else {
        return false;
    };
    let clause = ["EMIT", "ON", "WINDOW", "CLOSE"];
    if !clause
        .iter()
        .enumerate()
        .all(|(j, w)| is(Some(&tokens[m[first + j]]), w))
    {
        return false;
    }
    tokens.truncate(m[first]);
    true
}

/// Reads `CREATE SINK ...`; `query` parses a query's tokens as any statement's are.
pub fn create_sink(
    sql: &str,
    tokens: &[TokenWithSpan],
    query: impl Fn(&[TokenWithSpan]) -> Result<ast::Query>,
) -> Result<CreateSink> {
    let mut tokens = tokens.to_vec();
    let format = take_format(&mut tokens);
    let m: Vec<TokenWithSpan> = meaningful(&tokens)
        .into_iter()
        .map(|i| tokens[i].clone())
        .collect();
    let bad = |k: usize| match m.get(k) {
        Some(t) => near(sql, t),
        None => Error::syntax("syntax error at end of input"),
    };
    let if_not_exists = is(m.get(2), "IF") && is(m.get(3), "NOT") && is(m.get(4), "EXISTS");
    let name_at = if if_not_exists { 5 } else { 2 };
    if !matches!(m.get(name_at).map(|t| &t.token), Some(Token::Word(_))) {
        return Err(bad(name_at));
    }
    let name = parse_with(sql, &m[name_at..name_at + 1], |p| {
        p.parse_object_name(false)
    })?;
    // A trailing `WITH ( ... )`.
    let mut end = m.len();
    let mut options = Vec::new();
    if m.last().map(|t| &t.token) == Some(&Token::RParen) {
        let mut depth = 0usize;
        let mut open = None;
        for k in (0..m.len()).rev() {
            match m[k].token {
                Token::RParen => depth += 1,
                Token::LParen => {
                    depth -= 1;
                    if depth == 0 {
                        open = Some(k);
                        break;
                    }
                }
                _ => {}
            }
        }
        if let Some(open) = open.filter(|&o| o > name_at + 1 && is(m.get(o - 1), "WITH")) {
            let mut with = m[open - 1..].to_vec();
            join_dotted_option_names(&mut with);
            options = parse_with(sql, &with, |p| p.parse_options(Keyword::WITH))?;
            end = open - 1;
        }
    }
    let emit_on_window_close = end >= 4
        && ["EMIT", "ON", "WINDOW", "CLOSE"]
            .iter()
            .enumerate()
            .all(|(j, w)| is(m.get(end - 4 + j), w));
    if emit_on_window_close {
        end -= 4;
    }
    let query = match m.get(name_at + 1).and_then(keyword).as_deref() {
        Some("AS") if end > name_at + 2 => query(&m[name_at + 2..end])?,
        Some("FROM") if end == name_at + 3 => {
            // `SELECT * FROM relation`, with the relation's own token.
            let from = &m[name_at + 1];
            let word = |w: &str| TokenWithSpan::new(Token::make_keyword(w), from.span);
            let tokens = [
                word("SELECT"),
                TokenWithSpan::new(Token::Mul, from.span),
                word("FROM"),
                m[name_at + 2].clone(),
            ];
            query(&tokens)?
        }
        _ => return Err(bad(name_at + 1)),
    };
    Ok(CreateSink {
        name,
        if_not_exists,
        query: Box::new(query),
        emit_on_window_close,
        options,
        format,
    })
}
