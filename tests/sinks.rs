//! Sinks against their real targets: a `postgres` sink keeps a PostgreSQL 15 table equal to
//! its view, each checkpoint applied once in one target transaction, across a SIGKILL of
//! Weir and an outage of the target; a `kafka` sink's topic (tansu), read as a compacted
//! topic, equals its view across a SIGKILL (at least once: tansu serves no EndTxn, so the
//! exactly-once mode is tested only as far as its transaction's commit, which tansu refuses);
//! bad options, views a format cannot carry and unreachable targets are refused at CREATE
//! SINK with their SQLSTATEs.

#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/broker.rs"]
mod broker;
mod common;
#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::{text_rows, ChildServer};
use postgres::{Postgres, PASSWORD};

fn port(pg: &Postgres) -> u16 {
    pg.conn
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .unwrap()
        .parse()
        .unwrap()
}

/// The sinks' last errors, once one has one, or none after 30 s.
async fn sink_error(weir: &tokio_postgres::Client) -> Vec<String> {
    let mut error = Vec::new();
    for _ in 0..300 {
        error = text_rows(
            weir,
            "SELECT last_error FROM weir_catalog.sinks WHERE last_error IS NOT NULL",
        )
        .await;
        if !error.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    error
}

/// `connector = 'postgres'` options for `pg`'s database `postgres`, table `table`.
fn target(pg: &Postgres, table: &str) -> String {
    format!(
        "connector = 'postgres', hostname = '127.0.0.1', port = '{}', username = 'postgres', \
         password = '{PASSWORD}', database.name = 'postgres', table.name = '{table}'",
        port(pg)
    )
}

/// A server that checkpoints (and so delivers) every 300 ms.
async fn start(data: &std::path::Path) -> ChildServer {
    start_keyed(data, None, &[]).await
}

/// As [`start`], with environment variables (failpoints).
async fn start_keyed_env(data: &std::path::Path, env: &[(&str, &str)]) -> ChildServer {
    let config = data.with_extension("toml");
    write_config(&config, None, &[]);
    ChildServer::start_with_env(data, &["--config", config.to_str().unwrap()], env).await
}

/// Waits until the target's `target_sql` reads as Weir's `sql`, or fails after 60 s.
async fn converge(
    weir: &tokio_postgres::Client,
    sql: &str,
    pg: &tokio_postgres::Client,
    target_sql: &str,
) {
    let mut last = (Vec::new(), Vec::new());
    for _ in 0..600 {
        let (w, t) = (text_rows(weir, sql).await, text_rows(pg, target_sql).await);
        if w == t && !w.is_empty() {
            return;
        }
        last = (w, t);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{sql}: Weir read {:?}\nthe target read {:?}",
        last.0, last.1
    );
}

/// Inserts orders `ids`, moves every third to another customer and deletes every seventh:
/// the view's groups are inserted, updated and deleted.
async fn churn(weir: &tokio_postgres::Client, ids: std::ops::Range<i32>) {
    weir.batch_execute(&format!(
        "INSERT INTO orders SELECT i, 'c' || (i % 6), i * 1.25 FROM generate_series({}, {}) AS s(i);
         UPDATE orders SET customer = 'c' || (id % 11) WHERE id % 3 = 0 AND id BETWEEN {0} AND {1};
         DELETE FROM orders WHERE (id % 7 = 0 OR customer = 'c10') AND id BETWEEN {0} AND {1}",
        ids.start,
        ids.end - 1
    ))
    .await
    .unwrap();
}

const VIEW: &str = "SELECT customer, n::text, total::text FROM revenue ORDER BY customer";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_table_follows_its_view_exactly_once_across_a_kill_and_an_outage() {
    let pg = Postgres::start().unwrap();
    let pgc = common::connect(&pg.conn).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start(&data).await;
    let weir = server.connect().await;
    weir.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2));
         CREATE MATERIALIZED VIEW revenue AS
           SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer",
    )
    .await
    .unwrap();
    churn(&weir, 1..200).await;
    // The sink starts with the view's rows, then its changes; its key is the view's.
    weir.batch_execute(&format!(
        "CREATE SINK revenue_pg FROM revenue WITH ({})",
        target(&pg, "public.revenue")
    ))
    .await
    .unwrap();
    churn(&weir, 200..400).await;
    converge(&weir, VIEW, &pgc, VIEW).await;
    let columns = text_rows(
        &pgc,
        "SELECT column_name || ' ' || data_type FROM information_schema.columns \
         WHERE table_name = 'revenue' ORDER BY ordinal_position",
    )
    .await;
    assert_eq!(columns, ["customer text", "n bigint", "total numeric"]);
    count_deliveries(&pgc).await;
    // Killed with changes not yet delivered, then restarted.
    churn(&weir, 400..600).await;
    server.stop(libc::SIGKILL).await;
    let server = start(&data).await;
    let weir = server.connect().await;
    churn(&weir, 600..700).await;
    converge(&weir, VIEW, &pgc, VIEW).await;
    // The target goes away: Weir keeps running, logs what it cannot deliver and says why.
    pgc.batch_execute("ALTER TABLE revenue RENAME TO revenue_away")
        .await
        .unwrap();
    churn(&weir, 700..800).await;
    let error = sink_error(&weir).await;
    assert!(
        error.first().is_some_and(|e| e.contains("revenue")),
        "{error:?}"
    );
    let log: Vec<String> = text_rows(&weir, "SELECT log_bytes > 0 FROM weir_catalog.sinks").await;
    assert_eq!(log, ["t"]);
    pgc.batch_execute("ALTER TABLE revenue_away RENAME TO revenue")
        .await
        .unwrap();
    churn(&weir, 800..900).await;
    converge(&weir, VIEW, &pgc, VIEW).await;
    // Aborted right after a delivery's commit at the target, before Weir knows of it: the
    // restart must not deliver that checkpoint again.
    server.stop(libc::SIGTERM).await;
    let server = start_keyed_env(
        &data,
        &[("WEIR_FAILPOINTS", "sink.postgres.after_commit@1")],
    )
    .await;
    // The first delivery after the start aborts the server: with this churn's changes, or
    // earlier if the start itself delivers something (then the churn is refused, and changes
    // nothing).
    let conn = format!(
        "host=127.0.0.1 port={} user=weir dbname=weir",
        server.addr.port()
    );
    if let Ok((weir, connection)) = tokio_postgres::connect(&conn, tokio_postgres::NoTls).await {
        tokio::spawn(connection);
        let _ = weir
            .batch_execute("INSERT INTO orders VALUES (1000, 'c1', 1.25)")
            .await;
    }
    let _ = server.ended().await;
    let server = start(&data).await;
    let weir = server.connect().await;
    churn(&weir, 1100..1200).await;
    converge(&weir, VIEW, &pgc, VIEW).await;
    let progress = text_rows(
        &pgc,
        "SELECT sink, checkpoint_epoch > 0 FROM weir_sink_progress",
    )
    .await;
    assert_eq!(progress, ["revenue_pg t"]);
    let status = text_rows(
        &weir,
        "SELECT name, connector, sent > 0, lag_epochs >= 0, last_error IS NULL FROM weir_catalog.sinks",
    )
    .await;
    assert_eq!(status, ["revenue_pg postgres t t t"]);
    let deliveries = delivered_once(&pgc).await;
    assert!(deliveries >= 2, "{deliveries} deliveries");
    // Dropping the sink leaves the table as it was: checkpoints after it deliver nothing.
    weir.batch_execute("DROP SINK revenue_pg").await.unwrap();
    let at_drop = text_rows(&pgc, VIEW).await;
    churn(&weir, 900..950).await;
    weir.batch_execute("FLUSH; CHECKPOINT; CHECKPOINT")
        .await
        .unwrap();
    assert_eq!(text_rows(&pgc, VIEW).await, at_drop);
    assert_ne!(text_rows(&weir, VIEW).await, at_drop);
    assert_eq!(delivered_once(&pgc).await, deliveries);
    server.stop(libc::SIGTERM).await;
}

