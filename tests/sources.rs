//! Sources and sinks: the Nexmark generator, CSV files and JSON objects in S3 (moto) feeding
//! views, their offsets in checkpoints (a restart goes on from them and ends where an
//! uninterrupted run ends), and the errors their DDL gives.

mod common;

use common::{text_rows, ChildServer, S3Server, TestServer};

async fn drain(client: &tokio_postgres::Client) {
    common::drain(client, std::time::Duration::from_secs(60)).await;
}

fn nexmark(name: &str, stream: &str, extra: &str) -> String {
    format!(
        "CREATE SOURCE {name} WITH (connector = 'nexmark', stream = '{stream}', \
         events = 60000{extra})"
    )
}

const VIEWS: [(&str, &str); 3] = [
    (
        "totals",
        "SELECT count(*) AS n, sum(price) AS s, min(date_time) AS lo, max(date_time) AS hi FROM {bid}",
    ),
    (
        "by_auction",
        "SELECT auction, count(*) AS n, max(price) AS top FROM {bid} GROUP BY auction",
    ),
    (
        "sellers",
        "SELECT a.seller, count(*) AS bids FROM {bid} b JOIN {auction} a ON b.auction = a.id \
         GROUP BY a.seller",
    ),
];

async fn create_views(client: &tokio_postgres::Client, suffix: &str) {
    for (name, query) in VIEWS {
        let query = query
            .replace("{bid}", &format!("bid{suffix}"))
            .replace("{auction}", &format!("auction{suffix}"));
        client
            .batch_execute(&format!(
                "CREATE MATERIALIZED VIEW {name}{suffix} AS {query}"
            ))
            .await
            .unwrap();
    }
}

