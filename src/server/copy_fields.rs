//! The values of one line of `COPY ... FROM STDIN` data, as PostgreSQL reads them: text
//! format's fields (split at the delimiter, backslash escapes undone), CSV's (quoted where
//! they hold what would end them), and a binary tuple's; and the errors, in PostgreSQL's
//! words, that point at the line.

use std::ops::Range;

use crate::db::CopyFormat;
use crate::error::{Error, ErrorKind, Result};

/// One line's fields: each a range of `scratch` (its value, escapes undone), or `None` for
/// NULL.
pub type Fields = Vec<Option<Range<usize>>>;

/// Splits a text-format line (without its line break) into `fields`, the values written into
/// `scratch`. A field whose raw text is the NULL string is NULL.
pub fn text_fields(
    line: &[u8],
    format: &CopyFormat,
    scratch: &mut Vec<u8>,
    fields: &mut Fields,
) -> Result<()> {
    scratch.clear();
    fields.clear();
    let null = format.null.as_bytes();
    let mut i = 0;
    loop {
        let (raw_start, out_start) = (i, scratch.len());
        let mut more = false;
        while i < line.len() {
            let c = line[i];
            i += 1;
            if c == format.delimiter {
                more = true;
                break;
            }
            match c {
                b'\\' => {
                    // A backslash at the very end of the line stands for nothing.
                    let Some(&c2) = line.get(i) else { break };
                    i += 1;
                    let value = match c2 {
                        b'0'..=b'7' => {
                            let mut v = u32::from(c2 - b'0');
                            for _ in 0..2 {
                                match line.get(i) {
                                    Some(d @ b'0'..=b'7') => {
                                        v = v * 8 + u32::from(d - b'0');
                                        i += 1;
                                    }
                                    _ => break,
                                }
                            }
                            (v & 0o377) as u8
                        }
                        b'x' if line.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                            let mut v = 0u8;
                            for _ in 0..2 {
                                match line.get(i).and_then(|d| char::from(*d).to_digit(16)) {
                                    Some(d) => {
                                        v = v * 16 + d as u8;
                                        i += 1;
                                    }
                                    None => break,
                                }
                            }
                            v
                        }
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'v' => 0x0b,
                        other => other,
                    };
                    scratch.push(value);
                }
                _ => scratch.push(c),
            }
        }
        let raw_end = if more { i - 1 } else { i };
        end_field(
            &line[raw_start..raw_end] == null,
            out_start,
            scratch,
            fields,
        );
        if !more {
            return Ok(());
        }
    }
}

/// Splits a CSV record (without its final line break; quoted line breaks inside) into
/// `fields`, as PostgreSQL does: a quote opens a quoted part anywhere in a field, inside one
/// the escape character makes the quote or escape after it literal, and an unquoted field
/// whose raw text is the NULL string is NULL.
pub fn csv_fields(
    record: &[u8],
    format: &CopyFormat,
    scratch: &mut Vec<u8>,
    fields: &mut Fields,
) -> Result<()> {
    scratch.clear();
    fields.clear();
    let null = format.null.as_bytes();
    let (quote, escape) = (format.quote, format.escape);
    let mut i = 0;
    loop {
        let (raw_start, out_start) = (i, scratch.len());
        let mut saw_quote = false;
        let mut more = false;
        'field: while i < record.len() {
            let c = record[i];
            i += 1;
            if c == format.delimiter {
                more = true;
                break;
            }
            if c == b'\r' {
                return Err(mixed_line_ends(true, true));
            }
            if c != quote {
                scratch.push(c);
                continue;
            }
            saw_quote = true;
            loop {
                let Some(&c) = record.get(i) else {
                    return Err(bad_format("unterminated CSV quoted field"));
                };
                i += 1;
                if c == escape {
                    if let Some(&next) = record.get(i).filter(|n| **n == escape || **n == quote) {
                        scratch.push(next);
                        i += 1;
                        continue;
                    }
                }
                if c == quote {
                    continue 'field;
                }
                scratch.push(c);
            }
        }
        let raw_end = if more { i - 1 } else { i };
        let null = !saw_quote && &record[raw_start..raw_end] == null;
        end_field(null, out_start, scratch, fields);
        if !more {
            return Ok(());
        }
    }
}

/// Ends the field whose value began at `scratch[out_start]`: NULL (its value dropped), or the
/// value written since.
fn end_field(null: bool, out_start: usize, scratch: &mut Vec<u8>, fields: &mut Fields) {
    if null {
        scratch.truncate(out_start);
        fields.push(None);
    } else {
        fields.push(Some(out_start..scratch.len()));
    }
}