/// Logs, in the target PostgreSQL, each transaction that changes the sink's table `revenue` and
/// each epoch a transaction sets `weir_sink_progress` to, for [`delivered_once`].
async fn count_deliveries(pg: &tokio_postgres::Client) {
    pg.batch_execute(
        "CREATE TABLE progress_log (xid bigint, epoch bigint);
         CREATE TABLE changes_log (xid bigint);
         CREATE FUNCTION log_progress() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO progress_log VALUES (txid_current(), NEW.checkpoint_epoch);
              RETURN NEW; END $$;
         CREATE FUNCTION log_change() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO changes_log VALUES (txid_current()); RETURN NULL; END $$;
         CREATE TRIGGER progress AFTER UPDATE ON weir_sink_progress
           FOR EACH ROW EXECUTE FUNCTION log_progress();
         CREATE TRIGGER changes AFTER INSERT OR UPDATE OR DELETE ON revenue
           FOR EACH STATEMENT EXECUTE FUNCTION log_change();",
    )
    .await
    .unwrap();
}

/// Checks that every committed transaction that changed the target also moved the sink's
/// progress, once, to an epoch past every earlier one: no checkpoint was delivered twice (an
/// upsert delivered again would leave the rows as they were, and only this log shows it).
/// Returns the number of deliveries.
async fn delivered_once(pg: &tokio_postgres::Client) -> usize {
    let unmarked = text_rows(
        pg,
        "SELECT DISTINCT c.xid FROM changes_log c
         WHERE (SELECT count(*) FROM progress_log p WHERE p.xid = c.xid) <> 1",
    )
    .await;
    assert!(
        unmarked.is_empty(),
        "changes without one progress update: {unmarked:?}"
    );
    let epochs: Vec<i64> = text_rows(pg, "SELECT epoch FROM progress_log ORDER BY xid")
        .await
        .iter()
        .map(|e| e.parse().unwrap())
        .collect();
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "a checkpoint delivered twice: {epochs:?}"
    );
    epochs.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_only_query_is_copied_into_an_existing_table_and_snapshot_false_skips_the_rows() {
    let pg = Postgres::start().unwrap();
    let pgc = common::connect(&pg.conn).await;
    pgc.batch_execute("CREATE TABLE big_orders (id int, amount numeric, note text DEFAULT 'x')")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start(&data).await;
    let weir = server.connect().await;
    weir.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2));
         INSERT INTO orders VALUES (1, 'a', 500), (2, E'tab\\there', 10);",
    )
    .await
    .unwrap();
    // A table's rows can be deleted: PLAIN needs force_append_only, which drops deletes.
    let sql = format!(
        "CREATE SINK big AS SELECT id, amount FROM orders WHERE amount > 100 WITH ({}, \
         force_append_only = 'true', snapshot = 'false')",
        target(&pg, "big_orders")
    );
    weir.batch_execute(&sql).await.unwrap();
    weir.batch_execute(
        "INSERT INTO orders VALUES (3, 'b', 300), (4, 'c', 50); DELETE FROM orders WHERE id = 3;
         INSERT INTO orders VALUES (5, 'd', 1000.5)",
    )
    .await
    .unwrap();
    let want = ["3 300.00 x", "5 1000.50 x"];
    let big = "SELECT * FROM big_orders ORDER BY id";
    for _ in 0..300 {
        if text_rows(&pgc, big).await == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(text_rows(&pgc, big).await, want);
    // Inserts only from here, in small transactions, with a SIGKILL among them: the target
    // holds each row once.
    for i in 0..20 {
        weir.batch_execute(&format!(
            "INSERT INTO orders SELECT v, 'e', v * 1 FROM generate_series({}, {}) AS s(v)",
            1000 + i * 50,
            1000 + i * 50 + 49
        ))
        .await
        .unwrap();
    }
    server.stop(libc::SIGKILL).await;
    let server = start(&data).await;
    let weir = server.connect().await;
    weir.batch_execute(
        "INSERT INTO orders SELECT v, 'f', v * 1 FROM generate_series(2000, 2999) AS s(v)",
    )
    .await
    .unwrap();
    let ours = "SELECT id::text AS i, amount::text AS a, 'x' AS n FROM orders WHERE id >= 1000 ORDER BY id";
    let theirs = "SELECT id::text, amount::text, note FROM big_orders WHERE id >= 1000 ORDER BY id";
    converge(&weir, ours, &pgc, theirs).await;
    let counts = "SELECT count(*), count(DISTINCT id) FROM big_orders";
    assert_eq!(text_rows(&pgc, counts).await, ["2002 2002"]);
    server.stop(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sinks_that_cannot_work_are_refused_at_create_with_their_sqlstates() {
    let pg = Postgres::start().unwrap();
    let pgc = common::connect(&pg.conn).await;
    pgc.batch_execute("CREATE TABLE keyless (customer text, n bigint)")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("data")).await;
    let weir = server.connect().await;
    weir.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2));
         CREATE MATERIALIZED VIEW counts AS SELECT customer, count(*) AS n FROM orders GROUP BY customer",
    )
    .await
    .unwrap();
    let t = target(&pg, "public.counts_out");
    let cases = [
        // A query that deletes, with no key to upsert by.
        (
            format!("CREATE SINK s AS SELECT customer FROM orders WITH ({t})"),
            "0A000",
        ),
        (
            format!("CREATE SINK s FROM counts WITH ({t}, primary_key = 'nope')"),
            "42703",
        ),
        (
            format!("CREATE SINK s FROM counts WITH ({t}, colour = 'red')"),
            "22023",
        ),
        (
            format!("CREATE SINK s FROM counts WITH ({t}, snapshot = 'maybe')"),
            "22023",
        ),
        (
            "CREATE SINK s FROM counts WITH (connector = 'postgres')".to_string(),
            "22023",
        ),
        (
            format!(
                "CREATE SINK s FROM counts WITH ({})",
                target(&pg, "keyless")
            ),
            "42P10",
        ),
        (
            "CREATE SINK s FROM counts WITH (connector = 'nowhere')".to_string(),
            "0A000",
        ),
        ("CREATE SINK s FROM counts".to_string(), "22023"),
        (
            "CREATE SINK s FROM counts WITH (connector = 'postgres', hostname = '127.0.0.1', \
             port = '1', username = 'u', database.name = 'd', table.name = 't')"
                .to_string(),
            "08001",
        ),
        (
            format!(
                "CREATE SINK s FROM counts WITH ({}, password = 'wrong')",
                target(&pg, "x")
            )
            .replacen(&format!("password = '{PASSWORD}', "), "", 1),
            "28000",
        ),
    ];
    for (sql, state) in cases {
        let e = weir.batch_execute(&sql).await.unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some(state), "{sql}: {e:?}");
    }
    assert!(text_rows(&weir, "SHOW SINKS").await.is_empty());
    // A name given as the key works where none is derived.
    weir.batch_execute(&format!(
        "CREATE SINK s AS SELECT customer, n FROM counts WHERE n > 0 WITH ({t}, primary_key = 'customer')"
    ))
    .await
    .unwrap();
    let create = text_rows(&weir, "SHOW CREATE SINK s").await;
    assert!(
        create[0].contains("connector = 'postgres'")
            && create[0].contains("primary_key = 'customer'"),
        "{create:?}"
    );
    server.stop(libc::SIGTERM).await;
}

