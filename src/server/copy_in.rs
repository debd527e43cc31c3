//! `COPY ... FROM STDIN`: the client's COPY data read into rows of the table as it arrives,
//! in PostgreSQL's text format, CSV or binary, and written as one statement at CopyDone.
//!
//! Lines (CSV records, binary tuples) are read as soon as they are whole; one split across
//! CopyData messages waits in a buffer, whose scan goes on where it stopped, so that a long
//! value costs one pass. Values are gathered per column as text and cast to the column's type
//! `BATCH_ROWS` rows at a time (binary ones are decoded one by one). A malformed line ends the
//! COPY at once with PostgreSQL's error and the line in its CONTEXT; nothing is written
//! before the data's end, so a COPY that fails applies nothing. The rows of one COPY are one
//! statement, spooled to disk when they are many, as an INSERT's are (`table::Gather`).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::StringBuilder;
use datafusion::arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::ScalarValue;
use futures::{Sink, SinkExt};
use pgwire::api::copy::CopyHandler;
use pgwire::api::results::{CopyResponse, Tag};
use pgwire::api::ClientInfo;
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::response::TransactionStatus;
use pgwire::messages::PgWireBackendMessage;
use tokio::sync::Mutex;

use super::copy_fields::{self as fields, bad_format, context, Fields};
use super::encode::decode_binary_param;
use super::handler::to_pgwire;
use crate::db::{CopyFrom, Output};
use crate::error::{Error, ErrorKind, Result};
use crate::session::{BlockState, Session};
use crate::table::{Gather, TempDisk};
use crate::types::SqlType;

/// Rows read before their values are cast to the columns' types together.
const BATCH_ROWS: usize = 8192;

/// A `COPY ... FROM STDIN` in progress: the data not yet read, and the rows read so far.
pub struct CopyIn {
    from: CopyFrom,
    schema: SchemaRef,
    /// Bytes received and not yet read: the start of a line whose end has not come.
    buf: Vec<u8>,
    /// How far the first line of `buf` has been scanned for its end, and (CSV) whether that
    /// point is inside quotes.
    scanned: usize,
    quoted: bool,
    /// The number of the line being read (PostgreSQL counts the header, a CSV record or a
    /// binary tuple as one line).
    line: u64,
    /// The header line is still to be skipped (text, CSV), or the binary file header read.
    header: bool,
    /// The end of the data was read (`\.`, a binary trailer): whatever follows is ignored.
    ended: bool,
    /// A NOT NULL column the COPY gives no value for, if any: every row is NULL there.
    missing_not_null: Option<usize>,
    /// Whether lines end with `\r\n` (or `\n`), as the first line's does.
    crlf: Option<bool>,
    /// The most bytes a line may have.
    line_max: usize,
    rows: Rows,
    gathered: Gather,
    scratch: Vec<u8>,
    fields: Fields,
}

/// The rows of the batch being read: each given column's values as text (text and CSV) or
/// as values (binary), and the line each row came from.
#[derive(Default)]
struct Rows {
    text: Vec<StringBuilder>,
    values: Vec<Vec<ScalarValue>>,
    lines: Vec<u64>,
}

impl CopyIn {
    /// A COPY into `from`, of lines of at most `line_max` bytes, spooling its rows into
    /// a temporary file of `temp` when they are many.
    pub fn new(from: CopyFrom, line_max: usize, temp: &Arc<TempDisk>) -> CopyIn {
        let given = from.columns.len();
        let header = from.format.header || from.format.binary;
        let columns = &from.table.columns;
        let missing_not_null =
            (0..columns.len()).find(|c| columns[*c].not_null && !from.columns.contains(c));
        CopyIn {
            schema: from.table.schema(),
            buf: Vec::new(),
            scanned: 0,
            quoted: false,
            line: 0,
            header,
            ended: false,
            missing_not_null,
            crlf: None,
            line_max,
            rows: Rows {
                text: (0..given).map(|_| StringBuilder::new()).collect(),
                values: vec![Vec::new(); given],
                lines: Vec::new(),
            },
            gathered: Gather::new(from.table.schema(), temp, from.parts),
            scratch: Vec::new(),
            fields: Vec::new(),
            from,
        }
    }

