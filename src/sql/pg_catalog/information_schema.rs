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

const IS_VIEWS: &str = "table_catalog:name table_schema:name table_name:name view_definition:varchar check_option:varchar \
    is_updatable:varchar is_insertable_into:varchar is_trigger_updatable:varchar is_trigger_deletable:varchar \
    is_trigger_insertable_into:varchar";

fn schemata(_: &Relations) -> Result<RecordBatch> {
    let rows = NAMESPACES
        .iter()
        .map(|(_, name)| vec![t(crate::DATABASE_NAME), t(*name), t(ROLE_NAME), N, N, N, N])
        .collect();
    table(
        "catalog_name:name schema_name:name schema_owner:name default_character_set_catalog:name \
         default_character_set_schema:name default_character_set_name:name sql_path:varchar",
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
        "table_catalog:name table_schema:name table_name:name table_type:varchar self_referencing_column_name:name \
         reference_generation:varchar user_defined_type_catalog:name user_defined_type_schema:name \
         user_defined_type_name:name is_insertable_into:varchar is_typed:varchar commit_action:varchar",
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
                // Interval fields, character set, collation and domain: none.
                N,
                N,
                N,
                N,
                N,
                N,
                N,
                N,
                N,
                N,
                N,
                t(crate::DATABASE_NAME),
                t("pg_catalog"),
                t(udt),
                // Scope and cardinality (of reference and array types): none.
                N,
                N,
                N,
                N,
                t((i + 1).to_string()),
                t("NO"),
                // Identity columns: none.
                t("NO"),
                N,
                N,
                N,
                N,
                N,
                t("NO"),
                t("NEVER"),
                N,
                t(if rel.kind == 'r' { "YES" } else { "NO" }),
            ]);
        }
    }
    table(
        "table_catalog:name table_schema:name table_name:name column_name:name ordinal_position:i4 \
         column_default:varchar is_nullable:varchar data_type:varchar character_maximum_length:i4 \
         character_octet_length:i4 numeric_precision:i4 numeric_precision_radix:i4 \
         numeric_scale:i4 datetime_precision:i4 interval_type:varchar interval_precision:i4 \
         character_set_catalog:name character_set_schema:name character_set_name:name \
         collation_catalog:name collation_schema:name collation_name:name domain_catalog:name \
         domain_schema:name domain_name:name udt_catalog:name udt_schema:name udt_name:name \
         scope_catalog:name scope_schema:name scope_name:name maximum_cardinality:i4 \
         dtd_identifier:name is_self_referencing:varchar is_identity:varchar \
         identity_generation:varchar identity_start:varchar identity_increment:varchar \
         identity_maximum:varchar identity_minimum:varchar identity_cycle:varchar \
         is_generated:varchar generation_expression:varchar is_updatable:varchar",
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
        "constraint_catalog:name constraint_schema:name constraint_name:name table_catalog:name table_schema:name \
         table_name:name constraint_type:varchar is_deferrable:varchar initially_deferred:varchar enforced:varchar nulls_distinct:varchar",
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
        "constraint_catalog:name constraint_schema:name constraint_name:name table_catalog:name table_schema:name \
         table_name:name column_name:name ordinal_position:i4 position_in_unique_constraint:i4",
        rows,
    )
}