async fn contents(client: &tokio_postgres::Client, suffix: &str) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for (name, _) in VIEWS {
        all.push(text_rows(client, &format!("SELECT * FROM {name}{suffix} ORDER BY 1")).await);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_source_goes_on_from_its_checkpoint_and_ends_as_an_uninterrupted_one() {
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.interval_ms = 0;
        c.streaming_parallelism = 2;
    };
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    // Paced (20 000 events a second: 3 s in all) so that the checkpoint falls mid-stream.
    client
        .batch_execute(&format!(
            "{}; {}",
            nexmark("bid", "bid", ", events_per_second = 20000"),
            nexmark("auction", "auction", ", events_per_second = 20000")
        ))
        .await
        .unwrap();
    create_views(&client, "").await;
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let id: i64 = client.query_one("CHECKPOINT", &[]).await.unwrap().get("id");
    let root = server.dir.path().join("checkpoint-store");
    let manifest = weir::checkpoint::Manifest::decode(
        &std::fs::read(root.join(format!("checkpoints/{id:020}/manifest.json"))).unwrap(),
    )
    .unwrap();
    let offsets: Vec<u64> = manifest.offsets.values().copied().collect();
    assert!(
        offsets.iter().all(|o| *o > 0 && *o < 55_200),
        "the checkpoint falls mid-stream: offsets {offsets:?}"
    );
    drop(client);
    let dir = server.stop_and_close().await;

    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    drain(&client).await;
    let restarted = contents(&client, "").await;
    // The same streams, run start to end without a stop, in the same server.
    client
        .batch_execute(&format!(
            "{}; {}",
            nexmark("bid_ref", "bid", ""),
            nexmark("auction_ref", "auction", "")
        ))
        .await
        .unwrap();
    create_views(&client, "_ref").await;
    drain(&client).await;
    let uninterrupted = contents(&client, "_ref").await;
    assert!(restarted[0][0].starts_with("55200 "), "{:?}", restarted[0]);
    for ((name, _), (got, want)) in VIEWS.iter().zip(restarted.iter().zip(&uninterrupted)) {
        let differ: Vec<_> = got
            .iter()
            .zip(want)
            .filter(|(g, w)| g != w)
            .take(5)
            .collect();
        assert!(
            got.len() == want.len() && differ.is_empty(),
            "{name}: {} rows after the restart, {} uninterrupted; first differences {differ:?}",
            got.len(),
            want.len()
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_source_reads_csv_files_and_restarts_at_its_row() {
    let server = TestServer::start_with(|c| c.checkpoint.interval_ms = 0).await;
    let files = server.dir.path().join("input");
    std::fs::create_dir(&files).unwrap();
    std::fs::write(
        files.join("part-0.csv"),
        "1,2015-07-15 00:00:00.000,a\n2,2015-07-15 00:00:01.500,b\n",
    )
    .unwrap();
    std::fs::write(files.join("part-1.csv"), "3,2015-07-15 00:00:02.000,c\n").unwrap();
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE SOURCE f (k bigint, ts timestamp, s text) \
             WITH (connector = 'file', path = '{}', format = 'csv');
             CREATE MATERIALIZED VIEW fv AS SELECT k, ts, s FROM f;",
            files.display()
        ))
        .await
        .unwrap();
    drain(&client).await;
    assert_eq!(
        text_rows(&client, "SELECT * FROM fv ORDER BY k").await,
        [
            "1 2015-07-15 00:00:00 a",
            "2 2015-07-15 00:00:01.5 b",
            "3 2015-07-15 00:00:02 c"
        ]
    );
    client.batch_execute("CHECKPOINT").await.unwrap();
    drop(client);
    // The checkpoint keeps where the source had read to: the end of part-1.csv, so that a
    // restart seeks there instead of reading the rows before again.
    let newest = std::fs::read_dir(server.dir.path().join("checkpoint-store/checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let manifest =
        weir::checkpoint::Manifest::decode(&std::fs::read(newest.join("manifest.json")).unwrap())
            .unwrap();
    let splits: Vec<_> = manifest.splits.values().collect();
    assert_eq!(splits.len(), 1, "{:?}", manifest.splits);
    let size = std::fs::metadata(files.join("part-1.csv")).unwrap().len();
    assert_eq!(
        splits[0]["files"],
        serde_json::json!({"file": "part-1.csv", "byte": size})
    );
    // Rows appended after the checkpoint are read after the restart, once.
    std::fs::write(files.join("part-2.csv"), "4,2015-07-15 00:00:03.000,d\n").unwrap();
    let dir = server.stop_and_close().await;
    let server = TestServer::start_in(dir, |c| c.checkpoint.interval_ms = 0).await;
    let client = server.connect().await;
    drain(&client).await;
    assert_eq!(
        text_rows(&client, "SELECT k FROM fv ORDER BY k").await,
        ["1", "2", "3", "4"]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_and_sink_ddl_errors_are_clear() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    let code = |sql: String| {
        let client = &client;
        async move {
            let sql = sql.as_str();
            let e = client.batch_execute(sql).await.unwrap_err();
            let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
            (db.code().code().to_string(), db.message().to_string())
        }
    };
    client
        .batch_execute(&nexmark("bid", "bid", ""))
        .await
        .unwrap();
    let cases = [
        ("SELECT * FROM bid", "0A000"),
        ("INSERT INTO bid VALUES (1)", "42809"),
        ("CREATE SOURCE x WITH (stream = 'bid')", "22023"),
        ("CREATE SOURCE x WITH (connector = 'pulsar')", "0A000"),
        (
            "CREATE SOURCE x WITH (connector = 'nexmark', stream = 'bids')",
            "22023",
        ),
        (
            "CREATE SOURCE x WITH (connector = 'nexmark', stream = 'bid', events = -1)",
            "22023",
        ),
        (
            "CREATE SOURCE x WITH (connector = 'nexmark', stream = 'bid', colour = 'red')",
            "22023",
        ),
        (
            "CREATE SOURCE x (a int) WITH (connector = 'nexmark', stream = 'bid')",
            "42804",
        ),
        (
            "CREATE SOURCE x (a int) WITH (connector = 'file', path = '/nonexistent/weir')",
            "58P01",
        ),
        (
            "CREATE SOURCE x WITH (connector = 'file', path = '/tmp')",
            "22023",
        ),
        (
            "CREATE SOURCE bid WITH (connector = 'nexmark', stream = 'bid')",
            "42P07",
        ),
        (
            "CREATE SINK s AS SELECT * FROM bid WITH (connector = 'pulsar')",
            "0A000",
        ),
        ("DROP SINK bid", "42809"),
        ("DROP SOURCE nothing", "42P01"),
    ];
    for (sql, expected) in cases {
        let (got, message) = code(sql.to_string()).await;
        assert_eq!(got, expected, "{sql}: {message}");
    }
    // A FIFO without a writer, and a device that never ends: refused, not read.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("rows.csv");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for path in [fifo.to_str().unwrap(), "/dev/zero"] {
        let sql = format!("CREATE SOURCE x (a int) WITH (connector = 'file', path = '{path}')");
        let (got, message) = code(sql.clone()).await;
        assert_eq!(got, "42809", "{sql}: {message}");
    }
    client
        .batch_execute("CREATE SINK s FROM bid WITH (connector = 'blackhole')")
        .await
        .unwrap();
    assert_eq!(code("SELECT * FROM s".to_string()).await.0, "42P01");
    assert_eq!(code("DROP SOURCE bid".to_string()).await.0, "2BP01");
    assert_eq!(
        code("DROP MATERIALIZED VIEW s".to_string()).await.0,
        "42809"
    );
    client
        .batch_execute("DROP SOURCE bid CASCADE")
        .await
        .unwrap();
    assert_eq!(text_rows(&client, "SHOW SINKS").await, Vec::<String>::new());
    // The server goes on.
    assert_eq!(text_rows(&client, "SELECT 1").await, ["1"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_source_keeps_its_watermark() {
    let configure = |c: &mut weir::config::Config| c.checkpoint.interval_ms = 0;
    let server = TestServer::start_with(configure).await;
    let files = server.dir.path().join("input");
    std::fs::create_dir(&files).unwrap();
    // 00:26 puts the watermark at 00:21, closing the windows at 00:00 and 00:10.
    std::fs::write(
        files.join("part-0.csv"),
        "2024-01-01 00:00:01,1\n2024-01-01 00:00:12,2\n2024-01-01 00:00:26,3\n",
    )
    .unwrap();
    let closed = "SELECT window_start, n FROM closed ORDER BY window_start";
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE SOURCE readings (at timestamp, v int,
               WATERMARK FOR at AS at - INTERVAL '5 seconds')
               WITH (connector = 'file', path = '{}');
             CREATE MATERIALIZED VIEW closed AS
               SELECT window_start, count(*) AS n FROM TUMBLE(readings, at, INTERVAL '10 seconds')
               GROUP BY window_start EMIT ON WINDOW CLOSE;",
            files.display()
        ))
        .await
        .unwrap();
    drain(&client).await;
    let before = text_rows(&client, closed).await;
    assert_eq!(before, ["2024-01-01 00:00:00 1", "2024-01-01 00:00:10 1"]);
    client.batch_execute("CHECKPOINT").await.unwrap();
    drop(client);
    let dir = server.stop_and_close().await;
    // A row for the closed window at 00:10 arrives after the restart: still late.
    std::fs::write(
        dir.path().join("input/part-1.csv"),
        "2024-01-01 00:00:15,4\n2024-01-01 00:00:45,5\n",
    )
    .unwrap();
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    drain(&client).await;
    assert_eq!(
        text_rows(&client, closed).await,
        [
            "2024-01-01 00:00:00 1",
            "2024-01-01 00:00:10 1",
            "2024-01-01 00:00:20 1"
        ]
    );
    server.stop().await;
}

/// A file source's files read before a checkpoint must be there, unchanged, when a restart
/// reads them again: a file rewritten, deleted or replaced, or a new file sorting before
/// those read, leaves the server starting and the source reporting why it stopped, its view
/// as it was at the checkpoint (nothing read twice or skipped); a new file sorting after them
/// is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_source_refuses_files_changed_under_it_and_the_server_still_starts() {
    let configure = |c: &mut weir::config::Config| c.checkpoint.interval_ms = 0;
    type Change = fn(&std::path::Path);
    let cases: [(&str, Change, Option<&str>); 6] = [
        (
            "rewritten",
            |d| std::fs::write(d.join("part-0.csv"), "1\n2\n9\n").unwrap(),
            Some("file \"part-0.csv\" changed since it was read (4 bytes then, 6 now"),
        ),
        (
            "deleted",
            |d| std::fs::remove_file(d.join("part-1.csv")).unwrap(),
            Some("file \"part-1.csv\", read from row 2, is gone"),
        ),
        (
            "sorting before",
            |d| std::fs::write(d.join("part-00.csv"), "7\n").unwrap(),
            Some("file \"part-00.csv\" sorts before \"part-1.csv\", which was read before it"),
        ),
        (
            "replaced by a FIFO",
            |d| {
                std::fs::remove_file(d.join("part-0.csv")).unwrap();
                let fifo = std::ffi::CString::new(d.join("part-0.csv").to_str().unwrap());
                // SAFETY: mkfifo reads the NUL-terminated path it is given.
                assert_eq!(unsafe { libc::mkfifo(fifo.unwrap().as_ptr(), 0o600) }, 0);
            },
            Some("is gone"),
        ),
        (
            "directory deleted",
            |d| std::fs::remove_dir_all(d).unwrap(),
            Some("could not open"),
        ),
        (
            "added after",
            |d| std::fs::write(d.join("part-2.csv"), "4\n").unwrap(),
            None,
        ),
    ];
    for (case, change, error) in cases {
        let server = TestServer::start_with(configure).await;
        let files = server.dir.path().join("input");
        std::fs::create_dir(&files).unwrap();
        std::fs::write(files.join("part-0.csv"), "1\n2\n").unwrap();
        std::fs::write(files.join("part-1.csv"), "3\n").unwrap();
        let client = server.connect().await;
        client
            .batch_execute(&format!(
                "CREATE SOURCE f (k bigint) WITH (connector = 'file', path = '{}');
                 CREATE MATERIALIZED VIEW fv AS SELECT count(*) AS n, sum(k) AS s FROM f;",
                files.display()
            ))
            .await
            .unwrap();
        drain(&client).await;
        client.batch_execute("CHECKPOINT").await.unwrap();
        drop(client);
        let dir = server.stop_and_close().await;
        change(&dir.path().join("input"));
        let server = TestServer::start_in(dir, configure).await;
        let client = server.connect().await;
        match error {
            Some(error) => {
                let mut reported = None;
                for _ in 0..500 {
                    reported = text_rows(
                        &client,
                        "SELECT error FROM weir_catalog.sources WHERE error IS NOT NULL",
                    )
                    .await
                    .pop();
                    if reported.is_some() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                let reported = reported.unwrap_or_default();
                assert!(reported.contains(error), "{case}: {reported}");
                client.batch_execute("FLUSH").await.unwrap();
                assert_eq!(
                    text_rows(&client, "SELECT * FROM fv").await,
                    ["3 6"],
                    "{case}"
                );
            }
            None => {
                drain(&client).await;
                assert_eq!(
                    text_rows(&client, "SELECT * FROM fv").await,
                    ["4 10"],
                    "{case}"
                );
            }
        }
        drop(client);
        server.stop().await;
    }
}

/// Puts `body` at `key` in moto's bucket `bucket`.
async fn put_object(s3: &S3Server, bucket: &str, key: &str, body: &str) {
    put_bytes(s3, bucket, key, body.as_bytes().to_vec()).await
}

/// Events `ids` as a Parquet file of two row groups.
fn parquet_events(ids: std::ops::Range<u64>) -> Vec<u8> {
    use datafusion::arrow::array::{Int32Array, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("g", DataType::Int32, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(ids.clone().map(|i| i as i64).collect::<Int64Array>()),
            Arc::new(ids.map(|i| (i % 3) as i32).collect::<Int32Array>()),
        ],
    )
    .unwrap();
    let mut out = Vec::new();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(batch.num_rows().div_ceil(2).max(1)))
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    out
}

/// Puts `body` at `key` in moto's bucket `bucket`.
async fn put_bytes(s3: &S3Server, bucket: &str, key: &str, body: Vec<u8>) {
    use object_store::ObjectStoreExt;
    let mut builder = object_store::aws::AmazonS3Builder::new().with_bucket_name(bucket);
    for (k, v) in s3.options() {
        builder = builder.with_config(k.parse().unwrap(), v);
    }
    let store = builder.build().unwrap();
    store
        .put(&object_store::path::Path::from(key), body.into())
        .await
        .unwrap();
}

/// Newline-delimited JSON events `ids`, in group `id % 3`.
fn events(ids: std::ops::Range<u64>) -> String {
    ids.map(|i| format!("{{\"id\": {i}, \"g\": {}}}\n", i % 3))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_source_reads_json_objects_as_they_come_exactly_once_across_a_kill() {
    let s3 = S3Server::start().await;
    s3.create_bucket("lake").await;
    put_object(&s3, "lake", "events/part-0.json", &events(0..100)).await;
    put_object(&s3, "lake", "other/part-0.json", &events(0..5)).await;
    put_bytes(&s3, "lake", "pq/part-0.parquet", parquet_events(0..1000)).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    let options: Vec<String> = s3
        .options()
        .into_iter()
        .map(|(k, v)| format!("s3.{k} = '{v}'"))
        .collect();
    client
        .batch_execute(&format!(
            "CREATE SOURCE ev (id bigint, g int) WITH (connector = 's3', \
               path = 's3://lake/events/', refresh.interval.sec = '1', {}) \
             FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW ev_n AS \
               SELECT count(*) AS n, sum(id) AS s, count(DISTINCT id) AS d FROM ev;
             CREATE SOURCE pq (id bigint, g int) WITH (connector = 's3', \
               path = 's3://lake/pq', refresh.interval.sec = '1', {0}) \
             FORMAT PLAIN ENCODE PARQUET;
             CREATE MATERIALIZED VIEW pq_n AS \
               SELECT count(*) AS n, sum(id) AS s, count(DISTINCT id) AS d FROM pq",
            options.join(", ")
        ))
        .await
        .unwrap();
    let sum = |n: u64| n * (n - 1) / 2;
    until(&client, 100, sum(100)).await;
    client.batch_execute("CHECKPOINT").await.unwrap();
    // A new object is found at the next listing.
    put_object(&s3, "lake", "events/part-1.json", &events(100..250)).await;
    until(&client, 250, sum(250)).await;
    server.stop(9).await;
    put_object(&s3, "lake", "events/part-2.json", &events(250..300)).await;
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    until(&client, 300, sum(300)).await;
    // Parquet objects by row: two, one of them written while the server was down.
    put_bytes(&s3, "lake", "pq/part-1.parquet", parquet_events(1000..1500)).await;
    until_in(&client, "pq_n", 1500, sum(1500)).await;
    server.stop(15).await;
}

/// Waits until `ev_n` reads `n` rows summing to `s`, each once.
async fn until(client: &tokio_postgres::Client, n: u64, s: u64) {
    until_in(client, "ev_n", n, s).await
}

/// Waits until view `view` reads `n` rows summing to `s`, each once.
async fn until_in(client: &tokio_postgres::Client, view: &str, n: u64, s: u64) {
    let expected = format!("{n} {s} {n}");
    let mut last = Vec::new();
    for _ in 0..600 {
        client.batch_execute("FLUSH").await.unwrap();
        last = text_rows(client, &format!("SELECT * FROM {view}")).await;
        if last == [expected.clone()] {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{view} read {last:?}, not {expected}");
}

/// What a user of an `s3` source sees when it cannot work: bad options and an endpoint nobody
/// answers at are refused at CREATE SOURCE with their SQLSTATEs; an object that does not
/// decode (a malformed JSON line, a CSV line with a value of the wrong type, bytes that are
/// not Parquet) stops its source with the reason, naming the object, in
/// `weir_catalog.sources`, while the server and the other sources go on. And a Parquet object
/// resumes at its row: the reader is held (`source.files.batch:pause`) after two batches of a
/// 20,000-row object, a checkpoint takes that position, the server is killed, and the restart
/// reads the rest once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_sources_refuse_bad_options_and_objects_clearly_and_resume_inside_a_parquet_object() {
    let s3 = S3Server::start().await;
    s3.create_bucket("lake").await;
    let options: Vec<String> = s3
        .options()
        .into_iter()
        .map(|(k, v)| format!("s3.{k} = '{v}'"))
        .collect();
    let options = options.join(", ");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    let code = |sql: String| {
        let client = &client;
        async move {
            let e = client.batch_execute(&sql).await.unwrap_err();
            let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
            (db.code().code().to_string(), db.message().to_string())
        }
    };
    let source = |path: &str, more: &str, encode: &str| {
        format!(
            "CREATE SOURCE x (id bigint, g int) WITH (connector = 's3', path = '{path}'{more}) \
             FORMAT PLAIN ENCODE {encode}"
        )
    };
    let unreachable = options.replace(&s3.addr.to_string(), "127.0.0.1:1");
    let cases = [
        (
            source("s3://lake/events/", "", "JSON").replace("path", "paht"),
            "22023",
        ),
        (
            source("lake/events/", &format!(", {options}"), "JSON"),
            "22023",
        ),
        (
            source(
                "s3://lake/events/",
                &format!(", {options}, s3.colour = 'red'"),
                "JSON",
            ),
            "22023",
        ),
        (
            source(
                "s3://lake/events/",
                &format!(", {options}, refresh.interval.sec = 'soon'"),
                "JSON",
            ),
            "22023",
        ),
        (
            source("s3://lake/events/", &format!(", {options}"), "AVRO"),
            "0A000",
        ),
        (
            source("s3://lake/events/", &format!(", {unreachable}"), "JSON"),
            "08001",
        ),
    ];
    for (sql, expected) in cases {
        let (got, message) = code(sql.clone()).await;
        assert_eq!(got, expected, "{sql}: {message}");
    }

    // Objects that do not decode stop their sources, each saying which object and why.
    put_object(
        &s3,
        "lake",
        "json/part-0.json",
        "{\"id\": 1, \"g\": 1}\n{not json\n",
    )
    .await;
    put_object(&s3, "lake", "csv/part-0.csv", "1,1\n2,two\n").await;
    put_object(
        &s3,
        "lake",
        "bad-pq/part-0.parquet",
        "these bytes are not Parquet",
    )
    .await;
    put_bytes(&s3, "lake", "pq/part-0.parquet", parquet_events(0..20_000)).await;
    for (name, path, encode) in [
        ("bad_json", "json", "JSON"),
        ("bad_csv", "csv", "CSV"),
        ("bad_pq", "bad-pq", "PARQUET"),
    ] {
        client
            .batch_execute(&format!(
                "CREATE SOURCE {name} (id bigint, g int) WITH (connector = 's3', \
                   path = 's3://lake/{path}/', {options}) FORMAT PLAIN ENCODE {encode};
                 CREATE MATERIALIZED VIEW {name}_n AS SELECT count(*) AS n FROM {name}"
            ))
            .await
            .unwrap();
    }
    let errors = "SELECT name, error FROM weir_catalog.sources \
                  WHERE name LIKE 'bad%' AND error IS NOT NULL ORDER BY name";
    let mut stopped = Vec::new();
    for _ in 0..300 {
        stopped = text_rows(&client, errors).await;
        if stopped.len() == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(stopped.len(), 3, "{stopped:?}");
    let objects = [
        "bad_csv s3://lake/csv/part-0.csv: ",
        "bad_json s3://lake/json/part-0.json: ",
        "bad_pq s3://lake/bad-pq/part-0.parquet: ",
    ];
    for (row, object) in stopped.iter().zip(objects) {
        assert!(row.starts_with(object), "{row}");
    }
    assert_eq!(text_rows(&client, "SELECT 1").await, ["1"]);
    // Gone, so that the failpoint below counts only the next source's batches.
    client
        .batch_execute(
            "DROP SOURCE bad_json CASCADE; DROP SOURCE bad_csv CASCADE; DROP SOURCE bad_pq CASCADE",
        )
        .await
        .unwrap();
    server.stop(15).await;

    // A Parquet object read in part: held before its third batch, checkpointed, killed.
    let server = ChildServer::start_with_env(
        &data,
        &[],
        &[("WEIR_FAILPOINTS", "source.files.batch@3:pause")],
    )
    .await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE SOURCE pq (id bigint, g int) WITH (connector = 's3', \
               path = 's3://lake/pq/', refresh.interval.sec = '1', {options}) \
             FORMAT PLAIN ENCODE PARQUET;
             CREATE MATERIALIZED VIEW pq_n AS \
               SELECT count(*) AS n, sum(id) AS s, count(DISTINCT id) AS d FROM pq"
        ))
        .await
        .unwrap();
    let fed = "SELECT rows FROM weir_catalog.sources WHERE name = 'pq'";
    let mut read = Vec::new();
    for _ in 0..300 {
        read = text_rows(&client, fed).await;
        if read == ["8192"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(read, ["8192"], "two batches of 4,096 rows, then held");
    client.batch_execute("FLUSH; CHECKPOINT").await.unwrap();
    assert_eq!(text_rows(&client, "SELECT n FROM pq_n").await, ["8192"]);
    server.stop(9).await;
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    let sum = |n: u64| n * (n - 1) / 2;
    until_in(&client, "pq_n", 20_000, sum(20_000)).await;
    server.stop(15).await;
}
