//! The tables of `pg_catalog`: PostgreSQL 15's columns, in its order, each table's rows
//! built from [`Relations`]. Tables of features Weir lacks have no rows. `information_schema`'s
//! tables are built the same way.

use datafusion::arrow::array::RecordBatch;

pub(super) use super::build::{t, table, Build, V};
use super::{
    quote_ident, Relation, Relations, DATABASE_OID, NAMESPACES, PG_CATALOG_OID, PUBLIC_OID,
    ROLE_NAME, ROLE_OID,
};
use crate::error::Result;
use V::{B, I, N, O};

/// `pg_catalog`'s tables.
pub const CATALOG_TABLES: &[(&str, Build)] = &[
    ("pg_namespace", pg_namespace),
    ("pg_class", pg_class),
    ("pg_attribute", pg_attribute),
    ("pg_type", pg_type),
    ("pg_database", pg_database),
    ("pg_roles", pg_roles),
    ("pg_user", pg_user),
    ("pg_am", pg_am),
    ("pg_index", pg_index),
    ("pg_constraint", pg_constraint),
    ("pg_collation", pg_collation),
    ("pg_tablespace", pg_tablespace),
    ("pg_settings", pg_settings),
    ("pg_matviews", pg_matviews),
    ("pg_tables", pg_tables),
    ("pg_stat_activity", super::activity::pg_stat_activity),
    ("pg_stat_gssapi", super::activity::pg_stat_gssapi),
    ("pg_stat_user_tables", super::activity::pg_stat_user_tables),
    ("pg_depend", |_| table(PG_DEPEND, vec![])),
    ("pg_shdescription", |_| table(PG_SHDESCRIPTION, vec![])),
    ("pg_seclabels", |_| table(PG_SECLABELS, vec![])),
    ("pg_views", |_| table(PG_VIEWS, vec![])),
    ("pg_description", |_| table(PG_DESCRIPTION, vec![])),
    ("pg_attrdef", |_| table(PG_ATTRDEF, vec![])),
    ("pg_auth_members", pg_auth_members),
    ("pg_inherits", |_| table(PG_INHERITS, vec![])),
    ("pg_policy", |_| table(PG_POLICY, vec![])),
    ("pg_statistic_ext", |_| table(PG_STATISTIC_EXT, vec![])),
    ("pg_publication", |_| table(PG_PUBLICATION, vec![])),
    ("pg_publication_namespace", |_| {
        table(PG_PUBLICATION_NAMESPACE, vec![])
    }),
    ("pg_publication_rel", |_| table(PG_PUBLICATION_REL, vec![])),
    ("pg_sequence", |_| table(PG_SEQUENCE, vec![])),
    ("pg_opclass", |_| table(PG_OPCLASS, vec![])),
    ("pg_proc", |_| table(PG_PROC, vec![])),
    ("pg_extension", |_| table(PG_EXTENSION, vec![])),
    ("pg_enum", |_| table(PG_ENUM, vec![])),
    ("pg_trigger", |_| table(PG_TRIGGER, vec![])),
    ("pg_rewrite", |_| table(PG_REWRITE, vec![])),
];

const PG_DEPEND: &str = "classid:oid objid:oid objsubid:i4 refclassid:oid refobjid:oid \
    refobjsubid:i4 deptype:char";
const PG_SHDESCRIPTION: &str = "objoid:oid classoid:oid description";
const PG_SECLABELS: &str = "objoid:oid classoid:oid objsubid:i4 objtype objnamespace:oid \
    objname provider label";
