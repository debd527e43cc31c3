//! `SUBSCRIBE`, `COPY (SUBSCRIBE ...) TO STDOUT` and the cursor statements (`DECLARE`,
//! `FETCH`, `MOVE`, `CLOSE`), read from their tokens: sqlparser knows neither SUBSCRIBE nor
//! MOVE, and reads FETCH only with FROM.

use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use super::{near, parse_with, Statement};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::extensions::join_dotted_option_names;

/// `SUBSCRIBE [TO] relation [WITH (option = value, ...)]`.
#[derive(Debug, Clone)]
pub struct Subscribe {
    /// The relation, as its token spells it (a quoted name keeps its case).
    pub name: String,
    pub options: Vec<(String, String)>,
}

/// What a cursor reads.
#[derive(Debug, Clone)]
pub enum CursorQuery {
    Select(Box<ast::Query>),
    Subscribe(Subscribe),
}

/// How many rows a FETCH or MOVE asks for: a count, or all that are left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Rows(u64),
    All,
}

fn word(t: &TokenWithSpan) -> Option<String> {
    match &t.token {
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_uppercase()),
        _ => None,
    }
}

/// A name as its token spells it: lower-cased unless quoted.
fn name(t: &TokenWithSpan) -> Option<String> {
    match &t.token {
        Token::Word(w) if w.quote_style.is_some() => Some(w.value.clone()),
        Token::Word(w) => Some(w.value.to_lowercase()),
        _ => None,
    }
}

/// Reads the statements of this module; `None` when `tokens` (without whitespace) are none
/// of them. `select` parses a query's tokens as any statement's are.
pub fn statement(
    sql: &str,
    tokens: &[TokenWithSpan],
    select: impl Fn(&[TokenWithSpan]) -> Result<ast::Query>,
) -> Option<Result<Statement>> {
    let lead = tokens.first().and_then(word)?;
    match lead.as_str() {
        "SUBSCRIBE" => Some(subscribe(sql, tokens).map(Statement::Subscribe)),
        "DECLARE" => Some(declare(sql, tokens, select)),
        "FETCH" | "MOVE" => Some(fetch(sql, tokens, lead == "MOVE")),
        "CLOSE" => Some(close(sql, tokens)),
        "COPY"
            if tokens.get(1).map(|t| &t.token) == Some(&Token::LParen)
                && tokens.get(2).and_then(word).as_deref() == Some("SUBSCRIBE") =>
        {
            Some(copy_subscribe(sql, tokens))
        }
        _ => None,
    }
}

fn end_error(sql: &str, tokens: &[TokenWithSpan], at: usize) -> Error {
    match tokens.get(at) {
        Some(t) => near(sql, t),
        None => Error::syntax("syntax error at end of input"),
    }
}

/// `SUBSCRIBE [TO] name [WITH (...)]`, all of `tokens`.
fn subscribe(sql: &str, tokens: &[TokenWithSpan]) -> Result<Subscribe> {
    let mut at = 1;
    if tokens.get(at).and_then(word).as_deref() == Some("TO") {
        at += 1;
    }
    let relation = tokens
        .get(at)
        .and_then(name)
        .ok_or_else(|| end_error(sql, tokens, at))?;
    at += 1;
    let mut options = Vec::new();
    if at < tokens.len() {
        if word(&tokens[at]).as_deref() != Some("WITH") {
            return Err(near(sql, &tokens[at]));
        }
        let mut with = tokens[at..].to_vec();
        join_dotted_option_names(&mut with);
        let parsed = parse_with(sql, &with, |p| p.parse_options(Keyword::WITH))?;
        for o in parsed {
            let ast::SqlOption::KeyValue { key, value } = o else {
                return Err(Error::syntax(format!(
                    "option {o} is not a key and a value"
                )));
            };
            options.push((key.value.to_lowercase(), crate::sql::option_text(&value)));
        }
    }
    Ok(Subscribe {
        name: relation,
        options,
    })
}

