//! Real clients against a real server: tokio-postgres (extended protocol, parameters, binary
//! results), sqlx and psql, and the `weir` binary's own start and clean shutdown.

mod common;

use std::error::Error;
use std::process::Command;

use tokio_postgres::types::{FromSql, Type};

use common::{ChildServer, TestServer};

/// A value read in binary format without interpreting it: checks the wire bytes directly.
struct Raw(Vec<u8>);

impl<'a> FromSql<'a> for Raw {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        Ok(Raw(raw.to_vec()))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

async fn setup(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, name text, score double precision, amount numeric(10,2), day date, at timestamp, span interval, ok boolean, big bigint, small smallint, r real);
             INSERT INTO t VALUES (1, 'one', 1.5, 12.34, '2024-01-02', '2024-01-02 03:04:05.25', '1 day', true, 9000000000, 7, 0.5),
                                  (2, 'two', NULL, -0.5, NULL, NULL, NULL, false, -1, -7, NULL);
             CREATE MATERIALIZED VIEW v AS SELECT id, name, amount FROM t WHERE id > 0;
             FLUSH;",
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_parameters_and_binary_results() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    setup(&client).await;

    // Parameters whose types the server infers, results in binary.
    let rows = client
        .query(
            "SELECT id, name, score, big, small, ok, r FROM t WHERE id = $1",
            &[&1i32],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r.get::<_, i32>(0), 1);
    assert_eq!(r.get::<_, &str>(1), "one");
    assert_eq!(r.get::<_, f64>(2), 1.5);
    assert_eq!(r.get::<_, i64>(3), 9_000_000_000);
    assert_eq!(r.get::<_, i16>(4), 7);
    assert!(r.get::<_, bool>(5));
    assert_eq!(r.get::<_, f32>(6), 0.5);

    // Binary forms of numeric, date, timestamp and interval, byte for byte as PostgreSQL sends them.
    let rows = client
        .query("SELECT amount, day, at, span FROM t WHERE id = 1", &[])
        .await
        .unwrap();
    let r = &rows[0];
    // 12.34: two base-10000 digits (12, 3400), weight 0, positive, scale 2.
    assert_eq!(
        r.get::<_, Raw>(0).0,
        [0, 2, 0, 0, 0, 0, 0, 2, 0, 12, 0x0d, 0x48]
    );
    // 2024-01-02 is 8767 days after 2000-01-01.
    assert_eq!(r.get::<_, Raw>(1).0, 8767i32.to_be_bytes());
    let micros: i64 = 8767 * 86_400_000_000 + (3 * 3600 + 4 * 60 + 5) * 1_000_000 + 250_000;
    assert_eq!(r.get::<_, Raw>(2).0, micros.to_be_bytes());
    let mut iv = Vec::new();
    iv.extend_from_slice(&0i64.to_be_bytes());
    iv.extend_from_slice(&1i32.to_be_bytes());
    iv.extend_from_slice(&0i32.to_be_bytes());
    assert_eq!(r.get::<_, Raw>(3).0, iv);
    let types: Vec<Type> = rows[0]
        .columns()
        .iter()
        .map(|c| c.type_().clone())
        .collect();
    assert_eq!(
        types,
        [Type::NUMERIC, Type::DATE, Type::TIMESTAMP, Type::INTERVAL]
    );

