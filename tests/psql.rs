//! psql 15's meta-commands against Weir, side by side with a real PostgreSQL 15 holding the
//! same table and materialized view: psql picks its catalog queries by the server's version,
//! which Weir reports as 15, so these are exactly the queries psql sends PostgreSQL 15. Every
//! command must succeed; where Weir's catalog holds what PostgreSQL's does (tables, views,
//! indexes, columns, keys) psql's output must be PostgreSQL's, owner aside.

mod common;
#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/postgres.rs"]
mod postgres;

use std::process::Command;

use common::TestServer;
use postgres::Postgres;

const SETUP: &str = "CREATE TABLE orders (id int PRIMARY KEY, customer varchar(40) NOT NULL, \
                     amount numeric(10,2), placed timestamptz, note text); \
                     CREATE MATERIALIZED VIEW revenue AS \
                     SELECT customer, count(*) AS orders FROM orders GROUP BY customer;";

/// Whether psql succeeded with `commands`, each given with `-c` (unaligned, so widths do not
/// depend on names), and its output and errors.
fn run(conn: &str, commands: &[&str]) -> (bool, String, String) {
    let mut psql = Command::new("psql");
    psql.args([conn, "-X", "-A", "-v", "ON_ERROR_STOP=1"]);
    for command in commands {
        psql.args(["-c", command]);
    }
    let out = psql
        .output()
        .expect("psql is installed (.ci/run installs postgresql-client)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// psql's output for `commands`, or its errors.
fn psql_all(conn: &str, commands: &[&str]) -> Result<String, String> {
    match run(conn, commands) {
        (true, out, err) if err.is_empty() => Ok(out),
        (_, _, err) => Err(format!("{}: {err}", commands.join("; "))),
    }
}

fn psql(conn: &str, command: &str) -> Result<String, String> {
    psql_all(conn, &[command])
}

fn weir_conn(server: &TestServer) -> String {
    format!(
        "host={} port={} user=weir dbname=weir",
        server.addr.ip(),
        server.addr.port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_meta_commands_show_what_postgresql_shows() {
    let pg = Postgres::start().expect("PostgreSQL 15 (scripts/deps installs it)");
    let pg_conn = format!("{} dbname=postgres", pg.conn);
    let server = TestServer::start().await;
    let weir = weir_conn(&server);
    for conn in [&pg_conn, &weir] {
        psql(conn, SETUP).unwrap();
    }
    // Output PostgreSQL's own, but for the owner's name.
    for command in [
        "\\d",
        "\\dt",
        "\\dv",
        "\\dm",
        "\\di",
        "\\d orders",
        "\\d+ orders",
        "\\dt+ orders",
        "\\di orders_pkey",
        "\\d orders_pkey",
        // A view's column passed on from a table keeps its declared type (`varchar(40)`).
        "\\d revenue",
    ] {
        let (ok, out, err) = run(&pg_conn, &[command]);
        // PostgreSQL knows a table's size on disk; Weir reports none (NULL).
        let out = out
            .replace("postgres", "weir")
            .replace("|8192 bytes|", "||");
        assert_eq!(run(&weir, &[command]), (ok, out, err), "{command}");
    }
    // Commands whose rows differ by design: one database, one role, Weir's own schema.
    let databases = psql(&weir, "\\l").unwrap();
    assert!(databases.contains("\nweir|weir|UTF8|"), "{databases}");
    let schemas = psql(&weir, "\\dn").unwrap();
    assert!(schemas.contains("\npublic|weir\n"), "{schemas}");
    assert!(schemas.contains("\nweir_catalog|weir\n"), "{schemas}");
    let roles = psql(&weir, "\\du").unwrap();
    assert!(
        roles.contains("\nweir|Superuser, Create role, Create DB, Replication, Bypass RLS|{}"),
        "{roles}"
    );
    let functions = psql(&weir, "\\df").unwrap();
    assert!(functions.contains("(0 rows)"), "{functions}");
    // A materialized view shows its definition.
    let described = psql(&weir, "\\d+ revenue").unwrap();
    assert!(described.contains("\nView definition:\n"), "{described}");
    assert!(
        described.contains("SELECT customer, count(*) AS orders FROM orders GROUP BY customer"),
        "{described}"
    );
    // Expanded display and timing are psql's own; the query under them is Weir's.
    let expanded = psql_all(
        &weir,
        &["\\x on", "\\timing on", "SELECT 1 AS one, 'a' AS two"],
    )
    .unwrap();
    assert!(expanded.contains("one|1\ntwo|a\n"), "{expanded}");
    assert!(expanded.contains("Time: "), "{expanded}");
    // \copy from a file and to one (COPY FROM STDIN and TO STDOUT underneath), and a file
    // with a bad line, which loads nothing: what PostgreSQL says and does.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("orders.csv");
    std::fs::write(
        &good,
        "id,customer,amount,placed,note\n1,ann,10.50,2024-01-01 10:00:00+00,\"a, b\"\n\
         2,bob,,2024-01-02 11:00:00+00,\n3,ann,7,,\"two\nlines\"\n",
    )
    .unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "4,cy,1,,\n5,dee,lots,,\n").unwrap();
    let (good, bad) = (good.display(), bad.display());
    for command in [
        format!("\\copy orders FROM '{good}' WITH (FORMAT csv, HEADER)"),
        format!("\\copy orders FROM '{bad}' WITH (FORMAT csv)"),
        "\\copy (SELECT * FROM orders ORDER BY id) TO STDOUT WITH (FORMAT csv)".into(),
    ] {
        assert_eq!(
            run(&weir, &[&command]),
            run(&pg_conn, &[&command]),
            "{command}"
        );
    }
}

/// Queries psql's tab completion sends (psql 15's `tab-complete.c`), and the catalog spellings
/// around them that tools send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_queries_that_clients_send_succeed() {
    let server = TestServer::start().await;
    let conn = weir_conn(&server);
    psql(&conn, SETUP).unwrap();
    let rows = |sql: &str| psql_all(&conn, &["\\t on", sql]).unwrap();
    // Tables and views to complete `SELECT * FROM `.
    let completions = rows(
        "SELECT c.relname, NULL::pg_catalog.text FROM pg_catalog.pg_class c \
         WHERE c.relkind IN ('r', 'p', 'f', 'v', 'm') AND (c.relname) LIKE 'or%' \
         AND pg_catalog.pg_table_is_visible(c.oid) AND c.relnamespace <> \
         (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'pg_catalog') \
         UNION ALL SELECT NULL::pg_catalog.text, n.nspname FROM pg_catalog.pg_namespace n \
         WHERE n.nspname LIKE 'or%' AND n.nspname NOT LIKE E'pg\\\\_%' LIMIT 1000",
    );
    assert_eq!(completions, "orders|\n");
    // Columns of a table, for `SELECT ... FROM orders WHERE `.
    let columns = rows(
        "SELECT a.attname FROM pg_catalog.pg_attribute a, pg_catalog.pg_class c \
         WHERE c.oid = a.attrelid AND a.attnum > 0 AND NOT a.attisdropped \
         AND a.attname LIKE 'p%' AND c.relname = 'orders' \
         AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 1",
    );
    assert!(columns.ends_with("placed\n"), "{columns}");
    for sql in [
        "SELECT 'orders'::regclass::oid = (SELECT oid FROM pg_class WHERE relname = 'orders')",
        "SELECT pg_typeof(1), current_setting('server_version_num')",
        "SELECT pg_catalog.version()",
        "SELECT NULL, NULL UNION SELECT NULL, NULL",
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
         WHERE attrelid = 'orders'::regclass AND attname = 'customer'",
    ] {
        rows(sql);
    }
    let varchar = rows(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
         WHERE attrelid = 'orders'::regclass AND attname = 'customer'",
    );
    assert!(varchar.ends_with("character varying(40)\n"), "{varchar}");
    // A scalar subquery's second row is PostgreSQL's error, not a silent choice.
    let err = psql(
        &conn,
        "SELECT (SELECT x FROM (VALUES (1), (1)) t(x) WHERE t.x = s.y) FROM (VALUES (1)) s(y)",
    )
    .unwrap_err();
    assert!(
        err.contains("more than one row returned by a subquery used as an expression"),
        "{err}"
    );
}
