//! Session control, as PostgreSQL 15 has it: `pg_stat_activity` shows each session (its own
//! process id, user, client, state and statement), `pg_cancel_backend` stops another
//! session's statement and `pg_terminate_backend` ends the session, idle or busy. A
//! `CREATE MATERIALIZED VIEW` stopped while it fills leaves nothing behind, and a CancelRequest
//! ends a `COPY ... FROM STDIN` whose data is coming. Where PostgreSQL answers the same
//! statements, its answers are the expected ones.

mod common;
#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/postgres.rs"]
mod postgres;

use std::time::Duration;

use bytes::Bytes;
use common::TestServer;
use futures::{pin_mut, SinkExt};
use postgres::Postgres;

/// A query over ten billion joined rows: it would run for hours, and is stopped long before.
const ENDLESS: &str =
    "SELECT sum(a * b) FROM generate_series(1, 100000) AS a, generate_series(1, 100000) AS b";

/// A connection, and its end: what the connection's task returned when the server closed it.
async fn connect_watched(
    conn: &str,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
        .await
        .expect("connect");
    (client, tokio::spawn(connection))
}

/// The rows of `sql` as text, or its error as `ERROR code: message`.
async fn outcome(client: &tokio_postgres::Client, sql: &str) -> String {
    match client.simple_query(sql).await {
        Ok(messages) => common::rows_as_text(messages).join("\n"),
        Err(e) => match e.as_db_error() {
            Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
            None => format!("ERROR {e}"),
        },
    }
}

/// The session's process id, by a simple query: a prepared one would leave the client closing
/// its statement afterwards, and a session terminated meanwhile would answer that instead.
async fn pid(client: &tokio_postgres::Client) -> i32 {
    outcome(client, "SELECT pg_backend_pid()")
        .await
        .parse()
        .unwrap()
}

