//! `pg_catalog` and `information_schema` as views of Weir's catalog
//! (`docs/design/0016-pg-catalog.md`): what a query's context holds of the catalog
//! ([`Relations`]), and schemas whose tables are built from it when a query names them.
//! `tables` has the tables' columns and rows.

mod activity;
mod build;
mod information_schema;
mod keywords;
mod tables;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::SchemaProvider;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl};
use datafusion::common::DFSchema;
use datafusion::datasource::{MemTable, TableProvider, ViewTable};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};

use super::backends::{Backend, Settings};
use crate::catalog::{Catalog, ColumnDef, Object, Scope};
use crate::types::{pg_type_of, SqlType};

pub use self::information_schema::INFORMATION_SCHEMA_TABLES;
pub use self::tables::CATALOG_TABLES;

/// Every table of `pg_catalog` and `information_schema`, as (schema, table).
pub fn catalog_tables() -> Vec<(&'static str, &'static str)> {
    (CATALOG_TABLES.iter().map(|(t, _)| ("pg_catalog", *t)))
        .chain(
            INFORMATION_SCHEMA_TABLES
                .iter()
                .map(|(t, _)| ("information_schema", *t)),
        )
        .collect()
}

/// PostgreSQL's first OID for user objects: a relation's OID is this plus its object id.
pub const FIRST_USER_OID: u32 = 16384;
/// `pg_catalog`'s OID, as in PostgreSQL.
pub const PG_CATALOG_OID: u32 = 11;
/// `public`'s OID, as in PostgreSQL.
pub const PUBLIC_OID: u32 = 2200;
/// `information_schema`'s OID (PostgreSQL assigns it at initdb; this is a fixed one).
pub const INFORMATION_SCHEMA_OID: u32 = 13000;
/// `weir_catalog`'s OID.
pub const WEIR_CATALOG_OID: u32 = 13100;
/// The database's OID (PostgreSQL's first database after the templates).
pub const DATABASE_OID: u32 = 5;
/// The one role's OID (PostgreSQL's bootstrap superuser's).
pub const ROLE_OID: u32 = 10;
/// The one role's name.
pub const ROLE_NAME: &str = "weir";

/// The schemas, by OID.
pub const NAMESPACES: [(u32, &str); 4] = [
    (PG_CATALOG_OID, "pg_catalog"),
    (PUBLIC_OID, "public"),
    (INFORMATION_SCHEMA_OID, "information_schema"),
    (WEIR_CATALOG_OID, "weir_catalog"),
];

/// A relation as the PostgreSQL catalogs show it.
#[derive(Debug, Clone)]
pub struct Relation {
    pub oid: u32,
    pub name: String,
    /// `pg_class.relkind`: `r` a table, `m` a materialized view, `f` a source.
    pub kind: char,
    pub columns: Vec<Column>,
    /// Positions of the primary key's columns (a table's).
    pub primary_key: Vec<usize>,
    /// A view's query.
    pub definition: Option<String>,
    /// The owner's OID (`pg_class.relowner`).
    pub owner: u32,
    /// What was granted on it, as `aclitem`s (`pg_class.relacl`); `None`: the owner's only.
    pub acl: Option<Vec<String>>,
}

impl Relation {
    /// The OID of the primary key's index (a table has at most one): derived from the
    /// table's, above every relation's.
    pub fn index_oid(&self) -> u32 {
        self.oid.wrapping_add(1 << 30)
    }

    /// The OID of the primary key's constraint.
    pub fn constraint_oid(&self) -> u32 {
        self.oid.wrapping_add(1 << 31)
    }

    /// The primary key's index name, as PostgreSQL names it.
    pub fn index_name(&self) -> String {
        format!("{}_pkey", self.name)
    }

    /// `(a, b)`: the primary key's columns.
    pub fn key_list(&self) -> String {
        let names: Vec<String> = (self.primary_key.iter())
            .filter_map(|i| self.columns.get(*i))
            .map(|c| quote_ident(&c.name))
            .collect();
        format!("({})", names.join(", "))
    }
}

