//! File sinks against a local directory and an S3-compatible store (moto): the files of a
//! `file` sink hold each row of its query exactly once across crashes at each step of a
//! delivery (after the commit record, after the renames) and a SIGKILL, under Hive-style
//! partition directories; an `s3` sink's CSV objects read back through an `s3` source equal
//! the table they came from; options a file sink cannot take are refused with their SQLSTATEs.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{text_rows, ChildServer, S3Server};
use datafusion::arrow::util::display::array_value_to_string;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// A server that checkpoints (and so delivers) every 300 ms, with failpoints `failpoints`.
async fn start(data: &Path, failpoints: &str) -> ChildServer {
    let config = data.with_extension("toml");
    std::fs::write(
        &config,
        "barrier_interval_ms = 100\n[checkpoint]\ninterval_ms = 300\nmin_pause_ms = 0\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap()];
    ChildServer::start_with_env(data, &args, &[("WEIR_FAILPOINTS", failpoints)]).await
}

/// Every row of the Parquet files under `dir` (not Weir's own `_weir/`), as "day id amount"
/// with the day from its `day=...` directory, sorted.
fn lake(dir: &Path) -> Vec<String> {
    let mut rows = Vec::new();
    let Ok(days) = std::fs::read_dir(dir) else {
        return rows;
    };
    for day in days {
        let day = day.unwrap().path();
        let name = day.file_name().unwrap().to_string_lossy().into_owned();
        let Some(value) = name.strip_prefix("day=") else {
            assert!(name == "_weir", "unexpected {name} in the sink's directory");
            continue;
        };
        for file in std::fs::read_dir(&day).unwrap() {
            let file = file.unwrap().path();
            assert!(
                file.to_string_lossy().ends_with(".parquet"),
                "{} is not a Parquet file",
                file.display()
            );
            let reader =
                ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&file).unwrap())
                    .unwrap()
                    .build()
                    .unwrap();
            for batch in reader {
                let batch = batch.unwrap();
                assert_eq!(batch.schema().field(0).name(), "id");
                for row in 0..batch.num_rows() {
                    let cell = |c: usize| array_value_to_string(batch.column(c), row).unwrap();
                    rows.push(format!("{value} {} {}", cell(0), cell(1)));
                }
            }
        }
    }
    rows.sort();
    rows
}

async fn insert(weir: &tokio_postgres::Client, ids: std::ops::Range<i32>) {
    weir.batch_execute(&format!(
        "INSERT INTO events SELECT i, 'd' || (i % 4), i * 1.25 FROM generate_series({}, {}) AS s(i)",
        ids.start,
        ids.end - 1
    ))
    .await
    .unwrap();
}

