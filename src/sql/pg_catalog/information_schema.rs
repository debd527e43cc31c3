//! The tables of `information_schema` (PostgreSQL 15's columns, in its order), built from
//! [`Relations`] as `pg_catalog`'s are.

use datafusion::arrow::array::RecordBatch;

use super::tables::{keyed, t, table, type_name, Build, V};
use super::{Relation, Relations, NAMESPACES, ROLE_NAME};
use crate::error::Result;

use V::{I, N};

/// `information_schema`'s tables.
pub const INFORMATION_SCHEMA_TABLES: &[(&str, Build)] = &[
    ("schemata", schemata),
    ("tables", is_tables),
    ("columns", is_columns),
    ("views", |_| table(IS_VIEWS, vec![])),
    ("table_constraints", table_constraints),
    ("key_column_usage", key_column_usage),
];

const IS_VIEWS: &str = "table_catalog table_schema table_name view_definition check_option \
    is_updatable is_insertable_into is_trigger_updatable is_trigger_deletable \
    is_trigger_insertable_into";

fn schemata(_: &Relations) -> Result<RecordBatch> {
    let rows = NAMESPACES
        .iter()
        .map(|(_, name)| vec![t(crate::DATABASE_NAME), t(*name), t(ROLE_NAME), N, N, N, N])
        .collect();
    table(
        "catalog_name schema_name schema_owner default_character_set_catalog \
         default_character_set_schema default_character_set_name sql_path",
        rows,
    )
}

/// The relations `information_schema` lists: tables and sources (PostgreSQL lists no
/// materialized views there).
fn listed(r: &Relations) -> impl Iterator<Item = &Relation> {
    r.relations
        .iter()
        .filter(|rel| matches!(rel.kind, 'r' | 'f'))
}

fn is_tables(r: &Relations) -> Result<RecordBatch> {
    let mut rows = Vec::new();
    for rel in listed(r) {
        rows.push(vec![
            t(crate::DATABASE_NAME),
            t("public"),
            t(rel.name.clone()),
            t(if rel.kind == 'r' {
                "BASE TABLE"
            } else {
                "FOREIGN"
            }),
            N,
            N,
            N,
            N,
            N,
            t(if rel.kind == 'r' { "YES" } else { "NO" }),
            t("NO"),
            N,
        ]);
    }
    table(
        "table_catalog table_schema table_name table_type self_referencing_column_name \
         reference_generation user_defined_type_catalog user_defined_type_schema \
         user_defined_type_name is_insertable_into is_typed commit_action",
        rows,
    )
}

fn is_columns(r: &Relations) -> Result<RecordBatch> {
    let mut rows = Vec::new();
    for rel in listed(r) {
        for (i, c) in rel.columns.iter().enumerate() {
            let udt = type_name(c.type_oid).unwrap_or("text");
            let data_type = super::format_type(c.type_oid, -1);
            let length = (c.type_oid == 1043 && c.typmod > 4).then(|| i64::from(c.typmod - 4));
            let (precision, scale) = match c.type_oid {
                1700 if c.typmod > 4 => (
                    Some(i64::from((c.typmod - 4) >> 16)),
                    Some(i64::from((c.typmod - 4) & 0xffff)),
                ),
                21 => (Some(16), Some(0)),
                23 => (Some(32), Some(0)),
                20 => (Some(64), Some(0)),
                700 => (Some(24), None),
                701 => (Some(53), None),
                _ => (None, None),
            };
            let radix = precision.map(|_| if c.type_oid == 1700 { 10 } else { 2 });
            let nullable = !(c.not_null || rel.primary_key.contains(&i));
            let int = |v: Option<i64>| v.map_or(N, I);
            rows.push(vec![
                t(crate::DATABASE_NAME),
                t("public"),
                t(rel.name.clone()),
                t(c.name.clone()),
                I(i as i64 + 1),
                N,
                t(if nullable { "YES" } else { "NO" }),
                t(data_type),
                int(length),
                int(length.map(|l| l * 4)),
                int(precision),
                int(radix),
                int(scale),
                int(matches!(c.type_oid, 1114 | 1184 | 1083).then_some(6)),
                t(crate::DATABASE_NAME),
                t("pg_catalog"),
                t(udt),
                t((i + 1).to_string()),
                t("NO"),
                t("NEVER"),
                t(if rel.kind == 'r' { "YES" } else { "NO" }),
            ]);
        }
    }
    table(
        "table_catalog table_schema table_name column_name ordinal_position:i4 \
         column_default is_nullable data_type character_maximum_length:i4 \
         character_octet_length:i4 numeric_precision:i4 numeric_precision_radix:i4 \
         numeric_scale:i4 datetime_precision:i4 udt_catalog udt_schema udt_name \
         dtd_identifier is_identity is_generated is_updatable",
        rows,
    )
}

/// A primary key's constraint (catalog, schema, name) and table (catalog, schema, name).
fn key_names(rel: &Relation) -> Vec<V> {
    vec![
        t(crate::DATABASE_NAME),
        t("public"),
        t(rel.index_name()),
        t(crate::DATABASE_NAME),
        t("public"),
        t(rel.name.clone()),
    ]
}

fn table_constraints(r: &Relations) -> Result<RecordBatch> {
    let rows = keyed(r)
        .map(|rel| {
            let mut row = key_names(rel);
            row.extend([t("PRIMARY KEY"), t("NO"), t("NO"), t("YES"), N]);
            row
        })
        .collect();
    table(
        "constraint_catalog constraint_schema constraint_name table_catalog table_schema \
         table_name constraint_type is_deferrable initially_deferred enforced nulls_distinct",
        rows,
    )
}

fn key_column_usage(r: &Relations) -> Result<RecordBatch> {
    let mut rows = Vec::new();
    for rel in keyed(r) {
        for (n, i) in rel.primary_key.iter().enumerate() {
            let Some(c) = rel.columns.get(*i) else {
                continue;
            };
            let mut row = key_names(rel);
            row.extend([t(c.name.clone()), I(n as i64 + 1), N]);
            rows.push(row);
        }
    }
    table(
        "constraint_catalog constraint_schema constraint_name table_catalog table_schema \
         table_name column_name ordinal_position:i4 position_in_unique_constraint:i4",
        rows,
    )
}
