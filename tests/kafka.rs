//! Kafka sources against a real Kafka-protocol broker (tansu, which `scripts/deps` builds into
//! `~/.cache/weir/tools`, or the binary `WEIR_TANSU` names): every message exactly once into
//! the views across a SIGKILL, the start modes, and the SQLSTATEs of bad options and of a
//! broker that is not there.

#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/broker.rs"]
mod broker;
mod common;

use std::time::Duration;

use broker::Broker;
use common::{text_rows, ChildServer, S3Server};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The offsets consumer group `group` has committed for the partitions of `topic`, summed.
async fn committed(broker: &str, group: &str, topic: &str, partitions: i32) -> i64 {
    let (broker, group, topic) = (broker.to_string(), group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &broker)
            .set("group.id", &group)
            .create()
            .unwrap();
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(&topic, p);
        }
        let got = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap();
        got.elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            })
            .sum()
    })
    .await
    .unwrap()
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
    let broker = Broker::start().unwrap();
    broker.create_topic("clicks", 3).await.unwrap();
    let producer = broker.producer().unwrap();
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
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, "[checkpoint]\ninterval_ms = 200\n").unwrap();
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
    // The checkpoint's offsets go to the source's consumer group (the bad message counts).
    let mut last = 0;
    for _ in 0..300 {
        last = committed(&broker.address, "weir-clicks", "clicks", 3).await;
        if last == 301 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, 301);
    produce(&producer, "clicks", 300..600).await;
    wait_for(
        &client,
        "SELECT * FROM totals",
        &format!("600 {} 600", sum(600)),
    )
    .await;
    // Killed while it reads: messages keep coming (each sent once the broker acknowledged the
    // one before), checkpoints every 200 ms take offsets in the middle of them, and the kill
    // lands with some read and some not; the rest are sent while it is down.
    server.stop(15).await;
    let server = ChildServer::start_with(&data, &["--config", config.to_str().unwrap()]).await;
    let client = server.connect().await;
    let sending = tokio::spawn({
        let producer = producer.clone();
        async move { produce(&producer, "clicks", 600..2600).await }
    });
    let checkpoints = "SELECT max(id) FROM weir_catalog.checkpoints";
    let before = text_rows(&client, checkpoints).await;
    let started = std::time::Instant::now();
    let read_at_kill: u64 = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no checkpoint while reading"
        );
        client.batch_execute("FLUSH").await.unwrap();
        let n = text_rows(&client, "SELECT n FROM totals").await[0]
            .parse()
            .unwrap();
        if n >= 900 && text_rows(&client, checkpoints).await != before {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("killed with {read_at_kill} of 2600 messages read");
    assert!(
        !sending.is_finished(),
        "the messages were all sent before the kill"
    );
    server.stop(9).await;
    assert!(read_at_kill < 2600, "{read_at_kill}");
    sending.await.unwrap();
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    wait_for(
        &client,
        "SELECT * FROM totals",
        &format!("2600 {} 2600", sum(2600)),
    )
    .await;
    let per_user = text_rows(&client, "SELECT user_id, n FROM per_user ORDER BY user_id").await;
    let expected: Vec<String> = (0..7u64)
        .map(|u| format!("{u} {}", (0..2600).filter(|i| i % 7 == u).count()))
        .collect();
    assert_eq!(per_user, expected);
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_starts_where_its_startup_mode_says_and_bad_options_are_refused() {
    let broker = Broker::start().unwrap();
    broker.create_topic("modes", 1).await.unwrap();
    let producer = broker.producer().unwrap();
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

/// Creates view `name` over source `late` and checks that it holds messages `0..n` once each.
async fn late_view_holds(client: &tokio_postgres::Client, name: &str, n: u64) {
    client
        .batch_execute(&format!(
            "CREATE MATERIALIZED VIEW {name} AS \
             SELECT count(*) AS n, sum(id) AS s, count(DISTINCT id) AS d FROM late"
        ))
        .await
        .unwrap();
    assert_eq!(
        text_rows(client, &format!("SELECT * FROM {name}")).await,
        [format!("{n} {} {n}", n * (n - 1) / 2)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_view_reads_every_partition_again_up_to_where_the_source_is() {
    let broker = Broker::start().unwrap();
    broker.create_topic("late", 3).await.unwrap();
    let producer = broker.producer().unwrap();
    produce(&producer, "late", 0..200).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "{};
             CREATE MATERIALIZED VIEW first AS SELECT count(*) AS n, sum(id) AS s FROM late",
            create_source("late", "late", &broker.address, ""),
        ))
        .await
        .unwrap();
    let sum = |n: u64| n * (n - 1) / 2;
    wait_for(&client, "SELECT * FROM first", &format!("200 {}", sum(200))).await;
    // Read again from every partition's start, interleaved as it comes, each partition up to
    // where the source was: the same messages as the first view's, whatever their order.
    late_view_holds(&client, "second", 200).await;
    produce(&producer, "late", 200..300).await;
    wait_for(
        &client,
        "SELECT * FROM second",
        &format!("300 {} 300", sum(300)),
    )
    .await;
    client.batch_execute("CHECKPOINT").await.unwrap();
    produce(&producer, "late", 300..400).await;
    wait_for(&client, "SELECT * FROM first", &format!("400 {}", sum(400))).await;
    // After a restart, from the checkpoint's offsets, a new view again reads exactly what the
    // others hold.
    server.stop(9).await;
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    wait_for(&client, "SELECT * FROM first", &format!("400 {}", sum(400))).await;
    late_view_holds(&client, "third", 400).await;
    wait_for(
        &client,
        "SELECT * FROM second",
        &format!("400 {} 400", sum(400)),
    )
    .await;
    server.stop(15).await;
}

/// Sends `value` (with `key`) to one partition of `topic`, at `timestamp_ms` where given.
async fn send_to(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    key: &str,
    value: Option<&str>,
    timestamp_ms: Option<i64>,
) {
    let mut record: FutureRecord<'_, str, str> =
        FutureRecord::to(topic).partition(partition).key(key);
    if let Some(v) = value {
        record = record.payload(v);
    }
    if let Some(t) = timestamp_ms {
        record = record.timestamp(t);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_are_skipped_and_recorded_or_stop_a_source_that_says_so() {
    let broker = Broker::start().unwrap();
    broker.create_topic("mixed", 1).await.unwrap();
    let producer = broker.producer().unwrap();
    let value = |i: u64| format!(r#"{{"id": {i}, "user_id": 1, "url": "/"}}"#);
    for i in 0..5 {
        send_to(&producer, "mixed", 0, "k", Some(&value(i)), None).await;
    }
    // Offset 5 is not JSON, 6 has no value (skipped without a record), 7 is the wrong type.
    send_to(&producer, "mixed", 0, "k", Some("{not json"), None).await;
    send_to(&producer, "mixed", 0, "k", None, None).await;
    send_to(&producer, "mixed", 0, "k", Some(r#"{"id": "seven"}"#), None).await;
    for i in 8..10 {
        send_to(&producer, "mixed", 0, "k", Some(&value(i)), None).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let client = server.connect().await;
    let b = &broker.address;
    client
        .batch_execute(&format!(
            "{}; {};
             CREATE MATERIALIZED VIEW skip_n AS SELECT count(*) AS n, sum(id) AS s FROM skip;
             CREATE MATERIALIZED VIEW strict_n AS SELECT count(*) AS n, sum(id) AS s FROM strict",
            create_source("skip", "mixed", b, ""),
            create_source("strict", "mixed", b, ", on_error = 'fail'"),
        ))
        .await
        .unwrap();
    wait_for(&client, "SELECT * FROM skip_n", "7 27").await;
    assert_eq!(
        text_rows(
            &client,
            "SELECT split, position, payload FROM weir_catalog.source_errors \
             WHERE source = 'skip' ORDER BY position"
        )
        .await,
        ["0 5 {not json", r#"0 7 {"id": "seven"}"#]
    );
    assert_eq!(
        text_rows(
            &client,
            "SELECT skipped, error IS NULL FROM weir_catalog.sources WHERE name = 'skip'"
        )
        .await,
        ["2 t"]
    );
    // The strict source fed the rows before the first bad message, then stopped.
    wait_for(
        &client,
        "SELECT error LIKE '%partition 0 offset 5%' FROM weir_catalog.sources \
         WHERE name = 'strict' AND error IS NOT NULL",
        "t",
    )
    .await;
    wait_for(&client, "SELECT * FROM strict_n", "5 10").await;
    // Each partition's next offset, the broker's end of it, and the lag.
    wait_for(
        &client,
        "SELECT split || ' ' || position || ' ' || \"end\" || ' ' || lag \
         FROM weir_catalog.source_splits WHERE source = 'skip'",
        "0 10 10 0",
    )
    .await;
    wait_for(
        &client,
        "SELECT lag FROM weir_catalog.sources WHERE name = 'skip'",
        "0",
    )
    .await;
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_includes_each_messages_key_partition_offset_and_timestamp() {
    let broker = Broker::start().unwrap();
    broker.create_topic("meta", 2).await.unwrap();
    let producer = broker.producer().unwrap();
    let t0 = 1_700_000_000_000i64;
    send_to(&producer, "meta", 0, "a", Some(r#"{"id": 1}"#), Some(t0)).await;
    send_to(
        &producer,
        "meta",
        1,
        "b",
        Some(r#"{"id": 2}"#),
        Some(t0 + 1500),
    )
    .await;
    send_to(
        &producer,
        "meta",
        1,
        "c",
        Some(r#"{"id": 3}"#),
        Some(t0 + 2000),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE SOURCE meta (id bigint) INCLUDE key AS k INCLUDE partition \
               INCLUDE offset AS off INCLUDE timestamp AS at \
             WITH (connector = 'kafka', topic = 'meta', properties.bootstrap.server = '{}') \
             FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW m AS \
               SELECT id, k, _kafka_partition AS p, off, at FROM meta",
            broker.address
        ))
        .await
        .unwrap();
    wait_for(&client, "SELECT count(*) FROM m", "3").await;
    assert_eq!(
        text_rows(&client, "SELECT * FROM m ORDER BY id").await,
        [
            "1 a 0 0 2023-11-14 22:13:20+00",
            "2 b 1 0 2023-11-14 22:13:21.5+00",
            "3 c 1 1 2023-11-14 22:13:22+00",
        ]
    );
    // A metadata column may not take a declared column's name, and only those four exist.
    let e = client
        .batch_execute(&format!(
            "CREATE SOURCE bad (id bigint) INCLUDE key AS id \
             WITH (connector = 'kafka', topic = 'meta', properties.bootstrap.server = '{}')",
            broker.address
        ))
        .await
        .unwrap_err();
    assert_eq!(e.as_db_error().unwrap().code().code(), "42701", "{e}");
    let e = client
        .batch_execute(&format!(
            "CREATE SOURCE bad (id bigint) INCLUDE header \
             WITH (connector = 'kafka', topic = 'meta', properties.bootstrap.server = '{}')",
            broker.address
        ))
        .await
        .unwrap_err();
    assert_eq!(e.as_db_error().unwrap().code().code(), "0A000", "{e}");
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watermark_is_the_least_over_partitions_and_an_idle_one_stops_holding_it() {
    let broker = Broker::start().unwrap();
    broker.create_topic("times", 2).await.unwrap();
    let producer = broker.producer().unwrap();
    let event = |i: i64, secs: i64| {
        format!(
            r#"{{"id": {i}, "ts": "2024-01-01T00:{:02}:{:02}Z"}}"#,
            secs / 60,
            secs % 60
        )
    };
    // Partition 0 runs ahead (minute 1); partition 1's events are older (the first 30 s): a
    // watermark over every row read would make partition 1's rows late when partition 0 is
    // read first.
    for i in 0..20 {
        send_to(&producer, "times", 0, "a", Some(&event(i, 60 + i)), None).await;
    }
    for i in 20..50 {
        send_to(&producer, "times", 1, "b", Some(&event(i, i - 20)), None).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let client = server.connect().await;
    let source = |name: &str, idle_ms: u64| {
        format!(
            "CREATE SOURCE {name} (id bigint, ts timestamptz, WATERMARK FOR ts AS ts) \
             WITH (connector = 'kafka', topic = 'times', properties.bootstrap.server = '{}', \
                   watermark.idle.timeout.ms = '{idle_ms}') FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW {name}_w AS \
               SELECT window_start, count(*) AS n \
               FROM TUMBLE({name}, ts, INTERVAL '10' SECOND) GROUP BY window_start \
               EMIT ON WINDOW CLOSE",
            broker.address
        )
    };
    client
        .batch_execute(&format!("{}; {}", source("held", 0), source("idle", 2000)))
        .await
        .unwrap();
    // Both partitions are quiet: once idle, the watermark is the newest time (01:19), and every
    // window that ends by then closes with all its rows, partition 1's included.
    wait_for(&client, "SELECT count(*), sum(n) FROM idle_w", "4 40").await;
    // Without an idle timeout the watermark waits for both partitions: the least of their
    // newest times is 00:29, so only the windows before it have closed, whole.
    wait_for(&client, "SELECT count(*), sum(n) FROM held_w", "2 20").await;
    // Partition 1 moves on: the least is partition 0's 01:19 now.
    send_to(&producer, "times", 1, "b", Some(&event(99, 100)), None).await;
    wait_for(&client, "SELECT count(*), sum(n) FROM held_w", "4 40").await;
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_waits_out_a_broker_that_is_down_and_reads_on_where_it_was() {
    // tansu's S3 engine on moto keeps the topic across the broker's restart.
    let s3 = S3Server::start().await;
    s3.create_bucket("tansu").await;
    let env = vec![
        ("AWS_ENDPOINT".to_string(), format!("http://{}", s3.addr)),
        ("AWS_ALLOW_HTTP".to_string(), "true".to_string()),
        ("AWS_ACCESS_KEY_ID".to_string(), "weir".to_string()),
        (
            "AWS_SECRET_ACCESS_KEY".to_string(),
            "weir-secret".to_string(),
        ),
        ("AWS_DEFAULT_REGION".to_string(), "us-east-1".to_string()),
    ];
    let mut broker = Broker::start_on("s3://tansu/", env).unwrap();
    broker.create_topic("durable", 2).await.unwrap();
    produce(&broker.producer().unwrap(), "durable", 0..100).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "{};
             CREATE MATERIALIZED VIEW n AS SELECT count(*) AS n, sum(id) AS s FROM durable;
             CREATE TABLE t (x int)",
            create_source("durable", "durable", &broker.address, "")
        ))
        .await
        .unwrap();
    let sum = |n: u64| n * (n - 1) / 2;
    wait_for(&client, "SELECT * FROM n", &format!("100 {}", sum(100))).await;
    client.batch_execute("CHECKPOINT").await.unwrap();
    broker.stop();
    // The source says what it waits for; everything else goes on.
    wait_for(
        &client,
        "SELECT waiting IS NOT NULL FROM weir_catalog.sources WHERE name = 'durable'",
        "t",
    )
    .await;
    client
        .batch_execute("INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    assert_eq!(
        text_rows(&client, "SELECT * FROM n").await,
        [format!("100 {}", sum(100))]
    );
    // A server started while the broker is down starts all the same.
    server.stop(9).await;
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    client
        .batch_execute("INSERT INTO t VALUES (2)")
        .await
        .unwrap();
    assert_eq!(text_rows(&client, "SELECT count(*) FROM t").await, ["2"]);
    wait_for(
        &client,
        "SELECT waiting IS NOT NULL FROM weir_catalog.sources WHERE name = 'durable'",
        "t",
    )
    .await;
    // The broker is back, with its topic: the source reads on from its checkpoint's offsets.
    broker.restart().unwrap();
    produce(&broker.producer().unwrap(), "durable", 100..200).await;
    wait_for(&client, "SELECT * FROM n", &format!("200 {}", sum(200))).await;
    wait_for(
        &client,
        "SELECT waiting IS NULL FROM weir_catalog.sources WHERE name = 'durable'",
        "t",
    )
    .await;
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_and_debezium_topics_feed_tables_whose_rows_survive_a_kill() {
    let broker = Broker::start().unwrap();
    broker.create_topic("users", 2).await.unwrap();
    broker.create_topic("orders", 1).await.unwrap();
    let producer = broker.producer().unwrap();
    // Users by key: two versions of user 1, user 2, user 3 deleted by a message without a value.
    let user =
        |id: i64, plan: &str| format!(r#"{{"id": {id}, "name": "u{id}", "plan": "{plan}"}}"#);
    send_to(&producer, "users", 0, "1", Some(&user(1, "free")), None).await;
    send_to(&producer, "users", 1, "2", Some(&user(2, "free")), None).await;
    send_to(&producer, "users", 0, "3", Some(&user(3, "pro")), None).await;
    send_to(&producer, "users", 0, "1", Some(&user(1, "pro")), None).await;
    send_to(&producer, "users", 0, "3", None, None).await;
    // Orders as Debezium change events, one with the envelope of schemas.
    let order = |id: i64, amount: &str| format!(r#"{{"id": {id}, "amount": "{amount}"}}"#);
    let event = |before: Option<String>, after: Option<String>, op: &str| {
        format!(
            r#"{{"before": {}, "after": {}, "op": "{op}", "source": {{"db": "shop"}}}}"#,
            before.unwrap_or("null".into()),
            after.unwrap_or("null".into())
        )
    };
    send_to(
        &producer,
        "orders",
        0,
        "k",
        Some(&event(None, Some(order(10, "5.50")), "c")),
        None,
    )
    .await;
    send_to(
        &producer,
        "orders",
        0,
        "k",
        Some(&event(None, Some(order(11, "2.25")), "r")),
        None,
    )
    .await;
    send_to(
        &producer,
        "orders",
        0,
        "k",
        Some(&format!(
            r#"{{"schema": {{}}, "payload": {}}}"#,
            event(Some(order(10, "5.50")), Some(order(10, "7.00")), "u")
        )),
        None,
    )
    .await;
    send_to(
        &producer,
        "orders",
        0,
        "k",
        Some(&event(Some(order(11, "2.25")), None, "d")),
        None,
    )
    .await;
    send_to(&producer, "orders", 0, "k", None, None).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    let b = &broker.address;
    client
        .batch_execute(&format!(
            "CREATE TABLE users (id bigint PRIMARY KEY, name text, plan text) \
               WITH (connector = 'kafka', topic = 'users', properties.bootstrap.server = '{b}') \
               FORMAT UPSERT ENCODE JSON;
             CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2)) \
               WITH (connector = 'kafka', topic = 'orders', properties.bootstrap.server = '{b}') \
               FORMAT DEBEZIUM ENCODE JSON;
             CREATE MATERIALIZED VIEW plans AS SELECT plan, count(*) AS n FROM users GROUP BY plan;
             CREATE MATERIALIZED VIEW total AS SELECT count(*) AS n, sum(amount) AS s FROM orders"
        ))
        .await
        .unwrap();
    wait_for(&client, "SELECT count(*) FROM users", "2").await;
    wait_for(&client, "SELECT * FROM total", "1 7.00").await;
    assert_eq!(
        text_rows(&client, "SELECT * FROM users ORDER BY id").await,
        ["1 u1 pro", "2 u2 free"]
    );
    assert_eq!(
        text_rows(&client, "SELECT * FROM plans ORDER BY plan").await,
        ["free 1", "pro 1"]
    );
    // The upstream owns the rows.
    for dml in [
        "INSERT INTO users VALUES (9, 'x', 'y')",
        "UPDATE users SET plan = 'x'",
        "DELETE FROM orders",
    ] {
        let e = client.batch_execute(dml).await.unwrap_err();
        assert_eq!(
            e.as_db_error().unwrap().code().code(),
            "0A000",
            "{dml}: {e}"
        );
    }
    let e = client
        .batch_execute(&format!(
            "CREATE SOURCE s (id bigint) WITH (connector = 'kafka', topic = 'users', \
             properties.bootstrap.server = '{b}') FORMAT UPSERT ENCODE JSON"
        ))
        .await
        .unwrap_err();
    assert_eq!(e.as_db_error().unwrap().code().code(), "0A000", "{e}");
    client.batch_execute("CHECKPOINT").await.unwrap();
    // After the checkpoint: user 2 moves to pro, and then the server is killed.
    send_to(&producer, "users", 1, "2", Some(&user(2, "pro")), None).await;
    wait_for(&client, "SELECT * FROM plans ORDER BY plan", "pro 2").await;
    server.stop(9).await;
    send_to(&producer, "users", 0, "4", Some(&user(4, "free")), None).await;
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    wait_for(&client, "SELECT count(*) FROM users", "3").await;
    assert_eq!(
        text_rows(&client, "SELECT * FROM users ORDER BY id").await,
        ["1 u1 pro", "2 u2 pro", "4 u4 free"]
    );
    assert_eq!(
        text_rows(&client, "SELECT * FROM plans ORDER BY plan").await,
        ["free 1", "pro 2"]
    );
    // A view created now backfills from the table's rows.
    client
        .batch_execute("CREATE MATERIALIZED VIEW names AS SELECT count(*) AS n FROM users")
        .await
        .unwrap();
    assert_eq!(text_rows(&client, "SELECT * FROM names").await, ["3"]);
    assert_eq!(
        text_rows(
            &client,
            "SELECT name, connector FROM weir_catalog.sources ORDER BY name"
        )
        .await,
        ["orders kafka", "users kafka"]
    );
    server.stop(15).await;
}
