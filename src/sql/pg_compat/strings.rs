//! PostgreSQL's functions over identifiers and format strings that tools build their catalog
//! queries with: `quote_ident`, `quote_literal`, `quote_nullable`, `parse_ident` and
//! `format`.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::ScalarValue;
use datafusion::error::Result as DfResult;

use super::functions::{any, as_text, external, f, text, to_text, CatalogFn};
use crate::error::ErrorKind;
use crate::sql::pg_catalog::quote_ident;

/// The functions of this file.
pub(super) fn string_functions() -> Vec<CatalogFn> {
    vec![
        f("quote_ident", any(), 1..=1, to_text, |v| {
            Ok(text(value_text(&v[0]).map(|s| quote_ident(&s))))
        }),
        f("quote_literal", any(), 1..=1, to_text, |v| {
            Ok(text(value_text(&v[0]).map(|s| quote_literal(&s))))
        }),
        f("quote_nullable", any(), 1..=1, to_text, |v| {
            Ok(text(Some(value_text(&v[0]).map_or_else(
                || "NULL".to_string(),
                |s| quote_literal(&s),
            ))))
        }),
        f(
            "parse_ident",
            any(),
            1..=2,
            |_| text_list(),
            |v| {
                let Some(name) = as_text(&v[0]) else {
                    return ScalarValue::try_from(&text_list());
                };
                let strict = !matches!(v.get(1), Some(ScalarValue::Boolean(Some(false))));
                let parts: Vec<ScalarValue> = (parse_ident(&name, strict)?.into_iter())
                    .map(|p| ScalarValue::Utf8(Some(p)))
                    .collect();
                Ok(ScalarValue::List(ScalarValue::new_list_nullable(
                    &parts,
                    &DataType::Utf8,
                )))
            },
        ),
        f("format", any(), 1..=100, to_text, |v| {
            let Some(pattern) = as_text(&v[0]) else {
                return Ok(text(None));
            };
            Ok(text(Some(format(&pattern, &v[1..])?)))
        }),
    ]
}

fn text_list() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)))
}

/// A value as PostgreSQL prints it: text as itself, booleans as `t` and `f`; NULL is `None`.
fn value_text(v: &ScalarValue) -> Option<String> {
    match v {
        v if v.is_null() => None,
        ScalarValue::Boolean(Some(b)) => Some(if *b { "t" } else { "f" }.to_string()),
        v => as_text(v).or_else(|| Some(v.to_string())),
    }
}

/// `'text'` with its quotes doubled; with a backslash, `E'...'` with the backslashes doubled.
fn quote_literal(s: &str) -> String {
    let quoted = s.replace('\'', "''");
    if s.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

fn invalid_identifier(name: &str, detail: &str) -> datafusion::error::DataFusionError {
    external(
        ErrorKind::InvalidParameter,
        &format!("string is not a valid identifier: \"{name}\". {detail}"),
    )
}

/// `parse_ident('a."B c".d')`: the parts of a qualified name, unquoted names lowercased. Not
/// `strict`, what follows the last part is ignored.
fn parse_ident(name: &str, strict: bool) -> DfResult<Vec<String>> {
    let mut parts = Vec::new();
    let mut chars = name.trim_start().chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    Some('"') => break,
                    Some(c) => part.push(c),
                    None => {
                        return Err(invalid_identifier(
                            name,
                            "String has unclosed double quotes.",
                        ))
                    }
                }
            }
            if part.is_empty() {
                return Err(invalid_identifier(
                    name,
                    "Quoted identifier must not be empty.",
                ));
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_alphanumeric() || c == '_' || c == '$' || !c.is_ascii() {
                    part.push(c.to_ascii_lowercase());
                    chars.next();
                } else {
                    break;
                }
            }
            if part.is_empty() {
                let detail = match parts.is_empty() {
                    true => "No valid identifier before \".\".",
                    false => "No valid identifier after \".\".",
                };
                return Err(invalid_identifier(name, detail));
            }
        }
        parts.push(part);
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.peek() {
            Some('.') => {
                chars.next();
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            None => return Ok(parts),
            Some(_) if !strict => return Ok(parts),
            Some(_) => return Err(invalid_identifier(name, "")),
        }
    }
}

fn format_error(message: &str) -> datafusion::error::DataFusionError {
    external(ErrorKind::InvalidParameter, message)
}