/// A column: its name, type OID, type modifier and NOT NULL.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
    pub not_null: bool,
}

impl Column {
    fn declared(c: &ColumnDef) -> Column {
        let typmod = match c.ty {
            SqlType::Varchar { max_chars: Some(n) } => n as i32 + 4,
            SqlType::Numeric { precision, scale } => numeric_typmod(precision, scale),
            _ => -1,
        };
        Column {
            name: c.name.clone(),
            type_oid: c.ty.pg_oid(),
            typmod,
            not_null: c.not_null,
        }
    }

    /// A view's column: of its values' type, or of the declared type its field carries (a
    /// column passed on unchanged from a relation, `varchar(40)`).
    fn computed(f: &datafusion::arrow::datatypes::Field) -> Column {
        let meta = |key: &str| f.metadata().get(key).and_then(|v| v.parse::<i64>().ok());
        let declared = (meta(crate::sql::TYPE_OID).and_then(|v| u32::try_from(v).ok()))
            .zip(meta(crate::sql::TYPMOD).and_then(|v| i32::try_from(v).ok()));
        if let Some((type_oid, typmod)) = declared {
            return Column {
                name: f.name().clone(),
                type_oid,
                typmod,
                not_null: false,
            };
        }
        let typmod = match f.data_type() {
            DataType::Decimal128(p, s) => numeric_typmod(*p, *s),
            _ => -1,
        };
        Column {
            name: f.name().clone(),
            type_oid: pg_type_of(f.data_type()).oid,
            typmod,
            not_null: false,
        }
    }
}

fn numeric_typmod(precision: u8, scale: i8) -> i32 {
    ((i32::from(precision) << 16) | i32::from(scale as u8)) + 4
}

/// `name`, double-quoted where PostgreSQL would quote it.
pub fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// What a query's context knows of the catalog: its relations as PostgreSQL shows them, the
/// session's settings, and the session itself (`pg_stat_activity`'s rows, `pg_backend_pid`).
#[derive(Debug, Default)]
pub struct Relations {
    pub relations: Vec<Relation>,
    pub settings: HashMap<String, String>,
    pub backend: Option<Arc<Backend>>,
    /// The roles (`pg_roles`), without their passwords' verifiers.
    pub roles: Vec<crate::catalog::RoleDef>,
    /// `GRANT role TO member` (`pg_auth_members`).
    pub members: Vec<crate::catalog::Membership>,
    /// Relations' owners and grants, by catalog id, and the public schema's grants: what
    /// `has_table_privilege` decides from.
    pub access: std::collections::BTreeMap<crate::catalog::ObjectId, crate::catalog::Access>,
    pub schema_grants: Vec<crate::catalog::AclItem>,
}

impl Relations {
    /// The relations `scope` sees in `catalog` (sinks are not relations).
    pub fn of(catalog: &Catalog, scope: Scope, settings: &Settings) -> Relations {
        let mut relations = Vec::new();
        for object in catalog.visible_objects(scope) {
            let oid = FIRST_USER_OID.wrapping_add(object.id());
            let relation = match object {
                Object::Table(t) => Relation {
                    oid,
                    name: t.name.clone(),
                    kind: 'r',
                    columns: t.columns.iter().map(Column::declared).collect(),
                    primary_key: t.primary_key.clone(),
                    definition: None,
                    owner: 0,
                    acl: None,
                },
                Object::Source(s) => Relation {
                    oid,
                    name: s.name.clone(),
                    kind: 'f',
                    columns: s.columns.iter().map(Column::declared).collect(),
                    primary_key: Vec::new(),
                    definition: None,
                    owner: 0,
                    acl: None,
                },
                Object::View(v) if v.sink => continue,
                Object::View(v) => {
                    let Some(schema) = catalog.schema(v.id) else {
                        continue;
                    };
                    Relation {
                        oid,
                        name: v.name.clone(),
                        kind: 'm',
                        columns: schema
                            .fields()
                            .iter()
                            .map(|f| Column::computed(f))
                            .collect(),
                        primary_key: Vec::new(),
                        definition: Some(v.query.clone()),
                        owner: 0,
                        acl: None,
                    }
                }
            };
            let access = catalog.access(object.id());
            let name = |oid: u32| {
                let role = catalog.role_by_oid(oid);
                role.map_or_else(|| oid.to_string(), |r| r.name.clone())
            };
            relations.push(Relation {
                owner: access.owner,
                acl: (access.grants.as_deref()).map(|acl| crate::catalog::acl_text(acl, name)),
                ..relation
            });
        }
        let roles = (catalog.roles().iter())
            .map(|r| crate::catalog::RoleDef {
                password: None,
                ..r.clone()
            })
            .collect();
        Relations {
            relations,
            settings: (**settings).clone(),
            backend: settings.backend.clone(),
            roles,
            members: catalog.memberships().to_vec(),
            access: catalog.grants().access.clone(),
            schema_grants: catalog.schema_grants().to_vec(),
        }
    }

