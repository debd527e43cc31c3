//! Reads DDL statements into catalog definitions; no I/O.

use datafusion::sql::sqlparser::ast::{self, ColumnOption, TableConstraint};

use crate::catalog::{ColumnDef, Connector, ObjectId, SourceDef, TableDef, WatermarkDef};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::extensions::{Format, Include, Watermark};
use crate::types::SqlType;

/// An identifier as PostgreSQL folds it: unquoted names are lower-cased.
pub fn ident_name(id: &ast::Ident) -> String {
    if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_lowercase()
    }
}

/// The relation an object name refers to; only the `public` schema exists.
pub fn relation_name(name: &ast::ObjectName) -> Result<String> {
    let parts: Vec<&ast::Ident> = name.0.iter().filter_map(|p| p.as_ident()).collect();
    if parts.len() != name.0.len() || parts.is_empty() {
        return Err(Error::syntax(format!("invalid relation name {name}")));
    }
    match parts.as_slice() {
        [rel] => Ok(ident_name(rel)),
        [schema, rel] if ident_name(schema) == "public" => Ok(ident_name(rel)),
        [schema, _] => Err(Error::new(
            ErrorKind::UndefinedObject,
            format!("schema \"{}\" does not exist", ident_name(schema)),
        )),
        _ => Err(Error::not_supported(format!(
            "cross-database references are not implemented: {name}"
        ))),
    }
}

/// Reads `CREATE TABLE`; with `WITH (connector = ...)` a table fed by that connector
/// (`docs/design/0012-connector-tables.md`), which checks its options and the table's columns
/// and key (and may ask its upstream, as for a source).
pub fn create_table(
    ct: &ast::CreateTable,
    (watermark, format, include): (Option<&Watermark>, Option<&Format>, &[Include]),
    id: ObjectId,
) -> Result<TableDef> {
    if ct.query.is_some() || ct.like.is_some() || ct.clone.is_some() {
        return Err(
            Error::not_supported("CREATE TABLE AS and LIKE are not supported")
                .with_hint("Create the table, then INSERT INTO ... SELECT."),
        );
    }
    if ct.temporary || ct.external {
        return Err(Error::not_supported(
            "temporary and external tables are not supported",
        ));
    }
    let name = relation_name(&ct.name)?;
    let (mut columns, mut primary_key) = column_defs(&ct.columns, &name)?;
    for constraint in &ct.constraints {
        match constraint {
            TableConstraint::PrimaryKey(pk) => {
                if !primary_key.is_empty() {
                    return Err(multiple_primary_keys(&name));
                }
                primary_key = key_columns(&pk.columns, &columns)?;
            }
            other => {
                return Err(Error::not_supported(format!(
                    "table constraint {other} is not supported"
                )))
            }
        }
    }
    // Primary key columns are NOT NULL, as in PostgreSQL.
    for pos in &primary_key {
        columns[*pos].not_null = true;
    }
    let (connector_name, settings) = connector_options(ct, format, include)?;
    let connector = match connector_name {
        None => {
            if let Some((key, _)) = settings.first() {
                return Err(Error::not_supported(format!(
                    "table option \"{key}\" is not supported"
                ))
                .with_hint(
                    "A table fed by a connector names it: WITH (connector = 'kafka', ...).",
                ));
            }
            None
        }
        Some(connector_name) => {
            let connector = crate::connector::source::connector(&connector_name)?;
            let mut settings = crate::connector::source::Options::new(settings)?;
            let (kept, with_metadata) =
                connector.create(&mut settings, columns, Some(&primary_key))?;
            settings.finish()?;
            columns = with_metadata;
            Some(Connector::plain(connector.name(), kept))
        }
    };
    let watermark = watermark.map(|w| watermark_def(w, &columns)).transpose()?;
    Ok(TableDef {
        id,
        name,
        columns,
        primary_key,
        watermark,
        key_first: true,
        connector,
        reads: None,
        create_sql: None,
    })
}

/// A connector's name (where one is named) and its other options.
type ConnectorOptions = (Option<String>, Vec<(String, String)>);

