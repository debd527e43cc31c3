//! COPY against PostgreSQL 15 itself. `COPY ... TO STDOUT`: the same rows copied out of Weir
//! and of a throwaway PostgreSQL, in text and CSV with their options, give the same bytes.
//! `COPY ... FROM STDIN`: the same data (text, CSV, binary; in pieces split anywhere) gives
//! the same rows, and the same malformed data the same error, line included, with nothing
//! applied. What Weir does not do (to or from a file, binary out) is refused with PostgreSQL's
//! SQLSTATEs. A materialized view may be named as a table.

mod common;
#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/postgres.rs"]
mod postgres;

use bytes::Bytes;
use common::TestServer;
use futures::{pin_mut, SinkExt, TryStreamExt};
use postgres::Postgres;

/// A connection to PostgreSQL, in UTC as Weir is.
async fn postgres(pg: &Postgres) -> tokio_postgres::Client {
    let client = common::connect(&pg.conn).await;
    client.batch_execute("SET TimeZone = 'UTC'").await.unwrap();
    client
}

/// What `COPY` sends, whole, as text.
async fn copy_out(client: &tokio_postgres::Client, sql: &str) -> String {
    String::from_utf8(copy_out_bytes(client, sql).await).unwrap()
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
        ("COPY t FROM '/tmp/weir-copy-test'", "0A000"),
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

/// What `COPY` sends, whole.
async fn copy_out_bytes(client: &tokio_postgres::Client, sql: &str) -> Vec<u8> {
    let stream = client.copy_out(sql).await.unwrap();
    pin_mut!(stream);
    let mut out = Vec::new();
    while let Some(data) = stream.try_next().await.unwrap() {
        out.extend_from_slice(&data);
    }
    out
}

/// Sends `data` to `COPY ... FROM STDIN` in CopyData messages of `piece` bytes: the rows
/// copied, or the error.
async fn copy_in(
    client: &tokio_postgres::Client,
    sql: &str,
    data: &[u8],
    piece: usize,
) -> Result<u64, tokio_postgres::Error> {
    let sink = client.copy_in::<_, Bytes>(sql).await?;
    pin_mut!(sink);
    for part in data.chunks(piece.max(1)) {
        sink.send(Bytes::copy_from_slice(part)).await?;
    }
    sink.finish().await
}

const TYPES: &str = "CREATE TABLE c (id bigint NOT NULL, s text, v varchar(20), \
     n numeric(10,2), f double precision, r real, b boolean, i integer, h smallint, d date, \
     ts timestamp, tz timestamptz, iv interval)";

/// The table's rows as PostgreSQL's text COPY writes them, in id order.
async fn rows_of(client: &tokio_postgres::Client) -> String {
    copy_out(client, "COPY (SELECT * FROM c ORDER BY id) TO STDOUT").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_from_stdin_reads_what_postgres_reads() {
    let pg = Postgres::start().unwrap();
    let theirs = postgres(&pg).await;
    let server = TestServer::start().await;
    let ours = server.connect().await;
    for client in [&theirs, &ours] {
        client.batch_execute(TYPES).await.unwrap();
    }
    let text = "1\ttab\\there, back\\\\slash, new\\nline\tv\t1.50\t0.1\t2.5\tt\t7\t-3\t\
                2024-01-01\t2024-01-01 10:00:00\t2024-01-01 10:00:00+00\t1 day 02:03:04\n\
                2\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\n\
                3\t\\101\\x42\\q\t\t-2\t-1e20\t-0\tfalse\t 12 \t0\t2024-02-29\t\
                2024-02-29 23:59:59.5\t2024-02-29 23:59:59.5+00\t-1 mons\n\
                \\.\n";
    let csv = "id,s,v,n,f,r,b,i,h,d,ts,tz,iv\n\
               10,\"two\nlines, \"\"quoted\"\"\",\"\",12345678.9,1.5e-5,1,yes,2147483647,\
               32767,1999-12-31,1999-12-31 23:59:59,1999-12-31 23:59:59+00,3 years\n\
               11,,x,0,0,0,no,,,,,,\n\
               12,\\N,\"\\.\",1,2,3,on,-2147483648,-32768,2000-01-01,2000-01-01 00:00:00,\
               2000-01-01 00:00:00+00,00:00:01";
    // Every piece size splits somewhere else: inside values, escapes, quotes and line breaks.
    for piece in [usize::MAX, 1, 3, 7, 64] {
        for client in [&theirs, &ours] {
            client.batch_execute("DELETE FROM c").await.unwrap();
            let sql = "COPY c FROM STDIN";
            assert_eq!(
                copy_in(client, sql, text.as_bytes(), piece).await.unwrap(),
                3
            );
            let sql = "COPY c FROM STDIN WITH (FORMAT csv, HEADER)";
            assert_eq!(
                copy_in(client, sql, csv.as_bytes(), piece).await.unwrap(),
                3
            );
        }
        assert_eq!(
            rows_of(&ours).await,
            rows_of(&theirs).await,
            "pieces of {piece}"
        );
    }
    // Some of the columns, in another order; options of both formats; the older syntax.
    for (sql, data) in [
        ("COPY c (s, id) FROM STDIN", "a\t20\n\\N\t21\n"),
        (
            "COPY c (id, s, n) FROM STDIN WITH (DELIMITER '|', NULL 'nil')",
            "22|nil|nil\n23|a\\|b|3\n",
        ),
        (
            "COPY c (id, s, v) FROM STDIN WITH (FORMAT csv, DELIMITER ';', NULL 'NULL', \
             QUOTE '''', ESCAPE '\\')",
            "24;'it\\'s; \\\\';NULL\n25;'NULL';''\n",
        ),
        ("COPY c (id, s) FROM STDIN CSV HEADER", "id,s\n26,x\n"),
        ("COPY c (id, s) FROM STDIN", "29\tx\r\n30\ty\r\n"),
        ("COPY c (id, b) FROM STDIN CSV", "27, true \n28,F\n"),
    ] {
        let copied = copy_in(&ours, sql, data.as_bytes(), 5).await.unwrap();
        let expected = copy_in(&theirs, sql, data.as_bytes(), 5).await.unwrap();
        assert_eq!(copied, expected, "{sql}");
    }
    assert_eq!(rows_of(&ours).await, rows_of(&theirs).await);
    // Binary: what PostgreSQL's binary COPY writes (asyncpg's copy_records_to_table sends the
    // same), whole and in pieces.
    let binary = copy_out_bytes(&theirs, "COPY c TO STDOUT WITH (FORMAT binary)").await;
    let count = common::text_rows(&theirs, "SELECT count(*) FROM c").await[0].clone();
    for piece in [usize::MAX, 5] {
        ours.batch_execute("DELETE FROM c").await.unwrap();
        let sql = "COPY c FROM STDIN WITH (FORMAT binary)";
        let copied = copy_in(&ours, sql, &binary, piece).await.unwrap();
        assert_eq!(copied.to_string(), count);
        assert_eq!(rows_of(&ours).await, rows_of(&theirs).await);
    }
    // A view over the table sees a COPY of many batches as one statement.
    ours.batch_execute(
        "CREATE MATERIALIZED VIEW cv AS SELECT count(*) AS n, sum(id) AS s FROM c; FLUSH",
    )
    .await
    .unwrap();
    let many: String = (1000..31000).map(|i| format!("{i}\n")).collect();
    let sql = "COPY c (id) FROM STDIN";
    assert_eq!(
        copy_in(&ours, sql, many.as_bytes(), 65536).await.unwrap(),
        30000
    );
    ours.batch_execute("FLUSH").await.unwrap();
    let count: u64 = count.parse().unwrap();
    assert_eq!(
        common::text_rows(&ours, "SELECT n FROM cv").await,
        [(30000 + count).to_string()]
    );
}

/// The error a COPY of `data` gets: its SQLSTATE, message and CONTEXT.
async fn copy_error(client: &tokio_postgres::Client, sql: &str, data: &[u8]) -> String {
    let e = copy_in(client, sql, data, 4096).await.unwrap_err();
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    let context = db.where_().unwrap_or("");
    format!("{} {} [{context}]", db.code().code(), db.message())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_copy_data_fails_as_in_postgres_and_applies_nothing() {
    let pg = Postgres::start().unwrap();
    let theirs = postgres(&pg).await;
    let server = TestServer::start().await;
    let ours = server.connect().await;
    for client in [&theirs, &ours] {
        client.batch_execute(TYPES).await.unwrap();
        client
            .batch_execute("INSERT INTO c (id) VALUES (1)")
            .await
            .unwrap();
    }
    let good: String = (2..20000).map(|i| format!("{i}\tx\n")).collect();
    for (sql, data) in [
        ("COPY c (id, s) FROM STDIN", format!("{good}oops\ty\n")),
        ("COPY c (id, s) FROM STDIN", format!("{good}5\n")),
        ("COPY c (id, s) FROM STDIN", format!("{good}5\ty\tz\n")),
        (
            "COPY c (id, s) FROM STDIN",
            format!("{good}99999999999999999999\ty\n"),
        ),
        ("COPY c (id, s) FROM STDIN", format!("{good}\\N\ty\n")),
        ("COPY c (id, s) FROM STDIN", format!("{good}5\ta\rb\n")),
        ("COPY c (id, s) FROM STDIN", "5\tx\r\n6\ty\n".into()),
        ("COPY c (id, s) FROM STDIN CSV", "5,x\n6,y\r\n".into()),
        ("COPY c (id, i) FROM STDIN", "5\t3000000000\n".into()),
        ("COPY c (id, d) FROM STDIN", "5\t2024-13-01\n".into()),
        ("COPY c (id, d) FROM STDIN", "5\tyesterday-ish\n".into()),
        ("COPY c (id, n) FROM STDIN", "5\t123456789012\n".into()),
        ("COPY c (id, b) FROM STDIN", "5\tmaybe\n".into()),
        ("COPY c (id, s) FROM STDIN CSV", "5,\"open\n6,x\n".into()),
        ("COPY c (id, s) FROM STDIN CSV", "5,x\n6\n".into()),
        (
            "COPY c FROM STDIN WITH (FORMAT binary)",
            "not binary at all".into(),
        ),
    ] {
        assert_eq!(
            copy_error(&ours, sql, data.as_bytes()).await,
            copy_error(&theirs, sql, data.as_bytes()).await,
            "{sql}"
        );
    }
    // A COPY the client gives up on (CopyFail, as psql's \copy when its file fails).
    let mut sink = Box::pin(
        ours.copy_in::<_, Bytes>("COPY c (id) FROM STDIN")
            .await
            .unwrap(),
    );
    sink.send(Bytes::from_static(b"7\n")).await.unwrap();
    drop(sink);
    // Nothing of any of them was applied, and the session goes on.
    assert_eq!(
        common::text_rows(&ours, "SELECT count(*) FROM c").await,
        ["1"]
    );
    // In a transaction block a failed COPY fails the block; a good one is the block's until
    // it ends.
    ours.batch_execute("BEGIN").await.unwrap();
    copy_in(&ours, "COPY c (id) FROM STDIN", b"x\n", 10)
        .await
        .unwrap_err();
    let e = ours.batch_execute("SELECT 1").await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("25P02"));
    ours.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    copy_in(&ours, "COPY c (id) FROM STDIN", b"8\n9\n", 10)
        .await
        .unwrap();
    assert_eq!(
        common::text_rows(&ours, "SELECT count(*) FROM c").await,
        ["3"]
    );
    ours.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        common::text_rows(&ours, "SELECT count(*) FROM c").await,
        ["1"]
    );
    // What COPY FROM cannot fill, and options it does not take.
    ours.batch_execute("CREATE MATERIALIZED VIEW cv AS SELECT id FROM c")
        .await
        .unwrap();
    for (sql, sqlstate) in [
        ("COPY cv FROM STDIN", "42809"),
        ("COPY nowhere FROM STDIN", "42P01"),
        ("COPY c (nope) FROM STDIN", "42703"),
        ("COPY c (id, id) FROM STDIN", "42701"),
        ("COPY c FROM STDIN WITH (FORMAT binary, HEADER)", "42601"),
        ("COPY c FROM STDIN WITH (QUOTE '\"')", "0A000"),
        ("COPY c FROM STDIN WITH (FORCE_NULL (s))", "0A000"),
    ] {
        let e = ours.copy_in::<_, Bytes>(sql).await.err().unwrap();
        assert_eq!(e.code().map(|c| c.code()), Some(sqlstate), "{sql}: {e}");
    }
    assert_eq!(
        common::text_rows(&ours, "SELECT count(*) FROM c").await,
        ["1"]
    );
}