/// Every message of partition 0 of `topic`, from its start, as (key, value).
fn messages(broker: &str, topic: &str) -> Vec<(String, Option<String>)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", "sinks-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&list).unwrap();
    let mut out = Vec::new();
    loop {
        match consumer.poll(Duration::from_secs(10)) {
            Some(Ok(m)) => out.push((
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                m.payload().map(|p| String::from_utf8_lossy(p).into_owned()),
            )),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) | None => return out,
            Some(Err(e)) => panic!("reading {topic}: {e}"),
        }
    }
}

/// The topic read as a compacted topic: each key's last value, a tombstone deleting it, as
/// rows like Weir's `customer n total`.
async fn compacted(broker: &str, topic: &str) -> Vec<String> {
    let (broker, topic) = (broker.to_string(), topic.to_string());
    let messages = tokio::task::spawn_blocking(move || messages(&broker, &topic))
        .await
        .unwrap();
    let mut rows = std::collections::BTreeMap::new();
    for (key, value) in messages {
        match value {
            Some(v) => {
                let v: serde_json::Value = serde_json::from_str(&v).unwrap();
                let row = format!(
                    "{} {} {:.2}",
                    v["customer"].as_str().unwrap(),
                    v["n"],
                    v["total"].as_f64().unwrap()
                );
                rows.insert(key, row);
            }
            None => {
                rows.remove(&key);
            }
        }
    }
    let mut rows: Vec<String> = rows.into_values().collect();
    rows.sort();
    rows
}