/// A `CREATE TABLE` or `CREATE SOURCE`'s connector name and its other options: the `WITH`
/// options, the `FORMAT` clause's (`format`, `encode`) and the `INCLUDE` clauses'
/// (`include.<what>`).
fn connector_options(
    ct: &ast::CreateTable,
    format: Option<&Format>,
    include: &[Include],
) -> Result<ConnectorOptions> {
    let options = match &ct.table_options {
        ast::CreateTableOptions::None => &[][..],
        ast::CreateTableOptions::With(o) => o.as_slice(),
        _ => return Err(Error::not_supported("options other than WITH (...)")),
    };
    let mut settings: Vec<(String, String)> = Vec::new();
    let mut connector_name = None;
    for option in options {
        let ast::SqlOption::KeyValue { key, value } = option else {
            return Err(Error::not_supported(format!(
                "option {option} is not supported"
            )));
        };
        let text = option_text(value);
        match ident_name(key).as_str() {
            "connector" => connector_name = Some(text),
            key => settings.push((key.to_string(), text)),
        }
    }
    if let Some(f) = format {
        settings.push(("format".into(), f.format.clone()));
        settings.push(("encode".into(), f.encode.clone()));
    }
    for i in include {
        settings.push((
            format!("include.{}", i.what),
            i.name.clone().unwrap_or_default(),
        ));
    }
    Ok((connector_name, settings))
}

/// The connector a `CREATE TABLE` or `CREATE SOURCE` names, with its options as written
/// (before the connector reads them): what the server's files it names are checked on before
/// it opens any. `None` when no connector is named.
pub fn declared_connector(ct: &ast::CreateTable) -> Result<Option<Connector>> {
    let (name, settings) = connector_options(ct, None, &[])?;
    Ok(name.map(|name| Connector::plain(name, settings.into_iter().collect())))
}

/// A table's columns and the positions of the primary key its column constraints declare.
fn column_defs(declared: &[ast::ColumnDef], table: &str) -> Result<(Vec<ColumnDef>, Vec<usize>)> {
    let mut columns: Vec<ColumnDef> = Vec::new();
    let mut primary_key: Vec<usize> = Vec::new();
    for (pos, col) in declared.iter().enumerate() {
        let col_name = ident_name(&col.name);
        if columns.iter().any(|c| c.name == col_name) {
            return Err(Error::new(
                ErrorKind::DuplicateColumn,
                format!("column \"{col_name}\" specified more than once"),
            ));
        }
        let mut def = ColumnDef {
            name: col_name,
            ty: SqlType::from_ast(&col.data_type)?,
            not_null: false,
        };
        for opt in &col.options {
            match &opt.option {
                ColumnOption::Null => def.not_null = false,
                ColumnOption::NotNull => def.not_null = true,
                ColumnOption::PrimaryKey(_) => {
                    if !primary_key.is_empty() {
                        return Err(multiple_primary_keys(table));
                    }
                    primary_key.push(pos);
                }
                other => {
                    return Err(Error::not_supported(format!(
                        "column constraint {other} is not supported"
                    ))
                    .with_hint("Columns may be declared NULL, NOT NULL or PRIMARY KEY."))
                }
            }
        }
        columns.push(def);
    }
    if columns.is_empty() {
        return Err(Error::not_supported("tables must have at least one column"));
    }
    Ok((columns, primary_key))
}

/// The positions in `columns` of a `PRIMARY KEY (...)` constraint's columns.
fn key_columns(key: &[ast::IndexColumn], columns: &[ColumnDef]) -> Result<Vec<usize>> {
    let mut primary_key = Vec::new();
    for ic in key {
        let ast::Expr::Identifier(ident) = &ic.column.expr else {
            return Err(Error::not_supported(
                "primary keys are made of plain columns",
            ));
        };
        let col_name = ident_name(ident);
        let pos = columns
            .iter()
            .position(|c| c.name == col_name)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::UndefinedColumn,
                    format!("column \"{col_name}\" named in key does not exist"),
                )
            })?;
        if primary_key.contains(&pos) {
            return Err(Error::new(
                ErrorKind::DuplicateObject,
                format!("column \"{col_name}\" appears twice in primary key constraint"),
            ));
        }
        primary_key.push(pos);
    }
    Ok(primary_key)
}

/// A `WITH` option's value as text: a string's contents, a number or boolean as written.
pub fn option_text(value: &ast::Expr) -> String {
    match value {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) => s.clone(),
            ast::Value::Number(n, _) => n.to_string(),
            ast::Value::Boolean(b) => b.to_string(),
            _ => value.to_string(),
        },
        other => other.to_string(),
    }
}