/// Where a CSV record that starts at `buf[start]` ends (the position of its line break),
/// scanning from `scanned` with `quoted` telling whether that point is inside quotes; `None`
/// when the end has not come yet, with `scanned` and `quoted` where to go on from.
pub fn csv_record_end(
    buf: &[u8],
    scanned: &mut usize,
    quoted: &mut bool,
    format: &CopyFormat,
) -> Option<usize> {
    let (quote, escape) = (format.quote, format.escape);
    let mut i = *scanned;
    while i < buf.len() {
        let c = buf[i];
        if *quoted {
            if c == escape && escape != quote {
                // The escape makes the next quote or escape literal: decide once it has come.
                let Some(&next) = buf.get(i + 1) else { break };
                if next == quote || next == escape {
                    i += 2;
                    continue;
                }
            }
            if c == quote {
                *quoted = false;
            }
        } else if c == quote {
            *quoted = true;
        } else if c == b'\n' {
            *scanned = i;
            return Some(i);
        }
        i += 1;
    }
    *scanned = i;
    None
}

/// Where a text-format line that starts at `buf[start]` ends (its line break, which a
/// backslash before it would make part of a value), searching from `scanned`; `None` when the
/// end has not come yet, with `scanned` where to go on from.
pub fn text_line_end(buf: &[u8], start: usize, scanned: &mut usize) -> Option<usize> {
    let mut from = *scanned;
    while let Some(offset) = buf[from..].iter().position(|b| *b == b'\n') {
        let at = from + offset;
        let backslashes = buf[start..at]
            .iter()
            .rev()
            .take_while(|b| **b == b'\\')
            .count();
        if backslashes % 2 == 0 {
            *scanned = at;
            return Some(at);
        }
        from = at + 1;
    }
    *scanned = buf.len();
    None
}

/// A binary COPY's file header, at the start of `buf`: how long it is, or `None` when it has
/// not all come.
pub fn binary_header(buf: &[u8]) -> Result<Option<usize>> {
    const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";
    let got = buf.len().min(SIGNATURE.len());
    if buf[..got] != SIGNATURE[..got] {
        return Err(bad_format("COPY file signature not recognized"));
    }
    let Some(head) = buf.get(..SIGNATURE.len() + 8) else {
        return Ok(None);
    };
    let flags = i32::from_be_bytes([head[11], head[12], head[13], head[14]]);
    if flags & (1 << 16) != 0 {
        return Err(bad_format("invalid COPY file header (WITH OIDS)"));
    }
    if flags & !0xffff & !(1 << 16) != 0 {
        return Err(bad_format(
            "unrecognized critical flags in COPY file header",
        ));
    }
    let extension = i32::from_be_bytes([head[15], head[16], head[17], head[18]]);
    let extension = usize::try_from(extension)
        .map_err(|_| bad_format("invalid COPY file header (missing length)"))?;
    let len = head.len().saturating_add(extension);
    Ok((buf.len() >= len).then_some(len))
}

/// A binary tuple at the start of `buf` with `columns` fields: how long it is and each
/// field's bytes (`None` for NULL) as ranges of `buf`; `Ok(None)` when it has not all come,
/// and `Some((2, None))` for the trailer that ends the data.
pub fn binary_tuple(
    buf: &[u8],
    columns: usize,
    fields: &mut Fields,
) -> Result<Option<(usize, bool)>> {
    fields.clear();
    let Some(count) = buf.get(..2) else {
        return Ok(None);
    };
    let count = i16::from_be_bytes([count[0], count[1]]);
    if count == -1 {
        return Ok(Some((2, false)));
    }
    if usize::try_from(count).ok() != Some(columns) {
        return Err(bad_format(format!(
            "row field count is {count}, expected {columns}"
        )));
    }
    let mut at = 2usize;
    for _ in 0..columns {
        let Some(len) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        at += 4;
        if len == -1 {
            fields.push(None);
            continue;
        }
        let len = usize::try_from(len).map_err(|_| bad_format("invalid field size"))?;
        if buf.len() < at.saturating_add(len) {
            return Ok(None);
        }
        fields.push(Some(at..at + len));
        at += len;
    }
    Ok(Some((at, true)))
}

/// The message of a carriage return outside quotes in CSV data.
pub const UNQUOTED_CR: &str = "unquoted carriage return found in data";

/// PostgreSQL's error for a carriage return (`cr`) or a line feed where the data's lines do
/// not end with one: the first line's end says how every line ends.
pub fn mixed_line_ends(csv: bool, cr: bool) -> Error {
    match (csv, cr) {
        (false, true) => bad_format("literal carriage return found in data")
            .with_hint("Use \"\\r\" to represent carriage return."),
        (false, false) => bad_format("literal newline found in data")
            .with_hint("Use \"\\n\" to represent newline."),
        (true, true) => {
            bad_format(UNQUOTED_CR).with_hint("Use quoted CSV field to represent carriage return.")
        }
        (true, false) => bad_format("unquoted newline found in data")
            .with_hint("Use quoted CSV field to represent newline."),
    }
}

