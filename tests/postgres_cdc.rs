//! PostgreSQL CDC against a real PostgreSQL 15 (`wal_level = logical`, SCRAM passwords), started
//! by each test: tables created FROM a CDC source hold their upstream tables' rows (a snapshot
//! of the rows from before, then the stream of changes) exactly once across a SIGKILL and
//! changes made while Weir is down; a schema change stops a table, a TRUNCATE empties it, an
//! unchanged TOASTed value comes from the old row under REPLICA IDENTITY FULL; bad
//! options, unreachable upstreams and mismatched tables are refused with their SQLSTATEs; DROP
//! SOURCE drops the slot.

mod common;
#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::{text_rows, ChildServer};
use postgres::{Postgres, PASSWORD};

/// A connection to the upstream, in UTC.
async fn upstream(pg: &Postgres) -> tokio_postgres::Client {
    let client = common::connect(&pg.conn).await;
    client.batch_execute("SET TimeZone = 'UTC'").await.unwrap();
    client
}

fn port(pg: &Postgres) -> u16 {
    pg.conn
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .unwrap()
        .parse()
        .unwrap()
}

fn create_source(pg: &Postgres, name: &str, slot: &str, password: &str) -> String {
    format!(
        "CREATE SOURCE {name} WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', \
         port = '{}', username = 'postgres', password = '{password}', \
         database.name = 'postgres', slot.name = '{slot}', snapshot.batch_rows = '40')",
        port(pg)
    )
}

const ORDERS: &str =
    "(id int PRIMARY KEY, customer text, amount numeric(10,2), placed_at timestamptz)";

/// Waits until Weir's `sql` reads as the upstream's, or fails after 60 s with both.
async fn converge(weir: &tokio_postgres::Client, up: &tokio_postgres::Client, sql: &str) {
    converge_to(weir, sql, up, sql).await
}

