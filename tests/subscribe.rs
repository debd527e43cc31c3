//! SUBSCRIBE and cursors from tokio-postgres: `COPY (SUBSCRIBE TO v) TO STDOUT` streams a
//! view's rows and then each sealed epoch's changes (updates paired by key), which applied in
//! order always give the view's rows; `snapshot = false` and `progress = true`; cursors over a
//! query and over a subscription, FETCH and MOVE, with PostgreSQL's errors; a subscription
//! `since` a retained checkpoint (base or delta) starts with what changed after it; and a
//! client that stops reading is cut off with 54000 while the server goes on.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::{text_rows, TestServer};
use futures::{Stream, StreamExt};
use tokio_postgres::SimpleQueryMessage;

/// The next line of a COPY stream, within 30 s.
async fn line<S>(lines: &mut S) -> String
where
    S: Stream<Item = Result<Bytes, tokio_postgres::Error>> + Unpin,
{
    let next = tokio::time::timeout(Duration::from_secs(30), lines.next())
        .await
        .expect("a line within 30 s")
        .expect("the stream goes on")
        .expect("no error");
    String::from_utf8(next.to_vec())
        .unwrap()
        .trim_end()
        .to_string()
}

/// Applies a subscription's line (`g n s op epoch`) to `rows`; returns its op and epoch.
fn apply(rows: &mut BTreeMap<String, i64>, line: &str) -> (String, i64) {
    let f: Vec<&str> = line.split('\t').collect();
    assert_eq!(f.len(), 5, "{line}");
    let row = format!("{} {} {}", f[0], f[1], f[2]);
    let count = rows.entry(row.clone()).or_default();
    match f[3] {
        "insert" | "update_insert" => *count += 1,
        "delete" | "update_delete" => *count -= 1,
        other => panic!("op {other} in {line}"),
    }
    assert!(
        *count >= 0,
        "{line} deletes a row the subscriber does not have"
    );
    if *count == 0 {
        rows.remove(&row);
    }
    (f[3].to_string(), f[4].parse().unwrap())
}