    /// What the client is told to send: the format and how many columns.
    pub fn response(&self) -> CopyResponse {
        let format = i8::from(self.from.format.binary);
        CopyResponse::new(format, self.from.columns.len(), futures::stream::empty())
    }

    /// Reads a CopyData message's bytes: every line they complete.
    pub fn push(&mut self, data: &[u8]) -> Result<()> {
        if self.ended {
            return Ok(());
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.extend_from_slice(data);
        let start = self.read(&buf)?;
        buf.drain(..start);
        self.scanned = self.scanned.saturating_sub(start);
        if buf.len() > self.line_max {
            return Err(Error::new(
                ErrorKind::ProgramLimitExceeded,
                format!("a COPY line is longer than {} bytes", self.line_max),
            )
            .with_context(self.at_next_line()));
        }
        self.buf = buf;
        Ok(())
    }

    /// The COPY stopped by a CancelRequest while its data came: what the client is told.
    pub fn cancelled(&self) -> Error {
        Error::new(
            ErrorKind::QueryCanceled,
            "canceling statement due to user request",
        )
        .with_context(self.at_next_line())
    }

    /// `COPY t, line n` for the line being read, whose end has not come.
    fn at_next_line(&self) -> String {
        format!("COPY {}, line {}", self.from.table.name, self.line + 1)
    }

    /// Reads the whole lines at the start of `buf`; returns where the rest begins.
    fn read(&mut self, buf: &[u8]) -> Result<usize> {
        let mut start = 0;
        while !self.ended {
            if self.from.format.binary {
                match self.binary(&buf[start..])? {
                    Some(len) => start += len,
                    None => break,
                }
                self.scanned = start;
                continue;
            }
            let end = if self.from.format.csv {
                fields::csv_record_end(buf, &mut self.scanned, &mut self.quoted, &self.from.format)
            } else {
                fields::text_line_end(buf, start, &mut self.scanned)
            };
            let Some(end) = end else { break };
            self.line(&buf[start..end], true)?;
            start = end + 1;
            self.scanned = start;
        }
        Ok(start)
    }

    /// Reads one text line or CSV record, without its line break (`terminated`: it had one).
    fn line(&mut self, line: &[u8], terminated: bool) -> Result<()> {
        self.line += 1;
        let crlf = line.last() == Some(&b'\r');
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let format = &self.from.format;
        let at_line = |e: Error| {
            let table = &self.from.table.name;
            e.with_context(format!("COPY {table}, line {}", self.line))
        };
        if line == b"\\." {
            self.ended = true;
            return Ok(());
        }
        if terminated && *self.crlf.get_or_insert(crlf) != crlf {
            return Err(at_line(fields::mixed_line_ends(format.csv, crlf)));
        }
        if !format.csv && line.contains(&b'\r') {
            return Err(at_line(fields::mixed_line_ends(false, true)));
        }
        if std::mem::take(&mut self.header) {
            return Ok(());
        }
        let split = if format.csv {
            fields::csv_fields(line, format, &mut self.scratch, &mut self.fields)
        } else {
            fields::text_fields(line, format, &mut self.scratch, &mut self.fields)
        };
        let at = |e: Error| e.with_context(context(&self.from.table.name, self.line, None, line));
        split.map_err(|e| match e.message == fields::UNQUOTED_CR {
            true => at_line(e),
            false => at(e),
        })?;
        self.check_count(self.fields.len()).map_err(at)?;
        for (k, field) in self.fields.iter().enumerate() {
            let column = &self.from.table.columns[self.from.columns[k]];
            if field.is_none() && column.not_null {
                return Err(at(self.null_in(&column.name)));
            }
        }
        if let Some(column) = self.missing_not_null {
            return Err(at(self.null_in(&self.from.table.columns[column].name)));
        }
        // The values, checked whole before any of them is kept (so that the columns stay
        // aligned): each is valid UTF-8 where all of them together are and each starts and
        // ends on a character's boundary.
        let values = std::str::from_utf8(&self.scratch).map_err(|e| e.valid_up_to());
        let values = match values {
            Ok(all) => self
                .fields
                .iter()
                .map(|f| match f {
                    Some(range) => all.get(range.clone()).map(Some).ok_or(range.start),
                    None => Ok(None),
                })
                .collect::<std::result::Result<Vec<_>, usize>>(),
            Err(at) => Err(at),
        };
        let values = values.map_err(|bad| {
            let byte = self.scratch.get(bad).copied().unwrap_or(0);
            at(Error::new(
                ErrorKind::InvalidEncoding,
                format!("invalid byte sequence for encoding \"UTF8\": 0x{byte:02x}"),
            ))
        })?;
        for (builder, value) in self.rows.text.iter_mut().zip(values) {
            builder.append_option(value);
        }
        self.rows.lines.push(self.line);
        if self.rows.lines.len() >= BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    /// PostgreSQL's error for a NULL in a NOT NULL column.
    fn null_in(&self, column: &str) -> Error {
        Error::new(
            ErrorKind::NotNullViolation,
            format!(
                "null value in column \"{column}\" of relation \"{}\" violates not-null \
                 constraint",
                self.from.table.name
            ),
        )
    }

    /// Refuses a line with more or fewer values than the COPY's columns.
    fn check_count(&self, count: usize) -> Result<()> {
        let columns = &self.from.columns;
        if count > columns.len() {
            return Err(bad_format("extra data after last expected column"));
        }
        match columns.get(count) {
            Some(missing) => Err(bad_format(format!(
                "missing data for column \"{}\"",
                self.from.table.columns[*missing].name
            ))),
            None => Ok(()),
        }
    }

    /// Reads the binary file header or one tuple at the start of `buf`: how many bytes it
    /// took, or `None` when it has not all come.
    fn binary(&mut self, buf: &[u8]) -> Result<Option<usize>> {
        if self.header {
            let read = fields::binary_header(buf)?;
            if read.is_some() {
                self.header = false;
            }
            return Ok(read);
        }
        let columns = self.from.columns.len();
        let Some((len, row)) = fields::binary_tuple(buf, columns, &mut self.fields)
            .map_err(|e| e.with_context(self.binary_context(None)))?
        else {
            return Ok(None);
        };
        self.line += 1;
        if !row {
            self.ended = true;
            return Ok(Some(len));
        }
        if let Some(column) = self.missing_not_null {
            let e = self.null_in(&self.from.table.columns[column].name);
            return Err(e.with_context(self.binary_context(None)));
        }
        for (k, field) in self.fields.iter().enumerate() {
            let column = &self.from.table.columns[self.from.columns[k]];
            let value = match field {
                None if column.not_null => {
                    let e = self.null_in(&column.name);
                    return Err(e.with_context(self.binary_context(Some(&column.name))));
                }
                None => ScalarValue::try_from(&column.ty.to_arrow())?,
                Some(range) => binary_value(column.ty, &buf[range.clone()])
                    .map_err(|e| e.with_context(self.binary_context(Some(&column.name))))?,
            };
            self.rows.values[k].push(value);
        }
        self.rows.lines.push(self.line);
        if self.rows.lines.len() >= BATCH_ROWS {
            self.flush()?;
        }
        Ok(Some(len))
    }

    fn binary_context(&self, column: Option<&str>) -> String {
        let table = &self.from.table.name;
        match column {
            Some(c) => format!("COPY {table}, line {}, column {c}", self.line),
            None => format!("COPY {table}, line {}", self.line + 1),
        }
    }

    /// The rows read so far become a batch of the table's columns (NULL where the COPY gives
    /// none), each value cast to its column's type.
    fn flush(&mut self) -> Result<()> {
        let rows = self.rows.lines.len();
        if rows == 0 {
            return Ok(());
        }
        let mut columns: Vec<ArrayRef> = self
            .schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), rows))
            .collect();
        for (k, &c) in self.from.columns.iter().enumerate() {
            let column = &self.from.table.columns[c];
            let target = column.ty.to_arrow();
            columns[c] = if self.from.format.binary {
                let values = std::mem::take(&mut self.rows.values[k]);
                ScalarValue::iter_to_array(values)?
            } else {
                let text = self.rows.text[k].finish();
                let (table, lines) = (&self.from.table.name, &self.rows.lines);
                typed(&text, column.ty, &target, |row| {
                    let value = text.value(row).as_bytes();
                    context(table, lines[row], Some(&column.name), value)
                })?
            };
        }
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.gathered.push(batch)?;
        self.rows.lines.clear();
        Ok(())
    }

    /// The end of the data: its last line (text may end without a line break), and every row
    /// read.
    pub fn finish(mut self) -> Result<(CopyFrom, crate::table::Rows)> {
        if !self.ended && !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            if self.from.format.binary {
                return Err(bad_format("unexpected EOF in COPY data")
                    .with_context(self.binary_context(None)));
            }
            if self.quoted {
                self.line += 1;
                return Err(
                    bad_format("unterminated CSV quoted field").with_context(context(
                        &self.from.table.name,
                        self.line,
                        None,
                        &rest,
                    )),
                );
            }
            self.line(&rest, false)?;
        }
        if self.from.format.binary && self.header {
            return Err(bad_format("COPY file signature not recognized"));
        }
        self.flush()?;
        Ok((self.from, self.gathered.finish()?))
    }
}