/// Waits until Weir's `sql` reads as the upstream's `upstream_sql`.
async fn converge_to(
    weir: &tokio_postgres::Client,
    sql: &str,
    up: &tokio_postgres::Client,
    upstream_sql: &str,
) {
    let mut last = (Vec::new(), Vec::new());
    for _ in 0..600 {
        weir.batch_execute("FLUSH").await.unwrap();
        let (w, u) = (
            text_rows(weir, sql).await,
            text_rows(up, upstream_sql).await,
        );
        if w == u {
            return;
        }
        last = (w, u);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{sql}: Weir read {:?}\nupstream read {:?}", last.0, last.1);
}

/// Inserts orders `ids`, updates every third and deletes every seventh.
async fn churn(up: &tokio_postgres::Client, ids: std::ops::Range<i32>) {
    up.batch_execute(&format!(
        "INSERT INTO orders SELECT i, 'c' || (i % 5), i * 1.25, \
           TIMESTAMPTZ '2024-01-01 00:00:00+00' + i * INTERVAL '1 second' \
         FROM generate_series({}, {}) i;
         UPDATE orders SET amount = amount + 1, customer = 'c9' \
           WHERE id % 3 = 0 AND id BETWEEN {0} AND {1};
         DELETE FROM orders WHERE id % 7 = 0 AND id BETWEEN {0} AND {1}",
        ids.start,
        ids.end - 1
    ))
    .await
    .unwrap();
}

const ALL: &str = "SELECT * FROM orders ORDER BY id";
const GROUPS: &str =
    "SELECT customer, count(*), sum(amount) FROM orders GROUP BY customer ORDER BY customer";

/// A server on `data` whose table `orders` reads the upstream's through source `shop`, with
/// the view `by_customer` over it.
async fn shop(pg: &Postgres, data: &std::path::Path) -> (ChildServer, tokio_postgres::Client) {
    let server = ChildServer::start(data).await;
    let weir = server.connect().await;
    weir.batch_execute(&format!(
        "{};
         CREATE TABLE orders {ORDERS} FROM shop TABLE 'public.orders';
         CREATE MATERIALIZED VIEW by_customer AS {GROUPS}",
        create_source(pg, "shop", "weir_shop", PASSWORD)
    ))
    .await
    .unwrap();
    (server, weir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_databases_changes_reach_its_tables_exactly_once_across_a_kill() {
    let pg = Postgres::start().unwrap();
    let up = upstream(&pg).await;
    up.batch_execute(&format!("CREATE TABLE orders {ORDERS}"))
        .await
        .unwrap();
    // Rows from before the source: the snapshot reads them, 40 a chunk.
    churn(&up, 1..150).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (server, weir) = shop(&pg, &data).await;
    // Changes while the snapshot is read.
    churn(&up, 150..300).await;
    converge(&weir, &up, ALL).await;
    converge_to(
        &weir,
        "SELECT * FROM by_customer ORDER BY customer",
        &up,
        GROUPS,
    )
    .await;
    weir.batch_execute("CHECKPOINT").await.unwrap();
    churn(&up, 300..400).await;
    up.batch_execute("UPDATE orders SET id = id + 1000 WHERE id = 5")
        .await
        .unwrap();
    converge(&weir, &up, ALL).await;
    // Killed with changes after its checkpoint, and more made while it is down.
    server.stop(9).await;
    churn(&up, 400..500).await;
    let server = ChildServer::start(&data).await;
    let weir = server.connect().await;
    converge(&weir, &up, ALL).await;
    let groups = text_rows(&up, GROUPS).await;
    assert_eq!(
        text_rows(&weir, "SELECT * FROM by_customer ORDER BY customer").await,
        groups
    );
    // A TRUNCATE upstream empties the table, and what follows it goes in.
    up.batch_execute("TRUNCATE orders; INSERT INTO orders VALUES (1, 'z', 1, NULL)")
        .await
        .unwrap();
    converge(&weir, &up, ALL).await;
    // The source cannot go while its table reads it; with CASCADE its slot goes too.
    let e = weir.batch_execute("DROP SOURCE shop").await.unwrap_err();
    assert_eq!(e.as_db_error().unwrap().code().code(), "2BP01", "{e}");
    weir.batch_execute("DROP SOURCE shop CASCADE")
        .await
        .unwrap();
    assert_eq!(
        text_rows(
            &up,
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'weir_shop'"
        )
        .await,
        ["0"]
    );
    assert_eq!(
        text_rows(
            &up,
            "SELECT count(*) FROM pg_publication WHERE pubname = 'weir_shop'"
        )
        .await,
        ["0"]
    );
    server.stop(15).await;
}

/// The replication connection lost in the middle of the stream, twice: its walsender
/// terminated (`pg_terminate_backend`), then the upstream crashed and restarted
/// (`pg_ctl restart -m immediate`). Each time the table resumes from the LSN it confirmed,
/// with every change exactly once: its rows, and a view counting them, equal the upstream's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_resumes_from_its_confirmed_lsn_after_the_connection_is_lost() {
    let pg = Postgres::start().unwrap();
    let up = upstream(&pg).await;
    up.batch_execute(&format!("CREATE TABLE orders {ORDERS}"))
        .await
        .unwrap();
    churn(&up, 1..100).await;
    let dir = tempfile::tempdir().unwrap();
    let (server, weir) = shop(&pg, &dir.path().join("data")).await;
    converge(&weir, &up, ALL).await;
    let walsender = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'weir_shop'";
    let first = text_rows(&up, walsender).await;
    assert_ne!(first, ["NULL"], "the slot is in use");

    // Changes go on while the walsender is terminated between them.
    for i in 0..10 {
        churn(&up, 100 + i * 40..140 + i * 40).await;
        if i == 4 {
            let ended = text_rows(
                &up,
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = 'weir_shop'",
            )
            .await;
            assert_eq!(ended, ["t"]);
        }
    }
    converge(&weir, &up, ALL).await;
    converge_to(
        &weir,
        "SELECT * FROM by_customer ORDER BY customer",
        &up,
        GROUPS,
    )
    .await;
    let second = text_rows(&up, walsender).await;
    assert!(
        second != first && second != ["NULL"],
        "{first:?} then {second:?}"
    );

    // The upstream crashes with changes Weir has not all read, and more come after it is back.
    churn(&up, 500..700).await;
    drop(up);
    pg.restart().unwrap();
    let up = upstream(&pg).await;
    churn(&up, 700..900).await;
    converge(&weir, &up, ALL).await;
    converge_to(
        &weir,
        "SELECT * FROM by_customer ORDER BY customer",
        &up,
        GROUPS,
    )
    .await;
    let confirmed = "SELECT confirmed_flush_lsn IS NOT NULL FROM pg_replication_slots \
                     WHERE slot_name = 'weir_shop'";
    assert_eq!(text_rows(&up, confirmed).await, ["t"]);
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_upstreams_and_tables_are_refused_and_a_schema_change_stops_a_table() {
    let pg = Postgres::start().unwrap();
    let up = upstream(&pg).await;
    up.batch_execute(&format!(
        "CREATE TABLE orders {ORDERS};
         CREATE TABLE loose (id int, note text);
         CREATE TABLE quiet (id int PRIMARY KEY, note text);
         ALTER TABLE quiet REPLICA IDENTITY NOTHING"
    ))
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let weir = server.connect().await;
    let code = |sql: String| {
        let weir = &weir;
        async move {
            let e = weir.batch_execute(&sql).await.unwrap_err();
            e.as_db_error().map(|d| d.code().code().to_string())
        }
    };
    assert_eq!(
        code(create_source(&pg, "s", "weir_s", "wrong"))
            .await
            .as_deref(),
        Some("28000")
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = closed.local_addr().unwrap().port();
    drop(closed);
    assert_eq!(
        code(
            create_source(&pg, "s", "weir_s", PASSWORD)
                .replace(&port(&pg).to_string(), &nowhere.to_string())
        )
        .await
        .as_deref(),
        Some("08001")
    );
    assert_eq!(
        code(create_source(&pg, "s", "Bad-Slot", PASSWORD))
            .await
            .as_deref(),
        Some("22023")
    );
    weir.batch_execute(&create_source(&pg, "shop", "weir_shop", PASSWORD))
        .await
        .unwrap();
    for (table, sqlstate) in [
        (
            format!("CREATE TABLE t {ORDERS} FROM shop TABLE 'public.missing'"),
            "42P01",
        ),
        (
            "CREATE TABLE t (id bigint PRIMARY KEY) FROM shop TABLE 'public.orders'".into(),
            "42804",
        ),
        (
            "CREATE TABLE t (id int PRIMARY KEY, nope text) FROM shop TABLE 'public.orders'".into(),
            "42703",
        ),
        (
            "CREATE TABLE t (id int, customer text PRIMARY KEY) FROM shop TABLE 'public.orders'"
                .into(),
            "42P16",
        ),
        (
            "CREATE TABLE t (id int, note text) FROM shop TABLE 'public.loose'".into(),
            "42P16",
        ),
        (
            "CREATE TABLE t (id int PRIMARY KEY, note text) FROM shop TABLE 'public.quiet'".into(),
            "55000",
        ),
        (
            "CREATE TABLE t (id int PRIMARY KEY) FROM nowhere TABLE 'public.orders'".into(),
            "42704",
        ),
        (
            "CREATE MATERIALIZED VIEW v AS SELECT 1 AS one FROM shop".into(),
            "0A000",
        ),
    ] {
        assert_eq!(
            code(table.clone()).await.as_deref(),
            Some(sqlstate),
            "{table}"
        );
    }
    // A column added upstream stops the table, naming the change; its rows stay.
    weir.batch_execute(&format!(
        "CREATE TABLE orders {ORDERS} FROM shop TABLE 'public.orders'"
    ))
    .await
    .unwrap();
    churn(&up, 1..20).await;
    converge(&weir, &up, ALL).await;
    up.batch_execute(
        "ALTER TABLE orders ADD COLUMN note text; INSERT INTO orders VALUES (100, 'x', 1, NULL, 'n')",
    )
    .await
    .unwrap();
    let error = table_error(&weir, "orders").await;
    assert!(error.contains("added note"), "{error}");
    assert_eq!(
        text_rows(&weir, "SELECT count(*) FROM orders WHERE id = 100").await,
        ["0"]
    );
    server.stop(15).await;
}

/// Waits until `table`'s source status shows an error, and returns it.
async fn table_error(weir: &tokio_postgres::Client, table: &str) -> String {
    for _ in 0..300 {
        let error = text_rows(
            weir,
            &format!(
                "SELECT error FROM weir_catalog.sources WHERE name = '{table}' \
                 AND error IS NOT NULL"
            ),
        )
        .await;
        if let Some(e) = error.into_iter().next() {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{table} did not stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_toasted_value_comes_from_the_old_row_under_replica_identity_full() {
    let pg = Postgres::start().unwrap();
    let up = upstream(&pg).await;
    // 400 md5 digests: about 6 KB after compression, so stored out of line (TOASTed), which an
    // update of another column leaves out of the new row.
    up.batch_execute(
        "CREATE TABLE full_docs (id int PRIMARY KEY, n int, body text);
         ALTER TABLE full_docs REPLICA IDENTITY FULL;
         CREATE TABLE docs (id int PRIMARY KEY, n int, body text);
         INSERT INTO full_docs SELECT i, 0, (SELECT string_agg(md5((i * 1000 + j)::text), '') \
           FROM generate_series(1, 400) j) FROM generate_series(1, 3) i;
         INSERT INTO docs SELECT * FROM full_docs",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let weir = server.connect().await;
    weir.batch_execute(&format!(
        "{};
         CREATE TABLE full_docs (id int PRIMARY KEY, n int, body text)
           FROM shop TABLE 'public.full_docs';
         CREATE TABLE docs (id int PRIMARY KEY, n int, body text) FROM shop TABLE 'public.docs'",
        create_source(&pg, "shop", "weir_shop", PASSWORD)
    ))
    .await
    .unwrap();
    const FULL: &str = "SELECT id, n, md5(body), length(body) FROM full_docs ORDER BY id";
    converge(&weir, &up, FULL).await;
    // The WAL the slot holds back, in the source's row as in its split's.
    let mut lag = Vec::new();
    for _ in 0..300 {
        lag = text_rows(
            &weir,
            "SELECT s.lag = p.lag FROM weir_catalog.sources s \
             JOIN weir_catalog.source_splits p ON p.source = s.name \
             WHERE s.name = 'shop' AND p.split = 'slot weir_shop'",
        )
        .await;
        if lag == ["t"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lag, ["t"]);
    up.batch_execute(
        "UPDATE full_docs SET n = n + 1 WHERE id <= 2;
         UPDATE full_docs SET id = 10 WHERE id = 3;
         UPDATE docs SET n = n + 1 WHERE id = 1",
    )
    .await
    .unwrap();
    converge(&weir, &up, FULL).await;
    assert_eq!(
        text_rows(&weir, "SELECT n, length(body) FROM full_docs WHERE id = 10").await,
        ["0 12800"]
    );
    // Without the old row the value cannot be known: the table stops, saying what to set.
    let error = table_error(&weir, "docs").await;
    assert!(error.contains("REPLICA IDENTITY FULL"), "{error}");
    assert_eq!(
        text_rows(&weir, "SELECT n FROM docs WHERE id = 1").await,
        ["0"]
    );
    server.stop(15).await;
}

/// Turns TLS on in `pg` with a certificate for `localhost` and 127.0.0.1 signed by a new
/// authority, made in `dir`; returns the authority's certificate.
async fn enable_tls(up: &tokio_postgres::Client, dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let [ca, cert, key] = common::certificate(dir);
    // PostgreSQL runs as `postgres` when the tests run as root: it must read the key, and
    // only it.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        for file in [&cert, &key] {
            let out = std::process::Command::new("chown")
                .arg("postgres")
                .arg(file)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        }
    }
    for sql in [
        format!("ALTER SYSTEM SET ssl_cert_file = '{}'", cert.display()),
        format!("ALTER SYSTEM SET ssl_key_file = '{}'", key.display()),
        "ALTER SYSTEM SET ssl = on".to_string(),
        "SELECT pg_reload_conf()".to_string(),
    ] {
        up.batch_execute(&sql).await.unwrap();
    }
    for _ in 0..100 {
        if text_rows(up, "SHOW ssl").await == ["on"] {
            return ca;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("PostgreSQL did not turn TLS on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_reaches_its_upstream_over_tls_as_sslmode_asks() {
    let pg = Postgres::start().unwrap();
    let up = upstream(&pg).await;
    up.batch_execute(&format!("CREATE TABLE orders {ORDERS}"))
        .await
        .unwrap();
    let certs = tempfile::tempdir().unwrap();
    let ca = enable_tls(&up, certs.path()).await;
    let stranger = tempfile::tempdir().unwrap();
    let [other_ca, _, _] = common::certificate(stranger.path());
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let weir = server.connect().await;
    let source = |name: &str, host: &str, tls: &str| {
        create_source(&pg, name, &format!("weir_{name}"), PASSWORD)
            .replace("hostname = '127.0.0.1'", &format!("hostname = '{host}'"))
            .replace("snapshot.batch_rows", &format!("{tls}snapshot.batch_rows"))
    };
    let verify = |root: &std::path::Path| {
        format!(
            "sslmode = 'verify-full', sslrootcert = '{}', ",
            root.display()
        )
    };
    for (sql, expected) in [
        (source("a", "127.0.0.1", "sslmode = 'sometimes', "), "22023"),
        (source("b", "127.0.0.1", "sslmode = 'verify-ca', "), "22023"),
        // An authority that did not sign the server's certificate is refused.
        (source("c", "localhost", &verify(&other_ca)), "08001"),
    ] {
        let e = weir.batch_execute(&sql).await.unwrap_err();
        let code = e.as_db_error().map(|d| d.code().code().to_string());
        assert_eq!(code.as_deref(), Some(expected), "{sql}: {e:?}");
    }
    // Verified against the host's name: the source's queries and its replication stream are
    // encrypted.
    weir.batch_execute(&format!(
        "{};
         CREATE TABLE orders {ORDERS} FROM shop TABLE 'public.orders'",
        source("shop", "localhost", &verify(&ca))
    ))
    .await
    .unwrap();
    churn(&up, 1..40).await;
    const ORDERS_SQL: &str = "SELECT id, customer, amount::text FROM orders ORDER BY id";
    converge(&weir, &up, ORDERS_SQL).await;
    let encrypted = "SELECT a.backend_type, s.ssl FROM pg_stat_activity a \
                     JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'weir' \
                     AND a.backend_type = 'walsender'";
    assert_eq!(text_rows(&up, encrypted).await, ["walsender t"]);
    // Without TLS where asked, the connection is plain.
    weir.batch_execute(&format!(
        "{};
         CREATE TABLE plain_orders {ORDERS} FROM plain TABLE 'public.orders'",
        source("plain", "127.0.0.1", "sslmode = 'disable', ")
    ))
    .await
    .unwrap();
    converge_to(
        &weir,
        &ORDERS_SQL.replace("orders", "plain_orders"),
        &up,
        ORDERS_SQL,
    )
    .await;
    assert_eq!(
        text_rows(&up, &format!("{encrypted} ORDER BY s.ssl")).await,
        ["walsender f", "walsender t"]
    );
    let shown = text_rows(&weir, "SHOW CREATE SOURCE shop").await.join("\n");
    assert!(shown.contains("sslmode = 'verify-full'"), "{shown}");
}