const PG_VIEWS: &str = "schemaname:name viewname:name viewowner:name definition";
const PG_DESCRIPTION: &str = "objoid:oid classoid:oid objsubid:i4 description";
const PG_ATTRDEF: &str = "oid:oid adrelid:oid adnum:i2 adbin:pg_node_tree";
const PG_AUTH_MEMBERS: &str = "roleid:oid member:oid grantor:oid admin_option:bool";
const PG_INHERITS: &str = "inhrelid:oid inhparent:oid inhseqno:i4 inhdetachpending:bool";
const PG_POLICY: &str = "oid:oid polname:name polrelid:oid polcmd:char polpermissive:bool \
    polroles:oid[] polqual:pg_node_tree polwithcheck:pg_node_tree";
const PG_STATISTIC_EXT: &str = "oid:oid stxrelid:oid stxname:name stxnamespace:oid stxowner:oid \
    stxstattarget:i4 stxkeys:int2vector stxkind:char[] stxexprs:pg_node_tree";
const PG_PUBLICATION: &str = "oid:oid pubname:name pubowner:oid puballtables:bool pubinsert:bool \
    pubupdate:bool pubdelete:bool pubtruncate:bool pubviaroot:bool";
const PG_PUBLICATION_NAMESPACE: &str = "oid:oid pnpubid:oid pnnspid:oid";
const PG_OPCLASS: &str = "oid:oid opcmethod:oid opcname:name opcnamespace:oid opcowner:oid \
    opcfamily:oid opcintype:oid opcdefault:bool opckeytype:oid";
const PG_SEQUENCE: &str = "seqrelid:oid seqtypid:oid seqstart:i8 seqincrement:i8 seqmax:i8 \
    seqmin:i8 seqcache:i8 seqcycle:bool";
const PG_PUBLICATION_REL: &str =
    "oid:oid prpubid:oid prrelid:oid prqual:pg_node_tree prattrs:int2vector";
const PG_PROC: &str = "oid:oid proname:name pronamespace:oid proowner:oid prolang:oid procost:f4 \
    prorows:f4 provariadic:oid prosupport prokind:char prosecdef:bool proleakproof:bool \
    proisstrict:bool proretset:bool provolatile:char proparallel:char pronargs:i2 pronargdefaults:i2 \
    prorettype:oid proargtypes:oidvector proallargtypes:oid[] proargmodes:char[] \
    proargnames:text[] proargdefaults:pg_node_tree protrftypes:oid[] prosrc probin prosqlbody:pg_node_tree \
    proconfig:text[] proacl:aclitem[]";
const PG_EXTENSION: &str = "oid:oid extname:name extowner:oid extnamespace:oid \
    extrelocatable:bool extversion extconfig:oid[] extcondition:text[]";
const PG_ENUM: &str = "oid:oid enumtypid:oid enumsortorder:f4 enumlabel:name";
const PG_TRIGGER: &str = "oid:oid tgrelid:oid tgparentid:oid tgname:name tgfoid:oid tgtype:i2 \
    tgenabled:char tgisinternal:bool tgconstrrelid:oid tgconstrindid:oid tgconstraint:oid \
    tgdeferrable:bool tginitdeferred:bool tgnargs:i2 tgattr:int2vector tgargs:bytea tgqual:pg_node_tree \
    tgoldtable:name tgnewtable:name";
const PG_REWRITE: &str =
    "oid:oid rulename:name ev_class:oid ev_type:char ev_enabled:char is_instead:bool \
    ev_qual:pg_node_tree ev_action:pg_node_tree";
fn pg_namespace(_: &Relations) -> Result<RecordBatch> {
    let rows = NAMESPACES
        .iter()
        .map(|(oid, name)| vec![O(*oid), t(*name), O(ROLE_OID), N])
        .collect();
    table("oid:oid nspname:name nspowner:oid nspacl:aclitem[]", rows)
}

