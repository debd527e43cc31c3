//! Whole-server behaviour: restarts keep every acknowledged change, limits refuse cleanly.

mod common;

use common::{ChildServer, TestServer};

/// How many barriers completed, as `/metrics` reports it.
fn barriers_completed(db: &weir::db::Database) -> u64 {
    let text = db.render_metrics();
    text.lines()
        .find_map(|l| l.strip_prefix("weir_barrier_latency_seconds_count "))
        .and_then(|n| n.parse().ok())
        .expect("the barrier latency's count in /metrics")
}

async fn rows(client: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    let mut out = common::text_rows(client, sql).await;
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_tables_and_views_from_the_change_logs() {
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE k (id int PRIMARY KEY, g text, v int);
             INSERT INTO k VALUES (1, 'a', 10), (2, 'a', 20), (3, 'b', 5);
             CREATE MATERIALIZED VIEW kv AS SELECT g, sum(v) AS s, max(v) AS m FROM k GROUP BY g;
             CREATE MATERIALIZED VIEW kv2 AS SELECT s FROM kv WHERE m > 6;
             CREATE MATERIALIZED VIEW pairs AS SELECT a.id, b.id AS other FROM k a LEFT JOIN k b ON a.g = b.g AND a.id < b.id;
             UPDATE k SET v = 1 WHERE id = 2;
             DELETE FROM k WHERE id = 3;",
        )
        .await
        .unwrap();
    // No FLUSH: acknowledged changes survive a clean stop anyway.
    assert!(server.stop(15).await.success());
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(rows(&client, "SELECT * FROM k").await, ["1 a 10", "2 a 1"]);
    assert_eq!(rows(&client, "SELECT * FROM kv").await, ["a 11 10"]);
    assert_eq!(rows(&client, "SELECT * FROM kv2").await, ["11"]);
    assert_eq!(
        rows(&client, "SELECT * FROM pairs").await,
        ["1 2", "2 NULL"]
    );
    // The primary key is still enforced, and the views still follow changes.
    let err = client
        .batch_execute("INSERT INTO k VALUES (1, 'z', 0)")
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "23505");
    client
        .batch_execute("INSERT INTO k VALUES (4, 'b', 7)")
        .await
        .unwrap();
    // A crash (SIGKILL) right after the acknowledgement loses nothing either.
    server.stop(9).await;
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(
        rows(&client, "SELECT * FROM kv").await,
        ["a 11 10", "b 7 7"]
    );
    assert_eq!(rows(&client, "SELECT * FROM kv2").await, ["11", "7"]);
    assert_eq!(
        rows(&client, "SELECT * FROM pairs").await,
        ["1 2", "2 NULL", "4 NULL"]
    );
    // Dropped objects stay dropped.
    client.batch_execute("DROP TABLE k CASCADE").await.unwrap();
    assert!(server.stop(15).await.success());
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    assert!(rows(&client, "SHOW TABLES").await.is_empty());
    assert!(server.stop(15).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused_with_53300() {
    let server = TestServer::start_with(|c| c.connections_max = 2).await;
    let a = server.connect().await;
    let b = server.connect().await;
    let err = tokio_postgres::connect(&server.conn_str(), tokio_postgres::NoTls)
        .await
        .err()
        .expect("third connection refused");
    assert_eq!(err.as_db_error().unwrap().code().code(), "53300");
    drop(a);
    // The freed place can be taken again once the first connection has gone.
    let mut ok = false;
    for _ in 0..50 {
        if tokio_postgres::connect(&server.conn_str(), tokio_postgres::NoTls)
            .await
            .is_ok()
        {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ok, "a place was freed");
    b.simple_query("SELECT 1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_statements_are_refused_with_54000() {
    let server = TestServer::start_with(|c| c.statement_bytes_max = 1000).await;
    let client = server.connect().await;
    let big = format!("SELECT '{}'", "x".repeat(2000));
    let err = client.simple_query(&big).await.unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "54000");
    client.simple_query("SELECT 1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_numbers_are_checked_before_anything_is_sized_by_them() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    for (sql, code) in [
        ("SELECT $100000000000::int", "54000"),
        ("SELECT $65536::int", "54000"),
        ("SELECT $0::int", "42P02"),
        ("SELECT $99999999999999999999999::int", "42601"),
    ] {
        let err = client.prepare(sql).await.unwrap_err();
        assert_eq!(err.as_db_error().unwrap().code().code(), code, "{sql}");
    }
    // The most a statement can have is fine.
    let top = client.prepare("SELECT $65535::int").await.unwrap();
    assert_eq!(top.params().len(), 65_535);
    client.simple_query("SELECT 1").await.unwrap();
}

/// A query over ten billion joined rows: it would run for hours, and is stopped long before.
const ENDLESS: &str =
    "SELECT sum(a * b) FROM generate_series(1, 100000) AS a, generate_series(1, 100000) AS b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_stops_a_query_and_the_session_goes_on() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    for bad in ["'-1'", "'5 weeks'", "'soon'", "'3000000000'", "'1e400'"] {
        let err = client
            .batch_execute(&format!("SET statement_timeout = {bad}"))
            .await
            .unwrap_err();
        assert_eq!(err.as_db_error().unwrap().code().code(), "22023", "{bad}");
    }
    client
        .batch_execute("SET statement_timeout = '200ms'")
        .await
        .unwrap();
    let err = client.simple_query(ENDLESS).await.unwrap_err();
    let db = err.as_db_error().unwrap();
    assert_eq!(db.code().code(), "57014");
    assert_eq!(db.message(), "canceling statement due to statement timeout");
    assert_eq!(
        rows(&client, "SHOW statement_timeout").await,
        ["200ms".to_string()]
    );
    assert_eq!(
        rows(&client, "SELECT count(*) FROM generate_series(1, 1000)").await,
        ["1000".to_string()]
    );
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .unwrap();
    assert_eq!(
        rows(&client, "SELECT count(*) FROM generate_series(1, 1000)").await,
        ["1000".to_string()]
    );
}

