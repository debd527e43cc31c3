//! `COPY ... TO STDOUT`: which rows (a query's, or a table's or view's columns) and in what
//! format, read from the statement's options as PostgreSQL reads them.

use datafusion::sql::sqlparser::ast::{
    self, CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, Statement as Ast,
};

use datafusion::common::ParamValues;

use crate::table::{PartSize, Rows};

use super::Session;
use crate::db::{CopyFormat, CopyFrom, Output, RowStream};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::{ident_name, relation_name, Subscribe};

impl Session {
    /// `COPY source TO STDOUT`: the query's rows, as the server sends them in `format`.
    pub(super) async fn copy_out(
        &self,
        source: &CopySource,
        options: &[CopyOption],
        legacy: &[CopyLegacyOption],
        params: Option<&ParamValues>,
    ) -> Result<Output> {
        let format = format(options, legacy, false)?;
        let query = query(source)?;
        crate::sql::check_supported(&query)?;
        let (schema, rows): (_, RowStream) = match self.query(&query, params).await? {
            Output::Stream { schema, rows } => (schema, rows),
            Output::Rows { schema, batches } => (
                schema,
                Box::pin(futures::stream::iter(batches.into_iter().map(Ok))),
            ),
            _ => return Err(Error::internal("COPY's query gave no rows")),
        };
        Ok(Output::CopyOut {
            columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
            rows,
            format,
        })
    }
}

impl Session {
    /// `COPY t [(columns)] FROM STDIN`: the table and columns the client's data fills, checked
    /// before the data is asked for.
    pub(super) fn copy_in(
        &self,
        source: &CopySource,
        options: &[CopyOption],
        legacy: &[CopyLegacyOption],
    ) -> Result<Output> {
        let format = format(options, legacy, true)?;
        let CopySource::Table {
            table_name,
            columns,
        } = source
        else {
            return Err(Error::syntax("COPY (query) FROM is not supported")
                .with_hint("COPY FROM fills a table: COPY t [(columns)] FROM STDIN."));
        };
        let name = relation_name(table_name)?;
        let table = self.db.copy_target(&name, &self.settings, self.scope())?;
        let mut given = Vec::with_capacity(columns.len());
        for column in columns {
            let wanted = ident_name(column);
            let Some(i) = table.columns.iter().position(|c| c.name == wanted) else {
                return Err(Error::new(
                    ErrorKind::UndefinedColumn,
                    format!("column \"{wanted}\" of relation \"{name}\" does not exist"),
                ));
            };
            if given.contains(&i) {
                return Err(Error::new(
                    ErrorKind::DuplicateColumn,
                    format!("column \"{wanted}\" specified more than once"),
                ));
            }
            given.push(i);
        }
        if given.is_empty() {
            given = (0..table.columns.len()).collect();
        }
        Ok(Output::CopyIn(Box::new(CopyFrom {
            table,
            columns: given,
            format,
            parts: PartSize::within(self.settings.statement_mem()?),
        })))
    }

    /// Writes the rows a `COPY ... FROM STDIN` read, as one statement: in the session's block
    /// if one is open (which fails if they cannot be written).
    pub async fn copy_rows(&mut self, from: &CopyFrom, rows: Rows) -> Result<Output> {
        let block = match &mut self.transaction {
            super::Transaction::Open(b) => Some(b),
            _ => None,
        };
        let written = self.db.copy_rows(&from.table, rows, block).await;
        if written.is_err() {
            self.fail();
        }
        Ok(Output::Command {
            tag: "COPY".into(),
            rows: Some(written?),
        })
    }
}

