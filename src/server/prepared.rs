//! Parse and Bind: a statement parsed and described once (its parameters' types and result
//! columns), and a portal's parameters decoded into the values the statement expects.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{ParamValues, ScalarValue};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::results::FieldInfo;
use pgwire::api::stmt::QueryParser;
use pgwire::api::{ClientInfo, Type};
use pgwire::error::PgWireResult;
use tokio::sync::Mutex;

use super::encode::decode_binary_param;
use super::handler::{check_size, no_session, to_pgwire};
use super::respond::{field_infos, pg_type};
use crate::db::Database;
use crate::error::{Error, ErrorKind, Result};
use crate::session::Session;
use crate::sql::{parse, Parsed};
use crate::types::pg_type_of;

/// A statement prepared by Parse: parsed and described once.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// `None` for an empty statement.
    pub(super) parsed: Option<Parsed>,
    pub(super) parameters: Vec<DataType>,
    pub(super) columns: Option<SchemaRef>,
}

impl Prepared {
    /// The RowDescription fields of the statement's result (none for a command).
    pub(super) fn fields(&self, format: Option<&Format>) -> Vec<FieldInfo> {
        match &self.columns {
            Some(schema) => field_infos(schema, format),
            None => vec![],
        }
    }
}

pub struct StatementParser {
    pub(super) session: Arc<Mutex<Option<Session>>>,
    pub(super) db: Arc<Database>,
}

#[async_trait]
impl QueryParser for StatementParser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let mut guard = self.session.lock().await;
        let session = guard.as_mut().ok_or_else(no_session)?;
        let prepared = prepare(&self.db, session, sql).await;
        if prepared.is_err() {
            // As in PostgreSQL, a statement that fails to parse fails the block.
            session.fail();
        }
        prepared.map_err(to_pgwire)
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(stmt.parameters.iter().map(pg_type).collect())
    }

    fn get_result_schema(
        &self,
        stmt: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        Ok(stmt.fields(format))
    }
}

/// Parses and describes a Parse message's statement.
async fn prepare(db: &Database, session: &Session, sql: &str) -> Result<Option<Prepared>> {
    check_size(db, sql)?;
    let mut parsed = parse(sql)?;
    if parsed.len() > 1 {
        return Err(Error::syntax(
            "cannot insert multiple commands into a prepared statement",
        ));
    }
    let Some(parsed) = parsed.pop() else {
        return Ok(None);
    };
    let description = session.describe(&parsed).await?;
    Ok(Some(Prepared {
        parsed: Some(parsed),
        parameters: description.parameters,
        columns: description.columns,
    }))
}

/// Decodes a portal's parameters into scalars of the types the statement expects.
pub(super) fn bind_parameters(portal: &Portal<Prepared>) -> Result<Option<ParamValues>> {
    let prepared = &portal.statement.statement;
    let expected = &prepared.parameters;
    if portal.parameters.len() != expected.len() {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!(
                "bind message supplies {} parameters, but prepared statement requires {}",
                portal.parameters.len(),
                expected.len()
            ),
        ));
    }
    if expected.is_empty() {
        return Ok(None);
    }
    let mut values = Vec::with_capacity(expected.len());
    for (i, (bytes, target)) in portal.parameters.iter().zip(expected).enumerate() {
        let client_type = portal
            .statement
            .parameter_types
            .get(i)
            .cloned()
            .flatten()
            .filter(|t| *t != Type::UNKNOWN);
        let value = match bytes {
            None => ScalarValue::try_from(target)?,
            Some(b) if portal.parameter_format.is_binary(i) => {
                let oid = client_type
                    .map(|t| t.oid())
                    .unwrap_or(pg_type_of(target).oid);
                decode_binary_param(oid, b)?
            }
            Some(b) => {
                let text = std::str::from_utf8(b).map_err(|_| {
                    Error::new(ErrorKind::InvalidText, "invalid UTF-8 in parameter")
                })?;
                // PostgreSQL's interval text (`'04:05:06'`) and a date followed by a zone
                // (`'2024-03-01 +00'`) in the forms Arrow reads.
                let normalized = match target {
                    DataType::Interval(_) => crate::types::normalize_interval_text(text),
                    DataType::Date32 => crate::types::normalize_date_text(text),
                    _ => None,
                };
                ScalarValue::Utf8(Some(normalized.unwrap_or_else(|| text.to_string())))
            }
        };
        let value = if value.data_type() == *target {
            value
        } else {
            value.cast_to(target).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidText,
                    format!(
                        "invalid input for parameter ${} of type {}",
                        i + 1,
                        pg_type_of(target).name
                    ),
                )
            })?
        };
        values.push(value);
    }
    Ok(Some(ParamValues::from(values)))
}