/// A built-in type: OID, name, length, category, array type OID, element type OID.
type BuiltIn = (u32, &'static str, i64, char, u32, u32);

/// The types Weir's values have, and the arrays of them.
const TYPES: &[BuiltIn] = &[
    (16, "bool", 1, 'B', 1000, 0),
    (17, "bytea", -1, 'U', 1001, 0),
    (18, "char", 1, 'Z', 1002, 0),
    (19, "name", 64, 'S', 1003, 0),
    (20, "int8", 8, 'N', 1016, 0),
    (21, "int2", 2, 'N', 1005, 0),
    (23, "int4", 4, 'N', 1007, 0),
    (25, "text", -1, 'S', 1009, 0),
    (26, "oid", 4, 'N', 1028, 0),
    (114, "json", -1, 'U', 199, 0),
    (700, "float4", 4, 'N', 1021, 0),
    (701, "float8", 8, 'N', 1022, 0),
    (1043, "varchar", -1, 'S', 1015, 0),
    (1082, "date", 4, 'D', 1182, 0),
    (1083, "time", 8, 'D', 1183, 0),
    (1114, "timestamp", 8, 'D', 1115, 0),
    (1184, "timestamptz", 8, 'D', 1185, 0),
    (1186, "interval", 16, 'T', 1187, 0),
    (1700, "numeric", -1, 'N', 1231, 0),
    (2205, "regclass", 4, 'N', 2210, 0),
    (2206, "regtype", 4, 'N', 2211, 0),
    (3802, "jsonb", -1, 'U', 3807, 0),
    (1000, "_bool", -1, 'A', 0, 16),
    (1001, "_bytea", -1, 'A', 0, 17),
    (1005, "_int2", -1, 'A', 0, 21),
    (1007, "_int4", -1, 'A', 0, 23),
    (1009, "_text", -1, 'A', 0, 25),
    (1015, "_varchar", -1, 'A', 0, 1043),
    (1016, "_int8", -1, 'A', 0, 20),
    (1021, "_float4", -1, 'A', 0, 700),
    (1022, "_float8", -1, 'A', 0, 701),
    (1028, "_oid", -1, 'A', 0, 26),
    (1115, "_timestamp", -1, 'A', 0, 1114),
    (1182, "_date", -1, 'A', 0, 1082),
    (1185, "_timestamptz", -1, 'A', 0, 1184),
    (1231, "_numeric", -1, 'A', 0, 1700),
];

/// The name PostgreSQL's `pg_type.typname` has for `oid`.
pub fn type_name(oid: u32) -> Option<&'static str> {
    TYPES.iter().find(|t| t.0 == oid).map(|t| t.1)
}

/// The OID of the type named `name` (`int4`, `integer`, `pg_catalog.text` ...).
pub fn type_oid(name: &str) -> Option<u32> {
    let name = name.trim().to_lowercase();
    let name = name.strip_prefix("pg_catalog.").unwrap_or(&name);
    let alias = match name {
        "integer" | "int" => "int4",
        "smallint" => "int2",
        "bigint" => "int8",
        "boolean" => "bool",
        "real" => "float4",
        "double precision" => "float8",
        "character varying" => "varchar",
        "timestamp without time zone" => "timestamp",
        "timestamp with time zone" => "timestamptz",
        "decimal" => "numeric",
        other => other,
    };
    TYPES.iter().find(|t| t.1 == alias).map(|t| t.0)
}

/// How PostgreSQL stores a type's values (`typstorage`): `numeric` in line but compressible
/// ('m'), other variable-length types out of line ('x'), fixed-length ones plain ('p').
fn storage(oid: u32, len: i64) -> &'static str {
    match (oid, len) {
        (1700, _) => "m",
        (_, -1) => "x",
        _ => "p",
    }
}