/// A write is stopped while its rows are computed (an `INSERT ... SELECT` whose query runs
/// for ever), and nothing of it is written; the session goes on writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_stops_a_write_while_its_rows_are_computed() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    client
        .batch_execute("CREATE TABLE t (n bigint); SET statement_timeout = '200ms'")
        .await
        .unwrap();
    for write in [
        "INSERT INTO t SELECT count(*) FROM generate_series(1, 100000) AS x(x), \
         generate_series(1, 100000) AS y(y)"
            .to_string(),
        "DELETE FROM t WHERE n < (SELECT count(*) FROM generate_series(1, 100000) AS x(x), \
         generate_series(1, 100000) AS y(y))"
            .to_string(),
    ] {
        let err = client.simple_query(&write).await.unwrap_err();
        let db = err.as_db_error().unwrap();
        assert_eq!(db.code().code(), "57014", "{write}");
        assert_eq!(db.message(), "canceling statement due to statement timeout");
    }
    client
        .batch_execute("INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    assert_eq!(rows(&client, "SELECT n FROM t").await, ["1".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_request_stops_the_running_query_of_its_session_only() {
    let server = TestServer::start().await;
    let client = std::sync::Arc::new(server.connect().await);
    let other = server.connect().await;
    let running = {
        let client = client.clone();
        tokio::spawn(async move { client.simple_query(ENDLESS).await })
    };
    // A request for another session stops nothing here.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    other
        .cancel_token()
        .cancel_query(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!running.is_finished());
    // Sent until the query has started and stopped (a request that comes before the query
    // starts has nothing to stop, as in PostgreSQL).
    let token = client.cancel_token();
    while !running.is_finished() {
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let err = running.await.unwrap().unwrap_err();
    let db = err.as_db_error().unwrap();
    assert_eq!(db.code().code(), "57014");
    assert_eq!(db.message(), "canceling statement due to user request");
    assert_eq!(
        rows(&client, "SELECT count(*) FROM generate_series(1, 1000)").await,
        ["1000".to_string()]
    );
    assert_eq!(rows(&other, "SELECT 1").await, ["1".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_the_memory_limit_is_refused_with_53200_and_the_session_goes_on() {
    // Batch queries get half: 32 MiB.
    let server = TestServer::start_with(|c| c.memory_limit = Some(64 << 20)).await;
    let client = server.connect().await;
    // The hash table of three million rows, which a hash join cannot spill.
    let err = client
        .simple_query(
            "SELECT count(*) FROM generate_series(1, 3000000) AS a \
             JOIN generate_series(1, 3000000) AS b ON a = b",
        )
        .await
        .unwrap_err();
    let db = err.as_db_error().unwrap();
    assert_eq!(db.code().code(), "53200", "{}", db.message());
    assert!(db.hint().unwrap().contains("memory_limit"));
    // What it held is back in the pool: a query that fits runs.
    assert_eq!(
        rows(
            &client,
            "SELECT count(*) FROM generate_series(1, 30000) AS a \
             JOIN generate_series(1, 30000) AS b ON a = b"
        )
        .await,
        ["30000".to_string()]
    );
    // A function's results are reserved before they are built: 100 MB of one value, or of
    // one batch's values, is more than is free, and nothing of it is allocated.
    for sql in [
        "SELECT length(repeat('x', 100000000))",
        "SELECT sum(length(lpad('', 20000 + g % 2, 'ab'))) FROM generate_series(1, 5000) AS t(g)",
    ] {
        let err = client.simple_query(sql).await.unwrap_err();
        let db = err.as_db_error().unwrap();
        assert_eq!(db.code().code(), "53200", "{sql}: {}", db.message());
    }
    assert_eq!(
        rows(&client, "SELECT length(repeat('x', 1000000))").await,
        ["1000000".to_string()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_disk_holds_up_only_the_writes_that_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // From its first hit on, every fsync of a change log takes seconds.
    let server =
        ChildServer::start_with_env(&data, &[], &[("WEIR_FAILPOINTS", "changelog.sync:stall")])
            .await;
    let setup = server.connect().await;
    for i in 0..4 {
        setup
            .batch_execute(&format!("CREATE TABLE s{i} (a int)"))
            .await
            .unwrap();
    }
    let reader = server.connect().await;
    // More writers waiting for the disk than the server has cores.
    let mut writers = Vec::new();
    for i in 0..4 {
        let client = server.connect().await;
        writers.push(tokio::spawn(async move {
            client
                .batch_execute(&format!("INSERT INTO s{i} VALUES ({i})"))
                .await
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // Other clients, new connections and DDL are served while the writers wait.
    assert_eq!(rows(&reader, "SELECT 1").await, ["1".to_string()]);
    let other = server.connect().await;
    assert_eq!(rows(&other, "SELECT 2").await, ["2".to_string()]);
    other
        .batch_execute("CREATE TABLE s4 (a int)")
        .await
        .unwrap();
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "the clients above were served only after a write had reached the disk"
    );
    for w in writers {
        w.await.unwrap().unwrap();
    }
    setup.batch_execute("FLUSH").await.unwrap();
    for i in 0..4 {
        let sql = format!("SELECT a FROM s{i}");
        assert_eq!(rows(&setup, &sql).await, [i.to_string()]);
    }
}

/// Actors whose reads of their state wait on a slow disk hold up the dataflow only: clients,
/// new connections and queries of sealed rows are served meanwhile, on threads of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actors_waiting_on_the_disk_hold_up_no_client() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // From the 50th read of the state store on (past the setup's few), every read takes
    // seconds. A relation reads the count of a row it holds at the barrier that changes it
    // (a row it never held costs no read): the tables' actors stall at the barrier that keeps
    // second copies of the rows the setup sealed.
    let server =
        ChildServer::start_with_env(&data, &[], &[("WEIR_FAILPOINTS", "state.read@50:stall")])
            .await;
    let setup = server.connect().await;
    setup
        .batch_execute(
            "CREATE TABLE s0 (a int); CREATE TABLE s1 (a int);
             INSERT INTO s0 SELECT value FROM generate_series(1, 1000);
             INSERT INTO s1 SELECT value FROM generate_series(1, 1000); FLUSH",
        )
        .await
        .unwrap();
    for t in ["s0", "s1"] {
        setup
            .batch_execute(&format!(
                "INSERT INTO {t} SELECT value FROM generate_series(1, 1000)"
            ))
            .await
            .unwrap();
    }
    // More stalled actors than the server has cores; the barrier waits for them.
    let waiting = server.connect().await;
    let flush = tokio::spawn(async move { waiting.batch_execute("FLUSH").await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // A default reader of s0 waits for the writes acknowledged before it, which the stalled
    // barrier holds; one that reads the last sealed epoch is served.
    let fresh = server.connect().await;
    let waiting_read = tokio::spawn(async move {
        fresh
            .simple_query("SELECT count(*) FROM s0")
            .await
            .map(|_| ())
    });
    let served = async {
        assert_eq!(rows(&setup, "SELECT 1").await, ["1".to_string()]);
        let other = server.connect().await;
        other
            .batch_execute("SET read_after_write = off")
            .await
            .unwrap();
        assert_eq!(
            rows(&other, "SELECT count(*) FROM s0").await,
            ["1000".to_string()]
        );
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), served)
        .await
        .expect("clients waited for the stalled actors");
    assert!(!flush.is_finished(), "the actors never stalled");
    assert!(
        !waiting_read.is_finished(),
        "a read missed acknowledged writes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_stops_its_running_query() {
    // One connection at a time: the next is admitted only once the query of the one before
    // has stopped and its connection has ended.
    let server = TestServer::start_with(|c| c.connections_max = 1).await;
    let (client, conn) = tokio_postgres::connect(&server.conn_str(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let socket = tokio::spawn(conn);
    let running = tokio::spawn(async move { client.simple_query(ENDLESS).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!running.is_finished());
    // The client goes away without a word: its socket is closed.
    socket.abort();
    running.abort();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let next = loop {
        match tokio_postgres::connect(&server.conn_str(), tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                break client;
            }
            Err(e) => {
                assert_eq!(e.code().map(|c| c.code()), Some("53300"), "{e}");
                assert!(
                    std::time::Instant::now() < deadline,
                    "the query of a client that hung up is still running"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(rows(&next, "SELECT 1").await, ["1".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_and_a_view_created_mid_stream_agree_with_the_table() {
    let server = TestServer::start_with(|c| c.barrier_interval_ms = 20).await;
    let admin = server.connect().await;
    admin
        .batch_execute(
            "CREATE TABLE w (k int, v int);
             CREATE MATERIALIZED VIEW early AS SELECT k, count(*) AS c, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM w GROUP BY k;",
        )
        .await
        .unwrap();
    let mut writers = Vec::new();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let mut started_tx = Some(started_tx);
    for w in 0..4i32 {
        let client = server.connect().await;
        let mut started = if w == 0 { started_tx.take() } else { None };
        writers.push(tokio::spawn(async move {
            for i in 0..60i32 {
                if i == 20 {
                    if let Some(tx) = started.take() {
                        let _ = tx.send(());
                    }
                }
                let k = (i * 7 + w) % 5;
                client
                    .batch_execute(&format!(
                        "INSERT INTO w VALUES ({k}, {}), ({k}, {})",
                        w * 1000 + i,
                        -i
                    ))
                    .await
                    .unwrap();
                if i % 10 == 9 {
                    client
                        .batch_execute(&format!("DELETE FROM w WHERE v = {}", w * 1000 + i - 3))
                        .await
                        .unwrap();
                    client
                        .batch_execute(&format!("UPDATE w SET v = v + 1 WHERE v = {}", -i))
                        .await
                        .unwrap();
                }
            }
        }));
    }
    // Created while the writers run: it must backfill exactly what came before it.
    started_rx.await.unwrap();
    admin
        .batch_execute("CREATE MATERIALIZED VIEW late AS SELECT k, count(*) AS c, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM w GROUP BY k")
        .await
        .unwrap();
    for w in writers {
        w.await.unwrap();
    }
    admin.batch_execute("FLUSH").await.unwrap();
    let expected = rows(
        &admin,
        "SELECT k, count(*), sum(v), min(v), max(v) FROM w GROUP BY k",
    )
    .await;
    assert_eq!(expected.len(), 5);
    assert_eq!(rows(&admin, "SELECT * FROM early").await, expected);
    assert_eq!(rows(&admin, "SELECT * FROM late").await, expected);
    let total: Vec<String> = rows(&admin, "SELECT count(*) FROM w").await;
    assert_eq!(total, [(4 * 60 * 2 - 4 * 6).to_string()]);
}

/// Temporal filters follow the dataflow's clock: a row leaves `now() - 1 hour` windows when
/// the clock passes its time plus an hour, and `<=` conditions let rows in as time passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporal_filters_follow_the_clock() {
    let hour: i64 = 3_600_000_000;
    // 2024-01-01 12:00:00 UTC.
    let noon: i64 = 1_704_110_400_000_000;
    let clock = weir::clock::ManualClock::new(noon);
    let injected = clock.clone();
    let server = TestServer::start_with(move |c| c.clock = std::sync::Arc::new(injected)).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE events (id int, at timestamp);
             CREATE MATERIALIZED VIEW recent AS SELECT id FROM events WHERE at > now() - INTERVAL '1 hour';
             CREATE MATERIALIZED VIEW recent_count AS SELECT count(*) AS n FROM events WHERE now() - INTERVAL '1 hour' < at AND id > 0;
             CREATE MATERIALIZED VIEW settled AS SELECT id FROM events WHERE at <= now() - INTERVAL '30 minutes';
             INSERT INTO events VALUES (1, '2024-01-01 11:30:00'), (2, '2024-01-01 10:00:00'), (3, '2024-01-01 12:10:00'), (4, NULL);
             FLUSH;",
        )
        .await
        .unwrap();
    assert_eq!(rows(&client, "SELECT * FROM recent").await, ["1", "3"]);
    assert_eq!(rows(&client, "SELECT * FROM recent_count").await, ["2"]);
    assert_eq!(rows(&client, "SELECT * FROM settled").await, ["1", "2"]);
    clock.set(noon + hour * 3 / 4);
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(rows(&client, "SELECT * FROM recent").await, ["3"]);
    assert_eq!(rows(&client, "SELECT * FROM recent_count").await, ["1"]);
    assert_eq!(
        rows(&client, "SELECT * FROM settled").await,
        ["1", "2", "3"]
    );
    // A view created now reads the table at the current time; a deleted row leaves every view.
    client
        .batch_execute(
            "CREATE MATERIALIZED VIEW late_recent AS SELECT id FROM events WHERE at > now() - INTERVAL '1 hour';
             DELETE FROM events WHERE id = 3;
             FLUSH;",
        )
        .await
        .unwrap();
    assert!(rows(&client, "SELECT * FROM late_recent").await.is_empty());
    assert!(rows(&client, "SELECT * FROM recent").await.is_empty());
    assert_eq!(rows(&client, "SELECT * FROM recent_count").await, ["0"]);
    assert_eq!(rows(&client, "SELECT * FROM settled").await, ["1", "2"]);
    // now() elsewhere than such a condition is refused.
    let err = client
        .batch_execute("CREATE MATERIALIZED VIEW stamped AS SELECT id, now() AS t FROM events")
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "0A000");
    server.stop().await;
}

/// Views that can be split by key run as parallel actors, each owning part of the keys; their
/// results are those of one actor, through changes, a restart and a drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_views_agree_with_one_actor_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "SET streaming_parallelism = 4;
             CREATE TABLE s (id int PRIMARY KEY, g int, v int);
             CREATE TABLE u (g int, name text);
             CREATE MATERIALIZED VIEW by_g AS SELECT g, count(*) AS n, sum(v) AS total, max(v) AS top FROM s GROUP BY g;
             CREATE MATERIALIZED VIEW named AS SELECT u.name, s.v FROM s LEFT JOIN u ON s.g = u.g;
             CREATE MATERIALIZED VIEW per_name AS SELECT u.name, count(*) AS n, sum(s.v) AS total FROM s JOIN u ON s.g = u.g GROUP BY u.name;
             CREATE MATERIALIZED VIEW sizes AS SELECT n, count(*) AS groups FROM (SELECT g, count(*) AS n FROM s GROUP BY g) AS c GROUP BY n;
             CREATE MATERIALIZED VIEW largest AS SELECT max(n) AS n FROM (SELECT g, count(*) AS n FROM s GROUP BY g) AS c;
             SET streaming_parallelism = 1;
             CREATE MATERIALIZED VIEW by_g_one AS SELECT g, count(*) AS n, sum(v) AS total, max(v) AS top FROM s GROUP BY g;
             SET streaming_parallelism = 3;
             CREATE MATERIALIZED VIEW overall AS SELECT count(*) AS n FROM s;",
        )
        .await
        .unwrap();
    let mut values = Vec::new();
    for i in 0..300 {
        values.push(format!("({i}, {}, {})", i % 17, i * 7 % 101));
    }
    client
        .batch_execute(&format!(
            "INSERT INTO s VALUES {};
             INSERT INTO u VALUES (1, 'one'), (2, 'two'), (2, 'deux'), (NULL, 'none');
             UPDATE s SET g = g + 1 WHERE id % 5 = 0;
             DELETE FROM s WHERE id % 7 = 0;
             DELETE FROM u WHERE name = 'deux';
             FLUSH;",
            values.join(", ")
        ))
        .await
        .unwrap();
    let check = |client: tokio_postgres::Client| async move {
        let parallel = rows(&client, "SELECT * FROM by_g").await;
        assert_eq!(parallel.len(), 18);
        assert_eq!(parallel, rows(&client, "SELECT * FROM by_g_one").await);
        assert_eq!(
            parallel,
            rows(
                &client,
                "SELECT g, count(*), sum(v), max(v) FROM s GROUP BY g"
            )
            .await
        );
        assert_eq!(
            rows(&client, "SELECT * FROM named").await,
            rows(
                &client,
                "SELECT u.name, s.v FROM s LEFT JOIN u ON s.g = u.g"
            )
            .await
        );
        assert_eq!(rows(&client, "SELECT * FROM overall").await, ["257"]);
        // Views of several parallel fragments: a join under an aggregate, an aggregate over
        // an aggregate, and a global one over a grouped one.
        for (view, query) in [
            (
                "per_name",
                "SELECT u.name, count(*), sum(s.v) FROM s JOIN u ON s.g = u.g GROUP BY u.name",
            ),
            (
                "sizes",
                "SELECT n, count(*) FROM (SELECT g, count(*) AS n FROM s GROUP BY g) AS c GROUP BY n",
            ),
            (
                "largest",
                "SELECT max(n) FROM (SELECT g, count(*) AS n FROM s GROUP BY g) AS c",
            ),
        ] {
            let expected = rows(&client, query).await;
            assert!(!expected.is_empty());
            assert_eq!(
                rows(&client, &format!("SELECT * FROM {view}")).await,
                expected,
                "{view}"
            );
        }
        let shown: Vec<String> = rows(&client, "SHOW MATERIALIZED VIEWS")
            .await
            .into_iter()
            .map(|r| r.split(' ').take(3).collect::<Vec<_>>().join(" "))
            .collect();
        // A global aggregate runs in two steps: partial counts in parallel, then their sum.
        assert_eq!(
            shown,
            [
                "by_g running 4",
                "by_g_one running 1",
                "largest running 4",
                "named running 4",
                "overall running 3",
                "per_name running 4",
                "sizes running 4"
            ]
        );
        client
    };
    let client = check(client).await;
    drop(client);
    assert!(server.stop(15).await.success());
    // Views keep the parallelism they were created with.
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    let client = check(client).await;
    client
        .batch_execute("DROP MATERIALIZED VIEW by_g; DROP TABLE s CASCADE; FLUSH;")
        .await
        .unwrap();
    assert!(rows(&client, "SHOW MATERIALIZED VIEWS").await.is_empty());
    let err = client
        .batch_execute("SET streaming_parallelism = 0")
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "22023");
    assert!(server.stop(15).await.success());
}

/// Every query reads one sealed epoch: while rows stream in, each snapshot of a parallel view,
/// a two-step global aggregate, a join under an aggregate (two parallel fragments) and their
/// table holds the same prefix of the input, never half an epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_each_view_at_the_same_prefix_of_the_input() {
    let server = TestServer::start_with(|c| {
        c.barrier_interval_ms = 5;
        c.streaming_parallelism = 2;
    })
    .await;
    let setup = server.connect().await;
    setup
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int);
             CREATE TABLE u (g int, name text);
             INSERT INTO u VALUES (0, 'a'), (1, 'b'), (2, 'a'), (3, 'c'), (4, 'b'), (5, 'a'), (6, 'd');
             CREATE MATERIALIZED VIEW by_g AS SELECT g, count(*) AS n, max(id) AS top FROM t GROUP BY g;
             CREATE MATERIALIZED VIEW total AS SELECT count(*) AS n, max(id) AS top FROM t;
             CREATE MATERIALIZED VIEW per_name AS SELECT u.name, count(*) AS n FROM t JOIN u ON t.g = u.g GROUP BY u.name;",
        )
        .await
        .unwrap();
    let writer = server.connect().await;
    let rows_written: i64 = 600;
    let write = tokio::spawn(async move {
        // Ids go up one statement at a time, so every prefix is "ids below some n".
        for i in 0..rows_written {
            writer
                .batch_execute(&format!("INSERT INTO t VALUES ({i}, {})", i % 7))
                .await
                .unwrap();
        }
    });
    let reader = server.connect().await;
    let mut snapshots = 0;
    let mut distinct_prefixes = std::collections::BTreeSet::new();
    loop {
        let done = write.is_finished();
        let row = rows(
            &reader,
            "SELECT (SELECT count(*) FROM t), (SELECT coalesce(sum(n), 0) FROM by_g), \
             (SELECT n FROM total), (SELECT coalesce(max(top), -1) FROM by_g), \
             (SELECT coalesce(top, -1) FROM total), (SELECT coalesce(sum(n), 0) FROM per_name)",
        )
        .await;
        let v: Vec<i64> = row[0].split(' ').map(|x| x.parse().unwrap()).collect();
        // The table, both views and their largest id all describe the same prefix.
        assert_eq!(v[0], v[1], "parallel view and table disagree: {v:?}");
        assert_eq!(v[0], v[2], "view and table disagree: {v:?}");
        assert_eq!(v[3], v[0] - 1, "not a prefix: {v:?}");
        assert_eq!(v[4], v[0] - 1, "not a prefix: {v:?}");
        assert_eq!(v[5], v[0], "join under aggregate and table disagree: {v:?}");
        distinct_prefixes.insert(v[0]);
        snapshots += 1;
        if done {
            break;
        }
    }
    write.await.unwrap();
    reader.batch_execute("FLUSH").await.unwrap();
    assert_eq!(
        rows(&reader, "SELECT n FROM total").await,
        [rows_written.to_string()]
    );
    // The readers saw the input grow, not just its start and end.
    assert!(
        distinct_prefixes.len() > 3,
        "{snapshots} snapshots, {distinct_prefixes:?}"
    );
    server.stop().await;
}

/// An `INSERT ... SELECT` of endless rows is spooled to disk as it is computed, not gathered
/// in memory (before spooling, 200 million rows took the server past 3 GiB before failing
/// with 54000): stopped by `statement_timeout` while it computes its rows, it applies nothing,
/// the server stays under 1 GiB, and its spool file is gone. (A statement of a fixed number of
/// rows would end before the timeout on a fast enough machine; `temp_disk_limit` keeps what
/// it writes meanwhile far below what a disk can take in 3 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_larger_than_memory_is_spooled_not_gathered() {
    const GIB: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, format!("temp_disk_limit = {}\n", 24 * GIB)).unwrap();
    let server = ChildServer::start_with(&data, &["--config", config.to_str().unwrap()]).await;
    let client = server.connect().await;
    client
        .batch_execute("CREATE TABLE t (a bigint, b bigint); SET statement_timeout = '3s'")
        .await
        .unwrap();
    let insert = client.batch_execute(
        "INSERT INTO t SELECT value, -value FROM generate_series(1, 9000000000000000000)",
    );
    let spooled = std::cell::Cell::new(false);
    let look = async {
        loop {
            if std::fs::read_dir(data.join("spool")).unwrap().count() > 0 {
                spooled.set(true);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    let e = common::within_rss(server.pid(), GIB, async {
        tokio::select! {
            result = insert => result.unwrap_err(),
            () = look => unreachable!(),
        }
    })
    .await;
    assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{e}");
    assert!(spooled.get(), "the rows went to a spool file");
    assert_eq!(rows(&client, "SELECT count(*) FROM t").await, ["0"]);
    assert_eq!(std::fs::read_dir(data.join("spool")).unwrap().count(), 0);
}

/// A view created over a table that takes inserts, updates and deletes all the while receives
/// the table's rows a part per barrier, and ends equal to its query: changes of rows already
/// sent go on to it, those of rows still to come wait for their part. Aggregates, filters and
/// a self-join, each on one actor and on parallel ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_backfilled_while_their_table_changes_equal_their_query() {
    const ROWS: i64 = 300_000;
    let server = TestServer::start_with(|c| {
        // The smallest parts (a 64th of memory_limit, at least 4 MiB, a barrier), and barriers
        // only when asked for, so that those of the backfill can be counted.
        c.memory_limit = Some(256 << 20);
        c.barrier_interval_ms = 3_600_000;
    })
    .await;
    let c = server.connect().await;
    c.batch_execute("CREATE TABLE t (id bigint PRIMARY KEY, g bigint, pad text)")
        .await
        .unwrap();
    for first in (0..ROWS).step_by(20_000) {
        c.batch_execute(&format!(
            "INSERT INTO t SELECT value, value % 7, md5(value::text) FROM generate_series({first}, {})",
            first + 19_999
        ))
        .await
        .unwrap();
    }
    c.batch_execute("FLUSH").await.unwrap();
    let views = [
        "CREATE MATERIALIZED VIEW kept AS SELECT id, g, pad FROM t WHERE g <> 3",
        "CREATE MATERIALIZED VIEW per_g AS SELECT g, count(*) AS n, sum(id) AS s, min(pad) AS lo FROM t GROUP BY g",
        "CREATE MATERIALIZED VIEW pairs AS SELECT a.id, b.id AS next FROM t a JOIN t b ON b.id = a.id + 1 WHERE a.g = 2",
    ];
    let checks = [
        ("kept", "SELECT id, g, pad FROM t WHERE g <> 3"),
        (
            "per_g",
            "SELECT g, count(*), sum(id), min(pad) FROM t GROUP BY g",
        ),
        (
            "pairs",
            "SELECT a.id, b.id AS next FROM t a JOIN t b ON b.id = a.id + 1 WHERE a.g = 2",
        ),
    ];
    for parallelism in [1, 2] {
        let writer = server.connect().await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writing = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut rng = weir::rng::Rng::new(parallelism);
                // New keys below and above the table's first ones.
                let (mut low, mut high) = (
                    -(parallelism as i64) * 1_000_000,
                    ROWS * 10 * parallelism as i64,
                );
                let mut statements = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Rows all over the key space: behind the parts sent and ahead of them.
                    let id = rng.below(ROWS as u64) as i64;
                    let sql = match rng.below(3) {
                        0 => format!("UPDATE t SET g = g + 1, pad = 'changed' WHERE id = {id}"),
                        1 => format!("DELETE FROM t WHERE id = {id}"),
                        _ => {
                            low -= 1;
                            high += 1;
                            format!("INSERT INTO t VALUES ({low}, 2, 'new'), ({high}, 2, 'late')")
                        }
                    };
                    writer.batch_execute(&sql).await.unwrap();
                    statements += 1;
                }
                statements
            })
        };
        let barriers_before = barriers_completed(&server.db);
        c.batch_execute(&format!("SET streaming_parallelism = {parallelism}"))
            .await
            .unwrap();
        for view in views {
            c.batch_execute(view).await.unwrap();
        }
        let barriers = barriers_completed(&server.db) - barriers_before;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let statements = writing.await.unwrap();
        assert!(
            statements > 10,
            "only {statements} writes ran during the backfills"
        );
        // Each view took several barriers: its table's rows came a part at a time.
        assert!(barriers >= 2 * views.len() as u64, "{barriers} barriers");
        c.batch_execute("FLUSH").await.unwrap();
        // Each view's rows are distinct: the same count and nothing missing is equality.
        for (view, query) in checks {
            let count = |q: &str| format!("SELECT count(*) FROM ({q}) AS r");
            let missing =
                format!("SELECT count(*) FROM (({query}) EXCEPT (SELECT * FROM {view})) AS d");
            assert_eq!(
                rows(&c, &count(&format!("SELECT * FROM {view}"))).await,
                rows(&c, &count(query)).await,
                "{view} has other rows than its query"
            );
            assert_eq!(rows(&c, &missing).await, ["0"], "{view} misses rows");
        }
        c.batch_execute("DROP MATERIALIZED VIEW kept, per_g, pairs")
            .await
            .unwrap();
    }
}

/// A read sees every write acknowledged before it, from any connection, without waiting for
/// the barrier interval (an hour here); a read with nothing written since the last seal takes
/// no barrier; with `read_after_write = off` a read takes the last sealed epoch at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_see_every_write_acknowledged_before_them() {
    let server = TestServer::start_with(|c| {
        c.barrier_interval_ms = 3_600_000;
        c.checkpoint.interval_ms = 0;
    })
    .await;
    let (writer, reader) = (server.connect().await, server.connect().await);
    writer
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int);
             CREATE MATERIALIZED VIEW s AS SELECT count(*) AS n, sum(v) AS s FROM t",
        )
        .await
        .unwrap();
    for i in 1..=20 {
        writer
            .execute("INSERT INTO t VALUES ($1, $1)", &[&i])
            .await
            .unwrap();
        writer
            .execute("UPDATE t SET v = v * 10 WHERE id = $1", &[&i])
            .await
            .unwrap();
        let sum = 10 * i * (i + 1) / 2;
        assert_eq!(
            common::text_rows(&reader, "SELECT count(*), sum(v) FROM t").await,
            [format!("{i} {sum}")]
        );
        assert_eq!(
            common::text_rows(&reader, "SELECT n, s FROM s").await,
            [format!("{i} {sum}")]
        );
    }
    let before = barriers_completed(&server.db);
    for _ in 0..10 {
        assert_eq!(common::text_rows(&reader, "SELECT n FROM s").await, ["20"]);
    }
    assert_eq!(
        barriers_completed(&server.db),
        before,
        "reads with nothing new"
    );

    reader
        .batch_execute("SET read_after_write = off")
        .await
        .unwrap();
    assert_eq!(
        common::text_rows(&reader, "SHOW read_after_write").await,
        ["off"]
    );
    writer
        .batch_execute("INSERT INTO t VALUES (21, 0)")
        .await
        .unwrap();
    assert_eq!(common::text_rows(&reader, "SELECT n FROM s").await, ["20"]);
    reader
        .batch_execute("SET read_after_write = DEFAULT")
        .await
        .unwrap();
    assert_eq!(common::text_rows(&reader, "SELECT n FROM s").await, ["21"]);
    let err = reader
        .batch_execute("SET read_after_write = maybe")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("22023"));
    assert_eq!(
        common::text_rows(&reader, "SHOW read_after_write").await,
        ["on"]
    );
}

/// A client that goes away in the middle of a transaction block takes the block's DDL with
/// it: what the block created is dropped and what it dropped stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_its_client_leaves_open_leaves_no_ddl_behind() {
    let server = TestServer::start().await;
    let a = server.connect().await;
    a.batch_execute(
        "CREATE TABLE keep (x int);
         BEGIN;
         CREATE TABLE gone (x int);
         INSERT INTO gone VALUES (1);
         CREATE MATERIALIZED VIEW gone_count AS SELECT count(*) AS n FROM gone;
         DROP TABLE keep;",
    )
    .await
    .unwrap();
    let b = server.connect().await;
    assert_eq!(rows(&b, "SHOW TABLES").await, ["keep"]);
    let err = b
        .batch_execute("CREATE TABLE gone (y int)")
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "42P07");
    drop(a);
    // The server notices the hang-up when it reads the connection's end.
    let mut created = false;
    for _ in 0..50 {
        if b.batch_execute("CREATE TABLE gone (y int)").await.is_ok() {
            created = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        created,
        "the name the block took is free once its client has gone"
    );
    assert_eq!(rows(&b, "SHOW TABLES").await, ["gone", "keep"]);
    assert!(rows(&b, "SHOW MATERIALIZED VIEWS").await.is_empty());
    assert_eq!(
        rows(&b, "SELECT count(*), count(y) FROM gone").await,
        ["0 0"]
    );
}

/// A block's DROP that another session has since built a view on fails at COMMIT with 2BP01
/// (PostgreSQL would have made the other session wait), and the whole block is undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_another_session_built_on_meanwhile_fails_its_commit_with_2bp01() {
    let server = TestServer::start().await;
    let a = server.connect().await;
    let b = server.connect().await;
    a.batch_execute(
        "CREATE TABLE t (x int);
         BEGIN;
         CREATE TABLE made (x int);
         DROP TABLE t;",
    )
    .await
    .unwrap();
    b.batch_execute("CREATE MATERIALIZED VIEW tv AS SELECT count(*) AS n FROM t")
        .await
        .unwrap();
    let err = a.batch_execute("COMMIT").await.unwrap_err();
    let db = err.as_db_error().unwrap();
    assert_eq!(db.code().code(), "2BP01", "{db:?}");
    assert!(db.message().contains("cannot drop table t"), "{db:?}");
    assert_eq!(rows(&a, "SHOW TABLES").await, ["t"]);
    assert_eq!(rows(&a, "SELECT n FROM tv").await, ["0"]);
}