/// The session `pid` as `pg_stat_activity` shows it to `reader`: state, query, application
/// name, and whether its transaction has a start.
async fn activity(reader: &tokio_postgres::Client, pid: i32) -> (String, String, String, bool) {
    let row = reader
        .query_one(
            "SELECT state, query, application_name, xact_start IS NOT NULL \
             FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// Waits (a bounded number of times) until `done` holds.
async fn eventually<F: std::future::Future<Output = bool>>(mut done: impl FnMut() -> F) {
    for _ in 0..400 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("not reached in 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_stat_activity_shows_every_session_and_what_it_runs() {
    let server = TestServer::start().await;
    let (a, _) = connect_watched(&format!("{} application_name=alpha", server.conn_str())).await;
    let b = server.connect().await;
    let (a_pid, b_pid) = (pid(&a).await, pid(&b).await);
    assert_ne!(a_pid, b_pid, "each session has its own process id");
    assert_ne!(a_pid, std::process::id() as i32);

    let rows = b
        .query(
            "SELECT pid, usename, datname, client_addr, client_port > 0, backend_type, \
                    backend_start <= now(), state_change >= backend_start \
             FROM pg_stat_activity ORDER BY pid",
            &[],
        )
        .await
        .unwrap();
    let shown: Vec<String> = rows
        .iter()
        .map(|r| {
            let (pid, user, db, addr): (i32, String, String, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let (port, kind, started, changed): (bool, String, bool, bool) =
                (r.get(4), r.get(5), r.get(6), r.get(7));
            format!("{pid} {user} {db} {addr} {port} {kind} {started} {changed}")
        })
        .collect();
    let mut pids = [a_pid, b_pid];
    pids.sort();
    let expected: Vec<String> = pids
        .iter()
        .map(|p| format!("{p} weir weir 127.0.0.1 true client backend true true"))
        .collect();
    assert_eq!(shown, expected);

    // Idle, its last statement shown; the reader itself is active, running its own query.
    assert_eq!(
        activity(&b, a_pid).await,
        (
            "idle".into(),
            "SELECT pg_backend_pid()".into(),
            "alpha".into(),
            false
        )
    );
    let own = "SELECT state, query FROM pg_stat_activity WHERE pid = pg_backend_pid()";
    assert_eq!(outcome(&b, own).await, format!("active {own}"));

    // A block: idle in it, then in it failed, then out of it; SET changes the name shown.
    a.batch_execute("BEGIN; SET application_name = 'beta'")
        .await
        .unwrap();
    assert_eq!(
        activity(&b, a_pid).await,
        (
            "idle in transaction".into(),
            "BEGIN; SET application_name = 'beta'".into(),
            "beta".into(),
            true
        )
    );
    a.batch_execute("SELECT 1 / 0").await.unwrap_err();
    let (state, query, _, in_block) = activity(&b, a_pid).await;
    assert_eq!(
        (state.as_str(), query.as_str(), in_block),
        ("idle in transaction (aborted)", "SELECT 1 / 0", true)
    );
    a.batch_execute("ROLLBACK").await.unwrap();
    let (state, _, name, in_block) = activity(&b, a_pid).await;
    assert_eq!(
        (state.as_str(), name.as_str(), in_block),
        ("idle", "alpha", false)
    );

    // Running: active, with its statement; cancelled by the other session, idle again.
    let a = std::sync::Arc::new(a);
    let running = {
        let a = a.clone();
        tokio::spawn(async move { a.simple_query(ENDLESS).await })
    };
    eventually(|| async { activity(&b, a_pid).await.0 == "active" }).await;
    assert_eq!(activity(&b, a_pid).await.1, ENDLESS);
    let cancel = format!("SELECT pg_cancel_backend({a_pid})");
    assert_eq!(outcome(&b, &cancel).await, "t");
    let err = running.await.unwrap().unwrap_err();
    let db = err.as_db_error().unwrap();
    assert_eq!(
        (db.code().code(), db.message()),
        ("57014", "canceling statement due to user request")
    );
    assert_eq!(activity(&b, a_pid).await.0, "idle");
    assert_eq!(outcome(&a, "SELECT 2").await, "2");

    // A session that has gone is no longer shown.
    drop(a);
    eventually(|| async {
        outcome(
            &b,
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {a_pid}"),
        )
        .await
            == "0"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_terminate_backend_ends_an_idle_and_a_busy_session() {
    let server = TestServer::start().await;
    let admin = server.connect().await;

    // Idle: its connection ends with 57P01 at once.
    let (idle, ended) = connect_watched(&server.conn_str()).await;
    let idle_pid = pid(&idle).await;
    let terminate = |p: i32| format!("SELECT pg_terminate_backend({p})");
    assert_eq!(outcome(&admin, &terminate(idle_pid)).await, "t");
    let err = ended.await.unwrap().unwrap_err();
    let db = err.as_db_error().expect("the server's error");
    assert_eq!(
        (db.severity(), db.code().code(), db.message()),
        (
            "FATAL",
            "57P01",
            "terminating connection due to administrator command"
        )
    );
    assert!(idle.is_closed());

    // Busy: its query stops, the client is told once, and the connection ends.
    let (busy, ended) = connect_watched(&server.conn_str()).await;
    let busy_pid = pid(&busy).await;
    let running = tokio::spawn(async move { busy.simple_query(ENDLESS).await });
    eventually(|| async { activity(&admin, busy_pid).await.0 == "active" }).await;
    assert_eq!(outcome(&admin, &terminate(busy_pid)).await, "t");
    let err = running.await.unwrap().unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "57P01");
    tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .expect("the connection ends")
        .unwrap()
        .ok();
    eventually(|| async {
        outcome(
            &admin,
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()",
        )
        .await
            == "0"
    })
    .await;
    // The server goes on.
    let again = server.connect().await;
    assert_eq!(outcome(&again, "SELECT 1").await, "1");
}

/// What PostgreSQL answers, Weir answers: the view's columns, the functions' results and
/// errors, a session cancelling or terminating itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_functions_answer_as_postgres_does() {
    let pg = Postgres::start().unwrap();
    let server = TestServer::start().await;
    let columns = "SELECT attname FROM pg_attribute \
         WHERE attrelid = 'pg_stat_activity'::regclass AND attnum > 0 ORDER BY attnum";
    let ours = server.connect().await;
    let theirs = common::connect(&pg.conn).await;
    let their_columns = outcome(&theirs, columns).await;
    let row = ours
        .query("SELECT * FROM pg_stat_activity LIMIT 1", &[])
        .await
        .unwrap();
    let our_columns: Vec<&str> = row[0].columns().iter().map(|c| c.name()).collect();
    assert_eq!(our_columns.join("\n"), their_columns);
    for sql in [
        "SELECT pg_backend_pid() > 0",
        "SELECT pg_cancel_backend(0), pg_terminate_backend(0)",
        "SELECT pg_terminate_backend(pg_backend_pid(), -1)",
        "SELECT pg_cancel_backend(NULL)",
        "SELECT count(*) FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        "SELECT pg_cancel_backend(pg_backend_pid())",
    ] {
        assert_eq!(
            outcome(&ours, sql).await,
            outcome(&theirs, sql).await,
            "{sql}"
        );
    }
    let sql = "SELECT pg_terminate_backend(pg_backend_pid())";
    assert_eq!(outcome(&ours, sql).await, outcome(&theirs, sql).await);
    // Both connections close (their clients notice the server's end a moment later).
    eventually(|| async { ours.is_closed() && theirs.is_closed() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_materialized_view_stopped_while_it_fills_leaves_nothing_behind() {
    // 4 MiB of a table's rows per barrier while a view fills: the table below takes several.
    let server = TestServer::start_with(|c| c.memory_limit = Some(64 << 20)).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, pad text);
             INSERT INTO t SELECT i, i % 10, repeat('x', 200) FROM generate_series(1, 100000) AS s(i);
             FLUSH",
        )
        .await
        .unwrap();
    let actors = || {
        let text = server.db.render_metrics();
        text.lines()
            .find_map(|l| l.strip_prefix("weir_dataflow_actors "))
            .and_then(|n| n.parse::<u64>().ok())
            .expect("the actors' gauge")
    };
    let before = actors();
    let create = "CREATE MATERIALIZED VIEW v AS SELECT g, count(*) AS n FROM t GROUP BY g";
    client
        .batch_execute("SET statement_timeout = '1ms'")
        .await
        .unwrap();
    assert_eq!(
        outcome(&client, create).await,
        "ERROR 57014: canceling statement due to statement timeout"
    );
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .unwrap();
    // Not in the catalog, and its actors stopped.
    assert_eq!(
        outcome(&client, "SELECT count(*) FROM pg_class WHERE relname = 'v'").await,
        "0"
    );
    assert_eq!(outcome(&client, "SHOW MATERIALIZED VIEWS").await, "");
    assert_eq!(actors(), before);
    // In a block, the block fails with it and leaves nothing either.
    client
        .batch_execute("BEGIN; SET LOCAL statement_timeout = '1ms'")
        .await
        .unwrap();
    assert!(outcome(&client, create).await.starts_with("ERROR 57014"));
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(actors(), before);
    // The name is free, and the view built again is whole.
    client.batch_execute(create).await.unwrap();
    assert_eq!(
        outcome(&client, "SELECT sum(n), count(*) FROM v").await,
        "100000 10"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_request_ends_a_copy_whose_data_is_coming() {
    let pg = Postgres::start().unwrap();
    let server = TestServer::start().await;
    let ours = server.connect().await;
    let theirs = common::connect(&pg.conn).await;
    let mut errors = Vec::new();
    for client in [&ours, &theirs] {
        client
            .batch_execute("CREATE TABLE c (id int, s text)")
            .await
            .unwrap();
        let sink = client
            .copy_in::<_, Bytes>("COPY c FROM STDIN")
            .await
            .unwrap();
        pin_mut!(sink);
        sink.send(Bytes::from_static(b"1\tone\n2\ttwo\n3\tthr"))
            .await
            .unwrap();
        sink.flush().await.unwrap();
        // The server has the data and waits for the rest when the cancel comes.
        tokio::time::sleep(Duration::from_millis(200)).await;
        client
            .cancel_token()
            .cancel_query(tokio_postgres::NoTls)
            .await
            .unwrap();
        // The request reaches the server (over its own connection) before more data does.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut sent = sink.send(Bytes::from_static(b"ee\n")).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sent.is_ok() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            sent = sink.send(Bytes::from_static(b"4\tfour\n")).await;
        }
        let err = match sent {
            Err(e) => e,
            Ok(()) => sink.finish().await.unwrap_err(),
        };
        let db = err.as_db_error().expect("the server's error");
        errors.push(format!(
            "{}: {} ({})",
            db.code().code(),
            db.message(),
            db.where_().unwrap_or_default()
        ));
        assert_eq!(outcome(client, "SELECT count(*) FROM c").await, "0");
    }
    // PostgreSQL notices a cancel only once a line ends, and names that line; Weir stops at
    // once, in the line it waits for the end of.
    assert_eq!(
        errors[1],
        "57014: canceling statement due to user request (COPY c, line 3: \"3\tthree\")"
    );
    assert_eq!(
        errors[0],
        "57014: canceling statement due to user request (COPY c, line 3)"
    );
}