impl Session {
    /// `COPY (SUBSCRIBE ...) TO STDOUT`: the subscription's rows as COPY data, as they come.
    pub(super) async fn copy_subscribe(&self, sub: &Subscribe, copy: &Ast) -> Result<Output> {
        let Ast::Copy {
            to: true,
            target: ast::CopyTarget::Stdout,
            options,
            legacy_options,
            ..
        } = copy
        else {
            return match copy {
                Ast::Copy { to, target, .. } => Err(refused(*to, target)),
                _ => Err(Error::internal(
                    "COPY (SUBSCRIBE ...) read as another statement",
                )),
            };
        };
        let format = format(options, legacy_options, false)?;
        let output = self
            .bounded(self.db.subscribe(sub, &self.settings, self.scope()))
            .await?;
        let Output::Stream { schema, rows } = output else {
            return Err(Error::internal("a subscription gave no rows"));
        };
        Ok(Output::CopyOut {
            columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
            rows,
            format,
        })
    }
}

/// The query whose rows `COPY source TO STDOUT` sends.
pub fn query(source: &CopySource) -> Result<Ast> {
    match source {
        CopySource::Query(q) => Ok(Ast::Query(q.clone())),
        CopySource::Table {
            table_name,
            columns,
        } => {
            let columns = if columns.is_empty() {
                "*".to_string()
            } else {
                columns
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let sql = format!("SELECT {columns} FROM {table_name}");
            match crate::sql::parse(&sql)?.pop().map(|p| p.statement) {
                Some(crate::sql::Statement::Sql(stmt)) => Ok(*stmt),
                _ => Err(Error::internal(format!(
                    "COPY's query did not parse: {sql}"
                ))),
            }
        }
    }
}

/// The options a COPY statement gives, as written.
#[derive(Default)]
struct Given {
    kind: String,
    delimiter: Option<char>,
    null: Option<String>,
    quote: Option<char>,
    escape: Option<char>,
    header: bool,
}

impl Given {
    fn read(options: &[CopyOption], legacy: &[CopyLegacyOption]) -> Result<Given> {
        let mut given = Given {
            kind: "text".into(),
            ..Given::default()
        };
        for option in options {
            match option {
                CopyOption::Format(f) => given.kind = f.value.to_lowercase(),
                CopyOption::Delimiter(c) => given.delimiter = Some(*c),
                CopyOption::Null(n) => given.null = Some(n.clone()),
                CopyOption::Header(h) => given.header = *h,
                CopyOption::Quote(c) => given.quote = Some(*c),
                CopyOption::Escape(c) => given.escape = Some(*c),
                CopyOption::Encoding(e)
                    if matches!(e.to_lowercase().as_str(), "utf8" | "utf-8") => {}
                other => return Err(unsupported(&format!("COPY option {other}"))),
            }
        }
        for option in legacy {
            match option {
                CopyLegacyOption::Csv(opts) => {
                    given.kind = "csv".into();
                    for o in opts {
                        match o {
                            CopyLegacyCsvOption::Header => given.header = true,
                            CopyLegacyCsvOption::Quote(c) => given.quote = Some(*c),
                            CopyLegacyCsvOption::Escape(c) => given.escape = Some(*c),
                            other => return Err(unsupported(&format!("COPY option {other}"))),
                        }
                    }
                }
                CopyLegacyOption::Delimiter(c) => given.delimiter = Some(*c),
                CopyLegacyOption::Null(n) => given.null = Some(n.clone()),
                CopyLegacyOption::Binary => given.kind = "binary".into(),
                other => return Err(unsupported(&format!("COPY option {other}"))),
            }
        }
        Ok(given)
    }
}

/// The format `options` (`WITH (FORMAT csv, HEADER, ...)`) or the older `legacy` ones
/// (`CSV HEADER`) ask for, of a `COPY ... FROM` (`from`) or `TO`, checked as PostgreSQL
/// checks them.
pub fn format(
    options: &[CopyOption],
    legacy: &[CopyLegacyOption],
    from: bool,
) -> Result<CopyFormat> {
    let given = Given::read(options, legacy)?;
    let Given {
        kind,
        delimiter,
        null,
        quote,
        escape,
        header,
    } = given;
    let (csv, binary) = match kind.as_str() {
        "text" => (false, false),
        "csv" => (true, false),
        "binary" if from => (false, true),
        "binary" => return Err(unsupported("COPY TO in binary format")),
        other => {
            return Err(invalid(format!("COPY format \"{other}\" not recognized")));
        }
    };
    if binary {
        for (given, what) in [
            (delimiter.is_some(), "DELIMITER"),
            (null.is_some(), "NULL"),
            (header, "HEADER"),
        ] {
            if given {
                return Err(Error::syntax(format!(
                    "cannot specify {what} in BINARY mode"
                )));
            }
        }
    }
    if !csv && (quote.is_some() || escape.is_some()) {
        let what = if quote.is_some() { "quote" } else { "escape" };
        return Err(
            unsupported(&format!("COPY {what} available only in CSV mode"))
                .with_hint("Use FORMAT csv."),
        );
    }
    let defaults = if csv {
        CopyFormat::csv()
    } else {
        CopyFormat::text()
    };
    let delimiter = delimiter.map_or(Ok(defaults.delimiter), |c| one_byte(c, "delimiter"))?;
    let quote = quote.map_or(Ok(defaults.quote), |c| one_byte(c, "quote"))?;
    let escape = escape.map_or(Ok(quote), |c| one_byte(c, "escape"))?;
    // PostgreSQL's checks: a delimiter cannot also start or be part of what the format gives
    // a meaning to.
    if matches!(delimiter, b'\r' | b'\n') {
        return Err(invalid(
            "COPY delimiter cannot be newline or carriage return",
        ));
    }
    if csv && delimiter == quote {
        return Err(invalid("COPY delimiter and quote must be different"));
    }
    if !csv
        && (delimiter == b'\\'
            || delimiter.is_ascii_lowercase()
            || delimiter.is_ascii_digit()
            || delimiter == b'.')
    {
        return Err(invalid(format!(
            "COPY delimiter cannot be \"{}\"",
            char::from(delimiter)
        )));
    }
    let null = null.unwrap_or(defaults.null);
    if null.contains(['\r', '\n']) {
        return Err(invalid(
            "COPY null representation cannot use newline or carriage return",
        ));
    }
    if null.as_bytes().contains(&delimiter) {
        return Err(invalid(
            "COPY delimiter must not appear in the NULL specification",
        ));
    }
    if csv && null.as_bytes().contains(&quote) {
        return Err(invalid(
            "CSV quote character must not appear in the NULL specification",
        ));
    }
    Ok(CopyFormat {
        csv,
        binary,
        delimiter,
        null,
        header,
        quote,
        escape,
    })
}

/// A COPY option's character, which must be one single-byte character.
fn one_byte(c: char, what: &str) -> Result<u8> {
    u8::try_from(u32::from(c))
        .ok()
        .filter(u8::is_ascii)
        .ok_or_else(|| {
            Error::not_supported(format!("COPY {what} must be a single one-byte character"))
        })
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidParameter, message)
}

fn unsupported(what: &str) -> Error {
    Error::not_supported(format!("{what} is not supported"))
}

/// A COPY that is not `TO STDOUT`.
pub fn refused(to: bool, target: &ast::CopyTarget) -> Error {
    match (to, target) {
        (false, _) => Error::not_supported(format!("COPY FROM {target} is not supported"))
            .with_hint("COPY ... FROM STDIN reads the rows from the client (psql's \\copy reads them from a file)."),
        (true, _) => Error::not_supported(format!("COPY TO {target} is not supported"))
            .with_hint("COPY ... TO STDOUT sends the rows to the client (psql's \\copy writes them to a file)."),
    }
}

/// How many header lines `stmt` sends if it is a `COPY ... TO STDOUT` (for its `COPY n`).
pub fn header_lines(stmt: &crate::sql::Statement) -> usize {
    match stmt {
        crate::sql::Statement::Sql(s) | crate::sql::Statement::CopySubscribe { copy: s, .. } => {
            match s.as_ref() {
                Ast::Copy {
                    options,
                    legacy_options,
                    to: true,
                    ..
                } => format(options, legacy_options, false).map_or(0, |f| usize::from(f.header)),
                _ => 0,
            }
        }
        _ => 0,
    }
}
