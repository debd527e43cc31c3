//! `COPY ... TO STDOUT`: which rows (a query's, or a table's or view's columns) and in what
//! format, read from the statement's options as PostgreSQL reads them.

use datafusion::sql::sqlparser::ast::{
    self, CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, Statement as Ast,
};

use datafusion::common::ParamValues;

use super::Session;
use crate::db::{CopyFormat, Output, RowStream};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::Subscribe;

impl Session {
    /// `COPY source TO STDOUT`: the query's rows, as the server sends them in `format`.
    pub(super) async fn copy_out(
        &self,
        source: &CopySource,
        options: &[CopyOption],
        legacy: &[CopyLegacyOption],
        params: Option<&ParamValues>,
    ) -> Result<Output> {
        let format = format(options, legacy)?;
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
        let format = format(options, legacy_options)?;
        let output = self.bounded(self.db.subscribe(sub, self.scope())).await?;
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

/// The format `options` (`WITH (FORMAT csv, HEADER, ...)`) or the older `legacy` ones
/// (`CSV HEADER`) ask for.
pub fn format(options: &[CopyOption], legacy: &[CopyLegacyOption]) -> Result<CopyFormat> {
    let mut csv = false;
    let mut delimiter = None;
    let mut null = None;
    let mut header = false;
    for option in options {
        match option {
            CopyOption::Format(f) => match f.value.to_lowercase().as_str() {
                "text" => csv = false,
                "csv" => csv = true,
                "binary" => return Err(unsupported("COPY in binary format")),
                other => {
                    return Err(Error::new(
                        ErrorKind::InvalidParameter,
                        format!("COPY format \"{other}\" not recognized"),
                    ))
                }
            },
            CopyOption::Delimiter(c) => delimiter = Some(*c),
            CopyOption::Null(n) => null = Some(n.clone()),
            CopyOption::Header(h) => header = *h,
            other => return Err(unsupported(&format!("COPY option {other}"))),
        }
    }
    for option in legacy {
        match option {
            CopyLegacyOption::Csv(opts) => {
                csv = true;
                for o in opts {
                    match o {
                        CopyLegacyCsvOption::Header => header = true,
                        other => return Err(unsupported(&format!("COPY option {other}"))),
                    }
                }
            }
            CopyLegacyOption::Delimiter(c) => delimiter = Some(*c),
            CopyLegacyOption::Null(n) => null = Some(n.clone()),
            CopyLegacyOption::Binary => return Err(unsupported("COPY in binary format")),
            other => return Err(unsupported(&format!("COPY option {other}"))),
        }
    }
    let delimiter = delimiter.unwrap_or(if csv { ',' } else { '\t' });
    // PostgreSQL's checks: one single-byte character, which cannot also start or be part of
    // what the format gives a meaning to.
    let byte = u8::try_from(u32::from(delimiter))
        .ok()
        .filter(u8::is_ascii)
        .ok_or_else(|| {
            Error::not_supported("COPY delimiter must be a single one-byte character")
        })?;
    if matches!(byte, b'\r' | b'\n') {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            "COPY delimiter cannot be newline or carriage return",
        ));
    }
    if csv && byte == b'"' {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            "COPY delimiter and quote must be different",
        ));
    }
    if !csv && (byte == b'\\' || byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'.')
    {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("COPY delimiter cannot be \"{delimiter}\""),
        ));
    }
    let null = null.unwrap_or_else(|| if csv { String::new() } else { "\\N".into() });
    if null.contains(['\r', '\n']) {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            "COPY null representation cannot use newline or carriage return",
        ));
    }
    if null.contains(delimiter) {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            "COPY delimiter must not appear in the NULL specification",
        ));
    }
    Ok(CopyFormat {
        csv,
        delimiter: byte,
        null,
        header,
    })
}

fn unsupported(what: &str) -> Error {
    Error::not_supported(format!("{what} is not supported"))
}

/// A COPY that is not `TO STDOUT`.
pub fn refused(to: bool, target: &ast::CopyTarget) -> Error {
    match (to, target) {
        (false, _) => unsupported("COPY FROM"),
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
                    ..
                } => format(options, legacy_options).map_or(0, |f| usize::from(f.header)),
                _ => 0,
            }
        }
        _ => 0,
    }
}