/// A column of text values cast to `target` (the type of a column declared `ty`), or
/// PostgreSQL's error for the first value that is not one, with the CONTEXT `at` gives its
/// row.
fn typed(
    text: &StringArray,
    ty: SqlType,
    target: &DataType,
    at: impl Fn(usize) -> String,
) -> Result<ArrayRef> {
    if *target == DataType::Utf8 {
        return Ok(Arc::new(text.clone()));
    }
    // PostgreSQL's interval and date spellings in the forms Arrow reads.
    let normalize: Option<fn(&str) -> Option<String>> = match ty {
        SqlType::Interval => Some(crate::types::normalize_interval_text),
        SqlType::Date => Some(crate::types::normalize_date_text),
        _ => None,
    };
    let input: StringArray = match normalize {
        Some(f) => text
            .iter()
            .map(|v| v.map(|v| f(v).unwrap_or_else(|| v.to_string())))
            .collect(),
        None => text.clone(),
    };
    let options = CastOptions {
        safe: true,
        ..Default::default()
    };
    let cast = |input: &StringArray| cast_with_options(input, target, &options);
    let mut out = cast(&input)?;
    if out.null_count() != input.null_count() {
        // PostgreSQL reads numbers, booleans and times with blanks around them.
        let trimmed: StringArray = input.iter().map(|v| v.map(str::trim)).collect();
        out = cast(&trimmed)?;
    }
    if out.null_count() == input.null_count() {
        return Ok(out);
    }
    let row = (0..input.len())
        .find(|r| input.is_valid(*r) && out.is_null(*r))
        .unwrap_or(0);
    Err(bad_value(ty, text.value(row)).with_context(at(row)))
}