/// A Debezium topic replayed in order, as rows like Weir's `customer n total`: each event must
/// be keyed by the JSON of its row's key column, a create must find its key without a row, and
/// a delete's `before` must be the key's row (an update is a delete, then a create). Also
/// returns how many deletes it replayed.
fn replay_debezium(messages: Vec<(String, Option<String>)>) -> (Vec<String>, usize) {
    let row = |v: &serde_json::Value| {
        format!(
            "{} {} {:.2}",
            v["customer"].as_str().unwrap(),
            v["n"],
            v["total"].as_f64().unwrap()
        )
    };
    let mut rows = std::collections::BTreeMap::new();
    let mut deletes = 0;
    for (key, value) in messages {
        let event: serde_json::Value =
            serde_json::from_str(&value.expect("an event, not a tombstone")).unwrap();
        let key: serde_json::Value = serde_json::from_str(&key).unwrap();
        match event["op"].as_str() {
            Some("c") => {
                assert!(event["before"].is_null(), "{event}");
                assert_eq!(
                    key,
                    serde_json::json!({"customer": event["after"]["customer"]})
                );
                let earlier = rows.insert(key.to_string(), row(&event["after"]));
                assert!(earlier.is_none(), "a create for a key with a row: {event}");
            }
            Some("d") => {
                deletes += 1;
                assert!(event["after"].is_null(), "{event}");
                assert_eq!(
                    key,
                    serde_json::json!({"customer": event["before"]["customer"]})
                );
                let held = rows.remove(&key.to_string());
                assert_eq!(
                    held,
                    Some(row(&event["before"])),
                    "a delete of another row: {event}"
                );
            }
            _ => panic!("{event}"),
        }
    }
    let mut rows: Vec<String> = rows.into_values().collect();
    rows.sort();
    (rows, deletes)
}

