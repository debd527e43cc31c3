//! `pg_stat_activity`: a row per session of the server, from the registry of sessions the
//! query's own session belongs to.

use datafusion::arrow::array::RecordBatch;

use super::build::{t, table, V};
use super::{Relations, DATABASE_OID, ROLE_OID};
use crate::error::Result;

use V::{I, N, O};

pub(super) fn pg_stat_activity(r: &Relations) -> Result<RecordBatch> {
    let sessions = r.backend.as_ref().map(|b| b.sessions()).unwrap_or_default();
    let rows = sessions
        .iter()
        .map(|s| {
            let a = s.activity();
            let at = |us: Option<i64>| us.map_or(N, I);
            vec![
                O(DATABASE_OID),
                t(crate::DATABASE_NAME),
                I(i64::from(s.start.pid)),
                N,
                O(ROLE_OID),
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
            ]
        })
        .collect();
    table(
        "datid:oid datname pid:i4 leader_pid:i4 usesysid:oid usename application_name \
         client_addr client_hostname client_port:i4 backend_start:timestamptz \
         xact_start:timestamptz query_start:timestamptz state_change:timestamptz \
         wait_event_type wait_event state backend_xid:oid backend_xmin:oid query_id:i8 query \
         backend_type",
        rows,
    )
}