/// The subscriber's rows, each as often as it holds it: a row delivered twice shows twice, and
/// then differs from the view's.
fn model(rows: &BTreeMap<String, i64>) -> Vec<String> {
    (rows.iter())
        .flat_map(|(row, n)| std::iter::repeat_n(row.clone(), *n as usize))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_streams_a_views_rows_then_its_changes_epoch_by_epoch() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g text, v int);
             CREATE MATERIALIZED VIEW agg AS SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g;
             INSERT INTO t VALUES (1, 'a', 10), (2, 'a', 5), (3, 'b', 1)",
        )
        .await
        .unwrap();
    let view = "SELECT g || ' ' || n || ' ' || s FROM agg ORDER BY 1";
    let watcher = server.connect().await;
    let copy = watcher
        .copy_out("COPY (SUBSCRIBE TO agg) TO STDOUT")
        .await
        .unwrap();
    let mut lines = Box::pin(copy);
    let mut rows = BTreeMap::new();
    // The view's rows first, all of one epoch.
    let first = line(&mut lines).await;
    let (op, snapshot_epoch) = apply(&mut rows, &first);
    assert_eq!(op, "insert");
    let (op, epoch) = apply(&mut rows, &line(&mut lines).await);
    assert_eq!((op.as_str(), epoch), ("insert", snapshot_epoch));
    assert_eq!(model(&rows), text_rows(&client, view).await);
    // An update of a group is a pair, the old row first; a new group an insert; a group
    // gone a delete.
    client
        .batch_execute("INSERT INTO t VALUES (4, 'a', 1), (5, 'c', 7); DELETE FROM t WHERE g = 'b'")
        .await
        .unwrap();
    let mut ops = Vec::new();
    let mut last_epoch = snapshot_epoch;
    while model(&rows) != text_rows(&client, view).await {
        let l = line(&mut lines).await;
        let (op, epoch) = apply(&mut rows, &l);
        assert!(epoch > snapshot_epoch && epoch >= last_epoch, "{l}");
        last_epoch = epoch;
        ops.push(format!("{op} {}", l.split('\t').next().unwrap()));
    }
    ops.sort();
    assert_eq!(
        ops,
        ["delete b", "insert c", "update_delete a", "update_insert a"]
    );
    // Many changes over many epochs: the subscriber's rows follow the view.
    for i in 0..20 {
        client
            .batch_execute(&format!(
                "INSERT INTO t SELECT i, 'g' || (i % 7), i + 0 FROM generate_series({}, {}) AS s(i);
                 UPDATE t SET v = v + 1 WHERE id % 5 = {}",
                100 + i * 50,
                149 + i * 50,
                i % 5
            ))
            .await
            .unwrap();
    }
    client.batch_execute("FLUSH").await.unwrap();
    let want = text_rows(&client, view).await;
    while model(&rows) != want {
        apply(&mut rows, &line(&mut lines).await);
    }
    // Nothing more than those changes came: the next line is the next change's.
    client
        .batch_execute("INSERT INTO t VALUES (100000, 'last', 3)")
        .await
        .unwrap();
    let next = line(&mut lines).await;
    assert_eq!(next.rsplit_once('\t').unwrap().0, "last\t1\t3\tinsert");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_snapshot_only_changes_come_and_progress_rows_mark_quiet_epochs() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'old')",
        )
        .await
        .unwrap();
    let watcher = server.connect().await;
    let copy = watcher
        .copy_out(
            "COPY (SUBSCRIBE t WITH (snapshot = false, progress = true)) TO STDOUT WITH (FORMAT csv)",
        )
        .await
        .unwrap();
    let mut lines = Box::pin(copy);
    // Nothing changes: progress rows, NULL columns, one per epoch, epochs rising.
    let mut epochs = Vec::new();
    for _ in 0..3 {
        let l = line(&mut lines).await;
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(&f[..3], ["", "", "progress"], "{l}");
        epochs.push(f[3].parse::<i64>().unwrap());
    }
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");
    client
        .batch_execute("UPDATE t SET v = 'new' WHERE id = 1")
        .await
        .unwrap();
    let mut changes = Vec::new();
    while changes.len() < 2 {
        let l = line(&mut lines).await;
        if !l.contains(",progress,") {
            changes.push(l.rsplit_once(',').unwrap().0.to_string());
        }
    }
    assert_eq!(changes, ["1,old,update_delete", "1,new,update_insert"]);
    server.stop().await;
}