async fn shown(client: &tokio_postgres::Client, kind: &str, name: &str) -> Vec<String> {
    common::text_rows(client, &format!("SHOW CREATE {kind} {name}")).await
}

/// SHOW CREATE gives each table's, source's, view's and sink's statement as written, which
/// creates the same object again, and a restart keeps it; what is not of the kind named is
/// refused as PostgreSQL refuses such names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_create_gives_the_statement_that_creates_each_object() {
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    let statements = [
        ("TABLE", "t", "CREATE TABLE t (id int PRIMARY KEY, name varchar(20) NOT NULL, at timestamp, WATERMARK FOR at AS at - INTERVAL '5' SECOND)"),
        ("SOURCE", "bids", "CREATE SOURCE bids WITH (connector = 'nexmark', stream = 'bid', events = '10')"),
        ("MATERIALIZED VIEW", "v", "CREATE MATERIALIZED VIEW v AS SELECT name, count(*) AS n FROM t GROUP BY name"),
    ];
    for (_, _, sql) in statements {
        client.batch_execute(sql).await.unwrap();
    }
    for (kind, name, sql) in statements {
        let expected = match kind {
            // A view's query is shown as Weir reads it.
            "MATERIALIZED VIEW" => format!("{name} CREATE MATERIALIZED VIEW v AS SELECT name, count(*) AS n FROM t GROUP BY name"),
            _ => format!("{name} {sql}"),
        };
        assert_eq!(
            shown(&client, kind, name).await,
            vec![expected],
            "{kind} {name}"
        );
    }
    // The statement shown creates the object again, as it was.
    let table = shown(&client, "TABLE", "t").await;
    client
        .batch_execute("DROP MATERIALIZED VIEW v; DROP TABLE t")
        .await
        .unwrap();
    let again = table[0].strip_prefix("t ").unwrap();
    client.batch_execute(again).await.unwrap();
    assert_eq!(shown(&client, "TABLE", "t").await, table);
    let described =
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute \
                     WHERE attrelid = 't'::regclass ORDER BY attnum";
    assert_eq!(
        common::text_rows(&client, described).await,
        [
            "id integer t",
            "name character varying(20) t",
            "at timestamp without time zone f"
        ]
    );
    // Errors: another kind, and no such object.
    for (sql, code) in [
        ("SHOW CREATE SOURCE t", "42809"),
        ("SHOW CREATE TABLE bids", "42809"),
        ("SHOW CREATE TABLE nothing", "42P01"),
    ] {
        let e = client.simple_query(sql).await.unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some(code), "{sql}: {e}");
    }
    // A view's column passed on from the table keeps its declared type, also across the
    // restart below (which runs the view's kept plan).
    client
        .batch_execute(
            "CREATE MATERIALIZED VIEW w AS SELECT name, count(*) AS n FROM t GROUP BY name",
        )
        .await
        .unwrap();
    let view_types = "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
                      WHERE attrelid = 'w'::regclass ORDER BY attnum";
    let declared = ["character varying(20)", "bigint"];
    assert_eq!(common::text_rows(&client, view_types).await, declared);
    // A restart keeps them.
    drop(client);
    server.stop(15).await;
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    assert_eq!(common::text_rows(&client, view_types).await, declared);
    assert_eq!(shown(&client, "TABLE", "t").await, table);
    assert_eq!(
        shown(&client, "SOURCE", "bids").await,
        vec![format!("bids {}", statements[1].2)]
    );
}