/// `COPY (SUBSCRIBE ...) TO STDOUT [WITH (...)]`: the subscription, and the COPY with
/// `SELECT 1` in its place, for its options.
fn copy_subscribe(sql: &str, tokens: &[TokenWithSpan]) -> Result<Statement> {
    let mut depth = 0usize;
    let mut close = None;
    for (i, t) in tokens.iter().enumerate().skip(1) {
        match t.token {
            Token::LParen => depth += 1,
            Token::RParen => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let close = close.ok_or_else(|| end_error(sql, tokens, tokens.len()))?;
    let subscription = subscribe(sql, &tokens[2..close])?;
    let span = tokens[2].span;
    let mut copy = tokens[..2].to_vec();
    copy.push(TokenWithSpan::new(Token::make_keyword("SELECT"), span));
    copy.push(TokenWithSpan::new(Token::Number("1".into(), false), span));
    copy.extend_from_slice(&tokens[close..]);
    let copy = parse_with(sql, &copy, |p| p.parse_statement())?;
    Ok(Statement::CopySubscribe {
        subscribe: subscription,
        copy: Box::new(copy),
    })
}

/// `DECLARE name [BINARY] [ASENSITIVE | INSENSITIVE] [[NO] SCROLL] CURSOR [{WITH | WITHOUT}
/// HOLD] FOR {query | SUBSCRIBE ...}`.
fn declare(
    sql: &str,
    tokens: &[TokenWithSpan],
    select: impl Fn(&[TokenWithSpan]) -> Result<ast::Query>,
) -> Result<Statement> {
    let cursor = tokens
        .get(1)
        .and_then(name)
        .ok_or_else(|| end_error(sql, tokens, 1))?;
    let mut at = 2;
    let words = |at: usize| tokens.get(at).and_then(word);
    loop {
        match words(at).as_deref() {
            Some("BINARY") => return Err(Error::not_supported("binary cursors are not supported")),
            Some("ASENSITIVE" | "INSENSITIVE" | "NO") => at += 1,
            Some("SCROLL") => {
                if words(at - 1).as_deref() != Some("NO") {
                    return Err(Error::not_supported(
                        "scrollable cursors are not supported: Weir's cursors scan forward",
                    )
                    .with_hint("Declare it NO SCROLL, or leave SCROLL out."));
                }
                at += 1;
            }
            Some("CURSOR") => {
                at += 1;
                break;
            }
            _ => return Err(end_error(sql, tokens, at)),
        }
    }
    match (words(at).as_deref(), words(at + 1).as_deref()) {
        (Some("WITH"), Some("HOLD")) => {
            return Err(Error::not_supported(
                "cursors WITH HOLD are not supported: a cursor ends with its transaction",
            ))
        }
        (Some("WITHOUT"), Some("HOLD")) => at += 2,
        _ => {}
    }
    if words(at).as_deref() != Some("FOR") {
        return Err(end_error(sql, tokens, at));
    }
    at += 1;
    let query = match words(at).as_deref() {
        Some("SUBSCRIBE") => CursorQuery::Subscribe(subscribe(sql, &tokens[at..])?),
        _ if at < tokens.len() => CursorQuery::Select(Box::new(select(&tokens[at..])?)),
        _ => return Err(end_error(sql, tokens, at)),
    };
    Ok(Statement::Declare {
        name: cursor,
        query,
    })
}

/// `{FETCH | MOVE} [direction] [FROM | IN] name`, forward directions only: `NEXT`, `n`,
/// `ALL`, `FORWARD [n | ALL]`.
fn fetch(sql: &str, tokens: &[TokenWithSpan], moves: bool) -> Result<Statement> {
    let backward = || {
        Error::new(
            ErrorKind::ObjectNotInPrerequisiteState,
            "cursor can only scan forward",
        )
        .with_hint("Weir's cursors read each row once, in order.")
    };
    let number = |t: &TokenWithSpan| -> Option<Result<Count>> {
        match &t.token {
            Token::Number(n, _) => Some(match n.parse::<u64>() {
                Ok(n) => Ok(Count::Rows(n)),
                Err(_) => Err(backward()),
            }),
            Token::Minus => Some(Err(backward())),
            _ => None,
        }
    };
    let mut at = 1;
    let count = match tokens.get(at).and_then(word).as_deref() {
        Some("NEXT") => {
            at += 1;
            Count::Rows(1)
        }
        Some("ALL") => {
            at += 1;
            Count::All
        }
        Some("FORWARD") => {
            at += 1;
            match tokens.get(at) {
                Some(t) if word(t).as_deref() == Some("ALL") => {
                    at += 1;
                    Count::All
                }
                Some(t) => match number(t) {
                    Some(c) => {
                        at += 1;
                        c?
                    }
                    None => Count::Rows(1),
                },
                None => Count::Rows(1),
            }
        }
        Some("PRIOR" | "FIRST" | "LAST" | "ABSOLUTE" | "RELATIVE" | "BACKWARD") => {
            return Err(backward())
        }
        _ => match tokens.get(at).and_then(number) {
            Some(c) => {
                at += 1;
                c?
            }
            None => Count::Rows(1),
        },
    };
    if matches!(
        tokens.get(at).and_then(word).as_deref(),
        Some("FROM" | "IN")
    ) {
        at += 1;
    }
    let cursor = tokens
        .get(at)
        .and_then(name)
        .ok_or_else(|| end_error(sql, tokens, at))?;
    if at + 1 < tokens.len() {
        return Err(near(sql, &tokens[at + 1]));
    }
    Ok(Statement::Fetch {
        name: cursor,
        count,
        moves,
    })
}

/// `CLOSE name` or `CLOSE ALL`.
fn close(sql: &str, tokens: &[TokenWithSpan]) -> Result<Statement> {
    if tokens.len() != 2 {
        return Err(end_error(sql, tokens, 2.min(tokens.len())));
    }
    if word(&tokens[1]).as_deref() == Some("ALL") {
        return Ok(Statement::Close(None));
    }
    let cursor = name(&tokens[1]).ok_or_else(|| near(sql, &tokens[1]))?;
    Ok(Statement::Close(Some(cursor)))
}
