//! The crash test's upstream systems: a PostgreSQL table read through CDC (the oracle's own
//! PostgreSQL is the upstream, so its table is the truth) and a Kafka topic (tansu), a copy of
//! whose acknowledged messages PostgreSQL keeps. A writer changes both while Weir runs and
//! dies; after every restart Weir's CDC table and the views over both must come to equal
//! PostgreSQL's: a change or a message lost, or taken twice, fails the run.

use std::time::Duration;

use rdkafka::producer::FutureRecord;
use tokio::sync::oneshot;
use tokio_postgres::Client;
use weir::rng::Rng;

use crate::broker::Broker;
use crate::replay::{connect, exec, rows};

/// The views over the upstreams' relations, in both systems: (name, query).
const VIEWS: &[(&str, &str)] = &[
    (
        "v_cdc",
        "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx FROM cdc_orders GROUP BY g",
    ),
    (
        "v_kafka",
        "SELECT g, count(*) AS c, sum(v) AS sv, count(DISTINCT id) AS d FROM k_events GROUP BY g",
    ),
];

const TOPIC: &str = "crash_events";

/// How long Weir may take to catch up with its upstreams after a start.
const CATCH_UP: Duration = Duration::from_secs(90);

pub struct Upstreams {
    broker: Broker,
    slot: String,
    writer: Option<Writer>,
}

/// What the writer carries from round to round.
pub struct Writer {
    rng: Rng,
    next_order: i64,
    next_event: i64,
    /// Changes made to each upstream, for the report.
    pub changes: u64,
}

/// A writer at work, until told to stop.
pub struct Writing {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(Writer, Result<(), String>)>,
}

impl Upstreams {
    pub async fn start(seed: u64) -> Result<Upstreams, String> {
        let broker = Broker::start()?;
        broker.create_topic(TOPIC, 2).await?;
        Ok(Upstreams {
            broker,
            slot: format!("weir_crash_{seed}"),
            writer: Some(Writer {
                rng: Rng::new(seed.wrapping_mul(31) + 7),
                next_order: 1,
                next_event: 1,
                changes: 0,
            }),
        })
    }

    /// The broker of the Kafka input, which the sinks' topic is on too.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// The replication slot the CDC source reads, which a run must drop before its database.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// The upstream relations in PostgreSQL, the CDC and Kafka inputs in Weir, and the views
    /// over them in both.
    pub async fn create(
        &self,
        weir: &Client,
        pg: &Client,
        pg_conn: &str,
        database: &str,
    ) -> Result<(), String> {
        exec(
            pg,
            "CREATE TABLE cdc_orders (id bigint PRIMARY KEY, g int, v bigint); \
             CREATE TABLE k_events (id bigint, g int, v bigint)",
        )
        .await?;
        let ddl = format!(
            "CREATE SOURCE cdc WITH (connector = 'postgres-cdc', {}, \
               slot.name = '{}', snapshot.batch_rows = '50');
             CREATE TABLE cdc_orders (id bigint PRIMARY KEY, g int, v bigint) \
               FROM cdc TABLE 'public.cdc_orders';
             CREATE SOURCE k_events (id bigint, g int, v bigint) \
               WITH (connector = 'kafka', topic = '{TOPIC}', \
                     properties.bootstrap.server = '{}') FORMAT PLAIN ENCODE JSON",
            endpoint(pg_conn, database),
            self.slot,
            self.broker.address,
        );
        exec(weir, &ddl).await.map_err(|e| format!("weir: {e}"))?;
        for (name, query) in VIEWS {
            exec(weir, &format!("CREATE MATERIALIZED VIEW {name} AS {query}"))
                .await
                .map_err(|e| format!("weir: {name}: {e}"))?;
            exec(pg, &format!("CREATE VIEW {name} AS {query}")).await?;
        }
        Ok(())
    }

