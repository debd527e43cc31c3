//! Runs every `sql-tests/*.slt` file against a fresh Weir server over a real Postgres
//! connection. `WEIR_SLT_COMPLETE=1` rewrites the expected output from the server's answers
//! (then read the diff before committing it).

mod common;

use std::path::PathBuf;

use async_trait::async_trait;
use sqllogictest::{DBOutput, DefaultColumnType};
use tokio_postgres::SimpleQueryMessage;

use common::TestServer;

struct Weir {
    client: tokio_postgres::Client,
}

/// A failed statement as `SQLSTATE: message`, so that slt files can match either.
#[derive(Debug)]
struct SqlError(String);

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SqlError {}

impl From<tokio_postgres::Error> for SqlError {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => SqlError(format!("{}: {}", db.code().code(), db.message())),
            None => SqlError(e.to_string()),
        }
    }
}

#[async_trait]
impl sqllogictest::AsyncDB for Weir {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SqlError> {
        let messages = self.client.simple_query(sql).await?;
        let mut rows = Vec::new();
        let mut columns = None;
        let mut count = 0;
        for m in messages {
            match m {
                SimpleQueryMessage::RowDescription(d) => columns = Some(d.len()),
                SimpleQueryMessage::Row(r) => {
                    columns = Some(r.len());
                    rows.push(
                        (0..r.len())
                            .map(|i| match r.get(i) {
                                None => "NULL".to_string(),
                                Some("") => "(empty)".to_string(),
                                Some(v) => v.to_string(),
                            })
                            .collect(),
                    );
                }
                SimpleQueryMessage::CommandComplete(n) => count = n,
                _ => {}
            }
        }
        Ok(match columns {
            Some(n) => DBOutput::Rows {
                types: vec![DefaultColumnType::Any; n],
                rows,
            },
            None => DBOutput::StatementComplete(count),
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "weir"
    }

    async fn sleep(dur: std::time::Duration) {
        tokio::time::sleep(dur).await;
    }
}

/// The slt files, or with `WEIR_SLT_FILES=a,b` those whose names contain `a` or `b`.
fn slt_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql-tests");
    let only = std::env::var("WEIR_SLT_FILES").unwrap_or_default();
    let wanted = |p: &PathBuf| {
        let name = p
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        only.is_empty() || only.split(',').any(|o| name.contains(o.trim()))
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("sql-tests directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(wanted)
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_logic_tests() {
    let complete = std::env::var("WEIR_SLT_COMPLETE").is_ok_and(|v| v == "1");
    let files = slt_files();
    assert!(!files.is_empty(), "no slt files found");
    let mut failures = Vec::new();
    let mut records = 0usize;
    // Every file runs with views on one actor and on parallel actors (WEIR_SLT_PARALLELISM
    // picks other degrees, such as "1,2,4").
    let degrees: Vec<usize> = std::env::var("WEIR_SLT_PARALLELISM")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .map(|d| d.trim().parse().expect("WEIR_SLT_PARALLELISM: numbers"))
        .collect();
    let runs: Vec<(usize, &PathBuf)> = if complete {
        files.iter().map(|f| (1, f)).collect()
    } else {
        degrees
            .iter()
            .flat_map(|d| files.iter().map(move |f| (*d, f)))
            .collect()
    };
    for (parallelism, file) in runs {
        let server = TestServer::start_with(|c| {
            c.barrier_interval_ms = 200;
            c.streaming_parallelism = parallelism;
        })
        .await;
        let conn_str = server.conn_str();
        let mut runner = sqllogictest::Runner::new(move || {
            let conn_str = conn_str.clone();
            async move {
                let (client, conn) =
                    tokio_postgres::connect(&conn_str, tokio_postgres::NoTls).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok::<_, SqlError>(Weir { client })
            }
        });
        runner.add_label("weir");
        // Each record once, however many degrees of parallelism run it.
        records += if parallelism != degrees[0] && !complete {
            0
        } else {
            sqllogictest::parse_file::<DefaultColumnType>(file)
                .map(|rs| {
                    rs.iter()
                        .filter(|r| {
                            matches!(
                                r,
                                sqllogictest::Record::Statement { .. }
                                    | sqllogictest::Record::Query { .. }
                            )
                        })
                        .count()
                })
                .unwrap_or(0)
        };
        if complete {
            if let Err(e) = runner
                .update_test_file(
                    file,
                    " ",
                    sqllogictest::default_validator,
                    sqllogictest::default_normalizer,
                    sqllogictest::default_column_validator,
                )
                .await
            {
                failures.push(format!("{}: {e}", file.display()));
            }
        } else if let Err(e) = runner.run_file_async(file).await {
            failures.push(format!(
                "{} (parallelism {parallelism}):\n{}",
                file.display(),
                e.display(false)
            ));
        }
        server.stop().await;
    }
    println!(
        "slt: {} files, {records} records, parallelism {degrees:?}, {} failed runs",
        files.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "slt failures:\n{}",
        failures.join("\n\n")
    );
}