    /// Deciding privileges over this copy of the catalog's.
    pub fn grants(&self) -> crate::catalog::Grants<'_> {
        crate::catalog::Grants {
            roles: &self.roles,
            members: &self.members,
            access: &self.access,
            schema: &self.schema_grants,
        }
    }

    /// The role the query's session acts as; `None` for a session whose role has been
    /// dropped, and outside a session.
    pub fn session_role(&self) -> Option<&crate::catalog::RoleDef> {
        let user = &self.backend.as_ref()?.start.user;
        self.roles.iter().find(|r| &r.name == user)
    }

    /// Whether the query's session has the privileges of the role named `user`
    /// (PostgreSQL's `has_privs_of_role`): what seeing what another session of that role
    /// runs, and signalling it, take. The server's own queries (no session) may.
    pub fn acts_for(&self, user: &str) -> bool {
        if self.backend.is_none() {
            return true;
        }
        let Some(me) = self.session_role() else {
            return false;
        };
        let target = self.roles.iter().find(|r| r.name == user);
        me.superuser || target.is_some_and(|t| self.grants().privileged_as(me).contains(&t.oid))
    }

    /// The relation of the catalog object `id`.
    pub fn by_id(&self, id: crate::catalog::ObjectId) -> Option<&Relation> {
        self.by_oid(FIRST_USER_OID.wrapping_add(id))
    }

    pub fn by_oid(&self, oid: u32) -> Option<&Relation> {
        self.relations.iter().find(|r| r.oid == oid)
    }

    /// The relation `name` names: `relation` or `public.relation`, each part quoted or not.
    pub fn by_name(&self, name: &str) -> Option<&Relation> {
        let name = name.trim();
        let name = (name.strip_prefix("public."))
            .or_else(|| name.strip_prefix("\"public\"."))
            .unwrap_or(name);
        let name = match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
            Some(quoted) => quoted.replace("\"\"", "\""),
            None => name.to_lowercase(),
        };
        self.relations.iter().find(|r| r.name == name)
    }

    /// The relation with the primary-key index or constraint `oid`.
    pub fn by_key_oid(&self, oid: u32) -> Option<&Relation> {
        (self.relations.iter()).find(|r| {
            !r.primary_key.is_empty() && (r.index_oid() == oid || r.constraint_oid() == oid)
        })
    }
}

/// One of the two schemas: its tables built from `relations` when a query names them.
#[derive(Debug)]
pub struct CatalogSchema {
    relations: Arc<Relations>,
    tables: &'static [(&'static str, tables::Build)],
}

impl CatalogSchema {
    pub fn pg_catalog(relations: Arc<Relations>) -> CatalogSchema {
        CatalogSchema {
            relations,
            tables: CATALOG_TABLES,
        }
    }