fn pg_type(_: &Relations) -> Result<RecordBatch> {
    let mut rows = Vec::new();
    for &(oid, name, len, category, array, element) in TYPES {
        let byval = (1..=8).contains(&len) && len != 3;
        rows.push(vec![
            O(oid),
            t(name),
            O(PG_CATALOG_OID),
            O(ROLE_OID),
            I(len),
            B(byval),
            t("b"),
            t(category.to_string()),
            B(matches!(oid, 16 | 25 | 701 | 1184)),
            B(true),
            t(","),
            O(0),
            t("-"),
            O(element),
            O(array),
            t(format!("{name}in")),
            t(format!("{name}out")),
            t(format!("{name}recv")),
            t(format!("{name}send")),
            t("-"),
            t("-"),
            t("-"),
            t(if len == 8 || len == -1 { "d" } else { "i" }),
            t(storage(oid, len)),
            B(false),
            O(0),
            I(-1),
            I(0),
            O(if matches!(oid, 25 | 1043 | 19) {
                100
            } else {
                0
            }),
            N,
            N,
            N,
        ]);
    }
    table(
        "oid:oid typname:name typnamespace:oid typowner:oid typlen:i2 typbyval:bool typtype:char \
         typcategory:char typispreferred:bool typisdefined:bool typdelim:char typrelid:oid typsubscript \
         typelem:oid typarray:oid typinput typoutput typreceive typsend typmodin typmodout \
         typanalyze typalign:char typstorage:char typnotnull:bool typbasetype:oid typtypmod:i4 \
         typndims:i4 typcollation:oid typdefaultbin:pg_node_tree typdefault typacl:aclitem[]",
        rows,
    )
}

fn pg_class(r: &Relations) -> Result<RecordBatch> {
    let mut rows = Vec::new();
    let mut push =
        |oid: u32, name: String, (kind, am): (char, u32), natts: usize, rel: &Relation| {
            let index = kind != 'i' && !rel.primary_key.is_empty();
            let acl = match (&rel.acl, kind) {
                (Some(acl), 'r' | 'm' | 'f') => V::S(acl.clone()),
                _ => N,
            };
            rows.push(vec![
                O(oid),
                t(name),
                O(PUBLIC_OID),
                O(0),
                O(0),
                O(rel.owner),
                O(am),
                O(oid),
                O(0),
                I(0),
                I(-1),
                I(0),
                O(0),
                B(index),
                B(false),
                t("p"),
                t(kind.to_string()),
                I(natts as i64),
                I(0),
                B(false),
                B(false),
                B(false),
                B(false),
                B(false),
                B(true),
                t(if matches!(kind, 'r' | 'm') { "d" } else { "n" }),
                B(false),
                O(0),
                O(0),
                O(0),
                acl,
                N,
                N,
            ]);
        };
    for rel in &r.relations {
        let am = if matches!(rel.kind, 'r' | 'm') { 2 } else { 0 };
        push(
            rel.oid,
            rel.name.clone(),
            (rel.kind, am),
            rel.columns.len(),
            rel,
        );
        if !rel.primary_key.is_empty() {
            let natts = rel.primary_key.len();
            push(rel.index_oid(), rel.index_name(), ('i', 403), natts, rel);
        }
    }
    table(
        "oid:oid relname:name relnamespace:oid reltype:oid reloftype:oid relowner:oid relam:oid \
         relfilenode:oid reltablespace:oid relpages:i4 reltuples:f4 relallvisible:i4 \
         reltoastrelid:oid relhasindex:bool relisshared:bool relpersistence:char relkind:char \
         relnatts:i2 relchecks:i2 relhasrules:bool relhastriggers:bool relhassubclass:bool \
         relrowsecurity:bool relforcerowsecurity:bool relispopulated:bool relreplident:char \
         relispartition:bool relrewrite:oid relfrozenxid:xid relminmxid:xid relacl:aclitem[] \
         reloptions:text[] relpartbound:pg_node_tree",
        rows,
    )
}