/// The rows of a simple query's answer, and its command's row count.
async fn simple(client: &tokio_postgres::Client, sql: &str) -> (Vec<String>, u64) {
    let mut rows = Vec::new();
    let mut count = 0;
    for m in client.simple_query(sql).await.unwrap() {
        match m {
            SimpleQueryMessage::Row(r) => rows.push(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            SimpleQueryMessage::CommandComplete(n) => count = n,
            _ => {}
        }
    }
    (rows, count)
}

async fn sqlstate(client: &tokio_postgres::Client, sql: &str) -> String {
    let e = client.batch_execute(sql).await.unwrap_err();
    e.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| format!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_fetch_and_move_through_a_query_and_a_subscription() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'x')")
        .await
        .unwrap();
    assert_eq!(
        sqlstate(&client, "DECLARE c CURSOR FOR SELECT 1").await,
        "25P01"
    );
    client.batch_execute("BEGIN").await.unwrap();
    client
        .batch_execute(
            "DECLARE q CURSOR FOR SELECT i FROM generate_series(1, 10) AS s(i) ORDER BY i",
        )
        .await
        .unwrap();
    assert_eq!(
        simple(&client, "FETCH 3 FROM q").await,
        (vec!["1".into(), "2".into(), "3".into()], 3)
    );
    assert_eq!(simple(&client, "MOVE 2 IN q").await.1, 2);
    // Through the extended protocol, described by the cursor's columns (`integer`, as
    // PostgreSQL's series of integers is).
    let rows = client.query("FETCH NEXT FROM q", &[]).await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>(),
        [6]
    );
    assert_eq!(simple(&client, "FETCH ALL q").await.1, 4);
    assert_eq!(simple(&client, "FETCH q").await, (vec![], 0));
    client
        .batch_execute("DECLARE s CURSOR FOR SUBSCRIBE TO t")
        .await
        .unwrap();
    let (rows, _) = simple(&client, "FETCH 100 FROM s").await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].starts_with("1 x insert "), "{rows:?}");
    // A change from another session: FETCH waits for it.
    let other = server.connect().await;
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        other
            .batch_execute("INSERT INTO t VALUES (2, 'y')")
            .await
            .unwrap();
    });
    let (rows, n) = simple(&client, "FETCH 100 FROM s").await;
    writer.await.unwrap();
    assert_eq!(n, 1, "{rows:?}");
    assert!(rows[0].starts_with("2 y insert "), "{rows:?}");
    assert_eq!(
        sqlstate(&client, "DECLARE s CURSOR FOR SELECT 1").await,
        "42P03"
    );
    client.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    // The cursors ended with their block.
    assert_eq!(sqlstate(&client, "FETCH 1 FROM s").await, "34000");
    client.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    client
        .batch_execute("DECLARE q CURSOR FOR SELECT 1")
        .await
        .unwrap();
    assert_eq!(sqlstate(&client, "FETCH BACKWARD 1 FROM q").await, "55000");
    client.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    assert_eq!(
        sqlstate(&client, "DECLARE q SCROLL CURSOR FOR SELECT 1").await,
        "0A000"
    );
    client.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    assert_eq!(
        sqlstate(&client, "DECLARE q CURSOR WITH HOLD FOR SELECT 1").await,
        "0A000"
    );
    client.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    client
        .batch_execute("DECLARE a CURSOR FOR SELECT 1; DECLARE b CURSOR FOR SELECT 2; CLOSE a")
        .await
        .unwrap();
    assert_eq!(sqlstate(&client, "CLOSE a").await, "34000");
    client.batch_execute("ROLLBACK").await.unwrap();
    for (sql, code) in [
        ("SUBSCRIBE TO nope", "42P01"),
        ("SUBSCRIBE TO t WITH (since = 5)", "22023"),
        ("SUBSCRIBE TO t WITH (color = 'red')", "22023"),
        ("SUBSCRIBE TO t WITH (snapshot = 'maybe')", "22023"),
    ] {
        assert_eq!(sqlstate(&client, sql).await, code, "{sql}");
    }
    server.stop().await;
}

/// The server process with `subscription_bytes_max` = `bytes_max`, a subscriber to a table that
/// reads nothing, and `MIB` MiB of rows written to the table: the server's peak RSS (VmHWM)
/// after them, and how the subscription ended.
async fn peak_with_a_stalled_subscriber(bytes_max: u64) -> (u64, Option<String>) {
    const MIB: u64 = 384;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, format!("subscription_bytes_max = {bytes_max}\n")).unwrap();
    let data = dir.path().join("data");
    let server =
        common::ChildServer::start_with(&data, &["--config", config.to_str().unwrap()]).await;
    let client = server.connect().await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        .await
        .unwrap();
    let watcher = server.connect().await;
    let copy = watcher
        .copy_out("COPY (SUBSCRIBE TO t) TO STDOUT")
        .await
        .unwrap();
    let mut lines = Box::pin(copy);
    // Rows of 64 KiB, 64 at a time: 4 MiB a statement.
    for i in 0..MIB / 4 {
        client
            .batch_execute(&format!(
                "INSERT INTO t SELECT i, repeat('x', 65536) FROM generate_series({}, {}) AS s(i)",
                i * 64,
                i * 64 + 63
            ))
            .await
            .unwrap();
    }
    client.batch_execute("FLUSH").await.unwrap();
    let peak = common::peak_rss_bytes(server.pid());
    // The subscription either ended with an error, or still holds what it was sent.
    let end = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(item) = lines.next().await {
            if let Err(e) = item {
                return Some(e.code().map_or(String::new(), |c| c.code().to_string()));
            }
        }
        None
    })
    .await
    .unwrap_or_default();
    server.stop(15).await;
    (peak, end)
}

