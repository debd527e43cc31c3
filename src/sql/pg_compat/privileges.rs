//! `has_table_privilege` and its kin, answered from the same decision the statements' checks
//! use (`catalog::Grants`) over a query's copy of the catalog's grants: what GUI tools ask to
//! show only what a user may read.

use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::error::Result as DfResult;

use super::functions::{any, as_text, external, f, to_bool, CatalogFn};
use crate::catalog::{Privilege, RoleDef};
use crate::error::ErrorKind;
use crate::sql::pg_catalog::{Relations, CATALOG_TABLES, FIRST_USER_OID};

/// What a function asks about: a relation (and, for the column functions, a column), or a
/// schema.
#[derive(Clone, Copy)]
enum On {
    Relation { columns: bool },
    Schema,
}

pub(super) fn privilege_functions(relations: &Arc<Relations>) -> Vec<CatalogFn> {
    let asking = |on: On| {
        let r = relations.clone();
        move |v: &[ScalarValue]| decide(&r, v, on)
    };
    let relation = On::Relation { columns: false };
    let columns = On::Relation { columns: true };
    vec![
        f(
            "has_table_privilege",
            any(),
            2..=3,
            to_bool,
            asking(relation),
        ),
        f(
            "has_any_column_privilege",
            any(),
            2..=3,
            to_bool,
            asking(relation),
        ),
        f(
            "has_column_privilege",
            any(),
            3..=4,
            to_bool,
            asking(columns),
        ),
        f(
            "has_schema_privilege",
            any(),
            2..=3,
            to_bool,
            asking(On::Schema),
        ),
        // Every role may connect to the one database and create temporary tables, which
        // Weir does not have.
        f("has_database_privilege", any(), 2..=3, to_bool, |_| {
            Ok(ScalarValue::Boolean(Some(true)))
        }),
    ]
}

/// The privileges a text names (`'SELECT, insert WITH GRANT OPTION'`), as PostgreSQL reads
/// it; `None` stands for those Weir has no grants of (TRUNCATE, REFERENCES, TRIGGER), which
/// only owners hold.
fn named(text: &str, on: On) -> DfResult<Vec<Option<Privilege>>> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let word = part.trim().to_uppercase();
        let word = word
            .strip_suffix(" WITH GRANT OPTION")
            .unwrap_or(&word)
            .trim();
        let p = match (word, on) {
            ("SELECT", On::Relation { .. }) => Some(Privilege::Select),
            ("INSERT", On::Relation { .. }) => Some(Privilege::Insert),
            ("UPDATE", On::Relation { .. }) => Some(Privilege::Update),
            ("DELETE", On::Relation { columns: false }) => Some(Privilege::Delete),
            ("REFERENCES", On::Relation { .. }) => None,
            ("TRUNCATE" | "TRIGGER", On::Relation { columns: false }) => None,
            ("USAGE", On::Schema) => Some(Privilege::Usage),
            ("CREATE", On::Schema) => Some(Privilege::Create),
            _ => {
                return Err(external(
                    ErrorKind::InvalidParameter,
                    &format!("unrecognized privilege type: \"{}\"", part.trim()),
                ))
            }
        };
        out.push(p);
    }
    Ok(out)
}

/// The role a function asks about: by name or OID, or the session's.
fn role<'a>(r: &'a Relations, v: Option<&ScalarValue>) -> DfResult<Option<&'a RoleDef>> {
    let session = || r.backend.as_ref().map(|b| b.start.user.clone());
    let Some(v) = v else {
        return Ok(session().and_then(|name| r.roles.iter().find(|x| x.name == name)));
    };
    if let Some(name) = as_text(v) {
        let name = name.trim().to_string();
        return match r.roles.iter().find(|x| x.name == name) {
            Some(role) => Ok(Some(role)),
            None if name == "public" => Ok(None),
            None => Err(external(
                ErrorKind::UndefinedObject,
                &format!("role \"{name}\" does not exist"),
            )),
        };
    }
    let oid = v.cast_to(&datafusion::arrow::datatypes::DataType::Int64)?;
    Ok(match oid {
        ScalarValue::Int64(Some(oid)) => r.roles.iter().find(|x| i64::from(x.oid) == oid),
        _ => None,
    })
}

fn decide(r: &Relations, v: &[ScalarValue], on: On) -> DfResult<ScalarValue> {
    if v.iter().any(ScalarValue::is_null) {
        return Ok(ScalarValue::Boolean(None));
    }
    let objects = match on {
        On::Relation { columns: true } => 2,
        _ => 1,
    };
    let Some((privilege, rest)) = v.split_last() else {
        return Ok(ScalarValue::Boolean(None));
    };
    let (user, object) = match rest.len() - objects {
        0 => (None, &rest[0]),
        _ => (Some(&rest[0]), &rest[1]),
    };
    let wanted = named(&as_text(privilege).unwrap_or_default(), on)?;
    let public = RoleDef::new(crate::catalog::PUBLIC, "public", false);
    let role = role(r, user)?.unwrap_or(&public);
    let grants = r.grants();
    let held = match on {
        On::Schema => match as_text(object).map(|s| s.trim().to_string()).as_deref() {
            Some("public") => (wanted.iter().flatten()).any(|p| grants.holds_on_schema(role, *p)),
            Some("pg_catalog" | "information_schema" | "weir_catalog") => {
                wanted.contains(&Some(Privilege::Usage)) || role.superuser
            }
            Some(other) => {
                return Err(external(
                    ErrorKind::UndefinedObject,
                    &format!("schema \"{other}\" does not exist"),
                ))
            }
            None => return Ok(ScalarValue::Boolean(None)),
        },
        On::Relation { .. } => {
            let relation = match as_text(object) {
                Some(name) => match r.by_name(&name) {
                    Some(rel) => Some(rel),
                    None if is_catalog_table(&name) => {
                        let reads = wanted.contains(&Some(Privilege::Select));
                        return Ok(ScalarValue::Boolean(Some(reads || role.superuser)));
                    }
                    None => {
                        return Err(external(
                            ErrorKind::UndefinedTable,
                            &format!("relation \"{name}\" does not exist"),
                        ))
                    }
                },
                None => super::functions::as_oid(object).and_then(|oid| r.by_oid(oid)),
            };
            let Some(relation) = relation else {
                return Ok(ScalarValue::Boolean(None));
            };
            let id = relation.oid.wrapping_sub(FIRST_USER_OID);
            wanted.iter().any(|p| match p {
                Some(p) => grants.holds(role, id, *p),
                None => grants.owns(role, id),
            })
        }
    };
    Ok(ScalarValue::Boolean(Some(held)))
}

/// Whether `name` is one of the system tables, which every role may read: a name in one of
/// the system schemas, or a `pg_catalog` table's unqualified.
fn is_catalog_table(name: &str) -> bool {
    match name.trim().rsplit_once('.') {
        Some((schema, _)) => {
            matches!(schema, "pg_catalog" | "information_schema" | "weir_catalog")
        }
        None => CATALOG_TABLES.iter().any(|(t, _)| *t == name.trim()),
    }
}