/// `format(pattern, args...)`: `%s` (a value's text, NULL as nothing), `%I` (an identifier,
/// quoted as needed; NULL is an error), `%L` (a literal, NULL as `NULL`) and `%%`, each with
/// an optional argument position (`%2$s`), `-` flag and width (a number or `*`), as in
/// PostgreSQL.
fn format(pattern: &str, args: &[ScalarValue]) -> DfResult<String> {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    let mut next_arg = 0usize;
    let number = |chars: &mut std::iter::Peekable<std::str::Chars>| -> DfResult<Option<usize>> {
        let mut digits = String::new();
        while let Some(c) = chars.peek().filter(|c| c.is_ascii_digit()) {
            digits.push(*c);
            chars.next();
        }
        match digits.is_empty() {
            true => Ok(None),
            false => digits
                .parse::<usize>()
                .ok()
                .filter(|&n| n <= 1_000_000)
                .map(Some)
                .ok_or_else(|| format_error("number is out of range")),
        }
    };
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        // An argument's position, or the width when no `$` follows.
        let mut position = None;
        let mut left = false;
        let mut width = number(&mut chars)?;
        if width.is_some() && chars.peek() == Some(&'$') {
            chars.next();
            position = width.take();
            if position == Some(0) {
                return Err(format_error(
                    "format specifies argument 0, but arguments are numbered from 1",
                ));
            }
        }
        if width.is_none() {
            while chars.peek() == Some(&'-') {
                chars.next();
                left = true;
            }
            if chars.peek() == Some(&'*') {
                chars.next();
                let at = number(&mut chars)?;
                let index = match at {
                    Some(n) if chars.next() == Some('$') && n > 0 => n - 1,
                    Some(_) => return Err(format_error("unterminated format() type specifier")),
                    None => {
                        next_arg += 1;
                        next_arg - 1
                    }
                };
                let w = args
                    .get(index)
                    .ok_or_else(|| format_error("too few arguments for format()"))?;
                let w = match w.cast_to(&DataType::Int64)? {
                    ScalarValue::Int64(Some(w)) => w,
                    _ => 0,
                };
                left |= w < 0;
                width = usize::try_from(w.unsigned_abs()).ok();
            } else {
                width = number(&mut chars)?;
            }
        }
        let kind = chars
            .next()
            .ok_or_else(|| format_error("unterminated format() type specifier"))?;
        let index = match position {
            Some(p) => p - 1,
            None => next_arg,
        };
        next_arg = index + 1;
        let value = args
            .get(index)
            .ok_or_else(|| format_error("too few arguments for format()"))?;
        let formatted = match kind {
            's' => value_text(value).unwrap_or_default(),
            'I' => quote_ident(&value_text(value).ok_or_else(|| {
                external(
                    ErrorKind::NullValueNotAllowed,
                    "null values cannot be formatted as an SQL identifier",
                )
            })?),
            'L' => value_text(value).map_or_else(|| "NULL".to_string(), |s| quote_literal(&s)),
            other => {
                return Err(format_error(&format!(
                    "unrecognized format() type specifier \"{other}\""
                )))
            }
        };
        let pad = width.unwrap_or(0).saturating_sub(formatted.chars().count());
        if left {
            out.push_str(&formatted);
            out.extend(std::iter::repeat_n(' ', pad));
        } else {
            out.extend(std::iter::repeat_n(' ', pad));
            out.push_str(&formatted);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> ScalarValue {
        ScalarValue::Utf8(Some(v.into()))
    }

    #[test]
    fn format_reads_positions_flags_and_widths_as_postgres_does() {
        let args = [
            s("My Table"),
            s("it's"),
            ScalarValue::Utf8(None),
            ScalarValue::Int32(Some(7)),
        ];
        assert_eq!(
            format("%I.%s %L %L %%", &args).unwrap(),
            "\"My Table\".it's NULL '7' %"
        );
        assert_eq!(format("%2$s %1$s %s", &args).unwrap(), "it's My Table it's");
        assert_eq!(
            format("[%-5s][%5s]", &[s("ab"), s("cd")]).unwrap(),
            "[ab   ][   cd]"
        );
        assert_eq!(
            format("[%*s]", &[ScalarValue::Int32(Some(-4)), s("x")]).unwrap(),
            "[x   ]"
        );
        assert_eq!(format("%s", &[ScalarValue::Int32(Some(7))]).unwrap(), "7");
        assert_eq!(
            format(
                "%s|%s",
                &[ScalarValue::Boolean(Some(true)), ScalarValue::Utf8(None)]
            )
            .unwrap(),
            "t|"
        );
        for bad in ["%s %s", "%x", "%", "%0$s"] {
            assert!(format(bad, &[s("a")]).is_err(), "{bad}");
        }
        assert!(format("%I", &[ScalarValue::Utf8(None)]).is_err());
    }

    #[test]
    fn parse_ident_splits_and_unquotes_as_postgres_does() {
        assert_eq!(
            parse_ident("public.Orders", true).unwrap(),
            ["public", "orders"]
        );
        assert_eq!(
            parse_ident("\"My \"\"T\"\"\" . x", true).unwrap(),
            ["My \"T\"", "x"]
        );
        assert_eq!(parse_ident("a.b(", false).unwrap(), ["a", "b"]);
        for bad in ["a.", ".a", "\"a", "\"\"", "a.b("] {
            assert!(parse_ident(bad, true).is_err(), "{bad}");
        }
    }

    #[test]
    fn literals_are_quoted_as_postgres_quotes_them() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("a\\b"), "E'a\\\\b'");
    }
}
