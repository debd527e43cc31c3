//! Reads DDL statements into catalog definitions; no I/O.

use datafusion::sql::sqlparser::ast::{self, ColumnOption, TableConstraint};

use crate::catalog::{ColumnDef, ObjectId, TableDef};
use crate::error::{Error, ErrorKind, Result};
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

pub fn create_table(ct: &ast::CreateTable, id: ObjectId) -> Result<TableDef> {
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
    let mut columns: Vec<ColumnDef> = Vec::new();
    let mut primary_key: Vec<usize> = Vec::new();
    for (pos, col) in ct.columns.iter().enumerate() {
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
                        return Err(multiple_primary_keys(&name));
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
    for constraint in &ct.constraints {
        match constraint {
            TableConstraint::PrimaryKey(pk) => {
                if !primary_key.is_empty() {
                    return Err(multiple_primary_keys(&name));
                }
                for ic in &pk.columns {
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
                            format!(
                                "column \"{col_name}\" appears twice in primary key constraint"
                            ),
                        ));
                    }
                    primary_key.push(pos);
                }
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
    Ok(TableDef {
        id,
        name,
        columns,
        primary_key,
    })
}

fn multiple_primary_keys(table: &str) -> Error {
    Error::plan(format!(
        "multiple primary keys for table \"{table}\" are not allowed"
    ))
}

/// `CREATE TABLE` text for a table, as `SHOW CREATE TABLE` would print it.
pub fn table_sql(t: &TableDef) -> String {
    let mut parts: Vec<String> = t
        .columns
        .iter()
        .map(|c| {
            let nn = if c.not_null && !t.primary_key.iter().any(|p| t.columns[*p].name == c.name) {
                " NOT NULL"
            } else {
                ""
            };
            format!("{} {}{nn}", c.name, c.ty)
        })
        .collect();
    if !t.primary_key.is_empty() {
        let cols: Vec<&str> = t
            .primary_key
            .iter()
            .map(|p| t.columns[*p].name.as_str())
            .collect();
        parts.push(format!("PRIMARY KEY ({})", cols.join(", ")));
    }
    format!("CREATE TABLE {} ({})", t.name, parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parser::{parse, Statement};

    fn table(sql: &str) -> Result<TableDef> {
        let p = parse(sql).unwrap().remove(0);
        let Statement::Sql(s) = p.statement else {
            panic!()
        };
        let ast::Statement::CreateTable(ct) = *s else {
            panic!()
        };
        create_table(&ct, 1)
    }

    #[test]
    fn reads_columns_keys_and_not_null() {
        let t = table("CREATE TABLE Orders (id int, \"Qty\" numeric(10,2) NOT NULL, note text, PRIMARY KEY (id))").unwrap();
        assert_eq!(t.name, "orders");
        assert_eq!(t.primary_key, vec![0]);
        assert!(t.columns[0].not_null && t.columns[1].not_null && !t.columns[2].not_null);
        assert_eq!(t.columns[1].name, "Qty");
        assert_eq!(
            table_sql(&t),
            "CREATE TABLE orders (id integer, Qty numeric(10,2) NOT NULL, note text, PRIMARY KEY (id))"
        );
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
