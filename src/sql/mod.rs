//! SQL front end: parsing (with time-window table functions rewritten into subqueries), DDL
//! analysis, DataFusion contexts over Weir's relations, and the compiler from logical plans to
//! incremental stream plans.
//!
//! Invariant: `sql/` does no I/O of its own; it reads state only through the snapshot
//! providers handed to DataFusion.

mod backends;
mod checked;
mod context;
mod ddl;
mod dialect;
pub mod dml;
mod executor;
mod extensions;
mod grants;
mod names;
mod parser;
mod pg_catalog;
mod pg_compat;
mod provider;
mod roles;
pub mod rows;
mod rules;
mod secrets;
mod sized;
mod stream_plan;
mod to_char;
mod usage;
mod windows;

// The face the rest of Weir sees. Two modules are open, their names read with them: `dml`
// (the rows an INSERT, UPDATE or DELETE writes) and `rows` (the row builder of the system
// tables). The names below are the rest; everything else here is private to the front end.

/// Statements as Weir parses them, its extensions included.
pub use self::extensions::{CreateSink, CreateView, Format, FromSource, Include, Watermark};
pub use self::parser::{
    check_supported, parse, parse_message, Count, CursorQuery, Parsed, Pending, Statement,
    Subscribe,
};

/// Tables and sources from their DDL, and the names in it.
pub use self::ddl::{
    create_source, create_table, declared_connector, ident_name, option_text, redacted,
    relation_name,
};

/// The server's sessions (`pg_stat_activity`), and a session's settings with its own.
pub use self::backends::{
    memory_text, parse_memory, setting_name, Backend, BackendStart, BackendState, Backends,
    Registered, Settings, STATEMENT_MEM,
};

/// Where batch plans run, and what memory and CPU time each session's statements use.
pub use self::executor::{own_statement, statement_runtime, Executor};
pub use self::usage::Usage;

/// Batch queries: DataFusion over Weir's relations, and their results named as PostgreSQL
/// names them.
pub use self::context::{query_context, query_runtime, register_system_tables, PlanFunctions};
pub use self::grants::{GrantOn, GrantStatement, Grantee};
pub use self::names::{
    declared_type_of, pg_column_name, pg_names, result_schema, ATTNUM, TABLE_OID, TYPE_OID, TYPMOD,
    UNNAMED,
};
pub use self::provider::{RelationRows, RelationTable};
pub use self::roles::{setting_value, RoleSpec, RoleStatement};
pub use self::rules::type_integer_constants;
pub use self::secrets::{reference as secret_reference, shown as shown_statement, SecretStatement};

/// PostgreSQL's catalog spellings rewritten before planning (`pg_catalog` and
/// `information_schema` are in every query's context).
pub use self::pg_catalog::{catalog_tables, ROLE_NAME};
pub use self::pg_compat::rewrite as rewrite_catalog_spellings;

/// Views compiled into stream plans.
pub use self::stream_plan::{check_deterministic, mark_view_now, Planner};