/// PostgreSQL's error for text that is not a value of type `ty`.
fn bad_value(ty: SqlType, text: &str) -> Error {
    if matches!(
        ty,
        SqlType::Date | SqlType::Timestamp | SqlType::Timestamptz
    ) && numeric_date(text)
    {
        return Error::new(
            ErrorKind::DatetimeFieldOverflow,
            format!("date/time field value out of range: \"{text}\""),
        );
    }
    let name = match ty {
        SqlType::Numeric { .. } => "numeric".to_string(),
        SqlType::Timestamp => "timestamp".to_string(),
        other => other.to_string(),
    };
    if !out_of_range(ty, text) {
        return invalid_syntax(ty, &name, text);
    }
    match ty {
        SqlType::Numeric { .. } => {
            Error::new(ErrorKind::NumericOutOfRange, "numeric field overflow")
        }
        _ => Error::new(
            ErrorKind::NumericOutOfRange,
            format!("value \"{text}\" is out of range for type {name}"),
        ),
    }
}

/// PostgreSQL's error for text that is not a value of the type named `name` (of `ty`).
fn invalid_syntax(ty: SqlType, name: &str, text: &str) -> Error {
    let kind = match ty {
        SqlType::Date | SqlType::Timestamp | SqlType::Timestamptz | SqlType::Interval => {
            ErrorKind::InvalidDatetimeFormat
        }
        _ => ErrorKind::InvalidText,
    };
    Error::new(
        kind,
        format!("invalid input syntax for type {name}: \"{text}\""),
    )
}