    pub fn information_schema(relations: Arc<Relations>) -> CatalogSchema {
        CatalogSchema {
            relations,
            tables: INFORMATION_SCHEMA_TABLES,
        }
    }
}

#[async_trait]
impl SchemaProvider for CatalogSchema {
    fn table_names(&self) -> Vec<String> {
        self.tables.iter().map(|(n, _)| n.to_string()).collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        let Some((_, build)) = self.tables.iter().find(|(n, _)| *n == name) else {
            return Ok(None);
        };
        rows(*build, &self.relations).map(Some)
    }

    fn table_exist(&self, name: &str) -> bool {
        self.tables.iter().any(|(n, _)| *n == name)
    }
}

/// A catalog table's (or function's) rows, built from `relations`.
fn rows(
    build: tables::Build,
    relations: &Relations,
) -> Result<Arc<dyn TableProvider>, DataFusionError> {
    let batch: RecordBatch =
        build(relations).map_err(|e| DataFusionError::External(Box::new(e)))?;
    let schema: SchemaRef = batch.schema();
    if batch.num_rows() == 0 {
        // A table without rows (of a feature Weir lacks) is planned as an empty relation,
        // so what reads it is planned away: psql's correlated subqueries over
        // `pg_policy`, which DataFusion could not run, read nothing.
        let empty = LogicalPlan::EmptyRelation(EmptyRelation {
            produce_one_row: false,
            schema: Arc::new(DFSchema::try_from(schema.as_ref().clone())?),
        });
        return Ok(Arc::new(ViewTable::new(empty, None)));
    }
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

/// `pg_catalog`'s functions that return rows without taking arguments: the keywords, and
/// the settings (`pg_settings`' rows).
const CATALOG_FUNCTIONS: &[(&str, tables::Build)] = &[
    ("pg_get_keywords", keywords::pg_get_keywords),
    ("pg_show_all_settings", tables::pg_settings),
];

/// One of `CATALOG_FUNCTIONS`, called in a query's FROM.
#[derive(Debug)]
pub struct CatalogRows {
    name: &'static str,
    build: tables::Build,
    relations: Arc<Relations>,
}

impl CatalogRows {
    /// Each of `CATALOG_FUNCTIONS` over `relations`.
    pub fn all(relations: &Arc<Relations>) -> Vec<CatalogRows> {
        (CATALOG_FUNCTIONS.iter())
            .map(|(name, build)| CatalogRows {
                name,
                build: *build,
                relations: relations.clone(),
            })
            .collect()
    }

    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl TableFunctionImpl for CatalogRows {
    fn call_with_args(
        &self,
        args: TableFunctionArgs,
    ) -> Result<Arc<dyn TableProvider>, DataFusionError> {
        if !args.exprs().is_empty() {
            return Err(DataFusionError::Plan(format!(
                "function {}() takes no arguments",
                self.name
            )));
        }
        rows(self.build, &self.relations)
    }
}

/// `format_type(oid, typmod)`: a type's name as PostgreSQL shows it, with its modifier.
pub fn format_type(oid: u32, typmod: i32) -> String {
    let name = match oid {
        16 => "boolean",
        21 => "smallint",
        23 => "integer",
        20 => "bigint",
        700 => "real",
        701 => "double precision",
        1043 if typmod > 4 => return format!("character varying({})", typmod - 4),
        1043 => "character varying",
        1700 if typmod > 4 => {
            let m = typmod - 4;
            return format!("numeric({},{})", m >> 16, m & 0xffff);
        }
        1114 => "timestamp without time zone",
        1184 => "timestamp with time zone",
        1083 => "time without time zone",
        18 => "\"char\"",
        other => match tables::type_name(other) {
            Some(array) if array.starts_with('_') => {
                let element = tables::type_oid(&array[1..]).unwrap_or(0);
                return format!("{}[]", format_type(element, -1));
            }
            Some(name) => name,
            None => "???",
        },
    };
    name.to_string()
}

pub use self::tables::{index_definition, type_oid};
