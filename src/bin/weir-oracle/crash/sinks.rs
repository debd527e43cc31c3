//! The crash test's sinks: `v_groups` upserted into a PostgreSQL table and into a Kafka topic
//! (at least once: the test broker serves no transactions' ends), and the Kafka source's
//! events appended to a PostgreSQL table and written as JSON files partitioned by `g`. After
//! every restart, once Weir has delivered the durable checkpoints, the table upserted into
//! equals PostgreSQL's `v_groups`, the topic read as a compacted topic equals it too, and the
//! table appended to and the files hold each event exactly once: a change lost, applied twice
//! or out of order fails the run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tokio_postgres::Client;

use crate::broker::Broker;
use crate::replay::{exec, rows, Row};

/// The topic `v_groups` is upserted into.
const TOPIC: &str = "crash_sink_groups";

/// How long Weir may take to deliver after a start (a checkpoint, then the delivery).
const CATCH_UP: Duration = Duration::from_secs(90);

pub struct Sinks {
    broker: String,
    /// The file sink's directory.
    files: PathBuf,
}

impl Sinks {
    /// The sinks' topic on `broker`, and their files under `work`.
    pub async fn start(broker: &Broker, work: &Path) -> Result<Sinks, String> {
        broker.create_topic(TOPIC, 1).await?;
        Ok(Sinks {
            broker: broker.address.clone(),
            files: work.join("sink_events_files"),
        })
    }

    /// The sinks, into `database` of the oracle's PostgreSQL at `pg_conn`.
    pub async fn create(&self, weir: &Client, pg_conn: &str, database: &str) -> Result<(), String> {
        let endpoint = super::upstreams::endpoint(pg_conn, database);
        let target =
            |table: &str| format!("connector = 'postgres', {endpoint}, table.name = '{table}'");
        let ddl = format!(
            "CREATE SINK s_groups FROM v_groups WITH ({});
             CREATE SINK s_events AS SELECT id, g, v FROM k_events WITH ({});
             CREATE SINK s_groups_kafka FROM v_groups
               WITH (connector = 'kafka', properties.bootstrap.server = '{}', topic = '{TOPIC}',
                     sink.delivery = 'at_least_once')
               FORMAT UPSERT ENCODE JSON;
             CREATE SINK s_events_files AS SELECT id, g, v FROM k_events
               WITH (connector = 'file', path = '{}', partition_by = 'g')
               FORMAT PLAIN ENCODE JSON",
            target("public.sink_groups"),
            target("public.sink_events"),
            self.broker,
            self.files.display(),
        );
        exec(weir, &ddl).await.map_err(|e| format!("weir: {e}"))
    }

    /// Waits until every sink's target holds what PostgreSQL says it must, and fails with the
    /// difference when one does not within `CATCH_UP`, or at once when Weir stops answering
    /// (it died: nothing will be delivered). Returns the checks made.
    pub async fn converge(&self, weir: &Client, pg: &Client) -> Result<u64, String> {
        let started = std::time::Instant::now();
        let pairs = [
            (
                "SELECT * FROM sink_groups ORDER BY g",
                "SELECT * FROM v_groups ORDER BY g",
            ),
            (
                "SELECT * FROM sink_events ORDER BY id",
                "SELECT * FROM k_events ORDER BY id",
            ),
        ];
        for (sink, truth) in pairs {
            let expected = rows(pg, truth).await?;
            wait(weir, started, sink, &expected, || rows(pg, sink)).await?;
        }
        let expected: Vec<String> = rows(pg, "SELECT g, c, sv, mn, mx FROM v_groups ORDER BY g")
            .await?
            .iter()
            .map(text)
            .collect();
        let broker = self.broker.clone();
        wait(weir, started, TOPIC, &expected, || {
            let broker = broker.clone();
            async move {
                tokio::task::spawn_blocking(move || compacted(&broker))
                    .await
                    .map_err(|e| e.to_string())?
            }
        })
        .await?;
        let expected: Vec<String> = rows(
            pg,
            "SELECT id, g, v FROM k_events ORDER BY id, g NULLS FIRST, v NULLS FIRST",
        )
        .await?
        .iter()
        .map(text)
        .collect();
        let files = self.files.clone();
        wait(weir, started, "s_events_files", &expected, || {
            let files = files.clone();
            async move {
                tokio::task::spawn_blocking(move || json_files(&files))
                    .await
                    .map_err(|e| e.to_string())?
            }
        })
        .await?;
        Ok(4)
    }
}

