//! Kafka sources against a real Kafka-protocol broker (tansu, which `scripts/deps` builds into
//! `~/.cache/weir/tools`, or the binary `WEIR_TANSU` names): every message exactly once into
//! the views across a SIGKILL, the start modes, and the SQLSTATEs of bad options and of a
//! broker that is not there.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{text_rows, ChildServer};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

/// A tansu broker on a free port, with the memory engine; killed when dropped.
struct Broker {
    child: std::process::Child,
    address: String,
}

impl Broker {
    fn start() -> Broker {
        let bin = std::env::var_os("WEIR_TANSU")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                    .join(".cache/weir/tools/tansu-0.6.0/bin/tansu")
            });
        assert!(
            bin.exists(),
            "no Kafka broker at {}: run scripts/deps, which builds tansu there",
            bin.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let url = format!("tcp://{address}");
        let mut child = std::process::Command::new(bin)
            .args([
                "broker",
                "--storage-engine",
                "memory://tansu/",
                "--kafka-listener-url",
                &url,
                "--kafka-advertised-listener-url",
                &url,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tansu starts");
        for _ in 0..500 {
            if std::net::TcpStream::connect(&address).is_ok() {
                return Broker { child, address };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("tansu did not listen on {address} within 5 s");
    }

    async fn create_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .create()
            .unwrap();
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let created = admin
            .create_topics(&[topic], &AdminOptions::new())
            .await
            .unwrap();
        for r in created {
            r.unwrap();
        }
    }

    fn producer(&self) -> FutureProducer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .set("enable.idempotence", "true")
            .create()
            .unwrap()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends clicks `from..to` (user `i % 7`), spread over the partitions by key, and waits until
/// the broker has each.
async fn produce(producer: &FutureProducer, topic: &str, range: std::ops::Range<u64>) {
    for i in range {
        let value = format!(r#"{{"id": {i}, "user_id": {}, "url": "/p/{i}"}}"#, i % 7);
        let key = i.to_string();
        producer
            .send(
                FutureRecord::to(topic).key(&key).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
}

/// Waits until `sql`'s one row reads `expected`, or fails after 30 s with what it read last.
async fn wait_for(client: &tokio_postgres::Client, sql: &str, expected: &str) {
    let mut last = Vec::new();
    for _ in 0..3000 {
        client.batch_execute("FLUSH").await.unwrap();
        last = text_rows(client, sql).await;
        if last == [expected] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{sql} read {last:?}, not {expected}");
}

fn create_source(name: &str, topic: &str, broker: &str, extra: &str) -> String {
    format!(
        "CREATE SOURCE {name} (id bigint, user_id int, url text) \
         WITH (connector = 'kafka', topic = '{topic}', \
               properties.bootstrap.server = '{broker}'{extra}) \
         FORMAT PLAIN ENCODE JSON"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_reaches_the_views_exactly_once_across_a_kill() {
    let broker = Broker::start();
    broker.create_topic("clicks", 3).await;
    let producer = broker.producer();
    produce(&producer, "clicks", 0..300).await;
    // A message that is not a row is skipped.
    producer
        .send(
            FutureRecord::to("clicks").key("bad").payload("{not json"),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    client
        .batch_execute(&create_source("clicks", "clicks", &broker.address, ""))
        .await
        .unwrap();
    client
        .batch_execute(
            "CREATE MATERIALIZED VIEW per_user AS \
             SELECT user_id, count(*) AS n, sum(id) AS ids FROM clicks GROUP BY user_id;
             CREATE MATERIALIZED VIEW totals AS SELECT count(*) AS n, sum(id) AS ids, \
             count(DISTINCT id) AS distinct_ids FROM clicks",
        )
        .await
        .unwrap();
    let sum = |n: u64| n * (n - 1) / 2;
    wait_for(
        &client,
        "SELECT * FROM totals",
        &format!("300 {} 300", sum(300)),
    )
    .await;
    client.batch_execute("CHECKPOINT").await.unwrap();
    produce(&producer, "clicks", 300..600).await;
    wait_for(
        &client,
        "SELECT * FROM totals",
        &format!("600 {} 600", sum(600)),
    )
    .await;
    // Killed with messages after its checkpoint, and more sent while it is down.
    server.stop(9).await;
    produce(&producer, "clicks", 600..900).await;
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    wait_for(
        &client,
        "SELECT * FROM totals",
        &format!("900 {} 900", sum(900)),
    )
    .await;
    let per_user = text_rows(&client, "SELECT user_id, n FROM per_user ORDER BY user_id").await;
    let expected: Vec<String> = (0..7u64)
        .map(|u| format!("{u} {}", (0..900).filter(|i| i % 7 == u).count()))
        .collect();
    assert_eq!(per_user, expected);
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_starts_where_its_startup_mode_says_and_bad_options_are_refused() {
    let broker = Broker::start();
    broker.create_topic("modes", 1).await;
    let producer = broker.producer();
    produce(&producer, "modes", 0..10).await;
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let client = server.connect().await;
    let b = &broker.address;
    client
        .batch_execute(&format!(
            "{}; {}; {};
             CREATE MATERIALIZED VIEW e AS SELECT count(*) AS n FROM earliest;
             CREATE MATERIALIZED VIEW l AS SELECT count(*) AS n, min(id) AS first FROM latest;
             CREATE MATERIALIZED VIEW s AS SELECT count(*) AS n, min(id) AS first FROM specific",
            create_source("earliest", "modes", b, ""),
            create_source("latest", "modes", b, ", scan.startup.mode = 'latest'"),
            create_source(
                "specific",
                "modes",
                b,
                ", scan.startup.mode = 'specific', scan.startup.specific.offsets = '0:4'"
            ),
        ))
        .await
        .unwrap();
    produce(&producer, "modes", 10..15).await;
    wait_for(&client, "SELECT * FROM e", "15").await;
    wait_for(&client, "SELECT * FROM l", "5 10").await;
    wait_for(&client, "SELECT * FROM s", "11 4").await;

    let code = |sql: String| {
        let client = &client;
        async move {
            let e = client.batch_execute(&sql).await.unwrap_err();
            e.as_db_error().map(|d| d.code().code().to_string())
        }
    };
    assert_eq!(
        code(create_source("x", "no_such_topic", b, ""))
            .await
            .as_deref(),
        Some("42704")
    );
    assert_eq!(
        code(format!(
            "CREATE SOURCE x (id bigint) WITH (connector = 'kafka', \
             properties.bootstrap.server = '{b}') FORMAT PLAIN ENCODE JSON"
        ))
        .await
        .as_deref(),
        Some("22023")
    );
    assert_eq!(
        code(create_source(
            "x",
            "modes",
            b,
            ", scan.startup.mode = 'sometime'"
        ))
        .await
        .as_deref(),
        Some("22023")
    );
    assert_eq!(
        code(format!(
            "CREATE SOURCE x (id bigint) WITH (connector = 'kafka', topic = 'modes', \
             properties.bootstrap.server = '{b}') FORMAT PLAIN ENCODE AVRO"
        ))
        .await
        .as_deref(),
        Some("0A000")
    );
    // Nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = closed.local_addr().unwrap().to_string();
    drop(closed);
    assert_eq!(
        code(create_source("x", "modes", &nowhere, ""))
            .await
            .as_deref(),
        Some("08001")
    );
    // The server goes on.
    assert_eq!(text_rows(&client, "SELECT n FROM e").await, ["15"]);
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_view_over_a_source_of_several_partitions_is_refused_and_the_others_go_on() {
    let broker = Broker::start();
    broker.create_topic("late", 2).await;
    broker.create_topic("single", 1).await;
    let producer = broker.producer();
    produce(&producer, "late", 0..20).await;
    produce(&producer, "single", 0..20).await;
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let client = server.connect().await;
    let b = &broker.address;
    client
        .batch_execute(&format!(
            "{}; {};
             CREATE MATERIALIZED VIEW first AS SELECT count(*) AS n FROM late;
             CREATE MATERIALIZED VIEW one AS SELECT count(*) AS n FROM single",
            create_source("late", "late", b, ""),
            create_source("single", "single", b, ""),
        ))
        .await
        .unwrap();
    wait_for(&client, "SELECT * FROM first", "20").await;
    wait_for(&client, "SELECT * FROM one", "20").await;
    let err = client
        .batch_execute("CREATE MATERIALIZED VIEW second AS SELECT sum(id) AS s FROM late")
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "0A000", "{err}");
    // One partition is read again in the order it went by.
    client
        .batch_execute("CREATE MATERIALIZED VIEW again AS SELECT count(*) AS n FROM single")
        .await
        .unwrap();
    produce(&producer, "late", 20..30).await;
    produce(&producer, "single", 20..30).await;
    wait_for(&client, "SELECT * FROM first", "30").await;
    wait_for(&client, "SELECT * FROM again", "30").await;
    server.stop(15).await;
}