    // NULLs in binary.
    let rows = client
        .query("SELECT score, day FROM t WHERE id = $1", &[&2i32])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, Option<f64>>(0), None);

    // A named statement, prepared once and run after several Syncs, with DML parameters.
    let insert = client
        .prepare("INSERT INTO t (id, name) VALUES ($1, $2)")
        .await
        .unwrap();
    assert_eq!(insert.params(), &[Type::INT4, Type::TEXT]);
    for i in 10..15 {
        let n = client
            .execute(&insert, &[&i, &format!("n{i}")])
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
    client.batch_execute("FLUSH").await.unwrap();
    let count = client
        .prepare("SELECT count(*) FROM t WHERE id >= $1")
        .await
        .unwrap();
    assert_eq!(count.columns()[0].type_(), &Type::INT8);
    // Columns are named as PostgreSQL names them.
    assert_eq!(count.columns()[0].name(), "count");
    let n: i64 = client.query_one(&count, &[&10i32]).await.unwrap().get(0);
    assert_eq!(n, 5);
    // Integer constants are described and sent as PostgreSQL types them.
    let constants = client
        .prepare("SELECT 1, 3000000000, id + 1 FROM t WHERE id = 10")
        .await
        .unwrap();
    let types: Vec<Type> = constants
        .columns()
        .iter()
        .map(|c| c.type_().clone())
        .collect();
    assert_eq!(types, [Type::INT4, Type::INT8, Type::INT4]);
    let row = client.query_one(&constants, &[]).await.unwrap();
    assert_eq!(
        (
            row.get::<_, i32>(0),
            row.get::<_, i64>(1),
            row.get::<_, i32>(2)
        ),
        (1, 3_000_000_000, 11)
    );

    // Errors keep their SQLSTATE on the extended protocol too.
    let err = client
        .execute(&insert, &[&10i32, &"dup"])
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "23505");
    let err = client.prepare("SELECT * FROM nowhere").await.unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "42P01");

    // The view follows, read through the extended protocol after FLUSH.
    client.batch_execute("FLUSH").await.unwrap();
    let rows = client
        .query(
            "SELECT name FROM v WHERE id BETWEEN $1 AND $2 ORDER BY id",
            &[&10i32, &11i32],
        )
        .await
        .unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(names, ["n10", "n11"]);

    // A transaction block as drivers send it.
    client
        .batch_execute("BEGIN; INSERT INTO t (id) VALUES (99); COMMIT; FLUSH")
        .await
        .unwrap();
    let n: i64 = client
        .query_one("SELECT count(*) FROM t WHERE id = 99", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

fn psql(server: &TestServer, sql: &str) -> (bool, String, String) {
    let out = Command::new("psql")
        .args([
            "-X",
            "-h",
            &server.addr.ip().to_string(),
            "-p",
            &server.addr.port().to_string(),
            "-U",
            "weir",
            "-d",
            "weir",
            "-v",
            "ON_ERROR_STOP=1",
            "-At",
            "-c",
            sql,
        ])
        .output()
        .expect("psql is installed (.ci/run installs postgresql-client)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_runs_statements() {
    let server = TestServer::start().await;
    let (ok, _, err) = psql(&server, "CREATE TABLE p (a int, b text)");
    assert!(ok, "{err}");
    let (ok, _, err) = psql(&server, "INSERT INTO p VALUES (1, 'x'), (2, NULL)");
    assert!(ok, "{err}");
    let (ok, _, err) = psql(
        &server,
        "CREATE MATERIALIZED VIEW pv AS SELECT count(*) AS n, max(a) AS m FROM p",
    );
    assert!(ok, "{err}");
    let (ok, out, err) = psql(&server, "SELECT * FROM pv");
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "2|2");
    let (ok, _, err) = psql(&server, "SELECT * FROM nothing");
    assert!(!ok);
    assert!(err.contains("relation \"nothing\" does not exist"), "{err}");
    // psql prints the caret under the error position.
    let (ok, _, err) = psql(&server, "SELECT 1 +* 2");
    assert!(!ok);
    assert!(err.contains("LINE 1: SELECT 1 +* 2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_starts_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(dir.path()).await;
    let client = server.connect().await;
    let v: String = client
        .query_one("SELECT version()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(v.starts_with("PostgreSQL 15.18 (Weir "), "{v}");
    // A wrong database name is refused at startup, before the user proves who it is.
    let wrong = format!(
        "host=127.0.0.1 port={} user=anyone dbname=other",
        server.addr.port()
    );
    let err = tokio_postgres::connect(&wrong, tokio_postgres::NoTls)
        .await
        .err()
        .unwrap();
    assert_eq!(err.as_db_error().unwrap().code().code(), "3D000");
    let log_path = server.log.clone();
    let status = server.stop(15).await;
    assert!(status.success(), "exit status {status:?}");
    let log = std::fs::read_to_string(log_path).unwrap();
    assert!(log.contains("connect with psql -h 127.0.0.1 -p"), "{log}");
    assert!(log.contains("weir shut down"), "{log}");
}

/// A result column read unchanged from a table is described with the table's OID, its
/// column number, and its declared type and modifier (`varchar(8)`, `numeric(10,2)`), as
/// PostgreSQL describes it; a computed column names no table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_columns_name_their_table_and_declared_type() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    client
        .batch_execute("CREATE TABLE d (id int PRIMARY KEY, code varchar(8), amount numeric(10,2))")
        .await
        .unwrap();
    let oid: u32 = client
        .query_one("SELECT oid FROM pg_class WHERE relname = 'd'", &[])
        .await
        .unwrap()
        .get(0);
    let stmt = client
        .prepare("SELECT amount, code, id + 1 AS next FROM d WHERE id > $1::int")
        .await
        .unwrap();
    assert_eq!(stmt.params(), &[Type::INT4]);
    let c = stmt.columns();
    assert_eq!((c[0].table_oid(), c[0].column_id()), (Some(oid), Some(3)));
    assert_eq!(
        (c[0].type_(), c[0].type_modifier()),
        (&Type::NUMERIC, (10 << 16 | 2) + 4)
    );
    assert_eq!(
        (c[1].type_(), c[1].type_modifier()),
        (&Type::VARCHAR, 8 + 4)
    );
    assert_eq!((c[2].table_oid(), c[2].column_id()), (None, None));
    let none: Vec<tokio_postgres::Row> = client.query(&stmt, &[&0i32]).await.unwrap();
    assert!(none.is_empty());
}

/// sqlx's PostgreSQL driver, which prepares every statement and reads results in binary: a
/// table of the types it binds and a view over it, parameters of each type, the view read in
/// binary and (through a simple query) in text, a statement prepared once and run many times,
/// and an error the connection goes on after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_binds_every_type_reads_a_view_and_goes_on_after_an_error() {
    use sqlx::{Connection, Row};
    let server = TestServer::start().await;
    let url = format!("postgres://weir@{}/weir", server.addr);
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE sx (id int PRIMARY KEY, small smallint, big bigint, flag boolean, r real, \
         d double precision, name text, code varchar(8), day date, at timestamp, atz timestamptz); \
         CREATE MATERIALIZED VIEW sx_by_flag AS SELECT flag, count(*) AS n, max(big) AS top, \
         min(day) AS first FROM sx GROUP BY flag",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let day = chrono::NaiveDate::from_ymd_opt(2024, 3, 1).unwrap();
    let at = day.and_hms_micro_opt(12, 30, 5, 250_000).unwrap();
    let atz = at.and_utc();
    for id in 1..=10i32 {
        let inserted =
            sqlx::query("INSERT INTO sx VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
                .bind(id)
                .bind(id as i16 * -3)
                .bind(i64::from(id) * 10_000_000_000)
                .bind(id % 2 == 0)
                .bind(id as f32 / 4.0)
                .bind(f64::from(id) / 3.0)
                .bind(format!("ünï {id}"))
                .bind(format!("c{id}"))
                .bind(day + chrono::Days::new(id as u64))
                .bind(at)
                .bind(atz)
                .execute(&mut conn)
                .await
                .unwrap();
        assert_eq!(inserted.rows_affected(), 1);
    }
    // Every column back in binary, as bound.
    let row = sqlx::query("SELECT * FROM sx WHERE id = $1")
        .bind(4i32)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(row.get::<i32, _>("id"), 4);
    assert_eq!(row.get::<i16, _>("small"), -12);
    assert_eq!(row.get::<i64, _>("big"), 40_000_000_000);
    assert!(row.get::<bool, _>("flag"));
    assert_eq!(row.get::<f32, _>("r"), 1.0);
    assert_eq!(row.get::<f64, _>("d"), 4.0 / 3.0);
    assert_eq!(row.get::<String, _>("name"), "ünï 4");
    assert_eq!(row.get::<String, _>("code"), "c4");
    assert_eq!(
        row.get::<chrono::NaiveDate, _>("day"),
        day + chrono::Days::new(4)
    );
    assert_eq!(row.get::<chrono::NaiveDateTime, _>("at"), at);
    assert_eq!(row.get::<chrono::DateTime<chrono::Utc>, _>("atz"), atz);
    // The view, in binary and in text.
    sqlx::raw_sql("FLUSH").execute(&mut conn).await.unwrap();
    let view = "SELECT flag, n, top, first FROM sx_by_flag ORDER BY flag";
    let binary: Vec<(bool, i64, i64, chrono::NaiveDate)> =
        sqlx::query_as(view).fetch_all(&mut conn).await.unwrap();
    let expected = vec![
        (false, 5, 90_000_000_000, day + chrono::Days::new(1)),
        (true, 5, 100_000_000_000, day + chrono::Days::new(2)),
    ];
    assert_eq!(binary, expected);
    let text = sqlx::raw_sql(view).fetch_all(&mut conn).await.unwrap();
    let text: Vec<(bool, i64, i64, chrono::NaiveDate)> = (text.iter())
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(text, expected);
    // One statement, prepared once (sqlx keeps it per connection), run many times.
    for i in 0..100 {
        let id = i % 10 + 1;
        let name: String = sqlx::query_scalar("SELECT name FROM sx WHERE id = $1")
            .bind(id)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(name, format!("ünï {id}"));
    }
    // An error, with its SQLSTATE, and the connection goes on.
    let e = sqlx::query("SELECT * FROM missing")
        .fetch_all(&mut conn)
        .await
        .unwrap_err();
    let code = e
        .as_database_error()
        .and_then(|d| d.code().map(|c| c.to_string()));
    assert_eq!(code.as_deref(), Some("42P01"), "{e}");
    let e = sqlx::query("INSERT INTO sx (id) VALUES ($1)")
        .bind(1i32)
        .execute(&mut conn)
        .await
        .unwrap_err();
    let code = e
        .as_database_error()
        .and_then(|d| d.code().map(|c| c.to_string()));
    assert_eq!(code.as_deref(), Some("23505"), "{e}");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sx")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 10);
    conn.close().await.unwrap();
}
