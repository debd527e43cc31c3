//! COPY's data on the wire: rows as lines of PostgreSQL's text format or CSV, one CopyData
//! message a line, as PostgreSQL's `COPY ... TO STDOUT` writes them.

use std::fmt::Debug;

use datafusion::arrow::array::RecordBatch;
use futures::{stream, Sink, SinkExt, StreamExt};
use pgwire::api::results::{CopyResponse, Response, Tag};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyOutResponse};
use pgwire::messages::PgWireBackendMessage;

use super::encode::text_value;
use super::handler::to_pgwire;
use crate::db::{CopyFormat, RowStream};
use crate::error::Result;

/// The response of `COPY ... TO STDOUT`: the header line where asked, then each row's line,
/// one batch encoded at a time, when the client is ready for it.
pub fn response(columns: Vec<String>, rows: RowStream, format: CopyFormat) -> Response {
    let header = format
        .header
        .then(|| Ok(CopyData::new(header(&columns, &format).into())));
    let lines = rows.flat_map(move |batch| match batch.and_then(|b| lines(&b, &format)) {
        Ok(lines) => {
            stream::iter(lines.into_iter().map(|line| Ok(CopyData::new(line.into())))).left_stream()
        }
        Err(e) => stream::once(async { Err(to_pgwire(e)) }).right_stream(),
    });
    Response::CopyOut(CopyResponse::new(
        0,
        columns.len(),
        stream::iter(header).chain(lines),
    ))
}

/// Sends `COPY ... TO STDOUT`'s data as PostgreSQL does: CopyOutResponse, a CopyData a line,
/// CopyDone and `COPY n` (n the rows: the lines after the `header` ones); a line that cannot
/// be computed ends it with the error instead (the lines before it sent).
pub async fn send<C>(
    client: &mut C,
    mut copy: CopyResponse,
    header: usize,
) -> PgWireResult<Option<Box<ErrorInfo>>>
where
    C: Sink<PgWireBackendMessage> + Unpin,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let formats = copy.column_formats();
    client
        .feed(PgWireBackendMessage::CopyOutResponse(CopyOutResponse::new(
            copy.format,
            i16::try_from(copy.columns).unwrap_or(i16::MAX),
            formats,
        )))
        .await?;
    let mut lines: usize = 0;
    loop {
        // What is ready goes out before Weir waits for more (a subscription's next epoch).
        let next = match futures::poll!(copy.data_stream().next()) {
            std::task::Poll::Ready(next) => next,
            std::task::Poll::Pending => {
                client.flush().await?;
                copy.data_stream().next().await
            }
        };
        let Some(line) = next else { break };
        match line {
            Ok(data) => {
                client.feed(PgWireBackendMessage::CopyData(data)).await?;
                lines += 1;
            }
            Err(PgWireError::UserError(info)) => return Ok(Some(info)),
            Err(e) => return Err(e),
        }
    }
    client
        .feed(PgWireBackendMessage::CopyDone(CopyDone::new()))
        .await?;
    let tag = Tag::new("COPY").with_rows(lines.saturating_sub(header));
    client
        .feed(PgWireBackendMessage::CommandComplete(tag.into()))
        .await?;
    Ok(None)
}

/// Each row of `batch` as a line in `format`.
pub fn lines(batch: &RecordBatch, format: &CopyFormat) -> Result<Vec<Vec<u8>>> {
    let single = batch.num_columns() == 1;
    let mut value = Vec::new();
    (0..batch.num_rows())
        .map(|row| {
            let mut line = Vec::new();
            for (c, array) in batch.columns().iter().enumerate() {
                if c > 0 {
                    line.push(format.delimiter);
                }
                value.clear();
                if text_value(array, row, &mut value)? {
                    field(&value, format, single, &mut line);
                } else {
                    line.extend_from_slice(format.null.as_bytes());
                }
            }
            line.push(b'\n');
            Ok(line)
        })
        .collect()
}

/// The header line: the columns' names as values.
pub fn header(columns: &[String], format: &CopyFormat) -> Vec<u8> {
    let mut line = Vec::new();
    for (c, name) in columns.iter().enumerate() {
        if c > 0 {
            line.push(format.delimiter);
        }
        field(name.as_bytes(), format, columns.len() == 1, &mut line);
    }
    line.push(b'\n');
    line
}

/// Appends a value that is not NULL: in text, backslash, control characters and the
/// delimiter escaped with a backslash; in CSV, quoted (a quote or escape character inside
/// preceded by the escape) where it holds the delimiter, a quote, a line break, reads as the
/// NULL string, or is `\.` alone on its line.
fn field(value: &[u8], format: &CopyFormat, single: bool, out: &mut Vec<u8>) {
    if format.csv {
        let quote = value == format.null.as_bytes()
            || (single && value == b"\\.")
            || value.iter().any(|b| {
                matches!(*b, b'\n' | b'\r') || *b == format.delimiter || *b == format.quote
            });
        if !quote {
            out.extend_from_slice(value);
            return;
        }
        out.push(format.quote);
        for b in value {
            if *b == format.quote || *b == format.escape {
                out.push(format.escape);
            }
            out.push(*b);
        }
        out.push(format.quote);
        return;
    }
    for b in value {
        match *b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\x0b' => out.extend_from_slice(b"\\v"),
            d if d == format.delimiter => {
                out.push(b'\\');
                out.push(d);
            }
            other => out.push(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
    use std::sync::Arc;

    fn format(csv: bool) -> CopyFormat {
        if csv {
            CopyFormat::csv()
        } else {
            CopyFormat::text()
        }
    }

    fn batch() -> RecordBatch {
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(4)]));
        let texts: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a\tb\\c\nd"),
            Some(""),
            None,
            Some("say \"hi\", then\r\\."),
        ]));
        RecordBatch::try_from_iter(vec![("id", ids), ("t", texts)]).unwrap()
    }

    fn text(lines: Vec<Vec<u8>>) -> String {
        String::from_utf8(lines.concat()).unwrap()
    }

    #[test]
    fn text_lines_escape_what_postgres_escapes() {
        assert_eq!(
            text(lines(&batch(), &format(false)).unwrap()),
            "1\ta\\tb\\\\c\\nd\n\\N\t\n3\t\\N\n4\tsay \"hi\", then\\r\\\\.\n"
        );
    }

    #[test]
    fn csv_lines_quote_what_postgres_quotes() {
        assert_eq!(
            text(lines(&batch(), &format(true)).unwrap()),
            "1,\"a\tb\\c\nd\"\n,\"\"\n3,\n4,\"say \"\"hi\"\", then\r\\.\"\n"
        );
        assert_eq!(
            String::from_utf8(header(&["id".into(), "a,b".into()], &format(true))).unwrap(),
            "id,\"a,b\"\n"
        );
    }
}