/// Reads `CREATE SOURCE name [(columns, WATERMARK FOR ...)] WITH (connector = ..., ...)
/// [FORMAT ... ENCODE ...]`, the connector checking its options (and maybe asking its
/// upstream system: a Kafka broker for its partitions' offsets, off the async workers). A
/// Nexmark source's columns are its stream's; written out, they must be those.
pub fn create_source(
    ct: &ast::CreateTable,
    (watermark, format, include): (Option<&Watermark>, Option<&Format>, &[Include]),
    id: ObjectId,
) -> Result<SourceDef> {
    let name = relation_name(&ct.name)?;
    let (connector_name, settings) = connector_options(ct, format, include)?;
    let connector = crate::connector::source::connector(&connector_name.ok_or_else(|| {
        Error::new(ErrorKind::InvalidParameter, "a source needs a connector")
            .with_hint("Add WITH (connector = 'nexmark', stream = 'bid') or WITH (connector = 'file', path = '...').")
    })?)?;
    let declared = if ct.columns.is_empty() {
        Vec::new()
    } else {
        let mut plain = ct.clone();
        plain.table_options = ast::CreateTableOptions::None;
        let t = create_table(&plain, (None, None, &[]), id)?;
        if !t.primary_key.is_empty() {
            return Err(Error::not_supported("sources have no primary key")
                .with_hint("A source is an append-only stream; keep keys in a table or a view."));
        }
        t.columns
    };
    let mut settings = crate::connector::source::Options::new(settings)?;
    let (kept, columns) = connector.create(&mut settings, declared, None)?;
    settings.finish()?;
    let connector = Connector::plain(connector.name(), kept);
    let watermark = watermark.map(|w| watermark_def(w, &columns)).transpose()?;
    Ok(SourceDef {
        id,
        name,
        columns,
        watermark,
        connector,
        primary_key: Vec::new(),
        create_sql: None,
    })
}