/// Inserts 50 rows every 150 ms, batch `i` from id `100 i` on, until the server goes away
/// (a failpoint ends it) or the batches run out.
async fn insert_until_it_ends(weir: &tokio_postgres::Client, batches: std::ops::Range<i32>) {
    for i in batches {
        let sql = format!(
            "INSERT INTO events SELECT i, 'd' || (i % 4), i * 1.25 FROM generate_series({}, {}) AS s(i)",
            i * 100,
            i * 100 + 49
        );
        if weir.batch_execute(&sql).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// Waits until the files hold exactly the table's rows, or fails after 60 s.
async fn converge(weir: &tokio_postgres::Client, dir: &Path) {
    let sql = "SELECT day || ' ' || id || ' ' || amount FROM events";
    let mut last = (Vec::new(), Vec::new());
    for _ in 0..600 {
        let mut want = text_rows(weir, sql).await;
        want.sort();
        let got = lake(dir);
        if got == want {
            return;
        }
        last = (want, got);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let twice: Vec<_> = last.1.windows(2).filter(|w| w[0] == w[1]).take(5).collect();
    panic!(
        "the files hold {} rows, the table {}; rows in the files twice: {twice:?}",
        last.1.len(),
        last.0.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_files_hold_each_row_once_across_crashes_at_each_step_of_a_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = dir.path().join("lake");
    // Killed after the 3rd delivery's files are visible, before its marker.
    let server = start(&data, "sink.file.before_marker@3").await;
    let weir = server.connect().await;
    weir.batch_execute("CREATE TABLE events (id int PRIMARY KEY, day text, amount numeric(10,2))")
        .await
        .unwrap();
    insert(&weir, 1..100).await;
    weir.batch_execute(&format!(
        "CREATE SINK lake AS SELECT * FROM events WITH (connector = 'file', path = '{}', \
         partition_by = 'day', force_append_only = 'true') FORMAT PLAIN ENCODE PARQUET",
        out.display()
    ))
    .await
    .unwrap();
    let create = text_rows(&weir, "SHOW CREATE SINK lake").await;
    assert!(
        create[0].contains("partition_by = 'day'") && create[0].contains("ENCODE PARQUET"),
        "{create:?}"
    );
    insert_until_it_ends(&weir, 1..40).await;
    assert!(!server.ended().await.success());
    // Killed after the 2nd commit record, before any of its files is renamed (the first is
    // the record the crash above left, finished at start).
    let server = start(&data, "sink.file.before_publish@2").await;
    let weir = server.connect().await;
    insert_until_it_ends(&weir, 40..80).await;
    assert!(!server.ended().await.success());
    // Renames fail (the 2nd to the 6th): the delivery is retried, with backoff, while
    // checkpoints go on; the retry finishes the decided delivery before a larger one.
    let server = start(&data, "sink.file.rename@2..6:eio").await;
    let weir = server.connect().await;
    for i in 80..100 {
        insert(&weir, i * 100..i * 100 + 50).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    converge(&weir, &out).await;
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(
        log.contains("failpoint sink.file.rename: failing"),
        "no rename failed"
    );
    assert!(
        log.contains("sink delivery failed"),
        "no delivery was retried"
    );
    insert(&weir, 10_000..10_500).await;
    // Then a SIGKILL with rows not yet delivered.
    server.stop(libc::SIGKILL).await;
    let server = start(&data, "").await;
    let weir = server.connect().await;
    insert(&weir, 20_000..20_300).await;
    converge(&weir, &out).await;
    let status = text_rows(
        &weir,
        "SELECT connector, lag_epochs, last_error IS NULL FROM weir_catalog.sinks",
    )
    .await;
    assert_eq!(status.len(), 1);
    assert!(status[0].starts_with("file "), "{status:?}");
    server.stop(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_objects_in_s3_read_back_as_the_table_they_came_from() {
    let s3 = S3Server::start().await;
    s3.create_bucket("lake").await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start(&data, "").await;
    let weir = server.connect().await;
    let s3_options: Vec<String> = s3
        .options()
        .into_iter()
        .map(|(k, v)| format!("s3.{k} = '{v}'"))
        .collect();
    let s3_options = s3_options.join(", ");
    weir.batch_execute(&format!(
        "CREATE TABLE events (id int PRIMARY KEY, day text, amount numeric(10,2));
         CREATE SINK out AS SELECT id, day, amount FROM events
           WITH (connector = 's3', path = 's3://lake/events/', header = 'true',
                 force_append_only = 'true', {s3_options})
           FORMAT PLAIN ENCODE CSV"
    ))
    .await
    .unwrap();
    insert(&weir, 1..1000).await;
    server.stop(libc::SIGKILL).await;
    let server = start(&data, "").await;
    let weir = server.connect().await;
    insert(&weir, 1000..1500).await;
    // Read back by a source of Weir's own, which passes over the sink's `_weir/` objects.
    weir.batch_execute(&format!(
        "CREATE SOURCE back (id int, day text, amount numeric(10,2))
           WITH (connector = 's3', path = 's3://lake/events/', header = 'true',
                 refresh.interval.sec = '1', {s3_options})
           FORMAT PLAIN ENCODE CSV;
         CREATE MATERIALIZED VIEW back_rows AS SELECT id, day, amount, count(*) AS n
           FROM back GROUP BY id, day, amount"
    ))
    .await
    .unwrap();
    let want = text_rows(
        &weir,
        "SELECT id || ' ' || day || ' ' || amount || ' 1' FROM events ORDER BY id",
    )
    .await;
    let got_sql = "SELECT id || ' ' || day || ' ' || amount || ' ' || n FROM back_rows ORDER BY id";
    let mut got = Vec::new();
    for _ in 0..600 {
        got = text_rows(&weir, got_sql).await;
        if got == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want);
    server.stop(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_sinks_refuse_what_they_cannot_write_with_its_sqlstate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start(&data, "").await;
    let weir = server.connect().await;
    weir.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         CREATE MATERIALIZED VIEW counts AS SELECT v, count(*) AS n FROM t GROUP BY v",
    )
    .await
    .unwrap();
    let path = dir.path().join("out");
    let path = path.display();
    for (with, format, code) in [
        ("path = 'relative/dir'", "FORMAT PLAIN ENCODE JSON", "42602"),
        (&format!("path = '{path}'"), "", "42601"),
        (
            &format!("path = '{path}'"),
            "FORMAT PLAIN ENCODE AVRO",
            "0A000",
        ),
        (
            &format!("path = '{path}'"),
            "FORMAT UPSERT ENCODE JSON",
            "0A000",
        ),
        (
            &format!("path = '{path}', partition_by = 'nope'"),
            "FORMAT PLAIN ENCODE JSON",
            "42703",
        ),
        (
            &format!("path = '{path}', header = 'true'"),
            "FORMAT PLAIN ENCODE PARQUET",
            "22023",
        ),
        (
            &format!("path = '{path}', s3.region = 'x'"),
            "FORMAT PLAIN ENCODE JSON",
            "22023",
        ),
        ("", "FORMAT PLAIN ENCODE JSON", "22023"),
    ] {
        // Over the updating view, force_append_only makes FORMAT PLAIN acceptable.
        let sql = format!(
            "CREATE SINK bad FROM counts WITH (connector = 'file', force_append_only = 'true'{}{with}) {format}",
            if with.is_empty() { "" } else { ", " }
        );
        let e = weir.batch_execute(&sql).await.unwrap_err();
        let got = e.code().map(|c| c.code().to_string());
        assert_eq!(got.as_deref(), Some(code), "{sql}: {e:?}");
    }
    // Without force_append_only, an updating view cannot be written as files.
    let e = weir
        .batch_execute(&format!(
            "CREATE SINK bad FROM counts WITH (connector = 'file', path = '{path}') \
             FORMAT PLAIN ENCODE JSON"
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("0A000"), "{e:?}");
    server.stop(libc::SIGTERM).await;
}