fn pg_attribute(r: &Relations) -> Result<RecordBatch> {
    let mut rows = Vec::new();
    for rel in &r.relations {
        for (i, c) in rel.columns.iter().enumerate() {
            let len = TYPES.iter().find(|t| t.0 == c.type_oid).map_or(-1, |t| t.2);
            let varlena = len == -1;
            rows.push(vec![
                O(rel.oid),
                t(c.name.clone()),
                O(c.type_oid),
                I(-1),
                I(len),
                I(i as i64 + 1),
                I(0),
                I(-1),
                I(i64::from(c.typmod)),
                B(!varlena && len <= 8),
                t(if len == 8 || varlena { "d" } else { "i" }),
                t(storage(c.type_oid, len)),
                t(""),
                B(c.not_null || rel.primary_key.contains(&i)),
                B(false),
                B(false),
                t(""),
                t(""),
                B(false),
                B(true),
                I(0),
                O(if matches!(c.type_oid, 25 | 1043) {
                    100
                } else {
                    0
                }),
                N,
                N,
                N,
                N,
            ]);
        }
        if !rel.primary_key.is_empty() {
            for (n, i) in rel.primary_key.iter().enumerate() {
                let Some(c) = rel.columns.get(*i) else {
                    continue;
                };
                rows.push(vec![
                    O(rel.index_oid()),
                    t(c.name.clone()),
                    O(c.type_oid),
                    I(-1),
                    I(-1),
                    I(n as i64 + 1),
                    I(0),
                    I(-1),
                    I(i64::from(c.typmod)),
                    B(false),
                    t("i"),
                    t("p"),
                    t(""),
                    B(false),
                    B(false),
                    B(false),
                    t(""),
                    t(""),
                    B(false),
                    B(true),
                    I(0),
                    O(0),
                    N,
                    N,
                    N,
                    N,
                ]);
            }
        }
    }
    table(
        "attrelid:oid attname:name atttypid:oid attstattarget:i4 attlen:i2 attnum:i2 attndims:i4 \
         attcacheoff:i4 atttypmod:i4 attbyval:bool attalign:char attstorage:char attcompression:char \
         attnotnull:bool atthasdef:bool atthasmissing:bool attidentity:char attgenerated:char \
         attisdropped:bool attislocal:bool attinhcount:i4 attcollation:oid attacl:aclitem[] \
         attoptions:text[] attfdwoptions:text[] attmissingval:anyarray",
        rows,
    )
}

fn pg_database(_: &Relations) -> Result<RecordBatch> {
    let row = vec![
        O(DATABASE_OID),
        t(crate::DATABASE_NAME),
        O(ROLE_OID),
        I(6),
        t("c"),
        B(false),
        B(true),
        I(-1),
        O(0),
        O(1),
        O(1663),
        t("C.UTF-8"),
        t("C.UTF-8"),
        N,
        N,
        N,
    ];
    table(
        "oid:oid datname:name datdba:oid encoding:i4 datlocprovider:char datistemplate:bool \
         datallowconn:bool datconnlimit:i4 datfrozenxid:xid datminmxid:xid dattablespace:oid \
         datcollate datctype daticulocale datcollversion datacl:aclitem[]",
        vec![row],
    )
}

/// The bootstrap superuser also has REPLICATION and BYPASSRLS, as PostgreSQL's has.
fn bootstrap(r: &crate::catalog::RoleDef) -> bool {
    r.oid == crate::catalog::BOOTSTRAP_OID
}

fn pg_roles(r: &Relations) -> Result<RecordBatch> {
    let rows = (r.roles.iter())
        .map(|role| {
            vec![
                t(role.name.clone()),
                B(role.superuser),
                B(role.inherit),
                B(role.create_role),
                B(role.create_db),
                B(role.login),
                B(bootstrap(role)),
                I(i64::from(role.connection_limit)),
                t("********"),
                N,
                B(bootstrap(role)),
                config(role),
                O(role.oid),
            ]
        })
        .collect();
    table(
        "rolname:name rolsuper:bool rolinherit:bool rolcreaterole:bool rolcreatedb:bool \
         rolcanlogin:bool rolreplication:bool rolconnlimit:i4 rolpassword rolvaliduntil:timestamptz \
         rolbypassrls:bool rolconfig:text[] oid:oid",
        rows,
    )
}