/// The rows of the JSON files under `dir`'s `g=<g>/` directories (Weir's own `_weir/` left
/// out), as `id g v` (NULL as `NULL`), in order.
fn json_files(dir: &Path) -> Result<Vec<String>, String> {
    let mut rows: Vec<(i64, Option<i64>, Option<i64>)> = Vec::new();
    let Ok(groups) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    for group in groups {
        let group = group.map_err(|e| e.to_string())?.path();
        let name = group
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let Some(g) = name.strip_prefix("g=") else {
            if name != "_weir" {
                return Err(format!("{} in the file sink's directory", group.display()));
            }
            continue;
        };
        for file in std::fs::read_dir(&group).map_err(|e| e.to_string())? {
            let file = file.map_err(|e| e.to_string())?.path();
            let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
            for line in text.lines() {
                let v: serde_json::Value = serde_json::from_str(line)
                    .map_err(|e| format!("{}: {e}: {line}", file.display()))?;
                let id = v["id"].as_i64().ok_or(format!("no id: {line}"))?;
                let g = match g {
                    "__HIVE_DEFAULT_PARTITION__" => None,
                    g => Some(g.parse::<i64>().map_err(|e| format!("g={g}: {e}"))?),
                };
                rows.push((id, g, v["v"].as_i64()));
            }
        }
    }
    rows.sort();
    Ok(rows
        .into_iter()
        .map(|(id, g, v)| {
            let text = |x: Option<i64>| x.map_or("NULL".to_string(), |x| x.to_string());
            format!("{id} {} {}", text(g), text(v))
        })
        .collect())
}

/// A row as text, its values separated by spaces.
fn text(row: &Row) -> String {
    row.iter()
        .map(|v| v.as_deref().unwrap_or("NULL"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads `what` again until it equals `expected`, or `CATCH_UP` has passed since `started`,
/// or Weir does not answer.
async fn wait<T, F, Fut>(
    weir: &Client,
    started: std::time::Instant,
    what: &str,
    expected: &[T],
    read: F,
) -> Result<(), String>
where
    T: PartialEq + std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, String>>,
{
    loop {
        let actual = read().await?;
        if actual == expected {
            return Ok(());
        }
        exec(weir, "SELECT 1")
            .await
            .map_err(|e| format!("weir, while {what} catches up: {e}"))?;
        if started.elapsed() > CATCH_UP {
            let show = |r: &[T]| {
                r.iter()
                    .take(10)
                    .map(|r| format!("{r:?}"))
                    .collect::<Vec<_>>()
            };
            return Err(format!(
                "sink target {what} did not come to hold what it must within {CATCH_UP:?}: it \
                 has {} rows, not {}\n  target: {:?}\n  expected: {:?}",
                actual.len(),
                expected.len(),
                show(&actual),
                show(expected)
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The topic read from its start as a compacted topic: each key's last value (a tombstone
/// deletes it), as rows `g c sv mn mx`.
fn compacted(broker: &str) -> Result<Vec<String>, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", "crash-sink-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(|e| e.to_string())?;
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .map_err(|e| e.to_string())?;
    consumer.assign(&list).map_err(|e| e.to_string())?;
    let mut by_key = BTreeMap::new();
    loop {
        match consumer.poll(Duration::from_secs(10)) {
            Some(Ok(m)) => {
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                match m.payload() {
                    Some(p) => {
                        let v: serde_json::Value =
                            serde_json::from_slice(p).map_err(|e| format!("{TOPIC}: {e}"))?;
                        let field = |f: &str| match &v[f] {
                            serde_json::Value::Null => "NULL".to_string(),
                            other => other.to_string(),
                        };
                        let row = ["g", "c", "sv", "mn", "mx"].map(field).join(" ");
                        by_key.insert(key, (v["g"].as_i64().unwrap_or(i64::MIN), row));
                    }
                    None => {
                        by_key.remove(&key);
                    }
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) | None => break,
            Some(Err(e)) => return Err(format!("reading {TOPIC}: {e}")),
        }
    }
    let mut rows: Vec<(i64, String)> = by_key.into_values().collect();
    rows.sort();
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}