/// Waits until the Debezium events on topic `changes` replay to the view `revenue`'s rows;
/// returns how many of them were deletes.
async fn debezium_equals_view(weir: &tokio_postgres::Client, address: &str) -> usize {
    let view = "SELECT customer, n, total FROM revenue ORDER BY customer";
    let mut last = (Vec::new(), (Vec::new(), 0));
    for _ in 0..300 {
        let address = address.to_string();
        let replayed =
            tokio::task::spawn_blocking(move || replay_debezium(messages(&address, "changes")))
                .await
                .unwrap();
        last = (text_rows(weir, view).await, replayed);
        if last.0 == last.1 .0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        last.0, last.1 .0,
        "the view, and the Debezium events replayed"
    );
    last.1 .1
}

/// FORMAT PLAIN sends each inserted row once, unkeyed, as a JSON object of every column;
/// FORMAT DEBEZIUM sends each change of a view, keyed, whose replay gives the view's rows
/// (groups created, updated and deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sinks_in_plain_and_debezium_formats_carry_each_change() {
    let broker = broker::Broker::start().unwrap();
    broker.create_topic("even_events", 1).await.unwrap();
    broker.create_topic("changes", 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("data")).await;
    let weir = server.connect().await;
    weir.batch_execute(&format!(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2));
         CREATE MATERIALIZED VIEW revenue AS
           SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer;
         CREATE TABLE events (id int, note text);
         CREATE SINK evens AS SELECT id, note FROM events WHERE id % 2 = 0
           WITH (connector = 'kafka', properties.bootstrap.server = '{0}', topic = 'even_events',
                 sink.delivery = 'at_least_once', force_append_only = 'true')
           FORMAT PLAIN ENCODE JSON;
         CREATE SINK changes FROM revenue
           WITH (connector = 'kafka', properties.bootstrap.server = '{0}', topic = 'changes',
                 sink.delivery = 'at_least_once')
           FORMAT DEBEZIUM ENCODE JSON",
        broker.address
    ))
    .await
    .unwrap();
    weir.batch_execute(
        "INSERT INTO events SELECT i, CASE WHEN i % 10 = 0 THEN NULL ELSE 'n' || i END
           FROM generate_series(1, 300) AS s(i);
         INSERT INTO events SELECT i, CASE WHEN i % 10 = 0 THEN NULL ELSE 'n' || i END
           FROM generate_series(301, 600) AS s(i);
         DELETE FROM events WHERE id < 50",
    )
    .await
    .unwrap();
    churn(&weir, 1..400).await;
    debezium_equals_view(&weir, &broker.address).await;
    // Once the groups were sent, new orders change each of them (a delete and a create per
    // group) and a group goes (a delete alone).
    churn(&weir, 400..700).await;
    weir.batch_execute("DELETE FROM orders WHERE customer = 'c1'")
        .await
        .unwrap();
    let deletes = debezium_equals_view(&weir, &broker.address).await;
    assert!(deletes >= 7, "{deletes} delete events");

    // Every row the plain sink's query inserted, once, unkeyed; the rows a DELETE took away
    // stay sent (force_append_only drops deletes).
    let mut inserted: Vec<String> = (1..=600)
        .filter(|i| i % 2 == 0)
        .map(|i| match i % 10 {
            0 => format!("{i} null"),
            _ => format!("{i} \"n{i}\""),
        })
        .collect();
    inserted.sort();
    let mut sent = Vec::new();
    for _ in 0..300 {
        let address = broker.address.clone();
        let messages = tokio::task::spawn_blocking(move || messages(&address, "even_events"))
            .await
            .unwrap();
        assert!(
            messages.iter().all(|(key, _)| key.is_empty()),
            "unkeyed: {messages:?}"
        );
        sent = messages
            .into_iter()
            .map(|(_, v)| {
                let v: serde_json::Value = serde_json::from_str(&v.unwrap()).unwrap();
                format!("{} {}", v["id"], v["note"])
            })
            .collect();
        sent.sort();
        if sent.len() >= inserted.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(sent, inserted);
    server.stop(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_topic_read_compacted_equals_its_view_across_a_kill() {
    let broker = broker::Broker::start().unwrap();
    broker.create_topic("revenue", 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start(&data).await;
    let weir = server.connect().await;
    weir.batch_execute(&format!(
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2));
         CREATE MATERIALIZED VIEW revenue AS
           SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer;
         CREATE SINK revenue_out FROM revenue
           WITH (connector = 'kafka', properties.bootstrap.server = '{}', topic = 'revenue',
                 sink.delivery = 'at_least_once')
           FORMAT UPSERT ENCODE JSON",
        broker.address
    ))
    .await
    .unwrap();
    churn(&weir, 1..300).await;
    server.stop(libc::SIGKILL).await;
    let server = start(&data).await;
    let weir = server.connect().await;
    churn(&weir, 300..500).await;
    let view = "SELECT customer, n, total FROM revenue ORDER BY customer";
    let mut last = (Vec::new(), Vec::new());
    for _ in 0..300 {
        last = (
            text_rows(&weir, view).await,
            compacted(&broker.address, "revenue").await,
        );
        if last.0 == last.1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last.0, last.1, "the view, and the topic read compacted");
    // Deleted groups are tombstones: c10's orders are all deleted.
    let status = text_rows(
        &weir,
        "SELECT connector, sent > 0, last_error IS NULL FROM weir_catalog.sinks",
    )
    .await;
    assert_eq!(status, ["kafka t t"]);
    // Exactly once, the default, runs its transaction as far as tansu serves it: the broker
    // refuses the commit (EndTxn), and the sink says so, retrying, while Weir runs on.
    weir.batch_execute(&format!(
        "CREATE SINK revenue_txn FROM revenue
           WITH (connector = 'kafka', properties.bootstrap.server = '{}', topic = 'revenue')
           FORMAT UPSERT ENCODE JSON",
        broker.address
    ))
    .await
    .unwrap();
    let mut error = Vec::new();
    for _ in 0..300 {
        error = text_rows(
            &weir,
            "SELECT last_error FROM weir_catalog.sinks WHERE name = 'revenue_txn' \
             AND last_error IS NOT NULL",
        )
        .await;
        if !error.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        error.first().is_some_and(|e| e.contains("transaction")),
        "{error:?}"
    );
    for (sql, state) in [
        (
            "CREATE SINK x FROM revenue WITH (connector = 'kafka', topic = 't') \
             FORMAT UPSERT ENCODE JSON"
                .to_string(),
            "22023",
        ),
        (
            format!(
                "CREATE SINK x FROM revenue WITH (connector = 'kafka', topic = 'nope', \
                 properties.bootstrap.server = '{}') FORMAT UPSERT ENCODE JSON",
                broker.address
            ),
            "42704",
        ),
        (
            format!(
                "CREATE SINK x FROM revenue WITH (connector = 'kafka', topic = 'revenue', \
                 properties.bootstrap.server = '{}')",
                broker.address
            ),
            "42601",
        ),
        (
            format!(
                "CREATE SINK x FROM revenue WITH (connector = 'kafka', topic = 'revenue', \
                 properties.bootstrap.server = '{}') FORMAT UPSERT ENCODE AVRO",
                broker.address
            ),
            "0A000",
        ),
        (
            format!(
                "CREATE SINK x FROM revenue WITH (connector = 'kafka', topic = 'revenue', \
                 properties.bootstrap.server = '{}', properties.group.id = 'g') \
                 FORMAT UPSERT ENCODE JSON",
                broker.address
            ),
            "22023",
        ),
    ] {
        let e = weir.batch_execute(&sql).await.unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some(state), "{sql}: {e:?}");
    }
    server.stop(libc::SIGTERM).await;
}