    /// Starts the writer: a PostgreSQL transaction over `cdc_orders` and a few messages to the
    /// topic (each kept in PostgreSQL once the broker acknowledged it), again and again.
    pub async fn write(&mut self, pg_conn: &str) -> Result<Writing, String> {
        let mut writer = self.writer.take().ok_or("the upstream writer is missing")?;
        let pg = connect(pg_conn).await?;
        let producer = self.broker.producer()?;
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            loop {
                if stopped.try_recv().is_ok() {
                    return (writer, Ok(()));
                }
                let step = async {
                    writer.change_orders(&pg).await?;
                    writer.send_events(&pg, &producer).await
                };
                if let Err(e) = step.await {
                    return (writer, Err(e));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Ok(Writing { stop, task })
    }

    /// Stops the writer and keeps it for the next round.
    pub async fn stop(&mut self, writing: Writing) -> Result<(), String> {
        let _ = writing.stop.send(());
        let (writer, outcome) = writing
            .task
            .await
            .map_err(|e| format!("upstream writer: {e}"))?;
        self.writer = Some(writer);
        outcome
    }

    /// The changes the writer made so far.
    pub fn changes(&self) -> u64 {
        self.writer.as_ref().map_or(0, |w| w.changes)
    }

    /// Waits until Weir's CDC table and the views over both inputs equal PostgreSQL's, and
    /// fails with the difference when they do not within `CATCH_UP`. Returns the checks made.
    pub async fn converge(&self, weir: &Client, pg: &Client) -> Result<u64, String> {
        let started = std::time::Instant::now();
        let names = std::iter::once("cdc_orders").chain(VIEWS.iter().map(|(n, _)| *n));
        let mut checks = 0;
        for name in names {
            let query = format!("SELECT * FROM {name} ORDER BY 1, 2");
            let expected = rows(pg, &query).await?;
            loop {
                let actual = rows(weir, &query)
                    .await
                    .map_err(|e| format!("weir: {query}: {e}"))?;
                if actual == expected {
                    break;
                }
                if started.elapsed() > CATCH_UP {
                    let show = |r: &[crate::replay::Row]| {
                        r.iter()
                            .take(10)
                            .map(|r| format!("{r:?}"))
                            .collect::<Vec<_>>()
                    };
                    return Err(format!(
                        "{name} did not come to equal PostgreSQL's within {CATCH_UP:?}: weir has \
                         {} rows, PostgreSQL {}\n  weir: {:?}\n  PostgreSQL: {:?}",
                        actual.len(),
                        expected.len(),
                        show(&actual),
                        show(&expected)
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            checks += 1;
        }
        Ok(checks)
    }
}

impl Writer {
    /// One transaction: two new orders, one changed (its group too), one deleted.
    async fn change_orders(&mut self, pg: &Client) -> Result<(), String> {
        let (a, b) = (self.next_order, self.next_order + 1);
        self.next_order += 2;
        let pick = |rng: &mut Rng, below: i64| 1 + rng.below(below.max(1) as u64) as i64;
        let changed = pick(&mut self.rng, self.next_order);
        let deleted = pick(&mut self.rng, self.next_order);
        let (ga, gb, v) = (self.rng.below(7), self.rng.below(7), self.rng.below(1000));
        exec(
            pg,
            &format!(
                "BEGIN; \
                 INSERT INTO cdc_orders VALUES ({a}, {ga}, {v}), ({b}, {gb}, {}); \
                 UPDATE cdc_orders SET v = v + 1, g = (g + 1) % 7 WHERE id = {changed}; \
                 DELETE FROM cdc_orders WHERE id = {deleted}; \
                 COMMIT",
                v + 1
            ),
        )
        .await?;
        self.changes += 1;
        Ok(())
    }

    /// A few events to the topic; each one the broker acknowledged goes into PostgreSQL's copy.
    async fn send_events(
        &mut self,
        pg: &Client,
        producer: &rdkafka::producer::FutureProducer,
    ) -> Result<(), String> {
        for _ in 0..3 {
            let id = self.next_event;
            self.next_event += 1;
            let (g, v) = (self.rng.below(7), self.rng.below(1000));
            let value = format!(r#"{{"id": {id}, "g": {g}, "v": {v}}}"#);
            let key = id.to_string();
            producer
                .send(
                    FutureRecord::to(TOPIC).key(&key).payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| format!("producing to the broker: {e}"))?;
            exec(pg, &format!("INSERT INTO k_events VALUES ({id}, {g}, {v})")).await?;
            self.changes += 1;
        }
        Ok(())
    }
}

/// The options that reach `database` of the PostgreSQL at `pg_conn` (`host=... port=...`), as
/// a postgres-cdc source and a postgres sink take them.
pub fn endpoint(pg_conn: &str, database: &str) -> String {
    let field = |key: &str| {
        pg_conn
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .unwrap_or_default()
            .to_string()
    };
    format!(
        "hostname = '{}', port = '{}', username = '{}', password = '{}', \
         database.name = '{database}'",
        field("host"),
        field("port"),
        field("user"),
        field("password")
    )
}
