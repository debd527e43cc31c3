//! `pg_stat_activity` and `pg_stat_gssapi`: a row per session of the server, from the
//! registry of sessions the query's own session belongs to; `pg_stat_user_tables`.

use datafusion::arrow::array::RecordBatch;

use super::build::{t, table, V};
use super::{Relations, DATABASE_OID};
use crate::error::Result;

use V::{B, I, N, O};

fn sessions(r: &Relations) -> Vec<std::sync::Arc<crate::sql::Backend>> {
    r.backend.as_ref().map(|b| b.sessions()).unwrap_or_default()
}

/// A row per session: none authenticated with GSSAPI, none encrypted by it.
pub(super) fn pg_stat_gssapi(r: &Relations) -> Result<RecordBatch> {
    let rows = (sessions(r).iter())
        .map(|s| vec![I(i64::from(s.start.pid)), B(false), N, B(false)])
        .collect();
    table(
        "pid:i4 gss_authenticated:bool principal encrypted:bool",
        rows,
    )
}

/// Access statistics of tables: Weir keeps none, so the table has no rows (a tool's row
/// estimate from it is unknown, as for a table PostgreSQL has not counted).
pub(super) fn pg_stat_user_tables(_: &Relations) -> Result<RecordBatch> {
    table(
        "relid:oid schemaname:name relname:name seq_scan:i8 seq_tup_read:i8 idx_scan:i8 \
         idx_tup_fetch:i8 n_tup_ins:i8 n_tup_upd:i8 n_tup_del:i8 n_tup_hot_upd:i8 n_live_tup:i8 \
         n_dead_tup:i8 n_mod_since_analyze:i8 n_ins_since_vacuum:i8 last_vacuum:timestamptz \
         last_autovacuum:timestamptz last_analyze:timestamptz last_autoanalyze:timestamptz \
         vacuum_count:i8 autovacuum_count:i8 analyze_count:i8 autoanalyze_count:i8",
        vec![],
    )
}

pub(super) fn pg_stat_activity(r: &Relations) -> Result<RecordBatch> {
    let sessions = sessions(r);
    let rows = sessions
        .iter()
        .map(|s| {
            let a = s.activity();
            let at = |us: Option<i64>| us.map_or(N, I);
            let role = r.roles.iter().find(|role| role.name == s.start.user);
            let mut row = vec![
                O(DATABASE_OID),
                t(crate::DATABASE_NAME),
                I(i64::from(s.start.pid)),
                N,
                role.map_or(N, |role| O(role.oid)),
                t(s.start.user.clone()),
                t(a.application_name),
                t(s.start.client.ip().to_string()),
                N,
                I(i64::from(s.start.client.port())),
                I(s.started_us),
                at(a.xact_start_us),
                at(a.query_start_us),
                I(a.state_change_us),
                N,
                N,
                t(a.state.name()),
                N,
                N,
                N,
                t(a.query),
                t("client backend"),
            ];
            // As in PostgreSQL, a session of a role whose privileges the reader lacks shows
            // who it is and not where from or what it does.
            if !r.acts_for(&s.start.user) {
                for hidden in [7, 9, 10, 11, 12, 13, 16] {
                    row[hidden] = N;
                }
                row[20] = t("<insufficient privilege>");
            }
            row
        })
        .collect();
    table(
        "datid:oid datname:name pid:i4 leader_pid:i4 usesysid:oid usename:name application_name \
         client_addr client_hostname client_port:i4 backend_start:timestamptz \
         xact_start:timestamptz query_start:timestamptz state_change:timestamptz \
         wait_event_type wait_event state backend_xid:xid backend_xmin:xid query_id:i8 query \
         backend_type",
        rows,
    )
}