/// A server like `start`'s, with `secret_key` and `secret_keys_previous` in its config.
async fn start_keyed(data: &std::path::Path, key: Option<&str>, previous: &[&str]) -> ChildServer {
    let config = data.with_extension("toml");
    write_config(&config, key, previous);
    ChildServer::start_with(data, &["--config", config.to_str().unwrap()]).await
}

/// Writes a configuration that checkpoints every 300 ms, with the secret keys given.
fn write_config(config: &std::path::Path, key: Option<&str>, previous: &[&str]) {
    let mut text = String::new();
    if let Some(k) = key {
        text.push_str(&format!("secret_key = \"{k}\"\n"));
    }
    let previous: Vec<String> = previous.iter().map(|k| format!("\"{k}\"")).collect();
    text.push_str(&format!(
        "secret_keys_previous = [{}]\n",
        previous.join(", ")
    ));
    text.push_str("barrier_interval_ms = 100\n[checkpoint]\ninterval_ms = 300\nmin_pause_ms = 0\n");
    std::fs::write(config, text).unwrap();
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(path);
                }
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_s_password_is_a_secret_that_no_file_log_or_statement_shows() {
    const KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    const NEW_KEY: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
    const SINKER: &str = "Kx7-sinker-pw-Qp2";
    let pg = Postgres::start().unwrap();
    let pgc = common::connect(&pg.conn).await;
    pgc.batch_execute(&format!(
        "CREATE ROLE sinker LOGIN SUPERUSER PASSWORD '{SINKER}'"
    ))
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start_keyed(&data, Some(KEY), &[]).await;
    let weir = server.connect().await;
    let options = format!(
        "connector = 'postgres', hostname = '127.0.0.1', port = '{}', username = 'sinker', \
         password = SECRET sinker_pw, database.name = 'postgres', table.name = 'public.counts'",
        port(&pg)
    );
    // A wrong password is refused by the target at CREATE SINK, as a literal one would be.
    weir.batch_execute(
        "CREATE SECRET sinker_pw AS 'wrong'; CREATE TABLE t (k int PRIMARY KEY, g int); \
         CREATE MATERIALIZED VIEW counts AS SELECT g, count(*) AS n FROM t GROUP BY g",
    )
    .await
    .unwrap();
    let create = format!("CREATE SINK counts_pg FROM counts WITH ({options})");
    let refused = weir.batch_execute(&create).await.unwrap_err();
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("28000"),
        "{refused:?}"
    );
    weir.batch_execute(&format!("ALTER SECRET sinker_pw AS '{SINKER}'"))
        .await
        .unwrap();
    weir.batch_execute(&create).await.unwrap();
    let view = "SELECT g, n FROM counts ORDER BY g";
    weir.batch_execute("INSERT INTO t SELECT x, x % 3 FROM generate_series(1, 30) AS s(x)")
        .await
        .unwrap();
    converge(&weir, view, &pgc, view).await;
    let shown = text_rows(&weir, "SHOW CREATE SINK counts_pg")
        .await
        .join("\n");
    assert!(
        shown.contains("password = SECRET \"sinker_pw\"") && !shown.contains(SINKER),
        "{shown}"
    );
    weir.batch_execute("CHECKPOINT").await.unwrap();
    // Neither the data directory, its checkpoints nor the log hold the password.
    let held = files_holding(dir.path(), SINKER);
    assert!(held.is_empty(), "{held:?}");
    assert!(!files_holding(dir.path(), "sinker_pw").is_empty());
    // Started without the key: the server runs, and the sink says why it cannot deliver.
    server.stop(libc::SIGTERM).await;
    let server = start_keyed(&data, None, &[]).await;
    let weir = server.connect().await;
    weir.batch_execute("INSERT INTO t VALUES (100, 7)")
        .await
        .unwrap();
    let error = sink_error(&weir).await;
    assert!(
        error.first().is_some_and(
            |e| e.contains("names secret \"sinker_pw\", which the server cannot decrypt")
        ),
        "{error:?}"
    );
    // A new key, with the old one to decrypt: the sink delivers what it held, and the secret
    // is encrypted again under the new key, which alone then serves.
    server.stop(libc::SIGTERM).await;
    let server = start_keyed(&data, Some(NEW_KEY), &[KEY]).await;
    let weir = server.connect().await;
    converge(&weir, view, &pgc, view).await;
    server.stop(libc::SIGTERM).await;
    let server = start_keyed(&data, Some(NEW_KEY), &[]).await;
    let weir = server.connect().await;
    weir.batch_execute("INSERT INTO t VALUES (101, 8)")
        .await
        .unwrap();
    converge(&weir, view, &pgc, view).await;
    let held = files_holding(dir.path(), SINKER);
    assert!(held.is_empty(), "{held:?}");
    server.stop(libc::SIGTERM).await;
}