/// Reads `WATERMARK FOR ts AS ts` or `... AS ts - INTERVAL '...'`.
fn watermark_def(w: &Watermark, columns: &[ColumnDef]) -> Result<WatermarkDef> {
    let bad = || bad_watermark(&w.expr.to_string());
    let (column, delay_us) = match &w.expr {
        ast::Expr::Identifier(c) => (c, 0),
        ast::Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::Minus,
            right,
        } => match left.as_ref() {
            ast::Expr::Identifier(c) => (
                c,
                crate::sql::windows::interval_nanos(right, "a watermark")? as i64 / 1000,
            ),
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    let name = ident_name(column);
    let position = columns.iter().position(|c| c.name == name).ok_or_else(|| {
        Error::new(
            ErrorKind::UndefinedColumn,
            format!("column \"{name}\" named in the watermark does not exist"),
        )
    })?;
    // Both are microseconds since 1970 in the same Arrow array type.
    if !matches!(
        columns[position].ty,
        SqlType::Timestamp | SqlType::Timestamptz
    ) {
        return Err(Error::new(
            ErrorKind::TypeMismatch,
            format!("the watermark column \"{name}\" must be a timestamp or timestamptz"),
        ));
    }
    Ok(WatermarkDef {
        column: position,
        delay_us,
    })
}

fn bad_watermark(text: &str) -> Error {
    Error::not_supported(format!("watermark {text} is not supported"))
        .with_hint("Write WATERMARK FOR ts AS ts - INTERVAL '5 seconds', on a timestamp column.")
}

fn multiple_primary_keys(table: &str) -> Error {
    Error::plan(format!(
        "multiple primary keys for table \"{table}\" are not allowed"
    ))
}

/// `sql` (a statement that created an object, with its connector's options) with the value
/// of every option in its `WITH (...)` that holds a secret replaced by `'********'`: an
/// option whose name has `password`, `secret` or `jaas` in it (`password`,
/// `secret_access_key`, `properties.sasl.password`). What SHOW CREATE shows.
pub fn redacted(sql: &str) -> String {
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        // Text that does not tokenize shows nothing of itself.
        return "********".to_string();
    };
    let mut out = String::with_capacity(sql.len());
    // Parentheses open, the depth of a `WITH (` options list while in one, and whether the
    // last word was `WITH`.
    let (mut depth, mut options, mut after_with) = (0usize, None, false);
    // The option name read since the list's `(` or last `,`, and whether `=` followed it.
    let mut key = String::new();
    let mut assigned = false;
    for token in tokens {
        let mut shown = None;
        match &token {
            Token::Whitespace(_) => {}
            Token::LParen => {
                depth += 1;
                if after_with && options.is_none() {
                    options = Some(depth);
                }
                key.clear();
                assigned = false;
            }
            Token::RParen => {
                if options == Some(depth) {
                    options = None;
                }
                depth = depth.saturating_sub(1);
            }
            _ if options != Some(depth) => {}
            Token::Comma => {
                key.clear();
                assigned = false;
            }
            Token::Eq => assigned = true,
            Token::Word(w) if !assigned => key.push_str(&w.value.to_lowercase()),
            Token::Period if !assigned => key.push('.'),
            Token::SingleQuotedString(k) if !assigned => key.push_str(&k.to_lowercase()),
            Token::SingleQuotedString(_) | Token::EscapedStringLiteral(_)
                if ["password", "secret", "jaas"]
                    .iter()
                    .any(|s| key.contains(s)) =>
            {
                shown = Some("'********'".to_string());
            }
            _ => {}
        }
        if !matches!(token, Token::Whitespace(_)) {
            after_with = matches!(&token, Token::Word(w) if w.value.eq_ignore_ascii_case("with"));
        }
        out.push_str(&shown.unwrap_or_else(|| token.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parser::{parse, Statement};

    #[test]
    fn secrets_in_options_are_redacted_and_the_rest_kept() {
        let sql = "CREATE SOURCE s WITH (connector = 'postgres-cdc', hostname = 'db', \
                   password = 'it''s', properties.sasl.password='p', \
                   \"secret_access_key\" = E'k\\n', username = 'u')";
        assert_eq!(
            redacted(sql),
            "CREATE SOURCE s WITH (connector = 'postgres-cdc', hostname = 'db', \
             password = '********', properties.sasl.password='********', \
             \"secret_access_key\" = '********', username = 'u')"
        );
        // Only options are secrets: a query's constants stay.
        for plain in [
            "CREATE TABLE t (id int PRIMARY KEY, password text DEFAULT 'x')",
            "CREATE SINK k AS WITH c AS (SELECT 1) SELECT * FROM u WHERE password = 'p' \
             WITH (connector = 'blackhole')",
        ] {
            assert_eq!(redacted(plain), plain);
        }
    }

    fn table(sql: &str) -> Result<TableDef> {
        let p = parse(sql).unwrap().remove(0);
        let Statement::CreateTable {
            table,
            watermark,
            format,
            include,
            ..
        } = p.statement
        else {
            panic!()
        };
        create_table(&table, (watermark.as_deref(), format.as_ref(), &include), 1)
    }

    #[test]
    fn reads_columns_keys_and_not_null() {
        let t = table("CREATE TABLE Orders (id int, \"Qty\" numeric(10,2) NOT NULL, note text, PRIMARY KEY (id))").unwrap();
        assert_eq!(t.name, "orders");
        assert_eq!(t.primary_key, vec![0]);
        assert!(t.columns[0].not_null && t.columns[1].not_null && !t.columns[2].not_null);
        assert_eq!(t.columns[1].name, "Qty");
        let types: Vec<String> = t.columns.iter().map(|c| c.ty.to_string()).collect();
        assert_eq!(types, ["integer", "numeric(10,2)", "text"]);
    }

    #[test]
    fn refuses_what_it_cannot_keep() {
        assert_eq!(
            table("CREATE TABLE t (a int DEFAULT 1)").unwrap_err().kind,
            ErrorKind::NotSupported
        );
        assert_eq!(
            table("CREATE TABLE t (a int, a int)").unwrap_err().kind,
            ErrorKind::DuplicateColumn
        );
        assert_eq!(
            table("CREATE TABLE t (a int PRIMARY KEY, b int PRIMARY KEY)")
                .unwrap_err()
                .kind,
            ErrorKind::Plan
        );
        assert_eq!(
            table("CREATE TABLE t (a int, PRIMARY KEY (b))")
                .unwrap_err()
                .kind,
            ErrorKind::UndefinedColumn
        );
    }
}