/// A subscriber that reads nothing costs the server at most its bound: 384 MiB of changes go by
/// it with the bound at 1 MiB (cut off with 54000), and again with no real bound (64 GiB), when
/// the subscription holds every change it has not sent. The first run's peak RSS must be
/// lower by at least half the changes' size (measured: 1.07-1.13 against 1.56-1.64 GiB; the
/// writes alone take the server near 1 GiB, with or without a subscriber, under the default
/// `memory_limit` of half the machine's memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_holds_at_most_its_bound() {
    let (bounded, end) = peak_with_a_stalled_subscriber(1 << 20).await;
    assert_eq!(end.as_deref(), Some("54000"));
    let (unbounded, _) = peak_with_a_stalled_subscriber(64 << 30).await;
    eprintln!(
        "peak RSS with a stalled subscriber: {} MiB bounded at 1 MiB, {} MiB unbounded",
        bounded >> 20,
        unbounded >> 20
    );
    assert!(
        unbounded > bounded + (192 << 20),
        "{} MiB bounded, {} MiB unbounded",
        bounded >> 20,
        unbounded >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off_and_the_server_goes_on() {
    let server = TestServer::start_with(|c| c.subscription_bytes_max = 1 << 20).await;
    let client = server.connect().await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        .await
        .unwrap();
    let watcher = server.connect().await;
    let copy = watcher
        .copy_out("COPY (SUBSCRIBE TO t) TO STDOUT")
        .await
        .unwrap();
    let mut lines = Box::pin(copy);
    // The watcher reads nothing while 8 MB of changes go by.
    for i in 0..8 {
        client
            .batch_execute(&format!(
                "INSERT INTO t SELECT i, repeat('x', 100) FROM generate_series({}, {}) AS s(i)",
                i * 10_000,
                i * 10_000 + 9_999
            ))
            .await
            .unwrap();
    }
    client.batch_execute("FLUSH").await.unwrap();
    let mut error = None;
    while let Some(item) = tokio::time::timeout(Duration::from_secs(30), lines.next())
        .await
        .expect("the stream ends within 30 s")
    {
        if let Err(e) = item {
            error = Some(e);
            break;
        }
    }
    let e = error.expect("the subscription ends with an error");
    assert_eq!(e.code().map(|c| c.code()), Some("54000"), "{e:?}");
    assert_eq!(
        text_rows(&client, "SELECT count(*) FROM t").await,
        ["80000"]
    );
    server.stop().await;
}

/// CHECKPOINT (a base one with `base`): its epoch.
async fn checkpoint(client: &tokio_postgres::Client, base: bool) -> i64 {
    let sql = if base {
        "CHECKPOINT BASE"
    } else {
        "CHECKPOINT"
    };
    client.query_one(sql, &[]).await.unwrap().get("epoch")
}

/// Subscribes to `relation` since `epoch` (with progress rows), applies the start's lines to
/// `rows`, which hold the relation's rows at `epoch`, and returns the subscription after them,
/// with the start's epoch. The start's deletes come before its inserts, all in one epoch.
async fn resume(
    watcher: &tokio_postgres::Client,
    relation: &str,
    epoch: i64,
    rows: &mut BTreeMap<String, i64>,
) -> (std::pin::Pin<Box<tokio_postgres::CopyOutStream>>, i64) {
    let copy = watcher
        .copy_out(&format!(
            "COPY (SUBSCRIBE TO {relation} WITH (since = {epoch}, progress = true)) TO STDOUT"
        ))
        .await
        .unwrap();
    let mut lines = Box::pin(copy);
    let (mut start, mut ops) = (None, Vec::new());
    loop {
        let l = line(&mut lines).await;
        let epoch: i64 = l.rsplit_once('\t').unwrap().1.parse().unwrap();
        if *start.get_or_insert(epoch) != epoch {
            break;
        }
        let (op, _) = apply(rows, &l);
        ops.push(op);
    }
    let inserts = ops
        .iter()
        .skip_while(|o| *o == "delete")
        .collect::<Vec<_>>();
    assert!(inserts.iter().all(|o| *o == "insert"), "{ops:?}");
    (lines, start.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_since_a_retained_checkpoint_starts_with_what_changed_after_it() {
    let server = TestServer::start_with(|c| {
        c.checkpoint.interval_ms = 0;
        c.checkpoint.retained = 2;
    })
    .await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g text, v int);
             CREATE MATERIALIZED VIEW agg AS SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g;
             INSERT INTO t SELECT i, 'g' || (i % 9), i + 0 FROM generate_series(1, 5000) AS s(i)",
        )
        .await
        .unwrap();
    let view = "SELECT g || ' ' || n || ' ' || s FROM agg";
    let table = "SELECT id || ' ' || g || ' ' || v FROM t";
    let counted =
        |rows: Vec<String>| -> BTreeMap<String, i64> { rows.into_iter().map(|r| (r, 1)).collect() };
    // A base checkpoint, changes, and a delta checkpoint over it.
    let base = checkpoint(&client, true).await;
    let (view_at_base, table_at_base) = (
        counted(text_rows(&client, view).await),
        counted(text_rows(&client, table).await),
    );
    client
        .batch_execute(
            "UPDATE t SET v = v + 1 WHERE id % 3 = 0; DELETE FROM t WHERE id % 9 = 4;
             INSERT INTO t VALUES (9001, 'new', 1)",
        )
        .await
        .unwrap();
    let delta = checkpoint(&client, false).await;
    let mode: String = client
        .query_one(
            "SELECT mode FROM weir_catalog.checkpoints ORDER BY id DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "delta");
    let table_at_delta = counted(text_rows(&client, table).await);
    client
        .batch_execute(
            "UPDATE t SET g = 'moved' WHERE id % 11 = 0; DELETE FROM t WHERE id = 9001;
             CREATE TABLE later (id int PRIMARY KEY)",
        )
        .await
        .unwrap();

    // From either checkpoint, the start turns the checkpoint's rows into the current ones,
    // and the changes after it follow. A subscription holds its connection.
    for (i, (relation, epoch, mut rows, query)) in [
        ("agg", base, view_at_base, view),
        ("t", base, table_at_base, table),
        ("t", delta, table_at_delta, table),
    ]
    .into_iter()
    .enumerate()
    {
        let watcher = server.connect().await;
        let (mut lines, start) = resume(&watcher, relation, epoch, &mut rows).await;
        assert!(start > delta, "{start}");
        let mut now = text_rows(&client, query).await;
        now.sort();
        assert_eq!(model(&rows), now, "{relation} since {epoch}");
        assert!(rows.values().all(|n| *n == 1), "{relation} since {epoch}");
        let id = 9100 + i;
        client
            .batch_execute(&format!("INSERT INTO t VALUES ({id}, 'live{id}', 2)"))
            .await
            .unwrap();
        let live = loop {
            let l = line(&mut lines).await;
            if !l.contains("\tprogress\t") {
                break l.rsplit_once('\t').unwrap().0.to_string();
            }
        };
        let want = match relation {
            "t" => format!("{id}\tlive{id}\t2\tinsert"),
            _ => format!("live{id}\t1\t2\tinsert"),
        };
        assert_eq!(live, want);
    }

    // An epoch no retained checkpoint has, a relation the checkpoint lacks, bad values.
    let watcher = server.connect().await;
    let state = |sql: String| {
        let watcher = &watcher;
        async move { sqlstate(watcher, &sql).await }
    };
    assert_eq!(
        state(format!("SUBSCRIBE t WITH (since = {})", delta + 1)).await,
        "22023"
    );
    assert_eq!(
        state(format!("SUBSCRIBE later WITH (since = {delta})")).await,
        "22023"
    );
    assert_eq!(
        state("SUBSCRIBE t WITH (since = 'soon')".into()).await,
        "22023"
    );
    let both = format!("SUBSCRIBE t WITH (since = {delta}, snapshot = false)");
    assert_eq!(state(both).await, "22023");
    // A newer checkpoint expires the oldest: its epoch is refused, naming the oldest left.
    checkpoint(&client, false).await;
    let e = watcher
        .batch_execute(&format!("SUBSCRIBE t WITH (since = {base})"))
        .await
        .unwrap_err();
    let e = e.as_db_error().unwrap();
    assert_eq!(e.code().code(), "22023");
    assert!(
        e.message()
            .contains(&format!("oldest retained checkpoint, at epoch {delta}")),
        "{}",
        e.message()
    );
    // The subscriptions' rebuilt directories go with them.
    drop(watcher);
    let reads = server.dir.path().join("checkpoints/reads");
    let mut left = 0;
    for _ in 0..100 {
        left = std::fs::read_dir(&reads).map_or(0, |d| d.count());
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 0, "rebuilt checkpoints left in {}", reads.display());
    server.stop().await;
}
