//! `COPY ... TO STDOUT` against PostgreSQL 15 itself: the same rows copied out of Weir and of
//! a throwaway PostgreSQL, in text and CSV with their options, give the same bytes; what Weir
//! does not do (COPY FROM, to a file, binary) is refused with PostgreSQL's SQLSTATEs. A
//! materialized view may be named as a table.

mod common;
#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/postgres.rs"]
mod postgres;

use common::TestServer;
use futures::{pin_mut, TryStreamExt};
use postgres::Postgres;

/// A connection to PostgreSQL, in UTC as Weir is.
async fn postgres(pg: &Postgres) -> tokio_postgres::Client {
    let client = common::connect(&pg.conn).await;
    client.batch_execute("SET TimeZone = 'UTC'").await.unwrap();
    client
}

/// What `COPY` sends, whole.
async fn copy_out(client: &tokio_postgres::Client, sql: &str) -> String {
    let stream = client.copy_out(sql).await.unwrap();
    pin_mut!(stream);
    let mut out = Vec::new();
    while let Some(data) = stream.try_next().await.unwrap() {
        out.extend_from_slice(&data);
    }
    String::from_utf8(out).unwrap()
}

const ROWS: &str = "CREATE TABLE t (id bigint, s text, n numeric(10,2), f double precision, \
                      b boolean, ts timestamp);
     INSERT INTO t VALUES
       (1, E'tab\\there, back\\\\slash, new\\nline, cr\\rend', 1.50, 0.1, true,
        '2024-01-01 10:00:00'),
       (2, NULL, NULL, NULL, NULL, NULL),
       (3, '', -2, -1e20, false, '2024-02-29 23:59:59.5'),
       (4, 'say \"hi\", then go', 0, 3, true, NULL),
       (5, E'\\\\.', 12345678.9, 1.5e-5, false, '1999-12-31 23:59:59'),
       (6, 'ünïcødé, \u{1F600}; semi', 7, 2.5, NULL, '2000-01-01 00:00:00'),
       (7, E'\\\\N', 8, 0, true, NULL)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_to_stdout_sends_the_bytes_postgres_sends() {
    let pg = Postgres::start().unwrap();
    let theirs = postgres(&pg).await;
    let server = TestServer::start().await;
    let ours = server.connect().await;
    for client in [&theirs, &ours] {
        client.batch_execute(ROWS).await.unwrap();
    }
    for sql in [
        "COPY (SELECT * FROM t ORDER BY id) TO STDOUT",
        "COPY (SELECT * FROM t ORDER BY id) TO STDOUT WITH (FORMAT csv)",
        "COPY (SELECT * FROM t ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER)",
        "COPY (SELECT id, s FROM t ORDER BY id) TO STDOUT WITH (FORMAT text, HEADER true)",
        "COPY (SELECT id, s, n FROM t ORDER BY id) TO STDOUT WITH (DELIMITER '|', NULL 'nil')",
        "COPY (SELECT id, s FROM t ORDER BY id) TO STDOUT WITH (FORMAT csv, DELIMITER ';', \
         NULL 'NULL')",
        "COPY (SELECT s FROM t ORDER BY id) TO STDOUT WITH (FORMAT csv)",
        "COPY (SELECT id AS \"a,b\", s AS \"the \"\"s\"\"\" FROM t ORDER BY id) TO STDOUT \
         CSV HEADER",
        "COPY (SELECT id FROM t WHERE id > 100) TO STDOUT WITH (FORMAT csv, HEADER)",
    ] {
        assert_eq!(
            copy_out(&ours, sql).await,
            copy_out(&theirs, sql).await,
            "{sql}"
        );
    }
    // A table or view by name, its columns or some of them (rows in no set order).
    let sorted = |text: String| {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    for sql in ["COPY t TO STDOUT", "COPY t (s, id) TO STDOUT (FORMAT csv)"] {
        assert_eq!(
            sorted(copy_out(&ours, sql).await),
            sorted(copy_out(&theirs, sql).await),
            "{sql}"
        );
    }
    // A materialized view named like a table (PostgreSQL refuses it, 42809): its rows.
    ours.batch_execute(
        "CREATE MATERIALIZED VIEW v AS SELECT b, count(*) AS n FROM t GROUP BY b; FLUSH",
    )
    .await
    .unwrap();
    assert_eq!(
        sorted(copy_out(&ours, "COPY v TO STDOUT CSV").await),
        sorted(
            copy_out(
                &theirs,
                "COPY (SELECT b, count(*) FROM t GROUP BY b) TO STDOUT CSV"
            )
            .await
        )
    );
    for (sql, sqlstate) in [
        ("COPY t FROM STDIN", "0A000"),
        ("COPY t TO '/tmp/weir-copy-test'", "0A000"),
        ("COPY t TO STDOUT WITH (FORMAT binary)", "0A000"),
        ("COPY t TO STDOUT WITH (FORMAT xml)", "22023"),
        ("COPY t TO STDOUT WITH (DELIMITER E'\\n')", "22023"),
        ("COPY t TO STDOUT WITH (DELIMITER 'a')", "22023"),
        (
            "COPY t TO STDOUT WITH (FORMAT csv, DELIMITER '\"')",
            "22023",
        ),
        ("COPY t TO STDOUT WITH (DELIMITER ',', NULL 'a,b')", "22023"),
        ("COPY nowhere TO STDOUT", "42P01"),
    ] {
        let e = ours.copy_out(sql).await.err().unwrap();
        assert_eq!(
            e.as_db_error().map(|d| d.code().code()),
            Some(sqlstate),
            "{sql}: {e}"
        );
    }
    // The session goes on.
    assert_eq!(
        common::text_rows(&ours, "SELECT count(*) FROM t").await,
        ["7"]
    );
}