/// While a view is created, `weir_catalog.backfills` shows how far its inputs' rows have come
/// (rows sent of the rows there are); once it is whole, or stopped, it is gone from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfills_show_a_new_view_s_progress_while_it_fills() {
    // 4 MiB of a table's rows per barrier while a view fills: the table below takes several.
    let server = TestServer::start_with(|c| c.memory_limit = Some(64 << 20)).await;
    let client = server.connect().await;
    let watcher = server.connect().await;
    let rows = 200_000;
    client
        .batch_execute(&format!(
            "CREATE TABLE t (id int PRIMARY KEY, g int, pad text);
             INSERT INTO t SELECT i, i % 10, repeat('x', 200) FROM generate_series(1, {rows}) AS s(i);
             FLUSH"
        ))
        .await
        .unwrap();
    let create = tokio::spawn(async move {
        client
            .batch_execute(
                "CREATE MATERIALIZED VIEW v AS SELECT g, count(*) AS n FROM t GROUP BY g",
            )
            .await
            .map(|_| client)
    });
    // What the watcher saw while the view filled: (inputs, inputs_done, rows_done, rows_total).
    let mut seen: Vec<(i64, i64, i64, Option<i64>)> = Vec::new();
    while !create.is_finished() {
        let shown = watcher
            .query(
                "SELECT kind, inputs, inputs_done, rows_done, rows_total, started <= now() \
                 FROM weir_catalog.backfills WHERE name = 'v'",
                &[],
            )
            .await
            .unwrap();
        if let Some(r) = shown.first() {
            assert_eq!(r.get::<_, &str>(0), "materialized view");
            assert!(r.get::<_, bool>(5));
            seen.push((r.get(1), r.get(2), r.get(3), r.get(4)));
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let client = create.await.unwrap().unwrap();
    // Seen part way: one input, the table's rows counted, some of them sent, not all.
    assert!(
        seen.iter().any(|&(inputs, done, sent, total)| {
            inputs == 1 && done == 0 && total == Some(rows) && sent > 0 && sent < rows
        }),
        "{seen:?}"
    );
    // Rows sent only grow, and never past the total.
    assert!(seen.windows(2).all(|w| w[0].2 <= w[1].2), "{seen:?}");
    assert!(seen.iter().all(|s| s.2 <= rows), "{seen:?}");
    let left = common::text_rows(&client, "SELECT count(*) FROM weir_catalog.backfills").await;
    assert_eq!(left, ["0"]);
    assert_eq!(
        common::text_rows(&client, "SELECT sum(n) FROM v").await,
        [rows.to_string()]
    );
}