/// Whether `text` starts with a date written in numbers (`2024-13-01`): one that does not
/// read has a field out of its range.
fn numeric_date(text: &str) -> bool {
    let mut parts = text.trim().splitn(3, '-');
    let mut number = |max: usize| {
        parts
            .next()
            .is_some_and(|p| (1..=max).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
    };
    let (year, month) = (number(4), number(2));
    let day = parts.next().is_some_and(|p| {
        let digits = p.bytes().take_while(u8::is_ascii_digit).count();
        (1..=2).contains(&digits) && !p[digits..].starts_with(|c: char| c.is_ascii_digit())
    });
    year && month && day
}

/// Whether `text` is a number, too large for `ty`.
fn out_of_range(ty: SqlType, text: &str) -> bool {
    let t = text.trim();
    match ty {
        SqlType::SmallInt | SqlType::Integer | SqlType::BigInt => {
            let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        }
        SqlType::Numeric { .. } => t.parse::<f64>().is_ok_and(f64::is_finite),
        _ => false,
    }
}

/// A binary COPY field of a column declared `ty`, as its value.
fn binary_value(ty: SqlType, bytes: &[u8]) -> Result<ScalarValue> {
    let bad = || Error::new(ErrorKind::InvalidBinary, "incorrect binary data format");
    let value = decode_binary_param(ty.pg_oid(), bytes).map_err(|_| bad())?;
    let target = ty.to_arrow();
    if value.data_type() == target {
        return Ok(value);
    }
    // A numeric's own scale, to the column's.
    value
        .cast_to(&target)
        .map_err(|_| Error::new(ErrorKind::NumericOutOfRange, "numeric field overflow"))
}

/// The COPY protocol's messages, for the connection's COPY in progress.
pub(super) struct Copies {
    pub(super) session: Arc<Mutex<Option<Session>>>,
    pub(super) copying: Arc<std::sync::Mutex<Option<CopyIn>>>,
}

impl Copies {
    pub(super) fn take(&self) -> Option<CopyIn> {
        self.copying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The COPY failed: it is forgotten, the session's block fails with it, and the client is
    /// told the block's state with the error.
    pub(super) async fn failed<C: ClientInfo>(&self, client: &mut C, e: Error) -> PgWireError {
        self.take();
        let mut guard = self.session.lock().await;
        if let Some(session) = guard.as_mut() {
            session.fail();
            client.set_transaction_status(status(session.block_state()));
        }
        to_pgwire(e)
    }
}

fn status(state: BlockState) -> TransactionStatus {
    match state {
        BlockState::Open => TransactionStatus::Transaction,
        BlockState::Failed => TransactionStatus::Error,
        BlockState::Idle => TransactionStatus::Idle,
    }
}

#[async_trait]
impl CopyHandler for Copies {
    async fn on_copy_data<C>(&self, client: &mut C, data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let read = match self
            .copying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            Some(copy) => copy.push(&data.data),
            None => Ok(()),
        };
        match read {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failed(client, e).await),
        }
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(copy) = self.take() else {
            return Ok(());
        };
        let (from, rows) = match copy.finish() {
            Ok(read) => read,
            Err(e) => return Err(self.failed(client, e).await),
        };
        let mut guard = self.session.lock().await;
        let Some(session) = guard.as_mut() else {
            return Err(to_pgwire(Error::internal("COPY data without a session")));
        };
        let written = session.copy_rows(&from, rows).await;
        client.set_transaction_status(status(session.block_state()));
        drop(guard);
        match written {
            Ok(Output::Command { tag, rows }) => {
                let tag = Tag::new(&tag).with_rows(rows.unwrap_or(0));
                client
                    .send(PgWireBackendMessage::CommandComplete(tag.into()))
                    .await?;
                Ok(())
            }
            Ok(_) => Err(to_pgwire(Error::internal("COPY answered with rows"))),
            Err(e) => Err(to_pgwire(e)),
        }
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let e = Error::new(
            ErrorKind::QueryCanceled,
            format!("COPY from stdin failed: {}", fail.message),
        );
        self.failed(client, e).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ColumnDef, TableDef};
    use crate::db::CopyFormat;
    use datafusion::arrow::array::AsArray;

    fn copy(format: CopyFormat) -> CopyIn {
        let column = |name: &str, ty, not_null| ColumnDef {
            name: name.into(),
            ty,
            not_null,
        };
        let table = TableDef {
            id: 1,
            name: "t".into(),
            columns: vec![
                column("id", SqlType::BigInt, true),
                column("s", SqlType::Text, false),
                column("d", SqlType::Date, false),
            ],
            primary_key: vec![],
            watermark: None,
            key_first: true,
            connector: None,
            reads: None,
            create_sql: None,
        };
        CopyIn::new(
            CopyFrom {
                table,
                columns: vec![0, 1, 2],
                format,
                parts: crate::table::PartSize::WHOLE,
            },
            1 << 20,
            &TempDisk::new(&std::env::temp_dir(), u64::MAX).unwrap(),
        )
    }

    #[test]
    fn lines_split_across_messages_are_read_whole() {
        let mut c = copy(CopyFormat::text());
        for part in [
            "1\ta",
            "b\t2024-01-0",
            "2\n2\t\\N\t\\N\n3",
            "\tx\t 2024-03-01 \n",
        ] {
            c.push(part.as_bytes()).unwrap();
        }
        let (_, rows) = c.finish().unwrap();
        let rows = rows.into_memory().unwrap();
        assert_eq!(rows.num_rows(), 3);
        assert_eq!(rows.column(1).as_string::<i32>().value(0), "ab");
        assert!(rows.column(2).is_null(1));
        assert!(rows.column(2).is_valid(2));
    }

    #[test]
    fn a_bad_value_names_its_line_and_column() {
        let mut c = copy(CopyFormat::csv());
        c.push(b"1,a,2024-01-01\n2,b,2024-01-02\nthree,c,2024-01-03\n")
            .unwrap();
        let Err(e) = c.finish() else {
            panic!("a bad value was read")
        };
        assert_eq!(e.kind, ErrorKind::InvalidText);
        assert_eq!(e.message, "invalid input syntax for type bigint: \"three\"");
        assert_eq!(
            e.context.as_deref(),
            Some("COPY t, line 3, column id: \"three\"")
        );
        let mut c = copy(CopyFormat::csv());
        let e = c.push(b"1,a,2024-01-01\n2,b\n").unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadCopyFormat);
        assert_eq!(e.message, "missing data for column \"d\"");
        assert_eq!(e.context.as_deref(), Some("COPY t, line 2: \"2,b\""));
    }

    #[test]
    fn a_line_longer_than_the_limit_is_refused_before_it_ends() {
        let mut c = copy(CopyFormat::text());
        c.push(b"1\t").unwrap();
        let e = c.push(&vec![b'a'; (1 << 20) + 1]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::ProgramLimitExceeded);
        assert_eq!(e.context.as_deref(), Some("COPY t, line 1"));
    }

    #[test]
    fn nulls_in_not_null_columns_and_the_end_marker() {
        let mut c = copy(CopyFormat::text());
        let e = c.push(b"1\ta\t\\N\n\\N\ta\t\\N\n").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotNullViolation);
        assert_eq!(
            e.context.as_deref(),
            Some("COPY t, line 2: \"\\N\ta\t\\N\"")
        );
        // Bytes that are not UTF-8, also where each value's bytes would be in one string.
        for bad in [&b"1\t\\xff\t\\N\n"[..], b"1\t\\xc3\t\\xa9\n"] {
            let e = copy(CopyFormat::text()).push(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidEncoding);
        }
        let mut c = copy(CopyFormat::text());
        c.push(b"1\ta\t\\N\n\\.\nignored\n").unwrap();
        assert_eq!(c.finish().unwrap().1.num_rows(), 1);
    }
}