/// A role's settings (`ALTER ROLE ... SET`) as PostgreSQL lists them, `name=value`; NULL
/// without any.
fn config(role: &crate::catalog::RoleDef) -> V {
    match role.settings.is_empty() {
        true => N,
        false => V::S(
            role.settings
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
        ),
    }
}

/// The roles that may log in.
fn pg_user(r: &Relations) -> Result<RecordBatch> {
    let rows = (r.roles.iter().filter(|role| role.login))
        .map(|role| {
            vec![
                t(role.name.clone()),
                O(role.oid),
                B(role.create_db),
                B(role.superuser),
                B(bootstrap(role)),
                B(bootstrap(role)),
                t("********"),
                N,
                config(role),
            ]
        })
        .collect();
    table(
        "usename:name usesysid:oid usecreatedb:bool usesuper:bool userepl:bool usebypassrls:bool \
         passwd valuntil:timestamptz useconfig:text[]",
        rows,
    )
}

/// `GRANT role TO member`.
fn pg_auth_members(r: &Relations) -> Result<RecordBatch> {
    let rows = (r.members.iter())
        .map(|m| vec![O(m.role), O(m.member), O(m.grantor), B(m.admin)])
        .collect();
    table(PG_AUTH_MEMBERS, rows)
}

fn pg_am(_: &Relations) -> Result<RecordBatch> {
    table(
        "oid:oid amname:name amhandler amtype:char",
        vec![
            vec![O(2), t("heap"), t("heap_tableam_handler"), t("t")],
            vec![O(403), t("btree"), t("bthandler"), t("i")],
        ],
    )
}

/// Relations with a primary key.
pub(super) fn keyed(r: &Relations) -> impl Iterator<Item = &Relation> {
    r.relations.iter().filter(|rel| !rel.primary_key.is_empty())
}

/// A relation's primary key as attribute numbers.
fn attnums(rel: &Relation) -> Vec<i64> {
    rel.primary_key.iter().map(|&i| i as i64 + 1).collect()
}

fn pg_index(r: &Relations) -> Result<RecordBatch> {
    let rows = keyed(r)
        .map(|rel| {
            let n = rel.primary_key.len() as i64;
            vec![
                O(rel.index_oid()),
                O(rel.oid),
                I(n),
                I(n),
                B(true),
                B(false),
                B(true),
                B(false),
                B(true),
                B(false),
                B(true),
                B(false),
                B(true),
                B(true),
                B(false),
                V::L(attnums(rel)),
                V::L(vec![0; rel.primary_key.len()]),
                V::L(vec![0; rel.primary_key.len()]),
                V::L(vec![0; rel.primary_key.len()]),
                N,
                N,
            ]
        })
        .collect();
    table(
        "indexrelid:oid indrelid:oid indnatts:i2 indnkeyatts:i2 indisunique:bool \
         indnullsnotdistinct:bool indisprimary:bool indisexclusion:bool indimmediate:bool \
         indisclustered:bool indisvalid:bool indcheckxmin:bool indisready:bool \
         indislive:bool indisreplident:bool indkey:int2vector indcollation:oidvector indclass:oidvector \
         indoption:int2vector indexprs:pg_node_tree indpred:pg_node_tree",
        rows,
    )
}