/// A line that is not laid out as the format says (22P04).
pub fn bad_format(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::BadCopyFormat, message)
}

/// PostgreSQL's CONTEXT for an error in COPY data: the table, the line, and the column and
/// value where there is one, long text cut short as PostgreSQL cuts it.
pub fn context(table: &str, line: u64, column: Option<&str>, text: &[u8]) -> String {
    const SHOWN: usize = 100;
    let text = String::from_utf8_lossy(text);
    let shown = match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.into_owned(),
    };
    match column {
        Some(c) => format!("COPY {table}, line {line}, column {c}: \"{shown}\""),
        None => format!("COPY {table}, line {line}: \"{shown}\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &str, csv: bool) -> Result<Vec<Option<String>>> {
        let format = if csv {
            CopyFormat::csv()
        } else {
            CopyFormat::text()
        };
        let (mut scratch, mut fields) = (Vec::new(), Vec::new());
        if csv {
            csv_fields(line.as_bytes(), &format, &mut scratch, &mut fields)?;
        } else {
            text_fields(line.as_bytes(), &format, &mut scratch, &mut fields)?;
        }
        Ok(fields
            .into_iter()
            .map(|f| f.map(|r| String::from_utf8(scratch[r].to_vec()).unwrap()))
            .collect())
    }

    fn some(values: &[&str]) -> Vec<Option<String>> {
        values.iter().map(|v| Some(v.to_string())).collect()
    }

    #[test]
    fn text_fields_undo_postgres_escapes() {
        assert_eq!(
            split("1\ta\\tb\\\\c\\nd", false).unwrap(),
            some(&["1", "a\tb\\c\nd"])
        );
        assert_eq!(
            split("\\N\t\t\\101\\x41\\q", false).unwrap(),
            vec![None, Some(String::new()), Some("AAq".into())]
        );
        // An escaped delimiter is part of the value; `\N` inside a value is not NULL.
        assert_eq!(split("a\\\tb\tx\\N", false).unwrap(), some(&["a\tb", "xN"]));
    }

    #[test]
    fn csv_fields_read_quotes_as_postgres_does() {
        assert_eq!(
            split("1,\"a,b\",\"say \"\"hi\"\"\",,\"\"", true).unwrap(),
            vec![
                Some("1".into()),
                Some("a,b".into()),
                Some("say \"hi\"".into()),
                None,
                Some(String::new())
            ]
        );
        // A quote opens a quoted part anywhere in a field.
        assert_eq!(split("a\"b,c\"d", true).unwrap(), some(&["ab,cd"]));
        assert_eq!(
            split("\"two\nlines\"", true).unwrap(),
            some(&["two\nlines"])
        );
        let unterminated = split("1,\"open", true).unwrap_err();
        assert_eq!(unterminated.message, "unterminated CSV quoted field");
    }

    #[test]
    fn records_end_at_line_breaks_outside_quotes_and_escapes() {
        let format = CopyFormat::csv();
        let buf = b"1,\"a\nb\"\n2";
        let (mut scanned, mut quoted) = (0, false);
        assert_eq!(
            csv_record_end(&buf[..5], &mut scanned, &mut quoted, &format),
            None
        );
        assert!(quoted);
        assert_eq!(
            csv_record_end(buf, &mut scanned, &mut quoted, &format),
            Some(7)
        );
        let mut scanned = 0;
        assert_eq!(text_line_end(b"a\\\nb\\\\\nc", 0, &mut scanned), Some(6));
        let mut scanned = 0;
        assert_eq!(text_line_end(b"abc", 0, &mut scanned), None);
        assert_eq!(scanned, 3);
    }

    #[test]
    fn binary_tuples_are_read_whole_or_waited_for() {
        let mut fields = Vec::new();
        let tuple = [0, 2, 0, 0, 0, 1, 7, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(binary_tuple(&tuple[..6], 2, &mut fields).unwrap(), None);
        assert_eq!(
            binary_tuple(&tuple, 2, &mut fields).unwrap(),
            Some((11, true))
        );
        assert_eq!(fields, vec![Some(6..7), None]);
        assert_eq!(
            binary_tuple(&[0xff, 0xff], 2, &mut fields).unwrap(),
            Some((2, false))
        );
        assert!(binary_tuple(&tuple, 3, &mut fields).is_err());
        assert!(binary_header(b"PGCOPY\n\xfe").is_err());
        let header = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
        assert_eq!(binary_header(header).unwrap(), Some(19));
        assert_eq!(binary_header(&header[..15]).unwrap(), None);
    }
}