fn pg_constraint(r: &Relations) -> Result<RecordBatch> {
    let rows = keyed(r)
        .map(|rel| {
            vec![
                O(rel.constraint_oid()),
                t(rel.index_name()),
                O(PUBLIC_OID),
                t("p"),
                B(false),
                B(false),
                B(true),
                O(rel.oid),
                O(0),
                O(rel.index_oid()),
                O(0),
                O(0),
                t(" "),
                t(" "),
                t(" "),
                B(true),
                I(0),
                B(true),
                V::L(attnums(rel)),
                N,
                N,
                N,
                N,
                N,
                N,
                N,
            ]
        })
        .collect();
    table(
        "oid:oid conname:name connamespace:oid contype:char condeferrable:bool condeferred:bool \
         convalidated:bool conrelid:oid contypid:oid conindid:oid conparentid:oid \
         confrelid:oid confupdtype:char confdeltype:char confmatchtype:char conislocal:bool coninhcount:i4 \
         connoinherit:bool conkey:i2[] confkey:i2[] conpfeqop:oid[] conppeqop:oid[] \
         conffeqop:oid[] confdelsetcols:i2[] conexclop:oid[] conbin:pg_node_tree",
        rows,
    )
}

fn pg_collation(_: &Relations) -> Result<RecordBatch> {
    table(
        "oid:oid collname:name collnamespace:oid collowner:oid collprovider:char \
         collisdeterministic:bool collencoding:i4 collcollate collctype colliculocale \
         collversion",
        vec![vec![
            O(100),
            t("default"),
            O(PG_CATALOG_OID),
            O(ROLE_OID),
            t("d"),
            B(true),
            I(-1),
            N,
            N,
            N,
            N,
        ]],
    )
}

fn pg_tablespace(_: &Relations) -> Result<RecordBatch> {
    table(
        "oid:oid spcname:name spcowner:oid spcacl:aclitem[] spcoptions:text[]",
        vec![
            vec![O(1663), t("pg_default"), O(ROLE_OID), N, N],
            vec![O(1664), t("pg_global"), O(ROLE_OID), N, N],
        ],
    )
}

pub(super) fn pg_settings(r: &Relations) -> Result<RecordBatch> {
    let mut names: Vec<(&String, &String)> = r.settings.iter().collect();
    names.sort();
    let rows = names
        .into_iter()
        .map(|(name, value)| {
            vec![
                t(crate::sql::setting_name(name)),
                t(value.clone()),
                N,
                t("Weir"),
                t(""),
                N,
                t("user"),
                t("string"),
                t("session"),
                N,
                N,
                N,
                t(value.clone()),
                t(value.clone()),
                N,
                N,
                B(false),
            ]
        })
        .collect();
    table(
        "name setting unit category short_desc extra_desc context vartype source min_val \
         max_val enumvals:text[] boot_val reset_val sourcefile sourceline:i4 \
         pending_restart:bool",
        rows,
    )
}

fn pg_matviews(r: &Relations) -> Result<RecordBatch> {
    let rows = (r.relations.iter())
        .filter(|rel| rel.kind == 'm')
        .map(|rel| {
            vec![
                t("public"),
                t(rel.name.clone()),
                t(ROLE_NAME),
                N,
                B(false),
                B(true),
                t(rel.definition.clone().unwrap_or_default()),
            ]
        })
        .collect();
    table(
        "schemaname:name matviewname:name matviewowner:name tablespace:name hasindexes:bool ispopulated:bool \
         definition",
        rows,
    )
}

fn pg_tables(r: &Relations) -> Result<RecordBatch> {
    let rows = (r.relations.iter())
        .filter(|rel| rel.kind == 'r')
        .map(|rel| {
            vec![
                t("public"),
                t(rel.name.clone()),
                t(ROLE_NAME),
                N,
                B(!rel.primary_key.is_empty()),
                B(false),
                B(false),
                B(false),
            ]
        })
        .collect();
    table(
        "schemaname:name tablename:name tableowner:name tablespace:name hasindexes:bool hasrules:bool \
         hastriggers:bool rowsecurity:bool",
        rows,
    )
}

/// `CREATE UNIQUE INDEX ...` for a relation's primary key (`pg_get_indexdef`).
pub fn index_definition(rel: &Relation) -> String {
    format!(
        "CREATE UNIQUE INDEX {} ON public.{} USING btree {}",
        quote_ident(&rel.index_name()),
        quote_ident(&rel.name),
        rel.key_list()
    )
}
